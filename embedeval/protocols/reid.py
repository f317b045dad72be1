"""Re-identification protocol: the Market-1501 / DukeMTMC convention on top of :func:`evaluate`.

For each query, gallery items that show the same identity *from the same camera* are removed
from its ranking (they are near-duplicates of the query, not a re-identification), and junk
gallery items (identity -1 in Market-1501: badly cropped detections) are dropped from the gallery.
Queries left with no correct match are lone and excluded from every average.  The metrics are
then :func:`evaluate`'s: ``map`` (AP over the full ranking), ``minp`` (Ye et al.'s mINP),
``precision_at_1`` (rank-1) and the CMC curve, ``result.cmc(max_rank)``.

Two AP rules (``ap_rule=``), with the correct matches at 1-based ranks r_1 < ... < r_R of the
query's ranking (hidden and junk items removed):

* ``"step"`` (default; torchreid, fast-reid, and most recent papers): AP = (1/R) sum_j j / r_j.
* ``"trapezoid"`` (Market-1501's official MATLAB evaluation and Person_reID_baseline_pytorch's
  ``compute_mAP``; revisitop uses the same rule): AP = (1/R) sum_j ((j - 1) / (r_j - 1) +
  j / r_j) / 2, the first term 1 when r_j = 1.  Never above the step AP; matches at ranks 2 and
  3 give 7/12 step and 5/12 trapezoid.

The exclusion is the group mechanism of :func:`evaluate`: a reference is hidden from a query when
their group ids are equal, so a group id per (identity, camera) pair hides exactly the
same-identity-same-camera items (:func:`identity_camera_groups`).  Other identities seen from the
query's camera stay in the ranking, as in the published protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..evaluation.result import EvaluationResult
from ..utils.errors import InputError
from ..utils.validation import as_labels, check_choice, check_same_label_kind, factorize

__all__ = ["AP_RULES", "DEFAULT_REID_METRICS", "evaluate_reid", "identity_camera_groups"]

#: What re-identification papers report (CMC rank-1 is ``precision_at_1``).
DEFAULT_REID_METRICS = ("map", "minp", "precision_at_1", "mrr")

#: The rules ``evaluate_reid(ap_rule=...)`` computes ``map`` with (see the module docstring).
AP_RULES = ("step", "trapezoid")

# The trapezoid AP is computed as a custom metric of the same search under this name, then
# renamed "map" in every part of the result (an identifier no one would give a metric).
_TRAPEZOID = "map_ap_rule_trapezoid"


def identity_camera_groups(
    query_ids: Any, query_cameras: Any, gallery_ids: Any, gallery_cameras: Any
) -> tuple[np.ndarray, np.ndarray]:
    """Group ids, one per (identity, camera) pair, for ``evaluate(query_groups=...,
    reference_groups=...)``: a gallery item is hidden from a query exactly when both its identity
    and its camera equal the query's.  Query and gallery identities (and cameras) must be of
    one kind, numbers, str or bytes: ``"0"`` never equals ``0``, so a mix is refused.

    Examples
    --------
    >>> qg, gg = identity_camera_groups([1, 1], [0, 1], [1, 1, 2], [0, 1, 0])
    >>> (gg[None, :] == qg[:, None]).astype(int).tolist()  # hidden (query, gallery) pairs
    [[1, 0, 0], [0, 1, 0]]
    """
    qi = as_labels(query_ids, "query_ids")
    qc = as_labels(query_cameras, "query_cameras", length=qi.size, length_of="query_ids")
    gi = as_labels(gallery_ids, "gallery_ids")
    gc = as_labels(gallery_cameras, "gallery_cameras", length=gi.size, length_of="gallery_ids")
    # Camera "0" never equals camera 0: a text / number mix would hide no same-camera match.
    check_same_label_kind(qi, "query_ids", gi, "gallery_ids")
    check_same_label_kind(qc, "query_cameras", gc, "gallery_cameras")
    (qi_codes, gi_codes), _ = factorize(qi, gi)
    (qc_codes, gc_codes), cams = factorize(qc, gc)
    n_cams = cams.size
    return qi_codes * n_cams + qc_codes, gi_codes * n_cams + gc_codes


def evaluate_reid(
    query: Any,
    query_ids: Any,
    query_cameras: Any,
    gallery: Any,
    gallery_ids: Any,
    gallery_cameras: Any,
    *,
    junk_ids: Sequence[Any] = (-1,),
    metrics: Any = DEFAULT_REID_METRICS,
    distance: str = "euclidean",
    ap_rule: str = "step",
    **options: Any,
) -> EvaluationResult:
    """Evaluate re-identification embeddings with the Market-1501 convention.

    Gallery rows whose identity is in ``junk_ids`` are dropped (None: none; text gallery ids,
    str or bytes, in numpy arrays or as Python objects, are compared with the junk ids as text,
    so the default drops ``"-1"`` and ``b"-1"`` too); gallery
    items with the query's identity and camera are hidden from that query; everything else is
    :func:`evaluate` (pass its options, e.g. ``ci=0.95``, through ``options``).
    ``result.cmc(50)`` gives the CMC curve (``"mrr"`` must stay among the metrics for it).

    Parameters
    ----------
    ap_rule : {"step", "trapezoid"}
        The AP that ``map`` holds, per query and averaged, recorded in
        ``result.settings["ap_rule"]``.  With the correct matches at 1-based ranks r_1 < ... <
        r_R of the ranking (hidden and junk items removed; equal distances by ascending gallery
        index): ``"step"`` (default), (1/R) sum_j j / r_j, what torchreid and fast-reid report;
        ``"trapezoid"``, (1/R) sum_j ((j - 1) / (r_j - 1) + j / r_j) / 2 with the first term 1
        when r_j = 1, what Market-1501's official evaluation and Person_reID_baseline_pytorch
        report.  The trapezoid AP is computed from the same ranking as every other metric, and
        its intervals, ties and per-class values are reported under ``map`` like the step AP's.
        With an int ``k`` the matches beyond k add nothing (R stays the number of matches).

    Examples
    --------
    >>> q = [[0.0], [5.0]]
    >>> g = [[0.1], [0.2], [5.1], [9.0]]
    >>> res = evaluate_reid(q, [1, 2], [0, 0], g, [1, 1, 2, -1], [0, 1, 1, 1])
    >>> res["map"], res.settings["n_reference"]  # the same-camera 1 at 0.1 is hidden
    (1.0, 3)

    Matches at ranks 2 and 3: step AP (1/2 + 2/3) / 2 = 7/12, trapezoid AP
    ((0/1 + 1/2) / 2 + (1/2 + 2/3) / 2) / 2 = 5/12.

    >>> g = [[1.0], [2.0], [3.0]]
    >>> args = ([[0.0]], [1], [0], g, [2, 1, 1], [0, 1, 2])
    >>> round(evaluate_reid(*args, metrics=["map"])["map"], 4)
    0.5833
    >>> round(evaluate_reid(*args, metrics=["map"], ap_rule="trapezoid")["map"], 4)
    0.4167
    """
    ap_rule = check_choice(ap_rule, "ap_rule", AP_RULES)
    gi = as_labels(gallery_ids, "gallery_ids")
    junk = _junk_list(junk_ids, gi)
    keep = ~_is_junk(gi, junk)
    if not keep.any():
        raise InputError(
            f"every gallery item has an identity in junk_ids={junk!r}; nothing is left to search."
        )
    gallery_arr = np.asarray(gallery)
    gc = as_labels(gallery_cameras, "gallery_cameras", length=gi.size, length_of="gallery_ids")
    if gallery_arr.ndim != 2 or gallery_arr.shape[0] != gi.size:
        raise InputError(
            f"gallery must be 2-D with one row per gallery id ({gi.size}); got shape "
            f"{gallery_arr.shape}."
        )
    qg, gg = identity_camera_groups(query_ids, query_cameras, gi[keep], gc[keep])
    from ..evaluation.evaluate import evaluate

    order = None
    if ap_rule == "trapezoid":
        order, metrics, options["custom_metrics"] = _trapezoid_request(
            metrics, options.get("custom_metrics")
        )
    res = evaluate(
        query,
        query_ids,
        gallery_arr[keep],
        gi[keep],
        metrics=metrics,
        distance=distance,
        query_groups=qg,
        reference_groups=gg,
        **options,
    )
    if order is not None:
        _rename_trapezoid(res, order)
    res.settings["protocol"] = "reid: same identity and camera hidden, junk ids dropped"
    res.settings["junk_ids"] = junk
    res.settings["n_junk"] = int((~keep).sum())
    res.settings["ap_rule"] = ap_rule
    return res


def _junk_list(junk_ids: Any, gallery_ids: np.ndarray) -> list[Any]:
    """``junk_ids`` as a list: None is none, a single id is one; compared as text when the
    gallery ids are text (``"-1"``, Market-1501's junk identity read from file names), in the
    gallery's own text type: str for str ids (numpy strings or Python objects, as pandas holds
    them), bytes for bytes ids (as HDF5 files store them)."""
    if junk_ids is None:
        return []
    if isinstance(junk_ids, (str, bytes)) or np.ndim(junk_ids) == 0:
        junk_ids = [junk_ids]
    junk = list(junk_ids)
    text = _text_types(gallery_ids)
    words = [v for v in junk if isinstance(v, (str, bytes))]
    if words and not text:  # would match nothing: text is never equal to a number
        raise InputError(
            f"junk_ids holds text ({words[0]!r}) but gallery_ids are numbers, so it would drop "
            "nothing; pass the junk identities as numbers (e.g. junk_ids=-1)."
        )
    if text:
        # every text form once, in order: a str and a bytes gallery id can both be junk
        junk = list(dict.fromkeys(_as_text(v, t) for t in text for v in junk))
    return junk


def _text_types(ids: np.ndarray) -> list[type]:
    """The text types (str, bytes) among ``ids``; as_labels refuses text beside numbers, so a
    non-empty answer means every id is text."""
    if ids.dtype.kind in "US":
        return [str if ids.dtype.kind == "U" else bytes]
    if ids.dtype != object:
        return []
    return [t for t in (str, bytes) if any(isinstance(v, t) for v in ids)]


def _as_text(value: Any, kind: type) -> str | bytes:
    """A junk id as text of ``kind``: -1 is "-1" or b"-1"."""
    if isinstance(value, kind):
        return value
    if kind is bytes:
        return str(value).encode()
    return value.decode() if isinstance(value, bytes) else str(value)


def _is_junk(gallery_ids: np.ndarray, junk: list[Any]) -> np.ndarray:
    """Whether each gallery id is one of ``junk`` (compared with ==, as labels are)."""
    if not junk:
        return np.zeros(gallery_ids.size, bool)
    if gallery_ids.dtype == object:
        # one Python comparison per id: np.isin would sort mixed objects or split tuple ids
        ids = set(junk)
        return np.fromiter((v in ids for v in gallery_ids), bool, count=gallery_ids.size)
    return np.isin(gallery_ids, np.asarray(junk))


def _trapezoid_ap(relevant: np.ndarray, n_relevant: np.ndarray) -> np.ndarray:
    """The trapezoid AP of each ranked row (a custom metric of the whole ranking)."""
    from .landmarks import trapezoid_ap

    rows, ranks = np.nonzero(relevant)  # row by row, ranks increasing within a row
    lims = np.searchsorted(rows, np.arange(relevant.shape[0] + 1))
    return trapezoid_ap(ranks, lims, n_relevant)


def _trapezoid_request(
    metrics: Any, custom_metrics: Any
) -> tuple[list[str], list[str], dict[str, Any]]:
    """The metrics asked for (canonical names, in order), the built-in ones to compute (all but
    ``map``) and the custom metrics with the trapezoid AP added."""
    from ..engine.custom import RetrievalMetric
    from ..engine.registry import parse_metrics

    names = [m.name for m in parse_metrics(metrics)]
    if "map" not in names:
        raise InputError(
            f"ap_rule='trapezoid' sets how 'map' is computed, but metrics={names} has no 'map'; "
            "add it, or leave ap_rule at 'step'."
        )
    custom = dict(custom_metrics or {})
    if _TRAPEZOID in custom:
        raise InputError(f"custom_metrics: {_TRAPEZOID!r} is reserved by ap_rule='trapezoid'.")
    custom[_TRAPEZOID] = RetrievalMetric(
        _trapezoid_ap,
        depth="all",
        description="mean average precision, trapezoid rule (Market-1501's evaluation)",
        value_range=(0.0, 1.0),
    )
    return names, [n for n in names if n != "map"], custom


def _rename_trapezoid(res: EvaluationResult, order: list[str]) -> None:
    """Report the trapezoid AP as ``map`` wherever a metric name appears (values, per query,
    per class, ties, intervals, confidence statistics such as ``aurc_map``, the approximate
    search report), with ``map`` where it was asked for among the metrics."""

    def renamed(d: dict[str, Any]) -> dict[str, Any]:
        d = {k.replace(_TRAPEZOID, "map"): v for k, v in d.items()}
        return {**{n: d[n] for n in order if n in d}, **d}

    res.metrics = renamed(res.metrics)
    res.per_query = renamed(res.per_query)
    res.per_class = renamed(res.per_class)
    res.n_ties = renamed(res.n_ties)
    res.ci = renamed(res.ci)
    res.confidence = renamed(res.confidence)
    if isinstance(res.approximation.get("metrics"), dict):
        res.approximation["metrics"] = renamed(res.approximation["metrics"])
    listed = [str(n).replace(_TRAPEZOID, "map") for n in res.settings.get("metrics", [])]
    res.settings["metrics"] = list(renamed(dict.fromkeys(listed)))
