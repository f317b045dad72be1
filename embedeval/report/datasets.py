"""Toy embedding spaces and simulation helpers for figures, notebooks, tests and benchmarks.

Everything is seeded through arguments (``numpy.random.default_rng(seed)``); nothing touches
global random state.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..metrics.pairs import positive_negative_distances
from ..utils.errors import InputError
from ..utils.validation import (
    as_embeddings,
    as_labels,
    as_vector,
    check_choice,
    check_int,
    check_probability,
)

__all__ = [
    "REALITY_CHECK_BANDS",
    "confidence_sweep",
    "corrupt_labels",
    "gaussian_clusters",
    "move_points",
    "positive_negative_distances",
    "reality_check_example",
    "sigma_rank_correlation_sweep",
    "simulate_confidences",
]

#: x-bands of the three 2-D toy spaces of the reality-check figures (label 1 where x > 0).
REALITY_CHECK_BANDS = {
    1: [(-1.0, -2 / 3), (-1 / 3, 0.0), (0.0, 1 / 3), (2 / 3, 1.0)],
    2: [(-1.0, 0.0), (0.0, 1.0)],
    3: [(-1.0, -1 / 3), (1 / 3, 1.0)],
}


def reality_check_example(
    n: int = 400, which: int = 1, *, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Points of one of the three reality-check toy spaces and their labels.

    x is uniform over the union of the example's bands (equal density everywhere in them), y is
    uniform in [0, 1]; the label is 1 where x > 0, else 0.

    Examples
    --------
    >>> x, y = reality_check_example(6, 3, seed=0)
    >>> bool(np.all((np.abs(x[:, 0]) >= 1 / 3) & (np.abs(x[:, 0]) <= 1))), y.tolist()
    (True, [1, 0, 0, 0, 1, 1])
    """
    n = check_int(n, "n")
    if isinstance(which, (bool, np.bool_)) or which not in REALITY_CHECK_BANDS:  # True == 1
        raise InputError(f"which must be 1, 2 or 3; got {which!r}.")
    rng = np.random.default_rng(seed)
    bands = np.asarray(REALITY_CHECK_BANDS[which])
    widths = bands[:, 1] - bands[:, 0]
    band = rng.choice(len(bands), size=n, p=widths / widths.sum())
    x = bands[band, 0] + rng.random(n) * widths[band]
    y = rng.random(n)
    points = np.column_stack([x, y])
    return points, (x > 0).astype(np.int64)


