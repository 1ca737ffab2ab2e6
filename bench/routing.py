"""Routers on prefix-heavy and prefix-free workloads: mean / p99 TTFT, TPOT, prefix-cache hit rate.

Workloads (each seeded; all routers see the same requests):
  mooncake  traces/samples/mooncake_synthetic_first500.jsonl (Mooncake FAST'25 synthetic trace,
            512-token hash ids), arrivals 4x compressed (time_scale 0.25, ~14 req/s), 8 replicas
  groups    scenarios/routing.yaml: 64 groups x 16 prompts sharing a 2,048-token system prompt,
            40 req/s, 4 replicas
  plain     scenarios/routing.yaml without shared prefixes (1,000 requests)
Usage: python bench/routing.py [--workloads mooncake,groups,plain]
"""

from __future__ import annotations

import argparse
import time

from sim.run import run_scenario
from sim.scenario import load_scenario
from sim.metrics.summary import summarize

ROUTERS = ("least_outstanding", "round_robin", "random", "prefix_affinity", "cache_aware")
WORKLOADS = {
    "mooncake": ("scenarios/trace_mooncake.yaml", ["cluster.replicas=8", "workload.trace.time_scale=0.25"]),
    "groups": ("scenarios/routing.yaml", []),
    "plain": ("scenarios/routing.yaml", ["workload.synthetic.prefix_groups=null"]),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    args = ap.parse_args()
    print("| workload | router | mean TTFT ms | p99 TTFT ms | mean TPOT ms | prefix hit rate | wall s |")
    print("|---|---|---|---|---|---|---|")
    for name in args.workloads.split(","):
        path, sets = WORKLOADS[name]
        for router in ROUTERS:
            t0 = time.perf_counter()
            r = summarize(run_scenario(load_scenario(path, [*sets, f"cluster.router={router}"])))
            print(f"| {name} | {router} | {r['mean_ttft_ms']:.1f} | {r['p99_ttft_ms']:.1f} | {r['mean_tpot_ms']:.1f} "
                  f"| {r['simsrv_prefix_cache_hit_rate'] or 0:.3f} | {time.perf_counter() - t0:.0f} |", flush=True)


if __name__ == "__main__":
    main()
