"""``simsrv run`` says, under its summary, when it ran the Python core for a reason the user did
not choose (setup.py could not compile at install; an edited checkout): pip hides the build's
own message (issue 39)."""

from __future__ import annotations

import os
import subprocess
import sys

import yaml

from sim import compiled_core
from tests.conftest import ROOT, small_scenario


def _run(tmp_path, env: dict) -> subprocess.CompletedProcess:
    s = tmp_path / "s.yaml"
    raw = small_scenario()
    raw["workload"]["synthetic"]["num_requests"] = 5
    s.write_text(yaml.safe_dump(raw))
    full_env = {k: v for k, v in os.environ.items() if k != "SIMSRV_PURE_PYTHON"}
    full_env.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "sim", "run", str(s), "--out", str(tmp_path / "o"), "--force"],
                          cwd=ROOT, env=full_env, capture_output=True, text=True)


def test_run_names_the_python_core_unless_the_user_chose_it(tmp_path):
    chosen = _run(tmp_path, {"SIMSRV_PURE_PYTHON": "1"})
    assert chosen.returncode == 0 and "core: Python" not in chosen.stdout
    default = _run(tmp_path, {})
    assert default.returncode == 0
    lines = [line for line in default.stdout.splitlines() if line.startswith("core: ")]
    if compiled_core.pure_reason is None or compiled_core.user_chose_python():
        assert lines == []  # this checkout runs the compiled core: nothing to say
    else:
        assert lines == [f"core: Python, ~3x slower than the compiled one ({compiled_core.pure_reason})"]


def test_the_builds_reason_is_the_runs_reason(tmp_path):
    for rel in compiled_core.CORE_MODULES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert compiled_core.why_pure(tmp_path, {}) == compiled_core.NOT_COMPILED
    (tmp_path / "sim" / "core_build.txt").write_text("the C compiler failed (CompileError: gcc: not found)\n")
    reason = compiled_core.why_pure(tmp_path, {})
    assert reason == "not compiled at install: the C compiler failed (CompileError: gcc: not found)"
    assert not compiled_core.compiled_present(reason)


def test_setup_keeps_its_reason_for_not_compiling(tmp_path):
    (tmp_path / "sim").mkdir()
    for rel in ("setup.py", "sim/compiled_core.py"):
        (tmp_path / rel).write_text((ROOT / rel).read_text())
    p = subprocess.run([sys.executable, "setup.py", "--name"], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "SIMSRV_COMPILE": "0"})
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "sim" / "core_build.txt").read_text() == "SIMSRV_COMPILE=0 at install\n"
    assert "the simulation core stays Python" in p.stderr
