"""Reading a user's YAML file with one clear error line (file, line, problem)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sim.errors import UserError


def read_yaml(path: str | Path, what: str) -> Any:
    """Parsed YAML of ``path``; a missing file or bad YAML is a ``UserError`` naming ``what``."""
    path = Path(path)
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: {what} not found") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"{path}:{line} not valid YAML ({getattr(e, 'problem', e)})") from None
