"""Finished requests' results as columns: what ``requests.parquet`` and the summary read,
copied out of each ``Request`` as it ends so the object can be dropped.

Why: a live ``Request`` costs about a kilobyte (43 slots and the float objects they point
to); a finished one is needed only for these fields: 8 bytes each in numpy columns
(``ColumnBuffer``), plus a code for its (status, failure reason). Memory while running then
grows with the requests in flight, not with those already served.
"""

from __future__ import annotations

import struct

import numpy as np

from sim.core.request import Request
from sim.core.ttft import ENGINE_TTFT_PARTS
from sim.engine import columns as column_store
from sim.engine.columns import ColumnBuffer, RowBlock

# Request attributes copied, in this order; the last is the (status, fail_reason) code.
FIELDS = (
    "request_id", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "prompt_tokens",
    "output_tokens", "num_preemptions", "replica", "prefix_hit_tokens", "transfer_start_s",
    "transfer_end_s", "decode_wait_s", "decode_rounds_waited", "priority", *ENGINE_TTFT_PARTS,
)
INT_FIELDS = frozenset(("request_id", "prompt_tokens", "output_tokens", "num_preemptions", "replica",
                        "prefix_hit_tokens", "decode_rounds_waited", "priority", "label"))


def result_row(r: Request, code: int) -> tuple:
    """``r``'s ``FIELDS``, in order, and its label ``code``: the attributes read one by one
    (compiled, sim/compiled_core.py, native field reads; ``operator.attrgetter`` took a generic
    look-up each); tests/test_results_columns.py checks it against ``FIELDS``."""
    return (r.request_id, r.arrival_s, r.first_scheduled_s, r.first_token_s, r.finish_s, r.prompt_tokens,
            r.output_tokens, r.num_preemptions, r.replica, r.prefix_hit_tokens, r.transfer_start_s,
            r.transfer_end_s, r.decode_wait_s, r.decode_rounds_waited, r.priority,
            r.ttft_wait_batch_s, r.ttft_wait_kv_s, r.ttft_prefill_s, r.ttft_interference_s,
            r.ttft_overhead_s, r.ttft_preempt_s, r.ttft_kv_transfer_s, r.ttft_decode_s, r.ttft_kv_load_s, code)


class RequestResults(RowBlock):
    """Append-only sink of finished requests (``add``), kept in request-id order. Every request
    sent (``sent``, set by the simulation) must be added exactly once; ``finish`` checks that.

    Requests end out of id order, but only within the requests in flight: each packed block
    is merged with the rows still waiting (sorted by id), and the run of consecutive ids from
    the next one due goes on to the columns (spilled to disk as they fill, ``ColumnBuffer``);
    the rest waits. What waits is bounded by the requests in flight, not by those served."""

    def __init__(self, block_rows: int | None = None) -> None:
        block_rows = block_rows or column_store.BLOCK_ROWS // 2  # 24 fields: 192 bytes a row meanwhile
        self._names = (*FIELDS, "label")
        # the rows added since the last release (integer fields packed as int64)
        super().__init__(len(self._names), block_rows, [n in INT_FIELDS for n in self._names])
        self.sent = 0
        self._buf = ColumnBuffer(self._names, INT_FIELDS, block_rows=block_rows)
        self._waiting = np.zeros((0, len(self._names)))   # ended ahead of an earlier id
        self._label_code: dict[tuple[str, str], int] = {}
        # the last label looked up and its code: most requests end as the one before did (the
        # same status and reason objects), and then ``add`` makes and hashes no label tuple
        self._last_status: str | None = None
        self._last_reason: str | None = None
        self._last_code = -1
        self._finished = False

    def __len__(self) -> int:
        return len(self._buf) + len(self._waiting) + self._rows

    def add(self, reqs: list[Request]) -> None:
        codes = self._label_code
        for r in reqs:
            status, reason = r.status, r.fail_reason
            if status is self._last_status and reason is self._last_reason:
                code = self._last_code
            else:
                label = (status, reason)
                hit = codes.get(label)
                if hit is None:
                    hit = codes[label] = len(codes)
                code = hit
                self._last_status, self._last_reason, self._last_code = status, reason, code
            # ``append(result_row(r, code))`` without the row's tuple (compiled,
            # sim/compiled_core.py, ``pack_into(..., *row)`` copies the row into a list and a
            # tuple again and makes a keyword dict; here the fields go straight to ``pack_into``)
            n = self._rows
            try:
                self._pack_into(self._data, n * self._row_bytes, r.request_id, r.arrival_s, r.first_scheduled_s,
                                r.first_token_s, r.finish_s, r.prompt_tokens, r.output_tokens, r.num_preemptions,
                                r.replica, r.prefix_hit_tokens, r.transfer_start_s, r.transfer_end_s,
                                r.decode_wait_s, r.decode_rounds_waited, r.priority, r.ttft_wait_batch_s, r.ttft_wait_kv_s,
                                r.ttft_prefill_s, r.ttft_interference_s, r.ttft_overhead_s, r.ttft_preempt_s,
                                r.ttft_kv_transfer_s, r.ttft_decode_s, r.ttft_kv_load_s, code)
            except struct.error:  # as append's: no room yet, or a value struct refuses
                self._append_slow(n, result_row(r, code))
            self._rows = n + 1
            if n + 1 >= self.block_rows:
                self.full()

    def full(self) -> None:
        self._release()

    def _release(self) -> None:
        """Merge the new rows with those waiting; pass on the consecutive ids from the next due."""
        if not self._rows:
            return
        block = self.take().copy()  # float64 (what waits below is kept past the next row)
        rows = np.concatenate([self._waiting, block]) if len(self._waiting) else block
        ids = rows[:, 0]
        if len(ids) > 1 and (np.diff(ids) < 0).any():
            rows = rows[np.argsort(ids, kind="stable")]
            ids = rows[:, 0]
        due = np.arange(len(self._buf), len(self._buf) + len(ids), dtype=np.float64)
        ready = len(ids) if (ids == due).all() else int(np.argmin(ids == due))
        if ready:
            self._buf.add_block(rows[:ready])
        self._waiting = rows[ready:]

    def finish(self) -> None:
        """Every request recorded, each exactly once (else AssertionError); columns complete."""
        if self._finished:
            return
        self._release()
        n = len(self._buf)
        if n != self.sent or len(self._waiting):
            raise AssertionError(f"{self.sent:,} requests sent, {len(self):,} results recorded "
                                 f"(each request must end exactly once)")
        self._buf.finish()
        self._finished = True

    def labels(self) -> list[tuple[str, str]]:
        """(status, fail_reason) per ``label`` code."""
        return list(self._label_code) or [("", "")]

    def read(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows [start, stop) (by request id) of one field, ``label``, or ``status`` /
        ``fail_reason`` (object arrays of str)."""
        self.finish()
        if name in ("status", "fail_reason"):
            code = self._buf.read("label", start, stop)
            i = 0 if name == "status" else 1
            return np.array([lab[i] for lab in self.labels()], dtype=object)[code]
        return self._buf.read(name, start, stop)

    def columns(self) -> dict[str, np.ndarray]:
        """{field: array} ordered by request id, plus ``status`` and ``fail_reason`` (object
        arrays of str)."""
        cols = {n: self.read(n) for n in FIELDS}
        cols["status"] = self.read("status")
        cols["fail_reason"] = self.read("fail_reason")
        return cols
