"""EvaluationResult: access types, to_dict/to_json/from_dict/from_json round trips, repr."""

from __future__ import annotations

import datetime
import json
import math
import warnings

import numpy as np
import pytest

import embedeval as ee

X = np.array([[0.0], [1.0], [3.0], [6.0], [6.5]])
METRICS = ["precision_at_1", "map_at_r", "map", "mrr", "recall_at_2"]


def _objects(values):
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def ev(labels, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ee.evaluate(X, labels, metrics=METRICS, progress=False, **kw)


def _strict_loads(text):
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def _same(a, b):
    assert a.metrics.keys() == b.metrics.keys()
    for m in a.metrics:
        assert (math.isnan(a[m]) and math.isnan(b[m])) or a[m] == b[m]
        np.testing.assert_array_equal(a.per_query[m], b.per_query[m])  # NaN == NaN here
        assert a.per_class[m] == b.per_class[m]
        assert [type(c) for c in a.per_class[m]] == [type(c) for c in b.per_class[m]]
    assert a.n_queries == b.n_queries and a.n_lone == b.n_lone and a.n_ties == b.n_ties
    assert list(a.query_labels) == list(b.query_labels)
    assert a.query_labels.dtype == b.query_labels.dtype
    assert a.settings == b.settings


# labels: a lone class (NaN per_query), huge ints differing by 1, negative ints, strings
@pytest.mark.parametrize(
    "labels",
    [
        ["a", "a", "b", "c", "c"],
        [2**24, 2**24, 2**24 + 1, 7, 7],
        np.array([2**53, 2**53, -1, 3, 3], dtype=np.int64),
        np.array(["é", "é", "x", "y", "y"]),
        np.array([2**63 + 1, 2**63 + 1, 2**63, 5, 5], dtype=np.uint64),  # beyond float64
        _objects([2**63 + 1, 2**63 + 1, 2**63, -5, -5]),  # beyond int64 and uint64 together
        np.array([b"\xff", b"\xff", b"a", b"b", b"b"]),  # h5py's strings: bytes
        np.array(
            ["2020-01-01", "2020-01-01", "2021-05-05", "1999-12-31", "1999-12-31"],
            dtype="datetime64[D]",
        ),
        _objects([(1, 2), (1, 2), (3,), ("a", (b"z",)), ("a", (b"z",))]),  # ragged tuples
        _objects([(1, 2), (1, 2), (3, 4), (5, 6), (5, 6)]),  # tuples of one length
        np.array([1, 1, 2, 3, 3], dtype="datetime64[ns]"),  # item() of these is an int
        np.array([1, 1, 2, 3, 3], dtype="timedelta64[s]"),
        _objects(
            [datetime.datetime(2020, 1, 1, 0, 0, 0, 7)] * 2
            + [datetime.date(2021, 5, 5)]
            + [datetime.timedelta(days=1, microseconds=3)] * 2
        ),
        _objects([np.datetime64(1, "ns")] * 2 + [np.timedelta64(2, "ms")] + [b"x"] * 2),
    ],
)
def test_round_trip_dict_and_json(labels, tmp_path):
    res = ev(labels, ci=0.9, n_boot=50, confidences=[0.1, 0.9, 0.5, 0.3, 0.7])
    assert res.n_lone == 1 and np.isnan(res.per_query["map"][2])
    d = res.to_dict()
    back = ee.EvaluationResult.from_dict(d)
    _same(res, back)
    text = res.to_json()
    _strict_loads(text)  # NaN must not leak out as a bare NaN token
    _same(res, ee.EvaluationResult.from_json(text))
    path = tmp_path / "res.json"
    res.to_json(path)
    _same(res, ee.EvaluationResult.from_json(path))
    _same(res, ee.EvaluationResult.from_json(str(path)))
    assert back.ci.keys() == res.ci.keys()
    for m, (lo, hi) in res.ci.items():
        assert tuple(back.ci[m]) == pytest.approx((lo, hi), nan_ok=True)
    assert back.confidence.keys() == res.confidence.keys()
    # the JSON is plain: a stranger can read the per-query values with the json module
    plain = _strict_loads(path.read_text())
    assert plain["per_query"]["map"][2] is None
    assert plain["metrics"]["map"] == pytest.approx(res["map"])


def test_a_reloaded_result_compares_with_the_original():
    res = ev(_objects([(1, 2), (1, 2), (3,), (4,), (4,)]))
    back = ee.EvaluationResult.from_json(res.to_json())
    rows = ee.compare({"a": res, "b": back}, n_boot=20).rows
    assert [r["diff"] for r in rows if r["checkpoint"] == "b"] == [0.0] * len(METRICS)


def test_labels_json_cannot_hold_are_refused_by_name():
    res = ev(_objects([frozenset({1}), frozenset({1}), 2, 3, 3]))
    with pytest.raises(ee.InputError, match=r"frozenset\(\{1\}\) \(type frozenset\)"):
        res.to_json()
    utc = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
    res = ev(_objects([utc, utc, 2, 3, 3]))  # read back, the time zone would be lost
    with pytest.raises(ee.InputError, match="type datetime"):
        res.to_json()


@pytest.mark.parametrize(
    "label", [{"bytes": 5}, {"tuple": 3}, {"date": "soon"}, {"nope": 1}, {"a": 1, "b": 2}]
)
def test_a_malformed_label_object_is_an_input_error(label):
    d = ev(["a", "a", "b", "c", "c"]).to_dict()
    d["query_labels"][0] = label
    d.pop("query_labels_dtype")
    with pytest.raises(ee.InputError, match="wrong type"):
        ee.EvaluationResult.from_dict(d)


def test_missing_dates_are_refused_like_missing_labels():
    labels = np.array(["2020-01-01", "NaT", "2020-01-02", "NaT", "2020-01-02"], "datetime64[D]")
    with pytest.raises(ee.InputError, match=r"2 missing label\(s\) \(NaT\), first at index 1"):
        ev(labels)


def test_older_files_with_tuples_as_lists_read_them_as_tuples():
    d = ev(_objects([(1, 2), (1, 2), (3,), (4,), (4,)])).to_dict()
    d.pop("query_labels_dtype", None)
    d["query_labels"] = [[1, 2], [1, 2], [3], [4], [4]]
    d["per_class"] = {m: [[[4], v]] for m, v in [("map", 1.0)]}
    back = ee.EvaluationResult.from_dict(d)
    assert back.query_labels.tolist() == [(1, 2), (1, 2), (3,), (4,), (4,)]
    assert back.per_class == {"map": {(4,): 1.0}}


def test_per_class_keys_are_the_callers_labels_as_python_scalars():
    res = ev(np.array([5, 5, 9, 2**24 + 1, 2**24 + 1], dtype=np.int64))
    assert set(res.per_class["map"]) == {5, 2**24 + 1}
    assert all(type(c) is int for c in res.per_class["map"])
    res = ev(np.array(["u", "u", "v", "w", "w"]))
    assert all(type(c) is str for c in res.per_class["map"])


def test_item_access_gives_python_floats_and_per_query_float64():
    res = ev(["a", "a", "b", "c", "c"])
    for m in METRICS:
        assert type(res[m]) is float
        assert type(res.metrics[m]) is float
        assert res.per_query[m].dtype == np.float64 and res.per_query[m].shape == (5,)
    assert type(res.n_queries) is int and type(res.n_lone) is int
    # 0,1 -> each other (hit); 3 lone; 6, 6.5 -> each other
    assert res["map"] == 1.0
    with pytest.raises(KeyError):
        res["not_a_metric"]


def test_repr_is_a_readable_table():
    res = ev(["a", "a", "b", "c", "c"])
    text = repr(res)
    lines = text.splitlines()
    assert len(lines) >= len(METRICS) + 1
    for m in METRICS:
        row = next(line for line in lines if line.split() and line.split()[0] == m)
        assert f"{res[m]:.4f}" in row
    assert "5 queries" in text and "1 lone" in text


def test_from_dict_rejects_something_that_is_not_a_result():
    for bad in ({"hello": 1}, {"format": "other/9", "metrics": {}}):
        with pytest.raises(ee.InputError, match="not an embedeval result"):
            ee.EvaluationResult.from_dict(bad)
    with pytest.raises(ee.InputError, match="not an embedeval result"):
        ee.EvaluationResult.from_json('{"hello": 1}')
    with pytest.raises(FileNotFoundError):
        ee.EvaluationResult.from_json("no/such/result.json")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"format": ', r"source is not valid JSON \(Expecting value at line 1 column 12"),
        ("{", r"source is not valid JSON .*truncated or edited"),
        ('{"format": "embedeval.EvaluationResult/1", "metrics": {}', r"not valid JSON"),
    ],
)
def test_truncated_json_text_raises_input_error(text, match):
    with pytest.raises(ee.InputError, match=match):
        ee.EvaluationResult.from_json(text)


