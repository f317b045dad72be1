"""Distances of sampled same-class and different-class pairs: how separated the classes are."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..utils.validation import as_embeddings, as_labels, check_choice, check_int, factorize

__all__ = ["positive_negative_distances"]


def positive_negative_distances(
    embeddings: Any,
    labels: Any,
    *,
    max_pairs: int = 100_000,
    distance: str = "euclidean",
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Distances of random same-class (positive) and different-class (negative) pairs.

    Positives are drawn by class — a random item of a class with two or more members, and a
    random other member of its class — so even 10,000 small classes give ``max_pairs``
    positives (uniform random pairs would almost never share a class).  Negatives are uniform
    random pairs with different labels.  Up to ``max_pairs`` of each kind (i != j); memory is
    O(n + block), distances are computed in float64 blocks.  Cosine "distance" is
    1 - cosine similarity.

    Examples
    --------
    >>> pos, neg = positive_negative_distances([[0.0], [1.0], [5.0]], [0, 0, 1], max_pairs=50)
    >>> sorted(set(pos.tolist())), sorted(set(neg.tolist()))
    ([1.0], [4.0, 5.0])
    """
    # float32 arrays (a memory-mapped file) stay float32, no float64 copy of the whole set;
    # pairs are computed in float64 either way.
    single = isinstance(embeddings, np.ndarray) and embeddings.dtype == np.float32
    x = as_embeddings(embeddings, "embeddings", dtype=np.float32 if single else np.float64)
    y = as_labels(labels, "labels", length=x.shape[0], length_of="embeddings")
    distance = check_choice(distance, "distance", ("euclidean", "cosine"))
    max_pairs = check_int(max_pairs, "max_pairs")
    rng = np.random.default_rng(seed)
    (codes,), _ = factorize(y)
    sizes = np.bincount(codes)
    order = np.argsort(codes, kind="stable")
    starts = np.cumsum(sizes) - sizes
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size) - starts[codes[order]]
    eligible = np.flatnonzero(sizes[codes] >= 2)
    pos = np.empty(0)
    if eligible.size:
        i = rng.choice(eligible, size=max_pairs)
        c = codes[i]
        j = order[starts[c] + (rank[i] + rng.integers(1, sizes[c])) % sizes[c]]
        pos = _pair_distances(x, i, j, distance)
    i = rng.integers(0, x.shape[0], 4 * max_pairs)
    j = rng.integers(0, x.shape[0], 4 * max_pairs)
    keep = np.flatnonzero(codes[i] != codes[j])[:max_pairs]
    neg = _pair_distances(x, i[keep], j[keep], distance)
    return pos, neg


def _pair_distances(x: np.ndarray, i: np.ndarray, j: np.ndarray, distance: str) -> np.ndarray:
    out = np.empty(i.size)
    step = max(1, (1 << 22) // max(x.shape[1], 1))
    for s in range(0, i.size, step):
        a = np.asarray(x[i[s : s + step]], dtype=np.float64)
        b = np.asarray(x[j[s : s + step]], dtype=np.float64)
        if distance == "euclidean":
            out[s : s + step] = np.linalg.norm(a - b, axis=1)
        else:
            a /= np.linalg.norm(a, axis=1, keepdims=True)
            b /= np.linalg.norm(b, axis=1, keepdims=True)
            out[s : s + step] = 1.0 - np.einsum("ij,ij->i", a, b)
    return out
