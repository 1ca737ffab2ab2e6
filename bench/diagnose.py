"""Wall time of ``simsrv diagnose`` on a saturated 12,000-request trace with an infeasible TTFT
SLO (issue 36): bench/diagnose_saturated.yaml (Llama-3.1-70B TP 4 on one H100 replaying the
first 12,000 requests of traces/azure_conv.parquet at twice their rate; p99 TTFT SLO 150 ms).

The whole process is timed (start-up, the baseline replay, the SLO floors, every candidate fix
and every replica count the search simulates, the report and run directory written), with
``--workers`` local processes (default 2: the target is under 3 minutes on 2 cores). The
``--json`` verdict is printed after the time, so the figure can be checked against it.
Usage: python bench/diagnose.py [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "bench" / "diagnose_saturated.yaml"
TRACE = ROOT / "traces" / "azure_conv.parquet"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "sim", "diagnose", str(TRACE), "--scenario", str(SCENARIO), "--json",
               "--workers", str(args.workers), "--out", out]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
        wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(p.stderr)
    v = json.loads(p.stdout)
    print(f"diagnose {SCENARIO.name}: {wall:.1f} s wall with {args.workers} workers ({os.cpu_count()} cores)")
    print(f"  offered {v['offered_rate']:.2f} req/s, served {v['served_rate']:.2f}, saturated {v['saturated']}, "
          f"replicas needed {v['replicas_needed']}, infeasible {v['infeasible']}, "
          f"prefill floor {v['floors_ms']['prefill_p99_prompt']:,.0f} ms, {len(v['fixes'])} fixes")


if __name__ == "__main__":
    main()
