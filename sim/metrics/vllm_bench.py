"""Latency and throughput metrics with vLLM bench definitions (ARCHITECTURE.md section 1).

TTFT = first token - arrival; TPOT = (e2e - TTFT) / (output - 1) for requests with more than
one output token; ITL = every gap between consecutive tokens of a request, pooled; E2EL =
finish - arrival; queue = first scheduled - arrival. Percentiles use numpy's linear method.
ITL comes from the step log: each decode step gives each of its sequences one gap equal to
the step's duration, so it is stored as run-length pieces (a fast-forwarded row of k steps is
one piece of k evenly spaced values, each once per sequence), never a list per token or step.
"""

from __future__ import annotations

import math

import numpy as np

PCTS = (50, 90, 99)


STAT_KEYS = ("mean", "median", "std", "p50", "p90", "p99")


class RunLengthSamples:
    """A multiset of gaps held as run-length pieces, never one entry per engine step.

    Piece i holds the values ``first_s[i] + span_s[i] * j`` for ``j0[i] <= j < j1[i]`` (computed
    exactly so, in float64, as the per-step expansion did), each ``count[i]`` times; a point is a
    piece with one step. A negative count removes a value the other pieces hold (an ITL
    adjustment). Memory and time grow with the pieces (step rows), not with the steps in them.
    Along a piece the values are monotone in j (IEEE rounding is monotone), which is what the
    exact order statistics below rely on."""

    __slots__ = ("first_s", "span_s", "j0", "j1", "count")

    def __init__(self, first_s, span_s, j0, j1, count):
        self.first_s = np.asarray(first_s, np.float64)
        self.span_s = np.asarray(span_s, np.float64)
        self.j0 = np.asarray(j0, np.int64)
        self.j1 = np.asarray(j1, np.int64)
        self.count = np.asarray(count, np.int64)

    @classmethod
    def points(cls, values, counts) -> "RunLengthSamples":
        """``counts[i]`` copies of ``values[i]``."""
        values = np.asarray(values, np.float64)
        n = len(values)
        return cls(values, np.zeros(n), np.zeros(n, np.int64), np.ones(n, np.int64), counts)

    def _take(self, mask) -> "RunLengthSamples":
        return RunLengthSamples(self.first_s[mask], self.span_s[mask], self.j0[mask], self.j1[mask], self.count[mask])

    def _ends(self) -> tuple[np.ndarray, np.ndarray]:
        a = self.first_s + self.span_s * self.j0
        b = self.first_s + self.span_s * (self.j1 - 1)
        return np.minimum(a, b), np.maximum(a, b)

    def _weights(self) -> np.ndarray:
        return self.count * (self.j1 - self.j0)

    @property
    def num_samples(self) -> int:
        return int(self._weights().sum())

    def sum_s(self) -> float:
        """Sum of all values."""
        return float(np.sum(self._sum_terms()))

    def _sum_terms(self) -> np.ndarray:
        """Per piece, the sum of its values, ``count`` times."""
        return self.count * self._line_sums()

    def _line_sums(self) -> np.ndarray:
        """Per piece, the sum of its values once (closed form: L first + span (j0 + ... + j1 - 1))."""
        length = (self.j1 - self.j0).astype(np.float64)
        s1 = (self.j0 + self.j1 - 1) * length / 2.0
        return length * self.first_s + self.span_s * s1

    def _sq_dev_terms(self, mean: float) -> np.ndarray:
        """Per piece, the sum of (value - mean)^2: L d^2 + 2 d span S1 + span^2 S2 (d = first -
        mean, S1 = sum of j, S2 = sum of j^2 over the piece)."""
        j0, j1 = self.j0.astype(np.float64), self.j1.astype(np.float64)
        length = j1 - j0
        s1 = (j0 + j1 - 1) * length / 2.0
        s2 = ((j1 - 1) * j1 * (2 * j1 - 1) - (j0 - 1) * j0 * (2 * j0 - 1)) / 6.0
        d = self.first_s - mean
        return self.count * (length * d * d + 2.0 * d * self.span_s * s1 + self.span_s ** 2 * s2)

    def values_at(self, ranks) -> dict[int, float]:
        """{rank: the value at that 0-based rank of the sorted multiset}, exactly (no expansion:
        pieces whose range lies wholly below or above a rank are dropped, the rest clipped to
        a window halved until few values are left to sort: ``_select``)."""
        out: dict[int, float] = {}
        ranks = sorted(set(int(r) for r in ranks))
        groups: list[list[int]] = []
        for r in ranks:
            if groups and r - groups[-1][-1] <= 1:
                groups[-1].append(r)
            else:
                groups.append([r])
        live = self if (self.count != 0).all() else self._take(self.count != 0)
        first = _Sorted(live)
        for g in groups:
            out.update(_select(live, g, first))
        return out


