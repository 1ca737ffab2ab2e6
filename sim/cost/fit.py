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

from sim.cost.calibration import Calibration
from sim.hardware import GPUSpec

ELEM_KIND = {"input_layernorm": "norm", "post_attention_layernorm": "norm", "add": "add", "attn_rope": "rope",
             "mlp_act": "act", "mlp_act_gated": "act_gated"}
# Bytes moved per token per unit of row width, 2-byte activations: a norm reads and writes the
# row; a residual add reads two rows and writes one; rotary reads and writes q and k; a gated
# activation reads gate and up (2 I) and writes I; a plain one reads I and writes I.
ELEM_BYTES_PER_WIDTH = {"norm": 4, "add": 6, "rope": 4, "act_gated": 6, "act": 4}
HOLDOUT_KEY = {"gemm": "m", "linear": "m", "attn_prefill": "seq_tokens", "attn_decode": "context_tokens",
               "allreduce": "size_bytes", "elementwise": "m", "overhead": "batch"}


def prefill_pairs(c, x):
    """Causal (query, key) pairs of a chunk of c new tokens after x cached ones:
    c * (x + (c + 1) / 2) (FlashAttention-2, Dao 2023: causal attention is half the square)."""
    return c * (x + (c + 1) / 2.0)


def equivalent_prefill_tokens(pairs):
    """The prompt length s with s (s + 1) / 2 causal pairs: a chunk after cached context is
    looked up in the no-context table at the length that does the same work.
    NOTE: approximation; the Frontier A800 cross-check in ``simsrv calibrate`` measures it."""
    return (-1.0 + np.sqrt(1.0 + 8.0 * np.asarray(pairs, dtype=float))) / 2.0


def bounds_s(df: pl.DataFrame, gpu: GPUSpec) -> np.ndarray:
    """Roofline bound (seconds) of every row: max(FLOPs / peak, bytes / HBM bandwidth); a
    collective's bound is a ring all-reduce, 2 (p-1)/p of the buffer over each GPU's link
    (Patarasuk & Yuan 2009). Efficiencies are not applied: that is what is fitted."""
    op = df["op"].to_numpy()
    f = lambda c: df[c].fill_null(0).to_numpy().astype(float)  # noqa: E731
    m, n, k, b = f("m"), f("n"), f("k"), f("batch")
    seq, ctx, h, kvh, d = f("seq_tokens"), f("context_tokens"), f("num_heads"), f("num_kv_heads"), f("head_dim")
    tp, size = f("tp"), f("size_bytes")
    peak, bw = gpu.bf16_flops_per_s, gpu.hbm_bw_bytes_per_s
    out = np.full(len(df), np.nan)
    g = (op == "gemm") | (op == "linear")
    out[g] = np.maximum(2 * m * n * k / peak, 2 * (m * k + k * n + m * n) / bw)[g]
    p = op == "attn_prefill"
    pairs = prefill_pairs(seq, ctx)
    fl = 4 * h * d * pairs * b
    by = b * ((seq + ctx) * 2 * kvh * d * 2 + 2 * seq * h * d * 2)
    out[p] = np.maximum(fl / peak, by / bw)[p]
    dd = op == "attn_decode"
    att = ctx + seq
    out[dd] = np.maximum(4 * h * d * att * b / peak, b * (att * 2 * kvh * d * 2 + 2 * h * d * 2) / bw)[dd]
    a = op == "allreduce"
    with np.errstate(divide="ignore", invalid="ignore"):
        out[a] = (2 * (tp - 1) / tp * size / gpu.nvlink_bw_bytes_per_s)[a]
    e = op == "elementwise"
    if e.any():
        per_w = np.array([ELEM_BYTES_PER_WIDTH.get(ELEM_KIND.get(x, ""), np.nan) for x in df["detail"].fill_null("")])
        out[e] = (per_w * m * n / bw)[e]
    return out


