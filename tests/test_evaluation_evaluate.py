"""Hand-computed cases for ``embedeval.evaluate``: every expected value is a fraction worked out
in the comments, independent of the package and of tests/oracle.py."""

from __future__ import annotations

import itertools
import math
import warnings
from fractions import Fraction as F

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import embedeval as ee
from embedeval.utils.errors import EmbedevalWarning
from tests import oracle

ALL = ["precision_at_1", "r_precision", "map_at_r", "map", "mrr", "recall_at_1", "recall_at_2"]


def ev(*args, **kw):
    kw.setdefault("progress", False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ee.evaluate(*args, **kw)


def close(x, frac):
    assert isinstance(x, float)
    assert x == pytest.approx(float(frac), abs=1e-12)


# 1-D points 0, 1, 3, 6 labelled a, a, b, a, leave-one-out, Euclidean:
# q0 -> 1(a) 3(b) 6(a): rel 1 0 1, R 2    q1 -> 0(a) 3(b) 6(a): rel 1 0 1, R 2
# q2 -> the only b: lone                   q3 -> 3(b) 1(a) 0(a): rel 0 1 1, R 2
X1 = np.array([[0.0], [1.0], [3.0], [6.0]])
Y1 = ["a", "a", "b", "a"]


def test_leave_one_out_exact_depth():
    res = ev(X1, Y1, metrics=ALL)
    close(res["precision_at_1"], F(2, 3))
    close(res["r_precision"], F(1, 2))  # 1/2 for each of the three
    close(res["map_at_r"], (F(1, 2) + F(1, 2) + F(1, 4)) / 3)  # q3: (0 + 1/2)/2
    close(res["map"], (F(5, 6) + F(5, 6) + F(7, 12)) / 3)  # q3: (1/2 + 2/3)/2
    close(res["mrr"], (1 + 1 + F(1, 2)) / 3)
    close(res["recall_at_1"], F(2, 3))
    close(res["recall_at_2"], 1)
    assert res.n_lone == 1 and res.n_queries == 4
    np.testing.assert_allclose(res.per_query["map_at_r"], [0.5, 0.5, np.nan, 0.25])
    assert res.per_query["map"].dtype == np.float64
    # the lone class has no per-class value; the other is keyed by the caller's label
    assert set(res.per_class["map"]) == {"a"}
    close(res.per_class["map"]["a"], F(3, 4))


def test_leave_one_out_int_k_below_r():
    res = ev(X1, Y1, metrics=["r_precision", "map_at_r", "map", "mrr", "precision_at_1"], k=1)
    close(res["r_precision"], F(2, 3))  # window min(R, k) = 1: 1, 1, 0
    close(res["map_at_r"], (F(1, 2) + F(1, 2) + 0) / 3)  # divisor stays R = 2
    close(res["map"], (F(1, 2) + F(1, 2) + 0) / 3)  # only rank 1 counts, divisor R
    close(res["mrr"], F(2, 3))  # q3's first hit at rank 2 > k -> 0
    close(res["precision_at_1"], F(2, 3))


def test_k_larger_than_the_reference_set_is_clamped():
    res = ev(X1, Y1, metrics=["map", "map_at_r", "mrr"], k=50)
    close(res["map"], F(3, 4))
    close(res["map_at_r"], F(5, 12))
    close(res["mrr"], F(5, 6))


def test_max_bin_count_is_the_largest_r():
    # largest R is 2, so k="max_bin_count" equals k=None here for R-window metrics and cuts map
    res = ev(X1, Y1, metrics=["r_precision", "map_at_r", "map"], k="max_bin_count")
    close(res["r_precision"], F(1, 2))
    close(res["map_at_r"], F(5, 12))
    # map truncated at depth 2: q0 = q1 = (1)/2, q3 = (1/2)/2
    close(res["map"], (F(1, 2) + F(1, 2) + F(1, 4)) / 3)


# Six points on a line, labels 0 0 0 1 1 0 (as strings "x"/"y" to check per_class keys):
# q0 (0): .25(0) 1(0) 10(1) 10.5(1) 20(0) -> rel 1 1 0 0 1, R 3; q1, q2 give the same relevance
# q3 (10): 10.5(1) then 1, .25, 0 and 20 (0 and 20 tie at distance 10, both irrelevant) -> 1 0..
# q4 (10.5): 10(1) first -> 1 0 ..., R 1;   q5 (20): 10.5(1) 10(1) 1(0) .25(0) 0(0) -> 0 0 1 1 1
X2 = np.array([[0.0], [0.25], [1.0], [10.0], [10.5], [20.0]])
Y2 = np.array(["x", "x", "x", "y", "y", "x"])


def test_micro_and_macro_by_hand():
    mi = ev(X2, Y2, metrics=["precision_at_1", "r_precision", "map_at_r", "map"])
    ma = ev(X2, Y2, metrics=["precision_at_1", "r_precision", "map_at_r", "map"], average="macro")
    close(mi["precision_at_1"], F(5, 6))
    close(ma["precision_at_1"], (F(3, 4) + 1) / 2)
    close(mi["r_precision"], (3 * F(2, 3) + 1 + 1 + F(1, 3)) / 6)
    close(mi["map_at_r"], (3 * F(2, 3) + 1 + 1 + F(1, 9)) / 6)  # q5: (1/3)/3
    close(ma["map_at_r"], ((3 * F(2, 3) + F(1, 9)) / 4 + 1) / 2)
    q5_map = (F(1, 3) + F(2, 4) + F(3, 5)) / 3
    close(mi["map"], (3 * (1 + 1 + F(3, 5)) / 3 + 2 + q5_map) / 6)
    assert set(ma.per_class["map_at_r"]) == {"x", "y"}
    close(ma.per_class["map_at_r"]["x"], (3 * F(2, 3) + F(1, 9)) / 4)
    close(ma.per_class["map_at_r"]["y"], 1)
    assert ma.n_ties["precision_at_1"] == 0  # the only tie (q3) is of equal relevance


def test_ties_break_by_ascending_reference_index_and_are_counted():
    # query 0 (label 1); references 1 (label 0) and -1 (label 1) both at distance 1, 2 (label 1)
    res = ev([[0.0]], [1], [[1.0], [-1.0], [2.0]], [0, 1, 1], metrics=ALL)
    # index order: rel 0 1 1, R 2
    close(res["precision_at_1"], 0)
    close(res["r_precision"], F(1, 2))
    close(res["map_at_r"], F(1, 4))
    close(res["map"], (F(1, 2) + F(2, 3)) / 2)
    close(res["mrr"], F(1, 2))
    assert res.n_ties["precision_at_1"] == 1  # mixed tie straddles rank 1
    assert res.n_ties["r_precision"] == 0  # the tie lies wholly inside the top R = 2
    assert res.n_ties["map"] == 1  # swapping it changes AP
    # same points with the two tied references swapped: now the relevant one comes first
    res = ev([[0.0]], [1], [[-1.0], [1.0], [2.0]], [1, 0, 1], metrics=ALL)
    close(res["precision_at_1"], 1)
    close(res["map"], (1 + F(2, 3)) / 2)


# Query 0.0 with label 1.  References at +1, -1, +1 (all at distance 1: ranks 1-3 tie, ordered
# by reference index), then 5.0 (rank 4).  ``tied`` gives the relevance of ranks 1-3.
@pytest.mark.parametrize(
    ("tied", "j", "recall", "recall_tie", "precision", "precision_tie"),
    [
        # 1 0 1, j=2: every order of {1, 0, 1} has a hit in the first two -> recall fixed at 1;
        # P@2 is 1/2 here but 1 for the order 1 1 0 -> counted.
        ((1, 0, 1), 2, 1, False, F(1, 2), True),
        # 0 1 0, j=2: hit rate 1 here, 0 for the order 0 0 1 -> counted.
        ((0, 1, 0), 2, 1, True, F(1, 2), True),
        # 0 1 1, j=2: one non-relevant cannot fill two slots -> recall fixed; P@2 1/2 vs 1.
        ((0, 1, 1), 2, 1, False, F(1, 2), True),
        # 0 0 1, j=2: hit rate 0 here, 1 for the order 1 0 0 -> counted.
        ((0, 0, 1), 2, 0, True, 0, True),
        # 0 0 1, j=1: hit rate 0 here, 1 for 1 0 0 -> counted (recall@1 = P@1).
        ((0, 0, 1), 1, 0, True, 0, True),
        # 1 1 1 (not mixed) and j=3 (the block ends at the cut-off): nothing can change.
        ((1, 1, 1), 2, 1, False, 1, False),
        ((0, 1, 0), 3, 1, False, F(1, 3), False),
    ],
)
def test_recall_ties_count_only_queries_whose_hit_rate_can_change(
    tied, j, recall, recall_tie, precision, precision_tie
):
    res = ev(
        [[0.0]],
        [1],
        [[1.0], [-1.0], [1.0], [5.0]],
        [*tied, 1],
        metrics=[f"recall_at_{j}", f"precision_at_{j}"],
    )
    close(res[f"recall_at_{j}"], recall)
    close(res[f"precision_at_{j}"], precision)
    assert res.n_ties[f"recall_at_{j}"] == int(recall_tie)
    assert res.n_ties[f"precision_at_{j}"] == int(precision_tie)


def test_recall_tie_after_an_earlier_hit_is_not_counted():
    # Query 0.0 (label 1): reference 0.5 (label 1) at rank 1, then ranks 2-4 tie at distance 1
    # with relevance 0 1 0.  Recall@3 is 1 in every order (rank 1 is a hit); P@3 is 2/3 here and
    # 1/3 for the order 0 0 1 -> counted.
    res = ev(
        [[0.0]],
        [1],
        [[0.5], [1.0], [-1.0], [1.0]],
        [1, 0, 1, 0],
        metrics=["recall_at_3", "precision_at_3"],
    )
    close(res["recall_at_3"], 1)
    close(res["precision_at_3"], F(2, 3))
    assert res.n_ties["recall_at_3"] == 0
    assert res.n_ties["precision_at_3"] == 1


def test_groups_exclude_same_group_references_and_make_lone_queries():
    ref = [[1.0], [2.0], [3.0]]
    rl, rg = ["a", "b", "a"], ["g1", "g2", "g2"]
    # q0 (a, g1) loses ref0 -> 2(b) 3(a): rel 0 1, R 1; q1 (b, g2) loses refs 1 and 2 -> lone
    res = ev(
        [[0.0], [10.0]],
        ["a", "b"],
        ref,
        rl,
        query_groups=["g1", "g2"],
        reference_groups=rg,
        metrics=["precision_at_1", "map", "mrr", "r_precision"],
    )
    close(res["precision_at_1"], 0)
    close(res["map"], F(1, 2))
    close(res["mrr"], F(1, 2))
    assert res.n_lone == 1 and math.isnan(res.per_query["map"][1])
    # without groups: q0 -> rel 1 0 1, R 2; q1 -> 3(a) 2(b) 1(a): rel 0 1 0, R 1
    res = ev([[0.0], [10.0]], ["a", "b"], ref, rl, metrics=["precision_at_1", "map"])
    close(res["map"], ((1 + F(2, 3)) / 2 + F(1, 2)) / 2)
    assert res.n_lone == 0


def test_leave_one_out_groups():
    # LOO with groups: q0 and q1 share a group, so each loses the other and is lone
    res = ev([[0.0], [1.0], [5.0], [6.0]], [0, 0, 1, 1], query_groups=[1, 1, 2, 3], metrics=["map"])
    assert res.n_lone == 2
    np.testing.assert_allclose(res.per_query["map"], [np.nan, np.nan, 1.0, 1.0])


def test_ref_includes_query_hand_case():
    # queries 0 (a) and 1 (b) are the first reference rows; extra references 0.5 (a), 2.0 (b)
    q, ql = [[0.0], [1.0]], ["a", "b"]
    res = ev(
        q,
        ql,
        [[0.0], [1.0], [0.5], [2.0]],
        ["a", "b", "a", "b"],
        ref_includes_query=True,
        metrics=["precision_at_1", "map"],
    )
    # q0 (a): 0.5(a) 1(b) 2(b) -> 1 0 0, R 1; q1 (b): 0.5(a) 0(a) 2(b) -> 0 0 1, R 1
    np.testing.assert_allclose(res.per_query["map"], [1.0, 1 / 3])
    close(res["precision_at_1"], F(1, 2))


def test_inner_product_and_cosine_by_hand():
    # query (1, 0); references (3, 0) label 0, (1, 1) label 1, (0.5, 0) label 1
    # inner products 3, 1, 0.5 -> rel 0 1 1
    # cosine 1, 0.707, 1 -> idx0 and idx2 tie, ascending index: idx0, idx2, idx1 -> rel 0 1 1
    q, ref, rl = [[1.0, 0.0]], [[3.0, 0.0], [1.0, 1.0], [0.5, 0.0]], [0, 1, 1]
    ip = ev(q, [1], ref, rl, distance="inner_product", metrics=["map", "precision_at_1"])
    close(ip["map"], (F(1, 2) + F(2, 3)) / 2)
    cs = ev(q, [1], ref, rl, distance="cosine", metrics=["map", "precision_at_1"])
    close(cs["map"], (F(1, 2) + F(2, 3)) / 2)
    assert cs.n_ties["precision_at_1"] == 1
    eu = ev(q, [1], ref, rl, metrics=["map"])  # distances 2, 1, 0.5 -> rel 1 1 0
    close(eu["map"], 1)


def test_precision_and_recall_at_j_by_hand():
    # X1 leave-one-out, rel lists q0 = q1 = 1 0 1, q3 = 0 1 1
    res = ev(X1, Y1, metrics=["precision_at_2", "precision_at_3", "recall_at_1", "recall_at_3"])
    close(res["precision_at_2"], F(1, 2))
    close(res["precision_at_3"], F(2, 3))
    close(res["recall_at_1"], F(2, 3))
    close(res["recall_at_3"], 1)


def test_all_lone_is_nan_with_a_warning():
    with pytest.warns(EmbedevalWarning, match="lone"):
        res = ee.evaluate([[0.0], [1.0]], [0, 1], metrics=["map"], progress=False)
    assert math.isnan(res["map"]) and res.n_lone == 2


def test_pml_spellings_are_reported_under_short_keys():
    res = ev(
        X1,
        Y1,
        metrics=["mean_average_precision_at_r", "mean_average_precision", "mean_reciprocal_rank"],
    )
    assert set(res.metrics) == {"map_at_r", "map", "mrr"}
    close(res["map_at_r"], F(5, 12))


@pytest.mark.parametrize("seed", range(5))
def test_nmi_ami_on_few_points_print_nothing_and_keep_the_recipe_values(capfd, seed):
    faiss = pytest.importorskip("faiss")
    from sklearn.metrics import adjusted_mutual_info_score, normalized_mutual_info_score

    # 24 points in 4 classes: 6 per cluster, below faiss's min_points_per_centroid (39), where
    # faiss's own k-means prints "WARNING clustering 24 points to 4 centroids" to stderr.
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(4), 6)
    x = (rng.normal(size=(4, 3))[y] + rng.normal(size=(24, 3))).astype(np.float32)
    capfd.readouterr()
    res = ev(x, y, metrics=["nmi", "ami"])
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    # The recipe with faiss's defaults (it warns; the clustering must be the same).
    km = faiss.Kmeans(3, 4, niter=20, seed=1234)
    km.train(x)
    _, assign = km.index.search(x, 1)
    assert "WARNING clustering 24 points to 4 centroids" in capfd.readouterr().err
    assert res["nmi"] == normalized_mutual_info_score(y, assign[:, 0])
    assert res["ami"] == adjusted_mutual_info_score(y, assign[:, 0])


