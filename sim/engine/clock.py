"""The simulation's clock and event queue, owned outright; SimPy runs on it through its public API.

Why own it: a run processes a few events per engine step (a step's end, a wake-up, an
arrival), millions in a long run, and the event loop's cost per event is a floor under the
whole simulator's speed. SimPy's ``Environment.step`` makes a tuple per event, boxes its time
and id, compares entries generically and calls a method per event; reaching into it for speed
meant reading and writing its private attributes (its heap, its id counter, its clock), which
pinned simpy below 5. Here the queue is a heap of ``Scheduled`` entries with named fields
(``time_s``, ``priority``, ``seq``), compared natively when compiled (sim/compiled_core.py),
and the loop is this module's. Figures: bench/README.md, "Issue 39 item 3: one seam".

SimPy stays the time model: ``ClockEnvironment`` (sim/engine/simpy_clock.py) is a
``simpy.Environment`` whose documented overridable methods (``now``, ``schedule``, ``step``,
``peek``) are this clock's, so SimPy processes (the KV links of a disaggregated cluster, the
lockstep data-parallel groups, a closed loop's think time) and the replicas' ``Call`` events
(sim/engine/calls.py) share one clock and one order: time, then SimPy's priority (URGENT before
NORMAL), then the order scheduled, as SimPy orders its own queue.

For a live endpoint the loop also runs until a given simulated time and stops there
(``run_until``: events at exactly that time processed, the clock set to it, later events kept),
and anything scheduled meanwhile (an arrival injected at the clock's time) joins the same queue.

A watchdog counts the events processed at one instant: a run whose clock stays at one time
for more than ``STALL_EVENTS_BASE + STALL_EVENTS_PER_REQUEST * requests`` events raises
``SimulationStalled`` naming the instant, instead of hanging.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final

from simpy.events import NORMAL as SIMPY_NORMAL, URGENT as SIMPY_URGENT

from sim.errors import SimulationStalled

# SimPy's priorities (simpy.events): at one time, URGENT events (a process's start, an
# interruption) come before NORMAL ones (timeouts, events succeeding)
URGENT: Final[int] = SIMPY_URGENT
NORMAL: Final[int] = SIMPY_NORMAL
INF: Final = math.inf

# Events allowed at one simulated instant before the run is declared stalled, on top of a
# per-request allowance (a trace on a coarse time grid legitimately puts thousands of
# arrivals, wake-ups and steps on one instant; a spinning process puts millions).
STALL_EVENTS_BASE: Final = 1_000_000
STALL_EVENTS_PER_REQUEST: Final = 64


class Scheduled:
    """An entry of the clock's queue: processed (``fire``) at ``time_s``; at one time by
    ``priority`` (URGENT first), then by ``seq`` (the order scheduled, unique per clock)."""

    def __init__(self) -> None:
        self.time_s = 0.0
        self.priority = NORMAL
        self.seq = 0

    def fire(self) -> None:
        """The clock reached it: do what it stands for."""
        raise NotImplementedError

    def calls_something(self) -> bool:
        """Whether ``fire`` calls anything (the event log leaves out events that do not)."""
        return True


class SimpyEvent(Scheduled):
    """A SimPy event in the clock's queue: processed as ``simpy.Environment.step`` processes
    one (its callbacks called, then the exception of a failed event that no callback defused
    raised), through the event's public attributes (``callbacks``, ``ok``, ``defused``,
    ``value``)."""

    def __init__(self, event: Any) -> None:
        super().__init__()
        self.event = event

    def fire(self) -> None:
        event = self.event
        callbacks = event.callbacks
        event.callbacks = None  # SimPy's processed mark
        for callback in callbacks:
            callback(event)
        if not event.ok and not event.defused:
            value = event.value
            exc = type(value)(*value.args)
            exc.__cause__ = value
            raise exc

    def calls_something(self) -> bool:
        return bool(self.event.callbacks)


def _before(a: Scheduled, b: Scheduled) -> bool:
    """The queue's order: time, priority, then the order scheduled (no two entries tie)."""
    if a.time_s != b.time_s:
        return a.time_s < b.time_s
    if a.priority != b.priority:
        return a.priority < b.priority
    return a.seq < b.seq


def _no_requests() -> int:
    return 0


