"""Independent brute-force oracle for the retrieval metrics of ``embedeval.evaluate``.

Written without the package's engine: per query, full float64 distances, a full stable sort by
(distance, reference index), excluded references removed (self by identity, the first n_query
reference rows when ``ref_includes_query``, same-group references), then every metric straight
from its definition. Slow and obvious on purpose: a Python loop per query. Its own checks are
hand-computed fractions in tests/test_oracle.py.
"""

from __future__ import annotations

import math

import numpy as np


def pairwise(q, r, distance):
    """float64 'smaller is nearer' scores: L2 distance, or minus cosine / inner product."""
    q = np.asarray(q, dtype=np.float64)
    r = np.asarray(r, dtype=np.float64)
    if distance == "euclidean":
        out = np.empty((len(q), len(r)))
        for i in range(len(q)):
            out[i] = np.sqrt(((r - q[i]) ** 2).sum(axis=1))
        return out
    if distance == "cosine":
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        r = r / np.linalg.norm(r, axis=1, keepdims=True)
    elif distance != "inner_product":
        raise ValueError(distance)
    # Elementwise products summed per pair (not a matrix product, whose rounding can depend on
    # a row's position): identical reference rows get identical scores.
    out = np.empty((len(q), len(r)))
    for i in range(len(q)):
        out[i] = -(r * q[i]).sum(axis=1)
    return out


def squared_distances(q, r):
    """float64 squared distances, each added up column by column."""
    return np.array([fixed_order_keys(row, np.asarray(r), "euclidean") for row in np.asarray(q)])


def rankings(
    q, ql, r=None, rl=None, *, distance="euclidean", ref_includes_query=False, qg=None, rg=None
):
    """List of (relevance list in rank order, sorted distances list) per query (squared
    distances for Euclidean)."""
    loo = r is None
    if loo:
        r, rl, rg = q, ql, qg
    # Euclidean: ranked by the squared distance itself (the square root can round two
    # distinct squared distances to one value, a tie the float64 keys do not have)
    d = pairwise(q, r, distance) if distance != "euclidean" else squared_distances(q, r)
    # Python objects: integers of any size compare exactly (never through float64).
    ql, rl = np.asarray(ql, dtype=object), np.asarray(rl, dtype=object)
    if qg is not None:
        qg, rg = np.asarray(qg, dtype=object), np.asarray(rg, dtype=object)
    out = []
    for i in range(len(q)):
        keep = np.ones(len(r), dtype=bool)
        if loo or ref_includes_query:
            keep[i] = False
        if qg is not None:
            keep &= rg != qg[i]
        j = np.flatnonzero(keep)
        j = j[np.lexsort((j, d[i, j]))]  # by distance, then by reference index
        out.append(([1 if lab == ql[i] else 0 for lab in rl[j]], d[i, j].tolist()))
    return out


def metric_value(name, rel, k):
    """Per-query value of one metric (NaN for a lone query). ``k`` is None or an int."""
    R = sum(rel)
    if R == 0:
        return math.nan
    depth = len(rel) if k is None else min(k, len(rel))
    if name == "precision_at_1":
        return float(rel[0])
    if name == "r_precision":
        w = R if k is None else min(R, k)
        return sum(rel[:w]) / w
    if name in ("map_at_r", "map"):
        w = R if name == "map_at_r" else len(rel)
        w = w if k is None else min(w, k)
        hits, s = 0, 0.0
        for i in range(w):
            if rel[i]:
                hits += 1
                s += hits / (i + 1)
        return s / R
    if name == "mrr":
        for i in range(depth):
            if rel[i]:
                return 1.0 / (i + 1)
        return 0.0
    if name.startswith("recall_at_"):
        j = int(name[len("recall_at_") :])
        return 1.0 if any(rel[:j]) else 0.0
    if name.startswith("map_at_"):  # hashing mAP@k: divided by the hits in the top k
        j = int(name[len("map_at_") :])
        hits, s = 0, 0.0
        for i in range(min(j, len(rel))):
            if rel[i]:
                hits += 1
                s += hits / (i + 1)
        return s / hits if hits else 0.0
    if name.startswith("precision_at_"):
        j = int(name[len("precision_at_") :])
        return sum(rel[:j]) / j
    raise ValueError(name)


