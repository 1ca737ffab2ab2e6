"""Finished requests' results as columns: what ``requests.parquet`` and the summary read,
copied out of each ``Request`` as it ends so the object can be dropped.

Why: a live ``Request`` costs about a kilobyte (43 slots and the float objects they point
to); a finished one is needed only for these fields: 8 bytes each in numpy columns
(``ColumnBuffer``), plus a code for its (status, failure reason). Memory while running then
grows with the requests in flight, not with those already served.
"""

from __future__ import annotations

import operator

import numpy as np

from sim.core.ttft import TTFT_PARTS
from sim.engine.columns import ColumnBuffer

# Request attributes copied, in this order; the last is the (status, fail_reason) code.
FIELDS = (
    "request_id", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "prompt_tokens",
    "output_tokens", "num_preemptions", "replica", "prefix_hit_tokens", "transfer_start_s",
    "transfer_end_s", "decode_wait_s", "decode_rounds_waited", *TTFT_PARTS,
)
INT_FIELDS = frozenset(("request_id", "prompt_tokens", "output_tokens", "num_preemptions", "replica",
                        "prefix_hit_tokens", "decode_rounds_waited", "label"))


class RequestResults:
    """Append-only sink of finished requests (``add``); ``columns()`` returns them ordered by
    request id. Every request sent (``sent``, set by the simulation) must be added exactly once."""

    def __init__(self) -> None:
        self.sent = 0
        self._get = operator.attrgetter(*FIELDS)
        self._buf = ColumnBuffer((*FIELDS, "label"), INT_FIELDS, block_rows=1 << 14)
        self._label_code: dict[tuple[str, str], int] = {}

    def __len__(self) -> int:
        return len(self._buf)

    def add(self, reqs) -> None:
        get, append, codes = self._get, self._buf.append, self._label_code
        for r in reqs:
            label = (r.status, r.fail_reason)
            code = codes.get(label)
            if code is None:
                code = codes[label] = len(codes)
            append((*get(r), code))

    def columns(self) -> dict[str, np.ndarray]:
        """{field: array} ordered by request id, plus ``status`` and ``fail_reason`` (object
        arrays of str)."""
        cols = dict(self._buf.columns(order_by="request_id"))
        ids = cols["request_id"]
        if len(ids) != self.sent or (len(ids) and (ids != np.arange(len(ids))).any()):
            raise AssertionError(f"{self.sent:,} requests sent, {len(ids):,} results recorded "
                                 f"(each request must end exactly once)")
        labels = list(self._label_code) or [("", "")]
        code = cols.pop("label")
        cols["status"] = np.array([s for s, _ in labels], dtype=object)[code]
        cols["fail_reason"] = np.array([f for _, f in labels], dtype=object)[code]
        return cols
