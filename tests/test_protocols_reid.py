"""Re-identification: mINP, CMC and the Market-1501 convention against plain-loop oracles."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import embedeval as ee
from embedeval.protocols import reid


def market_loop(dist, q_ids, g_ids, q_cams, g_cams, max_rank):
    """The published Market-1501 evaluation, as loops: per query, rank the gallery (ties by
    gallery index), drop same-identity-same-camera items, skip queries with no match left;
    CMC from the first match, AP as the mean precision at each match, INP = matches / rank of
    the last match."""
    cmcs, aps, inps = [], [], []
    for q in range(dist.shape[0]):
        order = sorted(range(dist.shape[1]), key=lambda j: (dist[q, j], j))
        kept = [j for j in order if not (g_ids[j] == q_ids[q] and g_cams[j] == q_cams[q])]
        matches = [1 if g_ids[j] == q_ids[q] else 0 for j in kept]
        if sum(matches) == 0:
            continue
        first = matches.index(1)
        cmcs.append([1.0 if r >= first else 0.0 for r in range(max_rank)])
        found, precisions = 0, []
        for i, m in enumerate(matches):
            if m:
                found += 1
                precisions.append(found / (i + 1))
        aps.append(sum(precisions) / found)
        last = max(i for i, m in enumerate(matches) if m)
        inps.append(found / (last + 1))
    return np.mean(cmcs, axis=0), float(np.mean(aps)), float(np.mean(inps)), len(aps)


def market_like(seed, n_ids=12, n_cams=3, n_q=30, n_g=120, integer=False):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((n_ids, 8)) * 1.5
    q_ids = rng.integers(0, n_ids, n_q)
    g_ids = rng.integers(-1, n_ids, n_g)  # -1: junk
    q = centers[q_ids] + rng.standard_normal((n_q, 8))
    g = centers[np.maximum(g_ids, 0)] + rng.standard_normal((n_g, 8))
    if integer:  # coarse values: many exactly equal distances
        q, g = np.round(q), np.round(g)
    return (
        q.astype(np.float32),
        q_ids,
        rng.integers(0, n_cams, n_q),
        g.astype(np.float32),
        g_ids,
        rng.integers(0, n_cams, n_g),
    )


@pytest.mark.parametrize("integer", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_market_protocol_matches_loop(seed, integer):
    q, qi, qc, g, gi, gc = market_like(seed, integer=integer)
    res = reid.evaluate_reid(q, qi, qc, g, gi, gc, metrics=["map", "minp", "mrr"])
    keep = gi != -1  # junk dropped before ranking
    gk, gik, gck = g[keep], gi[keep], gc[keep]
    # Squared Euclidean distances of small integers are exact; for the float case the ranking
    # is the same as float64's for these well-separated values.
    dist = ((q[:, None, :].astype(np.float64) - gk[None, :, :]) ** 2).sum(-1)
    cmc, mean_ap, minp, n_valid = market_loop(dist, qi, gik, qc, gck, 10)
    assert res.n_queries - res.n_lone == n_valid
    assert res["map"] == pytest.approx(mean_ap, abs=1e-12)
    assert res["minp"] == pytest.approx(minp, abs=1e-12)
    np.testing.assert_allclose(res.cmc(10), cmc, rtol=0, atol=1e-12)


def test_one_query_minp_by_hand():
    # Query at 0 (identity 7, camera 0).  Gallery by distance: 1 (id 7, cam 0: hidden),
    # 2 (id 3), 3 (id 7, cam 1), 4 (id 3), 5 (id 7, cam 2), 6 (id 3).
    # Ranking after hiding: id3, id7, id3, id7, id3 -> matches at ranks 2 and 4.
    # INP = R_q / rank of the last match = 2 / 4 = 0.5;  AP = (1/2 + 2/4) / 2 = 0.5;
    # CMC = [0, 1, 1, 1, 1].
    g = np.arange(1.0, 7.0)[:, None]
    res = reid.evaluate_reid(
        [[0.0]], [7], [0], g, [7, 3, 7, 3, 7, 3], [0, 1, 1, 0, 2, 1], metrics=["minp", "map", "mrr"]
    )
    assert res["minp"] == 0.5
    assert res["map"] == 0.5
    assert res.cmc(5).tolist() == [0.0, 1.0, 1.0, 1.0, 1.0]


def minp_loop(x, y):
    """Leave-one-out INP per query with ties broken by index; NaN for lone queries."""
    out = []
    for q in range(len(x)):
        d = [((x[q] - x[j]) ** 2).sum() for j in range(len(x))]
        order = sorted((j for j in range(len(x)) if j != q), key=lambda j: (d[j], j))
        rel = [y[j] == y[q] for j in order]
        if not any(rel):
            out.append(np.nan)
            continue
        last = max(i for i, r in enumerate(rel) if r)
        out.append(sum(rel) / (last + 1))
    return np.array(out)


@pytest.mark.parametrize("seed", range(4))
def test_minp_per_query_with_ties_and_lone_queries(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 3, (40, 2)).astype(np.float32)  # many duplicate points
    y = rng.integers(0, 8, 40)
    y[0] = 99  # a lone query
    res = ee.evaluate(x, y, metrics=["minp"])
    want = minp_loop(x.astype(np.float64), y)
    np.testing.assert_allclose(res.per_query["minp"], want, rtol=0, atol=1e-12)
    assert np.isnan(res.per_query["minp"][0]) and res.n_lone >= 1
    assert res["minp"] == pytest.approx(np.nanmean(want))
    # The tie count is the number of queries whose last relevant item shares its distance with
    # a non-relevant one (only that block can move the last relevant rank).
    assert res.n_ties["minp"] == _tie_mask(x, y).sum()


def test_minp_unflagged_queries_do_not_depend_on_tie_order():
    rng = np.random.default_rng(11)
    x = rng.integers(0, 3, (50, 2)).astype(np.float32)
    y = rng.integers(0, 6, 50)
    perm = rng.permutation(50)
    a = ee.evaluate(x, y, metrics=["minp"], progress=False)
    b = ee.evaluate(x[perm], y[perm], metrics=["minp"], progress=False)
    # Permuting rows changes the index tie-break; a value may move only where a tie was flagged.
    va, vb = a.per_query["minp"][perm], b.per_query["minp"]
    changed = ~np.isclose(va, vb, equal_nan=True)
    tied = _tie_mask(x, y)[perm]
    assert a.n_ties["minp"] == tied.sum() > 0
    assert changed.any() and not (changed & ~tied).any()


def _tie_mask(x, y):
    """Queries whose last relevant item shares its distance with a non-relevant item."""
    out = np.zeros(len(x), bool)
    for q in range(len(x)):
        d = ((x - x[q]) ** 2).sum(1)
        others = np.arange(len(x)) != q
        rel = (y == y[q]) & others
        if not rel.any():
            continue
        last_d = d[rel].max()
        out[q] = ((d == last_d) & ~rel & others).any()
    return out


def test_cmc_equals_recall_at_k_and_needs_mrr():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((60, 4)).astype(np.float32)
    y = rng.integers(0, 10, 60)
    res = ee.evaluate(x, y, metrics=["mrr", "recall_at_1", "recall_at_3", "recall_at_5"])
    cmc = res.cmc(5)
    assert cmc[[0, 2, 4]].tolist() == [res["recall_at_1"], res["recall_at_3"], res["recall_at_5"]]
    assert (np.diff(cmc) >= 0).all()
    with pytest.raises(ee.InputError, match="'mrr' among the metrics"):
        ee.evaluate(x, y, metrics=["map"]).cmc(5)
    with pytest.raises(ee.InputError, match="deeper than the ranking"):
        ee.evaluate(x, y, metrics=["mrr"], k=3).cmc(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the evaluation warns that every query is lone
        lone = ee.evaluate(x[:4], [0, 1, 2, 3], metrics=["mrr"])
    with pytest.raises(ee.InputError, match="no query to average"):
        lone.cmc(5)


def test_minp_bootstrap_and_compare():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((80, 4)).astype(np.float32)
    y = rng.integers(0, 8, 80)
    a = ee.evaluate(x, y, metrics=["minp", "map"], ci=0.9, n_boot=200)
    lo, hi = a.ci["minp"]
    assert lo <= a["minp"] <= hi
    b = ee.evaluate(x + 0.3 * rng.standard_normal(x.shape).astype(np.float32), y, metrics=["minp"])
    table = ee.compare({"a": a, "b": b}, metrics=["minp"], n_boot=200)
    assert "minp" in table.to_markdown()


def test_identity_camera_groups_hide_only_same_identity_and_camera():
    qg, gg = reid.identity_camera_groups(
        [5, 5], ["c1", "c2"], [5, 5, 6, 5], ["c1", "c2", "c1", "c3"]
    )
    hidden = gg[None, :] == qg[:, None]
    assert hidden.tolist() == [[True, False, False, False], [False, True, False, False]]


def test_minp_is_zero_when_k_hides_the_last_match():
    # 1-D points 0..4 labelled a a b b a, leave-one-out; ties at equal distance by index.
    # Rankings (rank of the last relevant item): q0: 1a 2b 3b 4a -> 4; q1: 0a 2b 3b 4a -> 4;
    # q2: 1a 3b -> 2; q3: 2b -> 1; q4: 3b 2b 1a 0a -> 4.  R_q: 2, 2, 1, 1, 2.
    x = [[0.0], [1.0], [2.0], [3.0], [4.0]]
    y = list("aabba")
    exact = ee.evaluate(x, y, metrics=["minp"]).per_query["minp"]
    np.testing.assert_allclose(exact, [2 / 4, 2 / 4, 1 / 2, 1 / 1, 2 / 4])
    capped = ee.evaluate(x, y, metrics=["minp"], k=3).per_query["minp"]
    np.testing.assert_allclose(capped, [0.0, 0.0, 1 / 2, 1 / 1, 0.0])


def test_minp_hidden_by_k_is_zero_on_the_torch_backend_too():
    pytest.importorskip("torch", reason="the PyTorch backend needs torch")
    x = [[0.0], [1.0], [2.0], [3.0], [4.0]]
    got = ee.evaluate(x, list("aabba"), metrics=["minp"], k=3, backend="torch", device="cpu")
    np.testing.assert_allclose(got.per_query["minp"], [0.0, 0.0, 1 / 2, 1 / 1, 0.0])


# ---------------------------------------------------------------------------- ap_rule


def baseline_compute_map_loop(dist, q_ids, q_cams, g_ids, g_cams, k=None):
    """Per query, the AP of Market-1501's official evaluation as Person_reID_baseline_pytorch's
    compute_mAP ports it, written from its description.  Rank the gallery by distance (ties by
    gallery index, embedeval's rule); good = same identity, other camera; junk = identity -1 and
    same identity same camera, removed from the ranking; distractors (an identity no query has)
    stay.  For the i-th good match (i = 0, 1, ...) at 0-based row r of the junk-free ranking:
    precision = (i + 1) / (r + 1), old_precision = i / r (1 when r = 0), and
    ap += (1 / ngood) * (old_precision + precision) / 2.  None when the query has no good match.
    ``k``: only rows r < k are read (ngood unchanged)."""
    aps = []
    for q in range(dist.shape[0]):
        order = sorted(range(dist.shape[1]), key=lambda j: (dist[q, j], j))
        good = [j for j in order if g_ids[j] == q_ids[q] and g_cams[j] != q_cams[q]]
        junk = [
            j for j in order if g_ids[j] == -1 or (g_ids[j] == q_ids[q] and g_cams[j] == q_cams[q])
        ]
        if not good:
            aps.append(None)
            continue
        ranking = [j for j in order if j not in junk]
        ngood = len(good)
        ap, i = 0.0, 0
        for r, j in enumerate(ranking):
            if k is not None and r >= k:
                break
            if j in good:
                precision = (i + 1) / (r + 1)
                old_precision = i / r if r != 0 else 1.0
                ap += (1.0 / ngood) * (old_precision + precision) / 2
                i += 1
        aps.append(ap)
    return aps


def test_trapezoid_ap_rule_by_hand():
    # Query at 0: identity 1, camera 0.  Gallery: junk (-1) at 0.2 (dropped), identity 1 from
    # camera 0 at 0.5 (hidden), then identity 2 at 1, identity 1 at 2 and 3 (cameras 1, 2), a
    # distractor (identity 9) at 4.  The matches are 2nd and 3rd.
    # Step: (1/2 + 2/3) / 2 = 7/12.  Trapezoid: ((0/1 + 1/2) / 2 + (1/2 + 2/3) / 2) / 2 = 5/12.
    g = [[0.2], [0.5], [1.0], [2.0], [3.0], [4.0]]
    args = ([[0.0]], [1], [0], g, [-1, 1, 2, 1, 1, 9], [1, 0, 1, 1, 2, 0])
    step = reid.evaluate_reid(*args, metrics=["map"])
    trap = reid.evaluate_reid(*args, metrics=["map"], ap_rule="trapezoid")
    assert step["map"] == pytest.approx(7 / 12, abs=1e-15)
    assert trap["map"] == pytest.approx(5 / 12, abs=1e-15)
    assert trap.per_query["map"][0] == pytest.approx(0.4166666666666667, abs=1e-15)
    assert step.settings["ap_rule"] == "step" and trap.settings["ap_rule"] == "trapezoid"


def market_with_ties(seed, integer):
    """market_like plus what real galleries have: duplicated gallery rows (exact ties), a
    distractor identity no query has, and queries without any valid match (an identity absent
    from the gallery; an identity seen only from the query's own camera)."""
    q, qi, qc, g, gi, gc = market_like(seed, integer=integer)
    rng = np.random.default_rng(100 + seed)
    twins = rng.choice(g.shape[0], 15, replace=False)
    g = np.concatenate([g, g[twins], g[:5] + 0.5])
    gi = np.concatenate([gi, gi[twins], np.full(5, 99)])  # 99: distractors
    gc = np.concatenate([gc, rng.integers(0, 3, 15), np.zeros(5, int)])
    q = np.concatenate([q, q[:2]])
    qi = np.concatenate([qi, [50, 51]])  # 50: nowhere in the gallery
    qc = np.concatenate([qc, [1, 2]])
    g = np.concatenate([g, q[-1:]])
    gi = np.concatenate([gi, [51]])  # 51: only from camera 2, the query's own
    gc = np.concatenate([gc, [2]])
    return q.astype(np.float32), qi, qc, g.astype(np.float32), gi, gc


@pytest.mark.parametrize("integer", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_trapezoid_ap_rule_matches_the_baseline_loop_per_query(seed, integer):
    q, qi, qc, g, gi, gc = market_with_ties(seed, integer)
    res = reid.evaluate_reid(q, qi, qc, g, gi, gc, ap_rule="trapezoid")
    # Squared distances of small integers are exact (ties included); the float values are
    # separated enough for float32 and float64 to rank alike.
    dist = ((q[:, None, :].astype(np.float64) - g[None, :, :]) ** 2).sum(-1)
    want = baseline_compute_map_loop(dist, qi, qc, gi, gc)
    got = res.per_query["map"]
    assert [w is None for w in want] == np.isnan(got).tolist()
    assert want[-2] is None and want[-1] is None  # the two queries without a valid match
    np.testing.assert_allclose(got[~np.isnan(got)], [w for w in want if w is not None], atol=1e-12)
    assert res["map"] == pytest.approx(np.mean([w for w in want if w is not None]), abs=1e-12)
    if integer:
        assert res.n_ties["map"] > 0  # the data has exact ties between matches and non-matches
    # The step AP of the same ranking is never below the trapezoid AP.
    step = reid.evaluate_reid(q, qi, qc, g, gi, gc).per_query["map"]
    assert (step[~np.isnan(step)] >= got[~np.isnan(got)] - 1e-15).all()


def test_trapezoid_ap_rule_with_a_depth_cap_matches_the_loop():
    q, qi, qc, g, gi, gc = market_with_ties(0, True)
    res = reid.evaluate_reid(q, qi, qc, g, gi, gc, ap_rule="trapezoid", metrics=["map"], k=5)
    dist = ((q[:, None, :].astype(np.float64) - g[None, :, :]) ** 2).sum(-1)
    want = baseline_compute_map_loop(dist, qi, qc, gi, gc, k=5)
    got = res.per_query["map"]
    np.testing.assert_allclose(got[~np.isnan(got)], [w for w in want if w is not None], atol=1e-12)


def test_trapezoid_map_is_reported_as_map_everywhere():
    q, qi, qc, g, gi, gc = market_with_ties(1, False)
    rng = np.random.default_rng(0)
    res = reid.evaluate_reid(
        q, qi, qc, g, gi, gc, ap_rule="trapezoid", ci=0.9, n_boot=50, confidences=rng.random(32)
    )
    assert list(res.metrics) == list(reid.DEFAULT_REID_METRICS)
    assert res.settings["metrics"] == list(reid.DEFAULT_REID_METRICS)
    assert "aurc_map" in res.confidence and "aurc_map" in res.ci
    lo, hi = res.ci["map"]
    assert lo <= res["map"] <= hi
    assert "trapezoid" not in res.to_json().replace('"ap_rule": "trapezoid"', "")
    # The other metrics do not depend on the AP rule.
    step = reid.evaluate_reid(q, qi, qc, g, gi, gc, ci=0.9, n_boot=50, confidences=rng.random(32))
    for name in ("minp", "precision_at_1", "mrr"):
        np.testing.assert_array_equal(res.per_query[name], step.per_query[name])


def test_ap_rule_bad_input():
    q, qi, qc, g, gi, gc = market_like(0)
    with pytest.raises(ee.InputError, match=r"ap_rule='trapezium' is not valid.*'trapezoid'"):
        reid.evaluate_reid(q, qi, qc, g, gi, gc, ap_rule="trapezium")
    with pytest.raises(ee.InputError, match=r"ap_rule='trapezoid'.*has no 'map'"):
        reid.evaluate_reid(q, qi, qc, g, gi, gc, ap_rule="trapezoid", metrics=["minp"])


def test_junk_ids_as_none_a_single_id_or_string_ids():
    # queries at 0 (id 1, camera 0) and 5 (id 2); gallery 0.1 (id 1, camera 0: hidden), 0.2
    # (id 1), 5.1 (id 2), 9.0 (id -1). Without junk the query at 5 ranks 5.1 then 9.0: AP 1 as
    # with junk; the junk row only changes the gallery's size.
    q, g = [[0.0], [5.0]], [[0.1], [0.2], [5.1], [9.0]]
    for junk, n_junk in ((None, 0), (-1, 1), ((), 0), ((-1,), 1)):
        res = reid.evaluate_reid(q, [1, 2], [0, 0], g, [1, 1, 2, -1], [0, 1, 1, 1], junk_ids=junk)
        assert (res.settings["n_junk"], res.settings["n_reference"]) == (n_junk, 4 - n_junk)
        assert res["map"] == 1.0
    # ids read from Market-1501 file names as strings: the default drops "-1" too
    res = reid.evaluate_reid(q, ["1", "2"], [0, 0], g, ["1", "1", "2", "-1"], [0, 1, 1, 1])
    assert res.settings["n_junk"] == 1 and res.settings["junk_ids"] == ["-1"]


@pytest.mark.parametrize("form", ["pandas", "object", "bytes", "bytes_object"])
def test_junk_text_ids_held_as_objects_or_bytes_are_dropped(form):
    # Query at 0 (id "1", camera 0); gallery 0 (id "-1": junk), 1 and 2 (id "1", cameras 1 and
    # 2). Junk dropped: the matches rank 1 and 2, AP = 1; kept, the junk row ranks first and
    # the matches 2 and 3, AP = (1/2 + 2/3) / 2 = 7/12.
    ids = [b"-1", b"1", b"1"] if form.startswith("bytes") else ["-1", "1", "1"]
    gallery_ids = ids if form == "bytes" else np.array(ids, dtype=object)
    if form == "pandas":
        gallery_ids = pytest.importorskip("pandas").Series(ids)
    res = reid.evaluate_reid([[0.0]], ids[1:2], [0], [[0.0], [1.0], [2.0]], gallery_ids, [0, 1, 2])
    assert res.settings["n_junk"] == 1 and res.settings["junk_ids"] == [ids[0]]
    assert res["map"] == 1.0


@pytest.mark.parametrize("junk", ["-1", ["-1", 0], b"-1"])
def test_text_junk_ids_beside_numeric_gallery_ids_are_refused(junk):
    # "-1" never equals -1: the call would silently keep every junk item in the gallery
    g = [[0.0], [1.0], [2.0]]
    with pytest.raises(ee.InputError, match=r"junk_ids holds text .* junk_ids=-1"):
        reid.evaluate_reid([[0.0]], [1], [0], g, [-1, 1, 1], [0, 1, 2], junk_ids=junk)


@pytest.mark.parametrize(
    ("q_cams", "g_cams"),
    [(["0"], [0, 1, 1]), ([0], ["0", "1", "1"]), ([b"0"], ["0", "1", "1"])],
)
def test_query_and_gallery_cameras_of_text_and_numbers_are_refused(q_cams, g_cams):
    # camera "0" never equals camera 0: the same-camera match at 0.1 would silently stay in
    # the ranking (AP 5/6 instead of the protocol's 1/2)
    g = [[0.1], [0.2], [5.0]]
    with pytest.raises(ee.InputError, match=r"query_cameras holds .* gallery_cameras holds"):
        reid.evaluate_reid([[0.0]], [1], q_cams, g, [1, 2, 1], g_cams)
    with pytest.raises(ee.InputError, match=r"query_cameras holds .* gallery_cameras holds"):
        reid.identity_camera_groups([1], q_cams, [1, 2, 1], g_cams)


def test_query_and_gallery_ids_of_text_and_numbers_are_refused_by_the_groups():
    with pytest.raises(ee.InputError, match=r"query_ids holds .* gallery_ids holds"):
        reid.identity_camera_groups(["1"], [0], [1, 2, 1], [0, 1, 1])


def test_cameras_of_one_kind_in_different_dtypes_hide_the_same_camera():
    # the protocol by hand: the same-camera match at 0.1 is hidden, then a non-match at 0.2
    # and the other-camera match at 5.0: AP = 1/2
    g = [[0.1], [0.2], [5.0]]
    for q_cams, g_cams in [([0.0], [0, 1, 1]), (np.array([0], np.uint8), [0, 1, 1])]:
        assert reid.evaluate_reid([[0.0]], [1], q_cams, g, [1, 2, 1], g_cams)["map"] == 0.5
