"""Traces that are not a plain file: a pipe (``trace inspect <(zcat t.jsonl.gz)``, a FIFO) or
gzip-compressed (``t.jsonl.gz``, or any file that starts with gzip's magic bytes).

Why: the readers open a trace several times (format detection, the header, the rows; the
numeric reader, then the general one from where it gave up) and pyarrow memory-maps or seeks
it; a pipe can be read once, so its second opening found nothing ("the trace file is empty"),
and a gzip file was called "binary data" with no word of gzip. ``readable`` copies such a
trace once, decompressed, into a temporary file that lives as long as the process; what it
gives back opens that copy but prints as the user's path, so every message still names the
file the user gave.
"""

from __future__ import annotations

import atexit
import gzip
import os
import shutil
import stat
import tempfile
import zlib
from pathlib import Path

from sim.errors import UserError

GZIP_MAGIC = b"\x1f\x8b"
PARQUET_MAGIC = b"PAR1"
_COPY_BYTES = 1 << 20

_staged: dict[str, Path] = {}  # the user's path, and the copy's, -> the staged path
_tmp_dir: list[str] = []       # the process's one temporary directory, once made


class StagedPath(type(Path())):
    """A path that opens one file and is shown as another: ``os.fspath`` (open, stat, pyarrow)
    is the copy, ``str`` (every message, f-strings) the user's path."""

    _shown_as: str | None = None

    def __str__(self) -> str:
        return self._shown_as if self._shown_as is not None else super().__str__()

    def __fspath__(self) -> str:
        return super().__str__()

    def __repr__(self) -> str:
        return f"StagedPath({super().__str__()!r}, shown as {self._shown_as!r})"


def readable(path: str | Path) -> Path:
    """``path`` itself when it is a plain, uncompressed file (or missing, or a directory: the
    readers' checks name those); else its staged copy (made on the first call for that path,
    reused after: a pipe is read once)."""
    path = Path(path)
    key = os.fspath(path)
    if key in _staged:
        return _staged[key]
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return path
    if stat.S_ISDIR(mode):
        return path
    if stat.S_ISREG(mode):
        with open(path, "rb") as f:
            if f.read(2) != GZIP_MAGIC:
                return path
    staged = _stage(path)
    _staged[key] = _staged[os.fspath(staged)] = staged
    return staged


def _stage(path: Path) -> StagedPath:
    """The copy of ``path`` (a pipe's bytes, or a gzip file's decompressed), named after it less
    ``.gz`` (the readers go by the suffix: ``.parquet``, ``.json``, ``.jsonl``)."""
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    tmp = Path(_temporary_dir()) / f"{len(_staged)}-{name or 'trace'}"
    try:
        with open(path, "rb") as src, open(tmp, "wb") as dst:
            head = _copy(path, src, dst)
    except OSError as e:
        raise UserError(f"{path}: cannot read the trace ({e.strerror or e})") from None
    if head.startswith(PARQUET_MAGIC) and tmp.suffix != ".parquet":
        tmp = tmp.rename(tmp.with_name(tmp.name + ".parquet"))
    staged = StagedPath(tmp)
    staged._shown_as = str(path)
    return staged


def _copy(path: Path, src, dst) -> bytes:
    """Copy ``src`` into ``dst``, gunzipping it (every member, as ``zcat`` does) if it starts
    with gzip's magic bytes; the first bytes written (the format's own magic)."""
    first = src.read(4)  # (a buffered read: fewer only at the end of the data)
    if not first.startswith(GZIP_MAGIC):
        dst.write(first)
        shutil.copyfileobj(src, dst, _COPY_BYTES)
        return first
    try:
        with gzip.GzipFile(fileobj=_Rest(first, src), mode="rb") as z:
            head = z.read(4)
            dst.write(head)
            shutil.copyfileobj(z, dst, _COPY_BYTES)
    except EOFError:
        raise UserError(f"{path}: the gzip data ends early (a truncated file)") from None
    except (gzip.BadGzipFile, zlib.error) as e:
        raise UserError(f"{path}: not readable as gzip ({e})") from None
    return head


class _Rest:
    """A stream's bytes from its start, after ``first`` was read from it (a pipe cannot seek back)."""

    def __init__(self, first: bytes, stream):
        self.first, self.stream = first, stream

    def read(self, n: int = -1) -> bytes:
        if not self.first:
            return self.stream.read(n)
        k = len(self.first) if n < 0 else min(n, len(self.first))
        out, self.first = self.first[:k], self.first[k:]
        return out


def _temporary_dir() -> str:
    if not _tmp_dir:
        _tmp_dir.append(tempfile.mkdtemp(prefix="simsrv-trace-"))
        atexit.register(shutil.rmtree, _tmp_dir[0], True)
    return _tmp_dir[0]
