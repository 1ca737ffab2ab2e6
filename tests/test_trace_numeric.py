"""The numeric reader (pyarrow, no polars) against the general reader (polars) on the same files.

A CSV or Parquet trace whose three columns are numbers is read by ``sources.numeric_batches``;
anything else in a batch hands it to the general reader, which names the bad line. Both must
give the same arrays on every file the numeric reader accepts, and the same errors otherwise.
"""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim.workload.trace as trace
from sim.errors import UserError
from sim.workload.readers import ReadOptions, ReadState
from sim.workload.trace import raw_chunks, read_column, read_trace

GENERIC = ReadOptions(format="generic", time_unit="ms")


def _read(path, opts, numeric: bool, monkeypatch, chunk_rows=1_000_000, state=None):
    with monkeypatch.context() as m:
        if not numeric:
            m.setattr(trace, "_numeric_batches", lambda *a: None)
        return list(raw_chunks(path, opts, state, chunk_rows=chunk_rows))


def _same_array(u, v):
    assert (u is None) == (v is None)
    if u is not None:
        assert u.dtype == v.dtype and u.tobytes() == v.tobytes()


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for f in ("arrival_s", "input_tokens", "output_tokens", "session_id", "priority"):
            _same_array(getattr(x, f), getattr(y, f))
        assert x.hash_block_size == y.hash_block_size
        assert (x.hash_ids is None) == (y.hash_ids is None)
        for u, v in zip(x.hash_ids or (), y.hash_ids or ()):
            _same_array(u, v)
        assert (x.measured or {}).keys() == (y.measured or {}).keys()
        for k in x.measured or {}:
            _same_array(x.measured[k], y.measured[k])


def _alike(path, opts, monkeypatch, chunk_rows):
    """Both readers give the same arrays and the same notes (rows left out ...), or the same
    error line."""
    outcomes, notes = [], []
    for numeric in (True, False):
        state = ReadState()
        try:
            outcomes.append(_read(path, opts, numeric, monkeypatch, chunk_rows, state))
        except UserError as e:
            outcomes.append(str(e))
        except Exception as e:  # noqa: BLE001
            raise AssertionError(f"{'numeric' if numeric else 'general'} reader: a traceback, not one error line") from e
        notes.append(list(state.notes.items()))
    if isinstance(outcomes[0], str) or isinstance(outcomes[1], str):
        assert outcomes[0] == outcomes[1]
    else:
        _same(*outcomes)
        assert notes[0] == notes[1]


# how a number may be written in a CSV that both readers accept
_TEXT = st.sampled_from(["{}", " {}", "{} ", "+{}", "{}.0", "{}e0", "{}E+0", "00{}", '"{}"'])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.floats(0, 1e9, allow_nan=False), st.integers(1, 10**6), st.integers(1, 10**6),
                               _TEXT, _TEXT), min_size=1, max_size=30),
       chunk_rows=st.integers(1, 8))
def test_csv_numeric_reader_equals_general_reader(tmp_path_factory, monkeypatch, rows, chunk_rows):
    path = tmp_path_factory.mktemp("t") / "t.csv"
    with path.open("w") as f:
        f.write("t,i,o,other\n")
        for t, i, o, ti, to in rows:
            f.write(f"{t!r},{ti.format(i)},{to.format(o)},x\n")
    opts = ReadOptions(format="generic", time_unit="ms", arrival_column="t", input_column="i", output_column="o")
    assert trace._numeric_columns(path, "generic", opts) == (["t", "i", "o"], ())
    _same(_read(path, opts, True, monkeypatch, chunk_rows), _read(path, opts, False, monkeypatch, chunk_rows))


@pytest.mark.parametrize("types", [(pa.float64(), pa.int64(), pa.int32()), (pa.int64(), pa.float32(), pa.uint16())])
def test_parquet_numeric_reader_equals_general_reader(tmp_path, monkeypatch, types):
    rng = np.random.default_rng(1)
    n = 1000
    cols = [rng.uniform(0, 1e6, n).round(0 if pa.types.is_integer(types[0]) else 3), rng.integers(1, 5000, n),
            rng.integers(1, 900, n)]
    table = pa.table({name: pa.array(c).cast(t) for name, c, t in zip(("arrival_s", "input_tokens", "output_tokens"),
                                                                     cols, types)})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    opts = ReadOptions(format="normalized")
    assert trace._numeric_columns(path, "normalized", opts) is not None
    _same(_read(path, opts, True, monkeypatch, 300), _read(path, opts, False, monkeypatch, 300))


