"""Nodes (issue 37 item 4): a replica's GPUs placed on nodes (TP innermost, then PP, then DP),
and every collective that spans nodes priced on the inter-node link: the TP all-reduce
(NCCL's ring or tree through the network), pipeline sends, the expert-parallel all-to-all and disaggregated KV
transfer. Single-node deployments cost what they did before nodes existed."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.core.batch import Batch
from sim.cost.collectives import multinode_allreduce_choice, multinode_allreduce_s, multinode_option_s
from sim.cost.pipeline import PipelineCostModel
from sim.cost.roofline import Efficiencies, RooflineCostModel
from sim.engine.deployment import all2all_links, build_deployment
from sim.errors import UserError
from sim.scenario import scenario_from_dict
from sim.spec.hardware import get_gpu
from sim.spec.models import get_model
from sim.spec.nodes import NodeLinks, boundary_crosses, check_placement, kv_transfer_links, node_links

ROOT = Path(__file__).resolve().parent.parent
TOKENS = (1, 8, 64, 256, 512, 2048, 8192)


def _scn(model="llama-3.1-70b", gpu="h100-sxm", cost_model="roofline", engine=None, **cluster):
    return scenario_from_dict({"model": model, "hardware": {"gpu": gpu, "cost_model": cost_model}, "cluster": cluster,
                               "engine": {"max_model_len": 8192, **(engine or {})},
                               "workload": {"synthetic": {"num_requests": 24, "request_rate": 4.0,
                                                          "input_tokens": {"dist": "fixed", "value": 512},
                                                          "output_tokens": {"dist": "fixed", "value": 32}}}})


def _links(gpn=8, gb_per_s=50.0, latency_us=10.0):
    return NodeLinks(gpn, gb_per_s * 1e9, latency_us / 1e6)


def _ar_s(tp, links, tokens=512, model="llama-3.1-70b", cal=None):
    m, g = get_model(model), get_gpu("h100-sxm")
    cm = RooflineCostModel(m, g, tp, calibration=cal, nodes=links)
    return cm._per_tokens(tokens)[1]


def test_catalogue_node_defaults():
    h100, a100, gh200, gb200 = (get_gpu(k) for k in ("h100-sxm", "a100-80g", "gh200", "gb200"))
    assert (h100.gpus_per_node, h100.inter_node_bw_bytes_per_s) == (8, 50e9)  # DGX H100, CX7 400 Gb/s per GPU
    assert (a100.gpus_per_node, a100.inter_node_bw_bytes_per_s) == (8, 25e9)  # DGX A100, CX6 200 Gb/s per GPU
    assert gh200.gpus_per_node == 1 and gb200.gpus_per_node == 72
    assert h100.inter_node_latency_s == 10e-6
    links = node_links(_scn().cluster, h100)
    assert (links.gpus_per_node, links.inter_bytes_per_s, links.inter_latency_s) == (8, 50e9, 10e-6)
    given = node_links(_scn(gpus_per_node=4, inter_node={"bandwidth_gb_per_s": 3.125, "latency_us": 25}).cluster, h100)
    assert (given.gpus_per_node, given.inter_bytes_per_s, given.inter_latency_s) == (4, 3.125e9, 25e-6)


def test_multinode_ring_by_hand():
    # NCCL's ring over 8 GPUs on 2 nodes (tuning.cc): Simple moves 2 x 7/8 of the buffer over the
    # ring's bus bandwidth (min of NVLink and the 4 GPUs' NIC share); latency 8.4 + 10 intra steps
    # at max(3.4, 3 x 2) + 4 network steps at 14 + 2 x 10 us, x 1.4 (plateau)
    s, nv, nic = 1e6, 360e9, 40e9
    lat_us = (8.4 + 10 * 6.0 + 4 * (14.0 + 20.0)) * 1.4
    want = lat_us * 1e-6 + s / (4 * nic * 8 / 14)
    assert multinode_option_s(s, 8, 2, 4 * nic, 0, 10e-6, "ring", "Simple") == pytest.approx(want, rel=1e-12)
    assert multinode_allreduce_s(s, 8, 2, nv, 0, nic, 10e-6) <= want
    # the network carries 2 (N - 1) / N of the buffer, not a hierarchical 2 (n - 1) / n of it:
    # at a large buffer the time approaches that bound from above
    big = 1e9
    assert multinode_allreduce_s(big, 8, 2, nv, 0, nic, 10e-6) > 2 * 7 / 8 * big / (4 * nic)


def test_multinode_choice_is_nccls_cheapest_option():
    for size in (1e3, 3e4, 7e5, 8e6, 6.4e7):
        t, a, p = multinode_allreduce_choice(size, 16, 2, 360e9, 0, 8 * 50e9, 10e-6)
        opts = [multinode_option_s(size, 16, 2, min(360e9, 8 * 50e9), 0, 10e-6, aa, pp)
                for aa in ("tree", "ring") for pp in ("LL", "LL128", "Simple")]
        assert t == min(opts)
    # LL128 needs an NVLink path within the node (tuning.cc ``typeIntra <= PATH_NVB``)
    assert multinode_option_s(1e6, 8, 2, 20e9, 1, 10e-6, "ring", "LL128") == float("inf")


def test_cross_node_allreduce_slower_than_within_a_node():
    for tokens in TOKENS:
        within = _ar_s(8, _links(gpn=8), tokens)
        across = _ar_s(8, _links(gpn=4), tokens)
        assert across > within, tokens
    # the cost model's own figure is NCCL's multi-node one, two all-reduces per layer
    m = get_model("llama-3.1-70b")
    e = Efficiencies()
    size = 512 * m.hidden_size * m.dtype_bytes
    one = multinode_allreduce_s(float(size), 8, 2, 450e9 * e.link, 0, 50e9 * e.link, 10e-6)
    assert _ar_s(8, _links(gpn=4)) == pytest.approx(2 * m.num_layers * one, rel=1e-12)


def test_cross_node_allreduce_ignores_the_intra_node_calibration():
    from sim.cost.calibration import load_calibration

    cal = load_calibration("h100-sxm")
    assert cal is not None
    # measured curves are within a node; across nodes NCCL's multi-node model prices it
    assert _ar_s(16, _links(gpn=8), cal=cal) == pytest.approx(_ar_s(16, _links(gpn=8)), rel=1e-12)


def test_allreduce_monotone_in_inter_node_bandwidth():
    for tokens in TOKENS:
        # never slower on a faster network; strictly faster, where the buffer is bandwidth-bound,
        # while the node's network (8 GPUs' shares) is slower than NVLink (450 x 0.8 GB/s)
        # (small buffers take LL, capped at NCCL's llMaxBw whatever the network)...
        times = [_ar_s(16, _links(gb_per_s=bw), tokens) for bw in (1.0, 3.125, 12.5, 25.0, 40.0)]
        assert all(a > b if tokens >= 512 else a >= b for a, b in zip(times, times[1:])), tokens
        # ...then the ring's bus bandwidth is NVLink's, whatever the network (NCCL: one speed per channel)
        faster = [_ar_s(16, _links(gb_per_s=bw), tokens) for bw in (40.0, 50.0, 100.0, 400.0)]
        assert all(a >= b for a, b in zip(faster, faster[1:])), tokens


def test_latency_term_per_call_and_per_network_step():
    for tp, gpn in ((16, 8), (32, 8), (8, 2)):
        n = tp // gpn
        base = _ar_s(tp, _links(gpn=gpn, latency_us=0.0))
        more = _ar_s(tp, _links(gpn=gpn, latency_us=100.0))
        assert more > base
        # NCCL's ring: the link's latency on each of its 2 nNodes network steps (twice under
        # Simple, its flush; then x 1.4, the plateau); its tree: on each of 2 log2(nNodes)
        ring_ll = [multinode_option_s(1e5, tp, n, 40e9, 0, lat, "ring", "LL") for lat in (0.0, 100e-6)]
        assert ring_ll[1] - ring_ll[0] == pytest.approx(2 * n * 100e-6, rel=1e-9)
        ring_simple = [multinode_option_s(1e5, tp, n, 40e9, 0, lat, "ring", "Simple") for lat in (0.0, 100e-6)]
        assert ring_simple[1] - ring_simple[0] == pytest.approx(1.4 * 2 * n * 200e-6, rel=1e-9)
        tree_ll = [multinode_option_s(1e5, tp, n, 40e9, 0, lat, "tree", "LL") for lat in (0.0, 100e-6)]
        assert tree_ll[1] - tree_ll[0] == pytest.approx(2 * (n.bit_length() - 1) * 100e-6, rel=1e-9)


def test_single_node_cost_unchanged_with_any_node_settings():
    """Within one node the inter-node link never enters: the same floats as a model without nodes."""
    from sim.cost.calibration import load_calibration

    m, g = get_model("llama-3.1-70b"), get_gpu("h100-sxm")
    for cal in (None, load_calibration("h100-sxm")):
        for tp in (1, 2, 4, 8):
            bare = RooflineCostModel(m, g, tp, calibration=cal)
            noded = RooflineCostModel(m, g, tp, calibration=cal, nodes=_links(gpn=8, gb_per_s=0.5, latency_us=999))
            for t in TOKENS:
                assert noded._per_tokens(t) == bare._per_tokens(t)
                b = Batch(num_decode_seqs=t, decode_context_tokens=t * 300, num_logits=t)
                assert noded.run_durations_s(b) == bare.run_durations_s(b)


def test_single_node_run_identical_with_node_keys():
    from sim.metrics.summary import summarize
    from sim.run import run_scenario

    def run(**extra):
        s = _scn("llama-3-8b", cost_model="calibrated", tensor_parallel_size=4, **extra)
        d = summarize(run_scenario(s))
        return {k: v for k, v in d.items() if k != "date" and "wall" not in k}

    plain = run()
    assert run(gpus_per_node=8, inter_node={"bandwidth_gb_per_s": 0.1, "latency_us": 1000}) == plain


def test_tp8_across_two_slow_nodes_slower_than_tp4_pp2():
    """Issue 37's case: TP8 over two nodes joined by 100 Gb/s Ethernet must not beat TP4 x PP2
    (Sarathi-Serve Fig. 13a); before nodes existed every all-reduce ran on NVLink."""
    slow = {"gpus_per_node": 4, "inter_node": {"bandwidth_gb_per_s": 3.125}}
    tp8 = build_deployment(_scn("falcon-180b", "a100-80g", tensor_parallel_size=8, **slow,
                                engine={"allow_long_max_model_len": True}))
    pp2 = build_deployment(_scn("falcon-180b", "a100-80g", tensor_parallel_size=4, pipeline_parallel_size=2, **slow,
                                engine={"allow_long_max_model_len": True}))
    one = build_deployment(_scn("falcon-180b", "a100-80g", tensor_parallel_size=8,
                                engine={"allow_long_max_model_len": True}))
    mixed = Batch(num_decode_seqs=32, decode_context_tokens=32_000, prefill_chunks=((512, 0),), num_logits=33)
    for b in [Batch(num_decode_seqs=n, decode_context_tokens=n * 1000, num_logits=n) for n in (64, 128, 256)] + [mixed]:
        across, piped = tp8.cost.run_durations_s(b)[0], pp2.cost.run_durations_s(b)[0]
        assert across > piped, b
        # on one 8-GPU node (NVLink) the same TP8 is the faster of the two
        assert one.cost.run_durations_s(b)[0] < piped, b


def test_pp_boundaries_crossing_nodes():
    assert boundary_crosses(_links(gpn=8), 4, 4) == (False, True, False)
    assert boundary_crosses(_links(gpn=8), 8, 3) == (True, True)
    assert boundary_crosses(_links(gpn=8), 2, 4) == (False, False, False)  # one node
    d = build_deployment(_scn("llama-3.1-70b", tensor_parallel_size=4, pipeline_parallel_size=4))
    cost = d.cost
    assert isinstance(cost, PipelineCostModel)
    e = Efficiencies()
    assert cost.boundaries == ((450e9 * e.link, 10e-6), (50e9 * e.link, 10e-6), (450e9 * e.link, 10e-6))
    assert cost.send_s(1000, 1) > cost.send_s(1000, 0) == cost.send_s(1000, 2)
    # a slower network lengthens only the crossing boundary's send, and the step
    slow = build_deployment(_scn("llama-3.1-70b", tensor_parallel_size=4, pipeline_parallel_size=4,
                                 inter_node={"bandwidth_gb_per_s": 5.0, "latency_us": 50}))
    assert slow.cost.send_s(1000, 0) == cost.send_s(1000, 0)
    assert slow.cost.send_s(1000, 1) > cost.send_s(1000, 1)
    b = Batch(prefill_chunks=((2048, 0),) * 4, num_logits=4)
    assert slow.cost.run_durations_s(b)[0] > cost.run_durations_s(b)[0]
    # cluster.pipeline_link_gb_per_s still sets every boundary
    fixed = build_deployment(_scn("llama-3.1-70b", tensor_parallel_size=4, pipeline_parallel_size=4,
                                  pipeline_link_gb_per_s=100.0))
    assert set(fixed.cost.boundaries) == {(100e9 * e.link, 10e-6)}


def test_expert_all_to_all_spanning_nodes_uses_the_network():
    g = get_gpu("h200")
    within, across = all2all_links(g, 8, _links(gpn=8)), all2all_links(g, 8, _links(gpn=4, latency_us=30))
    assert within.gpus_per_node == 8 and across.gpus_per_node == 4
    assert within.latency_s == Efficiencies().allreduce_latency_s and across.latency_s == 30e-6
    from sim.cost.all2all import all2all_layer_s

    t_in = all2all_layer_s(128, 7168, 8, 8, within, True, 2)
    t_x = all2all_layer_s(128, 7168, 8, 8, across, True, 2)
    assert t_x > t_in
    d = build_deployment(_scn("qwen3-30b-a3b", tensor_parallel_size=1, data_parallel_size=8,
                              enable_expert_parallel=True, gpus_per_node=4, inter_node={"bandwidth_gb_per_s": 10.0}))
    assert d.cost.links.gpus_per_node == 4 and d.cost.links.nic_bytes_per_s == pytest.approx(10e9 * 0.8)


def test_kv_transfer_placement():
    h100 = get_gpu("h100-sxm")
    c = _scn().cluster
    # 1 prefill + 1 decode replica of TP2: 4 GPUs, one node: NVLink, 2 GPUs' links per replica
    assert kv_transfer_links(c, h100, 2, 1, h100, 2, 1) == (900e9, 900e9, "NVLink (one node)")
    # 4 + 4 replicas of TP2: 16 GPUs, separate nodes: the network, 2 x 50 GB/s
    assert kv_transfer_links(c, h100, 2, 4, h100, 2, 4) == (100e9, 100e9, "inter-node network")
    # different GPUs never share a node
    h200 = get_gpu("h200")
    assert kv_transfer_links(c, h100, 1, 1, h200, 1, 1)[2] == "inter-node network"
    # a run without kv_transfer bandwidth resolves to the placement's; a given one is kept
    raw = {"model": "llama-3-8b", "engine": {"policy": "disaggregated"},
           "disaggregation": {"prefill": {"replicas": 4}, "decode": {"replicas": 6}},
           "workload": {"synthetic": {"num_requests": 4, "request_rate": 1.0}}}
    kv = scenario_from_dict(raw).resolved()["disaggregation"]["kv_transfer"]
    assert (kv["bandwidth_gb_per_s"], kv["decode_bandwidth_gb_per_s"]) == (50.0, 50.0)
    raw["disaggregation"]["kv_transfer"] = {"bandwidth_gb_per_s": 7.0}
    assert scenario_from_dict(raw).resolved()["disaggregation"]["kv_transfer"]["bandwidth_gb_per_s"] == 7.0


@pytest.mark.parametrize("cluster, key", [
    ({"gpus_per_node": 0}, "cluster.gpus_per_node"),
    ({"gpus_per_node": "8"}, "cluster.gpus_per_node"),
    ({"gpus_per_node": 4.5}, "cluster.gpus_per_node"),
    ({"inter_node": {"bandwidth_gb_per_s": 0}}, "cluster.inter_node.bandwidth_gb_per_s"),
    ({"inter_node": {"bandwidth_gb_per_s": float("nan")}}, "cluster.inter_node.bandwidth_gb_per_s"),
    ({"inter_node": {"latency_us": -1}}, "cluster.inter_node.latency_us"),
    ({"inter_node": {"bandwith_gb_per_s": 5}}, "cluster.inter_node.bandwith_gb_per_s"),
    ({"inter_node": 5}, "cluster.inter_node"),
])
def test_bad_keys_one_line_naming_the_key(cluster, key):
    with pytest.raises(UserError) as e:
        _scn(**cluster)
    msg = str(e.value)
    assert key in msg and "\n" not in msg.strip(), msg


@pytest.mark.parametrize("tp, pp, dp, gpn", [(8, 1, 1, 3), (4, 3, 1, 8), (6, 2, 1, 4), (3, 8, 1, 8), (2, 1, 3, 4)])
def test_gpus_per_node_not_dividing_the_group_is_refused(tp, pp, dp, gpn):
    with pytest.raises(UserError, match=r"^cluster\.gpus_per_node: "):
        check_placement(_links(gpn=gpn), tp, pp, dp)


@pytest.mark.parametrize("tp, pp, dp, gpn", [(3, 1, 1, 8), (6, 1, 1, 8), (8, 2, 1, 8), (4, 4, 1, 8), (16, 1, 1, 8),
                                            (2, 1, 8, 4), (8, 1, 1, 1)])
def test_placements_that_fit(tp, pp, dp, gpn):
    check_placement(_links(gpn=gpn), tp, pp, dp)  # within one node, or whole nodes, TP groups unsplit


def test_cli_refuses_a_split_tp_group_in_one_line(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("model: llama-3.1-70b\ncluster: {tensor_parallel_size: 8, gpus_per_node: 3}\n"
                 "workload: {synthetic: {num_requests: 2, request_rate: 1.0}}\n")
    p = subprocess.run([sys.executable, "-m", "sim", "explain", str(f)], cwd=ROOT, capture_output=True, text=True,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 2
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "cluster.gpus_per_node" in lines[0] and "Traceback" not in p.stderr


def test_explain_shows_placement_and_links():
    from sim.analysis.explain import explain, placement_lines

    d = build_deployment(_scn("llama-3.1-405b", tensor_parallel_size=16, engine={"max_model_len": 4096}))
    e = explain(d, 1024, 8)
    assert (e["gpus_per_node"], e["nodes_per_replica"], e["tp_allreduce_nodes"]) == (8, 2, 2)
    assert (e["inter_node_gb_per_s"], e["inter_node_latency_us"], e["pp_sends_between_nodes"]) == (50.0, 10.0, 0)
    within = explain(build_deployment(_scn("llama-3.1-405b", "h200", tensor_parallel_size=8,
                                           engine={"max_model_len": 4096})), 1024, 8)
    assert within["tp_allreduce_nodes"] == 1 and e["tp_allreduce_ms_per_layer"] > within["tp_allreduce_ms_per_layer"]
    text = "\n".join(placement_lines(d))
    assert "across 2 nodes" in text and "ring or tree through all 16 GPUs" in text
    pp = build_deployment(_scn("llama-3.1-70b", tensor_parallel_size=4, pipeline_parallel_size=4))
    lines = placement_lines(pp)
    assert [("between nodes" in x) for x in lines if x.startswith("PP send")] == [False, True, False]
    json.dumps(explain(pp, 512, 4))  # the documented --json keys stay plain numbers
