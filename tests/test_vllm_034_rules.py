"""vLLM 0.34's V1 scheduling rules, selected by the engine profile ``vllm-v1-0.34``
(``EngineLimits.vllm_release``); ``vllm-v1`` keeps vLLM 0.11's. Each rule asserted from the
vLLM 0.34.0 source, both releases side by side (bench/conformance.py checks them against each
version's own scheduler):

- without chunked prefill a prompt over the budget left stops admission (scheduler.py
  ``schedule``: "If chunked_prefill is disabled, we can stop the scheduling here"); 0.11 skips it;
- ``long_prefill_token_threshold`` applies only while more than one request is running or
  waiting ("When it is the only request there is nobody to starve");
- a waiting prompt is admitted only when the blocks of its whole sequence are free
  (``scheduler_reserve_full_isl``, on by default: ``allocate_slots(full_sequence_must_fit)``);
- freed blocks without a hash go to the free queue's head (block_pool.py ``free_blocks``:
  "LIFO reuse of non-cached blocks"), cached ones to its tail; 0.11 puts all at the tail;
- unset ``max_num_batched_tokens``: 16384 on GPUs of >= 160 GiB (arg_utils.py
  ``get_batch_defaults``); without chunked prefill max(max_model_len, default).
"""

import numpy as np
import pytest

from sim.core.kv import KVBlockManager
from sim.core.request import Request
from sim.policies.base import EngineLimits
from sim.policies.budget import profile_release, vllm_default_limits
from sim.policies.chunked import ChunkedScheduler
from sim.policies.continuous import ContinuousScheduler
from sim.spec.hardware import get_gpu


def _limits(release: str, **kw) -> EngineLimits:
    return EngineLimits(vllm_release=release, max_num_seqs=64, **kw)


@pytest.mark.parametrize("release,scheduled,waiting", [("0.11", [0, 3], [2, 1]), ("0.34", [0], [1, 2, 3])])
def test_continuous_prompt_over_the_budget_left(release, scheduled, waiting):
    s = ContinuousScheduler(_limits(release, max_num_batched_tokens=1000, max_model_len=1000), KVBlockManager(1000, 16))
    for rid, n in [(0, 900), (1, 500), (2, 600), (3, 50)]:
        assert s.add_request(Request(rid, 0.0, n, 4), 0.0)
    plan = s.plan_step(0.0)
    assert [r.request_id for r, _ in plan.chunks] == scheduled
    assert [r.request_id for r in s.waiting] == waiting


@pytest.mark.parametrize("release", ["0.11", "0.34"])
def test_long_prefill_threshold_needs_company(release):
    def first_chunk(n_requests: int) -> int:
        s = ChunkedScheduler(_limits(release, max_num_batched_tokens=2048, long_prefill_token_threshold=256),
                             KVBlockManager(1000, 16))
        for rid in range(n_requests):
            s.add_request(Request(rid, 0.0, 1000, 4), 0.0)
        return s.plan_step(0.0).chunks[0][1]

    assert first_chunk(2) == 256
    assert first_chunk(1) == (1000 if release == "0.34" else 256)


@pytest.mark.parametrize("release", ["0.11", "0.34"])
def test_admission_needs_the_whole_sequence_blocks(release):
    # 100 blocks; the first prompt (1000 tokens, 63 blocks) takes 256-token chunks; the second
    # arrives when the first holds 48 blocks and takes 16 more: its first chunk (16 blocks)
    # fits the 36 left, its whole sequence (63 blocks) does not
    s = ChunkedScheduler(_limits(release, max_num_batched_tokens=512, long_prefill_token_threshold=256),
                         KVBlockManager(100, 16))
    s.add_request(Request(0, 0.0, 1000, 4), 0.0)
    s.add_request(Request(9, 0.0, 10, 400), 0.0)  # company: the threshold applies in 0.34 too
    for t in range(3):
        s.on_step_done(s.plan_step(float(t)), t + 1.0)
    s.add_request(Request(1, 3.0, 1000, 4), 3.0)
    plan = s.plan_step(3.0)
    assert [r.request_id for r, _ in plan.chunks] == ([0] if release == "0.34" else [0, 1])
    assert plan.kv_blocked == (release == "0.34")


