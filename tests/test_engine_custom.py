"""Custom retrieval metrics (embedeval.RetrievalMetric): computed in the engine's blocks, they
equal the built-in metric they re-implement, and hand-computed values otherwise."""

from __future__ import annotations

import numpy as np
import pytest

import embedeval as ee


def ap(relevant, n_relevant):
    """Average precision over the window given, divided by R_q (MAP@R / MAP)."""
    hits = np.cumsum(relevant, axis=1)
    ranks = np.arange(1, relevant.shape[1] + 1)
    return (relevant * hits / ranks).sum(axis=1) / n_relevant


def precision_at_5(relevant, n_relevant):
    return relevant.sum(axis=1) / 5.0


CUSTOM = {
    "my_map_at_r": ee.RetrievalMetric(ap, depth="R"),
    "my_map": ee.RetrievalMetric(ap, depth="all"),
    "my_precision_at_5": ee.RetrievalMetric(precision_at_5, depth=5),
}
BUILTIN = {"my_map_at_r": "map_at_r", "my_map": "map", "my_precision_at_5": "precision_at_5"}


def _half_nan(relevant, n_relevant):
    """Hits over R_q, NaN for every other query (NaN would read as a lone query)."""
    value = relevant.sum(axis=1) / n_relevant
    value[::2] = np.nan
    return value


def _data(n, dim=4, n_classes=6, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, size=(n, dim)).astype(np.float32)  # ties and duplicates
    y = rng.integers(0, n_classes, n)
    return x, y


@pytest.mark.parametrize(
    "case",
    [
        {"n": 300},
        {"n": 300, "k": 7},
        {"n": 300, "average": "macro"},
        {"n": 300, "split": True},
        {"n": 300, "groups": True},
        {"n": 300, "distance": "cosine"},
        {"n": 2600, "n_classes": 3},  # > 2048 references: the column-sample thresholds
        {"n": 300, "shards": 2},
    ],
    ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()),
)
def test_custom_reimplementations_equal_the_builtins(case):
    case = dict(case)
    x, y = _data(case.pop("n"), n_classes=case.pop("n_classes", 6))
    kwargs = {"k": case.pop("k", None), "average": case.pop("average", "micro")}
    kwargs["distance"] = case.pop("distance", "euclidean")
    if case.pop("shards", None):
        kwargs["shards"] = 2
    args = (x, y)
    if case.pop("split", False):
        args = (x[:100], y[:100], x[100:], y[100:])
    if case.pop("groups", False):
        kwargs["query_groups"] = np.arange(len(x)) % 5
    res = ee.evaluate(*args, metrics=list(BUILTIN.values()), custom_metrics=CUSTOM, **kwargs)
    for mine, builtin in BUILTIN.items():
        np.testing.assert_allclose(
            res.per_query[mine], res.per_query[builtin], rtol=0, atol=1e-12, equal_nan=True
        )
        assert res[mine] == pytest.approx(res[builtin], abs=1e-12)
        assert res.per_class[mine].keys() == res.per_class[builtin].keys()
        assert res.n_ties[mine] >= 0


def test_position_weighted_precision_by_hand():
    # 1-D points; query 0 (label a) ranks: 1 (a, 0.1 away), 2 (b, 0.5), 3 (a, 0.9)
    x = [[0.0], [0.1], [0.5], [0.9]]
    y = ["a", "a", "b", "a"]

    def weighted(relevant, n_relevant):  # sum over ranks of rel_i / i, over the first 3
        return (relevant / np.arange(1, relevant.shape[1] + 1)).sum(axis=1)

    res = ee.evaluate(x, y, metrics=[], custom_metrics={"w": ee.RetrievalMetric(weighted, depth=3)})
    # query 0: a(1) b(2) a(3) -> 1/1 + 1/3; query 1 (0.1): 0 (0.1) a, 2 (0.4) b, 3 (0.8) a ->
    # 1 + 1/3; query 2 (label b) is lone -> NaN; query 3 (0.9): 2 (0.4) b, 1 (0.8) a, 0 (0.9) a
    # -> 1/2 + 1/3
    np.testing.assert_allclose(
        res.per_query["w"], [1 + 1 / 3, 1 + 1 / 3, np.nan, 1 / 2 + 1 / 3], equal_nan=True
    )
    assert list(res.metrics) == ["w"]


