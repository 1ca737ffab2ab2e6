"""``simsrv validate``: published measurements (``validation/*.yaml``) against simulated ones.

Why: users decide purchases from simsrv's numbers, so its error against real engines must be
visible (issue 10 section 4). Each YAML file is one published case (source, settings,
assumptions) with rows: a scenario that reproduces the measurement (the case's ``base`` deep-
merged with the row's ``scenario``), the metric, the measured value, the tolerance, the level
(step: one step, one kernel or a fixed batch; request: serving metrics under a workload;
ordering: simulated values must rank as the measured ones do) and the role (calibration rows
may have fitted a free parameter, held-out rows never did). ``err = simulated / measured - 1``.
A ``capacity`` row finds the highest request rate meeting its limits (the sweep's knee search,
``sim/sweep/capacity.py``); published capacities are often ratios only, so such a row, or any row
an ordering or ratio compares, may have no measured value (shown, not counted), and a ``ratio``
row divides two rows' simulated values.
Rows the simulator cannot reproduce yet are listed with their reason, never silently dropped.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sim.errors import UserError
from sim.metrics.keys import key as result_key

LEVELS = ("step", "request", "ordering")
DEFAULT_TOLERANCE = {"step": 0.20, "request": 0.25, "ordering": 0.0}
# Engine generations (issue 37's targets are judged per generation): "2023" = vLLM <= 0.3,
# TensorRT-LLM before its XQA kernel (< v0.8), research prototypes of that time (Sarathi-Serve,
# DeepSpeed-FastGen and their baselines); "2024-26" = vLLM V1 and 0.4+, TensorRT-LLM >= 0.9,
# SGLang >= 0.3 and later engines. A case file's ``generation`` (a row's may override it);
# a row measuring no engine (an NCCL all-reduce) has none.
GENERATIONS = ("2023", "2024-26")


def validation_dir() -> Path:
    """``validation/`` at the repository's top level (next to the ``sim`` package)."""
    return Path(__file__).resolve().parents[2] / "validation"


@dataclass
class Row:
    id: str
    case: str
    level: str
    metric: str
    measured: float | None
    tolerance: float
    role: str
    source: str
    scenario: dict | None = None
    allreduce: dict | None = None
    order: list[str] = field(default_factory=list)
    capacity: dict | None = None  # result.json key -> limit (ms): the highest rate meeting all
    ratio: list[str] = field(default_factory=list)  # [a, b]: simulated(a) / simulated(b)
    status: str = "ok"
    reason: str = ""
    simulated: float | None = None
    file: str = ""  # the case file (its directory resolves the scenario's relative paths)
    generation: str | None = None  # engine generation (GENERATIONS), None: no engine measured

    @property
    def err(self) -> float | None:
        if self.simulated is None or not self.measured:
            return None
        return self.simulated / self.measured - 1.0

    @property
    def within(self) -> bool | None:
        e = self.err
        if e is None:
            return None
        return e == 0.0 if self.level == "ordering" else abs(e) <= self.tolerance


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def load_rows(directory: Path | None = None) -> list[Row]:
    """Every row of every case file, in file order."""
    d = Path(directory) if directory is not None else validation_dir()
    files = sorted(d.glob("*.yaml"))
    if not files:
        raise UserError(f"{d}: no validation case files (*.yaml)")
    return load_case_files(files, str(d))


