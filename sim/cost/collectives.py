"""Collectives whose ranks span nodes: NCCL's all-reduce and all-gather across nodes and a send between nodes.

Why: NCCL has no hierarchical all-reduce (reduce-scatter within each node, all-reduce of the
shards between nodes, all-gather) outside CollNet/SHARP and NVLS-tree, which need switch-resident
reduction: across nodes it runs the same ring or tree it runs within one, and its tuning model
prices them so (NVIDIA/nccl src/graph/tuning.cc, ``ncclTopoTuneModel`` and
``ncclTopoGetAlgoTime``, 2.19-2.21, the version ``sim/cost/nccl_tuning.py`` follows):

- **ring**: one ring through all N ranks, built node by node, so it crosses each node's NIC
  once per direction; an all-reduce moves 2 (N - 1) / N of the buffer over every edge of the ring,
  the network edge included (Patarasuk & Yuan 2009; nccl-tests doc/PERFORMANCE.md: ``busbw =
  algbw x 2 (n - 1) / n`` with n every rank of every node, "the speed of the slowest link").
  The ring graph's search gives every channel one speed for its intra- and inter-node hops
  (search.cc ``bwIntra = bwInter``), so the bus bandwidth is the slower of the intra-node link
  and the NIC bandwidth the group's GPUs of one node share (``nNodes <= 2 ? bwIntra : bwInter``
  x nChannels). Latency: ``baseLat + (nsteps - nInterSteps) x max(intraLat, netOverhead) +
  nInterSteps x interLat`` with ``nsteps = 2 (N - 1)``, ``nInterSteps = 2 nNodes``, ``interLat
  = hwLat[NET] + latencyInter`` (twice latencyInter under Simple, its flush); Simple's latency
  x 1.4 on Ampere and later (the ring's "plateau effect", ``ncclTopoGetAlgoTime``).
- **tree**: a chain within each node and a double binary tree between nodes; bus bandwidth
  x 0.92 (LL / 3.8 capped at ``llMaxBw``, LL128 x 120/128), algorithm bandwidth half of it, the
  mid-size ``treeCorrectionFactor``; latency ``baseLat + 2 ((N / nNodes - 1) intraLat +
  log2(nNodes) interLat)``.

So the network carries 2 (N - 1) / N of the buffer per node and direction on a ring (1.75 x at
8 ranks on 2 nodes) where a hierarchical scheme would carry 2 (n - 1) / n over nodes (1 x);
NCCL picks whichever of ring and tree, LL, LL128 and Simple its model says is fastest.

NOTE: the node link's per-message latency (``cluster.inter_node.latency_us``) is NCCL's
``latencyInter``, added to its own ``hwLat[NET]``; the CPU vendor (``llMaxBws``, ``netOverhead``)
is taken as AMD's (DGX A100's EPYC; the Azure NC A100 v4 Sarathi-Serve ran on); LL128 is taken
as enabled where the intra-node link is NVLink (NCCL also needs the NIC near the GPU, PXB);
per-channel caps and channel counts are not modelled (they bind only with few channels).

vLLM's custom all-reduce kernel runs only within a node (custom_all_reduce.py: "Custom
allreduce is disabled because this process group spans across nodes"): a group spanning nodes
always takes NCCL.
"""

from __future__ import annotations

import math

from sim.cost.nccl_tuning import (_BASE_LAT_US, _HW_LAT_US, LINK_NVLINK, PROTOCOLS, _log2i, fastest_option,
                                  ring_bus_gb_s, tree_size_factor)

# hwLat[NET][algorithm][protocol], us per network step (tuning.cc 2.19-2.21): Tree, Ring {LL, LL128, Simple}
_NET_LAT_US = {"tree": (5.0, 8.5, 28.0), "ring": (2.7, 4.0, 14.0)}
# llMaxBws, multi-node rows (GB/s): AMD CPUs, 2 nodes / more (tuning.cc "AMD-N2/AMD-N4")
_LL_MAX_BW_NET_GB_S = (22.5, 19.0)
# getNetOverhead: 2 us per step on AMD x86 (x 3 under Simple), the floor of an intra-node step
_NET_OVERHEAD_US = 2.0