def test_which_traces_the_numeric_reader_may_read(tmp_path, root):
    samples = root / "traces" / "samples"
    assert trace._numeric_columns(samples / "azure_code_2023_first500.csv", "azure", ReadOptions()) == \
        (["TIMESTAMP", "ContextTokens", "GeneratedTokens"], ("TIMESTAMP",))
    assert trace._numeric_columns(samples / "vidur_splitwise_conv_first500.csv", "vidur", ReadOptions()) is not None
    assert trace._numeric_columns(samples / "burstgpt_schema_example.csv", "burstgpt", ReadOptions()) == \
        (["Timestamp", "Model", "Request tokens", "Response tokens"], ("Model",))
    p = tmp_path / "n.csv"
    p.write_text("arrival_s,input_tokens,output_tokens,session_id\n0,5,5,1\n")
    assert trace._numeric_columns(p, "normalized", ReadOptions()) is None  # a fourth column to read
    assert trace._numeric_columns(p, "generic", ReadOptions(time_unit="datetime")) == \
        (["arrival_s", "input_tokens", "output_tokens"], ("arrival_s",))
    j = tmp_path / "g.jsonl"
    j.write_text('{"arrival_s": 0, "input_tokens": 5, "output_tokens": 5}\n')
    assert trace._numeric_columns(j, "generic", ReadOptions()) is None


@pytest.mark.parametrize("bad, message", [
    ("0", "line 7: column i is '0', expected a whole number from 1"),
    ("", "line 7: column i is '', expected a whole number"),
    ("NaN", "line 7: column i is 'NaN', expected a whole number"),
    ("2.5", "line 7: column i is '2.5', expected a whole number"),
    ("ten", "line 7: column i is 'ten', expected a whole number"),
    ("1,2", "line 7: 4 fields, the header has 3"),
])
def test_a_bad_csv_value_is_named_as_the_general_reader_names_it(tmp_path, monkeypatch, bad, message):
    p = tmp_path / "t.csv"
    rows = ["1,10,3"] * 5 + [f"2,{bad},3", "3,4,4"]
    p.write_text("t,i,o\n" + "\n".join(rows) + "\n")
    opts = ReadOptions(format="generic", arrival_column="t", input_column="i", output_column="o")
    errors = []
    for numeric in (True, False):
        with monkeypatch.context() as m:
            if not numeric:
                m.setattr(trace, "_numeric_batches", lambda *a: None)
            with pytest.raises(UserError, match=message) as e:
                list(raw_chunks(p, opts))
        errors.append(str(e.value))
    assert errors[0] == errors[1]


@pytest.mark.parametrize("bad, message", [(0.0, "row 7: column input_tokens is 0, expected a whole number"),
                                          (None, "row 7: column input_tokens is missing")])
def test_the_general_reader_goes_on_where_the_numeric_reader_gave_up(tmp_path, monkeypatch, bad, message):
    """Batches of 2 rows: the numeric reader delivers rows 1-4 and gives up on the batch of row
    7; the general reader goes on from row 5 and names row 7, as it does reading alone."""
    p = tmp_path / "t.parquet"
    inp = [10.0] * 6 + [bad] + [4.0]
    pq.write_table(pa.table({"arrival_s": [float(i) for i in range(8)], "input_tokens": pa.array(inp, pa.float64()),
                             "output_tokens": [3.0] * 8}), p)
    opts = ReadOptions(format="normalized")
    seen = []
    for numeric in (True, False):
        with monkeypatch.context() as m:
            if not numeric:
                m.setattr(trace, "_numeric_batches", lambda *a: None)
            chunks = raw_chunks(p, opts, chunk_rows=2)
            got = [next(chunks), next(chunks), next(chunks)]  # rows 1-6
            with pytest.raises(UserError, match=message):
                next(chunks)
        seen.append(got)
    _same(*seen)


def test_read_column_numeric_and_errors(tmp_path):
    p = tmp_path / "c.csv"
    p.write_text("n,x\n5,a\n7,b\n")
    assert read_column(p, "n", "w").tolist() == [5, 7]
    p.write_text("n,x\n5,a\n7.5,b\n")
    with pytest.raises(UserError, match="line 3: column n is '7.5'"):
        read_column(p, "n", "w")


def test_same_trace_same_arrays_in_run(tmp_path, monkeypatch):
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,input_tokens,output_tokens\n3,5,6\n1,7,8\n2,9,1\n")
    a = read_trace(p, "generic")
    monkeypatch.setattr(trace, "_numeric_batches", lambda *a: None)
    b = read_trace(p, "generic")
    _same([a], [b])


