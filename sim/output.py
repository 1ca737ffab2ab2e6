"""``write_run``: the run directory of DESIGN.md section 5."""

from __future__ import annotations

import json
from pathlib import Path

from sim.atomic import atomic_path, write_text

REQUEST_COLUMNS = (
    "request_id", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "input_tokens",
    "output_tokens", "ttft_s", "tpot_s", "e2el_s", "queue_s", "num_preemptions", "replica", "status",
    "fail_reason", "prefix_hit_tokens", "kv_transfer_s", "decode_wait_s", "decode_rounds_waited", "ttft_wait_batch_s", "ttft_wait_kv_s", "ttft_prefill_s",
    "ttft_interference_s", "ttft_overhead_s", "ttft_preempt_s",
)
STEP_COLUMNS = (
    "replica", "start_s", "duration_s", "num_steps", "num_seqs", "prefill_tokens", "decode_tokens",
    "kv_blocks_used", "num_waiting", "first_step_duration_s", "last_step_duration_s",
)


def write_run(result, summary: dict, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # each file whole or absent (sim/atomic.py): a full disk leaves no truncated file behind
    # result.json last: a directory holding it holds the whole run
    with atomic_path(out / "requests.parquet") as tmp:
        result.requests.select(REQUEST_COLUMNS).write_parquet(tmp, statistics=False)
    with atomic_path(out / "steps.parquet") as tmp:
        result.steps.select(STEP_COLUMNS).write_parquet(tmp, statistics=False)
    write_text(out / "scenario.resolved.yaml", result.scenario.to_yaml())
    write_text(out / "result.json", json.dumps(summary, indent=2, allow_nan=False) + "\n")
    return out
