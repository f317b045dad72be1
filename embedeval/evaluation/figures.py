"""The figures of one evaluation, as matplotlib Figures: per-class values, positive/negative
distance histograms, the k sweep and, with confidences, the error-reject, confidence-vs-recall
and reliability figures.

They live in the evaluation layer (not in :mod:`embedeval.report`) because the HTML page of a
result (:meth:`EvaluationResult.to_html`) draws them, and a result may not import upwards;
``embedeval evaluate --plots DIR`` writes the same figures through
:func:`embedeval.report.run_figures.write_plots`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "FIGURE_TITLES",
    "higher_is_better",
    "k_sweep_values",
    "main_metric",
    "pair_distances",
    "run_figures",
]

_K_SWEEP = (1, 2, 5, 10, 20, 50, 100)

#: Every figure of a run, in page order, with the caption the HTML report gives it.
FIGURE_TITLES = {
    "per_class": "Per-class values (worst 30)",
    "distance_histograms": "Distances of positive and negative pairs",
    "k_sweep": "Retrieval quality against the depth k",
    "error_reject_curve": "Error against the fraction of least confident queries rejected",
    "confidence_recall": "Confidence against recall",
    "reliability": "Reliability diagram",
}


def run_figures(res: Any, inputs: dict[str, Any] | None) -> dict[str, Any]:
    """The figures of one evaluation, keyed as :data:`FIGURE_TITLES` (those that apply).

    ``inputs`` holds the keyword arguments the result was evaluated with (``query``,
    ``query_labels``, ``reference``, ...); without them only the figures read from the result
    itself are drawn (per-class, and the confidence figures when it holds confidences).

    Examples
    --------
    >>> import embedeval as ee
    >>> x, y = [[0.0], [0.1], [1.0], [1.2]], [0, 0, 1, 1]
    >>> sorted(run_figures(ee.evaluate(x, y, progress=False), {"query": x, "query_labels": y}))
    ['distance_histograms', 'k_sweep', 'per_class']
    """
    figures: dict[str, Any] = {"per_class": _per_class(res)}
    if inputs is not None and inputs.get("query") is not None:
        figures["distance_histograms"] = _histograms(res, inputs)
        figures["k_sweep"] = _k_sweep(res, inputs)
    conf = res.query_confidences
    if conf is None and inputs is not None:
        conf = inputs.get("confidences")
    if conf is not None:
        higher = bool(res.settings.get("higher_is_confident", True))
        figures.update(_confidence_figures(res, conf, higher))
    return {name: fig for name, fig in figures.items() if fig is not None}


def main_metric(res: Any) -> str | None:
    """The metric the figures and the gallery show by default: MAP@R, else R-Precision, else
    P@1, else the first per-query metric."""
    for name in ("map_at_r", "r_precision", "precision_at_1", *res.per_query):
        if res.per_class.get(name):
            return name
    return None


def higher_is_better(res: Any, name: str) -> bool:
    """Whether a larger ``name`` is better in the result ``res``: True except for the custom
    metrics declared ``higher_is_better=False`` (``res.settings["lower_is_better"]``)."""
    return name not in res.settings.get("lower_is_better", ())


def _per_class(res: Any) -> Any:
    from .. import plots

    name = main_metric(res)
    if name is None:
        return None
    table = res.per_class[name]
    return plots.plot_per_class(
        list(table), list(table.values()), metric=name, higher_is_better=higher_is_better(res, name)
    )


def pair_distances(res: Any, inputs: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Sampled positive and negative pair distances over the run's items, each item once."""
    from ..metrics.pairs import positive_negative_distances

    if inputs.get("reference") is None:
        x, y = inputs["query"], inputs["query_labels"]
    elif inputs.get("ref_includes_query"):
        # The queries are the first reference rows: adding them again would pair every query
        # with its own copy, a spurious spike of positives at distance 0.
        x, y = inputs["reference"], inputs["reference_labels"]
    else:
        x = np.concatenate([np.asarray(inputs["query"]), np.asarray(inputs["reference"])])
        y = _joint_labels(inputs["query_labels"], inputs["reference_labels"])
    distance = res.settings["distance"]  # the run's own: what its rankings sorted by
    return positive_negative_distances(x, y, max_pairs=20_000, distance=distance, seed=0)


