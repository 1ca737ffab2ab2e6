"""Disaggregation (issue 12 item 7): pool defaults, first token from prefill or decode, the
decode side's NIC, layer-wise transfer; figures computed by hand."""

import numpy as np
import pytest

from sim.core.batch import Batch
from sim.engine.cluster import simulate
from sim.cost.runs import RunCost
from sim.core.kv import KVBlockManager
from sim.metrics.vllm_bench import itl_samples
from sim.policies import EngineLimits
from sim.policies.disagg import DecodeScheduler, PrefillScheduler
from sim.engine.router import make_router
from sim.scenario import scenario_from_dict
from sim.engine.topology import Disaggregated, Links, layout_for
from sim.engine.link import LinkNetwork, layerwise_presend_bytes
from sim.core.ttft import ENGINE_TTFT_PARTS as TTFT_PARTS
from sim.workload import RequestArrays

STEP_S = 0.010        # every step, prefill or decode, takes 10 ms
KV_BYTES = 1000.0     # per prompt token: a 1,000-token prompt is 1e6 bytes


class ConstantCost:
    def run_cost(self, batch: Batch) -> RunCost:
        return RunCost(STEP_S, STEP_S, batch.num_steps, False, False)

    def overhead_s(self, num_seqs: int) -> float:
        return 0.0

    def prefill_alone_s(self, tokens: int, context_tokens: int, completing: bool) -> float:
        return STEP_S


def _run(arrival_s, on_decode: bool, links: Links, num_prefill: int = 1, num_decode: int = 1, output: int = 3):
    n = len(arrival_s)
    w = RequestArrays(np.asarray(arrival_s, float), np.full(n, 1000), np.full(n, output))
    limits = EngineLimits(max_num_seqs=16, max_num_batched_tokens=4096, max_model_len=10_000)
    prefill = [PrefillScheduler(limits, KVBlockManager(1000, 16)) for _ in range(num_prefill)]
    decode = [DecodeScheduler(limits, KVBlockManager(1000, 16)) for _ in range(num_decode)]
    for s in prefill:
        s.first_token_on_decode = on_decode

    def topo(env, rec, on_finish):
        return Disaggregated(env, prefill, [ConstantCost()] * num_prefill, decode, [ConstantCost()] * num_decode,
                             make_router("round_robin"), KV_BYTES, links, rec, on_finish)

    reqs, rec = simulate(w, topology=topo)
    return reqs, rec


def test_first_token_from_decode_includes_the_transfer_and_the_first_decode_step():
    """1e6 bytes at 1 GB/s + 0.1 ms latency = 1.1 ms. Prefill convention: TTFT = the 10 ms
    prefill step. vLLM P/D: 10 ms + 1.1 ms + the decode replica's first step (10 ms), and the
    decode side then produces all 3 tokens (2 more steps): E2E = 41.1 ms."""
    links = Links(1e9, 1e9, 1e-4)
    (pre,), _ = _run([0.0], False, links)
    (dec,), rec = _run([0.0], True, links)
    assert pre.first_token_s == pytest.approx(0.010)
    assert pre.finish_s == pytest.approx(0.010 + 0.0011 + 2 * 0.010)
    assert dec.first_token_s == pytest.approx(0.010 + 0.0011 + 0.010)
    assert dec.ttft_kv_transfer_s == pytest.approx(0.0011) and dec.ttft_decode_s == pytest.approx(0.010)
    assert dec.finish_s == pytest.approx(0.0211 + 2 * 0.010)
    assert sum(getattr(dec, p) for p in TTFT_PARTS) == pytest.approx(dec.first_token_s - dec.arrival_s)
    # ITL: the 2 gaps after the first token, 10 ms each (the first decode step is TTFT)
    itl = itl_samples(rec.step_columns(), rec.resume_gaps_s, rec.itl_adjust)
    assert itl.num_samples == 2 and itl.sum_s() == pytest.approx(0.020)


def test_one_token_request_is_handed_off_when_decode_emits_it():
    (r,), _ = _run([0.0], True, Links(1e9, 1e9, 1e-4), output=1)
    assert r.status == "completed" and r.first_token_s == pytest.approx(0.0211) == r.finish_s


