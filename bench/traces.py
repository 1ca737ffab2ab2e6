"""Reading a 10-million-request trace: wall time and peak RSS of `simsrv trace inspect` and `convert`.

The trace is generated outside the repository (default /tmp/simsrv_bench): an Azure LLM
inference CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`, the format of the 2024 week-long
trace with 16.8M requests), Poisson arrivals at 50 req/s, lognormal lengths; seeded. Each
command runs in a fresh process; peak RSS is that process's `ru_maxrss`.
Usage: python bench/traces.py [--requests N] [--dir D]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path


def make_azure_csv(path: Path, n: int, seed: int = 0, chunk: int = 1_000_000) -> None:
    import numpy as np
    import polars as pl

    rng = np.random.default_rng(seed)
    t0_us = 1_715_299_200_000_000  # 2024-05-10 00:00:00 UTC
    t_us = 0.0
    with open(path, "w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for start in range(0, n, chunk):
            m = min(chunk, n - start)
            gaps = rng.exponential(1 / 50, m) * 1e6
            times = t_us + np.cumsum(gaps)
            t_us = float(times[-1])
            df = pl.DataFrame({
                "TIMESTAMP": pl.Series((t0_us + times).astype(np.int64)).cast(pl.Datetime("us"))
                .dt.strftime("%Y-%m-%d %H:%M:%S%.f"),
                "ContextTokens": np.maximum(1, rng.lognormal(7.0, 1.0, m).astype(np.int64)),
                "GeneratedTokens": np.maximum(1, rng.lognormal(5.0, 0.9, m).astype(np.int64)),
            })
            f.write(df.write_csv(include_header=False))


def measure(args: list[str]) -> tuple[float, float]:
    """(wall s, peak RSS MB) of one command in a fresh process (``os.wait4`` gives its own rusage)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "sim", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{args}: {proc.stderr.read().decode()}")
    return wall, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10_000_000)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/simsrv_bench"))
    a = ap.parse_args()
    a.dir.mkdir(parents=True, exist_ok=True)
    src = a.dir / f"azure_{a.requests}.csv"
    if not src.exists():
        t0 = time.perf_counter()
        make_azure_csv(src, a.requests)
        print(f"generated {src} ({os.path.getsize(src) / 1e6:,.0f} MB) in {time.perf_counter() - t0:.1f} s")
    rows = []
    for name, args in (
        ("inspect", ["trace", "inspect", str(src), "--json"]),
        ("convert --target-rate 100", ["trace", "convert", str(src), "-o", str(a.dir / "out.parquet"),
                                       "--target-rate", "100"]),
    ):
        wall, rss = measure(args)
        rows.append((name, wall, rss))
    print(f"| command | requests | file MB | wall s | peak RSS MB |\n|---|---|---|---|---|")
    for name, wall, rss in rows:
        print(f"| `trace {name}` | {a.requests:,} | {os.path.getsize(src) / 1e6:,.0f} | {wall:.1f} | {rss:,.0f} |")


if __name__ == "__main__":
    main()
