"""Streaming a (memory-mapped) corpus past a fixed set of queries: exact top-depth lists and
exact ranks of chosen documents, without ever sorting a corpus row.

The corpus is read in blocks of rows (a ``.npy`` memory map is never copied whole; a float16
block becomes float32 one block at a time).  Per block and per chunk of queries, one product
gives the float32 *scores* (larger is better): ``q . r`` (inner product; cosine on rows
normalised in float32 first) or ``-||q - r||^2`` (Euclidean, as ``2 q.r - ||r||^2 - ||q||^2``).

Every (query, document) pair gets a ``uint64`` *code*, smaller = ranked first::

    code = (~sortable_bits(score)) << 32 | tie_key[document]

so score descending, then the tie key ascending: the tie key is the corpus row (``ties="index"``)
or the document's position in descending string order of the ids (``ties="trec_eval"``: equal
scores by document id descending, trec_eval's order).  A code is a total order, so the top-depth
list under it is unique and exact; "equal scores" means equal float32 scores.

1. :func:`scan_top` keeps each query's ``depth`` smallest codes.  A block's candidates are the
   scores at or above the larger of a *floor* and the score of the query's depth-th code so
   far.  The floor (:func:`sample_floor`) is a high order statistic of the query's scores
   against a fixed random sample of 4,096 corpus rows, set so that about twice ``depth``
   documents of the corpus reach it: so about 2 x depth candidates per query over the whole
   corpus, merged into the kept codes by an ``np.partition`` now and then.  Exactness does
   not rest on the estimate: if at least ``depth`` documents reached the floor, no document
   below it can be in the top; a query where fewer did (about one in a million) has its
   chunk scanned again without a floor.  It also picks out the scores of chosen (query,
   document) pairs from the products.
2. :func:`scan_ranks` gives the exact rank of chosen pairs beyond the top-depth: it counts, per
   block, the documents that beat each pair (higher score, or an equal score and a smaller tie
   key).  Same products (same shapes), so the same float32 scores.

Excluded pairs (a query's own id, user exclusion lists) get a NaN score: never a candidate,
never counted.
"""

from __future__ import annotations

import contextlib
import mmap
import queue
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..utils.errors import InputError
from ..utils.progress import progress_bar
from .candidates import from_sortable_bits, sortable_bits
from .threads import default_threads, in_order, single_threaded_blas

__all__ = [
    "EMPTY",
    "CorpusScan",
    "Pairs",
    "block_bounds",
    "code_rows",
    "code_scores",
    "corpus_block",
    "merge_top",
    "pack_codes",
    "prepare_queries",
    "release_pages",
    "rows_searchsorted",
    "sample_floor",
    "scan_ranks",
    "scan_top",
    "tie_keys",
    "torch_product",
]

#: The code of an empty slot (fewer documents than ``depth``): after every real code.
EMPTY = np.uint64(np.iinfo(np.uint64).max)
DISTANCES = ("cosine", "inner_product", "euclidean")
_CHUNK_BYTES = 16 << 20  # score matrix of one query chunk and block
_MERGE_BYTES = 64 << 20  # padded merge buffer of one query chunk
_MIN_BLOCK = 32  # rows: thinner products take other BLAS paths, with other float32 rounding


def tie_keys(doc_ids: Sequence[str] | None, n_rows: int, ties: str) -> np.ndarray:
    """Per corpus row, the secondary sort key (ascending) of equal scores.

    ``ties="index"``: the row.  ``ties="trec_eval"``: the position of the row's id in
    descending string order (trec_eval / pytrec_eval break equal scores by document id,
    larger first).

    >>> tie_keys(["b", "c", "a"], 3, "trec_eval").tolist()
    [1, 0, 2]
    >>> tie_keys(None, 3, "index").tolist()
    [0, 1, 2]
    """
    if n_rows >= int(EMPTY >> np.uint64(32)):
        raise InputError(f"the corpus has {n_rows} rows; at most 2**32 - 2 are supported.")
    if ties == "index":
        return np.arange(n_rows, dtype=np.uint64)
    order = sorted(range(n_rows), key=doc_ids.__getitem__, reverse=True)
    keys = np.empty(n_rows, dtype=np.uint64)
    keys[np.asarray(order, dtype=np.int64)] = np.arange(n_rows, dtype=np.uint64)
    return keys


