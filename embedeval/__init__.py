"""embedeval: evaluate metric-learning embeddings and their uncertainty.

The main entry points are :func:`evaluate` (exact, streaming kNN metrics: Precision@1,
R-Precision, MAP@R, MAP, MRR, Recall@k, NMI/AMI), :func:`neighbors` (exact kNN), :func:`compare`
(checkpoints on the same queries, returning a :class:`Comparison`), :func:`bootstrap_ci`,
:class:`Evaluator` (accumulate batches in a training loop) and :func:`train_index` (train a faiss
index once, reuse it across checkpoints).  The submodules :mod:`~embedeval.ranking`,
:mod:`~embedeval.classification`, :mod:`~embedeval.confidence`, :mod:`~embedeval.calibration`,
:mod:`~embedeval.openset`, :mod:`~embedeval.rejection`, :mod:`~embedeval.plots`,
:mod:`~embedeval.figures`, :mod:`~embedeval.datasets`, :mod:`~embedeval.io`,
:mod:`~embedeval.compat`, :mod:`~embedeval.integrations` and the protocol modules
(:mod:`~embedeval.verification`, :mod:`~embedeval.reid`, :mod:`~embedeval.landmarks`) are
imported on first use, so ``import embedeval`` stays cheap (no faiss, matplotlib, scikit-learn
or PyTorch).
"""

from __future__ import annotations

import importlib
from typing import Any

from ._errors import EmbedevalError, EmbedevalWarning, FileFormatError, InputError, InputTypeError
from ._version import __version__

# Imported eagerly (numpy only) because these functions share their module's name: a lazy import
# of the submodule would leave ``embedeval.evaluate`` / ``embedeval.compare`` bound to the module.
from .compare import Comparison, bootstrap_ci, compare
from .evaluate import evaluate

_LAZY_SUBMODULES = (
    "ranking",
    "classification",
    "confidence",
    "calibration",
    "openset",
    "selective",
    "uncertainty",
    "credible",
    "rejection",
    "plots",
    "figures",
    "datasets",
    "io",
    "cli",
    "compat",
    "verification",
    "reid",
    "landmarks",
    "integrations",
)
_LAZY_ATTRIBUTES = {
    "EvaluationResult": ("result", "EvaluationResult"),
    "Evaluator": ("evaluator", "Evaluator"),
    "RetrievalMetric": ("custom", "RetrievalMetric"),
    "neighbors": ("knn", "neighbors"),
    "METRICS": ("_registry", "METRICS"),
    # faiss is imported when an index is first trained, never by ``import embedeval``.
    "train_index": ("_approx", "train_index"),
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
    "RetrievalMetric",
    "__version__",
    "bootstrap_ci",
    "compare",
    "evaluate",
    "neighbors",
    "train_index",
    *_LAZY_SUBMODULES,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY_ATTRIBUTES:
        module, attribute = _LAZY_ATTRIBUTES[name]
        return getattr(importlib.import_module(f".{module}", __name__), attribute)
    raise AttributeError(f"module 'embedeval' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
