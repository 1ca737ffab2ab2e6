"""Latencies in a unit a reader takes in at a glance: ms, or s from 10,000 ms up.

Why: a saturated configuration's p99 E2E latency of "4,292,988 ms" has to be counted digit by
digit; "4,292.99 s" does not. Tables choose the unit per value (the cell carries it), charts
per chart (the axis title carries it).
"""

from __future__ import annotations

import math
from typing import Iterable

SECONDS_FROM_MS = 10_000.0   # from this many ms up a latency is shown in seconds
# for a page whose table cells carry units: a number stays on one line with its unit ("216.3 ms")
NUMBER_CELLS_STYLE = "<style>td.num { white-space: nowrap; }</style>"


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def latency_unit(values_ms: Iterable) -> tuple[str, float]:
    """("s", 1e-3) when any of the values reaches SECONDS_FROM_MS, else ("ms", 1.0): the unit
    and the factor that turns ms into it."""
    top = max((abs(float(v)) for v in values_ms if not _missing(v)), default=0.0)
    return ("s", 1e-3) if top >= SECONDS_FROM_MS else ("ms", 1.0)


def _number(v: float, unit: str) -> str:
    return f"{v:,.2f}" if unit == "s" else f"{v:,.1f}"


def fmt_latency_ms(v_ms) -> str:
    """One latency with its unit: "47.4 ms", "4,292.99 s"; "-" for none."""
    if _missing(v_ms):
        return "-"
    unit, k = latency_unit([v_ms])
    return f"{_number(float(v_ms) * k, unit)} {unit}"


def fmt_latency_ci_ms(mean_ms, low_ms=None, high_ms=None) -> str:
    """A mean and its interval, in the mean's unit: "4,292.99 s [4,100.20, 4,480.00]"; the
    interval is left out when either bound is missing."""
    if _missing(mean_ms):
        return "-"
    unit, k = latency_unit([mean_ms])
    text = f"{_number(float(mean_ms) * k, unit)} {unit}"
    if _missing(low_ms) or _missing(high_ms):
        return text
    return f"{text} [{_number(float(low_ms) * k, unit)}, {_number(float(high_ms) * k, unit)}]"