def _request(rid: int, prompt: int, hashes: list[int]) -> Request:
    r = Request(rid, 0.0, prompt, 4)
    r.hash_ids, r.hash_block_size = np.asarray(hashes), 16
    return r


@pytest.mark.parametrize("to_head", [False, True])
def test_freed_uncached_blocks_are_reused_first_in_034(to_head):
    kv = KVBlockManager(10, 16, True, uncached_to_head=to_head)
    x, y = _request(0, 32, [1, 2]), Request(1, 0.0, 40, 4)   # x: 2 cached blocks; y: 3 uncached
    for r, n in ((x, 32), (y, 40)):
        hits, own = kv.lookup(r)
        assert kv.allocate(r, n, hits, own)
        kv.cache(r, n)
    kv.free(x, forget=True)  # its 2 cached blocks join the queue after the 5 never used
    kv.free(y, forget=True)  # y's blocks: its own cached ones hashed in vLLM too, except the partial last
    kv.allocate_blocks(6)    # 5 never used + 1: y's partial block (0.34) or x's first block (0.11)
    assert kv.num_evicted == (0 if to_head else 1)
    hits, _ = kv.lookup(_request(2, 40, [1, 2, 3]))
    assert len(hits) == (2 if to_head else 1)  # 0.11 evicted x's tail block (freed first)


def test_034_default_budget_tiers():
    b200, h200 = get_gpu("b200"), get_gpu("h200")
    assert vllm_default_limits(b200, "0.34") == (16384, 1024)
    assert vllm_default_limits(b200, "0.11") == (8192, 1024)
    assert vllm_default_limits(h200, "0.34") == vllm_default_limits(h200, "0.11") == (8192, 1024)
    assert profile_release("vllm-v1-0.34") == "0.34" and profile_release("vllm-v1") == "0.11"


@pytest.mark.parametrize("policy", ["chunked", "continuous"])
def test_034_fast_forward_matches_single_steps(policy):
    """Under ``vllm-v1-0.34`` (whole-sequence admission under KV pressure, the threshold, free
    order), fast-forwarded decode runs give the steps and latencies of single steps."""
    from sim.metrics.summary import summarize
    from sim.run import run_scenario
    from sim.scenario import scenario_from_dict

    raw = {"name": "r034", "seed": 3, "model": "llama-3-8b",
           "hardware": {"gpu": "a100-80g", "cost_model": "roofline"}, "cluster": {"replicas": 1},
           "engine": {"policy": policy, "profile": "vllm-v1-0.34", "max_num_seqs": 64, "max_model_len": 4096,
                      "max_num_batched_tokens": 1024 if policy == "chunked" else 4096,
                      "long_prefill_token_threshold": 256 if policy == "chunked" else 0,
                      "gpu_memory_utilization": 0.22},
           "workload": {"synthetic": {"num_requests": 150, "request_rate": 10.0,
                                      "input_tokens": {"dist": "uniform", "min": 100, "max": 2000},
                                      "output_tokens": {"dist": "uniform", "min": 50, "max": 600}}}}
    ff = summarize(run_scenario(scenario_from_dict(raw)))
    single = summarize(run_scenario(scenario_from_dict(raw), max_run_steps=1))
    assert ff["completed"] == single["completed"] == 150
    assert ff["simsrv_num_steps"] == single["simsrv_num_steps"]
    assert ff["simsrv_num_preemptions"] == single["simsrv_num_preemptions"]
    for key in ("mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_itl_ms"):
        assert ff[key] == pytest.approx(single[key], rel=1e-3), key
