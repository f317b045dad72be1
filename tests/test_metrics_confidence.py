"""embedeval.metrics.confidence against hand values, brute force, scikit-learn, scipy and Monte
Carlo."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import embedeval as ee
from embedeval.metrics import confidence as cf
from embedeval.utils.errors import InputError
from tests import oracle


def _erc_brute(scores, conf):
    """AUERC averaged over every order of tied confidences (enumeration)."""
    scores, conf = np.asarray(scores, float), np.asarray(conf, float)
    n = len(scores)
    totals = []
    for perm in itertools.permutations(range(n)):
        order = sorted(perm, key=lambda i: -conf[i])  # stable: ties keep the permutation order
        errs = 1 - scores[order]
        totals.append([errs[:k].mean() for k in range(1, n + 1)])
    return np.mean(totals, axis=0)  # E_k for k = 1..n


def test_erc_hand_values_without_ties():
    erc = cf.error_reject_curve([1, 0, 0.5, 1], [4, 1, 2, 3])
    # most confident first: 1 (e0), 1 (e0), 0.5 (e.5), 0 (e1): E_1..4 = 0, 0, 1/6, 3/8
    assert erc.error.tolist() == pytest.approx([3 / 8, 1 / 6, 0, 0])
    assert erc.auerc == pytest.approx((0 + 0 + 1 / 6 + 3 / 8) / 4)
    assert erc.rejected.tolist() == [0, 0.25, 0.5, 0.75]
    assert erc.random_auerc == pytest.approx(1.5 / 4)


def test_erc_hand_values_with_a_tied_block():
    # errors 1, 0 tied at confidence 5, then error 0 at confidence 1.
    erc = cf.error_reject_curve([0, 1, 1], [5, 5, 1])
    # E_1 = expected error of one of the tied pair = 1/2; E_2 = 1/2; E_3 = 1/3
    assert erc.auerc == pytest.approx((1 / 2 + 1 / 2 + 1 / 3) / 3)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([0.0, 0.25, 1.0]), st.integers(0, 2)), min_size=1, max_size=6
    )
)
def test_erc_equals_the_mean_over_all_tie_orders(pairs):
    scores, conf = zip(*pairs, strict=True)
    erc = cf.error_reject_curve(scores, conf)
    expected = _erc_brute(scores, conf)
    np.testing.assert_allclose(erc.error[::-1], expected, atol=1e-12)
    assert erc.auerc == pytest.approx(expected.mean())


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_erc_properties(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 60))
    scores = rng.choice([0.0, 0.3, 1.0], n)
    conf = rng.integers(0, 5, n).astype(float)
    erc = cf.error_reject_curve(scores, conf)
    # invariant to strictly increasing transforms
    assert cf.error_reject_curve(scores, np.exp(conf) * 3 - 7).auerc == pytest.approx(erc.auerc)
    # sigma convention: negating and flipping the switch changes nothing
    assert cf.error_reject_curve(scores, -conf, higher_is_confident=False).auerc == pytest.approx(
        erc.auerc
    )
    assert erc.oracle_auerc <= erc.auerc + 1e-12
    assert erc.random_auerc == pytest.approx(np.mean(1 - scores))
    # a constant confidence is the random baseline exactly
    assert cf.error_reject_curve(scores, np.zeros(n)).auerc == pytest.approx(erc.random_auerc)
    # input order does not matter
    perm = rng.permutation(n)
    assert cf.error_reject_curve(scores[perm], conf[perm]).auerc == pytest.approx(erc.auerc)


def test_erc_drops_nan_and_rejects_bad_input():
    erc = cf.error_reject_curve([1, np.nan, 0], [1, 2, 3])
    assert erc.n == 2 and erc.n_dropped == 1
    with pytest.raises(ee.InputError, match=r"must lie in \[0, 1\]"):
        cf.error_reject_curve([2, 0], [1, 2])
    with pytest.raises(ee.InputError, match="confidence has 1 NaN"):
        cf.error_reject_curve([1, 0], [1, np.nan])
    with pytest.raises(ee.InputError, match="confidence has 1 values but 2"):
        cf.error_reject_curve([1, 0], [1])


def test_r_auroc_matches_sklearn_with_ties():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    correct = rng.integers(0, 2, 300)
    conf = rng.integers(0, 10, 300).astype(float)
    assert cf.confidence_auroc(correct, conf) == pytest.approx(roc_auc_score(correct, conf))
    with pytest.warns(ee.EmbedevalWarning, match="both correct and incorrect"):
        assert math.isnan(cf.confidence_auroc([1, 1], [0.1, 0.2]))


def test_best_threshold_accuracy_brute_force():
    rng = np.random.default_rng(1)
    correct = rng.integers(0, 2, 80)
    conf = rng.integers(0, 6, 80).astype(float)
    best = max(np.mean((conf >= t) == (correct == 1)) for t in [*np.unique(conf), np.inf])
    assert cf.best_threshold_accuracy(correct, conf) == pytest.approx(best)


def test_calibration_errors_by_hand_and_bin_edges():
    # bins (0, .5], (.5, 1] with the first closed: 0.5 goes to the first bin
    correct = [1, 0, 1, 0]
    conf = [0.5, 0.5, 1.0, 1.0]
    # bin0: acc 1/2, conf 1/2 -> 0; bin1: acc 1/2, conf 1 -> 1/2
    assert cf.expected_calibration_error(correct, conf, bins=2) == pytest.approx(0.25)
    assert cf.maximum_calibration_error(correct, conf, bins=2) == pytest.approx(0.5)
    with pytest.raises(ee.InputError, match=r"\[0, 1\]"):
        cf.expected_calibration_error([1], [1.5])


def test_confidence_recall_curve_quantile_bins_have_equal_mass():
    conf = np.arange(100.0)
    cur = cf.confidence_recall_curve(np.ones(100), conf, bins=4, strategy="quantile")
    assert cur.count.tolist() == [25, 25, 25, 25]
    assert cur.mean_metric.tolist() == [1, 1, 1, 1]


def test_confidence_recall_curve_with_one_confidence_value_is_one_bin():
    # Every confidence equal (a constant sigma): one bin holding all four queries,
    # mean metric (1 + 0 + 1 + 1) / 4 = 0.75, for either binning.
    for strategy in ("quantile", "uniform"):
        cur = cf.confidence_recall_curve([1, 0, 1, 1], [0.5] * 4, strategy=strategy)
        assert cur.count[cur.count > 0].tolist() == [4]
        assert cur.mean_metric[cur.count > 0].tolist() == [0.75]
        assert cur.mean_confidence[cur.count > 0].tolist() == [0.5]


def test_rank_correlation_matches_scipy():
    from scipy import stats

    iq = [106, 86, 100, 101, 99, 103, 97, 113, 112, 110]
    tv = [7, 0, 27, 50, 28, 29, 20, 12, 6, 17]
    res = cf.rank_correlation(iq, tv)
    assert res.statistic == pytest.approx(-29 / 165)
    assert res.pvalue == pytest.approx(stats.spearmanr(iq, tv).pvalue)
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 5, 50), rng.integers(0, 5, 50)
    k = cf.rank_correlation(a, b, method="kendall")
    assert k.statistic == pytest.approx(stats.kendalltau(a, b).statistic)
    # kappa (confidence) vs true sigma: the switch flips the sign
    assert cf.rank_correlation(-a, b, higher_is_uncertain=False).statistic == pytest.approx(
        cf.rank_correlation(a, b).statistic
    )
    # strictly increasing transforms do not matter
    assert cf.rank_correlation(np.exp(a), b).statistic == pytest.approx(
        cf.rank_correlation(a, b).statistic
    )


def test_rank_correlation_constant_and_nan_policy():
    with pytest.warns(ee.EmbedevalWarning, match="constant"):
        assert math.isnan(cf.rank_correlation([1, 1, 1], [1, 2, 3]).statistic)
    with pytest.raises(ee.InputError, match="nan_policy='omit'"):
        cf.rank_correlation([1, np.nan, 3], [1, 2, 3])
    assert cf.rank_correlation([1, np.nan, 3, 4], [1, 2, 3, 5], nan_policy="omit").statistic == 1
    assert math.isnan(cf.rank_correlation([1, np.nan], [1, 2], nan_policy="propagate").statistic)


def test_hpd_interval_matches_all_windows_brute_force():
    rng = np.random.default_rng(0)
    samples = rng.gamma(2.0, size=(5, 201))
    lo, hi = cf.hpd_interval(samples, 0.9)
    for row, a, b in zip(samples, lo, hi, strict=True):
        x = np.sort(row)
        m = math.floor(0.9 * 201) + 1
        widths = [x[i + m - 1] - x[i] for i in range(201 - m + 1)]
        i = int(np.argmin(widths))
        assert (a, b) == (x[i], x[i + m - 1])
    lo_t, _ = cf.hpd_interval(samples.T, 0.9, axis=0)
    np.testing.assert_array_equal(lo_t, lo)


def test_gaussian_radius_coverage_by_monte_carlo():
    rng = np.random.default_rng(0)
    for dim in (2, 16):
        r = cf.gaussian_credible_radius(0.7, dim, 0.9)
        z = rng.standard_normal((200_000, dim)) * 0.7
        assert np.mean(np.linalg.norm(z, axis=1) <= r) == pytest.approx(0.9, abs=0.005)


def _sample_vmf(kappa, dim, n, rng):
    """Wood (1994): w from its marginal by rejection, then a uniform tangent direction."""
    b = (-2 * kappa + np.sqrt(4 * kappa**2 + (dim - 1) ** 2)) / (dim - 1)
    x0 = (1 - b) / (1 + b)
    c = kappa * x0 + (dim - 1) * np.log(1 - x0**2)
    out = []
    while len(out) < n:
        z = rng.beta((dim - 1) / 2, (dim - 1) / 2, size=n)
        w = (1 - (1 + b) * z) / (1 - (1 - b) * z)
        u = rng.uniform(size=n)
        ok = kappa * w + (dim - 1) * np.log(1 - x0 * w) - c >= np.log(u)
        out.extend(w[ok].tolist())
    return np.array(out[:n])


def test_vmf_cap_coverage_by_monte_carlo():
    rng = np.random.default_rng(1)
    for kappa, dim in ((5.0, 3), (40.0, 8)):
        t = float(cf.vmf_credible_cap(kappa, dim, 0.8))
        w = _sample_vmf(kappa, dim, 200_000, rng)
        assert np.mean(w >= t) == pytest.approx(0.8, abs=0.005)


def test_credible_coverage_is_calibrated_for_true_gaussians():
    rng = np.random.default_rng(2)
    dim, sigma = 4, 0.5
    centers = rng.standard_normal((200, dim)) * 50
    y = np.repeat(np.arange(200), 2)
    x = centers[y] + rng.standard_normal((400, dim)) * sigma
    # the other member is at distance ~ N(0, 2 sigma^2): a region built with sigma*sqrt(2)
    # (the spread of a difference) is calibrated
    cov = cf.credible_coverage(x, y, np.full(400, sigma * math.sqrt(2)), levels=[0.5, 0.9])
    np.testing.assert_allclose(cov.empirical, [0.5, 0.9], atol=0.06)


def test_evaluate_with_confidences_end_to_end():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((120, 6)).astype(np.float32)
    y = rng.integers(0, 6, 120)
    kappa = rng.random(120)
    res = ee.evaluate(x, y, metrics=["precision_at_1", "map_at_r"], confidences=kappa)
    _, pq = oracle.summary(x, y, metrics=["precision_at_1", "map_at_r"])
    erc = _erc_brute_large(pq["map_at_r"], kappa)
    assert res["auerc_map_at_r"] == pytest.approx(erc)
    from sklearn.metrics import roc_auc_score

    assert res["r_auroc"] == pytest.approx(roc_auc_score(pq["precision_at_1"], kappa))
    sig = ee.evaluate(
        x, y, metrics=["precision_at_1"], confidences=-kappa, higher_is_confident=False
    )
    assert sig["r_auroc"] == pytest.approx(res["r_auroc"])


def _erc_brute_large(scores, conf):
    # no ties in random floats: a plain loop over k
    order = np.argsort(-conf)
    e = 1 - scores[order]
    return np.mean([e[:k].mean() for k in range(1, len(e) + 1)])


def test_reject_from_both_matches_brute_force():
    rng = np.random.default_rng(4)
    x = rng.integers(-3, 4, (30, 2)).astype(np.float32)
    y = rng.integers(0, 3, 30)
    conf = rng.permutation(30).astype(float)
    res = ee.evaluate(
        x,
        y,
        metrics=["precision_at_1"],
        confidences=conf,
        reject_from="both",
        rejection_fractions=[0.0, 0.2, 0.5],
    )
    for f in (0.0, 0.2, 0.5):
        keep = np.sort(np.argsort(-conf)[: 30 - math.ceil(f * 30)])
        summary, _ = oracle.summary(x[keep], y[keep], metrics=["precision_at_1"])
        assert res[f"both_precision_at_1@{f:.2f}"] == pytest.approx(summary["precision_at_1"])
    with pytest.raises(ee.InputError, match="needs confidences"):
        ee.evaluate(x, y, reject_from="both")


# ----------------------------------------------------------------- hand values with ties
def test_erc_hand_values_map_at_r_valued_errors_with_a_tied_block():
    # MAP@R-like scores 1, 1/2, 5/6, 0, 1/3 -> errors 0, 1/2, 1/6, 1, 2/3; confidences 5, 3, 3,
    # 1, 4.  Most confident first: e=0 (c 5), e=2/3 (c 4), the tied pair {1/2, 1/6} (c 3, mean
    # 1/3), e=1 (c 1).  Kept error sums k=1..5: 0, 2/3, 1, 4/3, 7/3 -> E_k = 0, 1/3, 1/3, 1/3,
    # 7/15; AUERC = 22/75.  Oracle (errors sorted): sums 0, 1/6, 2/3, 4/3, 7/3 -> E_k = 0, 1/12,
    # 2/9, 1/3, 7/15 -> 199/900.  Random = 7/15.
    erc = cf.error_reject_curve([1, 1 / 2, 5 / 6, 0, 1 / 3], [5, 3, 3, 1, 4])
    np.testing.assert_allclose(erc.error[::-1], [0, 1 / 3, 1 / 3, 1 / 3, 7 / 15])
    assert erc.auerc == pytest.approx(22 / 75)
    assert erc.oracle_auerc == pytest.approx(199 / 900)
    assert erc.random_auerc == pytest.approx(7 / 15)
    assert erc.excess_auerc == pytest.approx(22 / 75 - 199 / 900)
    np.testing.assert_allclose(erc.rejected, [0, 0.2, 0.4, 0.6, 0.8])
    # the tied pair swapped in the input: same curve
    swapped = cf.error_reject_curve([1, 5 / 6, 1 / 2, 0, 1 / 3], [5, 3, 3, 1, 4])
    np.testing.assert_array_equal(swapped.error, erc.error)


def test_auerc_of_map_at_r_end_to_end_by_hand_with_a_lone_query():
    # 1-D points, leave-one-out.  a: 0, 1, 3; b: 1.5, 4; c: 100 (lone).
    #   q=0 (a, R=2): 1(a), 1.5(b) -> MAP@R = (1/1)/2 = 1/2
    #   q=1 (a, R=2): 1.5(b), 0(a) -> (1/2)/2 = 1/4
    #   q=3 (a, R=2): 4(b), 1.5(b) -> 0
    #   q=1.5 (b, R=1): 1(a) -> 0;  q=4 (b, R=1): 3(a) -> 0;  q=100: lone (NaN, dropped)
    x = np.array([[0.0], [1.0], [3.0], [1.5], [4.0], [100.0]])
    y = ["a", "a", "a", "b", "b", "c"]
    conf = [3, 2, 2, 1, 4, 0.5]
    res = ee.evaluate(x, y, metrics=["precision_at_1", "map_at_r"], confidences=conf)
    np.testing.assert_allclose(res.per_query["map_at_r"][:5], [1 / 2, 1 / 4, 0, 0, 0])
    assert res.n_lone == 1 and math.isnan(res.per_query["map_at_r"][5])
    # errors 1/2, 3/4, 1, 1, 1 at confidences 3, 2, 2, 1, 4: order e=1 (c 4), 1/2 (c 3), the
    # tied pair {3/4, 1} (c 2, mean 7/8), 1 (c 1): E_k = 1, 3/4, 19/24, 13/16, 17/20
    expected = (1 + 3 / 4 + 19 / 24 + 13 / 16 + 17 / 20) / 5  # = 1009/1200
    assert res.confidence["auerc_map_at_r"] == pytest.approx(expected)
    assert res.confidence["random_auerc_map_at_r"] == pytest.approx(17 / 20)
    erc = cf.error_reject_curve(res.per_query["map_at_r"], conf)
    assert erc.n == 5 and erc.n_dropped == 1 and erc.auerc == pytest.approx(1009 / 1200)


def _naive_ece(correct, conf, bins):
    """Right-closed bins (a, b] on a grid of exact fractions, [0, 1/bins] closed."""
    from fractions import Fraction

    groups = {}
    for m, c in zip(correct, conf, strict=True):
        fc = Fraction(c).limit_denominator(10_000)
        b = 0
        while not fc <= Fraction(b + 1, bins):
            b += 1
        groups.setdefault(b, []).append((m, c))
    gaps = [
        (len(g), abs(np.mean([m for m, _ in g]) - np.mean([c for _, c in g])))
        for g in groups.values()
    ]
    n = len(correct)
    return sum(w * gap for w, gap in gaps) / n, max(gap for _, gap in gaps)


@pytest.mark.parametrize("bins", [4, 5, 10, 20])
def test_ece_mce_bin_edges_against_an_exact_fraction_loop(bins):
    rng = np.random.default_rng(bins)
    # confidences on the bin edges (0, 0.05, ..., 1) and in between: edges go to the lower bin
    conf = rng.integers(0, 21, 300) / 20
    correct = rng.integers(0, 2, 300)
    ece, mce = _naive_ece(correct, conf, bins)
    assert cf.expected_calibration_error(correct, conf, bins=bins) == pytest.approx(ece)
    assert cf.maximum_calibration_error(correct, conf, bins=bins) == pytest.approx(mce)


def test_calibration_first_bin_is_closed_and_edges_go_left_by_hand():
    # bins=10: 0.0 and 0.1 share the first bin [0, 0.1]; 0.3 goes to (0.2, 0.3], not (0.3, 0.4]
    correct, conf = [1, 0, 1], [0.0, 0.1, 0.3]
    # bin [0, .1]: acc 1/2, conf .05 -> gap .45, weight 2/3; bin (.2, .3]: gap .7, weight 1/3
    assert cf.expected_calibration_error(correct, conf) == pytest.approx(0.45 * 2 / 3 + 0.7 / 3)
    assert cf.maximum_calibration_error(correct, conf) == pytest.approx(0.7)


def test_confidence_recall_curve_uniform_bins_by_hand_and_sigma_units():
    # range [0, 1] in 4 bins: [0, .25], (.25, .5], (.5, .75], (.75, 1]
    cur = cf.confidence_recall_curve([0, 1, 1, 0, 1], [0.0, 0.25, 0.5, 0.6, 1.0], bins=4)
    np.testing.assert_allclose(cur.edges, [0, 0.25, 0.5, 0.75, 1])
    assert cur.count.tolist() == [2, 1, 1, 1]
    np.testing.assert_allclose(cur.mean_metric, [0.5, 1, 0, 1])
    np.testing.assert_allclose(cur.mean_confidence, [0.125, 0.5, 0.6, 1.0])
    # sigmas are reported as sigmas (the switch does not negate the bins)
    sig = cf.confidence_recall_curve(
        [0, 1, 1, 0, 1], [0.0, 0.25, 0.5, 0.6, 1.0], bins=4, higher_is_confident=False
    )
    np.testing.assert_allclose(sig.edges, cur.edges)
    np.testing.assert_allclose(sig.mean_confidence, cur.mean_confidence)
    # an empty bin keeps its place with count 0 and NaN means
    gap = cf.confidence_recall_curve([1, 0], [0.0, 1.0], bins=3)
    assert gap.count.tolist() == [1, 0, 1] and math.isnan(gap.mean_metric[1])


def test_r_auroc_and_best_threshold_need_binary_correctness():
    for fn in (cf.confidence_auroc, cf.best_threshold_accuracy):
        with pytest.raises(ee.InputError, match=r"correct must be 0/1.*correct\[1\] = 0.5"):
            fn([1, 0.5, 0], [0.1, 0.2, 0.3])


def test_spearman_with_ties_and_kendall_pvalue_match_scipy():
    from scipy import stats

    rng = np.random.default_rng(7)
    a, b = rng.integers(0, 4, 60), rng.integers(0, 4, 60)
    s = cf.rank_correlation(a, b)
    ref = stats.spearmanr(a, b)
    assert (s.statistic, s.pvalue) == (pytest.approx(ref.statistic), pytest.approx(ref.pvalue))
    k = cf.rank_correlation(a, b, method="kendall")
    ref = stats.kendalltau(a, b, variant="b")
    assert (k.statistic, k.pvalue) == (pytest.approx(ref.statistic), pytest.approx(ref.pvalue))
    assert k.n == 60


@pytest.mark.parametrize("kappa", [0.0, 1e-3, 0.5, 5.0, 1e3, 1e5, 1e7])
def test_vmf_cap_dim3_closed_form(kappa):
    # on S^2, P(mu.x >= t) = (1 - exp(-kappa (1 - t))) / (1 - exp(-2 kappa)) (uniform for 0)
    p = 0.9
    t = 1 - 2 * p if kappa == 0 else 1 + math.log1p(-p * -math.expm1(-2 * kappa)) / kappa
    assert float(cf.vmf_credible_cap(kappa, 3, p)) == pytest.approx(t, abs=1e-9)


@pytest.mark.parametrize("kappa", [0.0, 1.0, 30.0, 1e4])
def test_vmf_cap_dim2_is_the_von_mises_law(kappa):
    from scipy.stats import vonmises

    for p in (0.1, 0.5, 0.95):
        # a symmetric arc |theta| <= theta0 of mass p: theta0 = the (1 + p)/2 quantile
        t = math.cos(math.pi * p) if kappa == 0 else math.cos(vonmises.ppf(0.5 + p / 2, kappa))
        assert float(cf.vmf_credible_cap(kappa, 2, p)) == pytest.approx(t, abs=1e-8)


@pytest.mark.parametrize("dim", [4, 16, 128])
def test_vmf_cap_uniform_sphere_is_a_beta_quantile(dim):
    from scipy.stats import beta

    # kappa = 0: (1 + w)/2 ~ Beta((d-1)/2, (d-1)/2); P(w >= t) = 0.8 -> t = 2 q_0.2 - 1
    t = 2 * beta.ppf(0.2, (dim - 1) / 2, (dim - 1) / 2) - 1
    assert float(cf.vmf_credible_cap(0.0, dim, 0.8)) == pytest.approx(t, abs=1e-9)


def _vmf_upper_mass(t, kappa, dim):
    """P(mu.x >= t) under vMF(kappa) on S^(dim-1), by scipy: X = (1 + w)/2 is Beta(h, h),
    h = (dim - 1)/2, tilted by exp(kappa w) = exp(-kappa) exp(2 kappa X), whose mean over the
    Beta is the confluent hypergeometric 1F1(h; 2h; 2 kappa)."""
    from scipy import integrate, special, stats

    h = (dim - 1) / 2
    x = (1 + t) / 2
    part = integrate.quad(
        lambda v: stats.beta.pdf(v, h, h) * math.exp(2 * kappa * v), x, 1, epsabs=0, epsrel=1e-12
    )[0]
    return part / special.hyp1f1(h, 2 * h, 2 * kappa)


@pytest.mark.parametrize("dim", [4, 5, 16, 128])
@pytest.mark.parametrize("kappa", [1e-300, 1e-20, 1e-17, 5e-17, 1e-12, 1e-6, 1e-3])
def test_vmf_cap_tiny_kappa_tends_to_the_uniform_sphere(kappa, dim):
    from scipy.stats import beta

    t = float(cf.vmf_credible_cap(kappa, dim, 0.9))
    assert _vmf_upper_mass(t, kappa, dim) == pytest.approx(0.9, abs=1e-9)
    if kappa <= 1e-12:  # indistinguishable from kappa = 0: 2 q_0.1 - 1 of Beta((d-1)/2, (d-1)/2)
        assert t == pytest.approx(2 * beta.ppf(0.1, (dim - 1) / 2, (dim - 1) / 2) - 1, abs=1e-9)


def test_vmf_cap_array_with_an_underflowed_kappa():
    caps = cf.vmf_credible_cap([5.0, 1e-20, 100.0], 16, 0.95)
    for kappa, t in zip([5.0, 1e-20, 100.0], caps, strict=True):
        assert _vmf_upper_mass(float(t), kappa, 16) == pytest.approx(0.95, abs=1e-9)


def test_vmf_cap_high_kappa_high_dim_by_monte_carlo():
    rng = np.random.default_rng(5)
    kappa, dim = 500.0, 128  # the regime of real vMF embedding heads (the old solver failed)
    t = float(cf.vmf_credible_cap(kappa, dim, 0.95))
    w = _sample_vmf(kappa, dim, 200_000, rng)
    assert np.mean(w >= t) == pytest.approx(0.95, abs=0.003)


def _vmf_points(mu, kappa, n, rng):
    """Points on the sphere whose cosine to mu follows vMF(kappa) (Wood's w + a tangent)."""
    dim = mu.size
    w = _sample_vmf(kappa, dim, n, rng)
    v = rng.standard_normal((n, dim))
    v -= (v @ mu)[:, None] * mu
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return w[:, None] * mu + np.sqrt(1 - w**2)[:, None] * v


def test_credible_coverage_vmf_is_calibrated_for_true_vmf_pairs():
    # each class: its mean direction and one vMF draw around it.  Both members see the other at
    # the same cosine w ~ vMF, so the cap at level p holds the other with probability p.
    rng = np.random.default_rng(8)
    dim, kappa, n = 5, 20.0, 600
    x, y = [], []
    for c in range(n):
        mu = rng.standard_normal(dim)
        mu /= np.linalg.norm(mu)
        x += [mu, _vmf_points(mu, kappa, 1, rng)[0]]
        y += [c, c]
    cov = cf.credible_coverage(
        np.array(x), y, np.full(2 * n, kappa), model="vmf", levels=[0.5, 0.9]
    )
    np.testing.assert_allclose(cov.empirical, [0.5, 0.9], atol=0.04)
    assert cov.n_queries == 2 * n


def test_credible_coverage_hand_case_and_lone_queries():
    # sigma 1 in 1-D: radius at p = 0.5 is 0.674.  Class 0: 0, 0.5, 3 -> inside pairs only
    # 0 <-> 0.5: fractions 1/2, 1/2, 0.  Class 1 has one member (lone, skipped).
    cov = cf.credible_coverage(
        [[0.0], [0.5], [3.0], [9.0]], [0, 0, 0, 1], [1.0] * 4, levels=[0.5, 0.999]
    )
    # at p = 0.999 the radius is 3.29: every pair inside
    np.testing.assert_allclose(cov.empirical, [1 / 3, 1.0])
    assert cov.n_queries == 3
    with pytest.raises(ee.InputError, match="every query is lone"):
        cf.credible_coverage([[0.0], [1.0]], [0, 1], [1.0, 1.0])


def test_credible_coverage_gaussian_twins_with_sigma_zero_are_on_the_boundary():
    # a twin is at distance exactly 0 and the radius of sigma = 0 is 0: on the boundary, inside
    v = [0.56, -1.88, 0.5, 1.43, -0.2, -0.62, 2.68, 0.05]
    cov = cf.credible_coverage([v, v], [0, 0], [0.0, 0.0], levels=[0.5])
    assert cov.empirical.tolist() == [1.0]
    # 200 random vectors, each twice, one class: a query's only reference at distance 0 is its
    # twin, so each query holds 1 of the other 399 (counted by a loop over exact equality)
    x = np.repeat(np.random.default_rng(3).standard_normal((200, 8)), 2, axis=0)
    rows = x.tolist()
    fractions = [
        sum(rows[j] == rows[i] for j in range(len(rows)) if j != i) / (len(rows) - 1)
        for i in range(len(rows))
    ]
    cov = cf.credible_coverage(x, np.zeros(400), np.zeros(400), levels=[0.9])
    assert cov.empirical[0] == pytest.approx(np.mean(fractions), abs=1e-15)


def test_credible_coverage_gaussian_reference_at_the_radius_is_inside():
    r = float(cf.gaussian_credible_radius(1.0, 1, 0.5))
    cov = cf.credible_coverage([[0.0], [r]], [0, 0], [1.0, 1.0], levels=[0.5])
    assert cov.empirical.tolist() == [1.0]


def test_credible_coverage_vmf_refuses_a_zero_embedding():
    x = [[1.0, 0.0], [0.0, 0.0], [1.0, 0.1], [0.0, 0.0]]
    with pytest.raises(ee.InputError, match=r"embeddings has 2 zero vector\(s\), first at row 1"):
        cf.credible_coverage(x, [0, 0, 0, 0], [5.0] * 4, model="vmf", levels=[0.9])
    # the Gaussian ball has no trouble with the origin: every pair is within sqrt(chi2_2(0.9))
    # = 2.146 (the largest distance is |(1, 0.1)| = 1.005)
    cov = cf.credible_coverage(x[:3], [0, 0, 0], [1.0] * 3, levels=[0.9])
    assert cov.empirical.tolist() == [1.0]


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: cf.hpd_interval(np.array(["a", "b"], dtype=object)), ee.InputTypeError, "numeric"),
        (lambda: cf.hpd_interval(3.0), ee.InputError, "got a scalar"),
        (lambda: cf.hpd_interval([1.0, 2.0], axis=3), ee.InputError, r"axis=3 is out of range"),
        (lambda: cf.hpd_interval([1.0, np.inf], 0.5), ee.InputError, "1 NaN or infinite draw"),
        (lambda: cf.hpd_interval([1.0, np.nan], 0.5), ee.InputError, "NaN or infinite draw"),
        (lambda: cf.hpd_interval(np.ones((2, 0))), ee.InputError, "empty"),
        (lambda: cf.hpd_interval([1.0, 2.0], 0.0), ee.InputError, r"prob must be in \(0, 1\]"),
        (lambda: cf.gaussian_credible_radius("a", 2), ee.InputTypeError, "sigma must be numeric"),
        (lambda: cf.gaussian_credible_radius([1, -1], 2), ee.InputError, r"first at 1 \(-1.0\)"),
        (lambda: cf.gaussian_credible_radius(1.0, 0), ee.InputError, "dim must be >= 1"),
        (lambda: cf.vmf_credible_cap(math.nan, 3), ee.InputError, "kappa must be finite"),
        (lambda: cf.vmf_credible_cap(1.0, 1), ee.InputError, "dim must be >= 2"),
        (lambda: cf.vmf_credible_cap(1.0, 3, 1.5), ee.InputError, "prob"),
        (
            lambda: cf.credible_coverage([[0.0], [1.0]], [0, 0], [1, 1], model="vfm"),
            ee.InputError,
            "Did you mean 'vmf'",
        ),
        (
            lambda: cf.confidence_recall_curve([1, 0], [0.1, 0.2], strategy="quantle"),
            ee.InputError,
            "Did you mean 'quantile'",
        ),
        (
            lambda: cf.rank_correlation([1, 2], [1, 2], method="spearmn"),
            ee.InputError,
            "Did you mean 'spearman'",
        ),
        (lambda: cf.error_reject_curve([], []), ee.InputError, "scores is empty"),
        (
            lambda: cf.error_reject_curve(np.array([1, "a"], dtype=object), [1, 2]),
            ee.InputTypeError,
            "object array",
        ),
        (lambda: cf.error_reject_curve([[1, 0]], [[1, 2]]), ee.InputError, "must be 1-D"),
        (lambda: cf.error_reject_curve([np.nan], [1.0]), ee.InputError, "no finite value"),
    ],
)
def test_confidence_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (cf.hpd_interval, "samples"),
        (lambda v: cf.gaussian_credible_radius(v, 3), "sigma"),
        (lambda v: cf.vmf_credible_cap(v, 3), "kappa"),
    ],
)
def test_credible_inputs_name_an_integer_beyond_64_bits(call, name):
    # numpy keeps 2**70 as a Python object: the message names the value, not just the dtype
    with pytest.raises(ee.InputTypeError, match=f"{name} holds the integer {2**70}, beyond 64"):
        call(np.array([2**70, 1], dtype=object))


