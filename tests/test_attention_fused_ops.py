"""A step's elementwise kernels are not charged twice: where a measured attention table's timed
call already includes rotary embedding or the KV-cache write, the step charges them no more
(sim/cost/calibration.py ``TABLES_INCLUDE``). TensorRT-LLM's attention op (aiconfigurator's
trtllm tables) rotates q and k and appends K/V to the paged cache; SGLang's FlashInfer backend
(its flashinfer tables) writes K/V; vLLM's main tables time the attention kernel alone. A GPU
without the engine's tables, or a backend without tables of its own, keeps every separate op."""

from __future__ import annotations

import dataclasses

import pytest

from sim.core.batch import Batch
from sim.cost.calibration import Calibration, load_calibration, ops_inside_attention
from sim.cost.roofline import RooflineCostModel
from sim.spec.models import get_model
from tests.test_engine_attention_tables import _cm, _stripped

ALL_OPS = ("norm", "norm", "add", "add", "rope", "act", "kv_write")  # CalibratedOps' order


def _elem_s(cm: RooflineCostModel, tokens: int) -> float:
    assert cm.cops is not None
    return cm.cops.elementwise_s(tokens)[0]


def _unfused_minus(cm_full: RooflineCostModel, dropped: set[str], tokens: int) -> float:
    """The full set's elementwise time less the kernels of ``dropped``, each priced as the full
    set prices it (per layer, ``num_layers`` times)."""
    cops = cm_full.cops
    assert cops is not None and len(cops.elem_ops) == len(ALL_OPS)
    less = sum(cops._elementwise_kernel_s(curve, nbytes * tokens)[0]
               for name, (curve, nbytes) in zip(ALL_OPS, cops.elem_ops) if name in dropped)
    return _elem_s(cm_full, tokens) - cops.L * less


def _sig(cm: RooflineCostModel) -> tuple[tuple[str, float], ...]:
    """(table kind, bytes per token) of each elementwise op charged per layer."""
    cops = cm.cops
    assert cops is not None
    # the GPU's own elementwise curves, or the donor's it carries (sim/cost/calibrated.py)
    kinds = cops.cal.elementwise or load_calibration(cm.carried_from["elementwise"]).elementwise
    return tuple((next(k for k, c in kinds.items() if c is curve), nbytes) for curve, nbytes in cops.elem_ops)


def _kept(cm_full: RooflineCostModel, dropped: set[str]) -> tuple[tuple[str, float], ...]:
    return tuple(op for name, op in zip(ALL_OPS, _sig(cm_full)) if name not in dropped)


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200", "a100-80g", "b200", "l40s"])
@pytest.mark.parametrize("tokens", [1, 64, 4096])
def test_trtllm_tables_take_rope_and_kv_write_out_of_the_step(gpu, tokens):
    """Under ``trtllm`` with TensorRT-LLM's own tables the elementwise time is the unfused set's
    less its rotary and KV-cache-write kernels, exactly: the other five ops and the embedding
    stay, priced as before."""
    cm = _cm("llama-3-8b", 2, "trtllm", gpu)
    full = _cm("llama-3-8b", 2, "trtllm", gpu, cal=_stripped(gpu))
    assert cm.cops.prefill_op == "attn_prefill_trtllm" and cm.cops.decode_op == "attn_decode_trtllm"
    assert _sig(cm) == _kept(full, {"rope", "kv_write"})
    assert _elem_s(cm, tokens) == pytest.approx(_unfused_minus(full, {"rope", "kv_write"}, tokens), rel=1e-12)
    assert _elem_s(cm, tokens) < _elem_s(full, tokens)


@pytest.mark.parametrize("gpu", ["h100-sxm", "b200"])
def test_trtllm_fp8_kv_and_fp8_context_tables_include_them_too(gpu):
    """The fp8-KV XQA and FP8 context FMHA tables time the same op (the same collector run with
    an 8-bit cache / FP8 context FMHA): rotary and the cache write are inside them as well."""
    m8 = dataclasses.replace(get_model("llama-3-8b"), quantization="fp8")
    cm = _cm(m8, 1, "trtllm", gpu)
    assert cm.cops.prefill_op == "attn_prefill_trtllm_fp8" and cm.cops.decode_op == "attn_decode_trtllm_fp8kv"
    assert cm.cops.fused_ops == frozenset(("rope", "kv_write"))
    full = _cm(m8, 1, "trtllm", gpu, cal=_stripped(gpu))
    assert _sig(cm) == _kept(full, {"rope", "kv_write"})


