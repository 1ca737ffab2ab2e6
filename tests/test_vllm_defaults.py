"""vLLM's names and defaults (issue 36 item 9).

- An unset ``engine.policy`` is chunked, as vLLM V1's OpenAI server runs chunked prefill.
- Unset ``max_num_batched_tokens`` / ``max_num_seqs`` follow vLLM 0.11.0's rule per GPU
  (vllm/engine/arg_utils.py ``EngineArgs._set_default_args``, UsageContext.OPENAI_API_SERVER):
  8192 / 1024 on a GPU of >= 70 GiB whose name has no "a100", else 2048 / 256; without chunked
  prefill the budget is max_model_len; an unset max_num_seqs is never above the budget. Each
  engine takes its own GPU's (a custom GPU, a disaggregated pool's), and the resolved scenario
  writes what the run used.
- ``engine.enable_chunked_prefill`` (vLLM's name) picks chunked or continuous, refused beside a
  policy that says otherwise.
- ``model:`` takes the Hugging Face id of a catalogue model, in any case; an unknown one is one
  line with the closest names.
- The help shows ``pip install 'simsrv[ray]'`` (rich markup swallowed ``[ray]``).
"""

from __future__ import annotations

import pytest
import yaml

from sim.errors import UserError
from sim.scenario import scenario_from_dict
from tests.conftest import small_scenario
from tests.inproc_cli import simsrv


def _scenario(hardware=None, engine=None, **over):
    raw = small_scenario(**over)
    raw["hardware"] = hardware or {"gpu": "h100-sxm"}
    raw["engine"] = engine or {}
    return scenario_from_dict(raw)


def _run_limits(s):
    """(max_num_batched_tokens, max_num_seqs) the replica is built with."""
    from sim.engine.deployment import build_deployment

    d = build_deployment(s)
    return d.limits.max_num_batched_tokens, d.limits.max_num_seqs


@pytest.mark.parametrize("gpu, budget, seqs", [("h100-sxm", 8192, 1024), ("h200", 8192, 1024),
                                               ("a100-80g", 2048, 256), ("l40s", 2048, 256),
                                               ("a100-40g", 2048, 256), ("mi300x", 8192, 1024)])
def test_unset_limits_are_vllms_defaults_for_the_gpu(gpu, budget, seqs):
    s = _scenario({"gpu": gpu})
    assert s.engine.policy == "chunked"
    assert (s.engine.max_num_batched_tokens, s.engine.max_num_seqs) == (budget, seqs)
    assert _run_limits(s) == (budget, seqs)
    assert not {"policy", "max_num_seqs", "max_num_batched_tokens"} & s.engine.model_fields_set
    e = s.resolved()["engine"]
    assert (e["policy"], e["max_num_batched_tokens"], e["max_num_seqs"]) == ("chunked", budget, seqs)


def test_a_custom_gpu_is_judged_by_its_memory_and_name():
    big = {"custom": {"based_on": "h100-sxm", "name": "mine", "memory_bytes": 96 * 2**30}}
    small = {"custom": {"based_on": "h100-sxm", "name": "mine", "memory_bytes": 64 * 2**30}}
    a100 = {"custom": {"based_on": "a100-80g", "memory_bytes": 96 * 2**30}}  # named "a100-80g (custom)"
    assert _run_limits(_scenario(big)) == (8192, 1024)
    assert _run_limits(_scenario(small)) == (2048, 256)
    assert _run_limits(_scenario(a100)) == (2048, 256)


def test_without_chunked_prefill_the_budget_is_max_model_len_and_bounds_max_num_seqs():
    s = _scenario(engine={"policy": "continuous", "max_model_len": 512})
    assert _run_limits(s) == (512, 512)
    e = s.resolved()["engine"]
    assert (e["max_num_batched_tokens"], e["max_num_seqs"]) == (512, 512)


def test_a_given_budget_bounds_the_unset_max_num_seqs_and_given_values_stay():
    assert _run_limits(_scenario(engine={"max_num_batched_tokens": 512})) == (512, 512)
    assert _run_limits(_scenario({"gpu": "a100-80g"}, {"max_num_seqs": 64, "max_num_batched_tokens": 4096})) \
        == (4096, 64)


def test_each_disaggregated_pool_takes_its_own_gpus_defaults():
    from sim.engine.deployment import build_deployment

    s = _scenario(engine={"policy": "disaggregated"},
                  disaggregation={"prefill": {"gpu": "a100-80g"}, "decode": {"gpu": "h100-sxm"}})
    pre = build_deployment(s, "a100-80g", 1, where="disaggregation.prefill")
    dec = build_deployment(s, "h100-sxm", 1, where="disaggregation.decode")
    assert (pre.limits.max_num_batched_tokens, pre.limits.max_num_seqs) == (8192, 256)  # max_model_len, no chunks
    assert (dec.limits.max_num_batched_tokens, dec.limits.max_num_seqs) == (8192, 1024)
    e = s.resolved()["engine"]
    assert "max_num_seqs" not in e and "max_num_batched_tokens" not in e  # each pool's own


