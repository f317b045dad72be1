"""Identical reference vectors are exact ties, ranked by ascending reference index, everywhere.

A float32 matrix product can round the same dot product differently depending on the column's
position in the product, so identical references used to get keys a unit in the last place
apart (not a tie).  Expected values come from the hand-worked example below and from the
brute-force oracle (tests/oracle.py: float64, elementwise, so identical rows score identically).
Non-identical vectors are Gaussian and few enough that no two of them are nearly equally far.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import embedeval as ee
from tests import oracle

DISTANCES = ["euclidean", "cosine", "inner_product"]
METRICS = ["precision_at_1", "r_precision", "map_at_r", "map", "mrr", "recall_at_2"]


def _twins(n_unique, n_rows, dim, seed, n_classes=4):
    """n_rows rows drawn (with repeats) from n_unique Gaussian vectors, random labels."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((n_unique, dim)).astype(np.float32)
    pick = np.concatenate([np.arange(n_unique), rng.integers(0, n_unique, n_rows - n_unique)])
    rng.shuffle(pick)
    return base[pick], rng.integers(0, n_classes, n_rows), pick


def _ev(*args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ee.evaluate(*args, progress=False, **kw)


def _oracle(q, ql, r, rl, metrics, **kw):
    _, pq, _ = oracle.evaluate(q, ql, r, rl, metrics=metrics, **kw)
    return {m: np.asarray(v, dtype=np.float64) for m, v in pq.items()}


def test_the_identical_pair_is_a_tie_ranked_by_index():
    # Reference rows 0 and 2 are the same vector b, row 1 is far away (+3 on every coordinate).
    # Rows 0 and 2 are exactly equally far from q, so the tie rule ranks row 0 (label 0) first:
    # P@1 = 0/1 for the query of label 1, and the tie (a relevant and a non-relevant item at the
    # cut-off) is counted.
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 32), dtype=np.float32)
    b = rng.standard_normal(32, dtype=np.float32)
    r = np.stack([b, rng.standard_normal(32, dtype=np.float32) + 3, b])
    for distance in DISTANCES:
        res = _ev(q, [1], r, [0, 0, 1], metrics=["precision_at_1"], distance=distance)
        want = 1.0 if distance == "inner_product" and float(q[0] @ r[1]) > float(q[0] @ b) else 0
        assert res["precision_at_1"] == want
        d, i = ee.neighbors(q, 3, r, distance=distance)
        pos = [int(np.flatnonzero(i[0] == j)[0]) for j in (0, 2)]
        assert pos[1] == pos[0] + 1  # adjacent, row 0 first
        assert d[0, pos[0]] == d[0, pos[1]]
    assert _ev(q, [1], r, [0, 0, 1], metrics=["precision_at_1"]).n_ties["precision_at_1"] == 1


@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize("block_size", [None, 1, 7])
def test_neighbors_lists_twins_together_with_equal_distances(distance, block_size):
    x, _, pick = _twins(120, 700, 24, seed=1)
    d, i = ee.neighbors(x, 40, distance=distance, block_size=block_size)
    for row in range(0, 700, 7):
        twin_of = pick[i[row]]
        for u in np.unique(twin_of):
            where = np.flatnonzero(twin_of == u)
            members = np.flatnonzero(pick == u)
            members = members[members != row]
            # Every twin is listed (unless the list ends inside the group), in index order,
            # consecutively, at one distance.
            assert np.array_equal(i[row, where], members[: where.size])
            assert np.all(np.diff(where) == 1)
            assert np.all(d[row, where] == d[row, where[0]])
            if where[-1] < 39:
                assert where.size == members.size


