"""Landmark retrieval: positives / junk lists and the revisited Oxford / Paris protocols."""

from __future__ import annotations

import numpy as np
import pytest

import embedeval as ee
from embedeval.protocols import landmarks as lm


def full_ranking(q, g):
    """Every gallery index per query, nearest first (squared Euclidean, ties by index)."""
    d = ((q[:, None, :].astype(np.float64) - g[None, :, :].astype(np.float64)) ** 2).sum(-1)
    return [sorted(range(g.shape[0]), key=lambda j, i=i: (d[i, j], j)) for i in range(len(q))]


def revisitop_loop(ranking, gnd, protocol, kappas):
    """The revisited benchmark's evaluation as loops: positions of the positives in the full
    ranking, each lowered by the junk items ranked before it; trapezoid AP; mP@k over
    min(k, last positive rank); queries without positives skipped."""
    pos_keys, junk_keys = {
        "easy": (["easy"], ["junk", "hard"]),
        "medium": (["easy", "hard"], ["junk"]),
        "hard": (["hard"], ["junk", "easy"]),
    }[protocol]
    aps, prs = [], []
    for order, g in zip(ranking, gnd, strict=True):
        ok = {v for k in pos_keys for v in g[k]}
        junk = {v for k in junk_keys for v in g[k]}
        if not ok:
            continue
        pos = [i for i, j in enumerate(order) if j in ok]
        junk_pos = [i for i, j in enumerate(order) if j in junk]
        pos = [p - sum(1 for jp in junk_pos if jp < p) for p in pos]
        ap = 0.0
        for j, r in enumerate(pos):
            p0 = 1.0 if r == 0 else j / r
            p1 = (j + 1) / (r + 1)
            ap += (p0 + p1) / 2 / len(ok)
        aps.append(ap)
        one_based = [p + 1 for p in pos]
        row = []
        for k in kappas:
            kq = min(max(one_based), k)
            row.append(sum(1 for p in one_based if p <= kq) / kq)
        prs.append(row)
    return float(np.mean(aps)), np.mean(prs, axis=0)


def random_gnd(rng, n_q, n_g):
    gnd = []
    for _ in range(n_q):
        perm = rng.permutation(n_g)
        a, b, c = rng.integers(0, 6, 3)
        gnd.append({"easy": perm[:a].tolist(), "hard": perm[a : a + b].tolist(),
                    "junk": perm[a + b : a + b + c].tolist()})  # fmt: skip
    return gnd


@pytest.mark.parametrize("seed", range(4))
def test_revisitop_matches_loop(seed):
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 3, (12, 3)).astype(np.float32)  # integer points: many exact ties
    g = rng.integers(0, 3, (40, 3)).astype(np.float32)
    gnd = random_gnd(rng, 12, 40)
    got = lm.revisitop_evaluate(q, g, gnd, distance="euclidean", block_size=5)
    ranking = full_ranking(q, g)
    for protocol in ("easy", "medium", "hard"):
        want_map, want_pr = revisitop_loop(ranking, gnd, protocol, (1, 5, 10))
        assert got[protocol]["map"] == pytest.approx(want_map, abs=1e-12)
        for k, want in zip((1, 5, 10), want_pr, strict=True):
            assert got[protocol][f"mp@{k}"] == pytest.approx(want, abs=1e-12)
        # embedeval's own map on the same lists is the step AP of the same ranking.
        pos, junk = lm.revisitop_lists(gnd, protocol)
        res = ee.evaluate(q, None, g, None, positives=pos, junk=junk, metrics=["map"])
        assert res["map"] == pytest.approx(got[protocol]["map_step"], abs=1e-12)
        # (j - 1) / (r - 1) <= j / r for r >= j: the trapezoid is never above the step AP.
        assert got[protocol]["map"] <= got[protocol]["map_step"] + 1e-12


