"""``simsrv validate``: the published-measurement data, one fast case end to end, orderings."""

from __future__ import annotations

import json

import pytest
import yaml

from sim.errors import UserError
from sim.analysis.validate import load_rows, run_validation, summarize_rows, to_json
from tests.test_cli import simsrv


def test_every_shipped_row_is_attributed_and_runnable_or_explained():
    rows = load_rows()
    assert len({r.case for r in rows}) >= 7
    for r in rows:
        assert r.source and r.level in ("step", "request", "ordering") and r.role in ("calibration", "held-out")
        if r.status == "ok" and r.ratio:
            assert r.measured > 0 and r.scenario is None, r.id
        elif r.status == "ok" and r.level != "ordering":
            assert (r.scenario is not None) != (r.allreduce is not None), r.id
            compared = any(r.id in o.order + o.ratio for o in rows)
            assert (r.measured is None and (r.capacity or compared)) or r.measured > 0, r.id
        if r.status != "ok":
            assert r.reason, r.id
    assert sum(r.level == "ordering" for r in rows) >= 5


def test_cli_json_of_one_row_has_exactly_the_documented_keys():
    p = simsrv("validate", "--case", "VC-03/llama-2-7b/a100/2048in", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert set(d) == {"cases", "summary"}
    (c,) = d["cases"]
    assert set(c) == {"id", "level", "metric", "measured", "simulated", "err", "generation"}
    assert c["generation"] == "2023"  # TensorRT-LLM v0.5
    assert c["measured"] == 133 and c["level"] == "step"
    assert c["err"] == pytest.approx(c["simulated"] / c["measured"] - 1)
    assert 60 < c["simulated"] < 300  # a 7B prompt of 2048 tokens on one A100: tens of ms of GEMMs
    assert set(d["summary"]) == {"step", "request", "ordering", "by_generation"}
    assert d["summary"]["by_generation"]["2023"]["step"] == d["summary"]["step"]
    assert d["summary"]["step"]["median_abs_err"] == pytest.approx(abs(c["err"]))
    assert d["summary"]["ordering"] == {"correct": 0, "total": 0}


def _case(tmp_path, order):
    base = {"model": "llama-2-7b", "hardware": {"gpu": "a100-80g"}, "engine": {"policy": "static"},
            "workload": {"synthetic": {"num_requests": 1, "request_rate": float("inf"),
                                       "output_tokens": {"dist": "fixed", "value": 1}}}}
    rows = [{"id": f"T/{n}", "level": "step", "metric": "median_ttft_ms", "measured": m,
             "scenario": {"workload": {"synthetic": {"input_tokens": {"dist": "fixed", "value": n}}}}}
            for n, m in ((128, 10.0), (1024, 70.0))]
    rows.append({"id": "T/order", "level": "ordering", "metric": "median_ttft_ms", "order": order})
    rows.append({"id": "T/fp8", "level": "step", "metric": "median_ttft_ms", "measured": 5.0,
                 "status": "not-reproducible", "reason": "needs fp8"})
    (tmp_path / "T.yaml").write_text(yaml.safe_dump({"case": "T", "source": "test", "tolerance": 0.2,
                                                     "base": base, "rows": rows}))


def test_orderings_judge_the_simulated_ranking(tmp_path):
    _case(tmp_path, ["T/128", "T/1024"])
    rows = run_validation(None, tmp_path)
    by = {r.id: r for r in rows}
    assert by["T/128"].simulated < by["T/1024"].simulated
    assert by["T/order"].simulated == 1.0 and by["T/fp8"].simulated is None
    s = summarize_rows(rows)
    assert s["ordering"] == {"correct": 1, "total": 1}
    assert [c["id"] for c in to_json(rows)["cases"]] == ["T/128", "T/1024", "T/order"]
    _case(tmp_path, ["T/1024", "T/128"])  # a wrong ranking counts as wrong
    only = run_validation("T/order", tmp_path)
    assert [r.id for r in only] == ["T/order"] and only[0].simulated == 0.0 and only[0].err == -1.0


def test_bad_case_files_and_unknown_case_are_one_line_errors(tmp_path):
    _case(tmp_path, ["T/128", "T/missing"])
    with pytest.raises(UserError, match="unknown rows: T/missing"):
        load_rows(tmp_path)
    p = simsrv("validate", "--case", "VC-99")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "VC-03" in p.stderr


def test_html_page_lists_cases_and_not_reproduced_rows(tmp_path):
    from sim.reporting.validate_page import build_validate_page, summary_lines

    _case(tmp_path, ["T/128", "T/1024"])
    rows = run_validation(None, tmp_path)
    page = build_validate_page(rows)
    text = "\n".join(page.parts)
    for word in ("T/1024", "Not reproduced", "needs fp8", "median |err|", "<details>"):
        assert word in text
    assert "ordering: 1 of 1 right (target: all)" in summary_lines(rows)
    assert page.specs  # the simulated-vs-measured chart


def test_a_row_whose_requests_all_fail_is_listed_with_the_reason(tmp_path):
    _case(tmp_path, ["T/128", "T/1024"])
    d = yaml.safe_load((tmp_path / "T.yaml").read_text())
    d["rows"][1]["scenario"]["engine"] = {"max_model_len": 512}  # the 1024-token prompt cannot be served
    (tmp_path / "T.yaml").write_text(yaml.safe_dump(d))
    rows = {r.id: r for r in run_validation(None, tmp_path)}
    assert rows["T/1024"].simulated is None and "max_model_len 512" in rows["T/1024"].reason
    assert rows["T/order"].simulated is None  # it ranks a row that did not run


def test_capacity_and_ratio_rows(tmp_path):
    """A capacity row is the knee of its limits (no measured value: shown, not counted); a
    ratio row divides two rows and is compared with its published ratio."""
    base = {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
            "workload": {"synthetic": {"num_requests": 60, "request_rate": 2.0,
                                       "input_tokens": {"dist": "fixed", "value": 500},
                                       "output_tokens": {"dist": "fixed", "value": 50}}}}
    case = {"case": "VC-T", "source": "test", "base": base, "rows": [
        {"id": "VC-T/a", "level": "request", "metric": "capacity_qps", "capacity": {"p99_ttft_ms": 200},
         "scenario": {"engine": {"max_num_seqs": 64}}},
        {"id": "VC-T/b", "level": "request", "metric": "capacity_qps", "capacity": {"p99_ttft_ms": 200},
         "scenario": {"engine": {"max_num_seqs": 2}}},
        {"id": "VC-T/a-over-b", "level": "request", "metric": "capacity_ratio", "measured": 3.0,
         "tolerance": 0.3, "ratio": ["VC-T/a", "VC-T/b"]},
    ]}
    (tmp_path / "VC-T.yaml").write_text(yaml.safe_dump(case))
    rows = {r.id: r for r in run_validation(directory=tmp_path)}
    a, b, ratio = rows["VC-T/a"], rows["VC-T/b"], rows["VC-T/a-over-b"]
    assert a.simulated > b.simulated > 0 and a.err is None
    assert ratio.simulated == pytest.approx(a.simulated / b.simulated)
    s = summarize_rows(list(rows.values()))
    assert s["request"]["median_abs_err"] == pytest.approx(abs(ratio.err))
    bad = dict(case, rows=[{"id": "VC-T/x", "level": "request", "metric": "median_ttft_ms", "scenario": {}}])
    (tmp_path / "VC-T.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(UserError, match="measured"):
        load_rows(tmp_path)
