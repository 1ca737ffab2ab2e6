"""Calibrated cost model: held-out error bounds, cross-source check, overheads, fallbacks."""

import json

import polars as pl
import pytest
import yaml

from sim.core.batch import Batch
from sim.cost.calibration import describe, load_calibration
from sim.cost.roofline import Efficiencies, RooflineCostModel
from sim.cost.validate import cross_source_gemm, heldout_table
from sim.spec.hardware import get_gpu
from sim.kernels.schema import read_profiles
from sim.spec.models import get_model
from tests.conftest import ROOT, small_scenario
from tests.test_cli import simsrv

# Issue target: held-out median <= 5%, p90 <= 15% for GEMM and both attention kinds on A100
# and H100; met everywhere (kernels_profile/README.md). A100 GEMM (13.9%) needs the wave
# quantization term, A100 decode (12.1%) the FlashAttention-2 split-KV combine term.
BOUNDS = {
    ("a100-80g", "gemm"): (5.0, 15.0), ("a100-80g", "attn_prefill"): (5.0, 15.0),
    ("a100-80g", "attn_decode"): (5.0, 15.0),
    ("h100-sxm", "gemm"): (5.0, 15.0), ("h100-sxm", "attn_prefill"): (5.0, 15.0),
    ("h100-sxm", "attn_decode"): (5.0, 15.0),
}


@pytest.fixture(scope="module")
def profiles():
    return read_profiles(ROOT / "kernels_profile")


@pytest.mark.parametrize("gpu", ["a100-80g", "h100-sxm"])
def test_heldout_errors_within_bounds(profiles, gpu):
    rows = heldout_table(profiles.filter(pl.col("gpu") == gpu), get_gpu(gpu), ops=("gemm", "attn_prefill", "attn_decode"))
    assert {r["op"] for r in rows} == {"gemm", "attn_prefill", "attn_decode"}
    for r in rows:
        med, p90 = BOUNDS[(gpu, r["op"])]
        assert r["rows_held_out"] > 0.1 * r["rows_fitted"]
        assert r["median_pct"] <= med, r
        assert r["p90_pct"] <= p90, r


@pytest.mark.parametrize("gpu", ["a100-80g", "h100-sxm"])
def test_cross_source_gemm_sources_disagree_by_a_steady_factor(profiles, gpu):
    """aiconfigurator's GEMMs (vLLM 0.14/0.24, recent cuBLAS) run 15-20% faster than vidur's
    per-layer linear ops (sarathi-serve) at the same shapes: the median error is 15-18%, not
    the issue's 10%, and it is a bias (predicted/measured ~0.8-0.85), not scatter. The bias
    is a compute-throughput factor (the sources agree at small token counts): one factor on
    compute-bound rows, fitted on vidur's other models, brings the median within 10%."""
    rows = cross_source_gemm(profiles.filter(pl.col("gpu") == gpu), get_gpu(gpu))
    by = {r["target"]: r for r in rows}
    assert len(by) == 4
    assert 10.0 < by["all"]["median_pct"] <= 20.0
    for r in rows[:-1]:
        assert 0.75 <= r["median_ratio"] <= 0.9, r
    assert 1.1 < by["all"]["compute_factor"] < 1.3
    assert by["all"]["median_pct_corrected"] <= 10.0


def _cm(model, gpu, tp=1):
    cal = load_calibration(gpu)
    return RooflineCostModel(get_model(model), get_gpu(gpu), tp, None, Efficiencies(),
                             calibration=cal)


