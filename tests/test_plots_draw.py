"""Plot functions render non-blank figures of the arrays they are given and refuse bad input."""

from __future__ import annotations

import re

import numpy as np
import pytest

import embedeval as ee
from embedeval import plots
from embedeval.protocols import verification as ver

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from matplotlib.image import imread  # noqa: E402

from embedeval import InputError, InputTypeError  # noqa: E402
from embedeval.metrics.confidence import error_reject_curve  # noqa: E402


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
        assert ax.get_title(), name
        assert ax.get_xlabel() and ax.get_ylabel(), name
        legend = ax.get_legend()
        assert legend is not None and [t.get_text() for t in legend.get_texts()], name
        path = plots.save_figure(fig, tmp_path / f"{name}.png")
        _check_png(path, 300, 150)


def test_embedding_legend_does_not_cover_points():
    # A point in every corner: a legend inside the axes would hide one of them.
    pts = [[0, 0], [0, 1], [1, 0], [1, 1], [0.5, 0.5]]
    fig = plots.plot_embedding_2d(pts, [0, 0, 1, 1, 1], marked=np.array([1, 0, 0, 0, 0], bool))
    fig.canvas.draw()
    ax = fig.axes[0]
    legend_box = ax.get_legend().get_window_extent()
    axes_box = ax.get_window_extent()
    assert legend_box.x0 >= axes_box.x1 or legend_box.y1 <= axes_box.y0
    for child in ax.collections:
        for x, y in ax.transData.transform(child.get_offsets()):
            assert not legend_box.contains(x, y)


def test_k_sweep_ticks_are_the_k_values():
    fig = plots.plot_k_sweep([1, 2, 5, 10, 20, 50], {"R@k": [0.5, 0.6, 0.7, 0.8, 0.9, 1.0]})
    fig.canvas.draw()
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "5", "10", "20", "50"]


def test_per_class_marks_the_mean_over_every_class():
    fig = plots.plot_per_class(["a", "b", "c", "d"], [0.9, 0.1, 0.5, np.nan], top=2)
    ax = fig.axes[0]
    mean_line = ax.get_lines()[0]
    assert mean_line.get_xdata()[0] == pytest.approx((0.9 + 0.1 + 0.5) / 3)
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert texts[0] == "mean over all 3 classes (0.500)"


def test_plots_draw_exactly_the_given_arrays():
    fig = plots.plot_k_sweep([1, 5, 10], {"R@k": [0.2, 0.5, 0.7], "P@k": [0.2, 0.1, 0.05]})
    lines = fig.axes[0].get_lines()
    assert [ln.get_label() for ln in lines] == ["R@k", "P@k"]
    np.testing.assert_array_equal(lines[0].get_xydata(), [[1, 0.2], [5, 0.5], [10, 0.7]])
    # greyscale: the two series differ in marker and line style, not colour alone
    assert lines[0].get_marker() != lines[1].get_marker()
    assert lines[0].get_linestyle() != lines[1].get_linestyle()


def test_per_class_shows_the_worst_classes_first():
    fig = plots.plot_per_class(["a", "b", "c", "d"], [0.9, 0.1, 0.5, 0.3], top=2)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["b", "d"]
    assert sorted(p.get_width() for p in ax.patches) == [0.1, 0.3]


def test_per_class_of_a_lower_is_better_metric_shows_the_highest_first():
    # mean ranks: the worst classes are the highest; equal values keep the label order
    fig = plots.plot_per_class(
        ["a", "b", "c", "d", "e"], [2.0, 7.0, np.nan, 4.0, 7.0], top=3, higher_is_better=False
    )
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["b", "e", "d"]
    assert [p.get_width() for p in ax.patches] == [7.0, 7.0, 4.0]
    assert ax.get_xlabel() == "metric (per class, lower is better)"
    assert ax.get_title() == "Per-class metric, worst 3 of 5 (highest first)"


def test_error_reject_curve_reference_lines():
    y = np.array([1.0, 0.0, 1.0, 0.0])
    erc = error_reject_curve(y, np.array([0.1, 0.9, 0.2, 0.8]))
    ax = plots.plot_error_reject_curve(erc, label="m").axes[0]
    labels = [ln.get_label() for ln in ax.get_lines()]
    assert labels[0].startswith("m (AUERC") and labels[1].startswith("oracle")
    assert labels[2].startswith("random")
    # the random reference is the mean error, 2/4 (hand value), whatever the confidences
    assert ax.get_lines()[2].get_ydata()[0] == pytest.approx(0.5)


def test_plots_draw_into_a_given_axes():
    from matplotlib.figure import Figure

    fig = Figure()
    ax1, ax2 = fig.subplots(1, 2)
    out = plots.plot_distance_histograms([0.1, 0.2], [0.9, 1.0], ax=ax2, bins=5)
    assert out is fig and ax2.get_title() and not ax1.get_title()


