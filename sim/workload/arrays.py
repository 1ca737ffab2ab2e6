"""A workload as aligned arrays, sorted by arrival time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RequestArrays:
    """``arrival_s`` (from the first request), ``input_tokens``, ``output_tokens`` per request.

    Optional: ``hash_ids`` — per request, the ids of its prompt's prefix blocks of
    ``hash_block_size`` tokens each (two requests sharing a leading run of ids share that
    prefix's KV cache, as in Mooncake traces); ``session_id`` and ``priority`` per request.
    """

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    hash_ids: list[np.ndarray] | None = None
    hash_block_size: int = 16
    session_id: np.ndarray | None = None
    priority: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def mean_rate_per_s(self) -> float:
        span = float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) > 1 else 0.0
        return (len(self) - 1) / span if span > 0 else float("inf")
