"""Per-query retrieval metric kernels over sorted candidate rows.

Each retrieval metric of :data:`embedeval.engine.registry.METRICS` names its kernel
(``MetricInfo.kernel``), a small function of this module listed in :data:`KERNELS`.  A kernel sees
one block of queries through :class:`RankedHits`: the relevant candidates among the packed,
sorted rows of :class:`~embedeval.engine.candidates.Candidates` (nearest first, ties by ascending
reference index), R_q (relevant references each query can see) and n_valid (references each
query can see).  It returns a float64 value and a bool tie flag per query, vectorised over the
block; :func:`chunk_metrics` sets lone queries (R_q = 0) to NaN and unflags them.

Conventions (PML 2.9's ``AccuracyCalculator`` where it is right):

* ``k=None``: each metric reads the depth it needs.  An int ``k`` caps the depth at
  ``min(k, n_valid)``; the relevance window of ``r_precision`` / ``map_at_r`` is ``min(R_q, k)``,
  ``r_precision`` divides by that window, ``map_at_r`` and ``map`` keep the divisor R_q, and
  ``mrr`` is 0 when no relevant reference is within the first k.
* A tie is reported for a query when a block of equally distant references that mixes relevant
  and non-relevant items could change the value under another ordering: for count metrics
  (P@1, R-precision, P@k) a block straddling the cut-off; for Recall@k (a hit rate) such a block
  only when no relevant item precedes it and it holds enough non-relevant items to fill its
  part of the top k; for rank-weighted metrics (MAP@R, MAP, MRR) any such block inside the
  window (see :class:`TieFinder`).  The value itself is always that of the ranking with ties
  in ascending reference index order; ``EvaluationResult.n_ties`` counts the flagged queries.

A new built-in metric is a kernel here, its entry in :data:`KERNELS`, and its
:class:`~embedeval.engine.registry.MetricInfo` in the registry; ``tests/test_common.py`` then checks
it like every other metric.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .candidates import Candidates, sortable_bits
from .custom import call_metric, relevance_matrix
from .labels import match_pairs
from .registry import MetricInfo

__all__ = [
    "KERNELS",
    "NoTies",
    "RankedHits",
    "TieFinder",
    "average_precision",
    "chunk_metrics",
    "custom_metric",
    "hits_from_ranks",
    "inverse_negative_penalty",
    "map_at_k",
    "map_at_r",
    "needed_depth",
    "precision_at_k",
    "r_precision",
    "rank_hits",
    "ranked_example",
    "recall_at_k",
    "reciprocal_rank",
    "score_hits",
]

Kernel = Callable[["RankedHits", MetricInfo], tuple[np.ndarray, np.ndarray]]


def needed_depth(
    metrics: list[MetricInfo], relevant: np.ndarray, k: int | None
) -> tuple[np.ndarray, str | None]:
    """Depth (ranked items, +1 to see a tie at the cut-off) each query needs, and whether a
    label-based threshold is needed (``"max"`` for full-depth MAP, ``"min"`` for MRR).

    >>> from embedeval.engine.registry import METRICS
    >>> depth, threshold = needed_depth([METRICS["map_at_r"]], np.array([3, 0]), None)
    >>> depth.tolist(), threshold
    ([4, 0], None)
    """
    depth = np.zeros(relevant.shape, dtype=np.int64)
    threshold = None
    for m in metrics:
        if m.kind != "knn":
            continue
        if m.depth in ("one", "fixed"):
            need = np.full_like(depth, m.cutoff)
        elif m.depth == "r":
            need = relevant if k is None else np.minimum(relevant, k)
        elif k is not None:
            need = np.full_like(depth, k)
        else:
            need = np.ones_like(depth)
            if m.depth == "full":
                threshold = "max"
            elif threshold is None:
                threshold = "min"
        np.maximum(depth, need + 1, out=depth)
    depth[relevant == 0] = 0
    return depth, threshold


@dataclass(frozen=True)
class RankedHits:
    """The relevant candidates of one block of sorted rows: what every kernel reads.

    Only two passes touch every candidate (label lookup and comparison, in :func:`rank_hits`);
    the kernels work on the relevant candidates alone.

    Attributes
    ----------
    lims, counts : ndarray
        CSR bounds and length of each query's candidate row.
    hit : ndarray
        Flat positions of the relevant candidates, increasing (row order, then rank order).
    row_start, n_hits : ndarray
        Per row: index in ``hit`` of its first relevant candidate, and how many it has.
    hit_pos, found : ndarray
        Per relevant candidate: its 0-based rank ``pos`` in the row, and the relevant items up
        to and including it, so that P@(pos+1) = found / (pos + 1).
    relevant, n_valid : ndarray
        R_q and the number of references each query can see.
    k : int or None
        The depth cap of :func:`embedeval.evaluate`.
    ties : TieFinder
        The blocks of equal keys that mix relevant and non-relevant items.
    """

    lims: np.ndarray
    counts: np.ndarray
    hit: np.ndarray
    row_start: np.ndarray
    n_hits: np.ndarray
    hit_pos: np.ndarray
    found: np.ndarray
    relevant: np.ndarray
    n_valid: np.ndarray
    k: int | None
    ties: TieFinder | NoTies

    @property
    def depth_cap(self) -> np.ndarray:
        """``min(k, n_valid)``: the deepest rank any metric may read."""
        return self.n_valid if self.k is None else np.minimum(self.n_valid, self.k)

    def r_window(self) -> np.ndarray:
        """``min(R_q, k)``: the window of R-precision and MAP@R."""
        return self.relevant if self.k is None else np.minimum(self.relevant, self.k)

    def hits_within(self, window: np.ndarray) -> np.ndarray:
        """Relevant items among the first ``window`` of each row."""
        # Hits of a row are contiguous and increasing, so those inside a window are a prefix.
        ends = self.lims[:-1] + np.minimum(window, self.counts)
        return np.searchsorted(self.hit, ends) - self.row_start

    @functools.cached_property
    def _precisions(self) -> np.ndarray:
        # P@i at each relevant position i, and a 0 that ends the last segment of reduceat.
        return np.append(self.found / (self.hit_pos + 1.0), 0.0)

    def precision_sums(self, window: np.ndarray) -> np.ndarray:
        """Per row, the sum of P@i over the relevant ranks i <= ``window``, by
        ``np.add.reduceat`` (numpy's summation order, not strictly from the first rank: a
        plain left-to-right sum can differ in the last bits; the torch kernels reproduce this
        order)."""
        b = self.counts.size
        end = self.row_start + self.hits_within(window)
        bounds = np.empty(2 * b, dtype=np.int64)
        bounds[0::2], bounds[1::2] = self.row_start, end
        sums = np.add.reduceat(self._precisions, bounds)[0::2]
        return np.where(end > self.row_start, sums, 0.0)

    def last_hit_rank(self) -> np.ndarray:
        """1-based rank of each row's last relevant candidate (0 for a row without one)."""
        last = np.zeros(self.counts.size, dtype=np.int64)
        has = self.n_hits > 0
        last[has] = self.hit_pos[self.row_start[has] + self.n_hits[has] - 1] + 1
        return last


