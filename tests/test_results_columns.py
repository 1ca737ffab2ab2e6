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


def test_a_result_row_is_every_field_in_order():
    """``result_row`` reads the fields one by one: the same values, in ``FIELDS`` order."""
    from sim.engine.results import FIELDS, result_row
    r = Request(7, 1.5, 900, 300)
    for i, f in enumerate(FIELDS):  # a distinct value per field (ints where the slot holds one)
        setattr(r, f, 100 + i if isinstance(getattr(r, f), int) else 0.25 + i)
    assert result_row(r, 3) == (*(getattr(r, f) for f in FIELDS), 3)
    assert len(set(result_row(r, 3))) == len(FIELDS) + 1


def test_results_add_writes_what_append_writes_of_the_result_row():
    """``RequestResults.add`` hands a request's fields to ``pack_into`` one by one, not as
    ``result_row``'s tuple: the same row (every field distinct, a label code too), the first
    (packed by the slow path: no room yet) and across blocks, NaN included."""
    from sim.engine.results import FIELDS, result_row
    reqs = []
    for k in range(7):
        r = Request(k, 1.5 + k, 900, 300)
        for i, f in enumerate(FIELDS[1:], 1):
            setattr(r, f, 100 * k + i if isinstance(getattr(r, f), int) else 0.25 + i + k)
        r.status, r.fail_reason = ("failed", f"reason {k % 3}") if k % 2 else ("finished", "")
        reqs.append(r)
    reqs[4].first_token_s = float("nan")
    added, appended = RequestResults(block_rows=3), RequestResults(block_rows=3)
    added.add(reqs)
    codes = {}
    for r in reqs:
        appended.append(result_row(r, codes.setdefault((r.status, r.fail_reason), len(codes))))
    appended._label_code = codes
    added.sent = appended.sent = len(reqs)
    a, b = added.columns(), appended.columns()
    assert a.keys() == b.keys() and len(a["request_id"]) == 7
    for name in a:
        assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name], equal_nan=a[name].dtype != object), name
    assert np.isnan(a["first_token_s"][4]) and a["fail_reason"].tolist()[1] == "reason 1"


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


def test_appended_rows_keep_numpys_conversion():
    """Rows are written as they are appended (``struct.pack_into``, faster than packing the
    tuples later): in a float column the same float64 values as ``np.array(rows,
    dtype=np.float64)``; in an integer column a Python or numpy int exactly (beyond 2**53 too),
    anything else numpy's float64 cast to int64 (as ``astype``); ints, bools, numpy scalars,
    NaN, None (-> NaN) and numeric strings included, in step rows and in results alike; a row of
    another length is refused, as numpy refuses it, and leaves the rows before it as they were."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    field = st.one_of(st.integers(-2**53, 2**53), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                      st.none(), st.integers(0, 10**6).map(np.int64), st.floats(0, 1).map(np.float64),
                      st.sampled_from(["1.5", "-2", "nan"]), st.integers(2**53, 2**62))

    def as_int(v):
        if isinstance(v, (int, np.integer)):  # bools too
            return int(v)
        with np.errstate(invalid="ignore"):
            return int(np.array([v], dtype=np.float64).astype(np.int64)[0])

    @settings(max_examples=300, deadline=None)
    @given(width=st.integers(1, 6), block_rows=st.integers(1, 25), data=st.data())
    def check(width, block_rows, data):
        rows = data.draw(st.lists(st.tuples(*[field] * width), min_size=1, max_size=20))
        is_int = data.draw(st.lists(st.booleans(), min_size=width, max_size=width))
        names = tuple(f"c{i}" for i in range(width))
        buf = ColumnBuffer(names, {n for n, integer in zip(names, is_int) if integer}, block_rows=block_rows)
        for r in rows:
            buf.append(r)
        for i, (n, integer) in enumerate(zip(names, is_int)):
            got = buf.column(n)
            if integer:
                assert got.dtype == np.int64 and got.tolist() == [as_int(r[i]) for r in rows]
            else:
                want = np.array([r[i] for r in rows], dtype=np.float64)
                assert got.dtype == np.float64 and np.array_equal(got, want, equal_nan=True)

    check()
    buf = ColumnBuffer(("a", "b"))
    buf.append((1.0, 2.0))
    for ragged in ((3.0,), (4.0, 5.0, 6.0), (None,), (7.0, (8.0, 9.0))):
        with pytest.raises(ValueError):
            buf.append(ragged)
    buf.append((None, 10))
    assert len(buf) == 2 and np.array_equal(buf.column("a"), [1.0, np.nan], equal_nan=True)
    assert buf.column("b").tolist() == [2.0, 10.0]


def test_step_rows_add_is_append_of_the_row():
    """The step log's ``add`` (the row's numbers as arguments) writes what ``append`` writes of
    the same row: values, None (NaN), numeric strings, across blocks."""
    from sim.engine.recorder import _INT, STEP_COLUMNS, StepRows
    rng = np.random.default_rng(0)
    rows = [tuple(int(v) if c in _INT else float(v) for c, v in zip(STEP_COLUMNS, rng.integers(0, 10**6, 12)))
            for _ in range(40)]
    rows[5] = rows[5][:1] + (None,) + rows[5][2:]  # (a float column: NaN)
    rows[9] = rows[9][:3] + ("7",) + rows[9][4:]
    a, b = StepRows(STEP_COLUMNS, _INT, block_rows=16), StepRows(STEP_COLUMNS, _INT, block_rows=16)
    for r in rows:
        a.append(r)
        b.add(*r)
    for c in STEP_COLUMNS:
        assert np.array_equal(a.column(c), b.column(c), equal_nan=True), c
    assert len(b) == 40 and b.column("num_steps")[9] == 7
