"""Statistics on arrays the user already has: ranking / IR metrics, trec_eval's metrics from
judged ranks, classification, confidence, calibration, selective prediction, uncertainty,
credible intervals, open-set detection.

The public modules are :mod:`~embedeval.metrics.ranking`, :mod:`~embedeval.metrics.judged`,
:mod:`~embedeval.metrics.classification`, :mod:`~embedeval.metrics.confidence` (which
re-exports every confidence name), :mod:`~embedeval.metrics.calibration`,
:mod:`~embedeval.metrics.selective`, :mod:`~embedeval.metrics.uncertainty`,
:mod:`~embedeval.metrics.credible` and :mod:`~embedeval.metrics.openset`; ``curves``,
``scores``, ``pairs`` and ``resample`` are their shared helpers.
"""

from ..utils.lazy import lazy_modules

__getattr__, __dir__ = lazy_modules(__name__, __path__)
