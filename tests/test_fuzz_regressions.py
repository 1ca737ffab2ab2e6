"""Regressions found by rerunning the black-box fuzz scripts (issue 38; /work/shared/fuzz).

Out of disk: a page or JSON file written through ``sim.files.atomic`` onto a full disk (a
200 KiB tmpfs, or ``/dev/full``) failed with ``error: No space left on device``, naming no
file, because ``write()`` raises an ``OSError`` without a file name. Every write through
``atomic_path`` now names the file it was writing. Fast and without a mount: ``/dev/full``
for the device branch, an injected ``ENOSPC`` for the temporary-file branch.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.inproc_cli import simsrv

FULL = Path("/dev/full")
needs_dev_full = pytest.mark.skipif(not FULL.exists(), reason="no /dev/full on this system")


@needs_dev_full
def test_an_html_page_written_to_a_full_device_names_the_file():
    o = simsrv("trace", "inspect", ROOT / "traces/samples/burstgpt_schema_example.csv", "--html", FULL)
    assert o.clean and o.code == 2, o.stderr
    errors = [line for line in o.lines if line.startswith("error:")]
    assert errors == [f"error: {FULL}: No space left on device"], o.stderr


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EIO])
def test_a_failed_write_through_atomic_path_names_the_target(tmp_path, monkeypatch, code):
    """A ``write()`` fails with no file name (a full disk, a quota, an I/O error): the error
    names the file being written, its temporary is removed and the target is left as it was."""
    from sim.files import atomic

    target = tmp_path / "page.html"
    target.write_text("old", encoding="utf-8")

    def failing_write(self, *args, **kwargs):
        open(self, "w").close()  # the temporary exists when the write fails
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(Path, "write_text", failing_write)
    with pytest.raises(OSError) as info:
        atomic.write_text(target, "new")
    assert info.value.errno == code and info.value.filename == str(target)
    monkeypatch.undo()
    assert target.read_text(encoding="utf-8") == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.html"]


@needs_dev_full
def test_a_broken_pipe_keeps_its_class_when_named(tmp_path):
    """Naming the file keeps the exception's class (``OSError(EPIPE, ...)`` is a
    ``BrokenPipeError``), so callers that tell a closed pipe apart still can."""
    from sim.files import atomic

    with pytest.raises(BrokenPipeError) as info:
        with atomic.atomic_path(FULL):
            raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))
    assert info.value.filename == str(FULL)