def test_hpd_interval_prob_one_and_ties():
    lo, hi = cf.hpd_interval([3.0, 1.0, 2.0], 1.0)
    assert (float(lo), float(hi)) == (1.0, 3.0)
    # two windows of equal width 1: the leftmost wins
    lo, hi = cf.hpd_interval([0.0, 1.0, 2.0], 0.5)
    assert (float(lo), float(hi)) == (0.0, 1.0)


def test_hpd_interval_holds_floor_p_n_plus_one_draws_exactly():
    # 100 distinct equally spaced draws: every window of m draws has the same width, so the
    # leftmost wins and the interval is [0, m - 1]; m = floor(57/100 * 100) + 1 = 58
    lo, hi = cf.hpd_interval(np.arange(100.0), prob=0.57)
    assert (float(lo), float(hi)) == (0.0, 57.0)
    for text in ("0.29", "0.58", "0.57", "0.95", "0.1", "0.333", "0.7", "0.001", "1"):
        p = Fraction(text)
        for n in (1, 3, 7, 10, 100, 1000, 2999):
            m = min(n, math.floor(p * n) + 1)  # exact rational arithmetic
            lo, hi = cf.hpd_interval(np.arange(float(n)), prob=float(text))
            assert float(hi) - float(lo) + 1 == m, (text, n)


