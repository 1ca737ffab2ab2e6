"""``run_capacity``: per configuration, the highest request rate that meets the SLO (its knee).

Why: capacity planning asks how much traffic each configuration sustains and which is the
cheapest that meets a target. The offered load is scaled without changing its shape: a
synthetic workload's ``request_rate`` (same seed, same gamma shape: the gaps scale), or a
trace's ``target_rate`` (every gap multiplied by one factor, so its bursts are kept). All
configurations' probes of a round are submitted together, so the workers stay busy.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import polars as pl

from sim.errors import UserError
from sim.scenario import Scenario, scenario_from_dict, set_dotted
from sim.sweep.grid import RATE_KEYS, Point
from sim.sweep.knee import Knee, KneeSearch, Probe
from sim.sweep.slo import SLOTerm
from sim.sweep.stats import interval
from sim.metrics.summary import num_gpus
from sim.sweep.task import Task

SYNTHETIC_RATE = "workload.synthetic.request_rate"
TRACE_RATE = "workload.trace.target_rate"


@dataclass
class Config:
    point: Point
    scenario: Scenario
    rate_key: str
    start_rate_per_s: float

    def raw_at(self, rate_per_s: float, seed: int) -> dict:
        raw = self.point.with_seed(seed)
        set_dotted(raw, self.rate_key, rate_per_s)
        if self.rate_key == TRACE_RATE:
            raw["workload"]["trace"].pop("time_scale", None)  # a target rate replaces the time scale
        return raw


def make_config(point: Point) -> Config:
    s = scenario_from_dict(dict(point.raw), f"configuration {point.index}", base_dir=point.base_dir)
    fixed = [k for k in RATE_KEYS if k in point.overrides]
    if fixed:
        raise UserError(f"capacity searches the request rate itself; the grid may not set {fixed[0]}")
    w = s.workload
    if w.synthetic is not None:
        if w.synthetic.rate_profile is not None or w.synthetic.max_concurrency is not None:
            raise UserError("capacity scales a constant arrival rate; workload.synthetic.rate_profile and "
                            "max_concurrency (a closed loop) have none to scale")
        r = w.synthetic.request_rate
        return Config(point, s, SYNTHETIC_RATE, r if math.isfinite(r) else 1.0)
    if w.trace.target_rate is not None:
        return Config(point, s, TRACE_RATE, w.trace.target_rate)
    from sim.workload import build_workload

    rate = build_workload(s).mean_rate_per_s
    if not math.isfinite(rate):
        raise UserError(f"{w.trace.path}: every request arrives at once; the trace has no rate to scale")
    return Config(point, s, TRACE_RATE, rate)


@dataclass
class CapacityResult:
    terms: list[SLOTerm]
    seeds: list[int]
    tolerance: float
    configs: list[Config]
    searches: list[KneeSearch]
    knees: list[Knee | None]
    errors: list[str | None]
    rows: pl.DataFrame          # one row per simulation: configuration, probe rate, seed, result figures
    wall_s: float

    def records(self) -> list[dict]:
        return [_record(c, s, k, e) for c, s, k, e in zip(self.configs, self.searches, self.knees, self.errors)]

    def probe_records(self) -> list[dict]:
        """Per configuration and probed rate: each SLO figure's mean over seeds and 95% CI (ms)."""
        out = []
        for c, s in zip(self.configs, self.searches):
            for rate in sorted(s.probes):
                p = s.probes[rate]
                for j, t in enumerate(self.terms):
                    x = p.ratios[:, j][~np.isnan(p.ratios[:, j])] * t.limit_ms
                    if not len(x):
                        continue
                    lo, hi = interval(t.key, x)
                    out.append({"config": c.point.index, "label": c.point.label(), "rate_per_s": rate, "slo": t.name,
                                "limit_ms": t.limit_ms, "value_ms": float(x.mean()), "ci95_low_ms": lo,
                                "ci95_high_ms": hi, "passed": p.passed})
        return out


