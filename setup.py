"""Build: simsrv with its simulation core compiled by mypyc (~3x faster; sim/compiled_core.py
lists the modules and says when the Python sources run instead; README.md, "Compiled core").

The plain install (``pip install -e .``) compiles: pyproject.toml's build requirements bring
mypy (mypyc, the compiler's Python side), and a C compiler with Python's headers does the rest
(about a minute of CPU on a 2-core machine: bench/README.md, "Install"). Where it cannot (no C
compiler, ``--no-build-isolation`` without mypy, a compiler error) the package installs as
Python alone and behaves the same, slower; the reason is kept in ``sim/core_build.txt`` and
shown when simsrv runs (pip hides a build's output). ``SIMSRV_COMPILE=0`` skips compiling.
Everything else is in pyproject.toml.
"""

import os
import runpy
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_NOTE = os.path.join(HERE, "sim", "core_build.txt")  # why the core is not compiled (read at run time)


def note(reason: str | None) -> None:
    """Keep (or, compiled, clear) the reason the core stays Python for sim/compiled_core.py."""
    if reason is None:
        if os.path.exists(BUILD_NOTE):
            os.remove(BUILD_NOTE)
        return
    print(f"simsrv: {reason}; the simulation core stays Python", file=sys.stderr)
    with open(BUILD_NOTE, "w", encoding="utf-8") as f:
        f.write(reason + "\n")


def core_extensions() -> list:
    if os.environ.get("SIMSRV_COMPILE") == "0":
        note("SIMSRV_COMPILE=0 at install")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        note("mypy (mypyc) was not in the build environment (pip install --no-build-isolation without mypy==1.13.0)")
        return []
    core = runpy.run_path(os.path.join(HERE, "sim", "compiled_core.py"))["CORE_MODULES"]
    try:
        # type-checks the core (pyproject.toml [tool.mypy]) and generates its C; no mypy cache
        extensions = mypycify(["--cache-dir", os.devnull, *core], opt_level="3")
    except BaseException as e:  # mypy reports type errors by exiting
        note(f"mypyc did not compile the core ({e!r})")
        return []
    note(None)
    return extensions


class OptionalBuildExt(build_ext):
    """build_ext whose compiler failure leaves the core Python, with the reason noted."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # no compiler (CompileError, PlatformError...), missing headers
            note(f"the C compiler failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")


setup(ext_modules=core_extensions(), cmdclass={"build_ext": OptionalBuildExt})
