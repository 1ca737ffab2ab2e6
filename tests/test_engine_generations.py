"""Engine generations (issue 37 item 5): validation rows tagged and summarised per engine
generation; the 2023 engines' kernels and host costs selected by their engine profiles."""

from __future__ import annotations

import pytest

from sim.analysis.validate import GENERATIONS, load_case_files, load_rows, summarize_rows, validation_dir
from sim.core.batch import Batch
from sim.cost.attention_backend import backend_names, get_backend
from sim.cost.calibration import load_calibration
from sim.cost.engine_profile import get_profile
from sim.cost.roofline import RooflineCostModel
from sim.errors import UserError
from sim.spec.hardware import catalogue, get_gpu
from sim.spec.models import get_model


# --- validation per generation ---------------------------------------------------------------

def test_every_engine_row_names_its_generation():
    """A row that measures an engine says which generation it is (so no row silently drops out of
    the per-generation figures); only the NCCL all-reduce rows measure no engine."""
    for r in load_rows():
        if r.allreduce is not None:
            assert r.generation is None, r.id
        else:
            assert r.generation in GENERATIONS, r.id


def test_summary_per_generation_is_the_summary_of_its_rows_alone():
    rows = load_rows()
    for i, r in enumerate(rows):  # simulated values that differ row by row, no simulation needed
        if r.level == "ordering":
            r.simulated = float(i % 2)
        elif r.measured:
            r.simulated = r.measured * (1.0 + ((i * 37) % 41 - 20) / 100.0)
    s = summarize_rows(rows)
    assert set(s["by_generation"]) == set(GENERATIONS)
    for g in GENERATIONS:
        alone = summarize_rows([r for r in rows if r.generation == g])
        assert s["by_generation"][g] == {k: alone[k] for k in ("step", "request", "ordering")}
    assert s["by_generation"]["2023"]["step"] != s["by_generation"]["2024-26"]["step"]
    # the overall figures are still over every row
    assert s["ordering"]["total"] == sum(s["by_generation"][g]["ordering"]["total"] for g in GENERATIONS)


def test_an_unknown_generation_is_one_error_line_naming_file_and_row(tmp_path):
    f = tmp_path / "VC-99.yaml"
    f.write_text("case: VC-99\ngeneration: '2019'\nrows:\n"
                 "  - {id: VC-99/a, level: step, metric: median_ttft_ms, measured: 10, scenario: {}}\n")
    with pytest.raises(UserError, match=r"VC-99.yaml: row VC-99/a: generation '2019' is not one of 2023, 2024-26"):
        load_case_files([f], str(tmp_path))
    f.write_text("case: VC-99\ngeneration: '2023'\nrows:\n"
                 "  - {id: VC-99/a, generation: '2024-26', level: step, metric: median_ttft_ms, measured: 10, scenario: {}}\n")
    (r,) = load_case_files([f], str(tmp_path))
    assert r.generation == "2024-26"  # a row's own generation overrides its case's


def test_validation_dir_has_a_2023_trtllm_case_per_table():
    ids = {r.id for r in load_rows(validation_dir())}
    assert "VC-50/falcon-180b-tp8/a100/bs128/128-2048" in ids  # the Falcon-180B A100 fp16 row


# --- pre-XQA masked multi-head attention: 16-bit re-reads through L2 ---------------------------

def _cm(backend: str, kv_bytes: int, gpu: str, model: str = "llama-2-70b", tp: int = 4) -> RooflineCostModel:
    g = get_gpu(gpu)
    return RooflineCostModel(get_model(model), g, tp, kv_bytes, engine=get_profile("trt-llm", {"attention_backend": backend}),
                             calibration=load_calibration(g.key))


def _attn_s(cm: RooflineCostModel, n: int = 240, ctx: int = 2000) -> float:
    return cm.step_time(Batch(num_decode_seqs=n, decode_context_tokens=n * ctx, num_logits=n)).ops_s["attn_decode"]


