"""``embedeval.neighbors`` against a numpy brute force written here (stable argsort per row)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import embedeval as ee
from embedeval.engine import candidates, threads
from embedeval.engine import exact as _exact
from embedeval.utils.errors import InputError
from tests import oracle


def brute(q, r, k, distance, exclude_self):
    """Float64 full sort by (score, index); returns the documented distance/similarity."""
    q = np.asarray(q, dtype=np.float64)
    r = np.asarray(r, dtype=np.float64)
    if distance == "euclidean":
        val = np.sqrt(((q[:, None, :] - r[None, :, :]) ** 2).sum(-1))
        key = val
    else:
        if distance == "cosine":
            q = q / np.linalg.norm(q, axis=1, keepdims=True)
            r = r / np.linalg.norm(r, axis=1, keepdims=True)
        val = q @ r.T
        key = -val
    dist, idx = [], []
    for i in range(len(q)):
        cand = [j for j in range(len(r)) if not (exclude_self and j == i)]
        cand.sort(key=lambda j: (key[i, j], j))
        cand = cand[:k]
        idx.append(cand)
        dist.append([val[i, j] for j in cand])
    return np.array(dist), np.array(idx, dtype=np.int64)


@pytest.mark.parametrize("distance", ["euclidean", "cosine", "inner_product"])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_brute_force_with_exact_ties(distance, seed):
    rng = np.random.default_rng(seed)
    # small integer grid: many exact duplicates and equal distances
    q = rng.integers(-2, 3, size=(12, 3)).astype(np.float64)
    r = rng.integers(-2, 3, size=(20, 3)).astype(np.float64)
    if distance == "cosine":
        q[np.all(q == 0, axis=1)] = 1.0
        r[np.all(r == 0, axis=1)] = 1.0
    dist, idx = ee.neighbors(q, 6, r, distance=distance, progress=False)
    Dw, Iw = brute(q, r, 6, distance, False)
    if distance == "cosine":
        # float32 cosines of equal angles may differ in the last bit, so the order inside an
        # exact tie is not checkable; check each returned row has the brute-force similarity
        qn = q / np.linalg.norm(q, axis=1, keepdims=True)
        rn = r / np.linalg.norm(r, axis=1, keepdims=True)
        np.testing.assert_allclose(np.take_along_axis(qn @ rn.T, idx, 1), Dw, atol=1e-6)
        np.testing.assert_allclose(dist, Dw, atol=1e-6)
        return
    np.testing.assert_array_equal(idx, Iw)
    np.testing.assert_allclose(dist, Dw, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("distance", ["euclidean", "cosine", "inner_product"])
def test_matches_brute_force_on_random_data(distance):
    rng = np.random.default_rng(3)
    q, r = rng.normal(size=(30, 5)), rng.normal(size=(50, 5))
    for bs in (1, 7, None):
        dist, idx = ee.neighbors(q, 10, r, distance=distance, block_size=bs, progress=False)
        Dw, Iw = brute(q, r, 10, distance, False)
        np.testing.assert_array_equal(idx, Iw)
        np.testing.assert_allclose(dist, Dw, rtol=1e-5, atol=1e-5)
        assert idx.dtype == np.int64


def test_euclidean_is_not_squared_and_ties_go_to_the_lower_index():
    dist, idx = ee.neighbors([[0.0, 0.0]], 3, [[3.0, 4.0], [0.0, 5.0], [1.0, 0.0]], progress=False)
    assert idx.tolist() == [[2, 0, 1]]
    np.testing.assert_allclose(dist, [[1.0, 5.0, 5.0]])


def test_self_exclusion_and_clamping():
    x = np.array([[0.0], [1.0], [3.0], [7.0]])
    dist, idx = ee.neighbors(x, 10, progress=False)  # only 3 others exist
    assert idx.shape == (4, 3)
    Dw, Iw = brute(x, x, 3, "euclidean", True)
    np.testing.assert_array_equal(idx, Iw)
    np.testing.assert_allclose(dist, Dw)
    # duplicates: self exclusion is by row identity, the twin is still found
    y = np.array([[1.0], [1.0], [5.0]])
    dist, idx = ee.neighbors(y, 1, progress=False)
    assert idx.tolist() == [[1], [0], [0]]
    np.testing.assert_allclose(dist, [[0.0], [0.0], [4.0]])
    # exclude_self with a reference whose first rows are the queries
    dist, idx = ee.neighbors(y[:2], 5, y, exclude_self=True, progress=False)
    assert idx.tolist() == [[1, 2], [0, 2]]
    # clamped to the reference set in a split
    dist, idx = ee.neighbors(y, 7, [[0.0], [2.0]], progress=False)
    assert idx.shape == (3, 2) and idx.tolist() == [[0, 1], [0, 1], [1, 0]]


class ArrayLike:
    def __init__(self, a):
        self.a = np.asarray(a)

    def __array__(self, dtype=None, copy=None):
        return self.a if dtype is None else self.a.astype(dtype)


def test_accepts_lists_float16_float64_memmap_and_array_like(tmp_path):
    rng = np.random.default_rng(5)
    # multiples of 1/8 in a small range: exact in float16
    q = rng.integers(-16, 16, size=(9, 3)) / 8.0
    r = rng.integers(-16, 16, size=(15, 3)) / 8.0 + 1 / 64
    _, Iw = brute(q, r, 4, "euclidean", False)
    mm = np.lib.format.open_memmap(tmp_path / "r.npy", mode="w+", dtype=np.float32, shape=r.shape)
    mm[:] = r
    mm.flush()
    mm = np.load(tmp_path / "r.npy", mmap_mode="r")
    for qq, rr in (
        (q.tolist(), r.tolist()),
        (q.astype(np.float16), r.astype(np.float16)),
        (q.astype(np.float64), r),
        (q, mm),
        (ArrayLike(q), ArrayLike(r)),
    ):
        dist, idx = ee.neighbors(qq, 4, rr, progress=False)
        Dh, Ih = brute(
            np.asarray(qq, dtype=np.float64),
            np.asarray(rr, dtype=np.float64),
            4,
            "euclidean",
            False,
        )
        np.testing.assert_array_equal(idx, Ih)
        np.testing.assert_allclose(dist, Dh, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(Iw, Ih)


@pytest.mark.parametrize("scale", [2.0**63, 2.0**100, 2.0**-80, 2.0**-120])
def test_inputs_whose_squares_leave_float32_keep_ranking_and_distances(scale):
    # The docstring example (points 0, 1, 3, 7) times a power of two: the same neighbours, and
    # the distances times the same power (squares of these overflow or underflow float32).
    x = (np.array([[0.0], [1.0], [3.0], [7.0]]) * scale).astype(np.float32)
    d, i = ee.neighbors(x, 2)
    assert i.tolist() == [[1, 2], [0, 2], [1, 0], [2, 1]]
    want = np.array([[1.0, 3.0], [1.0, 2.0], [2.0, 3.0], [4.0, 6.0]]) * scale
    np.testing.assert_array_equal(d.astype(np.float64), want)
    # Inner product: q . r ranks 7 first for every positive query, then 3 (ties at 0 by index).
    _, i = ee.neighbors(x, 2, distance="inner_product")
    assert i.tolist() == [[1, 2], [3, 2], [3, 1], [2, 1]]


# The exact engine's worker threads: query blocks searched in parallel, results in order,
# values that depend neither on ``n_threads`` nor on the process's BLAS thread setting.


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

    assert list(threads.in_order(slow_first, range(7), 3)) == [(i, i * i) for i in range(7)]
    assert list(threads.in_order(slow_first, range(3), 1)) == [(0, 0), (1, 1), (2, 4)]


def test_one_torch_thread_holds_only_inside_and_is_restored():
    torch = pytest.importorskip("torch")
    seen = []

    def worker():  # a thread of its own: PyTorch keeps the setting per thread
        before = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            with threads.one_torch_thread(torch):
                seen.append(torch.get_num_threads())
            seen.append(torch.get_num_threads())
        finally:
            torch.set_num_threads(before)  # also the default of threads started later

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == [1, 2]


@pytest.mark.parametrize("bad", [0, -2, 1.5, "2", True])
def test_bad_n_threads(data, bad):
    x, y, _ = data
    with pytest.raises(InputError, match="n_threads"):
        ee.evaluate(x[:50], y[:50], n_threads=bad)
    with pytest.raises(InputError, match="n_threads"):
        ee.neighbors(x[:50], 3, n_threads=bad)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (0, "block_size must be >= 1; got 0."),
        (-5, "block_size must be >= 1; got -5."),
        (True, "block_size must be an integer or None; got True of type bool."),
        (2.5, "block_size must be an integer or None; got 2.5 of type float."),
    ],
)
def test_bad_block_size_is_refused_as_evaluate_refuses_it(data, bad, message):
    x, y, _ = data
    with pytest.raises(InputError) as by_evaluate:
        ee.evaluate(x[:50], y[:50], block_size=bad)
    with pytest.raises(InputError) as by_neighbors:
        ee.neighbors(x[:50], 3, block_size=bad)
    assert str(by_evaluate.value) == str(by_neighbors.value)
    assert str(by_neighbors.value).startswith(message)


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
    bits = candidates.sortable_bits(v)
    assert np.all(np.diff(bits.astype(np.int64)) >= 0)
    assert bits[3] == bits[4]  # -0.0 == 0.0, so equal keys
    assert np.all(np.diff(bits.astype(np.int64))[[0, 1, 2, 4, 5, 6, 7]] > 0)
    np.testing.assert_array_equal(
        candidates.from_sortable_bits(bits)[[0, 1, 2, 4, 5, 6, 7, 8]], v[[0, 1, 2, 4, 5, 6, 7, 8]]
    )


def test_search_block_sorts_redone_rows_with_whole_row_tiles(monkeypatch):
    # Redone rows are appended after the others, so the codes are no longer grouped by row:
    # the block must be sorted as a whole even when its tiles are whole rows (this shared code
    # is what Dask workers run; they used to sort such blocks run by run).
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3000, 5)).astype(np.float32)
    n_rows, need = 64, 1500  # 64 x 1500 candidates: more than one in-cache sort run
    search = _exact.PreparedSearch.build(x[:n_rows], x, "euclidean")
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


def test_search_block_redoes_rows_whose_threshold_is_short_by_less_than_the_band(monkeypatch):
    # A subsample threshold one float32 step below a row's need-th key keeps need keys once
    # widened by the keys' bound, but maybe not every key up to the need-th one widened (what
    # the float64 decision reads): the row is redone over every reference.  Small-integer rows
    # make every key an exact integer, so the need-th key is known here.
    rng = np.random.default_rng(23)
    x = np.unique(rng.integers(-3, 4, (6000, 5)), axis=0)[:3000].astype(np.float32)
    n_rows, need = 40, 25
    x64 = x.astype(np.float64)
    keys = (x64 * x64).sum(1)[None, :] - 2.0 * x64[:n_rows] @ x64.T
    kth = np.sort(keys, axis=1)[:, need - 1].astype(np.float32)
    search = _exact.PreparedSearch.build(x[:n_rows], x, "euclidean")

    def one_step_low(search, start, stop, need, subsample, exclusions):
        tau = np.full(stop - start, _exact.KEY_MAX, dtype=np.float32)
        tau[::2] = np.nextafter(kth[start:stop], np.float32(-np.inf))[::2]
        return tau

    redo, redone = _exact.redo_rows, []

    def spy(plan, start, rows, codes, counts):
        redone.extend((start + rows).tolist())
        return redo(plan, start, rows, codes, counts)

    monkeypatch.setattr(_exact, "depth_thresholds", one_step_low)
    monkeypatch.setattr(_exact, "redo_rows", spy)
    plan = _exact.EnginePlan(need=np.full(n_rows, need), block_size=n_rows, tile=1024,
                             col_bits=12, subsample=None, distance="euclidean",
                             memory_budget=1 << 28, search=search)  # fmt: skip
    block = _exact.search_block(plan, 0, n_rows)
    assert redone == list(range(0, n_rows, 2))
    for row in range(n_rows):  # every key up to the need-th one: exact integers, exact order
        got = block.index[block.lims[row] : block.lims[row] + need]
        np.testing.assert_array_equal(got, np.argsort(keys[row], kind="stable")[:need])


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


# embedeval.neighbors against a brute force written here (full sort by score, then index).


def _brute(q, r, k, distance, exclude_self):
    q64, r64 = q.astype(np.float64), r.astype(np.float64)
    if distance == "euclidean":
        d = np.sqrt(((q64[:, None] - r64[None]) ** 2).sum(-1))
        key = d
    else:
        if distance == "cosine":
            q64 = q64 / np.linalg.norm(q64, axis=1, keepdims=True)
            r64 = r64 / np.linalg.norm(r64, axis=1, keepdims=True)
        d = q64 @ r64.T
        key = -d
    idx, dist = [], []
    for i in range(len(q)):
        cols = [j for j in range(len(r)) if not (exclude_self and j == i)]
        order = sorted(cols, key=lambda j: (key[i, j], j))[:k]
        idx.append(order)
        dist.append([d[i, j] for j in order])
    return np.array(dist), np.array(idx)


@pytest.mark.parametrize("distance", ["euclidean", "cosine", "inner_product"])
def test_neighbors_match_brute_force_with_ties(distance):
    rng = np.random.default_rng(1)
    q = rng.integers(-2, 3, (40, 3)).astype(np.float32)  # many exact ties
    r = rng.integers(-2, 3, (70, 3)).astype(np.float32)
    if distance == "cosine":
        q[np.all(q == 0, axis=1)] = 1
        r[np.all(r == 0, axis=1)] = 1
    d, i = ee.neighbors(q, 6, r, distance=distance)
    bd, bi = _brute(q, r, 6, distance, False)
    if distance != "cosine":  # cosine of integer vectors is not exact in float32
        np.testing.assert_array_equal(i, bi)
    np.testing.assert_allclose(d, bd, atol=1e-5)


def test_neighbors_self_exclusion_and_clamping():
    x = np.array([[0.0], [1.0], [3.0], [7.0]], dtype=np.float32)
    d, i = ee.neighbors(x, 10)
    assert i.shape == (4, 3)  # k clamped to the 3 other points, never padded with -1
    assert i.tolist() == [[1, 2, 3], [0, 2, 3], [1, 0, 3], [2, 1, 0]]
    assert d.tolist() == [[1, 3, 7], [1, 2, 6], [2, 3, 4], [4, 6, 7]]
    _d2, i2 = ee.neighbors(x[:2], 1, x, exclude_self=True)
    assert i2.ravel().tolist() == [1, 0]
    with pytest.raises(ee.InputError, match="first rows of reference"):
        ee.neighbors(x[1:3], 1, x, exclude_self=True)


def test_neighbors_match_faiss_on_random_data():
    faiss = pytest.importorskip("faiss")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3000, 16)).astype(np.float32)
    d, i = ee.neighbors(x[:500], 8, x)
    index = faiss.IndexFlatL2(16)
    index.add(x)
    fd, fi = index.search(x[:500], 8)
    assert (i == fi).mean() > 0.999  # float32 rounding may swap near-equal neighbours
    np.testing.assert_allclose(d**2, fd, rtol=1e-4, atol=1e-4)


def _brute_groups(q, r, k, gq, gr, exclude_self):
    """Euclidean brute force skipping same-group references (and the own row), padded with -1."""
    q, r = np.asarray(q, dtype=np.float64), np.asarray(r, dtype=np.float64)
    idx = np.full((len(q), k), -1)
    for i in range(len(q)):
        d = np.sqrt(((r - q[i]) ** 2).sum(axis=1))
        cand = [j for j in range(len(r)) if gr[j] != gq[i] and not (exclude_self and j == i)]
        cand.sort(key=lambda j: (d[j], j))
        idx[i, : len(cand[:k])] = cand[:k]
    return idx


@pytest.mark.parametrize("seed", [0, 1])
def test_groups_exclude_same_group_references_with_ties(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 3, size=(30, 2)).astype(np.float64)  # duplicates and exact ties
    g = rng.integers(0, 4, size=30)
    d, i = ee.neighbors(x, 5, query_groups=g)
    np.testing.assert_array_equal(i, _brute_groups(x, x, 5, g, g, True))
    r, gr = x[5:], g[5:]
    d, i = ee.neighbors(x[:8], 4, r, query_groups=g[:8], reference_groups=gr)
    np.testing.assert_array_equal(i, _brute_groups(x[:8], r, 4, g[:8], gr, False))
    np.testing.assert_allclose(d, np.sqrt(((x[:8, None] - r[i]) ** 2).sum(-1)), atol=1e-6)


def test_groups_pad_queries_that_see_fewer_references():
    x = np.array([[0.0], [1.0], [2.0], [3.0]])
    # Query 0 and 1 share group "a" with three of the four rows: each sees one reference.
    d, i = ee.neighbors(x, 2, query_groups=["a", "a", "a", "b"])
    assert i.tolist() == [[3, -1], [3, -1], [3, -1], [2, 1]]
    assert d[0, 0] == 3.0 and np.isnan(d[0, 1]) and d[3].tolist() == [1.0, 2.0]


def test_groups_are_refused_where_they_cannot_apply():
    x = np.zeros((3, 2))
    with pytest.raises(InputError, match="reference_groups"):
        ee.neighbors(x, 1, x, query_groups=[0, 1, 2])
    with pytest.raises(InputError, match="query_groups"):
        ee.neighbors(x, 1, query_groups=[0, 1])


@pytest.mark.parametrize("backend", [{}, {"backend": "torch", "device": "cpu"}])
def test_subnormal_distances_are_rounded_to_float32_once(backend):
    # Two points 3001.49996 subnormal spacings (2**-149) apart: sqrt(3001 * 3002) in float64
    # rounds once to 3001 spacings.  Rounded first at the rescaled rows' float32 precision it
    # becomes 3001.5, and then 3002 when scaled back into the subnormal range.
    import math

    if backend:
        pytest.importorskip("torch")
    unit = 2.0**-149
    x = (np.array([[0, 0, 0], [3001, 51, 20]], dtype=np.float64) * unit).astype(np.float32)
    want = np.float32(math.sqrt(3001**2 + 51**2 + 20**2) * unit)
    assert want == np.float32(3001 * unit)
    d, i = ee.neighbors(x, 1, **backend)
    assert i.tolist() == [[1], [0]]
    assert d.dtype == np.float32
    assert d[:, 0].tolist() == [want, want]


@pytest.mark.parametrize("backend", [{}, {"backend": "torch", "device": "cpu"}])
def test_cosine_ranks_rows_of_subnormal_values_exactly(backend):
    # A row of subnormal float32 values has a norm that float32 holds with few bits; its cosine
    # keys must still be ordered as the exact cosines (computed here in rational arithmetic).
    from fractions import Fraction

    if backend:
        pytest.importorskip("torch")
    q = np.float32([[-0.22406888, -0.04894053]])
    x = np.float32([[3.1377875e-41, 6.9266183e-42], [1.3226926, 0.29006439],
                    [1.5658567, 0.34249085]])  # fmt: skip

    def exact_cos2(a, b):  # sign(s) s^2 / (|a|^2 |b|^2): orders like the cosine
        s = sum(Fraction(float(u)) * Fraction(float(v)) for u, v in zip(a, b, strict=True))
        n = sum(Fraction(float(u)) ** 2 for u in a) * sum(Fraction(float(v)) ** 2 for v in b)
        return (1 if s > 0 else -1) * s * s / n

    want = sorted(range(3), key=lambda j: (-exact_cos2(q[0], x[j]), j))
    _, idx = ee.neighbors(q, 3, x, distance="cosine", **backend)
    assert idx[0].tolist() == want
    _, idx = ee.neighbors(np.vstack([q, x]), 3, None, distance="cosine", **backend)
    assert idx[0].tolist() == [j + 1 for j in want]


@pytest.mark.parametrize(
    "backend",
    [{}, {"backend": "torch", "device": "cpu", "precision": "float32"},
     {"backend": "torch", "device": "cpu", "precision": "bf16"}],
)  # fmt: skip
@pytest.mark.parametrize(
    ("distance", "x_scale", "q_scale"), [("inner_product", 1.0, 1e-43), ("euclidean", 1e-21, 1e-21)]
)
def test_keys_below_float32_normal_range_are_ranked_as_float64_ranks_them(
    backend, distance, x_scale, q_scale
):
    # Products below float32's normal range (queries of norm 1e-43 against unit rows; tiny
    # rows beside one query of norm 1 that keeps the data from being rescaled) err by up to
    # the subnormal spacing, far beyond any bound relative to their tiny magnitude: each
    # order must still be the one of the float64 keys.
    if backend:
        pytest.importorskip("torch")
    found = 0
    for seed in range(4):
        rng = np.random.default_rng(seed)
        x = (rng.normal(0, 1, (40, 4)) * x_scale).astype(np.float32)
        q = (rng.normal(0, 1, (30, 4)) * q_scale).astype(np.float32)
        q[0] = 1.0
        want = [
            np.lexsort((np.arange(40), oracle.fixed_order_keys(row, x, distance)))[:5] for row in q
        ]
        _, idx = ee.neighbors(q, 5, x, distance=distance, **backend)
        found += int((idx != np.array(want)).any(axis=1).sum())
    assert found == 0
