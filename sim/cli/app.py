"""The ``simsrv`` command line (DESIGN.md section 4). Only this module imports typer and rich.

Start-up: importing the command line loads typer, rich's console and the policy registry only;
each command imports what it needs when it runs (tests/test_startup.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from sim.errors import SimulationStalled, UserError
from sim.policies import policy_names

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Discrete-event simulator of an LLM inference cluster.")
out_console = Console()
err_console = Console(stderr=True)
_verbose = {"on": False}


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("simsrv")
        except PackageNotFoundError:  # run from a source tree that was never installed
            v = "unknown (not installed)"
        out_console.print(f"simsrv {v}", markup=False, highlight=False)
        raise typer.Exit()


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks on errors."),
          _v: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                  help="Print simsrv's version and exit.")):
    _verbose["on"] = verbose


def _overrides(policy: Optional[str], chunk: Optional[int], sets: List[str]) -> list[str]:
    out = list(sets or [])
    if chunk is not None:
        out += ["engine.policy=chunked", f"engine.max_num_batched_tokens={chunk}"]
        if policy not in (None, "chunked"):
            raise UserError(f"--chunk {chunk} means --policy chunked, but --policy {policy} was given")
    elif policy is not None:
        out.append(f"engine.policy={policy}")
    return out


def _dp(summary: dict) -> str:
    dp = summary.get("simsrv_data_parallel_size", 1)
    return f", DP {dp} + EP" if dp > 1 else ""


def _summary_table(summary: dict):
    from rich.table import Table

    t = Table(title=f"simsrv {summary['model_id']} on {summary['simsrv_gpu']} x{summary['simsrv_replicas']}"
                    f" (TP {summary['simsrv_tensor_parallel_size']}{_dp(summary)}), policy {summary['simsrv_policy']}")
    t.add_column("metric (ms)")
    for c in ("mean", "p50", "p90", "p99"):
        t.add_column(c, justify="right")
    for label, key in (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"), ("E2E latency", "e2el")):
        t.add_row(label, *(_fmt(summary[f"{c}_{key}_ms"]) for c in ("mean", "p50", "p90", "p99")))
    t.add_row("queue time", *(_fmt(summary[f"simsrv_{c}_queue_time_ms"]) for c in ("mean", "p50", "p90", "p99")))
    return t


def _fmt(v) -> str:
    return "-" if v is None else f"{v:,.1f}"


def _run_progress(total: int):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    progress = Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                        console=err_console, transient=True, disable=not err_console.is_terminal)
    task = progress.add_task("run", total=total)
    return progress, (lambda done, _total: progress.update(task, completed=done))


@app.command()
def run(
    scenario: Path = typer.Argument(..., help="Scenario YAML file."),
    policy: Optional[str] = typer.Option(None, "--policy", help=" | ".join(policy_names())),
    chunk: Optional[int] = typer.Option(None, "--chunk", help="Policy chunked with this max_num_batched_tokens."),
    set_: List[str] = typer.Option([], "--set", help="Override a scenario key: dotted.key=value (repeatable)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory (default reports/runs/NAME-POLICY)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing but errors and warnings."),
    force: bool = typer.Option(False, "--force", help="Overwrite the run directory if it already exists."),
):
    """Simulate one scenario; print a summary table and write the run directory."""
    from sim.output import check_new_run_dir, write_run
    from sim.run import run_scenario
    from sim.scenario import load_scenario
    from sim.analysis.summary import summarize
    from sim.workload import build_workload
    from sim.workload.build import should_stream

    s = load_scenario(scenario, _overrides(policy, chunk, set_))
    tag = s.engine.policy + (f"{s.engine.max_num_batched_tokens}" if s.engine.policy == "chunked" else "")
    out = out or Path("reports/runs") / f"{s.dir_name}-{tag}"
    check_new_run_dir(out, force)
    if should_stream(s):  # a large trace is fed to the simulation chunk by chunk
        with err_console.status("simulating (streaming the trace)"):
            result = run_scenario(s)
    else:
        arrays = build_workload(s)
        progress, cb = _run_progress(len(arrays))
        with progress:
            result = run_scenario(s, progress=cb, workload=arrays)
    summary = summarize(result)
    out_dir = write_run(result, summary, out)
    print_warnings(summary)
    if quiet:
        return
    out_console.print(_summary_table(summary))
    out_console.print(
        f"completed {summary['completed']:,} / {summary['num_prompts']:,} (failed {summary['failed']:,})  "
        f"duration {summary['duration']:,.1f} s  throughput {summary['request_throughput']:.2f} req/s, "
        f"{summary['output_throughput']:,.0f} output tok/s, {summary['total_token_throughput']:,.0f} tok/s"
    )
    good = summary["request_goodput"]
    out_console.print(
        f"preemptions {summary['simsrv_num_preemptions']:,}  peak KV use {summary['simsrv_peak_kv_usage']:.0%}"
        + (f"  goodput {good:.2f} req/s" if good is not None else "")
        + f"  (simulated in {summary['simsrv_wall_s']:.1f} s wall)"
    )
    for reason, n in summary["simsrv_failed_reasons"].items():
        out_console.print(f"failed: {n:,} x {reason}", markup=False, highlight=False)
    out_console.print(f"wrote {out_dir}/")


def print_warnings(summary: dict) -> None:
    """The run's warnings (result.json simsrv_warnings), one line each on stderr."""
    for w in summary.get("simsrv_warnings", []):
        err_console.print(f"warning: {w}", markup=False, highlight=False, soft_wrap=True)


