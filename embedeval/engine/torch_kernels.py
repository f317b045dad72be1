"""Metric kernels of the PyTorch backend: :mod:`embedeval.engine.kernels` ported to torch tensors.

Given a block's sorted candidates on the device (CSR ``lims`` / ``index`` / ``bits``, the layout
of :class:`embedeval.engine.candidates.Candidates`), :class:`DeviceKernels` computes the same
per-query
values and tie flags as :func:`embedeval.engine.kernels.chunk_metrics`, bit for bit: float64 sums
are
added in numpy's order (:func:`numpy_order_sums`).  ``torch`` is passed in by the caller, so
importing this module never imports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .candidates import sortable_bits

__all__ = [
    "KERNELS",
    "DeviceHits",
    "DeviceKernels",
    "DeviceTies",
    "average_precision",
    "device_example",
    "device_hits",
    "from_sortable_bits",
    "inverse_negative_penalty",
    "map_at_r",
    "numpy_order_sums",
    "precision_at_k",
    "r_precision",
    "recall_at_k",
    "reciprocal_rank",
]


def from_sortable_bits(torch: Any, bits: Any) -> Any:
    """The float32 keys of int64 sortable key bits (the inverse of the search's packing)."""
    raw = torch.where(bits >= 0x80000000, bits & 0x7FFFFFFF, 0xFFFFFFFF - bits)
    raw = torch.where(raw >= 0x80000000, raw - (1 << 32), raw)  # back to a signed int32 value
    return raw.to(torch.int32).view(torch.float32)


# --------------------------------------------------------------------------------- kernels


@dataclass(frozen=True)
class DeviceHits:
    """The torch twin of :class:`embedeval.engine.kernels.RankedHits` (same fields, on the device),
    plus ``hit_row`` (the row of each relevant candidate) and ``torch``."""

    torch: Any
    lims: Any
    counts: Any
    hit: Any
    row_start: Any
    n_hits: Any
    hit_row: Any
    hit_pos: Any
    found: Any
    relevant: Any
    n_valid: Any
    k: int | None
    ties: DeviceTies

    @property
    def depth_cap(self) -> Any:
        return self.n_valid if self.k is None else self.n_valid.clamp(max=self.k)

    def r_window(self) -> Any:
        return self.relevant if self.k is None else self.relevant.clamp(max=self.k)

    def hits_within(self, window: Any) -> Any:
        ends = self.lims[:-1] + self.torch.minimum(window, self.counts)
        return self.torch.searchsorted(self.hit, ends) - self.row_start

    def precision_sums(self, window: Any) -> Any:
        """Per row, the sum of P@i over the relevant ranks i <= ``window``, in numpy's order."""
        weights = self.found.double() / (self.hit_pos + 1).double()
        n_in = self.hits_within(window)
        inside = (self.found - 1) < n_in[self.hit_row]
        return numpy_order_sums(self.torch, weights[inside], n_in)

    def last_hit_rank(self) -> Any:
        last = self.torch.zeros_like(self.counts)
        has = self.n_hits > 0
        last[has] = self.hit_pos[self.row_start[has] + self.n_hits[has] - 1] + 1
        return last


def device_hits(
    torch: Any,
    block: Any,
    query_codes: Any,
    reference_codes: Any,
    relevant: Any,
    n_valid: Any,
    k: int | None,
) -> DeviceHits:
    """The :class:`DeviceHits` of a block on the device (``block``: ``lims`` / ``index`` /
    ``bits`` int64 tensors; the other arrays are int64 tensors on the same device)."""
    lims = block.lims
    counts = lims[1:] - lims[:-1]
    rel = reference_codes[block.index] == torch.repeat_interleave(query_codes, counts)
    hit = torch.nonzero(rel).flatten()
    row_start = torch.searchsorted(hit, lims[:-1])
    n_hits = torch.diff(torch.cat([row_start, row_start.new_tensor([hit.numel()])]))
    hit_row = torch.repeat_interleave(torch.arange(counts.numel(), device=lims.device), n_hits)
    hit_pos = hit - lims[hit_row]
    found = torch.arange(1, hit.numel() + 1, device=lims.device) - row_start[hit_row]
    ties = DeviceTies(torch, block, rel, counts)
    fields = (lims, counts, hit, row_start, n_hits, hit_row, hit_pos, found, relevant, n_valid)
    return DeviceHits(torch, *fields, k, ties)


@dataclass(frozen=True)
class _Block:
    lims: Any
    index: Any
    bits: Any


def device_example(
    torch: Any,
    relevance: list[list[int]],
    keys: list[list[float]] | None = None,
    k: int | None = None,
) -> DeviceHits:
    """:class:`DeviceHits` of hand-written rankings on the CPU, as
    :func:`embedeval.engine.kernels.ranked_example` (R_q = the relevant items listed).

    >>> import pytest
    >>> torch = pytest.importorskip("torch")
    >>> hits = device_example(torch, [[0, 1, 1]], keys=[[0.0, 1.0, 1.0]])
    >>> hits.hit_pos.tolist(), hits.found.tolist(), hits.relevant.tolist()
    ([1, 2], [1, 2], [2])
    """
    counts = torch.tensor([len(row) for row in relevance], dtype=torch.int64)
    lims = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)])
    flat = torch.tensor([v for row in relevance for v in row], dtype=torch.bool)
    if keys is None:
        keys = [list(range(len(row))) for row in relevance]
    key_values = np.array([v for row in keys for v in row], dtype=np.float32)
    bits = torch.from_numpy(sortable_bits(key_values).astype(np.int64))
    block = _Block(lims, torch.arange(flat.numel()), bits)
    relevant = torch.tensor([sum(row) for row in relevance], dtype=torch.int64)
    codes = torch.where(flat, 0, 1)
    return device_hits(torch, block, torch.zeros_like(counts), codes, relevant, counts, k)


