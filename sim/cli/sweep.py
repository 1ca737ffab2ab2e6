"""``simsrv sweep`` and ``simsrv capacity``: many runs of one scenario, in parallel, with CIs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from sim.cli.consoles import RAY_INSTALL_HELP, LazyConsole
from sim.cli.outputs import check_output
from sim.cli.run_cmd import core_note
from sim.metrics.keys import P99_TPOT, P99_TTFT
from sim.errors import UserError

out_console = LazyConsole()
err_console = LazyConsole(stderr=True)

SEEDS_HELP = "Seeds per point (common random numbers: seed k gives the same workload draw at every point)."
EXECUTOR_HELP = f"local (a process pool on this machine) or ray (an existing Ray cluster; {RAY_INSTALL_HELP})."


def _gpus(points) -> tuple[str, ...]:
    from sim.scenario import scenario_from_dict

    gpus = set()
    for p in points:
        s = scenario_from_dict(dict(p.raw), "grid", base_dir=p.base_dir)
        gpus.add(f"custom:{s.hardware.custom.name or 'custom'}" if s.hardware.custom is not None else s.hardware.gpu)
        if s.disaggregation is not None:
            gpus |= {pool.gpu for pool in (s.disaggregation.prefill, s.disaggregation.decode) if pool.gpu}
    return tuple(sorted(gpus))


def _points(scenario: Path, sets: List[str], grid: Optional[Path], policies: Optional[str]):
    from sim.scenario import load_scenario
    from sim.sweep.grid import expand, read_grid

    base = load_scenario(scenario, sets)
    overrides = read_grid(grid) if grid is not None else [{}]
    if policies:
        names = [p.strip() for p in policies.split(",") if p.strip()]
        if any("engine.policy" in o for o in overrides):
            raise UserError("--policies and a grid that sets engine.policy: give the policies in one place")
        overrides = [{"engine.policy": name, **o} for name in names for o in overrides]
    return base, expand(base, overrides, str(grid) if grid is not None else "--policies")


def _progress(label: str, eta: bool = True):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    cols = [TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    if eta:
        cols.append(TimeRemainingColumn())
    return Progress(*cols, console=err_console.console, transient=True, disable=not err_console.is_terminal)


def _slo_limits(base, grid_keys: list[str]) -> dict[str, float | None]:
    """The scenario's SLO limits for the sweep page's lines; a limit the grid varies has no one line."""
    limits = base.slo.model_dump()
    return {k: (None if f"slo.{k}" in grid_keys else v) for k, v in limits.items()}


def sweep(
    scenario: Path = typer.Argument(..., help="Scenario YAML file."),
    grid: Path = typer.Option(..., "--grid", help="Grid YAML: dotted keys -> lists (cartesian), or a list of override maps."),
    seeds: int = typer.Option(3, "--seeds", help=SEEDS_HELP),
    executor: str = typer.Option("local", "--executor", help=EXECUTOR_HELP),
    workers: Optional[int] = typer.Option(None, "--workers", help="Local worker processes (default: every core)."),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster: auto, or ray://host:port."),
    out: Optional[Path] = typer.Option(None, "--out", help="Output directory (default reports/sweeps/NAME)."),
    resume: bool = typer.Option(False, "--resume", help="Skip (point, seed) runs whose results are on disk."),
    set_: List[str] = typer.Option([], "--set", help="Override a key of the base scenario: dotted.key=value."),
):
    """Run every point of a grid with K seeds; write a Parquet table per run, per point (mean and
    95% CI over seeds) and an HTML report of latency against rate."""
    from sim.reporting.sweep_page import sweep_page
    from sim.sweep.executors import make_executor
    from sim.sweep.grid import rate_key
    from sim.sweep.runner import SweepInterrupted, run_sweep, seeds_from

    base, points = _points(scenario, set_, grid, None)
    seed_list = seeds_from(base.seed, seeds)
    out_dir = out or Path("reports/sweeps") / base.dir_name
    check_output(out_dir, "--out", directory=True)
    ex = make_executor(executor, workers, address, _gpus(points))
    progress = _progress("points")
    task = progress.add_task("sweep", total=len(points))
    try:
        with progress:
            res = run_sweep(points, seed_list, out_dir, ex, resume,
                            lambda done, total: progress.update(task, completed=done))
    except SweepInterrupted as e:
        err_console.print(str(e), markup=False, highlight=False)
        raise SystemExit(130) from None  # as an interrupted command; typer.Exit is swallowed without standalone mode
    finally:
        ex.close()
    key = rate_key(points)
    agg = res.aggregate
    grid_keys = list(dict.fromkeys(k for p in points for k in p.overrides))
    notes = [f"{base.name}: {len(points)} points x {len(seed_list)} seeds (seeds {seed_list[0]}..{seed_list[-1]}); "
             f"{res.num_ran} runs now, {res.num_skipped} from an earlier run, in {res.wall_s:.1f} s with "
             f"{ex.workers} workers ({executor})."]
    if len(seed_list) > 1:
        notes.append("95% intervals over seeds: Student's t for means and throughputs, a percentile bootstrap over "
                     "seeds for percentiles.")
    if agg.height and bool(agg["seeds_identical"].any()):
        notes.append("Some points gave identical results for every seed (a trace replay does not depend on the "
                     "seed): their intervals have width 0 and say nothing about sampling noise.")
    sweep_page(agg, grid_keys, key, f"Sweep: {base.name}", notes, _slo_limits(base, grid_keys)).write(
        out_dir / "report.html")
    from rich.table import Table

    from sim.reporting.sweep_page import _ci, _latency_ci

    t = Table(title=f"sweep {base.name}: " + (f"mean [95% CI] over {len(seed_list)} seeds" if len(seed_list) > 1
                                              else "one seed (intervals need --seeds >= 2)"))
    for c in ("point", "p99 TTFT", "p99 TPOT", "req/s", "errors"):
        t.add_column(c, justify="left" if c == "point" else "right")
    for r in agg.iter_rows(named=True):
        t.add_row(r["label"], _latency_ci(r, P99_TTFT), _latency_ci(r, P99_TPOT),
                  _ci(r, "request_throughput"), str(r["num_errors"]))
    out_console.print(t)
    for n in notes:
        if not n.startswith("95% intervals"):
            out_console.print(n, markup=False, highlight=False)
    out_console.print(f"wrote {out_dir}/ (sweep.parquet, aggregate.parquet, report.html)")
    core_note()


def capacity(
    scenario: Path = typer.Argument(..., help="Scenario YAML file."),
    slo: str = typer.Option(..., "--slo", help="SLO terms, e.g. ttft_p99_ms=500,tpot_p99_ms=50."),
    policies: Optional[str] = typer.Option(None, "--policies", help="Comma-separated policies, one configuration each."),
    grid: Optional[Path] = typer.Option(None, "--grid", help="Grid YAML of configurations (not the rate)."),
    seeds: int = typer.Option(3, "--seeds", help="Seeds per probed rate. " + SEEDS_HELP),
    tolerance: float = typer.Option(0.05, "--tolerance", help="Stop when the bracket is within this fraction."),
    executor: str = typer.Option("local", "--executor", help=EXECUTOR_HELP),
    workers: Optional[int] = typer.Option(None, "--workers", help="Local worker processes (default: every core)."),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster: auto, or ray://host:port."),
    out: Optional[Path] = typer.Option(None, "--out", help="Output directory (default reports/capacity/NAME)."),
    set_: List[str] = typer.Option([], "--set", help="Override a key of the base scenario: dotted.key=value."),
    rate: Optional[float] = typer.Option(None, "--rate", help="Find the cheapest deployment meeting the SLO at this "
                                         "request rate (req/s) instead of each configuration's knee."),
    search: str = typer.Option("replicas", "--search", help="With --rate: dimensions searched, from replicas, "
                               "tensor_parallel_size, gpu, policy, max_num_batched_tokens, speculative (on/off); values after = "
                               "separated by / (e.g. replicas,tensor_parallel_size=1/2/4,gpu=h100-sxm/h200)."),
    max_replicas: int = typer.Option(64, "--max-replicas", help="With --rate: the most replicas searched."),
    as_json: bool = typer.Option(False, "--json", help="With --rate: print only the answer as JSON."),
    prices: Optional[str] = typer.Option(None, "--prices", help="With --rate: $ per GPU-hour by GPU, e.g. "
                                         "h100-sxm=2.99,h200=3.5 (default: the scenario's hardware.price_per_gpu_hour, "
                                         "for its own GPU)."),
):
    """For each configuration, the highest request rate meeting the SLO (the knee), with its CI;
    with --rate R, the cheapest deployment (fewest GPUs, then $/h) meeting the SLO at R."""
    from sim.sweep.slo import parse_slo

    terms = parse_slo(slo)  # before the heavy imports: a typo answers at once
    if rate is not None:
        if policies or grid:
            raise UserError("--rate searches the dimensions --search names; give policies there "
                            "(--search replicas,policy=chunked/continuous), not with --policies or --grid")
        return _cheapest(scenario, terms, slo, rate, search, max_replicas, seeds, executor, workers, address, out,
                         set_, as_json, prices)
    if as_json:
        raise UserError("--json goes with --rate")
    from sim.reporting.capacity_page import capacity_page, capacity_table
    from sim.sweep.capacity import run_capacity
    from sim.sweep.executors import make_executor
    from sim.sweep.runner import seeds_from

    base, points = _points(scenario, set_, grid, policies)
    seed_list = seeds_from(base.seed, seeds)
    out_dir = out or Path("reports/capacity") / base.dir_name
    check_output(out_dir, "--out", directory=True)
    ex = make_executor(executor, workers, address, _gpus(points))
    progress = _progress("configurations searched", eta=False)
    task = progress.add_task("capacity", total=len(points))
    try:
        with progress:
            res = run_capacity(points, terms, seed_list, ex, tolerance,
                               lambda done, total, runs: progress.update(task, completed=done))
    finally:
        ex.close()
    records = res.records()
    notes = [f"{base.name}: SLO {slo}; {len(seed_list)} seeds per probe; bisection until the bracket is within "
             f"{tolerance:.0%}; {len(res.rows)} runs in {res.wall_s:.1f} s with {ex.workers} workers ({executor}).",
             "A probe passes when the mean over seeds of every SLO figure is within its limit. The knee is "
             "interpolated between the highest passing and lowest failing probes; its 95% CI is a bootstrap over "
             "seeds. Utilisation: fraction of time the replicas spent stepping, interpolated at the knee (with "
             "continuous batching a replica steps whenever any request is decoding, so a value near 1 alone does "
             "not mean saturation). A short workload can pass an SLO at a rate it cannot sustain, because it ends "
             "before the queue grows: give enough requests for the run to reach steady state."]
    if any(r["seeds_identical"] for r in records):
        notes.append("Some configurations gave identical results for every seed (a trace replay does not depend "
                     "on the seed): their knee CI has width 0 and only the bracket bounds the knee.")
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {"scenario": str(scenario), "slo": {t.name: t.limit_ms for t in terms}, "seeds": seed_list,
               "tolerance": tolerance, "configurations": records}
    from sim.files.atomic import atomic_path, write_text
    from sim.files.text import arrow_file

    write_text(out_dir / "capacity.json", json.dumps(payload, indent=2, default=str) + "\n")
    if res.rows.height:
        with atomic_path(out_dir / "probes.parquet") as tmp, arrow_file(tmp, "wb") as sink:
            res.rows.write_parquet(sink)
    capacity_page(records, res.probe_records(), f"Capacity: {base.name}", notes).write(out_dir / "capacity.html")
    header, rows = capacity_table(records)
    from rich.table import Table

    t = Table(title=f"capacity {base.name}: SLO {slo}")
    for h in header:
        t.add_column(h, justify="left" if h == "configuration" else "right")
    for row in rows:
        t.add_row(*(str(v) for v in row))
    out_console.print(t)
    for r in records:
        for what in ("error", "warning"):
            if r.get(what):
                out_console.print(f"{r['label']}: {what}: {r[what]}", markup=False, highlight=False)
    out_console.print(notes[0], markup=False, highlight=False)
    out_console.print(f"wrote {out_dir}/ (capacity.json, capacity.html, probes.parquet)")
    core_note()


def _cheapest(scenario: Path, terms, slo: str, rate: float, search: str, max_replicas: int, seeds: int, executor: str,
              workers: Optional[int], address: Optional[str], out: Optional[Path], sets: List[str],
              as_json: bool, prices: Optional[str]) -> None:
    """``capacity --rate``: the cheapest deployment meeting the SLO at ``rate``, verified one step below."""
    from sim.scenario import load_scenario
    from sim.sweep.cheapest import cheapest_deployment, parse_prices, parse_search
    from sim.sweep.executors import make_executor
    from sim.sweep.runner import seeds_from
    from sim.sweep.cheapest import DEFAULT_VALUES

    dims = parse_search(search)
    price_map = parse_prices(prices)
    base = load_scenario(scenario, sets)
    seed_list = seeds_from(base.seed, seeds)
    out_dir = out or Path("reports/capacity") / f"{base.dir_name}-rate"
    gpus = tuple(dims.get("gpu") or DEFAULT_VALUES["gpu"]) if "gpu" in dims else (base.hardware.gpu,)
    ex = make_executor(executor, workers, address, tuple(g for g in gpus if g))
    progress = _progress("searching", eta=False)
    task = progress.add_task("search", total=None)
    try:
        with progress:
            res = cheapest_deployment(base, terms, rate, dims, seed_list, ex, max_replicas,
                                      lambda what, runs: progress.update(task, description=f"{what}, {runs} runs"),
                                      prices=price_map)
    finally:
        ex.close()
    payload = res.payload()
    from sim.files.atomic import write_text

    out_dir.mkdir(parents=True, exist_ok=True)
    write_text(out_dir / "cheapest.json", json.dumps(payload, indent=2) + "\n")
    if as_json:
        print(json.dumps(payload, indent=2))
        return
    _print_cheapest(base.name, slo, res)
    out_console.print(f"wrote {out_dir}/cheapest.json")
    core_note()


def _deployment(d: dict) -> str:
    price = f", ${d['cost_per_hour']:,.2f}/h" if d.get("cost_per_hour") is not None else ""
    return (f"{d['replicas']} x TP{d['tensor_parallel_size']} {d['gpu']} = {d['gpus']} GPUs{price}, "
            f"{d['policy']}, max_num_batched_tokens {d['max_num_batched_tokens']}"
            + (", speculative decoding" if d.get("speculative") == "on" else ""))


def _print_cheapest(name: str, slo: str, res) -> None:
    from rich.table import Table

    t = Table(title=f"cheapest deployment for {name} at {res.rate_per_s:g} req/s, SLO {slo}")
    for h in ("shape", "fewest replicas", "GPUs", "$/h", "status"):
        t.add_column(h, justify="left" if h in ("shape", "status") else "right")
    for sh in res.shapes:
        label = ", ".join(f"{k}={v}" for k, v in sh.values.items()) or "base"
        n = sh.pass_n
        status = ("error: " + sh.error if sh.error else "not searched further (cannot beat the answer)" if sh.pruned
                  else "meets the SLO" if n is not None else f"fails with {sh.fail_n} replicas")
        gpus = n * sh.gpus_per_replica if n is not None else None
        cost = gpus * sh.price_per_gpu_hour if gpus is not None and sh.price_per_gpu_hour else None
        t.add_row(label, str(n) if n is not None else "-", str(gpus) if gpus is not None else "-",
                  f"{cost:,.2f}" if cost is not None else "-", status)
    out_console.print(t)
    if res.answer:
        out_console.print(f"answer: {_deployment(res.answer)}", markup=False, highlight=False)
        b = res.below
        out_console.print(f"one step below: {_deployment(b)}: " + ("meets the SLO" if b["meets_slo"] else "fails"),
                          markup=False, highlight=False)
    if res.pareto:
        p = Table(title="Pareto: sustainable rate (knee) against cost")
        for h in ("deployment", "sustainable req/s"):
            p.add_column(h, justify="left" if h == "deployment" else "right")
        for r in res.pareto:
            rate = r["sustainable_rate"]
            p.add_row(_deployment(r), f"{rate:,.2f}" if rate is not None else "-")
        out_console.print(p)
    for n in res.notes:
        out_console.print(f"note: {n}", markup=False, highlight=False)
    out_console.print(f"{res.runs} runs in {res.wall_s:.1f} s", markup=False, highlight=False)
