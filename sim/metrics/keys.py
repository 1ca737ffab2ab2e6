"""result.json's latency keys, spelled once.

Why: ``p99_ttft_ms`` and friends are read by the summary, compare, diagnose, the sweeps and
every page; a key typed by hand and misspelt reads as None, silently. Every module builds them
here (``key("p99", "ttft")``), and ``key`` refuses a statistic or metric that result.json does
not have. Keyed as vLLM bench's ``--save-result`` JSON (vllm/benchmarks/serve.py
``calculate_metrics``: ``{mean,median,std,p50,p90,p99}_{ttft,tpot,itl,e2el}_ms``).
"""

from __future__ import annotations

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
# the statistics result.json holds per latency metric, in its order
STATS = ("mean", "median", "std", "p50", "p90", "p99")
# statistics only some metrics have: ITL's p99.9 (the rare long stalls p99 hides)
EXTRA_STATS = {"itl": ("p99.9",)}
MAX_ITL = "simsrv_max_itl_ms"


def key(stat: str, metric: str) -> str:
    """``key("p99", "ttft")`` -> ``"p99_ttft_ms"``; a key result.json lacks is a KeyError."""
    if metric not in LATENCY_METRICS or stat not in STATS + EXTRA_STATS.get(metric, ()):
        raise KeyError(f"result.json has no {stat}_{metric}_ms")
    return f"{stat}_{metric}_ms"


def queue_key(stat: str) -> str:
    """``queue_key("p99")`` -> ``"simsrv_p99_queue_time_ms"`` (simsrv's own: not in vLLM bench)."""
    if stat not in STATS:
        raise KeyError(f"result.json has no simsrv_{stat}_queue_time_ms")
    return f"simsrv_{stat}_queue_time_ms"


# every latency key of result.json, metric by metric
LATENCY_KEYS = tuple(key(s, m) for m in LATENCY_METRICS for s in STATS + EXTRA_STATS.get(m, ()))
QUEUE_KEYS = tuple(queue_key(s) for s in STATS)

MEAN_TTFT, MEDIAN_TTFT, P50_TTFT, P99_TTFT = (key(s, "ttft") for s in ("mean", "median", "p50", "p99"))
MEDIAN_TPOT, P99_TPOT = key("median", "tpot"), key("p99", "tpot")
P99_E2EL = key("p99", "e2el")
P999_ITL = key("p99.9", "itl")