def precision_at_k(hits: DeviceHits, m: Any) -> tuple[Any, Any]:
    """:func:`embedeval.engine.kernels.precision_at_k` on the device (same formula and tie rule).

    >>> import pytest
    >>> torch = pytest.importorskip("torch")
    >>> from embedeval.engine.registry import METRICS
    >>> hits = device_example(torch, [[1, 0, 1, 1]] * 2, keys=[[0, 1, 2, 3], [0, 1, 1, 2]])
    >>> value, tie = precision_at_k(hits, METRICS["precision_at_2"])
    >>> value.tolist(), tie.tolist()
    ([0.5, 0.5], [False, True])
    """
    window = hits.n_valid.clamp(max=m.cutoff)
    return hits.hits_within(window).double() / m.cutoff, hits.ties.straddle(window)


def recall_at_k(hits: DeviceHits, m: Any) -> tuple[Any, Any]:
    """:func:`embedeval.engine.kernels.recall_at_k` on the device (same formula and tie rule).

    >>> import pytest
    >>> torch = pytest.importorskip("torch")
    >>> from embedeval.engine.registry import METRICS
    >>> hits = device_example(torch, [[0, 1, 0, 1], [0, 1, 0, 1], [1, 1, 0, 0]],
    ...                       keys=[[0, 1, 2, 3], [0, 1, 1, 2], [0, 1, 1, 2]])
    >>> value, tie = recall_at_k(hits, METRICS["recall_at_2"])
    >>> value.tolist(), tie.tolist()
    ([1.0, 1.0, 1.0], [False, True, False])
    """
    window = hits.n_valid.clamp(max=m.cutoff)
    value = (hits.hits_within(window) > 0).double()
    return value, hits.ties.hit_rate_changes(window, hits.hit, hits.row_start)


def r_precision(hits: DeviceHits, m: Any) -> tuple[Any, Any]:
    """:func:`embedeval.engine.kernels.r_precision` on the device (same formula and tie rule).

    >>> import pytest
    >>> torch = pytest.importorskip("torch")
    >>> from embedeval.engine.registry import METRICS
    >>> hits = device_example(torch, [[1, 0, 1, 1], [1, 1, 0, 1]],
    ...                       keys=[[0, 1, 2, 3], [0, 1, 2, 2]])
    >>> value, tie = r_precision(hits, METRICS["r_precision"])
    >>> value.tolist(), tie.tolist()
    ([0.6666666666666666, 0.6666666666666666], [False, True])
    """
    window = hits.r_window()
    value = hits.hits_within(window).double() / window.clamp(min=1).double()
    return value, hits.ties.straddle(window)