def gaussian_clusters(
    n: int,
    n_classes: int,
    dim: int,
    *,
    spread: float = 1.0,
    seed: int = 0,
    normalize: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded class clusters: unit-variance centres plus ``spread / sqrt(dim)`` noise per axis.

    Returns float32 embeddings (L2-normalised when ``normalize``) and int64 labels (classes
    as equal as possible, in random order).

    Examples
    --------
    >>> x, y = gaussian_clusters(10, 2, 4, seed=1)
    >>> x.shape, x.dtype.name, sorted(np.bincount(y).tolist())
    ((10, 4), 'float32', [5, 5])
    """
    n, n_classes, dim = check_int(n, "n"), check_int(n_classes, "n_classes"), check_int(dim, "dim")
    spread = _nonneg(spread, "spread")
    if n_classes > n:
        raise InputError(
            f"n_classes ({n_classes}) must not exceed n ({n}); every class needs a point."
        )
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % n_classes)
    centers = rng.standard_normal((n_classes, dim)).astype(np.float32)
    noise = rng.standard_normal((n, dim)).astype(np.float32) * np.float32(spread / np.sqrt(dim))
    x = centers[labels] + noise
    if normalize:
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x, labels.astype(np.int64)


def _nonneg(value: Any, name: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise InputError(f"{name} must be a real number >= 0; got {value!r}.")
    value = float(value)
    if not (np.isfinite(value) and value >= 0):
        raise InputError(f"{name} must be a finite number >= 0; got {value}.")
    return value


def _pick(n: int, fraction: float | None, indices: Any, seed: int) -> np.ndarray:
    mask = np.zeros(n, dtype=bool)
    if indices is not None and fraction is not None:
        raise InputError(
            f"pass only one of fraction= ({fraction!r}) and indices=; they both choose the subset."
        )
    if indices is not None:
        raw = np.asarray(indices)
        if raw.ndim != 1 or (raw.size and not np.issubdtype(raw.dtype, np.integer)):
            raise InputError(
                f"indices must be a 1-D array of integer positions; got shape {raw.shape}, "
                f"dtype {raw.dtype}. Pass e.g. np.flatnonzero(mask)."
            )
        idx = raw.astype(np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            first = int(np.flatnonzero((idx < 0) | (idx >= n))[0])
            raise InputError(f"indices must lie in [0, {n}); indices[{first}] = {idx[first]}.")
        if np.unique(idx).size != idx.size:
            raise InputError("indices must not repeat an item; drop the duplicates.")
        mask[idx] = True
    elif fraction is not None:
        fraction = check_probability(fraction, "fraction", open_left=False)
        rng = np.random.default_rng(seed)
        mask[rng.choice(n, round(fraction * n), replace=False)] = True
    else:
        raise InputError("pass fraction= or indices= to choose the corrupted subset.")
    return mask


def _seed(seed: Any) -> int:
    """A seed these simulations derive further seeds from (``seed + 1``, ``seed + i``): a
    non-negative int, not None."""
    return int(check_int(seed, "seed", minimum=0))


def corrupt_labels(
    labels: Any, *, fraction: float | None = None, indices: Any = None, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Flip the labels of a chosen subset to another class (uniform among the others).

    Returns ``(new_labels, corrupted_mask)``.

    Examples
    --------
    >>> y, mask = corrupt_labels([0, 0, 1, 1], indices=[1])
    >>> y.tolist(), mask.tolist()
    ([0, 1, 1, 1], [False, True, False, False])
    """
    y = as_labels(labels, "labels")
    seed = _seed(seed)
    mask = _pick(y.size, fraction, indices, seed)
    classes = np.unique(y)
    if classes.size < 2:
        raise InputError("corrupt_labels needs at least two classes.")
    rng = np.random.default_rng(seed + 1)
    out = y.copy()
    pos = np.searchsorted(classes, y[mask])
    shift = rng.integers(1, classes.size, mask.sum())
    out[mask] = classes[(pos + shift) % classes.size]
    return out, mask


def move_points(
    points: Any, *, scale: float, fraction: float | None = None, indices: Any = None, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Add isotropic Gaussian noise of standard deviation ``scale`` to a chosen subset.

    Returns ``(moved_points, moved_mask)``.

    Examples
    --------
    >>> p, mask = move_points([[0.0, 0.0], [1.0, 1.0]], scale=0.0, indices=[0])
    >>> p.tolist(), mask.tolist()
    ([[0.0, 0.0], [1.0, 1.0]], [True, False])
    """
    x = as_embeddings(points, "points", dtype=np.float64)
    scale = _nonneg(scale, "scale")
    seed = _seed(seed)
    mask = _pick(x.shape[0], fraction, indices, seed)
    rng = np.random.default_rng(seed + 2)
    out = x.copy()
    out[mask] += rng.standard_normal((mask.sum(), x.shape[1])) * scale
    return out, mask


def simulate_confidences(
    corrupted: Any,
    *,
    corrupted_level: float,
    clean_level: float = 0.9,
    noise: float = 0.05,
    seed: int = 0,
) -> np.ndarray:
    """Confidences in [0, 1]: ``clean_level`` for clean items and ``corrupted_level`` for the
    corrupted ones, each plus Gaussian noise of standard deviation ``noise`` (clipped).

    Examples
    --------
    >>> simulate_confidences([False, True], corrupted_level=0.2, noise=0.0).tolist()
    [0.9, 0.2]
    """
    raw = np.asarray(corrupted)
    if raw.ndim != 1 or raw.dtype != bool:
        raise InputError(
            f"corrupted must be a 1-D boolean mask; got shape {raw.shape}, dtype {raw.dtype}. "
            "Use the mask returned by corrupt_labels / move_points."
        )
    corrupted_level = check_probability(corrupted_level, "corrupted_level", open_left=False)
    clean_level = check_probability(clean_level, "clean_level", open_left=False)
    noise = _nonneg(noise, "noise")
    mask = raw
    rng = np.random.default_rng(seed)
    base = np.where(mask, corrupted_level, clean_level)
    return np.clip(base + rng.standard_normal(mask.size) * noise, 0.0, 1.0)


def confidence_sweep(
    points: Any,
    labels: Any,
    *,
    fraction: float = 0.15,
    levels: Any = None,
    clean_level: float = 0.7,
    noise: float = 0.05,
    corruption: str = "flip",
    scale: float = 0.5,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """The experiment behind ``confidence_recall_metrics.png``.

    Corrupt ``fraction`` of the points — ``corruption="flip"`` (default) flips their labels
    (:func:`corrupt_labels`), ``"move"`` adds Gaussian noise of standard deviation ``scale`` to
    their coordinates (:func:`move_points`) — give the corrupted points confidence ``level``
    and the others ``clean_level`` (plus noise), and measure, for each level, AUERC via R@1 and
    via MAP@R and R-AUROC.  When the corrupted points are the least confident (low level) the
    confidence ranks the errors and the AUERCs are low; as their confidence grows past the clean
    level, the confidence ranks errors backwards.

    Returns ``{"levels", "auerc_recall_at_1", "auerc_map_at_r", "r_auroc"}``, one value per level.

    Examples
    --------
    >>> x, y = reality_check_example(200, 2, seed=0)
    >>> s = confidence_sweep(x, y, levels=[0.0, 1.0], seed=0)
    >>> bool(s["r_auroc"][0] > 0.5 > s["r_auroc"][1])
    True
    """
    from ..evaluation.evaluate import evaluate
    from ..metrics.confidence import confidence_summary

    if levels is None:
        levels = np.linspace(0.0, 1.0, 11)
    else:
        levels = as_vector(levels, "levels")
        if ((levels < 0) | (levels > 1)).any():
            first = int(np.flatnonzero((levels < 0) | (levels > 1))[0])
            raise InputError(f"levels must lie in [0, 1]; levels[{first}] = {levels[first]}.")
    check_probability(clean_level, "clean_level", open_left=False)
    corruption = check_choice(corruption, "corruption", ("flip", "move"))
    seed = _seed(seed)
    # Checked here, so that a mismatch names these arguments, not evaluate's query_labels.
    points = as_embeddings(points, "points", dtype=np.float64)
    labels = as_labels(labels, "labels", length=len(points), length_of="points")
    if corruption == "flip":
        y, mask = corrupt_labels(labels, fraction=fraction, seed=seed)
    else:
        y = labels
        points, mask = move_points(points, scale=scale, fraction=fraction, seed=seed)
    res = evaluate(points, y, metrics=["precision_at_1", "map_at_r"], progress=False)
    out: dict[str, list[float]] = {"auerc_recall_at_1": [], "auerc_map_at_r": [], "r_auroc": []}
    for i, level in enumerate(levels):
        conf = simulate_confidences(
            mask, corrupted_level=level, clean_level=clean_level, noise=noise, seed=seed + i
        )
        summary = confidence_summary(res.per_query, conf)
        out["auerc_recall_at_1"].append(summary["auerc_precision_at_1"])
        out["auerc_map_at_r"].append(summary["auerc_map_at_r"])
        out["r_auroc"].append(summary["r_auroc"])
    return {"levels": levels, **{k: np.asarray(v) for k, v in out.items()}}


def sigma_rank_correlation_sweep(
    n_items: int = 500,
    *,
    fraction: float = 0.2,
    injected: Any = None,
    clean_sigma: float = 0.1,
    true_corrupted_sigma: float = 0.5,
    noise: float = 0.02,
    method: str = "spearman",
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """The experiment behind ``rank_corr_over_simulated_sigmas.png``.

    Ground truth: a ``fraction`` of the items is corrupted with true sigma
    ``true_corrupted_sigma``, the rest has ``clean_sigma`` (plus a little noise, so the truth has
    no ties).  A model predicts ``clean_sigma`` (+ noise) for clean items and the *injected*
    sigma for corrupted ones; the rank correlation between prediction and truth is measured as
    the injected sigma sweeps: negative while the corrupted items are predicted more certain
    than the clean ones, positive once they are predicted less certain.

    Returns ``{"injected", "statistic", "pvalue"}`` (scipy's statistic and p-value per sigma).

    Examples
    --------
    >>> r = sigma_rank_correlation_sweep(100, injected=[0.0, 0.5], seed=0)
    >>> bool(r["statistic"][0] < 0 < r["statistic"][1])
    True
    """
    from ..metrics.confidence import rank_correlation

    method = check_choice(method, "method", ("spearman", "kendall"))
    injected = np.linspace(0.0, 0.5, 11) if injected is None else as_vector(injected, "injected")
    clean_sigma = _nonneg(clean_sigma, "clean_sigma")
    true_corrupted_sigma = _nonneg(true_corrupted_sigma, "true_corrupted_sigma")
    noise = _nonneg(noise, "noise")
    rng = np.random.default_rng(seed)
    fraction = check_probability(fraction, "fraction", open_left=False)  # this one has no indices=
    mask = _pick(check_int(n_items, "n_items"), fraction, None, seed)
    truth = np.where(mask, true_corrupted_sigma, clean_sigma) + rng.random(mask.size) * noise
    stats, pvalues = [], []
    for s in injected:
        predicted = np.where(mask, s, clean_sigma) + rng.random(mask.size) * noise
        res = rank_correlation(predicted, truth, method=method)
        stats.append(res.statistic)
        pvalues.append(res.pvalue)
    return {"injected": injected, "statistic": np.asarray(stats), "pvalue": np.asarray(pvalues)}
