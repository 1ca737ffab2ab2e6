"""``Call``: an event in the clock's queue that calls a function when processed, in place of a
SimPy process's resume.

Why: a SimPy generator process costs a resume of its generator (and a new ``Timeout`` object)
for every event it waits on. The replica loop (sim/engine/cluster.py ``Replica``) and the
arrivals (sim/engine/arrivals.py) run as callbacks of these events instead, scheduled at the
times and priorities the process's events had (``Timeout``: NORMAL after a delay;
``Initialize`` and ``Interruption``: URGENT, now; ``Event.succeed``: NORMAL, now), so the
event queue (sim/engine/clock.py) sees the same events in the same order.
"""

from __future__ import annotations

from collections.abc import Callable

from sim.engine.clock import NORMAL, Clock, Scheduled


class Call(Scheduled):
    """An event that calls ``fn(call)`` when the clock processes it: ``at(delay_s, priority)``
    schedules it ``delay_s`` from now. Its ``time_s`` (when processed: the clock's time then) is
    what its function reads as now. A Call that has run may be scheduled again (one object per
    loop for its recurring waits, not one per wait); one still pending may not. An owner that
    gives up a pending Call (``abandon``: a cut run's end, sim/engine/cluster.py) leaves it in
    the queue, calling nothing when its time comes."""

    def __init__(self, clock: Clock, fn: Callable[[Call], None]):
        super().__init__()
        self.clock = clock
        self.fn = fn
        self.pending = False    # in the queue
        self.abandoned = False  # its time will come, and it will call nothing

    def at(self, delay_s: float, priority: int = NORMAL) -> Call:
        return self.at_from(self.clock.now_s, delay_s, priority)

    def at_from(self, now: float, delay_s: float, priority: int = NORMAL) -> Call:
        """``at`` by a caller that has the clock's time (``now``) at hand already."""
        if delay_s < 0:  # as SimPy's Timeout
            raise ValueError(f"Negative delay {delay_s}")
        if self.pending:  # (its heap entry is itself: one at a time)
            raise RuntimeError("a Call scheduled again while pending")
        self.pending = True
        self.clock.schedule(self, now + delay_s, priority)
        return self

    def at_time(self, t_s: float, priority: int = NORMAL) -> Call:
        """Schedule it at the absolute time ``t_s`` (not before the clock's time): a time
        given to the bit (a recorded abort, sim/engine/arrivals.py), which ``now + (t_s - now)``
        may miss by a rounding."""
        if t_s < self.clock.now_s:
            raise ValueError(f"a Call scheduled at {t_s}, before the clock's {self.clock.now_s}")
        if self.pending:
            raise RuntimeError("a Call scheduled again while pending")
        self.pending = True
        self.clock.schedule(self, t_s, priority)
        return self

    def fire(self) -> None:
        self.pending = False
        if not self.abandoned:
            self.fn(self)

    def calls_something(self) -> bool:
        return not self.abandoned

    def abandon(self) -> Call:
        """Its owner gives it up while it is pending: it stays queued until its time and then
        calls nothing. Returns a new Call of the same function, not scheduled, to take its place."""
        if not self.pending:
            raise RuntimeError("a Call abandoned while not pending")
        self.abandoned = True
        return Call(self.clock, self.fn)
