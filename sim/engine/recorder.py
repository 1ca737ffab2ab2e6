"""Append-only records of a run: one row per engine step (or fast-forwarded run of identical
decode steps), read back as columns at the end.

Why: handing a row's numbers over (``StepRows.add``; ``step`` takes them as a tuple) is the
cheapest thing the hot loop can do; all analysis reads columns afterwards; the numbers are
copied as they come into native float64 and int64 values, packed into numpy columns and
spilled to disk as blocks fill (``ColumnBuffer``: 96 bytes a row instead of ~350 as a tuple of
Python numbers), so a run's memory does not grow with its step rows.
"""

from __future__ import annotations

import struct

import numpy as np

from sim.engine.columns import ColumnBuffer

STEP_COLUMNS = (
    "replica", "start_s", "duration_s", "num_steps", "num_seqs", "prefill_tokens",
    "decode_tokens", "kv_blocks_used", "num_waiting", "first_step_duration_s", "last_step_duration_s",
    "multi_step",
)
_INT = {"replica", "num_steps", "num_seqs", "prefill_tokens", "decode_tokens", "kv_blocks_used", "num_waiting",
        "multi_step"}


class StepRows(ColumnBuffer):
    """The step log's rows; ``add`` takes a row's twelve numbers as arguments."""

    def add(self, replica, start_s, duration_s, num_steps, num_seqs, prefill_tokens, decode_tokens,
            kv_blocks_used, num_waiting, first_step_duration_s, last_step_duration_s, multi_step) -> None:
        """``append`` of the row (``STEP_COLUMNS``' order) without its tuple: the replica loop's
        one call per step row (compiled, sim/compiled_core.py, ``pack_into(..., *row)`` builds a
        list and a tuple of the row again; here its numbers go straight to ``pack_into``)."""
        n = self._rows
        try:
            self._pack_into(self._data, n * self._row_bytes, replica, start_s, duration_s, num_steps, num_seqs,
                            prefill_tokens, decode_tokens, kv_blocks_used, num_waiting, first_step_duration_s,
                            last_step_duration_s, multi_step)
        except struct.error:  # as append's
            self._append_slow(n, (replica, start_s, duration_s, num_steps, num_seqs, prefill_tokens,
                                  decode_tokens, kv_blocks_used, num_waiting, first_step_duration_s,
                                  last_step_duration_s, multi_step))
        self._rows = n + 1
        if n + 1 >= self.block_rows:
            self.full()


class Recorder:
    def __init__(self) -> None:
        self.step_rows = StepRows(STEP_COLUMNS, _INT)
        # inter-token gaps listed one by one: spanning a recompute, or to the end of a multi-step
        # block (``multi_step`` rows: their tokens come out at the block's end, not step by step)
        self.resume_gaps_s: list[float] = []
        # (step duration counted once in the step log, the true gap that replaces it) for a
        # request whose first decode step came after waiting with its KV elsewhere
        self.itl_adjust: list[tuple[float, float]] = []
        # Engine steps whose shapes fell outside the measured range of a calibrated operator
        # (they took the nearest measured efficiency), per replica: ``simsrv_extrapolated_steps``.
        self.extrapolated_steps: dict[int, int] = {}
        self.lm_head_extrapolated = False  # the LM head's shape was, on some step
        # (fewest, most) scheduled sequences of a step whose engine overhead was taken outside
        # the profile's measured batch range, per replica: ``simsrv_overhead_outside_batch_range``
        self.overhead_outside_seqs: dict[int, tuple[int, int]] = {}
        self.step = self.step_rows.append     # a step row as a tuple (the replica loop's: step_rows.add)

    def count_extrapolated(self, replica: int, num_steps: int) -> None:
        self.extrapolated_steps[replica] = self.extrapolated_steps.get(replica, 0) + num_steps

    def count_overhead_outside(self, replica: int, seqs: tuple[int, int]) -> None:
        lo, hi = self.overhead_outside_seqs.get(replica, seqs)
        self.overhead_outside_seqs[replica] = (min(lo, seqs[0]), max(hi, seqs[1]))

    def count_cost(self, replica: int, extrapolated: bool, lm_head_extrapolated: bool,
                   outside: tuple[int, int] | None, num_steps: int) -> None:
        """The flags a ``RunCost`` of ``num_steps`` steps on ``replica`` came back with."""
        if extrapolated:
            self.count_extrapolated(replica, num_steps)
        if lm_head_extrapolated:
            self.lm_head_extrapolated = True
        if outside is not None:
            self.count_overhead_outside(replica, outside)

    def lengthen_gaps(self, step_s: float, ready_gaps_s, pause_extras) -> None:
        """A step of ``step_s`` seconds that the step log counts once per decode is a longer gap
        for some of them: a request joining decoding after waiting with its KV elsewhere (its
        first decode gap spans the wait: ``ready_gaps_s``), and decodes paused by prompt steps
        of their own (``pause_extras``: (extra seconds, how many decodes))."""
        adjust = self.itl_adjust
        for gap in ready_gaps_s:
            adjust.append((step_s, step_s + gap))
        for extra, count in pause_extras:
            adjust.extend([(step_s, step_s + extra)] * count)

    def step_columns(self) -> dict[str, np.ndarray]:
        """Every step column whole in memory (tests, small runs)."""
        return self.step_rows.columns()

    def step_store(self) -> ColumnBuffer:
        """The step rows, complete (read a column or a slice of rows at a time)."""
        self.step_rows.finish()
        return self.step_rows
