"""embedeval.neighbors against numpy brute force, and the result object's round trip."""

from __future__ import annotations

import math

import numpy as np
import pytest

import embedeval as ee


def _brute(q, r, k, distance, exclude_self):
    q64, r64 = q.astype(np.float64), r.astype(np.float64)
    if distance == "euclidean":
        d = np.sqrt(((q64[:, None] - r64[None]) ** 2).sum(-1))
        key = d
    else:
        if distance == "cosine":
            q64 = q64 / np.linalg.norm(q64, axis=1, keepdims=True)
            r64 = r64 / np.linalg.norm(r64, axis=1, keepdims=True)
        d = q64 @ r64.T
        key = -d
    idx, dist = [], []
    for i in range(len(q)):
        cols = [j for j in range(len(r)) if not (exclude_self and j == i)]
        order = sorted(cols, key=lambda j: (key[i, j], j))[:k]
        idx.append(order)
        dist.append([d[i, j] for j in order])
    return np.array(dist), np.array(idx)


@pytest.mark.parametrize("distance", ["euclidean", "cosine", "inner_product"])
def test_neighbors_match_brute_force_with_ties(distance):
    rng = np.random.default_rng(1)
    q = rng.integers(-2, 3, (40, 3)).astype(np.float32)  # many exact ties
    r = rng.integers(-2, 3, (70, 3)).astype(np.float32)
    if distance == "cosine":
        q[np.all(q == 0, axis=1)] = 1
        r[np.all(r == 0, axis=1)] = 1
    d, i = ee.neighbors(q, 6, r, distance=distance)
    bd, bi = _brute(q, r, 6, distance, False)
    if distance != "cosine":  # cosine of integer vectors is not exact in float32
        np.testing.assert_array_equal(i, bi)
    np.testing.assert_allclose(d, bd, atol=1e-5)


def test_neighbors_self_exclusion_and_clamping():
    x = np.array([[0.0], [1.0], [3.0], [7.0]], dtype=np.float32)
    d, i = ee.neighbors(x, 10)
    assert i.shape == (4, 3)  # k clamped to the 3 other points, never padded with -1
    assert i.tolist() == [[1, 2, 3], [0, 2, 3], [1, 0, 3], [2, 1, 0]]
    assert d.tolist() == [[1, 3, 7], [1, 2, 6], [2, 3, 4], [4, 6, 7]]
    _d2, i2 = ee.neighbors(x[:2], 1, x, exclude_self=True)
    assert i2.ravel().tolist() == [1, 0]
    with pytest.raises(ee.InputError, match="first rows of reference"):
        ee.neighbors(x[1:3], 1, x, exclude_self=True)


def test_neighbors_match_faiss_on_random_data():
    faiss = pytest.importorskip("faiss")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3000, 16)).astype(np.float32)
    d, i = ee.neighbors(x[:500], 8, x)
    index = faiss.IndexFlatL2(16)
    index.add(x)
    fd, fi = index.search(x[:500], 8)
    assert (i == fi).mean() > 0.999  # float32 rounding may swap near-equal neighbours
    np.testing.assert_allclose(d**2, fd, rtol=1e-4, atol=1e-4)


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
