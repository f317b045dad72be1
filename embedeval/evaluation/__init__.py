"""The evaluation pipeline: :func:`embedeval.evaluate` as named stages
(settings, data, plan, search, summary), its result object, the reject-both curve, retrieval with
per-query relevance lists, bootstrap intervals, the comparison of checkpoints and the
training-loop :class:`~embedeval.evaluation.evaluator.Evaluator`."""

from ..utils.lazy import lazy_modules

__getattr__, __dir__ = lazy_modules(__name__, __path__)
