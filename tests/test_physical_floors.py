"""Issue 37 item 3: physical floors as an invariant.

No step, for any model x GPU x dtype x batch shape of the catalogue, costs less than its roofline
floor (sum over its operators of max(FLOPs / peak, bytes / bandwidth), collectives at link
peak: ``sim.cost.floor``), and no efficiency the shipped calibrations hold exceeds 1 against
the bound the cost model divides by it (``sim.cost.fit.beyond_roofline``, ``GemmEff``).
Shapes are sampled with a fixed seed.
"""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from sim.core.batch import Batch
from sim.cost.calibration import Calibration, calibration_dir, load_calibration, log_eff_array
from sim.cost.floor import floor_model, gpu_step_s, step_floor_s
from sim.cost.roofline import Efficiencies, RooflineCostModel
from sim.errors import UserError
from sim.spec.hardware import catalogue as gpu_catalogue
from sim.spec.hardware import get_gpu
from sim.spec.memory import plan_memory
from sim.spec.models import catalogue as model_catalogue
from sim.spec.models import get_model, with_quantization
from sim.spec.quantization import METHODS

SEED = 37
TPS = (1, 2, 4, 8)
# relative slack for float rounding only (the floor and the step sum the same terms differently)
REL = 1e-9


def _valid_tp(m, tp: int) -> bool:
    """vLLM's head sharding (sim/engine/deployment.py ``build_deployment``)."""
    return not (m.num_heads % tp or (m.num_kv_heads % tp and tp % m.num_kv_heads))


def _fits(m, gpu, tp: int, kv_bytes: int) -> bool:
    try:
        plan_memory(m, gpu, tp, 16, 0.9, 8192, 256, kv_bytes)
    except UserError:
        return False
    return True


def _shapes(rng: random.Random, max_ctx: int) -> list[Batch]:
    """Prefill-only chunks (with and without cached context), decode-only batches of 1..512 at
    sampled contexts, and mixed steps (chunked prefill beside decodes)."""
    out = []
    for _ in range(2):
        c = rng.choice((1, 7, 64, 512, 2048, 8192))
        x = rng.choice((0, 0, rng.randrange(0, max_ctx)))
        out.append(Batch(prefill_chunks=((c, x),), num_logits=1))
    for b in (1, rng.choice((2, 4, 8, 16)), rng.choice((32, 64, 128)), rng.choice((256, 512))):
        ctx = rng.randrange(1, max_ctx)
        out.append(Batch(num_decode_seqs=b, decode_context_tokens=b * ctx, num_logits=b))
    b, ctx = rng.choice((4, 32, 200)), rng.randrange(1, max_ctx)
    out.append(Batch(num_decode_seqs=b, decode_context_tokens=b * ctx,
                     prefill_chunks=((rng.choice((16, 256, 1024)), rng.randrange(0, max_ctx)),), num_logits=b + 1))
    return out


def _deployments(gkey: str):
    """Every catalogue model on GPU ``gkey`` at the smallest TP that fits in memory (bf16, and
    one sampled weight quantization and KV dtype), a larger TP where valid, expert parallelism
    sampled for MoE models: (label, cost model, the seeded generator)."""
    rng = random.Random(f"{SEED}/{gkey}")
    gpu = get_gpu(gkey)
    cal = load_calibration(gkey)
    for mkey in sorted(model_catalogue()):
        base = get_model(mkey)
        for quant in (None, rng.choice(sorted(METHODS))):
            try:  # a method the checkpoint contradicts (gpt-oss ships mxfp4) or the GPU refuses
                m = with_quantization(base, quant, "test") if quant else base
                if quant:
                    METHODS[quant].check_gpu(gpu)
            except UserError:
                continue
            kv = rng.choice((m.dtype_bytes, 1))
            tps = [tp for tp in TPS if _valid_tp(m, tp) and _fits(m, gpu, tp, kv)]
            if not tps:
                continue
            for tp in dict.fromkeys((tps[0], rng.choice(tps))):
                ep = m.num_experts > 1 and tp > 1 and rng.random() < 0.5
                cm = RooflineCostModel(m, gpu, tp, kv, Efficiencies(), calibration=cal,
                                       enable_expert_parallel=ep, expert_load_imbalance=rng.choice((1.0, 1.3)))
                yield f"{mkey}/{gkey}/{quant or 'bf16'}/kv{kv}/tp{tp}{'/ep' if ep else ''}", cm, rng


@pytest.mark.parametrize("gpu", sorted(gpu_catalogue()))
def test_no_step_of_the_catalogue_costs_less_than_its_roofline_floor(gpu):
    below = []
    count = 0
    for label, cm, rng in _deployments(gpu):
        floor = floor_model(cm)
        for batch in _shapes(rng, min(cm.model.max_position_embeddings, 32768)):
            f, t = step_floor_s(floor, batch), gpu_step_s(cm, batch)
            count += 1
            if t < f * (1 - REL):
                below.append(f"{label} {batch.num_decode_seqs} decodes, chunks {batch.prefill_chunks}: "
                             f"{t * 1e3:.3f} ms < floor {f * 1e3:.3f} ms")
    assert count > 50
    assert not below, f"{len(below)} steps below their floor, e.g.\n" + "\n".join(below[:10])


