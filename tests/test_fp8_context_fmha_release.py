"""FP8 context FMHA only in the TensorRT-LLM releases that have it (issue 37 review).

TensorRT-LLM's builder turns FP8 context FMHA on with FP8 quantization and an fp8 KV cache on
SM >= 89 in its later releases; v0.5-v0.7 (the ``trt-llm-2023`` profile, VC-13's v0.7a rows with
``attention_backend: trtllm``) had none (NVIDIA/TensorRT-LLM#1463: not an option of 0.8.0), so
their fp8 prompts' attention reads the 16-bit context table. A profile file may state it.
"""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from sim.cost.calibration import load_calibration
from sim.cost.engine_profile import get_profile, profile_entry
from sim.cost.roofline import RooflineCostModel
from sim.spec.hardware import get_gpu
from sim.spec.models import get_model


def _prefill_op(profile: str, gpu: str = "h200") -> str:
    g = get_gpu(gpu)
    m = dataclasses.replace(get_model("llama-2-70b"), quantization="fp8")
    cm = RooflineCostModel(m, g, 1, 1, engine=get_profile(profile, {"attention_backend": "trtllm"}),
                           calibration=load_calibration(g.key))
    assert cm.cops is not None
    return cm.cops.prefill_op


def test_2023_sessions_have_no_fp8_context_fmha():
    assert get_profile("trt-llm-2023").fp8_context_fmha is False
    assert _prefill_op("trt-llm-2023") == "attn_prefill_trtllm"


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200"])
def test_later_releases_run_it(gpu):
    assert get_profile("trt-llm").fp8_context_fmha is True
    assert _prefill_op("trt-llm", gpu) == "attn_prefill_trtllm_fp8"


def test_a_profile_file_states_it(tmp_path):
    keep = profile_entry("trt-llm")
    keep["fp8_context_fmha"] = False
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(keep))
    assert get_profile(str(p)).fp8_context_fmha is False
    keep["fp8_context_fmha"] = "no"
    p.write_text(yaml.safe_dump(keep))
    with pytest.raises(Exception, match="fp8_context_fmha"):
        get_profile(str(p))