@pytest.mark.parametrize("gpu", ["l40s", "b200"])
def test_flashinfer_tables_take_only_the_kv_write_out(gpu):
    """SGLang's timed FlashInfer call writes K/V (set_kv_buffer) but is handed q and k already
    rotated: the cache write leaves the step, rotary stays."""
    cm = _cm("llama-3-8b", 2, "flashinfer", gpu, profile="sglang")
    full = _cm("llama-3-8b", 2, "flashinfer", gpu, cal=_stripped(gpu), profile="sglang")
    assert cm.cops.prefill_op == "attn_prefill_flashinfer" and cm.cops.decode_op == "attn_decode_flashinfer"
    assert _sig(cm) == _kept(full, {"kv_write"})
    for tokens in (1, 256):
        assert _elem_s(cm, tokens) == pytest.approx(_unfused_minus(full, {"kv_write"}, tokens), rel=1e-12)


@pytest.mark.parametrize("gpu,backend,profile", [
    ("h100-sxm", "flash-attn", "vllm-v1"), ("b200", "flash-attn", "vllm-v1"),
    ("h100-sxm", "trtllm-mmha", "trt-llm"), ("a100-80g", "xformers", "vllm-v0"),
    ("h100-sxm", "flashinfer", "sglang"),  # no FlashInfer tables on H100: the main tables price it
])
def test_main_tables_keep_every_separate_op(gpu, backend, profile):
    """vLLM's main tables time the attention kernel alone (the cache write is its own op since
    vllm-project/vllm#25954): all seven ops are charged, as with no engine tables at all."""
    cm = _cm("llama-3-8b", 2, backend, gpu, profile=profile)
    assert cm.cops.fused_ops == frozenset()
    assert len(cm.cops.elem_ops) == len(ALL_OPS)
    full = _cm("llama-3-8b", 2, backend, gpu, cal=_stripped(gpu), profile=profile)
    assert _elem_s(cm, 64) == _elem_s(full, 64)


@pytest.mark.parametrize("backend,profile", [("trtllm", "trt-llm"), ("flashinfer", "sglang")])
def test_a_gpu_without_the_engines_tables_keeps_the_separate_ops(backend, profile):
    """The same backend on a calibration without its engine's tables is priced by the main
    tables, which include neither op: the step charges them."""
    gpu = "l40s"
    cm = _cm("llama-3-8b", 2, backend, gpu, cal=_stripped(gpu), profile=profile)
    assert cm.cops.prefill_op == "attn_prefill" and cm.cops.decode_op == "attn_decode"
    assert cm.cops.fused_ops == frozenset()
    vllm = _cm("llama-3-8b", 2, "flash-attn", gpu, profile="vllm-v1")
    assert _elem_s(cm, 512) == _elem_s(vllm, 512)


def test_mla_models_keep_the_separate_ops_under_trtllm():
    """An MLA model keeps the main tables (its attention is not the measured MHA kernels), so
    its rotary and cache write stay charged."""
    cm = _cm("deepseek-v3", 2, "trtllm", "h100-sxm")
    assert cm.cops.decode_op == "attn_decode" and cm.cops.fused_ops == frozenset()


def test_a_step_priced_by_one_main_table_charges_the_ops():
    """Elementwise kernels run over a step's prefill and decode tokens alike: an op leaves the
    step only when both phases' tables include it (an engine table measured for one phase alone
    leaves the other phase priced by the main tables, which do not)."""
    assert ops_inside_attention("trtllm", "attn_prefill_trtllm", "attn_decode_trtllm_fp8kv") == {"rope", "kv_write"}
    assert ops_inside_attention("trtllm", "attn_prefill_trtllm", "attn_decode") == frozenset()
    assert ops_inside_attention("flashinfer", "attn_prefill", "attn_decode_flashinfer") == frozenset()
    assert ops_inside_attention("", "attn_prefill", "attn_decode") == frozenset()
    # the decode table missing on this GPU: the cost model charges both ops
    raw = load_calibration("l40s").raw
    cal = Calibration({k: v for k, v in raw.items() if not k.startswith("attn_decode_trtllm")})
    cm = _cm("llama-3-8b", 2, "trtllm", "l40s", cal=cal)
    assert cm.cops.prefill_op == "attn_prefill_trtllm" and cm.cops.decode_op == "attn_decode"
    assert len(cm.cops.elem_ops) == len(ALL_OPS)


def test_step_elementwise_term_is_the_reduced_set():
    """The step's ``elementwise`` term under trtllm is what CalibratedOps prices (no other path
    adds the dropped kernels back)."""
    cm = _cm("llama-3-8b", 2, "trtllm", "h100-sxm")
    b = Batch(num_decode_seqs=32, decode_context_tokens=32 * 1000, num_logits=32)
    assert cm.step_time(b).ops_s["elementwise"] == pytest.approx(_elem_s(cm, 32), rel=1e-12)
