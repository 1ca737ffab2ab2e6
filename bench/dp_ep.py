"""Data-parallel attention with expert parallelism: the all-to-all per MoE layer, a lockstep
decode round against a TP8 step, and the shipped DeepSeek-V3 DP8 scenario against TP8.

    python bench/dp_ep.py                  # 1,000 requests of scenarios/deepseek_v3_dp8_ep.yaml
    python bench/dp_ep.py --requests 200
"""

from __future__ import annotations

import argparse
import resource

from sim.metrics.summary import summarize
from sim.core.batch import Batch
from sim.cost.all2all import All2AllLinks, all2all_layer_s
from sim.engine.deployment import build_deployment
from sim.engine.dp_group import round_s
from sim.spec.hardware import get_gpu
from sim.run import run_scenario
from sim.scenario import load_scenario

SCENARIO = "scenarios/deepseek_v3_dp8_ep.yaml"
TP8 = ["cluster.data_parallel_size=1", "cluster.tensor_parallel_size=8"]


def all2all_table() -> None:
    g = get_gpu("h200")
    links = All2AllLinks(g.nvlink_bw_bytes_per_s * 0.8, g.inter_node_bw_bytes_per_s * 0.8, g.gpus_per_node, 10e-6)
    print("DeepSeek-V3 all-to-all per MoE layer (dispatch fp8 + combine bf16), H200, us")
    print("| tokens per GPU | EP 8 | EP 16 | EP 32 |")
    print("|---|---|---|---|")
    for t in (8, 32, 128, 512):
        row = [all2all_layer_s(t, 7168, 8, ep, links, True, 2) * 1e6 for ep in (8, 16, 32)]
        print(f"| {t} | " + " | ".join(f"{x:.1f}" for x in row) + " |")


def round_table() -> None:
    dp8 = build_deployment(load_scenario(SCENARIO))
    tp8 = build_deployment(load_scenario(SCENARIO, TP8))
    print("\nDecode at 2,000 tokens of context: DP8 lockstep round vs TP8 step, ms")
    print("| sequences in all | DP8 round | of it all-to-all | TP8 step |")
    print("|---|---|---|---|")
    for per_rank in (8, 32, 128):
        n = 8 * per_rank
        b = Batch(num_decode_seqs=per_rank, decode_context_tokens=per_rank * 2000, num_logits=per_rank)
        dur, _ = round_s(dp8.cost, [b] * 8)
        a2a = dp8.model.num_moe_layers * dp8.cost.all2all_layer_s(per_rank)
        t = tp8.cost.run_cost(Batch(num_decode_seqs=n, decode_context_tokens=n * 2000, num_logits=n)).first_s
        print(f"| {n} | {dur * 1e3:.2f} | {a2a * 1e3:.2f} | {t * 1e3:.2f} |")


def runs(requests: int) -> None:
    print(f"\n{SCENARIO}, {requests} requests")
    print("| layout | p50 TTFT ms | p99 TTFT ms | p50 TPOT ms | p99 TPOT ms | output tok/s | step rows | CPU s |")
    print("|---|---|---|---|---|---|---|---|")
    for label, sets in (("DP8 x TP1 + EP8 (64 seqs per core)", []), ("TP8 (64 seqs)", TP8),
                        ("TP8 (512 seqs)", [*TP8, "engine.max_num_seqs=512"])):
        s = load_scenario(SCENARIO, [f"workload.synthetic.num_requests={requests}", *sets])
        c0 = resource.getrusage(resource.RUSAGE_SELF).ru_utime
        res = run_scenario(s)
        cpu = resource.getrusage(resource.RUSAGE_SELF).ru_utime - c0
        m = summarize(res)
        print(f"| {label} | {m['median_ttft_ms']:.1f} | {m['p99_ttft_ms']:.1f} | {m['median_tpot_ms']:.1f} | "
              f"{m['p99_tpot_ms']:.1f} | {m['output_throughput']:.0f} | {res.steps.height:,} | {cpu:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1000)
    a = ap.parse_args()
    all2all_table()
    round_table()
    runs(a.requests)


if __name__ == "__main__":
    main()
