"""Streaming a trace in chunks gives the same requests as reading it whole, and the same simulation."""

import numpy as np
import pytest

from sim.errors import UserError
from sim.workload.arrays import concat
from sim.workload.readers import ReadOptions
from sim.workload.trace import read_trace, stream_trace


def test_stream_equals_whole_read(root):
    p = root / "traces" / "samples" / "mooncake_synthetic_first500.jsonl"
    whole = read_trace(p)
    chunks = list(stream_trace(p, chunk_rows=37))
    assert len(chunks) > 10
    s = concat(chunks)
    assert np.array_equal(s.arrival_s, whole.arrival_s) and np.array_equal(s.input_tokens, whole.input_tokens)
    assert all(np.array_equal(a, b) for a, b in zip(s.hash_ids, whole.hash_ids))


def test_stream_spread_grid_matches_whole_read(tmp_path):
    p = tmp_path / "g.jsonl"
    p.write_text("".join(f'{{"timestamp": {3000 * (i // 7)}, "input_length": {i + 1}, "output_length": 2}}\n'
                         for i in range(200)))
    opts = ReadOptions(spread_grid_s=3.0, seed=4)
    whole = read_trace(p, opts=opts)
    s = concat(list(stream_trace(p, opts, chunk_rows=13)))
    assert np.allclose(s.arrival_s, whole.arrival_s) and np.array_equal(s.input_tokens, whole.input_tokens)


def test_stream_refuses_disorder_across_chunks(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text("".join(f'{{"timestamp": {t}, "input_length": 5, "output_length": 5}}\n' for t in [0, 1, 2, 3, 0.5, 4]))
    with pytest.raises(UserError, match="simsrv trace convert"):
        list(stream_trace(p, chunk_rows=2))


def test_simulation_of_stream_equals_whole(root):
    from sim.engine.cluster import simulate
    from sim.engine.deployment import build_deployment
    from sim.engine.router import make_router
    from sim.scenario import load_scenario

    s = load_scenario(root / "scenarios" / "trace_vidur.yaml")
    p = root / "traces" / "samples" / "vidur_splitwise_conv_first500.csv"

    def go(arrays):
        dep = build_deployment(s)
        sched = [dep.new_scheduler(s.engine.policy)]
        reqs, _ = simulate(arrays, sched, [dep.cost], make_router("round_robin"))
        return [(r.request_id, r.arrival_s, r.first_token_s, r.finish_s) for r in reqs]

    assert go(stream_trace(p, chunk_rows=64)) == go(read_trace(p))
