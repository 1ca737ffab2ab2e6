"""The trace formats, registered once: each format's name, file kind, columns, reader, whether
the numeric reader may read it, and the unit of its timestamps.

Why: the scenario's ``workload.trace.format`` choices, ``trace inspect|convert --format``,
format detection, the readers and ``trace convert``'s ``source_time_unit`` all read this table
instead of keeping their own list of names. Adding a format is one entry here and its converter
in ``sim/workload/readers.py``. No heavy imports: the scenario and the CLI read it at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass

# JSON Lines field types (sources.jsonl_batches): float, text, list of integers
F, S, IDS = "f64", "str", "ids"
# ``time_unit`` of a generic trace: numbers in these units, or date-time text
TIME_UNITS = ("s", "ms", "us", "ns", "datetime")
AUTO = "auto"  # the format option's value that detects the format from the file's columns


@dataclass(frozen=True)
class TraceFormat:
    name: str
    kind: str                         # table (CSV / Parquet) | jsonl | json | any
    columns: tuple[str, ...]          # raw columns every row has (detection; the table readers)
    reader: str | None                # its converter in sim.workload.readers (None: its own module)
    schema: dict[str, str] | None = None  # JSON Lines field types (F, S, IDS)
    # its needed columns are numbers (times, token counts) or the text of ``numeric_text``
    # (date-times, BurstGPT's model): the numeric reader may read it (sim/workload/trace.py)
    numeric: bool = False
    numeric_text: tuple[str, ...] = ()
    # unit of the file's timestamps (trace convert's source_time_unit); None: the trace's
    # ``time_unit`` option (generic)
    time_unit: str | None = "s"
    flatten: str | None = None        # function of sim.workload.readers flattening its nested rows


_FORMATS = (
    TraceFormat("normalized", "table", ("arrival_s", "input_tokens", "output_tokens"), "normalized", numeric=True),
    TraceFormat("azure", "table", ("TIMESTAMP", "ContextTokens", "GeneratedTokens"), "azure", numeric=True,
                numeric_text=("TIMESTAMP",), time_unit="datetime"),
    TraceFormat("burstgpt", "table", ("Timestamp", "Model", "Request tokens", "Response tokens"), "burstgpt",
                numeric=True, numeric_text=("Model",)),
    TraceFormat("vidur", "table", ("arrived_at", "num_prefill_tokens", "num_decode_tokens"), "vidur", numeric=True),
    TraceFormat("bailian", "jsonl", ("timestamp", "chat_id", "parent_chat_id", "input_length", "output_length",
                                     "hash_ids"), "bailian",
                {"timestamp": F, "chat_id": "i64", "parent_chat_id": "i64", "turn": "i64",
                 "input_length": F, "output_length": F, "hash_ids": IDS}),
    TraceFormat("mooncake", "jsonl", ("timestamp", "input_length", "output_length"), "mooncake",
                {"timestamp": F, "input_length": F, "output_length": F, "hash_ids": IDS, "session_id": S,
                 "delay": F, "priority": F}, time_unit="ms"),
    TraceFormat("aiperf", "jsonl", ("metadata", "metrics"), "aiperf",
                {"request_start_ns": F, "input_sequence_length": F, "output_sequence_length": F,
                 "time_to_first_token_ms": F, "request_latency_ms": F, "session": S}, time_unit="ns",
                flatten="aiperf_flatten"),
    TraceFormat("vllm_bench", "json", ("start_times", "input_lens", "output_lens"), None),
    TraceFormat("generic", "any", (), "generic", numeric=True, time_unit=None),
)
TRACE_FORMATS: dict[str, TraceFormat] = {f.name: f for f in _FORMATS}


def format_names() -> tuple[str, ...]:
    """Registered format names, in listing order (detection tries them in this order)."""
    return tuple(TRACE_FORMATS)


def format_choices() -> tuple[str, ...]:
    """The values of a format option: ``auto`` then every format."""
    return (AUTO, *TRACE_FORMATS)


def source_time_unit(fmt: str, time_unit: str) -> str:
    """The unit of a ``fmt`` trace's timestamps (``time_unit``: the trace's option, generic's)."""
    unit = TRACE_FORMATS[fmt].time_unit
    return time_unit if unit is None else unit
