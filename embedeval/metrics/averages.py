"""Averages of per-query metric values: micro (over queries) or macro (over classes), and the
per-class means, for one label per query or several (a 2-D indicator array).  Queries whose value
is NaN (lone queries) are left out of every mean."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..utils.validation import label_keys

__all__ = ["aggregate", "aggregate_label_sets"]


def aggregate_label_sets(
    values: np.ndarray, indicator: np.ndarray, average: str
) -> tuple[float, dict[Any, float]]:
    """:func:`aggregate` for multi-label queries (``indicator``: bool, queries x labels): a
    query counts in the class of each of its labels; micro is the mean over queries, macro
    the mean of the per-label means; per-class means are keyed by label column.

    >>> v = np.array([1.0, 0.0, 0.5, np.nan])
    >>> ind = np.array([[1, 0], [1, 1], [0, 1], [1, 1]], dtype=bool)
    >>> aggregate_label_sets(v, ind, "macro")  # label 0: (1 + 0) / 2, label 1: (0 + 0.5) / 2
    (0.375, {0: 0.5, 1: 0.25})
    """
    ok = ~np.isnan(values)
    if not ok.any():
        return float("nan"), {}
    query, label = np.nonzero(np.asarray(indicator)[ok])
    n_labels = indicator.shape[1]
    sums = np.bincount(label, weights=values[ok][query], minlength=n_labels)
    counts = np.bincount(label, minlength=n_labels)
    present = np.flatnonzero(counts)
    class_means = sums[present] / counts[present]
    per_class = dict(zip(present.tolist(), class_means.tolist(), strict=True))
    if average == "macro":
        return float(class_means.mean()) if present.size else float("nan"), per_class
    return float(values[ok].mean()), per_class


def aggregate(
    values: np.ndarray, codes: np.ndarray, uniques: np.ndarray, average: str
) -> tuple[float, dict[Any, float]]:
    """The mean of the non-NaN values (micro) or of the per-class means (macro), and the
    per-class means keyed by label.

    Examples
    --------
    >>> v, codes = np.array([1.0, 0.0, 0.0, np.nan]), np.array([0, 0, 1, 1])
    >>> aggregate(v, codes, np.array(["a", "b"]), "micro")[0]  # (1 + 0 + 0) / 3
    0.3333333333333333
    >>> aggregate(v, codes, np.array(["a", "b"]), "macro")  # (0.5 + 0) / 2
    (0.25, {'a': 0.5, 'b': 0.0})
    """
    ok = ~np.isnan(values)
    if not ok.any():
        return float("nan"), {}
    n_classes = uniques.size
    sums = np.bincount(codes[ok], weights=values[ok], minlength=n_classes)
    counts = np.bincount(codes[ok], minlength=n_classes)
    present = np.flatnonzero(counts)
    class_means = sums[present] / counts[present]
    # The keys label_sizes counts class sizes under (one rule for both tables' keys).
    keys = label_keys(uniques[present])
    per_class = dict(zip(keys, class_means.tolist(), strict=True))
    value = float(class_means.mean()) if average == "macro" else float(values[ok].mean())
    return value, per_class
