"""Small-integer inputs, whose float32 keys are already the exact keys.

Binary hash codes (``{-1, 1}`` or ``{0, 1}``), quantised features and counts are integers.  When
every input value is an integer and the sum of the absolute products of any key stays within
``2**24``, every partial sum a float32 product forms (in any order, with or without fused
multiply-adds) is an integer of magnitude at most ``2**24``, hence exactly representable: the
float32 keys *are* the float64 keys, ties included.  Such data are also the most tied data there
is (64-bit codes have 65 distances), and every tie between a relevant and a non-relevant
reference would otherwise send the pair to float64 re-scoring.  With exact keys nothing needs
re-scoring: the float32 order, equal keys by reference index, is the ranking
(:func:`exact_in_float32` decides; the engine then bounds the keys' error by zero), and a full-depth
ranking is one sort of ``(key, reference, relevance)`` codes per row
(:func:`ranks_of_exact_keys`).

The bounds, for ``d`` columns whose values are at most ``Q`` (queries) and ``X`` (references) in
magnitude: Euclidean keys ``||x||**2 - 2 q.x`` (one query against the references) and the
leave-one-out engine's ``[x, ||x||**2, 1].[-2 q, 1, ||q||**2] - ||q||**2`` add terms of total
magnitude at most ``d (Q + X)**2``; inner-product keys ``-q.x`` at most ``d Q X``.  Cosine keys
are products of normalised rows, which are not integers; but where every reference has one norm
(codes in ``{-1, 1}``) cosine ranks as the inner product does, ties included
(:func:`exact_distance`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..utils.mapped import row_blocks
from ..utils.validation import host_array
from .candidates import rows_searchsorted, sortable_bits

__all__ = ["exact_distance", "exact_in_float32", "integer_magnitude", "ranks_of_exact_keys"]

#: The largest magnitude every integer up to which float32 represents exactly.
EXACT_LIMIT = 2.0**24
#: Rows read at a time when checking a matrix (bounded temporary memory).
_ROWS = 8192


def integer_magnitude(x: Any, rows: int = _ROWS) -> float | None:
    """The largest ``|value|`` of ``x`` when every value is a finite integer, else None.

    The first rows are checked first, so non-integer data (the usual case) cost next to nothing.

    >>> integer_magnitude(np.array([[1, -3], [0, 2]], np.float32))
    3.0
    >>> integer_magnitude(np.array([[1, 0.5]], np.float32)) is None
    True
    """
    return _integer_rows(x, None, rows)


def _integer_rows(x: Any, norms: str | None, rows: int = _ROWS) -> float | None:
    """:func:`integer_magnitude`, in the same single read of ``x`` also requiring, with
    ``norms="one"``, that every row have the first row's squared norm and that it be
    non-zero, or with ``norms="non-zero"`` that no row be zero (None where not); reading
    stops at the first block that fails."""
    top, first = 0.0, None
    for block in row_blocks(x, _row_blocks(int(x.shape[0]), rows)):  # pages released as read
        block = np.asarray(host_array(block))  # a device tensor: one block on the host at a time
        if block.dtype.kind != "f":
            block = block.astype(np.float64)
        if not np.array_equal(np.rint(block), block):  # NaN and inf fail too
            return None
        if not block.size:
            continue
        top = max(top, float(np.abs(block).max()))
        if norms is not None:
            wide = block.astype(np.float64)  # integers: exact squared norms
            sq = np.einsum("ij,ij->i", wide, wide)
            first = sq[0] if first is None else first
            if not (sq > 0).all() or (norms == "one" and not (sq == first).all()):
                return None
    return top if np.isfinite(top) else None


def _row_blocks(n: int, rows: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of 16 rows, then of ``rows`` rows at a time."""
    first = min(n, 16)
    out = [(0, first)] if first else []
    out += [(a, min(a + rows, n)) for a in range(first, n, rows)]
    return out