@pytest.mark.parametrize("labels_kind", ["int", "str"])
def test_nmi_ami_follow_the_recipe_exactly(labels_kind):
    faiss = pytest.importorskip("faiss")
    from sklearn.metrics import adjusted_mutual_info_score, normalized_mutual_info_score

    rng = np.random.default_rng(4)
    y = rng.integers(0, 5, 400)
    x = (rng.normal(size=(5, 6))[y] * 2 + rng.normal(size=(400, 6))).astype(np.float32)
    labels = y if labels_kind == "int" else np.array([f"c{v}" for v in y])
    # the documented recipe: faiss k-means, n_clusters = distinct query labels, 20 iterations,
    # seed 1234, on the query embeddings (float32), then sklearn's arithmetic-mean NMI / AMI
    km = faiss.Kmeans(6, 5, niter=20, seed=1234)
    km.train(x)
    _, assign = km.index.search(x, 1)
    nmi = normalized_mutual_info_score(y, assign[:, 0])
    ami = adjusted_mutual_info_score(y, assign[:, 0])
    # a split reference set must not change the clustering (it is on the queries only)
    ref = rng.normal(size=(50, 6))
    for res in (
        ev(x, labels, metrics=["nmi", "ami"]),
        ev(x, labels, ref, labels[:50], metrics=["nmi", "ami"]),
    ):
        assert res["nmi"] == nmi and res["ami"] == ami
        assert "nmi" not in res.per_query


