"""embedeval.confidence against hand values, brute force, scikit-learn, scipy and Monte Carlo."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import embedeval as ee
from embedeval import confidence as cf
from tests.core_oracle import oracle


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
    _, pq = oracle(x, y, metrics=["precision_at_1", "map_at_r"])
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
        summary, _ = oracle(x[keep], y[keep], metrics=["precision_at_1"])
        assert res[f"both_precision_at_1@{f:.2f}"] == pytest.approx(summary["precision_at_1"])
    with pytest.raises(ee.InputError, match="needs confidences"):
        ee.evaluate(x, y, reject_from="both")
