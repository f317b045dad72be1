"""The exact, streaming kNN engine (internal; :func:`embedeval.neighbors` is its public face).

How it works (and why it is faster and lighter than a faiss ``search`` with a large k):

1. Queries are processed in blocks whose size comes from a memory budget (and a cache-sized cap
   on the block's candidates: :func:`block_layout`), so peak memory is O(block x n_reference),
   never O(n_query x n_reference).  Blocks run in worker threads
   (:func:`embedeval.engine.threads.in_order`), each product on one BLAS thread, so that every pass
   uses every core and the float32 keys do not depend on the number of threads.
2. For a block, one BLAS product gives a *ranking key* per (query, reference) pair:
   ``||r||^2 - 2 q.r`` for the Euclidean distance (the query's own norm does not change its
   ranking) and ``-q.r`` for cosine / inner product.  Excluded references (the query itself,
   references in the query's group: :class:`Exclusions`) get ``+inf``.
3. Each query needs a known number of its nearest references (its *depth*: 1 for P@1, R_q + 1
   for MAP@R, ...).  Rather than a selection over all n_reference keys, a per-query threshold is
   read off a fixed random subsample of the columns (an order statistic with a safety margin),
   all keys at or below it are kept, and the count is verified: a query whose candidate set came
   out too small is redone with every reference, so the result is always exact.  Every key
   equal to the threshold is kept, so ties at the cut-off are never split.
4. Candidates are packed as ``uint64`` = (order-preserving bits of the float32 key) << 32 | column
   and sorted per row, which orders by distance and then by ascending reference index — the tie
   rule of faiss's flat index — in one ``np.sort``.
5. The float32 keys are a filter: thresholds are widened by twice the keys' error bound, and
   the scorer re-orders runs of near-ties by float64 keys (:mod:`embedeval.engine.decide`), so
   the ranking is the float64 one.  Euclidean inputs far from the origin are first translated
   by an exact centre (:func:`exact_centre`).

One :class:`EnginePlan` (made by :func:`plan_search`) holds everything fixed before the first
block: the prepared product, each query's depth, the column subsample, the exclusions, the label
threshold, the tile width and block size.  :func:`search_block` turns it into the sorted
candidates of one query block; :func:`sorted_candidates` streams them over every block.

Why other backends can be bit-identical to this engine: BLAS ``sgemm`` rounds differently for
different matrix shapes (measured with OpenBLAS 0.3: ``(A @ B)[:256]`` and ``A[:256] @ B``
differ in the last bits), so a backend reproduces these keys only if it multiplies the same query
rows by the same reference columns in products of the same shapes: the same plan
(:func:`block_layout`, :func:`column_subsample`), and keys from :func:`grid_keys`.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..utils.errors import InputError
from ..utils.mapped import row_blocks
from ..utils.progress import progress_bar
from .candidates import Candidates, sortable_bits
from .decide import Reach, direction_rows, reach_of, reference_sq_bound, rounding_of
from .duplicates import DuplicateKeys, DuplicateRows, find_duplicate_rows
from .labels import match_matrix
from .threads import in_order, single_threaded_blas

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "KEY_MAX",
    "TILE",
    "TINY_NORM",
    "EnginePlan",
    "Exclusions",
    "PreparedSearch",
    "all_valid_codes",
    "block_layout",
    "collect",
    "column_stats",
    "column_subsample",
    "depth_thresholds",
    "exact_centre",
    "grid_keys",
    "label_cutoff",
    "normalize_rows",
    "pack_codes",
    "plan_search",
    "range_exponent",
    "redo_rows",
    "reference_duplicates",
    "refuse_zero_rows",
    "representatives",
    "rows_past_threshold",
    "search_block",
    "sort_block",
    "sort_row_runs",
    "sorted_candidates",
    "tie_representatives",
    "tied_search",
    "unit_rows",
]

#: The largest finite float32: a cut-off that keeps every finite key and no excluded (+inf) one.
KEY_MAX = np.float32(np.finfo(np.float32).max)
#: Width of the column tiles products are cut into when the reference has more than 16 of them.
TILE = 2048
_SUBSAMPLE = 1024
_MAX_BLOCK = 512
_BYTES_PER_CANDIDATE = 72
_SORT_RUN = 1 << 16
_BLOCK_CODE_BYTES = 12 << 20
#: Default working-memory budget of one engine thread, in bytes.  Peak memory is about this times
#: the number of threads, plus the embeddings themselves and O(n_query) per-query results.
DEFAULT_MEMORY_BUDGET = 256 * 2**20


@dataclass(frozen=True)
class Exclusions:
    """Which references each query must not see: the one place exclusions are decided.

    ``self_index``: query i excludes reference i (leave-one-out, or PML's ``ref_includes_query``).
    ``query_groups`` / ``reference_groups``: integer group codes; a query excludes every
    reference of its own group.

    >>> ex = Exclusions(self_index=True)
    >>> ex.excluded(np.array([0, 0, 1]), np.array([0, 1, 1])).tolist()
    [True, False, True]
    """

    self_index: bool = False
    query_groups: np.ndarray | None = None
    reference_groups: np.ndarray | None = None

    def excluded(self, query_rows: np.ndarray, reference_cols: np.ndarray) -> np.ndarray | None:
        """Boolean mask of excluded (query, reference) pairs given as aligned index arrays
        (``None``: nothing is excluded)."""
        out = None
        if self.self_index:
            out = reference_cols == query_rows
        if self.reference_groups is not None:
            same = self.reference_groups[reference_cols] == self.query_groups[query_rows]
            out = same if out is None else out | same
        return out

    def other_group(self, query_rows: np.ndarray, reference_cols: np.ndarray) -> np.ndarray:
        """True where a (query, reference) pair is not excluded by the groups (aligned index
        arrays; only for exclusions with groups)."""
        return self.reference_groups[reference_cols] != self.query_groups[query_rows]

    def hide(self, keys: np.ndarray, rows: np.ndarray, t0: int, groups: bool = True) -> None:
        """Set to ``+inf`` the keys of excluded pairs in a tile: query ``rows`` (global) against
        reference columns ``[t0, t0 + keys.shape[1])``; ``groups=False`` leaves the group
        exclusions to the caller (cheaper to filter among the candidates)."""
        t1 = t0 + keys.shape[1]
        if self.self_index:
            inside = np.flatnonzero((rows >= t0) & (rows < t1))
            keys[inside, rows[inside] - t0] = np.inf
        if groups and self.reference_groups is not None:
            same = self.reference_groups[None, t0:t1] == self.query_groups[rows, None]
            keys[same] = np.inf

    def by_group(self, n_query: int, n_reference: int) -> Exclusions:
        """The same exclusions as group codes alone, which travel with the rows.

        Self-exclusion (query i is reference i) is tied to positions, so it breaks when the
        queries are split into subsets or the reference into shards; group codes do not.  Query
        i gets group i and reference j < n_query group j (others -1).  With user groups and
        self-exclusion the own row is already in the query's group in leave-one-out evaluation;
        the one case groups cannot express (``ref_includes_query=True`` with a query whose own
        reference row carries another group) is refused.
        """
        if self.reference_groups is not None:
            if self.self_index:
                differs = np.flatnonzero(self.reference_groups[:n_query] != self.query_groups)
                if differs.size:
                    raise InputError(
                        "ref_includes_query=True with groups, where query row "
                        f"{int(differs[0])} has a different group from its own reference row, "
                        "is only supported by the local exact backend (shards=None, index=None, "
                        "backend='local')."
                    )
            return Exclusions(
                query_groups=self.query_groups, reference_groups=self.reference_groups
            )
        if self.self_index:
            q_groups = np.arange(n_query, dtype=np.int64)
            r_groups = np.full(n_reference, -1, dtype=np.int64)
            r_groups[:n_query] = q_groups
            return Exclusions(query_groups=q_groups, reference_groups=r_groups)
        return Exclusions()

    def for_references(self, columns: slice) -> Exclusions:
        """Group exclusions against the reference ``columns`` alone (one shard)."""
        if self.self_index:
            raise ValueError("self-exclusion is positional: take by_group() first")
        if self.reference_groups is None:
            return self
        return dataclasses.replace(self, reference_groups=self.reference_groups[columns])

    def for_queries(self, rows: slice | np.ndarray) -> Exclusions:
        """Group exclusions of the query subset ``rows`` (see :meth:`by_group`)."""
        if self.self_index:
            raise ValueError("self-exclusion is positional: take by_group() first")
        if self.query_groups is None:
            return self
        return dataclasses.replace(self, query_groups=self.query_groups[rows])


@dataclass(frozen=True)
class PreparedSearch:
    """Query and reference matrices arranged so that one product gives the ranking keys.

    Euclidean: queries ``[-2 q, 1]`` and references ``[r, ||r||^2]``, so the product is
    ``||r||^2 - 2 q.r`` (the squared distance minus the query's own norm, which does not change
    its ranking).  Cosine / inner product: ``-q`` against ``r`` (cosine normalises both first).
    Scaling by -2 or -1 is exact in floating point, so no pass over the product is needed.
    """

    queries: np.ndarray
    reference_t: np.ndarray
    query_sq_norms: np.ndarray | None
    #: Identical reference columns, whose keys are overwritten by one shared key per group.
    duplicates: DuplicateKeys | None = None
    #: How far above its thresholds each query row keeps float32 keys (twice their error bound:
    #: :class:`embedeval.engine.decide.Reach`), so that the candidates hold every reference the
    #: float64 decision may rank within the depth.
    reach: Reach | None = None

    @classmethod
    def build(
        cls,
        xq: np.ndarray,
        xb: np.ndarray,
        distance: str,
        m_sq: float | None = None,
        precision: str = "float32",
    ) -> PreparedSearch:
        """The product of ``xq`` against ``xb``; ``m_sq`` bounds every squared norm of the
        whole reference when ``xb`` is only part of it (a shard), for the ``reach``.

        ``precision="float64"`` prepares both sides in float64 (norms and normalisation
        included): each key is then a float64 product rounded once to float32, within about
        one float32 rounding of its float64 value (:func:`embedeval.engine.decide.rounding_of`)
        where the float32 product errs by up to ``d`` of them.  It costs about twice the
        float32 product and pays where rankings are deep and crowded: far fewer keys then lie
        within their bound of one another.  ``precision="exact"`` is the float32 product of
        small integers, whose keys are exact (:mod:`embedeval.engine.integers`): its reach
        widens no threshold."""
        if precision == "float64":
            return cls._build64(xq, xb, distance, m_sq)
        if precision == "exact":
            search = cls.build(xq, xb, distance, m_sq, "float32")
            exact = dataclasses.replace(search.reach, scale=0.0, input_u=0.0)
            return dataclasses.replace(search, reach=exact)
        dim = int(xq.shape[1])
        if distance == "cosine":
            xq, xb = normalize_rows(xq, "query"), normalize_rows(xb, "reference")
            reach = reach_of(xq, None, 1.0, distance)
        else:
            sq_ref = np.einsum("ij,ij->i", xb, xb, dtype=np.float32)
            sq_query = np.einsum("ij,ij->i", xq, xq, dtype=np.float32)
            m_sq = reference_sq_bound(sq_ref, dim) if m_sq is None else m_sq
            reach = reach_of(xq, sq_query, m_sq, distance)
        if distance == "euclidean":
            ref = np.empty((xb.shape[0], xb.shape[1] + 1), dtype=np.float32)
            ref[:, :-1] = xb
            ref[:, -1] = sq_ref
            q = np.empty((xq.shape[0], xq.shape[1] + 1), dtype=np.float32)
            np.multiply(xq, np.float32(-2.0), out=q[:, :-1])
            q[:, -1] = 1.0
            return cls(q, ref.T, sq_query, reach=reach)
        queries = np.negative(np.asarray(xq, dtype=np.float32))
        return cls(queries, np.asarray(xb).T, None, reach=reach)

    @classmethod
    def _build64(
        cls, xq: np.ndarray, xb: np.ndarray, distance: str, m_sq: float | None
    ) -> PreparedSearch:
        """:meth:`build` with ``precision="float64"``."""
        dim = int(xq.shape[1])
        rounding = rounding_of("float64")
        q = np.asarray(xq, dtype=np.float64)
        if distance == "euclidean":  # the rows written once, beside their squared norms
            ref = np.empty((xb.shape[0], dim + 1), dtype=np.float64)
            ref[:, :-1] = q if xb is xq else xb
            x = ref[:, :-1]
        else:
            x = q if xb is xq else np.asarray(xb, dtype=np.float64)
        if distance == "cosine":
            q = unit_rows64(q, "query")
            x = q if xb is xq else unit_rows64(x, "reference")
            reach = Reach(np.ones(q.shape[0]), 1.0, dim, distance, *rounding)
            return cls(-q, x.T, None, reach=reach)
        sq_ref = np.einsum("ij,ij->i", x, x)
        sq_query = np.einsum("ij,ij->i", q, q)
        m_sq = float(sq_ref.max(initial=0.0)) if m_sq is None else m_sq
        wide = 1.0 + 2.0**-40  # the float64 norms' own rounding, far below it
        reach = Reach(sq_query * wide, m_sq * wide, dim, distance, *rounding)
        if distance == "inner_product":
            return cls(-q, x.T, None, reach=reach)
        # Row-major with the norms as a last column (its transpose is the product's operand,
        # as for float32): a transposed copy of the rows took most of the build.
        ref[:, -1] = sq_ref
        queries = np.empty((q.shape[0], dim + 1), dtype=np.float64)
        np.multiply(q, -2.0, out=queries[:, :-1])
        queries[:, -1] = 1.0
        return cls(queries, ref.T, sq_query, reach=reach)

    @property
    def n_reference(self) -> int:
        return int(self.reference_t.shape[1])

    def keys(
        self, rows: slice | np.ndarray, cols: slice = slice(None), out=None, tie: bool = True
    ) -> np.ndarray:
        """Ranking keys (smaller = nearer) of query ``rows`` against reference ``cols``;
        ``tie=False`` leaves identical references' columns as the product rounded them (the
        caller takes their shared keys from ``duplicates.candidates``)."""
        if self.queries.dtype == np.float64:  # a float64 product rounded to float32 keys
            keys = _rounded_product(self.queries[rows], self.reference_t[:, cols], out)
        else:
            keys = np.matmul(self.queries[rows], self.reference_t[:, cols], out=out)
        if tie and self.duplicates is not None:
            self.duplicates.apply(keys, self.queries, rows, cols)
        return keys

    def sample_keys(self, rows: slice, cols: np.ndarray) -> np.ndarray:
        """Keys of query ``rows`` against the reference columns ``cols`` for the depth
        thresholds (:func:`depth_thresholds`): a float32 product whatever the search's
        precision, as a threshold only needs to be likely to hold enough keys (the engine
        counts them, and redoes a short row against every reference)."""
        if self.queries.dtype != np.float64:
            return self.keys(rows, cols)
        q = self.queries[rows].astype(np.float32)
        keys = q @ self.reference_t[:, cols].astype(np.float32)
        if self.duplicates is not None:
            self.duplicates.apply(keys, self.queries, rows, cols)
        return keys

    def with_duplicates(
        self, dups: DuplicateRows | None, reps_t: np.ndarray | None, columns: slice | np.ndarray
    ) -> PreparedSearch:
        """This search with the identical reference rows ``dups`` tied: its columns are the
        global reference ``columns`` (a range or sorted indices); ``reps_t`` from
        :func:`representatives`."""
        if dups is None:
            return self
        return dataclasses.replace(self, duplicates=dups.view(reps_t, columns))


def range_exponent(arrays: list[np.ndarray], distance: str, block: int = 65536) -> int:
    """A power of two ``e`` such that ``x * 2**e`` keeps every key finite and well above the
    float32 underflow, or 0 when the data need none (the common case: keys stay bit-identical).

    Euclidean and inner-product keys grow like d * max|x|**2, so finite inputs above about
    2**60 overflow float32, and below about 2**-63 their products underflow (to 0 below
    2**-75); inputs are scaled when d * max|x|**2 nears 2**118 or max|x| < 2**-40.  Scaling by
    the same power of two on both sides is exact and changes no ranking (every key is
    multiplied by 2**(2e)), so the data are brought to max|x| in [0.5, 1) instead.  Cosine
    normalises each row first and needs no scaling.
    """
    if distance == "cosine":
        return 0
    largest = 0.0
    for x in arrays:
        for a in range(0, x.shape[0], block):
            largest = max(largest, float(np.abs(np.asarray(x[a : a + block])).max(initial=0)))
    dim = arrays[0].shape[1]
    if largest == 0.0 or (4.0 * dim * largest * largest < 2.0**120 and largest >= 2.0**-40):
        return 0
    return -int(np.frexp(largest)[1])


def column_stats(
    arrays: list[np.ndarray], block: int = 65536
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per column of the rows of every array in ``arrays``: the smallest and largest value
    (float32) and the mean (float64), read in blocks of rows."""
    lo, hi, total, count = None, None, 0.0, 0
    for x in arrays:
        bounds = [(a, a + block) for a in range(0, x.shape[0], block)]
        for part in row_blocks(x, bounds):  # a memory map's pages released block by block
            part = np.asarray(part, dtype=np.float32)
            if not part.shape[0]:
                continue
            p_lo, p_hi = part.min(axis=0), part.max(axis=0)
            lo = p_lo if lo is None else np.minimum(lo, p_lo)
            hi = p_hi if hi is None else np.maximum(hi, p_hi)
            total = total + part.sum(axis=0, dtype=np.float64)
            count += part.shape[0]
    return lo, hi, total / max(count, 1)


