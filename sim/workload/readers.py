"""One converter per trace format: a raw ``Batch`` in, a ``RequestArrays`` chunk out.

Why: each public trace names its columns and time unit differently; converters map them onto
ARCHITECTURE.md section 6's schema. Arrival times here are absolute seconds in file order; sorting,
shifting to 0 and rescaling happen once, in ``trace.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sim.errors import UserError
from sim.limits import MAX_TIME_S
from sim.workload.arrays import RequestArrays
from sim.workload.formats import TRACE_FORMATS
from sim.workload.sources import Batch, NumericColumns, arrow_list_lengths, arrow_list_values, shown
from sim.workload.validate import (abort_times, datetimes_s, floats, present, seconds, text_equals, tokens,
                                  truncated_ints)

if TYPE_CHECKING:
    import polars as pl



@dataclass
class ReadOptions:
    """How to read a trace; every field has a scenario key and a ``trace convert`` option."""

    format: str = "auto"
    hash_block_size: int | None = None      # tokens per hash id (default: the format's)
    model_filter: str | None = None          # BurstGPT: keep rows of this Model only
    keep_failed: bool = False                # failed rows (0 output tokens) replayed with 1 token
    time_unit: str = "s"                     # generic: s | ms | us | ns | datetime
    arrival_column: str = "arrival_s"        # generic column names
    input_column: str = "input_tokens"
    output_column: str = "output_tokens"
    max_tokens_column: str | None = None     # generic: the max_tokens each request was sent with
    spread_grid_s: float | None = None       # spread requests inside each grid bucket
    seed: int = 0


@dataclass
class ReadState:
    """Carried across batches: notes for the user, counters, session maps."""

    notes: dict[str, int] = field(default_factory=dict)
    sessions: dict = field(default_factory=dict)
    last_arrival: dict = field(default_factory=dict)

    def note(self, key: str, n: int) -> None:
        if n:
            self.notes[key] = self.notes.get(key, 0) + n


def _null_count(b: Batch, col: str) -> int:
    """Rows of the batch missing ``col`` (either reader's frame)."""
    f = b.frame
    return f.null_count(col) if isinstance(f, NumericColumns) else f[col].null_count()


def _values(b: Batch, col: str) -> list:
    """The column as Python values, None where missing (either reader's frame)."""
    f = b.frame
    return f.values(col) if isinstance(f, NumericColumns) else f[col].to_list()


def _has(b: Batch, col: str) -> bool:
    """Some row of the batch has ``col``."""
    return _null_count(b, col) < b.frame.height


def _id_lists(b: Batch, col: str, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(ids per row, 0 where missing; every id, in row order) of a list column; a null among a
    row's ids is an error naming the line (as ``json``'s reading of the line says it)."""
    s = b.frame[col]
    if isinstance(b.frame, NumericColumns):  # a pyarrow list array, no null among its ids
        return arrow_list_lengths(s), arrow_list_values(s).to_numpy()
    import polars as pl

    lens = s.list.len().fill_null(0).to_numpy()
    nulls = s.list.eval(pl.element().is_null()).list.sum().fill_null(0).to_numpy()
    if nulls.any():  # (explode + drop_nulls below would shift the later rows' ids)
        i = int(np.argmax(nulls > 0))
        raise UserError(f"{b.where(path, i)}: {col} is {shown(s[i].to_list())}, expected a list of integers")
    return lens, (s.explode().drop_nulls().to_numpy() if lens.sum() else np.zeros(0, np.int64))


def hash_lists(batch: Batch, col: str, path: Path, inp: np.ndarray, block: int) -> list[np.ndarray]:
    """Per-row int64 arrays of hash ids; more ids than prompt blocks is an error."""
    lens, flat = _id_lists(batch, col, path)
    too_many = lens > -(-inp // block)
    if too_many.any():
        i = int(np.argmax(too_many))
        raise UserError(f"{batch.where(path, i)}: {col} has {lens[i]} ids but input {inp[i]} tokens fill only "
                        f"{-(-inp[i] // block)} blocks of {block} tokens; set the block size with --hash-block-size "
                        "(workload.trace.hash_block_size)")
    # one view of ``flat`` per row (as ``np.split`` gives them, at a quarter to a third of its cost)
    flat = flat.astype(np.int64)
    ends = np.cumsum(lens)
    return [flat[a:b] for a, b in zip((ends - lens).tolist(), ends.tolist())]


def _session_codes(values: list, state: ReadState) -> np.ndarray:
    codes = state.sessions
    return np.array([-1 if v is None else codes.setdefault(v, len(codes)) for v in values], dtype=np.int64)


def _drop_failed(arr: RequestArrays, out: np.ndarray, opts: ReadOptions, state: ReadState, what: str) -> RequestArrays:
    failed = out == 0
    if not failed.any():
        return arr
    if opts.keep_failed:
        state.note(f"{what}: replayed with 1 output token (keep_failed)", int(failed.sum()))
        return RequestArrays(arr.arrival_s, arr.input_tokens, np.maximum(out, 1), arr.hash_ids, arr.hash_block_size,
                             arr.session_id, arr.priority, arr.measured)
    state.note(f"{what}: left out (set keep_failed to replay them with 1 output token)", int(failed.sum()))
    return arr.take(~failed)


# ---- CSV / Parquet formats --------------------------------------------------------------

def azure(b: Batch, path: Path, o: ReadOptions, st: ReadState) -> RequestArrays:
    return RequestArrays(datetimes_s(b, "TIMESTAMP", path), tokens(b, "ContextTokens", path),
                         tokens(b, "GeneratedTokens", path))


def vidur(b: Batch, path: Path, o: ReadOptions, st: ReadState) -> RequestArrays:
    return RequestArrays(seconds(b, "arrived_at", path), tokens(b, "num_prefill_tokens", path),
                         tokens(b, "num_decode_tokens", path))


def burstgpt(b: Batch, path: Path, o: ReadOptions, st: ReadState) -> RequestArrays:
    keep = None
    if o.model_filter is not None:
        keep = text_equals(b, "Model", o.model_filter)
        b = b.filter(keep)
    t = seconds(b, "Timestamp", path)
    inp = tokens(b, "Request tokens", path)
    out = tokens(b, "Response tokens", path, minimum=0)
    # (noted once every check passed: the general reader converts again a batch the numeric one gave up)
    if keep is not None:
        st.note(f"rows of a Model other than {o.model_filter!r}: left out (model_filter)", int((~keep).sum()))
    arr = RequestArrays(t, inp, out)
    # NOTE: BurstGPT logs failed requests with 0 response tokens (HPMLL/BurstGPT README).
    return _drop_failed(arr, out, o, st, "failed requests (0 response tokens)")


def normalized(b: Batch, path: Path, o: ReadOptions, st: ReadState) -> RequestArrays:
    cols = b.frame.columns
    inp = tokens(b, "input_tokens", path)
    block = o.hash_block_size or 16
    measured = {c: _measured(b.frame[c]) for c in cols if c.startswith("measured_")}
    arrival = seconds(b, "arrival_s", path)
    return RequestArrays(
        arrival, inp, tokens(b, "output_tokens", path),
        hash_ids=hash_lists(b, "hash_ids", path, inp, block) if "hash_ids" in cols else None,
        hash_block_size=block,
        session_id=_ints(b.frame["session_id"], -1) if "session_id" in cols else None,
        priority=_ints(b.frame["priority"], 0) if "priority" in cols else None,
        measured=measured or None,
        max_tokens=tokens(b, "max_tokens", path) if "max_tokens" in cols else None,
        abort_s=abort_times(b, path, arrival) if "abort_s" in cols else None,
    )


def _ints(s: pl.Series, missing: int) -> np.ndarray:
    """An optional integer column as int64; a value that is missing or not an integer: ``missing``."""
    import polars as pl

    return s.cast(pl.Int64, strict=False).fill_null(missing).to_numpy()


def _measured(s: pl.Series):
    import polars as pl

    if isinstance(s.dtype, pl.List):
        return [np.asarray(x if x is not None else [], dtype=np.float64) for x in s.to_list()]
    return s.cast(pl.Float64, strict=False).to_numpy()


def generic(b: Batch, path: Path, o: ReadOptions, st: ReadState) -> RequestArrays:
    t = (datetimes_s(b, o.arrival_column, path) if o.time_unit == "datetime"
         else seconds(b, o.arrival_column, path, o.time_unit))
    return RequestArrays(t, tokens(b, o.input_column, path), tokens(b, o.output_column, path),
                         max_tokens=tokens(b, o.max_tokens_column, path) if o.max_tokens_column else None)


# ---- JSON Lines formats -----------------------------------------------------------------

def mooncake(b: Batch, path: Path, o: ReadOptions, st: ReadState) -> RequestArrays:
    inp = tokens(b, "input_length", path)
    out = tokens(b, "output_length", path)
    block = o.hash_block_size or 512
    sess = _session_codes(_values(b, "session_id"), st) if _has(b, "session_id") else None
    if _null_count(b, "timestamp"):
        t = _delays_to_times(b, path, sess, st)
    else:
        t = seconds(b, "timestamp", path, "ms")
    if sess is not None:  # each session's last turn in this batch, in row order (a later row wins)
        st.last_arrival.update(zip(sess.tolist(), t.tolist()))
    return RequestArrays(
        t, inp, out, hash_ids=hash_lists(b, "hash_ids", path, inp, block) if _has(b, "hash_ids") else None,
        hash_block_size=block, session_id=sess,
        priority=truncated_ints(b, "priority", path, 0) if _has(b, "priority") else None,
    )


def _delays_to_times(b: Batch, path: Path, sess: np.ndarray | None, st: ReadState) -> np.ndarray:
    """AIPerf multi-turn rows give ``delay`` (ms after the session's previous turn), not ``timestamp``.

    NOTE: replayed open-loop: the turn arrives ``delay`` after the previous turn's arrival.
    """
    ts, delay = _values(b, "timestamp"), _values(b, "delay")
    out = np.empty(b.frame.height)
    for i, (t, d) in enumerate(zip(ts, delay)):
        if t is not None:
            if not (np.isfinite(t) and 0 <= t <= MAX_TIME_S * 1e3):
                raise UserError(f"{b.where(path, i)}: column timestamp is {t!r}, expected a time from 0 to "
                                f"{MAX_TIME_S * 1e3:.3g} ms")
            out[i] = t / 1e3
        elif d is None or sess is None or sess[i] < 0 or sess[i] not in st.last_arrival:
            raise UserError(f"{b.where(path, i)}: field timestamp is missing (a row without one needs a delay and "
                            "the session_id of an earlier turn)")
        elif not (np.isfinite(d) and 0 <= d <= MAX_TIME_S * 1e3):
            raise UserError(f"{b.where(path, i)}: column delay is {d!r}, expected a time from 0 to "
                            f"{MAX_TIME_S * 1e3:.3g} ms")
        else:
            out[i] = st.last_arrival[sess[i]] + d / 1e3
        if sess is not None and sess[i] >= 0:
            st.last_arrival[sess[i]] = out[i]
    st.note("turns timed by delay after the previous turn's arrival (open loop)", _null_count(b, "timestamp"))
    return out


def bailian(b: Batch, path: Path, o: ReadOptions, st: ReadState) -> RequestArrays:
    """Qwen Bailian traces: ``chat_id``, ``parent_chat_id`` (-1 for a first turn), ``turn``."""
    inp = tokens(b, "input_length", path)
    present(b, "chat_id", path)
    roots = st.sessions
    sess = np.empty(b.frame.height, dtype=np.int64)
    for i, (c, p) in enumerate(zip(_values(b, "chat_id"), _values(b, "parent_chat_id"))):
        # NOTE: a turn whose parent is not in the trace starts its own session
        root = roots.get(p, c) if p is not None and p >= 0 else c
        roots[c] = root
        sess[i] = int(root)
    block = o.hash_block_size or 16
    return RequestArrays(seconds(b, "timestamp", path), inp, tokens(b, "output_length", path),
                         hash_ids=hash_lists(b, "hash_ids", path, inp, block), hash_block_size=block, session_id=sess)


def aiperf_flatten(obj: dict, where: str) -> dict:
    md, m = obj.get("metadata") or {}, obj.get("metrics") or {}
    if not isinstance(md, dict) or not isinstance(m, dict):
        raise UserError(f"{where}: metadata and metrics must be JSON objects")

    def val(k):
        v = m.get(k)
        return v.get("value") if isinstance(v, dict) else None

    failed = obj.get("error") is not None
    return {
        "request_start_ns": md.get("request_start_ns"),
        "input_sequence_length": val("input_sequence_length") if not failed else val("error_isl"),
        "output_sequence_length": 0 if failed else val("output_sequence_length"),
        "time_to_first_token_ms": val("time_to_first_token"),
        "request_latency_ms": val("request_latency"),
        "session": md.get("x_correlation_id"),
    }


def aiperf(b: Batch, path: Path, o: ReadOptions, st: ReadState) -> RequestArrays:
    """AIPerf ``profile_export.jsonl``: one measured request per line, times in ns and ms."""
    out = tokens(b, "output_sequence_length", path, minimum=0)
    arr = RequestArrays(
        seconds(b, "request_start_ns", path, "ns"), tokens(b, "input_sequence_length", path), out,
        session_id=_session_codes(_values(b, "session"), st),
        measured={"measured_ttft_s": floats(b, "time_to_first_token_ms") / 1e3,
                  "measured_e2el_s": floats(b, "request_latency_ms") / 1e3},
    )
    # NOTE: a record with an error has no output; like vLLM bench we do not replay it by default.
    return _drop_failed(arr, out, o, st, "failed requests (error records)")


def converter(fmt: str):
    """The converter of format ``fmt`` (its registry entry's ``reader``, sim/workload/formats.py)."""
    name = TRACE_FORMATS[fmt].reader
    return None if name is None else globals()[name]


def flattener(fmt: str):
    """The function flattening a ``fmt`` row's nested objects, or None."""
    name = TRACE_FORMATS[fmt].flatten
    return None if name is None else globals()[name]


OPTIONAL_NORMALIZED = ["hash_ids", "session_id", "priority", "max_tokens", "abort_s"]
