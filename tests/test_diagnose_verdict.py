"""diagnose leads with the verdict (issue 36): saturation judged over the arrival window with a
queue-growth test shared with run_warnings, the replicas that keep up found by simulation,
each SLO's floor and what could meet an infeasible one, bursts; fixes ranked as a planner
would; candidates in parallel on the sweep executor; ``--json``."""

import json

import numpy as np
import pytest

from sim.analysis.diagnose import diagnose
from sim.analysis.diagnose_fixes import Candidate, identical_results, rank
from sim.metrics.run_warnings import queue_growth, run_warnings, saturation, window_rates
from sim.sweep.executors import make_executor
from tests.conftest import ROOT
from tests.inproc_cli import simsrv

JSON_KEYS = ["offered_rate", "served_rate", "saturated", "replicas_needed", "slo", "floors_ms", "infeasible",
             "bursts", "fixes"]


def _csv(path, rows):
    path.write_text("arrival_s,input_tokens,output_tokens\n" + "\n".join(f"{a:.4f},{i},{o}" for a, i, o in rows) + "\n")
    return path


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("traces")
    rng = np.random.default_rng(1)
    # 400 requests at 50 req/s over 8 s on one H100 (Llama-3-8B serves ~30 of them a second)
    sat = [(a, int(rng.integers(500, 1500)), int(rng.integers(300, 700))) for a in np.sort(rng.uniform(0, 8, 400))]
    # 120 light requests at 1 req/s, 5 of them 24,000-token prompts: the p99 prompt is one
    longp = [(float(i), 24000 if i % 24 == 5 else int(rng.integers(300, 800)), 50) for i in range(120)]
    # a steady 1 req/s for 120 s and a burst of 60 requests inside half a second at t = 60 s
    burst = [(float(i), 600, 100) for i in range(120)] + [(60.0 + k / 120, 3000, 100) for k in range(60)]
    return {"sat": _csv(d / "sat.csv", sat), "long": _csv(d / "long.csv", longp),
            "burst": _csv(d / "burst.csv", sorted(burst))}


@pytest.fixture(scope="module")
def saturated(traces):
    return diagnose(traces["sat"], None, [])


def test_a_growing_queue_is_caught_when_service_is_longer():
    """The issue's run: queue time 5.8 s mid-run, 19.4 s at the end, service 60 s. Before, the
    test also asked the queue to be longer than the median service and called it not growing."""
    n = 1000
    arrival = np.linspace(0.0, 2000.0, n)
    queue = np.interp(arrival, [0.0, 1000.0, 2000.0], [0.0, 5.8, 20.0])
    summary = {"request_rate": 0.5, "request_throughput": 0.2, "num_prompts": n, "failed": 0}
    # half the requests are taken in while requests arrive: served well under offered
    assert queue_growth(arrival, queue)[0]
    warned = run_warnings(summary, arrival, queue + arrival * 0.5, all_arrival_s=arrival)
    assert warned and warned[0].startswith("saturated: ")
    # a stationary queue with noise, and one spike at the very end, are not growth
    noisy = np.random.default_rng(0).uniform(0.0, 0.05, n)
    assert not queue_growth(arrival, noisy)[0]
    spike = noisy.copy()
    spike[-30:] = 30.0
    assert not queue_growth(arrival, spike)[0]


def test_served_is_judged_over_the_arrival_window_not_the_drain():
    """1,000 arrivals over 100 s taken in at 5 req/s: half served while they arrive, although
    every request completes by the end of the drain (completions / last finish = 100%)."""
    arrival = np.linspace(0.0, 100.0, 1000)
    admitted = np.arange(1000) / 5.0
    offered, served = window_rates(arrival, admitted)
    assert offered == pytest.approx(9.99, rel=1e-3) and served == pytest.approx(5.01, rel=0.01)
    sat = saturation(arrival, arrival, admitted - arrival)
    assert sat.saturated
    assert not saturation(arrival, arrival, np.full(1000, 0.01)).saturated   # kept up


def test_saturation_and_the_replicas_that_keep_up_lead_the_diagnosis(saturated):
    d = saturated
    assert list(d.payload) == JSON_KEYS
    assert d.payload["saturated"] is True and d.payload["served_rate"] < 0.9 * d.payload["offered_rate"]
    assert d.verdict[0].startswith("Saturated: ") and "req/s offered" in d.verdict[0]
    n = d.payload["replicas_needed"]
    assert n == 2 and "2 replicas of this shape (2 GPUs) keep up" in d.verdict[0] and "1 do not" in d.verdict[0]
    # the claim is simulated: the candidate at 2 replicas keeps up, the run as is (1) does not
    two = next(c for c in d.candidates if c.name == "add capacity")
    assert two.gpus == 2 and two.meets_slo
    assert not any("Best fix per GPU" in s for s in d.sentences)


def test_fixes_meeting_every_slo_come_first_then_the_largest_gain():
    """Meets every SLO: fewest GPUs added, then p99 TTFT; the rest by absolute gain (an 83% gain
    for one GPU above a 3.6% one for none)."""
    def c(name, added, p99, gain, meets):
        return Candidate(name, "", gpus_added=added, p99_ttft_ms=p99, ttft_gain_ms=gain, meets_slo=meets)
    fp8 = c("fp8", 0, 964.0, 36.0, False)
    replica = c("replica", 1, 170.0, 830.0, False)
    four = c("four", 3, 60.0, 940.0, True)
    two = c("two", 1, 150.0, 850.0, True)
    two_b = c("two b", 1, 120.0, 880.0, True)
    assert [x.name for x in rank([fp8, replica, four, two, two_b], 1000.0)] == ["two b", "two", "four", "replica", "fp8"]


