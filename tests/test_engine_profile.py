"""Engine profiles: fixed prefill/decode step cost, per sequence, per TP rank, CUDA-graph decode,
overlapped CPU, overrides, the measured batch range, and the vllm-v0 fit on the CPU profile."""

from __future__ import annotations

import pytest

from sim.core.batch import Batch
from sim.cost.engine_fit import fit_cpu_profile
from sim.cost.engine_profile import get_profile
from sim.engine.deployment import build_deployment
from sim.errors import UserError
from sim.scenario import scenario_from_dict
from tests.conftest import ROOT, small_scenario


def _dep(profile: str, tp: int = 1, overhead: dict | None = None, model: str = "llama-3-8b"):
    eng = {"profile": profile, **({"overhead": overhead} if overhead else {})}
    return build_deployment(scenario_from_dict(small_scenario(engine=eng, model=model,
                                                              cluster={"tensor_parallel_size": tp})))


def _decode(n: int, ctx: int = 500) -> Batch:
    return Batch(num_decode_seqs=n, decode_context_tokens=n * ctx, num_logits=n)


def test_default_profile_is_vllm_v1_and_overhead_is_one_serial_cpu_term():
    cost = _dep("vllm-v1").cost
    assert cost.engine.name == "vllm-v1"
    e = cost.engine
    ops = cost.step_time(_decode(8)).ops_s
    assert ops["overhead"] == pytest.approx(e.decode_step_s + 8 * e.per_seq_s)
    pre = cost.step_time(Batch(prefill_chunks=((512, 0),), num_logits=1)).ops_s
    assert pre["overhead"] == pytest.approx(e.prefill_step_s + e.per_seq_s)  # kernels hide the launches


def test_overlapping_engine_hides_cpu_under_gpu_time():
    cost = _dep("sglang").cost
    big = cost.step_time(_decode(64, 2000)).ops_s  # GPU time >> CPU work
    assert big["overhead"] == 0.0
    e = cost.engine
    # CPU-bound: the step lasts the CPU work, no more
    assert e.overhead_s(1e-4, 4, False, 1, 32) == pytest.approx(e.cpu_s(4, False, 1) - 1e-4)


def test_eager_steps_pay_kernel_launches_graphed_decode_does_not():
    over = {"decode_step_ms": 0.0, "per_seq_ms": 0.0, "cuda_graph_max_batch": 16, "eager_launch_per_layer_ms": 0.5}
    cost = _dep("vllm-v0", overhead=over).cost
    assert cost.step_time(_decode(16)).ops_s["overhead"] == 0.0  # replayed graph
    t = cost.step_time(_decode(17))  # above the captured sizes: eager, 32 layers x 0.5 ms of launches
    gpu = t.total_s - t.ops_s["overhead"]
    assert gpu < 16e-3 and t.total_s == pytest.approx(16e-3)
    off = _dep("vllm-v0", overhead={**over, "cuda_graph_decode": False}).cost
    assert off.step_time(_decode(4)).total_s == pytest.approx(16e-3)


def test_overhead_grows_with_tp_ranks():
    one, four = _dep("vllm-v0", 1).cost, _dep("vllm-v0", 4).cost
    e = one.engine
    assert e.per_extra_tp_rank_s > 0
    assert four.step_time(_decode(8)).ops_s["overhead"] - one.step_time(_decode(8)).ops_s["overhead"] == \
        pytest.approx(3 * e.per_extra_tp_rank_s)


def test_every_term_can_be_overridden_and_unknown_keys_fail():
    cost = _dep("trt-llm", overhead={"decode_step_ms": 2.0, "per_seq_ms": 0.1, "overlap_cpu": False}).cost
    assert cost.step_time(_decode(10)).ops_s["overhead"] == pytest.approx(2e-3 + 10 * 1e-4)
    assert "decode_step_ms" in cost.engine.describe()["overridden"]
    with pytest.raises(UserError, match="unknown key 'engine.overhead.fixed_ms'"):
        scenario_from_dict(small_scenario(engine={"overhead": {"fixed_ms": 1}}))
    with pytest.raises(UserError, match="engine.profile"):
        scenario_from_dict(small_scenario(engine={"profile": "tgi"}))
    assert get_profile("custom").cpu_s(100, True, 8) == 0.0


def test_profiles_order_decode_cost_like_the_engines():
    """A 2023 vLLM (Ray workers, serial CPU) pays more per decode step than V1, which pays more
    than the overlapped schedulers at a GPU-bound batch. (SGLang and TensorRT-LLM differ only by
    their attention kernels: TensorRT-LLM's XQA is priced by its own measured table,
    tests/test_engine_attention_tables.py, which includes the rotary and KV-cache-write kernels
    the step otherwise charges as elementwise ops, tests/test_attention_fused_ops.py; the rest
    of the step is equal.)"""
    b = _decode(32, 1000)
    st = {p: _dep(p).cost.step_time(b) for p in ("vllm-v0", "vllm-v1", "sglang", "trt-llm")}
    t = {p: x.total_s for p, x in st.items()}
    assert t["vllm-v0"] > t["vllm-v1"] > max(t["sglang"], t["trt-llm"])
    rest = {p: st[p].total_s - st[p].ops_s["attn_decode"] - st[p].ops_s["elementwise"] for p in ("sglang", "trt-llm")}
    assert rest["sglang"] == pytest.approx(rest["trt-llm"], rel=1e-12)
    assert st["trt-llm"].ops_s["elementwise"] < st["sglang"].ops_s["elementwise"]


def test_result_json_flags_batches_outside_the_measured_range():
    from sim.run import run_scenario
    from sim.metrics.summary import summarize

    def run(profile):
        raw = small_scenario(engine={"profile": profile, "policy": "chunked", "max_num_batched_tokens": 512})
        raw["workload"]["synthetic"]["num_requests"] = 20
        return summarize(run_scenario(scenario_from_dict(raw)))

    res = run("vllm-v0")
    assert res["simsrv_engine_profile"]["name"] == "vllm-v0"
    lo, hi = res["simsrv_overhead_outside_batch_range"]
    assert lo < 8  # the vidur profile starts at batch 8
    assert run("vllm-v1")["simsrv_overhead_outside_batch_range"] is None


def test_vllm_v0_figures_are_the_fit_on_the_cpu_profile():
    """The catalogue's vllm-v0 terms are the least-squares fit on the calibration rows of the
    measured CPU profile (sampler kernel excluded: the cost model charges it), with held-out rows."""
    fit = fit_cpu_profile(ROOT / "kernels_profile")
    e = get_profile("vllm-v0")
    assert e.decode_step_s * 1e3 == pytest.approx(fit["step_ms"], rel=1e-3)
    assert e.per_seq_s * 1e3 == pytest.approx(fit["per_seq_ms"], rel=1e-3)
    assert e.per_extra_tp_rank_s * 1e3 == pytest.approx(fit["per_extra_tp_rank_ms"], rel=1e-3)
    assert list(e.batch_range) == fit["batch_range"]
    assert fit["rows_held_out"] > 0 and fit["held_out_median_pct"] < 40
