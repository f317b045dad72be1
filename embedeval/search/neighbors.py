"""Exact k nearest neighbours: :func:`neighbors`, and the distances the package supports.

The search itself is the exact, streaming engine of :mod:`embedeval.engine.exact` (how it works,
and why it is exact, is described there); ``backend="torch"`` runs the same search with PyTorch
(:mod:`embedeval.search.torch_backend`).  This module chooses between them and shapes the result.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..engine.decide import first_k
from ..engine.exact import Exclusions, sorted_candidates
from ..engine.integers import exact_in_float32
from ..engine.task import RetrievalTask
from ..utils.errors import InputError, InputTypeError
from ..utils.validation import (
    as_embeddings,
    as_labels,
    check_choice,
    check_int,
    check_same_dimension,
    check_same_label_kind,
    factorize,
)

__all__ = ["DISTANCES", "neighbors"]

DISTANCES = ("euclidean", "cosine", "inner_product")


def neighbors(
    query: Any,
    k: int,
    reference: Any = None,
    *,
    distance: str = "euclidean",
    exclude_self: bool | None = None,
    block_size: int | None = None,
    progress: bool | None = False,
    n_threads: int | None = None,
    backend: str = "local",
    device: str | None = None,
    device_memory: float | None = None,
    tf32: bool = False,
    precision: str = "auto",
    query_groups: Any = None,
    reference_groups: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact k nearest neighbours, streamed in query blocks.

    Parameters
    ----------
    query : array-like, shape (n_query, dim)
        Query vectors (float16/32/64, lists, memory-mapped arrays, torch CPU tensors).
    k : int
        Neighbours per query; clamped to the number of references each query can see.
    reference : array-like, shape (n_reference, dim), optional
        The searched set.  ``None`` searches the query set itself.
    distance : {"euclidean", "cosine", "inner_product"}
        Euclidean ranks like squared L2; cosine L2-normalises both sides first.
    exclude_self : bool, optional
        Exclude each query's own row (query i is reference i).  Defaults to ``True`` when
        ``reference`` is None and ``False`` otherwise; ``True`` with a reference requires the
        queries to be the first reference rows (identity, not position, is what is excluded).
    block_size : int, optional
        Queries per block (default: from a 256 MB working budget).
    progress : bool, optional
        Show a progress bar (``None``: only on a terminal).
    n_threads : int, optional
        Threads searching query blocks (default: the usable cores, at most 8; with
        ``backend="torch"``, PyTorch's CPU threads too); the result does not depend on it.
    backend, device, device_memory, tf32, precision :
        ``backend="torch"`` searches with PyTorch on ``device`` (GPU tensors select it by
        themselves); see :func:`embedeval.evaluate`.
    query_groups, reference_groups : array-like, optional
        Group ids (camera, sequence, ...): a query never sees a reference of its own group, as
        in :func:`embedeval.evaluate`.  With ``reference=None`` pass only ``query_groups``.
        Local backend only.

    Returns
    -------
    distances : ndarray of float32, shape (n_query, k')
        The Euclidean distance (the square root of squared L2, not squared), the cosine
        similarity, or the inner product; nearest first, so similarities are descending.
    indices : ndarray of int64, shape (n_query, k')
        Reference row indices.  ``k' = min(k, references available)``.  With groups a query
        can see fewer than ``k'`` references: its row is padded with index -1 and distance NaN.

    Notes
    -----
    The order is that of the float64 distances of the inputs (float32 products filter, near-ties
    are decided in float64), and the distances are those float64 values rounded once to
    float32.  Ties (equal float64 distances) are ordered by ascending reference index, which is
    what faiss's flat index does; unlike faiss, a ``k`` larger than the reference set is
    clamped, never padded with index -1.  Identical reference vectors are at exactly the same
    distance (see the README's conventions).  Inputs so large or so small that float32 keys
    would overflow or underflow (beyond about 2**60 or below 2**-40) are searched after scaling
    by a power of two, which changes no ranking; distances are returned in the input's units.

    Examples
    --------
    >>> x = [[0.0], [1.0], [3.0], [7.0]]
    >>> d, i = neighbors(x, 2)
    >>> i.tolist()
    [[1, 2], [0, 2], [1, 0], [2, 1]]
    >>> d.tolist()
    [[1.0, 3.0], [1.0, 2.0], [2.0, 3.0], [4.0, 6.0]]
    """
    distance = check_choice(distance, "distance", DISTANCES)
    k = check_int(k, "k", maximum=2**63 - 1)
    n_threads = check_int(n_threads, "n_threads", allow_none=True)
    block_size = check_int(block_size, "block_size", allow_none=True)  # as evaluate() checks it
    if exclude_self is not None and not isinstance(exclude_self, (bool, np.bool_)):
        raise InputTypeError(
            f"exclude_self must be True, False or None; got {exclude_self!r} of type "
            f"{type(exclude_self).__name__}."
        )
    options = _torch_options(query, backend, device, device_memory, (tf32, precision), block_size)
    xq, xb, exclude_self = _read(query, reference, exclude_self, options)
    exclusions = _exclusions(xq, xb, exclude_self, query_groups, reference_groups, reference)
    if options and exclusions.reference_groups is not None:
        raise InputError(
            "query_groups= and reference_groups= need backend='local'; drop the groups or the "
            "torch backend."
        )
    from ..engine.arrays import centre_for_distance, scale_for_range

    xq, xb, scale = scale_for_range(xq, xb, distance, same=reference is None)
    xq, xb, _ = centre_for_distance(xq, xb, distance, same=reference is None)
    k_eff = min(k, xb.shape[0] - int(exclude_self))
    if options:
        from ..engine.arrays import import_torch
        from ..engine.threads import thread_cap
        from .torch_backend import torch_neighbors

        with thread_cap(n_threads, [import_torch()]):
            dist, idx = torch_neighbors(xq, xb, k_eff, distance, exclude_self, options)
    else:
        dist, idx = _exact_neighbors(
            xq, xb, k_eff, distance, exclusions, block_size, progress, n_threads
        )
    return _unscale(dist, scale, distance), idx


