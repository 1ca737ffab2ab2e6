"""Costing a fast-forwarded run of identical decode steps: its affine pieces.

Why: the simulator advances a run of k decode steps in one event (sim/engine/cluster.py), charging
steps evenly spaced from the first step's time to the last's. That is exact only where a
step's time is affine in its index. Every operator of a decode step is fixed by the batch
except decode attention, whose cost follows the context, which grows by one token per
sequence per step: affine for the roofline bound, but a calibrated efficiency bends it at the
table's nodes and FA2's split-KV combine kernel switches on or off at KV-block boundaries. The
cost model cuts a run at those points and, between them (a power law of the context: log
efficiency is linear in log bound within a table cell), where the curve leaves the straight
line by more than ``RUN_REL_TOL`` of a step. Closed form per piece, no loop over tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

# Largest deviation of a fast-forwarded step from the step costed alone, relative to the step
# (checked at the piece's midpoint, where the deviation of a convex or concave curve from its
# chord peaks within a table cell, whose contexts span a factor of two).
RUN_REL_TOL = 5e-5


class RunCost(NamedTuple):
    """What the cost model says of the first ``num_steps`` steps of a planned run: step i
    (0-based) takes first + i (last - first) / (num_steps - 1) + curve_s i (i - num_steps + 1)
    seconds (``run_sum_s``); curve_s is within ``RUN_REL_TOL`` of nothing, and the step log
    keeps first and last only."""

    first_s: float        # the first step's seconds
    last_s: float         # the num_steps-th step's seconds
    num_steps: int        # <= the batch's num_steps: the caller re-plans after these
    extrapolated: bool    # a calibrated operator's shape lies outside its measured range
    lm_head_extrapolated: bool  # the LM head's does (reported once per run, not per step)
    curve_s: float = 0.0  # the steps' bend off the line from first to last
    # (fewest, most) scheduled sequences of a step whose engine overhead took the profile's
    # per-sequence term outside its measured batch range; None: none did
    overhead_outside_seqs: tuple[int, int] | None = None


class StepCurve:
    """Seconds of one step of a decode run (or of its decode attention) as a function of the
    run's total decode context: what ``affine_steps`` samples. A class with a method, not a
    function: compiled (sim/compiled_core.py), calling a closure or a lambda is a generic call
    (its arguments boxed, its answer unboxed), calling ``at`` of a compiled class a native one."""

    def at(self, context_tokens: int) -> float:
        raise NotImplementedError


class FnCurve(StepCurve):
    """A function of the context as a ``StepCurve`` (off the per-step path: ``step_time``)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[int], float]) -> None:
        self.fn = fn

    def at(self, context_tokens: int) -> float:
        return self.fn(context_tokens)


def affine_steps(attn_s: StepCurve, c0: int, num_seqs: int, num_steps: int, a0: float,
                 step_s: float, rel_tol: float = RUN_REL_TOL) -> tuple[int, float, float]:
    """(j, attn_s at step j - 1, curve_s) for the longest j <= ``num_steps`` whose steps'
    seconds ``attn_s.at(c0 + i * num_seqs)`` (a step's, or its decode attention's), i < j, stay
    within ``rel_tol * step_s``
    of the line through the first (``a0``) and the last; the span shrinks as the square root
    of the deviation (a smooth curve leaves its chord by span^2 * curvature / 8).

    ``curve_s``: step i is charged ``curve_s * i * (i - (j - 1))`` on top of the line, the
    parabola through the first, middle and last steps (``RunCost``), so the replica's clock
    follows the steps' sum to well under the tolerance wherever an arrival cuts the run."""
    j = num_steps
    while j > 2:
        m = j - 1
        z = attn_s.at(c0 + m * num_seqs)
        i = m // 2
        dev = attn_s.at(c0 + i * num_seqs) - (a0 + (z - a0) * i / m)
        allowed = rel_tol * min(step_s, step_s + z - a0)
        if abs(dev) <= allowed:
            return j, z, dev / (i * (i - m))
        j = min(m, 1 + int(m * math.sqrt(allowed / abs(dev)) * 0.9))
    if j == 2:
        return 2, attn_s.at(c0 + num_seqs), 0.0
    return 1, a0, 0.0


def run_sum_s(j: int, first_s: float, last_s: float, num_steps: int, curve_s: float = 0.0) -> float:
    """Seconds of the first ``j`` steps of a run of ``num_steps``: step i takes
    first + i (last - first) / (num_steps - 1) + curve_s i (i - (num_steps - 1))."""
    m = num_steps - 1
    if m <= 0:
        return j * first_s
    return (j * first_s + (last_s - first_s) / m * j * (j - 1) / 2.0
            + curve_s * ((j - 1) * j * (2 * j - 1) / 6.0 - m * j * (j - 1) / 2.0))
