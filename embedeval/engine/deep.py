"""Deep rankings from the ranks of the relevant references alone.

Full-depth average precision, the inverse negative penalty and every window metric need, per
query, only the rank of each relevant reference: AP = sum over relevant ranks i of
found(i) / i, divided by R_q.  When rankings are deep (the last relevant reference is, for most
queries, a large part of the way down the whole reference set) the candidate engine of
:mod:`embedeval.engine.exact` extracts, packs into 64-bit codes and sorts nearly every key of
every row.  This engine instead, for each block of queries:

1. computes the block's whole-row filter keys (:func:`filter_precision`: float32 keys rounded
   from a float64 product where the rows fit; identical references share one key; excluded
   pairs are ``+inf``), with the candidate engine's plan and block layout;
2. replaces the lowest bit of each key's sortable 32-bit form by the reference's relevance
   (:func:`flagged_keys`) and sorts each row up to its farthest relevant key: the keys fall
   in float32 order to within one unit in the last place, and the flags show where the
   relevant ones landed, so the non-relevant entries before a relevant one are its *N*, the
   non-relevant references ahead of it (no reference index is sorted, and nothing searched);
3. checks each relevant key's band (twice the float32 keys' error bound, widened by the bit
   the flag replaced; :func:`_item_bands`) against the non-relevant keys next to it in the
   sorted row (:func:`_near_items`): with none inside, its *N* is exact;
4. ranks each row in float64 (:mod:`embedeval.engine.decide`) from *N* alone: the ``j``-th
   relevant reference in float64 order has rank ``j + N_j`` and ``N`` never decreases along
   the order, so the ranks are ``sort(N) + (0, 1, ...)``.  For a *near miss*, ``N`` counts
   the non-relevant keys below the band and the band members that precede it in float64
   (:func:`_band_members` finds the near misses and the members in the key matrix,
   :func:`embedeval.engine.decide.float64_keys` orders them); a near miss whose band holds
   only identical copies of its own row is counted from their indices (:func:`_twin_items`);
5. scores the ranks with :func:`embedeval.engine.kernels.hits_from_ranks`; where a relevant
   and a non-relevant reference have equal float64 keys, the non-relevant ones of smaller
   index count as ahead, and the run of equal keys is handed to the kernels' tie finder
   (:func:`_tie_blocks`), which flags the metrics whose value the tie order could change.

Values and tie flags are bit-identical to the candidate engine's: both rank by float64 keys
with ties by reference index, and the same kernels sum in rank order.  :func:`deep_applies`
says when it is the faster of the two.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..utils.progress import progress_bar
from .candidates import from_sortable_bits, rows_searchsorted, sortable_bits, spans
from .decide import (
    FLOAT64_MAX_DIM,
    float64_key_bounds,
    float64_keys,
    key_bounds,
    key_magnitude,
    rounding_of,
    row_keys,
    task_norms,
    widen,
)
from .duplicates import DuplicateRows
from .exact import (
    KEY_MAX,
    EnginePlan,
    PreparedSearch,
    grid_keys,
    plan_search,
    tied_search,
)
from .integers import exact_in_float32, ranks_of_exact_keys
from .kernels import hits_from_ranks, score_hits
from .labels import match_matrix
from .task import RetrievalTask, ScoredBlock
from .threads import in_order, single_threaded_blas

#: Mean R_q above n_reference / _FEW keeps the candidate engine (see deep_applies).
_FEW = 5
#: The mask that clears the flag of :func:`flagged_keys` (their lowest bit).
_EVEN = np.uint32(0xFFFFFFFE)
#: Sortable bits of the largest finite float32 (a cut-off under which every valid key lies) and
#: of ``-inf`` (below every key), and the padding of compacted rows (above every key, no flag).
_ALL = sortable_bits(np.array([KEY_MAX]))[0]
_NEG_INF_BITS = sortable_bits(np.array([-np.inf]))[0]
_PAD = np.uint32(0xFFFFFFFE)
#: Where a uint32's lowest byte lies in memory.
_LOW_BYTE = 0 if sys.byteorder == "little" else 3
#: The mask that clears the lowest bit of a float64's significand, and where that bit's byte
#: lies in memory (:func:`flagged_ranks`).
_CLEAR_FLAG64 = np.uint64(0xFFFFFFFFFFFFFFFE)
_LOW_BYTE64 = 0 if sys.byteorder == "little" else 7

__all__ = [
    "BlockRows",
    "KeyedSearch",
    "RelevantRanks",
    "deep_applies",
    "deep_blocks",
    "deep_range_blocks",
    "flagged_keys",
    "flagged_ranks",
    "relative_band",
    "relevant_ranks",
    "score_ranks",
]


@dataclass(frozen=True)
class RelevantRanks:
    """The relevant references of a block of query rows located in their whole rankings.

    Per block-relative row, the float64 ranks of its relevant references are ``hit_pos``
    (``n_hits`` per row, increasing within a row; equal float64 keys ranked by reference
    index).  ``blocks`` describes the runs of equal float64 keys that mix relevant and
    non-relevant references, as :func:`embedeval.engine.kernels.hits_from_ranks` takes them:
    ``(row, first rank, last rank, per row the first rank of its first such run)``.
    """

    n_hits: np.ndarray
    hit_pos: np.ndarray
    blocks: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def deep_applies(task: RetrievalTask) -> bool:
    """Whether the local engine ranks ``task`` here: full-depth AP / mINP (the label
    threshold ``"max"``, ``k=None``), where the candidate engine packs and sorts nearly every
    key of every row, with relevant references at most 1/:data:`_FEW` of the references (mean
    R_q).

    Measured, each engine on the same task in one process (CPU seconds, one thread, on a loaded
    two-core machine; values identical): hashing shaped, 600 queries x 50,000 (d=64) in 10
    classes (R_q about 5,000) 10.0 s against 11.6 s; the same rows with labels drawn at random
    from 20 classes (R_q about 2,500) 10.0 s against 13.5 s, from 5 classes (R_q about 10,000)
    22.8 s against 25.0 s; wall-clock on two threads, 1,000 queries, 16.5 s against 21.6 s (10
    classes) and 21.4 s against 22.9 s (20 random classes).  Near misses (a non-relevant key
    within the float32 keys' error bound of a relevant one) are ranked in place, so thousands
    of relevant keys per row no longer send rows back to the candidates.  Deep windows without
    a full-depth metric (MAP@R over a few large classes) keep the candidate engine, and so does
    MRR alone (it reads up to the first hit).
    """
    if not task.has_work or task.depth()[1] != "max":
        return False
    return float(task.relevant.mean()) * _FEW <= int(task.reference.shape[0])


def flagged_keys(keys: np.ndarray, relevant: np.ndarray, step: int = 1 << 14) -> np.ndarray:
    """The sortable bits of float32 ``keys`` (:func:`~embedeval.engine.candidates.sortable_bits`:
    unsigned order is float order, ``-0.0`` is ``0.0``) with the lowest bit replaced by
    ``relevant``.

    Sorting them sorts the keys to within one unit in the last place and shows, by the flag,
    where each relevant key landed.  A key of bits ``k`` becomes ``k & ~1 | flag``: a relevant
    key's own bits are its flagged bits or the ones below, a non-relevant key's its flagged
    bits or the ones above, so a flagged non-relevant key lies below an even ``t`` exactly when
    its key does.  Formed in cache-sized pieces of ``step`` keys.

    >>> k = np.array([[1.0, 2.0, -1.0, 1.0]], np.float32)
    >>> s = flagged_keys(k, np.array([[True, False, False, False]]))
    >>> (s & 1).tolist(), np.argsort(s, kind="stable").tolist()
    ([[1, 0, 0, 0]], [[2, 3, 0, 1]])
    """
    out = np.empty(keys.shape, dtype=np.uint32)
    src, rel, dst = keys.reshape(-1), relevant.reshape(-1), out.reshape(-1)
    sign = np.empty(min(step, dst.size), dtype=np.int32)
    for a in range(0, dst.size, step):
        bits = dst[a : a + step]
        np.add(src[a : a + step], np.float32(0.0), out=bits.view(np.float32))  # -0.0 is 0.0
        flip = sign[: bits.size]
        np.right_shift(bits.view(np.int32), 31, out=flip)  # all ones for negative keys
        flip |= np.int32(-(2**31))
        flip &= np.int32(-2)
        bits &= _EVEN
        bits ^= flip.view(np.uint32)
        bits |= rel[a : a + step]
    return out


def _farthest_relevant(keys: np.ndarray, relevant: np.ndarray) -> np.ndarray:
    """Per row, the largest key of a relevant reference (``-inf`` where there is none)."""
    b, n = keys.shape
    flat = np.flatnonzero(relevant)
    out = np.full(b, -np.inf, dtype=np.float32)
    if flat.size:
        per_row = np.bincount(flat // n, minlength=b)
        has = per_row > 0
        first = (np.cumsum(per_row) - per_row)[has]
        out[has] = np.maximum.reduceat(keys.reshape(-1)[flat], first)
    return out


def _flag_bytes(sorted_rows: np.ndarray) -> np.ndarray:
    """The flags of flagged keys (:func:`flagged_keys`), one bool per key: their lowest bytes."""
    low = sorted_rows.reshape(-1).view(np.uint8)[_LOW_BYTE::4]
    return np.bitwise_and(low, np.uint8(1)).view(bool)


@dataclass(frozen=True)
class BlockRows:
    """What the float64 decision of a block's near misses reads: the float32 rows its keys
    were formed from (``xq``, ``xb``: the task's query and reference rows), the distance, and
    the block's first query (``start``: block row ``i`` is query ``start + i``)."""

    xq: Any
    xb: Any
    distance: str
    start: int


def relevant_ranks(
    plan: EnginePlan,
    keys: np.ndarray,
    query_codes: np.ndarray,
    reference_codes: np.ndarray,
    tau: np.ndarray,
    need: np.ndarray,
    band: np.ndarray,
    rows: BlockRows,
    e64: np.ndarray | None = None,
    groups: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> RelevantRanks:
    """The :class:`RelevantRanks` of a block of query rows from their whole-row ``keys`` (valid
    keys finite, excluded pairs ``+inf``) and label codes (:mod:`embedeval.engine.labels`).

    The keys are sorted as :func:`flagged_keys`, whose lowest bit says which references are
    relevant, and only up to a per-row cut-off: ``tau`` (a depth threshold, see
    :func:`embedeval.engine.exact.depth_thresholds`), raised under the label threshold
    (``plan.threshold``) to the row's farthest relevant key; a row with fewer than ``need``
    keys under it is sorted whole.  Relevant references past the cut-off lie past every
    window a kernel reads, and are left out.

    The ``j``-th relevant reference of a row in float64 order has rank ``j + N_j``, ``N_j`` the
    non-relevant references ahead of it; ``N`` never decreases along the order, so the ranks
    are ``sort(N) + (0, 1, ...)``.  ``band`` (per row) is twice the bound on a float32 key's
    distance from its float64 key (:func:`embedeval.engine.decide.key_bounds`): a relevant key
    with no non-relevant key within its band (:func:`_near_items`) takes ``N`` from its place
    in the sorted row (the non-relevant entries before it); for a *near miss*, ``N`` is the
    count below its band plus the non-relevant references in the band that precede it in
    float64 (:func:`_band_ahead`).  Keys rounded once from a float64 product (``e64``: per
    row, the float64 keys' own error, see :func:`relative_band`) take the narrower of
    ``band`` and a band relative to the key.  A relevant reference whose float64 key equals
    that of non-relevant ones counts those of smaller index as ahead of it, and their run of
    equal keys is reported (:func:`_tie_blocks`) for the kernels' tie flags.  A near miss
    whose band holds only identical copies of its own reference row is counted from the
    copies' indices, with no float64 key (:func:`_twin_items`; ``groups``: the identical rows
    of :func:`_twin_groups`, formed once per search).
    """
    b = keys.shape[0]
    relevant = match_matrix(query_codes, reference_codes)
    relevant &= keys <= KEY_MAX
    cut = np.minimum(tau, KEY_MAX).astype(np.float32)
    if plan.threshold == "max":
        np.maximum(cut, _farthest_relevant(keys, relevant), out=cut)
    sorted_rows, cut = _sorted_rows(keys, relevant, cut, need)
    width = sorted_rows.shape[1]
    at_flag = np.flatnonzero(_flag_bytes(sorted_rows))
    lims = np.searchsorted(at_flag, np.arange(b + 1) * width)
    n_items = np.diff(lims)
    row = np.repeat(np.arange(b), n_items)
    row_first = np.repeat(lims[:-1], n_items)
    pos = at_flag - row * width
    ahead = pos - (np.arange(row.size) - row_first)  # non-relevant entries before each item
    item_bits = sorted_rows.ravel()[at_flag]
    lo_bits, hi_bits = _item_bands(item_bits, band[row], None if e64 is None else e64[row])
    near = _near_items(sorted_rows, (row, pos, at_flag), lo_bits, hi_bits, cut)
    ties = None
    done = _crowded_rows(keys, relevant, row, near, rows)
    if done is not None:  # rows ranked from float64 keys of the whole row
        dense_rows, n_ahead = done
        in_dense = np.isin(row, dense_rows)
        ahead[in_dense] = n_ahead
        near &= ~in_dense
    twins = None
    if near.any() and groups is not None and groups[0].size:
        twins = _twin_items(
            groups, keys, relevant, (sorted_rows, cut), (row, pos, row_first, item_bits), near,
            (lo_bits, hi_bits),
        )  # fmt: skip
        if twins is not None:
            ahead[twins[0]] = twins[1] + twins[2]
            near[twins[0]] = False
            ties = twins
    if near.any():
        at = np.flatnonzero(near)
        below, (i_row, i_ref, i_bits, i_lo), members = _near_members(
            keys, relevant, sorted_rows, (row, row_first, item_bits), at, (lo_bits, hi_bits)
        )
        strict, before, n_equal, k_item = _band_ahead(
            i_row, i_ref, i_bits, i_lo, members, rows, keys.shape
        )
        # The items of a near miss's flagged key are listed, in both orders, as a run of
        # that (row, flagged key): any pairing within the run gives each row the same N.
        ahead[at] = below + strict + before
        tied = n_equal > 0
        if tied.any():
            t = at[tied]
            ties = (t, below[tied] + strict[tied], before[tied], n_equal[tied], k_item[tied])
            ties += (np.full(t.size, -1),)  # no group: runs of float64 keys
            if twins is not None:
                ties = tuple(np.concatenate(pair) for pair in zip(twins, ties, strict=True))
    # sort(N) per row: one sort of (row, N) codes.  Rows are sorted already and N follows the
    # float32 order but for near misses, so the codes are nearly sorted: a merge sort runs
    # through them (measured 0.1 ms against 6.9 ms for quicksort on 150,000 codes).
    span = int(ahead.max(initial=0)) + 2
    code = np.sort(row.astype(np.int64) * span + ahead, kind="stable")
    hit_pos = code - row * span + np.arange(row.size) - row_first
    blocks = _tie_blocks(row, code, span, ties, b)
    return RelevantRanks(n_items, hit_pos, blocks)


def _tie_blocks(
    row: np.ndarray, code: np.ndarray, span: int, ties: tuple | None, b: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The runs of equal float64 keys mixing relevant and non-relevant references of ``b``
    rows (relevant items by ``row``; ``code`` the sorted ``row * span + N`` of every item,
    ``N`` its non-relevant references ahead), from the tied items ``ties = (item, strict,
    before, n_equal, key, group)``: non-relevant references with a smaller key, of the same
    key and a smaller index, of the same key, the key, and the group of identical rows
    whose members alone form the run (:func:`_twin_items`: its key is the float32 one, on
    another scale than the float64 keys, and no other reference shares it), or -1.

    A run of key ``K`` holding items ``I`` and ``n_equal`` non-relevant references starts at
    rank ``strict + (relevant references with a key below K)``; those are the items with
    ``N <= strict`` (non-decreasing along the ranking) less the run's items with
    ``before = 0`` (the run's leading relevant references).  It ends ``|I| + n_equal - 1``
    ranks later."""
    first_mixed = np.full(b, np.iinfo(np.int64).max // 2)  # per row; this value: no run
    if ties is None:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty, first_mixed
    item, strict, before, n_equal, key, group = ties
    order = np.lexsort((group, key, row[item]))
    item, strict, before, n_equal, key, group = (
        a[order] for a in (item, strict, before, n_equal, key, group)
    )
    r = row[item]
    new = (r[1:] != r[:-1]) | (key[1:] != key[:-1]) | (group[1:] != group[:-1])
    head = np.flatnonzero(np.append(True, new))
    size = np.diff(np.append(head, item.size))
    leading = np.add.reduceat((before == 0).astype(np.int64), head)
    up_to = np.searchsorted(code, r[head] * span + strict[head], side="right")
    first = strict[head] + up_to - np.searchsorted(code, r[head] * span) - leading
    last = first + size + n_equal[head] - 1
    at = np.lexsort((first, r[head]))
    block_row, first, last = r[head][at], first[at], last[at]
    np.minimum.at(first_mixed, block_row, first)
    return block_row, first, last, first_mixed


#: A row ranks from float64 keys of every reference when its near misses number at least
#: 1/_CROWDED_RATIO of the references (and _CROWDED_MIN): measured on the hashing-shaped case
#: (4,000 near misses of 5,000 relevant among 50,000), one thread, 300 queries: 3.1 s against
#: 4.7 s band by band; full-depth MAP over 100 classes (at most 99 near misses among 10,000)
#: was 8 % slower whole-row, so it keeps the bands.
_CROWDED_RATIO, _CROWDED_MIN = 16, 64


def _crowded_rows(
    keys: np.ndarray, relevant: np.ndarray, row: np.ndarray, near: np.ndarray, rows: BlockRows
) -> tuple[np.ndarray, np.ndarray] | None:
    """Rows with many near misses (thousands of relevant keys per row, most with non-relevant
    keys inside their float32 band), ranked from float64 product keys of
    the whole row (:func:`embedeval.engine.decide.row_keys`) instead of band by band: one
    float64 product and one sort per row.  Returns the rows and, for their relevant items in
    ``row`` order, counts ``N`` of non-relevant references ahead (as a multiset per row, which
    is all the ranks need), or None.  Neighbours closer than ``2 beta`` take the fixed-order
    keys (:func:`_fixed_order_runs`); a row where a relevant and a non-relevant reference then
    tie exactly is left to the band-by-band path, whose candidates flag the tie."""
    n_items = np.bincount(row, minlength=keys.shape[0])
    n_near = np.bincount(row[near], minlength=keys.shape[0])
    enough = np.maximum(_CROWDED_MIN, keys.shape[1] / _CROWDED_RATIO)
    crowded = np.flatnonzero(n_near >= enough)
    if not crowded.size or keys.shape[1] * rows.xb.shape[1] * 8 > 256 << 20:
        return None
    g, beta = row_keys(rows.xq, rows.xb, rows.start + crowded, rows.distance)
    g[keys[crowded] > KEY_MAX] = np.inf  # excluded pairs rank last, never counted
    # Any order among equal product keys: runs closer than 2 beta are re-sorted by (fixed-order
    # key, reference) below, and equal keys of different kinds send the row elsewhere.
    order = np.argsort(g, axis=1)
    g = np.take_along_axis(g, order, axis=1)
    rel = np.take_along_axis(relevant[crowded], order, axis=1)
    _fixed_order_runs(g, order, rel, beta, crowded, rows)
    tied = ((g[:, 1:] == g[:, :-1]) & (rel[:, 1:] != rel[:, :-1])).any(axis=1)
    # every relevant item of the row must be one of row's items (none past a cut-off)
    ok = ~tied & (rel.sum(axis=1) == n_items[crowded])
    if not ok.any():
        return None
    r, pos = np.nonzero(rel[ok])
    j = np.arange(r.size) - np.searchsorted(r, r)  # the item's place among its row's relevant
    return crowded[ok], pos - j


def _fixed_order_runs(
    g: np.ndarray,
    order: np.ndarray,
    rel: np.ndarray,
    beta: np.ndarray,
    crowded: np.ndarray,
    rows: BlockRows,
) -> None:
    """In place: runs of a crowded row's sorted product keys ``g`` closer than ``2 beta``
    re-scored (:func:`embedeval.engine.decide.float64_keys`: the fixed-order keys wherever the
    kinds meet) and re-sorted by (key, reference), with ``order`` (reference of each position)
    and ``rel`` following; other neighbours are already in their fixed-order order."""
    with np.errstate(invalid="ignore"):
        close = np.diff(g, axis=1) <= 2.0 * beta[:, None]
    flag = np.zeros(g.shape, dtype=bool)
    flag[:, 1:] |= close
    flag[:, :-1] |= close
    r, c = np.nonzero(flag)
    if not r.size:
        return
    start = np.ones(r.size, dtype=bool)
    start[1:] = (r[1:] != r[:-1]) | ~close[r[1:], np.maximum(c[1:] - 1, 0)]
    ref, kind = order[r, c], rel[r, c]
    exact = float64_keys(rows.xq, rows.xb, rows.start + crowded[r], ref, r, rows.distance, kind)
    at = np.lexsort((ref, exact, np.cumsum(start)))
    order[r, c], g[r, c], rel[r, c] = ref[at], exact[at], kind[at]


def _codes(row: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """``(row, sortable float32 key bits)`` as one sortable 64-bit code."""
    return (row.astype(np.uint64) << np.uint64(32)) | bits.astype(np.uint64)


def _item_bands(
    item_bits: np.ndarray, band: np.ndarray, e64: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Per relevant item (its :func:`flagged_keys` bits), the sortable bits ``[lo, hi]`` of
    its band: every key whose float64 order against the item's may differ from their float32
    order lies in it.  The item's own key is its flagged key or the float below; ``band`` (and,
    given ``e64``, :func:`relative_band` of the larger of the two) is added on either side,
    rounded outwards.  ``lo`` is even, so a non-relevant key lies below it exactly when its
    flagged key does."""
    low = from_sortable_bits(item_bits - np.uint32(1))
    high = from_sortable_bits(item_bits)
    if e64 is not None:
        larger = np.where(np.abs(low) > np.abs(high), low, high)
        band = np.minimum(band, relative_band(larger, e64))
    lo = low.astype(np.float64) - band
    with np.errstate(over="ignore"):
        lo32 = lo.astype(np.float32)
    lo32 = np.where(lo32 > lo, np.nextafter(lo32, np.float32(-np.inf)), lo32)
    lo_bits = np.maximum(sortable_bits(lo32) & _EVEN, _NEG_INF_BITS)
    return lo_bits, sortable_bits(widen(high, band))


def _near_items(
    sorted_rows: np.ndarray,
    items: tuple[np.ndarray, np.ndarray, np.ndarray],
    lo_bits: np.ndarray,
    hi_bits: np.ndarray,
    cut: np.ndarray,
) -> np.ndarray:
    """Per relevant item, whether it is a near miss: a non-relevant key may lie in its band
    ``[lo_bits, hi_bits]`` (:func:`_item_bands`), or the band reaches past its row's sorted
    ``cut``.  ``items`` holds each item's row, place in its row and place in the flat
    ``sorted_rows``.  Only the non-relevant keys next to the item's run of flagged keys are
    read: the flagged order puts every other non-relevant key farther away."""
    row, pos, flat_at = items
    if not row.size:
        return np.zeros(0, dtype=bool)
    width = sorted_rows.shape[1]
    flat = sorted_rows.reshape(-1)
    start = np.ones(row.size, dtype=bool)
    start[1:] = (flat_at[1:] != flat_at[:-1] + 1) | (row[1:] != row[:-1])
    first = np.flatnonzero(start)
    last = np.append(first[1:], row.size) - 1
    run = np.cumsum(start) - 1
    below = np.where(pos[first] > 0, flat[np.maximum(flat_at[first] - 1, 0)], np.uint32(0))
    up = np.minimum(flat_at[last] + 1, flat.size - 1)
    above = np.where(pos[last] + 1 < width, flat[up], _PAD)
    return (below[run] >= lo_bits) | (above[run] <= hi_bits) | (hi_bits > cut[row])


def _twin_items(
    groups: tuple[np.ndarray, np.ndarray, np.ndarray],
    keys: np.ndarray,
    relevant: np.ndarray,
    sorted_cut: tuple[np.ndarray, np.ndarray],
    items: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    near: np.ndarray,
    bands: tuple[np.ndarray, np.ndarray],
) -> tuple[np.ndarray, ...] | None:
    """The near misses whose band holds nothing but identical copies of their own reference
    row (``groups``: :func:`_twin_groups`, whose members share one float32 key), decided
    without float64: identical rows have equal float64 keys, so of a group's
    non-relevant members exactly those of smaller index are ahead of a relevant one, and all
    of them tie with it.  As ``(item, N below the band, members ahead, members tied, key,
    group)`` (the ties of :func:`_tie_blocks`), or None.

    ``items`` are the relevant items' rows, places in their sorted rows, first items of
    their rows and flagged bits.  A row's group qualifies when it holds relevant and
    non-relevant valid members, no other group of the row has its flagged key, the row's
    items at that key are exactly its relevant members, and the band holds exactly its
    members (the band lies under the row's cut, so every key in it is sorted; the run from
    the non-relevant members, just before the items, to the last item lies in it, and the
    entries on either side of the run do not).  No other reference lies within the band,
    so no other key can equal theirs in float64: the run is the group's alone (its key is
    the float32 key, named apart from the float64 ones by the group).  The relevant members
    are paired with the items in index order (the ranks need ``N`` as a multiset per row)."""
    sorted_rows, cut = sorted_cut
    row, pos, row_first, item_bits = items
    mixed = _mixed_groups(groups, keys, relevant)
    if mixed is None:
        return None
    r, g, n_rel, n_non, shared = mixed
    code = _codes(r, (sortable_bits(shared) & _EVEN) | np.uint32(1))
    order = np.argsort(code, kind="stable")
    code, r, g, n_rel, n_non, shared = (a[order] for a in (code, r, g, n_rel, n_non, shared))
    clash = np.zeros(code.size, dtype=bool)  # two groups of a row with one flagged key
    clash[1:] = code[1:] == code[:-1]
    clash[:-1] |= clash[1:]
    item_code = _codes(row, item_bits)
    first = np.searchsorted(item_code, code)
    n_at = np.searchsorted(item_code, code, side="right") - first
    f = np.minimum(first, row.size - 1)
    lo, hi = bands[0][f], bands[1][f]
    ok = ~clash & (n_at == n_rel) & (n_at > 0) & (shared <= KEY_MAX) & near[f] & (hi <= cut[r])
    r, g, n_non, first, n_at, lo, hi, shared = (
        a[ok] for a in (r, g, n_non, first, n_at, lo, hi, shared)
    )
    # The band holds exactly the group when the entries from its non-relevant members (just
    # before the items: their flagged bits are one less) to the last item lie in it and the
    # entries on either side do not.
    width = sorted_rows.shape[1]
    start = pos[first] - n_non  # the row's entries below the band, if it qualifies
    after = pos[first] + n_at  # the entry after the items
    flat = sorted_rows.reshape(-1)
    at = r * width
    ok = (start >= 0) & (flat[at + np.maximum(start, 0)] >= lo)
    ok &= (start <= 0) | (flat[at + np.maximum(start - 1, 0)] < lo)
    ok &= (after >= width) | (flat[at + np.minimum(after, width - 1)] > hi)
    if not ok.any():
        return None
    r, g, n_non, first, n_at, start, shared = (
        a[ok] for a in (r, g, n_non, first, n_at, start, shared)
    )
    items_under = first - row_first[first]  # the row's items before these: below the band
    ahead = _copies_ahead(groups, relevant, keys, r, g)
    return (
        spans(first, n_at), np.repeat(start - items_under, n_at), ahead,
        np.repeat(n_non, n_at), np.repeat(shared.astype(np.float64), n_at), np.repeat(g, n_at),
    )  # fmt: skip


def _twin_groups(
    dups: DuplicateRows, reference_codes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The members of the groups of identical rows whose members' labels differ (only those
    can hold relevant and non-relevant members for a query), listed group by group (in
    index order within a group), and each group's first place and size in that list."""
    by_group = np.argsort(dups.group, kind="stable")
    members, group = dups.members[by_group], dups.group[by_group]
    codes = reference_codes[members].reshape(members.size, -1)  # label sets: several words
    other = np.zeros(members.size, dtype=bool)  # labelled unlike the member before it
    other[1:] = (group[1:] == group[:-1]) & (codes[1:] != codes[:-1]).any(axis=1)
    keep = np.isin(group, group[other])
    members, group = members[keep], group[keep]
    starts = np.flatnonzero(np.append(True, group[1:] != group[:-1])) if group.size else group
    return members, starts, np.diff(np.append(starts, members.size))


def _mixed_groups(
    groups: tuple[np.ndarray, np.ndarray, np.ndarray], keys: np.ndarray, relevant: np.ndarray
) -> tuple[np.ndarray, ...] | None:
    """Per row of a block, the groups of identical rows with relevant and non-relevant
    valid members: ``(row, group, relevant members, non-relevant members, shared key)`` (the
    valid members' key: the smallest of the group's keys, excluded members being ``+inf``;
    a group's first member may be excluded, the query itself), or None.
    ``groups``: :func:`_twin_groups`."""
    members, starts, size = groups
    rel = relevant[:, members]
    non = (keys[:, members] < np.inf) & ~rel
    # both counts from one sum: relevant members in the low 32 bits, the others above
    counts = np.add.reduceat(rel.astype(np.int64) + (non.astype(np.int64) << 32), starts, axis=1)
    n_rel, n_non = counts & 0xFFFFFFFF, counts >> 32
    r, g = np.nonzero((n_rel > 0) & (n_non > 0))
    if not r.size:
        return None
    m = size[g]
    shared = np.minimum.reduceat(
        keys[np.repeat(r, m), members[spans(starts[g], m)]], np.cumsum(m) - m
    )
    return r, g, n_rel[r, g], n_non[r, g], shared


def _copies_ahead(
    groups: tuple[np.ndarray, np.ndarray, np.ndarray],
    relevant: np.ndarray,
    keys: np.ndarray,
    r: np.ndarray,
    g: np.ndarray,
) -> np.ndarray:
    """For each (row ``r``, group ``g``) in turn, each relevant member (in index order): the
    group's valid non-relevant members of smaller index (``groups``: :func:`_twin_groups`)."""
    members, starts, size = groups
    m = size[g]
    seg = np.repeat(r, m)
    ref = members[spans(starts[g], m)]
    is_rel = relevant[seg, ref]
    is_non = (keys[seg, ref] < np.inf) & ~is_rel
    ahead = np.cumsum(is_non) - is_non
    ahead -= np.repeat(ahead[np.cumsum(m) - m], m)  # counted from each group's start
    return ahead[is_rel]


def _near_members(
    keys: np.ndarray,
    relevant: np.ndarray,
    sorted_rows: np.ndarray,
    items: tuple[np.ndarray, np.ndarray, np.ndarray],
    at: np.ndarray,
    bands: tuple[np.ndarray, np.ndarray],
) -> tuple[np.ndarray, tuple, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """For the near misses ``at`` (items given as row, index of the row's first item and
    flagged key bits; ``bands`` their :func:`_item_bands`): the non-relevant keys below each
    one's band; the near misses found again in ``keys`` as ``(row, reference, key bits, lower
    end of the band)`` sorted by (row, key, reference); and the non-relevant members of their
    bands (:func:`_band_members`).  The relevant references of one row and flagged key share a
    band and are near misses together."""
    row, row_first, item_bits = items
    lo_bits, hi_bits = bands
    item_code = _codes(row, item_bits)
    r, lo = row[at], lo_bits[at]
    relevant_below = np.searchsorted(item_code, _codes(r, lo)) - row_first[at]
    below = rows_searchsorted(sorted_rows, r, lo) - relevant_below
    g_code = item_code[at]
    g = at[np.append(True, g_code[1:] != g_code[:-1])]
    g_code = item_code[g]
    lo_key, hi_key = from_sortable_bits(lo_bits[g]), from_sortable_bits(hi_bits[g])
    m_row, m_ref, m_code, m_rel = _band_members(keys, relevant, row[g], lo_key, hi_key)
    flagged = m_code | np.uint64(1)
    j = np.minimum(np.searchsorted(g_code, flagged), g.size - 1)
    mine = m_rel & (g_code[j] == flagged)
    if int(mine.sum()) != at.size:  # every near miss lies in its own band
        raise RuntimeError("internal error: near misses not found in their bands")
    bits = (m_code[mine] & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    found = (m_row[mine], m_ref[mine], bits, lo_key[j[mine]])
    other = ~m_rel
    return below, found, (m_row[other], m_ref[other], m_code[other])


def relative_band(keys: np.ndarray, e64: np.ndarray) -> np.ndarray:
    """How far from float32 ``keys`` rounded once from float64 keys (each within ``e64`` of
    the fixed-order float64 key) another such key can lie and still be ordered differently in
    float64: ``W = (2 u' |k| + 2 e64 + 2**-148) / (1 - u')`` with ``u' = 2**-24 (1 + 2**-22)``.

    A key ``k`` within ``u |K|`` of its float64 value ``K`` (round to nearest; ``2**-149``
    absolute among subnormals) has ``|k - K_fixed| <= B(k) = u' |k| + e64 + 2**-149``; two
    keys whose float64 order differs from their float32 one lie within ``B(k) + B(k')``, and
    ``|k'| <= |k| + |k - k'|`` gives ``|k - k'| <= W``.

    >>> float(relative_band(np.array([0.5], np.float32), np.zeros(1))[0]) < 2.0**-23
    True
    """
    u = 2.0**-24 * (1.0 + 2.0**-22)
    size = np.abs(keys.astype(np.float64))
    return (2.0 * u * size + 2.0 * e64 + 2.0**-148) / (1.0 - u) * (1.0 + 2.0**-40)


def _band_members(
    keys: np.ndarray, relevant: np.ndarray, row: np.ndarray, lo_key: np.ndarray, hi_key: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The valid references whose key lies in the band ``[lo_key, hi_key]`` of some item of
    its row (items sorted by (row, key)) as ``(row, reference, code, relevant)`` sorted by
    code (:func:`_codes`), then reference.

    One pass over the rows' keys in float32: each row is cut into buckets at least twice as
    wide as its widest band (at most ``2 n`` of them), so a band meets at most two buckets;
    the keys of marked buckets are then checked against the bands themselves.  Bucket numbers
    come from one increasing float32 map, so a key in a band falls in a bucket the band marks.
    """
    n = keys.shape[1]
    rows, first = np.unique(row, return_index=True)
    last = np.append(first[1:], row.size) - 1
    base, top = lo_key[first], hi_key[last]
    width = np.maximum.reduceat(hi_key.astype(np.float64) - lo_key, first)
    span = top.astype(np.float64) - base
    step = np.maximum(2.0 * width, span / (2 * n))
    with np.errstate(over="ignore", divide="ignore"):
        inv = (1.0 / np.where(step > 0, step, 1.0)).astype(np.float32)
    n_bucket = 2 * n + 4
    item = np.searchsorted(rows, row)
    lo_b = _buckets(lo_key, base[item], inv[item], n_bucket)
    hi_b = _buckets(hi_key, base[item], inv[item], n_bucket)
    marked = np.zeros((rows.size, n_bucket), dtype=bool)
    for step_up in range(3):
        marked[item, np.minimum(lo_b + step_up, hi_b)] = True
    # Keys spread past float32's range (a difference that overflows), or bands so narrow
    # (subnormal keys) that 1 / step overflows and every difference maps to an end bucket:
    # every key is checked.
    with np.errstate(over="ignore"):
        marked[~np.isfinite(span.astype(np.float32)) | ~(inv > 0) | ~np.isfinite(inv)] = True
    sub = keys if rows.size == keys.shape[0] else keys[rows]
    at = _buckets(sub, base[:, None], inv[:, None], n_bucket)
    if rows.size * n_bucket >= 2**31:
        at = at.astype(np.int64)
    at += (np.arange(rows.size, dtype=at.dtype) * n_bucket)[:, None]
    flat = np.flatnonzero(np.take(marked.ravel(), at))
    r = flat // n
    c = flat - r * n
    valid = sub[r, c] <= KEY_MAX  # excluded pairs are +inf
    r, c = r[valid], c[valid]
    code = _codes(rows[r], sortable_bits(sub[r, c]))
    j = np.searchsorted(_codes(row, sortable_bits(hi_key)), code)
    ok = j < row.size
    ok[ok] = _codes(row[j[ok]], sortable_bits(lo_key[j[ok]])) <= code[ok]
    r, c, code = rows[r[ok]], c[ok], code[ok]
    order = np.lexsort((c, code))
    r, c = r[order], c[order]
    return r, c, code[order], relevant[r, c]


def _buckets(values: np.ndarray, base: np.ndarray, inv: np.ndarray, n_bucket: int) -> np.ndarray:
    """Bucket numbers ``floor((values - base) * inv) + 1`` in float32, clipped to
    ``[0, n_bucket - 1]``: an increasing function of the value (``inv > 0``)."""
    with np.errstate(over="ignore", invalid="ignore"):
        t = np.subtract(values, base, dtype=np.float32)
        t *= inv
    np.floor(t, out=t)
    np.fmax(t, -1, out=t)  # NaN (an infinite difference times 0) included
    np.fmin(t, n_bucket - 2, out=t)
    out = t.astype(np.int32)
    out += 1
    return out


def _band_ahead(
    row: np.ndarray,
    ref: np.ndarray,
    bits: np.ndarray,
    lo_key: np.ndarray,
    members: tuple[np.ndarray, np.ndarray, np.ndarray],
    rows: BlockRows,
    shape: tuple[int, int],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per near-miss relevant item (``row``, reference ``ref``, float32 key ``bits``, lower
    end of its band ``lo_key``; sorted by (row, key, reference)): the non-relevant references
    of its band with a smaller :func:`embedeval.engine.decide.float64_keys` key, those with an
    equal key and a smaller index, those with an equal key, and the item's float64 key.
    ``members`` are the non-relevant references in the bands of the items' rows
    (:func:`_band_members`: row, reference, code) of a block of ``shape``.

    The items and the band members of a row get their float64 keys in one call, listed in
    float32 order, so every relevant / non-relevant pair among them is in its float64 order.
    """
    m_row, m_ref, m_code = members
    all_row = np.concatenate((row, m_row))
    all_ref = np.concatenate((ref, m_ref))
    kind = np.arange(all_row.size) < row.size
    order = _merged_order(row, bits, ref, m_row, m_code, m_ref, shape)
    exact = np.empty(all_row.size, dtype=np.float64)
    exact[order] = float64_keys(
        rows.xq, rows.xb, rows.start + all_row[order], all_ref[order], all_row[order],
        rows.distance, kind[order],
    )  # fmt: skip
    k_item, k_member = exact[: row.size], exact[row.size :]
    # Members below an item's band precede it, members above follow it (certain); so the
    # members of its band ahead of it are the members of its row with a smaller float64 key
    # less those below its band.
    first = np.searchsorted(m_row, row)
    below = np.searchsorted(m_code, _codes(row, sortable_bits(lo_key))) - first
    smaller, before, n_equal = _members_below(row, k_item, ref, m_row, k_member, m_ref)
    return smaller - below, before, n_equal, k_item


def _merged_order(
    row: np.ndarray,
    bits: np.ndarray,
    ref: np.ndarray,
    m_row: np.ndarray,
    m_code: np.ndarray,
    m_ref: np.ndarray,
    shape: tuple[int, int],
) -> np.ndarray:
    """The order by (row, float32 key, reference) of the items followed by the members, both
    sorted that way already: a merge of two sorted lists of packed codes (distinct: an item is
    relevant, a member is not)."""
    col_bits = max(int(shape[1] - 1).bit_length(), 1)
    if int(shape[0] - 1).bit_length() + 32 + col_bits > 64:
        all_bits = np.concatenate((bits, (m_code & np.uint64(0xFFFFFFFF)).astype(np.uint32)))
        return np.lexsort((np.append(ref, m_ref), all_bits, np.append(row, m_row)))
    shift = np.uint64(col_bits)
    items = (_codes(row, bits) << shift) | ref.astype(np.uint64)
    members = (m_code << shift) | m_ref.astype(np.uint64)
    at = np.empty(row.size + m_row.size, dtype=np.int64)
    at[: row.size] = np.searchsorted(members, items) + np.arange(row.size)
    at[row.size :] = np.searchsorted(items, members) + np.arange(m_row.size)
    order = np.empty_like(at)
    order[at] = np.arange(at.size)
    return order


def _members_below(
    row: np.ndarray,
    k_item: np.ndarray,
    ref: np.ndarray,
    m_row: np.ndarray,
    k_member: np.ndarray,
    m_ref: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per item (``row``, float64 key ``k_item``, reference ``ref``): the members of its row
    (``m_row`` sorted, ``k_member``, ``m_ref``) with a smaller key, with an equal key and a
    smaller reference index, and with an equal key.  One sort of both by (row, key,
    reference); runs of equal (row, key) hold the ties."""
    n_item = row.size
    all_row = np.concatenate((row, m_row))
    all_key = np.concatenate((k_item, k_member))
    order = np.lexsort((np.concatenate((ref, m_ref)), all_key, all_row))
    is_member = order >= n_item
    key_sorted, row_sorted = all_key[order], all_row[order]
    new = np.ones(order.size, dtype=bool)
    new[1:] = (key_sorted[1:] != key_sorted[:-1]) | (row_sorted[1:] != row_sorted[:-1])
    run = np.cumsum(new) - 1
    # members before each position (earlier rows included), and before each run
    ahead = np.cumsum(is_member) - is_member
    before_run = ahead[new]
    in_run = np.bincount(run, weights=is_member, minlength=before_run.size).astype(np.int64)
    at = np.empty(order.size, dtype=np.int64)
    at[order] = np.arange(order.size)
    item_at = at[:n_item]
    item_run = run[item_at]
    strict = before_run[item_run] - np.searchsorted(m_row, row)
    return strict, ahead[item_at] - before_run[item_run], in_run[item_run]


def _sorted_rows(
    keys: np.ndarray, relevant: np.ndarray, cut: np.ndarray, need: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's :func:`flagged_keys` of the keys up to its float32 ``cut``, sorted and padded
    with :data:`_PAD` (the whole row when fewer than ``need`` keys lie under the cut, or when
    most rows keep most keys), and per row the flagged bits at or under which every
    non-relevant key of the row is among the sorted ones.

    Compacting costs a pass and a scatter; it pays when the sort shrinks by half or more (and
    then only the kept keys are flagged)."""
    b, n = keys.shape
    mask = keys <= cut[:, None]
    counts = np.count_nonzero(mask, axis=1)
    short = counts < need
    if short.any():
        cut[short] = KEY_MAX
        mask[short] = keys[short] <= KEY_MAX
        counts[short] = np.count_nonzero(mask[short], axis=1)
    width = int(counts.max(initial=0))
    if 2 * width > n:
        flagged = flagged_keys(keys, relevant)
        flagged.sort(axis=1)
        return flagged, np.full(b, _ALL, dtype=np.uint32)
    out = np.full((b, max(width, 1)), _PAD, dtype=np.uint32)
    col = spans(np.zeros_like(counts), counts)
    out[np.repeat(np.arange(b), counts), col] = flagged_keys(keys[mask], relevant[mask])
    out.sort(axis=1)
    # A non-relevant key's own bits are its flagged bits or the next ones: those at or under
    # the cut's bits less one are kept.  Zero bits (below every key) where the cut is -inf.
    cut_bits = sortable_bits(cut)
    return out, np.where(cut_bits > _NEG_INF_BITS, cut_bits - np.uint32(1), np.uint32(0))


def score_ranks(task: RetrievalTask, start: int, ranks: RelevantRanks) -> ScoredBlock:
    """The scored block of query rows from ``start`` given their :class:`RelevantRanks`."""
    b = ranks.n_hits.size
    rows = np.arange(start, start + b)
    hits = hits_from_ranks(
        ranks.n_hits,
        ranks.hit_pos,
        task.relevant[rows],
        task.n_valid[rows],
        task.k,
        ranks.blocks if ranks.blocks[0].size else None,
    )
    values, ties = score_hits(hits, list(task.metrics))
    return ScoredBlock(slice(start, start + b), values, ties)


#: The float64 filter's copies of the rows (bytes) above which the deep engine keeps float32.
_FLOAT64_COPY_MAX = 1 << 30


def filter_precision(task: RetrievalTask) -> str:
    """The filter product of the deep engine: ``"float64"`` (keys rounded from a float64
    product: about one float32 rounding from their float64 value) unless the float64 copies
    of the rows would exceed :data:`_FLOAT64_COPY_MAX` bytes, else ``"float32"``.

    A float32 product errs by up to ``d`` roundings, and deep rankings hold thousands of keys
    per row: on the hashing-shaped case (d = 64, 50,000 references, R_q about 5,000) about
    4,000 of a row's relevant keys then lie within the float32 bound of a non-relevant one and
    need float64 keys.  The float64 filter costs twice the product and leaves few: measured on
    two cores, 5,000 queries, 20.3 s with float32 keys against 9.0 s.
    """
    if task.precision == "exact":  # small integers: float32 keys are exact
        return "exact"
    n_rows = int(task.reference.shape[0])
    if task.query is not task.reference:
        n_rows += int(task.query.shape[0])
    dim = int(task.reference.shape[1])
    if dim > FLOAT64_MAX_DIM or n_rows * (dim + 1) * 8 > _FLOAT64_COPY_MAX:
        return "float32"
    return "float64"


def flagged_ranks(
    keys: np.ndarray,
    relevant: np.ndarray,
    magnitude: float,
    bound: float,
    groups: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> tuple[RelevantRanks, np.ndarray]:
    """The ranks of the relevant references of rows of float64 product ``keys`` (every finite
    key at most ``magnitude`` in size; excluded pairs ``+inf``, never relevant; the members of
    each of ``groups``, :func:`_twin_groups`, sharing one key), for the rows where those keys
    decide them, and which rows they leave undecided (their items are left out).  ``keys`` is
    overwritten: flagged, then sorted row by row.  ``bound``: each key lies within it of its
    fixed-order key, up to an increasing map per row (Euclidean product keys lack the query's
    squared norm; cosine ones are ``-cos``, the fixed-order ones ``-sign(s) s**2 / ||x||**2``),
    so two references whose fixed-order keys are equal or in the other order have keys within
    ``2 bound`` of each other.

    The lowest bit of each key's significand is replaced by the reference's relevance, which
    moves the key by at most one unit in its last place (``ulp``), and each row is sorted once
    as floats; the flags then show where the relevant references landed.  Two keys whose flagged
    values are ``w = 2 bound + 2 ulp(magnitude)`` or more apart are in the order of their
    fixed-order keys, and apart from each other.  A row where no relevant reference has a
    non-relevant one within ``w`` (only the entries just before and after each run of relevant
    entries need a look) is therefore ranked exactly, with no tie between kinds; the order among
    references of one kind, which the sort leaves arbitrary, changes no rank.  The one exception
    a row may hold is a group of identical rows with members of both kinds whose run of entries
    stands ``w`` apart from every other entry (:func:`_settle_twins`): its members tie exactly,
    and their ranks follow from their indices.

    >>> keys = np.array([[0.5, -0.25, 0.75], [0.5, 0.5, -1.0]])
    >>> ranks, undecided = flagged_ranks(keys.copy(), keys > 0.6, 1.0, 1e-15)
    >>> ranks.n_hits.tolist(), ranks.hit_pos.tolist(), undecided.tolist()
    ([1, 0], [2], [False, False])
    >>> flagged_ranks(keys, np.array([[0, 0, 0], [1, 0, 0]], bool), 1.0, 1e-15)[1].tolist()
    [False, True]
    """
    b, n = keys.shape
    keys = np.ascontiguousarray(keys)
    twins = None if groups is None else _mixed_twins(groups, keys, relevant)
    bits = keys.view(np.uint64)
    bits &= _CLEAR_FLAG64
    bits |= relevant
    keys.sort(axis=1)
    low = keys.reshape(-1).view(np.uint8)[_LOW_BYTE64::8]
    at = np.flatnonzero((low & np.uint8(1)).view(bool))
    if not at.size:
        return RelevantRanks(np.zeros(b, np.int64), at, _no_runs(b)), np.zeros(b, dtype=bool)
    row = at // n
    pos = at - row * n
    # 2 ulp(magnitude) for the two flags, with room for the subtraction's rounding (and for
    # keys up to twice the magnitude)
    w = (2.0 * bound + 8.0 * magnitude * 2.0**-52) * (1.0 + 2.0**-40) + 2.0**-1070
    settled = None if twins is None else _settle_twins(keys, twins, w)
    exempt = (np.zeros(0, np.int64),) * 2 if settled is None else settled[2]
    undecided = _close_rows(keys, at, row, pos, w, exempt)
    runs = _no_runs(b)
    if settled is not None:  # the twins' relevant members ranked by their indices
        places, ranks, _, twin_runs = settled
        pos[np.searchsorted(at, places)] = ranks
        runs = _twin_runs(twin_runs, undecided)
    keep = ~undecided[row]
    return RelevantRanks(np.bincount(row[keep], minlength=b), pos[keep], runs), undecided


def _close_rows(
    keys: np.ndarray,
    at: np.ndarray,
    row: np.ndarray,
    pos: np.ndarray,
    w: float,
    exempt: tuple[np.ndarray, np.ndarray],
) -> np.ndarray:
    """The rows of sorted flagged ``keys`` where a relevant entry (flat places ``at``: row
    ``row``, place ``pos`` in it) has a non-relevant neighbour within ``w``: the entries just
    before and after each run of relevant entries, the nearest ones of the other kind.  The
    pairs ``exempt`` (flat places of relevant entries whose neighbour before, and after, is a
    settled twin) are left out."""
    n = keys.shape[1]
    start = np.ones(at.size, dtype=bool)
    start[1:] = (at[1:] != at[:-1] + 1) | (row[1:] != row[:-1])
    first = np.flatnonzero(start)
    last = np.append(first[1:], at.size) - 1
    flat = keys.reshape(-1)
    ahead = at[first]
    close = (pos[first] > 0) & (flat[ahead] - flat[np.maximum(ahead - 1, 0)] <= w)
    if exempt[0].size:
        close &= ~_in_sorted(ahead, np.sort(exempt[0]))
    behind = at[last]
    after = (pos[last] + 1 < n) & (flat[np.minimum(behind + 1, flat.size - 1)] - flat[behind] <= w)
    if exempt[1].size:
        after &= ~_in_sorted(behind, np.sort(exempt[1]))
    undecided = np.zeros(keys.shape[0], dtype=bool)
    undecided[row[first[close]]] = True
    undecided[row[last[after]]] = True
    return undecided


def _in_sorted(values: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Which ``values`` the sorted, non-empty ``table`` holds (``np.isin`` without its sort
    of both)."""
    at = np.minimum(np.searchsorted(table, values), table.size - 1)
    return table[at] == values


def _mixed_twins(
    groups: tuple[np.ndarray, np.ndarray, np.ndarray], keys: np.ndarray, relevant: np.ndarray
) -> tuple[np.ndarray, ...] | None:
    """Before the sort: per row of unsorted ``keys`` and group of identical rows with relevant
    and non-relevant valid members (``groups``: :func:`_twin_groups`), ``(row, relevant
    members, non-relevant members, the members' key)``, then per relevant member of each in
    index order its group's non-relevant members of smaller index; or None."""
    mixed = _mixed_groups(groups, keys, relevant)
    if mixed is None:
        return None
    r, g, n_rel, n_non, shared = mixed
    return r, n_rel, n_non, shared, _copies_ahead(groups, relevant, keys, r, g)


def _settle_twins(
    keys: np.ndarray, twins: tuple[np.ndarray, ...], w: float
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray], tuple[np.ndarray, ...]] | None:
    """The groups of identical rows of :func:`_mixed_twins` whose members alone, and all of
    them, make a run of entries in their sorted flagged row (``keys``) that lies more than
    ``w`` from the entries on either side: no other reference can tie or cross them in float64,
    and they tie exactly with each other (equal keys ranked by index), so of a group's
    non-relevant members those of smaller index are ahead of a relevant one.  Returns the flat
    places of their relevant entries, the ranks these stand for (per group in the order of the
    places), the exempt pairs of :func:`_close_rows` and the runs of :class:`RelevantRanks`;
    or None when no group qualifies."""
    r, n_rel, n_non, shared, ahead = twins
    n = keys.shape[1]
    non_key = (shared.view(np.uint64) & _CLEAR_FLAG64).view(np.float64)
    rel_key = (non_key.view(np.uint64) | np.uint64(1)).view(np.float64)
    up = non_key < rel_key  # a flag moves a negative key down
    lo, hi = np.minimum(non_key, rel_key), np.maximum(non_key, rel_key)
    start = rows_searchsorted(keys, r, lo)
    mid = rows_searchsorted(keys, r, lo, right=True)
    stop = rows_searchsorted(keys, r, hi, right=True)
    flat = keys.reshape(-1)
    base = r * n
    ok = (mid - start == np.where(up, n_non, n_rel)) & (stop - mid == np.where(up, n_rel, n_non))
    ok &= (start == 0) | (lo - flat[base + np.maximum(start - 1, 0)] > w)
    ok &= (stop == n) | (flat[base + np.minimum(stop, n - 1)] - hi > w)
    if not ok.any():
        return None
    first_rel = np.where(up, mid, start)  # the group's relevant entries, in their row
    member = np.repeat(ok, n_rel)
    places = spans(base + first_rel, n_rel)[member]
    ranks = (np.repeat(start, n_rel) + spans(np.zeros_like(n_rel), n_rel) + ahead)[member]
    exempt = (base[ok & up] + mid[ok & up], base[ok & ~up] + mid[ok & ~up] - 1)
    return places, ranks, exempt, (r[ok], start[ok], stop[ok])


def _twin_runs(
    runs: tuple[np.ndarray, np.ndarray, np.ndarray], undecided: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The tie runs of :class:`RelevantRanks` from the settled twins' runs ``(row, first
    place, stop)`` in the rows not ``undecided``: as the bands give them (:func:`_tie_blocks`),
    in row then rank order, with each row's first run's first rank."""
    row, first, stop = runs
    keep = ~undecided[row]
    row, first, stop = row[keep], first[keep], stop[keep]
    order = np.lexsort((first, row))
    row, first, last = row[order], first[order], stop[order] - 1
    first_mixed = np.full(undecided.size, np.iinfo(np.int64).max // 2)
    np.minimum.at(first_mixed, row, first)
    return row, first, last, first_mixed


def _indices(rows: slice | np.ndarray) -> np.ndarray:
    """The query indices of ``rows``: a slice with a start and a stop, or indices."""
    return np.arange(rows.start, rows.stop) if isinstance(rows, slice) else rows


def _no_runs(b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The tie runs of ``b`` rows that hold none (see :class:`RelevantRanks`)."""
    empty = np.zeros(0, np.int64)
    return empty, empty, empty, np.full(b, np.iinfo(np.int64).max // 2)


def _with_rows(base: RelevantRanks, rows: np.ndarray, ranks: RelevantRanks) -> RelevantRanks:
    """The ranks of a block (``base``, with no items in its ``rows``) with those of its
    ``rows`` (sorted) put in: ``ranks``, whose row ``i`` is block row ``rows[i]``."""
    b = base.n_hits.size
    counts = base.n_hits.copy()
    counts[rows] = ranks.n_hits
    owner = np.concatenate((np.repeat(np.arange(b), base.n_hits), np.repeat(rows, ranks.n_hits)))
    order = np.argsort(owner, kind="stable")
    hit_pos = np.concatenate((base.hit_pos, ranks.hit_pos))[order]
    run_row, first, last, first_mixed = ranks.blocks
    base_row, base_first, base_last, every = base.blocks
    every = every.copy()
    every[rows] = first_mixed
    run_row = np.concatenate((base_row, rows[run_row]))
    first, last = np.concatenate((base_first, first)), np.concatenate((base_last, last))
    at = np.lexsort((first, run_row))
    return RelevantRanks(counts, hit_pos, (run_row[at], first[at], last[at], every))


def _exact_in_float64(task: RetrievalTask) -> bool:
    """Whether a float64 product of the task's rows gives exact keys whose codes
    (:func:`embedeval.engine.integers.ranks_of_exact_keys`) fit in 64 bits: integers whose
    products sum to at most ``2**51`` and ``2**(61 - b)``, ``b`` the bits of a reference index
    (int8-quantised embeddings of a few thousand dimensions, say)."""
    col_bits = max(int(task.reference.shape[0] - 1).bit_length(), 1)
    limit = min(2.0**51, 2.0 ** (61 - col_bits))
    return exact_in_float32(task.query, task.reference, task.distance, limit)


def deep_blocks(
    task: RetrievalTask,
    *,
    block_size: int | None = None,
    memory_budget: int,
    progress: bool | None = None,
    n_threads: int | None = None,
) -> Iterator[ScoredBlock]:
    """The local engine's scored blocks of ``task`` through :func:`relevant_ranks` (the same
    plan, products and threads as :func:`embedeval.engine.exact.sorted_candidates`), or the
    exact and flagged float64 keys' sorts where they decide (:class:`_DeepSearch`)."""
    deep = _DeepSearch.prepare(task, block_size, memory_budget)
    n_query, size = task.n_query, deep.plan.block_size
    starts = range(0, n_query, size)
    with progress_bar(n_query, "queries", enabled=progress) as bar, single_threaded_blas():
        for start, result in in_order(deep.one_block, starts, n_threads):
            yield result
            bar.update(min(start + size, n_query) - start)


def deep_range_blocks(
    task: RetrievalTask, queries: slice, *, block_size: int | None, memory_budget: int
) -> Iterator[ScoredBlock]:
    """:func:`deep_blocks` of the ``queries`` range alone, in this thread (a Dask worker's
    share of the task): blocks of the plan's size from ``queries.start``, the last one cut at
    ``queries.stop``.  The values do not depend on where blocks start (every rank is decided
    in float64)."""
    deep = _DeepSearch.prepare(task, block_size, memory_budget)
    size = deep.plan.block_size
    with single_threaded_blas():
        for start in range(queries.start, queries.stop, size):
            yield deep.one_block(start, min(start + size, queries.stop))


class KeyedSearch:
    """The deep engine over whole-row filter keys that the caller computes (the sharded
    backend, shard by shard): :meth:`blocks` ranks a range of queries from ``keys_of(rows)``,
    the float32 keys of query ``rows`` (a slice, global) against every reference, writable
    (excluded pairs are set to ``+inf`` in place).  ``precision`` says how the keys were
    formed: ``"exact"`` (a float32 product of small integers), ``"float64"`` (rounded once from
    a float64 product) or ``"float32"``; identical references must share their
    representative's key, prepared at that precision (as
    :func:`~embedeval.engine.exact.tied_search` prepares it), or the bounds would not hold.  The
    values are the local engine's, every rank being decided in float64."""

    def __init__(self, task: RetrievalTask, plan: EnginePlan, precision: str) -> None:
        norms = task_norms(task)
        m_sq = float(norms.ref_sq.max(initial=0.0)) * (1.0 + 2.0**-40)
        dups = plan.duplicates
        groups = None if dups is None else _twin_groups(dups, task.reference_codes)
        q_sq = norms.q_sq * (1.0 + 2.0**-40)
        self.deep = _DeepSearch(task, precision, None, plan, q_sq, m_sq, groups, threading.local())

    def blocks(
        self, queries: slice, keys_of: Callable[[slice], np.ndarray], n_threads: int | None
    ) -> Iterator[ScoredBlock]:
        """The scored blocks of the ``queries`` range, blocks of the plan's size from its
        start, ranked by ``n_threads`` threads (the values do not depend on it)."""
        deep = replace(self.deep, keys_of=keys_of)
        size, stop = deep.plan.block_size, queries.stop
        starts = range(queries.start, stop, size)
        for _, block in in_order(
            lambda s: deep.one_block(s, min(s + size, stop)), starts, n_threads
        ):
            yield block


#: Flagged float64 keys rank a deep search whose mean R_q is at least 1/_WHOLE_SORT of the
#: references.  Measured on two cores with the whole-row sort of an earlier form (64-bit codes):
#: hashing-shaped (R_q about 10 % of 50,000) 6.9 s -> 4.4 s (3.3-4.0 s with the keys sorted as
#: floats); full-depth MAP over 100 classes (R_q 1 % of 10,000) 1.3-1.4 s -> 1.5-1.7 s, and
#: still slower with the keys sorted as floats, so it keeps the bands (whose sort stops at the
#: farthest relevant key and meets few near misses).
_WHOLE_SORT = 20


@dataclass
class _DeepSearch:
    """One deep search: the task, its filter ``precision`` (``"exact"``: float32 keys of small
    integers; ``"exact64"``: a float64 product of larger integers; ``"float64"`` or
    ``"float32"``: filter keys), product, plan, the bounds' norms (``q_sq`` per query,
    ``m_sq``) and the identical rows' groups of mixed labels (:func:`_twin_groups`)."""

    task: RetrievalTask
    precision: str
    search: PreparedSearch | None  # None: keys from ``keys_of``
    plan: EnginePlan
    q_sq: np.ndarray
    m_sq: float
    groups: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    buffers: threading.local
    whole_sort: bool = False
    #: Whole-row filter keys of query rows (a slice) computed elsewhere (:class:`KeyedSearch`),
    #: instead of by ``search``.
    keys_of: Callable[[slice], np.ndarray] | None = None

    @staticmethod
    def sorts_whole_rows(task: RetrievalTask, precision: str) -> bool:
        """Whether blocks are ranked from flagged float64 keys first (:meth:`_whole_rows`):
        with float64 filter keys, and with relevant references at least 1/:data:`_WHOLE_SORT`
        of the references (mean R_q), where the bands' near misses cost more than sorting
        every key of a row as float64."""
        if precision != "float64":
            return False
        n_ref = int(task.reference.shape[0])
        return float(task.relevant.mean()) * _WHOLE_SORT >= n_ref

    @classmethod
    def prepare(cls, task: RetrievalTask, block_size: int | None, memory_budget: int) -> Any:
        depth, threshold = task.depth()
        precision = filter_precision(task)
        if precision == "float64" and _exact_in_float64(task):
            precision = "exact64"  # integers too large for float32: a float64 product is exact
        product = "float64" if precision == "exact64" else precision
        search = PreparedSearch.build(task.query, task.reference, task.distance, precision=product)
        plan = plan_search(
            task.reference,
            n_query=task.n_query,
            distance=task.distance,
            depth=depth,
            exclusions=task.exclusions,
            n_valid=task.n_valid,
            # The candidate engine's plan: the same block layout, hence the same product shapes
            # and float32 keys.
            positive_threshold=task.positive_threshold(threshold),
            block_size=block_size,
            memory_budget=memory_budget,
        )
        n_ref = int(task.reference.shape[0])
        search = tied_search(search, plan, task.reference, task.distance, product, slice(0, n_ref))
        # The keys' error bounds: the largest reference norm of the task bounds every pair.
        norms = task_norms(task)
        m_sq = float(norms.ref_sq.max(initial=0.0)) * (1.0 + 2.0**-40)
        dups = plan.duplicates  # the identical rows' groups, once for every block
        groups = None if dups is None else _twin_groups(dups, task.reference_codes)
        q_sq = norms.q_sq * (1.0 + 2.0**-40)
        plan = plan.with_search(search)
        whole = cls.sorts_whole_rows(task, precision)
        return cls(task, precision, search, plan, q_sq, m_sq, groups, threading.local(), whole)

    def one_block(self, start: int, stop: int | None = None) -> ScoredBlock:
        """The scored block of queries ``start:stop`` (default: one block of the plan)."""
        if stop is None:
            stop = min(start + self.plan.block_size, self.task.n_query)
        if self.precision == "exact64":  # the float64 product's keys themselves
            return self._exact_block(start, stop, self._product64(start, stop))
        if self.precision == "exact":
            return self._exact_block(start, stop, self._keys32(slice(start, stop)))
        if self.whole_sort:
            return score_ranks(self.task, start, self._whole_rows(start, stop))
        return score_ranks(self.task, start, self._banded(slice(start, stop)))

    def _product64(self, start: int, stop: int) -> np.ndarray:
        """The float64 product keys of queries ``start:stop``, excluded pairs ``+inf``."""
        keys = self.search.queries[start:stop] @ self.search.reference_t
        if self.groups is not None:  # identical rows under other labels share one key
            members, starts, size = self.groups
            keys[:, members] = np.repeat(keys[:, members[starts]], size, axis=1)
        self.plan.exclusions.hide(keys, np.arange(start, stop), 0, groups=True)
        return keys

    def _keys32(self, rows: slice | np.ndarray) -> np.ndarray:
        """The float32 filter keys of query ``rows`` (a slice, or sorted indices), excluded
        pairs ``+inf``, in this thread's buffer."""
        at = _indices(rows)
        if self.keys_of is not None:  # keys computed elsewhere (rows: a slice)
            keys = self.keys_of(rows)
            self.plan.exclusions.hide(keys, at, 0, groups=True)
            return keys
        n_ref = self.search.n_reference
        if getattr(self.buffers, "keys", None) is None:
            rows_max = min(self.plan.block_size, self.task.n_query)
            self.buffers.keys = np.empty(rows_max * n_ref, dtype=np.float32)
        out = self.buffers.keys[: at.size * n_ref].reshape(at.size, n_ref)
        keys = grid_keys(self.search, rows, 0, n_ref, out)
        self.plan.exclusions.hide(keys, at, 0, groups=True)
        return keys

    def _relevant(self, start: int, stop: int, keys: np.ndarray) -> tuple[np.ndarray, float]:
        """Which pairs of queries ``start:stop`` are relevant (excluded pairs, ``+inf`` in
        ``keys``, are not), and a bound on the size of their keys."""
        task = self.task
        relevant = match_matrix(task.query_codes[start:stop], task.reference_codes)
        relevant &= keys < np.inf
        top = key_magnitude(self.q_sq[start:stop], self.m_sq, task.distance).max(initial=0)
        return relevant, float(top)

    def _exact_block(self, start: int, stop: int, keys: np.ndarray) -> ScoredBlock:
        """The block ranked from exact keys (excluded pairs hidden) by one sort per row."""
        found = ranks_of_exact_keys(keys, *self._relevant(start, stop, keys))
        return score_ranks(self.task, start, RelevantRanks(*found))

    def _whole_rows(self, start: int, stop: int) -> RelevantRanks:
        """The block ranked from flagged float64 product keys (:func:`flagged_ranks`), the
        rows they leave undecided with their bands."""
        keys = self._product64(start, stop)
        relevant, top = self._relevant(start, stop, keys)
        dim = int(self.task.reference.shape[1])
        e64 = 2 * float64_key_bounds(self.q_sq[start:stop], self.m_sq, dim, self.task.distance)
        ranks, undecided = flagged_ranks(keys, relevant, top, float(e64.max()), self.groups)
        if not undecided.any():
            return ranks
        rows = np.flatnonzero(undecided)
        return _with_rows(ranks, rows, self._banded(start + rows))

    def _banded(self, rows: slice | np.ndarray) -> RelevantRanks:
        """The float32 filter keys of query ``rows`` (a slice, or sorted indices) ranked with
        their bands (:func:`relevant_ranks`)."""
        task = self.task
        at = _indices(rows)
        keys = self._keys32(rows)
        dim = int(task.reference.shape[1])
        rounding = rounding_of(self.precision)
        band = 2 * key_bounds(self.q_sq[at], self.m_sq, dim, task.distance, *rounding)
        if isinstance(rows, slice):  # block row i is query start + i
            block_rows = BlockRows(task.query, task.reference, task.distance, int(rows.start))
        else:
            block_rows = BlockRows(task.query[at], task.reference, task.distance, 0)
        e64 = None
        if self.precision == "float64":  # the float64 product's error and the fixed-order key's
            e64 = 2 * float64_key_bounds(self.q_sq[at], self.m_sq, dim, task.distance)
        tau = np.full(at.size, -np.inf, dtype=np.float32)  # cut-off: the farthest relevant key
        return relevant_ranks(
            self.plan, keys, task.query_codes[at], task.reference_codes, tau, self.plan.need[at],
            band, block_rows, e64, self.groups,
        )  # fmt: skip
