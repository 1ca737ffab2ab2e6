"""Admission control in front of the engines: per-class rate and concurrency limits.

Why: a serving deployment sheds load before its engines with a gateway limit (vLLM has none of
its own: its server queues every request), answering HTTP 429 to a request over the limit. A
request rejected here never reaches a scheduler: it ends with status ``rejected`` and the limit
that refused it, counted apart from failures (``simsrv_rejected``, ``simsrv_rejected_reasons``)
and out of every latency figure. ``simsrv serve`` answers it with 429 (sim/serve/driver.py).

The decision is taken when the request reaches the engine side of the deployment (after the API
server's input processing, where one is modelled: sim/engine/frontend.py), in a replayed and in
a live run alike, so a recorded live session replays to the same decisions. Plain code: no
SimPy, driven by ``decide(req, now)`` on arrival and ``ended(req)`` when an admitted request ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.core.request import Request

# a rejected request's status (Request.status), beside completed and failed
REJECTED = "rejected"


@dataclass
class TokenBucket:
    """A token bucket (Turner 1986, "New directions in communications"; the rate limiter of
    Envoy's local_ratelimit filter and of API gateways): ``burst`` tokens at most, refilled
    continuously at ``rate_per_s``; a request takes one token, or is refused when less than one
    is left. Full at the start."""

    rate_per_s: float
    burst: float
    tokens: float = -1.0
    last_s: float = 0.0

    def __post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = self.burst

    def level(self, now: float) -> float:
        """The tokens in the bucket at ``now`` (``now`` never before the last look)."""
        return min(self.burst, self.tokens + self.rate_per_s * (now - self.last_s))

    def refill(self, now: float) -> None:
        self.tokens = self.level(now)
        self.last_s = now

    def take(self) -> None:
        self.tokens -= 1.0


@dataclass
class ClassLimit:
    """The limits of one class (``priority`` None: every request) and its state."""

    priority: int | None
    bucket: TokenBucket | None
    max_concurrency: int | None
    in_system: int = 0  # admitted requests of the class not yet ended

    def applies(self, req: Request) -> bool:
        return self.priority is None or req.priority == self.priority

    @property
    def name(self) -> str:
        return "all requests" if self.priority is None else f"priority {self.priority}"

    def refusal(self, now: float) -> str:
        """Why a request of this class is refused at ``now`` (concurrency first), or ''."""
        if self.max_concurrency is not None and self.in_system >= self.max_concurrency:
            return f"admission_control: max_concurrency {self.max_concurrency} reached ({self.name})"
        if self.bucket is not None:
            self.bucket.refill(now)
            if self.bucket.tokens < 1.0:
                b = self.bucket
                return f"admission_control: token_bucket empty ({self.name}: {b.rate_per_s:g}/s, burst {b.burst:g})"
        return ""


class AdmissionControl:
    """The scenario's ``admission_control`` limits; a request passes only when every limit that
    applies to it (its class's and the one for all requests) admits it, and then counts against
    each of them."""

    def __init__(self, limits: list[ClassLimit]):
        self.limits = limits
        self.rejected = 0

    @classmethod
    def of(cls, spec) -> AdmissionControl | None:
        """From the scenario's ``admission_control`` section (None: no section, no limits)."""
        if spec is None:
            return None
        out = []
        for c in spec.limits:
            tb = c.token_bucket
            out.append(ClassLimit(c.priority, None if tb is None else TokenBucket(tb.rate_per_s, tb.burst),
                                  c.max_concurrency))
        return cls(out)

    def decide(self, req: Request, now: float) -> str:
        """'' to admit ``req`` (counted in its limits), else the limit that rejects it. A
        rejected request takes no token and holds no place."""
        mine = [c for c in self.limits if c.applies(req)]
        for c in mine:
            reason = c.refusal(now)
            if reason:
                self.rejected += 1
                return reason
        for c in mine:
            if c.bucket is not None:
                c.bucket.take()
            c.in_system += 1
        return ""

    def ended(self, req: Request) -> None:
        """An admitted request ended (completed or failed): its places are free again."""
        for c in self.limits:
            if c.applies(req):
                c.in_system -= 1


def reject(req: Request, now: float, reason: str) -> None:
    """End ``req`` now as rejected by admission control."""
    req.status = REJECTED
    req.fail_reason = reason
    req.finish_s = now
