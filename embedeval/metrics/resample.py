"""The one resampling engine: percentile bootstrap and paired sign-flip tests.

Every interval and p-value of the package is drawn here, from ``numpy.random.default_rng(seed)``:

* :func:`draw_indices` is the one source of bootstrap draws: blocks of rows of n indices drawn
  uniformly with replacement (the stream does not depend on the block size, so chunking for
  memory never changes a result).
* Means (a metric's per-query values, the difference of two runs) are resampled in bulk:
  :func:`resampled_means` by counting how often each unit is drawn (one matrix product per
  block) and :func:`mean_difference_interval` by averaging the drawn values.
* A statistic that is not a mean (an area under a curve, an ECE, an AUROC, an R²) is recomputed
  on each resample by :func:`replicates` / :func:`statistic_ci`; the loop runs over replicates
  (``n_boot``), never over queries.
* :func:`percentile_interval`, :func:`bootstrap_p` and :func:`permutation_p` turn replicates
  into intervals and p-values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

__all__ = [
    "CHUNK",
    "EXACT_SIGN_FLIP_UNITS",
    "bootstrap_p",
    "draw_indices",
    "mean_difference_interval",
    "percentile_interval",
    "permutation_p",
    "replicates",
    "resampled_means",
    "statistic_ci",
]

CHUNK = 1 << 20  # drawn indices per block: bounded memory for any n_boot
#: Up to this many units :func:`permutation_p` enumerates every sign pattern: its p is exact.
EXACT_SIGN_FLIP_UNITS = 12

Statistic = Callable[..., dict[str, float]]


def draw_indices(
    rng: np.random.Generator, n: int, n_boot: int, per_block: int
) -> Iterator[np.ndarray]:
    """Blocks of bootstrap draws: arrays of shape (m, n), m <= ``per_block``, n_boot rows in all.

    Row b holds the n row indices of resample b, drawn uniformly with replacement by
    ``rng.integers(0, n, size=(m, n))``.  numpy's generator keeps its stream across calls, so
    the rows do not depend on ``per_block``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> [block.shape for block in draw_indices(rng, 3, 5, 2)]
    [(2, 3), (2, 3), (1, 3)]
    """
    step = max(1, per_block)
    for start in range(0, n_boot, step):
        yield rng.integers(0, n, size=(min(step, n_boot - start), n))


def resampled_means(
    values: np.ndarray,
    groups: np.ndarray | None,
    n_boot: int,
    rng: np.random.Generator,
    bar: Any = None,
) -> np.ndarray:
    """Bootstrap replicates of the mean (micro) or of the mean of group means (macro).

    ``values`` is (n_items, n_series): several aligned series (metrics, or paired runs) share
    the same resamples.  Replicate b is θ*_b = (1/n) Σ_i c_bi v_i with c_bi the number of times
    unit i was drawn: the counts of each block of :func:`draw_indices` come from one flat
    ``bincount`` (row r's indices offset by r·n), so a block is one matrix product and there is
    no loop over items; ``rng.multinomial`` gives the same law but is 3-5x slower for large n.
    With ``groups`` (codes 0..C-1) the units are the C group means.

    Examples
    --------
    >>> reps = resampled_means(np.array([[0.0], [1.0]]), None, 4, np.random.default_rng(0))
    >>> sorted(set(reps[:, 0].tolist()) - {0.0, 0.5, 1.0})   # every replicate is 0, 1/2 or 1
    []
    """
    if groups is not None:
        n_groups = int(groups.max()) + 1
        sums = np.zeros((n_groups, values.shape[1]))
        np.add.at(sums, groups, values)
        group_means = sums / np.bincount(groups, minlength=n_groups)[:, None]
        return resampled_means(group_means, None, n_boot, rng, bar)
    n = values.shape[0]
    out = []
    for picks in draw_indices(rng, n, n_boot, CHUNK // max(n, 1)):
        m = picks.shape[0]
        picks += (np.arange(m, dtype=np.int64) * n)[:, None]
        counts = np.bincount(picks.ravel(), minlength=m * n).reshape(m, n)
        out.append(_row_products(counts.astype(np.float64), values) / n)
        if bar is not None:
            bar.update(m)
    return np.concatenate(out)


_TILE = 16  # rows per product: every replicate is computed by a product of the same shape


def _row_products(counts: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``counts @ values`` computed in products of a fixed shape (the last tile zero-padded).

    BLAS rounds a row's dot products differently in products of different heights, so a plain
    product of the whole block would make a replicate depend on how many others share its block
    (that is, on ``CHUNK`` and ``n_boot``); fixed tiles make each replicate a function of its own
    draws only.

    Examples
    --------
    >>> c = np.arange(40.0).reshape(20, 2)
    >>> v = np.array([[1.0], [2.0]])
    >>> bool(np.array_equal(_row_products(c, v), c @ v))
    True
    """
    m = counts.shape[0]
    padded = np.zeros((-(-m // _TILE) * _TILE, counts.shape[1]))
    padded[:m] = counts
    out = np.empty((padded.shape[0], values.shape[1]))
    for start in range(0, padded.shape[0], _TILE):
        np.matmul(padded[start : start + _TILE], values, out=out[start : start + _TILE])
    return out[:m]


def mean_difference_interval(
    diff: np.ndarray, *, ci: float, n_boot: int, rng: np.random.Generator
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``diff`` (one value per query).

    Replicate b is the plain mean of the n drawn values diff[idx_b] (blocks of about 2·10⁶
    drawn values); the interval is (q_{(1-ci)/2}, q_{(1+ci)/2}) of the replicates with numpy's
    linear interpolation.

    Examples
    --------
    >>> mean_difference_interval(np.array([0.5, 0.5]), ci=0.9, n_boot=50,
    ...                          rng=np.random.default_rng(0))
    (0.5, 0.5)
    """
    boots = np.concatenate(
        [
            diff[picks].mean(axis=1)
            for picks in draw_indices(rng, diff.size, n_boot, 2_000_000 // diff.size)
        ]
    )
    lo, hi = np.quantile(boots, [(1 - ci) / 2, (1 + ci) / 2])
    return float(lo), float(hi)


def replicates(
    statistic: Statistic,
    arrays: Sequence[np.ndarray],
    *,
    n_boot: int,
    seed: int,
) -> dict[str, np.ndarray]:
    """``statistic(*[a[idx] for a in arrays])`` for ``n_boot`` resamples ``idx`` of the rows.

    Every statistic of one replicate sees the same resampled rows, so their intervals are
    jointly consistent.  A replicate where a statistic is undefined (NaN, e.g. an AUROC whose
    resample holds a single class) stays NaN and is left out of the quantiles.

    Examples
    --------
    >>> reps = replicates(lambda v: {"max": v.max()}, [np.array([1.0, 1.0])], n_boot=3, seed=0)
    >>> reps["max"].tolist()
    [1.0, 1.0, 1.0]
    """
    n = arrays[0].shape[0]
    out: dict[str, list[float]] = {}
    for (idx,) in draw_indices(np.random.default_rng(seed), n, n_boot, 1):
        for key, value in statistic(*(a[idx] for a in arrays)).items():
            out.setdefault(key, []).append(float(value))
    return {key: np.asarray(v) for key, v in out.items()}


def bootstrap_p(diff_reps: np.ndarray, *, scale: float = 1.0) -> float:
    """Two-sided bootstrap p-value of a difference: twice the smaller share of replicates on
    either side of 0 (1 when every replicate is 0).

    A replicate is the difference of two separately rounded means, so one whose true value is
    exactly 0 can come out as +-1e-17; replicates within ``1e-12 * scale`` of 0 (``scale``: the
    size of the values averaged) count as 0, on both sides, as in :func:`permutation_p`.

    >>> bootstrap_p(np.array([0.1, 0.2, -0.1, 0.3]))
    0.5
    >>> bootstrap_p(np.array([0.1, 0.2, -5e-17, 0.3]))   # rounding noise: 0, on both sides
    0.5
    """
    tol = 1e-12 * scale
    if np.all(np.abs(diff_reps) <= tol):
        return 1.0
    below = np.mean(diff_reps <= tol)
    above = np.mean(diff_reps >= -tol)
    return float(min(1.0, 2 * min(below, above)))


def percentile_interval(reps: np.ndarray, ci: float) -> tuple[float, float]:
    """(q_{(1-ci)/2}, q_{(1+ci)/2}) of the finite replicates, numpy's linear interpolation.

    >>> percentile_interval(np.array([0.0, 1.0, np.nan]), 0.5)
    (0.25, 0.75)
    """
    finite = reps[np.isfinite(reps)]
    if finite.size == 0:
        return (math.nan, math.nan)
    tail = (1 - ci) / 2
    lo, hi = np.quantile(finite, [tail, 1 - tail])
    return (float(lo), float(hi))


def statistic_ci(
    statistic: Statistic,
    arrays: Sequence[np.ndarray],
    *,
    ci: float,
    n_boot: int,
    seed: int,
) -> dict[str, tuple[float, float]]:
    """Percentile bootstrap interval of every value ``statistic`` returns (queries resampled).

    >>> statistic_ci(lambda v: {"mean": v.mean()}, [np.ones(4)], ci=0.9, n_boot=10, seed=0)
    {'mean': (1.0, 1.0)}
    """
    reps = replicates(statistic, arrays, n_boot=n_boot, seed=seed)
    return {key: percentile_interval(r, ci) for key, r in reps.items()}


def permutation_p(diff: np.ndarray, groups: np.ndarray | None, n_perm: int, seed: int) -> float:
    """Paired sign-flip test of mean(diff) = 0 (units: queries, or group means with ``groups``).

    p = share of sign patterns s with |Σ s_i d_i / n| >= |mean(d)|: exact over all 2^n patterns
    for n <= 12, else (hits + 1) / (n_perm + 1) over random patterns.  All-zero differences
    give 1.  A pattern's mean is summed in another order than ``mean(d)``, so one equal to it
    can round below it: means within ``1e-12`` times the size of the differences count as
    reaching it (as in :func:`bootstrap_p`), and the observed pattern always counts.

    Examples
    --------
    >>> permutation_p(np.array([1.0, 1.0]), None, 100, 0)   # patterns ++ and -- reach |1|
    0.5
    >>> permutation_p(np.array([28.0, 27.0, 11.0, 26.0]) * 1000 / 3, None, 100, 0)  # 2 of 16
    0.125
    """
    if groups is not None:
        n = int(groups.max()) + 1
        diff = np.bincount(groups, weights=diff, minlength=n) / np.bincount(groups)
    n = diff.size
    # an absolute 1e-12 is below the rounding of large values (a custom metric of ranks)
    reach = abs(diff.mean()) - 1e-12 * max(1.0, float(np.abs(diff).max()))
    if np.all(diff == 0):
        return 1.0
    if n <= EXACT_SIGN_FLIP_UNITS:  # exact: every one of the 2^n sign patterns
        signs = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)
        stats = np.abs(signs @ diff / n)
        return float(np.mean(stats >= reach))
    rng = np.random.default_rng(seed)
    hits = 0
    total = diff.sum()
    step = max(1, CHUNK // n)
    for start in range(0, n_perm, step):
        m = min(step, n_perm - start)
        # sign s = 1 - 2 * flip, so sum(s * diff) = sum(diff) - 2 * flip @ diff (int8 draws are
        # ~3x cheaper than choosing from [-1.0, 1.0])
        flips = rng.integers(0, 2, size=(m, n), dtype=np.int8).astype(np.float64)
        hits += int(np.sum(np.abs((total - 2 * (flips @ diff)) / n) >= reach))
    return (hits + 1) / (n_perm + 1)
