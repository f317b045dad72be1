"""The local exact backend: the task's query blocks searched and scored in this process.

:func:`local_blocks` is where the local backend produces its scored blocks: the exact, streaming
engine of :mod:`embedeval.engine.exact` over the whole task, scored by the metric kernels in the
engine's worker threads.  The task and block types live in :mod:`embedeval.engine.task` (re-exported
here).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..engine.deep import deep_applies, deep_blocks
from ..engine.exact import DEFAULT_MEMORY_BUDGET, sorted_candidates
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
        finish=task.scored,
    )


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
