"""Differential and property tests: ``embedeval.evaluate`` against the brute-force oracle."""

import itertools
import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import embedeval as ee
from tests import oracle

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
