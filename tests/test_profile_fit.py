"""``simsrv fit`` (sim/cost/profile_fit.py, sim/analysis/fit_data.py) and ``engine.profile: path``:
known terms recovered from measurements simsrv made with them, one-line refusals of too few
measurements and of terms the data do not identify, leave-one-out errors, the written profile
loading and reproducing the fit, and a vLLM bench ``--save-detailed`` result read."""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from sim.analysis.fit_data import Simulator, read_fit_data
from sim.cost.engine_profile import EngineProfile, get_profile, profile_entry, term_fields
from sim.cost.profile_fit import fit_terms, fitted_profile_yaml
from sim.errors import UserError
from sim.metrics.summary import summarize
from sim.run import run_scenario
from sim.scenario import load_scenario
from tests.inproc_cli import simsrv

TRUE = {"prefill_step_ms": 2.5, "decode_step_ms": 1.4}  # vllm-v1's: 1.0 and 0.6


def _syn(n: int, inp: int, out: int) -> dict:
    return {"synthetic": {"num_requests": n, "request_rate": float("inf"),
                          "input_tokens": {"dist": "fixed", "value": inp},
                          "output_tokens": {"dist": "fixed", "value": out}}}


RUNS = {  # small runs: a lone prompt (TTFT: prefill steps), batches decoding together (TPOT: decode steps)
    "solo": _syn(1, 512, 2),
    "b8": _syn(8, 64, 48),
    "b24": _syn(24, 64, 48),
}
ROWS = [("solo/ttft", "solo", "median_ttft_ms"), ("b8/tpot", "b8", "median_tpot_ms"),
        ("b8/ttft", "b8", "median_ttft_ms"), ("b24/tpot", "b24", "median_tpot_ms"),
        ("b24/ttft", "b24", "median_ttft_ms")]


def _case_file(path: Path, measured: dict[str, float], rows=ROWS) -> Path:
    doc = {"case": "SYN", "source": "simsrv with a known profile",
           "base": {"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
                    "engine": {"policy": "chunked", "max_num_batched_tokens": 2048}},
           "rows": [{"id": f"SYN/{rid}", "level": "request", "metric": metric, "measured": float(measured[rid]),
                     "scenario": {"workload": RUNS[run]}} for rid, run, metric in rows]}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _truth(tmp: Path, values: dict[str, float], rows=ROWS) -> dict[str, float]:
    """Each row's figure simulated with ``values`` over vllm-v1 (the measurement a user would bring)."""
    placeholder = _case_file(tmp / "placeholder.yaml", {rid: 1.0 for rid, _, _ in rows}, rows)
    data = read_fit_data([placeholder])
    sim = Simulator(data, profile_entry("vllm-v1"), tmp)(values)
    return {rid: float(v) for (rid, _, _), v in zip(rows, sim)}


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fit")
    truth = _truth(tmp, TRUE)
    noise = 1 + np.random.default_rng(7).normal(0, 0.02, len(ROWS))  # 2% measurement error, seeded
    case = _case_file(tmp / "syn.yaml", {rid: truth[rid] * e for (rid, _, _), e in zip(ROWS, noise)})
    data = read_fit_data([case])
    measured = np.array([m.measured for m in data.measurements])
    base = profile_entry("vllm-v1")
    with tempfile.TemporaryDirectory() as d:
        sim = Simulator(data, base, Path(d))
        res = fit_terms(sim, list(TRUE), {k: base[k] for k in TRUE}, measured, [m.id for m in data.measurements])
    return tmp, case, data, base, res


def test_known_terms_are_recovered_within_their_intervals(fitted):
    _, _, _, _, res = fitted
    assert res.dof == len(ROWS) - len(TRUE)
    for t in res.terms:
        lo, hi = t.ci_ms
        assert lo <= TRUE[t.name] <= hi, (t.name, t.value_ms, t.ci_ms)
        assert hi - lo < 0.5 * TRUE[t.name]  # an interval that says something
        assert abs(t.value_ms - TRUE[t.name]) < 0.15 * TRUE[t.name]
    assert np.median(np.abs(res.errors)) < 0.05


def test_leave_one_out_refits_each_measurement(fitted):
    _, _, _, _, res = fitted
    assert len(res.loo) == len(ROWS)
    # the lone prompt is the only measurement of prefill steps alone; the batches' TTFTs also
    # carry them, so every measurement has a leave-one-out prediction
    assert all(v is not None for v in res.loo), res.loo_why
    assert all(abs(v) < 0.25 for v in res.loo)
    # out of sample is no better than in sample, measurement by measurement on the median
    assert np.median(np.abs(res.loo)) >= np.median(np.abs(res.errors)) - 1e-9


