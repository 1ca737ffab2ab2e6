"""simsrv's scheduler against vLLM V1's own, step by step (bench/conformance.py).

Runs only where vLLM is importable (``pip install -e '.[conformance]'``, pinned version); the
default suite skips it with the reason.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm not installed: pip install -e '.[conformance]' (bench/README.md)", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import conformance  # noqa: E402


@pytest.mark.parametrize("name", ["kv_pressure", "long_prefill", "multi_turn_pressure"])
def test_schedules_match_vllm_step_by_step(name):
    r = conformance.run_case(conformance.CASES[name](), conformance._model_dir())
    assert r["steps"] > 1000
    assert r["fraction"] >= 0.999, r["first_difference"]
