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
2. sorts each row's float32 keys up to its farthest relevant one (no reference index: half
   the bytes of a packed code) and gathers the keys of the relevant references, sorted by
   (key, reference index);
3. locates each relevant key in its sorted row by binary search (:func:`locate`): ``lt``
   keys are strictly nearer;
4. a row where some relevant key equals a non-relevant one (a tie block that mixes the two,
   so the reference-index order decides ranks and tie flags) is scored from its sorted
   candidates by the candidate engine's kernels, from the same keys; every other row gets its
   relevant references' ranks ``lt + (relevant items with an equal key and a smaller
   index)`` and no tie flag (:func:`embedeval.engine.kernels.hits_from_ranks`).

Values are bit-identical to the candidate engine's: the same keys, the same ranks, the same
kernels (sums in rank order).  :func:`deep_applies` says when it is the faster of the two.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..utils.progress import progress_bar
from .candidates import Candidates, from_sortable_bits, sortable_bits
from .decide import key_bounds, task_norms, widen
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

#: Mean R_q above n_reference / _FEW keeps the candidate engine (see deep_applies).
_FEW = 64

__all__ = [
    "RelevantRanks",
    "deep_applies",
    "deep_blocks",
    "locate",
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
    threshold ``"max"``, ``k=None``), where the candidate engine packs and sorts nearly every
    key of every row, with few relevant references per query (mean R_q at most
    1/:data:`_FEW` of the references).

    Measured, each engine on the same task in one process (two loaded cores; values and tie
    flags identical): 10,000 vectors in 100 classes (R_q 99) 2.75 s against 3.15 s; re-id
    shaped, 1,000 queries x 15,913 (R_q about 20) 1.20 s against 1.49 s; hashing shaped, 600
    queries x 50,000 in 10 classes (R_q about 5,000) 3.91 s against 3.10 s: with thousands of
    relevant keys per row, locating them costs more and most rows hold a float32 tie between
    a relevant and a non-relevant key, which sends them back to the candidates.  Deep windows
    without a full-depth metric (MAP@R over a few large classes) keep the candidate engine
    for the same reason, and so does MRR alone (it reads up to the first hit).
    """
    if not task.has_work or task.depth()[1] != "max":
        return False
    return float(task.relevant.mean()) * _FEW <= int(task.reference.shape[0])


def locate(sorted_rows: np.ndarray, rows: np.ndarray, keys: np.ndarray, right: bool) -> np.ndarray:
    """Per item, the number of keys of its row of ``sorted_rows`` below ``keys`` (``right``:
    at or below): a binary search of every item at once (rows hold thousands of keys, items
    are few, so a vectorised search beats a loop of ``np.searchsorted`` over rows).

    >>> s = np.array([[0.0, 1.0, 1.0, 3.0], [2.0, 2.0, 5.0, 6.0]], dtype=np.float32)
    >>> locate(s, np.array([0, 1]), np.array([1.0, 2.0], np.float32), False).tolist()
    [1, 0]
    >>> locate(s, np.array([0, 1]), np.array([1.0, 2.0], np.float32), True).tolist()
    [3, 2]
    """
    n = sorted_rows.shape[1]
    flat = sorted_rows.ravel()
    base = rows.astype(np.int64) * n
    lo = np.zeros(rows.size, dtype=np.int64)
    hi = np.full(rows.size, n, dtype=np.int64)
    for _ in range(int(n).bit_length()):
        mid = (lo + hi) >> 1
        value = flat[base + np.minimum(mid, n - 1)]
        below = (value <= keys) if right else (value < keys)
        below &= mid < hi
        lo = np.where(below, mid + 1, lo)
        hi = np.where(below, hi, mid)
    return lo


def relevant_ranks(
    plan: EnginePlan,
    keys: np.ndarray,
    query_codes: np.ndarray,
    reference_codes: np.ndarray,
    tau: np.ndarray,
    need: np.ndarray,
    band: np.ndarray | None = None,
) -> RelevantRanks:
    """The :class:`RelevantRanks` of a block of query rows from their whole-row ``keys`` (valid
    keys finite, excluded pairs ``+inf``) and label codes (:mod:`embedeval.engine.labels`).

    Only keys up to a per-row cut-off are sorted: ``tau`` (a depth threshold, see
    :func:`embedeval.engine.exact.depth_thresholds`), raised under the label threshold
    (``plan.threshold``) to the row's farthest relevant key; a row with fewer than ``need``
    keys under it is sorted whole.  Relevant references past the cut-off lie past every
    window a kernel reads, and are left out.

    ``band`` (per row) is twice the bound on a float32 key's distance from its float64 key
    (:func:`embedeval.engine.decide.key_bounds`): a row where a non-relevant key lies within
    the band of a relevant one could rank the two the other way in float64, so it is mixed and
    goes to the candidate kernels, which decide such runs in float64.
    """
    b, n = keys.shape
    relevant = match_matrix(query_codes, reference_codes)
    relevant &= keys <= KEY_MAX
    flat = np.flatnonzero(relevant)
    row = flat // n
    # Sorted by (row, key, reference index): the order of the relevant items in the ranking.
    code = pack_codes(row, keys.ravel()[flat], flat - row * n, plan.col_bits)
    code.sort()
    row = (code >> np.uint64(32 + plan.col_bits)).astype(np.int64)
    bits = ((code >> np.uint64(plan.col_bits)) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    rel_keys = from_sortable_bits(bits)
    cut = np.minimum(tau, KEY_MAX).astype(np.float32)
    if plan.threshold == "max" and code.size:
        last = np.flatnonzero(np.append(row[1:] != row[:-1], True))
        cut[row[last]] = np.maximum(cut[row[last]], rel_keys[last])
    sorted_rows, cut = _sorted_rows(keys, cut, need)
    inside = rel_keys <= cut[row]
    if not inside.all():
        code, row, bits, rel_keys = code[inside], row[inside], bits[inside], rel_keys[inside]
    lt = locate(sorted_rows, row, rel_keys, False)
    # Relevant items with an equal key in the same row: a run of equal (row, key) codes.
    new = np.ones(code.size, dtype=bool)
    new[1:] = (row[1:] != row[:-1]) | (bits[1:] != bits[:-1])
    firsts = np.flatnonzero(new)
    run_len = np.diff(np.append(firsts, code.size))
    run_start = np.repeat(firsts, run_len)
    # The equal keys of a row are the sorted positions [lt, lt + eq): the run is mixed when
    # the key after its relevant items is still equal (a non-relevant reference ties with it).
    after = lt + np.repeat(run_len, run_len)
    width = sorted_rows.shape[1]
    inside = after < width
    mixed_item = np.zeros(code.size, dtype=bool)
    at = row[inside] * width + after[inside]
    mixed_item[inside] = sorted_rows.ravel()[at] == rel_keys[inside]
    is_mixed = np.zeros(b, dtype=bool)
    is_mixed[row[mixed_item]] = True
    if band is not None and code.size:
        is_mixed |= _near_misses(sorted_rows, row, bits, rel_keys, band, cut, b)
    mixed = np.flatnonzero(is_mixed)
    keep = ~is_mixed[row]
    hit_pos = (lt + np.arange(code.size) - run_start)[keep]
    clean = np.flatnonzero(~is_mixed)
    n_hits = np.bincount(row[keep], minlength=b)[clean]
    if band is not None and mixed.size:  # the decision needs every key within its band
        cut = np.where(cut < KEY_MAX, widen(cut, band), cut)
    candidates = _whole_rows(plan, mixed, keys, cut) if mixed.size else None
    return RelevantRanks(clean, n_hits, hit_pos, mixed, candidates)


def _near_misses(
    sorted_rows: np.ndarray,
    row: np.ndarray,
    bits: np.ndarray,
    rel_keys: np.ndarray,
    band: np.ndarray,
    cut: np.ndarray,
    b: int,
) -> np.ndarray:
    """Rows where some key within ``band`` of a relevant key is not relevant (or may lie past
    the sorted cut-off): more keys in the band than relevant keys in it."""
    lo_key = (rel_keys.astype(np.float64) - band[row]).astype(np.float32)
    hi_key = widen(rel_keys, band[row])
    lo_key = np.where(lo_key > rel_keys - band[row], np.nextafter(lo_key, -np.inf), lo_key)
    in_band = locate(sorted_rows, row, hi_key, True) - locate(sorted_rows, row, lo_key, False)
    # Relevant keys of the same row in the band: (row, sortable bits) codes are sorted.
    rel_code = (row.astype(np.uint64) << np.uint64(32)) | bits.astype(np.uint64)
    lo_code = (row.astype(np.uint64) << np.uint64(32)) | sortable_bits(lo_key).astype(np.uint64)
    hi_code = (row.astype(np.uint64) << np.uint64(32)) | sortable_bits(hi_key).astype(np.uint64)
    rel_in_band = np.searchsorted(rel_code, hi_code, "right") - np.searchsorted(rel_code, lo_code)
    near = (in_band > rel_in_band) | (hi_key > cut[row])
    out = np.zeros(b, dtype=bool)
    out[row[near]] = True
    return out


def _sorted_rows(
    keys: np.ndarray, cut: np.ndarray, need: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's keys up to its ``cut``, sorted and padded with ``+inf`` (the whole row
    when fewer than ``need`` keys lie under the cut, or when most rows keep most keys), and
    the cut-offs used."""
    b, n = keys.shape
    mask = keys <= cut[:, None]
    counts = np.count_nonzero(mask, axis=1)
    short = counts < need
    if short.any():
        cut[short] = KEY_MAX
        mask[short] = keys[short] <= KEY_MAX
        counts[short] = np.count_nonzero(mask[short], axis=1)
    width = int(counts.max(initial=0))
    # Compacting costs a pass and a scatter; it pays when the sort shrinks by half or more.
    if 2 * width > n:
        return np.sort(keys, axis=1), np.full(b, KEY_MAX, dtype=np.float32)
    out = np.full((b, max(width, 1)), np.inf, dtype=np.float32)
    starts = np.cumsum(counts) - counts
    col = np.arange(int(counts.sum())) - np.repeat(starts, counts)
    out[np.repeat(np.arange(b), counts), col] = keys[mask]
    out.sort(axis=1)
    return out, cut


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
    # The float32 keys' error bound: the largest reference norm of the task bounds every pair.
    norms = task_norms(task)
    q_sq = norms.q_sq * (1.0 + 2.0**-40)
    m_sq = float(norms.ref_sq.max(initial=0.0)) * (1.0 + 2.0**-40)
    dim = int(task.reference.shape[1])

    def one_block(start: int) -> ScoredBlock:
        stop = min(start + size, n_query)
        if getattr(buffers, "keys", None) is None:
            buffers.keys = np.empty(min(size, n_query) * n_ref, dtype=np.float32)
        out = buffers.keys[: (stop - start) * n_ref].reshape(stop - start, n_ref)
        keys = grid_keys(search, slice(start, stop), 0, n_ref, out)
        plan.exclusions.hide(keys, np.arange(start, stop), 0, groups=True)
        codes = task.query_codes[start:stop]
        # The cut-off is the farthest relevant key (no depth threshold): a row with fewer keys
        # under it than another metric's depth is sorted whole.
        tau = np.full(stop - start, -np.inf, dtype=np.float32)
        need = plan.need[start:stop]
        band = 2 * key_bounds(q_sq[start:stop], m_sq, dim, task.distance)
        ranks = relevant_ranks(plan, keys, codes, task.reference_codes, tau, need, band)
        return score_ranks(task, start, ranks)

    starts = range(0, n_query, size)
    with progress_bar(n_query, "queries", enabled=progress) as bar, single_threaded_blas():
        for start, result in in_order(one_block, starts, n_threads):
            yield result
            bar.update(min(start + size, n_query) - start)