def exact_centre(lo: np.ndarray, hi: np.ndarray, mean: np.ndarray) -> np.ndarray | None:
    """A float32 centre ``c`` whose subtraction ``x - c`` is exact for every value of each column
    (between ``lo`` and ``hi``), as close to the column's ``mean`` as that allows; ``None``
    when no column can move.

    The Euclidean key ``||r||^2 - 2 q.r`` cancels the digits the norms share: data far from the
    origin (norms that dwarf the distances) lose every significant digit.  Distances do not
    change under a translation, and by Sterbenz's lemma ``x - c`` is exact in floating point
    whenever ``c / 2 <= x <= 2 c``: a column whose values all lie in ``[lo, hi]`` with
    ``0 < hi <= 4 lo`` (or the mirror image below zero) takes ``c = clip(mean, hi / 2, 2 lo)``,
    so every translated row is exactly the original minus ``c``, distances and ties (identical
    rows included) are exactly those of the inputs, and the keys lose only the bits the spread
    of the data leaves.  Other columns (values of both signs, zero, or spread over more than a
    factor of four: their offset is at most comparable to their spread) keep ``c = 0``.

    Examples
    --------
    >>> lo, hi = np.array([999.5, -3.0], np.float32), np.array([1000.5, 3.0], np.float32)
    >>> exact_centre(lo, hi, np.array([1000.1, 0.2])).tolist()
    [1000.0999755859375, 0.0]
    >>> exact_centre(lo[1:], hi[1:], np.array([0.2])) is None
    True
    """
    lo, hi = np.asarray(lo, np.float32), np.asarray(hi, np.float32)
    m = np.asarray(mean, np.float64).astype(np.float32)
    up = (lo > 0) & (hi <= 4 * np.float64(lo))
    down = (hi < 0) & (lo >= 4 * np.float64(hi))
    if not (up | down).any():
        return None
    with np.errstate(over="ignore"):  # only the columns that pass are read
        half_hi, twice_lo = hi * np.float32(0.5), lo * np.float32(2)
        half_lo, twice_hi = lo * np.float32(0.5), hi * np.float32(2)
    centre = np.zeros(lo.shape, dtype=np.float32)
    centre[up] = np.clip(m[up], half_hi[up], twice_lo[up])
    centre[down] = np.clip(m[down], twice_hi[down], half_lo[down])
    return centre


