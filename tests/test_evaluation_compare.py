"""Bootstrap CIs and paired comparison against scipy and exact enumeration."""

from __future__ import annotations

import csv
import importlib
import io
import itertools
import json
import math
import re
import warnings

import numpy as np
import pytest

import embedeval as ee
from embedeval.evaluation.result import EvaluationResult
from embedeval.metrics.resample import permutation_p


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


def _percentile_ci_loop(values, seed, n_boot, ci=0.95):
    """Percentile interval of resampled means, one documented draw of n indices per replicate."""
    draws = np.random.default_rng(seed)
    n = len(values)
    means = [np.mean(values[draws.integers(0, n, size=n)]) for _ in range(n_boot)]
    return tuple(np.quantile(means, [(1 - ci) / 2, (1 + ci) / 2]))


def test_seed_determinism_and_bad_input():
    v = {"m": np.random.default_rng(0).random(50)}
    assert ee.bootstrap_ci(v, seed=3)["m"] == pytest.approx(_percentile_ci_loop(v["m"], 3, 1000))
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


@pytest.mark.parametrize(("ci", "heading"), [(0.975, "97.5% CI"), (0.995, "99.5% CI")])
def test_interval_heading_names_the_level_asked_for(ci, heading):
    # Rounded to a whole percent, a 97.5% interval was headed "98% CI" and 99.5% "100% CI".
    good, bad = _results(0.5, 3.0)
    cmp = ee.compare({"good": good, "bad": bad}, n_boot=20, ci=ci)
    first = cmp.to_markdown().splitlines()[0]
    assert f"| {heading} |" in first and heading in repr(cmp).splitlines()[0]


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


# More tests of bootstrap CIs and checkpoint comparison (review of embedeval/compare.py).


# ``embedeval.evaluation.compare`` is the function once the package is imported; fetch the module
# itself
resample = importlib.import_module("embedeval.metrics.resample")


def _result(per_query, labels, *, average="micro"):
    """An EvaluationResult with the given per-query values (NaN = lone); summary by hand."""
    per_query = {m: np.asarray(v, dtype=np.float64) for m, v in per_query.items()}
    labels = np.asarray(labels)
    metrics = {}
    for m, v in per_query.items():
        ok = ~np.isnan(v)
        if average == "micro":
            metrics[m] = float(v[ok].mean()) if ok.any() else math.nan
        else:
            metrics[m] = float(np.mean([v[ok & (labels == c)].mean() for c in set(labels[ok])]))
    return EvaluationResult(
        metrics=metrics,
        per_query=per_query,
        per_class={},
        query_labels=labels,
        n_queries=labels.size,
        n_lone=int(np.isnan(next(iter(per_query.values()))).sum()),
        n_ties={m: 0 for m in per_query},
        settings={"average": average},
    )


def _class_means_loop(values, labels):
    """Naive oracle: mean per class of the non-NaN values, classes in first-seen order."""
    sums, counts = {}, {}
    for v, lab in zip(values, labels, strict=True):
        if v != v:  # NaN: lone query
            continue
        sums[lab] = sums.get(lab, 0.0) + v
        counts[lab] = counts.get(lab, 0) + 1
    return np.array([sums[c] / counts[c] for c in sums])


def _exact_sign_flip_p(diff):
    """Naive oracle: share of all 2^n sign patterns with |mean| >= the observed |mean|."""
    diff = list(diff)
    obs = abs(sum(diff) / len(diff))
    hits = total = 0
    for signs in itertools.product([-1, 1], repeat=len(diff)):
        total += 1
        hits += abs(sum(s * d for s, d in zip(signs, diff, strict=True)) / len(diff)) >= obs - 1e-12
    return hits / total


def _row(cmp, checkpoint, metric):
    return next(r for r in cmp.rows if r["checkpoint"] == checkpoint and r["metric"] == metric)


# ---------------------------------------------------------------- the oracles themselves


def test_oracles_on_hand_cases():
    assert list(_class_means_loop([1.0, 0.0, np.nan, 0.5], ["a", "a", "b", "c"])) == [0.5, 0.5]
    # diff (1, 1, 1): only the two constant sign patterns reach |mean| = 1 -> 2/8
    assert _exact_sign_flip_p([1.0, 1.0, 1.0]) == 0.25
    # diff (1, -1): every pattern has |mean| 0 or 1 >= 0 -> 1
    assert _exact_sign_flip_p([1.0, -1.0]) == 1.0


# ---------------------------------------------------------------- bootstrap_ci, micro


def test_two_point_sample_hand_quantiles():
    # Resampling (0, 1) twice gives means 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4.
    # ci=0.4 asks for the 30th and 70th percentiles: both fall in the 1/2 atom.
    lo, hi = ee.bootstrap_ci({"m": [0.0, 1.0]}, ci=0.4, n_boot=4000)["m"]
    assert (lo, hi) == (0.5, 0.5)
    # ci=0.95: the 2.5th percentile is in the 0 atom, the 97.5th in the 1 atom
    assert ee.bootstrap_ci({"m": [0.0, 1.0]}, ci=0.95, n_boot=4000)["m"] == (0.0, 1.0)


