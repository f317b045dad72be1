"""A Dask backend: query blocks are searched on the workers of a ``dask.distributed`` cluster.

The prepared reference (the matrix the engine multiplies by) and the label and group codes are
scattered once to every worker; each task is a run of consecutive query blocks, cut at the local
engine's block boundaries, that a worker searches with the engine's own loop (same depth
thresholds from the same column subsample, same tile products), so the float32 keys, the
candidates and therefore every value and tie flag equal the local engine's bit for bit.  The
client only gathers per-query values and tie flags.

Full-depth rankings (``map`` / ``minp`` with ``k=None``) are the exception: the whole task is
scattered, and each worker runs the local deep engine on its runs of queries (its values do not
depend on where blocks start: every rank is decided in float64).

Install with ``pip install "embedeval-exact[dask]"`` (``pip install ".[dask]"`` in a clone).
Workers, like the local engine, multiply with one BLAS thread per product (OpenBLAS splits a
product among threads and the split changes the rounding), which is what makes the numbers
identical to a local run whatever the client's or the workers' thread settings.  See
docs/scale.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine.decide import Reach, candidate_bounds, decide, rounding_of, sq_norms, task_norms
from ..engine.deep import deep_applies, deep_range_blocks
from ..engine.exact import EnginePlan, PreparedSearch, block_buffers, search_block
from ..engine.kernels import chunk_metrics
from ..engine.registry import MetricInfo
from ..engine.symmetric import SymmetricSearch, SymmetricSet, symmetric_applies
from ..engine.task import RetrievalTask, ScoredBlock, engine_plan, write_back
from ..engine.threads import single_threaded_blas
from ..utils.errors import InputError, InputTypeError
from ..utils.progress import progress_bar
from .local import with_exact_keys

__all__ = ["check_client", "n_workers_of", "search"]

#: Tasks per worker: enough to balance uneven blocks, few enough to keep scheduling cheap.
_TASKS_PER_WORKER = 4


@dataclass(frozen=True)
class _Shared:
    """What every worker receives once: the engine plan of the whole task (no ``search``), the
    prepared reference matrix, the reference labels and the metrics to score."""

    plan: EnginePlan
    reference: np.ndarray
    reference_codes: np.ndarray
    metrics: tuple[MetricInfo, ...]
    k: int | None
    #: Leave-one-out served by the symmetric engine: the workers use its canonical keys.
    symmetric: bool = False
    distance: str = "euclidean"
    #: The reference rows as given (cosine: ``reference`` holds them normalised), for the
    #: float64 decision (:mod:`embedeval.engine.decide`); None: read off ``reference``.
    rows: np.ndarray | None = None
    #: The float32 keys are exact (small integers: :func:`~embedeval.search.local.with_exact_keys`):
    #: no threshold is widened and nothing is decided in float64.
    exact: bool = False


@dataclass(frozen=True)
class _Part:
    """One worker task: a run of consecutive engine blocks, from query ``q0``."""

    q0: int
    queries: np.ndarray
    query_codes: np.ndarray
    relevant: np.ndarray
    n_valid: np.ndarray
    #: The query rows as given, and their float64 squared norms (embedeval.engine.decide).
    rows: np.ndarray | None = None
    sq: np.ndarray | None = None


def search(task: RetrievalTask, options: Any) -> Iterator[ScoredBlock]:
    """The Dask backend's entry point (see :mod:`embedeval.search.dispatch`): exact scored blocks
    computed on the workers of ``options.client`` (a client is only checked here, when the
    search starts: validating the other options never touches it)."""
    client = options.client
    as_completed = check_client(client)
    if not task.has_work:
        return
    task = with_exact_keys(task)
    if deep_applies(task):  # full-depth rankings: the local deep engine on every worker
        yield from _deep_on_workers(task, options, client, as_completed)
        return
    plan = engine_plan(task, options.block_size, options.memory_budget)
    prepared = PreparedSearch.build(task.query, task.reference, task.distance)
    shared = _Shared(
        plan,
        np.ascontiguousarray(prepared.reference_t.T),
        task.reference_codes,
        task.metrics,
        task.k,
        symmetric_applies(task, plan.threshold, plan.duplicates),
        task.distance,
        np.asarray(task.reference) if task.distance == "cosine" else None,
        task.precision == "exact",
    )
    norms = task_norms(task)
    parts = (
        _Part(
            rows.start,
            prepared.queries[rows],
            task.query_codes[rows],
            task.relevant[rows],
            task.n_valid[rows],
            np.asarray(task.query[rows]),
            norms.q_sq[rows],
        )
        for rows in _task_rows(client, task.n_query, plan.block_size)
    )
    work = ((_search_part, part) for part in parts)
    yield from _on_workers(client, as_completed, shared, work, options.progress)


def _on_workers(
    client: Any, as_completed: Any, shared: Any, work: Iterator[tuple], progress: bool | None
) -> Iterator[ScoredBlock]:
    """Send ``shared`` to every worker once, submit ``fn(shared, *args)`` for each
    ``(fn, *args)`` of ``work``, and yield the results as they come; Ctrl-C or a failed
    worker cancels every future (nothing of the run is kept or left running)."""
    futures = []
    try:
        # random key (hash=False): a key from the content would be the previous run's on the
        # same data, and its late release would drop it under this run's tasks
        shared_future = client.scatter(shared, broadcast=True, hash=False)
        for fn, *args in work:
            futures.append(client.submit(fn, shared_future, *args, pure=False))
        with progress_bar(len(futures), "query blocks", enabled=progress) as bar:
            for _, block in as_completed(futures, with_results=True):
                if isinstance(block, BaseException):  # a cancelled task's error, not raised
                    raise block
                yield block
                bar.update(1)
    except BaseException:
        client.cancel(futures)
        raise


def _deep_on_workers(
    task: RetrievalTask, options: Any, client: Any, as_completed: Any
) -> Iterator[ScoredBlock]:
    """Full-depth ``map`` / ``minp`` (:func:`~embedeval.engine.deep.deep_applies`): the task
    is sent to every worker once, and each worker ranks its runs of queries with the local
    deep engine, which sorts each row's keys once instead of packing and sorting nearly every
    key as candidates (``python -m benchmarks.bench_scale deep``)."""
    sizes = (options.block_size, options.memory_budget)
    work = ((_deep_part, rows, *sizes) for rows in _task_rows(client, task.n_query, 1))
    yield from _on_workers(client, as_completed, task, work, options.progress)


def _deep_part(
    task: RetrievalTask, rows: slice, block_size: int | None, memory_budget: int
) -> ScoredBlock:
    """Worker side: the deep engine's values and tie flags of queries ``rows``."""
    task = _aligned_rows(task)
    values, ties = task.empty_outputs()
    write_back(values, ties, deep_range_blocks(task, rows, block_size=block_size,
                                               memory_budget=memory_budget))  # fmt: skip
    pick = lambda columns: {name: v[rows] for name, v in columns.items()}  # noqa: E731
    return ScoredBlock(rows, pick(values), pick(ties))


