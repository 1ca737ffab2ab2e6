"""One registry each for the trace formats (sim/workload/formats.py) and result.json's latency
keys (sim/metrics/keys.py): everything else derives from them, so a format or a key is named
once and a misspelt key fails loudly instead of reading as None."""

import json
import re
from pathlib import Path

import pytest

from sim.errors import UserError
from sim.metrics import keys
from sim.scenario import scenario_from_dict
from sim.workload import formats
from sim.workload.formats import TIME_UNITS, TRACE_FORMATS, TraceFormat, format_choices, format_names
from tests.conftest import ROOT, small_scenario

SIM = ROOT / "sim"
SAMPLES = ROOT / "traces" / "samples"


def _code_lines(skip: tuple[str, ...]):
    """(path, line number, code without its comment) of every line of sim/ outside ``skip``."""
    for path in sorted(SIM.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in skip:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            yield rel, n, line.split("#")[0]


# ---- trace formats ----

def _trace_scenario(fmt: str) -> dict:
    raw = small_scenario()
    raw["workload"] = {"trace": {"path": str(SAMPLES / "generic_ms_example.csv"), "format": fmt}}
    return raw


def test_the_scenario_takes_exactly_the_registered_formats(monkeypatch):
    for fmt in format_choices():
        assert scenario_from_dict(_trace_scenario(fmt)).workload.trace.format == fmt
    listed = ", ".join(f"'{f}'" for f in format_choices()[:-1]) + f" or '{format_choices()[-1]}'"
    with pytest.raises(UserError, match=re.escape(f"workload.trace.format: Input should be {listed} (got 'nope')")):
        scenario_from_dict(_trace_scenario("nope"))
    # a format registered later is a valid choice: the scenario reads the registry, no list of its own
    monkeypatch.setitem(TRACE_FORMATS, "house", TraceFormat("house", "table", ("t", "i", "o"), "generic"))
    assert scenario_from_dict(_trace_scenario("house")).workload.trace.format == "house"


def test_the_cli_options_derive_from_the_registry():
    from sim.cli import trace as cli_trace

    assert cli_trace.FORMAT_HELP == " | ".join(("auto", *format_names()))
    assert cli_trace.TIME_UNIT_HELP == "generic: " + " | ".join(TIME_UNITS) + "."
    with pytest.raises(UserError, match="--format nope: one of auto, normalized, azure"):
        cli_trace._options("nope", None, None, False, "s", "a", "i", "o", None, 0)


def test_every_registered_format_has_its_reader_and_units():
    from sim.workload.readers import converter, flattener

    for name, spec in TRACE_FORMATS.items():
        assert spec.name == name
        assert spec.reader is None or callable(converter(name)), name
        assert spec.flatten is None or callable(flattener(name)), name
        assert spec.time_unit is None or spec.time_unit in TIME_UNITS, name
        assert set(spec.numeric_text) <= set(spec.columns), name
        assert spec.kind in ("table", "jsonl", "json", "any"), name
    assert formats.source_time_unit("mooncake", "s") == "ms"
    assert formats.source_time_unit("generic", "us") == "us"
    assert formats.source_time_unit("vidur", "us") == "s"


def test_the_numeric_reader_follows_the_registry(monkeypatch):
    from sim.workload.readers import ReadOptions
    from sim.workload.trace import _numeric_columns

    path = SAMPLES / "azure_2024_schema_example.csv"
    cols, text = _numeric_columns(path, "azure", ReadOptions(format="azure"))
    assert text == ("TIMESTAMP",) and "ContextTokens" in cols
    import dataclasses

    monkeypatch.setitem(TRACE_FORMATS, "azure", dataclasses.replace(TRACE_FORMATS["azure"], numeric=False))
    assert _numeric_columns(path, "azure", ReadOptions(format="azure")) is None


FORMAT_NAME = re.compile(r"""["'](%s)["']""" % "|".join(map(re.escape, [f for f in TRACE_FORMATS if f != "generic"])))


def test_no_list_of_format_names_outside_the_registry():
    """Two or more format names on one line is a hand-kept list (a format's own reader may name
    its format once)."""
    hits = [f"{p}:{n}: {code.strip()}" for p, n, code in _code_lines(("sim/workload/formats.py",))
            if len(FORMAT_NAME.findall(code)) >= 2]
    assert hits == []


# ---- result.json keys ----

def test_key_builds_only_the_keys_result_json_has():
    assert keys.key("p99", "ttft") == "p99_ttft_ms" == keys.P99_TTFT
    assert keys.key("p99.9", "itl") == "p99.9_itl_ms"
    assert keys.queue_key("p90") == "simsrv_p90_queue_time_ms"
    for stat, metric in (("p95", "ttft"), ("p99", "ttfts"), ("p99.9", "ttft")):
        with pytest.raises(KeyError):
            keys.key(stat, metric)
    with pytest.raises(KeyError):
        keys.queue_key("p99.9")


@pytest.fixture(scope="module")
def real_summary(tmp_path_factory) -> dict:
    """A real run's result.json, written by the run directory writer."""
    from sim.metrics.summary import summarize
    from sim.output import write_run
    from sim.run import run_scenario

    raw = small_scenario()
    raw["workload"]["synthetic"]["num_requests"] = 20
    result = run_scenario(scenario_from_dict(raw))
    out = tmp_path_factory.mktemp("run") / "r"
    out.mkdir()
    write_run(result, summarize(result), out)
    return json.loads((out / "result.json").read_text())


def test_every_key_the_pages_and_analysis_read_is_in_a_real_result_json(real_summary):
    from sim.analysis.diagnose_fixes import figures
    from sim.analysis.diagnose_verdict import slo_terms
    from sim.reporting.metrics_table import ROWS
    from sim.reporting.sweep_page import CURVES
    from sim.sweep.slo import parse_slo
    from sim.sweep.stats import METRICS

    have = set(real_summary)
    assert set(keys.LATENCY_KEYS) | set(keys.QUEUE_KEYS) | {keys.MAX_ITL} <= have
    used = {r.key for r in ROWS} | {c[0] for c in CURVES} | set(METRICS)
    used |= {t.key for t in parse_slo(",".join(f"{m}_{s}_ms=1" for m in keys.LATENCY_METRICS
                                               for s in ("mean", "median", "p50", "p90", "p99")))}
    used |= {t.key for t in slo_terms(scenario_from_dict(small_scenario(slo={"ttft_ms": 1, "tpot_ms": 1,
                                                                              "e2el_ms": 1})), None)}
    import polars as pl

    frame = pl.DataFrame({"status": ["completed"], "ttft_s": [0.1], "tpot_s": [0.01]})
    used |= set(figures([frame])) - {"num_requests"}
    sweep_rows_own = {"simsrv_utilization"}  # a sweep row's figure (sim/sweep/task.py), not result.json's
    assert sorted(used - have - sweep_rows_own) == []


# a result.json key as a literal, or built by hand in an f-string (``f"{stat}_ttft_ms"``)
LATENCY_LITERAL = re.compile(r"""["'](mean|median|std|p\d+(\.\d+)?)_(ttft|tpot|itl|e2el)_ms["']"""
                             r"""|\}_(ttft|tpot|itl|e2el)_ms["']|_\{\w+\}_ms["']|["']simsrv_\w*queue_time_ms["']"""
                             r"""|["']simsrv_max_itl_ms["']""")


def test_no_latency_key_is_spelt_by_hand_outside_the_keys_module():
    hits = [f"{p}:{n}: {code.strip()}" for p, n, code in _code_lines(("sim/metrics/keys.py",))
            if LATENCY_LITERAL.search(code) and not p.startswith(("sim/kernels/", "sim/cost/"))]
    assert hits == []
