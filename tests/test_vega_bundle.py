"""The reports' inlined script bundle is made by vl-convert once per version and kept on disk
(sim/reporting/vega_bundle.py): later processes read it instead of bundling again (~2 s)."""

from __future__ import annotations

import pytest
import vl_convert

from sim.reporting import vega_bundle


@pytest.fixture(autouse=True)
def _fresh_bundle():
    """Later tests get the real bundle, not a fake one this module's process memoised."""
    yield
    vega_bundle.vega_bundle_js.cache_clear()


def _fake_bundler(monkeypatch, text: str) -> list[str]:
    """vl-convert's bundler replaced by one returning ``text``; the list records its calls."""
    calls: list[str] = []

    def bundle(snippet: str) -> str:
        calls.append(snippet)
        return text

    monkeypatch.setattr(vl_convert, "javascript_bundle", bundle)
    vega_bundle.vega_bundle_js.cache_clear()
    return calls


def test_the_bundle_is_made_once_and_read_back_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMSRV_CACHE_DIR", str(tmp_path / "cache"))
    calls = _fake_bundler(monkeypatch, "vega();")
    assert vega_bundle.vega_bundle_js() == "vega();"
    assert calls == [vega_bundle.EXPORT]
    files = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert len(files) == 2 and files[0].endswith(".js") and vl_convert.__version__ in files[0]
    calls = _fake_bundler(monkeypatch, "other();")  # a new process: the cached file is read
    assert vega_bundle.vega_bundle_js() == "vega();"
    assert calls == []


def test_a_damaged_cached_bundle_is_made_again(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMSRV_CACHE_DIR", str(tmp_path))
    _fake_bundler(monkeypatch, "vega();")
    vega_bundle.vega_bundle_js()
    (js,) = tmp_path.glob("*.js")
    js.write_text("veg")  # cut short: its SHA-256 no longer matches
    calls = _fake_bundler(monkeypatch, "vega();")
    assert vega_bundle.vega_bundle_js() == "vega();"
    assert len(calls) == 1 and js.read_text() == "vega();"
    (tmp_path / (js.name + ".sha256")).unlink()  # no digest: not trusted either
    calls = _fake_bundler(monkeypatch, "vega();")
    assert vega_bundle.vega_bundle_js() == "vega();" and len(calls) == 1


def test_a_cache_that_cannot_be_written_costs_only_the_time(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SIMSRV_CACHE_DIR", str(blocker / "cache"))  # under a file: no directory there
    calls = _fake_bundler(monkeypatch, "vega();")
    assert vega_bundle.vega_bundle_js() == "vega();" and len(calls) == 1


def test_the_cache_directory_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("SIMSRV_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert vega_bundle.cache_dir() == tmp_path / "simsrv"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert vega_bundle.cache_dir() == tmp_path / "home" / ".cache" / "simsrv"
    monkeypatch.setenv("SIMSRV_CACHE_DIR", str(tmp_path / "own"))
    assert vega_bundle.cache_dir() == tmp_path / "own"


def test_no_home_directory_means_no_cache(monkeypatch):
    monkeypatch.delenv("SIMSRV_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(vega_bundle.Path, "home", staticmethod(no_home))
    assert vega_bundle.cache_dir() is None
    calls = _fake_bundler(monkeypatch, "vega();")
    assert vega_bundle.vega_bundle_js() == "vega();" and len(calls) == 1
