"""Append-only records of a run: one row per engine step (or fast-forwarded run of identical
decode steps), turned into columns once at the end.

Why: appending a tuple per step is the cheapest thing the hot loop can do; all analysis reads
columns afterwards. Every ``BLOCK_ROWS`` rows the tuples are packed into one float64 block
(88 bytes a row instead of ~350 as tuples of Python numbers); the integer columns are exact
there (below 2**53) and become int64 at the end.
"""

from __future__ import annotations

import numpy as np

STEP_COLUMNS = (
    "replica", "start_s", "duration_s", "num_steps", "num_seqs", "prefill_tokens",
    "decode_tokens", "kv_blocks_used", "num_waiting", "first_step_duration_s", "last_step_duration_s",
    "multi_step",
)
_INT = {"replica", "num_steps", "num_seqs", "prefill_tokens", "decode_tokens", "kv_blocks_used", "num_waiting",
        "multi_step"}


BLOCK_ROWS = 1 << 15


class Recorder:
    def __init__(self) -> None:
        self.steps: list[tuple] = []     # the rows since the last packed block
        self._blocks: list[np.ndarray] = []
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

    def count_extrapolated(self, replica: int, num_steps: int) -> None:
        self.extrapolated_steps[replica] = self.extrapolated_steps.get(replica, 0) + num_steps

    def count_overhead_outside(self, replica: int, seqs: tuple[int, int]) -> None:
        lo, hi = self.overhead_outside_seqs.get(replica, seqs)
        self.overhead_outside_seqs[replica] = (min(lo, seqs[0]), max(hi, seqs[1]))

    def step(self, row: tuple) -> None:
        steps = self.steps
        steps.append(row)
        if len(steps) >= BLOCK_ROWS:
            self._pack()

    def _pack(self) -> None:
        if self.steps:
            self._blocks.append(np.array(self.steps, dtype=np.float64).reshape(-1, len(STEP_COLUMNS)))
            self.steps = []

    @property
    def num_rows(self) -> int:
        return sum(len(b) for b in self._blocks) + len(self.steps)

    def step_columns(self) -> dict[str, np.ndarray]:
        self._pack()
        if not self._blocks:
            return {c: np.zeros(0, dtype=np.int64 if c in _INT else np.float64) for c in STEP_COLUMNS}
        table = self._blocks[0] if len(self._blocks) == 1 else np.concatenate(self._blocks)
        self._blocks = [table]
        return {c: table[:, i].astype(np.int64) if c in _INT else np.ascontiguousarray(table[:, i])
                for i, c in enumerate(STEP_COLUMNS)}
