"""The scenario's workload as ``RequestArrays``, whole or as a stream of chunks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from sim.scenario import Scenario
from sim.workload.arrays import RequestArrays
from sim.workload.max_tokens import with_max_tokens
from sim.workload.synthetic import synthetic_workload
from sim.workload.transform import apply

if TYPE_CHECKING:
    from sim.workload.readers import ReadOptions

# NOTE: the trace readers (and polars, which they parse with: ~0.13 s to import) are imported
# where a trace is read, so a synthetic run never loads them (start-up, issue 14).

# NOTE: a trace file larger than this is streamed into the simulation in chunks, unless a
# window, sample or target rate needs the whole trace first.
STREAM_MIN_BYTES = 256 << 20


def read_options(scenario: Scenario) -> ReadOptions:
    from sim.workload.readers import ReadOptions

    t = scenario.workload.trace
    return ReadOptions(
        format=t.format, hash_block_size=t.hash_block_size, model_filter=t.model_filter, keep_failed=t.keep_failed,
        time_unit=t.time_unit, arrival_column=t.columns.arrival, input_column=t.columns.input,
        output_column=t.columns.output, max_tokens_column=t.columns.max_tokens, spread_grid_s=t.spread_grid_s, seed=scenario.seed,
    )


def _needs_whole(scenario: Scenario) -> bool:
    t = scenario.workload.trace
    return any(v is not None for v in (t.start_s, t.duration_s, t.sample, t.target_rate))


def build_workload(scenario: Scenario) -> RequestArrays:
    """The workload with the max_tokens its clients send (``workload.max_tokens``)."""
    return with_max_tokens(_requests(scenario), scenario.workload.max_tokens)


def _requests(scenario: Scenario) -> RequestArrays:
    w = scenario.workload
    if w.trace is not None:
        from sim.workload.trace import read_trace

        t = w.trace
        arr = read_trace(scenario.resolve_path(t.path), opts=read_options(scenario))
        return apply(arr, f"workload.trace ({t.path})", t.start_s, t.duration_s, t.sample, scenario.seed,
                     None if t.target_rate is not None else t.time_scale, t.target_rate)
    return synthetic_workload(w.synthetic, scenario.seed, scenario.resolve_path)


def should_stream(scenario: Scenario) -> bool:
    t = scenario.workload.trace
    if t is None or _needs_whole(scenario):
        return False
    path = scenario.resolve_path(t.path)
    return path.exists() and path.stat().st_size >= STREAM_MIN_BYTES


def stream_workload(scenario: Scenario, chunk_rows: int = 1_000_000) -> Iterator[RequestArrays]:
    """The trace in sorted chunks (bounded reading memory); a synthetic workload as one chunk."""
    t = scenario.workload.trace
    if t is None or _needs_whole(scenario):
        yield build_workload(scenario)
        return
    from sim.workload.trace import stream_trace

    for chunk in stream_trace(scenario.resolve_path(t.path), read_options(scenario), t.time_scale, chunk_rows):
        yield with_max_tokens(chunk, scenario.workload.max_tokens)


def closed_loop(scenario: Scenario) -> tuple[int | None, float]:
    """(max_concurrency, think_time_s) of a synthetic workload; (None, 0) = open loop."""
    s = scenario.workload.synthetic
    return (s.max_concurrency, s.think_time_s) if s is not None else (None, 0.0)