def test_save_figure_is_atomic_and_leaves_no_temp_files(tmp_path):
    fig = plots.plot_k_sweep([1, 2], {"a": [0.1, 0.2]})
    path = plots.save_figure(fig, tmp_path / "k.png", dpi=50)
    assert [p.name for p in tmp_path.iterdir()] == ["k.png"]
    assert imread(path).shape[:2] == (round(4.2 * 50), round(6.0 * 50))


_E = np.zeros((3, 2))


@pytest.mark.parametrize(
    ("call", "err", "match"),
    [
        (lambda: plots.plot_embedding_2d(np.zeros((3, 3)), [0, 1, 0]), InputError, "2 columns"),
        (lambda: plots.plot_embedding_2d(_E, [0, 1]), InputError, "labels"),
        (lambda: plots.plot_embedding_2d(_E, [0, 1, 0], alpha=[0.5]), InputError, "alpha"),
        (lambda: plots.plot_embedding_2d(_E, [0, 1, 0], alpha=[0, 2, 0]), InputError, r"\[1\]"),
        (lambda: plots.plot_embedding_2d(_E, [0, 1, 0], marked=[1, 0, 0]), InputError, "marked"),
        (lambda: plots.plot_embedding_2d([[0, np.nan]], [0]), InputError, "NaN"),
        (lambda: plots.plot_error_reject_curve((1, 2)), InputTypeError, "ErrorRejectCurve"),
        (lambda: plots.plot_confidence_metrics([0, 1], {"a": [1]}), InputError, "a"),
        (lambda: plots.plot_confidence_metrics([0, 1], [0.1, 0.2]), InputTypeError, "mapping"),
        (lambda: plots.plot_confidence_metrics([0, 1], {}), InputError, "empty"),
        (lambda: plots.plot_rank_correlation([0, 1], [0.1]), InputError, "correlation"),
        (
            lambda: plots.plot_confidence_metrics([0, 1], {"a": [1, 2]}, clean_level="0.5"),
            InputError,
            "clean_level must be a number",
        ),
        (
            lambda: plots.plot_rank_correlation([0, 1], [0.1, 0.2], clean_sigma=np.nan),
            InputError,
            "clean_sigma must be a finite number",
        ),
        (lambda: plots.plot_checkpoints([], {"m": []}), InputError, "names"),
        (lambda: plots.plot_checkpoints(["a", "b"], {"m": [1]}), InputError, "values"),
        (
            lambda: plots.plot_checkpoints(["a"], {"m": [1]}, lows={"m": [0]}),
            InputError,
            "both",
        ),
        (
            lambda: plots.plot_checkpoints(["a"], {"m": [1]}, {"x": [0]}, {"x": [2]}),
            InputError,
            "no band",
        ),
        (lambda: plots.plot_k_sweep([0, 1], {"a": [1, 2]}), InputError, "positive"),
        (lambda: plots.plot_k_sweep([1, 2], {"a": ["x", "y"]}), InputTypeError, "numeric"),
        (lambda: plots.plot_per_class(["a"], [0.1, 0.2]), InputError, "values"),
        (lambda: plots.plot_per_class(["a"], [0.1], top=0), InputError, "top"),
        (lambda: plots.plot_distance_histograms([], [1.0]), InputError, "pos"),
        (lambda: plots.plot_distance_histograms([1.0], [np.inf]), InputError, "neg"),
        (lambda: plots.plot_distance_histograms([1.0], [2.0], bins=0), InputError, "bins"),
    ],
)
def test_bad_inputs(call, err, match):
    with pytest.raises(err, match=match):
        call()


# ROC / DET / CMC figures draw the arrays they are given.


SCORES = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]
GENUINE = [True, True, False, True, False, True, False, False]


def test_roc_draws_curve_and_operating_points():
    r = ver.roc(SCORES, GENUINE)
    op = ver.tar_at_far(SCORES, GENUINE, far=[0.25, 0.5])
    fig = plots.plot_roc({"a": r}, operating_points=op)
    ax = fig.axes[0]
    curve, marks = ax.get_lines()[:2]
    np.testing.assert_array_equal(curve.get_ydata(), r.tar)
    # Impostors 0.7, 0.5, 0.3, 0.2.  FAR 0.25 lets one pass: accept > 0.5 -> genuine 0.9, 0.8,
    # 0.6 = 3/4.  FAR 0.5 lets two pass: accept > 0.3 -> all 4 genuine = 1.
    assert marks.get_xdata().tolist() == [0.25, 0.5]
    assert marks.get_ydata().tolist() == [0.75, 1.0]
    assert ax.get_title() and ax.get_xlabel() and ax.get_legend() is not None