def reference_duplicates(xb: np.ndarray, distance: str) -> DuplicateRows | None:
    """Groups of reference rows that every query ranks alike: identical rows, and for cosine
    positive multiples of one another (a vector and its triple are one direction).

    Cosine rows are compared as :func:`~.decide.direction_rows` (exact: rows equal after float32
    normalisation may point in directions a float64 cosine tells apart, and would be tied
    wrongly)."""
    return find_duplicate_rows(xb, direction_rows if distance == "cosine" else None)


def representatives(
    xb: Any, dups: DuplicateRows | None, distance: str, precision: str = "float32"
) -> np.ndarray | None:
    """The first member of each duplicate group, prepared like a reference (dim' x groups)
    for a search of ``precision`` (:meth:`PreparedSearch.build`)."""
    if dups is None:
        return None
    rows = np.asarray(xb[dups.first], dtype=np.float32)
    return PreparedSearch.build(rows[:1], rows, distance, precision=precision).reference_t


def unit_rows64(x: np.ndarray, name: str) -> np.ndarray:
    """float64 rows ``x`` scaled to unit L2 norm in float64 (a zero row is refused as by
    :func:`normalize_rows`)."""
    norms = np.sqrt(np.einsum("ij,ij->i", x, x))
    if (norms == 0).any():
        normalize_rows(np.asarray(x, dtype=np.float32), name)  # raises, naming the row
    return x / norms[:, None]


