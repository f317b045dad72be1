"""Rejection that removes items from queries and gallery alike (the face-recognition protocol).

Unlike the error-reject curve of :mod:`embedeval.metrics.confidence`, which drops queries from the
average and keeps the gallery whole, a rejected item here can no longer be anyone's neighbour,
so every metric is recomputed on what remains.  Each point of the curve runs the core
evaluation pipeline (:func:`embedeval.evaluation.stages.evaluate_core`) on the items kept;
:func:`embedeval.evaluate` calls :func:`rejection_curve` for ``reject_from="both"``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..engine.registry import MetricInfo
from ..search.dispatch import SearchOptions
from ..utils.errors import EmbedevalWarning, InputError
from ..utils.validation import (
    as_any_labels,
    as_embeddings,
    as_labels,
    as_vector,
    check_bool,
    check_fractions,
)
from .settings import (
    DEFAULT_REJECTION_FRACTIONS,
    SEARCH_ARGUMENTS,
    ConfidenceSettings,
    EvaluationInputs,
    EvaluationSettings,
    ProtocolSettings,
    StatisticsSettings,
    validate_arguments,
)
from .stages import evaluate_core

__all__ = [
    "FORWARDED",
    "RejectBothCurve",
    "fraction_label",
    "kept_counts",
    "reevaluation_settings",
    "reject_both_curve",
    "rejection_curve",
]

#: The keyword arguments of :func:`embedeval.evaluate` that :func:`reject_both_curve` forwards
#: to each re-evaluation (the others describe another protocol or an add-on).
FORWARDED = ("metrics", "custom_metrics", "k", "distance", "average", "seed", *SEARCH_ARGUMENTS)


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
    fractions: Any = DEFAULT_REJECTION_FRACTIONS,
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

    ``evaluate_kwargs`` are options of :func:`embedeval.evaluate` for each re-evaluation
    (``k``, ``distance``, ``average``, ``query_groups``, ``custom_metrics`` and the search
    options); they are all checked before the first one runs.

    Examples
    --------
    >>> x = [[0.0], [0.1], [1.0], [1.1], [0.5]]
    >>> cur = reject_both_curve(x, [0, 0, 1, 1, 1], [0.9, 0.9, 0.9, 0.9, 0.1],
    ...                         fractions=[0.0, 0.2], metrics=["precision_at_1"])
    >>> cur.metrics["precision_at_1"].tolist()   # the confusing point 0.5 is rejected
    [0.8, 1.0]
    """
    x = as_embeddings(embeddings, "embeddings")
    y = as_any_labels(labels, "labels", length=x.shape[0], length_of="embeddings")
    c = as_vector(confidences, "confidences", length=x.shape[0], length_of="embeddings")
    if not check_bool(higher_is_confident, "higher_is_confident"):
        c = -c
    fr = check_fractions(fractions, "fractions")
    groups = evaluate_kwargs.pop("query_groups", None)
    refused = sorted(set(evaluate_kwargs) - set(FORWARDED))
    if refused:
        raise InputError(
            f"reject_both_curve does not take {', '.join(refused)}: each step is a "
            "leave-one-out evaluation of the kept items without add-ons; it takes "
            f"{', '.join(FORWARDED)} and query_groups."
        )
    inputs = EvaluationInputs(x, y, query_groups=groups)
    settings = validate_arguments(inputs, metrics=metrics, **evaluate_kwargs)
    return rejection_curve(settings, x, y, c, groups, fr, name="fractions")


def rejection_curve(
    settings: EvaluationSettings,
    x: np.ndarray,
    y: np.ndarray,
    confidences: np.ndarray,
    groups: Any,
    fractions: Any,
    *,
    name: str = "rejection_fractions",
) -> RejectBothCurve:
    """The reject-both curve of checked arrays (``confidences``: higher = more confident).

    Each step evaluates the kept items leave-one-out with the core pipeline under
    ``settings``; ``name`` is the argument the fractions came from, for error messages.
    """
    fractions = np.asarray(fractions, dtype=np.float64)
    n_kept = kept_counts(fractions, x.shape[0], name)
    if groups is not None:  # group ids travel with their items
        groups = as_labels(
            groups, "query_groups", length=x.shape[0], length_of="embeddings", groups=True
        )
    order = np.argsort(-confidences, kind="stable")  # most confident first, ties by position
    results: dict[str, list[float]] = {}
    for n_keep in n_kept:
        keep = np.sort(order[:n_keep])
        kept = EvaluationInputs(
            x[keep], y[keep], query_groups=None if groups is None else groups[keep]
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", EmbedevalWarning)
            res = evaluate_core(settings, kept)
        for metric, value in res.metrics.items():
            results.setdefault(metric, []).append(value)
    return RejectBothCurve(
        fractions, {k: np.asarray(v) for k, v in results.items()}, np.asarray(n_kept)
    )


def fraction_label(fraction: float) -> str:
    """A rejection fraction as ``evaluate`` writes it in ``both_<metric>@<fraction>``: two
    decimals, or the shortest decimal that reads back as the fraction when two lose digits, so
    distinct fractions never share a key (0.1 and 0.104 would both be 0.10).

    >>> fraction_label(0.1), fraction_label(0.0), fraction_label(0.125), fraction_label(1 / 3)
    ('0.10', '0.00', '0.125', '0.3333333333333333')
    """
    short = f"{float(fraction):.2f}"
    return short if float(short) == float(fraction) else repr(float(fraction))


def kept_counts(fractions: Any, n: int, name: str = "rejection_fractions") -> list[int]:
    """Items kept at each rejection fraction, n - ⌈f·n⌉; an error when one keeps nothing.

    >>> kept_counts(np.array([0.0, 0.25, 0.3]), 4)
    [4, 3, 2]
    >>> kept_counts(np.array([0.28]), 100_000)   # 28000 rejected, though 0.28·n rounds above
    [72000]
    """
    kept = []
    for f in np.atleast_1d(fractions):
        product = float(f) * n
        # f·n is rounded (0.28·100000 is 28000.000000000004): a slack of a few ulps of the
        # product, at least 1e-12, keeps a whole count whole at any n.
        n_keep = n - math.ceil(product - 1e-12 * max(product, 1.0))
        if n_keep < 1:
            raise InputError(
                f"{name} holds {float(f)}, which rejects all {n} items and leaves nothing to "
                "evaluate; use fractions below (n - 1) / n."
            )
        kept.append(n_keep)
    return kept


def reevaluation_settings(
    settings: EvaluationSettings, infos: tuple[MetricInfo, ...], k: int | None
) -> EvaluationSettings:
    """The settings of each step of :func:`embedeval.evaluate`'s reject-both curve.

    The steps compute the given retrieval metrics (``infos``) at depth ``k`` (``"max_bin_count"``
    stays the value the whole set resolved to), leave-one-out, on the exact local engine with the
    caller's block size, memory budget and threads, without progress bar or add-ons.
    """
    search = settings.search
    return EvaluationSettings(
        metrics=replace(settings.metrics, infos=tuple(infos), default=False, k=k),
        protocol=ProtocolSettings(leave_one_out=True, grouped=settings.protocol.grouped),
        confidence=ConfidenceSettings(),
        statistics=StatisticsSettings(),
        search=SearchOptions.make(
            block_size=search.block_size,
            memory_budget=search.memory_budget,
            n_threads=search.n_threads,
            progress=False,
        ),
    )
