"""Retrieval with per-query relevance lists instead of labels (``positives=`` / ``junk=``).

Landmark benchmarks (revisited Oxford / Paris) have no class labels: each query lists its own
positive and junk gallery items.  :func:`evaluate_listed` ranks every reference for each query,
removes the query's junk items from the ranking, and computes embedeval's metrics on what is left
with R_q = number of (distinct) positives; a list that repeats an index is malformed ground truth
and is refused.  :func:`positive_ranks` gives the 1-based ranks of each query's positives in the
same junk-free ranking, from which any AP rule can be computed (the revisitop protocol in
:mod:`embedeval.protocols.landmarks` does so).

Both stream the references past the queries (:mod:`embedeval.engine.corpus`) and sort no row:
each positive's rank is 1 + the references that beat it (float32 scores filter, those within
the proven bound are re-scored in float64), and every metric follows from the positives' ranks
(:func:`embedeval.engine.kernels.hits_from_ranks`).  A query where a positive's float64 key
equals another reference's is ranked in full instead (its tie flag needs the whole tie block).

Ties: equal float64 distances are ranked by ascending reference index, identical references tie
exactly, as everywhere in embedeval.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..engine.registry import MetricInfo, parse_metrics
from ..utils.errors import EmbedevalWarning, InputError, InputTypeError
from ..utils.validation import (
    as_embeddings,
    check_choice,
    check_int,
    check_same_dimension,
    zero_rows,
)
from .settings import (
    EvaluationInputs,
    EvaluationSettings,
    check_depth,
    metrics_at_depth,
    warn_truncated,
)

__all__ = ["evaluate_listed", "evaluate_with_lists", "positive_ranks"]


# ---------------------------------------------------------------------------- lists
#: Why a repeated index is refused rather than counted once or twice: the two readings give
#: different numbers (revisitop's code counts every entry of the positives list in R_q).
_REPEAT_REASON = {
    "positives": "R_q is the number of distinct positives; revisitop's code would count the "
    "repeat in R_q",
    "junk": "junk, like the positives, is a set of references; a repeat usually means two "
    "lists that overlap were concatenated",
}


def _is_index(v: Any) -> bool:
    """An integer reference index: a bool is not one (a row of a boolean relevance mask would
    otherwise read as the indices 0 and 1)."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _as_lists(lists: Any, name: str, n_query: int, n_ref: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-query reference-index lists as CSR (lims, sorted unique indices)."""
    if isinstance(lists, Mapping):  # iterating a dict gives its keys, not the lists
        raise InputTypeError(
            f"{name} must be a list with one list of reference indices per query, in query "
            f"order; got a {type(lists).__name__}. Pass [{name}[q] for q in range(n_query)]."
        )
    if isinstance(lists, np.ndarray) and lists.dtype != object:
        if lists.ndim != 2 or lists.dtype.kind not in "iu":
            raise InputTypeError(
                f"{name} must be a list with one list of reference indices per query (or a 2-D "
                f"integer array, one row per query); got an array of dtype {lists.dtype} and "
                f"shape {lists.shape}."
            )
        lists = [row.tolist() for row in lists]
    try:
        rows = list(lists)
    except TypeError:
        raise InputTypeError(
            f"{name} must be a list with one list of reference indices per query; got "
            f"{type(lists).__name__}."
        ) from None
    if len(rows) != n_query:
        raise InputError(f"{name} has {len(rows)} lists but there are {n_query} queries.")
    parts = []
    for i, row in enumerate(rows):
        arr = np.asarray(row if row is not None else [], dtype=object).ravel()
        if arr.size and not all(_is_index(v) for v in arr):
            raise InputTypeError(f"{name}[{i}] must hold integer reference indices; got {row!r}.")
        outside = [int(v) for v in arr if not 0 <= v < n_ref]  # before int64: 2**70 overflows
        if outside:
            raise InputError(
                f"{name}[{i}] (query {i}) holds index {outside[0]}, outside the reference set "
                f"(0..{n_ref - 1})."
            )
        arr = np.sort(arr.astype(np.int64))
        repeated = arr[1:][arr[1:] == arr[:-1]]
        if repeated.size:
            v = int(repeated[0])
            raise InputError(
                f"{name}[{i}] (query {i}) lists reference index {v} "
                f"{int((arr == v).sum())} times; a query's {name} list must not repeat an "
                f"index ({_REPEAT_REASON[name]}). Remove the repeats, e.g. with "
                f"np.unique({name}[{i}])."
            )
        parts.append(arr)
    lims = np.zeros(n_query + 1, np.int64)
    np.cumsum([p.size for p in parts], out=lims[1:])
    return lims, np.concatenate(parts) if parts else np.zeros(0, np.int64)


