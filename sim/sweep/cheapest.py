"""``cheapest_deployment``: the fewest GPUs, then the lowest $/h, that meet an SLO at a given
request rate, found by simulation, with a Pareto table of sustainable rate against cost.

Why: a planner asks "what do I run for R req/s?", not "what does this one deployment sustain".
The searched dimensions (``--search``) other than ``replicas`` make shapes (tensor parallel
size x GPU x policy x token budget); for each shape the fewest replicas that meet the SLO at R
are found by simulating the workload at R: doubling (1, 2, 4, ...) until one passes, then
bisection between the last failing and the first passing count. NOTE: this assumes more
replicas of one shape never serve a fixed rate worse (true of every router here for a
workload that does not depend on the replica count); the answer and the same shape with one
replica fewer are both simulated, so the claim at the answer is checked, not assumed.

A probe passes when no request failed and the mean over seeds of every SLO figure is within
its limit (``capacity``'s knee search, sim/sweep/capacity.py, passes on the mean too, but
leaves out a figure undefined at some seeds and counts no failures: a planner's answer must
serve every request and have every figure). A shape that
cannot pass at fewer GPUs than the best answer found so far is not searched further.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from sim.metrics.summary import num_gpus
from sim.errors import UserError
from sim.metrics.run_warnings import VALIDATED_REQUEST_ERR, close_call
from sim.policies import get_policy
from sim.policies.registry import names_with
from sim.scenario import Scenario, scenario_from_dict
from sim.sweep.capacity import make_config, run_capacity
from sim.sweep.grid import Point, expand
from sim.sweep.slo import SLOTerm
from sim.sweep.task import Task

# --search names -> scenario keys
DIMENSIONS = {
    "replicas": "cluster.replicas",
    "tensor_parallel_size": "cluster.tensor_parallel_size",
    "gpu": "hardware.gpu",
    "policy": "engine.policy",
    "max_num_batched_tokens": "engine.max_num_batched_tokens",
    # on: the scenario's engine.speculative_config; off: none (README, "Speculative decoding")
    "speculative": "engine.speculative_config",
}


def searched_policies() -> list[str]:
    """The policies searched by default: the colocated iteration-level ones (their specs'
    capabilities, sim/policies/registry.py), chunked prefill first (vLLM V1's default)."""
    names = names_with(lambda p: p.iteration_level and not p.pools)
    return sorted(names, key=lambda n: not get_policy(n).chunked_prefill)


# values searched when --search names a dimension without values
DEFAULT_VALUES: dict[str, list] = {
    "tensor_parallel_size": [1, 2, 4, 8],
    "gpu": ["a100-80g", "h100-sxm", "h200", "b200", "l40s"],
    "policy": searched_policies(),
    "max_num_batched_tokens": [512, 2048, 8192],
    "speculative": ["on", "off"],
}
MAX_REPLICAS = 64  # default cap of the replica search (--max-replicas)
ANSWER_KEYS = ("gpus", "replicas", "tensor_parallel_size", "gpu", "policy", "max_num_batched_tokens",
               "speculative", "cost_per_hour", "meets_slo")


def parse_search(text: str) -> dict[str, list | None]:
    """``replicas,tensor_parallel_size=1/2/4,gpu`` -> {dimension: values or None (the defaults)}."""
    out: dict[str, list | None] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        name, _, raw = item.partition("=")
        name = name.strip()
        if name not in DIMENSIONS:
            raise UserError(f"--search {name!r}: the dimensions are {', '.join(DIMENSIONS)}")
        if name in out:
            raise UserError(f"--search: {name} is given twice")
        if name == "replicas" and raw:
            raise UserError("--search replicas takes no values: the fewest replicas are searched (--max-replicas caps it)")
        out[name] = _values(name, raw) if raw else None
    if not out:
        raise UserError("--search: name at least one of " + ", ".join(DIMENSIONS))
    return out


def _values(name: str, raw: str) -> list:
    vals = [v.strip() for v in raw.split("/") if v.strip()]
    if name in ("gpu", "policy"):
        return vals
    if name == "speculative":
        bad = [v for v in vals if v not in ("on", "off")]
        if bad:
            raise UserError(f"--search speculative={raw}: give on and/or off, separated by /")
        return vals
    try:
        return [int(v) for v in vals]
    except ValueError:
        raise UserError(f"--search {name}={raw}: give integers separated by /") from None


def parse_prices(text: str | None) -> dict[str, float]:
    """``h100-sxm=2.99,a100-80g=1.5`` -> {gpu: $ per GPU-hour}."""
    out: dict[str, float] = {}
    for item in (x.strip() for x in (text or "").split(",")):
        if not item:
            continue
        gpu, _, raw = item.partition("=")
        try:
            price = float(raw)
        except ValueError:
            price = math.nan
        if not (price > 0 and math.isfinite(price)):
            raise UserError(f"--prices {item!r}: expected GPU=DOLLARS_PER_GPU_HOUR, e.g. h100-sxm=2.99")
        out[gpu.strip()] = price
    return out


def seed_matters(s: Scenario) -> bool:
    """Whether the seed changes the simulation: a synthetic workload, a sampled or spread trace,
    or the random router. A plain trace replay runs once, not once per seed."""
    t = s.workload.trace
    return t is None or t.sample is not None or t.spread_grid_s is not None or s.cluster.router == "random"


@dataclass
class Shape:
    """One combination of the searched dimensions other than replicas."""

    overrides: dict                 # scenario key -> value
    values: dict                    # dimension -> value (as reported)
    error: str | None = None        # why the shape cannot run (a model that does not fit...)
    fail_n: int = 0                 # most replicas known to fail at the rate
    pass_n: int | None = None       # fewest replicas known to pass
    probes: dict = field(default_factory=dict)   # replicas -> Probe result dict
    pruned: bool = False
    gpus_per_replica: int = 0
    price_per_gpu_hour: float | None = None

    def next_replicas(self, cap: int) -> int | None:
        if self.error or self.pruned:
            return None
        if self.pass_n is None:  # doubling, the cap itself last
            if self.fail_n >= cap:
                return None
            return min(cap, 1 if self.fail_n == 0 else 2 * self.fail_n)
        if self.pass_n - self.fail_n > 1:  # bisection
            return (self.pass_n + self.fail_n) // 2
        return None


@dataclass
class CheapestResult:
    rate_per_s: float
    terms: list[SLOTerm]
    seeds: list[int]
    shapes: list[Shape]
    answer: dict | None
    below: dict | None
    pareto: list[dict]
    notes: list[str]
    runs: int
    wall_s: float

    def payload(self) -> dict:
        """``capacity --rate --json``: exactly rate, slo, answer, below, pareto."""
        return {"rate": self.rate_per_s, "slo": {t.name: t.limit_ms for t in self.terms},
                "answer": self.answer, "below": self.below, "pareto": self.pareto}


class _Counting:
    """An executor that counts the runs it was given."""

    def __init__(self, inner):
        self.inner, self.runs, self.workers = inner, 0, inner.workers

    def map_unordered(self, tasks):
        for task, row in self.inner.map_unordered(tasks):
            self.runs += 1
            yield task, row


def _shape_list(base: Scenario, search: dict[str, list | None]) -> list[Shape]:
    dims = [d for d in search if d != "replicas"]
    values = [search[d] if search[d] is not None else DEFAULT_VALUES[d] for d in dims]
    if "speculative" in dims and base.engine.speculative_config is None:
        raise UserError("--search speculative: the scenario has no engine.speculative_config to turn on (its "
                        "acceptance is a measurement: give it there)")
    shapes = []
    for combo in itertools.product(*values):
        vals = dict(zip(dims, combo))
        shapes.append(Shape({DIMENSIONS[d]: _setting(base, d, v) for d, v in vals.items()}, vals))
    return shapes or [Shape({}, {})]


def _setting(base: Scenario, dim: str, value):
    """The scenario value of a searched dimension's value (speculative: the scenario's config or
    none)."""
    if dim != "speculative":
        return value
    sc = base.engine.speculative_config
    return sc.model_dump(exclude_none=True) if value == "on" else None


def _seed_tasks(p: Point, seeds: list[int], tags: dict | None = None) -> list[Task]:
    """One task per seed of the point ``p`` (its scenario at the searched rate)."""
    return [Task(p.point_id, p.index, seed, {**p.raw, "seed": seed}, p.base_dir, tags or {}) for seed in seeds]


def _describe(s: Scenario, replicas: int, gpus: int, price: float | None, meets: bool) -> dict:
    return {"gpus": gpus, "replicas": replicas, "tensor_parallel_size": s.cluster.tensor_parallel_size,
            "gpu": s.hardware.gpu if s.hardware.custom is None else (s.hardware.custom.name or "custom"),
            "policy": s.engine.policy, "max_num_batched_tokens": s.engine.max_num_batched_tokens,
            "speculative": "off" if s.engine.speculative_config is None else "on",
            "cost_per_hour": round(gpus * price, 4) if price else None, "meets_slo": meets}


def _probe_verdict(rows: list[dict], terms: list[SLOTerm]) -> dict:
    """Pass/fail of one (shape, replicas) at the rate from its runs (one per seed)."""
    err = next((r["error"] for r in rows if r.get("error")), None)
    if err:
        return {"error": err, "passed": False}
    failed = sum(int(r.get("failed") or 0) for r in rows)
    figures, meets, margins = {}, {}, {}
    for t in terms:
        vals = [r.get(t.key) for r in rows]
        if any(v is None for v in vals):
            figures[t.name], meets[t.name], margins[t.name] = None, False, None
            continue
        mean = sum(vals) / len(vals)
        figures[t.name] = mean
        meets[t.name] = mean <= t.limit_ms
        margins[t.name] = 1.0 - mean / t.limit_ms   # > 0: inside the limit
    return {"error": None, "failed": failed, "figures": figures, "meets": meets, "margins": margins,
            "passed": failed == 0 and all(meets.values())}


def cheapest_deployment(base: Scenario, terms: list[SLOTerm], rate_per_s: float, search: dict[str, list | None],
                        seeds: list[int], executor, max_replicas: int = MAX_REPLICAS,
                        progress: Callable[[str, int], None] | None = None, pareto: bool = True,
                        prices: dict[str, float] | None = None) -> CheapestResult:
    """Search the shapes' fewest replicas meeting the SLO at ``rate_per_s``; the cheapest is the
    answer. ``prices``: $ per GPU-hour by catalogue GPU; the scenario's
    ``hardware.price_per_gpu_hour`` prices its own GPU only."""
    prices = prices or {}
    t0 = time.perf_counter()
    if not (rate_per_s > 0 and math.isfinite(rate_per_s)):
        raise UserError(f"--rate {rate_per_s}: give a finite request rate > 0 (req/s)")
    if max_replicas < 1:
        raise UserError(f"--max-replicas {max_replicas}: must be >= 1")
    notes: list[str] = []
    if not seed_matters(base) and len(seeds) > 1:
        notes.append(f"the trace replay does not depend on the seed: each configuration ran once, not {len(seeds)} times")
        seeds = seeds[:1]
    searching_replicas = "replicas" in search
    fixed_replicas = base.cluster.replicas
    shapes = _shape_list(base, search)
    points: dict[tuple[int, int], Point] = {}

    def point(i: int, n: int) -> Point:
        if (i, n) not in points:
            ov = {**shapes[i].overrides, "cluster.replicas": n}
            p = expand(base, [ov], f"--search shape {shapes[i].values or 'base'}")[0]
            cfg = make_config(p)  # the rate key of this workload (synthetic rate or trace target rate)
            raw = cfg.raw_at(rate_per_s, seeds[0])
            points[(i, n)] = Point(len(points), ov, raw, p.base_dir, p.point_id)
        return points[(i, n)]

    for i, sh in enumerate(shapes):
        try:
            p = point(i, 1)
            s = scenario_from_dict(dict(p.raw), "shape", base_dir=p.base_dir)
            sh.gpus_per_replica = num_gpus(s)
            sh.price_per_gpu_hour = prices.get(s.hardware.gpu, s.hardware.price_per_gpu_hour
                                               if s.hardware.gpu == base.hardware.gpu else None)
            if base.disaggregation is not None:
                raise UserError("capacity --rate searches replicas of one pool; a disaggregated scenario has two "
                                "(search its pools with capacity --grid)")
        except UserError as e:
            sh.error = str(e)
    if all(sh.error for sh in shapes):
        raise UserError(f"no searched shape can run: {shapes[0].error}")

    executor = _Counting(executor)
    best_gpus: int | None = None
    while True:
        todo: list[tuple[int, int]] = []
        for i, sh in enumerate(shapes):
            if searching_replicas:
                if best_gpus is not None and sh.pass_n is None and (sh.fail_n + 1) * sh.gpus_per_replica > best_gpus:
                    sh.pruned = not sh.error
                n = sh.next_replicas(max_replicas)
            else:
                n = fixed_replicas if not sh.error and fixed_replicas not in sh.probes else None
            if n is not None:
                todo.append((i, n))
        if not todo:
            break
        if progress:
            progress(f"{len(todo)} configurations at {rate_per_s:g} req/s", executor.runs)
        tasks = [t for i, n in todo for t in _seed_tasks(point(i, n), seeds, {"shape": i, "replicas": n})]
        got: dict[tuple[int, int], list[dict]] = defaultdict(list)
        for task, row in executor.map_unordered(tasks):
            got[(task.tags["shape"], task.tags["replicas"])].append(row)
        for (i, n), rows in sorted(got.items()):
            sh = shapes[i]
            v = _probe_verdict(rows, terms)
            sh.probes[n] = v
            if v["error"]:
                sh.error = v["error"]
            elif v["passed"]:
                sh.pass_n = n if sh.pass_n is None else min(sh.pass_n, n)
            else:
                sh.fail_n = max(sh.fail_n, n)
        if searching_replicas:
            done = [sh.pass_n * sh.gpus_per_replica for sh in shapes if sh.pass_n is not None and not sh.error]
            best_gpus = min(done) if done else None

    candidates = []
    for i, sh in enumerate(shapes):
        n = sh.pass_n if searching_replicas else (fixed_replicas if sh.probes.get(fixed_replicas, {}).get("passed") else None)
        if n is None or sh.error:
            continue
        price = sh.price_per_gpu_hour
        # ties on GPUs and $/h: the widest margin under the tightest SLO (the most headroom at R)
        margin = min((m for m in sh.probes[n]["margins"].values() if m is not None), default=-math.inf)
        candidates.append((n * sh.gpus_per_replica, n * sh.gpus_per_replica * price if price else math.inf,
                           -margin, i, n))
    answer = below = None
    if candidates:
        *_, i, n = min(candidates)
        answer, below = _answer_and_below(base, shapes[i], i, n, point, seeds, executor, terms, notes)
    else:
        notes.append(f"no searched configuration meets the SLO at {rate_per_s:g} req/s"
                     + (f" with up to {max_replicas} replicas" if searching_replicas else ""))
    pareto_rows = _pareto(base, shapes, point, terms, seeds, executor, searching_replicas, fixed_replicas) if pareto and candidates else []
    return CheapestResult(rate_per_s, terms, seeds, shapes, answer, below, pareto_rows, notes, executor.runs,
                          time.perf_counter() - t0)


def _answer_and_below(base, sh: Shape, i: int, n: int, point, seeds, executor, terms, notes) -> tuple[dict, dict]:
    s = scenario_from_dict(dict(point(i, n).raw), "answer", base_dir=point(i, n).base_dir)
    answer = _describe(s, n, n * sh.gpus_per_replica, sh.price_per_gpu_hour, True)
    if n == 1:
        below = _describe(s, 0, 0, sh.price_per_gpu_hour, False)
        notes.append("the answer is one replica: one step below is none (no replica serves nothing)")
        return answer, below
    if n - 1 not in sh.probes:  # the replica count was not searched: simulate one fewer now
        p = point(i, n - 1)
        rows = [row for _, row in executor.map_unordered(_seed_tasks(p, seeds))]
        sh.probes[n - 1] = _probe_verdict(rows, terms)
    v = sh.probes[n - 1]
    below = _describe(s, n - 1, (n - 1) * sh.gpus_per_replica, sh.price_per_gpu_hour, bool(v["passed"]))
    if v["passed"]:
        notes.append(f"one replica fewer ({n - 1}) also meets the SLO: the replica count was not searched; "
                     "search it with --search replicas")
    for t in terms:
        if close_call(sh.probes[n]["figures"][t.name], t.limit_ms):
            notes.append(f"the answer meets {t.name} by {sh.probes[n]['margins'][t.name]:.1%} of its limit, inside "
                         f"the model's validated request-level error (median {VALIDATED_REQUEST_ERR:.0%}): verify "
                         "before you buy")
    return answer, below


def _pareto(base, shapes: list[Shape], point, terms, seeds, executor, searching_replicas: bool,
            fixed_replicas: int) -> list[dict]:
    """Per shape that meets the SLO, the sustainable rate (the knee of ``capacity``'s search) of
    its cheapest passing deployment and of one replica fewer; the rows no cheaper row beats on
    rate, cheapest first."""
    picks = []  # each passing shape at its fewest replicas, and one fewer (a cheaper, slower point)
    for i, sh in enumerate(shapes):
        n = sh.pass_n if searching_replicas else fixed_replicas
        if sh.error or n is None or not sh.probes.get(n, {}).get("passed"):
            continue
        picks += [(i, n - 1)] if n > 1 else []
        picks.append((i, n))
    if not picks:
        return []
    pts = []
    for k, (i, n) in enumerate(picks):
        p = point(i, n)
        pts.append(Point(k, p.overrides, p.raw, p.base_dir, p.point_id))  # indexed as run_capacity counts
    res = run_capacity(pts, terms, seeds, executor, tolerance=0.1)
    rows = []
    for (i, n), rec in zip(picks, res.records()):
        sh = shapes[i]
        s = scenario_from_dict(dict(point(i, n).raw), "pareto", base_dir=point(i, n).base_dir)
        row = _describe(s, n, n * sh.gpus_per_replica, sh.price_per_gpu_hour, bool(sh.probes[n]["passed"]))
        row["sustainable_rate"] = rec["knee_rate_per_s"]
        rows.append(row)
    # cost: $/h where every row is priced, else GPUs
    priced = all(r["cost_per_hour"] is not None for r in rows)
    rows.sort(key=lambda r: (r["cost_per_hour"] if priced else r["gpus"], r["gpus"], -(r["sustainable_rate"] or 0.0)))
    out, best = [], -math.inf
    for r in rows:
        rate = r["sustainable_rate"] if r["sustainable_rate"] is not None else -math.inf
        if rate > best:
            out.append(r)
            best = rate
    return out
