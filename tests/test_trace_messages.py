"""Traces as users hand them over (issue 38): with blank lines, gzip-compressed, through a pipe
(``<(zcat t.gz)``, a FIFO), or not a trace at all (a JSON array, another compression): each is
read as the plain file would be, or refused with one line that says what it is."""

from __future__ import annotations

import gzip
import os
import random
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from sim.errors import UserError
from sim.workload.readers import ReadOptions
from tests.conftest import ROOT

SAMPLES = ROOT / "traces" / "samples"
# (sample, read options): one trace of each text format, cut to its first rows
TRACES = {
    "azure": ("azure_2024_schema_example.csv", ReadOptions()),
    "burstgpt": ("burstgpt_schema_example.csv", ReadOptions()),
    "vidur": ("vidur_splitwise_conv_first500.csv", ReadOptions()),
    "generic": ("generic_ms_example.csv", ReadOptions(format="generic", time_unit="ms", arrival_column="sent_ms",
                                                      input_column="prompt_len", output_column="completion_len")),
    "mooncake": ("mooncake_synthetic_first500.jsonl", ReadOptions()),
    "bailian": ("bailian_schema_example.jsonl", ReadOptions()),
    "aiperf": ("aiperf_schema_example.jsonl", ReadOptions()),
}


def _sample(tmp_path: Path, fmt: str, rows: int = 40) -> tuple[Path, ReadOptions]:
    name, opts = TRACES[fmt]
    lines = (SAMPLES / name).read_text().splitlines(keepends=True)[:rows + 1]
    p = tmp_path / name
    p.write_text("".join(lines))
    return p, opts


def _read(path, opts: ReadOptions):
    import warnings

    from sim.workload.trace import read_trace

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return read_trace(path, opts=opts)


def _same(a, b) -> None:
    assert len(a) == len(b)
    for col in ("arrival_s", "input_tokens", "output_tokens"):
        np.testing.assert_array_equal(getattr(a, col), getattr(b, col))


def _message(path, opts: ReadOptions = ReadOptions()) -> str:
    with pytest.raises(UserError) as e:
        _read(path, opts)
    text = str(e.value)
    assert "\n" not in text and text.startswith(str(path))
    return text


@pytest.mark.parametrize("fmt", sorted(TRACES))
def test_blank_lines_are_skipped_in_every_text_format(tmp_path, fmt):
    path, opts = _sample(tmp_path, fmt)
    want = _read(path, opts)
    rng = random.Random(sorted(TRACES).index(fmt))
    lines = path.read_text().splitlines(keepends=True)
    for _ in range(6):  # blank lines (empty, CRLF, spaces, a tab) at seeded places after the header, and at the end
        lines.insert(rng.randint(2, len(lines)), rng.choice(["\n", "\r\n", "   \n", "\t\r\n"]))
    lines.append("\n")
    blank = tmp_path / f"blank-{path.name}"
    blank.write_text("".join(lines), newline="")
    _same(_read(blank, opts), want)


@pytest.mark.parametrize("fmt", ["azure", "vidur", "generic", "burstgpt"])
def test_a_bad_value_after_blank_lines_is_named_by_its_own_line(tmp_path, fmt):
    path, opts = _sample(tmp_path, fmt, rows=12)
    lines = path.read_text().splitlines(keepends=True)
    rng = random.Random(7)
    bad = rng.randint(6, len(lines) - 1)  # 0-based index of the row made bad
    col = lines[0].split(",").index({"azure": "ContextTokens", "vidur": "num_prefill_tokens",
                                     "generic": "prompt_len", "burstgpt": "Request tokens"}[fmt])
    fields = lines[bad].split(",")
    fields[col] = "oops"
    lines[bad] = ",".join(fields)
    for at in sorted(rng.sample(range(2, bad), 3), reverse=True):
        lines.insert(at, rng.choice(["\n", "  \n", "\t\n"]))
    path.write_text("".join(lines))
    assert f": line {bad + 1 + 3}: " in _message(path, opts)


def test_a_short_row_after_a_blank_line_is_named_by_its_own_line(tmp_path):
    p = tmp_path / "v.csv"
    p.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,1,1\n   \n\n1,2\n")
    assert ": line 5: 2 fields, the header has 3" in _message(p)