def test_resampling_counts_follow_the_multinomial_law():
    # values = identity: replicate j is count_j / n, so the counts are visible.  Each row must
    # sum to n (sampling n with replacement); each count is Binomial(n, 1/n): mean 1,
    # variance 1 - 1/n.
    n, n_boot = 8, 20000
    reps = resample.resampled_means(np.eye(n), None, n_boot, np.random.default_rng(0)) * n
    assert np.allclose(reps, np.round(reps))
    assert np.allclose(reps.sum(axis=1), n)
    assert reps.mean() == pytest.approx(1.0, abs=0.02)
    assert reps.var() == pytest.approx(1 - 1 / n, abs=0.03)
    # P(count_j = 0) = (1 - 1/n)^n
    assert np.mean(reps == 0) == pytest.approx((1 - 1 / n) ** n, abs=0.01)


def test_large_normal_sample_matches_the_t_interval():
    from scipy import stats

    x = np.random.default_rng(11).normal(3.0, 2.0, 3000)
    lo, hi = ee.bootstrap_ci({"m": x}, ci=0.95, n_boot=4000, seed=5)["m"]
    t_lo, t_hi = stats.t.interval(0.95, x.size - 1, loc=x.mean(), scale=stats.sem(x))
    width = t_hi - t_lo
    assert lo == pytest.approx(t_lo, abs=0.05 * width)
    assert hi == pytest.approx(t_hi, abs=0.05 * width)


def test_coverage_of_the_true_mean_over_repeated_samples():
    # 300 exponential samples of 80 (skewed): a 90% percentile interval covers the true mean
    # (1.0) in roughly 90% of them (the percentile method undercovers a little when skewed).
    rng = np.random.default_rng(3)
    covered = 0
    for i in range(300):
        lo, hi = ee.bootstrap_ci({"m": rng.exponential(1.0, 80)}, ci=0.9, n_boot=400, seed=i)["m"]
        covered += lo <= 1.0 <= hi
    assert 0.82 <= covered / 300 <= 0.95


def test_chunking_does_not_change_the_intervals(monkeypatch):
    v = {"a": np.random.default_rng(0).random(500), "b": np.random.default_rng(1).random(500)}
    whole = ee.bootstrap_ci(v, n_boot=300)
    monkeypatch.setattr(resample, "CHUNK", 1200)  # two resamples per chunk
    assert ee.bootstrap_ci(v, n_boot=300) == whole


def test_metrics_share_resamples_and_subsets_agree():
    rng = np.random.default_rng(2)
    v = rng.random(200)
    pq = {"a": v, "b": 1 - v, "c": np.where(np.arange(200) < 20, np.nan, v)}
    both = ee.bootstrap_ci(pq, n_boot=500)
    # the same resampled queries: the mean of 1 - v is 1 - the mean of v in every replicate
    assert both["b"][0] == pytest.approx(1 - both["a"][1], abs=1e-12)
    assert both["b"][1] == pytest.approx(1 - both["a"][0], abs=1e-12)
    for m in pq:  # the same draws alone or together (up to BLAS summation order)
        assert ee.bootstrap_ci(pq, metrics=[m], n_boot=500)[m] == pytest.approx(both[m], abs=1e-12)
    # a single string is one metric, not a list of letters
    assert list(ee.bootstrap_ci(pq, metrics="a", n_boot=500)) == ["a"]


def test_lone_queries_are_dropped_not_counted_as_zero():
    # (1, 1, NaN, NaN): only the two 1s are resampled -> a point interval at 1
    assert ee.bootstrap_ci({"m": [1.0, 1.0, np.nan, np.nan]}, n_boot=50)["m"] == (1.0, 1.0)


def test_seed_determinism():
    v = {"m": np.random.default_rng(0).random(100)}
    expected = _percentile_ci_loop(v["m"], 7, 200)
    assert ee.bootstrap_ci(v, seed=7, n_boot=200)["m"] == pytest.approx(expected)
    assert ee.bootstrap_ci(v, seed=7, n_boot=200) != ee.bootstrap_ci(v, seed=8, n_boot=200)


# ---------------------------------------------------------------- bootstrap_ci, macro


def test_macro_one_huge_class_and_tiny_ones_hand_quantiles():
    # 1000 queries of class 0 scoring 1, and three one-query classes scoring 0.
    values = np.array([1.0] * 1000 + [0.0] * 3)
    labels = np.array([0] * 1000 + [1, 2, 3])
    # Macro: 4 classes resampled; a replicate is K/4 with K ~ Binomial(4, 1/4) picks of class 0.
    # P(K=0) = 0.316, P(K<=1) = 0.738, P(K<=2) = 0.949 -> 10th pct 0, 90th pct 1/2.
    macro = ee.bootstrap_ci({"m": values}, labels=labels, average="macro", ci=0.8, n_boot=4000)
    assert macro["m"] == (0.0, 0.5)
    # Micro: 1003 queries resampled; J ~ Binomial(1003, 3/1003) ~ Poisson(3) zero-scorers.
    # Poisson(3): P(J<=0) = 0.050, P(J<=1) = 0.199, P(J<=4) = 0.815, P(J<=5) = 0.916
    # -> 10th pct of J is 1, 90th pct is 5; the mean is 1 - J/1003.
    micro = ee.bootstrap_ci({"m": values}, labels=labels, average="micro", ci=0.8, n_boot=4000)
    assert micro["m"] == pytest.approx((1 - 5 / 1003, 1 - 1 / 1003), abs=1e-12)


