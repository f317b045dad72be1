"""The local backend's choice of filter product, and its rankings against fixed-order float64
keys on data with duplicates, exact ties and rows far from the origin."""

from __future__ import annotations

import numpy as np
import pytest

import embedeval as ee
import embedeval.search.local as local_search
from embedeval.evaluation.settings import EvaluationInputs, validate_arguments
from embedeval.evaluation.stages import plan_search, prepare_data
from embedeval.search.local import candidate_precision

from . import oracle


def _task(x, y, **kwargs):
    inputs = EvaluationInputs(x, y, None, None, None)
    settings = validate_arguments(inputs, **kwargs)
    return plan_search(settings, prepare_data(settings, inputs)).task


def test_deep_rankings_take_the_float64_filter_and_shallow_ones_float32():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((600, 8)).astype(np.float32)
    few = rng.integers(0, 3, 600)  # R_q about 200: MAP@R windows a third of the set deep
    many = rng.integers(0, 150, 600)  # R_q about 4
    for y, metrics, want in (
        (few, ["precision_at_1", "map_at_r"], "float64"),
        (few, ["map"], "float64"),
        (many, ["precision_at_1", "map_at_r"], "float32"),
    ):
        task = _task(x, y, metrics=metrics, progress=False)
        depth, threshold = task.depth()
        assert candidate_precision(task, depth, threshold) == want, (metrics, want)


def _fixed_order_values(xq, yq, xr, yr, distance, metrics, loo):
    """Per query: stable sort of fixed-order float64 keys (then reference index), the
    metrics' definitions from the test oracle."""
    out = {m: np.full(len(xq), np.nan) for m in metrics}
    for i in range(len(xq)):
        keys = oracle.fixed_order_keys(xq[i], xr, distance)
        idx = np.arange(len(xr))
        if loo:
            idx = idx[idx != i]
        idx = idx[np.lexsort((idx, keys[idx]))]
        rel = yr[idx] == yq[i]
        if rel.any():
            for m in metrics:
                out[m][i] = oracle.metric_value(m, rel, None)
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("exact_keys", [True, False])
def test_local_rankings_equal_fixed_order_float64_keys(monkeypatch, seed, exact_keys):
    """Random small sets, each with 10 % of its rows copies of others (half under another
    label); integer data (exact ties), Gaussian classes, or rows around 500 in every
    coordinate; a few classes, so the rankings are deep and take the float64 filter (integer
    data: unless their float32 keys are taken as exact)."""
    if not exact_keys:
        monkeypatch.setattr(local_search, "with_exact_keys", lambda task: task)
    rng = np.random.default_rng(seed)
    n, d, classes = 420, int(rng.choice([3, 8, 32])), int(rng.choice([2, 3, 5]))
    y = rng.integers(0, classes, n)
    kind = ("int", "float", "offset")[seed % 3]
    if kind == "int":
        x = rng.integers(-2, 3, (n, d)).astype(np.float32)
        x[np.abs(x).sum(axis=1) == 0, 0] = 1  # cosine needs non-zero rows
    else:
        x = rng.standard_normal((classes, d))[y] * 0.3 + rng.standard_normal((n, d))
        x = x.astype(np.float32) + np.float32(500 if kind == "offset" else 0)
    dup, src = rng.choice(n, n // 10, replace=False), rng.choice(n, n // 10, replace=False)
    x[dup] = x[src]
    y[dup] = np.where(rng.random(dup.size) < 0.5, y[src], rng.integers(0, classes, dup.size))
    distance = "euclidean" if kind == "offset" else ("cosine", "inner_product")[seed % 2]
    metrics = (["map", "precision_at_1"], ["precision_at_1", "r_precision", "map_at_r"])[seed % 2]
    split = seed >= 3
    args = (x[:150], y[:150], x[150:], y[150:]) if split else (x, y)
    res = ee.evaluate(*args, metrics=metrics, distance=distance, progress=False, block_size=64)
    want = _fixed_order_values(*(args if split else (x, y, x, y)), distance, metrics, not split)
    for m in metrics:
        np.testing.assert_allclose(res.per_query[m], want[m], rtol=1e-12, err_msg=m)
