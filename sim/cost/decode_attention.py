"""Decode attention of one batch size as a function of the batch's total cached context.

Why: a decode step's attention reads every cached K and V of its sequences, so along a run of
decode steps it is the one operator whose cost changes (the context grows by one token per
sequence and step); the cost model asks it for every step costed, and several times per
fast-forwarded run (``sim/cost/roofline.py``: ``run_cost_values``, the run's step functions).
What the batch size fixes (heads, bytes per token, the calibrated table's row) is chosen once,
when the object is built; ``at`` is the per-step call. Objects, not closures: compiled
(sim/compiled_core.py), ``at`` is a native call that takes and returns unboxed numbers, where a
closure is a generic Python call (its argument and its answer boxed).

The calibrated kind (measured efficiencies, FA2's split-KV combine kernel) is
``sim.cost.calibrated.CalibratedDecodeAttention``.
"""

from __future__ import annotations

from collections.abc import Callable


def decode_work(context_tokens: float, flops_per_token: float, kv_bytes: float, kv_reads: float, q_bytes: float,
                window: Callable[[float], float] | None) -> tuple[float, float, float]:
    """(the context the layers read: ``window`` of it with sliding-window layers, its FLOPs,
    its bytes: K and V of every cached token read ``kv_reads`` times per layer, the queries
    read and the outputs written)."""
    if window is not None:
        context_tokens = window(context_tokens)
    return context_tokens, flops_per_token * context_tokens, context_tokens * kv_bytes * kv_reads + q_bytes


class DecodeAttention:
    """context_tokens -> (seconds of decode attention over all layers, whether the shape lies
    outside a calibrated table)."""

    def at(self, context_tokens: float) -> tuple[float, bool]:
        raise NotImplementedError


class NoDecodes(DecodeAttention):
    """A batch without decode sequences: no decode attention."""

    def at(self, context_tokens: float) -> tuple[float, bool]:
        return 0.0, False


class RooflineDecodeAttention(DecodeAttention):
    """Without a calibrated table: per layer, latency + streaming (Hockney's alpha-beta form,
    the kernel floor plus the roofline bound max(FLOPs / peak, bytes / bandwidth)), not max()
    of the two: a decode step stays affine in the growing context, so fast-forwarded runs stay
    exact. ``window``: the context that sliding-window layers read (sim/cost/arch.py)."""

    def __init__(self, *, num_layers: int, flops_per_token: float, kv_bytes: float, kv_reads: float,
                 q_bytes: float, peak_flops_per_s: float, bw_bytes_per_s: float, floor_s: float,
                 window: Callable[[float], float] | None = None) -> None:
        self.L = num_layers
        self.flops_per_token, self.kv_bytes, self.kv_reads, self.q_bytes = flops_per_token, kv_bytes, kv_reads, q_bytes
        self.peak, self.bw, self.floor = peak_flops_per_s, bw_bytes_per_s, floor_s
        self.window = window

    def at(self, context_tokens: float) -> tuple[float, bool]:
        _, flops, bytes_ = decode_work(context_tokens, self.flops_per_token, self.kv_bytes, self.kv_reads,
                                       self.q_bytes, self.window)
        return self.L * (max(flops / self.peak, bytes_ / self.bw) + self.floor), False