def test_macro_matches_scipy_bootstrap_of_class_means():
    from scipy import stats

    rng = np.random.default_rng(4)
    labels = rng.choice(["cat", "dog", "eel", "fox", "gnu", "hen", "ibis", "jay"], 400)
    values = rng.random(400) + (labels == "cat") * 0.5
    values[rng.random(400) < 0.1] = np.nan
    means = _class_means_loop(values, labels)
    lo, hi = ee.bootstrap_ci(
        {"m": values}, labels=labels, average="macro", ci=0.9, n_boot=5000, seed=1
    )["m"]
    ref = stats.bootstrap(
        (means,), np.mean, confidence_level=0.9, n_resamples=5000, method="percentile", rng=2
    ).confidence_interval
    assert lo == pytest.approx(ref.low, abs=0.01)
    assert hi == pytest.approx(ref.high, abs=0.01)


def test_macro_from_an_evaluation_result_uses_its_labels_and_average():
    values = np.array([1.0] * 1000 + [0.0] * 3)
    labels = np.array([0] * 1000 + [1, 2, 3])
    res = _result({"m": values}, labels, average="macro")
    assert ee.bootstrap_ci(res, ci=0.8, n_boot=4000)["m"] == (0.0, 0.5)
    assert ee.bootstrap_ci(res, ci=0.8, n_boot=4000, average="macro")["m"] == (0.0, 0.5)


def test_an_average_other_than_the_results_own_is_refused_not_ignored():
    # it used to be dropped silently: the macro interval came back for average="micro"
    values = np.array([1.0] * 1000 + [0.0] * 3)
    labels = np.array([0] * 1000 + [1, 2, 3])
    res = _result({"m": values}, labels, average="macro")
    with pytest.raises(ee.InputError, match=r"average='micro'.*evaluated with average='macro'"):
        ee.bootstrap_ci(res, average="micro")
    # the way the message points to: the micro statistic of the per-query values, whose
    # replicates are means of 1003 draws with about 3 zeros each, so all lie in [0.99, 1]
    lo, hi = ee.bootstrap_ci(res.per_query, labels=labels, average="micro", ci=0.8)["m"]
    assert 0.99 < lo <= hi <= 1.0


def test_evaluate_with_ci_brackets_the_metric():
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(6), 12)
    x = rng.standard_normal((6, 4))[y] * 2 + rng.standard_normal((72, 4))
    for average in ("micro", "macro"):
        res = ee.evaluate(x, y, metrics=["map_at_r"], ci=0.9, n_boot=300, average=average)
        lo, hi = res.ci["map_at_r"]
        assert lo <= res["map_at_r"] <= hi and lo < hi


# ---------------------------------------------------------------- compare: paired statistics


def _pair(n=300, seed=0, shift=0.05):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n)
    a = rng.random(n)
    b = np.clip(a + shift + 0.1 * rng.standard_normal(n), 0, 1)  # correlated with a
    return a, b, labels


def test_paired_difference_ci_matches_scipy_on_per_query_differences():
    from scipy import stats

    a, b, labels = _pair()
    cmp = ee.compare(
        {"a": _result({"m": a}, labels), "b": _result({"m": b}, labels)},
        ci=0.9,
        n_boot=5000,
        seed=3,
    )
    row = _row(cmp, "b", "m")
    d = b - a
    assert row["diff"] == pytest.approx(d.mean(), abs=1e-12)
    ref = stats.bootstrap(
        (d,), np.mean, confidence_level=0.9, n_resamples=5000, method="percentile", rng=9
    ).confidence_interval
    assert row["diff_ci_low"] == pytest.approx(ref.low, abs=0.003)
    assert row["diff_ci_high"] == pytest.approx(ref.high, abs=0.003)
    # pairing matters: the paired interval is much narrower than either run's own interval
    assert row["diff_ci_high"] - row["diff_ci_low"] < 0.5 * (row["ci_high"] - row["ci_low"])
    base = _row(cmp, "a", "m")
    assert (base["diff"], base["diff_ci_low"], base["diff_ci_high"], base["p_value"]) == (
        0.0,
        0.0,
        0.0,
        1.0,
    )


@pytest.mark.parametrize("test", ["bootstrap", "permutation"])
def test_constant_difference_gives_p_near_zero(test):
    labels = np.arange(40) % 4
    a = np.linspace(0, 0.8, 40)
    cmp = ee.compare(
        [_result({"m": a}, labels), _result({"m": a + 0.1}, labels)], n_boot=999, test=test
    )
    row = _row(cmp, "run1", "m")
    assert row["diff"] == pytest.approx(0.1)
    assert row["diff_ci_low"] == pytest.approx(0.1) and row["diff_ci_high"] == pytest.approx(0.1)
    # bootstrap: no replicate is <= 0 -> 0; permutation (40 queries, random flips): only the
    # two constant sign patterns reach |0.1| (chance 2^-39), so p = (0 + 1) / (999 + 1)
    assert row["p_value"] == (0.0 if test == "bootstrap" else pytest.approx(1 / 1000))
    assert "<2e-03" in repr(cmp)  # 1/999 rounded up: "<1e-03" would claim a finer resolution