def evaluate(
    q,
    ql,
    r=None,
    rl=None,
    *,
    metrics,
    k=None,
    distance="euclidean",
    ref_includes_query=False,
    average="micro",
    qg=None,
    rg=None,
):
    """Return (metrics dict, per_query dict of lists, per_class dict) from the definitions."""
    ranks = rankings(
        q, ql, r, rl, distance=distance, ref_includes_query=ref_includes_query, qg=qg, rg=rg
    )
    if k == "max_bin_count":
        k = max(sum(rel) for rel, _ in ranks)
    per_query = {m: [metric_value(m, rel, k) for rel, _ in ranks] for m in metrics}
    out, per_class = {}, {}
    for m, vals in per_query.items():
        live = [(ql[i], v) for i, v in enumerate(vals) if not math.isnan(v)]
        classes = {}
        for lab, v in live:
            classes.setdefault(lab, []).append(v)
        per_class[m] = {lab: sum(v) / len(v) for lab, v in classes.items()}
        if not live:
            out[m] = math.nan
        elif average == "micro":
            out[m] = sum(v for _, v in live) / len(live)
        else:
            out[m] = sum(per_class[m].values()) / len(per_class[m])
    return out, per_query, per_class


def summary(
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
    """Return (summary dict, per-query float64 arrays), the two things ``evaluate`` reports."""
    ranks = rankings(
        q, ql, r, rl, distance=distance, ref_includes_query=ref_includes_query, qg=qg, rg=rg
    )
    if k == "max_bin_count":
        k = max(sum(rel) for rel, _ in ranks)
    per_query = {m: np.array([metric_value(m, rel, k) for rel, _ in ranks]) for m in metrics}
    labels = np.asarray(list(ql), dtype=object)
    out = {}
    for m, v in per_query.items():
        ok = ~np.isnan(v)
        if not ok.any():
            out[m] = math.nan
        elif average == "micro":
            out[m] = float(np.mean(v[ok]))
        else:
            classes = {}
            for value, label in zip(v[ok], labels[ok], strict=True):
                classes.setdefault(label, []).append(value)
            out[m] = float(np.mean([np.mean(vals) for vals in classes.values()]))
    return out, per_query


def tie_straddles(rel, dist, cut):
    """True when equal-distance references of mixed relevance straddle rank ``cut``."""
    if cut <= 0 or cut >= len(rel):
        return False
    v = dist[cut - 1]
    block = [rel[i] for i in range(len(rel)) if dist[i] == v]
    inside = [i for i in range(len(rel)) if dist[i] == v]
    return inside[0] < cut <= inside[-1] and 0 < sum(block) < len(block)


def fixed_order_keys(q: np.ndarray, corpus: np.ndarray, distance: str) -> np.ndarray:
    """float64 keys of one query against every document (smaller is better), one column at a
    time in column order: squared distance, -q.x, or -sign(s) s^2 / ||x||^2 (cosine; 0 for a
    zero row)."""
    q64, x64 = q.astype(np.float64), corpus.astype(np.float64)
    acc = np.zeros(x64.shape[0])
    if distance == "euclidean":
        for j in range(x64.shape[1]):
            t = q64[j] - x64[:, j]
            acc += t * t
        return acc
    for j in range(x64.shape[1]):
        acc += q64[j] * x64[:, j]
    if distance == "inner_product":
        return -acc
    x_sq = np.zeros_like(acc)
    for j in range(x64.shape[1]):
        x_sq += x64[:, j] * x64[:, j]
    live = x_sq > 0  # a zero row has cosine 0 with every query
    return np.where(live, -np.sign(acc) * (acc * acc) / np.where(live, x_sq, 1), 0.0)


#: trec_eval's measure for each of our IR metric families (``name@k`` takes ``measure.k``).
_TREC_FAMILIES = {
    "ndcg": "ndcg_cut",
    "map": "map_cut",
    "recall": "recall",
    "precision": "P",
    "hit_rate": "success",
}
_TREC_WHOLE = {"ndcg": "ndcg", "map": "map", "mrr": "recip_rank", "r_precision": "Rprec"}


def pytrec_measure(name: str) -> tuple[str, str]:
    """pytrec_eval's ``(measure to ask for, key in its output)`` for our metric ``name``:
    ``ndcg@5`` -> ``("ndcg_cut.5", "ndcg_cut_5")``, ``mrr`` -> ``("recip_rank", ...)``."""
    if "@" not in name:
        return _TREC_WHOLE[name], _TREC_WHOLE[name]
    family, k = name.split("@")
    return f"{_TREC_FAMILIES[family]}.{k}", f"{_TREC_FAMILIES[family]}_{k}"