# ---- exact integer labels and groups, huge k, reject_from="both" with k="max_bin_count"


def test_uint64_and_int64_labels_compare_exactly():
    # q = 0; references 1, 2, 3 with labels 2**60, 2**60 + 1, 5: the nearest (at 1) has label
    # 2**60, not the query's 2**60 + 1, so P@1 = 0/1; the only relevant reference is 2nd: MRR
    # = 1/2.  Through float64 both labels would be 2**60 (P@1 = 1).
    q, x = np.array([[0.0]]), np.array([[1.0], [2.0], [3.0]])
    res = ev(q, np.array([2**60 + 1], np.uint64), x, np.array([2**60, 2**60 + 1, 5]),
             metrics=["precision_at_1", "mrr"])  # fmt: skip
    close(res["precision_at_1"], F(0))
    close(res["mrr"], F(1, 2))


def test_uint64_and_int64_groups_compare_exactly():
    # Query group 2**60 + 1 (uint64) excludes only reference 1 (group 2**60 + 1), not reference
    # 0 (group 2**60).  Ranking of q = 0: reference 0 (label 0), reference 2 (label 1):
    # P@1 = 0/1, MRR = 1/2.  Through float64 reference 0 would be excluded too (P@1 = 1).
    q, x = np.array([[0.0]]), np.array([[1.0], [2.0], [3.0]])
    res = ev(q, [1], x, [0, 1, 1], metrics=["precision_at_1", "mrr"],
             query_groups=np.array([2**60 + 1], np.uint64),
             reference_groups=np.array([2**60, 2**60 + 1, 5]))  # fmt: skip
    close(res["precision_at_1"], F(0))
    close(res["mrr"], F(1, 2))


@pytest.mark.parametrize("k", [None, 2**62, 2**63 - 1])
def test_a_huge_k_is_the_whole_gallery(k):
    # X1/Y1 above: q0 rel 1 0 1 -> AP (1 + 2/3) / 2 = 5/6, RR 1; q1 the same; q3 rel 0 1 1 ->
    # AP (1/2 + 2/3) / 2 = 7/12, RR 1/2; q2 lone.  MAP = (5/6 + 5/6 + 7/12) / 3 = 3/4,
    # MRR = (1 + 1 + 1/2) / 3 = 5/6.
    res = ev(X1, Y1, metrics=["map", "mrr"], k=k)
    close(res["map"], F(3, 4))
    close(res["mrr"], F(5, 6))


def test_reject_both_keeps_the_full_galleries_max_bin_count():
    # Points 0, 1, 10, 11, 13 labelled a a b b b; confidences reject the point at 13 first.
    # Whole gallery: the largest R_q is 2 (class b), so k = 2 for every fraction.  Fraction 0:
    # every query's nearest shares its label (0->1, 1->0, 10->11, 11->10, 13->11): P@1 = 1,
    # Recall@2 = 1.  Fraction 0.2 removes the point at 13: each remaining point has its one
    # same-label partner nearest: P@1 = 1, Recall@2 = 1.  (Recomputed on the reduced gallery,
    # max_bin_count would be 1 and Recall@2 impossible.)
    x = [[0.0], [1.0], [10.0], [11.0], [13.0]]
    res = ev(x, list("aabbb"), k="max_bin_count", metrics=["precision_at_1", "recall_at_2"],
             confidences=[0.9, 0.9, 0.9, 0.9, 0.1], reject_from="both",
             rejection_fractions=[0.0, 0.2])  # fmt: skip
    for key in ("both_precision_at_1@0.00", "both_precision_at_1@0.20",
                "both_recall_at_2@0.00", "both_recall_at_2@0.20"):  # fmt: skip
        close(res.confidence[key], F(1))


@pytest.mark.parametrize("scale", [2.0**63, 2.0**-80])
@pytest.mark.parametrize("distance", ["euclidean", "inner_product"])
def test_inputs_whose_squares_leave_float32_rank_like_the_unscaled_data(scale, distance):
    # X1/Y1 times a power of two rank exactly like X1/Y1.  Euclidean: MAP 3/4, MRR 5/6 (see
    # test_a_huge_k_is_the_whole_gallery).  Inner product on 0, 1, 3, 6: q0 scores 0 against
    # all (ties by index: 1(a) 2(b) 3(a): AP (1 + 2/3) / 2 = 5/6, RR 1); q1 -> 6(a) 3(b) 0(a):
    # AP 5/6, RR 1; q3 -> 3(b) 1(a) 0(a): AP (1/2 + 2/3) / 2 = 7/12, RR 1/2.  Same as Euclidean.
    x = (X1 * scale).astype(np.float32)
    res = ev(x, Y1, metrics=["map", "mrr"], distance=distance)
    close(res["map"], F(3, 4))
    close(res["mrr"], F(5, 6))


# embedeval.evaluate against hand-computed fractions and the brute-force oracle.


METRICS_P3 = [
    "precision_at_1",
    "r_precision",
    "map_at_r",
    "map",
    "mrr",
    "recall_at_2",
    "precision_at_3",
]

# 1-D leave-one-out example: points 0, 1, 2, 10, 11 with labels a b a b b (worked by hand in the
# comments; distances are small integers, so float32 keys are exact).
X5 = [[0.0], [1.0], [2.0], [10.0], [11.0]]
Y5 = ["a", "b", "a", "b", "b"]


