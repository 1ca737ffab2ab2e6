"""``simsrv validate`` (typer command): published measurements against the simulator."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from sim.cli.consoles import LazyConsole

console = LazyConsole()
err_console = LazyConsole(stderr=True)


def validate(
    case: Optional[str] = typer.Option(None, "--case", help="One case (e.g. VC-03), a row id or a row-id prefix."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly the documented JSON document."),
    html: Optional[Path] = typer.Option(None, "--html", help="Also write the validation page to this HTML file."),
    directory: Optional[Path] = typer.Option(None, "--dir", help="Case files (default: the repository's validation/)."),
):
    """Simulate each published measurement in validation/ and print measured vs simulated."""
    from sim.reporting.validate_page import build_validate_page, rows_table, summary_lines
    from sim.analysis.validate import run_validation, to_json

    show = err_console.is_terminal and not as_json
    rows = run_validation(case, directory,
                          progress=(lambda i, n, rid: err_console.print(f"[{i}/{n}] {rid}", highlight=False))
                          if show else None)
    if html is not None:
        build_validate_page(rows).write(html)
    if as_json:
        print(json.dumps(to_json(rows), indent=2))
        return
    from rich.table import Table

    header, body = rows_table(rows)
    t = Table(title="simsrv validate: measured vs simulated (err = simulated / measured - 1)")
    for h in header:
        t.add_column(h, justify="left" if h in ("row", "level", "role", "metric") else "right")
    for b in body:
        t.add_row(*b)
    console.print(t)
    for line in summary_lines(rows):
        console.print(line, highlight=False)
    for r in rows:
        if r.simulated is None:
            console.print(f"not reproduced: {r.id}: {r.reason}", highlight=False)
    if html is not None:
        console.print(f"wrote {html}")
