"""Whole-process time of `simsrv run` on a 10,000-request Poisson trace (issue 14's first target:
<= 0.5 s on this machine, 30x a peer simulator's 15 s on the same trace).

Workload as the issue measured it against Vidur: Llama-3-8B on one A100 80GB, batch cap 128
(``max_num_seqs``), Poisson arrivals; the request lengths are the first 10,000 rows of the
shipped Azure 2023 conversation trace (`traces/azure_conv.parquet`) whose prompt + answer fit
in 4,096 tokens (Vidur's default ``max_tokens``). The trace is written once as a generic CSV;
each policy (continuous, chunked 512) then runs in REPEAT fresh `python -m sim run` processes:
CPU is the child's user + system time (``os.wait4``), wall its elapsed time; the fastest of
REPEAT is kept. Bytecode caching is on, as in an installed package.
``--trace-format azure|burstgpt`` writes the same requests in that format (Azure's date-times,
BurstGPT's columns); ``--write-only DIR`` leaves the trace and its scenario in DIR and measures
nothing (``bench/startup.py --scenario DIR/peer.yaml`` measures its start-up).
Usage: python bench/peer.py [--requests 10000] [--rate 2.0] [--repeat 3] [--trace-format generic]
                            [--write-only DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]

SCENARIO = """name: peer
seed: 0
model: llama-3-8b
hardware: {{gpu: a100-80g}}
engine: {{max_num_seqs: 128}}
workload:
  trace:
    path: {trace}
{format}
"""
# how each trace format is named in the scenario
FORMAT_KEYS = {
    "generic": "    format: generic\n    time_unit: s\n"
               "    columns: {arrival: arrival_s, input: input_tokens, output: output_tokens}",
    "azure": "    format: azure",
    "burstgpt": "    format: burstgpt\n    model_filter: ChatGPT",
}


def write_trace(path: Path, n: int, rate: float, seed: int = 0, fmt: str = "generic") -> None:
    """The 10k trace in ``fmt``: generic (seconds), azure (date-times from 2023-11-16 18:15:00,
    as Azure's 2023 files write them) or burstgpt (seconds; every row's Model is ChatGPT)."""
    t = pq.read_table(ROOT / "traces" / "azure_conv.parquet", columns=["input_tokens", "output_tokens"])
    inp, out = t.column("input_tokens").to_numpy(), t.column("output_tokens").to_numpy()
    keep = (inp + out) <= 4096
    inp, out = inp[keep][:n], out[keep][:n]
    arrival_s = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, len(inp)))
    rows = zip(arrival_s.tolist(), inp.tolist(), out.tolist())
    with path.open("w") as f:
        if fmt == "azure":
            start = np.datetime64("2023-11-16T18:15:00", "us")
            f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
            f.writelines(f"{str(start + np.timedelta64(int(a * 1e6), 'us')).replace('T', ' ')}0,{i},{o}\n"
                         for a, i, o in rows)
        elif fmt == "burstgpt":
            f.write("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n")
            f.writelines(f"{a!r},ChatGPT,{i},{o},{i + o},Conversation log\n" for a, i, o in rows)
        else:
            f.write("arrival_s,input_tokens,output_tokens\n")
            f.writelines(f"{a!r},{i},{o}\n" for a, i, o in rows)


def one(args: list[str], pycache: Path) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=str(ROOT), PYTHONPYCACHEPREFIX=str(pycache))
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "sim", "run", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"simsrv run {args}: {proc.stderr.read().decode()}")
    return usage.ru_utime + usage.ru_stime, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=2.0, help="Poisson arrivals per second")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--trace-format", choices=sorted(FORMAT_KEYS), default="generic")
    ap.add_argument("--write-only", type=Path, metavar="DIR",
                    help="write the trace and its scenario (peer.yaml) into DIR and stop (for bench/startup.py --scenario)")
    a = ap.parse_args()
    if a.write_only:
        a.write_only.mkdir(parents=True, exist_ok=True)
        write_trace(a.write_only / "trace.csv", a.requests, a.rate, fmt=a.trace_format)
        (a.write_only / "peer.yaml").write_text(SCENARIO.format(trace=(a.write_only / "trace.csv").resolve(),
                                                                format=FORMAT_KEYS[a.trace_format]))
        return
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        write_trace(d / "trace.csv", a.requests, a.rate, fmt=a.trace_format)
        sc = d / "peer.yaml"
        sc.write_text(SCENARIO.format(trace=d / "trace.csv", format=FORMAT_KEYS[a.trace_format]))
        print("| policy | requests | whole process CPU s | wall s | target wall s |")
        print("|---|---|---|---|---|")
        for name, extra in (("continuous", ["--policy", "continuous"]), ("chunked 512", ["--policy", "chunked", "--chunk", "512"])):
            args = [str(sc), *extra, "--out", str(d / "run"), "--force", "-q"]
            one(args, d / "pycache")  # fills the bytecode cache
            runs = [one(args, d / "pycache") for _ in range(a.repeat)]
            cpu, wall = min(r[0] for r in runs), min(r[1] for r in runs)
            print(f"| {name} | {a.requests:,} | {cpu:.2f} | {wall:.2f} | 0.5 |", flush=True)


if __name__ == "__main__":
    main()
