"""Error tables of a calibration: held-out shapes per operator, and cross-source checks.

Why: a calibration is only trusted on data its fit never saw (issue "Calibrate the cost
model"): every figure here predicts rows absent from the fit that produced the prediction.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from sim.cost.calibration import ENGINE_ATTN_OPS, Calibration, attn_base
from sim.cost.fit import (FITTED_OPS, ONE_SOURCE_OPS, ape, beyond_roofline, equivalent_prefill_tokens, fit, overhead_coefs, holdout_mask, predict_eff,
                          predicted_s, primary_source, with_efficiency)
from sim.cost.shapes import prefill_pairs
from sim.spec.hardware import GPUSpec

HELDOUT_OPS = FITTED_OPS
# Cross-source GEMM check: vidur per-layer linear ops (model, TP) predicted from a GEMM table.
CROSS_MODELS = (("meta-llama/Llama-2-7b-hf", 1), ("meta-llama/Llama-2-70b-hf", 4),
                ("codellama/CodeLlama-34b-Instruct-hf", 1))


def _stats(err: np.ndarray) -> dict:
    err = err[np.isfinite(err)]
    if not len(err):
        return {"median_pct": None, "p90_pct": None}
    return {"median_pct": float(np.median(err) * 100), "p90_pct": float(np.percentile(err, 90) * 100)}


def _op_rows(df: pl.DataFrame, op: str) -> pl.DataFrame:
    rows = df.filter(pl.col("op") == op)
    if rows.is_empty():
        return rows
    if op in ONE_SOURCE_OPS:
        rows = rows.filter(pl.col("source") == primary_source(df, op))
    if attn_base(op) == "attn_prefill":
        rows = rows.filter(pl.col("context_tokens") == 0)
    return rows


def heldout_table(df: pl.DataFrame, gpu: GPUSpec, ops=HELDOUT_OPS) -> list[dict]:
    """Per operator: rows fitted, rows held out, median and p90 absolute % error on held-out,
    and the held-out rows beyond the roofline left out of the error (``fit.beyond_roofline``)."""
    out = []
    for op in ops:
        rows = _op_rows(df, op)
        if op == "overhead":
            rows = rows.group_by("model", "tp", "batch").agg(pl.col("time_ms").sum(), pl.col("source").first()).sort("model", "tp", "batch")
            rows = rows.with_columns(op=pl.lit("overhead"), detail=pl.lit("total"))
        if rows.is_empty():
            continue
        held = holdout_mask(rows, op)
        train, test = rows.filter(pl.Series(~held)), rows.filter(pl.Series(held))
        if op == "overhead":
            a, c, d = overhead_coefs(train)
            pred = a + c * test["batch"].to_numpy() + d * (test["tp"].to_numpy() - 1)
            err = ape(pred, test["time_ms"].to_numpy())
        else:
            table = fit(train, gpu, ops=(op,))
            if op not in table:  # too few rows left to fit once the held-out shapes are out
                out.append({"op": op, "rows_fitted": len(train), "rows_held_out": len(test), **_stats(np.array([]))})
                continue
            cal = Calibration(table)
            test = with_efficiency(test, gpu, cal.terms)
            # rows beyond the roofline (L2-resident repeats) are left out, as from the fit
            beyond = int(test.select(beyond_roofline().sum()).item())
            test = test.filter(~beyond_roofline())
            pred_s = predicted_s(cal, test, op)
            err = ape(pred_s, test["time_ms"].to_numpy() / 1e3)
        out.append({"op": op, "rows_fitted": len(train), "rows_held_out": len(test), **_stats(err),
                    **({"rows_beyond_roofline": beyond} if op != "overhead" else {})})
    return out


def _compute_bound(rows: pl.DataFrame, gpu: GPUSpec) -> np.ndarray:
    m, n, k = (rows[c].to_numpy().astype(float) for c in "mnk")
    return 2 * m * n * k / gpu.bf16_flops_per_s > 2 * (m * k + k * n + m * n) / gpu.hbm_bw_bytes_per_s


def cross_source_gemm(df: pl.DataFrame, gpu: GPUSpec, models=CROSS_MODELS) -> list[dict]:
    """GEMM efficiencies fitted on the GEMM tables (aiconfigurator) predict another source's
    per-layer linear ops (vidur ``mlp.csv``); one row per model and one for all together.

    The two sources agree where the GEMM is bandwidth/latency bound and differ by a steady
    factor where it is compute bound (vidur's layers reach ~85% of aiconfigurator's TFLOP/s;
    no fixed per-op overhead: at small token counts the times agree). ``*_corrected`` also
    reports the errors after one throughput factor on compute-bound rows, fitted on vidur's
    other models (disjoint from the targets): median measured/predicted there."""
    lin = df.filter(pl.col("op") == "linear")
    if lin.is_empty() or df.filter(pl.col("op") == "gemm").is_empty():
        return []
    cal = Calibration(fit(df.filter(pl.col("op") == "gemm"), gpu, ops=("gemm",)))
    names = {m for m, _ in models}
    other = with_efficiency(lin.filter(~pl.col("model").is_in(list(names))), gpu, cal.terms)
    factor = 1.0
    if not other.is_empty():
        cb = _compute_bound(other, gpu)
        pred_o = other["bound_s"].to_numpy() / predict_eff(cal, other, "linear")
        if cb.any():
            factor = float(np.median((other["time_ms"].to_numpy() / 1e3)[cb] / pred_o[cb]))
    out, errs, errs_c = [], [], []
    for model, tp in models:
        rows = with_efficiency(lin.filter((pl.col("model") == model) & (pl.col("tp") == tp)), gpu, cal.terms)
        if rows.is_empty():
            continue
        pred_s = rows["bound_s"].to_numpy() / predict_eff(cal, rows, "linear")
        meas = rows["time_ms"].to_numpy() / 1e3
        e = ape(pred_s, meas)
        ec = ape(np.where(_compute_bound(rows, gpu), pred_s * factor, pred_s), meas)
        errs.append(e)
        errs_c.append(ec)
        c = _stats(ec)
        out.append({"target": f"{model} TP{tp}", "rows": len(rows), **_stats(e),
                    "median_ratio": float(np.median(pred_s / meas)),
                    "median_pct_corrected": c["median_pct"], "p90_pct_corrected": c["p90_pct"],
                    "compute_factor": factor})
    if errs:
        e, ec = np.concatenate(errs), np.concatenate(errs_c)
        c = _stats(ec)
        out.append({"target": "all", "rows": len(e), **_stats(e), "median_ratio": None,
                    "median_pct_corrected": c["median_pct"], "p90_pct_corrected": c["p90_pct"],
                    "compute_factor": factor})
    return out


def _chunk_attention_s(gpu: GPUSpec, cal: Calibration, decode: Calibration | None, rows: pl.DataFrame) -> np.ndarray:
    """Seconds the cost model gives each prefill row (sim/cost/roofline.py ``_chunk_attn``): a
    chunk of c tokens after x cached ones takes the measured time of the no-context prompt of
    equal causal work (its own bound over the table's efficiency there), and after cached
    context no less than the calibrated decode kernel's read of those x tokens at the row's
    batch (``decode``: the tables fitted on the primary decode source; None: none)."""
    ctx = rows["context_tokens"].fill_null(0).to_numpy().astype(float)
    # the equal-work prompt: s tokens, s (s + 1) / 2 = the chunk's pairs (its FLOPs exactly, its own bytes)
    equal = rows.with_columns(seq_tokens=pl.Series(equivalent_prefill_tokens(
        prefill_pairs(rows["seq_tokens"].fill_null(0).to_numpy().astype(float), ctx))),
        context_tokens=pl.lit(0.0))
    pred = predicted_s(cal, with_efficiency(equal, gpu, cal.terms), "attn_prefill")
    cached = ctx > 0
    if cached.any() and decode is not None:
        reads = rows.filter(pl.Series(cached)).with_columns(op=pl.lit("attn_decode"), seq_tokens=pl.lit(0, dtype=rows["seq_tokens"].dtype))
        pred[cached] = np.maximum(pred[cached], predicted_s(decode, with_efficiency(reads, gpu, decode.terms), "attn_decode"))
    return pred


def cross_source_attention(df: pl.DataFrame, gpu: GPUSpec) -> list[dict]:
    """Attention tables fitted on the primary source predict every other attention source
    (e.g. Frontier's FlashInfer Llama-2-7B on A800), including prefill chunks after cached
    context, which the cost model looks up at their equivalent prompt length."""
    ops = ("attn_prefill", "attn_decode")
    # each op's tables fitted once on its primary source (the prefill check reads the decode ones)
    cals = {op: Calibration(fit(df, gpu, ops=(op,))) for op in ops if primary_source(df, op) is not None}
    out = []
    for op, cal in cals.items():
        other = df.filter((pl.col("op") == op) & (pl.col("source") != primary_source(df, op)))
        for (src,), rows in other.group_by("source"):
            if op == "attn_prefill":
                pred_s = _chunk_attention_s(gpu, cal, cals.get("attn_decode"), rows)
            else:
                pred_s = predicted_s(cal, with_efficiency(rows, gpu, cal.terms), op)
            meas = rows["time_ms"].to_numpy() / 1e3
            out.append({"op": op, "target": src, "rows": len(rows), **_stats(ape(pred_s, meas)),
                        "median_ratio": float(np.median(pred_s / meas))})
    # An engine's own 16-bit tables (``ENGINE_ATTN_OPS``) priced by the main tables, as they were
    # before the engine had its own: how far the main kernel's timings stand from the engine's
    for eop in ENGINE_ATTN_OPS:
        op = attn_base(eop)
        if eop.endswith(("_fp8", "_fp8kv")) or op not in cals:
            continue
        rows = _op_rows(df, eop)
        if rows.is_empty():
            continue
        rows = rows.with_columns(op=pl.lit(op))
        w = with_efficiency(rows, gpu, cals[op].terms).filter(pl.col("log_eff").is_finite())
        pred_s = predicted_s(cals[op], w, op)
        meas = w["time_ms"].to_numpy() / 1e3
        out.append({"op": op, "target": f"{eop} ({rows['source'][0]})", "rows": len(w), **_stats(ape(pred_s, meas)),
                    "median_ratio": float(np.median(pred_s / meas))})
    return out
