"""Host time of an eager step's layers in SGLang 0.3 and vLLM V0 (issue 37, first bullet).

Both engines run prefill steps (and decode steps beyond their captured batch sizes) eagerly:
every layer's modules are called from Python and launch their kernels one by one, so a step is
host-bound when those launches take longer than its kernels (``EngineProfile.host_terms``).
The profiles' ``eager_launch_per_layer_ms`` is derived from sgl-project/sglang#1401 (2024-09-12,
SGLang 0.3.x): ``sglang.bench_latency`` of Llama-3-8B, batch 1, input 128, decode median with and
without CUDA graph (flashinfer: 7.35 ms and 8.23 ms). The graphed step is the GPU time plus host
work both modes pay; the eager one is that host work plus the launches (host-bound: it is 0.88 ms
longer). With this cost model's GPU time of that step, launches = 8.23 - (7.35 - GPU).
"""

from __future__ import annotations

import pytest

from sim.core.batch import Batch
from sim.cost.calibration import load_calibration
from sim.cost.engine_profile import get_profile
from sim.cost.roofline import RooflineCostModel
from sim.spec.hardware import get_gpu
from sim.spec.models import get_model

# sgl-project/sglang#1401: Decode median latency, Meta-Llama-3-8B, --batch-size 1 --input 128 --output 8
GRAPHED_S = {"flashinfer": 0.00735, "triton": 0.00706}
EAGER_S = {"flashinfer": 0.00823, "triton": 0.00928}
# the median decode step of that run attends to the 128-token prompt and the first decoded tokens
CONTEXT_TOKENS = 132


def _cost(profile: str, model: str, gpu: str, tp: int) -> RooflineCostModel:
    g = get_gpu(gpu)
    return RooflineCostModel(get_model(model), g, tp, calibration=load_calibration(g.key), engine=get_profile(profile))


def _gpu_s(cost: RooflineCostModel, batch: Batch) -> float:
    ops = cost.step_time(batch).ops_s
    return sum(t for op, t in ops.items() if op != "overhead")


def _derived_per_layer_s(backend: str) -> float:
    """Per-layer eager host seconds from PR 1401's pair of measurements (module docstring)."""
    cost = _cost("sglang", "llama-3-8b", "h100-sxm", 1)
    gpu = _gpu_s(cost, Batch(num_decode_seqs=1, decode_context_tokens=CONTEXT_TOKENS, num_logits=1))
    host_both_modes = GRAPHED_S[backend] - gpu
    assert host_both_modes > 0.0  # the graphed step is never shorter than its kernels
    return (EAGER_S[backend] - host_both_modes) / get_model("llama-3-8b").num_layers


def test_the_measured_gpu_is_an_h100():
    """The PR names no GPU: an A100's kernels alone for that decode step take longer than the whole
    measured graphed step (7.35 ms), an H100's fit inside it; the derivation uses the H100."""
    step = Batch(num_decode_seqs=1, decode_context_tokens=CONTEXT_TOKENS, num_logits=1)
    assert _gpu_s(_cost("sglang", "llama-3-8b", "a100-80g", 1), step) > GRAPHED_S["flashinfer"]
    assert _gpu_s(_cost("sglang", "llama-3-8b", "h100-sxm", 1), step) < GRAPHED_S["flashinfer"]


def test_sglang_figure_is_its_documented_derivation():
    """FlashInfer was SGLang 0.3's default attention backend (the profile's ``attention_backend``)."""
    assert get_profile("sglang").attention_backend == "flashinfer"
    assert get_profile("sglang").eager_launch_per_layer_s == pytest.approx(_derived_per_layer_s("flashinfer"), rel=0.05)


def test_the_two_backends_agree_within_2x():
    """The Triton backend's pair gives a somewhat larger figure (more Python per layer in its wrappers)."""
    fi, tr = _derived_per_layer_s("flashinfer"), _derived_per_layer_s("triton")
    assert fi < tr < 2 * fi


def test_vllm_v0_shares_sglangs_figure():
    """SGLang 0.3's Llama is vLLM's model code on vLLM's layers (linear, RMSNorm, rotary, SiluAndMul,
    custom all-reduce); only the attention wrapper differs. No vLLM V0 pair of eager and graphed
    measurements with a known GPU was found: the figure is SGLang's."""
    assert get_profile("vllm-v0").eager_launch_per_layer_s == get_profile("sglang").eager_launch_per_layer_s


@pytest.mark.parametrize("profile", ["sglang", "vllm-v0"])
def test_a_short_eager_prefill_of_a_70b_tp4_model_is_host_bound(profile):
    """Llama-3.1-70B TP4 on H100, a 16-token prompt: 80 layers of launches exceed the step's kernels,
    so the step takes at least its launches."""
    cost = _cost(profile, "llama-3.1-70b", "h100-sxm", 4)
    prompt = Batch(prefill_chunks=((16, 0),), num_logits=1)
    gpu = _gpu_s(cost, prompt)
    launch = 80 * get_profile(profile).eager_launch_per_layer_s
    assert launch > gpu
    assert cost.step_time(prompt).total_s >= launch


@pytest.mark.parametrize("profile", ["sglang", "vllm-v0"])
def test_a_long_prefill_stays_gpu_bound(profile):
    """2,048 prompt tokens: the kernels hide the launches; the step's overhead is the CPU work alone."""
    cost = _cost(profile, "llama-3.1-70b", "h100-sxm", 4)
    prompt = Batch(prefill_chunks=((2048, 0),), num_logits=1)
    gpu = _gpu_s(cost, prompt)
    assert 80 * get_profile(profile).eager_launch_per_layer_s < gpu
    cpu, _ = get_profile(profile).host_terms(1, True, 4, 80)
    expected = max(gpu, cpu) if get_profile(profile).overlap_cpu else gpu + cpu
    assert cost.step_time(prompt).total_s == pytest.approx(expected, rel=1e-9)
