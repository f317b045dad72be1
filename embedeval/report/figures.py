"""Regenerate the figures of the README and of ``docs/figures.md``, deterministically.

``generate_figures(out_dir)`` (or ``embedeval figures --out DIR`` on the command line) draws every
figure from seeded toy spaces and simulations (:mod:`embedeval.report.datasets`) with the plotting
functions of :mod:`embedeval.plots`: the same seed gives the same pixels.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .. import plots
from . import datasets

__all__ = ["FIGURES", "generate_figures"]

#: The file names :func:`generate_figures` writes (one figure each).
FIGURES = (
    "reality_check_example1.png",
    "reality_check_example2.png",
    "reality_check_example3.png",
    "confidence_example2.png",
    "confidence_recall_metrics.png",
    "rank_corr_over_simulated_sigmas.png",
    "error_reject_curve.png",
    "checkpoint_comparison.png",
    "k_sweep.png",
    "per_class.png",
    "distance_histograms.png",
)

_REALITY_METRICS = ["precision_at_1", "recall_at_10", "r_precision", "map_at_r"]
_CLEAN_LEVEL = 0.7  # the clean points' confidence in the confidence sweep
_SWEEP_KS = [1, 2, 5, 10, 20, 50]


def generate_figures(out_dir: str | os.PathLike = "figures", *, seed: int = 0) -> list[Path]:
    """Write the documented figures to ``out_dir`` and return their paths.

    Parameters
    ----------
    out_dir : str or path-like
        Folder to write into (created if missing); files are replaced atomically.
    seed : int
        Seed of every random draw (toy spaces, corruption, simulated confidences, bootstrap);
        the same seed gives the same pixels.

    Returns
    -------
    list of pathlib.Path
        One path per name in :data:`FIGURES`.

    Examples
    --------
    A few seconds on one core, so not run here:

    >>> from embedeval.report.figures import generate_figures
    >>> paths = generate_figures("figures", seed=0)  # doctest: +SKIP
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []

    def save(fig: Any, name: str) -> None:
        paths.append(plots.save_figure(fig, out / name))

    for which in (1, 2, 3):
        save(_reality_check_figure(which, seed), f"reality_check_example{which}.png")
    _confidence_figures(save, seed)
    save(_rank_correlation_figure(seed), "rank_corr_over_simulated_sigmas.png")
    _model_figures(save, seed)
    return paths


def _reality_check_figure(which: int, seed: int = 0) -> Any:
    """Toy space ``which`` (1, 2 or 3), titled with its P@1, R@10, R-Precision and MAP@R."""
    from ..evaluation.evaluate import evaluate

    x, y = datasets.reality_check_example(400, which, seed=seed)
    res = evaluate(x, y, metrics=_REALITY_METRICS, progress=False)
    title = (
        f"Reality check example {which}: P@1 {res['precision_at_1']:.3f}, "
        f"R@10 {res['recall_at_10']:.3f},\nR-Precision {res['r_precision']:.3f}, "
        f"MAP@R {res['map_at_r']:.3f}"
    )
    return plots.plot_embedding_2d(x, y, title=title)


def _confidence_figures(save: Callable[[Any, str], None], seed: int) -> None:
    # Example 2 with injected errors: flipped labels that the model is unsure about.
    from ..evaluation.evaluate import evaluate
    from ..metrics.confidence import error_reject_curve

    x, y = datasets.reality_check_example(400, 2, seed=seed)
    y_bad, mask = datasets.corrupt_labels(y, fraction=0.1, seed=seed)
    conf = datasets.simulate_confidences(
        mask, corrupted_level=0.15, clean_level=0.85, noise=0.08, seed=seed
    )
    res = evaluate(
        x, y_bad, metrics=["precision_at_1", "map_at_r"], confidences=conf, progress=False
    )
    title = (
        f"Example 2, 10% labels flipped; opacity = confidence\nP@1 "
        f"{res['precision_at_1']:.3f}, AUERC(R@1) {res['auerc_precision_at_1']:.3f}, "
        f"R-AUROC {res['r_auroc']:.3f}"
    )
    save(
        plots.plot_embedding_2d(x, y_bad, alpha=conf, marked=mask, title=title),
        "confidence_example2.png",
    )
    erc = error_reject_curve(res.per_query["map_at_r"], conf)
    save(plots.plot_error_reject_curve(erc, label="MAP@R error"), "error_reject_curve.png")
    save(_confidence_sweep_figure(x, y, seed), "confidence_recall_metrics.png")