def tied_search(
    search: PreparedSearch,
    plan: EnginePlan,
    xb: Any,
    distance: str,
    precision: str,
    columns: slice | np.ndarray,
) -> PreparedSearch:
    """``search`` (of ``precision``) with the identical reference rows of ``plan`` tied, their
    representatives prepared at the same precision (:meth:`PreparedSearch.with_duplicates`,
    :func:`tie_representatives`)."""
    reps = tie_representatives(plan, xb, distance, precision)
    return search.with_duplicates(plan.duplicates, reps, columns)


def tie_representatives(plan: EnginePlan, xb: Any, distance: str, precision: str) -> Any:
    """The representatives of ``plan``'s identical reference rows (``xb``: the reference)
    prepared for a search of ``precision``: the plan's own for a float32 product (``"exact"``
    included), rebuilt for a float64 one, whose keys they must match to within its bound."""
    if precision == "float64" and plan.duplicates is not None:
        return representatives(xb, plan.duplicates, distance, precision)
    return plan.representatives


#: Rows whose norm is below this (float32's smallest normal number) are scaled by a power of two
#: before they are normalised (:func:`normalize_rows`).
TINY_NORM = 2.0**-126


#: Bytes of the float64 product formed at a time before it is rounded to float32 keys.
_FLOAT64_PIECE_BYTES = 8 << 20