def test_truncated_json_file_raises_input_error_naming_the_file(tmp_path):
    full = ev(["a", "a", "b", "c", "c"]).to_json()
    path = tmp_path / "cut.json"
    path.write_text(full[: len(full) // 2])
    for source in (path, str(path)):
        with pytest.raises(ee.InputError, match=r"source file '.*cut\.json' is not valid JSON"):
            ee.EvaluationResult.from_json(source)


def _good_dict():
    return ev(["a", "a", "b", "c", "c"]).to_dict()


def test_incomplete_result_dict_lists_the_missing_keys():
    with pytest.raises(ee.InputError, match="data is an incomplete") as info:
        ee.EvaluationResult.from_dict({"format": "embedeval.EvaluationResult/1"})
    message = str(info.value)
    for key in (
        "metrics",
        "per_query",
        "per_class",
        "query_labels",
        "n_queries",
        "n_lone",
        "n_ties",
        "settings",
    ):
        assert key in message
    d = _good_dict()
    del d["n_ties"], d["query_labels"]
    with pytest.raises(ee.InputError, match=r"missing key\(s\) query_labels, n_ties\. Pass"):
        ee.EvaluationResult.from_dict(d)


@pytest.mark.parametrize("bad", [[1, 2], "a string", None, 3.5])
def test_result_that_is_not_a_dict(bad):
    with pytest.raises(ee.InputError, match=f"expected a dict, got {type(bad).__name__}"):
        ee.EvaluationResult.from_dict(bad)


def test_json_file_holding_a_list_is_not_a_result(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(ee.InputError, match="expected a dict, got list"):
        ee.EvaluationResult.from_json(path)


def test_wrong_format_string_is_echoed():
    d = _good_dict()
    d["format"] = "embedeval.EvaluationResult/2"
    with pytest.raises(ee.InputError, match=r"'format' is 'embedeval\.EvaluationResult/2'"):
        ee.EvaluationResult.from_dict(d)


def test_per_query_not_aligned_with_query_labels():
    d = _good_dict()
    d["per_query"]["map"] = d["per_query"]["map"][:-1]  # 4 values, 5 labels
    with pytest.raises(
        ee.InputError, match=r"data\['per_query'\]\['map'\].*\(5 labels\); got 4 values"
    ):
        ee.EvaluationResult.from_dict(d)
    d = _good_dict()
    d["per_query"]["mrr"] = 0.5
    with pytest.raises(ee.InputError, match=r"\['mrr'\].*got float"):
        ee.EvaluationResult.from_dict(d)


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("metrics", [0.5], r"data\['metrics'\] must be a dict \(JSON object\); got list"),
        ("n_queries", "5", r"data\['n_queries'\] must be an integer; got str \('5'\)"),
        ("n_lone", True, r"data\['n_lone'\] must be an integer; got bool"),
        (
            "query_labels",
            "aabcc",
            r"data\['query_labels'\] must be a list \(JSON array\); got str",
        ),
        ("ci", None, r"data\['ci'\] must be a dict \(JSON object\); got NoneType"),
    ],
)
def test_result_values_of_the_wrong_type(key, value, match):
    d = _good_dict()
    d[key] = value
    with pytest.raises(ee.InputError, match=match):
        ee.EvaluationResult.from_dict(d)


def test_wrong_values_deeper_down_raise_input_error():
    d = _good_dict()
    d["metrics"]["map"] = "high"
    with pytest.raises(ee.InputError, match="value has the wrong type"):
        ee.EvaluationResult.from_dict(d)
    d = _good_dict()
    d["per_class"]["map"] = [["a"]]  # a row without its value
    with pytest.raises(ee.InputError, match="value has the wrong type"):
        ee.EvaluationResult.from_dict(d)


def test_table_header_names_the_ci_level():
    x = np.array([[0.0], [1.0], [2.0], [10.0], [11.0], [12.0]])
    y = [0, 0, 0, 1, 1, 1]
    for level, header in ((0.9, "90% CI"), (0.975, "97.5% CI")):
        table = ee.evaluate(x, y, metrics=["map_at_r"], ci=level, n_boot=20).table()
        assert header in table.splitlines()[0], table


# The result object's round trip.


def test_result_round_trip_and_repr(tmp_path):
    x = [[0.0], [1.0], [2.0], [10.0], [11.0], [30.0]]
    y = ["a", "b", "a", "b", "b", "c"]
    res = ee.evaluate(x, y, metrics=["precision_at_1", "map_at_r"], ci=0.9, n_boot=50)
    path = tmp_path / "r.json"
    text = res.to_json(path)
    back = ee.EvaluationResult.from_json(path)
    assert back.metrics == res.metrics
    assert back.n_lone == 1 and back.n_queries == 6
    assert math.isnan(back.per_query["map_at_r"][5])
    np.testing.assert_array_equal(back.per_query["map_at_r"][:5], res.per_query["map_at_r"][:5])
    assert back.per_class == res.per_class
    assert back.query_labels.tolist() == y
    assert ee.EvaluationResult.from_json(text).metrics == res.metrics
    assert isinstance(res["map_at_r"], float)
    assert res["mean_average_precision_at_r"] == res["map_at_r"]
    table = repr(res)
    assert "map_at_r" in table and "6 queries" in table and "1 lone" in table
    with pytest.raises(KeyError, match="not computed"):
        res["mrr"]
    with pytest.raises(ee.InputError, match="not an embedeval result"):
        ee.EvaluationResult.from_dict({"metrics": {}})


def test_result_round_trip_with_int_labels():
    res = ee.evaluate([[0.0], [0.1], [5.0], [5.1]], np.array([2**40, 2**40, 7, 7]))
    back = ee.EvaluationResult.from_dict(res.to_dict())
    assert set(back.per_class["precision_at_1"]) == {2**40, 7}
    assert back.query_labels.dtype.kind == "i"


def test_per_class_keys_of_nanosecond_dates_are_dates():
    # tolist() of datetime64[ns] gives plain ints, which tables and figures showed as numbers
    res = ev(np.array([1, 1, 2, 3, 3], dtype="datetime64[ns]"))
    keys = list(res.per_class["map"])
    assert keys == [np.datetime64(1, "ns"), np.datetime64(3, "ns")]
    assert all(isinstance(k, np.datetime64) for k in keys)


def test_from_json_of_a_binary_file_is_an_input_error_naming_it(tmp_path):
    path = tmp_path / "embeddings.npz"  # passed by mistake: a zip, not UTF-8 text
    np.savez(path, embeddings=np.eye(2))
    with pytest.raises(ee.InputError, match=r"source file '.*embeddings.npz' is not UTF-8 text"):
        ee.EvaluationResult.from_json(path)
