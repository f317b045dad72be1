"""The failure gallery of an evaluation: which queries did worst, and what they retrieved.

Pure data (no HTML): :func:`worst_queries` and :func:`confident_errors` choose query rows,
:func:`gallery_rows` gives each its top-k counted references from the exact engine
(:func:`embedeval.search.neighbors.neighbors`, with the run's exclusions: the query's own row
for leave-one-out and PML's ``ref_includes_query``, and every reference of its group), so the
gallery shows exactly the ranking the metrics were read from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine.exact import Exclusions
from ..engine.labels import match_pairs, pack_label_sets
from ..search.neighbors import neighbors
from ..utils.errors import InputError
from ..utils.validation import (
    as_any_labels,
    as_embeddings,
    as_int64,
    as_labels,
    as_labels_like,
    check_int,
    check_same_label_kind,
    factorize,
)

__all__ = ["GalleryRow", "confident_errors", "gallery_rows", "worst_queries"]


@dataclass(frozen=True)
class GalleryRow:
    """One query of the gallery and what it retrieved.

    ``ranks``, ``indices``, ``distances`` and ``relevant`` describe its top-k counted references
    (rank 1 = nearest; references the protocol excludes are skipped and not counted);
    ``first_relevant`` is the rank of its nearest relevant reference (None when it has none).
    """

    query: int
    indices: np.ndarray
    distances: np.ndarray
    relevant: np.ndarray
    first_relevant: int | None

    @property
    def ranks(self) -> np.ndarray:
        return np.arange(1, self.indices.size + 1)


def worst_queries(values: Any, n: int, higher_is_better: bool = True) -> np.ndarray:
    """The ``n`` query rows with the worst metric value, worst first: the lowest values, or the
    highest when ``higher_is_better`` is False (a rank, a loss); NaN (lone queries) never
    chosen; equal values ordered by query row.

    >>> worst_queries([0.5, float("nan"), 0.0, 0.5, 1.0], 3).tolist()
    [2, 0, 3]
    >>> worst_queries([0.5, float("nan"), 0.0, 0.5, 1.0], 3, higher_is_better=False).tolist()
    [4, 0, 3]
    """
    v = np.asarray(values, dtype=np.float64)
    rows = np.flatnonzero(~np.isnan(v))
    # Negating (not reversing the sort) keeps equal values in query-row order.
    key = v[rows] if higher_is_better else -v[rows]
    return rows[np.argsort(key, kind="stable")][: max(int(n), 0)]


def confident_errors(hits: Any, confidences: Any, n: int, higher_is_confident: bool) -> np.ndarray:
    """The ``n`` most confident errors: query rows whose nearest counted reference is not
    relevant (``hits == 0``, the per-query Precision@1), most confident first; equal
    confidences ordered by query row.

    >>> confident_errors([0, 1, 0, 0], [0.2, 0.9, 0.8, 0.8], 2, True).tolist()
    [2, 3]
    """
    h = np.asarray(hits, dtype=np.float64)
    c = np.asarray(confidences, dtype=np.float64)
    rows = np.flatnonzero(h == 0)
    key = -c[rows] if higher_is_confident else c[rows]
    return rows[np.argsort(key, kind="stable")][: max(int(n), 0)]


def gallery_rows(
    rows: Any,
    k: int,
    *,
    query: Any,
    query_labels: Any,
    reference: Any = None,
    reference_labels: Any = None,
    ref_includes_query: bool = False,
    query_groups: Any = None,
    reference_groups: Any = None,
    distance: str = "euclidean",
) -> list[GalleryRow]:
    """Top-``k`` counted references of the query ``rows``, relevant ones marked, and the rank of
    the first relevant reference (searched deeper when it lies beyond ``k``).

    The arguments are those of :func:`embedeval.evaluate`; a reference is relevant when its
    label equals the query's (shares one with it, for 2-D indicator labels).  No ``rows`` (as
    :func:`worst_queries` or :func:`confident_errors` may choose) give no gallery rows.

    Examples
    --------
    >>> r = gallery_rows([0], 2, query=[[0.0], [1.0], [3.0]], query_labels=[0, 1, 0])
    >>> r[0].indices.tolist(), r[0].relevant.tolist(), r[0].first_relevant
    ([1, 2], [False, True], 2)
    >>> gallery_rows([], 2, query=[[0.0], [1.0], [3.0]], query_labels=[0, 1, 0])
    []
    """
    k = check_int(k, "k", maximum=2**63 - 1)
    search, cq, cb, n_b = _prepare(
        query, query_labels, reference, reference_labels,
        ref_includes_query, query_groups, reference_groups, distance,
    )  # fmt: skip
    rows = _query_rows(rows, cq.shape[0])
    if not rows.size:  # the search refuses an empty query: nothing to search for
        return []
    dist, idx = search(rows, k)
    first = _first_relevant(search, rows, idx, cq, cb, k, n_b)
    out = []
    for n, q in enumerate(rows.tolist()):
        ok = idx[n] >= 0
        j = idx[n][ok]
        rel = _relevant(cq, cb, np.array([q]), j[None, :])[0]
        out.append(GalleryRow(q, j, dist[n][ok], rel, first[n]))
    return out


def _query_rows(rows: Any, n_query: int) -> np.ndarray:
    """``rows`` as int64 query positions, each in 0..n_query - 1 (a negative one would index
    from the end, and a uint64 one above 2**63 - 1 would wrap to a negative one)."""
    fix = f"Pass query row positions 0..{n_query - 1}."
    arr = as_int64(np.asarray(rows).ravel(), "rows", fix)
    if arr.size and arr.dtype.kind not in "iu":
        raise InputError(f"rows must hold integer query positions; got dtype {arr.dtype}. {fix}")
    arr = arr.astype(np.int64, copy=False)
    outside = arr[(arr < 0) | (arr >= n_query)]
    if outside.size:
        raise InputError(f"rows holds {int(outside[0])}, not a query row. {fix}")
    return arr


def ranked_relevance(
    depth: int,
    *,
    query: Any,
    query_labels: Any,
    reference: Any = None,
    reference_labels: Any = None,
    ref_includes_query: bool = False,
    query_groups: Any = None,
    reference_groups: Any = None,
    distance: str = "euclidean",
) -> np.ndarray:
    """For every query, whether each of its ``depth`` nearest counted references is relevant
    (same label, or a shared one for 2-D indicator labels): a boolean (n_query, depth) array,
    False where fewer references are counted.

    The search is the gallery's (exact, the run's exclusions), so the k sweep of a page is read
    from the same neighbours as its gallery, without a second evaluation.

    Examples
    --------
    >>> ranked_relevance(2, query=[[0.0], [1.0], [3.0]], query_labels=[0, 1, 0]).tolist()
    [[False, True], [False, False], [False, True]]
    """
    search, cq, cb, _ = _prepare(
        query, query_labels, reference, reference_labels,
        ref_includes_query, query_groups, reference_groups, distance,
    )  # fmt: skip
    _, idx = search(np.arange(cq.size), depth)
    counted = idx >= 0
    return counted & _relevant(cq, cb, np.arange(cq.shape[0]), np.where(counted, idx, 0))


def _prepare(
    query: Any,
    query_labels: Any,
    reference: Any,
    reference_labels: Any,
    ref_includes_query: bool,
    query_groups: Any,
    reference_groups: Any,
    distance: str,
) -> tuple[Any, np.ndarray, np.ndarray, int]:
    """The search with the run's exclusions, the label codes of both sides (:func:`_relevant`
    reads them) and the number of references."""
    xq = as_embeddings(query, "query")
    yq = as_any_labels(query_labels, "query_labels", length=xq.shape[0], length_of="query")
    xb, yb = xq, yq
    if reference is not None:
        xb = as_embeddings(reference, "reference")
        n_labels = yq.shape[1] if yq.ndim == 2 else None
        yb = as_labels_like(
            reference_labels, "reference_labels", n_labels=n_labels, length=xb.shape[0]
        )
        if n_labels is None:
            check_same_label_kind(yq, "query_labels", yb, "reference_labels")
    if yq.ndim == 2:  # label sets: one packed row of bits per item
        cq, cb = pack_label_sets(yq), pack_label_sets(yb)
    else:
        (cq, cb), _ = factorize(yq, yb)
    gq, gb = _group_codes(
        xq.shape[0],
        xb.shape[0],
        reference is None or ref_includes_query,
        query_groups,
        reference_groups,
        reference is None,
    )
    return _searcher(xq, xb, gq, gb, distance), cq, cb, xb.shape[0]


def _relevant(cq: np.ndarray, cb: np.ndarray, queries: np.ndarray, refs: np.ndarray) -> np.ndarray:
    """Whether reference ``refs[i, j]`` is relevant to query ``queries[i]``, from the label codes
    of :func:`_prepare` (:func:`embedeval.engine.labels.match_pairs`, as the engine decides).

    >>> _relevant(np.array([1, 2]), np.array([1, 2, 1]), np.array([0, 1]), np.array([[0, 1]] * 2))
    array([[ True, False],
           [False,  True]])
    """
    m, k = refs.shape
    pairs = match_pairs(np.repeat(cq[queries], k, axis=0), cb[refs.reshape(-1)])
    return pairs.reshape(m, k)


def _group_codes(
    n_q: int, n_b: int, self_index: bool, gq: Any, gb: Any, leave_one_out: bool
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The run's exclusions as group codes, which follow a subset of query rows (self-exclusion
    is positional and would not)."""
    if gq is not None and gb is None and leave_one_out:
        gb = gq
    if (gq is None) != (gb is None):
        raise InputError("pass both query_groups= and reference_groups=, or neither.")
    if gq is not None:
        gq = as_labels(gq, "query_groups", groups=True)
        gb = as_labels(gb, "reference_groups", groups=True)
        check_same_label_kind(gq, "query_groups", gb, "reference_groups")
        (cq, cb), _ = factorize(gq, gb)
        ex = Exclusions(self_index=self_index, query_groups=cq, reference_groups=cb)
    else:
        ex = Exclusions(self_index=self_index)
    ex = ex.by_group(n_q, n_b)
    return ex.query_groups, ex.reference_groups


