"""Results and step rows spilled to disk as they fill, the run directory written a row group at
a time (issue 14: bounded memory): the same bytes as writing the whole frames at once."""

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from sim.core.request import Request
from sim.engine import columns as column_store
from sim.engine.columns import ColumnBuffer
from sim.engine.results import RequestResults
from sim.output import ROW_GROUP_ROWS, _table, write_parquet, write_run
from tests.conftest import WALL_CLOCK_KEYS, small_scenario


def test_parquet_written_a_row_group_at_a_time_holds_the_rows_and_nulls():
    """``write_parquet`` asks for one row group's rows at a time, writes each as one row group,
    and a NaN float is read back as null (strings and integers as given)."""
    import io

    import pyarrow.parquet as pq

    n = 2 * ROW_GROUP_ROWS + 7
    rng = np.random.default_rng(0)
    cols = {"id": np.arange(n), "x": rng.random(n), "y": np.where(rng.random(n) < 0.05, np.nan, rng.random(n))}
    status = np.array(["completed", "failed"], dtype=object)[(rng.random(n) < 0.02).astype(int)]
    seen = []

    def rows(a, b):
        seen.append((a, b))
        return _table({**{c: v[a:b] for c, v in cols.items()}, "status": status[a:b]})
    buf = io.BytesIO()
    write_parquet(buf, n, rows)
    assert seen == [(0, ROW_GROUP_ROWS), (ROW_GROUP_ROWS, 2 * ROW_GROUP_ROWS), (2 * ROW_GROUP_ROWS, n)]
    meta = pq.ParquetFile(io.BytesIO(buf.getvalue())).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [ROW_GROUP_ROWS, ROW_GROUP_ROWS, 7]
    back = pl.read_parquet(io.BytesIO(buf.getvalue()))
    assert back.columns == ["id", "x", "y", "status"]
    assert back["id"].to_list() == list(range(n)) and np.array_equal(back["x"].to_numpy(), cols["x"])
    assert back["y"].null_count() == int(np.isnan(cols["y"]).sum()) > 0
    assert np.array_equal(back["y"].fill_null(np.nan).to_numpy(), cols["y"], equal_nan=True)
    assert back["status"].to_list() == status.tolist() and back.schema["status"] == pl.String
    empty = io.BytesIO()
    write_parquet(empty, 0, rows)
    assert pl.read_parquet(io.BytesIO(empty.getvalue())).shape == (0, 4)


def test_arrow_columns_of_other_types_keep_their_type_and_nulls():
    """Every column of today's run files is int64, float64 or text; any other numpy type is
    still written as itself (NaN as null for floats)."""
    import io

    t = _table({"i32": np.array([1, 2], dtype=np.int32), "flag": np.array([True, False]),
                "f32": np.array([1.5, np.nan], dtype=np.float32), "f64": np.array([np.nan, 2.0])})
    buf = io.BytesIO()
    write_parquet(buf, 2, lambda a, b: t.slice(a, b - a))
    back = pl.read_parquet(io.BytesIO(buf.getvalue()))
    assert back.schema == {"i32": pl.Int32, "flag": pl.Boolean, "f32": pl.Float32, "f64": pl.Float64}
    assert back.rows() == [(1, True, 1.5, None), (2, False, None, 2.0)]


def _run_dir(tmp_path, name, block_rows, monkeypatch):
    from sim.metrics.summary import summarize
    from sim.run import run_scenario
    from sim.scenario import scenario_from_dict

    monkeypatch.setattr(column_store, "BLOCK_ROWS", block_rows)
    s = scenario_from_dict(small_scenario(engine={"policy": "chunked", "max_num_batched_tokens": 256}))
    result = run_scenario(s)
    summary = summarize(result)
    for k in WALL_CLOCK_KEYS:
        summary.pop(k)
    out = write_run(result, summary, tmp_path / name)
    return result, out


