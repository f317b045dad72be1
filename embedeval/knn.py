"""The exact, streaming kNN engine and :func:`neighbors`.

How it works (and why it is faster and lighter than a faiss ``search`` with a large k):

1. Queries are processed in blocks whose size comes from a memory budget, so peak memory is
   O(block x n_reference), never O(n_query x n_reference).
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

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._errors import InputError
from ._progress import progress_bar
from ._validation import as_embeddings, check_choice, check_int

__all__ = ["DISTANCES", "neighbors"]

DISTANCES = ("euclidean", "cosine", "inner_product")

_PAD = np.uint64(np.iinfo(np.uint64).max)
_LOW32 = np.uint64(0xFFFFFFFF)
_FMAX = np.float32(np.finfo(np.float32).max)
_SUBSAMPLE = 1024
#: Default working-memory budget of the engine, in bytes.  Peak memory is about this plus the
#: embeddings themselves and O(n_query) per-query results.
DEFAULT_MEMORY_BUDGET = 256 * 2**20


def sortable_bits(values: np.ndarray) -> np.ndarray:
    """Map float32 values to uint32 so that unsigned order equals float order (no NaN)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    negative = (bits >> np.uint32(31)).astype(bool)
    return np.where(negative, ~bits, bits | np.uint32(0x80000000))


def from_sortable_bits(bits: np.ndarray) -> np.ndarray:
    """Inverse of :func:`sortable_bits`."""
    bits = bits.astype(np.uint32)
    positive = (bits >> np.uint32(31)).astype(bool)
    return np.where(positive, bits & np.uint32(0x7FFFFFFF), ~bits).view(np.float32)


@dataclass(frozen=True)
class Exclusions:
    """Which references each query must not see.

    ``self_index``: query i excludes reference i (leave-one-out, or PML's ``ref_includes_query``).
    ``query_groups`` / ``reference_groups``: integer group codes; a query excludes every
    reference of its own group.  ``group_members`` / ``group_starts`` hold the references sorted
    by group (CSR), so excluding costs O(excluded) and not O(n_reference) per query.
    """

    self_index: bool = False
    query_groups: np.ndarray | None = None
    reference_groups: np.ndarray | None = None

    def group_csr(self) -> tuple[np.ndarray, np.ndarray] | None:
        if self.reference_groups is None:
            return None
        order = np.argsort(self.reference_groups, kind="stable")
        n_groups = (
            int(max(self.reference_groups.max(initial=-1), self.query_groups.max(initial=-1))) + 1
        )
        counts = np.bincount(self.reference_groups, minlength=n_groups)
        starts = np.concatenate(([0], np.cumsum(counts)))
        return order, starts