def test_wave_quantization_and_split_kv_rules():
    """A100 (108 SMs), 128x256 tiles: 4096 x 4096 at m = 768 is 96 tiles (one wave), at 1024
    128 tiles (two), the measured 104 -> 204 us. FA2 decode, 8 query / 1 KV head, batch 1: 128
    cached tokens are one KV block (no split), 256 two (split, combine kernel); MHA never splits;
    a batch filling 80% of the 2 x 108 CTA slots never splits."""
    from sim.cost.fit import fa2_split_kv, wave_factor
    assert float(wave_factor(768, 4096, 108, (128, 256))) == pytest.approx(108 / 96)
    assert float(wave_factor(1024, 4096, 108, (128, 256))) == pytest.approx(2 * 108 / 128)
    assert not fa2_split_kv(1, 8, 1, 128, 108) and fa2_split_kv(1, 8, 1, 256, 108)
    assert not fa2_split_kv(1, 32, 32, 4096, 108)
    assert not fa2_split_kv(256, 8, 1, 4096, 108)
    a100, h100 = load_calibration("a100-80g"), load_calibration("h100-sxm")
    assert a100.terms["gemm_wave"] == {"sms": 108, "tile": [128, 256]} and "decode_split" in a100.terms
    assert h100.terms == {}  # selected on training rows: neither term helps Hopper's kernels


def test_split_kv_step_in_the_simulator(profiles):
    """Llama-3-8B (32 query / 8 KV heads) decode at batch 1 on A100: 128 attended tokens are one
    FA2 KV block, 256 split in two and add the combine kernel; the simulator follows the
    measured step (12.8 -> 18.3 us per layer; the shipped fit includes both rows, the held-out
    check above does not)."""
    cm = _cm("llama-3-8b", "a100-80g")
    rows = profiles.filter((pl.col("gpu") == "a100-80g") & (pl.col("op") == "attn_decode") & (pl.col("batch") == 1)
                           & (pl.col("num_heads") == 32) & (pl.col("num_kv_heads") == 8))
    for ctx in (127, 255):
        t = cm.step_time(Batch(num_decode_seqs=1, decode_context_tokens=ctx + 1, num_logits=1)).ops_s["attn_decode"] / 32
        meas = rows.filter(pl.col("context_tokens") == ctx)["time_ms"].median() / 1e3
        assert t == pytest.approx(meas, rel=0.05)


def test_calibrated_gemm_reproduces_a_measured_row(profiles):
    """Llama-2-7B's O projection (4096 x 4096) at 1024 tokens is a measured aiconfigurator shape:
    the calibrated cost is the measured time, per layer."""
    cm = _cm("llama-2-7b", "a100-80g")
    o = cm.step_time(Batch(prefill_chunks=((1024, 0),))).ops_s["gemm_o"] / 32
    row = profiles.filter((pl.col("gpu") == "a100-80g") & (pl.col("op") == "gemm") & (pl.col("m") == 1024)
                          & (pl.col("n") == 4096) & (pl.col("k") == 4096))
    assert o * 1e3 == pytest.approx(row["time_ms"].median(), rel=0.01)


def test_batch1_decode_above_weight_read_floor_with_overheads():
    m, g = get_model("llama-2-7b"), get_gpu("a100-80g")
    cm = _cm("llama-2-7b", "a100-80g")
    c = cm.step_time(Batch(num_decode_seqs=1, decode_context_tokens=1000, num_logits=1))
    floor_s = (m.num_params - m.embedding_params) * m.dtype_bytes / g.hbm_bw_bytes_per_s
    # default engine profile (vllm-v1): decode-only step under a CUDA graph, serial CPU work
    assert c.ops_s["overhead"] == pytest.approx(cm.engine.decode_step_s + cm.engine.per_seq_s)
    assert c.total_s > floor_s + cm.engine.decode_step_s
    gemm = sum(c.ops_s[k] for k in ("gemm_qkv", "gemm_o", "gemm_mlp_up", "gemm_mlp_down", "lm_head"))
    assert gemm > floor_s * 0.95  # batch-1 GEMMs reach at most ~the bandwidth peak


def test_gpu_without_measurements_is_roofline_only():
    assert load_calibration("mi300x") is None
    assert describe(None).startswith("roofline")
    assert "attn_decode" in describe(load_calibration("h100-sxm"))
    assert "roofline only: elementwise" in describe(load_calibration("h200"))  # no vidur layers for H200