def load_case_files(files: list[Path], where: str) -> list[Row]:
    """Every row of the case files ``files``, in order (``where`` names them in errors)."""
    from sim.files.yamlfile import read_yaml

    d = where
    rows: list[Row] = []
    for f in files:
        c = read_yaml(f, "validation case")
        if not isinstance(c, dict) or "case" not in c or "rows" not in c:
            raise UserError(f"{f}: a validation case needs 'case' and 'rows'")
        for r in c["rows"]:
            level = r.get("level")
            if level not in LEVELS:
                raise UserError(f"{f}: row {r.get('id')}: level must be one of {', '.join(LEVELS)}")
            if r.get("role", "held-out") not in ("calibration", "held-out"):
                raise UserError(f"{f}: row {r['id']}: role must be calibration or held-out")
            tol = r.get("tolerance", c.get("tolerance", DEFAULT_TOLERANCE[level]))
            scen = None
            if "scenario" in r or ("allreduce" not in r and level != "ordering"):
                scen = _merge(c.get("base") or {}, r.get("scenario") or {})
                scen.setdefault("name", r["id"].replace("/", "_"))
            status, reason = r.get("status", "ok"), r.get("reason", "")
            generation = _generation(f, r, c)
            missing = [k for k in (r.get("requires") or c.get("requires") or []) if not scenario_key_exists(k)]
            if status == "ok" and missing:
                status, reason = "not-reproducible", f"needs scenario key {', '.join(missing)} (not on this version)"
            rows.append(Row(id=r["id"], case=c["case"], level=level, metric=r["metric"],
                            measured=1.0 if level == "ordering" else
                            (None if r.get("measured") is None else float(r["measured"])),
                            tolerance=float(tol), role=r.get("role", "held-out"), source=c.get("source", ""),
                            scenario=None if r.get("ratio") else scen, allreduce=r.get("allreduce"),
                            order=list(r.get("order") or []), capacity=r.get("capacity"),
                            ratio=list(r.get("ratio") or []), status=status, reason=reason, file=str(f),
                            generation=generation))
    ids = [r.id for r in rows]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise UserError(f"{d}: duplicate validation row ids: {', '.join(sorted(dup))}")
    known = set(ids)
    compared = {o for r in rows for o in r.order + r.ratio}
    for r in rows:
        if r.measured is None and r.level != "ordering" and not r.capacity and r.id not in compared:
            raise UserError(f"{d}: row {r.id}: 'measured' is missing (only a capacity row, or a row an ordering "
                            "or ratio compares, may omit it)")
        missing = [o for o in r.order + r.ratio if o not in known]
        if missing:
            raise UserError(f"{d}: row {r.id} names unknown rows: {', '.join(missing)}")
        if r.ratio and len(r.ratio) != 2:
            raise UserError(f"{d}: row {r.id}: ratio names two rows [numerator, denominator]")
    return rows


def _generation(f: Path, row: dict, case: dict) -> str | None:
    """The row's engine generation: its own ``generation``, else its case's (None where neither
    gives one); any other value than GENERATIONS is one error line naming the file and row."""
    g = row.get("generation", case.get("generation"))
    if g is not None and g not in GENERATIONS:
        raise UserError(f"{f}: row {row.get('id')}: generation {g!r} is not one of {', '.join(GENERATIONS)}")
    return g


def scenario_key_exists(dotted: str) -> bool:
    """Whether ``dotted`` (e.g. ``engine.quantization``) is a key this version's scenarios accept."""
    from pydantic import BaseModel

    from sim.scenario import Scenario

    cls = Scenario
    for part in dotted.split("."):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or part not in cls.model_fields:
            return False
        ann = cls.model_fields[part].annotation
        cls = next((a for a in (ann, *getattr(ann, "__args__", ())) if isinstance(a, type) and issubclass(a, BaseModel)),
                   ann)
    return True


def select(rows: list[Row], case: str | None) -> list[Row]:
    """Rows of ``case`` (a case id such as VC-03, a row id, or a row-id prefix); all when None."""
    if case is None:
        return rows
    picked = [r for r in rows if r.case == case or r.id == case or r.id.startswith(case.rstrip("/") + "/")]
    if not picked:
        cases = sorted({r.case for r in rows})
        raise UserError(f"--case {case}: no such case or row; cases: {', '.join(cases)}")
    return picked


