"""Percentile bootstrap of statistics that are not means (AURC, ECE, AUROC, R², ...).

The per-query metric means of :func:`embedeval.bootstrap_ci` are resampled by weighted sums; a
statistic such as an area under a curve has to be recomputed on each resampled query set, so
here each replicate draws n query indices with replacement and calls the statistic on them.
The loop runs over replicates (``n_boot``), never over queries.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

Statistic = Callable[..., dict[str, float]]


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
    """
    n = arrays[0].shape[0]
    rng = np.random.default_rng(seed)
    out: dict[str, list[float]] = {}
    for _ in range(n_boot):
        idx = rng.integers(0, n, size=n)
        for key, value in statistic(*(a[idx] for a in arrays)).items():
            out.setdefault(key, []).append(float(value))
    return {key: np.asarray(v) for key, v in out.items()}


def percentile_interval(reps: np.ndarray, ci: float) -> tuple[float, float]:
    """(q_{(1-ci)/2}, q_{(1+ci)/2}) of the finite replicates, numpy's linear interpolation."""
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
    """Percentile bootstrap interval of every value ``statistic`` returns (queries resampled)."""
    reps = replicates(statistic, arrays, n_boot=n_boot, seed=seed)
    return {key: percentile_interval(r, ci) for key, r in reps.items()}
