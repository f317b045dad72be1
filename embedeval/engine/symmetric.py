"""Leave-one-out with every distance computed once: the symmetric exact engine.

When the reference set is the query set (``evaluate(x, y)``), the distance matrix is symmetric.
The rows are cut into square tiles of :data:`TILE` rows, and for each pair of tiles ``a <= b``
one product is computed, ``[x, ||x||^2, 1]_a . [-2 x, 1, ||x||^2]_b^T``: its entry ``D_ij`` is
the squared distance of i and j (cosine / inner product: ``-x_a . x_b^T``, the key itself).  It
feeds both sides: the queries of tile ``a`` against the references of tile ``b`` and, read
transposed, the queries of tile ``b`` against the references of tile ``a``.  The key of query q
is ``D_qr - ||x_q||^2`` (``||x_r||^2 - 2 x_q.x_r``, what the one-sided engine ranks by).  Half
the products of the one-sided engine and its memory bound: no n x n matrix, only the candidates
of queries whose last tile has not been multiplied yet.

Keys are *canonical*: the key of (i, j) always comes from the product of the whole tiles
``min(a, b)`` x ``max(a, b)`` (in a tile on the diagonal, from its strict upper triangle,
multiplied in fixed strips of :data:`STRIP` rows), so
product shapes, hence float32 rounding, are fixed whoever asks, and (i, j) and (j, i) share one
entry.  :func:`canonical_keys` gives those keys for any rows and columns, and
:class:`SymmetricSearch` hands them to the sharded, Dask and CPU torch backends, which stay
bit-identical to this engine.  The Euclidean key is formed after the product rather than inside
a query-by-reference product, so its float32 rounding differs from the one-sided engine's; both
stay within the bound of :mod:`embedeval.engine.decide`, whose float64 decision makes the
rankings, hence the values, equal.

Candidate selection: the first per-query depth thresholds tau are read off a small seeded
column subsample (:func:`_subsample`, :func:`embedeval.engine.exact.sample_thresholds`).  A product
entry can pass only if it is at most ``tau_q + ||x_q||^2`` (rounded generously up); one
comparison pass per side finds the few entries at or below their query's limit, and exact keys
are computed for those alone.  Once a query holds as many candidates as it needs, its tau drops
to the key of the last needed one (:func:`tighten`: an exact bound, unlike the subsample's
margin), so the products that follow let far fewer entries through.

Tiles run row stripe by row stripe (:func:`schedule`), so after stripe ``a`` the queries of
tile ``a`` have every candidate: they are sorted and scored in the worker threads and dropped.
When deep rankings would make the waiting candidates exceed the memory budget, pairs of tiles
farther apart than a window are multiplied once per side instead.

Not taken (the one-sided engine runs instead): identical rows (their keys must be exact ties,
which the one-sided engine's shared per-group keys guarantee), full-depth ``map`` / ``mrr``
with ``k=None`` (whole rows are needed before any selection), rankings deeper on average than
1/32 of a set of more than four tiles (candidate extraction, not the products, dominates),
``ref_includes_query=True`` and more than 2**22 rows.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..utils.errors import InputError
from ..utils.progress import progress_bar
from .arrays import import_torch
from .candidates import Candidates, from_sortable_bits, sortable_bits
from .decide import Reach, rounding_of, task_norms
from .exact import (
    DEFAULT_MEMORY_BUDGET,
    PreparedSearch,
    normalize_rows,
    reference_duplicates,
    rows_past_threshold,
    sample_thresholds,
    sort_block,
)
from .task import Columns, RetrievalTask, ScoredBlock, write_back
from .threads import default_threads, one_torch_thread, single_threaded_blas

__all__ = [
    "STRIP",
    "TILE",
    "SymmetricSearch",
    "SymmetricSet",
    "canonical_keys",
    "run_symmetric",
    "schedule",
    "strips",
    "symmetric_applies",
    "symmetric_blocks",
    "symmetric_view",
    "task_set",
    "tighten",
    "uses_symmetric_engine",
]

#: Rows per square tile of the canonical products.
TILE = 1024
#: Rows per strip of a diagonal tile's product (see SymmetricSet.product).
STRIP = 256
_MAX_ROWS = 1 << 22  # the packed code keeps 10 bits for the row in a tile, 22 for the column
_DENSE = 32  # mean depth above n / _DENSE: the one-sided engine (see symmetric_applies)
_SAMPLE = 256  # columns of the first threshold's subsample (see _subsample)
_SLACK = 8  # waiting codes per query a tile gathers beyond twice the last kept before tightening


def symmetric_applies(task: Any, threshold: str | None, duplicates: Any) -> bool:
    """Whether ``task`` is leave-one-out that the symmetric engine (and canonical keys) serve:
    the reference is the query set, no label threshold, no identical rows (``duplicates`` from
    :func:`embedeval.engine.exact.reference_duplicates`), and shallow rankings: in a set of more
    than
    four tiles whose queries need on average more than 1/32 of it (e.g. MAP@R over a few large
    classes), extracting the candidates outweighs the products and the one-sided engine is
    faster."""
    if not (
        task.reference is task.query
        and task.exclusions.self_index
        and threshold is None
        and duplicates is None
        and 2 <= task.n_query <= _MAX_ROWS
    ):
        return False
    if task.n_query <= 4 * TILE:  # small: either engine is quick; keep one path
        return True
    depth, _ = task.depth()
    return float(np.minimum(depth, task.n_valid).mean()) * _DENSE <= task.n_query


def uses_symmetric_engine(task: Any) -> bool:
    """:func:`symmetric_applies` for a task (a ``RetrievalTask``), finding its identical rows."""
    if task.reference is not task.query or not task.exclusions.self_index:
        return False
    _, threshold = task.depth()
    if threshold is not None:
        return False
    try:
        duplicates = reference_duplicates(task.reference, task.distance)
    except InputError:  # e.g. a zero vector with cosine: the one-sided engine names the query
        return False
    return symmetric_applies(task, None, duplicates)


@dataclass(frozen=True)
class SymmetricSet:
    """The two factors of the canonical products of a set of n rows, and its squared norms.

    Euclidean: ``left = [x, ||x||^2, 1]`` and ``right = [-2 x, 1, ||x||^2]``, so one product
    entry is ``D_ij = ||x_i||^2 + ||x_j||^2 - 2 x_i.x_j``, the squared distance, symmetric in
    i and j; the key of query i is ``D_ij - ||x_i||^2`` (what the one-sided engine ranks by).
    Cosine / inner product: ``left = -x``, ``right = x`` (normalised for cosine), the entry is
    the key itself and ``sq`` is None.
    """

    left: np.ndarray
    right: np.ndarray
    sq: np.ndarray | None
    #: bfloat16 copies of ``left`` and ``right`` (torch tensors) when the products are
    #: bfloat16 (:meth:`in_bf16`), else None.
    low: tuple[Any, Any] | None = None

    @classmethod
    def from_rows(cls, x: np.ndarray, distance: str) -> SymmetricSet:
        """From the set's rows (float32), built in place: the same bits as
        :meth:`from_search` on a search prepared over ``x``, without preparing one."""
        if distance == "cosine":  # leave-one-out: the rows are the evaluation's queries
            x = normalize_rows(x, "query")
        if distance != "euclidean":
            x = np.ascontiguousarray(x, dtype=np.float32)
            return cls(np.negative(x), x, None)
        n, d = x.shape
        sq = np.einsum("ij,ij->i", x, x, dtype=np.float32)  # as PreparedSearch.build has it
        left = np.empty((n, d + 2), dtype=np.float32)
        left[:, :d], left[:, d], left[:, d + 1] = x, sq, 1.0
        right = np.empty((n, d + 2), dtype=np.float32)
        np.multiply(x, np.float32(-2.0), out=right[:, :d])
        right[:, d], right[:, d + 1] = 1.0, sq
        return cls(left, right, sq)

    @classmethod
    def from_search(cls, search: PreparedSearch, distance: str) -> SymmetricSet:
        """From a search prepared over the whole set (its reference side: the rows, and for
        the Euclidean distance their squared norms)."""
        ref = search.reference_t.T
        if distance != "euclidean":
            x = np.ascontiguousarray(ref)
            return cls(np.negative(x), x, None)
        x, sq = ref[:, :-1], np.ascontiguousarray(ref[:, -1])
        ones = np.ones((x.shape[0], 1), dtype=np.float32)
        left = np.hstack((x, sq[:, None], ones))
        right = np.hstack((np.multiply(x, np.float32(-2.0)), ones, sq[:, None]))
        return cls(left, right, sq)

    def in_bf16(self) -> SymmetricSet:
        """This set multiplying bfloat16 copies of its factors (PyTorch: oneDNN's AVX512-BF16 /
        AMX kernels on CPUs that have them), results in float32."""
        torch = import_torch()
        low = tuple(torch.from_numpy(np.ascontiguousarray(f)).to(torch.bfloat16) for f in
                    (self.left, self.right))  # fmt: skip
        return dataclasses.replace(self, low=low)

    @property
    def n(self) -> int:
        return int(self.left.shape[0])

    def _matmul(self, rows: slice, cols: slice, out: np.ndarray) -> np.ndarray:
        """``left[rows] @ right[cols].T`` into ``out`` (float32), in bfloat16 when ``low``."""
        if self.low is None:
            return np.matmul(self.left[rows], self.right[cols].T, out=out)
        torch = import_torch()
        with one_torch_thread(torch):  # called from the engine's worker threads
            torch.from_numpy(out).copy_(torch.mm(self.low[0][rows], self.low[1][cols].T))
        return out

    def product(self, a: int, b: int, out: np.ndarray | None = None) -> np.ndarray:
        """The canonical product of tiles ``a <= b``: one BLAS call of fixed shape, or on the
        diagonal one call per strip of :data:`STRIP` rows ``[r0, r1)`` against the tile's
        columns ``[r0, m)`` (its strict upper triangle, 5/8 of the tile's work, is what is
        canonical; entries left of a strip keep what ``out`` held, zeros when it is None)."""
        a0, b0 = a * TILE, b * TILE
        m, w = min(TILE, self.n - a0), min(TILE, self.n - b0)
        if a != b:
            if out is None:
                out = np.empty((m, w), dtype=np.float32)
            return self._matmul(slice(a0, a0 + m), slice(b0, b0 + w), out)
        if out is None:
            out = np.zeros((m, m), dtype=np.float32)
        for r0, r1 in strips(m):
            self._matmul(slice(a0 + r0, a0 + r1), slice(a0 + r0, a0 + m), out[r0:r1, r0:])
        return out

    def keys(self, p: np.ndarray, query_rows: np.ndarray) -> np.ndarray:
        """Keys of queries ``query_rows`` from their canonical product entries ``p`` (one
        float32 rounding: the engine and :func:`canonical_keys` share this formula)."""
        if self.sq is None:
            return p
        sq = self.sq[query_rows]
        return np.subtract(p, sq[:, None] if p.ndim == 2 else sq)


def strips(m: int) -> list[tuple[int, int]]:
    """The row strips ``[r0, r1)`` of :data:`STRIP` rows of an ``m``-row diagonal tile.

    Examples
    --------
    >>> strips(600)
    [(0, 256), (256, 512), (512, 600)]
    """
    return [(r0, min(r0 + STRIP, m)) for r0 in range(0, m, STRIP)]


_SETS: dict[int, SymmetricSet] = {}  # by id of a live task; dropped when the task is freed
_SETS_LOCK = threading.Lock()


def task_set(task: Any) -> SymmetricSet:
    """The :class:`SymmetricSet` of a leave-one-out task, prepared once per task (a backend
    asks once per shard).  Kept only while the task lives: a later evaluation, even of the same
    array changed in place, prepares its own."""
    with _SETS_LOCK:
        out = _SETS.get(id(task))
        if out is None:
            out = _SETS[id(task)] = SymmetricSet.from_rows(task.reference, task.distance)
            weakref.finalize(task, _SETS.pop, id(task), None)
    return out


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
    return SymmetricSearch.wrap(search, task_set(task), row_offset, col_offset)


def _mirrored(whole: SymmetricSet, a: int) -> np.ndarray:
    """The diagonal tile ``a`` with its lower triangle taken from the upper one."""
    p = whole.product(a, a)
    lower = np.tri(p.shape[0], k=-1, dtype=bool)
    np.copyto(p, p.T.copy(), where=lower)
    return p


def canonical_keys(
    whole: SymmetricSet, rows: np.ndarray, c0: int, c1: int, out: np.ndarray | None = None
) -> np.ndarray:
    """Canonical leave-one-out keys of rows ``rows`` (global indices, increasing) against
    columns ``[c0, c1)``: every entry from the product of its two tiles, lower tile first.

    Examples
    --------
    >>> x = np.array([[0.0], [1.0], [3.0]], dtype=np.float32)
    >>> whole = SymmetricSet.from_search(PreparedSearch.build(x, x, "euclidean"), "euclidean")
    >>> canonical_keys(whole, np.array([0, 2]), 0, 3).tolist()
    [[0.0, 1.0, 9.0], [0.0, -5.0, -9.0]]
    """
    rows = np.asarray(rows, dtype=np.int64)
    if out is None:
        out = np.empty((rows.size, c1 - c0), dtype=np.float32)
    tile_of = rows // TILE
    for a in np.unique(tile_of).tolist():
        sel = np.flatnonzero(tile_of == a)
        local = rows[sel] - a * TILE
        if local.size and local[-1] - local[0] == local.size - 1:  # a run: slice, no gather
            local = slice(int(local[0]), int(local[-1]) + 1)
            sel = slice(int(sel[0]), int(sel[-1]) + 1)
        for b in range(c0 // TILE, -(-c1 // TILE)):
            cols = slice(max(c0, b * TILE) - b * TILE, min(c1, (b + 1) * TILE) - b * TILE)
            if a < b:
                p = whole.product(a, b)[local][:, cols]
            elif a == b:
                p = _mirrored(whole, a)[local][:, cols]
            else:
                p = whole.product(b, a)[cols][:, local].T
            out[sel, cols.start + b * TILE - c0 : cols.stop + b * TILE - c0] = whole.keys(
                p, rows[sel]
            )
    return out


@dataclass(frozen=True)
class SymmetricSearch(PreparedSearch):
    """A prepared search whose keys against column ranges are the canonical leave-one-out keys
    (:func:`canonical_keys`); its rows are global rows ``row_offset + i`` and its columns
    global columns ``col_offset + j``.  Keys against a column index array (the threshold
    subsample) stay the plain product's: thresholds need not be canonical, since the candidates
    are verified and every candidate's key is."""

    whole: SymmetricSet | None = None
    row_offset: int = 0
    col_offset: int = 0

    @classmethod
    def wrap(
        cls, search: PreparedSearch, whole: SymmetricSet, row_offset: int = 0, col_offset: int = 0
    ) -> SymmetricSearch:
        """``search`` (the caller's block or shard of the set) with canonical keys from
        ``whole``."""
        fields = {f.name: getattr(search, f.name) for f in dataclasses.fields(PreparedSearch)}
        return cls(**fields, whole=whole, row_offset=row_offset, col_offset=col_offset)

    def keys(
        self, rows: slice | np.ndarray, cols: slice = slice(None), out=None, tie: bool = True
    ) -> np.ndarray:
        if not isinstance(cols, slice):
            return super().keys(rows, cols, out=out, tie=tie)
        c0, c1, _ = cols.indices(self.n_reference)
        if isinstance(rows, slice):
            rows = np.arange(*rows.indices(self.queries.shape[0]))
        glob = np.asarray(rows, dtype=np.int64) + self.row_offset
        return canonical_keys(self.whole, glob, c0 + self.col_offset, c1 + self.col_offset, out)