def _date_time(y, mo, d, h, mi, s, frac, sep, pad, odd, zone):
    hour = f"{h}" if odd == "one-digit hour" else f"{h:02d}"
    second = 60 if odd == "leap second" else s
    return f"{pad}{y}-{mo:02d}-{d:02d}{sep}{hour}:{mi:02d}:{second:02d}{frac}{zone}{pad}"


# a file's date-times: one zone for all (or a mix), now and then a form polars alone reads
_ZONES = st.sampled_from([("",), ("+00:00",), ("-07:30",), ("", "+01:30")])
_ROW = st.tuples(st.integers(1900, 2200), st.integers(1, 12), st.integers(1, 28), st.integers(0, 23),
                 st.integers(0, 59), st.integers(0, 59),
                 st.sampled_from(["", ".5", ".68", ".680590", ".6805909", ".123456789", ".1234567891"]),
                 st.sampled_from([" ", "T"]), st.sampled_from(["", "", " "]),
                 st.sampled_from([""] * 8 + ["one-digit hour", "leap second"]), st.integers(0, 1))
# text that is not a date-time to either reader (or a day that does not exist)
_BAD_TIME = st.sampled_from(["2023-02-29 10:00:00", "2023-04-31 00:00:00", "2023-11-16 24:00:00", "2023-11-16",
                             "2023-11-16 18:15", "2023-11-16 18:15:46.", "yesterday", "", "2023-11-16 18:15:46+0130"])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(_ROW, min_size=1, max_size=20), zones=_ZONES, bad=st.one_of(st.none(), _BAD_TIME),
       where=st.integers(0, 19), chunk_rows=st.integers(1, 8))
def test_azure_date_times_read_alike_by_both_readers(tmp_path_factory, monkeypatch, rows, zones, bad, where,
                                                     chunk_rows):
    """Azure traces' date-times: pyarrow converts the canonical text, the general reader
    (polars) the rest; the same seconds to the bit, or the same error line."""
    times = [_date_time(*r[:-1], zones[r[-1] % len(zones)]) for r in rows]
    if bad is not None:
        times = [*times[:where], bad, *times[where:]]
    path = tmp_path_factory.mktemp("a") / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f'"{t}",{i + 5},{i + 1}\n'
                                                                          for i, t in enumerate(times)))
    _alike(path, ReadOptions(format="azure"), monkeypatch, chunk_rows)


@pytest.mark.parametrize("text", ["2023-02-29 10:00:00", "2023-04-31 00:00:00", "2023-11-16 24:00:00", "2023-11-16",
                                  "2023-11-16 18:15", "2023-11-16 18:15:46.", "2023-11-16 18:15:46+0130",
                                  "2023-11-16 18:15:46Z", "2023-11-16 8:15:46", "2023-11-16 23:59:60.5",
                                  "2023-11-16 18:15:46 +01:30", "0999-11-16 18:15:46"])
def test_date_times_outside_the_canonical_form_are_the_general_readers(tmp_path, monkeypatch, text):
    """Each form pyarrow must not convert, alone in its batch between canonical rows: the same
    seconds or the same error line from both readers."""
    path = tmp_path / "azure.csv"
    times = ["2023-11-16 18:15:46.1", text, "2023-11-16 18:15:48"]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{t},5,1\n" for t in times))
    _alike(path, ReadOptions(format="azure"), monkeypatch, 1)


def _arrow_conversions(monkeypatch) -> list[str]:
    """What each call of pyarrow's date-time conversion did from now on: "converted", or the
    exception that handed the batch to the general reader."""
    from sim.workload import validate

    outcomes: list[str] = []
    real = validate._arrow_datetimes_us

    def counting(text):
        try:
            us = real(text)
        except Exception as e:
            outcomes.append(type(e).__name__)
            raise
        outcomes.append("converted")
        return us

    monkeypatch.setattr(validate, "_arrow_datetimes_us", counting)
    return outcomes


def test_the_azure_sample_is_read_by_pyarrow_alone_to_the_same_seconds(root, monkeypatch):
    """The shipped Azure sample (7-digit fractions, truncated to microseconds as polars does) is
    converted by pyarrow in every batch, to the same seconds as the general reader (polars)."""
    path = root / "traces" / "samples" / "azure_code_2023_first500.csv"
    outcomes = _arrow_conversions(monkeypatch)
    opts = ReadOptions(format="azure")
    _same(_read(path, opts, True, monkeypatch, 100), _read(path, opts, False, monkeypatch, 100))
    assert outcomes and set(outcomes) == {"converted"}


