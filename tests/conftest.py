"""Shared fixtures: small scenarios built as dicts, and the repository root."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# summary (result.json) keys that measure the clock and the machine, not the simulation
WALL_CLOCK_KEYS = ("date", "simsrv_wall_s", "simsrv_requests_per_wall_s")


def without_wall_clock(summary: dict) -> dict:
    """The summary less ``WALL_CLOCK_KEYS``: what the same scenario and seed must reproduce."""
    return {k: v for k, v in summary.items() if k not in WALL_CLOCK_KEYS}


def _report_compiled_frames() -> None:
    """With the compiled core (sim/compiled_core.py) a traceback through it has entries without
    a line number (mypyc's frames); pytest 8's failure report subtracts 1 from it and stops the
    whole session (INTERNALERROR). Such entries are reported at line 0 instead."""
    import sim.compiled_core
    if sim.compiled_core.pure_reason is not None:
        return
    from _pytest._code import code

    def lineno(self) -> int:
        n = self._rawentry.tb_lineno
        return -1 if n is None else n - 1

    code.TracebackEntry.lineno = property(lineno)


_report_compiled_frames()


def small_scenario(**over) -> dict:
    """A small synthetic scenario dict; keyword arguments replace top-level sections."""
    raw = {
        "name": "t", "seed": 1, "model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
        "engine": {"policy": "chunked", "max_num_batched_tokens": 512},
        "workload": {"synthetic": {
            "num_requests": 200, "request_rate": 20,
            "input_tokens": {"dist": "lognormal", "mean": 600, "sigma": 0.8, "max": 4000},
            "output_tokens": {"dist": "lognormal", "mean": 100, "sigma": 0.8, "max": 1000},
        }},
    }
    raw.update(over)
    return raw


@pytest.fixture
def root() -> Path:
    return ROOT


def in_python_core(test):
    """Run ``test`` with the core's Python sources: in this process when they run here, else in
    a child process with ``SIMSRV_PURE_PYTHON=1`` (a test that replaces a scheduler's or KV
    manager's methods on an instance, which the compiled core's classes do not allow). The
    two cores compute the same (tests/test_compiled_core.py): the test checks the logic."""
    import functools
    import os
    import subprocess
    import sys

    @functools.wraps(test)
    def run(*args, **kwargs):
        import sim.compiled_core

        if sim.compiled_core.pure_reason is not None:
            return test(*args, **kwargs)
        node = f"{test.__module__.replace('.', '/')}.py::{test.__name__}"
        env = {**os.environ, "SIMSRV_PURE_PYTHON": "1", "PYTHONPATH": str(ROOT)}
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", node], cwd=ROOT,
                           env=env, capture_output=True, text=True)
        assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    return run
