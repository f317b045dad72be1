"""Deep rankings from the ranks of the relevant references alone.

Full-depth average precision, the inverse negative penalty and every window metric need, per
query, only the rank of each relevant reference: AP = sum over relevant ranks i of
found(i) / i, divided by R_q.  When rankings are deep (the last relevant reference is, for most
queries, a large part of the way down the whole reference set) the candidate engine of
:mod:`embedeval.engine.exact` extracts, packs into 64-bit codes and sorts nearly every key of
every row.  This engine instead, for each block of queries:

1. computes the block's whole-row keys exactly as the candidate engine does (same plan, same
   products and shapes, so the same float32 keys; identical references share one key;
   excluded pairs are ``+inf``);
2. keeps each row's keys up to its farthest relevant one, packed as ``key bits << 1 |
   relevant`` in 64 bits (no reference index), and sorts them: the odd codes sit at the ranks
   of the relevant references;
3. a row where some relevant key equals a non-relevant one (a tie block that mixes the two,
   where the reference-index order decides ranks and tie flags) shows as an even code right
   before an odd one with the same key; such rows are scored from their sorted candidates by
   the candidate engine's kernels, from the same keys; every other row gets its relevant
   references' ranks and no tie flag (:func:`embedeval.engine.kernels.hits_from_ranks`).

Values are bit-identical to the candidate engine's: the same keys, the same ranks, the same
kernels (sums in rank order).  What a row costs is one sort of its keys (without the
reference index, the bookkeeping of the candidates and their label lookups) instead of an
extraction, a pack with the reference index and a sort followed by the candidate kernels.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..utils.progress import progress_bar
from .candidates import Candidates, sortable_bits
from .exact import (
    KEY_MAX,
    EnginePlan,
    PreparedSearch,
    grid_keys,
    pack_codes,
    plan_search,
    sort_block,
)
from .kernels import hits_from_ranks, score_hits
from .labels import match_matrix
from .task import RetrievalTask, ScoredBlock
from .threads import in_order, single_threaded_blas

__all__ = [
    "RelevantRanks",
    "deep_applies",
    "deep_blocks",
    "relevant_ranks",
    "score_ranks",
]


@dataclass(frozen=True)
class RelevantRanks:
    """The relevant references of a block of query rows located in their whole rankings.

    ``clean`` (block-relative rows) hold no tie block mixing relevant and non-relevant items:
    their ranks are ``hit_pos`` (``n_hits`` per clean row, increasing within a row).  ``mixed``
    rows are left to the candidate engine; ``candidates`` holds their sorted whole rows.
    """

    clean: np.ndarray
    n_hits: np.ndarray
    hit_pos: np.ndarray
    mixed: np.ndarray
    candidates: Candidates | None


def deep_applies(task: RetrievalTask) -> bool:
    """Whether the local engine ranks ``task`` here: full-depth AP / mINP (the label
    threshold ``"max"``, ``k=None``), where the candidate engine would pack and sort nearly
    every key of every row.

    Deep windows without it (MAP@R over a few large classes) keep the candidate engine:
    measured on 8,000 vectors in 5 classes (R_q about 1,600), most rows there hold a relevant
    key equal in float32 to a non-relevant one, and locating thousands of relevant keys per
    row cost more than the candidate engine's extraction and sort (34 s against 2.6 s on a
    loaded two-core machine).  MRR alone keeps it too (it reads up to the first hit)."""
    if not task.has_work:
        return False
    return task.depth()[1] == "max"


def relevant_ranks(
    plan: EnginePlan,
    keys: np.ndarray,
    query_codes: np.ndarray,
    reference_codes: np.ndarray,
    need: np.ndarray,
) -> RelevantRanks:
    """The :class:`RelevantRanks` of a block of query rows from their whole-row ``keys`` (valid
    keys finite, excluded pairs ``+inf``) and label codes (:mod:`embedeval.engine.labels`).

    Each row's keys up to its farthest relevant one are sorted as ``key bits << 1 |
    relevant`` (64-bit, no reference index); the positions of the odd codes are the ranks of
    the relevant references.  Within equal keys the non-relevant items sort first, so a tie
    block mixing both shows as an even code just before an odd one with the same key: such a
    row is scored from its candidates instead.  A row with fewer than ``need`` keys up to its
    farthest relevant one (another metric reads deeper) is sorted whole.
    """
    b, n = keys.shape
    relevant = match_matrix(query_codes, reference_codes)
    relevant &= keys <= KEY_MAX
    cut = np.where(relevant, keys, -np.inf).max(axis=1).astype(np.float32)
    mask = keys <= cut[:, None]
    counts = np.count_nonzero(mask, axis=1)
    short = counts < need
    if short.any():
        cut[short] = KEY_MAX
        mask[short] = keys[short] <= KEY_MAX
        counts[short] = np.count_nonzero(mask[short], axis=1)
    width = max(int(counts.max(initial=0)), 1)
    # Compacting costs a pass and a scatter; it pays when the sort shrinks by half or more.
    if 2 * width > n:
        codes = sortable_bits(keys).astype(np.uint64) << np.uint64(1)
        codes |= relevant
        width = n
    else:
        codes = np.full((b, width), np.uint64(0xFFFFFFFF) << np.uint64(1), dtype=np.uint64)
        starts = np.cumsum(counts) - counts
        col = np.arange(int(counts.sum())) - np.repeat(starts, counts)
        kept = sortable_bits(keys[mask]).astype(np.uint64) << np.uint64(1)
        kept |= relevant[mask]
        codes[np.repeat(np.arange(b), counts), col] = kept
    codes.sort(axis=1)
    flat = codes.ravel()
    hit = np.flatnonzero(flat & np.uint64(1))
    row = hit // width
    pos = hit - row * width
    before = flat[np.maximum(hit - 1, 0)]
    mixed_item = (pos > 0) & ((before & np.uint64(1)) == 0)
    mixed_item &= (before >> np.uint64(1)) == (flat[hit] >> np.uint64(1))
    is_mixed = np.zeros(b, dtype=bool)
    is_mixed[row[mixed_item]] = True
    keep = ~is_mixed[row]
    clean = np.flatnonzero(~is_mixed)
    mixed = np.flatnonzero(is_mixed)
    n_hits = np.bincount(row[keep], minlength=b)[clean]
    candidates = _whole_rows(plan, mixed, keys, cut) if mixed.size else None
    return RelevantRanks(clean, n_hits, pos[keep], mixed, candidates)


def _whole_rows(
    plan: EnginePlan, rows: np.ndarray, keys: np.ndarray, cut: np.ndarray
) -> Candidates:
    """Sorted candidates of block ``rows`` (their queries block-relative: see
    :func:`score_ranks`): every valid reference at or below the row's ``cut``, from ``keys``
    (what the candidate engine keeps: every window a kernel reads, whole tie blocks)."""
    sub = keys[rows]
    r, c = np.nonzero(sub <= cut[rows, None])
    codes = pack_codes(r, sub[r, c], c, plan.col_bits)
    counts = np.bincount(r, minlength=rows.size)
    block = sort_block(codes, counts, 0, plan.col_bits, True)
    return Candidates(rows, block.lims, block.index, block.bits)


def score_ranks(task: RetrievalTask, start: int, ranks: RelevantRanks) -> ScoredBlock:
    """The scored block of query rows from ``start`` given their :class:`RelevantRanks`."""
    b = ranks.clean.size + ranks.mixed.size
    values, ties = {}, {}
    rows = start + ranks.clean
    hits = hits_from_ranks(
        ranks.n_hits, ranks.hit_pos, task.relevant[rows], task.n_valid[rows], task.k
    )
    parts = [(ranks.clean, score_hits(hits, list(task.metrics)))]
    if ranks.candidates is not None:
        block = ranks.candidates
        mixed = Candidates(start + block.queries, block.lims, block.index, block.bits)
        parts.append((ranks.mixed, task.score_block(mixed)))
    for name in parts[0][1][0]:
        values[name] = np.empty(b)
        ties[name] = np.empty(b, dtype=bool)
        for at, (v, t) in parts:
            values[name][at] = v[name]
            ties[name][at] = t[name]
    return ScoredBlock(slice(start, start + b), values, ties)


def deep_blocks(
    task: RetrievalTask,
    *,
    block_size: int | None = None,
    memory_budget: int,
    progress: bool | None = None,
    n_threads: int | None = None,
) -> Iterator[ScoredBlock]:
    """The local engine's scored blocks of ``task`` through :func:`relevant_ranks` (the same
    plan, products and threads as :func:`embedeval.engine.exact.sorted_candidates`)."""
    depth, threshold = task.depth()
    n_query, n_ref = task.n_query, int(task.reference.shape[0])
    search = PreparedSearch.build(task.query, task.reference, task.distance)
    plan = plan_search(
        task.reference,
        n_query=n_query,
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
    search = search.with_duplicates(plan.duplicates, plan.representatives, slice(0, n_ref))
    plan = plan.with_search(search)
    size = plan.block_size
    buffers = threading.local()

    def one_block(start: int) -> ScoredBlock:
        stop = min(start + size, n_query)
        if getattr(buffers, "keys", None) is None:
            buffers.keys = np.empty(min(size, n_query) * n_ref, dtype=np.float32)
        out = buffers.keys[: (stop - start) * n_ref].reshape(stop - start, n_ref)
        keys = grid_keys(search, slice(start, stop), 0, n_ref, out)
        plan.exclusions.hide(keys, np.arange(start, stop), 0, groups=True)
        codes = task.query_codes[start:stop]
        ranks = relevant_ranks(plan, keys, codes, task.reference_codes, plan.need[start:stop])
        return score_ranks(task, start, ranks)

    starts = range(0, n_query, size)
    with progress_bar(n_query, "queries", enabled=progress) as bar, single_threaded_blas():
        for start, result in in_order(one_block, starts, n_threads):
            yield result
            bar.update(min(start + size, n_query) - start)
