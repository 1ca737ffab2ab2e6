"""Hostile names (issue 38): a file or directory name holding a byte that is not UTF-8, a
scenario name made of YAML surrogate escapes, a grid or trace named ``<!--<script>``.

Each command is run as a process (its stdout a pipe, strict UTF-8, as a shell's would be) with
names drawn by a seeded generator from hostile pieces; it must succeed, print valid UTF-8,
write its outputs, and every page it writes must keep its data script intact.

And a hostile end: a sweep's pool workers end, silently, with the process that started them
(after a SIGKILL of the parent they used to finish their task, then print two BrokenPipeError
tracebacks sending its result to nobody)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, small_scenario

PIECES = [b"caf\xe9", b"\xff", b"\x80x", b" ", b"<!--<script>", b"<script", b"'", b"&amp;", b"%s",
          "\U0001f600".encode()]
TRACE = ROOT / "traces" / "samples" / "mooncake_synthetic_first500.jsonl"


def _name(rng: random.Random, suffix: bytes = b"") -> bytes:
    """A seeded hostile file name: always one byte that is not UTF-8, then 1-3 other pieces."""
    return b"caf\xe9" + b"".join(rng.choice(PIECES) for _ in range(rng.randint(1, 3))) + suffix


@pytest.fixture
def work(tmp_path) -> Path:
    try:
        os.mkdir(os.fsencode(tmp_path) + b"/probe\xe9")
    except (OSError, UnicodeError):
        pytest.skip("this file system refuses names that are not UTF-8")
    raw = small_scenario()
    raw["workload"]["synthetic"]["num_requests"] = 20
    raw["engine"]["max_model_len"] = 512  # a 512 budget legal for continuous too (vLLM's start-up rule)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "t.jsonl").write_text("".join(TRACE.read_text().splitlines(keepends=True)[:30]))
    return tmp_path


def _simsrv(cwd: Path, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    argv = [sys.executable, "-m", "sim", *(a if isinstance(a, bytes) else str(a) for a in args)]
    p = subprocess.run(argv, cwd=cwd, capture_output=True, env=env, timeout=120)
    err = p.stderr.decode("utf-8", "replace")
    assert p.returncode == 0 and "Traceback" not in err, err[-3000:]
    p.stdout.decode("utf-8")  # strict: every name printed as text
    p.stderr.decode("utf-8")
    return p


def _at(cwd: Path, name: bytes) -> bytes:
    return os.fsencode(cwd) + b"/" + name


def _data_script(page: bytes) -> str:
    """The page's chart data (the JSON after ``const specs =``), checked to hold no text that
    would end or unbalance its <script> block, and to be the last thing before the page's end."""
    text = page.decode("utf-8")
    start = text.index("const specs = ") + len("const specs = ")
    end = text.index(";\n", start)
    specs = text[start:end]
    for bad in ("<!--", "<script", "</script", "</"):
        assert bad not in specs.lower()
    closing = text.index("</script", start)
    assert text[closing:].startswith("</script></body></html>")
    assert "\udce9" not in text
    return specs


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        value = [*value.keys(), *value.values()]
    return [t for v in value for t in _strings(v)] if isinstance(value, list) else []


@pytest.mark.parametrize("seed", [1])
def test_run_writes_and_prints_a_run_directory_with_a_non_utf8_name(work, seed):
    out = _name(random.Random(seed))
    p = _simsrv(work, "run", "s.yaml", "--out", out)
    assert os.path.isfile(_at(work, out) + b"/requests.parquet")
    assert os.path.isfile(_at(work, out) + b"/result.json")
    assert "caf\\xe9" in p.stdout.decode()
    # and report reads it back, writing a page with a hostile name too
    page = _name(random.Random(seed + 100), b".html")
    _simsrv(work, "report", out, "-o", page)
    _data_script(open(_at(work, page), "rb").read())


@pytest.mark.parametrize("seed", [2])
def test_compare_with_a_non_utf8_directory_and_a_surrogate_scenario_name(work, seed):
    raw = yaml.safe_load((work / "s.yaml").read_text())
    raw["workload"]["synthetic"]["num_requests"] = 10
    text = yaml.safe_dump(raw).replace("name: t", 'name: "\\ud83d\\ude00 x \\ud83d <!--<script>"')
    (work / "e.yaml").write_text(text)
    out = _name(random.Random(seed))
    _simsrv(work, "compare", "e.yaml", "--policies", "chunked,continuous", "--out", out)
    page = open(_at(work, out) + b"/report.html", "rb").read()
    _data_script(page)
    assert "\U0001f600 x \\ud83d" in page.decode()


