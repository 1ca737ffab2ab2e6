"""A trace's warnings (``sim.workload.trace.TraceWarning``: rows left out, values clipped) as
one ``warning:`` line each on stderr, in every command; other warnings as Python shows them.
Installed when the command line is imported (``sim.cli.entry``)."""

from __future__ import annotations

import warnings

from sim.cli.consoles import err_console


def show_trace_warning(message, category, filename, lineno, file=None, line=None):
    from sim.workload.trace import TraceWarning

    if issubclass(category, TraceWarning):
        err_console.print(f"warning: {message}", markup=False, highlight=False, emoji=False, soft_wrap=True)
    else:
        _previous_showwarning(message, category, filename, lineno, file, line)


_previous_showwarning = warnings.showwarning
warnings.showwarning = show_trace_warning
