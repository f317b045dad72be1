"""sigma_regression against scikit-learn and a hand-computed case."""

from __future__ import annotations

import math

import numpy as np
import pytest

from embedeval import confidence as cf
from embedeval._errors import InputError


def test_hand_values():
    # d = 0.1 - 0.2, 0.3 - 0.1, 0.5 - 0.5, 0.2 - 0.4 = -0.1, 0.2, 0, -0.2
    r = cf.sigma_regression([0.1, 0.3, 0.5, 0.2], [0.2, 0.1, 0.5, 0.4])
    assert r.mse == pytest.approx((0.01 + 0.04 + 0 + 0.04) / 4)
    assert r.mae == pytest.approx((0.1 + 0.2 + 0 + 0.2) / 4)
    assert r.rmse == pytest.approx(math.sqrt(0.09 / 4))
    # ȳ = 1.2 / 4 = 0.3; Σ (y - ȳ)² = 0.01 + 0.04 + 0.04 + 0.01 = 0.10
    assert r.r2 == pytest.approx(1 - 0.09 / 0.10)


def test_matches_sklearn_and_ci_brackets_the_value():
    from sklearn import metrics as skm

    rng = np.random.default_rng(0)
    t = rng.uniform(0, 1, 300)
    p = np.clip(t + rng.normal(0, 0.1, 300), 0, 1)
    r = cf.sigma_regression(p, t, ci=0.9, n_boot=300, seed=1)
    assert r.mse == pytest.approx(skm.mean_squared_error(t, p))
    assert r.mae == pytest.approx(skm.mean_absolute_error(t, p))
    assert r.rmse == pytest.approx(math.sqrt(skm.mean_squared_error(t, p)))
    assert r.r2 == pytest.approx(skm.r2_score(t, p))
    for key in ("mse", "mae", "rmse", "r2"):
        lo, hi = r.ci[key]
        assert lo < getattr(r, key) < hi
    # the same seed gives the same intervals; another seed different ones
    assert cf.sigma_regression(p, t, ci=0.9, n_boot=300, seed=1).ci == r.ci
    assert cf.sigma_regression(p, t, ci=0.9, n_boot=300, seed=2).ci != r.ci


def test_bootstrap_interval_by_loop():
    # The percentile interval of MAE over resampled pairs, written out with the same draws.
    p = np.array([0.1, 0.4, 0.35, 0.8, 0.5])
    t = np.array([0.2, 0.3, 0.3, 0.9, 0.1])
    r = cf.sigma_regression(p, t, ci=0.8, n_boot=50, seed=3)
    rng = np.random.default_rng(3)
    maes = []
    for _ in range(50):
        idx = rng.integers(0, 5, size=5)
        maes.append(sum(abs(p[i] - t[i]) for i in idx) / 5)
    assert r.ci["mae"] == pytest.approx(tuple(np.quantile(maes, [0.1, 0.9])))


def test_constant_truth_and_bad_input():
    assert math.isnan(cf.sigma_regression([0.1, 0.2], [0.3, 0.3]).r2)
    with pytest.raises(InputError, match="truth"):
        cf.sigma_regression([0.1, 0.2], [0.3])
    with pytest.raises(InputError, match="ci"):
        cf.sigma_regression([0.1, 0.2], [0.3, 0.1], ci=95)
