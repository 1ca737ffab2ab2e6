"""``simsrv sweep`` and ``simsrv capacity``: many runs of one scenario, in parallel, with CIs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from sim.cli.consoles import LazyConsole
from sim.cli.outputs import check_output
from sim.errors import UserError

out_console = LazyConsole()
err_console = LazyConsole(stderr=True)

SEEDS_HELP = "Seeds per point (common random numbers: seed k gives the same workload draw at every point)."
EXECUTOR_HELP = "local (a process pool on this machine) or ray (an existing Ray cluster; pip install 'simsrv[ray]')."


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


def _ci_text(r: dict, m: str) -> str:
    if r.get(f"{m}_mean") is None:
        return "-"
    return f"{r[f'{m}_mean']:,.1f} [{r[f'{m}_ci95_low']:,.1f}, {r[f'{m}_ci95_high']:,.1f}]"


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
    by_point = {p.point_id: p for p in points}
    agg = res.aggregate.with_columns(
        configuration=res.aggregate["point_id"].map_elements(lambda pid: by_point[pid].label((key,) if key else ()),
                                                               return_dtype=str))
    x, x_title = ("request_rate_mean", "request rate (req/s)") if key else (None, "point")
    if x and ("request_rate_mean" not in agg.columns or agg["request_rate_mean"].null_count() == agg.height):
        x = None
    notes = [f"{base.name}: {len(points)} points x {len(seed_list)} seeds (seeds {seed_list[0]}..{seed_list[-1]}); "
             f"{res.num_ran} runs now, {res.num_skipped} from an earlier run, in {res.wall_s:.1f} s with "
             f"{ex.workers} workers ({executor}).",
             "95% intervals over seeds: Student's t for means and throughputs, a percentile bootstrap over seeds "
             "for percentiles."]
    if agg.height and bool(agg["seeds_identical"].any()):
        notes.append("Some points gave identical results for every seed (a trace replay does not depend on the "
                     "seed): their intervals have width 0 and say nothing about sampling noise.")
    sweep_page(agg, x, x_title, f"Sweep: {base.name}", notes).write(out_dir / "report.html")
    from rich.table import Table

    t = Table(title=f"sweep {base.name}: mean [95% CI] over {len(seed_list)} seeds")
    for c in ("point", "p99 TTFT ms", "p99 TPOT ms", "req/s", "errors"):
        t.add_column(c, justify="left" if c == "point" else "right")
    for r in agg.iter_rows(named=True):
        t.add_row(r["label"], _ci_text(r, "p99_ttft_ms"), _ci_text(r, "p99_tpot_ms"),
                  _ci_text(r, "request_throughput"), str(r["num_errors"]))
    out_console.print(t)
    for n in notes[:1] + notes[2:]:
        out_console.print(n, markup=False, highlight=False)
    out_console.print(f"wrote {out_dir}/ (sweep.parquet, aggregate.parquet, report.html)")


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
):
    """For each configuration, the highest request rate meeting the SLO (the knee), with its CI."""
    from sim.sweep.slo import parse_slo

    terms = parse_slo(slo)  # before the heavy imports: a typo answers at once
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
    from sim.atomic import atomic_path, write_text
    from sim.text import arrow_file

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
