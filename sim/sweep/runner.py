"""``run_sweep``: every (point, seed) of a grid through an executor, one small file per result,
then one Parquet table of rows and one of per-point means with 95% confidence intervals.

Why: a sweep of thousands of runs gets interrupted; each finished run is written at once
(atomically), so Ctrl-C loses only the runs in flight and ``--resume`` skips the rest.
Seeds are common random numbers: seed k draws the same arrivals and lengths at every point
(only the point's own keys, e.g. its rate, change them), so differences between points are
not seed noise.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from sim.files.atomic import atomic_path, remove_stale_temporaries, write_text
from sim.errors import UserError
from sim.sweep.grid import Point
from sim.sweep.stats import aggregate
from sim.sweep.task import Task
from sim.files.text import arrow_file

ROWS_FILE = "sweep.parquet"
AGGREGATE_FILE = "aggregate.parquet"


class SweepInterrupted(Exception):
    def __init__(self, done: int, total: int, out_dir: Path):
        super().__init__(f"interrupted: {done} of {total} runs are on disk in {out_dir}/runs; "
                         "rerun with --resume to finish")


@dataclass
class SweepResult:
    rows: pl.DataFrame          # one row per (point, seed)
    aggregate: pl.DataFrame     # one row per point
    points: list[Point]
    seeds: list[int]
    out_dir: Path
    num_ran: int
    num_skipped: int
    wall_s: float


def row_path(out_dir: Path, task: Task) -> Path:
    return out_dir / "runs" / task.point_id / f"seed-{task.seed}.json"


def write_row(path: Path, row: dict) -> None:
    """Write-then-rename: a run's file is either whole or absent."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(row, sort_keys=True))


# the temporary name an older write_row used: seed-N.tmpPID
_OLD_ROW_TEMPORARY = re.compile(r"^seed-\d+\.tmp(?P<pid>\d+)$")


def remove_stale_temporaries_of(out_dir: Path) -> None:
    """The temporary files a killed sweep left (``.sweep.parquet.tmp-PID``, a run's row being
    written), where their process is gone: a live sweep's are kept (sim/files/atomic.py)."""
    remove_stale_temporaries(out_dir)
    runs = out_dir / "runs"
    for point_dir in (runs.iterdir() if runs.is_dir() else ()):
        remove_stale_temporaries(point_dir)
        remove_stale_temporaries(point_dir, _OLD_ROW_TEMPORARY)


def tasks_for(points: list[Point], seeds: list[int]) -> list[Task]:
    return [Task(p.point_id, p.index, s, p.with_seed(s), p.base_dir) for p in points for s in seeds]


def seeds_from(base_seed: int, k: int) -> list[int]:
    if k < 1:
        raise UserError(f"--seeds {k}: must be >= 1")
    return [base_seed + i for i in range(k)]


def _column(values: list[Any]) -> pl.Series | list:
    """An override's values as one typed column; mixed kinds become JSON text."""
    kinds = {type(v) for v in values if v is not None}
    if kinds <= {bool} or kinds <= {int} or kinds <= {str}:
        return values
    if kinds <= {int, float}:
        return [None if v is None else float(v) for v in values]
    return [None if v is None else json.dumps(v, sort_keys=True, default=str) for v in values]


def override_frame(points: list[Point]) -> pl.DataFrame:
    keys: list[str] = []
    for p in points:
        keys += [k for k in p.overrides if k not in keys]
    data: dict[str, Any] = {"point_id": [p.point_id for p in points], "point": [p.index for p in points],
                            "label": [p.label() for p in points]}
    for k in keys:
        data[k] = _column([p.overrides.get(k) for p in points])
    return pl.DataFrame(data, strict=False)


def gather(points: list[Point], seeds: list[int], out_dir: Path) -> pl.DataFrame:
    """Every written row of these points and seeds, joined with the points' override values."""
    rows = []
    for t in tasks_for(points, seeds):
        path = row_path(out_dir, t)
        if path.is_file():
            rows.append(json.loads(path.read_text()))
    if not rows:
        return pl.DataFrame()
    frame = pl.DataFrame(rows, infer_schema_length=None, strict=False).drop("point", strict=False)
    frame = override_frame(points).join(frame, on="point_id", how="inner")
    return frame.sort("point", "seed")


def run_sweep(points: list[Point], seeds: list[int], out_dir: str | Path, executor, resume: bool = False,
              progress: Callable[[int, int], None] | None = None) -> SweepResult:
    """Run what is not on disk yet; ``progress(points_done, points_total)`` after each run."""
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    remove_stale_temporaries_of(out_dir)
    all_tasks = tasks_for(points, seeds)
    done = {t.key for t in all_tasks if row_path(out_dir, t).is_file()}
    if done and not resume:
        raise UserError(f"{out_dir}: already holds {len(done)} results of this sweep; pass --resume to skip them, "
                        "or choose another --out")
    todo = [t for t in all_tasks if t.key not in done]
    left = {p.point_id: sum(1 for t in todo if t.point_id == p.point_id) for p in points}
    points_done = sum(1 for n in left.values() if n == 0)
    if progress:
        progress(points_done, len(points))
    ran = 0
    try:
        for task, row in executor.map_unordered(todo):
            write_row(row_path(out_dir, task), row)
            ran += 1
            left[task.point_id] -= 1
            if left[task.point_id] == 0:
                points_done += 1
            if progress:
                progress(points_done, len(points))
    except KeyboardInterrupt:
        raise SweepInterrupted(len(done) + ran, len(all_tasks), out_dir) from None
    rows = gather(points, seeds, out_dir)
    group_cols = [c for c in override_frame(points).columns]
    agg = aggregate(rows, group_cols)
    for frame, name in ((rows, ROWS_FILE), (agg, AGGREGATE_FILE)):
        with atomic_path(out_dir / name) as tmp, arrow_file(tmp, "wb") as sink:
            frame.write_parquet(sink)
    return SweepResult(rows, agg, points, seeds, out_dir, ran, len(done), time.perf_counter() - t0)
