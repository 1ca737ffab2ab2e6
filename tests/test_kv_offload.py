"""KV offloading to CPU memory (issue 40 item 3): vLLM's OffloadingConnector as a second KV tier
(sim/core/kv.py ``CPUTier``): blocks written through to an LRU of ``kv_offloading_size`` GiB, a
prefix that misses the GPU cache but is in the tier loaded back over the host link before the
request is scheduled, the load in the TTFT decomposition, the hybrid KV cache manager off."""

from pathlib import Path

import pytest
import yaml

from sim.core.kv import CPUTier, KVBlockManager, KVGroups, prefix_keys
from sim.core.request import Request
from sim.core.ttft import TTFT_PARTS
from sim.engine.deployment import OFFLOAD_LATENCY_S, build_deployment, offload_blocks
from sim.errors import UserError
from sim.metrics.summary import summarize
from sim.run import run_scenario
from sim.scenario import load_scenario, scenario_from_dict

ROOT = Path(__file__).resolve().parent.parent
BS = 16


def _req(rid: int, ids: list[int], prompt: int | None = None) -> Request:
    r = Request(rid, 0.0, prompt if prompt is not None else len(ids) * BS, 8)
    r.hash_ids, r.hash_block_size = ids, BS
    return r


def _kv(num_blocks: int, tier_blocks: int, prefix_caching: bool = True) -> KVBlockManager:
    kv = KVBlockManager(num_blocks, BS, prefix_caching)
    kv.offload = CPUTier(tier_blocks, 1e-3, 1e-5)
    return kv


def _compute(kv: KVBlockManager, req: Request) -> None:
    """Admit ``req``, compute its prompt and free it (its blocks stay cached, evictable)."""
    hits, own = kv.lookup(req)
    assert kv.allocate(req, req.prompt_tokens, hits, own)
    kv.cache(req, req.prompt_tokens)
    kv.free(req, forget=True)


def test_blocks_evicted_from_the_gpu_stay_in_the_cpu_tier_lru():
    kv = _kv(8, 100)
    a = _req(1, [10, 11, 12, 13, 14])  # 5 full blocks, all hashed
    _compute(kv, a)
    keys = prefix_keys(a, BS)
    assert list(kv.offload.lru) == keys and kv.offload.store_blocks == 5  # written through, in order
    _compute(kv, _req(2, [20, 21, 22, 23, 24, 25, 26, 27]))  # evicts all of a's blocks on the GPU
    assert kv.num_evicted >= 5
    hits, own = kv.lookup(a)
    assert hits == [] and own == 0                       # the GPU cache lost them
    assert kv.offload_hits(a, 0) == 4                    # the tier has them (the last token is computed)
    assert all(k in kv.offload.lru for k in keys)
    # the look-up touched a's blocks: the most recent, its first block last (LRUOffloadingManager.touch)
    assert list(kv.offload.lru)[-5:] == keys[::-1]


def test_a_tier_hit_allocates_the_blocks_and_charges_bytes_over_bandwidth():
    kv = _kv(64, 100)
    a = _req(1, list(range(9)))
    _compute(kv, a)
    kv._cached.clear()  # the GPU cache forgets (as an eviction would)
    kv._queue.clear()
    b = _req(2, list(range(9)))
    n = kv.offload_hits(b, 0)
    assert n == 8
    free = kv.num_free
    assert kv.start_load(b, [], n, now=2.0)
    assert kv.blocks_held(b) == 8 and kv.num_free == free - 8
    end = kv.load_end_s(b)
    assert end == pytest.approx(2.0 + 8 * 1e-3 + 1e-5)  # blocks x block bytes / bandwidth + latency
    t = kv.offload
    assert (t.loads, t.load_blocks) == (1, 8) and t.load_s == pytest.approx(8e-3 + 1e-5)
    # a second load queues behind the first on the one host-to-device stream
    c = _req(3, list(range(9)))
    assert kv.start_load(c, [], 4, now=2.0)
    assert kv.load_end_s(c) == pytest.approx(end + 4e-3 + 1e-5)
    assert t.next_end_s(2.0) == end and t.next_end_s(end) == kv.load_end_s(c)
    assert kv.end_load(b) == 8 and kv.load_end_s(b) == -1.0


