"""``embedeval.neighbors`` against a numpy brute force written here (stable argsort per row)."""

import numpy as np
import pytest

import embedeval as ee


def brute(q, r, k, distance, exclude_self):
    """Float64 full sort by (score, index); returns the documented distance/similarity."""
    q = np.asarray(q, dtype=np.float64)
    r = np.asarray(r, dtype=np.float64)
    if distance == "euclidean":
        val = np.sqrt(((q[:, None, :] - r[None, :, :]) ** 2).sum(-1))
        key = val
    else:
        if distance == "cosine":
            q = q / np.linalg.norm(q, axis=1, keepdims=True)
            r = r / np.linalg.norm(r, axis=1, keepdims=True)
        val = q @ r.T
        key = -val
    dist, idx = [], []
    for i in range(len(q)):
        cand = [j for j in range(len(r)) if not (exclude_self and j == i)]
        cand.sort(key=lambda j: (key[i, j], j))
        cand = cand[:k]
        idx.append(cand)
        dist.append([val[i, j] for j in cand])
    return np.array(dist), np.array(idx, dtype=np.int64)


@pytest.mark.parametrize("distance", ["euclidean", "cosine", "inner_product"])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_brute_force_with_exact_ties(distance, seed):
    rng = np.random.default_rng(seed)
    # small integer grid: many exact duplicates and equal distances
    q = rng.integers(-2, 3, size=(12, 3)).astype(np.float64)
    r = rng.integers(-2, 3, size=(20, 3)).astype(np.float64)
    if distance == "cosine":
        q[np.all(q == 0, axis=1)] = 1.0
        r[np.all(r == 0, axis=1)] = 1.0
    dist, idx = ee.neighbors(q, 6, r, distance=distance, progress=False)
    Dw, Iw = brute(q, r, 6, distance, False)
    if distance == "cosine":
        # float32 cosines of equal angles may differ in the last bit, so the order inside an
        # exact tie is not checkable; check each returned row has the brute-force similarity
        qn = q / np.linalg.norm(q, axis=1, keepdims=True)
        rn = r / np.linalg.norm(r, axis=1, keepdims=True)
        np.testing.assert_allclose(np.take_along_axis(qn @ rn.T, idx, 1), Dw, atol=1e-6)
        np.testing.assert_allclose(dist, Dw, atol=1e-6)
        return
    np.testing.assert_array_equal(idx, Iw)
    np.testing.assert_allclose(dist, Dw, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("distance", ["euclidean", "cosine", "inner_product"])
def test_matches_brute_force_on_random_data(distance):
    rng = np.random.default_rng(3)
    q, r = rng.normal(size=(30, 5)), rng.normal(size=(50, 5))
    for bs in (1, 7, None):
        dist, idx = ee.neighbors(q, 10, r, distance=distance, block_size=bs, progress=False)
        Dw, Iw = brute(q, r, 10, distance, False)
        np.testing.assert_array_equal(idx, Iw)
        np.testing.assert_allclose(dist, Dw, rtol=1e-5, atol=1e-5)
        assert idx.dtype == np.int64


def test_euclidean_is_not_squared_and_ties_go_to_the_lower_index():
    dist, idx = ee.neighbors([[0.0, 0.0]], 3, [[3.0, 4.0], [0.0, 5.0], [1.0, 0.0]], progress=False)
    assert idx.tolist() == [[2, 0, 1]]
    np.testing.assert_allclose(dist, [[1.0, 5.0, 5.0]])


def test_self_exclusion_and_clamping():
    x = np.array([[0.0], [1.0], [3.0], [7.0]])
    dist, idx = ee.neighbors(x, 10, progress=False)  # only 3 others exist
    assert idx.shape == (4, 3)
    Dw, Iw = brute(x, x, 3, "euclidean", True)
    np.testing.assert_array_equal(idx, Iw)
    np.testing.assert_allclose(dist, Dw)
    # duplicates: self exclusion is by row identity, the twin is still found
    y = np.array([[1.0], [1.0], [5.0]])
    dist, idx = ee.neighbors(y, 1, progress=False)
    assert idx.tolist() == [[1], [0], [0]]
    np.testing.assert_allclose(dist, [[0.0], [0.0], [4.0]])
    # exclude_self with a reference whose first rows are the queries
    dist, idx = ee.neighbors(y[:2], 5, y, exclude_self=True, progress=False)
    assert idx.tolist() == [[1, 2], [0, 2]]
    # clamped to the reference set in a split
    dist, idx = ee.neighbors(y, 7, [[0.0], [2.0]], progress=False)
    assert idx.shape == (3, 2) and idx.tolist() == [[0, 1], [0, 1], [1, 0]]


class ArrayLike:
    def __init__(self, a):
        self.a = np.asarray(a)

    def __array__(self, dtype=None, copy=None):
        return self.a if dtype is None else self.a.astype(dtype)


def test_accepts_lists_float16_float64_memmap_and_array_like(tmp_path):
    rng = np.random.default_rng(5)
    # multiples of 1/8 in a small range: exact in float16
    q = rng.integers(-16, 16, size=(9, 3)) / 8.0
    r = rng.integers(-16, 16, size=(15, 3)) / 8.0 + 1 / 64
    _, Iw = brute(q, r, 4, "euclidean", False)
    mm = np.lib.format.open_memmap(tmp_path / "r.npy", mode="w+", dtype=np.float32, shape=r.shape)
    mm[:] = r
    mm.flush()
    mm = np.load(tmp_path / "r.npy", mmap_mode="r")
    for qq, rr in (
        (q.tolist(), r.tolist()),
        (q.astype(np.float16), r.astype(np.float16)),
        (q.astype(np.float64), r),
        (q, mm),
        (ArrayLike(q), ArrayLike(r)),
    ):
        dist, idx = ee.neighbors(qq, 4, rr, progress=False)
        Dh, Ih = brute(
            np.asarray(qq, dtype=np.float64),
            np.asarray(rr, dtype=np.float64),
            4,
            "euclidean",
            False,
        )
        np.testing.assert_array_equal(idx, Ih)
        np.testing.assert_allclose(dist, Dh, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(Iw, Ih)


@pytest.mark.parametrize("scale", [2.0**63, 2.0**100, 2.0**-80, 2.0**-120])
def test_inputs_whose_squares_leave_float32_keep_ranking_and_distances(scale):
    # The docstring example (points 0, 1, 3, 7) times a power of two: the same neighbours, and
    # the distances times the same power (squares of these overflow or underflow float32).
    x = (np.array([[0.0], [1.0], [3.0], [7.0]]) * scale).astype(np.float32)
    d, i = ee.neighbors(x, 2)
    assert i.tolist() == [[1, 2], [0, 2], [1, 0], [2, 1]]
    want = np.array([[1.0, 3.0], [1.0, 2.0], [2.0, 3.0], [4.0, 6.0]]) * scale
    np.testing.assert_array_equal(d.astype(np.float64), want)
    # Inner product: q . r ranks 7 first for every positive query, then 3 (ties at 0 by index).
    _, i = ee.neighbors(x, 2, distance="inner_product")
    assert i.tolist() == [[1, 2], [3, 2], [3, 1], [2, 1]]