def test_permutation_small_n_is_the_exact_enumeration():
    labels = np.arange(9) % 3
    a = np.array([0.2, 0.5, 0.9, 0.1, 0.4, 0.3, 0.8, 0.6, 0.7])
    b = a + np.array([0.3, -0.1, 0.05, 0.2, 0.0, 0.15, -0.05, 0.25, 0.1])
    cmp = ee.compare(
        [_result({"m": a}, labels), _result({"m": b}, labels)], test="permutation", n_boot=10
    )
    assert _row(cmp, "run1", "m")["p_value"] == pytest.approx(_exact_sign_flip_p(b - a))
    # hand case: differences (1, 1, 1) -> 2/8
    cmp = ee.compare(
        [_result({"m": [0.0, 0.0, 0.0]}, [0, 1, 2]), _result({"m": [1.0, 1.0, 1.0]}, [0, 1, 2])],
        test="permutation",
    )
    assert _row(cmp, "run1", "m")["p_value"] == 0.25


def _p_cell(cmp):
    """The p column of the last row of the Markdown table."""
    return cmp.to_markdown().splitlines()[-1].split("|")[-2].strip()


def test_an_exact_permutation_p_below_one_over_n_boot_is_printed_as_a_number():
    # 12 queries, every difference +1: only the patterns ++..+ and --..- reach |1|, so the
    # enumerated p is exactly 2 / 4096, below 1 / n_boot = 1e-3 but not a resampling bound
    runs = [
        _result({"m": [0.0] * 12}, np.arange(12) % 3),
        _result({"m": [1.0] * 12}, np.arange(12) % 3),
    ]
    cmp = ee.compare(runs, test="permutation", n_boot=1000)
    assert _row(cmp, "run1", "m")["p_value"] == _exact_sign_flip_p([1.0] * 12) == 2 / 4096
    assert _p_cell(cmp) == "0.0005"
    assert "<" not in repr(cmp).splitlines()[-1]
    # macro: the 3 classes are the units, p = 2 / 8 exact, below 1 / n_boot = 1 / 3
    macro = [_result(r.per_query, r.query_labels, average="macro") for r in runs]
    cmp = ee.compare(macro, test="permutation", n_boot=3)
    assert _row(cmp, "run1", "m")["p_value"] == _exact_sign_flip_p([1.0] * 3) == 0.25
    assert _p_cell(cmp) == "0.2500"
    # 13 queries: random sign patterns, p = 1 / (n_boot + 1) is a resampling bound
    runs = [
        _result({"m": [0.0] * 13}, np.arange(13) % 3),
        _result({"m": [1.0] * 13}, np.arange(13) % 3),
    ]
    assert _p_cell(ee.compare(runs, test="permutation", n_boot=1000)) == "<1e-03"


def test_tiny_samples_bootstrap_p_is_anti_conservative_but_permutation_is_exact():
    # one shared query with difference 0.5: every bootstrap replicate is 0.5 -> p = 0; the two
    # sign patterns (+0.5, -0.5) both reach |0.5| -> exact permutation p = 2/2 = 1
    runs = [_result({"m": [0.2, np.nan]}, [0, 1]), _result({"m": [0.7, 0.1]}, [0, 1])]
    assert _row(ee.compare(runs, n_boot=100), "run1", "m")["p_value"] == 0.0
    perm = ee.compare(runs, n_boot=100, test="permutation")
    assert _row(perm, "run1", "m")["p_value"] == 1.0
    assert _row(perm, "run1", "m")["n_shared"] == 1


def test_permutation_large_n_matches_scipy():
    from scipy import stats

    a, b, labels = _pair(n=60, seed=8, shift=0.02)
    cmp = ee.compare(
        [_result({"m": a}, labels), _result({"m": b}, labels)],
        test="permutation",
        n_boot=20000,
    )
    ref = stats.permutation_test(
        (b - a,), np.mean, permutation_type="samples", n_resamples=20000, rng=1
    )
    assert _row(cmp, "run1", "m")["p_value"] == pytest.approx(ref.pvalue, abs=0.01)


def test_bootstrap_p_agrees_with_the_normal_approximation():
    from scipy import stats

    # a difference of about 1.3 standard errors: p near 0.2, where a missing factor 2 shows
    a, b, labels = _pair(n=400, seed=11, shift=0.005)
    cmp = ee.compare([_result({"m": a}, labels), _result({"m": b}, labels)], n_boot=8000)
    d = b - a
    z = d.mean() / (d.std(ddof=1) / np.sqrt(d.size))
    assert _row(cmp, "run1", "m")["p_value"] == pytest.approx(2 * stats.norm.sf(abs(z)), abs=0.03)


def test_macro_paired_tests_work_on_classes():
    from scipy import stats

    rng = np.random.default_rng(6)
    labels = np.repeat(["a", "b", "c", "d", "e", "f", "g"], [50, 2, 3, 8, 1, 20, 4])
    a = rng.random(labels.size)
    b = np.clip(a + 0.1 * rng.standard_normal(labels.size) + 0.03, 0, 1)
    ra, rb = _result({"m": a}, labels, average="macro"), _result({"m": b}, labels, average="macro")
    class_diff = _class_means_loop(b, labels) - _class_means_loop(a, labels)
    perm = ee.compare([ra, rb], test="permutation")
    row = _row(perm, "run1", "m")
    assert row["diff"] == pytest.approx(class_diff.mean(), abs=1e-12)
    assert row["diff"] == pytest.approx(rb["m"] - ra["m"], abs=1e-12)
    # 7 classes -> the exact enumeration of 2^7 class-level sign flips
    assert row["p_value"] == pytest.approx(_exact_sign_flip_p(class_diff))
    boot = ee.compare([ra, rb], n_boot=5000, ci=0.9)
    ref = stats.bootstrap(
        (class_diff,), np.mean, confidence_level=0.9, n_resamples=5000, method="percentile", rng=4
    ).confidence_interval
    r = _row(boot, "run1", "m")
    assert r["diff_ci_low"] == pytest.approx(ref.low, abs=0.01)
    assert r["diff_ci_high"] == pytest.approx(ref.high, abs=0.01)


