"""Ranking and IR metrics, vectorised over queries, with explicit tie and zero-division rules.

Every ranked metric takes scikit-learn's ``(y_true, y_score)``: a 1-D pair is one query and gives
a Python float; 2-D arrays hold one query per row and give a float64 array of per-query values.
``y_true`` is the relevance (0/1, or graded for DCG), ``y_score`` is higher-is-better.  When the
list is truncated (you pass the top 100 of a larger collection), ``n_relevant=`` gives the number
of relevant items in the whole collection, used by recall, AP and R-precision.

Ties in ``y_score`` (``ties=``):

* ``"expected"`` (default): the mean over every ordering of tied items, by closed forms
  (McSherry & Najork, ECIR 2008): a position inside a tie block of size g holding r relevant
  items is relevant with probability r/g, and two positions both with probability
  r(r-1)/(g(g-1)).
* ``"pessimistic"`` / ``"optimistic"``: relevant items last / first within a tie.
* ``"threshold"``: scikit-learn's rule — a tie block is one threshold, precision is read at the
  block's end (for ``average_precision`` and the curves, where it gives exact parity with
  ``sklearn.metrics.average_precision_score``).

Zero division (no relevant item, no retrieved item, an ideal DCG of 0) follows ``zero_division``:
``"warn"`` (default: 0.0 and an :class:`~embedeval.EmbedevalWarning`), or a number (0.0, 1.0,
``nan``) returned silently.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple

import numpy as np

from ..utils.errors import EmbedevalWarning, InputError
from ..utils.validation import (
    as_int64,
    check_choice,
    check_int,
    check_positive,
    divide,
    refuse_object_array,
)
from .curves import exact_number, refuse_merged_integers, threshold_counts
from .judged import GAINS, refuse_large_grade

__all__ = [
    "AlignedRuns",
    "align_by_id",
    "average_precision",
    "cumulative_gain",
    "dcg",
    "f_beta",
    "fallout",
    "from_neighbors",
    "hit_rate_at_k",
    "interpolated_average_precision",
    "mean_average_precision",
    "mean_reciprocal_rank",
    "ndcg",
    "precision",
    "precision_at_k",
    "precision_recall_curve",
    "r_precision",
    "recall",
    "recall_at_k",
    "reciprocal_rank",
    "system_efficiency",
]

_TIES = ("expected", "pessimistic", "optimistic", "threshold")


# --------------------------------------------------------------------------- input handling
def _as_2d(
    y_true: Any, y_score: Any, *, graded: bool = False
) -> tuple[np.ndarray, np.ndarray, bool]:
    t = _rectangular_input(y_true, "y_true")
    s = _rectangular_input(y_score, "y_score")
    for name, arr in (("y_true", t), ("y_score", s)):
        refuse_object_array(arr, name, "y_true and y_score must be numeric arrays.", InputError)
        if arr.dtype.kind not in "fiub":
            raise InputError(
                f"{name} must be numeric (relevance / scores); got dtype {arr.dtype}. Map labels "
                "to relevance first, e.g. with from_neighbors or align_by_id."
            )
    refuse_merged_integers(y_score, "y_score")  # the input itself: a list may mix int, float
    single = t.ndim == 1
    if t.ndim not in (1, 2) or t.shape != s.shape:
        raise InputError(
            f"y_true and y_score must have the same 1-D or 2-D shape; got {t.shape} and {s.shape}."
        )
    if t.size == 0:
        raise InputError("y_true is empty; pass at least one ranked item.")
    t = np.atleast_2d(t).astype(np.float64)
    s = np.atleast_2d(s).astype(np.float64)
    if not np.isfinite(s).all():
        bad = np.argwhere(~np.isfinite(s))[0]
        raise InputError(f"y_score has NaN or infinite values (first at {tuple(bad.tolist())}).")
    if not np.isfinite(t).all() or (t < 0).any():
        raise InputError("y_true must be finite and >= 0 (relevance grades).")
    if not graded and not np.isin(t, (0, 1)).all():
        raise InputError(
            "y_true must be binary (0/1) for this metric; graded relevance is for "
            "dcg / ndcg / cumulative_gain."
        )
    return t, s, single


def _rectangular_input(x: Any, name: str) -> np.ndarray:
    try:
        return np.asarray(x)
    except ValueError:  # NumPy refuses ragged nested lists
        raise InputError(
            f"{name} has rows of different lengths; pass a rectangular array (one row per "
            "query, padded with non-relevant items scored lowest, as align_by_id does)."
        ) from None


def _n_relevant(n_relevant: Any, t: np.ndarray) -> np.ndarray:
    found = (t > 0).sum(axis=1).astype(np.float64)
    if n_relevant is None:
        return found
    try:
        raw = np.asarray(n_relevant)
        if raw.dtype.kind not in "iuf":  # text such as "3" is not a count
            raise TypeError
        n = np.broadcast_to(raw.astype(np.float64), (t.shape[0],)).copy()
    except (TypeError, ValueError):
        raise InputError(
            f"n_relevant must be a whole number or one per query ({t.shape[0]} queries); got "
            f"{n_relevant!r:.80}."
        ) from None
    if not (np.isfinite(n) & (n == np.round(n))).all():
        i = int(np.flatnonzero(~(np.isfinite(n) & (n == np.round(n))))[0])
        raise InputError(
            f"n_relevant[{i}] = {n[i]!r} is not a whole number; it counts relevant items in "
            "the whole collection."
        )
    if (n < found).any():
        i = int(np.flatnonzero(n < found)[0])
        raise InputError(
            f"n_relevant[{i}] = {n[i]:g} is smaller than the {found[i]:g} relevant items "
            "already in the list; it counts relevant items in the whole collection."
        )
    return n


def _k(k: Any, n_items: int) -> int:
    if k is None:
        return n_items
    return check_int(k, "k")


def _out(values: np.ndarray, single: bool) -> float | np.ndarray:
    return float(values[0]) if single else values


def _divide(num: Any, den: Any, zero_division: Any, what: str) -> np.ndarray:
    return divide(num, den, zero_division, "{n} quer(ies) have " + what)


class _Ranked:
    """Rows sorted by score (descending) with the tie blocks of each position.

    With ``k`` (a cut-off below the row length) only the top k + 1 items are selected
    (``argpartition``) and sorted — unless a tie straddles the cut in some row, in which case
    the whole rows are sorted, so the result never depends on the shortcut.
    """

    def __init__(self, t: np.ndarray, s: np.ndarray, ties: str, k: int | None = None) -> None:
        ties = check_choice(ties, "ties", _TIES)
        self.ties = ties
        n = t.shape[1]
        if k is not None and k + 1 < n:
            part = np.argpartition(-s, k, axis=1)[:, : k + 1]
            sub_s = np.take_along_axis(s, part, axis=1)
            sub_t = np.take_along_axis(t, part, axis=1)
            order = self._order(sub_t, sub_s, tiebreak=part)
            score = np.take_along_axis(sub_s, order, axis=1)
            if not (score[:, k - 1] == score[:, k]).any():
                self._finish(np.take_along_axis(sub_t, order, axis=1), score)
                return
        order = self._order(t, s)
        self._finish(np.take_along_axis(t, order, axis=1), np.take_along_axis(s, order, axis=1))

    def _order(self, t: np.ndarray, s: np.ndarray, tiebreak: np.ndarray | None = None):
        keys = [] if tiebreak is None else [tiebreak]  # equal scores keep the input order
        if self.ties == "pessimistic":
            keys.append(t)
        elif self.ties == "optimistic":
            keys.append(-t)
        if not keys:
            # "expected" and "threshold" only read tie-block statistics, so the order inside a
            # block is irrelevant and the (3-4x faster, SIMD) unstable sort is safe.
            return np.argsort(-s, axis=1)
        return np.lexsort((*keys, -s), axis=1)

    def _finish(self, rel: np.ndarray, score: np.ndarray) -> None:
        self.rel, self.score = rel, score
        self._equal_prev = np.zeros(rel.shape, dtype=bool)
        self._equal_prev[:, 1:] = score[:, 1:] == score[:, :-1]
        self.any_ties = bool(self._equal_prev.any())
        if self.any_ties and self._equal_prev.mean() > 0.5:
            warnings.warn(
                f"{self._equal_prev.mean():.0%} of the ranked items tie with their predecessor "
                "(quantised scores?); tie handling decides these values.",
                EmbedevalWarning,
                stacklevel=4,
            )
        self._blocks: tuple[np.ndarray, np.ndarray] | None = None

    def _block_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        if self._blocks is None:
            n = self.rel.shape[1]
            pos = np.broadcast_to(np.arange(n), self.rel.shape)
            if not self.any_ties:
                self._blocks = (pos, pos)
            else:
                eq = self._equal_prev
                start = np.maximum.accumulate(np.where(~eq, pos, 0), axis=1)
                equal_next = np.zeros(eq.shape, dtype=bool)
                equal_next[:, :-1] = eq[:, 1:]
                end = np.minimum.accumulate(np.where(~equal_next, pos, n - 1)[:, ::-1], axis=1)[
                    :, ::-1
                ]
                self._blocks = (start, end)
        return self._blocks

    @property
    def start(self) -> np.ndarray:
        return self._block_bounds()[0]

    @property
    def end(self) -> np.ndarray:
        return self._block_bounds()[1]

    @property
    def size(self) -> np.ndarray:
        start, end = self._block_bounds()
        return end - start + 1

    def block_mean(self, values: np.ndarray) -> np.ndarray:
        """Replace every position's value by its tie block's mean (the expected value)."""
        c = np.concatenate([np.zeros((values.shape[0], 1)), np.cumsum(values, axis=1)], axis=1)
        total = np.take_along_axis(c, self.end + 1, axis=1) - np.take_along_axis(
            c, self.start, axis=1
        )
        return total / self.size

    def gains(self, values: np.ndarray | None = None) -> np.ndarray:
        """Per-position relevance under the tie rule (expected, threshold: block means)."""
        v = self.rel if values is None else values
        if self.ties in ("expected", "threshold") and self.any_ties:
            return self.block_mean(v)
        return v


# --------------------------------------------------------------------------- set retrieval
def _set_counts(
    y_true: Any, y_pred: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]:
    t, p, single = _as_2d(y_true, y_pred)
    if not np.isin(p, (0, 1)).all():
        raise InputError("y_pred must be binary retrieved (1) / not retrieved (0) flags.")
    tp = (t * p).sum(1)
    fp = ((1 - t) * p).sum(1)
    fn = (t * (1 - p)).sum(1)
    tn = ((1 - t) * (1 - p)).sum(1)
    return tp, fp, fn, tn, single


def _set_metric(num, den, average, single, zero_division, what):
    average = check_choice(average, "average", ("macro", "micro", "none"))
    if average == "micro":
        return float(
            _divide(num.sum(keepdims=True), den.sum(keepdims=True), zero_division, what)[0]
        )
    values = _divide(num, den, zero_division, what)
    if average == "macro" and not single:
        return float(values.mean())
    return _out(values, single)


def precision(
    y_true: Any, y_pred: Any, *, average: str = "macro", zero_division: Any = "warn"
) -> float | np.ndarray:
    """Set precision TP / (TP + FP) of retrieved flags ``y_pred`` (rows = queries).

    ``average="macro"``: mean of per-query precisions; ``"micro"``: pooled counts;
    ``"none"``: the per-query values.

    Ties: none (``y_pred`` are flags, not scores).  Zero division: a query that retrieves
    nothing has 0/0 and gets ``zero_division`` (``"micro"``: only when nothing at all is
    retrieved).

    Examples
    --------
    >>> precision([[1, 0, 1, 0], [0, 0, 1, 1]], [[1, 1, 0, 0], [0, 0, 1, 1]])
    0.75
    >>> precision([[1, 0, 1, 0], [0, 0, 1, 1]], [[1, 1, 0, 0], [0, 0, 1, 1]], average="micro")
    0.75
    """
    tp, fp, _, _, single = _set_counts(y_true, y_pred)
    return _set_metric(tp, tp + fp, average, single, zero_division, "nothing retrieved")


def recall(
    y_true: Any, y_pred: Any, *, average: str = "macro", zero_division: Any = "warn"
) -> float | np.ndarray:
    """Set recall TP / (TP + FN).

    Ties: none.  Zero division: a query with no relevant item gets ``zero_division``.

    Examples
    --------
    >>> recall([[1, 0, 1, 0]], [[1, 1, 0, 0]], average="none").tolist()
    [0.5]
    """
    tp, _, fn, _, single = _set_counts(y_true, y_pred)
    return _set_metric(tp, tp + fn, average, single, zero_division, "no relevant item")


def fallout(
    y_true: Any, y_pred: Any, *, average: str = "macro", zero_division: Any = "warn"
) -> float | np.ndarray:
    """Fall-out FP / (FP + TN): the share of non-relevant items retrieved.

    Ties: none.  Zero division: a query whose every item is relevant gets ``zero_division``.

    Examples
    --------
    >>> fallout([1, 0, 1, 0], [1, 1, 0, 0])
    0.5
    """
    _, fp, _, tn, single = _set_counts(y_true, y_pred)
    return _set_metric(fp, fp + tn, average, single, zero_division, "no non-relevant item")


def f_beta(
    y_true: Any,
    y_pred: Any,
    *,
    beta: float = 1.0,
    average: str = "macro",
    zero_division: Any = "warn",
) -> float | np.ndarray:
    """F_β = (1 + β²) P R / (β² P + R), with the true β.

    trec_eval's ``set_F.x`` takes x = β² (so its ``set_F.0.5`` is F_{√0.5}); pass
    ``beta=math.sqrt(x)`` to match it.  Computed from counts as
    (1 + β²) TP / ((1 + β²) TP + β² FN + FP), so P or R being undefined is not an issue.
    ``beta`` is a finite number > 0, NumPy scalars included (as β → ∞, F_β tends to recall:
    use :func:`recall`).

    Ties: none.  Zero division: only a query with no relevant and no retrieved item (0/0) gets
    ``zero_division``; scikit-learn's ``fbeta_score`` agrees.

    Examples
    --------
    >>> f_beta([1, 0, 1, 0], [1, 1, 0, 0])
    0.5
    """
    beta = check_positive(beta, "beta")
    tp, fp, fn, _, single = _set_counts(y_true, y_pred)
    b2 = beta * beta
    return _set_metric(
        (1 + b2) * tp,
        (1 + b2) * tp + b2 * fn + fp,
        average,
        single,
        zero_division,
        "no relevant and no retrieved item",
    )


# --------------------------------------------------------------------------- ranked metrics
def precision_at_k(
    y_true: Any, y_score: Any, *, k: int, ties: str = "expected"
) -> float | np.ndarray:
    """P@k = (relevant among the top k) / k — divides by k even when fewer than k items exist.

    Ties: ``"expected"`` replaces each position's relevance by its tie block's mean (the
    probability that position is relevant), so a block cut by k contributes its expected hits;
    ``"pessimistic"`` / ``"optimistic"`` put relevant items last / first.  Zero division: never
    (k >= 1).  Same as trec_eval's ``P_k`` and ranx's ``precision@k`` on untied scores.

    Examples
    --------
    >>> precision_at_k([1, 0, 1, 1], [0.9, 0.8, 0.7, 0.1], k=2)
    0.5
    >>> precision_at_k([1, 0], [0.5, 0.5], k=1)     # expected value over the tie
    0.5
    """
    t, s, single = _as_2d(y_true, y_score)
    k = _k(k, t.shape[1])
    r = _Ranked(t, s, _no_threshold(ties), k=k)
    return _out(r.gains()[:, :k].sum(1) / k, single)


def _no_threshold(ties: str) -> str:
    if ties == "threshold":
        raise InputError(
            "ties='threshold' (scikit-learn's grouping) applies to average_precision and the "
            "curves; use 'expected', 'pessimistic' or 'optimistic' here."
        )
    return ties


def recall_at_k(
    y_true: Any,
    y_score: Any,
    *,
    k: int,
    n_relevant: Any = None,
    ties: str = "expected",
    zero_division: Any = "warn",
) -> float | np.ndarray:
    """IR recall@k = (relevant among the top k) / (relevant in the collection).

    Not the metric-learning "Recall@k" (a hit rate): see :func:`hit_rate_at_k`.

    Ties: as :func:`precision_at_k` (expected hits in the top k).  Zero division:
    ``n_relevant = 0`` gets ``zero_division``.

    Examples
    --------
    >>> recall_at_k([1, 0, 1, 1], [0.9, 0.8, 0.7, 0.1], k=2, n_relevant=4)
    0.25
    """
    t, s, single = _as_2d(y_true, y_score)
    k = _k(k, t.shape[1])
    r = _Ranked(t, s, _no_threshold(ties))
    return _out(
        _divide(
            r.gains()[:, :k].sum(1), _n_relevant(n_relevant, t), zero_division, "no relevant item"
        ),
        single,
    )


def hit_rate_at_k(
    y_true: Any, y_score: Any, *, k: int, ties: str = "expected"
) -> float | np.ndarray:
    """1 if any of the top k is relevant (metric-learning "Recall@k"); expected over ties.

    For a tie block cut by k, taking c of its g items of which r are relevant misses them all
    with probability C(g-r, c) / C(g, c).

    Zero division: never; a query with no relevant item scores 0.

    Examples
    --------
    >>> hit_rate_at_k([0, 1, 0], [0.5, 0.5, 0.1], k=1)
    0.5
    """
    t, s, single = _as_2d(y_true, y_score)
    k = min(_k(k, t.shape[1]), t.shape[1])
    r = _Ranked(t, s, _no_threshold(ties), k=k)
    rel = r.rel > 0
    if ties != "expected" or not r.any_ties:
        return _out(rel[:, :k].any(1).astype(np.float64), single)
    # Relevant strictly before the block holding position k-1, or a hit inside that block.
    start = r.start[:, k - 1]
    end = r.end[:, k - 1]
    cum = np.concatenate([np.zeros((rel.shape[0], 1)), np.cumsum(rel, axis=1)], axis=1)
    rows = np.arange(rel.shape[0])
    before = cum[rows, start] > 0
    g = end - start + 1
    rb = cum[rows, end + 1] - cum[rows, start]
    c = k - start
    miss = np.exp(_log_comb(g - rb, c) - _log_comb(g, c))
    return _out(np.where(before, 1.0, 1.0 - miss), single)


def _log_comb(n: np.ndarray, c: np.ndarray) -> np.ndarray:
    from scipy.special import gammaln

    n = np.asarray(n, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    out = gammaln(n + 1) - gammaln(c + 1) - gammaln(np.maximum(n - c, 0) + 1)
    return np.where(c > n, -np.inf, out)


def r_precision(
    y_true: Any,
    y_score: Any,
    *,
    n_relevant: Any = None,
    ties: str = "expected",
    zero_division: Any = "warn",
) -> float | np.ndarray:
    """R-precision: precision at R = number of relevant items in the collection.

    R-Prec = (relevant among the top R) / R with R = ``n_relevant`` (a list shorter than R
    counts its end as misses).  Ties: expected hits in the top R (block means), or pessimistic /
    optimistic.  Zero division: R = 0 gets ``zero_division``.  Same as trec_eval's ``Rprec``.

    Examples
    --------
    >>> r_precision([1, 0, 1, 0], [0.9, 0.8, 0.7, 0.1])
    0.5
    """
    t, s, single = _as_2d(y_true, y_score)
    n_rel = _n_relevant(n_relevant, t)
    g = _Ranked(t, s, _no_threshold(ties)).gains()
    cum = np.concatenate([np.zeros((t.shape[0], 1)), np.cumsum(g, axis=1)], axis=1)
    window = np.minimum(n_rel, t.shape[1]).astype(np.int64)
    hits = cum[np.arange(t.shape[0]), window]
    return _out(_divide(hits, n_rel, zero_division, "no relevant item"), single)


def average_precision(
    y_true: Any,
    y_score: Any,
    *,
    k: int | None = None,
    n_relevant: Any = None,
    normalization: str = "relevant",
    ties: str = "expected",
    zero_division: Any = "warn",
) -> float | np.ndarray:
    """Average precision by the step rule: AP = (1/N) Σ_i rel_i · P@i over the (top-k) ranking.

    Parameters
    ----------
    k : int, optional
        AP@k: only the first k positions contribute.
    n_relevant : array-like, optional
        Relevant items in the whole collection (default: those in the list).
    normalization : {"relevant", "min_k_relevant", "hits"}
        The divisor N: all relevant items (trec_eval, ranx; default), min(k, relevant)
        (common in recommender papers), or the relevant items retrieved in the top k.
    ties : {"expected", "pessimistic", "optimistic", "threshold"}
        ``"expected"``: position p (1-based) inside a tie block of g items with r relevant, with
        R_b relevant items before the block and j its index in the block, contributes
        [(r/g)(R_b + 1) + (j-1) r(r-1)/(g(g-1))] / p.  ``"threshold"`` reads precision at the end
        of each tie block (scikit-learn's ``average_precision_score``); a block of g items with r
        relevant cut by k after c of them counts c·r/g hits at that precision (and c·r/g hits
        for ``normalization="hits"``), whatever the input order of its items.  With
        ``normalization="hits"`` the divisor varies with the order when a tie block is cut by k;
        the expected value is then E[Σ / hits] over the hypergeometric hit count of that block
        (an ordering with no hit counts as ``zero_division``).

    Examples
    --------
    >>> round(average_precision([1, 0, 0, 1, 0, 0, 1, 1],
    ...                         [0.8, 0.6, 0.3, 0.2, 0.9, 0.75, 0.81, 0.92]), 4)
    0.7292
    """
    t, s, single = _as_2d(y_true, y_score)
    normalization = check_choice(
        normalization, "normalization", ("relevant", "min_k_relevant", "hits")
    )
    n = t.shape[1]
    k_asked = _k(k, n)
    k = min(k_asked, n)
    r = _Ranked(t, s, ties, k=k)
    rel = (r.rel > 0).astype(np.float64)
    n = rel.shape[1]
    pos = np.arange(1, n + 1, dtype=np.float64)
    cum = np.cumsum(rel, axis=1)
    if ties == "threshold" and r.any_ties:
        # One threshold per tie block: precision at the block's end, weighted by its hits; a
        # block cut by k counts its share of them (the order inside a block is arbitrary).
        end_hits = np.take_along_axis(cum, r.end, axis=1)
        block_precision = end_hits / (r.end + 1)
        contrib = r.gains(rel) * block_precision
    elif ties == "expected" and r.any_ties:
        zeros = np.zeros((t.shape[0], 1))
        c0 = np.concatenate([zeros, cum], axis=1)
        before = np.take_along_axis(c0, r.start, axis=1)
        g = r.size.astype(np.float64)
        rb = np.take_along_axis(c0, r.end + 1, axis=1) - before
        j = pos[None, :] - r.start  # 1-based index inside the block
        pair = np.where(g > 1, rb * (rb - 1) / np.maximum(g * (g - 1), 1), 0.0)
        contrib = ((rb / g) * (before + 1) + (j - 1) * pair) / pos
    else:
        contrib = rel * cum / pos
    total = contrib[:, :k].sum(1)
    if normalization == "relevant":
        den = _n_relevant(n_relevant, t)
    elif normalization == "min_k_relevant":
        den = np.minimum(_n_relevant(n_relevant, t), k_asked)  # the k asked, not the list
    else:
        den = r.gains(rel)[:, :k].sum(1)
        if ties == "expected" and r.any_ties and k < n:
            return _out(_hits_expected(r, rel, contrib, k, zero_division), single)
    return _out(_divide(total, den, zero_division, "no relevant item"), single)


def _hits_expected(
    r: _Ranked, rel: np.ndarray, contrib: np.ndarray, k: int, zero_division: Any
) -> np.ndarray:
    """E[Σ/hits] for AP@k with normalization="hits" under expected ties.

    The hit count varies only through the tie block cut by k: taking c of its g items (r
    relevant) gives X ~ hypergeometric hits.  Given X = x, each taken position is relevant with
    probability x/c and two of them with x(x-1)/(c(c-1)), so E[Σ | x] is closed-form; the value is
    Σ_x P(x) E[Σ | x] / (R_b + x), with R_b the hits before the block.
    """
    rows = np.arange(rel.shape[0])
    s0 = r.start[:, k - 1]
    g = r.size[:, k - 1].astype(np.float64)
    cum = np.concatenate([np.zeros((rel.shape[0], 1)), np.cumsum(rel, axis=1)], axis=1)
    before = cum[rows, s0]
    rb = cum[rows, s0 + g.astype(np.int64)] - before
    c = (k - s0).astype(np.float64)
    ccon = np.concatenate([np.zeros((rel.shape[0], 1)), np.cumsum(contrib, axis=1)], axis=1)
    s_before = ccon[rows, s0]
    inv = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, k + 1))])
    a = inv[k] - inv[s0]  # Σ 1/p over the taken positions p = s0+1 .. k
    b = c - (s0 + 1) * a  # Σ (p - s0 - 1) / p
    xmax = int(c.max())
    x = np.arange(xmax + 1, dtype=np.float64)[None, :]
    logp = (
        _log_comb(rb[:, None], x)
        + _log_comb((g - rb)[:, None], c[:, None] - x)
        - _log_comb(g, c)[:, None]
    )
    prob = np.where(x <= c[:, None], np.exp(logp), 0.0)
    pair = np.where(c > 1, b / np.maximum(c * (c - 1), 1), 0.0)
    num = s_before[:, None] + (x / c[:, None]) * (before[:, None] + 1) * a[:, None]
    num = num + x * (x - 1) * pair[:, None]
    hits = before[:, None] + x
    possible = prob > 0
    ratio = _divide(
        np.where(possible, num, 0.0),
        np.where(possible, hits, 1.0),
        zero_division,
        "no hit in the top k",
    )
    return (np.where(possible, prob * ratio, 0.0)).sum(1)


def mean_average_precision(y_true: Any, y_score: Any, **kwargs: Any) -> float:
    """MAP: the mean of :func:`average_precision` over queries (rows).

    Takes the keyword arguments of :func:`average_precision` (``k``, ``n_relevant``,
    ``normalization``, ``ties``, ``zero_division``), with its tie rule; a query with no relevant
    item contributes its ``zero_division`` value (so ``zero_division=nan`` makes MAP NaN, like
    a NaN in any mean).  trec_eval's ``map`` and ranx's ``map`` on untied scores.

    Examples
    --------
    >>> mean_average_precision([[1, 0], [0, 1]], [[0.9, 0.1], [0.9, 0.1]])
    0.75
    """
    return float(
        np.mean(average_precision(np.atleast_2d(y_true), np.atleast_2d(y_score), **kwargs))
    )


def interpolated_average_precision(
    y_true: Any,
    y_score: Any,
    *,
    points: int | str = 11,
    n_relevant: Any = None,
    ties: str = "threshold",
    zero_division: Any = "warn",
) -> float | np.ndarray:
    """Interpolated AP: mean interpolated precision at recall levels.

    Interpolated precision at recall r is the largest precision at any recall >= r (0 if no such
    point).  ``points=11`` averages it at r = 0, 0.1, ..., 1 (the textbook rule; trec_eval's
    ``11pt_avg`` uses the same levels but its own cut-offs at ties); ``points="all"`` gives the
    area under the interpolated curve at every recall step.  The PR points are read at the end of
    each tie block (``ties="threshold"``) or at every position (``"pessimistic"`` /
    ``"optimistic"``).

    Zero division: a query with no relevant item (recall undefined) gets ``zero_division``.

    Examples
    --------
    >>> round(interpolated_average_precision([1, 0, 1], [0.9, 0.8, 0.7]), 4)
    0.8485
    """
    t, s, single = _as_2d(y_true, y_score)
    if ties == "expected":
        raise InputError(
            "interpolated AP takes a maximum, which has no closed-form expectation "
            "over ties; use ties='threshold', 'pessimistic' or 'optimistic'."
        )
    r = _Ranked(t, s, ties)
    rel = (r.rel > 0).astype(np.float64)
    n_rel = _n_relevant(n_relevant, t)
    cum = np.cumsum(rel, axis=1)
    if ties == "threshold":
        cum = np.take_along_axis(cum, r.end, axis=1)
        pos = (r.end + 1).astype(np.float64)
    else:
        pos = np.arange(1, t.shape[1] + 1, dtype=np.float64)[None, :].repeat(t.shape[0], 0)
    prec = cum / pos
    # No relevant item: recall stays 0 here and the policy decides the value at the end.
    rec = cum / np.maximum(n_rel, 1)[:, None]
    defined = np.where(n_rel > 0, 1.0, 0.0)
    # interpolated precision at position i: max precision at positions >= i
    interp = np.maximum.accumulate(prec[:, ::-1], axis=1)[:, ::-1]
    if isinstance(points, str):
        points = check_choice(points, "points", ("all",))
    if points == "all":
        step = np.diff(np.concatenate([np.zeros((t.shape[0], 1)), rec], axis=1), axis=1)
        area = (step * interp).sum(1)
        return _out(_divide(area, defined, zero_division, "no relevant item"), single)
    points = check_int(points, "points", minimum=2)
    levels = np.linspace(0, 1, points)
    # for each level, the first position whose recall reaches it
    reach = rec[:, :, None] >= levels[None, None, :] - 1e-12
    has = reach.any(1)
    first = np.argmax(reach, axis=1)
    vals = np.where(has, np.take_along_axis(interp, first, axis=1), 0.0)
    return _out(_divide(vals.mean(1), defined, zero_division, "no relevant item"), single)


def reciprocal_rank(
    y_true: Any, y_score: Any, *, k: int | None = None, ties: str = "expected"
) -> float | np.ndarray:
    """1 / rank of the first relevant item (0 if none in the top k): RR or RR@k.

    With ``ties="expected"`` and the first relevant item in a tie block starting at position
    s+1 with g items of which r are relevant, E[1/rank] = Σ_j P(first = s + j) / (s + j) with
    P(first = s + j) = C(g-j, r-1) / C(g, r).

    Zero division: never; no relevant item in the top k gives 0 (trec_eval's ``recip_rank``).

    Examples
    --------
    >>> reciprocal_rank([0, 1, 1], [0.9, 0.8, 0.1])
    0.5
    >>> reciprocal_rank([0, 1], [0.5, 0.5])      # rank 1 or 2 with equal chance
    0.75
    """
    t, s, single = _as_2d(y_true, y_score)
    n = t.shape[1]
    k = min(_k(k, n), n)
    r = _Ranked(t, s, _no_threshold(ties), k=k)
    rel = r.rel > 0
    has = rel.any(1)
    first = np.argmax(rel, axis=1)
    rows = np.arange(t.shape[0])
    if ties != "expected" or not r.any_ties:
        return _out(np.where(has & (first < k), 1.0 / (first + 1.0), 0.0), single)
    start = r.start[rows, first]
    g = r.size[rows, first]
    cum = np.concatenate([np.zeros((t.shape[0], 1)), np.cumsum(rel, axis=1)], axis=1)
    rb = cum[rows, start + g] - cum[rows, start]
    jmax = int(g.max())
    j = np.arange(1, jmax + 1)[None, :]
    logp = _log_comb(g[:, None] - j, rb[:, None] - 1) - _log_comb(g, rb)[:, None]
    p = np.where(j <= g[:, None], np.exp(logp), 0.0)
    rank = start[:, None] + j
    value = (p / rank * (rank <= k)).sum(1)
    return _out(np.where(has, value, 0.0), single)


def mean_reciprocal_rank(y_true: Any, y_score: Any, **kwargs: Any) -> float:
    """MRR: mean of :func:`reciprocal_rank` over queries.

    Takes the keyword arguments of :func:`reciprocal_rank` (``k``, ``ties``) and its tie rule;
    a query without a relevant item contributes 0 (no zero division).

    Examples
    --------
    >>> mean_reciprocal_rank([[0, 1], [1, 0]], [[0.9, 0.1], [0.9, 0.1]])
    0.75
    """
    return float(np.mean(reciprocal_rank(np.atleast_2d(y_true), np.atleast_2d(y_score), **kwargs)))


def _gain(rel: np.ndarray, gain: str, name: str = "y_true") -> np.ndarray:
    """The gain of each grade; ``name`` is the argument holding the grades, for the error."""
    gain = check_choice(gain, "gain", GAINS)
    if gain == "linear":
        return rel
    if rel.size:
        refuse_large_grade(float(rel.max()), f"{name} holds")
    return np.power(2.0, rel) - 1.0


def cumulative_gain(
    y_true: Any, y_score: Any, *, k: int | None = None, ties: str = "expected"
) -> float | np.ndarray:
    """CG@k: the sum of relevance grades in the top k.

    Ties: ``"expected"`` gives each position of a tie block the block's mean grade (exact
    expectation); pessimistic / optimistic put low / high grades first.  Zero division: never.

    Examples
    --------
    >>> cumulative_gain([3, 2, 0, 1], [0.9, 0.8, 0.7, 0.1], k=3)
    5.0
    """
    t, s, single = _as_2d(y_true, y_score, graded=True)
    k = _k(k, t.shape[1])
    return _out(_Ranked(t, s, _no_threshold(ties), k=k).gains()[:, :k].sum(1), single)


def _discounts(n: int) -> np.ndarray:
    return 1.0 / np.log2(np.arange(2, n + 2, dtype=np.float64))


def dcg(
    y_true: Any, y_score: Any, *, k: int | None = None, gain: str = "linear", ties: str = "expected"
) -> float | np.ndarray:
    """DCG@k = Σ_{i <= k} g(rel_i) / log2(i + 1), g = rel ("linear") or 2^rel - 1.

    With ``ties="expected"`` every position in a tie block gets the block's mean gain (the
    exact expectation over orderings); scikit-learn's ``dcg_score`` does the same.

    Zero division: never (a sum).

    Examples
    --------
    >>> round(dcg([3, 2, 3, 0, 1, 2], [6, 5, 4, 3, 2, 1]), 4)
    6.8611
    """
    t, s, single = _as_2d(y_true, y_score, graded=True)
    k = min(_k(k, t.shape[1]), t.shape[1])
    r = _Ranked(t, s, _no_threshold(ties), k=k)
    g = r.gains(_gain(r.rel, gain))
    return _out((g[:, :k] * _discounts(k)).sum(1), single)


def ndcg(
    y_true: Any,
    y_score: Any,
    *,
    k: int | None = None,
    gain: str = "linear",
    ideal: Any = None,
    ties: str = "expected",
    zero_division: Any = "warn",
) -> float | np.ndarray:
    """nDCG@k = DCG@k / IDCG@k, with the ideal ranking taken from the collection.

    Parameters
    ----------
    k : int, optional
        Cut-off of both rankings.  ``None``: the whole retrieved list, and the whole ideal
        ranking — with ``ideal=`` given, every judged item counts in the ideal DCG even when the
        retrieved list is shorter (trec_eval's ``ndcg`` and ranx's ``ndcg`` without a cut-off).
    ideal : array-like, optional
        The relevance grades of every judged item in the collection (1-D for one query, or one
        row / list per query).  Default: the grades in ``y_true``, i.e. the retrieved list
        itself — which overrates a system that retrieves few of the relevant items.

    Ties: the DCG part follows ``ties`` (see :func:`dcg`); the ideal ranking sorts grades, where
    ties do not matter.  Zero division: an ideal DCG of 0 (no graded item) gets
    ``zero_division``.  scikit-learn's ``ndcg_score`` = ``ideal=None``; trec_eval/ranx
    ``ndcg_cut`` = ``ideal=`` the qrels grades.  A list of a single item is its own ideal
    ranking: its nDCG is 1 when the item is graded (scikit-learn refuses one-item lists).

    Examples
    --------
    >>> grades = [0, 2, 1, 3, 0, 2, 0, 3, 1, 3]           # ranks 1..10
    >>> collection = [3] * 5 + [2] * 10                    # judged items with grade > 0
    >>> round(ndcg(grades, list(range(10, 0, -1)), k=10, ideal=collection), 2)
    0.49
    >>> round(ndcg([1, 0], [2, 1], ideal=[1, 1, 1]), 4)  # IDCG = 1 + 1/log2(3) + 1/log2(4)
    0.4693
    """
    t, s, single = _as_2d(y_true, y_score, graded=True)
    n = t.shape[1]
    # k=None with a collection ideal: the ideal ranking is the whole judged list, not cut at n.
    cut = None if ideal is not None and k is None else _k(k, n)
    k = min(_k(k, n), n)
    actual = np.atleast_1d(dcg(t, s, k=min(k, n), gain=gain, ties=ties))
    if ideal is None:
        best = _gain(-np.sort(-t, axis=1)[:, :k], gain)
        rows = None
    elif (grades := _rectangular(ideal)) is not None and grades.ndim == (1 if single else 2):
        grades = np.atleast_2d(grades)
        if grades.shape[0] != t.shape[0]:
            raise InputError(
                f"ideal has {grades.shape[0]} rows but there are {t.shape[0]} queries."
            )
        best = _gain(-np.sort(-grades, axis=1)[:, :cut], gain, "ideal")
        rows = None
    else:
        rows = _ideal_rows(ideal, single)
        if len(rows) != t.shape[0]:
            raise InputError(f"ideal has {len(rows)} rows but there are {t.shape[0]} queries.")
    for i, row in enumerate([grades] if rows is None and ideal is not None else rows or []):
        _check_ideal(row, i if rows is not None else None)
    if ideal is not None:
        _check_ideal_holds_the_list(t, [grades] if rows is None else rows, rows is None)
    if rows is not None:  # ragged lists of grades: one short sort per query
        width = max(len(r) if cut is None else min(cut, len(r)) for r in rows)
        best = np.zeros((t.shape[0], max(width, 1)))
        for i, row in enumerate(rows):
            top = np.sort(row)[::-1][:width]
            best[i, : top.size] = _gain(top, gain, f"ideal (row {i})")
    idcg = (best * _discounts(best.shape[1])).sum(1)
    return _out(_divide(actual, idcg, zero_division, "an ideal DCG of 0"), single)


def _check_ideal_holds_the_list(t: np.ndarray, ideal: list, rectangular: bool) -> None:
    """The retrieved grades must be a sub-multiset of the collection's (else nDCG can pass 1).

    Equivalent test: the i-th largest retrieved grade <= the i-th largest ideal grade, for all i.
    """
    listed = -np.sort(-t, axis=1)
    if rectangular:
        best = -np.sort(-np.atleast_2d(ideal[0]), axis=1)
        width = max(listed.shape[1], best.shape[1])
        lp = np.zeros((t.shape[0], width))
        bp = np.zeros((t.shape[0], width))
        lp[:, : listed.shape[1]] = listed
        bp[:, : best.shape[1]] = best
        bad_rows = np.flatnonzero((lp > bp).any(1))
        rows = [(int(i), lp[i], bp[i]) for i in bad_rows[:1]]
    else:
        rows = []
        for i, row in enumerate(ideal):
            best = np.sort(row)[::-1]
            width = max(listed.shape[1], best.size)
            lp, bp = np.zeros(width), np.zeros(width)
            lp[: listed.shape[1]], bp[: best.size] = listed[i], best
            if (lp > bp).any():
                rows = [(i, lp, bp)]
                break
    for i, lp, bp in rows:
        j = int(np.flatnonzero(lp > bp)[0])
        raise InputError(
            f"ideal (row {i}) does not hold the retrieved grades: sorted best first, position "
            f"{j + 1} of the list has grade {lp[j]:g} but ideal has {bp[j]:g}.  ideal must give "
            "the grades of every judged item in the collection, the retrieved ones included "
            "(else nDCG can exceed 1)."
        )


def _check_ideal(grades: np.ndarray, row: int | None) -> None:
    bad = ~(np.isfinite(grades) & (grades >= 0))
    if bad.any():
        where = f" (row {row})" if row is not None else ""
        first = tuple(np.argwhere(bad)[0].tolist())
        raise InputError(
            f"ideal{where} has {int(bad.sum())} grade(s) that are NaN, infinite or negative, "
            f"first at {first}; pass the collection's relevance grades (finite, >= 0)."
        )


def _rectangular(ideal: Any) -> np.ndarray | None:
    try:
        return np.asarray(ideal, dtype=np.float64)
    except (TypeError, ValueError):  # ragged (one list per query), or not numbers at all
        return None


def _ideal_rows(ideal: Any, single: bool) -> list[np.ndarray]:
    """``ideal`` as one 1-D float64 array of grades per query (ragged lists allowed)."""
    try:
        rows = (
            [_ideal_row(ideal, None)] if single else [_ideal_row(r, i) for i, r in enumerate(ideal)]
        )
    except TypeError:  # a single number for several queries is not iterable
        rows = [np.asarray(ideal)]
    if any(r.ndim != 1 for r in rows):
        raise InputError(
            "ideal must be one 1-D list of grades per query (ragged lists allowed); got "
            "a scalar or nested row."
        )
    return rows


def _ideal_row(row: Any, i: int | None) -> np.ndarray:
    try:
        return np.asarray(row, dtype=np.float64)
    except (TypeError, ValueError):
        where = f" (row {i})" if i is not None else ""
        raise InputError(
            f"ideal{where} must be a list of numeric grades (one list per query, ragged lists "
            f"allowed); got {row!r:.60}."
        ) from None


def precision_recall_curve(
    y_true: Any, y_score: Any, *, n_relevant: int | None = None, zero_division: Any = "warn"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Precision and recall at every distinct score threshold (one query).

    Returns ``precision, recall, thresholds`` ordered by decreasing threshold; a tie block is one
    threshold (as in scikit-learn, which orders them the other way and appends (1, 0)).  The
    points are those of :func:`embedeval.metrics.classification.pr_curve` (one computation); only
    the
    rule for a query with no relevant item differs: ``zero_division`` here, as for every
    per-query metric of this module.  At the
    threshold t, precision = hits(score >= t) / count(score >= t) (never 0/0: the highest
    threshold retrieves at least one item) and recall = hits / ``n_relevant``; with no relevant
    item recall follows ``zero_division``.

    Examples
    --------
    >>> p, r, th = precision_recall_curve([1, 0, 1], [0.9, 0.5, 0.5])
    >>> p.tolist(), r.tolist(), th.tolist()
    ([1.0, 0.6666666666666666], [0.5, 1.0], [0.9, 0.5])
    """
    t, s, single = _as_2d(y_true, y_score)
    if not single:
        raise InputError("precision_recall_curve takes one query (1-D arrays).")
    hits, misses, thresholds = threshold_counts(t[0] > 0, s[0])
    n_rel = _n_relevant(n_relevant, t)[0]
    prec = hits / (hits + misses)
    rec = divide(
        hits,
        np.full(hits.shape, n_rel),
        zero_division,
        "the query has no relevant item, so recall is undefined at its {n} threshold(s)",
    )
    return prec, rec, thresholds


