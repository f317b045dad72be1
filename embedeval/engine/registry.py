"""The metric registry: names, PML aliases, direction, range and depth needs of every metric.

The registry is the single source of truth for metric names: :func:`parse_metrics` validates a
user's list against it (with a "did you mean" suggestion), the engine asks it what depth each
metric needs and which kernel (:data:`embedeval.engine.kernels.KERNELS`) computes it, results are
checked against its value ranges, the :class:`~embedeval.Evaluator` reads its directions, and
``tests/test_common.py`` runs every entry through the same checks.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..utils.errors import InputError, InputTypeError
from ..utils.validation import suggest

__all__ = [
    "DEFAULT_METRICS",
    "MAX_CUTOFF",
    "METRICS",
    "PML_ALIASES",
    "MetricInfo",
    "default_metrics",
    "parse_metrics",
]


@dataclass(frozen=True)
class MetricInfo:
    """What the rest of the package needs to know about one metric.

    Attributes
    ----------
    name : str
        Canonical key used in results.
    kind : {"knn", "cluster"}
        ``"knn"`` metrics have a per-query value computed from the ranked references;
        ``"cluster"`` metrics (NMI, AMI) are one number for the whole query set.
    depth : {"one", "r", "full", "first_hit", "fixed"}
        How deep each query's ranking must be read: one item, R_q items, the whole ranking up to
        the last relevant item, up to the first relevant item, or a fixed ``cutoff``.
    cutoff : int or None
        The fixed depth of ``recall_at_{k}`` / ``precision_at_{k}``.
    pml_name : str or None
        The name pytorch-metric-learning's ``AccuracyCalculator`` uses.
    description : str
        One line, for tables and ``--help``.
    higher_is_better : bool
        Direction of improvement.
    value_range : (float, float)
        The values a query can take.
    function : callable or None
        A user's :class:`~embedeval.RetrievalMetric` function ``fn(relevant, n_relevant)``;
        ``None`` for the built-in metrics.
    kernel : str or None
        The key of the metric's kernel in :data:`embedeval.engine.kernels.KERNELS` (``"custom"``
        for a user's metric); ``None`` for the cluster metrics.
    """

    name: str
    kind: str
    depth: str
    cutoff: int | None = None
    pml_name: str | None = None
    description: str = ""
    higher_is_better: bool = True
    value_range: tuple[float, float] = (0.0, 1.0)
    function: Callable[[np.ndarray, np.ndarray], Any] | None = None
    kernel: str | None = None


_FIXED = {
    "precision_at_1": MetricInfo(
        "precision_at_1",
        "knn",
        "one",
        1,
        "precision_at_1",
        "fraction of queries whose nearest reference has their label",
        kernel="precision_at_k",
    ),
    "r_precision": MetricInfo(
        "r_precision",
        "knn",
        "r",
        None,
        "r_precision",
        "precision among the R_q nearest references",
        kernel="r_precision",
    ),
    "map_at_r": MetricInfo(
        "map_at_r",
        "knn",
        "r",
        None,
        "mean_average_precision_at_r",
        "mean average precision over the R_q nearest references (MAP@R), divisor R_q",
        kernel="map_at_r",
    ),
    "map": MetricInfo(
        "map",
        "knn",
        "full",
        None,
        "mean_average_precision",
        "mean average precision over the full ranking",
        kernel="map",
    ),
    "mrr": MetricInfo(
        "mrr",
        "knn",
        "first_hit",
        None,
        "mean_reciprocal_rank",
        "mean reciprocal rank of the first relevant reference",
        kernel="mrr",
    ),
    "minp": MetricInfo(
        "minp",
        "knn",
        "full",
        None,
        None,
        "mean inverse negative penalty: R_q / rank of the last relevant reference (re-id mINP)",
        kernel="minp",
    ),
    "nmi": MetricInfo(
        "nmi",
        "cluster",
        "none",
        None,
        "NMI",
        "normalized mutual information of k-means clusters and labels",
    ),
    "ami": MetricInfo(
        "ami",
        "cluster",
        "none",
        None,
        "AMI",
        "adjusted mutual information of k-means clusters and labels",
        value_range=(-1.0, 1.0),
    ),
}

#: PML spellings accepted as input; results always use the canonical keys.
PML_ALIASES = {
    "mean_average_precision_at_r": "map_at_r",
    "mean_average_precision": "map",
    "mean_reciprocal_rank": "mrr",
    "NMI": "nmi",
    "AMI": "ami",
}

#: The metrics :func:`embedeval.evaluate` computes when ``metrics=None`` (no ``recall_at_1``:
#: it always equals ``precision_at_1``).
DEFAULT_METRICS = ("precision_at_1", "r_precision", "map_at_r", "recall_at_10")


def default_metrics(depth: int | None) -> tuple[str, ...]:
    """The default set for a ranking capped at ``depth``: Recall@10 becomes Recall@depth when
    the cap is below 10, and is dropped at depth 1 (where it would equal precision_at_1).

    >>> default_metrics(None)[-1], default_metrics(5)[-1], default_metrics(1)
    ('recall_at_10', 'recall_at_5', ('precision_at_1', 'r_precision', 'map_at_r'))
    """
    if depth is None or depth >= 10:
        return DEFAULT_METRICS
    return DEFAULT_METRICS[:-1] + ((f"recall_at_{depth}",) if depth > 1 else ())


_AT_K = re.compile(r"(recall|precision|map)_at_([1-9][0-9]*)")
#: The largest k of ``recall_at_{k}`` / ``precision_at_{k}`` / ``map_at_{k}`` and of a custom
#: metric's int depth: far above any reference set, and k + 1 (the item that shows a tie at
#: the cut-off) still fits int64 with room to spare.
MAX_CUTOFF = 2**62


def _at_k_info(name: str) -> MetricInfo | None:
    match = _AT_K.fullmatch(name)  # not re.match with "$", which also takes "recall_at_5\n"
    if match is None:
        return None
    family, cutoff = match.group(1), int(match.group(2))
    if family == "precision" and cutoff == 1:
        return _FIXED["precision_at_1"]
    if family == "map":
        return MetricInfo(
            name,
            "knn",
            "fixed",
            cutoff,
            None,
            f"average precision over the {cutoff} nearest, divided by the relevant references "
            f"found there (the hashing mAP@{cutoff}; 0 when none)",
            kernel="map_at_k",
        )
    if family == "recall":
        return MetricInfo(
            name,
            "knn",
            "fixed",
            cutoff,
            None,
            f"fraction of queries with a relevant reference among the {cutoff} nearest "
            "(metric-learning Recall@k, a hit rate)",
            kernel="recall_at_k",
        )
    return MetricInfo(
        name,
        "knn",
        "fixed",
        cutoff,
        None,
        f"fraction of relevant references among the {cutoff} nearest",
        kernel="precision_at_k",
    )


class _Registry(dict):
    """``METRICS[name]`` also resolves parametrised names such as ``recall_at_5``."""

    def __missing__(self, key: str) -> MetricInfo:
        info = _at_k_info(key) if isinstance(key, str) else None
        if info is None:
            raise KeyError(key)
        return info

    def __contains__(self, key: object) -> bool:
        return super().__contains__(key) or (isinstance(key, str) and _at_k_info(key) is not None)


#: Every metric :func:`embedeval.evaluate` knows, by canonical name.  ``recall_at_{k}``,
#: ``precision_at_{k}`` and ``map_at_{k}`` exist for every positive integer k; the common ones
#: are listed.
METRICS: dict[str, MetricInfo] = _Registry(
    {
        **_FIXED,
        **{f"recall_at_{k}": _at_k_info(f"recall_at_{k}") for k in (1, 5, 10, 100)},
        **{f"precision_at_{k}": _at_k_info(f"precision_at_{k}") for k in (5, 10, 100)},
        **{f"map_at_{k}": _at_k_info(f"map_at_{k}") for k in (10, 100)},
    }
)


def parse_metrics(metrics: str | Iterable[str] | None) -> list[MetricInfo]:
    """Validate metric names (canonical or PML spelling) and return their infos, deduplicated.

    >>> [m.name for m in parse_metrics(["mean_average_precision_at_r", "recall_at_5"])]
    ['map_at_r', 'recall_at_5']
    """
    if metrics is None:
        metrics = DEFAULT_METRICS
    if isinstance(metrics, str):
        metrics = [metrics]
    try:
        names = list(metrics)
    except TypeError:
        raise InputTypeError(
            f"metrics must be a list of metric names; got {type(metrics).__name__}."
        ) from None
    if not names:
        raise InputError(
            "metrics is empty; pass at least one metric name, or None for the defaults."
        )
    out: dict[str, MetricInfo] = {}
    for raw in names:
        if not isinstance(raw, str):
            raise InputTypeError(f"metrics must hold strings; got {raw!r}.")
        name = PML_ALIASES.get(raw, raw)
        if name not in METRICS:
            known = [*_FIXED, *PML_ALIASES, "recall_at_10", "precision_at_10", "map_at_100"]
            raise InputError(
                f"metrics: unknown metric {raw!r}.{suggest(raw, known)} Known metrics: "
                f"{', '.join(_FIXED)}, recall_at_<k>, precision_at_<k>, map_at_<k> (k a positive "
                "integer)."
            )
        info = METRICS[name]
        if info.cutoff is not None and info.cutoff > MAX_CUTOFF:
            raise InputError(
                f"metrics: {raw!r} asks for the {info.cutoff} nearest references; k may be at "
                f"most 2**62 ({MAX_CUTOFF}), and any k at or above the number of references "
                "already reads the whole ranking: use that number or a smaller k."
            )
        out.setdefault(name, info)
    return list(out.values())