class _Sorted:
    """A piece set's low and high ends sorted once, with their running weights (shared by
    every rank's first pass; the ends themselves are recomputed there, not kept)."""

    def __init__(self, p: RunLengthSamples):
        lo, hi = p._ends()
        w = p._weights()
        self.lo_sorted, self.lo_cum = _cum_order(lo, w)
        del lo
        self.hi_sorted, self.hi_cum = _cum_order(hi, w)


def _cum_order(keys: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The keys sorted (negative weights first among equal keys) and the running maximum of
    the cumulative weight in that order."""
    order = np.lexsort((w, keys)) if (w < 0).any() else np.argsort(keys, kind="stable")
    return keys[order], np.maximum.accumulate(np.cumsum(w[order]))


def _first_reaching(sorted_keys, cum, target: int) -> float:
    """The key at which the cumulative weight (in key order) first reaches ``target``."""
    return float(sorted_keys[np.searchsorted(cum, target)])


# A piece set with at most this many values (beyond one per piece) is expanded and sorted.
_EXPAND_MAX = 4096


def _select(p: RunLengthSamples, ranks: list[int], pre: _Sorted | None) -> dict[int, float]:
    """Values at consecutive ``ranks``. Bounds: count(<= x) <= W_lo(x) (weight of pieces whose
    low end is <= x) and >= W_hi(x) (whose high end is <= x), so the value at rank r lies in
    [first low end reaching r + 1, first high end reaching r + 1]; then ``_select_in``."""
    r_a, r_b = ranks[0], ranks[-1]
    if pre is not None:
        x_lo = _first_reaching(pre.lo_sorted, pre.lo_cum, r_a + 1)
        x_hi = _first_reaching(pre.hi_sorted, pre.hi_cum, r_b + 1)
    else:
        lo, hi = p._ends()
        w = p._weights()
        x_lo = _first_reaching(*_cum_order(lo, w), r_a + 1)
        x_hi = _first_reaching(*_cum_order(hi, w), r_b + 1)
        del lo, hi, w
    return _select_in(p, ranks, _key(x_lo), _key(x_hi), 0)


def _select_in(p: RunLengthSamples, ranks: list[int], k_lo: int, k_hi: int, below: int) -> dict[int, float]:
    """Values at ``ranks``, which lie between the order keys ``k_lo`` and ``k_hi`` (``below``:
    the values of the multiset left out below ``p``). Every piece is first clipped to the steps
    whose values lie in the window (``_clip``: the values below counted, those above dropped);
    then, until few values are left to sort (``_expanded_select``), each pass counts the
    values at or below the window's middle order key (``_count_le``, exact) and cuts the
    pieces to the half holding the ranks (``_cut``), or splits the ranks between the halves.
    The pieces never outnumber those given, and the keys are integers, so the window shrinks
    every pass: at most 64 passes.
    Cutting each overlapping piece into 8 a pass instead held 1.9M pieces (+160 MB) for the
    median of a 1M-request run with ten times longer answers (bench/README.md, "Long answers:
    the summary's peak")."""
    k_lo, k_hi = _valued(k_lo), _valued(k_hi)
    p, under = _clip(p, _value(k_lo), _value(k_hi))
    below += under
    while True:
        lo, hi = p._ends()
        length = p.j1 - p.j0
        varying = (length > 1) & (lo != hi)
        del lo, hi
        if int(length[varying].sum()) <= len(length) + _EXPAND_MAX:
            return _expanded_select(p, varying, [r - below for r in ranks], ranks)
        del length, varying
        k_mid = _middle_key(k_lo, k_hi)
        n_le = _count_le(p, _value(k_mid))
        at_or_below = below + int(np.sum(p.count * n_le))
        left = [r for r in ranks if r < at_or_below]  # value at r <= the middle
        right = [r for r in ranks if r >= at_or_below]
        if left and right:
            out = _select_in(p, left, k_lo, k_mid, below)
            out.update(_select_in(p, right, _next_key(k_mid), k_hi, below))
            return out
        p = _cut(p, n_le, at_or_below=bool(left))
        if right:
            below, k_lo = at_or_below, _next_key(k_mid)
        else:
            k_hi = k_mid


def _cut(p: RunLengthSamples, n_le: np.ndarray, at_or_below: bool) -> RunLengthSamples:
    """Each piece cut to its ``n_le`` values at or below a value (``at_or_below``), or to
    the others; pieces left with none dropped."""
    rising = p.span_s >= 0
    if at_or_below:
        j0, j1 = np.where(rising, p.j0, p.j1 - n_le), np.where(rising, p.j0 + n_le, p.j1)
    else:
        j0, j1 = np.where(rising, p.j0 + n_le, p.j0), np.where(rising, p.j1, p.j1 - n_le)
    keep = j1 > j0
    return RunLengthSamples(p.first_s[keep], p.span_s[keep], j0[keep], j1[keep], p.count[keep])


def _clip(p: RunLengthSamples, x_lo: float, x_hi: float) -> tuple[RunLengthSamples, int]:
    """Each piece cut to its steps whose values lie in [x_lo, x_hi] (the values being monotone
    along a piece, one range of j), pieces left with none dropped; and the weight of the values
    below ``x_lo``."""
    n_lt = _count_le(p, x_lo, strict=True)
    n_le = _count_le(p, x_hi)
    under = int(np.sum(p.count * n_lt))
    rising = p.span_s >= 0
    j0 = np.where(rising, p.j0 + n_lt, p.j1 - n_le)
    j1 = np.where(rising, p.j0 + n_le, p.j1 - n_lt)
    keep = j1 > j0
    return RunLengthSamples(p.first_s[keep], p.span_s[keep], j0[keep], j1[keep], p.count[keep]), under


_SIGN = 1 << 63
_NEG_ZERO_KEY, _POS_ZERO_KEY = _SIGN - 1, _SIGN  # -0.0's bits as an order key; +0.0's (``_order_key``)


def _key(x: float) -> int:
    """``_order_key`` of one float, as a Python int."""
    return int(_order_key(np.array([x], np.float64))[0])


def _value(k: int) -> float:
    """The float whose order key is ``k`` (``_order_key``'s inverse)."""
    y = np.array([k ^ _SIGN], np.uint64).view(np.int64)
    return float((y ^ ((y >> 63) & 0x7FFF_FFFF_FFFF_FFFF)).view(np.float64)[0])


def _valued(k: int) -> int:
    """``k``, or +0.0's key for -0.0's (which ``_order_key`` gives no value, and a window
    ending there would hold +0.0 on both sides)."""
    return _POS_ZERO_KEY if k == _NEG_ZERO_KEY else k


def _middle_key(k_lo: int, k_hi: int) -> int:
    """An order key in [k_lo, k_hi) near their middle, never -0.0's (which ``_order_key`` gives
    no value: a window ending there would hold +0.0 on both sides)."""
    k = k_lo + (k_hi - k_lo) // 2
    if k == _NEG_ZERO_KEY:
        k = _POS_ZERO_KEY if _POS_ZERO_KEY < k_hi else k - 1
    return k


def _next_key(k: int) -> int:
    """The next order key above ``k`` that a value has (skipping -0.0's)."""
    return _POS_ZERO_KEY if k + 1 == _NEG_ZERO_KEY else k + 1


def _expanded_select(p: RunLengthSamples, varying: np.ndarray, local: list[int], ranks: list[int]) -> dict[int, float]:
    """Expand the few varying pieces per step (constant ones stay one weighted value) and read
    the ranks off the sorted values (negative weights first among equal values, so the
    running count never passes a rank early)."""
    length = p.j1 - p.j0
    n_each = np.where(varying, length, 1)
    idx = np.repeat(np.arange(len(length)), n_each)
    j = p.j0[idx] + (np.arange(int(n_each.sum())) - np.repeat(np.cumsum(n_each) - n_each, n_each))
    j = np.where(varying[idx], j, p.j0[idx])
    vals = p.first_s[idx] + p.span_s[idx] * j
    w = np.where(varying[idx], p.count[idx], p.count[idx] * length[idx])
    sorted_vals, cum = _cum_order(vals, w)
    return {r: float(sorted_vals[np.searchsorted(cum, t + 1)]) for r, t in zip(ranks, local)}


def _percentile(n: int, p: float, at: dict[int, float]) -> float:
    """numpy's linear method on the expanded multiset: the value at rank p/100 (n - 1),
    interpolated between the two ranks around it."""
    pos = p / 100.0 * (n - 1)
    lo = int(np.floor(pos))
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    a = at[lo]
    return a if frac == 0 else a + (at[hi] - a) * frac


def _ranks(n: int, pos: float) -> tuple[int, int]:
    lo = int(np.floor(pos))
    return lo, min(lo + 1, n - 1)


def run_length_stats(samples: RunLengthSamples, tail: bool = False) -> dict[str, float]:
    """mean/median/std/p50/p90/p99 of the multiset, as numpy's linear method gives on the
    expanded array (percentiles exact; mean and std from closed forms per piece). ``tail``
    adds ``p99.9`` (rank 0.999 (n - 1), interpolated) and ``max``."""
    return pieces_stats(PieceSets(lambda: iter((samples,)), len(samples.first_s)), tail)


class PieceSets:
    """Piece sets read afresh at each call (``sets()``: a fresh iterator; ``pieces_stats`` reads
    them three times, one set in memory at a time), and at least as many pieces as they hold
    (``max_pieces``: the size of the per-piece arrays allocated before the first read).
    ``sum_extra_s``: seconds to add to the values' sum, which ``sets`` may set as it reads
    them (``itl_pieces``: the bend of fast-forwarded rows, ``step_bend_s``)."""

    __slots__ = ("sets", "max_pieces", "sum_extra_s")

    def __init__(self, sets, max_pieces: int):
        self.sets, self.max_pieces = sets, max_pieces
        self.sum_extra_s = 0.0

    def __call__(self):
        return self.sets()


def pieces_stats(pieces: PieceSets, tail: bool = False) -> dict[str, float]:
    """``run_length_stats`` of the union of the piece sets that ``pieces()`` yields (a fresh
    iterator each call: they are read three times, one set in memory at a time, so a run's
    step log is summarised from disk in bounded memory). Also gives ``n``, the sample count.

    Mean and std are ``np.sum`` over one array of per-piece terms in the pieces' order (the
    same bits as summing the concatenated pieces); percentiles are exact order statistics:
    a histogram of the pieces' ends brackets each rank's value (``_EndHistogram``), then only
    the pieces that reach into the bracket are kept and searched (``_select_in``). The sets'
    ``sum_extra_s``, known once pass 1 has read them, is added to the values' sum before the
    mean is taken.
    Pass 1: the sample count, each piece's sum terms and the range of the pieces' ends; pass
    2: each piece's squared deviations from the mean and the histograms of the ends; pass 3:
    the pieces in each rank's bracket (``_values_at``)."""
    terms = np.empty(pieces.max_pieces)
    n, size, ends = 0, 0, _EndHistogram()
    for p in pieces():
        w = p._weights()
        n += int(w.sum())
        t = p._sum_terms()
        terms[size:size + len(t)] = t
        size += len(t)
        ends.add_range(p, w)
    terms = terms[:size]  # (a view: np.sum reads the same contiguous values as over a copy)
    keys = ("p99.9", "max") if tail else ()
    if n == 0:
        return {"n": 0, **{k: float("nan") for k in (*STAT_KEYS, *keys)}}
    ranks = [r for p in PCTS for r in _ranks(n, p / 100.0 * (n - 1))]
    if tail:
        ranks += [*_ranks(n, 0.999 * (n - 1)), n - 1]
    mean = (float(np.sum(terms)) + pieces.sum_extra_s) / n
    ends.open_bins()
    size = 0
    for p in pieces():
        t = p._sq_dev_terms(mean)
        terms[size:size + len(t)] = t
        size += len(t)
        ends.add_counts(p)
    std = float(np.sqrt(max(float(np.sum(terms)) / n, 0.0)))
    del terms
    at = _values_at(pieces, ranks, ends)
    out = {"n": n, "mean": mean, "std": std, "median": _percentile(n, 50, at)}
    out.update({f"p{p}": _percentile(n, p, at) for p in PCTS})
    if tail:
        pos = 0.999 * (n - 1)
        lo, hi = _ranks(n, pos)
        out["p99.9"] = at[lo] + (at[hi] - at[lo]) * (pos - lo)
        out["max"] = at[n - 1]
    return out


_BINS = 1 << 20  # histogram bins over the range of the pieces' ends (8 MB each for low and high ends)


def _order_key(v: np.ndarray) -> np.ndarray:
    """float64 -> uint64 in the same order (-0.0 taken as +0.0; no NaN here)."""
    b = (v + 0.0).view(np.int64)
    return (b ^ ((b >> 63) & 0x7FFF_FFFF_FFFF_FFFF)).view(np.uint64) ^ np.uint64(1 << 63)


def _values_at(pieces, ranks, ends: "_EndHistogram") -> dict[int, float]:
    """{rank: value at that 0-based rank of the multiset}, exactly (``RunLengthSamples.values_at``)
    over every piece set ``pieces()`` yields (``ends``: their histogram, filled), holding at
    most one set and the pieces that reach into a rank's bracket."""
    groups: list[list[int]] = []
    for r in sorted(set(int(r) for r in ranks)):
        if groups and r - groups[-1][-1] <= 1:
            groups[-1].append(r)
        else:
            groups.append([r])
    windows = ends.brackets(groups)
    below = [0] * len(groups)
    kept: list[list[RunLengthSamples]] = [[] for _ in groups]
    for p in pieces():
        p = p if (p.count != 0).all() else p._take(p.count != 0)
        lo, hi = p._ends()
        klo, khi, w = _order_key(lo), _order_key(hi), p._weights()
        for i, (x_lo, x_hi) in enumerate(windows):
            under = khi < x_lo
            below[i] += int(w[under].sum())
            keep = ~under & (klo <= x_hi)
            if keep.any():
                kept[i].append(p._take(keep))
    out: dict[int, float] = {}
    for g, b, parts, (x_lo, x_hi) in zip(groups, below, kept, windows):
        sub = RunLengthSamples(*(np.concatenate([getattr(q, f) for q in parts]) for f in RunLengthSamples.__slots__))
        # the histogram's bracket is the first window: the pieces' own ends bound their ranks
        # far more loosely when many long pieces overlap it
        local = _select_in(sub, [r - b for r in g], int(x_lo), int(x_hi), 0)
        out.update({r: local[r - b] for r in g})
    return out


class _EndHistogram:
    """Histograms of the pieces' low and high ends (as order keys), from which ``brackets`` reads,
    per group of consecutive ranks, (low, high) order keys between which their values lie.
    A piece's values lie between its ends, so count(<= x) <= the positive weight of pieces
    whose low end is <= x, and >= the positive weight of those whose high end is <= x less
    every removal (negative counts: points); read at the edges of histogram bins.
    Filled in two passes over the piece sets: ``add_range`` (the ends' range), ``open_bins``,
    then ``add_counts``."""

    def __init__(self):
        self.k_min, self.k_max, self.num_pieces, self.removed = None, None, 0, 0

    def add_range(self, p: RunLengthSamples, w: np.ndarray) -> None:
        self.num_pieces += len(p.first_s)
        if len(p.first_s):
            lo, hi = p._ends()
            a, b = _order_key(lo).min(), _order_key(hi).max()
            self.k_min = a if self.k_min is None else min(self.k_min, a)
            self.k_max = b if self.k_max is None else max(self.k_max, b)
        self.removed -= int(w[w < 0].sum())

    def open_bins(self) -> None:
        # about 4 bins a piece, so a small run does not pay for a million bins (any count is
        # exact: fewer bins only widen the brackets)
        self.bins = bins = min(_BINS, max(1 << 10, 1 << (4 * self.num_pieces).bit_length()))
        self.shift = max(int(self.k_max - self.k_min).bit_length() - bins.bit_length() + 1, 0)
        self.h_lo, self.h_hi = np.zeros(bins), np.zeros(bins)

    def add_counts(self, p: RunLengthSamples) -> None:
        lo, hi = p._ends()
        w = p._weights()
        pos = np.where(w > 0, w, 0).astype(np.float64)  # exact: integers below 2**53
        k_min, shift, bins = self.k_min, np.uint64(self.shift), self.bins
        self.h_lo += np.bincount(((_order_key(lo) - k_min) >> shift).astype(np.int64), pos, bins)
        self.h_hi += np.bincount(((_order_key(hi) - k_min) >> shift).astype(np.int64), pos, bins)

    def brackets(self, groups: list[list[int]]) -> list[tuple[np.uint64, np.uint64]]:
        c_lo, c_hi = np.cumsum(self.h_lo), np.cumsum(self.h_hi)
        k_min, k_max, shift, bins = self.k_min, self.k_max, self.shift, self.bins
        out = []
        for g in groups:
            b_lo = int(np.searchsorted(c_lo, g[0] + 1))
            b_hi = int(np.searchsorted(c_hi, g[-1] + 1 + self.removed))
            x_lo = k_min + np.uint64(b_lo << shift)
            x_hi = k_max if b_hi >= bins else min(k_max, k_min + np.uint64(((b_hi + 1) << shift) - 1))
            out.append((x_lo, x_hi))
        return out


def plain_stats(values: np.ndarray) -> dict[str, float]:
    """mean/median/std/p50/p90/p99 of the values that are not NaN: ``np.median`` and
    ``np.percentile``'s (linear method) results bit for bit, from one partition, without the
    numpy.ma import their checks make (~0.01 s of a run's start-up)."""
    values = values[~np.isnan(values)]
    n = len(values)
    if n == 0:
        return {k: float("nan") for k in ("mean", "median", "std", "p50", "p90", "p99")}
    pos = {p: (n - 1) * (p / 100) for p in PCTS}   # numpy's linear virtual index (n - 1) q
    ranks = {(n - 1) // 2, n // 2} | {r for x in pos.values() for r in _np_neighbours(n, x)}
    part = np.partition(values, sorted(ranks))
    out = {"mean": float(values.mean()), "median": _middle(part), "std": float(values.std())}
    out.update({f"p{p}": _np_lerp(n, x, part) for p, x in pos.items()})
    return out


def median(values: np.ndarray) -> float:
    """``float(np.median(values))`` of float values, bit for bit (the middle value, or the middle
    two's sum halved; NaN when empty or any value is NaN), without the numpy.ma import its NaN
    check makes."""
    values = np.asarray(values, dtype=np.float64)
    n = len(values)
    if n == 0 or np.isnan(values).any():
        return float("nan")
    return _middle(np.partition(values, [(n - 1) // 2, n // 2]))


def _middle(part: np.ndarray) -> float:
    """``np.median`` of values partitioned at their middle rank(s) (n - 1) // 2 and n // 2: the
    middle value, or the middle two's sum halved."""
    lo, hi = (len(part) - 1) // 2, len(part) // 2
    return float(part[hi]) if lo == hi else float((part[lo] + part[hi]) / 2)


def _np_neighbours(n: int, x: float) -> tuple[int, int]:
    """The ranks ``np.percentile`` interpolates between at virtual index ``x`` (the last value
    twice at or past the end)."""
    if x >= n - 1:
        return n - 1, n - 1
    lo = math.floor(x)
    return lo, lo + 1


def _np_lerp(n: int, x: float, part: np.ndarray) -> float:
    """numpy's ``_lerp`` between the neighbours of ``x`` in the partitioned values: a + (b - a) t,
    or b - (b - a)(1 - t) when t >= 0.5; t is x less the lower rank (-1 past the end)."""
    lo, hi = _np_neighbours(n, x)
    a, b = float(part[lo]), float(part[hi])
    t = x - (lo if x < n - 1 else -1)
    return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t


# the step-log columns the ITL pieces are read from
ITL_STEP_COLUMNS = ("num_steps", "decode_tokens", "multi_step", "first_step_duration_s", "last_step_duration_s")
# ... and those ``step_bend_s`` reads
BEND_STEP_COLUMNS = (*ITL_STEP_COLUMNS, "duration_s")


def itl_samples(steps: dict[str, np.ndarray], resume_gaps_s: list[float],
                adjust: list[tuple[float, float]] = ()) -> RunLengthSamples:
    """The pooled inter-token gaps: each decode step's duration once per decode sequence in it.

    A fast-forwarded row of k steps holds steps evenly spaced from ``first_step_duration_s`` to
    ``last_step_duration_s``: one piece of k values (``first + span j``), never expanded. Gaps
    spanning a preemption, and those of multi-step blocks (tokens released at a block's end: one
    gap per sequence per block), are added from the schedulers' records.
    """
    points, old = _point_pieces(resume_gaps_s, adjust)
    parts = [step_pieces(steps), points]
    cols = []
    for f in RunLengthSamples.__slots__:  # one field at a time: the step-row-sized copies do not pile up
        cols.append(np.concatenate([getattr(part, f) for part in parts]))
        for part in parts:
            setattr(part, f, None)
    out = RunLengthSamples(*cols)
    if len(old):
        _check_removals(lambda: iter((out,)), old)
    return out


def itl_pieces(read_rows, num_rows: int, resume_gaps_s: list[float], adjust: list[tuple[float, float]] = (),
               chunk_rows: int = 1 << 18, with_bend: bool = False):
    """``itl_samples`` as piece sets for ``pieces_stats``: a callable yielding the pieces of
    each ``chunk_rows`` step rows (``read_rows(start, stop)``: {column: array}), then the
    points; the same pieces in the same order, never all in memory. ``with_bend``: the rows
    have ``duration_s`` too (``BEND_STEP_COLUMNS``), and the first whole read of the sets
    leaves the whole log's ``step_bend_s`` in their ``sum_extra_s`` (the chunks' bends summed
    in order: one pass over the log less than reading it again for them); later reads do not
    bend the pieces again (1M requests, chunked 512, 3.6M step rows: ~0.09 s a read).
    Keeping the pieces between reads instead would have saved ~0.4 s there for 137 MB more
    peak memory (bench/README.md, "Reports, the summary, and the targets against a faster
    machine")."""
    points, old = _point_pieces(resume_gaps_s, adjust)
    bent = not with_bend  # the bend is summed (or not asked for)

    def sets():
        nonlocal bent
        bend = 0.0
        for start in range(0, num_rows, chunk_rows):
            rows = read_rows(start, min(start + chunk_rows, num_rows))
            p = step_pieces(rows)
            if not bent:
                bend += _bend_s(p, rows)
            yield p
        if not bent:
            pieces.sum_extra_s = bend
            bent = True
        yield points
    pieces = PieceSets(sets, num_rows + len(points.first_s))  # (a row holds at most one piece)
    if len(old):
        _check_removals(pieces, old)
    return pieces


def _with_decodes(steps) -> np.ndarray:
    """The step rows that hold ITL pieces: rows with decode tokens, outside multi-step blocks
    (whose gaps are listed per request, ``resume_gaps_s``)."""
    has = steps["decode_tokens"] > 0
    if "multi_step" in steps:
        has &= steps["multi_step"] == 0
    return has


def step_pieces(steps) -> RunLengthSamples:
    """The ITL pieces of step rows: one per row of ``_with_decodes``, in row order."""
    has = _with_decodes(steps)
    k, first, last = steps["num_steps"][has], steps["first_step_duration_s"][has], steps["last_step_duration_s"][has]
    seqs = steps["decode_tokens"][has] // np.maximum(k, 1)
    span = np.where(k > 1, (last - first) / np.maximum(k - 1, 1), 0.0)
    return RunLengthSamples(first, span, np.zeros(len(k), np.int64), k, seqs)


def step_bend_s(steps) -> float:
    """The seconds that the straight pieces of fast-forwarded rows leave out of their steps.

    A run's steps follow the cost model's curve (``RunCost.curve_s``, within ``RUN_REL_TOL``
    of a step: sim/cost/runs.py), and the replica's clock follows their exact sum; the step
    log keeps the first and last step only, so a row's piece is the straight line between
    them. Its ``duration_s`` is the exact sum. Per row of k > 1 steps: decode sequences x
    (duration_s - the sum of its ``step_pieces`` piece). Added to the pooled sum, it makes the
    mean ITL the mean of the gaps the requests saw (their last token - first token, summed,
    over their gaps); the order statistics stay the pieces'."""
    return _bend_s(step_pieces(steps), steps)


def _bend_s(p: RunLengthSamples, steps) -> float:
    """``step_bend_s`` of step rows whose ``step_pieces`` are ``p``."""
    run = p.j1 > 1
    duration = steps["duration_s"][_with_decodes(steps)]
    return float(np.sum((p.count * (duration - p._line_sums()))[run]))


def _point_pieces(resume_gaps_s, adjust) -> tuple[RunLengthSamples, np.ndarray]:
    """The gaps listed one by one, and the removed ones (``old``)."""
    points_s, points_n = [np.asarray(resume_gaps_s, np.float64)], [np.ones(len(resume_gaps_s), np.int64)]
    old = np.zeros(0)
    if len(adjust):
        # A request that joined decoding with its KV computed elsewhere (swap-in, KV transfer)
        # waited before its first decode step: that token's gap is the wait plus the step, so
        # one sample of the step's duration is replaced by the longer gap. A new gap of nan
        # removes the sample: that step emitted the request's first token (disaggregated,
        # first token from decode), part of TTFT, not an inter-token gap.
        old, new = np.asarray(adjust, dtype=np.float64).T
        new = new[~np.isnan(new)]
        points_s += [old, new]
        points_n += [-np.ones(len(old), np.int64), np.ones(len(new), np.int64)]
    pts_s, pts_n = np.concatenate(points_s), np.concatenate(points_n)
    n0 = len(pts_s)
    return RunLengthSamples(pts_s, np.zeros(n0), np.zeros(n0, np.int64), np.ones(n0, np.int64), pts_n), old


def _check_removals(pieces, old: np.ndarray) -> None:
    """Every removed gap must be one the step log holds: the net count of each removed value
    stays >= 0. A piece's first value is its ``first_s``, which covers the usual case (the
    removed gap is the first step of the row the request joined); any other value is counted
    exactly."""
    vals, times = np.unique(old, return_counts=True)
    held = np.zeros(len(vals), np.int64)
    for p in pieces():
        pos = (p.count > 0) & (p.j0 == 0)
        f, c = p.first_s[pos], p.count[pos]
        i = np.minimum(np.searchsorted(vals, f), len(vals) - 1)
        match = vals[i] == f
        np.add.at(held, i[match], c[match])
    for v in vals[held < times].tolist():
        net = sum(int((p.count * (_count_le(p, v) - _count_le(p, v, strict=True))).sum()) for p in pieces())
        if net < 0:
            raise AssertionError("ITL adjustment removed a gap the step log does not hold")


def _count_le(p: RunLengthSamples, x: float, strict: bool = False) -> np.ndarray:
    """Per piece, how many of its values are <= x (< x with ``strict``): a binary search over
    j, the values being monotone along a piece. It starts from a few steps around where the
    straight line ``first + span j`` meets x (the rounded values stay within a few ulps of
    it), checked to hold the flip, else from the whole piece: a handful of passes, not one per
    halving of the piece (the rank search calls it on every piece overlapping a window)."""
    def below(j):
        v = p.first_s + p.span_s * j
        return v < x if strict else v <= x

    rising = p.span_s >= 0

    def go_right(j):  # the flip lies above step j (j0 <= j < j1)
        t = below(j)
        return np.where(rising, t, ~t)

    with np.errstate(divide="ignore", invalid="ignore"):
        cross = (x - p.first_s) / p.span_s
    cross = np.where(np.isnan(cross), p.j0, np.clip(cross, p.j0 - 4, p.j1 + 4))
    guess = np.floor(cross).astype(np.int64)
    lo, hi = np.clip(guess - 2, p.j0, p.j1), np.clip(guess + 3, p.j0, p.j1)
    held = (((lo == p.j0) | go_right(np.maximum(lo - 1, p.j0)))
            & ((hi == p.j1) | ~go_right(np.minimum(hi, p.j1 - 1))))
    lo, hi = np.where(held, lo, p.j0), np.where(held, hi, p.j1)  # first j where the test flips, in [lo, hi]
    while (lo < hi).any():
        mid = (lo + hi) // 2
        t = below(np.minimum(mid, p.j1 - 1))
        right = np.where(rising, t, ~t) & (lo < hi)
        stay = (lo < hi) & ~right
        lo = np.where(right, mid + 1, lo)
        hi = np.where(stay, mid, hi)
    return np.where(rising, lo - p.j0, p.j1 - lo)


REQUEST_METRICS = ("ttft_s", "tpot_s", "e2el_s", "queue_s")


def request_metric(name: str, col, ok: np.ndarray) -> np.ndarray:
    """One per-request metric of ``REQUEST_METRICS`` in seconds (nan where undefined), from
    ``col(field)`` (a request column) and ``ok`` (completed): one column at a time, so a
    summary of millions of requests holds a few columns, not all of them."""
    if name == "queue_s":
        return col("first_scheduled_s") - col("arrival_s")
    if name == "ttft_s":
        return np.where(ok, col("first_token_s") - col("arrival_s"), np.nan)
    if name == "e2el_s":
        return np.where(ok, col("finish_s") - col("arrival_s"), np.nan)
    if name == "tpot_s":
        e2el, ttft = request_metric("e2el_s", col, ok), request_metric("ttft_s", col, ok)
        out = col("output_tokens")
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(ok & (out > 1), (e2el - ttft) / (out - 1), np.nan)
    raise KeyError(name)


def request_metrics(req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-request TTFT, TPOT, E2EL and queue time in seconds (nan where undefined)."""
    ok = req["status"] == "completed"
    return {m: request_metric(m, req.__getitem__, ok) for m in REQUEST_METRICS}


def goodput_mask(m: dict[str, np.ndarray], ok: np.ndarray, slo) -> np.ndarray:
    """Completed requests meeting every SLO given (vLLM bench ``--goodput``)."""
    good = ok.copy()
    if slo.ttft_ms is not None:
        good &= m["ttft_s"] * 1e3 <= slo.ttft_ms
    if slo.tpot_ms is not None:
        good &= ~(m["tpot_s"] * 1e3 > slo.tpot_ms)  # single-token requests have no TPOT
    if slo.e2el_ms is not None:
        good &= m["e2el_s"] * 1e3 <= slo.e2el_ms
    return good
