"""From a scenario to the objects of one replica: model, GPU, memory plan, cost model, limits.

Why: ``run``, ``explain`` and tests build a deployment the same way, in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from sim.cost.roofline import Efficiencies, RooflineCostModel
from sim.hardware import GPUSpec, get_gpu
from sim.memory import MemoryPlan, plan_memory
from sim.models import ModelSpec, get_model
from sim.policies import POLICIES, EngineLimits, Scheduler
from sim.kv import KVBlockManager
from sim.scenario import Scenario


@dataclass(frozen=True)
class Deployment:
    model: ModelSpec
    gpu: GPUSpec
    tp: int
    memory: MemoryPlan
    limits: EngineLimits
    cost: RooflineCostModel
    kv_dtype_bytes: int

    def new_scheduler(self, policy: str) -> Scheduler:
        return POLICIES[policy](self.limits, KVBlockManager(self.memory.num_kv_blocks, self.memory.block_size))


def build_deployment(s: Scenario) -> Deployment:
    e = s.engine
    model = get_model(s.model if isinstance(s.model, str) else s.model.model_dump(), Path(s.base_dir))
    gpu = get_gpu(s.hardware.gpu)
    tp = s.cluster.tensor_parallel_size
    kv_bytes = 1 if e.kv_cache_dtype == "fp8" else model.dtype_bytes
    mem = plan_memory(model, gpu, tp, e.block_size, e.gpu_memory_utilization,
                      e.max_num_batched_tokens, e.max_num_seqs, kv_bytes, where="scenario")
    eff = Efficiencies()
    if e.step_overhead_ms is not None:
        eff = replace(eff, step_overhead_s=e.step_overhead_ms / 1e3)
    if e.per_seq_overhead_ms is not None:
        eff = replace(eff, per_seq_overhead_s=e.per_seq_overhead_ms / 1e3)
    limits = EngineLimits(
        max_num_seqs=e.max_num_seqs,
        max_num_batched_tokens=e.max_num_batched_tokens,
        max_model_len=e.max_model_len or model.max_position_embeddings,
        long_prefill_token_threshold=e.long_prefill_token_threshold,
        max_num_partial_prefills=e.max_num_partial_prefills,
    )
    return Deployment(model, gpu, tp, mem, limits, RooflineCostModel(model, gpu, tp, kv_bytes, eff), kv_bytes)
