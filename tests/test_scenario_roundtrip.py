"""A run's ``scenario.resolved.yaml`` runs again to the same outputs (issue 38).

Property: for a scenario S (with its --set overrides), run(resolved(S)) writes byte-identical
requests.parquet and steps.parquet and the same result.json (less the wall-clock keys) as
run(S), and resolved(resolved(S)) is resolved(S) textually. Checked on every shipped scenario
(made small with --set) and on seeded random valid scenarios. Also: the schema is strict (a
value of the wrong type is one error line naming the key and the value, exit 2).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, without_wall_clock
from tests.inproc_cli import simsrv

SCENARIOS = sorted(p for p in (ROOT / "scenarios").glob("*.yaml") if p.name != "grid_example.yaml")

# --set overrides that keep each shipped scenario's run short (the property is checked on the
# overridden scenario's resolved file)
SMALL = {
    "chat.yaml": ["workload.trace.sample=40"],
    "routing.yaml": ["workload.synthetic.prefix_groups.num_groups=4",
                     "workload.synthetic.prefix_groups.prompts_per_group=8"],
    "deepseek_v3_dp8_ep.yaml": ["workload.synthetic.num_requests=16"],
    "trace_azure_code_2023.yaml": ["workload.trace.sample=40"],
    "trace_mooncake.yaml": ["workload.trace.sample=40"],
    "trace_vidur.yaml": ["workload.trace.sample=40"],
}


def _small_sets(path: Path) -> list[str]:
    if path.name in SMALL:
        return SMALL[path.name]
    raw = yaml.safe_load(path.read_text())
    return ["workload.synthetic.num_requests=40"] if "synthetic" in raw["workload"] else []


def _run(scenario: Path, out: Path, sets: list[str] = ()) -> dict:
    args = [a for s in sets for a in ("--set", s)]
    o = simsrv("run", scenario, *args, "-q", "--out", out)
    assert o.code == 0, (scenario, sets, o.stderr[-3000:])
    return {"requests": (out / "requests.parquet").read_bytes(), "steps": (out / "steps.parquet").read_bytes(),
            "result": without_wall_clock(json.loads((out / "result.json").read_text())),
            "resolved": (out / "scenario.resolved.yaml").read_text()}


def _assert_round_trip(scenario: Path, sets: list[str], tmp_path: Path) -> None:
    first = _run(scenario, tmp_path / "first", sets)
    again = _run(tmp_path / "first" / "scenario.resolved.yaml", tmp_path / "again")
    assert again["result"] == first["result"]
    assert again["requests"] == first["requests"], "requests.parquet differs"
    assert again["steps"] == first["steps"], "steps.parquet differs"
    assert again["resolved"] == first["resolved"], "resolved(resolved(S)) != resolved(S)"


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_a_shipped_scenarios_resolved_file_runs_the_same(path, tmp_path):
    _assert_round_trip(path, _small_sets(path), tmp_path)


# --- seeded random valid scenarios -------------------------------------------------------------

MODELS = ["llama-3-8b", "qwen2.5-7b", "llama-3.2-1b", "mistral-7b-v0.1-window", "qwen3-30b-a3b"]
GPUS = ["h100-sxm", "a100-80g", "h200", "h100-pcie"]
TRACES = ["traces/samples/azure_code_2023_first500.csv", "traces/samples/mooncake_synthetic_first500.jsonl",
          "traces/samples/vidur_splitwise_conv_first500.csv"]


def _lengths(rng: random.Random, mean: int) -> dict:
    kind = rng.choice(["fixed", "uniform", "lognormal", "mixture"])
    if kind == "fixed":
        return {"dist": "fixed", "value": mean}
    if kind == "uniform":
        return {"dist": "uniform", "min": max(1, mean // 4), "max": mean * 2}
    if kind == "lognormal":
        return {"dist": "lognormal", "mean": mean, "sigma": round(rng.uniform(0.2, 1.2), 2), "max": mean * 4}
    return {"dist": "mixture", "components": [{"dist": "fixed", "value": mean // 2, "weight": 2},
                                              {"dist": "lognormal", "mean": mean, "sigma": 0.5, "weight": 1}]}


def _synthetic(rng: random.Random) -> dict:
    w: dict = {"request_rate": rng.choice([2, 10.5, 50, ".inf"]), "burstiness": rng.choice([0.5, 1, 2]),
               "input_tokens": _lengths(rng, rng.choice([200, 900])), "output_tokens": _lengths(rng, 60)}
    if w["request_rate"] == ".inf":
        w["request_rate"] = float("inf")
        w["max_concurrency"] = rng.choice([4, 16])
    shape = rng.choice(["plain", "shared_prefix", "prefix_groups", "multi_turn", "rate_profile"])
    if shape == "prefix_groups":  # num_requests left unset: the groups make the count
        w["prefix_groups"] = {"num_groups": rng.randint(2, 5), "prompts_per_group": rng.randint(3, 8),
                              "system_prompt_tokens": rng.choice([256, 1000]), "question_tokens": 64}
        return w
    w["num_requests"] = rng.randint(20, 45)
    if shape == "shared_prefix":
        w.update(shared_prefix_tokens=rng.choice([100, 512]), num_prefixes=rng.randint(1, 4))
    elif shape == "multi_turn":
        w["multi_turn"] = {"turns": {"dist": "uniform", "min": 1, "max": 4}, "think_time_s": rng.choice([0, 2.5])}
    elif shape == "rate_profile" and "max_concurrency" not in w:
        w["rate_profile"] = rng.choice([{"shape": "piecewise", "segments": [[2, 5], [3, 20]]},
                                        {"shape": "diurnal", "min_rate": 1, "max_rate": 30, "period_s": 20}])
    return w


def _trace(rng: random.Random) -> dict:
    t: dict = {"path": rng.choice(TRACES), "sample": rng.randint(15, 40)}
    if rng.random() < 0.5:
        t["time_scale"] = rng.choice([0.25, 2])
    else:
        t["target_rate"] = rng.choice([3, 12.5])
    return t


def _hardware(rng: random.Random) -> dict:
    kind = rng.choice(["catalogue", "catalogue", "custom", "custom_full"])
    if kind == "catalogue":
        hw: dict = {"gpu": rng.choice(GPUS)}
    elif kind == "custom":
        hw = {"custom": {"based_on": rng.choice(GPUS), "name": "fuzzed", "memory_bytes": 96 * 2**30}}
    else:
        hw = {"custom": {"bf16_flops_per_s": 5e14, "hbm_bw_bytes_per_s": 2.5e12, "memory_bytes": 128 * 2**30,
                         "nvlink_bw_bytes_per_s": 3e11}}
    if rng.random() < 0.3:
        hw.update(flops_factor=0.8, bandwidth_factor=0.9)
    if rng.random() < 0.3:
        hw["cost_model"] = "roofline"
    return hw


def fuzzed_scenario(seed: int) -> dict:
    """A valid scenario drawn from ``seed``: policies, budgets, replicas, TP, models, GPUs
    (inline ones too), workloads of every kind, disaggregation with and without its section."""
    rng = random.Random(seed)
    policy = rng.choice(["static", "continuous", "continuous", "chunked", "chunked", "disaggregated", "disaggregated"])
    engine: dict = {"policy": policy, "max_num_seqs": rng.choice([16, 64, 256]),
                    "enable_prefix_caching": rng.random() < 0.6, "block_size": rng.choice([16, 32])}
    if policy == "chunked" or rng.random() < 0.3:  # continuous without a budget: vLLM's default
        engine["max_num_batched_tokens"] = rng.choice([256, 512, 2048])
        engine["max_num_seqs"] = min(engine["max_num_seqs"], engine["max_num_batched_tokens"])
    if rng.random() < 0.3:
        engine["max_model_len"] = 4096
    if policy != "chunked" and "max_num_batched_tokens" in engine:
        # vLLM's start-up rule without chunked prefill: the budget holds a whole max_model_len
        engine["max_model_len"] = engine["max_num_batched_tokens"]
    raw: dict = {"name": f"fuzz{seed}", "seed": rng.randint(0, 1000), "model": rng.choice(MODELS),
                 "hardware": _hardware(rng), "engine": engine,
                 "cluster": {"replicas": rng.randint(1, 3), "tensor_parallel_size": rng.choice([1, 1, 2]),
                             "router": rng.choice(["round_robin", "least_outstanding", "least_kv",
                                                   "prefix_affinity", "cache_aware"])},
                 "workload": {"synthetic": _synthetic(rng)} if rng.random() < 0.7 else {"trace": _trace(rng)}}
    if policy == "disaggregated" and rng.random() < 0.5:
        raw["disaggregation"] = {"prefill": {"replicas": rng.randint(1, 2)},
                                 "decode": {"replicas": 1, "tensor_parallel_size": rng.choice([1, 2])},
                                 "kv_transfer": {"bandwidth_gb_per_s": 25, "layerwise": rng.random() < 0.5}}
    if rng.random() < 0.5:
        raw["slo"] = {"ttft_ms": 300, "tpot_ms": 40}
    return raw


@pytest.mark.parametrize("seed", range(20))
def test_a_fuzzed_scenarios_resolved_file_runs_the_same(seed, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(fuzzed_scenario(seed), sort_keys=False))
    _assert_round_trip(path, [], tmp_path)


# --- the bugs of issue 38 by name ----------------------------------------------------------------

def test_a_custom_gpus_resolved_file_has_no_catalogue_gpu(tmp_path):
    """``hardware.custom`` was written beside the default ``gpu: h100-sxm``, which the
    scenario then refused ('give hardware.gpu or hardware.custom, not both')."""
    from sim.scenario import load_scenario

    custom = "hardware={custom: {based_on: a100-80g, name: mine, memory_bytes: 68719476736}}"
    s = load_scenario(ROOT / "scenarios" / "batching.yaml", [custom])
    assert "gpu" not in s.resolved()["hardware"]
    p = tmp_path / "r.yaml"
    p.write_text(s.to_yaml())
    assert load_scenario(p).hardware.custom == s.hardware.custom


def test_prefix_groups_resolve_to_the_requests_they_make():
    from sim.scenario import load_scenario

    s = load_scenario(ROOT / "scenarios" / "routing.yaml")
    assert s.resolved()["workload"]["synthetic"]["num_requests"] == 64 * 16


def test_an_unset_continuous_budget_resolves_to_the_one_the_run_uses():
    """Under continuous an unset max_num_batched_tokens is vLLM's max(max_model_len, 2048);
    the resolved file wrote 8192 as set, which limits prompts to 8192 tokens."""
    from sim.scenario import scenario_from_dict
    from tests.conftest import small_scenario

    s = scenario_from_dict(small_scenario(model="qwen2.5-7b", engine={"policy": "continuous"}))
    e = s.resolved()["engine"]
    assert (e["max_model_len"], e["max_num_batched_tokens"]) == (131072, 131072)  # qwen2.5-7b's context


# --- strict types -------------------------------------------------------------------------------

BAD = [
    ("engine.enable_prefix_caching=0", "engine.enable_prefix_caching: true or false is expected, not the number 0"),
    ("engine.enable_prefix_caching='yes'", "engine.enable_prefix_caching: true or false is expected, not the string"),
    ("engine.max_num_seqs='64'", "engine.max_num_seqs: an integer is expected, not the string '64'"),
    ("engine.max_num_seqs=64.5", "engine.max_num_seqs: an integer is expected, not the number 64.5"),
    ("workload.synthetic.request_rate='4'", "workload.synthetic.request_rate: a number is expected, not the string '4'"),
    ("name=2024", "name: a string is expected, not the number 2024"),
    ("hardware.gpu=7", "hardware.gpu: a string is expected, not the number 7"),
    ("engine.overhead.batch_range=[1, '8']", "engine.overhead.batch_range.1: an integer is expected, not the string"),
    ("cluster.enable_expert_parallel=1", "cluster.enable_expert_parallel: true or false is expected, not the number 1"),
    ("hardware.custom={memory_bytes: 85899345920.5, bf16_flops_per_s: 1.0e15, hbm_bw_bytes_per_s: 3.0e12}",
     "hardware.custom.memory_bytes: an integer is expected, not the number 85899345920.5"),
    ("hardware.custom={memory_bytes: 8e10, bf16_flops_per_s: '1e15', hbm_bw_bytes_per_s: 3.0e12}",
     "hardware.custom.bf16_flops_per_s: a number is expected, not the string '1e15'"),
    ("disaggregation.prefill.replicas='2'", "disaggregation.prefill.replicas: an integer is expected"),
]


@pytest.mark.parametrize("override, needle", BAD, ids=[b[0].split("=")[0] for b in BAD])
def test_a_value_of_the_wrong_type_is_one_error_naming_key_and_value(override, needle, tmp_path):
    o = simsrv("run", ROOT / "scenarios" / "batching.yaml", "--set", "workload.synthetic.num_requests=5",
               "--set", override, "-q", "--out", tmp_path / "o")
    assert o.code == 2 and o.clean, o.stderr[-2000:]
    assert needle in o.stderr, o.stderr


def test_the_same_values_are_refused_in_a_file_and_a_grid(tmp_path):
    text = (ROOT / "scenarios" / "batching.yaml").read_text().replace("max_num_seqs: 64", "max_num_seqs: '64'")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    o = simsrv("run", bad, "-q", "--out", tmp_path / "o")
    assert o.code == 2 and o.clean and "engine.max_num_seqs: an integer is expected, not the string '64'" in o.stderr
    grid = tmp_path / "grid.yaml"
    grid.write_text("engine.enable_prefix_caching: [true, 0]\n")
    o = simsrv("sweep", ROOT / "scenarios" / "batching.yaml", "--grid", grid, "--set",
               "workload.synthetic.num_requests=5", "--out", tmp_path / "sweep")
    assert o.code == 2 and o.clean, o.stderr[-2000:]
    assert "point 1" in o.stderr and "engine.enable_prefix_caching: true or false is expected, not the number 0" \
        in o.stderr


def test_well_typed_values_still_load(tmp_path):
    """Ints for floats, whole floats for ints (64.0, 8e10: the same in every model, written back as
    ints), .inf and the word inf for request_rate, lists for pairs, booleans for booleans; 1e15
    (YAML 1.2's float, PyYAML's string) is a float."""
    from sim.scenario import load_scenario

    from sim.scenario import scenario_from_dict
    from tests.conftest import small_scenario

    raw = small_scenario(engine={"policy": "chunked", "max_num_batched_tokens": 512, "enable_prefix_caching": False,
                                 "overhead": {"batch_range": [1, 64], "decode_step_ms": 1}})
    raw["workload"]["synthetic"].update(request_rate="inf", rate_profile=None)
    s = scenario_from_dict(raw)
    assert s.engine.overhead.batch_range == (1, 64) and s.engine.overhead.decode_step_ms == 1.0
    assert s.workload.synthetic.request_rate == float("inf")
    s = load_scenario(ROOT / "scenarios" / "batching.yaml", [
        "engine.max_num_seqs=64.0", "workload.synthetic.input_tokens={dist: uniform, min: 1.0, max: 2e3}",
        "engine.overhead.batch_range=[1.0, 8]", "hardware={custom: {memory_bytes: 8e10, bf16_flops_per_s: 1e15, "
        "hbm_bw_bytes_per_s: 3.0e12}}"])
    assert s.engine.max_num_seqs == 64 and type(s.engine.max_num_seqs) is int
    assert (s.workload.synthetic.input_tokens.min, s.workload.synthetic.input_tokens.max) == (1, 2000)
    assert s.engine.overhead.batch_range == (1, 8) and s.hardware.custom.memory_bytes == 80_000_000_000
    assert s.hardware.custom.bf16_flops_per_s == 1e15
    text = s.to_yaml()
    assert "max_num_seqs: 64\n" in text and "memory_bytes: 80000000000\n" in text


def test_diagnose_builds_its_scenarios_from_a_custom_gpus_scenario(tmp_path):
    """``diagnose --scenario`` with ``hardware.custom`` refused its own trace scenario ('give
    hardware.gpu or hardware.custom, not both'): it and its candidates now start from
    ``Scenario.resolved``."""
    from sim.analysis.diagnose import trace_scenario
    from sim.analysis.diagnose_fixes import with_sets

    p = tmp_path / "custom.yaml"
    p.write_text("model: llama-3-8b\nhardware: {custom: {based_on: a100-80g, name: mine, memory_bytes: 68719476736}}\n"
                 "workload: {synthetic: {num_requests: 20}}\n")
    s = trace_scenario(ROOT / "traces" / "samples" / "azure_code_2023_first500.csv", p, [])
    assert s.hardware.custom.name == "mine" and s.workload.trace is not None
    assert with_sets(s, ["cluster.replicas=2"]).cluster.replicas == 2
