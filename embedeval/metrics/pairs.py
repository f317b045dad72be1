"""Distances of sampled same-class and different-class pairs: how separated the classes are."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..utils.errors import InputError
from ..utils.validation import (
    as_any_labels,
    as_embeddings,
    check_choice,
    check_int,
    factorize,
    zero_rows,
)

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
    1 - cosine similarity, which a zero vector does not have (an error, as on every cosine
    path); ``distance="inner_product"`` gives minus the inner product, the key an
    inner-product ranking sorts by (lower: closer).  With several labels per item (a 2-D 0/1
    indicator array) a positive pair shares a label (drawn from a random (item, label)
    membership and another member of that label) and a negative pair shares none.

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
    y = as_any_labels(labels, "labels", length=x.shape[0], length_of="embeddings")
    distance = check_choice(distance, "distance", ("euclidean", "cosine", "inner_product"))
    if distance == "cosine" and (zero := zero_rows(x)).size:
        raise InputError(
            f"distance='cosine' needs non-zero vectors; {zero.size} row(s) of embeddings are "
            f"all zero (first at row {int(zero[0])}). Drop them or use distance='euclidean'."
        )
    max_pairs = check_int(max_pairs, "max_pairs")
    rng = np.random.default_rng(seed)
    if y.ndim == 2:  # one membership per (item, label) it has
        items, codes = np.nonzero(y)
    else:
        items, ((codes,), _) = np.arange(x.shape[0]), factorize(y)
    sizes = np.bincount(codes, minlength=1)
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
        pos = _pair_distances(x, items[i], items[j], distance)
    i = rng.integers(0, x.shape[0], 4 * max_pairs)
    j = rng.integers(0, x.shape[0], 4 * max_pairs)
    shared = _share_a_label(y, i, j) if y.ndim == 2 else codes[i] == codes[j]
    keep = np.flatnonzero(~shared & (i != j))[:max_pairs]  # an unlabelled item shares none
    neg = _pair_distances(x, i[keep], j[keep], distance)
    return pos, neg


def _share_a_label(indicator: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Whether items ``i`` and ``j`` of a 2-D indicator array share a label, pair by pair, a
    block of pairs at a time (bounded memory however many labels)."""
    out = np.empty(i.size, dtype=bool)
    step = max(1, (1 << 24) // max(indicator.shape[1], 1))
    for s in range(0, i.size, step):
        both = indicator[i[s : s + step]] & indicator[j[s : s + step]]
        out[s : s + step] = both.any(axis=1)
    return out


def _pair_distances(x: np.ndarray, i: np.ndarray, j: np.ndarray, distance: str) -> np.ndarray:
    out = np.empty(i.size)
    step = max(1, (1 << 22) // max(x.shape[1], 1))
    for s in range(0, i.size, step):
        a = np.asarray(x[i[s : s + step]], dtype=np.float64)
        b = np.asarray(x[j[s : s + step]], dtype=np.float64)
        if distance == "euclidean":
            out[s : s + step] = np.linalg.norm(a - b, axis=1)
        elif distance == "inner_product":
            out[s : s + step] = -np.einsum("ij,ij->i", a, b) + 0.0  # no -0.0
        else:
            a /= np.linalg.norm(a, axis=1, keepdims=True)
            b /= np.linalg.norm(b, axis=1, keepdims=True)
            out[s : s + step] = 1.0 - np.einsum("ij,ij->i", a, b)
    return out
