"""Confidence and uncertainty evaluation: does a model's confidence rank its own errors?

This module gathers the confidence metrics of the package and combines them into the summary
that ``evaluate(confidences=...)`` reports (:func:`confidence_summary`, with bootstrap intervals
from :func:`confidence_ci`).  Each concern has its own module, and every name is also
importable from here:

* :mod:`embedeval.metrics.selective`: the error-versus-reject (risk-coverage) curve and its areas,
  R-AUROC, the best threshold accuracy;
* :mod:`embedeval.metrics.calibration`: calibration errors, reliability diagrams, recalibration;
* :mod:`embedeval.metrics.openset`: out-of-gallery detection;
* :mod:`embedeval.metrics.uncertainty`: rank correlation and regression of predicted sigmas;
* :mod:`embedeval.metrics.credible`: credible regions and their coverage.

Conventions used throughout:

* A **confidence** c_i is larger when the model is more certain (a vMF kappa, a softmax max).  A
  **sigma** is an uncertainty (larger = less certain): pass ``higher_is_confident=False`` (or,
  for rank correlation, ``higher_is_uncertain=True``) and nothing else changes.
* Scores m_i are per-query metric values in [0, 1] (``result.per_query["precision_at_1"]`` or
  ``["map_at_r"]``); the error is e_i = 1 - m_i.  NaN scores (lone queries) are dropped and
  counted.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..utils.errors import EmbedevalWarning, InputError, InputTypeError
from ..utils.validation import as_vector, check_bool, check_int, check_level
from .calibration import (
    CalibrationCurve,
    calibration_summary,
    confidence_recall_curve,
    expected_calibration_error,
    maximum_calibration_error,
)
from .credible import (
    CoverageCurve,
    credible_coverage,
    gaussian_credible_radius,
    hpd_interval,
    vmf_credible_cap,
)
from .curves import refuse_merged_integers
from .openset import open_set_detection
from .resample import Statistic, statistic_ci
from .scores import scores_and_confidence
from .selective import (
    ErrorRejectCurve,
    best_threshold_accuracy,
    confidence_auroc,
    erc_areas,
    error_reject_curve,
)
from .uncertainty import RankCorrelation, SigmaRegression, rank_correlation, sigma_regression

__all__ = [
    "CalibrationCurve",
    "CoverageCurve",
    "ErrorRejectCurve",
    "RankCorrelation",
    "SigmaRegression",
    "best_threshold_accuracy",
    "confidence_auroc",
    "confidence_ci",
    "confidence_metric_names",
    "confidence_recall_curve",
    "confidence_summary",
    "credible_coverage",
    "error_reject_curve",
    "expected_calibration_error",
    "gaussian_credible_radius",
    "hpd_interval",
    "maximum_calibration_error",
    "rank_correlation",
    "sigma_regression",
    "vmf_credible_cap",
]


def confidence_summary(
    per_query: dict[str, np.ndarray],
    confidence: Any,
    *,
    higher_is_confident: bool = True,
    labels: Any = None,
    integration: str = "mean",
    bins: int = 10,
    skip_empty: bool = False,
) -> dict[str, float]:
    """Confidence metrics for every per-query metric (what ``evaluate(confidences=...)`` adds).

    For each metric m: ``auerc_m``, ``oracle_auerc_m``, ``random_auerc_m``, ``excess_auerc_m``,
    and ``aurc_m``, ``eaurc_m``, ``augrc_m`` (:func:`error_reject_curve` with ``integration``).
    From ``precision_at_1`` (else ``recall_at_1``), the 0/1 correctness c:

    * ``r_auroc`` and ``best_threshold_accuracy``;
    * when the confidences lie in [0, 1] and ``higher_is_confident`` (a predicted probability
      of being right): ``ece``, ``ece_equal_mass``, ``mce`` and ``brier`` with ``bins`` bins,
      and with ``labels`` (one per query) ``classwise_ece`` (see
      :mod:`embedeval.metrics.calibration`);
    * when some queries are lone and some are not: ``open_set_auroc`` and
      ``open_set_fpr_at_95tpr``, reading the lone queries (no same-class reference) as
      out-of-gallery and the others as enrolled (see :mod:`embedeval.metrics.openset`).

    NaN entries (lone queries) are dropped per metric, as in :func:`error_reject_curve`;
    ``evaluate`` reports how many in ``result.n_lone``.  A metric with no finite value (every
    query lone) is an error, as in :func:`error_reject_curve`, unless ``skip_empty=True``
    leaves it out (``evaluate`` does: a run whose queries are all lone has no confidence
    metric, only its warning).  Values that are not numbers are an error.  Ties and zero
    division follow the functions above (``r_auroc`` is NaN when every query is right or every
    query is wrong).

    Examples
    --------
    >>> out = confidence_summary({"precision_at_1": [1.0, 0.0, 1.0, float("nan")]},
    ...                          [0.9, 0.1, 0.8, 0.5])
    >>> round(out["auerc_precision_at_1"], 4), out["r_auroc"]   # (0 + 0 + 1/3) / 3
    (0.1111, 1.0)
    >>> round(out["augrc_precision_at_1"], 4)                    # (0 + 0 + 1/3) / 3
    0.1111
    >>> out["open_set_auroc"]      # the lone query (0.5) is below 2 of the 3 enrolled
    0.6666666666666666
    """
    # Read once (a torch tensor with grad or in bfloat16 too); integers float64 would merge
    # are refused before the cast hides them.
    refuse_merged_integers(confidence, "confidence")
    confidence = as_vector(confidence, "confidence")
    per_query = _finite_columns(per_query, confidence.size, check_bool(skip_empty, "skip_empty"))
    out = _erc_summary(per_query, confidence, higher_is_confident, integration)
    key = next((k for k in ("precision_at_1", "recall_at_1") if k in per_query), None)
    if key is not None:
        out.update(
            _correctness_summary(per_query[key], confidence, higher_is_confident, labels, bins)
        )
    return out


#: What :func:`confidence_summary` reads off the 0/1 correctness of P@1 (some only when the
#: data allow: calibration for probabilities, open set when some queries are lone).
_CORRECTNESS_NAMES = (
    "r_auroc",
    "best_threshold_accuracy",
    "ece",
    "ece_equal_mass",
    "mce",
    "brier",
    "classwise_ece",
    "open_set_auroc",
    "open_set_fpr_at_95tpr",
)


def confidence_metric_names(metrics: Sequence[str]) -> tuple[str, ...]:
    """Every name :func:`confidence_summary` can give for per-query ``metrics``, so a request
    can be checked before any evaluation (whether a value exists may still depend on the data).

    >>> names = confidence_metric_names(["precision_at_1", "map_at_r"])
    >>> "aurc_map_at_r" in names, "ece" in names, "ece" in confidence_metric_names(["map"])
    (True, True, False)
    """
    areas = tuple(f"{a}_{m}" for m in metrics for a in _SUMMARY_AREAS)
    correct = any(m in ("precision_at_1", "recall_at_1") for m in metrics)
    return areas + (_CORRECTNESS_NAMES if correct else ())


def _finite_columns(per_query: Any, n: int, skip_empty: bool) -> dict[str, np.ndarray]:
    """The per-query values as float columns, each checked to be ``n`` numbers; a column
    without a finite value is an error, or left out with ``skip_empty``."""
    if not isinstance(per_query, Mapping):
        raise InputTypeError(
            f"per_query must be a dict of metric name -> per-query values (e.g. "
            f"result.per_query); got {type(per_query).__name__}."
        )
    columns = {}
    for name, values in per_query.items():
        try:
            column = as_vector(
                values, f"per_query[{name!r}]", length=n, length_of="confidence", allow_nan=True
            )
        except InputTypeError as err:
            raise InputTypeError(
                f"{err} Pass numbers: per-query metric values in [0, 1], NaN for a lone query "
                "(as in result.per_query)."
            ) from None
        if not np.isnan(column).all():
            columns[name] = column
        elif not skip_empty:
            raise InputError(
                f"per_query[{name!r}] has no finite value (every query lone?); nothing to "
                "evaluate. Leave that metric out, or pass skip_empty=True to skip it."
            )
    return columns


_SUMMARY_AREAS = ("auerc", "oracle_auerc", "random_auerc", "excess_auerc", "aurc", "eaurc", "augrc")


def _erc_summary(
    per_query: dict[str, np.ndarray], confidence: Any, higher_is_confident: bool, integration: str
) -> dict[str, float]:
    """The error-reject areas of every metric; metrics that leave out the same (lone) queries
    share one sort and one pass (:func:`erc_areas` over a matrix)."""
    columns = per_query  # float columns, each with a finite value (see _finite_columns)
    if not columns:
        return {}
    names = list(columns)
    values = np.stack([columns[m] for m in names], axis=1)
    mask = np.isnan(values)
    if (mask != mask[:, :1]).any():  # metrics that drop different queries: one curve each
        areas = {}
        for name in names:
            erc = error_reject_curve(
                columns[name],
                confidence,
                higher_is_confident=higher_is_confident,
                integration=integration,
            )
            areas.update({f"{a}_{name}": float(getattr(erc, a)) for a in _SUMMARY_AREAS})
        return areas
    for j, name in enumerate(names):  # the checks (range, lengths) of error_reject_curve
        _, conf, _ = scores_and_confidence(values[:, j], confidence, higher_is_confident, name)
    areas = erc_areas(1.0 - values[~mask[:, 0]], conf, integration)
    return {f"{a}_{m}": float(areas[a][j]) for a in _SUMMARY_AREAS for j, m in enumerate(names)}


def _correctness_summary(
    correct: Any, confidence: Any, higher_is_confident: bool, labels: Any, bins: int
) -> dict[str, float]:
    out: dict[str, float] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EmbedevalWarning)
        out["r_auroc"] = confidence_auroc(
            correct, confidence, higher_is_confident=higher_is_confident
        )
    out["best_threshold_accuracy"] = best_threshold_accuracy(
        correct, confidence, higher_is_confident=higher_is_confident
    )
    s = np.asarray(correct, dtype=np.float64)
    c = np.asarray(confidence, dtype=np.float64)
    if higher_is_confident and c.min() >= 0 and c.max() <= 1:
        cal = calibration_summary(s, c, labels=labels, bins=bins)
        out.update({k: float(v) for k, v in cal.items()})
    lone = np.isnan(s)
    if lone.any() and not lone.all():
        det = open_set_detection(~lone, c, higher_is_confident=higher_is_confident)
        out["open_set_auroc"] = det["auroc"]
        out["open_set_fpr_at_95tpr"] = det["fpr_at_tpr"]
    return out


def summary_statistic(
    names: Sequence[str], higher_is_confident: bool, has_labels: bool, keys: Sequence[str] | None
) -> Statistic:
    """:func:`confidence_summary` of one resample of (per-query matrix, confidences[, codes]).

    The returned function takes the resampled arrays of :func:`summary_arrays` and gives the
    summary (only ``keys``, NaN where absent, when ``keys`` is given); warnings of a resample
    that holds a single class are silenced (its values are NaN).

    Examples
    --------
    >>> stat = summary_statistic(["precision_at_1"], True, False, ["r_auroc"])
    >>> stat(np.array([[1.0], [0.0]]), np.array([0.9, 0.1]))   # the right query is surer
    {'r_auroc': 1.0}
    """

    def stat(values: np.ndarray, conf: np.ndarray, *codes: np.ndarray) -> dict[str, float]:
        # Every metric sorts by confidence; sorted once here, their stable sorts see sorted
        # input and run in linear time (the statistics do not depend on the query order).
        order = np.argsort(conf if higher_is_confident else -conf, kind="stable")[::-1]
        values, conf = values[order], conf[order]
        codes = tuple(c[order] for c in codes)
        per_query = {name: values[:, j] for j, name in enumerate(names)}
        with warnings.catch_warnings():  # a resample may hold a single class: NaN, no noise
            warnings.simplefilter("ignore", EmbedevalWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            out = confidence_summary(  # a resample may hold only lone queries: no value
                per_query,
                conf,
                higher_is_confident=higher_is_confident,
                labels=codes[0] if has_labels else None,
                skip_empty=True,
            )
        return out if keys is None else {k: out.get(k, math.nan) for k in keys}

    return stat


def summary_arrays(
    per_query: dict[str, np.ndarray], conf: np.ndarray, labels: object
) -> tuple[list[str], list[np.ndarray]]:
    """The metric names and the arrays resampled together: (n x m values, confidences[, codes]).

    Examples
    --------
    >>> names, arrays = summary_arrays({"a": [1.0, 0.0]}, np.array([0.2, 0.4]), ["x", "y"])
    >>> names, [a.shape for a in arrays]
    (['a'], [(2, 1), (2,), (2,)])
    """
    from ..utils.validation import as_labels, factorize

    names = list(per_query)
    arrays = [np.stack([np.asarray(per_query[m], np.float64) for m in names], axis=1), conf]
    if labels is not None:
        y = as_labels(labels, "labels", length=conf.size, length_of="confidences")
        (codes,), _ = factorize(y)
        arrays.append(codes)
    return names, arrays


def confidence_ci(
    per_query: dict[str, np.ndarray],
    confidences: np.ndarray,
    *,
    labels: object = None,
    higher_is_confident: bool = True,
    ci: float,
    n_boot: int,
    seed: int,
) -> dict[str, tuple[float, float]]:
    """Percentile bootstrap intervals of every :func:`confidence_summary` value.

    Queries are resampled with replacement (a duplicated query is a tied confidence block) and
    every value is recomputed on the same resamples; lone queries travel with their resample,
    so the open-set values keep their meaning.  The interval is (q_{(1-ci)/2}, q_{(1+ci)/2}) of
    the finite replicates (a resample where a value is undefined, e.g. R-AUROC of a resample
    with one class, is left out).  The inputs are checked as in :func:`confidence_summary`
    (``labels``: one per query), before the first resample.

    Examples
    --------
    >>> out = confidence_ci({"precision_at_1": np.array([1.0, 0.0, 1.0, 1.0])},
    ...                     np.array([0.9, 0.2, 0.8, 0.7]), ci=0.9, n_boot=20, seed=0)
    >>> out["oracle_auerc_precision_at_1"][0] >= 0.0
    True
    """
    level = check_level(ci)
    n_boot = check_int(n_boot, "n_boot")
    seed = check_int(seed, "seed", minimum=0)
    # Checked on the whole data first: inside a resample a bad value would be reported at its
    # shuffled position, and a length mismatch would fail in numpy's indexing.
    refuse_merged_integers(confidences, "confidences")
    conf = as_vector(confidences, "confidences")
    confidence_summary(per_query, conf, higher_is_confident=higher_is_confident, skip_empty=True)
    names, arrays = summary_arrays(per_query, conf, labels)
    stat = summary_statistic(names, higher_is_confident, labels is not None, None)
    return statistic_ci(stat, arrays, ci=level, n_boot=n_boot, seed=seed)
