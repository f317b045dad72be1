"""The exact, streaming kNN engine and :func:`neighbors`.

How it works (and why it is faster and lighter than a faiss ``search`` with a large k):

1. Queries are processed in blocks whose size comes from a memory budget (and a cache-sized cap
   on the block's candidates: :func:`block_layout`), so peak memory is O(block x n_reference),
   never O(n_query x n_reference).  Blocks run in worker threads (:func:`in_order`), each
   product on one BLAS thread (:func:`single_threaded_blas`), so that every pass uses every
   core and the float32 keys do not depend on the number of threads.
2. For a block, one BLAS product gives a *ranking key* per (query, reference) pair:
   ``||r||^2 - 2 q.r`` for the Euclidean distance (the query's own norm does not change its
   ranking) and ``-q.r`` for cosine / inner product.  Excluded references (the query itself,
   references in the query's group) get ``+inf``.
3. Each query needs a known number of its nearest references (its *depth*: 1 for P@1, R_q + 1
   for MAP@R, ...).  Rather than a selection over all n_reference keys, a per-query threshold is
   read off a fixed random subsample of the columns (an order statistic with a safety margin),
   all keys at or below it are kept, and the count is verified: a query whose candidate set came
   out too small is redone with every reference, so the result is always exact.  Every key
   equal to the threshold is kept, so ties at the cut-off are never split.
4. Candidates are packed as ``uint64`` = (order-preserving bits of the float32 key) << 32 | column
   and sorted per row, which orders by distance and then by ascending reference index — the tie
   rule of faiss's flat index — in one ``np.sort``.

The sorted candidate rows are handed to the metric kernels (:mod:`embedeval._kernels`) block by
block and dropped; only per-query values are kept.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import itertools
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._candidates import Candidates, from_sortable_bits, sortable_bits
from ._duplicates import DuplicateKeys, DuplicateRows, find_duplicate_rows
from ._errors import InputError, InputTypeError
from ._progress import progress_bar
from ._validation import as_embeddings, check_choice, check_int

__all__ = ["DISTANCES", "default_threads", "neighbors"]

DISTANCES = ("euclidean", "cosine", "inner_product")

_FMAX = np.float32(np.finfo(np.float32).max)
_SUBSAMPLE = 1024
_TILE = 2048
_MAX_BLOCK = 512
_BYTES_PER_CANDIDATE = 72
_SORT_RUN = 1 << 16
_MAX_THREADS = 8
_BLOCK_CODE_BYTES = 12 << 20
#: Default working-memory budget of one engine thread, in bytes.  Peak memory is about this times
#: the number of threads, plus the embeddings themselves and O(n_query) per-query results.
DEFAULT_MEMORY_BUDGET = 256 * 2**20


@dataclass(frozen=True)
class Exclusions:
    """Which references each query must not see.

    ``self_index``: query i excludes reference i (leave-one-out, or PML's ``ref_includes_query``).
    ``query_groups`` / ``reference_groups``: integer group codes; a query excludes every
    reference of its own group.
    """

    self_index: bool = False
    query_groups: np.ndarray | None = None
    reference_groups: np.ndarray | None = None

    def excluded(self, query_rows: np.ndarray, reference_cols: np.ndarray) -> np.ndarray | None:
        """Boolean mask of excluded (query, reference) pairs given as aligned index arrays."""
        out = None
        if self.self_index:
            out = reference_cols == query_rows
        if self.reference_groups is not None:
            same = self.reference_groups[reference_cols] == self.query_groups[query_rows]
            out = same if out is None else out | same
        return out


@dataclass(frozen=True)
class PreparedSearch:
    """Query and reference matrices arranged so that one product gives the ranking keys.

    Euclidean: queries ``[-2 q, 1]`` and references ``[r, ||r||^2]``, so the product is
    ``||r||^2 - 2 q.r`` (the squared distance minus the query's own norm, which does not change
    its ranking).  Cosine / inner product: ``-q`` against ``r`` (cosine normalises both first).
    Scaling by -2 or -1 is exact in floating point, so no pass over the product is needed.
    """

    queries: np.ndarray
    reference_t: np.ndarray
    query_sq_norms: np.ndarray | None
    #: Identical reference columns, whose keys are overwritten by one shared key per group.
    duplicates: DuplicateKeys | None = None

    @classmethod
    def build(cls, xq: np.ndarray, xb: np.ndarray, distance: str) -> PreparedSearch:
        if distance == "cosine":
            xq, xb = _normalize(xq, "query"), _normalize(xb, "reference")
        if distance == "euclidean":
            sq_ref = np.einsum("ij,ij->i", xb, xb, dtype=np.float32)
            ref = np.empty((xb.shape[0], xb.shape[1] + 1), dtype=np.float32)
            ref[:, :-1] = xb
            ref[:, -1] = sq_ref
            q = np.empty((xq.shape[0], xq.shape[1] + 1), dtype=np.float32)
            np.multiply(xq, np.float32(-2.0), out=q[:, :-1])
            q[:, -1] = 1.0
            sq_query = np.einsum("ij,ij->i", xq, xq, dtype=np.float32)
            return cls(q, ref.T, sq_query)
        return cls(np.negative(np.asarray(xq, dtype=np.float32)), np.asarray(xb).T, None)

    @property
    def n_reference(self) -> int:
        return int(self.reference_t.shape[1])

    def keys(
        self, rows: slice | np.ndarray, cols: slice = slice(None), out=None, tie: bool = True
    ) -> np.ndarray:
        """Ranking keys (smaller = nearer) of query ``rows`` against reference ``cols``;
        ``tie=False`` leaves identical references' columns as the product rounded them (the
        caller takes their shared keys from ``duplicates.candidates``)."""
        keys = np.matmul(self.queries[rows], self.reference_t[:, cols], out=out)
        if tie and self.duplicates is not None:
            self.duplicates.apply(keys, self.queries, rows, cols)
        return keys

    def with_duplicates(
        self, dups: DuplicateRows | None, reps_t: np.ndarray | None, columns: slice | np.ndarray
    ) -> PreparedSearch:
        """This search with the identical reference rows ``dups`` tied: its columns are the
        global reference ``columns`` (a range or sorted indices); ``reps_t`` from
        :func:`representatives`."""
        if dups is None:
            return self
        return dataclasses.replace(self, duplicates=dups.view(reps_t, columns))

    def to_distance(self, keys: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Turn keys back into what users expect: Euclidean distance or similarity."""
        if self.query_sq_norms is None:
            return -keys
        return np.sqrt(np.maximum(keys + self.query_sq_norms[rows, None], 0))


