"""Search backends behind one interface, and the dispatch to them.

A backend is one module with one entry point::

    def search(task: RetrievalTask, options: SearchOptions) -> Iterator[ScoredBlock]

It receives the validated task (:class:`embedeval.engine.task.RetrievalTask`: embeddings, label
codes, exclusions, metrics, depth) and the validated options
(:class:`embedeval.search.options.SearchOptions`), and yields
:class:`embedeval.engine.task.ScoredBlock` s: the per-query values and tie flags of some query rows.
:func:`run_search` writes them into the per-query arrays with one function
(:func:`embedeval.engine.task.write_back`); rows never yielded stay NaN (lone queries).  A backend
that measures something about its own search returns it from the generator: the approximate
index's error estimate becomes :attr:`SearchOutcome.approximation` (its module says so with
``REPORT = "approximation"``), the torch backend's record of the products it ran (device,
filter precision, blocks per product, where it decided) :attr:`SearchOutcome.search` (the
default).

The backends: ``local`` (:mod:`embedeval.search.local`, the exact streaming engine of
:mod:`embedeval.engine.exact`), ``sharded`` (:mod:`embedeval.search.sharded`), ``dask``
(:mod:`embedeval.search.dask_backend`), ``approximate`` (:mod:`embedeval.search.approximate`,
faiss) and ``torch``
(:mod:`embedeval.search.torch_backend`).  :attr:`SearchOptions.engine` picks one.  To add a backend,
add one module with such a ``search`` function, its name in :data:`BACKEND_MODULES`, and, when
it takes options of its own, their checks in :meth:`SearchOptions.make` and the rule that
selects it in :attr:`SearchOptions.engine`; nothing else threads through the package.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..engine.task import RetrievalTask, write_back
from ..engine.threads import thread_cap
from .options import BACKENDS, SearchOptions

__all__ = [
    "BACKENDS",
    "BACKEND_MODULES",
    "ENGINE_LIBRARIES",
    "SearchOptions",
    "SearchOutcome",
    "run_search",
]

#: Backend name (:attr:`SearchOptions.engine`) -> the module whose ``search`` runs it.  Modules
#: are imported when first used, so optional dependencies (faiss, dask, torch) stay optional.
BACKEND_MODULES = {
    "local": "embedeval.search.local",
    "sharded": "embedeval.search.sharded",
    "dask": "embedeval.search.dask_backend",
    "approximate": "embedeval.search.approximate",
    "torch": "embedeval.search.torch_backend",
}


#: Engine -> the libraries that run its parallel work on threads of their own, which
#: ``n_threads`` limits too (:func:`embedeval.engine.threads.thread_cap`).
ENGINE_LIBRARIES = {"approximate": ("faiss",), "torch": ("torch",)}


@dataclass(frozen=True)
class SearchOutcome:
    """What a search returns: per-query values (NaN for lone queries), per-query tie flags,
    for an approximate index the exact-sample report, and for the torch backend the record of
    how it searched (``{}`` otherwise)."""

    values: dict[str, np.ndarray]
    ties: dict[str, np.ndarray]
    approximation: dict[str, Any]
    search: dict[str, Any] = field(default_factory=dict)


def run_search(task: RetrievalTask, options: SearchOptions) -> SearchOutcome:
    """Run ``task`` on the backend ``options`` select and gather its scored blocks."""
    backend = importlib.import_module(BACKEND_MODULES[options.engine])
    values, ties = task.empty_outputs()
    libraries = [importlib.import_module(name) for name in ENGINE_LIBRARIES.get(options.engine, ())]
    with thread_cap(options.n_threads, libraries):
        report = write_back(values, ties, backend.search(task, options)) or {}
    if getattr(backend, "REPORT", "search") == "approximation":
        return SearchOutcome(values, ties, report)
    return SearchOutcome(values, ties, {}, report)