def test_generic_date_time_arrivals_read_alike(tmp_path, monkeypatch):
    """``format: generic`` with ``time_unit: datetime`` takes the same date-time conversion."""
    path = tmp_path / "g.csv"
    path.write_text("when,in,out\n2024-05-10 00:00:00.009930+00:00,5,1\n2024-05-10 00:00:01.5+00:00,7,2\n")
    opts = ReadOptions(format="generic", time_unit="datetime", arrival_column="when", input_column="in",
                       output_column="out")
    assert trace._numeric_columns(path, "generic", opts) == (["when", "in", "out"], ("when",))
    _alike(path, opts, monkeypatch, 1)
    assert read_trace(path, opts=opts).arrival_s.tolist() == pytest.approx([0.0, 1.49007])


_MODEL = st.sampled_from(["ChatGPT", "GPT-4", " ChatGPT ", "\tGPT-4", "", "ChatGPT\u00a0", "Modèle", "chatgpt"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.integers(0, 10**6), _MODEL, st.integers(1, 5000), st.integers(0, 3)),
                     min_size=1, max_size=20),
       model_filter=st.sampled_from([None, "ChatGPT", "GPT-4"]), keep_failed=st.booleans(),
       bad=st.sampled_from([None, "x", "-1", "2.5", ""]), where=st.integers(0, 19), chunk_rows=st.integers(1, 8))
def test_burstgpt_read_alike_by_both_readers(tmp_path_factory, monkeypatch, rows, model_filter, keep_failed, bad,
                                             where, chunk_rows):
    """BurstGPT: its Model column handed over as text (trimmed and compared by pyarrow when
    ASCII), failed rows (0 response tokens), a bad value: the same arrays, the same notes of rows
    left out, or the same error line."""
    path = tmp_path_factory.mktemp("b") / "burst.csv"
    lines = [f'{t},"{m}",{i},{o},{i + o},Conversation log' for t, m, i, o in rows]
    if bad is not None:
        lines.insert(where, f"5,ChatGPT,{bad},3,3,Conversation log")
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" + "\n".join(lines) + "\n")
    _alike(path, ReadOptions(format="burstgpt", model_filter=model_filter, keep_failed=keep_failed), monkeypatch,
           chunk_rows)


def test_burstgpt_sample_is_read_by_pyarrow_to_the_same_requests(root, monkeypatch):
    """The shipped BurstGPT sample, with and without a model filter: the numeric reader compares
    its Model text, and both readers give the same requests and notes."""
    import sim.workload.readers as readers
    from sim.workload.sources import NumericColumns

    path = root / "traces" / "samples" / "burstgpt_schema_example.csv"
    frames = []
    real = readers.text_equals

    def recording(batch, col, value):
        frames.append(type(batch.frame))
        return real(batch, col, value)

    monkeypatch.setattr(readers, "text_equals", recording)
    for f in (None, "ChatGPT"):
        _alike(path, ReadOptions(format="burstgpt", model_filter=f), monkeypatch, 4)
    assert NumericColumns in frames


@pytest.mark.parametrize("kind", ["text", "text with offsets", "timestamp"])
def test_azure_parquet_date_times_read_alike(tmp_path, monkeypatch, kind):
    """An Azure trace as Parquet: a text TIMESTAMP column is converted by pyarrow (naive or with
    offsets); a timestamp-typed one goes to the general reader; the same seconds either way."""
    import datetime as dt

    stamps = [dt.datetime(2023, 11, 16, 18, 15, 0) + dt.timedelta(seconds=0.3 * i + 1e-6 * i) for i in range(40)]
    if kind == "timestamp":
        col = pa.array(stamps, pa.timestamp("us"))
    else:
        zone = "+00:00" if kind == "text with offsets" else ""
        col = pa.array([s.strftime("%Y-%m-%d %H:%M:%S.%f") + "0" + zone for s in stamps])
    path = tmp_path / "azure.parquet"
    pq.write_table(pa.table({"TIMESTAMP": col, "ContextTokens": list(range(5, 45)), "GeneratedTokens": [3] * 40}), path)
    outcomes = _arrow_conversions(monkeypatch)
    _alike(path, ReadOptions(format="azure"), monkeypatch, 16)
    assert outcomes == ([] if kind == "timestamp" else ["converted"] * 3)


# ---- JSON Lines: pyarrow's JSON reader against polars (and json, where polars gives up) ------

# how a number field may be written; the odd ones either reader may refuse or read otherwise
_JSON_NUMBER = st.one_of(
    st.integers(0, 10**6).map(str),
    st.floats(0, 1e6, allow_nan=False).map(repr),
    st.sampled_from(["5.0", "5e0", "5E+0", "-0", "-0.0", "0", "1e400", "-1", "2.5", "NaN", "Infinity", "-Infinity",
                     '"5"', "true", "null", "[5]", '{"v": 5}', "1" + "0" * 25, "1" + "0" * 400, "123456789012345678",
                     "1e-400", "0.1"]))
