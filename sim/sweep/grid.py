"""Sweep grids: a grid file -> a list of points, each a dict of dotted scenario keys -> values.

Why: capacity planning explores many configurations of one scenario. A grid file is either a
mapping of dotted keys to lists of values (their cartesian product, in the file's key order),
or a list of override mappings (one point each, as vLLM's sweep tool takes). Every point is
validated against the scenario before anything runs, so a typo fails in a second, not after
an hour of simulations.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from sim.errors import UserError
from sim.scenario import Scenario, scenario_from_dict, set_dotted
from sim.files.yamlfile import read_yaml

# keys whose value sets the offered load; sweep reports plot latency against them
RATE_KEYS = ("workload.synthetic.request_rate", "workload.trace.target_rate", "workload.trace.time_scale")


@dataclass(frozen=True)
class Point:
    """One configuration: its overrides, its scenario (seed not yet chosen) and a stable id."""

    index: int
    overrides: dict[str, Any]
    raw: dict           # the scenario as a plain dict, overrides applied
    base_dir: str
    point_id: str       # hash of the whole scenario without its seed: a changed scenario is a new point

    def with_seed(self, seed: int) -> dict:
        raw = copy.deepcopy(self.raw)
        raw["seed"] = seed
        return raw

    def label(self, skip: tuple[str, ...] = ()) -> str:
        parts = [f"{k.rsplit('.', 1)[-1]}={_short(v)}" for k, v in self.overrides.items() if k not in skip]
        return ", ".join(parts) or "base"


def _short(v: Any) -> str:
    return json.dumps(v, default=str, separators=(",", ":")) if isinstance(v, (dict, list)) else str(v)


def scenario_raw(s: Scenario) -> dict:
    """The keys the user set (defaults left to the model), as plain Python values.

    NOTE: python mode, not JSON mode: JSON mode would turn an ``inf`` request rate into null.
    """
    return s.model_dump(mode="python", exclude_unset=True, exclude={"base_dir"})


def _canonical(raw: dict) -> str:
    def enc(v):
        if isinstance(v, float) and not math.isfinite(v):
            return repr(v)
        if isinstance(v, tuple):
            return [enc(x) for x in v]
        if isinstance(v, list):
            return [enc(x) for x in v]
        if isinstance(v, dict):
            return {str(k): enc(x) for k, x in v.items()}
        return v

    return json.dumps(enc(raw), sort_keys=True, default=str)


def point_id(raw: dict) -> str:
    body = {k: v for k, v in raw.items() if k != "seed"}
    return hashlib.sha1(_canonical(body).encode()).hexdigest()[:12]


def read_grid(path: str | Path) -> list[dict[str, Any]]:
    """The grid file as a list of override dicts (dotted key -> value)."""
    path = Path(path)
    return grid_points(read_yaml(path, "grid file"), str(path))


def grid_points(data: Any, where: str = "grid") -> list[dict[str, Any]]:
    if isinstance(data, dict):
        if not data:
            raise UserError(f"{where}: the grid is empty; give dotted scenario keys mapped to lists of values")
        for k, v in data.items():
            if not isinstance(v, list) or not v:
                raise UserError(f"{where}: key {k!r}: give a non-empty list of values (got {v!r})")
        keys = list(data)
        points = [dict(zip(keys, combo)) for combo in itertools.product(*(data[k] for k in keys))]
    elif isinstance(data, list):
        if not data:
            raise UserError(f"{where}: the grid is empty; give a list of override mappings")
        for i, p in enumerate(data):
            if not isinstance(p, dict):
                raise UserError(f"{where}: item {i}: each item is a mapping of dotted scenario keys to values")
        points = [dict(p) for p in data]
    else:
        raise UserError(f"{where}: a grid is a mapping of dotted keys to lists, or a list of override mappings")
    for i, p in enumerate(points):
        for k in p:
            if not isinstance(k, str):
                raise UserError(f"{where}: point {i}: key {k!r} is not a dotted scenario key")
            if k == "seed":
                raise UserError(f"{where}: point {i}: the grid may not set seed; use --seeds K")
    return points


def expand(base: Scenario, overrides: list[dict[str, Any]], where: str = "grid") -> list[Point]:
    """Apply each override dict to the base scenario and validate it; duplicate points are an error."""
    base_raw = scenario_raw(base)
    out: list[Point] = []
    seen: dict[str, int] = {}
    for i, ov in enumerate(overrides):
        raw = copy.deepcopy(base_raw)
        for k, v in ov.items():
            set_dotted(raw, k, v)
        desc = ", ".join(f"{k}={_short(v)}" for k, v in ov.items())
        s = scenario_from_dict(copy.deepcopy(raw), f"{where}: point {i} ({desc})", base_dir=base.base_dir)
        if s.workload.trace is not None:  # workers may run in another directory (a Ray node)
            raw["workload"]["trace"]["path"] = str(s.resolve_path(s.workload.trace.path).resolve())
        pid = point_id(raw)
        if pid in seen:
            raise UserError(f"{where}: point {i} ({desc}) is the same configuration as point {seen[pid]}")
        seen[pid] = i
        out.append(Point(i, dict(ov), raw, str(Path(base.base_dir).resolve()), pid))
    return out


def rate_key(points: list[Point]) -> str | None:
    """The grid key that sets the offered load, when the grid varies one."""
    for k in RATE_KEYS:
        if len({_short(p.overrides.get(k)) for p in points if k in p.overrides}) > 1:
            return k
    return None
