"""The local exact backend: the task's query blocks searched and scored in this process.

:func:`local_blocks` is where the local backend produces its scored blocks: the exact, streaming
engine of :mod:`embedeval.engine.exact` over the whole task, scored by the metric kernels in the
engine's worker threads.  The task and block types live in :mod:`embedeval.engine.task` (re-exported
here).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..engine.decide import rounding_of
from ..engine.deep import deep_applies, deep_blocks, filter_precision
from ..engine.exact import DEFAULT_MEMORY_BUDGET, sorted_candidates
from ..engine.integers import exact_distance
from ..engine.symmetric import symmetric_blocks, uses_symmetric_engine
from ..engine.task import Columns, RetrievalTask, ScoredBlock, write_back

__all__ = ["RetrievalTask", "ScoredBlock", "local_blocks", "run_local", "search", "write_back"]


def search(task: RetrievalTask, options: Any) -> Iterator[ScoredBlock]:
    """The local backend's entry point (see :mod:`embedeval.search.dispatch`)."""
    return local_blocks(
        task,
        block_size=options.block_size,
        memory_budget=options.memory_budget,
        progress=options.progress,
        n_threads=options.n_threads,
    )


def local_blocks(
    task: RetrievalTask,
    *,
    block_size: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    progress: bool | None = None,
    n_threads: int | None = None,
) -> Iterator[ScoredBlock]:
    """Exact, streaming, single-process backend: the scored query blocks of ``task``.

    Query blocks are searched and scored by ``n_threads`` threads (default: the usable cores);
    the values do not depend on the number of threads.
    """
    if not task.has_work:
        return
    task = with_exact_keys(task)
    if uses_symmetric_engine(task):  # leave-one-out: each product once (embedeval.engine.symmetric)
        yield from symmetric_blocks(
            task, memory_budget=memory_budget, progress=progress, n_threads=n_threads
        )
        return
    if deep_applies(task):  # deep rankings: the ranks of the relevant references alone
        yield from deep_blocks(
            task,
            block_size=block_size,
            memory_budget=memory_budget,
            progress=progress,
            n_threads=n_threads,
        )
        return
    depth, threshold = task.depth()
    precision = candidate_precision(task, depth, threshold)
    rounding = rounding_of(precision)
    yield from sorted_candidates(
        task.query,
        task.reference,
        distance=task.distance,
        depth=depth,
        exclusions=task.exclusions,
        n_valid=task.n_valid,
        positive_threshold=task.positive_threshold(threshold),
        block_size=block_size,
        memory_budget=memory_budget,
        progress=progress,
        n_threads=n_threads,
        finish=lambda block: task.scored(block, rounding),
        precision=precision,
    )


def with_exact_keys(task: RetrievalTask, reference: Any = None) -> RetrievalTask:
    """``task`` with ``precision="exact"`` where its float32 keys are exact (small integers such
    as binary codes, :func:`embedeval.engine.integers.exact_distance`; cosine on codes of one
    norm becomes the inner product, which ranks them alike): every engine then takes the float32
    order, equal keys by reference index, as the ranking, with no float64 re-scoring.
    ``reference``: the rows the engine multiplies, when the task's own are read elsewhere (the
    pieces of a sharded reference; anything with ``shape`` whose row slices are arrays).
    """
    if task.precision != "float32":
        return task
    rows = task.reference if reference is None else reference
    distance = exact_distance(task.query, rows, task.distance)
    if distance is None:
        return task
    return dataclasses.replace(task, precision="exact", distance=distance)


#: Rankings deeper on average than 1/_DEEP of the references take the float64 filter.
_DEEP = 32


def candidate_precision(task: RetrievalTask, depth: np.ndarray, threshold: str | None) -> str:
    """The candidate engine's filter product for ``task`` (per-query ``depth``, label
    ``threshold``): for deep rankings (to the farthest relevant reference, or on average
    deeper than 1/:data:`_DEEP` of the references) the float64 one of the deep engine
    (:func:`embedeval.engine.deep.filter_precision`), else float32.

    Deep windows hold thousands of keys per row, many within the float32 keys' bound of one
    another, and each such key needs a float64 one: measured on 20,000 rows in 5 classes
    (d = 128, P@1 + R-precision + MAP@R, R_q about 4,000, two threads), 8.3 s with float32
    keys against 6.3 s.
    Shallow rankings (a few neighbours per query) find few such keys and keep the cheaper
    product.
    """
    if task.precision == "exact":
        return "exact"
    n_ref = int(task.reference.shape[0])
    deep = threshold == "max" or float(np.sum(depth)) * _DEEP >= n_ref * max(depth.size, 1)
    return filter_precision(task) if deep else "float32"


def run_local(
    task: RetrievalTask,
    *,
    block_size: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    progress: bool | None = None,
    n_threads: int | None = None,
) -> tuple[Columns, Columns]:
    """:func:`local_blocks` gathered: per-query values (NaN for lone) and tie flags."""
    values, ties = task.empty_outputs()
    blocks = local_blocks(
        task,
        block_size=block_size,
        memory_budget=memory_budget,
        progress=progress,
        n_threads=n_threads,
    )
    write_back(values, ties, blocks)
    return values, ties
