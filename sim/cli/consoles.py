"""The command line's rich consoles, built when first used.

Why: importing ``rich.console`` costs ~0.015 s CPU, and a quiet run (``simsrv run -q``) that
warns about nothing prints nothing; a run that prints pays it when it prints (issue 14,
tests/test_startup.py).
"""

from __future__ import annotations

import os
import sys
from typing import Any

# Output to a file or a pipe: rich would lay tables out for 80 columns (its default when it
# finds no terminal), wrapping every cell and cutting labels to "request_rate=…". Tables are
# laid out this wide instead (a rich table takes only the width it needs) and text lines are
# never wrapped. A COLUMNS variable, or a width given to the console, still decides.
NON_TERMINAL_WIDTH = 240

# The Ray extra's install command as help text shows it: typer renders help with rich markup,
# where a bare [ray] is a style tag and vanished ("pip install 'simsrv'"); \[ escapes it.
RAY_INSTALL_HELP = "pip install 'simsrv\\[ray]'"


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

            console = Console(**self._kwargs)
            if "width" not in self._kwargs and not os.environ.get("COLUMNS") and not console.is_terminal:
                console.width = NON_TERMINAL_WIDTH
                console.soft_wrap = True
            self._console = console
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
