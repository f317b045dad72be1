"""A Dask backend: query blocks are searched on the workers of a ``dask.distributed`` cluster.

The prepared reference (the matrix the engine multiplies by) and the label and group codes are
scattered once to every worker; each task is a run of consecutive query blocks, cut at the local
engine's block boundaries, that a worker searches with the engine's own loop (same depth
thresholds from the same column subsample, same tile products), so the float32 keys, the
candidates and therefore every value and tie flag equal the local engine's bit for bit.  The
client only gathers per-query values and tie flags.

Install with ``pip install "embedeval-exact[dask]"`` (``pip install ".[dask]"`` in a clone).
Workers, like the local engine, multiply with one BLAS thread per product (OpenBLAS splits a
product among threads and the split changes the rounding), which is what makes the numbers
identical to a local run whatever the client's or the workers' thread settings.  See
docs/scale.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._engine import RetrievalTask
from ._errors import InputError, InputTypeError
from ._kernels import chunk_metrics
from ._progress import progress_bar
from ._scale import engine_layout, group_exclusions
from ._symmetric import SymmetricSearch, SymmetricSet, symmetric_applies
from .knn import (
    DEFAULT_MEMORY_BUDGET,
    Exclusions,
    PreparedSearch,
    column_subsample,
    search_block,
    single_threaded_blas,
)

__all__ = ["run_dask"]

#: Tasks per worker: enough to balance uneven blocks, few enough to keep scheduling cheap.
_TASKS_PER_WORKER = 4


def run_dask(
    task: RetrievalTask,
    client: Any,
    *,
    block_size: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    progress: bool | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Exact per-query values and tie flags computed on the workers of ``client``."""
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
    values, ties = task.empty_outputs()
    if not task.metrics or not (task.relevant > 0).any():
        return values, ties
    layout = engine_layout(task, block_size, memory_budget)
    groups = group_exclusions(task)
    n_query, n_ref = task.n_query, int(task.reference.shape[0])
    prepared = PreparedSearch.build(task.query, task.reference, task.distance)
    shared = {
        "reference": np.ascontiguousarray(prepared.reference_t.T),
        "reference_codes": task.reference_codes,
        "reference_groups": None if groups is None else groups[1],
        "subsample": column_subsample(layout.need, n_ref),
        "duplicates": layout.duplicates,
        "representatives": layout.representatives,
    }
    settings = {
        "block_size": layout.block_size,
        "tile": layout.tile,
        "col_bits": layout.col_bits,
        "threshold": layout.threshold,
        "metrics": task.metrics,
        "k": task.k,
        "memory_budget": memory_budget,
        # Leave-one-out: the workers use the symmetric engine's canonical keys.
        "symmetric": symmetric_applies(task, layout.threshold, layout.duplicates),
        "distance": task.distance,
    }
    try:
        info = client.scheduler_info(n_workers=-1)
    except TypeError:  # distributed < 2025: every worker is listed by default
        info = client.scheduler_info()
    n_workers = max(1, len(info.get("workers", {})))
    per_task = -(-n_query // (_TASKS_PER_WORKER * n_workers))
    per_task = max(1, -(-per_task // layout.block_size)) * layout.block_size
    futures = []
    try:
        shared_future = client.scatter(shared, broadcast=True)
        for q0 in range(0, n_query, per_task):
            rows = slice(q0, min(q0 + per_task, n_query))
            part = {
                "q0": q0,
                "queries": prepared.queries[rows],
                "query_codes": task.query_codes[rows],
                "relevant": task.relevant[rows],
                "n_valid": task.n_valid[rows],
                "need": layout.need[rows],
                "query_groups": None if groups is None else groups[0][rows],
            }
            futures.append(client.submit(_search_part, shared_future, part, settings, pure=False))
        with progress_bar(len(futures), "query blocks", enabled=progress) as bar:
            for _, (q0, part_values, part_ties) in as_completed(futures, with_results=True):
                stop = q0 + next(iter(part_values.values())).size
                for name in part_values:
                    values[name][q0:stop] = part_values[name]
                    ties[name][q0:stop] = part_ties[name]
                bar.update(1)
    except BaseException:
        # Ctrl-C or a failed worker: nothing of the run is kept or left running.
        client.cancel(futures)
        raise
    return values, ties


def _search_part(
    shared: dict[str, Any], part: dict[str, Any], settings: dict[str, Any]
) -> tuple[int, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Worker side: run :func:`_search_blocks` with one BLAS thread per product, as the local
    engine does."""
    with single_threaded_blas():
        return _search_blocks(shared, part, settings)


def _search_blocks(
    shared: dict[str, Any], part: dict[str, Any], settings: dict[str, Any]
) -> tuple[int, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Worker side: the local engine's block loop over one run of query blocks."""
    # Arrays unpickled from dask's network frames sit at arbitrary byte offsets (measured: an
    # odd address, so not even float32-aligned), and numpy does not pass unaligned operands to
    # BLAS directly; every tile product then pays for it (a worker ran 1.4x slower than the
    # local engine).  One copy per task into numpy's own aligned allocation costs about 0.13 s
    # for 200,000 x 129 floats and leaves every value unchanged.
    reference = np.array(shared["reference"], order="C")
    search = PreparedSearch(np.array(part["queries"], order="C"), reference.T, None)
    search = search.with_duplicates(
        shared["duplicates"], shared["representatives"], slice(0, reference.shape[0])
    )
    if settings["symmetric"]:
        whole = SymmetricSet.from_search(search, settings["distance"])
        search = SymmetricSearch.wrap(search, whole, row_offset=part["q0"])
    n = part["queries"].shape[0]
    if shared["reference_groups"] is None:
        exclusions = Exclusions()
    else:
        exclusions = Exclusions(
            query_groups=part["query_groups"], reference_groups=shared["reference_groups"]
        )
    positive = None
    if settings["threshold"] is not None:
        positive = (settings["threshold"], part["query_codes"], shared["reference_codes"])
    bsz, tile, col_bits = settings["block_size"], settings["tile"], settings["col_bits"]
    metrics = list(settings["metrics"])
    keys_buffer = np.empty(min(bsz, n) * tile, dtype=np.float32)
    mask_buffer = np.empty(keys_buffer.size, dtype=bool)
    values: dict[str, np.ndarray] = {m.name: np.full(n, np.nan) for m in metrics}
    ties: dict[str, np.ndarray] = {m.name: np.zeros(n, dtype=bool) for m in metrics}
    need = part["need"]
    for start in range(0, n, bsz):
        stop = min(start + bsz, n)
        block = search_block(
            search,
            start,
            stop,
            need,
            shared["subsample"],
            exclusions,
            positive,
            tile,
            col_bits,
            (keys_buffer, mask_buffer),
            settings["memory_budget"],
        )
        chunk_values, chunk_ties = chunk_metrics(
            block,
            part["query_codes"][start:stop],
            shared["reference_codes"],
            part["relevant"][start:stop],
            part["n_valid"][start:stop],
            metrics,
            settings["k"],
        )
        for name in chunk_values:
            values[name][start:stop] = chunk_values[name]
            ties[name][start:stop] = chunk_ties[name]
    return part["q0"], values, ties
