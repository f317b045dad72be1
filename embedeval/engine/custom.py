"""User-defined per-query retrieval metrics, computed in the engine's streaming blocks.

A :class:`RetrievalMetric` wraps a function of the ranked relevance of a block of queries::

    def position_weighted_precision(relevant, n_relevant):
        weights = 1.0 / np.arange(1, relevant.shape[1] + 1)
        best = np.cumsum(weights)[np.minimum(n_relevant, relevant.shape[1]) - 1]
        return (relevant * weights).sum(axis=1) / best

    metric = ee.RetrievalMetric(position_weighted_precision, depth="R")
    ee.evaluate(x, y, custom_metrics={"pwp": metric})

The engine calls it once per block of queries, with the same ranking (nearest first, equally
distant references by ascending index) and the same exclusions (self, groups) as the built-in
metrics, and the values join the built-ins everywhere: ``metrics``, ``per_query``, ``per_class``,
``ci``, JSON and :func:`embedeval.evaluation.compare`.
"""

from __future__ import annotations

import keyword
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..utils.errors import InputError, InputTypeError

__all__ = ["RetrievalMetric", "custom_infos", "metric_infos", "relevance_matrix"]


@dataclass(frozen=True)
class RetrievalMetric:
    """A per-query retrieval metric given as a function of the ranked relevance.

    Parameters
    ----------
    fn : callable
        ``fn(relevant, n_relevant) -> array of shape (n_block,)``.  ``relevant`` is a bool array
        of shape (n_block, width): entry [i, j] says whether the (j+1)-th nearest reference
        the i-th query can see has its label; it is False past that query's own depth (and
        past the references it can see).  ``n_relevant`` (int64, shape (n_block,)) is R_q,
        the relevant references the query can see (always >= 1: lone queries are not passed
        and get NaN).  Values are stored as float64; NaN (which would read as a lone
        query) and non-real values raise :class:`~embedeval.InputError` naming the metric.
    depth : "R", "all" or int
        How much of each query's ranking ``fn`` sees: ``"R"`` the first R_q items (like
        MAP@R), ``"all"`` the whole ranking (the engine stops at the last relevant item, since
        every item after it is non-relevant: the False tail is the same information), an int d
        the first d items.  An int ``k`` of :func:`embedeval.evaluate` caps each of these at k.
    higher_is_better : bool
        Direction, for checkpoint selection (:class:`embedeval.Evaluator`) and the HTML
        report's worst-first orders; kept in ``result.settings["lower_is_better"]``.
    description : str
        One line for tables.
    value_range : (float, float)
        The values ``fn`` may return, ends included (default: any); a value outside raises
        :class:`~embedeval.InputError` naming the metric, so a wrong formula fails loudly.

    Notes
    -----
    Ties: the ranking puts equally distant references in ascending reference index order, and
    ``result.n_ties`` counts, for a custom metric, the queries where a block of equally distant
    references that mixes relevant and non-relevant items lies inside the window ``fn`` sees.

    Examples
    --------
    MAP@R written as a custom metric equals the built-in:

    >>> import numpy as np, embedeval as ee
    >>> def ap_at_r(relevant, n_relevant):
    ...     hits = np.cumsum(relevant, axis=1)
    ...     ranks = np.arange(1, relevant.shape[1] + 1)
    ...     return (relevant * hits / ranks).sum(axis=1) / n_relevant
    >>> x, y = [[0.0], [0.1], [1.0], [0.2]], [0, 0, 1, 1]
    >>> res = ee.evaluate(x, y, metrics=["map_at_r"],
    ...                   custom_metrics={"my_map_at_r": ee.RetrievalMetric(ap_at_r)})
    >>> res["my_map_at_r"] == res["map_at_r"]
    True
    """

    fn: Callable[[np.ndarray, np.ndarray], Any]
    depth: str | int = "R"
    higher_is_better: bool = True
    description: str = ""
    value_range: tuple[float, float] = (-np.inf, np.inf)

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise InputTypeError(
                f"RetrievalMetric needs a function fn(relevant, n_relevant); got {self.fn!r}."
            )
        from .registry import MAX_CUTOFF

        depth = self.depth
        if isinstance(depth, (bool, np.bool_)) or not (
            depth in ("R", "all")
            or (isinstance(depth, (int, np.integer)) and 1 <= depth <= MAX_CUTOFF)
        ):
            raise InputError(
                f"RetrievalMetric depth={depth!r} is not valid; use 'R' (R_q items, like MAP@R), "
                "'all' (the whole ranking) or a positive int of at most 2**62."
            )
        _check_range(self.value_range)


