"""Leave-one-out with every distance computed once: the symmetric exact engine.

When the reference set is the query set (``evaluate(x, y)``), the product matrix is symmetric:
the dot product of i and j is the dot product of j and i.  The rows are cut into square tiles of
:data:`TILE` rows, and for each pair of tiles ``a <= b`` one product ``G = X_a X_b^T`` is
computed.  It feeds both sides: the queries of tile ``a`` against the references of tile ``b``
(keys ``||x_j||^2 - 2 G_ij`` for the Euclidean distance, ``-G_ij`` for cosine / inner product),
and the queries of tile ``b`` against the references of tile ``a`` (the same entries, read
transposed, with ``||x_i||^2``).  Half the products of the one-sided engine, the same memory
bound: no n x n matrix, only the candidates of the queries not finished yet.

Keys are *canonical*: the key of (i, j) always comes from the product of the whole tiles
``min(a, b)`` x ``max(a, b)`` (in a tile on the diagonal, from its upper triangle), so the
product shapes, hence the float32 rounding, are fixed whoever asks.  :func:`canonical_keys`
gives those keys for any rows and columns, and :class:`SymmetricSearch` hands them to the
sharded, Dask and CPU torch backends, which stay bit-identical to this engine.  Because the
Euclidean key is formed after the product (not inside it, as the one-sided engine's augmented
product does), leave-one-out keys may differ from a query/reference split's keys by float32
rounding; values are equal wherever rounding does not decide a tie.

Candidate selection per tile: the per-query depth thresholds tau are read off the engine's
seeded column subsample (:func:`embedeval.knn.depth_thresholds`); a tile entry can pass only if
``G_ij`` is at least a per-row (or per-column) bound derived from tau and the smallest squared
norm of the other tile, so one comparison pass per side over the products finds the few
survivors, and exact keys are computed for those alone.  Tiles are processed row stripe by row
stripe, so after stripe ``a`` the queries of tile ``a`` have every candidate: they are sorted and
scored (in the worker threads) and dropped.

Not taken (the one-sided engine runs instead): identical rows (their keys must be exact ties,
which the one-sided engine's shared per-group keys guarantee), full-depth ``map`` / ``mrr``
with ``k=None`` (whole rows are needed before any selection), more than 2**22 rows, and depths
whose pending candidates would not fit the memory budget.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._progress import progress_bar
from .knn import (
    DEFAULT_MEMORY_BUDGET,
    Candidates,
    PreparedSearch,
    column_subsample,
    default_threads,
    depth_thresholds,
    reference_duplicates,
    single_threaded_blas,
    sort_block,
    sortable_bits,
)

__all__ = [
    "TILE",
    "SymmetricSearch",
    "canonical_keys",
    "run_symmetric",
    "schedule",
    "symmetric_applies",
    "symmetric_points",
    "symmetric_view",
    "task_points",
    "tile_product",
    "uses_symmetric_engine",
]

#: Rows per square tile of the canonical products.
TILE = 1024
_MAX_ROWS = 1 << 22  # the packed code keeps 10 bits for the row in a tile, 22 for the column


def symmetric_applies(task: Any, threshold: str | None, duplicates: Any) -> bool:
    """Whether ``task`` is leave-one-out that the symmetric engine (and canonical keys) serve:
    the reference is the query set, no label threshold, no identical rows (``duplicates`` from
    :func:`embedeval.knn.reference_duplicates`)."""
    return (
        task.reference is task.query
        and task.exclusions.self_index
        and threshold is None
        and duplicates is None
        and 2 <= task.n_query <= _MAX_ROWS
    )


def uses_symmetric_engine(task: Any) -> bool:
    """:func:`symmetric_applies` for a task (a ``RetrievalTask``), finding its identical rows."""
    if task.reference is not task.query or not task.exclusions.self_index:
        return False
    _, threshold = task.depth()
    if threshold is not None:
        return False
    return symmetric_applies(task, None, reference_duplicates(task.reference, task.distance))


def symmetric_points(search: PreparedSearch, distance: str) -> tuple[np.ndarray, np.ndarray | None]:
    """The rows (normalised for cosine) and, for the Euclidean distance, their squared norms,
    taken from a search prepared over the whole set (its reference side)."""
    ref = search.reference_t.T
    if distance == "euclidean":
        return np.ascontiguousarray(ref[:, :-1]), np.ascontiguousarray(ref[:, -1])
    return np.ascontiguousarray(ref), None


_POINTS_CACHE: dict[str, Any] = {}


def task_points(task: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`symmetric_points` of a leave-one-out task's set (remembered for the last set, so
    that a backend asking once per shard prepares it once)."""
    cached = _POINTS_CACHE.get("last")
    if cached is not None and cached[0] is task.reference and cached[1] == task.distance:
        return cached[2]
    ref = task.reference
    points = symmetric_points(PreparedSearch.build(ref[:1], ref, task.distance), task.distance)
    _POINTS_CACHE["last"] = (ref, task.distance, points)
    return points