def exact_in_float32(xq: Any, xb: Any, distance: str, limit: float = EXACT_LIMIT) -> bool:
    """Whether every float32 key of queries ``xq`` against references ``xb`` (the rows the engine
    multiplies) is exact: integer values whose products sum to at most ``limit`` (``2**24``)
    in magnitude (see the module).  With ``limit = 2**53`` it says the same of a float64
    product.

    >>> codes = np.sign(np.random.default_rng(0).standard_normal((5, 64))).astype(np.float32)
    >>> exact_in_float32(codes, codes, "euclidean"), exact_in_float32(codes, codes, "cosine")
    (True, False)
    >>> [exact_in_float32(codes * m, codes, "euclidean") for m in (300, 600)]
    [True, False]
    """
    if distance not in ("euclidean", "inner_product"):
        return False
    top_q = integer_magnitude(xq)
    top_x = None if top_q is None else top_q if xb is xq else integer_magnitude(xb)
    if top_x is None or max(top_q, top_x) > limit:  # (and no float overflow below)
        return False
    dim = int(xq.shape[1])
    worst = dim * (top_q + top_x) ** 2 if distance == "euclidean" else dim * top_q * top_x
    return worst <= limit


def exact_distance(xq: Any, xb: Any, distance: str) -> str | None:
    """The distance whose float32 keys of queries ``xq`` against references ``xb`` are exact
    and rank every query's references as ``distance`` does, or None: ``distance`` itself
    (:func:`exact_in_float32`), or ``"inner_product"`` for cosine when every row is non-zero
    and every reference has the same squared norm ``m`` (codes in ``{-1, 1}``).  Each side is
    read once.

    Cosine ranks by ``-sign(s) s**2 / m`` with ``s = q.x`` an integer; for one ``m`` that is
    the order of ``-s``, and two different integers ``s`` keep different float64 keys (their
    squares differ by at least ``2 |s| - 1``, far more than a float64 rounding of the
    quotient), so the ties are those of ``-s`` too.

    >>> codes = np.sign(np.random.default_rng(0).standard_normal((5, 64))).astype(np.float32)
    >>> exact_distance(codes, codes, "cosine"), exact_distance(codes, codes + 1, "cosine")
    ('inner_product', None)
    """
    if distance != "cosine":
        return distance if exact_in_float32(xq, xb, distance) else None
    # the references first: codes of several norms ({0, 1}) stop there, queries unread
    top_x = _integer_rows(xb, "one")
    top_q = None if top_x is None else top_x if xq is xb else _integer_rows(xq, "non-zero")
    if top_q is None or int(xq.shape[1]) * top_q * top_x > EXACT_LIMIT:
        return None
    return "inner_product"


