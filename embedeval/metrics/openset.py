"""Open-set retrieval: does the confidence flag queries whose class is not in the gallery?

``in_gallery[i]`` is 1 for an enrolled query (its class has references) and 0 for an
out-of-gallery one.  A useful confidence is high on the first and low on the second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..utils.errors import InputError
from ..utils.validation import as_vector, check_bool, check_probability
from .curves import auroc, refuse_merged_integers, warn_single_class
from .scores import kept_error_sums

__all__ = ["OpenSetCurve", "open_set_detection", "open_set_reject_curve"]


def _enrolled_and_confidence(
    in_gallery: Any, confidence: Any, higher_is_confident: bool
) -> tuple[np.ndarray, np.ndarray]:
    check_bool(higher_is_confident, "higher_is_confident")
    g = as_vector(in_gallery, "in_gallery")
    if not np.isin(g, (0.0, 1.0)).all():
        raise InputError(
            "in_gallery must be 0/1 (1 = the query's class is in the gallery); got "
            f"{g[~np.isin(g, (0.0, 1.0))][0]}."
        )
    # compared as float64: distinct integers that round to one float would silently tie
    refuse_merged_integers(confidence, "confidence")
    c = as_vector(confidence, "confidence", length=g.size, length_of="in_gallery")
    return g == 1.0, (c if higher_is_confident else -c)


def open_set_detection(
    in_gallery: Any,
    confidence: Any,
    *,
    tpr: float = 0.95,
    higher_is_confident: bool = True,
) -> dict[str, float]:
    """AUROC and FPR at a TPR of the confidence separating enrolled from out-of-gallery queries.

    Positives are the enrolled queries; a query is accepted when ``confidence >= t``.  At a
    threshold t, TPR(t) = share of enrolled queries with c >= t and FPR(t) = share of
    out-of-gallery queries with c >= t.

    * ``auroc`` = P(c_enrolled > c_out) + ½ P(c_enrolled = c_out) (Mann-Whitney, ties half):
      scikit-learn's ``roc_auc_score(in_gallery, confidence)``.
    * ``fpr_at_tpr``: thresholds run over the distinct confidences (no interpolation between
      ROC points); the largest t with TPR(t) >= ``tpr`` is taken and FPR(t) reported, i.e. the
      smallest FPR among the ROC points whose TPR reaches ``tpr``.  ``threshold`` is that t,
      in the units given (with ``higher_is_confident=False`` a sigma: accept when sigma <= t).

    Ties: a block of equal confidences is accepted or rejected as a whole (no point of the ROC
    curve splits it).  Zero division: without enrolled or without out-of-gallery queries both
    values are NaN, with a warning.

    Examples
    --------
    >>> out = open_set_detection([1, 1, 1, 0, 0], [0.9, 0.8, 0.3, 0.5, 0.1], tpr=0.6)
    >>> out["auroc"]                 # 5 of the 6 (enrolled, out) pairs ordered right
    0.8333333333333334
    >>> out["fpr_at_tpr"], out["threshold"]   # t = 0.8 accepts 2/3 enrolled, 0/2 out
    (0.0, 0.8)
    """
    enrolled, c = _enrolled_and_confidence(in_gallery, confidence, higher_is_confident)
    level = check_probability(tpr, "tpr")
    n1, n0 = int(enrolled.sum()), int((~enrolled).sum())
    if n1 == 0 or n0 == 0:
        warn_single_class("open_set_detection", n1, n0, "enrolled and out-of-gallery queries")
        return {"auroc": math.nan, "fpr_at_tpr": math.nan, "threshold": math.nan}
    values = np.unique(c)[::-1]  # candidate thresholds, highest first
    tpr_at = np.searchsorted(np.sort(c[enrolled]), values, side="left")
    tpr_at = (n1 - tpr_at) / n1  # share of enrolled with c >= t
    first = int(np.flatnonzero(tpr_at >= level - 1e-12)[0])
    t = values[first]
    fpr = float(np.sum(c[~enrolled] >= t) / n0)
    shown = float(t if higher_is_confident else -t)
    return {"auroc": auroc(enrolled, c), "fpr_at_tpr": fpr, "threshold": shown}


@dataclass(frozen=True)
class OpenSetCurve:
    """Open-set error against the rejected fraction (see :func:`open_set_reject_curve`)."""

    rejected: np.ndarray
    error: np.ndarray
    oracle_error: np.ndarray
    area: float
    oracle_area: float
    n: int


def open_set_reject_curve(
    scores: Any,
    in_gallery: Any,
    confidence: Any,
    *,
    higher_is_confident: bool = True,
) -> OpenSetCurve:
    """Error-versus-reject curve where rejecting an out-of-gallery query is a right decision.

    Every query gets a decision: answered (kept) or rejected.  The cost of a kept enrolled
    query is its error 1 - score; a kept out-of-gallery query returns someone who is not the
    person (cost 1); a rejected out-of-gallery query is correct (cost 0); a rejected enrolled
    query is a missed answer (cost 1).  Rejecting the j least confident queries gives
    error_j = (1/n) Σ_i cost_i over all n queries, j = 0 .. n.  ``area`` is the mean of
    error_j over j = 0 .. n (lower is better); the oracle rejects in the order of the gain
    (cost kept - cost rejected), the best possible order.

    ``scores`` are per-query values in [0, 1] of the enrolled queries (e.g. precision_at_1);
    their value on out-of-gallery queries is ignored (NaN allowed there, not infinity).  Ties:
    a tied block cut by j contributes its mean gain per query (the expectation over orders of
    the block), as :func:`embedeval.metrics.selective.error_reject_curve`.  Zero division: never.

    Examples
    --------
    >>> cur = open_set_reject_curve([1, 0, 0, 0], [1, 1, 0, 0], [0.9, 0.2, 0.5, 0.1])
    >>> cur.error.tolist()   # reject none, 0.1 (out), 0.2 (wrong), 0.5 (out), 0.9 (right)
    [0.75, 0.5, 0.5, 0.25, 0.5]
    """
    enrolled, c = _enrolled_and_confidence(in_gallery, confidence, higher_is_confident)
    raw = as_vector(scores, "scores", length=enrolled.size, length_of="in_gallery", allow_nan=True)
    s = np.where(enrolled, raw, 0.0)
    bad = np.isnan(s) | (s < 0) | (s > 1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"scores must be finite values in [0, 1] for every enrolled query; scores[{i}] = "
            f"{float(raw[i])} of an enrolled query ({int(bad.sum())} such). NaN is allowed only "
            "where in_gallery is 0."
        )
    keep_cost = np.where(enrolled, 1.0 - s, 1.0)
    reject_cost = np.where(enrolled, 1.0, 0.0)
    gain = keep_cost - reject_cost  # added cost of keeping rather than rejecting
    n = gain.size
    base = reject_cost.sum()
    # kept k most confident: cost = base + Σ_kept gain; k = n - j
    kept = np.concatenate(([0.0], kept_error_sums(gain, c)))
    oracle = np.concatenate(([0.0], np.cumsum(np.sort(gain))))
    error = (base + kept[::-1]) / n
    oracle_error = (base + oracle[::-1]) / n
    return OpenSetCurve(
        rejected=np.arange(n + 1) / n,
        error=error,
        oracle_error=oracle_error,
        area=float(error.mean()),
        oracle_area=float(oracle_error.mean()),
        n=n,
    )