def test_queries_lone_in_any_run_are_dropped_with_a_count():
    a = np.array([0.5, 0.7, np.nan, 0.1, 0.9, 0.4])
    b = np.array([0.6, np.nan, 0.3, 0.2, 1.0, 0.5])
    labels = [0, 0, 1, 1, 2, 2]
    cmp = ee.compare([_result({"m": a}, labels), _result({"m": b}, labels)], n_boot=200)
    row = _row(cmp, "run1", "m")
    assert row["n_shared"] == 4
    # the difference is over queries 0, 3, 4, 5: (0.1 + 0.1 + 0.1 + 0.1) / 4
    assert row["diff"] == pytest.approx(0.1)
    # while each value is its own run's mean over its own non-lone queries
    assert row["value"] == pytest.approx((0.6 + 0.3 + 0.2 + 1.0 + 0.5) / 5)


def test_no_shared_query_gives_nan_differences_not_a_p_value_of_one():
    labels = [0, 1]
    cmp = ee.compare(
        [_result({"m": [0.5, np.nan]}, labels), _result({"m": [np.nan, 0.5]}, labels)], n_boot=50
    )
    row = _row(cmp, "run1", "m")
    assert row["n_shared"] == 0
    assert all(math.isnan(row[k]) for k in ("diff", "diff_ci_low", "diff_ci_high", "p_value"))
    assert json.loads(cmp.to_json())["rows"][1]["p_value"] is None


def test_real_checkpoints_via_evaluate_and_determinism():
    rng = np.random.default_rng(1)
    y = np.repeat(np.arange(6), 10)
    centers = rng.standard_normal((6, 5)) * 2
    runs = {
        name: ee.evaluate(centers[y] + s * rng.standard_normal((60, 5)), y)
        for name, s in (("e1", 2.0), ("e5", 1.0), ("e9", 0.3))
    }
    c1 = ee.compare(runs, baseline="e1", n_boot=300, seed=4)
    c2 = ee.compare(runs, baseline="e1", n_boot=300, seed=4)
    c3 = ee.compare(runs, baseline="e1", n_boot=300, seed=5)
    assert c1.rows == c2.rows and c1.rows != c3.rows
    r = _row(c1, "e9", "map_at_r")
    assert r["diff"] == pytest.approx(runs["e9"]["map_at_r"] - runs["e1"]["map_at_r"])
    assert r["diff_ci_low"] > 0 and r["p_value"] < 0.01
    # default metrics: every per-query metric, ordered metric-major
    assert c1.metrics == list(runs["e1"].per_query)
    assert [(r["metric"], r["checkpoint"]) for r in c1.rows] == [
        (m, n) for m in c1.metrics for n in ("e1", "e5", "e9")
    ]
    # baseline by index equals baseline by name
    assert ee.compare(runs, baseline=0, n_boot=300, seed=4).rows == c1.rows


# ---------------------------------------------------------------- Comparison outputs


def _small_comparison():
    labels = np.arange(30) % 3
    a, b, _ = _pair(n=30, seed=2)
    return ee.compare(
        {
            "base": _result({"m": a, "k": 1 - a}, labels),
            "new": _result({"m": b, "k": 1 - b}, labels),
        },
        n_boot=200,
    )


def test_outputs_round_trip_and_have_stable_keys(tmp_path):
    cmp = _small_comparison()
    keys = [
        "checkpoint",
        "metric",
        "value",
        "ci_low",
        "ci_high",
        "diff",
        "diff_ci_low",
        "diff_ci_high",
        "p_value",
        "n_shared",
    ]
    assert all(list(r) == keys for r in cmp.rows) and len(cmp.rows) == 4
    path = tmp_path / "cmp.json"
    text = cmp.to_json(path)
    assert json.loads(path.read_text()) == json.loads(text) == cmp.to_dict()
    assert json.loads(text)["baseline"] == "base"
    rows = list(csv.DictReader(io.StringIO(cmp.to_csv())))
    assert list(rows[0]) == keys and len(rows) == 4
    assert float(rows[1]["diff"]) == pytest.approx(cmp.rows[1]["diff"])
    md = cmp.to_markdown().splitlines()
    assert len(md) == 2 + 4 and all(line.count("|") == 8 for line in md)
    text = repr(cmp)
    assert "diff vs base" in text and "95% CI" in text and len(text.splitlines()) == 2 + 4


