"""Regenerate every committed figure (``embedeval figures``), deterministically."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from . import datasets, plots

__all__ = ["FIGURES", "generate_figures"]

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


def generate_figures(out_dir: str | os.PathLike = "figures", *, seed: int = 0) -> list[Path]:
    """Write the README's figures to ``out_dir`` and return their paths.

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
    """
    from .compare import compare
    from .confidence import error_reject_curve
    from .evaluate import evaluate

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    metrics = ["precision_at_1", "recall_at_10", "r_precision", "map_at_r"]

    def save(fig, name):
        paths.append(plots.save_figure(fig, out / name))

    for which in (1, 2, 3):
        x, y = datasets.reality_check_example(400, which, seed=seed)
        res = evaluate(x, y, metrics=metrics, progress=False)
        title = (
            f"Reality check example {which}: P@1 {res['precision_at_1']:.3f}, "
            f"R@10 {res['recall_at_10']:.3f},\nR-Precision {res['r_precision']:.3f}, "
            f"MAP@R {res['map_at_r']:.3f}"
        )
        save(plots.plot_embedding_2d(x, y, title=title), f"reality_check_example{which}.png")

    # Example 2 with injected errors: flipped labels that the model is unsure about.
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

    clean = 0.7  # the clean points' confidence in the sweep
    sweep = datasets.confidence_sweep(x, y, fraction=0.1, clean_level=clean, seed=seed)
    save(
        plots.plot_confidence_metrics(
            sweep["levels"],
            {
                "AUERC via R@1": sweep["auerc_recall_at_1"],
                "AUERC via MAP@R": sweep["auerc_map_at_r"],
                "R-AUROC": sweep["r_auroc"],
            },
            higher_is_better={"AUERC via R@1": False, "AUERC via MAP@R": False, "R-AUROC": True},
            clean_level=clean,
        ),
        "confidence_recall_metrics.png",
    )

    corr = datasets.sigma_rank_correlation_sweep(500, seed=seed)
    save(
        plots.plot_rank_correlation(corr["injected"], corr["statistic"], clean_sigma=0.1),
        "rank_corr_over_simulated_sigmas.png",
    )

    # Checkpoints: the same clusters embedded with shrinking noise (a model that improves).
    _, labels = datasets.gaussian_clusters(1500, 30, 32, seed=seed)
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((30, 32))
    runs = {}
    for epoch, spread in zip((1, 5, 10, 20), (2.2, 1.5, 1.1, 0.9), strict=True):
        emb = centers[labels] + spread * rng.standard_normal((1500, 32))
        runs[f"epoch {epoch}"] = evaluate(
            emb, labels, metrics=["precision_at_1", "map_at_r"], progress=False
        )
    cmp = compare(runs, n_boot=300, seed=seed)
    save(cmp.plot(), "checkpoint_comparison.png")

    last = centers[labels] + 1.1 * rng.standard_normal((1500, 32))
    ks = [1, 2, 5, 10, 20, 50]
    res = evaluate(
        last,
        labels,
        metrics=[f"recall_at_{k}" for k in ks] + [f"precision_at_{k}" for k in ks],
        progress=False,
    )
    save(
        plots.plot_k_sweep(
            ks,
            {
                "Recall@k (hit rate)": [res[f"recall_at_{k}"] for k in ks],
                "Precision@k": [res[f"precision_at_{k}"] for k in ks],
            },
        ),
        "k_sweep.png",
    )
    res = evaluate(last, labels, metrics=["map_at_r"], progress=False)
    table = res.per_class["map_at_r"]
    save(
        plots.plot_per_class(list(table), list(table.values()), top=15, metric="MAP@R"),
        "per_class.png",
    )
    pos, neg = datasets.positive_negative_distances(last, labels, max_pairs=20_000, seed=seed)
    save(plots.plot_distance_histograms(pos, neg), "distance_histograms.png")
    return paths