def test_leave_one_out_hand_fractions_micro():
    res = ee.evaluate(X5, Y5, metrics=["precision_at_1", "r_precision", "map_at_r", "map", "mrr"])
    # q0=0(a): ranking 1b 2a 10b 11b; q1=1(b): 0a 2a (tie, by index) 10b 11b;
    # q2=2(a): 1b 0a 10b 11b; q3=10(b): 11b 2a 1b 0a; q4=11(b): 10b 2a 1b 0a.
    assert res["precision_at_1"] == pytest.approx(2 / 5)
    assert res["r_precision"] == pytest.approx((0 + 0 + 0 + 1 / 2 + 1 / 2) / 5)
    assert res["map_at_r"] == pytest.approx((0 + 0 + 0 + 1 / 2 + 1 / 2) / 5)
    assert res["map"] == pytest.approx((1 / 2 + (1 / 3 + 2 / 4) / 2 + 1 / 2 + 5 / 6 + 5 / 6) / 5)
    assert res["mrr"] == pytest.approx((1 / 2 + 1 / 3 + 1 / 2 + 1 + 1) / 5)
    assert res.n_lone == 0 and res.n_queries == 5
    assert res.per_query["map"].tolist() == pytest.approx([1 / 2, 5 / 12, 1 / 2, 5 / 6, 5 / 6])


def test_leave_one_out_hand_fractions_macro_and_per_class():
    res = ee.evaluate(X5, Y5, metrics=["precision_at_1", "map"], average="macro")
    assert res["precision_at_1"] == pytest.approx((0 + 2 / 3) / 2)
    assert res["map"] == pytest.approx((1 / 2 + (5 / 12 + 5 / 6 + 5 / 6) / 3) / 2)
    assert res.per_class["map"] == pytest.approx({"a": 1 / 2, "b": 25 / 36})
    assert set(res.per_class["precision_at_1"]) == {"a", "b"}


def test_int_k_below_r_uses_pml_truncation():
    with pytest.warns(ee.EmbedevalWarning, match="truncated"):
        res = ee.evaluate(X5, Y5, metrics=["r_precision", "map_at_r", "map", "mrr"], k=1)
    assert res.per_query["r_precision"].tolist() == [0, 0, 0, 1, 1]
    # window min(R, 1) = 1, divisor R = 2 for the b queries 10 and 11
    assert res.per_query["map_at_r"].tolist() == [0, 0, 0, 1 / 2, 1 / 2]
    assert res.per_query["map"].tolist() == [0, 0, 0, 1 / 2, 1 / 2]
    assert res.per_query["mrr"].tolist() == [0, 0, 0, 1, 1]


def test_split_hand_fractions_and_ties():
    q, ql = [[0.0], [5.0]], ["a", "b"]
    r, rl = [[1.0], [4.0], [6.0], [9.0]], ["a", "b", "a", "b"]
    res = ee.evaluate(
        q, ql, r, rl, metrics=["precision_at_1", "r_precision", "map_at_r", "map", "mrr"]
    )
    # q0: 1a 4b 6a 9b.  q1=5: 4b and 6a tie at 1 (index 1 before 2), 1a and 9b tie at 4.
    assert res.per_query["map"].tolist() == pytest.approx([5 / 6, (1 + 2 / 4) / 2])
    assert res.per_query["precision_at_1"].tolist() == [1, 1]
    assert res.per_query["r_precision"].tolist() == [1 / 2, 1 / 2]
    # The mixed tie {4b, 6a} straddles the P@1 cut and sits inside the MAP@R/MAP/MRR windows;
    # R-precision counts both tied items, so its value cannot change.
    assert res.n_ties == {"precision_at_1": 1, "r_precision": 0, "map_at_r": 1, "map": 1, "mrr": 1}


def test_lone_queries_are_nan_counted_and_excluded():
    res = ee.evaluate([[0.0], [1.0], [5.0]], [0, 0, 1], metrics=["precision_at_1"])
    assert res.n_lone == 1
    assert math.isnan(res.per_query["precision_at_1"][2])
    assert res["precision_at_1"] == 1.0


def test_all_lone_warns_and_gives_nan():
    with pytest.warns(ee.EmbedevalWarning, match="lone"):
        res = ee.evaluate([[0.0], [1.0]], [0, 1], metrics=["map_at_r"])
    assert math.isnan(res["map_at_r"])


def test_large_integer_labels_stay_distinct():
    x = [[0.0], [0.1], [5.0], [5.1]]
    y = np.array([2**24, 2**24, 2**24 + 1, 2**24 + 1], dtype=np.int64)
    res = ee.evaluate(x, y, metrics=["precision_at_1"])
    assert res["precision_at_1"] == 1.0
    assert set(res.per_class["precision_at_1"]) == {2**24, 2**24 + 1}
    # Merged (as a float32 cast would) they would give P@1 = 1 as well, so check R too:
    res = ee.evaluate(x, y, metrics=["r_precision"])
    assert res["r_precision"] == 1.0  # R = 1 per query, not 3


def test_groups_exclude_same_group_references():
    x = [[0.0], [0.5], [3.0], [3.2]]
    y = [0, 0, 0, 1]
    g = ["cam1", "cam1", "cam2", "cam2"]
    res = ee.evaluate(x, y, metrics=["precision_at_1", "r_precision"], query_groups=g)
    # q0 sees only 3.0(0) and 3.2(1): nearest 3.0 is relevant; q1 likewise; q2 sees 0.5 (0) and
    # 0 (0) -> relevant; q3 (label 1) has no other label-1 reference outside its group: lone.
    assert res.n_lone == 1
    assert res.per_query["precision_at_1"][:3].tolist() == [1, 1, 1]
    assert res.per_query["r_precision"][:3].tolist() == [1, 1, 1]


def test_ref_includes_query_matches_leave_one_out():
    rng = np.random.default_rng(3)
    q = rng.integers(-4, 5, (12, 2)).astype(np.float32)
    extra = rng.integers(-4, 5, (8, 2)).astype(np.float32)
    yq, ye = rng.integers(0, 3, 12), rng.integers(0, 3, 8)
    ref, yr = np.vstack([q, extra]), np.concatenate([yq, ye])
    a = ee.evaluate(q, yq, ref, yr, metrics=METRICS_P3, ref_includes_query=True)
    _, expected = oracle.summary(q, yq, ref, yr, metrics=METRICS_P3, ref_includes_query=True)
    for m in METRICS_P3:
        np.testing.assert_allclose(a.per_query[m], expected[m], rtol=0, atol=1e-12)


def _data(seed, n, d, n_classes, integer):
    rng = np.random.default_rng(seed)
    if integer:  # exact float32 keys: ties are real and must follow the index rule
        x = rng.integers(-3, 4, (n, d)).astype(np.float32)
    else:
        x = rng.standard_normal((n, d)).astype(np.float32)
    return x, rng.integers(0, n_classes, n)


