"""A plain brute-force oracle for the retrieval metrics, written independently of the package.

Full float64 distance matrix, one stable sort per query by (distance, reference index), then
each metric straight from its definition (SPEC §2.1-§2.2).  Slow and obvious on purpose.
"""

from __future__ import annotations

import math

import numpy as np


def distances(q: np.ndarray, r: np.ndarray, distance: str) -> np.ndarray:
    q = np.asarray(q, dtype=np.float64)
    r = np.asarray(r, dtype=np.float64)
    if distance == "euclidean":
        return np.sqrt(((q[:, None, :] - r[None, :, :]) ** 2).sum(-1))
    if distance == "cosine":
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        r = r / np.linalg.norm(r, axis=1, keepdims=True)
    return -(q @ r.T)  # similarity -> smaller is nearer


def ranked_relevance(q, ql, r, rl, *, distance="euclidean", self_exclude=False, qg=None, rg=None):
    """Per query: list of 0/1 relevance in ranking order (excluded references removed), and R."""
    d = distances(q, r, distance)
    out = []
    for i in range(len(q)):
        allowed = []
        for j in range(len(r)):
            if self_exclude and j == i:
                continue
            if qg is not None and rg[j] == qg[i]:
                continue
            allowed.append(j)
        order = sorted(allowed, key=lambda j: (d[i, j], j))
        rel = [1 if rl[j] == ql[i] else 0 for j in order]
        out.append((rel, sum(rel)))
    return out


def metric_value(name: str, rel: list[int], R: int, k):
    """One query's value of ``name`` with PML semantics for an int k (None = exact)."""
    if R == 0:
        return math.nan
    n = len(rel)
    cap = n if k is None else min(k, n)
    if name == "precision_at_1":
        return float(rel[0])
    if name == "r_precision":
        w = R if k is None else min(R, k)
        return sum(rel[:w]) / w
    if name in ("map_at_r", "map"):
        if name == "map_at_r":
            w = R if k is None else min(R, k)
        else:
            w = cap
        total, hits = 0.0, 0
        for i in range(w):
            if rel[i]:
                hits += 1
                total += hits / (i + 1)
        return total / R
    if name == "mrr":
        for i in range(cap):
            if rel[i]:
                return 1.0 / (i + 1)
        return 0.0
    if name.startswith("recall_at_"):
        j = int(name.rsplit("_", 1)[1])
        return float(any(rel[: min(j, n)]))
    if name.startswith("precision_at_"):
        j = int(name.rsplit("_", 1)[1])
        return sum(rel[: min(j, n)]) / j
    raise KeyError(name)


def oracle(
    q,
    ql,
    r=None,
    rl=None,
    *,
    metrics,
    k=None,
    distance="euclidean",
    average="micro",
    ref_includes_query=False,
    qg=None,
    rg=None,
):
    """Summary dict and per-query arrays, like ``embedeval.evaluate`` promises."""
    ql = list(ql)
    self_exclude = r is None or ref_includes_query
    if r is None:
        r, rl, rg = q, ql, qg
    rl = list(rl)
    ranked = ranked_relevance(
        q, ql, r, rl, distance=distance, self_exclude=self_exclude, qg=qg, rg=rg
    )
    if k == "max_bin_count":
        k = max(R for _, R in ranked)
    per_query = {m: np.array([metric_value(m, rel, R, k) for rel, R in ranked]) for m in metrics}
    summary = {}
    for m, v in per_query.items():
        ok = ~np.isnan(v)
        if not ok.any():
            summary[m] = math.nan
        elif average == "micro":
            summary[m] = float(np.mean(v[ok]))
        else:
            classes = {}
            for value, label in zip(v[ok], np.asarray(ql, dtype=object)[ok], strict=True):
                classes.setdefault(label, []).append(value)
            summary[m] = float(np.mean([np.mean(vals) for vals in classes.values()]))
    return summary, per_query
