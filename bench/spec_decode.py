"""Speculative decoding on and off across the load: mean TPOT and output throughput.

The question users ask: "should I turn it on at my load?". scenarios/spec_decode.yaml (EAGLE,
2 draft tokens, acceptance length 1.89; prompts of 200 tokens on average, outputs of 200 give or take 10%: a short drain) at a
light load and a saturating one, with max_num_seqs capping the batch the saturated engine
runs: at light load TPOT falls by about the acceptance length less the draft's cost; under
saturation every decode carries 1 + k tokens through the GEMMs, so past the batch where they
turn compute bound the target's steps grow faster than E and output throughput falls below
spec-off's: the crossover is a batch size. Each run seeded, 4,000 requests.
Usage: python bench/spec_decode.py [--rates 2,256] [--seqs 16,64,256,512,1024] [--requests 4000]
"""

from __future__ import annotations

import argparse

from sim.metrics.summary import summarize
from sim.run import run_scenario
from sim.scenario import load_scenario

SCENARIO = "scenarios/spec_decode.yaml"
WORKLOAD = ["workload.synthetic.input_tokens.mean=200", "workload.synthetic.output_tokens.mean=200",
            "workload.synthetic.output_tokens.sigma=0.1"]


def figures(rate: float, seqs: int, requests: int, on: bool) -> tuple[float, float]:
    """(mean TPOT ms, output tokens/s) of one run."""
    sets = [f"workload.synthetic.request_rate={rate}", f"engine.max_num_seqs={seqs}",
            f"workload.synthetic.num_requests={requests}", *WORKLOAD]
    if not on:
        sets.append("engine.speculative_config=null")
    r = summarize(run_scenario(load_scenario(SCENARIO, sets)))
    return r["mean_tpot_ms"], r["output_throughput"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default="2,256")
    ap.add_argument("--seqs", default="16,64,256,512,1024")
    ap.add_argument("--requests", type=int, default=4000)
    args = ap.parse_args()
    print("| max_num_seqs | req/s | TPOT off ms | TPOT on ms | out tok/s off | out tok/s on | on/off throughput |")
    print("|---|---|---|---|---|---|---|")
    for seqs in (int(s) for s in args.seqs.split(",")):
        for rate in (float(x) for x in args.rates.split(",")):
            t0, x0 = figures(rate, seqs, args.requests, False)
            t1, x1 = figures(rate, seqs, args.requests, True)
            print(f"| {seqs} | {rate:g} | {t0:.1f} | {t1:.1f} | {x0:,.0f} | {x1:,.0f} | {x1 / x0:.2f} |", flush=True)


if __name__ == "__main__":
    main()
