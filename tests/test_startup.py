"""Start-up (issue 14): heavy libraries load only when a command needs them, checked in a
fresh interpreter (``sys.modules`` after the import or the command)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT, small_scenario

HEAVY = ("numpy", "polars", "pyarrow", "altair", "scipy", "simpy", "pydantic", "yaml", "vl_convert", "pandas")

_PROBE = """
import json, sys
{body}
print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))
"""


def _loaded(body: str, cwd=ROOT, heavy=HEAVY) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", _PROBE.format(body=body, heavy=heavy)], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _tiny_run(tmp_path, num_requests: int, entry: str) -> str:
    """Probe body: ``simsrv run`` (through ``entry``, a module with ``main``) of a small scenario
    of ``num_requests`` into ``tmp_path / "r"``, quiet; it must succeed."""
    sc = tmp_path / "s.yaml"
    raw = small_scenario()
    raw["workload"]["synthetic"]["num_requests"] = num_requests
    sc.write_text(yaml.safe_dump(raw))
    return (f"from {entry} import main\ntry:\n    main(['run', {str(sc)!r}, '--out', {str(tmp_path / 'r')!r}, '-q'])\n"
            "except SystemExit as e:\n    assert not e.code, e.code")


def test_importing_the_cli_loads_no_heavy_library():
    assert _loaded("import sim.cli") == []


def test_version_loads_no_heavy_library():
    body = "from sim.cli.app import main\ntry:\n    main(['--version'])\nexcept SystemExit:\n    pass"
    assert _loaded(body) == []


def test_run_loads_only_what_a_run_needs(tmp_path):
    """A synthetic run needs numpy, simpy, pydantic and yaml (scenario), and pyarrow to write
    its Parquet files; never polars (trace reading and reports), the report stack (altair,
    vl-convert) or scipy; nor numpy.ma or pyarrow.compute, which numpy's percentiles and
    Arrow's ``take`` / ``pa.array`` of numpy arrays would import (~0.04 s together)."""
    loaded = _loaded(_tiny_run(tmp_path, 20, "sim.cli.app"), heavy=(*HEAVY, "numpy.ma", "pyarrow.compute"))
    assert (tmp_path / "r" / "result.json").is_file()
    assert set(loaded) == {"numpy", "pyarrow", "simpy", "pydantic", "yaml"}, loaded


def test_the_main_scenarios_trace_run_loads_no_more_than_a_synthetic_run(tmp_path):
    """scenarios/chat.yaml replays a Parquet trace of numbers (arrival, input and output
    tokens): the numeric reader (pyarrow) reads it, and polars (~0.15 s to import) stays
    unloaded; so does an Azure trace (canonical date-times, converted by pyarrow) or a BurstGPT
    one (its model names compared by pyarrow), or JSON Lines (Mooncake with hash ids, Bailian,
    AIPerf: parsed by pyarrow's JSON reader, or ``json`` for AIPerf's nested records)."""
    args = [str(ROOT / "scenarios" / "chat.yaml"), "--set", "workload.trace.sample=200", "--out",
            str(tmp_path / "r"), "-q"]
    body = f"from sim.cli.app import main\ntry:\n    main(['run', *{args!r}])\nexcept SystemExit as e:\n    assert not e.code"
    loaded = _loaded(body, heavy=(*HEAVY, "numpy.ma", "pyarrow.compute"))
    assert (tmp_path / "r" / "result.json").is_file()
    assert set(loaded) == {"numpy", "pyarrow", "simpy", "pydantic", "yaml"}, loaded
    samples = ROOT / "traces" / "samples"
    read = "from sim.workload.trace import read_trace\nread_trace({!r})"
    azure = _loaded(read.format(str(samples / "azure_code_2023_first500.csv")), heavy=(*HEAVY, "pyarrow.compute"))
    assert "polars" not in azure and "pyarrow.compute" not in azure, azure
    burst = ("from sim.workload.trace import read_trace\nfrom sim.workload.readers import ReadOptions\n"
             f"read_trace({str(samples / 'burstgpt_schema_example.csv')!r}, "
             "opts=ReadOptions(format='burstgpt', model_filter='ChatGPT'))")
    burst = _loaded(burst, heavy=(*HEAVY, "pyarrow.compute"))
    assert "polars" not in burst and "pyarrow.compute" not in burst, burst
    for name in ("mooncake_synthetic_first500.jsonl", "bailian_schema_example.jsonl", "aiperf_schema_example.jsonl"):
        jsonl = _loaded(read.format(str(samples / name)), heavy=(*HEAVY, "pyarrow.compute"))
        assert "polars" not in jsonl and "pyarrow.compute" not in jsonl, (name, jsonl)