@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize("loo", [True, False])
@pytest.mark.parametrize("block_size", [None, 1, 5])
def test_evaluate_with_twins_equals_the_oracle(distance, loo, block_size):
    x, y, _ = _twins(90, 360, 16, seed=2)
    if loo:
        res = _ev(x, y, metrics=METRICS, distance=distance, block_size=block_size)
        want = _oracle(x, y, None, None, METRICS, distance=distance)
    else:
        q, ql = x[:60] + np.float32(0.25), y[:60]
        res = _ev(q, ql, x, y, metrics=METRICS, distance=distance, block_size=block_size)
        want = _oracle(q, ql, x, y, METRICS, distance=distance)
    for m in METRICS:
        np.testing.assert_allclose(res.per_query[m], want[m], rtol=1e-12, err_msg=m)
    assert res.n_ties["map_at_r"] > 0


def test_a_vector_and_its_double_are_one_point_for_cosine():
    # v and 2v normalise to the same unit vector bit for bit (scaling by 2 is exact): a tie.
    rng = np.random.default_rng(3)
    v = rng.standard_normal(16).astype(np.float32)
    others = rng.standard_normal((30, 16)).astype(np.float32)
    r = np.vstack([others[:10], v * 2, others[10:], v])  # rows 10 and 31
    q = v + np.float32(0.01) * rng.standard_normal(16).astype(np.float32)
    _, i = ee.neighbors(q[None], 2, r, distance="cosine")
    assert i.tolist() == [[10, 31]]


# Four float32 rows (shortest round-trip digits): rows 1-3 are a few units in the last place
# apart, and rows 2 and 3 (which differ in one coordinate) have the same float32 unit row.
_NEAR_ROWS = np.float32(
    [[-0.38836074, -0.9714643, -0.11705681, 0.4984244, 0.2498287, -0.7961589, 1.5582321,
      0.6069449],
     [-1.0717403, 0.08650638, -1.9918329, 0.89906335, 0.50234973, -0.66447455, -0.8412369,
      -0.20012611],
     [-1.0717402, 0.08650638, -1.9918329, 0.8990633, 0.5023496, -0.66447455, -0.8412369,
      -0.20012608],
     [-1.0717402, 0.08650638, -1.9918329, 0.8990633, 0.5023496, -0.66447455, -0.8412368,
      -0.20012608]]
)  # fmt: skip


def test_cosine_groups_exact_multiples_and_not_rows_that_only_normalise_alike():
    # (1, 1, 0, ...) and (3, 3, 0, ...) are one direction although their float32 unit rows
    # differ in the last bit; (-3, -3, 0, ...) is not; rows 2 and 3 of _NEAR_ROWS normalise to
    # the same float32 unit row but point in directions a float64 cosine tells apart
    from embedeval.engine.exact import normalize_rows, reference_duplicates

    ones = np.float32([1, 1, 0, 0, 0, 0, 0, 0])
    x = np.vstack([ones, _NEAR_ROWS[2], 3 * ones, _NEAR_ROWS[3], -3 * ones])
    unit = normalize_rows(x.copy(), "x")
    assert (unit[1] == unit[3]).all() and not (unit[0] == unit[2]).all()
    dups = reference_duplicates(x, "cosine")
    assert dups.members.tolist() == [0, 2] and dups.first.tolist() == [0]


def test_rows_normalising_alike_rank_by_their_float64_cosines():
    # leave-one-out, full depth: from query 0 rows 1-3 rank 3, 1, 2 in float64 (cosines
    # 0.0394127906, 0.0394127882, 0.0394127748); only row 1 shares its label: AP = 1/2
    y = np.array([2, 2, 7, 1])
    metrics = ["map", "precision_at_1", "mrr"]
    res = _ev(_NEAR_ROWS, y, metrics=metrics, distance="cosine")
    want = _oracle(_NEAR_ROWS, y, None, None, metrics, distance="cosine")
    assert res.per_query["map"][0] == 0.5
    for m in metrics:
        np.testing.assert_allclose(res.per_query[m], want[m], rtol=1e-12, err_msg=m)


