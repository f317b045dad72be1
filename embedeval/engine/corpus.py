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

1. :func:`scan_top` keeps each query's ``depth`` smallest codes: a block's candidates are the
   scores at or above the query's current cut-off score (the score of its depth-th code so
   far), merged with the kept codes by one ``np.partition``.  The first block holds
   ``2 x depth`` rows and each next block at most as many rows as were seen before it (then
   ``block`` rows), so a block brings about ``depth`` candidates per query, not a corpus row.
   It also picks out the scores of chosen (query, document) pairs from the products.
2. :func:`scan_ranks` gives the exact rank of chosen pairs beyond the top-depth: it counts, per
   block, the documents that beat each pair (higher score, or an equal score and a smaller tie
   key).  Same products (same shapes), so the same float32 scores.

Excluded pairs (a query's own id, user exclusion lists) get a NaN score: never a candidate,
never counted.
"""

from __future__ import annotations

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
    "scan_ranks",
    "scan_top",
    "tie_keys",
    "torch_product",
]

#: The code of an empty slot (fewer documents than ``depth``): after every real code.
EMPTY = np.uint64(np.iinfo(np.uint64).max)
DISTANCES = ("cosine", "inner_product", "euclidean")
_CHUNK_BYTES = 32 << 20  # score matrix of one query chunk and block
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


def code_rows(codes: np.ndarray, row_of_key: np.ndarray | None) -> np.ndarray:
    """Corpus rows of codes (-1 for :data:`EMPTY`); ``row_of_key`` inverts the tie keys
    (None: the keys are the rows)."""
    keys = (codes & np.uint64(0xFFFFFFFF)).astype(np.int64)
    rows = keys if row_of_key is None else row_of_key[np.minimum(keys, row_of_key.size - 1)]
    return np.where(codes == EMPTY, -1, rows)


def block_bounds(n_rows: int, depth: int, block: int) -> list[tuple[int, int]]:
    """Corpus blocks: ``2 x depth`` rows first, then at most as many as seen so far, then
    ``block`` rows (the running cut-off lets about ``depth`` candidates through per block).

    >>> block_bounds(10, 2, 4)
    [(0, 10)]
    >>> block_bounds(200, 10, 64)
    [(0, 32), (32, 64), (64, 128), (128, 200)]
    """
    bounds, start = [], 0
    while start < n_rows:
        size = min(block, max(2 * depth, start, _MIN_BLOCK))
        stop = min(n_rows, start + size)
        if n_rows - stop < _MIN_BLOCK:  # no thin tail: BLAS rounds thin products differently
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
    norm = np.sqrt(np.einsum("ij,ij->i", x, x))
    norm[norm == 0] = 1  # a zero row stays zero: every score 0
    return x / norm[:, None]


def corpus_block(corpus: np.ndarray, start: int, stop: int, distance: str) -> np.ndarray:
    """Rows ``start:stop`` as float32 (unit rows for cosine), checked finite: the only copy of
    corpus rows ever made."""
    blk = np.ascontiguousarray(corpus[start:stop], dtype=np.float32)
    finite = np.isfinite(blk).all(axis=1)
    if not finite.all():
        row = start + int(np.flatnonzero(~finite)[0])
        raise InputError(
            f"corpus row {row} holds NaN or infinite values; remove or repair it "
            "(embeddings must be finite)."
        )
    return _normalized(blk) if distance == "cosine" else blk


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


Product = Callable[[np.ndarray, np.ndarray], np.ndarray]


def numpy_product(q: np.ndarray, blk: np.ndarray) -> np.ndarray:
    """``q @ blk.T`` in float32 (one BLAS thread: see :mod:`embedeval.engine.threads`); a
    single query row goes through the matrix product too (a vector product rounds
    differently), so a query's scores do not depend on its chunk."""
    if q.shape[0] == 1:
        return (np.concatenate([q, q]) @ blk.T)[:1]
    return q @ blk.T


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

    def __post_init__(self) -> None:
        n_q = self.queries.shape[0]
        self.n_threads = default_threads() if self.n_threads is None else self.n_threads
        per_chunk = max(1, _CHUNK_BYTES // (4 * max(1, self.block)))
        # at least one chunk per thread so that every core works on every block
        self.chunk = max(1, min(per_chunk, -(-n_q // self.n_threads)))
        self.n_chunks = max(1, -(-n_q // self.chunk))
        self.excluded.group(self.chunk, self.n_chunks)

    def scores(self, c: int, blk: np.ndarray, blk_norms: np.ndarray | None, start: int):
        """Float32 scores of query chunk ``c`` against a block, excluded pairs NaN."""
        lo = c * self.chunk
        q = self.queries[lo : lo + self.chunk]
        s = np.asarray(self.product(q, blk), dtype=np.float32)
        if self.distance == "euclidean":
            s *= np.float32(2)
            s -= blk_norms[None, :]
            s -= self.query_norms[lo : lo + self.chunk, None]
        ex = self.excluded.in_block(c, start, start + blk.shape[0])
        if ex.size:
            s[self.excluded.query[ex] - lo, self.excluded.row[ex] - start] = np.nan
        return s


def _blocks(corpus: np.ndarray, scan: CorpusScan, unit: str) -> Iterator[tuple]:
    """``(start, block, block norms)`` over the corpus, with a progress bar over its rows."""
    n = corpus.shape[0]
    with progress_bar(n, unit, enabled=scan.progress) as bar:
        for start, stop in block_bounds(n, scan.depth, scan.block):
            blk = corpus_block(corpus, start, stop, scan.distance)
            norms = np.einsum("ij,ij->i", blk, blk) if scan.distance == "euclidean" else None
            yield start, blk, norms
            bar.update(stop - start)


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


def scan_top(
    corpus: np.ndarray, scan: CorpusScan, pairs: Pairs | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Each query's ``depth`` smallest codes, sorted (:data:`EMPTY` pads a short corpus), and
    the float32 scores of ``pairs`` (NaN where excluded).

    >>> c = np.float32([[1, 0], [0, 1], [1, 0]])
    >>> scan = CorpusScan(np.float32([[1, 0]]), None, "inner_product", 2,
    ...                   tie_keys(None, 3, "index"), Pairs(np.zeros(0, int), np.zeros(0, int)))
    >>> code_rows(scan_top(c, scan)[0], None).tolist()
    [[0, 2]]
    """
    n_q, depth = scan.queries.shape[0], scan.depth
    tops = [
        np.full((min(scan.chunk, n_q - c * scan.chunk), depth), EMPTY, dtype=np.uint64)
        for c in range(scan.n_chunks)
    ]
    pairs = pairs or Pairs(np.zeros(0, np.int64), np.zeros(0, np.int64))
    pairs.group(scan.chunk, scan.n_chunks)
    pair_scores = np.full(pairs.query.size, np.nan, dtype=np.float32)

    with single_threaded_blas():
        for start, blk, norms in _blocks(corpus, scan, "docs"):

            def work(c: int, start=start, blk=blk, norms=norms) -> None:
                s = scan.scores(c, blk, norms, start)
                p = pairs.in_block(c, start, start + blk.shape[0])
                pair_scores[p] = s[pairs.query[p] - c * scan.chunk, pairs.row[p] - start]
                r, col = np.nonzero(s >= _cutoff(tops[c])[:, None])
                codes = pack_codes(s[r, col], scan.keys[start + col])
                tops[c] = merge_top(tops[c], r, codes)

            for _ in in_order(work, range(scan.n_chunks), scan.n_threads):
                pass
    top = np.concatenate(tops) if tops else np.zeros((0, depth), np.uint64)
    return np.sort(top, axis=1), pair_scores


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
        s = scan.scores(c, blk, norms, start)
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
    return beats + 1
