"""Sharded exact search: the reference in pieces (memory-mapped files larger than RAM included),
merged exactly, bit-identical to the local engine.

Algorithm (one read of each shard):

1. Per query block, the depth threshold tau is computed exactly as the local engine does (same
   seeded column subsample of the *global* reference, same product shape), so it is the same
   float32 number.
2. Each shard, loaded once, collects for every query block every valid reference with key
   <= tau, in the engine's 2048-column tiles on the global column grid (shards are aligned to
   that grid), and packs it with its *global* column index.  The union over shards is exactly
   the local engine's candidate set: same keys, same ties, same tie order after the sort.
3. A query whose union came out short of its depth (the subsample margin failed, rare) is
   redone with every valid reference of every shard.
4. The merged, sorted rows are scored by the same kernels.

Candidates wait for the last shard, so queries go in super-blocks (whole engine blocks) sized
by the memory budget; each super-block reads every shard once.

For ``map`` / ``mrr`` with ``k=None`` every reference up to the farthest (nearest) same-label
reference is needed: a first pass over the shards finds that global per-query key, and the
collection threshold is raised to it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from ._engine import RetrievalTask, run_local
from ._errors import FileFormatError, InputError, InputTypeError
from ._progress import progress_bar
from ._scale import engine_layout, group_exclusions
from ._symmetric import symmetric_view
from ._validation import check_int
from .knn import (
    _FMAX,
    _TILE,
    DEFAULT_MEMORY_BUDGET,
    Exclusions,
    PreparedSearch,
    _collect,
    _depth_thresholds,
    _sort_block,
    column_subsample,
    single_threaded_blas,
    sortable_bits,
)

__all__ = ["ShardedReference", "run_sharded"]

_ALIGN = _TILE  # shard boundaries on the engine's column-tile grid


class ShardedReference:
    """The reference as a list of row blocks (arrays or memory-mapped ``.npy`` files).

    Rows ``[a, b)`` of the concatenation are read with :meth:`rows`, copying only that window.
    """

    def __init__(self, pieces: list[Any], dim: int, n_rows: int) -> None:
        arrays = [_open_piece(p, i, dim) for i, p in enumerate(pieces)]
        sizes = np.array([a.shape[0] for a in arrays], dtype=np.int64)
        if int(sizes.sum()) != n_rows:
            raise InputError(
                f"shards hold {int(sizes.sum())} rows in total ({sizes.tolist()}) but the "
                f"reference has {n_rows}; the shards, concatenated in order, must be the "
                "reference."
            )
        self.arrays = arrays
        self.offsets = np.concatenate(([0], np.cumsum(sizes)))
        self.largest = int(sizes.max())

    def rows(self, a: int, b: int) -> np.ndarray:
        parts = []
        for i, arr in enumerate(self.arrays):
            lo, hi = max(a, self.offsets[i]), min(b, self.offsets[i + 1])
            if lo < hi:
                parts.append(arr[lo - self.offsets[i] : hi - self.offsets[i]])
        out = np.ascontiguousarray(
            parts[0] if len(parts) == 1 else np.concatenate(parts), dtype=np.float32
        )
        finite = np.isfinite(out).all(axis=1)
        if not finite.all():
            bad = np.flatnonzero(~finite)
            raise InputError(
                f"shards have NaN or infinite values in {bad.size} row(s) of reference rows "
                f"{a}..{b - 1}, first at reference row {a + int(bad[0])}; repair them."
            )
        return out


def _open_piece(piece: Any, i: int, dim: int) -> np.ndarray:
    if isinstance(piece, (str, os.PathLike)):
        path = os.fspath(piece)
        if not path.endswith(".npy"):
            raise FileFormatError(
                f"shards[{i}]={path!r} is not a .npy file; shards may be arrays or .npy paths "
                "(memory-mapped, never unpickled)."
            )
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except FileNotFoundError as exc:
            raise FileFormatError(f"shards[{i}]: no such file {path!r}.") from exc
        except ValueError as exc:
            raise FileFormatError(
                f"shards[{i}]={path!r} cannot be memory-mapped without unpickling ({exc}); save "
                "it with np.save(path, float32_array)."
            ) from exc
    elif isinstance(piece, np.ndarray):
        arr = piece
    else:
        raise InputTypeError(
            f"shards[{i}] must be a numpy array or a .npy path; got {type(piece).__name__}."
        )
    if arr.dtype.kind not in "fiu":
        raise InputTypeError(f"shards[{i}] must be numeric; got dtype {arr.dtype}.")
    if arr.ndim != 2 or arr.shape[1] != dim or arr.shape[0] == 0:
        raise InputError(
            f"shards[{i}] must have shape (n_rows > 0, {dim}) like the reference; got {arr.shape}."
        )
    return arr


def shard_bounds(n_ref: int, shards: Any, source: ShardedReference | None) -> list[tuple[int, int]]:
    """Shard boundaries on the engine's tile grid (multiples of 2048 rows).

    An int asks for that many shards of equal size, rounded up to the grid; a list of pieces
    gives shards as large as the largest piece.  References of at most 16 tiles (32,768 rows)
    are searched by the engine in whole-row products, so they stay one shard.
    """
    if n_ref <= 16 * _TILE:
        return [(0, n_ref)]
    if source is None:
        per = -(-n_ref // shards)
    else:
        per = source.largest
    per = max(_ALIGN, -(-per // _ALIGN) * _ALIGN)
    return [(a, min(a + per, n_ref)) for a in range(0, n_ref, per)]


def run_sharded(
    task: RetrievalTask,
    shards: Any,
    *,
    block_size: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    progress: bool | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Exact per-query values and tie flags, reading the reference one shard at a time."""
    # The engine multiplies with one BLAS thread per product; so must the shards, to get its keys.
    with single_threaded_blas():
        return _run_sharded(
            task, shards, block_size=block_size, memory_budget=memory_budget, progress=progress
        )


