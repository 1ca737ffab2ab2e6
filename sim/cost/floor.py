"""The roofline floor of a step: the time below which no step of a batch may be priced.

Why: every operator runs at most at the GPU's vendor peaks (Williams, Waterman, Patterson 2009,
"Roofline", CACM 52(4)): a step cannot take less than the sum over its operators of
max(FLOPs / peak, bytes / HBM bandwidth), plus its collectives' bytes at the link's peak. The
floor is read from the simulator's own operators at 100% of peak
(``RooflineCostModel.ideal``: every efficiency 1, no latency term, no kernel floor), so it
counts exactly what a step counts (the experts an MoE layer touches, the LM head on sampled
positions, the KV bytes the engine's attention kernel re-reads); the engine's host overhead
is left out (it is not GPU work). ``tests/test_physical_floors.py`` holds every step of the
catalogue to it: a calibrated efficiency above 1 against the bound it divides (issue 37: the
GEMM wave term's 4.09 at 8 tokens on A100 divided an MoE layer's weight reads) shows up as a
step below its floor.
"""

from __future__ import annotations

from dataclasses import replace

from sim.core.batch import Batch
from sim.cost.roofline import RooflineCostModel

# Operators that are not GPU work: the engine's host-side overhead (sim/cost/engine_profile.py).
NOT_GPU_WORK = ("overhead",)


def floor_model(cm: RooflineCostModel) -> RooflineCostModel:
    """``cm``'s operators at 100% of the vendor peaks (``RooflineCostModel.ideal``, bound
    "both"), with ``cm``'s model, GPU, parallelism, dtypes and attention backend. A data-parallel
    expert group's all-to-all runs at its links' peak: the NVLink peak, the NIC scaled by the same
    factor, no per-call latency (sim/cost/all2all.py)."""
    kw: dict = {"weight_dtype_bytes": cm.dtype_bytes, "engine": cm.engine,
                "expert_load_imbalance": cm.expert_load_imbalance}
    dp = getattr(cm, "dp", 1)
    links = getattr(cm, "links", None)
    if dp > 1 and links is not None:
        scale = cm.gpu.nvlink_bw_bytes_per_s / links.nvlink_bytes_per_s
        kw.update(dp=dp, links=replace(links, nvlink_bytes_per_s=cm.gpu.nvlink_bw_bytes_per_s,
                                       nic_bytes_per_s=links.nic_bytes_per_s * scale, latency_s=0.0))
    else:
        kw["enable_expert_parallel"] = cm.ep > 1
    return type(cm).ideal(cm.model, cm.gpu, cm.tp, cm.kv_dtype_bytes, "both", **kw)


def step_floor_s(floor: RooflineCostModel, batch: Batch) -> float:
    """The roofline floor of ``batch``'s step (seconds): the GPU operators of ``floor``
    (``floor_model`` of the cost model that prices the step), the host overhead left out."""
    return sum(t for op, t in floor.step_time(batch).ops_s.items() if op not in NOT_GPU_WORK)


def gpu_step_s(cm: RooflineCostModel, batch: Batch) -> float:
    """The GPU seconds ``cm`` prices ``batch``'s step at (its host overhead left out): what
    ``step_floor_s`` bounds from below."""
    return sum(t for op, t in cm.step_time(batch).ops_s.items() if op not in NOT_GPU_WORK)
