"""The retrieval task handed to a search backend, and the scored blocks backends yield.

:func:`embedeval.evaluate` validates its inputs and builds a :class:`RetrievalTask` (embeddings,
integer label codes, R_q, the references each query can see, exclusions, metrics, depth); a
backend (see :mod:`embedeval.search.dispatch`) turns it into :class:`ScoredBlock` s, per-query
values and
tie flags of some query rows, which :func:`write_back` stores.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from .candidates import Candidates
from .decide import decide_task_block, rounding_of
from .exact import DEFAULT_MEMORY_BUDGET, EnginePlan, Exclusions, plan_search
from .kernels import chunk_metrics, needed_depth
from .registry import MetricInfo

__all__ = ["Columns", "RetrievalTask", "ScoredBlock", "engine_plan", "write_back"]

#: Per-metric arrays of per-query values (or tie flags).
Columns = dict[str, np.ndarray]


@dataclass(frozen=True)
class ScoredBlock:
    """Per-query values (NaN for lone queries) and tie flags of the query ``rows`` (a slice or
    an index array), one array per metric."""

    rows: slice | np.ndarray
    values: Columns
    ties: Columns


def write_back(values: Columns, ties: Columns, blocks: Iterator[ScoredBlock]) -> Any:
    """Store every block of ``blocks`` in ``values`` / ``ties``; return what the generator
    returns (a backend's report, e.g. the approximate search's error estimate), else ``None``.

    >>> values, ties = {"p": np.full(3, np.nan)}, {"p": np.zeros(3, bool)}
    >>> def blocks():
    ...     yield ScoredBlock(slice(0, 2), {"p": np.array([1.0, 0.5])}, {"p": np.array([0, 1])})
    ...     return "done"
    >>> write_back(values, ties, blocks()), values["p"].tolist(), ties["p"].tolist()
    ('done', [1.0, 0.5, nan], [False, True, False])
    """
    while True:
        try:
            block = next(blocks)
        except StopIteration as end:
            return end.value
        for name in block.values:
            values[name][block.rows] = block.values[name]
            ties[name][block.rows] = block.ties[name]


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
    #: :func:`embedeval.engine.exact.range_exponent`); a backend reading the reference from
    # elsewhere
    #: (shard files) applies it too.
    scale: int = 0
    #: ... then minus ``centre`` (float32 per column, exact: see
    #: :func:`embedeval.engine.exact.exact_centre`), when it is not None.
    centre: np.ndarray | None = None
    #: The filter product of the engines that support another one (``"float32"`` or
    #: ``"bf16"``: :func:`embedeval.engine.decide.rounding_of`); the decision is float64 either
    #: way.  The local backend sets ``"exact"`` for small integers whose float32 keys are
    #: exact (:func:`embedeval.search.local.with_exact_keys`, which also runs cosine on rows
    #: of one norm as the inner product).
    precision: str = "float32"

    @property
    def n_query(self) -> int:
        return int(self.query.shape[0])

    @property
    def has_work(self) -> bool:
        """False when there is nothing to search: no metric, or every query is lone."""
        return bool(self.metrics) and bool((self.relevant > 0).any())

    def depth(self) -> tuple[np.ndarray, str | None]:
        """Per-query ranked depth needed (+1 for tie detection) and the label threshold mode."""
        return needed_depth(list(self.metrics), self.relevant, self.k)

    def empty_outputs(self) -> tuple[Columns, Columns]:
        n = self.n_query
        values = {m.name: np.full(n, np.nan) for m in self.metrics}
        ties = {m.name: np.zeros(n, dtype=bool) for m in self.metrics}
        return values, ties

    def score_block(
        self, block: Candidates, rounding: tuple[float, float] | None = None
    ) -> tuple[Columns, Columns]:
        """Per-query values and tie flags of ``block.queries`` from their sorted candidates,
        ordered by their float64 keys first (:func:`embedeval.engine.decide.decide`; the keys'
        ``rounding`` is ``(scale, input_u)`` of :func:`embedeval.engine.decide.key_bounds`)."""
        return self.score_decided(self.decided(block, rounding))

    def score_decided(self, block: Candidates) -> tuple[Columns, Columns]:
        """:meth:`score_block` of a block already in float64 order (its tie codes)."""
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

    def decided(self, block: Candidates, rounding: tuple[float, float] | None = None) -> Candidates:
        """``block`` (in filter key order) in the order of its float64 keys; ``rounding`` of
        the filter keys (default: the task's ``precision``)."""
        rounding = rounding_of(self.precision) if rounding is None else rounding
        return decide_task_block(self, block, *rounding)

    def scored(self, block: Candidates, rounding: tuple[float, float] | None = None) -> ScoredBlock:
        """:meth:`score_block` as a :class:`ScoredBlock`."""
        return ScoredBlock(block.queries, *self.score_block(block, rounding))

    def positive_threshold(self, how: str | None) -> tuple[str, np.ndarray, np.ndarray] | None:
        """The engine's label-threshold argument for mode ``how`` (``None``: none)."""
        return None if how is None else (how, self.query_codes, self.reference_codes)

    def subset(self, rows: slice | np.ndarray) -> RetrievalTask:
        """The task restricted to query ``rows`` (same reference), exclusions kept by group
        codes (:meth:`embedeval.engine.exact.Exclusions.by_group`)."""
        exclusions = self.exclusions.by_group(self.n_query, int(self.reference.shape[0]))
        return dataclasses.replace(
            self,
            query=self.query[rows],
            query_codes=self.query_codes[rows],
            relevant=self.relevant[rows],
            n_valid=self.n_valid[rows],
            exclusions=exclusions.for_queries(rows),
        )


def engine_plan(
    task: RetrievalTask, block_size: int | None, memory_budget: int = DEFAULT_MEMORY_BUDGET
) -> EnginePlan:
    """The local engine's plan for ``task`` with its exclusions as group codes (which travel
    with query subsets and reference shards), without a ``search``: a backend that keeps it
    reproduces the local engine's float32 keys and candidates."""
    depth, threshold = task.depth()
    return plan_search(
        task.reference,
        n_query=task.n_query,
        distance=task.distance,
        depth=depth,
        exclusions=task.exclusions.by_group(task.n_query, int(task.reference.shape[0])),
        n_valid=task.n_valid,
        positive_threshold=task.positive_threshold(threshold),
        block_size=block_size,
        memory_budget=memory_budget,
    )