def rank_hits(
    block: Candidates,
    query_codes: np.ndarray,
    reference_codes: np.ndarray,
    relevant: np.ndarray,
    n_valid: np.ndarray,
    k: int | None,
) -> RankedHits:
    """The :class:`RankedHits` of a block: a candidate is relevant when its reference's label
    code equals its query's."""
    counts = block.counts
    lims = block.lims
    rel = match_pairs(np.repeat(query_codes, counts, axis=0), reference_codes[block.index])
    hit = np.flatnonzero(rel)
    row_start = np.searchsorted(hit, lims[:-1])
    n_hits = np.diff(np.append(row_start, hit.size))
    hit_pos = hit - np.repeat(lims[:-1], n_hits)
    found = np.arange(1, hit.size + 1) - np.repeat(row_start, n_hits)
    ties = TieFinder(block, rel)
    return RankedHits(
        lims, counts, hit, row_start, n_hits, hit_pos, found, relevant, n_valid, k, ties
    )


def hits_from_ranks(
    n_hits: np.ndarray,
    hit_pos: np.ndarray,
    relevant: np.ndarray,
    n_valid: np.ndarray,
    k: int | None,
    mixed: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> RankedHits:
    """The :class:`RankedHits` of rows whose every relevant reference is located by its rank
    alone (:mod:`embedeval.engine.deep`), without the candidates around them.

    ``hit_pos`` holds the 0-based ranks of each row's relevant references, row after row, each
    row's increasing (``n_hits`` per row).  The rows stand for whole rankings of ``n_valid``
    items, so every window of a kernel reads them as it reads sorted candidates.  Without
    ``mixed`` they must hold no block of equal keys mixing relevant and non-relevant items
    (:class:`NoTies`); ``mixed = (row, first, last, first_mixed)`` describes such blocks
    (:meth:`TieFinder.from_runs`): each block's row and the 0-based ranks of its first and
    last item (disjoint blocks, in row then rank order), and per row the rank of the first
    item of its first pair of neighbours with equal keys and different relevance.

    >>> hits = hits_from_ranks(np.array([2]), np.array([1, 2]), np.array([2]), np.array([5]), None)
    >>> hits.hit.tolist(), hits.found.tolist(), hits.last_hit_rank().tolist()
    ([1, 2], [1, 2], [3])
    """
    counts = np.asarray(n_valid, dtype=np.int64)
    lims = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=lims[1:])
    row_start = np.zeros(counts.size, dtype=np.int64)
    np.cumsum(n_hits[:-1], out=row_start[1:])
    hit = hit_pos + np.repeat(lims[:-1], n_hits)
    found = np.arange(1, hit.size + 1) - np.repeat(row_start, n_hits)
    ties: TieFinder | NoTies = NoTies(counts.size)
    if mixed is not None and mixed[0].size:
        row, first, last, first_mixed = mixed
        frame = Candidates(np.arange(counts.size), lims, np.zeros(0, np.int64), np.zeros(0))
        ties = TieFinder.from_runs(frame, lims[row] + first, lims[row] + last, first_mixed)
    return RankedHits(
        lims, counts, hit, row_start, n_hits, hit_pos, found, relevant, n_valid, k, ties
    )


