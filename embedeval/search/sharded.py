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
collection threshold is raised to it.  Such a deep ranking would keep nearly every key of every
row as a candidate, so the rankings the local engine gives its deep engine are not merged that
way: per super-block of queries (their whole rows of float32 keys in about the memory budget),
each shard is read once and its keys written into the rows' columns, and the local deep engine
ranks the rows (:class:`~embedeval.engine.deep.KeyedSearch`: each rank decided in float64, so the
values are the unsharded ones, though the keys come from other product shapes).  Where a
float64 copy of the reference fits the memory budget, the shards are read as one reference and
searched by the local engine directly (:func:`deep_fits_in_memory`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..engine.decide import FLOAT64_MAX_DIM, task_norms
from ..engine.deep import KeyedSearch, deep_applies
from ..engine.exact import (
    KEY_MAX,
    TILE,
    EnginePlan,
    PreparedSearch,
    all_valid_codes,
    collect,
    finish_label_cutoff,
    grid_keys,
    label_cutoff,
    on_column_grid,
    refuse_zero_rows,
    sample_thresholds,
    sort_block,
    tie_representatives,
)
from ..engine.symmetric import symmetric_view
from ..engine.task import RetrievalTask, ScoredBlock, engine_plan
from ..engine.threads import in_order, single_threaded_blas
from ..utils.errors import FileFormatError, InputError, InputTypeError
from ..utils.progress import progress_bar
from ..utils.validation import refuse_object_array
from .local import local_blocks, with_exact_keys

__all__ = ["ShardedReference", "deep_fits_in_memory", "open_piece", "search", "shard_bounds"]

_ALIGN = TILE  # shard boundaries on the engine's column-tile grid

#: Reads reference rows ``[a, b)`` as float32 (scaled like the task's reference).
Reader = Callable[[int, int], np.ndarray]


class ShardedReference:
    """The reference as a list of row blocks (arrays or memory-mapped ``.npy`` files).

    Rows ``[a, b)`` of the concatenation are read with :meth:`rows`, copying only that window.
    """

    def __init__(self, pieces: list[Any], dim: int, n_rows: int) -> None:
        arrays = [open_piece(p, i, dim) for i, p in enumerate(pieces)]
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


def open_piece(piece: Any, i: int, dim: int) -> np.ndarray:
    """``shards[i]``: an array, or a ``.npy`` path memory-mapped (never unpickled), checked
    numeric, 2-D, non-empty and of dimension ``dim``."""
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
    refuse_object_array(arr, f"shards[{i}]", "pass a numeric (n_rows, dim) array.")
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
    if not on_column_grid(n_ref):
        return [(0, n_ref)]
    if source is None:
        per = -(-n_ref // shards)
    else:
        per = source.largest
    per = max(_ALIGN, -(-per // _ALIGN) * _ALIGN)
    return [(a, min(a + per, n_ref)) for a in range(0, n_ref, per)]


def search(task: RetrievalTask, options: Any) -> Iterator[ScoredBlock]:
    """The sharded backend's entry point (see :mod:`embedeval.search.dispatch`): exact scored
    blocks,
    reading the reference one shard at a time."""
    n_ref, dim = int(task.reference.shape[0]), int(task.reference.shape[1])
    shards = options.shards
    source = None
    if isinstance(shards, (list, tuple)):
        source = ShardedReference(list(shards), dim, n_ref)
    if not task.has_work:
        return

    def read(a: int, b: int) -> np.ndarray:
        if source is not None:
            rows = source.rows(a, b)
            rows = np.ldexp(rows, task.scale, dtype=np.float32) if task.scale else rows
            return rows if task.centre is None else np.subtract(rows, task.centre)
        return np.ascontiguousarray(task.reference[a:b], dtype=np.float32)

    if source is not None:
        _check_pieces(source, read, task.reference)
    bounds = shard_bounds(n_ref, shards, source)
    # a reference of at most 16 tiles: the engine's whole-row products; a deep ranking whose
    # reference fits the budget: the local deep engine (the shards' lists would hold it all)
    if len(bounds) == 1 or deep_fits_in_memory(task, options.memory_budget):
        whole = task if source is None else dataclasses.replace(task, reference=read(0, n_ref))
        yield from local_blocks(
            whole,
            block_size=options.block_size,
            memory_budget=options.memory_budget,
            progress=options.progress,
            n_threads=options.n_threads,
        )
        return
    if task.distance == "cosine":  # zero rows named by their reference row, not a shard's
        refuse_zero_rows(task_norms(task).ref_sq, "reference")
    # small integers (binary codes): exact keys, as the local engine takes them (the rows
    # checked are those multiplied: a list of pieces is read through ``read``)
    task = with_exact_keys(task, None if source is None else _ReadRows(read, n_ref, dim))
    # The engine multiplies with one BLAS thread per product; so must the shards, to get its keys.
    with single_threaded_blas():
        if deep_applies(task):  # full-depth rankings: whole rows of keys, the deep engine
            yield from _sharded_deep_blocks(task, read, bounds, options)
        else:
            yield from _sharded_blocks(task, read, bounds, options)


def _check_pieces(source: ShardedReference, read: Reader, reference: Any) -> None:
    """Refuse shards that are not the reference's rows in order, from the first, middle and last
    row of each (the engine reads the shards' rows but decides near-ties from the reference's,
    so pieces in another order or from another file would give silently wrong numbers)."""
    for i in range(len(source.arrays)):
        a, b = int(source.offsets[i]), int(source.offsets[i + 1])
        for r in sorted({a, (a + b) // 2, b - 1}):
            want = np.asarray(reference[r : r + 1], dtype=np.float32)
            if not np.array_equal(read(r, r + 1), want):
                raise InputError(
                    f"shards[{i}] row {r - a} differs from reference row {r}; the shards, "
                    "concatenated in order, must hold the reference's rows (same files, same "
                    "order)."
                )


def deep_fits_in_memory(task: RetrievalTask, memory_budget: int) -> bool:
    """Whether the shards are read as one reference for a deep ranking (full-depth ``map`` /
    ``minp``, which :func:`~embedeval.engine.deep.deep_applies` gives the local deep engine):
    when a float64 copy of the reference takes at most ``memory_budget``.

    Sharding exists to bound memory, and a deep ranking gains nothing from it: read shard by
    shard, each super-block of queries multiplies every shard again and assembles its rows of
    keys (:func:`_sharded_deep_blocks`), where the whole reference is multiplied in place."""
    n_ref, dim = (int(n) for n in task.reference.shape)
    return 8 * n_ref * dim <= memory_budget and deep_applies(task)


class _ReadRows:
    """Reference rows read through a :data:`Reader`, sliced like an array (row ranges)."""

    def __init__(self, read: Reader, n_rows: int, dim: int) -> None:
        self.read, self.shape = read, (n_rows, dim)

    def __getitem__(self, rows: slice) -> np.ndarray:
        a, b, _ = rows.indices(self.shape[0])
        return self.read(a, b)


def _sharded_blocks(
    task: RetrievalTask, read: Reader, bounds: list[tuple[int, int]], options: Any
) -> Iterator[ScoredBlock]:
    plan = engine_plan(task, options.block_size, options.memory_budget)
    n_query, n_ref, need = task.n_query, int(task.reference.shape[0]), plan.need
    tau = _thresholds(task, read, plan)
    if plan.threshold is not None:
        tau = np.maximum(tau, _label_thresholds(task, read, bounds, plan))
    tau[need <= 0] = -np.inf
    counts = np.zeros(n_query, dtype=np.int64)
    # Candidates of every query wait for the last shard, so queries go in super-blocks (whole
    # engine blocks) whose candidates fit the budget: full-depth AP keeps most of each ranking.
    per_query = 8 * (n_ref if plan.threshold == "max" else 2 * int(need.mean()) + 64)
    supers = _super_blocks(n_query, plan.block_size, per_query, options.memory_budget)
    with progress_bar(len(bounds) * len(supers), "shard passes", enabled=options.progress) as bar:
        for q0, q1 in supers:
            parts = _collect_shards(task, read, bounds, plan, tau, counts, (q0, q1), bar)
            short = np.flatnonzero(counts[q0:q1] < need[q0:q1]) + q0
            if short.size:
                _redo_short(task, read, bounds, plan, short, parts, counts, q0)
            for i, start in enumerate(range(q0, q1, plan.block_size)):
                stop = min(start + plan.block_size, q1)
                codes = np.concatenate(parts[i])
                parts[i] = []
                yield task.scored(
                    sort_block(codes, counts[start:stop], start, plan.col_bits, False)
                )


def _sharded_deep_blocks(
    task: RetrievalTask, read: Reader, bounds: list[tuple[int, int]], options: Any
) -> Iterator[ScoredBlock]:
    """A deep ranking (:func:`~embedeval.engine.deep.deep_applies`) read shard by shard: per
    super-block of queries (its whole rows of float32 keys within about the memory budget),
    each shard once, its keys written into the rows' columns, then the local deep engine on
    those rows (:class:`~embedeval.engine.deep.KeyedSearch`; each rank decided in float64,
    near misses re-scored from the task's reference rows).  Keys from a float64 product
    (rounded once) where ``d`` allows, as the local deep engine takes them."""
    plan = engine_plan(task, options.block_size, options.memory_budget)
    n_query, n_ref, dim = task.n_query, int(task.reference.shape[0]), int(task.reference.shape[1])
    precision = "exact" if task.precision == "exact" else "float64"
    precision = "float32" if dim > FLOAT64_MAX_DIM else precision
    keyed = KeyedSearch(task, plan, precision)
    # identical rows share their representative's key, prepared at the keys' precision
    reps = tie_representatives(plan, task.reference, task.distance, precision)
    supers = _super_blocks(n_query, plan.block_size, 16 * n_ref, options.memory_budget)
    with progress_bar(len(bounds) * len(supers), "shard passes", enabled=options.progress) as bar:
        for q0, q1 in supers:
            keys = np.empty((q1 - q0, n_ref), dtype=np.float32)
            for a, b in bounds:
                search = PreparedSearch.build(
                    task.query[q0:q1], read(a, b), task.distance, plan.reference_sq, precision
                ).with_duplicates(plan.duplicates, reps, slice(a, b))
                _shard_keys(search, keys[:, a:b], plan.block_size, options.n_threads)
                bar.update(1)
            rows_of = functools.partial(_key_rows, keys, q0)
            yield from keyed.blocks(slice(q0, q1), rows_of, options.n_threads)


def _shard_keys(search: Any, out: np.ndarray, size: int, n_threads: int | None) -> None:
    """Every key of a shard's ``search`` (its queries against its rows) into ``out``, blocks of
    ``size`` queries multiplied by ``n_threads`` threads (one BLAS thread each)."""

    def block(s: int) -> None:
        rows = slice(s, min(s + size, out.shape[0]))
        out[rows] = grid_keys(search, rows, 0, out.shape[1], tiled=True)

    for _ in in_order(block, range(0, out.shape[0], size), n_threads):
        pass


def _key_rows(keys: np.ndarray, q0: int, rows: slice) -> np.ndarray:
    """Rows ``rows`` (global query indices) of a super-block's ``keys`` from query ``q0``."""
    return keys[rows.start - q0 : rows.stop - q0]


def _collect_shards(
    task: RetrievalTask,
    read: Reader,
    bounds: list[tuple[int, int]],
    plan: EnginePlan,
    tau: np.ndarray,
    counts: np.ndarray,
    queries: tuple[int, int],
    bar: Any,
) -> list[list[np.ndarray]]:
    """Each engine block of the ``queries`` range: its candidates' codes from every shard
    (global reference indices), in shard order; ``counts`` gets their number per query."""
    q0, q1 = queries
    starts = range(q0, q1, plan.block_size)
    parts: list[list[np.ndarray]] = [[] for _ in starts]
    for a, b in bounds:
        width = min(TILE, b - a)
        shard = dataclasses.replace(_shard_plan(task, read, a, b, plan), tile=width, threshold=None)
        keys_buffer = np.empty(min(plan.block_size, q1 - q0) * width, dtype=np.float32)
        mask_buffer = np.empty(keys_buffer.size, dtype=bool)
        for i, start in enumerate(starts):
            stop = min(start + plan.block_size, q1)
            codes, c = collect(shard, start, stop, tau[start:stop], keys_buffer, mask_buffer)
            codes += np.uint64(a)  # global reference index (a + col < 2**col_bits)
            parts[i].append(codes)
            counts[start:stop] += c
        del shard
        bar.update(1)
    return parts


def _super_blocks(
    n_query: int, block_size: int, per_query: int, memory_budget: int
) -> list[tuple[int, int]]:
    """Query ranges of whole engine blocks whose candidates take about 4 x the budget."""
    step = max(1, (4 * memory_budget) // max(1, block_size * per_query)) * block_size
    return [(s, min(s + step, n_query)) for s in range(0, n_query, step)]


def _shard_plan(task: RetrievalTask, read: Reader, a: int, b: int, plan: EnginePlan) -> EnginePlan:
    """``plan`` searching the task's queries in reference rows ``[a, b)`` (exclusions and label
    codes of those columns, identical references tied by their global groups)."""
    codes = None if plan.reference_codes is None else plan.reference_codes[a:b]
    shard = plan.searching(task.query, read(a, b), slice(a, b), task.precision)
    # Leave-one-out: the symmetric engine's canonical keys (embedeval.engine.symmetric).
    search = symmetric_view(task, shard.search, plan.threshold, plan.duplicates, col_offset=a)
    return dataclasses.replace(
        shard,
        search=search,
        exclusions=plan.exclusions.for_references(slice(a, b)),
        reference_codes=codes,
    )


def _thresholds(task: RetrievalTask, read: Reader, plan: EnginePlan) -> np.ndarray:
    """The local engine's per-query depth thresholds (same subsample, same product shapes),
    reading only the subsample's rows of the reference."""
    tau = np.full(task.n_query, KEY_MAX, dtype=np.float32)
    if plan.subsample is None:
        return tau
    # A gathered copy of the subsample columns gives the same float32 keys as the engine's view.
    sample = plan.searching(
        task.query, _gather_rows(read, plan.subsample), plan.subsample, task.precision
    )
    n_ref = int(task.reference.shape[0])
    for start in range(0, task.n_query, plan.block_size):
        stop = min(start + plan.block_size, task.n_query)
        tau[start:stop] = sample_thresholds(
            functools.partial(sample.search.keys, slice(start, stop)),
            start,
            plan.need[start:stop],
            plan.subsample,
            n_ref,
            plan.exclusions,
        )
    return tau


def _gather_rows(read: Reader, rows: np.ndarray) -> np.ndarray:
    """Rows ``rows`` (sorted) of the reference, reading runs of adjacent rows only."""
    cuts = np.flatnonzero(np.diff(rows) > 1) + 1
    return np.concatenate(
        [read(int(run[0]), int(run[-1]) + 1) for run in np.split(rows, cuts)], axis=0
    )


def _label_thresholds(
    task: RetrievalTask, read: Reader, bounds: list[tuple[int, int]], plan: EnginePlan
) -> np.ndarray:
    """Global key of the farthest ("max") or nearest ("min") valid same-label reference: the
    engine's :func:`~embedeval.engine.exact.label_cutoff` of each shard, combined."""
    n_query = task.n_query
    out = np.full(n_query, -np.inf if plan.threshold == "max" else np.inf, dtype=np.float32)
    combine = np.maximum if plan.threshold == "max" else np.minimum
    for a, b in bounds:
        shard = _shard_plan(task, read, a, b, plan)
        # The engine's query blocks: the same product shapes give the same float32 keys.
        for start in range(0, n_query, plan.block_size):
            stop = min(start + plan.block_size, n_query)
            keys = grid_keys(shard.search, slice(start, stop), 0, b - a, tiled=True)
            shard.exclusions.hide(keys, np.arange(start, stop), 0)
            best = label_cutoff(shard, keys, start, stop, final=False)
            combine(out[start:stop], best, out=out[start:stop])
    return finish_label_cutoff(out)


def _redo_short(
    task: RetrievalTask,
    read: Reader,
    bounds: list[tuple[int, int]],
    plan: EnginePlan,
    short: np.ndarray,
    parts: list[list[np.ndarray]],
    counts: np.ndarray,
    q0: int = 0,
) -> None:
    """Replace the candidates of ``short`` queries by every valid reference of every shard
    (``parts[i]`` holds the block starting at query ``q0 + i * block_size``)."""
    bsz, col_bits = plan.block_size, plan.col_bits
    row_shift = np.uint64(32 + col_bits)
    by_block: dict[int, np.ndarray] = {}
    for i in np.unique((short - q0) // bsz):
        start = q0 + int(i) * bsz
        rows = short[(short >= start) & (short < start + bsz)] - start
        by_block[int(i)] = rows
        codes = np.concatenate(parts[i])
        parts[i] = [codes[~np.isin(codes >> row_shift, rows.astype(np.uint64))]]
        counts[start + rows] = 0
    for a, b in bounds:
        shard = _shard_plan(task, read, a, b, plan)
        for i, rows in by_block.items():
            start = q0 + i * bsz
            codes, c = all_valid_codes(
                shard.search, start, rows, shard.exclusions, col_bits, tiled=True
            )
            codes += np.uint64(a)
            parts[i].append(codes)
            counts[start + rows] += c
