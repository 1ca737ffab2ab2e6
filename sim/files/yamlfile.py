"""Reading a user's YAML file with one clear error line (file, line, problem).

Why: a scenario or grid file may be mis-encoded (Latin-1, UTF-16), binary, not YAML, hostile
(``!!python`` tags, alias bombs) or absurdly nested; each must end in one line that names the
file, never in a traceback or an echo of the file's bytes. A mapping that gives a key twice is
refused too: YAML loaders keep the last value silently, so a second ``engine:`` block would drop
the whole first one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from sim.errors import UserError
from sim.files.text import shown

# NOTE: no scenario nests deeper than ~6 levels; PyYAML's composer recurses per level, so a
# 5000-deep document would hit Python's recursion limit (a RecursionError, not a YAML error).
MAX_DEPTH = 100
# a scenario file is a few KB; anything this large is not one
MAX_BYTES = 16 << 20


def read_yaml(path: str | Path, what: str) -> Any:
    """Parsed YAML of ``path``; a missing, unreadable or bad file is a ``UserError`` naming ``what``."""
    path = Path(path)
    try:
        if path.is_dir():
            raise UserError(f"{path}: is a directory, not a {what}")
        data = path.read_bytes()[: MAX_BYTES + 1]
    except FileNotFoundError:
        raise UserError(f"{path}: {what} not found") from None
    except PermissionError:
        raise UserError(f"{path}: {what} cannot be read (permission denied)") from None
    if len(data) > MAX_BYTES:
        raise UserError(f"{path}: {what} is larger than {MAX_BYTES >> 20} MB; not a scenario")
    return parse_yaml_text(_decode(data, path, what), str(path))


def _decode(data: bytes, path: Path, what: str) -> str:
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise UserError(f"{path}: {what} is UTF-16 text; save it as UTF-8")
    if b"\x00" in data:
        raise UserError(f"{path}: {what} is binary (it contains NUL bytes), not YAML text")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise UserError(f"{path}: line {line}: byte 0x{data[e.start]:02x} is not UTF-8; save the {what} as "
                        "UTF-8") from None


def load_shipped_yaml(text: str) -> Any:
    """A catalogue file shipped with simsrv (models, GPUs, engine profiles): parsed with
    libyaml's C parser when PyYAML has it (8x faster: start-up), else the pure-Python one;
    both build the same objects with the safe constructors. User files go through
    ``parse_yaml_text`` (its error messages name the line)."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


class _UniqueKeys(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that gives one key twice (its own keys: a key
    that overrides one merged in with ``<<`` is YAML's merge, not a duplicate)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first_line: dict[object, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)
                line = key_node.start_mark.line + 1
                if key in first_line:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} given twice, at lines {first_line[key]} and {line}; YAML would "
                        "keep only the last", key_node.start_mark)
                first_line[key] = line
        return super().construct_mapping(node, deep)

    def construct_scalar(self, node):
        """Every scalar's text (keys too) with no surrogate (sim/files/text.py ``shown``): YAML's
        ``"\\ud83d\\ude00"`` escapes give a pair of surrogates, here the one character they
        encode, and a lone one is kept as its escape's text; either used to stop a page or a
        Parquet file from being written after the whole simulation (issue 38)."""
        value = super().construct_scalar(node)
        return shown(value) if isinstance(value, str) else value


# YAML 1.2's floats: PyYAML (YAML 1.1) reads 1e15 and 1.0e15 (no dot or no exponent sign) as
# strings, which the strict scenario schema (sim/scenario.py _Strict) would refuse as text where a
# number belongs; 1.1's forms (1.5, 1.0e+15, .inf, .nan, 1:30.5) stay floats.
_FLOAT = re.compile(r"""^(?:[-+]?[0-9][0-9_]*(?:\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[eE][-+]?[0-9]+)
    |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X)
_UniqueKeys.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:float"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_UniqueKeys.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def parse_yaml_text(text: str, where: str) -> Any:
    """``yaml.safe_load`` of ``text`` (a key given twice in a mapping refused); any failure is
    one ``UserError`` line starting with ``where``."""
    if _max_depth(text) > MAX_DEPTH:
        raise UserError(f"{where}: nested more than {MAX_DEPTH} levels deep; not a scenario")
    try:
        return yaml.load(text, Loader=_UniqueKeys)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}:" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"{where}:{line} not valid YAML ({_one_line(problem)})") from None
    except RecursionError:  # block-style nesting, which _max_depth does not count
        raise UserError(f"{where}: nested too deeply; not a scenario") from None


def _max_depth(text: str) -> int:
    """An upper bound of the flow-style nesting depth ([ and { not in quotes or comments)."""
    depth = worst = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            worst = max(worst, depth)
        elif ch in "]}":
            depth = max(depth - 1, 0)
    return worst


def _one_line(text: str, max_chars: int = 120) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."

