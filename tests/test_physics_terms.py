"""Issue 10 section 3: physics terms (quantized weights, custom all-reduce, MHA decode attention,
skinny GEMM waves, launch floors and carried calibrations, explain reading the cost model)."""

import pytest

from sim.batch import Batch
from sim.cost.calibration import default_efficiencies, load_calibration
from sim.cost.roofline import Efficiencies, RooflineCostModel
from sim.hardware import get_gpu
from sim.models import get_model


def _cm(model, gpu, tp=1, **kw):
    cal = load_calibration(gpu)
    return RooflineCostModel(get_model(model), get_gpu(gpu), tp, None, default_efficiencies(cal, Efficiencies(), tp),
                             calibration=cal, **kw)


def test_a100_skinny_gemm_is_not_padded_into_compute():
    """Llama-3-8B gate+up (4096 -> 28,672: 112 tiles of 256 on 108 SMs) at one token streams its
    weights near the measured rate of its neighbours (n = 16,384 / 65,536 at m = 1: 67-78% of
    HBM); a whole second wave of 128-row tiles made it compute bound at 56%."""
    m, g = get_model("llama-3-8b"), get_gpu("a100-80g")
    cm = _cm("llama-3-8b", "a100-80g")
    up_s = cm.step_time(Batch(num_decode_seqs=1, decode_context_tokens=16, num_logits=1)).ops_s["gemm_mlp_up"]
    frac = m.num_layers * m.hidden_size * 2 * m.intermediate_size * 2 / up_s / g.hbm_bw_bytes_per_s
    assert 0.65 < frac < 0.95
