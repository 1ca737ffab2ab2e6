"""The ``simsrv`` command line (ARCHITECTURE.md section 4): the Typer application. Only ``sim.cli``
imports typer and rich.

Start-up: importing the command line loads typer and the policy registry only; rich is
imported when something is printed (``sim.cli.consoles``) and each command imports what it
needs when it runs (tests/test_startup.py). The entry point ``main`` (``sim.cli.entry``)
runs the plain forms of ``simsrv run`` without importing this module or typer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from sim.cli.consoles import RAY_INSTALL_HELP, out_console
from sim.cli.entry import _verbose, main, print_version  # noqa: F401 - main: the entry point, re-exported
from sim.cli.run_cmd import run_command
from sim.errors import UserError
from sim.policies import policy_names

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Discrete-event simulator of an LLM inference cluster.\n\n"
                  f"sweep, capacity and diagnose run on a Ray cluster with --executor ray: {RAY_INSTALL_HELP}")


def _version(value: bool) -> None:
    if value:
        print_version()
        raise typer.Exit()


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks on errors."),
          _v: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                  help="Print simsrv's version and exit.")):
    _verbose["on"] = verbose


@app.command()
def run(
    scenario: Path = typer.Argument(..., help="Scenario YAML file."),
    policy: Optional[str] = typer.Option(None, "--policy", help=" | ".join(policy_names())),
    chunk: Optional[int] = typer.Option(None, "--chunk", help="Policy chunked with this max_num_batched_tokens."),
    set_: List[str] = typer.Option([], "--set", help="Override a scenario key: dotted.key=value (repeatable)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory (default reports/runs/NAME-POLICY)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing but errors and warnings."),
    force: bool = typer.Option(False, "--force", help="Replace the run directory, whole, if it already exists."),
):
    """Simulate one scenario; print a summary table and write the run directory."""
    run_command(scenario, policy, chunk, set_, out, quiet, force)


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
    from sim.analysis.explain import offload_lines, placement_lines, scheduling_lines

    for line in [*placement_lines(dep), *offload_lines(dep), *scheduling_lines(s)]:
        out_console.print(line, markup=False, highlight=False)
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

from sim.cli.fit import fit  # noqa: E402

app.command("fit")(fit)
from sim.cli.serve import serve  # noqa: E402

app.command("serve")(serve)

from sim.cli.report import register as register_reports  # noqa: E402

register_reports(app)
