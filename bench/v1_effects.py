"""The measured effects of vLLM V1's scheduling rules (issue 12, items 1-5) on simsrv's outputs.

Run from the repository root: ``python bench/v1_effects.py``. Prints one line per figure; the
figures before/after the V1 rules are recorded in bench/README.md.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path.cwd()  # run from a checkout root: its sim/ is measured
sys.path.insert(0, str(ROOT))

from sim.run import run_scenario  # noqa: E402
from sim.scenario import load_scenario, scenario_from_dict  # noqa: E402
from sim.metrics.summary import _hit_rate  # noqa: E402


def _run(path: str, sets: dict):
    return run_scenario(load_scenario(ROOT / path, [f"{k}={v}" for k, v in sets.items()]))


def _synthetic(engine: dict, synthetic: dict):
    return run_scenario(scenario_from_dict({"name": "v1_effects", "seed": 0, "model": "llama-3-8b",
                                            "hardware": {"gpu": "h100-sxm"}, "engine": engine,
                                            "workload": {"synthetic": synthetic}}))


def long_context() -> None:
    out = {}
    caching = os.environ.get("PREFIX_CACHING")  # "false": the V1 rules without prefix caching
    for dtype in ("auto", "fp8"):
        sets = {} if dtype == "auto" else {"engine.kv_cache_dtype": "fp8"}
        if caching:
            sets["engine.enable_prefix_caching"] = caching
        r = _run("scenarios/long_context.yaml", sets)
        req, steps = r.requests, r.steps
        done = req.filter(req["status"] == "completed")
        span = float(done["finish_s"].max() - req["arrival_s"].min())
        work = int(steps["prefill_tokens"].sum()) / int(req["input_tokens"].sum())
        out[dtype] = len(done) / span
        print(f"long_context kv={dtype}: preemptions {int(req['num_preemptions'].sum())}, prefill work / prompt "
              f"tokens {work:.2f}x, throughput {out[dtype]:.3f} req/s")
    print(f"long_context fp8 KV throughput gain {out['fp8'] / out['auto']:.2f}x")


def long_prefill_threshold() -> None:
    """20% 8k-token prompts, 80% short ones, threshold 512 under a 2048-token budget."""
    r = _synthetic({"policy": "chunked", "max_num_batched_tokens": 2048, "long_prefill_token_threshold": 512},
                   {"num_requests": 2000, "request_rate": float(os.environ.get("RATE", 8)),
                    "input_tokens": {"dist": "mixture", "components": [
                        {"weight": 0.8, "dist": "uniform", "min": 100, "max": 400},
                        {"weight": 0.2, "dist": "fixed", "value": 8000}]},
                    "output_tokens": {"dist": "uniform", "min": 100, "max": 300}})
    req = r.requests.filter(r.requests["status"] == "completed")
    short = req.filter(req["input_tokens"] < 1000)
    print(f"threshold 512: short prompts p99 TTFT {1e3 * float(np.percentile(short['ttft_s'].to_numpy(), 99)):.0f} ms "
          f"(n={len(short)})")


def multi_turn() -> None:
    r = _synthetic({"policy": "chunked", "enable_prefix_caching": True},
                   {"num_requests": 2000, "request_rate": 4, "multi_turn": {},
                    "input_tokens": {"dist": "lognormal", "mean": 200, "sigma": 0.5, "max": 1000},
                    "output_tokens": {"dist": "lognormal", "mean": 200, "sigma": 0.5, "max": 1000}})
    print(f"multi-turn chat: prefix hit rate {_hit_rate(r.schedulers):.3f}")


if __name__ == "__main__":
    which = sys.argv[1:] or ["long_context", "long_prefill_threshold", "multi_turn"]
    for name in which:
        globals()[name]()
