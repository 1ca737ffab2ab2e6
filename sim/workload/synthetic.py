"""Synthetic workloads: gamma arrivals and length distributions (ARCHITECTURE.md section 3).

Why: vLLM bench draws inter-arrival gaps from a gamma distribution with shape = burstiness
and mean 1/rate (burstiness 1 = Poisson; < 1 burstier); users compare against it.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from sim.errors import UserError
from sim.limits import MAX_TOKENS, check_last_arrival_s
from sim.workload.arrays import RequestArrays


def arrival_times_s(rng: np.random.Generator, n: int, rate_per_s: float, burstiness: float) -> np.ndarray:
    """Gamma(shape=burstiness, scale=1/(rate*burstiness)) gaps, first request at t=0 (vLLM bench)."""
    if math.isinf(rate_per_s):
        return np.zeros(n)
    product = rate_per_s * burstiness
    # a product that underflows to 0 (rate 5e-324) means infinite gaps: check_last_arrival_s refuses them
    gaps = rng.gamma(shape=burstiness, scale=1.0 / product if product > 0 else math.inf, size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def sample_lengths(rng: np.random.Generator, n: int, spec, resolve_path, where: str) -> np.ndarray:
    """Token counts (>= 1) from a ``LengthDist``."""
    if spec.dist == "mixture":
        # each request draws its component by weight, then its length from that component
        weights = np.array([c.weight or 1.0 for c in spec.components], dtype=np.float64)
        which = rng.choice(len(weights), size=n, p=weights / weights.sum())
        out = np.empty(n, dtype=np.int64)
        for i, comp in enumerate(spec.components):
            mask = which == i
            out[mask] = sample_lengths(rng, int(mask.sum()), comp, resolve_path, f"{where}.components[{i}]")
    elif spec.dist == "fixed":
        out = np.full(n, spec.value, dtype=np.int64)
    elif spec.dist == "uniform":
        out = rng.integers(spec.min, spec.max + 1, size=n)
    elif spec.dist == "lognormal":
        # mean of a lognormal is exp(mu + sigma^2 / 2): pick mu so the mean is `mean`.
        mu = math.log(spec.mean) - spec.sigma**2 / 2.0
        # clipped to MAX_TOKENS before the cast: a far tail must not wrap around int64
        out = np.rint(np.minimum(rng.lognormal(mu, spec.sigma, size=n), MAX_TOKENS)).astype(np.int64)
    else:  # empirical: resample a column of a trace file
        from sim.workload.trace import read_column

        values = read_column(resolve_path(spec.path), spec.column, where)
        out = rng.choice(values, size=n, replace=True).astype(np.int64)
    if spec.max is not None and spec.dist != "uniform":
        out = np.minimum(out, spec.max)
    if spec.min is not None and spec.dist != "uniform":
        out = np.maximum(out, spec.min)
    return np.maximum(out, 1)


def _arrivals(rng: np.random.Generator, n: int, spec) -> np.ndarray:
    if spec.rate_profile is not None:
        from sim.workload.rate_profile import profile_arrival_times_s

        return profile_arrival_times_s(rng, n, spec.rate_profile, spec.burstiness)
    return arrival_times_s(rng, n, spec.request_rate, spec.burstiness)


def _check_arrivals(spec, arrival_s: np.ndarray, what: str) -> None:
    """The arrivals (or session starts) drawn from the rate or the rate profile end within
    ``MAX_TIME_S`` (``check_last_arrival_s``)."""
    if spec.rate_profile is not None:
        key, rate = "workload.synthetic.rate_profile", f"the {spec.rate_profile.shape} rate profile"
    else:
        key, rate = "workload.synthetic.request_rate", f"{spec.request_rate:g} req/s"
    check_last_arrival_s(float(arrival_s[-1]), key, f"{rate} (burstiness {spec.burstiness:g}) for {len(arrival_s):,} {what}")


def synthetic_workload(spec, seed: int, resolve_path=lambda p: p) -> RequestArrays:
    """Draw arrivals, then input lengths, then output lengths, from one seeded generator.

    With ``prefix_groups`` or ``multi_turn`` the prompts carry ``hash_ids`` (sessions.py);
    ``max_concurrency`` is applied when the requests are sent (cluster.simulate).
    """
    if spec.num_requests < 1:
        raise UserError("workload.synthetic.num_requests: must be >= 1")
    if spec.prefix_groups is not None and spec.multi_turn is not None:
        raise UserError("workload.synthetic: give prefix_groups or multi_turn, not both")
    _check_closed_loop(spec)
    w = with_priority_classes(_drawn(spec, seed, resolve_path), spec.priority_classes, seed)
    if spec.warmup_requests >= len(w):
        raise UserError(f"workload.synthetic.warmup_requests: {spec.warmup_requests:,} leaves none of the workload's "
                        f"{len(w):,} requests to measure")
    return w


def with_priority_classes(w: RequestArrays, classes, seed: int) -> RequestArrays:
    """``w`` with each request's priority drawn from ``classes`` (``priority``, ``weight``), one
    draw per session where requests have sessions (a conversation keeps its class). The draws
    come from a generator of their own (seeded ``[seed, 1]``), so the arrivals and lengths are
    those of the same workload without classes."""
    if not classes:
        return w
    rng = np.random.default_rng([seed, 1])
    values = np.array([c.priority for c in classes], dtype=np.int64)
    p = np.array([c.weight for c in classes], dtype=np.float64)
    p /= p.sum()
    if w.session_id is not None:
        codes, inverse = np.unique(w.session_id, return_inverse=True)
        drawn = values[rng.choice(len(values), size=len(codes), p=p)][inverse]
    else:
        drawn = values[rng.choice(len(values), size=len(w), p=p)]
    return replace(w, priority=drawn)


def _drawn(spec, seed: int, resolve_path) -> RequestArrays:
    """The arrivals and lengths (and prefixes, sessions) of ``spec``, from one seeded generator."""
    rng = np.random.default_rng(seed)
    if spec.prefix_groups is not None:
        return _prefix_groups(spec, rng, resolve_path)
    if spec.multi_turn is not None:
        return _multi_turn(spec, rng, resolve_path)
    arrival = _arrivals(rng, spec.num_requests, spec)
    _check_arrivals(spec, arrival, "requests")
    inp = sample_lengths(rng, spec.num_requests, spec.input_tokens, resolve_path, "workload.synthetic.input_tokens")
    out = sample_lengths(rng, spec.num_requests, spec.output_tokens, resolve_path, "workload.synthetic.output_tokens")
    if spec.shared_prefix_tokens:
        return with_shared_prefix(rng, RequestArrays(arrival, inp, out), spec.shared_prefix_tokens, spec.num_prefixes)
    return RequestArrays(arrival, inp, out)


def _check_closed_loop(spec) -> None:
    """With ``max_concurrency`` c, some client sends ceil(n / c) of the n requests, each
    ``think_time_s`` after its previous one ended: its last send is at least
    (ceil(n / c) - 1) x think_time_s, whatever the service times."""
    c, think = spec.max_concurrency, spec.think_time_s
    if c is None or think <= 0:
        return
    per_client = -(-spec.num_requests // c)
    check_last_arrival_s((per_client - 1) * think, "workload.synthetic.think_time_s",
                         f"{think:g} s before each of a client's {per_client - 1:,} later requests "
                         f"({spec.num_requests:,} requests over max_concurrency {c:,} clients)")


SHARED_PREFIX_HASH_BLOCK_TOKENS = 16


def with_shared_prefix(rng: np.random.Generator, w: RequestArrays, prefix_tokens: int,
                       num_prefixes: int) -> RequestArrays:
    """Prepend one of ``num_prefixes`` system prompts of ``prefix_tokens`` tokens to every prompt
    (``workload.synthetic.shared_prefix_tokens`` / ``num_prefixes``; owned by the prefix-caching
    claims, see scenarios/prefix_cache.yaml).

    Each system prompt is a chain of hash ids, one per 16 tokens; the question after it gets
    ids of its own, so only the system prompt is shared between requests.
    """
    from sim.workload.sessions import check_blocks

    h = SHARED_PREFIX_HASH_BLOCK_TOKENS
    group = rng.integers(0, num_prefixes, size=len(w))
    n_shared = -(-prefix_tokens // h)
    inp = w.input_tokens + prefix_tokens
    check_blocks(int((-(-inp // h)).sum()), h, "workload.synthetic.shared_prefix_tokens")
    next_id = num_prefixes * n_shared
    hash_ids = []
    for g, total in zip(group.tolist(), inp.tolist()):
        n_own = -(-total // h) - n_shared
        ids = np.concatenate([np.arange(g * n_shared, (g + 1) * n_shared), np.arange(next_id, next_id + n_own)])
        next_id += n_own
        hash_ids.append(ids)
    return RequestArrays(w.arrival_s, inp, w.output_tokens, hash_ids=hash_ids, hash_block_size=h)


def _prefix_groups(spec, rng: np.random.Generator, resolve_path) -> RequestArrays:
    from sim.workload.sessions import prefix_group_prompts

    g = spec.prefix_groups
    n = g.num_groups * g.prompts_per_group
    if "num_requests" in spec.model_fields_set and spec.num_requests != n:
        raise UserError(f"workload.synthetic.num_requests is {spec.num_requests} but prefix_groups makes "
                        f"num_groups x prompts_per_group = {n} requests; drop num_requests or make them agree")
    arrival = _arrivals(rng, n, spec)
    _check_arrivals(spec, arrival, "requests")
    inp, hashes, group = prefix_group_prompts(rng, g, spec.hash_block_size)
    out = sample_lengths(rng, n, spec.output_tokens, resolve_path, "workload.synthetic.output_tokens")
    return RequestArrays(arrival, inp, out, hash_ids=hashes, hash_block_size=spec.hash_block_size, session_id=group)


def _multi_turn(spec, rng: np.random.Generator, resolve_path) -> RequestArrays:
    """Sessions start as the arrival process says; their turns follow ``think_time_s`` apart
    (exponential gaps); sessions are drawn until ``num_requests`` turns exist, and the first
    ``num_requests`` turns in time order are kept."""
    from sim.workload.sessions import session_requests

    n = spec.num_requests
    mt = spec.multi_turn
    starts = _arrivals(rng, n, spec)  # at most n sessions are needed (each has >= 1 turn)
    # a session's turns after the n-th can never be among the first n turns: drawn, not kept
    turns = np.minimum(sample_lengths(rng, n, mt.turns, resolve_path, "workload.synthetic.multi_turn.turns"), n)
    num_sessions = int(np.searchsorted(np.cumsum(turns), n) + 1)
    turns = turns[:num_sessions]
    m = int(turns.sum())
    new = sample_lengths(rng, m, spec.input_tokens, resolve_path, "workload.synthetic.input_tokens")
    out = sample_lengths(rng, m, spec.output_tokens, resolve_path, "workload.synthetic.output_tokens")
    gaps = rng.exponential(mt.think_time_s, size=m) if mt.think_time_s > 0 else np.zeros(m)
    arrival, inp, out, hashes, sess = session_requests(starts[:num_sessions], turns, new, out, gaps,
                                                       spec.hash_block_size)
    _check_arrivals(spec, starts[:num_sessions], "sessions")
    order = np.argsort(arrival, kind="stable")[:n]
    order.sort(kind="stable")  # keep the chosen turns, then order them by time
    arr = RequestArrays(arrival, inp, out, hash_ids=hashes, hash_block_size=spec.hash_block_size, session_id=sess)
    chosen = arr.take(order)
    check_last_arrival_s(float(chosen.arrival_s.max()), "workload.synthetic.multi_turn.think_time_s",
                         f"{mt.think_time_s:g} s mean think time between the turns of a session")
    return chosen.take(np.argsort(chosen.arrival_s, kind="stable"))
