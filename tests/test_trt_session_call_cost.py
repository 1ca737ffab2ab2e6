"""One timed GptSession call of TensorRT-LLM v0.5-v0.7 (VC-03's and VC-50's "1st token latency").

gptSessionBenchmark times ``session.generate()`` plus a stream synchronize with
``--input_output_len ISL,1`` (docs/source/performance.md): GptSession::generateSingleBatch runs once
with one new token, i.e. one context step of the engine, its decoder step and the finished check
(benchmarks/cpp/gptSessionBenchmark.cpp, runtime/gptSession.cpp @ 027cd518; the profile's comment in
sim/catalog/engine_profiles.yaml lists every operation of the call).

Under tensor parallelism each MPI rank runs its own GptSession over the same inputs: generate()
exchanges nothing between ranks (``mPipelineComm`` is created under pipeline parallelism only) and
the benchmark's timed loop has no barrier, so the engine's NCCL plugin calls (charged by the cost
model as all-reduces) are the only cross-rank work. The host work of a step is then the same at any
TP degree: ``per_extra_tp_rank_ms`` (vLLM's broadcast of the model input to its workers) is 0.
"""

from __future__ import annotations

import copy

import pytest

from sim.analysis.validate import load_rows
from sim.core.batch import Batch
from sim.cost.calibration import load_calibration
from sim.cost.engine_profile import get_profile
from sim.cost.roofline import RooflineCostModel
from sim.spec.hardware import get_gpu
from sim.spec.models import get_model

GPT_SESSION = "trt-llm-2023"  # the profile of TensorRT-LLM's GptSession runtime (v0.5-v0.7)


def _cost(tp: int, model: str = "falcon-180b", gpu: str = "a100-80g") -> RooflineCostModel:
    g = get_gpu(gpu)
    return RooflineCostModel(get_model(model), g, tp, calibration=load_calibration(g.key), engine=get_profile(GPT_SESSION))


def test_the_profile_charges_no_host_cost_per_extra_tp_rank():
    assert get_profile(GPT_SESSION).per_extra_tp_rank_s == 0.0


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_a_gpt_session_step_pays_the_same_host_work_at_every_tp(tp):
    """A 128-token first-token call (context step + one sampled token) and a decode step: the engine
    overhead (host work beyond the GPU's operators) is TP1's at every TP degree."""
    prompt = Batch(prefill_chunks=((128, 0),), num_logits=1)
    decode = Batch(num_decode_seqs=64, decode_context_tokens=64 * 300, num_logits=64)
    one, many = _cost(1), _cost(tp)
    for b in (prompt, decode):
        assert many.step_time(b).ops_s["overhead"] == pytest.approx(one.step_time(b).ops_s["overhead"], abs=1e-12)


def _gpt_session_ttft_rows():
    return [r for r in load_rows() if r.scenario is not None and r.status == "ok" and r.metric == "median_ttft_ms"
            and (r.scenario.get("engine") or {}).get("profile") == GPT_SESSION]


def test_every_gpt_session_ttft_row_pays_one_calls_host_work_whatever_its_tp():
    """Every validation row timed on GptSession (VC-03, VC-50's first-token rows): its one-token
    call is one context step, whose host work is the profile's per-call term, at TP 1 as at TP 8."""
    from sim.engine.deployment import build_deployment
    from sim.scenario import scenario_from_dict

    rows = _gpt_session_ttft_rows()
    assert {r.id.split("/")[0] for r in rows} >= {"VC-03", "VC-50"}
    assert any((r.scenario.get("cluster") or {}).get("tensor_parallel_size", 1) > 1 for r in rows)
    per_call_s = get_profile(GPT_SESSION).cpu_s(1, True, 1)
    for r in rows:
        s = scenario_from_dict(copy.deepcopy(r.scenario), r.id)
        d = build_deployment(s)
        prompt = s.workload.synthetic.input_tokens.value
        ops = d.cost.step_time(Batch(prefill_chunks=((prompt, 0),), num_logits=1)).ops_s
        assert ops["overhead"] == pytest.approx(per_call_s, abs=1e-12), (r.id, d.tp)
