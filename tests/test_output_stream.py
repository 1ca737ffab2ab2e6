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
from sim.output import _write_parquet, row_group_rows, write_run
from tests.conftest import WALL_CLOCK_KEYS, small_scenario


def test_parquet_written_by_row_groups_is_the_whole_frame_write():
    n = 300_007  # polars splits this into 3 row groups
    rng = np.random.default_rng(0)
    frame = pl.DataFrame({
        "id": np.arange(n), "x": rng.random(n), "y": np.where(rng.random(n) < 0.05, np.nan, rng.random(n)),
        "status": np.array(["completed", "failed"], dtype=object)[(rng.random(n) < 0.02).astype(int)].tolist(),
    }, nan_to_null=False).with_columns(pl.col(pl.Float64).fill_nan(None))
    assert len(row_group_rows(n)) == 3 and sum(row_group_rows(n)) == n
    import io

    whole, parts = io.BytesIO(), io.BytesIO()
    frame.write_parquet(whole, statistics=False)
    seen = []

    def rows(a, b):
        seen.append(b - a)
        return frame[a:b]
    _write_parquet(parts, n, rows)
    assert seen == row_group_rows(n)
    assert parts.getvalue() == whole.getvalue()


def _run_dir(tmp_path, name, block_rows, monkeypatch):
    from sim.analysis.summary import summarize
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
    assert mem.step_store._dir is None and disk.step_store._dir is not None
    assert disk.results._buf._dir is not None and disk.num_step_rows > 64
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


def test_row_groups_read_from_the_footer_as_pyarrow_reads_them(tmp_path):
    import pyarrow.parquet as pq

    from sim.parquet_rows import row_group_rows as footer_rows

    rng = np.random.default_rng(1)
    frame = pl.DataFrame({"a": np.arange(1000), "b": rng.random(1000), "s": ["x", None] * 500,
                          "flag": [True, False] * 500})
    for sizes in ([1000], [300, 300, 400], [1] * 5):
        path = tmp_path / f"{len(sizes)}.parquet"
        frame[:sum(sizes)].write_parquet(path, row_group_size=sizes[0], statistics=True,
                                         metadata={"k": "v"})
        meta = pq.ParquetFile(path).metadata
        assert footer_rows(path.read_bytes()) == [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    for n in (0, 5, 300_007, 1_048_576):
        buf = __import__("io").BytesIO()
        pl.select(pl.repeat(None, n, dtype=pl.Int8).alias("x")).write_parquet(buf, statistics=False)
        meta = pq.ParquetFile(buf).metadata
        assert row_group_rows(n) == [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    with pytest.raises(ValueError, match="not a Parquet"):
        footer_rows(b"abcdefgh")


class _FullDisk:
    def tofile(self, f):  # what numpy raises when the disk fills mid-write
        raise OSError("32768 requested and 5632 written")


def test_a_full_spill_disk_is_one_error_naming_the_directory_and_tmpdir(tmp_path):
    """numpy's tofile on a full disk says only '32768 requested and 5632 written': the error
    the CLI prints (filename: strerror) must name the spill directory and what to do."""
    buf = ColumnBuffer(("a",), block_rows=2)
    buf._dir = tmp_path
    buf._chunks[0].append(_FullDisk())
    with pytest.raises(OSError) as err:
        buf._spill()
    assert err.value.filename == str(tmp_path)
    assert "5632 written" in err.value.strerror and "TMPDIR" in err.value.strerror


def test_sigterm_removes_the_runs_column_files(tmp_path):
    """``kill`` (SIGTERM) of a run that keeps its columns on disk exits 143 and leaves nothing
    under $TMPDIR (the default action skipped Python's exit, leaving the directory)."""
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
    deadline = time.monotonic() + 120
    while not any(p.name.startswith("simsrv-columns-") for p in spill.iterdir()):
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    assert list(spill.iterdir()) == []
    assert not (tmp_path / "run").exists()