def test_gaussian_radius_at_prob_one_is_inf_for_every_sigma_without_a_warning():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = cf.gaussian_credible_radius([0.0, 1.0, 2.5], 3, 1.0)
        one = cf.gaussian_credible_radius(0.0, 3, 1.0)
    assert got.tolist() == [math.inf] * 3 and float(one) == math.inf
    assert np.shape(one) == () and got.shape == (3,)
    # below 1 the radius of sigma = 0 stays 0
    assert cf.gaussian_credible_radius([0.0], 3, 0.99).tolist() == [0.0]


def test_reject_both_with_query_groups_and_tied_confidences_matches_brute_force():
    rng = np.random.default_rng(9)
    x = rng.integers(-3, 4, (30, 2)).astype(np.float32)
    y = rng.integers(0, 3, 30)
    g = rng.integers(0, 4, 30)
    conf = rng.integers(0, 4, 30).astype(float)  # ties: broken by position (earlier kept)
    fractions = [0.0, 0.1, 0.35]
    res = ee.evaluate(
        x,
        y,
        metrics=["precision_at_1", "map_at_r"],
        confidences=conf,
        query_groups=g,
        reject_from="both",
        rejection_fractions=fractions,
    )
    for f in fractions:
        n_keep = 30 - math.ceil(f * 30)
        order = sorted(range(30), key=lambda i: (-conf[i], i))
        keep = np.sort(order[:n_keep])
        summary, _ = oracle.summary(
            x[keep], y[keep], metrics=["precision_at_1", "map_at_r"], qg=g[keep]
        )
        for m in ("precision_at_1", "map_at_r"):
            assert res[f"both_{m}@{f:.2f}"] == pytest.approx(summary[m]), (m, f)