def custom_infos(custom_metrics: Any, builtin: Callable[[str], bool]) -> list[Any]:
    """Validate ``custom_metrics`` ({name: RetrievalMetric}) and return their registry infos.

    ``builtin(name)`` tells whether a name is taken by a built-in metric.
    """
    from .registry import MetricInfo

    if custom_metrics is None:
        return []
    if not isinstance(custom_metrics, Mapping):
        raise InputTypeError(
            "custom_metrics must be a dict {name: RetrievalMetric(...)}; got "
            f"{type(custom_metrics).__name__}."
        )
    infos = []
    for name, metric in custom_metrics.items():
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise InputError(
                f"custom_metrics: {name!r} is not a valid metric name; use a Python identifier "
                "such as 'my_precision'."
            )
        if builtin(name):
            raise InputError(
                f"custom_metrics: {name!r} is the name of a built-in metric; choose another name."
            )
        if not isinstance(metric, RetrievalMetric):
            raise InputTypeError(
                f"custom_metrics[{name!r}] must be an embedeval.RetrievalMetric; got "
                f"{type(metric).__name__}. Wrap the function: RetrievalMetric(fn, depth='R')."
            )
        if metric.depth in ("R", "all"):
            depth, cutoff = ("r" if metric.depth == "R" else "full"), None
        else:
            depth, cutoff = "fixed", int(metric.depth)
        infos.append(
            MetricInfo(
                name,
                "knn",
                depth,
                cutoff,
                None,
                metric.description or "custom retrieval metric",
                higher_is_better=bool(metric.higher_is_better),
                value_range=tuple(float(v) for v in metric.value_range),
                function=metric.fn,
                kernel="custom",
            )
        )
    return infos


def metric_infos(metrics: Any, custom_metrics: Any) -> list[Any]:
    """Built-in metrics (the defaults when ``metrics`` is None) followed by the custom ones;
    ``metrics=[]`` with custom metrics gives only those."""
    from .registry import METRICS, PML_ALIASES, parse_metrics

    custom = custom_infos(custom_metrics, lambda name: name in METRICS or name in PML_ALIASES)
    only_custom = custom and metrics is not None and not isinstance(metrics, str)
    if only_custom and len(list(metrics)) == 0:
        return custom
    return parse_metrics(metrics) + custom


def relevance_matrix(
    hit_row: np.ndarray, hit_pos: np.ndarray, window: np.ndarray, n_rows: int
) -> np.ndarray:
    """Dense (n_rows, max window) relevance of the first ``window[i]`` ranked items per row.

    ``hit_row`` / ``hit_pos``: the row and 0-based rank of every relevant candidate.

    >>> relevance_matrix(np.array([0, 0, 1]), np.array([0, 2, 1]), np.array([2, 3]), 2).tolist()
    [[True, False, False], [False, True, False]]
    """
    width = int(window.max(initial=0))
    out = np.zeros((n_rows, max(width, 1)), dtype=bool)
    keep = hit_pos < window[hit_row]
    out[hit_row[keep], hit_pos[keep]] = True
    return out[:, :width] if width else out[:, :0]


def call_metric(
    fn: Callable[[np.ndarray, np.ndarray], Any],
    name: str,
    relevant: np.ndarray,
    n_relevant: np.ndarray,
    value_range: tuple[float, float] = (-np.inf, np.inf),
) -> np.ndarray:
    """Call a custom metric on the non-lone rows and check what it returns (one value per row,
    within ``value_range``).

    >>> call_metric(lambda rel, n: rel.sum(axis=1) / n, "hits", np.eye(2, dtype=bool),
    ...             np.array([1, 2]), (0.0, 1.0)).tolist()
    [1.0, 0.5]
    """
    raw = np.asarray(fn(relevant, n_relevant))
    if raw.dtype.kind not in "biuf":  # complex, text, objects: float64 would drop or fail
        raise InputError(
            f"custom metric {name!r} returned values of dtype {raw.dtype}; it must return real "
            "numbers (float or int), one per query of the block."
        )
    value = raw.astype(np.float64)
    if value.shape != (relevant.shape[0],):
        raise InputError(
            f"custom metric {name!r} returned shape {value.shape}; it must return one value per "
            f"query of the block, shape ({relevant.shape[0]},)."
        )
    nan = np.isnan(value)
    if nan.any():  # NaN marks a lone query: a NaN here would silently leave the mean
        raise InputError(
            f"custom metric {name!r} returned NaN for {int(nan.sum())} of the "
            f"{value.size} queries of a block; lone queries (NaN) are never passed to it, so "
            "return a number for every query (e.g. 0 where the formula divides by 0)."
        )
    infinite = np.isinf(value)
    if infinite.any():  # the mean, its interval and every figure of it would be infinite too
        raise InputError(
            f"custom metric {name!r} returned {float(value[infinite][0])} for "
            f"{int(infinite.sum())} of the {value.size} queries of a block; return a finite "
            "number for every query (e.g. clip the value to a bound)."
        )
    low, high = value_range
    outside = (value < low) | (value > high)
    if outside.any():
        raise InputError(
            f"custom metric {name!r} returned {float(value[outside][0])}, outside its value_range "
            f"{value_range}; fix the function or widen value_range."
        )
    return value


def _check_range(value_range: Any) -> None:
    try:
        low, high = (float(v) for v in value_range)
    except (TypeError, ValueError):
        raise InputError(
            f"RetrievalMetric value_range={value_range!r} is not valid; give two numbers "
            "(low, high), e.g. (0.0, 1.0)."
        ) from None
    if not low < high:
        raise InputError(
            f"RetrievalMetric value_range={value_range!r} is not valid; low must be below high."
        )
