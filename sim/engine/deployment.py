"""From a scenario to the objects of one replica: model, GPU, memory plan, cost model, limits.

Why: ``run``, ``explain`` and tests build a deployment the same way, in one place.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from sim.cost.calibration import load_calibration
from sim.cost.engine_profile import get_profile, in_process_frontend, without_frontend
from sim.cost.roofline import Efficiencies, RooflineCostModel
from sim.errors import UserError
from sim.spec.hardware import GPUSpec, scenario_gpu
from sim.spec.memory import MemoryPlan, plan_memory
from sim.spec.nodes import NodeLinks, boundary_crosses, check_placement, node_links
from sim.spec.models import ModelSpec, get_model, with_quantization
from sim.policies import EngineLimits, Scheduler, get_policy
from sim.policies.budget import budget_error, engine_limits, policy_engines, profile_release, vllm_default_limits
from sim.core.kv import CPUTier, KVBlockManager
from sim.scenario import Scenario

if TYPE_CHECKING:
    from sim.cost.all2all import All2AllLinks


@dataclass(frozen=True)
class Deployment:
    model: ModelSpec
    gpu: GPUSpec
    tp: int
    memory: MemoryPlan
    limits: EngineLimits
    cost: RooflineCostModel
    kv_dtype_bytes: int

    prefix_caching: bool = False
    pp: int = 1
    dp: int = 1  # data-parallel ranks whose MoE layers span them all (sim/cost/dp_ep.py)
    nodes: NodeLinks | None = None  # node size and inter-node link (sim/spec/nodes.py)
    kv_offload_blocks: int = 0  # blocks of the CPU offloading tier (engine.kv_offloading_size); 0: off

    def new_scheduler(self, policy: str | type[Scheduler]) -> Scheduler:
        cls = get_policy(policy).scheduler if isinstance(policy, str) else policy
        kv = KVBlockManager(self.memory.num_kv_blocks, self.memory.block_size, self.prefix_caching,
                            self.memory.kv_groups, uncached_to_head=self.limits.vllm_release == "0.34")
        if self.kv_offload_blocks:
            kv.offload = CPUTier(self.kv_offload_blocks, self.swap_s_per_block, OFFLOAD_LATENCY_S)
        return cls(self.limits, kv)

    @property
    def swap_s_per_block(self) -> float:
        """Seconds to move one KV block between GPU and host: each GPU of the tensor-parallel
        group copies its shard over its own PCIe link (bytes / PCIe bandwidth)."""
        return self.memory.kv_block_bytes_per_gpu / self.gpu.pcie_bw_bytes_per_s


# NOTE: a CPU-tier load's fixed cost: one transfer's launch and completion event, taken as a
# GPU copy's launch + sync, the point-to-point send's (sim/cost/pipeline.py P2P_LATENCY_S)
OFFLOAD_LATENCY_S = 10e-6


def offload_blocks(size_gib: float | None, block_bytes_per_gpu: int, tp: int, pp: int) -> int:
    """Blocks of the CPU offloading tier: ``kv_offloading_size`` GiB summed over the tensor- and
    pipeline-parallel ranks, each rank's share in pages of its KV block (vLLM 0.12
    vllm/config/vllm.py ``_post_init_kv_transfer_config``: kv_bytes_per_rank = size x 2^30 /
    (tp x pp); vllm/v1/kv_offload/cpu.py ``CPUOffloadingSpec`` num_cpu_blocks)."""
    if not size_gib:
        return 0
    return int(size_gib * (1 << 30) / (tp * pp) // block_bytes_per_gpu)


# Cost models shared by the deployments built while ``shared_cost_models`` is on (None: off),
# by their inputs; at most MAX_SHARED_COST_MODELS, the oldest dropped first.
_shared: dict[str, object] | None = None
MAX_SHARED_COST_MODELS = 8


@contextmanager
def shared_cost_models() -> Iterator[None]:
    """Within the block, deployments built with the same cost inputs (model, GPU, TP, KV dtype,
    calibration, engine profile, parallelism) share one cost model, with its memos.

    Why: a sweep, a comparison or a capacity search runs many simulations of one configuration
    in a process. Each new cost model fills its memos again (step costs by shape, solo prefill
    times), and for a 500-request run that is ~25% of its CPU. The memos hold pure functions of
    those inputs: a warm memo returns the same floats as a cold one
    (tests/test_cost_memo.py), so outputs are unchanged. Outside the block every deployment
    gets a fresh cost model (callers that change one, as tests do, are not affected)."""
    global _shared
    outer = _shared
    if outer is None:
        _shared = {}
    try:
        yield
    finally:
        _shared = outer


def share_cost_models_in_this_process() -> None:
    """``shared_cost_models`` for the rest of this process (a sweep's worker process)."""
    global _shared
    if _shared is None:
        _shared = {}


def _spec_limits(e, model: ModelSpec) -> dict[str, int]:
    """The scheduler's speculative-decoding knobs (EngineLimits): none when off."""
    sc = e.speculative_config
    if sc is None:
        return {}
    from sim.cost.speculative import lookahead_tokens, tokens_per_step_milli

    if model.num_sliding_layers:
        raise UserError(f"engine.speculative_config: {model.name} has sliding-window layers; speculative decoding "
                        "is modelled for full-attention KV only")
    return {"num_speculative_tokens": sc.num_speculative_tokens,
            "spec_tokens_per_step_milli": tokens_per_step_milli(sc),
            "num_lookahead_tokens": lookahead_tokens(sc.method, sc.num_speculative_tokens)}


def build_deployment(s: Scenario, gpu_key: str | None = None, tp: int | None = None,
                     where: str = "scenario") -> Deployment:
    """The replica of ``s`` (or of one of its disaggregated pools: ``gpu_key``, ``tp``)."""
    e = s.engine
    model = get_model(s.model if isinstance(s.model, str) else s.model.model_dump(), Path(s.base_dir))
    model = with_quantization(model, e.quantization, "engine.quantization")
    gpu = scenario_gpu(s.hardware, gpu_key)
    tp = tp or s.cluster.tensor_parallel_size
    # vLLM shards attention heads over TP ranks: heads must divide evenly, and KV heads must
    # divide evenly or be replicated a whole number of times.
    if model.num_heads % tp or (model.num_kv_heads % tp and tp % model.num_kv_heads):
        key = "cluster.tensor_parallel_size" if where == "scenario" else f"{where}.tensor_parallel_size"
        raise UserError(f"{key}: {tp} does not divide {model.name}'s {model.num_heads} attention heads and "
                        f"{model.num_kv_heads} KV heads evenly (vLLM requires it)")
    pp = s.cluster.pipeline_parallel_size if where == "scenario" else 1
    if pp > model.num_layers:
        raise UserError(f"cluster.pipeline_parallel_size: {pp} stages for {model.name}'s {model.num_layers} layers")
    dp = s.cluster.data_parallel_size if where == "scenario" else 1
    if dp > 1 and model.num_experts <= 1:
        raise UserError(f"cluster.data_parallel_size: {dp} needs a MoE model ({model.name} is dense): data-parallel "
                        "attention with expert parallelism spreads the experts over the ranks; for independent "
                        "copies of a dense model use cluster.replicas")
    kv_bytes = 1 if e.kv_cache_dtype == "fp8" else model.dtype_bytes
    max_model_len, budget, max_num_seqs = _checked_lengths(s, model, gpu, where)
    engine = engine_profile(e)
    sc = e.speculative_config
    draft_spec = None  # the draft model's ModelSpec (method draft_model)
    draft_bytes = 0.0  # the drafter's weights per GPU, out of the KV cache (sim/cost/speculative.py)
    if sc is not None:
        from sim.cost.speculative import draft_weight_bytes_per_gpu

        if sc.model is not None:
            try:
                draft_spec = get_model(sc.model, Path(s.base_dir))
            except UserError as err:  # named by its key (get_model's line says ``model:``)
                raise UserError(f"engine.speculative_config.model: {str(err).removeprefix('model: ')}") from None
            draft_spec = with_quantization(draft_spec, e.quantization, "engine.quantization")
        if sc.draft_vocab_size is not None and sc.draft_vocab_size > model.vocab_size:
            raise UserError(f"engine.speculative_config.draft_vocab_size: {sc.draft_vocab_size} is more than the "
                            f"target's vocabulary ({model.vocab_size} tokens)")
        draft_bytes = draft_weight_bytes_per_gpu(sc.method, model, tp, draft_spec, sc.draft_vocab_size)
    # A disaggregated pool runs with a KV connector; vLLM then disables its hybrid KV cache
    # manager (VllmConfig: "Hybrid KV cache manager is not compatible with KV transfer"; later
    # versions keep it only for connectors marked SupportsHMA), so sliding-window layers are
    # charged in full there. NOTE: the connector is assumed not to support it.
    mem = plan_memory(model, gpu, tp, e.block_size, e.gpu_memory_utilization,
                      budget, max_num_seqs, kv_bytes, where=where, pp=pp, kv_memory_basis=engine.kv_memory_basis,
                      hybrid_kv=where == "scenario" and e.kv_offloading_size is None, expert_dp=dp,
                      draft_weight_bytes_per_gpu=draft_bytes)
    # CPU offloading (engine.kv_offloading_size) sets up a KV connector too (vLLM 0.12
    # ``_post_init_kv_transfer_config``), so the hybrid manager is off as above (vLLM 0.11
    # vllm/config/__init__.py ``VllmConfig.__post_init__``: "Hybrid KV cache manager is not
    # compatible with KV transfer"): sliding-window layers hold full-attention KV
    cpu_blocks = offload_blocks(e.kv_offloading_size, mem.kv_block_bytes_per_gpu, tp, pp)
    # None: roofline with default efficiencies
    cal = load_calibration(gpu.key) if s.hardware.cost_model == "calibrated" else None
    limits = EngineLimits(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        long_prefill_token_threshold=e.long_prefill_token_threshold,
        max_num_partial_prefills=e.max_num_partial_prefills,
        preemption_mode=e.preemption_mode,
        num_scheduler_steps=e.num_scheduler_steps,
        separate_prefill_steps=e.separate_prefill_steps,
        capacity_scheduler_policy=e.capacity_scheduler_policy,
        admission=e.admission,
        vllm_release=engine.vllm_release,
        ignore_eos=s.workload.max_tokens == "output",
        scheduling_policy=e.scheduling_policy,
        **_spec_limits(e, model),
    )
    c = s.cluster
    nodes = node_links(c, gpu)
    check_placement(nodes, tp, pp, dp, "cluster" if where == "scenario" else where)
    link = pipeline_links(s, gpu, tp, nodes) if pp > 1 else None
    key = None
    if _shared is not None:  # every input of the cost model below (frozen dataclasses: their reprs)
        key = repr((model, gpu, tp, kv_bytes, id(cal), engine, c.enable_expert_parallel, c.expert_load_imbalance, dp,
                    pp, link, nodes, e.speculative_config))
        hit = _shared.get(key)
        if hit is not None:
            return Deployment(model, gpu, tp, mem, limits, hit, kv_bytes, e.enable_prefix_caching, pp, dp, nodes,
                              cpu_blocks)

    def make_cost(m: ModelSpec) -> RooflineCostModel:
        if dp > 1:
            # imported here, as the pipeline's model below: a plain run needs neither (start-up)
            from sim.cost.dp_ep import DataParallelEPCostModel

            return DataParallelEPCostModel(m, gpu, tp, kv_bytes, Efficiencies(), calibration=cal, engine=engine,
                                           expert_load_imbalance=c.expert_load_imbalance, dp=dp,
                                           links=all2all_links(gpu, tp * dp, nodes), nodes=nodes)
        return RooflineCostModel(m, gpu, tp, kv_bytes, Efficiencies(), calibration=cal, engine=engine,
                                 enable_expert_parallel=c.enable_expert_parallel,
                                 expert_load_imbalance=c.expert_load_imbalance, nodes=nodes)

    if link is None:
        cost = make_cost(model)
        if sc is not None:  # (the scenario allows it with one pipeline stage only)
            from sim.cost.speculative import SpeculativeCost

            draft = make_cost(draft_spec) if draft_spec is not None else None
            cost.spec_run = SpeculativeCost(make_cost(model), sc.method, sc.num_speculative_tokens, draft,
                                            sc.draft_vocab_size)
    else:
        from sim.cost.pipeline import PipelineCostModel

        cost = PipelineCostModel(model, pp, make_cost, link[0][0], boundary_links=link)
    if _shared is not None:
        if len(_shared) >= MAX_SHARED_COST_MODELS:
            _shared.pop(next(iter(_shared)))  # the oldest
        _shared[key] = cost
    return Deployment(model, gpu, tp, mem, limits, cost, kv_bytes, e.enable_prefix_caching, pp, dp, nodes, cpu_blocks)


def pipeline_links(s: Scenario, gpu: GPUSpec, tp: int, nodes: NodeLinks) -> tuple[tuple[float, float], ...]:
    """(bytes/s per GPU, latency s) of each stage-to-stage send: ``cluster.pipeline_link_gb_per_s``
    for every boundary when given; else the GPU's NVLink within a node and the inter-node link
    between nodes (sim/spec/nodes.py ``boundary_crosses``: TP innermost, then PP), each send
    paying its link's per-message latency (NVLink: NCCL send/recv launch + sync, P2P_LATENCY_S)."""
    from sim.cost.pipeline import P2P_LATENCY_S

    pp = s.cluster.pipeline_parallel_size
    if s.cluster.pipeline_link_gb_per_s is not None:
        return ((s.cluster.pipeline_link_gb_per_s * 1e9, P2P_LATENCY_S),) * (pp - 1)
    return tuple((nodes.inter_bytes_per_s, nodes.inter_latency_s) if x else (gpu.nvlink_bw_bytes_per_s, P2P_LATENCY_S)
                 for x in boundary_crosses(nodes, tp, pp))


def all2all_links(gpu: GPUSpec, ep: int, nodes: NodeLinks) -> All2AllLinks:
    """The links of the MoE all-to-all over ``ep`` GPUs (sim/cost/all2all.py): the GPU's NVLink
    within its node, the inter-node link beyond (``nodes``: the scenario's node size and
    network), both at the link efficiency the all-reduce uses (0.8; DeepEP measured 153 GB/s
    over H800's 200 GB/s-per-direction NVLink at EP8, 0.77, and 43 GB/s over a 50 GB/s CX7 NIC
    at EP16, 0.86: docs/legacy.md "Performance"); the per-call latency is the all-reduce's
    within a node and the network's per-message latency when the ranks span nodes. Ranks are
    laid out node by node (sim/spec/nodes.py)."""
    from sim.cost.all2all import All2AllLinks

    eff = Efficiencies()
    latency = nodes.inter_latency_s if ep > nodes.gpus_per_node else eff.allreduce_latency_s
    return All2AllLinks(gpu.nvlink_bw_bytes_per_s * eff.link, nodes.inter_bytes_per_s * eff.link,
                        nodes.gpus_per_node, latency)


def engine_profile(e):
    """The scenario's engine profile with its ``engine.overhead`` overrides; the older keys
    ``step_overhead_ms`` (both fixed terms) and ``per_seq_overhead_ms`` still apply, under
    ``engine.overhead``'s own keys."""
    over = e.overhead.model_dump()
    if e.step_overhead_ms is not None:
        for k in ("prefill_step_ms", "decode_step_ms"):
            over[k] = e.step_overhead_ms if over[k] is None else over[k]
    if e.per_seq_overhead_ms is not None and over["per_seq_ms"] is None:
        over["per_seq_ms"] = e.per_seq_overhead_ms
    if e.attention_backend is not None:
        over["attention_backend"] = e.attention_backend
    p = get_profile(e.profile, over)
    # the front end (issue 37): none offline; in the engine's thread, part of its steps
    if not e.api_server:
        p = without_frontend(p)
    elif not p.frontend_overlap:
        p = in_process_frontend(p, e.stream_interval)
    return replace(p, num_scheduler_steps=e.num_scheduler_steps) if e.num_scheduler_steps > 1 else p


def engine_lengths(s: Scenario) -> tuple[int, int, int]:
    """(max_model_len, max_num_batched_tokens, max_num_seqs) every replica of ``s`` runs with:
    what its resolved scenario writes (``Scenario.resolved``), set, so the resolved file runs
    with the same."""
    return _checked_lengths(s, get_model(s.model if isinstance(s.model, str) else s.model.model_dump(),
                                         Path(s.base_dir)), scenario_gpu(s.hardware))


def _checked_lengths(s: Scenario, model: ModelSpec, gpu: GPUSpec,
                     where: str = "scenario") -> tuple[int, int, int]:
    """(max_model_len, max_num_batched_tokens, max_num_seqs) as vLLM would accept them, or a
    ``UserError``.

    - ``max_model_len`` above the model's context length is refused unless
      ``engine.allow_long_max_model_len`` (vLLM: VLLM_ALLOW_LONG_MAX_MODEL_LEN=1;
      vllm/config: _get_and_verify_max_len).
    - the budget and ``max_num_seqs`` of this engine (the replica, or the pool ``where``, on
      ``gpu``): their defaults on that GPU and vLLM's start-up rule, for every policy
      (sim/policies/budget.py), now that max_model_len is known.
    """
    e = s.engine
    context = model.max_position_embeddings
    if e.max_model_len is not None and e.max_model_len > context and not e.allow_long_max_model_len:
        raise UserError(f"engine.max_model_len: {e.max_model_len} is above {model.name}'s context length "
                        f"({context} tokens); vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1: set "
                        "engine.allow_long_max_model_len: true to allow it")
    max_len = e.max_model_len or context
    engines = dict(policy_engines(e.policy))
    pool = "engine" if where == "scenario" else where
    chunked = engines.get(pool, False)
    budget, seqs = engine_limits(e, chunked, max_len, vllm_default_limits(gpu, profile_release(e.profile)))
    source = "engine.max_model_len" if e.max_model_len else f"engine.max_model_len (unset: {model.name}'s context length)"
    msg = budget_error(e, pool, chunked, budget, max_len, source, max_num_seqs=seqs)
    if msg:
        raise UserError(msg)
    return max_len, budget, seqs