def prepare_reference(xb: np.ndarray, distance: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Return the reference matrix to multiply with, and its squared norms (Euclidean only)."""
    if distance == "cosine":
        xb = _normalize(xb)
    norms = None
    if distance == "euclidean":
        norms = np.einsum("ij,ij->i", xb, xb, dtype=np.float32)
    return xb, norms


def prepare_queries(xq: np.ndarray, distance: str) -> np.ndarray:
    return _normalize(xq) if distance == "cosine" else xq


def _normalize(x: np.ndarray) -> np.ndarray:
    norms = np.sqrt(np.einsum("ij,ij->i", x, x, dtype=np.float64)).astype(np.float32)
    if (norms == 0).any():
        raise InputError(
            f"distance='cosine' needs non-zero vectors; {int((norms == 0).sum())} row(s) are all "
            f"zero (first at row {int(np.flatnonzero(norms == 0)[0])}). Drop them or use "
            "distance='euclidean'."
        )
    return np.asarray(x, dtype=np.float32) / norms[:, None]


def ranking_keys(xq_block: np.ndarray, xb: np.ndarray, norms: np.ndarray | None) -> np.ndarray:
    """Float32 ranking keys, smaller = nearer: ``||r||^2 - 2 q.r`` or ``-q.r``."""
    keys = np.asarray(xq_block, dtype=np.float32) @ xb.T
    if norms is not None:
        keys *= np.float32(-2.0)
        keys += norms
    else:
        np.negative(keys, out=keys)
    keys += np.float32(0.0)  # -0.0 -> +0.0, so equal keys have equal bits
    return keys


def _exclude(keys: np.ndarray, start: int, ex: Exclusions, csr: Any) -> None:
    b = keys.shape[0]
    if ex.self_index:
        rows = np.arange(b)
        keys[rows, start + rows] = np.inf
    if csr is not None:
        order, starts = csr
        g = ex.query_groups[start : start + b]
        lo, hi = starts[g], starts[g + 1]
        sizes = hi - lo
        rows = np.repeat(np.arange(b), sizes)
        offsets = np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        keys[rows, order[np.repeat(lo, sizes) + offsets]] = np.inf


def _depth_thresholds(
    keys: np.ndarray, depth: np.ndarray, subsample: np.ndarray | None
) -> np.ndarray:
    """Per-row threshold tau with (very likely) at least ``depth`` keys <= tau.

    An order statistic of a random column subsample, with a margin of four standard deviations
    of the binomial count plus two, rounded up on a geometric grid so that one partition call
    serves the whole block.
    """
    n_ref = keys.shape[1]
    tau = np.full(keys.shape[0], _FMAX, dtype=np.float32)
    if subsample is None:
        return tau
    m = subsample.size
    expected = depth * (m / n_ref)
    j = np.ceil(expected + 4.0 * np.sqrt(expected) + 2.0)
    j = np.ceil(1.25 ** np.ceil(np.log(np.maximum(j, 1.0)) / math.log(1.25))).astype(np.int64)
    usable = j < m
    if usable.any():
        sample = keys[:, subsample]
        kth = np.unique(j[usable])
        sample.partition(kth, axis=1)
        rows = np.flatnonzero(usable)
        tau[rows] = sample[rows, j[rows]]
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
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(query_rows, P)`` with each query's nearest references sorted.

    ``P`` is ``uint64`` of shape ``(len(query_rows), L)``: row r holds, in ranking order, at least
    ``min(depth[q], n_valid[q])`` candidates (more when ties or the threshold margin add some),
    each ``sortable_bits(key) << 32 | reference_index``, padded at the end with ``2**64 - 1``.
    Ties in the key are ordered by ascending reference index.

    ``positive_threshold = ("max" | "min", query_codes, reference_codes)`` additionally keeps every
    reference up to the farthest ("max", for full-depth AP) or nearest ("min", for MRR) reference
    sharing the query's label.  Queries with ``depth == 0`` get no candidates.
    """
    n_query, n_ref = xq.shape[0], xb.shape[0]
    xq = prepare_queries(xq, distance)
    xb, norms = prepare_reference(xb, distance)
    if n_valid is None:
        n_valid = np.full(n_query, n_ref - int(exclusions.self_index), dtype=np.int64)
    need = np.minimum(depth, n_valid)
    csr = exclusions.group_csr()
    bytes_per_row = n_ref * (4 + 1 + (5 if positive_threshold else 0)) + 64
    if block_size is None:
        block_size = max(16, min(4096, memory_budget // bytes_per_row))
    rng = np.random.default_rng(0)
    subsample = (
        np.sort(rng.choice(n_ref, _SUBSAMPLE, replace=False)) if n_ref > 2 * _SUBSAMPLE else None
    )
    chunk_elements = max(memory_budget // 48, 1)
    with progress_bar(n_query, "queries", enabled=progress) as bar:
        for start in range(0, n_query, block_size):
            stop = min(start + block_size, n_query)
            keys = ranking_keys(xq[start:stop], xb, norms)
            _exclude(keys, start, exclusions, csr)
            block_need = need[start:stop]
            tau = _depth_thresholds(keys, block_need, subsample)
            tau[block_need <= 0] = -np.inf
            if positive_threshold is not None:
                tau = np.maximum(tau, _positive_tau(keys, positive_threshold, start, stop))
            mask = keys <= tau[:, None]
            counts = np.count_nonzero(mask, axis=1)
            short = np.flatnonzero(counts < block_need)
            if short.size:  # the subsample margin failed (rare): take every valid reference
                mask[short] = keys[short] <= _FMAX
                counts[short] = np.count_nonzero(mask[short], axis=1)
            yield from _sort_rows(keys, mask, counts, start, chunk_elements)
            bar.update(stop - start)


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


def _sort_rows(
    keys: np.ndarray, mask: np.ndarray, counts: np.ndarray, start: int, chunk_elements: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    # Rows are sorted by candidate count and packed into chunks whose padded size is bounded,
    # so one query that needs every reference does not inflate the padding of all the others.
    order = np.argsort(counts, kind="stable")
    sorted_counts = counts[order]
    b = order.size
    i = 0
    while i < b:
        width = np.arange(1, b - i + 1) * np.maximum(sorted_counts[i:], 1)
        j = i + max(1, int(np.searchsorted(width, chunk_elements, side="right")))
        rows = order[i:j]
        c = sorted_counts[i:j]
        length = int(c[-1])
        packed = np.full((rows.size, max(length, 1)), _PAD, dtype=np.uint64)
        if length:
            r, col = np.nonzero(mask[rows])
            values = keys[rows[r], col]
            code = (sortable_bits(values).astype(np.uint64) << np.uint64(32)) | col.astype(
                np.uint64
            )
            pos = np.arange(r.size) - np.repeat(np.cumsum(c) - c, c)
            packed[r, pos] = code
            packed.sort(axis=1)
        yield start + rows, packed
        i = j


def unpack(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split packed candidates into (reference index, key bits, padding mask)."""
    pad = packed == _PAD
    index = (packed & _LOW32).astype(np.int64)
    index[pad] = 0
    bits = (packed >> np.uint64(32)).astype(np.uint32)
    return index, bits, pad


def neighbors(
    query: Any,
    k: int,
    reference: Any = None,
    *,
    distance: str = "euclidean",
    exclude_self: bool | None = None,
    block_size: int | None = None,
    progress: bool | None = False,
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
    with index -1.

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
    k = check_int(k, "k")
    xq = as_embeddings(query, "query")
    if reference is None:
        xb = xq
        exclude_self = True if exclude_self is None else bool(exclude_self)
    else:
        xb = as_embeddings(reference, "reference")
        exclude_self = bool(exclude_self)
        if xb.shape[1] != xq.shape[1]:
            raise InputError(
                f"query has dimension {xq.shape[1]} but reference has {xb.shape[1]}; both must "
                "come from the same embedding model."
            )
        if exclude_self:
            check_queries_lead_reference(xq, xb)
    available = xb.shape[0] - int(exclude_self)
    k_eff = min(k, available)
    n_query = xq.shape[0]
    dist = np.empty((n_query, k_eff), dtype=np.float32)
    idx = np.empty((n_query, k_eff), dtype=np.int64)
    if k_eff == 0:
        return dist, idx
    q_norms = np.einsum("ij,ij->i", xq, xq, dtype=np.float32) if distance == "euclidean" else None
    for rows, packed in sorted_candidates(
        xq,
        xb,
        distance=distance,
        depth=np.full(n_query, k_eff),
        exclusions=Exclusions(self_index=exclude_self),
        block_size=block_size,
        progress=progress,
    ):
        index, bits, _ = unpack(packed[:, :k_eff])
        key = from_sortable_bits(bits)
        if distance == "euclidean":
            dist[rows] = np.sqrt(np.maximum(key + q_norms[rows, None], 0))
        else:
            dist[rows] = -key
        idx[rows] = index
    return dist, idx


def check_queries_lead_reference(xq: np.ndarray, xb: np.ndarray) -> None:
    """Check PML's ``ref_includes_query`` convention: the queries are the first reference rows."""
    n = xq.shape[0]
    if xb.shape[0] < n:
        raise InputError(
            f"ref_includes_query=True needs the {n} queries to be the first rows of reference, "
            f"but reference has only {xb.shape[0]} rows."
        )
    step = 65536
    for s in range(0, n, step):
        a, b = np.asarray(xq[s : s + step]), np.asarray(xb[s : s + step])
        differ = np.flatnonzero((a != b).any(axis=1))
        if differ.size:
            raise InputError(
                "ref_includes_query=True needs the queries to be the first rows of reference "
                f"(PML's convention), but query row {s + int(differ[0])} differs from reference "
                f"row {s + int(differ[0])}. Pass reference=None for leave-one-out, or "
                "ref_includes_query=False for a disjoint gallery."
            )
