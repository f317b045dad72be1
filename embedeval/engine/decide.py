"""The float64 decision behind every ranking: float32 keys filter, float64 keys decide.

The engine's float32 products (:mod:`embedeval.engine.exact`, :mod:`embedeval.engine.symmetric`)
give each (query, reference) pair a key within a proven distance ``B_q`` of its float64 key
(:func:`key_bounds`).  Two candidates whose float32 keys are more than ``2 B_q`` apart are
therefore in the right order; only runs of candidates closer than that (*clusters*: near-ties,
exact ties, identical rows) are re-scored in float64 and ordered by float64 keys, equal keys by
reference index (:func:`decide`).  Those float64 keys are filtered once more: a float64 product
(BLAS, any summation order) is within ``16 gamma_{d+8}`` in double precision of
:func:`exact_keys`, so only pairs it cannot order take the fixed-order keys
(:func:`float64_keys`); a block whose float32 keys are mostly closer than their bound sorts its
rows by the float64 product keys directly.  The engine keeps every reference whose
float32 key is within ``2 B_q`` of its depth threshold, so the float64 order of the candidates
is the float64 order of the whole reference set up to the depth.

The float64 keys are formed from the float32 inputs with a fixed order of operations (one
column at a time, vectorised over pairs), so they do not depend on block or shard shapes:

* Euclidean: ``sum_j (q_j - x_j)**2``, the squared distance;
* inner product: ``-sum_j q_j x_j``;
* cosine: ``-sign(s) s**2 / ||x||**2`` with ``s = sum_j q_j x_j`` and
  ``||x||**2 = sum_j x_j**2`` (ranks like ``-cos``; no square root, so exact rational ties
  of small-integer data stay ties), and the positive multiples of a reference row take the
  key of the one of smallest reference index among the query's re-scored pairs (rows scaled
  by their largest component are then identical), so ``(1, 1, 0)`` and ``(3, 3, 0)`` tie
  exactly, whatever order the pairs are re-scored in.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..utils.validation import host_array
from .candidates import (
    Candidates,
    from_sortable_bits,
    segment_searchsorted,
    sortable_bits,
    spans,
)
from .labels import match_pairs

__all__ = [
    "FLOAT64_MAX_DIM",
    "U32",
    "Reach",
    "TaskNorms",
    "candidate_bounds",
    "decide",
    "decide_task_block",
    "direction_rows",
    "exact_keys",
    "first_k",
    "float64_key_bounds",
    "float64_keys",
    "gamma",
    "key_bounds",
    "key_magnitude",
    "reach_of",
    "reference_sq_bound",
    "relative_bound",
    "rounding_of",
    "row_keys",
    "sq_norms",
    "task_norms",
    "underflow_bound",
    "widen",
]

#: Unit roundoff of float32.
U32 = 2.0**-24
_U64 = 2.0**-53
_ROWS = 16384  # pairs re-scored per pass (bounded memory)


def gamma(n: int, u: float = U32) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: the relative error bound of an ``n``-term sum
    of products in precision ``u``, whatever the summation order (FMA included).

    >>> gamma(1, 0.5**24) == 0.5**24 / (1 - 0.5**24)
    True
    """
    return n * u / (1.0 - n * u)


def key_bounds(
    q_sq: np.ndarray,
    m_sq: float,
    dim: int,
    distance: str,
    scale: float = 1.0,
    input_u: float = 0.0,
) -> np.ndarray:
    """Per query: ``B_q``, a bound on ``|float32 key - float64 key|`` for every reference.

    ``q_sq`` bounds each query's squared norm from above, ``m_sq`` every reference's.
    Euclidean keys ``||x||^2 - 2 q.x`` (one-sided) or ``D - ||q||^2`` with
    ``D = [x, ||x||^2, 1].[-2 q, 1, ||q||^2]`` (symmetric) sum at most ``dim + 2`` products
    whose magnitudes add up to at most ``(||q|| + ||x||)^2``, with squared norms that carry
    ``gamma_dim`` themselves and one rounding of the subtraction:
    ``|err| <= 3 gamma_{dim+3} (||q|| + M)^2``.  Inner product: ``gamma_dim ||q|| M``.
    Cosine: each normalised element carries up to 4 roundings (float32 norm, division), so
    ``gamma_{dim+8}`` (unit rows).  ``scale`` multiplies the unit roundoff of the products
    (16 on tensor cores: :func:`rounding_of`).  ``input_u`` is the relative rounding of each
    input element before a product that accumulates in float32 and rounds its result to the
    same format (bfloat16: ``2**-9``): each dot product then errs by at most
    ``(3 u_in + gamma_dim) ||q|| ||x||`` more; with the squared norms inside the product too
    (the symmetric engine's canonical product) the Euclidean key errs by at most
    ``3 u_in (||q|| + ||x||)^2`` more, and ``4 u_in (||q|| + M)^2`` is added to its bound,
    ``4 u_in`` times the magnitude to the others.  Each bound is then raised by
    ``1 + 2**-20`` and by ``8 gamma_{dim+8}`` in float64 times the same magnitude,
    for the float64 key's own rounding.  ``scale = input_u = 0`` stands for exact keys (small
    integers, :mod:`embedeval.engine.integers`): every bound is zero.

    >>> key_bounds(np.array([1.0]), 1.0, 8, "euclidean") > 4 * 11 * 2.0**-24
    array([ True])
    """
    q_sq = np.asarray(q_sq, dtype=np.float64)
    if scale == 0.0 and input_u == 0.0:  # exact keys (rounding_of("exact"))
        return np.zeros(q_sq.shape, dtype=np.float64)
    c = relative_bound(dim, distance, scale, input_u)
    magnitude = key_magnitude(q_sq, m_sq, distance)
    return c * magnitude + underflow_bound(q_sq, m_sq, dim, distance, input_u)


def relative_bound(dim: int, distance: str, scale: float = 1.0, input_u: float = 0.0) -> float:
    """The factor ``c`` of :func:`key_bounds` on the keys' magnitude (:func:`key_magnitude`):
    the part of ``B_q`` that scales with the data, valid while no step underflows.

    >>> bool(relative_bound(8, "inner_product") > 9 * 2.0**-24)
    True
    """
    wide = 1.0 + 2.0**-20
    f64 = 8 * gamma(dim + 8, _U64)
    if distance == "euclidean":
        return (3 * gamma(dim + 3) * scale + 4 * input_u) * wide + f64
    if distance == "inner_product":
        return (gamma(dim + 1) * scale + 4 * input_u) * wide + f64
    return (gamma(dim + 8) * scale + 4 * input_u) * wide + f64


#: float32's smallest normal number: a product or a sum whose result lies below it errs by up
#: to this much in absolute terms, whether subnormals are kept (2**-150) or flushed to zero.
_TINY32 = 2.0**-126


