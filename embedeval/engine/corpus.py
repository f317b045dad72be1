"""Streaming a (memory-mapped) corpus past a fixed set of queries: exact top-depth lists and
exact ranks of chosen documents, without ever sorting a corpus row.

The corpus is read in blocks of rows (a ``.npy`` memory map is never copied whole; a float16
block becomes float32 one block at a time).  Per chunk of queries and part of a block
(:meth:`CorpusScan.parts`), one product gives the float32 *scores* (larger is better):
``q . r`` (inner product; cosine: unit query rows times the corpus rows as stored, each
column then scaled by ``1 / ||r||`` from a float64 norm, :func:`cosine_scales`) or
``-||q - r||^2`` (Euclidean, as ``2 q.r - ||r||^2 - ||q||^2``).

Every (query, document) pair gets a ``uint64`` *code*, smaller = ranked first::

    code = (~sortable_bits(score)) << 32 | tie_key[document]

so float32 score descending, then the tie key ascending: the tie key is the corpus row
(``ties="index"``) or the document's position in descending string order of the ids
(``ties="trec_eval"``: equal scores by document id descending, trec_eval's order).

The float32 scores only filter.  Each is within ``B_q`` of the float64 score of the float32
inputs (:meth:`CorpusScan.band` gives ``2 B_q``, from :func:`embedeval.engine.decide.key_bounds`;
Euclidean rows are translated by an exact centre first, :func:`corpus_centre`), so every ranking
here is the float64 one (:func:`decide_top`, :func:`scan_ranks`): float64 key ascending
(``decide.exact_keys``), then the tie key; under ``ties="trec_eval"`` the float64 score rounded
to float32 descending (what trec_eval reads from a run), then the tie key.  Results do not
depend on block shapes or threads.

1. :func:`scan_top` keeps each query's ``depth`` smallest codes, and the *near* codes within
   the band below the depth-th score.  A block's candidates are the scores at or above the
   larger of a *floor* and the score of the query's depth-th code so far, lowered by the band.
   The floor (:func:`sample_floor`) is a high order statistic of the query's scores
   against a fixed random sample of 4,096 corpus rows, set so that about twice ``depth``
   documents of the corpus reach it: so about 2 x depth candidates per query over the whole
   corpus, merged into the kept codes by an ``np.partition`` now and then.  Exactness does
   not rest on the estimate: if the final depth-th score reaches the floor, no document more
   than the band below it can be in the top; a query where it does not (about one in a
   million) has its chunk scanned again without a floor.  It also picks out the scores of
   chosen (query, document) pairs from the products.  :func:`decide_top` then orders the
   candidates in float64.
2. :func:`scan_ranks` gives the exact rank of chosen pairs beyond the top-depth: their scores
   bounded in float64 first (:func:`score_bounds`), it counts, per block, the documents
   scoring more than half the band above each pair's bounds, and re-scores in float64 only
   those within half the band of them.  The counting (:class:`BeatCounter`) can also ride on
   :func:`scan_top`'s own pass, from the same products: one read of the corpus for both.

*Exact scores* (:attr:`CorpusScan.exact`, set by :func:`integer_scores`: small integers such as
binary codes, whose float32 products are exact) skip every band: no centre, the top lists keep
exactly ``depth`` codes, their order is the ranking (the float32 scores are the float64
ones), a judged document's rank is its code's place, and beyond the lists the counting pass
counts, per pair, the scores above its own and the equal ones before it in tie order
(:func:`exact_tie_ranks`) instead of listing ties for float64 re-scoring.

Excluded pairs (a query's own id, user exclusion lists) get a NaN score: never a candidate,
never counted.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ..utils.errors import InputError
from ..utils.mapped import gather_rows, release_pages
from ..utils.progress import progress_bar
from .candidates import from_sortable_bits, rows_searchsorted, sortable_bits, spans
from .decide import (
    _tie_multiples,
    gamma,
    key_bounds,
    reference_sq_bound,
    rounding_of,
    sq_norms,
    widen,
)
from .exact import column_stats, exact_centre
from .integers import exact_distance
from .threads import default_threads, each, in_order, single_threaded_blas

__all__ = [
    "EMPTY",
    "BeatCounter",
    "CorpusScan",
    "IntegerScores",
    "Pairs",
    "band_population",
    "block_bounds",
    "candidate_ranks",
    "code_limit",
    "code_rows",
    "code_scores",
    "corpus_block",
    "corpus_centre",
    "count_beats",
    "decide_top",
    "default_block",
    "exact_tie_ranks",
    "float64_scores",
    "integer_scores",
    "measure_norms",
    "near_wins",
    "pack_codes",
    "padded_codes",
    "pair_keys",
    "prepare_queries",
    "rank_keys",
    "sample_floor",
    "scan_queries",
    "scan_ranks",
    "scan_top",
    "score_bounds",
    "tie_keys",
    "widen_down",
]

#: The code of an empty slot (fewer documents than ``depth``): after every real code.
EMPTY = np.uint64(np.iinfo(np.uint64).max)
DISTANCES = ("cosine", "inner_product", "euclidean")
_CHUNK_BYTES = 16 << 20  # score matrix of one query chunk and block
#: Query rows per numpy product, about: a one-thread sgemm packs the corpus rows once per
#: call, and every chunk reads the whole corpus, so a thin chunk pays that packing and
#: reading per few queries (measured on 768 columns: 64 rows run at 2/3 the speed of 256,
#: and 512 took 5-17 % less time than 256 end to end, 1,000 queries on two threads); a block
#: then splits into parts of fewer corpus rows
_CHUNK_ROWS = 512
_MERGE_BYTES = 64 << 20  # padded merge buffer of one query chunk
#: The rows of one merge of a chunk's pending candidates (bounded temporaries)
_PENDING_ROWS = 256
#: A chunk's pending candidates, at most, in multiples of its kept codes (``rows x depth``)
#: when it has a sampled floor: that lets about twice the depth through per query, so a chunk
#: normally merges once, at the end of its pass.  Merging earlier raises the threshold sooner
#: (fewer candidates) but merges the kept codes again each time: with a floor of this quality,
#: more work (measured on 1,000 queries at depth 1,000: 8 % less CPU time merging once)
_PENDING_DEPTHS = 3
_MAX_BLOCK = 65536  # rows per block by default, at most (:func:`default_block`)
_MIN_BLOCK = 32  # rows: thinner products take other BLAS paths, with other float32 rounding
_KEY_BYTES = 8 << 20  # float64 rows of the pairs re-scored at a time (bounded memory)
_UNDERFLOW = 2.0 * 2.0**-126  # twice float32's smallest normal, per product or sum in a score
_NEAR_PAIRS = 1 << 17  # near (pair, document) entries re-scored at a time: ~20 MB of temporaries


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
    """Unit rows in float32 (``x / ||x||``; a zero row stays zero), each element the float64
    quotient rounded once (:func:`unit_rows`)."""
    return unit_rows(x, np.empty_like(x))[0]


def unit_rows(x: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x / ||x||`` into float32 ``out``, and the rows' float64 squared norms: a float64 norm
    and a float64 quotient rounded once to float32, so each element is within
    ``u (1 + 2**-20)`` (``u = 2**-24``) of the exact unit row's (a float32 norm and division:
    about ``d/2`` roundings).  A zero row stays zero (every score 0).  Rows go through float64
    a few hundred at a time, each converted once for its norm and its quotients.

    >>> x = np.float32([[3, 4], [0, 0]])
    >>> unit, sq = unit_rows(x, np.empty_like(x))
    >>> unit.tolist(), sq.tolist()
    ([[0.6000000238418579, 0.800000011920929], [0.0, 0.0]], [25.0, 0.0])
    """
    n, dim = x.shape
    sq = np.empty(n, dtype=np.float64)
    step = max(1, (2 << 20) // (8 * max(dim, 1)))  # a float64 piece that stays in cache
    buf = np.empty((min(n, step), dim), dtype=np.float64)
    for a in range(0, n, step):
        piece = buf[: min(step, n - a)]
        piece[...] = x[a : a + step]
        part = np.einsum("ij,ij->i", piece, piece)
        sq[a : a + step] = part
        norm = np.sqrt(part)
        norm[norm == 0] = 1
        np.divide(piece, norm[:, None], out=out[a : a + step], casting="same_kind")
    return out, sq


def corpus_block(
    corpus: np.ndarray,
    start: int,
    stop: int,
    distance: str,
    out: np.ndarray | None = None,
    centre: np.ndarray | None = None,
    first_row: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``start:stop`` as float32 (unit rows for cosine; minus the exact ``centre`` when
    given) and their squared norms (before normalising), checked finite (a bad row named by
    its index plus ``first_row``: a shard's rows by their corpus row): the only copy of
    corpus rows ever made (into ``out`` when given)."""
    raw = np.asarray(corpus[start:stop])
    if raw.dtype == np.float32 and centre is None:
        src = raw
    else:  # float16 (or other) rows become float32 here, one block at a time
        src = np.empty(raw.shape, np.float32) if out is None else out
        src[...] = raw
        if centre is not None:  # exact (Sterbenz): the distances stay those of the rows
            src -= centre
    if distance == "cosine":  # float64 norms for the unit rows (see unit_rows): any finite row
        blk, sq = unit_rows(src, np.empty(raw.shape, np.float32) if out is None else out)
    else:
        sq = np.einsum("ij,ij->i", src, src)
    _check_finite(sq, first_row + start, distance)
    if distance == "cosine":  # never into the caller's corpus; the norms are not used further
        return blk, np.minimum(sq, np.finfo(np.float32).max).astype(np.float32)
    if out is not None and src is raw:  # a contiguous copy was asked for
        out[...] = raw
        return out, sq
    return src, sq


def _check_finite(sq: np.ndarray, start: int, distance: str) -> None:
    """Raise for the first row (numbered from ``start``) whose squared norm ``sq`` is not
    finite."""
    if np.isfinite(sq).all():
        return
    row = start + int(np.flatnonzero(~np.isfinite(sq))[0])
    why = "" if distance == "cosine" else (
        ", or values so large that its squared norm overflows float32 (about 1e19 and "
        "above; distance='cosine' takes them)"
    )  # fmt: skip
    raise InputError(
        f"corpus row {row} holds NaN or infinite values{why}; remove, repair or rescale it "
        "(embeddings must be finite; they are ranked as float32, so a float64 value beyond "
        "about 3.4e38 counts as infinite)."
    )


#: Squared norms of the rows a cosine scan multiplies as stored (:func:`cosine_scales`): at
#: least 2**-40, so the float32 underflow of their products, scaled by ``1 / ||x|| <= 2**20``,
#: stays far inside the band; at most 2**200, so no product or partial sum with a unit query
#: row overflows float32.  A block with a non-zero row outside takes unit rows instead.
_SCALED_SQ = (2.0**-40, 2.0**200)


def cosine_scales(rows: np.ndarray, start: int = 0) -> np.ndarray | None:
    """``1 / ||x||`` of each float32 row, the norm in float64 and the quotient rounded once to
    float32 (0 for a zero row), or None when a non-zero row's squared norm lies outside
    :data:`_SCALED_SQ`; raises for a row that is not finite (numbered from ``start``).

    A cosine scan multiplies its unit query rows with the corpus rows as stored and scales
    each column by these (:meth:`CorpusScan.scores`): one pass over the scores, which are
    still in cache after the product, instead of a normalised copy of every block.

    >>> cosine_scales(np.float32([[3, 4], [0, 0]])).tolist()
    [0.20000000298023224, 0.0]
    """
    sq = np.einsum("ij,ij->i", rows, rows, dtype=np.float64)  # each product exact
    _check_finite(sq, start, "cosine")
    live = sq > 0
    if np.any(live & ((sq < _SCALED_SQ[0]) | (sq > _SCALED_SQ[1]))):
        return None
    scales = np.zeros(sq.shape, dtype=np.float32)
    scales[live] = 1.0 / np.sqrt(sq[live])
    return scales


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


@dataclass
class CorpusScan:
    """Everything fixed before the first corpus block.

    ``queries`` as from :func:`prepare_queries`; ``keys`` the tie keys; ``excluded`` pairs
    never retrieved; ``block`` corpus rows per block (at most); ``product`` computes a block's
    inner products (numpy, or a device: :mod:`embedeval.search.torch_backend`).  ``raw`` are
    the float32 queries the float64 keys are formed from (default: ``queries``), ``centre``
    the exact translation of the Euclidean rows (:func:`corpus_centre`), ``ties`` the tie
    rule (``"trec_eval"`` orders re-scored documents by their float64 score, see
    :func:`rank_keys`); ``m_sq`` bounds the squared norm of every block read so far;
    ``first_row``: the corpus row of the scanned rows' first (a shard's offset), so that an
    error names a bad row by its corpus row.  ``precision`` is the product's (``"float32"``,
    or a device product's ``"tf32"`` / ``"bf16"``:
    :func:`embedeval.search.torch_backend.torch_product`).  ``exact``: the float32
    scores are the exact scores (small integers under a float32 product,
    :func:`integer_scores`): every band is zero, equal scores are exact ties ranked by tie key,
    and nothing is re-scored in float64; ``cosine_sq``: such a scan runs cosine as the inner
    product of rows of this one squared norm, and reports cosines.
    Set from these: ``chunk`` queries per product (``n_chunks`` chunks of equal size, a
    multiple of the threads) and ``step`` corpus rows per product, at most.
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
    raw: np.ndarray | None = None
    centre: np.ndarray | None = None
    ties: str = "index"
    m_sq: float = 0.0
    precision: str = "float32"
    exact: bool = False
    cosine_sq: float | None = None
    first_row: int = 0
    q_sq: np.ndarray = field(init=False)
    chunk: int = field(init=False)
    n_chunks: int = field(init=False)
    step: int = field(init=False)
    _buffers: queue.SimpleQueue = field(init=False, repr=False, default_factory=queue.SimpleQueue)

    def __post_init__(self) -> None:
        n_q = self.queries.shape[0]
        self.n_threads = default_threads() if self.n_threads is None else self.n_threads
        local = self.product is numpy_product
        per_chunk = _CHUNK_ROWS if local else max(1, _CHUNK_BYTES // (4 * max(1, self.block)))
        # a multiple of the threads in chunks of equal size, so that every core works on every
        # block to its end (3 chunks on 2 threads leave one core idle a third of the time)
        rounds = max(1, -(-n_q // (self.n_threads * per_chunk)))
        self.chunk = max(1, -(-n_q // (self.n_threads * rounds)))
        self.n_chunks = max(1, -(-n_q // self.chunk))
        # a device product takes whole blocks (it keeps one on the device while the chunks pass)
        self.step = max(_MIN_BLOCK, _CHUNK_BYTES // (4 * self.chunk)) if local else self.block
        self.step = min(self.step, max(1, self.block))
        self.excluded.group(self.chunk, self.n_chunks)
        self.raw = self.queries if self.raw is None else self.raw
        dim = self.queries.shape[1]
        if self.distance == "cosine":
            self.q_sq = np.ones(n_q)
        else:  # the float32 squared norms of the product's queries, bounded from above
            sq = np.einsum("ij,ij->i", self.queries, self.queries, dtype=np.float32)
            self.q_sq = sq.astype(np.float64) / (1.0 - gamma(dim)) * (1.0 + 2.0**-40)

    def band(self, m_sq: float | None = None) -> np.ndarray:
        """Per query, ``2 B_q`` (float64): twice the bound on ``|float32 score - float64
        score|`` over the rows whose squared norms are at most ``m_sq`` (default: every row
        read so far).  Cosine scores here are products of unit rows whose elements are each
        within ``u' = u (1 + 2**-20)`` of the exact unit row's (:func:`unit_rows`), so a score
        is within ``gamma_dim (1 + u')**2 + 2 u' + u'**2 <= gamma_{dim+8}`` of the cosine: the
        cosine term of :func:`~embedeval.engine.decide.key_bounds`.  Rows multiplied as
        stored (:attr:`scales_columns`) give ``p = fl(q . x)``, within ``(u' + gamma_dim
        (1 + u')) ||x||`` of ``cos ||x||`` (the unit query's rounding, then the sum's), and
        the score ``fl(p r)``, ``r`` the float32 rounding of a float64 ``1 / ||x||``
        (``|r ||x|| - 1| <= rho``, about ``u + dim 2**-54``: half the float64 norm's error and
        a few float64 roundings); with ``|cos| <= 1`` it errs by at most ``rho + u + rho u +
        (u' + gamma_dim (1 + u')) (1 + rho) (1 + u)``, under the same ``gamma_{dim+8}
        (1 + 2**-20)`` for every ``dim`` (by 5 ``u`` at least).  Under
        ``ties="trec_eval"`` the band also holds ``2 gamma_{dim+8}`` times the score's
        magnitude (over four float32 steps of any score): two documents whose float32 scores
        are farther apart than the band have float64 scores whose float32 roundings differ.
        A coarser product (:attr:`precision`: ``"tf32"``, ``"bf16"``) widens it by its own
        rounding (:func:`~embedeval.engine.decide.rounding_of`)."""
        if self.exact:  # every score is the exact score, and its float32 rounding itself
            return np.zeros(self.queries.shape[0])
        m_sq = self.m_sq if m_sq is None else m_sq
        # the product's own rounding (a device product says whether it ran on tensor cores)
        tensor_cores = bool(getattr(self.product, "tensor_cores", False))
        scale, input_u = rounding_of(self.precision, tensor_cores)
        if self.ties == "trec_eval":  # + a few float32 steps of the score (see rank_keys)
            scale += 1.0
        dim = self.queries.shape[1]
        # + float32 underflow (:attr:`underflow`)
        band = 2.0 * key_bounds(self.q_sq, m_sq, dim, self.distance, scale, input_u)
        band += self.underflow
        if input_u:  # bfloat16 inputs below 2**-126 may be read as zero: each term loses
            # at most 2**-126 times the other factor, so the sum at most 2**-126 sqrt(dim)
            # (||q|| + ||x||); twice, as for the other terms.  Cosine rows as stored: the
            # unit query's part scaled by r <= 2**20 (1 + u), the row's by r ||x|| <= 1 + 2**-20
            if self.distance == "cosine":
                lost = (2.0**20 + 1.0) * (1.0 + 2.0**-19)
            else:
                lost = np.sqrt(self.q_sq) + np.sqrt(m_sq)
            band += 2.0**-125 * np.sqrt(dim) * lost
        return band

    @property
    def underflow(self) -> float:
        """A bound on a float32 score's underflow error: each of the (at most 3 dim + 8)
        products and sums below the normal range errs by up to its smallest normal, 2**-126
        (subnormals flushed or not); twice that, as the band holds two scores' errors.  Rows
        multiplied as stored scale theirs by ``1 / ||x|| <= 2**20`` (:data:`_SCALED_SQ`).
        Zero for :attr:`exact` scores: integer products never fall below the normal range."""
        if self.exact:
            return 0.0
        scaled = 2.0**20 if self.scales_columns else 1.0
        return _UNDERFLOW * (3 * self.queries.shape[1] + 8) * scaled

    @property
    def scales_columns(self) -> bool:
        """Whether the scan multiplies the corpus rows as stored and scales each column of
        scores by ``1 / ||x||`` (:func:`cosine_scales`) instead of normalising a copy of every
        block: cosine, whatever the product (a device product's scores come back to the host,
        where the columns are scaled; its inputs' relative rounding does not depend on the
        rows' scale)."""
        return self.distance == "cosine"

    def row_of_key(self) -> np.ndarray | None:
        """The corpus row of each tie key (None: the keys are the rows)."""
        if self.ties == "index":
            return None
        return np.argsort(self.keys).astype(np.int64)

    def see(self, sq: np.ndarray) -> None:
        """Raise :attr:`m_sq` to cover a block's float32 squared norms ``sq``."""
        if self.distance != "cosine" and sq.size:
            self.m_sq = max(self.m_sq, reference_sq_bound(sq, self.queries.shape[1]))

    def parts(
        self, start: int, blk: np.ndarray, norms: np.ndarray | None
    ) -> Iterator[tuple[int, np.ndarray, np.ndarray | None]]:
        """``(start, rows, columns)`` of a block in parts of :attr:`step` rows, the corpus rows
        of one product, with their per-column data (:meth:`scores`)."""
        n = blk.shape[0]
        k = max(1, min(-(-n // self.step), n // _MIN_BLOCK))  # parts of equal size
        if k == 1:  # the block itself: a device product keeps it by its identity
            yield start, blk, norms
            return
        for a, b in zip(range(k), range(1, k + 1), strict=True):
            lo, hi = a * n // k, b * n // k
            yield start + lo, blk[lo:hi], None if norms is None else norms[lo:hi]

    def release_buffers(self) -> None:
        """Free the pooled score buffers (a later pass allocates them again)."""
        self._buffers = queue.SimpleQueue()

    @contextlib.contextmanager
    def scores(
        self, c: int, blk: np.ndarray, columns: np.ndarray | None, start: int
    ) -> Iterator[np.ndarray]:
        """Float32 scores of query chunk ``c`` against a block, excluded pairs NaN, in a
        result buffer taken from a pool (as many as threads at work) and given back after.
        ``columns``: the block's per-column data from :func:`_block` (squared norms for
        Euclidean and inner product, ``1 / ||x||`` for cosine rows multiplied as stored, else
        None)."""
        lo = c * self.chunk
        q = self.queries[lo : lo + self.chunk]
        flat = None
        if self.product is numpy_product:  # a fresh result per product costs its page faults
            try:
                flat = self._buffers.get_nowait()
            except queue.Empty:
                flat = np.empty(self.chunk * (self.step + _MIN_BLOCK), dtype=np.float32)
            size = q.shape[0] * blk.shape[0]
            s = numpy_product(q, blk, flat[:size].reshape(q.shape[0], blk.shape[0]))
        else:
            s = np.asarray(self.product(q, blk), dtype=np.float32)
        if self.distance == "euclidean":
            s *= np.float32(2)
            s -= columns[None, :]
            s -= self.query_norms[lo : lo + self.chunk, None]
        elif self.distance == "cosine" and columns is not None:  # rows as stored: scaled
            s *= columns[None, :]
        ex = self.excluded.in_block(c, start, start + blk.shape[0])
        if ex.size:
            s[self.excluded.query[ex] - lo, self.excluded.row[ex] - start] = np.nan
        try:
            yield s
        finally:
            if flat is not None:
                self._buffers.put(flat)


def _blocks(corpus: np.ndarray, scan: CorpusScan, unit: str) -> Iterator[tuple]:
    """``(start, block, columns)`` over the corpus, with a progress bar over its rows: each
    block as multiplied and its per-column data for :meth:`CorpusScan.scores` (:func:`_block`)."""
    n, dim = corpus.shape
    direct = corpus.dtype == np.float32 and corpus.flags.c_contiguous and scan.centre is None
    buffer: list[np.ndarray | None] = [None]  # one reused block, where one is needed
    with progress_bar(n, unit, enabled=scan.progress) as bar:
        for start, stop in block_bounds(n, scan.block):
            if buffer[0] is None and not direct:
                buffer[0] = np.empty((min(n, scan.block + _MIN_BLOCK), dim), np.float32)
            blk, columns = _block(corpus, scan, start, stop, direct, buffer)
            if scan.distance != "cosine":
                scan.see(columns)
            yield start, blk, columns
            release_pages(corpus, start, stop)
            bar.update(stop - start)


def _block(
    corpus: np.ndarray,
    scan: CorpusScan,
    start: int,
    stop: int,
    direct: bool,
    buffer: list[np.ndarray | None],
) -> tuple[np.ndarray, np.ndarray | None]:
    """Rows ``start:stop`` as multiplied (``direct``: the corpus's own rows, else a copy in
    ``buffer[0]``) and their per-column data: squared norms (Euclidean, inner product),
    ``1 / ||x||`` (cosine rows multiplied as stored: :func:`cosine_scales`) or None (cosine
    unit rows, which a block with a norm out of that range takes).  Every thread reads a
    part."""
    step = max(_MIN_BLOCK, -(-(stop - start) // scan.n_threads))
    parts = [(a, min(stop, a + step)) for a in range(start, stop, step)]

    def read(i: int, as_unit: bool = False) -> tuple:
        a, b = parts[i]
        out = None if buffer[0] is None else buffer[0][a - start : b - start]
        if scan.scales_columns and not as_unit:
            rows = np.asarray(corpus[a:b]) if direct else _as_float32(corpus[a:b], out)
            return rows, cosine_scales(rows, scan.first_row + a)
        return corpus_block(corpus, a, b, scan.distance, out, scan.centre, scan.first_row)

    done = [r for _, r in in_order(read, range(len(parts)), scan.n_threads)]
    if scan.scales_columns and any(d[1] is None for d in done):
        if buffer[0] is None:
            buffer[0] = np.empty((min(corpus.shape[0], scan.block + _MIN_BLOCK),
                                  corpus.shape[1]), np.float32)  # fmt: skip
        done = [r for _, r in in_order(lambda i: read(i, True), range(len(parts)), scan.n_threads)]
        return buffer[0][: stop - start], None
    blk = np.asarray(corpus[start:stop]) if direct else buffer[0][: stop - start]
    return blk, np.concatenate([d[1] for d in done])


def _as_float32(rows: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``rows`` (float16, or strided) as float32, in ``out``."""
    out[...] = rows
    return out


def padded_codes(
    top: np.ndarray, pieces: Sequence[tuple[np.ndarray, np.ndarray]], width: int
) -> np.ndarray:
    """The codes of ``top`` (n, depth) and of ``pieces`` (``(rows, codes)``, each with its
    rows ascending and numbered from 0) in one (n, ``width``) array, a row's codes after its
    ``top`` ones in the order given, :data:`EMPTY` in the slots left over.

    Each piece's codes are placed from their row's next free slot and their place within
    their row's run (the pieces come from scans of a block's parts, each already grouped by
    row), so no sort of the row numbers is needed.

    >>> top = np.array([[5, 9], [EMPTY, EMPTY]], dtype=np.uint64)
    >>> piece = (np.array([0, 1, 1]), np.uint64([7, 3, 4]))
    >>> padded_codes(top, [piece], 4)[:, 2:].tolist() == [[7, EMPTY], [3, 4]]
    True
    """
    n, depth = top.shape
    buf = np.full((n, width), EMPTY, dtype=np.uint64)
    buf[:, :depth] = top
    flat = buf.reshape(-1)
    free = np.arange(n) * width + depth  # per row, the flat index of its next free slot
    for rows, codes in pieces:
        starts = np.searchsorted(rows, np.arange(n + 1))
        flat[free[rows] + (np.arange(rows.size) - starts[rows])] = codes
        free += np.diff(starts)
    return buf


def _row_range(
    pieces: Sequence[tuple[np.ndarray, np.ndarray]], lo: int, hi: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The entries of rows ``lo ...  hi - 1`` of each ``(rows, codes)`` piece (rows
    ascending), rows numbered from ``lo``."""
    out = []
    for rows, codes in pieces:
        a, b = np.searchsorted(rows, [lo, hi])
        out.append((rows[a:b] - lo, codes[a:b]))
    return out


def code_limit(cut: np.ndarray) -> np.ndarray:
    """The largest code of a score at least ``cut`` (float32; not NaN): a code ``c`` other
    than :data:`EMPTY` has ``code_scores(c) >= cut`` exactly when ``c <= code_limit(cut)``
    (the codes' bits treat ``-0.0`` as ``+0.0``, as float comparison does).

    >>> codes = pack_codes(np.float32([0.5, -0.0, -0.25]), np.uint64([3, 1, 2]))
    >>> (codes <= code_limit(np.float32([0.0]))).tolist()
    [True, True, False]
    """
    cut = np.asarray(cut, dtype=np.float32)
    return pack_codes(cut, np.full(cut.shape, 0xFFFFFFFF, dtype=np.uint64))


def _cutoff(top: np.ndarray, worst: np.ndarray | None = None) -> np.ndarray:
    """Per query, the lowest score that can still enter its list (-inf while not full);
    ``worst``: its largest code, when known."""
    worst = top.max(axis=1) if worst is None else worst
    return np.where(worst == EMPTY, np.float32(-np.inf), code_scores(worst)).astype(np.float32)


def widen_down(tau: np.ndarray, band: np.ndarray) -> np.ndarray:
    """float32 thresholds ``tau - band`` rounded down (``-inf`` stays; ``tau`` float32 or
    float64): a float32 score within ``band`` below ``tau`` still passes
    ``score >= threshold``.

    >>> widen_down(np.float32([1.0]), np.array([1e-9])).tolist()
    [0.9999999403953552]
    """
    return -widen(-np.asarray(tau), band)


class _ChunkTop:
    """One query chunk's kept codes, the *near* codes (not among the ``depth`` smallest but
    within the band below the depth-th score: they may still be in the float64 top), and the
    candidates waiting to be merged into them."""

    def __init__(self, n: int, depth: int, floor: np.ndarray, exact: bool = False) -> None:
        self.top = np.full((n, depth), EMPTY, dtype=np.uint64)
        self.floor = floor
        self.exact = exact  # exact scores: the codes' order is the ranking, nothing is near
        self.band = np.zeros(n)
        self.cut = floor.copy()  # candidates: scores >= cut
        self.block = -1  # the corpus block whose band :attr:`cut` holds (:meth:`enter`)
        self.worst = np.full(n, EMPTY, dtype=np.uint64)
        self.near = (np.zeros(0, np.int32), np.zeros(0, np.uint64))
        self.pending: list[tuple[np.ndarray, np.ndarray]] = []
        self.n_pending = 0
        # pending candidates, about 12 bytes each: O(rows x depth), as the kept codes; with no
        # floor (a corpus too small for a sample to help, or a chunk scanned again) every
        # score is a candidate until the first merge: then as many as the kept codes of up to
        # _PENDING_ROWS queries, so that the merges raise the threshold early
        floored = n > 0 and bool(np.isfinite(floor).any())
        rows = _PENDING_DEPTHS * n if floored else min(n, _PENDING_ROWS)
        self.cap = max(rows * depth, 1 << 16)

    def enter(self, block: int, band: np.ndarray) -> np.ndarray:
        """The cut for a part of the block starting at corpus row ``block``, whose band is
        ``band`` (:meth:`widen` once per block)."""
        if self.block != block:
            self.block = block
            self.widen(band)
        return self.cut

    def widen(self, band: np.ndarray) -> None:
        """Candidates from now on: scores at least ``band`` below the floor or depth-th score."""
        self.band = band
        self.worst = self.top.max(axis=1)  # the depth-th code (EMPTY while not full)
        self.cut = widen_down(np.maximum(self.floor, _cutoff(self.top, self.worst)), band)

    def add(self, rows: np.ndarray, codes: np.ndarray) -> None:
        self.pending.append((rows.astype(np.int32), codes))
        self.n_pending += rows.size
        if self.n_pending > self.cap:
            self.flush()

    def flush(self) -> None:
        """Merge the pending candidates into the kept and near codes, :data:`_PENDING_ROWS`
        queries at a time (the temporaries of a merge stay those of that many rows)."""
        if self.pending:
            parts = [self.near, *self.pending]  # each with its rows ascending
            starts = range(0, self.top.shape[0], _PENDING_ROWS)
            near = [self._merge_rows(lo, parts) for lo in starts]
            self.near = (
                np.concatenate([np.zeros(0, np.int32), *[r for r, _ in near]]),
                np.concatenate([np.zeros(0, np.uint64), *[c for _, c in near]]),
            )
            self.pending, self.n_pending = [], 0
        self.widen(self.band)

    def _merge_rows(
        self, lo: int, parts: list[tuple[np.ndarray, np.ndarray]]
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`flush` of rows ``lo`` to ``lo + _PENDING_ROWS``: their kept codes replaced by
        the ``depth`` smallest of kept, near and pending; their new near codes returned, rows
        ascending."""
        hi = min(self.top.shape[0], lo + _PENDING_ROWS)
        pieces = _row_range(parts, lo, hi)
        counts = sum((np.bincount(r, minlength=hi - lo) for r, _ in pieces), np.zeros(hi - lo, int))
        width = self.top.shape[1] + int(counts.max(initial=0))
        # bounded buffer even when a query ties with a whole block
        step = max(1, _MERGE_BYTES // (8 * width))
        near = [(np.zeros(0, np.int32), np.zeros(0, np.uint64))]
        for a in range(lo, hi, step):
            b = min(hi, a + step)
            rows = _row_range(pieces, a - lo, b - lo)
            near.append(self._merge_step(a, padded_codes(self.top[a:b], rows, width)))
        return np.concatenate([r for r, _ in near]), np.concatenate([c for _, c in near])

    def _merge_step(self, a: int, buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``a ...`` of :meth:`_merge_rows` from their padded codes ``buf``: the
        ``depth`` smallest kept, and the near codes among the others returned."""
        depth = self.top.shape[1]
        buf = np.partition(buf, depth - 1, axis=1)
        b = a + buf.shape[0]
        merged = self.top[a:b] = buf[:, :depth]
        if self.exact:  # the codes' order is the ranking: nothing below the depth-th is near
            return np.zeros(0, np.int32), np.zeros(0, np.uint64)
        cut = widen_down(np.maximum(self.floor[a:b], _cutoff(merged)), self.band[a:b])
        # near: not among the depth kept, and within the band below the depth-th score
        rest = buf[:, depth:]
        r, c = np.nonzero((rest <= code_limit(cut)[:, None]) & (rest != EMPTY))
        return (r + a).astype(np.int32), rest[r, c]

    def candidates(self, lo: int) -> tuple[np.ndarray, np.ndarray]:
        """(query, code) of every kept code, queries numbered from ``lo``, sorted by query then
        code: the near codes of a query all come after its kept ones (they are not among its
        ``depth`` smallest), so each part is sorted on its own and the two interleaved."""
        top = np.sort(self.top, axis=1)  # EMPTY last in each row
        held = top != EMPTY
        near_rows, near_codes = self.near
        order = np.lexsort((near_codes, near_rows))
        rows = np.concatenate([np.nonzero(held)[0].astype(np.int32), near_rows[order]])
        codes = np.concatenate([top[held], near_codes[order]])
        by_row = np.argsort(rows, kind="stable")  # two sorted runs: one merge
        return rows[by_row].astype(np.int64) + lo, codes[by_row]


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
    sample, sq = _sample_rows(corpus, scan, m)
    floor = np.empty(n_q, dtype=np.float32)

    def piece(lo: int) -> None:  # bounded temporaries: 256 x 4,096 scores at a time
        s = _sample_scores(scan, sample, sq, slice(lo, lo + 256))
        floor[lo : lo + 256] = np.partition(s, m - kq, axis=1)[:, m - kq]

    # the engine's threads, one BLAS thread each: the partitions run in parallel too, and no
    # BLAS thread is left spinning for work into the scan
    with single_threaded_blas():
        for _ in in_order(piece, range(0, n_q, 256), scan.n_threads):
            pass
    return floor


def _sample_rows(corpus: np.ndarray, scan: CorpusScan, m: int) -> tuple[np.ndarray, np.ndarray]:
    """A fixed random sample of ``m`` corpus rows as the scan multiplies them (translated by
    its centre; unit rows for cosine) and their squared norms before normalising."""
    n = corpus.shape[0]
    rows = np.sort(np.random.default_rng(0).choice(n, m, replace=False))
    sample = gather_rows(corpus, rows)  # a copy: normalised in place
    if scan.centre is not None:
        sample -= scan.centre
    sq = np.einsum("ij,ij->i", sample, sample)
    if scan.distance == "cosine":
        with np.errstate(invalid="ignore"):  # inf elements (inf / inf): the scan refuses them
            np.divide(sample, np.where(sq > 0, np.sqrt(sq), 1)[:, None], out=sample)
    return sample, sq


def _sample_scores(
    scan: CorpusScan, sample: np.ndarray, sq: np.ndarray, queries: slice | np.ndarray
) -> np.ndarray:
    """float32 scores of the scan's ``queries`` against the sample (:func:`_sample_rows`)."""
    s = scan.queries[queries] @ sample.T
    if scan.distance == "euclidean":
        s = 2 * s - sq[None, :] - scan.query_norms[queries, None]
    return s


def band_population(corpus: np.ndarray, scan: CorpusScan, size: int = 4096) -> float:
    """Estimated mean number of candidates per query under the scan's product (depth and band):
    the documents whose float32 score lies at most the band below the query's depth-th score,
    from the scores against a fixed random sample of ``size`` corpus rows (the depth-th score
    estimated by the sample's ``ceil(depth m / n)``-th, the count scaled by ``n / m``), over
    at most 256 queries spread over the set.  Only an estimate, to choose a product with: it
    changes no value.

    >>> c = np.float32([[1, 0], [0.9, 0.1], [0, 1]])
    >>> scan = CorpusScan(np.float32([[1, 0]]), None, "inner_product", 1,
    ...                   tie_keys(None, 3, "index"), Pairs(np.zeros(0, int), np.zeros(0, int)))
    >>> band_population(c, scan)  # a float32 band: the best document alone
    1.0
    """
    n_q, n = scan.queries.shape[0], corpus.shape[0]
    m = min(n, size)
    sample, sq = _sample_rows(corpus, scan, m)
    m_sq = scan.m_sq  # the band grows with the rows' norms: those of the sample, at least
    if scan.distance != "cosine" and sq.size:
        m_sq = max(m_sq, reference_sq_bound(sq, scan.queries.shape[1]))
    band = scan.band(m_sq)
    picked = np.unique(np.linspace(0, n_q - 1, min(n_q, 256)).astype(np.int64))
    k = min(m, max(1, int(np.ceil(scan.depth * m / n))))
    counts = np.empty(picked.size)
    for a in range(0, picked.size, 64):
        at = picked[a : a + 64]
        s = _sample_scores(scan, sample, sq, at)
        kth = np.partition(s, m - k, axis=1)[:, m - k]
        counts[a : a + 64] = (s >= (kth - band[at])[:, None]).sum(axis=1)
    return float(counts.mean() * n / m) if counts.size else 0.0


def scan_top(
    corpus: np.ndarray,
    scan: CorpusScan,
    pairs: Pairs | None = None,
    floor: np.ndarray | None = None,
    counter: BeatCounter | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each query's candidates for its float64 top ``depth`` as ``(query, code)`` (query
    ascending, codes ascending within a query), and the float32 scores of ``pairs`` (NaN
    where excluded).  :func:`decide_top` orders the candidates, :func:`candidate_ranks` ranks
    chosen documents among them.  A ``counter`` (:class:`BeatCounter`) also counts, from the
    same products, what beats its pairs anywhere in the ranking (full-depth metrics: one pass
    over the corpus instead of two).

    Candidates are the float32 scores at or above the larger of the query's ``floor`` (default
    :func:`sample_floor`) and its depth-th score so far, *lowered by the band* ``2 B_q``
    (:meth:`CorpusScan.band`): a document more than ``2 B_q`` below ``depth`` others cannot
    reach the float64 top.  The result is exact when the final depth-th float32 score is at
    least the floor; the chunks of the queries where it is not are scanned again without a
    floor.

    >>> c = np.float32([[1, 0], [0, 1], [1, 0]])
    >>> scan = CorpusScan(np.float32([[1, 0]]), None, "inner_product", 2,
    ...                   tie_keys(None, 3, "index"), Pairs(np.zeros(0, int), np.zeros(0, int)))
    >>> query, codes, _ = scan_top(c, scan)
    >>> decide_top(c, scan, query, codes, False)[0].tolist()
    [[0, 2]]
    """
    pairs = pairs or Pairs(np.zeros(0, np.int64), np.zeros(0, np.int64))
    pairs.group(scan.chunk, scan.n_chunks)
    pair_scores = np.full(pairs.query.size, np.nan, dtype=np.float32)
    floor = sample_floor(corpus, scan) if floor is None else floor
    tops = _scan_chunks(corpus, scan, pairs, pair_scores, floor, range(scan.n_chunks), counter)
    short = [c for c, t in tops.items() if np.any((_cutoff(t.top) < t.floor) & (t.floor > -np.inf))]
    if short:  # the floor was too high for some query (rare): those chunks again, exactly
        # (the counter has counted every block already: not again)
        lowest = np.full_like(floor, -np.inf)
        tops.update(_scan_chunks(corpus, scan, pairs, pair_scores, lowest, short))

    def candidates(c: int) -> tuple[np.ndarray, np.ndarray]:
        return tops.pop(c).candidates(c * scan.chunk)

    parts = [p for _, p in in_order(candidates, range(scan.n_chunks), scan.n_threads)]
    query = np.concatenate([np.zeros(0, np.int64), *[p[0] for p in parts]])
    codes = np.concatenate([np.zeros(0, np.uint64), *[p[1] for p in parts]])
    return query, codes, pair_scores


def _scan_chunks(
    corpus: np.ndarray,
    scan: CorpusScan,
    pairs: Pairs,
    pair_scores: np.ndarray,
    floor: np.ndarray,
    chunks: Sequence[int],
    counter: BeatCounter | None = None,
) -> dict[int, _ChunkTop]:
    """One pass over the corpus for the given query chunks (and the ``counter``'s pairs)."""
    n_q = scan.queries.shape[0]
    tops = {}
    for c in chunks:
        lo, hi = c * scan.chunk, min(n_q, (c + 1) * scan.chunk)
        tops[c] = _ChunkTop(hi - lo, scan.depth, floor[lo:hi], scan.exact)
    locks = {c: threading.Lock() for c in chunks}
    with single_threaded_blas():
        for start, blk, norms in _blocks(corpus, scan, "docs"):
            band = scan.band()  # this block's rows included
            if counter is not None:
                counter.widen(band)

            def work(task: tuple, start=start, band=band) -> None:
                c, (a, part, sq) = task
                top, lo = tops[c], c * scan.chunk
                with locks[c]:  # a chunk's parts may run at once: its list is shared
                    cut = top.enter(start, band[lo : lo + scan.chunk])
                r, codes = _part_candidates(scan, c, a, part, sq, cut, pairs, pair_scores, counter)
                with locks[c]:
                    if scan.exact:  # a code after the depth-th cannot enter (ties in bulk)
                        keep = codes < top.worst[r]
                        r, codes = r[keep], codes[keep]
                    top.add(r, codes)

            # every (chunk, part) an item of its own: a core that runs faster for a while
            # takes more of them, instead of waiting at the end of the block for the other
            each(work, [(c, p) for p in scan.parts(start, blk, norms) for c in chunks],
                 scan.n_threads)  # fmt: skip
    scan.release_buffers()
    for _ in in_order(lambda c: tops[c].flush(), list(tops), scan.n_threads):
        pass
    return tops


def _part_candidates(
    scan: CorpusScan,
    c: int,
    a: int,
    part: np.ndarray,
    sq: np.ndarray | None,
    cut: np.ndarray,
    pairs: Pairs,
    pair_scores: np.ndarray,
    counter: BeatCounter | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Query chunk ``c`` against the corpus rows ``a ...`` (``part``, its per-column data
    ``sq``): the scores of its pairs written to ``pair_scores``, the ``counter`` fed, and the
    (query in the chunk, code) of every score at or above the query's ``cut``."""
    with scan.scores(c, part, sq, a) as s:
        p = pairs.in_block(c, a, a + part.shape[0])
        pair_scores[p] = s[pairs.query[p] - c * scan.chunk, pairs.row[p] - a]
        if counter is not None:
            counter.count(c, s, a)
        # flat indices: 2-D np.nonzero is ~15x slower on a sparse mask
        at = np.flatnonzero(s >= cut[:, None])
        r, col = np.divmod(at, s.shape[1])
        return r, pack_codes(s.reshape(-1)[at], scan.keys[a + col])


class IntegerScores(NamedTuple):
    """How a scan whose float32 scores are exact runs (:func:`integer_scores`): the distance it
    multiplies with, and for cosine run as the inner product the corpus rows' common squared
    norm (the scores are then reported as cosines)."""

    distance: str
    cosine_sq: float | None = None


def integer_scores(queries: np.ndarray, corpus: Any, distance: str) -> IntegerScores | None:
    """How a numpy scan of ``queries`` against ``corpus`` gets exact float32 scores
    (:attr:`CorpusScan.exact`, uncentred), or None: integer values whose products sum to at most
    ``2**24`` in magnitude (:func:`~embedeval.engine.integers.exact_distance`, which reads the
    first rows first: real-valued data cost next to nothing).  A Euclidean score
    ``2 q.x - ||x||**2 - ||q||**2`` adds terms of total magnitude ``d (Q + X)**2`` at most, as
    the bound there.  Cosine qualifies on rows of one squared norm ``m`` (codes in
    ``{-1, 1}``), multiplied as the inner product ``s``: its order and ties are those of the
    cosine ``s / (||q|| sqrt(m))``, and with ``||q|| sqrt(m) < 2**23`` two cosines of different
    ``s`` lie more than two float32 steps apart, so their float32 roundings (what
    ``ties="trec_eval"`` ranks by) differ too.

    >>> codes = np.float32([[1, -1], [-1, -1]])
    >>> integer_scores(codes, codes, "euclidean"), integer_scores(codes / 4, codes, "euclidean")
    (IntegerScores(distance='euclidean', cosine_sq=None), None)
    >>> integer_scores(codes, codes, "cosine")
    IntegerScores(distance='inner_product', cosine_sq=2.0)
    """
    run = exact_distance(queries, corpus, distance)
    if run is None or distance != "cosine":
        return None if run is None else IntegerScores(run)
    m = float(np.sum(np.asarray(corpus[:1], dtype=np.float64) ** 2))
    q = np.asarray(queries, dtype=np.float64)
    if np.sqrt(np.einsum("ij,ij->i", q, q).max(initial=0.0) * m) >= 2.0**23:
        return None
    return IntegerScores(run, m)


def scan_queries(
    queries: np.ndarray, corpus: Any, distance: str, numpy: bool = True
) -> dict[str, Any]:
    """The query side of a :class:`CorpusScan` as keyword arguments: ``queries`` prepared
    (:func:`prepare_queries`), ``query_norms``, the ``distance`` multiplied, the ``centre``, and
    for exact scores (:func:`integer_scores`, only under ``numpy`` products) ``exact`` and
    ``cosine_sq``: such a scan runs uncentred (a centre would make the rows non-integers).

    >>> sorted(scan_queries(np.float32([[1, -1]]), np.float32([[1, 1]]), "cosine").items())[:3]
    [('centre', None), ('cosine_sq', 2.0), ('distance', 'inner_product')]
    """
    exact = integer_scores(queries, corpus, distance) if numpy else None
    run = distance if exact is None else exact.distance  # cosine codes: the inner product
    centre = None if exact else corpus_centre(queries, corpus, distance)
    centred = queries if centre is None else np.subtract(queries, centre, dtype=np.float32)
    q, norms = prepare_queries(centred, run)
    return {
        "queries": q, "query_norms": norms, "distance": run, "centre": centre,
        "exact": exact is not None, "cosine_sq": None if exact is None else exact.cosine_sq,
    }  # fmt: skip


def default_block(corpus: Any, memory_budget: int, centre: np.ndarray | None, numpy: bool) -> int:
    """Corpus rows per block when the caller gives none.  A block the scan copies (a memory
    map's or float16 rows, rows translated by a ``centre``, a device product's input) holds
    an eighth of ``memory_budget``; the rest holds one score block per thread, the sample and
    the candidates.  An in-memory float32 corpus that numpy multiplies as stored is never
    copied, so it takes the largest blocks, 65,536 rows: each block then splits into more
    (query chunk, part) items than threads, and a core that runs faster for a while takes
    more of them instead of waiting for the other at the end of every block.

    >>> default_block(np.zeros((10, 768), np.float32), 256 << 20, None, True)
    65536
    >>> default_block(np.zeros((10, 768), np.float16), 256 << 20, None, True)
    10922
    """
    copied = (
        not isinstance(corpus, np.ndarray) or isinstance(corpus, np.memmap)
        or corpus.dtype != np.float32 or not corpus.flags.c_contiguous
        or centre is not None or not numpy
    )  # fmt: skip
    if not copied:
        return _MAX_BLOCK
    return int(np.clip(memory_budget // (32 * corpus.shape[1]), 1024, _MAX_BLOCK))


def corpus_centre(queries: np.ndarray, corpus: np.ndarray, distance: str) -> np.ndarray | None:
    """The exact translation of the Euclidean rows (:func:`embedeval.engine.exact.exact_centre`
    of the queries' and the corpus's columns, read in blocks), or ``None`` (other distances,
    or no column can move): far-from-origin rows would otherwise cancel their float32 keys."""
    if distance != "euclidean":
        return None
    lo, hi, mean = column_stats([queries, corpus])
    return exact_centre(lo, hi, mean)


def _pair_keys_of(
    q: np.ndarray, x: np.ndarray, distance: str, terms: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None]:
    """The float64 keys of pairs before cosine multiples are tied, and (cosine) which corpus
    rows are not zero.  ``q``, ``x`` and the buffer ``terms`` are float64, C-ordered and
    transposed: one column per pair (shape ``(dim, pairs)``)."""
    if not q.shape[1]:
        return np.zeros(0, dtype=np.float64), np.zeros(0, dtype=bool)
    if distance == "euclidean":
        np.subtract(q, x, out=terms)
        terms *= terms
        return _in_column_order(terms) + 0.0, None
    s = _in_column_order(np.multiply(q, x, out=terms))
    if distance == "inner_product":
        return -s + 0.0, None
    x_sq = _in_column_order(np.multiply(x, x, out=terms))
    live = x_sq > 0
    out = np.zeros(s.size, dtype=np.float64)
    out[live] = -np.sign(s[live]) * (s[live] * s[live]) / x_sq[live] + 0.0
    return out, live


def _in_column_order(terms: np.ndarray) -> np.ndarray:
    """Each pair's sum (a column of the C-ordered ``terms``, shape ``(dim, pairs)``) added from
    its first term to its last, as the column loop of
    :func:`~embedeval.engine.decide.exact_keys` adds (up to the sign of a zero sum).

    numpy reduces along a slow axis of an array row after row, one vectorised add per row
    over every pair (pairwise summation only ever applies along the fast axis); a few pairs
    (the slow axis may then be the only one of length > 1) take that loop in Python.

    >>> t = np.array([[1e16, 1e16], [1.0, 1.0], [-1e16, -1e16]])  # (1e16 + 1) - 1e16 = 0
    >>> _in_column_order(t).tolist()
    [0.0, 0.0]
    """
    if terms.shape[1] < 16:
        acc = terms[0].copy()
        for row in terms[1:]:
            acc += row
        return acc
    return np.add.reduce(terms, axis=0)


def _maybe_multiples(keys: np.ndarray, groups: np.ndarray, live: np.ndarray) -> np.ndarray:
    """Indices (ascending) of the live cosine keys within a relative 1e-9 of another key of
    their group: the only ones that can belong to positive multiples of one row."""
    order = np.lexsort((keys, groups))
    k = keys[order]
    near = (groups[order][1:] == groups[order][:-1]) & (
        np.abs(np.diff(k)) <= 1e-9 * np.maximum(np.abs(k[1:]), np.abs(k[:-1]))
    )
    maybe = np.zeros(keys.size, dtype=bool)
    maybe[order[1:][near]] = maybe[order[:-1][near]] = True
    return np.flatnonzero(maybe & live)


def pair_keys(
    corpus: np.ndarray, scan: CorpusScan, qi: np.ndarray, rows: np.ndarray, groups: np.ndarray
) -> np.ndarray:
    """float64 keys (smaller = better) of the pairs ``(query qi[i], corpus row rows[i])`` from
    the float32 inputs (:func:`~embedeval.engine.decide.exact_keys`: Euclidean squared
    distance, ``-q.x``, or ``-sign(s) s^2 / ||x||^2`` for cosine, positive multiples of a row
    tied within a ``groups`` entry, ``groups`` sorted), a bounded number of pairs at a time.

    Bit for bit :func:`~embedeval.engine.decide.exact_keys` (the columns added in the same
    order, :func:`_in_column_order`); a zero corpus row has cosine key 0 and -0.0 becomes 0.0.
    The keys are formed in ascending corpus row order (a memory-mapped corpus is read in one
    sweep, not at random); only cosine keys within a relative 1e-9 of another key of their
    group can belong to positive multiples of one row (their float64 keys differ by a few
    roundings at most), and only their rows are read again, a group at a time."""
    out = np.empty(qi.size, dtype=np.float64)
    live = np.ones(qi.size, dtype=bool)
    dim = corpus.shape[1]
    step = max(1, _KEY_BYTES // (16 * dim))  # 3 float64 buffers and temporaries
    by_row = np.argsort(rows, kind="stable")
    local = threading.local()  # each thread's float64 buffers, reused by its chunks

    def chunk(a: int) -> None:
        at = by_row[a : a + step]
        k = at.size
        if getattr(local, "flat", None) is None:
            local.flat = [np.empty(dim * min(step, qi.size)) for _ in range(3)]
        # one column per pair: the sums then run along the slow axis (_in_column_order)
        x, q, terms = (f[: dim * k].reshape(dim, k) for f in local.flat)
        x[...] = np.asarray(corpus[rows[at]]).T
        q[...] = np.asarray(scan.raw[qi[at]]).T
        out[at], alive = _pair_keys_of(q, x, scan.distance, terms)
        if alive is not None:
            live[at] = alive
        release_pages(corpus, 0, corpus.shape[0])  # the rows read stay out of resident memory

    for _ in in_order(chunk, range(0, qi.size, step), scan.n_threads):
        pass
    if scan.distance != "cosine":
        return out
    sub = _maybe_multiples(out, groups, live)
    g, a = groups[sub], 0
    while a < sub.size:  # whole groups, about step pairs at a time
        b = int(np.searchsorted(g, g[min(a + step, sub.size) - 1], side="right"))
        part = sub[a:b]
        if part.size > 1:  # each row read once, in ascending order
            held, inverse = np.unique(rows[part], return_inverse=True)
            x = np.asarray(corpus[held], dtype=np.float64)[inverse]
            out[part] = _tie_multiples(out[part], x, groups[part], rows[part])
        a = b
    return out


def _exact_cosines(scan: CorpusScan, qi: np.ndarray, s: np.ndarray) -> np.ndarray:
    """The float64 cosines of exact inner products ``s`` (float64) of an exact scan that runs
    cosine as the inner product (:attr:`CorpusScan.cosine_sq`): from the cosine key
    ``-sign(s) s**2 / m``, as :func:`pair_keys` forms it of the same exact sums, bit for bit;
    rounded to float32 under ``ties="trec_eval"`` (:func:`rank_keys`)."""
    keys = -np.sign(s) * (s * s) / scan.cosine_sq + 0.0
    cosines = float64_scores(scan, qi, keys, "cosine")
    if scan.ties == "trec_eval":
        return cosines.astype(np.float32).astype(np.float64)
    return cosines


def float64_scores(
    scan: CorpusScan, qi: np.ndarray, keys: np.ndarray, distance: str | None = None
) -> np.ndarray:
    """Scores (larger is better) of float64 keys: ``-key`` (the negative squared Euclidean
    distance, the inner product) or, for cosine, ``sign(s) |s| / (||x|| ||q||)`` (0 for a
    zero query), one decreasing function of the key per query.

    >>> scan = CorpusScan(np.float32([[3, 4]]), None, "cosine", 1, np.arange(1, dtype=np.uint64),
    ...                   Pairs(np.zeros(0, int), np.zeros(0, int)))
    >>> float64_scores(scan, np.array([0]), np.array([-16.0])).tolist()
    [0.8]
    """
    if (distance or scan.distance) != "cosine":
        return -keys + 0.0
    q = np.asarray(scan.raw, dtype=np.float64)
    q_norm = np.sqrt(np.cumsum(q * q, axis=1)[:, -1])[qi]  # column order, as the keys
    with np.errstate(invalid="ignore", divide="ignore"):
        out = -np.sign(keys) * np.sqrt(np.abs(keys)) / q_norm
    return np.where(q_norm > 0, out, 0.0) + 0.0


def rank_keys(
    corpus: np.ndarray, scan: CorpusScan, qi: np.ndarray, rows: np.ndarray, groups: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(order key, float64 key)`` of pairs (:func:`pair_keys`): the order key is the float64
    key (``ties="index"``), or minus the float64 score rounded to float32
    (``ties="trec_eval"``: trec_eval reads a run's scores into float32 and sorts by them,
    then by document id descending, so a written run ranks exactly so there)."""
    keys = pair_keys(corpus, scan, qi, rows, groups)
    if scan.ties == "trec_eval":
        score = float64_scores(scan, qi, keys).astype(np.float32)
        return -score.astype(np.float64) + 0.0, keys
    return keys, keys


def candidate_ranks(
    corpus: np.ndarray,
    scan: CorpusScan,
    candidates: tuple[np.ndarray, np.ndarray],
    pairs: Pairs,
    pair_scores: np.ndarray,
) -> np.ndarray:
    """1-based float64 rank of each pair (float32 score ``pair_scores``) within its query's
    top ``depth`` given the :func:`scan_top` candidates, 0 where it is not in the top.

    Among the candidates (sorted by code: score descending), those more than the band above
    the pair certainly beat it; those within the band are re-scored (:func:`_near_beats`).
    A rank among the candidates of at most ``depth`` is the rank in the whole corpus (every
    document that beats a top document is a candidate); a larger one is not in the top.
    Exact scores (:attr:`CorpusScan.exact`): the codes are the ranking, and a pair's rank is
    the place of its own code among them.
    """
    query, codes = candidates
    n_q = scan.queries.shape[0]
    lims = np.searchsorted(query, np.arange(n_q + 1))
    pos = np.arange(codes.size) - lims[query]
    table = np.full((n_q, int(pos.max(initial=-1)) + 1), EMPTY, dtype=np.uint64)
    table[query, pos] = codes
    if scan.exact:  # the codes are in the exact order: a pair's rank is its code's place
        own = pack_codes(pair_scores, scan.keys[pairs.row])
        rank = rows_searchsorted(table, pairs.query, own) + 1
        return np.where(rank <= scan.depth, rank, 0)
    band = scan.band()[pairs.query]
    zero = np.zeros(pairs.query.size, dtype=np.uint64)
    # codes below pack(hi, 0): scores above hi; below pack(next under lo, 0): scores >= lo
    hi = widen(pair_scores, band)
    under = np.nextafter(widen_down(pair_scores, band), np.float32(-np.inf))
    above = rows_searchsorted(table, pairs.query, pack_codes(hi, zero))
    reach = rows_searchsorted(table, pairs.query, pack_codes(under, zero))
    n_near = np.maximum(reach - above, 0)
    if _shared_near(int(n_near.sum()), codes.size):
        return _positions_in_top(corpus, scan, candidates, pairs)
    p = np.repeat(np.arange(pairs.query.size), n_near)
    at = spans(above, n_near)
    rows = code_rows(table[pairs.query[p], at], scan.row_of_key())
    wins = _near_beats(corpus, scan, pairs, p, rows)[0]
    rank = above + wins + 1
    # No membership test: a document the scan left out scored below the cut of its block,
    # more than the band under the depth-th score so far, so at least ``depth`` candidates
    # score above its ``hi`` and its rank exceeds ``depth``.
    return np.where(rank <= scan.depth, rank, 0)


def _shared_near(n_near: int, n_candidates: int) -> bool:
    """Whether the pairs' near candidates outnumber the candidates (and a batch): with a wide
    band (a bfloat16 product, dense ties) the pairs share them, so each candidate is better
    re-scored once (:func:`_positions_in_top`) than once per pair."""
    return n_near > max(n_candidates, _NEAR_PAIRS)


def _positions_in_top(
    corpus: np.ndarray,
    scan: CorpusScan,
    candidates: tuple[np.ndarray, np.ndarray],
    pairs: Pairs,
) -> np.ndarray:
    """:func:`candidate_ranks` from the decided top lists (:func:`decide_top`): each pair's
    1-based place in its query's list, 0 where it is not there."""
    top = decide_top(corpus, scan, *candidates, False)[0]
    query, place = np.nonzero(top >= 0)
    if not query.size:
        return np.zeros(pairs.query.size, dtype=np.int64)
    width = np.int64(corpus.shape[0])
    held = query * width + top[query, place]
    order = np.argsort(held)
    held, place = held[order], place[order]
    wanted = pairs.query * width + pairs.row
    at = np.minimum(np.searchsorted(held, wanted), held.size - 1)
    return np.where(held[at] == wanted, place[at] + 1, 0)


def decide_top(
    corpus: np.ndarray, scan: CorpusScan, query: np.ndarray, codes: np.ndarray, scores: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """The first ``depth`` rows per query of candidates (``query`` ascending, ``codes``
    ascending within a query) in the float64 order, and their float64 scores (``scores``).

    Two neighbours whose float32 scores differ by more than ``2 B_q`` are in float64 order;
    runs closer than that (*clusters*) are sorted by (order key, tie key).  Their order keys
    are bounded first by a float64 dot product in any summation order (:func:`_order_bounds`,
    about ``4.5 (d + 8) 2**-53`` of the magnitude on either side): a candidate whose bounds
    meet no other bounds of its cluster is ordered by its lower bound, one whose bounds are a
    single value (``ties="trec_eval"``: its float32 score decided) by that value, and only
    the others in runs of overlapping bounds are re-scored (:func:`rank_keys`, a fixed-order
    sum per element); a coarse filter (bfloat16: thousands of candidates a cluster) so costs
    one vectorised dot product per candidate.
    With ``scores`` every candidate is re-scored (the run reports them: the float64 scores,
    rounded to float32 under ``ties="trec_eval"``, where they decide: there the bounds give
    the rounded score of nearly every candidate, and only the others take exact keys).
    Exact scores (:attr:`CorpusScan.exact`): the codes' order is the float64 order, and the
    float32 scores are the float64 ones (cosines formed from the exact inner products).
    """
    n_q, depth = scan.queries.shape[0], scan.depth
    top = np.full((n_q, depth), -1, dtype=np.int64)
    n = codes.size
    rows = code_rows(codes, scan.row_of_key())
    f32 = code_scores(codes).astype(np.float64)
    new = np.ones(n, dtype=bool)
    gap = 2.0**-40 + 1.0  # the float64 difference of float32 scores may round up
    new[1:] = (query[1:] != query[:-1]) | (f32[:-1] - f32[1:] > scan.band()[query[1:]] * gap)
    cluster = np.cumsum(new) - 1
    amb = np.arange(n) if scores else np.flatnonzero(np.bincount(cluster)[cluster] > 1)
    order_key = np.zeros(n, dtype=np.float64)
    keys = np.full(n, np.nan)
    if scan.exact:  # the float32 scores are the float64 ones: in order, reported as they are
        amb, order_key, keys = amb[:0], -f32 + 0.0, -f32 + 0.0
    trec = scan.ties == "trec_eval"  # order key: minus the float32 score, which it reports
    if amb.size and (trec or not scores):
        lo, hi = _order_bounds(corpus, scan, query[amb], rows[amb])
        order_key[amb] = lo  # the order key itself where lo == hi (ties="trec_eval")
        amb = amb[(lo < hi) & (scores or _overlapping(cluster[amb], lo, hi))]
    if amb.size:
        order_key[amb], keys[amb] = rank_keys(corpus, scan, query[amb], rows[amb], query[amb])
    order = np.lexsort((scan.keys[rows], order_key, cluster))
    pos = np.arange(n) - np.searchsorted(query, query)  # clusters never leave their query
    keep = pos < depth
    top[query[keep], pos[keep]] = rows[order][keep]
    if not scores:
        return top, None
    top_scores = np.full((n_q, depth), np.nan)
    # ties="trec_eval": the scores trec_eval reads and ranks by, rounded to float32 (rank_keys)
    if scan.exact and scan.cosine_sq is not None:  # cosine run as the inner product
        values = _exact_cosines(scan, query, f32)
    else:
        values = -order_key + 0.0 if trec else float64_scores(scan, query, keys)
    top_scores[query[keep], pos[keep]] = values[order][keep]
    return top, top_scores


def _overlapping(group: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Whether each closed interval ``[lo, hi]`` overlaps another of its ``group``, through a
    chain of overlapping ones (sorted by ``lo``, a run whose each next interval starts at or
    below the farthest end so far).  An interval outside every such run lies wholly above or
    below each other interval of its group.

    >>> _overlapping(np.zeros(5, int), np.array([0.0, 0.5, 2.5, 3.5, 5.0]),
    ...              np.array([3.0, 1.0, 2.8, 4.0, 6.0])).tolist()
    [True, True, True, False, False]
    """
    n = lo.size
    order = np.lexsort((lo, group))
    # ranks of the ends (equal values, equal ranks), offset per group so that one running
    # maximum over all groups never carries an end into the next group
    _, rank = np.unique(np.concatenate([lo[order], hi[order]]), return_inverse=True)
    offset = group[order].astype(np.int64) * np.int64(2 * n + 1)
    start, end = offset + rank[:n], offset + rank[n:]
    joins = np.zeros(n, dtype=bool)
    joins[1:] = start[1:] <= np.maximum.accumulate(end)[:-1]
    run = np.cumsum(~joins)
    out = np.empty(n, dtype=bool)
    out[order] = np.bincount(run)[run] > 1
    return out


def scan_ranks(
    corpus: np.ndarray,
    scan: CorpusScan,
    pairs: Pairs,
    bounds: tuple[np.ndarray, np.ndarray],
    equal: bool = False,
    cap: np.ndarray | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray, np.ndarray]:
    """1-based rank of each pair (a document in the corpus) in its query's float64 ranking:
    1 + the documents that beat it.  ``bounds``: float64 ``(lo, hi)`` around each pair's
    exact score (:func:`score_bounds`).  No row is sorted: per block, the scores of a query's
    row are counted per bucket between its thresholds (:func:`_count_passing`), which gives
    the documents whose float32 score is more than ``B_q`` (:meth:`CorpusScan.band`, halved:
    only the document's own score errs) above a pair's upper bound (certainly better) and
    picks out those within ``B_q`` of its bounds; only these are re-scored in float64
    (:func:`_near_beats`: a smaller order key, or an equal one and a smaller tie key).  With
    ``equal``, also ``(pair, row)`` of every other document whose order key equals its pair's
    (exact ties); an exact scan lists none (:func:`exact_tie_ranks` counts them), so it
    refuses ``equal``.  ``cap`` (per pair): a pair that ``cap`` or more documents certainly
    beat lies past the first ``cap`` places, which is all a shallow metric reads; it is
    reported as rank 0, and its near documents are not re-scored (nor listed as ties: its
    run of equal keys starts past ``cap`` too).
    """
    if equal and scan.exact:
        raise ValueError("an exact scan counts its ties: use exact_tie_ranks, not equal=True")
    beats, p, r = count_beats(corpus, scan, pairs, bounds, cap)
    past = np.zeros(beats.size, dtype=bool) if cap is None else beats >= cap
    if past.any():
        keep = ~past[p]
        p, r = p[keep], r[keep]
    wins, tied_p, tied_r = _near_beats_batched(corpus, scan, pairs, p, r)
    ranks = np.where(past, 0, beats + wins + 1)
    if equal:
        return ranks, tied_p, tied_r
    return ranks


class BeatCounter:
    """Per pair, the documents that certainly beat it and its *near* documents, counted block
    by block during a pass over the corpus (:func:`count_beats`, or :func:`scan_top`'s own
    pass: one product per block for both).  ``bounds``: float64 ``(lo, hi)`` around each
    pair's exact score (:func:`score_bounds`).

    A document beats a pair for certain when its float32 score is more than half the band
    (:meth:`CorpusScan.band`: it holds two scores' errors, and the pair's own is in its
    bounds) above the pair's upper bound; it is near when its score lies within half the band
    of the bounds.  The band is that of the rows read so far (:meth:`widen`, once per block,
    before the block's work): the errors of this block's scores are within it.

    ``cap`` (per pair, or None): a pair that ``cap`` or more documents certainly beat is past
    every place a shallow metric reads, and is not counted further (from the next part of the
    corpus a thread counts on), so a row whose pairs are all past costs one comparison per
    score, and a query chunk whose pairs are all past no product (:meth:`counted_queries`).

    ``limit``: the near documents kept at most (None: all).  Past it the counter gives up
    (:attr:`overflowed`, :meth:`result` None), so that counting pairs that may not need it
    (:func:`scan_top`'s pass, before the top lists say which pairs lie beyond them) never
    holds more than that on data with large runs of ties; the caller then counts the pairs
    it needs in a pass of their own.

    Exact scores (:attr:`CorpusScan.exact`, ``bounds`` both the pair's score) have no near
    documents: a document of equal score beats the pair when its tie key is smaller than the
    pair's (``pair_keys``, default the scan's keys of the pairs' rows: a shard's scan holds
    only its own), and is counted on the spot (:attr:`before`), as are all of them
    (:attr:`tied`, the pair's own document left out)."""

    def __init__(
        self,
        scan: CorpusScan,
        pairs: Pairs,
        bounds: tuple[np.ndarray, np.ndarray],
        limit: int | None = None,
        pair_keys: np.ndarray | None = None,
        cap: np.ndarray | None = None,
    ):
        self.scan, self.pairs, self.bounds, self.limit = scan, pairs, bounds, limit
        self.cap = cap
        if pair_keys is None and scan.exact:
            if pairs.row.size and (pairs.row.min() < 0 or pairs.row.max() >= scan.keys.size):
                raise ValueError("pairs outside this scan's rows need their pair_keys")
            pair_keys = scan.keys[pairs.row]
        self.pair_keys = pair_keys
        self.beats = np.zeros(pairs.query.size, dtype=np.int64)
        self.before = np.zeros(pairs.query.size, dtype=np.int64)
        self.tied = np.zeros(pairs.query.size, dtype=np.int64)
        self.order = np.lexsort((np.arange(pairs.query.size), pairs.query))
        self.q_sorted = pairs.query[self.order]
        self.hi = self.lo = np.zeros(0)
        self.near: list[tuple[np.ndarray, np.ndarray]] = []
        self.n_near = 0
        self.overflowed = False
        self._lock = threading.Lock()

    def widen(self, band: np.ndarray) -> None:
        """Thresholds for the next block, from the band of every row read so far."""
        half = (band[self.pairs.query] + self.scan.underflow) / 2
        self.hi, self.lo = widen(self.bounds[1], half), widen_down(self.bounds[0], half)

    def counted_queries(self) -> np.ndarray:
        """The query of each pair still counted (all without a ``cap``)."""
        query = self.pairs.query
        return query if self.cap is None else query[self.beats < self.cap]

    def count(self, c: int, s: np.ndarray, first: int) -> None:
        """Count the scores ``s`` of query chunk ``c`` against corpus rows ``first ...``
        (threads may count other parts and chunks at the same time)."""
        chunk = self.scan.chunk
        a, b = np.searchsorted(self.q_sorted, [c * chunk, (c + 1) * chunk])
        if a == b or self.overflowed:
            return
        idx, qs = self.order[a:b], self.q_sorted[a:b] - c * chunk
        if self.cap is not None:  # counts read while others add to them: only ever too low
            kept = self.beats[idx] < self.cap[idx]
            idx, qs = idx[kept], qs[kept]
            if not idx.size:
                return
        rows = self.pairs.row[idx]
        # 1 where the pair's own document is among these scores and not excluded (NaN): it
        # then counts among the scores equal to the pair's or near it
        inside = np.flatnonzero((rows >= first) & (rows < first + s.shape[1]))
        own = np.zeros(rows.size, dtype=np.int64)
        own[inside] = ~np.isnan(s[qs[inside], rows[inside] - first])
        if self.scan.exact:
            col_rank, pair_rank = self._tie_ranks(first, s.shape[1], self.pair_keys[idx])
            above, before, tied = _count_ties(s, self.hi[idx], qs, own, col_rank, pair_rank)
            with self._lock:  # two parts of one chunk may count the same pairs at once
                self.beats[idx] += above
                self.before[idx] += before
                self.tied[idx] += tied
            return
        room = None if self.limit is None else max(self.limit - self.n_near, 0)
        above, _, at, col = _count_passing(s, self.hi[idx], self.lo[idx], qs, own, room)
        with self._lock:
            if at is None or col is None or self.overflowed:
                self.overflowed = True
                self.near.clear()
                return
            self.beats[idx] += above
            self.n_near += at.size  # a limit: parts counted at once may pass it together
            self.near.append((idx[at], first + col))  # near another document than itself

    def _tie_ranks(
        self, first: int, n: int, keys: np.ndarray
    ) -> tuple[np.ndarray | None, np.ndarray]:
        """The tie rank of each of the ``n`` columns from corpus row ``first`` (None: their
        keys ascend, the rank is the column) and, per pair tie key in ``keys``, how many of
        the columns' keys are smaller."""
        part = self.scan.keys[first : first + n]
        if self.scan.ties == "index":
            return None, np.searchsorted(part, keys)
        order = np.argsort(part)
        col_rank = np.empty(n, dtype=np.int64)
        col_rank[order] = np.arange(n)
        return col_rank, np.searchsorted(part[order], keys)

    def result(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``(beats, p, r)``: per pair the certain beats (exact scores: the documents that beat
        it), and the near ``(pair, row)``; None when the counter :attr:`overflowed`."""
        if self.overflowed:
            self.near.clear()
            return None
        if self.scan.exact:
            return self.beats + self.before, np.zeros(0, np.int64), np.zeros(0, np.int64)
        p = np.concatenate([np.zeros(0, np.int64), *[n[0] for n in self.near]])
        r = np.concatenate([np.zeros(0, np.int64), *[n[1] for n in self.near]])
        self.near.clear()  # the parts, now in p and r
        return self.beats, p, r


def count_beats(
    corpus: np.ndarray,
    scan: CorpusScan,
    pairs: Pairs,
    bounds: tuple[np.ndarray, np.ndarray],
    cap: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pass of :func:`scan_ranks` over the corpus (:class:`BeatCounter`): per pair, the
    documents whose float32 score is more than half the band above its bounds (certainly
    better), and ``(pair, row)`` of the *near* documents, which :func:`near_wins` decides in
    float64.  (A corpus in shards counts in each shard's top pass instead:
    :func:`~embedeval.engine.corpus_shards.shard_top`.)"""
    return _counting_pass(corpus, scan, pairs, bounds, cap).result()  # no limit: never None


def exact_tie_ranks(
    corpus: np.ndarray, scan: CorpusScan, pairs: Pairs
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Under exact scores (:attr:`CorpusScan.exact`), per pair: its 1-based rank, how many
    documents of its score rank before it (a smaller tie key), and how many documents share
    its score (its own left out); one counting pass, nothing listed per tie.

    >>> c = np.float32([[1, 0], [0, 1], [1, 0], [1, 0]])
    >>> scan = CorpusScan(np.float32([[1, 0]]), None, "inner_product", 1,
    ...                   tie_keys(None, 4, "index"), Pairs(np.zeros(0, int), np.zeros(0, int)),
    ...                   exact=True)
    >>> [v.tolist() for v in exact_tie_ranks(c, scan, Pairs(np.array([0, 0]), np.array([2, 1])))]
    [[2, 4], [1, 0], [2, 0]]
    """
    counter = _counting_pass(corpus, scan, pairs, score_bounds(corpus, scan, pairs))
    return counter.beats + counter.before + 1, counter.before, counter.tied


def _counting_pass(
    corpus: np.ndarray,
    scan: CorpusScan,
    pairs: Pairs,
    bounds: tuple[np.ndarray, np.ndarray],
    cap: np.ndarray | None = None,
) -> BeatCounter:
    """A :class:`BeatCounter` of ``pairs`` (counted up to ``cap``) fed by one pass over the
    corpus."""
    # no pass has measured the corpus yet (exact scores need no band, hence no norm)
    if scan.m_sq == 0.0 and scan.distance != "cosine" and not scan.exact:
        measure_norms(corpus, scan)
    counter = BeatCounter(scan, pairs, bounds, cap=cap)
    counter.widen(scan.band())

    def work(task: tuple) -> None:
        c, (first, part, sq) = task
        with scan.scores(c, part, sq, first) as s:
            counter.count(c, s, first)

    with single_threaded_blas():
        for start, blk, norms in _blocks(corpus, scan, "docs (ranks)"):
            # a chunk without a pair to count needs no product either
            chunks = np.unique(counter.counted_queries() // scan.chunk).tolist()
            each(work, [(c, p) for p in scan.parts(start, blk, norms) for c in chunks],
                 scan.n_threads)  # fmt: skip
    scan.release_buffers()
    return counter


def near_wins(
    corpus: np.ndarray, scan: CorpusScan, pairs: Pairs, p: np.ndarray, r: np.ndarray
) -> np.ndarray:
    """Per pair, how many of its near documents (pair ``p[i]``, corpus row ``r[i]``, from
    :func:`count_beats`) beat it in float64 (:func:`_near_beats`)."""
    return _near_beats_batched(corpus, scan, pairs, p, r)[0]


#: Buckets per row in :func:`_count_passing` (between a row's lowest and highest threshold),
#: at most; a block of few columns takes fewer (an eighth of its columns, at least 16).  The
#: bucket table (8 bytes a bucket) stays a quarter of the score block (4 bytes a score): only
#: the scores above a row's lowest threshold reach it, and with more buckets than those
#: scores, clearing and summing the table costs more than the few scores it keeps from the
#: exact comparison.
_BUCKETS = 1024
_BUCKET_BYTES = 2 << 20  # bucket numbers (int32) formed at a time, a few rows of a block


def _count_passing(
    s: np.ndarray,
    hi: np.ndarray,
    lo: np.ndarray,
    qs: np.ndarray,
    own: np.ndarray,
    limit: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Per pair (row ``qs`` of ``s``, float32 thresholds ``hi >= lo``): the scores of its row
    above ``hi`` and at or above ``lo``; and ``(pair, column)`` of its *near* scores (at or
    above ``lo``, not above ``hi``) where it has more than ``own`` of them (1 where the pair's
    own document is in ``s``, else 0), or ``(None, None)`` when they number more than
    ``limit``.  A NaN threshold (an excluded pair) counts nothing (:class:`_Passing`)."""
    found = _Passing(s, hi, lo, qs)
    take = found.n_near > own
    m = found.n_near[take]
    if limit is not None and int(m.sum()) > limit:
        return found.above, found.reach, None, None
    first = spans(found.lo_start[take], m)
    pair = np.repeat(np.flatnonzero(take), m)
    return found.above, found.reach, pair, (found.codes[first] & found.cols).astype(np.int64)


def _count_ties(
    s: np.ndarray,
    score: np.ndarray,
    qs: np.ndarray,
    own: np.ndarray,
    col_rank: np.ndarray | None,
    pair_rank: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per pair (row ``qs`` of ``s``, its exact float32 ``score``): the scores of its row above
    it, those equal to it whose column's tie rank (``col_rank``, None: the column itself) is
    below ``pair_rank`` (from 0 to the number of columns), and those equal to it, less ``own``
    (1 where the pair's own document is in ``s``).  Exact scores (:attr:`CorpusScan.exact`)
    need nothing more: no near document is listed, however many tie."""
    found = _Passing(s, score, score, qs, col_rank)
    at = found.row_bits | (_bits64(np.where(found.live, score, np.inf)) << found.cb)
    before = np.searchsorted(found.codes, at | pair_rank.astype(np.uint64), "left")
    before = np.where(found.live, before - found.lo_start, 0)
    return found.above, before, np.maximum(found.n_near - own, 0)


class _Passing:
    """The scores of each pair's row (row ``qs`` of ``s``) above ``hi``, at or above ``lo``, and
    between them (:func:`_count_passing`, :func:`_count_ties`); NaN thresholds (excluded pairs)
    count nothing.

    Scores below a row's lowest threshold (and NaN scores) count for no pair and are dropped
    by one comparison.  One map per row sends every other score and threshold to a bucket,
    ``k(x) = trunc(min(max((x - a) * inv, -1), W)) + 1`` in float32 (``a`` the row's lowest
    threshold, ``inv = W / (range of its thresholds)``, ``W`` up to :data:`_BUCKETS`): rounding
    keeps it non-decreasing in ``x``, so a score in a higher bucket than a threshold is above
    it, one in a lower bucket below it.  Scores are counted per bucket in one ``bincount``;
    those in the buckets a pair's thresholds span are sorted as ``(row, score, column)``
    codes (``col_rank``: the column's rank instead) and compared exactly.  About three passes
    over ``s``, and ten over the scores kept, however many thresholds a row holds."""

    def __init__(
        self,
        s: np.ndarray,
        hi: np.ndarray,
        lo: np.ndarray,
        qs: np.ndarray,
        col_rank: np.ndarray | None = None,
    ) -> None:
        n_rows, n = s.shape
        w = int(np.clip(n // 8, 16, _BUCKETS))
        live = ~(np.isnan(hi) | np.isnan(lo))
        a, inv = _bucket_map(hi[live], lo[live], qs[live], n_rows, w)
        floor = np.full(n_rows, np.inf, dtype=np.float32)
        np.minimum.at(floor, qs[live], lo[live].astype(np.float32))
        width = w + 2
        k_hi = _buckets_of(hi, a[qs], inv[qs], w)
        k_lo = _buckets_of(lo, a[qs], inv[qs], w)
        marked = _spanned(k_lo[live], k_hi[live], qs[live], n_rows, width)
        counts, pos = _bucket_counts(s, floor, a, inv, w, marked)
        counts[marked] = 0  # scores of spanned buckets are compared exactly instead
        total = np.cumsum(counts)  # the other scores above bucket k: row's last total - total[k]
        last = total[qs * width + width - 1]
        # (row, score bits, column) fit 64 bits: a score block holds about 2**22 entries at most
        self.cb = cb = np.uint64(max(int(n).bit_length(), 1))
        r = pos // n
        col = pos - r * n
        codes = (r.astype(np.uint64) << np.uint64(32)) | sortable_bits(s.ravel()[pos])
        codes = (codes << cb) | (col if col_rank is None else col_rank[col]).astype(np.uint64)
        codes.sort()
        self.codes, self.live = codes, live
        self.row_bits = at = qs.astype(np.uint64) << (np.uint64(32) + cb)
        end = np.searchsorted(codes, at + (np.uint64(1) << (np.uint64(32) + cb)))
        self.cols = cols = (np.uint64(1) << cb) - np.uint64(1)
        safe_hi, safe_lo = np.where(live, hi, np.inf), np.where(live, lo, np.inf)
        hi_end = np.searchsorted(codes, at | (_bits64(safe_hi) << cb) | cols, "right")
        self.lo_start = np.searchsorted(codes, at | (_bits64(safe_lo) << cb), "left")
        self.above = np.where(live, last - total[qs * width + k_hi] + end - hi_end, 0)
        self.reach = np.where(live, last - total[qs * width + k_lo] + end - self.lo_start, 0)
        self.n_near = np.where(live, np.maximum(hi_end - self.lo_start, 0), 0)


def _bucket_counts(
    s: np.ndarray,
    floor: np.ndarray,
    a: np.ndarray,
    inv: np.ndarray,
    w: int,
    marked: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The scores of each row of ``s`` at or above its ``floor``, counted per bucket
    (:func:`_buckets_of`; flat, ``w + 2`` buckets a row), and the flat positions of those in
    ``marked`` buckets; a few rows at a time, so the bucket numbers never exist for the whole
    block at once."""
    n_rows, n = s.shape
    width = w + 2
    counts = np.empty(n_rows * width, dtype=np.int64)
    found = [np.zeros(0, np.int64)]
    step = max(1, _BUCKET_BYTES // (4 * max(n, 1)))
    for r0 in range(0, n_rows, step):
        r1 = min(n_rows, r0 + step)
        part = s[r0:r1]
        kept = np.flatnonzero(part >= floor[r0:r1, None])  # NaN scores: never kept
        per_row = np.diff(np.searchsorted(kept, np.arange(r1 - r0 + 1) * n))
        k = _buckets_of(
            part.ravel()[kept], np.repeat(a[r0:r1], per_row), np.repeat(inv[r0:r1], per_row), w
        )
        k += np.repeat(np.arange(0, (r1 - r0) * width, width, dtype=np.int32), per_row)
        counts[r0 * width : r1 * width] = np.bincount(k, minlength=(r1 - r0) * width)
        near = marked[r0 * width : r1 * width][k]
        found.append(kept[near] + r0 * n)
    return counts, np.concatenate(found)


def _bits64(values: np.ndarray) -> np.ndarray:
    """:func:`~embedeval.engine.candidates.sortable_bits` of float32 values, as uint64."""
    return sortable_bits(values.astype(np.float32)).astype(np.uint64)


def _bucket_map(
    hi: np.ndarray, lo: np.ndarray, rows: np.ndarray, n_rows: int, w: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per row of :func:`_count_passing`, float32 ``a`` (its lowest threshold; ``+inf`` for a
    row without one: every score in bucket 0) and ``inv`` (``w`` over the row's threshold
    range, positive and finite: a product with it never makes ``0 * inf``).  Infinite
    thresholds (a widened score that overflowed) count as the largest finite float32 here:
    ``a`` and the range stay finite, and the map itself still sends them past every score."""
    big = np.finfo(np.float32).max
    a = np.full(n_rows, np.inf, dtype=np.float32)
    top = np.full(n_rows, -np.inf, dtype=np.float32)
    np.minimum.at(a, rows, np.clip(lo, -big, big).astype(np.float32))
    np.maximum.at(top, rows, np.clip(hi, -big, big).astype(np.float32))
    spread = top.astype(np.float64) - a.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(spread > 0, w / spread, 1.0)
    inv = np.minimum(np.nan_to_num(inv, nan=1.0), 1e30).astype(np.float32)
    return a, inv


def _buckets_of(x: np.ndarray, a: np.ndarray, inv: np.ndarray, w: int) -> np.ndarray:
    """``k(x)`` of :func:`_count_passing` (int32, in ``[0, w + 1]``) for float32 ``x``, with
    ``a`` / ``inv`` of its row (same shape as ``x``, or broadcast to it), every step in
    float32."""
    with np.errstate(over="ignore", invalid="ignore"):  # +-inf and NaN: handled below
        t = np.subtract(x, a, dtype=np.float32)
        t *= inv
    np.fmax(t, np.float32(-1), out=t)  # NaN: -1, bucket 0
    np.minimum(t, np.float32(w), out=t)
    k = t.astype(np.int32)  # truncation: non-decreasing too
    k += 1
    return k


def _spanned(
    lo: np.ndarray, hi: np.ndarray, rows: np.ndarray, n_rows: int, width: int
) -> np.ndarray:
    """Flat ``(n_rows * width)`` bool: the buckets from ``lo[i]`` to ``hi[i]`` of row
    ``rows[i]``."""
    marked = np.zeros(n_rows * width, dtype=bool)
    size = hi - lo + 1
    if size.sum() > marked.size:  # wide bands: mark by a running sum of steps instead
        step = np.zeros(n_rows * width + 1, dtype=np.int32)
        np.add.at(step, rows * width + lo, 1)
        np.add.at(step, rows * width + hi + 1, -1)
        return np.cumsum(step[:-1]) > 0
    marked[spans(rows * width + lo, size)] = True
    return marked


def measure_norms(corpus: np.ndarray, scan: CorpusScan) -> None:
    """Set :attr:`CorpusScan.m_sq` from every corpus row (one read, no product)."""
    for start, stop in block_bounds(corpus.shape[0], scan.block):
        rows = corpus_block(corpus, start, stop, scan.distance, None, scan.centre, scan.first_row)
        scan.see(rows[1])
        release_pages(corpus, start, stop)


def score_bounds(
    corpus: np.ndarray, scan: CorpusScan, pairs: Pairs
) -> tuple[np.ndarray, np.ndarray]:
    """float64 ``(lo, hi)`` around each pair's exact score, on the scale of the scan's float32
    scores (``-||q - x||^2``, ``q.x`` or the cosine, from the rows as given), a float64
    dot product per pair (:func:`_order_bounds`).  Under :attr:`CorpusScan.exact` both are the
    exact score: the dot product of integers is exact, and its bounds lie far within 1/2 of it."""
    lo, hi = _order_bounds(corpus, scan, pairs.query, pairs.row, "score")
    if scan.exact:
        score = np.rint(0.5 * (lo + hi)) + 0.0
        return score, score
    return lo, hi


def _near_beats_batched(
    corpus: np.ndarray, scan: CorpusScan, pairs: Pairs, p: np.ndarray, r: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_near_beats` over ranges of pairs holding about :data:`_NEAR_PAIRS` near
    documents each (16 times as many for a memory-mapped corpus; a pair's near documents
    all in one range), so its temporaries stay bounded however many near documents the scan
    found; the same counts and ties, in the same order (pairs ascending)."""
    # each batch sweeps the rows it reads: a memory-mapped corpus (not in memory itself, and
    # read again from the disk by every sweep under a memory limit) takes larger batches
    batch = _NEAR_PAIRS * (16 if _is_mapped(corpus) else 1)
    if p.size <= batch:
        return _near_beats(corpus, scan, pairs, p, r)
    per_pair = np.bincount(p, minlength=pairs.query.size)
    ends = np.searchsorted(np.cumsum(per_pair), np.arange(batch, p.size, batch))
    limits = np.unique(np.concatenate([[0], ends + 1, [pairs.query.size]]))
    count = np.zeros(pairs.query.size, dtype=np.int64)
    tied_p, tied_r = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for lo, hi in itertools.pairwise(limits):
        at = np.flatnonzero((p >= lo) & (p < hi))
        c, tp, tr = _near_beats(corpus, scan, pairs, p[at], r[at])
        count += c
        tied_p.append(tp)
        tied_r.append(tr)
    return count, np.concatenate(tied_p), np.concatenate(tied_r)


def _near_beats(
    corpus: np.ndarray, scan: CorpusScan, pairs: Pairs, p: np.ndarray, r: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per pair, how many of its near documents (pair ``p[i]``, corpus row ``r[i]``) beat it
    in float64: a smaller order key (:func:`rank_keys`), or an equal one and a smaller tie
    key; and the ``(pair, row)`` of the other documents whose order key equals the pair's.

    A float64 dot product (any summation order) first bounds each order key
    (:func:`_order_bounds`); only documents whose bounds overlap their pair's get the exact
    keys, formed with their pair's own in one group (cosine multiples tie)."""
    other = r != pairs.row[p]  # a pair's own document met among its near ones: itself
    p, r = p[other], r[other]
    if not p.size:
        return np.zeros(pairs.query.size, dtype=np.int64), p, r
    mine = np.unique(p)
    p = np.concatenate([p, mine])
    r = np.concatenate([r, pairs.row[mine]])
    is_own = np.zeros(p.size, dtype=bool)
    is_own[-mine.size :] = True
    order = np.lexsort((~is_own, r, p))  # deterministic groups, whatever the threads did
    p, r, is_own = p[order], r[order], is_own[order]
    lo, hi = _order_bounds(corpus, scan, pairs.query[p], r)
    own_lo, own_hi = np.empty(pairs.query.size), np.empty(pairs.query.size)
    own_lo[p[is_own]], own_hi[p[is_own]] = lo[is_own], hi[is_own]
    known = (lo == hi) & (own_lo[p] == own_hi[p])
    unsure = ~known & (hi >= own_lo[p]) & (lo <= own_hi[p]) & ~is_own
    same = np.zeros(p.size, dtype=bool)  # a copy of the pair's row: its key, no sum needed
    maybe = np.flatnonzero(unsure)
    if scan.distance != "cosine":  # cosine copies are multiples: keyed with their group below
        same[maybe[_same_rows(corpus, r[maybe], pairs.row[p[maybe]])]] = True
    unsure &= ~same
    redo = np.zeros(pairs.query.size, dtype=bool)
    redo[p[unsure]] = True
    again = np.flatnonzero(unsure | (is_own & redo[p]))
    key = lo.copy()  # where known: the order key itself
    key[again] = rank_keys(corpus, scan, pairs.query[p[again]], r[again], p[again])[0]
    own = np.empty(pairs.query.size, dtype=np.float64)
    own[p[is_own]] = key[is_own]
    sure = ~unsure & ~known & ~same
    equal = same | ((known | unsure) & (key == own[p]))
    wins = (sure & (hi < own_lo[p])) | ((known | unsure) & (key < own[p]))
    wins |= equal & (scan.keys[r] < scan.keys[pairs.row[p]])
    wins &= ~is_own
    count = np.bincount(p, weights=wins, minlength=pairs.query.size).astype(np.int64)
    tied = equal & ~is_own
    return count, p[tied], r[tied]


def _same_rows(corpus: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whether corpus rows ``a[i]`` and ``b[i]`` are identical (equal float64 keys for any
    query), a bounded number of rows at a time."""
    out = np.zeros(a.size, dtype=bool)
    step = max(1, _KEY_BYTES // (8 * corpus.shape[1]))
    order = np.lexsort((b, a))  # ascending rows: one sweep of a memory-mapped corpus
    for i in range(0, a.size, step):
        at = order[i : i + step]
        x = np.asarray(corpus[a[at]])
        held, inverse = np.unique(b[at], return_inverse=True)  # each row read once
        out[at] = (x == np.asarray(corpus[held])[inverse]).all(axis=1)
    return out


def _order_bounds(
    corpus: np.ndarray, scan: CorpusScan, qi: np.ndarray, rows: np.ndarray, kind: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """Bounds ``lo <= order key <= hi`` of pairs (:func:`rank_keys`) from float64 dot products
    in any summation order (:func:`_row_dots`): each within ``gamma_{dim}`` (unit roundoff
    2**-53) of the exact sum, as is each of the key's own fixed-order sums, so ``E = 4.5
    gamma_{dim+8}`` times the magnitude (``(||q|| + ||x||)^2``, ``||q|| ||x||``, or ``||q||``
    for the cosine ``c = s / ||x||``, whose key is ``-c |c|``) holds both.  The cosine is
    the widest case: the dot product (``gamma_dim ||q||`` on each side) and the row's norm
    (``gamma_dim / 2`` of ``|c|`` on each side) put the two values of ``c`` up to
    ``3 gamma_dim ||q||`` apart, and a score (``c / ||q||``, under ``ties="trec_eval"``) adds
    the query norm's ``gamma_dim / 2`` on each side: ``4 gamma_dim`` and a few roundings.
    Under ``ties="trec_eval"`` the bounds are those of the score rounded to float32: equal
    where the rounding is decided.  ``kind="score"``: bounds of the scores instead
    (:func:`_bounds_of`)."""
    kind = kind or ("float32" if scan.ties == "trec_eval" else "key")
    lo, hi = np.empty(qi.size), np.empty(qi.size)
    d = corpus.shape[1]
    g = 4.5 * gamma(d + 8, 2.0**-53) * (1 + 2.0**-20)
    step = max(1, _KEY_BYTES // (8 * d))
    q_norms = None
    if scan.distance != "euclidean":  # once per query, not per pair
        q_norms = np.sqrt(sq_norms(scan.raw))

    # rows in ascending order: a memory-mapped corpus is read in one sweep, not at random; in
    # memory, each query's pairs together: their dot products are one matrix-vector product
    grouped = scan.distance != "euclidean" and not _is_mapped(corpus)
    order = np.lexsort((rows, qi)) if grouped else np.argsort(rows, kind="stable")

    # one piece of rows a task (8 MiB of float64 rows): smaller, cache-sized pieces read the
    # rows faster but cost more in per-piece steps than they save (on 132,000 cosine pairs
    # of 768 dimensions, two threads: 0.23 s in pieces of 256 rows, 0.19 s in one of 1,365)
    def chunk(a: int) -> None:
        at = order[a : a + step]
        x = np.asarray(corpus[rows[at]], dtype=np.float64)
        s = _few_queries_dots(scan.raw, qi[at], x) if grouped else None
        q = None if s is not None else np.asarray(scan.raw[qi[at]], dtype=np.float64)
        qn = None if q_norms is None else q_norms[qi[at]]
        lo[at], hi[at] = _bounds_of(q, x, scan.distance, g, kind, qn, s)

    with single_threaded_blas():  # the engine's threads, one BLAS thread each
        for _ in in_order(chunk, range(0, qi.size, step), scan.n_threads):
            pass
    return lo, hi


#: Queries in a piece of pairs above which :func:`_few_queries_dots` leaves the dot products
#: to :func:`_row_dots` (a product per query of the piece would cost more).
_FEW_QUERIES = 4


def _few_queries_dots(raw: np.ndarray, qi: np.ndarray, x: np.ndarray) -> np.ndarray | None:
    """float64 ``raw[qi[i]] . x[i]`` for a piece of pairs sorted by query that holds at most
    :data:`_FEW_QUERIES` queries: each query's rows times that query (a BLAS product, in any
    summation order); None for more queries.

    >>> raw = np.float32([[1, 2], [3, 4]])
    >>> _few_queries_dots(raw, np.array([0, 0, 1]), np.array([[1.0, 1], [2, 0], [0, 1]])).tolist()
    [3.0, 2.0, 4.0]
    """
    starts = np.flatnonzero(np.diff(qi)) + 1
    if starts.size >= _FEW_QUERIES:
        return None
    out = np.empty(qi.size)
    for a, b in itertools.pairwise([0, *starts.tolist(), qi.size]):
        out[a:b] = x[a:b] @ np.asarray(raw[qi[a]], dtype=np.float64)
    return out


def _is_mapped(corpus: Any) -> bool:
    """Whether rows of ``corpus`` are read from a memory map (itself, the rows a float32
    reader reads, or any piece of stacked rows)."""
    pieces = getattr(corpus, "pieces", [corpus])
    return any(getattr(getattr(p, "stored", p), "_mmap", None) is not None for p in pieces)


def _bounds_of(
    q: np.ndarray,
    x: np.ndarray,
    distance: str,
    g: float,
    kind: str,
    qn: np.ndarray | None = None,
    s: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_order_bounds` of aligned float64 rows ``q`` and ``x`` (see there): of the
    order key (``kind="key"``), of the key of the score rounded to float32 (``"float32"``,
    ``ties="trec_eval"``), or of the score on the scale the scan's float32 scores approximate
    (``"score"``: ``-||q - x||^2``, ``q.x`` or the cosine); ``qn``: the query rows' float64
    norms, when known; ``s``: their dot products, when known (any summation order: then
    ``q`` is not read, and may be None)."""
    tiny = 1e-300
    if distance == "euclidean":
        t = q - x
        k = _row_dots(t, t)
        e = g * k + tiny  # every term is positive: a relative bound
        s_lo, s_hi = -(k + e), -(k - e)  # score = -key
    else:
        s = _row_dots(q, x) if s is None else s
        qn = np.sqrt(_row_dots(q, q)) if qn is None else qn
        xn = np.sqrt(_row_dots(x, x))
        wide = 1 + 2.0**-40  # the norms' own rounding, in the bounds only
        if distance == "inner_product":
            e = g * qn * xn * wide + tiny
            s_lo, s_hi = s - e, s + e
        else:
            live = xn > 0
            c = np.where(live, s / np.where(live, xn, 1), 0.0)
            e = np.where(live, g * qn * wide + tiny, 0.0)
            slack = np.where(live, tiny, 0.0)  # a zero row: key and score 0 exactly
            if kind == "key":  # key = -c |c|, decreasing in c
                k_lo, k_hi = -(c + e) * np.abs(c + e), -(c - e) * np.abs(c - e)
                return _outward(k_lo, k_hi, slack)
            inv = np.where(qn > 0, 1 / np.where(qn > 0, qn, 1), 0.0)
            s_lo, s_hi = _outward((c - e) * inv, (c + e) * inv, slack)
    if kind == "score":
        return s_lo, s_hi
    if kind == "key":
        return -s_hi, -s_lo  # key = -score
    with np.errstate(over="ignore"):
        return -s_hi.astype(np.float32).astype(np.float64), -s_lo.astype(np.float32).astype(
            np.float64
        )


def _row_dots(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise dot products of float64 ``a`` and ``b``, in any summation order: numpy 2's
    ``vecdot`` (a vectorised loop, twice as fast as ``einsum`` here), else ``einsum``."""
    if hasattr(np, "vecdot"):
        return np.vecdot(a, b)
    return np.einsum("ij,ij->i", a, b)


def _outward(lo: np.ndarray, hi: np.ndarray, slack: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[lo, hi]`` widened by a few float64 roundings of the final operations and ``slack``."""
    r = 8 * 2.0**-53
    return lo - r * np.abs(lo) - slack, hi + r * np.abs(hi) + slack
