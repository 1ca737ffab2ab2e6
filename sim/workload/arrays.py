"""A workload as aligned arrays, sorted by arrival time."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class RequestArrays:
    """``arrival_s`` (from the first request), ``input_tokens``, ``output_tokens`` per request.

    Optional: ``hash_ids`` — per request, the ids of its prompt's prefix blocks of
    ``hash_block_size`` tokens each (two requests sharing a leading run of ids share that
    prefix's KV cache, as in Mooncake traces); ``session_id`` and ``priority`` per request;
    ``max_tokens`` per request — what the client sends (a request stops at it, finish reason
    ``length``); None: the client sends none and the engine's default applies (its context
    left: sim/policies/base.py ``Scheduler.add_request``). Never derived from ``output_tokens``
    unless the workload says its client sends each request's output length (``workload.max_tokens:
    output``: benchmark clients with ignore_eos).
    ``abort_s`` per request — when its client aborts it (a disconnect, a client timeout), on
    ``arrival_s``'s clock (NaN: never); it follows every change of the arrival times
    (``retimed``), and an abort after the request's end changes nothing.
    ``measured`` — columns measured by a real benchmark run of the same requests (for example
    ``measured_ttft_s``, ``measured_e2el_s``, ``measured_itl_s``), kept for comparison.
    """

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    hash_ids: list[np.ndarray] | None = None
    hash_block_size: int = 16
    session_id: np.ndarray | None = None
    priority: np.ndarray | None = None
    measured: dict | None = None
    max_tokens: np.ndarray | None = None
    abort_s: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def mean_rate_per_s(self) -> float:
        return mean_rate_per_s(self.arrival_s)

    def take(self, idx: np.ndarray) -> "RequestArrays":
        """The requests at positions ``idx`` (an index array or boolean mask), in that order."""
        idx = np.flatnonzero(idx) if idx.dtype == bool else np.asarray(idx)
        return replace(
            self,
            arrival_s=self.arrival_s[idx], input_tokens=self.input_tokens[idx],
            output_tokens=self.output_tokens[idx],
            hash_ids=None if self.hash_ids is None else [self.hash_ids[i] for i in idx.tolist()],
            session_id=None if self.session_id is None else self.session_id[idx],
            priority=None if self.priority is None else self.priority[idx],
            measured=None if self.measured is None else {k: _take(v, idx) for k, v in self.measured.items()},
            max_tokens=None if self.max_tokens is None else self.max_tokens[idx],
            abort_s=None if self.abort_s is None else self.abort_s[idx],
        )

    def with_arrivals(self, arrival_s: np.ndarray) -> "RequestArrays":
        """The same requests arriving at ``arrival_s``; each abort time keeps its delay after
        its arrival (``retimed`` maps both exactly where the change is a shift and a scale)."""
        if self.abort_s is None:
            return replace(self, arrival_s=arrival_s)
        return replace(self, arrival_s=arrival_s, abort_s=arrival_s + (self.abort_s - self.arrival_s))

    def retimed(self, t0_s: float, scale: float) -> "RequestArrays":
        """Every arrival and abort time t as (t - t0_s) * scale: the clock moved to start at
        ``t0_s`` and its gaps scaled (t0 0 and scale 1 keep the times to the bit)."""
        abort = None if self.abort_s is None else (self.abort_s - t0_s) * scale
        return replace(self, arrival_s=(self.arrival_s - t0_s) * scale, abort_s=abort)


def mean_rate_per_s(arrival_s: np.ndarray) -> float:
    """Requests per second over the span of ``arrival_s`` (sorted): (n - 1) / (last - first)."""
    n = len(arrival_s)
    span = float(arrival_s[-1] - arrival_s[0]) if n > 1 else 0.0
    return (n - 1) / span if span > 0 else float("inf")


def _take(v, idx: np.ndarray):
    return [v[i] for i in idx.tolist()] if isinstance(v, list) else v[idx]


def concat(chunks: list[RequestArrays]) -> RequestArrays:
    """One ``RequestArrays`` from consecutive chunks (optional fields must agree)."""
    if len(chunks) == 1:
        return chunks[0]
    first = chunks[0]

    def cat(get):
        parts = [get(c) for c in chunks]
        if any(p is None for p in parts):
            return None
        return [x for p in parts for x in p] if isinstance(parts[0], list) else np.concatenate(parts)

    measured = None
    if first.measured is not None:
        measured = {k: cat(lambda c, k=k: (c.measured or {}).get(k)) for k in first.measured}
    return RequestArrays(
        cat(lambda c: c.arrival_s), cat(lambda c: c.input_tokens), cat(lambda c: c.output_tokens),
        hash_ids=cat(lambda c: c.hash_ids), hash_block_size=first.hash_block_size,
        session_id=cat(lambda c: c.session_id), priority=cat(lambda c: c.priority), measured=measured,
        max_tokens=cat(lambda c: c.max_tokens), abort_s=cat(lambda c: c.abort_s),
    )
