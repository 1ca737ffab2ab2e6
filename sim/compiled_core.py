"""The compiled simulation core: which modules the build compiles with mypyc, and whether this
process runs them or their Python sources.

Why: the per-step work (scheduler, KV manager, cost model, replica loop, TTFT accounting,
results) is many small exact calls; compiled by mypyc (setup.py, at every install that has a C
compiler) the same code runs ~3x faster (bench/README.md, "Compiled core, fifth round"). The
compiled modules are built from, and must behave exactly as, the ``.py`` files beside them;
the test suite runs the installed package both ways and compares the runs byte for byte
(tests/test_compiled_core.py).

This module is the one seam between the two: ``pure_reason`` (None when the compiled core
runs) is the single flag, decided once per process by ``choose``; no other module asks, and the
two cores run one code path (tests/test_one_seam.py; ARCHITECTURE.md section 8). The Python sources run
instead, for every module of the core together (compiled modules call each other directly, so
the core is never mixed), when:

- ``SIMSRV_PURE_PYTHON`` is set (non-empty);
- the core was not built (no C compiler at install, ``SIMSRV_COMPILE=0``: the build's reason
  is in ``sim/core_build.txt``);
- a source is newer than its compiled module (an edited checkout: ``pip install -e .`` again
  rebuilds it), so an edit always takes effect;
- the compiled modules fail to load.

``simsrv --version`` says which (``core: compiled`` or ``core: Python (reason)``), and
``simsrv run`` says so under its summary when the reason is not the user's own setting.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

try:  # mypyc's class options (allow_interpreted_subclasses): read by the compiler only
    from mypy_extensions import mypyc_attr
except ImportError:  # installed without mypy: the same classes, not compiled
    def mypyc_attr(*_args: object, **_kwargs: object):  # type: ignore[no-redef]
        return lambda cls: cls

# module paths relative to the repository root, in the order mypyc is given them
CORE_MODULES = (
    "sim/core/request.py", "sim/core/kv.py", "sim/core/ttft.py",
    "sim/policies/decode_set.py", "sim/policies/admission.py", "sim/policies/base.py",
    "sim/policies/chunked.py", "sim/policies/continuous.py",
    "sim/cost/runs.py", "sim/cost/decode_attention.py", "sim/cost/roofline.py", "sim/cost/dp_ep.py",
    "sim/engine/results.py", "sim/engine/cluster.py",
    "sim/engine/clock.py", "sim/engine/calls.py", "sim/engine/recorder.py", "sim/engine/columns.py",
    "sim/engine/arrivals.py", "sim/cost/tables.py", "sim/cost/arch.py", "sim/cost/calibrated.py",
    "sim/cost/shapes.py", "sim/engine/router.py",
)
_NAMES = {p[:-3].replace("/", "."): p for p in CORE_MODULES}
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the directory holding sim/

NOT_BUILT = "not compiled at install"  # every reason that no compiled module exists starts so
NOT_COMPILED = f"{NOT_BUILT} (it needs a C compiler and Python's headers: README, Compiled core)"
USER_CHOICE = "SIMSRV_PURE_PYTHON is set"
_BUILD_NOTE = "core_build.txt"  # setup.py's reason for not compiling, beside this module

# why this process runs the Python sources (None: it runs the compiled core); set by choose()
pure_reason: str | None = None


def _compiled_path(source: Path) -> Path | None:
    """The extension module built from ``source`` beside it, if any."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = source.with_name(source.stem + suffix)
        if p.exists():
            return p
    return None


def why_pure(root: Path = _PACKAGE_ROOT, environ: os._Environ | dict = os.environ) -> str | None:
    """Why the core must run from its Python sources here; None if the compiled one may run."""
    if environ.get("SIMSRV_PURE_PYTHON"):
        return USER_CHOICE
    built = 0
    for rel in CORE_MODULES:
        source = root / rel
        compiled = _compiled_path(source)
        if compiled is None:
            continue
        built += 1
        if source.stat().st_mtime > compiled.stat().st_mtime:
            return f"{rel} changed after the core was compiled (pip install -e . rebuilds it)"
    if built == 0:
        note = root / "sim" / _BUILD_NOTE
        if note.is_file():
            return f"{NOT_BUILT}: {note.read_text(encoding='utf-8', errors='replace').strip()}"
        return NOT_COMPILED
    if built < len(CORE_MODULES):
        return f"only {built} of {len(CORE_MODULES)} modules compiled"
    return None


class _SourceFinder:
    """Finds the core's modules as their ``.py`` sources, never their compiled extensions."""

    @staticmethod
    def find_spec(name: str, path=None, target=None):
        rel = _NAMES.get(name)
        if rel is None:
            return None
        return importlib.util.spec_from_file_location(name, _PACKAGE_ROOT / rel)


def choose() -> None:
    """Decide once per process, before any core module is imported (``sim/__init__.py``)."""
    global pure_reason
    reason = why_pure()
    if reason is None:
        try:  # every core module shares one compiled library: if one loads, all do
            importlib.import_module("sim.core.request")
        except ImportError as e:
            sys.modules.pop("sim.core.request", None)
            reason = f"the compiled core does not load ({e})"
    if reason is not None and compiled_present(reason):  # no extension to pass over otherwise
        sys.meta_path.insert(0, _SourceFinder())
    pure_reason = reason


def compiled_present(reason: str) -> bool:
    """Whether compiled modules may exist beside the sources though the Python ones must run."""
    return not reason.startswith(NOT_BUILT)


def user_chose_python() -> bool:
    """The Python sources run because the user said so (no note needed)."""
    return pure_reason == USER_CHOICE


def describe() -> str:
    """``compiled`` or ``Python (why)``: for ``simsrv --version``."""
    return "compiled" if pure_reason is None else f"Python ({pure_reason})"
