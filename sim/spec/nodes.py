"""Nodes: how a replica's GPUs sit on machines, and the link between machines.

Why: GPUs of one node talk over NVLink (or PCIe), GPUs of different nodes over the network, one
to two orders of magnitude slower (DGX H100: 450 GB/s NVLink per GPU and direction against one
400 Gb/s = 50 GB/s NIC per GPU). A collective, a pipeline send or an all-to-all whose ranks span
nodes is bound by the network (Sarathi-Serve, OSDI'24, Fig. 13a: Falcon-180B TP8 across two
nodes over 100 Gb/s Ethernet decodes about 2x slower than TP4-PP2).

Placement (the rank order of vLLM and Megatron-LM: ``rank = pp_rank x tp + tp_rank``, and
data-parallel ranks outermost, vLLM ``ParallelConfig``): a replica's GPUs fill nodes in rank
order, TP innermost, then PP, then DP; a replica that spans nodes takes whole nodes. So a TP
group of ``tp`` GPUs spans ``ceil(tp / gpus_per_node)`` nodes, and the boundary between
pipeline stages s and s + 1 crosses nodes where the GPU count ``(s + 1) x tp`` is a multiple
of ``gpus_per_node`` (every boundary when tp >= gpus_per_node).

A replica larger than one node must fill whole nodes, and its TP groups must not be split
unevenly (tp divides ``gpus_per_node`` or is a multiple of it); else ``check_placement``
refuses it. A replica within one node is never refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.errors import UserError
from sim.spec.hardware import GPUSpec


@dataclass(frozen=True)
class NodeLinks:
    """The node size and the link between nodes that one replica sees."""

    gpus_per_node: int
    inter_bytes_per_s: float  # each GPU's share of its node's network, one direction
    inter_latency_s: float    # per message across it
    source: str = ""          # where the figures come from (explain)

    def nodes(self, gpus: int) -> int:
        """Nodes ``gpus`` consecutive ranks (from a node's first GPU) span."""
        return -(-gpus // self.gpus_per_node)


def node_links(cluster, gpu: GPUSpec) -> NodeLinks:
    """``cluster.gpus_per_node`` and ``cluster.inter_node`` of a scenario, each unset figure the
    GPU's catalogue one (catalog/gpus.yaml)."""
    inter = cluster.inter_node
    bw = getattr(inter, "bandwidth_gb_per_s", None)
    lat = getattr(inter, "latency_us", None)
    gpn = cluster.gpus_per_node
    given = [k for k, v in (("cluster.gpus_per_node", gpn), ("cluster.inter_node.bandwidth_gb_per_s", bw),
                            ("cluster.inter_node.latency_us", lat)) if v is not None]
    source = ", ".join(given) + (" (scenario); else " if given else "") + f"catalogue {gpu.key}"
    return NodeLinks(gpus_per_node=gpu.gpus_per_node if gpn is None else gpn,
                     inter_bytes_per_s=gpu.inter_node_bw_bytes_per_s if bw is None else bw * 1e9,
                     inter_latency_s=gpu.inter_node_latency_s if lat is None else lat / 1e6,
                     source=source)


def check_placement(links: NodeLinks, tp: int, pp: int = 1, dp: int = 1, where: str = "cluster") -> None:
    """Refuse a replica of tp x pp x dp GPUs that cannot sit on ``links.gpus_per_node``-GPU
    nodes in rank order without splitting a TP group unevenly (module docstring)."""
    gpn = links.gpus_per_node
    group = tp * pp * dp
    if group <= gpn:
        return  # one node holds it all
    key = "cluster.gpus_per_node"
    if group % gpn:
        raise UserError(f"{key}: a replica of {group} GPUs (tp {tp} x pp {pp} x dp {dp}) spans nodes of {gpn} "
                        f"GPUs without filling them: give a replica a multiple of {gpn} GPUs, or set {key} "
                        "to the node size it runs on")
    if tp % gpn and gpn % tp:
        raise UserError(f"{key}: {gpn} GPUs per node split a TP group of {where}.tensor_parallel_size {tp} "
                        "unevenly across nodes: tp must divide gpus_per_node or be a multiple of it")


def tp_nodes(links: NodeLinks, tp: int) -> int:
    """Nodes one TP group spans (placement: TP innermost, a group never split unevenly)."""
    return links.nodes(tp)


def boundary_crosses(links: NodeLinks, tp: int, pp: int) -> tuple[bool, ...]:
    """For each boundary between pipeline stages s and s + 1: whether its send goes between
    nodes (stage s's GPUs end a node: (s + 1) x tp a multiple of gpus_per_node)."""
    gpn = links.gpus_per_node
    return tuple(tp >= gpn or (s + 1) * tp % gpn == 0 for s in range(pp - 1))


def describe(links: NodeLinks, tp: int, pp: int = 1, dp: int = 1) -> list[str]:
    """The placement in words: nodes, the TP group's span, each pipeline boundary's link."""
    group = tp * pp * dp
    n = links.nodes(group)
    lines = [f"nodes: {n} ({links.gpus_per_node} GPUs each) for {group} GPUs per replica (rank order TP, then PP, "
             f"then DP); between nodes {links.inter_bytes_per_s / 1e9:.4g} GB/s per GPU, "
             f"{links.inter_latency_s * 1e6:.3g} us per message ({links.source})"]
    span = tp_nodes(links, tp)
    lines.append(f"TP all-reduce over {tp} GPUs: " + (
        "within one node (NVLink)" if span == 1 else
        f"across {span} nodes: NCCL's ring or tree through all {tp} GPUs ({tp // span} per node), "
        f"each node's network carrying 2 (N - 1) / N of the buffer on a ring (sim/cost/collectives.py)"))
    for s, x in enumerate(boundary_crosses(links, tp, pp)):
        lines.append(f"PP send stage {s} -> {s + 1}: " + ("between nodes (network)" if x else "within a node (NVLink)"))
    if dp > 1:
        ep = tp * dp
        lines.append(f"EP all-to-all over {ep} GPUs: " + (
            "within one node (NVLink)" if ep <= links.gpus_per_node else
            f"across {links.nodes(ep)} nodes (NVLink within, network between)"))
    return lines


def kv_transfer_links(cluster, prefill_gpu: GPUSpec, prefill_tp: int, prefill_replicas: int,
                      decode_gpu: GPUSpec, decode_tp: int, decode_replicas: int) -> tuple[float, float, str]:
    """(each prefill replica's egress, each decode replica's ingress bytes/s, the link's name)
    of disaggregated KV transfer where ``disaggregation.kv_transfer`` gives no bandwidth.

    Placement: every replica of both pools on one node when they fit (all their GPUs within
    ``gpus_per_node``, both pools on the same GPU): the KV moves over NVLink (DistServe, Zhong
    et al. 2024, section 4.2: pairing prefill and decode instances within a node to move the KV
    over NVLink; NIXL's UCX transport takes CUDA IPC within a node). Otherwise the pools sit on
    separate nodes and the KV crosses the network. Either way each GPU of a TP group sends (or
    receives) its own shard of the KV heads on its own link, so a replica's bandwidth is its TP
    size times one GPU's link."""
    p = node_links(cluster, prefill_gpu)
    d = node_links(cluster, decode_gpu)
    gpus = prefill_replicas * prefill_tp + decode_replicas * decode_tp
    if prefill_gpu == decode_gpu and gpus <= p.gpus_per_node:
        bw_p, bw_d, name = prefill_gpu.nvlink_bw_bytes_per_s, decode_gpu.nvlink_bw_bytes_per_s, "NVLink (one node)"
    else:
        bw_p, bw_d, name = p.inter_bytes_per_s, d.inter_bytes_per_s, "inter-node network"
    return prefill_tp * bw_p, decode_tp * bw_d, name
