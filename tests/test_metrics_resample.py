"""The resampling engine against plain per-replicate loops (the draws of numpy's generator)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from embedeval.metrics import resample as rs


def _plain_draws(seed: int, n: int, n_boot: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.array([rng.integers(0, n, size=n) for _ in range(n_boot)])


@pytest.mark.parametrize("per_block", [1, 2, 3, 7, 1000])
def test_draws_do_not_depend_on_the_block_size(per_block):
    n, n_boot = 9, 17  # odd sizes: no block boundary lines up
    blocks = list(rs.draw_indices(np.random.default_rng(4), n, n_boot, per_block))
    assert np.array_equal(np.concatenate(blocks), _plain_draws(4, n, n_boot))
    assert all(b.shape[0] <= per_block for b in blocks)


def test_mean_difference_interval_is_the_percentile_interval_of_plain_means():
    diff = np.random.default_rng(0).normal(0.1, 1.0, 301)
    lo, hi = rs.mean_difference_interval(diff, ci=0.9, n_boot=500, rng=np.random.default_rng(3))
    means = np.array([diff[idx].mean() for idx in _plain_draws(3, diff.size, 500)])
    assert (lo, hi) == pytest.approx(tuple(np.quantile(means, [0.05, 0.95])), abs=1e-15)


def test_resampled_means_are_the_means_of_the_drawn_rows():
    values = np.random.default_rng(1).random((40, 3))
    reps = rs.resampled_means(values, None, 60, np.random.default_rng(5))
    plain = np.array([values[idx].mean(axis=0) for idx in _plain_draws(5, 40, 60)])
    assert reps == pytest.approx(plain, abs=1e-12)


def test_macro_resampled_means_draw_group_means():
    values = np.array([[1.0], [3.0], [10.0]])
    groups = np.array([0, 0, 1])  # group means 2 and 10
    reps = rs.resampled_means(values, groups, 50, np.random.default_rng(2))
    plain = np.array([np.array([2.0, 10.0])[idx].mean() for idx in _plain_draws(2, 2, 50)])
    assert reps[:, 0] == pytest.approx(plain, abs=1e-12)


def test_statistic_ci_recomputes_the_statistic_on_each_resample():
    x = np.random.default_rng(7).random(25)
    out = rs.statistic_ci(lambda v: {"max": v.max()}, [x], ci=0.8, n_boot=200, seed=11)
    maxima = np.array([x[idx].max() for idx in _plain_draws(11, x.size, 200)])
    assert out["max"] == pytest.approx(tuple(np.quantile(maxima, [0.1, 0.9])), abs=1e-15)


def test_percentile_interval_leaves_out_undefined_replicates():
    # finite replicates 0, 1, 2, 3: linear quantiles at 0.25 / 0.75 are 0.75 and 2.25
    reps = np.array([0.0, np.nan, 1.0, 2.0, 3.0])
    assert rs.percentile_interval(reps, 0.5) == (0.75, 2.25)


def _sign_flip_p(diff: np.ndarray) -> float:
    """Exact sign-flip p by enumeration, each pattern's mean summed in its own Python loop."""
    n = diff.size
    observed = abs(sum(diff.tolist())) / n
    hits = 0
    for signs in itertools.product([-1.0, 1.0], repeat=n):
        stat = abs(sum(s * d for s, d in zip(signs, diff.tolist(), strict=True))) / n
        hits += stat >= observed * (1 - 1e-12)
    return hits / 2**n


@pytest.mark.parametrize(
    "diff",
    [
        np.array([28.0, 27.0, 11.0, 26.0]) * 1000 / 3,  # class means of ranks, say
        np.array([37.0, 64.0, 11.0, 51.0, 63.0, 76.0, 92.0, 41.0, 44.0]) * 1e5 / 3,
        np.array([0.3, -0.1, 0.05, 0.2]),
    ],
)
def test_exact_sign_flip_p_counts_the_observed_pattern_at_any_scale(diff):
    # the observed pattern and its negation always reach the observed |mean|, so p >= 2 / 2^n
    # (with positive differences, exactly that) however large the values
    assert rs.permutation_p(diff, None, 100, 0) == pytest.approx(_sign_flip_p(diff), abs=1e-15)
    assert rs.permutation_p(diff, None, 100, 0) >= 2 / 2**diff.size