def ranked_example(
    relevance: Sequence[Sequence[int]],
    keys: Sequence[Sequence[float]] | None = None,
    n_relevant: Sequence[int] | None = None,
    k: int | None = None,
) -> RankedHits:
    """:class:`RankedHits` of hand-written rankings, for examples and tests.

    ``relevance[i]`` is query i's whole ranking (1 = relevant), nearest first; ``keys[i]`` its
    ranking keys (default 0, 1, 2, ...: no ties; equal keys are a tie, listed in reference
    order); ``n_relevant`` is R_q (default: the relevant items listed).

    >>> hits = ranked_example([[0, 1, 1]], keys=[[0.0, 1.0, 1.0]])
    >>> hits.hit_pos.tolist(), hits.found.tolist(), hits.relevant.tolist()
    ([1, 2], [1, 2], [2])
    """
    counts = np.array([len(row) for row in relevance], dtype=np.int64)
    lims = np.concatenate(([0], np.cumsum(counts)))
    flat = np.array([v for row in relevance for v in row], dtype=bool)
    if keys is None:
        keys = [np.arange(n) for n in counts]
    bits = sortable_bits(np.concatenate([np.asarray(row, dtype=np.float32) for row in keys]))
    block = Candidates(np.arange(counts.size), lims, np.arange(flat.size), bits)
    if n_relevant is None:
        n_relevant = [sum(row) for row in relevance]
    relevant = np.asarray(n_relevant, dtype=np.int64)
    codes = np.where(flat, 0, 1)
    return rank_hits(block, np.zeros(counts.size, np.int64), codes, relevant, counts, k)


