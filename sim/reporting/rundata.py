"""A finished run, as read back from its run directory (ARCHITECTURE.md section 5)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import yaml

from sim.errors import UserError
from sim.files.text import arrow_file, shown


@dataclass
class RunData:
    label: str
    path: Path
    summary: dict
    requests: pl.DataFrame
    steps: pl.DataFrame
    scenario: dict

    @property
    def policy(self) -> str:
        return self.summary.get("simsrv_policy", "?")


def load_run(path: str | Path, label: str | None = None) -> RunData:
    p = Path(path)
    need = ("result.json", "requests.parquet", "steps.parquet", "scenario.resolved.yaml")
    missing = [n for n in need if not (p / n).is_file()]
    if missing:
        raise UserError(f"{p}: not a simsrv run directory (missing {', '.join(missing)})")
    try:
        summary = json.loads((p / "result.json").read_text())
        scenario = yaml.safe_load((p / "scenario.resolved.yaml").read_text()) or {}
        with arrow_file(p / "requests.parquet") as src:
            requests = pl.read_parquet(src)
        with arrow_file(p / "steps.parquet") as src:
            steps = pl.read_parquet(src)
    except (json.JSONDecodeError, yaml.YAMLError, pl.exceptions.PolarsError, OSError) as e:
        raise UserError(f"{p}: cannot read the run ({str(e).splitlines()[0]})") from None
    check_one_run(p, summary, requests.height, steps.height, scenario)
    return RunData(shown(label or p.name), p, summary, requests, steps, scenario)


def check_one_run(p: Path, summary: dict, num_requests: int, num_step_rows: int, scenario: dict) -> None:
    """Refuse a directory whose files come from different runs (files copied over one another
    by hand, or written by a simsrv older than whole-directory replacement, sim/files/atomic.py):
    result.json's counts and policy must be those of the Parquet files and the scenario."""
    engine = scenario.get("engine") if isinstance(scenario, dict) else None
    pairs = (("requests", summary.get("num_prompts"), num_requests, "requests.parquet"),
             ("step rows", summary.get("simsrv_num_step_rows"), num_step_rows, "steps.parquet"),
             ("policy", summary.get("simsrv_policy"), engine.get("policy") if isinstance(engine, dict) else None,
              "scenario.resolved.yaml"))
    for what, said, found, where in pairs:
        if said is not None and found is not None and said != found:
            raise UserError(f"{p}: its files are not from one run: result.json says {what} {said}, {where} "
                            f"has {found}; rerun it")


def scenario_differences(runs: list[RunData]) -> dict[str, list]:
    """Dotted scenario keys whose values differ between runs: key -> value per run."""
    flat = [_flatten(r.scenario) for r in runs]
    keys = sorted(set().union(*flat))
    return {k: [f.get(k) for f in flat] for k in keys if len({json.dumps(f.get(k), sort_keys=True) for f in flat}) > 1}


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out
