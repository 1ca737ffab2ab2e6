"""The roofline floor of a step: the time below which no step of a batch may be priced.

Why: every operator runs at most at the GPU's vendor peaks (Williams, Waterman, Patterson 2009,
"Roofline", CACM 52(4)): a step cannot take less than the sum over its operators of
max(FLOPs / peak, bytes / HBM bandwidth), plus its collectives' bytes at the link's peak. The
floor is read from the simulator's own operators at 100% of peak
(``RooflineCostModel.ideal``: every efficiency 1, no latency term, no kernel floor), so it
counts exactly what a step counts (the experts an MoE layer touches, the LM head on sampled
positions, the KV bytes the engine's attention kernel re-reads); the engine's host overhead
is left out (it is not GPU work). A pipeline-parallel replica's round (sim/cost/pipeline.py) is
bounded by its busiest stage's GPU work and by each micro-batch's trip through the stages
(``pipeline_floor_s``). ``simsrv explain`` reports these floors (``step_floor_parts_s``), and
``tests/test_physical_floors.py`` (``tests/test_floors_pp.py`` for pipelines) holds every step of
the catalogue to them: a calibrated efficiency above 1 against the bound it divides (issue 37: the
GEMM wave term's 4.09 at 8 tokens on A100 divided an MoE layer's weight reads) shows up as a
step below its floor.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim.core.batch import Batch
from sim.cost.roofline import RooflineCostModel

# Operators that are not GPU work: the engine's host-side overhead (sim/cost/engine_profile.py).
NOT_GPU_WORK = ("overhead",)
# Operators that cross the GPU's links, not its tensor cores or HBM: the TP all-reduce (and a
# data-parallel expert group's all-to-all, which sim/cost/dp_ep.py charges to it).
COMMUNICATION = ("allreduce",)


@dataclass(frozen=True)
class FloorParts:
    """A step's floor in its parts (seconds): the operators bound by FLOPs over peak, those bound
    by bytes over HBM bandwidth, and the collectives and pipeline sends at link peak."""

    compute_s: float
    memory_s: float
    communication_s: float

    @property
    def total_s(self) -> float:
        return self.compute_s + self.memory_s + self.communication_s

    def __add__(self, other: "FloorParts") -> "FloorParts":
        return FloorParts(self.compute_s + other.compute_s, self.memory_s + other.memory_s,
                          self.communication_s + other.communication_s)


def floor_model(cm: RooflineCostModel, bound: str = "both") -> RooflineCostModel:
    """``cm``'s operators at 100% of the vendor peaks (``RooflineCostModel.ideal``, bound
    ``bound``: "both", or "compute" / "memory" alone), with ``cm``'s model, GPU, parallelism, dtypes and attention backend. A data-parallel
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
    return type(cm).ideal(cm.model, cm.gpu, cm.tp, cm.kv_dtype_bytes, bound, **kw)


def step_floor_s(floor: RooflineCostModel, batch: Batch) -> float:
    """The roofline floor of ``batch``'s step (seconds): the GPU operators of ``floor``
    (``floor_model`` of the cost model that prices the step), the host overhead left out."""
    return sum(t for op, t in floor.step_time(batch).ops_s.items() if op not in NOT_GPU_WORK)


def gpu_step_s(cm: RooflineCostModel, batch: Batch) -> float:
    """The GPU seconds ``cm`` prices ``batch``'s step at (its host overhead left out): what
    ``step_floor_s`` bounds from below."""
    return sum(t for op, t in cm.step_time(batch).ops_s.items() if op not in NOT_GPU_WORK)


def floor_models(cm: RooflineCostModel) -> tuple[RooflineCostModel, RooflineCostModel, RooflineCostModel]:
    """``floor_model`` of ``cm`` at the bounds "both", "compute" and "memory" (``floor_parts_s``)."""
    return floor_model(cm), floor_model(cm, "compute"), floor_model(cm, "memory")


def floor_parts_s(models: tuple[RooflineCostModel, RooflineCostModel, RooflineCostModel],
                  batch: Batch) -> FloorParts:
    """``step_floor_s(floor_model(cm), batch)`` in its parts (``models``: ``floor_models(cm)``):
    each operator's floor counted as compute or memory by the bound that is the larger for it
    (``ideal`` "compute" / "memory"), the collectives apart. The parts add up to the floor."""
    both, comp, mem = (f.step_time(batch).ops_s for f in models)
    c = m = comm = 0.0
    for op, t in both.items():
        if op in NOT_GPU_WORK:
            continue
        if op in COMMUNICATION:
            comm += t
        elif comp.get(op, 0.0) >= mem.get(op, 0.0):
            c += t
        else:
            m += t
    return FloorParts(c, m, comm)


def pipeline_floor_parts_s(pcm, batch: Batch) -> FloorParts:
    """The floor of one round of a pipeline-parallel replica (``PipelineCostModel``; GPipe,
    Huang et al. 2019): never less than its busiest stage's GPU work (each stage runs every
    micro-batch, one after another, at most at peak), nor than any micro-batch's trip (its
    floor on every stage in turn, plus each boundary's send of 2 x tokens x hidden x bytes / tp
    at the link's peak, no latency). Micro-batches as the cost model splits the batch
    (``split_batch``: each is a forward pass of its own, reading the stage's weights again);
    the stages before the last run no LM head. The parts are those of the bound that binds."""
    from sim.cost.pipeline import replace_logits, split_batch

    pp = pcm.pp
    stages = [floor_models(s) for s in pcm.stages]
    busy = [FloorParts(0.0, 0.0, 0.0)] * pp
    trips = []
    for mb in split_batch(batch, pp):
        if not mb.num_tokens:
            continue
        trip = FloorParts(0.0, 0.0, 0.0)
        for s, stage in enumerate(stages):
            part = floor_parts_s(stage, mb if s == pp - 1 else replace_logits(mb))
            if s < pp - 1:
                part = part + FloorParts(0.0, 0.0, pcm.send_bytes(mb.num_tokens) / pcm.boundary_peaks[s])
            busy[s] = busy[s] + part
            trip = trip + part
        trips.append(trip)
    return max(busy + trips, key=lambda p: p.total_s)


def pipeline_floor_s(pcm, batch: Batch) -> float:
    """``pipeline_floor_parts_s`` in all (seconds)."""
    return pipeline_floor_parts_s(pcm, batch).total_s


def cost_floor_parts_s(cm, batch: Batch) -> FloorParts:
    """The floor of ``batch``'s step under any deployment's cost model: a pipeline's rounds
    (``pipeline_floor_parts_s``), else one TP group's (``floor_parts_s``, a data-parallel expert
    group's all-to-all included). Speculative decoding prices its target's steps with the same
    model (sim/cost/speculative.py), so a plain step's floor is the model's."""
    if getattr(cm, "stages", None):
        return pipeline_floor_parts_s(cm, batch)
    return floor_parts_s(floor_models(cm), batch)


def priced_gpu_step_s(cm, batch: Batch) -> float:
    """What ``cost_floor_parts_s`` bounds from below: ``gpu_step_s``, or a pipeline's round
    without the engine's host work (``PipelineCostModel.gpu_round_s``)."""
    if getattr(cm, "stages", None):
        return cm.gpu_round_s(batch)
    return gpu_step_s(cm, batch)
