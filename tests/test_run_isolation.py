"""A run's outputs do not depend on what ran before it in the same process.

``simsrv compare``, sweeps and capacity searches run many simulations in one process, sharing
cost models (sim/engine/deployment.py ``shared_cost_models``) and whatever else a module keeps.
Whatever survives from one run to the next must be a pure function of its key: here run B,
after run A in the same process (with and without shared cost models), writes byte for byte
what B writes in a fresh process. (Before, the GEMMs' extrapolation flag of a token count was
kept in a set apart from the GEMM memo, so a warm memo did not set it:
``compare scenarios/deepseek_v3_dp8_ep.yaml --policies static,continuous`` reported 4,893
extrapolated steps for continuous, 4,541 alone.)
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim.metrics.summary import summarize
from sim.engine.deployment import shared_cost_models
from sim.output import write_run
from sim.run import run_scenario
from sim.scenario import load_scenario
from tests.conftest import ROOT, without_wall_clock

# scenario, overrides of both runs, then A's and B's own
CASES = {
    "dp8 ep: static, then continuous": (
        # max_model_len at the scenario's 4,096-token budget: legal without chunked prefill
        "deepseek_v3_dp8_ep.yaml", ["workload.synthetic.num_requests=60", "engine.max_model_len=4096"],
        ["engine.policy=static"], ["engine.policy=continuous"]),
    "dp8 ep: longer prompts, then the scenario": (
        "deepseek_v3_dp8_ep.yaml", ["workload.synthetic.num_requests=60"],
        ["workload.synthetic.input_tokens.mean=3000", "workload.synthetic.request_rate=30"], []),
    "disaggregated: long prompts, then the scenario": (
        "disaggregated.yaml", ["workload.synthetic.num_requests=150"],
        ["workload.synthetic.input_tokens.value=3000"], []),
    "chat: chunked, then continuous": (
        "chat.yaml", ["workload.trace.sample=300"],
        ["engine.policy=chunked", "engine.max_num_batched_tokens=512"], []),
    "long context, swap: itself twice": (
        "long_context.yaml", ["workload.synthetic.num_requests=60", "engine.preemption_mode=swap"], [], []),
    "pipeline: recompute, then the scenario": (
        "pipeline_405b.yaml", ["workload.synthetic.num_requests=60"], ["workload.synthetic.request_rate=20"], []),
    "routing: cache-aware, then random": (
        "routing.yaml", ["workload.synthetic.prefix_groups.num_groups=8"], [], ["cluster.router=random"]),
    "prefix cache on, then off": (
        "prefix_cache.yaml", ["workload.synthetic.num_requests=150"], ["engine.enable_prefix_caching=true"], []),
}


def _outputs(out: Path) -> dict[str, object]:
    return {"result": without_wall_clock(json.loads((out / "result.json").read_text())),
            "requests": (out / "requests.parquet").read_bytes(), "steps": (out / "steps.parquet").read_bytes()}


def _fresh(scenario: str, sets: list[str], out: Path) -> dict[str, object]:
    """B run by ``simsrv run`` in a process of its own."""
    argv = [sys.executable, "-m", "sim", "run", str(ROOT / "scenarios" / scenario), "--out", str(out), "-q"]
    for s in sets:
        argv += ["--set", s]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return _outputs(out)


def _in_process(scenario: str, sets: list[str], out: Path) -> dict[str, object]:
    s = load_scenario(ROOT / "scenarios" / scenario, sets)
    result = run_scenario(s)
    write_run(result, summarize(result), out)
    return _outputs(out)


@pytest.mark.parametrize("shared", [True, False], ids=["shared cost models", "own cost models"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_run_after_another_in_one_process_writes_what_it_writes_alone(case, shared, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the scenarios' trace paths are relative to the working directory
    scenario, both, a_sets, b_sets = case
    alone = _fresh(scenario, both + b_sets, tmp_path / "alone")
    with shared_cost_models() if shared else contextlib.nullcontext():
        _in_process(scenario, both + a_sets, tmp_path / "a")
        after = _in_process(scenario, both + b_sets, tmp_path / "b")
    for name in alone:
        assert after[name] == alone[name], name


def _dp_ep_cost():
    from sim.engine.deployment import build_deployment
    return build_deployment(load_scenario(ROOT / "scenarios" / "deepseek_v3_dp8_ep.yaml")).cost


def test_a_dp_group_rank_cost_does_not_depend_on_the_groups_costed_before():
    """A rank's step under one group load (tokens of all ranks, padding) notes an extrapolated
    GEMM exactly when it does costed first: the flag is memoised per group with the seconds,
    not shared across the group's memos (a 2,048-token chunk's expert GEMMs leave the measured
    table only when the group carries 64 x as many tokens)."""
    from sim.core.batch import Batch

    calls = []
    for tokens in (1, 8, 64, 512, 2048, 4096):
        for group in (tokens, 8 * tokens, 64 * tokens):
            for pad in (0, 2 * tokens):
                calls.append((Batch(0, 0, ((tokens, 0),), 1, 1), group, pad))
                calls.append((Batch(tokens, tokens * 900, (), tokens, 1), group, pad))
    forward, backward = _dp_ep_cost(), _dp_ep_cost()
    got = [forward.group_run_cost(b, g, p) for b, g, p in calls]
    cold = [backward.group_run_cost(b, g, p) for b, g, p in reversed(calls)][::-1]
    fresh = [_dp_ep_cost().group_run_cost(b, g, p) for b, g, p in calls[::7]]
    assert got == cold
    assert got[::7] == fresh