def _run_sharded(
    task: RetrievalTask,
    shards: Any,
    *,
    block_size: int | None,
    memory_budget: int,
    progress: bool | None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    n_ref, dim = int(task.reference.shape[0]), int(task.reference.shape[1])
    source = None
    if isinstance(shards, (list, tuple)):
        if not shards:
            raise InputError("shards is an empty list; pass an int or at least one array/path.")
        source = ShardedReference(list(shards), dim, n_ref)
    else:
        shards = check_int(shards, "shards")
    values, ties = task.empty_outputs()
    if not task.metrics or not (task.relevant > 0).any():
        return values, ties
    layout = engine_layout(task, block_size, memory_budget)
    bounds = shard_bounds(n_ref, shards, source)

    def read(a: int, b: int) -> np.ndarray:
        if source is not None:
            rows = source.rows(a, b)
            return np.ldexp(rows, task.scale, dtype=np.float32) if task.scale else rows
        return np.ascontiguousarray(task.reference[a:b], dtype=np.float32)

    if len(bounds) == 1:  # a reference of at most 16 tiles: the engine's whole-row products
        whole = task if source is None else dataclasses.replace(task, reference=read(0, n_ref))
        return run_local(
            whole, block_size=block_size, memory_budget=memory_budget, progress=progress
        )
    groups = group_exclusions(task)
    need = layout.need
    n_query, bsz, col_bits = task.n_query, layout.block_size, layout.col_bits
    counts = np.zeros(n_query, dtype=np.int64)
    tau = _thresholds(task, read, layout, memory_budget)
    if layout.threshold is not None:
        floor = _label_thresholds(task, read, bounds, groups, layout, memory_budget)
        tau = np.maximum(tau, floor)
    tau[need <= 0] = -np.inf
    tile = _TILE if n_ref > 16 * _TILE else n_ref
    # Candidates of every query wait for the last shard, so queries go in super-blocks (whole
    # engine blocks) whose candidates fit the budget: full-depth AP keeps most of each ranking.
    per_query = 8 * (n_ref if layout.threshold == "max" else 2 * int(need.mean()) + 64)
    supers = _super_blocks(n_query, bsz, per_query, memory_budget)
    with progress_bar(len(bounds) * len(supers), "shard passes", enabled=progress) as bar:
        for q0, q1 in supers:
            starts = range(q0, q1, bsz)
            parts: list[list[np.ndarray]] = [[] for _ in starts]
            for a, b in bounds:
                search, ex = _shard_search(task, read(a, b), groups, a, b, layout)
                width = min(tile, b - a)
                keys_buffer = np.empty(min(bsz, q1 - q0) * width, dtype=np.float32)
                mask_buffer = np.empty(keys_buffer.size, dtype=bool)
                for i, start in enumerate(starts):
                    stop = min(start + bsz, q1)
                    codes, c = _collect(
                        search,
                        start,
                        stop,
                        tau[start:stop],
                        width,
                        keys_buffer,
                        mask_buffer,
                        ex,
                        None,
                        col_bits,
                    )
                    codes += np.uint64(a)  # global reference index (a + col < 2**col_bits)
                    parts[i].append(codes)
                    counts[start:stop] += c
                del search
                bar.update(1)
            short = np.flatnonzero(counts[q0:q1] < need[q0:q1]) + q0
            if short.size:
                _redo_short(
                    task, read, bounds, groups, short, parts, counts, layout, memory_budget, q0
                )
            for i, start in enumerate(starts):
                stop = min(start + bsz, q1)
                codes = np.concatenate(parts[i])
                parts[i] = []
                block = _sort_block(codes, counts[start:stop], start, col_bits, False)
                chunk_values, chunk_ties = task.score_block(block)
                for name in chunk_values:
                    values[name][start:stop] = chunk_values[name]
                    ties[name][start:stop] = chunk_ties[name]
    return values, ties


def _super_blocks(
    n_query: int, block_size: int, per_query: int, memory_budget: int
) -> list[tuple[int, int]]:
    """Query ranges of whole engine blocks whose candidates take about 4 x the budget."""
    step = max(1, (4 * memory_budget) // max(1, block_size * per_query)) * block_size
    return [(s, min(s + step, n_query)) for s in range(0, n_query, step)]


def _shard_search(
    task: RetrievalTask,
    xb: np.ndarray,
    groups: tuple[np.ndarray, np.ndarray] | None,
    a: int,
    b: int,
    layout: Any,
) -> tuple[PreparedSearch, Exclusions]:
    search = PreparedSearch.build(task.query, xb, task.distance).with_duplicates(
        layout.duplicates, layout.representatives, slice(a, b)
    )
    # Leave-one-out: the symmetric engine's canonical keys (embedeval._symmetric).
    search = symmetric_view(task, search, layout.threshold, layout.duplicates, col_offset=a)
    if groups is None:
        return search, Exclusions()
    return search, Exclusions(query_groups=groups[0], reference_groups=groups[1][a:b])


class _SubsampleSearch:
    """Looks like the engine's PreparedSearch to ``_depth_thresholds`` but holds only the
    subsample columns (a gathered copy gives the same float32 keys as the engine's view)."""

    def __init__(self, prepared: PreparedSearch, n_reference: int) -> None:
        self.prepared = prepared
        self.n_reference = n_reference

    def keys(self, rows: slice, cols: Any = None) -> np.ndarray:
        return self.prepared.keys(rows)


def _thresholds(task: RetrievalTask, read: Any, layout: Any, memory_budget: int) -> np.ndarray:
    """The local engine's per-query depth thresholds (same subsample, same product shapes)."""
    n_ref = int(task.reference.shape[0])
    need = layout.need
    tau = np.full(task.n_query, _FMAX, dtype=np.float32)
    subsample = column_subsample(need, n_ref)
    if subsample is None:
        return tau
    gathered = _gather_rows(read, subsample)
    prepared = PreparedSearch.build(task.query, gathered, task.distance).with_duplicates(
        layout.duplicates, layout.representatives, subsample
    )
    search = _SubsampleSearch(prepared, n_ref)
    for start in range(0, task.n_query, layout.block_size):
        stop = min(start + layout.block_size, task.n_query)
        tau[start:stop] = _depth_thresholds(
            search, start, stop, need[start:stop], subsample, task.exclusions
        )
    return tau


def _gather_rows(read: Any, rows: np.ndarray) -> np.ndarray:
    """Rows ``rows`` (sorted) of the reference, reading runs of adjacent rows only."""
    cuts = np.flatnonzero(np.diff(rows) > 1) + 1
    return np.concatenate(
        [read(int(run[0]), int(run[-1]) + 1) for run in np.split(rows, cuts)], axis=0
    )


def _label_thresholds(
    task: RetrievalTask,
    read: Any,
    bounds: list[tuple[int, int]],
    groups: tuple[np.ndarray, np.ndarray] | None,
    layout: Any,
    memory_budget: int,
) -> np.ndarray:
    """Global key of the farthest ("max") or nearest ("min") valid same-label reference."""
    how = layout.threshold
    n_query = task.n_query
    out = np.full(n_query, -np.inf if how == "max" else np.inf, dtype=np.float32)
    for a, b in bounds:
        search, _ = _shard_search(task, read(a, b), None, a, b, layout)
        r_codes = task.reference_codes[a:b]
        # The engine's query blocks: the same product shapes give the same float32 keys.
        step = layout.block_size
        for start in range(0, n_query, step):
            stop = min(start + step, n_query)
            keys = _tiled(search, slice(start, stop), stop - start)
            positive = r_codes[None, :] == task.query_codes[start:stop, None]
            if groups is not None:
                positive &= groups[1][None, a:b] != groups[0][start:stop, None]
            if how == "max":
                best = np.where(positive, keys, -np.inf).max(axis=1)
                np.maximum(out[start:stop], best, out=out[start:stop])
            else:
                best = np.where(positive, keys, np.inf).min(axis=1)
                np.minimum(out[start:stop], best, out=out[start:stop])
    out[~np.isfinite(out)] = -np.inf
    return out


def _redo_short(
    task: RetrievalTask,
    read: Any,
    bounds: list[tuple[int, int]],
    groups: tuple[np.ndarray, np.ndarray] | None,
    short: np.ndarray,
    parts: list[list[np.ndarray]],
    counts: np.ndarray,
    layout: Any,
    memory_budget: int,
    q0: int = 0,
) -> None:
    """Replace the candidates of ``short`` queries by every valid reference of every shard
    (``parts[i]`` holds the block starting at query ``q0 + i * block_size``)."""
    bsz, col_bits = layout.block_size, layout.col_bits
    row_shift = np.uint64(32 + col_bits)
    by_block: dict[int, np.ndarray] = {}
    for q in short:
        by_block.setdefault((int(q) - q0) // bsz, [])
    for i in by_block:
        start = q0 + i * bsz
        rows = short[(short >= start) & (short < start + bsz)] - start
        by_block[i] = rows
        codes = np.concatenate(parts[i])
        parts[i] = [codes[~np.isin(codes >> row_shift, rows.astype(np.uint64))]]
        counts[start + rows] = 0
    for a, b in bounds:
        search, ex = _shard_search(task, read(a, b), groups, a, b, layout)
        for i, rows in by_block.items():
            start = q0 + i * bsz
            codes, c = _all_valid(search, start, rows, ex, col_bits)
            codes += np.uint64(a)
            parts[i].append(codes)
            counts[start + rows] += c


def _tiled(search: PreparedSearch, rows: slice | np.ndarray, n_rows: int) -> np.ndarray:
    """Keys of ``rows`` against the whole shard, in the engine's tile products."""
    n = search.n_reference
    out = np.empty((n_rows, n), dtype=np.float32)
    for c0 in range(0, n, _TILE):
        out[:, c0 : c0 + _TILE] = search.keys(rows, slice(c0, c0 + _TILE))
    return out


def _all_valid(
    search: PreparedSearch, start: int, rows: np.ndarray, ex: Exclusions, col_bits: int
) -> tuple[np.ndarray, np.ndarray]:
    """Packed codes (block row, key bits, shard column) of every valid reference of ``rows``."""
    n = search.n_reference
    keys = _tiled(search, start + rows, rows.size)
    r = np.repeat(rows, n)
    c = np.tile(np.arange(n, dtype=np.int64), rows.size)
    v = keys.ravel()
    excluded = ex.excluded(r + start, c)
    if excluded is not None:
        r, c, v = r[~excluded], c[~excluded], v[~excluded]
    code = sortable_bits(v).astype(np.uint64) << np.uint64(col_bits)
    code |= r.astype(np.uint64) << np.uint64(32 + col_bits)
    code |= c.astype(np.uint64)
    return code, np.bincount(r, minlength=rows.max() + 1)[rows]
