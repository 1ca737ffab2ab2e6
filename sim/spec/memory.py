"""GPU memory plan: weights, activation reserve, and the KV blocks left over.

Why: vLLM sizes its KV cache as ``gpu_memory_utilization * memory - weights - peak
activations - non-torch memory`` and divides by the block size (vLLM ``determine_num_available_blocks``);
that block count, not the weights, caps concurrency. ``memory`` is the total CUDA reports
(``torch.cuda.mem_get_info()[1]``: nvidia-smi's Total less its Reserved; ``GPUSpec.cuda_total_bytes``). Under
pipeline parallelism each stage holds its layers' weights and KV; every worker profiles its own
memory and the engine takes the smallest block count (vLLM ``determine_available_memory`` per
worker, ``min`` over workers in the engine core). Sliding-window layers form their own KV cache
groups whose blocks leave the pool as the window moves on (``kv_groups``, ``sim.core.kv.KVGroups``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.core.kv import KVGroups, blocks_for
from sim.errors import UserError
from sim.spec.hardware import GPUSpec
from sim.spec.model_spec import ModelSpec

GIB = 1024**3
# NOTE: CUDA context, NCCL buffers and the allocator's slack outside PyTorch tensors; vLLM
# measures it at start-up, aiconfigurator budgets 0.34-0.39 GiB NCCL memory plus more; 1 GiB here.
NON_TORCH_BYTES = 1 * GIB


@dataclass(frozen=True)
class MemoryPlan:
    """Per-GPU memory budget of one replica (tensor-parallel group, or its most loaded
    pipeline stage)."""

    memory_bytes: int
    usable_bytes: float
    weight_bytes_per_gpu: float
    activation_reserve_bytes: float
    kv_block_bytes_per_gpu: int
    num_kv_blocks: int
    block_size: int
    stage_layers: tuple[int, ...] = ()          # decoder layers per pipeline stage
    stage_weight_bytes: tuple[float, ...] = field(default=())  # weights per GPU of each stage
    kv_groups: KVGroups = KVGroups()            # vLLM's KV cache groups (sliding-window layers)
    layers_per_group: int = 0                   # layers whose pages make one block id
    # the speculative drafter's weights per GPU (sim/cost/speculative.py
    # ``draft_weight_bytes_per_gpu``), loaded before the KV cache is sized
    draft_weight_bytes_per_gpu: float = 0.0

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens of KV the blocks hold while every group grows (contexts within the sliding
        window; beyond it sliding groups stop growing): vLLM's logged "GPU KV cache size",
        num_blocks // groups x block_size."""
        g = self.kv_groups
        return self.num_kv_blocks // (g.full + g.sliding) * self.block_size


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads are split across TP ranks, and replicated when tp exceeds them (vLLM)."""
    return max(1, model.num_kv_heads // tp)


def kv_groups(model: ModelSpec, block_size: int) -> tuple[KVGroups, int]:
    """vLLM V1's KV cache groups of ``model`` and the layers in each
    (vllm/v1/core/kv_cache_utils.py): one group of every layer when all layers share one
    attention type (all full, or all sliding: ``_get_kv_cache_config_uniform_type``); else
    groups of ``group_size`` layers, the smaller type's layer count (the larger's when it is
    under 1.5 x the smaller), the last group of a type padded
    (``_get_kv_cache_groups_uniform_page_size``)."""
    L = model.num_layers
    s = model.num_sliding_layers if model.sliding_window else 0
    if s == 0:
        return KVGroups(), L
    window_blocks = blocks_for(model.sliding_window - 1, block_size) + 1
    f = L - s
    if f == 0:
        return KVGroups(full=0, sliding=1, window_blocks=window_blocks, window=model.sliding_window), L
    lo, hi = min(f, s), max(f, s)
    size = hi if hi < 1.5 * lo else lo
    return KVGroups(full=-(-f // size), sliding=-(-s // size), window_blocks=window_blocks,
                    window=model.sliding_window), size


def stage_layers(num_layers: int, pp: int) -> tuple[int, ...]:
    """Decoder layers per pipeline stage as vLLM partitions them (``get_pp_indices``):
    L // pp each, the remainder one by one to the stages before the last, from the back."""
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return tuple(parts)


def stage_weight_params(model: ModelSpec, pp: int) -> tuple[int, ...]:
    """Weights of each stage: its layers; the embedding on the first stage; the final norm and
    the LM head on the last (a tied head is a separate copy there when pp > 1, vLLM PPMissingLayer)."""
    layers = stage_layers(model.num_layers, pp)
    h = model.hidden_size
    final = h * (2 if model.norm_bias else 1) + model.extra_params
    head = model.lm_head_params
    if pp > 1 and model.tie_word_embeddings:
        head += model.vocab_size * h
    out, start = [], 0
    for s, n in enumerate(layers):
        p = sum(model.layer_params(i) for i in range(start, start + n))
        if s == 0:
            p += model.embedding_params
        if s == pp - 1:
            p += head + final
        out.append(p)
        start += n
    return tuple(out)


