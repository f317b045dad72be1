"""Bad input for evaluate and neighbors: each case raises InputError/InputTypeError with a
message that names the argument and echoes what was wrong (query side, reference side, groups,
labels, search options, neighbors)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import embedeval as ee
from tests import oracle

X = np.arange(12, dtype=np.float64).reshape(6, 2)
Y = [0, 0, 1, 1, 2, 2]
R = np.arange(100, 120, dtype=np.float64).reshape(10, 2)
RL = [0, 1] * 5


def _nan_rows(a, rows, value=np.nan):
    a = a.copy()
    a[list(rows), 0] = value
    return a


EVALUATE_CASES = [
    (
        {"reference": _nan_rows(R, [7, 8, 9])},
        ee.InputError,
        r"reference has NaN or infinite values in 3 row\(s\), first at row 7",
    ),
    (
        {"reference": _nan_rows(R, [3], -np.inf)},
        ee.InputError,
        r"reference has NaN or infinite values in 1 row\(s\), first at row 3",
    ),
    (
        {"query": _nan_rows(X, [4, 5], np.inf)},
        ee.InputError,
        r"query has NaN or infinite values in 2 row\(s\), first at row 4",
    ),
    (
        {"query": _nan_rows(X, [2, 5], 1e200)},  # finite float64, infinite as float32
        ee.InputError,
        r"query has values beyond float32's range \(about 3.4e\+38\) in 2 row\(s\), first at "
        r"row 2, which would become infinite; rescale it first, e.g. query / 2\*\*k",
    ),
    ({"reference": np.arange(10.0)}, ee.InputError, r"reference must be 2-D.*\(10,\)"),
    ({"reference": np.zeros((10, 2, 1))}, ee.InputError, r"reference must be 2-D.*\(10, 2, 1\)"),
    ({"reference": np.zeros((0, 2)), "reference_labels": []}, ee.InputError, r"reference is empty"),
    ({"reference": R.astype(object)}, ee.InputTypeError, "reference is an object array"),
    ({"reference": np.zeros((10, 3))}, ee.InputError, "query has dimension 2 but reference has 3"),
    (
        {"query": X.astype(complex), "reference": None, "reference_labels": None},
        ee.InputTypeError,
        "query must be numeric",
    ),
    (
        {"reference_labels": RL[:3]},
        ee.InputError,
        "reference_labels has 3 labels but there are 10 rows of reference",
    ),
    ({"reference_labels": None}, ee.InputError, "reference_labels is required"),
    (
        {"ref_includes_query": True},
        ee.InputError,
        r"ref_includes_query=True.*first rows of reference",
    ),
    (
        {"reference": X[:3], "reference_labels": Y[:3], "ref_includes_query": True},
        ee.InputError,
        "ref_includes_query=True needs the 6 queries.*only 3 rows",
    ),
    # same labels, different vectors: identity is checked on the vectors too
    (
        {
            "reference": np.vstack([X + 1e-3, R]),
            "reference_labels": Y + RL,
            "ref_includes_query": True,
        },
        ee.InputError,
        "query row 0 differs from reference row 0",
    ),
    ({"query_groups": [1] * 6}, ee.InputError, "query_groups and reference_groups go together"),
    (
        {"query_groups": [1] * 6, "reference_groups": [1] * 3},
        ee.InputError,
        "reference_groups has 3 labels but there are 10 rows",
    ),
    (
        {"query_labels": [0, 0, np.nan, 1, 1, 2]},
        ee.InputError,
        r"query_labels has 1 NaN or infinite label\(s\), first at index 2",
    ),
    (
        {"query_labels": [0, None, 1, None, 1, 2]},
        ee.InputError,
        r"query_labels has 2 missing label\(s\) \(None or NaN\), first at index 1 \(None\)",
    ),
    (
        {"reference_labels": ["a", "b", "a", "b", "a", "b", "a", None, "a", "b"]},
        ee.InputError,
        r"reference_labels has 1 missing label\(s\) .*first at index 7",
    ),
    (  # pandas stores a missing string label as a float NaN in an object column
        {"query_labels": np.array(["a", "a", "b", np.nan, "c", "c"], dtype=object)},
        ee.InputError,
        r"query_labels has 1 missing label\(s\) \(None or NaN\), first at index 3 \(nan\)",
    ),
    (
        {"query_groups": [1, 1, None, 2, 2, 2], "reference_groups": [1] * 10},
        ee.InputError,
        r"query_groups has 1 missing label\(s\).*first at index 2",
    ),
    (
        {"reference": None, "reference_labels": None, "ref_includes_query": True},
        ee.InputError,
        r"ref_includes_query=True was given with reference=None, which already means "
        r"leave-one-out",
    ),
    (
        {"confidences": [1, 2, 3, np.inf, 5, 6]},
        ee.InputError,
        r"confidences has 1 NaN or infinite value\(s\), first at index 3",
    ),
    ({"confidences": ["a"] * 6}, ee.InputTypeError, "confidences must be numeric"),
    ({"k": -3}, ee.InputError, "k must be >= 1; got -3"),
    ({"k": "10"}, ee.InputError, "k='10' is not valid"),
    ({"k": np.float64(1.5)}, ee.InputError, "k must be an integer"),
    ({"metrics": ["mrrr"]}, ee.InputError, "unknown metric 'mrrr'. Did you mean 'mrr'"),
    ({"metrics": ["precision_at_x"]}, ee.InputError, "unknown metric 'precision_at_x'"),
    ({"metrics": ["recall_at_5\n"]}, ee.InputError, r"unknown metric 'recall_at_5\\n'"),
    ({"metrics": [f"recall_at_{2**63 - 1}"]}, ee.InputError, r"k may be at most 2\*\*62"),
    ({"metrics": [f"map_at_{2**64}"]}, ee.InputError, r"k may be at most 2\*\*62"),
    ({"metrics": ["precision_at_5"], "k": 2}, ee.InputError, "precision_at_5 need"),
    ({"distance": None}, ee.InputError, "distance=None is not valid"),
    ({"distance": "l2"}, ee.InputError, "distance='l2' is not valid"),
    ({"average": "Macro"}, ee.InputError, "average='Macro' is not valid.*Did you mean 'macro'"),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), EVALUATE_CASES)
def test_evaluate_bad_input(kwargs, error, match):
    args = {
        "query": X,
        "query_labels": Y,
        "reference": R,
        "reference_labels": RL,
        "progress": False,
        **kwargs,
    }
    with pytest.raises(error, match=match):
        ee.evaluate(**args)


def test_errors_are_value_and_type_errors():
    with pytest.raises(ValueError):
        ee.evaluate(X, Y, k=0)
    with pytest.raises(TypeError):
        ee.evaluate(X.astype(object), Y)


def test_zero_vector_with_cosine_names_the_row():
    q = np.vstack([X, np.zeros((1, 2))])
    with pytest.raises(ee.InputError, match=r"cosine.*1 row\(s\) of query are all zero.*row 6"):
        ee.evaluate(q, [*Y, 0], distance="cosine", progress=False)


NEIGHBORS_CASES = [
    ({"k": 0}, ee.InputError, "k must be >= 1; got 0"),
    ({"k": True}, ee.InputError, "k must be an integer; got True"),
    ({"k": 2.5}, ee.InputError, "k must be an integer; got 2.5"),
    ({"k": None}, ee.InputError, "k must be an integer; got None"),
    (
        {"query": _nan_rows(X, [5])},
        ee.InputError,
        r"query has NaN or infinite values in 1 row\(s\), first at row 5",
    ),
    (
        {"reference": np.full((3, 2), np.nan)},
        ee.InputError,
        r"reference has NaN or infinite values in 3 row\(s\), first at row 0",
    ),
    ({"reference": np.zeros((4, 3))}, ee.InputError, "query has dimension 2 but reference has 3"),
    ({"distance": "l2"}, ee.InputError, "distance='l2' is not valid"),
    ({"query": np.arange(5.0)}, ee.InputError, r"query must be 2-D.*\(5,\)"),
    ({"query": np.zeros((2, 2, 2))}, ee.InputError, r"query must be 2-D.*\(2, 2, 2\)"),
    ({"query": np.zeros((0, 2))}, ee.InputError, "query is empty"),
    ({"reference": np.zeros((0, 2))}, ee.InputError, "reference is empty"),
    ({"query": X.astype(object)}, ee.InputTypeError, "query is an object array"),
    ({"query": [["a", "b"]]}, ee.InputTypeError, "query must be numeric"),
    ({"reference": X[:2], "exclude_self": True}, ee.InputError, "first rows of reference"),
    ({"reference": X + 1, "exclude_self": True}, ee.InputError, "first rows of reference"),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), NEIGHBORS_CASES)
def test_neighbors_bad_input(kwargs, error, match):
    args = {"query": X, "k": 2, "progress": False, **kwargs}
    with pytest.raises(error, match=match):
        ee.neighbors(**args)


@pytest.mark.parametrize(
    ("reference", "what"),
    [(X + 1, r"query row 0 differs from reference row 0"), (X[:2], r"only 2 rows")],
)
def test_neighbors_exclude_self_message_names_its_own_argument(reference, what):
    with pytest.raises(ee.InputError, match=r"exclude_self=True needs") as info:
        ee.neighbors(X, 2, reference, exclude_self=True, progress=False)
    message = str(info.value)
    assert re.search(what, message)
    assert "ref_includes_query" not in message  # evaluate's argument, not neighbors'
    assert "exclude_self=False" in message and "reference=None" in message  # the fixes


def test_evaluate_queries_not_leading_reference_names_ref_includes_query():
    with pytest.raises(ee.InputError, match=r"ref_includes_query=True needs") as info:
        ee.evaluate(X, Y, X + 1, Y, ref_includes_query=True, progress=False)
    message = str(info.value)
    assert "query row 0 differs from reference row 0" in message
    assert "exclude_self" not in message
    assert "ref_includes_query=False" in message and "reference=None" in message


# ---- options that the chosen search path would ignore, bad flags, unhashable labels


@pytest.mark.parametrize(
    "kw, pattern",
    [
        ({"client": object()}, r"client= is only used with backend='dask'"),
        ({"index_params": {"nprobe": 4}}, r"index_params was given without index"),
        ({"exact_sample": 100}, r"exact_sample was given without index"),
    ],
)
def test_options_of_another_search_path_are_refused(kw, pattern):
    with pytest.raises(ee.InputError, match=pattern):
        ee.evaluate(X, Y, **kw)


def test_tuples_of_several_lengths_in_a_list_are_one_label_each():
    # points 0, 1, 5, 6: labels (1, 2), (3,), (1, 2), (3,); each nearest neighbour is of the
    # other label (P@1 = 0); its own lies second for the outer points, third for the inner
    # ones: AP 1/2, 1/3, 1/3, 1/2, by hand
    x = np.array([[0.0], [1.0], [5.0], [6.0]])
    res = ee.evaluate(x, [(1, 2), (3,), (1, 2), (3,)], metrics=["precision_at_1", "map"])
    assert res.query_labels.tolist() == [(1, 2), (3,), (1, 2), (3,)]
    assert res.per_query["precision_at_1"].tolist() == [0.0] * 4
    assert res.per_query["map"].tolist() == pytest.approx([1 / 2, 1 / 3, 1 / 3, 1 / 2], abs=1e-15)
    with pytest.raises(ee.InputTypeError, match="index 0 is \\[1.0, 0.5\\] of type list"):
        ee.evaluate(x, [[1.0, 0.5], [1], [2], [3]])


def test_an_unhashable_label_after_the_first_names_the_argument_and_the_index():
    labels = np.empty(6, dtype=object)
    labels[:] = [1, 1, [2], 2, 3, 3]
    with pytest.raises(ee.InputTypeError, match=r"query_labels .*index 2 is \[2\]"):
        ee.evaluate(X, labels)
    with pytest.raises(ee.InputTypeError, match=r"reference_labels .*index 2"):
        ee.evaluate(X, Y, X, labels)


@pytest.mark.parametrize("flag", ["no", 0, 1, 1.0])
def test_neighbors_exclude_self_must_be_a_bool(flag):
    with pytest.raises(ee.InputTypeError, match=r"exclude_self must be True, False or None"):
        ee.neighbors(X, 1, exclude_self=flag)


@pytest.mark.parametrize("k", [2**63, 2**64 + 5])
def test_a_k_beyond_int64_is_an_input_error(k):
    with pytest.raises(ee.InputError, match=r"k must be <= 9223372036854775807"):
        ee.evaluate(X, Y, k=k, metrics=["map"])
    with pytest.raises(ee.InputError, match=r"k must be <= 9223372036854775807"):
        ee.neighbors(X, k)


def test_a_rejection_fraction_that_leaves_nothing_names_rejection_fractions():
    # Two items: 0.75 rejects ceil(0.75 * 2) = 2 of them, nothing is left to evaluate.
    with pytest.raises(ee.InputError, match=r"rejection_fractions holds 0.75"):
        ee.evaluate(X[:2], [0, 0], confidences=[0.5, 0.6], reject_from="both",
                    rejection_fractions=[0.0, 0.75])  # fmt: skip


# Query-side cases: each bad input of evaluate and neighbors gets a clear, named error.


X32 = np.arange(12, dtype=np.float32).reshape(6, 2)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"query": np.where(np.arange(12).reshape(6, 2) == 5, np.nan, X32)},
            ee.InputError,
            r"query has NaN or infinite values in 1 row\(s\), first at row 2",
        ),
        ({"query": np.full((6, 2), np.inf)}, ee.InputError, "6 row"),
        ({"query_labels": [0, 1]}, ee.InputError, "query_labels has 2 labels but there are 6"),
        ({"query": np.arange(6.0)}, ee.InputError, r"2-D .*reshape"),
        ({"query": np.zeros((6, 2, 2))}, ee.InputError, "2-D"),
        ({"query": np.zeros((0, 2)), "query_labels": [0]}, ee.InputError, "empty"),
        ({"query": np.array([[1, 2]] * 6, dtype=object)}, ee.InputTypeError, "object array"),
        ({"k": 0}, ee.InputError, "k must be >= 1"),
        ({"k": 2.5}, ee.InputError, "k must be an integer"),
        ({"k": 3.0}, ee.InputError, "Use k=3"),
        ({"k": True}, ee.InputError, "k must be an integer"),
        ({"k": "max"}, ee.InputError, "max_bin_count"),
        ({"metrics": ["map_at_k"]}, ee.InputError, "Did you mean 'map_at_r'"),
        ({"metrics": ["recall_at_0"]}, ee.InputError, "unknown metric"),
        ({"metrics": []}, ee.InputError, "metrics is empty"),
        ({"distance": "cosin"}, ee.InputError, "Did you mean 'cosine'"),
        ({"average": "weighted"}, ee.InputError, "average="),
        (
            {"confidences": [1, 2, np.nan, 4, 5, 6]},
            ee.InputError,
            r"confidences has 1 NaN or infinite value\(s\), first at index 2",
        ),
        ({"confidences": [1, 2]}, ee.InputError, "confidences has 2 values but 6"),
        ({"metrics": ["recall_at_10"], "k": 5}, ee.InputError, "recall_at_10 need"),
        ({"reference_labels": Y}, ee.InputError, "reference_labels was given without reference"),
        ({"query_labels": [[[0, 1]]] * 6}, ee.InputError, "1-D"),
        ({"query_labels": [[0, 2]] * 6}, ee.InputError, "only 0 and 1"),
        ({"query_labels": [0.5] * 6}, ee.InputError, "non-integer float label"),
        ({"ci": 95}, ee.InputError, "strictly between 0 and 1"),
        ({"ci": 0.95, "n_boot": 0}, ee.InputError, "n_boot must be >= 1"),
        ({"block_size": 0}, ee.InputError, "block_size must be >= 1"),
        ({"backend": "ray"}, ee.InputError, "backend="),
    ],
)
def test_evaluate_rejects_bad_input(kwargs, error, match):
    args = {"query": X32, "query_labels": Y, **kwargs}
    with pytest.raises(error, match=match):
        ee.evaluate(**args)


def test_dimension_mismatch_and_missing_reference_labels():
    with pytest.raises(ee.InputError, match="query has dimension 2 but reference has 3"):
        ee.evaluate(X32, Y, np.zeros((4, 3)), [0, 1, 2, 3])
    with pytest.raises(ee.InputError, match="reference_labels is required"):
        ee.evaluate(X32, Y, X32)
    with pytest.raises(ee.InputError, match="reference_labels has 2 labels"):
        ee.evaluate(X32, Y, X32, [0, 1])


def test_ref_includes_query_is_checked():
    with pytest.raises(ee.InputError, match="query row 0 differs from reference row 0"):
        ee.evaluate(X32, Y, X32[::-1].copy(), Y[::-1], ref_includes_query=True)
    with pytest.raises(ee.InputError, match="labels differ"):
        ee.evaluate(X32, Y, X32, [9] * 6, ref_includes_query=True)


def test_groups_must_come_in_pairs_for_a_split():
    with pytest.raises(ee.InputError, match="go together"):
        ee.evaluate(X32, Y, X32, Y, query_groups=[0] * 6)
    with pytest.raises(ee.InputError, match="query_groups has 2 labels"):
        ee.evaluate(X32, Y, query_groups=[0, 1])


def test_zero_vector_with_cosine():
    x = X32.copy()
    x[3] = 0
    with pytest.raises(ee.InputError, match="all zero .*first at row 3"):
        ee.evaluate(x, Y, distance="cosine")


def test_neighbors_rejects_bad_input():
    with pytest.raises(ee.InputError, match="k must be >= 1"):
        ee.neighbors(X32, 0)
    with pytest.raises(ee.InputError, match="query has NaN"):
        ee.neighbors(np.full((3, 2), np.nan), 1)
    with pytest.raises(ee.InputError, match="dimension"):
        ee.neighbors(X32, 1, np.zeros((3, 5)))
    with pytest.raises(ee.InputError, match="distance="):
        ee.neighbors(X32, 1, distance="l2")


def test_finite_rows_whose_squares_overflow_or_underflow_are_accepted_bad_ones_named():
    # the row screens sum squares: 1e30 squares past float32's range and 1e-30 squares to 0,
    # yet those rows are finite and non-zero; only the NaN, infinite and zero rows are named
    rng = np.random.default_rng(3)
    x = rng.standard_normal((20_000, 6)).astype(np.float32)
    x[[5, 9_000]] = 1e30
    x[[7, 19_999]] = 1e-30
    y = np.arange(20_000) % 50
    res = ee.evaluate(x, y, distance="cosine", metrics=["precision_at_1"], progress=False)
    assert 0 <= res["precision_at_1"] <= 1
    bad = x.copy()
    bad[[8_200, 17_000], 3] = [np.inf, np.nan]
    with pytest.raises(ee.InputError, match=r"query has NaN or infinite values in 2 row\(s\), "
                       r"first at row 8200"):  # fmt: skip
        ee.evaluate(bad, y, progress=False)
    lists = [[(i + 1) % 20_000] for i in range(20_000)]
    ok = ee.evaluate(x, None, x, None, positives=lists, distance="cosine",
                     metrics=["precision_at_1"], progress=False)  # fmt: skip
    assert 0 <= ok["precision_at_1"] <= 1
    zero = x.copy()
    zero[[9_500, 12_000]] = 0
    with pytest.raises(ee.InputError, match=r"2 row\(s\) of reference are all zero \(first at "
                       r"row 9500\)"):  # fmt: skip
        ee.evaluate(x, None, zero, None, positives=lists, distance="cosine", progress=False)


def test_python_integer_labels_beyond_int64_beside_negative_ones_stay_distinct():
    # numpy turns [2**63, -1, 2**63 + 1] into float64, where 2**63 and 2**63 + 1 are one value
    rng = np.random.default_rng(5)
    x = rng.standard_normal((30, 3)).astype(np.float32)
    classes = [2**63, -1, 2**63 + 1]
    y = [classes[i % 3] for i in range(30)]
    res = ee.evaluate(x, y, metrics=["precision_at_1", "map_at_r"], progress=False)
    want, _, _ = oracle.evaluate(
        x, [i % 3 for i in range(30)], metrics=["precision_at_1", "map_at_r"]
    )
    assert res.metrics == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize(
    "labels",
    [[1, "1", 2, "2"], ["a", 2, "a", 2], np.array(["a", 1, "a", 1], dtype=object)],
)
def test_labels_that_mix_text_and_numbers_are_refused(labels):
    # numpy would read the list as text, merging 1 with "1"
    x = np.eye(4, dtype=np.float32)
    with pytest.raises(ee.InputError, match=r"labels mixes text and numbers .*one type"):
        ee.evaluate(x, labels)


@pytest.mark.parametrize(
    ("yq", "yb"),
    [
        ([0, 1], ["0", "1", "0", "1"]),
        (["a", "b"], [0, 1, 0, 1]),
        ([0, 1], [b"0", b"1", b"0", b"1"]),
        (["0", "1"], [b"0", b"1", b"0", b"1"]),
    ],
)
def test_query_and_reference_labels_of_text_and_numbers_are_refused(yq, yb):
    # 0 and "0" never share a class: every query would be lone and every metric NaN
    from embedeval.evaluation.gallery import gallery_rows

    x = np.eye(4, dtype=np.float32)
    with pytest.raises(ee.InputError, match=r"query_labels holds .* reference_labels holds"):
        ee.evaluate(x[:2], yq, x, yb)
    with pytest.raises(ee.InputError, match=r"query_labels holds .* reference_labels holds"):
        gallery_rows([0], 2, query=x[:2], query_labels=yq, reference=x, reference_labels=yb)


def _call_with_groups(where, groups):
    if where == "evaluate":
        ee.evaluate(X, Y, progress=False, query_groups=groups)
    elif where == "evaluate reference":
        ee.evaluate(X, Y, R, RL, query_groups=np.arange(6), reference_groups=groups)
    elif where == "neighbors":
        ee.neighbors(X, 2, query_groups=groups, progress=False)
    else:
        ee.Evaluator().update(X, Y, groups=groups)


@pytest.mark.parametrize(
    ("where", "name", "n"),
    [
        ("evaluate", "query_groups", 6),
        ("evaluate reference", "reference_groups", 10),
        ("neighbors", "query_groups", 6),
        ("Evaluator.update", "groups", 6),
    ],
)
def test_two_dimensional_groups_get_a_message_about_groups_not_multi_label(where, name, n):
    one_hot = np.eye(3, dtype=np.int64)[np.arange(n) % 3]
    with pytest.raises(ee.InputError) as info:
        _call_with_groups(where, one_hot)
    message = str(info.value)
    assert message.startswith(f"{name} must be 1-D (one group id per item); got shape ({n}, 3).")
    assert "exactly one group" in message
    # the multi-label hint belongs to labels: a group array of 0/1 columns is no label set
    assert "indicator" not in message and "labels" not in message


def test_two_dimensional_labels_still_point_to_the_indicator_format():
    pattern = r"query_labels must be 1-D \(one label per item\).*2-D 0/1 indicator array"
    with pytest.raises(ee.InputError, match=pattern):
        ee.evaluate(X, np.zeros((6, 2, 2)), progress=False)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda e: ee.evaluate(e, Y, progress=False), "query"),
        (lambda e: ee.evaluate(X, Y, e[:1].repeat(10, 0), RL, progress=False), "reference"),
        (lambda e: ee.neighbors(e, 2, progress=False), "query"),
        (lambda e: ee.Evaluator().update(e, Y), "embeddings"),
    ],
)
def test_embeddings_with_rows_but_no_columns_are_not_called_empty(call, name):
    with pytest.raises(ee.InputError) as info:
        call(np.zeros((6, 0)))
    message = str(info.value)
    assert message.startswith(f"{name} has no columns (shape (")
    assert "zero dimensions" in message and "dim >= 1" in message
    assert "empty" not in message and "at least one vector" not in message


@pytest.mark.parametrize("value", [True, np.bool_(False)])
def test_a_bool_count_is_refused_without_suggesting_an_integer(value):
    # a whole float is told the integer to pass instead; a bool is no count at all
    from embedeval.utils.validation import check_int

    with pytest.raises(ee.InputError, match="must be an integer") as err:
        check_int(value, "n_folds", minimum=2)
    assert "Use n_folds=" not in str(err.value)
    with pytest.raises(ee.InputError, match=r"Use n_folds=3\."):
        check_int(3.0, "n_folds", minimum=2)


def test_evaluate_qrels_memory_budget_is_bytes_as_in_evaluate():
    x = np.eye(3, dtype=np.float32)
    qrels = {"q0": {"d0": 1}}
    with pytest.raises(ee.InputError, match="memory_budget must be >= 1048576"):
        ee.evaluate_qrels(x[:1], x, qrels, query_ids=["q0"], doc_ids=["d0", "d1", "d2"],
                          metrics=["ndcg@10"], memory_budget=10)  # fmt: skip


def test_closed_unit_interval_arguments_state_that_zero_is_accepted():
    # rejection_fractions and risk take [0, 1]; a non-number was told "(0, 1]".
    with pytest.raises(ee.InputError, match=r"rejection_fractions must be a number in \[0, 1\]"):
        ee.evaluate(X, Y, confidences=np.arange(6.0), reject_from="both", rejection_fractions=["a"])
    erc = ee.metrics.confidence.error_reject_curve([1, 0], [0.5, 0.2])
    with pytest.raises(ee.InputError, match=r"risk must be a number in \[0, 1\]; got 'a'"):
        erc.coverage_at_risk("a")
    with pytest.raises(ee.InputError, match=r"coverage must be a number in \(0, 1\]"):
        erc.selective_risk("a")


def test_as_int64_refuses_uint64_values_that_would_wrap():
    from embedeval.utils.validation import as_int64

    u = np.uint64
    assert as_int64(np.array([0, 2**63 - 1], u), "ranks", "").tolist() == [0, 2**63 - 1]
    with pytest.raises(ee.InputError, match=r"ranks holds 9223372036854775808.*Pass 1-based"):
        as_int64(np.array([1, 2**63], u), "ranks", "Pass 1-based ranks.")


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1, 2**70])
def test_as_int64_names_an_integer_beyond_64_bits(value):
    from embedeval.utils.validation import as_int64

    with pytest.raises(ee.InputError, match=rf"ranks holds the integer {value}, beyond.*1-based"):
        as_int64([1, value], "ranks", "Pass 1-based ranks.")
    # an object array of small integers is left to the caller to judge, as other dtypes are
    assert as_int64(np.array([1, 2], dtype=object), "ranks", "").dtype == object


@pytest.mark.parametrize(
    "query",
    [
        [[2**70, 1], [1, 2], [3, 4]],
        np.array([[1, 2], [-(2**64), 2], [3, 4]]),
        [[1, 2], [3, 4], [5, 10**40]],
    ],
)
def test_integers_beyond_64_bits_are_named_as_such(query):
    # numpy keeps them as Python objects; the message says why and how to fix it
    with pytest.raises(
        ee.InputTypeError,
        match=r"query holds the integer -?\d+(\.\.\. \(41 digits\))?, beyond 64-bit",
    ) as info:
        ee.evaluate(query, [0, 0, 1], progress=False)
    assert "dtype=np.float64" in str(info.value) and "rescale" in str(info.value)
    with pytest.raises(ee.InputTypeError, match="confidences holds the integer 10000000000"):
        ee.evaluate(X[:3], [0, 0, 1], confidences=[1, 10**30, 2], progress=False)
    # integers up to 2**64 - 1 fit uint64 and are read as numbers
    assert ee.evaluate(np.array([[2**64 - 1], [1], [3]]), [0, 0, 1], progress=False)