@dataclass
class _Plan:
    """What every tile of one leave-one-out run needs."""

    task: Any
    whole: SymmetricSet
    need: np.ndarray
    tau: np.ndarray
    limit: np.ndarray  # per query: the largest product entry its key can pass tau with
    groups: np.ndarray | None
    col_bits: int
    #: How far above tau each query keeps float32 keys (embedeval.engine.decide).
    reach: Reach | None = None
    #: The subsample thresholds before widening (a query whose depth-th key lies above its
    #: own is redone, see _finish); None: no subsample.
    sampled: np.ndarray | None = None
    triangles: dict = dataclasses.field(default_factory=dict)
    local: threading.local = dataclasses.field(default_factory=threading.local)

    def buffers(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """The canonical product of tiles ``a <= b`` in this thread's reused buffer (as
        computed: the engine reads only the upper triangle of a diagonal tile), and a mask."""
        if getattr(self.local, "p", None) is None:
            self.local.p = np.empty(TILE * TILE, dtype=np.float32)
            self.local.mask = np.empty(TILE * TILE, dtype=bool)
        m, w = min(TILE, self.n - a * TILE), min(TILE, self.n - b * TILE)
        p = self.whole.product(a, b, out=self.local.p[: m * w].reshape(m, w))
        return p, self.local.mask[: m * w].reshape(m, w)

    def second_mask(self, shape: tuple[int, int]) -> np.ndarray:
        """A second mask buffer of this thread (both sides of a tile at once)."""
        if getattr(self.local, "mask2", None) is None:
            self.local.mask2 = np.empty(TILE * TILE, dtype=bool)
        return self.local.mask2[: shape[0] * shape[1]].reshape(shape)

    def upper(self, shape: tuple[int, int]) -> np.ndarray:
        """The entries right of the diagonal of a ``shape`` block (cached per shape)."""
        cached = self.triangles.get(shape)
        if cached is None:
            cached = self.triangles[shape] = np.triu(np.ones(shape, dtype=bool), k=1)
        return cached

    @property
    def n(self) -> int:
        return self.whole.n

    @property
    def n_tiles(self) -> int:
        return -(-self.n // TILE)


def entry_limits(tau: np.ndarray, sq: np.ndarray | None) -> np.ndarray:
    """Per query, a float32 bound on the product entry ``p`` above which its key
    ``p - ||x_q||^2`` (or ``p``) cannot be <= tau: ``tau + ||x_q||^2`` rounded generously up
    (the exact key of the few entries below it decides)."""
    if sq is None:
        return tau
    t = np.clip(tau.astype(np.float64), -3e38, 3e38)
    s = sq.astype(np.float64)
    hi = t + s + (np.abs(t) + np.abs(s)) * 2.0**-20 + 1e-37
    return np.nextafter(hi.astype(np.float32), np.float32(np.inf))


def _make_plan(task: Any, pool: Any) -> _Plan:
    n = task.n_query
    whole = SymmetricSet.from_rows(task.reference, task.distance)
    if task.precision == "bf16":
        whole = whole.in_bf16()
    depth, _ = task.depth()
    need = np.minimum(depth, task.n_valid)
    subsample = _subsample(need, n)
    sample_t = None if subsample is None else np.ascontiguousarray(whole.right[subsample].T)

    def block_tau(s: int) -> np.ndarray:
        e = min(s + 512, n)

        def sample_keys() -> np.ndarray:  # the plain product: thresholds need not be canonical
            return whole.keys(np.matmul(whole.left[s:e], sample_t), np.arange(s, e))

        return sample_thresholds(sample_keys, s, need[s:e], subsample, n, task.exclusions)

    tau = np.concatenate(list(pool_map(pool, block_tau, range(0, n, 512))))
    sampled = None if subsample is None else tau.copy()
    # Every key the float64 decision may rank within the depth is kept.
    rounding = rounding_of(task.precision)
    reach = task_norms(task).reach(task.distance, int(task.reference.shape[1]), *rounding)
    tau = reach.widen(slice(None), tau)
    tau[need <= 0] = -np.inf
    limit = entry_limits(tau, whole.sq)
    col_bits = max(1, int(n - 1).bit_length())
    groups = task.exclusions.query_groups
    return _Plan(task, whole, need, tau, limit, groups, col_bits, reach=reach, sampled=sampled)


def _subsample(need: np.ndarray, n: int) -> np.ndarray | None:
    """The seeded columns the first thresholds are read from (sorted), or None for a set small
    enough to start from no threshold.  Smaller than the one-sided engine's
    (:func:`embedeval.engine.exact.column_subsample`): here the thresholds are soon tightened from
    the
    candidates found (:func:`tighten`), so a cheaper, looser start is the better trade (60,000
    rows, one thread: 256 columns 7.6 s, 1,024 columns 8.1 s)."""
    m = _SAMPLE if need.max(initial=0) * _SAMPLE < 64 * n else 4 * _SAMPLE
    if n <= 2 * m:
        return None
    return np.sort(np.random.default_rng(0).choice(n, m, replace=False))


def pool_map(pool: Any, fn: Callable[[Any], Any], items: Any) -> Any:
    """``map`` on ``pool`` (a thread pool, or None: here)."""
    return map(fn, items) if pool is None else pool.map(fn, items)


def _codes(plan: _Plan, query: np.ndarray, ref: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Packed codes (query row in its tile, key bits, reference) of the pairs (``query``,
    ``ref``) with canonical product entries ``p`` whose exact key passes the query's tau and
    whose reference the query may see."""
    key = plan.whole.keys(p, query)
    keep = key <= plan.tau[query]
    if plan.groups is not None:
        keep &= plan.groups[query] != plan.groups[ref]
    code = (query[keep] & (TILE - 1)).astype(np.uint64) << np.uint64(32 + plan.col_bits)
    code |= sortable_bits(key[keep]).astype(np.uint64) << np.uint64(plan.col_bits)
    code |= ref[keep].astype(np.uint64)
    return code


def _tile_hits(plan: _Plan, a: int, b: int, sides: str) -> tuple[Any, Any]:
    """Candidate codes from the product of tiles ``a <= b``: for the queries of tile ``a``
    (``"r"`` in ``sides``) and for the queries of tile ``b`` (``"c"``)."""
    p, mask = plan.buffers(a, b)
    if a == b:  # the schedule gives every diagonal tile both sides
        return _diagonal_hits(plan, p, mask, a)
    if sides == "rc":
        limits = (plan.limit[a * TILE :][: p.shape[0]], plan.limit[b * TILE :][: p.shape[1]])
        return _extract(plan, p, (mask, plan.second_mask(mask.shape)), (a * TILE, b * TILE), limits)
    rows = _side(plan, p, mask, a, b, False) if "r" in sides else None
    cols = _side(plan, p, mask, a, b, True) if "c" in sides else None
    return rows, cols


def _diagonal_hits(
    plan: _Plan, p: np.ndarray, mask: np.ndarray, a: int
) -> tuple[np.ndarray, np.ndarray]:
    """Both sides' codes of the diagonal tile ``a``, strip by strip (only the strips hold
    products, see :meth:`SymmetricSet.product`), from the entries above the diagonal: the
    entry of (i, j) is the canonical entry of (j, i) too, and the diagonal is the queries
    themselves."""
    m = p.shape[0]
    limit = plan.limit[a * TILE :][:m]
    found = []
    for r0, r1 in strips(m):
        shape = (r1 - r0, m - r0)
        masks = (mask.ravel()[: shape[0] * shape[1]].reshape(shape), plan.second_mask(shape))
        origin = (a * TILE + r0, a * TILE + r0)
        found.append(_extract(plan, p[r0:r1, r0:], masks, origin, (limit[r0:r1], limit[r0:]), True))
    return np.concatenate([f[0] for f in found]), np.concatenate([f[1] for f in found])


def _extract(
    plan: _Plan,
    p: np.ndarray,
    masks: tuple[np.ndarray, np.ndarray],
    origin: tuple[int, int],
    limits: tuple[np.ndarray, np.ndarray],
    upper: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Both sides' codes of the products ``p`` (rows and columns from global ``origin``, with
    those rows' and columns' ``limits``; ``upper``: only entries right of the diagonal that
    starts at the first row): one extraction of the entries that pass the row query's limit or
    the column query's limit (the two masks are OR-ed, so the sparse index extraction, the
    costliest pass after the product, runs once for both sides)."""
    mask, other = masks
    row_limit, col_limit = limits
    np.less_equal(p, row_limit[:, None], out=mask)
    np.less_equal(p, col_limit[None, :], out=other)
    np.logical_or(mask, other, out=mask)
    if upper:
        mask &= plan.upper(mask.shape)
    flat = np.flatnonzero(mask)
    i, j = np.divmod(flat, p.shape[1])
    values = p.ravel()[flat] if p.flags.c_contiguous else p[i, j]
    on_row = values <= row_limit[i]
    on_col = values <= col_limit[j]
    gi, gj = i + origin[0], j + origin[1]
    rows = _codes(plan, gi[on_row], gj[on_row], values[on_row])
    cols = _codes(plan, gj[on_col], gi[on_col], values[on_col])
    return rows, cols


def _side(plan: _Plan, p: np.ndarray, mask: np.ndarray, a: int, b: int, col: bool) -> np.ndarray:
    """One side's codes of the product ``p`` of tiles ``a < b``: a comparison of the tile
    with each query's limit finds the few entries whose exact key can pass (one pass per side
    costs less than one pass with the tile's loosest limit: the extraction scales with the
    survivors), then :func:`_codes` decides on those alone."""
    if col:
        np.less_equal(p, plan.limit[b * TILE : b * TILE + p.shape[1]][None, :], out=mask)
    else:
        np.less_equal(p, plan.limit[a * TILE : a * TILE + p.shape[0]][:, None], out=mask)
    flat = np.flatnonzero(mask)
    i, j = np.divmod(flat, p.shape[1])
    gi, gj = i + a * TILE, j + b * TILE
    query, ref = (gj, gi) if col else (gi, gj)
    return _codes(plan, query, ref, p.ravel()[flat])


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
    keys = canonical_keys(plan.whole, short + q0, 0, n)
    q = np.repeat(short, n)
    ref = np.tile(np.arange(n), short.size)
    valid = q + q0 != ref
    if plan.groups is not None:
        valid &= plan.groups[q + q0] != plan.groups[ref]
    code = q[valid].astype(np.uint64) << np.uint64(32 + plan.col_bits)
    code |= sortable_bits(keys.ravel()[valid]).astype(np.uint64) << np.uint64(plan.col_bits)
    code |= ref[valid].astype(np.uint64)
    return code


def _finish(plan: _Plan, a: int, parts: list[np.ndarray]) -> ScoredBlock:
    """Sort and score the queries of tile ``a`` once they have every candidate."""
    q0 = a * TILE
    b = min(TILE, plan.n - q0)
    codes = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint64)
    row_shift = np.uint64(32 + plan.col_bits)
    counts = np.bincount((codes >> row_shift).astype(np.int64), minlength=b)
    need = plan.need[q0 : q0 + b]
    short = np.flatnonzero(counts < need)
    if short.size:  # the subsample margin failed (rare): take every valid reference
        codes, counts = _with_redone(plan, q0, short, codes, b)
    block: Candidates = sort_block(codes, counts, q0, plan.col_bits, False)
    if plan.sampled is not None:
        late = rows_past_threshold(block, need, plan.sampled[q0 : q0 + b])
        late = np.setdiff1d(late, short)  # the short rows hold every valid reference already
        if late.size:  # rarer still: short by less than the band; every valid reference again
            codes, counts = _with_redone(plan, q0, late, codes, b)
            block = sort_block(codes, counts, q0, plan.col_bits, False)
    return ScoredBlock(slice(q0, q0 + b), *plan.task.score_block(block))


def _with_redone(
    plan: _Plan, q0: int, rows: np.ndarray, codes: np.ndarray, b: int
) -> tuple[np.ndarray, np.ndarray]:
    """``codes`` of the ``b`` queries of tile rows from ``q0`` with those of ``rows`` replaced
    by every valid reference (:func:`_redo`), and the counts per query."""
    row_shift = np.uint64(32 + plan.col_bits)
    codes = codes[~np.isin(codes >> row_shift, rows.astype(np.uint64))]
    codes = np.concatenate((codes, _redo(plan, q0, rows)))
    return codes, np.bincount((codes >> row_shift).astype(np.int64), minlength=b)


def stripe_window(need: np.ndarray, memory_budget: int) -> int:
    """Tiles apart up to which a product serves both sides (:func:`schedule`): the candidates
    waiting for later stripes (about 1.5 x depth per query) stay within the budget."""
    per_tile = 8 * TILE * (float(np.mean(need * 1.5 + 64)) if need.size else 64.0)
    return max(1, int(memory_budget // per_tile))


def symmetric_blocks(
    task: RetrievalTask,
    *,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    progress: bool | None = None,
    n_threads: int | None = None,
) -> Iterator[ScoredBlock]:
    """Leave-one-out scored blocks (one per tile of :data:`TILE` queries, as tiles complete),
    each product computed once (see the module); the values do not depend on ``n_threads``."""
    n_threads = default_threads() if n_threads is None else n_threads
    pool = None
    if n_threads > 1:
        pool = concurrent.futures.ThreadPoolExecutor(n_threads, "embedeval-symmetric")
    try:
        with single_threaded_blas(), progress_bar(task.n_query, "queries", enabled=progress) as bar:
            plan = _make_plan(task, pool)
            window = stripe_window(plan.need, memory_budget)
            for block in _stream(plan, pool, n_threads, window):
                yield block
                bar.update(block.rows.stop - block.rows.start)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)


def run_symmetric(
    task: RetrievalTask,
    *,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    progress: bool | None = None,
    n_threads: int | None = None,
) -> tuple[Columns, Columns]:
    """:func:`symmetric_blocks` gathered: per-query values and tie flags."""
    values, ties = task.empty_outputs()
    blocks = symmetric_blocks(
        task, memory_budget=memory_budget, progress=progress, n_threads=n_threads
    )
    write_back(values, ties, blocks)
    return values, ties


def _stream(plan: _Plan, pool: Any, n_threads: int, window: int) -> Iterator[ScoredBlock]:
    """Yield the scored blocks of tiles of queries as they complete: tile products in the order of
    :func:`schedule`, at most ``2 * n_threads`` in flight, each finished tile sorted and scored
    in the pool while the next products run."""
    nt = plan.n_tiles
    pending = _Pending(plan)
    pairs = iter(schedule(nt, window))
    if pool is None:
        for a, b, sides in pairs:
            pending.add(a, b, _tile_hits(plan, a, b, sides))
            if b == nt - 1 and "r" in sides:  # the last product of stripe a
                yield _finish(plan, a, pending.take(a))
        return
    waiting: collections.deque = collections.deque()
    finishing: collections.deque = collections.deque()
    for a, b, sides in _take(pairs, 2 * n_threads):
        waiting.append((a, b, sides, pool.submit(_tile_hits, plan, a, b, sides)))
    while waiting:
        a, b, sides, future = waiting.popleft()
        pending.add(a, b, future.result())
        for item in _take(pairs, 1):
            waiting.append((*item, pool.submit(_tile_hits, plan, *item)))
        if b == nt - 1 and "r" in sides:
            finishing.append(pool.submit(_finish, plan, a, pending.take(a)))
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


class _Pending:
    """The candidate codes waiting, per tile of queries, for the tile's last product; each
    tile's thresholds are tightened (:func:`tighten`) whenever its waiting codes have grown to
    twice what the last tightening kept (plus a slack), so the sorting this costs stays
    proportional to the candidates found."""

    def __init__(self, plan: _Plan) -> None:
        self.plan = plan
        self.parts: list[list[np.ndarray]] = [[] for _ in range(plan.n_tiles)]
        self.size = [0] * plan.n_tiles
        self.trigger = [_SLACK * TILE] * plan.n_tiles

    def add(self, a: int, b: int, hits: tuple[Any, Any]) -> None:
        """The codes of the product of tiles ``a <= b``: the row side's and the column side's."""
        for tile, codes in ((a, hits[0]), (b, hits[1])):
            if codes is None:
                continue
            self.parts[tile].append(codes)
            self.size[tile] += codes.size
            if self.size[tile] > self.trigger[tile]:
                kept = tighten(self.plan, tile, np.concatenate(self.parts[tile]))
                self.parts[tile], self.size[tile] = [kept], kept.size
                self.trigger[tile] = 2 * kept.size + _SLACK * TILE

    def take(self, a: int) -> list[np.ndarray]:
        """Tile ``a``'s codes (it has every candidate), forgotten here."""
        parts, self.parts[a], self.size[a] = self.parts[a], [], 0
        return parts


def tighten(plan: _Plan, tile: int, codes: np.ndarray) -> np.ndarray:
    """Lower the thresholds of the queries of ``tile`` that already hold as many candidates as
    they need to the key of their ``need``-th nearest one (an exact bound: that many references
    are at or below it) and drop the codes above; returns the kept codes, sorted.

    The subsample thresholds carry a wide safety margin; a few tiles of found candidates give a
    much tighter one, and every later product then lets fewer entries through.  Ties at the new
    threshold stay (``<=``), so the candidates still hold every reference up to the ``need``-th
    key, ties included: the values scored from them do not depend on when this ran (only the
    candidates beyond that key, which no kernel reads, do).
    """
    q0 = tile * TILE
    m = min(TILE, plan.n - q0)
    codes.sort()
    key_bits = ((codes >> np.uint64(plan.col_bits)) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    rows = (codes >> np.uint64(32 + plan.col_bits)).astype(np.int64)
    counts = np.bincount(rows, minlength=m)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    need = plan.need[q0 : q0 + m]
    full = np.flatnonzero((counts >= need) & (need > 0))
    kth = from_sortable_bits(key_bits[starts[full] + need[full] - 1])
    if plan.reach is not None:
        kth = plan.reach.widen(q0 + full, kth)
    lower = kth < plan.tau[q0 + full]
    full, kth = full[lower], kth[lower]
    plan.tau[q0 + full] = kth
    plan.limit[q0 + full] = entry_limits(
        kth, None if plan.whole.sq is None else plan.whole.sq[q0 + full]
    )
    return codes[key_bits <= sortable_bits(plan.tau[q0 : q0 + m])[rows]]