@pytest.mark.parametrize("fmt", sorted(TRACES))
def test_gzip_traces_are_read_as_the_plain_file(tmp_path, fmt):
    path, opts = _sample(tmp_path, fmt)
    want = _read(path, opts)
    gz = tmp_path / f"{path.name}.gz"
    gz.write_bytes(gzip.compress(path.read_bytes(), mtime=0))
    _same(_read(gz, opts), want)
    bare = tmp_path / "download"  # no .gz suffix: gzip's magic bytes say it
    shutil.copy(gz, bare)
    _same(_read(bare, opts), want)
    half = len(path.read_bytes()) // 2  # two members, as `cat a.gz b.gz` makes
    (tmp_path / "two.gz").write_bytes(gzip.compress(path.read_bytes()[:half]) + gzip.compress(path.read_bytes()[half:]))
    _same(_read(tmp_path / "two.gz", opts), want)


def test_a_gzip_parquet_trace_is_read(tmp_path):
    from sim.workload.normalized import write_normalized

    path, opts = _sample(tmp_path, "mooncake")
    want = _read(path, opts)
    pq = tmp_path / "t.parquet"
    write_normalized(want, pq)
    gz = tmp_path / "t.parquet.gz"
    gz.write_bytes(gzip.compress(pq.read_bytes()))
    _same(_read(gz, ReadOptions()), want)


def test_broken_compressed_traces_are_one_line_naming_the_compression(tmp_path):
    path, _ = _sample(tmp_path, "mooncake")
    data = gzip.compress(path.read_bytes())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: len(data) // 2])
    assert "gzip data ends early" in _message(cut)
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(data[:10] + random.Random(3).randbytes(200))
    assert "gzip" in _message(bad)
    zst = tmp_path / "t.jsonl.zst"
    zst.write_bytes(b"\x28\xb5\x2f\xfd" + random.Random(4).randbytes(500))
    assert "zstd-compressed" in _message(zst)


@pytest.mark.parametrize("body", ["[1, 2]\n", '[{"timestamp": 0, "input_length": 1, "output_length": 1}]\n',
                                  '[\n  {"a": 1}\n]\n', '["x"]'])
@pytest.mark.parametrize("name", ["t.json", "t.jsonl", "t.csv"])
def test_a_json_array_is_one_clear_line(tmp_path, body, name):
    p = tmp_path / name
    p.write_text(body)
    assert "line 1: a JSON array, not a trace" in _message(p)
    assert "a JSON array" in _message(p, ReadOptions(format="vidur"))


def test_a_csv_header_starting_with_a_bracket_is_still_a_header(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("[ms] arrival,input_tokens,output_tokens\n0,1,1\n")
    assert len(_read(p, ReadOptions(format="generic", arrival_column="[ms] arrival", time_unit="ms"))) == 1


def _feed(fifo: str, data: bytes) -> threading.Thread:
    def write() -> None:
        with open(fifo, "wb") as f:
            f.write(data)
    t = threading.Thread(target=write, daemon=True)
    t.start()
    return t


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("compress", [False, True])
def test_a_fifo_trace_is_read_once_and_whole(tmp_path, compress):
    path, _ = _sample(tmp_path, "mooncake")
    fifo = str(tmp_path / "pipe")
    os.mkfifo(fifo)
    data = path.read_bytes()
    _feed(fifo, gzip.compress(data) if compress else data)
    # trace convert: the format detected, then the trace read; the pipe is read once
    p = subprocess.run([sys.executable, "-m", "sim", "trace", "convert", fifo, "-o", str(tmp_path / "out.parquet")],
                       cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    _same(_read(tmp_path / "out.parquet", ReadOptions()), _read(path, ReadOptions()))


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash's process substitution")
def test_process_substitution_trace_inspect(tmp_path):
    path, _ = _sample(tmp_path, "vidur")
    p = subprocess.run(["bash", "-c", f'"{sys.executable}" -m sim trace inspect <(cat "$1") --json', "_", str(path)],
                       cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert '"num_requests": 40' in p.stdout
    empty = subprocess.run(["bash", "-c", f'"{sys.executable}" -m sim trace inspect <(true)'], cwd=tmp_path,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert empty.returncode == 2 and empty.stderr.strip().endswith("the trace file is empty"), empty.stderr
