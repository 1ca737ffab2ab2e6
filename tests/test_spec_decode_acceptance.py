"""Speculative decoding's acceptance comes only from the user's measurement (issue 40 item 1:
"acceptance defaults come only from cited measurements"; no published measurement covers an
arbitrary model pair, k and dataset): for every method, a config without it is refused in one
line naming the key, exit status 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("method", ["ngram", "eagle", "eagle3", "mtp", "draft_model"])
def test_no_default_acceptance(method, tmp_path):
    spec = {"method": method, "num_speculative_tokens": 3}
    if method == "draft_model":
        spec["model"] = "llama-3.2-1b"
    raw = {"name": "acc", "model": "llama-3-8b", "engine": {"speculative_config": spec},
           "workload": {"synthetic": {"num_requests": 2, "request_rate": 1.0}}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    p = subprocess.run([sys.executable, "-m", "sim", "run", str(path), "-q", "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "engine.speculative_config" in lines[0] and "acceptance_length" in lines[0]
    assert "there is no default" in lines[0]
