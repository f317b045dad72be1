"""Matplotlib figures.  Each function draws the arrays it is given, takes an optional ``ax`` and
returns the Figure; matplotlib is imported on first use.  Styles pair colour with markers,
line styles and hatches so every figure reads in greyscale.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..utils.files import escape_surrogates

__all__ = [
    "plain_label",
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

_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_LINES = ("-", "--", "-.", ":")
_COLORS = ("#1b4f9c", "#d1495b", "#2e933c", "#edae49", "#6c4f9c", "#00798c", "#555555")


def _axes(ax: Any, figsize: tuple[float, float] = (6.0, 4.2)) -> tuple[Any, Any]:
    # A bare Figure (no pyplot): no GUI backend, no global figure registry to leak into.
    if ax is None:
        from matplotlib.figure import Figure

        fig = Figure(figsize=figsize, layout="constrained")
        return fig, fig.add_subplot()
    return ax.figure, ax


def _series(
    x: Any, x_name: str, series: Mapping[str, Any], series_name: str
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    # Matplotlib would draw a silently truncated or broadcast line (or raise a bare shape error)
    # for a series of the wrong length, so check every curve against the x values first.
    from ..utils.errors import InputError, InputTypeError
    from ..utils.validation import as_vector

    xs = as_vector(x, x_name)
    if not isinstance(series, Mapping):
        raise InputTypeError(
            f"{series_name} must be a mapping name -> values; got {type(series).__name__}. "
            "Pass e.g. {'MAP@R': values}."
        )
    if not series:
        raise InputError(f"{series_name} is empty; pass at least one named series.")
    out = {
        str(k): as_vector(
            v, f"{series_name}[{k!r}]", length=xs.size, length_of=x_name, allow_nan=True
        )
        for k, v in series.items()
    }
    return xs, out


def save_figure(fig: Any, path: str | os.PathLike, *, dpi: int = 110) -> Path:
    """Save atomically (temp file in the same folder, then rename); format from the suffix.

    PNG metadata carries no software version, so regenerated figures are byte-stable.
    """
    from ..utils.files import atomic_path

    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"  # "fig.PNG" and "fig" are PNGs too
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format=fmt, metadata={"Software": None} if fmt == "png" else None)
    return path


def plot_embedding_2d(
    points: Any,
    labels: Any,
    *,
    alpha: Any = None,
    marked: Any = None,
    title: str | None = None,
    ax: Any = None,
) -> Any:
    """Scatter a 2-D embedding coloured (and marker-coded) by class.

    Classes are drawn in sorted label order, each with its own colour and marker; the legend
    lists the first 20 (its title gives the count when there are more).

    Parameters
    ----------
    points : array-like, shape (n, 2)
        The embedding to draw (project higher dimensions first, e.g. with PCA).
    labels : array-like, shape (n,)
        Class of each point.
    alpha : array-like, shape (n,), optional
        Per-point opacity in [0, 1] (e.g. a confidence), drawn no fainter than 0.05 so no point
        vanishes.
    marked : boolean array, shape (n,), optional
        Points to ring in black (e.g. injected errors).
    title : str, optional
        Axes title (default: "Embedding, coloured by class").
    ax : matplotlib Axes, optional
        Draw into these axes instead of a new figure.

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> fig = plot_embedding_2d([[0, 0], [1, 1]], [0, 1], marked=np.array([False, True]))
    >>> [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    ['class 0', 'class 1', 'injected error']
    """
    x, y, alphas = _embedding_2d_inputs(points, labels, alpha, marked)
    fig, ax = _axes(ax, (6.2, 4.2))
    classes, code = np.unique(y, return_inverse=True)
    for i in range(min(classes.size, _LEGEND_CLASSES)):
        _scatter_style(ax, x, alphas, code == i, i, f"class {plain_label(classes[i])}")
    # Beyond the first classes the legend would run off the figure (its styles repeat anyway):
    # those are drawn unlisted, one call per style (class i has style i mod the cycle), and
    # the legend's title says so.
    cycle = math.lcm(len(_COLORS), len(_MARKERS))
    rest = code >= _LEGEND_CLASSES
    for style in np.unique(code[rest] % cycle):
        _scatter_style(ax, x, alphas, rest & (code % cycle == style), int(style), "_unlisted")
    if marked is not None:
        m = np.asarray(marked, dtype=bool)
        ax.scatter(
            x[m, 0],
            x[m, 1],
            facecolors="none",
            edgecolors="black",
            s=60,
            linewidths=1.0,
            label="injected error",
        )
    ax.set_xlabel("embedding dimension 1")
    ax.set_ylabel("embedding dimension 2")
    # Outside the axes: inside, the legend box hides the points of a dense corner.
    ax.legend(
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        borderaxespad=0,
        title=None
        if classes.size <= _LEGEND_CLASSES
        else f"first {_LEGEND_CLASSES} of {classes.size} classes",
        title_fontsize=8,
    )
    ax.set_title(title or "Embedding, coloured by class", fontsize=9)
    return fig


def _scatter_style(
    ax: Any, x: np.ndarray, alphas: np.ndarray, sel: np.ndarray, style: int, label: str
) -> None:
    """The points ``sel`` in the colour and marker of class number ``style``."""
    colors = np.zeros((int(sel.sum()), 4))
    colors[:, :3] = _rgb(_COLORS[style % len(_COLORS)])
    colors[:, 3] = alphas[sel]
    marker = _MARKERS[style % len(_MARKERS)]
    ax.scatter(x[sel, 0], x[sel, 1], c=colors, marker=marker, s=16, linewidths=0, label=label)


#: The most classes the legend of :func:`plot_embedding_2d` lists.
_LEGEND_CLASSES = 20


def _embedding_2d_inputs(
    points: Any, labels: Any, alpha: Any, marked: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Checked points (n x 2), labels and per-point opacities of :func:`plot_embedding_2d`."""
    from ..utils.errors import InputError
    from ..utils.validation import as_embeddings, as_labels, as_vector

    x = as_embeddings(points, "points", dtype=np.float64)
    if x.shape[1] != 2:
        raise InputError(
            f"points must have 2 columns to draw; got shape {x.shape}. Project first "
            "(e.g. PCA or UMAP)."
        )
    y = as_labels(labels, "labels", length=len(x), length_of="points")
    if alpha is None:
        alphas = np.ones(len(x))
    else:
        alphas = as_vector(alpha, "alpha", length=len(x), length_of="points")
        if ((alphas < 0) | (alphas > 1)).any():
            first = int(np.flatnonzero((alphas < 0) | (alphas > 1))[0])
            raise InputError(f"alpha must lie in [0, 1]; alpha[{first}] = {alphas[first]}.")
        # fully transparent points would vanish; keep a faint trace of them
        alphas = np.clip(alphas, 0.05, 1)
    if marked is not None:
        raw = np.asarray(marked)
        if raw.dtype != bool or raw.shape != (len(x),):
            raise InputError(
                f"marked must be a boolean mask of length {len(x)}; got shape {raw.shape}, "
                f"dtype {raw.dtype}."
            )
    return x, y, alphas


def _null_locator() -> Any:
    from matplotlib.ticker import NullLocator

    return NullLocator()


def plain_label(text: Any, limit: int | None = None) -> str:
    r"""``text`` drawn as written, on one short line: a label of the data (a class, a
    checkpoint, a series) may hold dollar signs, which matplotlib would read as mathtext, drop,
    or fail to parse at save time; lone surrogates (a file name that is not UTF-8), which no
    font can draw; line breaks and tabs (drawn as missing glyphs), shown as spaces; and
    thousands of characters, which would widen the figure until its plot is a sliver, cut at
    :data:`_LABEL_CHARS`, or ``limit``, characters (an ellipsis marks the cut).

    >>> print(plain_label("$5 to $10"), plain_label("a\nb"), plain_label("x" * 80)[-3:])
    \$5 to \$10 a b xx…
    """
    limit = _LABEL_CHARS if limit is None else limit
    text = _CONTROL.sub(" ", escape_surrogates(str(text)))
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.replace("$", r"\$")


#: The longest label a figure draws, in characters.
_LABEL_CHARS = 60
#: Line breaks, tabs and other control characters, which a tick label cannot show.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _rgb(hex_color: str) -> tuple[float, float, float]:
    h = hex_color.lstrip("#")
    return tuple(int(h[i : i + 2], 16) / 255 for i in (0, 2, 4))


def plot_error_reject_curve(curve: Any, *, ax: Any = None, label: str | None = None) -> Any:
    """ERC with the oracle (sorted by the error itself) and random (mean error) references.

    ``curve`` is an :class:`embedeval.metrics.confidence.ErrorRejectCurve`; the random reference is
    the
    horizontal line at its ``random_auerc`` (the mean error: rejecting at random keeps it).

    Examples
    --------
    >>> from embedeval.metrics.confidence import error_reject_curve
    >>> fig = plot_error_reject_curve(error_reject_curve([1.0, 0.0], [0.9, 0.1]))
    >>> float(fig.axes[0].get_lines()[2].get_ydata()[0])
    0.5
    """
    from ..utils.errors import InputTypeError

    need = ("rejected", "error", "oracle_error", "auerc", "oracle_auerc", "random_auerc")
    missing = [a for a in need if not hasattr(curve, a)]
    if missing:
        raise InputTypeError(
            "curve must be an ErrorRejectCurve (from "
            "embedeval.metrics.confidence.error_reject_curve); "
            f"got {type(curve).__name__} without {missing}."
        )
    fig, ax = _axes(ax)
    ax.plot(
        curve.rejected,
        curve.error,
        "-",
        color=_COLORS[0],
        lw=2,
        label=f"{label or 'model'} (AUERC {curve.auerc:.3f})",
    )
    ax.plot(
        curve.rejected,
        curve.oracle_error,
        "--",
        color=_COLORS[2],
        lw=1.5,
        label=f"oracle (AUERC {curve.oracle_auerc:.3f})",
    )
    ax.axhline(
        curve.random_auerc,
        ls=":",
        color="0.3",
        lw=1.5,
        label=f"random (AUERC {curve.random_auerc:.3f})",
    )
    ax.set_xlabel("fraction of queries rejected (least confident first)")
    ax.set_ylabel("mean error of kept queries")
    ax.set_xlim(0, 1)
    ax.set_ylim(bottom=0)
    ax.set_title("Error versus reject curve")
    ax.legend(fontsize=8)
    return fig


def plot_confidence_metrics(
    levels: Any,
    metrics: Mapping[str, Any],
    *,
    ax: Any = None,
    xlabel: str = "confidence given to the injected errors",
    higher_is_better: Mapping[str, bool] | None = None,
    clean_level: float | None = None,
) -> Any:
    """Confidence metrics (AUERC, R-AUROC, ...) as a function of a swept setting.

    ``higher_is_better`` marks each metric's direction in the legend ("higher is better" /
    "lower is better"): AUERC (an error area) and R-AUROC (a separation score) point opposite
    ways on one axis.  ``clean_level`` draws the confidence of the clean points, where an
    injected error stops being less confident than they are.

    Examples
    --------
    >>> fig = plot_confidence_metrics([0.0, 1.0], {"R-AUROC": [0.9, 0.2]},
    ...                               higher_is_better={"R-AUROC": True})
    >>> fig.axes[0].get_lines()[0].get_ydata().tolist()
    [0.9, 0.2]
    >>> fig.axes[0].get_lines()[0].get_label()
    'R-AUROC (higher is better)'
    """
    levels, metrics = _series(levels, "levels", metrics, "metrics")
    fig, ax = _axes(ax)
    directions = dict(higher_is_better or {})
    for i, (name, values) in enumerate(metrics.items()):
        way = directions.get(name)
        tag = "" if way is None else (" (higher is better)" if way else " (lower is better)")
        ax.plot(
            levels,
            values,
            _LINES[i % len(_LINES)],
            marker=_MARKERS[i % len(_MARKERS)],
            color=_COLORS[i % len(_COLORS)],
            label=plain_label(name) + tag,
        )
    clean_level = _marker_at(clean_level, "clean_level")
    if clean_level is not None:
        ax.axvline(
            clean_level,
            color="0.4",
            ls=":",
            lw=1.5,
            label=f"confidence of the clean points ({clean_level:g})",
        )
    ax.set_xlabel(xlabel)
    ax.set_ylabel("metric value (see each one's direction)")
    ax.set_title("Confidence metrics as the errors grow more confident")
    ax.legend(fontsize=8)
    return fig


def _marker_at(value: Any, name: str) -> float | None:
    """Where a reference line is drawn: None (no line) or a finite real number."""
    from ..utils.errors import InputError

    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise InputError(f"{name} must be a number (where its line is drawn); got {value!r}.")
    if not np.isfinite(value):
        raise InputError(f"{name} must be a finite number (where its line is drawn); got {value}.")
    return float(value)


def plot_rank_correlation(
    injected: Any,
    correlation: Any,
    *,
    ax: Any = None,
    method: str = "Spearman",
    clean_sigma: float | None = None,
) -> Any:
    """Rank correlation of predicted against true sigmas over the injected sigma.

    Examples
    --------
    >>> fig = plot_rank_correlation([0.0, 0.5], [-0.4, 0.9], clean_sigma=0.1)
    >>> [float(v) for v in fig.axes[0].get_ylim()]
    [-1.05, 1.05]
    """
    injected, corr = _series(injected, "injected", {"correlation": correlation}, "correlation")
    correlation = corr["correlation"]
    fig, ax = _axes(ax)
    ax.plot(injected, correlation, "-", marker="o", color=_COLORS[0], label=f"{method} ρ")
    ax.axhline(0, color="0.4", lw=1, ls=":", label="no correlation")
    clean_sigma = _marker_at(clean_sigma, "clean_sigma")
    if clean_sigma is not None:
        ax.axvline(
            clean_sigma,
            color=_COLORS[1],
            ls="--",
            lw=1,
            label=f"sigma predicted for clean items ({clean_sigma:g})",
        )
    ax.set_xlabel("sigma predicted for the corrupted subset")
    ax.set_ylabel("rank correlation with the true sigma")
    ax.set_ylim(-1.05, 1.05)
    ax.set_title("Rank correlation over simulated sigmas")
    ax.legend(fontsize=8)
    return fig


def plot_checkpoints(
    names: Sequence[str],
    values: Mapping[str, Any],
    lows: Mapping[str, Any] | None = None,
    highs: Mapping[str, Any] | None = None,
    *,
    ax: Any = None,
    title: str | None = None,
) -> Any:
    """Metric value per checkpoint with confidence-interval bands (``lows``/``highs``).

    NaN values leave a gap in the line instead of being dropped silently.

    Examples
    --------
    >>> fig = plot_checkpoints(["e1", "e2"], {"MAP@R": [0.4, 0.6]}, {"MAP@R": [0.3, 0.5]},
    ...                        {"MAP@R": [0.5, 0.7]})
    >>> [t.get_text() for t in fig.axes[0].get_xticklabels()]
    ['e1', 'e2']
    """
    from ..utils.errors import InputError

    names = [str(n) for n in names]
    if not names:
        raise InputError("names is empty; pass one name per checkpoint.")
    _, values = _series(np.arange(len(names)), "names", values, "values")
    if (lows is None) != (highs is None):
        raise InputError("pass both lows= and highs= (the band edges) or neither.")
    if lows is not None:
        _, lows = _series(np.arange(len(names)), "names", lows, "lows")
        _, highs = _series(np.arange(len(names)), "names", highs, "highs")
        missing = sorted(set(values) - set(lows)) + sorted(set(values) - set(highs))
        if missing:
            raise InputError(f"lows/highs have no band for metric(s) {missing}.")
    ticks, tick_labels, slant = _category_ticks(names)
    # Slanted names hang below the axes: a taller figure keeps the plot (and the y label that
    # spans it) from being squeezed out.
    extra = 0.06 * max(map(len, tick_labels)) if slant else 0.0
    fig, ax = _axes(ax, (6.4, 4.2 + extra))
    x = np.arange(len(names))
    for i, (metric, v) in enumerate(values.items()):
        color = _COLORS[i % len(_COLORS)]
        ax.plot(
            x,
            v,
            _LINES[i % len(_LINES)],
            marker=_MARKERS[i % len(_MARKERS)],
            color=color,
            label=plain_label(metric),
        )
        if lows is not None and highs is not None:
            ax.fill_between(
                x,
                lows[metric],
                highs[metric],
                color=color,
                alpha=0.18,
                hatch="//" if i % 2 else None,
                linewidth=0,
            )
    if slant:
        ax.set_xticks(ticks, tick_labels, rotation=45, ha="right", rotation_mode="anchor")
    else:
        ax.set_xticks(ticks, tick_labels)
    ax.set_xlabel("checkpoint")
    ax.set_ylabel("metric value (band: confidence interval)")
    ax.set_title(title or "Metrics across checkpoints")
    ax.legend(fontsize=8)
    return fig


#: The most category names an x axis labels (every n-th beyond), and how many characters
#: fit side by side on it, unslanted, at the default size.
_MAX_TICKS = 20
_FLAT_CHARS = 60
#: The longest slanted name, in characters.
_SLANTED_CHARS = 30


def _category_ticks(names: Sequence[str]) -> tuple[np.ndarray, list[str], bool]:
    """Positions and texts of the names an x axis can show without overlap, and whether they
    are slanted.

    At most :data:`_MAX_TICKS` names are labelled (every n-th, the first included); names
    that would not fit side by side are slanted 45 degrees and cut at
    :data:`_SLANTED_CHARS` characters.

    >>> _category_ticks(["a", "b"])
    (array([0, 1]), ['a', 'b'], False)
    >>> ticks, texts, slant = _category_ticks([f"epoch {i}" for i in range(100)])
    >>> ticks[:3].tolist(), len(ticks), slant
    ([0, 5, 10], 20, True)
    """
    step = -(-len(names) // _MAX_TICKS)  # ceil
    ticks = np.arange(0, len(names), step)
    texts = [plain_label(names[i]) for i in ticks]
    slant = len(texts) * (max(map(len, texts)) + 2) > _FLAT_CHARS
    if slant:
        texts = [plain_label(names[i], _SLANTED_CHARS) for i in ticks]
    return ticks, texts, slant


def plot_k_sweep(
    ks: Any, values: Mapping[str, Any], *, ax: Any = None, title: str | None = None
) -> Any:
    """Metrics as the cut-off k grows (e.g. Recall@k, P@k), on a log k axis (k > 0).

    Examples
    --------
    >>> fig = plot_k_sweep([1, 10], {"R@k": [0.5, 0.9]})
    >>> fig.axes[0].get_xscale()
    'log'
    """
    from ..utils.errors import InputError

    ks, values = _series(ks, "ks", values, "values")
    if (ks <= 0).any():
        raise InputError(f"ks must be positive (log axis); ks[{int(np.argmax(ks <= 0))}] <= 0.")
    fig, ax = _axes(ax)
    for i, (name, v) in enumerate(values.items()):
        ax.plot(
            ks,
            v,
            _LINES[i % len(_LINES)],
            marker=_MARKERS[i % len(_MARKERS)],
            color=_COLORS[i % len(_COLORS)],
            label=plain_label(name),
        )
    ax.set_xscale("log")
    # Label the k values themselves (1, 2, 5, 10, ...) rather than powers of ten.
    ticks = _spaced_on_log_axis(ks)
    ax.set_xticks(ticks, [f"{k:g}" for k in ticks])
    ax.xaxis.set_minor_locator(_null_locator())
    ax.set_xlabel("k (neighbours considered)")
    ax.set_ylabel("metric value")
    ax.set_title(title or "Metrics over k")
    ax.legend(fontsize=8)
    return fig


def _spaced_on_log_axis(ks: np.ndarray, slots: int = 10) -> np.ndarray:
    """The distinct ``ks`` to label on a log axis, at least a ``slots``-th of its span apart
    (the first and the last always), so that labels never overlap; short sweeps keep all.

    >>> _spaced_on_log_axis(np.array([1, 2, 5, 10, 20, 50, 100, 2])).tolist()
    [1, 2, 5, 10, 20, 50, 100]
    >>> _spaced_on_log_axis(np.arange(1, 101)).tolist()
    [1, 2, 4, 7, 12, 20, 32, 51, 100]
    """
    ks = np.unique(ks)
    logs = np.log10(ks)
    gap = (logs[-1] - logs[0]) / slots
    kept = [0]
    for i in range(1, ks.size):
        if logs[i] - logs[kept[-1]] >= gap:
            kept.append(i)
    if kept[-1] != ks.size - 1:  # the largest k is labelled, in place of a too-close one
        if len(kept) > 1:
            kept.pop()
        kept.append(ks.size - 1)
    return ks[kept]


def plot_per_class(
    labels: Sequence[Any],
    values: Any,
    *,
    top: int | None = 30,
    ax: Any = None,
    metric: str = "metric",
    higher_is_better: bool = True,
) -> Any:
    """Horizontal bars of a per-class metric, worst classes at the top.

    Shows the ``top`` worst classes (default 30; ``top=None`` for every class) against the
    mean over *all* classes, so 2,000 classes still give a readable figure.  The worst are the
    lowest values, or the highest when ``higher_is_better`` is False (a rank, a loss; the axis
    label then says lower is better).  Each value also gets a marker at the bar's end, so a
    class at 0 stays visible.  Ties keep the order of ``labels`` (stable sort); NaN values sort
    last.

    Examples
    --------
    >>> fig = plot_per_class(["a", "b", "c"], [0.9, 0.1, 0.5], top=2)
    >>> [t.get_text() for t in fig.axes[0].get_yticklabels()]
    ['b', 'c']
    >>> fig = plot_per_class(["a", "b", "c"], [0.9, 0.1, 0.5], top=2, higher_is_better=False)
    >>> [t.get_text() for t in fig.axes[0].get_yticklabels()]
    ['a', 'c']
    """
    from ..utils.validation import as_vector, check_int

    labels = list(labels)
    vals = as_vector(values, "values", length=len(labels), length_of="labels", allow_nan=True)
    top = check_int(top, "top", allow_none=True)
    # Negating (not reversing the sort) keeps ties in label order and NaN last.
    order = np.argsort(vals if higher_is_better else -vals, kind="stable")
    shown = order if top is None else order[:top]
    fig, ax = _axes(ax, (6.0, max(2.8, 0.26 * len(shown) + 1.8)))
    y = np.arange(len(shown))
    ax.barh(
        y,
        vals[shown],
        color=_COLORS[0],
        hatch="//",
        edgecolor="white",
        label=f"{metric} of the class",
    )
    ax.scatter(vals[shown], y, marker="|", color="black", s=80, lw=2, zorder=3)  # 0 has no bar
    if np.isfinite(vals).any():
        mean = float(np.nanmean(vals))
        ax.axvline(
            mean,
            color=_COLORS[1],
            ls="--",
            lw=1.5,
            label=f"mean over all {int(np.isfinite(vals).sum())} classes ({mean:.3f})",
        )
    ax.set_yticks(y, [plain_label(labels[i]) for i in shown], fontsize=8)
    ax.set_ylim(len(shown) - 0.5, -0.5)  # worst at the top
    lo = min(0.0, float(np.nanmin(vals))) if np.isfinite(vals).any() else 0.0
    hi = max(1.0, float(np.nanmax(vals))) if np.isfinite(vals).any() else 1.0
    ax.set_xlim(lo - 0.02 * (hi - lo), hi + 0.02 * (hi - lo))
    lower = "" if higher_is_better else ", lower is better"
    ax.set_xlabel(f"{metric} (per class{lower})")
    ax.set_ylabel("class")
    worst = "" if top is None or top >= len(labels) else f", worst {len(shown)} of {len(labels)}"
    first = "" if higher_is_better else " (highest first)"
    # Title and legend right-aligned above the axes: long class names narrow the axes (they
    # sit at the right of the figure), and text centred on them stuck out past its right edge.
    ax.set_title(f"Per-class {metric}{worst}{first}", pad=24, x=1.0, ha="right")
    ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize=8, frameon=False)
    return fig


def plot_confidence_recall(
    curve: Any, *, ax: Any = None, metric: str = "precision_at_1", sigma: bool = False
) -> Any:
    """Mean metric of the queries binned by confidence (a
    :func:`embedeval.metrics.confidence.confidence_recall_curve`), with each bin's query count.

    Examples
    --------
    >>> from embedeval.metrics.confidence import confidence_recall_curve
    >>> fig = plot_confidence_recall(confidence_recall_curve([0, 1, 1, 1], [.1, .4, .6, .9],
    ...                                                      bins=2))
    >>> fig.axes[0].get_ylabel()
    'mean precision_at_1 in the bin'
    """
    fig, ax = _axes(ax)
    ok = np.asarray(curve.count) > 0
    x = np.asarray(curve.mean_confidence)[ok]
    ax.plot(x, np.asarray(curve.mean_metric)[ok], "-o", color=_COLORS[0], lw=2, label=metric)
    for xi, yi, n in zip(x, np.asarray(curve.mean_metric)[ok], np.asarray(curve.count)[ok],
                         strict=True):  # fmt: skip
        ax.annotate(f"n={n}", (xi, yi), textcoords="offset points", xytext=(0, 6), fontsize=7,
                    ha="center")  # fmt: skip
    what = "sigma (uncertainty)" if sigma else "confidence"
    ax.set_xlabel(f"mean {what} of the bin")
    ax.set_ylabel(f"mean {metric} in the bin")
    ax.set_ylim(-0.02, 1.08)
    ax.set_title(f"{metric} against {what.split()[0]}: a useful one slopes " +
                 ("down" if sigma else "up"))  # fmt: skip
    ax.legend(fontsize=8)
    return fig


def plot_distance_histograms(
    pos: Any, neg: Any, *, bins: int = 60, ax: Any = None, unit: str = "Euclidean distance"
) -> Any:
    """Density histograms of same-class and different-class pair distances on shared bins.

    Examples
    --------
    >>> fig = plot_distance_histograms([0.1, 0.2], [0.8, 0.9], bins=4)
    >>> fig.axes[0].get_ylabel()
    'density'
    """
    from ..utils.validation import as_vector, check_int

    pos, neg = as_vector(pos, "pos"), as_vector(neg, "neg")
    bins = check_int(bins, "bins")
    fig, ax = _axes(ax)
    edges = np.histogram_bin_edges(np.concatenate([pos, neg]), bins=bins)
    ax.hist(
        neg,
        edges,
        density=True,
        histtype="stepfilled",
        alpha=0.35,
        color=_COLORS[1],
        hatch="\\\\",
        label=f"negative pairs (n={neg.size})",
    )
    ax.hist(
        pos,
        edges,
        density=True,
        histtype="step",
        lw=2,
        color=_COLORS[0],
        label=f"positive pairs (n={pos.size})",
    )
    ax.set_xlabel(unit)
    ax.set_ylabel("density")
    ax.set_title("Positive and negative pair distances")
    ax.legend(fontsize=8)
    return fig


def plot_coverage(curve: Any, *, ax: Any = None, label: str | None = None) -> Any:
    """Empirical coverage of credible regions against their nominal level, with the diagonal.

    ``curve`` is an :class:`embedeval.metrics.confidence.CoverageCurve`.  Points on the diagonal
    mean
    calibrated uncertainties; below it the regions are too small (over-confident), above it
    too large (under-confident).

    Examples
    --------
    >>> from embedeval.metrics.confidence import CoverageCurve
    >>> fig = plot_coverage(CoverageCurve(np.array([0.5, 0.9]), np.array([0.4, 0.85]), 10))
    >>> fig.axes[0].get_lines()[1].get_ydata().tolist()
    [0.4, 0.85]
    """
    from ..utils.errors import InputTypeError

    missing = [a for a in ("nominal", "empirical") if not hasattr(curve, a)]
    if missing:
        raise InputTypeError(
            f"curve must be a CoverageCurve (from embedeval.metrics.confidence.credible_coverage); "
            f"got {type(curve).__name__} without {missing}."
        )
    fig, ax = _axes(ax)
    ax.plot([0, 1], [0, 1], ":", color="0.3", lw=1.5, label="calibrated (diagonal)")
    ax.plot(
        curve.nominal,
        curve.empirical,
        "-",
        marker=_MARKERS[0],
        color=_COLORS[0],
        lw=2,
        label=label or "empirical coverage",
    )
    ax.set_xlabel("nominal level p of the credible region")
    ax.set_ylabel("fraction of same-class references inside")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title("Coverage of credible regions versus nominal level")
    ax.legend(fontsize=8)
    return fig


def plot_reliability(diagram: Any, *, ax: Any = None, label: str | None = None) -> Any:
    """Reliability diagram: accuracy per confidence bin against the diagonal, with bin counts.

    ``diagram`` is an :class:`embedeval.metrics.calibration.ReliabilityDiagram`.  Bars span each bin
    with the height of its accuracy; markers sit at (mean confidence, accuracy); the number of
    queries in each bin is written above its bar, so sparsely filled bins are visible.  Below
    the diagonal the model is over-confident.

    Examples
    --------
    >>> from embedeval.metrics.calibration import reliability_diagram
    >>> fig = plot_reliability(reliability_diagram([1, 0, 1, 1], [0.95, 0.95, 0.3, 0.3], bins=2))
    >>> [t.get_text() for t in fig.axes[0].texts]
    ['n=2', 'n=2']
    """
    from ..utils.errors import InputTypeError

    missing = [
        a for a in ("edges", "accuracy", "count", "mean_confidence") if not hasattr(diagram, a)
    ]
    if missing:
        raise InputTypeError(
            "diagram must be a ReliabilityDiagram (from embedeval.metrics.calibration."
            f"reliability_diagram); got {type(diagram).__name__} without {missing}."
        )
    fig, ax = _axes(ax)
    edges = np.asarray(diagram.edges, dtype=np.float64)
    filled = np.asarray(diagram.count) > 0
    widths = np.diff(edges)
    acc = np.where(filled, diagram.accuracy, 0.0)
    ax.bar(
        edges[:-1],
        acc,
        width=widths,
        align="edge",
        color=_COLORS[0],
        alpha=0.35,
        edgecolor=_COLORS[0],
        hatch="//",
        label="accuracy per bin",
    )
    ax.plot([0, 1], [0, 1], ":", color="0.3", lw=1.5, label="calibrated (diagonal)")
    ax.plot(
        np.asarray(diagram.mean_confidence)[filled],
        np.asarray(diagram.accuracy)[filled],
        "-",
        marker=_MARKERS[0],
        color=_COLORS[1],
        lw=1.5,
        label=label or f"mean confidence (ECE {getattr(diagram, 'ece', float('nan')):.3f})",
    )
    for left, w, a, n in zip(edges[:-1], widths, acc, diagram.count, strict=True):
        if n:
            ax.text(left + w / 2, min(a + 0.02, 0.97), f"n={int(n)}", ha="center", fontsize=7)
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy (fraction correct)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.05)
    ax.set_title("Reliability diagram")
    ax.legend(fontsize=8, loc="upper left")
    return fig