def chunk_metrics(
    block: Candidates,
    query_codes: np.ndarray,
    reference_codes: np.ndarray,
    relevant: np.ndarray,
    n_valid: np.ndarray,
    metrics: list[MetricInfo],
    k: int | None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per-query values and tie flags of the retrieval ``metrics`` for one block of sorted
    candidates: each metric's kernel (:data:`KERNELS`), NaN and no tie for lone queries.

    One query (label code 0) ranking references 3, 1, 2, 0 (codes 1, 0, 0, 1), R_q = 2:

    >>> from embedeval.engine.registry import METRICS
    >>> keys = sortable_bits(np.array([0.5, 1.0, 2.0, 4.0], dtype=np.float32))
    >>> block = Candidates(np.arange(1), np.array([0, 4]), np.array([3, 1, 2, 0]), keys)
    >>> values, ties = chunk_metrics(block, np.array([0]), np.array([1, 0, 0, 1]), np.array([2]),
    ...                              np.array([4]), [METRICS["mrr"], METRICS["map"]], None)
    >>> values["mrr"].tolist(), values["map"].tolist(), ties["map"].tolist()
    ([0.5], [0.5833333333333333], [False])
    """
    hits = rank_hits(block, query_codes, reference_codes, relevant, n_valid, k)
    return score_hits(hits, metrics)


def score_hits(
    hits: RankedHits, metrics: list[MetricInfo]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """:func:`chunk_metrics` from the block's :class:`RankedHits`."""
    lone = hits.relevant == 0
    values: dict[str, np.ndarray] = {}
    flags: dict[str, np.ndarray] = {}
    for m in metrics:
        if m.kind != "knn":
            continue
        value, tie = KERNELS[m.kernel](hits, m)
        value = np.asarray(value, dtype=np.float64)
        value[lone] = np.nan
        values[m.name] = value
        flags[m.name] = tie & ~lone
    return values, flags


# ---------------------------------------------------------------------------- the kernels


def precision_at_k(hits: RankedHits, m: MetricInfo) -> tuple[np.ndarray, np.ndarray]:
    """Precision@k: the fraction of relevant items among the k nearest references.

    Formula: ``P@k = #{relevant items in the first min(k, n_valid)} / k``.

    The divisor stays k when a query sees fewer than k references (P@1 is the case k = 1).
    Tie: a block of equally distant references mixing relevant and non-relevant items that
    straddles rank k (another order would change the count).

    Parameters
    ----------
    hits : RankedHits
        The block's relevant candidates.
    m : MetricInfo
        The registry entry; ``m.cutoff`` is k.

    Returns
    -------
    value, tie : ndarray
        float64 values and bool tie flags, one per query.

    Examples
    --------
    The same ranking without a tie, and with its 2nd and 3rd references equally distant:

    >>> from embedeval.engine.registry import METRICS
    >>> hits = ranked_example([[1, 0, 1, 1], [1, 0, 1, 1]], keys=[[0, 1, 2, 3], [0, 1, 1, 2]])
    >>> value, tie = precision_at_k(hits, METRICS["precision_at_2"])
    >>> value.tolist(), tie.tolist()  # 1/2 both
    ([0.5, 0.5], [False, True])
    """
    window = np.minimum(m.cutoff, hits.n_valid)
    return hits.hits_within(window) / m.cutoff, hits.ties.straddle(window)


def recall_at_k(hits: RankedHits, m: MetricInfo) -> tuple[np.ndarray, np.ndarray]:
    """Recall@k of metric learning, a hit rate: 1 when a relevant item is among the k nearest.

    Formula: ``R@k = 1 if a relevant item is in the first min(k, n_valid) else 0``.

    Tie: a mixed block straddling rank k when no relevant item precedes it and it holds at
    least as many non-relevant items as it has inside the top k (another order would leave the
    top k without a relevant item).

    Parameters
    ----------
    hits : RankedHits
        The block's relevant candidates.
    m : MetricInfo
        The registry entry; ``m.cutoff`` is k.

    Returns
    -------
    value, tie : ndarray
        float64 values and bool tie flags, one per query.

    Examples
    --------
    Ranks 2 and 3 tie in the last two rows; only in the middle one can the hit leave the top 2:

    >>> from embedeval.engine.registry import METRICS
    >>> hits = ranked_example([[0, 1, 0, 1], [0, 1, 0, 1], [1, 1, 0, 0]],
    ...                       keys=[[0, 1, 2, 3], [0, 1, 1, 2], [0, 1, 1, 2]])
    >>> value, tie = recall_at_k(hits, METRICS["recall_at_2"])
    >>> value.tolist(), tie.tolist()
    ([1.0, 1.0, 1.0], [False, True, False])
    """
    window = np.minimum(m.cutoff, hits.n_valid)
    value = (hits.hits_within(window) > 0).astype(np.float64)
    return value, hits.ties.hit_rate_changes(window, hits.hit, hits.row_start)


def r_precision(hits: RankedHits, m: MetricInfo) -> tuple[np.ndarray, np.ndarray]:
    """R-precision: the fraction of relevant items among the R_q nearest references.

    Formula: ``RP = #{relevant items in the first w} / w`` with ``w = min(R_q, k)``.

    Tie: a mixed block straddling rank w.

    Parameters
    ----------
    hits : RankedHits
        The block's relevant candidates.
    m : MetricInfo
        The registry entry.

    Returns
    -------
    value, tie : ndarray
        float64 values and bool tie flags, one per query.

    Examples
    --------
    R_q = 3 in both rows (2 of the first 3 are relevant); in the second, ranks 3 and 4 tie:

    >>> from embedeval.engine.registry import METRICS
    >>> hits = ranked_example([[1, 0, 1, 1], [1, 1, 0, 1]], keys=[[0, 1, 2, 3], [0, 1, 2, 2]])
    >>> value, tie = r_precision(hits, METRICS["r_precision"])
    >>> value.tolist(), tie.tolist()
    ([0.6666666666666666, 0.6666666666666666], [False, True])
    """
    window = hits.r_window()
    return hits.hits_within(window) / np.maximum(window, 1), hits.ties.straddle(window)


def map_at_r(hits: RankedHits, m: MetricInfo) -> tuple[np.ndarray, np.ndarray]:
    """Average precision at R (the per-query MAP@R), divisor R_q.

    Formula: ``AP@R = sum(P@i for relevant ranks i <= w) / R_q`` with ``w = min(R_q, k)``.

    Tie: a mixed block with an item within the first w.

    Parameters
    ----------
    hits : RankedHits
        The block's relevant candidates.
    m : MetricInfo
        The registry entry.

    Returns
    -------
    value, tie : ndarray
        float64 values and bool tie flags, one per query.

    Examples
    --------
    R_q = 3: (1/1 + 2/3) / 3; in the second row ranks 2 and 3 tie:

    >>> from embedeval.engine.registry import METRICS
    >>> hits = ranked_example([[1, 0, 1, 1], [1, 0, 1, 1]], keys=[[0, 1, 2, 3], [0, 1, 1, 2]])
    >>> value, tie = map_at_r(hits, METRICS["map_at_r"])
    >>> value.tolist(), tie.tolist()
    ([0.5555555555555555, 0.5555555555555555], [False, True])
    """
    window = hits.r_window()
    return hits.precision_sums(window) / np.maximum(hits.relevant, 1), hits.ties.within(window)


def map_at_k(hits: RankedHits, m: MetricInfo) -> tuple[np.ndarray, np.ndarray]:
    """Average precision over the top k divided by the relevant items found there (the
    per-query mAP@k of the hashing literature, e.g. mAP@5000 on NUS-WIDE / MS-COCO).

    Formula: ``AP@k = sum(P@i for relevant ranks i <= w) / #{relevant items in the first w}``
    with ``w = min(k, n_valid)``, and 0 when the first w hold no relevant item.  Unlike
    ``map`` and ``map_at_r`` (divisor R_q), a query is not penalised for relevant references
    beyond the top k; open-metric-learning's ``map@k`` divides by ``min(k, R_q)`` instead.
    Tie: a mixed block with an item within the first w (the sum and the count may change).

    Parameters
    ----------
    hits : RankedHits
        The block's relevant candidates.
    m : MetricInfo
        The registry entry; ``m.cutoff`` is k.

    Returns
    -------
    value, tie : ndarray
        float64 values and bool tie flags, one per query.

    Examples
    --------
    Top 3 of the first row: (1/1 + 2/3) / 2; the second row has no hit in its top 3; in the
    third, ranks 3 and 4 tie:

    >>> from embedeval.engine.registry import METRICS
    >>> hits = ranked_example([[1, 0, 1, 1], [0, 0, 0, 1], [1, 0, 0, 1]],
    ...                       keys=[[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 2]])
    >>> value, tie = map_at_k(hits, METRICS["map_at_3"])
    >>> value.tolist(), tie.tolist()
    ([0.8333333333333333, 0.0, 1.0], [False, False, True])
    """
    window = np.minimum(m.cutoff, hits.n_valid)
    found = hits.hits_within(window)
    value = hits.precision_sums(window) / np.maximum(found, 1)
    tie = hits.ties.within(window)
    # A mixed block with one item inside the window changes the value only through which kind
    # that item is; the two values can coincide (S / f = (f + 1) / w), so compare them.
    rows = np.flatnonzero(hits.ties.one_inside(window) & ~hits.ties.within(window - 1))
    if rows.size:
        w = window[rows]
        before = hits.hits_within(window - 1)[rows]
        sums = hits.precision_sums(window - 1)[rows]
        inside = (sums + (before + 1.0) / w) / (before + 1.0)
        outside = np.where(before > 0, sums / np.maximum(before, 1), 0.0)
        tie[rows] = ~np.isclose(inside, outside, rtol=1e-12, atol=0.0)
    return value, tie


def average_precision(hits: RankedHits, m: MetricInfo) -> tuple[np.ndarray, np.ndarray]:
    """Average precision over the whole ranking (the per-query MAP), divisor R_q.

    Formula: ``AP = sum(P@i for relevant ranks i <= w) / R_q``, with w the rank of the last
    relevant item (``k=None``: every relevant reference is a candidate) or ``min(k, n_valid)``.
    Tie: a mixed block with an item within the first w.

    Parameters
    ----------
    hits : RankedHits
        The block's relevant candidates.
    m : MetricInfo
        The registry entry.

    Returns
    -------
    value, tie : ndarray
        float64 values and bool tie flags, one per query.

    Examples
    --------
    (1/1 + 2/4) / 2; in the second row the last two ranks tie:

    >>> from embedeval.engine.registry import METRICS
    >>> hits = ranked_example([[1, 0, 0, 1], [1, 0, 0, 1]], keys=[[0, 1, 2, 3], [0, 1, 2, 2]])
    >>> value, tie = average_precision(hits, METRICS["map"])
    >>> value.tolist(), tie.tolist()
    ([0.75, 0.75], [False, True])
    """
    window = hits.last_hit_rank() if hits.k is None else hits.depth_cap
    return hits.precision_sums(window) / np.maximum(hits.relevant, 1), hits.ties.within(window)


def inverse_negative_penalty(hits: RankedHits, m: MetricInfo) -> tuple[np.ndarray, np.ndarray]:
    """Inverse negative penalty (the per-query mINP of person re-identification).

    Formula: ``INP = R_q / rank(last relevant item)``.

    0 when the last relevant item lies past ``min(k, n_valid)``.  Tie: only the block holding
    the last relevant item can move it: a mixed block straddling its rank or the rank before,
    or, when it lies past the cap, a mixed block straddling the cap with room inside the cap
    for all its relevant items (another order would make the value positive).

    Parameters
    ----------
    hits : RankedHits
        The block's relevant candidates.
    m : MetricInfo
        The registry entry.

    Returns
    -------
    value, tie : ndarray
        float64 values and bool tie flags, one per query.

    Examples
    --------
    2 / 4; in the second row the last relevant item ties with the one before it:

    >>> from embedeval.engine.registry import METRICS
    >>> hits = ranked_example([[1, 0, 0, 1], [1, 0, 0, 1]], keys=[[0, 1, 2, 3], [0, 1, 2, 2]])
    >>> value, tie = inverse_negative_penalty(hits, METRICS["minp"])
    >>> value.tolist(), tie.tolist()
    ([0.5, 0.5], [False, True])

    With ``k=3`` the last relevant item (rank 4) is past the cap, but it ties with rank 3:

    >>> hits = ranked_example([[1, 0, 0, 1]], keys=[[0, 1, 2, 2]], k=3)
    >>> value, tie = inverse_negative_penalty(hits, METRICS["minp"])
    >>> value.tolist(), tie.tolist()
    ([0.0], [True])
    """
    last = hits.last_hit_rank()
    cap = hits.depth_cap
    # The engine may hold candidates past k (a tie block at the cut): count the last relevant
    # item only within the cap.
    every = (hits.n_hits > 0) & (hits.n_hits >= hits.relevant)
    complete = every & (last <= cap)
    value = np.where(complete, hits.relevant / np.maximum(last, 1), 0.0)
    straddle = hits.ties.straddle
    pulled_in = every & hits.ties.can_pull_in(cap, hits.hit, last)
    return value, np.where(complete, straddle(last) | straddle(last - 1), pulled_in)


def reciprocal_rank(hits: RankedHits, m: MetricInfo) -> tuple[np.ndarray, np.ndarray]:
    """Reciprocal rank of the first relevant item (the per-query MRR).

    Formula: ``RR = 1 / rank(first relevant item)``.

    0 when no relevant item is within ``min(k, n_valid)``.  Tie: a mixed block with an item at
    or before the first relevant item (or within the cap when there is none).

    Parameters
    ----------
    hits : RankedHits
        The block's relevant candidates.
    m : MetricInfo
        The registry entry.

    Returns
    -------
    value, tie : ndarray
        float64 values and bool tie flags, one per query.

    Examples
    --------
    First hit at rank 2; in the second row ranks 2 and 3 tie:

    >>> from embedeval.engine.registry import METRICS
    >>> hits = ranked_example([[0, 1, 0, 0], [0, 1, 0, 0]], keys=[[0, 1, 2, 3], [0, 1, 1, 2]])
    >>> value, tie = reciprocal_rank(hits, METRICS["mrr"])
    >>> value.tolist(), tie.tolist()
    ([0.5, 0.5], [False, True])
    """
    cap = hits.depth_cap
    first = np.full(hits.counts.size, np.iinfo(np.int64).max)
    has = hits.n_hits > 0
    first[has] = hits.hit_pos[hits.row_start[has]]
    in_reach = first < cap
    value = np.where(in_reach, 1.0 / (np.minimum(first, cap) + 1.0), 0.0)
    return value, hits.ties.within(np.where(in_reach, first + 1, cap))


def custom_metric(hits: RankedHits, m: MetricInfo) -> tuple[np.ndarray, np.ndarray]:
    """A user's :class:`~embedeval.RetrievalMetric`: ``m.function`` of the relevance matrix.

    ``m.function(relevant, n_relevant)`` gets, for the non-lone queries, the dense relevance of
    the items within the metric's window (``"R"``: ``min(R_q, k)``; an int d: ``min(d,
    n_valid)``; ``"all"``: up to the last relevant item, or ``min(k, n_valid)``) and R_q.
    Tie: a mixed block with an item within the window.

    Parameters
    ----------
    hits : RankedHits
        The block's relevant candidates.
    m : MetricInfo
        The registry entry built by :func:`embedeval.engine.custom.custom_infos`.

    Returns
    -------
    value, tie : ndarray
        float64 values and bool tie flags, one per query.

    Examples
    --------
    Relevant items among the first 2; in the second row ranks 2 and 3 tie:

    >>> from embedeval.engine.custom import RetrievalMetric, custom_infos
    >>> hits_at_2 = RetrievalMetric(lambda rel, n_rel: rel.sum(axis=1), depth=2)
    >>> info = custom_infos({"hits_at_2": hits_at_2}, lambda name: False)[0]
    >>> hits = ranked_example([[1, 0, 1, 1], [1, 0, 1, 1]], keys=[[0, 1, 2, 3], [0, 1, 1, 2]])
    >>> value, tie = custom_metric(hits, info)
    >>> value.tolist(), tie.tolist()
    ([1.0, 1.0], [False, True])
    """
    if m.depth == "fixed":
        window = np.minimum(m.cutoff, hits.n_valid)
    elif m.depth == "r":
        window = hits.r_window()
    elif hits.k is not None:
        window = hits.depth_cap
    else:
        # The whole ranking: after the last relevant reference only non-relevant items follow,
        # so the window may end there without losing information.
        window = hits.last_hit_rank()
    b = hits.counts.size
    hit_row = np.repeat(np.arange(b), hits.n_hits)
    value = np.full(b, np.nan)
    live = hits.relevant > 0
    matrix = relevance_matrix(hit_row, hits.hit_pos, np.where(live, window, 0), b)
    value[live] = call_metric(m.function, m.name, matrix[live], hits.relevant[live], m.value_range)
    return value, hits.ties.within(window)


#: The kernel of each ``MetricInfo.kernel`` name.
KERNELS: dict[str, Kernel] = {
    "precision_at_k": precision_at_k,
    "recall_at_k": recall_at_k,
    "r_precision": r_precision,
    "map_at_r": map_at_r,
    "map_at_k": map_at_k,
    "map": average_precision,
    "minp": inverse_negative_penalty,
    "mrr": reciprocal_rank,
    "custom": custom_metric,
}


class NoTies:
    """The :class:`TieFinder` of rows without a block of equal keys that mixes relevant and
    non-relevant items: no value depends on the order of ties, so no query is flagged."""

    def __init__(self, n_rows: int) -> None:
        self.n_rows = n_rows

    def _none(self, *args: object) -> np.ndarray:
        return np.zeros(self.n_rows, dtype=bool)

    straddle = within = hit_rate_changes = can_pull_in = one_inside = _none


class TieFinder:
    """Finds blocks of equal keys that mix relevant and non-relevant references.

    ``straddle(w)``: such a block holds positions w-1 and w (it is cut by a window of w items),
    so a count over the first w items depends on the tie order: with r relevant and n
    non-relevant items in the block (both >= 1) and c = w - a of its items inside the window
    (1 <= c < r + n), some order puts min(c, r) relevant items inside and another only
    max(0, c - n), and min(c, r) > max(0, c - n) always.  ``hit_rate_changes(w)``: the hit rate
    over the first w items (Recall@w) depends on the order only when, besides, no relevant item
    precedes the block and the block holds at least c non-relevant items (enough to fill its
    part of the window).  ``within(w)``: such a block intersects the first w items, so a
    rank-weighted value (AP, RR) depends on the tie order.

    Every backend hands over whole tie blocks (an exact tie at the last kept key is kept in
    full, approximate lists drop a block faiss may have cut), so a block's counts are exact.
    """

    def __init__(self, block: Candidates, rel: np.ndarray) -> None:
        self.block = block
        b = block.counts.size
        equal = block.bits[1:] == block.bits[:-1]
        boundaries = block.lims[1:-1] - 1
        equal[boundaries[(boundaries >= 0) & (boundaries < equal.size)]] = False
        # Pairs (i, i+1) of equal keys are rare: work on their sparse positions.  A run of
        # consecutive pair positions is one tie block.
        pairs = np.flatnonzero(equal)
        self.any = pairs.size > 0
        if not self.any:
            return
        new_run = np.diff(pairs) != 1
        run = np.concatenate(([0], np.cumsum(new_run)))
        # Flat position of each block's first and last item, indexed by run id.
        self.run_first = pairs[np.concatenate(([True], new_run))]
        self.run_last = pairs[np.concatenate((new_run, [True]))] + 1
        mixed = rel[pairs] != rel[pairs + 1]
        self.mixed_runs = np.unique(run[mixed])
        mixed_pairs = pairs[mixed]
        pair_row = np.searchsorted(block.lims, mixed_pairs, side="right") - 1
        self.first_mixed = np.full(b, np.iinfo(np.int64).max // 2)
        np.minimum.at(self.first_mixed, pair_row, mixed_pairs - block.lims[pair_row])

    @classmethod
    def from_runs(
        cls, block: Candidates, run_first: np.ndarray, run_last: np.ndarray, first_mixed: Any
    ) -> TieFinder:
        """The finder of rows known only by their mixed tie blocks (no candidate list): flat
        positions of each block's first and last item (disjoint, increasing) in the frame
        ``block`` (its ``lims``), and per row the rank of its first mixed pair of neighbours.

        >>> frame = Candidates(np.arange(1), np.array([0, 6]), np.zeros(0, int), np.zeros(0))
        >>> t = TieFinder.from_runs(frame, np.array([2]), np.array([4]), np.array([3]))
        >>> t.straddle(np.array([3])).tolist(), t.within(np.array([2])).tolist()
        ([True], [False])
        """
        self = cls.__new__(cls)
        self.block = block
        self.any = bool((run_last > run_first).any())
        self.run_first, self.run_last = run_first, run_last
        self.mixed_runs = np.arange(run_first.size)
        self.first_mixed = np.asarray(first_mixed)
        return self

    def _cut(self, window: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows whose first ``window`` items end inside a mixed tie block, and that block's run."""
        counts = self.block.counts
        rows = np.flatnonzero((window >= 1) & (window < counts))
        at = self.block.lims[rows] + window[rows] - 1
        # the run (blocks are disjoint and increasing) holding the pair (at, at + 1), if any
        runs = np.searchsorted(self.run_first, at, side="right") - 1
        tied = (runs >= 0) & (at < self.run_last[np.maximum(runs, 0)])
        rows, runs = rows[tied], runs[tied]
        mixed = np.isin(runs, self.mixed_runs)
        return rows[mixed], runs[mixed]

    def straddle(self, window: np.ndarray) -> np.ndarray:
        out = np.zeros(self.block.counts.size, dtype=bool)
        if self.any:
            out[self._cut(window)[0]] = True
        return out

    def hit_rate_changes(
        self, window: np.ndarray, hit: np.ndarray, row_start: np.ndarray
    ) -> np.ndarray:
        """``hit``: flat positions of the relevant candidates (increasing); ``row_start``: index
        in ``hit`` of each row's first one."""
        out = np.zeros(self.block.counts.size, dtype=bool)
        if not self.any:
            return out
        rows, runs = self._cut(window)
        first, last = self.run_first[runs], self.run_last[runs]
        hits_before_block = np.searchsorted(hit, first) - row_start[rows]
        relevant_in_block = np.searchsorted(hit, last, side="right") - np.searchsorted(hit, first)
        non_relevant = last - first + 1 - relevant_in_block
        inside = self.block.lims[rows] + window[rows] - first  # block items within the window
        out[rows] = (hits_before_block == 0) & (non_relevant >= inside)
        return out

    def one_inside(self, window: np.ndarray) -> np.ndarray:
        """Rows whose first ``window`` items cut a mixed block after its first item."""
        out = np.zeros(self.block.counts.size, dtype=bool)
        if self.any:
            rows, runs = self._cut(window)
            one = self.block.lims[rows] + window[rows] - 1 == self.run_first[runs]
            out[rows[one]] = True
        return out

    def within(self, window: np.ndarray) -> np.ndarray:
        if not self.any:
            return np.zeros(self.block.counts.size, dtype=bool)
        return (self.first_mixed + 1 < window) | self.straddle(window)

    def can_pull_in(self, window: np.ndarray, hit: np.ndarray, last: np.ndarray) -> np.ndarray:
        """Rows whose first ``window`` items cut a mixed block that holds the row's last
        relevant item (1-based rank ``last``) and has room inside the window for every relevant
        item it holds: another order would bring all relevant items within the window."""
        out = np.zeros(self.block.counts.size, dtype=bool)
        if not self.any:
            return out
        rows, runs = self._cut(window)
        first, end = self.run_first[runs], self.run_last[runs]
        relevant_in_block = np.searchsorted(hit, end, side="right") - np.searchsorted(hit, first)
        inside = self.block.lims[rows] + window[rows] - first
        holds_last = self.block.lims[rows] + last[rows] - 1 <= end
        out[rows] = holds_last & (relevant_in_block <= inside)
        return out
