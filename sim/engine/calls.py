"""``Call``: a SimPy event that calls a function when processed, in place of a process's resume.

Why: a SimPy generator process costs a resume of its generator (and a new ``Timeout`` object)
for every event it waits on. The replica loop (sim/engine/cluster.py ``Replica``) and the
arrival process (sim/engine/arrivals.py) run as callbacks of these events instead, scheduled at
the times and priorities the process's events had (``Timeout``: NORMAL after a delay;
``Initialize`` and ``Interruption``: URGENT, now; ``Event.succeed``: NORMAL, now), so the event
queue sees the same events in the same order.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappush

import simpy
from simpy.events import NORMAL


class Call(simpy.Event):
    """A SimPy event, triggered, that calls ``fn(event)`` when the environment processes it:
    ``at(delay_s, priority)`` schedules it ``delay_s`` from now. What SimPy's ``Timeout``
    (NORMAL priority), ``Initialize`` and ``Interruption`` (URGENT) are to a generator process,
    with ``fn`` in place of the process's resume. An event that has run may be scheduled
    again (one object per loop for its recurring waits, not one per wait); one left pending
    in the queue may not."""

    def __init__(self, env: simpy.Environment, fn: Callable[[simpy.Event], None]):
        self.env = env
        self._fn = fn
        self._value = None
        self._ok = True

    def at(self, delay_s: float, priority=NORMAL) -> "Call":
        if delay_s < 0:  # as Timeout
            raise ValueError(f"Negative delay {delay_s}")
        self.callbacks = [self._fn]
        env = self.env
        # env.schedule(self, priority, delay_s) written out (simpy 4.1's Environment.schedule:
        # the queue is a heap of (time, priority, event id, event)): one call less per event
        heappush(env._queue, (env._now + delay_s, priority, next(env._eid), self))
        return self
