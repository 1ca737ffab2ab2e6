"""diagnose builds its scenario as: scenario file -> workload.trace.path replaced by TRACE (the
file's other trace keys kept) -> every --set applied last, so it wins; the candidate fixes
replay with the overrides too, and nothing already in effect is advised. A key it cannot apply
is refused in one line, exit 2."""

import numpy as np
import pytest
import yaml

from sim.analysis import diagnose_fixes
from sim.analysis.diagnose import diagnose
from tests.conftest import ROOT
from tests.inproc_cli import simsrv

SCENARIOS = ROOT / "scenarios"


@pytest.fixture(scope="module")
def grid_csv(tmp_path_factory):
    """40 requests, 4 to each step of a 2 s grid (0..18 s): three quarters of the gaps are zero."""
    path = tmp_path_factory.mktemp("trace") / "grid.csv"
    rng = np.random.default_rng(0)
    rows = [f"{2.0 * (i // 4):.1f},{int(rng.integers(200, 1500))},{int(rng.integers(20, 120))}" for i in range(40)]
    path.write_text("arrival_s,input_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    return path


def _requests_in(d) -> int:
    return d.summary["num_prompts"]


def test_trace_keys_take_effect_and_the_candidates_inherit_them(grid_csv, monkeypatch):
    """duration_s cuts the replay to the window; spread_grid_s spreads the grid: the replay, and
    every candidate fix's replay, sees the reduced trace. Before: both were dropped and all 40
    requests were replayed on the grid, and the grid sentence advised spread_grid_s anyway."""
    seen = []
    real = diagnose_fixes.run_scenario
    monkeypatch.setattr(diagnose_fixes, "run_scenario",
                        lambda s, workload=None: seen.append((s, len(workload.arrival_s))) or real(s, workload=workload))
    d = diagnose(grid_csv, None, ["workload.trace.duration_s=10", "workload.trace.spread_grid_s=2"])
    assert _requests_in(d) == 20  # grid steps 0, 2, 4, 6, 8 s: 5 x 4 requests
    assert d.scenario.workload.trace.duration_s == 10 and d.scenario.workload.trace.spread_grid_s == 2
    assert len(np.unique(d.result.requests["arrival_s"].to_numpy())) == 20  # spread over each step
    assert not any("spread_grid_s" in x for x in d.sentences)  # not advised: it is set
    assert {c.num_requests for c in d.candidates} == {20}
    assert seen and all(s.workload.trace.spread_grid_s == 2 for s, _ in seen)
    assert max(n for _, n in seen) == 20  # the long-prompt pools replay their shares of the 20


def test_without_the_override_the_grid_is_reported(grid_csv):
    d = diagnose(grid_csv, None, [])
    assert _requests_in(d) == 40
    assert any("workload.trace.spread_grid_s=2" in x for x in d.sentences)


def test_engine_cluster_model_hardware_and_slo_overrides_take_effect(grid_csv):
    sets = ["engine.policy=chunked", "engine.max_num_batched_tokens=1024", "engine.kv_cache_dtype=fp8",
            "cluster.replicas=2", "model=qwen2.5-7b", "hardware.gpu=h200", "slo.ttft_ms=0.001",
            "workload.trace.duration_s=6"]
    d = diagnose(grid_csv, None, sets)
    s = d.summary
    assert s["simsrv_num_gpus"] == 2 and s["model_id"] == "qwen2.5-7b" and s["simsrv_gpu"] == "h200"
    assert d.scenario.engine.max_num_batched_tokens == 1024 and s["request_goodput"] == 0  # no TTFT under 1 us
    assert "policy chunked" in d.sentences[0] and "2 GPUs" in d.sentences[0]
    names = [c.name for c in d.candidates]
    # what the overrides already put in effect is not offered as a fix
    assert "chunked prefill" not in names and "fp8 KV cache" not in names
    capacity = next(c for c in d.candidates if c.name == "add capacity")
    assert capacity.gpus == 3 and capacity.num_requests == _requests_in(d) == 12


def test_a_candidate_already_in_effect_is_not_advised(grid_csv, monkeypatch):
    """The rule, not the list of today's candidates: a candidate whose change leaves the
    scenario as it is is dropped, whichever candidate it is."""
    real = diagnose_fixes.whole_trace_candidates

    def with_noop(s, arrays, hint):
        return [*real(s, arrays, hint), (diagnose_fixes.Candidate("no-op", "engine.block_size=16"),
                                         ["engine.block_size=16"])]
    monkeypatch.setattr(diagnose_fixes, "whole_trace_candidates", with_noop)
    d = diagnose(grid_csv, None, ["workload.trace.duration_s=4"])
    assert "no-op" not in [c.name for c in d.candidates] and d.candidates


def test_a_generic_csv_is_diagnosed_with_its_scenarios_columns(tmp_path):
    """The scenario's trace keys other than path (format, columns, time_unit) are kept; before,
    the trace's workload replaced them and a generic CSV could not be read at all."""
    out = simsrv("diagnose", ROOT / "traces/samples/generic_ms_example.csv", "--scenario",
                 SCENARIOS / "trace_generic.yaml", "--out", tmp_path / "a")
    assert out.code == 0, out.stderr
    assert "Replayed 20 requests" in out.stdout and (tmp_path / "a/report.html").exists()
    csv = tmp_path / "mine.csv"
    csv.write_text("t_ms,p,o\n" + "\n".join(f"{i * 250},{300 + 40 * i},{30 + i}" for i in range(12)) + "\n")
    scen = tmp_path / "s.yaml"
    scen.write_text(yaml.safe_dump({"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"}, "workload": {"trace": {
        "path": "elsewhere.csv", "format": "generic", "time_unit": "ms",
        "columns": {"arrival": "t_ms", "input": "p", "output": "o"}}}}))
    out = simsrv("diagnose", csv, "--scenario", scen, "--set", "workload.trace.sample=8", "--out", tmp_path / "b")
    assert out.code == 0, out.stderr
    assert "Replayed 8 requests" in out.stdout


def test_a_synthetic_scenario_becomes_a_trace_with_defaults(grid_csv, tmp_path):
    scen = tmp_path / "syn.yaml"
    scen.write_text(yaml.safe_dump({"model": "llama-3-8b", "workload": {"synthetic": {"num_requests": 5}}}))
    d = diagnose(grid_csv, scen, ["workload.trace.duration_s=4"])
    assert d.scenario.workload.synthetic is None and _requests_in(d) == 8


@pytest.mark.parametrize("flag, words", [
    ("workload.trace.bogus=1", "unknown key 'workload.trace.bogus'"),
    ("engine.bogus=1", "unknown key 'engine.bogus'"),
    ("workload.trace.duration_s=-3", "workload.trace.duration_s"),
    ("workload.trace.path=other.csv", "--set workload.trace.path"),
    ("workload.synthetic.num_requests=3", "--set workload.synthetic.num_requests"),
])
def test_a_bad_or_inapplicable_key_is_refused_in_one_line(grid_csv, tmp_path, flag, words):
    out = simsrv("diagnose", grid_csv, "--set", flag, "--out", tmp_path / "d")
    assert out.code == 2 and out.clean and len(out.lines) == 1, out.stderr
    assert words in out.stderr
    assert not (tmp_path / "d").exists()
