"""embedeval: evaluate embedding models exactly, and their uncertainty.

The main entry points are :func:`evaluate` (exact, streaming kNN metrics: Precision@1,
R-Precision, MAP@R, MAP, MRR, Recall@k, NMI/AMI), :func:`neighbors` (exact kNN), :func:`compare`
(checkpoints on the same queries, returning a :class:`Comparison`), :func:`bootstrap_ci`,
:class:`Evaluator` (accumulate batches in a training loop) and :func:`train_index` (train a faiss
index once, reuse it across checkpoints).

The folders are the layers, each importing only from those below it: ``utils`` (foundations),
``plots`` (figures from arrays), ``metrics`` (statistics on arrays: ``ee.metrics.ranking``,
``ee.metrics.confidence``, ...), ``engine`` (exact kNN), ``search`` (backends), ``evaluation``
(the pipeline behind :func:`evaluate`), ``protocols`` (``ee.protocols.verification``,
``ee.protocols.reid``, ``ee.protocols.landmarks``) and ``report`` (``ee.report.figures``,
``ee.report.datasets``).  Subpackages and the top-level modules :mod:`~embedeval.io`,
:mod:`~embedeval.compat`, :mod:`~embedeval.cli` and :mod:`~embedeval.integrations` are imported
on first use, so ``import embedeval`` stays cheap (no faiss, matplotlib, scikit-learn or
PyTorch).  The short names of earlier releases (``ee.ranking``, ``ee.plots``, ``ee.reid``, ...)
still resolve to the same modules.
"""

from __future__ import annotations

import importlib
from typing import Any

from .utils.errors import (
    EmbedevalError,
    EmbedevalWarning,
    FileFormatError,
    InputError,
    InputTypeError,
)
from .utils.version import __version__

# The layers, imported on first use.
_SUBPACKAGES = (
    "utils",
    "plots",
    "metrics",
    "engine",
    "search",
    "evaluation",
    "protocols",
    "report",
    "integrations",
)
# Public top-level modules, imported on first use.
_LAZY_SUBMODULES = ("io", "cli", "compat")
# The short module names of earlier releases, kept so that ``ee.ranking.ndcg`` still works.
_SHORT_NAMES = {
    "ranking": "metrics.ranking",
    "classification": "metrics.classification",
    "confidence": "metrics.confidence",
    "calibration": "metrics.calibration",
    "openset": "metrics.openset",
    "selective": "metrics.selective",
    "uncertainty": "metrics.uncertainty",
    "credible": "metrics.credible",
    "rejection": "evaluation.rejection",
    "figures": "report.figures",
    "datasets": "report.datasets",
    "verification": "protocols.verification",
    "reid": "protocols.reid",
    "landmarks": "protocols.landmarks",
}
_LAZY_ATTRIBUTES = {
    # the pipeline too: ``import embedeval`` (and the command line's start) reads no more
    # than the errors and the version until a function is used
    "evaluate": ("evaluation.evaluate", "evaluate"),
    "compare": ("evaluation.compare", "compare"),
    "bootstrap_ci": ("evaluation.compare", "bootstrap_ci"),
    "Comparison": ("evaluation.compare", "Comparison"),
    "EvaluationResult": ("evaluation.result", "EvaluationResult"),
    "Evaluator": ("evaluation.evaluator", "Evaluator"),
    "RetrievalMetric": ("engine.custom", "RetrievalMetric"),
    "neighbors": ("search.neighbors", "neighbors"),
    "METRICS": ("engine.registry", "METRICS"),
    # faiss is imported when an index is first trained, never by ``import embedeval``.
    "train_index": ("search.approximate", "train_index"),
    "evaluate_qrels": ("protocols.qrels", "evaluate_qrels"),
    "QrelsResult": ("protocols.qrels", "QrelsResult"),
}

__all__ = [
    "METRICS",
    "Comparison",
    "EmbedevalError",
    "EmbedevalWarning",
    "EvaluationResult",
    "Evaluator",
    "FileFormatError",
    "InputError",
    "InputTypeError",
    "QrelsResult",
    "RetrievalMetric",
    "__version__",
    "bootstrap_ci",
    "compare",
    "evaluate",
    "evaluate_qrels",
    "neighbors",
    "train_index",
    *_SUBPACKAGES,
    *_LAZY_SUBMODULES,
]


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES or name in _LAZY_SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _SHORT_NAMES:
        return importlib.import_module(f".{_SHORT_NAMES[name]}", __name__)
    if name in _LAZY_ATTRIBUTES:
        module, attribute = _LAZY_ATTRIBUTES[name]
        value = getattr(importlib.import_module(f".{module}", __name__), attribute)
        globals()[name] = value  # found here from now on, without this function
        return value
    raise AttributeError(f"module 'embedeval' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
