"""Short prefills of 2023 TensorRT-LLM engines (issue 37, first bullet; VC-03's 128-token rows):
what a 128-token prompt's step is made of, and the all-reduce those engines ran.

TensorRT-LLM v0.5-v0.7 built its engines with the NCCL plugin unless ``--use_custom_all_reduce``
was passed (examples/*/build.py: ``action='store_true'``); the published tables' build commands
(docs/source/performance.md) do not pass it. vLLM's one-/two-shot custom kernel, which the cost
model takes for small buffers, is then never the engine's: ``EngineProfile.custom_allreduce``.
"""

from __future__ import annotations

import pytest

from sim.core.batch import Batch
from sim.cost.calibration import load_calibration
from sim.cost.engine_profile import get_profile, load_profile_file, profile_entry, profile_names
from sim.cost.roofline import RooflineCostModel
from sim.errors import UserError
from sim.spec.hardware import get_gpu
from sim.spec.models import get_model

TOKENS = (1, 8, 64, 128, 256, 512, 2048, 8192)


def _cost(profile: str, model: str = "llama-2-70b", gpu: str = "a100-80g", tp: int = 4) -> RooflineCostModel:
    g = get_gpu(gpu)
    return RooflineCostModel(get_model(model), g, tp, calibration=load_calibration(g.key), engine=get_profile(profile))


@pytest.mark.parametrize("profile", ["trt-llm-2023", "vllm-v0.2"])
def test_2023_engines_have_no_custom_allreduce(profile):
    """TensorRT-LLM v0.5-v0.7 unless built with --use_custom_all_reduce; vLLM before 0.3.0."""
    assert get_profile(profile).custom_allreduce is False
    assert get_profile(profile).describe()["custom_allreduce"] is False


def test_later_engines_keep_the_custom_kernel():
    for name in ("vllm-v1", "vllm-v1-0.34", "sglang", "trt-llm"):
        assert get_profile(name).custom_allreduce is True, name


@pytest.mark.parametrize("gpu", ["a100-80g", "h100-sxm"])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_an_engine_without_custom_allreduce_pays_nccl_at_every_size(gpu, tp):
    """Every profile that says so, every message size: a step's all-reduces are NCCL's (the
    calibrated NCCL table), never the custom kernel's, small buffers included."""
    for name in profile_names():
        if get_profile(name).custom_allreduce:
            continue
        cost = _cost(name, gpu=gpu, tp=tp)
        for t in TOKENS:
            assert not cost._uses_custom_ar(t)
            assert cost._per_tokens(t)[1] == pytest.approx(cost.nccl_allreduce_s(t), rel=1e-12), (name, t)


def test_a_128_token_prefill_under_tp4_costs_nccl_not_the_custom_kernel():
    """VC-03's Llama-2-70B TP4 128-token prompt on A100: 2 MB messages, where vLLM's custom kernel
    (26 us) and NCCL (46 us) differ; TensorRT-LLM 2023 paid NCCL's on each of 160 all-reduces."""
    prompt = Batch(prefill_chunks=((128, 0),), num_logits=1)
    vllm, trt = _cost("vllm-v0"), _cost("trt-llm-2023")
    assert vllm._uses_custom_ar(128)  # the same shape takes the custom kernel under vLLM
    # the allreduce operator also carries the LM head's logits gather (tests/test_lm_head_gather.py)
    ar = trt.step_time(prompt).ops_s["allreduce"]
    assert ar == pytest.approx(trt.nccl_allreduce_s(128) + trt._logits_gather_s(1))
    assert ar > 1.5 * vllm.step_time(prompt).ops_s["allreduce"]
    # only the all-reduce differs between the two: the GEMMs, attention and elementwise are the GPU's
    a, b = vllm.step_time(prompt).ops_s, trt.step_time(prompt).ops_s
    for op in ("gemm_qkv", "gemm_o", "gemm_mlp_up", "gemm_mlp_down", "attn_prefill", "elementwise", "lm_head"):
        assert a[op] == b[op], op


def test_tp1_steps_do_not_change():
    prompt = Batch(prefill_chunks=((128, 0),), num_logits=1)
    one = _cost("trt-llm-2023", model="llama-2-7b", tp=1)
    assert one.step_time(prompt).ops_s["allreduce"] == 0.0


def test_profile_files_carry_the_key_and_check_it(tmp_path):
    import yaml

    entry = profile_entry("trt-llm-2023")
    assert entry["custom_allreduce"] is False  # a file made from the entry runs as the entry does
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(entry))
    assert load_profile_file(f).custom_allreduce is False
    del entry["custom_allreduce"]  # optional: absent, the custom kernel as before
    f2 = tmp_path / "q.yaml"
    f2.write_text(yaml.safe_dump(entry))
    assert load_profile_file(f2).custom_allreduce is True
    entry["custom_allreduce"] = "no"
    f3 = tmp_path / "r.yaml"
    f3.write_text(yaml.safe_dump(entry))
    with pytest.raises(UserError, match="key custom_allreduce"):
        load_profile_file(f3)


def test_custom_allreduce_can_be_switched_under_engine_overhead(tmp_path):
    """engine.overhead.custom_allreduce overrides the profile's rule."""
    from sim.engine.deployment import engine_profile
    from sim.scenario import load_scenario

    f = tmp_path / "s.yaml"
    f.write_text("model: llama-2-70b\nhardware: {gpu: a100-80g}\ncluster: {tensor_parallel_size: 4}\n"
                 "workload: {synthetic: {num_requests: 1}}\n")
    assert engine_profile(load_scenario(f).engine).custom_allreduce is True
    off = load_scenario(f, ["engine.overhead.custom_allreduce=false"])
    assert engine_profile(off.engine).custom_allreduce is False
