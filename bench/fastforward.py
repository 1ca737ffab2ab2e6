"""Fast-forwarded runs against the same steps costed one at a time (issue 10 section 1).

One request alone (Llama-2-7B on A100, 5 prompt tokens, 200 or 2,000 output tokens, the
calibrated cost model), simulated as shipped and with ``max_run_steps=1`` (every decode step
planned and costed alone): TPOT, p50 and p99 ITL, step rows. Usage: python bench/fastforward.py
"""

from __future__ import annotations

import time

from sim.run import run_scenario
from sim.scenario import scenario_from_dict
from sim.metrics.summary import summarize


def one(out: int, gpu: str, model: str, max_run_steps: int | None) -> dict:
    raw = {"name": "ff", "model": model, "hardware": {"gpu": gpu},
           "workload": {"synthetic": {"num_requests": 1, "request_rate": 1,
                                      "input_tokens": {"dist": "fixed", "value": 5},
                                      "output_tokens": {"dist": "fixed", "value": out}}}}
    t0 = time.perf_counter()
    r = run_scenario(scenario_from_dict(raw), max_run_steps=max_run_steps)
    s = summarize(r)
    return {"tpot": s["mean_tpot_ms"], "p50_itl": s["p50_itl_ms"], "p99_itl": s["p99_itl_ms"],
            "rows": r.steps.height, "wall_ms": (time.perf_counter() - t0) * 1e3}


def main() -> None:
    print("| case | run | TPOT ms | p50 ITL ms | p99 ITL ms | step rows |")
    print("|---|---|---|---|---|---|")
    for model, gpu in (("llama-2-7b", "a100-80g"), ("llama-3-8b", "h100-sxm")):
        for out in (200, 2000):
            for label, k in (("fast-forwarded", None), ("step by step", 1)):
                r = one(out, gpu, model, k)
                print(f"| {model} / {gpu}, 5 in, {out} out | {label} | {r['tpot']:.2f} | {r['p50_itl']:.2f} | "
                      f"{r['p99_itl']:.2f} | {r['rows']} |", flush=True)


if __name__ == "__main__":
    main()
