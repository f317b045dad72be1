"""Hand-computed cases for ``embedeval.evaluate``: every expected value is a fraction worked out
in the comments, independent of the package and of tests/oracle.py."""

import math
import warnings
from fractions import Fraction as F

import numpy as np
import pytest

import embedeval as ee
from embedeval._errors import EmbedevalWarning

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
    # the recipe of SPEC §2.1: faiss k-means, n_clusters = distinct query labels, 20 iterations,
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
