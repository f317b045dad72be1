"""Per-query retrieval metric kernels over sorted candidate rows.

Each kernel sees one chunk of queries: the packed, sorted candidates of :mod:`embedeval.knn`
(nearest first, ties by ascending reference index), the query labels, R_q (relevant references
each query can see) and n_valid (references each query can see).  Everything is vectorised over
the chunk; values are float64 and NaN for lone queries (R_q = 0).

Conventions (PML 2.9's ``AccuracyCalculator`` where it is right):

* ``k=None``: each metric reads the depth it needs.  An int ``k`` caps the depth at
  ``min(k, n_valid)``; the relevance window of ``r_precision`` / ``map_at_r`` is ``min(R_q, k)``,
  ``r_precision`` divides by that window, ``map_at_r`` and ``map`` keep the divisor R_q, and
  ``mrr`` is 0 when no relevant reference is within the first k.
* A tie is reported for a query when a block of equally distant references that mixes relevant
  and non-relevant items could change the value under another ordering: for count metrics
  (P@1, R-precision, Recall@k, P@k) a block straddling the cut-off; for rank-weighted metrics
  (MAP@R, MAP, MRR) any such block inside the window.
"""

from __future__ import annotations

import numpy as np

from ._registry import MetricInfo
from .knn import unpack

__all__ = ["chunk_metrics", "needed_depth"]


def needed_depth(
    metrics: list[MetricInfo], relevant: np.ndarray, k: int | None
) -> tuple[np.ndarray, str | None]:
    """Depth (ranked items, +1 to see a tie at the cut-off) each query needs, and whether a
    label-based threshold is needed (``"max"`` for full-depth MAP, ``"min"`` for MRR)."""
    depth = np.zeros(relevant.shape, dtype=np.int64)
    threshold = None
    for m in metrics:
        if m.kind != "knn":
            continue
        if m.depth in ("one", "fixed"):
            need = np.full_like(depth, m.cutoff)
        elif m.depth == "r":
            need = relevant if k is None else np.minimum(relevant, k)
        elif k is not None:
            need = np.full_like(depth, k)
        else:
            need = np.ones_like(depth)
            if m.depth == "full":
                threshold = "max"
            elif threshold is None:
                threshold = "min"
        np.maximum(depth, need + 1, out=depth)
    depth[relevant == 0] = 0
    return depth, threshold


def chunk_metrics(
    packed: np.ndarray,
    query_codes: np.ndarray,
    reference_codes: np.ndarray,
    relevant: np.ndarray,
    n_valid: np.ndarray,
    metrics: list[MetricInfo],
    k: int | None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per-query values and tie flags for one chunk of sorted candidate rows."""
    index, bits, pad = unpack(packed)
    g, length = packed.shape
    rows = np.arange(g)
    rel = (reference_codes[index] == query_codes[:, None]) & ~pad
    hits = np.cumsum(rel, axis=1, dtype=np.int64)
    lone = relevant == 0
    safe_r = np.maximum(relevant, 1)
    depth_cap = n_valid if k is None else np.minimum(n_valid, k)
    mixed, ties_possible = _mixed_tie_blocks(bits, pad, rel, hits)
    mixed_before = np.cumsum(mixed, axis=1) if ties_possible else None
    precision_weighted = None
    values: dict[str, np.ndarray] = {}
    ties: dict[str, np.ndarray] = {}

    def hits_at(window: np.ndarray) -> np.ndarray:
        return hits[rows, np.clip(window, 1, length) - 1]

    def straddles(window: np.ndarray) -> np.ndarray:
        if not ties_possible:
            return np.zeros(g, dtype=bool)
        w = np.clip(window, 1, length)
        nxt = np.minimum(w, length - 1)
        same = (bits[rows, w - 1] == bits[rows, nxt]) & (w < length) & ~pad[rows, nxt]
        return same & mixed[rows, w - 1]

    def mixed_within(window: np.ndarray) -> np.ndarray:
        if not ties_possible:
            return np.zeros(g, dtype=bool)
        return mixed_before[rows, np.clip(window, 1, length) - 1] > 0

    for m in metrics:
        if m.kind != "knn":
            continue
        if m.depth in ("one", "fixed"):
            window = np.minimum(m.cutoff, n_valid)
            found = hits_at(window)
            if m.name.startswith("recall"):
                value = (found > 0).astype(np.float64)
            else:
                value = found / m.cutoff
            tie = straddles(window)
        elif m.name == "r_precision":
            window = relevant if k is None else np.minimum(relevant, k)
            value = hits_at(window) / np.maximum(window, 1)
            tie = straddles(window)
        elif m.name in ("map_at_r", "map"):
            if precision_weighted is None:
                precision = hits / np.arange(1, length + 1, dtype=np.float64)
                precision_weighted = np.cumsum(np.where(rel, precision, 0.0), axis=1)
            if m.name == "map_at_r":
                window = relevant if k is None else np.minimum(relevant, k)
            elif k is None:
                # Every relevant reference is among the candidates: read through the last one.
                window = length - np.argmax(rel[:, ::-1], axis=1)
            else:
                window = depth_cap
            value = precision_weighted[rows, np.clip(window, 1, length) - 1] / safe_r
            tie = mixed_within(window)
        elif m.name == "mrr":
            first = np.argmax(rel, axis=1)
            found = rel[rows, first] & (first < depth_cap)
            value = np.where(found, 1.0 / (first + 1.0), 0.0)
            window = np.where(found, first + 1, depth_cap)
            tie = mixed_within(window)
        else:  # pragma: no cover - the registry only produces the names above
            raise AssertionError(m.name)
        value = np.asarray(value, dtype=np.float64)
        value[lone] = np.nan
        values[m.name] = value
        ties[m.name] = tie & ~lone
    return values, ties


def _mixed_tie_blocks(
    bits: np.ndarray, pad: np.ndarray, rel: np.ndarray, hits: np.ndarray
) -> tuple[np.ndarray, bool]:
    """Mark positions inside a block of equal keys holding both relevant and non-relevant items."""
    equal_next = (bits[:, 1:] == bits[:, :-1]) & ~pad[:, 1:]
    if not equal_next.any():
        return np.zeros(bits.shape, dtype=bool), False
    length = bits.shape[1]
    positions = np.arange(length)
    starts = np.ones(bits.shape, dtype=bool)
    starts[:, 1:] = ~equal_next
    ends = np.ones(bits.shape, dtype=bool)
    ends[:, :-1] = ~equal_next
    first = np.maximum.accumulate(np.where(starts, positions, 0), axis=1)
    last = np.minimum.accumulate(np.where(ends, positions, length - 1)[:, ::-1], axis=1)[:, ::-1]
    relevant_in_block = (
        np.take_along_axis(hits, last, axis=1)
        - np.take_along_axis(hits, first, axis=1)
        + np.take_along_axis(rel, first, axis=1)
    )
    mixed = (relevant_in_block > 0) & (relevant_in_block < last - first + 1)
    return mixed, True
