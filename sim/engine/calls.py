"""``Call``: an event in SimPy's queue that calls a function when processed, in place of a
process's resume.

Why: a SimPy generator process costs a resume of its generator (and a new ``Timeout`` object)
for every event it waits on. The replica loop (sim/engine/cluster.py ``Replica``) and the
arrival process (sim/engine/arrivals.py) run as callbacks of these events instead, scheduled at
the times and priorities the process's events had (``Timeout``: NORMAL after a delay;
``Initialize`` and ``Interruption``: URGENT, now; ``Event.succeed``: NORMAL, now), so the event
queue sees the same events in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from heapq import heappush
from typing import Any, Final, cast

import simpy
from simpy.events import NORMAL

from sim.core.heap import HeapOrder

_heappush: Final = heappush  # (compiled: a constant, not a look-up in the module's dict)


class Call:
    """An event, triggered, that calls ``fn(event)`` when the event loop (``run_watched`` in
    sim/engine/cluster.py) processes it: ``at(delay_s, priority)`` schedules it ``delay_s`` from
    now. What SimPy's ``Timeout`` (NORMAL priority), ``Initialize`` and ``Interruption``
    (URGENT) are to a generator process, with ``fn`` in place of the process's resume. An event
    that has run may be scheduled again (one object per loop for its recurring waits, not one
    per wait); one left pending in the queue may not.

    It enters SimPy's queue as SimPy's events do (a heap of (time, priority, event id, event),
    the ids from the environment's counter) and has the attributes the loop reads of an event
    (``callbacks``: None once processed; ``_ok``, ``_value``), but it is not a ``simpy.Event``:
    nothing waits on it (no process yields it), so it needs none of Event's machinery, and
    compiled (sim/compiled_core.py) its attributes are native fields instead of a ``__dict__``.
    The queue and the id counter are the environment's for its whole life: read once here.
    Its time ``_t`` (when it is processed, the clock's time) is what its callbacks read as now
    (compiled, a native field, where the environment's ``_now`` is a generic look-up).
    Its callbacks list is one for all its schedulings (``at`` sets ``callbacks`` to it): a
    change to ``call.at(...).callbacks`` lasts. An owner that gives up a pending Call
    (``abandon``: a cut run's end, sim/engine/cluster.py) leaves it in the queue calling nothing.

    Compiled (sim/compiled_core.py) it enters the heap as itself, not in a tuple: its time,
    priority and event id are native fields, and its ``__lt__`` / ``__gt__`` order it against
    other Calls natively (and against SimPy's own (time, priority, id, event) entries as that
    tuple), where a tuple entry costs a tuple, a boxed time and id, and a generic tuple
    comparison per sift of the heap (``heappop`` and ``heappush`` were ~10% of a compiled
    chunked run's instructions: bench/README.md, "Compiled core, fifth round"). The order is
    the tuple's: time, then priority, then id (ids are unique). With the Python sources the
    tuple stays (a Python ``__lt__`` costs more than a tuple comparison there)."""

    def __init__(self, env: simpy.Environment, fn: Callable[[Call], None], like: Call | None = None):
        """``like``: a Call of the same environment, whose queue and id counter this one takes
        (compiled, sim/compiled_core.py, read natively from it, where reading them from the
        environment is a generic attribute look-up each)."""
        self.env = env
        # the callbacks it runs, one list for all its schedulings (SimPy's processed mark sets
        # ``callbacks`` to None, not the list)
        self._fns = [fn]
        self._queue: list
        self._ids: EventIds | None
        self._next_eid: Callable[[], int]
        if like is not None:
            self._queue, self._ids, self._next_eid = like._queue, like._ids, like._next_eid
        else:
            self._queue = env._queue
            # compiled: the environment's counter as an ``EventIds`` (installed once), whose
            # next id a Call takes natively (``next`` of itertools.count is a generic call per event)
            self._ids = event_ids(env) if SELF_ENTRIES else None
            self._next_eid = env._eid.__next__  # (with the Python sources)
        self.callbacks: list[Callable[[Call], None]] | None = None
        self._ok = True
        self._value: object = None
        # its place in the queue while pending (compiled: the heap entry is the Call itself)
        self._t = 0.0
        self._priority = 0
        self._eid = 0

    def at(self, delay_s: float, priority: int = NORMAL) -> Call:
        now: float = self.env._now
        return self.at_from(now, delay_s, priority)

    def at_from(self, now: float, delay_s: float, priority: int = NORMAL) -> Call:
        """``at`` by a caller that has read the clock (``now``: the environment's ``_now``)
        already (compiled, reading it here is a generic attribute look-up per event)."""
        if delay_s < 0:  # as Timeout
            raise ValueError(f"Negative delay {delay_s}")
        if self.callbacks is not None:  # (its heap entry, compiled, is itself: one at a time)
            raise RuntimeError("a Call scheduled again while pending")
        self.callbacks = self._fns
        # env.schedule(self, priority, delay_s) written out (simpy 4.1's Environment.schedule:
        # the queue is a heap of (time, priority, event id, event)): one call less per event
        ids = self._ids
        if ids is not None:  # compiled (SELF_ENTRIES)
            eid = ids.next_id
            ids.next_id = eid + 1
            self._t, self._priority, self._eid = now + delay_s, priority, eid
            QUEUE_ORDER.push(self._queue, self)
        else:  # (its fields too: its time is what its callbacks read as the clock's)
            t, eid = now + delay_s, self._next_eid()
            self._t, self._priority, self._eid = t, priority, eid
            _heappush(self._queue, (t, priority, eid, self))
        return self

    def abandon(self) -> Call:
        """Its owner gives it up while it is pending: it stays in the queue until its time and
        then calls nothing (its callbacks a shared empty list, where emptying its own list was a
        generic method call, compiled). Returns a new Call of the same function and queue, not
        scheduled, to take its place."""
        if self.callbacks is None:
            raise RuntimeError("a Call abandoned while not pending")
        self.callbacks = _CALLS_NOTHING
        return Call(self.env, self._fns[0], self)

    def entry(self) -> tuple[float, int, int, Call]:
        """Its place in the queue as SimPy's tuple: (time, priority, event id, itself)."""
        return (self._t, self._priority, self._eid, self)

    # SimPy's own loop (``Environment.step``, ``peek``) reads its queue's entries as tuples:
    # unpacked and indexed, a Call's entry reads as that tuple (``env.run()`` runs Calls too)
    def __iter__(self) -> Iterator[object]:
        return iter(self.entry())

    def __getitem__(self, i: Any) -> Any:
        entry: tuple = self.entry()  # (an object: indexed or sliced generically, as a tuple is)
        return entry[i]

    # The heap's order (compiled: the queue holds Calls themselves beside SimPy's tuples; a
    # tuple compared with a Call asks the Call, reflected). Equal times and priorities are
    # ordered by id, as the tuples are; two entries never share an id.
    def __lt__(self, other: object) -> bool:
        if isinstance(other, Call):
            if self._t != other._t:
                return self._t < other._t
            if self._priority != other._priority:
                return self._priority < other._priority
            return self._eid < other._eid
        return self.entry() < cast(tuple, other)

    def __gt__(self, other: object) -> bool:
        if isinstance(other, Call):
            return other.__lt__(self)
        return self.entry() > cast(tuple, other)


# the callbacks of an abandoned Call (``Call.abandon``): empty, shared, never appended to
_CALLS_NOTHING: Final[list[Callable[[Call], None]]] = []


class _QueueOrder(HeapOrder):
    """The event queue's order (sim/core/heap.py): two Calls by their native fields (time,
    priority, id, as their tuples); a pair with one of SimPy's own (time, priority, id, event)
    tuples generically, as heapq compares them. Compiled, heapq reached ``Call.__lt__`` through
    its Python slot: ~800 instructions a pop and ~400 a push (bench/README.md, "Compiled core,
    ninth round"). Any valid heap pops in one order: the entries' order is total (unique ids)."""

    def before(self, a: object, b: object) -> bool:
        if isinstance(a, Call) and isinstance(b, Call):
            if a._t != b._t:
                return a._t < b._t
            if a._priority != b._priority:
                return a._priority < b._priority
            return a._eid < b._eid
        return bool(a < b)  # type: ignore[operator]


QUEUE_ORDER: Final = _QueueOrder()


class EventIds:
    """SimPy's event-id counter (``Environment._eid``: ``itertools.count()``, drawn by ``next``
    for every event scheduled) as an object whose next id is a field: SimPy's own events draw
    from it as before (``__next__``), and a ``Call`` reads and advances the field (compiled, a
    native read and write)."""

    def __init__(self, next_id: int) -> None:
        self.next_id = next_id

    def __iter__(self) -> EventIds:
        return self

    def __next__(self) -> object:  # (object: mypyc's iterator slot returns an object, not a native int)
        eid = self.next_id
        self.next_id = eid + 1
        return eid


def event_ids(env: simpy.Environment) -> EventIds:
    """``env``'s event-id counter as ``EventIds``, installed in its place on first use: it goes
    on from the id the counter would have given next (the same ids, in the same order)."""
    ids = env._eid
    if isinstance(ids, EventIds):
        return ids
    new = EventIds(next(ids))  # (the id drawn here is the first one it gives)
    env._eid = new  # type: ignore[assignment]
    return new


def _probe() -> None:
    """(compiled by mypyc, a function has no ``__code__``)"""


# compiled: a pending Call is its own heap entry (see ``Call``); with the Python sources a tuple
SELF_ENTRIES: Final = not hasattr(_probe, "__code__")
