"""Confusion-matrix metrics, ROC and PR curves, AUROC and AP, and threshold selection.

Orientation: ``confusion_matrix(y_true, y_pred)[i, j]`` counts items of actual class i predicted
as class j — rows are the truth, columns the prediction (scikit-learn's convention).  Per-class
rates are one-vs-rest: for class c, positives are the items of class c.

Zero division (a class never predicted, never present) follows ``zero_division``: ``"warn"``
(0.0 and an :class:`~embedeval.EmbedevalWarning`) or a number returned silently.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from ..utils.errors import EmbedevalWarning, InputError
from ..utils.validation import (
    as_labels,
    as_vector,
    check_choice,
    check_int,
    check_positive,
    check_same_label_kind,
    divide,
    factorize,
)
from .curves import auroc, refuse_merged_integers, threshold_counts, warn_single_class
from .ranking import average_precision as ranking_ap

__all__ = [
    "average_precision",
    "confusion_matrix",
    "pr_curve",
    "rates",
    "roc_auc",
    "roc_curve",
    "select_threshold",
    "top_k_accuracy",
]


def confusion_matrix(y_true: Any, y_pred: Any, *, labels: Any = None) -> np.ndarray:
    """Counts C[i, j] of items with actual class labels[i] predicted as labels[j].

    ``labels`` fixes the order (default: the sorted union of both inputs, however they are
    stored; labels that do not sort among themselves in order of first appearance).  Text
    beside numbers (``y_true`` of ints, ``y_pred`` of strings) is an error: 1 and "1" never
    share a class, as scikit-learn refuses the mix.

    Examples
    --------
    >>> confusion_matrix([0, 0, 1, 1], [0, 1, 1, 1]).tolist()
    [[1, 1], [0, 2]]
    """
    return _confusion(y_true, y_pred, labels)[0]


def _confusion(y_true: Any, y_pred: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """The confusion matrix and the class labels of its rows, in order."""
    t = as_labels(y_true, "y_true")
    p = as_labels(y_pred, "y_pred", length=t.size, length_of="y_true")
    check_same_label_kind(t, "y_true", p, "y_pred")
    if labels is None:
        (ct, cp), uniques = factorize(t, p)
        ct, cp, uniques = _sorted_classes(ct, cp, uniques)
    else:
        lab = as_labels(labels, "labels")
        (cl, ct, cp), uniques = factorize(lab, t, p)
        if len(set(cl.tolist())) != cl.size:
            raise InputError("labels has repeated values.")
        missing = np.setdiff1d(np.concatenate([ct, cp]), cl)
        if missing.size:
            raise InputError(
                f"y_true/y_pred hold {missing.size} class(es) not in labels, e.g. "
                f"{uniques[missing[0]]!r}; add them to labels."
            )
        remap = np.full(uniques.size, -1)
        remap[cl] = np.arange(cl.size)
        ct, cp = remap[ct], remap[cp]
        uniques = lab
    n = len(uniques)
    return np.bincount(ct * n + cp, minlength=n * n).reshape(n, n), np.asarray(uniques)


def _sorted_classes(
    ct: np.ndarray, cp: np.ndarray, uniques: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes and classes in sorted class order.

    :func:`factorize` numbers Python-object labels (a pandas column of strings, tuples) by
    first appearance; the rows of the matrix and the per-class rates must not depend on how the
    same labels are stored.  Labels that do not sort among themselves keep that order.
    """
    if uniques.dtype != object:
        return ct, cp, uniques  # numpy's unique: already sorted
    try:
        order = np.array(sorted(range(uniques.size), key=uniques.__getitem__), dtype=np.int64)
    except TypeError:
        return ct, cp, uniques
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[ct], rank[cp], uniques[order]


def _safe_div(num: Any, den: Any, zero_division: Any, what: str) -> np.ndarray:
    return divide(num, den, zero_division, what + " is undefined for {n} class(es)")


