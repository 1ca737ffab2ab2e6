"""NCCL's own cost model of an all-reduce within one node, used where no measured NCCL table exists.

Why: NCCL picks, for every call, the algorithm x protocol its tuning model says is fastest, and
that model is its documented estimate of the call's time (NVIDIA/nccl src/graph/tuning.cc,
``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime``, 2.19-2.21; the constants below are that
file's). For each algorithm a (ring, tree) and protocol p (LL, LL128, Simple):

- latency ``baseLat[a][p] + steps x hwLat[link][a][p]`` (microseconds), where a ring all-reduce
  takes ``nsteps = 2 (n - 1)`` steps and a tree within one node (a chain) ``2 (n - 1)`` hops;
- bandwidth the bus bandwidth times the protocol's efficiency: LL carries 8 bytes of data per
  16-byte line (``busBw / 4`` on a ring, at most ``llMaxBw``), LL128 120 of 128 bytes
  (``x 0.92``; a chain tree ``x 7/9`` more), a tree ``x 0.92``; then converted to algorithm
  bandwidth, ``n / (2 (n - 1))`` for a ring, ``1/2`` for a tree (and a tree's mid-size
  ``treeCorrectionFactor``);
- time = latency + bytes / bandwidth; NCCL runs the minimum.

So a small message costs a latency that grows with the ranks (LL ring: 7.8 us at 2 GPUs, 15.0 us
at 8), where a single per-call constant would price 2 and 8 GPUs alike, and the protocol moves
from LL (few bytes, low latency) to LL128/Simple (full bandwidth) as the message grows.

The bus bandwidth is the GPU's link bandwidth times the link efficiency: NCCL's own figure is
its per-link NVLink bandwidth times the links, 20.0 GB/s x 12 = 240 GB/s on A100 (0.80 of the
300 GB/s datasheet figure) and 20.6 GB/s x 18 = 371 GB/s on H100 (0.82 of 450; src/graph/topo.h
``SM80_NVLINK_BW``, ``SM90_NVLINK_BW``), which is what ``Efficiencies.link`` (0.8) gives.

NOTE: not modelled: NVLink SHARP (NVLS, NVSwitch-resident reduction on Hopper and later HGX
systems, faster from about 1 MB at 4-8 GPUs), the per-channel caps (they bind only with few
channels), CollNet, and AMD's RCCL (its own tuning tables; the model is applied as for a
GPU-to-GPU link). Across nodes, ``sim/cost/collectives.py``. The measured NCCL tables
(``kernels_profile/``, nccl-tests ``all_reduce_perf``) replace this model where the GPU has one;
tests/test_allreduce_latency.py compares the two.

An all-gather (the LM head's logits under TP, sim/cost/roofline.py ``_logits_gather_s``) is priced
by the same model's AllGather rows (``allgather_s``): a ring only (NCCL runs no tree for it),
``nsteps = n - 1`` (one pass, against the all-reduce's 2 (n - 1)), LL at a third of the bus on
one node (a quarter across nodes or for an all-reduce), bus to algorithm bandwidth ``n / (n - 1)``;
NCCL's ``nBytes`` is the gathered total (argcheck.cc: ``nBytes *= nRanks``, "count is per rank").
"""

from __future__ import annotations

import math
from collections.abc import Callable

LINK_NVLINK = 0
LINK_PCI = 1
PROTOCOLS = ("LL", "LL128", "Simple")
ALGORITHMS = ("tree", "ring")

# baseLat[algorithm][protocol], us (tuning.cc): Tree {LL, LL128, Simple}, Ring {LL, LL128, Simple}
_BASE_LAT_US = {"tree": (6.8, 14.0, 0.0), "ring": (6.6, 14.0, 8.4)}
# hwLat[link][algorithm][protocol], us per step (tuning.cc: NVLink, PCI)
_HW_LAT_US = {
    LINK_NVLINK: {"tree": (0.6, 1.25, 28.0), "ring": (0.6, 1.9, 3.4)},
    LINK_PCI: {"tree": (1.0, 1.9, 28.0), "ring": (1.0, 2.5, 5.7)},
}
# llMaxBws, single node, Ampere and Hopper (GB/s)
_LL_MAX_BW_GB_S = 87.7
# treeCorrectionFactor[protocol][log2(bytes / 64)], powers of two from 64 B to 256 MB
_TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
)


def _log2i(x: int) -> int:
    """NCCL's ``log2i``: floor(log2 x), 0 for x <= 1."""
    return int(math.floor(math.log2(x))) if x > 1 else 0


def ring_bus_gb_s(bus_gb_s: float, protocol: str, ll_max_gb_s: float, ranks_per_node: int = 2,
                  ll_divisor: float = 4.0) -> float:
    """A ring's bus bandwidth under ``protocol`` (tuning.cc ``ncclTopoTuneModel``): LL moves 8
    bytes per 16 (1 / ``ll_divisor`` of it: a quarter of the bus after its flags and fences for an
    all-reduce or across nodes, a third for an all-gather on one node), capped at ``llMaxBw``;
    LL128 120 of 128 bytes (x 0.92; x 0.7 with one rank per node, ``ppn < 2``); Simple the bus
    as measured."""
    if protocol == "LL":
        return min(ll_max_gb_s, bus_gb_s / ll_divisor)
    if protocol == "LL128":
        return bus_gb_s * (0.7 if ranks_per_node < 2 else 0.92)
    return bus_gb_s


