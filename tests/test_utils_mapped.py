"""Memory-mapped inputs read block by block without staying resident (``utils.mapped``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embedeval.utils.mapped import gather_rows, release_pages, row_blocks


def _rss_file_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) / 1024
    pytest.skip("no RssFile in /proc/self/status")


@pytest.fixture(scope="module")
def mapped(tmp_path_factory):
    path = tmp_path_factory.mktemp("mapped") / "x.npy"
    x = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(262_144, 128))
    for a in range(0, x.shape[0], 32_768):  # 128 MiB, row i holding i
        x[a : a + 32_768] = np.arange(a, a + 32_768, dtype=np.float32)[:, None]
    x.flush()
    del x
    return np.load(path, mmap_mode="r")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gathered_rows_are_the_rows_asked_for(mapped, dtype):
    rows = np.sort(np.random.default_rng(0).choice(mapped.shape[0], 3000, replace=False))
    got = gather_rows(mapped, rows, dtype=dtype, span=1 << 20)
    assert got.dtype == dtype and got.shape == (3000, 128)
    np.testing.assert_array_equal(got[:, 0], rows.astype(dtype))
    np.testing.assert_array_equal(got[:, -1], rows.astype(dtype))
    assert gather_rows(mapped, np.array([], dtype=np.int64)).shape == (0, 128)
    plain = np.arange(12, dtype=np.float16).reshape(6, 2)  # not a map: read as usual
    np.testing.assert_array_equal(gather_rows(plain, np.array([1, 5])), [[2, 3], [10, 11]])


def test_row_blocks_yield_the_slices(mapped):
    bounds = [(0, 16), (16, 100_000), (100_000, 262_144)]
    blocks = [np.array(b[:, :1]) for b in row_blocks(mapped, bounds)]
    assert [b.shape[0] for b in blocks] == [16, 99_984, 162_144]
    np.testing.assert_array_equal(np.concatenate(blocks)[:, 0], np.arange(262_144))


def test_pages_read_do_not_stay_resident(mapped):
    # 128 MiB read through the helpers: the pages of each window are given back before the
    # next is read, so the process never holds more than a few windows of the file
    release_pages(mapped, 0, mapped.shape[0])
    before = _rss_file_mb()
    peak = before
    for block in row_blocks(mapped, [(a, a + 8192) for a in range(0, mapped.shape[0], 8192)]):
        float(block.sum())
        peak = max(peak, _rss_file_mb())
    rows = np.arange(0, mapped.shape[0], 64)  # one row in 64 pages: the kernel maps around them
    gather_rows(mapped, rows, span=1 << 22)
    assert peak - before < 24 and _rss_file_mb() - before < 24
    # the same reads without the releases do keep the file resident: the check can fail
    for a in range(0, mapped.shape[0], 8192):
        float(mapped[a : a + 8192].sum())
    assert _rss_file_mb() - before > 100
    release_pages(mapped, 0, mapped.shape[0])
    assert _rss_file_mb() - before < 24


def test_a_copy_on_write_map_keeps_the_changes_made_to_it(mapped, tmp_path):
    # mmap_mode="c": the pages changed in this process exist nowhere else; releasing them
    # would silently bring the file's values back
    path = tmp_path / "c.npy"
    np.save(path, np.arange(40_000, dtype=np.float32).reshape(10_000, 4))
    x = np.load(path, mmap_mode="c")
    x *= 2
    for block in row_blocks(x, [(0, 5_000), (5_000, 10_000)]):
        float(block.sum())
    gather_rows(x, np.arange(0, 10_000, 3))
    release_pages(x[100:], 0, 9_900)
    np.testing.assert_array_equal(x, 2 * np.arange(40_000, dtype=np.float32).reshape(10_000, 4))
