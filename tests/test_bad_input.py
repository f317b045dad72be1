"""Bad input (SPEC §8) for evaluate and neighbors: each case raises InputError/InputTypeError
with a message that names the argument and echoes what was wrong.  Complements
tests/test_core_bad_input.py (query-side cases) with reference-side, group, label and
neighbors cases."""

import re

import numpy as np
import pytest

import embedeval as ee

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
