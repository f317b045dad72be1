"""What ``embedeval evaluate`` writes besides the table: input hashes, each query's nearest
counted reference, and the figures of one run (``--plots DIR``)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..utils.validation import factorize

#: The figures ``--plots`` writes; the confidence ones only when confidences are given.
PLOT_NAMES = (
    "per_class",
    "distance_histograms",
    "k_sweep",
    "error_reject_curve",
    "confidence_recall",
)
_K_SWEEP = (1, 2, 5, 10, 20, 50, 100)


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def top1(inputs: dict[str, Any], res: Any, n_threads: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Index and distance of each query's nearest *counted* reference (its own row and its
    group excluded, as in the evaluation); -1 and NaN when it can see none.

    Searched in query blocks at a depth that outlasts the largest excluded set, so memory is
    bounded by the block, never by n_query x n_reference.
    """
    from ..search.neighbors import neighbors

    xq = np.asarray(inputs["query"])
    xb = inputs.get("reference")
    self_index = xb is None or bool(inputs.get("ref_includes_query"))
    xb = xq if xb is None else np.asarray(xb)
    gq, gb = inputs.get("query_groups"), inputs.get("reference_groups")
    if gq is not None and gb is None:
        gb = gq
    n_q, n_b = xq.shape[0], xb.shape[0]
    if gq is not None:
        (cq, cb), _ = factorize(np.asarray(gq), np.asarray(gb))
        excluded = np.bincount(cb, minlength=int(max(cq.max(), cb.max())) + 1)[cq]
    else:
        cq = cb = None
        excluded = np.zeros(n_q, dtype=np.int64)
    depth = int(min(n_b, int(excluded.max(initial=0)) + int(self_index) + 1))
    idx = np.full(n_q, -1, dtype=np.int64)
    dist = np.full(n_q, np.nan)
    step = max(1, 4_000_000 // max(depth, 1))
    for s in range(0, n_q, step):
        e = min(s + step, n_q)
        d, i = neighbors(xq[s:e], depth, xb, distance=res.settings["distance"], n_threads=n_threads)
        ok = np.ones(i.shape, dtype=bool)
        if self_index:
            ok &= i != np.arange(s, e)[:, None]
        if cq is not None:
            ok &= cb[i] != cq[s:e, None]
        first = ok.argmax(axis=1)
        has = ok[np.arange(e - s), first]
        rows = np.flatnonzero(has)
        idx[s + rows] = i[rows, first[rows]]
        dist[s + rows] = d[rows, first[rows]]
    return idx, dist


def write_plots(res: Any, inputs: dict[str, Any], folder: str, fmt: str = "png") -> list[Path]:
    """Write the figures of one evaluation to ``folder``; returns the paths written."""
    from .. import plots

    out = Path(folder)
    figures = {"per_class": _per_class(res), "distance_histograms": _histograms(res, inputs)}
    figures["k_sweep"] = _k_sweep(res, inputs)
    conf = inputs.get("confidences")
    if conf is not None:
        figures.update(_confidence_figures(res, conf, bool(inputs.get("higher_is_confident"))))
    written = []
    for name, fig in figures.items():
        if fig is None:
            continue
        written.append(plots.save_figure(fig, out / f"{name}.{fmt}", dpi=200))
        _close(fig)
    return written


def _close(fig: Any) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)


def _main_metric(res: Any) -> str | None:
    for name in ("map_at_r", "r_precision", "precision_at_1", *res.per_query):
        if res.per_class.get(name):
            return name
    return None


def _per_class(res: Any) -> Any:
    from .. import plots

    name = _main_metric(res)
    if name is None:
        return None
    table = res.per_class[name]
    return plots.plot_per_class(list(table), list(table.values()), metric=name)


def _pair_distances(res: Any, inputs: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Sampled positive and negative pair distances over the run's items, each item once."""
    from .datasets import positive_negative_distances

    if inputs.get("reference") is None:
        x, y = inputs["query"], inputs["query_labels"]
    elif inputs.get("ref_includes_query"):
        # The queries are the first reference rows: adding them again would pair every query
        # with its own copy, a spurious spike of positives at distance 0.
        x, y = inputs["reference"], inputs["reference_labels"]
    else:
        x = np.concatenate([np.asarray(inputs["query"]), np.asarray(inputs["reference"])])
        y = np.concatenate([np.asarray(inputs["query_labels"]), inputs["reference_labels"]])
    distance = "cosine" if res.settings["distance"] == "cosine" else "euclidean"
    return positive_negative_distances(x, y, max_pairs=20_000, distance=distance, seed=0)


def _histograms(res: Any, inputs: dict[str, Any]) -> Any:
    from .. import plots

    distance = "cosine" if res.settings["distance"] == "cosine" else "euclidean"
    pos, neg = _pair_distances(res, inputs)
    if pos.size == 0 or neg.size == 0:
        return None
    unit = "cosine distance (1 - similarity)" if distance == "cosine" else "Euclidean distance"
    return plots.plot_distance_histograms(pos, neg, unit=unit)


def _k_sweep(res: Any, inputs: dict[str, Any]) -> Any:
    from .. import plots
    from ..evaluation.evaluate import evaluate

    n_ref = res.settings["n_reference"]
    ks = [k for k in _K_SWEEP if k <= n_ref] or [1]
    kw = {k: v for k, v in inputs.items() if k not in ("confidences", "higher_is_confident")}
    sweep = evaluate(
        **kw,
        metrics=[f"recall_at_{k}" for k in ks] + [f"precision_at_{k}" for k in ks],
        distance=res.settings["distance"],
        average=res.settings["average"],
        progress=False,
    )
    values = {
        "Recall@k (hit rate)": [sweep[f"recall_at_{k}"] for k in ks],
        "Precision@k": [sweep[f"precision_at_{k}"] for k in ks],
    }
    return plots.plot_k_sweep(ks, values, title="Retrieval quality against the depth k")


def _confidence_figures(res: Any, conf: Any, higher: bool) -> dict[str, Any]:
    from .. import plots
    from ..metrics.confidence import confidence_recall_curve, error_reject_curve

    out: dict[str, Any] = {}
    name = _main_metric(res)
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
    return out
