"""Output files written whole or not at all.

Why: a full disk or a Ctrl-C midway must never leave a truncated Parquet or JSON file that a
later ``report`` or ``--resume`` would read as a finished result. Each file is written to a
temporary name in the same directory, then renamed over the target (``os.replace`` is atomic
within one file system); on any failure the temporary file is removed. A directory of files
that belong together (a run directory) is written as a sibling directory and takes its name in
one step (``replacing_dir``). A temporary that a killed process left is removed by the next
command that writes beside it (``remove_stale_temporaries``).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sim.errors import UserError


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path to write instead of ``path``; renamed onto ``path`` when the block ends.

    A target that exists and is not a regular file (``/dev/stdout``, ``/dev/full``, a FIFO) is
    written directly: renaming over it would replace the device or pipe itself.
    """
    path = Path(path)
    if path.exists() and not path.is_file():
        with _named(path):
            yield path
        return
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with _named(path):
            yield tmp
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def _named(path: Path) -> Iterator[None]:
    """An I/O error in the block names ``path``, the file the user asked for.

    Why: ``write()`` and ``close()`` raise ``OSError`` with no file name (a full disk, a quota,
    ``/dev/full``), and polars reports a full disk as a ``ComputeError`` ("os error 28"); the
    CLI's one error line then said "No space left on device" without saying which file. The
    class is kept (``OSError(EPIPE, ...)`` is a ``BrokenPipeError``)."""
    try:
        yield
    except OSError as e:
        if e.filename is not None or e.errno is None:
            raise
        raise OSError(e.errno, e.strerror or os.strerror(e.errno), str(path)) from None
    except Exception as e:
        io_error = re.search(r"os error (\d+)", str(e))
        if io_error is None:
            raise
        code = int(io_error.group(1))
        raise OSError(code, os.strerror(code), str(path)) from None


