"""Memory-mapped inputs read without staying in the process's memory.

A page of a memory-mapped ``.npy`` file that the process has read counts in its resident memory
until the mapping goes, even though the kernel may drop it at any time (the file holds it).
Under a memory limit (a cgroup) those pages are charged to the process, so a pass over a corpus
larger than the limit must give back what it read as it goes: :func:`release_pages` after each
block, :func:`row_blocks` to read a matrix that way, :func:`gather_rows` for chosen rows.
Anything that is not a memory map is read as usual and nothing is released.
"""

from __future__ import annotations

import itertools
import mmap
from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = ["gather_rows", "release_pages", "row_blocks"]


def release_pages(x: Any, start: int, stop: int) -> None:
    """Unmap rows ``start:stop`` of a memory-mapped array from this process once read: they
    stay in the page cache (the kernel keeps or drops them) but no longer count in the
    process's resident memory.  A reader of another type (one with a ``stored`` map): its map.
    Anything else, and a copy-on-write map (``mmap_mode="c"``, whose pages may hold the
    caller's changes, which releasing would discard): nothing.

    >>> release_pages(np.zeros((4, 2)), 0, 4)  # not a memory map: nothing to release
    """
    x = getattr(x, "stored", x)
    mm = getattr(x, "_mmap", None)
    shared = getattr(x, "mode", None) in ("r", "r+", "w+")  # pages the file holds
    if mm is None or not shared or not x.flags.c_contiguous or stop <= start:
        return
    try:
        base = np.frombuffer(mm, dtype=np.uint8).ctypes.data
        lo = x[start:stop].ctypes.data - base
        hi = lo + (stop - start) * x.strides[0]
        page = mmap.PAGESIZE
        lo, hi = -(-lo // page) * page, hi // page * page  # whole pages of these rows only
        if hi > lo:
            mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
    except (AttributeError, BufferError, OSError, ValueError):  # pragma: no cover
        pass  # only a memory saving


def row_blocks(x: Any, bounds: list[tuple[int, int]]) -> Iterator[Any]:
    """``x[a:b]`` for each ``(a, b)`` of ``bounds`` (as ``x`` slices them: a tensor stays a
    tensor); a memory map's pages are released once the caller asks for the next block.

    >>> [b.tolist() for b in row_blocks(np.arange(6).reshape(3, 2), [(0, 2), (2, 3)])]
    [[[0, 1], [2, 3]], [[4, 5]]]
    """
    for a, b in bounds:
        yield x[a:b]
        release_pages(x, a, b)


def gather_rows(
    x: Any, rows: np.ndarray, dtype: Any = np.float32, span: int = 1 << 26
) -> np.ndarray:
    """A copy of rows ``rows`` (sorted) of ``x`` in ``dtype``, gathered from one window of at
    most ``span`` bytes of rows at a time, a memory map's pages released after each: the
    kernel maps pages around every page read, so a sample spread over a whole file would
    otherwise bring in most of it (measured: 4,096 rows of a 1.5 GB file, 1.5 GB resident).

    >>> gather_rows(np.arange(6).reshape(3, 2), np.array([0, 2])).tolist()
    [[0.0, 1.0], [4.0, 5.0]]
    """
    out = np.empty((rows.size, *x.shape[1:]), dtype=dtype)
    row_bytes = max(1, int(np.prod(x.shape[1:], dtype=np.int64)) * np.dtype(x.dtype).itemsize)
    window = max(1, span // row_bytes)
    cuts = np.searchsorted(rows, np.arange(0, int(x.shape[0]) + window, window))
    for i, j in itertools.pairwise(cuts):
        if j > i:
            out[i:j] = x[rows[i:j]]
            release_pages(x, int(rows[i]), int(rows[j - 1]) + 1)
    return out
