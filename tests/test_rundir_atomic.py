"""A run directory is replaced whole or not at all (issue 38, "Data lost"): a full disk, a crash
at any stage, or two commands writing one ``--out`` at once leave the old run or the new one,
whole, never a mix; what a killed process left is removed by the next command."""

import errno
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import polars as pl
import pytest
import yaml

import sim.files.atomic as atomic
import sim.output as output
from sim.analysis.compare import run_compare
from sim.files.atomic import replacing_dir
from sim.cli.run_cmd import run_command
from sim.errors import UserError
from sim.reporting.rundata import load_run
from tests.conftest import ROOT, small_scenario


def _scenario(tmp_path, num_requests=60, seed=1, name="s.yaml", every_policy=False) -> Path:
    raw = small_scenario(seed=seed)
    raw["workload"]["synthetic"]["num_requests"] = num_requests
    if every_policy:  # the 512 budget legal for static and continuous too (vLLM's start-up rule)
        raw["engine"]["max_model_len"] = 512
    p = tmp_path / name
    p.write_text(yaml.safe_dump(raw))
    return p


def _run(scenario, out, force=False):
    run_command(scenario, None, None, [], out, True, force)


def _files(d: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def _siblings(parent: Path, keep=()) -> list[str]:
    """Entries of ``parent`` other than ``keep``: leftovers."""
    return sorted(n for n in os.listdir(parent) if n not in keep)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", ""])
    p.wait()
    return p.pid


def _seed_of(run_dir: Path) -> int:
    return load_run(run_dir).scenario["seed"]


# -- a full disk -------------------------------------------------------------------------------

def _failing_parquet_writer(monkeypatch, fail_at_call: int):
    """``write_parquet`` that writes some bytes and then finds the disk full at its
    ``fail_at_call``-th call (1: requests.parquet, 2: steps.parquet)."""
    real, calls = output.write_parquet, []

    def writer(path, num_rows, rows):
        calls.append(path)
        if len(calls) == fail_at_call:
            Path(path).write_bytes(b"PAR1 half a file")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, num_rows, rows)
    monkeypatch.setattr(output, "write_parquet", writer)


@pytest.mark.parametrize("fail_at_call", [1, 2])
def test_a_full_disk_under_force_leaves_the_old_run_whole(tmp_path, monkeypatch, fail_at_call):
    out = tmp_path / "out"
    _run(_scenario(tmp_path, 40), out)
    before = _files(out)
    _failing_parquet_writer(monkeypatch, fail_at_call)
    with pytest.raises(OSError) as err:
        _run(_scenario(tmp_path, 80, seed=2, name="big.yaml"), out, force=True)
    assert err.value.errno == errno.ENOSPC
    # named by the file it would have been, and saying the run directory is untouched
    assert err.value.filename.startswith(str(out / "")) and "as it was" in err.value.strerror
    assert _files(out) == before
    assert load_run(out).requests.height == 40
    assert _siblings(tmp_path, {"out", "s.yaml", "big.yaml"}) == []