@pytest.mark.parametrize("distance", DISTANCES)
def test_column_sample_path_with_twins_equals_the_oracle(distance):
    # 3,000 references (> 2,048: depth thresholds come from a column sample), 600 distinct.
    x, y, _ = _twins(600, 3000, 12, seed=4)
    q, ql = x[:40], y[:40]
    metrics = ["precision_at_1", "map_at_r", "map", "mrr"]
    res = _ev(q, ql, x, y, ref_includes_query=True, metrics=metrics, distance=distance)
    want = _oracle(q, ql, x, y, metrics, distance=distance, ref_includes_query=True)
    for m in metrics:
        np.testing.assert_allclose(res.per_query[m], want[m], rtol=1e-12, err_msg=m)


@pytest.mark.parametrize("distance", DISTANCES)
def test_sharded_twins_equal_local_and_the_oracle(distance, monkeypatch):
    # 40,000 references (2,048-column tiles; shards apply), twins spread over every shard;
    # full-depth map read shard by shard (this reference would fit the local deep engine).
    import embedeval.search.sharded as sharded

    monkeypatch.setattr(sharded, "deep_fits_in_memory", lambda task, budget: False)
    x, y, _ = _twins(4000, 40_000, 8, seed=5, n_classes=50)
    q, ql = x[:200], y[:200]
    kw = dict(metrics=["precision_at_1", "map_at_r", "map"], distance=distance)
    local = _ev(q, ql, x, y, ref_includes_query=True, **kw)
    sharded = _ev(q, ql, x, y, ref_includes_query=True, shards=3, **kw)
    for m in kw["metrics"]:
        np.testing.assert_array_equal(local.per_query[m], sharded.per_query[m], err_msg=m)
    assert local.n_ties == sharded.n_ties
    want = _oracle(q[:12], ql[:12], x, y, kw["metrics"], distance=distance,
                   ref_includes_query=True)  # fmt: skip
    for m in kw["metrics"]:
        # Full-depth map reads all 40,000 positions, where distinct vectors can be float32
        # ties (an adjacent swap deep in the list moves AP by ~1e-7): compare to 1e-5.
        np.testing.assert_allclose(local.per_query[m][:12], want[m], rtol=1e-5, err_msg=m)


@pytest.mark.parametrize("distance", DISTANCES)
def test_approximate_lists_tie_twins(distance):
    pytest.importorskip("faiss")
    x, y, _ = _twins(150, 600, 16, seed=6)
    metrics = ["precision_at_1", "map_at_r", "recall_at_2"]
    res = _ev(x, y, metrics=metrics, distance=distance, index="Flat", exact_sample=50)
    want = _oracle(x, y, None, None, metrics, distance=distance)
    for m in metrics:
        np.testing.assert_allclose(res.per_query[m], want[m], rtol=1e-6, err_msg=m)


def _groups_by_bytes(x):
    """Plain grouping of identical rows (-0.0 taken as 0.0): {first member: members}."""
    seen = {}
    for i, row in enumerate(x + np.float32(0.0)):
        seen.setdefault(row.tobytes(), []).append(i)
    return {m[0]: m for m in seen.values() if len(m) > 1}


@pytest.mark.parametrize("dim", [1, 3, 8])
@pytest.mark.parametrize("collide", [False, True])
def test_duplicate_rows_are_the_groups_of_identical_rows(monkeypatch, dim, collide):
    """Against a plain grouping by bytes; with ``collide`` every row hashes alike, so the
    exact comparison alone must tell the groups apart."""
    from embedeval.engine import duplicates

    if collide:
        monkeypatch.setattr(
            duplicates, "_words", lambda rows: np.zeros((rows.shape[0], 1), np.uint64)
        )
    rng = np.random.default_rng(dim)
    x = rng.integers(-2, 3, (400, dim)).astype(np.float32)
    x[rng.random(x.shape) < 0.2] = -0.0
    x[200:260] = np.abs(x[rng.integers(0, 200, 60)])  # copies, some with 0.0 for -0.0
    found = duplicates.find_duplicate_rows(x)
    want = _groups_by_bytes(x)
    got = {}
    for g, first in enumerate(found.first):
        got[int(first)] = found.members[found.group == g].tolist()
    assert want and got == want
