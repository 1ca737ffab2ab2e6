"""ITL per streamed chunk, for ``engine.stream_interval`` > 1 (issue 37).

Why: a client measures inter-token latency between the chunks it receives (vLLM bench serve,
vllm/benchmarks/lib/endpoint_request_func.py: one ``itl`` entry per received chunk after the
first, ``timestamp - most_recent_timestamp``). With ``--stream-interval N`` the API server sends
a request's first token alone, then a chunk whenever N tokens have gathered, and the last when
it finishes (vLLM's output processor, vllm/v1/engine/output_processor.py; SGLang's
``--stream-interval`` and TensorRT-LLM's ``stream_interval`` the same: sim/engine/frontend.py).
So a request of n tokens gives 1 + ceil((n - 1) / N) chunks (``Frontend.num_chunks``) and
ceil((n - 1) / N) gaps, each spanning N of its decode steps (the last what is left), not
n - 1 gaps of one step each. TPOT is unchanged: (e2el - ttft) / (n - 1).

How, without a loop over tokens: a decode emits one token at the end of every decode step of
its replica from its first token to its finish (``DecodeSet``: every running sequence gains
one per step), except across its breaks, which the scheduler records one by one
(``Scheduler.itl_breaks``: a pause for the token budget, a preemption, a swap-in). So its
k-th token's time is its replica's (k - 1)-th decode-step end after its first token (numpy
``searchsorted`` over the step ends, one per step: a fast-forwarded row of k steps holds them
evenly spaced along its straight piece, as ``step_pieces`` does, its last at the row's end); the
requests with breaks (few) are placed one by one. Each request's token count is checked against
its output tokens. A chunk reaches the client ``frontend_chunk + frontend_per_output_token x
its tokens`` after its last token (``Frontend``): its gap to the previous chunk adds the
difference of the two chunks' detokenisation. A request's gaps add up to its client-side
decode time (finish - first token, both as the client sees them), so mean ITL x gaps = the
decode time summed.

NOTE: only completed requests count (vLLM bench pools the ITLs of successful requests);
disaggregated pools, multi-step scheduling and speculative decoding are refused with
stream_interval > 1 (sim/scenario.py). The gaps are held in memory (one float per chunk).
"""

from __future__ import annotations

import numpy as np

from sim.metrics.vllm_bench import PieceSets, RunLengthSamples, _with_decodes, step_pieces

# the step-log columns read
CHUNK_STEP_COLUMNS = ("replica", "start_s", "duration_s", "num_steps", "decode_tokens",
                      "first_step_duration_s", "last_step_duration_s")


