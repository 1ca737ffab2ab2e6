"""Issue 37 item 3, pipeline parallelism: no round of a pipeline-parallel replica (PP, and PP x
TP) costs less than its roofline floor (``sim.cost.floor.pipeline_floor_s``: the busiest stage's
GPU work, any micro-batch's trip with its sends at link peak), and the stages together do at
least the whole model's work (a split that loses layers or KV would price a round below the
physics of the model it serves). Catalogue-wide, shapes sampled with a fixed seed
(``tests/test_physical_floors.py``'s helpers)."""

from __future__ import annotations

import random

import pytest

from sim.core.batch import Batch

from sim.cost.calibration import load_calibration
from sim.cost.floor import floor_model, pipeline_floor_s, step_floor_s
from sim.cost.pipeline import PipelineCostModel, replace_logits, split_batch
from sim.cost.roofline import Efficiencies, RooflineCostModel
from sim.errors import UserError
from sim.spec.hardware import catalogue as gpu_catalogue
from sim.spec.hardware import get_gpu
from sim.spec.memory import plan_memory
from sim.spec.models import catalogue as model_catalogue
from sim.spec.models import get_model
from tests.test_physical_floors import REL, SEED, _shapes, _valid_tp

PPS = (2, 3, 4)
TPS = (1, 2, 4)


def _fits(m, gpu, tp: int, pp: int, kv_bytes: int) -> bool:
    try:
        plan_memory(m, gpu, tp, 16, 0.9, 8192, 256, kv_bytes, pp=pp)
    except UserError:
        return False
    return True


def _pipelines(gkey: str):
    """Every catalogue model on ``gkey`` with 2-4 stages (not more than its layers), TP 1 and a
    sampled larger TP where valid and it fits; the stage link NVLink (one node) or the PCIe
    link (a sampled slower boundary): (label, pipeline cost model, the seeded generator)."""
    rng = random.Random(f"{SEED}/pp/{gkey}")
    gpu = get_gpu(gkey)
    cal = load_calibration(gkey)
    for mkey in sorted(model_catalogue()):
        m = get_model(mkey)
        kv = rng.choice((m.dtype_bytes, 1))
        pp = rng.choice([p for p in PPS if p <= m.num_layers])
        tps = [tp for tp in TPS if _valid_tp(m, tp) and _fits(m, gpu, tp, pp, kv)]
        if not tps:
            continue
        for tp in dict.fromkeys((tps[0], rng.choice(tps))):
            ep = m.num_experts > 1 and tp > 1 and rng.random() < 0.5

            def stage(sm, tp=tp, ep=ep):
                return RooflineCostModel(sm, gpu, tp, kv, Efficiencies(), calibration=cal,
                                         enable_expert_parallel=ep)
            link = rng.choice((gpu.nvlink_bw_bytes_per_s, gpu.pcie_bw_bytes_per_s))
            links = tuple((rng.choice((link, gpu.nvlink_bw_bytes_per_s)), 10e-6) for _ in range(pp - 1))
            pcm = PipelineCostModel(m, pp, stage, links[0][0], boundary_links=links)
            yield f"{mkey}/{gkey}/kv{kv}/pp{pp}xtp{tp}{'/ep' if ep else ''}", pcm, rng


def _below(pcm, rng) -> list[str]:
    out = []
    for batch in _shapes(rng, min(pcm.model.max_position_embeddings, 32768)):
        f, t = pipeline_floor_s(pcm, batch), pcm.gpu_round_s(batch)
        if t < f * (1 - REL):
            out.append(f"{batch.num_decode_seqs} decodes, chunks {batch.prefill_chunks}: "
                       f"{t * 1e3:.4f} ms < floor {f * 1e3:.4f} ms")
    return out


@pytest.mark.parametrize("gpu", sorted(gpu_catalogue()))
def test_no_pipeline_round_of_the_catalogue_costs_less_than_its_floor(gpu):
    below, count = [], 0
    for label, pcm, rng in _pipelines(gpu):
        count += 1
        below += [f"{label} {b}" for b in _below(pcm, rng)]
    assert count >= 10
    assert not below, f"{len(below)} rounds below their floor, e.g.\n" + "\n".join(below[:10])


@pytest.mark.parametrize("gpu", ["h100-sxm", "a100-80g", "l40s"])
def test_pipeline_stages_do_the_whole_models_work(gpu):
    """Summed over stages and micro-batches, the floors are at least the whole model's floor on
    one TP group (every layer, every decode's KV, the LM head once): the split loses nothing."""
    short = []
    for label, pcm, rng in _pipelines(gpu):
        whole = floor_model(RooflineCostModel(pcm.model, pcm.gpu, pcm.tp, pcm.stages[0].kv_dtype_bytes,
                                              Efficiencies(), enable_expert_parallel=pcm.ep > 1))
        stages = [floor_model(s) for s in pcm.stages]
        for batch in _shapes(rng, min(pcm.model.max_position_embeddings, 32768)):
            work = sum(step_floor_s(st, mb if s == pcm.pp - 1 else replace_logits(mb))
                       for mb in split_batch(batch, pcm.pp) if mb.num_tokens for s, st in enumerate(stages))
            need = step_floor_s(whole, batch)
            if work < need * (1 - REL):
                short.append(f"{label} {batch}: stages {work * 1e3:.4f} ms < whole {need * 1e3:.4f} ms")
    assert not short, f"{len(short)} splits lose work, e.g.\n" + "\n".join(short[:10])


def test_split_batch_keeps_every_token_context_and_logit():
    """The micro-batches hold exactly the batch: its decodes, their context tokens (the KV a
    round reads), its prompt chunks and its sampled positions, for any shape and stage count."""
    rng = random.Random(f"{SEED}/split")
    for _ in range(3000):
        pp = rng.randrange(2, 9)
        n = rng.randrange(0, 40)
        chunks = tuple((rng.randrange(1, 600), rng.randrange(0, 900)) for _ in range(rng.randrange(0, 4)))
        if not n and not chunks:
            continue
        ctx = n * rng.randrange(1, 5000) + rng.randrange(0, n + 1) if n else 0
        b = Batch(num_decode_seqs=n, decode_context_tokens=ctx, prefill_chunks=chunks,
                  num_logits=n + rng.randrange(0, len(chunks) + 1))
        mbs = split_batch(b, pp)
        assert sum(m.num_decode_seqs for m in mbs) == n
        assert sum(m.decode_context_tokens for m in mbs) == ctx, (b, pp, [m.decode_context_tokens for m in mbs])
        assert sorted(c for m in mbs for c in m.prefill_chunks) == sorted(chunks)
        assert sum(m.num_logits for m in mbs) == b.num_logits
        assert all(m.decode_context_tokens >= m.num_decode_seqs for m in mbs)