def _hostile_trace(work, rng: random.Random) -> bytes:
    """A copy of the test trace under a name that is not UTF-8."""
    trace = _name(rng, b".jsonl")
    with open(_at(work, trace), "wb") as f:
        f.write((work / "t.jsonl").read_bytes())
    return trace


@pytest.mark.parametrize("seed", [3])
def test_trace_inspect_html_and_convert_of_a_trace_with_a_non_utf8_name(work, seed):
    rng = random.Random(seed)
    trace = _hostile_trace(work, rng)
    page = _name(rng, b".html")
    p = _simsrv(work, "trace", "inspect", trace, "--html", page)
    assert "caf\\xe9" in p.stdout.decode()
    specs = json.loads(_data_script(open(_at(work, page), "rb").read()))
    from sim.files.text import shown

    assert any(shown(trace) in t for t in _strings(specs))  # the charts' titles name the trace
    out = _name(rng, b".parquet")
    _simsrv(work, "trace", "convert", trace, "-o", out)
    import pyarrow.parquet as pq

    with open(_at(work, out), "rb") as f:
        meta = pq.ParquetFile(f).schema_arrow.metadata
    assert meta[b"source_file"].decode("utf-8").startswith("caf\\xe9")
    _simsrv(work, "trace", "inspect", out, "--json")


@pytest.mark.parametrize("seed", [4])
def test_diagnose_of_a_trace_with_a_non_utf8_name(work, seed):
    rng = random.Random(seed)
    trace = _hostile_trace(work, rng)
    out = _name(rng)
    _simsrv(work, "diagnose", trace, "--out", out)
    _data_script(open(_at(work, out) + b"/report.html", "rb").read())


@pytest.mark.parametrize("seed", [5])
def test_sweep_with_a_non_utf8_directory_and_a_hostile_grid(work, seed):
    rng = random.Random(seed)
    grid = b"g<!--<script>" + _name(rng, b".yaml")
    with open(_at(work, grid), "wb") as f:
        f.write(b'name: ["a<!--<script>", "b</script>", "\\ud83d c"]\n')
    out = _name(rng)
    _simsrv(work, "sweep", "s.yaml", "--grid", grid, "--seeds", "1", "--workers", "1", "--out", out)
    for f in (b"/sweep.parquet", b"/aggregate.parquet"):
        assert os.path.isfile(_at(work, out) + f)
    specs = _data_script(open(_at(work, out) + b"/report.html", "rb").read())
    assert "\\u003c!--\\u003cscript\\u003e" in specs


def test_shown_renders_paths_and_surrogates_as_encodable_text():
    from sim.files.text import shown, shown_data

    assert shown(b"caf\xe9") == "caf\\xe9"
    assert shown(Path(os.fsdecode(b"d\xff/x"))) == "d\\xff/x"
    assert shown("\ud83d\ude00 x") == "\U0001f600 x"
    assert shown("\ud83d x \udc00") == "\\ud83d x \\udc00"
    assert shown("plain é") == "plain é"
    rng = random.Random(6)
    for _ in range(300):  # whatever surrogates a string holds, the result encodes
        s = "".join(chr(rng.choice([rng.randint(0xD800, 0xDFFF), rng.randint(32, 0x2FF), 0x1F600]))
                    for _ in range(rng.randint(0, 8)))
        shown(s).encode("utf-8")
        json.dumps(shown_data({s: [s]}), ensure_ascii=False).encode("utf-8")
        s.encode("utf-8", "shown")


def test_every_page_embeds_its_data_through_one_escape():
    from sim.reporting.html import Page, script_json
    import altair as alt

    hostile = "<!--<script>x</script>\u2028&\udce9"
    page = Page(hostile)
    page.paragraph(hostile)
    page.chart(alt.Chart(alt.Data(values=[{"name": hostile, "v": 1}])).mark_bar().encode(x="name:N", y="v:Q"))
    specs = _data_script(page.render().encode("utf-8"))
    assert json.loads(specs) == json.loads(script_json(page.specs))
    assert "<!--<script>x</script>\u2028&\\xe9" in _strings(json.loads(specs))  # the data, whole


