"""`simsrv calibrate`'s attention cross-check prices prefill chunks after cached context as the
cost model does (sim/cost/roofline.py ``_chunk_attn``), so its reported error is the model's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from sim.cost.calibration import Calibration, load_calibration
from sim.cost.fit import fit
from sim.cost.roofline import RooflineCostModel
from sim.cost.validate import _chunk_attention_s
from sim.core.batch import Batch
from sim.cost.engine_profile import get_profile
from sim.kernels.schema import conform, read_profiles
from sim.spec.hardware import get_gpu
from sim.spec.models import get_model


def test_cross_check_matches_the_cost_models_chunk_rule():
    gpu = get_gpu("a100-80g")
    df = read_profiles(Path(__file__).parent.parent / "kernels_profile" / "a100-80g.parquet")
    cal = Calibration(fit(df, gpu, ops=("attn_prefill",)))
    # Llama-2-7B heads (32 / 32, d 128), one chunk of c tokens after x cached ones
    shapes = [(1, 512), (16, 2048), (128, 1024), (512, 0), (2048, 0)]
    rows = conform(pl.DataFrame({"gpu": ["a100-80g"] * len(shapes), "op": ["attn_prefill"] * len(shapes),
                                 "batch": [1] * len(shapes), "seq_tokens": [c for c, _ in shapes],
                                 "context_tokens": [x for _, x in shapes], "num_heads": [32] * len(shapes),
                                 "num_kv_heads": [32] * len(shapes), "head_dim": [128] * len(shapes)}))
    pred = _chunk_attention_s(gpu, cal, Calibration(fit(df, gpu, ops=("attn_decode",))), rows)
    cost = RooflineCostModel(get_model("llama-2-7b"), gpu, 1, calibration=load_calibration(gpu.key),
                             engine=get_profile("vllm-v1"))
    model = [cost.step_time(Batch(prefill_chunks=((c, x),), num_logits=1)).ops_s["attn_prefill"] / 32
             for c, x in shapes]
    np.testing.assert_allclose(pred, model, rtol=0.02)
