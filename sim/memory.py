"""GPU memory plan: weights, activation reserve, and the KV blocks left over.

Why: vLLM sizes its KV cache as ``gpu_memory_utilization * memory - weights - peak
activations - non-torch memory`` and divides by the block size (vLLM ``determine_num_available_blocks``);
that block count, not the weights, caps concurrency.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.errors import UserError
from sim.hardware import GPUSpec
from sim.models import ModelSpec

GIB = 1024**3
# NOTE: CUDA context, NCCL buffers and the allocator's slack outside PyTorch tensors; vLLM
# measures it at start-up, aiconfigurator budgets 0.34-0.39 GiB NCCL memory plus more; 1 GiB here.
NON_TORCH_BYTES = 1 * GIB


@dataclass(frozen=True)
class MemoryPlan:
    """Per-GPU memory budget of one replica (tensor-parallel group)."""

    memory_bytes: int
    usable_bytes: float
    weight_bytes_per_gpu: float
    activation_reserve_bytes: float
    kv_block_bytes_per_gpu: int
    num_kv_blocks: int
    block_size: int

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_kv_blocks * self.block_size


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads are split across TP ranks, and replicated when tp exceeds them (vLLM)."""
    return max(1, model.num_kv_heads // tp)


def plan_memory(model: ModelSpec, gpu: GPUSpec, tp: int, block_size: int,
                gpu_memory_utilization: float, max_num_batched_tokens: int, max_num_seqs: int,
                kv_dtype_bytes: int | None = None, where: str = "scenario") -> MemoryPlan:
    """Size the KV cache; a model that does not fit is a ``UserError`` naming the numbers."""
    b = model.dtype_bytes
    kvb = kv_dtype_bytes or b
    weights = model.num_params * b / tp
    # Peak activations of a profiling forward pass of max_num_batched_tokens tokens: the widest
    # live tensors of one layer (hidden in and out, q/k/v, gate+up and its activation), plus
    # fp32 logits for max_num_seqs sequences (vLLM profile_run).
    h, q, I = model.hidden_size, model.q_size / tp, model.intermediate_size / tp
    kv_dim = kv_heads_per_gpu(model, tp) * model.head_dim
    per_token = (2 * h + q + 2 * kv_dim + 3 * I) * b
    activation = max_num_batched_tokens * per_token + max_num_seqs * model.vocab_size * 4
    reserve = activation + NON_TORCH_BYTES
    usable = gpu.memory_bytes * gpu_memory_utilization
    block_bytes = block_size * 2 * model.num_layers * kv_dim * kvb
    free = usable - weights - reserve
    num_blocks = int(free // block_bytes) if free > 0 else 0
    if num_blocks < 1:
        raise UserError(
            f"{where}: {model.name} does not fit on {gpu.key} with tensor_parallel_size={tp}: "
            f"{gpu_memory_utilization:g} x {gpu.memory_bytes / GIB:.1f} GiB = {usable / GIB:.1f} GiB usable, "
            f"weights {weights / GIB:.1f} GiB + reserve {reserve / GIB:.1f} GiB per GPU leave "
            f"{max(free, 0) / GIB:.2f} GiB, less than one KV block ({block_bytes / 2**20:.2f} MiB)"
        )
    return MemoryPlan(gpu.memory_bytes, usable, weights, reserve, block_bytes, num_blocks, block_size)
