"""A KV-transfer link shared by concurrent transfers (processor sharing).

Why: disaggregated serving ships each request's KV cache from the prefill pool to the decode
pool; concurrent transfers split the link's bandwidth equally (a fluid model of fair sharing,
as TCP/RDMA flows on one NIC), and each transfer also pays a fixed latency. An isolated
transfer takes bytes / bandwidth + latency (Zhong et al. 2024, "DistServe", section 4).
Plain code: the cluster asks for the next completion time and advances the clock.
"""

from __future__ import annotations

import math
from typing import Any


class SharedLink:
    """Processor-sharing link: n active transfers each progress at bandwidth / n."""

    def __init__(self, bandwidth_bytes_per_s: float, latency_s: float):
        self.bandwidth_bytes_per_s = bandwidth_bytes_per_s
        self.latency_s = latency_s
        self._remaining: dict[Any, float] = {}  # item -> bytes left
        self._now = 0.0
        self.bytes_sent = 0.0
        self.num_transfers = 0

    def advance(self, now: float) -> None:
        """Move every active transfer forward to ``now``."""
        n = len(self._remaining)
        if n and now > self._now:
            sent = (now - self._now) * self.bandwidth_bytes_per_s / n
            for item in self._remaining:
                self._remaining[item] -= sent
        self._now = max(self._now, now)

    def start(self, item: Any, num_bytes: float, now: float) -> None:
        self.advance(now)
        self._remaining[item] = float(num_bytes)
        self.bytes_sent += num_bytes
        self.num_transfers += 1

    def next_done_s(self) -> float | None:
        """When the smallest active transfer has sent its last byte (None if idle)."""
        if not self._remaining:
            return None
        n = len(self._remaining)
        return self._now + max(0.0, min(self._remaining.values())) * n / self.bandwidth_bytes_per_s

    def pop_done(self, now: float, eps_bytes: float = 1e-3) -> list[Any]:
        """Transfers whose bytes are all sent by ``now`` (they arrive ``latency_s`` later).

        A transfer whose remaining time is below the clock's resolution at ``now`` (a few ulps:
        float rounding of ``advance`` leaves such residues) is done, so that ``next_done_s``
        is strictly after ``now`` whenever anything is left and time advances by construction.
        """
        self.advance(now)
        n = len(self._remaining)
        if not n:
            return []
        tol_bytes = max(eps_bytes, 8.0 * math.ulp(max(now, 1.0)) * self.bandwidth_bytes_per_s / n)
        done = [item for item, left in self._remaining.items() if left <= tol_bytes]
        for item in done:
            del self._remaining[item]
        return done