@app.command()
def explain(
    scenario: Path = typer.Argument(..., help="Scenario YAML file."),
    context: int = typer.Option(2048, "--context", help="Context length N (tokens)."),
    batch: int = typer.Option(1, "--batch", help="Decode batch size B."),
    set_: List[str] = typer.Option([], "--set", help="Override a scenario key: dotted.key=value."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly the documented keys as JSON."),
):
    """Roofline and memory arithmetic of the deployment, per GPU."""
    from sim.engine.deployment import build_deployment
    from sim.analysis.explain import explain as explain_fn
    from sim.scenario import load_scenario

    if context < 1 or batch < 1:
        raise UserError("--context and --batch must be >= 1")
    s = load_scenario(scenario, set_)
    dep = build_deployment(s)
    figures = explain_fn(dep, context, batch)
    if as_json:
        print(json.dumps(figures, indent=2))
        return
    from rich.table import Table

    t = Table(title=f"{s.name}: context {context}, batch {batch}")
    t.add_column("figure")
    t.add_column("value", justify="right")
    for k, v in figures.items():
        t.add_row(k, f"{v:,.3f}" if isinstance(v, float) else f"{v:,}")
    out_console.print(t)
    from sim.cost.calibration import describe

    out_console.print(f"cost model: {describe(dep.cost.calibration, dep.cost.carried_from)}")


from sim.cli.kernels import calibrate, profile  # noqa: E402

app.command("calibrate")(calibrate)
app.command("profile")(profile)

from sim.cli.trace import trace_app  # noqa: E402

app.add_typer(trace_app, name="trace")

from sim.cli.sweep import capacity, sweep  # noqa: E402

app.command("sweep")(sweep)
app.command("capacity")(capacity)

from sim.cli.validate import validate  # noqa: E402

app.command("validate")(validate)

from sim.cli.report import register as register_reports  # noqa: E402

register_reports(app)


def main(argv: list[str] | None = None) -> None:
    """The ``simsrv`` entry point; ``argv`` (default ``sys.argv[1:]``) lets tests call it in-process."""
    try:
        rc = app(args=argv, standalone_mode=False)
    except UserError as e:
        _fail(str(e))
    except SimulationStalled as e:  # a model defect, not bad input: one line, exit status 1
        _fail(str(e), status=1)
    except KeyboardInterrupt:
        _interrupted()
    except SystemExit:
        raise
    except OSError as e:  # an output path that cannot be written, a directory given as a file...
        _fail(f"{e.filename or ''}: {e.strerror or e}".lstrip(": "))
    except Exception as e:
        # command-line usage errors (typer's click): unknown option or command, bad value
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):
            if type(e).__name__ == "Abort":
                sys.exit(1)
            _fail(e.format_message())
        raise
    # typer turns Ctrl-C inside a command into exit code 130, returned (not raised) without
    # standalone mode; any other code a command returns is passed on as the exit status
    if rc == 130:
        _interrupted()
    if isinstance(rc, int) and rc:
        sys.exit(rc)


def _interrupted() -> None:
    """Ctrl-C: one line, exit status 130 (128 + SIGINT), as a shell reports an interrupted command."""
    err_console.print("error: interrupted", markup=False, highlight=False)
    sys.exit(130)


def _fail(message: str, status: int = 2) -> None:
    """One line on stderr, exit status 2; the traceback only with --verbose."""
    if _verbose["on"]:
        raise
    err_console.print(f"error: {message}", markup=False, highlight=False, emoji=False, soft_wrap=True)
    sys.exit(status)