def _joint_labels(query_labels: Any, reference_labels: Any) -> np.ndarray:
    """Query then reference labels in one array, relevant exactly as in the run: one shared
    integer code per class (joining the raw arrays would turn 5 and "5" alike into strings),
    or the rows of both indicator arrays."""
    from ..utils.validation import as_any_labels, factorize

    yq = as_any_labels(query_labels, "query_labels")
    yb = as_any_labels(reference_labels, "reference_labels")
    if yq.ndim == 2:
        return np.concatenate([yq, yb])
    (cq, cb), _ = factorize(yq, yb)
    return np.concatenate([cq, cb])


#: The histograms' axis for each distance of a run.
_UNITS = {
    "euclidean": "Euclidean distance",
    "cosine": "cosine distance (1 - similarity)",
    "inner_product": "minus the inner product (lower: closer)",
}


def _histograms(res: Any, inputs: dict[str, Any]) -> Any:
    from .. import plots

    pos, neg = pair_distances(res, inputs)
    if pos.size == 0 or neg.size == 0:
        return None
    return plots.plot_distance_histograms(pos, neg, unit=_UNITS[res.settings["distance"]])


def _k_sweep(res: Any, inputs: dict[str, Any]) -> Any:
    from .. import plots

    n_ref = res.settings["n_reference"]
    ks = [k for k in _K_SWEEP if k <= n_ref] or [1]
    values = k_sweep_values(res, inputs, ks)
    return plots.plot_k_sweep(ks, values, title="Retrieval quality against the depth k")


def k_sweep_values(res: Any, inputs: dict[str, Any], ks: list[int]) -> dict[str, list[float]]:
    """Recall@k (hit rate) and Precision@k of the run at each k in ``ks``, averaged as the run
    was (micro, or macro over classes), over the queries the run counted (lone ones left out).

    Read from one exact search of depth ``max(ks)`` with the run's exclusions (the gallery's
    search), so drawing the sweep needs no second evaluation: hit rate@k = 1 when a relevant
    reference is among the k nearest counted ones, Precision@k = relevant among them / k.
    """
    from ..metrics.averages import aggregate, aggregate_label_sets
    from ..utils.validation import as_any_labels, factorize
    from .gallery import ranked_relevance

    keep = (
        "query",
        "query_labels",
        "reference",
        "reference_labels",
        "ref_includes_query",
        "query_groups",
        "reference_groups",
    )
    kw = {k: v for k, v in inputs.items() if k in keep and v is not None}
    hits = np.cumsum(ranked_relevance(max(ks), **kw, distance=res.settings["distance"]), axis=1)
    name = main_metric(res)
    counted = ~np.isnan(res.per_query[name]) if name else np.ones(hits.shape[0], dtype=bool)
    labels = as_any_labels(kw["query_labels"], "query_labels")
    how = res.settings.get("average", "micro")
    codes = uniques = None
    if labels.ndim == 1:
        (codes,), uniques = factorize(labels)

    def average(per_query: np.ndarray) -> float:  # as the run averaged (lone queries: NaN)
        values = np.where(counted, per_query, np.nan)
        if labels.ndim == 2:
            return aggregate_label_sets(values, labels, how)[0]
        return aggregate(values, codes, uniques, how)[0]

    return {
        "Recall@k (hit rate)": [average((hits[:, k - 1] > 0).astype(float)) for k in ks],
        "Precision@k": [average(hits[:, k - 1] / k) for k in ks],
    }


def _confidence_figures(res: Any, conf: Any, higher: bool) -> dict[str, Any]:
    from .. import plots
    from ..metrics.calibration import reliability_diagram
    from ..metrics.confidence import confidence_recall_curve, error_reject_curve

    out: dict[str, Any] = {}
    name = main_metric(res)
    if name is None:
        return out
    curve = error_reject_curve(res.per_query[name], conf, higher_is_confident=higher)
    out["error_reject_curve"] = plots.plot_error_reject_curve(curve, label=name)
    hit = "precision_at_1" if "precision_at_1" in res.per_query else name
    values = res.per_query[hit]
    ok = ~np.isnan(values)
    kappa = np.asarray(conf, dtype=np.float64)[ok]
    crc = confidence_recall_curve(
        values[ok], kappa, bins=10, strategy="quantile", higher_is_confident=higher
    )
    out["confidence_recall"] = plots.plot_confidence_recall(crc, metric=hit, sigma=not higher)
    # A reliability diagram compares confidences with accuracies: only probabilities qualify.
    if higher and hit == "precision_at_1" and kappa.size and 0 <= kappa.min() <= kappa.max() <= 1:
        out["reliability"] = plots.plot_reliability(reliability_diagram(values[ok], kappa))
    return out
