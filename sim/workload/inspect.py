"""What is in a trace: size, span, rates over time, burstiness (the busiest 1 s and 10 s
windows against the mean), a timestamp grid, lengths, prefix reuse.

Why: before replaying a trace users need to know its load and shape; the figures are computed
from bounded batches (compact columns, never Python objects per request) so a 10-million-row
trace inspects in bounded memory.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sim.files.text import shown
from sim.workload.readers import ReadOptions, ReadState
from sim.workload.sources import CHUNK_ROWS
from sim.workload.trace import check_span, emit_notes, nothing_left, raw_chunks

PERCENTILES = (50, 90, 99)
BURST_WINDOWS_S = (1, 10)       # peak arrival rates over windows of these lengths
GRID_MIN_ZERO_GAPS = 0.01       # a timestamp grid is reported when at least this share of gaps is 0
GRID_TOLERANCE = 1e-3           # instants within this fraction of the step of a multiple are on the grid


class _BlockCounter:
    """Distinct hash ids seen so far, as one sorted array (bounded by the number of distinct ids)."""

    def __init__(self) -> None:
        self.seen = np.zeros(0, np.int64)
        self.total = 0

    def add(self, hash_ids: list[np.ndarray]) -> None:
        if not hash_ids:
            return
        flat = np.concatenate(hash_ids)
        self.total += len(flat)
        self.seen = np.union1d(self.seen, flat)


def trace_stats(path: str | Path, opts: ReadOptions | None = None, chunk_rows: int = CHUNK_ROWS) -> dict:
    """Figures of the trace (times in trace seconds, before any rescaling)."""
    path = Path(path)
    opts = opts or ReadOptions()
    state = ReadState()
    t, inp, out = [], [], []
    blocks = _BlockCounter()
    block_size = None
    for chunk in raw_chunks(path, opts, state, chunk_rows):
        t.append(chunk.arrival_s)
        inp.append(chunk.input_tokens.astype(np.int32))
        out.append(chunk.output_tokens.astype(np.int32))
        if chunk.hash_ids is not None:
            blocks.add(chunk.hash_ids)
            block_size = chunk.hash_block_size
    if not t:  # every row was left out (failed requests, another model): as ``run`` says
        raise nothing_left(path, state)
    arrival = np.concatenate(t)
    del t
    order = np.argsort(arrival, kind="stable")
    moved = int((order != np.arange(len(order))).sum())
    check_span(path, float(arrival[order[0]]), float(arrival[order[-1]]))
    emit_notes(path, state)  # after the checks: an error is the only line printed
    arrival = arrival[order] - arrival[order[0]]
    del order
    inp_all, out_all = np.concatenate(inp), np.concatenate(out)
    n = len(arrival)
    span = float(arrival[-1])
    gaps = np.diff(arrival)
    counts = np.bincount((arrival // 60).astype(np.int64))
    # each minute's count over the time it covers: the last minute ends at the last arrival
    seconds = np.full(len(counts), 60.0)
    seconds[-1] = max(span - 60.0 * (len(counts) - 1), 1.0) if len(counts) > 1 or span > 0 else 60.0
    per_min = counts / seconds
    stats = {
        "file": shown(path),
        "num_requests": n,
        "span_s": span,
        "mean_rate_per_s": (n - 1) / span if span > 0 else float("inf"),
        "interarrival_cv": float(gaps.std() / gaps.mean()) if len(gaps) and gaps.mean() > 0 else None,
        "rows_moved_by_sorting": moved,
        "rate_per_minute": per_min.tolist(),
        "peak_minute_rate_per_s": float(per_min.max()),
        "total_input_tokens": int(inp_all.sum(dtype=np.int64)),
        "total_output_tokens": int(out_all.sum(dtype=np.int64)),
        "notes": [f"{k}: {v:,}" for k, v in state.notes.items()],
    }
    for name, col in (("input_tokens", inp_all), ("output_tokens", out_all)):
        stats[f"mean_{name}"] = float(col.mean())
        for p in PERCENTILES:
            stats[f"p{p}_{name}"] = float(np.percentile(col, p))
        stats[f"max_{name}"] = int(col.max())
    stats.update(burst_peaks(arrival, stats["mean_rate_per_s"]))
    stats.update(timestamp_grid(arrival, gaps))
    stats["input_tokens_histogram"] = log2_histogram(inp_all)
    stats["output_tokens_histogram"] = log2_histogram(out_all)
    if blocks.total:
        stats["hash_block_size"] = block_size
        stats["num_prefix_blocks"] = blocks.total
        stats["num_distinct_blocks"] = len(blocks.seen)
        # share of prompt blocks already seen earlier in the trace: the hit ratio of an infinite cache
        stats["prefix_block_reuse_ratio"] = 1.0 - len(blocks.seen) / blocks.total
    return stats


def burst_peaks(arrival_s: np.ndarray, mean_rate_per_s: float) -> dict:
    """The busiest window of each BURST_WINDOWS_S length (windows from the first request, a
    request counted in the window its arrival falls in), as a rate and as a multiple of the
    mean rate: a trace whose 1 s peak is 20x its mean queues in bursts a Poisson one never sees."""
    out: dict = {}
    for w in BURST_WINDOWS_S:
        peak = float(np.bincount((arrival_s // w).astype(np.int64)).max()) / w
        out[f"peak_{w}s_rate_per_s"] = peak
        finite = np.isfinite(mean_rate_per_s) and mean_rate_per_s > 0
        out[f"peak_{w}s_over_mean"] = peak / mean_rate_per_s if finite else None
    return out


def timestamp_grid(arrival_s: np.ndarray, gaps_s: np.ndarray) -> dict:
    """``zero_gap_fraction``: the share of inter-arrival gaps that are 0 (requests at the same
    instant); ``timestamp_grid_s``: the step when the timestamps are rounded to a grid (every
    distinct instant a multiple of the smallest gap between instants, and at least
    GRID_MIN_ZERO_GAPS of the gaps 0: Mooncake's ~3 s), else None. Such a trace is replayed
    in bursts unless spread over the grid (workload.trace.spread_grid_s, trace convert --spread-grid)."""
    zero = float((gaps_s == 0).mean()) if len(gaps_s) else 0.0
    out = {"zero_gap_fraction": zero, "timestamp_grid_s": None}
    instants = np.unique(arrival_s)
    if zero < GRID_MIN_ZERO_GAPS or len(instants) < 2:
        return out
    step = float(np.diff(instants).min())
    multiples = (instants - instants[0]) / step
    if np.all(np.abs(multiples - np.round(multiples)) <= GRID_TOLERANCE):
        out["timestamp_grid_s"] = step
    return out


def text_histogram(bins: list[dict], width: int = 40) -> list[str]:
    """A power-of-two histogram as text lines: "   128-256     1,234 ████████"."""
    if not bins:
        return []
    top = max(b["count"] for b in bins) or 1
    return [f"{b['from_tokens']:>9,}-{b['to_tokens']:<9,} {b['count']:>10,} " + "█" * round(b["count"] / top * width)
            for b in bins]


def log2_histogram(values: np.ndarray) -> list[dict]:
    """Counts in power-of-two bins [2^k, 2^(k+1)): a length distribution spanning 1 to 10^6 tokens
    in about 20 bins."""
    if not len(values):
        return []
    k = np.floor(np.log2(np.maximum(values, 1))).astype(np.int64)
    counts = np.bincount(k - k.min())
    return [{"from_tokens": int(2 ** (k.min() + i)), "to_tokens": int(2 ** (k.min() + i + 1)), "count": int(c)}
            for i, c in enumerate(counts)]


def sparkline(values: list[float], width: int = 60) -> str:
    """A one-line bar chart (Unicode eighth blocks), values averaged into ``width`` columns."""
    if not values:
        return ""
    v = np.asarray(values, dtype=float)
    if len(v) > width:
        edges = np.linspace(0, len(v), width + 1).astype(int)
        v = np.array([v[a:b].mean() for a, b in zip(edges[:-1], edges[1:])])
    top = v.max() or 1.0
    bars = " ▁▂▃▄▅▆▇█"
    return "".join(bars[int(round(x / top * 8))] for x in v)
