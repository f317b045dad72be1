"""Identical reference rows get identical ranking keys.

A float32 matrix product rounds the same dot product differently depending on where its column
sits in the product (BLAS kernels treat edge columns and blocks differently), so two identical
references could get keys one unit in the last place apart: not a tie, and the tie rule
(ascending reference index) would not apply.  The engine therefore finds the groups of
identical reference rows once (``-0.0`` equals ``0.0``; for cosine, rows that are positive
multiples of one another, compared exactly as :func:`~embedeval.engine.decide.direction_rows`,
not as float32 unit rows, which can coincide for two directions) and, for each query block,
computes the keys of one representative per group in a separate product of fixed shape (all
groups x block rows).  That key is every member's key: the tiles leave the members out of their
candidates and :meth:`DuplicateKeys.candidates` adds those whose shared key passes the cut-off
(one comparison per group, not per member); where whole key rows are needed (the threshold
column sample, the label threshold of full-depth MAP, redone rows) the shared key is written
over each member's column.  Members then share bit-identical keys whatever their position, and
every backend (shards, Dask workers) reproduces them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .candidates import spans

__all__ = ["DuplicateKeys", "DuplicateRows", "find_duplicate_rows"]

_HASH_ROWS = 8192


@dataclass(frozen=True)
class DuplicateRows:
    """Groups of identical reference rows: ``members`` (sorted row indices that have an
    identical twin), ``group`` (each member's group, numbered by first member) and ``first``
    (the first member of each group, its representative)."""

    members: np.ndarray
    group: np.ndarray
    first: np.ndarray

    @property
    def n_groups(self) -> int:
        return int(self.first.size)

    def view(self, reps_t: np.ndarray, columns: slice | np.ndarray) -> DuplicateKeys | None:
        """The members among reference ``columns`` (a range, or sorted global indices) as local
        positions of a search over those columns; ``reps_t`` are the representatives, prepared
        like the search's reference (dim' x n_groups)."""
        if isinstance(columns, slice):
            lo, hi = np.searchsorted(self.members, [columns.start, columns.stop])
            positions = self.members[lo:hi] - columns.start
            group = self.group[lo:hi]
            n_columns = columns.stop - columns.start
        else:
            n_columns = len(columns)
            at = np.minimum(np.searchsorted(self.members, columns), self.members.size - 1)
            hit = self.members[at] == columns
            positions, group = np.flatnonzero(hit), self.group[at[hit]]
        if positions.size == 0:
            return None
        return DuplicateKeys(positions, group, reps_t, n_columns)


class DuplicateKeys:
    """Writes one shared key per group over the columns of its members (see the module)."""

    def __init__(
        self, positions: np.ndarray, group: np.ndarray, reps_t: np.ndarray, n_columns: int
    ) -> None:
        self.positions = positions
        self.group = group
        self.reps_t = reps_t
        self._cache = threading.local()  # each engine thread: its current block's group keys
        # This search's members grouped: members of group g are by_group[lims[g]:lims[g + 1]].
        n_groups = reps_t.shape[1]
        self.by_group = positions[np.argsort(group, kind="stable")]
        self.lims = np.concatenate(([0], np.cumsum(np.bincount(group, minlength=n_groups))))
        self.not_member = np.ones(n_columns, dtype=bool)
        self.not_member[positions] = False

    def any_in(self, c0: int, c1: int) -> bool:
        """Whether columns ``[c0, c1)`` hold a member."""
        lo, hi = np.searchsorted(self.positions, [c0, c1])
        return bool(hi > lo)

    def others(self, c0: int, c1: int) -> np.ndarray:
        """True for the columns ``[c0, c1)`` that are not members (a mask for the tiles)."""
        return self.not_member[c0:c1]

    def candidates(
        self,
        queries: np.ndarray,
        rows: slice,
        tau: np.ndarray,
        excluded: Callable[[np.ndarray, np.ndarray], np.ndarray | None],
        col_bits: int,
        sortable: Callable[[np.ndarray], np.ndarray],
    ) -> tuple[np.ndarray, np.ndarray]:
        """Packed codes (block row, shared key bits, column) of every member whose shared key
        is ``<= tau[row]`` and that ``excluded(block rows, columns)`` does not rule out, grouped
        by row, and the count per row: the group keys are compared once per group, then
        expanded."""
        shared = self._group_keys(queries, rows)
        r, g = np.nonzero(shared.T <= tau[:, None])  # row by row, like the tiles' codes
        key = shared[g, r]
        sizes = self.lims[g + 1] - self.lims[g]
        col = self.by_group[spans(self.lims[g], sizes)]
        r, key = np.repeat(r, sizes), np.repeat(key, sizes)
        out = excluded(r, col)
        if out is not None:
            r, col, key = r[~out], col[~out], key[~out]
        code = r.astype(np.uint64) << np.uint64(32 + col_bits)
        code |= sortable(key).astype(np.uint64) << np.uint64(col_bits)
        code |= col.astype(np.uint64)
        return code, np.bincount(r, minlength=tau.size)

    def apply(
        self, keys: np.ndarray, queries: np.ndarray, rows: slice | np.ndarray, cols: object
    ) -> None:
        """Overwrite the member columns of ``keys`` (``queries[rows]`` against ``cols``, a slice
        or sorted column indices of the search)."""
        if isinstance(cols, slice):
            c0 = cols.start or 0
            lo, hi = np.searchsorted(self.positions, [c0, c0 + keys.shape[1]])
            pos, grp = self.positions[lo:hi] - c0, self.group[lo:hi]
        else:
            cols = np.asarray(cols)
            at = np.minimum(np.searchsorted(self.positions, cols), self.positions.size - 1)
            hit = self.positions[at] == cols
            pos, grp = np.flatnonzero(hit), self.group[at[hit]]
        if pos.size == 0:
            return
        shared = self._group_keys(queries, rows)[grp].T  # rows x members
        if keys.flags.c_contiguous:
            # A flat scatter is about 1.4x faster than a column fancy assignment (measured on
            # a 230 x 2048 tile with 380 members: 0.37 ms vs 0.52 ms; the product: 1 ms).
            flat = (np.arange(keys.shape[0]) * keys.shape[1])[:, None] + pos
            keys.reshape(-1)[flat.ravel()] = shared.ravel()
        else:
            keys[:, pos] = shared

    def _group_keys(self, queries: np.ndarray, rows: slice | np.ndarray) -> np.ndarray:
        # One product over every group per row set, so its shape (hence its rounding) does not
        # depend on which tile, sample or shard asks; cached for the tiles of the same block.
        tag = (rows.start, rows.stop) if isinstance(rows, slice) else np.asarray(rows).tobytes()
        cached = getattr(self._cache, "entry", None)
        if cached is not None and cached[0] is queries and cached[1] == tag:
            return cached[2]
        out = np.matmul(self.reps_t.T, queries[rows].T)  # groups x rows
        self._cache.entry = (queries, tag, out)
        return out


def find_duplicate_rows(
    x: np.ndarray, prepare: Callable[[np.ndarray], np.ndarray] | None = None
) -> DuplicateRows | None:
    """Groups of rows of ``x`` that are identical after ``prepare`` (float32 rows in, float32
    or float64 rows out; None when there are no groups).

    Rows are hashed in blocks (a random linear hash of their bits, modulo 2**64, so memory-mapped
    references are read once, block by block); only rows whose hash repeats are compared
    exactly, so the cost without duplicates is one pass and a sort of n 64-bit hashes.
    """
    n = x.shape[0]
    multipliers = None
    hashes = np.empty(n, dtype=np.uint64)
    for a in range(0, n, _HASH_ROWS):
        words = _words(_rows(x, a, min(a + _HASH_ROWS, n), prepare))
        if multipliers is None:  # one odd multiplier per 64-bit word of a prepared row
            rng = np.random.default_rng(0)
            multipliers = rng.integers(1, 2**63, words.shape[1], dtype=np.uint64) | np.uint64(1)
        # An integer product wraps modulo 2**64 (no BLAS, no rounding): 10x the speed of
        # widening every 32-bit word to 64 bits first (2,048-d rows: 6 ms against 63 ms per
        # 8,192), and a change of any one word still changes the hash.
        hashes[a : a + words.shape[0]] = words @ multipliers
    order = np.argsort(hashes, kind="stable")
    sorted_h = hashes[order]
    repeated = np.zeros(n, dtype=bool)
    same = sorted_h[1:] == sorted_h[:-1]
    repeated[1:] |= same
    repeated[:-1] |= same
    candidates = np.sort(order[repeated])
    if candidates.size == 0:
        return None
    # Exact grouping of the candidates by their bytes (a hash collision is not a duplicate).
    rows = np.ascontiguousarray(_rows_at(x, candidates, prepare))
    raw = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1])))[:, 0]
    _, first_at, inverse, counts = np.unique(
        raw, return_index=True, return_inverse=True, return_counts=True
    )
    inverse = inverse.ravel()
    keep = counts[inverse] > 1
    if not keep.any():
        return None
    members = candidates[keep]
    # Number the groups by their first member (the candidates are sorted, so first_at is).
    first_of_member = candidates[first_at[inverse[keep]]]
    first, group = np.unique(first_of_member, return_inverse=True)
    return DuplicateRows(members, group.ravel().astype(np.int64), first)


def _words(rows: np.ndarray) -> np.ndarray:
    """The bits of ``rows`` (float32 or float64) as 64-bit words, a zero 32-bit word appended
    to each row of an odd number of them."""
    bits = np.ascontiguousarray(rows).view(np.uint32)
    if bits.shape[1] % 2:
        bits = np.concatenate((bits, np.zeros((bits.shape[0], 1), np.uint32)), axis=1)
    return bits.view(np.uint64)


def _rows(
    x: np.ndarray, a: int, b: int, prepare: Callable[[np.ndarray], np.ndarray] | None
) -> np.ndarray:
    return _rows_at(x, slice(a, b), prepare)


def _rows_at(
    x: np.ndarray, index: slice | np.ndarray, prepare: Callable[[np.ndarray], np.ndarray] | None
) -> np.ndarray:
    rows = np.asarray(x[index], dtype=np.float32)
    if prepare is not None:
        rows = prepare(rows)
    return rows + rows.dtype.type(0.0)  # -0.0 becomes 0.0: equal values, equal bits