def _record(c: Config, s: KneeSearch, k: Knee | None, err: str | None) -> dict:
    gpus = num_gpus(c.scenario)
    price = c.scenario.hardware.price_per_gpu_hour
    rate = k.rate_per_s if k else None
    rec = {
        "config": c.point.index, "label": c.point.label(), "overrides": c.point.overrides,
        "knee_rate_per_s": rate, "knee_ci95_low": k.ci95_low if k else None,
        "knee_ci95_high": k.ci95_high if k else None,
        "bracket_low_per_s": k.bracket[0] if k else None, "bracket_high_per_s": k.bracket[1] if k else None,
        "censored": k.censored if k else None, "binding_slo": k.binding if k else None,
        "utilization_at_knee": k.utilization if k else None, "seeds_identical": k.seeds_identical if k else None,
        "num_gpus": gpus, "requests_per_s_per_gpu": rate / gpus if rate is not None else None,
        "price_per_gpu_hour": price,
        # requests served per dollar of GPU time at the knee: rate x 3600 s / (GPUs x $ per GPU-hour)
        "requests_per_dollar": rate * 3600.0 / (gpus * price) if rate is not None and price else None,
        "num_probes": len(s.probes), "error": err,
    }
    return rec


def _probe(rate: float, rows: list[dict], terms: list[SLOTerm]) -> Probe:
    rows = sorted(rows, key=lambda r: r["seed"])
    ratios = np.array([[np.nan if r.get(t.key) is None else r[t.key] / t.limit_ms for t in terms] for r in rows],
                      dtype=np.float64)
    util = np.array([r.get("simsrv_utilization") or 0.0 for r in rows], dtype=np.float64)
    return Probe(rate, ratios.reshape(len(rows), len(terms)), util)


def run_capacity(points: list[Point], terms: list[SLOTerm], seeds: list[int], executor, tolerance: float = 0.05,
                 progress: Callable[[int, int, int], None] | None = None) -> CapacityResult:
    """Search every configuration's knee; ``progress(configs_done, configs, runs_done)`` per round."""
    t0 = time.perf_counter()
    if not (0 < tolerance < 1):
        raise UserError(f"--tolerance {tolerance}: must be between 0 and 1")
    configs = [make_config(p) for p in points]
    searches = [KneeSearch(terms, c.start_rate_per_s, tolerance) for c in configs]
    errors: list[str | None] = [None] * len(configs)
    all_rows: list[dict] = []
    while True:
        active = [i for i, s in enumerate(searches) if errors[i] is None and s.next_rates(1)]
        if progress:
            progress(len(configs) - len(active), len(configs), len(all_rows))
        if not active:
            break
        m = max(1, executor.workers // (len(active) * len(seeds)))
        tasks = [Task(configs[i].point.point_id, i, seed, configs[i].raw_at(rate, seed), configs[i].point.base_dir,
                      {"probe_rate_per_s": rate})
                 for i in active for rate in searches[i].next_rates(m) for seed in seeds]
        got: dict[tuple[int, float], list[dict]] = defaultdict(list)
        for task, row in executor.map_unordered(tasks):
            got[(task.point, task.tags["probe_rate_per_s"])].append(row)
            all_rows.append(row)
        for (i, rate), rows in sorted(got.items()):
            err = next((r["error"] for r in rows if r.get("error")), None)
            if err:
                errors[i] = err
                continue
            searches[i].add(_probe(rate, rows, terms))
    knees = [s.knee() if errors[i] is None and s.probes else None for i, s in enumerate(searches)]
    rows = pl.DataFrame(all_rows, infer_schema_length=None, strict=False)
    if rows.height:
        rows = rows.rename({"point": "config"}).sort("config", "probe_rate_per_s", "seed")
    return CapacityResult(terms, seeds, tolerance, configs, searches, knees, errors, rows, time.perf_counter() - t0)
