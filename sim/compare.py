"""``simsrv compare``: one workload, one seed, several policies, one report.

Why: the same requests through each policy (common random numbers) isolate the policy's
effect; every run keeps its own run directory, and the report is built from those
directories exactly as ``simsrv report`` would.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sim.errors import UserError
from sim.output import write_run
from sim.policies import policy_names
from sim.reporting.compare_page import build_compare_page
from sim.reporting.rundata import load_run
from sim.run import run_scenario
from sim.scenario import load_scenario
from sim.summary import summarize


def parse_policies(text: str) -> list[str]:
    policies = [p.strip() for p in text.split(",") if p.strip()]
    names = policy_names()
    bad = [p for p in policies if p not in names]
    if bad or not policies:
        raise UserError(f"--policies: unknown policy {', '.join(bad) or '(none)'}; choose from {', '.join(names)}")
    if len(set(policies)) != len(policies):
        raise UserError("--policies: a policy is listed twice")
    return policies


def run_compare(scenario_path: Path, policies: list[str], chunk: int | None, sets: list[str], out_dir: Path,
                on_run: Callable[[str, dict], None] | None = None) -> Path:
    """Run each policy, write ``out_dir/<policy>/`` run directories and ``out_dir/report.html``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    labels = []
    for policy in policies:
        overrides = [*sets, f"engine.policy={policy}"]
        if policy == "chunked" and chunk is not None:
            overrides.append(f"engine.max_num_batched_tokens={chunk}")
        s = load_scenario(scenario_path, overrides)
        result = run_scenario(s)
        summary = summarize(result)
        label = policy + (f" {s.engine.max_num_batched_tokens}" if policy == "chunked" else "")
        write_run(result, summary, out_dir / policy)
        labels.append(label)
        if on_run is not None:
            on_run(label, summary)
    runs = [load_run(out_dir / p, label) for p, label in zip(policies, labels)]
    name = runs[0].scenario.get("name", scenario_path.stem)
    page = build_compare_page(runs, f"simsrv compare: {name}")
    report = out_dir / "report.html"
    page.write(report)
    return report