def test_extrapolated_shapes_are_flagged():
    """The cost model flags a step whose shape lies outside the measured range (the replica
    counts the steps it runs with it: tests/test_fastforward.py)."""
    cm = _cm("llama-2-7b", "a100-80g")  # A100 GEMMs measured up to m = 8192
    assert not cm.run_cost(Batch(prefill_chunks=((4096, 0),), num_logits=1)).extrapolated
    assert cm.run_cost(Batch(prefill_chunks=((16000, 0),), num_logits=1)).extrapolated
    assert not cm.run_cost(Batch(num_decode_seqs=4, decode_context_tokens=4000, num_logits=4, num_steps=7)).extrapolated


def test_calibrated_run_of_k_steps_equals_sum_of_single_steps():
    cm = _cm("llama-3-8b", "h100-sxm")
    b, ctx, k = 37, 37 * 700, 20
    total = cm.step_time(Batch(num_decode_seqs=b, decode_context_tokens=ctx, num_logits=b, num_steps=k)).total_s
    singles = sum(cm.step_time(Batch(num_decode_seqs=b, decode_context_tokens=ctx + j * b, num_logits=b)).total_s
                  for j in range(k))
    assert total == pytest.approx(singles, rel=1e-7)


def test_result_reports_cost_model_and_engine_overrides(tmp_path):
    raw = small_scenario(hardware={"gpu": "a100-80g"}, model="llama-2-7b",
                         engine={"policy": "chunked", "max_num_batched_tokens": 512, "step_overhead_ms": 3.0,
                                 "per_seq_overhead_ms": 0.1})
    raw["workload"]["synthetic"]["num_requests"] = 30
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    p = simsrv("run", tmp_path / "s.yaml", "--out", tmp_path / "run", "-q")
    assert p.returncode == 0, p.stderr
    res = json.loads((tmp_path / "run" / "result.json").read_text())
    assert res["simsrv_cost_model"].startswith("calibrated (a100-80g): gemm, attn_prefill, attn_decode")
    assert res["simsrv_extrapolated_steps"] == 0
    from sim.engine.deployment import build_deployment
    from sim.scenario import load_scenario
    dep = build_deployment(load_scenario(tmp_path / "s.yaml", []))
    eng = dep.cost.engine
    assert eng.prefill_step_s == eng.decode_step_s == pytest.approx(3e-3) and eng.per_seq_s == pytest.approx(1e-4)


def test_cli_calibrate_prints_tables_and_writes_file(tmp_path):
    out = tmp_path / "cal.json"
    p = simsrv("calibrate", "--gpu", "a100-80g", "--out", out)
    assert p.returncode == 0, p.stderr
    for word in ("held-out", "gemm", "attn_prefill", "attn_decode", "overhead", "cross-source", "TP4"):
        assert word in p.stdout
    # equal up to the last bits of numpy's exp and log, which may differ between releases and
    # CPUs (with numpy 2.4.6, on 2026-12-02, elementwise nodes exp(median(log(bytes))) came
    # out 1-2 ulp off the shipped file's)
    assert _same_numbers(json.loads(out.read_text()),
                         json.loads((ROOT / "sim/catalog/calibration/a100-80g.json").read_text()))