def test_the_tier_never_holds_more_than_its_capacity():
    t = CPUTier(4, 1e-3, 0.0)
    t.store([("a", 0), ("a", 1), ("a", 2)], 0)
    t.touch([("a", 0)])
    t.store([("b", 0), ("b", 1)], 0)               # evicts the least recent: a1
    assert t.num_used == 4 and list(t.lru) == [("a", 2), ("a", 0), ("b", 0), ("b", 1)]
    t.store([], 3)                                  # blocks without a hash take room too
    assert t.num_used == 4 and t.evicted_blocks == 4
    t.store([("c", i) for i in range(5)], 0)        # more than the whole tier: nothing stored
    assert t.num_used == 4 and ("c", 0) not in t.lru
    kv = _kv(200, 10)
    for i in range(20):
        _compute(kv, _req(i, [1000 * i + j for j in range(6)]))
        assert kv.offload.num_used <= 10


def test_the_tier_works_without_the_gpu_prefix_cache():
    """vLLM hashes blocks for a KV connector with prefix caching off (EngineCore.__init__)."""
    kv = _kv(64, 100, prefix_caching=False)
    a = _req(1, list(range(5)))
    _compute(kv, a)
    assert kv.offload.store_blocks == 5 and kv.lookup(a) == ([], 0)
    assert kv.offload_hits(_req(2, list(range(5))), 0) == 4


def test_capacity_is_the_size_over_the_ranks_in_blocks():
    """vLLM 0.12 ``_post_init_kv_transfer_config``: size x 2^30 / (tp x pp) per rank."""
    assert offload_blocks(64, 2 * 2**20, 1, 1) == 32768
    assert offload_blocks(64, 2**20, 4, 2) == 8192
    assert offload_blocks(None, 2**20, 1, 1) == 0
    dep = build_deployment(load_scenario(ROOT / "scenarios" / "kv_offload.yaml"))
    assert dep.kv_offload_blocks == 64 * 2**30 // dep.memory.kv_block_bytes_per_gpu
    sched = dep.new_scheduler("chunked")
    assert sched.kv.offload.load_s_per_block == dep.memory.kv_block_bytes_per_gpu / dep.gpu.pcie_bw_bytes_per_s
    assert sched.kv.offload.latency_s == OFFLOAD_LATENCY_S


def _small(**engine) -> dict:
    raw = yaml.safe_load((ROOT / "scenarios" / "kv_offload.yaml").read_text())
    raw["workload"]["synthetic"]["num_requests"] = 300
    raw["engine"].update(engine)
    return raw


@pytest.fixture(scope="module")
def runs():
    on = run_scenario(scenario_from_dict(_small()))
    off = run_scenario(scenario_from_dict(_small(kv_offloading_size=None)))
    return on, off


def test_offloading_raises_the_hit_rate_and_lowers_ttft_under_kv_pressure(runs):
    on, off = (summarize(r) for r in runs)
    assert "simsrv_kv_offload_loads" not in off
    assert on["simsrv_kv_offload_loads"] > 0 and on["simsrv_kv_offload_hit_rate"] > 0.2
    assert on["simsrv_prefix_cache_hit_rate"] + on["simsrv_kv_offload_hit_rate"] > off["simsrv_prefix_cache_hit_rate"] + 0.2
    assert on["median_ttft_ms"] < off["median_ttft_ms"] and on["p99_ttft_ms"] < off["p99_ttft_ms"]
    # the PCIe cost is visible: bytes and seconds of the loads
    assert on["simsrv_kv_offload_load_bytes"] == on["simsrv_kv_offload_load_blocks"] * runs[0].deployment.memory.kv_block_bytes_per_gpu
    assert on["simsrv_kv_offload_load_s"] > 0 and on["simsrv_kv_offload_store_s"] > 0