# ---------------------------------------------------------------------------- protocols
_ROC_FIELDS = ("far", "tar", "fnmr", "n_genuine", "n_impostor")


def _named_curves(curves: Any, what: str) -> dict[str, Any]:
    # Curves are recognised by their fields, not their class: figures sit below the modules
    # that compute the curves and import nothing from them.
    from ..utils.errors import InputError, InputTypeError

    named = dict(curves) if isinstance(curves, Mapping) else {"": curves}
    if not named:
        raise InputError(f"{what} is empty; pass at least one curve.")
    for name, c in named.items():
        if not all(hasattr(c, field) for field in _ROC_FIELDS):
            raise InputTypeError(
                f"{what}{f'[{name!r}]' if name else ''} must be a RocCurve (from "
                f"embedeval.protocols.verification.roc); got {type(c).__name__}."
            )
    return named


def _mark_operating_points(
    ax: Any, points: Any, color: str, y_true: np.ndarray, y_drawn: np.ndarray, dy: np.ndarray
) -> None:
    # Labels go on the empty side of the curve (above-left for ROC, below-left for DET) and
    # show the true value even where a zero is drawn at the edge of a log axis.
    far = np.asarray(points.far)
    ok = np.asarray(points.resolved) & (far > 0)
    ax.plot(far[ok], y_drawn[ok], linestyle="none", marker="o", mfc="white", mec=color, mew=1.5,
            ms=7, label="operating points (value @ target FAR)")  # fmt: skip
    dy = np.broadcast_to(dy, far.shape)
    for f, v, d, off in zip(far[ok], y_true[ok], y_drawn[ok], dy[ok], strict=True):
        ax.annotate(f"{v:.3f} @ {f:.0e}", (f, d), textcoords="offset points", xytext=(-6, off),
                    ha="right", fontsize=7, color=color)  # fmt: skip