def listed_loop(ranking, positives, junk, k_values):
    """Step metrics on each junk-free ranking; NaN for a query without positives."""
    out = {
        "map": [],
        "mrr": [],
        "minp": [],
        "r_precision": [],
        "map_at_r": [],
        **{f"precision_at_{k}": [] for k in k_values},
        **{f"recall_at_{k}": [] for k in k_values},
    }
    for order, pos, jk in zip(ranking, positives, junk, strict=True):
        rel = [j in set(pos) for j in order if j not in set(jk)]
        r = len(set(pos))
        if r == 0:
            for v in out.values():
                v.append(np.nan)
            continue
        hits = [i for i, x in enumerate(rel) if x]
        out["map"].append(sum((n + 1) / (i + 1) for n, i in enumerate(hits)) / r)
        out["mrr"].append(1 / (hits[0] + 1))
        out["minp"].append(r / (hits[-1] + 1))
        out["r_precision"].append(sum(rel[:r]) / r)
        out["map_at_r"].append(sum((n + 1) / (i + 1) for n, i in enumerate(hits) if i < r) / r)
        for k in k_values:
            out[f"precision_at_{k}"].append(sum(rel[:k]) / k)
            out[f"recall_at_{k}"].append(float(any(rel[:k])))
    return {m: np.array(v) for m, v in out.items()}


@pytest.mark.parametrize("seed", range(4))
def test_positives_lists_match_loop(seed):
    rng = np.random.default_rng(seed + 10)
    q = rng.integers(0, 3, (15, 2)).astype(np.float32)
    g = rng.integers(0, 3, (30, 2)).astype(np.float32)
    gnd = random_gnd(rng, 15, 30)
    positives = [d["easy"] + d["hard"] for d in gnd]
    junk = [d["junk"] for d in gnd]
    metrics = ["map", "mrr", "minp", "r_precision", "map_at_r", "precision_at_1",
               "precision_at_5", "recall_at_1", "recall_at_5"]  # fmt: skip
    res = ee.evaluate(q, None, g, None, positives=positives, junk=junk, metrics=metrics)
    want = listed_loop(full_ranking(q, g), positives, junk, (1, 5))
    for m in metrics:
        np.testing.assert_allclose(res.per_query[m], want[m], rtol=0, atol=1e-12, err_msg=m)
    assert res.n_lone == sum(1 for p in positives if not p)
    # Blocked and one-shot runs agree exactly, values and tie counts.
    one = ee.evaluate(q, None, g, None, positives=positives, junk=junk, metrics=metrics,
                      block_size=1)  # fmt: skip
    for m in metrics:
        np.testing.assert_array_equal(one.per_query[m], res.per_query[m])
    assert one.n_ties == res.n_ties


def test_junk_removal_by_hand():
    # Query at 0; gallery at 1, 2, 3, 4.  Positives {1, 3}, junk {0, 2}: the junk-free ranking
    # is (1, 3) -> both positives first: AP 1, P@1 1.  Without junk: ranking 0, 1, 2, 3 with
    # positives at ranks 2 and 4: AP (1/2 + 2/4) / 2 = 0.5.
    q, g = [[0.0]], [[1.0], [2.0], [3.0], [4.0]]
    res = ee.evaluate(q, None, g, None, positives=[[1, 3]], junk=[[0, 2]], metrics=["map"])
    assert res["map"] == 1.0
    res = ee.evaluate(q, None, g, None, positives=[[1, 3]], metrics=["map", "minp"])
    assert res["map"] == 0.5 and res["minp"] == 0.5  # 2 / rank 4


def test_trapezoid_ap_by_hand_against_step():
    # One query, 2 positives at ranks 1 and 3 (1-based).  Step AP = (1/1 + 2/3) / 2 = 5/6.
    # Trapezoid: first positive (1 + 1) / 2 = 1; second (1/2 + 2/3) / 2 = 7/12; AP = 19/24.
    ap = lm.trapezoid_ap(np.array([0, 2]), np.array([0, 2]))
    assert ap[0] == pytest.approx(19 / 24)


def test_revisitop_protocol_without_any_positive():
    # Every hard list is empty: the Hard protocol has no query with a positive, so its mAP and
    # mP@k are undefined (NaN over 0 queries), while Easy still scores: the positive 0 (at 1.0)
    # is ranked first by both queries, AP = 1.
    gnd = [{"easy": [0], "hard": [], "junk": []}] * 2
    out = lm.revisitop_evaluate(
        [[0.0], [1.0]], [[1.0], [2.0]], gnd, protocols=["hard", "easy"], distance="euclidean"
    )
    assert out["hard"]["n_queries"] == 0
    assert np.isnan(out["hard"]["map"]) and np.isnan(out["hard"]["mp@5"])
    assert np.isnan(out["hard"]["ap"]).all() and out["hard"]["ap"].size == 2
    assert out["easy"]["map"] == 1.0 and out["easy"]["n_queries"] == 2