def multinode_option_s(size_bytes: float, ranks: int, nodes: int, bus_bytes_per_s: float, intra_link: int,
                       net_latency_s: float, algorithm: str, protocol: str) -> float:
    """Seconds NCCL's model gives one all-reduce of ``size_bytes`` over ``ranks`` GPUs on
    ``nodes`` nodes (> 1) by ``algorithm`` and ``protocol`` (module docstring); ``bus_bytes_per_s``
    is the ring's bus bandwidth (achieved); inf where NCCL does not enable the pair."""
    p = PROTOCOLS.index(protocol)
    if intra_link != LINK_NVLINK and protocol == "LL128":
        return math.inf
    bus = bus_bytes_per_s / 1e9  # GB/s, as tuning.cc
    ll_max = _LL_MAX_BW_NET_GB_S[0 if nodes <= 2 else 1]
    steps = 2 * (ranks - 1)
    inter_steps = 2 * nodes
    intra_lat = _HW_LAT_US[intra_link][algorithm][p]
    inter_lat = _NET_LAT_US[algorithm][p] + net_latency_s * 1e6 * (2.0 if protocol == "Simple" else 1.0)
    if algorithm == "ring":
        bw = ring_bus_gb_s(bus, protocol, ll_max, ranks // nodes) * ranks / steps
        overhead = _NET_OVERHEAD_US * (3.0 if protocol == "Simple" else 1.0)
        lat_us = _BASE_LAT_US["ring"][p] + (steps - inter_steps) * max(intra_lat, overhead) + inter_steps * inter_lat
        if protocol == "Simple" and size_bytes / ranks >= 64:
            lat_us *= 1.4  # the ring's plateau effect, compute capability >= 8.0
    else:
        bus *= 0.92
        if protocol == "LL":
            bus = min(bus / 3.8, ll_max)
        elif protocol == "LL128":
            bus *= 120.0 / 128.0
        bw = bus * 0.5 * tree_size_factor(size_bytes, p)
        lat_us = _BASE_LAT_US["tree"][p] + 2 * ((ranks // nodes - 1) * intra_lat + _log2i(nodes) * inter_lat)
    return (lat_us + size_bytes / (1000.0 * bw)) * 1e-6


def multinode_allreduce_choice(size_bytes: float, ranks: int, nodes: int, intra_bytes_per_s: float,
                               intra_link: int, nic_bytes_per_s: float,
                               net_latency_s: float) -> tuple[float, str, str]:
    """(seconds, algorithm, protocol) NCCL's model picks for an all-reduce over ``ranks`` GPUs
    spread evenly over ``nodes`` nodes: the ring's bus bandwidth is the slower of the intra-node
    link (``intra_bytes_per_s``) and the node's network share of the group's GPUs on it
    (``nic_bytes_per_s``), both achieved figures."""
    bus = min(intra_bytes_per_s, nic_bytes_per_s)
    return fastest_option(lambda a, p: multinode_option_s(size_bytes, ranks, nodes, bus, intra_link, net_latency_s, a, p))


def multinode_allreduce_s(size_bytes: float, ranks: int, nodes: int, intra_bytes_per_s: float, intra_link: int,
                          gpu_net_bytes_per_s: float, net_latency_s: float) -> float:
    """Seconds of one NCCL all-reduce of ``size_bytes`` over ``ranks`` GPUs spread evenly over
    ``nodes`` nodes (module docstring). ``gpu_net_bytes_per_s`` is each GPU's share of its node's
    network (achieved), so the group's GPUs of one node, ``ranks / nodes``, share that many."""
    nic = ranks // nodes * gpu_net_bytes_per_s
    return multinode_allreduce_choice(size_bytes, ranks, nodes, intra_bytes_per_s, intra_link, nic, net_latency_s)[0]


def multinode_allgather_s(size_bytes: float, ranks: int, nodes: int, intra_bytes_per_s: float, intra_link: int,
                          gpu_net_bytes_per_s: float, net_latency_s: float) -> float:
    """Seconds of one NCCL all-gather of ``size_bytes`` gathered in all (each rank contributes
    ``size_bytes / ranks``) over ``ranks`` GPUs spread evenly over ``nodes`` nodes (> 1): the
    ring of ``multinode_option_s`` with tuning.cc's AllGather rows (2.19-2.21): ring only,
    ``nsteps = ranks - 1`` of which ``nInterSteps = nodes - 1`` cross the network, LL at a
    quarter of the bus (nNodes > 1) capped at the network's ``llMaxBw``, LL128 x 0.92 (0.7 with
    one rank per node), algorithm bandwidth the bus x ``ranks / nsteps``, no plateau factor (an
    all-reduce's alone, ``ncclTopoGetAlgoTime``). The bus is the slower of the intra-node link
    and the node's network share, as for the all-reduce."""
    nic = ranks // nodes * gpu_net_bytes_per_s
    bus = min(intra_bytes_per_s, nic) / 1e9  # GB/s, as tuning.cc
    ll_max = _LL_MAX_BW_NET_GB_S[0 if nodes <= 2 else 1]
    steps, inter_steps = ranks - 1, nodes - 1
    best = math.inf
    for p, protocol in enumerate(PROTOCOLS):
        if intra_link != LINK_NVLINK and protocol == "LL128":
            continue
        simple = protocol == "Simple"
        bw = ring_bus_gb_s(bus, protocol, ll_max, ranks // nodes) * ranks / steps
        intra_lat = max(_HW_LAT_US[intra_link]["ring"][p], _NET_OVERHEAD_US * (3.0 if simple else 1.0))
        inter_lat = _NET_LAT_US["ring"][p] + net_latency_s * 1e6 * (2.0 if simple else 1.0)
        lat_us = _BASE_LAT_US["ring"][p] + (steps - inter_steps) * intra_lat + inter_steps * inter_lat
        best = min(best, (lat_us + size_bytes / (1000.0 * bw)) * 1e-6)
    return best


def send_s(size_bytes: float, bytes_per_s: float, latency_s: float) -> float:
    """One point-to-point send: its latency plus its bytes over the link."""
    return latency_s + size_bytes / bytes_per_s
