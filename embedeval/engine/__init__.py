"""The exact streaming kNN engine: query blocks, depth thresholds, candidate extraction, identical
rows as exact ties, the leave-one-out engine that computes each product once, and the per-metric
kernels that score ranked candidates (with the metric registry and user-defined metrics)."""

from ..utils.lazy import lazy_modules

__getattr__, __dir__ = lazy_modules(__name__, __path__)
