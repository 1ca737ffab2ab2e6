"""A GPU without a measured kernel profile of its own inherits the profile of a GPU of its
architecture (``catalog/gpus.yaml`` ``calibration_sibling``; sim/cost/calibration.py
``inherited_calibration``), priced at its own peaks.

Why: GB200 had no profile and ran the roofline with default efficiencies; its GPU is the B200
die, whose measured efficiencies put B200 within 12% of TensorRT-LLM's perf tables while GB200
was simulated 24-87% faster than measured (validation/VC-24.yaml, issue 40). These tests make a
profiled architecture's GPU unable to fall back to default efficiencies unnoticed, and a
sibling's step unable to beat its donor's by more than their peaks allow.
"""

from __future__ import annotations

import json

import pytest

from sim.core.batch import Batch
from sim.cost.calibration import calibration_dir, calibration_sibling, carried_from, describe, load_calibration
from sim.cost.floor import gpu_step_s
from sim.cost.roofline import Efficiencies, RooflineCostModel
from sim.errors import UserError
from sim.spec.hardware import catalogue, get_gpu
from sim.spec.memory import plan_memory
from sim.spec.models import get_model, with_quantization
from sim.spec.quantization import METHODS

# relative slack for float rounding and for the efficiency tables' interpolation between their
# measured token counts, on an axis whose kink moves with the peaks (``sim.cost.tables.Axis``)
REL = 1e-6


def _profiled() -> set[str]:
    return {p.stem for p in calibration_dir().glob("*.json")}


def _siblings() -> list[str]:
    return sorted(k for k in catalogue() if calibration_sibling(k) is not None)


@pytest.mark.parametrize("gkey", sorted(catalogue()))
def test_every_gpu_has_its_own_profile_or_a_sibling_of_its_architecture(gkey):
    """A GPU whose architecture has a measured profile never runs the default efficiencies:
    it has its own profile, or names a profiled GPU of that architecture (no chains)."""
    entry, profiled = catalogue()[gkey], _profiled()
    arch = entry.get("architecture")
    assert arch, f"catalog/gpus.yaml:{gkey}: no architecture"
    sibling = entry.get("calibration_sibling")
    if gkey in profiled:
        assert sibling is None, f"{gkey} has its own profile and names a sibling"
        return
    same_arch = sorted(g for g in profiled if catalogue().get(g, {}).get("architecture") == arch)
    if same_arch:
        assert sibling in same_arch, f"{gkey} ({arch}): no calibration_sibling among {same_arch}"
    assert sibling is None or sibling in same_arch, f"{gkey}: sibling {sibling!r} is no profiled {arch} GPU"
    cal = load_calibration(gkey)
    assert (cal is None) == (sibling is None)
    if cal is not None:
        assert cal.measured_on == sibling and cal.gpu == gkey


@pytest.mark.parametrize("gkey", _siblings())
def test_a_sibling_inherits_the_measured_efficiencies_at_its_own_peaks(gkey):
    sibling = calibration_sibling(gkey)
    own, donor = load_calibration(gkey), load_calibration(sibling)
    gpu = get_gpu(gkey)
    # the tables' axes stay the measured GPU's: the efficiency at a shape is the one measured
    assert own.raw["peaks"] == donor.raw["peaks"]
    assert json.dumps(own.raw["gemm"]["log_eff"]) == json.dumps(donor.raw["gemm"]["log_eff"])
    wave = own.raw["gemm"].get("wave")
    assert wave is None or wave["sms"] == gpu.num_sms
    line = describe(own, carried_from(own))
    assert f"{sibling}'s measured efficiencies" in line and "uncalibrated" not in line
    # the donor's own file is untouched (the inherited copy is a fresh parse)
    assert donor.raw["peaks"] == json.loads((calibration_dir() / f"{sibling}.json").read_text())["peaks"]


def test_gb200_inherits_b200_and_explain_says_so():
    assert calibration_sibling("gb200") == "b200"
    line = describe(load_calibration("gb200"), carried_from(load_calibration("gb200")))
    assert line.startswith("calibrated (gb200: b200's measured efficiencies, same architecture sm_100")
    assert "gemm_nvfp4" in line


# every peak an operator's roofline bound divides by (GPUSpec fields)
PEAK_KEYS = ("bf16_flops_per_s", "hbm_bw_bytes_per_s", "nvlink_bw_bytes_per_s", "fp8_flops_per_s", "fp4_flops_per_s")


def _peak_ratio(gpu, sib) -> float:
    """The most any operator's roofline bound can shrink from ``sib`` to ``gpu``."""
    return max(getattr(gpu, k) / getattr(sib, k) for k in PEAK_KEYS
               if getattr(gpu, k) is not None and getattr(sib, k) is not None)


def _shapes() -> list[Batch]:
    out = [Batch(prefill_chunks=((c, x),), num_logits=1) for c, x in ((1, 0), (64, 0), (512, 0), (2048, 1000), (8192, 0))]
    out += [Batch(num_decode_seqs=b, decode_context_tokens=b * ctx, num_logits=b)
            for b, ctx in ((1, 100), (8, 2000), (64, 500), (256, 1500), (1024, 3000))]
    out.append(Batch(num_decode_seqs=32, decode_context_tokens=32 * 700, prefill_chunks=((256, 0),), num_logits=33))
    return out


def _fits(m, gpu, tp: int) -> bool:
    try:
        plan_memory(m, gpu, tp, 16, 0.9, 8192, 256, 1)
    except UserError:
        return False
    return True


@pytest.mark.parametrize("gkey", _siblings())
def test_a_siblings_step_never_beats_its_donors_by_more_than_their_peaks(gkey):
    """Each step on the inheriting GPU takes at least the donor's time over the largest ratio of
    their peaks (BF16, FP8, FP4, HBM, GPU-GPU link): the same kernels cannot gain more than the
    hardware does. GB200 at default efficiencies ran 1.5-2x faster than B200."""
    sibling = calibration_sibling(gkey)
    gpu, sib = get_gpu(gkey), get_gpu(sibling)
    cal, sib_cal = load_calibration(gkey), load_calibration(sibling)
    ratio = _peak_ratio(gpu, sib)
    count, worse = 0, []
    for mkey in ("llama-3.1-8b", "qwen3-30b-a3b", "llama-3.3-70b"):
        for quant in (None, "fp8", "modelopt_fp4"):
            m = get_model(mkey)
            try:
                if quant:
                    m = with_quantization(m, quant, "test")
                    METHODS[quant].check_gpu(gpu)
                    METHODS[quant].check_gpu(sib)
            except UserError:
                continue
            for tp in (1, 2, 4, 8):
                if not (_fits(m, gpu, tp) and _fits(m, sib, tp)):
                    continue
                a = RooflineCostModel(m, gpu, tp, 1, Efficiencies(), calibration=cal)
                b = RooflineCostModel(m, sib, tp, 1, Efficiencies(), calibration=sib_cal)
                for batch in _shapes():
                    t, t_sib = gpu_step_s(a, batch), gpu_step_s(b, batch)
                    count += 1
                    if t_sib / t > ratio * (1 + REL):
                        worse.append(f"{mkey}/{quant or 'bf16'}/tp{tp} {batch}: {t_sib / t:.3f}x > {ratio:.3f}x")
                break  # the smallest TP that fits both
    assert count >= 12
    assert not worse, f"{len(worse)} steps faster than the peaks allow, e.g.\n" + "\n".join(worse[:8])