def test_identical_references_tie_and_rank_by_index():
    # Reference 5 is a copy of reference 0 and the query lies next to them: in exact arithmetic
    # both are its nearest, tied, so reference 0 ranks first (lower index) and the positive
    # (the copy) second: step AP = 1/2; trapezoid AP = (0/1 + 1/2) / 2 = 1/4.  A float32
    # product could put the copy one unit in the last place nearer and rank it first.
    rng = np.random.default_rng(67)
    d, nb = int(rng.integers(4, 20)), int(rng.integers(3, 12))
    db = rng.standard_normal((nb, d)).astype(np.float32)
    db[-1] = db[0]
    q = (db[:1] + 0.05 * rng.standard_normal((1, d))).astype(np.float32)
    res = ee.evaluate(q, None, db, None, positives=[[nb - 1]], metrics=["map"], distance="cosine")
    assert res["map"] == 0.5
    gnd = [{"easy": [nb - 1], "hard": [], "junk": []}]
    out = lm.revisitop_evaluate(q, db, gnd, protocols=["easy"])
    assert out["easy"]["map"] == 0.25 and out["easy"]["map_step"] == 0.5


def test_ci_and_compare_with_lists():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((20, 4)).astype(np.float32)
    g = rng.standard_normal((50, 4)).astype(np.float32)
    positives = [rng.choice(50, 3, replace=False).tolist() for _ in range(20)]
    a = ee.evaluate(q, None, g, None, positives=positives, metrics=["map"], ci=0.9, n_boot=100)
    lo, hi = a.ci["map"]
    assert lo <= a["map"] <= hi
    b = ee.evaluate(q + 0.1, None, g, None, positives=positives, metrics=["map"])
    assert "map" in ee.compare({"a": a, "b": b}, n_boot=100).to_markdown()


def test_lists_as_2d_integer_array():
    q, g = [[0.0], [3.0]], [[1.0], [2.0], [3.0]]
    as_lists = ee.evaluate(q, None, g, None, positives=[[1], [0]], metrics=["map"])
    as_array = ee.evaluate(q, None, g, None, positives=np.array([[1], [0]]), metrics=["map"])
    # Query 0: positive 1 (at 2.0) is 2nd -> 1/2.  Query 1: positive 0 (at 1.0) is 3rd -> 1/3.
    assert as_lists.per_query["map"].tolist() == as_array.per_query["map"].tolist()
    assert as_array.per_query["map"] == pytest.approx([1 / 2, 1 / 3])


def test_lists_bad_input():
    q, g = [[0.0]], [[1.0], [2.0]]
    with pytest.raises(ee.InputError, match="both a positive and junk for query 0"):
        ee.evaluate(q, None, g, None, positives=[[0]], junk=[[0]])
    with pytest.raises(ee.InputError, match="replaces labels"):
        ee.evaluate(q, [0], g, [0, 1], positives=[[0]])
    with pytest.raises(ee.InputError, match="outside the reference set"):
        ee.evaluate(q, None, g, None, positives=[[2]])
    with pytest.raises(ee.InputError, match="2 lists but there are 1 queries"):
        ee.evaluate(q, None, g, None, positives=[[0], [1]])
    with pytest.raises(ee.InputError, match="query_groups"):
        ee.evaluate(q, None, g, None, positives=[[0]], query_groups=[0])
    with pytest.raises(ee.InputTypeError, match="2-D integer array"):
        ee.evaluate(q, None, g, None, positives=np.array([0.5]))
    with pytest.raises(ee.InputError, match="protocol="):
        lm.revisitop_lists([{"easy": [], "hard": [], "junk": []}], "medum")


# ---------------------------------------------------------------------------- repeated indices
# A database at 0, 1, ..., 5 on a line and queries at 0: reference j is at distance j, so the
# ranking is 0, 1, 2, ... (0-based rank j for reference j).

