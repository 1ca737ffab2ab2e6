"""The scenario's workload as ``RequestArrays``."""

from __future__ import annotations

from sim.scenario import Scenario
from sim.workload.arrays import RequestArrays
from sim.workload.synthetic import synthetic_workload
from sim.workload.trace import read_trace


def build_workload(scenario: Scenario) -> RequestArrays:
    w = scenario.workload
    if w.trace is not None:
        return read_trace(scenario.resolve_path(w.trace.path), w.trace.format, w.trace.time_scale)
    return synthetic_workload(w.synthetic, scenario.seed, scenario.resolve_path)