_JSON_IDS = st.one_of(
    st.lists(st.integers(0, 300), max_size=6).map(lambda v: "[" + ", ".join(map(str, v)) + "]"),
    st.sampled_from(["[]", "null", "[1, null]", "[1.0, 2]", '["a"]', "3", "[[1]]", "[" + "1" * 25 + "]"]))
_JSON_TEXT = st.sampled_from(['"s1"', '"s2"', '"caf\\u00e9"', '"\\ud83d\\ude00"', '"\\ud800"', "5", "null", "true",
                              '""'])
_JSON_INT = st.one_of(st.integers(-1, 6).map(str), st.sampled_from(["3.0", '"3"', "null", "2.5", "1" + "0" * 20]))


def _json_record(fields: dict[str, str | None], extra: bool) -> str:
    parts = [f'"{k}": {v}' for k, v in fields.items() if v is not None]
    if extra:
        parts.append('"type": "text", "nested": {"a": [1, {"b": null}]}')
    return "{" + ", ".join(parts) + "}"


# a line as written, or written oddly: the odd ones either reader may refuse
_LINE_FORM = st.sampled_from(["plain"] * 40 + ["blank after", "crlf", "two records", "repeated field",
                                                "trailing garbage", "not an object", "spaces"])


def _json_lines(records: list[str], forms: list[str], bom: bool) -> str:
    out = []
    for rec, form in zip(records, forms):
        line = {"two records": rec + " " + rec, "repeated field": rec[:-1] + ', "input_length": 7}'
                if len(rec) > 2 else rec, "trailing garbage": rec + " x", "not an object": "[1, 2]",
                "spaces": "  " + rec + " \t"}.get(form, rec)
        out.append(line + ("\r\n" if form == "crlf" else "\n") + ("\n" if form == "blank after" else ""))
    return ("\ufeff" if bom else "") + "".join(out)


def _mostly(valid, odd):
    """``valid`` 19 times in 20, else ``odd``."""
    return st.integers(0, 19).flatmap(lambda n: valid if n else odd)


def _mooncake_fields():
    ids = st.lists(st.integers(0, 300), max_size=3).map(lambda v: "[" + ", ".join(map(str, v)) + "]")
    return st.fixed_dictionaries({
        "timestamp": _mostly(st.integers(0, 10**5).map(str), _JSON_NUMBER),
        "input_length": _mostly(st.integers(1, 2000).map(str), _JSON_NUMBER),
        "output_length": _mostly(st.integers(1, 500).map(str), _JSON_NUMBER),
        "hash_ids": _mostly(st.one_of(st.none(), ids), _JSON_IDS),
        "session_id": _mostly(st.sampled_from([None, '"s1"', '"s2"']), _JSON_TEXT),
        "delay": _mostly(st.one_of(st.none(), st.integers(0, 500).map(str)), _JSON_NUMBER),
        "priority": _mostly(st.one_of(st.none(), st.integers(0, 3).map(str)), _JSON_NUMBER),
    })


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(_mooncake_fields(), st.booleans(), _LINE_FORM, _mostly(st.just(True), st.just(False))),
                     min_size=1, max_size=10),
       bom=st.booleans(), chunk_rows=st.integers(1, 8), block=st.sampled_from([None, 1, 4]))
def test_mooncake_read_alike_by_both_readers(tmp_path_factory, monkeypatch, rows, bom, chunk_rows, block):
    """Any field may be missing, null, of another JSON type, or written oddly (NaN, 1e400, a
    number as text, a repeated field, two records on a line): both readers give the same
    arrays and notes, or the same error line (or the same defect)."""
    path = tmp_path_factory.mktemp("j") / "t.jsonl"
    records = []
    for fields, extra, _form, keep_ts in rows:
        if not keep_ts:
            fields = {**fields, "timestamp": None}
        records.append(_json_record(fields, extra))
    path.write_text(_json_lines(records, [r[2] for r in rows], bom), encoding="utf-8", errors="surrogatepass")
    _alike(path, ReadOptions(format="mooncake", hash_block_size=block), monkeypatch, chunk_rows)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.integers(0, 5), st.integers(-1, 5), _JSON_INT, _JSON_INT, _JSON_IDS,
                               _JSON_NUMBER, _LINE_FORM), min_size=1, max_size=10),
       odd=st.booleans(), chunk_rows=st.integers(1, 8))