def _torch_options(
    query: Any, backend: Any, device: Any, device_memory: Any, products: Any, block_size: Any
) -> Any:
    """The torch backend's options when ``backend="torch"`` (or a GPU tensor) selects it, else
    ``None`` (refusing its options)."""
    from ..engine.arrays import is_device_tensor
    from .options import TorchOptions

    backend = check_choice(backend, "backend", ("local", "torch"))
    if backend == "local" and is_device_tensor(query):
        backend = "torch"
    tf32, precision = products
    if backend == "torch":
        return TorchOptions.make(
            device, device_memory, tf32, block_size, like=query, precision=precision
        )
    if device is not None or device_memory is not None or tf32 is not False:
        raise InputError("device=, device_memory= and tf32= need backend='torch'.")
    if precision != "auto":
        raise InputError(f"precision={precision!r} needs backend='torch'; drop it.")
    return None


def _read(query: Any, reference: Any, exclude_self: Any, options: Any) -> tuple[Any, Any, bool]:
    """Query and reference as search input, and whether each query's own row is excluded."""
    from ..engine.arrays import as_search_input, check_lead_on_device

    read = as_search_input if options else as_embeddings
    xq = read(query, "query")
    if reference is None:
        return xq, xq, True if exclude_self is None else bool(exclude_self)
    xb = read(reference, "reference")
    exclude_self = bool(exclude_self)
    check_same_dimension(xq, xb, "reference")
    if exclude_self and options:
        check_lead_on_device(xq, xb)
    elif exclude_self:
        check_queries_lead_reference(xq, xb, "exclude_self")
    return xq, xb, exclude_self


def _exclusions(
    xq: np.ndarray, xb: np.ndarray, exclude_self: bool, gq: Any, gb: Any, reference: Any
) -> Exclusions:
    """The references each query may not see: its own row, and its group's references."""
    if gq is None and gb is None:
        return Exclusions(self_index=exclude_self)
    if gq is None or (gb is None and reference is not None):
        raise InputError(
            "pass both query_groups= and reference_groups= (with reference=None, only "
            "query_groups=)."
        )
    q = as_labels(gq, "query_groups", length=xq.shape[0], length_of="query", groups=True)
    r = q if gb is None else as_labels(gb, "reference_groups", length=xb.shape[0], groups=True)
    # group "0" never equals group 0: a mix would hide nothing, silently
    check_same_label_kind(q, "query_groups", r, "reference_groups")
    (cq, cb), _ = factorize(q, r)
    return Exclusions(self_index=exclude_self, query_groups=cq, reference_groups=cb)


