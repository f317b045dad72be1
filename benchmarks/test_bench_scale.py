"""The benchmark's synthetic data (``benchmarks.bench_scale.make_clusters``): the original
isotropic setting is unchanged, and ``intrinsic_dim=r`` really lies in an r-dimensional subspace."""

from __future__ import annotations

import os

import numpy as np
import pytest

from benchmarks.bench_scale import D, cluster_cache_path, make_clusters


def _cleanup(n, n_classes, seed, spread, tag=""):
    path = cluster_cache_path(n, n_classes, seed, spread, tag)
    if os.path.exists(path):
        os.remove(path)


@pytest.fixture
def fresh():
    made = []
    yield made
    for args in made:
        _cleanup(*args)


def test_default_setting_is_the_original_recipe(fresh):
    n, n_classes, seed, spread = 1500, 30, 3, 0.11
    _cleanup(n, n_classes, seed, spread)
    fresh.append((n, n_classes, seed, spread))
    x, y = make_clusters(n, n_classes=n_classes, seed=seed, spread=spread)
    # Oracle: the generator as it was before intrinsic_dim existed, written out plainly.
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((n_classes, D)).astype(np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    labels = rng.integers(0, n_classes, n)
    noise = np.random.default_rng([seed, 0]).standard_normal((n, D), dtype=np.float32)
    v = centers[labels] + spread * noise
    expected = v / np.linalg.norm(v, axis=1, keepdims=True)
    np.testing.assert_array_equal(y, labels)
    np.testing.assert_array_equal(np.asarray(x), expected)


def test_intrinsic_dim_spans_exactly_r_dimensions(fresh):
    n, n_classes, seed, spread, r = 3000, 40, 1, 0.2, 12
    _cleanup(n, n_classes, seed, spread, f"_r{r}")
    fresh.append((n, n_classes, seed, spread, f"_r{r}"))
    x, y = make_clusters(n, n_classes=n_classes, seed=seed, spread=spread, intrinsic_dim=r)
    x = np.asarray(x, dtype=np.float64)
    assert x.shape == (n, D)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, rtol=1e-5)
    s = np.linalg.svd(x, compute_uv=False)
    assert s[r - 1] > 1e-2 * s[0]  # r directions carry the data ...
    assert s[r] < 1e-5 * s[0]  # ... and nothing lies outside them
    # Still clustered by label: each class's mean direction is its members' nearest class mean.
    means = np.stack([x[y == c].mean(axis=0) for c in range(n_classes)])
    nearest = np.argmax(x @ means.T, axis=1)
    assert (nearest == y).mean() > 0.9


def test_deep_case_runs_every_backend_to_the_same_numbers():
    # The deep case end to end on 20 queries: each backend's per-query values equal the local
    # engine's (the shards' own merge under the small budget, the Dask workers' deep engine).
    pytest.importorskip("distributed")
    from argparse import Namespace

    from benchmarks.bench_scale import case_deep

    out = case_deep(Namespace(queries=20, repeat=1))
    assert out["n_query"] == 20
    for name in ("shards_whole", "local_16mib", "shards_16mib", "dask_2w"):
        assert out[f"{name}_identical"] is True, name