# ---------------------------------------------------------------------------- streamed ranking
def _corpus_scan(xq, xb, distance, junk, memory_budget, n_threads=None, device=None, block=None):
    """The corpus engine's scan of the references past the queries, junk excluded, ``block``
    references at a time (default: from ``memory_budget``); numpy products, or on a torch
    ``device`` (:class:`~embedeval.search.options.TorchOptions`)."""
    from ..engine.corpus import (
        CorpusScan,
        Pairs,
        default_block,
        numpy_product,
        scan_queries,
        tie_keys,
    )

    side = scan_queries(xq, xb, distance, numpy=device is None)  # only the filter sees it
    j_rows, j_cols = _csr_pairs(junk, 0, xq.shape[0])
    if block is None:
        block = default_block(xb, memory_budget, side["centre"], device is None)
    keys = tie_keys(None, xb.shape[0], "index")
    excluded = Pairs(j_rows, j_cols)
    product, precision = numpy_product, "float32"
    if device is not None:  # every positive's full rank: a deep ranking (float32 by default)
        from ..search.torch_backend import corpus_product

        product, precision = corpus_product(device, shallow=False)
    return CorpusScan(
        **side, depth=1, keys=keys, excluded=excluded, block=block, raw=xq,
        n_threads=n_threads, product=product, precision=precision,
    )  # fmt: skip


def _streamed_ranks(
    xq, xb, distance, pos, junk, memory_budget, n_threads=None, device=None, cap=None, block=None
):
    """Each positive's 0-based rank in its query's junk-free float64 ranking (equal keys by
    reference index), sorted within each query, with the count per query (CSR), the tie
    blocks that mix positives and other references (:func:`_mixed_blocks`), and the
    product's precision.  ``cap`` (per query, or None): only the ranks within a query's first
    ``cap`` places are needed (shallow metrics); positives certainly past them are left out.

    The corpus engine counts, per positive, the references that beat it
    (:func:`embedeval.engine.corpus.scan_ranks`): no row is sorted."""
    from ..engine.corpus import Pairs, exact_tie_ranks, scan_ranks, score_bounds

    scan = _corpus_scan(xq, xb, distance, junk, memory_budget, n_threads, device, block)
    p_rows, p_cols = _csr_pairs(pos, 0, xq.shape[0])
    pairs = Pairs(p_rows, p_cols)
    if scan.exact:  # tie blocks from counts: integer data tie in bulk, nothing listed per tie
        ranks, before, tied = exact_tie_ranks(xb, scan, pairs)
        blocks = _counted_blocks(pairs, ranks - 1, before, tied, xq.shape[0])
    else:
        bounds = score_bounds(xb, scan, pairs)
        pair_cap = None if cap is None else cap[p_rows]
        ranks, tied_pair, tied_row = scan_ranks(xb, scan, pairs, bounds, True, pair_cap)
        blocks = _mixed_blocks(pairs, ranks - 1, tied_pair, tied_row, xq.shape[0], xb.shape[0])
    kept = np.flatnonzero(ranks > 0)  # rank 0: past the cap
    kept = kept[np.lexsort((ranks[kept], p_rows[kept]))]
    n_hits = np.bincount(p_rows[kept], minlength=xq.shape[0])
    return ranks[kept] - 1, n_hits, blocks, scan.precision


def _rank_cap(infos: list[MetricInfo], k: int | None, relevant: np.ndarray) -> np.ndarray | None:
    """Per query, the places a shallow ranking's metrics read (``k``, or the deepest cut-off
    and R_q for the R-metrics), or None when a metric reads the whole ranking (``map``,
    ``mrr``) and ``k`` is None.

    >>> from embedeval.engine.registry import parse_metrics
    >>> _rank_cap(parse_metrics(["precision_at_10", "map_at_r"]), None, np.array([3, 40])).tolist()
    [10, 40]
    >>> _rank_cap(parse_metrics(["map"]), None, np.array([3])) is None
    True
    """
    if k is not None:
        return np.full(relevant.size, k, dtype=np.int64)
    if any(m.depth not in ("one", "fixed", "r") for m in infos):
        return None
    cuts = [1 if m.depth == "one" else m.cutoff for m in infos if m.depth != "r"]
    cap = np.full(relevant.size, max(cuts, default=0))
    if any(m.depth == "r" for m in infos):
        np.maximum(cap, relevant, out=cap)
    return cap.astype(np.int64)


