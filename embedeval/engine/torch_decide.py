"""The float64 decision of :mod:`embedeval.engine.decide`, on the torch device that filtered.

A block's candidates arrive sorted by their filter keys (float32, TF32 or bfloat16 products).
Every candidate takes a float64 product key on the device (within ``beta = 16 gamma_{d+8}``
in double precision times the pair's magnitude of the fixed-order key
:func:`embedeval.engine.decide.exact_keys`, whatever order the device sums in), and each row is
sorted by it.  Neighbours closer than ``2 beta`` (exact ties, identical rows, cosine multiples,
near-ties below float64 resolution) are re-scored with the fixed-order keys -- on the device
(:func:`fixed_order_keys`, the same float64 operations as the host's, so the same bits), for
cosine on the host, whose key groups the positive multiples of a row -- and sorted by (key,
reference index).  Any two other neighbours are more than ``2 beta`` apart,
so their product keys are in the order of their fixed-order keys: the result is the order of
:func:`embedeval.engine.decide.decide` -- float64 keys, equal keys by reference index -- with
dense tie codes, what the metric kernels read.

This is :func:`embedeval.engine.decide._decide_dense` with the products on the device: a GPU
re-scores every candidate in float64 faster than it moves the block to the host, and the
decision no longer depends on how wide the filter's band was.  ``torch`` is passed in by the
caller, so importing this module never imports it.
"""

from __future__ import annotations

from typing import Any

from .decide import _U64, _gather_keys, gamma

__all__ = ["decide_on_device", "device_product_keys", "fixed_order_keys"]

#: float64 elements per gathered operand of a pair chunk (128 MiB).
_PAIR_CELLS = 1 << 24
#: Pairs covering at least 1 / _DENSE_RATIO of their rows x columns take one dense product.
_DENSE_RATIO = 16