def test_written_profile_loads_by_path_and_reproduces_the_fit(fitted):
    tmp, _, data, base, res = fitted
    text = fitted_profile_yaml("vllm-v1", base, res, [m.id for m in data.measurements], ["syn.yaml"])
    (tmp / "profiles").mkdir(exist_ok=True)
    (tmp / "profiles" / "mine.yaml").write_text(text)
    assert "prefill_step_ms:" in text and "interval" in text and "SYN/b24/tpot" in text
    # a scenario beside it names it relatively: resolved against the scenario file's directory
    scen = tmp / "profiles" / "s.yaml"
    scen.write_text(yaml.safe_dump({"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"},
                                    "engine": {"policy": "chunked", "max_num_batched_tokens": 2048,
                                               "profile": "mine.yaml"},
                                    "workload": RUNS["solo"]}))
    s = load_scenario(scen)
    assert Path(s.engine.profile).is_absolute() and s.engine.profile.endswith("mine.yaml")
    summary = summarize(run_scenario(s))
    i = [m.id for m in data.measurements].index("SYN/solo/ttft")
    assert summary["median_ttft_ms"] == res.simulated[i]  # exactly the fit's figure
    p = get_profile(s.engine.profile)
    for t in res.terms:
        assert getattr(p, term_fields()[t.name]) == t.value_ms / 1e3


def test_cli_picks_the_identifiable_terms_and_writes_a_loadable_profile(fitted):
    tmp, case, _, _, _ = fitted
    out = simsrv("fit", str(case), "--out", str(tmp / "cli.yaml"), "--hold-out", "SYN/b24/ttft")
    assert out.code == 0, out.stderr
    # one GPU, one scheduler step, CUDA-graphed decodes: the TP-rank, output and launch terms move nothing
    assert "free terms (identifiable from the data): prefill_step_ms, decode_step_ms" in out.stdout
    assert "per_extra_tp_rank_ms" not in out.stdout.split("free terms")[1].splitlines()[0]
    assert "leave-one-out: median |err|" in out.stdout and "held out: median |err|" in out.stdout
    p = get_profile(str(tmp / "cli.yaml"))
    assert abs(p.prefill_step_s * 1e3 - TRUE["prefill_step_ms"]) < 0.15 * TRUE["prefill_step_ms"]


def test_too_few_measurements_is_refused_in_one_line(tmp_path):
    case = _case_file(tmp_path / "one.yaml", {"solo/ttft": 40.0}, ROWS[:1])
    out = simsrv("fit", str(case), "--terms", "prefill_step_ms,decode_step_ms")
    assert out.code == 2 and out.clean, out.stderr
    assert "1 measurement for 2 free terms" in out.lines[-1]
    out = simsrv("fit", str(case), "--scenario", str(case))  # nothing for the deployment to apply to
    assert out.code == 2 and out.clean and "--scenario is the deployment of a vLLM bench result" in out.lines[-1]


def test_terms_the_data_do_not_move_or_only_combine_are_named(tmp_path):
    rows = ROWS[:3]
    case = _case_file(tmp_path / "c.yaml", {rid: 10.0 for rid, _, _ in rows}, rows)
    # one GPU: the per-extra-rank term moves nothing
    out = simsrv("fit", str(case), "--terms", "prefill_step_ms,per_extra_tp_rank_ms")
    assert out.code == 2 and out.clean, out.stderr
    assert "per_extra_tp_rank_ms (no measurement depends on it)" in out.lines[-1]
    # decode steps at one batch size measure decode_step + batch x per_seq, never the two apart
    rows = [("b8/tpot", "b8", "median_tpot_ms"), ("b8/tpot2", "b8", "median_tpot_ms")]
    case = _case_file(tmp_path / "d.yaml", {"b8/tpot": 8.0, "b8/tpot2": 8.2}, rows)
    data = read_fit_data([case])
    base = profile_entry("vllm-v1")
    with pytest.raises(UserError, match=r"decode_step_ms \+ per_seq_ms \(only their combination"):
        fit_terms(Simulator(data, base, tmp_path), ["decode_step_ms", "per_seq_ms"],
                  {k: base[k] for k in ("decode_step_ms", "per_seq_ms")}, np.array([8.0, 8.2]), ["a", "b"])


