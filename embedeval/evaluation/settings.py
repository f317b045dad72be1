"""The validation stage of :func:`embedeval.evaluate`: every argument checked once, before any work.

:func:`validate_arguments` turns evaluate's keyword arguments into one frozen
:class:`EvaluationSettings`, made of small groups, one per concern:

* :class:`MetricSettings`: what to compute (metrics, depth cap ``k``, distance, average);
* :class:`ProtocolSettings`: who is compared with whom (leave-one-out, ``ref_includes_query``,
  groups, relevance lists);
* :class:`ConfidenceSettings`: the per-query confidence add-ons (error-reject curve, reject-both);
* :class:`StatisticsSettings`: the bootstrap intervals;
* :class:`embedeval.search.options.SearchOptions`: how to search (backend, index, shards, threads,
...).

Every option is checked on every path, including the options a path does not use, so a bad
``ci=`` cannot fail after an hour of search; an option given to a path that would ignore it is
refused rather than silently dropped.  The arrays themselves (embeddings, labels, groups,
confidences, relevance lists) are checked by the data stage, which needs them whole.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ..engine.custom import metric_infos
from ..engine.registry import MetricInfo, default_metrics, parse_metrics
from ..search.dispatch import SearchOptions
from ..search.neighbors import DISTANCES
from ..utils.errors import EmbedevalWarning, InputError, InputTypeError
from ..utils.validation import (
    check_bool,
    check_bootstrap,
    check_choice,
    check_fractions,
    check_int,
)

__all__ = [
    "DATA_ARGUMENTS",
    "DEFAULT_REJECTION_FRACTIONS",
    "SEARCH_ARGUMENTS",
    "ConfidenceSettings",
    "EvaluationInputs",
    "EvaluationSettings",
    "MetricSettings",
    "ProtocolSettings",
    "StatisticsSettings",
    "check_depth",
    "metrics_at_depth",
    "validate_arguments",
    "warn_truncated",
]

#: The default of ``evaluate(rejection_fractions=...)``.
DEFAULT_REJECTION_FRACTIONS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)


@dataclass(frozen=True)
class EvaluationInputs:
    """The data arguments of :func:`embedeval.evaluate`, as given (the data stage checks them)."""

    query: Any
    query_labels: Any
    reference: Any = None
    reference_labels: Any = None
    query_groups: Any = None
    reference_groups: Any = None
    confidences: Any = None
    positives: Any = None
    junk: Any = None


#: Keyword arguments of :func:`validate_arguments` that hold the search options.
SEARCH_ARGUMENTS = (
    "backend",
    "index",
    "index_params",
    "exact_sample",
    "shards",
    "client",
    "block_size",
    "memory_budget",
    "progress",
    "n_threads",
    "device",
    "device_memory",
    "tf32",
    "precision",
)

#: The data arguments of :func:`embedeval.evaluate` (the fields of :class:`EvaluationInputs`).
DATA_ARGUMENTS = tuple(f.name for f in fields(EvaluationInputs))


@dataclass(frozen=True)
class MetricSettings:
    """What to compute.

    ``default`` is True for ``metrics=None``: the default set depends on the resolved depth, so
    the plan stage rebuilds it once ``k="max_bin_count"`` is known (``custom_metrics`` is kept
    for that).
    """

    infos: tuple[MetricInfo, ...]
    default: bool
    custom_metrics: Any
    k: int | str | None
    distance: str
    average: str


@dataclass(frozen=True)
class ProtocolSettings:
    """Who is compared with whom: leave-one-out, PML's ``ref_includes_query``, groups, or
    relevance given as per-query lists (``positives=`` / ``junk=``)."""

    leave_one_out: bool
    ref_includes_query: bool = False
    grouped: bool = False
    lists: bool = False


@dataclass(frozen=True)
class ConfidenceSettings:
    """The per-query confidence add-ons; ``given`` is False without ``confidences=``."""

    given: bool = False
    higher_is_confident: bool = True
    reject_from: str = "queries"
    rejection_fractions: tuple[float, ...] = DEFAULT_REJECTION_FRACTIONS


@dataclass(frozen=True)
class StatisticsSettings:
    """Percentile bootstrap intervals: ``ci`` is None when none are asked for."""

    ci: float | None = None
    n_boot: int = 1000
    seed: int = 0


@dataclass(frozen=True)
class EvaluationSettings:
    """Every validated option of one evaluation, grouped by concern."""

    metrics: MetricSettings
    protocol: ProtocolSettings
    confidence: ConfidenceSettings
    statistics: StatisticsSettings
    search: SearchOptions


def validate_arguments(
    inputs: EvaluationInputs,
    *,
    metrics: Any = None,
    custom_metrics: Any = None,
    k: Any = None,
    distance: Any = "euclidean",
    ref_includes_query: Any = False,
    average: Any = "micro",
    higher_is_confident: Any = True,
    reject_from: Any = "queries",
    rejection_fractions: Any = DEFAULT_REJECTION_FRACTIONS,
    ci: Any = None,
    n_boot: Any = None,
    seed: Any = 0,
    **search: Any,
) -> EvaluationSettings:
    """Check every option of :func:`embedeval.evaluate` and return them as frozen settings.

    ``search`` holds the keyword arguments of :meth:`embedeval.search.options.SearchOptions.make`
    (``backend``, ``index``, ``shards``, ``block_size``, ...).  Raises :class:`InputError` /
    :class:`InputTypeError` naming the first bad argument; nothing is searched before this
    returns.

    Examples
    --------
    >>> s = validate_arguments(EvaluationInputs([[0.0], [1.0]], [0, 0]), k=5, ci=0.9)
    >>> s.metrics.k, s.protocol.leave_one_out, s.statistics.ci, s.search.backend
    (5, True, 0.9, 'local')
    """
    ci, n_boot, seed = check_bootstrap(ci, n_boot, seed)
    statistics = StatisticsSettings(ci=ci, n_boot=n_boot, seed=seed)
    search_options = SearchOptions.make(like=inputs.query, seed=statistics.seed, **search)
    protocol = _protocol(inputs, ref_includes_query)
    confidence = _confidence(inputs, higher_is_confident, reject_from, rejection_fractions)
    distance = check_choice(distance, "distance", DISTANCES)
    average = check_choice(average, "average", ("micro", "macro"))
    if protocol.lists:
        _check_lists_path(inputs, protocol, search_options, custom_metrics, average)
        infos = _list_metrics(metrics, k)
    else:
        k = _check_k(k)
        infos = tuple(metric_infos(metrics, custom_metrics))
    metric_settings = MetricSettings(infos, metrics is None, custom_metrics, k, distance, average)
    if isinstance(k, int):  # known without the data, so an Evaluator refuses it when built
        metrics_at_depth(metric_settings, k)
    return EvaluationSettings(
        metrics=metric_settings,
        protocol=protocol,
        confidence=confidence,
        statistics=statistics,
        search=search_options,
    )


def metrics_at_depth(ms: MetricSettings, depth: int | None) -> tuple[MetricInfo, ...]:
    """The metrics computed on a ranking capped at ``depth`` (None: every reference ranked).

    The default set follows the depth (Recall@depth instead of Recall@10 below 10, so it never
    fails); a fixed cut-off deeper than ``depth`` is refused by :func:`check_depth`.

    Examples
    --------
    >>> s = validate_arguments(EvaluationInputs([[0.0], [1.0]], [0, 0]), k="max_bin_count")
    >>> [m.name for m in metrics_at_depth(s.metrics, 5)][-1]
    'recall_at_5'
    """
    infos = ms.infos
    if ms.default:
        infos = tuple(metric_infos(default_metrics(depth), ms.custom_metrics))
    check_depth(infos, depth, ms.k)
    return infos


def warn_truncated(k: Any, max_relevant: int, infos: Any, stacklevel: int) -> None:
    """Warn when an int ``k`` below the largest R_q truncates the metrics read to depth R_q
    (MAP@R, R-precision: PML's semantics, not the textbook definitions); ``stacklevel`` as
    :func:`warnings.warn` takes it, from the caller."""
    truncated = [m.name for m in infos if m.depth == "r"]
    if isinstance(k, int) and k < max_relevant and truncated:
        warnings.warn(
            f"k={k} is below the largest R_q ({max_relevant}), so {', '.join(truncated)} are "
            "truncated at depth k (PML's semantics), not the textbook MAP@R / R-precision. "
            "Use k=None (exact) unless you need PML's truncated numbers.",
            EmbedevalWarning,
            stacklevel=stacklevel + 1,
        )


def check_depth(infos: Any, depth: int | None, k: Any) -> None:
    """Refuse metrics with a fixed cut-off deeper than the ranking depth ``depth`` that ``k``
    (as the user gave it) caps; ``depth=None`` ranks every reference and allows any cut-off.

    >>> check_depth(parse_metrics(["recall_at_10"]), 10, 10)   # deep enough: nothing raised
    >>> check_depth(parse_metrics(["recall_at_10"]), None, None)  # every reference ranked
    """
    if depth is None:
        return
    too_deep = [m.name for m in infos if m.depth == "fixed" and m.cutoff > depth]
    if too_deep:
        raise InputError(
            f"k={k!r} caps the ranking at depth {depth}, but {', '.join(too_deep)} need(s) a "
            "deeper ranking; raise k or use k=None."
        )


def _check_k(k: Any) -> int | str | None:
    if isinstance(k, str):
        return check_choice(k, "k", ("max_bin_count",))
    return check_int(k, "k", allow_none=True, maximum=2**63 - 1)


def _protocol(inputs: EvaluationInputs, ref_includes_query: Any) -> ProtocolSettings:
    """Which arrays go together: reference with its labels and groups, queries with theirs."""
    if not isinstance(ref_includes_query, (bool, np.bool_)):
        raise InputTypeError(
            f"ref_includes_query must be True or False; got {ref_includes_query!r}."
        )
    leave_one_out = inputs.reference is None
    lists = inputs.positives is not None or inputs.junk is not None
    if lists:  # the lists path refuses these options by name
        return ProtocolSettings(leave_one_out, bool(ref_includes_query), False, True)
    if leave_one_out and ref_includes_query:
        raise InputError(
            "ref_includes_query=True was given with reference=None, which already means "
            "leave-one-out over the queries (each query's own row excluded). Drop "
            "ref_includes_query, or pass as reference the gallery whose first rows are the queries."
        )
    if leave_one_out and inputs.reference_labels is not None:
        raise InputError(
            "reference_labels was given without reference; pass both, or neither for "
            "leave-one-out over the queries."
        )
    if leave_one_out and inputs.reference_groups is not None:
        raise InputError(
            "reference_groups was given without reference; with reference=None the query "
            "set is the gallery, so pass only query_groups."
        )
    if not leave_one_out and inputs.reference_labels is None:
        raise InputError("reference_labels is required when reference is given.")
    if not leave_one_out and (inputs.query_groups is None) != (inputs.reference_groups is None):
        raise InputError(
            "query_groups and reference_groups go together: pass both (one group id per query "
            "and per reference row), or neither."
        )
    grouped = inputs.query_groups is not None
    return ProtocolSettings(leave_one_out, bool(ref_includes_query), grouped, False)


def _confidence(
    inputs: EvaluationInputs, higher_is_confident: Any, reject_from: Any, fractions: Any
) -> ConfidenceSettings:
    higher_is_confident = check_bool(higher_is_confident, "higher_is_confident")
    reject_from = check_choice(reject_from, "reject_from", ("queries", "both"))
    given = inputs.confidences is not None
    if reject_from == "both" and (not given or inputs.reference is not None):
        raise InputError(
            "reject_from='both' removes rejected items from queries and gallery alike, so it "
            "needs confidences= and leave-one-out evaluation (reference=None)."
        )
    fractions = check_fractions(fractions)
    if reject_from != "both" and not np.array_equal(fractions, DEFAULT_REJECTION_FRACTIONS):
        raise InputError(
            "rejection_fractions was given without reject_from='both'; the fractions are the "
            "points of the reject-both curve. Pass reject_from='both' (with confidences=) or "
            "drop rejection_fractions."
        )
    return ConfidenceSettings(given, higher_is_confident, reject_from, tuple(fractions.tolist()))


def _check_lists_path(
    inputs: EvaluationInputs,
    protocol: ProtocolSettings,
    search: SearchOptions,
    custom_metrics: Any,
    average: str,
) -> None:
    """``positives=`` / ``junk=``: relevance comes from the lists, searched exactly in place."""
    if inputs.positives is None:
        raise InputError("junk= was given without positives=; pass both lists per query.")
    if inputs.query_labels is not None or inputs.reference_labels is not None:
        raise InputError(
            "positives= replaces labels: pass query_labels=None and reference_labels=None "
            "(relevance comes from the lists)."
        )
    unsupported = {
        "query_groups": inputs.query_groups is not None,
        "reference_groups": inputs.reference_groups is not None,
        "confidences": inputs.confidences is not None,
        "custom_metrics": custom_metrics is not None,
        "index": search.index is not None,
        "shards": search.shards is not None,
        "ref_includes_query": protocol.ref_includes_query,
        f"backend={search.backend!r}": search.backend not in ("local", "torch"),
    }
    given = [name for name, value in unsupported.items() if value]
    if given:
        raise InputError(
            f"{', '.join(given)} cannot be combined with positives= (relevance lists); drop it."
        )
    if average != "micro":
        raise InputError("average='macro' needs classes; with positives= use average='micro'.")


def _list_metrics(metrics: Any, k: Any) -> tuple[MetricInfo, ...]:
    """Metrics of the lists path: retrieval metrics only, ``k`` an int or None."""
    if isinstance(k, bool) or (k is not None and not isinstance(k, (int, np.integer))):
        raise InputError(f"k must be None or an int with positives=; got {k!r}.")
    k = check_int(k, "k", allow_none=True)
    infos = parse_metrics(metrics)
    if any(m.kind != "knn" for m in infos):
        raise InputError("nmi / ami need class labels; they are not defined for positives lists.")
    return tuple(infos)