def _rounded_product(
    queries: np.ndarray, reference_t: np.ndarray, out: np.ndarray | None
) -> np.ndarray:
    """``queries @ reference_t`` in float64, rounded to float32 (into ``out`` when given).

    Formed a few thousand columns at a time in one reused buffer: a fresh float64 result the
    size of the block costs its page faults and a second trip through memory to be rounded
    (one core, 251 x 20,000 x 129: a median 35 ms whole against 29 ms in pieces).  A short last
    piece joins the one before it, so no piece is a single column (a matrix-vector product,
    which BLAS sums in another order).

    >>> q = np.array([[1.0, 1.0]])
    >>> r = np.array([[1e8, 3.0], [-1e8 + 0.5, -3.0]])  # sums that cancel
    >>> keys = _rounded_product(q, r, None)
    >>> keys.dtype.name, keys.tolist()
    ('float32', [[0.5, 0.0]])
    """
    b, n = queries.shape[0], reference_t.shape[1]
    keys = np.empty((b, n), dtype=np.float32) if out is None else out
    width = max(512, _FLOAT64_PIECE_BYTES // (8 * max(b, 1)))
    cuts = [*range(0, n, width), n]
    if len(cuts) > 2 and cuts[-1] - cuts[-2] < width // 2:
        del cuts[-2]  # the short tail joins the piece before it
    piece = np.empty((b, max(np.diff(cuts).tolist(), default=0)))
    for c0, c1 in itertools.pairwise(cuts):
        np.matmul(queries, reference_t[:, c0:c1], out=piece[:, : c1 - c0])
        keys[:, c0:c1] = piece[:, : c1 - c0]
    return keys


def normalize_rows(x: np.ndarray, name: str) -> np.ndarray:
    """``x`` (float32) with every row scaled to unit L2 norm, as cosine ranks: the float64 norm
    rounded to float32, then a float32 division; a zero row is an ``InputError`` naming the
    argument ``name`` and the row.

    A row whose norm is below :data:`TINY_NORM` (subnormal values) is first multiplied by a
    power of two that brings its norm into ``[1, 2)``: exact, and the same direction, whereas
    its norm rounded to a subnormal float32 would keep too few bits for the error bound of the
    keys (:func:`embedeval.engine.decide.key_bounds`).

    >>> normalize_rows(np.float32([[3e-41, 4e-41]]), "query").round(6).tolist()
    [[0.6, 0.8]]
    """
    x = np.asarray(x, dtype=np.float32)
    norms = np.sqrt(np.einsum("ij,ij->i", x, x, dtype=np.float64))
    refuse_zero_rows(norms, name)
    return unit_rows(x, norms)


def unit_rows(x: np.ndarray, norms: np.ndarray) -> np.ndarray:
    """Rows of ``x`` divided by their float64 ``norms`` (none zero) in ``x``'s own precision:
    the norm rounded to it, then one division.  A row whose norm is below that precision's
    smallest normal number (:data:`TINY_NORM` for float32) is first multiplied by the power of
    two that brings its norm into ``[1, 2)``: exact, the same direction, and a norm that keeps
    every bit.

    >>> unit_rows(np.float64([[3e-320, 4e-320]]), np.float64([5e-320])).round(12).tolist()
    [[0.6, 0.8]]
    """
    out = x / norms.astype(x.dtype)[:, None]
    tiny = np.flatnonzero(norms < np.finfo(x.dtype).tiny)
    if tiny.size:  # those rows again, scaled: exact, as each value times 2**k fits the type
        shift = 1 - np.frexp(norms[tiny])[1]  # norm * 2**shift in [1, 2); 2**shift may not fit
        rows = np.ldexp(x[tiny], shift[:, None].astype(np.int32)).astype(x.dtype)
        out[tiny] = rows / np.ldexp(norms[tiny], shift).astype(x.dtype)[:, None]
    return out


def refuse_zero_rows(norms: np.ndarray, name: str) -> None:
    """The ``InputError`` of cosine's zero rows (``norms`` of every row of ``name``, zero where
    a row is), naming how many and the first.

    >>> refuse_zero_rows(np.array([1.0, 2.0]), "reference")  # none: nothing raised
    """
    zero = np.flatnonzero(norms == 0)
    if zero.size:
        raise InputError(
            f"distance='cosine' needs non-zero vectors; {zero.size} row(s) of {name} are all "
            f"zero (first at row {int(zero[0])}). Drop them or use distance='euclidean'."
        )


@dataclass(frozen=True)
class EnginePlan:
    """Everything the engine's block functions need about one search, fixed before any block.

    ``need[q]`` is the number of nearest references query row q of ``search`` must keep
    (``min(depth, n_valid)``); ``subsample`` the seeded columns its depth threshold is read from
    (:func:`column_subsample`); ``tile``, ``block_size`` and ``col_bits`` the product shapes and
    code packing (:func:`block_layout`).  ``threshold`` (``"max"`` / ``"min"``, with the label
    codes) also keeps every reference up to the farthest / nearest one sharing the query's label.
    ``duplicates`` / ``representatives`` tie identical references
    (:mod:`embedeval.engine.duplicates`);
    ``search`` is the prepared product, ``None`` until :meth:`searching` when a backend builds
    it itself (per shard, per worker).
    """

    need: np.ndarray
    block_size: int
    tile: int
    col_bits: int
    subsample: np.ndarray | None
    distance: str
    exclusions: Exclusions = Exclusions()
    memory_budget: int = DEFAULT_MEMORY_BUDGET
    threshold: str | None = None
    query_codes: np.ndarray | None = None
    reference_codes: np.ndarray | None = None
    duplicates: DuplicateRows | None = None
    representatives: np.ndarray | None = None
    search: PreparedSearch | None = None
    #: A bound on every squared norm of the whole reference (None: from the rows searched).
    reference_sq: float | None = None

    def searching(
        self,
        xq: np.ndarray,
        xb: np.ndarray,
        columns: slice | np.ndarray | None = None,
        precision: str = "float32",
    ) -> EnginePlan:
        """This plan searching queries ``xq`` in ``xb``, which holds the reference ``columns``
        (a range or sorted global indices; default: the whole reference), with a float32
        product (``precision="exact"``: of small integers, see :meth:`PreparedSearch.build`)."""
        search = PreparedSearch.build(xq, xb, self.distance, self.reference_sq, precision)
        columns = slice(0, int(xb.shape[0])) if columns is None else columns
        search = search.with_duplicates(self.duplicates, self.representatives, columns)
        return dataclasses.replace(self, search=search)

    def with_search(self, search: PreparedSearch) -> EnginePlan:
        """This plan multiplying with ``search`` (prepared by the caller)."""
        return dataclasses.replace(self, search=search)

    def for_queries(self, rows: slice) -> EnginePlan:
        """The plan of the query rows ``rows`` alone (group exclusions only: see
        :meth:`Exclusions.by_group`); its ``search`` is left to the caller."""
        codes = None if self.query_codes is None else self.query_codes[rows]
        return dataclasses.replace(
            self,
            need=self.need[rows],
            exclusions=self.exclusions.for_queries(rows),
            query_codes=codes,
            search=None,
        )


def plan_search(
    xb: np.ndarray,
    *,
    n_query: int,
    distance: str,
    depth: np.ndarray,
    exclusions: Exclusions = Exclusions(),
    n_valid: np.ndarray | None = None,
    positive_threshold: tuple[str, np.ndarray, np.ndarray] | None = None,
    block_size: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> EnginePlan:
    """The :class:`EnginePlan` of ``n_query`` queries searched in ``xb`` (without its
    ``search``: see :meth:`EnginePlan.searching`).  ``positive_threshold`` is ``(how,
    query_codes, reference_codes)``; ``n_valid`` defaults to every reference (minus the query's
    own row under self-exclusion)."""
    n_ref = int(xb.shape[0])
    if n_valid is None:
        n_valid = np.full(n_query, n_ref - int(exclusions.self_index), dtype=np.int64)
    need = np.minimum(depth, n_valid)
    dups = reference_duplicates(xb, distance)
    tile, block_size, col_bits = block_layout(
        need,
        n_ref,
        positive_threshold is not None,
        block_size,
        memory_budget,
        0 if dups is None else dups.n_groups,
    )
    how, q_codes, r_codes = (None, None, None) if positive_threshold is None else positive_threshold
    return EnginePlan(
        need=need,
        block_size=block_size,
        tile=tile,
        col_bits=col_bits,
        subsample=column_subsample(need, n_ref),
        distance=distance,
        exclusions=exclusions,
        memory_budget=memory_budget,
        threshold=how,
        query_codes=q_codes,
        reference_codes=r_codes,
        duplicates=dups,
        representatives=representatives(xb, dups, distance),
        reference_sq=None if distance == "cosine" else _reference_sq(xb),
    )


def _reference_sq(xb: np.ndarray, block: int = 65536) -> float:
    """A bound on every squared row norm of ``xb`` (read in blocks of rows)."""
    largest = 0.0
    for a in range(0, int(xb.shape[0]), block):
        part = np.asarray(xb[a : a + block], dtype=np.float32)
        sq = np.einsum("ij,ij->i", part, part, dtype=np.float32)
        largest = max(largest, reference_sq_bound(sq, int(xb.shape[1])))
    return largest


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
    n_threads: int | None = None,
    finish: Callable[[Candidates], Any] | None = None,
    precision: str = "float32",
) -> Iterator[Any]:
    """Yield, block by block, each query's nearest references in ranking order (CSR form).

    Each :class:`~embedeval.engine.candidates.Candidates` holds, for every query of the block, at
    least ``min(depth[q], n_valid[q])`` references (more when ties or the threshold margin add
    some), sorted by key and then by ascending reference index (the tie rule of faiss's flat
    index).

    ``positive_threshold = ("max" | "min", query_codes, reference_codes)`` additionally keeps every
    reference up to the farthest ("max", for full-depth AP) or nearest ("min", for MRR) reference
    sharing the query's label.  Queries with ``depth == 0`` get no candidates.

    Blocks are computed by ``n_threads`` threads (default:
    :func:`embedeval.engine.threads.default_threads`), each with its own working memory of about
    ``memory_budget`` bytes, and yielded in order.  ``finish``, when given, is applied to each
    block in its thread (e.g. the metric kernels), and its result is yielded instead.
    ``precision`` is the filter product's (:meth:`PreparedSearch.build`); the candidates then
    reach as far as its keys' bound (``search.reach``).
    """
    n_query = xq.shape[0]
    # The product first: it checks the queries (cosine: non-zero rows) before the reference.
    search = PreparedSearch.build(xq, xb, distance, precision=precision)
    plan = plan_search(
        xb,
        n_query=n_query,
        distance=distance,
        depth=depth,
        exclusions=exclusions,
        n_valid=n_valid,
        positive_threshold=positive_threshold,
        block_size=block_size,
        memory_budget=memory_budget,
    )
    columns = slice(0, int(xb.shape[0]))
    plan = plan.with_search(tied_search(search, plan, xb, distance, precision, columns))
    block_size = plan.block_size
    buffers = threading.local()  # each thread reuses its own key and mask buffers

    def one_block(start: int) -> Any:
        if getattr(buffers, "keys", None) is None:
            buffers.keys, buffers.mask = block_buffers(plan, min(block_size, n_query))
        block = search_block(
            plan, start, min(start + block_size, n_query), buffers.keys, buffers.mask
        )
        return block if finish is None else finish(block)

    starts = range(0, n_query, block_size)
    with progress_bar(n_query, "queries", enabled=progress) as bar, single_threaded_blas():
        for start, result in in_order(one_block, starts, n_threads):
            yield result
            bar.update(min(start + block_size, n_query) - start)


def block_buffers(plan: EnginePlan, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Scratch (keys, mask) arrays for blocks of up to ``n_rows`` queries of ``plan``."""
    keys = np.empty(n_rows * plan.tile, dtype=np.float32)
    return keys, np.empty(keys.size, dtype=bool)


def block_layout(
    need: np.ndarray,
    n_ref: int,
    label_threshold: bool,
    block_size: int | None,
    memory_budget: int,
    n_groups: int = 0,
) -> tuple[int, int, int]:
    """Column tile width, queries per block and reference-index bits of the packed codes.

    Product shapes decide float32 rounding, so every backend that must reproduce the local
    engine's keys takes its layout from here.  The block size is the largest that keeps a block's
    working memory within ``memory_budget`` and its candidate codes within about 12 MiB: the
    extraction, packing, sort and kernels stream those codes several times, and a block that
    stays in the caches runs faster (20,000 queries needing 4,000 neighbours each, best of four
    on two cores: 476-query blocks 3.7 s, 335: 3.5 s, 256: 3.2 s, 200: 3.4 s).
    """
    col_bits = max(1, int(n_ref - 1).bit_length())
    if not label_threshold:
        # Tiles of references small enough for the product, the comparison and the index
        # extraction to run in cache instead of streaming a block x n_reference matrix.
        tile = TILE if on_column_grid(n_ref) else n_ref
        expected = min(n_ref, int(need.max(initial=0) * 1.5) + 256)
        per_row = tile * 5 + expected * _BYTES_PER_CANDIDATE
    else:
        # The label threshold needs every key of a row before any comparison: whole rows.
        tile = n_ref
        expected = n_ref
        per_row = n_ref * (11 + _BYTES_PER_CANDIDATE)
    per_row += 4 * n_groups  # the shared keys of identical references (embedeval.engine.duplicates)
    if block_size is None:
        in_cache = _BLOCK_CODE_BYTES // (8 * expected)
        block_size = int(max(1, min(_MAX_BLOCK, memory_budget // per_row, max(16, in_cache))))
    # The packed sort key is (row in block, key bits, reference index) in 64 bits.
    block_size = max(1, min(block_size, 2 ** (32 - col_bits)))
    return tile, block_size, col_bits


def on_column_grid(n_ref: int) -> bool:
    """Whether keys against ``n_ref`` references are multiplied in :data:`TILE`-column products
    on the global column grid (more than 16 tiles) rather than in whole-row products."""
    return n_ref > 16 * TILE


def column_subsample(need: np.ndarray, n_ref: int) -> np.ndarray | None:
    """The fixed, seeded reference columns the depth thresholds are read from (sorted), or None
    when the reference is small enough to threshold on every column.  Every backend that must
    reproduce the engine's candidates uses this one."""
    # A larger subsample when queries need deep rankings: the threshold margin (relative to the
    # depth) shrinks with the subsample, and every extra candidate must be sorted.
    m = _SUBSAMPLE if need.max(initial=0) * _SUBSAMPLE < 64 * n_ref else 4 * _SUBSAMPLE
    if n_ref <= 2 * m:
        return None
    return np.sort(np.random.default_rng(0).choice(n_ref, m, replace=False))


def grid_keys(
    search: PreparedSearch,
    rows: slice | np.ndarray,
    t0: int,
    t1: int,
    out: np.ndarray | None = None,
    tie: bool = True,
    tiled: bool | None = None,
) -> np.ndarray:
    """Keys of ``rows`` against reference columns ``[t0, t1)``, multiplied in ``TILE``-column
    products on the global column grid when the reference is larger than 16 tiles (``tiled``
    overrides that, for a search over one shard of such a reference; ``tie``: see
    :meth:`PreparedSearch.keys`).

    BLAS rounds the same dot product differently in products of different shapes, so computing
    every key in the same product shapes (whatever the caller's row and column ranges) is what
    lets sharded and distributed backends reproduce these float32 keys bit for bit.
    """
    tiled = on_column_grid(search.n_reference) if tiled is None else tiled
    if not tiled or t1 - t0 <= TILE:
        return search.keys(rows, slice(t0, t1), out=out, tie=tie)
    n_rows = (rows.stop - rows.start) if isinstance(rows, slice) else len(rows)
    if out is None:
        out = np.empty((n_rows, t1 - t0), dtype=np.float32)
    for c0 in range(t0 - t0 % TILE, t1, TILE):
        a, b = max(c0, t0), min(c0 + TILE, t1)
        part = search.keys(rows, slice(c0, c0 + TILE), tie=tie)
        out[:, a - t0 : b - t0] = part[:, a - c0 : b - c0]
    return out


def depth_thresholds(
    search: Any,
    start: int,
    stop: int,
    need: np.ndarray,
    subsample: np.ndarray | None,
    exclusions: Exclusions,
) -> np.ndarray:
    """Per-query threshold tau with (very likely) at least ``need`` valid keys <= tau.

    The threshold is an order statistic of a fixed random column subsample of size m: with
    s = m / n_reference, it is the j-th smallest valid subsample key with
    j = s * need + 4 * sqrt(s * need) + 2, a margin of four binomial standard deviations.  The
    caller verifies the count and redoes the rare query whose candidate set came out short.
    A backend that holds only the subsample columns calls :func:`sample_thresholds` instead.
    """
    return sample_thresholds(
        lambda: search.sample_keys(slice(start, stop), subsample),
        start,
        need,
        subsample,
        search.n_reference,
        exclusions,
    )


def sample_thresholds(
    sample_keys: Callable[[], np.ndarray],
    start: int,
    need: np.ndarray,
    subsample: np.ndarray | None,
    n_reference: int,
    exclusions: Exclusions,
) -> np.ndarray:
    """:func:`depth_thresholds` from ``sample_keys()``, the keys of the block's queries (from
    row ``start``) against the ``subsample`` columns of ``n_reference``; only called when some
    query's order statistic falls inside the subsample."""
    tau = np.full(need.size, KEY_MAX, dtype=np.float32)
    if subsample is None:
        return tau
    m = subsample.size
    expected = need * (m / n_reference)
    j = np.ceil(expected + 4.0 * np.sqrt(expected) + 2.0).astype(np.int64)
    usable = j < m
    if not usable.any():
        return tau
    sample = sample_keys()
    rows = np.arange(start, start + need.size)
    excluded = exclusions.excluded(rows[:, None], subsample[None, :])
    if excluded is not None:
        sample[excluded] = np.inf
    kth = np.unique(j[usable])
    if kth[-1] <= 32:
        # Shallow needs: one partition at the largest order statistic, then a small sort of the
        # head, is cheaper than a partition with several kth.
        sample.partition(kth[-1], axis=1)
        sample[:, : kth[-1]].sort(axis=1)
    elif kth.size <= 4:
        sample.partition(kth, axis=1)
    else:
        sample.sort(axis=1)
    picked = np.flatnonzero(usable)
    # An excluded column holds +inf; a sample with fewer than j valid keys must not turn that
    # into the cut-off, or ``keys <= tau`` would let excluded references in.  The largest
    # finite key keeps every valid reference instead.
    tau[picked] = np.minimum(sample[picked, j[picked]], KEY_MAX)
    return tau


def search_block(
    plan: EnginePlan,
    start: int,
    stop: int,
    keys_buffer: np.ndarray | None = None,
    mask_buffer: np.ndarray | None = None,
) -> Candidates:
    """The engine's work for query rows ``[start, stop)`` of ``plan.search``: depth thresholds
    from the column subsample, candidates at or below them, the rare short row redone against
    every reference, and the sort.  The buffers are scratch arrays of at least
    ``(stop - start) * plan.tile`` items (:func:`block_buffers`; allocated when not given); the
    local engine and Dask workers share this code."""
    if keys_buffer is None:
        keys_buffer, mask_buffer = block_buffers(plan, stop - start)
    block_need = plan.need[start:stop]
    tau = depth_thresholds(plan.search, start, stop, block_need, plan.subsample, plan.exclusions)
    tau[block_need <= 0] = -np.inf
    codes, counts = collect(plan, start, stop, tau, keys_buffer, mask_buffer)
    short = np.flatnonzero(counts < block_need)
    if short.size:  # the subsample margin failed (rare): take every valid reference
        codes, counts = redo_rows(plan, start, short, codes, counts)
    # Whole-row tiles leave the codes grouped by row unless redone rows were appended.
    grouped = plan.tile == plan.search.n_reference and not short.size
    block = sort_block(codes, counts, start, plan.col_bits, grouped)
    late = np.setdiff1d(rows_past_threshold(block, block_need, tau), short)  # short: complete
    if late.size:  # rarer still: short by less than the band; every valid reference again
        codes, counts = redo_rows(plan, start, late, codes, block.counts)
        block = sort_block(codes, counts, start, plan.col_bits, False)
    return block


def rows_past_threshold(block: Candidates, need: np.ndarray, tau: np.ndarray) -> np.ndarray:
    """The rows of a sorted ``block`` whose ``need``-th key lies above their subsample
    threshold ``tau`` (before widening by the keys' bound).

    Such a row kept every key up to ``tau`` widened, hence ``need`` of them, yet maybe not
    every key up to its ``need``-th key widened, which the float64 decision reads: the
    subsample margin fell short by less than the band.  (Rows with fewer than ``need``
    candidates are the caller's short rows.)

    >>> from embedeval.engine.candidates import sortable_bits
    >>> bits = sortable_bits(np.float32([1, 2, 3, 1]))
    >>> block = Candidates(np.arange(2), np.array([0, 3, 4]), np.arange(4), bits)
    >>> rows_past_threshold(block, np.array([2, 1]), np.float32([1.5, 1.0])).tolist()
    [0]
    """
    lims = block.lims
    held = (need > 0) & (np.diff(lims) >= need)
    rows = np.flatnonzero(held)
    kth = block.bits[lims[rows] + need[rows] - 1]
    cut = sortable_bits(np.minimum(tau[rows], KEY_MAX).astype(np.float32))
    return rows[kth > cut]


def collect(
    plan: EnginePlan,
    start: int,
    stop: int,
    tau: np.ndarray,
    keys_buffer: np.ndarray,
    mask_buffer: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Packed codes of every valid (row, reference) of the block with key <= tau[row] (raised,
    under a label threshold, to the row's label cut-off: :func:`label_cutoff`), and the count
    per row.  Code = row << (32 + col_bits) | sortable key bits << col_bits | reference."""
    search, exclusions, col_bits = plan.search, plan.exclusions, plan.col_bits
    b = stop - start
    n_ref = search.n_reference
    reach, own_rows = search.reach, slice(start, stop)
    if reach is not None:
        # Keep every key the float64 decision may rank within the depth (embedeval.engine.decide).
        tau = reach.widen(own_rows, tau)
    # Excluded pairs carry the key +inf; a finite cut-off is what keeps them out of ``mask``.
    tau = np.minimum(tau, KEY_MAX)
    row_codes = np.arange(b, dtype=np.uint64) << np.uint64(32 + col_bits)
    counts = np.zeros(b, dtype=np.int64)
    codes = []
    own = np.arange(start, stop)
    label = plan.threshold is not None
    # Identical references: rather than writing their shared keys into every tile (a scatter
    # over b x members per tile), mask them out of the tiles' candidates and add them once per
    # block from the group keys.  The label threshold reads whole rows: there they are written.
    twins = search.duplicates if not label else None
    for t0 in range(0, n_ref, plan.tile):
        t1 = min(t0 + plan.tile, n_ref)
        width = t1 - t0
        keys = grid_keys(search, slice(start, stop), t0, t1,
                         keys_buffer[: b * width].reshape(b, width), tie=twins is None)  # fmt: skip
        # Group exclusions are filtered among the candidates (cheaper), except where the label
        # cut-off reads whole rows.
        exclusions.hide(keys, own, t0, groups=label)
        if label:
            cut = label_cutoff(plan, keys, start, stop)
            cut = cut if reach is None else np.minimum(reach.widen(own_rows, cut), KEY_MAX)
            tau = np.maximum(tau, cut)
        mask = np.less_equal(keys, tau[:, None], out=mask_buffer[: b * width].reshape(b, width))
        if twins is not None and twins.any_in(t0, t1):  # their shared keys are added below
            np.logical_and(mask, twins.others(t0, t1)[None, :], out=mask)
        code, per_row = _pack_hits(keys, mask, t0, start, row_codes,
                                   None if label else exclusions, col_bits)  # fmt: skip
        codes.append(code)
        counts += per_row
    codes = codes[0] if len(codes) == 1 else np.concatenate(codes)
    if twins is not None:
        extra, per_row = twins.candidates(
            search.queries,
            slice(start, stop),
            tau,
            lambda r, c: exclusions.excluded(r + start, c),
            col_bits,
            sortable_bits,
        )
        if plan.tile >= n_ref:  # one tile: the codes are grouped by row, keep them so
            codes = _interleave_rows(codes, counts, extra, per_row)
        else:
            codes = np.concatenate((codes, extra))
        counts += per_row
    return codes, counts


def _pack_hits(
    keys: np.ndarray,
    mask: np.ndarray,
    t0: int,
    start: int,
    row_codes: np.ndarray,
    exclusions: Exclusions | None,
    col_bits: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Packed codes of the ``mask``-ed keys of one tile (columns from ``t0``) and the count per
    row, leaving out references of the query's group when ``exclusions`` holds groups."""
    b, width = keys.shape
    flat = np.flatnonzero(mask)
    # Row of each hit from the row boundaries (cheaper than a 64-bit division per hit).
    per_row = np.diff(np.searchsorted(flat, np.arange(0, (b + 1) * width, width)))
    values = keys.ravel()[flat]
    if exclusions is not None and exclusions.reference_groups is not None:
        flat -= np.repeat(np.arange(0, b * width, width) - t0, per_row)  # the reference
        row = np.repeat(np.arange(start, start + b), per_row)
        keep = exclusions.other_group(row, flat)
        flat, values = flat[keep], values[keep]
        per_row = np.bincount(row[keep] - start, minlength=b)
        rows_and_refs = flat.view(np.uint64)
        rows_and_refs |= np.repeat(row_codes, per_row)
    else:
        # flat = row * width + (reference - t0), so adding row * (2**(32 + col_bits) - width)
        # + t0 gives (row << (32 + col_bits)) | reference in one pass (uint64 wraps exactly).
        shift = row_codes - np.arange(b, dtype=np.uint64) * np.uint64(width) + np.uint64(t0)
        rows_and_refs = flat.view(np.uint64)
        rows_and_refs += np.repeat(shift, per_row)
    code = sortable_bits(values).astype(np.uint64) << np.uint64(col_bits)
    code |= rows_and_refs
    return code, per_row


def _interleave_rows(
    a: np.ndarray, count_a: np.ndarray, b: np.ndarray, count_b: np.ndarray
) -> np.ndarray:
    """Two arrays of codes, each grouped by row (``count_*`` per row), merged row by row, so
    a whole-row block stays grouped (its sort then runs on cache-sized runs of rows)."""
    lims_a = np.concatenate(([0], np.cumsum(count_a)))
    lims_b = np.concatenate(([0], np.cumsum(count_b)))
    lims = lims_a + lims_b
    out = np.empty(a.size + b.size, dtype=a.dtype)
    out[np.arange(a.size) + np.repeat(lims[:-1] - lims_a[:-1], count_a)] = a
    out[np.arange(b.size) + np.repeat(lims[:-1] - lims_b[:-1] + count_a, count_b)] = b
    return out


def label_cutoff(
    plan: EnginePlan, keys: np.ndarray, start: int, stop: int, final: bool = True
) -> np.ndarray:
    """Per query row ``[start, stop)``: the key of its farthest (``plan.threshold == "max"``)
    or nearest (``"min"``) reference sharing its label among the finite ``keys`` (whole rows;
    excluded pairs at +inf).  With ``final``, a row without one gets ``-inf`` (no raise of its
    threshold); ``final=False`` leaves +-inf there, so that cut-offs of several column ranges
    (shards) combine with max / min before :func:`finish_label_cutoff`."""
    positive = match_matrix(plan.query_codes[start:stop], plan.reference_codes)
    positive &= keys <= KEY_MAX
    if plan.threshold == "max":
        out = np.where(positive, keys, -np.inf).max(axis=1)
    else:
        out = np.where(positive, keys, np.inf).min(axis=1)
    return finish_label_cutoff(out) if final else out


def finish_label_cutoff(out: np.ndarray) -> np.ndarray:
    """A combined :func:`label_cutoff`: rows without a same-label reference get ``-inf``."""
    out[~np.isfinite(out)] = -np.inf
    return out.astype(np.float32)


def redo_rows(
    plan: EnginePlan, start: int, short: np.ndarray, codes: np.ndarray, counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Replace the candidates of rows ``short`` (block-relative) by all their valid references."""
    row_shift = np.uint64(32 + plan.col_bits)
    parts = [codes[~np.isin(codes >> row_shift, short.astype(np.uint64))]]
    counts = counts.copy()
    step = max(1, plan.memory_budget // (plan.search.n_reference * 24))
    for s in range(0, short.size, step):
        redo = short[s : s + step]
        code, per_row = all_valid_codes(plan.search, start, redo, plan.exclusions, plan.col_bits)
        parts.append(code)
        counts[redo] = per_row
    return np.concatenate(parts), counts


def all_valid_codes(
    search: PreparedSearch,
    start: int,
    rows: np.ndarray,
    exclusions: Exclusions,
    col_bits: int,
    tiled: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Packed codes (block row, key bits, column of ``search``) of every valid reference of the
    block rows ``rows`` (queries ``start + rows``), and their count per row of ``rows``
    (``tiled``: see :func:`grid_keys`)."""
    n = search.n_reference
    keys = grid_keys(search, start + rows, 0, n, tiled=tiled)
    r = np.repeat(rows, n)
    c = np.tile(np.arange(n, dtype=np.int64), rows.size)
    v = keys.ravel()
    excluded = exclusions.excluded(r + start, c)
    if excluded is not None:
        r, c, v = r[~excluded], c[~excluded], v[~excluded]
    return pack_codes(r, v, c, col_bits), np.bincount(r, minlength=rows.max() + 1)[rows]


def pack_codes(rows: np.ndarray, keys: np.ndarray, refs: np.ndarray, col_bits: int) -> np.ndarray:
    """``rows << (32 + col_bits) | sortable_bits(keys) << col_bits | refs`` as uint64: sorting
    these orders by row, then key, then ascending reference index.

    >>> pack_codes(np.array([0]), np.array([1.0], np.float32), np.array([3]), 2).tolist()
    [12851347459]
    """
    code = sortable_bits(keys).astype(np.uint64) << np.uint64(col_bits)
    code |= rows.astype(np.uint64) << np.uint64(32 + col_bits)
    code |= refs.astype(np.uint64)
    return code


def sort_row_runs(codes: np.ndarray, lims: np.ndarray) -> None:
    """Sort, in place, packed codes (:func:`pack_codes`) already grouped by row (row ``i``'s
    are ``codes[lims[i]:lims[i + 1]]``): runs of whole rows of about :data:`_SORT_RUN` codes
    are sorted one at a time, in the cache (a third faster than one sort of 3 million codes),
    which is the same order since the row leads each code.

    >>> c = np.uint64([5, 4, 9, 7])
    >>> sort_row_runs(c, np.array([0, 2, 4]))
    >>> c.tolist()
    [4, 5, 7, 9]
    """
    if codes.size <= _SORT_RUN:
        codes.sort()
        return
    cuts = np.unique(np.searchsorted(lims, np.arange(0, codes.size, _SORT_RUN)))
    edges = np.append(lims[np.minimum(cuts, lims.size - 1)], codes.size)
    for a, b in itertools.pairwise(edges):
        codes[a:b].sort()


def sort_block(
    codes: np.ndarray, counts: np.ndarray, start: int, col_bits: int, rows_grouped: bool
) -> Candidates:
    """The :class:`~embedeval.engine.candidates.Candidates` of queries ``start, start + 1, ...``
    from
    their packed codes (:func:`pack_codes`, ``counts`` per query, sorted here in place)."""
    # Sorting (row, key bits, reference index) packed in a uint64 orders every row by key and
    # breaks ties by ascending reference index, with no per-row padding.  When the codes are
    # already grouped by row, cache-sized runs of whole rows are sorted separately (faster).
    lims = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=lims[1:])
    if rows_grouped:
        sort_row_runs(codes, lims)
    else:
        codes.sort()
    if col_bits < 31 and sys.byteorder == "little":
        # The reference index sits in the low word: mask it there (half the memory traffic).
        index = (codes.view(np.uint32)[0::2] & np.uint32((1 << col_bits) - 1)).view(np.int32)
    else:
        index = (codes & np.uint64((1 << col_bits) - 1)).astype(np.int64)
    bits = (codes >> np.uint64(col_bits)).astype(np.uint32)  # the cast keeps the low 32 bits
    return Candidates(np.arange(start, start + counts.size), lims, index, bits)