def map_at_r(hits: DeviceHits, m: Any) -> tuple[Any, Any]:
    """:func:`embedeval.engine.kernels.map_at_r` on the device (same formula, tie rule and sums).

    >>> import pytest
    >>> torch = pytest.importorskip("torch")
    >>> from embedeval.engine.registry import METRICS
    >>> hits = device_example(torch, [[1, 0, 1, 1]] * 2, keys=[[0, 1, 2, 3], [0, 1, 1, 2]])
    >>> value, tie = map_at_r(hits, METRICS["map_at_r"])
    >>> value.tolist(), tie.tolist()
    ([0.5555555555555555, 0.5555555555555555], [False, True])
    """
    window = hits.r_window()
    value = hits.precision_sums(window) / hits.relevant.clamp(min=1).double()
    return value, hits.ties.within(window)


def map_at_k(hits: DeviceHits, m: Any) -> tuple[Any, Any]:
    """:func:`embedeval.engine.kernels.map_at_k` on the device (same formula, tie rule and sums).

    >>> import pytest
    >>> torch = pytest.importorskip("torch")
    >>> from embedeval.engine.registry import METRICS
    >>> rows, keys = [[1, 0, 1, 1], [1, 0, 0, 1]], [[0, 1, 2, 3], [0, 1, 2, 2]]
    >>> value, tie = map_at_k(device_example(torch, rows, keys=keys), METRICS["map_at_3"])
    >>> value.tolist(), tie.tolist()
    ([0.8333333333333333, 1.0], [False, True])
    """
    torch = hits.torch
    window = hits.n_valid.clamp(max=m.cutoff)
    found = hits.hits_within(window)
    value = hits.precision_sums(window) / found.clamp(min=1).double()
    tie = hits.ties.within(window)
    rows = torch.nonzero(hits.ties.one_inside(window) & ~hits.ties.within(window - 1)).flatten()
    if rows.numel():
        w = window[rows].double()
        before = hits.hits_within(window - 1)[rows].double()
        sums = hits.precision_sums(window - 1)[rows]
        inside = (sums + (before + 1.0) / w) / (before + 1.0)
        outside = torch.where(before > 0, sums / before.clamp(min=1.0), torch.zeros_like(sums))
        tie[rows] = ~torch.isclose(inside, outside, rtol=1e-12, atol=0.0)
    return value, tie


def average_precision(hits: DeviceHits, m: Any) -> tuple[Any, Any]:
    """:func:`embedeval.engine.kernels.average_precision` on the device (same formula, tie rule and
    sums).

    >>> import pytest
    >>> torch = pytest.importorskip("torch")
    >>> from embedeval.engine.registry import METRICS
    >>> hits = device_example(torch, [[1, 0, 0, 1]] * 2, keys=[[0, 1, 2, 3], [0, 1, 2, 2]])
    >>> value, tie = average_precision(hits, METRICS["map"])
    >>> value.tolist(), tie.tolist()
    ([0.75, 0.75], [False, True])
    """
    window = hits.last_hit_rank() if hits.k is None else hits.depth_cap
    value = hits.precision_sums(window) / hits.relevant.clamp(min=1).double()
    return value, hits.ties.within(window)


def inverse_negative_penalty(hits: DeviceHits, m: Any) -> tuple[Any, Any]:
    """:func:`embedeval.engine.kernels.inverse_negative_penalty` on the device (same formula and tie
    rule).

    >>> import pytest
    >>> torch = pytest.importorskip("torch")
    >>> from embedeval.engine.registry import METRICS
    >>> hits = device_example(torch, [[1, 0, 0, 1]] * 2, keys=[[0, 1, 2, 3], [0, 1, 2, 2]])
    >>> value, tie = inverse_negative_penalty(hits, METRICS["minp"])
    >>> value.tolist(), tie.tolist()
    ([0.5, 0.5], [False, True])
    >>> hits = device_example(torch, [[1, 0, 0, 1]], keys=[[0, 1, 2, 2]], k=3)
    >>> value, tie = inverse_negative_penalty(hits, METRICS["minp"])
    >>> value.tolist(), tie.tolist()
    ([0.0], [True])
    """
    torch = hits.torch
    last = hits.last_hit_rank()
    cap = hits.depth_cap
    every = (hits.n_hits > 0) & (hits.n_hits >= hits.relevant)
    complete = every & (last <= cap)
    value = hits.relevant.double() / last.clamp(min=1).double()
    value = torch.where(complete, value, torch.zeros_like(value))
    moved = hits.ties.straddle(last) | hits.ties.straddle(last - 1)
    pulled_in = every & hits.ties.can_pull_in(cap, hits.hit, last)
    return value, torch.where(complete, moved, pulled_in)


