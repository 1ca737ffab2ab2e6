"""Carried calibration stays within what the donor measured and physics allow: a GPU that prices
an operator with another GPU's measured curve (``sim.cost.calibration.carried_from``:
elementwise kernels, looked up at the bytes of equal roofline bound) is never below its bytes
at its own peak, and with more bandwidth than the donor never slower than the donor's measured
kernel of the same bytes; the donor itself does not move (issue 37)."""

from __future__ import annotations

import math

import pytest

from sim.cost.calibration import carried_from, load_calibration
from sim.cost.roofline import RooflineCostModel
from sim.spec.hardware import catalogue, get_gpu
from sim.spec.models import get_model

MODEL = "llama-3.1-8b"
TOKENS = (1, 8, 64, 300, 1024, 2048, 8192)


def _carriers() -> list[str]:
    out = []
    for key in sorted(catalogue()):
        cal = load_calibration(key)
        if cal is not None and "elementwise" in carried_from(cal):
            out.append(key)
    return out


def _cops(gpu_key: str):
    m, g = get_model(MODEL), get_gpu(gpu_key)
    return RooflineCostModel(m, g, 1, calibration=load_calibration(g.key)).cops


def test_carriers_include_the_faster_and_slower_parts():
    keys = _carriers()
    assert {"h200", "b200", "gb200"} <= set(keys)  # 4.8, 7.7, 8.0 TB/s: faster than H100
    assert "l40s" in keys  # 864 GB/s, slower


@pytest.mark.parametrize("gpu_key", _carriers())
def test_carried_elementwise_is_bounded_by_the_donor_and_the_bytes(gpu_key):
    """Each kernel: at least its bytes at this GPU's peak; with more bandwidth than the donor,
    at most the donor's measured time for the same bytes (before: H200 and B200 priced small
    kernels above H100's measured time, the equal-bound lookup landing on a slower point of a
    non-monotone curve)."""
    cops = _cops(gpu_key)
    donor_key = carried_from(load_calibration(gpu_key))["elementwise"]
    donor = _cops(donor_key)
    bw, bw_donor = get_gpu(gpu_key).hbm_bw_bytes_per_s, get_gpu(donor_key).hbm_bw_bytes_per_s
    curves = list(cops.elem_ops) + [cops.embed]
    assert [b for _, b in curves] == [b for _, b in list(donor.elem_ops) + [donor.embed]]
    for curve, per_token in curves:
        for tokens in TOKENS:
            nbytes = per_token * tokens
            t, _ = cops._elementwise_kernel_s(curve, nbytes)
            td = _own_kernel_s(curve, nbytes, bw_donor)
            assert t >= nbytes / bw * (1 - 1e-9), (gpu_key, tokens)
            if bw > bw_donor:
                assert t <= td * (1 + 1e-12), (gpu_key, per_token, tokens, t, td)


def test_h200_step_elementwise_not_above_h100s():
    """Llama-3.1-8B at batch 1: H200's step pays no more elementwise time than H100 measured
    (before: 0.814 against 0.722 ms)."""
    t, _ = _cops("h200").elementwise_s(1)
    td, _ = _cops("h100-sxm").elementwise_s(1)
    assert t <= td


def _own_kernel_s(curve, nbytes: float, bw: float) -> float:
    """A measured kernel on its own GPU: bytes / bw / eff(bytes), the smallest measured kernel's
    time below the table."""
    x0 = math.exp(curve.lx[0])
    x = max(nbytes, x0)
    return x / bw / curve.eff(x)[0]


def test_donor_is_not_moved():
    """The GPU that measured the table prices its own kernels at its own curve."""
    cops = _cops("h100-sxm")
    assert cops.elem_scale == 1.0
    bw = get_gpu("h100-sxm").hbm_bw_bytes_per_s
    for tokens in TOKENS:
        want = cops.L * sum(_own_kernel_s(c, b * tokens, bw) for c, b in cops.elem_ops)
        want += _own_kernel_s(cops.embed[0], cops.embed[1] * tokens, bw)
        assert cops.elementwise_s(tokens)[0] == pytest.approx(want, rel=1e-12)