def test_a_resolved_default_scenario_reruns_identically(tmp_path):
    raw = small_scenario()
    raw["engine"] = {}
    raw["hardware"] = {"gpu": "a100-80g"}
    raw["workload"]["synthetic"]["num_requests"] = 30
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(raw))
    assert simsrv("run", p, "-q", "--out", tmp_path / "a").code == 0
    resolved = tmp_path / "a" / "scenario.resolved.yaml"
    assert yaml.safe_load(resolved.read_text())["engine"]["max_num_seqs"] == 256
    assert simsrv("run", resolved, "-q", "--out", tmp_path / "b").code == 0
    assert (tmp_path / "a" / "steps.parquet").read_bytes() == (tmp_path / "b" / "steps.parquet").read_bytes()


@pytest.mark.parametrize("flag, policy", [(True, "chunked"), (False, "continuous")])
def test_enable_chunked_prefill_picks_the_policy(flag, policy):
    assert _scenario(engine={"enable_chunked_prefill": flag}).engine.policy == policy
    assert _scenario(engine={"enable_chunked_prefill": flag, "policy": policy}).engine.policy == policy


@pytest.mark.parametrize("flag, policy", [(True, "static"), (True, "continuous"), (False, "chunked"),
                                          (True, "disaggregated")])
def test_enable_chunked_prefill_against_another_policy_is_one_error(flag, policy):
    with pytest.raises(UserError) as e:
        _scenario(engine={"enable_chunked_prefill": flag, "policy": policy})
    msg = str(e.value)
    assert "\n" not in msg and "engine.enable_chunked_prefill" in msg and policy in msg


@pytest.mark.parametrize("hf_id, key", [("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
                                        ("meta-llama/llama-3.1-8b", "llama-3.1-8b"),
                                        ("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b"),
                                        ("qwen/QWEN2.5-7b", "qwen2.5-7b"),
                                        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
                                        ("mistralai/Mistral-7B-v0.1", "mistral-7b-v0.1-window"),
                                        ("deepseek-ai/DeepSeek-R1", "deepseek-r1"),
                                        ("google/gemma-2-9b-it", "gemma-2-9b"),
                                        ("Llama-3.1-8B-Instruct", "llama-3.1-8b")])
def test_a_hugging_face_id_names_its_catalogue_model(hf_id, key):
    from sim.engine.deployment import build_deployment
    from sim.spec.models import catalogue_key, get_model

    assert catalogue_key(hf_id) == key
    assert get_model(hf_id) == get_model(key)
    if key == "llama-3.1-8b":
        assert build_deployment(_scenario(model=hf_id)).model == get_model(key)


def test_every_llama_qwen_mistral_deepseek_gemma_entry_has_a_hugging_face_id():
    from sim.spec.models import catalogue

    families = ("llama", "qwen", "mistral", "mixtral", "deepseek", "gemma")
    missing = [k for k, v in catalogue().items() if k.startswith(families) and not v.get("hf_ids")]
    assert not missing


def test_an_unknown_model_is_one_line_naming_close_ones():
    from sim.spec.models import get_model

    with pytest.raises(UserError) as e:
        get_model("meta-llama/Llama-3.1-8B-Instrct")
    msg = str(e.value)
    assert "\n" not in msg and "closest: meta-llama/Llama-3.1-8B-Instruct" in msg


@pytest.mark.parametrize("argv", [["--help"], ["sweep", "--help"], ["capacity", "--help"],
                                  ["diagnose", "--help"]])
def test_the_help_shows_the_ray_install_command(argv, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    o = simsrv(*argv)
    assert o.code == 0
    assert "pip install 'simsrv[ray]'" in o.stdout


def test_a_command_line_policy_replaces_the_files_enable_chunked_prefill(tmp_path):
    from sim.scenario import load_scenario

    raw = small_scenario()
    raw["engine"] = {"enable_chunked_prefill": True}
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(raw))
    assert load_scenario(p).engine.policy == "chunked"
    s = load_scenario(p, ["engine.policy=static"])
    assert s.engine.policy == "static" and "enable_chunked_prefill" not in s.resolved()["engine"]
    with pytest.raises(UserError, match="engine.enable_chunked_prefill"):
        load_scenario(p, ["engine.policy=static", "engine.enable_chunked_prefill=true"])
