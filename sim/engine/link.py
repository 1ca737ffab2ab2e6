"""KV-transfer links shared by concurrent transfers (a fluid model of fair sharing).

Why: disaggregated serving ships each request's KV cache from a prefill replica to a decode
replica; each transfer leaves through the prefill replica's NIC (egress) and enters through
the decode replica's NIC (ingress), and concurrent transfers share both. Rates are max-min
fair over the two links (progressive filling: Bertsekas & Gallager, "Data Networks", 2nd ed.,
section 6.5.2; the fluid limit of TCP/RDMA flows sharing bottlenecks), and each transfer also
pays a fixed latency. An isolated transfer takes bytes / min(egress, ingress) + latency
(Zhong et al. 2024, "DistServe", section 4). Plain code: the cluster asks for the next
completion time and advances the clock.
"""

from __future__ import annotations

import math
from typing import Any


class LinkNetwork:
    """Transfers from sources (egress links) to destinations (ingress links); a transfer's rate
    is its max-min fair share, constant between starts and completions."""

    def __init__(self, egress_bytes_per_s: list[float], ingress_bytes_per_s: list[float], latency_s: float):
        self.capacity = [float(b) for b in (*egress_bytes_per_s, *ingress_bytes_per_s)]
        self.num_sources = len(egress_bytes_per_s)
        self.latency_s = latency_s
        self._remaining: dict[Any, float] = {}  # item -> bytes left
        self._links: dict[Any, tuple[int, int]] = {}  # item -> (egress link, ingress link)
        self._rate: dict[Any, float] = {}
        self._now = 0.0
        self.bytes_sent = 0.0
        self.num_transfers = 0

    def advance(self, now: float) -> None:
        """Move every active transfer forward to ``now`` at its current rate."""
        if now > self._now:
            dt = now - self._now
            rate = self._rate
            for item in self._remaining:
                self._remaining[item] -= dt * rate[item]
            self._now = now

    def start(self, item: Any, src: int, dst: int, num_bytes: float, now: float) -> None:
        self.advance(now)
        self._remaining[item] = float(num_bytes)
        self._links[item] = (src, self.num_sources + dst)
        self.bytes_sent += num_bytes
        self.num_transfers += 1
        self._share()

    def rate_of(self, item: Any) -> float:
        return self._rate[item]

    def credit(self, item: Any, num_bytes: float) -> None:
        """``num_bytes`` of ``item`` count as already sent (layer-wise pipelining)."""
        self._remaining[item] -= num_bytes

    def _share(self) -> None:
        """Max-min fair rates by progressive filling: repeatedly, the link whose remaining
        capacity split among its unfixed transfers is smallest fixes them at that share."""
        left = list(self.capacity)
        users: dict[int, list] = {}
        for item, links in self._links.items():
            for link in links:
                users.setdefault(link, []).append(item)
        rate: dict[Any, float] = {}
        while len(rate) < len(self._links):
            best_link, best_share = -1, math.inf
            for link in sorted(users):
                n = sum(1 for item in users[link] if item not in rate)
                if n and left[link] / n < best_share:
                    best_link, best_share = link, left[link] / n
            for item in users[best_link]:
                if item not in rate:
                    rate[item] = best_share
                    for link in self._links[item]:
                        left[link] = max(0.0, left[link] - best_share)
        self._rate = rate

    def next_done_s(self) -> float | None:
        """When the first active transfer will have sent its last byte (None if idle)."""
        if not self._remaining:
            return None
        rate = self._rate
        return self._now + min(max(0.0, left) / rate[item] for item, left in self._remaining.items())

    def pop_done(self, now: float, eps_bytes: float = 1e-3) -> list[Any]:
        """Transfers whose bytes are all sent by ``now`` (they arrive ``latency_s`` later).

        A transfer whose remaining time is below the clock's resolution at ``now`` (a few ulps:
        float rounding of ``advance`` leaves such residues) is done, so that ``next_done_s``
        is strictly after ``now`` whenever anything is left and time advances by construction.
        """
        self.advance(now)
        if not self._remaining:
            return []
        ulps = 8.0 * math.ulp(max(now, 1.0))
        rate = self._rate
        done = [item for item, left in self._remaining.items() if left <= max(eps_bytes, ulps * rate[item])]
        for item in done:
            del self._remaining[item], self._links[item]
        if done:
            self._share()
        return done


class SharedLink(LinkNetwork):
    """One link: n active transfers each progress at bandwidth / n (processor sharing)."""

    def __init__(self, bandwidth_bytes_per_s: float, latency_s: float):
        super().__init__([bandwidth_bytes_per_s], [math.inf], latency_s)
        self.bandwidth_bytes_per_s = bandwidth_bytes_per_s

    def start(self, item: Any, num_bytes: float, now: float) -> None:  # type: ignore[override]
        super().start(item, 0, 0, num_bytes, now)


def layerwise_presend_bytes(num_bytes: float, num_layers: int, step_s: float, rate_bytes_per_s: float) -> float:
    """Bytes of a request's KV already sent when the prefill step that computed it ends, if the
    transfer is pipelined layer by layer with the compute (Splitwise, Patel et al. 2024, and
    Mooncake, Qin et al. 2025: layer i's KV is sent while layer i+1 runs).

    Layer i of L is ready at i/L of the step; with the link faster than the compute only the
    last layer's share (bytes / L) is left at the step's end, else what the link could not
    carry during the first (L-1)/L of the step: bytes - rate x step x (L-1)/L. Isolated
    transfer, so the exposed time after the step is max(bytes / (L x rate),
    bytes / rate - step x (L-1)/L). NOTE: ``rate`` is the transfer's fair share at the step's
    end, assumed to have held during the step.
    """
    if num_layers <= 1:
        return 0.0
    early = num_bytes * (num_layers - 1) / num_layers
    return min(early, rate_bytes_per_s * step_s * (num_layers - 1) / num_layers)
