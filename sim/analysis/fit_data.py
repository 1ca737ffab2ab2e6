"""``simsrv fit``'s data: a user's measurements, each a figure a simulation can reproduce.

Why: fitting an engine profile's terms (``sim/cost/profile_fit.py``) needs, per measurement,
the scenario that reproduces it and the measured figure. Two sources:

- validation-case files (``validation/README.md``'s format): each ``step`` or ``request`` row
  with a scenario and a measured value is one measurement, its scenario run as ``simsrv
  validate`` runs it (``sim/analysis/validate.py``). Rows that do not depend on the engine
  profile or cost a search per evaluation (all-reduce, capacity, ratio, ordering rows) and rows
  marked not reproducible are listed as skipped, with the reason.
- ``vllm bench serve --save-result --save-detailed`` JSON (vllm ``vllm/benchmarks/serve.py``:
  ``input_lens``, ``output_lens``, ``ttfts``, ``itls``, ``errors``, ``request_rate``,
  ``burstiness``, ``max_concurrency``, ``median_ttft_ms``, ``median_tpot_ms``...) with the
  scenario of the deployment it measured (``--scenario``): the requests are replayed with their
  own prompt and output lengths, in the file's order (the order vLLM sent them in). The arrival
  times are reconstructed: from ``start_times`` where the file has them (newer vLLM), else
  drawn as vLLM bench drew them (gamma gaps of shape ``burstiness`` and mean
  1/``request_rate``, first request at 0: ``sim/workload/synthetic.py``) with the scenario's
  seed (not the client's draw: vLLM's random state is not in the file), and with
  ``max_concurrency`` as the same closed loop (at most that many in flight). Failed requests
  (an error, or no output) are left out, as vLLM bench leaves them out of its figures.

Independence: one bench run gives two measurements, its median TTFT and median TPOT (vLLM's
figures; computed from the per-request lists when the summary keys are absent). TTFT and TPOT
respond to different terms (prompt steps against decode steps), so each constrains the fit; the
per-request values are NOT separate measurements: they share the run's queue and batches, and
counting them as independent would shrink every interval by sqrt(requests). Median ITL is left
out as it measures what median TPOT does. Whether the measurements pin down the free terms is
decided from the rank of the terms' sensitivities (``sim/cost/profile_fit.py``), not from the
count alone.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sim.errors import UserError
from sim.metrics.keys import key

TTFT_KEY, TPOT_KEY = key("median", "ttft"), key("median", "tpot")  # result.json keys (sim/metrics/keys.py)
BENCH_METRICS = (TTFT_KEY, TPOT_KEY)


@dataclass(frozen=True)
class Measurement:
    id: str
    metric: str      # a result.json key or one derived from them: sim/analysis/validate.py metric_value
    measured: float
    run: str         # the MeasuredRun producing it (measurements of one run share one simulation)


@dataclass
class MeasuredRun:
    key: str
    scenario: dict               # the scenario as read (its engine.profile is replaced by the candidate)
    base_dir: str                # resolves the scenario's relative paths
    where: str                   # the file it came from, for messages
    workload: object | None = None  # RequestArrays replayed (bench JSON); None: the scenario's own


@dataclass
class FitData:
    runs: dict[str, MeasuredRun] = field(default_factory=dict)
    measurements: list[Measurement] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (id, why)


def read_fit_data(paths: list[Path], scenario: Path | None = None, rows: list[str] | None = None) -> FitData:
    """Measurements of every file (``*.yaml`` cases, ``*.json`` vLLM bench results); ``rows``
    keeps the case rows whose id is or starts with one of them (``simsrv validate --case``'s
    rule); ``scenario`` is the deployment a bench result measured."""
    data = FitData()
    cases = [p for p in paths if p.suffix.lower() in (".yaml", ".yml")]
    benches = [p for p in paths if p.suffix.lower() == ".json"]
    other = [p for p in paths if p not in cases and p not in benches]
    if other:
        raise UserError(f"{other[0]}: a measurement file is a validation case (*.yaml) or a vLLM bench result (*.json)")
    if benches and scenario is None:
        raise UserError(f"{benches[0]}: a vLLM bench result needs --scenario, the deployment it measured "
                        "(model, GPU, parallelism, engine settings)")
    if scenario is not None and not benches:
        raise UserError("--scenario is the deployment of a vLLM bench result (*.json); none given (a case file's "
                        "rows carry their own scenarios)")
    if rows and not cases:
        raise UserError("--rows selects rows of validation case files (*.yaml); none given")
    if cases:
        _add_cases(data, cases, rows)
    for p in benches:
        _add_bench(data, p, scenario)
    return data


def _add_cases(data: FitData, files: list[Path], rows: list[str] | None) -> None:
    from sim.analysis.validate import load_case_files, select

    loaded = load_case_files(files, ", ".join(str(f) for f in files))
    if rows:
        picked: list = []
        for sel in rows:
            picked += [r for r in select(loaded, sel) if r not in picked]
        loaded = [r for r in loaded if r in picked]
    for r in loaded:
        why = _not_fittable(r)
        if why:
            data.skipped.append((r.id, why))
            continue
        scen = json.dumps({k: v for k, v in r.scenario.items() if k != "name"}, sort_keys=True, default=str)
        run_key = f"{Path(r.file).parent}:{scen}"
        if run_key not in data.runs:
            data.runs[run_key] = MeasuredRun(run_key, r.scenario, str(Path(r.file).parent), r.file)
        data.measurements.append(Measurement(r.id, r.metric, float(r.measured), run_key))


def _not_fittable(r) -> str:
    if r.status != "ok":
        return f"not reproducible: {r.reason}"
    if r.allreduce is not None:
        return "an all-reduce row does not depend on the engine profile"
    if r.level == "ordering" or r.ratio:
        return "an ordering or ratio row has no measured figure of its own"
    if r.capacity is not None:
        return "a capacity row is a knee search per evaluation (too costly to fit on)"
    if r.measured is None or r.scenario is None:
        return "no measured value"
    if r.measured <= 0:
        return "measured value is not positive (the fit compares relative errors)"
    return ""


def _doc(path: Path) -> dict:
    from sim.workload.sources import json_limit

    try:
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise UserError(f"{path}: vLLM bench result not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        line = f" line {e.lineno}" if isinstance(e, json.JSONDecodeError) else ""
        raise UserError(f"{path}:{line} not valid JSON ({getattr(e, 'msg', e)})") from None
    except (RecursionError, ValueError) as e:
        raise UserError(f"{path}: {json_limit(e)}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("input_lens"), list):
        raise UserError(f"{path}: not a vLLM bench result with per-request data (expected input_lens, output_lens, "
                        "ttfts, itls: run vllm bench serve with --save-result --save-detailed)")
    return doc


def _number(path: Path, doc: dict, key: str, default, minimum: float, inf_ok: bool = False):
    v = doc.get(key, default)
    if v is None or (inf_ok and v == "inf"):
        return math.inf if v == "inf" else v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < minimum:
        raise UserError(f"{path}: key {key} is {v!r:.40}, expected a number >= {minimum:g}"
                        + (" or \"inf\"" if inf_ok else ""))
    return v


def _list(path: Path, doc: dict, key: str, n: int) -> list:
    v = doc.get(key)
    if not isinstance(v, list) or len(v) != n:
        raise UserError(f"{path}: key {key} must be a list of {n} items, one per request (as input_lens); "
                        "vLLM bench writes it with --save-detailed")
    return v


def _per_request(path: Path, key: str, values: list, integer: bool) -> np.ndarray:
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (
                integer and not float(v).is_integer()):
            raise UserError(f"{path}: {key}[{i}] (request {i}) is {v!r:.40}, expected "
                            + ("a whole number >= 0" if integer else "a number of seconds >= 0"))
    return np.asarray(values, dtype=np.int64 if integer else np.float64)


def bench_measured(path: Path, doc: dict, ok: np.ndarray, out_lens: np.ndarray) -> dict[str, float]:
    """The run's measured median TTFT and TPOT (ms): vLLM's summary keys, else computed from the
    per-request lists as vLLM computes them (vllm/benchmarks/serve.py calculate_metrics: TPOT =
    (latency - TTFT) / (output tokens - 1), latency - TTFT being the sum of the request's ITLs)."""
    n = len(ok)
    out: dict[str, float] = {}
    for m in BENCH_METRICS:
        v = doc.get(m)
        if v is not None:
            out[m] = float(_number(path, doc, m, None, 0.0))
    if TTFT_KEY not in out and "ttfts" in doc:
        ttft = _per_request(path, "ttfts", _list(path, doc, "ttfts", n), False)
        if ok.any():
            out[TTFT_KEY] = float(np.median(ttft[ok])) * 1e3
    if TPOT_KEY not in out and "itls" in doc:
        itls = _list(path, doc, "itls", n)
        tpots = []
        for i in np.flatnonzero(ok & (out_lens > 1)):
            if not isinstance(itls[i], list):
                raise UserError(f"{path}: itls[{i}] (request {i}) must be a list of seconds")
            tpots.append(float(_per_request(path, f"itls[{i}]", itls[i], False).sum()) / (int(out_lens[i]) - 1))
        if tpots:
            out[TPOT_KEY] = float(np.median(tpots)) * 1e3
    return {k: v for k, v in out.items() if v > 0}


def bench_workload(path: Path, doc: dict, seed: int):
    """(requests replayed, the ok mask over the file's rows, output lengths, how arrivals were
    reconstructed, max_concurrency or None): see the module docstring."""
    from sim.workload.arrays import RequestArrays
    from sim.workload.synthetic import arrival_times_s

    n = len(doc["input_lens"])
    if n == 0:
        raise UserError(f"{path}: the result holds no requests")
    inp = _per_request(path, "input_lens", doc["input_lens"], True)
    out = _per_request(path, "output_lens", _list(path, doc, "output_lens", n), True)
    errors = doc.get("errors") or [""] * n
    if not isinstance(errors, list) or len(errors) != n or not all(e is None or isinstance(e, str) for e in errors):
        raise UserError(f"{path}: key errors must be a list of {n} strings (empty for a request that succeeded)")
    ok = (out > 0) & (inp > 0) & ~np.array([bool(e) for e in errors])
    if not ok.any():
        raise UserError(f"{path}: every request failed; nothing to fit")
    concurrency = _number(path, doc, "max_concurrency", None, 1)
    if "start_times" in doc:
        t = _per_request(path, "start_times", _list(path, doc, "start_times", n), False)
        t = t - t.min()
        how, concurrency = "start_times (as sent)", None  # the sends already waited for a free client
    else:
        rate = _number(path, doc, "request_rate", None, 0.0, inf_ok=True)
        if rate is None or rate == 0:
            raise UserError(f"{path}: key request_rate is missing; without start_times the arrivals are drawn from it")
        burst = _number(path, doc, "burstiness", 1.0, 0.0)
        if burst <= 0:
            raise UserError(f"{path}: key burstiness must be > 0")
        t = arrival_times_s(np.random.default_rng(seed), n, float(rate), float(burst))
        how = (f"drawn: request_rate {rate:g}/s, burstiness {burst:g}, seed {seed}"
               + (f", max_concurrency {int(concurrency)} (closed loop)" if concurrency else ""))
    order = np.argsort(t[ok], kind="stable")
    arr = RequestArrays(t[ok][order], inp[ok][order], out[ok][order])
    return arr, ok, out, how, (int(concurrency) if concurrency else None)


def _add_bench(data: FitData, path: Path, scenario: Path) -> None:
    from sim.scenario import read_scenario_raw, scenario_from_dict

    doc = _doc(path)
    raw = read_scenario_raw(scenario)
    # its workload is replaced by the file's requests (below): not read, not required
    placeholder = {**copy.deepcopy(raw), "workload": {"synthetic": {"num_requests": 1}}}
    seed = scenario_from_dict(placeholder, str(scenario), base_dir=str(scenario.parent)).seed
    arr, ok, out_lens, how, concurrency = bench_workload(path, doc, seed)
    measured = bench_measured(path, doc, ok, out_lens)
    if not measured:
        raise UserError(f"{path}: no {TTFT_KEY} or {TPOT_KEY}, and no ttfts/itls to compute them from")
    # the scenario's workload stands for the file's requests (run with them): a synthetic
    # workload of as many requests, closed loop when vLLM bench ran with --max-concurrency
    syn: dict = {"num_requests": len(arr), "request_rate": math.inf}
    if concurrency:
        syn["max_concurrency"] = concurrency
    raw["workload"] = {"synthetic": syn}
    raw.setdefault("name", path.stem)
    run_key = f"bench:{path}"
    where = f"{path} ({how}; {int((~ok).sum())} failed left out)"
    data.runs[run_key] = MeasuredRun(run_key, raw, str(scenario.parent), where, workload=arr)
    for m, v in measured.items():
        data.measurements.append(Measurement(f"{path.name}/{m}", m, v, run_key))


class Simulator:
    """Simulates every measured run with candidate terms over a base profile: each candidate is
    written as a profile file (``engine.profile: path``, the same route the fitted file takes, so
    the written profile reproduces the fit's figures exactly) and every run's scenario names it."""

    def __init__(self, data: FitData, base_entry: dict, directory: Path):
        self.data = data
        self.base_entry = base_entry
        self.dir = directory
        self.runs = 0
        self._memo: dict[Path, np.ndarray] = {}  # by candidate file (its content): any set of free terms

    def profile_file(self, values_ms: dict[str, float]) -> Path:
        import hashlib

        import yaml

        entry = {**self.base_entry, **{k: float(v) for k, v in values_ms.items()}}
        text = yaml.safe_dump(entry, sort_keys=False)
        path = self.dir / f"candidate-{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml"
        if not path.exists():
            path.write_text(text, encoding="utf-8")
        return path

    def summary(self, run: MeasuredRun, profile: Path) -> dict:
        from sim.metrics.summary import summarize
        from sim.run import run_scenario
        from sim.scenario import scenario_from_dict

        raw = copy.deepcopy(run.scenario)
        raw.setdefault("engine", {})["profile"] = str(profile)
        s = scenario_from_dict(raw, f"measurement {run.where}", base_dir=run.base_dir)
        self.runs += 1
        return summarize(run_scenario(s, workload=run.workload))

    def __call__(self, values_ms: dict[str, float]) -> np.ndarray:
        from sim.analysis.validate import MetricMissing, metric_value
        from sim.engine.deployment import shared_cost_models

        profile = self.profile_file(values_ms)
        hit = self._memo.get(profile)
        if hit is not None:
            return hit
        with shared_cost_models():
            summaries = {k: self.summary(r, profile) for k, r in self.data.runs.items()}
        out = []
        for m in self.data.measurements:
            try:
                out.append(metric_value(summaries[m.run], m.metric))
            except MetricMissing as e:
                shown = ", ".join(f"{k} {v:.6g} ms" for k, v in values_ms.items())
                raise UserError(f"measurement {m.id}: {e} with {shown}") from None
        self._memo[profile] = np.asarray(out, dtype=np.float64)
        return self._memo[profile]


def hold_out(data: FitData, prefixes: list[str]) -> tuple[FitData, FitData]:
    """(fitted, held out): the measurements whose id is or starts with one of ``prefixes`` (a
    row-id prefix ends at a ``/``) are held out of the fit and judged with its result."""
    def held(mid: str) -> bool:
        return any(mid == p or mid.startswith(p.rstrip("/") + "/") for p in prefixes)

    parts = []
    for keep in (False, True):
        ms = [m for m in data.measurements if held(m.id) == keep]
        parts.append(FitData({m.run: data.runs[m.run] for m in ms}, ms, data.skipped if not keep else []))
    if prefixes and not parts[1].measurements:
        raise UserError(f"--hold-out {prefixes[0]}: no measurement has this id or id prefix")
    return parts[0], parts[1]