def _aligned_rows(task: RetrievalTask) -> RetrievalTask:
    """``task`` with its query and reference rows copied into numpy's own allocation where
    they arrived unaligned (see :func:`_search_blocks`), the reference still the query set
    when it was."""

    def aligned(x: Any) -> Any:
        # numpy's own allocations start on 16-byte boundaries; unpickled frames may not
        unaligned = isinstance(x, np.ndarray) and (x.ctypes.data % 16 or not x.flags.c_contiguous)
        return np.array(x, order="C") if unaligned else x

    query = aligned(task.query)
    reference = query if task.reference is task.query else aligned(task.reference)
    return dataclasses.replace(task, query=query, reference=reference)


def check_client(client: Any) -> Any:
    """Check ``client``; return ``distributed.as_completed``."""
    try:
        from distributed import Client, as_completed
    except ImportError as exc:  # pragma: no cover - exercised only without distributed
        raise InputError(
            "backend='dask' needs dask.distributed: pip install \"embedeval-exact[dask]\" "
            '(from a clone of the repository: pip install ".[dask]").'
        ) from exc
    if client is None:
        raise InputError(
            "backend='dask' needs client=, a dask.distributed.Client connected to your cluster "
            "(e.g. Client('tcp://scheduler:8786'), or Client(LocalCluster()) on one machine)."
        )
    if not isinstance(client, Client):
        raise InputTypeError(
            f"client must be a dask.distributed.Client; got {type(client).__name__}."
        )
    return as_completed


