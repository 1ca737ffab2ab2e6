"""Reading a JSON Lines trace (Mooncake format with hash ids): the numeric reader (pyarrow's
JSON reader, no polars) against the general reader (polars' ``read_ndjson``), CPU s of fresh
processes (issue 14).

The trace is generated outside the repository (default /tmp/simsrv_bench): Mooncake's fields
(``timestamp`` in ms, ``input_length``, ``output_length``, ``hash_ids``: one id per 512-token
block, the first blocks shared within a conversation so prefixes repeat), Poisson arrivals at
50 req/s, lognormal lengths; seeded. Each measurement is a fresh process that imports what it
needs and reads the whole trace (``sim.workload.trace.read_trace``); the readers alternate,
and the fastest and the median of REPEAT runs are printed. CPU is user + system time
(``os.wait4``: ``startup.cpu_s``), so pyarrow's reader threads count. A third column is the
reader simsrv chooses (the numeric one up to ``JSONL_NUMERIC_MAX_BYTES``). ``--against DIR``
adds another checkout's reading (whichever reader it chooses), alternating with the others.
Usage: python bench/jsonl.py [--requests 500 100000 1000000] [--repeat 5] [--dir D] [--against DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import startup  # bench/startup.py: a fresh process's CPU time

ROOT = Path(__file__).resolve().parents[1]

# a child: read the trace with one reader (the general one when the numeric one is switched
# off, the numeric one whatever the file's size; "default": whichever the checkout chooses)
READ = """
import sys, warnings
warnings.simplefilter("ignore")
import sim.workload.trace as trace
if sys.argv[2] == "general":
    trace._numeric_batches = lambda *a: None
if sys.argv[2] == "numeric":  # whatever the file's size
    trace.JSONL_NUMERIC_MAX_BYTES = float("inf")
a = trace.read_trace(sys.argv[1], "mooncake")
assert len(a) == int(sys.argv[3]), len(a)
assert sys.argv[2] == "default" or ("polars" in sys.modules) == (sys.argv[2] == "general"), sys.argv[2]
"""


def make_mooncake_jsonl(path: Path, n: int, seed: int = 0, block_tokens: int = 512) -> None:
    import numpy as np

    rng = np.random.default_rng(seed)
    t_ms = np.cumsum(rng.exponential(1000 / 50, n))
    inp = np.maximum(1, rng.lognormal(7.5, 1.0, n).astype(np.int64))
    out = np.maximum(1, rng.lognormal(5.0, 0.9, n).astype(np.int64))
    conv = rng.integers(0, max(1, n // 4), n)  # the conversation a request continues
    next_id = 0
    prefix: dict[int, list[int]] = {}
    with open(path, "w") as f:
        for i in range(n):
            blocks = -(-int(inp[i]) // block_tokens)
            shared = prefix.get(int(conv[i]), [])[:blocks]
            ids = shared + list(range(next_id, next_id + blocks - len(shared)))
            next_id += blocks - len(shared)
            prefix[int(conv[i])] = ids
            f.write(json.dumps({"timestamp": int(t_ms[i]), "input_length": int(inp[i]),
                                "output_length": int(out[i]), "hash_ids": ids}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, nargs="+", default=[500, 100_000, 1_000_000])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/simsrv_bench"))
    ap.add_argument("--against", type=Path, help="another checkout, read with the reader it chooses (A/B)")
    a = ap.parse_args()
    a.dir.mkdir(parents=True, exist_ok=True)
    pycache = a.dir / "pycache"  # bytecode cached there, as an installed package has it

    def cpu_s(path: Path, reader: str, n: int, checkout: Path) -> float:
        return startup.cpu_s(["-c", READ, str(path), reader, str(n)], checkout, pycache)

    cases = [("numeric reader (pyarrow)", "numeric", ROOT), ("general reader (polars)", "general", ROOT),
             ("the reader chosen (by size)", "default", ROOT)]
    if a.against:
        cases.append((f"{a.against.resolve().name}", "default", a.against.resolve()))
    print("| requests | file MB | " + " | ".join(f"{name}, CPU s fastest / median" for name, _, _ in cases)
          + " |\n|---|---|" + "---|" * len(cases))
    for n in a.requests:
        path = a.dir / f"mooncake_{n}.jsonl"
        if not path.exists():
            make_mooncake_jsonl(path, n)
        for _name, reader, checkout in cases:  # warm-up: bytecode written
            cpu_s(path, reader, n, checkout)
        runs: list[list[float]] = [[] for _ in cases]
        for _ in range(a.repeat):  # alternating
            for r, (_name, reader, checkout) in zip(runs, cases):
                r.append(cpu_s(path, reader, n, checkout))
        cells = [f"{min(r):.3f} / {statistics.median(r):.3f}" for r in runs]
        print(f"| {n:,} | {path.stat().st_size / 1e6:,.1f} | " + " | ".join(cells) + " |", flush=True)

if __name__ == "__main__":
    main()