def test_custom_metrics_reach_ci_compare_json_and_the_evaluator():
    x, y = _data(200, seed=3)
    res = ee.evaluate(x, y, metrics=["map_at_r"], custom_metrics=CUSTOM, ci=0.9, n_boot=200, seed=1)
    assert "my_map_at_r" in res.ci
    assert res.ci["my_map_at_r"] == pytest.approx(res.ci["map_at_r"], abs=1e-12)
    again = ee.EvaluationResult.from_json(res.to_json())
    np.testing.assert_array_equal(again.per_query["my_map"], res.per_query["my_map"])
    other = ee.evaluate(x + 0.5, y, metrics=["map_at_r"], custom_metrics=CUSTOM)
    cmp = ee.compare([res, other], n_boot=200, seed=0)
    assert "my_map_at_r" in str(cmp)
    ev = ee.Evaluator(metrics=["map_at_r"], custom_metrics=CUSTOM, primary_metric="my_map")
    ev.update(x, y)
    np.testing.assert_array_equal(ev.compute().per_query["my_map"], res.per_query["my_map"])


def test_custom_metrics_with_reject_from_both():
    x, y = _data(150, seed=4)
    conf = np.random.default_rng(0).random(150)
    res = ee.evaluate(
        x,
        y,
        metrics=["map_at_r"],
        custom_metrics={"my_map_at_r": CUSTOM["my_map_at_r"]},
        confidences=conf,
        reject_from="both",
        rejection_fractions=[0.0, 0.3],
    )
    for f in ("0.00", "0.30"):
        assert res.confidence[f"both_my_map_at_r@{f}"] == pytest.approx(
            res.confidence[f"both_map_at_r@{f}"], abs=1e-12
        )


@pytest.mark.parametrize(
    ("custom", "match"),
    [
        ({"map_at_r": ee.RetrievalMetric(ap)}, "built-in"),
        ({"my map": ee.RetrievalMetric(ap)}, "valid metric name"),
        ({"m": ap}, "RetrievalMetric"),
        ([ee.RetrievalMetric(ap)], "dict"),
        ({"m": ee.RetrievalMetric(lambda r, n: r.sum())}, "one value per query"),
        ({"m": ee.RetrievalMetric(_half_nan)}, "'m' returned NaN for .* queries of a block"),
        (
            {"m": ee.RetrievalMetric(lambda r, n: np.where(r[:, 0], 0.0, -np.inf))},
            "'m' returned -inf for .* return a finite number",
        ),
        ({"m": ee.RetrievalMetric(lambda r, n: r.sum(1) / n + 1j)}, "dtype complex128"),
        ({"m": ee.RetrievalMetric(lambda r, n: ["x"] * len(n))}, "'m' returned values of dtype"),
    ],
)
def test_bad_custom_metrics(custom, match):
    x, y = _data(40)
    with pytest.raises((ee.InputError, ee.InputTypeError), match=match):
        ee.evaluate(x, y, custom_metrics=custom)


@pytest.mark.parametrize("depth", ["r", 0, -2, 2.5, True, 2**63 - 1, 2**64])
def test_bad_depth(depth):
    with pytest.raises(ee.InputError, match="depth"):
        ee.RetrievalMetric(ap, depth=depth)


def test_cutoff_far_beyond_the_references_reads_the_whole_ranking():
    # k + 1 (the item after the cut-off) must not wrap around int64: with k = 2**62 every
    # relevant reference lies within the cut-off, so the hit rate is 1 for every query that
    # has one and a custom count of hits over R_q is 1 as well.
    x, y = _data(40)
    hits = ee.RetrievalMetric(lambda rel, n: rel.sum(axis=1) / n, depth=2**62)
    res = ee.evaluate(x, y, metrics=[f"recall_at_{2**62}"], custom_metrics={"hits": hits})
    has_peer = np.array([(y == y[i]).sum() > 1 for i in range(len(y))])
    np.testing.assert_array_equal(res.per_query[f"recall_at_{2**62}"][has_peer], 1.0)
    np.testing.assert_array_equal(res.per_query["hits"][has_peer], 1.0)


def test_custom_depth_deeper_than_k_is_refused():
    x, y = _data(40)
    with pytest.raises(ee.InputError, match="deeper"):
        ee.evaluate(x, y, k=3, custom_metrics={"p5": CUSTOM["my_precision_at_5"]})