@pytest.mark.parametrize(
    ("fractions", "match"),
    [
        ([1.0], "rejection_fractions must be < 1"),
        ([0.1, -0.2], "rejection_fractions must be in"),
        ([], "rejection_fractions is empty"),
    ],
)
def test_rejection_fractions_are_checked_before_any_work(fractions, match):
    x = np.eye(4, dtype=np.float32)
    with pytest.raises(ee.InputError, match=match):
        ee.evaluate(
            x,
            [0, 0, 1, 1],
            confidences=[1, 2, 3, 4],
            reject_from="both",
            rejection_fractions=fractions,
        )


def test_credible_coverage_large_class_in_row_blocks_matches_cdist():
    from scipy.spatial.distance import cdist
    from scipy.stats import chi2

    rng = np.random.default_rng(12)
    n, dim = 1500, 3  # one class of 1500 > the 559-row block used for 5 levels
    x = rng.standard_normal((n, dim))
    sigma = rng.uniform(0.3, 1.5, n)
    levels = [0.5, 0.8, 0.9, 0.95, 0.99]
    cov = cf.credible_coverage(x, np.zeros(n, int), sigma, levels=levels)
    d = cdist(x, x)
    np.fill_diagonal(d, np.inf)
    want = [
        np.mean((d <= (sigma * np.sqrt(chi2.ppf(p, dim)))[:, None]).sum(1) / (n - 1))
        for p in levels
    ]
    np.testing.assert_allclose(cov.empirical, want, rtol=1e-12)


