"""The retrieval task handed to a search backend, and the local exact backend.

:func:`embedeval.evaluate` validates its inputs and builds a :class:`RetrievalTask` (embeddings,
integer label codes, R_q, the references each query can see, exclusions, metrics, depth); a
backend turns it into per-query values and tie flags.  :func:`run_local` is the exact, streaming,
single-process backend; sharded, approximate and distributed backends consume the same task.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._kernels import chunk_metrics, needed_depth
from ._registry import MetricInfo
from ._symmetric import run_symmetric, uses_symmetric_engine
from .knn import DEFAULT_MEMORY_BUDGET, Candidates, Exclusions, sorted_candidates

__all__ = ["RetrievalTask", "run_local"]


@dataclass(frozen=True)
class RetrievalTask:
    """Everything a backend needs to compute per-query retrieval metrics.

    ``query_codes`` / ``reference_codes`` are shared integer label codes; ``relevant`` is R_q and
    ``n_valid`` the number of references each query can see; ``k`` is the depth cap already
    resolved (``None`` = exact, ``"max_bin_count"`` resolved to an int).
    """

    query: np.ndarray
    reference: np.ndarray
    query_codes: np.ndarray
    reference_codes: np.ndarray
    relevant: np.ndarray
    n_valid: np.ndarray
    exclusions: Exclusions
    metrics: tuple[MetricInfo, ...]
    k: int | None
    distance: str
    #: ``query`` and ``reference`` are the caller's vectors times 2**scale (see
    #: :func:`embedeval.knn.range_exponent`); a backend reading the reference from elsewhere
    #: (shard files) applies it too.
    scale: int = 0

    @property
    def n_query(self) -> int:
        return int(self.query.shape[0])

    def depth(self) -> tuple[np.ndarray, str | None]:
        """Per-query ranked depth needed (+1 for tie detection) and the label threshold mode."""
        return needed_depth(list(self.metrics), self.relevant, self.k)

    def empty_outputs(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        n = self.n_query
        values = {m.name: np.full(n, np.nan) for m in self.metrics}
        ties = {m.name: np.zeros(n, dtype=bool) for m in self.metrics}
        return values, ties

    def score_block(self, block: Candidates) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Per-query values and tie flags of ``block.queries`` from their sorted candidates."""
        rows = block.queries
        return chunk_metrics(
            block,
            self.query_codes[rows],
            self.reference_codes,
            self.relevant[rows],
            self.n_valid[rows],
            list(self.metrics),
            self.k,
        )


def run_local(
    task: RetrievalTask,
    *,
    block_size: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    progress: bool | None = None,
    n_threads: int | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Exact, streaming, single-process backend: per-query values (NaN for lone) and tie flags.

    Query blocks are searched and scored by ``n_threads`` threads (default: the usable cores);
    the values do not depend on the number of threads.
    """
    values, ties = task.empty_outputs()
    if not task.metrics or not (task.relevant > 0).any():
        return values, ties
    if uses_symmetric_engine(task):  # leave-one-out: each product once (embedeval._symmetric)
        return run_symmetric(
            task, memory_budget=memory_budget, progress=progress, n_threads=n_threads
        )
    depth, threshold = task.depth()
    positive = None if threshold is None else (threshold, task.query_codes, task.reference_codes)
    for rows, (chunk_values, chunk_ties) in sorted_candidates(
        task.query,
        task.reference,
        distance=task.distance,
        depth=depth,
        exclusions=task.exclusions,
        n_valid=task.n_valid,
        positive_threshold=positive,
        block_size=block_size,
        memory_budget=memory_budget,
        progress=progress,
        n_threads=n_threads,
        finish=lambda block: (block.queries, task.score_block(block)),
    ):
        for name in chunk_values:
            values[name][rows] = chunk_values[name]
            ties[name][rows] = chunk_ties[name]
    return values, ties