def _gaps_well_separated(x, r, distance):
    d = np.sort(oracle.pairwise(x, r, distance), axis=1)
    gaps = np.diff(d, axis=1)
    return gaps.size == 0 or (gaps[gaps > 0].min(initial=1.0) > 1e-4 and (gaps == 0).sum() == 0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(2, 40),
    d=st.integers(1, 4),
    n_classes=st.integers(1, 6),
    mode=st.sampled_from(["loo", "split", "groups"]),
    k=st.sampled_from([None, 1, 3, 1000, "max_bin_count"]),
    average=st.sampled_from(["micro", "macro"]),
    block_size=st.sampled_from([None, 1, 7]),
)
def test_matches_oracle_on_integer_data_with_ties(
    seed, n, d, n_classes, mode, k, average, block_size
):
    x, y = _data(seed, n, d, n_classes, integer=True)
    metrics = ["precision_at_1", "r_precision", "map_at_r", "map", "mrr"]
    if k is None or k == 1000:
        metrics += ["recall_at_2", "precision_at_3"]
    kwargs = {}
    if mode == "split":
        r, yr = _data(seed + 1, n + 3, d, n_classes, integer=True)
        args = (x, y, r, yr)
        okw = {"r": r, "rl": yr}
    elif mode == "groups":
        g = np.random.default_rng(seed).integers(0, 3, n)
        args = (x, y)
        kwargs = {"query_groups": g}
        okw = {"qg": g}
    else:
        args, okw = (x, y), {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = ee.evaluate(
            *args, metrics=metrics, k=k, average=average, block_size=block_size, **kwargs
        )
    summary, per_query = oracle.summary(x, y, metrics=metrics, k=k, average=average, **okw)
    for m in metrics:
        np.testing.assert_allclose(res.per_query[m], per_query[m], rtol=0, atol=1e-12)
        if math.isnan(summary[m]):
            assert math.isnan(res[m])
        else:
            assert res[m] == pytest.approx(summary[m], abs=1e-12)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    distance=st.sampled_from(["euclidean", "cosine", "inner_product"]),
    split=st.booleans(),
)
def test_matches_oracle_for_every_distance(seed, distance, split):
    x, y = _data(seed, 30, 5, 4, integer=False)
    r, yr = _data(seed + 7, 45, 5, 4, integer=False)
    if not _gaps_well_separated(x, r if split else x, distance):
        return
    res = ee.evaluate(x, y, *((r, yr) if split else ()), metrics=METRICS_P3, distance=distance)
    _, expected = oracle.summary(
        x, y, *((r, yr) if split else ()), metrics=METRICS_P3, distance=distance
    )
    for m in METRICS_P3:
        np.testing.assert_allclose(res.per_query[m], expected[m], rtol=0, atol=1e-9)


def _oracle_ties(rel, key, R, metric, k):
    """Naive tie flag: a maximal run of equal keys with mixed relevance cut by / inside the
    metric's window."""
    n = len(rel)
    cap = n if k is None else min(k, n)
    if metric == "precision_at_1":
        w, kind = min(1, n), "cut"
    elif metric == "r_precision":
        w, kind = (R if k is None else min(R, k)), "cut"
    elif metric == "map_at_r":
        w, kind = (R if k is None else min(R, k)), "inside"
    elif metric == "map":
        w = (max(i for i in range(n) if rel[i]) + 1) if k is None else cap
        kind = "inside"
    else:  # mrr
        first = next((i for i in range(cap) if rel[i]), None)
        w, kind = (first + 1 if first is not None else cap), "inside"
    s = 0
    while s < n:
        e = s
        while e + 1 < n and key[e + 1] == key[s]:
            e += 1
        block = rel[s : e + 1]
        if 0 < sum(block) < len(block):
            if kind == "cut" and s <= w - 1 < e:
                return True
            if kind == "inside" and s < w:
                return True
        s = e + 1
    return False


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.sampled_from([None, 2]))
def test_tie_counts_match_a_naive_count(seed, k):
    x, y = _data(seed, 25, 2, 3, integer=True)
    metrics = ["precision_at_1", "r_precision", "map_at_r", "map", "mrr"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = ee.evaluate(x, y, metrics=metrics, k=k)
    d = ((x[:, None, :].astype(float) - x[None, :, :]) ** 2).sum(-1)
    for m in metrics:
        expected = 0
        for i, (rel, R) in enumerate((rel, sum(rel)) for rel, _ in oracle.rankings(x, y)):
            if R == 0:
                continue
            order = sorted((j for j in range(len(x)) if j != i), key=lambda j: (d[i, j], j))
            expected += _oracle_ties(rel, [d[i, j] for j in order], R, m, k)
        assert res.n_ties[m] == expected, m


def test_block_size_does_not_change_results():
    x, y = _data(5, 300, 8, 12, integer=False)
    a = ee.evaluate(x, y, metrics=METRICS_P3, block_size=1)
    b = ee.evaluate(x, y, metrics=METRICS_P3, block_size=64)
    c = ee.evaluate(x, y, metrics=METRICS_P3)
    for m in METRICS_P3:
        np.testing.assert_array_equal(a.per_query[m], b.per_query[m])
        np.testing.assert_array_equal(a.per_query[m], c.per_query[m])


def test_large_reference_set_uses_the_threshold_path_and_stays_exact():
    # More than 2 x 1024 references: the subsample thresholds and their verification run.
    x, y = _data(11, 3000, 4, 40, integer=True)
    metrics = ["precision_at_1", "r_precision", "map_at_r", "recall_at_5"]
    res = ee.evaluate(x[:200], y[:200], x, y, metrics=metrics)
    _, expected = oracle.summary(x[:200], y[:200], x, y, metrics=metrics)
    for m in metrics:
        np.testing.assert_allclose(res.per_query[m], expected[m], rtol=0, atol=1e-12)


def test_invariances_permutation_relabelling_scaling():
    x, y = _data(2, 60, 6, 5, integer=False)
    base = ee.evaluate(x, y, metrics=METRICS_P3, distance="cosine")
    perm = np.random.default_rng(0).permutation(60)
    permuted = ee.evaluate(x[perm], y[perm], metrics=METRICS_P3, distance="cosine")
    names = np.array([f"cls{v}" for v in range(5)])
    relabelled = ee.evaluate(x, names[y], metrics=METRICS_P3, distance="cosine")
    scaled = ee.evaluate(
        x * np.linspace(0.5, 3, 60)[:, None], y, metrics=METRICS_P3, distance="cosine"
    )
    for m in METRICS_P3:
        assert permuted[m] == pytest.approx(base[m], abs=1e-12)
        assert relabelled[m] == pytest.approx(base[m], abs=1e-12)
        np.testing.assert_allclose(scaled.per_query[m], base.per_query[m], atol=1e-12)


def test_accepts_lists_float16_float64_memmap_and_array_like(tmp_path):
    x, y = _data(4, 50, 3, 4, integer=True)
    expected = ee.evaluate(x, y, metrics=["map_at_r"])["map_at_r"]
    path = tmp_path / "x.npy"
    np.save(path, x)
    mm = np.load(path, mmap_mode="r")

    class ArrayLike:
        def __array__(self, dtype=None, copy=None):
            return x

    for variant in (x.tolist(), x.astype(np.float16), x.astype(np.float64), mm, ArrayLike()):
        assert ee.evaluate(variant, y.tolist(), metrics=["map_at_r"])["map_at_r"] == expected


def test_nmi_ami_follow_the_documented_recipe():
    # The documented recipe: faiss k-means (one cluster per distinct query label, 20 iterations,
    # seed 1234) on the query embeddings, then scikit-learn's NMI / AMI (arithmetic mean).
    import faiss
    from sklearn.metrics import adjusted_mutual_info_score, normalized_mutual_info_score

    rng = np.random.default_rng(0)
    centers = rng.standard_normal((4, 8)) * 3
    y = np.repeat(np.arange(4), 60)
    x = (centers[y] + rng.standard_normal((240, 8))).astype(np.float32)
    km = faiss.Kmeans(8, 4, niter=20, seed=1234)
    km.train(x)
    clusters = km.index.search(x, 1)[1][:, 0]
    res = ee.evaluate(x, y, metrics=["nmi", "ami"])
    assert res["nmi"] == normalized_mutual_info_score(y, clusters)
    assert res["ami"] == adjusted_mutual_info_score(y, clusters)
    assert 0.5 < res["nmi"] <= 1
    assert "nmi" not in res.per_query


def test_default_metrics_follow_a_small_k():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = ee.evaluate(X5, Y5, k=2)
    assert "recall_at_2" in res.metrics and "recall_at_10" not in res.metrics
    # recall_at_1 always equals precision_at_1, so the default set does not repeat it
    assert list(ee.evaluate(X5, Y5).metrics) == [
        "precision_at_1",
        "r_precision",
        "map_at_r",
        "recall_at_10",
    ]


# Differential and property tests: ``embedeval.evaluate`` against the brute-force oracle.


METRICS = [
    "precision_at_1",
    "r_precision",
    "map_at_r",
    "map",
    "mrr",
    "recall_at_1",
    "recall_at_3",
    "precision_at_2",
    "precision_at_5",
]
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))