@pytest.mark.parametrize("given", [None, "3"])
def test_the_command_runs_with_one_blas_thread_unless_told(given):
    """The ``simsrv`` process sets OPENBLAS_NUM_THREADS=1 before numpy loads (OpenBLAS's thread
    pool costs ~0.1 s of CPU to start, and simsrv does no BLAS work), keeping a user's value."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given:
        env["OPENBLAS_NUM_THREADS"] = given
    body = ("import os, sys\nsys.argv = ['simsrv', '--version']\nfrom sim.cli import main\nmain()\n"
            "print(os.environ['OPENBLAS_NUM_THREADS'], 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", body], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == [given or "1", "False"]


@pytest.mark.parametrize("given", [None, ""])
def test_a_run_process_looks_for_no_pydantic_plugins_unless_told(tmp_path, given):
    """The ``simsrv`` process sets PYDANTIC_DISABLE_PLUGINS=__all__ before pydantic loads, so a
    run does not read every installed distribution's entry points for pydantic plugins (~9 ms
    of CPU with ~120 distributions); a value the user set, even empty, is kept, and then
    pydantic looks for them as usual."""
    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump(small_scenario()))
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    if given is not None:
        env["PYDANTIC_DISABLE_PLUGINS"] = given
    body = (f"import os, sys\nsys.argv = ['simsrv', 'run', {str(sc)!r}, '--out', {str(tmp_path / 'r')!r}, '-q']\n"
            "from sim.cli import main\nmain()\nimport pydantic.plugin._loader as loader\n"
            "print(repr(os.environ['PYDANTIC_DISABLE_PLUGINS']), loader._plugins is None)")
    out = subprocess.run([sys.executable, "-c", body], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == (["'__all__'", "True"] if given is None else ["''", "False"])


@pytest.mark.parametrize("own_process", [True, False])
def test_a_run_process_turns_the_cyclic_collector_off(tmp_path, own_process):
    """``simsrv run`` as its own process runs without cyclic garbage collection (a one-shot
    process: the collector would only traverse what the run keeps), and ends with every object
    frozen (the interpreter's collection at exit skips them); a caller of ``main(argv)`` (tests,
    an embedding program) keeps its collector on and nothing frozen."""
    sc = tmp_path / "s.yaml"
    raw = small_scenario()
    raw["workload"]["synthetic"]["num_requests"] = 20
    sc.write_text(yaml.safe_dump(raw))
    args = ["run", str(sc), "--out", str(tmp_path / "r"), "-q"]
    call = "main()" if own_process else f"main({args!r})"
    body = (f"import gc, sys\nsys.argv = ['simsrv', *{args!r}]\nfrom sim.cli import main\n{call}\n"
            "print(gc.isenabled(), gc.get_freeze_count() > 0)")
    out = subprocess.run([sys.executable, "-c", body], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "r" / "result.json").is_file()
    assert out.stdout.split()[-2:] == [str(not own_process), str(own_process)]


def test_plain_run_and_version_load_neither_typer_nor_rich(tmp_path):
    """``simsrv run SCENARIO --out DIR -q`` is read without typer (sim/cli/run_argv.py) and prints
    nothing, so rich stays unloaded too; so does ``--version``; the command's help still comes from typer."""
    assert _loaded(_tiny_run(tmp_path, 5, "sim.cli"), heavy=("typer", "rich", "click")) == []
    assert (tmp_path / "r" / "result.json").is_file()
    version = "from sim.cli import main\nmain(['--version'])"
    assert _loaded(version, heavy=("typer", "rich", "click")) == []
    helped = "from sim.cli import main\ntry:\n    main(['run', '--help'])\nexcept SystemExit:\n    pass"
    assert _loaded(helped, heavy=("typer",)) == ["typer"]


def test_shipped_catalogues_parse_the_same_with_libyaml():
    """The catalogues are read with libyaml's parser when present (start-up); it must build
    exactly what the pure-Python safe loader builds."""
    from importlib import resources

    from sim.files.yamlfile import load_shipped_yaml

    for name in ("models.yaml", "gpus.yaml", "engine_profiles.yaml"):
        text = resources.files("sim.catalog").joinpath(name).read_text()
        assert load_shipped_yaml(text) == yaml.safe_load(text), name


def test_packed_catalogues_are_current_and_give_the_yaml_data():
    """``sim/catalog/packed.json`` holds each catalogue's data for the YAML text it has now
    (``python -m sim.catalog.packed`` rewrites it), and ``load_catalog`` gives exactly what
    the YAML parses to: the same values of the same types."""
    import json
    from importlib import resources

    from sim.catalog import packed
    from sim.files.yamlfile import load_shipped_yaml

    committed = json.loads(resources.files("sim.catalog").joinpath(packed.PACKED).read_text())
    assert packed.same(committed, packed.pack()), "stale: run python -m sim.catalog.packed"
    for name in packed.FILES:
        text = resources.files("sim.catalog").joinpath(name).read_text()
        assert packed.same(packed.load_catalog(name), load_shipped_yaml(text)), name