def test_every_float_term_of_the_profile_is_fittable():
    names = {f"{f[:-2]}_ms" for f, t in EngineProfile.__annotations__.items()
             if t == "float" and f.endswith("_s") and not f.endswith("_per_s")}
    assert set(term_fields()) == names
    assert set(profile_entry("vllm-v1")) >= names


BENCH = {  # vllm bench serve --save-result --save-detailed (vllm/benchmarks/serve.py keys)
    "date": "20250101-000000", "backend": "vllm", "model_id": "meta-llama/Meta-Llama-3-8B-Instruct",
    "tokenizer_id": "meta-llama/Meta-Llama-3-8B-Instruct", "num_prompts": 5, "request_rate": 2.0,
    "burstiness": 1.0, "max_concurrency": None, "duration": 3.1, "completed": 4, "failed": 1,
    "total_input_tokens": 1024, "total_output_tokens": 64,
    "input_lens": [256, 256, 256, 256, 256], "output_lens": [16, 16, 0, 16, 16],
    "ttfts": [0.031, 0.029, 0.0, 0.033, 0.030],
    "itls": [[0.008] * 15, [0.0085] * 15, [], [0.009] * 15, [0.008] * 15],
    "generated_texts": ["a", "b", "", "c", "d"], "errors": ["", "", "timeout", "", ""],
}


def test_vllm_bench_detailed_result_is_read_and_replayed(tmp_path):
    p = tmp_path / "bench.json"
    p.write_text(json.dumps(BENCH))
    scen = tmp_path / "dep.yaml"
    # the deployment only: its workload (none here) is the bench result's requests
    scen.write_text(yaml.safe_dump({"model": "llama-3-8b", "hardware": {"gpu": "h100-sxm"}, "seed": 3}))
    data = read_fit_data([p], scen)
    got = {m.metric: m.measured for m in data.measurements}
    assert got == pytest.approx({"median_ttft_ms": 30.5, "median_tpot_ms": 8.25})
    (run,) = data.runs.values()
    assert len(run.workload) == 4 and list(run.workload.input_tokens) == [256] * 4  # the failed one left out
    assert run.workload.arrival_s[0] == 0.0 and np.all(np.diff(run.workload.arrival_s) > 0)
    assert "request_rate 2/s" in run.where and "1 failed left out" in run.where
    sim = Simulator(data, profile_entry("vllm-v1"), tmp_path)(TRUE)
    assert len(sim) == 2 and np.all(sim > 0)
    # the summary keys vLLM writes win over the per-request lists
    p.write_text(json.dumps({**BENCH, "median_ttft_ms": 31.0}))
    assert read_fit_data([p], scen).measurements[0].measured == 31.0
    # vLLM bench --max-concurrency: the same closed loop; request_rate "inf" (as vLLM writes it): all at 0
    p.write_text(json.dumps({**BENCH, "request_rate": "inf", "max_concurrency": 2}))
    (run,) = read_fit_data([p], scen).runs.values()
    assert run.scenario["workload"]["synthetic"]["max_concurrency"] == 2 and "closed loop" in run.where
    assert not run.workload.arrival_s.any()
    # start_times (newer vLLM): replayed as sent, from the first
    p.write_text(json.dumps({**BENCH, "max_concurrency": 2, "start_times": [5.0, 5.5, 5.6, 6.0, 7.25]}))
    (run,) = read_fit_data([p], scen).runs.values()
    assert list(run.workload.arrival_s) == [0.0, 0.5, 1.0, 2.25]
    assert "max_concurrency" not in run.scenario["workload"]["synthetic"]
    # a bench result without the deployment is refused in one line
    out = simsrv("fit", str(p))
    assert out.code == 2 and out.clean and "--scenario" in out.lines[-1]