def range_exponent(arrays: list[np.ndarray], distance: str, block: int = 65536) -> int:
    """A power of two ``e`` such that ``x * 2**e`` keeps every key finite and well above the
    float32 underflow, or 0 when the data need none (the common case: keys stay bit-identical).

    Euclidean and inner-product keys grow like d * max|x|**2, so finite inputs above about
    2**60 overflow float32, and below about 2**-63 their products underflow (to 0 below
    2**-75); inputs are scaled when d * max|x|**2 nears 2**118 or max|x| < 2**-40.  Scaling by
    the same power of two on both sides is exact and changes no ranking (every key is
    multiplied by 2**(2e)), so the data are brought to max|x| in [0.5, 1) instead.  Cosine
    normalises each row first and needs no scaling.
    """
    if distance == "cosine":
        return 0
    largest = 0.0
    for x in arrays:
        for a in range(0, x.shape[0], block):
            largest = max(largest, float(np.abs(np.asarray(x[a : a + block])).max(initial=0)))
    dim = arrays[0].shape[1]
    if largest == 0.0 or (4.0 * dim * largest * largest < 2.0**120 and largest >= 2.0**-40):
        return 0
    return -int(np.frexp(largest)[1])


def reference_duplicates(xb: np.ndarray, distance: str) -> DuplicateRows | None:
    """Groups of reference rows that are identical as the search sees them (cosine: after
    normalisation, so a vector and its double are one point)."""
    prepare = (lambda rows: _normalize(rows, "reference")) if distance == "cosine" else None
    return find_duplicate_rows(xb, prepare)


def representatives(xb: Any, dups: DuplicateRows | None, distance: str) -> np.ndarray | None:
    """The first member of each duplicate group, prepared like a reference (dim' x groups)."""
    if dups is None:
        return None
    rows = np.asarray(xb[dups.first], dtype=np.float32)
    return PreparedSearch.build(rows[:1], rows, distance).reference_t


def _normalize(x: np.ndarray, name: str) -> np.ndarray:
    norms = np.sqrt(np.einsum("ij,ij->i", x, x, dtype=np.float64)).astype(np.float32)
    if (norms == 0).any():
        raise InputError(
            f"distance='cosine' needs non-zero vectors; {int((norms == 0).sum())} row(s) of "
            f"{name} are all zero (first at row {int(np.flatnonzero(norms == 0)[0])}). Drop "
            "them or use distance='euclidean'."
        )
    return np.asarray(x, dtype=np.float32) / norms[:, None]


