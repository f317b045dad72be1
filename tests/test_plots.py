"""Figures render, are non-blank and deterministic; generate_figures writes every §7 figure."""

from __future__ import annotations

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from matplotlib.image import imread  # noqa: E402

from embedeval import plots  # noqa: E402
from embedeval._figures import FIGURES, generate_figures  # noqa: E402
from embedeval.confidence import error_reject_curve  # noqa: E402


def _check_png(path, min_w=400, min_h=300):
    img = imread(path)
    h, w = img.shape[:2]
    assert w >= min_w and h >= min_h
    assert img[..., :3].std() > 0.05  # not blank


def test_every_plot_function_renders(tmp_path):
    rng = np.random.default_rng(0)
    erc = error_reject_curve(rng.random(50), rng.random(50))
    figs = {
        "embedding": plots.plot_embedding_2d(
            rng.random((50, 2)),
            rng.integers(0, 2, 50),
            alpha=rng.random(50),
            marked=rng.random(50) < 0.1,
            title="t",
        ),
        "erc": plots.plot_error_reject_curve(erc),
        "conf": plots.plot_confidence_metrics([0, 1], {"a": [0.1, 0.2]}),
        "corr": plots.plot_rank_correlation([0, 1], [-0.5, 0.5], clean_sigma=0.5),
        "ckpt": plots.plot_checkpoints(
            ["a", "b"], {"m": [0.1, 0.2]}, {"m": [0.0, 0.1]}, {"m": [0.2, 0.3]}
        ),
        "k": plots.plot_k_sweep([1, 10], {"r": [0.5, 0.9]}),
        "cls": plots.plot_per_class(["x", "y", "z"], [0.3, 0.1, 0.2], top=2),
        "hist": plots.plot_distance_histograms(rng.random(100), rng.random(100) + 1),
    }
    for name, fig in figs.items():
        ax = fig.axes[0]
        assert ax.get_title() or name == "embedding"
        assert ax.get_xlabel() and ax.get_ylabel()
        path = plots.save_figure(fig, tmp_path / f"{name}.png")
        _check_png(path, 300, 150)


def test_generate_figures_is_complete_and_deterministic(tmp_path):
    paths = generate_figures(tmp_path / "a")
    assert sorted(p.name for p in paths) == sorted(FIGURES)
    for p in paths:
        _check_png(p)
    again = generate_figures(tmp_path / "b")
    for p, q in zip(sorted(paths), sorted(again), strict=True):
        assert p.read_bytes() == q.read_bytes(), p.name
