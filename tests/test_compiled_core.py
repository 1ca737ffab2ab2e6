"""The mypyc-compiled simulation core (sim/compiled_core.py, setup.py): when the Python sources
run instead, and that the compiled core gives byte-identical runs.

The equivalence test compiles nothing: it runs the core this checkout was installed with
(``pip install -e .`` compiles it where a C compiler exists) against its Python sources
(``SIMSRV_PURE_PYTHON=1``), the same package both ways. Where the installed core is not
compiled it skips, saying why; ``SIMSRV_REQUIRE_COMPILED=1`` (set by .ci/run) makes that a
failure instead, so CI always checks it."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from sim import compiled_core
from sim.compiled_core import CORE_MODULES, why_pure
from tests.conftest import ROOT, without_wall_clock

SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")


def _tree(tmp_path: Path, compiled: list[str]) -> Path:
    for rel in CORE_MODULES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    for rel in compiled:
        p = tmp_path / rel
        so = p.with_name(p.stem + SUFFIX)
        so.write_bytes(b"")
        os.utime(so, (p.stat().st_mtime + 10, p.stat().st_mtime + 10))
    return tmp_path


def test_the_python_sources_run_unless_every_module_is_compiled_and_current(tmp_path):
    assert why_pure(_tree(tmp_path, []), {}) == compiled_core.NOT_COMPILED
    (tmp_path / "sim" / "core_build.txt").write_text("SIMSRV_COMPILE=0 at install\n")
    assert why_pure(tmp_path, {}) == "not compiled at install: SIMSRV_COMPILE=0 at install"
    (tmp_path / "sim" / "core_build.txt").unlink()
    assert why_pure(_tree(tmp_path, list(CORE_MODULES[:3])), {}) == f"only 3 of {len(CORE_MODULES)} modules compiled"
    root = _tree(tmp_path, list(CORE_MODULES))
    assert why_pure(root, {}) is None
    assert why_pure(root, {"SIMSRV_PURE_PYTHON": "1"}) == "SIMSRV_PURE_PYTHON is set"
    edited = root / CORE_MODULES[4]
    os.utime(edited, (edited.stat().st_mtime + 60, edited.stat().st_mtime + 60))  # edited after the build
    assert why_pure(root, {}) == f"{CORE_MODULES[4]} changed after the core was compiled (pip install -e . rebuilds it)"


def test_classes_subclassed_outside_the_core_take_no_float_defaults():
    # mypyc 1.13 (and 2.4) passes 0.0 for an omitted float argument when compiled code calls a
    # method of a class that allows interpreted subclasses on an interpreted subclass's
    # instance (a policy module's scheduler): such methods must not have float defaults
    bad = []
    for rel in CORE_MODULES:
        for cls in ast.walk(ast.parse((ROOT / rel).read_text())):
            if not isinstance(cls, ast.ClassDef) or "allow_interpreted_subclasses" not in ast.unparse(cls.decorator_list):
                continue
            for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                args = fn.args.args[len(fn.args.args) - len(fn.args.defaults):] + fn.args.kwonlyargs
                defaults = fn.args.defaults + [d for d in fn.args.kw_defaults if d is not None]
                bad += [f"{rel}: {cls.name}.{fn.name}({a.arg})" for a, _ in zip(args, defaults)
                        if a.annotation is not None and "float" in ast.unparse(a.annotation)]
    assert not bad


# one run of each kind of engine the core models: policies, preemption, prefix caching, sliding
# windows, disaggregation, DP attention with expert parallelism, pipelines, multi-step, SGLang,
# and the routers
RUNS = [
    ("chat.yaml", "--policy", "chunked", "--chunk", "512", "--set", "workload.trace.sample=1500"),
    ("chat.yaml", "--set", "workload.trace.sample=1500", "--set", "engine.admission=sglang"),
    ("chat.yaml", "--set", "model=gemma-2-9b", "--set", "workload.trace.sample=800"),
    ("chat.yaml", "--set", "engine.num_scheduler_steps=10", "--set", "workload.trace.sample=800"),
    ("interference.yaml",),
    ("disaggregated.yaml",),
    ("long_context.yaml", "--set", "engine.preemption_mode=swap"),
    ("prefix_cache.yaml",),
    ("deepseek_v3_dp8_ep.yaml",),
    ("batching.yaml",),
    ("pipeline_405b.yaml",),
    # the routers: cache-aware (its own prefix trees), the engines' true caches, free KV, random
    ("routing.yaml",),
    ("routing.yaml", "--set", "cluster.router=prefix_affinity"),
    ("routing.yaml", "--set", "cluster.router=least_kv"),
    ("routing.yaml", "--set", "cluster.router=random"),
]


def _run(out: Path, args: tuple[str, ...], pure: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SIMSRV_PURE_PYTHON"}
    env["PYTHONPATH"] = str(ROOT)
    if pure:
        env["SIMSRV_PURE_PYTHON"] = "1"
    scenario, *rest = args
    p = subprocess.run([sys.executable, "-m", "sim", "run", str(ROOT / "scenarios" / scenario), *rest,
                        "--out", str(out), "-q"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr


def _outputs(out: Path) -> dict[str, object]:
    result = without_wall_clock(json.loads((out / "result.json").read_text()))
    return {"requests": (out / "requests.parquet").read_bytes(), "steps": (out / "steps.parquet").read_bytes(),
            "result": result}


def test_the_compiled_core_runs_byte_for_byte_what_the_python_sources_run(tmp_path):
    if compiled_core.pure_reason is not None:
        if os.environ.get("SIMSRV_REQUIRE_COMPILED"):
            pytest.fail(f"SIMSRV_REQUIRE_COMPILED is set but the core runs Python ({compiled_core.pure_reason})")
        pytest.skip(f"the installed core is not compiled: {compiled_core.pure_reason}")
    for i, args in enumerate(RUNS):
        _run(tmp_path / f"c{i}", args, pure=False)
        _run(tmp_path / f"p{i}", args, pure=True)
        compiled, pure = _outputs(tmp_path / f"c{i}"), _outputs(tmp_path / f"p{i}")
        for name in compiled:
            assert compiled[name] == pure[name], f"{' '.join(args)}: {name} differs"


def test_this_process_says_which_core_it_runs():
    assert compiled_core.describe() in ("compiled", f"Python ({compiled_core.pure_reason})")
