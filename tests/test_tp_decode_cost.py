"""Decode-step costs specific to tensor parallelism (issue 37 follow-up: Llama-70B TP4 on H100
simulated too fast under vLLM 0.6 and SGLang 0.3, VC-17 and VC-18).

vLLM V0's multi-step scheduling (``engine.num_scheduler_steps``) amortises the scheduling and
the driver's input preparation over the block, but its MultiStepWorker broadcasts the whole
model input to the TP workers on every step (vllm/worker/multi_step_worker.py
``_get_driver_input_and_broadcast``): the per-extra-rank host term is paid per step."""

from dataclasses import replace

import pytest

from sim.core.batch import Batch
from sim.cost.calibration import load_calibration
from sim.cost.engine_profile import get_profile, profile_names
from sim.cost.roofline import RooflineCostModel
from sim.spec.hardware import get_gpu
from sim.spec.models import get_model

STEPS = (1, 2, 8, 10, 16)


@pytest.mark.parametrize("name", profile_names())
@pytest.mark.parametrize("tp", (2, 4, 8))
def test_multi_step_pays_the_tp_broadcast_every_step(name, tp):
    """For every profile, TP size and block length: a decode step's CPU grows by exactly the
    per-extra-rank term times the extra ranks, whatever num_scheduler_steps amortises."""
    base = get_profile(name)
    if base.per_extra_tp_rank_s == 0.0:
        base = replace(base, per_extra_tp_rank_s=2e-4)
    for n in (1, 14, 64, 256):
        for steps in STEPS:
            p = replace(base, num_scheduler_steps=steps)
            extra = p.cpu_s(n, False, tp) - p.cpu_s(n, False, 1)
            assert extra == pytest.approx(base.per_extra_tp_rank_s * (tp - 1), rel=1e-9), (n, steps)


def test_multi_step_still_amortises_the_rest_at_tp():
    """The broadcast is the only term of a TP decode step not divided by the block length: the
    amortised part is the same at TP1 and TP4."""
    p = get_profile("vllm-v0")
    m = replace(p, num_scheduler_steps=10)
    out = p.output_step_s + p.output_per_seq_s * 64
    ranks = 3 * p.per_extra_tp_rank_s
    assert m.cpu_s(64, False, 4) == pytest.approx((p.cpu_s(64, False, 1) - out) / 10 + out + ranks)
    assert m.cpu_s(64, True, 4) == p.cpu_s(64, True, 4)  # a prompt step is a single step


def test_tp4_multi_step_decode_step_carries_the_broadcast():
    """Llama-3.1-70B TP4 on H100 under vLLM 0.6 (vllm-v0, 10 scheduler steps): the decode step's
    host overhead includes the three workers' broadcast in full."""
    m, g = get_model("llama-3.1-70b"), get_gpu("h100-sxm")
    p = replace(get_profile("vllm-v0"), num_scheduler_steps=10)
    cal = load_calibration(g.key)
    tp1 = RooflineCostModel(m, g, 4, calibration=cal, engine=replace(p, per_extra_tp_rank_s=0.0))
    tp4 = RooflineCostModel(m, g, 4, calibration=cal, engine=p)
    b = Batch(14, 14 * 300, num_logits=14)
    extra = tp4.step_time(b).total_s - tp1.step_time(b).total_s
    assert extra == pytest.approx(3 * p.per_extra_tp_rank_s, rel=1e-6)
