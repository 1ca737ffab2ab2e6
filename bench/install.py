"""Install: wall and CPU time of the README's install command in a fresh virtual environment,
then of the first run of the main job, and which core the install gave (issue 39).

A copy of the checkout's tracked files (no build outputs) goes to a temporary directory; a new
venv there runs ``pip install -e .`` (build isolation: pip fetches setuptools and mypy for the
build, then gcc compiles the core) and ``simsrv run scenarios/chat.yaml --policy chunked
--chunk 512``. CPU is user + system time of the child processes (``os.wait4`` through
``resource.getrusage(RUSAGE_CHILDREN)`` deltas). Packages come from pip's cache when it has
them, as on a machine that installed anything before; ``--no-cache`` measures a cold cache.
Usage: python bench/install.py [--no-cache] [--keep]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(cmd: list[str], cwd: Path, env: dict | None = None) -> tuple[float, float, subprocess.CompletedProcess]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    return wall, cpu, p


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-cache", action="store_true", help="pip --no-cache-dir (a cold package cache)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="simsrv-install-"))
    try:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        for rel in filter(None, files.decode().split("\0")):
            src = ROOT / rel
            if src.is_file():
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, tmp / rel)
        subprocess.run([sys.executable, "-m", "venv", str(tmp / ".venv")], check=True)
        pip = [str(tmp / ".venv" / "bin" / "pip"), "install", "-q", "-e", "."]
        if args.no_cache:
            pip.insert(3, "--no-cache-dir")
        env = {k: v for k, v in os.environ.items() if k not in ("SIMSRV_COMPILE", "SIMSRV_PURE_PYTHON")}
        w_install, c_install, _ = timed(pip, tmp, env)
        simsrv = str(tmp / ".venv" / "bin" / "simsrv")
        _, _, version = timed([simsrv, "--version"], tmp, env)
        w_run, c_run, _ = timed([simsrv, "run", "scenarios/chat.yaml", "--policy", "chunked", "--chunk", "512",
                                 "--out", str(tmp / "run"), "-q"], tmp, env)
        print(f"cores: {os.cpu_count()}")
        print(version.stdout.strip().replace("\n", "; "))
        print(f"pip install -e .   wall {w_install:6.1f} s   CPU {c_install:6.1f} s")
        print(f"first run          wall {w_run:6.1f} s   CPU {c_run:6.1f} s")
        print(f"install + run      wall {w_install + w_run:6.1f} s")
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
