"""Tie handling in embedeval.ranking against brute-force enumeration of every order of tied items.

The oracle: naive metric loops over one fixed ranking (written here, checked on hand cases), run on
every permutation of the items that keeps the score order (ties broken by the permutation), and
averaged ("expected"), minimised ("pessimistic") or maximised ("optimistic").
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedeval import ranking as rk

pytestmark = pytest.mark.filterwarnings("ignore::embedeval.EmbedevalWarning")


# ----------------------------------------------------------------- naive oracles on one ranking
def naive_ap(rel, k=None, n_rel=None, normalization="relevant"):
    k = len(rel) if k is None else k
    n_rel = sum(1 for x in rel if x) if n_rel is None else n_rel
    hits, total = 0, 0.0
    for i, x in enumerate(rel[:k]):
        if x:
            hits += 1
            total += hits / (i + 1)
    den = {"relevant": n_rel, "min_k_relevant": min(k, n_rel), "hits": hits}[normalization]
    return total / den if den else 0.0


def naive_p_at_k(rel, k):
    return sum(1 for x in rel[:k] if x) / k


def naive_rr(rel, k=None):
    k = len(rel) if k is None else k
    for i, x in enumerate(rel[:k]):
        if x:
            return 1 / (i + 1)
    return 0.0


def naive_hit(rel, k):
    return float(any(rel[:k]))


def naive_rprec(rel, n_rel=None):
    n_rel = sum(1 for x in rel if x) if n_rel is None else n_rel
    return sum(1 for x in rel[:n_rel] if x) / n_rel


def naive_dcg(grades, k=None, gain="linear"):
    k = len(grades) if k is None else k
    total = 0.0
    for i, g in enumerate(grades[:k]):
        total += (g if gain == "linear" else 2**g - 1) / math.log2(i + 2)
    return total


def naive_recall_at_k(rel, k, n_rel):
    return sum(1 for x in rel[:k] if x) / n_rel


def orderings(y, s):
    """Every ranking of y by decreasing s, ties broken in every possible way (with multiplicity,
    so each within-block order is equally likely)."""
    n = len(y)
    for perm in itertools.permutations(range(n)):
        order = sorted(range(n), key=lambda i: (-s[i], perm.index(i)))
        yield [y[i] for i in order]


def enumerate_stats(fn, y, s):
    vals = [fn(r) for r in orderings(list(y), list(s))]
    return float(np.mean(vals)), float(min(vals)), float(max(vals))


def test_oracles_on_hand_cases():
    assert naive_ap([1, 0, 1, 0]) == pytest.approx((1 + 2 / 3) / 2)
    assert naive_ap([1, 0, 1], k=2, n_rel=4, normalization="min_k_relevant") == 0.5
    assert naive_rr([0, 0, 1]) == pytest.approx(1 / 3)
    assert naive_dcg([3, 2], gain="exponential") == pytest.approx(7 + 3 / math.log2(3))
    # two tied items, one relevant: AP is 1 or 1/2 with equal chance
    assert enumerate_stats(naive_ap, [1, 0], [1, 1]) == (0.75, 0.5, 1.0)


# ----------------------------------------------------------------- fixed cases
# a tie block straddling the cut-off k=3: positions 2..5 tie, two of them relevant
Y = [1, 0, 1, 1, 0, 0, 1]
S = [9, 5, 5, 5, 5, 2, 1]


@pytest.mark.parametrize(
    ("ours", "oracle"),
    [
        (lambda y, s, t: rk.average_precision(y, s, ties=t), naive_ap),
        (lambda y, s, t: rk.average_precision(y, s, k=3, ties=t), lambda r: naive_ap(r, k=3)),
        (
            lambda y, s, t: rk.average_precision(y, s, k=3, n_relevant=6, ties=t),
            lambda r: naive_ap(r, k=3, n_rel=6),
        ),
        (
            lambda y, s, t: rk.average_precision(
                y, s, k=3, n_relevant=6, normalization="min_k_relevant", ties=t
            ),
            lambda r: naive_ap(r, k=3, n_rel=6, normalization="min_k_relevant"),
        ),
        (lambda y, s, t: rk.precision_at_k(y, s, k=3, ties=t), lambda r: naive_p_at_k(r, 3)),
        (
            lambda y, s, t: rk.recall_at_k(y, s, k=3, n_relevant=5, ties=t),
            lambda r: naive_recall_at_k(r, 3, 5),
        ),
        (lambda y, s, t: rk.reciprocal_rank(y, s, ties=t), naive_rr),
        (lambda y, s, t: rk.reciprocal_rank(y, s, k=2, ties=t), lambda r: naive_rr(r, 2)),
        (lambda y, s, t: rk.hit_rate_at_k(y, s, k=2, ties=t), lambda r: naive_hit(r, 2)),
        (lambda y, s, t: rk.r_precision(y, s, ties=t), naive_rprec),
        (lambda y, s, t: rk.dcg(y, s, k=3, ties=t), lambda r: naive_dcg(r, 3)),
        (lambda y, s, t: rk.cumulative_gain(y, s, k=3, ties=t), lambda r: float(sum(r[:3]))),
    ],
)
def test_block_cut_by_k_expected_pessimistic_optimistic(ours, oracle):
    mean, lo, hi = enumerate_stats(oracle, Y, S)
    assert ours(Y, S, "expected") == pytest.approx(mean)
    assert ours(Y, S, "pessimistic") == pytest.approx(lo)
    assert ours(Y, S, "optimistic") == pytest.approx(hi)


def test_rr_first_relevant_inside_a_block_by_hand():
    # positions 2..4 tie, one relevant among them: rank 2, 3, 4 each with probability 1/3
    assert rk.reciprocal_rank([0, 1, 0, 0], [9, 5, 5, 5]) == pytest.approx(
        (1 / 2 + 1 / 3 + 1 / 4) / 3
    )


def test_hit_rate_expected_by_hand():
    # 4 tied items, 1 relevant, top 2 taken: hit with probability 2/4
    assert rk.hit_rate_at_k([0, 0, 1, 0], [1, 1, 1, 1], k=2) == pytest.approx(0.5)


def test_graded_dcg_exponential_ties():
    y, s = [3, 0, 2, 1, 0], [4, 4, 4, 1, 1]
    mean, lo, hi = enumerate_stats(lambda r: naive_dcg(r, 2, "exponential"), y, s)
    assert rk.dcg(y, s, k=2, gain="exponential") == pytest.approx(mean)
    assert rk.dcg(y, s, k=2, gain="exponential", ties="pessimistic") == pytest.approx(lo)
    assert rk.dcg(y, s, k=2, gain="exponential", ties="optimistic") == pytest.approx(hi)


def test_rows_are_independent_in_2d_input():
    # the same tied query twice next to an untied one: values do not leak across rows
    y = np.array([Y, Y, [1, 0, 0, 0, 0, 0, 1]])
    s = np.array([S, S, [7, 6, 5, 4, 3, 2, 1]])
    got = rk.average_precision(y, s, k=3)
    mean = enumerate_stats(lambda r: naive_ap(r, k=3), Y, S)[0]
    np.testing.assert_allclose(got, [mean, mean, 1 / 2])


# ----------------------------------------------------------------- random small cases
cases = st.lists(st.tuples(st.integers(0, 1), st.integers(0, 2)), min_size=2, max_size=6)


@settings(max_examples=30, deadline=None)
@given(cases, st.integers(1, 6))
def test_expected_equals_enumeration_random(pairs, k):
    y, s = (list(v) for v in zip(*pairs, strict=True))
    if sum(y) == 0:
        return
    k = min(k, len(y))
    checks = [
        (rk.average_precision(y, s, k=k), lambda r: naive_ap(r, k=k)),
        (rk.precision_at_k(y, s, k=k), lambda r: naive_p_at_k(r, k)),
        (rk.reciprocal_rank(y, s, k=k), lambda r: naive_rr(r, k)),
        (rk.hit_rate_at_k(y, s, k=k), lambda r: naive_hit(r, k)),
        (rk.r_precision(y, s), naive_rprec),
        (rk.dcg(y, s, k=k), lambda r: naive_dcg(r, k)),
    ]
    for value, oracle in checks:
        assert value == pytest.approx(enumerate_stats(oracle, y, s)[0])


def test_hits_normalisation_under_expected_ties_by_hand():
    """normalization="hits" divides by the hits in the top k, which varies with the order.

    Two tied items, the second relevant, k=1: AP@1 is 1 (relevant first) or 0/0 (no hit)
    with equal chance; with zero_division=0.0 the expectation is 1/2 (not E[sum]/E[hits] = 1)."""
    assert rk.average_precision([0, 1], [0, 0], k=1, normalization="hits", zero_division=0.0) == 0.5
    assert math.isnan(
        rk.average_precision([0, 1], [0, 0], k=1, normalization="hits", zero_division=math.nan)
    )


@settings(max_examples=30, deadline=None)
@given(cases, st.integers(1, 6))
def test_hits_normalisation_under_expected_ties(pairs, k):
    y, s = (list(v) for v in zip(*pairs, strict=True))
    if sum(y) == 0:
        return
    k = min(k, len(y))
    mean = enumerate_stats(lambda r: naive_ap(r, k=k, normalization="hits"), y, s)[0]
    got = rk.average_precision(y, s, k=k, normalization="hits", zero_division=0.0)
    assert got == pytest.approx(mean)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 1), st.integers(-3, 3)), min_size=2, max_size=8),
    st.sampled_from(["expected", "pessimistic", "optimistic", "threshold"]),
)
def test_strictly_increasing_transform_invariance(pairs, ties):
    y, s = (np.array(v) for v in zip(*pairs, strict=True))
    if y.sum() == 0:
        return
    s2 = np.exp(s.astype(float)) * 3 + 1  # strictly increasing: same order and same ties
    assert rk.average_precision(y, s2, ties=ties) == pytest.approx(
        rk.average_precision(y, s, ties=ties)
    )
    if ties != "threshold":
        assert rk.ndcg(y, s2, k=3, ties=ties) == pytest.approx(rk.ndcg(y, s, k=3, ties=ties))