def _well_separated(ranks, gap=1e-4):
    """No two kept references of one query are nearly equally far (float32 search safety)."""
    for _, d in ranks:
        d = np.asarray(d)
        if len(d) > 1 and np.min(np.diff(d)) < gap * max(1.0, np.abs(d).max()):
            return False
    return True


def _compare(res, want, pq_want, pc_want, metrics):
    for m in metrics:
        got = np.asarray(res.per_query[m], dtype=np.float64)
        exp = np.asarray(pq_want[m], dtype=np.float64)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(exp), err_msg=m)
        np.testing.assert_allclose(got, exp, rtol=0, atol=1e-9, equal_nan=True, err_msg=m)
        if math.isnan(want[m]):
            assert math.isnan(res[m]), m
        else:
            assert res[m] == pytest.approx(want[m], abs=1e-9), m
        assert set(res.per_class[m]) == set(pc_want[m]), m
        for lab, v in pc_want[m].items():
            assert res.per_class[m][lab] == pytest.approx(v, abs=1e-9), (m, lab)


@st.composite
def problems(draw):
    n_q = draw(st.integers(2, 14))
    n_r = draw(st.integers(2, 16))
    dim = draw(st.integers(1, 4))
    n_cls = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**31 - 1))
    mode = draw(st.sampled_from(["self", "split", "ref_includes_query"]))
    distance = draw(st.sampled_from(["euclidean", "cosine", "inner_product"]))
    average = draw(st.sampled_from(["micro", "macro"]))
    use_groups = draw(st.booleans())
    k_kind = draw(st.sampled_from(["none", "small", "huge", "max_bin_count"]))
    return n_q, n_r, dim, n_cls, seed, mode, distance, average, use_groups, k_kind


def _build(n_q, n_r, dim, n_cls, seed, mode, use_groups):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(n_q, dim))
    ql = rng.integers(0, n_cls, n_q)
    qg = rng.integers(0, 3, n_q) if use_groups else None
    if mode == "self":
        return q, ql, None, None, qg, None
    r = rng.normal(size=(n_r, dim))
    rl = rng.integers(0, n_cls, n_r)
    rg = rng.integers(0, 3, n_r) if use_groups else None
    if mode == "ref_includes_query":
        r, rl = np.vstack([q, r]), np.concatenate([ql, rl])
        rg = np.concatenate([qg, rg]) if use_groups else None
    return q, ql, r, rl, qg, rg