def write_text(path: str | Path, text: str) -> None:
    """``Path.write_text`` (UTF-8), atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


# A temporary of ``atomic_path``: ".NAME.tmp-PID"
TEMPORARY = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)$")
# ``replacing_dir``'s siblings of NAME: the directory being written (new) and, where the file
# system cannot exchange two names, the old one parked for a moment (old)
_SIBLING = re.compile(r"^\.(?P<name>.+)\.simsrv-(?P<kind>new|old)-(?P<pid>\d+)-\d+$")


def simsrv_leftover(name: str) -> bool:
    """Whether ``name`` is one of the hidden names this module writes beside a file or a
    directory (a temporary, a sibling directory, a lock): not a user's file."""
    return bool(TEMPORARY.match(name) or _SIBLING.match(name)
                or (name.startswith(".") and name.endswith(".simsrv-lock")))


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (this process counts; another user's process counts)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    return True


def remove_stale_temporaries(directory: str | Path, pattern: re.Pattern = TEMPORARY) -> list[str]:
    """Remove the files of ``directory`` named by ``pattern`` (a ``pid`` group) whose process
    is gone: what a ``kill -9`` or a power cut left mid-write. A live process's are kept.
    Returns the names removed."""
    removed = []
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return removed
    for e in entries:
        m = pattern.match(e.name)
        if m and e.is_file(follow_symlinks=False) and not pid_alive(int(m.group("pid"))):
            Path(e.path).unlink(missing_ok=True)
            removed.append(e.name)
    return removed


def _remove_stale_siblings(parent: Path) -> None:
    """Directories ``replacing_dir`` left in ``parent`` when its process died: a new one being
    written (or an old one swapped out and not yet removed) is removed; an old one parked while
    its name was empty (file systems without an exchange of names) is put back if the name is
    still empty."""
    import shutil

    for e in list(os.scandir(parent)):
        m = _SIBLING.match(e.name)
        if not m or not e.is_dir(follow_symlinks=False) or pid_alive(int(m.group("pid"))):
            continue
        home = parent / m.group("name")
        if m.group("kind") == "old" and not os.path.lexists(home):
            with contextlib.suppress(OSError):
                os.rename(e.path, home)
                continue
        shutil.rmtree(e.path, ignore_errors=True)


class _NameLock:
    """An exclusive ``flock`` on ``parent/.NAME.simsrv-lock``: the kernel drops it when the
    process ends however it ends, so a crash leaves no lock held. The file is removed on
    release; a process that locked a file since removed sees it (the name no longer leads to
    the file it holds) and takes the new one."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None

    def acquire(self, blocking: bool) -> bool:
        import fcntl

        while self.fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                os.close(fd)
                return False
            except BaseException:
                os.close(fd)
                raise
            try:
                mine, named = os.fstat(fd), os.stat(self.path)
                same = (mine.st_dev, mine.st_ino) == (named.st_dev, named.st_ino)
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            self.fd = fd
        return True

    def holder(self) -> str:
        """``(pid N)`` of the process holding the lock, when it has written it."""
        try:
            pid = self.path.read_text().strip()
        except OSError:
            return ""
        return f" (pid {pid})" if pid.isdigit() else ""

    def release(self) -> None:
        if self.fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = None


_stage_numbers = itertools.count()


def exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` in one step (Linux ``renameat2(RENAME_EXCHANGE)``);
    False where the C library or the file system has no such call."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


@contextmanager
def replacing_dir(path: str | Path, force: bool, foreign: Callable[[Path], list[str]],
                  flag: str = "--force") -> Iterator[Path]:
    """An empty directory to write in place of the directory ``path``; when the block ends
    without an error it takes ``path``'s name in one step, whole (old contents removed),
    and on any error it is removed and ``path`` is as it was.

    Why: a run directory replaced file by file mixes two runs when the disk fills or the
    process dies midway; two commands writing one directory at once mixed theirs too.
    The new directory is a sibling, ``.NAME.simsrv-new-PID-N``, renamed onto ``path`` (or
    exchanged with it, ``exchange``), so after a crash at any point ``path`` holds the old
    contents or the new ones, never a mix; a sibling left by a dead process is removed by the
    next call for a directory beside it.

    Without ``force`` the name is claimed for the whole block (a lock, ``_NameLock``): a second
    command on the same ``path`` is refused, as is a ``path`` that is not empty. With ``force``
    the lock is taken only to swap, so of two forced commands the last to finish wins, whole;
    ``force`` replaces only a directory whose entries ``foreign`` finds all simsrv's own (it
    returns the others' names), so a mistaken ``--out`` never removes unrelated files.
    """
    import shutil

    shown = Path(path)
    target = Path(os.path.abspath(shown))
    if target.is_symlink():  # write the directory it leads to; the link stays
        target = Path(os.path.realpath(target))
    if not target.name or target == target.parent:
        raise UserError(f"{shown}: cannot be replaced as a whole; --out a directory below it")
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):  # a file on the way (/dev/null/x)
        blocking = next(a for a in (parent, *parent.parents) if a.exists() and not a.is_dir())
        raise UserError(f"{shown}: {blocking} is not a directory; --out another directory") from None
    lock = _NameLock(parent / f".{target.name}.simsrv-lock")
    if not force and not lock.acquire(blocking=False):
        raise UserError(f"{shown}: another simsrv command{lock.holder()} is writing it now; "
                        "wait for it to finish, or --out another directory")
    try:
        _remove_stale_siblings(parent)
        _check_replaceable(target, shown, force, foreign, flag)
        stage = parent / f".{target.name}.simsrv-new-{os.getpid()}-{next(_stage_numbers)}"
        stage.mkdir()
        try:
            yield stage
            lock.acquire(blocking=True)
            _check_replaceable(target, shown, force, foreign, flag)
            _swap_in(stage, target, shown, parent)
        except OSError as e:  # a full disk: named by the file it would have been, not the sibling's
            shutil.rmtree(stage, ignore_errors=True)
            if not (e.filename and str(e.filename).startswith(str(stage))):
                raise
            raise OSError(e.errno, f"{e.strerror}; {shown} is as it was",
                          str(shown) + str(e.filename)[len(str(stage)):]) from e
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
    finally:
        lock.release()


def _check_replaceable(target: Path, shown: Path, force: bool, foreign: Callable[[Path], list[str]],
                       flag: str) -> None:
    if not os.path.lexists(target):
        return
    if not target.is_dir():
        raise UserError(f"{shown}: exists and is not a directory; --out another directory")
    remove_stale_temporaries(target)  # what an older simsrv's kill -9 left there
    if not any(target.iterdir()):
        return
    if not force:
        raise UserError(f"{shown}: already exists and is not empty; pass {flag} to overwrite it, "
                        "or --out another directory")
    others = foreign(target)
    if others:
        named = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise UserError(f"{shown}: holds {named}, which simsrv did not write; {flag} replaces only a directory "
                        "of simsrv's own files: move them, or --out another directory")


def _swap_in(stage: Path, target: Path, shown: Path, parent: Path) -> None:
    """``stage`` takes ``target``'s name; what ``target`` held is removed."""
    import shutil

    if not os.path.lexists(target) or not any(target.iterdir()):
        try:
            os.rename(stage, target)  # replaces an empty directory, in one step
            return
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            raise UserError(f"{shown}: was filled by another program while simsrv wrote; "
                            "--out another directory") from None
    if exchange(stage, target):
        shutil.rmtree(stage)  # the old contents, under the new directory's former name
        return
    # no exchange of names here: the old directory is parked for the moment between two
    # renames; a crash in that moment leaves it parked, and the next call puts it back
    parked = parent / f".{target.name}.simsrv-old-{os.getpid()}-{next(_stage_numbers)}"
    os.rename(target, parked)
    os.rename(stage, target)
    shutil.rmtree(parked)