def test_plot_draws_one_band_per_metric():
    pytest.importorskip("matplotlib", reason="plots need matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cmp = _small_comparison()
    fig = cmp.plot(metrics=["m"])
    ax = fig.axes[0]
    assert len(ax.lines) == 1 and len(ax.collections) == 1
    assert list(ax.lines[0].get_ydata()) == [r["value"] for r in cmp.rows if r["metric"] == "m"]
    fig2, ax2 = plt.subplots()
    assert cmp.plot(ax=ax2) is fig2 and len(ax2.lines) == 2
    plt.close("all")


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ci": 0}, "strictly between 0 and 1"),
        ({"ci": 1}, "strictly between 0 and 1"),
        ({"ci": float("nan")}, "strictly between 0 and 1"),
        ({"ci": True}, "strictly between 0 and 1"),
        ({"ci": "0.95"}, "strictly between 0 and 1"),
        ({"n_boot": 0}, "n_boot must be >= 1"),
        ({"n_boot": 10.0}, "Use n_boot=10"),
        ({"seed": -1}, "seed must be >= 0"),
        ({"seed": None}, "seed must be an integer"),
        ({"average": "marco"}, "Did you mean 'macro'"),
        ({"metrics": ["mapp"]}, "Did you mean 'map'"),
        ({"labels": [0, 1]}, "labels has 2 values but per_query"),
        ({"labels": np.zeros((4, 2, 2))}, "labels must be 1-D"),
        ({"labels": np.zeros((3, 2))}, "labels has 3 values but per_query"),
        ({"labels": np.full((4, 2), 2)}, "only 0 and 1"),
        ({"labels": np.eye(4), "average": "macro"}, "multi-label labels"),
        ({"labels": [0.0, np.nan, 1.0, 1.0], "average": "macro"}, "NaN or infinite label"),
    ],
)
def test_bootstrap_ci_bad_arguments(kwargs, match):
    with pytest.raises(ee.InputError, match=match):
        ee.bootstrap_ci({"map": [0.1, 0.2, 0.3, 0.4]}, **kwargs)


@pytest.mark.parametrize(
    ("per_query", "error", "match"),
    [
        ({"m": [0.1, np.inf]}, ee.InputError, r"1 infinite value\(s\), first at index 1"),
        ({"m": np.ones((3, 2))}, ee.InputError, r"per_query\['m'\] must be 1-D"),
        ({"m": ["a", "b"]}, ee.InputTypeError, "must be numeric"),
        ({"m": np.array([0.5, None], dtype=object)}, ee.InputTypeError, "object array"),
        ([0.1, 0.2], ee.InputTypeError, "dict of metric"),
        (np.array([0.1, 0.2]), ee.InputTypeError, "dict of metric"),
    ],
)
def test_bootstrap_ci_bad_values(per_query, error, match):
    with pytest.raises(error, match=match):
        ee.bootstrap_ci(per_query)


def test_compare_bad_input_per_query():
    labels = [0, 0, 1, 1]
    r = _result({"m": [0.1, 0.2, 0.3, 0.4]}, labels)
    r2 = _result({"m": [0.2, 0.2, 0.3, 0.5]}, labels)
    with pytest.raises(ee.InputError, match="different queries"):
        ee.compare([r, _result({"m": [0.1, 0.2, 0.3]}, [0, 0, 1])])
    with pytest.raises(ee.InputError, match=r"different query labels .* first at query 3"):
        ee.compare([r, _result({"m": [0.1, 0.2, 0.3, 0.4]}, [0, 0, 1, 2])])
    with pytest.raises(ee.InputError, match="average='macro'.*same average"):
        ee.compare([r, _result({"m": [0.1, 0.2, 0.3, 0.4]}, labels, average="macro")])
    with pytest.raises(ee.InputError, match="Did you mean 'new'"):
        ee.compare({"old": r, "new": r2}, baseline="neww")
    with pytest.raises(ee.InputError, match="only 2 results"):
        ee.compare([r, r2], baseline=2)
    with pytest.raises(ee.InputError, match="baseline must be >= 0"):
        ee.compare([r, r2], baseline=-1)
    with pytest.raises(ee.InputError, match="names has 1 entries"):
        ee.compare([r, r2], names=["x"])
    with pytest.raises(ee.InputError, match="'x' repeated"):
        ee.compare([r, r2], names=["x", "x"])
    with pytest.raises(ee.InputTypeError, match="names must be strings"):
        ee.compare([r, r2], names=[1, 2])
    with pytest.raises(ee.InputError, match="results is empty"):
        ee.compare({})
    with pytest.raises(ee.InputTypeError, match="Wrap a single result in a list"):
        ee.compare(r)
    with pytest.raises(ee.InputTypeError, match="not an EvaluationResult"):
        ee.compare([r, r2.per_query])
    with pytest.raises(ee.InputError, match="Did you mean 'm'"):
        ee.compare([r, r2], metrics="mm")
    with pytest.raises(ee.InputError, match="strictly between 0 and 1"):
        ee.compare([r, r2], ci=95)
    with pytest.raises(ee.InputError, match="n_boot must be >= 1"):
        ee.compare([r, r2], n_boot=0)
    with pytest.raises(ee.InputError, match="seed must be >= 0"):
        ee.compare([r, r2], seed=-3)
    with pytest.raises(ee.InputError, match="Did you mean 'permutation'"):
        ee.compare([r, r2], test="permutaton")