def _mixed_blocks(pairs, rank0, tied_pair, tied_row, n_q, n_ref):
    """The blocks of equal float64 keys that hold a positive and another reference, as
    :func:`embedeval.engine.kernels.hits_from_ranks` takes them: ``(query, first rank, last
    rank, per query the rank of the first neighbour pair of different relevance)``.

    A positive with ``t`` references of its key (``tied_pair`` / ``tied_row``) sits in a block
    of ``t + 1`` items ranked by index, the block starting ``rank - (members of smaller
    index)``; blocks met from several positives are kept once."""
    none = np.full(n_q, np.iinfo(np.int64).max // 2)
    if not tied_pair.size:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), none
    own = np.unique(tied_pair)
    mp = np.concatenate([tied_pair, own])
    mr = np.concatenate([tied_row, pairs.row[own]])
    order = np.lexsort((mr, mp))
    mp, mr = mp[order], mr[order]
    head = np.searchsorted(mp, own)  # each block's first member
    size = np.diff(np.append(head, mp.size))
    group = np.repeat(np.arange(own.size), size)
    k = np.arange(mp.size) - head[group]
    is_own = mr == pairs.row[mp]
    start = np.empty(own.size, np.int64)
    start[group[is_own]] = rank0[mp[is_own]] - k[is_own]
    q = pairs.query[own]
    codes = pairs.query * n_ref + pairs.row  # sorted: by query, then index
    want = pairs.query[mp] * n_ref + mr
    rel = codes[np.minimum(np.searchsorted(codes, want), codes.size - 1)] == want
    mixed = np.bincount(group, weights=~rel, minlength=own.size) > 0
    _, first = np.unique(q * (n_ref + 1) + start, return_index=True)
    keep = np.zeros(own.size, bool)
    keep[first] = True
    keep &= mixed
    step = (k < size[group] - 1) & keep[group]
    step[step] &= rel[np.flatnonzero(step)] != rel[np.flatnonzero(step) + 1]
    np.minimum.at(none, q[group[step]], start[group[step]] + k[step])
    kept = np.flatnonzero(keep)
    kept = kept[np.lexsort((start[kept], q[kept]))]
    return q[kept], start[kept], start[kept] + size[kept] - 1, none