def _searcher(xq: np.ndarray, xb: np.ndarray, gq: Any, gb: Any, distance: str) -> Any:
    def search(rows: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        groups = {} if gq is None else {"query_groups": gq[rows], "reference_groups": gb}
        return neighbors(
            xq[rows], depth, xb, distance=distance, exclude_self=False, n_threads=1, **groups
        )

    return search


def _first_relevant(
    search: Any, rows: np.ndarray, idx: np.ndarray, cq: np.ndarray, cb: np.ndarray, k: int, n_b: int
) -> list[int | None]:
    """Rank of each row's nearest relevant reference; rows without one in the top ``k`` are
    searched again, each time 8 times deeper, until it is found or every reference was seen."""
    first: list[int | None] = [None] * rows.size
    todo = np.arange(rows.size)
    depth, found = k, idx
    while todo.size:
        hit = (found >= 0) & _relevant(cq, cb, rows[todo], np.maximum(found, 0))
        has = hit.any(axis=1)
        for n, r in zip(todo[has].tolist(), hit[has].argmax(axis=1).tolist(), strict=True):
            first[n] = r + 1
        todo = todo[~has]
        if not todo.size or depth >= n_b:
            break
        depth = min(depth * 8, n_b)
        _, found = search(rows[todo], depth)
    return first