def test_coverage_curve_plot_draws_the_curve_and_the_diagonal():
    pytest.importorskip("matplotlib")
    cov = cf.CoverageCurve(np.array([0.5, 0.9]), np.array([0.3, 0.7]), 12)
    fig = cov.plot(label="sigma head")
    lines = fig.axes[0].get_lines()
    assert lines[0].get_xydata().tolist() == [[0, 0], [1, 1]]
    assert lines[1].get_xydata().tolist() == [[0.5, 0.3], [0.9, 0.7]]
    with pytest.raises(ee.InputTypeError, match="CoverageCurve"):
        ee.plots.plot_coverage(object())


def test_random_auerc_is_the_mean_auerc_over_every_confidence_order():
    # the random baseline must be what a random ranking gives on average: enumerate all 5!
    # orders of distinct confidences with a plain loop, and average their AUERCs
    scores = np.array([1.0, 0.25, 0.0, 2 / 3, 1.0])
    e = 1 - scores
    aucs = []
    for perm in itertools.permutations(range(5)):
        kept = e[list(perm)]
        aucs.append(np.mean([kept[:k].mean() for k in range(1, 6)]))
    erc = cf.error_reject_curve(scores, [5, 4, 3, 2, 1])
    assert erc.random_auerc == pytest.approx(np.mean(aucs))
    assert erc.oracle_auerc == pytest.approx(min(aucs))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"reject_from": "bot"}, "reject_from='bot' is not valid.*Did you mean 'both'"),
        ({"confidences": [1.0, 2.0]}, "confidences has 2 values but 4"),
        ({"confidences": [[1.0], [2.0], [3.0], [4.0]]}, "confidences must be 1-D"),
        ({"confidences": [1.0, np.nan, 3.0, 4.0]}, r"confidences has 1 NaN.*first at index 1"),
        (
            {"confidences": [1.0, 2.0, 3.0, 4.0], "reject_from": "both", "reference": np.eye(4)},
            "leave-one-out",
        ),
    ],
)
def test_evaluate_confidence_arguments_bad_input(kwargs, match):
    kwargs = {"reference_labels": [0, 0, 1, 1], **kwargs} if "reference" in kwargs else kwargs
    with pytest.raises(ee.InputError, match=match):
        ee.evaluate(np.eye(4, dtype=np.float32), [0, 0, 1, 1], **kwargs)


def test_rank_correlation_nan_policy_suggestion():
    with pytest.raises(ee.InputError, match="Did you mean 'omit'"):
        cf.rank_correlation([1, 2, 3], [1, 2, 3], nan_policy="omitt")


@pytest.mark.parametrize(
    "call",
    [
        lambda: cf.error_reject_curve([1, 0], [1, 2], higher_is_confident="False"),
        lambda: cf.confidence_auroc([1, 0], [1, 2], higher_is_confident=0),
        lambda: cf.rank_correlation([1, 2], [1, 2], higher_is_uncertain="yes"),
        lambda: ee.evaluate(
            np.eye(4), [0, 0, 1, 1], confidences=[1, 2, 3, 4], higher_is_confident="no"
        ),
    ],
)
def test_sign_switches_must_be_booleans(call):
    # a truthy string would silently flip the sign convention
    with pytest.raises(ee.InputError, match="must be True or False"):
        call()


# AURC, E-AURC, AUGRC, selective risk and coverage at risk against brute-force oracles.


def _risks_over_orders(scores, conf):
    """(E_k, G_k) for k = 1..n, averaged over every order of the tied confidences."""
    scores, conf = np.asarray(scores, float), np.asarray(conf, float)
    n = len(scores)
    sel, gen = [], []
    for perm in itertools.permutations(range(n)):
        order = sorted(perm, key=lambda i: -conf[i])  # stable: ties keep the permutation order
        errs = 1 - scores[order]
        sel.append([sum(errs[:k]) / k for k in range(1, n + 1)])
        gen.append([sum(errs[:k]) / n for k in range(1, n + 1)])
    return np.mean(sel, axis=0), np.mean(gen, axis=0)


def _mean_rule(v):
    total = 0.0
    for x in v:  # one term per coverage level k/n
        total += x
    return total / len(v)


def _trapezoid_rule(v):
    n = len(v)
    points = [0.0, *v]  # the curve starts at (coverage 0, value 0)
    return sum((points[k] + points[k + 1]) / 2 * (1 / n) for k in range(n))


def test_four_queries_by_hand():
    # confidences 0.9, 0.8, 0.2, 0.1 -> errors (most confident first) 0, 0, 1, 1
    erc = cf.error_reject_curve([1, 1, 0, 0], [0.9, 0.8, 0.2, 0.1])
    # E_k = 0/1, 0/2, 1/3, 2/4; mean rule: (0 + 0 + 1/3 + 1/2) / 4 = 5/24
    assert erc.aurc == pytest.approx(5 / 24)
    # the order is the oracle order, so E-AURC = 0
    assert erc.eaurc == pytest.approx(0.0)
    # G_k = 0/4, 0/4, 1/4, 2/4: (0 + 0 + 1/4 + 2/4) / 4 = 3/16
    assert erc.augrc == pytest.approx(3 / 16)
    worst = cf.error_reject_curve([1, 1, 0, 0], [0.1, 0.2, 0.8, 0.9])
    # E_k = 1/1, 2/2, 2/3, 2/4 -> AURC = (1 + 1 + 2/3 + 1/2) / 4 = 19/24; E-AURC = 19/24 - 5/24
    assert worst.aurc == pytest.approx(19 / 24)
    assert worst.eaurc == pytest.approx(14 / 24)
    # G_k = 1/4, 2/4, 2/4, 2/4 -> AUGRC = (1/4 + 1/2 + 1/2 + 1/2) / 4 = 7/16
    assert worst.augrc == pytest.approx(7 / 16)
    # trapezoid: (1/4) [1 + 1 + 2/3 + (1/2)/2] = 35/48
    t = cf.error_reject_curve([1, 1, 0, 0], [0.1, 0.2, 0.8, 0.9], integration="trapezoid")
    assert t.aurc == pytest.approx(35 / 48)
    # oracle trapezoid: (1/4) [0 + 0 + 1/3 + (1/2)/2] = 7/48
    assert t.eaurc == pytest.approx(35 / 48 - 7 / 48)
    # AUGRC trapezoid: (1/4) [1/4 + 1/2 + 1/2 + (1/2)/2] = 3/8
    assert t.augrc == pytest.approx(3 / 8)


def test_four_queries_with_a_tied_block_by_hand():
    # errors 1, 0, 0 tied at confidence 0.5 after a correct query at 0.9
    erc = cf.error_reject_curve([1, 0, 1, 1], [0.9, 0.5, 0.5, 0.5])
    # k=1: 0; k=2: one of the block kept, expected error 1/3 -> E_2 = (1/3)/2 = 1/6
    # k=3: two kept, expected error 2/3 -> E_3 = (2/3)/3 = 2/9; k=4: E_4 = 1/4
    assert erc.error[::-1].tolist() == pytest.approx([0, 1 / 6, 2 / 9, 1 / 4])
    assert erc.aurc == pytest.approx((0 + 1 / 6 + 2 / 9 + 1 / 4) / 4)
    # G_k = 0, (1/3)/4, (2/3)/4, 1/4
    assert erc.augrc == pytest.approx((0 + 1 / 12 + 1 / 6 + 1 / 4) / 4)


