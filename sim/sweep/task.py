"""One unit of sweep work: a point's scenario with one seed -> one flat row of figures.

Why: the worker function must be top-level and picklable (process pools, Ray), take and return
plain values, and load each GPU's calibration once per worker process (``load_calibration`` is
an ``lru_cache``; ``warm_worker`` fills it when a worker starts).
"""

from __future__ import annotations

import json
import math
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim.errors import UserError
from sim.scenario import Scenario, scenario_from_dict


@dataclass(frozen=True)
class Task:
    point_id: str
    point: int
    seed: int
    raw: dict                    # the scenario, seed included
    base_dir: str
    tags: dict = field(default_factory=dict)   # copied into the row (e.g. a capacity probe's rate)

    @property
    def key(self) -> tuple[str, int]:
        return self.point_id, self.seed


def num_replicas(s: Scenario) -> int:
    from sim.engine.topology import layout_for

    return layout_for(s).num_replicas


def utilization(steps_duration_s: np.ndarray, steps_start_s: np.ndarray, replicas: int) -> float:
    """Fraction of the run's wall time the replicas spent stepping: busy seconds summed over
    replicas / (replicas x simulated span). A steps row covering a fast-forwarded run of
    identical steps carries their total duration, so the sum counts every step once."""
    if len(steps_duration_s) == 0:
        return 0.0
    span_s = float(np.max(steps_start_s + steps_duration_s))
    return float(steps_duration_s.sum()) / (replicas * span_s) if span_s > 0 else 0.0


def _flat(summary: dict) -> dict[str, Any]:
    """result.json's scalar figures; mappings as JSON text; the wall-clock date left out
    (rows must be reproducible)."""
    out = {}
    for k, v in summary.items():
        if k == "date":
            continue
        if isinstance(v, dict):
            out[k] = json.dumps(v, sort_keys=True)
        elif k == "request_rate" and v == "inf":
            out[k] = math.inf
        else:
            out[k] = v
    return out


def run_task(task: Task) -> dict[str, Any]:
    """Simulate one (point, seed); a ``UserError`` (a model that does not fit, a missing trace)
    becomes the row's ``error`` so one bad configuration does not stop a sweep."""
    from sim.run import run_scenario
    from sim.metrics.summary import summarize

    row: dict[str, Any] = {"point_id": task.point_id, "point": task.point, "seed": task.seed, **task.tags}
    try:
        s = scenario_from_dict(dict(task.raw), f"point {task.point} seed {task.seed}", base_dir=task.base_dir)
        result = run_scenario(s)
        summary = summarize(result)
    except UserError as e:
        row["error"] = str(e)
        return row
    row.update(_flat(summary))
    # two columns of the step log, read as arrays (not the whole steps frame)
    row["simsrv_utilization"] = utilization(result.step_column("duration_s"), result.step_column("start_s"),
                                            num_replicas(s))
    row["error"] = None
    return row


def call_sharing(call: tuple[Callable[[Any], Any], Any]) -> Any:
    """``fn(item)`` in a worker process that keeps its cost models (and their memos) for the
    next calls it is given: a Ray worker, reused across tasks but started by Ray, not by
    ``warm_worker``. The results are the same as in a fresh process (the memos are pure:
    ``shared_cost_models``)."""
    from sim.engine.deployment import share_cost_models_in_this_process

    fn, item = call
    share_cost_models_in_this_process()
    return fn(item)


def run_task_sharing(task: Task) -> dict[str, Any]:
    """``run_task`` in a worker that keeps its cost models for its next tasks (``call_sharing``)."""
    return call_sharing((run_task, task))


def warm_worker(gpus: tuple[str, ...]) -> None:
    """Process-pool initializer: Ctrl-C is the parent's to handle (it stops the pool; finished
    rows are already on disk), and each GPU's calibration is loaded once, here."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from sim.cost.calibration import load_calibration
    from sim.engine.deployment import share_cost_models_in_this_process
    import sim.run  # noqa: F401  (the simulator's imports, once per worker)

    share_cost_models_in_this_process()  # the worker's tasks reuse cost models and their memos

    for gpu in gpus:
        load_calibration(gpu)
