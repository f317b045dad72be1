"""Rejection that removes items from queries and gallery alike (the face-recognition protocol).

Unlike the error-reject curve of :mod:`embedeval.confidence`, which drops queries from the
average and keeps the gallery whole, a rejected item here can no longer be anyone's neighbour,
so every metric is recomputed on what remains.  This module sits above
:func:`embedeval.evaluate`: it re-runs the evaluation once per rejection fraction.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._errors import EmbedevalWarning, InputError
from ._validation import as_embeddings, as_labels, as_vector, check_bool, check_fractions
from .evaluate import evaluate

__all__ = ["RejectBothCurve", "reject_both_curve"]


@dataclass(frozen=True)
class RejectBothCurve:
    """Metrics after removing the least confident items from queries *and* gallery."""

    fractions: np.ndarray
    metrics: dict[str, np.ndarray]
    n_kept: np.ndarray


def reject_both_curve(
    embeddings: Any,
    labels: Any,
    confidences: Any,
    *,
    fractions: Any = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5),
    metrics: Any = None,
    higher_is_confident: bool = True,
    **evaluate_kwargs: Any,
) -> RejectBothCurve:
    """The face-recognition protocol: reject the ⌈f·n⌉ least confident items entirely.

    For each fraction f the rejected items leave both the query set and the gallery
    (leave-one-out over one set), and the metrics are recomputed on what remains; so, unlike
    the error-reject curve, a rejected item can no longer be anyone's neighbour.  Ties in
    confidence are broken by position (earlier rows are kept first), so the result is
    deterministic.

    Zero division: queries that become lone after the rejection are left out of the averages
    as in :func:`embedeval.evaluate`; ``fractions`` must stay below 1.

    Examples
    --------
    >>> x = [[0.0], [0.1], [1.0], [1.1], [0.5]]
    >>> cur = reject_both_curve(x, [0, 0, 1, 1, 1], [0.9, 0.9, 0.9, 0.9, 0.1],
    ...                         fractions=[0.0, 0.2], metrics=["precision_at_1"])
    >>> cur.metrics["precision_at_1"].tolist()   # the confusing point 0.5 is rejected
    [0.8, 1.0]
    """
    x = as_embeddings(embeddings, "embeddings")
    y = as_labels(labels, "labels", length=x.shape[0], length_of="embeddings")
    c = as_vector(confidences, "confidences", length=x.shape[0], length_of="embeddings")
    check_bool(higher_is_confident, "higher_is_confident")
    if not higher_is_confident:
        c = -c
    fr = check_fractions(fractions, "fractions")
    groups = evaluate_kwargs.pop("query_groups", None)
    if groups is not None:  # group ids travel with their items
        groups = as_labels(groups, "query_groups", length=x.shape[0], length_of="embeddings")
    order = np.argsort(-c, kind="stable")  # most confident first, ties by position
    results: dict[str, list[float]] = {}
    kept = []
    for f in fr:
        n_keep = x.shape[0] - math.ceil(f * x.shape[0] - 1e-12)
        if n_keep < 1:
            raise InputError(
                f"fractions holds {f}, which rejects all {x.shape[0]} items and leaves nothing "
                "to evaluate; use fractions below (n - 1) / n."
            )
        keep = np.sort(order[:n_keep])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", EmbedevalWarning)
            res = evaluate(
                x[keep],
                y[keep],
                metrics=metrics,
                query_groups=None if groups is None else groups[keep],
                **evaluate_kwargs,
            )
        for name, value in res.metrics.items():
            results.setdefault(name, []).append(value)
        kept.append(n_keep)
    return RejectBothCurve(fr, {k: np.asarray(v) for k, v in results.items()}, np.asarray(kept))