def test_bailian_read_alike_by_both_readers(tmp_path_factory, monkeypatch, rows, odd, chunk_rows):
    path = tmp_path_factory.mktemp("j") / "t.jsonl"
    records = []
    for i, (chat, parent, chat_odd, parent_odd, ids, ts, _form) in enumerate(rows):
        records.append(_json_record({
            "chat_id": chat_odd if odd else str(chat), "parent_chat_id": parent_odd if odd else str(parent),
            "timestamp": ts if odd else f"{i * 0.25}", "input_length": "40", "output_length": "7", "turn": "1",
            "hash_ids": ids if odd else "[1, 2]"}, i % 2 == 0))
    path.write_text(_json_lines(records, [r[6] if odd else "plain" for r in rows], False), encoding="utf-8")
    _alike(path, ReadOptions(format="bailian"), monkeypatch, chunk_rows)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.sampled_from([None, "null", '"s0"', '"s1"']),
                               st.sampled_from(["54.7", "null", "NaN", "3"]), st.integers(0, 300).map(str),
                               st.booleans()), min_size=1, max_size=8),
       keep_failed=st.booleans(), chunk_rows=st.integers(1, 8))
def test_aiperf_read_alike_by_both_readers(tmp_path_factory, monkeypatch, rows, keep_failed, chunk_rows):
    path = tmp_path_factory.mktemp("j") / "t.jsonl"
    lines = []
    for i, (session, ttft, out, failed) in enumerate(rows):
        md = f'"request_start_ns": {1759813207569292466 + i * 10**8}' + (f', "x_correlation_id": {session}'
                                                                         if session else "")
        metrics = (f'"input_sequence_length": {{"value": 64}}, "time_to_first_token": {{"value": {ttft}}}, '
                   f'"request_latency": {{"value": 470.5}}, "output_sequence_length": {{"value": {out}}}')
        if failed:
            metrics = '"error_isl": {"value": 64}'
        lines.append(f'{{"metadata": {{{md}}}, "metrics": {{{metrics}}}, "error": {"{}" if failed else "null"}}}')
    path.write_text("\n".join(lines) + "\n")
    _alike(path, ReadOptions(format="aiperf", keep_failed=keep_failed), monkeypatch, chunk_rows)


@pytest.mark.parametrize("unit, arrival", [("ms", ["0", "15.5", "31"]),
                                           ("datetime", ['"2023-11-16 18:15:46.6805900"', '"2023-11-16 18:15:47"',
                                                         '"2023-11-16T18:15:48.5"']),
                                           ("datetime", ['"2023-11-16 18:15:46"', '"16/11/2023"', '"x"']),
                                           ("s", ["0", "null", "2"])])
def test_generic_json_lines_read_alike(tmp_path, monkeypatch, unit, arrival):
    path = tmp_path / "g.jsonl"
    path.write_text("".join(f'{{"t": {a}, "i": {5 + k}, "o": 3}}\n' for k, a in enumerate(arrival)))
    opts = ReadOptions(format="generic", time_unit=unit, arrival_column="t", input_column="i", output_column="o")
    for chunk_rows in (1, 2, 8):
        _alike(path, opts, monkeypatch, chunk_rows)


def test_json_lines_samples_are_read_by_pyarrow_to_the_same_requests(root, monkeypatch):
    """The shipped Mooncake, Bailian and AIPerf samples are read by the numeric reader (no
    batch handed to the general one), to the general reader's arrays."""
    import sim.workload.sources as sources

    handed = []
    real = sources._parse_jsonl
    monkeypatch.setattr(sources, "_parse_jsonl", lambda *a: handed.append(1) or real(*a))
    samples = root / "traces" / "samples"
    for name, fmt in [("mooncake_synthetic_first500.jsonl", "mooncake"), ("bailian_schema_example.jsonl", "bailian"),
                      ("aiperf_schema_example.jsonl", "aiperf")]:
        for chunk_rows in (7, 1_000_000):
            opts = ReadOptions(format=fmt)
            numeric = _read(samples / name, opts, True, monkeypatch, chunk_rows)
            assert not handed, name
            _same(numeric, _read(samples / name, opts, False, monkeypatch, chunk_rows))
            handed.clear()


def test_a_bad_json_lines_value_is_named_by_the_general_reader(tmp_path, monkeypatch):
    """Batches of 2 lines: the numeric reader delivers lines 1-4 and gives up on the batch of
    line 6 (a missing output length); the general reader goes on from line 5 and names line 6."""
    p = tmp_path / "t.jsonl"
    p.write_text("".join(f'{{"timestamp": {i}, "input_length": 10, "output_length": 3}}\n' for i in range(5))
                 + '{"timestamp": 5, "input_length": 10}\n')
    opts = ReadOptions(format="mooncake")
    chunks = raw_chunks(p, opts, chunk_rows=2)
    assert [len(next(chunks)), len(next(chunks))] == [2, 2]
    with pytest.raises(UserError, match=r"line 6: column output_length is missing"):
        next(chunks)


