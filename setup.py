"""Build: simsrv as Python; with ``SIMSRV_COMPILE=1`` also its simulation core compiled by
mypyc, ~3x faster (sim/compiled_core.py lists the modules and says when the Python sources
run instead; README.md, "Compiled core"). Everything else is in pyproject.toml.

The compiled core is opt-in: it needs mypy in the installing environment
(``pip install mypy==1.13.0 setuptools wheel && SIMSRV_COMPILE=1 pip install --no-build-isolation -e .``)
and a C compiler, and compiling takes a few minutes. If either is missing or compiling fails, the package installs as
Python alone and behaves the same, slower.
"""

import os
import runpy
import sys

from setuptools import setup


def core_extensions() -> list:
    if os.environ.get("SIMSRV_COMPILE") != "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("simsrv: SIMSRV_COMPILE=1 but mypy is not installed here (pip install mypy==1.13.0 setuptools wheel, "
              "then pip install --no-build-isolation); the simulation core stays Python", file=sys.stderr)
        return []
    here = os.path.dirname(os.path.abspath(__file__))
    core = runpy.run_path(os.path.join(here, "sim", "compiled_core.py"))["CORE_MODULES"]
    try:
        # type-checks the core (pyproject.toml [tool.mypy]) and generates its C; no mypy cache
        extensions = mypycify(["--cache-dir", os.devnull, *core], opt_level="3")
    except BaseException as e:  # mypy reports type errors by exiting
        print(f"simsrv: the simulation core was not compiled ({e!r}); it stays Python", file=sys.stderr)
        return []
    for ext in extensions:
        ext.optional = True  # a compiler failure skips it; sim/compiled_core.py then runs Python
    return extensions


setup(ext_modules=core_extensions())
