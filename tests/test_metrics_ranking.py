"""embedeval.metrics.ranking against hand values, scikit-learn, ranx and enumeration of tie
orders."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import embedeval as ee
from embedeval.metrics import ranking as rk


def test_hand_examples_from_the_issue():
    scores = [0.8, 0.6, 0.3, 0.2, 0.9, 0.75, 0.81, 0.92]
    rel = [1, 0, 0, 1, 0, 0, 1, 1]
    assert rk.average_precision(rel, scores) == pytest.approx((1 + 2 / 3 + 3 / 4 + 4 / 8) / 4)
    grades = [0, 2, 1, 3, 0, 2, 0, 3, 1, 3]
    collection = [3] * 5 + [2] * 10
    dcg = sum(g / math.log2(i + 2) for i, g in enumerate(grades))
    ideal = sum(g / math.log2(i + 2) for i, g in enumerate([3] * 5 + [2] * 5))
    value = rk.ndcg(grades, list(range(10, 0, -1)), k=10, ideal=collection)
    assert value == pytest.approx(dcg / ideal) and round(value, 2) == 0.49


def test_ap_at_k_normalisations_by_hand():
    rel, sc = [1, 0, 1, 0, 1], [5, 4, 3, 2, 1]
    # top 3: hits at 1 and 3 -> sum of precisions 1 + 2/3
    assert rk.average_precision(rel, sc, k=3, n_relevant=4) == pytest.approx((1 + 2 / 3) / 4)
    assert rk.average_precision(rel, sc, k=3, n_relevant=4, normalization="min_k_relevant") == (
        pytest.approx((1 + 2 / 3) / 3)
    )
    assert rk.average_precision(rel, sc, k=3, normalization="hits") == pytest.approx(
        (1 + 2 / 3) / 2
    )


def test_ap_threshold_ties_match_sklearn():
    from sklearn.metrics import average_precision_score

    rng = np.random.default_rng(0)
    for _ in range(30):
        y = rng.integers(0, 2, 40)
        if y.sum() == 0:
            continue
        s = rng.integers(0, 6, 40).astype(float)
        assert rk.average_precision(y, s, ties="threshold") == pytest.approx(
            average_precision_score(y, s)
        )


def test_ndcg_and_dcg_expected_ties_match_sklearn():
    from sklearn.metrics import dcg_score, ndcg_score

    rng = np.random.default_rng(1)
    y = rng.integers(0, 4, (50, 12)).astype(float)
    s = rng.integers(0, 4, (50, 12)).astype(float)
    np.testing.assert_allclose(
        rk.dcg(y, s, k=5), [dcg_score([a], [b], k=5) for a, b in zip(y, s, strict=True)]
    )
    ok = y.sum(1) > 0
    np.testing.assert_allclose(
        rk.ndcg(y[ok], s[ok], k=5),
        [ndcg_score([a], [b], k=5) for a, b in zip(y[ok], s[ok], strict=True)],
    )


def test_set_metrics_match_sklearn():
    from sklearn.metrics import precision_recall_fscore_support

    rng = np.random.default_rng(2)
    y = rng.integers(0, 2, (20, 30))
    p = rng.integers(0, 2, (20, 30))
    for i in range(20):
        sp, sr, sf, _ = precision_recall_fscore_support(
            y[i], p[i], average="binary", zero_division=0
        )
        assert rk.precision(y[i], p[i]) == pytest.approx(sp)
        assert rk.recall(y[i], p[i]) == pytest.approx(sr)
        assert rk.f_beta(y[i], p[i]) == pytest.approx(sf)
        f2 = precision_recall_fscore_support(y[i], p[i], beta=2, average="binary", zero_division=0)[
            2
        ]
        assert rk.f_beta(y[i], p[i], beta=2) == pytest.approx(f2)
    # micro pools the counts; macro averages per-query values
    assert rk.precision(y, p, average="micro") == pytest.approx((y * p).sum() / p.sum())
    per = [rk.precision(y[i], p[i]) for i in range(20)]
    assert rk.precision(y, p, average="macro") == pytest.approx(np.mean(per))


def test_against_ranx_without_ties():
    ranx = pytest.importorskip("ranx", reason="ranx is a test dependency")
    rng = np.random.default_rng(3)
    n_q, n = 40, 25
    y = (rng.random((n_q, n)) < 0.3).astype(int)
    y[:, 0] = np.maximum(y[:, 0], (y.sum(1) == 0))
    s = rng.permutation(n * n_q).reshape(n_q, n).astype(float)  # distinct scores
    n_rel = y.sum(1) + rng.integers(0, 3, n_q)  # relevant items outside the list
    qrels, run = {}, {}
    for q in range(n_q):
        rels = {f"d{j}": 1 for j in range(n) if y[q, j]}
        rels.update({f"x{j}": 1 for j in range(n_rel[q] - y[q].sum())})
        qrels[f"q{q:03d}"] = rels
        run[f"q{q:03d}"] = {f"d{j}": float(s[q, j]) for j in range(n)}
    got = ranx.evaluate(
        ranx.Qrels(qrels),
        ranx.Run(run),
        ["map", "precision@5", "r-precision", "mrr", "ndcg@10"],
        return_mean=False,
    )
    np.testing.assert_allclose(rk.average_precision(y, s, n_relevant=n_rel), got["map"])
    np.testing.assert_allclose(rk.precision_at_k(y, s, k=5), got["precision@5"])
    np.testing.assert_allclose(rk.r_precision(y, s, n_relevant=n_rel), got["r-precision"])
    np.testing.assert_allclose(rk.reciprocal_rank(y, s), got["mrr"])
    ideal = [[1] * int(r) for r in n_rel]
    np.testing.assert_allclose(rk.ndcg(y, s, k=10, ideal=ideal), got["ndcg@10"])


def test_ndcg_without_cutoff_uses_the_whole_collection_ideal():
    # qrels a, b, c relevant; run a: 2, x: 1.  DCG = 1/log2(2); IDCG over the three judged
    # items = 1 + 1/log2(3) + 1/log2(4), not cut at the list's length of 2.
    by_hand = 1.0 / (1.0 + 1.0 / math.log2(3) + 0.5)
    assert rk.ndcg([1, 0], [2, 1], ideal=[1, 1, 1]) == pytest.approx(by_hand)
    assert by_hand == pytest.approx(0.4693, abs=5e-5)
    # with a cut-off the ideal is cut there too: IDCG@2 = 1 + 1/log2(3)
    assert rk.ndcg([1, 0], [2, 1], k=2, ideal=[1, 1, 1]) == pytest.approx(
        1.0 / (1.0 + 1.0 / math.log2(3))
    )
    # ragged ideals: the second query's single judged item is at rank 2
    np.testing.assert_allclose(
        rk.ndcg([[1, 0], [0, 1]], [[2, 1], [2, 1]], ideal=[[1, 1, 1], [1]]),
        [by_hand, 1.0 / math.log2(3)],
    )


def test_ndcg_without_cutoff_matches_ranx_on_short_runs():
    ranx = pytest.importorskip("ranx", reason="ranx is a test dependency")
    rng = np.random.default_rng(11)
    n_q, n = 30, 6
    y = (rng.random((n_q, n)) < 0.4).astype(int)
    s = rng.permutation(n * n_q).reshape(n_q, n).astype(float)  # distinct scores
    extra = rng.integers(1, 6, n_q)  # judged relevant items the run never retrieved
    qrels = {
        f"q{q:03d}": {
            **{f"d{j}": 1 for j in range(n) if y[q, j]},
            **{f"x{j}": 1 for j in range(extra[q])},
        }
        for q in range(n_q)
    }
    run = {f"q{q:03d}": {f"d{j}": float(s[q, j]) for j in range(n)} for q in range(n_q)}
    got = ranx.evaluate(ranx.Qrels(qrels), ranx.Run(run), ["ndcg"], return_mean=False)
    ideal = [[1] * int(y[q].sum() + extra[q]) for q in range(n_q)]
    np.testing.assert_allclose(rk.ndcg(y, s, ideal=ideal), got)


def test_ndcg_of_a_single_item_list_is_one_when_graded():
    # scikit-learn refuses one-document lists; a single graded item is its own ideal ranking
    assert rk.ndcg([[1]], [[1]]).tolist() == [1.0]
    assert rk.ndcg([3], [0.2]) == 1.0


def _expected_by_enumeration(fn, y, s):
    """Mean of fn over every order of tied items (scores made distinct per permutation)."""
    n = len(y)
    vals = []
    for perm in itertools.permutations(range(n)):
        # break ties by the permutation: a tiny offset that keeps the block order
        s2 = np.array(s, dtype=float) + np.array([1e-6 * (n - perm.index(i)) for i in range(n)])
        vals.append(fn(np.array(y), s2))
    return float(np.mean(vals))


@pytest.mark.filterwarnings("ignore::embedeval.EmbedevalWarning")
@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 2)), min_size=1, max_size=5))
def test_expected_ties_equal_enumeration(pairs):
    y, s = map(np.array, zip(*pairs, strict=True))
    if y.sum() == 0:
        return
    for name, fn in [
        ("ap", lambda a, b: rk.average_precision(a, b, ties="pessimistic")),
        ("p@2", lambda a, b: rk.precision_at_k(a, b, k=2, ties="pessimistic")),
        ("rr", lambda a, b: rk.reciprocal_rank(a, b, ties="pessimistic")),
        ("hit@2", lambda a, b: rk.hit_rate_at_k(a, b, k=2, ties="pessimistic")),
        ("rprec", lambda a, b: rk.r_precision(a, b, ties="pessimistic")),
        ("dcg", lambda a, b: rk.dcg(a, b, ties="pessimistic")),
    ]:
        expected = _expected_by_enumeration(fn, y, s)
        ours = {
            "ap": rk.average_precision(y, s),
            "p@2": rk.precision_at_k(y, s, k=2),
            "rr": rk.reciprocal_rank(y, s),
            "hit@2": rk.hit_rate_at_k(y, s, k=2),
            "rprec": rk.r_precision(y, s),
            "dcg": rk.dcg(y, s),
        }[name]
        assert ours == pytest.approx(expected), name


def test_pessimistic_and_optimistic_bound_expected():
    y, s = [1, 0, 0, 1], [1, 1, 1, 0]
    lo = rk.average_precision(y, s, ties="pessimistic")
    hi = rk.average_precision(y, s, ties="optimistic")
    mid = rk.average_precision(y, s)
    assert lo < mid < hi


def test_zero_division_policy():
    with pytest.warns(ee.EmbedevalWarning, match="no relevant item"):
        assert rk.average_precision([0, 0], [1, 0]) == 0.0
    assert math.isnan(rk.average_precision([0, 0], [1, 0], zero_division=math.nan))
    assert rk.recall_at_k([0, 0], [1, 0], k=1, zero_division=1.0) == 1.0
    with pytest.raises(ee.InputError, match="zero_division"):
        rk.average_precision([0, 0], [1, 0], zero_division="skip")


def test_bad_input():
    with pytest.raises(ee.InputError, match="same 1-D or 2-D shape"):
        rk.average_precision([1, 0], [1, 0, 0])
    with pytest.raises(ee.InputError, match="NaN"):
        rk.precision_at_k([1, 0], [np.nan, 1], k=1)
    with pytest.raises(ee.InputError, match="binary"):
        rk.average_precision([2, 0], [1, 0])
    with pytest.raises(ee.InputError, match="k must be >= 1"):
        rk.precision_at_k([1, 0], [1, 0], k=0)
    with pytest.raises(ee.InputError, match="n_relevant"):
        rk.average_precision([1, 1], [1, 0], n_relevant=1)
    with pytest.raises(ee.InputError, match="ties="):
        rk.average_precision([1, 0], [1, 0], ties="random")
    with pytest.raises(ee.InputError, match="threshold"):
        rk.precision_at_k([1, 0], [1, 0], k=1, ties="threshold")


def test_quantised_scores_warn():
    with pytest.warns(ee.EmbedevalWarning, match="tie"):
        rk.average_precision([1, 0, 1, 0], [1, 1, 1, 1])


def test_from_neighbors_and_curves():
    y, s = rk.from_neighbors([[0.1, 0.2, 0.3]], [[1, -1, 0]], [3], [3, 3])
    assert y.tolist() == [[1, 0, 1]]
    assert s[0, 1] < s[0, 2] < s[0, 0]
    p, r, _ = rk.precision_recall_curve([1, 0, 1, 0], [0.9, 0.8, 0.7, 0.1])
    assert p.tolist() == [1, 0.5, 2 / 3, 0.5] and r.tolist() == [0.5, 0.5, 1, 1]
    assert rk.system_efficiency([1, 0, 1, 0], [0.9, 0.8, 0.7, 0.1]) == pytest.approx(
        1 - math.hypot(1 / 3, 0) / math.sqrt(2)
    )
    assert rk.interpolated_average_precision([1, 0, 1], [3, 2, 1], points="all") == pytest.approx(
        0.5 * 1 + 0.5 * 2 / 3
    )


def test_curves_and_interpolation_against_sklearn_and_hand():
    from sklearn.metrics import precision_recall_curve as sk_prc

    rng = np.random.default_rng(5)
    for _ in range(10):
        y = rng.integers(0, 2, 30)
        y[0] = 1
        s = rng.integers(0, 8, 30).astype(float)
        p, r, th = rk.precision_recall_curve(y, s)
        sp, sr, sth = sk_prc(y, s)
        # scikit-learn: increasing thresholds plus a final (1, 0) point
        np.testing.assert_allclose(p, sp[:-1][::-1])
        np.testing.assert_allclose(r, sr[:-1][::-1])
        np.testing.assert_allclose(th, sth[::-1])
    # 11-point by hand: hits at ranks 1 and 3 of 2 relevant -> P_interp = 1 for r <= 0.5,
    # 2/3 for r in (0.5, 1]: (6 * 1 + 5 * 2/3) / 11
    assert rk.interpolated_average_precision([1, 0, 1], [3, 2, 1]) == pytest.approx(
        (6 + 5 * 2 / 3) / 11
    )
    # a relevant item missing from the list: recall never reaches 1 -> 0 at r = 1
    assert rk.interpolated_average_precision([1, 0], [2, 1], n_relevant=2) == pytest.approx(6 / 11)


def test_ndcg_ragged_ideal_and_exponential_gain_by_hand():
    y = [[2, 0], [0, 1]]
    s = [[2, 1], [2, 1]]
    ideal = [[2, 2, 1], [1]]
    exp = [
        3 / (3 + 3 / math.log2(3)),  # (2^2 - 1) at rank 1 over two grade-2 items
        (1 / math.log2(3)) / 1.0,
    ]
    np.testing.assert_allclose(rk.ndcg(y, s, k=2, gain="exponential", ideal=ideal), exp)
    with pytest.raises(ee.InputError, match="y_true holds 960"):  # sums of 2**960 - 1 overflow
        rk.ndcg([[960, 1]], [[0.9, 0.1]], gain="exponential")
    # hit rate, recall@k by hand
    assert rk.hit_rate_at_k([0, 0, 1], [3, 2, 1], k=2) == 0.0
    assert rk.recall_at_k([1, 0, 1], [3, 2, 1], k=2) == 0.5
    assert rk.mean_average_precision([[1, 0, 1]], [[3, 2, 1]]) == pytest.approx((1 + 2 / 3) / 2)


def test_f_beta_trec_eval_beta_squared_convention():
    # P = 1/2, R = 1/3: true F_2 = 5 * P R / (4 P + R); trec_eval's set_F.4 means beta = 2
    y, p = [1, 1, 1, 0], [1, 0, 0, 1]
    assert rk.f_beta(y, p, beta=2) == pytest.approx(5 * (1 / 6) / (2 + 1 / 3))


def test_from_neighbors_matches_a_loop_and_feeds_metrics():
    d = np.array([[0.1, 0.2, 0.3], [0.5, 0.6, 0.9]])
    i = np.array([[0, 2, 1], [1, 2, 0]])
    ql, rl = np.array([7, 8]), np.array([7, 8, 7])
    y, s = rk.from_neighbors(d, i, ql, rl)
    loop = [[float(rl[i[q, j]] == ql[q]) for j in range(3)] for q in range(2)]
    assert y.tolist() == loop
    np.testing.assert_allclose(rk.average_precision(y, s), [1.0, 1.0])
    # similarities: higher is better, so the order flips
    y2, s2 = rk.from_neighbors(d, i, ql, rl, higher_is_better=True)
    np.testing.assert_allclose(rk.reciprocal_rank(y2, s2), [1 / 2, 1 / 3])


def test_from_neighbors_names_a_distance_beyond_64_bits():
    d = np.array([[2**70, 1]], dtype=object)
    with pytest.raises(ee.InputError, match=f"distances holds the integer {2**70}, beyond 64"):
        rk.from_neighbors(d, [[0, 1]], [0], [0, 1])
    with pytest.raises(ee.InputError, match=f"indices holds the integer {2**70}, beyond 64"):
        rk.from_neighbors([[0.5, 1.0]], [[2**70, 1]], [0], [0, 1])


def test_more_bad_input():
    with pytest.raises(ee.InputError, match="object"):
        rk.average_precision(np.array([1, 0], dtype=object), [1, 0])
    with pytest.raises(ee.InputError, match=r"y_score holds the integer 1180591620717411303424"):
        rk.average_precision([1, 0], [2**70, 1])
    with pytest.raises(ee.InputError, match="empty"):
        rk.average_precision([], [])
    with pytest.raises(ee.InputError, match="1-D or 2-D"):
        rk.average_precision(np.ones((2, 2, 2)), np.ones((2, 2, 2)))
    with pytest.raises(ee.InputError, match=">= 0"):
        rk.dcg([-1, 0], [1, 0])
    with pytest.raises(ee.InputError, match="k must"):
        rk.ndcg([1, 0], [1, 0], k=1.5)
    with pytest.raises(ee.InputError, match="normalization"):
        rk.average_precision([1, 0], [1, 0], normalization="all")
    with pytest.raises(ee.InputError, match="gain"):
        rk.dcg([1, 0], [1, 0], gain="log")
    with pytest.raises(ee.InputError, match="ideal has 1 rows"):
        rk.ndcg([[1, 0], [0, 1]], [[1, 0], [1, 0]], ideal=[[1, 1, 1]])
    with pytest.raises(ee.InputError, match="average"):
        rk.precision([1, 0], [1, 0], average="weighted")
    with pytest.raises(ee.InputError, match="beta"):
        rk.f_beta([1, 0], [1, 0], beta=0)
    with pytest.raises(ee.InputError, match="y_pred must be binary"):
        rk.precision([1, 0], [2, 0])
    with pytest.raises(ee.InputError, match="no closed-form"):
        rk.interpolated_average_precision([1, 0], [1, 0], ties="expected")
    with pytest.raises(ee.InputError, match="points"):
        rk.interpolated_average_precision([1, 0], [1, 0], points=1)
    with pytest.raises(ee.InputError, match="one query"):
        rk.precision_recall_curve([[1, 0]], [[1, 0]])
    with pytest.raises(ee.InputError, match="pass y_true and y_score"):
        rk.system_efficiency()
    with pytest.raises(ee.InputError, match="same shape"):
        rk.system_efficiency(precision=[1.0], recall=[1.0, 0.5])
    with pytest.raises(ee.InputError, match="2-D of one shape"):
        rk.from_neighbors([[0.1]], [[0, 1]], [1], [1, 1])
    with pytest.raises(ee.InputError, match="query_labels has 2"):
        rk.from_neighbors([[0.1]], [[0]], [1, 2], [1, 1])


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (math.nan, "not a whole number"),
        (2.5, "not a whole number"),
        ([1, 2, 3], "one per query"),
        ("a", "one per query"),
        ("3", "one per query"),
        ([3, "3"], "one per query"),
    ],
)
def test_bad_n_relevant(value, match):
    with pytest.raises(ee.InputError, match=match):
        rk.average_precision([[1, 0], [1, 0]], [[1, 0], [1, 0]], n_relevant=value)


@pytest.mark.parametrize(
    ("ideal", "match"),
    [
        ([math.nan, 1], r"ideal has 1 grade"),
        ([-1, 1], r"negative"),
    ],
)
def test_bad_ideal_grades_single(ideal, match):
    with pytest.raises(ee.InputError, match=match):
        rk.ndcg([1, 0], [1, 0], ideal=ideal)


def test_bad_ideal_grades_ragged_and_rectangular():
    with pytest.raises(ee.InputError, match=r"ideal \(row 1\)"):
        rk.ndcg([[1, 0], [0, 1]], [[1, 0], [1, 0]], ideal=[[1], [1, math.nan]])
    with pytest.raises(ee.InputError, match="first at \\(1, 0\\)"):
        rk.ndcg([[1, 0], [0, 1]], [[1, 0], [1, 0]], ideal=[[1, 1], [-2, 1]])


# ----------------------------------------------------------------- AP@k and ties, more cases
def test_ap_at_k_min_k_relevant_divides_by_the_k_asked_even_past_the_list():
    # 3 retrieved of a collection with 5 relevant, AP@10: hits at 1 and 3 -> 1 + 2/3 over
    # min(k=10, R=5) = 5 (not min(3, 5) = 3: the list being short does not change k)
    got = rk.average_precision(
        [1, 0, 1], [3, 2, 1], k=10, n_relevant=5, normalization="min_k_relevant"
    )
    assert got == pytest.approx((1 + 2 / 3) / 5)


def test_interpolated_ap_follows_the_zero_division_policy_in_both_modes():
    for points in (11, "all"):
        assert (
            rk.interpolated_average_precision([0, 0], [2, 1], points=points, zero_division=1.0) == 1
        )
        assert math.isnan(
            rk.interpolated_average_precision([0, 0], [2, 1], points=points, zero_division=math.nan)
        )
        with pytest.warns(ee.EmbedevalWarning, match="no relevant item"):
            assert rk.interpolated_average_precision([0, 0], [2, 1], points=points) == 0.0
    # a row without relevant items does not disturb its neighbour
    got = rk.interpolated_average_precision(
        [[1, 0, 1], [0, 0, 0]], [[3, 2, 1]] * 2, zero_division=1.0
    )
    np.testing.assert_allclose(got, [(6 + 5 * 2 / 3) / 11, 1.0])
    with pytest.raises(ee.InputError, match="Did you mean 'all'"):
        rk.interpolated_average_precision([1, 0], [1, 0], points="al")


def test_precision_recall_curve_zero_division_argument():
    p, r, _ = rk.precision_recall_curve([0, 0], [1, 0], zero_division=math.nan)
    assert p.tolist() == [0, 0] and np.isnan(r).all()
    with pytest.warns(ee.EmbedevalWarning, match="no relevant item"):
        rk.precision_recall_curve([0, 0], [1, 0])


@pytest.mark.parametrize(
    ("y_true", "y_score", "match"),
    [
        (["a", "b"], [1, 0], "y_true must be numeric"),
        ([1, 0], ["x", "y"], "y_score must be numeric"),
    ],
)
def test_non_numeric_relevance_or_scores(y_true, y_score, match):
    with pytest.raises(ee.InputError, match=match):
        rk.average_precision(y_true, y_score)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (([[np.nan, 0.2]], [[0, 1]], [1], [1, 1]), r"distances has NaN.*first at \(0, 0\)"),
        (([[0.1, 0.2]], [[0, 5]], [1], [1, 1]), r"indices\[0, 1\] = 5 is out of range for 2"),
        (([[0.1]], [[0.5]], [1], [1]), "indices integer"),
        (([[0.1]], [[0]], [1], [[1, 2], [3, 4]]), "reference_labels must be 1-D"),
    ],
)
def test_from_neighbors_bad_input(args, match):
    with pytest.raises(ee.InputError, match=match):
        rk.from_neighbors(*args)


def test_from_neighbors_accepts_nan_only_at_faiss_padding():
    y, s = rk.from_neighbors([[0.1, np.inf]], [[0, -1]], [1], [1])
    assert y.tolist() == [[1, 0]] and s[0, 0] > s[0, 1]


# ----------------------------------------------------------------- queries aligned by id
def _random_qrels_run(rng, n_q=30):
    qrels, run = {}, {}
    for q in range(n_q):
        docs = [f"d{j}" for j in range(40)]
        judged = rng.choice(40, int(rng.integers(1, 12)), replace=False)
        qrels[f"q{q}"] = {docs[j]: int(rng.integers(1, 4)) for j in judged}
        if rng.random() < 0.5:  # judged non-relevant documents as well
            qrels[f"q{q}"][f"n{q}"] = 0
        retrieved = rng.choice(40, int(rng.integers(3, 25)), replace=False)  # ragged runs
        run[f"q{q}"] = {docs[j]: float(rng.random()) for j in retrieved}
    # dict order differs between the two: alignment must go by id
    run = dict(reversed(list(run.items())))
    return qrels, run


def test_align_by_id_matches_ranx_on_ragged_graded_runs():
    ranx = pytest.importorskip("ranx", reason="ranx is a test dependency")
    rng = np.random.default_rng(21)
    qrels, run = _random_qrels_run(rng)
    a = rk.align_by_id(qrels, run)
    assert a.query_ids == list(qrels)
    got = ranx.evaluate(
        ranx.Qrels(qrels),
        ranx.Run(run),
        [
            "map",
            "map@10",
            "precision@5",
            "r-precision",
            "mrr",
            "ndcg@10",
            "ndcg_burges@10",
            "recall@10",
        ],
        return_mean=False,
    )
    # ranx returns queries in its own (sorted) order: compare by id, never by position
    order = sorted(range(len(a.query_ids)), key=lambda i: a.query_ids[i])
    rel = a.y_true > 0
    checks = {
        "map": rk.average_precision(rel, a.y_score, n_relevant=a.n_relevant),
        "map@10": rk.average_precision(rel, a.y_score, k=10, n_relevant=a.n_relevant),
        "precision@5": rk.precision_at_k(rel, a.y_score, k=5),
        "r-precision": rk.r_precision(rel, a.y_score, n_relevant=a.n_relevant),
        "mrr": rk.reciprocal_rank(rel, a.y_score),
        # ranx's ndcg is the linear gain (trec_eval's), ndcg_burges the exponential one
        "ndcg@10": rk.ndcg(a.y_true, a.y_score, k=10, ideal=a.ideal),
        "ndcg_burges@10": rk.ndcg(a.y_true, a.y_score, k=10, ideal=a.ideal, gain="exponential"),
        "recall@10": rk.recall_at_k(rel, a.y_score, k=10, n_relevant=a.n_relevant),
    }
    for name, ours in checks.items():
        np.testing.assert_allclose(ours[order], got[name], err_msg=name)


def test_align_by_id_hand_case_and_padding():
    a = rk.align_by_id(
        {"q1": {"a": 1, "b": 2, "c": 0}, "q2": {"z": 1}},
        {"q2": {"z": 5.0}, "q1": {"x": 0.9, "b": 0.5, "a": 0.7}},
    )
    assert a.query_ids == ["q1", "q2"]
    assert a.y_true.tolist() == [[0, 2, 1], [1, 0, 0]]  # run order kept; unjudged x -> 0
    assert a.n_relevant.tolist() == [2, 1]
    assert sorted(a.ideal[0].tolist()) == [0, 1, 2]
    # padding sits strictly below the retrieved item and creates no tie
    assert a.y_score[1, 0] > a.y_score[1, 1] > a.y_score[1, 2]
    # q1 ranked: x (0), a (1), b (1): AP = (1/2 + 2/3) / 2; q2: AP 1; P@3 divides by 3
    np.testing.assert_allclose(
        rk.average_precision(a.y_true > 0, a.y_score, n_relevant=a.n_relevant),
        [(1 / 2 + 2 / 3) / 2, 1.0],
    )
    np.testing.assert_allclose(rk.precision_at_k(a.y_true > 0, a.y_score, k=3), [2 / 3, 1 / 3])
    # an empty run scores the query 0 on purpose
    e = rk.align_by_id({"q1": {"a": 1}, "q2": {"b": 1}}, {"q1": {"a": 1.0}, "q2": {}})
    np.testing.assert_allclose(rk.reciprocal_rank(e.y_true > 0, e.y_score), [1.0, 0.0])
    # huge scores: padding still strictly below and distinct
    h = rk.align_by_id(
        {"q": {"a": 1}, "r": {"b": 1}}, {"q": {"a": 1e20}, "r": {"b": 1, "c": 2, "d": 3}}
    )
    assert h.y_score[0, 0] > h.y_score[0, 1] > h.y_score[0, 2]


@pytest.mark.parametrize(
    ("qrels", "run", "match"),
    [
        (
            {"q1": {"a": 1}, "q2": {"b": 1}},
            {"q1": {"a": 1.0}},
            r"1 only in qrels \(e.g. \['q2'\]\)",
        ),
        (
            {"q1": {"a": 1}},
            {"q1": {"a": 1.0}, "q9": {"a": 1.0}},
            r"1 only in run \(e.g. \['q9'\]\)",
        ),
        ({}, {"q1": {"a": 1.0}}, "qrels must be a non-empty dict"),
        ({"q1": {"a": 1}}, [("q1", "a", 1.0)], "run must be a non-empty dict"),
        ({"q1": {"a": 1}}, {"q1": ["a"]}, r"run\['q1'\] must be a dict"),
        (
            {"q1": {"a": 1}},
            {"q1": {"a": "high"}},
            r"run\['q1'\] holds a value that is not a number",
        ),
        ({"q1": {"a": 1}}, {"q1": {"a": math.nan}}, r"run\['q1'\] has a NaN"),
        ({"q1": {"a": -1}}, {"q1": {"a": 1.0}}, r"qrels\['q1'\] has a grade"),
        ({"q1": {"a": 1}}, {"q1": {}}, "every run is empty"),
    ],
)
def test_align_by_id_bad_input(qrels, run, match):
    with pytest.raises(ee.InputError, match=match):
        rk.align_by_id(qrels, run)


def _naive_ndcg(grades, k, ideal):
    dcg = sum(g / math.log2(i + 2) for i, g in enumerate(grades[:k]))
    best = sorted(ideal, reverse=True)[:k]
    return dcg / sum(g / math.log2(i + 2) for i, g in enumerate(best))


def test_ndcg_with_collection_ideal_expected_ties_by_enumeration():
    y, s = [2, 0, 3, 1, 0], [4, 4, 4, 2, 2]
    ideal = [3, 3, 2, 2, 1]
    vals = []
    for perm in itertools.permutations(range(5)):
        order = sorted(range(5), key=lambda i: (-s[i], perm.index(i)))
        vals.append(_naive_ndcg([y[i] for i in order], 3, ideal))
    assert rk.ndcg(y, s, k=3, ideal=ideal) == pytest.approx(np.mean(vals))
    assert rk.ndcg(y, s, k=3, ideal=ideal, ties="pessimistic") == pytest.approx(min(vals))
    assert rk.ndcg(y, s, k=3, ideal=ideal, ties="optimistic") == pytest.approx(max(vals))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"precision": [np.nan, 1.0], "recall": [1.0, 0.5]}, r"first at index 0 \(precision nan"),
        ({"precision": [1.0, 1.5], "recall": [0.5, 1.0]}, r"\[0, 1\]; 1 point\(s\)"),
        ({"precision": ["a"], "recall": [1.0]}, "arrays of numbers"),
    ],
)
def test_system_efficiency_rejects_points_outside_the_unit_square(kwargs, match):
    with pytest.raises(ee.InputError, match=match):
        rk.system_efficiency(**kwargs)


@pytest.mark.parametrize(
    ("y", "ideal", "match"),
    [
        ([3, 0, 1], [1, 1, 1], r"row 0\).*position 1 of the list has grade 3 but ideal has 1"),
        ([[3, 0, 1], [1, 0, 0]], [[3, 1], [0]], r"row 1\).*position 1 of the list has grade 1"),
        ([[3, 0, 1], [1, 0, 0]], [[3, 1, 0], [0, 0, 0]], r"row 1\)"),
        ([[3, 0, 1], [1, 0, 0]], [1, 2], "one 1-D list of grades per query"),
    ],
)
def test_ndcg_ideal_must_hold_the_retrieved_grades(y, ideal, match):
    # an ideal that misses a retrieved grade would give nDCG > 1: an error, not a silent number
    s = np.tile([3.0, 2.0, 1.0], (np.atleast_2d(y).shape[0], 1))
    with pytest.raises(ee.InputError, match=match):
        rk.ndcg(y, s if np.ndim(y) == 2 else s[0], ideal=ideal)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: rk.average_precision([1, 0], [1, 0], ties="expectd"), "Did you mean 'expected'"),
        (
            lambda: rk.average_precision([1, 0], [1, 0], normalization="hit"),
            "Did you mean 'hits'",
        ),
        (lambda: rk.dcg([1, 0], [1, 0], gain="exponentail"), "Did you mean 'exponential'"),
        (lambda: rk.precision([1, 0], [1, 0], average="mcro"), "Did you mean 'micro'"),
        (lambda: rk.recall_at_k([1, 0], [1, 0], k=1, zero_division="nan"), "zero_division must"),
    ],
)
def test_unknown_option_names_suggest_the_nearest(call, match):
    with pytest.raises(ee.InputError, match=match):
        call()


def test_from_neighbors_padding_is_distinct_finite_and_last():
    import warnings

    d = [[0.1, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    i = [[0, -1, -1, -1], [-1, -1, -1, -1]]  # faiss found 1 and 0 neighbours
    y, s = rk.from_neighbors(d, i, [1, 1], [1])
    assert y.tolist() == [[1, 0, 0, 0], [0, 0, 0, 0]]
    assert np.isfinite(s).all()
    assert (np.diff(s, axis=1) < 0).all()  # strictly decreasing: no tie among the padding
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "quantised scores" tie warning from padding
        np.testing.assert_allclose(rk.average_precision(y[:1], s[:1]), [1.0])
        assert rk.reciprocal_rank(y[1], s[1]) == 0.0


def _naive_interpolated(rel, score, n_rel, points, ties):
    """Plain loops: PR points at every position (or at each tie block's end for 'threshold')."""
    order = sorted(
        range(len(rel)), key=lambda i: (-score[i], rel[i] if ties == "pessimistic" else -rel[i])
    )
    ranked = [rel[i] for i in order]
    s_sorted = [score[i] for i in order]
    pts = []
    hits = 0
    for i, x in enumerate(ranked):
        hits += x
        last_of_block = i == len(ranked) - 1 or s_sorted[i + 1] != s_sorted[i]
        if ties != "threshold" or last_of_block:
            pts.append((hits / (i + 1), hits / n_rel))

    def interp(r):
        cands = [p for p, rc in pts if rc >= r - 1e-12]
        return max(cands) if cands else 0.0

    if points == "all":
        total, prev = 0.0, 0.0
        for _, rc in pts:
            total += (rc - prev) * interp(rc)
            prev = rc
        return total
    return sum(interp(j / (points - 1)) for j in range(points)) / points


@pytest.mark.parametrize("ties", ["threshold", "pessimistic", "optimistic"])
@pytest.mark.parametrize("points", [11, 5, "all"])
def test_interpolated_ap_against_plain_loops(ties, points):
    rng = np.random.default_rng(31)
    for _ in range(25):
        n = int(rng.integers(2, 15))
        rel = rng.integers(0, 2, n)
        if rel.sum() == 0:
            rel[0] = 1
        score = rng.integers(0, 4, n).astype(float)
        n_rel = int(rel.sum() + rng.integers(0, 3))
        want = _naive_interpolated(rel.tolist(), score.tolist(), n_rel, points, ties)
        got = rk.interpolated_average_precision(
            rel, score, points=points, ties=ties, n_relevant=n_rel
        )
        assert got == pytest.approx(want)


def test_micro_set_metrics_equal_sklearn_on_the_pooled_flags():
    from sklearn.metrics import precision_recall_fscore_support

    rng = np.random.default_rng(32)
    y = rng.integers(0, 2, (15, 20))
    p = rng.integers(0, 2, (15, 20))
    sp, sr, sf, _ = precision_recall_fscore_support(
        y.ravel(), p.ravel(), average="binary", beta=0.5
    )
    assert rk.precision(y, p, average="micro") == pytest.approx(sp)
    assert rk.recall(y, p, average="micro") == pytest.approx(sr)
    assert rk.f_beta(y, p, beta=0.5, average="micro") == pytest.approx(sf)
    # fall-out by a plain loop over queries (macro) and pooled (micro)
    per = [
        sum(1 for a, b in zip(yy, pp, strict=True) if b and not a) / sum(1 for a in yy if not a)
        for yy, pp in zip(y, p, strict=True)
    ]
    np.testing.assert_allclose(rk.fallout(y, p, average="none"), per)
    assert rk.fallout(y, p) == pytest.approx(np.mean(per))
    assert rk.fallout(y, p, average="micro") == pytest.approx(((1 - y) * p).sum() / (1 - y).sum())


# Tie handling in embedeval.metrics.ranking against brute-force enumeration of every order of tied
# items.


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


def _threshold_ap_at_k_over_orders(rel, score, k, normalization):
    """Mean over every order of the tied items of the threshold rule's AP@k terms: precision
    read at the end of each tie block, summed over the relevant items of the top k."""
    rel, score = np.asarray(rel), np.asarray(score, dtype=float)
    blocks = [np.flatnonzero(score == v) for v in sorted(set(score.tolist()), reverse=True)]
    totals, dens = [], []
    for perm in itertools.product(*(itertools.permutations(b) for b in blocks)):
        order = [i for b in perm for i in b]
        r = rel[order]
        prec = [rel[score >= score[i]].sum() / (score >= score[i]).sum() for i in order]
        totals.append(sum(r[i] * prec[i] for i in range(k)))
        dens.append(r[:k].sum() if normalization == "hits" else rel.sum())
    return np.mean(totals) / np.mean(dens) if np.mean(dens) else 0.0


@pytest.mark.parametrize("normalization", ["relevant", "hits"])
def test_ap_threshold_with_a_tie_block_cut_by_k_ignores_the_input_order(normalization):
    # [1, 0, 1] all tied, k = 1: one item of the block is taken, 2/3 of a hit at precision 2/3
    for rel in ([1, 0, 1], [0, 1, 1], [1, 1, 0]):
        value = rk.average_precision(rel, [1, 1, 1], k=1, ties="threshold")
        assert value == pytest.approx(2 / 9)
    rng = np.random.default_rng(3)
    for _ in range(60):
        n = int(rng.integers(2, 7))
        rel = rng.integers(0, 2, n)
        rel[0] = 1
        score = rng.integers(0, 3, n).astype(float)
        for k in range(1, n + 1):
            want = _threshold_ap_at_k_over_orders(rel, score, k, normalization)
            for perm in (np.arange(n), rng.permutation(n)):
                got = rk.average_precision(
                    rel[perm],
                    score[perm],
                    k=k,
                    ties="threshold",
                    normalization=normalization,
                    zero_division=0.0,
                )
                assert got == pytest.approx(want)


@pytest.mark.parametrize("beta", [np.float32(2.0), np.int64(2), np.float64(0.5), 3])
def test_f_beta_takes_numpy_scalars_like_sklearn(beta):
    from sklearn.metrics import fbeta_score

    t, p = [1, 1, 0, 1, 0], [1, 0, 1, 0, 0]
    assert rk.f_beta(t, p, beta=beta) == pytest.approx(fbeta_score(t, p, beta=float(beta)))


@pytest.mark.parametrize("beta", [math.inf, -1.0, 0, math.nan, True, "2"])
def test_f_beta_refuses_a_beta_that_is_not_finite_and_positive(beta):
    with pytest.raises(ee.InputError, match="beta must be a positive number"):
        rk.f_beta([1, 0], [1, 1], beta=beta)


@pytest.mark.parametrize("fill", [np.float32(np.nan), np.int64(1), np.float16(0.0)])
def test_zero_division_takes_numpy_scalars_like_sklearn(fill):
    from sklearn.metrics import precision_score

    want = precision_score([1, 0], [0, 0], zero_division=float(fill))
    got = rk.precision([1, 0], [0, 0], zero_division=fill)
    assert got == pytest.approx(want, nan_ok=True)
    assert rk.average_precision([0, 0], [1, 2], zero_division=fill) == pytest.approx(
        float(fill), nan_ok=True
    )


@pytest.mark.parametrize(
    ("y_true", "y_score", "match"),
    [
        ([[1, 0], [1]], [[0.5, 0.2], [0.3]], "y_true has rows of different lengths"),
        ([[1, 0], [1, 0]], [[0.5, 0.2], [0.3]], "y_score has rows of different lengths"),
    ],
)
def test_ragged_rows_are_an_error_naming_the_argument(y_true, y_score, match):
    with pytest.raises(ee.InputError, match=match):
        rk.average_precision(y_true, y_score)


@pytest.mark.parametrize(
    ("y_true", "y_score", "ideal", "match"),
    [
        ([1, 0], [2, 1], ["a", "b"], r"ideal must be a list of numeric grades"),
        ([1, 0], [2, 1], {"d1": 1}, r"ideal must be a list of numeric grades"),
        ([1, 0], [2, 1], (g for g in [1, 1]), r"ideal must be a list of numeric grades"),
        ([1, 0], [2, 1], [[1, 1], [1]], r"ideal must be a list of numeric grades"),
        ([[1, 0]] * 2, [[2, 1]] * 2, [[1], ["x", 2]], r"ideal \(row 1\) must be a list"),
    ],
)
def test_ndcg_non_numeric_ideal_is_an_error_naming_it(y_true, y_score, ideal, match):
    with pytest.raises(ee.InputError, match=match):
        rk.ndcg(y_true, y_score, ideal=ideal)


@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
def test_integer_scores_float64_cannot_separate_are_an_error(dtype):
    from sklearn.metrics import average_precision_score

    big = np.array([[2**53 + 1, 2**53, 2**53 + 3], [2**54 + 5, 2**54 + 1, 2**54]], dtype=dtype)
    rel = np.array([[1, 0, 0], [0, 1, 0]])
    with pytest.raises(ee.InputError, match="y_score holds the distinct integers"):
        rk.average_precision(rel, big)
    with pytest.raises(ee.InputError, match="y_score holds the distinct integers"):
        rk.precision_at_k(rel[0], big[0], k=1)
    # the remedy the message gives keeps every order: scikit-learn sorts the integers exactly
    shifted = big - big.min(axis=1, keepdims=True)
    want = [average_precision_score(r, s) for r, s in zip(rel, big, strict=True)]
    np.testing.assert_allclose(rk.average_precision(rel, shifted, ties="threshold"), want)
    # distinct as float64: no error
    assert rk.average_precision([1, 0], np.array([2**53 + 2, 2**53], dtype=dtype)) == 1.0


@pytest.mark.parametrize(
    "scores",
    [
        {"a": 2**53, "b": 2**53 + 1},  # Python ints
        {"a": np.int64(2**53 + 1), "b": np.int64(2**53)},  # NumPy ints
        {"a": 2**70 + 1, "b": 2**70},  # beyond int64
        {"a": 2**53 + 1, "b": float(2**53)},  # an int and the float it rounds to
    ],
)
def test_align_by_id_refuses_scores_float64_cannot_separate(scores):
    # Exactly, b ranks above a (or below): AP is 1 or 1/2, never the 3/4 of a silent tie.
    with pytest.raises(ee.InputError, match=r"run\['q'\] holds the distinct scores"):
        rk.align_by_id({"q": {"a": 1}}, {"q": scores})
    # equal values, and distinct integers float64 keeps apart, are fine
    same = rk.align_by_id({"q": {"a": 1}}, {"q": {"a": 2**60, "b": float(2**60)}})
    assert same.y_score[0, 0] == same.y_score[0, 1]
    apart = rk.align_by_id({"q": {"a": 1}}, {"q": {"a": 2**53 + 2, "b": 2**53}})
    assert rk.average_precision(apart.y_true > 0, apart.y_score).tolist() == [1.0]


def test_from_neighbors_refuses_distances_float64_cannot_separate():
    d = np.array([[2**53, 2**53 + 1]], dtype=np.int64)
    with pytest.raises(ee.InputError, match="distances holds the distinct integers"):
        rk.from_neighbors(d, [[0, 1]], [0], [0, 1])
    # faiss padding (index -1) is not a real distance and is not compared
    pad = np.array([[2**53 + 1, np.iinfo(np.int64).max]], dtype=np.int64)
    y, s = rk.from_neighbors(pad, [[0, -1]], [0], [0, 1])
    assert y.tolist() == [[1.0, 0.0]] and s[0, 0] > s[0, 1]


@pytest.mark.parametrize("floor", [-1e308, 1e308, -1e300, 5e307])
def test_padding_stays_finite_and_below_near_the_float64_limit(floor):
    # align_by_id pads the short run of q below its one score (relevant, ranked first)
    a = rk.align_by_id(
        {"q": {"a": 1}, "r": {"b": 1}}, {"q": {"a": floor}, "r": {"b": 3.0, "c": 2.0, "d": 1.0}}
    )
    row = a.y_score[0]
    assert np.isfinite(row).all() and (row[1:] < row[:-1]).all()
    assert rk.average_precision(a.y_true > 0, a.y_score).tolist() == [1.0, 1.0]
    # from_neighbors pads below the best-is-highest score -distance
    y, s = rk.from_neighbors([[-floor, 0.0, 0.0]], [[0, -1, -1]], [1], [1])
    assert np.isfinite(s).all() and (s[0, 1:] < s[0, :-1]).all() and y.tolist() == [[1, 0, 0]]
    assert rk.reciprocal_rank(y, s).tolist() == [1.0]


def test_padding_below_the_lowest_float64_is_an_error_naming_the_input():
    lowest = -np.finfo(np.float64).max
    with pytest.raises(ee.InputError, match=r"run\['q'\] holds .*too close to the float64 limit"):
        rk.align_by_id({"q": {"a": 1}, "r": {"b": 1}}, {"q": {"a": lowest}, "r": {"b": 1, "c": 2}})
    with pytest.raises(ee.InputError, match="distances holds .*too close to the float64 limit"):
        rk.from_neighbors([[-lowest, 0.0]], [[0, -1]], [1], [1])


@pytest.mark.parametrize(
    ("ideal", "where"),
    [([2000, 1], r"ideal holds 2000"), ([[1], [1, 2000]], r"ideal \(row 1\) holds 2000")],
)
def test_exponential_gain_grade_limit_names_the_ideal_that_holds_it(ideal, where):
    y = [[1, 0], [1, 0]] if isinstance(ideal[0], list) else [1, 0]
    s = [[2, 1], [2, 1]] if isinstance(ideal[0], list) else [2, 1]
    with pytest.raises(ee.InputError, match=where):
        rk.ndcg(y, s, gain="exponential", ideal=ideal)


@pytest.mark.parametrize(
    ("y_true", "y_score", "ideal"),
    [
        ([1, 0], [2, 1], 3),  # a number is not the collection's grades (was read as [3])
        ([1, 0], [2, 1], [[[1, 1]]]),
        ([[1, 0]] * 2, [[2, 1]] * 2, 3),
        ([[1, 0]] * 2, [[2, 1]] * 2, [[[1, 1]], [[1]]]),
    ],
)
def test_ndcg_ideal_that_is_not_one_list_per_query_is_an_error(y_true, y_score, ideal):
    with pytest.raises(ee.InputError, match="ideal must be one 1-D list of grades per query"):
        rk.ndcg(y_true, y_score, ideal=ideal)


@pytest.mark.parametrize(
    "y_score",
    [
        [2**53 + 1, 2**53, 0.5],  # a float in the list makes NumPy cast the ints at once
        [2**53 + 1, 2.0**53, 0],  # an int and the float it rounds to
        (np.int64(2**53 + 1), 2**53, 0.25),  # NumPy ints too, in a tuple
    ],
)
def test_a_list_mixing_ints_and_floats_refuses_integers_float64_merges(y_score):
    # Exactly, item 0 ranks first: AP 1; a silent tie would give 3/4.
    with pytest.raises(ee.InputError, match="y_score holds the distinct integers"):
        rk.average_precision([1, 0, 0], y_score)
    with pytest.raises(ee.InputError, match="y_score holds the distinct integers"):
        rk.ndcg([[1, 0, 0]], [list(y_score)])
    # equal values, and floats alone (no integer to lose), are fine
    assert rk.average_precision([1, 0, 0], [2**60, 2.0**60, 0.5]) == 0.75
    assert rk.average_precision([1, 0, 0], [2.0**60 + 2**8, 2.0**60, 0.5]) == 1.0