def test_ttft_parts_add_up_with_loads(runs):
    on = runs[0]
    cols = {p: on.request_column(p) for p in (*TTFT_PARTS, "ttft_s")}
    ok = ~(cols["ttft_s"] != cols["ttft_s"])
    total = sum(cols[p][ok] for p in TTFT_PARTS)
    assert abs(total - cols["ttft_s"][ok]).max() < 1e-9
    assert min(cols[p][ok].min() for p in TTFT_PARTS) >= -1e-12
    assert (cols["ttft_kv_load_s"][ok] > 0).sum() > 10
    off = runs[1]
    assert (off.request_column("ttft_kv_load_s") == 0).all()


def test_loads_fast_forward_exactly():
    """A load ending during a fast-forwarded run of decode steps cuts it (the loaded request is
    scheduled in the next round, as with one step per round). GPU prefix caching off: every
    repeated prefix comes from the tier (with it on, a run's blocks taken ahead evict GPU-cached
    blocks a step-by-step run keeps a little longer: KVBlockManager.release_blocks's NOTE)."""
    raw = _small(enable_prefix_caching=False)
    raw["workload"]["synthetic"]["num_requests"] = 150
    ff = summarize(run_scenario(scenario_from_dict(raw)))
    single = summarize(run_scenario(scenario_from_dict(raw), max_run_steps=1))
    assert ff["simsrv_kv_offload_loads"] == single["simsrv_kv_offload_loads"] > 100
    assert ff["simsrv_num_steps"] == single["simsrv_num_steps"]
    for key in ("mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_e2el_ms"):
        assert ff[key] == pytest.approx(single[key], rel=1e-5), key


def test_a_tier_that_is_never_hit_changes_nothing():
    """Offloading acts only through its hits: unique prompts run as with it off."""
    def raw(size):
        return {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
                "engine": {"policy": "chunked", "gpu_memory_utilization": 0.3, "kv_offloading_size": size},
                "workload": {"synthetic": {"num_requests": 200, "request_rate": 20}}}
    on, off = run_scenario(scenario_from_dict(raw(64))), run_scenario(scenario_from_dict(raw(None)))
    assert summarize(on)["simsrv_kv_offload_loads"] == 0
    for col in ("first_token_s", "finish_s", *TTFT_PARTS):
        assert (on.request_column(col) == off.request_column(col)).all(), col


def test_hybrid_kv_manager_is_off_so_sliding_layers_hold_full_kv():
    """A KV connector disables vLLM's hybrid KV cache manager (vLLM 0.11 VllmConfig.__post_init__)."""
    def dep(size):
        return build_deployment(scenario_from_dict({
            "model": "gemma-2-9b", "hardware": {"gpu": "h100-sxm"},
            "engine": {"max_model_len": 8192, "kv_offloading_size": size},
            "workload": {"synthetic": {"num_requests": 4}}}))
    hybrid, connector = dep(None), dep(16)
    assert hybrid.memory.kv_groups.sliding == 1
    assert connector.memory.kv_groups == KVGroups()
    assert connector.memory.kv_block_bytes_per_gpu == 2 * hybrid.memory.kv_block_bytes_per_gpu


@pytest.mark.parametrize("engine, cluster", [({"policy": "static"}, {}),
                                             ({"num_scheduler_steps": 4, "policy": "continuous"}, {})])
def test_unmodelled_combinations_are_refused_in_one_line(engine, cluster):
    with pytest.raises(UserError, match="engine.kv_offloading_size"):
        scenario_from_dict({"model": "llama-3-8b", "engine": {"kv_offloading_size": 8, **engine},
                            "cluster": cluster, "workload": {"synthetic": {"num_requests": 4}}})