def test_mmha_16bit_gqa_cache_is_reread_per_query_head_from_l2():
    """Llama-2-70B TP4 on A100 fp16 (TensorRT-LLM v0.6.1's table): 16 query heads on 2 KV heads
    per GPU. Each of a group's 8 blocks reads its KV head's cache: once from HBM, the rest from
    L2 at its 5,120 bytes/clk, so decode attention costs 8 x 2.039 / 7.22 = 2.26x XQA's (it cost
    the same before: re-reads were free with a 16-bit cache) in bytes; in time, 1.5-2.4x: MMHA's
    efficiency is the MHA-shaped kernel's at 16 x the batch, XQA's its grouped tile's on the
    same (main) tables (tests/test_mmha_fp8_kv.py; XQA's own measured table, TensorRT-LLM 1.0,
    prices it 2.45x faster than MMHA here: tests/test_engine_attention_tables.py)."""
    from sim.cost.calibration import ENGINE_ATTN_OPS, Calibration
    a100 = get_gpu("a100-80g")
    main = Calibration({k: v for k, v in load_calibration("a100-80g").raw.items() if k not in ENGINE_ATTN_OPS})
    mmha = _cm("trtllm-mmha", 2, "a100-80g")
    xqa = RooflineCostModel(get_model("llama-2-70b"), a100, 4, 2, engine=get_profile("trt-llm", {"attention_backend": "trtllm"}),
                            calibration=main)
    expected = 8 * a100.hbm_bw_bytes_per_s / a100.l2_read_bw_bytes_per_s
    assert mmha.decode_kv_reads == pytest.approx(expected) and 2.2 < expected < 2.3
    assert 1.5 < _attn_s(mmha) / _attn_s(xqa) < 2.4
    # an 8-bit cache converts in every block: once per query head at HBM bandwidth (XQA blog)
    assert _cm("trtllm-mmha", 1, "h200").decode_kv_reads == 8
    # a GPU whose L2 bandwidth is not published: the re-reads at HBM bandwidth
    assert get_gpu("h200").l2_read_bw_bytes_per_s is None
    assert _cm("trtllm-mmha", 2, "h200").decode_kv_reads == 8
    # MHA (a group of one head) re-reads nothing
    assert _cm("trtllm-mmha", 2, "a100-80g", model="llama-2-7b", tp=1).decode_kv_reads == 1


@pytest.mark.parametrize("backend", backend_names())
def test_read_factor_lies_between_one_read_and_one_per_query_head(backend):
    """Every backend on every catalogue GPU and cache dtype: a decode step reads each KV byte at
    least once and at most once per query head of its group (in HBM time)."""
    b = get_backend(backend)
    for key in catalogue():
        g = get_gpu(key)
        l2 = g.l2_read_bw_bytes_per_s
        hbm_per_l2 = 1.0 if l2 is None else g.hbm_bw_bytes_per_s / l2
        assert hbm_per_l2 <= 1.0, key  # an L2 no slower than the HBM behind it
        for q, kv in ((64, 8), (232, 8), (32, 32), (29, 1)):
            for kv_bytes in (1, 2):
                f = b.decode_kv_read_factor(q, kv, kv_bytes, hbm_per_l2)
                assert 1.0 <= f <= q / kv, (key, q, kv, kv_bytes)


# --- the 2023 engine profiles ------------------------------------------------------------------

REREADING_BACKENDS = ("trtllm-mmha", "vllm-paged-v0.2")  # a block per query head (pre-XQA, vLLM 0.2)


def test_2023_profiles_select_their_loop_graphs_and_kernels():
    trt = get_profile("trt-llm-2023")
    assert trt.attention_backend == "trtllm-mmha"          # before XQA (v0.8)
    assert not trt.overlap_cpu and not trt.cuda_graph_decode  # GptSession: serial loop, graphs opt-in
    assert trt.kv_memory_basis == "free"
    v02 = get_profile("vllm-v0.2")
    assert v02.attention_backend == "vllm-paged-v0.2"
    assert not v02.cuda_graph_decode                       # CUDA graphs came in 0.2.6
    assert not v02.frontend_overlap                        # AsyncLLMEngine in the server's process
    v0 = get_profile("vllm-v0")                            # the measured CPU terms are vidur's, shared
    for f in ("prefill_step_s", "decode_step_s", "per_seq_s", "per_extra_tp_rank_s", "output_step_s", "output_per_seq_s"):
        assert getattr(v02, f) == getattr(v0, f), f


