"""Metric kernels of the PyTorch backend: :mod:`embedeval._kernels` ported to torch tensors.

Given a block's sorted candidates on the device (CSR ``lims`` / ``index`` / ``bits``, the layout
of :class:`embedeval._candidates.Candidates`), :class:`DeviceKernels` computes the same per-query
values and tie flags as :func:`embedeval._kernels.chunk_metrics`, bit for bit: float64 sums are
added in numpy's order (:func:`numpy_order_sums`).  ``torch`` is passed in by the caller, so
importing this module never imports it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["DeviceKernels", "DeviceTies", "from_sortable_bits", "numpy_order_sums"]


def from_sortable_bits(torch: Any, bits: Any) -> Any:
    """The float32 keys of int64 sortable key bits (the inverse of the search's packing)."""
    raw = torch.where(bits >= 0x80000000, bits & 0x7FFFFFFF, 0xFFFFFFFF - bits)
    raw = torch.where(raw >= 0x80000000, raw - (1 << 32), raw)  # back to a signed int32 value
    return raw.to(torch.int32).view(torch.float32)


# --------------------------------------------------------------------------------- kernels


class DeviceKernels:
    """A torch port of :func:`embedeval._kernels.chunk_metrics` (same windows, same tie rules).

    The float64 sums of MAP@R / MAP add in numpy's order (:func:`numpy_order_sums`), so given
    the same ranking every value and tie flag equals the numpy kernels' bit for bit.
    """

    NAMES = frozenset({"r_precision", "map_at_r", "map", "mrr", "minp"})

    @classmethod
    def supports(cls, m: Any) -> bool:
        return m.function is None and (m.depth in ("one", "fixed") or m.name in cls.NAMES)

    def __init__(self, torch: Any, task: Any, device: Any) -> None:
        self.torch = torch
        self.task = task
        self.device = device
        self.q_codes = torch.as_tensor(np.asarray(task.query_codes, dtype=np.int64), device=device)
        self.r_codes = torch.as_tensor(
            np.asarray(task.reference_codes, dtype=np.int64), device=device
        )
        self.relevant = torch.as_tensor(task.relevant, device=device)
        self.n_valid = torch.as_tensor(task.n_valid, device=device)

    def score(self, block: Any) -> tuple[dict, dict]:
        torch, task = self.torch, self.task
        lims = block.lims
        b = lims.numel() - 1
        rows = slice(block.start, block.start + b)
        counts = lims[1:] - lims[:-1]
        relevant, n_valid = self.relevant[rows], self.n_valid[rows]
        arange = torch.arange(b, device=self.device)
        rel = self.r_codes[block.index] == torch.repeat_interleave(self.q_codes[rows], counts)
        hit = torch.nonzero(rel).flatten()
        row_start = torch.searchsorted(hit, lims[:-1])
        n_hits = torch.diff(torch.cat([row_start, row_start.new_tensor([hit.numel()])]))
        hit_row = torch.repeat_interleave(arange, n_hits)
        hit_pos = hit - lims[hit_row]
        found = torch.arange(1, hit.numel() + 1, device=self.device) - row_start[hit_row]
        lone = relevant == 0
        safe_r = relevant.clamp(min=1).double()
        k = task.k
        depth_cap = n_valid if k is None else n_valid.clamp(max=k)
        ties = DeviceTies(torch, block, rel, counts)
        weights = found.double() / (hit_pos + 1).double()

        def hits_within(window: Any) -> Any:
            return torch.searchsorted(hit, lims[:-1] + torch.minimum(window, counts)) - row_start

        def weighted_within(window: Any) -> Any:
            n_in = hits_within(window)
            inside = (found - 1) < n_in[hit_row]
            return numpy_order_sums(torch, weights[inside], n_in)

        def last_hit_window() -> Any:
            window = torch.zeros(b, dtype=torch.int64, device=self.device)
            has = n_hits > 0
            window[has] = hit_pos[row_start[has] + n_hits[has] - 1] + 1
            return window

        out_values, out_ties = {}, {}
        for m in task.metrics:
            if m.depth in ("one", "fixed"):
                window = n_valid.clamp(max=m.cutoff)
                n_found = hits_within(window)
                if m.name.startswith("recall"):
                    value = (n_found > 0).double()
                    tie = ties.hit_rate_changes(window, hit, row_start)
                else:
                    value = n_found.double() / m.cutoff
                    tie = ties.straddle(window)
            elif m.name in ("r_precision", "map_at_r"):
                window = relevant if k is None else relevant.clamp(max=k)
                if m.name == "r_precision":
                    value = hits_within(window).double() / window.clamp(min=1).double()
                    tie = ties.straddle(window)
                else:
                    value = weighted_within(window) / safe_r
                    tie = ties.within(window)
            elif m.name == "map":
                window = last_hit_window() if k is None else depth_cap
                value = weighted_within(window) / safe_r
                tie = ties.within(window)
            elif m.name == "minp":
                # INP = R_q / rank of the last relevant reference; 0 when k hides it.
                last = last_hit_window()
                complete = (n_hits > 0) & (n_hits >= relevant) & (last <= depth_cap)
                value = relevant.double() / last.clamp(min=1).double()
                value = torch.where(complete, value, torch.zeros_like(value))
                tie = complete & (ties.straddle(last) | ties.straddle(last - 1))
            elif m.name == "mrr":
                first = torch.full((b,), 2**62, dtype=torch.int64, device=self.device)
                has = n_hits > 0
                first[has] = hit_pos[row_start[has]]
                in_reach = first < depth_cap
                reach = torch.minimum(first, depth_cap).double() + 1.0
                value = torch.where(in_reach, 1.0 / reach, torch.zeros_like(reach))
                tie = ties.within(torch.where(in_reach, first + 1, depth_cap))
            else:  # pragma: no cover - the registry only produces the names above
                raise AssertionError(m.name)
            value = torch.where(lone, torch.full_like(value, math.nan), value)
            out_values[m.name] = value.cpu().numpy()
            out_ties[m.name] = (tie & ~lone).cpu().numpy()
        return out_values, out_ties


class DeviceTies:
    """A torch port of :class:`embedeval._kernels._TieFinder` (see there for the rules)."""

    def __init__(self, torch: Any, block: Any, rel: Any, counts: Any) -> None:
        self.torch = torch
        self.lims, self.counts = block.lims, counts
        b = counts.numel()
        bits = block.bits
        equal = bits[1:] == bits[:-1]
        boundaries = block.lims[1:-1] - 1
        boundaries = boundaries[(boundaries >= 0) & (boundaries < equal.numel())]
        equal[boundaries] = False
        self.pairs = torch.nonzero(equal).flatten()
        self.any = self.pairs.numel() > 0
        if not self.any:
            return
        new_run = torch.diff(self.pairs) != 1
        one = torch.ones(1, dtype=torch.bool, device=bits.device)
        self.run = torch.cat([torch.zeros(1, dtype=torch.int64, device=bits.device),
                              torch.cumsum(new_run, 0)])  # fmt: skip
        self.run_first = self.pairs[torch.cat([one, new_run])]
        self.run_last = self.pairs[torch.cat([new_run, one])] + 1
        mixed = rel[self.pairs] != rel[self.pairs + 1]
        self.run_mixed = torch.zeros(int(self.run[-1]) + 1, dtype=torch.bool, device=bits.device)
        self.run_mixed[self.run[mixed]] = True
        mixed_pairs = self.pairs[mixed]
        pair_row = torch.searchsorted(block.lims, mixed_pairs, right=True) - 1
        self.first_mixed = torch.full((b,), 2**61, dtype=torch.int64, device=bits.device)
        self.first_mixed.scatter_reduce_(
            0, pair_row, mixed_pairs - block.lims[pair_row], reduce="amin"
        )

    def _false(self) -> Any:
        return self.torch.zeros(self.counts.numel(), dtype=self.torch.bool,
                                device=self.counts.device)  # fmt: skip

    def _cut(self, window: Any) -> tuple[Any, Any]:
        torch = self.torch
        rows = torch.nonzero((window >= 1) & (window < self.counts)).flatten()
        at = self.lims[rows] + window[rows] - 1
        where = torch.searchsorted(self.pairs, at).clamp(max=self.pairs.numel() - 1)
        tied = self.pairs[where] == at
        rows, runs = rows[tied], self.run[where[tied]]
        mixed = self.run_mixed[runs]
        return rows[mixed], runs[mixed]

    def straddle(self, window: Any) -> Any:
        out = self._false()
        if self.any:
            out[self._cut(window)[0]] = True
        return out

    def hit_rate_changes(self, window: Any, hit: Any, row_start: Any) -> Any:
        torch = self.torch
        out = self._false()
        if not self.any:
            return out
        rows, runs = self._cut(window)
        first, last = self.run_first[runs], self.run_last[runs]
        hits_before = torch.searchsorted(hit, first) - row_start[rows]
        in_block = torch.searchsorted(hit, last, right=True) - torch.searchsorted(hit, first)
        non_relevant = last - first + 1 - in_block
        inside = self.lims[rows] + window[rows] - first
        out[rows] = (hits_before == 0) & (non_relevant >= inside)
        return out

    def within(self, window: Any) -> Any:
        if not self.any:
            return self._false()
        return (self.first_mixed + 1 < window) | self.straddle(window)


# ------------------------------------------------------------------------- ordered sums

_PAIRWISE_BLOCK = 128


def numpy_order_sums(torch: Any, data: Any, lengths: Any) -> Any:
    """Per-segment float64 sums of ``data`` (consecutive segments of ``lengths``) rounded
    exactly like numpy's ``np.add.reduceat``: the first item plus numpy's pairwise sum of the
    rest (8 interleaved partial sums per block of up to 128 items, halved recursively above).

    Vectorised over segments; deterministic on every device (no atomic adds).

    >>> import pytest
    >>> torch = pytest.importorskip("torch")
    >>> w = torch.tensor([0.5, 1 / 3, 0.25, 1.0], dtype=torch.float64)
    >>> numpy_order_sums(torch, w, torch.tensor([3, 0, 1])).tolist()
    [1.0833333333333333, 0.0, 1.0]
    """
    starts = torch.cumsum(lengths, 0) - lengths
    has = lengths > 0
    out = torch.zeros(lengths.shape, dtype=torch.float64, device=data.device)
    if bool(has.any()):
        first = data[starts[has]]
        out[has] = first + _pairwise(torch, data, starts[has] + 1, lengths[has] - 1)
    return out


def _pairwise(torch: Any, data: Any, offsets: Any, lengths: Any) -> Any:
    big = lengths > _PAIRWISE_BLOCK
    if not bool(big.any()):
        return _pairwise_leaf(torch, data, offsets, lengths)
    out = torch.empty(lengths.shape, dtype=torch.float64, device=data.device)
    small = ~big
    out[small] = _pairwise_leaf(torch, data, offsets[small], lengths[small])
    length, offset = lengths[big], offsets[big]
    half = length // 2
    half = half - half % 8
    both = _pairwise(
        torch, data, torch.cat([offset, offset + half]), torch.cat([half, length - half])
    )
    n = length.numel()
    out[big] = both[:n] + both[n:]
    return out


def _pairwise_leaf(torch: Any, data: Any, offsets: Any, lengths: Any) -> Any:
    """numpy's pairwise sum of segments of at most 128 items."""
    longest = int(lengths.max()) if lengths.numel() else 0
    width = min(_PAIRWISE_BLOCK, max(8, -(-longest // 8) * 8))  # columns actually used
    cols = torch.arange(width, device=data.device)
    at = (offsets[:, None] + cols).clamp(max=max(data.numel() - 1, 0))
    vals = data[at] if data.numel() else torch.zeros(at.shape, dtype=data.dtype, device=data.device)
    vals = torch.where(cols < lengths[:, None], vals, torch.zeros_like(vals))
    sequential = torch.zeros(lengths.shape, dtype=torch.float64, device=data.device)
    for i in range(8):  # below 8 items: a plain running sum (padding zeros add nothing)
        sequential = sequential + vals[:, i]
    whole = lengths - lengths % 8
    acc = vals[:, :8].clone()
    for i in range(8, width, 8):
        take = (i + 8 <= whole)[:, None]
        acc = acc + torch.where(take, vals[:, i : i + 8], torch.zeros_like(acc))
    res = ((acc[:, 0] + acc[:, 1]) + (acc[:, 2] + acc[:, 3])) + (
        (acc[:, 4] + acc[:, 5]) + (acc[:, 6] + acc[:, 7])
    )
    for t in range(7):  # the items after the last multiple of 8, one by one
        pos = (whole + t).clamp(max=width - 1)
        item = vals.gather(1, pos[:, None])[:, 0]
        res = res + torch.where(t < lengths % 8, item, torch.zeros_like(item))
    return torch.where(lengths < 8, sequential, res)