def _counted_blocks(pairs, rank0, before, tied, n_q):
    """:func:`_mixed_blocks` from counts: a positive whose key ``tied`` other references share,
    ``before`` of them ranked before it, sits at place ``before`` of the block that starts at
    rank ``rank0 - before`` and holds ``tied + 1`` items.  A block is mixed when it holds fewer
    positives than items; its first neighbour pair of different relevance starts one place
    before the first positive where that is not place 0, else at the last positive of the run
    that fills places 0, 1, 2, ...

    >>> from types import SimpleNamespace
    >>> pairs = SimpleNamespace(query=np.array([0, 0, 0]))  # one block of 5: positives at 0, 1, 3
    >>> q, first, last, none = _counted_blocks(pairs, np.array([4, 5, 7]), np.array([0, 1, 3]),
    ...                                        np.array([4, 4, 4]), 1)
    >>> q.tolist(), first.tolist(), last.tolist(), none.tolist()
    ([0], [4], [8], [5])
    """
    none = np.full(n_q, np.iinfo(np.int64).max // 2)
    q, start, size = pairs.query, rank0 - before, tied + 1
    order = np.lexsort((before, start, q))
    q, start, size, place = q[order], start[order], size[order], before[order]
    head = np.ones(q.size, dtype=bool)
    head[1:] = (q[1:] != q[:-1]) | (start[1:] != start[:-1])
    heads = np.flatnonzero(head)
    members = np.diff(np.append(heads, q.size))
    k = np.arange(q.size) - np.repeat(heads, members)  # the positive's index in its block
    run = np.minimum.reduceat(np.where(place == k, q.size, k), heads) if q.size else heads
    run = np.minimum(run, members)  # positives at places 0 .. run - 1, then another item
    mixed = members < size[heads]
    first_step = np.where(run > 0, run - 1, place[heads] - 1)
    blocks = heads[mixed]
    np.minimum.at(none, q[blocks], start[blocks] + first_step[mixed])
    return q[blocks], start[blocks], start[blocks] + size[blocks] - 1, none


def _check_nonzero(x, name):
    """Cosine ranks directions: a zero row is refused (as on every other path)."""
    zero = zero_rows(np.asarray(x))
    if zero.size:
        raise InputError(
            f"distance='cosine' needs non-zero vectors; {zero.size} row(s) of {name} are all "
            f"zero (first at row {int(zero[0])}). Drop them or use distance='euclidean'."
        )


def _csr_pairs(lists, a, b):
    lims, idx = lists
    counts = np.diff(lims[a : b + 1])
    return np.repeat(np.arange(b - a), counts), idx[lims[a] : lims[b]]


def _prepare(query, reference, positives, junk, distance, block_size, memory_budget):
    distance = check_choice(distance, "distance", ("euclidean", "cosine", "inner_product"))
    xq = as_embeddings(query, "query")
    if reference is None:
        raise InputError(
            "positives= lists index a gallery: pass reference (leave-one-out has no lists)."
        )
    xb = as_embeddings(reference, "reference")
    check_same_dimension(xq, xb, "reference")
    n_q, n_ref = xq.shape[0], xb.shape[0]
    pos = _as_lists(positives, "positives", n_q, n_ref)
    jk = _as_lists([[]] * n_q if junk is None else junk, "junk", n_q, n_ref)
    both = _overlap(pos, jk)
    if both is not None:
        raise InputError(
            f"reference {both[1]} is both a positive and junk for query {both[0]} (in "
            f"positives[{both[0]}] and junk[{both[0]}]); junk is removed from the ranking, so an "
            "item cannot be both. Remove it from one of the two lists."
        )
    block_size = check_int(block_size, "block_size", allow_none=True)
    memory_budget = check_int(memory_budget, "memory_budget", minimum=1 << 20)
    if distance == "cosine":
        _check_nonzero(xq, "query")
        _check_nonzero(xb, "reference")
    return xq, xb, pos, jk, distance, block_size


def _overlap(pos, junk):
    p_rows, p_cols = _csr_pairs(pos, 0, pos[0].size - 1)
    j_rows, j_cols = _csr_pairs(junk, 0, junk[0].size - 1)
    n = max(int(p_cols.max(initial=0)), int(j_cols.max(initial=0))) + 1
    common = np.intersect1d(p_rows * n + p_cols, j_rows * n + j_cols)
    return None if common.size == 0 else divmod(int(common[0]), n)


def evaluate_listed(
    query: Any,
    reference: Any,
    positives: Any,
    junk: Any = None,
    *,
    metrics: Any = None,
    k: int | None = None,
    distance: str = "euclidean",
    block_size: int | None = None,
    memory_budget: int = 256 * 2**20,
    n_threads: int | None = None,
    device: Any = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[MetricInfo], dict[str, Any]]:
    """Per-query metric values and tie flags with relevance given as lists of reference indices.

    For each query, every reference is ranked (equal distances by ascending index), its ``junk``
    items are removed, and the metrics are computed on the rest with R_q = ``len(positives[q])``,
    the number of distinct positives (NaN when a query has no positive).  A ``positives`` or
    ``junk`` list that repeats an index, or an index both positive and junk for one query, is
    an :class:`~embedeval.InputError` naming the query and the index.  The references are
    streamed in blocks (from ``memory_budget``) past all queries and only the positives' ranks
    are kept; a positive tied exactly with other references is ranked among them by index.
    ``block_size``: references per streamed block (default: from ``memory_budget``).
    ``n_threads`` worker threads scan the references (default: every usable core);
    ``device`` (:class:`~embedeval.search.options.TorchOptions`, ``backend="torch"``) moves
    each block of references to a torch device for its product; the values are the same.

    Returns ``(per_query, ties, infos, info)``; :func:`embedeval.evaluate` wraps it in an
    :class:`~embedeval.evaluation.result.EvaluationResult`.

    Examples
    --------
    >>> pq, _, _, _ = evaluate_listed([[0.0]], [[1.0], [2.0], [3.0]], [[2]], [[0]],
    ...                               metrics=["map"])
    >>> pq["map"].tolist()  # junk 0 removed: the positive is 2nd of 2
    [0.5]
    """
    infos = [m for m in parse_metrics(metrics) if m.kind == "knn"]
    if len(infos) != len(parse_metrics(metrics)):
        raise InputError("nmi / ami need class labels; they are not defined for positives lists.")
    xq, xb, pos, jk, distance, block_size = _prepare(
        query, reference, positives, junk, distance, block_size, memory_budget
    )
    memory_budget = check_int(memory_budget, "memory_budget", minimum=1 << 20)
    k = check_int(k, "k", allow_none=True)
    check_depth(infos, k, k)
    relevant = np.diff(pos[0])
    n_valid = xb.shape[0] - np.diff(jk[0])
    from ..engine.kernels import hits_from_ranks, score_hits

    cap = _rank_cap(infos, k, relevant)
    hit_pos, n_hits, blocks, precision = _streamed_ranks(
        xq, xb, distance, pos, jk, memory_budget, n_threads, device, cap, block_size
    )
    hits = hits_from_ranks(n_hits, hit_pos, relevant, n_valid, k, blocks)
    values, ties = score_hits(hits, infos)
    info = {"distance": distance, "n_reference": xb.shape[0], "dim": xq.shape[1], "k": k}
    info["n_junk"], info["precision"] = int(jk[1].size), precision
    info["max_relevant"] = int(relevant.max(initial=0))
    return values, ties, infos, info


def positive_ranks(
    query: Any,
    reference: Any,
    positives: Any,
    junk: Any = None,
    *,
    distance: str = "cosine",
    block_size: int | None = None,
    memory_budget: int = 256 * 2**20,
) -> tuple[np.ndarray, np.ndarray]:
    """0-based ranks of each query's positives in its junk-free ranking, as CSR (ranks, lims).

    Examples
    --------
    >>> positive_ranks([[0.0]], [[1.0], [2.0], [3.0]], [[2]], [[0]], distance="euclidean")
    (array([1]), array([0, 1]))
    """
    xq, xb, pos, jk, distance, block_size = _prepare(
        query, reference, positives, junk, distance, block_size, memory_budget
    )
    memory_budget = check_int(memory_budget, "memory_budget", minimum=1 << 20)
    ranks, _, _, _ = _streamed_ranks(xq, xb, distance, pos, jk, memory_budget, block=block_size)
    return ranks, pos[0]


def _warn_like_labels(
    k: int | None, infos: list[MetricInfo], max_relevant: int, per_query: dict[str, np.ndarray]
) -> None:
    """The label path's warnings: an int ``k`` below the largest R_q truncates MAP@R and
    R-precision (PML's semantics), and a run where every query is lone has only NaN metrics."""
    warn_truncated(k, max_relevant, infos, stacklevel=5)
    if per_query and all(np.isnan(v).all() for v in per_query.values()):
        n_q = next(iter(per_query.values())).size
        warnings.warn(
            f"every one of the {n_q} queries is lone (an empty positives list), so every "
            "retrieval metric is NaN.",
            EmbedevalWarning,
            stacklevel=5,
        )


def evaluate_with_lists(settings: EvaluationSettings, inputs: EvaluationInputs) -> Any:
    """:func:`embedeval.evaluate` with ``positives=`` / ``junk=``: the thin result layer.

    ``settings`` come from the same validation stage as every other path
    (:func:`embedeval.evaluation.settings.validate_arguments`); the bootstrap intervals are added by
    :func:`embedeval.evaluate` as on the label path.
    """
    from .result import EvaluationResult

    ms = settings.metrics
    # The default set follows k as on the label path (Recall@k in place of Recall@10 below 10).
    per_query, ties, infos, info = evaluate_listed(
        inputs.query,
        inputs.reference,
        inputs.positives,
        inputs.junk,
        metrics=[m.name for m in metrics_at_depth(ms, ms.k)],
        k=ms.k,
        distance=ms.distance,
        block_size=settings.search.block_size,
        memory_budget=settings.search.memory_budget,
        n_threads=settings.search.n_threads,
        device=settings.search.torch,
    )
    n_q = next(iter(per_query.values())).size if per_query else len(inputs.positives)
    _warn_like_labels(ms.k, infos, info["max_relevant"], per_query)
    summary = {
        name: (float(np.nanmean(v)) if not np.isnan(v).all() else float("nan"))
        for name, v in per_query.items()
    }
    settings_record = {
        "metrics": [m.name for m in infos],
        "k": ms.k,
        "k_used": ms.k,
        "distance": info["distance"],
        "average": "micro",
        "relevance": "positives lists (junk removed from the ranking)",
        "n_reference": info["n_reference"],
        "n_junk": info["n_junk"],
        "backend": "local" if settings.search.torch is None else "torch",
        "precision": info["precision"],
        "dim": int(info["dim"]),
    }
    return EvaluationResult(
        metrics=summary,
        per_query=per_query,
        per_class={},
        query_labels=np.arange(n_q),
        n_queries=n_q,
        n_lone=int(np.isnan(next(iter(per_query.values()))).sum()) if per_query else 0,
        n_ties={name: int(flags.sum()) for name, flags in ties.items()},
        settings=settings_record,
    )