def underflow_bound(
    q_sq: np.ndarray, m_sq: float | np.ndarray, dim: int, distance: str, input_u: float = 0.0
) -> np.ndarray:
    """Per query, the absolute part of ``B_q``: the float32 underflow that the relative bound
    (:func:`relative_bound`) does not cover.

    A relative bound holds only for results in float32's normal range.  Keys of rows whose
    products fall below it (an inner-product query of norm 1e-40 against unit rows, or tiny
    rows beside a set whose largest value keeps them from being rescaled) err by up to
    ``2**-126`` per product or sum, at most ``3 dim + 8`` of them per key, far beyond a
    relative bound on their tiny magnitude.  A product that first rounds its inputs
    (``input_u > 0``: bfloat16, TF32) may also read an input below ``2**-126`` as zero,
    losing at most ``2**-126`` times the other factor in each term: ``2**-126 (2 sqrt(dim)
    (||q|| + M) + 2)`` over the terms of ``2 q.x`` and the squared norms of the canonical
    Euclidean product.  Data in the normal range make this a negligible widening.

    >>> bool(underflow_bound(np.array([1e-80]), 1.0, 4, "inner_product")[0] >= 20 * 2.0**-126)
    True
    """
    q_sq = np.asarray(q_sq, dtype=np.float64)
    out = np.full(q_sq.shape, (3 * dim + 8) * _TINY32)
    if input_u:
        if distance == "cosine":  # unit rows
            norms = 2.0 * np.ones(q_sq.shape)
        else:
            norms = np.sqrt(q_sq) + np.sqrt(m_sq)
        out += _TINY32 * (2.0 * np.sqrt(dim) * norms + 2.0)
    return out


def float64_key_bounds(q_sq: np.ndarray, m_sq: float, dim: int, distance: str) -> np.ndarray:
    """Per query, a bound on ``|float64 product key - fixed-order key|`` (:func:`exact_keys`):
    ``8 gamma_{dim+8}`` in double precision times the keys' magnitude (see :func:`key_bounds`).

    >>> float(float64_key_bounds(np.array([1.0]), 1.0, 8, "inner_product")[0]) < 1e-13
    True
    """
    q_sq = np.asarray(q_sq, dtype=np.float64)
    return 8 * gamma(dim + 8, _U64) * key_magnitude(q_sq, m_sq, distance)


def key_magnitude(q_sq: np.ndarray, m_sq: float, distance: str) -> np.ndarray:
    """Per query (squared norm at most ``q_sq``; every reference's at most ``m_sq``), a bound
    on the size of its keys, which their error bounds scale with: ``(||q|| + M)**2``
    (Euclidean ``||x||**2 - 2 q.x``), ``||q|| M`` (inner product), 1 (cosine: unit rows)."""
    if distance == "euclidean":
        return (np.sqrt(q_sq) + np.sqrt(m_sq)) ** 2
    if distance == "inner_product":
        return np.sqrt(q_sq) * np.sqrt(m_sq)
    return np.ones(q_sq.shape, dtype=np.float64)


def rounding_of(precision: str, tensor_cores: bool = False) -> tuple[float, float]:
    """``(scale, input_u)`` of :func:`key_bounds` for a filter product ``precision``:
    ``"float32"``; ``"exact"`` (a float32 product of small integers, exact:
    :mod:`embedeval.engine.integers`; every bound is zero); ``"float64"`` (a float64 product
    rounded to float32 keys: one rounding); ``"tf32"`` reads each float32 input with a 10-bit
    mantissa (chopped or rounded: ``2**-10``) and multiplies exactly, accumulating in float32;
    ``"bf16"`` rounds each input to an 8-bit mantissa (``2**-9``) and the product's result once
    more, accumulating in float32.
    ``tensor_cores``: the product runs on GPU tensor cores (TF32 always does), whose float32
    accumulators may align and chop several terms at once rather than round each addition, so
    the accumulation term is taken 16 times float32's (still small beside the inputs' rounding).

    >>> rounding_of("bf16"), rounding_of("bf16", tensor_cores=True)
    ((1.0, 0.001953125), (16.0, 0.001953125))
    """
    if precision == "tf32":
        return _TENSOR_CORE_SCALE, 2.0**-10
    if precision == "bf16":
        return (_TENSOR_CORE_SCALE if tensor_cores else 1.0), 2.0**-9
    if precision == "exact":
        return 0.0, 0.0
    if precision == "float64":
        # No float32 product: a float64 one (within 4 gamma_{d+2} of the real key in double
        # precision, cosine's float64 normalisation included) rounded once to float32 (2**-24
        # times |key|, at most the magnitude).  The input term 4 u_in covers both for
        # d < 2**23 (FLOAT64_MAX_DIM): 2**-24 + 2**-26 >= 2**-24 + 8 gamma_{d+2}.
        return 0.0, 2.0**-26 + 2.0**-28
    return 1.0, 0.0


#: The accumulation term of a tensor-core product (TF32, bfloat16 on a GPU), in float32's.
_TENSOR_CORE_SCALE = 16.0


#: The largest dimension whose float64 filter keys :func:`rounding_of` bounds.
FLOAT64_MAX_DIM = 2**23 - 8


def reference_sq_bound(sq32: np.ndarray, dim: int) -> float:
    """An upper bound on every squared norm from float32 squared norms ``sq32`` (each within
    ``gamma_dim`` of the exact one)."""
    if not sq32.size:
        return 0.0
    return float(np.max(sq32)) / (1.0 - gamma(dim)) * (1.0 + 2.0**-40)


