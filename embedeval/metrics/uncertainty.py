"""Predicted uncertainties against ground truth: rank correlation and sigma regression.

``truth`` is a ground-truth uncertainty (a sigma, larger = less certain); a prediction may be a
sigma too or a confidence (a kappa), see ``higher_is_uncertain``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..utils.errors import EmbedevalWarning, InputError
from ..utils.validation import as_vector, check_bool, check_choice, check_int, check_level
from .curves import refuse_merged_integers
from .resample import statistic_ci

__all__ = ["RankCorrelation", "SigmaRegression", "rank_correlation", "sigma_regression"]


@dataclass(frozen=True)
class RankCorrelation:
    """Rank correlation statistic and its two-sided p-value."""

    statistic: float
    pvalue: float
    method: str
    n: int


def rank_correlation(
    predicted: Any,
    truth: Any,
    *,
    method: str = "spearman",
    nan_policy: str = "raise",
    higher_is_uncertain: bool = True,
) -> RankCorrelation:
    """Spearman's ρ or Kendall's τ-b between predicted and ground-truth uncertainties.

    ``truth`` is an uncertainty (a ground-truth sigma).  With ``higher_is_uncertain=True`` the
    prediction is a sigma too; with ``False`` it is a confidence (kappa) and is negated, so a
    good predictor scores close to +1 either way.  Average ranks for ties (Spearman), τ-b
    (Kendall).  Invariant to strictly increasing transforms of either input.  Integers that
    float64 cannot tell apart (beyond 2**53) are an error, as they would silently tie.

    Parameters
    ----------
    nan_policy : {"raise", "omit", "propagate"}
        As in scipy: error on NaN, drop pairs with a NaN, or return NaN.

    Zero division: constant input (or fewer than 2 pairs) has an undefined correlation: NaN
    and an :class:`~embedeval.EmbedevalWarning`, never an exception.

    Examples
    --------
    >>> iq = [106, 86, 100, 101, 99, 103, 97, 113, 112, 110]
    >>> tv = [7, 0, 27, 50, 28, 29, 20, 12, 6, 17]
    >>> round(rank_correlation(iq, tv).statistic, 6)   # -29/165
    -0.175758
    """
    from scipy import stats

    method = check_choice(method, "method", ("spearman", "kendall"))
    nan_policy = check_choice(nan_policy, "nan_policy", ("raise", "omit", "propagate"))
    check_bool(higher_is_uncertain, "higher_is_uncertain")
    # Ranked as float64: distinct integers that round to one float would silently tie.
    refuse_merged_integers(predicted, "predicted")
    refuse_merged_integers(truth, "truth")
    p = as_vector(predicted, "predicted", allow_nan=True)
    t = as_vector(truth, "truth", length=p.size, length_of="predicted", allow_nan=True)
    bad = np.isnan(p) | np.isnan(t)
    if bad.any():
        if nan_policy == "raise":
            raise InputError(
                f"predicted/truth have {int(bad.sum())} NaN pair(s), first at index "
                f"{int(np.flatnonzero(bad)[0])}; pass nan_policy='omit' to drop them."
            )
        if nan_policy == "propagate":
            return RankCorrelation(math.nan, math.nan, method, p.size)
        p, t = p[~bad], t[~bad]
    if not higher_is_uncertain:
        p = -p
    if p.size < 2 or np.all(p == p[0]) or np.all(t == t[0]):
        warnings.warn(
            "rank_correlation: an input is constant (or has fewer than 2 values), so the "
            "correlation is undefined; returning NaN.",
            EmbedevalWarning,
            stacklevel=2,
        )
        return RankCorrelation(math.nan, math.nan, method, p.size)
    if method == "spearman":
        res = stats.spearmanr(p, t)
    else:
        res = stats.kendalltau(p, t, variant="b")
    return RankCorrelation(float(res.statistic), float(res.pvalue), method, p.size)


@dataclass(frozen=True)
class SigmaRegression:
    """Error of predicted against ground-truth sigmas, with optional bootstrap intervals."""

    mse: float
    mae: float
    rmse: float
    r2: float
    n: int
    ci: dict[str, tuple[float, float]]


def _regression_values(p: np.ndarray, t: np.ndarray) -> dict[str, float]:
    diff = p - t
    mse = float(np.mean(diff * diff))
    spread = float(np.sum((t - t.mean()) ** 2))
    r2 = 1.0 - float(np.sum(diff * diff)) / spread if spread > 0 else math.nan
    return {"mse": mse, "mae": float(np.mean(np.abs(diff))), "rmse": math.sqrt(mse), "r2": r2}


def sigma_regression(
    predicted: Any,
    truth: Any,
    *,
    ci: float | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> SigmaRegression:
    """MSE, MAE, RMSE and R² of predicted sigmas against ground-truth sigmas on one scale.

    Rank correlation (:func:`rank_correlation`) only asks whether the order is right; when both
    sigmas share a scale (e.g. both in [0, 1]) these also ask whether the values are.  With
    d_i = ŷ_i - y_i: MSE = (1/n) Σ d_i², MAE = (1/n) Σ |d_i|, RMSE = √MSE and
    R² = 1 - Σ d_i² / Σ (y_i - ȳ)² (``y`` = ``truth``), as scikit-learn's
    ``mean_squared_error``, ``mean_absolute_error`` and ``r2_score``.

    Parameters
    ----------
    predicted, truth : array-like of float
        Same length, finite.
    ci : float, optional
        Adds percentile bootstrap intervals (pairs resampled) at this level in ``.ci``.
    n_boot, seed : int
        Bootstrap resamples and the seed of ``numpy.random.default_rng``.

    Ties: none matter (no ranking).  Zero division: a constant ``truth`` makes R² undefined:
    NaN (scikit-learn's ``r2_score`` returns 1.0 or 0.0 there by default); NaN replicates are
    left out of R²'s interval.

    Examples
    --------
    >>> r = sigma_regression([0.1, 0.2, 0.4], [0.1, 0.3, 0.5])
    >>> round(r.mse, 6), round(r.mae, 6)   # d = 0, -0.1, -0.1
    (0.006667, 0.066667)
    >>> round(r.r2, 4)                     # 1 - 0.02 / (0.04 + 0 + 0.04)
    0.75
    """

    p = as_vector(predicted, "predicted")
    t = as_vector(truth, "truth", length=p.size, length_of="predicted")
    values = _regression_values(p, t)
    intervals: dict[str, tuple[float, float]] = {}
    if ci is not None:
        level = check_level(ci)
        n_boot = check_int(n_boot, "n_boot")
        seed = check_int(seed, "seed", minimum=0)
        intervals = statistic_ci(_regression_values, [p, t], ci=level, n_boot=n_boot, seed=seed)
    return SigmaRegression(**values, n=int(p.size), ci=intervals)
