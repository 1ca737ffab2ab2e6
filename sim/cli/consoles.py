"""The command line's rich consoles, built when first used.

Why: importing ``rich.console`` costs ~0.015 s CPU, and a quiet run (``simsrv run -q``) that
warns about nothing prints nothing; a run that prints pays it when it prints (issue 14,
tests/test_startup.py).
"""

from __future__ import annotations

import os
import sys
from typing import Any


class LazyConsole:
    """Stands for ``rich.console.Console(**kwargs)``, which it builds on the first attribute
    asked of it (``print``, ``status``, ``is_terminal``...) and answers from then on.
    Pass ``.console`` where rich wants a real ``Console`` (``Progress(console=...)``)."""

    def __init__(self, **kwargs: Any):
        self._kwargs = kwargs
        self._console = None

    @property
    def console(self):
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._kwargs)
        return self._console

    def __getattr__(self, name: str) -> Any:  # only for names not set in __init__
        return getattr(self.console, name)


def stderr_may_be_terminal() -> bool:
    """False only where rich's ``Console(stderr=True).is_terminal`` is surely False, decided
    without importing rich: stderr is no tty and neither ``TTY_COMPATIBLE=1`` nor ``FORCE_COLOR``
    (set, non-empty) makes rich take it for a terminal (rich/console.py ``is_terminal``; its
    other branches only answer False). True means: ask rich."""
    env = os.environ
    if env.get("TTY_COMPATIBLE") == "1" or env.get("FORCE_COLOR"):
        return True
    isatty = getattr(sys.stderr, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream (rich answers False too)
        return False


# the consoles of ``simsrv run``, ``explain`` and the entry point's error lines
out_console = LazyConsole()
err_console = LazyConsole(stderr=True)
