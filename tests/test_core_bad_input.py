"""Every bad-input case of SPEC §8 for evaluate and neighbors gets a clear, named error."""

from __future__ import annotations

import numpy as np
import pytest

import embedeval as ee

X = np.arange(12, dtype=np.float32).reshape(6, 2)
Y = [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"query": np.where(np.arange(12).reshape(6, 2) == 5, np.nan, X)},
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
        ({"query_labels": [[0, 1]] * 6}, ee.InputError, "1-D"),
        ({"query_labels": [0.5] * 6}, ee.InputError, "non-integer float label"),
        ({"ci": 95}, ee.InputError, "strictly between 0 and 1"),
        ({"ci": 0.95, "n_boot": 0}, ee.InputError, "n_boot must be >= 1"),
        ({"block_size": 0}, ee.InputError, "block_size must be >= 1"),
        ({"backend": "ray"}, ee.InputError, "backend="),
    ],
)
def test_evaluate_rejects_bad_input(kwargs, error, match):
    args = {"query": X, "query_labels": Y, **kwargs}
    with pytest.raises(error, match=match):
        ee.evaluate(**args)


def test_dimension_mismatch_and_missing_reference_labels():
    with pytest.raises(ee.InputError, match="query has dimension 2 but reference has 3"):
        ee.evaluate(X, Y, np.zeros((4, 3)), [0, 1, 2, 3])
    with pytest.raises(ee.InputError, match="reference_labels is required"):
        ee.evaluate(X, Y, X)
    with pytest.raises(ee.InputError, match="reference_labels has 2 labels"):
        ee.evaluate(X, Y, X, [0, 1])


def test_ref_includes_query_is_checked():
    with pytest.raises(ee.InputError, match="query row 0 differs from reference row 0"):
        ee.evaluate(X, Y, X[::-1].copy(), Y[::-1], ref_includes_query=True)
    with pytest.raises(ee.InputError, match="labels differ"):
        ee.evaluate(X, Y, X, [9] * 6, ref_includes_query=True)


def test_groups_must_come_in_pairs_for_a_split():
    with pytest.raises(ee.InputError, match="go together"):
        ee.evaluate(X, Y, X, Y, query_groups=[0] * 6)
    with pytest.raises(ee.InputError, match="query_groups has 2 labels"):
        ee.evaluate(X, Y, query_groups=[0, 1])


def test_zero_vector_with_cosine():
    x = X.copy()
    x[3] = 0
    with pytest.raises(ee.InputError, match="all zero .*first at row 3"):
        ee.evaluate(x, Y, distance="cosine")


def test_neighbors_rejects_bad_input():
    with pytest.raises(ee.InputError, match="k must be >= 1"):
        ee.neighbors(X, 0)
    with pytest.raises(ee.InputError, match="query has NaN"):
        ee.neighbors(np.full((3, 2), np.nan), 1)
    with pytest.raises(ee.InputError, match="dimension"):
        ee.neighbors(X, 1, np.zeros((3, 5)))
    with pytest.raises(ee.InputError, match="distance="):
        ee.neighbors(X, 1, distance="l2")
