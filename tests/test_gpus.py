"""GPU catalogue breadth, inline GPUs and power caps (issue 11)."""

import pytest

from sim.errors import UserError
from sim.spec.hardware import capped, catalogue, get_gpu
from sim.spec.memory import plan_memory
from sim.spec.models import get_model
from sim.scenario import scenario_from_dict

MIB = 2**20


def test_catalogue_has_the_parts_people_deploy():
    assert {"a100-40g", "a100-80g-pcie", "a10g", "l4", "a40", "h100-pcie", "h100-nvl", "h20", "gh200",
            "h200-nvl", "b200", "gb200", "mi300x", "mi325x"} <= set(catalogue())
    for key in catalogue():
        g = get_gpu(key)
        assert g.source and g.bf16_flops_per_s > 0 and g.num_sms


@pytest.mark.parametrize("key, mib", [
    # nvidia-smi memory.total (kernels_profile/hardware.md cites each log)
    ("h100-sxm", 81_559), ("a100-80g", 81_920), ("a100-40g", 40_960), ("l4", 23_034), ("l40s", 46_068),
    ("h200", 143_771), ("b200", 183_359), ("gh200", 97_871), ("h20", 97_871), ("gb200", 189_471),
])
def test_memory_is_what_the_driver_exposes(key, mib):
    assert get_gpu(key).memory_bytes == mib * MIB


def test_h100_usable_kv_memory_from_cuda_total():
    # CUDA total = nvidia-smi Total 81,559 MiB - Reserved 551 MiB = 81,008 MiB = 79.11 GiB, the
    # total_gpu_memory vLLM logs; usable 0.9 x that. Llama-3-8B bf16: 8,030,261,248 params x 2 B
    m, g = get_model("llama-3-8b"), get_gpu("h100-sxm")
    assert g.cuda_total_bytes == 81_008 * MIB and round(g.cuda_total_bytes / 2**30, 2) == 79.11
    p = plan_memory(m, g, 1, 16, 0.9, 8192, 256)
    assert p.usable_bytes == pytest.approx(0.9 * 81_008 * MIB)
    assert p.weight_bytes_per_gpu == 2 * 8_030_261_248


def test_ridge_points_by_hand():
    assert get_gpu("l4").ridge_flops_per_byte == pytest.approx(121e12 / 300e9)      # 403
    assert get_gpu("h20").ridge_flops_per_byte == pytest.approx(148e12 / 4.0e12)    # 37: decode-friendly
    assert get_gpu("h100-pcie").ridge_flops_per_byte == pytest.approx(756e12 / 2.0e12)


def test_power_cap_scales_peaks():
    g = capped(get_gpu("h100-sxm"), 0.75, 0.9)
    assert g.bf16_flops_per_s == pytest.approx(0.75 * 989e12)
    assert g.fp8_flops_per_s == pytest.approx(0.75 * 1979e12)
    assert g.hbm_bw_bytes_per_s == pytest.approx(0.9 * 3.35e12)
    assert g.memory_bytes == get_gpu("h100-sxm").memory_bytes


def _scn(hardware):
    return scenario_from_dict({"workload": {"synthetic": {"num_requests": 1}}, "hardware": hardware})


def test_inline_gpu_and_cap_reach_the_deployment():
    from sim.engine.deployment import build_deployment

    s = _scn({"custom": {"based_on": "h100-sxm", "name": "h100-64g", "memory_bytes": 64 * 2**30},
              "flops_factor": 0.5, "bandwidth_factor": 0.8})
    d = build_deployment(s)
    assert d.gpu.memory_bytes == 64 * 2**30 and d.gpu.key == "custom:h100-64g"
    assert d.gpu.bf16_flops_per_s == pytest.approx(494.5e12)
    assert d.cost.flops_s == pytest.approx(494.5e12)
    assert d.cost.calibration is None  # an inline GPU has no measured kernels
    full = _scn({"custom": {"name": "x", "bf16_flops_per_s": 100e12, "hbm_bw_bytes_per_s": 1e12,
                            "memory_bytes": 32e9}})
    g = build_deployment(full).gpu
    assert g.nvlink_bw_bytes_per_s == g.pcie_bw_bytes_per_s == 32e9  # no link given: PCIe Gen4


def test_inline_gpu_errors_are_one_line():
    from sim.engine.deployment import build_deployment

    with pytest.raises(UserError, match="hardware.custom: missing bf16_flops_per_s, hbm_bw_bytes_per_s"):
        build_deployment(_scn({"custom": {"name": "x", "memory_bytes": 1e9}}))
    with pytest.raises(UserError, match="not both"):
        _scn({"gpu": "h200", "custom": {"based_on": "h100-sxm"}})
    with pytest.raises(UserError, match="based_on: unknown GPU 'h300'"):
        build_deployment(_scn({"custom": {"based_on": "h300"}}))
    with pytest.raises(UserError, match="flops_factor"):
        _scn({"flops_factor": 1.5})
