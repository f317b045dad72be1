"""Per-query retrieval metric kernels over sorted candidate rows.

Each kernel sees one chunk of queries: the packed, sorted candidates of :mod:`embedeval.knn`
(nearest first, ties by ascending reference index), the query labels, R_q (relevant references
each query can see) and n_valid (references each query can see).  Everything is vectorised over
the chunk; values are float64 and NaN for lone queries (R_q = 0).

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
  window.
"""

from __future__ import annotations

import numpy as np

from ._candidates import Candidates
from ._registry import MetricInfo
from .custom import call_metric, relevance_matrix

__all__ = ["chunk_metrics", "needed_depth"]


def needed_depth(
    metrics: list[MetricInfo], relevant: np.ndarray, k: int | None
) -> tuple[np.ndarray, str | None]:
    """Depth (ranked items, +1 to see a tie at the cut-off) each query needs, and whether a
    label-based threshold is needed (``"max"`` for full-depth MAP, ``"min"`` for MRR)."""
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


def chunk_metrics(
    block: Candidates,
    query_codes: np.ndarray,
    reference_codes: np.ndarray,
    relevant: np.ndarray,
    n_valid: np.ndarray,
    metrics: list[MetricInfo],
    k: int | None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per-query values and tie flags for one block of sorted candidates (CSR form).

    Only two passes touch every candidate (label lookup and comparison); everything else works
    on the relevant candidates alone: for each one, its row, its 0-based position ``pos`` in the
    ranking and ``found`` = relevant items up to and including it, so that P@(pos+1) =
    found / (pos + 1).
    """
    counts = block.counts
    lims = block.lims
    b = counts.size
    rel = reference_codes[block.index] == np.repeat(query_codes, counts)
    # Relevant candidates, in row order and ranking order within a row (``hit`` is increasing).
    hit = np.flatnonzero(rel)
    row_start = np.searchsorted(hit, lims[:-1])
    n_hits = np.diff(np.append(row_start, hit.size))
    hit_pos = hit - np.repeat(lims[:-1], n_hits)
    found = np.arange(1, hit.size + 1) - np.repeat(row_start, n_hits)
    lone = relevant == 0
    safe_r = np.maximum(relevant, 1)
    depth_cap = n_valid if k is None else np.minimum(n_valid, k)
    ties = _TieFinder(block, rel)
    weights = None

    def hits_within(window: np.ndarray) -> np.ndarray:
        # Hits of a row are contiguous and increasing, so those inside a window are a prefix.
        return np.searchsorted(hit, lims[:-1] + np.minimum(window, counts)) - row_start

    def weighted_within(window: np.ndarray) -> np.ndarray:
        nonlocal weights
        if weights is None:  # P@i at each relevant position i, summed in order per row
            weights = np.append(found / (hit_pos + 1.0), 0.0)
        end = row_start + hits_within(window)
        bounds = np.empty(2 * b, dtype=np.int64)
        bounds[0::2], bounds[1::2] = row_start, end
        sums = np.add.reduceat(weights, bounds)[0::2]
        return np.where(end > row_start, sums, 0.0)

    values: dict[str, np.ndarray] = {}
    flags: dict[str, np.ndarray] = {}
    for m in metrics:
        if m.kind != "knn":
            continue
        if m.function is not None:
            window = _custom_window(m, relevant, n_valid, depth_cap, hit_pos, row_start, n_hits, k)
            hit_row = np.repeat(np.arange(b), n_hits)
            value = np.full(b, np.nan)
            live = ~lone
            matrix = relevance_matrix(hit_row, hit_pos, np.where(live, window, 0), b)
            value[live] = call_metric(m.function, m.name, matrix[live], relevant[live])
            tie = ties.within(window)
        elif m.depth in ("one", "fixed"):
            window = np.minimum(m.cutoff, n_valid)
            n_found = hits_within(window)
            if m.name.startswith("recall"):
                value = (n_found > 0).astype(np.float64)
                tie = ties.hit_rate_changes(window, hit, row_start)
            else:
                value = n_found / m.cutoff
                tie = ties.straddle(window)
        elif m.name == "r_precision":
            window = relevant if k is None else np.minimum(relevant, k)
            value = hits_within(window) / np.maximum(window, 1)
            tie = ties.straddle(window)
        elif m.name == "map_at_r":
            window = relevant if k is None else np.minimum(relevant, k)
            value = weighted_within(window) / safe_r
            tie = ties.within(window)
        elif m.name == "map":
            if k is None:
                # Every relevant reference is among the candidates: the window ends at the last.
                window = np.zeros(b, dtype=np.int64)
                has = n_hits > 0
                window[has] = hit_pos[row_start[has] + n_hits[has] - 1] + 1
            else:
                window = depth_cap
            value = weighted_within(window) / safe_r
            tie = ties.within(window)
        elif m.name == "minp":
            # INP = R_q / rank of the last relevant reference; an int k that hides it gives 0.
            last = np.zeros(b, dtype=np.int64)
            has = n_hits > 0
            last[has] = hit_pos[row_start[has] + n_hits[has] - 1] + 1
            # The engine may hold candidates past k (a tie block at the cut): count the last
            # relevant item only within the cap.
            complete = has & (n_hits >= relevant) & (last <= depth_cap)
            value = np.where(complete, relevant / np.maximum(last, 1), 0.0)
            # Only the tie block holding the last relevant item can move it.
            tie = np.where(complete, ties.straddle(last) | ties.straddle(last - 1), False)
        elif m.name == "mrr":
            first = np.full(b, np.iinfo(np.int64).max)
            has = n_hits > 0
            first[has] = hit_pos[row_start[has]]
            in_reach = first < depth_cap
            value = np.where(in_reach, 1.0 / (np.minimum(first, depth_cap) + 1.0), 0.0)
            tie = ties.within(np.where(in_reach, first + 1, depth_cap))
        else:  # pragma: no cover - the registry only produces the names above
            raise AssertionError(m.name)
        value = np.asarray(value, dtype=np.float64)
        value[lone] = np.nan
        values[m.name] = value
        flags[m.name] = tie & ~lone
    return values, flags


def _custom_window(
    m: MetricInfo,
    relevant: np.ndarray,
    n_valid: np.ndarray,
    depth_cap: np.ndarray,
    hit_pos: np.ndarray,
    row_start: np.ndarray,
    n_hits: np.ndarray,
    k: int | None,
) -> np.ndarray:
    """How many ranked items a custom metric sees per query (its depth, capped by k)."""
    if m.depth == "fixed":
        return np.minimum(m.cutoff, n_valid)
    if m.depth == "r":
        return relevant if k is None else np.minimum(relevant, k)
    if k is not None:
        return depth_cap
    # The whole ranking: every relevant reference is a candidate; after the last one only
    # non-relevant items follow, so the window may end there without losing information.
    window = np.zeros(relevant.shape, dtype=np.int64)
    has = n_hits > 0
    window[has] = hit_pos[row_start[has] + n_hits[has] - 1] + 1
    return window


class _TieFinder:
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
        self.pairs = np.flatnonzero(equal)
        self.any = self.pairs.size > 0
        if not self.any:
            return
        new_run = np.diff(self.pairs) != 1
        self.run = np.concatenate(([0], np.cumsum(new_run)))
        # Flat position of each block's first and last item, indexed by run id.
        self.run_first = self.pairs[np.concatenate(([True], new_run))]
        self.run_last = self.pairs[np.concatenate((new_run, [True]))] + 1
        mixed = rel[self.pairs] != rel[self.pairs + 1]
        self.mixed_runs = np.unique(self.run[mixed])
        mixed_pairs = self.pairs[mixed]
        pair_row = np.searchsorted(block.lims, mixed_pairs, side="right") - 1
        self.first_mixed = np.full(b, np.iinfo(np.int64).max // 2)
        np.minimum.at(self.first_mixed, pair_row, mixed_pairs - block.lims[pair_row])

    def _cut(self, window: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows whose first ``window`` items end inside a mixed tie block, and that block's run."""
        counts = self.block.counts
        rows = np.flatnonzero((window >= 1) & (window < counts))
        at = self.block.lims[rows] + window[rows] - 1
        where = np.minimum(np.searchsorted(self.pairs, at), self.pairs.size - 1)
        tied = self.pairs[where] == at
        rows, runs = rows[tied], self.run[where[tied]]
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

    def within(self, window: np.ndarray) -> np.ndarray:
        if not self.any:
            return np.zeros(self.block.counts.size, dtype=bool)
        return (self.first_mixed + 1 < window) | self.straddle(window)