def pack_codes(scores: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """``(~sortable_bits(score)) << 32 | key``: ascending code = score descending, then key.

    >>> c = pack_codes(np.float32([0.5, 0.5, 0.9]), np.uint64([1, 0, 2]))
    >>> np.argsort(c).tolist()
    [2, 1, 0]
    """
    high = (~sortable_bits(scores)).astype(np.uint64) << np.uint64(32)
    return high | keys.astype(np.uint64, copy=False)


def code_scores(codes: np.ndarray) -> np.ndarray:
    """The float32 scores of codes (NaN for :data:`EMPTY`).

    >>> code_scores(pack_codes(np.float32([0.25, -3.0]), np.uint64([7, 1]))).tolist()
    [0.25, -3.0]
    """
    high = (codes >> np.uint64(32)).astype(np.uint32)
    out = from_sortable_bits(~high)
    return np.where(codes == EMPTY, np.float32(np.nan), out)


def rows_searchsorted(sorted_rows: np.ndarray, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each ``values[i]``, the number of entries of ``sorted_rows[rows[i]]`` (each row
    ascending) below it: one vectorised binary search, O(len(values) log width) memory and time.

    >>> rows_searchsorted(np.array([[1, 3, 5], [2, 4, 6]]), np.array([0, 1, 1]),
    ...                   np.array([4, 1, 6])).tolist()
    [2, 0, 2]
    """
    lo = np.zeros(values.size, dtype=np.int64)
    hi = np.full(values.size, sorted_rows.shape[1], dtype=np.int64)
    while True:
        active = np.flatnonzero(lo < hi)
        if not active.size:
            return lo
        mid = (lo[active] + hi[active]) // 2
        below = sorted_rows[rows[active], mid] < values[active]
        lo[active[below]] = mid[below] + 1
        hi[active[~below]] = mid[~below]


def code_rows(codes: np.ndarray, row_of_key: np.ndarray | None) -> np.ndarray:
    """Corpus rows of codes (-1 for :data:`EMPTY`); ``row_of_key`` inverts the tie keys
    (None: the keys are the rows)."""
    keys = (codes & np.uint64(0xFFFFFFFF)).astype(np.int64)
    rows = keys if row_of_key is None else row_of_key[np.minimum(keys, row_of_key.size - 1)]
    return np.where(codes == EMPTY, -1, rows)


def block_bounds(n_rows: int, block: int) -> list[tuple[int, int]]:
    """Corpus blocks of ``block`` rows; a thin tail joins the block before it (a product with
    few columns takes another BLAS path, with another float32 rounding).

    >>> block_bounds(100, 40)
    [(0, 40), (40, 100)]
    >>> block_bounds(200, 64)
    [(0, 64), (64, 128), (128, 200)]
    """
    bounds, start = [], 0
    while start < n_rows:
        stop = min(n_rows, start + block)
        if n_rows - stop < _MIN_BLOCK:
            stop = n_rows
        bounds.append((start, stop))
        start = stop
    return bounds


def prepare_queries(queries: np.ndarray, distance: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Float32 C-contiguous queries (unit rows for cosine) and, for Euclidean, their squared
    norms."""
    q = np.ascontiguousarray(queries, dtype=np.float32)
    if distance == "cosine":
        q = _normalized(q)
    norms = np.einsum("ij,ij->i", q, q) if distance == "euclidean" else None
    return q, norms


def _normalized(x: np.ndarray) -> np.ndarray:
    """Unit rows in float32 (``x / ||x||``; a zero row stays zero)."""
    norm = np.sqrt(np.einsum("ij,ij->i", x, x))
    norm[norm == 0] = 1  # a zero row stays zero: every score 0
    return x / norm[:, None]


def corpus_block(
    corpus: np.ndarray, start: int, stop: int, distance: str, out: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``start:stop`` as float32 (unit rows for cosine) and their squared norms (before
    normalising), checked finite: the only copy of corpus rows ever made (into ``out`` when
    given)."""
    raw = np.asarray(corpus[start:stop])
    if raw.dtype == np.float32:
        src = raw
    else:  # float16 (or other) rows become float32 here, one block at a time
        src = np.empty(raw.shape, np.float32) if out is None else out
        src[...] = raw
    sq = np.einsum("ij,ij->i", src, src)
    finite = np.isfinite(sq)
    if not finite.all():
        row = start + int(np.flatnonzero(~finite)[0])
        raise InputError(
            f"corpus row {row} holds NaN, infinite or huge (|x| > 1e19) values; remove or "
            "repair it (embeddings must be finite)."
        )
    if distance == "cosine":
        norm = np.sqrt(sq)
        norm[norm == 0] = 1  # a zero row stays zero: every score 0
        blk = np.empty(raw.shape, np.float32) if out is None else out
        np.divide(src, norm[:, None], out=blk)  # never into the caller's corpus
        return blk, sq
    if out is not None and src is raw:  # a contiguous copy was asked for
        out[...] = raw
        return out, sq
    return src, sq


@dataclass
class Pairs:
    """(query, corpus row) pairs, grouped by query chunk and sorted by row, so a block finds
    its own with two binary searches."""

    query: np.ndarray  # int64, query index
    row: np.ndarray  # int64, corpus row
    order: np.ndarray = field(init=False)  # pair indices sorted by (chunk, row)
    chunk_lims: np.ndarray = field(init=False)

    def group(self, chunk: int, n_chunks: int) -> None:
        """Sort the pairs by (query chunk, row)."""
        ck = self.query // chunk
        self.order = np.lexsort((self.row, ck))
        self.chunk_lims = np.searchsorted(ck[self.order], np.arange(n_chunks + 1))

    def in_block(self, c: int, start: int, stop: int) -> np.ndarray:
        """Indices of chunk ``c``'s pairs whose row lies in ``start:stop``."""
        sel = self.order[self.chunk_lims[c] : self.chunk_lims[c + 1]]
        lo, hi = np.searchsorted(self.row[sel], [start, stop])
        return sel[lo:hi]


Product = Callable[..., np.ndarray]


def numpy_product(q: np.ndarray, blk: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``q @ blk.T`` in float32 (one BLAS thread: see :mod:`embedeval.engine.threads`), into
    ``out`` when given; a single query row goes through the matrix product too (a vector
    product rounds differently), so a query's scores do not depend on its chunk."""
    if q.shape[0] == 1:
        return (np.concatenate([q, q]) @ blk.T)[:1]
    return np.matmul(q, blk.T, out=out)


def torch_product(device: str) -> Product:
    """A product on a torch device: the block (and once, the query chunk) moved there, the
    float32 result brought back.  Another library's float32 sums may differ in the last bit
    from numpy's, which can only reorder documents whose scores are that close."""
    import torch

    dev = torch.device(device)
    cache: dict[int, object] = {}

    def product(q: np.ndarray, blk: np.ndarray) -> np.ndarray:
        tq = cache.get(q.__array_interface__["data"][0])
        if tq is None:  # each query chunk moves once
            tq = torch.from_numpy(np.ascontiguousarray(q)).to(dev)
            cache[q.__array_interface__["data"][0]] = tq
        tb = cache.get(("block", id(blk)))
        if tb is None:  # each block moves once, whatever the number of query chunks
            with warnings.catch_warnings():  # a read-only memory map is only read here
                warnings.simplefilter("ignore", UserWarning)
                tb = torch.from_numpy(blk).to(dev)
            cache.pop("last", None)
            for k in [k for k in cache if isinstance(k, tuple)]:
                cache.pop(k, None)
            cache[("block", id(blk))] = tb
        return (tq @ tb.T).cpu().numpy()

    return product


@dataclass
class CorpusScan:
    """Everything fixed before the first corpus block.

    ``queries`` as from :func:`prepare_queries`; ``keys`` the tie keys; ``excluded`` pairs
    never retrieved; ``block`` corpus rows per block (at most); ``product`` computes a block's
    inner products (numpy, or a device: :mod:`embedeval.search.torch_backend`).
    """

    queries: np.ndarray
    query_norms: np.ndarray | None
    distance: str
    depth: int
    keys: np.ndarray
    excluded: Pairs
    block: int = 65536
    n_threads: int | None = None
    progress: bool | None = None
    product: Product = numpy_product
    chunk: int = field(init=False)
    n_chunks: int = field(init=False)
    _buffers: queue.SimpleQueue = field(init=False, repr=False, default_factory=queue.SimpleQueue)

    def __post_init__(self) -> None:
        n_q = self.queries.shape[0]
        self.n_threads = default_threads() if self.n_threads is None else self.n_threads
        per_chunk = max(1, _CHUNK_BYTES // (4 * max(1, self.block)))
        # at least one chunk per thread so that every core works on every block
        self.chunk = max(1, min(per_chunk, -(-n_q // self.n_threads)))
        self.n_chunks = max(1, -(-n_q // self.chunk))
        self.excluded.group(self.chunk, self.n_chunks)

    def release_buffers(self) -> None:
        """Free the pooled score buffers (a later pass allocates them again)."""
        self._buffers = queue.SimpleQueue()

    @contextlib.contextmanager
    def scores(
        self, c: int, blk: np.ndarray, blk_norms: np.ndarray | None, start: int
    ) -> Iterator[np.ndarray]:
        """Float32 scores of query chunk ``c`` against a block, excluded pairs NaN, in a
        result buffer taken from a pool (as many as threads at work) and given back after."""
        lo = c * self.chunk
        q = self.queries[lo : lo + self.chunk]
        flat = None
        if self.product is numpy_product:  # a fresh result per product costs its page faults
            try:
                flat = self._buffers.get_nowait()
            except queue.Empty:
                flat = np.empty(self.chunk * (self.block + _MIN_BLOCK), dtype=np.float32)
            size = q.shape[0] * blk.shape[0]
            s = numpy_product(q, blk, flat[:size].reshape(q.shape[0], blk.shape[0]))
        else:
            s = np.asarray(self.product(q, blk), dtype=np.float32)
        if self.distance == "euclidean":
            s *= np.float32(2)
            s -= blk_norms[None, :]
            s -= self.query_norms[lo : lo + self.chunk, None]
        ex = self.excluded.in_block(c, start, start + blk.shape[0])
        if ex.size:
            s[self.excluded.query[ex] - lo, self.excluded.row[ex] - start] = np.nan
        try:
            yield s
        finally:
            if flat is not None:
                self._buffers.put(flat)


def _blocks(corpus: np.ndarray, scan: CorpusScan, unit: str) -> Iterator[tuple]:
    """``(start, block, block squared norms)`` over the corpus, with a progress bar over its
    rows; each block is read and normalised by every thread, into one reused buffer."""
    n, dim = corpus.shape
    direct = scan.distance != "cosine" and corpus.dtype == np.float32 and corpus.flags.c_contiguous
    buffer = None if direct else np.empty((min(n, scan.block + _MIN_BLOCK), dim), np.float32)
    with progress_bar(n, unit, enabled=scan.progress) as bar:
        for start, stop in block_bounds(n, scan.block):
            step = max(_MIN_BLOCK, -(-(stop - start) // scan.n_threads))
            parts = [(a, min(stop, a + step)) for a in range(start, stop, step)]

            def read(i: int, start: int = start, parts: list = parts) -> tuple:
                a, b = parts[i]
                out = None if direct else buffer[a - start : b - start]
                return corpus_block(corpus, a, b, scan.distance, out)

            done = [r for _, r in in_order(read, range(len(parts)), scan.n_threads)]
            blk = np.asarray(corpus[start:stop]) if direct else buffer[: stop - start]
            yield start, blk, np.concatenate([d[1] for d in done])
            release_pages(corpus, start, stop)
            bar.update(stop - start)


def release_pages(corpus: np.ndarray, start: int, stop: int) -> None:
    """Unmap rows ``start:stop`` of a memory-mapped corpus from this process once read: they
    stay in the page cache (the kernel keeps or drops them), but no longer count in the
    process's resident memory, which then stays that of one block.  Anything else: nothing."""
    mm = getattr(corpus, "_mmap", None)
    if mm is None or not corpus.flags.c_contiguous or stop <= start:
        return
    try:
        base = np.frombuffer(mm, dtype=np.uint8).ctypes.data
        lo = corpus[start:stop].ctypes.data - base
        hi = lo + (stop - start) * corpus.strides[0]
        page = mmap.PAGESIZE
        lo, hi = -(-lo // page) * page, hi // page * page
        if hi > lo:
            mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
    except (AttributeError, BufferError, OSError, ValueError):  # pragma: no cover
        pass  # only a memory saving


def merge_top(top: np.ndarray, rows: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """The ``depth`` smallest codes per row of ``top`` (n, depth) and of new ``codes`` given
    for rows ``rows`` (ascending), unsorted within a row.

    >>> top = np.array([[5, 9], [EMPTY, EMPTY]], dtype=np.uint64)
    >>> np.sort(merge_top(top, np.array([0, 1]), np.uint64([7, 3])), axis=1).tolist()[0]
    [5, 7]
    """
    n, depth = top.shape
    counts = np.bincount(rows, minlength=n)
    width = depth + int(counts.max(initial=0))
    if width == depth:
        return top
    step = max(1, _MERGE_BYTES // (8 * width))
    out = top.copy()
    starts = np.concatenate([[0], np.cumsum(counts)])
    for lo in range(0, n, step):  # bounded buffer even when a query ties with a whole block
        hi = min(n, lo + step)
        a, b = starts[lo], starts[hi]
        buf = np.full((hi - lo, width), EMPTY, dtype=np.uint64)
        buf[:, :depth] = top[lo:hi]
        r = rows[a:b] - lo
        buf[r, depth + np.arange(a, b) - starts[rows[a:b]]] = codes[a:b]
        out[lo:hi] = np.partition(buf, depth - 1, axis=1)[:, :depth]
    return out


def _cutoff(top: np.ndarray) -> np.ndarray:
    """Per query, the lowest score that can still enter its list (-inf while not full)."""
    worst = top.max(axis=1)
    return np.where(worst == EMPTY, np.float32(-np.inf), code_scores(worst)).astype(np.float32)


class _ChunkTop:
    """One query chunk's kept codes and the candidates waiting to be merged into them."""

    def __init__(self, n: int, depth: int, floor: np.ndarray) -> None:
        self.top = np.full((n, depth), EMPTY, dtype=np.uint64)
        self.floor = floor
        self.cut = floor.copy()  # candidates: scores >= cut
        self.passed = np.zeros(n, dtype=np.int64)
        self.pending: list[tuple[np.ndarray, np.ndarray]] = []
        self.n_pending = 0
        self.cap = max(n * depth, 1 << 16)  # pending candidates: about 12 bytes each

    def add(self, rows: np.ndarray, codes: np.ndarray) -> None:
        self.passed += np.bincount(rows, minlength=self.passed.size)
        self.pending.append((rows.astype(np.int32), codes))
        self.n_pending += rows.size
        if self.n_pending > self.cap:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            rows = np.concatenate([r for r, _ in self.pending])
            codes = np.concatenate([c for _, c in self.pending])
            order = np.argsort(rows, kind="stable")
            self.top = merge_top(self.top, rows[order], codes[order])
            self.pending, self.n_pending = [], 0
        self.cut = np.maximum(self.floor, _cutoff(self.top))


def sample_floor(corpus: np.ndarray, scan: CorpusScan, size: int = 4096) -> np.ndarray:
    """Per query, a score that about ``2 x depth`` documents reach (a high order statistic of
    the scores against a fixed random sample of corpus rows), or -inf where the corpus is too
    small for it to help.  Only a filter: :func:`scan_top` checks that enough documents
    reached it and redoes the queries where too few did.
    """
    n_q, n = scan.queries.shape[0], corpus.shape[0]
    m = min(n, size)
    k = scan.depth * m / n
    kq = int(np.ceil(k + 4.5 * np.sqrt(k) + 5))  # P(fewer than depth reach it) ~ 1e-6
    if n < 8 * scan.depth or kq >= m:
        return np.full(n_q, -np.inf, dtype=np.float32)
    rows = np.sort(np.random.default_rng(0).choice(n, m, replace=False))
    sample = np.asarray(corpus[rows], dtype=np.float32)  # a copy: normalised in place
    release_pages(corpus, 0, n)  # the sampled rows' pages
    sq = np.einsum("ij,ij->i", sample, sample)
    if scan.distance == "cosine":
        np.divide(sample, np.where(sq > 0, np.sqrt(sq), 1)[:, None], out=sample)
    floor = np.empty(n_q, dtype=np.float32)
    for lo in range(0, n_q, 256):  # bounded temporaries: 256 x 4,096 scores at a time
        s = scan.queries[lo : lo + 256] @ sample.T
        if scan.distance == "euclidean":
            s = 2 * s - sq[None, :] - scan.query_norms[lo : lo + 256, None]
        floor[lo : lo + 256] = np.partition(s, m - kq, axis=1)[:, m - kq]
    return floor


def scan_top(
    corpus: np.ndarray,
    scan: CorpusScan,
    pairs: Pairs | None = None,
    floor: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Each query's ``depth`` smallest codes, sorted (:data:`EMPTY` pads a short corpus), and
    the float32 scores of ``pairs`` (NaN where excluded).

    Candidates are the scores at or above the larger of the query's ``floor`` (default
    :func:`sample_floor`) and the score of its depth-th code so far.  The result is exact when
    at least ``depth`` documents passed (none below the floor can then be in the top); the
    chunks of the queries where fewer did are scanned again without a floor.

    >>> c = np.float32([[1, 0], [0, 1], [1, 0]])
    >>> scan = CorpusScan(np.float32([[1, 0]]), None, "inner_product", 2,
    ...                   tie_keys(None, 3, "index"), Pairs(np.zeros(0, int), np.zeros(0, int)))
    >>> code_rows(scan_top(c, scan)[0], None).tolist()
    [[0, 2]]
    """
    pairs = pairs or Pairs(np.zeros(0, np.int64), np.zeros(0, np.int64))
    pairs.group(scan.chunk, scan.n_chunks)
    pair_scores = np.full(pairs.query.size, np.nan, dtype=np.float32)
    floor = sample_floor(corpus, scan) if floor is None else floor
    tops = _scan_chunks(corpus, scan, pairs, pair_scores, floor, range(scan.n_chunks))
    short = [c for c, t in tops.items() if np.any((t.passed < scan.depth) & (t.floor > -np.inf))]
    if short:  # the floor was too high for some query (rare): those chunks again, exactly
        lowest = np.full_like(floor, -np.inf)
        tops.update(_scan_chunks(corpus, scan, pairs, pair_scores, lowest, short))
    top = np.concatenate([tops[c].top for c in range(scan.n_chunks)])
    del tops
    top.sort(axis=1)
    return top, pair_scores


def _scan_chunks(
    corpus: np.ndarray,
    scan: CorpusScan,
    pairs: Pairs,
    pair_scores: np.ndarray,
    floor: np.ndarray,
    chunks: Sequence[int],
) -> dict[int, _ChunkTop]:
    """One pass over the corpus for the given query chunks."""
    n_q = scan.queries.shape[0]
    tops = {}
    for c in chunks:
        lo, hi = c * scan.chunk, min(n_q, (c + 1) * scan.chunk)
        tops[c] = _ChunkTop(hi - lo, scan.depth, floor[lo:hi])
    with single_threaded_blas():
        for start, blk, norms in _blocks(corpus, scan, "docs"):

            def work(c: int, start=start, blk=blk, norms=norms) -> None:
                with scan.scores(c, blk, norms, start) as s:
                    p = pairs.in_block(c, start, start + blk.shape[0])
                    pair_scores[p] = s[pairs.query[p] - c * scan.chunk, pairs.row[p] - start]
                    # flat indices: 2-D np.nonzero is ~15x slower on a sparse mask
                    r, col = np.divmod(np.flatnonzero(s >= tops[c].cut[:, None]), s.shape[1])
                    codes = pack_codes(s[r, col], scan.keys[start + col])
                tops[c].add(r, codes)

            for _ in in_order(work, list(chunks), scan.n_threads):
                pass
    scan.release_buffers()
    for t in tops.values():
        t.flush()
    return tops


def scan_ranks(
    corpus: np.ndarray, scan: CorpusScan, pairs: Pairs, pair_scores: np.ndarray
) -> np.ndarray:
    """1-based rank of each pair (a document in the corpus, with its score from
    :func:`scan_top`) in its query's full ranking: 1 + the documents that beat it (a higher
    score, or an equal score and a smaller tie key).  No row is sorted: per block, one
    comparison pass per pair of a query.
    """
    beats = np.zeros(pairs.query.size, dtype=np.int64)
    order = np.lexsort((np.arange(pairs.query.size), pairs.query))
    q_sorted = pairs.query[order]
    first = np.searchsorted(q_sorted, q_sorted)
    slot = np.arange(order.size) - first  # position of the pair among its query's pairs
    width = int(slot.max(initial=-1)) + 1
    pair_keys = scan.keys[pairs.row]

    def work(c: int, start: int, blk: np.ndarray, norms: np.ndarray | None) -> None:
        lo = c * scan.chunk
        hi = min(lo + scan.chunk, scan.queries.shape[0])
        a, b = np.searchsorted(q_sorted, [lo, hi])
        if a == b:
            return
        with scan.scores(c, blk, norms, start) as s:
            idx, qs, sl = order[a:b], q_sorted[a:b] - lo, slot[a:b]
            table = np.full((hi - lo, width), np.float32(np.inf), dtype=np.float32)
            table[qs, sl] = pair_scores[idx]  # +inf pads: nothing beats it, nothing equals it
            n_equal = np.zeros(idx.size, dtype=np.int64)
            for j in range(int(sl.max()) + 1):
                col, mine = table[:, j : j + 1], sl == j
                beats[idx[mine]] += np.count_nonzero(s > col, axis=1)[qs[mine]]
                n_equal[mine] = np.count_nonzero(s == col, axis=1)[qs[mine]]
            own = (pairs.row[idx] >= start) & (pairs.row[idx] < start + blk.shape[0])
            tied = np.flatnonzero(n_equal > own)  # equal to another document than itself
            step = max(1, _CHUNK_BYTES // (4 * max(1, blk.shape[0])))
            for t0 in range(0, tied.size, step):  # rare: only tied pairs, in bounded batches
                t = tied[t0 : t0 + step]
                rr, cc = np.nonzero(s[qs[t]] == pair_scores[idx[t]][:, None])
                wins = scan.keys[start + cc] < pair_keys[idx[t]][rr]
                beats[idx[t]] += np.bincount(rr, weights=wins, minlength=t.size).astype(np.int64)

    with single_threaded_blas():
        for start, blk, norms in _blocks(corpus, scan, "docs (ranks)"):
            for _ in in_order(
                lambda c, start=start, blk=blk, norms=norms: work(c, start, blk, norms),
                range(scan.n_chunks),
                scan.n_threads,
            ):
                pass
    scan.release_buffers()
    return beats + 1
