"""The threshold counts behind every ROC and precision-recall curve, the one AUROC, and the one
rule for single-class input.

A binary score vector (is the item positive, how high is its score) is read at one threshold per
distinct score: a tie block crosses every threshold together.  :func:`threshold_counts` gives the
cumulative true and false positives there; :mod:`embedeval.metrics.classification` and
:mod:`embedeval.metrics.ranking` draw their curves from them.  :func:`auroc` is the Mann-Whitney
AUROC used
by :mod:`embedeval.metrics.classification`, :mod:`embedeval.metrics.selective` and
:mod:`embedeval.metrics.openset`.

Single-class rule: a value that needs both classes (AUROC, a ROC curve's TPR and FPR) or a
positive (average precision, a PR curve's recall) is undefined on single-class input.  It is NaN,
announced by an :class:`~embedeval.EmbedevalWarning` from :func:`warn_single_class`, never an
exception: a bootstrap resample or a cross-validation fold may legitimately hold one class.
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any

import numpy as np

from ..utils.errors import EmbedevalWarning, InputError
from ..utils.validation import host_array

__all__ = [
    "auroc",
    "exact_number",
    "refuse_merged_integers",
    "threshold_counts",
    "warn_single_class",
]


def warn_single_class(
    what: str,
    n_positive: int,
    n_negative: int,
    classes: str = "positive and negative items",
    stacklevel: int = 3,
) -> None:
    """Warn that ``what`` is NaN because the input holds a single class."""
    warnings.warn(
        f"{what} needs both {classes}; got {n_positive} and {n_negative}, so it is undefined "
        "(single-class input): NaN.",
        EmbedevalWarning,
        stacklevel=stacklevel,
    )


def refuse_merged_integers(scores: Any, name: str) -> None:
    """Refuse integer scores that float64 cannot tell apart (beyond 2**53), row by row.

    Scores are compared as float64; two distinct integers that round to one float would
    silently become a tie and change every tie-sensitive value, so they are an error.  Only the
    last axis is compared (a query's items, a sample's classes).

    >>> refuse_merged_integers(np.array([2**53, 2**53 + 2]), "y_score")  # exact: no error
    """
    try:  # a torch tensor (with grad, on a GPU) as its host copy, as the checks read it
        raw = np.asarray(host_array(scores))
    except (TypeError, ValueError):
        return  # not an array of numbers: the caller's own check names the problem
    if raw.size == 0:
        return
    if raw.dtype.kind == "f" and isinstance(scores, (list, tuple)) and np.abs(raw).max() >= 2**53:
        # A list mixing ints and floats became float64 at once: read its values exactly.
        raw = np.frompyfunc(exact_number, 1, 1)(np.array(scores, dtype=object))
    elif raw.dtype.kind not in "iu":
        return
    if raw.max() <= 2**53 and (raw.dtype.kind == "u" or raw.min() >= -(2**53)):
        return
    srt = np.sort(raw, axis=-1)
    as_float = srt.astype(np.float64)
    distinct = (srt[..., 1:] != srt[..., :-1]).astype(bool)  # exact, object arrays too
    merged = distinct & (as_float[..., 1:] == as_float[..., :-1])
    if merged.any():
        where = tuple(np.argwhere(merged)[0].tolist())
        low, high = srt[where], srt[(*where[:-1], where[-1] + 1)]
        raise InputError(
            f"{name} holds the distinct integers {low} and {high}, which are equal as float64 "
            "(integers beyond 2**53 lose precision), so they would tie; subtract an offset or "
            "pass their ranks (scipy.stats.rankdata)."
        )


def exact_number(value: Any) -> int | float:
    """A number as a Python int (an integer of any size, exactly) or float: Python compares the
    two exactly, NumPy through float64.

    >>> exact_number(np.int64(2**53 + 1)) == exact_number(float(2**53))
    False
    """
    if isinstance(value, numbers.Integral):
        return int(value)
    return float(value)


def threshold_counts(
    positive: np.ndarray, score: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cumulative (true positives, false positives, threshold) at each distinct score.

    Thresholds decrease; at threshold t an item is predicted positive when its score >= t, so
    TP(t) = #{positive, score >= t} and FP(t) = #{negative, score >= t}.  Ties: a block of equal
    scores is one threshold (it enters as a whole).

    Examples
    --------
    >>> tp, fp, th = threshold_counts(np.array([1, 0, 1]), np.array([0.9, 0.5, 0.5]))
    >>> tp.tolist(), fp.tolist(), th.tolist()
    ([1, 2], [0, 1], [0.9, 0.5])
    """
    order = np.argsort(-score, kind="stable")
    s_sorted, t_sorted = score[order], positive[order]
    ends = np.flatnonzero(np.append(s_sorted[1:] != s_sorted[:-1], True))
    tps = np.cumsum(t_sorted)[ends]
    fps = (ends + 1) - tps
    return tps, fps, s_sorted[ends]


def auroc(
    positive: np.ndarray,
    score: np.ndarray,
    what: str = "AUROC",
    classes: str = "positive and negative items",
) -> float:
    """Area under the ROC curve as the Mann-Whitney probability, ties counted half.

    AUROC = P(s⁺ > s⁻) + ½ P(s⁺ = s⁻) = (Σ ranks of the positives − n₁(n₁+1)/2) / (n₁ n₀) with
    average ranks for ties, which is the trapezoid area under the ROC curve drawn through one
    point per distinct score, and scikit-learn's ``roc_auc_score``.  ``positive`` is boolean.
    Single-class input (n₁ = 0 or n₀ = 0): NaN and a warning naming ``what`` and ``classes``.

    Examples
    --------
    >>> auroc(np.array([True, True, False, False]), np.array([0.9, 0.5, 0.5, 0.1]))
    0.875
    """
    from scipy.stats import rankdata

    n1 = int(positive.sum())
    n0 = positive.size - n1
    if n1 == 0 or n0 == 0:
        warn_single_class(what, n1, n0, classes, stacklevel=4)
        return math.nan
    ranks = rankdata(score)
    return float((ranks[positive].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))