def test_a_full_disk_during_compare_leaves_the_old_runs_and_report_whole(tmp_path, monkeypatch):
    out = tmp_path / "cmp"
    run_compare(_scenario(tmp_path, 30, every_policy=True), ["static", "continuous"], None, [], out)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    # the first policy's run is written whole, the second's finds the disk full
    _failing_parquet_writer(monkeypatch, 3)
    with pytest.raises(OSError):
        run_compare(_scenario(tmp_path, 50, seed=3, name="t.yaml", every_policy=True), ["static", "continuous"], None, [], out,
                    force=True)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert _siblings(tmp_path, {"cmp", "s.yaml", "t.yaml"}) == []


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 600 KB tmpfs (root only); skipped where it cannot be mounted."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if shutil.which("mount") is None or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_force_on_a_really_full_disk_keeps_the_old_run_and_report_reads_it(tmp_path, small_tmpfs):
    """The issue's case: 300 requests, then 6,000 with --force on a 600 KB tmpfs."""
    out = small_tmpfs / "run"
    _run(_scenario(tmp_path, 300), out)
    before = _files(out)
    with pytest.raises(OSError) as err:
        _run(_scenario(tmp_path, 6000, seed=2, name="big.yaml"), out, force=True)
    assert err.value.errno == errno.ENOSPC
    assert _files(out) == before and _siblings(small_tmpfs, {"run"}) == []
    p = subprocess.run([sys.executable, "-m", "sim", "report", str(out), "-o", str(tmp_path / "r.html")],
                       cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


# -- a crash at each stage ---------------------------------------------------------------------

def _write_run_like(d: Path, text: str) -> None:
    for name in output.RUN_FILES:
        (d / name).write_text(text)


def _crash_in_child(out: Path, stage: str) -> None:
    """Replace ``out`` (holding "old" files) with "new" ones in a forked child that dies with
    ``os._exit`` (no clean-up runs, as with kill -9) at ``stage``."""
    pid = os.fork()
    if pid == 0:  # the child: file operations only, then _exit
        try:
            real_rename = os.rename
            if stage == "swap":  # just before the names are exchanged
                atomic.exchange = lambda a, b: os._exit(9)
            elif stage == "old removal":  # names exchanged; the old run not yet removed
                shutil.rmtree = lambda *a, **k: os._exit(9)
            elif stage == "parked":  # no exchange: the old run renamed away, the new not yet in
                atomic.exchange = lambda a, b: False

                def rename_then_die(a, b):
                    real_rename(a, b)
                    os._exit(9)
                os.rename = rename_then_die
            with replacing_dir(out, True, lambda p: []) as new:
                (new / "requests.parquet").write_text("new")
                if stage == "writing":
                    os._exit(9)
                _write_run_like(new, "new")
        finally:
            os._exit(0 if stage == "none" else 3)
    assert os.waitpid(pid, 0)[1] >> 8 == (0 if stage == "none" else 9)


def _whole(out: Path) -> str:
    """'old' or 'new': every file of ``out`` from the same writer, and all of them there."""
    contents = {p.name: p.read_text() for p in out.iterdir()}
    assert sorted(contents) == sorted(output.RUN_FILES), contents
    assert len(set(contents.values())) == 1, contents
    return next(iter(contents.values()))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("stage, holds", [("writing", "old"), ("swap", "old"), ("old removal", "new"),
                                          ("parked", None), ("none", "new")])
def test_a_crash_at_each_stage_leaves_old_or_new_whole_and_the_next_run_cleans_up(tmp_path, stage, holds):
    out = tmp_path / "run"
    out.mkdir()
    _write_run_like(out, "old")
    _crash_in_child(out, stage)
    if holds is None:
        # a file system with no exchange of names, killed between its two renames: the old run
        # is parked whole beside the name, and the next command puts it back before anything else
        assert not out.exists()
        with pytest.raises(UserError, match="already exists"):
            with replacing_dir(out, False, lambda p: []):
                pass
        holds = "old"
    assert _whole(out) == holds
    with replacing_dir(out, True, lambda p: []) as new:  # the next run
        _write_run_like(new, "next")
    assert _whole(out) == "next" and _siblings(tmp_path, {"run"}) == []


def test_without_an_exchange_of_names_force_still_replaces_whole(tmp_path, monkeypatch):
    out = tmp_path / "run"
    out.mkdir()
    _write_run_like(out, "old")
    monkeypatch.setattr(atomic, "exchange", lambda a, b: False)
    with replacing_dir(out, True, lambda p: []) as new:
        _write_run_like(new, "new")
    assert _whole(out) == "new" and _siblings(tmp_path, {"run"}) == []


def test_the_exchange_of_names_swaps_two_directories(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "x").write_text("a")
    (b / "x").write_text("b")
    if not atomic.exchange(a, b):
        pytest.skip("this file system cannot exchange names")
    assert (a / "x").read_text() == "b" and (b / "x").read_text() == "a"


# -- two writers at once ----------------------------------------------------------------------

def test_a_second_writer_without_force_is_refused_while_the_first_writes(tmp_path):
    out = tmp_path / "run"
    inside, finish, errors = threading.Event(), threading.Event(), []

    def first():
        try:
            with replacing_dir(out, False, lambda p: []) as new:
                _write_run_like(new, "first")
                inside.set()
                finish.wait(10)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
    t = threading.Thread(target=first)
    t.start()
    assert inside.wait(10)
    with pytest.raises(UserError, match=rf"another simsrv command \(pid {os.getpid()}\) is writing it now"):
        with replacing_dir(out, False, lambda p: []):
            pass
    finish.set()
    t.join()
    assert not errors and _whole(out) == "first"
    with pytest.raises(UserError, match="already exists and is not empty"):
        with replacing_dir(out, False, lambda p: []):
            pass
    assert _siblings(tmp_path, {"run"}) == []


def test_of_two_forced_writers_the_last_to_finish_wins_whole(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    _write_run_like(out, "old")
    a_written, b_done = threading.Event(), threading.Event()

    def a():
        with replacing_dir(out, True, lambda p: []) as new:
            _write_run_like(new, "a")
            a_written.set()
            b_done.wait(10)
    t = threading.Thread(target=a)
    t.start()
    assert a_written.wait(10)
    with replacing_dir(out, True, lambda p: []) as new:
        _write_run_like(new, "b")
    assert _whole(out) == "b"
    b_done.set()
    t.join()
    assert _whole(out) == "a" and _siblings(tmp_path, {"run"}) == []


def test_two_runs_started_together_on_one_out_one_wins_the_other_is_refused(tmp_path):
    """Two ``simsrv run`` processes, different seeds, one ``--out``, no --force: exactly one
    writes it (whole: its scenario and its results), the other exits 2 with one line."""
    out = tmp_path / "run"
    scenarios = [_scenario(tmp_path, 2000, seed=s, name=f"s{s}.yaml") for s in (1, 2)]
    procs = [subprocess.Popen([sys.executable, "-m", "sim", "run", str(s), "--out", str(out), "-q"], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for s in scenarios]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 2], results
    loser = next(err for rc, err in results if rc == 2)
    assert loser.count("\n") == 1 and ("is writing it now" in loser or "already exists" in loser), loser
    winner = [1, 2][[rc for rc, _ in results].index(0)]
    run = load_run(out)
    assert run.scenario["seed"] == winner and run.summary["num_prompts"] == run.requests.height == 2000
    assert _siblings(tmp_path, {"run", "s1.yaml", "s2.yaml"}) == []


def test_compare_is_refused_while_another_command_writes_its_out(tmp_path):
    out = tmp_path / "cmp"
    with replacing_dir(out, False, lambda p: []):
        with pytest.raises(UserError, match="is writing it now"):
            run_compare(_scenario(tmp_path, 20, every_policy=True), ["static"], None, [], out)


# -- what --force may replace ------------------------------------------------------------------

def test_force_refuses_a_directory_holding_files_simsrv_did_not_write(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    (out / "result.json").write_text("{}")
    with pytest.raises(UserError, match=r"holds notes.txt, which simsrv did not write"):
        _run(_scenario(tmp_path, 20), out, force=True)
    assert (out / "notes.txt").read_text() == "keep me"
    assert output.not_report_files(out) == ["notes.txt", "result.json"]
    (out / "notes.txt").unlink()
    assert output.not_run_files(out) == []
    # what a killed simsrv left inside (a run written into a compare directory) is simsrv's own
    for leftover in (".static.simsrv-lock", ".static.simsrv-new-1-0", ".report.html.tmp-1"):
        (out / leftover).mkdir() if "new" in leftover else (out / leftover).write_text("")
    assert output.not_run_files(out) == []


# -- temporaries a killed process left ----------------------------------------------------------

def test_stale_temporaries_are_removed_and_a_live_process_s_kept(tmp_path):
    dead, live = _dead_pid(), os.getpid()
    out = tmp_path / "run"
    out.mkdir()
    (out / f".requests.parquet.tmp-{dead}").write_bytes(b"half")
    # a directory holding only what a killed run left counts as empty: no --force needed
    _run(_scenario(tmp_path, 20), out)
    assert sorted(os.listdir(out)) == sorted(output.RUN_FILES)
    (out / f".requests.parquet.tmp-{dead}").write_bytes(b"half")
    (out / f".steps.parquet.tmp-{live}").write_bytes(b"in flight")
    assert atomic.remove_stale_temporaries(out) == [f".requests.parquet.tmp-{dead}"]
    assert (out / f".steps.parquet.tmp-{live}").exists()
    (out / f".steps.parquet.tmp-{live}").unlink()
    (out / f".requests.parquet.tmp-{dead}").write_bytes(b"half")
    _run(_scenario(tmp_path, 30), out, force=True)  # the --force rerun of the issue
    assert sorted(os.listdir(out)) == sorted(output.RUN_FILES)
    assert _siblings(tmp_path, {"run", "s.yaml"}) == []


def test_a_dead_run_s_sibling_directory_and_lock_are_removed_by_the_next_run(tmp_path):
    dead = _dead_pid()
    (tmp_path / f".run.simsrv-new-{dead}-0").mkdir()
    (tmp_path / f".run.simsrv-new-{dead}-0" / "requests.parquet").write_bytes(b"half")
    (tmp_path / f".other.simsrv-new-{dead}-3").mkdir()
    (tmp_path / ".run.simsrv-lock").write_text(f"{dead}\n")  # a kill -9 leaves the (unlocked) file
    live = tmp_path / f".busy.simsrv-new-{os.getpid()}-99"
    live.mkdir()
    _run(_scenario(tmp_path, 20), tmp_path / "run")
    assert _siblings(tmp_path, {"run", "s.yaml"}) == [live.name]


def test_sweep_resume_removes_the_temporaries_a_killed_sweep_left(tmp_path):
    from sim.scenario import scenario_from_dict
    from sim.sweep.executors import SerialExecutor
    from sim.sweep.grid import expand, grid_points
    from sim.sweep.runner import run_sweep

    raw = small_scenario()
    raw["workload"]["synthetic"]["num_requests"] = 20
    points = expand(scenario_from_dict(raw), grid_points({"cluster.replicas": [1, 2]}))
    run_sweep(points, [0], tmp_path, SerialExecutor())
    dead = _dead_pid()
    point_dir = next((tmp_path / "runs").iterdir())
    left = [tmp_path / f".sweep.parquet.tmp-{dead}", tmp_path / f".aggregate.parquet.tmp-{dead}",
            point_dir / f".seed-0.json.tmp-{dead}", point_dir / f"seed-0.tmp{dead}"]
    for p in left:
        p.write_bytes(b"half")
    kept = point_dir / f".seed-0.json.tmp-{os.getpid()}"
    kept.write_bytes(b"in flight")
    res = run_sweep(points, [0], tmp_path, SerialExecutor(), resume=True)
    assert res.num_skipped == 2 and not any(p.exists() for p in left) and kept.exists()


# -- report refuses files from different runs ---------------------------------------------------

def test_report_refuses_a_directory_whose_files_come_from_different_runs(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _run(_scenario(tmp_path, 30), a)
    _run(_scenario(tmp_path, 50, name="t.yaml"), b)
    shutil.copy(b / "requests.parquet", a / "requests.parquet")  # what the old --force on a full disk left
    with pytest.raises(UserError, match="not from one run: result.json says requests 30, requests.parquet has 50"):
        load_run(a)
    p = subprocess.run([sys.executable, "-m", "sim", "report", str(a), "-o", str(tmp_path / "r.html")],
                       cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "not from one run" in p.stderr, p.stderr
    shutil.copy(b / "requests.parquet", a / "requests.parquet")
    summary = json.loads((b / "result.json").read_text())
    shutil.copy(b / "steps.parquet", a / "steps.parquet")
    (a / "result.json").write_text(json.dumps({**summary, "simsrv_policy": "static"}))
    with pytest.raises(UserError, match="says policy static, scenario.resolved.yaml has chunked"):
        load_run(a)
    assert pl.read_parquet(b / "requests.parquet").height == load_run(b).requests.height == 50


def test_an_out_below_a_file_is_one_line(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(UserError, match=r"f is not a directory"):
        _run(_scenario(tmp_path, 20), tmp_path / "f" / "sub" / "run")