def _depth_thresholds(
    search: PreparedSearch,
    start: int,
    stop: int,
    need: np.ndarray,
    subsample: np.ndarray | None,
    exclusions: Exclusions,
) -> np.ndarray:
    """Per-query threshold tau with (very likely) at least ``need`` valid keys <= tau.

    The threshold is an order statistic of a fixed random column subsample of size m: with
    s = m / n_reference, it is the j-th smallest valid subsample key with
    j = s * need + 4 * sqrt(s * need) + 2, a margin of four binomial standard deviations.  The
    caller verifies the count and redoes the rare query whose candidate set came out short.
    """
    tau = np.full(stop - start, _FMAX, dtype=np.float32)
    if subsample is None:
        return tau
    m = subsample.size
    expected = need * (m / search.n_reference)
    j = np.ceil(expected + 4.0 * np.sqrt(expected) + 2.0).astype(np.int64)
    usable = j < m
    if not usable.any():
        return tau
    sample = search.keys(slice(start, stop), subsample)
    rows = np.arange(start, stop)
    excluded = exclusions.excluded(rows[:, None], subsample[None, :])
    if excluded is not None:
        sample[excluded] = np.inf
    kth = np.unique(j[usable])
    if kth[-1] <= 32:
        # Shallow needs: one partition at the largest order statistic, then a small sort of the
        # head, is cheaper than a partition with several kth.
        sample.partition(kth[-1], axis=1)
        sample[:, : kth[-1]].sort(axis=1)
    elif kth.size <= 4:
        sample.partition(kth, axis=1)
    else:
        sample.sort(axis=1)
    picked = np.flatnonzero(usable)
    # An excluded column holds +inf; a sample with fewer than j valid keys must not turn that
    # into the cut-off, or ``keys <= tau`` would let excluded references in.  The largest
    # finite key keeps every valid reference instead.
    tau[picked] = np.minimum(sample[picked, j[picked]], _FMAX)
    return tau


def sorted_candidates(
    xq: np.ndarray,
    xb: np.ndarray,
    *,
    distance: str,
    depth: np.ndarray,
    exclusions: Exclusions = Exclusions(),
    n_valid: np.ndarray | None = None,
    positive_threshold: tuple[str, np.ndarray, np.ndarray] | None = None,
    block_size: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    progress: bool | None = None,
    n_threads: int | None = None,
    finish: Callable[[Candidates], Any] | None = None,
) -> Iterator[Any]:
    """Yield, block by block, each query's nearest references in ranking order (CSR form).

    Each :class:`Candidates` holds, for every query of the block, at least
    ``min(depth[q], n_valid[q])`` references (more when ties or the threshold margin add some),
    sorted by key and then by ascending reference index (the tie rule of faiss's flat index).

    ``positive_threshold = ("max" | "min", query_codes, reference_codes)`` additionally keeps every
    reference up to the farthest ("max", for full-depth AP) or nearest ("min", for MRR) reference
    sharing the query's label.  Queries with ``depth == 0`` get no candidates.

    Blocks are computed by ``n_threads`` threads (default: :func:`default_threads`), each with
    its own working memory of about ``memory_budget`` bytes, and yielded in order.  ``finish``,
    when given, is applied to each block in its thread (e.g. the metric kernels), and its result
    is yielded instead of the :class:`Candidates`.
    """
    n_query, n_ref = xq.shape[0], xb.shape[0]
    search = PreparedSearch.build(xq, xb, distance)
    dups = reference_duplicates(xb, distance)
    search = search.with_duplicates(dups, representatives(xb, dups, distance), slice(0, n_ref))
    if n_valid is None:
        n_valid = np.full(n_query, n_ref - int(exclusions.self_index), dtype=np.int64)
    need = np.minimum(depth, n_valid)
    tile, block_size, col_bits = block_layout(
        need,
        n_ref,
        positive_threshold is not None,
        block_size,
        memory_budget,
        0 if dups is None else dups.n_groups,
    )
    subsample = column_subsample(need, n_ref)
    buffers = threading.local()  # each thread reuses its own key and mask buffers

    def one_block(start: int) -> Any:
        if getattr(buffers, "keys", None) is None:
            buffers.keys = np.empty(min(block_size, n_query) * tile, dtype=np.float32)
            buffers.mask = np.empty(buffers.keys.size, dtype=bool)
        block = search_block(
            search,
            start,
            min(start + block_size, n_query),
            need,
            subsample,
            exclusions,
            positive_threshold,
            tile,
            col_bits,
            (buffers.keys, buffers.mask),
            memory_budget,
        )
        return block if finish is None else finish(block)

    starts = range(0, n_query, block_size)
    with progress_bar(n_query, "queries", enabled=progress) as bar, single_threaded_blas():
        for start, result in in_order(one_block, starts, n_threads):
            yield result
            bar.update(min(start + block_size, n_query) - start)


