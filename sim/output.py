"""``write_run``: the run directory of DESIGN.md section 5."""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl

from sim.atomic import atomic_path, write_text
from sim.errors import UserError

REQUEST_COLUMNS = (
    "request_id", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "input_tokens",
    "output_tokens", "ttft_s", "tpot_s", "e2el_s", "queue_s", "num_preemptions", "replica", "status",
    "fail_reason", "prefix_hit_tokens", "kv_transfer_s", "decode_wait_s", "decode_rounds_waited", "ttft_wait_batch_s", "ttft_wait_kv_s", "ttft_prefill_s",
    "ttft_interference_s", "ttft_overhead_s", "ttft_preempt_s", "ttft_kv_transfer_s", "ttft_decode_s",
)
STEP_COLUMNS = (
    "replica", "start_s", "duration_s", "num_steps", "num_seqs", "prefill_tokens", "decode_tokens",
    "kv_blocks_used", "num_waiting", "first_step_duration_s", "last_step_duration_s", "multi_step",
)


def write_run(result, summary: dict, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # each file whole or absent (sim/atomic.py): a full disk leaves no truncated file behind
    # result.json last: a directory holding it holds the whole run
    # a time that never happened (a failed request's first token) is null, not NaN
    requests = result.requests.select(REQUEST_COLUMNS).with_columns(pl.col(pl.Float64).fill_nan(None))
    with atomic_path(out / "requests.parquet") as tmp:
        requests.write_parquet(tmp, statistics=False)
    with atomic_path(out / "steps.parquet") as tmp:
        result.steps.select(STEP_COLUMNS).write_parquet(tmp, statistics=False)
    write_text(out / "scenario.resolved.yaml", result.scenario.to_yaml())
    write_text(out / "result.json", json.dumps(_json_safe(summary), indent=2, allow_nan=False) + "\n")
    return out


def _json_safe(v):
    """NaN and infinities become null: JSON has no such numbers, and a figure that does not exist is null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    return v


def check_new_run_dir(path: str | Path, force: bool, flag: str = "--force") -> None:
    """Refuse to write into a directory that already holds files, unless ``force``: a second run
    must not silently replace the first one's results."""
    p = Path(path)
    if not force and p.is_dir() and any(p.iterdir()):
        raise UserError(f"{p}: already exists and is not empty; pass {flag} to overwrite it, or --out another directory")
