"""Calibration of predicted correctness: class-wise ECE, Brier score, reliability diagrams,
bootstrap intervals, and recalibration fitted on one split and scored on another.

A confidence c_i in [0, 1] is read as the predicted probability that query i is right (its
``correct_i``, e.g. ``per_query["precision_at_1"]``).  ECE and MCE with equal-width or
equal-mass bins are :func:`expected_calibration_error` / :func:`maximum_calibration_error`;
:func:`confidence_recall_curve` bins any metric by any confidence range.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..utils.errors import InputError
from ..utils.validation import as_labels, as_vector, check_choice, check_int, check_level, factorize
from .resample import statistic_ci
from .scores import (
    bin_index,
    binary_correct,
    calibration_edges,
    scores_and_confidence,
    uniform_edges,
)

__all__ = [
    "CalibrationCurve",
    "Recalibration",
    "Recalibrator",
    "ReliabilityDiagram",
    "brier_score",
    "calibration_summary",
    "classwise_calibration_error",
    "confidence_recall_curve",
    "expected_calibration_error",
    "fit_recalibrator",
    "maximum_calibration_error",
    "recalibrate",
    "reliability_diagram",
]


@dataclass(frozen=True)
class CalibrationCurve:
    """Per-bin mean confidence, mean metric and count (empty bins have NaN means)."""

    edges: np.ndarray
    mean_confidence: np.ndarray
    mean_metric: np.ndarray
    count: np.ndarray


def confidence_recall_curve(
    correct_or_scores: Any,
    confidence: Any,
    *,
    bins: int = 10,
    strategy: str = "uniform",
    higher_is_confident: bool = True,
) -> CalibrationCurve:
    """Metric (e.g. Recall@1) of the queries binned by confidence.

    ``strategy="uniform"``: equal-width bins between the smallest and largest confidence, edge
    e_k = lo + (hi - lo)·k / bins worked out exactly from the two ends as they print and
    rounded once (the edges of [0, 0.7] in sevenths are 0.1, ..., 0.6; of [0, 1] the floats
    k / bins); ``"quantile"``: equal-mass bins.  Bins are right-closed (a, b], the first bin
    closed, so a confidence on an edge goes to the lower bin.

    Ties: equal confidences always share a bin; quantile edges are de-duplicated, so heavily
    tied confidences give fewer (never empty-by-construction) bins.  Zero division: an empty bin
    has count 0 and NaN means (it is not dropped, so bins stay aligned with ``edges``).
    ``higher_is_confident`` does not change the bins: they and their means are reported in the
    units given (a sigma stays a sigma); it is accepted for symmetry with the other functions.

    Examples
    --------
    >>> cur = confidence_recall_curve([0, 1, 1, 1], [0.1, 0.4, 0.6, 0.9], bins=2)
    >>> cur.mean_metric.tolist(), cur.count.tolist()
    ([0.5, 1.0], [2, 2])
    """
    s, c, _ = scores_and_confidence(
        correct_or_scores, confidence, higher_is_confident, "correct_or_scores"
    )
    if not higher_is_confident:
        c = -c  # bin and report the values as given (a sigma stays a sigma)
    bins = check_int(bins, "bins")
    strategy = check_choice(strategy, "strategy", ("uniform", "quantile"))
    if strategy == "uniform":
        edges = uniform_edges(float(c.min()), float(c.max()), bins)
    else:
        edges = calibration_edges(c, bins, strategy)
        if edges.size == 1:  # every confidence equal: one closed bin [c, c] holds them all
            edges = np.repeat(edges, 2)
    idx = bin_index(c, edges)
    nb = edges.size - 1
    count = np.bincount(idx, minlength=nb)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_c = np.bincount(idx, weights=c, minlength=nb) / count
        mean_m = np.bincount(idx, weights=s, minlength=nb) / count
    return CalibrationCurve(edges, mean_c, mean_m, count)


def _calibration_gaps(
    correct: Any, confidence: Any, bins: int, strategy: str = "uniform"
) -> tuple[np.ndarray, np.ndarray]:
    s, c, _ = scores_and_confidence(correct, confidence, True, "correct")
    if c.min() < 0 or c.max() > 1:
        raise InputError(
            "confidence must lie in [0, 1] for calibration errors; rescale it (or use "
            "confidence_recall_curve, which bins any range)."
        )
    bins = check_int(bins, "bins")
    strategy = check_choice(strategy, "strategy", ("uniform", "quantile"))
    edges = calibration_edges(c, bins, strategy)
    nb = max(edges.size - 1, 1)
    idx = bin_index(c, edges) if edges.size > 1 else np.zeros(c.size, dtype=np.int64)
    count = np.bincount(idx, minlength=nb)
    filled = count > 0
    acc = np.bincount(idx, weights=s, minlength=nb)[filled] / count[filled]
    conf = np.bincount(idx, weights=c, minlength=nb)[filled] / count[filled]
    return np.abs(acc - conf), count[filled] / s.size


def expected_calibration_error(
    correct: Any, confidence: Any, *, bins: int = 10, strategy: str = "uniform"
) -> float:
    """ECE = Σ_b (n_b / n) |acc_b - conf_b| over bins of the confidence.

    ``strategy="uniform"``: ``bins`` equal-width bins of [0, 1] with the edges k / bins (the
    correctly rounded floats, so 5/6 is on an edge for ``bins=6``); ``"quantile"``: equal-mass
    (adaptive) bins whose edges are the quantiles of the confidences at 0, 1/bins, ..., 1
    (numpy's linear interpolation), de-duplicated.  Bins are right-closed (a, b] with the first
    bin closed (a confidence on an edge goes to the lower bin); empty bins are skipped.

    ``correct`` is 0/1 (or a per-query score in [0, 1], giving the bin's mean score).  Ties:
    equal confidences always share a bin (so heavily tied confidences give fewer equal-mass
    bins).  Zero division: empty bins are skipped (weight 0).

    Examples
    --------
    >>> expected_calibration_error([1, 0, 1, 1], [0.95, 0.95, 0.3, 0.3], bins=2)
    0.575
    >>> # equal mass: edges 0.1, 0.45, 0.8 -> bins {0.1, 0.2} and {0.7, 0.8}
    >>> expected_calibration_error([0, 1, 1, 1], [0.1, 0.2, 0.7, 0.8], bins=2,
    ...                            strategy="quantile")   # (2/4)|1/2 - 0.15| + (2/4)|1 - 0.75|
    0.3
    """
    gaps, weights = _calibration_gaps(correct, confidence, bins, strategy)
    return float(np.sum(gaps * weights))


def maximum_calibration_error(
    correct: Any, confidence: Any, *, bins: int = 10, strategy: str = "uniform"
) -> float:
    """MCE = max over non-empty bins of |acc_b - conf_b| (bins as in ECE).

    Ties: as ECE.  Zero division: empty bins are skipped.

    Examples
    --------
    >>> maximum_calibration_error([1, 0, 1, 1], [0.95, 0.95, 0.3, 0.3], bins=2)
    0.7
    """
    gaps, _ = _calibration_gaps(correct, confidence, bins, strategy)
    return float(gaps.max())


def _unit_confidence(correct: Any, confidence: Any) -> tuple[np.ndarray, np.ndarray]:
    s, c, _ = scores_and_confidence(correct, confidence, True, "correct")
    if c.min() < 0 or c.max() > 1:
        raise InputError(
            "confidence must lie in [0, 1] (a predicted probability of being right); rescale "
            "it, or map it to P(correct) first with recalibrate(..., method='platt') or "
            "fit_recalibrator(..., method='platt'), which take a confidence of any range."
        )
    return s, c


def brier_score(correct: Any, confidence: Any) -> float:
    """Brier score of predicted correctness, (1/n) Σ (c_i - correct_i)² (lower is better).

    ``correct`` is 0/1 (a graded score in [0, 1] gives the squared error to it).  Equals
    scikit-learn's ``brier_score_loss(correct, confidence)``.  NaN scores (lone queries) are
    dropped.  Ties: none matter.  Zero division: never.

    Examples
    --------
    >>> brier_score([1, 0, 1, 1], [0.9, 0.2, 0.6, 1.0])   # (0.01 + 0.04 + 0.16 + 0) / 4
    0.0525
    """
    s, c = _unit_confidence(correct, confidence)
    return float(np.mean((c - s) ** 2))


def classwise_calibration_error(
    correct: Any, confidence: Any, labels: Any, *, bins: int = 10, strategy: str = "uniform"
) -> float:
    """Class-wise ECE: the ECE of each class's queries, averaged over classes (unweighted).

    A model can be calibrated overall yet over-confident on some classes and under-confident
    on others; the overall ECE hides it, this does not.  For class y with queries Q_y:
    cwECE = (1/|Y|) Σ_y ECE(correct[Q_y], confidence[Q_y]); with ``strategy="uniform"`` every
    class uses the same edges, with ``"quantile"`` each class gets its own equal-mass edges.

    Ties and zero division: as :func:`expected_calibration_error`; NaN
    scores (lone queries) are dropped before grouping, and a class left without queries is not
    counted.

    Examples
    --------
    >>> # class a: ECE 0 (two queries at 0.5, one right); class b: |1 - 0.5| = 0.5
    >>> classwise_calibration_error([1, 0, 1, 1], [0.5, 0.5, 0.5, 0.5], ["a", "a", "b", "b"])
    0.25
    """
    s, c = _unit_confidence(correct, confidence)
    raw = as_vector(correct, "correct", allow_nan=True)
    y = as_labels(labels, "labels", length=raw.size, length_of="correct")[~np.isnan(raw)]
    (codes,), _ = factorize(y)
    strategy = check_choice(strategy, "strategy", ("uniform", "quantile"))
    if strategy == "quantile":  # each class has its own edges
        per_class = [
            expected_calibration_error(s[codes == k], c[codes == k], bins=bins, strategy=strategy)
            for k in np.unique(codes)
        ]
        return float(np.mean(per_class))
    # Shared edges: (n_b / n_y) |acc_b - conf_b| = |S_b - C_b| / n_y with S_b, C_b the bin's
    # sums of correctness and confidence, so one bincount over (class, bin) cells does it all.
    nb = check_int(bins, "bins")
    cell = codes * nb + bin_index(c, uniform_edges(0.0, 1.0, nb))
    n_cells = (int(codes.max()) + 1) * nb
    gap = np.abs(
        np.bincount(cell, weights=s, minlength=n_cells)
        - np.bincount(cell, weights=c, minlength=n_cells)
    ).reshape(-1, nb)
    size = np.bincount(codes)
    return float(np.mean(gap.sum(axis=1)[size > 0] / size[size > 0]))


@dataclass(frozen=True)
class ReliabilityDiagram:
    """Per-bin mean confidence, accuracy and count (empty bins: count 0, NaN means)."""

    edges: np.ndarray
    mean_confidence: np.ndarray
    accuracy: np.ndarray
    count: np.ndarray
    ece: float

    def plot(self, ax: Any = None, label: str | None = None) -> Any:
        """Draw the diagram with bin counts (see :func:`embedeval.plots.plot_reliability`)."""
        from ..plots import plot_reliability

        return plot_reliability(self, ax=ax, label=label)


def reliability_diagram(
    correct: Any, confidence: Any, *, bins: int = 10, strategy: str = "uniform"
) -> ReliabilityDiagram:
    """Accuracy against mean confidence per bin, with the number of queries in each bin.

    Bins as in :func:`expected_calibration_error` (right-closed, first
    closed; equal-width over [0, 1] or equal-mass).  ``ece`` = Σ_b (n_b / n) |acc_b - conf_b|.

    Examples
    --------
    >>> d = reliability_diagram([1, 0, 1, 1], [0.95, 0.95, 0.3, 0.3], bins=2)
    >>> d.count.tolist(), d.accuracy.tolist(), d.ece
    ([2, 2], [1.0, 0.5], 0.575)
    """
    s, c = _unit_confidence(correct, confidence)
    bins = check_int(bins, "bins")
    strategy = check_choice(strategy, "strategy", ("uniform", "quantile"))
    edges = calibration_edges(c, bins, strategy)
    if edges.size < 2:  # one distinct confidence: a single degenerate bin
        edges = np.array([edges[0], edges[0]])
    idx = bin_index(c, edges)
    nb = edges.size - 1
    count = np.bincount(idx, minlength=nb)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_c = np.bincount(idx, weights=c, minlength=nb) / count
        acc = np.bincount(idx, weights=s, minlength=nb) / count
    ece = expected_calibration_error(s, c, bins=bins, strategy=strategy)
    return ReliabilityDiagram(edges, mean_c, acc, count, ece)


def _calibration_values(
    s: np.ndarray, c: np.ndarray, codes: np.ndarray | None, bins: int
) -> dict[str, float]:
    out = {
        "ece": expected_calibration_error(s, c, bins=bins),
        "ece_equal_mass": expected_calibration_error(s, c, bins=bins, strategy="quantile"),
        "mce": maximum_calibration_error(s, c, bins=bins),
        "brier": float(np.mean((c - s) ** 2)),
    }
    if codes is not None:
        out["classwise_ece"] = classwise_calibration_error(s, c, codes, bins=bins)
    return out


def calibration_summary(
    correct: Any,
    confidence: Any,
    *,
    labels: Any = None,
    bins: int = 10,
    ci: float | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """ECE (equal width and equal mass), MCE, Brier and, with ``labels``, class-wise ECE.

    With ``ci`` the dict also holds ``"ci"``: percentile bootstrap intervals (queries resampled
    with replacement, every statistic recomputed on the same resamples), so two checkpoints'
    calibration can be compared.  NaN scores (lone queries) are dropped first.

    Examples
    --------
    >>> out = calibration_summary([1, 0, 1, 1], [0.95, 0.95, 0.3, 0.3], bins=2)
    >>> out["ece"], round(out["brier"], 4)   # (0.0025 + 0.9025 + 0.49 + 0.49) / 4
    (0.575, 0.4713)
    """
    s, c = _unit_confidence(correct, confidence)
    bins = check_int(bins, "bins")
    codes = None
    if labels is not None:
        raw = as_vector(correct, "correct", allow_nan=True)
        y = as_labels(labels, "labels", length=raw.size, length_of="correct")[~np.isnan(raw)]
        (codes,), _ = factorize(y)
    out: dict[str, Any] = dict(_calibration_values(s, c, codes, bins))
    if ci is not None:
        level = check_level(ci)
        arrays = [s, c] if codes is None else [s, c, codes]

        def stat(*a: np.ndarray) -> dict[str, float]:
            return _calibration_values(a[0], a[1], a[2] if len(a) > 2 else None, bins)

        n_boot, seed = check_int(n_boot, "n_boot"), check_int(seed, "seed", minimum=0)
        out["ci"] = statistic_ci(stat, arrays, ci=level, n_boot=n_boot, seed=seed)
    return out


# ---------------------------------------------------------------------------- recalibration


def _logit(c: np.ndarray) -> np.ndarray:
    p = np.clip(c, 1e-12, 1 - 1e-12)
    return np.log(p) - np.log1p(-p)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # overflow-free logistic


def _nll(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, 1e-15, 1 - 1e-15)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


@dataclass(frozen=True)
class Recalibrator:
    """A fitted monotone map from confidence to P(correct); apply it with :meth:`transform`.

    ``method="isotonic"``: ``x`` / ``y`` are the knots of a non-decreasing piecewise-linear
    map (clipped to the end values outside them).  ``"temperature"``: p = σ(logit(c) / T),
    ``params = {"temperature": T}``.  ``"platt"``: p = σ(a·c + b), ``params = {"a", "b"}``.
    """

    method: str
    params: dict[str, float] = field(default_factory=dict)
    x: np.ndarray | None = None
    y: np.ndarray | None = None

    def transform(self, confidence: Any) -> np.ndarray:
        """Calibrated P(correct) of each confidence."""
        c = as_vector(confidence, "confidence")
        if self.method == "isotonic":
            return np.interp(c, self.x, self.y)
        if self.method == "temperature":
            if c.min() < 0 or c.max() > 1:
                raise InputError(
                    "confidence must lie in [0, 1] for temperature scaling (σ(logit(c) / T)); "
                    "fit method='platt' for a confidence of another range."
                )
            return _sigmoid(_logit(c) / self.params["temperature"])
        return _sigmoid(self.params["a"] * c + self.params["b"])


def _isotonic(c: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # Tied confidences are one point with their mean outcome and their count as weight.
    x, inverse, counts = np.unique(c, return_inverse=True, return_counts=True)
    mean = np.bincount(inverse, weights=s) / counts
    try:
        from scipy.optimize import isotonic_regression
    except ImportError:  # scipy < 1.12
        from sklearn.isotonic import isotonic_regression as sk_iso

        return x, sk_iso(mean, sample_weight=counts.astype(float), increasing=True)
    return x, isotonic_regression(mean, weights=counts.astype(float), increasing=True).x


def fit_recalibrator(correct: Any, confidence: Any, *, method: str = "isotonic") -> Recalibrator:
    """Fit a monotone map from confidence to P(correct) on a calibration split.

    ``"isotonic"``: the non-decreasing least-squares fit (pool-adjacent-violators) of the 0/1
    outcomes against the confidence, tied confidences pooled first; new confidences are
    interpolated linearly between the fitted points and clipped outside them (as scikit-learn's
    ``IsotonicRegression(out_of_bounds="clip")``).  ``"temperature"``: one T > 0 minimising the
    log-loss of σ(logit(c) / T) (confidences in [0, 1]).  ``"platt"``: a, b minimising the
    log-loss of σ(a·c + b) on the raw confidence (any real range, e.g. a vMF κ; unregularised
    logistic regression).

    ``correct`` must be 0/1; NaN (lone queries) are dropped.  Fit on queries you do not score:
    :func:`recalibrate` takes the two splits separately.

    Examples
    --------
    >>> r = fit_recalibrator([0, 1, 0, 1], [0.2, 0.4, 0.6, 0.8])
    >>> r.transform([0.2, 0.5, 0.8]).tolist()   # PAV pools 0.4 and 0.6 to 1/2
    [0.0, 0.5, 1.0]
    """
    from scipy import optimize

    method = check_choice(method, "method", ("isotonic", "temperature", "platt"))
    s, c, _ = scores_and_confidence(correct, confidence, True, "correct")
    y = binary_correct(s).astype(np.float64)
    if method == "isotonic":
        x, fitted = _isotonic(c, y)
        return Recalibrator(method, {}, x, fitted)
    if method == "temperature":
        if c.min() < 0 or c.max() > 1:
            raise InputError("temperature scaling needs confidences in [0, 1]; use 'platt'.")
        z = _logit(c)
        res = optimize.minimize_scalar(
            lambda log_t: _nll(_sigmoid(z / math.exp(log_t)), y),
            bounds=(-10.0, 10.0),
            method="bounded",
            options={"xatol": 1e-10},
        )
        return Recalibrator(method, {"temperature": float(math.exp(res.x))})

    # Fit on the standardised confidence (a κ of 1e4 would stall the optimiser), then map the
    # slope and intercept back: a·z + b with z = (c - μ)/s is (a/s)·c + (b - aμ/s).
    mu, scale = float(c.mean()), float(c.std()) or 1.0
    z = (c - mu) / scale

    def loss(ab: np.ndarray) -> tuple[float, np.ndarray]:
        p = _sigmoid(ab[0] * z + ab[1])
        grad = np.array([np.mean((p - y) * z), np.mean(p - y)])
        return _nll(p, y), grad

    res = optimize.minimize(loss, np.zeros(2), jac=True, method="L-BFGS-B", tol=1e-14)
    a = float(res.x[0]) / scale
    return Recalibrator(method, {"a": a, "b": float(res.x[1]) - a * mu})


@dataclass(frozen=True)
class Recalibration:
    """ECE of the test split before and after a map fitted on the calibration split."""

    recalibrator: Recalibrator
    calibrated: np.ndarray
    before: dict[str, Any]
    after: dict[str, Any]


def recalibrate(
    calibration: tuple[Any, Any],
    test: tuple[Any, Any],
    *,
    method: str = "isotonic",
    bins: int = 10,
    ci: float | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> Recalibration:
    """Fit on ``calibration = (correct, confidence)``, score on ``test = (correct, confidence)``.

    Returns the fitted :class:`Recalibrator`, the test split's calibrated confidences, and
    :func:`calibration_summary` of the test split before and after (with bootstrap intervals
    when ``ci`` is given; the test queries are resampled, the map stays fixed).  ``before``
    scores the raw test confidences as probabilities, so it is filled only when they lie in
    [0, 1]; for a confidence of another range (a vMF κ fed to ``method="platt"``) it is an
    empty dict, as ECE and Brier of a κ have no meaning.  Passing the same arrays as both
    splits is an error: a map scored on the queries it was fitted on looks better than it is.

    Examples
    --------
    >>> cal = ([0, 1, 0, 1, 1, 1], [0.9, 0.9, 0.9, 0.9, 0.95, 0.95])
    >>> test = ([1, 0, 1, 1], [0.9, 0.9, 0.95, 0.95])
    >>> out = recalibrate(cal, test, method="isotonic", bins=2)
    >>> out.calibrated.tolist(), out.after["ece"] < out.before["ece"]
    ([0.5, 0.5, 1.0, 1.0], True)
    >>> kappa = recalibrate(([0, 1, 0, 1], [1.0, 5.0, 2.0, 8.0]), ([1, 0], [6.0, 1.5]),
    ...                     method="platt", bins=2)
    >>> kappa.before, sorted(kappa.after)[:2]   # a κ is no probability: no "before"
    ({}, ['brier', 'ece'])
    """
    for name, split in (("calibration", calibration), ("test", test)):
        if not isinstance(split, (tuple, list)) or len(split) != 2:
            raise InputError(f"{name} must be a pair (correct, confidence); got {split!r:.60}.")
    cal_c = as_vector(calibration[1], "calibration confidence")
    test_c = as_vector(test[1], "test confidence")
    same = calibration[1] is test[1] or (
        cal_c.shape == test_c.shape
        and np.array_equal(cal_c, test_c)
        and np.array_equal(
            as_vector(calibration[0], "calibration correct", allow_nan=True),
            as_vector(test[0], "test correct", allow_nan=True),
            equal_nan=True,
        )
    )
    if same:
        raise InputError(
            "calibration and test are the same queries; fit the recalibrator on a held-out "
            "split (e.g. half of the queries) and score it on the other."
        )
    rec = fit_recalibrator(calibration[0], calibration[1], method=method)
    calibrated = np.clip(rec.transform(test_c), 0.0, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        kw = {"bins": bins, "ci": ci, "n_boot": n_boot, "seed": seed}
        # ECE and Brier read a confidence as P(correct): only a raw one in [0, 1] has them.
        probabilities = test_c.min() >= 0 and test_c.max() <= 1
        before = calibration_summary(test[0], test_c, **kw) if probabilities else {}
        after = calibration_summary(test[0], calibrated, **kw)
    return Recalibration(rec, calibrated, before, after)