def rates(
    y_true: Any,
    y_pred: Any,
    *,
    labels: Any = None,
    average: str | None = None,
    beta: float = 1.0,
    zero_division: Any = "warn",
    pos_label: Any = 1,
) -> dict[str, Any]:
    """Every confusion-matrix rate, per class (one-vs-rest) or averaged.

    Keys: ``tp, fp, fn, tn, support`` (counts) and ``tpr`` (= ``recall`` = ``sensitivity``),
    ``tnr`` (= ``specificity``), ``ppv`` (= ``precision``), ``npv``, ``fpr`` (= ``fallout``),
    ``fnr``, ``fdr``, ``for``, ``prevalence``, ``f1``, ``f_beta``, ``class_accuracy`` (the
    one-vs-rest accuracy (TP + TN) / n of each class), plus the overall ``accuracy`` and
    ``error_rate``.

    ``average=None``: arrays in ``labels`` order; ``"macro"``: unweighted mean over classes;
    ``"weighted"``: weighted by support; ``"micro"``: rates of the pooled counts (for
    single-label multi-class, micro precision = recall = F1 = accuracy); ``"binary"``: scalars
    for the class ``pos_label`` only (at most two classes, as scikit-learn's
    ``average="binary"``; ``pos_label`` is ignored otherwise).

    Formulas from the one-vs-rest counts: TPR = TP/(TP+FN), TNR = TN/(TN+FP),
    PPV = TP/(TP+FP), NPV = TN/(TN+FN), FPR = FP/(FP+TN), FNR = FN/(TP+FN), FDR = FP/(TP+FP),
    FOR = FN/(FN+TN), prevalence = (TP+FN)/n, F_β = (1+β²)TP/((1+β²)TP + β²FN + FP) (the true β),
    accuracy = trace/n.  Ties: none (hard predictions).  Zero division: a rate whose denominator
    is 0 (a class never predicted, never present, or present everywhere) gets ``zero_division``
    (``"warn"``: 0.0 and a warning naming the rate and the count), as scikit-learn's
    ``zero_division``; averages are taken over those filled values.

    Examples
    --------
    >>> r = rates([1, 1, 0, 0], [1, 0, 0, 0], labels=[0, 1])
    >>> r["recall"].tolist(), r["precision"].tolist(), r["accuracy"]
    ([1.0, 0.5], [0.6666666666666666, 1.0], 0.75)
    >>> b = rates([1, 1, 0, 0], [1, 0, 0, 0], average="binary", pos_label=1)
    >>> b["recall"], b["precision"], b["tp"]
    (0.5, 1.0, 1.0)
    """
    beta = check_positive(beta, "beta")
    if average is not None:
        average = check_choice(average, "average", ("micro", "macro", "weighted", "binary"))
    cm, classes = _confusion(y_true, y_pred, labels)
    tp, fp, fn, tn = _one_vs_rest_counts(cm, classes, average, pos_label)
    out: dict[str, Any] = {"tp": tp, "fp": fp, "fn": fn, "tn": tn, "support": tp + fn}
    for key, (num, den, what) in _rate_table(tp, fp, fn, tn, beta).items():
        if what is None:
            out[key] = num / np.maximum(den, 1)
        else:
            out[key] = _safe_div(num, den, zero_division, what)
    if average in ("macro", "weighted"):
        weights = None if average == "macro" else out["support"]
        for key in _AVERAGED:
            out[key] = float(np.average(out[key], weights=weights))
    elif average in ("micro", "binary"):
        for key in list(out):
            out[key] = float(out[key][0])
    out["recall"] = out["sensitivity"] = out["tpr"]
    out["specificity"] = out["tnr"]
    out["precision"] = out["ppv"]
    out["fallout"] = out["fpr"]
    total = cm.sum()
    out["accuracy"] = float(np.trace(cm) / total) if total else float("nan")
    out["error_rate"] = 1 - out["accuracy"]
    return out


_AVERAGED = (
    "tpr",
    "tnr",
    "ppv",
    "npv",
    "fpr",
    "fnr",
    "fdr",
    "for",
    "prevalence",
    "f1",
    "f_beta",
    "class_accuracy",
)


