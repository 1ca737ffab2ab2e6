"""Fit of the ``vllm-v0`` engine profile on the measured CPU-overhead profile, with held-out error.

Why: the 2023-era vLLM (Ray workers; the engine of sarathi-serve and vidur) was profiled per
iteration by vidur (``kernels_profile/*.parquet`` rows ``op == "overhead"``, from
vidur/legacy/a100/cpu_overheads.csv): scheduling, input preparation, sampler and output
processing, at batch 8..128 and TP 1/2/4 on six models. The profile's figures in
``sim/catalog/engine_profiles.yaml`` are this fit's output (``fit_cpu_profile``), and a test
checks that they still are.

The sampler part is measured end to end (CPU and its GPU kernel). The cost model charges the
sampling kernel itself (fp32 logits over the vocabulary written and read twice, see
``RooflineCostModel._components``), so that kernel's modelled time is subtracted here: the
sampler is costed once.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from sim.cost.fit import holdout_mask, overhead_coefs
from sim.spec.hardware import get_gpu

# Vocabulary sizes of the profiled models (their HF config.json ``vocab_size``).
VOCAB = {"meta-llama/Llama-2-7b-hf": 32000, "meta-llama/Llama-2-70b-hf": 32000,
         "codellama/CodeLlama-34b-Instruct-hf": 32016, "internlm/internlm-20b": 103168,
         "microsoft/phi-2": 51200, "Qwen/Qwen-72B": 152064}
MEMORY_EFFICIENCY = 0.8  # the roofline's default bandwidth fraction (Efficiencies.memory)


def cpu_rows(profile_dir: Path, gpu_key: str = "a100-80g") -> pl.DataFrame:
    """Per (model, tp, batch): measured per-iteration CPU ms, sampler kernel subtracted."""
    df = pl.read_parquet(Path(profile_dir) / f"{gpu_key}.parquet").filter(pl.col("op") == "overhead")
    tot = df.group_by("model", "tp", "batch").agg(pl.col("time_ms").sum()).sort("model", "tp", "batch")
    bw = get_gpu(gpu_key).hbm_bw_bytes_per_s * MEMORY_EFFICIENCY
    kernel_ms = np.array([VOCAB.get(m, 32000) * 4 * 3 * b / bw * 1e3 for m, b in zip(tot["model"], tot["batch"])])
    return tot.with_columns(time_ms=pl.Series(tot["time_ms"].to_numpy() - kernel_ms))


def fit_output_processing(profile_dir: Path, gpu_key: str = "a100-80g") -> dict:
    """The per-token output-processing part of the fit (vidur's ``process_model_outputs`` rows
    alone, same calibration rows): fixed ms and ms per sequence of one step's outputs. Multi-step
    scheduling amortises scheduling and input preparation over its steps but still processes
    every step's tokens (sim/cost/engine_profile.py)."""
    df = pl.read_parquet(Path(profile_dir) / f"{gpu_key}.parquet").filter(
        (pl.col("op") == "overhead") & (pl.col("detail") == "process_model_outputs"))
    tot = df.group_by("model", "tp", "batch").agg(pl.col("time_ms").sum()).sort("model", "tp", "batch")
    train = tot.filter(pl.Series(~holdout_mask(tot, "overhead")))
    a, c, _ = overhead_coefs(train)
    return {"step_ms": a, "per_seq_ms": c}


def fit_cpu_profile(profile_dir: Path, gpu_key: str = "a100-80g") -> dict:
    """Fixed ms, ms per sequence, ms per extra TP rank (fitted on the calibration rows) and the
    held-out rows' median and p90 absolute % error."""
    tot = cpu_rows(profile_dir, gpu_key)
    held = holdout_mask(tot, "overhead")
    train, test = tot.filter(pl.Series(~held)), tot.filter(pl.Series(held))
    a, c, d = overhead_coefs(train)
    pred = a + c * test["batch"].to_numpy() + d * (test["tp"].to_numpy() - 1)
    err = np.abs(pred / test["time_ms"].to_numpy() - 1.0) * 100
    return {"step_ms": a, "per_seq_ms": c, "per_extra_tp_rank_ms": d,
            "batch_range": [int(tot["batch"].min()), int(tot["batch"].max())],
            "rows_fitted": len(train), "rows_held_out": len(test),
            "held_out_batches": sorted(set(test["batch"].to_list())),
            "held_out_median_pct": float(np.median(err)), "held_out_p90_pct": float(np.percentile(err, 90))}