def test_an_infeasible_ttft_slo_is_said_with_what_could_meet_it(traces):
    """The p99 prompt (24,000 tokens) alone on an idle H100 takes far longer than 100 ms: no
    replica count meets p99 TTFT < 100 ms; TP 2, a faster GPU and shorter prompts are simulated."""
    d = diagnose(traces["long"], None, ["model=llama-3.1-8b", "engine.policy=chunked", "slo.ttft_ms=100"])
    floor = d.payload["floors_ms"]["prefill_p99_prompt"]
    assert floor > 100 and d.payload["infeasible"] == ["ttft_p99_ms"]
    assert d.summary["p99_ttft_ms"] >= floor * 0.999   # a floor: no request beats its prompt's solo prefill
    text = next(s for s in d.verdict if s.startswith("SLO ttft_p99_ms"))
    assert "no number of replicas of this shape meets it" in text and "24,000 tokens" in text
    assert "TP 2 (2 GPUs a replica): " in text and "one 24,000-token chunk: " in text and "prompts up to " in text and "tokens meet it on this shape" in text
    # --slo judges another percentile: the median prompt alone is well inside 100 ms
    d50 = diagnose(traces["long"], None, ["model=llama-3.1-8b", "engine.policy=chunked"], slo="ttft_p50_ms=100")
    assert d50.payload["infeasible"] == [] and d50.payload["slo"] == {"ttft_p50_ms": 100.0}
    assert all(set(f["meets"]) == {"ttft_p50_ms"} for f in d50.payload["fixes"])


def test_a_burst_is_named_with_peak_rates_and_the_tail_span(traces):
    d = diagnose(traces["burst"], None, [])
    b = d.payload["bursts"]
    assert b["peak_1s_rate"] >= 60 and b["peak_10s_rate"] >= 6.0 and b["slowest_1pct_span_s"] <= 1.0
    text = next(s for s in d.verdict if s.startswith("Arrivals: "))
    assert "one burst" in text and "over 1 s" in text


def test_identical_candidates_name_the_requests_that_set_the_p99():
    """Long-prompt pools of +1..3 replicas come out identical when the p99 is set by the short
    prompts the deployment as is still serves: the text says so and what holds them."""
    d = diagnose(ROOT / "traces/samples/azure_code_2023_first500.csv", None, [])
    pools = [c for c in d.candidates if c.name.startswith("long-prompt pool")]
    assert len({round(c.p99_ttft_ms, 1) for c in pools}) == 1
    text = next(s for s in d.sentences if "identical results" in s)
    assert "long-prompt pool +1, long-prompt pool +2 and long-prompt pool +3" in text
    assert "served by the deployment as is" in text and "of their TTFT is" in text
    assert identical_results([pools[0]]) == []


def test_json_on_parallel_workers_matches_the_serial_run(traces, saturated, tmp_path):
    """--json prints exactly the documented keys; two local worker processes give the same
    verdict and fixes as this process alone."""
    out = simsrv("diagnose", str(traces["sat"]), "--json", "--workers", "2", "--out", str(tmp_path / "d"))
    assert out.code == 0, out.stderr
    got = json.loads(out.stdout)
    assert list(got) == JSON_KEYS and got == json.loads(json.dumps(saturated.payload))
    assert list(got["fixes"][0]) == ["name", "gpus", "p99_ttft_ms", "p99_tpot_ms", "meets_slo", "meets"]
    bad = simsrv("diagnose", str(traces["sat"]), "--slo", "ttft_p42_ms=5", "--out", str(tmp_path / "e"))
    assert bad.clean and bad.code == 2 and "--slo" in bad.stderr


def test_progress_is_reported_for_every_simulation(traces):
    seen = []
    ex = make_executor("local", 1, None)
    diagnose(traces["sat"], None, [], executor=ex, progress=lambda done, total: seen.append((done, total)))
    assert seen and seen[-1][0] == seen[-1][1] and [d for d, _ in seen] == list(range(1, len(seen) + 1))


def test_with_prefix_caching_the_floor_is_the_part_no_cache_can_spare():
    """Before, a trace with prefix hashes under prefix caching was never judged infeasible; the
    floor is now the prompt less the longest leading run of blocks an earlier prompt held."""
    from sim.analysis.diagnose_verdict import uncached_tokens
    from sim.workload import RequestArrays

    ids = [np.array([1, 2, 3]), np.array([1, 2, 9, 10]), np.array([7, 2]), np.array([1, 2, 3])]
    arrays = RequestArrays(np.array([0.0, 1.0, 2.0, 3.0]), np.array([48, 64, 32, 48]), np.ones(4, dtype=np.int64),
                           hash_ids=ids, hash_block_size=16)
    # the second shares blocks 1, 2 with the first; the third's first block is new (a prefix
    # match stops there); the fourth repeats the first whole: one token recomputed
    assert uncached_tokens(arrays).tolist() == [48, 32, 32, 1]