def _same_numbers(a, b, rel: float = 1e-12) -> bool:
    """``a == b`` for JSON values, floats within ``rel`` of each other."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_numbers(a[k], b[k], rel) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_numbers(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
            return True  # NaN in both (Python's json reads and writes NaN)
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and a == pytest.approx(b, rel=rel, abs=0)
    return a == b


def test_same_numbers_allows_last_bits_and_nan_only():
    nan = float("nan")
    assert _same_numbers({"a": [1.0, nan, 3]}, {"a": [1.0 + 2e-16, nan, 3]})
    assert not _same_numbers({"a": [1.0]}, {"a": [1.0 + 1e-9]})
    assert not _same_numbers([nan], [1.0]) and not _same_numbers([1.0], [nan])
    assert not _same_numbers({"a": 1}, {"b": 1}) and not _same_numbers([1.0], [1.0, 2.0])


def test_cli_calibrate_gpu_without_rows_exits_2(tmp_path):
    p = simsrv("calibrate", "--gpu", "mi300x", "--out", tmp_path / "x.json")
    assert p.returncode == 2
    assert "no measured rows" in p.stderr and "Traceback" not in p.stderr


def _unpacked(d):
    """The calibration ``d`` with every packed ``log_eff`` table as nested lists, None where
    unmeasured: the form of a file written before packing."""
    from sim.cost.calibration import log_eff_array

    def nones(v):
        return [nones(x) for x in v] if isinstance(v, list) else (None if v != v else v)

    if isinstance(d, dict):
        return {k: nones(log_eff_array(v).tolist()) if k == "log_eff" else _unpacked(v) for k, v in d.items()}
    return [_unpacked(v) for v in d] if isinstance(d, list) else d


def test_packed_log_eff_round_trips_exactly():
    """Packing keeps every value bit for bit (5-decimal values, None where unmeasured); a small
    table, or one whose values are not k / 10^5, stays a list."""
    import numpy as np

    from sim.cost.calibration import PACK_MIN_VALUES, log_eff_array, pack_log_eff

    rng = np.random.default_rng(3)
    vals = np.round(rng.uniform(-12.0, 0.5, size=(3, 5, 9)), 5).tolist()
    vals[1][2][4] = None
    vals[2][0] = [None] * 9
    packed = pack_log_eff(vals)
    assert isinstance(packed, dict) and packed["shape"] == [3, 5, 9]
    back = log_eff_array(packed)
    want = np.array(vals, dtype=np.float64)
    assert np.array_equal(back, want, equal_nan=True)
    assert all(float(a) == b for a, b in zip(back.ravel()[~np.isnan(want.ravel())], want.ravel()[~np.isnan(want.ravel())]))
    small = vals[0][:1]
    assert len(small[0]) < PACK_MIN_VALUES and pack_log_eff(small) is small
    inexact = (np.array(vals[0] * 20, dtype=float) + 1e-7).tolist()
    assert pack_log_eff(inexact) is inexact


def test_shipped_calibrations_are_packed_and_cost_as_the_lists_do():
    """The shipped files hold their large tables packed (start-up: bench/README.md, "Calibration
    tables packed"), and a calibration read from nested lists (a file of an older simsrv)
    costs every operator exactly as the packed one does."""
    import numpy as np

    from sim.cost.calibration import PACK_MIN_VALUES, Calibration

    def lists(d):
        if isinstance(d, dict):
            for k, v in d.items():
                if k == "log_eff" and isinstance(v, list):
                    yield np.array(v, dtype=np.float64).size
                else:
                    yield from lists(v)
        elif isinstance(d, list):
            for v in d:
                yield from lists(v)

    for path in sorted((ROOT / "sim/catalog/calibration").glob("*.json")):
        d = json.loads(path.read_text())
        assert max(lists(d), default=0) < PACK_MIN_VALUES, path.name
    d = json.loads((ROOT / "sim/catalog/calibration/h100-sxm.json").read_text())
    packed, listed = Calibration(d), Calibration(_unpacked(d))
    for m, n, k in ((1, 4096, 4096), (37, 6144, 4096), (900, 28672, 4096), (5000, 4096, 14336)):
        assert packed.gemm.eff(m, n, k) == listed.gemm.eff(m, n, k)
        assert packed.gemm_fp8.eff(m, n, k) == listed.gemm_fp8.eff(m, n, k)
    for op in ("attn_prefill", "attn_decode"):
        a, b = getattr(packed, op).pick(32, 8), getattr(listed, op).pick(32, 8)
        assert a[1:] == b[1:]
        for batch, tokens in ((1, 100), (7, 3000), (64, 900), (300, 40000)):
            assert a[0].eff(batch, tokens) == b[0].eff(batch, tokens)
    assert packed.elementwise.keys() == listed.elementwise.keys()
