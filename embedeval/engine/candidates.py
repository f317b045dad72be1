"""Sorted candidate rows: the data the search hands to the metric kernels.

A block of queries with their nearest references, sorted by ranking key and then by ascending
reference index, in CSR form (:class:`Candidates`), and the order-preserving bit form of the
float32 keys that makes an exact tie an equality of integers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "Candidates",
    "from_sortable_bits",
    "rows_searchsorted",
    "segment_searchsorted",
    "sortable_bits",
    "spans",
]


def spans(first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """``first[i], first[i] + 1, ..., first[i] + count[i] - 1`` for every ``i``, in turn: the
    places of ranges laid end to end (a ragged gather in one index array).

    >>> spans(np.array([5, 0]), np.array([2, 3])).tolist()
    [5, 6, 0, 1, 2]
    """
    ends = np.cumsum(count)
    return np.repeat(first - ends + count, count) + np.arange(int(ends[-1]) if ends.size else 0)


def sortable_bits(values: np.ndarray) -> np.ndarray:
    """Map float32 values to uint32 so that unsigned order equals float order (no NaN).

    -0.0 is mapped like +0.0, so values that compare equal get equal bits.
    """
    bits = (np.asarray(values, dtype=np.float32) + np.float32(0.0)).view(np.uint32)
    # Negative values: flip every bit; others: set the sign bit.  The arithmetic shift of the
    # int32 view gives all ones exactly for the negatives.
    flip = (bits.view(np.int32) >> np.int32(31)).view(np.uint32)
    flip |= np.uint32(0x80000000)
    flip ^= bits
    return flip


def rows_searchsorted(
    sorted_rows: np.ndarray, rows: np.ndarray, values: np.ndarray, right: bool = False
) -> np.ndarray:
    """For each ``values[i]``, the entries of row ``rows[i]`` of ``sorted_rows`` (each row
    ascending) below it (``right``: at or below it): ``np.searchsorted`` of every value in its
    own row at once.  A branch-free binary search: ``log2(width)`` steps, each one gather and
    one comparison per value, so nothing the size of ``sorted_rows`` is formed.  Floats
    compare as floats (``-0.0 == 0.0``).

    >>> r = np.array([[1, 3, 3, 5], [2, 4, 6, 8]])
    >>> rows_searchsorted(r, np.array([0, 0, 1, 1]), np.array([3, 9, 1, 6])).tolist()
    [1, 4, 0, 2]
    >>> rows_searchsorted(r, np.array([0, 0, 1, 1]), np.array([3, 9, 1, 6]), right=True).tolist()
    [3, 4, 0, 3]
    """
    n = sorted_rows.shape[1]
    flat = sorted_rows.ravel()
    base = np.asarray(rows, dtype=np.int64) * n - 1  # entry j of a row sits at base + j + 1
    pos = np.zeros(np.shape(values), dtype=np.int64)
    step = 1 << (n.bit_length() - 1) if n else 0
    while step:
        probe = pos + step  # entries pos .. probe - 1 are below the value when entry probe - 1 is
        entry = flat[base + np.minimum(probe, n)]
        ok = (entry <= values) if right else (entry < values)
        ok &= probe <= n
        pos += step * ok
        step >>= 1
    return pos


def segment_searchsorted(
    values: np.ndarray,
    first: np.ndarray,
    end: np.ndarray,
    targets: np.ndarray,
    right: bool = False,
) -> np.ndarray:
    """For each ``targets[i]``, the position in ``values[first[i]:end[i]]`` (a segment sorted
    ascending) where ``np.searchsorted`` would put it, counted from the start of ``values``
    (``right``: after the entries equal to it): one vectorised binary search over every
    segment at once, ``log2`` of the longest segment steps of one gather and one comparison.

    >>> v = np.array([1, 3, 3, 5, 2, 4])  # segments [1, 3, 3, 5] and [2, 4]
    >>> first, end = np.array([0, 4]), np.array([4, 6])
    >>> segment_searchsorted(v, first, end, np.array([3, 3])).tolist()
    [1, 5]
    >>> segment_searchsorted(v, first, end, np.array([3, 9]), right=True).tolist()
    [3, 6]
    """
    lo = np.array(first, dtype=np.int64)
    hi = np.array(end, dtype=np.int64)
    last = max(int(values.size) - 1, 0)
    while True:
        active = lo < hi
        if not active.any():
            return lo
        mid = (lo + hi) >> 1
        entry = values[np.minimum(mid, last)]
        up = (entry <= targets) if right else (entry < targets)
        up &= active
        lo = np.where(up, mid + 1, lo)
        hi = np.where(active & ~up, mid, hi)


def from_sortable_bits(bits: np.ndarray) -> np.ndarray:
    """Inverse of :func:`sortable_bits` (a new float32 array).

    >>> from_sortable_bits(sortable_bits(np.float32([-2.5, 0.0, 3.0]))).tolist()
    [-2.5, 0.0, 3.0]
    >>> float(from_sortable_bits(np.uint32(0xC0000000)))
    2.0
    """
    bits = np.asarray(bits, dtype=np.uint32)
    signed = bits.reshape(-1).view(np.int32)  # 1-d, so the steps below work in place
    # The sign bit set (a value >= 0): clear it; else flip every bit.  The arithmetic shift
    # of the int32 view gives all ones exactly where it is set.
    flip = signed >> np.int32(31)
    np.invert(flip, out=flip)
    flip |= np.int32(-(2**31))
    flip ^= signed
    return flip.view(np.float32).reshape(bits.shape)


@dataclass(frozen=True)
class Candidates:
    """One block of queries with their nearest references, sorted, in CSR form.

    ``queries[i]`` (a global query index) owns ``index[lims[i]:lims[i+1]]`` (reference indices,
    nearest first) with ranking keys ``bits`` (:func:`sortable_bits` of the float32 key, so equal
    bits mean an exact tie).  This is faiss's ``(lims, D, I)`` layout for variable-depth results.
    """

    queries: np.ndarray
    lims: np.ndarray
    index: np.ndarray
    bits: np.ndarray

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.lims)

    def keys(self) -> np.ndarray:
        """The float32 ranking keys (smaller = nearer)."""
        return from_sortable_bits(self.bits)
