"""The exact engine's worker threads: query blocks searched in parallel, results in order, values
that depend neither on ``n_threads`` nor on the process's BLAS thread setting."""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import embedeval as ee
from embedeval import _exact, knn
from embedeval._errors import InputError
from tests import oracle

METRICS = ["precision_at_1", "r_precision", "map_at_r", "map", "mrr", "recall_at_3"]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1500, 6)).astype(np.float32)
    x[200:260] = x[:60]  # exact duplicates: tied keys that must stay tied in every thread
    y = rng.integers(0, 40, len(x))
    g = rng.integers(0, 25, len(x))
    return x, y, g


def _identical(a, b):
    for name in a.per_query:
        np.testing.assert_array_equal(a.per_query[name], b.per_query[name], err_msg=name)
    assert a.n_ties == b.n_ties


def test_values_match_the_brute_force_oracle_with_several_threads():
    # Small integers: every float32 key is exact, so the float64 oracle is exact too, ties
    # (many) included.
    rng = np.random.default_rng(8)
    x = rng.integers(-3, 4, size=(900, 4)).astype(np.float32)
    y = rng.integers(0, 12, len(x))
    q, yq = x[:250], y[:250]
    res = ee.evaluate(
        q,
        yq,
        x,
        y,
        ref_includes_query=True,
        metrics=METRICS,
        n_threads=3,
        block_size=16,
        progress=False,
    )
    _, per_query, _ = oracle.evaluate(q, yq, x, y, metrics=METRICS, ref_includes_query=True)
    for m in METRICS:
        np.testing.assert_allclose(res.per_query[m], per_query[m], rtol=0, atol=1e-12, err_msg=m)


@pytest.mark.parametrize("block_size", [None, 7, 100])
def test_results_do_not_depend_on_the_number_of_threads(data, block_size):
    x, y, g = data
    runs = [
        ee.evaluate(
            x,
            y,
            query_groups=g,
            metrics=METRICS,
            block_size=block_size,
            n_threads=t,
            progress=False,
        )
        for t in (1, 2, 3)
    ]
    assert sum(runs[0].n_ties.values()) > 0  # the duplicates do tie
    _identical(runs[0], runs[1])
    _identical(runs[0], runs[2])


def test_results_do_not_depend_on_the_process_blas_threads(data):
    x, y, _ = data
    with threadpool_limits(limits=2, user_api="blas"):
        a = ee.evaluate(x, y, metrics=METRICS, block_size=64, progress=False)
    with threadpool_limits(limits=1, user_api="blas"):
        b = ee.evaluate(x, y, metrics=METRICS, block_size=64, progress=False)
    _identical(a, b)


def test_blas_setting_is_restored_after_a_run(data):
    x, y, _ = data
    from threadpoolctl import threadpool_info

    with threadpool_limits(limits=2, user_api="blas"):
        before = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
        ee.evaluate(x[:200], y[:200], progress=False)
        after = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    assert before == after


def test_neighbors_with_threads_equal_a_numpy_brute_force(data):
    x = data[0][:400]
    d64 = np.sqrt(((x[:, None, :].astype(np.float64) - x[None, :, :]) ** 2).sum(-1))
    np.fill_diagonal(d64, np.inf)
    dist, idx = ee.neighbors(x, 5, n_threads=2, block_size=9)
    # Ascending distance, then ascending index (the duplicates make exact ties).
    want = np.lexsort((np.broadcast_to(np.arange(400), d64.shape), d64), axis=1)[:, :5]
    np.testing.assert_array_equal(idx, want)
    # float32 search: a distance of 0 comes back as sqrt(rounding of ||q||^2 + ||r||^2 - 2 q.r),
    # up to about 1e-3 for norms of a few units.
    np.testing.assert_allclose(dist, np.take_along_axis(d64, want, 1), rtol=1e-5, atol=2e-3)


def test_blocks_come_back_in_order_and_errors_propagate(data, monkeypatch):
    x, y, _ = data
    original = _exact.collect
    calls = []

    def failing(plan, start, *args, **kwargs):
        calls.append(start)
        if start == 64:
            raise RuntimeError("block 64 failed")
        return original(plan, start, *args, **kwargs)

    monkeypatch.setattr(_exact, "collect", failing)
    with pytest.raises(RuntimeError, match="block 64 failed"):
        ee.evaluate(x, y, block_size=16, n_threads=2, progress=False)
    # At most the blocks in flight beside the failing one were started, not the whole run.
    assert len(calls) < 10


