"""Finished requests' results as columns: what ``requests.parquet`` and the summary read,
copied out of each ``Request`` as it ends so the object can be dropped.

Why: a live ``Request`` costs about a kilobyte (43 slots and the float objects they point
to); a finished one is needed only for these fields. Kept as float64 blocks of
``BLOCK_ROWS`` rows (the integer fields are exact there, below 2**53) plus one byte of status
and a code per failure reason: about 200 bytes a request, so memory while running grows with
the requests in flight, not with those already served.
"""

from __future__ import annotations

import operator

import numpy as np

from sim.core.ttft import TTFT_PARTS

# Request attributes copied, in this order (the numeric ones; status and fail_reason apart).
FIELDS = (
    "request_id", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "prompt_tokens",
    "output_tokens", "num_preemptions", "replica", "prefix_hit_tokens", "transfer_start_s",
    "transfer_end_s", "decode_wait_s", "decode_rounds_waited", *TTFT_PARTS,
)
INT_FIELDS = frozenset(("request_id", "prompt_tokens", "output_tokens", "num_preemptions", "replica",
                        "prefix_hit_tokens", "decode_rounds_waited"))
BLOCK_ROWS = 1 << 14


class RequestResults:
    """Append-only sink of finished requests (``add``); ``columns()`` returns them ordered by
    request id. Every request sent (``sent``, set by the simulation) must be added exactly once."""

    def __init__(self) -> None:
        self.sent = 0
        self._get = operator.attrgetter(*FIELDS)
        self._rows: list[tuple] = []
        self._labels: list[tuple[str, str]] = []
        self._blocks: list[np.ndarray] = []
        self._codes: list[np.ndarray] = []
        self._label_code: dict[tuple[str, str], int] = {}

    def __len__(self) -> int:
        return sum(len(b) for b in self._blocks) + len(self._rows)

    def add(self, reqs) -> None:
        get, rows, labels = self._get, self._rows, self._labels
        for r in reqs:
            rows.append(get(r))
            labels.append((r.status, r.fail_reason))
        if len(rows) >= BLOCK_ROWS:
            self._pack()

    def _pack(self) -> None:
        if not self._rows:
            return
        self._blocks.append(np.array(self._rows, dtype=np.float64).reshape(-1, len(FIELDS)))
        codes = self._label_code
        self._codes.append(np.array([codes.setdefault(x, len(codes)) for x in self._labels], dtype=np.int32))
        self._rows, self._labels = [], []

    def columns(self) -> dict[str, np.ndarray]:
        """{field: array} ordered by request id, plus ``status`` and ``fail_reason`` (object
        arrays of str)."""
        self._pack()
        if self._blocks:
            table = np.concatenate(self._blocks)
            codes = np.concatenate(self._codes)
        else:
            table, codes = np.zeros((0, len(FIELDS))), np.zeros(0, np.int32)
        order = np.argsort(table[:, 0], kind="stable")
        table, codes = table[order], codes[order]
        ids = table[:, 0]
        if len(ids) != self.sent or (len(ids) and (ids != np.arange(len(ids))).any()):
            raise AssertionError(f"{self.sent:,} requests sent, {len(ids):,} results recorded "
                                 f"(each request must end exactly once)")
        out = {f: table[:, i].astype(np.int64) if f in INT_FIELDS else np.ascontiguousarray(table[:, i])
               for i, f in enumerate(FIELDS)}
        labels = list(self._label_code)
        status = np.array([s for s, _ in labels] or [""], dtype=object)
        reason = np.array([f for _, f in labels] or [""], dtype=object)
        out["status"], out["fail_reason"] = status[codes], reason[codes]
        return out
