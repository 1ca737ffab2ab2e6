"""SLO terms for capacity search: ``ttft_p99_ms=500,tpot_p99_ms=50`` -> result.json keys and limits.

Why: users state SLOs the way they say them (metric, statistic, unit); the simulator's figures
are keyed as vLLM bench's result.json (``p99_ttft_ms``). Both spellings are accepted.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from sim.errors import UserError
from sim.metrics.keys import LATENCY_METRICS, key

METRICS = LATENCY_METRICS
STATS = ("mean", "median", "p50", "p90", "p99")
_TERM = re.compile(rf"^(?:({'|'.join(METRICS)})_({'|'.join(STATS)})|({'|'.join(STATS)})_({'|'.join(METRICS)}))_ms$")


@dataclass(frozen=True)
class SLOTerm:
    name: str        # as the user wrote it, e.g. ttft_p99_ms
    key: str         # the result.json key, e.g. p99_ttft_ms
    metric: str      # ttft | tpot | itl | e2el
    limit_ms: float


def parse_slo(text: str) -> list[SLOTerm]:
    terms = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        if "=" not in item:
            raise UserError(f"--slo {item!r}: expected METRIC_STAT_ms=LIMIT, e.g. ttft_p99_ms=500")
        name, raw = (x.strip() for x in item.split("=", 1))
        m = _TERM.match(name)
        if not m:
            raise UserError(f"--slo {name!r}: expected METRIC_STAT_ms with METRIC one of {', '.join(METRICS)} and "
                            f"STAT one of {', '.join(STATS)} (e.g. ttft_p99_ms)")
        metric, stat = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
        try:
            limit = float(raw)
        except ValueError:
            raise UserError(f"--slo {name}={raw}: the limit must be a number of milliseconds") from None
        if not (limit > 0 and math.isfinite(limit)):
            raise UserError(f"--slo {name}={raw}: the limit must be a finite number > 0")
        result_key = key(stat, metric)
        if any(t.key == result_key for t in terms):
            raise UserError(f"--slo: {name} is given twice")
        terms.append(SLOTerm(name, result_key, metric, limit))
    if not terms:
        raise UserError("--slo: give at least one term, e.g. ttft_p99_ms=500,tpot_p99_ms=50")
    return terms
