"""Fit per-operator efficiency tables from measured kernels, and judge them on held-out shapes.

Why: ``simsrv calibrate`` must show that its costs match measurements the fit never saw.
Each measured row's efficiency is ``roofline_bound / measured_time`` with the GPU's raw
vendor peaks (Williams et al. 2009, "Roofline"); the tables store median log(efficiency) per
measured shape. Rows are held out by shape (every fifth distinct token count, context length
or message size), never at random, so a held-out row's shape is absent from the fit.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from sim.cost.calibration import CALIBRATED_OPS, ENGINE_ATTN_OPS, Calibration, attn_base
from sim.cost.shapes import (ELEM_BYTES_PER_WIDTH, FA2_BLOCK_N, custom_allreduce_link_bytes,  # noqa: F401
                             fa2_num_splits, fa2_split_kv, prefill_pairs, uses_custom_allreduce, wave_padding)
from sim.spec.hardware import GPUSpec
from sim.spec.quantization import NVFP4_BYTES_PER_WEIGHT

ELEM_KIND = {"input_layernorm": "norm", "post_attention_layernorm": "norm", "add": "add", "attn_rope": "rope",
             "mlp_act": "act", "mlp_act_gated": "act_gated"}
# Streaming multiprocessors per GPU: NVIDIA A100 Tensor Core GPU Architecture whitepaper (A100: 108
# SMs); NVIDIA H100 Tensor Core GPU Architecture whitepaper (H100 SXM5: 132 SMs; H200 is the same
# GH100 configuration, 132); NVIDIA Blackwell datasheet / architecture brief (B200: 148); NVIDIA
# L40S datasheet / Ada Lovelace whitepaper (L40S: 142). kernels_profile/hardware.md lists them.
NUM_SMS = {"a100-80g": 108, "h100-sxm": 132, "h200": 132, "b200": 148, "l40s": 142}
# Output tile shapes (rows of m x columns of n) that the GEMM wave term may take; None = no wave
# term. 128x128, 128x256 and 256x128 are the large BF16 tensor-core tiles of cuBLAS/CUTLASS on
# Ampere and Hopper (kernel names such as ``ampere_bf16_s16816gemm_bf16_256x128_ldg8``). The tile
# is selected on the training rows only (``select_terms``), never on held-out ones.
GEMM_TILES = (None, (128, 128), (128, 256), (256, 128))
# Decode kernels that follow FlashAttention-2's split-KV dispatch (``fa2_num_splits``); FA3
# (Hopper, ``vllm_flash_attn_fa3``) has its own heuristic and is not modelled.
FA2_DECODE_KERNELS = ("vllm_flash_attn",)
COMBINE_S = tuple(i * 1e-6 for i in range(11))  # candidate split-KV combine costs, 0..10 us
HOLDOUT_KEY = {"gemm": "m", "gemm_fp8": "m", "gemm_nvfp4": "m", "linear": "m", "attn_prefill": "seq_tokens", "attn_decode": "context_tokens",
               "allreduce": "size_bytes", "custom_allreduce": "size_bytes", "elementwise": "m", "overhead": "batch"}
for _op in ENGINE_ATTN_OPS:
    HOLDOUT_KEY[_op] = HOLDOUT_KEY[attn_base(_op)]
# Every operator a calibration file holds (the fit's and the held-out check's default)
FITTED_OPS = CALIBRATED_OPS + ENGINE_ATTN_OPS
# Operators fitted on one source only (``primary_source``): all but the elementwise kernels
ONE_SOURCE_OPS = tuple(op for op in FITTED_OPS if op != "elementwise")


def custom_allreduce_link_bytes_np(tp, size_bytes) -> np.ndarray:
    """``shapes.custom_allreduce_link_bytes`` over arrays (the fit's rows)."""
    return np.array([custom_allreduce_link_bytes(t, z) for t, z in zip(np.atleast_1d(tp), np.atleast_1d(size_bytes))],
                    dtype=float)


def equivalent_prefill_tokens(pairs):
    """The prompt length s with s (s + 1) / 2 causal pairs: a chunk after cached context is
    looked up in the no-context table at the length that does the same work.
    NOTE: approximation; the Frontier A800 cross-check in ``simsrv calibrate`` measures it."""
    return (-1.0 + np.sqrt(1.0 + 8.0 * np.asarray(pairs, dtype=float))) / 2.0


def wave_factor(m, n, sms: int, tile) -> float:
    """The padded-wave factor of x[m,k] @ W[k,n] with output tiles ``tile``
    (``sim.cost.shapes.wave_padding``; used by ``GemmEff``'s wave term, never in a bound)."""
    return wave_padding(float(m), float(n), sms, tile[0], tile[1])


# (SMs, block) -> {(batch, heads, KV heads, KV length): fa2_split_kv's answer}: the term selection
# asks the same rows' shapes once per fold and candidate
_SPLIT_KV: dict[tuple[int, int], dict[tuple[int, int, int, int], bool]] = {}


def extra_s(df: pl.DataFrame, terms: dict | None) -> np.ndarray:
    """Seconds added to a row's time outside the efficiency: the FA2 split-KV combine kernel of
    decode rows that split (``terms["decode_split"]``), else 0."""
    out = np.zeros(len(df))
    ds = (terms or {}).get("decode_split")
    if not ds or not ds["combine_s"]:
        return out
    idx = np.nonzero(df["op"].to_numpy() == "attn_decode")[0]
    if not len(idx):
        return out
    f = lambda c: df[c].fill_null(0).to_numpy()[idx].astype(int).tolist()  # noqa: E731
    kv_len = [c + s for c, s in zip(f("context_tokens"), f("seq_tokens"))]
    cache = _SPLIT_KV.setdefault((ds["sms"], ds["block"]), {})
    for i, key in zip(idx, zip(f("batch"), f("num_heads"), f("num_kv_heads"), kv_len)):
        hit = cache.get(key)
        if hit is None:
            hit = cache[key] = fa2_split_kv(*key, ds["sms"], ds["block"])
        if hit:
            out[i] = ds["combine_s"]
    return out


def bounds_s(df: pl.DataFrame, gpu: GPUSpec, terms: dict | None = None) -> np.ndarray:
    """Roofline bound (seconds) of every row: max(FLOPs / peak, bytes / HBM bandwidth); a
    collective's bound is a ring all-reduce, 2 (p-1)/p of the buffer over each GPU's link
    (Patarasuk & Yuan 2009). Efficiencies are not applied: that is what is fitted. The
    bound is the one the cost model divides by the efficiency, never a padded one: no step term
    (``terms``) enters it, so a fitted efficiency is the fraction of that bound reached."""
    op = df["op"].to_numpy()
    f = lambda c: df[c].fill_null(0).to_numpy().astype(float)  # noqa: E731
    m, n, k, b = f("m"), f("n"), f("k"), f("batch")
    seq, ctx, h, kvh, d = f("seq_tokens"), f("context_tokens"), f("num_heads"), f("num_kv_heads"), f("head_dim")
    tp, size = f("tp"), f("size_bytes")
    peak, bw = gpu.bf16_flops_per_s, gpu.hbm_bw_bytes_per_s
    out = np.full(len(df), np.nan)
    g = (op == "gemm") | (op == "linear")
    out[g] = np.maximum(2 * m * n * k / peak, 2 * (m * k + k * n + m * n) / bw)[g]
    g8 = op == "gemm_fp8"
    if g8.any():
        # fp8 W8A8: 1-byte activations in and weights, bf16 out, at the FP8 tensor-core peak
        peak8 = getattr(gpu, "fp8_flops_per_s", None) or peak
        out[g8] = np.maximum(2 * m * n * k / peak8, (m * k + k * n + 2 * m * n) / bw)[g8]
    g4 = op == "gemm_nvfp4"
    if g4.any():
        # NVFP4 W4A4: 4.5-bit activations in and weights (scales included), bf16 out, at the FP4 peak
        peak4 = getattr(gpu, "fp4_flops_per_s", None) or peak
        wb = NVFP4_BYTES_PER_WEIGHT
        out[g4] = np.maximum(2 * m * n * k / peak4, (wb * m * k + wb * k * n + 2 * m * n) / bw)[g4]
    # Attention: an engine's own tables (``ENGINE_ATTN_OPS``) have the bound of the operator they
    # time, with its dtypes: ``_fp8kv`` reads a 1-byte K/V cache, ``_fp8`` (FP8 context FMHA:
    # Q, K, V in fp8, QK^T and PV on FP8 tensor cores) runs at the FP8 peak with 1-byte K and V
    # (Q read and O written counted at 2 bytes, as the cost model does).
    base = np.array([attn_base(x) for x in op]) if len(op) else op
    names = op.astype(str)
    fp8_fmha = np.char.endswith(names, "_fp8")
    kvb = np.where(np.char.endswith(names, "_fp8kv") | fp8_fmha, 1.0, 2.0)
    apeak = np.where(fp8_fmha, getattr(gpu, "fp8_flops_per_s", None) or peak, peak)
    p = base == "attn_prefill"
    pairs = prefill_pairs(seq, ctx)
    fl = 4 * h * d * pairs * b
    by = b * ((seq + ctx) * 2 * kvh * d * kvb + 2 * seq * h * d * 2)
    out[p] = np.maximum(fl / apeak, by / bw)[p]
    dd = base == "attn_decode"
    att = ctx + seq
    out[dd] = np.maximum(4 * h * d * att * b / peak, b * (att * 2 * kvh * d * kvb + 2 * h * d * 2) / bw)[dd]
    a = op == "allreduce"
    with np.errstate(divide="ignore", invalid="ignore"):
        out[a] = (2 * (tp - 1) / tp * size / gpu.nvlink_bw_bytes_per_s)[a]
        ca = op == "custom_allreduce"
        out[ca] = custom_allreduce_link_bytes_np(tp[ca], size[ca]) / gpu.nvlink_bw_bytes_per_s
    e = op == "elementwise"
    if e.any():
        per_w = np.array([ELEM_BYTES_PER_WIDTH.get(ELEM_KIND.get(x, ""), np.nan) for x in df["detail"].fill_null("")])
        out[e] = (per_w * m * n / bw)[e]
    return out


def with_efficiency(df: pl.DataFrame, gpu: GPUSpec, terms: dict | None = None) -> pl.DataFrame:
    """Rows with ``bound_s``, ``extra_s`` and ``log_eff`` = log(bound / (time - extra)); a
    positive log_eff is a row beyond the roofline (``beyond_roofline``)."""
    bound, extra = bounds_s(df, gpu, terms), extra_s(df, terms)
    with np.errstate(divide="ignore", invalid="ignore"):
        le = np.log(bound / (df["time_ms"].to_numpy() / 1e3 - extra))
    return df.with_columns(bound_s=pl.Series(bound), extra_s=pl.Series(extra), log_eff=pl.Series(le))


def beyond_roofline() -> pl.Expr:
    """Rows measured faster than their roofline bound (log_eff > 0): their bytes came from
    on-chip cache, not HBM. A microbenchmark repeats one kernel on the same weights, K/V or
    buffer, which stay in L2 (L40S: 96 MB, where 5,034 of 35,672 GEMM rows beat HBM by up to
    3x; the others: skinny GEMMs whose activations fit, elementwise kernels, a few
    collectives). A serving step reads each layer's weights and K/V once, after every other
    layer's traffic has passed through L2, so these rows measure a regime the simulator never
    prices; the fit leaves them out (counted: ``beyond_roofline_rows``) and every fitted
    efficiency stays <= 1 against the bound the cost model divides by it (issue 37)."""
    return pl.col("log_eff") > 0.0


def primary_source(df: pl.DataFrame, op: str) -> str | None:
    """The one source the fit of ``op`` uses, so two kernels are never averaged into one table;
    the others serve as cross-checks. aiconfigurator first (vLLM's own kernels, broadest head
    and shape grid), then the source with the most rows (ties: alphabetical)."""
    s = df.filter(pl.col("op") == op).group_by("source").len()
    if not len(s):
        return None
    s = s.with_columns(aic=~pl.col("source").str.starts_with("aiconfigurator"))
    return s.sort(["aic", "len", "source"], descending=[False, True, False])["source"][0]


def holdout_mask(df: pl.DataFrame, op: str) -> np.ndarray:
    """True for rows whose shape key is every fifth distinct value (positions 2, 7, 12, ...)."""
    col = HOLDOUT_KEY[op]
    vals = sorted(df[col].drop_nulls().unique().to_list())
    held = set(vals[2::5])
    return np.array([v in held for v in df[col].to_list()])


def _grid(df: pl.DataFrame, a: str, b: str) -> dict:
    g = df.group_by(a, b).agg(pl.col("log_eff").median())
    av, bv = sorted(g[a].unique().to_list()), sorted(g[b].unique().to_list())
    look = {(r[a], r[b]): r["log_eff"] for r in g.iter_rows(named=True)}
    return {a: av, b: bv, "log_eff": [[_r(look.get((x, y))) for y in bv] for x in av]}


def _r(v):
    return None if v is None or not math.isfinite(v) else round(float(v), 5)


def _binned_curve(x: np.ndarray, y: np.ndarray, per_octave: int = 4) -> tuple[list, list]:
    """Median log(eff) per bin of log2(x) (``per_octave`` bins per doubling): a smooth curve
    through pooled rows of many models."""
    key = np.round(np.log2(x) * per_octave)
    xs, ys = [], []
    for kb in np.unique(key):
        sel = key == kb
        xs.append(float(np.exp(np.median(np.log(x[sel])))))
        ys.append(_r(np.median(y[sel])))
    return xs, ys


def overhead_coefs(tot: pl.DataFrame) -> tuple[float, float, float]:
    """Least squares ``t = a + c * batch + d * (tp - 1)`` (ms): a fixed cost per step at TP 1, a
    cost per scheduled sequence, and a cost per extra tensor-parallel worker (vidur's TP > 1
    rows carry Ray communication between workers). NOTE: per-model intercepts fit the six
    profiled models better (held-out batch 24: 1.9% against 12%) but do not transfer to the
    catalogue's other models."""
    b, t = tot["batch"].to_numpy().astype(float), tot["time_ms"].to_numpy()
    tp = tot["tp"].to_numpy().astype(float)
    (a, c, d), *_ = np.linalg.lstsq(np.c_[np.ones_like(b), b, tp - 1], t, rcond=None)
    return float(a), float(c), float(d)


def fit_op(df: pl.DataFrame, op: str) -> dict | None:
    """The JSON table of one operator from rows already carrying ``log_eff``."""
    rows = df.filter(pl.col("op") == op)
    if op in ONE_SOURCE_OPS:
        src = primary_source(df, op)
        if src is None:
            return None
        rows = rows.filter(pl.col("source") == src)
    if attn_base(op) == "attn_prefill":
        rows = rows.filter(pl.col("context_tokens") == 0)
    beyond = 0
    if op != "overhead":
        rows = rows.filter(pl.col("log_eff").is_finite())
        beyond = int(rows.select(beyond_roofline().sum()).item())
        rows = rows.filter(~beyond_roofline())
    if len(rows) < 4:
        return None
    return {**_fit_rows(rows, op), **({"beyond_roofline_rows": beyond} if beyond else {})}


def _fit_rows(rows: pl.DataFrame, op: str) -> dict:
    """``fit_op``'s table from its kept rows."""
    srcs = sorted(rows["source"].unique().to_list())
    if op in ("gemm", "gemm_fp8", "gemm_nvfp4"):
        g = rows.group_by("m", "n", "k").agg(pl.col("log_eff").median())
        mv, nv, kv = (sorted(g[c].unique().to_list()) for c in "mnk")
        look = {(r["m"], r["n"], r["k"]): r["log_eff"] for r in g.iter_rows(named=True)}
        return {"m": mv, "n": nv, "k": kv, "sources": srcs,
                "log_eff": [[[_r(look.get((m, n, k))) for m in mv] for k in kv] for n in nv]}
    base = attn_base(op)
    if base in ("attn_prefill", "attn_decode"):
        if base == "attn_decode":
            rows = rows.with_columns(context_tokens=pl.col("context_tokens") + pl.col("seq_tokens"))
        axis = "seq_tokens" if base == "attn_prefill" else "context_tokens"
        tables = []
        for (h, kvh), part in sorted(rows.group_by("num_heads", "num_kv_heads"), key=lambda t: t[0]):
            tables.append({"num_heads": h, "num_kv_heads": kvh, **_grid(part, "batch", axis)})
        return {"sources": srcs, "tables": tables}
    if op in ("allreduce", "custom_allreduce"):
        tables = []
        for (tp,), part in sorted(rows.group_by("tp"), key=lambda t: t[0]):
            g = part.group_by("size_bytes").agg(pl.col("log_eff").median()).sort("size_bytes")
            tables.append({"tp": tp, "size_bytes": g["size_bytes"].to_list(), "log_eff": [_r(v) for v in g["log_eff"]]})
        return {"sources": srcs, "tables": tables}
    if op == "elementwise":
        kinds = rows.with_columns(kind=pl.col("detail").replace_strict(ELEM_KIND, default=None),
                                  bytes=pl.Series(bounds_s(rows, _UNIT_BW)))
        tables = {}
        for (kind,), part in sorted(kinds.group_by("kind"), key=lambda t: t[0]):
            xs, ys = _binned_curve(part["bytes"].to_numpy(), part["log_eff"].to_numpy())
            tables[kind] = {"bytes": xs, "log_eff": ys}
        return {"sources": srcs, "tables": tables}
    if op == "overhead":
        tot = rows.group_by("model", "tp", "batch").agg(pl.col("time_ms").sum()).sort("model", "tp", "batch")
        a, c, d = overhead_coefs(tot)
        return {"sources": srcs, "step_s": float(f"{a / 1e3:.6g}"), "per_seq_s": float(f"{c / 1e3:.6g}"),
                "step_per_extra_tp_s": float(f"{d / 1e3:.6g}"),
                "batch_range": [int(tot["batch"].min()), int(tot["batch"].max())],
                "parts": sorted(rows["detail"].unique().to_list())}
    raise ValueError(op)


class _UnitBW:
    """A stand-in GPU with 1 B/s, so ``bounds_s`` of an elementwise row is its byte count."""
    bf16_flops_per_s = 1.0
    hbm_bw_bytes_per_s = 1.0
    nvlink_bw_bytes_per_s = 1.0


_UNIT_BW = _UnitBW()


def _inner_p90(rows: pl.DataFrame, gpu: GPUSpec, op: str, terms: dict) -> float:
    """Mean over five folds of the p90 error at every fifth distinct shape of ``rows`` (offsets
    0..4): how well ``terms`` predict shapes absent from the fit, judged on these rows alone."""
    col = HOLDOUT_KEY[op]
    vals = sorted(rows[col].drop_nulls().unique().to_list())
    p90s = []
    for off in range(5):
        m = rows[col].is_in(vals[off::5])
        tr, te = rows.filter(~m), rows.filter(m)
        table = fit(tr, gpu, ops=(op,), terms=terms)
        if op not in table or te.is_empty():
            continue
        cal = Calibration(table)
        te = with_efficiency(te, gpu, terms)
        te = te.filter(~beyond_roofline())  # not the regime the cost model prices
        err = ape(predicted_s(cal, te, op), te["time_ms"].to_numpy() / 1e3)
        err = err[np.isfinite(err)]
        if len(err):
            p90s.append(float(np.percentile(err, 90)))
    return float(np.mean(p90s)) if p90s else math.inf


def select_terms(df: pl.DataFrame, gpu: GPUSpec, ops) -> dict:
    """The first-principles step terms for ``gpu``, chosen on ``df`` (the fit's own rows) by
    ``_inner_p90``: the GEMM output tile of the wave term (``GEMM_TILES``, None included) and,
    for FA2 decode kernels, the cost of the split-KV combine kernel (``COMBINE_S``, 0 included).
    GPUs without an SM count (``NUM_SMS``, else the catalogue's ``num_sms``) get neither."""
    sms = NUM_SMS.get(gpu.key) or gpu.num_sms
    terms: dict = {}
    if sms is None:
        return terms
    if "gemm" in ops:
        src = primary_source(df, "gemm")
        if src is not None:
            rows = df.filter((pl.col("op") == "gemm") & (pl.col("source") == src))
            best = min(GEMM_TILES, key=lambda t: _inner_p90(rows, gpu, "gemm", {"gemm_wave": t and {"sms": sms, "tile": list(t)}}))
            if best is not None:
                terms["gemm_wave"] = {"sms": sms, "tile": list(best)}
    if "attn_decode" in ops:
        src = primary_source(df, "attn_decode")
        rows = df.filter((pl.col("op") == "attn_decode") & (pl.col("source") == src)) if src else df.clear()
        if len(rows) and rows["detail"].is_in(list(FA2_DECODE_KERNELS)).all():
            cand = [{"sms": sms, "block": FA2_BLOCK_N, "combine_s": c} for c in COMBINE_S]
            best = min(cand, key=lambda d: _inner_p90(rows, gpu, "attn_decode", {"decode_split": d}))
            if best["combine_s"]:
                terms["decode_split"] = best
    return terms


def fit(df: pl.DataFrame, gpu: GPUSpec, ops=FITTED_OPS, terms: dict | None = None) -> dict:
    """The calibration file's content for ``gpu`` from its profile rows. ``terms`` (the GEMM
    wave term, the FA2 split-KV combine) are selected on these rows unless given."""
    if terms is None:
        terms = select_terms(df, gpu, ops)
    df = with_efficiency(df, gpu, terms)
    out = {"gpu": gpu.key, "peaks": {"bf16_flops_per_s": gpu.bf16_flops_per_s,
                                     "hbm_bw_bytes_per_s": gpu.hbm_bw_bytes_per_s,
                                     "nvlink_bw_bytes_per_s": gpu.nvlink_bw_bytes_per_s}}
    for op in ops:
        t = fit_op(df, op)
        if t is not None:
            if op == "gemm" and terms.get("gemm_wave"):
                t["wave"] = terms["gemm_wave"]
            if op == "attn_decode" and terms.get("decode_split"):
                t["split_kv"] = terms["decode_split"]
            out[op] = t
    if "gemm_fp8" in out or "attn_prefill_trtllm_fp8" in out:
        out["peaks"]["fp8_flops_per_s"] = gpu.fp8_flops_per_s
    if "gemm_nvfp4" in out:
        out["peaks"]["fp4_flops_per_s"] = gpu.fp4_flops_per_s
    return out


def predict_eff(cal: Calibration, rows: pl.DataFrame, op: str) -> np.ndarray:
    """Calibrated efficiency at each row's shape (plain lookups, as the cost model does)."""
    out = np.full(len(rows), np.nan)
    if op in ("gemm", "linear", "gemm_fp8", "gemm_nvfp4"):
        cache = {}
        tab = {"gemm_fp8": cal.gemm_fp8, "gemm_nvfp4": cal.gemm_nvfp4}.get(op) or cal.gemm
        for i, (m, n, k) in enumerate(rows.select("m", "n", "k").iter_rows()):
            c = cache.get((n, k)) or cache.setdefault((n, k), tab.eff_fn(n, k)[0])
            out[i] = c.eff(m)[0]
    elif attn_base(op) in ("attn_prefill", "attn_decode"):
        tab = cal.attention(op)
        for i, (b, s, x, h, kvh) in enumerate(rows.select("batch", "seq_tokens", "context_tokens", "num_heads",
                                                          "num_kv_heads").iter_rows()):
            grid, _, scale = tab.pick(h, kvh)
            b = b * scale
            shape = equivalent_prefill_tokens(prefill_pairs(s, x)) if attn_base(op) == "attn_prefill" else x + s
            out[i] = grid.eff(b, float(shape))[0]
    elif op in ("allreduce", "custom_allreduce"):
        for i, (tp, size) in enumerate(rows.select("tp", "size_bytes").iter_rows()):
            out[i] = cal.allreduce_curve(tp, custom=op == "custom_allreduce").eff(size)[0]
    elif op == "elementwise":
        nbytes = bounds_s(rows, _UNIT_BW)
        for i, (det, nb) in enumerate(zip(rows["detail"].to_list(), nbytes)):
            out[i] = cal.elementwise[ELEM_KIND[det]].eff(nb)[0]
    return out


def predicted_s(cal: Calibration, rows: pl.DataFrame, op: str) -> np.ndarray:
    """Seconds the calibration gives each of ``rows`` (``with_efficiency``'s columns): its bound
    over the efficiency at its shape, plus the time outside the efficiency (``extra_s``)."""
    return rows["bound_s"].to_numpy() / predict_eff(cal, rows, op) + rows["extra_s"].to_numpy()


def ape(pred_s: np.ndarray, meas_s: np.ndarray) -> np.ndarray:
    return np.abs(pred_s - meas_s) / meas_s
