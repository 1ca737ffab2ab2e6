"""Output paths checked before any work: a command that simulates for minutes must not learn only
at the end that it cannot write its results (issue 38).

Why: ``--out`` under a file, a page named like an existing directory, a directory one cannot
write in: each used to be an OSError after the whole simulation. Checked here by looking, not
writing (nothing is created before the work): the nearest existing ancestor must be a directory
this process may write in. Names are shown with ``sim.files.text.shown`` (a byte that is not UTF-8 as
``\\xe9``).
"""

from __future__ import annotations

import os
from pathlib import Path

from sim.errors import UserError
from sim.files.text import shown


def check_output(path: str | Path, flag: str, directory: bool) -> None:
    """Refuse, in one line naming ``flag``, an output ``path`` (a directory to write into when
    ``directory``, else a file) that cannot be written."""
    path = Path(path)
    if path.exists():
        if directory and not path.is_dir():
            raise UserError(f"{flag} {shown(path)}: exists and is not a directory")
        if not directory and path.is_dir():
            raise UserError(f"{flag} {shown(path)}: is a directory; name a file")
        where = path if directory else path.parent
    else:
        where = _nearest_existing(path.parent)
        if not where.is_dir():
            raise UserError(f"{flag} {shown(path)}: {shown(where)} is not a directory")
    if not os.access(where, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {shown(path)}: cannot write in {shown(where)} (permission denied or a "
                        "read-only file system)")


def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (``.`` for a relative path with none)."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p if p.exists() or p.parts else Path(".")