LINE = np.arange(6.0)[:, None]


def test_distinct_positives_by_hand():
    # Positive {1}: 2nd of the ranking.  Step AP = 1/2; trapezoid AP = (0/1 + 1/2) / 2 = 1/4.
    res = ee.evaluate([[0.0]], None, LINE, None, positives=[[1]], metrics=["map"])
    assert res["map"] == 0.5
    ranks, lims = lm.positive_ranks([[0.0]], LINE, [[1]], distance="euclidean")
    assert lm.trapezoid_ap(ranks, lims).tolist() == [0.25]
    # Medium with easy {1, 3}, hard {}: positives at 0-based ranks 1 and 3.  Step AP =
    # (1/2 + 2/4) / 2 = 1/2; trapezoid AP = ((0/1 + 1/2) / 2 + (1/3 + 2/4) / 2) / 2 = 1/3.
    gnd = [{"easy": [1, 3], "hard": [], "junk": []}]
    out = lm.revisitop_evaluate([[0.0]], LINE, gnd, protocols=["medium"], distance="euclidean")
    assert out["medium"]["map"] == pytest.approx(1 / 3)
    assert out["medium"]["map_step"] == pytest.approx(1 / 2)


def test_a_repeated_positive_is_refused_naming_query_and_index():
    # Counted once, positives [1, 1] would give step AP 1/2 (trapezoid 1/4); counted as
    # revisitop's code counts them (R = 2), 1/4 (trapezoid 1/8).  Neither reading is safe.
    with pytest.raises(
        ee.InputError,
        match=r"positives\[0\] \(query 0\) lists reference index 1 2 times.*distinct "
        r"positives.*np\.unique\(positives\[0\]\)",
    ):
        ee.evaluate([[0.0]], None, LINE, None, positives=[[1, 1]], metrics=["map"])
    # The query is named by its position; the same check on every path that reads lists.
    two = [[0.0], [0.0]]
    with pytest.raises(ee.InputError, match=r"positives\[1\] \(query 1\).*index 4 3 times"):
        lm.positive_ranks(two, LINE, [[2], [4, 0, 4, 4]], distance="euclidean")
    with pytest.raises(ee.InputError, match=r"positives\[1\] \(query 1\).*index 5 2 times"):
        ee.evaluate(two, None, LINE, None, positives=np.array([[1, 2], [5, 5]]))


def test_a_repeated_junk_index_is_refused_naming_query_and_index():
    with pytest.raises(
        ee.InputError,
        match=r"junk\[1\] \(query 1\) lists reference index 3 2 times.*"
        r"np\.unique\(junk\[1\]\)",
    ):
        ee.evaluate([[0.0], [0.0]], None, LINE, None, positives=[[1], [2]], junk=[[], [3, 0, 3]])


def test_positive_and_junk_of_one_query_is_refused_naming_both_lists():
    with pytest.raises(
        ee.InputError,
        match=r"reference 3 is both a positive and junk for query 1 \(in positives\[1\] and "
        r"junk\[1\]\).*Remove it from one",
    ):
        ee.evaluate([[0.0], [0.0]], None, LINE, None, positives=[[1], [2, 3]], junk=[[3], [0, 3]])


@pytest.mark.parametrize("protocol", ["easy", "medium", "hard"])
def test_revisitop_lists_refuse_an_index_with_two_labels(protocol):
    # easy = [1, 3], hard = [3]: under Medium revisitop's code would count 3 twice in R (AP
    # ((0/1 + 1/2) / 2 + (1/3 + 2/4) / 2) / 3 = 2/9 instead of the 1/3 above); under Easy and
    # Hard, 3 would be a positive and junk at once.  Refused under every protocol, naming the
    # query (by position in gnd), the index and the two lists.
    gnd = [{"easy": [0], "hard": [], "junk": []}, {"easy": [1, 3], "hard": [3], "junk": []}]
    with pytest.raises(
        ee.InputError,
        match=r"gnd\[1\] \(query 1\) lists reference index 3 in both 'easy' and 'hard'.*"
        r"Keep the index in one list",
    ):
        lm.revisitop_lists(gnd, protocol)
    with pytest.raises(ee.InputError, match=r"gnd\[1\] \(query 1\).*both 'easy' and 'hard'"):
        lm.revisitop_evaluate([[0.0], [0.0]], LINE, gnd, protocols=[protocol])
    gnd[1] = {"easy": [1], "hard": [2], "junk": [5, 2]}
    with pytest.raises(ee.InputError, match=r"index 2 in both 'hard' and 'junk'"):
        lm.revisitop_lists(gnd, protocol)