def test_trapezoid_reproduces_the_probabilistic_embeddings_aurcc():
    # The verification test case of the probabilistic-embeddings library: correctness
    # T T T F T T F T T T with confidences below.  Most confident first the errors are
    # 0 (1.0), 1 (0.9), seven 0s (0.5), 1 (0.1), so E_k = 0, 1/2, 1/3, ..., 1/9, 2/10.
    correct = [1, 1, 1, 0, 1, 1, 0, 1, 1, 1]
    conf = [0.5, 0.5, 0.5, 0.1, 0.5, 0.5, 0.9, 0.5, 0.5, 1.0]
    t = cf.error_reject_curve(correct, conf, integration="trapezoid")
    expected = 0.1 * (sum(1 / j for j in range(2, 10)) + 2 / 10 / 2)
    assert t.aurc == pytest.approx(expected)
    assert round(t.aurc, 5) == 0.19290
    m = cf.error_reject_curve(correct, conf, integration="mean")
    assert round(m.aurc, 5) == 0.20290  # trapezoid + E_10 / (2 n) = 0.19290 + 0.2 / 20
    assert m.aurc == pytest.approx(m.auerc)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("integration", ["mean", "trapezoid"])
def test_against_enumeration_of_tied_orders(seed, integration):
    rng = np.random.default_rng(seed)
    n = 6
    scores = rng.choice([0.0, 0.25, 1.0], size=n)
    conf = rng.integers(0, 3, size=n).astype(float)  # many ties
    sel, gen = _risks_over_orders(scores, conf)
    rule = _mean_rule if integration == "mean" else _trapezoid_rule
    erc = cf.error_reject_curve(scores, conf, integration=integration)
    assert erc.aurc == pytest.approx(rule(sel))
    assert erc.augrc == pytest.approx(rule(gen))
    oracle_errs = np.sort(1 - scores)
    oracle_sel = [oracle_errs[:k].sum() / k for k in range(1, n + 1)]
    oracle_gen = [oracle_errs[:k].sum() / n for k in range(1, n + 1)]
    assert erc.eaurc == pytest.approx(rule(sel) - rule(oracle_sel))
    assert erc.oracle_augrc == pytest.approx(rule(oracle_gen))


def test_invariances():
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 2, 200).astype(float)
    conf = rng.normal(size=200).round(1)  # ties
    base = cf.error_reject_curve(scores, conf)
    for transformed in (np.exp(conf), 3 * conf + 7, np.arctan(conf)):
        other = cf.error_reject_curve(scores, transformed)
        assert other.aurc == pytest.approx(base.aurc)
        assert other.augrc == pytest.approx(base.augrc)
        assert other.eaurc == pytest.approx(base.eaurc)
    perm = rng.permutation(200)
    shuffled = cf.error_reject_curve(scores[perm], conf[perm])
    assert shuffled.aurc == pytest.approx(base.aurc)
    assert shuffled.augrc == pytest.approx(base.augrc)
    sigma = cf.error_reject_curve(scores, -conf * 2, higher_is_confident=False)
    assert sigma.aurc == pytest.approx(base.aurc)


def test_random_baselines():
    # A single tied block is a random order: E_k = mean error for every k.
    scores = np.array([1, 0, 0, 1, 1, 0, 1, 1], float)
    e = 1 - scores.mean()  # 3/8
    erc = cf.error_reject_curve(scores, np.zeros(8))
    assert erc.aurc == pytest.approx(e)
    n = 8
    assert erc.augrc == pytest.approx(e * (n + 1) / (2 * n))
    t = cf.error_reject_curve(scores, np.zeros(8), integration="trapezoid")
    assert t.augrc == pytest.approx(e / 2)


def test_selective_risk_and_coverage_at_risk_by_loops():
    rng = np.random.default_rng(5)
    scores = rng.integers(0, 2, 40).astype(float)
    conf = rng.permutation(40).astype(float)  # no ties: plain sort is the oracle
    order = np.argsort(-conf)
    errs = 1 - scores[order]
    erc = cf.error_reject_curve(scores, conf)
    for k in range(1, 41):
        assert erc.selective_risk(k / 40) == pytest.approx(errs[:k].mean())
    assert erc.selective_risk(0.001) == pytest.approx(errs[0])  # ⌈0.04⌉ = 1 query kept
    for r in (0.0, 0.1, 0.3, 0.5, 1.0):
        best = 0.0
        for k in range(1, 41):
            if errs[:k].mean() <= r + 1e-12:
                best = max(best, k / 40)
        assert erc.coverage_at_risk(r) == best


def test_bad_arguments_name_themselves():
    erc = cf.error_reject_curve([1, 0], [0.5, 0.2])
    with pytest.raises(InputError, match="coverage"):
        erc.selective_risk(0)
    with pytest.raises(InputError, match="risk"):
        erc.coverage_at_risk(1.5)
    with pytest.raises(InputError, match="integration"):
        cf.error_reject_curve([1, 0], [0.5, 0.2], integration="simpson")
    assert math.isfinite(erc.aurc)


@pytest.mark.parametrize("seed", range(5))
def test_trapezoid_augrc_equals_the_curve_through_one_point_per_threshold(seed):
    # Independent construction: one risk-coverage point per distinct confidence (a threshold
    # keeps every query at or above it, so ties are never split), joined by straight lines
    # from (0, 0).  G is linear inside a tied block, so this is the block expectation.
    rng = np.random.default_rng(seed)
    n = 50
    scores = rng.choice([0.0, 0.5, 1.0], size=n)
    conf = rng.integers(0, 8, size=n).astype(float)
    cov, risk = [0.0], [0.0]
    for t in sorted(set(conf.tolist()), reverse=True):
        kept = conf >= t
        cov.append(kept.sum() / n)
        risk.append((1 - scores[kept]).sum() / n)
    area = sum((cov[i + 1] - cov[i]) * (risk[i] + risk[i + 1]) / 2 for i in range(len(cov) - 1))
    erc = cf.error_reject_curve(scores, conf, integration="trapezoid")
    assert erc.augrc == pytest.approx(area)


# sigma_regression against scikit-learn and a hand-computed case.


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


# Confidence metrics through evaluate, its bootstrap intervals, JSON, compare and the CLI.


ROOT = Path(__file__).resolve().parents[1]


def _ece_loop(correct, conf, bins=10):
    total = 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        members = [i for i in range(len(conf)) if lo < conf[i] <= hi or (b == 0 and conf[i] == 0)]
        if members:
            acc = sum(correct[i] for i in members) / len(members)
            mc = sum(conf[i] for i in members) / len(members)
            total += len(members) / len(conf) * abs(acc - mc)
    return total


def _aurc_loop(correct, conf):
    """Mean over k of the error of the k most confident (no ties in these tests)."""
    order = sorted(range(len(conf)), key=lambda i: -conf[i])
    return sum(sum(1 - correct[i] for i in order[:k]) / k for k in range(1, len(conf) + 1)) / len(
        conf
    )


def test_evaluate_reports_the_new_metrics_on_a_hand_case():
    # 1-D points: 0 and 0.1 (class a), 1 and 3 (class b), 1.05 (class a)
    x = [[0.0], [0.1], [1.0], [3.0], [1.05]]
    y = ["a", "a", "b", "b", "a"]
    conf = [0.9, 0.8, 0.3, 0.6, 0.2]
    res = ee.evaluate(x, y, confidences=conf, metrics=["precision_at_1"])
    # nearest neighbours: 0->0.1 (a, right), 0.1->0 (right), 1->1.05 (a, wrong for b),
    # 3->1.05 (a, wrong), 1.05->1 (b, wrong): correct = 1, 1, 0, 0, 0
    correct = [1, 1, 0, 0, 0]
    assert res.per_query["precision_at_1"].tolist() == correct
    # most confident first: .9 (e0) .8 (e0) .6 (e1) .3 (e1) .2 (e1):
    # AURC = (0 + 0 + 1/3 + 2/4 + 3/5) / 5
    assert res.confidence["aurc_precision_at_1"] == pytest.approx((1 / 3 + 1 / 2 + 3 / 5) / 5)
    # AUGRC = (0 + 0 + 1/5 + 2/5 + 3/5) / 5
    assert res.confidence["augrc_precision_at_1"] == pytest.approx(6 / 25)
    # E-AURC: the order is already the oracle's, 0
    assert res.confidence["eaurc_precision_at_1"] == pytest.approx(0.0)
    # bins of 0.1: .9 -> (.8, .9] gap |1 - .9|; .8 -> (.7, .8] |1 - .8|; .6 |0 - .6|;
    # .3 |0 - .3|; .2 |0 - .2| -> ECE = (.1 + .2 + .6 + .3 + .2) / 5
    assert res.confidence["ece"] == pytest.approx(1.4 / 5)
    # Brier = (.01 + .04 + .36 + .09 + .04) / 5
    assert res.confidence["brier"] == pytest.approx(0.54 / 5)
    # class a: .9 .8 right, .2 wrong -> (.1 + .2 + .2)/3; class b: (.3 + .6)/2
    assert res.confidence["classwise_ece"] == pytest.approx((0.5 / 3 + 0.9 / 2) / 2)