def test_mixtral_tp2_a100_decode_is_above_its_floor():
    """The issue's case: Mixtral-8x7B TP2 on A100 decoding a small batch priced its experts' weight
    reads at 4x HBM bandwidth (19.3 ms against a 20.7 ms floor)."""
    m, gpu = get_model("mixtral-8x7b"), get_gpu("a100-80g")
    cm = RooflineCostModel(m, gpu, 2, None, Efficiencies(), calibration=load_calibration("a100-80g"))
    floor = floor_model(cm)
    for b in (1, 4, 8, 16, 32, 64, 128):
        batch = Batch(num_decode_seqs=b, decode_context_tokens=b * 2048, num_logits=b)
        assert gpu_step_s(cm, batch) >= step_floor_s(floor, batch)
        # the touched experts' weights alone, at HBM bandwidth
        touched = m.num_experts * (1 - (1 - m.num_experts_per_tok / m.num_experts) ** b)
        expert_bytes = m.num_moe_layers * touched * 3 * m.hidden_size * m.intermediate_size * m.dtype_bytes / 2
        ops = cm.step_time(batch).ops_s
        assert ops["gemm_mlp_up"] + ops["gemm_mlp_down"] >= expert_bytes / gpu.hbm_bw_bytes_per_s


def _calibrations():
    return sorted(p.stem for p in calibration_dir().glob("*.json"))


def _log_effs(d, path=""):
    """(path, every log_eff value) of each table in a calibration file."""
    if isinstance(d, dict):
        for k, v in d.items():
            if k == "log_eff":
                yield path, log_eff_array(v) if isinstance(v, dict) else np.array(
                    json.loads(json.dumps(v).replace("null", "NaN")), dtype=float)
            else:
                yield from _log_effs(v, f"{path}/{k}")
    elif isinstance(d, list):
        for i, v in enumerate(d):
            yield from _log_effs(v, f"{path}[{i}]")


@pytest.mark.parametrize("gpu", _calibrations())
def test_no_shipped_efficiency_exceeds_one_against_its_bound(gpu):
    """Every table's measured efficiency (against the roofline bound the cost model divides by
    it: ``fit.bounds_s``) is at most 1, so every interpolation between them is too."""
    raw = json.loads((calibration_dir() / f"{gpu}.json").read_text())
    for path, a in _log_effs(raw):
        vals = a[np.isfinite(a)]
        assert not (vals > 0).any(), f"{gpu}{path}: efficiency {math.exp(vals.max()):.3f} > 1"


@pytest.mark.parametrize("gpu", _calibrations())
def test_gemm_efficiency_with_its_wave_term_never_exceeds_one(gpu):
    """Between measured token counts the wave term only adds time (``GemmEff``): the efficiency
    of every catalogue model's linear layers, at every token count up to past the table, is at
    most 1 (the A100 table used to give 4.09 at 8 tokens)."""
    cal = Calibration(json.loads((calibration_dir() / f"{gpu}.json").read_text()))
    if cal.gemm is None:
        pytest.skip("no GEMM table")
    tokens = sorted({1, 2, 3, 5, 8, 13, 100, 700, 769, 1536, 3000, 5000, 70000} | set(cal.gemm.m))
    for mkey in sorted(model_catalogue()):
        m = get_model(mkey)
        h, inter = m.hidden_size, m.moe_intermediate_size or m.intermediate_size
        for tp in (1, 8):
            for n, k in ((2 * inter / tp, h), (h, inter / tp), (m.q_size / tp + 2 * m.head_dim, h), (m.vocab_size / tp, h)):
                g, _ = cal.gemm.eff_fn(n, k)
                effs = [g.eff(t)[0] for t in tokens]
                assert max(effs) <= 1.0, (mkey, tp, n, k, max(effs))


@pytest.mark.parametrize("gpu", ["h200", "a100-80g", "l40s"])
def test_data_parallel_expert_groups_stay_above_their_floor(gpu):
    """DP attention with expert parallelism (sim/cost/dp_ep.py): the group's routed experts and
    the all-to-all (at the links' peak in the floor) included."""
    from sim.engine.deployment import build_deployment
    from sim.scenario import load_scenario
    from tests.conftest import ROOT

    over = [f"hardware.gpu={gpu}"] + ([] if gpu == "h200" else ["model=mixtral-8x7b", "engine.quantization=fp8",
                                                               "cluster.data_parallel_size=2"])
    cm = build_deployment(load_scenario(ROOT / "scenarios" / "deepseek_v3_dp8_ep.yaml", over)).cost
    floor = floor_model(cm)
    rng = random.Random(f"{SEED}/dp/{gpu}")
    for batch in _shapes(rng, 8192):
        assert gpu_step_s(cm, batch) >= step_floor_s(floor, batch) * (1 - REL), batch