def test_revisitop_lists_refuse_a_repeat_within_one_list():
    gnd = [{"easy": [2, 4, 2], "hard": [], "junk": []}]
    with pytest.raises(
        ee.InputError,
        match=r"gnd\[0\]\['easy'\] \(query 0\) lists reference index 2 more than once.*"
        r"np\.unique\(gnd\[0\]\['easy'\]\)",
    ):
        lm.revisitop_lists(gnd, "hard")  # refused even where 'easy' only becomes junk


def test_relevance_lists_refuse_a_reference_of_another_dimension():
    q, g = np.ones((2, 4), dtype=np.float32), np.ones((3, 5), dtype=np.float32)
    with pytest.raises(ee.InputError, match="query has dimension 4 but reference has 5"):
        ee.evaluate(q, None, g, None, positives=[[0], [1]], metrics=["map"])


@pytest.mark.parametrize("value", [2.7, 1.0, "3", True])
def test_revisitop_lists_refuse_an_index_that_is_not_an_integer(value):
    # int() would read 2.7 as reference 2, "3" as 3 and True as 1; a float list (as MATLAB
    # stores the ground truth) may also be 1-based.  The positives= path refuses them too.
    gnd = [{"easy": [0], "hard": [], "junk": []}, {"easy": [4], "hard": [value], "junk": []}]
    with pytest.raises(
        ee.InputTypeError,
        match=r"gnd\[1\]\['hard'\] \(query 1\) must hold integer reference indices.*0-based",
    ):
        lm.revisitop_lists(gnd, "easy")
    gnd[1]["hard"] = np.array([3, 1], dtype=np.int32)  # numpy integers are indices
    assert lm.revisitop_lists(gnd, "medium") == ([[0], [1, 3, 4]], [[], []])


def test_revisitop_kappas_given_once_serve_every_protocol():
    # Query at 0, positive 1 (easy), junk none: rank 2 of the line, so revisitop's mP@1 = 0/1
    # and mP@2 = 1/2 under Easy and Medium alike, also when the k's come from a generator.
    gnd = [{"easy": [1], "hard": [], "junk": []}]
    out = lm.revisitop_evaluate(
        [[0.0]], LINE, gnd, protocols=["easy", "medium"], kappas=(k for k in (1, 2)),
        distance="euclidean",
    )  # fmt: skip
    for protocol in ("easy", "medium"):
        assert (out[protocol]["mp@1"], out[protocol]["mp@2"]) == (0.0, 0.5)


@pytest.mark.parametrize(
    ("argument", "value"), [("protocols", "hard"), ("kappas", 10), ("kappas", None)]
)
def test_revisitop_protocols_and_kappas_must_be_sequences(argument, value):
    gnd = [{"easy": [1], "hard": [2], "junk": []}]
    with pytest.raises(ee.InputTypeError, match=rf"{argument} must be a sequence.*in a list"):
        lm.revisitop_evaluate([[0.0]], LINE, gnd, distance="euclidean", **{argument: value})


def test_revisitop_ground_truth_errors_name_gnd():
    # they named the positives / junk lists built from it, which the caller never wrote
    x = np.eye(2, dtype=np.float32)
    one = {"easy": [0], "hard": [], "junk": []}
    with pytest.raises(ee.InputError, match=r"gnd has 1 entries but query has 2 rows"):
        lm.revisitop_evaluate(x, x, [one])
    far = {"easy": [0], "hard": [], "junk": [5]}
    with pytest.raises(ee.InputError, match=r"gnd\[1\]\['junk'\] \(query 1\) holds index 5"):
        lm.revisitop_evaluate(x, x, [one, far])