def tree_size_factor(size_bytes: float, p: int) -> float:
    """The tree's mid-size correction of its algorithm bandwidth (tuning.cc
    ``treeCorrectionFactor``, by log2 of the size in 64-byte units and protocol index ``p``)."""
    log_size = _log2i(int(size_bytes) >> 6)
    return _TREE_CORRECTION[p][log_size] if log_size < len(_TREE_CORRECTION[p]) else 1.0


def fastest_option(time_of: Callable[[str, str], float]) -> tuple[float, str, str]:
    """(seconds, algorithm, protocol) of the fastest pair ``time_of(algorithm, protocol)``
    gives: NCCL's model picks the pair it predicts fastest (``ncclTopoGetAlgoTime``)."""
    best = (math.inf, "ring", "Simple")
    for a in ALGORITHMS:
        for p in PROTOCOLS:
            t = time_of(a, p)
            if t < best[0]:
                best = (t, a, p)
    return best


def option_s(size_bytes: float, ranks: int, bus_bytes_per_s: float, link: int, algorithm: str,
             protocol: str) -> float:
    """Seconds NCCL's model gives one all-reduce of ``size_bytes`` over ``ranks`` GPUs of one
    node by ``algorithm`` and ``protocol``; inf where NCCL does not enable that pair (LL128 off
    PCIe links: tuning.cc enables it only where ``typeIntra <= PATH_NVB``)."""
    p = PROTOCOLS.index(protocol)
    if link != LINK_NVLINK and protocol == "LL128":
        return math.inf
    bus = bus_bytes_per_s / 1e9  # GB/s, as tuning.cc
    steps = 2 * (ranks - 1)
    if algorithm == "ring":
        bw = ring_bus_gb_s(bus, protocol, _LL_MAX_BW_GB_S) * ranks / steps
    else:
        bus *= 0.92
        if protocol == "LL":
            bus = min(bus / 3.8, _LL_MAX_BW_GB_S)
        elif protocol == "LL128":
            bus *= 7.0 / 9.0  # one node
        bw = bus * 0.5 * tree_size_factor(size_bytes, p)
    lat_us = _BASE_LAT_US[algorithm][p] + steps * _HW_LAT_US[link][algorithm][p]
    return (lat_us + size_bytes / (1000.0 * bw)) * 1e-6


def allreduce_choice(size_bytes: float, ranks: int, bus_bytes_per_s: float, link: int) -> tuple[float, str, str]:
    """(seconds, algorithm, protocol) NCCL's model picks for this all-reduce: the fastest pair."""
    return fastest_option(lambda a, p: option_s(size_bytes, ranks, bus_bytes_per_s, link, a, p))


def allreduce_s(size_bytes: float, ranks: int, bus_bytes_per_s: float, link: int) -> float:
    """Seconds of one all-reduce within a node by NCCL's model (module docstring); 0 for one rank."""
    if ranks <= 1:
        return 0.0
    return allreduce_choice(size_bytes, ranks, bus_bytes_per_s, link)[0]


def allgather_option_s(size_bytes: float, ranks: int, bus_bytes_per_s: float, link: int, protocol: str) -> float:
    """Seconds NCCL's model gives one ring all-gather of ``size_bytes`` in all (each rank
    contributes ``size_bytes / ranks``) over ``ranks`` GPUs of one node under ``protocol``
    (tuning.cc ``ncclTopoTuneModel``, AllGather rows, 2.19-2.21): ``nsteps = ranks - 1``; LL
    moves a third of the bus on one node (``busBw x 1/3`` where neither nNodes > 1 nor an
    all-reduce or reduce), capped at ``llMaxBw``; LL128 x 0.92; algorithm bandwidth the bus x
    ``ranks / nsteps``; latency ``baseLat[ring] + nsteps x hwLat[link][ring]``. So each rank
    moves (ranks - 1) / ranks of the total over its link in one pass. inf where NCCL does not
    enable the pair (LL128 off NVLink)."""
    p = PROTOCOLS.index(protocol)
    if link != LINK_NVLINK and protocol == "LL128":
        return math.inf
    steps = ranks - 1
    bw = ring_bus_gb_s(bus_bytes_per_s / 1e9, protocol, _LL_MAX_BW_GB_S, ranks, ll_divisor=3.0) * ranks / steps
    lat_us = _BASE_LAT_US["ring"][p] + steps * _HW_LAT_US[link]["ring"][p]
    return (lat_us + size_bytes / (1000.0 * bw)) * 1e-6


def allgather_s(size_bytes: float, ranks: int, bus_bytes_per_s: float, link: int) -> float:
    """Seconds of one NCCL all-gather of ``size_bytes`` gathered in all over ``ranks`` GPUs of
    one node: the fastest protocol of the ring (``allgather_option_s``); 0 for one rank."""
    if ranks <= 1:
        return 0.0
    return min(allgather_option_s(size_bytes, ranks, bus_bytes_per_s, link, p) for p in PROTOCOLS)
