"""The ``simsrv`` entry point ``main``: runs the command line and turns its errors into one
line on stderr (exit status 2; 1 for a stalled simulation; 130 for Ctrl-C), the traceback only
with ``--verbose``.

A plain ``simsrv run`` command line (``sim.cli.run_argv``) and ``simsrv --version`` run
without importing typer (start-up, issue 14); every other one goes through the Typer
application (``sim.cli.app``).
"""

from __future__ import annotations

import errno
import gc
import os
import signal
import sys
from typing import Any

import sim.cli.trace_warnings  # noqa: F401 - a trace's warnings as one line each, in every command
from sim.cli.consoles import err_console
from sim.errors import SimulationStalled, UserError

_verbose = {"on": False}  # --verbose, set by the Typer application's callback


def main(argv: list[str] | None = None) -> None:
    """The ``simsrv`` entry point; ``argv`` (default ``sys.argv[1:]``) lets tests call it in-process."""
    from sim.cli.run_argv import parse_run_argv

    words = sys.argv[1:] if argv is None else list(argv)
    _shown_streams()
    if argv is None:  # the process's own entry point (tests calling main() keep their handlers)
        signal.signal(signal.SIGTERM, _terminated)
        # One BLAS thread unless the user says otherwise, set before numpy is imported: simsrv's
        # numpy work is element-wise (no BLAS), sweep workers are parallel processes already, and
        # OpenBLAS's pool costs each process ~0.07-0.1 s of CPU to start (bench/startup.py).
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        # No pydantic plugins unless the user names them (PYDANTIC_DISABLE_PLUGINS set, even
        # empty, is left as it is): pydantic looks for them at the first model class by reading
        # every installed distribution's entry points (importlib.metadata), 6-9 ms of CPU with
        # 118 distributions installed (bench/README.md, "Start-up: packed catalogues, no pydantic
        # plugin search"), and simsrv's scenario models need none.
        os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    if words == ["--version"]:  # what the Typer application's eager --version does, without typer
        print_version()
        return
    plain_run = parse_run_argv(words)
    if argv is None and plain_run is not None:
        # A one-shot process: no cyclic garbage collection. The simulation runs with the
        # collector off anyway (sim/run.py) and leaves no cyclic garbage but its own object
        # graph, once; turning it back on made the collector traverse every object the run
        # keeps (the cost model's memos), and the imports before it cost ~90 collections:
        # bench/README.md, "Garbage collection".
        gc.disable()
    try:
        if plain_run is not None:
            rc = _run_without_typer(plain_run)
        else:
            from sim.cli.app import app

            rc = app(args=argv, standalone_mode=False)
    except UserError as e:
        _fail(str(e))
    except SimulationStalled as e:  # a model defect, not bad input: one line, exit status 1
        _fail(str(e), status=1)
    except KeyboardInterrupt:
        _interrupted()
    except SystemExit:
        raise
    except OSError as e:  # an output path that cannot be written, a directory given as a file...
        _fail(f"{e.filename or ''}: {e.strerror or e}".lstrip(": "))
    except Exception as e:
        # command-line usage errors (typer's click): unknown option or command, bad value
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):
            if type(e).__name__ == "Abort":
                sys.exit(1)
            _fail(e.format_message())
        raise
    if argv is None:
        # The process ends here: the interpreter's garbage collection at exit would traverse
        # every object left (modules, the run's memos) only to free them with the process.
        # Frozen, they are skipped (0.06 s of a 10-request run's 0.38; 0.2 s at 100k requests:
        # bench/README.md, "Garbage collection").
        gc.freeze()
    # typer turns Ctrl-C inside a command into exit code 130, returned (not raised) without
    # standalone mode; any other code a command returns is passed on as the exit status
    if rc == 130:
        _interrupted()
    if isinstance(rc, int) and rc:
        sys.exit(rc)


def _shown_streams() -> None:
    """stdout and stderr write what they cannot encode (a file name's undecodable byte, a lone
    surrogate from a YAML escape) as ``sim.files.text.shown`` writes it (``caf\\xe9``), never raising
    ``UnicodeEncodeError``: every line a command prints, a table's title included."""
    import sim.files.text  # noqa: F401 - registers the "shown" error handler

    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="shown")
            except (ValueError, OSError):  # a closed or detached stream: left as it is
                pass


def _terminated(signum, frame) -> None:
    """SIGTERM (``kill``, a job scheduler's time limit): exit with status 143 as the default
    action would, but through Python's exit, so that the run's temporary files (the columns a
    run keeps under ``$TMPDIR``, sim/engine/columns.py; half-written outputs) are removed."""
    raise SystemExit(128 + signum)


def print_version() -> None:
    """``simsrv X.Y.Z`` and which simulation core runs (sim/compiled_core.py) on stdout
    (``--version``)."""
    from importlib.metadata import PackageNotFoundError, version

    from sim import compiled_core

    try:
        v = version("simsrv")
    except PackageNotFoundError:  # run from a source tree that was never installed
        v = "unknown (not installed)"
    print(f"simsrv {v}")  # what rich printed for this short plain line, without importing rich
    print(f"core: {compiled_core.describe()}")


def _run_without_typer(kwargs: dict[str, Any]) -> int | None:
    """``run_command(**kwargs)`` with what typer does around a command it runs without
    standalone mode (typer/core.py ``_main``): ``--verbose`` off (its callback's default),
    Ctrl-C returned as 130, end of input as a newline on stderr and click's ``Abort``, a broken
    pipe as exit status 1 with the streams' flush errors silenced. NOTE: an exception that
    escapes (a defect) prints Python's plain traceback, not typer's formatted one."""
    from sim.cli.run_cmd import run_command

    _verbose["on"] = False
    try:
        run_command(**kwargs)
    except KeyboardInterrupt:
        return 130
    except EOFError as e:
        from typer import Abort

        print(file=sys.stderr)
        raise Abort() from e
    except OSError as e:
        if e.errno != errno.EPIPE:
            raise
        from typer._click.utils import PacifyFlushWrapper

        sys.stdout = PacifyFlushWrapper(sys.stdout)
        sys.stderr = PacifyFlushWrapper(sys.stderr)
        sys.exit(1)
    return None


def _interrupted() -> None:
    """Ctrl-C: one line, exit status 130 (128 + SIGINT), as a shell reports an interrupted command."""
    err_console.print("error: interrupted", markup=False, highlight=False)
    sys.exit(130)


def _fail(message: str, status: int = 2) -> None:
    """One line on stderr, exit status 2; the traceback only with --verbose."""
    if _verbose["on"]:
        raise
    err_console.print(f"error: {message}", markup=False, highlight=False, emoji=False, soft_wrap=True)
    sys.exit(status)