def symmetric_view(
    task: Any,
    search: PreparedSearch,
    threshold: str | None,
    duplicates: Any,
    row_offset: int = 0,
    col_offset: int = 0,
) -> PreparedSearch:
    """``search`` (rows from ``row_offset``, columns from ``col_offset`` of the whole set) with
    the canonical leave-one-out keys when ``task`` is served by the symmetric engine
    (:func:`symmetric_applies`), so that other backends reproduce its keys; else ``search``."""
    if not symmetric_applies(task, threshold, duplicates):
        return search
    points, sq = task_points(task)
    return SymmetricSearch.wrap(search, points, sq, row_offset, col_offset)


def tile_product(points: np.ndarray, a: int, b: int) -> np.ndarray:
    """The canonical product of tiles ``a <= b``: ``X_a X_b^T``, float32, one BLAS call of fixed
    shape; on the diagonal the lower triangle is the mirror of the upper one, so the entry of
    (i, j) and (j, i) is one number."""
    g = np.matmul(points[a * TILE : (a + 1) * TILE], points[b * TILE : (b + 1) * TILE].T)
    if a == b:
        lower = np.tri(g.shape[0], k=-1, dtype=bool)
        np.copyto(g, g.T.copy(), where=lower)
    return g


def keys_from_products(g: np.ndarray, sq_ref: np.ndarray | None) -> np.ndarray:
    """Ranking keys from canonical products: ``||x_ref||^2 - 2 g`` (one float32 rounding) or
    ``-g``; the engine and :func:`canonical_keys` use this one formula."""
    if sq_ref is None:
        return np.negative(g)
    return np.subtract(sq_ref, 2 * g)


