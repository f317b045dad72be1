"""Label relevance: one label per row (integer codes) or several (packed indicator bits).

A reference is relevant to a query when it has the query's label; with several labels per row
(a 2-D 0/1 indicator array of shape (n, n_labels), scikit-learn's multilabel format, as the
NUS-WIDE and MS-COCO hashing protocols use) when the two share at least one label.  Single
labels are integer codes (1-D); label sets are packed into 64-bit words, one row of ``words``
uint64 per item (2-D), so "shares a label" is a bitwise AND.  Every place that decides
relevance calls :func:`match_pairs` or :func:`match_matrix`, which take either form.
"""

from __future__ import annotations

import numpy as np

__all__ = ["is_label_sets", "match_matrix", "match_pairs", "pack_label_sets"]


def is_label_sets(codes: np.ndarray) -> bool:
    """Whether ``codes`` holds packed label sets (2-D) rather than single label codes (1-D)."""
    return np.ndim(codes) == 2


def pack_label_sets(indicator: np.ndarray) -> np.ndarray:
    """Pack a 0/1 (or bool) indicator array of shape (n, n_labels) into uint64 words, label j
    at bit ``j % 64`` of word ``j // 64``.

    >>> pack_label_sets(np.array([[1, 0, 1], [0, 1, 0]])).tolist()
    [[5], [2]]
    """
    ind = np.asarray(indicator).astype(bool)
    n, n_labels = ind.shape
    words = max(1, -(-n_labels // 64))
    padded = np.zeros((n, words * 64), dtype=bool)
    padded[:, :n_labels] = ind
    bits = np.packbits(padded.reshape(n, words, 8, 8)[:, :, :, ::-1], axis=-1)
    return np.ascontiguousarray(bits.reshape(n, words, 8)).view("<u8").reshape(n, words)


def match_pairs(query: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Relevance of aligned (query, reference) pairs given their codes (first axes aligned).

    >>> match_pairs(np.array([1, 2]), np.array([1, 3])).tolist()
    [True, False]
    >>> match_pairs(np.array([[5], [2]], np.uint64), np.array([[4], [1]], np.uint64)).tolist()
    [True, False]
    """
    if not is_label_sets(query):
        return query == reference
    out = (query[:, 0] & reference[:, 0]) != 0
    for w in range(1, query.shape[1]):
        out |= (query[:, w] & reference[:, w]) != 0
    return out


def match_matrix(query: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Relevance of every (query, reference) pair: a bool matrix of shape (n_query, n_ref).

    >>> match_matrix(np.array([0, 1]), np.array([1, 1, 0])).astype(int).tolist()
    [[0, 0, 1], [1, 1, 0]]
    """
    if not is_label_sets(query):
        return query[:, None] == reference[None, :]
    out = (query[:, 0, None] & reference[None, :, 0]) != 0
    for w in range(1, query.shape[1]):
        out |= (query[:, w, None] & reference[None, :, w]) != 0
    return out
