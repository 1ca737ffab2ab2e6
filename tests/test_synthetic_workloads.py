"""Rate profiles, SGLang shared-prefix groups, multi-turn sessions, closed-loop clients."""

import numpy as np
import pytest

from sim.errors import UserError
from sim.run import run_scenario
from sim.scenario import Synthetic, scenario_from_dict
from sim.workload.synthetic import synthetic_workload
from tests.conftest import small_scenario


def test_piecewise_rate_follows_segments():
    spec = Synthetic(num_requests=20_000, rate_profile={"shape": "piecewise", "segments": [[100, 10], [100, 0], [100, 50]]})
    counts = np.histogram(synthetic_workload(spec, 0).arrival_s, bins=[0, 100, 200, 300])[0]
    assert counts[0] == pytest.approx(1000, rel=0.1) and counts[1] == 0 and counts[2] == pytest.approx(5000, rel=0.05)


def test_diurnal_rate_peaks_where_asked():
    spec = Synthetic(num_requests=20_000, rate_profile={"shape": "diurnal", "min_rate": 1, "max_rate": 9,
                                                        "period_s": 1000, "peak_s": 250})
    counts = np.histogram(synthetic_workload(spec, 0).arrival_s, bins=np.arange(0, 1001, 100))[0]
    assert np.argmax(counts) in (2, 3) and np.argmin(counts) in (7, 8)
    assert counts.max() / counts.min() > 4  # the 9:1 swing shows through Poisson noise


def test_prefix_groups_share_system_prompt_only():
    spec = Synthetic(output_tokens={"dist": "fixed", "value": 5},
                     prefix_groups={"num_groups": 3, "prompts_per_group": 4, "system_prompt_tokens": 100,
                                    "question_tokens": 20})
    w = synthetic_workload(spec, 0)
    assert len(w) == 12 and (w.input_tokens == 120).all()
    assert all(len(h) == 8 for h in w.hash_ids)  # ceil(120 / 16)
    for g in range(3):
        heads = {tuple(h[:6]) for h, s in zip(w.hash_ids, w.session_id) if s == g}  # 100 // 16 = 6 shared
        assert len(heads) == 1
    tails = [tuple(h[6:]) for h in w.hash_ids]
    assert len(set(tails)) == 12
    with pytest.raises(UserError, match="num_groups x prompts_per_group = 12"):
        synthetic_workload(Synthetic(num_requests=10, prefix_groups=spec.prefix_groups), 0)


def test_multi_turn_reuses_previous_context():
    spec = Synthetic(num_requests=60, input_tokens={"dist": "fixed", "value": 40},
                     output_tokens={"dist": "fixed", "value": 20},
                     multi_turn={"turns": {"dist": "fixed", "value": 3}, "think_time_s": 5})
    w = synthetic_workload(spec, 0)
    assert len(w) == 60 and np.all(np.diff(w.arrival_s) >= 0)
    for s in np.unique(w.session_id):
        idx = np.flatnonzero(w.session_id == s)
        lens = w.input_tokens[idx].tolist()
        assert lens == [40, 100, 160][: len(idx)]  # previous prompt + answer + new message
        for a, b in zip(idx[:-1], idx[1:]):
            # a turn's ids describe its prompt and its answer; the next prompt repeats them all
            k = -(-(w.input_tokens[a] + w.output_tokens[a]) // 16)
            assert len(w.hash_ids[a]) == k
            assert np.array_equal(w.hash_ids[b][:k], w.hash_ids[a])
            assert not np.isin(w.hash_ids[b][k:], w.hash_ids[a]).any()


def test_same_seed_same_synthetic_extras():
    spec = Synthetic(num_requests=50, multi_turn={}, rate_profile={"shape": "piecewise", "segments": [[5, 2]]})
    a, b = synthetic_workload(spec, 3), synthetic_workload(spec, 3)
    assert np.array_equal(a.arrival_s, b.arrival_s) and all(np.array_equal(x, y) for x, y in zip(a.hash_ids, b.hash_ids))


def _in_flight_max(frame) -> int:
    start, end = frame["arrival_s"].to_numpy(), frame["finish_s"].to_numpy()
    events = sorted([(t, 1) for t in start] + [(t, -1) for t in end], key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


@pytest.mark.parametrize("think_s", [0.0, 0.5])
def test_closed_loop_caps_concurrency(think_s):
    raw = small_scenario()
    raw["workload"]["synthetic"].update({"num_requests": 60, "request_rate": float("inf"), "max_concurrency": 4,
                                         "think_time_s": think_s})
    r = run_scenario(scenario_from_dict(raw))
    f = r.requests.sort("arrival_s")
    assert f.height == 60 and (f["status"] == "completed").all()
    assert _in_flight_max(f) == 4
    if think_s:
        # the 5th request goes out think_s after the first one ends
        first_end = f["finish_s"].to_numpy()[:4].min()
        assert f["arrival_s"][4] == pytest.approx(first_end + think_s)
