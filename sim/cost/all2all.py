"""The MoE all-to-all of expert parallelism over data-parallel attention: dispatch and combine.

Why: with vLLM ``--data-parallel-size D --enable-expert-parallel`` every MoE layer sends each
token's hidden state to the GPUs holding its top-k routed experts (dispatch) and brings the
experts' outputs back (combine), through DeepEP / pplx kernels (vLLM ``all2all_backend``;
``FusedMoEParallelConfig.use_all2all_kernels``: ``dp_size > 1 and use_ep``). A pure function
of the shape, so it can be checked by hand (tests/test_dp_expert_parallel.py).

Bytes per GPU and layer, one direction each:

- dispatch: tokens x (top_k x fraction of the experts held elsewhere) copies of the hidden
  state; DeepEP's low-latency kernels send one copy per (token, expert) pair (their receive
  buffer is ``num_max_dispatch_tokens_per_rank x num_topk`` deep). With routing uniform over
  ``ep`` GPUs of E/ep experts each, a copy leaves the GPU with probability (ep - 1)/ep; it
  stays within its node (``gpus_per_node``, sim/spec/nodes.py) with probability
  (min(ep, node) - 1)/ep. In fp8 when the
  model's linear layers run fp8 W8A8: vLLM quantizes the dispatch input in 128-value blocks
  (``DEEPEP_QUANT_BLOCK_SIZE``; one fp32 scale per block, DeepEP's FP8 dispatch), else in the
  activation dtype.
- combine: the same copies back in bf16 (DeepEP: "FP8 dispatching and BF16 combining",
  docs/legacy.md, the DeepSeek-V3/R1 setting).

Time per direction: max(intra-node bytes / NVLink, inter-node bytes / NIC) (DeepEP forwards
NVLink and RDMA traffic concurrently; its measured bottleneck is the slower domain: 153-158
GB/s of H800's ~160 GB/s NVLink at EP8, 43-58 GB/s of a 400 Gb/s CX7 NIC's ~50 GB/s at
EP16-64, DeepEP docs/legacy.md "Performance"), plus one per-call latency (NCCL-class launch and
synchronisation, the all-reduce's ``Efficiencies.allreduce_latency_s``).

Load imbalance: a GPU sends the mean's bytes (its own tokens), but the GPU holding the most
requested experts receives ``expert_load_imbalance`` x the mean in dispatch and sends as much
back in combine, and the collective ends when it does: the byte terms of the time are scaled
by the knob (the bytes reported are the mean's).

NOTE: DeepEP's high-throughput (prefill) kernels send a token once per destination GPU, not
once per expert; the per-expert count is an upper bound for them. Routing is otherwise taken
uniform over the GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

# vLLM's DeepEP prepare step quantizes dispatch inputs in 128-value blocks, one fp32 scale each
# (vllm/model_executor/layers/fused_moe/deepep_*_prepare_finalize.py DEEPEP_QUANT_BLOCK_SIZE)
FP8_BLOCK_VALUES = 128
FP8_SCALE_BYTES = 4
COMBINE_VALUE_BYTES = 2  # bf16 (DeepEP: "BF16 combining")


@dataclass(frozen=True)
class All2AllLinks:
    """The links one GPU's all-to-all uses: NVLink within its node, its NIC beyond."""

    nvlink_bytes_per_s: float
    nic_bytes_per_s: float
    gpus_per_node: int
    latency_s: float


def dispatch_bytes_per_copy(hidden: int, fp8: bool, act_bytes: int) -> float:
    """Bytes of one token's hidden state as dispatched: fp8 values plus a 4-byte scale per 128
    (vLLM's DeepEP fp8 dispatch), else ``act_bytes`` per value."""
    if fp8:
        return hidden + -(-hidden // FP8_BLOCK_VALUES) * FP8_SCALE_BYTES
    return float(hidden * act_bytes)


def off_gpu_copies(top_k: int, ep: int, gpus_per_node: int) -> tuple[float, float]:
    """(copies to other GPUs of the node, copies to other nodes) per token, in expectation:
    top_k experts, each on a GPU drawn uniformly from ``ep`` (E/ep experts each)."""
    local = min(ep, gpus_per_node)
    return top_k * (local - 1) / ep, top_k * (ep - local) / ep


def all2all_layer_bytes(tokens: float, hidden: int, top_k: int, ep: int, gpus_per_node: int,
                        fp8_dispatch: bool, act_bytes: int) -> tuple[float, float, float, float]:
    """(dispatch intra-node, dispatch inter-node, combine intra-node, combine inter-node) bytes
    one GPU sends per MoE layer for ``tokens`` tokens of its own."""
    intra, inter = off_gpu_copies(top_k, ep, gpus_per_node)
    d = tokens * dispatch_bytes_per_copy(hidden, fp8_dispatch, act_bytes)
    c = tokens * hidden * COMBINE_VALUE_BYTES
    return d * intra, d * inter, c * intra, c * inter


def all2all_layer_s(tokens: float, hidden: int, top_k: int, ep: int, links: All2AllLinks,
                    fp8_dispatch: bool, act_bytes: int, load_imbalance: float = 1.0) -> float:
    """Seconds of one MoE layer's dispatch plus combine for ``tokens`` tokens per GPU (0 when
    nothing moves); the busiest GPU moves ``load_imbalance`` x the mean's bytes."""
    if ep <= 1 or tokens <= 0:
        return 0.0
    di, dx, ci, cx = all2all_layer_bytes(tokens, hidden, top_k, ep, links.gpus_per_node, fp8_dispatch, act_bytes)
    nv, nic = links.nvlink_bytes_per_s / load_imbalance, links.nic_bytes_per_s / load_imbalance
    dispatch = links.latency_s + max(di / nv, dx / nic)
    combine = links.latency_s + max(ci / nv, cx / nic)
    return dispatch + combine
