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


def bootstrap_p(diff_reps: np.ndarray) -> float:
    """Two-sided bootstrap p-value of a difference: twice the smaller share of replicates on
    either side of 0 (1 when every replicate is 0).

    >>> bootstrap_p(np.array([0.1, 0.2, -0.1, 0.3]))
    0.5
    """
    if np.all(diff_reps == 0):
        return 1.0
    below = np.mean(diff_reps <= 0)
    above = np.mean(diff_reps >= 0)
    return float(min(1.0, 2 * min(below, above)))


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


def _confidence_statistic(
    names: Sequence[str], higher_is_confident: bool, has_labels: bool, keys: Sequence[str] | None
) -> Statistic:
    """The confidence summary of one resample of (per-query matrix, confidences[, codes])."""
    import warnings

    from ._errors import EmbedevalWarning
    from .confidence import confidence_summary

    def stat(values: np.ndarray, conf: np.ndarray, *codes: np.ndarray) -> dict[str, float]:
        # Every metric sorts by confidence; sorted once here, their stable sorts see sorted
        # input and run in linear time (the statistics do not depend on the query order).
        order = np.argsort(conf if higher_is_confident else -conf, kind="stable")[::-1]
        values, conf = values[order], conf[order]
        codes = tuple(c[order] for c in codes)
        per_query = {name: values[:, j] for j, name in enumerate(names)}
        with warnings.catch_warnings():  # a resample may hold a single class: NaN, no noise
            warnings.simplefilter("ignore", EmbedevalWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            out = confidence_summary(
                per_query,
                conf,
                higher_is_confident=higher_is_confident,
                labels=codes[0] if has_labels else None,
            )
        return out if keys is None else {k: out.get(k, math.nan) for k in keys}

    return stat


def _confidence_arrays(
    per_query: dict[str, np.ndarray], conf: np.ndarray, labels: object
) -> tuple[list[str], list[np.ndarray]]:
    from ._validation import as_labels, factorize

    names = list(per_query)
    arrays = [np.stack([np.asarray(per_query[m], np.float64) for m in names], axis=1), conf]
    if labels is not None:
        (codes,), _ = factorize(as_labels(labels, "labels"))
        arrays.append(codes)
    return names, arrays


def confidence_ci(
    per_query: dict[str, np.ndarray],
    confidences: np.ndarray,
    *,
    labels: object = None,
    higher_is_confident: bool = True,
    ci: float,
    n_boot: int,
    seed: int,
) -> dict[str, tuple[float, float]]:
    """Bootstrap intervals of every :func:`~embedeval.confidence.confidence_summary` value.

    Queries are resampled with replacement (a duplicated query is a tied confidence block);
    lone queries travel with their resample, so the open-set values keep their meaning.
    """
    names, arrays = _confidence_arrays(per_query, np.asarray(confidences, np.float64), labels)
    stat = _confidence_statistic(names, higher_is_confident, labels is not None, None)
    return statistic_ci(stat, arrays, ci=ci, n_boot=n_boot, seed=seed)


def _needed_metrics(per_query: dict[str, np.ndarray], keys: Sequence[str]) -> list[str]:
    """The per-query metrics the confidence ``keys`` are computed from (the rest is skipped)."""
    names = [m for m in per_query if any(k.endswith("_" + m) for k in keys)]
    if any(not any(k.endswith("_" + m) for m in per_query) for k in keys):
        # r_auroc, ece, brier, open-set ...: computed from precision_at_1 (else recall_at_1)
        names += [next(m for m in ("precision_at_1", "recall_at_1") if m in per_query)]
    return list(dict.fromkeys(names))


def paired_confidence_replicates(
    runs: Sequence[object],
    keys: Sequence[str],
    *,
    n_boot: int,
    seed: int,
    swap: bool = False,
) -> dict[str, np.ndarray]:
    """Per key, (n_boot, n_runs) replicates of confidence metrics on shared resamples.

    Every run sees the same resampled query indices in a replicate, so differences between runs
    are paired.  With ``swap=True`` a replicate instead exchanges, query by query with
    probability 1/2, the (per-query values, confidence) of each run with those of run 0 (a
    paired permutation of two runs).
    """
    rng = np.random.default_rng(seed)
    prepared = []
    for r in runs:
        needed = _needed_metrics(r.per_query, keys)
        per_query = {m: r.per_query[m] for m in needed}
        names, arrays = _confidence_arrays(per_query, r.query_confidences, r.query_labels)
        higher = bool(r.settings.get("higher_is_confident", True))
        prepared.append((_confidence_statistic(names, higher, True, list(keys)), arrays))
    n = prepared[0][1][1].size
    out = {k: np.empty((n_boot, len(runs))) for k in keys}
    for b in range(n_boot):
        if swap:
            flip = rng.integers(0, 2, size=n).astype(bool)
            base = prepared[0][1]
            draws = [
                [
                    np.where(flip if a.ndim == 1 else flip[:, None], bb, a)
                    for a, bb in zip(arrays, base, strict=True)
                ]
                for _, arrays in prepared
            ]
        else:
            idx = rng.integers(0, n, size=n)
            draws = [[a[idx] for a in arrays] for _, arrays in prepared]
        for i, ((stat, _), drawn) in enumerate(zip(prepared, draws, strict=True)):
            for k, v in stat(*drawn).items():
                out[k][b, i] = v
    return out


def confidence_rows(
    runs: Sequence[object],
    names: Sequence[str],
    base: int,
    keys: Sequence[str],
    *,
    ci: float,
    n_boot: int,
    seed: int,
    test: str,
) -> list[dict[str, object]]:
    """:func:`embedeval.compare` rows for confidence metrics (AURC, ECE, R-AUROC, ...).

    Each replicate recomputes the metric for every run on the same resampled queries; a run's
    interval is the percentile interval of its replicates, the difference's interval that of
    the paired differences, and p is the paired bootstrap p-value (``test="bootstrap"``) or the
    share of query-wise swaps with the baseline whose |difference| reaches the observed one
    (``test="permutation"``, (hits + 1) / (n_boot + 1)).
    """

    rows: list[dict[str, object]] = []
    all_reps = paired_confidence_replicates(runs, keys, n_boot=n_boot, seed=seed)
    for key in keys:
        reps = all_reps[key]
        values = [float(r.confidence[key]) for r in runs]
        for i, name in enumerate(names):
            lo, hi = percentile_interval(reps[:, i], ci)
            row = {
                "checkpoint": name,
                "metric": key,
                "value": values[i],
                "ci_low": lo,
                "ci_high": hi,
                "diff": 0.0,
                "diff_ci_low": 0.0,
                "diff_ci_high": 0.0,
                "p_value": 1.0,
                "n_shared": int(runs[i].n_queries),
            }
            if i != base:
                d = reps[:, i] - reps[:, base]
                d = d[np.isfinite(d)]
                dlo, dhi = percentile_interval(d, ci)
                observed = values[i] - values[base]
                if test == "bootstrap":
                    p = bootstrap_p(d) if d.size else math.nan
                else:
                    pair = [runs[base], runs[i]]
                    swaps = paired_confidence_replicates(
                        pair, [key], n_boot=n_boot, seed=seed, swap=True
                    )[key]
                    stat = np.abs(swaps[:, 1] - swaps[:, 0])
                    hits = int(np.sum(stat >= abs(observed) - 1e-12))
                    p = (hits + 1) / (n_boot + 1)
                row.update(diff=observed, diff_ci_low=dlo, diff_ci_high=dhi, p_value=float(p))
            rows.append(row)
    return rows
