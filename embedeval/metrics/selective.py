"""Selective prediction: does a model's confidence rank its own errors?

The error-versus-reject (risk-coverage) curve and its areas, the AUROC of correctness against
confidence, and the best accuracy of a confidence threshold.

Conventions: a **confidence** c_i is larger when the model is more certain (a vMF kappa, a
softmax max); pass ``higher_is_confident=False`` for an uncertainty (a sigma).  Scores m_i are
per-query metric values in [0, 1] (``result.per_query["precision_at_1"]`` or ``["map_at_r"]``);
the error is e_i = 1 - m_i.  NaN scores (lone queries) are dropped and counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..utils.validation import check_choice, check_probability
from .curves import auroc
from .scores import binary_correct, kept_error_sums, scores_and_confidence

__all__ = [
    "ErrorRejectCurve",
    "best_threshold_accuracy",
    "confidence_auroc",
    "erc_areas",
    "error_reject_curve",
]


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
        from ..plots import plot_error_reject_curve

        return plot_error_reject_curve(self, ax=ax, label=label)


def erc_areas(error: np.ndarray, confidence: np.ndarray, integration: str) -> dict[str, Any]:
    """Every area of the error-reject curve, per column of ``error`` (n queries x m metrics).

    ``confidence`` is oriented (higher = more confident) and NaN-free; see
    :func:`error_reject_curve` for the definitions.  Returns arrays of length m keyed by the
    :class:`ErrorRejectCurve` attribute names, plus the curves ``kept_mean`` / ``oracle_mean``.
    """
    n = error.shape[0]
    k = np.arange(1, n + 1)[:, None]
    e = error.reshape(n, -1)
    kept_sum = kept_error_sums(e, confidence)
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
    s, c, dropped = scores_and_confidence(scores, confidence, higher_is_confident)
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


def confidence_auroc(correct: Any, confidence: Any, *, higher_is_confident: bool = True) -> float:
    """R-AUROC: AUROC of "the query is correct" (e.g. R@1) against its confidence.

    The probability that a correct query is more confident than an incorrect one, ties counted
    half (Mann-Whitney, :func:`embedeval.metrics.classification.roc_auc` on the same inputs).

    ``correct`` must be 0/1 (a graded metric such as MAP@R must be thresholded first).
    R-AUROC = (Σ ranks of the correct − n₁(n₁+1)/2) / (n₁ n₀) with average ranks for ties, which
    is scikit-learn's ``roc_auc_score(correct, confidence)``.  Single-class input (all correct or
    all wrong): NaN and an :class:`~embedeval.EmbedevalWarning`, the package's one rule.

    Examples
    --------
    >>> confidence_auroc([1, 1, 0, 0], [0.9, 0.5, 0.5, 0.1])
    0.875
    """
    s, c, _ = scores_and_confidence(correct, confidence, higher_is_confident, "correct")
    return auroc(binary_correct(s), c, "confidence_auroc", "correct and incorrect queries")


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
    s, c, _ = scores_and_confidence(correct, confidence, higher_is_confident, "correct")
    positive = binary_correct(s)
    order = np.argsort(-c, kind="stable")
    c_sorted, p_sorted = c[order], positive[order]
    last_of_block = np.append(c_sorted[1:] != c_sorted[:-1], True)
    tp = np.cumsum(p_sorted)[last_of_block]  # predicted correct: everything at or above c
    fp = np.cumsum(~p_sorted)[last_of_block]
    tn = (~positive).sum() - fp
    accuracy = np.append((tp + tn) / s.size, (~positive).sum() / s.size)
    return float(accuracy.max())
