"""The Vega, Vega-Lite and Vega-Embed libraries as one script, inlined in every HTML report.

Why: vl-convert bundles them (``javascript_bundle``) in ~2.1 s of CPU, every time, for a result
that depends only on vl-convert's version (900 KB, the same bytes each time). That was the largest
part of a report's cost: `simsrv report` on one run directory, `compare`, `sweep` and
`capacity` each paid it once per process (bench/README.md, "Reports, the summary, and the
targets against a faster machine").
So the bundle is kept on disk, one file per vl-convert version, in simsrv's cache directory:
``$SIMSRV_CACHE_DIR``, else ``$XDG_CACHE_HOME/simsrv``, else ``~/.cache/simsrv``. A file is
used only when its SHA-256 matches the one written beside it (a damaged or half-copied file is
bundled again); a cache that cannot be written (a read-only home) only costs the time.
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path

# what the bundle exports to the page (sim/reporting/html.py calls window.vegaEmbed)
EXPORT = "window.vegaEmbed = vegaEmbed;"


def cache_dir() -> Path | None:
    """simsrv's cache directory (nothing in it is needed: each file can be made again); None
    when there is no home directory to put it in."""
    own = os.environ.get("SIMSRV_CACHE_DIR")
    if own:
        return Path(own)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "simsrv"
    try:
        return Path.home() / ".cache" / "simsrv"
    except (RuntimeError, KeyError):  # no HOME and no password entry
        return None


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@lru_cache(maxsize=1)
def vega_bundle_js() -> str:
    """Vega + Vega-Lite + Vega-Embed as one ES module that exposes ``window.vegaEmbed``:
    vl-convert's ``javascript_bundle``, read from the cache when this version's is there."""
    import vl_convert as vlc

    where = cache_dir()
    if where is None:
        return vlc.javascript_bundle(EXPORT)
    path = where / f"vega-embed-vl-convert-{vlc.__version__}-{_sha256(EXPORT)[:12]}.js"
    digest = path.with_name(path.name + ".sha256")
    try:
        text = path.read_text(encoding="utf-8")
        if digest.read_text(encoding="ascii").strip() == _sha256(text):
            return text
    except (OSError, UnicodeDecodeError):
        pass
    text = vlc.javascript_bundle(EXPORT)
    try:
        from sim.files.atomic import write_text

        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, text)
        write_text(digest, _sha256(text) + "\n")
    except OSError:
        pass
    return text