def device_product_keys(
    torch: Any, xq: Any, xb: Any, start: int, row: Any, index: Any, distance: str
) -> tuple[Any, Any]:
    """float64 keys (on the scale of :func:`embedeval.engine.decide.exact_keys`) and
    magnitudes of the pairs ``(xq[start + row[i]], xb[index[i]])`` from float64 products on the
    device: dense tiles of the block's queries against the columns the pairs touch when they
    cover much of them (and one float64 copy of those columns stays under 128 MiB), else the
    gathered pairs in chunks.

    Magnitudes are what a key's rounding scales with: ``(||q|| + ||x||)^2`` (Euclidean),
    ``||q|| ||x||`` (inner product), ``||q||^2`` (cosine, ``-sign(s) s^2 / ||x||^2``).
    """
    n, b = int(index.numel()), int(row.max()) + 1 if index.numel() else 0
    dim = int(xq.shape[1])
    q = xq[start : start + b].double()
    q_sq = (q * q).sum(dim=1)
    dots = torch.empty(n, dtype=torch.float64, device=index.device)
    cols, inverse = torch.unique(index, return_inverse=True)
    n_cols = int(cols.numel())
    if n * _DENSE_RATIO >= b * n_cols and n_cols * dim <= _PAIR_CELLS:
        x = xb[cols].double()
        x_sq = (x * x).sum(dim=1)[inverse]
        step = max(1, _PAIR_CELLS // max(n_cols, 1))
        lims = torch.searchsorted(row, torch.arange(0, b + step, step, device=row.device))
        for a, r0 in enumerate(range(0, b, step)):
            lo, hi = int(lims[a]), int(lims[a + 1])
            tile = q[r0 : r0 + step] @ x.T
            dots[lo:hi] = tile[row[lo:hi] - r0, inverse[lo:hi]]
    else:
        x_sq = torch.empty(n, dtype=torch.float64, device=index.device)
        step = max(1, _PAIR_CELLS // dim)
        for a in range(0, n, step):
            x = xb[index[a : a + step]].double()
            dots[a : a + step] = (q[row[a : a + step]] * x).sum(dim=1)
            x_sq[a : a + step] = (x * x).sum(dim=1)
    q_sq = q_sq[row]
    if distance == "euclidean":
        return q_sq + x_sq - 2.0 * dots, (q_sq.sqrt() + x_sq.sqrt()) ** 2
    if distance == "inner_product":
        return -dots, (q_sq * x_sq).sqrt()
    keys = -torch.sign(dots) * (dots * dots) / x_sq
    return torch.where(x_sq > 0, keys, torch.zeros_like(keys)), q_sq


def decide_on_device(
    torch: Any,
    lims: Any,
    index: Any,
    start: int,
    rows: tuple[Any, Any],
    task_rows: tuple[Any, Any],
    distance: str,
) -> tuple[Any, Any]:
    """``(index, bits)`` of a block's candidates (CSR ``lims`` / ``index`` on the device, rows
    ``start ...``) in float64 order, equal float64 keys by reference index, ``bits`` the dense
    tie codes (equal exactly where the keys tie).  ``rows``: the task's query and reference rows
    as float32 tensors on the device; ``task_rows``: the same rows as the task holds them
    (cosine's fixed-order keys of near-equal pairs are computed from these on the host).

    >>> import torch
    >>> x = torch.tensor([[0.0, 0.0], [3.0, 4.0], [1.0, 1.0], [3.0, 4.0]])
    >>> lims, index = torch.tensor([0, 3]), torch.tensor([1, 3, 2])
    >>> idx, bits = decide_on_device(torch, lims, index, 0, (x, x), (x.numpy(),) * 2, "euclidean")
    >>> idx.tolist(), bits.tolist()
    ([2, 1, 3], [0, 1, 1])
    """
    n = int(index.numel())
    dev = index.device
    if n < 2:
        return index, torch.zeros(n, dtype=torch.int64, device=dev)
    counts = lims[1:] - lims[:-1]
    b = int(counts.numel())
    row = torch.repeat_interleave(torch.arange(b, device=dev), counts)
    g, mag = device_product_keys(torch, rows[0], rows[1], start, row, index, distance)
    order = torch.sort(g, stable=True).indices
    order = order[torch.sort(row[order], stable=True).indices]
    index, g, mag = index[order], g[order], mag[order]
    beta = 16.0 * gamma(int(rows[0].shape[1]) + 8, _U64) * (1.0 + 2.0**-20)
    row_max = torch.zeros(b, dtype=torch.float64, device=dev).scatter_reduce_(0, row, mag, "amax")
    same = row[1:] == row[:-1]
    close = same & (g[1:] - g[:-1] <= 2.0 * beta * row_max[row[1:]])
    if bool(close.any()):
        index, g = _fixed_order_runs(torch, close, index, g, start + row, rows, task_rows, distance)
    distinct = torch.ones(n, dtype=torch.bool, device=dev)
    distinct[1:] = ~same | (g[1:] != g[:-1])
    return index, torch.cumsum(distinct, 0) - 1


def _fixed_order_runs(
    torch: Any,
    close: Any,
    index: Any,
    g: Any,
    query: Any,
    rows: tuple[Any, Any],
    task_rows: tuple[Any, Any],
    distance: str,
) -> tuple[Any, Any]:
    """Runs of ``close`` neighbours re-scored with the fixed-order keys (on the device; for
    cosine on the host, which keys the positive multiples of a row alike) and sorted by
    (key, reference index)."""
    n = int(index.numel())
    flag = torch.zeros(n, dtype=torch.bool, device=index.device)
    flag[1:] |= close
    flag[:-1] |= close
    f = torch.nonzero(flag).flatten()
    opens = torch.ones(int(f.numel()), dtype=torch.bool, device=index.device)
    opens[1:] = ~close[f[1:] - 1]
    if distance == "cosine":  # multiples share a key: the host's grouping (exact_keys)
        qi, ri = query[f].cpu().numpy(), index[f].cpu().numpy()
        exact = torch.as_tensor(_gather_keys(task_rows[0], task_rows[1], qi, ri, distance))
        exact = exact.to(index.device)
    else:
        exact = fixed_order_keys(torch, rows[0], rows[1], query[f], index[f], distance)
    run = torch.cumsum(opens, 0)
    ri = index[f]
    # (run, key, reference index) ascending: three stable sorts, the last key first
    order = torch.sort(ri, stable=True).indices
    order = order[torch.sort(exact[order], stable=True).indices]
    order = order[torch.sort(run[order], stable=True).indices]
    index, g = index.clone(), g.clone()
    index[f] = ri[order]
    g[f] = exact[order]
    return index, g


def fixed_order_keys(
    torch: Any, xq: Any, xb: Any, qi: Any, ri: Any, distance: str, chunk: int | None = None
) -> Any:
    """:func:`embedeval.engine.decide.exact_keys` of the pairs ``(xq[qi[i]], xb[ri[i]])`` on
    the device, bit for bit (Euclidean and inner product): the same float64 operations one
    column at a time, each rounded once (no fused multiply-add), in pieces of ``chunk`` pairs
    (default: 128 MiB of gathered float64 rows per side).

    >>> import torch
    >>> x = torch.tensor([[1.0, 2.0, 0.0], [1.0, 1.0, 0.0]])
    >>> i = torch.tensor([0])
    >>> fixed_order_keys(torch, x, x, i, torch.tensor([1]), "euclidean").tolist()
    [1.0]
    """
    out = torch.empty(int(qi.numel()), dtype=torch.float64, device=qi.device)
    chunk = chunk or max(1, _PAIR_CELLS // int(xq.shape[1]))
    for a in range(0, int(qi.numel()), chunk):
        # columns contiguous: each step of the fixed order reads one row of these
        q = xq[qi[a : a + chunk]].double().T.contiguous()
        x = xb[ri[a : a + chunk]].double().T.contiguous()
        acc = torch.zeros(q.shape[1], dtype=torch.float64, device=q.device)
        for j in range(q.shape[0]):
            if distance == "euclidean":
                t = q[j] - x[j]
                acc += t * t
            else:
                acc += q[j] * x[j]
        out[a : a + chunk] = acc if distance == "euclidean" else -acc
    return out
