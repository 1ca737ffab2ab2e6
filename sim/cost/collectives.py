"""Collectives whose ranks span nodes: the hierarchical all-reduce and a send between nodes.

Why: a ring all-reduce of S bytes over N ranks moves 2 (N - 1) / N x S over each rank's
slowest link (Patarasuk & Yuan 2009; the NCCL tests' bus bandwidth, ``busbw = algbw x 2 (n - 1)
/ n``, NVIDIA/nccl-tests doc/PERFORMANCE.md). Across nodes NCCL keeps the NVLink hops within a
node and crosses the network once per node (its rings and trees are built node by node,
``ncclTopoCompute``; "Demystifying NCCL: An In-depth Analysis of GPU Communication Protocols
and Algorithms", arXiv 2025): the all-reduce of a group
of g GPUs on each of n nodes costs

- within each node, a reduce-scatter and, at the end, an all-gather over NVLink: together
  2 (g - 1) / g x S per GPU at the NVLink bandwidth, plus one NCCL call latency;
- between nodes, an all-reduce of each GPU's S / g shard with its peers of the other nodes,
  each GPU on its own share of the node's network: 2 (n - 1) / n x S / g per GPU at the
  inter-node bandwidth, plus the network latency once per step of that ring, 2 (n - 1) steps
  (NCCL src/graph/tuning.cc: ``nInterSteps = 2 (nNodes - 1)`` for an all-reduce, each step
  charged the network's ``hwLat``).

vLLM's custom all-reduce kernel runs only within a node (custom_all_reduce.py: "Custom
allreduce is disabled because this process group spans across nodes"): a group spanning nodes
always takes NCCL.
"""

from __future__ import annotations


def hierarchical_allreduce_s(size_bytes: float, tp: int, nodes: int, intra_bytes_per_s: float,
                             intra_latency_s: float, inter_bytes_per_s: float, inter_latency_s: float) -> float:
    """Seconds of one all-reduce of ``size_bytes`` over ``tp`` GPUs spread evenly over ``nodes``
    nodes (module docstring); the bandwidths are the achieved ones (efficiency applied)."""
    g = tp // nodes  # GPUs of the group per node
    intra = 0.0
    if g > 1:
        intra = intra_latency_s + 2.0 * (g - 1) / g * size_bytes / intra_bytes_per_s
    steps = 2 * (nodes - 1)
    inter = steps * inter_latency_s + steps / nodes * (size_bytes / g) / inter_bytes_per_s
    return intra + inter


def send_s(size_bytes: float, bytes_per_s: float, latency_s: float) -> float:
    """One point-to-point send: its latency plus its bytes over the link."""
    return latency_s + size_bytes / bytes_per_s
