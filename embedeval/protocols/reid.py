"""Re-identification protocol: the Market-1501 / DukeMTMC convention on top of :func:`evaluate`.

For each query, gallery items that show the same identity *from the same camera* are removed
from its ranking (they are near-duplicates of the query, not a re-identification), and junk
gallery items (identity -1 in Market-1501: badly cropped detections) are dropped from the gallery.
Queries left with no correct match are lone and excluded from every average.  The metrics are
then :func:`evaluate`'s: ``map`` (AP over the full ranking), ``minp`` (Ye et al.'s mINP),
``precision_at_1`` (rank-1) and the CMC curve, ``result.cmc(max_rank)``.

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
from ..utils.validation import as_labels, factorize

__all__ = ["DEFAULT_REID_METRICS", "evaluate_reid", "identity_camera_groups"]

#: What re-identification papers report (CMC rank-1 is ``precision_at_1``).
DEFAULT_REID_METRICS = ("map", "minp", "precision_at_1", "mrr")


def identity_camera_groups(
    query_ids: Any, query_cameras: Any, gallery_ids: Any, gallery_cameras: Any
) -> tuple[np.ndarray, np.ndarray]:
    """Group ids, one per (identity, camera) pair, for ``evaluate(query_groups=...,
    reference_groups=...)``: a gallery item is hidden from a query exactly when both its identity
    and its camera equal the query's.

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
    **options: Any,
) -> EvaluationResult:
    """Evaluate re-identification embeddings with the Market-1501 convention.

    Gallery rows whose identity is in ``junk_ids`` are dropped; gallery items with the query's
    identity and camera are hidden from that query; everything else is :func:`evaluate` (pass
    its options, e.g. ``ci=0.95``, through ``options``).  ``result.cmc(50)`` gives the CMC curve
    (``"mrr"`` must stay among the metrics for it).

    Examples
    --------
    >>> q = [[0.0], [5.0]]
    >>> g = [[0.1], [0.2], [5.1], [9.0]]
    >>> res = evaluate_reid(q, [1, 2], [0, 0], g, [1, 1, 2, -1], [0, 1, 1, 1])
    >>> res["map"], res.settings["n_reference"]  # the same-camera 1 at 0.1 is hidden
    (1.0, 3)
    """
    gi = as_labels(gallery_ids, "gallery_ids")
    junk = list(junk_ids)
    keep = ~np.isin(gi, np.asarray(junk)) if junk else np.ones(gi.size, bool)
    if not keep.any():
        raise InputError(
            f"every gallery item has an identity in junk_ids={list(junk_ids)!r}; nothing is "
            "left to search."
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
    res.settings["protocol"] = "reid: same identity and camera hidden, junk ids dropped"
    res.settings["junk_ids"] = list(junk_ids)
    res.settings["n_junk"] = int((~keep).sum())
    return res