@SETTINGS
@given(problems())
def test_evaluate_equals_oracle(p):
    n_q, n_r, dim, n_cls, seed, mode, distance, average, use_groups, k_kind = p
    q, ql, r, rl, qg, rg = _build(n_q, n_r, dim, n_cls, seed, mode, use_groups)
    rif = mode == "ref_includes_query"
    ranks = oracle.rankings(q, ql, r, rl, distance=distance, ref_includes_query=rif, qg=qg, rg=rg)
    assume(_well_separated(ranks))
    Rs = [sum(rel) for rel, _ in ranks]
    assume(max(Rs) > 0)
    n_ref = len(q) if r is None else len(r)
    k = {"none": None, "small": max(1, max(Rs) - 1), "huge": n_ref + 5}.get(k_kind, k_kind)
    depth = max(Rs) if k == "max_bin_count" else k
    # precision_at_j / recall_at_j need depth j: keep them only where k reaches it
    metrics = [
        m
        for m in METRICS
        if depth is None
        or not m.startswith(("precision_at_", "recall_at_"))
        or int(m.rsplit("_", 1)[1]) <= depth
    ]
    want, pq_want, pc_want = oracle.evaluate(
        q,
        ql,
        r,
        rl,
        metrics=metrics,
        k=k,
        distance=distance,
        ref_includes_query=rif,
        average=average,
        qg=qg,
        rg=rg,
    )
    kw = dict(
        metrics=metrics,
        k=k,
        distance=distance,
        average=average,
        ref_includes_query=rif,
        progress=False,
    )
    if use_groups:
        kw.update(query_groups=qg, reference_groups=rg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # all-lone metrics warn; the oracle says NaN
        results = [ee.evaluate(q, ql, r, rl, block_size=b, **kw) for b in (1, 7, None)]
    for res in results:
        _compare(res, want, pq_want, pc_want, metrics)
        assert res.n_lone == sum(1 for x in Rs if x == 0)
        assert res.n_queries == n_q


def _orderings(rel, dist):
    """Every distinct relevance sequence reachable by reordering equally distant references."""
    blocks, start = [], 0
    for i in range(1, len(rel) + 1):
        if i == len(rel) or dist[i] != dist[start]:
            blocks.append(rel[start:i])
            start = i
    seqs = [[]]
    for b in blocks:
        perms = {tuple(p) for p in itertools.permutations(b)}
        seqs = [s + list(p) for s in seqs for p in perms]
    return seqs


TIE_METRICS = [
    "precision_at_1",
    "r_precision",
    "map_at_r",
    "map",
    "mrr",
    "recall_at_2",
    "recall_at_3",
    "precision_at_2",
    "precision_at_3",
]


@SETTINGS
@given(
    st.integers(0, 2**31 - 1),
    st.sampled_from(["self", "split"]),
    st.sampled_from(["euclidean", "inner_product"]),
    st.sampled_from([None, 2, 3]),
)
def test_exact_ties_follow_ascending_index_and_are_counted(seed, mode, distance, k):
    # A metric's cut-off may not exceed an int k (evaluate rejects it): drop the @3 ones at k=2.
    metrics = [m for m in TIE_METRICS if k is None or not m.endswith("_3") or k >= 3]
    rng = np.random.default_rng(seed)
    # small integer coordinates: exact duplicates and exactly equal distances in float32 too
    q = rng.integers(-2, 3, size=(int(rng.integers(2, 8)), 2)).astype(np.float64)
    ql = rng.integers(0, 2, len(q))
    r = rl = None
    if mode == "split":
        r = rng.integers(-2, 3, size=(int(rng.integers(2, 9)), 2)).astype(np.float64)
        rl = rng.integers(0, 2, len(r))
    ranks = oracle.rankings(q, ql, r, rl, distance=distance)
    assume(max(sum(rel) for rel, _ in ranks) > 0)
    want, pq_want, pc_want = oracle.evaluate(q, ql, r, rl, metrics=metrics, k=k, distance=distance)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = ee.evaluate(q, ql, r, rl, metrics=metrics, k=k, distance=distance, progress=False)
        b = ee.evaluate(
            q, ql, r, rl, metrics=metrics, k=k, distance=distance, progress=False, block_size=1
        )
    _compare(a, want, pq_want, pc_want, metrics)
    _compare(b, want, pq_want, pc_want, metrics)
    for m in metrics:
        n = _n_changeable(ranks, m, k)
        assert a.n_ties[m] == n, (m, a.n_ties[m], n)
        assert b.n_ties[m] == n, m


def _n_changeable(ranks, metric, k):
    """Non-lone queries whose value differs between two orderings of their equal distances."""
    return sum(
        len({round(oracle.metric_value(metric, s, k), 12) for s in _orderings(rel, dist)}) > 1
        for rel, dist in ranks
        if sum(rel)
    )


CUT_METRICS = [f"{kind}_at_{j}" for kind in ("recall", "precision") for j in (1, 2, 3, 4)]


@pytest.mark.parametrize("seed", range(40))
def test_cutoff_ties_counted_iff_some_ordering_changes_the_value(seed):
    # Big tie blocks on purpose, several queries per call (the kernels are vectorised over rows):
    # query i sits at 10*i on a line, its own references at 10*i +- d with d in {1, 2, 3}, so
    # many of them are exactly equally far (integer coordinates: exact in float32 too).
    rng = np.random.default_rng(seed)
    n_q = int(rng.integers(2, 6))
    q = 10.0 * np.arange(n_q)[:, None]
    own = [int(rng.integers(1, 8)) for _ in range(n_q)]
    r = np.concatenate(
        [10.0 * i + rng.choice([-1, 1], n) * rng.integers(1, 4, n) for i, n in enumerate(own)]
    )[:, None]
    ql, rl = np.zeros(n_q, dtype=int), rng.integers(0, 2, len(r))
    rl[0] = 0  # every query has a relevant reference: no lone queries
    ranks = oracle.rankings(q, ql, r, rl)
    _, pq_want, _ = oracle.evaluate(q, ql, r, rl, metrics=CUT_METRICS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = ee.evaluate(q, ql, r, rl, metrics=CUT_METRICS, progress=False)
    for m in CUT_METRICS:
        np.testing.assert_allclose(res.per_query[m], pq_want[m], atol=1e-12, err_msg=m)
        n = _n_changeable(ranks, m, None)
        assert res.n_ties[m] == n, (m, res.n_ties[m], n)


INV_METRICS = ["precision_at_1", "r_precision", "map_at_r", "map", "mrr", "recall_at_2"]


def _run(q, ql, r, rl, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ee.evaluate(q, ql, r, rl, metrics=INV_METRICS, progress=False, **kw)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.integers(0, 2**31 - 1),
    st.sampled_from(["euclidean", "cosine", "inner_product"]),
    st.sampled_from(["micro", "macro"]),
)
def test_permuting_references_and_relabelling_change_nothing(seed, distance, average):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(9, 3))
    r = rng.normal(size=(13, 3))
    ql, rl = rng.integers(0, 3, 9), rng.integers(0, 3, 13)
    ranks = oracle.rankings(q, ql, r, rl, distance=distance)
    assume(_well_separated(ranks) and max(sum(x) for x, _ in ranks) > 0)
    base = _run(q, ql, r, rl, distance=distance, average=average)
    perm = rng.permutation(13)
    moved = _run(q, ql, r[perm], rl[perm], distance=distance, average=average)
    # bijections onto strings and onto huge ints that differ by 1 (float32 would merge them)
    for mapping in (
        {0: "cat", 1: "dog", 2: "ému"},
        {0: 2**24 + 1, 1: 2**24, 2: 2**40 + 7},
        {0: -5, 1: 2**53, 2: 2**53 - 1},
    ):
        mql = np.array([mapping[v] for v in ql])
        mrl = np.array([mapping[v] for v in rl])
        relab = _run(q, mql, r, mrl, distance=distance, average=average)
        for m in INV_METRICS:
            np.testing.assert_allclose(relab.per_query[m], base.per_query[m], atol=1e-12)
            assert relab[m] == pytest.approx(base[m], abs=1e-12, nan_ok=True)
            assert {mapping[int(c)]: v for c, v in base.per_class[m].items()} == pytest.approx(
                relab.per_class[m], abs=1e-12
            )
    for m in INV_METRICS:
        np.testing.assert_allclose(moved.per_query[m], base.per_query[m], atol=1e-12)
        assert moved[m] == pytest.approx(base[m], abs=1e-12, nan_ok=True)
    if distance == "cosine":
        scaled = _run(
            q * rng.uniform(0.01, 100, (9, 1)),
            ql,
            r * rng.uniform(0.01, 100, (13, 1)),
            rl,
            distance=distance,
            average=average,
        )
        for m in INV_METRICS:
            np.testing.assert_allclose(scaled.per_query[m], base.per_query[m], atol=1e-12)


# ---- excluded references are never candidates, whatever the threshold column sample holds


def _oracle_per_query(q, ql, r, rl, metrics, **kw):
    _, pq, _ = oracle.evaluate(q, ql, r, rl, metrics=metrics, **kw)
    return {m: np.asarray(v, dtype=np.float64) for m, v in pq.items()}


def test_a_group_covering_most_of_the_gallery_keeps_map_at_most_one():
    # 3,000 references (the depth threshold is read from a column sample) of which 2,990 share
    # the queries' group: nearly every sampled key is excluded, so the sampled cut-off is
    # infinite and used to let excluded references in (map came out near 104).
    rng = np.random.default_rng(0)
    n = 3000
    ref = rng.standard_normal((n, 4)).astype(np.float32)
    yr = rng.integers(0, 2, n)
    gr = np.zeros(n, dtype=np.int64)
    gr[:10] = 1
    q = rng.standard_normal((5, 4)).astype(np.float32)
    metrics = ["map", "mrr", "r_precision"]
    for pick in (["map"], ["mrr"], metrics):
        res = ee.evaluate(q, np.zeros(5, int), ref, yr, query_groups=np.zeros(5, int),
                          reference_groups=gr, metrics=pick, progress=False)  # fmt: skip
        want = _oracle_per_query(q, [0] * 5, ref, yr, pick, qg=[0] * 5, rg=gr)
        for m in pick:
            np.testing.assert_allclose(res.per_query[m], want[m], rtol=1e-6, err_msg=m)
            assert np.nanmax(res.per_query[m]) <= 1.0


@pytest.mark.parametrize("metrics", [["r_precision", "map"], ["r_precision", "mrr"]])
def test_a_class_of_most_of_the_gallery_never_counts_the_query_itself(metrics):
    # 9,000 references, class 0 holds 8,447 of them (R_q = 8,446 for its queries), so the
    # depth R_q + 1 puts the sampled cut-off at the last of 4,096 sampled columns; queries 1, 4
    # and 5 are sampled columns and excluded from their own ranking, so that cut-off is their
    # own (infinite) key, which used to let the query count itself as a hit.
    n, r_q = 9000, 8446
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    y = np.ones(n, dtype=np.int64)
    y[: r_q + 1] = 0
    rng.shuffle(y[10:])
    y[:10] = 0
    res = ee.evaluate(x[:10], y[:10], x, y, ref_includes_query=True, metrics=metrics,
                      progress=False)  # fmt: skip
    want = _oracle_per_query(x[:10], y[:10], x, y, metrics, ref_includes_query=True)
    for m in metrics:
        np.testing.assert_allclose(res.per_query[m], want[m], rtol=1e-6, err_msg=m)


# Seeded random differential: ``evaluate`` against the brute-force oracle (tests/oracle.py).


BASE_METRICS = ["precision_at_1", "r_precision", "map_at_r", "map", "mrr", "recall_at_1"]


def draw_case(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    n_ref = int(rng.choice([300, 2500, 5000]))
    distance = str(rng.choice(["euclidean", "cosine", "inner_product"]))
    dim = int(rng.integers(2, 6))
    if distance == "cosine":
        directions = rng.standard_normal((int(rng.integers(8, 40)), dim)).astype(np.float32)
        pick = rng.integers(0, directions.shape[0], n_ref)
        x = directions[pick] * np.ldexp(np.float32(1), rng.integers(-2, 3, n_ref))[:, None]
    else:
        x = rng.integers(-3, 4, (n_ref, dim)).astype(np.float32)
        x[np.all(x == 0, axis=1), 0] = 1  # no zero rows (harmless, but keep cases comparable)
    big = float(rng.choice([0.3, 0.9, 0.97]))
    y = np.where(rng.random(n_ref) < big, 0, rng.integers(1, 30, n_ref))
    groups = None
    if rng.random() < 0.4:
        cover = float(rng.choice([0.5, 0.99]))
        groups = np.where(rng.random(n_ref) < cover, 0, rng.integers(1, 5, n_ref))
    n_query = int(rng.integers(5, 25))
    includes = bool(rng.random() < 0.5)
    if includes:
        q, ql = x[:n_query], y[:n_query]
        qg = None if groups is None else groups[:n_query]
    else:
        src = rng.integers(0, n_ref, n_query)  # queries identical to gallery rows, or near them
        q = x[src].copy()
        if distance != "cosine":
            q[::2] += 1
        ql = y[src]
        qg = None if groups is None else groups[src]
    k = [None, int(rng.integers(1, 40)), "max_bin_count", 2**62][int(rng.integers(0, 4))]
    metrics = list(BASE_METRICS)
    if k is None or (isinstance(k, int) and k >= 5):
        metrics += ["recall_at_5", "precision_at_3"]
    return dict(q=q, ql=ql, x=x, y=y, qg=qg, rg=groups, includes=includes, k=k,
                distance=distance, metrics=metrics)  # fmt: skip


def check_case(case: dict) -> None:
    kw = dict(metrics=case["metrics"], k=case["k"], distance=case["distance"], progress=False)
    if case["rg"] is not None:
        kw.update(query_groups=case["qg"], reference_groups=case["rg"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if case["k"] == "max_bin_count" and all(
            np.sum(case["y"] == label) <= 1 for label in case["ql"]
        ):
            return
        res = ee.evaluate(case["q"], case["ql"], case["x"], case["y"],
                          ref_includes_query=case["includes"], **kw)  # fmt: skip
    _, want, _ = oracle.evaluate(case["q"], case["ql"], case["x"], case["y"],
                                 metrics=case["metrics"], k=case["k"],
                                 distance=case["distance"],
                                 ref_includes_query=case["includes"],
                                 qg=case["qg"], rg=case["rg"])  # fmt: skip
    ok = np.ones(len(case["q"]), dtype=bool)
    if case["distance"] == "cosine":
        # Distinct directions can be closer than float32 resolves (the README's float32
        # ties): leave out the rare query whose distinct distances nearly coincide.
        ranks = oracle.rankings(case["q"], case["ql"], case["x"], case["y"],
                                distance="cosine", ref_includes_query=case["includes"],
                                qg=case["qg"], rg=case["rg"])  # fmt: skip
        for i, (_, dist) in enumerate(ranks):
            ok[i] = len(dist) < 2 or np.diff(np.unique(dist)).min(initial=1.0) > 1e-5
    for m in case["metrics"]:
        np.testing.assert_allclose(res.per_query[m][ok],
                                   np.asarray(want[m], dtype=np.float64)[ok],
                                   rtol=1e-9, atol=0, equal_nan=True, err_msg=m)  # fmt: skip


# Seeds 28, 56, 72 and 110 are cases where a sampled depth cut-off of +inf once let excluded
# references into map / mrr.
@pytest.mark.parametrize("seed", [*range(12), 28, 56, 72, 110])
def test_evaluate_equals_the_brute_force_oracle(seed):
    check_case(draw_case(seed))


@pytest.mark.parametrize("scale", [5e-23, 3e-24, 2e17])
@pytest.mark.parametrize("search", [{}, {"backend": "torch", "device": "cpu", "precision": "bf16"}])
@pytest.mark.parametrize("distance", ["euclidean", "inner_product"])
def test_rows_of_tiny_or_huge_magnitude_rank_as_float64_does(scale, search, distance):
    # products of rows near 1e-23 fall far below float32's normal range, near 2e17 the squared
    # norms come close to its largest value: leave-one-out and a gallery, against the oracle
    if search:
        pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((240, 6)) * scale).astype(np.float32)
    y = rng.integers(0, 5, 240)
    names = ["precision_at_1", "map_at_r", "map"]
    for args in ((x, y), (x[:80], y[:80], x[80:], y[80:])):
        res = ee.evaluate(*args, metrics=names, distance=distance, progress=False, **search)
        _, want = oracle.summary(*args, metrics=names, distance=distance)
        for name in names:
            np.testing.assert_allclose(res.per_query[name], want[name], rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("gq", "gb"),
    [(["0"], [0, 0, 1]), ([0], ["0", "0", "1"]), ([b"0"], ["0", "0", "1"])],
)
def test_query_and_reference_groups_of_text_and_numbers_are_refused(gq, gb):
    from embedeval.evaluation.gallery import gallery_rows

    # group "0" never equals group 0: the same-group references (rows 0 and 1, the query's
    # two nearest) would silently stay in the ranking instead of being hidden
    x = np.array([[0.0], [0.1], [0.2]], dtype=np.float32)
    q, yq, yb = x[:1], [1], [1, 2, 1]
    match = r"query_groups holds .* reference_groups holds"
    with pytest.raises(ee.InputError, match=match):
        ee.evaluate(q, yq, x, yb, query_groups=gq, reference_groups=gb)
    with pytest.raises(ee.InputError, match=match):
        ee.neighbors(q, 1, x, query_groups=gq, reference_groups=gb)
    with pytest.raises(ee.InputError, match=match):
        gallery_rows(
            [0],
            2,
            query=q,
            query_labels=yq,
            reference=x,
            reference_labels=yb,
            query_groups=gq,
            reference_groups=gb,
        )
    ev = ee.Evaluator(metrics=["map"])
    ev.update(q, yq, split="query", groups=gq)
    ev.update(x, yb, split="reference", groups=gb)
    with pytest.raises(ee.InputError, match=match):
        ev.compute()


def test_groups_of_one_kind_in_different_dtypes_hide_the_same_group():
    # by hand: rows 0 and 1 share the query's group and are hidden; row 2 is the only match
    x = np.array([[0.0], [0.1], [0.2]], dtype=np.float32)
    for gq, gb in [([0.0], [0, 0, 1]), (np.array([0], np.uint8), [0, 0, 1])]:
        res = ee.evaluate(
            x[:1], [1], x, [1, 2, 1], query_groups=gq, reference_groups=gb, metrics=["map"]
        )
        assert res["map"] == 1.0 and res.settings["n_reference"] == 3