def closed_loop_query_throughput(summary: dict) -> float:
    """Queries per second as DeepSpeed-MII's benchmark client reports them: the number of
    clients over the mean request latency (DeepSpeedExamples benchmarks/inference/mii/
    postprocess_results.py ``get_summary``: ``throughput = client_num / latency``, ``latency`` the
    mean of each request's end - start), not completed requests over the run's duration."""
    clients, e2el_ms = summary.get("max_concurrency"), summary.get(result_key("mean", "e2el"))
    if clients is None:
        raise MetricMissing("closed_loop_query_throughput needs a closed loop "
                            "(workload.synthetic.max_concurrency): the run has none")
    if not e2el_ms:
        raise MetricMissing(f"the simulated run has no {result_key('mean', 'e2el')} for closed_loop_query_throughput")
    return clients / (e2el_ms / 1000.0)


def metric_value(summary: dict, metric: str) -> float:
    """A row's metric from a run's summary (``result.json`` keys, ``output_tok_per_s_per_gpu``
    or ``closed_loop_query_throughput``)."""
    if metric == "output_tok_per_s_per_gpu":
        return summary["output_throughput"] / summary["simsrv_num_gpus"]
    if metric == "closed_loop_query_throughput":
        return closed_loop_query_throughput(summary)
    v = summary.get(metric)
    if v is None:
        why = ", ".join(f"{n} x {k}" for k, n in summary.get("simsrv_failed_reasons", {}).items())
        raise MetricMissing(f"the simulated run has no {metric}" + (f" (failed: {why})" if why else ""))
    return float(v)


class MetricMissing(Exception):
    """The run produced no value for the row's metric."""


class Runner:
    """Runs each distinct scenario once (rows sharing a scenario share its run)."""

    def __init__(self, directory: Path | None = None):
        self.dir = Path(directory) if directory is not None else validation_dir()
        self._runs: dict[str, dict] = {}

    def summary(self, scen: dict) -> dict:
        from sim.run import run_scenario
        from sim.scenario import scenario_from_dict
        from sim.metrics.summary import summarize

        key = json.dumps({k: v for k, v in scen.items() if k != "name"}, sort_keys=True, default=str)
        hit = self._runs.get(key)
        if hit is None:
            s = scenario_from_dict(copy.deepcopy(scen), f"validation {scen.get('name')}", base_dir=str(self.dir))
            hit = self._runs[key] = summarize(run_scenario(s))
        return hit

    def simulate(self, row: Row) -> float:
        if row.allreduce is not None:
            return allreduce_ms(**row.allreduce)
        if row.capacity is not None:
            return self.capacity(row.scenario, row.capacity, row.id)
        return metric_value(self.summary(row.scenario), row.metric)

    def capacity(self, scen: dict, limits: dict, where: str) -> float:
        """Requests per second at the knee of ``scen`` under ``limits`` (one seed; the sweep's
        search brackets the rate to 5%): the request rate (or trace rate) is scaled."""
        from sim.scenario import scenario_from_dict
        from sim.sweep.capacity import run_capacity
        from sim.sweep.executors import SerialExecutor
        from sim.sweep.grid import expand
        from sim.sweep.slo import SLOTerm

        s = scenario_from_dict(copy.deepcopy(scen), f"validation {where}", base_dir=str(self.dir))
        terms = [SLOTerm(k, k, k, float(v)) for k, v in limits.items()]
        res = run_capacity(expand(s, [{}], f"validation {where}"), terms, [s.seed], SerialExecutor(), tolerance=0.05)
        knee = res.knees[0]
        if res.errors[0] or knee is None or knee.rate_per_s is None or knee.censored:
            why = res.errors[0] or (knee.censored and f"the limits hold {knee.censored} every probed rate") or "no knee"
            raise MetricMissing(f"no capacity: {why}")
        return float(knee.rate_per_s)


