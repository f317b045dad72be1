"""Verification metrics of pair scores: ROC, TAR@FAR, EER, DET, k-fold accuracy, open-set search.

The functional core works on one score per pair and a genuine flag (True when both items of the
pair share an identity).  Scores are similarities (higher = more alike) unless
``higher_is_similar=False`` says they are distances.

Conventions
-----------
* **Accept rule**: a pair is accepted at threshold t when ``score >= t`` (similarities) or
  ``distance <= t`` (distances).  FAR(t) = accepted impostor pairs / impostor pairs, TAR(t) =
  accepted genuine pairs / genuine pairs (FMR and 1 - FNMR in ISO/IEC 19795 terms).
* **Thresholds** are the distinct observed scores, plus one above every score (nothing accepted),
  as in scikit-learn's ``roc_curve(drop_intermediate=False)``; equal scores are accepted or
  rejected together, so a tie between a genuine and an impostor pair is never split.
* **TAR at a target FAR** is the largest TAR over thresholds whose FAR does not exceed the target:
  scikit-learn's TPR at the largest FPR <= target.  With n impostor pairs the finest FAR step is
  1/n; a target below it can only be met with no impostor accepted (FAR = 0).  Such targets are
  flagged (``resolved=False``) and warned about instead of being interpolated.

The all-pairs variant (:func:`tar_at_far_all_pairs`) computes the same numbers over every pair of
a labelled set without materialising the n x n score matrix.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..metrics.curves import threshold_counts
from ..utils.errors import EmbedevalWarning, InputError, InputTypeError
from ..utils.validation import (
    as_embeddings,
    as_labels,
    as_vector,
    check_choice,
    check_int,
    check_same_dimension,
)

__all__ = [
    "DEFAULT_FARS",
    "OpenSetResult",
    "RocCurve",
    "TarAtFar",
    "det_curve",
    "eer",
    "fnmr_at_fmr",
    "kfold_accuracy",
    "open_set_identification",
    "pair_scores",
    "roc",
    "tar_at_far",
    "tar_at_far_all_pairs",
]

#: The FAR operating points reported by face-recognition benchmarks (IJB-C, NIST FRVT).
DEFAULT_FARS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)

_SCORE_DISTANCES = ("cosine", "inner_product", "euclidean")
#: pair_scores also gives squared Euclidean distances (scipy's name), the scores LFW scripts
#: threshold; the functions that score embeddings themselves refuse it (:func:`_search_distance`).
_PAIR_DISTANCES = (*_SCORE_DISTANCES, "sqeuclidean")


@dataclass(frozen=True)
class RocCurve:
    """Points of the ROC curve, one per threshold, from the strictest (nothing accepted) on.

    Attributes
    ----------
    far, tar : ndarray
        False and true accept rates at each threshold (non-decreasing).
    thresholds : ndarray
        Accept ``score >= t`` (or ``distance <= t`` for distances); the first is ``+inf``
        (``-inf`` for distances): nothing accepted.
    n_genuine, n_impostor : int
    """

    far: np.ndarray
    tar: np.ndarray
    thresholds: np.ndarray
    n_genuine: int
    n_impostor: int

    @property
    def fnmr(self) -> np.ndarray:
        """False non-match rate, 1 - TAR (the DET curve's y axis)."""
        return 1.0 - self.tar


@dataclass(frozen=True)
class TarAtFar:
    """TAR at each target FAR, with the threshold that achieves it.

    Attributes
    ----------
    far : ndarray
        The target FARs, as given.
    tar : ndarray
        Largest TAR over thresholds whose FAR <= target.
    threshold : ndarray
        The operating threshold (accept ``score >= threshold``, or ``distance <= threshold``);
        ``+inf`` (``-inf`` for distances) when only rejecting everything meets the target.
    far_achieved : ndarray
        The FAR at that threshold (<= target; lower when ties make the target unreachable).
    resolved : ndarray of bool
        False where the target is below 1 / n_impostor: the set has too few impostor pairs to
        measure that FAR, and the TAR shown is the one at FAR = 0.
    n_genuine, n_impostor : int
    """

    far: np.ndarray
    tar: np.ndarray
    threshold: np.ndarray
    far_achieved: np.ndarray
    resolved: np.ndarray
    n_genuine: int
    n_impostor: int
    settings: dict[str, Any] = field(default_factory=dict)

    def table(self) -> str:
        """Aligned text table: FAR, TAR, threshold, achieved FAR."""
        rows = [f"{'FAR':>8}  {'TAR':>7}  {'threshold':>11}  {'FAR achieved':>12}"]
        for f, t, th, fa, ok in zip(
            self.far, self.tar, self.threshold, self.far_achieved, self.resolved, strict=True
        ):
            note = "" if ok else "  (fewer impostor pairs than 1/FAR)"
            rows.append(f"{f:>8.0e}  {t:>7.4f}  {th:>11.5g}  {fa:>12.3e}{note}")
        return "\n".join(rows)

    def __repr__(self) -> str:
        return (
            f"TarAtFar({self.n_genuine} genuine, {self.n_impostor} impostor pairs)\n" + self.table()
        )


# ---------------------------------------------------------------------------- validation
def _scores_and_flags(
    scores: Any, genuine: Any, higher_is_similar: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Scores as float64 similarities (distances negated) and genuine flags as bool."""
    if not isinstance(higher_is_similar, (bool, np.bool_)):
        raise InputTypeError(
            f"higher_is_similar must be True (similarities) or False (distances); got "
            f"{higher_is_similar!r}."
        )
    s = as_vector(scores, "scores")
    g = np.asarray(genuine)
    if g.dtype.kind not in "bui" or g.ndim != 1:
        raise InputTypeError(
            f"genuine must be a 1-D array of booleans (True = same identity); got dtype "
            f"{g.dtype} and shape {g.shape}."
        )
    if g.shape[0] != s.shape[0]:
        raise InputError(
            f"genuine has {g.shape[0]} flags but scores has {s.shape[0]} values; pass one flag "
            "per pair."
        )
    if g.dtype.kind != "b" and not np.isin(g, (0, 1)).all():
        raise InputError("genuine must hold only True/False (or 1/0); found other integers.")
    g = g.astype(bool)
    n_gen = int(g.sum())
    if n_gen == 0 or n_gen == g.size:
        missing = "genuine" if n_gen == 0 else "impostor"
        raise InputError(
            f"genuine has no {missing} pair (all {g.size} flags are {n_gen > 0}); a ROC needs "
            "both genuine and impostor pairs."
        )
    return (s if higher_is_similar else -s), g


def _check_fars(far: Any) -> np.ndarray:
    f = as_vector(np.atleast_1d(np.asarray(far)), "far")
    if ((f <= 0) | (f > 1)).any():
        raise InputError(f"far must hold false accept rates in (0, 1]; got {f.tolist()}.")
    return f


# ---------------------------------------------------------------------------- pair scores
def roc(scores: Any, genuine: Any, *, higher_is_similar: bool = True) -> RocCurve:
    """ROC curve of pair scores: FAR and TAR at every distinct threshold.

    FAR(t) = #{impostor: score >= t} / #impostor, TAR(t) = #{genuine: score >= t} / #genuine,
    for t over the distinct scores in decreasing order, after a first point (+inf) where nothing
    is accepted.  Equal scores share one point (ties are never split).

    Examples
    --------
    >>> r = roc([0.9, 0.8, 0.8, 0.3], [True, True, False, False])
    >>> r.thresholds.tolist(), r.tar.tolist(), r.far.tolist()
    ([inf, 0.9, 0.8, 0.3], [0.0, 0.5, 1.0, 1.0], [0.0, 0.0, 0.5, 1.0])
    """
    s, g = _scores_and_flags(scores, genuine, higher_is_similar)
    tp, fp, at = threshold_counts(g, s)  # the counts of every ROC and PR curve
    n_gen, n_imp = int(tp[-1]), int(fp[-1])
    tar = np.concatenate(([0.0], tp / n_gen))
    far = np.concatenate(([0.0], fp / n_imp))
    thresholds = np.concatenate(([np.inf], at))
    if not higher_is_similar:
        thresholds = -thresholds
    return RocCurve(far, tar, thresholds, n_gen, n_imp)


def det_curve(
    scores: Any, genuine: Any, *, higher_is_similar: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """DET curve values: (FMR, FNMR, thresholds) at every threshold of :func:`roc`.

    FMR = FAR and FNMR = 1 - TAR.  Plot them on normal-deviate (probit) or log axes
    (:func:`embedeval.plots.plot_det`).

    Examples
    --------
    >>> fmr, fnmr, t = det_curve([0.9, 0.8, 0.8, 0.3], [True, True, False, False])
    >>> fmr.tolist(), fnmr.tolist()
    ([0.0, 0.0, 0.5, 1.0], [1.0, 0.5, 0.0, 0.0])
    """
    r = roc(scores, genuine, higher_is_similar=higher_is_similar)
    return r.far, r.fnmr, r.thresholds


def _max_accepted(fars: np.ndarray, n_impostor: int) -> np.ndarray:
    """Largest count c of accepted impostors with c / n_impostor <= far (as float64 compares)."""
    c = np.floor(fars * n_impostor).astype(np.int64)
    c = np.minimum(c, n_impostor)
    c -= (c / n_impostor > fars).astype(np.int64)
    step = (c + 1 <= n_impostor) & ((c + 1) / n_impostor <= fars)
    return c + step.astype(np.int64)


def _warn_unresolved(
    fars: np.ndarray, resolved: np.ndarray, n_impostor: int, name: str = "far"
) -> None:
    if not resolved.all():
        low = ", ".join(f"{f:g}" for f in fars[~resolved])
        what = "impostor pairs" if name == "far" else "non-mated searches"
        warnings.warn(
            f"{name}={low}: only {n_impostor} {what}, fewer than 1/{name.upper()}, so these "
            f"rates cannot be measured; the value reported there is the one at {name.upper()} "
            f"= 0 (nothing accepted), flagged resolved=False. Use more {what} for such low "
            "rates.",
            EmbedevalWarning,
            stacklevel=3,
        )


def tar_at_far(
    scores: Any,
    genuine: Any,
    far: Sequence[float] | float = DEFAULT_FARS,
    *,
    higher_is_similar: bool = True,
) -> TarAtFar:
    """TAR at each target FAR: the largest TAR over thresholds whose FAR <= target.

    With impostor scores sorted in decreasing order s_1 >= s_2 >= ..., a target f allows
    m = floor(f * n_impostor) accepted impostors; the best threshold accepts every score
    strictly above s_(m+1), so TAR = #{genuine > s_(m+1)} / n_genuine.  Impostors tied with
    s_(m+1) are rejected together with it (the FAR achieved can be below the target).

    Examples
    --------
    >>> r = tar_at_far([0.9, 0.7, 0.8, 0.6, 0.2], [True, True, False, False, False],
    ...                far=[0.34, 0.5])
    >>> r.tar.tolist(), r.threshold.tolist()  # 1 of 3 impostors may pass at FAR 0.34
    ([1.0, 1.0], [0.7, 0.7])
    """
    s, g = _scores_and_flags(scores, genuine, higher_is_similar)
    fars = _check_fars(far)
    points = _operating_points(s[g], s[~g], fars)
    settings = {"higher_is_similar": bool(higher_is_similar)}
    return _tar_result(fars, points, int(g.sum()), int((~g).sum()), settings)


def _tar_result(
    fars: np.ndarray,
    points: tuple[np.ndarray, np.ndarray, np.ndarray],
    n_gen: int,
    n_imp: int,
    settings: dict[str, Any],
) -> TarAtFar:
    """The result of a TAR@FAR read-off: flags (and warns about) targets below 1/n_impostor,
    and turns thresholds back into the caller's units (scores were negated for distances)."""
    tar, threshold, far_achieved = points
    resolved = fars * n_imp >= 1
    _warn_unresolved(fars, resolved, n_imp)
    return TarAtFar(
        far=fars,
        tar=tar,
        threshold=threshold if settings["higher_is_similar"] else -threshold,
        far_achieved=far_achieved,
        resolved=resolved,
        n_genuine=n_gen,
        n_impostor=n_imp,
        settings=settings,
    )


def _operating_points(
    gen: np.ndarray, imp: np.ndarray, fars: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TAR, threshold and FAR achieved at each target FAR (similarities; -inf = never accepted)."""
    imp = np.sort(imp)[::-1]
    gen = np.sort(gen)
    n_imp, n_gen = imp.size, gen.size
    m = _max_accepted(fars, n_imp)
    # The score just below the accepted region: the (m+1)-th largest impostor (none: -inf).
    cut = np.where(m < n_imp, imp[np.minimum(m, n_imp - 1)], -np.inf)
    tar = (n_gen - np.searchsorted(gen, cut, side="right")) / n_gen
    accepted_imp = np.searchsorted(-imp, -cut, side="left")  # impostors strictly above cut
    everything = np.sort(np.concatenate((gen, imp)))
    above = np.searchsorted(everything, cut, side="right")
    last = everything.size - 1
    threshold = np.where(above <= last, everything[np.minimum(above, last)], np.inf)
    return tar, threshold, accepted_imp / n_imp


def fnmr_at_fmr(
    scores: Any,
    genuine: Any,
    fmr: Sequence[float] | float = DEFAULT_FARS,
    *,
    higher_is_similar: bool = True,
) -> np.ndarray:
    """FNMR at each target FMR: ``1 - tar_at_far(...).tar`` (ISO/IEC 19795 vocabulary).

    Examples
    --------
    >>> fnmr_at_fmr([0.9, 0.7, 0.8, 0.6, 0.2], [True, True, False, False, False], 0.34).tolist()
    [0.0]
    """
    return 1.0 - tar_at_far(scores, genuine, fmr, higher_is_similar=higher_is_similar).tar


def eer(scores: Any, genuine: Any, *, higher_is_similar: bool = True) -> float:
    """Equal error rate: where FAR = FNMR on the ROC, linearly interpolated between its points.

    Along the ROC (thresholds decreasing), d = FAR - FNMR rises from -1 to 1.  At the first
    point i with d_i >= 0 the EER is FAR_i when d_i = 0, otherwise the FAR where the segment from
    point i-1 to point i crosses d = 0 (on that segment FAR and FNMR move linearly together).

    Examples
    --------
    >>> eer([0.9, 0.7, 0.8, 0.6], [True, True, False, False])  # FAR = FNMR = 0.5 at t = 0.7
    0.5
    >>> eer([0.9, 0.8, 0.3, 0.2], [True, True, False, False])
    0.0
    """
    r = roc(scores, genuine, higher_is_similar=higher_is_similar)
    d = r.far - r.fnmr
    i = int(np.argmax(d >= 0))
    if d[i] == 0:
        return float(r.far[i])
    alpha = -d[i - 1] / (d[i] - d[i - 1])
    return float(r.far[i - 1] + alpha * (r.far[i] - r.far[i - 1]))


def kfold_accuracy(
    scores: Any,
    genuine: Any,
    *,
    n_folds: int | None = None,
    folds: Any = None,
    thresholds: Any = None,
    higher_is_similar: bool = True,
) -> tuple[float, float, np.ndarray]:
    """Verification accuracy with a threshold chosen on the other folds (LFW's protocol).

    Pairs are split into ``n_folds`` (default 10) consecutive folds in the order given (LFW's
    ``pairs.txt`` holds 10 folds of 600 pairs in order), or by the fold id in ``folds`` (then
    without ``n_folds``, which would be ignored).  With n pairs the
    first ``n % n_folds`` folds hold one pair more than the others (``np.array_split``; the same
    folds as scikit-learn's ``KFold(n_folds, shuffle=False)``).  For each fold, the threshold
    that maximises accuracy on the other folds is chosen among the midpoints between
    consecutive distinct training scores (the higher of two adjacent floats, whose midpoint
    rounds to one of them; and one point above and one below all of them); ties
    in training accuracy (counted exactly) go to the strictest threshold, the one that accepts
    fewest pairs: the highest similarity, or for distances (``higher_is_similar=False``) the
    lowest distance.  Accuracy = (accepted genuine + rejected impostor) / pairs on the held-out
    fold.

    ``thresholds`` (in the scores' own units) restricts the choice to a grid, as published LFW
    scripts do: insightface and facenet scan ``np.arange(0, 4, 0.01)`` over the *squared*
    Euclidean distances of L2-normalised embeddings, ``sum((e1 - e2) ** 2)``, which lie in
    [0, 4] -- ``pair_scores(e1, e2, distance="sqeuclidean")`` with ``higher_is_similar=False``
    (the same grid on plain Euclidean distances, in [0, 2], is a different, coarser recipe).
    Among grid values with the best training accuracy the first in the order given is taken
    (for an ascending grid, the smallest).  Those scripts accept ``distance < t`` where
    embedeval accepts ``distance <= t``; the two differ only for a distance exactly on a grid
    value.

    Returns
    -------
    mean, std : float
        Mean and population standard deviation (``np.std``) of the fold accuracies.
    per_fold : ndarray
        The accuracy of each fold.

    Examples
    --------
    >>> s = [0.9, 0.2, 0.8, 0.3, 0.7, 0.4, 0.6, 0.1]
    >>> g = [True, False] * 4
    >>> kfold_accuracy(s, g, n_folds=2)[0]
    1.0
    """
    s, g = _scores_and_flags(scores, genuine, higher_is_similar)
    fold_ids = _fold_ids(s.size, n_folds, folds)
    grid = None
    if thresholds is not None:
        grid = as_vector(np.atleast_1d(np.asarray(thresholds)), "thresholds")
        grid = grid if higher_is_similar else -grid
    accs = []
    for f in np.unique(fold_ids):
        test = fold_ids == f
        if grid is None:
            t = _best_threshold(s[~test], g[~test])
        else:  # accuracy of every grid value at once: accepted = score >= t
            accepted = s[~test][None, :] >= grid[:, None]
            t = grid[int(np.argmax((accepted == g[~test][None, :]).sum(axis=1)))]
        accs.append(float(np.mean((s[test] >= t) == g[test])))
    per_fold = np.array(accs)
    return float(per_fold.mean()), float(per_fold.std()), per_fold


def _fold_ids(n: int, n_folds: int | None, folds: Any) -> np.ndarray:
    if folds is not None:
        if n_folds is not None:  # one of the two would be silently ignored
            raise InputError(
                f"n_folds={n_folds!r} and folds= were both given; folds decides the folds by "
                "itself: drop n_folds."
            )
        ids = as_labels(folds, "folds", length=n, length_of="scores")
        if np.unique(ids).size < 2:
            raise InputError("folds must hold at least two distinct fold ids.")
        return ids
    n_folds = check_int(10 if n_folds is None else n_folds, "n_folds", minimum=2)
    if n_folds > n:
        raise InputError(f"n_folds={n_folds} is larger than the number of pairs ({n}).")
    return np.repeat(np.arange(n_folds), [len(c) for c in np.array_split(np.arange(n), n_folds)])


def _best_threshold(s: np.ndarray, g: np.ndarray) -> float:
    """Threshold maximising accuracy of ``score >= t`` on (s, g); ties to the highest t."""
    # Training folds of one kind are valid (pairs stored genuine first, then impostors): every
    # pair right means accept all (the lowest candidate) or reject all (the highest).
    if g.all() or not g.any():
        return -np.inf if g.all() else np.inf
    r = roc(s, g)
    n_gen, n_imp = r.n_genuine, r.n_impostor
    # counted in integers: rates times counts in floats round tied accuracies apart
    accepted = np.rint(r.tar * n_gen).astype(np.int64)
    false_accepts = np.rint(r.far * n_imp).astype(np.int64)
    correct = accepted + (n_imp - false_accepts)
    i = int(np.argmax(correct))  # the first best: the strictest threshold
    t = r.thresholds
    if i == 0:
        return np.inf  # nothing accepted
    if i == t.size - 1:
        return -np.inf  # everything accepted
    return _between(float(t[i + 1]), float(t[i]))


def _between(lo: float, hi: float) -> float:
    """A threshold in (lo, hi]: accepts every score >= hi and rejects lo.

    The midpoint, halved before the sum so that scores near the float64 limit cannot overflow
    to inf; when hi and lo are adjacent floats the midpoint rounds to one of them, and hi is
    taken (rounding to lo would accept the scores the threshold is meant to reject).
    """
    mid = lo / 2 + hi / 2
    return mid if lo < mid else hi


# ---------------------------------------------------------------------------- from embeddings
def _search_distance(distance: Any) -> str:
    """``distance`` of the functions that score embeddings themselves (all pairs, open-set
    search): cosine, inner product or Euclidean; ``"sqeuclidean"`` is refused with the fix."""
    if distance == "sqeuclidean":
        raise InputError(
            "distance='sqeuclidean' is offered by pair_scores only; use distance='euclidean' "
            "here: squaring keeps the order of the distances, so the rates are the same, and "
            "the thresholds reported are Euclidean distances (square them for squared ones)."
        )
    return check_choice(distance, "distance", _SCORE_DISTANCES)


def _prepare(x: np.ndarray, distance: str, name: str) -> np.ndarray:
    """Cosine: the rows at unit norm, in their own precision (float32 for the products, float64
    for :func:`pair_scores`; :func:`embedeval.engine.exact.unit_rows`); other distances: the
    rows as given."""
    if distance != "cosine":
        return x
    norms = np.sqrt(np.einsum("ij,ij->i", x, x, dtype=np.float64))
    if (norms == 0).any():
        raise InputError(
            f"distance='cosine' needs non-zero vectors; {int((norms == 0).sum())} row(s) of "
            f"{name} are all zero. Drop them or use distance='euclidean'."
        )
    from ..engine.exact import unit_rows

    return unit_rows(x, norms)


def _block_scores(a: np.ndarray, b: np.ndarray, distance: str, b_sq: np.ndarray | None):
    """float32 similarity of every row of ``a`` with every row of ``b`` (negated Euclidean
    distance for ``"euclidean"``, so that higher is always more similar)."""
    prod = a @ b.T
    if distance != "euclidean":
        return prod
    a_sq = np.einsum("ij,ij->i", a, a)
    prod *= np.float32(-2.0)
    prod += a_sq[:, None]
    prod += b_sq[None, :]
    np.maximum(prod, 0, out=prod)
    np.sqrt(prod, out=prod)
    return np.negative(prod, out=prod)


def pair_scores(x1: Any, x2: Any, *, distance: str = "cosine") -> np.ndarray:
    """Score of each pair (x1[i], x2[i]): cosine similarity, inner product, Euclidean or squared
    Euclidean distance.

    Cosine and inner product are similarities (pass them to :func:`tar_at_far` and friends as
    they are); ``"euclidean"``, ||a - b||, and ``"sqeuclidean"``, ||a - b||^2 = sum_d (a_d -
    b_d)^2, are distances (pass ``higher_is_similar=False``).  Squaring keeps the order of the
    scores, so every rate is the same for both distances; only thresholds differ.  The squared
    distance is what LFW-style scripts threshold (insightface, facenet: ``np.arange(0, 4, 0.01)``
    over unit vectors, for which ||a - b||^2 = 2 - 2 cos(a, b) lies in [0, 4]; see
    :func:`kfold_accuracy`).  Computed in float64 from the float32 embeddings.

    Examples
    --------
    >>> pair_scores([[3.0, 4.0], [1.0, 0.0]], [[3.0, 4.0], [0.0, 2.0]], distance="euclidean")
    array([0.        , 2.23606798])
    >>> pair_scores([[3.0, 4.0], [1.0, 0.0]], [[3.0, 4.0], [0.0, 2.0]], distance="sqeuclidean")
    array([0., 5.])
    """
    distance = check_choice(distance, "distance", _PAIR_DISTANCES)
    a = as_embeddings(x1, "x1").astype(np.float64)
    b = as_embeddings(x2, "x2").astype(np.float64)
    if a.shape != b.shape:
        raise InputError(
            f"x1 has shape {a.shape} but x2 has {b.shape}; pass the two sides of each pair as "
            "arrays of the same shape (row i of x1 pairs with row i of x2)."
        )
    if distance in ("euclidean", "sqeuclidean"):
        squared = np.einsum("ij,ij->i", a - b, a - b)
        return np.sqrt(squared) if distance == "euclidean" else squared
    if distance == "cosine":
        a, b = _prepare(a, distance, "x1"), _prepare(b, distance, "x2")
    return np.einsum("ij,ij->i", a, b)


# ---------------------------------------------------------------------------- all pairs
def tar_at_far_all_pairs(
    x: Any,
    labels: Any,
    far: Sequence[float] | float = DEFAULT_FARS,
    *,
    distance: str = "cosine",
    block_size: int | None = None,
    memory_budget: int = 256 * 2**20,
    sample_size: int = 2_000_000,
    seed: int = 0,
    n_threads: int | None = None,
) -> TarAtFar:
    """TAR at each FAR over every pair {i, j}, i < j, of a labelled set, exact and streamed.

    The same numbers as :func:`tar_at_far` on the n(n-1)/2 float32 scores described below, of
    every pair (genuine when the labels agree), without the n x n matrix; against float64 pair
    scores (:func:`pair_scores`) two pairs closer than float32 resolves may order differently,
    and a cosine of near-parallel vectors may round to just above 1.  For a target f with
    m = floor(f * n_impostor) the answer depends only on the (m+1)-th largest impostor score: a
    random sample of impostor pairs brackets it, one blocked pass over all pairs counts the
    scores above the bracket and keeps those inside it, and the order statistic is read exactly
    from the kept scores.  Should
    the bracket miss (the sample is checked, not trusted), the pass is repeated with a wider one,
    so the result is exact whatever the sample.  Scores are float32 (cosine: products of the
    normalised vectors; Euclidean: the negated distance, thresholds reported as distances); a
    pair of identical vectors gets its exact score (distance 0, cosine 1, inner product
    ||x||^2) and the other pairs of a vector with a twin are scored in float64 then rounded, so
    duplicates tie as in exact arithmetic.

    Parameters
    ----------
    x : array-like, shape (n, dim)
    labels : array-like, shape (n,)
    far : float or sequence of float
    distance : {"cosine", "inner_product", "euclidean"}
    block_size : int, optional
        Rows per block; default from ``memory_budget`` (bytes for one block of scores).
    sample_size : int
        Random impostor pairs used to place the brackets (affects speed only, never the result).
    seed : int
    n_threads : int, optional
        Threads, each scoring its own block with single-threaded BLAS (default: the usable
        cores, at most 8); the result does not depend on it.

    Examples
    --------
    >>> x = [[1.0, 0.0], [1.0, 0.1], [0.0, 1.0], [0.1, 1.0]]
    >>> tar_at_far_all_pairs(x, [0, 0, 1, 1], far=[0.25]).tar.tolist()
    [1.0]
    """
    distance = _search_distance(distance)
    fars = _check_fars(far)
    block_size = check_int(block_size, "block_size", allow_none=True)
    memory_budget = check_int(memory_budget, "memory_budget", minimum=1 << 20)
    sample_size = check_int(sample_size, "sample_size")
    seed = check_int(seed, "seed", minimum=0)
    n_threads = check_int(n_threads, "n_threads", allow_none=True)
    xf = as_embeddings(x, "x")
    n = xf.shape[0]
    y = as_labels(labels, "labels", length=n, length_of="x")
    from ..utils.validation import factorize

    (codes,), _ = factorize(y)
    sizes = np.bincount(codes)
    n_gen = int((sizes * (sizes - 1) // 2).sum())
    n_imp = n * (n - 1) // 2 - n_gen
    if n_gen == 0 or n_imp == 0:
        missing = "genuine (two items with one label)" if n_gen == 0 else "impostor"
        raise InputError(f"labels give no {missing} pair; TAR@FAR needs both kinds of pairs.")
    xf = np.ascontiguousarray(_prepare(xf, distance, "x"), dtype=np.float32)
    sq = np.einsum("ij,ij->i", xf, xf) if distance == "euclidean" else None
    m = _max_accepted(fars, n_imp)
    if block_size is None:
        block_size = max(1, min(n, memory_budget // (16 * n)))
    sample = _impostor_sample(xf, codes, sq, distance, sample_size, seed)
    twins = _identical_pairs(xf, distance)
    margin, n_scans = 8.0, 0
    while True:
        n_scans += 1
        lo, hi = _brackets(m, n_imp, sample, margin)
        scan = _scan_pairs(xf, codes, sq, distance, lo, hi, block_size, n_threads, twins)
        out = _read_brackets(m, n_imp, n_gen, scan)
        if out is not None:
            break
        margin *= 4  # the sample misplaced a bracket: widen it and scan again
    higher = distance != "euclidean"
    settings = {"distance": distance, "higher_is_similar": higher, "n": n, "n_scans": n_scans}
    return _tar_result(fars, out, n_gen, n_imp, settings)


def _impostor_sample(xf, codes, sq, distance, size, seed) -> np.ndarray:
    """Scores of impostor pairs between random rows and random columns, decreasing.

    A grid of up to 2,048 random rows against enough random columns is one BLAS product, much
    cheaper than gathering ``size`` independent pairs; the brackets it places are verified.
    """
    rng = np.random.default_rng(seed)
    n = xf.shape[0]
    rows = np.sort(rng.choice(n, min(n, 2048), replace=False))
    cols = np.sort(rng.choice(n, min(n, -(-size // rows.size)), replace=False))
    s = _block_scores(xf[rows], xf[cols], distance, None if sq is None else sq[cols])
    impostor = codes[rows][:, None] != codes[cols][None, :]  # also drops i == j
    return np.sort(s[impostor])[::-1]


def _brackets(m, n_imp, sample, margin) -> tuple[np.ndarray, np.ndarray]:
    """Per target, [lo, hi] meant to hold the (m+1)-th largest impostor score."""
    s = sample.size
    if s == 0:
        return np.full(m.size, -np.inf), np.full(m.size, np.inf)
    p = np.minimum((m + 1) / n_imp, 1.0)
    sd = np.sqrt(p * (1 - p) / s)
    p_hi = p - margin * sd - margin / s
    p_lo = p + margin * sd + 2 * margin / s
    at_hi = np.clip(np.floor(p_hi * s), 0, s - 1).astype(np.int64)
    at_lo = np.clip(np.ceil(p_lo * s), 0, s - 1).astype(np.int64)
    hi = np.where(p_hi > 0, sample[at_hi], np.inf)
    lo = np.where(p_lo < 1, sample[at_lo], -np.inf)
    lo = np.where(m >= n_imp, -np.inf, lo)  # FAR = 1: every pair is accepted
    return lo.astype(np.float32), hi.astype(np.float32)


def _genuine_pairs(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Class members in class order, and each class's start, for listing genuine pairs."""
    order = np.argsort(codes, kind="stable")
    sizes = np.bincount(codes)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    return order, starts, sizes


def _block_genuine(rows: np.ndarray, codes, members) -> tuple[np.ndarray, np.ndarray]:
    """Genuine pairs (i, j), i in ``rows``, j > i."""
    order, starts, sizes = members
    per_row = sizes[codes[rows]]
    rep = np.repeat(rows, per_row)
    first = np.repeat(np.cumsum(per_row) - per_row, per_row)
    cols = order[starts[codes[rep]] + np.arange(rep.size) - first]
    later = cols > rep
    return rep[later], cols[later]


def _identical_pairs(xf: np.ndarray, distance: str) -> tuple | None:
    """Groups of identical rows (as scored, after normalisation) and each row's score with
    itself, or None without duplicates.

    A float32 product scores two identical vectors a few units in the last place (Euclidean: up
    to ~1e-2 after the square root) away from their exact score, differently for each pair, so
    a tied block of twin pairs would be split; :func:`_scan_pairs` writes the exact score
    (distance 0, cosine 1, inner product ||x||^2) over them.  Pairs with one twin, (a, c) and
    (b, c) with a = b, sit at different places of the product and can round apart too; they
    are rescored in float64 (:func:`_twin_scores`), which rounds them to the same float32.
    """
    from ..engine.duplicates import find_duplicate_rows

    dup = find_duplicate_rows(xf)
    if dup is None:
        return None
    group = np.arange(xf.shape[0])  # a row without a twin is its own group
    group[dup.members] = dup.first[dup.group]
    if distance == "inner_product":
        own = np.einsum("ij,ij->i", xf, xf, dtype=np.float64).astype(np.float32)
    else:  # negated Euclidean distance 0, or the cosine of a unit vector with itself
        own = np.full(xf.shape[0], 0.0 if distance == "euclidean" else 1.0, np.float32)
    has_twin = np.zeros(xf.shape[0], bool)
    has_twin[dup.members] = True
    return group, _genuine_pairs(group), own, has_twin


def _twin_scores(s: np.ndarray, xf: np.ndarray, a: int, distance: str, has_twin: np.ndarray):
    """Rescore in float64 the rows and columns of block ``s`` (rows a.., columns a..) that
    belong to vectors with a twin, then round to float32."""

    def scores64(p: np.ndarray, q: np.ndarray) -> np.ndarray:
        p, q = p.astype(np.float64), q.astype(np.float64)
        q_sq = np.einsum("ij,ij->i", q, q) if distance == "euclidean" else None
        return _block_scores(p, q, distance, q_sq).astype(np.float32)

    rows = np.flatnonzero(has_twin[a : a + s.shape[0]])
    cols = np.flatnonzero(has_twin[a:])
    if rows.size:
        s[rows] = scores64(xf[a + rows], xf[a:])
    if cols.size:
        s[:, cols] = scores64(xf[a : a + s.shape[0]], xf[a + cols])


def _scan_pairs(
    xf, codes, sq, distance, lo, hi, block_size, n_threads, twins=None
) -> dict[str, Any]:
    """One pass over the pairs i < j.  Per target f and per kind (impostor, genuine): the count
    of scores above ``hi[f]`` and the scores in ``[lo[f], hi[f]]``.  ``twins``
    (:func:`_identical_pairs`) gives pairs of identical rows their exact score."""
    from ..engine.threads import in_order, single_threaded_blas

    n, t = xf.shape[0], lo.size
    floor = np.float32(lo.min()) if lo.min() > -np.inf else np.finfo(np.float32).min
    members = _genuine_pairs(codes)

    by_floor = np.argsort(lo, kind="stable")  # lowest bracket first: each set nests in the last

    def tally(vals: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        above_n, inside = np.zeros(t, np.int64), [np.zeros(0, np.float32)] * t
        for f in by_floor:
            vals = vals[vals >= lo[f]]  # only shrinks: the next target's floor is higher
            above = vals > hi[f]
            above_n[f] = np.count_nonzero(above)
            inside[f] = vals[~above]
        return above_n, inside

    def one_block(a: int) -> tuple[tuple, tuple]:
        b = min(a + block_size, n)
        s = _block_scores(xf[a:b], xf[a:], distance, None if sq is None else sq[a:])
        if twins is not None:
            _twin_scores(s, xf, a, distance, twins[3])
        r, c = np.tril_indices(b - a)  # pairs j <= i of the block's leading square
        s[r, c] = -np.inf
        if twins is not None:
            tr, tc = _block_genuine(np.arange(a, b), twins[0], twins[1])
            s[tr - a, tc - a] = twins[2][tr]
        gr, gc = _block_genuine(np.arange(a, b), codes, members)
        gen = s[gr - a, gc - a]
        s[gr - a, gc - a] = -np.inf
        return tally(s[s >= floor]), tally(gen)

    out: dict[str, Any] = {
        kind: {"above_n": np.zeros(t, np.int64), "inside": []} for kind in ("imp", "gen")
    }
    with single_threaded_blas():
        for _, results in in_order(one_block, range(0, n - 1, block_size), n_threads):
            for kind, (above_n, inside) in zip(("imp", "gen"), results, strict=True):
                out[kind]["above_n"] += above_n
                out[kind]["inside"].append(inside)
    for kind in out:
        parts = out[kind]["inside"]
        out[kind]["inside"] = [np.concatenate([p[f] for p in parts]) for f in range(t)]
    return out


def _read_brackets(m, n_imp, n_gen, scan):
    """Exact TAR, threshold and FAR achieved per target, or None when a bracket missed."""
    t = m.size
    tar, threshold, far_achieved = np.empty(t), np.empty(t), np.empty(t)
    imp_s, gen_s = scan["imp"], scan["gen"]
    for f in range(t):
        imp = np.sort(imp_s["inside"][f])[::-1]
        gen = gen_s["inside"][f]
        imp_above = int(imp_s["above_n"][f])
        k = int(m[f]) - imp_above  # 0-based rank of the cut inside the bracket
        if m[f] >= n_imp:
            cut = -np.inf
        elif 0 <= k < imp.size:
            cut = imp[k]
        else:
            return None
        tar[f] = (int(gen_s["above_n"][f]) + np.count_nonzero(gen > cut)) / n_gen
        far_achieved[f] = (imp_above + np.count_nonzero(imp > cut)) / n_imp
        # The threshold is the smallest score above the cut.  When none is in the bracket it lies
        # above it (unseen): widen the bracket, unless nothing at all lies above it.
        above_cut = min(
            np.min(imp, where=imp > cut, initial=np.inf),
            np.min(gen, where=gen > cut, initial=np.inf),
        )
        if above_cut == np.inf and imp_above + int(gen_s["above_n"][f]) > 0:
            return None
        threshold[f] = above_cut
    return tar, threshold, far_achieved


# ---------------------------------------------------------------------------- open-set search
@dataclass(frozen=True)
class OpenSetResult:
    """Open-set identification: detection and identification rate at false-alarm rates.

    Attributes
    ----------
    fpir : ndarray
        Target false positive identification rates.
    dir : ndarray
        Detection and identification rate (TPIR = 1 - FNIR) at each FPIR: the fraction of mated
        searches whose mate is within the first ``rank`` candidates with a score >= threshold.
    threshold : ndarray
        The threshold at each FPIR (accept ``score >= threshold``; distances: ``<=``).
    resolved : ndarray of bool
        False where FPIR < 1 / n_nonmated (reported at FPIR = 0, as in :class:`TarAtFar`).
    rank1 : float
        Closed-set rank-1 identification rate of the mated searches (no threshold).
    n_mated, n_nonmated : int
    """

    fpir: np.ndarray
    dir: np.ndarray
    threshold: np.ndarray
    resolved: np.ndarray
    rank1: float
    n_mated: int
    n_nonmated: int


def open_set_identification(
    query: Any,
    query_labels: Any,
    gallery: Any,
    gallery_labels: Any,
    fpir: Sequence[float] | float = (1e-3, 1e-2, 1e-1),
    *,
    rank: int = 1,
    distance: str = "cosine",
    block_size: int = 1024,
) -> OpenSetResult:
    """DIR (TPIR) at FPIR for searches of a gallery, some by identities it does not hold.

    A search is *mated* when its identity is in the gallery, *non-mated* otherwise.  For a
    threshold t, FPIR(t) = non-mated searches whose best gallery score is >= t / non-mated
    searches; DIR(t) = mated searches whose mate (the best-scoring gallery item of its identity)
    ranks within ``rank`` and scores >= t / mated searches.  Scores are float64 products of the
    float32 inputs (as :func:`pair_scores`), and ranks follow embedeval's tie rule: equal
    scores are ordered by ascending gallery index (identical gallery rows tie exactly).  The
    threshold at each FPIR is chosen as in :func:`tar_at_far` (non-mated best scores play the
    impostors, mated hit scores the genuine pairs; a mate beyond ``rank`` never counts).  The
    threshold compares scores of different searches, which no tie rule orders: with cosine,
    each vector is normalised in its own rounding, so two searches whose cosines are equal in
    exact arithmetic (a query and its multiple, say) can fall on either side of a threshold
    that lies between their last bits.

    Examples
    --------
    >>> g = [[1.0, 0.0], [0.0, 1.0]]
    >>> q = [[1.0, 0.1], [0.1, 1.0], [1.0, 1.0], [-1.0, -1.0]]  # y, z are not enrolled
    >>> r = open_set_identification(q, ["a", "b", "y", "z"], g, ["a", "b"], fpir=[0.5])
    >>> r.rank1, r.dir.tolist(), r.n_nonmated
    (1.0, [1.0], 2)
    """
    distance = _search_distance(distance)
    rank = check_int(rank, "rank")
    block_size = check_int(block_size, "block_size")
    xq = as_embeddings(query, "query")
    xg = as_embeddings(gallery, "gallery")
    check_same_dimension(xq, xg, "gallery")
    yq = as_labels(query_labels, "query_labels", length=xq.shape[0], length_of="query")
    yg = as_labels(gallery_labels, "gallery_labels", length=xg.shape[0], length_of="gallery")
    from ..utils.validation import factorize

    (cq, cg), _ = factorize(yq, yg)
    mated = np.isin(cq, cg)
    if mated.all() or not mated.any():
        kind = "non-mated" if mated.all() else "mated"
        raise InputError(
            f"query_labels give no {kind} search; open-set identification needs queries whose "
            "identity is in the gallery and queries whose identity is not."
        )
    best, mate_score, mate_rank = _search_scores(xq, xg, cq, cg, distance, block_size)
    hit = mated & (mate_rank <= rank)
    fpir = _check_fars(fpir)
    n_nonmated = int((~mated).sum())
    dir_, threshold, _ = _operating_points(
        np.where(hit, mate_score, -np.inf)[mated], best[~mated], fpir
    )
    resolved = fpir * n_nonmated >= 1
    _warn_unresolved(fpir, resolved, n_nonmated, "fpir")
    higher = distance != "euclidean"
    return OpenSetResult(
        fpir=fpir,
        dir=dir_,
        threshold=threshold if higher else -threshold,
        resolved=resolved,
        rank1=float((mate_rank[mated] == 1).mean()),
        n_mated=int(mated.sum()),
        n_nonmated=n_nonmated,
    )


def _search_scores(xq, xg, cq, cg, distance, block_size):
    """Per query: best gallery score, best mate score and the mate's 1-based rank.

    Scores are float64 products of the float32 inputs, so that ranks are decided as embedeval
    ranks everywhere (float64, equal scores by gallery index): a float32 product would tie a
    mate with a non-mate whose scores differ below float32 resolution and rank them by index.
    """

    def prepare(x: np.ndarray, name: str) -> np.ndarray:
        return _prepare(np.asarray(x, dtype=np.float64), distance, name)

    from ..engine.duplicates import find_duplicate_rows

    # Identical gallery rows (as scored) must tie, then rank by index; a product can score them
    # a unit in the last place apart, so every member takes its group's first member's score.
    dup = find_duplicate_rows(xg, lambda rows: prepare(rows, "gallery"))
    xq, xg = prepare(xq, "query"), prepare(xg, "gallery")
    sq = np.einsum("ij,ij->i", xg, xg) if distance == "euclidean" else None
    n = xq.shape[0]
    best, mate_score = np.empty(n), np.full(n, -np.inf)
    mate_rank = np.full(n, np.iinfo(np.int64).max)
    cols = np.arange(xg.shape[0])
    for a in range(0, n, block_size):
        s = _block_scores(xq[a : a + block_size], xg, distance, sq)
        if dup is not None:
            s[:, dup.members] = s[:, dup.first[dup.group]]
        best[a : a + block_size] = s.max(axis=1)
        same = cg[None, :] == cq[a : a + block_size, None]
        masked = np.where(same, s, -np.inf)
        j = masked.argmax(axis=1)  # first index among the best mates
        rows = np.flatnonzero(same.any(axis=1))
        v = masked[rows, j[rows]]
        before = (s[rows] > v[:, None]) | ((s[rows] == v[:, None]) & (cols < j[rows, None]))
        mate_score[a + rows] = v
        mate_rank[a + rows] = before.sum(axis=1) + 1
    return best, mate_score, mate_rank
