"""Credible regions of probabilistic embeddings and how often they hold what they promise.

Highest-density intervals from posterior draws, the credible ball of an isotropic Gaussian and
the credible cap of a von Mises-Fisher, and the empirical coverage of those regions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ..utils.errors import InputError, InputTypeError
from ..utils.validation import (
    as_embeddings,
    as_labels,
    as_vector,
    check_choice,
    check_int,
    check_probability,
    factorize,
    host_array,
    refuse_object_array,
)

__all__ = [
    "CoverageCurve",
    "credible_coverage",
    "gaussian_credible_radius",
    "hpd_interval",
    "vmf_credible_cap",
]


def hpd_interval(
    samples: Any, prob: float = 0.95, *, axis: int = -1
) -> tuple[np.ndarray, np.ndarray]:
    """Highest-density interval from posterior draws, vectorised over all other axes.

    The shortest interval holding m = ⌊p·n⌋ + 1 sorted draws (capped at n): among the windows
    [x_(i), x_(i+m-1)] the narrowest one (the first if several tie).  p·n is worked out
    exactly with p read as the decimal it prints as, so ``prob=0.57`` with 100 draws gives
    m = 58 (the float product 0.57·100 is 56.99999999999999).

    Ties: equal widths keep the leftmost window.  Zero division: never (m >= 1 draw).  NaN or
    infinite draws are an error.

    Examples
    --------
    >>> lo, hi = hpd_interval([0.0, 1.0, 1.1, 1.2, 5.0], prob=0.5)
    >>> float(lo), float(hi)
    (1.0, 1.2)
    """
    prob = check_probability(prob, "prob")
    raw = np.asarray(host_array(samples))  # a torch tensor (grad, GPU) as its host copy
    refuse_object_array(raw, "samples", "pass numeric draws (e.g. np.asarray(draws, float)).")
    if raw.dtype.kind not in "fiub":
        raise InputTypeError(f"samples must be numeric draws; got dtype {raw.dtype}.")
    if raw.ndim == 0:
        raise InputError("samples must be an array of draws (at least 1-D); got a scalar.")
    if not isinstance(axis, (int, np.integer)) or not -raw.ndim <= axis < raw.ndim:
        raise InputError(
            f"axis={axis!r} is out of range for samples of shape {raw.shape}; pass the axis "
            "that holds the draws (default -1)."
        )
    x = np.moveaxis(np.sort(raw.astype(np.float64), axis=axis), axis, -1)
    n = x.shape[-1]
    if n == 0:
        raise InputError("samples is empty along the given axis.")
    if not np.isfinite(x).all():
        raise InputError(
            f"samples has {int((~np.isfinite(x)).sum())} NaN or infinite draw(s); drop them first."
        )
    # p read as the decimal it prints as: 0.57 * 100 is 56.999... in floats, 57 as 57/100.
    m = min(n, math.floor(Fraction(repr(prob)) * n) + 1)
    widths = x[..., m - 1 :] - x[..., : n - m + 1]
    start = np.argmin(widths, axis=-1)[..., None]
    low = np.take_along_axis(x, start, axis=-1)[..., 0]
    high = np.take_along_axis(x, start + m - 1, axis=-1)[..., 0]
    return low, high


def _real_array(value: Any, name: str) -> np.ndarray:
    """A float64 array of finite numbers >= 0 (a sigma or a kappa), or a clear error."""
    raw = np.asarray(host_array(value))  # a torch tensor (grad, GPU) as its host copy
    refuse_object_array(raw, name, "pass an array of numbers.")
    if raw.dtype.kind not in "fiub":
        raise InputTypeError(f"{name} must be numeric; got dtype {raw.dtype}.")
    arr = raw.astype(np.float64)
    bad = ~np.isfinite(arr) | (arr < 0)
    if bad.any():
        if arr.ndim == 0:
            raise InputError(f"{name} must be finite and >= 0; got {float(arr)}.")
        first = tuple(np.argwhere(bad)[0].tolist())
        raise InputError(
            f"{name} must be finite and >= 0; {int(bad.sum())} value(s) are not, first at "
            f"{first if len(first) > 1 else first[0]} ({arr[first]})."
        )
    return arr


def gaussian_credible_radius(sigma: Any, dim: int, prob: float = 0.95) -> np.ndarray:
    """Radius of the HPD ball of an isotropic Gaussian N(μ, σ² I_dim): r = σ·sqrt(χ²_dim(p)).

    ‖x − μ‖²/σ² follows χ² with ``dim`` degrees of freedom, so the ball of radius r holds
    probability p.  ``sigma`` may be an array (one radius per item); ``prob=1`` gives ``inf``
    (for every σ, 0 included: the whole space).

    Examples
    --------
    >>> round(float(gaussian_credible_radius(1.0, 1, 0.95)), 4)   # the familiar 1.96
    1.96
    """
    from scipy.stats import chi2

    dim = check_int(dim, "dim")
    prob = check_probability(prob, "prob")
    sigma = _real_array(sigma, "sigma")
    scale = math.sqrt(chi2.ppf(prob, dim))
    if math.isinf(scale):  # prob = 1: the whole space, for every sigma (0 · inf would be NaN)
        return np.full(sigma.shape, math.inf)[()]
    return sigma * scale


def _vmf_cap_one(kappa: float, dim: int, prob: float) -> float:
    """Cosine threshold t with P(μ·x >= t) = prob under vMF(κ) on S^(dim-1).

    With u = (1 - w)/2 ∈ [0, 1] the density of w = μ·x becomes ∝ exp(-2κu) u^a (1-u)^a,
    a = (dim-3)/2.  The mass is integrated in log space, scaled by its maximum and over a window
    holding all but ~e^-40 of it, so any κ (0 to 1e7) and any dim work; for dim = 2 (a = -1/2,
    integrable endpoint singularities) an algebraic quadrature weight takes the singular factor.
    """
    from scipy import integrate, optimize

    if prob >= 1:
        return -1.0
    a = (dim - 3) / 2
    k2 = 2.0 * kappa
    if a < 0:
        upper = 1.0 if k2 <= 50 else 60.0 / k2

        def head(x: float) -> float:  # ∫_0^x exp(-2κu) u^a (1-u)^a du, singular weight u^a
            return integrate.quad(
                lambda u: math.exp(-k2 * u) * (1 - u) ** a, 0, x, weight="alg", wvar=(a, 0)
            )[0]

        if upper < 1.0:
            total = head(upper)
            mass = head
        else:
            total = integrate.quad(lambda u: math.exp(-k2 * u), 0, 1, weight="alg", wvar=(a, a))[0]

            def mass(x: float) -> float:
                if x <= 0.5:
                    return head(x)
                tail = integrate.quad(
                    lambda u: math.exp(-k2 * u) * u**a, x, 1, weight="alg", wvar=(0, a)
                )[0]
                return total - tail

        lo = 0.0
    else:
        if a == 0:
            mode, sd = 0.0, 1.0 / k2 if k2 > 0 else 1.0
        else:
            # The mode solves k2 u² - (k2 + 2a) u + a = 0; its smaller root written as
            # 2a / (b + sqrt(b² - 4 k2 a)) has no cancellation, so it tends smoothly to the
            # uniform sphere's 1/2 as κ -> 0 (the textbook (b - sqrt(...)) / 2k2 gives 0/0).
            b = k2 + 2 * a
            mode = 2 * a / (b + math.sqrt(b * b - 4 * k2 * a))
            sd = 1.0 / math.sqrt(a / mode**2 + a / (1 - mode) ** 2)
        lo = max(0.0, mode - 40 * sd)
        upper = min(1.0, mode + 40 * sd + 40 / max(k2, 1e-300))

        def log_density(u: float) -> float:
            return -k2 * u + (a * (math.log(u) + math.log1p(-u)) if a else 0.0)

        peak = log_density(mode) if a == 0 or 0 < mode < 1 else 0.0

        def f(u: float) -> float:
            if a and not 0 < u < 1:
                return 0.0
            return math.exp(log_density(u) - peak)

        def mass(x: float) -> float:
            if x <= lo:
                return 0.0
            points = [mode] if lo < mode < x else None
            return integrate.quad(f, lo, x, points=points, limit=200, epsabs=0, epsrel=1e-11)[0]

        total = mass(upper)
    x = optimize.brentq(lambda x: mass(x) / total - prob, lo, upper, xtol=1e-15, rtol=1e-13)
    return 1.0 - 2.0 * x


def vmf_credible_cap(kappa: Any, dim: int, prob: float = 0.95) -> np.ndarray:
    """Cosine threshold t of the HPD cap {x : μ·x >= t} of a von Mises-Fisher on S^(dim-1).

    The density of w = μ·x is ∝ exp(κ w) (1 - w²)^((dim-3)/2) on [-1, 1] and increases with w,
    so the highest-density region is a cap; t solves P(w >= t) = prob (adaptive quadrature in
    log space and root finding, per κ; accurate to ~1e-12 for κ from 0 to 1e7).  dim = 3 has
    the closed form t = 1 + log(1 - p(1 - e^(-2κ)))/κ; dim = 2 is the von Mises law on the
    circle.  ``prob=1`` gives -1 (the whole sphere).

    Examples
    --------
    >>> round(float(vmf_credible_cap(0.0, 3, 0.5)), 6)   # uniform on the sphere: half above 0
    0.0
    >>> round(float(vmf_credible_cap(1000.0, 3, 0.9)), 6)   # 1 + log(1 - 0.9)/1000
    0.997697
    """
    dim = check_int(dim, "dim", minimum=2)
    prob = check_probability(prob, "prob")
    kappa = _real_array(kappa, "kappa")
    unique, inverse = np.unique(kappa, return_inverse=True)  # one root solve per distinct κ
    caps = np.array([_vmf_cap_one(float(k), dim, prob) for k in unique])
    return caps[inverse].reshape(kappa.shape)


@dataclass(frozen=True)
class CoverageCurve:
    """Empirical coverage of credible regions at each nominal level."""

    nominal: np.ndarray
    empirical: np.ndarray
    n_queries: int

    def plot(self, ax: Any = None, label: str | None = None) -> Any:
        """Draw coverage against the nominal level with the diagonal (see embedeval.plots)."""
        from ..plots import plot_coverage

        return plot_coverage(self, ax=ax, label=label)


def _within_radius(xq: np.ndarray, xc: np.ndarray, radii: np.ndarray) -> np.ndarray:
    """``inside[i, j, l]``: is ‖xq_i - xc_j‖ <= radii[i, l] (a reference on the sphere counts).

    The squared distance |a|² + |b|² - 2a·b (one matrix product) is off by at most about
    (d + 2)·eps·(|a|² + |b|²) (the rounding bound of a d-term dot product); a pair farther than
    that from a radius is decided by it, a nearer one (a twin at a radius of 0, a reference on
    the boundary) is redone from the coordinate differences, which give a twin exactly 0.
    """
    sq_q, sq_c = (xq * xq).sum(1), (xc * xc).sum(1)
    scale = sq_q[:, None] + sq_c[None, :]
    sq = scale - 2 * (xq @ xc.T)
    r2 = (radii * radii)[:, None, :]
    inside = sq[:, :, None] <= r2
    tol = 4 * (xq.shape[1] + 2) * np.finfo(np.float64).eps * scale
    unsure = (np.abs(sq[:, :, None] - r2) <= tol[:, :, None]).any(axis=2)
    i, j = np.nonzero(unsure)
    if i.size:
        dist = np.sqrt(((xq[i] - xc[j]) ** 2).sum(axis=1))
        inside[i, j] = dist[:, None] <= radii[i]
    return inside


def _inside_counts(xc: np.ndarray, thresholds: np.ndarray, model: str) -> np.ndarray:
    """For each row of one class and each level, how many other rows lie in its region:
    Euclidean distance <= radius (Gaussian) or cosine of the normalised rows >= threshold
    (vMF), so a reference on the boundary is inside.  Row blocks keep memory at block x class
    size (a large class would not fit at once).
    """
    n, n_levels = thresholds.shape
    counts = np.empty((n, n_levels))
    step = max(1, 2**22 // max(n * n_levels, 1))
    for lo in range(0, n, step):
        rows = slice(lo, lo + step)
        if model == "vmf":
            inside = (xc[rows] @ xc.T)[:, :, None] >= thresholds[rows][:, None, :]
        else:
            inside = _within_radius(xc[rows], xc, thresholds[rows])
        own = np.arange(inside.shape[0])
        inside[own, own + lo] = False  # not the query itself
        counts[rows] = inside.sum(axis=1)
    return counts


def _directions(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length; a zero row has no direction, so it is an error."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    zero = np.flatnonzero(norms[:, 0] == 0)
    if zero.size:
        raise InputError(
            f"embeddings has {zero.size} zero vector(s), first at row {int(zero[0])}; "
            "model='vmf' compares directions and a zero vector has none: drop those rows "
            "(or use model='gaussian')."
        )
    return x / norms


def credible_coverage(
    embeddings: Any,
    labels: Any,
    uncertainty: Any,
    *,
    model: str = "gaussian",
    levels: Any = (0.5, 0.8, 0.9, 0.95, 0.99),
) -> CoverageCurve:
    """Fraction of same-class references inside each query's credible region, per level.

    ``model="gaussian"``: ``uncertainty`` is σ and the region is the ball of radius
    :func:`gaussian_credible_radius` around the query (Euclidean).  ``model="vmf"``:
    ``uncertainty`` is κ and the region is the cap :func:`vmf_credible_cap` around the
    normalised query (cosine).  Leave-one-out: a query's own row is not counted; lone queries
    are skipped.  Well-calibrated uncertainties put the curve on the diagonal.

    Ties: a reference exactly on the region's boundary counts as inside.  Zero division: lone
    queries (no other member of the class) are skipped; all lone is an error; with
    ``model="vmf"`` a zero embedding (no direction) is an error.

    Examples
    --------
    >>> cov = credible_coverage([[0.0], [0.5], [3.0]], [0, 0, 0], [1.0, 1.0, 1.0], levels=[0.5])
    >>> cov.empirical.tolist()   # radius 0.674: only the pair 0 / 0.5 is inside
    [0.3333333333333333]
    """
    model = check_choice(model, "model", ("gaussian", "vmf"))
    x = as_embeddings(embeddings, "embeddings").astype(np.float64)
    y = as_labels(labels, "labels", length=x.shape[0], length_of="embeddings")
    u = as_vector(uncertainty, "uncertainty", length=x.shape[0], length_of="embeddings")
    levels = np.asarray([check_probability(p, "levels") for p in np.atleast_1d(levels)])
    if levels.size == 0:
        raise InputError("levels is empty; pass credible levels such as (0.5, 0.9, 0.95).")
    (codes,), _ = factorize(y)
    if model == "vmf":
        x = _directions(x)
        thresholds = np.stack([vmf_credible_cap(u, x.shape[1], p) for p in levels], axis=1)
    else:
        thresholds = np.stack([gaussian_credible_radius(u, x.shape[1], p) for p in levels], axis=1)
    fractions = []
    for c in np.unique(codes):  # one class at a time: only same-class pairs are needed
        members = np.flatnonzero(codes == c)
        if members.size >= 2:
            inside = _inside_counts(x[members], thresholds[members], model)
            fractions.append(inside / (members.size - 1))
    if not fractions:
        raise InputError("every query is lone (no other member of its class); no coverage.")
    per_query = np.concatenate(fractions)
    return CoverageCurve(levels, per_query.mean(axis=0), per_query.shape[0])