def _task_rows(client: Any, n_query: int, block_size: int) -> list[slice]:
    """Query ranges of the worker tasks, cut at the local engine's block boundaries."""
    n_workers = n_workers_of(client)
    per_task = -(-n_query // (_TASKS_PER_WORKER * n_workers))
    per_task = max(1, -(-per_task // block_size)) * block_size
    return [slice(q0, min(q0 + per_task, n_query)) for q0 in range(0, n_query, per_task)]


def n_workers_of(client: Any) -> int:
    """The number of workers of a Dask client's cluster (at least 1)."""
    try:
        info = client.scheduler_info(n_workers=-1)
    except TypeError:  # distributed < 2025: every worker is listed by default
        info = client.scheduler_info()
    return max(1, len(info.get("workers", {})))


def _search_part(shared: _Shared, part: _Part) -> ScoredBlock:
    """Worker side: run :func:`_search_blocks` with one BLAS thread per product, as the local
    engine does."""
    with single_threaded_blas():
        return _search_blocks(shared, part)


def _search_blocks(shared: _Shared, part: _Part) -> ScoredBlock:
    """Worker side: the local engine's block loop over one run of query blocks."""
    # Arrays unpickled from dask's network frames sit at arbitrary byte offsets (measured: an
    # odd address, so not even float32-aligned), and numpy does not pass unaligned operands to
    # BLAS directly; every tile product then pays for it (a worker ran 1.4x slower than the
    # local engine).  One copy per task into numpy's own aligned allocation costs about 0.13 s
    # for 200,000 x 129 floats and leaves every value unchanged.
    reference = np.array(shared.reference, order="C")
    n = part.queries.shape[0]
    plan = shared.plan.for_queries(slice(part.q0, part.q0 + n))
    dim = int(part.rows.shape[1])
    m_sq = 1.0 if plan.reference_sq is None else plan.reference_sq
    rounding = rounding_of("exact" if shared.exact else "float32")
    reach = Reach(part.sq * (1.0 + 2.0**-40), m_sq, dim, plan.distance, *rounding)
    search = PreparedSearch(np.array(part.queries, order="C"), reference.T, None, reach=reach)
    search = search.with_duplicates(plan.duplicates, plan.representatives, slice(0, len(reference)))
    if shared.symmetric:
        whole = SymmetricSet.from_search(search, plan.distance)
        search = SymmetricSearch.wrap(search, whole, row_offset=part.q0)
    plan = plan.with_search(search)
    buffers = block_buffers(plan, min(plan.block_size, n))
    values = {m.name: np.full(n, np.nan) for m in shared.metrics}
    ties = {m.name: np.zeros(n, dtype=bool) for m in shared.metrics}
    write_back(values, ties, _scored_blocks(shared, part, plan, buffers))
    return ScoredBlock(slice(part.q0, part.q0 + n), values, ties)


def _scored_blocks(
    shared: _Shared, part: _Part, plan: EnginePlan, buffers: tuple[np.ndarray, np.ndarray]
) -> Iterator[ScoredBlock]:
    n = part.queries.shape[0]
    rows = shared.rows
    if rows is None:  # Euclidean: [x, ||x||^2]; inner product: x
        rows = shared.reference[:, :-1] if shared.distance == "euclidean" else shared.reference
    dim = int(rows.shape[1])
    ref_sq = sq_norms(rows)
    for start in range(0, n, plan.block_size):
        stop = min(start + plan.block_size, n)
        block = search_block(plan, start, stop, *buffers)
        if not shared.exact:  # exact keys: the block's order is the float64 one
            bounds = candidate_bounds(block, part.sq[start:stop], ref_sq, dim, shared.distance)
            block, _ = decide(block, part.rows, rows, shared.distance, bounds)
        yield ScoredBlock(
            slice(start, stop),
            *chunk_metrics(
                block,
                part.query_codes[start:stop],
                shared.reference_codes,
                part.relevant[start:stop],
                part.n_valid[start:stop],
                list(shared.metrics),
                shared.k,
            ),
        )
