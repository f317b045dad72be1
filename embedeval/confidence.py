"""Confidence and uncertainty evaluation: does a model's confidence rank its own errors?

Conventions used throughout:

* A **confidence** c_i is larger when the model is more certain (a vMF kappa, a softmax max).  A
  **sigma** is an uncertainty (larger = less certain): pass ``higher_is_confident=False`` (or,
  for rank correlation, ``higher_is_uncertain=True``) and nothing else changes.
* Scores m_i are per-query metric values in [0, 1] (``result.per_query["precision_at_1"]`` or
  ``["map_at_r"]``); the error is e_i = 1 - m_i.  NaN scores (lone queries) are dropped and
  counted.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._errors import EmbedevalWarning, InputError, InputTypeError
from ._validation import (
    as_vector,
    check_bool,
    check_choice,
    check_int,
    check_level,
    check_probability,
)

__all__ = [
    "CalibrationCurve",
    "CoverageCurve",
    "ErrorRejectCurve",
    "RankCorrelation",
    "SigmaRegression",
    "best_threshold_accuracy",
    "confidence_auroc",
    "confidence_recall_curve",
    "confidence_summary",
    "credible_coverage",
    "error_reject_curve",
    "expected_calibration_error",
    "gaussian_credible_radius",
    "hpd_interval",
    "maximum_calibration_error",
    "rank_correlation",
    "sigma_regression",
    "vmf_credible_cap",
]


def _scores_and_confidence(
    scores: Any, confidence: Any, higher_is_confident: bool, name: str = "scores"
) -> tuple[np.ndarray, np.ndarray, int]:
    check_bool(higher_is_confident, "higher_is_confident")
    s = as_vector(scores, name, allow_nan=True)
    c = as_vector(confidence, "confidence", length=s.size, length_of=name)
    if np.any((s < 0) | (s > 1)):
        bad = np.flatnonzero((s < 0) | (s > 1))
        raise InputError(
            f"{name} must lie in [0, 1] (per-query metric values); {bad.size} value(s) do not, "
            f"first at index {int(bad[0])} ({s[bad[0]]})."
        )
    keep = ~np.isnan(s)
    if not keep.any():
        raise InputError(f"{name} has no finite value (every query lone?); nothing to evaluate.")
    c = c[keep] if higher_is_confident else -c[keep]
    return s[keep], c, int((~keep).sum())


@dataclass(frozen=True)
class ErrorRejectCurve:
    """The error-versus-reject (risk-coverage) curve of one metric, and its areas.

    ``rejected[j]`` = j / n and ``error[j]`` = mean error of the n - j most confident queries
    (j = 0 .. n-1), i.e. the selective risk at coverage 1 - j/n.  ``auerc`` = (1/n) Σ_{k=1..n} E_k
    (lower is better); ``oracle_auerc`` orders by the error itself, ``random_auerc`` is the mean
    error, ``excess_auerc`` = auerc - oracle.  ``aurc``, ``eaurc`` (= aurc - oracle aurc) and
    ``augrc`` (generalised risk: the kept errors divided by all n) use the ``integration`` rule
    of :func:`error_reject_curve`; ``oracle_aurc`` / ``oracle_augrc`` are their best values.
    """

    rejected: np.ndarray
    error: np.ndarray
    oracle_error: np.ndarray
    auerc: float
    oracle_auerc: float
    random_auerc: float
    excess_auerc: float
    n: int
    n_dropped: int
    aurc: float = math.nan
    eaurc: float = math.nan
    augrc: float = math.nan
    oracle_aurc: float = math.nan
    oracle_augrc: float = math.nan
    integration: str = "mean"

    @property
    def coverage(self) -> np.ndarray:
        """Fraction of queries kept at each point, 1 - ``rejected`` (1, (n-1)/n, ..., 1/n)."""
        return np.arange(self.n, 0, -1) / self.n

    def selective_risk(self, coverage: float) -> float:
        """Mean error of the ⌈coverage·n⌉ most confident queries (tied blocks in expectation).

        Examples
        --------
        >>> erc = error_reject_curve([1, 0, 1, 0], [0.9, 0.1, 0.8, 0.2])
        >>> erc.selective_risk(0.75), erc.selective_risk(0.5)   # keep 3 (1 error), keep 2
        (0.3333333333333333, 0.0)
        """
        cov = check_probability(coverage, "coverage")
        k = max(1, math.ceil(cov * self.n - 1e-9))
        return float(self.error[self.n - k])

    def coverage_at_risk(self, risk: float) -> float:
        """Largest coverage k/n whose selective risk E_k is <= ``risk``; 0.0 if none is.

        Examples
        --------
        >>> erc = error_reject_curve([1, 0, 1, 0], [0.9, 0.1, 0.8, 0.2])
        >>> erc.coverage_at_risk(0.4), erc.coverage_at_risk(0.0)   # E_3 = 1/3, E_2 = 0
        (0.75, 0.5)
        """
        r = check_probability(risk, "risk", open_left=False)
        ok = np.flatnonzero(self.error <= r + 1e-12)
        return float(self.coverage[ok[0]]) if ok.size else 0.0

    def plot(self, ax: Any = None, label: str | None = None) -> Any:
        """Draw the curve with its oracle and random references (see embedeval.plots)."""
        from .plots import plot_error_reject_curve

        return plot_error_reject_curve(self, ax=ax, label=label)


def _kept_error_sums(error: np.ndarray, confidence: np.ndarray) -> np.ndarray:
    """Sum of the errors of the k most confident queries, k = 1..n, tied blocks averaged.

    For k inside a block of equal confidence the kept part of the block contributes its share of
    the block's mean error: the expectation over every order of the tied queries.  ``error`` may
    be 2-D (one column per metric, the same queries): every column is done in the same pass.
    """
    order = np.argsort(-confidence, kind="stable")
    c, e = confidence[order], error[order]
    n = e.shape[0]
    starts = np.flatnonzero(np.concatenate(([True], c[1:] != c[:-1])))
    ends = np.append(starts[1:], n)
    if starts.size == n:  # no tie: the plain running sum
        return np.cumsum(e, axis=0)
    size = ends - starts
    block_mean = np.add.reduceat(e, starts, axis=0) / size.reshape(-1, *([1] * (e.ndim - 1)))
    # Inside a block every kept item counts the block's mean error.
    return np.cumsum(np.repeat(block_mean, size, axis=0), axis=0)


def erc_areas(error: np.ndarray, confidence: np.ndarray, integration: str) -> dict[str, Any]:
    """Every area of the error-reject curve, per column of ``error`` (n queries x m metrics).

    ``confidence`` is oriented (higher = more confident) and NaN-free; see
    :func:`error_reject_curve` for the definitions.  Returns arrays of length m keyed by the
    :class:`ErrorRejectCurve` attribute names, plus the curves ``kept_mean`` / ``oracle_mean``.
    """
    n = error.shape[0]
    k = np.arange(1, n + 1)[:, None]
    e = error.reshape(n, -1)
    kept_sum = _kept_error_sums(e, confidence)
    oracle_sum = np.cumsum(np.sort(e, axis=0), axis=0)
    kept_mean, oracle_mean = kept_sum / k, oracle_sum / k
    auerc, oracle = kept_mean.mean(axis=0), oracle_mean.mean(axis=0)
    aurc, oracle_aurc = _area(kept_mean, integration), _area(oracle_mean, integration)
    return {
        "auerc": auerc,
        "oracle_auerc": oracle,
        "random_auerc": e.mean(axis=0),
        "excess_auerc": auerc - oracle,
        "aurc": aurc,
        "eaurc": aurc - oracle_aurc,
        "augrc": _area(kept_sum / n, integration),
        "oracle_aurc": oracle_aurc,
        "oracle_augrc": _area(oracle_sum / n, integration),
        "kept_mean": kept_mean,
        "oracle_mean": oracle_mean,
    }


def _area(values: np.ndarray, integration: str) -> np.ndarray:
    """Area under values v_1..v_n given at coverages 1/n..1 (see :func:`error_reject_curve`),
    per column."""
    if integration == "mean":
        return values.mean(axis=0)
    # trapezoid from the point (coverage 0, value 0): (1/n) [Σ_{k<n} v_k + v_n / 2]
    return values.mean(axis=0) - values[-1] / (2 * values.shape[0])


def error_reject_curve(
    scores: Any,
    confidence: Any,
    *,
    higher_is_confident: bool = True,
    integration: str = "mean",
) -> ErrorRejectCurve:
    """Error-versus-reject curve (ERC, the risk-coverage curve) and its areas.

    Sort the queries by confidence, most confident first.  Keeping the k most confident
    (k = n .. 1, coverage k/n) rejects the fraction ρ_k = 1 - k/n and leaves the selective risk
    E_k = S_k / k with S_k = Σ_{kept} (1 - score).  The areas:

    * AUERC = (1/n) Σ_{k=1..n} E_k (always the mean rule);
    * AURC = area of E_k over coverage, E-AURC = AURC - AURC of the oracle order;
    * AUGRC = area of the generalised risk G_k = S_k / n (errors that are kept, over *all*
      queries: an error costs more the later it is rejected), after Traub et al. (2024).

    Parameters
    ----------
    scores : array-like of float in [0, 1]
        Per-query metric values (0/1 correctness gives the 0/1 risk, a graded metric such as
        MAP@R the graded risk); NaN (lone queries) are dropped and counted in ``n_dropped``.
    confidence : array-like of float
        Per-query confidence, same length.
    higher_is_confident : bool
        False for uncertainties (sigmas).
    integration : {"mean", "trapezoid"}
        How AURC / E-AURC / AUGRC integrate v_k (E_k or G_k) over coverage.  ``"mean"``:
        (1/n) Σ_{k=1..n} v_k, the right Riemann sum (AURC then equals AUERC).  ``"trapezoid"``:
        the trapezoid rule over the points (k/n, v_k) starting from (0, 0), which is
        (1/n) [Σ_{k=1..n-1} v_k + v_n / 2]; this is the convention of the probabilistic-embeddings
        library's AURCC.  The two differ by v_n / (2n).

    Returns
    -------
    ErrorRejectCurve
        Also gives :meth:`~ErrorRejectCurve.selective_risk` at a coverage and
        :meth:`~ErrorRejectCurve.coverage_at_risk`.

    Notes
    -----
    *Why a mean over k = 1..n.*  It weighs every operating point (every number of kept queries)
    equally, so the area is the average error over a uniformly random rejection budget; it is
    the Riemann sum of the curve over ρ on the grid 0, 1/n, ..., (n-1)/n.
    *Ties.*  Queries with equal confidence form one block; when k cuts a block, the kept part
    contributes the block's mean error (the expectation over every order of the block), so the
    result never depends on input order.  The oracle sorts by the error itself (ties there do not
    matter), the random baseline is the mean error (the expected E_k of a random order, for every
    k).  Every area is invariant to any strictly increasing transform of the confidence.
    For a random order the expected AUGRC is ē (n + 1) / (2n) with the mean rule and ē / 2 with
    the trapezoid rule (ē = mean error).  G_k is linear inside a tied block, so the trapezoid
    AUGRC equals the area under the generalised risk-coverage curve drawn through one point per
    distinct confidence from (0, 0) (the convention of Traub et al.'s reference code); E_k is not
    linear there, so for AURC the block expectation and straight lines between thresholds
    differ when ties are cut.  The oracle (best order of these n queries) is discrete; the
    continuous optimum for 0/1 risk, ē + (1 - ē) ln(1 - ē) for AURC and ē²/2 for AUGRC, is
    its limit for large n.

    Zero division: never — lone/NaN queries are removed first (counted in ``n_dropped``) and
    k >= 1; all-NaN scores are an error.

    Examples
    --------
    >>> erc = error_reject_curve([1, 0, 1, 0], [0.9, 0.1, 0.8, 0.2])
    >>> erc.error.tolist()                 # keep 4, 3, 2, 1 queries
    [0.5, 0.3333333333333333, 0.0, 0.0]
    >>> round(erc.auerc, 4)                # (0 + 0 + 1/3 + 1/2) / 4
    0.2083
    >>> erc.oracle_auerc == erc.auerc, erc.random_auerc
    (True, 0.5)
    >>> round(erc.augrc, 4)                # G_k = 0, 0, 1/4, 2/4: (0 + 0 + 1/4 + 1/2) / 4
    0.1875
    >>> t = error_reject_curve([1, 0, 1, 0], [0.9, 0.1, 0.8, 0.2], integration="trapezoid")
    >>> round(t.aurc, 4)                   # (0 + 0 + 1/3 + (1/2) / 2) / 4
    0.1458
    """
    s, c, dropped = _scores_and_confidence(scores, confidence, higher_is_confident)
    integration = check_choice(integration, "integration", ("mean", "trapezoid"))
    n = s.size
    areas = erc_areas(1.0 - s, c, integration)
    kept_mean, oracle_mean = areas.pop("kept_mean")[:, 0], areas.pop("oracle_mean")[:, 0]
    scalars = {name: float(v[0]) for name, v in areas.items()}
    return ErrorRejectCurve(
        rejected=1.0 - np.arange(n, 0, -1) / n,
        error=kept_mean[::-1].copy(),
        oracle_error=oracle_mean[::-1].copy(),
        n=n,
        n_dropped=dropped,
        integration=integration,
        **scalars,
    )


@dataclass(frozen=True)
class CalibrationCurve:
    """Per-bin mean confidence, mean metric and count (empty bins have NaN means)."""

    edges: np.ndarray
    mean_confidence: np.ndarray
    mean_metric: np.ndarray
    count: np.ndarray


def _bin_index(c: np.ndarray, edges: np.ndarray) -> np.ndarray:
    # Right-closed bins (a, b]; the first bin also holds its left edge.
    idx = np.searchsorted(edges, c, side="left") - 1
    return np.clip(idx, 0, edges.size - 2)


def confidence_recall_curve(
    correct_or_scores: Any,
    confidence: Any,
    *,
    bins: int = 10,
    strategy: str = "uniform",
    higher_is_confident: bool = True,
) -> CalibrationCurve:
    """Metric (e.g. Recall@1) of the queries binned by confidence.

    ``strategy="uniform"``: equal-width bins between the smallest and largest confidence;
    ``"quantile"``: equal-mass bins.  Bins are right-closed (a, b], the first bin closed.

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
    s, c, _ = _scores_and_confidence(
        correct_or_scores, confidence, higher_is_confident, "correct_or_scores"
    )
    if not higher_is_confident:
        c = -c  # bin and report the values as given (a sigma stays a sigma)
    bins = check_int(bins, "bins")
    strategy = check_choice(strategy, "strategy", ("uniform", "quantile"))
    if strategy == "uniform":
        edges = np.linspace(c.min(), c.max(), bins + 1)
    else:
        edges = np.unique(np.quantile(c, np.linspace(0, 1, bins + 1)))
        if edges.size == 1:  # every confidence equal: one closed bin [c, c] holds them all
            edges = np.repeat(edges, 2)
    idx = _bin_index(c, edges)
    nb = edges.size - 1
    count = np.bincount(idx, minlength=nb)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_c = np.bincount(idx, weights=c, minlength=nb) / count
        mean_m = np.bincount(idx, weights=s, minlength=nb) / count
    return CalibrationCurve(edges, mean_c, mean_m, count)


def _calibration_edges(c: np.ndarray, bins: int, strategy: str) -> np.ndarray:
    if strategy == "uniform":
        return np.linspace(0.0, 1.0, bins + 1)
    # equal mass: quantile edges (numpy's linear rule), de-duplicated so tied values share a bin
    return np.unique(np.quantile(c, np.linspace(0, 1, bins + 1)))


def _calibration_gaps(
    correct: Any, confidence: Any, bins: int, strategy: str = "uniform"
) -> tuple[np.ndarray, np.ndarray]:
    s, c, _ = _scores_and_confidence(correct, confidence, True, "correct")
    if c.min() < 0 or c.max() > 1:
        raise InputError(
            "confidence must lie in [0, 1] for calibration errors; rescale it (or use "
            "confidence_recall_curve, which bins any range)."
        )
    bins = check_int(bins, "bins")
    strategy = check_choice(strategy, "strategy", ("uniform", "quantile"))
    edges = _calibration_edges(c, bins, strategy)
    nb = max(edges.size - 1, 1)
    idx = _bin_index(c, edges) if edges.size > 1 else np.zeros(c.size, dtype=np.int64)
    count = np.bincount(idx, minlength=nb)
    filled = count > 0
    acc = np.bincount(idx, weights=s, minlength=nb)[filled] / count[filled]
    conf = np.bincount(idx, weights=c, minlength=nb)[filled] / count[filled]
    return np.abs(acc - conf), count[filled] / s.size


def expected_calibration_error(
    correct: Any, confidence: Any, *, bins: int = 10, strategy: str = "uniform"
) -> float:
    """ECE = Σ_b (n_b / n) |acc_b - conf_b| over bins of the confidence.

    ``strategy="uniform"``: ``bins`` equal-width bins of [0, 1]; ``"quantile"``: equal-mass
    (adaptive) bins whose edges are the quantiles of the confidences at 0, 1/bins, ..., 1
    (numpy's linear interpolation), de-duplicated.  Bins are right-closed (a, b] with the first
    bin closed; empty bins are skipped.

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


def _binary_correct(s: np.ndarray) -> np.ndarray:
    if not np.isin(s, (0.0, 1.0)).all():
        i = int(np.flatnonzero(~np.isin(s, (0.0, 1.0)))[0])
        raise InputError(
            f"correct must be 0/1 (is the query right, e.g. per_query['precision_at_1']); "
            f"correct[{i}] = {s[i]}. Threshold a graded metric first, e.g. map_at_r >= 0.5."
        )
    return s == 1.0


def confidence_auroc(correct: Any, confidence: Any, *, higher_is_confident: bool = True) -> float:
    """R-AUROC: AUROC of "the query is correct" (e.g. R@1) against its confidence.

    The probability that a correct query is more confident than an incorrect one, ties counted
    half (Mann-Whitney).  NaN with a warning when all queries are correct or all wrong.

    ``correct`` must be 0/1 (a graded metric such as MAP@R must be thresholded first).
    R-AUROC = (Σ ranks of the correct − n₁(n₁+1)/2) / (n₁ n₀) with average ranks for ties, which
    is scikit-learn's ``roc_auc_score(correct, confidence)``.  Zero division: all correct or all
    wrong gives NaN and a warning.

    Examples
    --------
    >>> confidence_auroc([1, 1, 0, 0], [0.9, 0.5, 0.5, 0.1])
    0.875
    """
    from scipy.stats import rankdata

    s, c, _ = _scores_and_confidence(correct, confidence, higher_is_confident, "correct")
    positive = _binary_correct(s)
    n1, n0 = int(positive.sum()), int((~positive).sum())
    if n1 == 0 or n0 == 0:
        warnings.warn(
            "confidence_auroc needs both correct and incorrect queries; NaN.",
            EmbedevalWarning,
            stacklevel=2,
        )
        return math.nan
    ranks = rankdata(c)
    return float((ranks[positive].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def best_threshold_accuracy(
    correct: Any, confidence: Any, *, higher_is_confident: bool = True
) -> float:
    """Best accuracy of predicting correctness as ``confidence >= t``, over every threshold t.

    Thresholds run over every distinct confidence plus +inf (predict "wrong" for all).

    ``correct`` must be 0/1.  Accuracy(t) = (#correct with c >= t + #wrong with c < t) / n.
    Ties: a block of equal confidences is on one side of every threshold.  Zero division: never.

    Examples
    --------
    >>> best_threshold_accuracy([1, 1, 0, 0], [0.9, 0.5, 0.5, 0.1])
    0.75
    """
    s, c, _ = _scores_and_confidence(correct, confidence, higher_is_confident, "correct")
    positive = _binary_correct(s)
    order = np.argsort(-c, kind="stable")
    c_sorted, p_sorted = c[order], positive[order]
    last_of_block = np.append(c_sorted[1:] != c_sorted[:-1], True)
    tp = np.cumsum(p_sorted)[last_of_block]  # predicted correct: everything at or above c
    fp = np.cumsum(~p_sorted)[last_of_block]
    tn = (~positive).sum() - fp
    accuracy = np.append((tp + tn) / s.size, (~positive).sum() / s.size)
    return float(accuracy.max())


@dataclass(frozen=True)
class RankCorrelation:
    """Rank correlation statistic and its two-sided p-value."""

    statistic: float
    pvalue: float
    method: str
    n: int


def rank_correlation(
    predicted: Any,
    truth: Any,
    *,
    method: str = "spearman",
    nan_policy: str = "raise",
    higher_is_uncertain: bool = True,
) -> RankCorrelation:
    """Spearman's ρ or Kendall's τ-b between predicted and ground-truth uncertainties.

    ``truth`` is an uncertainty (a ground-truth sigma).  With ``higher_is_uncertain=True`` the
    prediction is a sigma too; with ``False`` it is a confidence (kappa) and is negated, so a
    good predictor scores close to +1 either way.  Average ranks for ties (Spearman), τ-b
    (Kendall).  Invariant to strictly increasing transforms of either input.

    Parameters
    ----------
    nan_policy : {"raise", "omit", "propagate"}
        As in scipy: error on NaN, drop pairs with a NaN, or return NaN.

    Zero division: constant input (or fewer than 2 pairs) has an undefined correlation: NaN
    and an :class:`~embedeval.EmbedevalWarning`, never an exception.

    Examples
    --------
    >>> iq = [106, 86, 100, 101, 99, 103, 97, 113, 112, 110]
    >>> tv = [7, 0, 27, 50, 28, 29, 20, 12, 6, 17]
    >>> round(rank_correlation(iq, tv).statistic, 6)   # -29/165
    -0.175758
    """
    from scipy import stats

    method = check_choice(method, "method", ("spearman", "kendall"))
    nan_policy = check_choice(nan_policy, "nan_policy", ("raise", "omit", "propagate"))
    check_bool(higher_is_uncertain, "higher_is_uncertain")
    p = as_vector(predicted, "predicted", allow_nan=True)
    t = as_vector(truth, "truth", length=p.size, length_of="predicted", allow_nan=True)
    bad = np.isnan(p) | np.isnan(t)
    if bad.any():
        if nan_policy == "raise":
            raise InputError(
                f"predicted/truth have {int(bad.sum())} NaN pair(s), first at index "
                f"{int(np.flatnonzero(bad)[0])}; pass nan_policy='omit' to drop them."
            )
        if nan_policy == "propagate":
            return RankCorrelation(math.nan, math.nan, method, p.size)
        p, t = p[~bad], t[~bad]
    if not higher_is_uncertain:
        p = -p
    if p.size < 2 or np.all(p == p[0]) or np.all(t == t[0]):
        warnings.warn(
            "rank_correlation: an input is constant (or has fewer than 2 values), so the "
            "correlation is undefined; returning NaN.",
            EmbedevalWarning,
            stacklevel=2,
        )
        return RankCorrelation(math.nan, math.nan, method, p.size)
    if method == "spearman":
        res = stats.spearmanr(p, t)
    else:
        res = stats.kendalltau(p, t, variant="b")
    return RankCorrelation(float(res.statistic), float(res.pvalue), method, p.size)


@dataclass(frozen=True)
class SigmaRegression:
    """Error of predicted against ground-truth sigmas, with optional bootstrap intervals."""

    mse: float
    mae: float
    rmse: float
    r2: float
    n: int
    ci: dict[str, tuple[float, float]]


def _regression_values(p: np.ndarray, t: np.ndarray) -> dict[str, float]:
    diff = p - t
    mse = float(np.mean(diff * diff))
    spread = float(np.sum((t - t.mean()) ** 2))
    r2 = 1.0 - float(np.sum(diff * diff)) / spread if spread > 0 else math.nan
    return {"mse": mse, "mae": float(np.mean(np.abs(diff))), "rmse": math.sqrt(mse), "r2": r2}


def sigma_regression(
    predicted: Any,
    truth: Any,
    *,
    ci: float | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> SigmaRegression:
    """MSE, MAE, RMSE and R² of predicted sigmas against ground-truth sigmas on one scale.

    Rank correlation (:func:`rank_correlation`) only asks whether the order is right; when both
    sigmas share a scale (e.g. both in [0, 1]) these also ask whether the values are.  With
    d_i = ŷ_i - y_i: MSE = (1/n) Σ d_i², MAE = (1/n) Σ |d_i|, RMSE = √MSE and
    R² = 1 - Σ d_i² / Σ (y_i - ȳ)² (``y`` = ``truth``), as scikit-learn's
    ``mean_squared_error``, ``mean_absolute_error`` and ``r2_score``.

    Parameters
    ----------
    predicted, truth : array-like of float
        Same length, finite.
    ci : float, optional
        Adds percentile bootstrap intervals (pairs resampled) at this level in ``.ci``.
    n_boot, seed : int
        Bootstrap resamples and the seed of ``numpy.random.default_rng``.

    Ties: none matter (no ranking).  Zero division: a constant ``truth`` makes R² undefined:
    NaN (scikit-learn's ``r2_score`` returns 1.0 or 0.0 there by default); NaN replicates are
    left out of R²'s interval.

    Examples
    --------
    >>> r = sigma_regression([0.1, 0.2, 0.4], [0.1, 0.3, 0.5])
    >>> round(r.mse, 6), round(r.mae, 6)   # d = 0, -0.1, -0.1
    (0.006667, 0.066667)
    >>> round(r.r2, 4)                     # 1 - 0.02 / (0.04 + 0 + 0.04)
    0.75
    """
    from ._resample import statistic_ci

    p = as_vector(predicted, "predicted")
    t = as_vector(truth, "truth", length=p.size, length_of="predicted")
    values = _regression_values(p, t)
    intervals: dict[str, tuple[float, float]] = {}
    if ci is not None:
        level = check_level(ci)
        n_boot = check_int(n_boot, "n_boot")
        seed = check_int(seed, "seed", minimum=0)
        intervals = statistic_ci(_regression_values, [p, t], ci=level, n_boot=n_boot, seed=seed)
    return SigmaRegression(**values, n=int(p.size), ci=intervals)


def hpd_interval(
    samples: Any, prob: float = 0.95, *, axis: int = -1
) -> tuple[np.ndarray, np.ndarray]:
    """Highest-density interval from posterior draws, vectorised over all other axes.

    The shortest interval holding m = ⌊p·n⌋ + 1 sorted draws (capped at n): among the windows
    [x_(i), x_(i+m-1)] the narrowest one (the first if several tie).

    Ties: equal widths keep the leftmost window.  Zero division: never (m >= 1 draw).  NaN or
    infinite draws are an error.

    Examples
    --------
    >>> lo, hi = hpd_interval([0.0, 1.0, 1.1, 1.2, 5.0], prob=0.5)
    >>> float(lo), float(hi)
    (1.0, 1.2)
    """
    prob = check_probability(prob, "prob")
    raw = np.asarray(samples)
    if raw.dtype == object or raw.dtype.kind not in "fiub":
        raise InputTypeError(f"samples must be numeric draws; got dtype {raw.dtype}.")
    if raw.ndim == 0:
        raise InputError("samples must be an array of draws (at least 1-D); got a scalar.")
    if not isinstance(axis, (int, np.integer)) or not -raw.ndim <= axis < raw.ndim:
        raise InputError(
            f"axis={axis!r} is out of range for samples of shape {raw.shape}; pass the axis "
            "that holds the draws (default -1)."
        )
    x = np.moveaxis(np.sort(raw.astype(np.float64), axis=axis), axis, -1)
    n = x.shape[-1]
    if n == 0:
        raise InputError("samples is empty along the given axis.")
    if not np.isfinite(x).all():
        raise InputError(
            f"samples has {int((~np.isfinite(x)).sum())} NaN or infinite draw(s); drop them first."
        )
    m = min(n, math.floor(prob * n) + 1)
    widths = x[..., m - 1 :] - x[..., : n - m + 1]
    start = np.argmin(widths, axis=-1)[..., None]
    low = np.take_along_axis(x, start, axis=-1)[..., 0]
    high = np.take_along_axis(x, start + m - 1, axis=-1)[..., 0]
    return low, high


def _real_array(value: Any, name: str) -> np.ndarray:
    """A float64 array of finite numbers >= 0 (a sigma or a kappa), or a clear error."""
    raw = np.asarray(value)
    if raw.dtype == object or raw.dtype.kind not in "fiub":
        raise InputTypeError(f"{name} must be numeric; got dtype {raw.dtype}.")
    arr = raw.astype(np.float64)
    bad = ~np.isfinite(arr) | (arr < 0)
    if bad.any():
        if arr.ndim == 0:
            raise InputError(f"{name} must be finite and >= 0; got {float(arr)}.")
        first = tuple(np.argwhere(bad)[0].tolist())
        raise InputError(
            f"{name} must be finite and >= 0; {int(bad.sum())} value(s) are not, first at "
            f"{first if len(first) > 1 else first[0]} ({arr[first]})."
        )
    return arr


def gaussian_credible_radius(sigma: Any, dim: int, prob: float = 0.95) -> np.ndarray:
    """Radius of the HPD ball of an isotropic Gaussian N(μ, σ² I_dim): r = σ·sqrt(χ²_dim(p)).

    ‖x − μ‖²/σ² follows χ² with ``dim`` degrees of freedom, so the ball of radius r holds
    probability p.  ``sigma`` may be an array (one radius per item); ``prob=1`` gives ``inf``.

    Examples
    --------
    >>> round(float(gaussian_credible_radius(1.0, 1, 0.95)), 4)   # the familiar 1.96
    1.96
    """
    from scipy.stats import chi2

    dim = check_int(dim, "dim")
    prob = check_probability(prob, "prob")
    sigma = _real_array(sigma, "sigma")
    return sigma * math.sqrt(chi2.ppf(prob, dim))


def _vmf_cap_one(kappa: float, dim: int, prob: float) -> float:
    """Cosine threshold t with P(μ·x >= t) = prob under vMF(κ) on S^(dim-1).

    With u = (1 - w)/2 ∈ [0, 1] the density of w = μ·x becomes ∝ exp(-2κu) u^a (1-u)^a,
    a = (dim-3)/2.  The mass is integrated in log space, scaled by its maximum and over a window
    holding all but ~e^-40 of it, so any κ (0 to 1e7) and any dim work; for dim = 2 (a = -1/2,
    integrable endpoint singularities) an algebraic quadrature weight takes the singular factor.
    """
    from scipy import integrate, optimize

    if prob >= 1:
        return -1.0
    a = (dim - 3) / 2
    k2 = 2.0 * kappa
    if a < 0:
        upper = 1.0 if k2 <= 50 else 60.0 / k2

        def head(x: float) -> float:  # ∫_0^x exp(-2κu) u^a (1-u)^a du, singular weight u^a
            return integrate.quad(
                lambda u: math.exp(-k2 * u) * (1 - u) ** a, 0, x, weight="alg", wvar=(a, 0)
            )[0]

        if upper < 1.0:
            total = head(upper)
            mass = head
        else:
            total = integrate.quad(lambda u: math.exp(-k2 * u), 0, 1, weight="alg", wvar=(a, a))[0]

            def mass(x: float) -> float:
                if x <= 0.5:
                    return head(x)
                tail = integrate.quad(
                    lambda u: math.exp(-k2 * u) * u**a, x, 1, weight="alg", wvar=(0, a)
                )[0]
                return total - tail

        lo = 0.0
    else:
        if a == 0:
            mode, sd = 0.0, 1.0 / k2 if k2 > 0 else 1.0
        else:
            b = k2 + 2 * a
            mode = 0.5 if k2 == 0 else (b - math.sqrt(b * b - 4 * k2 * a)) / (2 * k2)
            sd = 1.0 / math.sqrt(a / mode**2 + a / (1 - mode) ** 2)
        lo = max(0.0, mode - 40 * sd)
        upper = min(1.0, mode + 40 * sd + 40 / max(k2, 1e-300))

        def log_density(u: float) -> float:
            return -k2 * u + (a * (math.log(u) + math.log1p(-u)) if a else 0.0)

        peak = log_density(mode) if a == 0 or 0 < mode < 1 else 0.0

        def f(u: float) -> float:
            if a and not 0 < u < 1:
                return 0.0
            return math.exp(log_density(u) - peak)

        def mass(x: float) -> float:
            if x <= lo:
                return 0.0
            points = [mode] if lo < mode < x else None
            return integrate.quad(f, lo, x, points=points, limit=200, epsabs=0, epsrel=1e-11)[0]

        total = mass(upper)
    x = optimize.brentq(lambda x: mass(x) / total - prob, lo, upper, xtol=1e-15, rtol=1e-13)
    return 1.0 - 2.0 * x


def vmf_credible_cap(kappa: Any, dim: int, prob: float = 0.95) -> np.ndarray:
    """Cosine threshold t of the HPD cap {x : μ·x >= t} of a von Mises-Fisher on S^(dim-1).

    The density of w = μ·x is ∝ exp(κ w) (1 - w²)^((dim-3)/2) on [-1, 1] and increases with w,
    so the highest-density region is a cap; t solves P(w >= t) = prob (adaptive quadrature in
    log space and root finding, per κ; accurate to ~1e-12 for κ from 0 to 1e7).  dim = 3 has
    the closed form t = 1 + log(1 - p(1 - e^(-2κ)))/κ; dim = 2 is the von Mises law on the
    circle.  ``prob=1`` gives -1 (the whole sphere).

    Examples
    --------
    >>> round(float(vmf_credible_cap(0.0, 3, 0.5)), 6)   # uniform on the sphere: half above 0
    0.0
    >>> round(float(vmf_credible_cap(1000.0, 3, 0.9)), 6)   # 1 + log(1 - 0.9)/1000
    0.997697
    """
    dim = check_int(dim, "dim", minimum=2)
    prob = check_probability(prob, "prob")
    kappa = _real_array(kappa, "kappa")
    unique, inverse = np.unique(kappa, return_inverse=True)  # one root solve per distinct κ
    caps = np.array([_vmf_cap_one(float(k), dim, prob) for k in unique])
    return caps[inverse].reshape(kappa.shape)


@dataclass(frozen=True)
class CoverageCurve:
    """Empirical coverage of credible regions at each nominal level."""

    nominal: np.ndarray
    empirical: np.ndarray
    n_queries: int

    def plot(self, ax: Any = None, label: str | None = None) -> Any:
        """Draw coverage against the nominal level with the diagonal (see embedeval.plots)."""
        from .plots import plot_coverage

        return plot_coverage(self, ax=ax, label=label)


def credible_coverage(
    embeddings: Any,
    labels: Any,
    uncertainty: Any,
    *,
    model: str = "gaussian",
    levels: Any = (0.5, 0.8, 0.9, 0.95, 0.99),
) -> CoverageCurve:
    """Fraction of same-class references inside each query's credible region, per level.

    ``model="gaussian"``: ``uncertainty`` is σ and the region is the ball of radius
    :func:`gaussian_credible_radius` around the query (Euclidean).  ``model="vmf"``:
    ``uncertainty`` is κ and the region is the cap :func:`vmf_credible_cap` around the
    normalised query (cosine).  Leave-one-out: a query's own row is not counted; lone queries
    are skipped.  Well-calibrated uncertainties put the curve on the diagonal.

    Ties: a reference exactly on the region's boundary counts as inside.  Zero division: lone
    queries (no other member of the class) are skipped; all lone is an error.

    Examples
    --------
    >>> cov = credible_coverage([[0.0], [0.5], [3.0]], [0, 0, 0], [1.0, 1.0, 1.0], levels=[0.5])
    >>> cov.empirical.tolist()   # radius 0.674: only the pair 0 / 0.5 is inside
    [0.3333333333333333]
    """
    from ._validation import as_embeddings, as_labels, factorize

    model = check_choice(model, "model", ("gaussian", "vmf"))
    x = as_embeddings(embeddings, "embeddings").astype(np.float64)
    y = as_labels(labels, "labels", length=x.shape[0], length_of="embeddings")
    u = as_vector(uncertainty, "uncertainty", length=x.shape[0], length_of="embeddings")
    levels = np.asarray([check_probability(p, "levels") for p in np.atleast_1d(levels)])
    (codes,), _ = factorize(y)
    if model == "vmf":
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
        thresholds = np.stack([vmf_credible_cap(u, x.shape[1], p) for p in levels], axis=1)
    else:
        thresholds = np.stack([gaussian_credible_radius(u, x.shape[1], p) for p in levels], axis=1)
    fractions = []
    for c in np.unique(codes):  # one class at a time: only same-class pairs are needed
        members = np.flatnonzero(codes == c)
        if members.size < 2:
            continue
        xc = x[members]
        sq_norms = (xc * xc).sum(1)
        counts = np.empty((members.size, levels.size))
        # Row blocks keep memory at block x class size (a large class would not fit at once).
        step = max(1, 2**22 // max(members.size * levels.size, 1))
        for lo in range(0, members.size, step):
            rows = slice(lo, lo + step)
            gram = xc[rows] @ xc.T
            if model == "vmf":
                inside = gram[:, :, None] >= thresholds[members[rows]][:, None, :]
            else:
                sq = np.maximum(sq_norms[rows, None] + sq_norms[None, :] - 2 * gram, 0)
                inside = np.sqrt(sq)[:, :, None] <= thresholds[members[rows]][:, None, :]
            own = np.arange(inside.shape[0])
            inside[own, own + lo] = False  # not the query itself
            counts[rows] = inside.sum(axis=1)
        fractions.append(counts / (members.size - 1))
    if not fractions:
        raise InputError("every query is lone (no other member of its class); no coverage.")
    per_query = np.concatenate(fractions)
    return CoverageCurve(levels, per_query.mean(axis=0), per_query.shape[0])


def confidence_summary(
    per_query: dict[str, np.ndarray],
    confidence: Any,
    *,
    higher_is_confident: bool = True,
    labels: Any = None,
    integration: str = "mean",
    bins: int = 10,
) -> dict[str, float]:
    """Confidence metrics for every per-query metric (what ``evaluate(confidences=...)`` adds).

    For each metric m: ``auerc_m``, ``oracle_auerc_m``, ``random_auerc_m``, ``excess_auerc_m``,
    and ``aurc_m``, ``eaurc_m``, ``augrc_m`` (:func:`error_reject_curve` with ``integration``).
    From ``precision_at_1`` (else ``recall_at_1``), the 0/1 correctness c:

    * ``r_auroc`` and ``best_threshold_accuracy``;
    * when the confidences lie in [0, 1] and ``higher_is_confident`` (a predicted probability
      of being right): ``ece``, ``ece_equal_mass``, ``mce`` and ``brier`` with ``bins`` bins,
      and with ``labels`` (one per query) ``classwise_ece`` (see :mod:`embedeval.calibration`);
    * when some queries are lone and some are not: ``open_set_auroc`` and
      ``open_set_fpr_at_95tpr``, reading the lone queries (no same-class reference) as
      out-of-gallery and the others as enrolled (see :mod:`embedeval.openset`).

    NaN entries (lone queries) are dropped per metric, as in :func:`error_reject_curve`;
    ``evaluate`` reports how many in ``result.n_lone``.  Ties and zero division follow the
    functions above (``r_auroc`` is NaN when every query is right or every query is wrong).

    Examples
    --------
    >>> out = confidence_summary({"precision_at_1": [1.0, 0.0, 1.0, float("nan")]},
    ...                          [0.9, 0.1, 0.8, 0.5])
    >>> round(out["auerc_precision_at_1"], 4), out["r_auroc"]   # (0 + 0 + 1/3) / 3
    (0.1111, 1.0)
    >>> round(out["augrc_precision_at_1"], 4)                    # (0 + 0 + 1/3) / 3
    0.1111
    >>> out["open_set_auroc"]      # the lone query (0.5) is below 2 of the 3 enrolled
    0.6666666666666666
    """
    out = _erc_summary(per_query, confidence, higher_is_confident, integration)
    key = next((k for k in ("precision_at_1", "recall_at_1") if k in per_query), None)
    if key is not None and not np.all(np.isnan(per_query[key])):
        out.update(
            _correctness_summary(per_query[key], confidence, higher_is_confident, labels, bins)
        )
    return out


_SUMMARY_AREAS = ("auerc", "oracle_auerc", "random_auerc", "excess_auerc", "aurc", "eaurc", "augrc")


def _erc_summary(
    per_query: dict[str, np.ndarray], confidence: Any, higher_is_confident: bool, integration: str
) -> dict[str, float]:
    """The error-reject areas of every metric; metrics that leave out the same (lone) queries
    share one sort and one pass (:func:`erc_areas` over a matrix)."""
    columns = {
        name: np.asarray(v, dtype=np.float64)
        for name, v in per_query.items()
        if not np.all(np.isnan(np.asarray(v, dtype=np.float64)))
    }
    if not columns:
        return {}
    names = list(columns)
    values = np.stack([columns[m] for m in names], axis=1)
    mask = np.isnan(values)
    if (mask != mask[:, :1]).any():  # metrics that drop different queries: one curve each
        areas = {}
        for name in names:
            erc = error_reject_curve(
                columns[name],
                confidence,
                higher_is_confident=higher_is_confident,
                integration=integration,
            )
            areas.update({f"{a}_{name}": float(getattr(erc, a)) for a in _SUMMARY_AREAS})
        return areas
    for j, name in enumerate(names):  # the checks (range, lengths) of error_reject_curve
        _, conf, _ = _scores_and_confidence(values[:, j], confidence, higher_is_confident, name)
    areas = erc_areas(1.0 - values[~mask[:, 0]], conf, integration)
    return {f"{a}_{m}": float(areas[a][j]) for a in _SUMMARY_AREAS for j, m in enumerate(names)}


def _correctness_summary(
    correct: Any, confidence: Any, higher_is_confident: bool, labels: Any, bins: int
) -> dict[str, float]:
    from .calibration import calibration_summary
    from .openset import open_set_detection

    out: dict[str, float] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EmbedevalWarning)
        out["r_auroc"] = confidence_auroc(
            correct, confidence, higher_is_confident=higher_is_confident
        )
    out["best_threshold_accuracy"] = best_threshold_accuracy(
        correct, confidence, higher_is_confident=higher_is_confident
    )
    s = np.asarray(correct, dtype=np.float64)
    c = np.asarray(confidence, dtype=np.float64)
    if higher_is_confident and c.min() >= 0 and c.max() <= 1:
        cal = calibration_summary(s, c, labels=labels, bins=bins)
        out.update({k: float(v) for k, v in cal.items()})
    lone = np.isnan(s)
    if lone.any() and not lone.all():
        det = open_set_detection(~lone, c, higher_is_confident=higher_is_confident)
        out["open_set_auroc"] = det["auroc"]
        out["open_set_fpr_at_95tpr"] = det["fpr_at_tpr"]
    return out
