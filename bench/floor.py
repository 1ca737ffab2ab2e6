"""The pure-Python floor under a simulated step (issue 14): what one step row costs in simsrv,
set against what SimPy alone costs for the same events.

Runs the `bench/speed.py` workload (Llama-3-8B, 8 x H100 SXM, 80 req/s, lognormal 900 / 300
tokens) once per policy, counting the SimPy events it schedules (every event takes the next
number of the environment's event counter), then schedules as many timeouts through a SimPy
skeleton: 8 replica processes and an arrival process doing nothing else, one event each per
wait (the replica loop and the arrivals run as callbacks of such events, sim/engine/calls.py). CPU seconds (``time.process_time``), fastest of REPEAT.
The gap between the two is simsrv's own Python per step: scheduling, KV blocks, the cost
model, the TTFT decomposition and the step log.
Usage: python bench/floor.py [--requests 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import time

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


def simsrv_run(policy: str, chunk: int, n: int) -> tuple[float, int, int]:
    """CPU seconds of ``run_scenario``, its step rows, and the SimPy events it scheduled."""
    from sim.run import run_scenario

    envs: list[simpy.Environment] = []
    original = simpy.core.Environment.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        envs.append(self)

    simpy.core.Environment.__init__ = init
    try:
        sc = scenario(policy, chunk, n)
        t0 = time.process_time()
        result = run_scenario(sc)
        cpu = time.process_time() - t0
    finally:
        simpy.core.Environment.__init__ = original
    return cpu, result.steps.height, sum(env.clock.events_scheduled for env in envs)


def skeleton(events: int, arrivals: int) -> float:
    """CPU seconds of SimPy alone: ``events`` timeouts, ``arrivals`` of them by an arrival
    process and the rest by REPLICAS replica processes."""
    env = simpy.Environment()
    rng = random.Random(0)
    per_replica = (events - arrivals) // REPLICAS

    def replica():
        for _ in range(per_replica):
            yield env.timeout(rng.random() * 0.02)

    for _ in range(REPLICAS):
        env.process(replica())

    def arrive():
        for _ in range(arrivals):
            yield env.timeout(rng.random() * 0.05)

    env.process(arrive())
    t0 = time.process_time()
    env.run()
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print("| policy | step rows | SimPy events | simsrv CPU s | us per row "
          "| SimPy skeleton CPU s | us per row | simsrv's own us per row |")
    print("|---|---|---|---|---|---|---|---|")
    for policy, chunk in (("continuous", 8192), ("chunked", 512)):
        runs = [simsrv_run(policy, chunk, a.requests) for _ in range(a.repeat)]
        cpu, rows, events = min(runs)
        bare = min(skeleton(events, a.requests) for _ in range(a.repeat))
        name = policy if policy == "continuous" else f"chunked {chunk}"
        print(f"| {name} | {rows:,} | {events:,} | {cpu:.2f} | {cpu / rows * 1e6:.1f} | {bare:.3f} "
              f"| {bare / rows * 1e6:.1f} | {(cpu - bare) / rows * 1e6:.1f} |", flush=True)


if __name__ == "__main__":
    main()