def allreduce_ms(gpu: str, tp: int, size_bytes: int, model: str = "llama-2-7b") -> float:
    """One NCCL all-reduce of ``size_bytes`` as the default (calibrated) cost model charges it:
    its per-step NCCL all-reduce time of the token count that makes that message, over the
    step's 2 x layers all-reduces. NCCL, not vLLM's custom kernel: the measurements are
    torch.distributed all-reduces (NOTE: ``model`` only sets the bytes per token, hidden x 2)."""
    from sim.cost.calibration import load_calibration
    from sim.cost.roofline import RooflineCostModel
    from sim.spec.hardware import get_gpu
    from sim.spec.models import get_model

    m, g = get_model(model), get_gpu(gpu)
    tokens = size_bytes / (m.hidden_size * m.dtype_bytes)
    if tokens != int(tokens):
        raise UserError(f"validation all-reduce of {size_bytes} bytes: not a whole number of {model} tokens")
    cm = RooflineCostModel(m, g, tp, calibration=load_calibration(g.key))
    return cm.nccl_allreduce_s(int(tokens)) / (2 * m.num_layers) * 1e3


def run_validation(case: str | None = None, directory: Path | None = None, progress=None) -> list[Row]:
    """Simulate the selected rows (and the rows their orderings name); return the selection."""
    from sim.engine.deployment import shared_cost_models

    rows = load_rows(directory)
    by_id = {r.id: r for r in rows}
    chosen = select(rows, case)
    needed = {r.id for r in chosen} | {o for r in chosen for o in r.order + r.ratio}
    runner = Runner(directory)
    todo = [r for r in rows if r.id in needed and r.level != "ordering" and not r.ratio and r.status == "ok"]
    with shared_cost_models():  # many cases of few configurations
        for i, r in enumerate(todo):
            try:
                r.simulated = runner.simulate(r)
            except MetricMissing as e:  # e.g. every request failed: listed with the reason, not counted
                r.status, r.reason = "not-reproducible", str(e)
            if progress is not None:
                progress(i + 1, len(todo), r.id)
    for r in rows:
        if r.ratio and r.id in needed and r.status == "ok":
            a, b = (by_id[x].simulated for x in r.ratio)
            if a is None or not b:
                r.status, r.reason = "not-reproducible", "a row of its ratio is not reproducible"
            else:
                r.simulated = a / b
    for r in chosen:
        if r.level == "ordering" and r.status == "ok":
            vals = [by_id[o].simulated for o in r.order]
            if any(v is None for v in vals):
                r.status, r.reason = "not-reproducible", "a row it ranks is not reproducible"
            else:
                r.simulated = 1.0 if all(a < b for a, b in zip(vals, vals[1:])) else 0.0
    return chosen


def _stats(errs: list[float]) -> dict:
    if not errs:
        return {"median_abs_err": None, "p90_abs_err": None}
    a = np.abs(np.array(errs))
    return {"median_abs_err": float(np.median(a)), "p90_abs_err": float(np.percentile(a, 90))}


def _level_stats(rows: list[Row]) -> dict:
    ran = [r for r in rows if r.simulated is not None]
    out = {lvl: _stats([r.err for r in ran if r.level == lvl and r.err is not None]) for lvl in ("step", "request")}
    orders = [r for r in ran if r.level == "ordering"]
    out["ordering"] = {"correct": sum(1 for r in orders if r.simulated == 1.0), "total": len(orders)}
    return out


def summarize_rows(rows: list[Row]) -> dict:
    """Median and p90 |err| per level and the orderings right, over all rows and (``by_generation``)
    over each engine generation's rows alone (issue 37 judges its targets per generation)."""
    out = _level_stats(rows)
    out["by_generation"] = {g: _level_stats([r for r in rows if r.generation == g]) for g in GENERATIONS}
    return out


def to_json(rows: list[Row]) -> dict:
    """The documented ``--json`` document (rows that ran only; see ``not_reproduced``)."""
    ran = [r for r in rows if r.simulated is not None]
    return {"cases": [{"id": r.id, "level": r.level, "metric": r.metric, "measured": r.measured,
                       "simulated": r.simulated, "err": r.err, "generation": r.generation} for r in ran],
            "summary": summarize_rows(rows)}


def not_reproduced(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r.simulated is None]


def fmt_value(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.3f}" if abs(v) < 1 else f"{v:,.1f}"
