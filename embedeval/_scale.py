"""Scaled backends of :func:`embedeval.evaluate`: sharded exact, approximate (faiss), Dask.

:func:`run_scaled` is what ``evaluate`` calls when ``index``, ``shards`` or ``backend`` is not the
default.  It returns what :func:`embedeval._engine.run_local` returns (per-query values with NaN
for lone queries, per-query tie flags) plus a JSON-able ``approximation`` report (empty for the
exact backends).

Why exact backends can be bit-identical to the local engine: BLAS ``sgemm`` rounds differently
for different matrix shapes (measured with OpenBLAS 0.3: ``(A @ B)[:256]`` and ``A[:256] @ B``
differ in the last bits), so a backend reproduces the local keys only if it multiplies the same
query rows by the same reference columns in products of the same shapes.  The helpers below
therefore reproduce the local engine's layout (query blocks of the same size starting at the same
rows, reference tiles of the same width starting at the same columns).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ._duplicates import DuplicateRows
from ._engine import RetrievalTask
from ._errors import InputError
from ._validation import check_choice, check_int
from .knn import (
    DEFAULT_MEMORY_BUDGET,
    Exclusions,
    block_layout,
    reference_duplicates,
    representatives,
)

__all__ = ["run_scaled"]


def run_scaled(
    task: RetrievalTask,
    *,
    index: Any = None,
    index_params: dict[str, Any] | None = None,
    exact_sample: int = 10_000,
    shards: Any = None,
    backend: str = "local",
    client: Any = None,
    seed: int = 0,
    block_size: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    progress: bool | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, Any]]:
    """Run ``task`` on the backend the arguments select.

    Returns ``(per_query, tie_flags, approximation)``; ``approximation`` is ``{}`` unless
    ``index`` is given (see :func:`embedeval._approx.run_approximate`).
    """
    backend = check_choice(backend, "backend", ("local", "dask"))
    if block_size is not None:
        block_size = check_int(block_size, "block_size")
    if index_params is not None and index is None:
        raise InputError(
            "index_params was given without index; it sets search parameters of an approximate "
            "index, e.g. index='IVF1024,Flat', index_params={'nprobe': 32}."
        )
    if index is not None:
        if shards is not None or backend != "local":
            raise InputError(
                "index= (approximate search) cannot be combined with shards= or backend='dask'; "
                "faiss already searches its index in parallel. Drop shards/backend."
            )
        from ._approx import run_approximate

        return run_approximate(
            task,
            index,
            index_params=index_params,
            exact_sample=exact_sample,
            seed=seed,
            memory_budget=memory_budget,
            progress=progress,
        )
    if backend == "dask":
        if shards is not None:
            raise InputError(
                "backend='dask' scatters the whole reference to every worker; shards= is for the "
                "local backend. Drop one of them."
            )
        from ._dask import run_dask

        values, ties = run_dask(
            task, client, block_size=block_size, memory_budget=memory_budget, progress=progress
        )
        return values, ties, {}
    if client is not None:
        raise InputError("client= is only used with backend='dask'.")
    from ._sharded import run_sharded

    values, ties = run_sharded(
        task, shards, block_size=block_size, memory_budget=memory_budget, progress=progress
    )
    return values, ties, {}


@dataclasses.dataclass(frozen=True)
class EngineLayout:
    """How the local engine cuts a task into products: query block size, tile width, packing."""

    block_size: int
    tile: int
    col_bits: int
    need: np.ndarray
    threshold: str | None
    #: Identical reference rows and their prepared representatives (see embedeval._duplicates).
    duplicates: DuplicateRows | None = None
    representatives: np.ndarray | None = None


def engine_layout(
    task: RetrievalTask, block_size: int | None, memory_budget: int = DEFAULT_MEMORY_BUDGET
) -> EngineLayout:
    """The block size and tile width :func:`embedeval.knn.sorted_candidates` uses for ``task``
    (the same :func:`embedeval.knn.block_layout`; a backend that keeps them reproduces its
    float32 keys)."""
    depth, threshold = task.depth()
    n_ref = int(task.reference.shape[0])
    need = np.minimum(depth, task.n_valid)
    dups = reference_duplicates(task.reference, task.distance)
    tile, block_size, col_bits = block_layout(
        need,
        n_ref,
        threshold is not None,
        block_size,
        memory_budget,
        0 if dups is None else dups.n_groups,
    )
    reps = representatives(task.reference, dups, task.distance)
    return EngineLayout(block_size, tile, col_bits, need, threshold, dups, reps)


def group_exclusions(task: RetrievalTask) -> tuple[np.ndarray, np.ndarray] | None:
    """Re-express the task's exclusions as (query group, reference group) codes.

    Self-exclusion (query i is reference i) is tied to positions, so it breaks when the queries
    are split into blocks or subsets; group codes travel with the rows.  Query i gets group i and
    reference j < n_query group j (others -1).  With user groups and self-exclusion the own row
    is already in the query's group in leave-one-out evaluation; the one case groups cannot
    express (``ref_includes_query=True`` with a query whose own reference row carries another
    group) is refused.
    """
    ex = task.exclusions
    n_query, n_ref = task.n_query, int(task.reference.shape[0])
    if ex.reference_groups is not None:
        if ex.self_index:
            differs = np.flatnonzero(ex.reference_groups[:n_query] != ex.query_groups)
            if differs.size:
                raise InputError(
                    "ref_includes_query=True with groups, where query row "
                    f"{int(differs[0])} has a different group from its own reference row, is "
                    "only supported by the local exact backend (shards=None, index=None, "
                    "backend='local')."
                )
        return ex.query_groups, ex.reference_groups
    if ex.self_index:
        q_groups = np.arange(n_query, dtype=np.int64)
        r_groups = np.full(n_ref, -1, dtype=np.int64)
        r_groups[:n_query] = q_groups
        return q_groups, r_groups
    return None


def subset_task(task: RetrievalTask, rows: slice | np.ndarray) -> RetrievalTask:
    """The task restricted to query ``rows`` (same reference), exclusions kept by group codes."""
    groups = group_exclusions(task)
    if groups is None:
        exclusions = Exclusions()
    else:
        exclusions = Exclusions(query_groups=groups[0][rows], reference_groups=groups[1])
    return dataclasses.replace(
        task,
        query=task.query[rows],
        query_codes=task.query_codes[rows],
        relevant=task.relevant[rows],
        n_valid=task.n_valid[rows],
        exclusions=exclusions,
    )
