"""Output files written whole or not at all.

Why: a full disk or a Ctrl-C midway must never leave a truncated Parquet or JSON file that a
later ``report`` or ``--resume`` would read as a finished result. Each file is written to a
temporary name in the same directory, then renamed over the target (``os.replace`` is atomic
within one file system); on any failure the temporary file is removed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path to write instead of ``path``; renamed onto ``path`` when the block ends.

    A target that exists and is not a regular file (``/dev/stdout``, ``/dev/full``, a FIFO) is
    written directly: renaming over it would replace the device or pipe itself.
    """
    path = Path(path)
    if path.exists() and not path.is_file():
        yield path
        return
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        io_error = re.search(r"os error (\d+)", str(e))
        if io_error and not isinstance(e, OSError):  # polars reports a full disk as a ComputeError
            code = int(io_error.group(1))
            raise OSError(code, os.strerror(code), str(path)) from None
        raise


def write_text(path: str | Path, text: str) -> None:
    """``Path.write_text`` (UTF-8), atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