def _visible(exclusions: Exclusions, n_query: int, n_reference: int) -> np.ndarray:
    """References each query can see: all, less its own row and its group's references."""
    n = np.full(n_query, n_reference - int(exclusions.self_index), dtype=np.int64)
    if exclusions.reference_groups is not None:
        cq, cb = exclusions.query_groups, exclusions.reference_groups
        same = np.bincount(cb, minlength=int(max(cq.max(initial=0), cb.max(initial=0))) + 1)[cq]
        # With self-exclusion the own row is in the query's group: counted once, not twice.
        n = n_reference - same
        if exclusions.self_index:
            own = cb[: min(n_query, n_reference)] != cq[: min(n_query, n_reference)]
            n[: own.size] -= own
    return n


def _exact_neighbors(
    xq: np.ndarray,
    xb: np.ndarray,
    k: int,
    distance: str,
    exclusions: Exclusions,
    block_size: int | None,
    progress: bool | None,
    n_threads: int | None,
) -> tuple[np.ndarray, np.ndarray]:
    """The first ``k`` candidates of every query from the exact engine, as float64 distances
    (rows that see fewer references padded with -1 and NaN)."""
    n_query = xq.shape[0]
    dist = np.full((n_query, k), np.nan, dtype=np.float64)
    idx = np.full((n_query, k), -1, dtype=np.int64)
    if k == 0:
        return dist, idx
    zeros = np.zeros(n_query, dtype=np.int64)
    # small integers (binary codes, Hamming order): exact float32 keys, no float64 decision
    precision = "exact" if exact_in_float32(xq, xb, distance) else "float32"
    task = RetrievalTask(
        xq, xb, zeros, np.zeros(int(xb.shape[0]), dtype=np.int64), zeros, zeros,
        exclusions, (), None, distance, precision=precision,
    )  # fmt: skip
    for block in sorted_candidates(
        xq,
        xb,
        distance=distance,
        depth=np.full(n_query, k),
        exclusions=exclusions,
        n_valid=_visible(exclusions, n_query, xb.shape[0]),
        block_size=block_size,
        progress=progress,
        n_threads=n_threads,
        precision=precision,
        finish=lambda block: (block.queries, *first_k(task, task.decided(block), k)),
    ):
        rows, d, i = block
        dist[rows], idx[rows] = d, i
    return dist, idx


def _unscale(dist: np.ndarray, scale: int, distance: str) -> np.ndarray:
    """float64 distances of inputs scaled by 2**scale back in the caller's units, rounded to
    float32 once (a similarity beyond float32's range is +-inf).  Unscaled before rounding:
    float32 distances of the scaled rows, scaled down into float32's subnormal range, would be
    rounded a second time there (``3001.49996 * 2**-149`` to ``3001.5`` and then to ``3002``,
    not ``3001``)."""
    if scale:  # exact in float64: a power of two, far inside its range
        dist = np.ldexp(dist, -scale if distance == "euclidean" else -2 * scale)
    with np.errstate(over="ignore"):
        return dist.astype(np.float32)


def check_queries_lead_reference(
    xq: np.ndarray, xb: np.ndarray, argument: str = "ref_includes_query"
) -> None:
    """Check PML's ``ref_includes_query`` convention: the queries are the first reference rows.

    ``argument`` is the caller's name for the option that asked for it (``evaluate``'s
    ``ref_includes_query``, ``neighbors``' ``exclude_self``); the message names it and gives
    that caller's fix.
    """
    fix = (
        "Pass reference=None to search the query set itself (each query's own row excluded), "
        "or exclude_self=False for a reference set that does not contain the queries."
        if argument == "exclude_self"
        else "Pass reference=None for leave-one-out, or ref_includes_query=False for a disjoint "
        "gallery."
    )
    n = xq.shape[0]
    if xb.shape[0] < n:
        raise InputError(
            f"{argument}=True needs the {n} queries to be the first rows of reference, "
            f"but reference has only {xb.shape[0]} rows. {fix}"
        )
    step = 65536
    for s in range(0, n, step):
        e = min(s + step, n)
        a, b = np.asarray(xq[s:e]), np.asarray(xb[s:e])
        differ = np.flatnonzero((a != b).any(axis=1))
        if differ.size:
            row = s + int(differ[0])
            raise InputError(
                f"{argument}=True needs the queries to be the first rows of reference "
                f"(query i is reference i, PML's convention), but query row {row} differs "
                f"from reference row {row}. {fix}"
            )
