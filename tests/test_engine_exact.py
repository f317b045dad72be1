"""The exact engine's building blocks (embedeval.engine.exact) against plain loops."""

from __future__ import annotations

import numpy as np
import pytest

from embedeval.engine.exact import (
    EnginePlan,
    Exclusions,
    PreparedSearch,
    all_valid_codes,
    label_cutoff,
    pack_codes,
    search_block,
)


def _excluded_by_loop(n_query, n_ref, self_index, q_groups, r_groups):
    out = np.zeros((n_query, n_ref), dtype=bool)
    for i in range(n_query):
        for j in range(n_ref):
            if self_index and i == j:
                out[i, j] = True
            if r_groups is not None and r_groups[j] == q_groups[i]:
                out[i, j] = True
    return out


CASES = [
    (True, None, None),
    (False, np.array([0, 1, 1, 2]), np.array([1, 0, 2, 2, 5, 1])),
    (True, np.array([0, 1, 1, 2]), np.array([0, 1, 1, 2, 5, 1])),  # own row in own group
    (False, None, None),
]


@pytest.mark.parametrize(("self_index", "qg", "rg"), CASES)
def test_excluded_hide_and_by_group_agree_with_a_loop(self_index, qg, rg):
    n_query, n_ref = 4, 6
    want = _excluded_by_loop(n_query, n_ref, self_index, qg, rg)
    ex = Exclusions(self_index=self_index, query_groups=qg, reference_groups=rg)
    rows, cols = np.meshgrid(np.arange(n_query), np.arange(n_ref), indexing="ij")
    got = ex.excluded(rows, cols)
    np.testing.assert_array_equal(np.zeros_like(want) if got is None else got, want)
    # hide() on a tile of columns [2, 5): exactly the excluded pairs become +inf
    keys = np.zeros((n_query, 3), dtype=np.float32)
    ex.hide(keys, np.arange(n_query), 2)
    np.testing.assert_array_equal(np.isinf(keys), want[:, 2:5])
    # by_group(): the same pairs as group codes alone, for every subset of queries and shard
    groups = ex.by_group(n_query, n_ref)
    assert not groups.self_index
    got = groups.excluded(rows, cols)
    np.testing.assert_array_equal(np.zeros_like(want) if got is None else got, want)
    if groups.reference_groups is not None:
        part = groups.for_queries(slice(1, 3)).for_references(slice(3, 6))
        sub_rows, sub_cols = np.meshgrid(np.arange(2), np.arange(3), indexing="ij")
        np.testing.assert_array_equal(part.excluded(sub_rows, sub_cols), want[1:3, 3:6])


def test_by_group_refuses_an_own_row_in_another_group():
    ex = Exclusions(
        self_index=True, query_groups=np.array([0, 1]), reference_groups=np.array([0, 2, 1])
    )
    with pytest.raises(ValueError, match="query row 1 has a different group"):
        ex.by_group(2, 3)


def test_packed_codes_sort_by_row_then_key_then_reference():
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 3, 40)
    keys = rng.choice(np.array([-2.5, -0.0, 0.0, 1.0, 7.25], dtype=np.float32), 40)
    refs = rng.permutation(40)
    order = np.argsort(pack_codes(rows, keys, refs, 6))
    # -0.0 and 0.0 are the same key, so they tie and the reference index decides
    want = sorted(range(40), key=lambda i: (rows[i], float(keys[i]) + 0.0, refs[i]))
    assert order.tolist() == want


@pytest.mark.parametrize("how", ["max", "min"])
def test_label_cutoff_is_the_farthest_or_nearest_same_label_key(how):
    keys = np.array([[3.0, 1.0, np.inf, 2.0], [5.0, 4.0, 0.5, 6.0]], dtype=np.float32)
    q_codes, r_codes = np.array([1, 2]), np.array([1, 1, 1, 0])
    plan = EnginePlan(need=np.zeros(2), block_size=2, tile=4, col_bits=2, subsample=None,
                      distance="euclidean", threshold=how, query_codes=q_codes,
                      reference_codes=r_codes)  # fmt: skip
    got = label_cutoff(plan, keys, 0, 2)
    # row 0: same-label finite keys 3.0 and 1.0 (the +inf one is excluded); row 1: none
    assert got.tolist() == [3.0 if how == "max" else 1.0, -np.inf]


def test_all_valid_codes_and_a_block_match_brute_force():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((50, 3)).astype(np.float32)
    search = PreparedSearch.build(x[:8], x, "euclidean")
    ex = Exclusions(self_index=True)
    codes, counts = all_valid_codes(search, 0, np.array([1, 5]), ex, 6)
    assert counts.tolist() == [49, 49]  # every reference but the query's own row
    row, ref = (codes >> np.uint64(38)).astype(int), (codes & np.uint64(63)).astype(int)
    assert sorted(ref[row == 5].tolist()) == [j for j in range(50) if j != 5]
    plan = EnginePlan(need=np.full(8, 5), block_size=8, tile=50, col_bits=6, subsample=None,
                      distance="euclidean", exclusions=ex, search=search)  # fmt: skip
    block = search_block(plan, 0, 8)
    d64 = ((x[:8, None, :].astype(np.float64) - x[None, :, :]) ** 2).sum(-1)
    for q in range(8):
        d64[q, q] = np.inf
        got = block.index[block.lims[q] : block.lims[q] + 5]
        assert got.tolist() == np.argsort(d64[q], kind="stable")[:5].tolist()


@pytest.mark.parametrize("distance", ["euclidean", "inner_product", "cosine"])
def test_float64_filter_keys_lie_within_their_bound(distance):
    """Keys of a ``precision="float64"`` search (a float64 product rounded once to float32)
    against column-by-column float64 sums of the same float32 rows: every key within
    ``key_bounds`` with ``rounding_of("float64")``, which must hold one float32 rounding of
    the key (the keys here are not near zero, so that rounding is seen)."""
    from embedeval.engine.decide import key_bounds, rounding_of

    rng = np.random.default_rng(7)
    xq = (rng.standard_normal((40, 24)) + 3).astype(np.float32)
    xb = (rng.standard_normal((300, 24)) + 3).astype(np.float32)
    keys = PreparedSearch.build(xq, xb, distance, precision="float64").keys(slice(None))
    q64, x64 = xq.astype(np.float64), xb.astype(np.float64)
    dots = np.zeros((40, 300))
    for j in range(24):  # fixed order, column by column
        dots += q64[:, j, None] * x64[None, :, j]
    q_sq, x_sq = (q64 * q64).sum(axis=1), (x64 * x64).sum(axis=1)
    if distance == "euclidean":  # the engine's key omits the query's own squared norm
        want = x_sq[None, :] - 2 * dots
    elif distance == "inner_product":
        want = -dots
    else:
        want = -dots / np.sqrt(q_sq[:, None] * x_sq[None, :])
    bound = key_bounds(q_sq, float(x_sq.max()), 24, distance, *rounding_of("float64"))
    err = np.abs(keys.astype(np.float64) - want)
    assert np.all(err <= bound[:, None])
    assert err.max() > bound.max() / 8  # the float32 rounding is what the bound is for