def exact_keys(
    q: np.ndarray,
    x: np.ndarray,
    distance: str,
    groups: np.ndarray | None = None,
    refs: np.ndarray | None = None,
) -> np.ndarray:
    """float64 keys of the aligned row pairs ``(q[i], x[i])`` (float32 rows), one column at a
    time so that the result does not depend on how pairs are grouped (see the module).

    Cosine: the positive multiples of a row within one ``groups`` entry (e.g. the query) take
    one key, that of the multiple with the smallest reference index ``refs`` (of the first
    listed without ``refs``), so the key does not depend on the order of the pairs.

    >>> q = np.array([[1, 2, 0], [1, 0, 0]], np.float32)
    >>> exact_keys(q, np.array([[1, 1, 0], [3, 3, 0]], np.float32), "euclidean").tolist()
    [1.0, 13.0]
    >>> a = exact_keys(q[:1], np.array([[1, 1, 0]], np.float32), "cosine")
    >>> b = exact_keys(q[:1], np.array([[3, 3, 0]], np.float32), "cosine")
    >>> bool(a[0] == b[0])
    True
    """
    q = np.asarray(q, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    acc = np.zeros(q.shape[0], dtype=np.float64)
    if distance == "euclidean":
        for j in range(q.shape[1]):
            t = q[:, j] - x[:, j]
            acc += t * t
        return acc
    for j in range(q.shape[1]):
        acc += q[:, j] * x[:, j]
    if distance == "inner_product":
        return -acc
    x_sq = np.zeros_like(acc)
    for j in range(q.shape[1]):
        x_sq += x[:, j] * x[:, j]
    # -sign(s) s^2 / ||x||^2 ranks like -cos (the query's norm is common to its references):
    # exact rational ties (small-integer data) stay ties, with no square root to round.
    out = -np.sign(acc) * (acc * acc) / x_sq
    return _tie_multiples(out, x, np.asarray(groups) if groups is not None else None, refs)


def direction_rows(rows: np.ndarray) -> np.ndarray:
    """Rows (float32 values) divided by their largest ``|component|`` in float64: equal
    exactly when two rows are positive multiples of each other (each ratio of two float32
    numbers rounds to a float64 that no other such ratio rounds to); ``-0.0`` becomes ``0.0``,
    zero rows stay zero.

    >>> direction_rows(np.float32([[2, -4], [3, -6], [3, -5.5]])).tolist()
    [[0.5, -1.0], [0.5, -1.0], [0.5454545454545454, -1.0]]
    """
    x = np.asarray(rows, dtype=np.float64)
    top = np.abs(x).max(axis=1, keepdims=True) if x.shape[1] else np.ones((x.shape[0], 1))
    return x / np.where(top > 0, top, 1.0) + 0.0


def _tie_multiples(
    keys: np.ndarray, x: np.ndarray, groups: np.ndarray | None, refs: np.ndarray | None = None
) -> np.ndarray:
    """Cosine keys with every positive multiple of a row (same ``groups`` entry, e.g. the
    query; equal :func:`direction_rows`) given the key of the one with the smallest ``refs``
    (without ``refs``: of its first occurrence)."""
    if keys.size < 2:
        return keys
    r = direction_rows(x)
    g = np.zeros(keys.size, dtype=np.int64) if groups is None else groups.astype(np.int64)
    rows = np.ascontiguousarray(np.column_stack((g.astype(np.float64), r)))
    _, inverse = np.unique(
        rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel(),
        return_inverse=True,
    )
    inverse = inverse.ravel()
    order = np.lexsort((np.arange(keys.size) if refs is None else refs, inverse))
    by_class = inverse[order]  # 0, 0, 1, ...: every class appears
    first = order[np.flatnonzero(np.append(True, by_class[1:] != by_class[:-1]))]
    return keys[first][inverse]


def _gather_keys(xq: Any, xb: Any, qi: np.ndarray, ri: np.ndarray, distance: str) -> np.ndarray:
    """:func:`exact_keys` of the pairs ``(xq[qi[i]], xb[ri[i]])`` (``qi`` sorted), in chunks
    that end at a query's last pair (cosine ties the multiples of a row within a query)."""
    out = np.empty(qi.size, dtype=np.float64)
    a = 0
    while a < qi.size:
        b = int(np.searchsorted(qi, qi[min(a + _ROWS, qi.size) - 1], side="right"))
        q, x = host_array(xq[qi[a:b]]), host_array(xb[ri[a:b]])
        out[a:b] = exact_keys(np.asarray(q), np.asarray(x), distance, qi[a:b], ri[a:b])
        a = b
    return out


def decide(
    block: Candidates,
    xq: Any,
    xb: Any,
    distance: str,
    bounds: np.ndarray,
    relevant: np.ndarray | None = None,
) -> tuple[Candidates, np.ndarray | None]:
    """``block`` (sorted by float32 key, then index) in float64 order, and the float64 keys
    of its candidates where any were computed (else ``None``: the block is returned as it is).

    ``bounds[i]`` is ``B`` of query ``block.queries[i]`` (:func:`key_bounds`); ``xq`` / ``xb``
    the float32 rows the keys were formed from.  Neighbours of one row whose keys lie within
    ``2 B`` of each other are *close*; chains of close neighbours (*clusters*) are re-scored
    with :func:`exact_keys` and sorted by (float64 key, reference index).  The result's
    ``bits`` are then tie codes: two neighbours of a row have equal codes exactly where their
    float64 keys tie (what the metric kernels read as a tie; the codes say nothing more, and
    re-sorted positions take codes no float32 key has, :func:`_recoded`).  Bounds of zero
    (exact keys) leave the block as it is.

    ``relevant`` (one flag per candidate), when given, limits the re-scoring to the candidates
    that have one of the other kind within ``2 B`` (:func:`_decide_mixed_pairs`): metrics read
    only the relevance of each rank, so only the order of a relevant and a non-relevant
    candidate can change a value.  The work grows with the close neighbours found, not with
    the block, unless most keys are close (:func:`_decide_dense`).

    >>> from embedeval.engine.candidates import sortable_bits
    >>> x = np.array([[1, 0], [1, 1], [3, 3], [2, 2]], np.float32)
    >>> keys = np.array([1.0, 1.0, 1.0], np.float32)  # float32 keys that cannot tell them apart
    >>> block = Candidates(np.array([0]), np.array([0, 3]), np.array([3, 1, 2]),
    ...                    sortable_bits(keys))
    >>> out, exact = decide(block, x, x, "cosine", np.array([1e-6]))
    >>> out.index.tolist(), out.bits.tolist()
    ([1, 2, 3], [0, 0, 0])
    """
    n = block.index.size
    if n < 2 or not np.any(bounds):  # exact keys: their order (ties by index) is the ranking
        return block, None
    if relevant is not None and np.count_nonzero(relevant) * 8 < n:
        return _decide_mixed_pairs(block, xq, xb, distance, bounds, relevant)
    close = _close_pairs(from_sortable_bits(block.bits), block.lims, bounds)
    if close.size * 2 > n:  # keys mostly closer than their bound
        return _decide_dense(block, _rows(block), xq, xb, distance)
    if relevant is not None:
        return _decide_mixed_pairs(block, xq, xb, distance, bounds, relevant, close)
    if not close.size:
        return block, None
    amb, cluster = _chains(close)
    row = _row_of(block.lims, amb)
    exact = float64_keys(xq, xb, block.queries[row], block.index[amb], row, distance, None)
    order = np.lexsort((block.index[amb], exact, cluster))
    index = block.index.copy()
    index[amb] = block.index[amb][order]
    exact = exact[order]
    bits = _recoded(block.bits, amb, (cluster[1:] != cluster[:-1]) | (exact[1:] != exact[:-1]))
    full = np.full(n, np.nan)
    full[amb] = exact
    return Candidates(block.queries, block.lims, index, bits), full


def _rows(block: Candidates) -> np.ndarray:
    """The block row of every candidate."""
    return np.repeat(np.arange(block.counts.size), block.counts)


def _row_of(lims: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The block row of the candidates at ``positions`` (rows ``lims``, empty ones included)."""
    return np.searchsorted(lims, positions, side="right") - 1


def _dense_ranks(distinct: np.ndarray) -> np.ndarray:
    """uint32 tie codes: a new code at each ``True`` (the first is 0)."""
    codes = np.cumsum(distinct, dtype=np.uint32)
    codes -= np.uint32(1)
    return codes


#: Tie codes of re-sorted positions (:func:`_recoded`): sortable bits of NaN, which no key has.
_RESORTED = np.uint32(0xFFFFFFF0)


def _recoded(bits: np.ndarray, at: np.ndarray, change: np.ndarray) -> np.ndarray:
    """Tie codes of a block whose positions ``at`` (runs of consecutive positions) were
    re-sorted: ``bits`` (float32 key bits: equal for float32 ties) elsewhere, and at ``at`` a
    new code at each run start and wherever ``change[i]`` (between ``at[i]`` and
    ``at[i + 1]``).  Those codes alternate between two values no float32 key takes, so a code
    equals its neighbour's exactly where they tie: never across the edge of a run, and at the
    junction of two adjacent runs the codes alternate too.  The metric kernels read ties only
    as equal codes of neighbours in a row.

    >>> b = np.uint32([5, 7, 7, 9])
    >>> [hex(v) for v in _recoded(b, np.array([1, 2]), np.array([False])).tolist()]  # a tie
    ['0x5', '0xfffffff1', '0xfffffff1', '0x9']
    >>> [hex(v) for v in _recoded(b, np.array([1, 2]), np.array([True])).tolist()]
    ['0x5', '0xfffffff1', '0xfffffff0', '0x9']
    """
    new = np.empty(at.size, dtype=bool)
    new[:1] = True
    new[1:] = change | (at[1:] != at[:-1] + 1)
    out = bits.copy()
    out[at] = _RESORTED | (np.cumsum(new) & 1).astype(np.uint32)
    return out


def _close_pairs(keys: np.ndarray, lims: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """The positions ``i`` (ascending) whose candidate and the next, ``i + 1``, lie in one row
    with float32 keys within ``2 B`` of that row (``bounds``; keys ascending within each row).

    The block's largest band, rounded up to float32, screens the float32 differences (a
    rounded difference above it is a larger exact one); the few left are rows checked against
    their own band in float64.  Unordered differences (``inf - inf``) count as close."""
    t64 = 2.0 * float(np.max(bounds, initial=0.0))
    t32 = np.float32(t64)
    if float(t32) < t64:
        t32 = np.nextafter(t32, np.float32(np.inf))
    with np.errstate(invalid="ignore", over="ignore"):
        wide = np.subtract(keys[1:], keys[:-1]) > t32
    at = np.flatnonzero(~wide)
    row = _row_of(lims, at)
    gap = keys[at + 1].astype(np.float64) - keys[at]
    with np.errstate(invalid="ignore"):
        keep = (lims[row + 1] > at + 1) & ~(gap > 2.0 * bounds[row])
    return at[keep]


def _chains(close: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The positions (ascending) linked by ``close`` neighbours (``close``: ascending positions
    ``i`` whose ``i + 1`` is close) and the chain of each: a run of consecutive close
    positions and the one after its last.

    >>> [c.tolist() for c in _chains(np.array([2, 3, 7]))]
    [[2, 3, 4, 7, 8], [0, 0, 0, 1, 1]]
    """
    start = np.append(True, np.diff(close) != 1)
    first = close[start]
    length = close[np.append(start[1:], True)] + 2 - first
    return spans(first, length), np.repeat(np.arange(first.size), length)


def _decide_dense(
    block: Candidates, row: np.ndarray, xq: Any, xb: Any, distance: str
) -> tuple[Candidates, np.ndarray]:
    """:func:`decide` of a block whose float32 keys mostly lie closer than their bound (a few
    large classes, full-depth rankings): the float32 order decides little, so every candidate
    takes its float64 product key (:func:`_product_keys`, one BLAS tile per few queries) and
    each row is sorted by it.  Neighbours whose product keys lie within twice their bound
    (``16 gamma_{d+8}`` in double precision times the pair's magnitude) form runs that are
    re-scored with :func:`exact_keys` and sorted by (key, reference index); every other pair of
    neighbours is then in the order of its fixed-order keys."""
    n, counts = row.size, block.counts
    g, mag = _product_keys(xq, xb, block.queries[row], block.index, distance)
    col = np.arange(n) - np.repeat(block.lims[:-1], counts)
    grid = np.full((counts.size, int(counts.max())), np.inf)
    grid[row, col] = g
    at = np.argsort(grid, axis=1, kind="stable") + block.lims[:-1, None]
    perm = at[np.arange(grid.shape[1])[None, :] < counts[:, None]]
    index, g, mag = block.index[perm], g[perm], mag[perm]
    beta = 16.0 * gamma(int(xq.shape[1]) + 8, _U64) * (1.0 + 2.0**-20)
    row_max = _row_max(mag, row)
    close = (np.diff(g) <= 2.0 * beta * row_max[row[1:]]) & (row[1:] == row[:-1])
    if close.any():
        flag = np.zeros(n, dtype=bool)
        flag[1:] |= close
        flag[:-1] |= close
        f = np.flatnonzero(flag)
        start = np.ones(f.size, dtype=bool)
        start[1:] = ~close[f[1:] - 1]
        exact = _gather_keys(xq, xb, block.queries[row[f]], index[f], distance)
        order = np.lexsort((index[f], exact, np.cumsum(start)))
        index[f], g[f] = index[f][order], exact[order]
    distinct = np.empty(n, dtype=bool)
    distinct[0] = True
    distinct[1:] = (row[1:] != row[:-1]) | (g[1:] != g[:-1])
    return Candidates(block.queries, block.lims, index, _dense_ranks(distinct)), g


def _decide_mixed_pairs(
    block: Candidates,
    xq: Any,
    xb: Any,
    distance: str,
    bounds: np.ndarray,
    relevant: np.ndarray,
    close: np.ndarray | None = None,
) -> tuple[Candidates, np.ndarray | None]:
    """:func:`decide` for a ranking read through relevance only (``close``: the positions
    ``i`` whose candidates ``i`` and ``i + 1`` lie in one row within ``2 B`` of each other,
    from :func:`_close_pairs`; None: the relevant candidates are few and searched around).

    A candidate whose float32 key lies within ``2 B`` of a candidate of the other kind
    (relevant / not) is *ambiguous* and gets a float64 key (:func:`float64_keys`); every other
    candidate keeps its float32 key.  Each float32 key is within ``B`` of the float64 one, so a
    kept candidate is more than ``B`` away from any key (float32 or float64) of the other kind.
    Only *windows* are re-sorted: the positions whose float32 keys lie within ``2 B`` of an
    ambiguous key (overlapping ones merged).  A candidate outside a window is more than ``2 B``
    from every ambiguous key, so its order against the window is already the float64 one for
    every pair of different kinds; inside, sorting by these keys (then index) puts every
    relevant / non-relevant pair in its float64 order, ties included, while candidates of one
    kind keep their float32 order among themselves, which no metric reads.
    """
    n = block.index.size
    band = 2.0 * bounds
    if close is None:  # few relevant: search around them only
        amb = np.flatnonzero(_near_relevant(block, band, relevant))
    elif close.size * 8 < n:
        amb = _mixed_chains(close, relevant)
    else:
        row = _rows(block)
        keys = from_sortable_bits(block.bits).astype(np.float64)
        amb = np.flatnonzero(_near_other_kind(keys, row, band[row], relevant))
    if not amb.size:
        return block, None
    part, window = _windows(block, amb, band)
    keys = from_sortable_bits(block.bits[part]).astype(np.float64)
    mixed = _on_exact_scale(keys, _row_of(block.lims, part), xq, block.queries, distance)
    row = _row_of(block.lims, amb)
    qi = block.queries[row]
    exact = float64_keys(xq, xb, qi, block.index[amb], row, distance, relevant[amb])
    is_exact = np.zeros(part.size, dtype=bool)
    is_exact[np.searchsorted(part, amb)] = True
    mixed[is_exact] = exact
    order = np.lexsort((block.index[part], mixed, window))
    index = block.index.copy()
    index[part] = block.index[part][order]
    mixed = mixed[order]
    # Tie codes: float32 ties outside the windows; inside one, a new code at each key change.
    bits = _recoded(block.bits, part, (window[1:] != window[:-1]) | (mixed[1:] != mixed[:-1]))
    full = np.full(n, np.nan)
    is_exact = is_exact[order]
    full[part[is_exact]] = mixed[is_exact]
    return Candidates(block.queries, block.lims, index, bits), full


def _band_positions(
    block: Candidates, at: np.ndarray, width: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``[lo, hi)``: the positions of the row of each candidate ``at`` whose float32 key lies
    within ``width`` of the key of ``at`` (rounded outwards): a binary search of the row's
    sorted key bits, so nothing the size of the block is formed."""
    key = from_sortable_bits(block.bits[at])
    low64 = key.astype(np.float64) - width
    low = low64.astype(np.float32)
    low = np.where(low > low64, np.nextafter(low, np.float32(-np.inf)), low)
    high = widen(key, width)
    row = _row_of(block.lims, at)
    first, end = block.lims[row], block.lims[row + 1]
    low_bits, high_bits = sortable_bits(low), sortable_bits(high)
    # Bands hold a few keys: search the _NEAR positions beside ``at`` first, then the rest of
    # the row where the band reaches past them.
    w_lo = np.maximum(first, at - _NEAR)
    lo = segment_searchsorted(block.bits, w_lo, at + 1, low_bits)
    far = np.flatnonzero((lo == w_lo) & (w_lo > first))
    lo[far] = segment_searchsorted(block.bits, first[far], w_lo[far], low_bits[far])
    w_hi = np.minimum(end, at + _NEAR + 1)
    hi = segment_searchsorted(block.bits, at, w_hi, high_bits, right=True)
    far = np.flatnonzero((hi == w_hi) & (w_hi < end))
    hi[far] = segment_searchsorted(block.bits, w_hi[far], end[far], high_bits[far], right=True)
    return lo, hi


#: Positions on each side of a key that :func:`_band_positions` searches before its row.
_NEAR = 16


def _near_relevant(block: Candidates, band: np.ndarray, relevant: np.ndarray) -> np.ndarray:
    """Flags of the candidates with a key of the other kind within ``band`` of their row (per
    block row), for sparse ``relevant`` flags: a binary search of each relevant key's band in
    its row, so the search grows with the relevant candidates, not the block."""
    n = block.index.size
    rel = np.flatnonzero(relevant)
    lo, hi = _band_positions(block, rel, band[_row_of(block.lims, rel)])
    mixed = (hi - lo) > np.searchsorted(rel, hi) - np.searchsorted(rel, lo)
    cover = np.zeros(n + 1, dtype=np.int64)
    np.add.at(cover, lo[mixed], 1)
    np.add.at(cover, hi[mixed], -1)
    near = (np.cumsum(cover[:-1]) > 0) & ~relevant
    near[rel[mixed]] = True
    return near


def _mixed_chains(close: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """The positions (ascending) of the chains of close neighbours (:func:`_chains` of
    ``close``) that hold both values of ``kind``.

    >>> _mixed_chains(np.array([0, 4, 5]), np.array([1, 0, 0, 0, 1, 1, 1], bool)).tolist()
    [0, 1]
    """
    if not close.size:
        return close
    at, chain = _chains(close)
    n_kind = np.bincount(chain, weights=kind[at])
    mixed = (n_kind > 0) & (n_kind < np.bincount(chain))
    return at[mixed[chain]]


def _windows(block: Candidates, amb: np.ndarray, band: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The positions within ``band`` (per block row) of the ambiguous positions ``amb``
    (sorted), grouped into windows (overlapping spans merged): ``(positions, window of
    each)``."""
    lo, hi = _band_positions(block, amb, band[_row_of(block.lims, amb)])
    first = np.flatnonzero(np.append(True, lo[1:] >= np.maximum.accumulate(hi)[:-1]))
    start, end = lo[first], np.maximum.reduceat(hi, first)
    length = end - start
    part = spans(start, length)
    return part, np.repeat(np.arange(first.size), length)


def _near_other_kind(
    keys: np.ndarray,
    row: np.ndarray,
    band: np.ndarray,
    kind: np.ndarray | None,
) -> np.ndarray:
    """Flags of the positions of sorted rows (``keys`` ascending within each row; ``row``
    the non-decreasing row of each position, whose positions share one ``band``) that have,
    in their row, a key of the other ``kind`` (any other key when ``kind`` is None) within
    ``band[i]`` -- or, where few neighbours lie that close, a superset of them: the positions
    of chains of neighbours closer than the band that hold both kinds (a key within the band
    of one of the other kind is chained to it through every key between)."""
    n = keys.size
    same = row[1:] == row[:-1]
    close = same & (np.diff(keys) <= np.minimum(band[1:], band[:-1]))
    near = np.zeros(n, dtype=bool)
    if kind is None:
        near[1:] |= close
        near[:-1] |= close
        return near
    if np.count_nonzero(close) * 8 < n:
        near[_mixed_chains(np.flatnonzero(close), kind)] = True
        return near
    pos = np.arange(n)
    first = np.flatnonzero(np.append(True, ~same))
    length = np.diff(np.append(first, n))
    starts = np.repeat(first, length)
    ends = starts + np.repeat(length, length)
    for k in (kind, ~kind):
        # the nearest position of this kind before and after each position, in the same row
        before = np.maximum.accumulate(np.where(k, pos, -1))
        after = np.minimum.accumulate(np.where(k, pos, n)[::-1])[::-1]
        gap_b = np.where(before >= starts, keys - keys[np.maximum(before, 0)], np.inf)
        gap_a = np.where(after < ends, keys[np.minimum(after, n - 1)] - keys, np.inf)
        near |= ~k & ((gap_b <= band) | (gap_a <= band))
    return near


def float64_keys(
    xq: Any,
    xb: Any,
    qi: np.ndarray,
    ri: np.ndarray,
    row: np.ndarray,
    distance: str,
    kind: np.ndarray | None = None,
) -> np.ndarray:
    """float64 keys of the pairs ``(xq[qi[i]], xb[ri[i]])`` on the scale of :func:`exact_keys`
    that order every two pairs of one ``row`` (of different ``kind`` when given) as their
    :func:`exact_keys` do, equal keys included: a float64 product filters, the fixed-order
    reduction decides what it cannot (the two filters of the module).

    ``qi`` is sorted and pairs are grouped by ``row`` (one row per query); for cosine, the
    positive multiples of a row take the key of the one of smallest reference index among the
    query's pairs that are re-scored.

    A float64 product (:func:`_product_keys`, any summation order) is a second filter: its keys
    are within ``beta = 16 gamma_{d+8}`` (double precision) times the pair's magnitude of the
    :func:`exact_keys` ones, 2**29 times tighter than float32's bound.  Only the pairs within
    ``2 beta`` of a pair of the other ``kind`` of their row (of any pair when ``kind`` is None)
    are re-scored with :func:`exact_keys`; the others keep the product key, whose order against
    every pair it is compared with is then the :func:`exact_keys` order.

    >>> x = np.array([[1, 0], [0, 1], [2, 0]], np.float32)
    >>> z = np.zeros(3, dtype=np.int64)
    >>> float64_keys(x, x, z, np.arange(3), z, "euclidean").tolist()
    [0.0, 2.0, 1.0]
    """
    qi, ri, row = (np.asarray(a, dtype=np.int64) for a in (qi, ri, row))
    if not qi.size:
        return np.zeros(0, dtype=np.float64)
    g, mag = _product_keys(xq, xb, qi, ri, distance)
    beta = 16.0 * gamma(int(xq.shape[1]) + 8, _U64) * (1.0 + 2.0**-20)
    row_max = _row_max(mag, row)
    order = np.lexsort((g, row))
    r = row[order]
    band = 2.0 * beta * row_max[r]
    near = _near_other_kind(g[order], r, band, None if kind is None else kind[order])
    redo = np.sort(order[near])
    if redo.size:
        g[redo] = _gather_keys(xq, xb, qi[redo], ri[redo], distance)
    return g


_DENSE_CELLS = 1 << 22  # float64 products per dense tile (32 MiB)
_DENSE_RATIO = 64  # a dense tile pays when the pairs cover at least 1 / _DENSE_RATIO of it


def _product_keys(
    xq: Any, xb: Any, qi: np.ndarray, ri: np.ndarray, distance: str
) -> tuple[np.ndarray, np.ndarray]:
    """float64 keys of the pairs ``(xq[qi[i]], xb[ri[i]])`` (``qi`` sorted) from float64
    products, and each pair's magnitude (what the key's rounding error scales with:
    ``(||q|| + ||x||)^2``, ``||q|| ||x||`` or ``||q||^2`` for cosine).  Pairs that cover much
    of the queries x references they touch take dense BLAS tiles against one float64 copy of
    those references; sparse ones a row-by-row product of the gathered pairs."""
    keys = np.empty(qi.size, dtype=np.float64)
    mag = np.empty(qi.size, dtype=np.float64)
    starts = np.flatnonzero(np.append(True, qi[1:] != qi[:-1]))
    cols, inverse = _unique_columns(ri, int(xb.shape[0]))
    dense = starts.size * cols.size <= _DENSE_RATIO * qi.size
    if not dense or cols.size * xb.shape[1] * 8 > 256 << 20:
        for c in range(0, qi.size, _ROWS):
            e = min(c + _ROWS, qi.size)
            piece = qi[c:e]
            first = np.flatnonzero(np.append(True, piece[1:] != piece[:-1]))
            own = np.repeat(np.arange(first.size), np.diff(np.append(first, piece.size)))
            # rows as stored, each product formed in float64 (exact) inside the sum: no
            # float64 copy of the gathered rows, and one read of each query
            q = np.asarray(host_array(xq[piece[first]]))
            x = np.asarray(host_array(xb[ri[c:e]]))
            dots = np.einsum("ij,ij->i", q[own], x, dtype=np.float64)
            q_sq = np.einsum("ij,ij->i", q, q, dtype=np.float64)[own]
            x_sq = np.einsum("ij,ij->i", x, x, dtype=np.float64)
            keys[c:e], mag[c:e] = _keys_from_products(dots, q_sq, x_sq, distance)
        return keys, mag
    x = np.asarray(host_array(xb[cols]), dtype=np.float64)
    x_sq = np.einsum("ij,ij->i", x, x)
    bounds = np.append(starts, qi.size)
    step = max(1, _DENSE_CELLS // max(cols.size, 1))
    for a in range(0, starts.size, step):
        n_q = min(step, starts.size - a)
        lo, hi = int(bounds[a]), int(bounds[a + n_q])
        q = np.asarray(host_array(xq[qi[starts[a : a + n_q]]]), dtype=np.float64)
        q_pos = np.repeat(np.arange(n_q), np.diff(bounds[a : a + n_q + 1]))
        dots = (q @ x.T)[q_pos, inverse[lo:hi]]
        q_sq = np.einsum("ij,ij->i", q, q)[q_pos]
        keys[lo:hi], mag[lo:hi] = _keys_from_products(dots, q_sq, x_sq[inverse[lo:hi]], distance)
    return keys, mag


def row_keys(xq: Any, xb: Any, queries: np.ndarray, distance: str) -> tuple[np.ndarray, np.ndarray]:
    """float64 product keys of query rows ``queries`` against every reference (shape
    ``(queries.size, n_reference)``, on the scale of :func:`exact_keys`), and per query the
    bound ``beta`` on their distance from the :func:`exact_keys` ones (``16 gamma_{d+8}`` in
    double precision times the largest magnitude of its pairs): two keys of a row more than
    ``2 beta`` apart are in the order of their fixed-order keys.

    >>> x = np.array([[0, 0], [3, 4], [6, 8]], np.float32)
    >>> keys, beta = row_keys(x, x, np.array([0]), "euclidean")
    >>> keys.tolist(), bool(beta[0] < 1e-10)
    ([[0.0, 25.0, 100.0]], True)
    """
    q = np.asarray(host_array(xq[queries]), dtype=np.float64)
    x = np.asarray(host_array(xb[:]), dtype=np.float64)
    q_sq, x_sq = np.einsum("ij,ij->i", q, q), np.einsum("ij,ij->i", x, x)
    dots = q @ x.T
    keys, _ = _keys_from_products(dots, q_sq[:, None], x_sq[None, :], distance)
    m = float(np.sqrt(x_sq.max(initial=0.0)))
    qn = np.sqrt(q_sq)
    mag = {"euclidean": (qn + m) ** 2, "inner_product": qn * m}.get(distance, q_sq)
    beta = 16.0 * gamma(int(q.shape[1]) + 8, _U64) * (1.0 + 2.0**-20) * mag
    return keys, beta


def _row_max(values: np.ndarray, row: np.ndarray) -> np.ndarray:
    """The largest of ``values`` per ``row`` (``row`` non-decreasing, ids from 0; rows
    without values get 0)."""
    out = np.zeros(int(row[-1]) + 1 if row.size else 0, dtype=np.float64)
    first = np.flatnonzero(np.append(True, row[1:] != row[:-1]))
    if first.size:
        out[row[first]] = np.maximum.reduceat(values, first)
    return out


def _unique_columns(ri: np.ndarray, n_ref: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(ri, return_inverse=True)``, by a mark over the references when the pairs
    are many (no sort)."""
    if ri.size * 16 < n_ref:
        cols, inverse = np.unique(ri, return_inverse=True)
        return cols, inverse.ravel()
    mark = np.zeros(n_ref, dtype=bool)
    mark[ri] = True
    cols = np.flatnonzero(mark)
    where = np.empty(n_ref, dtype=np.int64)
    where[cols] = np.arange(cols.size)
    return cols, where[ri]


def _keys_from_products(
    dots: np.ndarray, q_sq: np.ndarray, x_sq: np.ndarray, distance: str
) -> tuple[np.ndarray, np.ndarray]:
    """Keys on the scale of :func:`exact_keys` from dot products and squared norms, and the
    magnitudes their rounding scales with."""
    if distance == "euclidean":
        return q_sq + x_sq - 2.0 * dots, (np.sqrt(q_sq) + np.sqrt(x_sq)) ** 2
    if distance == "inner_product":
        return -dots, np.sqrt(q_sq * x_sq)
    with np.errstate(divide="ignore", invalid="ignore"):
        keys = -np.sign(dots) * (dots * dots) / x_sq
    return np.where(x_sq > 0, keys, 0.0), q_sq.copy()


def _on_exact_scale(
    keys: np.ndarray, row: np.ndarray, xq: Any, queries: np.ndarray, distance: str
) -> np.ndarray:
    """float32 engine keys mapped, per query, by the increasing function that turns the exact
    engine key into the :func:`exact_keys` one: ``+ ||q||^2`` (Euclidean), ``sign(k) k^2
    ||q||^2`` (cosine, from ``k = -cos``), unchanged (inner product).  Being increasing, the
    map keeps every order the float32 keys certify."""
    if distance == "inner_product":
        return keys.copy()
    q = np.asarray(host_array(xq[queries]), dtype=np.float64)
    q_sq = np.einsum("ij,ij->i", q, q)[row]
    if distance == "euclidean":
        return keys + q_sq
    return np.sign(keys) * keys * keys * q_sq


@dataclass(frozen=True)
class Reach:
    """What the engine needs to widen a query's threshold by ``2 B_q``: upper bounds on the
    squared norms of its rows (``q_sq``, float64 per row) and of every reference (``m_sq``),
    the dimension, the distance, a factor on the unit roundoff (``scale``: 16 for
    tensor-core products) and the rounding of the product's inputs (``input_u``: 2**-9 for
    bfloat16; see :func:`key_bounds`).

    For the Euclidean key the band depends on the threshold ``tau``: a reference whose key can
    reach ``tau + band`` has a norm of at most ``R = (1 + c) ||q|| + sqrt((1 + c)^2 ||q||^2 +
    (1 - c)(c ||q||^2 + tau + band))) / (1 - c)`` (from ``key >= ||x||^2 - 2 ||q|| ||x||`` and
    ``B(q, x) = c (||q|| + ||x||)^2``), so the band only needs ``min(M, R)`` rather than the
    largest norm ``M`` of the whole reference: two rounds of that fixed point, each band no
    larger than the one before, keep one outlying row from widening every query's band.
    """

    q_sq: np.ndarray
    m_sq: float
    dim: int
    distance: str
    scale: float = 1.0
    input_u: float = 0.0

    def band(self, rows: Any, tau: np.ndarray) -> np.ndarray:
        """``2 B_q`` for the query ``rows`` at thresholds ``tau`` (float64)."""
        q_sq = self.q_sq[rows]
        bound = key_bounds(q_sq, self.m_sq, self.dim, self.distance, self.scale, self.input_u)
        if self.distance != "euclidean":
            return 2.0 * bound
        # B(q, x) = c (||q|| + ||x||)^2 + the underflow term, which does not shrink with R
        c = relative_bound(self.dim, self.distance, self.scale, self.input_u)
        tiny = 2.0 * underflow_bound(q_sq, self.m_sq, self.dim, self.distance, self.input_u)
        qn, m = np.sqrt(q_sq), np.sqrt(self.m_sq)
        band = 2.0 * bound
        t = np.asarray(tau, dtype=np.float64)
        if c >= 0.5:
            return band
        for _ in range(2):
            with np.errstate(invalid="ignore", over="ignore"):
                s = np.maximum((1 + c) ** 2 * q_sq + (1 - c) * (c * q_sq + t + band + tiny), 0.0)
                r = ((1 + c) * qn + np.sqrt(s)) / (1 - c)
            r = np.where(np.isfinite(t), np.minimum(r, m), m)
            band = 2.0 * c * (qn + r) ** 2 + tiny
        return band * (1.0 + 2.0**-30)

    def widen(self, rows: Any, tau: np.ndarray) -> np.ndarray:
        """float32 thresholds ``tau`` of the query ``rows`` widened by their band."""
        return widen(tau, self.band(rows, tau))


def reach_of(x: np.ndarray, sq32: np.ndarray | None, m_sq: float, distance: str) -> Reach:
    """The :class:`Reach` of query rows ``x`` (float32) from their float32 squared norms
    ``sq32`` (each within ``gamma_dim``; None: computed here) and ``m_sq``."""
    dim = int(x.shape[1])
    if distance == "cosine":
        return Reach(np.ones(int(x.shape[0])), 1.0, dim, distance)
    if sq32 is None:
        sq32 = np.einsum("ij,ij->i", x, x, dtype=np.float32)
    q_sq = np.asarray(sq32, dtype=np.float64) / (1.0 - gamma(dim)) * (1.0 + 2.0**-40)
    return Reach(q_sq, m_sq, dim, distance)


def sq_norms(x: Any) -> np.ndarray:
    """float64 squared norms of the rows of ``x`` (numpy, memory-mapped or a tensor), read in
    pieces of about 4 MB of float64: a larger copy costs more in fresh pages than in
    arithmetic (the re-id shape, 19,281 x 2,048: 0.5 s in pieces of 8,192 rows, 0.03 s so).

    >>> sq_norms(np.array([[3, 4], [1, 1]], np.float32)).tolist()
    [25.0, 2.0]
    """
    n = int(x.shape[0])
    step = max(64, (4 << 20) // (8 * max(int(x.shape[1]), 1)))
    out = np.empty(n, dtype=np.float64)
    for a in range(0, n, step):
        part = np.asarray(host_array(x[a : a + step]), dtype=np.float64)
        out[a : a + step] = np.einsum("ij,ij->i", part, part)
    return out


def candidate_bounds(
    block: Candidates,
    q_sq: np.ndarray,
    ref_sq: np.ndarray,
    dim: int,
    distance: str,
    scale: float = 1.0,
    input_u: float = 0.0,
) -> np.ndarray:
    """``B_q`` per query of ``block`` with the largest squared norm among its own candidates
    (``ref_sq`` of every reference, ``q_sq`` of the block's queries): the pairs the decision
    compares are its candidates, so no other reference's norm enters.

    >>> block = Candidates(np.array([0]), np.array([0, 1]), np.array([1]), np.zeros(1, np.uint32))
    >>> bool(candidate_bounds(block, np.ones(1), np.array([1e6, 1.0]), 8, "euclidean")[0] < 1e-4)
    True
    """
    if distance == "cosine":
        return key_bounds(np.ones(block.queries.size), 1.0, dim, distance, scale, input_u)
    counts = block.counts
    m_sq = np.zeros(counts.size, dtype=np.float64)
    full = np.flatnonzero(counts > 0)
    if full.size:
        m_sq[full] = np.maximum.reduceat(ref_sq[block.index], block.lims[:-1][full])
    return key_bounds(q_sq, m_sq * (1.0 + 2.0**-40), dim, distance, scale, input_u)


@dataclass(frozen=True)
class TaskNorms:
    """float64 squared norms of a task's query and reference rows (computed once per task)."""

    q_sq: np.ndarray
    ref_sq: np.ndarray

    def reach(self, distance: str, dim: int, scale: float = 1.0, input_u: float = 0.0) -> Reach:
        m_sq = float(self.ref_sq.max(initial=0.0))
        q_sq = self.q_sq * (1.0 + 2.0**-40)
        return Reach(q_sq, m_sq * (1.0 + 2.0**-40), dim, distance, scale, input_u)


_NORMS: dict[int, TaskNorms] = {}
_NORMS_LOCK = threading.Lock()


def task_norms(task: Any) -> TaskNorms:
    """The :class:`TaskNorms` of a retrieval task, kept while the task lives."""
    with _NORMS_LOCK:
        out = _NORMS.get(id(task))
    if out is None:
        q_sq = sq_norms(task.query)
        if task.reference is task.query:
            ref_sq = q_sq
        else:
            ref_sq = sq_norms(task.reference)
        out = TaskNorms(q_sq, ref_sq)
        with _NORMS_LOCK:
            _NORMS[id(task)] = out
            weakref.finalize(task, _NORMS.pop, id(task), None)
    return out


def decide_task_block(
    task: Any, block: Candidates, scale: float = 1.0, input_u: float = 0.0
) -> Candidates:
    """:func:`decide` of a retrieval task's block (its rows and norms)."""
    norms = task_norms(task)
    dim = int(task.reference.shape[1])
    q_sq = norms.q_sq[block.queries]
    bounds = candidate_bounds(block, q_sq, norms.ref_sq, dim, task.distance, scale, input_u)
    relevant = None
    if task.metrics:  # a ranking scored by relevance: only mixed clusters can change a value
        rows = np.repeat(block.queries, block.counts)
        relevant = match_pairs(task.query_codes[rows], task.reference_codes[block.index])
    return decide(block, task.query, task.reference, task.distance, bounds, relevant)[0]


def widen(tau: np.ndarray, band: np.ndarray) -> np.ndarray:
    """float32 thresholds ``tau + band`` rounded up (``-inf`` stays, overflow gives ``+inf``),
    so that a float32 key within ``band`` above ``tau`` still passes ``key <= threshold``.

    >>> widen(np.array([1.0, -np.inf], np.float32), np.array([1e-9, 1.0])).tolist()
    [1.0000001192092896, -inf]
    """
    exact = np.asarray(tau, dtype=np.float64) + band
    with np.errstate(over="ignore"):
        out = exact.astype(np.float32)
    low = out < exact
    out[low] = np.nextafter(out[low], np.float32(np.inf))
    return out


def first_k(task: Any, block: Candidates, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``k`` candidates of each query of a decided ``block`` (:func:`decide`) as
    ``(distances, indices)``: the float64 Euclidean distance (square root of the float64
    squared distance), cosine or inner product of the task's rows, in float64 (the caller
    rounds them to float32 once, after undoing any power-of-two scaling of the rows: rounding
    first would round twice where the unscaled value is a subnormal float32).

    >>> from types import SimpleNamespace
    >>> x = np.array([[0, 0], [3, 4], [6, 8]], np.float32)
    >>> task = SimpleNamespace(query=x, reference=x, distance="euclidean")
    >>> lims, index = np.array([0, 2]), np.array([1, 2])
    >>> block = Candidates(np.array([0]), lims, index, np.zeros(2, np.uint32))
    >>> first_k(task, block, 2)[0].tolist()
    [[5.0, 10.0]]
    """
    b = block.queries.size
    # A query that sees fewer than k references (groups excluded) is padded with NaN and -1.
    count = np.minimum(np.diff(block.lims), k)
    r, c = np.nonzero(np.arange(k)[None, :] < count[:, None])
    take = block.lims[:-1][r] + c
    idx = np.asarray(block.index[take], dtype=np.int64)
    qi = block.queries[r]
    keys = _gather_keys(task.query, task.reference, qi, idx, task.distance)
    if task.distance == "euclidean":
        values = np.sqrt(keys)
    elif task.distance == "cosine":  # from -sign(s) s^2 / ||x||^2: cos = sign(s) |s| / ||x|| ||q||
        q = np.asarray(host_array(task.query[block.queries]), dtype=np.float64)
        q_norm = np.sqrt(np.einsum("ij,ij->i", q, q))[r]
        values = -np.sign(keys) * np.sqrt(np.abs(keys)) / q_norm
    else:
        values = -keys
    dist = np.full((b, k), np.nan, dtype=np.float64)
    index = np.full((b, k), -1, dtype=np.int64)
    dist[r, c] = values
    index[r, c] = idx
    return dist, index
