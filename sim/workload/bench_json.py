"""vLLM bench ``--save-detailed`` result JSON as a trace, with its measurements kept.

Why: a measured run is both a workload (when each request was sent, its lengths) and the
answer to compare the simulation with (TTFT, ITL, end-to-end latency per request).
Keys (vllm ``benchmarks/serve.py``): ``start_times`` (s, a monotonic clock), ``input_lens``,
``output_lens``, ``ttfts`` (s), ``itls`` (s, one list per request), ``latencies`` (s),
``errors`` (empty string when the request succeeded).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from sim.errors import UserError
from sim.limits import MAX_TIME_S, MAX_TOKENS
from sim.workload.arrays import RequestArrays
from sim.workload.sources import json_limit, shown


def _numbers(path: Path, doc: dict, key: str, n: int, integer: bool, minimum: float) -> np.ndarray:
    vals = doc.get(key)
    if not isinstance(vals, list):
        raise UserError(f"{path}: key {key} is missing or not a list (vLLM bench --save-detailed writes it)")
    if len(vals) != n:
        raise UserError(f"{path}: key {key} has {len(vals)} items but start_times has {n}")
    top = MAX_TOKENS if integer else MAX_TIME_S
    for i, v in enumerate(vals):
        ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and minimum <= v <= top
              and (not integer or float(v).is_integer()))
        if not ok:
            what = f"a whole number from {int(minimum)} to {top:,}" if integer else f"a number of seconds from {minimum:g} to {top:.3g}"
            raise UserError(f"{path}: {key}[{i}] (request {i}) is {shown(v)}, expected {what}")
    return np.asarray(vals, dtype=np.int64 if integer else np.float64)


def read_vllm_bench(path: Path) -> tuple[RequestArrays, int]:
    """Requests sent (absolute seconds, file order) and the number of failed ones left out."""
    try:
        doc = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        line = f" line {e.lineno}" if isinstance(e, json.JSONDecodeError) else ""
        raise UserError(f"{path}:{line} not valid JSON ({getattr(e, 'msg', e)})") from None
    except (RecursionError, ValueError) as e:
        raise UserError(f"{path}: {json_limit(e)}") from None
    if not isinstance(doc, dict) or "input_lens" not in doc:
        raise UserError(f"{path}: not a vLLM bench result (expected a JSON object with input_lens, output_lens, "
                        "start_times; run vllm bench serve with --save-result --save-detailed)")
    if not isinstance(doc.get("start_times"), list):
        raise UserError(f"{path}: key start_times is missing (needed for arrival times; vLLM bench --save-detailed "
                        "writes it)")
    n = len(doc["start_times"])
    if n == 0:
        raise UserError(f"{path}: the result holds no requests")
    t = _numbers(path, doc, "start_times", n, False, 0.0)
    inp = _numbers(path, doc, "input_lens", n, True, 1)
    out = _numbers(path, doc, "output_lens", n, True, 0)
    errors = doc.get("errors") or [""] * n
    if not isinstance(errors, list) or len(errors) != n or not all(e is None or isinstance(e, str) for e in errors):
        raise UserError(f"{path}: key errors must be a list of {n} strings (empty for a request that succeeded), "
                        f"as vLLM bench writes it; got {shown(errors)}")
    failed = (out == 0) | np.array([bool(e) for e in errors])
    measured = {}
    if "ttfts" in doc:
        measured["measured_ttft_s"] = _numbers(path, doc, "ttfts", n, False, 0.0)
    if "latencies" in doc:
        measured["measured_e2el_s"] = _numbers(path, doc, "latencies", n, False, 0.0)
    if "itls" in doc:
        itls = doc["itls"]
        if not isinstance(itls, list) or len(itls) != n:
            raise UserError(f"{path}: key itls must be a list of {n} lists")
        for i, x in enumerate(itls):
            if not isinstance(x, list) or not all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in x):
                raise UserError(f"{path}: itls[{i}] (request {i}) must be a list of finite numbers >= 0")
        measured["measured_itl_s"] = [np.asarray(x, dtype=np.float64) for x in itls]
    arr = RequestArrays(t, inp, out, measured=measured or None)
    return arr.take(~failed), int(failed.sum())
