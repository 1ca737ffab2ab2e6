"""The shipped catalogues (``models.yaml``, ``gpus.yaml``, ``engine_profiles.yaml``,
``attention_backends.yaml``) read at start-up from ``packed.json``: each file's parsed data
as JSON, with the YAML text it came from.

Why: every run reads these four files, and PyYAML's constructor is Python code even behind
libyaml's C parser: 5.9-11.2 ms of CPU in a fresh process for ~1,600 values, against 0.4-1.0 ms
for the same data as JSON (bench/README.md, "Start-up: packed catalogues, no pydantic plugin
search"). The YAML files stay the source, with their comments and sources; a file whose text
is no longer the text packed (edited in a checkout without ``python -m sim.catalog.packed``)
is parsed from its YAML as before, so the packed copy can only be slower when stale, never
different. (The text is compared whole: no hash, whose module, hashlib, a run would import for
it alone: ~1-2 ms.) ``pack`` refuses data that JSON would not give back exactly (a non-string
key, a tuple, a date, NaN), and ``tests/test_startup.py`` fails while ``packed.json`` is stale.

Usage: python -m sim.catalog.packed   (rewrites sim/catalog/packed.json)
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from sim.files.atomic import write_text
from sim.files.yamlfile import load_shipped_yaml

FILES = ("models.yaml", "gpus.yaml", "engine_profiles.yaml", "attention_backends.yaml")
PACKED = "packed.json"


def load_catalog(name: str) -> Any:
    """The parsed data of the shipped catalogue ``name`` (one of ``FILES``): its packed copy
    while that was made from this very text, else the YAML parsed."""
    text = _text(name)
    entry = _packed().get(name)
    if isinstance(entry, dict) and entry.get("yaml") == text and "data" in entry:
        return entry["data"]
    return load_shipped_yaml(text)


def _text(name: str) -> str:
    """The catalogue's text with its line ends as ``read_text`` gives them (universal newlines:
    a checkout with CRLF line ends reads the same)."""
    raw = resources.files("sim.catalog").joinpath(name).read_bytes().decode("utf-8")
    return raw.replace("\r\n", "\n").replace("\r", "\n")


@lru_cache(maxsize=1)
def _packed() -> dict:
    """``packed.json``, or nothing when it is missing or not what ``pack`` writes (a merge
    conflict in it, say): every catalogue is then parsed from its YAML."""
    try:
        packed = json.loads(resources.files("sim.catalog").joinpath(PACKED).read_bytes())
    except (OSError, ValueError):
        return {}
    return packed if isinstance(packed, dict) else {}


def pack() -> dict[str, dict]:
    """``packed.json``'s content for the YAML files as they are now."""
    out = {}
    for name in FILES:
        text = _text(name)
        data = load_shipped_yaml(text)
        if not same(json.loads(json.dumps(data, allow_nan=False)), data):
            raise ValueError(f"{name}: its data does not survive JSON exactly (a non-string key, a tuple, "
                             "a date?); it cannot be packed")
        out[name] = {"yaml": text, "data": data}
    return out


def same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (``1 == 1.0 == True`` for ``==``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def main() -> None:
    path = Path(__file__).with_name(PACKED)
    write_text(path, json.dumps(pack(), indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
