"""The plain forms of ``simsrv run`` read without typer (start-up, issue 14).

Why: typer costs ~0.045 s CPU per process (its import, then building every command's click
parser and a pydantic adapter per option), about a tenth of a short run's start-up. The common
invocation, ``simsrv run SCENARIO`` with ``--policy P``, ``--chunk N``, ``--set K=V``...,
``--out DIR``, ``-q``/``--quiet`` and ``--force`` in any order, is read here into exactly the
arguments typer passes to ``sim.cli.run_cmd.run_command`` (tests/test_run_argv.py checks both
readings agree, and that this table matches the command sim/cli/app.py declares). Anything else
(``--help``, ``-v``, ``--opt=value``, an option given twice, a value starting with ``-``, an
empty value, a number that is not plain digits, a shell-completion request...) returns None and
typer reads it, with its own messages for bad usage.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# option -> (run_command's parameter, what it takes); as ``run`` in sim/cli/app.py declares them
RUN_OPTIONS: dict[str, tuple[str, str]] = {
    "--policy": ("policy", "text"),
    "--chunk": ("chunk", "integer"),
    "--set": ("set_", "text, repeatable"),
    "--out": ("out", "path"),
    "--quiet": ("quiet", "flag"),
    "-q": ("quiet", "flag"),
    "--force": ("force", "flag"),
}


def _integer(text: str) -> int | None:
    """``text`` as the int typer reads from it, for plain digits only (no sign, no leading zero,
    no ``_``, at most 18 digits: within int64); None otherwise."""
    if text.isascii() and text.isdigit() and len(text) <= 18 and (text == "0" or text[0] != "0"):
        return int(text)
    return None


def _completion_requested() -> bool:
    """Typer answers shell completion when ``_<PROG>_COMPLETE`` is set (typer/core.py
    ``_typer_main_shell_completion``): any such variable sends the command line to typer."""
    return any(k.startswith("_") and k.endswith("_COMPLETE") and v for k, v in os.environ.items())


def parse_run_argv(argv: list[str]) -> dict[str, Any] | None:
    """``run_command``'s keyword arguments for ``argv`` (the words after ``simsrv``) when it is
    a plain ``run`` command line, else None (typer reads it)."""
    if not argv or argv[0] != "run" or _completion_requested():
        return None
    kw: dict[str, Any] = {"scenario": None, "policy": None, "chunk": None, "set_": [], "out": None,
                          "quiet": False, "force": False}
    seen: set[str] = set()
    i = 1
    while i < len(argv):
        word = argv[i]
        if word in RUN_OPTIONS:
            name, kind = RUN_OPTIONS[word]
            if name in seen and kind != "text, repeatable":
                return None
            seen.add(name)
            if kind == "flag":
                kw[name] = True
                i += 1
                continue
            if i + 1 == len(argv) or not argv[i + 1] or argv[i + 1].startswith("-"):
                return None
            value = argv[i + 1]
            if kind == "integer":
                kw[name] = _integer(value)
                if kw[name] is None:
                    return None
            elif kind == "path":
                kw[name] = Path(value)
            elif kind == "text":
                kw[name] = value
            else:
                kw[name].append(value)
            i += 2
        elif word and not word.startswith("-") and kw["scenario"] is None:
            kw["scenario"] = Path(word)
            i += 1
        else:  # an unknown option, a second argument, an empty word: typer's to read (or refuse)
            return None
    return kw if kw["scenario"] is not None else None