def test_det_draws_fnmr():
    r = ver.roc(SCORES, GENUINE)
    fig = plots.plot_det(r)
    y = fig.axes[0].get_lines()[0].get_ydata()
    # FNMR 0 cannot sit on a log axis: drawn at half the finest step (1/4 genuine -> 1/8).
    np.testing.assert_allclose(y, np.maximum(1 - r.tar, 1 / 8))


def test_cmc_plot_from_result():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 3)).astype(np.float32)
    y = rng.integers(0, 5, 40)
    cmc = ee.evaluate(x, y, metrics=["mrr"]).cmc(10)
    fig = plots.plot_cmc({"m": cmc})
    line = fig.axes[0].get_lines()[0]
    assert line.get_xdata().tolist() == list(range(1, 11))
    np.testing.assert_array_equal(line.get_ydata(), cmc)


def test_plot_roc_rejects_other_objects():
    with pytest.raises(ee.InputTypeError, match="RocCurve"):
        plots.plot_roc({"a": [0.1, 0.2]})


# Labels of the data, as a class or checkpoint may be named; "$...$" would be read as mathtext.
_DOLLAR_LABELS = ["$\\frac{a$", "c$10-$20", "b"]


def _drawn(text):
    """The characters matplotlib draws for a text without mathtext: no unescaped "$" may remain
    (an even number of them starts mathtext), and every escaped one is drawn as "$"."""
    assert not re.search(r"(?<!\\)\$", text), text
    return text.replace("\\$", "$")


def test_labels_with_dollar_signs_are_drawn_as_written(tmp_path):
    per_class = plots.plot_per_class(_DOLLAR_LABELS, [0.1, 0.2, 0.3])
    ticks = [_drawn(t.get_text()) for t in per_class.axes[0].get_yticklabels()]
    assert ticks == _DOLLAR_LABELS
    points = plots.plot_embedding_2d([[0, 0], [1, 1], [2, 0]], _DOLLAR_LABELS)
    legend = [_drawn(t.get_text()) for t in points.axes[0].get_legend().get_texts()]
    assert legend == [f"class {c}" for c in sorted(_DOLLAR_LABELS)]
    values = {"$x$ rate": [0.1, 0.2, 0.3]}
    checkpoints = plots.plot_checkpoints(_DOLLAR_LABELS, values)
    ax = checkpoints.axes[0]
    assert [_drawn(t.get_text()) for t in ax.get_xticklabels()] == _DOLLAR_LABELS
    assert [_drawn(t.get_text()) for t in ax.get_legend().get_texts()] == ["$x$ rate"]
    for i, fig in enumerate((per_class, points, checkpoints)):
        plots.save_figure(fig, tmp_path / f"{i}.png", dpi=40)  # "\frac{a" is no valid mathtext


def test_long_and_multi_line_labels_are_drawn_on_one_short_line(tmp_path):
    # A 3,000-character class name made the per-class figure 15,000 pixels wide (its bars a
    # sliver once shown at the page's width), and a tab or newline drew as a missing glyph.
    long_name, broken = "L" * 3000, "x&y\n\tz"
    fig = plots.plot_per_class([long_name, broken, "c"], [0.1, 0.2, 0.3])
    ticks = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert ticks == ["L" * 59 + "…", "x&y  z", "c"]
    fig.savefig(tmp_path / "pc.png", dpi=50, bbox_inches="tight")
    assert imread(tmp_path / "pc.png").shape[1] < 600  # 6 inches of axes, 60 characters


def test_series_names_with_dollar_signs_are_drawn_as_written():
    named = {"$a$": [0.1, 0.2], "b$": [0.3, 0.4]}
    for fig in (
        plots.plot_k_sweep([1, 2], named),
        plots.plot_confidence_metrics([0.0, 1.0], named),
        plots.plot_cmc(named),
    ):
        texts = [_drawn(t.get_text()) for t in fig.axes[0].get_legend().get_texts()]
        assert texts[:2] == list(named)


