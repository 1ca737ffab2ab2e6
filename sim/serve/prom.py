"""``/metrics`` of ``simsrv serve``: vLLM V1's Prometheus metrics, by their names and buckets.

Why: dashboards, autoscalers and routers read these names from a vLLM server; the simulated
endpoint serves the same ones, per replica (vLLM labels each engine: ``engine="0"``...), from
the simulation's state and the requests it finished. Names, help texts and bucket bounds are
vLLM 0.11.0's ``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger``); the text format is
Prometheus' exposition format 0.0.4 (counters end in ``_total``; histograms give cumulative
``_bucket{le=...}``, ``_sum`` and ``_count``). Latencies are simulated seconds.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

# vllm/v1/metrics/loggers.py (0.11.0), PrometheusStatLogger.__init__
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                             60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)

GAUGES = {
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
}
COUNTERS = {
    "vllm:num_preemptions": "Cumulative number of preemption from the engine.",
    "vllm:prompt_tokens": "Number of prefill tokens processed.",
    "vllm:generation_tokens": "Number of generation tokens processed.",
    "vllm:prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "vllm:prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
}
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": ("Histogram of time to first token in seconds.", TTFT_BUCKETS_S),
    "vllm:inter_token_latency_seconds": ("Histogram of inter-token latency in seconds.", ITL_BUCKETS_S),
    "vllm:e2e_request_latency_seconds": ("Histogram of e2e request latency in seconds.",
                                         REQUEST_LATENCY_BUCKETS_S),
    "vllm:request_queue_time_seconds": ("Histogram of time spent in WAITING phase for request.",
                                        REQUEST_LATENCY_BUCKETS_S),
}


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket (not cumulative), +Inf last
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float, times: int = 1) -> None:
        # Prometheus buckets are upper-inclusive: le="0.1" counts values <= 0.1
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.total += value * times
        self.n += times


@dataclass
class EngineMetrics:
    """One replica's counters and histograms (vLLM: one engine's)."""
    counters: dict[str, float] = field(default_factory=lambda: {k: 0.0 for k in COUNTERS})
    success: dict[str, int] = field(default_factory=dict)  # finished_reason -> requests
    histograms: dict[str, Histogram] = field(
        default_factory=lambda: {k: Histogram(b) for k, (_, b) in HISTOGRAMS.items()})


def _num(v: float) -> str:
    if math.isinf(v):
        return "+Inf"
    return repr(float(v))


def exposition(model: str, engines: list[EngineMetrics], gauges: list[dict[str, float]]) -> str:
    """The text a Prometheus scrape of ``/metrics`` gets."""
    def labels(i: int, extra: str = "") -> str:
        return f'engine="{i}",model_name="{model}"' + extra

    out: list[str] = []
    for name, help_ in GAUGES.items():
        out += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
        out += [f"{name}{{{labels(i)}}} {_num(g[name])}" for i, g in enumerate(gauges)]
    for name, help_ in COUNTERS.items():
        out += [f"# HELP {name}_total {help_}", f"# TYPE {name}_total counter"]
        out += [f"{name}_total{{{labels(i)}}} {_num(e.counters[name])}" for i, e in enumerate(engines)]
    name = "vllm:request_success"
    out += [f"# HELP {name}_total Count of successfully processed requests.", f"# TYPE {name}_total counter"]
    for i, e in enumerate(engines):
        for reason in ("stop", "length", "abort"):
            extra = f',finished_reason="{reason}"'
            out.append(f"{name}_total{{{labels(i, extra)}}} {_num(e.success.get(reason, 0))}")
    for name, (help_, bounds) in HISTOGRAMS.items():
        out += [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        for i, e in enumerate(engines):
            h = e.histograms[name]
            cum = 0
            for bound, c in zip((*bounds, math.inf), h.counts):
                cum += c
                le = f',le="{_num(bound)}"'
                out.append(f"{name}_bucket{{{labels(i, le)}}} {_num(cum)}")
            out.append(f"{name}_sum{{{labels(i)}}} {_num(h.total)}")
            out.append(f"{name}_count{{{labels(i)}}} {_num(h.n)}")
    return "\n".join(out) + "\n"