def reciprocal_rank(hits: DeviceHits, m: Any) -> tuple[Any, Any]:
    """:func:`embedeval.engine.kernels.reciprocal_rank` on the device (same formula and tie rule).

    >>> import pytest
    >>> torch = pytest.importorskip("torch")
    >>> from embedeval.engine.registry import METRICS
    >>> hits = device_example(torch, [[0, 1, 0, 0]] * 2, keys=[[0, 1, 2, 3], [0, 1, 1, 2]])
    >>> value, tie = reciprocal_rank(hits, METRICS["mrr"])
    >>> value.tolist(), tie.tolist()
    ([0.5, 0.5], [False, True])
    """
    torch = hits.torch
    cap = hits.depth_cap
    first = torch.full_like(hits.counts, 2**62)
    has = hits.n_hits > 0
    first[has] = hits.hit_pos[hits.row_start[has]]
    in_reach = first < cap
    reach = torch.minimum(first, cap).double() + 1.0
    value = torch.where(in_reach, 1.0 / reach, torch.zeros_like(reach))
    return value, hits.ties.within(torch.where(in_reach, first + 1, cap))


#: The device kernel of each ``MetricInfo.kernel`` name (custom metrics run on the host).
KERNELS = {
    "precision_at_k": precision_at_k,
    "recall_at_k": recall_at_k,
    "r_precision": r_precision,
    "map_at_r": map_at_r,
    "map_at_k": map_at_k,
    "map": average_precision,
    "minp": inverse_negative_penalty,
    "mrr": reciprocal_rank,
}


class DeviceKernels:
    """:func:`embedeval.engine.kernels.chunk_metrics` on the device: each metric's kernel of
    :data:`KERNELS` over a block's :class:`DeviceHits`.

    The float64 sums of MAP@R / MAP add in numpy's order (:func:`numpy_order_sums`), so given
    the same ranking every value and tie flag equals the numpy kernels' bit for bit.
    """

    @classmethod
    def supports(cls, m: Any) -> bool:
        return m.function is None and m.kernel in KERNELS

    def __init__(self, torch: Any, task: Any, device: Any) -> None:
        self.torch = torch
        self.task = task
        self.q_codes = torch.as_tensor(np.asarray(task.query_codes, dtype=np.int64), device=device)
        self.r_codes = torch.as_tensor(
            np.asarray(task.reference_codes, dtype=np.int64), device=device
        )
        self.relevant = torch.as_tensor(task.relevant, device=device)
        self.n_valid = torch.as_tensor(task.n_valid, device=device)

    def score(self, block: Any) -> tuple[dict, dict]:
        """Per-query values (NaN for lone queries) and tie flags of ``block``, on the host."""
        torch, task = self.torch, self.task
        rows = slice(block.start, block.start + block.lims.numel() - 1)
        relevant = self.relevant[rows]
        hits = device_hits(
            torch, block, self.q_codes[rows], self.r_codes, relevant, self.n_valid[rows], task.k
        )
        lone = relevant == 0
        out_values, out_ties = {}, {}
        for m in task.metrics:
            value, tie = KERNELS[m.kernel](hits, m)
            value = torch.where(lone, torch.full_like(value, math.nan), value)
            out_values[m.name] = value.cpu().numpy()
            out_ties[m.name] = (tie & ~lone).cpu().numpy()
        return out_values, out_ties


class DeviceTies:
    """A torch port of :class:`embedeval.engine.kernels.TieFinder` (see there for the rules)."""

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

    def one_inside(self, window: Any) -> Any:
        out = self._false()
        if self.any:
            rows, runs = self._cut(window)
            out[rows[self.lims[rows] + window[rows] - 1 == self.run_first[runs]]] = True
        return out

    def within(self, window: Any) -> Any:
        if not self.any:
            return self._false()
        return (self.first_mixed + 1 < window) | self.straddle(window)

    def can_pull_in(self, window: Any, hit: Any, last: Any) -> Any:
        torch = self.torch
        out = self._false()
        if not self.any:
            return out
        rows, runs = self._cut(window)
        first, end = self.run_first[runs], self.run_last[runs]
        in_block = torch.searchsorted(hit, end, right=True) - torch.searchsorted(hit, first)
        inside = self.lims[rows] + window[rows] - first
        holds_last = self.lims[rows] + last[rows] - 1 <= end
        out[rows] = holds_last & (in_block <= inside)
        return out


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
