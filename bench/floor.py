"""The pure-Python floor under a simulated step (issue 14): what one step row costs in simsrv,
set against what SimPy alone costs for the same events.

Runs the `bench/speed.py` workload (Llama-3-8B, 8 x H100 SXM, 80 req/s, lognormal 900 / 300
tokens) once per policy, counting the SimPy events it schedules by kind, then replays exactly
that many timeouts and interruptions through a SimPy skeleton (8 replica processes and an
arrival process doing nothing else). CPU seconds (``time.process_time``), fastest of REPEAT.
The gap between the two is simsrv's own Python per step: scheduling, KV blocks, the cost
model, the TTFT decomposition and the step log.
Usage: python bench/floor.py [--requests 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter

import simpy
import simpy.core

REPLICAS = 8


def scenario(policy: str, chunk: int, n: int):
    from sim.scenario import scenario_from_dict

    return scenario_from_dict({
        "name": "floor", "seed": 0, "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
        "cluster": {"replicas": REPLICAS}, "engine": {"policy": policy, "max_num_batched_tokens": chunk},
        "workload": {"synthetic": {
            "num_requests": n, "request_rate": 80.0,
            "input_tokens": {"dist": "lognormal", "mean": 900, "sigma": 0.8, "max": 7000},
            "output_tokens": {"dist": "lognormal", "mean": 300, "sigma": 0.8, "max": 1000},
        }},
    })


def simsrv_run(policy: str, chunk: int, n: int, count: bool) -> tuple[float, int, Counter]:
    """CPU seconds of ``run_scenario``, its step rows, and (with ``count``) its SimPy events."""
    from sim.run import run_scenario

    kinds: Counter = Counter()
    original = simpy.core.Environment.schedule
    if count:
        def schedule(self, event, priority=1, delay=0):
            kinds[type(event).__name__] += 1
            return original(self, event, priority, delay)
        simpy.core.Environment.schedule = schedule
    try:
        sc = scenario(policy, chunk, n)
        t0 = time.process_time()
        result = run_scenario(sc)
        return time.process_time() - t0, result.steps.height, kinds
    finally:
        simpy.core.Environment.schedule = original


def skeleton(timeouts: int, interrupts: int, arrivals: int) -> float:
    """CPU seconds of SimPy alone: REPLICAS processes yielding ``timeouts - arrivals`` timeouts in
    all, an arrival process yielding ``arrivals`` and interrupting a busy replica
    ``interrupts`` times."""
    env = simpy.Environment()
    rng = random.Random(0)
    per_replica = (timeouts - arrivals) // REPLICAS

    def replica():
        for _ in range(per_replica):
            try:
                yield env.timeout(rng.random() * 0.02)
            except simpy.Interrupt:
                pass

    procs = [env.process(replica()) for _ in range(REPLICAS)]
    every = max(1, arrivals // max(1, interrupts))

    def arrive():
        for i in range(arrivals):
            yield env.timeout(rng.random() * 0.05)
            p = procs[i % REPLICAS]
            if i % every == 0 and p.is_alive and isinstance(p.target, simpy.Timeout):
                p.interrupt()

    env.process(arrive())
    t0 = time.process_time()
    env.run()
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print("| policy | step rows | SimPy events (timeouts / interruptions) | simsrv CPU s | us per row "
          "| SimPy skeleton CPU s | us per row | simsrv's own us per row |")
    print("|---|---|---|---|---|---|---|---|")
    for policy, chunk in (("continuous", 8192), ("chunked", 512)):
        _, rows, kinds = simsrv_run(policy, chunk, a.requests, count=True)
        cpu = min(simsrv_run(policy, chunk, a.requests, count=False)[0] for _ in range(a.repeat))
        t, i = kinds["Timeout"], kinds["Interruption"]
        bare = min(skeleton(t, i, a.requests) for _ in range(a.repeat))
        name = policy if policy == "continuous" else f"chunked {chunk}"
        print(f"| {name} | {rows:,} | {t:,} / {i:,} | {cpu:.2f} | {cpu / rows * 1e6:.1f} | {bare:.3f} "
              f"| {bare / rows * 1e6:.1f} | {(cpu - bare) / rows * 1e6:.1f} |", flush=True)


if __name__ == "__main__":
    main()
