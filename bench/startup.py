"""Start-up: CPU time of fresh processes that do (almost) nothing but start (issue 14).

Rows: a bare interpreter (`python -c pass`: the floor this machine's site-packages set),
`simsrv --version`, `simsrv run` on a 10-request synthetic scenario (start-up, a few
steps, writing the run directory), and the same run's start-up alone: the process's CPU time
when the simulation starts (``time.process_time()`` at the call of
``sim.engine.cluster.simulate``: imports, the scenario, the workload and the cost model built).
CPU is user + system time of the child (``os.wait4``); the fastest and the median of REPEAT runs
are printed (CPU time is less disturbed than wall time on a shared machine, but not immune).
``--against DIR`` measures another checkout too, alternating runs, for A/B.
Bytecode caching is on, as an installed package has it (``PYTHONDONTWRITEBYTECODE`` is
dropped and the ``.pyc`` files go to a temporary ``PYTHONPYCACHEPREFIX``; one warm-up run per
case fills it): without it every process compiles simsrv's modules from source again.
``--scenario FILE`` adds a run of that scenario (e.g. a trace replay), whole and until its simulation
starts.
Usage: python bench/startup.py [--repeat 7] [--against /path/to/other/checkout] [--scenario FILE ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TINY = """name: tiny
seed: 0
model: llama-3-8b
hardware: {gpu: h100-sxm}
workload:
  synthetic:
    num_requests: 10
    request_rate: 4.0
    input_tokens: {dist: fixed, value: 100}
    output_tokens: {dist: fixed, value: 20}
"""


def child_env(checkout: Path, pycache: Path) -> dict[str, str]:
    """The environment of a measured process: ``checkout``'s code, bytecode cached under ``pycache``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=str(checkout), PYTHONPYCACHEPREFIX=str(pycache / checkout.name))
    return env


def cpu_s(args: list[str], checkout: Path, pycache: Path) -> float:
    proc = subprocess.Popen([sys.executable, *args], cwd=checkout, env=child_env(checkout, pycache),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _pid, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{args}: {proc.stderr.read().decode()}")
    return usage.ru_utime + usage.ru_stime


# ``python -m sim`` with the CPU time printed to stderr ("cpu-at-simulate SECONDS") at the
# simulation's start;
# the settings that ``sim.cli.entry.main`` makes before a run's imports are made first
UNTIL_SIMULATION = """
import gc, os, sys, time
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
gc.disable()
import sim.engine.cluster as cluster
simulate = cluster.simulate
def timed(*args, **kwargs):
    print("cpu-at-simulate", time.process_time(), file=sys.stderr)
    return simulate(*args, **kwargs)
cluster.simulate = timed
from sim.cli.entry import main
sys.argv = ["simsrv", *sys.argv[1:]]
main()
"""


def until_simulation_s(args: list[str], checkout: Path, pycache: Path) -> float:
    """CPU seconds of ``python -m sim ARGS`` when the simulation starts (``UNTIL_SIMULATION``)."""
    out = subprocess.run([sys.executable, "-c", UNTIL_SIMULATION, *args], cwd=checkout,
                         env=child_env(checkout, pycache),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{args}: {out.stderr}")
    return float(next(line.split()[1] for line in out.stderr.splitlines() if line.startswith("cpu-at-simulate ")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--against", type=Path, help="another checkout to measure alternately (A/B)")
    ap.add_argument("--scenario", type=Path, action="append", default=[],
                    help="also a `simsrv run` of this scenario file, whole and until the simulation starts (repeatable)")
    a = ap.parse_args()
    checkouts = [ROOT] + ([a.against.resolve()] if a.against else [])
    with tempfile.TemporaryDirectory() as d:
        sc = Path(d) / "tiny.yaml"
        sc.write_text(TINY)
        run = ["run", str(sc), "--out", str(Path(d) / "run"), "--force", "-q"]
        cases = [("python -c pass", ["-c", "pass"], cpu_s),
                 ("simsrv --version", ["-m", "sim", "--version"], cpu_s),
                 ("simsrv run (10 requests)", ["-m", "sim", *run], cpu_s),
                 ("simsrv run (10 requests) until the simulation starts", run, until_simulation_s)]
        for path in a.scenario:
            run = ["run", str(path.resolve()), "--out", str(Path(d) / "run"), "--force", "-q"]
            label = f"{path.parent.name}/{path.name}"
            cases += [(f"simsrv run {label}", ["-m", "sim", *run], cpu_s),
                      (f"simsrv run {label} until the simulation starts", run, until_simulation_s)]
        print("| process | " + " | ".join(f"CPU s, fastest / median ({c.name})" for c in checkouts) + " |")
        print("|---|" + "---|" * len(checkouts))
        for name, args, measure in cases:
            for c in checkouts:  # warm-up: bytecode written
                measure(args, c, Path(d))
            runs: list[list[float]] = [[] for _ in checkouts]
            for _ in range(a.repeat):  # alternating between the checkouts
                for r, c in zip(runs, checkouts):
                    r.append(measure(args, c, Path(d)))
            print(f"| `{name}` | " + " | ".join(f"{min(r):.3f} / {statistics.median(r):.3f}" for r in runs) + " |",
                  flush=True)


if __name__ == "__main__":
    main()
