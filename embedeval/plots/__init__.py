"""Matplotlib figures drawn from the arrays they are given (no metric is computed here).

Every function takes an optional ``ax``, returns the Figure and imports matplotlib on first use.
This folder sits just above :mod:`embedeval.utils`, so the statistics modules can offer ``.plot()``
on their results without importing anything above them.
"""

from .draw import (
    plot_checkpoints,
    plot_cmc,
    plot_confidence_metrics,
    plot_confidence_recall,
    plot_coverage,
    plot_det,
    plot_distance_histograms,
    plot_embedding_2d,
    plot_error_reject_curve,
    plot_k_sweep,
    plot_per_class,
    plot_rank_correlation,
    plot_reliability,
    plot_roc,
    save_figure,
)

__all__ = [
    "plot_checkpoints",
    "plot_cmc",
    "plot_confidence_metrics",
    "plot_confidence_recall",
    "plot_coverage",
    "plot_det",
    "plot_distance_histograms",
    "plot_embedding_2d",
    "plot_error_reject_curve",
    "plot_k_sweep",
    "plot_per_class",
    "plot_rank_correlation",
    "plot_reliability",
    "plot_roc",
    "save_figure",
]
