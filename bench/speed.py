"""Simulation speed and memory: simulated requests per wall-clock second, and peak RSS.

Workload (issue 2): synthetic chat, lognormal 900 input / 300 output tokens (sigma 0.8),
Poisson arrivals at RATE req/s, Llama-3-8B on H100 SXM, 8 replicas, 100,000 requests, for
the continuous policy and chunked prefill (512-token budget). Each policy runs in a fresh
process so its peak RSS is its own. ``--both-cores`` runs each policy with the compiled core
(README.md, "Compiled core"; it must be built) and with the Python sources, alternating, and
reports both (the ``core`` column says which ran).
Usage: python bench/speed.py [--requests N] [--rate R] [--both-cores]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def one(policy: str, chunk: int, n: int, rate: float, replicas: int, cost_model: str) -> dict:
    from sim import compiled_core
    from sim.run import run_scenario
    from sim.scenario import scenario_from_dict
    from sim.metrics.summary import summarize

    raw = {
        "name": "bench", "seed": 0, "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm", "cost_model": cost_model},
        "cluster": {"replicas": replicas},
        "engine": {"policy": policy, "max_num_batched_tokens": chunk},
        "workload": {"synthetic": {
            "num_requests": n, "request_rate": rate,
            "input_tokens": {"dist": "lognormal", "mean": 900, "sigma": 0.8, "max": 7000},
            "output_tokens": {"dist": "lognormal", "mean": 300, "sigma": 0.8, "max": 1000},
        }},
    }
    t0 = time.perf_counter()
    result = run_scenario(scenario_from_dict(raw))
    sim_s = time.perf_counter() - t0
    s = summarize(result)
    wall = time.perf_counter() - t0
    return {
        "policy": policy if policy == "continuous" else f"chunked {chunk}", "cost_model": cost_model,
        "core": "compiled" if compiled_core.pure_reason is None else "python",
        "requests": n, "replicas": replicas, "rate": rate,
        "wall_s": round(wall, 2), "simulate_s": round(sim_s, 2),
        "req_per_wall_s": round(n / wall),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "step_rows": result.steps.height, "engine_steps": s["simsrv_num_steps"],
        "p99_ttft_ms": round(s["p99_ttft_ms"], 1), "p99_tpot_ms": round(s["p99_tpot_ms"], 1),
        "preemptions": s["simsrv_num_preemptions"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=80.0)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--cost-model", choices=("calibrated", "roofline"), default="calibrated")
    ap.add_argument("--repeat", type=int, default=3, help="fresh processes per policy; the fastest is reported "
                                                          "(the machine's timing noise is +-20%%)")
    ap.add_argument("--both-cores", action="store_true", help="the compiled core and the Python sources, alternating")
    ap.add_argument("--one", nargs=2, metavar=("POLICY", "CHUNK"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one[0], int(a.one[1]), a.requests, a.rate, a.replicas, a.cost_model)))
        return
    cols = ("policy", "core", "cost_model", "requests", "replicas", "rate", "wall_s", "req_per_wall_s", "peak_rss_mb",
            "step_rows", "engine_steps", "p99_ttft_ms", "p99_tpot_ms", "preemptions")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for policy, chunk in (("continuous", 8192), ("chunked", 512)):
        cmd = [sys.executable, __file__, "--requests", str(a.requests), "--rate", str(a.rate),
               "--replicas", str(a.replicas), "--cost-model", a.cost_model, "--one", policy, str(chunk)]
        cores = ("compiled", "python") if a.both_cores else (None,)
        rows: dict = {c: [] for c in cores}
        for _ in range(a.repeat):
            for core in cores:
                env = dict(os.environ)  # core None: as this process's environment says
                if core == "python":
                    env["SIMSRV_PURE_PYTHON"] = "1"
                elif core == "compiled":
                    env.pop("SIMSRV_PURE_PYTHON", None)
                rows[core].append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                                            env=env).stdout))
        for runs in rows.values():
            row = min(runs, key=lambda r: r["wall_s"])
            row["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
            print("| " + " | ".join(str(row[c]) for c in cols) + " |", flush=True)


if __name__ == "__main__":
    main()