class Clock:
    """Simulated time (``now_s``) and the events to come, processed in order."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self._heap: list[Scheduled] = []  # a binary min-heap in ``_before`` order
        self._next_seq = 0
        # requests sent so far (the watchdog's per-request allowance); set by the run's wiring
        self.num_requests: Callable[[], int] = _no_requests
        # a list to log (time, priority) of each event processed that calls something, or None
        # (tests compare two event loops' events: tests/test_arrivals.py)
        self.log: list[tuple[float, int]] | None = None
        # the watchdog: its limits, the last instant and the events processed at it so far
        self.stall_events_base = STALL_EVENTS_BASE
        self.stall_events_per_request = STALL_EVENTS_PER_REQUEST
        self._last_t = -1.0
        self._same = 0

    def __len__(self) -> int:
        """Events queued."""
        return len(self._heap)

    @property
    def events_scheduled(self) -> int:
        """Events scheduled since the clock was made."""
        return self._next_seq

    def schedule(self, entry: Scheduled, time_s: float, priority: int) -> None:
        """Queue ``entry`` at ``time_s`` (not before now) with ``priority``."""
        entry.time_s = time_s
        entry.priority = priority
        entry.seq = self._next_seq
        self._next_seq += 1
        heap = self._heap
        heap.append(entry)
        self._sift_up(len(heap) - 1, entry)

    def _sift_up(self, pos: int, entry: Scheduled) -> None:
        """Put ``entry`` at ``pos`` or higher: each ancestor it comes before moves down a level."""
        heap = self._heap
        while pos > 0:
            parent_pos = (pos - 1) >> 1
            parent = heap[parent_pos]
            if not _before(entry, parent):
                break
            heap[pos] = parent
            pos = parent_pos
        heap[pos] = entry

    def _pop(self) -> Scheduled:
        """The first entry, taken out (heapq's ``heappop``: the last entry moved down from the
        root along the smaller children to a leaf, then up again)."""
        heap = self._heap
        last = heap.pop()
        if not heap:
            return last
        top = heap[0]
        end = len(heap)
        pos = 0
        child = 1
        while child < end:
            smaller = heap[child]
            right = child + 1
            if right < end:
                other = heap[right]
                if not _before(smaller, other):
                    child, smaller = right, other
            heap[pos] = smaller
            pos = child
            child = 2 * pos + 1
        self._sift_up(pos, last)
        return top

    def next_event_s(self) -> float:
        """When the next event is due (``inf`` when none is)."""
        return self._heap[0].time_s if self._heap else INF

    def step(self) -> bool:
        """Process the next event; False when there is none."""
        if not self._heap:
            return False
        self._process_next()
        return True

    def run(self) -> None:
        """Process every event (the clock stays at the last one's time). An event at infinite
        time is never reached: the run ends before it."""
        self.run_until(INF)

    def run_until(self, t_s: float) -> None:
        """Process every event due at or before ``t_s``, then set the clock to ``t_s`` (when
        finite); later events stay queued. A fast-forwarded run of decode steps spanning ``t_s``
        is one event (its end) and is not cut here: only what is scheduled at ``t_s`` (an
        arrival) cuts it, as in a full run."""
        if t_s < self.now_s:
            raise ValueError(f"run_until({t_s!r}): the clock is already at {self.now_s!r} s")
        heap = self._heap
        t: float
        while heap:
            t = heap[0].time_s
            if t > t_s or t == INF:
                break
            self._process_next()
        if t_s < INF:
            self.now_s = t_s

    def _process_next(self) -> None:
        """Take the first event, advance the clock to it (the watchdog counting the events at
        one instant) and fire it."""
        entry = self._pop()
        t = entry.time_s
        log = self.log
        if log is not None and entry.calls_something():
            log.append((t, entry.priority))
        if t == self._last_t:
            same = self._same + 1
            self._same = same
            if same > self.stall_events_base:
                limit = self.stall_events_base + self.stall_events_per_request * self.num_requests()
                if same > limit:
                    raise SimulationStalled(
                        f"simulation stalled: the clock stayed at t={t:.9g} s for {same:,} events "
                        f"(a model defect; please report it with the scenario)")
        else:
            self._last_t = t
            self._same = 0
        self.now_s = t
        entry.fire()