def step_ends(steps: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(replica, time) of every decode step's end, sorted by replica then time: a row of k > 1
    steps gives k, spaced as its straight piece (first + span j), the last at the row's end."""
    has = _with_decodes(steps)
    pieces = step_pieces(steps)  # each row's first step and the span its steps grow by
    k, first, span = pieces.j1, pieces.first_s, pieces.span_s
    start, dur = steps["start_s"][has], steps["duration_s"][has]
    replica = steps["replica"][has].astype(np.int64)
    row = np.repeat(np.arange(len(k)), k)
    j = np.arange(len(row)) - np.repeat(np.cumsum(k) - k, k)  # step within its row, 0..k-1
    # the (j + 1)-th step's end: start + (j + 1) first + span j (j + 1) / 2
    t = start[row] + (j + 1) * first[row] + span[row] * (j * (j + 1) / 2)
    at_end = j == k[row] - 1
    t[at_end] = (start + dur)[row[at_end]]
    order = np.lexsort((t, replica[row]))
    return replica[row][order], t[order]


def _token_times_with_breaks(ends: np.ndarray, first_s: float, finish_s: float,
                             breaks: list[tuple[float, float, bool]]) -> np.ndarray:
    """One request's token times: its first, the step ends in (first, finish] outside its
    breaks, and a token at each recompute's end."""
    lo, hi = np.searchsorted(ends, [first_s, finish_s], side="right")
    t = ends[lo:hi]
    keep = np.ones(len(t), dtype=bool)
    solo = [first_s]
    for a, b, token in breaks:
        keep &= ~((t > a) & (t <= b))
        if token:
            solo.append(b)
    return np.sort(np.concatenate([np.asarray(solo), t[keep]]))


def chunk_gaps_s(steps: dict[str, np.ndarray], replica: np.ndarray, first_token_s: np.ndarray,
                 finish_s: np.ndarray, output_tokens: np.ndarray, request_id: np.ndarray,
                 breaks: list[tuple[int, float, float, bool]], interval: int,
                 per_output_token_s: float = 0.0) -> np.ndarray:
    """The pooled gaps between consecutive chunks of the given (completed) requests, as their
    clients see them (module docstring). ``interval``: ``engine.stream_interval``; the
    engine-side times are the recorded ones (the front end's per-chunk seconds cancel, its
    per-token ones do not)."""
    n = np.asarray(output_tokens, dtype=np.int64)
    use = n > 1
    rep, first, fin, n, rid = (np.asarray(a)[use] for a in (replica, first_token_s, finish_s, n, request_id))
    if not len(n):
        return np.zeros(0)
    end_rep, ends = step_ends(steps)
    by_request: dict[int, list[tuple[float, float, bool]]] = {}
    for r, a, b, token in breaks:
        by_request.setdefault(int(r), []).append((a, b, token))
    broken = np.isin(rid, np.fromiter(by_request, dtype=np.int64, count=len(by_request))) if by_request \
        else np.zeros(len(rid), dtype=bool)
    # per request, where its replica's step ends start in ``ends`` and the first one after its
    # first token (compared with a few ulps' slack: a row's end is start + (end - start))
    bounds = np.searchsorted(end_rep, np.arange(int(end_rep.max(initial=-1)) + 2))
    lo = np.empty(len(n), dtype=np.int64)
    hi = np.empty(len(n), dtype=np.int64)
    def replica_ends(r: int) -> np.ndarray:
        return ends[bounds[r]:bounds[r + 1]] if r + 1 < len(bounds) else ends[:0]

    for r in np.unique(rep).tolist():
        m = rep == r
        seg = replica_ends(r)
        off = bounds[r] if r < len(bounds) else 0
        lo[m] = off + np.searchsorted(seg, first[m] + 64 * np.spacing(first[m]), side="right")
        hi[m] = off + np.searchsorted(seg, fin[m] + 64 * np.spacing(fin[m]), side="right")
    plain = ~broken
    if (hi - lo != n - 1)[plain].any():
        bad = int(np.flatnonzero(plain & (hi - lo != n - 1))[0])
        raise AssertionError(f"request {int(rid[bad])}: {int(hi[bad] - lo[bad]) + 1} token times for "
                             f"{int(n[bad])} output tokens (ITL per chunk)")
    # chunk c (0-based) of a request ends at its token min(1 + c interval, n); gaps c = 1..C-1
    gaps_per = (n - 2) // interval + 1
    req = np.repeat(np.arange(len(n)), gaps_per)
    c = np.arange(len(req)) - np.repeat(np.cumsum(gaps_per) - gaps_per, gaps_per) + 1
    tok = np.minimum(1 + c * interval, n[req])           # the chunk's last token (1-based)
    prev_tok = 1 + (c - 1) * interval                    # the previous chunk's last token

    def time_of(k: np.ndarray, i: np.ndarray) -> np.ndarray:
        idx = np.clip(lo[i] + k - 2, 0, max(len(ends) - 1, 0))
        t = np.where(k == 1, first[i], ends[idx] if len(ends) else first[i])
        return np.where(k == n[i], fin[i], t)

    gaps = time_of(tok, req) - time_of(prev_tok, req)
    at = np.cumsum(gaps_per) - gaps_per  # each request's first gap in ``gaps``
    for i in np.flatnonzero(broken).tolist():  # the requests with breaks, one by one
        times = _token_times_with_breaks(replica_ends(int(rep[i])), float(first[i]), float(fin[i]), by_request[int(rid[i])])
        if len(times) != n[i]:
            raise AssertionError(f"request {int(rid[i])}: {len(times)} token times for {int(n[i])} "
                                 "output tokens (ITL per chunk)")
        times[-1] = fin[i]
        sel = slice(int(at[i]), int(at[i] + gaps_per[i]))
        gaps[sel] = times[tok[sel] - 1] - times[prev_tok[sel] - 1]
    if per_output_token_s:
        # each chunk reaches the client after detokenising its tokens: the previous chunk held 1
        # (the first) or ``interval`` tokens, this one ``interval`` or what was left
        size = tok - prev_tok
        prev_size = np.where(c == 1, 1, interval)
        gaps = gaps + per_output_token_s * (size - prev_size)
    return gaps


def chunk_itl_pieces(gaps_s: np.ndarray) -> PieceSets:
    """``gaps_s`` as the piece sets ``pieces_stats`` reads (one point each)."""
    pts = RunLengthSamples.points(gaps_s, np.ones(len(gaps_s), np.int64))
    return PieceSets(lambda: iter((pts,)), len(gaps_s))