PARENT = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, os.getcwd())

    def start_without_prctl():  # the portable path: the thread that waits on the parent's sentinel
        import sim.sweep.executors as e
        e._kill_with_parent = lambda: False
        e._exit_with_parent()

    if __name__ == "__main__":
        import multiprocessing as mp
        from sim.sweep.executors import LocalExecutor, _quiet_resource_tracker
        if sys.argv[1] == "pool":
            pool = LocalExecutor(1).pool
        else:
            import parent
            _quiet_resource_tracker()
            pool = mp.get_context("spawn").Pool(1, initializer=parent.start_without_prctl)
        worker = pool.apply(os.getpid)
        pool.apply_async(time.sleep, (4,))
        print(worker, flush=True)
        time.sleep(60)
""")


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
@pytest.mark.parametrize("how", ["pool", "thread"])
def test_pool_workers_die_quietly_with_a_killed_parent(tmp_path, how):
    (tmp_path / "parent.py").write_text(PARENT)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
    proc = subprocess.Popen([sys.executable, "parent.py", how], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    worker = int(proc.stdout.readline())  # a worker is up, and busy for 4 s
    proc.send_signal(signal.SIGKILL)
    t0 = time.monotonic()
    # stderr ends when every process holding it (the worker, the resource tracker) has ended
    _, err = proc.communicate(timeout=30)
    assert err.decode() == "", err.decode()
    assert time.monotonic() - t0 < 3.0, "the worker finished its task instead of ending with its parent"
    assert not _alive(worker)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        return False


COMMANDS = {  # a command line per command that writes, its output named by OUT
    "run": ["run", "s.yaml", "--out", "OUT"],
    "compare": ["compare", "s.yaml", "--policies", "chunked", "--out", "OUT"],
    "diagnose": ["diagnose", "t.jsonl", "--out", "OUT"],
    "sweep": ["sweep", "s.yaml", "--grid", "g.yaml", "--seeds", "1", "--workers", "1", "--out", "OUT"],
    "capacity": ["capacity", "s.yaml", "--slo", "ttft_p99_ms=500", "--seeds", "1", "--workers", "1", "--out", "OUT"],
    "trace inspect": ["trace", "inspect", "t.jsonl", "--html", "OUT"],
    "trace convert": ["trace", "convert", "t.jsonl", "-o", "OUT"],
    "report": ["report", "run-dir", "-o", "OUT"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_output_that_cannot_be_written_is_refused_before_any_work(tmp_path, monkeypatch, command):
    from tests.inproc_cli import simsrv

    raw = small_scenario()
    raw["workload"]["synthetic"]["num_requests"] = 10
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "g.yaml").write_text("engine.max_num_batched_tokens: [512]\n")
    (tmp_path / "t.jsonl").write_text("".join(TRACE.read_text().splitlines(keepends=True)[:30]))
    (tmp_path / "a-file").write_text("")
    monkeypatch.chdir(tmp_path)

    def no_work(*args, **kwargs):
        raise AssertionError("simulated before checking the output")

    # modules that bind run_scenario when imported, imported first: they keep the real one
    import sim.analysis.compare  # noqa: F401
    import sim.analysis.diagnose  # noqa: F401
    import sim.analysis.diagnose_fixes  # noqa: F401
    import sim.cli.app  # noqa: F401
    import sim.run
    import sim.sweep.task  # noqa: F401
    import sim.workload.inspect

    monkeypatch.setattr(sim.run, "run_scenario", no_work)
    monkeypatch.setattr(sim.workload.inspect, "trace_stats", no_work)
    suffix = {"trace inspect": ".html", "trace convert": ".parquet", "report": ".html"}.get(command, "")
    args = [a.replace("OUT", f"a-file/out{suffix}") for a in COMMANDS[command]]
    out = simsrv(*args)
    assert out.clean and out.code == 2, out.stderr
    flag = args[args.index(next(a for a in args if a.startswith("a-file"))) - 1]
    assert out.lines[-1].startswith(f"error: {flag} a-file/out{suffix}: a-file is not a directory"), out.stderr
