"""``simsrv compare``, ``simsrv report`` and ``simsrv diagnose`` (typer commands)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from sim.cli.consoles import RAY_INSTALL_HELP, LazyConsole
from sim.cli.outputs import check_output
from sim.errors import UserError
from sim.metrics.keys import P50_TTFT, P99_TPOT, P99_TTFT
from sim.policies import policy_names

console = LazyConsole()


def compare(
    scenario: Path = typer.Argument(..., help="Scenario YAML file."),
    policies: Optional[str] = typer.Option(None, "--policies",
                                           help="Comma-separated policies to compare (default: every policy "
                                                "the scenario's deployment can run: " + ",".join(policy_names()) + ")."),
    chunk: Optional[int] = typer.Option(None, "--chunk", help="max_num_batched_tokens of the chunked run."),
    set_: List[str] = typer.Option([], "--set", help="Override a scenario key for every run: dotted.key=value."),
    out: Optional[Path] = typer.Option(None, "--out", help="Output directory (default reports/compare/NAME)."),
    force: bool = typer.Option(False, "--force", help="Replace the output directory (runs, report) if it exists."),
):
    """Same workload and seed through each policy; one self-contained HTML report."""
    from sim.analysis.compare import parse_policies, run_compare, usable_policies
    from sim.scenario import load_scenario

    if policies is None:
        pols, skipped = usable_policies(scenario, chunk, set_)
        for why in skipped:
            console.print(f"skipped {why}", markup=False, highlight=False)
    else:
        pols = parse_policies(policies)
    name = load_scenario(scenario, set_).dir_name
    out_dir = out or Path("reports/compare") / name
    check_output(out_dir, "--out", directory=True)

    def ms(x) -> str:  # None: no request completed under that policy
        return "-" if x is None else f"{x:,.1f}"

    def on_run(label: str, s: dict) -> None:
        console.print(f"{label:>16}: TTFT p50 {ms(s[P50_TTFT])} / p99 {ms(s[P99_TTFT])} ms, "
                      f"TPOT p99 {ms(s[P99_TPOT])} ms, {s['request_throughput']:.2f} req/s, "
                      f"{s['failed']} failed", markup=False, highlight=False)
        for w in s.get("simsrv_warnings", []):
            console.print(f"{'':>16}  warning: {w}", markup=False, highlight=False)
        for note in s.get("simsrv_uncertainty", []):
            console.print(f"{'':>16}  note: {note}", markup=False, highlight=False)

    report = run_compare(scenario, pols, chunk, set_, out_dir, on_run, force)
    console.print(f"wrote {report} and {report.with_name('compare.json').name}")


def report(
    run_dirs: List[Path] = typer.Argument(..., help="Run directories written by simsrv run or compare."),
    output: Path = typer.Option(Path("report.html"), "-o", "--output", help="HTML file to write."),
):
    """Build the comparison report from finished runs."""
    from sim.reporting.compare_page import build_compare_page
    from sim.reporting.rundata import load_run

    check_output(output, "-o", directory=False)
    runs = [load_run(d) for d in run_dirs]
    if len({r.label for r in runs}) < len(runs):
        runs = [load_run(d, f"{d.parent.name}/{d.name}") for d in run_dirs]
    page = build_compare_page(runs, "simsrv report")
    output.parent.mkdir(parents=True, exist_ok=True)
    page.write(output)
    console.print(f"wrote {output}")


def diagnose(
    trace: Path = typer.Argument(..., help="Request trace (any format simsrv trace readers accept)."),
    scenario: Optional[Path] = typer.Option(None, "--scenario", help="Deployment to replay it on "
                                            "(default scenarios/chat.yaml: Llama-3-8B, one H100)."),
    set_: List[str] = typer.Option([], "--set", help="Override a scenario key: dotted.key=value."),
    slo: Optional[str] = typer.Option(None, "--slo", help="SLO terms judged, e.g. ttft_p90_ms=500,tpot_p99_ms=50 "
                                      "(default: the scenario's slo.ttft_ms / tpot_ms / e2el_ms on the p99)."),
    executor: str = typer.Option("local", "--executor", help="Where the candidate fixes run: local (a process "
                                 f"pool) or ray (an existing Ray cluster; {RAY_INSTALL_HELP})."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Local worker processes (default: every core; "
                                          "1 = in this process)."),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster address (--executor ray)."),
    max_replicas: int = typer.Option(64, "--max-replicas", help="Cap of the search for the replicas that keep up."),
    as_json: bool = typer.Option(False, "--json", help="Print the verdict and the ranked fixes as JSON."),
    out: Optional[Path] = typer.Option(None, "--out", help="Output directory (default reports/diagnose/TRACE)."),
    force: bool = typer.Option(False, "--force", help="Replace the output directory (run, report) if it exists."),
):
    """Replay a production trace and explain its p99 TTFT: verdict, cause, evidence, ranked fixes."""
    import json

    from sim.analysis.diagnose import diagnose as run_diagnose
    from sim.files.atomic import replacing_dir
    from sim.cli.sweep import _progress, err_console
    from sim.output import not_report_files, write_run
    from sim.reporting.diagnose_page import build_diagnose_page
    from sim.sweep.executors import make_executor
    from sim.sweep.slo import parse_slo

    if not trace.exists():
        raise UserError(f"{trace}: trace file not found")
    if slo:
        parse_slo(slo)  # a typo answers before any simulation
    if max_replicas < 1:
        raise UserError(f"--max-replicas {max_replicas}: must be >= 1")
    out_dir = out or Path("reports/diagnose") / trace.stem
    check_output(out_dir, "--out", directory=True)
    ex = make_executor(executor, workers, address)
    bar = _progress("diagnose: simulations", eta=False)
    job = bar.add_task("diagnose", total=None)
    try:
        with replacing_dir(out_dir, force, not_report_files) as stage:  # run and report replaced whole
            with bar:
                d = run_diagnose(trace, scenario, set_, slo, ex,
                                 lambda done, total: bar.update(job, completed=done, total=total), max_replicas)
            write_run(d.result, d.summary, stage / "run")
            page = build_diagnose_page(d, out_dir / "run")
            page.write(stage / "report.html")
    finally:
        ex.close()
    if as_json:
        print(json.dumps(d.payload, indent=2))
        err_console.print(f"wrote {out_dir / 'report.html'}", markup=False, highlight=False)
        return
    console.print("Verdict:", markup=False, highlight=False)
    for s in d.verdict:
        console.print(f"- {s}", markup=False, highlight=False)
    console.print("Cause:", markup=False, highlight=False)
    for s in d.sentences:
        console.print(f"- {s}", markup=False, highlight=False)
    names = [t for t in d.payload["slo"]]
    console.print("candidates (each a full simulation of every request): meeting every SLO first (fewest GPUs "
                  "added), then by p99 TTFT gained:", markup=False, highlight=False)
    for c in d.candidates:
        meets = " ".join(f"{n}:{'yes' if c.meets.get(n) else 'no'}" for n in names)
        if c.error:
            console.print(f"  {c.name:<20} cannot run: {c.error}", markup=False, highlight=False)
            continue
        console.print(f"  {c.name:<20} +{c.gpus_added} GPU ({c.gpus} in all)  p99 TTFT {c.p99_ttft_ms or 0:>10,.1f} ms "
                      f"(gain {c.ttft_gain_ms or 0:+,.1f}), p99 TPOT {c.p99_tpot_ms or 0:,.1f} ms "
                      f"({c.tpot_cost_ms or 0:+.1f}), {c.failed:,} failed  {meets}  [{c.change}]",
                      markup=False, highlight=False)
    console.print(f"wrote {out_dir / 'report.html'}")


def register(app: typer.Typer) -> None:
    app.command("compare")(compare)
    app.command("report")(report)
    app.command("diagnose")(diagnose)