def canonical_keys(
    points: np.ndarray,
    sq: np.ndarray | None,
    rows: np.ndarray,
    c0: int,
    c1: int,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Canonical leave-one-out keys of rows ``rows`` (global indices) against columns
    ``[c0, c1)``: every entry from the tile product :func:`tile_product` of its two tiles.

    Examples
    --------
    >>> x = np.array([[0.0], [1.0], [3.0]], dtype=np.float32)
    >>> canonical_keys(x, (x * x).ravel(), np.array([0, 2]), 0, 3).tolist()
    [[0.0, 1.0, 9.0], [0.0, -5.0, -9.0]]
    """
    rows = np.asarray(rows, dtype=np.int64)
    if out is None:
        out = np.empty((rows.size, c1 - c0), dtype=np.float32)
    tile_of = rows // TILE
    for a in np.unique(tile_of):
        sel = np.flatnonzero(tile_of == a)
        local = rows[sel] - a * TILE
        for b in range(c0 // TILE, -(-c1 // TILE)):
            j0, j1 = max(c0, b * TILE), min(c1, (b + 1) * TILE)
            if a <= b:
                g = tile_product(points, int(a), b)[np.ix_(local, np.arange(j0, j1) - b * TILE)]
            else:
                g = tile_product(points, b, int(a))[np.ix_(np.arange(j0, j1) - b * TILE, local)].T
            out[sel, j0 - c0 : j1 - c0] = keys_from_products(g, None if sq is None else sq[j0:j1])
    return out


@dataclass(frozen=True)
class SymmetricSearch(PreparedSearch):
    """A prepared search whose keys against column ranges are the canonical leave-one-out keys
    (:func:`canonical_keys`); its rows are global rows ``row_offset + i`` and its columns
    global columns ``col_offset + j``.  Keys against a column index array (the threshold
    subsample) stay the plain product's: thresholds need not be canonical, since the candidates
    are verified and every candidate's key is."""

    points: np.ndarray | None = None
    sq: np.ndarray | None = None
    row_offset: int = 0
    col_offset: int = 0

    @classmethod
    def wrap(
        cls,
        search: PreparedSearch,
        points: np.ndarray,
        sq: np.ndarray | None,
        row_offset: int = 0,
        col_offset: int = 0,
    ) -> SymmetricSearch:
        """``search`` (the caller's block or shard of the set) with canonical keys from the
        whole set's ``points`` and ``sq`` (:func:`symmetric_points`)."""
        fields = {f.name: getattr(search, f.name) for f in dataclasses.fields(PreparedSearch)}
        return cls(**fields, points=points, sq=sq, row_offset=row_offset, col_offset=col_offset)

    def keys(
        self, rows: slice | np.ndarray, cols: slice = slice(None), out=None, tie: bool = True
    ) -> np.ndarray:
        if not isinstance(cols, slice):
            return super().keys(rows, cols, out=out, tie=tie)
        c0, c1, _ = cols.indices(self.n_reference)
        if isinstance(rows, slice):
            rows = np.arange(*rows.indices(self.queries.shape[0]))
        shift = self.col_offset
        glob = np.asarray(rows, dtype=np.int64) + self.row_offset
        return canonical_keys(self.points, self.sq, glob, c0 + shift, c1 + shift, out)


@dataclass
class _Plan:
    """What every tile of one leave-one-out run needs."""

    task: Any
    points: np.ndarray
    sq: np.ndarray | None
    need: np.ndarray
    tau: np.ndarray
    min_sq: np.ndarray | None  # smallest squared norm per tile (the bound of the prefilter)
    groups: np.ndarray | None
    col_bits: int
    triangles: dict = dataclasses.field(default_factory=dict)
    local: threading.local = dataclasses.field(default_factory=threading.local)

    def buffers(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """The canonical product of tiles ``a <= b``, unmirrored (the engine reads the upper
        triangle of diagonal tiles), in this thread's reused buffer, and a mask buffer."""
        if getattr(self.local, "g", None) is None:
            self.local.g = np.empty(TILE * TILE, dtype=np.float32)
            self.local.mask = np.empty(TILE * TILE, dtype=bool)
        m = min(TILE, self.n - a * TILE)
        w = min(TILE, self.n - b * TILE)
        g = self.local.g[: m * w].reshape(m, w)
        np.matmul(
            self.points[a * TILE : a * TILE + m], self.points[b * TILE : b * TILE + w].T, out=g
        )
        return g, self.local.mask[: m * w].reshape(m, w)

    def upper(self, m: int) -> np.ndarray:
        """The strict upper triangle of an m x m tile (cached per size)."""
        cached = self.triangles.get(m)
        if cached is None:
            cached = self.triangles[m] = np.triu(np.ones((m, m), dtype=bool), k=1)
        return cached

    @property
    def n(self) -> int:
        return int(self.points.shape[0])

    @property
    def n_tiles(self) -> int:
        return -(-self.n // TILE)

    def bound(self, tau: np.ndarray, other: int) -> np.ndarray:
        """Smallest ``G_ij`` with which a key can be <= tau, slightly lowered (float32 keys
        round; the exact test on the survivors decides)."""
        if self.sq is None:
            return np.negative(tau)
        t = np.clip(tau.astype(np.float64), -3e38, 3e38)
        s = float(self.min_sq[other])
        lo = (s - t - (abs(s) + np.abs(t)) * 2.0**-20) / 2 - 1e-37
        return np.nextafter(lo.astype(np.float32), np.float32(-np.inf))


def _make_plan(task: Any, pool: Any) -> _Plan:
    n = task.n_query
    search = PreparedSearch.build(task.query, task.reference, task.distance)
    points, sq = symmetric_points(search, task.distance)
    depth, _ = task.depth()
    need = np.minimum(depth, task.n_valid)
    subsample = column_subsample(need, n)
    starts = range(0, n, 512)

    def block_tau(s: int) -> np.ndarray:
        e = min(s + 512, n)
        return depth_thresholds(search, s, e, need[s:e], subsample, task.exclusions)

    tau = np.concatenate(list(pool_map(pool, block_tau, starts)))
    tau[need <= 0] = -np.inf
    min_sq = None
    if sq is not None:
        pad = np.full(-(-n // TILE) * TILE, np.inf, dtype=np.float32)
        pad[:n] = sq
        min_sq = pad.reshape(-1, TILE).min(axis=1)
    col_bits = max(1, int(n - 1).bit_length())
    return _Plan(task, points, sq, need, tau, min_sq, task.exclusions.query_groups, col_bits)


def pool_map(pool: Any, fn: Callable[[Any], Any], items: Any) -> Any:
    """``map`` on ``pool`` (a thread pool, or None: here)."""
    return map(fn, items) if pool is None else pool.map(fn, items)


def _codes(
    plan: _Plan, q: np.ndarray, r: np.ndarray, g: np.ndarray, q0: int, r0: int
) -> np.ndarray:
    """Packed codes (query row in its tile, key bits, reference) of the pairs (query ``q0 + q``,
    reference ``r0 + r``) with canonical products ``g`` whose exact key passes the query's tau
    and whose reference the query may see."""
    ref = r + r0
    key = keys_from_products(g, None if plan.sq is None else plan.sq[ref])
    keep = key <= plan.tau[q + q0]
    if plan.groups is not None:
        keep &= plan.groups[q + q0] != plan.groups[ref]
    code = q[keep].astype(np.uint64) << np.uint64(32 + plan.col_bits)
    code |= sortable_bits(key[keep]).astype(np.uint64) << np.uint64(plan.col_bits)
    code |= ref[keep].astype(np.uint64)
    return code


def _tile_hits(plan: _Plan, a: int, b: int, sides: str) -> tuple[Any, Any]:
    """Candidate codes from the product of tiles ``a <= b``: for the queries of tile ``a``
    (``"r"`` in ``sides``) and for the queries of tile ``b`` (``"c"``).  On the diagonal only
    the strict upper triangle is read, for both sides (its entry of (i, j) is the canonical
    entry of (j, i) too, and the diagonal is the queries themselves)."""
    g, mask = plan.buffers(a, b)
    lo_r = plan.bound(plan.tau[a * TILE : a * TILE + g.shape[0]], b) if "r" in sides else None
    lo_c = plan.bound(plan.tau[b * TILE : b * TILE + g.shape[1]], a) if "c" in sides else None
    # One comparison with the loosest bound of the tile finds a superset of both sides'
    # survivors; when it is sparse (the usual case) the per-row and per-column bounds are then
    # tested on the survivors alone, else on the whole tile.
    floor = min(x.min(initial=np.inf) for x in (lo_r, lo_c) if x is not None)
    np.greater_equal(g, floor, out=mask)
    if a == b:
        mask &= plan.upper(g.shape[0])
    if np.count_nonzero(mask) * 16 <= mask.size:
        i, j = np.divmod(np.flatnonzero(mask), g.shape[1])
        vals = g[i, j]
        rows = cols = None
        if lo_r is not None:
            ok = vals >= lo_r[i]
            rows = _codes(plan, i[ok], j[ok], vals[ok], a * TILE, b * TILE)
        if lo_c is not None:
            ok = vals >= lo_c[j]
            cols = _codes(plan, j[ok], i[ok], vals[ok], b * TILE, a * TILE)
        return rows, cols
    return tuple(
        None if lo is None else _dense_side(plan, g, mask, lo, a, b, side == "c")
        for side, lo in (("r", lo_r), ("c", lo_c))
    )


def _dense_side(
    plan: _Plan, g: np.ndarray, mask: np.ndarray, lo: np.ndarray, a: int, b: int, col: bool
) -> np.ndarray:
    """One side's codes of a tile where many entries pass: its own bound over the whole tile."""
    np.greater_equal(g, lo[None, :] if col else lo[:, None], out=mask)
    if a == b:
        mask &= plan.upper(g.shape[0])
    i, j = np.divmod(np.flatnonzero(mask), g.shape[1])
    if col:
        return _codes(plan, j, i, g[i, j], b * TILE, a * TILE)
    return _codes(plan, i, j, g[i, j], a * TILE, b * TILE)


def schedule(n_tiles: int, window: int) -> list[tuple[int, int, str]]:
    """The tile products in the order the engine runs them: ``(a, b, sides)``, row stripe by row
    stripe.  Pairs less than ``window`` tiles apart are multiplied once for both sides; farther
    pairs once per side (in the stripe of each), so the candidates waiting for a later stripe
    come from at most ``window`` stripes and memory stays bounded for deep rankings.

    Examples
    --------
    >>> schedule(3, 3)
    [(0, 0, 'rc'), (0, 1, 'rc'), (0, 2, 'rc'), (1, 1, 'rc'), (1, 2, 'rc'), (2, 2, 'rc')]
    >>> schedule(3, 1)[3:6]
    [(0, 1, 'c'), (1, 1, 'rc'), (1, 2, 'r')]
    """
    out = []
    for a in range(n_tiles):
        out.extend((c, a, "c") for c in range(0, a - window + 1))
        out.extend((a, b, "rc" if b - a < window else "r") for b in range(a, n_tiles))
    return out


def _redo(plan: _Plan, q0: int, short: np.ndarray) -> np.ndarray:
    """Codes of every valid reference of the (rare) queries ``short`` (tile rows from ``q0``)
    whose candidates came out fewer than their depth."""
    n = plan.n
    keys = canonical_keys(plan.points, plan.sq, short + q0, 0, n)
    q = np.repeat(short, n)
    ref = np.tile(np.arange(n), short.size)
    valid = q + q0 != ref
    if plan.groups is not None:
        valid &= plan.groups[q + q0] != plan.groups[ref]
    code = q[valid].astype(np.uint64) << np.uint64(32 + plan.col_bits)
    code |= sortable_bits(keys.ravel()[valid]).astype(np.uint64) << np.uint64(plan.col_bits)
    code |= ref[valid].astype(np.uint64)
    return code


def _finish(plan: _Plan, a: int, parts: list[np.ndarray]) -> tuple[int, Any]:
    """Sort and score the queries of tile ``a`` once they have every candidate."""
    q0 = a * TILE
    b = min(TILE, plan.n - q0)
    codes = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint64)
    row_shift = np.uint64(32 + plan.col_bits)
    counts = np.bincount((codes >> row_shift).astype(np.int64), minlength=b)
    short = np.flatnonzero(counts < plan.need[q0 : q0 + b])
    if short.size:  # the subsample margin failed (rare): take every valid reference
        codes = codes[~np.isin(codes >> row_shift, short.astype(np.uint64))]
        codes = np.concatenate((codes, _redo(plan, q0, short)))
        counts = np.bincount((codes >> row_shift).astype(np.int64), minlength=b)
    block: Candidates = sort_block(codes, counts, q0, plan.col_bits, False)
    return a, plan.task.score_block(block)


def stripe_window(need: np.ndarray, memory_budget: int) -> int:
    """Tiles apart up to which a product serves both sides (:func:`schedule`): the candidates
    waiting for later stripes (about 1.5 x depth per query) stay within two budgets."""
    per_tile = 8 * TILE * (float(np.mean(need * 1.5 + 64)) if need.size else 64.0)
    return max(1, int(2 * memory_budget // per_tile))


def run_symmetric(
    task: Any,
    *,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    progress: bool | None = None,
    n_threads: int | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Leave-one-out per-query values and tie flags, each product computed once (see the
    module); the values do not depend on ``n_threads``."""
    values, ties = task.empty_outputs()
    n_threads = default_threads() if n_threads is None else n_threads
    pool = None
    if n_threads > 1:
        pool = concurrent.futures.ThreadPoolExecutor(n_threads, "embedeval-symmetric")
    try:
        with single_threaded_blas(), progress_bar(task.n_query, "queries", enabled=progress) as bar:
            plan = _make_plan(task, pool)
            window = stripe_window(plan.need, memory_budget)
            for a, (chunk_values, chunk_ties) in _stream(plan, pool, n_threads, window):
                rows = slice(a * TILE, min((a + 1) * TILE, plan.n))
                for name in chunk_values:
                    values[name][rows] = chunk_values[name]
                    ties[name][rows] = chunk_ties[name]
                bar.update(rows.stop - rows.start)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return values, ties


def _stream(plan: _Plan, pool: Any, n_threads: int, window: int) -> Any:
    """Yield ``(tile, scores)`` as tiles of queries complete: tile products in the order of
    :func:`schedule`, at most ``2 * n_threads`` in flight, each finished tile sorted and scored
    in the pool while the next products run."""
    nt = plan.n_tiles
    pending: list[list[np.ndarray]] = [[] for _ in range(nt)]
    pairs = iter(schedule(nt, window))
    if pool is None:
        for a, b, sides in pairs:
            _add_hits(pending, a, b, _tile_hits(plan, a, b, sides))
            if b == nt - 1 and "r" in sides:  # the last product of stripe a
                yield _finish(plan, a, pending[a])
                pending[a] = []
        return
    waiting: collections.deque = collections.deque()
    finishing: collections.deque = collections.deque()
    for a, b, sides in _take(pairs, 2 * n_threads):
        waiting.append((a, b, sides, pool.submit(_tile_hits, plan, a, b, sides)))
    while waiting:
        a, b, sides, future = waiting.popleft()
        _add_hits(pending, a, b, future.result())
        for item in _take(pairs, 1):
            waiting.append((*item, pool.submit(_tile_hits, plan, *item)))
        if b == nt - 1 and "r" in sides:
            finishing.append(pool.submit(_finish, plan, a, pending[a]))
            pending[a] = []
        while finishing and finishing[0].done():
            yield finishing.popleft().result()
    while finishing:
        yield finishing.popleft().result()


def _take(items: Any, count: int) -> list[Any]:
    out = []
    for item in items:
        out.append(item)
        if len(out) == count:
            break
    return out


def _add_hits(pending: list[list[np.ndarray]], a: int, b: int, hits: tuple[Any, Any]) -> None:
    if hits[0] is not None:
        pending[a].append(hits[0])
    if hits[1] is not None:
        pending[b].append(hits[1])