def system_efficiency(
    y_true: Any = None, y_score: Any = None, *, precision: Any = None, recall: Any = None
) -> float:
    """E = 1 - d / √2, d = the smallest distance of the precision-recall curve to (1, 1).

    Pass a ranking (``y_true``, ``y_score``) or precision/recall arrays.  E = 1 for a perfect
    system, 0 when the best point is (0, 0).

    Ties: the PR points are read at the end of each tie block (one threshold per block, as
    :func:`precision_recall_curve`).  Zero division: with no relevant item recall is 0 (with a
    warning), see :func:`precision_recall_curve`.

    Examples
    --------
    >>> system_efficiency(precision=[1.0, 0.5], recall=[0.5, 1.0])
    0.6464466094067263
    """
    if precision is None or recall is None:
        if y_true is None or y_score is None:
            raise InputError("pass y_true and y_score, or precision and recall.")
        precision, recall, _ = precision_recall_curve(y_true, y_score)
    try:
        p = np.asarray(precision, dtype=np.float64)
        r = np.asarray(recall, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError("precision and recall must be arrays of numbers in [0, 1].") from None
    if p.shape != r.shape or p.size == 0:
        raise InputError("precision and recall must be non-empty arrays of the same shape.")
    bad = ~((p >= 0) & (p <= 1) & (r >= 0) & (r <= 1))  # also catches NaN
    if bad.any():
        i = int(np.flatnonzero(bad.ravel())[0])
        raise InputError(
            f"precision and recall must lie in [0, 1]; {int(bad.sum())} point(s) do not, first "
            f"at index {i} (precision {p.ravel()[i]}, recall {r.ravel()[i]})."
        )
    d = np.sqrt((1 - p) ** 2 + (1 - r) ** 2).min()
    return float(1 - d / math.sqrt(2))


def from_neighbors(
    distances: Any,
    indices: Any,
    query_labels: Any,
    reference_labels: Any,
    *,
    higher_is_better: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Turn a kNN result ``(D, I)`` into ``(y_true, y_score)`` for the ranking metrics.

    ``y_true[q, j]`` = 1 when neighbour j has the query's label; ``y_score`` is ``-D`` for
    distances (``higher_is_better=False``) or ``D`` for similarities.  faiss pads missing
    neighbours with index -1: those become non-relevant with the lowest score.

    Examples
    --------
    >>> y, s = from_neighbors([[0.1, 0.4]], [[2, 0]], [5], [5, 7, 5])
    >>> y.tolist(), s.tolist()
    ([[1.0, 1.0]], [[-0.1, -0.4]])
    """
    from ..utils.validation import as_labels

    d = np.asarray(distances)
    idx = np.asarray(indices)
    refuse_object_array(d, "distances", "pass faiss's D, a numeric array.", InputError)
    idx = as_int64(idx, "indices", "Pass faiss's I, reference rows (-1 for none).")
    if d.dtype.kind not in "fiu" or idx.dtype.kind not in "iu":
        raise InputError(
            f"distances must be numeric and indices integer (faiss's D, I); got dtypes {d.dtype} "
            f"and {idx.dtype}."
        )
    if d.shape != idx.shape or d.ndim != 2:
        raise InputError(
            f"distances and indices must be 2-D of one shape; got {d.shape}, {idx.shape}."
        )
    pad = idx < 0
    # Integer distances (binary indexes) become float64 scores: refuse any that merge, as the
    # metrics do for integer y_score.  The padding's distances are no real ones (0 is exact).
    refuse_merged_integers(np.where(pad, np.zeros((), d.dtype), d), "distances")
    d = d.astype(np.float64)
    if not np.isfinite(d[~pad]).all():
        first = tuple(np.argwhere(~np.isfinite(d) & ~pad)[0].tolist())
        raise InputError(
            f"distances has NaN or infinite values at real neighbours (first at {first}); "
            "repair the search result (faiss pads missing neighbours with index -1)."
        )
    ql = as_labels(query_labels, "query_labels")
    rl = as_labels(reference_labels, "reference_labels")
    if ql.shape[0] != d.shape[0]:
        raise InputError(
            f"query_labels has {ql.shape[0]} labels but there are {d.shape[0]} rows of neighbours."
        )
    if (idx >= rl.shape[0]).any():
        first = tuple(np.argwhere(idx >= rl.shape[0])[0].tolist())
        raise InputError(
            f"indices{list(first)} = {idx[first]} is out of range for {rl.shape[0]} "
            "reference_labels; pass the labels of the searched reference set."
        )
    y = (rl[np.where(pad, 0, idx)] == ql[:, None]) & ~pad
    score = d if higher_is_better else -d
    if pad.any():
        # Below every real score and distinct (no artificial tie block, no tie warning), and
        # finite even for a row with no real neighbour.
        real = score[~pad]
        floor = float(real.min()) if real.size else 0.0
        below = _scores_below(floor, d.shape[1], "distances")
        score = np.where(pad, below[None, :], score)
    return y.astype(np.float64), score


def _scores_below(floor: float, count: int, what: str) -> np.ndarray:
    """``count`` finite, strictly decreasing scores, all below ``floor``: padding that ranks last
    and creates no tie.

    Steps of ``1 + |floor|`` keep them distinct for huge scores; near the float64 limit (|floor|
    about 1e308) those steps overflow to -inf, which the metrics refuse, so the padding is then
    spread evenly between min(floor, 0) and the lowest float64.
    """
    step = 1.0 + abs(floor)
    with np.errstate(over="ignore"):
        below = floor - step * (1.0 + np.arange(count, dtype=np.float64))
    if np.isfinite(below).all():
        return below
    top = min(floor, 0.0)  # a positive floor leaves the whole negative range free
    fraction = np.arange(1, count + 1, dtype=np.float64) / count  # <= 1 first: no overflow
    below = top + (-np.finfo(np.float64).max - top) * fraction
    if not (below[0] < floor and (below[1:] < below[:-1]).all()):  # no np.diff: it overflows
        raise InputError(
            f"{what} holds {abs(floor)!r} (the score {floor!r}), too close to the float64 limit "
            f"to rank {count} padding item(s) below it; rescale (e.g. divide by 1e300)."
        )
    return below


class AlignedRuns(NamedTuple):
    """Judgements and a run aligned query by query (see :func:`align_by_id`)."""

    query_ids: list
    y_true: np.ndarray
    y_score: np.ndarray
    n_relevant: np.ndarray
    ideal: list


def _numbers(mapping: Any, what: str, qid: Any) -> tuple[list, np.ndarray]:
    if not isinstance(mapping, dict):
        raise InputError(
            f"{what}[{qid!r}] must be a dict of document id -> number; got "
            f"{type(mapping).__name__}."
        )
    try:
        values = np.fromiter((float(v) for v in mapping.values()), np.float64, len(mapping))
    except (TypeError, ValueError):
        raise InputError(f"{what}[{qid!r}] holds a value that is not a number.") from None
    return list(mapping), values


def _refuse_merged_scores(mapping: dict, docs: list, scores: np.ndarray, qid: Any) -> None:
    """Refuse two distinct scores of ``run[qid]`` that are one float64 (integers beyond 2**53).

    ``scores`` are ``mapping``'s values as float64; the run's own values (Python or NumPy ints,
    of any size) would otherwise become a silent tie, as :func:`refuse_merged_integers` refuses
    for ``y_score``.  Rounding to float64 keeps the order, so merged values sit side by side.
    """
    if not (np.abs(scores) >= 2.0**53).any():
        return  # below 2**53, float64 holds every integer exactly (2**53 + 1 rounds to 2**53)
    order = np.argsort(scores, kind="stable")
    values = list(mapping.values())
    for i, j in zip(order[:-1].tolist(), order[1:].tolist(), strict=True):
        a, b = (exact_number(values[n]) for n in (i, j))
        if scores[i] == scores[j] and a != b:  # Python compares int and float exactly
            raise InputError(
                f"run[{qid!r}] holds the distinct scores {a!r} (document {docs[i]!r}) and {b!r} "
                f"(document {docs[j]!r}), which are equal as float64 (integers beyond 2**53 "
                "lose precision), so they would tie; subtract an offset or pass their ranks."
            )


def align_by_id(qrels: Any, run: Any) -> AlignedRuns:
    """Align judgements and a run by query id (and document id), for the ranking metrics.

    ``qrels`` maps query id -> {document id: relevance grade >= 0} (the judged collection);
    ``run`` maps query id -> {document id: score, higher is better} (the retrieved list), the
    layout of ranx and trec_eval.  Queries are matched **by id**, never by position: a query id
    present on one side only is an error (an empty run ``{qid: {}}`` scores a query 0 on
    purpose).  Row i of the result is ``query_ids[i]`` (the order of ``qrels``); documents of the
    run missing from the qrels are non-relevant (grade 0); shorter runs are padded with
    non-relevant items scored below every retrieved one (distinct scores, so padding creates no
    ties and changes no metric: P@k still divides by k, as trec_eval does).

    Returns
    -------
    AlignedRuns
        ``query_ids``; ``y_true`` (grades, float64, n_queries x longest run: pass ``y_true > 0``
        to the binary metrics); ``y_score``; ``n_relevant`` (judged items with grade > 0 per
        query, for recall, AP and R-precision); ``ideal`` (the judged grades per query, for
        :func:`ndcg`).

    Examples
    --------
    >>> a = align_by_id({"q1": {"d1": 1, "d2": 1}, "q2": {"d3": 2}},
    ...                 {"q2": {"d3": 0.2, "d9": 0.9}, "q1": {"d2": 0.5}})
    >>> a.query_ids, a.y_true.tolist(), a.n_relevant.tolist()
    (['q1', 'q2'], [[1.0, 0.0], [2.0, 0.0]], [2.0, 1.0])
    >>> average_precision(a.y_true > 0, a.y_score, n_relevant=a.n_relevant).tolist()
    [0.5, 0.5]
    """
    for name, value in (("qrels", qrels), ("run", run)):
        if not isinstance(value, dict) or not value:
            raise InputError(
                f"{name} must be a non-empty dict of query id -> {{document id: number}}; got "
                f"{type(value).__name__}{' (empty)' if isinstance(value, dict) else ''}."
            )
    only_q = [q for q in qrels if q not in run]
    only_r = [q for q in run if q not in qrels]
    if only_q or only_r:
        raise InputError(
            f"qrels and run must hold the same query ids; {len(only_q)} only in qrels (e.g. "
            f"{only_q[:3]}), {len(only_r)} only in run (e.g. {only_r[:3]}). Drop the extra run "
            "queries, or give an unanswered query an empty run {qid: {}} to score it 0."
        )
    ids = list(qrels)
    rows = []
    for q in ids:
        docs, scores = _numbers(run[q], "run", q)
        _refuse_merged_scores(run[q], docs, scores, q)
        judged, grades = _numbers(qrels[q], "qrels", q)
        if not np.isfinite(scores).all():
            raise InputError(f"run[{q!r}] has a NaN or infinite score; repair or drop it.")
        if not (np.isfinite(grades) & (grades >= 0)).all():
            raise InputError(f"qrels[{q!r}] has a grade that is NaN, infinite or negative.")
        grade_of = dict(zip(judged, grades.tolist(), strict=True))
        rows.append((np.array([grade_of.get(d, 0.0) for d in docs]), scores, grades))
    width = max(r[1].size for r in rows)
    if width == 0:
        raise InputError("every run is empty; nothing was retrieved.")
    y_true = np.zeros((len(ids), width))
    y_score = np.empty((len(ids), width))
    for i, (rel, scores, _) in enumerate(rows):
        y_true[i, : rel.size] = rel
        y_score[i, : scores.size] = scores
        floor = float(scores.min()) if scores.size else 0.0
        y_score[i, scores.size :] = _scores_below(floor, width - scores.size, f"run[{ids[i]!r}]")
    n_relevant = np.array([float((g > 0).sum()) for _, _, g in rows])
    return AlignedRuns(ids, y_true, y_score, n_relevant, [g for _, _, g in rows])