@pytest.mark.parametrize("text, message", [
    ('{"timestamp": 1' + "0" * 400 + ', "input_length": 5, "output_length": 3}',
     "line 1: timestamp is 1000.*, a number too large for a double"),
    ('{"timestamp": 1, "input_length": 5, "output_length": 3, "hash_ids": ' + "[" * 100_000 + "]" * 100_000 + "}",
     "line 1: JSON nested too deeply to read"),
    ('{"timestamp": 1, "input_length": 5, "output_length": 3, "x": 1' + "0" * 4400 + "}",
     "line 1: JSON with an integer of over 4,300 digits"),
])
def test_json_values_python_cannot_hold_are_one_error_line(tmp_path, text, message):
    """An integer beyond a double or of more digits than Python converts, or nesting deeper
    than Python's parser recurses, in a line the general reader parses with ``json``: one
    error line, not a traceback (also where format detection reads line 1)."""
    p = tmp_path / "t.jsonl"
    p.write_text(text + "\n")
    for fmt in ("mooncake", "auto"):
        with pytest.raises(UserError, match=message):
            read_trace(p, fmt)


@pytest.mark.parametrize("text, message", [
    ('{"start_times": [1' + "0" * 5000 + "]}", "JSON with an integer of over 4,300 digits"),
    ('{"start_times": ' + "[" * 100_000 + "]" * 100_000 + "}", "JSON nested too deeply to read"),
])
def test_vllm_bench_json_python_cannot_hold_is_one_error_line(tmp_path, text, message):
    p = tmp_path / "bench.json"
    p.write_text(text)
    with pytest.raises(UserError, match=message):
        read_trace(p, "vllm_bench")


def _lines_one_by_one(path, chunk_rows):
    """The line splitter as it was: a Python loop over the file's lines."""
    buf, nos = [], []
    with open(path, "rb") as f:
        for no, raw in enumerate(f, start=1):
            if raw.strip():
                buf.append(raw if raw.endswith(b"\n") else raw + b"\n")
                nos.append(no)
                if len(buf) >= chunk_rows:
                    yield b"".join(buf), nos
                    buf, nos = [], []
    if buf:
        yield b"".join(buf), nos


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.sampled_from(['{"a": 1}', "", " ", "\t \x0c", '  {"b": [1, 2]}', '{"c": "x y"}\r', "\r",
                                       "\x0b", '{"d": "\xe9"}', "x" * 40]), min_size=1, max_size=30),
       last_newline=st.booleans(), chunk_rows=st.integers(1, 9), read_bytes=st.integers(1, 64))
def test_json_lines_split_with_numpy_as_one_by_one(tmp_path_factory, monkeypatch, lines, last_newline, chunk_rows,
                                                   read_bytes):
    """Blank lines (only spaces, tabs, CR, FF, VT) carry no record and keep the numbering; a last
    line without a newline gets one; lines cut by a read or a batch boundary are whole."""
    import sim.workload.sources as sources

    path = tmp_path_factory.mktemp("l") / "t.jsonl"
    path.write_bytes(("\n".join(lines) + ("\n" if last_newline else "")).encode())
    monkeypatch.setattr(sources, "READ_BYTES", read_bytes)
    got = [(data, nos.tolist()) for data, nos in sources._jsonl_lines(path, chunk_rows)]
    assert got == list(_lines_one_by_one(path, chunk_rows))


_MOONCAKE_ROW = '{"timestamp": 7, "input_length": 5, "output_length": 3'


