"""Building blocks shared by the confidence modules: checked (score, confidence) pairs, 0/1
correctness, confidence bins and tie-averaged sums of kept errors.

:mod:`embedeval.metrics.selective`, :mod:`embedeval.metrics.calibration` and
:mod:`embedeval.metrics.openset` build on
these; nothing here imports another module of the package but the validation helpers and
:mod:`~embedeval.metrics.curves`.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from ..utils.errors import InputError
from ..utils.validation import as_vector, check_bool
from .curves import refuse_merged_integers

__all__ = [
    "bin_index",
    "binary_correct",
    "calibration_edges",
    "kept_error_sums",
    "scores_and_confidence",
    "uniform_edges",
]


def scores_and_confidence(
    scores: Any, confidence: Any, higher_is_confident: bool, name: str = "scores"
) -> tuple[np.ndarray, np.ndarray, int]:
    """Checked per-query scores in [0, 1] and oriented confidences, NaN scores dropped.

    Returns ``(scores, confidence, n_dropped)``: the confidence is negated when
    ``higher_is_confident`` is False, so that larger always means more confident.

    Examples
    --------
    >>> s, c, dropped = scores_and_confidence([1.0, float("nan"), 0.0], [3, 2, 1], False)
    >>> s.tolist(), c.tolist(), dropped
    ([1.0, 0.0], [-3.0, -1.0], 1)
    """
    check_bool(higher_is_confident, "higher_is_confident")
    s = as_vector(scores, name, allow_nan=True)
    # compared as float64: distinct integers that round to one float would silently tie
    refuse_merged_integers(confidence, "confidence")
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


def binary_correct(s: np.ndarray) -> np.ndarray:
    """``s == 1`` for 0/1 scores; any other value is an error naming the first one.

    >>> binary_correct(np.array([1.0, 0.0])).tolist()
    [True, False]
    """
    if not np.isin(s, (0.0, 1.0)).all():
        i = int(np.flatnonzero(~np.isin(s, (0.0, 1.0)))[0])
        raise InputError(
            f"correct must be 0/1 (is the query right, e.g. per_query['precision_at_1']); "
            f"correct[{i}] = {s[i]}. Threshold a graded metric first, e.g. map_at_r >= 0.5."
        )
    return s == 1.0


def bin_index(c: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin of each value: right-closed bins (a, b], the first bin also holds its left edge.

    >>> bin_index(np.array([0.0, 0.5, 0.51, 1.0]), np.array([0.0, 0.5, 1.0])).tolist()
    [0, 0, 1, 1]
    """
    idx = np.searchsorted(edges, c, side="left") - 1
    return np.clip(idx, 0, edges.size - 2)


def uniform_edges(lo: float, hi: float, bins: int) -> np.ndarray:
    """Edges of ``bins`` equal-width bins of [lo, hi]: e_k = lo + (hi - lo)·k / bins.

    Each edge is worked out exactly from ``lo`` and ``hi`` as they print (their shortest
    decimal form, e.g. 0.7 is read as 7/10, not as the binary float just below it) and
    rounded once to the nearest float.  So a confidence on a decimal grid ([0, 0.7] in
    sevenths has the edges 0.1, ..., 0.6) or on a fraction grid (k / bins of [0, 1], e.g. a
    vote fraction 5/6) equals its edge and, bins being right-closed, goes to the lower bin.
    ``np.linspace`` adds k rounded steps and can land one ulp off (its 5/6 is below 5/6).

    >>> uniform_edges(0.0, 0.7, 7).tolist()
    [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    >>> bool(uniform_edges(0.0, 1.0, 6)[5] == 5 / 6)
    True
    """
    start = Fraction(repr(float(lo)))
    width = Fraction(repr(float(hi))) - start
    return np.array([float(start + width * Fraction(k, bins)) for k in range(bins + 1)])


def calibration_edges(c: np.ndarray, bins: int, strategy: str) -> np.ndarray:
    """Bin edges: ``bins`` equal-width bins of [0, 1] (``"uniform"``) or equal-mass edges.

    Equal width: the floats k / bins, k = 0..bins (as :func:`uniform_edges`).  Equal mass: the
    quantiles of ``c`` at the levels k / bins (numpy's linear rule), de-duplicated so that tied
    values share a bin (fewer bins when heavily tied); as the levels are exactly k / bins, an
    edge whose position (n - 1)·k / bins is a whole number is exactly that sorted value.

    >>> calibration_edges(np.array([0.1, 0.2, 0.7, 0.8]), 2, "quantile").tolist()
    [0.1, 0.45, 0.8]
    """
    # Integers divided once: IEEE division rounds each k / bins correctly (no Fraction needed).
    levels = np.arange(bins + 1, dtype=np.float64) / bins
    if strategy == "uniform":
        return levels
    edges = np.quantile(c, levels)
    # numpy's position is the float (k / bins)·(n - 1), which can land an ulp below a whole
    # (n - 1)·k / bins (23·(13/23) = 12.999999999999998): the edge would then sit an ulp below
    # the sorted value and push it into the next bin.  Whole positions are found on integers.
    k = np.arange(bins + 1)
    whole = (c.size - 1) * k % bins == 0
    edges[whole] = np.sort(c)[(c.size - 1) * k[whole] // bins]
    return np.unique(edges)


def kept_error_sums(error: np.ndarray, confidence: np.ndarray) -> np.ndarray:
    """Sum of the errors of the k most confident queries, k = 1..n, tied blocks averaged.

    For k inside a block of equal confidence the kept part of the block contributes its share of
    the block's mean error: the expectation over every order of the tied queries.  ``error`` may
    be 2-D (one column per metric, the same queries): every column is done in the same pass.

    Examples
    --------
    >>> kept_error_sums(np.array([1.0, 0.0, 1.0]), np.array([0.9, 0.5, 0.5])).tolist()
    [1.0, 1.5, 2.0]
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