def plot_roc(
    curves: Any, *, operating_points: Any = None, ax: Any = None, label: str | None = None
) -> Any:
    """ROC curve(s), TAR against FAR on a log FAR axis, with the target FARs marked.

    Parameters
    ----------
    curves : RocCurve or mapping of name to RocCurve
        From :func:`embedeval.protocols.verification.roc`.
    operating_points : TarAtFar, optional
        From :func:`embedeval.protocols.verification.tar_at_far`: each resolved target is marked on
        the
        first curve and labelled "TAR @ FAR".

    Examples
    --------
    >>> from embedeval.protocols.verification import roc, tar_at_far
    >>> s, g = [0.9, 0.8, 0.7, 0.6, 0.5, 0.2], [True, True, False, True, False, False]
    >>> fig = plot_roc(roc(s, g), operating_points=tar_at_far(s, g, far=[1 / 3]))
    >>> fig.axes[0].get_xscale()
    'log'
    """
    named = _named_curves(curves, "curves")
    fig, ax = _axes(ax)
    floor = min(1.0 / max(c.n_impostor, 1) for c in named.values())
    for i, (name, c) in enumerate(named.items()):
        far = np.maximum(c.far, floor / 2)  # FAR = 0 drawn at the left edge of the log axis
        ax.step(far, c.tar, where="post", color=_COLORS[i % len(_COLORS)],
                linestyle=_LINES[i % len(_LINES)], lw=2,
                label=plain_label(name) or label or "ROC")  # fmt: skip
    if operating_points is not None:
        tar = np.asarray(operating_points.tar)
        _mark_operating_points(ax, operating_points, _COLORS[0], tar, tar, np.array(5.0))
    ax.set_xscale("log")
    ax.set_xlim(floor / 2, 1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("false accept rate (FAR, log scale)")
    ax.set_ylabel("true accept rate (TAR)")
    ax.set_title("ROC: TAR against FAR")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return fig


def plot_det(
    curves: Any, *, operating_points: Any = None, ax: Any = None, label: str | None = None
) -> Any:
    """DET curve(s): FNMR against FMR, both on log axes (the NIST FRVT presentation).

    Parameters
    ----------
    curves : RocCurve or mapping of name to RocCurve
        From :func:`embedeval.protocols.verification.roc` (FMR = FAR, FNMR = 1 - TAR).
    operating_points : TarAtFar, optional
        Marks FNMR at each resolved target FMR.

    Examples
    --------
    >>> from embedeval.protocols.verification import roc
    >>> fig = plot_det(roc([0.9, 0.8, 0.7, 0.6, 0.5], [True, False, True, False, False]))
    >>> fig.axes[0].get_yscale()
    'log'
    """
    named = _named_curves(curves, "curves")
    fig, ax = _axes(ax)
    floor = min(1.0 / max(c.n_impostor, 1) for c in named.values())
    y_floor = min(1.0 / max(c.n_genuine, 1) for c in named.values())
    for i, (name, c) in enumerate(named.items()):
        fmr = np.maximum(c.far, floor / 2)
        fnmr = np.maximum(c.fnmr, y_floor / 2)
        ax.step(fmr, fnmr, where="post", color=_COLORS[i % len(_COLORS)],
                linestyle=_LINES[i % len(_LINES)], lw=2,
                label=plain_label(name) or label or "DET")  # fmt: skip
    if operating_points is not None:
        fnmr = 1 - np.asarray(operating_points.tar)
        _mark_operating_points(
            ax,
            operating_points,
            _COLORS[0],
            fnmr,
            np.maximum(fnmr, y_floor / 2),
            np.where(fnmr > 0, -11.0, 5.0),  # a zero sits on the bottom edge: label above it
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(floor / 2, 1)
    ax.set_ylim(y_floor / 2, 1.05)
    ax.set_xlabel("false match rate (FMR, log scale)")
    ax.set_ylabel("false non-match rate (FNMR, log scale)")
    ax.set_title("DET: FNMR against FMR (FNMR = 0 drawn on the bottom edge)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    return fig


def plot_cmc(cmc: Any, *, ax: Any = None, label: str | None = None) -> Any:
    """CMC curve(s): matching rate against rank 1..K.

    Parameters
    ----------
    cmc : array-like or mapping of name to array-like
        ``cmc[r - 1]`` = fraction of queries whose first correct match is within rank r, as
        returned by :meth:`embedeval.EvaluationResult.cmc`.

    Examples
    --------
    >>> fig = plot_cmc({"model A": [0.6, 0.8, 0.9], "model B": [0.5, 0.7, 0.95]})
    >>> [line.get_label() for line in fig.axes[0].get_lines()]
    ['model A', 'model B']
    """
    series = dict(cmc) if isinstance(cmc, Mapping) else {label or "CMC": cmc}
    first = np.asarray(next(iter(series.values())), dtype=float)
    ranks, named = _series(np.arange(1, first.size + 1), "ranks", series, "cmc")
    fig, ax = _axes(ax)
    for i, (name, values) in enumerate(named.items()):
        ax.plot(ranks, values, color=_COLORS[i % len(_COLORS)], linestyle=_LINES[i % len(_LINES)],
                marker=_MARKERS[i % len(_MARKERS)], ms=4, lw=2,
                label=plain_label(name))  # fmt: skip
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("rank r")
    ax.set_ylabel("matching rate (first correct match within rank r)")
    ax.set_xlim(0.5, ranks.size + 0.5)
    ax.set_ylim(0, 1.02)
    ax.set_title("Cumulative match characteristic (CMC)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return fig