def test_sigma_confidences_skip_calibration_but_keep_ranking_metrics():
    x = [[0.0], [0.1], [1.0], [3.0], [1.05]]
    y = [0, 0, 1, 1, 0]
    res = ee.evaluate(
        x,
        y,
        confidences=[2.0, 3.0, 8.0, 5.0, 9.0],
        higher_is_confident=False,
        metrics=["precision_at_1"],
    )
    assert "ece" not in res.confidence  # a sigma is no probability of being right
    assert res.confidence["aurc_precision_at_1"] == pytest.approx((1 / 3 + 1 / 2 + 3 / 5) / 5)


def test_open_set_keys_read_lone_queries_as_out_of_gallery():
    from sklearn.metrics import roc_auc_score

    x = [[0.0], [0.1], [1.0], [1.1], [5.0], [6.0]]
    y = [0, 0, 1, 1, 2, 3]  # classes 2 and 3 have no other member: lone = out of gallery
    conf = [0.9, 0.6, 0.8, 0.3, 0.5, 0.1]
    res = ee.evaluate(x, y, confidences=conf, metrics=["precision_at_1"])
    enrolled = [1, 1, 1, 1, 0, 0]
    assert res.confidence["open_set_auroc"] == pytest.approx(roc_auc_score(enrolled, conf))
    # enrolled .9 .8 .6 .3: TPR >= .95 only at t = .3, which accepts out .5 -> FPR 1/2
    assert res.confidence["open_set_fpr_at_95tpr"] == pytest.approx(0.5)


def test_ci_of_aurc_and_ece_by_loop_with_the_same_draws():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 3))
    y = rng.integers(0, 6, 60)
    conf = rng.permutation(60) / 60 + 0.005  # distinct, in (0, 1)
    res = ee.evaluate(x, y, confidences=conf, metrics=["precision_at_1"], ci=0.8, n_boot=40)
    correct = res.per_query["precision_at_1"]
    draws = np.random.default_rng(0)
    aurcs, eces = [], []
    for _ in range(40):
        idx = draws.integers(0, 60, size=60)
        c, s = conf[idx], correct[idx]
        # duplicated queries are tied blocks; a tie of equal errors changes nothing, and a
        # duplicate has the same error, so a plain stable sort gives the expectation here
        aurcs.append(_aurc_loop(list(s), list(c)))
        eces.append(_ece_loop(list(s), list(c)))
    assert res.ci["aurc_precision_at_1"] == pytest.approx(tuple(np.quantile(aurcs, [0.1, 0.9])))
    assert res.ci["ece"] == pytest.approx(tuple(np.quantile(eces, [0.1, 0.9])))


def _two_checkpoints():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(80, 4))
    y = rng.integers(0, 8, 80)
    good = rng.permutation(80) / 80 + 0.005
    a = ee.evaluate(x, y, confidences=good, metrics=["precision_at_1"])
    b = ee.evaluate(x, y, confidences=good * 0.5, metrics=["precision_at_1"])
    return a, b, good


def test_compare_confidence_metric_paired_interval_by_loop():
    a, b, conf = _two_checkpoints()
    cmp = ee.compare({"a": a, "b": b}, metrics=["ece"], ci=0.8, n_boot=50, seed=2)
    rows = {r["checkpoint"]: r for r in cmp.rows}
    assert rows["a"]["value"] == pytest.approx(a.confidence["ece"])
    assert rows["b"]["diff"] == pytest.approx(b.confidence["ece"] - a.confidence["ece"])
    s = a.per_query["precision_at_1"]
    draws = np.random.default_rng(2)
    diffs = []
    for _ in range(50):
        idx = draws.integers(0, 80, size=80)
        diffs.append(
            _ece_loop(list(s[idx]), list(conf[idx] * 0.5))
            - _ece_loop(list(s[idx]), list(conf[idx]))
        )
    lo, hi = np.quantile(diffs, [0.1, 0.9])
    assert (rows["b"]["diff_ci_low"], rows["b"]["diff_ci_high"]) == pytest.approx((lo, hi))
    perm = ee.compare({"a": a, "b": b}, metrics=["ece"], n_boot=50, test="permutation")
    assert 0 < perm.rows[1]["p_value"] <= 1


def test_compare_from_json_and_missing_confidences():
    a, b, _ = _two_checkpoints()
    a2 = ee.EvaluationResult.from_dict(json.loads(a.to_json()))
    assert a2.query_confidences == pytest.approx(a.query_confidences)
    cmp = ee.compare([a2, b], metrics=["precision_at_1", "augrc_precision_at_1"], n_boot=20)
    assert cmp.metrics == ["precision_at_1", "augrc_precision_at_1"]
    bare = ee.EvaluationResult.from_dict(
        {k: v for k, v in a.to_dict().items() if k != "query_confidences"}
    )
    with pytest.raises(ee.InputError, match="confidences"):
        ee.compare([bare, b], metrics=["augrc_precision_at_1"], n_boot=20)


