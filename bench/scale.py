"""Scale: CPU time and peak RSS of whole `simsrv run` processes at 10^5-10^7 requests (issue 14).

Cases (Llama-3-8B on 8 x H100 SXM, calibrated cost model, lognormal 900 input / 300 output
tokens, sigma 0.8, max 7,000 / 1,000; the workload of bench/speed.py):
- `synthetic`: a synthetic Poisson workload at RATE req/s (default 80: about 70-75% of what the
  8 replicas sustain, bench/README.md), continuous and chunked 512;
- `trace`: a trace file of as many requests, drawn from the same distributions (a generic CSV
  written by this script outside the repository), replayed with `workload.trace`;
- `long`: ten times longer answers (output mean 3,000, max 10,000) at the same request count
  and RATE / 10 req/s (the same output tokens per second as `synthetic`);
- `stream`: a trace file over 256 MB (10^7 rows by default), fed to the simulation in chunks.

Each case is one fresh `python -m sim run ... -q` process: CPU is its user + system time and
peak RSS its ``ru_maxrss`` (``os.wait4``), start-up and writing the run directory included.
Usage: python bench/scale.py [--requests N] [--cases synthetic,trace,long] [--policies continuous,chunked]
       python bench/scale.py --cases stream --stream-requests 10000000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from sim.workload.build import STREAM_MIN_BYTES  # noqa: E402


def scenario(policy: str, n: int, rate: float, out_mean: int, out_max: int, trace: Path | None) -> dict:
    engine = {"policy": policy, "max_num_batched_tokens": 512 if policy == "chunked" else 8192}
    if trace is not None:
        workload = {"trace": {"path": str(trace), "format": "generic"}}
    else:
        workload = {"synthetic": {
            "num_requests": n, "request_rate": rate,
            "input_tokens": {"dist": "lognormal", "mean": 900, "sigma": 0.8, "max": 7000},
            "output_tokens": {"dist": "lognormal", "mean": out_mean, "sigma": 0.8, "max": out_max},
        }}
    return {"name": "scale", "seed": 0, "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
            "cluster": {"replicas": 8}, "engine": engine, "workload": workload}


def write_trace(path: Path, n: int, rate: float, seed: int = 0, chunk: int = 1_000_000, ids: bool = False) -> None:
    """A generic CSV (arrival_s, input_tokens, output_tokens): Poisson arrivals at
    ``rate``, the lognormal lengths above (numpy's generator, seeded). ``ids`` adds a leading
    request_id column (not read by the replay), as real traces carry: 10^7 rows are then over
    the 256 MB from which a trace is streamed (202 MB without it)."""
    import math

    import numpy as np

    rng = np.random.default_rng(seed)
    t_s = 0.0
    # a lognormal's mean is exp(mu + sigma^2 / 2): mu for means 900 and 300 at sigma 0.8
    mu_in, mu_out = math.log(900) - 0.32, math.log(300) - 0.32
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(("request_id," if ids else "") + "arrival_s,input_tokens,output_tokens\n")
        for start in range(0, n, chunk):
            m = min(chunk, n - start)
            times = t_s + np.cumsum(rng.exponential(1.0 / rate, m))
            t_s = float(times[-1])
            inp = np.clip(np.rint(rng.lognormal(mu_in, 0.8, m)), 1, 7000).astype(np.int64)
            out = np.clip(np.rint(rng.lognormal(mu_out, 0.8, m)), 1, 1000).astype(np.int64)
            rows = (f"{t:.6f},{i},{o}\n" for t, i, o in zip(times.tolist(), inp.tolist(), out.tolist()))
            f.writelines((f"{start + j},{r}" for j, r in enumerate(rows)) if ids else rows)
    tmp.rename(path)


def measure(scenario_path: Path, out_dir: Path) -> dict:
    """One fresh ``simsrv run`` process: CPU s (user + system), peak RSS MB, wall s."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "sim", "run", str(scenario_path), "--out", str(out_dir),
                             "--force", "-q"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            cwd=ROOT)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{scenario_path}: {proc.stderr.read().decode()}")
    res = json.loads((out_dir / "result.json").read_text())
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024, "wall_s": wall,
            "engine_steps": res["simsrv_num_steps"], "step_rows": res["simsrv_num_step_rows"],
            "completed": res["completed"], "p99_ttft_ms": res["p99_ttft_ms"], "p99_itl_ms": res["p99_itl_ms"]}


def main() -> None:
    import yaml

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--rate", type=float, default=80.0)
    ap.add_argument("--cases", default="synthetic,trace,long")
    ap.add_argument("--policies", default="continuous,chunked")
    ap.add_argument("--stream-requests", type=int, default=10_000_000)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/simsrv_bench"))
    a = ap.parse_args()
    a.dir.mkdir(parents=True, exist_ok=True)
    print("| case | policy | requests | CPU s | peak RSS MB | bytes RSS / request | wall s | step rows "
          "| engine steps | p99 TTFT ms | p99 ITL ms |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for case in a.cases.split(","):
        n = a.stream_requests if case == "stream" else a.requests
        trace = None
        if case in ("trace", "stream"):
            trace = a.dir / f"scale_{n}_{a.rate:g}{'_ids' if case == 'stream' else ''}.csv"
            if not trace.exists():
                write_trace(trace, n, a.rate, ids=case == "stream")
            if case == "stream" and trace.stat().st_size < STREAM_MIN_BYTES:
                raise SystemExit(f"{trace}: {trace.stat().st_size >> 20} MB would be read whole, not streamed "
                                 f"(streamed from {STREAM_MIN_BYTES >> 20} MB): pass more --stream-requests")
        for policy in a.policies.split(","):
            long = case == "long"
            sc = scenario(policy, n, a.rate / 10 if long else a.rate, 3000 if long else 300,
                          10_000 if long else 1000, trace)
            path = a.dir / f"scale_{case}_{policy}_{n}.yaml"
            path.write_text(yaml.safe_dump(sc, sort_keys=False))
            r = measure(path, a.dir / f"run_{case}_{policy}_{n}")
            print(f"| {case} | {policy if policy == 'continuous' else 'chunked 512'} | {n:,} | {r['cpu_s']:.1f} "
                  f"| {r['rss_mb']:,.0f} | {r['rss_mb'] * 2**20 / n:,.0f} | {r['wall_s']:.1f} | {r['step_rows']:,} "
                  f"| {r['engine_steps']:,} | {r['p99_ttft_ms']:.1f} | {r['p99_itl_ms']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