def test_spilled_run_writes_the_same_files_and_frames(tmp_path, monkeypatch):
    """Blocks of 64 step rows and 32 requests: every column goes through the files on disk,
    and requests ending out of id order are put back in order."""
    mem, a = _run_dir(tmp_path, "in_memory", 1 << 15, monkeypatch)
    disk, b = _run_dir(tmp_path, "spilled", 64, monkeypatch)
    assert mem.step_store._files is None and disk.step_store._files is not None
    assert disk.results._buf._files is not None and disk.num_step_rows > 64
    for f in ("requests.parquet", "steps.parquet", "result.json"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    assert json.loads((b / "result.json").read_text())["num_prompts"] == 200
    assert disk.requests.equals(mem.requests) and disk.steps.equals(mem.steps)
    assert disk.requests["request_id"].to_list() == list(range(200))
    assert disk.requests.equals(pl.read_parquet(b / "requests.parquet").with_columns(
        pl.col(pl.Float64).fill_null(np.nan)).select(disk.requests.columns))


def test_results_out_of_order_are_released_in_order_and_checked():
    res = RequestResults(block_rows=2)
    order = [1, 0, 3, 5, 2, 4, 7, 6]
    for i in order:
        res.add([Request(i, 0.1 * i, 5, 5)])
    res.sent = len(order)
    res.finish()
    assert res.read("request_id").tolist() == list(range(8))
    assert np.allclose(res.read("arrival_s"), 0.1 * np.arange(8))
    assert res.read("request_id", 2, 5).tolist() == [2, 3, 4]
    gap = RequestResults(block_rows=2)
    for i in (0, 1, 3, 4):
        gap.add([Request(i, 0.0, 5, 5)])
    gap.sent = 4
    with pytest.raises(AssertionError, match="exactly once"):
        gap.finish()


class _FullDisk:
    def seek(self, *a):
        return 0

    def write(self, data):  # what a write raises when the disk fills
        raise OSError(28, "No space left on device")


def test_a_full_spill_disk_is_one_error_naming_the_directory_and_tmpdir(tmp_path, monkeypatch):
    """The column files have no name: the error the CLI prints (filename: strerror) names the
    temporary directory they live in and what to do."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    buf = ColumnBuffer(("a",), block_rows=2)
    buf._files = [_FullDisk()]
    buf._chunks[0].append(np.zeros(4))
    with pytest.raises(OSError) as err:
        buf._spill()
    assert err.value.filename == str(tmp_path) and err.value.errno == 28
    assert "No space left" in err.value.strerror and "TMPDIR" in err.value.strerror


def test_reads_between_spills_do_not_move_where_rows_are_appended():
    buf = ColumnBuffer(("a", "b"), int_names={"b"}, block_rows=2)
    for i in range(5):
        buf.append((i * 0.5, i))
    assert buf._files is not None and buf.read("b", 1, 3).tolist() == [1, 2]
    for i in range(5, 9):
        buf.append((i * 0.5, i))
    buf.finish()
    assert buf.read("b").tolist() == list(range(9)) and buf.read("a").tolist() == [i * 0.5 for i in range(9)]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc (Linux) to see the run's open files")
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_killed_run_leaves_nothing_under_tmpdir(tmp_path, sig):
    """``kill`` (SIGTERM: exit 143 through Python's exit) or ``kill -9`` (no clean-up runs at
    all) of a run that keeps its columns on disk leaves nothing under $TMPDIR: the column files
    are anonymous, so the kernel frees them with the process."""
    import os
    import signal
    import subprocess
    import sys
    import time

    spill = tmp_path / "tmp"
    spill.mkdir()
    env = {**os.environ, "TMPDIR": str(spill)}
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-m", "sim", "run", "scenarios/chat.yaml", "--out", str(tmp_path / "run"),
                             "-q"], env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def anonymous_under_spill() -> bool:
        """A column file is open: one under $TMPDIR with no name ("... (deleted)"). A named one
        is not waited for: CPython's first tempfile call probes $TMPDIR by writing a named
        file it removes after closing, and a kill in that moment leaves it (not simsrv's)."""
        try:
            links = [os.readlink(f"/proc/{proc.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{proc.pid}/fd")]
        except OSError:  # an fd closed while listed
            return False
        return any(link.startswith(str(spill)) and link.endswith(" (deleted)") for link in links)
    deadline = time.monotonic() + 120
    while not anonymous_under_spill():
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(getattr(signal, sig))
    assert proc.wait(timeout=60) == (143 if sig == "SIGTERM" else -signal.SIGKILL)
    assert list(spill.iterdir()) == []
    assert not (tmp_path / "run").exists()
    # a kill -9 leaves the run's unfinished sibling directory; SIGTERM removes it on the way out
    left = [p.name for p in tmp_path.iterdir() if p.name not in ("tmp",)]
    assert all(n.startswith(".run.simsrv-") for n in left) and (sig == "SIGKILL" or not left), left
