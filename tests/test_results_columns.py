"""Finished requests leave the simulation as columns (issue 14): the same results as keeping
every ``Request``, none of them kept alive, each recorded exactly once."""

import gc

import numpy as np
import pytest

from sim.core.request import Request
from sim.engine.columns import ColumnBuffer
from sim.engine.results import RequestResults
from tests.conftest import small_scenario


def _live_requests() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Request)


def test_results_columns_equal_the_requests_and_none_stay_alive():
    from sim.engine.cluster import simulate
    from sim.engine.topology import layout_for
    from sim.scenario import scenario_from_dict
    from sim.workload import build_workload

    s = scenario_from_dict(small_scenario())
    arrays = build_workload(s)
    kept, _ = simulate(arrays, topology=layout_for(s).build())
    results = RequestResults()
    before = _live_requests()
    none, _ = simulate(arrays, topology=layout_for(s).build(), results=results)
    assert none == [] and _live_requests() == before  # the run dropped every Request it made
    cols = results.columns()
    assert len(cols["request_id"]) == len(kept) == len(arrays)
    for f in ("arrival_s", "first_token_s", "finish_s", "prompt_tokens", "output_tokens", "num_preemptions",
              "replica", "prefix_hit_tokens", "ttft_prefill_s", "ttft_wait_batch_s"):
        assert np.array_equal(cols[f], np.array([getattr(r, f) for r in kept]), equal_nan=True), f
    assert cols["status"].tolist() == [r.status for r in kept]
    assert cols["fail_reason"].tolist() == [r.fail_reason for r in kept]


def test_a_request_recorded_twice_or_never_is_an_error():
    a, b = Request(0, 0.0, 5, 5), Request(1, 0.1, 5, 5)
    res = RequestResults()
    res.add([a, a])
    res.sent = 2
    with pytest.raises(AssertionError, match="exactly once"):
        res.columns()
    res = RequestResults()
    res.add([b])
    res.sent = 2
    with pytest.raises(AssertionError, match="exactly once"):
        res.columns()


def test_column_buffer_packs_and_orders_exactly():
    buf = ColumnBuffer(("id", "x"), {"id"}, block_rows=3)
    rows = [(7, 0.1), (2, float("nan")), (2**52 + 1, 1e300), (0, -0.0), (5, 2.5)]
    for r in rows:
        buf.append(r)
    assert len(buf) == 5
    cols = buf.columns(order_by="id")
    assert cols["id"].dtype == np.int64 and cols["id"].tolist() == [0, 2, 5, 7, 2**52 + 1]
    assert np.array_equal(cols["x"], [-0.0, np.nan, 2.5, 0.1, 1e300], equal_nan=True)
    assert buf.columns(order_by="id")["id"].tolist() == cols["id"].tolist()  # a second call: same


def test_rows_block_gives_numpys_conversion():
    """Rows are packed by one flat ``np.fromiter`` pass (faster): the same float64 values as
    ``np.array(rows, dtype=np.float64)``, ints, bools, numpy scalars, NaN and None (-> NaN)
    included; ragged rows are refused as numpy refuses them."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from sim.engine.columns import rows_block

    field = st.one_of(st.integers(-2**53, 2**53), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                      st.none(), st.integers(0, 10**6).map(np.int64), st.floats(0, 1).map(np.float64))

    @settings(max_examples=200, deadline=None)
    @given(width=st.integers(1, 6), data=st.data())
    def check(width, data):
        rows = data.draw(st.lists(st.tuples(*[field] * width), min_size=1, max_size=20))
        got, want = rows_block(rows, width), np.array(rows, dtype=np.float64)
        assert got.shape == want.shape and got.dtype == np.float64
        assert np.array_equal(got, want, equal_nan=True)

    check()
    with pytest.raises(ValueError):
        rows_block([(1.0, 2.0), (3.0,), (4.0, 5.0, 6.0)], 2)