def _confidence_sweep_figure(x: np.ndarray, y: np.ndarray, seed: int = 0) -> Any:
    """AUERC (via R@1 and MAP@R) and R-AUROC as the confidence of flipped labels sweeps."""
    sweep = datasets.confidence_sweep(x, y, fraction=0.1, clean_level=_CLEAN_LEVEL, seed=seed)
    return plots.plot_confidence_metrics(
        sweep["levels"],
        {
            "AUERC via R@1": sweep["auerc_recall_at_1"],
            "AUERC via MAP@R": sweep["auerc_map_at_r"],
            "R-AUROC": sweep["r_auroc"],
        },
        higher_is_better={"AUERC via R@1": False, "AUERC via MAP@R": False, "R-AUROC": True},
        clean_level=_CLEAN_LEVEL,
    )


def _rank_correlation_figure(seed: int = 0) -> Any:
    """Spearman correlation of predicted and true sigmas over simulated corrupted subsets."""
    corr = datasets.sigma_rank_correlation_sweep(500, seed=seed)
    return plots.plot_rank_correlation(corr["injected"], corr["statistic"], clean_sigma=0.1)


def _model_figures(save: Callable[[Any, str], None], seed: int) -> None:
    # Checkpoints: the same clusters embedded with shrinking noise (a model that improves). One
    # generator draws the centres, the four checkpoints, then the last embedding, in that order.
    from ..evaluation.compare import compare
    from ..evaluation.evaluate import evaluate

    _, labels = datasets.gaussian_clusters(1500, 30, 32, seed=seed)
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((30, 32))
    runs = {}
    for epoch, spread in zip((1, 5, 10, 20), (2.2, 1.5, 1.1, 0.9), strict=True):
        emb = centers[labels] + spread * rng.standard_normal((1500, 32))
        runs[f"epoch {epoch}"] = evaluate(
            emb, labels, metrics=["precision_at_1", "map_at_r"], progress=False
        )
    save(compare(runs, n_boot=300, seed=seed).plot(), "checkpoint_comparison.png")
    last = centers[labels] + 1.1 * rng.standard_normal((1500, 32))
    save(_k_sweep_figure(last, labels), "k_sweep.png")
    save(_per_class_figure(last, labels), "per_class.png")
    pos, neg = datasets.positive_negative_distances(last, labels, max_pairs=20_000, seed=seed)
    save(plots.plot_distance_histograms(pos, neg), "distance_histograms.png")


def _k_sweep_figure(embeddings: np.ndarray, labels: np.ndarray) -> Any:
    """Recall@k (hit rate) and Precision@k of a leave-one-out run for k in 1..50."""
    from ..evaluation.evaluate import evaluate

    ks = _SWEEP_KS
    res = evaluate(
        embeddings,
        labels,
        metrics=[f"recall_at_{k}" for k in ks] + [f"precision_at_{k}" for k in ks],
        progress=False,
    )
    return plots.plot_k_sweep(
        ks,
        {
            "Recall@k (hit rate)": [res[f"recall_at_{k}"] for k in ks],
            "Precision@k": [res[f"precision_at_{k}"] for k in ks],
        },
    )


def _per_class_figure(embeddings: np.ndarray, labels: np.ndarray) -> Any:
    """The 15 classes with the lowest leave-one-out MAP@R, against the mean over classes."""
    from ..evaluation.evaluate import evaluate

    res = evaluate(embeddings, labels, metrics=["map_at_r"], progress=False)
    table = res.per_class["map_at_r"]
    return plots.plot_per_class(list(table), list(table.values()), top=15, metric="MAP@R")