def plan_memory(model: ModelSpec, gpu: GPUSpec, tp: int, block_size: int,
                gpu_memory_utilization: float, max_num_batched_tokens: int, max_num_seqs: int,
                kv_dtype_bytes: int | None = None, where: str = "scenario", pp: int = 1,
                kv_memory_basis: str = "total", hybrid_kv: bool = True, expert_dp: int = 1,
                draft_weight_bytes_per_gpu: float = 0.0) -> MemoryPlan:
    """Size the KV cache; a model that does not fit is a ``UserError`` naming the numbers.

    ``kv_memory_basis`` says what ``gpu_memory_utilization`` is a fraction of: ``"total"``
    (vLLM, SGLang: the KV cache gets ``fraction x memory - weights - reserve``) or ``"free"``
    (TensorRT-LLM's ``free_gpu_memory_fraction``: "90% of free GPU memory (after loading
    weights)", docs/source/examples/kvcacheconfig.md; the KV cache gets
    ``fraction x (memory - weights - reserve)``). ``hybrid_kv`` False charges sliding-window
    layers in full, as vLLM does with its hybrid KV cache manager disabled
    (``unify_hybrid_kv_cache_specs``: one group of every layer). ``expert_dp`` > 1: the routed
    experts are spread over ``expert_dp`` x ``tp`` GPUs (data-parallel attention with expert
    parallelism, sim/cost/dp_ep.py); everything else is split over ``tp`` only.
    ``draft_weight_bytes_per_gpu``: a speculative drafter's weights on each GPU (one pipeline
    stage: the scenario refuses speculative decoding with pp > 1). vLLM loads the drafter with
    the target (GPUModelRunner.load_model: ``self.drafter.load_model(self.model)``) inside the
    memory profiler that measures the weights, and sizes the KV cache from what is left
    (v1/worker/gpu_worker.py ``determine_available_memory``: requested memory less
    ``non_kv_cache_memory``, the weights included): they come out of the KV cache."""
    b = model.dtype_bytes
    kvb = kv_dtype_bytes or b
    # quantized linear layers at their own width: the model's mean bytes per weight
    # (NOTE: a pipeline stage is assumed to hold the model's mix of linear and other weights)
    b_w = model.weight_bytes() / model.num_params
    stage_w = tuple(p * b_w / tp for p in stage_weight_params(model, pp))
    if expert_dp > 1:  # one stage (the scenario check refuses pp > 1 with data_parallel_size > 1)
        routed = model.num_moe_layers * model.num_experts * model.expert_params * model.linear_weight_bytes_per_param
        stage_w = tuple(w - routed * (1 - 1 / expert_dp) / tp for w in stage_w)
    layers = stage_layers(model.num_layers, pp)
    # Peak activations of a profiling forward pass of max_num_batched_tokens tokens: the widest
    # live tensors of one layer (hidden in and out, q/k/v, gate+up and its activation), plus
    # fp32 logits for max_num_seqs sequences (vLLM profile_run).
    h, q, I = model.hidden_size, model.q_size / tp, model.intermediate_size / tp
    kv_dim = kv_heads_per_gpu(model, tp) * model.head_dim
    per_token = (2 * h + q + 2 * kv_dim + 3 * I) * b
    activation = max_num_batched_tokens * per_token + max_num_seqs * model.vocab_size * 4
    reserve = activation + NON_TORCH_BYTES
    # the memory the engine may fill (weights, reserve, KV); under the "free" basis the fraction
    # applies to what the weights and the reserve leave
    usable = gpu.cuda_total_bytes * gpu_memory_utilization if kv_memory_basis == "total" else None
    kv_layer_gpu = model.kv_bytes_per_token_per_gpu(tp, kvb) / model.num_layers
    # A block id is one page (block_size tokens) of one KV cache group's layers.
    # NOTE: under pipeline parallelism a stage's share of each group is taken as
    # group layers x stage layers / all layers, rounded up.
    groups, group_layers = kv_groups(model, block_size) if hybrid_kv else (KVGroups(), model.num_layers)
    best = None
    for s, (w, n) in enumerate(zip(stage_w, layers)):
        block_bytes = int(round(block_size * -(-group_layers * n // model.num_layers) * kv_layer_gpu))
        w += draft_weight_bytes_per_gpu
        free = usable - w - reserve if kv_memory_basis == "total" else \
            gpu_memory_utilization * (gpu.cuda_total_bytes - w - reserve)
        blocks = int(free // block_bytes) if free > 0 else 0
        if best is None or blocks < best[0]:
            best = (blocks, block_bytes, w, free, s)
    num_blocks, block_bytes, weights, free, s = best
    if usable is None:
        usable = weights + free + reserve
    if num_blocks < 1:
        stage = f" (pipeline stage {s} of {pp})" if pp > 1 else ""
        if draft_weight_bytes_per_gpu:
            stage += f" (the speculative drafter's {draft_weight_bytes_per_gpu / GIB:.2f} GiB in the weights)"
        if kv_memory_basis == "total":
            budget = (f"{gpu_memory_utilization:g} x {gpu.cuda_total_bytes / GIB:.2f} GiB = {usable / GIB:.1f} GiB usable, "
                      f"weights {weights / GIB:.1f} GiB + reserve {reserve / GIB:.1f} GiB per GPU{stage} leave ")
        else:
            budget = (f"{gpu.cuda_total_bytes / GIB:.2f} GiB less weights {weights / GIB:.1f} GiB and reserve "
                      f"{reserve / GIB:.1f} GiB per GPU{stage}, times {gpu_memory_utilization:g}, leave ")
        raise UserError(
            f"{where}: {model.name} does not fit on {gpu.key} with tensor_parallel_size={tp}"
            f"{f', pipeline_parallel_size={pp}' if pp > 1 else ''}: {budget}"
            f"{max(free, 0) / GIB:.2f} GiB, less than one KV block ({block_bytes / 2**20:.2f} MiB)"
        )
    return MemoryPlan(gpu.cuda_total_bytes, usable, max(stage_w), reserve, block_bytes, num_blocks, block_size,
                      layers, stage_w, groups, group_layers, draft_weight_bytes_per_gpu)
