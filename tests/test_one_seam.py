"""One seam between compiled and Python code, and SimPy through its public API only (issue 39
item 3): no module of sim/ reads or writes SimPy's private attributes or asks whether it is
compiled (sim/compiled_core.py's ``pure_reason`` is the one flag); the owned clock
(sim/engine/clock.py) orders events as SimPy and heapq do, and runs until a given time."""

import ast
import heapq
import math
from pathlib import Path

import numpy as np
import pytest
import simpy

from sim.engine.calls import Call
from sim.engine.clock import NORMAL, URGENT, Clock
from sim.engine.simpy_clock import ClockEnvironment

SIM = Path(__file__).resolve().parent.parent / "sim"


def _simpy_private_names() -> set[str]:
    """The private attributes SimPy's own objects carry (an environment, an event, a process),
    plus the one a defused event gets."""
    env = simpy.Environment()

    def proc():
        yield env.timeout(1.0)

    objects = (env, env.timeout(1.0), env.process(proc()), simpy.Event(env))
    return {k for o in objects for k in vars(o) if k.startswith("_")} | {"_defused"}


def _sources():
    for path in sorted(SIM.rglob("*.py")):
        yield path, path.read_text(encoding="utf-8")


def test_sim_uses_no_private_simpy_attribute():
    """No ``x._now``, ``x._queue``, ``x._eid``, ``x._ok``... on anything but ``self`` (a class's
    own field of that name, such as the KV manager's ``self._queue``), and no ``__dict__`` of an
    environment or an event."""
    private = _simpy_private_names()
    assert {"_now", "_queue", "_eid", "_ok", "_value"} <= private
    found = []
    for path, text in _sources():
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Attribute):
                continue
            owner = ast.unparse(node.value)
            if node.attr in private and owner not in ("self", "cls"):
                found.append(f"{path.relative_to(SIM.parent)}:{node.lineno}: {owner}.{node.attr}")
            if node.attr == "__dict__" and ("env" in owner or "event" in owner):
                found.append(f"{path.relative_to(SIM.parent)}:{node.lineno}: {owner}.__dict__")
    assert not found, found


def test_one_place_says_whether_the_core_is_compiled():
    """No per-module probes (``hasattr(f, "__code__")``, a module's own COMPILED flag): where
    the compiled and Python cores differ, they read sim/compiled_core.py."""
    found = []
    for path, text in _sources():
        if path.name == "compiled_core.py":
            continue
        for needle in ("__code__", "COMPILED", "SELF_ENTRIES"):
            if needle in text.replace("NOT_COMPILED", ""):
                found.append(f"{path.relative_to(SIM.parent)}: {needle}")
    assert not found, found


def test_the_clock_pops_in_heapqs_order():
    """Entries at equal and distinct times and priorities, scheduled and processed interleaved:
    the clock processes them in the order heapq pops (time, priority, order scheduled)."""
    rng = np.random.default_rng(7)
    clock, seen, expected = Clock(), [], []
    theirs: list = []
    seq = 0
    for _ in range(600):
        if theirs and rng.random() < 0.4:
            assert clock.step()
            expected.append(heapq.heappop(theirs)[2])
            continue
        t = clock.now_s + float(rng.choice([0.0, 0.5, 1.0, 2.0]))
        priority = int(rng.choice([URGENT, NORMAL]))
        Call(clock, lambda e, k=seq: seen.append(k)).at_from(clock.now_s, t - clock.now_s, priority)
        heapq.heappush(theirs, (t, priority, seq))
        seq += 1
    while theirs:
        assert clock.step()
        expected.append(heapq.heappop(theirs)[2])
    assert not clock.step() and seen == expected and len(seen) == seq > 300


def test_run_until_stops_at_t_with_the_rest_pending():
    clock, seen = Clock(), []
    for t in (0.5, 1.0, 1.0, 2.0):
        Call(clock, lambda e: seen.append(e.time_s)).at(t)
    clock.run_until(1.0)
    assert seen == [0.5, 1.0, 1.0] and clock.now_s == 1.0 and clock.next_event_s() == 2.0
    clock.run_until(1.5)  # nothing due: the clock moves on alone
    assert clock.now_s == 1.5 and len(clock) == 1
    Call(clock, lambda e: seen.append(("injected", e.time_s))).at(0.0, URGENT)  # injected at now
    clock.run_until(1.5)
    assert seen[-1] == ("injected", 1.5)
    with pytest.raises(ValueError, match="already at 1.5"):
        clock.run_until(1.0)
    clock.run()
    assert seen[-1] == 2.0 and clock.now_s == 2.0 and clock.next_event_s() == math.inf


def test_run_until_runs_simpy_processes_to_t():
    """A SimPy process on the owned clock pauses at ``run_until``'s time and goes on after."""
    env, seen = ClockEnvironment(), []

    def proc():
        for _ in range(4):
            yield env.timeout(1.0)
            seen.append(env.now)

    env.process(proc())
    env.clock.run_until(2.5)
    assert seen == [1.0, 2.0] and env.now == 2.5 and env.peek() == 3.0
    env.clock.run()
    assert seen == [1.0, 2.0, 3.0, 4.0]
