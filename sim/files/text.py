"""Paths and user text as text that can always be encoded (printed, written as UTF-8, put in a page).

Why: on Linux a file name is bytes; Python hands a byte that is not UTF-8 (``caf\\xe9.jsonl``)
to the program as a lone surrogate (``'caf\\udce9.jsonl'``, PEP 383), and YAML's ``"\\ud83d"``
escapes give lone surrogates too. Such a string opens the file, but printing it, encoding it as
UTF-8 (a page, Parquet metadata, Arrow's path) raises ``UnicodeEncodeError``, which used to end
a command after its whole simulation. ``shown`` turns any path or text into what is displayed:
a surrogate pair becomes its character, an undecodable byte ``\\xe9`` and any other lone
surrogate ``\\udXXX``, as Python writes them in a string literal. The error handler of the same
name does it to whatever reaches stdout and stderr (``sim.cli.entry``).
"""

from __future__ import annotations

import codecs
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

_SURROGATES = re.compile("[\ud800-\udfff]+")
_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")


def _lone(c: str) -> str:
    code = ord(c)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, kept by os.fsdecode (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def _unsurrogate(run: str) -> str:
    """A run of surrogates: pairs as their character, each lone one as its escape."""
    out, i = [], 0
    while i < len(run):
        if _PAIR.match(run, i):
            out.append(run[i:i + 2].encode("utf-16-le", "surrogatepass").decode("utf-16-le"))
            i += 2
        else:
            out.append(_lone(run[i]))
            i += 1
    return "".join(out)


def shown(value) -> str:
    """``value`` (a path, bytes or any object) as text with no surrogate: what to print or
    write. Text without surrogates is returned unchanged."""
    if isinstance(value, (bytes, os.PathLike)):
        value = os.fsdecode(value)
    text = value if isinstance(value, str) else str(value)
    if not _SURROGATES.search(text):
        return text
    return _SURROGATES.sub(lambda m: _unsurrogate(m.group()), text)


def shown_data(value):
    """``value`` with every string in it (dict keys too, lists, tuples) passed through ``shown``:
    data bound for JSON that is read elsewhere (a page's chart specs)."""
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, dict):
        return {shown_data(k): shown_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [shown_data(v) for v in value]
    return value


def combine_pairs(text: str) -> str:
    """Surrogate pairs written as two escapes (YAML's ``"\\ud83d\\ude00"``) as the one character
    they encode; lone surrogates stay (a path's undecodable bytes must still open the file)."""
    if not _SURROGATES.search(text):
        return text
    return _PAIR.sub(lambda m: m.group().encode("utf-16-le", "surrogatepass").decode("utf-16-le"), text)


def _shown_errors(e: UnicodeError):
    """The codec error handler ``"shown"``: what cannot be encoded is written as ``shown`` writes it."""
    if not isinstance(e, UnicodeEncodeError):
        raise e
    end = e.end
    # a pair split by the encoder (it reports one character at a time): take its second half too
    if end < len(e.object) and _PAIR.match(e.object, end - 1):
        end += 1
    bad = e.object[e.start:end]
    text = _SURROGATES.sub(lambda m: _unsurrogate(m.group()), bad)
    # as bytes (an encoder takes only ASCII text back from a handler); what the stream's encoding
    # still lacks (an emoji on an ASCII terminal) as backslashreplace writes it
    return text.encode(e.encoding, "backslashreplace"), end


codecs.register_error("shown", _shown_errors)


@contextmanager
def arrow_file(path, mode: str = "rb") -> Iterator[str | BinaryIO]:
    """What Arrow and polars take for ``path``: its text where that is UTF-8 (they open it
    themselves, fastest), else the file opened by Python, closed when the block ends (Arrow
    encodes a path as UTF-8 and polars refuses one it cannot: "Object does not have a .write()
    method"). A file object is given back as it is."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        yield path
        return
    text = os.fsdecode(path)
    if not _SURROGATES.search(text):
        yield text
        return
    with open(path, mode) as f:
        yield f