def _one_vs_rest_counts(
    cm: np.ndarray, classes: np.ndarray, average: str | None, pos_label: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(TP, FP, FN, TN) per class, of ``pos_label`` only (binary) or pooled (micro)."""
    total = cm.sum()
    tp = np.diag(cm).astype(np.float64)
    fp = cm.sum(0) - tp
    fn = cm.sum(1) - tp
    tn = total - tp - fp - fn
    if average == "binary":
        keep = _positive_index(classes, pos_label)
        if keep is None:  # a single class, not pos_label: the positive class never occurs
            tp, fp, fn, tn = (np.array([x], dtype=np.float64) for x in (0, 0, 0, total))
        else:
            tp, fp, fn, tn = (v[keep : keep + 1] for v in (tp, fp, fn, tn))
    if average == "micro":
        tp, fp, fn, tn = (np.array([v.sum()]) for v in (tp, fp, fn, tn))
    return tp, fp, fn, tn


def _rate_table(
    tp: np.ndarray, fp: np.ndarray, fn: np.ndarray, tn: np.ndarray, beta: float
) -> dict[str, tuple[np.ndarray, np.ndarray, str | None]]:
    """Every rate as (numerator, denominator, name), in the key order of :func:`rates`.

    The formulas of :func:`rates`; a rate named None has a denominator that is 0 only for an
    empty input (prevalence, class accuracy).  The divisions are left to the caller so that a
    zero-division warning points at the user's call of :func:`rates`.
    """
    b2 = beta * beta
    return {
        "tpr": (tp, tp + fn, "recall"),
        "tnr": (tn, tn + fp, "specificity"),
        "ppv": (tp, tp + fp, "precision"),
        "npv": (tn, tn + fn, "NPV"),
        # = (TP + FN) / n per class; with micro's pooled counts it is 1 / n_classes
        "prevalence": (tp + fn, tp + fn + fp + tn, None),
        "f1": (2 * tp, 2 * tp + fn + fp, "F1"),
        "f_beta": ((1 + b2) * tp, (1 + b2) * tp + b2 * fn + fp, "F-beta"),
        "fpr": (fp, fp + tn, "fall-out"),
        "fnr": (fn, tp + fn, "FNR"),
        "fdr": (fp, tp + fp, "FDR"),
        "for": (fn, fn + tn, "FOR"),
        # per class, tp + fp + fn + tn = n; pooled (micro) counts sum to n x n_classes
        "class_accuracy": (tp + tn, tp + fp + fn + tn, None),
    }


def _positive_index(classes: np.ndarray, pos_label: Any) -> int | None:
    """Row of ``pos_label`` in a binary confusion matrix (None: one class only, not it)."""
    if len(classes) > 2:
        raise InputError(
            f"average='binary' needs at most two classes; got {len(classes)} "
            f"({', '.join(map(repr, classes.tolist()[:5]))}). Use average='macro', 'micro' or "
            "'weighted' for multi-class data."
        )
    hits = [i for i, c in enumerate(classes.tolist()) if c == pos_label]
    if not hits and len(classes) < 2:
        return None  # as scikit-learn: all-negative data is valid binary data
    if not hits:
        raise InputError(
            f"pos_label={pos_label!r} is not one of the classes "
            f"({', '.join(map(repr, classes.tolist()))}); pass the positive class."
        )
    return hits[0]


def _binary(y_true: Any, y_score: Any) -> tuple[np.ndarray, np.ndarray]:
    t = as_vector(y_true, "y_true")
    refuse_merged_integers(y_score, "y_score")
    s = as_vector(y_score, "y_score", length=t.size, length_of="y_true")
    if not np.isin(t, (0, 1)).all():
        raise InputError("y_true must be binary 0/1 for curves; one-vs-rest a class first.")
    return t, s


def roc_curve(y_true: Any, y_score: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ROC curve: (fpr, tpr, thresholds), one point per distinct score plus the origin.

    Predict positive when score >= threshold; the first threshold is +inf (nothing positive).
    TPR(t) = TP(t) / P and FPR(t) = FP(t) / N.  Unlike scikit-learn's default, collinear
    points are kept (its ``drop_intermediate=False``).

    Ties: a block of equal scores crosses the threshold together, so it is one point (a
    diagonal segment, which is what makes AUC count ties half).  Single-class input: the rate
    of the missing class (FPR without negatives, TPR without positives) is undefined, so it is
    NaN with an :class:`~embedeval.EmbedevalWarning` (scikit-learn also returns NaN there).

    Examples
    --------
    >>> fpr, tpr, th = roc_curve([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
    >>> fpr.tolist(), tpr.tolist()
    ([0.0, 0.0, 0.5, 0.5, 1.0], [0.0, 0.5, 0.5, 1.0, 1.0])
    """
    t, s = _binary(y_true, y_score)
    tps, fps, th = threshold_counts(t, s)
    p, n = t.sum(), t.size - t.sum()
    if p == 0 or n == 0:
        warn_single_class("roc_curve", int(p), int(n), "classes in y_true")
    fpr = fps / n if n else np.full(fps.shape, np.nan)
    tpr = tps / p if p else np.full(tps.shape, np.nan)
    return (
        np.concatenate([[0.0 if n else np.nan], fpr]),
        np.concatenate([[0.0 if p else np.nan], tpr]),
        np.concatenate([[np.inf], th]),
    )


def roc_auc(y_true: Any, y_score: Any) -> float:
    """Area under the ROC curve, ties counted half (the Mann-Whitney probability).

    AUROC = P(s⁺ > s⁻) + ½ P(s⁺ = s⁻) = (Σ ranks of the positives − P(P+1)/2) / (P·N) with
    average ranks for ties: the trapezoid area under :func:`roc_curve`, and scikit-learn's
    ``roc_auc_score``.  The same computation gives
    :func:`embedeval.metrics.confidence.confidence_auroc` and the open-set AUROC.  Single-class
    input
    (no positive or no negative): NaN with an :class:`~embedeval.EmbedevalWarning`, the
    package's one rule (scikit-learn also returns NaN).

    Examples
    --------
    >>> roc_auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])   # 3 of the 4 (pos, neg) pairs ordered
    0.75
    """
    t, s = _binary(y_true, y_score)
    return auroc(t == 1, s, "roc_auc", "classes in y_true")


def pr_curve(y_true: Any, y_score: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Precision-recall points (precision, recall, thresholds) by decreasing threshold.

    precision = TP/(TP+FP) and recall = TP/P at each threshold (score >= t).  Ties: one point
    per distinct score (a tie block enters together), as scikit-learn's
    ``precision_recall_curve`` (which lists thresholds increasing and appends (1, 0)); the
    points are those of :func:`embedeval.metrics.ranking.precision_recall_curve`.  Zero division:
    precision is never 0/0 (every threshold keeps at least one item).  Single-class input
    without a positive: recall is undefined, NaN with an :class:`~embedeval.EmbedevalWarning`
    (scikit-learn sets it to 1).

    Examples
    --------
    >>> p, r, th = pr_curve([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
    >>> p.tolist(), r.tolist()
    ([1.0, 0.5, 0.6666666666666666, 0.5], [0.5, 0.5, 1.0, 1.0])
    """
    t, s = _binary(y_true, y_score)
    tps, fps, th = threshold_counts(t, s)
    n_pos = t.sum()
    if n_pos == 0:
        warn_single_class("pr_curve", 0, t.size, "classes in y_true (a positive for recall)")
        return tps / (tps + fps), tps * np.nan, th
    return tps / (tps + fps), tps / n_pos, th


def average_precision(y_true: Any, y_score: Any) -> float:
    """Area under the PR curve by the step rule: AP = Σ_n (R_n − R_{n−1}) P_n.

    The sum runs over the distinct thresholds of :func:`pr_curve` (a tie block is one threshold:
    its items enter together, and precision is read at the block's end), which is
    scikit-learn's ``average_precision_score`` exactly.  It is computed by
    :func:`embedeval.metrics.ranking.average_precision` with ``ties="threshold"`` (the package's one
    AP).  No trapezoids (they overrate a classifier).  Single-class input without a positive:
    recall is undefined, so AP is NaN with an :class:`~embedeval.EmbedevalWarning`
    (scikit-learn returns 0 there); all positive gives 1.

    Examples
    --------
    >>> average_precision([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])    # (1/2)·1 + (1/2)·(2/3)
    0.8333333333333333
    """
    t, s = _binary(y_true, y_score)
    if t.sum() == 0:
        warn_single_class("average_precision", 0, t.size, "classes in y_true (a positive)")
        return math.nan
    with warnings.catch_warnings():  # heavily tied scores are normal for a classifier
        warnings.filterwarnings("ignore", ".*of the ranked items tie", EmbedevalWarning)
        return float(ranking_ap(t, s, ties="threshold"))


def select_threshold(y_true: Any, y_score: Any, *, method: str = "youden") -> tuple[float, float]:
    """Choose a decision threshold on the ROC curve: returns (threshold, criterion value).

    ``"accuracy"``: the largest accuracy (TP + TN) / n; ``"closest_to_01"``: the ROC point
    nearest (0, 1), criterion = √(FPR² + (1 − TPR)²); ``"youden"``: the largest
    J = TPR − FPR.  The first (highest) threshold wins ties, which are decided on the exact
    counts (J·P·N = TP·N − FP·P, and so on), so two equal criteria never differ by a rounding.

    Ties: tied scores share a threshold (points of :func:`roc_curve`).  Single-class input:
    there is nothing to separate, so it is an error (a threshold is a decision, not a score).

    Examples
    --------
    >>> select_threshold([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
    (0.8, 0.5)
    """
    method = check_choice(method, "method", ("accuracy", "closest_to_01", "youden"))
    t, s = _binary(y_true, y_score)
    p = int(t.sum())
    n = t.size - p
    if p in (0, t.size):
        raise InputError("select_threshold needs both classes in y_true; got one.")
    tps, fps, th = threshold_counts(t, s)
    tp = np.concatenate([[0], tps]).astype(np.int64)  # the first point: threshold +inf
    fp = np.concatenate([[0], fps]).astype(np.int64)
    i = _best_roc_point(tp, fp, p, n, method)
    tpr, fpr = tp[i] / p, fp[i] / n
    if method == "youden":
        crit = tpr - fpr
    elif method == "closest_to_01":
        crit = math.hypot(fpr, 1 - tpr)
    else:
        crit = (tp[i] + n - fp[i]) / t.size
    return float(np.concatenate([[np.inf], th])[i]), float(crit)


def _best_roc_point(tp: np.ndarray, fp: np.ndarray, p: int, n: int, method: str) -> int:
    """Index of the best ROC point by ``method``, the first one on an exact tie.

    The criteria are compared as integers: J·P·N = TP·N − FP·P, accuracy·n = TP − FP + N, and
    the squared distance to (0, 1) times P²N² = (FP·P)² + (FN·N)² (beyond int64 for large
    inputs, so the points within a rounding of the float minimum are compared in Python ints).
    """
    if method == "youden":
        return int(np.argmax(tp * n - fp * p))
    if method == "accuracy":
        return int(np.argmax(tp - fp))
    dist = np.hypot(fp / n, (p - tp) / p)
    near = np.flatnonzero(dist <= dist.min() * (1 + 1e-9))
    pairs = zip(fp[near].tolist(), tp[near].tolist(), strict=True)
    exact = [(f * p) ** 2 + ((p - h) * n) ** 2 for f, h in pairs]
    return int(near[int(np.argmin(exact))])


def top_k_accuracy(y_true: Any, y_score: Any, *, k: int = 1, labels: Any = None) -> float:
    """Share of items whose true class is among the k highest-scored classes.

    ``y_score`` has one column per class, in ``labels`` order (default 0..n_classes-1).  Ties at
    the k-th score count as hits (the optimistic rule); scikit-learn's ``top_k_accuracy_score``
    instead breaks ties by column order (higher column index first), so the two differ only
    when the true class ties with the k-th score.

    Zero division: never (n >= 1 items).

    Examples
    --------
    >>> top_k_accuracy([0, 1, 2], [[0.5, 0.3, 0.2], [0.5, 0.3, 0.2], [0.5, 0.3, 0.2]], k=2)
    0.6666666666666666
    """
    k = check_int(k, "k")
    refuse_merged_integers(y_score, "y_score")
    try:
        s = np.asarray(y_score, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(
            "y_score must be a numeric 2-D array (items x classes); got values that are not "
            "numbers."
        ) from None
    if s.ndim == 2 and not np.isfinite(s).all():
        first = tuple(np.argwhere(~np.isfinite(s))[0].tolist())
        raise InputError(
            f"y_score has {int((~np.isfinite(s)).sum())} NaN or infinite value(s), first at "
            f"{first}; drop or repair them."
        )
    t = as_labels(y_true, "y_true", length=s.shape[0] if s.ndim == 2 else None)
    if s.ndim != 2:
        raise InputError(f"y_score must be 2-D (items x classes); got shape {s.shape}.")
    if s.shape[1] == 0:
        raise InputError("y_score has no columns; pass one column of scores per class.")
    lab = np.arange(s.shape[1]) if labels is None else as_labels(labels, "labels")
    if len(lab) != s.shape[1]:
        raise InputError(f"labels has {len(lab)} classes but y_score has {s.shape[1]} columns.")
    (cl, ct), _ = factorize(np.asarray(lab), t)
    if np.unique(cl).size != cl.size:
        raise InputError("labels has repeated values; give each column of y_score its own class.")
    col = np.full(int(cl.max()) + 1 if cl.size else 0, -1)
    col[cl] = np.arange(cl.size)
    missing = ct >= col.size
    missing[~missing] = col[ct[~missing]] < 0
    if missing.any():
        i = int(np.flatnonzero(missing)[0])
        default = "" if labels is not None else f" (default 0..{s.shape[1] - 1})"
        raise InputError(
            f"y_true holds {int(missing.sum())} label(s) not in labels, first "
            f"{t[i : i + 1].tolist()[0]!r} at index {i}; labels names the class of each column "
            f"of y_score{default}: pass labels with every class of y_true."
        )
    true_score = s[np.arange(s.shape[0]), col[ct]]
    higher = (s > true_score[:, None]).sum(1)
    return float(np.mean(higher < k))