@pytest.mark.parametrize("text, fmt", [
    (_MOONCAKE_ROW + "}\nnull\n", "mooncake"),  # pyarrow 26 crashed on a block starting with null
    ("null\n" + _MOONCAKE_ROW + "}\n", "mooncake"),
    (_MOONCAKE_ROW + ', "x": Inf}\n', "mooncake"),  # pyarrow reads Inf, json refuses it
    (_MOONCAKE_ROW + ', "x": -Inf}\n', "mooncake"),
    (_MOONCAKE_ROW + ', "x": NaN}\n', "mooncake"),
    (_MOONCAKE_ROW + ', "x": ' + "[" * 1100 + "]" * 1100 + "}\n", "mooncake"),  # json cannot recurse so deep
    (_MOONCAKE_ROW + ', "x": ' + "[" * 300 + "]" * 300 + "}\n", "mooncake"),
    ('{"timestamp": -0, "input_length": 5, "output_length": 3}\n' + _MOONCAKE_ROW + "}\n", "mooncake"),
    ('{"timestamp": 1, "input_length": 5, "output_length": 3, "hash_ids": [1, null]}\n'
     '{"timestamp": 2, "input_length": 5, "output_length": 3, "hash_ids": [2, 3]}\n', "mooncake"),
    ('{"timestamp": 1, "input_length": 5, "output_length": 3, "hash_ids": [null]}\n', "mooncake"),
    ('  ' + _MOONCAKE_ROW + "}\n", "mooncake"),  # an indented line: the general reader's
    # a record across two lines, and two on the second: pyarrow reads two rows, json neither line
    (_MOONCAKE_ROW + ', "x":\n{}}' + _MOONCAKE_ROW + "}\n", "mooncake"),
    (_MOONCAKE_ROW + "} \t\r\n" + _MOONCAKE_ROW + "}\n", "mooncake"),  # spaces after a record
    (_MOONCAKE_ROW + ', "x": -NaN}\n', "mooncake"),  # pyarrow reads -NaN, json refuses it
    (_MOONCAKE_ROW + "}\n" + _MOONCAKE_ROW + ', "x": 1' + "0" * 4300 + "}\n", "mooncake"),  # json: over 4,300 digits
    (_MOONCAKE_ROW + ', "x": 1' + "0" * 4299 + "}\n", "mooncake"),
])
def test_json_lines_the_numeric_reader_leaves_to_the_general_one(tmp_path, monkeypatch, text, fmt):
    """Lines pyarrow reads otherwise than polars (or ``json``, where polars gives up) does, or
    crashed on: both readers give the same arrays or the same error line."""
    p = tmp_path / "t.jsonl"
    p.write_text(text)
    for chunk_rows in (1, 8):
        _alike(p, ReadOptions(format=fmt, hash_block_size=1), monkeypatch, chunk_rows)


@pytest.mark.parametrize("rows, columns", [
    (['{"t": "2023-11-16 18:15:46", "i": 5, "o": 3}', '{"i": 5, "o": 3}'], ("t", "i", "o")),
    (['{"t": "2023-11-16 18:15:46", "i": 5, "o": 3}', '{"t": null, "i": 5, "o": 3}'], ("t", "i", "o")),
    (['{"t": 5, "o": 3}'], ("t", "t", "o")),  # the arrival and the input the same field
])
def test_generic_json_lines_date_times_missing_or_numbers(tmp_path, monkeypatch, rows, columns):
    p = tmp_path / "g.jsonl"
    p.write_text("\n".join(rows) + "\n")
    opts = ReadOptions(format="generic", time_unit="datetime", arrival_column=columns[0], input_column=columns[1],
                       output_column=columns[2])
    for chunk_rows in (1, 8):
        _alike(p, opts, monkeypatch, chunk_rows)


def test_a_large_json_lines_trace_is_the_general_readers(root, monkeypatch):
    """Over ``JSONL_NUMERIC_MAX_BYTES`` polars' faster parse pays for its import: the general
    reader reads the file from its first line, to the same arrays."""
    import sim.workload.sources as sources

    path = root / "traces" / "samples" / "mooncake_synthetic_first500.jsonl"
    opts = ReadOptions(format="mooncake")
    small = _read(path, opts, True, monkeypatch)
    handed = []
    real = sources._parse_jsonl
    monkeypatch.setattr(sources, "_parse_jsonl", lambda *a: handed.append(1) or real(*a))
    monkeypatch.setattr(trace, "JSONL_NUMERIC_MAX_BYTES", path.stat().st_size - 1)
    _same(_read(path, opts, True, monkeypatch), small)
    assert handed


@pytest.mark.parametrize("numeric", [True, False])
def test_a_repeated_json_field_reads_the_same_by_polars_and_by_json(tmp_path, monkeypatch, numeric):
    """A field written twice in one record: its first value, whichever parser reads the line
    (polars keeps the first; ``json``, which keeps the last, is given a hook that keeps the
    first). A byte-order mark makes the general reader parse with ``json``."""
    lines = ['{"timestamp": 0, "input_length": 100, "output_length": 10, "input_length": 7}',
             '{"timestamp": 5, "input_length": 200, "output_length": 20, "output_length": 3, "output_length": 4}']
    plain, marked = tmp_path / "plain.jsonl", tmp_path / "bom.jsonl"
    plain.write_text("\n".join(lines) + "\n")
    marked.write_text("\ufeff" + "\n".join(lines) + "\n", encoding="utf-8")
    opts = ReadOptions(format="mooncake")
    a, b = (_read(p, opts, numeric, monkeypatch) for p in (plain, marked))
    _same(a, b)
    assert a[0].input_tokens.tolist() == [100, 200] and a[0].output_tokens.tolist() == [10, 20]
