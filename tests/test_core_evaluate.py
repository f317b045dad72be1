"""embedeval.evaluate against hand-computed fractions and the brute-force oracle."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import embedeval as ee
from tests.core_oracle import oracle, ranked_relevance

ALL = ["precision_at_1", "r_precision", "map_at_r", "map", "mrr", "recall_at_2", "precision_at_3"]

# 1-D leave-one-out example: points 0, 1, 2, 10, 11 with labels a b a b b (worked by hand in the
# comments; distances are small integers, so float32 keys are exact).
X1 = [[0.0], [1.0], [2.0], [10.0], [11.0]]
Y1 = ["a", "b", "a", "b", "b"]


def test_oracle_itself_on_the_hand_case():
    _, pq = oracle(np.array(X1), Y1, metrics=["map", "mrr"])
    assert pq["map"].tolist() == pytest.approx([1 / 2, 5 / 12, 1 / 2, 5 / 6, 5 / 6])
    assert pq["mrr"].tolist() == pytest.approx([1 / 2, 1 / 3, 1 / 2, 1, 1])


def test_leave_one_out_hand_fractions_micro():
    res = ee.evaluate(X1, Y1, metrics=["precision_at_1", "r_precision", "map_at_r", "map", "mrr"])
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
    res = ee.evaluate(X1, Y1, metrics=["precision_at_1", "map"], average="macro")
    assert res["precision_at_1"] == pytest.approx((0 + 2 / 3) / 2)
    assert res["map"] == pytest.approx((1 / 2 + (5 / 12 + 5 / 6 + 5 / 6) / 3) / 2)
    assert res.per_class["map"] == pytest.approx({"a": 1 / 2, "b": 25 / 36})
    assert set(res.per_class["precision_at_1"]) == {"a", "b"}


def test_int_k_below_r_uses_pml_truncation():
    with pytest.warns(ee.EmbedevalWarning, match="truncated"):
        res = ee.evaluate(X1, Y1, metrics=["r_precision", "map_at_r", "map", "mrr"], k=1)
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
    a = ee.evaluate(q, yq, ref, yr, metrics=ALL, ref_includes_query=True)
    _, expected = oracle(q, yq, ref, yr, metrics=ALL, ref_includes_query=True)
    for m in ALL:
        np.testing.assert_allclose(a.per_query[m], expected[m], rtol=0, atol=1e-12)


def _data(seed, n, d, n_classes, integer):
    rng = np.random.default_rng(seed)
    if integer:  # exact float32 keys: ties are real and must follow the index rule
        x = rng.integers(-3, 4, (n, d)).astype(np.float32)
    else:
        x = rng.standard_normal((n, d)).astype(np.float32)
    return x, rng.integers(0, n_classes, n)


def _well_separated(x, r, distance):
    from tests.core_oracle import distances

    d = np.sort(distances(x, r, distance), axis=1)
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
    summary, per_query = oracle(x, y, metrics=metrics, k=k, average=average, **okw)
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
    if not _well_separated(x, r if split else x, distance):
        return
    res = ee.evaluate(x, y, *((r, yr) if split else ()), metrics=ALL, distance=distance)
    _, expected = oracle(x, y, *((r, yr) if split else ()), metrics=ALL, distance=distance)
    for m in ALL:
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
        for i, (rel, R) in enumerate(ranked_relevance(x, y, x, y, self_exclude=True)):
            if R == 0:
                continue
            order = sorted((j for j in range(len(x)) if j != i), key=lambda j: (d[i, j], j))
            expected += _oracle_ties(rel, [d[i, j] for j in order], R, m, k)
        assert res.n_ties[m] == expected, m


def test_block_size_does_not_change_results():
    x, y = _data(5, 300, 8, 12, integer=False)
    a = ee.evaluate(x, y, metrics=ALL, block_size=1)
    b = ee.evaluate(x, y, metrics=ALL, block_size=64)
    c = ee.evaluate(x, y, metrics=ALL)
    for m in ALL:
        np.testing.assert_array_equal(a.per_query[m], b.per_query[m])
        np.testing.assert_array_equal(a.per_query[m], c.per_query[m])


def test_large_reference_set_uses_the_threshold_path_and_stays_exact():
    # More than 2 x 1024 references: the subsample thresholds and their verification run.
    x, y = _data(11, 3000, 4, 40, integer=True)
    metrics = ["precision_at_1", "r_precision", "map_at_r", "recall_at_5"]
    res = ee.evaluate(x[:200], y[:200], x, y, metrics=metrics)
    _, expected = oracle(x[:200], y[:200], x, y, metrics=metrics)
    for m in metrics:
        np.testing.assert_allclose(res.per_query[m], expected[m], rtol=0, atol=1e-12)


def test_invariances_permutation_relabelling_scaling():
    x, y = _data(2, 60, 6, 5, integer=False)
    base = ee.evaluate(x, y, metrics=ALL, distance="cosine")
    perm = np.random.default_rng(0).permutation(60)
    permuted = ee.evaluate(x[perm], y[perm], metrics=ALL, distance="cosine")
    names = np.array([f"cls{v}" for v in range(5)])
    relabelled = ee.evaluate(x, names[y], metrics=ALL, distance="cosine")
    scaled = ee.evaluate(x * np.linspace(0.5, 3, 60)[:, None], y, metrics=ALL, distance="cosine")
    for m in ALL:
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
    # SPEC: faiss k-means (one cluster per distinct query label, 20 iterations, seed 1234) on the
    # query embeddings, then scikit-learn's NMI / AMI with arithmetic normalisation.
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
        res = ee.evaluate(X1, Y1, k=2)
    assert "recall_at_2" in res.metrics and "recall_at_10" not in res.metrics
    # recall_at_1 always equals precision_at_1, so the default set does not repeat it
    assert list(ee.evaluate(X1, Y1).metrics) == [
        "precision_at_1",
        "r_precision",
        "map_at_r",
        "recall_at_10",
    ]
