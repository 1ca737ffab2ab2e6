"""Issue 37: ``simsrv explain``'s floors are sim/cost/floor.py's, the ones the floor property
tests hold every priced step to (compute, memory and communication; a pipeline's rounds; a
data-parallel expert group's all-to-all), not a memory-only or compute-only sum; their parts add
up to them, and no step a deployment prices goes below them. A seeded sample of the catalogue
(models x GPUs x TP x dtypes) and the shipped pipeline, DP+EP and speculative scenarios."""

from __future__ import annotations

import random

import pytest

from sim.analysis.explain import explain
from sim.core.batch import Batch
from sim.cost.floor import cost_floor_parts_s, priced_gpu_step_s
from sim.engine.deployment import build_deployment
from sim.errors import UserError
from sim.scenario import load_scenario, scenario_from_dict
from sim.spec.hardware import catalogue as gpu_catalogue
from sim.spec.models import catalogue as model_catalogue
from tests.conftest import ROOT, small_scenario

SEED = 37
REL = 1e-9
SHAPES = ((1, 2048), (64, 4096), (512, 1024))  # (--batch, --context)


def _sample(n: int = 14):
    """``n`` deployments that build: a seeded model, GPU, TP and KV dtype each."""
    rng = random.Random(SEED)
    models, gpus = sorted(model_catalogue()), sorted(gpu_catalogue())
    out = []
    while len(out) < n:
        model, gpu, tp = rng.choice(models), rng.choice(gpus), rng.choice((1, 2, 4, 8))
        engine = {"policy": "continuous", **({"kv_cache_dtype": "fp8"} if rng.random() < 0.3 else {})}
        try:
            dep = build_deployment(scenario_from_dict(small_scenario(
                model=model, hardware={"gpu": gpu}, cluster={"tensor_parallel_size": tp}, engine=engine)))
        except UserError:  # does not fit, heads do not shard, fp8 KV refused...
            continue
        out.append((f"{model}/{gpu}/tp{tp}", dep))
    return out


def _shipped():
    for name in ("pipeline_405b", "deepseek_v3_dp8_ep", "spec_decode", "chat"):
        yield name, build_deployment(load_scenario(ROOT / "scenarios" / f"{name}.yaml"))


def _check(label: str, dep) -> list[str]:
    bad = []
    for b, n in SHAPES:
        e = explain(dep, context_tokens=n, batch=b)
        for key, batch in (("decode_step", Batch(num_decode_seqs=b, decode_context_tokens=b * n, num_logits=b)),
                           ("prefill", Batch(prefill_chunks=((n, 0),), num_logits=1))):
            floor = cost_floor_parts_s(dep.cost, batch)
            shown = e[f"{key}_floor_ms"]
            parts = sum(e[f"{key}_floor_{p}_ms"] for p in ("compute", "memory", "communication"))
            if shown != floor.total_s * 1e3:
                bad.append(f"{label} {key} b{b} n{n}: explain {shown:.4f} ms, floor.py {floor.total_s * 1e3:.4f} ms")
            if abs(parts - shown) > REL * shown:
                bad.append(f"{label} {key} b{b} n{n}: parts {parts:.4f} ms != {shown:.4f} ms")
            priced = priced_gpu_step_s(dep.cost, batch)
            if priced * 1e3 < shown * (1 - REL):
                bad.append(f"{label} {key} b{b} n{n}: priced {priced * 1e3:.4f} ms < floor {shown:.4f} ms")
    return bad


def test_explains_floor_is_floor_py_on_a_catalogue_sample():
    bad = [x for label, dep in _sample() for x in _check(label, dep)]
    assert not bad, "\n".join(bad[:10])


@pytest.mark.parametrize("name,dep", list(_shipped()), ids=lambda x: x if isinstance(x, str) else "")
def test_explains_floor_is_floor_py_on_pipeline_dp_and_spec_scenarios(name, dep):
    assert not _check(name, dep)


def test_a_compute_bound_decode_floor_counts_its_flops():
    """Llama-3-8B on one H100 at batch 512: the decode step's GEMMs are compute bound, so its
    floor is above bytes over bandwidth alone (what explain used to report)."""
    dep = build_deployment(scenario_from_dict(small_scenario(engine={"policy": "continuous"})))
    e = explain(dep, context_tokens=256, batch=512)
    assert e["decode_step_floor_compute_ms"] > 0
    assert e["decode_step_floor_ms"] == pytest.approx(
        e["decode_step_floor_compute_ms"] + e["decode_step_floor_memory_ms"] + e["decode_step_floor_communication_ms"])
