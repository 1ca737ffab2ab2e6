"""GPU catalogue and the memory plan."""

import pytest

from sim.errors import UserError
from sim.spec.hardware import catalogue, get_gpu
from sim.spec.memory import plan_memory
from sim.spec.models import get_model


def test_catalogue_has_required_gpus():
    assert {"a100-80g", "h100-sxm", "h200", "b200", "l40s", "mi300x"} <= set(catalogue())


def test_h100_ridge_point():
    # 989 TFLOP/s / 3.35 TB/s = 295 FLOP/B (kernels_profile/hardware.md)
    assert get_gpu("h100-sxm").ridge_flops_per_byte == pytest.approx(295, abs=1)


def test_kv_blocks_from_leftover_memory():
    m, g = get_model("llama-3-8b"), get_gpu("h100-sxm")
    p = plan_memory(m, g, 1, 16, 0.9, 8192, 256)
    block = 16 * m.kv_bytes_per_token()
    assert p.num_kv_blocks == int((g.cuda_total_bytes * 0.9 - p.weight_bytes_per_gpu - p.activation_reserve_bytes) // block)
    # about 58 GB left for KV on an 80 GiB H100: ~440k tokens
    assert 400_000 < p.kv_capacity_tokens < 480_000


def test_tp_divides_weights_and_kv():
    m, g = get_model("llama-3-70b"), get_gpu("h100-sxm")
    p4 = plan_memory(m, g, 4, 16, 0.9, 8192, 256)
    assert p4.weight_bytes_per_gpu == pytest.approx(m.num_params * 2 / 4)
    assert p4.kv_block_bytes_per_gpu == 16 * m.kv_bytes_per_token() // 4


def test_model_that_does_not_fit_names_the_numbers():
    with pytest.raises(UserError) as e:
        plan_memory(get_model("llama-3-70b"), get_gpu("h100-sxm"), 1, 16, 0.9, 8192, 256)
    msg = str(e.value)
    assert "does not fit" in msg and "weights 131.4 GiB" in msg and "71.2 GiB usable" in msg  # 0.9 x 79.11 GiB (CUDA total)