def _compare_cli(tmp_path, *options):
    """`embedeval compare a.npz b.npz OPTIONS` in a subprocess, with this checkout importable."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "embedeval",
            "compare",
            tmp_path / "a.npz",
            tmp_path / "b.npz",
            *options,
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=300,
    )


def test_cli_compare_with_confidence_metrics(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(40, 3))
    y = rng.integers(0, 5, 40)
    np.savez(tmp_path / "a.npz", embeddings=x, labels=y, confidences=rng.uniform(0, 1, 40))
    np.savez(tmp_path / "b.npz", embeddings=x, labels=y, confidences=rng.uniform(0, 1, 40))
    proc = _compare_cli(
        tmp_path,
        "--metrics",
        "precision_at_1",
        "--confidence-metrics",
        "aurc_precision_at_1,ece",
        "--n-boot",
        "20",
        "--json",
        tmp_path / "c.json",
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["metrics"] == ["precision_at_1", "aurc_precision_at_1", "ece"]
    bad = _compare_cli(tmp_path, "--confidence-metrics", "aurcc")
    assert bad.returncode == 2 and "aurcc" in bad.stderr


def test_compare_confidence_metrics_across_runs_with_different_metric_sets():
    a, _, conf = _two_checkpoints()
    rng = np.random.default_rng(4)
    x = rng.normal(size=(80, 4))
    y = a.query_labels
    c = ee.evaluate(x, y, confidences=conf, metrics=["precision_at_1", "map_at_r"])
    keys = ["aurc_precision_at_1", "r_auroc", "brier"]
    cmp = ee.compare({"a": a, "c": c}, metrics=keys, n_boot=30, test="permutation")
    assert [r["metric"] for r in cmp.rows] == [k for k in keys for _ in range(2)]
    # identical runs: every swap leaves the difference at 0, so p = (30 + 1) / (30 + 1)
    same = ee.compare({"a": a, "a2": a}, metrics=["ece"], n_boot=30, test="permutation")
    assert same.rows[1]["p_value"] == 1.0 and same.rows[1]["diff"] == 0.0


def test_every_confidence_name_is_importable_from_the_confidence_module():
    # the split modules are re-exported: the names users and the docs call stay where they were
    import embedeval.metrics.confidence as conf

    names = [
        "CalibrationCurve", "CoverageCurve", "ErrorRejectCurve", "RankCorrelation",
        "SigmaRegression", "best_threshold_accuracy", "confidence_auroc", "confidence_ci",
        "confidence_metric_names", "confidence_recall_curve", "confidence_summary",
        "credible_coverage",
        "error_reject_curve", "expected_calibration_error", "gaussian_credible_radius",
        "hpd_interval", "maximum_calibration_error", "rank_correlation", "sigma_regression",
        "vmf_credible_cap",
    ]  # fmt: skip
    assert sorted(conf.__all__) == sorted(names)
    assert all(callable(getattr(conf, name)) for name in names)


@pytest.mark.parametrize("hit_metric", ["precision_at_1", "recall_at_1"])
def test_confidence_metric_names_hold_every_name_the_summary_can_give(hit_metric):
    from embedeval.metrics.confidence import confidence_metric_names

    # probabilities, a label per query and lone queries (NaN): every optional part is there
    rng = np.random.default_rng(0)
    hits = rng.integers(0, 2, 40).astype(float)
    hits[:5] = np.nan
    per_query = {hit_metric: hits, "map_at_r": rng.random(40)}
    out = cf.confidence_summary(per_query, rng.random(40), labels=rng.integers(0, 3, 40))
    assert {"classwise_ece", "open_set_auroc", "aurc_map_at_r"} <= set(out)
    assert set(out) <= set(confidence_metric_names(list(per_query)))


@pytest.mark.parametrize(
    ("per_query", "exc", "match"),
    [
        (
            {"precision_at_1": ["1", "0", "1", "1"]},
            ee.InputTypeError,
            r"per_query\['precision_at_1'\] must be numeric",
        ),
        (
            {"precision_at_1": [1.0, 0.0, None, 1.0]},
            ee.InputTypeError,
            r"per_query\['precision_at_1'\] is an object array",
        ),
        (
            {"map_at_r": [1.0, 0.5, 1.0]},
            ee.InputError,
            r"per_query\['map_at_r'\] has 3 values but 4 are needed \(the length of confidence",
        ),
        ([1.0, 0.0, 1.0, 1.0], ee.InputTypeError, "per_query must be a dict"),
    ],
)
def test_confidence_summary_names_a_bad_per_query_column(per_query, exc, match):
    with pytest.raises(exc, match=match):
        cf.confidence_summary(per_query, [0.9, 0.2, 0.6, 0.8])


def test_confidence_summary_all_nan_metric_is_an_error_like_the_curve():
    nan4 = [math.nan] * 4
    with pytest.raises(ee.InputError, match="no finite value"):
        cf.error_reject_curve(nan4, [0.9, 0.2, 0.6, 0.8])
    with pytest.raises(ee.InputError, match=r"per_query\['precision_at_1'\] has no finite value"):
        cf.confidence_summary({"precision_at_1": nan4}, [0.9, 0.2, 0.6, 0.8])
    # with skip_empty the empty metric is left out and the others are kept: the AUERC of
    # map_at_r by hand, errors 0, 1, 0.5, 0 sorted by confidence -> E_k = 0, 0, 1/6, 3/8
    per_query = {"precision_at_1": nan4, "map_at_r": [1.0, 0.0, 0.5, 1.0]}
    out = cf.confidence_summary(per_query, [0.9, 0.2, 0.6, 0.8], skip_empty=True)
    areas = ["auerc", "oracle_auerc", "random_auerc", "excess_auerc", "aurc", "eaurc", "augrc"]
    assert sorted(out) == sorted(f"{a}_map_at_r" for a in areas)
    assert out["auerc_map_at_r"] == pytest.approx((0 + 0 + 1 / 6 + 3 / 8) / 4)


def test_evaluate_with_every_query_lone_still_returns_without_confidence_metrics():
    x = np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32)
    with pytest.warns(ee.EmbedevalWarning, match="lone"):
        res = ee.evaluate(x, np.arange(6), confidences=np.arange(6.0))
    assert res.confidence == {}


def test_integer_confidences_float64_cannot_separate_are_an_error():
    # 2**53 + 1 and 2**53 are one float64: compared as floats they would silently tie.
    from sklearn.metrics import roc_auc_score

    c = np.array([2**53 + 1, 2**53, 7], dtype=np.int64)
    for call in (cf.error_reject_curve, cf.confidence_auroc, cf.best_threshold_accuracy):
        with pytest.raises(InputError, match="confidence holds the distinct integers"):
            call([1, 0, 1], c)
    assert cf.confidence_auroc([1, 0, 1], c - 7) == pytest.approx(roc_auc_score([1, 0, 1], c - 7))


def test_confidence_as_a_torch_tensor_with_grad_or_in_bfloat16_is_read_as_its_values():
    # A model's kappa usually still requires grad; these values are exact in bfloat16.
    torch = pytest.importorskip("torch")
    correct = [1.0, 0.0, 1.0, 0.0, 1.0]
    values = [0.75, 0.25, 0.5, 0.5, 0.875]
    # (right, wrong) pairs ordered right: 0.875 and 0.75 beat both, 0.5 beats 0.25 and ties
    # 0.5: (2 + 2 + 1.5) / 6.  Kept errors, most confident first: 0, 0, the tied block's mean
    # 1/2 twice, 1, so E_5..E_1 = 2/5, 1/4, 1/6, 0, 0.  Brier: (1/16 + 1/16 + 1/4 + 1/4 + 1/64)/5.
    for conf in (
        torch.tensor(values, requires_grad=True),
        torch.tensor(values, dtype=torch.bfloat16),
    ):
        assert cf.confidence_auroc(correct, conf) == pytest.approx(11 / 12)
        erc = cf.error_reject_curve(correct, conf)
        assert erc.error.tolist() == pytest.approx([2 / 5, 1 / 4, 1 / 6, 0.0, 0.0])
        out = cf.confidence_summary({"precision_at_1": correct}, conf)
        assert out["r_auroc"] == pytest.approx(11 / 12)
        assert out["brier"] == pytest.approx((1 / 16 + 1 / 16 + 1 / 4 + 1 / 4 + 1 / 64) / 5)


def test_rank_correlation_refuses_integers_float64_would_tie():
    # 2**53 and 2**53 + 1 are one float64: ranked as floats they would tie and Spearman's rho
    # of a perfectly ordered prediction would drop to sqrt(3)/2.
    from scipy import stats

    big = np.array([2**53, 2**53 + 1, 2**53 + 2], dtype=np.int64)
    for predicted, truth, name in ((big, [1, 2, 3], "predicted"), ([1, 2, 3], big, "truth")):
        with pytest.raises(InputError, match=f"{name} holds the distinct integers"):
            cf.rank_correlation(predicted, truth)
    shifted = big - 2**53  # the same order, exact in float64
    res = cf.rank_correlation(shifted, [1, 2, 3], method="kendall")
    assert res.statistic == pytest.approx(stats.kendalltau([0, 1, 2], [1, 2, 3]).statistic)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"confidences": np.array([0.9, 0.2, 0.8])}, "has 4 values but 3 are needed"),
        ({"confidences": np.array([0.9, np.nan, 0.8, 0.7])}, "confidences has 1 NaN.*index 1"),
        ({"confidences": np.array(["a", "b", "c", "d"])}, "confidences must be numeric"),
        ({"per_query": {"precision_at_1": [1.0, 2.0, 0.0, 1.0]}}, "first at index 1"),
        ({"labels": ["a", "b"]}, "labels has 2 labels"),
        ({"ci": 2.0}, "ci must be a confidence level"),
        ({"n_boot": 0}, "n_boot must be >= 1"),
        ({"seed": -1}, "seed must be >= 0"),
    ],
)
def test_confidence_ci_checks_its_inputs_before_resampling(change, match):
    # Inside a resample a bad value sits at a shuffled position and a length mismatch fails in
    # numpy's indexing; every input is checked on the whole data first.
    args = {
        "per_query": {"precision_at_1": [1.0, 0.0, 1.0, 1.0]},
        "confidences": np.array([0.9, 0.2, 0.8, 0.7]),
        "ci": 0.9,
        "n_boot": 5,
        "seed": 0,
    }
    args.update(change)
    with pytest.raises((InputError, TypeError), match=match):
        cf.confidence_ci(args.pop("per_query"), args.pop("confidences"), **args)


def test_reject_from_both_gives_distinct_fractions_distinct_keys():
    # With two decimals 0.1 and 0.104 were both '@0.10': of 10 items they reject 1 and 2, and
    # the second value overwrote the first.
    rng = np.random.default_rng(7)
    x = rng.integers(-3, 4, (10, 2)).astype(np.float32)
    y = rng.integers(0, 2, 10)
    conf = rng.permutation(10).astype(float)
    res = ee.evaluate(
        x,
        y,
        metrics=["map_at_r"],
        confidences=conf,
        reject_from="both",
        rejection_fractions=[0.1, 0.104, 0.125, 0.3],
    )
    keys = {k for k in res.confidence if k.startswith("both_")}
    expected = {"0.10": 1, "0.104": 2, "0.125": 2, "0.30": 3}  # label -> ceil(f * 10) rejected
    assert keys == {f"both_map_at_r@{label}" for label in expected}
    for label, rejected in expected.items():
        keep = np.sort(np.argsort(-conf)[: 10 - rejected])
        summary, _ = oracle.summary(x[keep], y[keep], metrics=["map_at_r"])
        assert res.confidence[f"both_map_at_r@{label}"] == pytest.approx(summary["map_at_r"])


def test_credible_regions_read_torch_tensors_with_grad():
    torch = pytest.importorskip("torch")
    from scipy.stats import chi2

    draws = torch.tensor([0.0, 1.0, 1.5, 2.0, 9.0], requires_grad=True)
    lo, hi = cf.hpd_interval(draws, prob=0.5)  # 3 draws: windows 1.5, 1 (best), 7.5 wide
    assert (float(lo), float(hi)) == (1.0, 2.0)
    sigma = torch.tensor([0.5, 2.0], requires_grad=True)
    radius = cf.gaussian_credible_radius(sigma, 2, 0.9)
    assert radius.tolist() == pytest.approx(np.array([0.5, 2.0]) * chi2.ppf(0.9, 2) ** 0.5)
    # dim 3: t = 1 + log(1 - p (1 - exp(-2 kappa))) / kappa
    cap = cf.vmf_credible_cap(torch.tensor([4.0], requires_grad=True), 3, 0.5)
    assert float(cap[0]) == pytest.approx(1 + math.log(1 - 0.5 * (1 - math.exp(-8))) / 4)


def test_credible_coverage_refuses_empty_levels():
    with pytest.raises(InputError, match="levels is empty"):
        cf.credible_coverage([[0.0], [1.0]], [0, 0], [1.0, 1.0], levels=[])