def block_layout(
    need: np.ndarray,
    n_ref: int,
    label_threshold: bool,
    block_size: int | None,
    memory_budget: int,
    n_groups: int = 0,
) -> tuple[int, int, int]:
    """Column tile width, queries per block and reference-index bits of the packed codes.

    Product shapes decide float32 rounding, so every backend that must reproduce the local
    engine's keys takes its layout from here.  The block size is the largest that keeps a block's
    working memory within ``memory_budget`` and its candidate codes within about 12 MiB: the
    extraction, packing, sort and kernels stream those codes several times, and a block that
    stays in the caches runs faster (20,000 queries needing 4,000 neighbours each, best of four
    on two cores: 476-query blocks 3.7 s, 335: 3.5 s, 256: 3.2 s, 200: 3.4 s).
    """
    col_bits = max(1, int(n_ref - 1).bit_length())
    if not label_threshold:
        # Tiles of references small enough for the product, the comparison and the index
        # extraction to run in cache instead of streaming a block x n_reference matrix.
        tile = n_ref if n_ref <= 16 * _TILE else _TILE
        expected = min(n_ref, int(need.max(initial=0) * 1.5) + 256)
        per_row = tile * 5 + expected * _BYTES_PER_CANDIDATE
    else:
        # The label threshold needs every key of a row before any comparison: whole rows.
        tile = n_ref
        expected = n_ref
        per_row = n_ref * (11 + _BYTES_PER_CANDIDATE)
    per_row += 4 * n_groups  # the shared keys of identical references (embedeval._duplicates)
    if block_size is None:
        in_cache = _BLOCK_CODE_BYTES // (8 * expected)
        block_size = int(max(1, min(_MAX_BLOCK, memory_budget // per_row, max(16, in_cache))))
    # The packed sort key is (row in block, key bits, reference index) in 64 bits.
    block_size = max(1, min(block_size, 2 ** (32 - col_bits)))
    return tile, block_size, col_bits


def column_subsample(need: np.ndarray, n_ref: int) -> np.ndarray | None:
    """The fixed, seeded reference columns the depth thresholds are read from (sorted), or None
    when the reference is small enough to threshold on every column.  Every backend that must
    reproduce the engine's candidates uses this one."""
    # A larger subsample when queries need deep rankings: the threshold margin (relative to the
    # depth) shrinks with the subsample, and every extra candidate must be sorted.
    m = _SUBSAMPLE if need.max(initial=0) * _SUBSAMPLE < 64 * n_ref else 4 * _SUBSAMPLE
    if n_ref <= 2 * m:
        return None
    return np.sort(np.random.default_rng(0).choice(n_ref, m, replace=False))


def search_block(
    search: PreparedSearch,
    start: int,
    stop: int,
    need: np.ndarray,
    subsample: np.ndarray | None,
    exclusions: Exclusions,
    positive_threshold: tuple[str, np.ndarray, np.ndarray] | None,
    tile: int,
    col_bits: int,
    buffers: tuple[np.ndarray, np.ndarray],
    memory_budget: int,
) -> Candidates:
    """The engine's work for query rows ``[start, stop)`` of ``search``: depth thresholds from
    the column subsample, candidates at or below them, the rare short row redone against every
    reference, and the sort.  ``buffers`` are the caller's (keys, mask) scratch arrays of at
    least ``(stop - start) * tile`` items; the local engine and Dask workers share this code."""
    block_need = need[start:stop]
    tau = _depth_thresholds(search, start, stop, block_need, subsample, exclusions)
    tau[block_need <= 0] = -np.inf
    codes, counts = _collect(
        search, start, stop, tau, tile, *buffers, exclusions, positive_threshold, col_bits
    )
    short = np.flatnonzero(counts < block_need)
    if short.size:  # the subsample margin failed (rare): take every valid reference
        codes, counts = _redo_rows(
            search, start, short, codes, counts, exclusions, memory_budget, col_bits
        )
    # Whole-row tiles leave the codes grouped by row unless redone rows were appended.
    grouped = tile == search.n_reference and not short.size
    return _sort_block(codes, counts, start, col_bits, grouped)


def default_threads() -> int:
    """Worker threads the engine uses by default: the cores this process may run on (at most
    8: each thread holds its own block of working memory)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, _MAX_THREADS))


_BLAS_LOCK = threading.Lock()
_BLAS_STATE: dict[str, Any] = {"users": 0, "controller": None, "limiter": None}


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Limit BLAS to one thread per call while the engine runs.

    The engine parallelises over query blocks instead (every numpy pass then runs on all cores,
    not only the product), and a product's float32 rounding depends on how BLAS splits it among
    threads: with one thread per product, keys — hence ties and values — do not depend on the
    machine's core count or on ``n_threads``, and distributed workers reproduce them.  The limit
    is process-wide (that is how BLAS libraries work), so it is reference-counted: concurrent
    runs in one process (user threads, a Dask worker's threads) keep it until the last one ends,
    and the caller's setting comes back then.
    """
    with _BLAS_LOCK:
        if _BLAS_STATE["users"] == 0:
            if _BLAS_STATE["controller"] is None:
                from threadpoolctl import ThreadpoolController

                _BLAS_STATE["controller"] = ThreadpoolController()
            _BLAS_STATE["limiter"] = _BLAS_STATE["controller"].limit(limits=1, user_api="blas")
        _BLAS_STATE["users"] += 1
    try:
        yield
    finally:
        with _BLAS_LOCK:
            _BLAS_STATE["users"] -= 1
            if _BLAS_STATE["users"] == 0:
                _BLAS_STATE["limiter"].restore_original_limits()
                _BLAS_STATE["limiter"] = None


def in_order(
    fn: Callable[[int], Any], items: Iterable[int], n_threads: int | None
) -> Iterator[tuple[int, Any]]:
    """``(item, fn(item))`` in the order of ``items``, computed by ``n_threads`` threads with at
    most ``n_threads`` results waiting, so memory stays that of a few blocks."""
    n_threads = default_threads() if n_threads is None else n_threads
    items = list(items)
    if n_threads <= 1 or len(items) <= 1:
        for item in items:
            yield item, fn(item)
        return
    waiting: collections.deque = collections.deque()
    feed = iter(items)
    with concurrent.futures.ThreadPoolExecutor(n_threads, "embedeval-engine") as pool:
        try:
            for item in itertools.islice(feed, n_threads):
                waiting.append((item, pool.submit(fn, item)))
            while waiting:
                item, future = waiting.popleft()
                result = future.result()
                for nxt in itertools.islice(feed, 1):
                    waiting.append((nxt, pool.submit(fn, nxt)))
                yield item, result
        finally:
            # An error, Ctrl-C or an abandoned generator: start no further block.
            for _, future in waiting:
                future.cancel()


def _collect(
    search: PreparedSearch,
    start: int,
    stop: int,
    tau: np.ndarray,
    tile: int,
    keys_buffer: np.ndarray,
    mask_buffer: np.ndarray,
    exclusions: Exclusions,
    positive_threshold: tuple[str, np.ndarray, np.ndarray] | None,
    col_bits: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Packed codes of every valid (row, reference) of the block with key <= tau[row], and the
    count per row.  Code = row << (32 + col_bits) | sortable key bits << col_bits | reference."""
    b = stop - start
    n_ref = search.n_reference
    # Excluded pairs carry the key +inf; a finite cut-off is what keeps them out of ``mask``.
    tau = np.minimum(tau, _FMAX)
    row_codes = np.arange(b, dtype=np.uint64) << np.uint64(32 + col_bits)
    counts = np.zeros(b, dtype=np.int64)
    codes = []
    own = np.arange(start, stop)
    # Identical references: rather than writing their shared keys into every tile (a scatter
    # over b x members per tile), mask them out of the tiles' candidates and add them once per
    # block from the group keys.  The label threshold reads whole rows: there they are written.
    twins = search.duplicates if positive_threshold is None else None
    for t0 in range(0, n_ref, tile):
        t1 = min(t0 + tile, n_ref)
        width = t1 - t0
        has_twins = twins is not None and twins.any_in(t0, t1)
        keys = grid_keys(search, slice(start, stop), t0, t1,
                         keys_buffer[: b * width].reshape(b, width), tie=twins is None)  # fmt: skip
        if exclusions.self_index:
            inside = np.flatnonzero((own >= t0) & (own < t1))
            keys[inside, own[inside] - t0] = np.inf
        if positive_threshold is not None:
            if exclusions.reference_groups is not None:
                same = exclusions.reference_groups[None, :] == exclusions.query_groups[own, None]
                keys[same] = np.inf
            tau = np.maximum(tau, _positive_tau(keys, positive_threshold, start, stop))
        mask = np.less_equal(keys, tau[:, None], out=mask_buffer[: b * width].reshape(b, width))
        if has_twins:  # their shared keys are added below
            np.logical_and(mask, twins.others(t0, t1)[None, :], out=mask)
        filter_groups = exclusions if positive_threshold is None else None
        code, per_row = _pack_hits(keys, mask, t0, start, row_codes, filter_groups, col_bits)
        codes.append(code)
        counts += per_row
    codes = codes[0] if len(codes) == 1 else np.concatenate(codes)
    if twins is not None:
        extra, per_row = twins.candidates(
            search.queries,
            slice(start, stop),
            tau,
            lambda r, c: exclusions.excluded(r + start, c),
            col_bits,
            sortable_bits,
        )
        if tile >= n_ref:  # one tile: the codes are grouped by row, keep them so
            codes = _interleave_rows(codes, counts, extra, per_row)
        else:
            codes = np.concatenate((codes, extra))
        counts += per_row
    return codes, counts


def _pack_hits(
    keys: np.ndarray,
    mask: np.ndarray,
    t0: int,
    start: int,
    row_codes: np.ndarray,
    exclusions: Exclusions | None,
    col_bits: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Packed codes of the ``mask``-ed keys of one tile (columns from ``t0``) and the count per
    row, leaving out references of the query's group when ``exclusions`` holds groups."""
    b, width = keys.shape
    flat = np.flatnonzero(mask)
    # Row of each hit from the row boundaries (cheaper than a 64-bit division per hit).
    per_row = np.diff(np.searchsorted(flat, np.arange(0, (b + 1) * width, width)))
    values = keys.ravel()[flat]
    if exclusions is not None and exclusions.reference_groups is not None:
        flat -= np.repeat(np.arange(0, b * width, width) - t0, per_row)  # the reference
        row = np.repeat(np.arange(start, start + b), per_row)
        keep = exclusions.reference_groups[flat] != exclusions.query_groups[row]
        flat, values = flat[keep], values[keep]
        per_row = np.bincount(row[keep] - start, minlength=b)
        rows_and_refs = flat.view(np.uint64)
        rows_and_refs |= np.repeat(row_codes, per_row)
    else:
        # flat = row * width + (reference - t0), so adding row * (2**(32 + col_bits) - width)
        # + t0 gives (row << (32 + col_bits)) | reference in one pass (uint64 wraps exactly).
        shift = row_codes - np.arange(b, dtype=np.uint64) * np.uint64(width) + np.uint64(t0)
        rows_and_refs = flat.view(np.uint64)
        rows_and_refs += np.repeat(shift, per_row)
    code = sortable_bits(values).astype(np.uint64) << np.uint64(col_bits)
    code |= rows_and_refs
    return code, per_row


def _interleave_rows(
    a: np.ndarray, count_a: np.ndarray, b: np.ndarray, count_b: np.ndarray
) -> np.ndarray:
    """Two arrays of codes, each grouped by row (``count_*`` per row), merged row by row, so
    a whole-row block stays grouped (its sort then runs on cache-sized runs of rows)."""
    lims_a = np.concatenate(([0], np.cumsum(count_a)))
    lims_b = np.concatenate(([0], np.cumsum(count_b)))
    lims = lims_a + lims_b
    out = np.empty(a.size + b.size, dtype=a.dtype)
    out[np.arange(a.size) + np.repeat(lims[:-1] - lims_a[:-1], count_a)] = a
    out[np.arange(b.size) + np.repeat(lims[:-1] - lims_b[:-1] + count_a, count_b)] = b
    return out


def grid_keys(
    search: PreparedSearch,
    rows: slice | np.ndarray,
    t0: int,
    t1: int,
    out: np.ndarray | None = None,
    tie: bool = True,
) -> np.ndarray:
    """Keys of ``rows`` against reference columns ``[t0, t1)``, multiplied in ``_TILE``-column
    products on the global column grid when the reference is larger than 16 tiles (``tie``:
    see :meth:`PreparedSearch.keys`).

    BLAS rounds the same dot product differently in products of different shapes, so computing
    every key in the same product shapes (whatever the caller's row and column ranges) is what
    lets sharded and distributed backends reproduce these float32 keys bit for bit.
    """
    if search.n_reference <= 16 * _TILE or t1 - t0 <= _TILE:
        return search.keys(rows, slice(t0, t1), out=out, tie=tie)
    n_rows = (rows.stop - rows.start) if isinstance(rows, slice) else len(rows)
    if out is None:
        out = np.empty((n_rows, t1 - t0), dtype=np.float32)
    for c0 in range(t0 - t0 % _TILE, t1, _TILE):
        a, b = max(c0, t0), min(c0 + _TILE, t1)
        part = search.keys(rows, slice(c0, c0 + _TILE), tie=tie)
        out[:, a - t0 : b - t0] = part[:, a - c0 : b - c0]
    return out


def _positive_tau(
    keys: np.ndarray, spec: tuple[str, np.ndarray, np.ndarray], start: int, stop: int
) -> np.ndarray:
    how, q_codes, r_codes = spec
    positive = (r_codes[None, :] == q_codes[start:stop, None]) & (keys <= _FMAX)
    if how == "max":
        out = np.where(positive, keys, -np.inf).max(axis=1)
    else:
        out = np.where(positive, keys, np.inf).min(axis=1)
        out[~np.isfinite(out)] = -np.inf
    return out.astype(np.float32)


def _redo_rows(
    search: PreparedSearch,
    start: int,
    short: np.ndarray,
    codes: np.ndarray,
    counts: np.ndarray,
    exclusions: Exclusions,
    memory_budget: int,
    col_bits: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Replace the candidates of rows ``short`` (block-relative) by all their valid references."""
    row_shift = np.uint64(32 + col_bits)
    parts = [codes[~np.isin(codes >> row_shift, short.astype(np.uint64))]]
    counts = counts.copy()
    n_ref = search.n_reference
    step = max(1, memory_budget // (n_ref * 24))
    cols = np.arange(n_ref, dtype=np.uint64)
    for s in range(0, short.size, step):
        redo = short[s : s + step]
        keys = grid_keys(search, start + redo, 0, n_ref)
        r = np.repeat(redo, n_ref)
        c = np.tile(cols, redo.size)
        v = keys.ravel()
        excluded = exclusions.excluded(r + start, c.astype(np.int64))
        if excluded is not None:
            r, c, v = r[~excluded], c[~excluded], v[~excluded]
        code = sortable_bits(v).astype(np.uint64) << np.uint64(col_bits)
        code |= r.astype(np.uint64) << row_shift
        code |= c
        parts.append(code)
        counts[redo] = np.bincount(r, minlength=counts.size)[redo]
    return np.concatenate(parts), counts


def _sort_block(
    codes: np.ndarray, counts: np.ndarray, start: int, col_bits: int, rows_grouped: bool
) -> Candidates:
    # Sorting (row, key bits, reference index) packed in a uint64 orders every row by key and
    # breaks ties by ascending reference index, with no per-row padding.  When the codes are
    # already grouped by row, cache-sized runs of whole rows are sorted separately (faster).
    lims = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=lims[1:])
    if rows_grouped and codes.size > _SORT_RUN:
        cuts = np.unique(np.searchsorted(lims, np.arange(0, codes.size, _SORT_RUN)))
        edges = np.append(lims[np.minimum(cuts, counts.size)], codes.size)
        for a, b in itertools.pairwise(edges):
            codes[a:b].sort()
    else:
        codes.sort()
    if col_bits < 31 and sys.byteorder == "little":
        # The reference index sits in the low word: mask it there (half the memory traffic).
        index = (codes.view(np.uint32)[0::2] & np.uint32((1 << col_bits) - 1)).view(np.int32)
    else:
        index = (codes & np.uint64((1 << col_bits) - 1)).astype(np.int64)
    bits = (codes >> np.uint64(col_bits)).astype(np.uint32)  # the cast keeps the low 32 bits
    return Candidates(np.arange(start, start + counts.size), lims, index, bits)


def neighbors(
    query: Any,
    k: int,
    reference: Any = None,
    *,
    distance: str = "euclidean",
    exclude_self: bool | None = None,
    block_size: int | None = None,
    progress: bool | None = False,
    n_threads: int | None = None,
    backend: str = "local",
    device: str | None = None,
    device_memory: float | None = None,
    tf32: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact k nearest neighbours, streamed in query blocks.

    Parameters
    ----------
    query : array-like, shape (n_query, dim)
        Query vectors (float16/32/64, lists, memory-mapped arrays, torch CPU tensors).
    k : int
        Neighbours per query; clamped to the number of references each query can see.
    reference : array-like, shape (n_reference, dim), optional
        The searched set.  ``None`` searches the query set itself.
    distance : {"euclidean", "cosine", "inner_product"}
        Euclidean ranks like squared L2; cosine L2-normalises both sides first.
    exclude_self : bool, optional
        Exclude each query's own row (query i is reference i).  Defaults to ``True`` when
        ``reference`` is None and ``False`` otherwise; ``True`` with a reference requires the
        queries to be the first reference rows (identity, not position, is what is excluded).
    block_size : int, optional
        Queries per block (default: from a 256 MB working budget).
    progress : bool, optional
        Show a progress bar (``None``: only on a terminal).
    n_threads : int, optional
        Threads searching query blocks (default: the usable cores, at most 8); the result does
        not depend on it.
    backend, device, device_memory, tf32 :
        ``backend="torch"`` searches with PyTorch on ``device`` (GPU tensors select it by
        themselves); see :func:`embedeval.evaluate`.

    Returns
    -------
    distances : ndarray of float32, shape (n_query, k')
        The Euclidean distance (the square root of squared L2, not squared), the cosine
        similarity, or the inner product; nearest first, so similarities are descending.
    indices : ndarray of int64, shape (n_query, k')
        Reference row indices.  ``k' = min(k, references available)``.

    Notes
    -----
    Ties (equal distances) are ordered by ascending reference index, which is what faiss's flat
    index does; unlike faiss, a ``k`` larger than the reference set is clamped, never padded
    with index -1.  Identical reference vectors are at exactly the same distance (see the
    README's conventions).  Inputs so large or so small that float32 keys would overflow or
    underflow (beyond about 2**60 or below 2**-40) are searched after scaling by a power of two,
    which changes no ranking; distances are returned in the input's units.

    Examples
    --------
    >>> x = [[0.0], [1.0], [3.0], [7.0]]
    >>> d, i = neighbors(x, 2)
    >>> i.tolist()
    [[1, 2], [0, 2], [1, 0], [2, 1]]
    >>> d.tolist()
    [[1.0, 3.0], [1.0, 2.0], [2.0, 3.0], [4.0, 6.0]]
    """
    distance = check_choice(distance, "distance", DISTANCES)
    k = check_int(k, "k", maximum=2**63 - 1)
    n_threads = check_int(n_threads, "n_threads", allow_none=True)
    if exclude_self is not None and not isinstance(exclude_self, (bool, np.bool_)):
        raise InputTypeError(
            f"exclude_self must be True, False or None; got {exclude_self!r} of type "
            f"{type(exclude_self).__name__}."
        )
    from ._torch_backend import TorchOptions, as_search_input, is_device_tensor, scale_for_range

    backend = check_choice(backend, "backend", ("local", "torch"))
    if backend == "local" and is_device_tensor(query):
        backend = "torch"
    options = None
    if backend == "torch":
        options = TorchOptions.make(device, device_memory, tf32, block_size, like=query)
    elif device is not None or device_memory is not None or tf32 is not False:
        raise InputError("device=, device_memory= and tf32= need backend='torch'.")
    read = as_search_input if options else as_embeddings
    xq = read(query, "query")
    if reference is None:
        xb = xq
        exclude_self = True if exclude_self is None else bool(exclude_self)
    else:
        xb = read(reference, "reference")
        exclude_self = bool(exclude_self)
        if xb.shape[1] != xq.shape[1]:
            raise InputError(
                f"query has dimension {xq.shape[1]} but reference has {xb.shape[1]}; both must "
                "come from the same embedding model."
            )
        if exclude_self and options:
            from ._torch_backend import check_lead_on_device

            check_lead_on_device(xq, xb)
        elif exclude_self:
            check_queries_lead_reference(xq, xb, "exclude_self")
    xq, xb, scale = scale_for_range(xq, xb, distance, same=reference is None)
    available = xb.shape[0] - int(exclude_self)
    k_eff = min(k, available)
    if options:
        from ._torch_backend import torch_neighbors

        dist, idx = torch_neighbors(xq, xb, k_eff, distance, exclude_self, options)
        return _unscale(dist, scale, distance), idx
    n_query = xq.shape[0]
    dist = np.empty((n_query, k_eff), dtype=np.float32)
    idx = np.empty((n_query, k_eff), dtype=np.int64)
    if k_eff == 0:
        return dist, idx
    q_norms = np.einsum("ij,ij->i", xq, xq, dtype=np.float32) if distance == "euclidean" else None
    for block in sorted_candidates(
        xq,
        xb,
        distance=distance,
        depth=np.full(n_query, k_eff),
        exclusions=Exclusions(self_index=exclude_self),
        block_size=block_size,
        progress=progress,
        n_threads=n_threads,
    ):
        take = (block.lims[:-1, None] + np.arange(k_eff)).ravel()
        rows = block.queries
        key = from_sortable_bits(block.bits[take]).reshape(rows.size, k_eff)
        if distance == "euclidean":
            dist[rows] = np.sqrt(np.maximum(key + q_norms[rows, None], 0))
        else:
            dist[rows] = -key
        idx[rows] = block.index[take].reshape(rows.size, k_eff)
    return _unscale(dist, scale, distance), idx


def _unscale(dist: np.ndarray, scale: int, distance: str) -> np.ndarray:
    """Distances of inputs scaled by 2**scale back in the caller's units (a similarity beyond
    float32's range is +-inf)."""
    if not scale:
        return dist
    with np.errstate(over="ignore"):
        return np.ldexp(dist, -scale if distance == "euclidean" else -2 * scale)


def check_queries_lead_reference(
    xq: np.ndarray, xb: np.ndarray, argument: str = "ref_includes_query"
) -> None:
    """Check PML's ``ref_includes_query`` convention: the queries are the first reference rows.

    ``argument`` is the caller's name for the option that asked for it (``evaluate``'s
    ``ref_includes_query``, ``neighbors``' ``exclude_self``); the message names it and gives
    that caller's fix.
    """
    fix = (
        "Pass reference=None to search the query set itself (each query's own row excluded), "
        "or exclude_self=False for a reference set that does not contain the queries."
        if argument == "exclude_self"
        else "Pass reference=None for leave-one-out, or ref_includes_query=False for a disjoint "
        "gallery."
    )
    n = xq.shape[0]
    if xb.shape[0] < n:
        raise InputError(
            f"{argument}=True needs the {n} queries to be the first rows of reference, "
            f"but reference has only {xb.shape[0]} rows. {fix}"
        )
    step = 65536
    for s in range(0, n, step):
        e = min(s + step, n)
        a, b = np.asarray(xq[s:e]), np.asarray(xb[s:e])
        differ = np.flatnonzero((a != b).any(axis=1))
        if differ.size:
            row = s + int(differ[0])
            raise InputError(
                f"{argument}=True needs the queries to be the first rows of reference "
                f"(query i is reference i, PML's convention), but query row {row} differs "
                f"from reference row {row}. {fix}"
            )


#: Engine steps that other engine modules (the symmetric leave-one-out engine) reuse.
depth_thresholds = _depth_thresholds
sort_block = _sort_block