def test_comparison_plot_of_checkpoints_named_with_dollar_signs(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((24, 3)), np.arange(24) % 3
    runs = {
        name: ee.evaluate(x + 0.1 * i, y, progress=False) for i, name in enumerate(_DOLLAR_LABELS)
    }
    fig = ee.compare(runs, n_boot=10).plot()
    ax = fig.axes[0]
    assert _drawn(ax.get_title()).startswith(f"Checkpoints vs {_DOLLAR_LABELS[0]} ")
    assert [_drawn(t.get_text()) for t in ax.get_xticklabels()] == _DOLLAR_LABELS
    plots.save_figure(fig, tmp_path / "cmp.png", dpi=40)


def test_saved_pngs_carry_no_software_version_whatever_the_suffix_case(tmp_path):
    from PIL import Image

    fig = plots.plot_k_sweep([1, 2], {"a": [0.1, 0.2]})
    for name in ("k.png", "k.PNG", "k"):
        with Image.open(plots.save_figure(fig, tmp_path / name, dpi=30)) as im:
            assert im.format == "PNG" and "Software" not in im.info, name


def _inside_figure(fig, artist):
    fig.canvas.draw()
    box = artist.get_window_extent()
    width, height = fig.canvas.get_width_height()
    return box.x0 >= 0 and box.y0 >= 0 and box.x1 <= width and box.y1 <= height


def test_per_class_title_and_legend_stay_inside_the_figure_with_long_class_names():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    names = [f"{'a long class name ' * 4}{i}" for i in range(6)]
    fig = plots.plot_per_class(names, np.linspace(0.1, 0.9, 6), metric="MAP@R (model A)")
    FigureCanvasAgg(fig)
    ax = fig.axes[0]
    legend = ax.get_legend()
    assert "MAP@R (model A) of the class" in [t.get_text() for t in legend.get_texts()]
    assert ax.get_title() == "Per-class MAP@R (model A)"
    assert _inside_figure(fig, legend)
    assert _inside_figure(fig, ax.title)


def test_checkpoint_names_that_would_overlap_are_thinned_and_slanted():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    names = [f"epoch {i}" for i in range(40)]
    ax = plots.plot_checkpoints(names, {"MAP@R": np.linspace(0, 1, 40)}).axes[0]
    shown = ax.get_xticklabels()
    assert [t.get_text() for t in shown] == names[::2]  # 20 names, every other one
    assert ax.get_xticks().tolist() == list(range(0, 40, 2))
    assert {t.get_rotation() for t in shown} == {45.0}
    # Three long names side by side overlapped unslanted; slanted they are cut, and the
    # figure grows so that the y label still fits beside the plot.
    long_names = [f"{'a checkpoint with a long name ' * 3}{i}" for i in range(3)]
    fig = plots.plot_checkpoints(long_names, {"MAP@R": [0.2, 0.4, 0.6]})
    FigureCanvasAgg(fig)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [n[:29] + "…" for n in long_names]
    assert {t.get_rotation() for t in ax.get_xticklabels()} == {45.0}
    assert _inside_figure(fig, ax.yaxis.label)
    for text in ax.get_xticklabels():
        assert _inside_figure(fig, text)


def test_comparison_plot_title_names_a_long_or_multi_line_baseline_on_one_short_line():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((24, 3)), np.arange(24) % 3
    baseline = "runs/2024-06-01/a-model-with-a-long-name\nepoch_50.npy"
    runs = {
        baseline: ee.evaluate(x, y, progress=False),
        "b": ee.evaluate(x + 0.1, y, progress=False),
    }
    fig = ee.compare(runs, n_boot=10).plot()
    FigureCanvasAgg(fig)
    ax = fig.axes[0]
    assert ax.get_title() == "Checkpoints vs runs/2024-06-01/a-m… (95% CI)"
    assert _inside_figure(fig, ax.title)


def test_k_sweep_labels_of_a_long_or_repeated_sweep_do_not_overlap():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = plots.plot_k_sweep(np.arange(1, 101), {"R@k": np.linspace(0, 1, 100)})
    FigureCanvasAgg(fig).draw()
    shown = fig.axes[0].get_xticklabels()
    texts = [t.get_text() for t in shown]
    assert texts[0] == "1" and texts[-1] == "100" and len(texts) <= 11
    boxes = [t.get_window_extent() for t in shown]
    assert all(boxes[i].x1 < boxes[i + 1].x0 for i in range(len(boxes) - 1))  # apart
    again = plots.plot_k_sweep([1, 1, 2], {"R@k": [0.5, 0.5, 0.7]})
    assert [t.get_text() for t in again.axes[0].get_xticklabels()] == ["1", "2"]


def test_embedding_legend_of_many_classes_lists_the_first_twenty_inside_the_figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    rng = np.random.default_rng(0)
    labels = np.arange(300)
    fig = plots.plot_embedding_2d(rng.random((300, 2)), labels, marked=labels < 3)
    FigureCanvasAgg(fig)
    legend = fig.axes[0].get_legend()
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts == [f"class {c}" for c in range(20)] + ["injected error"]
    assert legend.get_title().get_text() == "first 20 of 300 classes"
    assert _inside_figure(fig, legend)
    # every point drawn, listed or not; the unlisted classes one call per style, not per class
    drawn = fig.axes[0].collections[:-1]  # the last: the rings of the marked points
    assert sum(len(c.get_offsets()) for c in drawn) == 300
    assert len(drawn) <= 20 + 7 * 8