def test_in_order_keeps_the_order_of_items():
    import time

    def slow_first(i):
        time.sleep(0.02 if i == 0 else 0.0)
        return i * i

    assert list(knn.in_order(slow_first, range(7), 3)) == [(i, i * i) for i in range(7)]
    assert list(knn.in_order(slow_first, range(3), 1)) == [(0, 0), (1, 1), (2, 4)]


@pytest.mark.parametrize("bad", [0, -2, 1.5, "2", True])
def test_bad_n_threads(data, bad):
    x, y, _ = data
    with pytest.raises(InputError, match="n_threads"):
        ee.evaluate(x[:50], y[:50], n_threads=bad)
    with pytest.raises(InputError, match="n_threads"):
        ee.neighbors(x[:50], 3, n_threads=bad)


def test_concurrent_runs_in_one_process_equal_sequential_runs(data):
    import concurrent.futures

    from threadpoolctl import threadpool_info

    x, y, g = data
    jobs = [dict(metrics=METRICS, block_size=bs, progress=False) for bs in (8, 33, None, 64)]
    alone = [ee.evaluate(x, y, query_groups=g, **kw) for kw in jobs]
    with threadpool_limits(limits=2, user_api="blas"):
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            together = list(pool.map(lambda kw: ee.evaluate(x, y, query_groups=g, **kw), jobs))
        # The reference-counted limit gives the caller's setting back after the last run.
        assert {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"} == {2}
    for a, b in zip(alone, together, strict=True):
        _identical(a, b)


def test_sortable_bits_orders_like_the_floats():
    v = np.array(
        [-np.inf, -3.5, -1e-30, -0.0, 0.0, 1e-38, 2.0, np.finfo(np.float32).max, np.inf],
        dtype=np.float32,
    )
    bits = knn.sortable_bits(v)
    assert np.all(np.diff(bits.astype(np.int64)) >= 0)
    assert bits[3] == bits[4]  # -0.0 == 0.0, so equal keys
    assert np.all(np.diff(bits.astype(np.int64))[[0, 1, 2, 4, 5, 6, 7]] > 0)
    np.testing.assert_array_equal(
        knn.from_sortable_bits(bits)[[0, 1, 2, 4, 5, 6, 7, 8]], v[[0, 1, 2, 4, 5, 6, 7, 8]]
    )


def test_search_block_sorts_redone_rows_with_whole_row_tiles(monkeypatch):
    # Redone rows are appended after the others, so the codes are no longer grouped by row:
    # the block must be sorted as a whole even when its tiles are whole rows (this shared code
    # is what Dask workers run; they used to sort such blocks run by run).
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3000, 5)).astype(np.float32)
    n_rows, need = 64, 1500  # 64 x 1500 candidates: more than one in-cache sort run
    search = knn.PreparedSearch.build(x[:n_rows], x, "euclidean")
    real = _exact.depth_thresholds

    def short_for_odd_rows(search, start, stop, need, subsample, exclusions):
        tau = real(search, start, stop, need, subsample, exclusions)
        tau[1::2] = -1e30  # no candidate at all: these rows must be redone
        return tau

    monkeypatch.setattr(_exact, "depth_thresholds", short_for_odd_rows)
    plan = _exact.EnginePlan(need=np.full(n_rows, need), block_size=n_rows, tile=3000, col_bits=12,
                             subsample=None, distance="euclidean", memory_budget=1 << 28,
                             search=search)  # fmt: skip
    block = _exact.search_block(plan, 0, n_rows)
    d64 = ((x[:n_rows, None, :].astype(np.float64) - x[None, :, :]) ** 2).sum(-1)
    for row in range(n_rows):
        got = block.index[block.lims[row] : block.lims[row] + need]
        want = np.argsort(d64[row], kind="stable")[:need]
        # float32 keys may swap neighbours closer than their rounding: compare distances.
        np.testing.assert_allclose(d64[row, got], d64[row, want], rtol=1e-5, atol=1e-5)
        assert np.all(np.diff(block.bits[block.lims[row] : block.lims[row + 1]]) >= 0)


def test_reject_both_curve_takes_n_threads_and_does_not_depend_on_it(data):
    x, y, _ = data
    kappa = np.random.default_rng(3).random(len(x))
    runs = [
        ee.evaluate(
            x[:600], y[:600], metrics=["map_at_r"], confidences=kappa[:600],
            reject_from="both", n_threads=t, progress=False,
        )
        for t in (1, 3)
    ]  # fmt: skip
    both = {k: v for k, v in runs[0].confidence.items() if k.startswith("both_")}
    assert both and both == {k: runs[1].confidence[k] for k in both}
