"""``ClockEnvironment``: a SimPy environment whose time and event queue are the owned clock's.

Why: the simulator owns its event loop (sim/engine/clock.py, which says why), and SimPy
processes still run on it: the KV links of a disaggregated cluster (sim/engine/topology.py),
the lockstep data-parallel groups (sim/engine/dp_group.py), a closed loop's think time
(sim/engine/cluster.py). SimPy documents its environment as subclassable, an implementation
providing ``now``, ``schedule`` and ``step`` (simpy.core.BaseEnvironment; ``peek`` and ``run``
are Environment's); this class overrides exactly those public methods (``run`` is SimPy's own,
built on them) and touches none of SimPy's private attributes, so any simpy 4.x or later
that keeps this documented interface runs it. Not compiled: mypyc's native classes cannot
derive from SimPy's Python class.
"""

from __future__ import annotations

from typing import Any

import simpy
from simpy.core import EmptySchedule

from sim.engine.clock import NORMAL, Clock, SimpyEvent


class ClockEnvironment(simpy.Environment):
    """A ``simpy.Environment`` on ``clock``: SimPy's events enter the clock's queue, in one
    order with the replicas' ``Call`` events (sim/engine/calls.py)."""

    def __init__(self, clock: Clock | None = None) -> None:
        super().__init__()
        self.clock = clock if clock is not None else Clock()

    @property
    def now(self) -> float:
        return self.clock.now_s

    def schedule(self, event: Any, priority: int = NORMAL, delay: float = 0) -> None:
        clock = self.clock
        clock.schedule(SimpyEvent(event), clock.now_s + delay, priority)

    def peek(self) -> float:
        return self.clock.next_event_s()

    def step(self) -> None:
        if not self.clock.step():
            raise EmptySchedule()