def test_runs_read_to_different_depths_are_refused():
    # the same embeddings read exactly and to depth k=2: class 0 has R_q = 3, so k=2 truncates
    # its MAP@R (2 of its 3 relevant read: 2/3 instead of 1); a comparison would report the
    # depth as a difference between checkpoints
    x = np.array([[0.0], [0.1], [0.2], [0.3], [5.0], [5.1], [5.2], [9.0], [9.1], [9.2]])
    y = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2, 2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the truncation warning of k=2
        exact, shallow = ee.evaluate(x, y), ee.evaluate(x, y, k=2)
    by_count, three = ee.evaluate(x, y, k="max_bin_count"), ee.evaluate(x, y, k=3)
    assert exact["map_at_r"] == 1.0 and shallow["map_at_r"] == pytest.approx((4 * 2 / 3 + 6) / 10)
    with pytest.raises(ee.InputError, match=r"k=2 but 'run0' with k=None \(exact\).*same k"):
        ee.compare([exact, shallow])
    with pytest.raises(ee.InputError, match=r"k=2 but 'run0' with k='max_bin_count' \(depth 3\)"):
        ee.compare([by_count, shallow])
    # max_bin_count is depth max R_q = 3 here, the same ranking as k=3: compared, no difference
    same = ee.compare([by_count, three], n_boot=20)
    assert all(r["diff"] == 0 and r["p_value"] == 1 for r in same.rows)


def test_compare_metric_without_per_query_values():
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 70)
    x = rng.standard_normal((3, 4))[y] * 3 + rng.standard_normal((210, 4))
    res = ee.evaluate(x, y, metrics=["nmi", "precision_at_1"])
    with pytest.raises(ee.InputError, match="nmi/ami have none"):
        ee.compare([res, res], metrics=["nmi"])
    only = ee.evaluate(x, y, metrics=["nmi"])
    with pytest.raises(ee.InputError, match="no metric has per-query values"):
        ee.compare([only, only])


def test_plot_unknown_metric():
    with pytest.raises(ee.InputError, match="Did you mean 'm'"):
        _small_comparison().plot(metrics=["mm"])


def test_confidence_permutation_p_is_the_sign_flip_test_of_per_query_brier_differences():
    from scipy import stats

    # the same embeddings, two confidences: the Brier score is the mean of (c - hit)^2 per
    # query, so exchanging the two runs' queries is the sign-flip test of its per-query
    # differences (both runs change in a swap, not only one)
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(8), 10)
    x = rng.standard_normal((8, 6))[y] * 0.8 + rng.standard_normal((80, 6))
    c0, c1 = rng.random(80), rng.random(80)
    r0 = ee.evaluate(x, y, metrics=["precision_at_1"], confidences=c0)
    r1 = ee.evaluate(x, y, metrics=["precision_at_1"], confidences=c1)
    cmp = ee.compare([r0, r1], metrics=["brier"], test="permutation", n_boot=4000)
    hit = r0.per_query["precision_at_1"]
    d = (c1 - hit) ** 2 - (c0 - hit) ** 2
    assert _row(cmp, "run1", "brier")["diff"] == pytest.approx(d.mean(), abs=1e-12)
    ref = stats.permutation_test(
        (d,), np.mean, permutation_type="samples", n_resamples=20000, rng=0
    ).pvalue
    assert ref > 0.4  # no real difference: the swaps reach the observed one about half the time
    assert _row(cmp, "run1", "brier")["p_value"] == pytest.approx(ref, abs=0.03)


def test_bootstrap_p_counts_exactly_zero_resampled_differences_on_both_sides():
    # macro P@1 with 6 queries per class: class means k/6 are not exact in binary, so the two
    # runs' resampled means round apart even where the resampled difference is exactly 0.
    # Oracle: the same documented draws on integer hit counts, whose sign is exact.
    y = np.repeat(np.arange(8), 6)
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((8, 8))
    runs = [
        ee.evaluate(
            centers[y] * s + rng.standard_normal((48, 8)),
            y,
            metrics=["precision_at_1"],
            average="macro",
        )
        for s in (0.5, 0.8)
    ]
    p = ee.compare(runs, n_boot=800, seed=5).rows[1]["p_value"]
    hits = [
        np.array([round(r.per_query["precision_at_1"][y == c].sum()) for c in range(8)])
        for r in runs
    ]
    idx = np.random.default_rng(5).integers(0, 8, size=(800, 8))  # classes drawn per resample
    sign = (hits[1][idx] - hits[0][idx]).sum(axis=1)
    assert np.mean(sign == 0) > 0.05  # the case at stake: many resamples tie exactly
    assert p == pytest.approx(min(1.0, 2 * min(np.mean(sign <= 0), np.mean(sign >= 0))), abs=1e-12)


def test_confidence_rows_count_the_queries_their_statistic_reads():
    # 16 queries in 4 classes of 4, and 4 classes of one query each: 4 lone queries.  The
    # Brier score and the areas leave the lone ones out; the open-set metrics read them as
    # out-of-gallery, so they use all 20.
    rng = np.random.default_rng(3)
    y = np.array([0] * 4 + [1] * 4 + [2] * 4 + [3] * 4 + [4, 5, 6, 7])
    x = rng.standard_normal((20, 4))
    runs = [
        ee.evaluate(x, y, metrics=["precision_at_1"], confidences=rng.random(20)) for _ in range(2)
    ]
    keys = ["brier", "aurc_precision_at_1", "open_set_auroc"]
    cmp = ee.compare(runs, metrics=["precision_at_1", *keys], n_boot=50)
    n_lone = sum(np.sum(y == c) == 1 for c in set(y.tolist()))  # classes of a single query
    assert n_lone == 4
    for name in ("run0", "run1"):
        assert _row(cmp, name, "precision_at_1")["n_shared"] == 20 - n_lone
        assert _row(cmp, name, "brier")["n_shared"] == 20 - n_lone
        assert _row(cmp, name, "aurc_precision_at_1")["n_shared"] == 20 - n_lone
        assert _row(cmp, name, "open_set_auroc")["n_shared"] == 20


