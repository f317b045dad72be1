"""Bootstrap CIs and paired comparison against scipy and exact enumeration."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import embedeval as ee
from embedeval._resample import permutation_p


def test_micro_ci_matches_scipy_percentile_bootstrap():
    from scipy import stats

    rng = np.random.default_rng(0)
    values = rng.random(400)
    lo, hi = ee.bootstrap_ci({"m": values}, ci=0.9, n_boot=4000, seed=1)["m"]
    ref = stats.bootstrap(
        (values,),
        np.mean,
        confidence_level=0.9,
        n_resamples=4000,
        method="percentile",
        random_state=2,
    ).confidence_interval
    assert lo == pytest.approx(ref.low, abs=0.004)
    assert hi == pytest.approx(ref.high, abs=0.004)
    # and with the normal-theory interval of a mean
    se = values.std(ddof=1) / np.sqrt(values.size)
    assert (hi - lo) == pytest.approx(2 * 1.6449 * se, rel=0.08)


def test_nan_queries_are_dropped_and_constant_values_give_a_point():
    lo, hi = ee.bootstrap_ci({"m": [1.0, np.nan, 1.0]}, n_boot=100)["m"]
    assert (lo, hi) == (1.0, 1.0)
    assert np.isnan(ee.bootstrap_ci({"m": [np.nan, np.nan]})["m"][0])


def test_macro_resamples_classes():
    # one huge class of perfect queries and five tiny classes of failures:
    # micro mean ~0.95 with a narrow CI; macro mean 1/6 with a CI driven by 6 classes
    values = np.array([1.0] * 100 + [0.0] * 5)
    labels = np.array([0] * 100 + [1, 2, 3, 4, 5])
    micro = ee.bootstrap_ci({"m": values}, labels=labels, n_boot=2000)["m"]
    macro = ee.bootstrap_ci({"m": values}, labels=labels, average="macro", n_boot=2000)["m"]
    assert micro[0] > 0.88
    assert macro[0] == 0.0 and macro[1] >= 0.5  # 0..6 perfect classes out of 6, resampled
    # the macro replicates take only the values k/6
    assert macro[1] * 6 == pytest.approx(round(macro[1] * 6))


def test_seed_determinism_and_bad_input():
    v = {"m": np.random.default_rng(0).random(50)}
    assert ee.bootstrap_ci(v, seed=3) == ee.bootstrap_ci(v, seed=3)
    assert ee.bootstrap_ci(v, seed=3) != ee.bootstrap_ci(v, seed=4)
    with pytest.raises(ee.InputError, match="strictly between 0 and 1"):
        ee.bootstrap_ci(v, ci=1.5)
    with pytest.raises(ee.InputError, match="n_boot must be >= 1"):
        ee.bootstrap_ci(v, n_boot=0)
    with pytest.raises(ee.InputError, match="labels are required"):
        ee.bootstrap_ci(v, average="macro")
    with pytest.raises(ee.InputTypeError, match="dict of metric"):
        ee.bootstrap_ci([1, 2, 3])


def test_permutation_p_matches_exact_enumeration_and_scipy():
    from scipy import stats

    rng = np.random.default_rng(5)
    diff = rng.normal(0.3, 1.0, 10)
    # exact: every sign pattern
    obs = abs(diff.mean())
    stats_all = [abs((np.array(s) * diff).mean()) for s in itertools.product([-1, 1], repeat=10)]
    assert permutation_p(diff, None, 1000, 0) == pytest.approx(
        np.mean(np.array(stats_all) >= obs - 1e-12)
    )
    # Monte Carlo branch against scipy's paired permutation test
    diff = rng.normal(0.2, 1.0, 40)
    res = stats.permutation_test(
        (diff,), np.mean, permutation_type="samples", n_resamples=20000, random_state=0
    )
    assert permutation_p(diff, None, 20000, 0) == pytest.approx(res.pvalue, abs=0.02)


def _results(noise_a, noise_b, seed=0):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(8), 15)
    centers = rng.standard_normal((8, 6)) * 2
    xa = centers[y] + noise_a * rng.standard_normal((120, 6))
    xb = centers[y] + noise_b * rng.standard_normal((120, 6))
    return ee.evaluate(xa, y, metrics=["precision_at_1", "map_at_r"]), ee.evaluate(
        xb, y, metrics=["precision_at_1", "map_at_r"]
    )


@pytest.mark.parametrize("test", ["bootstrap", "permutation"])
def test_compare_detects_a_real_difference_and_not_a_fake_one(test):
    good, bad = _results(0.5, 3.0)
    cmp = ee.compare({"good": good, "bad": bad}, n_boot=500, test=test)
    row = next(r for r in cmp.rows if r["checkpoint"] == "bad" and r["metric"] == "map_at_r")
    assert row["diff"] == pytest.approx(bad["map_at_r"] - good["map_at_r"])
    assert row["diff_ci_high"] < 0 and row["p_value"] < 0.01
    same = ee.compare([good, good], n_boot=200, test=test)
    assert all(
        r["p_value"] == 1.0 and r["diff_ci_low"] == r["diff_ci_high"] == 0 for r in same.rows
    )
    assert "diff vs run0" in repr(same) and same.to_markdown().startswith("| checkpoint")
    assert same.to_csv().splitlines()[0].startswith("checkpoint,metric,value")
    assert '"format": "embedeval.Comparison/1"' in same.to_json()


def test_compare_bad_input():
    good, bad = _results(0.5, 3.0)
    other = ee.evaluate(np.zeros((4, 2)) + np.arange(4)[:, None], [0, 0, 1, 1])
    with pytest.raises(ee.InputError, match="different queries"):
        ee.compare([good, other])
    with pytest.raises(ee.InputError, match="Did you mean 'good'"):
        ee.compare({"good": good, "bad": bad}, baseline="goood")
    with pytest.raises(ee.InputTypeError, match="not an EvaluationResult"):
        ee.compare([good, {"map_at_r": 1}])
    with pytest.raises(ee.InputError, match="not in every result"):
        ee.compare([good, bad], metrics=["mrr"])
    with pytest.raises(ee.InputError, match="test="):
        ee.compare([good, bad], test="t-test")