def with_efficiency(df: pl.DataFrame, gpu: GPUSpec) -> pl.DataFrame:
    bound = bounds_s(df, gpu)
    return df.with_columns(bound_s=pl.Series(bound), log_eff=pl.Series(np.log(bound / (df["time_ms"].to_numpy() / 1e3))))


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
    if op in ("gemm", "attn_prefill", "attn_decode", "allreduce", "overhead"):
        src = primary_source(df, op)
        if src is None:
            return None
        rows = rows.filter(pl.col("source") == src)
    if op == "attn_prefill":
        rows = rows.filter(pl.col("context_tokens") == 0)
    rows = rows.filter(pl.col("log_eff").is_finite()) if op != "overhead" else rows
    if len(rows) < 4:
        return None
    srcs = sorted(rows["source"].unique().to_list())
    if op == "gemm":
        g = rows.group_by("m", "n", "k").agg(pl.col("log_eff").median())
        mv, nv, kv = (sorted(g[c].unique().to_list()) for c in "mnk")
        look = {(r["m"], r["n"], r["k"]): r["log_eff"] for r in g.iter_rows(named=True)}
        return {"m": mv, "n": nv, "k": kv, "sources": srcs,
                "log_eff": [[[_r(look.get((m, n, k))) for m in mv] for k in kv] for n in nv]}
    if op in ("attn_prefill", "attn_decode"):
        if op == "attn_decode":
            rows = rows.with_columns(context_tokens=pl.col("context_tokens") + pl.col("seq_tokens"))
        axis = "seq_tokens" if op == "attn_prefill" else "context_tokens"
        tables = []
        for (h, kvh), part in sorted(rows.group_by("num_heads", "num_kv_heads"), key=lambda t: t[0]):
            tables.append({"num_heads": h, "num_kv_heads": kvh, **_grid(part, "batch", axis)})
        return {"sources": srcs, "tables": tables}
    if op == "allreduce":
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


def fit(df: pl.DataFrame, gpu: GPUSpec, ops=("gemm", "attn_prefill", "attn_decode", "allreduce", "elementwise",
                                           "overhead")) -> dict:
    """The calibration file's content for ``gpu`` from its profile rows."""
    df = with_efficiency(df, gpu)
    out = {"gpu": gpu.key, "peaks": {"bf16_flops_per_s": gpu.bf16_flops_per_s,
                                     "hbm_bw_bytes_per_s": gpu.hbm_bw_bytes_per_s,
                                     "nvlink_bw_bytes_per_s": gpu.nvlink_bw_bytes_per_s}}
    for op in ops:
        t = fit_op(df, op)
        if t is not None:
            out[op] = t
    return out


def predict_eff(cal: Calibration, rows: pl.DataFrame, op: str) -> np.ndarray:
    """Calibrated efficiency at each row's shape (plain lookups, as the cost model does)."""
    out = np.full(len(rows), np.nan)
    if op in ("gemm", "linear"):
        cache = {}
        for i, (m, n, k) in enumerate(rows.select("m", "n", "k").iter_rows()):
            c = cache.get((n, k)) or cache.setdefault((n, k), cal.gemm.curve(n, k)[0])
            out[i] = c.eff(m)[0]
    elif op in ("attn_prefill", "attn_decode"):
        tab = cal.attn_prefill if op == "attn_prefill" else cal.attn_decode
        for i, (b, s, x, h, kvh) in enumerate(rows.select("batch", "seq_tokens", "context_tokens", "num_heads",
                                                          "num_kv_heads").iter_rows()):
            grid, _ = tab.pick(h, kvh)
            shape = equivalent_prefill_tokens(prefill_pairs(s, x)) if op == "attn_prefill" else x + s
            out[i] = grid.eff(b, float(shape))[0]
    elif op == "allreduce":
        for i, (tp, size) in enumerate(rows.select("tp", "size_bytes").iter_rows()):
            out[i] = cal.allreduce_curve(tp).eff(size)[0]
    elif op == "elementwise":
        nbytes = bounds_s(rows, _UNIT_BW)
        for i, (det, nb) in enumerate(zip(rows["detail"].to_list(), nbytes)):
            out[i] = cal.elementwise[ELEM_KIND[det]].eff(nb)[0]
    return out


def ape(pred_s: np.ndarray, meas_s: np.ndarray) -> np.ndarray:
    return np.abs(pred_s - meas_s) / meas_s
