"""Instance retrieval with per-query relevance lists: revisited Oxford / Paris (landmarks).

Landmark benchmarks have no class labels: each query lists its own positive and junk gallery
items.  ``evaluate(query, None, reference, None, positives=..., junk=...)`` (see
:mod:`embedeval.evaluation.relevance_lists`) ranks every reference for each query, removes the
query's junk items from the ranking, and computes embedeval's metrics on what is left with R_q =
number of (distinct) positives; a list that repeats an index is malformed ground truth and is
refused.  :func:`revisitop_lists` builds the Easy / Medium / Hard lists from revisitop-style
ground truth, and :func:`revisitop_evaluate` reports mAP and mP@k computed the way the revisited
benchmark's own evaluation computes them, next to embedeval's step AP.

Two AP rules
------------
With the positives at 1-based ranks r_1 < r_2 < ... < r_R of the junk-free ranking:

* **step AP** (``map`` everywhere in embedeval, PML, trec_eval): (1/R) sum_j j / r_j.
* **trapezoid AP** (revisitop): (1/R) sum_j (p_before_j + j / r_j) / 2, with p_before_j =
  (j - 1) / (r_j - 1) the precision just before the j-th positive (1 when r_j = 1): the area under
  the precision-recall curve with linear interpolation between its points.  Since
  (j - 1) / (r_j - 1) <= j / r_j, it is never higher than the step AP; they agree when every
  positive precedes every negative (AP = 1).

revisitop's mP@k divides by min(k, r_R) instead of k (a query with fewer than k positives ranked
at the top still gets 1); embedeval's ``precision_at_k`` divides by k.

Ties: the ranking orders equal distances by ascending reference index, as everywhere in
embedeval (revisitop's own code uses numpy's default, unstable sort).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..evaluation.relevance_lists import positive_ranks
from ..utils.errors import InputError, InputTypeError
from ..utils.validation import check_choice, check_int

__all__ = ["PROTOCOLS", "revisitop_evaluate", "revisitop_lists", "trapezoid_ap"]

#: Which revisitop lists are positive and which are junk under each protocol.
PROTOCOLS = {
    "easy": (("easy",), ("junk", "hard")),
    "medium": (("easy", "hard"), ("junk",)),
    "hard": (("hard",), ("junk", "easy")),
}


def revisitop_lists(
    gnd: Sequence[dict[str, Any]], protocol: str, *, n_reference: int | None = None
) -> tuple[list, list]:
    """Positive and junk lists of one revisited-benchmark protocol.

    Easy: positives = easy, junk = junk + hard.  Medium: positives = easy + hard, junk = junk.
    Hard: positives = hard, junk = junk + easy.  ``gnd`` holds one dict per query with
    ``"easy"``, ``"hard"`` and ``"junk"`` lists of reference indices (revisitop's ``gnd``).

    The three lists of a query must be disjoint and free of repeats, whatever the protocol:
    the revisited annotation gives each (query, image) pair one label, and revisitop's
    evaluation concatenates the lists and counts every entry of the positives in R_q, so an
    index both easy and hard would count twice in R_q under Medium, and an index both easy and
    junk would be a positive and junk at once under Easy.  Such ground truth is refused, naming
    the query and the index, rather than silently de-duplicated.  With ``n_reference`` an
    index outside ``0..n_reference - 1`` is refused too, naming its list.

    Examples
    --------
    >>> revisitop_lists([{"easy": [0], "hard": [2], "junk": [1]}], "hard")
    ([[2]], [[0, 1]])
    """
    protocol = check_choice(protocol, "protocol", tuple(PROTOCOLS))
    pos_keys, junk_keys = PROTOCOLS[protocol]
    positives, junk = [], []
    for i, g in enumerate(gnd):
        missing = [k for k in ("easy", "hard", "junk") if k not in g]
        if missing:
            raise InputError(f"gnd[{i}] has no {', '.join(map(repr, missing))} list.")
        lists = {key: _gnd_indices(g[key], i, key, n_reference) for key in ("easy", "hard", "junk")}
        _check_labels_exclusive(lists, i)
        positives.append(sorted(v for k in pos_keys for v in lists[k]))
        junk.append(sorted(v for k in junk_keys for v in lists[k]))
    return positives, junk


def _gnd_indices(values: Any, i: int, key: str, n_reference: int | None) -> list[int]:
    """gnd[i][key] as Python ints; anything but an integer is refused, since ``int()`` would
    truncate 2.7 to 2, read "3" and True as indices, and a float array (from a MATLAB file)
    may hold 1-based indices; so is an index outside ``0..n_reference - 1`` (when given)."""
    out = np.asarray(values if values is not None else [], dtype=object).ravel().tolist()
    wrong = [v for v in out if not isinstance(v, (int, np.integer)) or isinstance(v, bool)]
    if wrong:
        raise InputTypeError(
            f"gnd[{i}][{key!r}] (query {i}) must hold integer reference indices; got "
            f"{wrong[0]!r}. Cast the list, e.g. np.asarray(gnd[{i}][{key!r}], dtype=np.int64), "
            "after checking that its indices are 0-based."
        )
    ints = [int(v) for v in out]
    outside = [v for v in ints if n_reference is not None and not 0 <= v < n_reference]
    if outside:
        raise InputError(
            f"gnd[{i}][{key!r}] (query {i}) holds index {outside[0]}, outside the "
            f"{n_reference} reference images (0..{n_reference - 1}); gnd indices are 0-based "
            "rows of reference."
        )
    return ints


def _check_labels_exclusive(lists: dict[str, list[int]], i: int) -> None:
    """One label per (query, image): no repeat within gnd[i]'s easy / hard / junk lists and no
    index in two of them."""
    seen: dict[int, str] = {}
    for key in ("easy", "hard", "junk"):
        for v in lists[key]:
            if v not in seen:
                seen[v] = key
                continue
            if seen[v] == key:
                raise InputError(
                    f"gnd[{i}][{key!r}] (query {i}) lists reference index {v} more than once; "
                    f"remove the repeats, e.g. with np.unique(gnd[{i}][{key!r}])."
                )
            raise InputError(
                f"gnd[{i}] (query {i}) lists reference index {v} in both {seen[v]!r} and "
                f"{key!r}; each image has one label per query (joined by a protocol, the lists "
                "would count it twice in R_q or make it a positive and junk at once). Keep the "
                "index in one list."
            )


# ---------------------------------------------------------------------------- revisitop
def trapezoid_ap(
    ranks: np.ndarray, lims: np.ndarray, n_relevant: np.ndarray | None = None
) -> np.ndarray:
    """Trapezoid AP per query from the 0-based, increasing positive ranks of each query (CSR),
    NaN for a query without positives.

    With the positives at 0-based ranks r_0 < r_1 < ... of the ranking, AP = (1/R) sum_j
    (p_before_j + (j + 1) / (r_j + 1)) / 2 with p_before_j = j / r_j (1 when r_j = 0).  R is the
    number of ranks given, or ``n_relevant`` per query when given (positives the ranking does
    not reach, e.g. beyond a depth cap, then count in R and add nothing; a query with
    n_relevant = 0 gets NaN).

    Examples
    --------
    >>> # positives at 0-based ranks 1 and 3: ((0/1 + 1/2) / 2 + (1/3 + 2/4) / 2) / 2 = 1/3
    >>> trapezoid_ap(np.array([1, 3]), np.array([0, 2])).round(4).tolist()
    [0.3333]
    >>> # the same two found, out of R = 4: (1/4 + 5/12) / 4 = 1/6
    >>> trapezoid_ap(np.array([1, 3]), np.array([0, 2]), np.array([4])).round(4).tolist()
    [0.1667]
    """
    counts = np.diff(lims)
    j = np.arange(ranks.size) - np.repeat(lims[:-1], counts)  # positives before this one
    before = np.where(ranks == 0, 1.0, j / np.maximum(ranks, 1))
    at = (j + 1) / (ranks + 1.0)
    terms = (before + at) / 2.0
    has = counts > 0
    sums = np.zeros(counts.size)
    if ranks.size:  # reduceat gives an empty segment the next term: masked by ``has``
        sums[has] = np.add.reduceat(np.append(terms, 0.0), lims[:-1])[has]
    denominator = counts if n_relevant is None else np.asarray(n_relevant)
    out = np.full(counts.size, np.nan)
    defined = denominator > 0
    out[defined] = sums[defined] / denominator[defined]
    return out


def _revisitop_precision(ranks: np.ndarray, lims: np.ndarray, kappa: int) -> np.ndarray:
    """revisitop's mP@k per query: positives within min(k, last positive rank), divided by it."""
    counts = np.diff(lims)
    out = np.full(counts.size, np.nan)
    has = np.flatnonzero(counts > 0)
    last = ranks[lims[has + 1] - 1] + 1  # 1-based rank of the last positive
    kq = np.minimum(last, kappa)
    # Positives of a row are increasing, so counting those within kq is a flag sum per row.
    limit = np.zeros(counts.size, np.int64)
    limit[has] = kq
    inside = (ranks + 1 <= np.repeat(limit, counts)).astype(np.float64)
    within = np.add.reduceat(np.append(inside, 0.0), lims[:-1])[has]
    out[has] = within / kq
    return out


def _n_rows(x: Any, name: str) -> int:
    """The rows of an embedding matrix, read from its shape (a memory map is not read)."""
    shape = np.shape(x)
    if len(shape) != 2:
        raise InputError(f"{name} must be a 2-D array (rows x dim); got shape {shape}.")
    return int(shape[0])


def _check_sequence(value: Any, name: str, item: Any, example: str) -> list:
    """``protocols`` / ``kappas`` as a list (read once per protocol, so a generator must not be
    spent by the first); a bare name would be iterated letter by letter ("protocol='e' is not
    valid") and a bare int not at all."""
    if isinstance(value, item) or not isinstance(value, Iterable):
        raise InputTypeError(
            f"{name} must be a sequence, e.g. {name}={example}; got {value!r}. Put a single "
            "value in a list."
        )
    return list(value)


def revisitop_evaluate(
    query: Any,
    reference: Any,
    gnd: Sequence[dict[str, Any]],
    *,
    protocols: Sequence[str] = ("easy", "medium", "hard"),
    kappas: Sequence[int] = (1, 5, 10),
    distance: str = "cosine",
    block_size: int | None = None,
    memory_budget: int = 256 * 2**20,
) -> dict[str, dict[str, Any]]:
    """mAP and mP@k of the revisited Oxford / Paris protocols, as the benchmark computes them.

    For each protocol: ``"map"`` (trapezoid AP, the published tables' number), ``"map_step"``
    (embedeval's step AP, equal to ``evaluate(..., positives=..., junk=...)["map"]``),
    ``"mp@k"`` for each k in ``kappas`` (revisitop's rule), ``"ap"`` (per-query trapezoid AP,
    NaN for a query without positives) and ``"n_queries"`` (queries with positives, the
    denominator).  Mean values are fractions in [0, 1] (the tables print them x 100).

    Examples
    --------
    >>> gnd = [{"easy": [0], "hard": [2], "junk": [1]}]
    >>> out = revisitop_evaluate([[0.0]], [[1.0], [2.0], [3.0]], gnd, protocols=["medium"],
    ...                          distance="euclidean")
    >>> round(out["medium"]["map"], 4), out["medium"]["map_step"]  # positives at ranks 1, 2
    (1.0, 1.0)
    """
    protocols = _check_sequence(protocols, "protocols", str, '["hard"]')
    kappas = _check_sequence(kappas, "kappas", (int, np.integer), "[10]")
    n_query, n_reference = _n_rows(query, "query"), _n_rows(reference, "reference")
    if len(gnd) != n_query:
        raise InputError(
            f"gnd has {len(gnd)} entries but query has {n_query} rows; give one ground-truth "
            "dict per query, in query order."
        )
    out: dict[str, dict[str, Any]] = {}
    for protocol in protocols:
        pos, junk = revisitop_lists(gnd, protocol, n_reference=n_reference)
        ranks, lims = positive_ranks(
            query,
            reference,
            pos,
            junk,
            distance=distance,
            block_size=block_size,
            memory_budget=memory_budget,
        )
        ap = trapezoid_ap(ranks, lims)
        counts = np.diff(lims)
        j = np.arange(ranks.size) - np.repeat(lims[:-1], counts)
        step_terms = np.append((j + 1) / (ranks + 1.0), 0.0)
        step = np.full(counts.size, np.nan)
        has = counts > 0
        if ranks.size:
            step[has] = np.add.reduceat(step_terms, lims[:-1])[has] / counts[has]
        res: dict[str, Any] = {
            "map": float(np.nanmean(ap)) if has.any() else float("nan"),
            "map_step": float(np.nanmean(step)) if has.any() else float("nan"),
            "ap": ap,
            "n_queries": int(has.sum()),
        }
        for kappa in kappas:
            kappa = check_int(kappa, "kappas")
            prec = _revisitop_precision(ranks, lims, kappa)
            res[f"mp@{kappa}"] = float(np.nanmean(prec)) if has.any() else float("nan")
        out[protocol] = res
    return out