def test_profile_file_errors_name_the_file_and_key(tmp_path):
    entry = profile_entry("vllm-v1")
    good = tmp_path / "p.yaml"
    good.write_text(yaml.safe_dump(entry))
    assert get_profile(str(good)) == replace(get_profile("vllm-v1"), name=str(good), basis=entry["basis"],
                                             sources=tuple(entry["sources"]))
    for change, key in (({"per_seq_ms": -1}, "per_seq_ms"), ({"per_sq_ms": 1.0}, "per_sq_ms"),
                        ({"overlap_cpu": 1}, "overlap_cpu"), ({"batch_range": [5, 2]}, "batch_range"),
                        ({"attention_backend": "nope"}, "attention_backend")):
        bad = tmp_path / f"bad-{key}.yaml"
        bad.write_text(yaml.safe_dump({**entry, **change}))
        with pytest.raises(UserError, match=rf"engine.profile: .*bad-{key}.yaml: key {key}: "):
            get_profile(str(bad))
    scen = tmp_path / "s.yaml"
    scen.write_text(yaml.safe_dump({"engine": {"profile": "missing.yaml"}, "workload": RUNS["solo"]}))
    out = simsrv("run", str(scen), "--out", str(tmp_path / "r"))
    assert out.code == 2 and out.clean and "missing.yaml: profile file not found" in out.lines[-1]


def test_intervals_are_the_linear_regression_ones_on_a_linear_model():
    """On a model linear in its terms the fit is weighted least squares on relative error: its
    estimate, standard errors and t intervals are the textbook ones (finite differences exact)."""
    from scipy.stats import t as student_t

    rng = np.random.default_rng(3)
    X = rng.uniform(1, 10, size=(7, 2))
    truth = np.array([2.0, 0.5])
    y = X @ truth * (1 + rng.normal(0, 0.03, 7))
    res = fit_terms(lambda v: X @ np.array([v["a_ms"], v["b_ms"]]), ["a_ms", "b_ms"], {"a_ms": 1.0, "b_ms": 1.0},
                    y, [str(i) for i in range(7)])
    A = X / y[:, None]
    theta, *_ = np.linalg.lstsq(A, np.ones(7), rcond=None)
    r = A @ theta - 1
    se = np.sqrt(np.diag(r @ r / 5 * np.linalg.inv(A.T @ A)))
    q = student_t.ppf(0.975, 5)
    for j, t in enumerate(res.terms):
        assert t.value_ms == pytest.approx(theta[j], rel=1e-4)
        assert t.stderr_ms == pytest.approx(se[j], rel=1e-3)
        assert t.ci_ms == pytest.approx((theta[j] - q * se[j], theta[j] + q * se[j]), rel=1e-3)
    # leave-one-out: the regression without row i, predicting row i
    for i in range(7):
        keep = np.arange(7) != i
        th, *_ = np.linalg.lstsq(A[keep], np.ones(6), rcond=None)
        assert res.loo[i] == pytest.approx(A[i] @ th - 1, abs=1e-4)


def test_default_terms_drop_one_the_fit_leaves_unidentified(monkeypatch):
    """With default terms, a term the fitted values leave unidentified (VC-16's output terms
    beside multi-step scheduling) is dropped, the weakest of those named, and the rest refitted;
    a term the user named is refused instead."""
    import sim.cost.profile_fit as pf
    from sim.cli.fit import _fit

    X = np.array([[1.0, 2.0, 3.0], [2.0, 1.0, 1.0], [3.0, 3.0, 2.0], [1.0, 4.0, 1.0], [2.0, 2.0, 5.0]])
    X[:, 2] *= 0.1  # c moves the measurements least

    def predict(v):
        return X @ np.array([v["a_ms"], v["b_ms"], v.get("c_ms", 1.0)]) + 10  # others at the base, as Simulator

    real = pf.fit_terms
    calls = []

    def fit_terms(predict, names, base_ms, measured, ids):
        calls.append(list(names))
        if len(names) == 3:  # as if the optimum left b and c measured only together
            raise pf.NotIdentifiable("terms not identifiable at the fitted values: b_ms + c_ms (...)", ["b_ms", "c_ms"])
        return real(predict, names, base_ms, measured, ids)

    monkeypatch.setattr(pf, "fit_terms", fit_terms)
    y = predict({"a_ms": 2.0, "b_ms": 1.0, "c_ms": 1.0})
    base = {"a_ms": 1.0, "b_ms": 1.0, "c_ms": 1.0}
    res = _fit(predict, ["a_ms", "b_ms", "c_ms"], base, y, [str(i) for i in range(5)], chosen=True)
    assert calls == [["a_ms", "b_ms", "c_ms"], ["a_ms", "b_ms"]]
    assert [t.name for t in res.terms] == ["a_ms", "b_ms"]
    with pytest.raises(pf.NotIdentifiable, match="b_ms \\+ c_ms"):
        _fit(predict, ["a_ms", "b_ms", "c_ms"], base, y, [str(i) for i in range(5)], chosen=False)