def ranks_of_exact_keys(
    keys: np.ndarray, relevant: np.ndarray, magnitude: float | None = None
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """The 0-based ranks of the relevant references of rows of exact float32 ``keys`` (excluded
    pairs ``+inf``, never relevant): per row their number, the ranks row after row (each row's
    increasing), and the runs of equal keys mixing relevant and non-relevant references as
    :func:`embedeval.engine.kernels.hits_from_ranks` reads them (row, first and last rank of
    each run, per row the rank of its first pair of equal neighbours of different relevance).

    Each key becomes a code ``key << s | reference << 1 | relevant`` (:func:`_codes`; every
    finite key at most ``magnitude`` in size, when given; float64 keys, exact integers from a
    float64 product, need it): sorting a row of codes ranks it by key, equal keys by reference
    index, and the lowest bit shows where each relevant reference landed.

    >>> keys = np.array([[2.0, 1.0, 2.0, 0.0, 2.0]], np.float32)
    >>> n, ranks, runs = ranks_of_exact_keys(keys, np.array([[1, 0, 0, 0, 1]], bool))
    >>> n.tolist(), ranks.tolist(), [r.tolist() for r in runs]
    ([2], [2, 4], [[0], [2], [4], [2]])
    """
    b, n = keys.shape
    code, shift = _codes(keys, relevant, magnitude)
    code.sort(axis=1)
    flat = code.reshape(-1)
    step = code.itemsize
    at = np.flatnonzero((flat.view(np.uint8)[_low_byte(step) :: step] & np.uint8(1)).view(bool))
    row = at // n
    pos = at - row * n
    key = flat[at] >> shift
    tied = (pos > 0) & (flat[np.maximum(at - 1, 0)] >> shift == key)
    tied |= (pos < n - 1) & (flat[np.minimum(at + 1, flat.size - 1)] >> shift == key)
    runs = _mixed_runs(code, shift, (row[tied], pos[tied], key[tied]), b)
    return np.bincount(row, minlength=b), pos, runs


def _low_byte(itemsize: int) -> int:
    """Where the lowest byte of an unsigned integer of ``itemsize`` bytes lies in memory."""
    return 0 if np.little_endian else itemsize - 1


def _codes(
    keys: np.ndarray, relevant: np.ndarray, magnitude: float | None
) -> tuple[np.ndarray, np.unsignedinteger]:
    """Sortable codes ``key << shift | reference << 1 | relevant`` of a block of exact keys,
    and ``shift``.  Keys of a known ``magnitude`` (binary codes: a few hundred) are numbered
    ``key + t`` with ``t`` the first integer above ``magnitude`` (raised by ``2**-20`` against
    its own rounding), from 0 to ``2 t`` (excluded pairs: ``2 t``), in 32 bits where key,
    reference and flag fit, else in 64; float32 keys of no known magnitude take their sortable
    bits in 64.  Float64 keys (a float64 product of integers) must come with a magnitude that
    fits."""
    n = keys.shape[1]
    col_bits = max(int(n - 1).bit_length(), 1)
    exact_below = 2**22 if keys.dtype == np.float32 else 2**52  # top + top stays exact
    top = 0 if magnitude is None else int(magnitude * (1 + 2.0**-20)) + 1  # |key| < top
    width = int(2 * top).bit_length() + col_bits + 1
    if magnitude is not None and magnitude < exact_below and width <= 64:
        dtype = np.uint32 if width <= 32 else np.uint64
        number = np.minimum(keys, keys.dtype.type(top))  # excluded pairs become top
        number += keys.dtype.type(top)  # 0 .. 2 top, exact integers
        code, shift = number.astype(dtype), dtype(col_bits + 1)
    elif keys.dtype == np.float32:
        dtype = np.uint64
        code, shift = sortable_bits(keys).astype(dtype), dtype(32)
    else:
        raise ValueError("float64 keys need a magnitude whose codes fit in 64 bits")
    code <<= shift
    code |= np.arange(n, dtype=dtype) << dtype(1)
    code |= relevant
    return code, shift


def _mixed_runs(
    code: np.ndarray,
    shift: np.unsignedinteger,
    items: tuple[np.ndarray, np.ndarray, np.ndarray],
    b: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The runs of equal keys holding the tied relevant items (``items``: row, rank and key
    ``code >> shift``, in row and rank order) and some non-relevant reference, in the sorted
    rows ``code``: ``(row, first rank, last rank, per row the rank of the first pair of equal
    neighbours of different relevance)``."""
    row, pos, key = items
    first_mixed = np.full(b, np.iinfo(np.int64).max // 2)
    if not row.size:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty, first_mixed
    head = np.flatnonzero(np.append(True, (row[1:] != row[:-1]) | (key[1:] != key[:-1])))
    size = np.diff(np.append(head, row.size))
    r, k = row[head], key[head]
    one = code.dtype.type(1)
    first = rows_searchsorted(code, r, k << shift)
    stop = rows_searchsorted(code, r, (k + one) << shift)
    # The items leading the run without a gap: the first pair of different kinds follows them
    # (or, when the run starts with a non-relevant reference, precedes the first item).
    offset = pos - np.repeat(first - head, size) - np.arange(row.size)
    in_run = np.arange(row.size) - np.repeat(head, size)
    leading = np.minimum.reduceat(np.where(offset != 0, in_run, np.repeat(size, size)), head)
    pair = np.where(leading > 0, first + leading - 1, pos[head] - 1)
    mixed = stop - first > size
    r, first, last, pair = r[mixed], first[mixed], stop[mixed] - 1, pair[mixed]
    np.minimum.at(first_mixed, r, pair)
    return r, first, last, first_mixed
