"""The corpus engine (:mod:`embedeval.engine.corpus`) over a corpus in pieces (*shards*), merged
exactly: the result is that of one scan of the concatenated corpus, bit for bit.

Every shard is scanned by itself with the engine's own functions (on this machine or on a Dask
worker), under the *same* queries, tie keys (global: each shard takes its slice) and Euclidean
centre; only the bound on the shard's row norms (``m_sq``) is its own.

* Top lists: a document of the float64 top ``depth`` of the whole corpus is in the float64
  top ``depth`` of its own shard, so it is among the shard's :func:`~.corpus.scan_top`
  candidates.  The union of the shards' candidates (codes carry the global tie key) is then
  decided in float64 by :func:`~.corpus.decide_top` / :func:`~.corpus.candidate_ranks` under
  a band covering every shard's rows: the same float64 order, hence the same lists and ranks.
* Ranks beyond the top (full-depth metrics): in the same pass, each shard counts the
  documents that certainly beat a judged document (more than the band above it; the judged
  document's own row may lie in another shard) with :class:`~.corpus.BeatCounter`, and the
  counts are summed.  The *near* documents of every shard are then decided together in
  float64 (:func:`~.corpus.near_wins`), as one scan decides them: positive multiples of a
  row tie under the key of the group's smallest row, which may lie in another shard than the
  one holding the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .corpus import BeatCounter, CorpusScan, Pairs, scan_top

__all__ = [
    "Float32Rows",
    "ShardPlan",
    "StackedRows",
    "float32_rows",
    "merge_candidates",
    "shard_top",
]


class StackedRows:
    """Several 2-D arrays read as one, row after row, without a copy of the whole: slices and
    integer arrays of rows, ``shape``, ``dtype``.

    >>> s = StackedRows([np.zeros((2, 2), np.float32), np.ones((1, 2), np.float32)])
    >>> s.shape, s[np.array([2, 0])].tolist()
    ((3, 2), [[1.0, 1.0], [0.0, 0.0]])
    """

    def __init__(self, pieces: Sequence[np.ndarray]) -> None:
        self.pieces = list(pieces)
        sizes = [p.shape[0] for p in self.pieces]
        self.offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        n = int(self.offsets[-1])
        self.shape = (n, int(self.pieces[0].shape[1]))
        first = self.pieces[0]
        own = n <= sizes[0]  # every row is the first piece's: its slices, as they are
        self._gather_dtype = np.result_type(*[p.dtype for p in self.pieces])
        self.dtype = first.dtype if own else self._gather_dtype
        self.flags, self.strides = first.flags, first.strides
        # a memory map releases the pages of streamed rows only when they are all its own
        self._mmap = getattr(first, "_mmap", None) if own else None

    def __getitem__(self, index: slice | np.ndarray) -> np.ndarray:
        if isinstance(index, slice):
            start, stop, _ = index.indices(int(self.offsets[-1]))
            if stop <= self.offsets[1]:
                return self.pieces[0][start:stop]
            index = np.arange(start, stop)
        rows = np.asarray(index, dtype=np.int64)
        piece = np.searchsorted(self.offsets, rows, side="right") - 1
        out = np.empty((rows.size, self.shape[1]), dtype=self._gather_dtype)
        for i in np.unique(piece).tolist():
            mine = piece == i
            out[mine] = self.pieces[i][rows[mine] - self.offsets[i]]
        return out


class Float32Rows:
    """A 2-D array stored in another type (float64, integers) read as float32 rows, a slice or
    a list of rows at a time: a memory-mapped corpus is never converted whole, and the scan's
    float32 filter and its float64 keys read the same float32 values (the inputs the ranking
    is defined on).  Its pages are left to the kernel (nothing to unmap from a copy).

    >>> rows = Float32Rows(np.array([[1e-50, 3.0]]))
    >>> rows[0:1].tolist(), rows.flags.c_contiguous  # not contiguous: the engine copies blocks
    ([[0.0, 3.0]], False)
    """

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows
        self.shape = tuple(int(v) for v in rows.shape)
        self.dtype = np.dtype(np.float32)
        self.strides = (4 * self.shape[1], 4)

    @property
    def flags(self) -> Any:
        """Not C-contiguous: the engine copies each block (a property: flags do not pickle)."""
        return np.empty((2, 2), np.float32)[:, ::-1].flags

    @property
    def stored(self) -> np.ndarray:
        """The rows as stored (a memory map releases its pages through them)."""
        return self.rows

    def __getitem__(self, index: slice | np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):  # beyond float32's range: inf, refused by the scan
            return np.asarray(self.rows[index], dtype=np.float32)


def float32_rows(arr: np.ndarray) -> np.ndarray | Float32Rows:
    """A corpus (or piece) as the engine reads it: float32 and float16 arrays as they are (a
    memory map stays one), other types as float32 rows: an array in memory converted once, a
    memory map read through :class:`Float32Rows` (the ranking is that of the float32 inputs,
    which the filter and the float64 keys must both read)."""
    if arr.dtype in (np.float32, np.float16):
        return arr
    if isinstance(arr, np.memmap) or getattr(arr, "_mmap", None) is not None:
        return Float32Rows(arr)
    with np.errstate(over="ignore"):  # beyond float32's range: inf, refused by the scan
        return arr.astype(np.float32)


@dataclass(frozen=True)
class ShardPlan:
    """What a shard's scan shares with the scan of the whole corpus (plain arrays, so it can be
    shipped to a worker): the prepared queries, the tie keys and excluded pairs of the shard's
    rows (:meth:`piece`), the Euclidean centre, the depth and the block size."""

    queries: np.ndarray
    query_norms: np.ndarray | None
    raw: np.ndarray
    centre: np.ndarray | None
    distance: str
    depth: int
    keys: np.ndarray
    excluded_query: np.ndarray
    excluded_row: np.ndarray
    ties: str
    block: int
    n_threads: int | None
    progress: bool | None
    exact: bool = False
    cosine_sq: float | None = None
    #: The corpus row of the plan's first row (errors name a shard's rows by their corpus row).
    first_row: int = 0

    @classmethod
    def of(cls, scan: CorpusScan, progress: bool | None) -> ShardPlan:
        """The plan of a whole-corpus scan (numpy products)."""
        return cls(
            scan.queries, scan.query_norms, scan.raw, scan.centre, scan.distance, scan.depth,
            scan.keys, scan.excluded.query, scan.excluded.row, scan.ties, scan.block,
            scan.n_threads, progress, scan.exact, scan.cosine_sq, scan.first_row,
        )  # fmt: skip

    def piece(self, start: int, stop: int) -> ShardPlan:
        """The plan of corpus rows ``start:stop``: their tie keys and exclusions, rows local."""
        sel = (self.excluded_row >= start) & (self.excluded_row < stop)
        return replace(
            self,
            keys=self.keys[start:stop],
            excluded_query=self.excluded_query[sel],
            excluded_row=self.excluded_row[sel] - start,
            first_row=self.first_row + start,
        )

    def scan(self) -> CorpusScan:
        """A fresh scan of the shard."""
        return CorpusScan(
            self.queries, self.query_norms, self.distance, self.depth, self.keys,
            Pairs(self.excluded_query, self.excluded_row), block=self.block,
            n_threads=self.n_threads, progress=self.progress, raw=self.raw,
            centre=self.centre, ties=self.ties, exact=self.exact, cosine_sq=self.cosine_sq,
            first_row=self.first_row,
        )  # fmt: skip


def shard_top(
    plan: ShardPlan,
    shard: np.ndarray,
    query: np.ndarray,
    row: np.ndarray,
    counted: tuple[np.ndarray, ...] | None = None,
) -> tuple:
    """One shard's :func:`~.corpus.scan_top`: its candidates ``(query, code)``, the float32
    scores of the pairs ``(query, row)`` (rows local to the shard), the bound ``m_sq`` on its
    rows' squared norms, and, for the pairs ``counted = (query, local row, lo, hi, limit,
    keys)`` (a row of another shard: outside ``0 .. n - 1``; ``lo``/``hi`` bound the pairs'
    exact scores; ``limit`` the near documents kept at most; ``keys`` the global tie keys of
    the pairs' documents, which an exact scan needs (its pairs' documents lie in other
    shards too), or None: a banded scan decides its ties from the near lists), the shard's
    documents that certainly beat each and ``(pair, local row)`` of its near documents,
    counted from the same products (:meth:`~.corpus.BeatCounter.result`: None past the limit
    or when nothing is counted), which the caller sums and decides with every other shard's
    (:func:`~.corpus.near_wins`).

    >>> from .corpus import tie_keys
    >>> corpus = np.float32([[3, 0], [1, 0], [2, 0], [1, 0]])  # query [1, 0]: rows 0, 2, 1, 3
    >>> scan = CorpusScan(np.float32([[1, 0]]), None, "inner_product", 1,
    ...                   tie_keys(None, 4, "index"), Pairs(np.zeros(0, int), np.zeros(0, int)))
    >>> plan, none = ShardPlan.of(scan, False), np.zeros(0, int)
    >>> exact = (np.array([1.0]), np.array([1.0]))  # bounds of row 3's score, 1 exactly
    >>> for a, b, local in [(0, 2, -1), (2, 4, 1)]:  # rows 0 and 2 beat row 3; row 1 ties it
    ...     out = shard_top(plan.piece(a, b), corpus[a:b], none, none,
    ...                     (np.array([0]), np.array([local]), *exact, None, None))
    ...     beats, p, r = out[4]
    ...     print(beats.tolist(), (a + r).tolist())
    [1] [1]
    [1] []
    """
    scan = plan.scan()
    counter = None
    if counted is not None:
        query_, local, lo, hi, limit, keys = counted
        counter = BeatCounter(scan, Pairs(query_, local), (lo, hi), limit, keys)
    cand_q, codes, scores = scan_top(shard, scan, Pairs(query, row), counter=counter)
    return cand_q, codes, scores, scan.m_sq, None if counter is None else counter.result()


def merge_candidates(
    parts: Sequence[tuple[np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray]:
    """The shards' candidates as one ``(query, code)`` list, query ascending, codes ascending
    within a query (as :func:`~.corpus.scan_top` gives them).

    >>> merge_candidates([(np.array([0, 1]), np.uint64([5, 2])), (np.array([0]), np.uint64([3]))])
    (array([0, 0, 1]), array([3, 5, 2], dtype=uint64))
    """
    query = np.concatenate([p[0] for p in parts])
    codes = np.concatenate([p[1] for p in parts])
    order = np.lexsort((codes, query))
    return query[order], codes[order]