def test_decode_nic_is_shared_by_transfers_into_one_decode_replica():
    """Two prefill replicas send 1e6 bytes each at t = 10 ms into one decode replica. Egress
    1 GB/s each; decode ingress 1 GB/s shared: 0.5 GB/s each, so 2 ms (+0.1 ms) instead of 1 ms."""
    reqs, _ = _run([0.0, 0.0], True, Links(1e9, 1e9, 1e-4), num_prefill=2)
    assert [r.ttft_kv_transfer_s for r in reqs] == pytest.approx([0.0021, 0.0021])
    reqs, _ = _run([0.0, 0.0], True, Links(1e9, 4e9, 1e-4), num_prefill=2)  # fast decode NIC
    assert [r.ttft_kv_transfer_s for r in reqs] == pytest.approx([0.0011, 0.0011])


def test_max_min_fair_rates_by_hand():
    """Egress A, B: 100 B/s; ingress D1: 50 B/s, D2: 100 B/s. Flows A->D1, B->D1, B->D2.
    D1 is the bottleneck (50 / 2 = 25 each); B has 75 left for B->D2 (D2 allows 100): 75."""
    net = LinkNetwork([100.0, 100.0], [50.0, 100.0], 0.0)
    net.start("a1", 0, 0, 100.0, 0.0)
    net.start("b1", 1, 0, 100.0, 0.0)
    net.start("b2", 1, 1, 150.0, 0.0)
    assert [net.rate_of(x) for x in ("a1", "b1", "b2")] == pytest.approx([25.0, 25.0, 75.0])
    assert net.next_done_s() == pytest.approx(2.0)  # b2: 150 B at 75 B/s
    assert net.pop_done(2.0) == ["b2"]
    assert net.rate_of("b1") == pytest.approx(25.0)  # D1 still binds
    assert net.next_done_s() == pytest.approx(4.0)   # 50 B left each at 25 B/s


def test_layerwise_transfer_exposes_only_what_the_compute_cannot_hide():
    """32 layers, 32e6 bytes, a 10 ms prefill step. At 50 GB/s the link outruns the compute:
    only the last layer's 1e6 bytes are left, 20 us. At 1 GB/s the link is the bottleneck:
    32 ms - 10 ms x 31/32 = 22.3125 ms exposed."""
    fast = 32e6 - layerwise_presend_bytes(32e6, 32, 0.010, 50e9)
    assert fast / 50e9 == pytest.approx(20e-6)
    slow = 32e6 - layerwise_presend_bytes(32e6, 32, 0.010, 1e9)
    assert slow / 1e9 == pytest.approx(0.0223125)
    assert layerwise_presend_bytes(32e6, 1, 0.010, 50e9) == 0.0


def test_layerwise_transfer_in_a_run():
    """4 layers, 1e6 bytes, a 10 ms step, 1 GB/s: 0.75e6 bytes go during the step, the last
    0.25e6 take 0.25 ms after it (+0.1 ms latency)."""
    (r,), _ = _run([0.0], True, Links(1e9, 1e9, 1e-4, layers=4))
    assert r.ttft_kv_transfer_s == pytest.approx(0.00035)


def _scenario(**kw):
    raw = {"engine": {"policy": "disaggregated"}, "cluster": {"tensor_parallel_size": 2},
           "workload": {"synthetic": {"num_requests": 20}}, **kw}
    return scenario_from_dict(raw)


def test_pools_default_to_the_cluster_tp_and_gpu():
    lay = layout_for(_scenario(hardware={"gpu": "a100-80g"},
                               disaggregation={"prefill": {"replicas": 2}, "decode": {"gpu": "h100-sxm"}}))
    assert lay.num_gpus == 2 * 2 + 1 * 2 and lay.num_replicas == 3
    lay.build()
    (_, pdep), (_, ddep) = lay.pools
    assert (pdep.tp, pdep.gpu.key) == (2, "a100-80g") and (ddep.tp, ddep.gpu.key) == (2, "h100-sxm")
    assert lay.add_capacity()[1] == ["disaggregation.prefill.replicas=3"]
