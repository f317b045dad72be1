"""Calibration metrics and recalibration against loops, hand values and scikit-learn."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from embedeval.metrics import calibration as cb
from embedeval.metrics import confidence as cf
from embedeval.utils.errors import InputError


def _ece_loop(correct, conf, edges):
    """ECE with bins (a, b] (the first closed), written as a plain loop over queries."""
    total, n = 0.0, len(correct)
    for b in range(len(edges) - 1):
        lo, hi = edges[b], edges[b + 1]
        members = [
            i
            for i in range(n)
            if (lo < conf[i] <= hi) or (b == 0 and conf[i] == lo) or (b == 0 and conf[i] < lo)
        ]
        if not members:
            continue
        acc = sum(correct[i] for i in members) / len(members)
        mean_c = sum(conf[i] for i in members) / len(members)
        total += len(members) / n * abs(acc - mean_c)
    return total


def test_ece_four_queries_by_hand():
    # equal width, 2 bins: [0, .5] holds .2, .4 (1 right): |1/2 - .3| = .2
    # (.5, 1] holds .6, .9 (2 right): |1 - .75| = .25 -> ECE = (2/4) .2 + (2/4) .25 = .225
    assert cf.expected_calibration_error([0, 1, 1, 1], [0.2, 0.4, 0.6, 0.9], bins=2) == (
        pytest.approx(0.225)
    )
    # equal mass, 2 bins: median edge (0.4 + 0.6)/2 = 0.5 -> the same two bins here
    assert cf.expected_calibration_error(
        [0, 1, 1, 1], [0.2, 0.4, 0.6, 0.9], bins=2, strategy="quantile"
    ) == pytest.approx(0.225)
    # equal mass, 4 bins: one query each: (|0-.2| + |1-.4| + |1-.6| + |1-.9|) / 4 = 1.3 / 4
    assert cf.expected_calibration_error(
        [0, 1, 1, 1], [0.2, 0.4, 0.6, 0.9], bins=4, strategy="quantile"
    ) == pytest.approx(1.3 / 4)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("strategy", ["uniform", "quantile"])
def test_ece_against_loop(seed, strategy):
    rng = np.random.default_rng(seed)
    conf = rng.uniform(0, 1, 120).round(2)  # ties
    correct = (rng.uniform(0, 1, 120) < conf).astype(float)
    if strategy == "uniform":
        edges = np.linspace(0, 1, 11)
    else:
        edges = np.unique(np.quantile(conf, np.linspace(0, 1, 11)))
    got = cf.expected_calibration_error(correct, conf, bins=10, strategy=strategy)
    assert got == pytest.approx(_ece_loop(correct, conf, edges))


def test_ties_share_an_equal_mass_bin():
    # 6 of 8 queries tied at 0.5: they cannot be split, so fewer bins
    d = cb.reliability_diagram(
        [1, 0, 1, 0, 1, 1, 0, 1], [0.5] * 6 + [0.9, 0.95], bins=4, strategy="quantile"
    )
    assert d.count.sum() == 8
    assert max(d.count) >= 6


def test_classwise_ece_by_hand():
    # class a: queries (1, .8), (0, .8): one bin, |1/2 - .8| = .3
    # class b: queries (1, .3), (1, .3): |1 - .3| = .7 -> mean over classes (.3 + .7) / 2 = .5
    got = cb.classwise_calibration_error([1, 0, 1, 1], [0.8, 0.8, 0.3, 0.3], ["a", "a", "b", "b"])
    assert got == pytest.approx(0.5)
    # lone (NaN) queries are dropped before grouping
    got = cb.classwise_calibration_error(
        [1, 0, 1, 1, math.nan], [0.8, 0.8, 0.3, 0.3, 0.1], ["a", "a", "b", "b", "c"]
    )
    assert got == pytest.approx(0.5)


def test_brier_matches_sklearn():
    from sklearn.metrics import brier_score_loss

    rng = np.random.default_rng(1)
    conf = rng.uniform(0, 1, 200)
    correct = (rng.uniform(0, 1, 200) < conf).astype(int)
    assert cb.brier_score(correct, conf) == pytest.approx(brier_score_loss(correct, conf))


def test_reliability_diagram_counts_by_loop():
    rng = np.random.default_rng(2)
    conf = rng.uniform(0, 1, 50)
    correct = (rng.uniform(0, 1, 50) < conf).astype(float)
    d = cb.reliability_diagram(correct, conf, bins=5)
    for b in range(5):
        lo, hi = b / 5, (b + 1) / 5
        members = [i for i in range(50) if lo < conf[i] <= hi or (b == 0 and conf[i] == 0)]
        assert d.count[b] == len(members)
        if members:
            assert d.accuracy[b] == pytest.approx(np.mean(correct[members]))


def test_calibration_summary_ci_brackets_and_is_seeded():
    rng = np.random.default_rng(3)
    conf = rng.uniform(0.5, 1, 400)
    correct = (rng.uniform(0, 1, 400) < conf - 0.2).astype(float)  # over-confident
    labels = rng.integers(0, 4, 400)
    out = cb.calibration_summary(correct, conf, labels=labels, ci=0.9, n_boot=200, seed=0)
    for key in ("ece", "ece_equal_mass", "mce", "brier", "classwise_ece"):
        lo, hi = out["ci"][key]
        assert lo <= hi
    assert out["ci"]["ece"][0] < out["ece"] < out["ci"]["ece"][1]
    assert out["ci"]["brier"][0] < out["brier"] < out["ci"]["brier"][1]
    again = cb.calibration_summary(correct, conf, labels=labels, ci=0.9, n_boot=200, seed=0)
    assert again["ci"] == out["ci"]


def test_isotonic_matches_sklearn():
    from sklearn.isotonic import IsotonicRegression

    rng = np.random.default_rng(4)
    conf = rng.uniform(0, 1, 300).round(2)  # ties
    correct = (rng.uniform(0, 1, 300) < conf**2).astype(float)
    rec = cb.fit_recalibrator(correct, conf, method="isotonic")
    sk = IsotonicRegression(out_of_bounds="clip").fit(conf, correct)
    grid = np.linspace(-0.1, 1.1, 97)
    assert rec.transform(grid) == pytest.approx(sk.predict(grid))


def test_platt_matches_unregularised_logistic_regression():
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(5)
    kappa = rng.uniform(0, 50, 500)  # an unbounded confidence
    correct = (rng.uniform(0, 1, 500) < 1 / (1 + np.exp(-(0.1 * kappa - 2)))).astype(int)
    rec = cb.fit_recalibrator(correct, kappa, method="platt")
    lr = LogisticRegression(C=1e12, tol=1e-12, max_iter=10000).fit(kappa[:, None], correct)
    assert rec.params["a"] == pytest.approx(lr.coef_[0, 0], rel=1e-4)
    assert rec.params["b"] == pytest.approx(lr.intercept_[0], rel=1e-4)


def test_temperature_against_grid_search():
    rng = np.random.default_rng(6)
    z = rng.normal(0, 3, 400)
    conf = 1 / (1 + np.exp(-z))
    correct = (rng.uniform(0, 1, 400) < 1 / (1 + np.exp(-z / 2.5))).astype(float)
    rec = cb.fit_recalibrator(correct, conf, method="temperature")

    def nll(t):
        total = 0.0
        for zi, yi in zip(z, correct, strict=True):
            p = 1 / (1 + math.exp(-zi / t))
            total -= yi * math.log(p) + (1 - yi) * math.log(1 - p)
        return total

    grid = np.linspace(0.5, 6, 221)
    best = grid[int(np.argmin([nll(t) for t in grid]))]
    assert abs(rec.params["temperature"] - best) <= 0.03


def test_recalibrate_lowers_ece_of_an_overconfident_model_and_rejects_one_split():
    rng = np.random.default_rng(7)
    conf = rng.uniform(0.6, 1, 4000)
    correct = (rng.uniform(0, 1, 4000) < (conf - 0.3)).astype(float)  # 30 points over-confident
    cal, test = slice(0, 2000), slice(2000, None)
    for method in ("isotonic", "temperature", "platt"):
        out = cb.recalibrate(
            (correct[cal], conf[cal]),
            (correct[test], conf[test]),
            method=method,
            ci=0.9,
            n_boot=100,
        )
        assert out.after["ece"] < out.before["ece"] / 3
        assert out.after["ci"]["ece"][1] < out.before["ci"]["ece"][0]
    with pytest.raises(InputError, match="same queries"):
        cb.recalibrate((correct, conf), (correct, conf))
    with pytest.raises(InputError, match="pair"):
        cb.recalibrate((correct, conf, conf), (correct, conf))


def test_bad_inputs():
    with pytest.raises(InputError, match=r"\[0, 1\]"):
        cb.brier_score([1, 0], [1.5, 0.2])
    with pytest.raises(InputError, match="method"):
        cb.fit_recalibrator([1, 0], [0.5, 0.2], method="beta")
    with pytest.raises(InputError, match="strategy"):
        cf.expected_calibration_error([1, 0], [0.5, 0.2], strategy="mass")
    with pytest.raises(InputError, match="0/1"):
        cb.fit_recalibrator([0.5, 0], [0.5, 0.2])


def test_reliability_plot_writes_bin_counts():
    d = cb.reliability_diagram([1, 0, 1, 1, 0], [0.95, 0.95, 0.3, 0.3, 0.7], bins=4)
    fig = d.plot()
    # bins (0, .25], (.25, .5], (.5, .75], (.75, 1]: counts 0, 2, 1, 2 (empty bins unlabeled)
    assert [t.get_text() for t in fig.axes[0].texts] == ["n=2", "n=1", "n=2"]


@pytest.mark.parametrize("strategy", ["uniform", "quantile"])
def test_classwise_ece_is_the_mean_of_per_class_loops(strategy):
    rng = np.random.default_rng(8)
    conf = rng.uniform(0, 1, 300).round(2)
    correct = (rng.uniform(0, 1, 300) < conf).astype(float)
    labels = rng.choice(["x", "y", "z", "w"], 300)
    per_class = []
    for k in ("w", "x", "y", "z"):
        m = labels == k
        if strategy == "uniform":
            edges = np.linspace(0, 1, 11)
        else:
            edges = np.unique(np.quantile(conf[m], np.linspace(0, 1, 11)))
        per_class.append(_ece_loop(list(correct[m]), list(conf[m]), edges))
    got = cb.classwise_calibration_error(correct, conf, labels, strategy=strategy)
    assert got == pytest.approx(np.mean(per_class))


def test_platt_is_scale_equivariant_for_large_confidences():
    rng = np.random.default_rng(9)
    kappa = rng.uniform(0, 50, 400)
    correct = (rng.uniform(0, 1, 400) < 1 / (1 + np.exp(-(0.1 * kappa - 2)))).astype(int)
    small = cb.fit_recalibrator(correct, kappa, method="platt")
    big = cb.fit_recalibrator(correct, kappa * 1000 + 5e4, method="platt")
    # the same fitted probabilities: a' = a / 1000, b' = b - a' * 5e4
    assert big.transform(kappa * 1000 + 5e4) == pytest.approx(small.transform(kappa), abs=1e-6)


EDGE_BINS = [6, 7, 9, 12, 14]  # bin counts whose np.linspace edges miss some float k / bins


def _fraction_bin(value, edges):
    """Index of the right-closed bin (a, b] holding ``value`` (the first bin closed), found by
    comparing exact fractions of the floats: no rounding can move a value across an edge."""
    v = Fraction(value)
    b = 0
    while b < len(edges) - 2 and v > Fraction(edges[b + 1]):
        b += 1
    return b


def _unit_grid_case(bins):
    """Confidences on every edge k / bins and between them, with 0/1 outcomes and classes."""
    rng = np.random.default_rng(bins)
    conf = [k / bins for k in range(bins + 1)] + [(2 * k + 1) / (2 * bins) for k in range(bins)]
    conf = conf * 3
    correct = rng.integers(0, 2, len(conf)).tolist()
    labels = rng.choice(["a", "b"], len(conf)).tolist()
    return correct, conf, labels


def _binned_gaps(correct, conf, edges):
    """Per-bin (count, |mean correct - mean confidence|) by a plain loop (empty bins kept)."""
    groups = [[] for _ in range(len(edges) - 1)]
    for m, c in zip(correct, conf, strict=True):
        groups[_fraction_bin(c, edges)].append((m, c))
    return [
        (len(g), abs(sum(m for m, _ in g) / len(g) - sum(c for _, c in g) / len(g)) if g else 0.0)
        for g in groups
    ]


@pytest.mark.parametrize("bins", EDGE_BINS)
def test_unit_bins_put_a_confidence_on_an_edge_in_the_lower_bin(bins):
    correct, conf, labels = _unit_grid_case(bins)
    edges = [k / bins for k in range(bins + 1)]  # Python's correctly rounded k / bins
    gaps = _binned_gaps(correct, conf, edges)
    n = len(conf)
    d = cb.reliability_diagram(correct, conf, bins=bins)
    assert d.edges.tolist() == edges
    assert d.count.tolist() == [k for k, _ in gaps]
    ece = sum(k / n * g for k, g in gaps)
    assert d.ece == pytest.approx(ece, abs=1e-12)
    assert cf.expected_calibration_error(correct, conf, bins=bins) == pytest.approx(ece, abs=1e-12)
    mce = max(g for k, g in gaps if k)
    assert cf.maximum_calibration_error(correct, conf, bins=bins) == pytest.approx(mce, abs=1e-12)
    per_class = []
    for y in ("a", "b"):
        rows = [i for i in range(n) if labels[i] == y]
        g = _binned_gaps([correct[i] for i in rows], [conf[i] for i in rows], edges)
        per_class.append(sum(k / len(rows) * gap for k, gap in g))
    got = cb.classwise_calibration_error(correct, conf, labels, bins=bins)
    assert got == pytest.approx(sum(per_class) / 2, abs=1e-12)


def test_a_vote_fraction_on_an_edge_by_hand():
    # 5/6 sits on the edge of (4/6, 5/6]; 1.0 is in (5/6, 1]: ECE = (1/2)(1/6) + (1/2)(1)
    assert cb.reliability_diagram([1, 0], [5 / 6, 1.0], bins=6).count.tolist() == [0] * 4 + [1, 1]
    assert cf.expected_calibration_error([1, 0], [5 / 6, 1.0], bins=6) == pytest.approx(7 / 12)


@pytest.mark.parametrize("bins", EDGE_BINS)
def test_equal_mass_edges_are_the_sorted_values_when_the_levels_hit_them(bins):
    # n = bins + 1 distinct values: the quantile at k / bins is the k-th sorted value exactly,
    # so (x_(k-1), x_(k)] holds one value and the first, closed bin two
    conf = np.sort(np.random.default_rng(bins).uniform(0, 1, bins + 1))
    d = cb.reliability_diagram(np.ones(bins + 1), conf, bins=bins, strategy="quantile")
    assert d.edges.tolist() == conf.tolist()
    assert d.count.tolist() == [2] + [1] * (bins - 1)
    cur = cf.confidence_recall_curve(np.ones(bins + 1), conf, bins=bins, strategy="quantile")
    assert cur.count.tolist() == [2] + [1] * (bins - 1)


@pytest.mark.parametrize(("n", "bins"), [(24, 23), (47, 23), (56, 11), (56, 22)])
def test_equal_mass_edges_hit_the_sorted_value_when_the_float_position_falls_short(n, bins):
    # (n - 1)·k / bins is a whole number j for some k, but the float (k / bins)·(n - 1) lands
    # an ulp below j (e.g. 23·(13/23) = 12.999999999999998), so a linear quantile would sit an
    # ulp below x_(j) and push x_(j) into the next, right-closed bin
    conf = np.sort(np.random.default_rng(n * 100 + bins).random(n))
    d = cb.reliability_diagram(np.ones(n), conf, bins=bins, strategy="quantile")
    whole = [(n - 1) * k // bins for k in range(bins + 1) if (n - 1) * k % bins == 0]
    assert set(conf[whole].tolist()) <= set(d.edges.tolist())
    # so the bins between two such edges x_(j) < x_(j') hold exactly the j' - j values of
    # (x_(j), x_(j')]
    edges = d.edges.tolist()
    for j, j2 in itertools.pairwise(whole[1:]):
        assert d.count[edges.index(conf[j]) : edges.index(conf[j2])].sum() == j2 - j


@pytest.mark.parametrize("bins", EDGE_BINS)
def test_confidence_recall_curve_edges_on_a_fraction_grid(bins):
    correct, conf, _ = _unit_grid_case(bins)
    edges = [k / bins for k in range(bins + 1)]
    cur = cf.confidence_recall_curve(correct, conf, bins=bins)
    assert cur.edges.tolist() == edges
    assert cur.count.tolist() == [k for k, _ in _binned_gaps(correct, conf, edges)]


@pytest.mark.parametrize("bins", EDGE_BINS)
@pytest.mark.parametrize(("lo", "step"), [("0", "0.1"), ("0.2", "0.05"), ("-1.3", "0.3")])
def test_confidence_recall_curve_edges_on_a_decimal_grid(bins, lo, step):
    # [lo, lo + bins * step] in `bins` bins: the edges are lo + k * step exactly as decimals,
    # and values on them (read as the decimals they print as) go to the lower bin
    lo, step = Fraction(lo), Fraction(step)
    grid = [lo + j * step / 2 for j in range(2 * bins + 1)]  # every edge and every midpoint
    conf = [float(v) for v in grid] * 2
    correct = np.random.default_rng(bins).integers(0, 2, len(conf)).tolist()
    expected = [0] * bins
    for v in grid * 2:
        b = 0
        while b < bins - 1 and v > lo + (b + 1) * step:
            b += 1
        expected[b] += 1
    cur = cf.confidence_recall_curve(correct, conf, bins=bins)
    assert cur.count.tolist() == expected
    assert cur.edges.tolist() == [float(lo + k * step) for k in range(bins + 1)]


def test_confidence_recall_curve_sevenths_of_a_decimal_range_by_hand():
    # [0, 0.7] in sevenths: edges 0, 0.1, ..., 0.7; 0.5 belongs to (0.4, 0.5]
    cur = cf.confidence_recall_curve([1, 1, 0], [0.0, 0.5, 0.7], bins=7)
    assert cur.count.tolist() == [1, 0, 0, 0, 1, 0, 1]


def test_recalibrate_platt_on_kappa_scores_after_and_leaves_before_out():
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(11)
    kappa = rng.uniform(0, 50, 1000)  # a vMF-like confidence, far outside [0, 1]
    correct = (rng.uniform(0, 1, 1000) < 1 / (1 + np.exp(-(0.1 * kappa - 2)))).astype(int)
    cal, test = slice(0, 500), slice(500, None)
    out = cb.recalibrate((correct[cal], kappa[cal]), (correct[test], kappa[test]), method="platt")
    assert out.before == {}  # a kappa is no probability: no ECE or Brier of the raw values
    lr = LogisticRegression(C=1e12, tol=1e-12, max_iter=10000).fit(kappa[cal, None], correct[cal])
    np.testing.assert_allclose(out.calibrated, lr.predict_proba(kappa[test, None])[:, 1], atol=1e-4)
    p, y = out.calibrated.tolist(), correct[test].tolist()
    edges = [k / 10 for k in range(11)]
    assert out.after["ece"] == pytest.approx(_ece_loop(y, p, edges), abs=1e-12)
    brier = sum((pi - yi) ** 2 for pi, yi in zip(p, y, strict=True)) / len(y)
    assert out.after["brier"] == pytest.approx(brier, abs=1e-12)
    with_ci = cb.recalibrate(
        (correct[cal], kappa[cal]), (correct[test], kappa[test]), method="platt", ci=0.9, n_boot=20
    )
    assert with_ci.before == {} and set(with_ci.after["ci"]) == {
        "ece",
        "ece_equal_mass",
        "mce",
        "brier",
    }


def test_recalibrate_scores_before_for_probabilities_and_the_errors_point_to_platt():
    conf = [0.9, 0.8, 0.7, 0.6, 0.95, 0.85]
    out = cb.recalibrate(([1, 0, 1, 0, 1, 1], conf), ([1, 0, 1], [0.9, 0.6, 0.8]), method="platt")
    # before: one query in each of (0.5, 0.6], (0.7, 0.8], (0.8, 0.9]:
    # (1/3)(|0 - 0.6| + |1 - 0.8| + |1 - 0.9|) = 0.3
    assert out.before["ece"] == pytest.approx(0.3)
    with pytest.raises(InputError, match="method='platt'"):
        cb.calibration_summary([1, 0], [6.0, 1.5])
    with pytest.raises(InputError, match=r"confidence must lie in \[0, 1\] for temperature"):
        cb.fit_recalibrator([1, 0, 1], [0.5, 0.2, 0.9], method="temperature").transform([2.0])


@pytest.mark.parametrize(
    "seed, match", [(-1, "seed must be >= 0"), (1.5, "seed must be an integer")]
)
def test_calibration_interval_names_a_bad_seed(seed, match):
    # numpy's own errors ("expected non-negative integer", "SeedSequence expects int") named
    # neither the argument nor the function.
    with pytest.raises(InputError, match=match):
        cb.calibration_summary([1, 0, 1], [0.2, 0.5, 0.9], ci=0.9, n_boot=5, seed=seed)
    with pytest.raises(InputError, match=match):
        cb.recalibrate(([1, 0, 1], [0.2, 0.5, 0.9]), ([0, 1], [0.3, 0.8]), ci=0.9, seed=seed)