def test_the_documented_permutation_example_states_what_the_code_gives():
    from pathlib import Path

    from scipy import stats

    text = (Path(__file__).resolve().parents[1] / "docs" / "compare.md").read_text("utf-8")
    number = r"([+−-]?[0-9.]+)"
    found = re.search(rf"epoch10's MAP@R is {number}\s+\[{number}, {number}\], p = {number}", text)
    diff, lo, hi, p = (float(g.replace("−", "-")) for g in found.groups())
    # the documented code
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(20), 25)
    centers = rng.standard_normal((20, 16))
    m = ["precision_at_1", "map_at_r"]
    runs = {
        f"epoch{e}": ee.evaluate(centers[y] * s + rng.standard_normal((500, 16)), y, metrics=m)
        for e, s in ((1, 0.7), (5, 0.9), (10, 0.92))
    }
    row = _row(ee.compare(runs, baseline="epoch5", test="permutation"), "epoch10", "map_at_r")
    assert (diff, lo, hi) == (
        round(row["diff"], 4),
        round(row["diff_ci_low"], 4),
        round(row["diff_ci_high"], 4),
    )
    assert p == round(row["p_value"], 2)
    # and the stated p is the sign-flip test's, up to the Monte Carlo error of 1000 patterns
    d = runs["epoch10"].per_query["map_at_r"] - runs["epoch5"].per_query["map_at_r"]
    ref = stats.permutation_test(
        (d,), np.mean, permutation_type="samples", n_resamples=20000, rng=0
    ).pvalue
    assert p == pytest.approx(ref, abs=0.05)


def test_a_table_prints_nan_differences_as_nan_like_the_values():
    labels = [0, 1]
    cmp = ee.compare(
        [_result({"m": [0.5, np.nan]}, labels), _result({"m": [np.nan, 0.5]}, labels)], n_boot=50
    )
    cells = [c.strip() for c in cmp.to_markdown().splitlines()[-1].split("|")[1:-1]]
    assert cells[4:] == ["nan", "[nan, nan]", "nan"]  # diff, diff CI, p; not "+nan"
    assert "+nan" not in repr(cmp)


@pytest.mark.parametrize("n_boot", [300, 800, 1000, 1001, 7, 11, 99])
def test_the_p_floor_is_one_over_n_boot_rounded_up(n_boot):
    # a constant positive difference: no resample crosses 0, so p = 0 and the table says "<"
    labels = np.arange(10) % 2
    a = np.linspace(0.1, 0.5, 10)
    cmp = ee.compare([_result({"m": a}, labels), _result({"m": a + 0.2}, labels)], n_boot=n_boot)
    assert cmp.rows[1]["p_value"] == 0.0
    shown = cmp.to_markdown().splitlines()[-1].split("|")[-2].strip()
    assert shown.startswith("<")
    bound = float(shown[1:])
    # plain loop: the smallest d * 10**e (d = 1..9) that is not below 1 / n_boot
    candidates = [d * 10.0**e for e in range(-8, 1) for d in range(1, 10)]
    want = min(c for c in candidates if c >= 1 / n_boot * (1 - 1e-12))
    assert bound == pytest.approx(want, rel=1e-12)


def test_confidence_differences_are_over_the_queries_lone_in_no_run():
    from scipy import stats

    # the second gallery has no class 5, so its 5 queries are lone there only; the Brier
    # difference (its interval and p) is then over the 25 other queries, as the per-query
    # metrics' is, while each value stays its run's own
    rng = np.random.default_rng(0)
    q, ref = rng.standard_normal((30, 3)), rng.standard_normal((30, 3))
    y = np.repeat(np.arange(6), 5)
    y_ref = np.where(y == 5, 4, y)
    c0, c1 = rng.random(30), rng.random(30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the lone queries' warning
        r0 = ee.evaluate(q, y, reference=ref, reference_labels=y, confidences=c0)
        r1 = ee.evaluate(q, y, reference=ref, reference_labels=y_ref, confidences=c1)
    hit0, hit1 = r0.per_query["precision_at_1"], r1.per_query["precision_at_1"]
    ok = ~(np.isnan(hit0) | np.isnan(hit1))
    assert ok.sum() == 25
    d = (c1[ok] - hit1[ok]) ** 2 - (c0[ok] - hit0[ok]) ** 2
    boot = _row(ee.compare([r0, r1], metrics=["brier"], n_boot=1000, ci=0.9), "run1", "brier")
    assert boot["diff"] == pytest.approx(d.mean(), abs=1e-12)
    assert boot["n_shared"] == 25
    own = ~np.isnan(hit1)
    assert boot["value"] == pytest.approx(np.mean((c1[own] - hit1[own]) ** 2))
    ref_ci = stats.bootstrap(
        (d,), np.mean, confidence_level=0.9, n_resamples=20000, method="percentile", rng=1
    ).confidence_interval
    assert boot["diff_ci_low"] == pytest.approx(ref_ci.low, abs=0.03)
    assert boot["diff_ci_high"] == pytest.approx(ref_ci.high, abs=0.03)
    perm = ee.compare([r0, r1], metrics=["brier"], n_boot=1000, test="permutation")
    ref_p = stats.permutation_test(
        (d,), np.mean, permutation_type="samples", n_resamples=20000, rng=0
    ).pvalue
    assert _row(perm, "run1", "brier")["p_value"] == pytest.approx(ref_p, abs=0.05)
