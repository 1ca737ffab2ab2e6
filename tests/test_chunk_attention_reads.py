"""A prompt chunk after cached context: its attention is priced from the work it does and the
cache it reads, never by scaling the cache's bytes with a short prompt's efficiency.

The calibrated prefill table's efficiency is measured against the bound of a no-context prompt
(its own K, V, Q, O bytes). A chunk of c new tokens after x cached ones is looked up at the
prompt length of equal work; before this rule its bytes bound counted all x + c tokens and was
divided by that short prompt's launch-bound efficiency, so a 1-token chunk after 512 cached
tokens (a prefix-cache or CPU-tier hit) cost twice a whole 513-token prompt's attention.
"""

from __future__ import annotations

import pytest

from sim.core.batch import Batch
from sim.cost.calibration import load_calibration
from sim.cost.engine_profile import get_profile
from sim.cost.roofline import RooflineCostModel
from sim.spec.hardware import get_gpu
from sim.spec.models import get_model

CASES = [("llama-3.1-8b", "h100-sxm", 1, "vllm-v1"), ("llama-3.1-70b", "h100-sxm", 4, "sglang"),
         ("llama-2-7b", "a100-80g", 1, "vllm-v0"), ("llama-3.1-8b", "l40s", 1, "vllm-v1"),
         ("llama-3.1-70b", "b200", 2, "vllm-v1-0.34")]
CONTEXTS = (16, 128, 512, 2048, 8192, 32768)


def _cost(model: str, gpu: str, tp: int, profile: str) -> RooflineCostModel:
    g = get_gpu(gpu)
    return RooflineCostModel(get_model(model), g, tp, calibration=load_calibration(g.key), engine=get_profile(profile))


def _attn(cost: RooflineCostModel, c: int, x: int) -> float:
    return cost.step_time(Batch(prefill_chunks=((c, x),), num_logits=1)).ops_s["attn_prefill"]


@pytest.mark.parametrize("model,gpu,tp,profile", CASES)
def test_a_one_token_chunk_costs_no_more_than_the_whole_prompt(model, gpu, tp, profile):
    """From 128 cached tokens on (below, both kernels run at their launch floors, which the
    measured tables give in either order)."""
    cost = _cost(model, gpu, tp, profile)
    for x in CONTEXTS[1:]:
        assert _attn(cost, 1, x) <= _attn(cost, x + 1, 0) * (1 + 1e-9), x


@pytest.mark.parametrize("model,gpu,tp,profile", CASES)
def test_a_one_token_chunk_reads_its_cache_as_a_decode_does(model, gpu, tp, profile):
    """A query of one token over x cached ones is a decode (vLLM V1 split_decodes_and_prefills):
    its attention is the measured decode kernel's read of the x cached tokens, within the
    table's interpolation, and never below it."""
    cost = _cost(model, gpu, tp, profile)
    for x in CONTEXTS:
        decode = cost.step_time(Batch(1, x, (), 1)).ops_s["attn_decode"]
        chunk = _attn(cost, 1, x)
        assert chunk >= decode * (1 - 1e-9), x
        assert chunk <= 1.5 * decode, x


@pytest.mark.parametrize("model,gpu,tp,profile", CASES)
def test_chunk_attention_grows_with_its_cached_context(model, gpu, tp, profile):
    """Up to the measured tables' noise among launch-bound short shapes (a few percent)."""
    cost = _cost(model, gpu, tp, profile)
    for c in (1, 16, 512):
        times = [_attn(cost, c, x) for x in CONTEXTS]
        assert all(b >= 0.95 * a for a, b in zip(times, times[1:])), (c, times)
        assert times[-1] > times[0], (c, times)