class _Files:
    """``resources.files("sim.catalog")`` with ``packed.json`` replaced by ``packed`` bytes,
    or with the catalogues' line ends turned to CRLF."""

    def __init__(self, packed: bytes | None, real, crlf: bool = False):
        self.packed, self.real, self.crlf = packed, real, crlf

    def joinpath(self, name: str):
        files = self

        class _One:
            def read_bytes(self) -> bytes:
                if name == "packed.json" and files.packed is not None:
                    return files.packed
                raw = files.real.joinpath(name).read_bytes()
                return raw.replace(b"\n", b"\r\n") if files.crlf else raw
        return _One()


def test_a_stale_packed_catalogue_is_not_used(monkeypatch):
    """A packed copy made from other text (a catalogue edited without repacking) is ignored,
    and so is a packed file that is not what ``pack`` writes (a merge conflict in it, an older
    layout): the YAML is parsed. A checkout with CRLF line ends still reads the packed copy.
    Data JSON would not give back exactly is refused when packing."""
    from importlib import resources

    from sim.catalog import packed

    text = resources.files("sim.catalog").joinpath("gpus.yaml").read_text()
    stale = {"yaml": text + "# edited\n", "data": {"not": "the catalogue"}}
    monkeypatch.setattr(packed, "_packed", lambda: {"gpus.yaml": stale})
    assert "h100-sxm" in packed.load_catalog("gpus.yaml")
    assert packed.same({"a": [1, 2.0, None, True]}, {"a": [1, 2.0, None, True]})
    for a, b in (({"a": 1}, {"a": 1.0}), ({"a": True}, {"a": 1}), ([1, 2], (1, 2)), ({1: 2}, {"1": 2}),
                 ({"a": 1, "b": 2}, {"b": 2, "a": 1})):
        assert not packed.same(a, b), (a, b)
    # a packed file that is not what pack() writes (a merge conflict in it): every catalogue from its YAML
    monkeypatch.undo()
    real = resources.files("sim.catalog")
    text = real.joinpath("gpus.yaml").read_text()
    for broken in (b'{"gpus.yaml": {"yaml": "<<<<<<< HEAD', b'{"gpus.yaml": {"sha256": "x", "data": {}}}', b"[1]"):
        monkeypatch.setattr(packed.resources, "files", lambda _pkg, b=broken: _Files(b, real))
        packed._packed.cache_clear()
        try:
            assert packed.load_catalog("gpus.yaml") == yaml.safe_load(text)
        finally:
            packed._packed.cache_clear()
        monkeypatch.undo()
    # a checkout with CRLF line ends reads the packed copy (read_text's universal newlines)
    monkeypatch.setattr(packed, "_packed", lambda: {"gpus.yaml": {"yaml": text, "data": "packed"}})
    monkeypatch.setattr(packed.resources, "files", lambda _pkg: _Files(None, real, crlf=True))
    assert packed.load_catalog("gpus.yaml") == "packed"
    monkeypatch.undo()
    monkeypatch.setattr(packed, "load_shipped_yaml", lambda text: {1: "an int key"})
    with pytest.raises(ValueError, match="cannot be packed"):
        packed.pack()


@pytest.mark.parametrize("env", [{}, {"TTY_COMPATIBLE": "0"}, {"TTY_COMPATIBLE": "1"}, {"FORCE_COLOR": ""},
                                 {"FORCE_COLOR": "1"}, {"TTY_COMPATIBLE": "0", "FORCE_COLOR": "1"}])
@pytest.mark.parametrize("tty", [False, True])
def test_progress_is_skipped_only_where_rich_would_disable_it(env, tty, monkeypatch):
    """``stderr_may_be_terminal`` (decided without importing rich) is never False where rich's
    ``Console(stderr=True).is_terminal`` is True: a run skips its progress bar only where rich
    would have drawn nothing."""
    import io

    from rich.console import Console

    from sim.cli.consoles import stderr_may_be_terminal

    class Stream(io.StringIO):
        def isatty(self):
            return tty

    for k in ("TTY_COMPATIBLE", "FORCE_COLOR"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(sys, "stderr", Stream())
    if Console(stderr=True).is_terminal:
        assert stderr_may_be_terminal()
    if not tty and not env.get("FORCE_COLOR") and env.get("TTY_COMPATIBLE") != "1":
        assert not stderr_may_be_terminal()  # the case it exists for: no rich import
