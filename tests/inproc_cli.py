"""``simsrv`` called in-process (``sim.cli.app.main(argv)``), its outcome classified as the black-box
fuzzers do: fast enough to run hundreds of cases in a test, with no subprocess per case."""

from __future__ import annotations

import contextlib
import io
import sys
import traceback
import warnings
from dataclasses import dataclass


@dataclass
class Outcome:
    code: int | str   # exit status, or "exception" when something escaped main()
    stderr: str
    stdout: str

    @property
    def lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]

    @property
    def clean(self) -> bool:
        """Success, or exit 2 with exactly one ``error:`` line (``warning:`` lines may precede it)
        and never a traceback."""
        if "Traceback" in self.stderr or self.code == "exception":
            return False
        if self.code == 0:
            return True
        errors = [line for line in self.lines if line.startswith("error:")]
        return (self.code == 2 and len(errors) == 1
                and all(line.startswith(("error:", "warning:")) for line in self.lines))


def simsrv(*args) -> Outcome:
    """Run ``simsrv ARGS`` in this process; never raises."""
    import sim.cli.app as cli

    cli._verbose["on"] = False
    err, out = io.StringIO(), io.StringIO()
    code: int | str = 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out), warnings.catch_warnings():
        warnings.simplefilter("default")
        import sim.cli.trace

        warnings.showwarning = sim.cli.trace._show_trace_warning  # as the CLI shows them (pytest replaces it)
        saved_argv = sys.argv
        sys.argv = ["simsrv", *map(str, args)]
        try:
            cli.main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # noqa: BLE001 - a test must see whatever escaped
            code = "exception"
            err.write("Traceback (escaped main)\n" + traceback.format_exc())
        finally:
            sys.argv = saved_argv
    return Outcome(code, err.getvalue(), out.getvalue())
