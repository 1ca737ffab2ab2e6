"""``simsrv compare``: one workload, one seed, several policies, one report.

Why: the same requests through each policy (common random numbers) isolate the policy's
effect; every run keeps its own run directory, and the report is built from those
directories exactly as ``simsrv report`` would.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from sim.files.atomic import replacing_dir, write_text
from sim.errors import UserError
from sim.output import not_report_files, write_run
from sim.policies import get_policy, policy_names
from sim.policies.budget import REFUSED
from sim.reporting.compare_page import build_compare_page
from sim.reporting.metrics_table import best_by_metric
from sim.reporting.rundata import load_run
from sim.run import run_scenario
from sim.scenario import load_scenario
from sim.metrics.summary import summarize


def parse_policies(text: str) -> list[str]:
    policies = [p.strip() for p in text.split(",") if p.strip()]
    names = policy_names()
    bad = [p for p in policies if p not in names]
    if bad or not policies:
        raise UserError(f"--policies: unknown policy {', '.join(bad) or '(none)'}; choose from {', '.join(names)}")
    if len(set(policies)) != len(policies):
        raise UserError("--policies: a policy is listed twice")
    return policies


def usable_policies(scenario_path: Path, chunk: int | None, sets: list[str]) -> tuple[list[str], list[str]]:
    """The default policy list: every registered policy, except a disaggregated (pools) policy
    when the scenario has no ``disaggregation`` section and its deployment has no disaggregated
    form (data- or pipeline-parallel layouts), and a policy other than the scenario's whose
    token budget vLLM would refuse (a chunked scenario's budget below max_model_len, for the
    policies without chunked prefill: sim/policies/budget.py); one line per policy left out,
    naming why. A policy the scenario does configure and that fails otherwise is an error, as
    with ``--policies``."""
    base = load_scenario(scenario_path, sets)
    configured = base.disaggregation is not None
    usable, skipped = [], []
    for policy in policy_names():
        try:
            policy_scenarios(scenario_path, [policy], chunk, sets)
        except UserError as e:
            budget_refused = REFUSED in str(e) and policy != base.engine.policy
            if (configured or not get_policy(policy).pools) and not budget_refused:
                raise
            skipped.append(f"{e}")
            continue
        usable.append(policy)
    return usable, skipped


def policy_scenarios(scenario_path: Path, policies: list[str], chunk: int | None, sets: list[str]) -> list:
    """Every policy's scenario, loaded and its deployment built, before any run: a key, a chunk
    size or a deployment that one policy cannot use fails here, not after the other runs."""
    scenarios = []
    for policy in policies:
        overrides = [*sets, f"engine.policy={policy}"]
        if get_policy(policy).chunk_is_budget and chunk is not None:
            overrides.append(f"engine.max_num_batched_tokens={chunk}")
        try:
            s = load_scenario(scenario_path, overrides)
            check_deployment(s)
        except UserError as e:
            raise UserError(f"policy {policy}: {e}") from None
        scenarios.append(s)
    return scenarios


def check_deployment(s) -> None:
    """Build the deployment(s) a run of ``s`` would use (the model must fit, TP must divide...)."""
    from sim.engine.deployment import build_deployment
    from sim.scenario import Disaggregation

    if get_policy(s.engine.policy).pools:
        d = s.disaggregation or Disaggregation()
        build_deployment(s, d.prefill.gpu, d.prefill.tensor_parallel_size, "disaggregation.prefill")
        build_deployment(s, d.decode.gpu, d.decode.tensor_parallel_size, "disaggregation.decode")
    else:
        build_deployment(s)


def run_compare(scenario_path: Path, policies: list[str], chunk: int | None, sets: list[str], out_dir: Path,
                on_run: Callable[[str, dict], None] | None = None, force: bool = False) -> Path:
    """Run each policy, write ``out_dir/<policy>/`` run directories and ``out_dir/report.html``;
    ``out_dir`` is replaced whole (sim.files.atomic.replacing_dir)."""
    from sim.engine.deployment import shared_cost_models

    scenarios = policy_scenarios(scenario_path, policies, chunk, sets)
    # the whole output directory (runs and report) is replaced in one step, or not at all
    with replacing_dir(out_dir, force, not_report_files) as stage:
        labels = []
        with shared_cost_models():  # the policies run on the same cost model
            for policy, s in zip(policies, scenarios):
                result = run_scenario(s)
                summary = summarize(result)
                label = policy + (f" {s.engine.max_num_batched_tokens}" if get_policy(policy).chunk_is_budget else "")
                write_run(result, summary, stage / policy)
                labels.append(label)
                if on_run is not None:
                    on_run(label, summary)
        runs = [load_run(stage / p, label) for p, label in zip(policies, labels)]
        name = runs[0].scenario.get("name", scenario_path.stem)
        page = build_compare_page(runs, f"simsrv compare: {name}")
        page.write(stage / "report.html")
        write_text(stage / "compare.json", json.dumps(compare_json(runs, policies), indent=2, allow_nan=False) + "\n")
    return out_dir / "report.html"


def compare_json(runs: list, policies: list[str]) -> dict:
    """compare.json: each run's policy, GPUs, completed and failed counts and every key of its
    result.json; ``best``: metric -> policy where the page marks one best (the same rule)."""
    out = []
    for policy, r in zip(policies, runs):
        s = r.summary  # result.json as written (JSON-safe)
        out.append({"policy": policy, "gpus": s.get("simsrv_num_gpus"), "completed": s.get("completed"),
                    "failed": s.get("failed"), **s})
    return {"runs": out, "best": best_by_metric(runs, policies)}
