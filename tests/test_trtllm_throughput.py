"""TensorRT-LLM's fp8 GEMMs run cuBLASLt, not the CUTLASS kernel the fp8 tables measured.

vLLM's CUTLASS FP8 kernel on Hopper takes, one row past a 256-row band (m = 256 j + 1), the time
of the whole next band or more; interpolated along m, that staircase charged every token count of
the band: Llama-3.1-8B's gate+up at 520 tokens cost 1.97x its 512-token time, and TensorRT-LLM's
offline throughput rows (VC-14/VC-15) ran 8-20% slow where the KV cache held 257-768 sequences.
TensorRT-LLM's FP8QDQLinearMethod calls cuBLASLt (``cublas_scaled_mm``), so the ``trt-llm``
profile prices fp8 GEMMs on the tables' trend with cuBLAS's own band steps
(sim/cost/calibration.py ``CublasLtFp8Table``).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sim.cost.calibration import FP8_BAND_ROWS, CublasLtFp8Table, is_band_start, load_calibration
from sim.cost.engine_profile import get_profile, load_profile_file, profile_entry
from sim.cost.roofline import Efficiencies, RooflineCostModel
from sim.errors import UserError
from sim.spec.hardware import get_gpu
from sim.spec.models import get_model

HOPPER = ("h100-sxm", "h200")
# token counts inside a band, away from its ends, and the band's last one
IN_BAND = ((300, 512), (520, 768), (640, 768), (1100, 1280), (2100, 2304))


def _cost(gpu: str, profile: str, model: str = "llama-3.1-8b", tp: int = 1) -> RooflineCostModel:
    from dataclasses import replace

    m = replace(get_model(model), quantization="fp8")
    return RooflineCostModel(m, get_gpu(gpu), tp, 1, Efficiencies(), calibration=load_calibration(gpu),
                             engine=get_profile(profile))


def _gemm_s(c: RooflineCostModel, tokens: int) -> float:
    return sum(c._linear_s(tokens, shape, name=name) for name, shape in
               (("qkv", c._qkv), ("o", c._o), ("up", c._up), ("down", c._down)))


@pytest.mark.parametrize("gpu", HOPPER)
@pytest.mark.parametrize("model,tp", [("llama-3.1-8b", 1), ("llama-3-70b", 2)])
def test_cublaslt_gemm_no_costlier_than_the_bands_end(gpu, model, tp):
    """Under cuBLASLt a GEMM of m tokens never costs more than the same GEMM with the rest of
    its 256-row band (before: 520 tokens cost more than 768 on H100, 1.27x)."""
    c = _cost(gpu, "trt-llm", model, tp)
    for m, end in IN_BAND:
        assert _gemm_s(c, m) <= _gemm_s(c, end) * 1.001, (m, end)


@pytest.mark.parametrize("gpu", HOPPER)
def test_cutlass_engines_keep_the_measured_staircase(gpu):
    """vLLM (the measured kernel) keeps the table as measured: its 520-token GEMMs cost at least
    as much as the whole band, as the kernel's 513-row ones do."""
    c = _cost(gpu, "vllm-v1")
    assert get_profile("vllm-v1").fp8_gemm == "cutlass"
    assert _gemm_s(c, 520) > _gemm_s(c, 512) * 1.3


def test_cublaslt_view_keeps_the_aligned_rows_and_only_adds_cublas_steps():
    """At the token counts that fill whole bands the view is the measured table; at a band start
    it is the aligned trend less cuBLAS's own BF16 step there (never a gain over the trend)."""
    cal = load_calibration("h100-sxm")
    view = cal.fp8_table("cublaslt")
    assert isinstance(view, CublasLtFp8Table) and cal.fp8_table("cublaslt") is view
    assert cal.fp8_table("cutlass") is cal.gemm_fp8
    i, j = cal.gemm_fp8.n.index(16384), cal.gemm_fp8.k.index(4096)
    raw = cal.gemm_fp8._log_eff[i, j].tolist()
    row = view._row(i, j)
    starts = [t for t, m in enumerate(view.m) if is_band_start(m)]
    assert starts and all(view.m[t] % FP8_BAND_ROWS == 1 for t in starts)
    for t, m in enumerate(view.m):
        if t not in starts:
            assert row[t] == raw[t] or (math.isnan(row[t]) and math.isnan(raw[t]))
    # the measured band starts sit far below the view there (the staircase left out)
    assert sum(row[t] - raw[t] for t in starts) / len(starts) > 0.1


def test_trtllm_decode_step_cheaper_in_band():
    """A decode step of 520 sequences (VC-14 1000/1000 on H100: the KV cache holds ~527) costs
    its GEMMs at the trend: 12.5 ms before, ~7 ms now."""
    c = _cost("h100-sxm", "trt-llm")
    assert _gemm_s(c, 520) * c.model.num_layers * 1e3 < 8.0


def test_profile_file_fp8_gemm_key(tmp_path: Path):
    entry = profile_entry("trt-llm")
    assert entry["fp8_gemm"] == "cublaslt"
    import yaml

    good = tmp_path / "p.yaml"
    good.write_text(yaml.safe_dump(entry))
    assert load_profile_file(good).fp8_gemm == "cublaslt"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**entry, "fp8_gemm": "cudnn"}))
    with pytest.raises(UserError, match="key fp8_gemm: 'cudnn' is not cutlass or cublaslt"):
        load_profile_file(bad)
    assert get_profile("trt-llm").describe()["fp8_gemm"] == "cublaslt"
