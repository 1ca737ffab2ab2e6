"""The LM head's logits gathered across the TP group before sampling (sim/cost/roofline.py
``_logits_gather_s``): each rank computes logits for vocab / tp columns and the engine gathers
num_logits x vocab x dtype bytes (vLLM V1 ``LogitsProcessor._gather_logits``: an NCCL all-gather;
SGLang ``tensor_model_parallel_all_gather``; TensorRT-LLM ``ColumnLinear(gather_output=True)``),
priced by NCCL's tuning model of an AllGather (tuning.cc: ring, nsteps = n - 1) and charged with
the all-reduces (the step's communication operator)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.core.batch import Batch
from sim.cost.pipeline import PipelineCostModel
from sim.cost.roofline import RooflineCostModel
from sim.spec.hardware import get_gpu
from sim.spec.models import get_model
from sim.spec.nodes import NodeLinks

M, G = get_model("llama-3-8b"), get_gpu("h100-sxm")


def _decode(n: int) -> Batch:
    return Batch(num_decode_seqs=n, decode_context_tokens=n * 512, num_logits=n)


def _nccl_allgather_us(size_bytes: float, ranks: int, bus_gb_s: float) -> float:
    """NCCL's tuning model of a ring AllGather within one NVLink node, written out from
    src/graph/tuning.cc (2.19-2.21): baseLat ring {LL 6.6, LL128 14.0, Simple 8.4} us, hwLat
    NVLink ring {0.6, 1.9, 3.4} us per step, nsteps = n - 1; LL busBw / 3 (one node, not an
    all-reduce) capped at llMaxBw 87.7 GB/s, LL128 x 0.92; algorithm bandwidth busBw x n / nsteps;
    time = lat + nBytes / (1000 x algBw), nBytes the gathered total (argcheck.cc); the fastest."""
    steps = ranks - 1
    options = []
    for base, hw, bus in ((6.6, 0.6, min(87.7, bus_gb_s / 3.0)), (14.0, 1.9, bus_gb_s * 0.92), (8.4, 3.4, bus_gb_s)):
        options.append(base + steps * hw + size_bytes / (1000.0 * bus * ranks / steps))
    return min(options)


def test_no_gather_at_tp1():
    cm = RooflineCostModel(M, G, 1)
    assert cm._logits_gather_s(256) == 0.0
    assert cm.step_time(_decode(64)).ops_s["allreduce"] == 0.0


def test_gather_grows_with_sampled_positions_and_vocabulary():
    cm = RooflineCostModel(M, G, 4)
    times = [cm._logits_gather_s(n) for n in (1, 8, 64, 512)]
    assert 0.0 < times[0] < times[1] < times[2] < times[3]
    assert cm._logits_gather_s(0) == 0.0  # a step sampling nothing gathers nothing
    small = RooflineCostModel(replace(M, vocab_size=32_000), G, 4)
    assert small._logits_gather_s(64) < cm._logits_gather_s(64)


def test_gather_is_nccls_allgather_model_at_one_shape():
    """Llama-3-8B (vocab 128,256, bf16) at TP4 on H100, 64 sampled positions: S = 64 x 128,256 x 2
    bytes gathered; NCCL's model of its AllGather on the achieved NVLink bus (0.8 of the
    catalogue's figure). At 100% of peak without latency (``ideal``, the floor), the ring's bytes
    alone: (4 - 1) / 4 of S over the link."""
    size = 64 * 128_256 * 2
    cm = RooflineCostModel(M, G, 4)
    bus = G.nvlink_bw_bytes_per_s * 0.8 / 1e9
    assert cm._logits_gather_s(64) == pytest.approx(_nccl_allgather_us(size, 4, bus) * 1e-6, rel=1e-12)
    ideal = RooflineCostModel.ideal(M, G, 4)
    assert ideal._logits_gather_s(64) == pytest.approx(3 / 4 * size / G.nvlink_bw_bytes_per_s, rel=1e-12)


def test_gather_moves_half_an_allreduces_traffic_per_rank():
    """A large gather is bandwidth bound: its time per byte is about half a ring all-reduce's of
    the same buffer ((n - 1) / n against 2 (n - 1) / n per rank; NCCL's model, both)."""
    from sim.cost.nccl_tuning import allgather_s, allreduce_s

    size, bus = 256e6, 360e9
    for n in (2, 4, 8):
        assert allgather_s(size, n, bus, 0) / allreduce_s(size, n, bus, 0) == pytest.approx(0.5, rel=0.02)


def test_across_nodes_dearer_than_within_one():
    within = RooflineCostModel(M, G, 4, nodes=NodeLinks(8, 50e9, 10e-6))
    across = RooflineCostModel(M, G, 4, nodes=NodeLinks(2, 50e9, 10e-6))
    assert within.tp_nodes == 1 and across.tp_nodes == 2
    assert within._logits_gather_s(64) == RooflineCostModel(M, G, 4)._logits_gather_s(64)
    for n in (1, 64, 512):
        assert across._logits_gather_s(n) > within._logits_gather_s(n)


@pytest.mark.parametrize("batch", [_decode(64), Batch(num_decode_seqs=16, decode_context_tokens=16 * 300,
                                                      prefill_chunks=((512, 0),), num_logits=17)],
                         ids=["decode", "decode+chunk"])
def test_tp4_step_costs_its_allreduces_plus_the_gather(batch):
    """The step's communication operator is its all-reduces plus the logits' gather (NCCL's
    AllGather model of num_logits x vocab x 2 bytes; at peak, (4 - 1) / 4 of them over the link),
    and the step (run_cost, the per-step path: memoised shapes with and without prompt chunks)
    costs exactly its operators: the gather is in the step's time."""
    size = batch.num_logits * M.vocab_size * 2
    cm = RooflineCostModel.ideal(M, G, 4)  # no engine overhead: the step is its GPU operators
    ops = cm.step_time(batch).ops_s
    assert ops["allreduce"] - cm._per_tokens(batch.num_tokens)[1] == pytest.approx(
        3 / 4 * size / G.nvlink_bw_bytes_per_s, rel=1e-9)
    assert cm.run_cost(batch).first_s == pytest.approx(sum(ops.values()), rel=1e-12)
    real = RooflineCostModel(M, G, 4)
    ops = real.step_time(batch).ops_s
    bus = G.nvlink_bw_bytes_per_s * 0.8 / 1e9
    assert ops["allreduce"] - real._per_tokens(batch.num_tokens)[1] == pytest.approx(
        _nccl_allgather_us(size, 4, bus) * 1e-6, rel=1e-9)


def test_a_completing_prompt_alone_pays_its_gather():
    cm = RooflineCostModel(M, G, 4)
    tail = cm.prefill_alone_s(512, 0, True) - cm.prefill_alone_s(512, 0, False)
    assert tail == pytest.approx(cm._lm_head_s(1) + M.vocab_size * 4 * 3 / cm.mem_bw + cm._logits_gather_s(1),
                                 rel=1e-9)


def test_pipeline_gathers_on_its_last_stage_only():
    """PP alone (TP 1) gathers nothing; under TP4 x PP2 only the last stage runs the LM head."""
    b = _decode(64)
    pp_only = PipelineCostModel(M, 2, lambda s: RooflineCostModel(s, G, 1), G.nvlink_bw_bytes_per_s)
    assert pp_only.step_time(b).ops_s["allreduce"] == 0.0
    pp = PipelineCostModel(M, 2, lambda s: RooflineCostModel(s, G, 4), G.nvlink_bw_bytes_per_s)
    first, last = pp.stages
    assert first.step_time(Batch(64, 64 * 512, (), 0)).ops_s["allreduce"] == first._per_tokens(64)[1]
    # through the pipeline itself: its step is the stages' work rescaled, so the all-reduce's
    # share of it is that of a first stage without sampled positions plus the last stage's
    sans = first.step_time(Batch(64, 64 * 512, (), 0)).ops_s
    with_logits = first.step_time(b).ops_s
    tail = last.step_time(b).ops_s
    ops = pp.step_time(b).ops_s
    share = ops["allreduce"] / sum(ops.values())
    assert share == pytest.approx((sans["allreduce"] + tail["allreduce"]) / (sum(sans.values()) + sum(tail.values())),
                                  rel=1e-9)
    assert share != pytest.approx((with_logits["allreduce"] + tail["allreduce"])
                                  / (sum(with_logits.values()) + sum(tail.values())), rel=1e-6)
    assert last.step_time(b).ops_s["allreduce"] == pytest.approx(
        last._per_tokens(64)[1] + last._logits_gather_s(64), rel=1e-12)
