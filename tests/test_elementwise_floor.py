"""Elementwise kernels smaller than the smallest one measured cost that kernel's measured time:
a kernel that small is latency bound, so fewer bytes do not make it faster, and the time is a
measured floor, not an extrapolation (sim/cost/calibrated.py ``_elementwise_kernel_s``)."""
import math

import pytest

from sim.cost.calibration import load_calibration
from sim.cost.roofline import Efficiencies, RooflineCostModel
from sim.spec.hardware import get_gpu
from sim.spec.models import get_model

MODELS = ("llama-3.1-8b", "llama-2-7b", "llama-3.1-70b", "qwen2.5-7b")
GPUS = ("h100-sxm", "a100-80g", "h200", "l40s")


def _cops(model, gpu, tp=1):
    cm = RooflineCostModel(get_model(model), get_gpu(gpu), tp, None, Efficiencies(),
                           calibration=load_calibration(gpu))
    assert cm.cops is not None and cm.cops.elem_ops
    return cm.cops


def _smallest_kernel_s(cops, curve):
    x0 = math.exp(curve.lx[0])
    return x0 / cops.elem_scale / cops.bw / curve.eff(x0)[0]


def _below_table_s(cops, curve, nbytes):
    """The smallest measured kernel's time; on a GPU with more bandwidth than the donor whose
    curve it carries, not above the donor's measured kernel of the same bytes
    (tests/test_inherited_regimes.py)."""
    t = _smallest_kernel_s(cops, curve)
    if cops.elem_scale < 1.0:
        x = max(nbytes, math.exp(curve.lx[0]))
        t = min(t, x / (cops.elem_scale * cops.bw) / curve.eff(x)[0])
    return t


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("model", MODELS)
def test_kernels_below_the_table_cost_the_smallest_measured_kernel(model, gpu):
    """Every elementwise kernel of a 1..8-token step that moves fewer bytes than the smallest
    kernel measured costs exactly that kernel's measured time, unflagged; the step's
    elementwise part is then never flagged for being small."""
    cops = _cops(model, gpu)
    below = 0
    for tokens in range(1, 9):
        for curve, per_token_bytes in cops.elem_ops:
            nbytes = per_token_bytes * tokens
            if nbytes * cops.elem_scale < math.exp(curve.lx[0]):
                below += 1
                t, out = cops._elementwise_kernel_s(curve, nbytes)
                assert t == pytest.approx(_below_table_s(cops, curve, nbytes), rel=1e-12) and not out
                # half the bytes: the same time (latency bound), where the roofline would halve it
                half = cops._elementwise_kernel_s(curve, nbytes / 2)[0]
                assert half == pytest.approx(_below_table_s(cops, curve, nbytes / 2), rel=1e-12)
                if cops.elem_scale >= 1.0:
                    assert half == pytest.approx(t, rel=1e-12)
    assert not cops.elementwise_s(1)[1]  # a one-token step is below or inside every table: never flagged
    if gpu in ("h100-sxm", "a100-80g") and model != "llama-2-7b":
        assert below > 0  # a grouped-query model's KV-cache write at one token is below the table


def test_the_floor_joins_the_measured_curve():
    """At the smallest measured size the two rules give the same time (no step in the curve)."""
    cops = _cops("llama-3.1-8b", "h100-sxm")
    for curve, _ in cops.elem_ops:
        x0 = math.exp(curve.lx[0]) / cops.elem_scale
        below = cops._elementwise_kernel_s(curve, x0 * (1 - 1e-9))[0]
        at = cops._elementwise_kernel_s(curve, x0)[0]
        assert below == pytest.approx(at, rel=1e-6)
