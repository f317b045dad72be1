"""The torch twins of the metric kernels: numpy's summation order and bit-for-bit parity with
the numpy kernels (the backend itself is tested in tests/test_search_torch_backend.py)."""

from __future__ import annotations

import numpy as np
import pytest

from embedeval.engine import kernels as _kernels
from embedeval.engine.registry import METRICS

torch = pytest.importorskip("torch")

from embedeval.engine import torch_kernels as tk  # noqa: E402


def test_numpy_order_sums_equal_numpy_reduceat():
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 700, 120)
    lengths[:40] = rng.integers(0, 17, 40)
    data = rng.random(int(lengths.sum())) / rng.integers(1, 60, int(lengths.sum()))
    starts = np.minimum(np.cumsum(lengths) - lengths, data.size)
    want = np.where(lengths > 0, np.add.reduceat(np.append(data, 0.0), starts), 0.0)
    got = tk.numpy_order_sums(torch, torch.from_numpy(data), torch.from_numpy(lengths))
    np.testing.assert_array_equal(got.numpy(), want)


def random_rankings(seed, n_rows=60):
    """Ragged rankings with ties (keys drawn from a few values) and varied R_q."""
    rng = np.random.default_rng(seed)
    relevance, keys = [], []
    for _ in range(n_rows):
        n = int(rng.integers(1, 40))
        relevance.append(rng.integers(0, 2, n).tolist())
        keys.append(np.sort(rng.integers(0, max(2, n // 3), n)).astype(float).tolist())
    return relevance, keys


@pytest.mark.parametrize("k", [None, 3, 11])
@pytest.mark.parametrize("seed", [0, 1])
def test_torch_kernels_equal_the_numpy_kernels_bit_for_bit(seed, k):
    relevance, keys = random_rankings(seed)
    host = _kernels.ranked_example(relevance, keys, k=k)
    device = tk.device_example(torch, relevance, keys, k=k)
    for name in ["map_at_r", "map", "mrr", "minp", "r_precision", "recall_at_3", "precision_at_5"]:
        m = METRICS[name]
        want_value, want_tie = _kernels.KERNELS[m.kernel](host, m)
        got_value, got_tie = tk.KERNELS[m.kernel](device, m)
        np.testing.assert_array_equal(got_value.numpy(), want_value)
        np.testing.assert_array_equal(got_tie.numpy(), want_tie)
