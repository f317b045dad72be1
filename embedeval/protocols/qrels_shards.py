"""The corpus of :func:`~embedeval.protocols.qrels.evaluate_qrels` in shards (``shards=``), on
this machine or on the workers of a Dask cluster (``client=``), merged exactly
(:mod:`embedeval.engine.corpus_shards`): the numbers are those of the unsharded run, bit for bit.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine.corpus import BeatCounter, CorpusScan, Pairs, scan_top
from ..engine.corpus_shards import (
    Float32Rows,
    ShardPlan,
    float32_rows,
    merge_candidates,
    shard_top,
)
from ..search.dask_backend import check_client, n_workers_of
from ..search.sharded import open_piece
from ..utils.errors import InputError
from ..utils.validation import check_int

__all__ = ["CorpusSearch", "corpus_search", "shard_list"]


def shard_list(corpus: Any, shards: Any, dim: int) -> list[np.ndarray] | None:
    """The pieces of ``shards=[...]`` (arrays, or ``.npy`` paths memory-mapped, each of
    dimension ``dim``), which then are the corpus (``corpus`` must be None); None for no list."""
    if not isinstance(shards, (list, tuple)):
        return None
    if corpus is not None:
        raise InputError(
            "shards is a list of corpus pieces, so corpus must be None (the pieces, concatenated "
            "in order, are the corpus, one doc id per row); pass corpus=None, or shards=N to "
            "split the corpus given."
        )
    if not shards:
        raise InputError("shards is an empty list; pass an int or at least one array/path.")
    return [float32_rows(open_piece(p, i, dim)) for i, p in enumerate(shards)]


@dataclass
class CorpusSearch:
    """How the corpus is scanned: whole (``pieces`` of one array, no client), in shards on this
    machine, or in shards on Dask workers.  ``sources`` are what a worker opens (an array, a
    scattered array, or a ``.npy`` path); ``rows`` reads any corpus row by its global index."""

    rows: Any
    pieces: list[np.ndarray]
    sources: list[Any]
    client: Any = None
    progress: bool | None = None

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum([p.shape[0] for p in self.pieces])])

    def top(
        self, scan: CorpusScan, pairs: Pairs, counter: BeatCounter | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:func:`~embedeval.engine.corpus.scan_top` of the whole corpus, counting for
        ``counter`` (what beats its pairs anywhere in the ranking) from the same products;
        sharded: each shard's, merged, ``scan.m_sq`` raised to cover every shard's rows, and
        the shards' counts summed into ``counter`` (their near documents with global rows, to
        be decided together: :func:`~embedeval.engine.corpus.near_wins`)."""
        if self.client is None and len(self.pieces) == 1:
            return scan_top(self.rows, scan, pairs, counter=counter)
        plan, ends = ShardPlan.of(scan, self.progress), _ends(self.offsets)
        inside = [np.flatnonzero((pairs.row >= a) & (pairs.row < b)) for a, b in ends]
        jobs = []
        for i, ((a, b), src, idx) in enumerate(zip(ends, self.sources, inside, strict=True)):
            counted = None
            if counter is not None:  # rows of other shards fall outside 0 .. b - a - 1
                rows = counter.pairs.row - a
                keys = counter.pair_keys  # the shard's scan holds its own rows' keys only
                counted = (counter.pairs.query, rows, *counter.bounds, counter.limit, keys)
            jobs.append((plan.piece(a, b), src, i, pairs.query[idx], pairs.row[idx] - a, counted))
        results = self._map(_top_job, jobs)
        scores = np.full(pairs.query.size, np.nan, dtype=np.float32)
        for idx, r in zip(inside, results, strict=True):
            scores[idx] = r[2]
        scan.m_sq = max([scan.m_sq, *[r[3] for r in results]])
        if counter is not None and any(r[4] is None for r in results):
            counter.overflowed = True  # a shard gave up: the caller counts again
        elif counter is not None:
            counter.beats = np.sum([r[4][0] for r in results], axis=0, dtype=np.int64)
            counter.near = [(r[4][1], a + r[4][2]) for (a, _), r in zip(ends, results, strict=True)]
        return (*merge_candidates([(r[0], r[1]) for r in results]), scores)

    def _map(self, fn: Callable[..., Any], jobs: Sequence[tuple]) -> list[Any]:
        """``fn(*job)`` for every job, here or on the workers (results in job order)."""
        if self.client is None:
            return [fn(*job) for job in jobs]
        futures = []
        try:
            futures = [self.client.submit(fn, *job, pure=False) for job in jobs]
            return self.client.gather(futures)
        except BaseException:
            self.client.cancel(futures)  # Ctrl-C or a failed worker: nothing left running
            raise


def _ends(offsets: np.ndarray) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in itertools.pairwise(offsets)]


def _open(source: Any, i: int, dim: int) -> np.ndarray:
    """A shard on a worker: the array shipped (or its float32 reader), or its ``.npy`` file
    memory-mapped there."""
    return open_piece(source, i, dim) if isinstance(source, (str, os.PathLike)) else source


def _top_job(
    plan: ShardPlan,
    source: Any,
    i: int,
    query: np.ndarray,
    row: np.ndarray,
    counted: tuple[np.ndarray, ...] | None,
) -> tuple:
    return shard_top(plan, _open(source, i, plan.queries.shape[1]), query, row, counted)


def corpus_search(
    docs: Any,
    pieces: list[Any] | None,
    shards: Any,
    client: Any,
    progress: bool | None,
) -> CorpusSearch:
    """The :class:`CorpusSearch` of the options: ``pieces`` opened from the list ``shards``
    (None: ``docs`` split into ``shards`` contiguous parts, or one per Dask worker)."""
    listed = shards
    if client is not None:
        check_client(client)
    if pieces is None:
        n = docs.shape[0]
        if shards is None:
            parts = 1 if client is None else n_workers_of(client)
        else:
            parts = check_int(shards, "shards")
        cuts = np.linspace(0, n, min(parts, n) + 1).round().astype(np.int64)
        if isinstance(docs, Float32Rows):  # each piece read as float32 in turn, not copied
            pieces = [Float32Rows(docs.rows[a:b]) for a, b in _ends(cuts)]
        else:
            pieces = [docs[a:b] for a, b in _ends(cuts)]
        listed = pieces
    sources: list[Any] = list(pieces if client is None else listed)
    if client is not None:  # arrays go to the workers once; paths are opened there
        # a float32 reader goes as its stored rows: a worker's scan reads them as float32
        # block by block, and the near documents are decided here, on the float32 rows
        sources = [s.stored if isinstance(s, Float32Rows) else s for s in sources]
        # random keys (hash=False): keys from the content would be the previous run's on the
        # same corpus, and its late release would drop them under this run's tasks
        sources = [
            client.scatter(s, hash=False) if isinstance(s, np.ndarray) else s for s in sources
        ]
        progress = False
    return CorpusSearch(docs, pieces, sources, client, progress)