@pytest.mark.parametrize("profile", ["vllm-v0.2", "trt-llm-2023"])
@pytest.mark.parametrize("tp", [2, 8])
def test_eager_decode_step_is_never_shorter_than_its_launches(profile, tp):
    """Without CUDA graphs every decode step launches each layer's kernels from the host: no
    step, at any batch, is shorter than those launches plus (serial engines) the CPU work."""
    p = get_profile(profile)
    m, g = get_model("llama-2-70b"), get_gpu("a100-80g")
    cm = RooflineCostModel(m, g, tp, 2, engine=p, calibration=load_calibration(g.key))
    launch_s = m.num_layers * p.eager_launch_per_layer_s
    for n in (1, 8, 64, 256):
        st = cm.step_time(Batch(num_decode_seqs=n, decode_context_tokens=n * 300, num_logits=n))
        assert st.total_s >= launch_s + p.cpu_s(n, False, tp) - 1e-12, n


def test_vllm_02_rereads_a_16bit_gqa_cache_from_l2():
    """vLLM 0.2's paged_attention runs a block per (query head, sequence): Llama-2-70B TP4 on A100
    reads its 16-bit cache 8 x 2.039 / 7.22 = 2.26 times in HBM time (vllm-v0's charge: once)."""
    a100 = get_gpu("a100-80g")
    m = get_model("llama-2-70b")
    cm = RooflineCostModel(m, a100, 4, 2, engine=get_profile("vllm-v0.2"), calibration=load_calibration(a100.key))
    assert cm.decode_kv_reads == pytest.approx(8 * a100.hbm_bw_bytes_per_s / a100.l2_read_bw_bytes_per_s)


def _row_backend(r) -> tuple[str, str]:
    e = (r.scenario or {}).get("engine") or {}
    profile = e.get("profile", "vllm-v1")
    return profile, e.get("attention_backend") or (e.get("overhead") or {}).get("attention_backend") \
        or get_profile(profile).attention_backend


def test_each_validation_row_runs_its_generations_kernels():
    """A row of a later engine never runs a 2023 kernel; a 2023 TensorRT-LLM row before XQA runs
    its 2023 profile (whose default kernel is the pre-XQA one)."""
    for r in load_rows():
        if r.scenario is None or r.status != "ok":
            continue
        profile, backend = _row_backend(r)
        if r.generation == "2024-26":
            assert backend not in REREADING_BACKENDS and profile not in ("vllm-v0.2",), r.id
        if r.generation == "2023" and profile.startswith("trt-llm"):
            assert profile == "trt-llm-2023", r.id


def test_explain_shows_the_generations_kernels_and_launches():
    from sim.analysis.explain import explain
    from sim.engine.deployment import build_deployment
    from sim.scenario import scenario_from_dict
    from tests.conftest import small_scenario

    def figures(profile: str) -> dict:
        s = scenario_from_dict(small_scenario(model="llama-2-70b", hardware={"gpu": "a100-80g"},
                                              cluster={"tensor_parallel_size": 4}, engine={"profile": profile}))
        return explain(build_deployment(s), 1024, 8)

    old, new = figures("vllm-v0.2"), figures("vllm-v0")
    assert old["decode_kv_reads"] == pytest.approx(8 * 2.039 / 7.2192, rel=1e-3) and new["decode_kv_reads"] == 1.0
    assert old["decode_launch_ms"] == pytest.approx(80 * 0.232) and new["decode_launch_ms"] == 0.0  # eager vs graphed
