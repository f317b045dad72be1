"""embedeval: evaluate metric-learning embeddings and their uncertainty.

The main entry points are :func:`evaluate` (exact, streaming kNN metrics: Precision@1,
R-Precision, MAP@R, MAP, MRR, Recall@k, NMI/AMI) and :func:`neighbors` (exact kNN).  The
submodules :mod:`~embedeval.ranking`, :mod:`~embedeval.classification`,
:mod:`~embedeval.confidence`, :mod:`~embedeval.plots`, :mod:`~embedeval.datasets` and the protocol
modules (:mod:`~embedeval.verification`, :mod:`~embedeval.reid`, :mod:`~embedeval.landmarks`) are
imported on first use, so ``import embedeval`` stays cheap (no matplotlib, no scikit-learn).
"""

from __future__ import annotations

import importlib
from typing import Any

from ._errors import EmbedevalError, EmbedevalWarning, FileFormatError, InputError, InputTypeError
from ._version import __version__

# Imported eagerly (numpy only) because these functions share their module's name: a lazy import
# of the submodule would leave ``embedeval.evaluate`` / ``embedeval.compare`` bound to the module.
from .compare import bootstrap_ci, compare
from .evaluate import evaluate

_LAZY_SUBMODULES = (
    "ranking",
    "classification",
    "confidence",
    "calibration",
    "openset",
    "rejection",
    "plots",
    "datasets",
    "io",
    "cli",
    "compat",
    "verification",
    "reid",
    "landmarks",
)
_LAZY_ATTRIBUTES = {
    "EvaluationResult": ("result", "EvaluationResult"),
    "Evaluator": ("evaluator", "Evaluator"),
    "RetrievalMetric": ("custom", "RetrievalMetric"),
    "neighbors": ("knn", "neighbors"),
    "METRICS": ("_registry", "METRICS"),
}

__all__ = [
    "METRICS",
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
