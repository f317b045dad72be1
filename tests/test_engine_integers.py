"""Small-integer inputs (binary codes, quantised features): float32 keys that are exact, ranked
by one sort of (key, reference) codes with no float64 re-scoring, against plain loops and the
float64 brute force."""

from __future__ import annotations

import numpy as np
import pytest

import embedeval as ee
import embedeval.engine.decide as decide
import embedeval.search.local as local
from embedeval.engine.integers import exact_in_float32, integer_magnitude, ranks_of_exact_keys
from embedeval.evaluation.settings import EvaluationInputs, validate_arguments
from embedeval.evaluation.stages import plan_search, prepare_data
from tests import oracle


def test_integer_magnitude_reads_every_row():
    x = np.zeros((40_000, 3), np.float32)
    x[-1, 2] = -7.0
    assert integer_magnitude(x) == 7.0
    x[-1, 1] = 0.25  # past the first rows and the first block
    assert integer_magnitude(x) is None
    for bad in (np.nan, np.inf):
        assert integer_magnitude(np.array([[1.0, bad]], np.float32)) is None
    assert integer_magnitude(np.zeros((0, 4), np.float32)) == 0.0


def test_exact_in_float32_at_the_limit_of_exact_sums():
    # d (Q + X)^2 <= 2**24 for Euclidean keys, d Q X for inner products; cosine never.
    d = 64
    q = np.full((2, d), 256.0, np.float32)  # 64 * (256 + 256)^2 = 2**24 exactly
    assert exact_in_float32(q, q, "euclidean")
    assert not exact_in_float32(q + 1, q, "euclidean")
    big = np.full((2, d), 512.0, np.float32)  # 64 * 512 * 512 = 2**24
    assert exact_in_float32(big, big, "inner_product")
    assert not exact_in_float32(big + 1, big, "inner_product")
    assert not exact_in_float32(q, q, "cosine")
    assert not exact_in_float32(q + 0.5, q, "euclidean")


def test_exact_distance_of_cosine_needs_one_reference_norm_and_reads_each_side_once():
    # cosine runs as the inner product where every reference row has one non-zero squared
    # norm and no query row is zero, within d Q X <= 2**24; each side is read once (a reader
    # counting its row reads), and references of several norms stop before the queries
    from embedeval.engine.integers import exact_distance

    class Counted:
        def __init__(self, x):
            self.x, self.shape, self.reads = x, x.shape, 0

        def __getitem__(self, rows):
            self.reads += 1
            return self.x[rows]

    rng = np.random.default_rng(4)
    codes = np.sign(rng.standard_normal((20_000, 16))).astype(np.float32)
    q = rng.integers(-3, 4, (50, 16)).astype(np.float32)
    q[q.sum(axis=1) == 0, 0] = 1
    assert exact_distance(q, codes, "cosine") == "inner_product"
    assert exact_distance(codes, codes, "cosine") == "inner_product"
    zero = q.copy()
    zero[7] = 0
    assert exact_distance(zero, codes, "cosine") is None
    zero_one = (codes > 0).astype(np.float32)  # {0, 1}: several norms
    assert exact_distance(q, zero_one, "cosine") is None
    big = np.full((2, 16), 2.0**20, np.float32)  # 16 * 2**20 * 1 = 2**24: the limit
    assert exact_distance(big, codes, "cosine") == "inner_product"
    assert exact_distance(big * 2, codes, "cosine") is None
    assert exact_distance(q + 0.5, codes, "cosine") is None
    xq, xb = Counted(q), Counted(codes)
    assert exact_distance(xq, xb, "cosine") == "inner_product"
    blocks = 1 + -(-(20_000 - 16) // 8192)  # 16 rows first, then blocks of 8,192
    assert (xq.reads, xb.reads) == (2, blocks)
    xq, xb = Counted(q), Counted(zero_one)
    assert exact_distance(xq, xb, "cosine") is None and xq.reads == 0


def _brute_ranks(keys, relevant):
    """Per row, by a stable sort and plain loops: the ranks of the relevant references, the
    runs of equal keys holding both kinds (first, last) and the first mixed neighbour pair."""
    n_hits, ranks, runs, first_pair = [], [], [], []
    for i in range(keys.shape[0]):
        order = sorted(range(keys.shape[1]), key=lambda j: (keys[i, j], j))
        k = [keys[i, j] for j in order]
        rel = [bool(relevant[i, j]) for j in order]
        mine = [p for p in range(len(order)) if rel[p]]
        n_hits.append(len(mine))
        ranks.extend(mine)
        pair = None
        p = 0
        while p < len(k):
            q = p
            while q + 1 < len(k) and k[q + 1] == k[p]:
                q += 1
            kinds = set(rel[p : q + 1])
            if len(kinds) == 2 and np.isfinite(k[p]):
                runs.append((i, p, q))
                for t in range(p, q):
                    if pair is None and rel[t] != rel[t + 1]:
                        pair = t
            p = q + 1
        first_pair.append(np.iinfo(np.int64).max // 2 if pair is None else pair)
    return n_hits, ranks, runs, first_pair


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    ("magnitude", "width"), [(None, 60), (3.0, 60), (2.0**21, 60), (2.0**21, 3000)]
)  # codes of sortable float bits; of numbered keys in 32 bits; in 64 bits (wide rows)
def test_ranks_of_exact_keys_are_the_stable_sort_of_every_row(seed, magnitude, width):
    rng = np.random.default_rng(seed)
    b, n = 7, int(rng.integers(1, width))
    keys = rng.integers(-3, 4, size=(b, n)).astype(np.float32)
    keys[rng.random((b, n)) < 0.1] = np.inf  # excluded pairs: last, never relevant
    keys[0, : n // 2] = -0.0  # signed zeros tie with zeros
    relevant = (rng.random((b, n)) < 0.3) & np.isfinite(keys)
    n_hits, ranks, (row, first, last, first_mixed) = ranks_of_exact_keys(keys, relevant, magnitude)
    want_hits, want_ranks, want_runs, want_pair = _brute_ranks(keys, relevant)
    assert n_hits.tolist() == want_hits
    assert ranks.tolist() == want_ranks
    assert list(zip(row.tolist(), first.tolist(), last.tolist(), strict=True)) == want_runs
    assert first_mixed.tolist() == want_pair


METRICS = ["map", "map_at_r", "r_precision", "precision_at_1", "mrr", "map_at_20"]
#: Without full-depth AP: the candidate engines (one-sided and leave-one-out) rank them.
WINDOWS = METRICS[1:]


def _codes(n: int, bits: int, seed: int, zero_one: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.sign(rng.standard_normal((n, bits))).astype(np.float32)
    x[n // 10 : n // 5] = x[: n // 10]  # identical codes, as hash databases have them
    return (x + 1) / 2 if zero_one else x


@pytest.fixture
def no_float64(monkeypatch):
    """Fails a test that re-scores anything in float64 (exact keys need none)."""

    def refuse(*args, **kwargs):
        raise AssertionError("exact keys were re-scored in float64")

    monkeypatch.setattr(decide, "exact_keys", refuse)


@pytest.mark.parametrize(
    ("distance", "zero_one"),
    [("euclidean", False), ("euclidean", True), ("inner_product", False),
     ("inner_product", True), ("cosine", False)],
)  # fmt: skip
@pytest.mark.parametrize("metrics", [METRICS, WINDOWS])
def test_binary_codes_leave_one_out_match_the_float64_brute_force(
    distance, zero_one, metrics, no_float64
):
    x = _codes(500, 12, seed=1, zero_one=zero_one)  # 12 bits: 13 distances, ties everywhere
    y = np.random.default_rng(2).integers(0, 8, 500)
    res = ee.evaluate(x, y, metrics=metrics, distance=distance, progress=False)
    if distance == "cosine":  # the oracle's cosine (normalised rows) rounds exact ties apart
        want = _leave_one_out_by_float64_keys(x, y, metrics, distance)
    else:
        _, want = oracle.summary(x, y, metrics=metrics, distance=distance)
    for m in metrics:
        np.testing.assert_allclose(res.per_query[m], want[m], rtol=1e-12, atol=0, err_msg=m)


def _leave_one_out_by_float64_keys(x, y, metrics, distance):
    """Per query: the fixed-order float64 keys (cosine: ``-sign(s) s**2 / ||x||**2``, exact for
    small integers), a stable sort, the query left out, each metric from its definition."""
    out = {m: np.full(len(x), np.nan) for m in metrics}
    for i in range(len(x)):
        keys = oracle.fixed_order_keys(x[i], x, distance)
        others = np.delete(np.arange(len(x)), i)
        order = others[np.lexsort((others, keys[others]))]
        rel = [bool(y[j] == y[i]) for j in order]
        for m in metrics:
            out[m][i] = oracle.metric_value(m, rel, None)
    return out


@pytest.mark.parametrize("metrics", [["map"], ["map", "precision_at_1"], METRICS, WINDOWS])
def test_binary_codes_query_gallery_with_groups_match_the_float64_brute_force(metrics, no_float64):
    rng = np.random.default_rng(3)
    xq, xr = _codes(120, 16, seed=4), _codes(900, 16, seed=5)
    xq[:10] = xr[:10]  # queries identical to database items
    yq, yr = rng.integers(0, 6, 120), rng.integers(0, 6, 900)
    gq, gr = rng.integers(0, 4, 120), rng.integers(0, 4, 900)
    res = ee.evaluate(
        xq, yq, xr, yr, metrics=metrics, query_groups=gq, reference_groups=gr, progress=False
    )
    _, want = oracle.summary(xq, yq, xr, yr, metrics=metrics, qg=gq, rg=gr)
    for m in metrics:
        np.testing.assert_allclose(res.per_query[m], want[m], rtol=1e-12, atol=0, err_msg=m)


@pytest.mark.parametrize("loo", [False, True])
def test_exact_keys_give_the_float64_paths_values_and_tie_flags(monkeypatch, loo):
    """The same evaluation with the float64 decision (exact keys not detected) and without:
    per-query values and tie flags bit for bit, on multi-label codes with duplicates."""
    rng = np.random.default_rng(6)
    x = _codes(400, 10, seed=7)
    labels = rng.random((400, 5)) < 0.3  # multi-label indicator rows
    args = (x, labels) if loo else (x[:80], labels[:80], x[80:], labels[80:])
    task = _task(*args, metrics=[*METRICS, "minp"])
    fast_values, fast_ties = local.run_local(task)
    monkeypatch.setattr(local, "with_exact_keys", lambda task: task)
    slow_values, slow_ties = local.run_local(task)
    assert any(fast_ties[m].any() for m in METRICS)
    for m in [*METRICS, "minp"]:
        assert np.array_equal(fast_values[m], slow_values[m], equal_nan=True), m
        assert np.array_equal(fast_ties[m], slow_ties[m]), m


def test_which_inputs_are_ranked_from_exact_keys():
    x = _codes(50, 8, seed=8)
    y = np.arange(50) % 5

    def precision(x, distance):
        return local.with_exact_keys(_task(x, y, metrics=["map"], distance=distance)).precision

    assert precision(x, "euclidean") == "exact"
    assert precision(x, "inner_product") == "exact"
    assert precision(x, "cosine") == "exact"  # one norm: ranked as inner products
    assert precision(x * 0.5, "euclidean") == "float32"
    assert precision((x + 1) / 2, "cosine") == "float32"  # {0, 1} codes: norms differ


def _task(xq, yq, xr=None, yr=None, **kwargs):
    inputs = EvaluationInputs(xq, yq, xr, yr, None)
    settings = validate_arguments(inputs, **kwargs)
    return plan_search(settings, prepare_data(settings, inputs)).task


def _wide_integers(n: int, seed: int) -> np.ndarray:
    """Rows of 300 values in {-255, 0, 255}: keys are multiples of 255**2 (ties everywhere), and
    the sums' bounds (300 * 255**2 for inner products, 300 * 510**2 for Euclidean keys) are past
    2**24 (no float32 product is exact), not 2**51."""
    rng = np.random.default_rng(seed)
    x = (255 * rng.integers(-1, 2, size=(n, 300))).astype(np.float32)
    x[n // 10 : n // 5] = x[: n // 10]  # identical rows
    return x


@pytest.mark.parametrize("distance", ["euclidean", "inner_product"])
@pytest.mark.parametrize("split", [False, True])
def test_integers_past_float32_rank_from_an_exact_float64_product(distance, split, no_float64):
    x = _wide_integers(400, seed=9)
    rng = np.random.default_rng(10)
    y, g = rng.integers(0, 5, 400), rng.integers(0, 6, 400)
    assert not exact_in_float32(x, x, distance)
    metrics = ["map", "precision_at_1", "r_precision"]
    if split:
        args = (x[:100], y[:100], x[100:], y[100:])
        res = ee.evaluate(*args, metrics=metrics, distance=distance, progress=False,
                          query_groups=g[:100], reference_groups=g[100:])  # fmt: skip
        _, want = oracle.summary(*args, metrics=metrics, distance=distance, qg=g[:100],
                                 rg=g[100:])  # fmt: skip
    else:
        res = ee.evaluate(x, y, metrics=metrics, distance=distance, progress=False)
        _, want = oracle.summary(x, y, metrics=metrics, distance=distance)
    for m in metrics:
        np.testing.assert_allclose(res.per_query[m], want[m], rtol=1e-12, atol=0, err_msg=m)


def test_an_exact_float64_product_gives_the_float64_decisions_tie_flags(monkeypatch):
    import embedeval.engine.deep as deep

    x = _wide_integers(300, seed=11)
    labels = np.random.default_rng(12).random((300, 4)) < 0.3
    task = _task(x[:60], labels[:60], x[60:], labels[60:], metrics=["map", "minp"])
    fast_values, fast_ties = local.run_local(task)
    monkeypatch.setattr(deep, "_exact_in_float64", lambda task: False)
    slow_values, slow_ties = local.run_local(task)
    assert fast_ties["map"].any()
    for m in ("map", "minp"):
        assert np.array_equal(fast_values[m], slow_values[m], equal_nan=True), m
        assert np.array_equal(fast_ties[m], slow_ties[m]), m


@pytest.mark.filterwarnings("ignore:k=7 is below the largest R_q")
@pytest.mark.parametrize(
    "options",
    [
        {"k": 7},
        {"k": "max_bin_count"},
        {"ref_includes_query": True},
        {"signed_zeros": True},
        {"offset": 1.0},  # columns in {0, 2}: not translated, exact
        {"offset": 3.0},  # columns in {2, 4}: translated by their mean, then not integers
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()),
)
def test_exact_keys_agree_with_the_float64_decision_under_every_option(monkeypatch, options):
    options = dict(options)
    rng = np.random.default_rng(14)
    x = _codes(300, 9, seed=15)
    if options.pop("signed_zeros", False):
        x = x * (rng.random(x.shape) < 0.5)  # zeros, some of them negative
        x[x == 0] *= np.where(rng.random(int((x == 0).sum())) < 0.5, -1, 1)
    x = x + np.float32(options.pop("offset", 0.0))
    y = rng.integers(0, 6, 300)
    metrics = ["map_at_r", "r_precision", "precision_at_1", "map", "mrr"]
    if options.get("ref_includes_query"):
        args = (x[:50], y[:50], x, y)
    else:
        args = (x, y)
    fast = ee.evaluate(*args, metrics=metrics, progress=False, **options)
    monkeypatch.setattr(local, "with_exact_keys", lambda task: task)
    slow = ee.evaluate(*args, metrics=metrics, progress=False, **options)
    for m in metrics:
        assert np.array_equal(fast.per_query[m], slow.per_query[m], equal_nan=True), m
    assert fast.n_ties == slow.n_ties


@pytest.mark.parametrize(("distance", "d"), [("euclidean", 8), ("inner_product", 32)])
def test_integers_at_the_float64_products_limit(distance, d):
    # codes scaled by 2**23: the largest sum is 2**51, the float64 path's limit
    rng = np.random.default_rng(16)
    x = (np.where(rng.random((300, d)) < 0.5, -1, 1) * 2.0**23).astype(np.float32)
    y = rng.integers(0, 8, 300)
    res = ee.evaluate(x[:100], y[:100], x[100:], y[100:], metrics=["map"], distance=distance,
                      progress=False)  # fmt: skip
    _, want = oracle.summary(x[:100], y[:100], x[100:], y[100:], metrics=["map"],
                             distance=distance)  # fmt: skip
    np.testing.assert_allclose(res.per_query["map"], want["map"], rtol=1e-12, atol=0)


#: Above 16 tiles of 2,048 columns: the reference is searched in shards.
N_SHARDED = 40_000


@pytest.mark.parametrize("how", ["shards", "pieces", "dask", "leave-one-out"])
def test_binary_codes_in_shards_and_on_workers_match_the_float64_brute_force(
    how, no_float64, tmp_path, monkeypatch
):
    # the sharded and Dask backends take the codes' keys as exact too (any float64 re-scoring
    # fails the test; the Dask workers run in this process), bit for bit the local engine's
    import embedeval.search.sharded as sharded

    # read shard by shard, not searched whole by the local deep engine (a reference this small)
    monkeypatch.setattr(sharded, "deep_fits_in_memory", lambda task, budget: False)
    x = _codes(N_SHARDED, 16, seed=8)
    y = np.random.default_rng(9).integers(0, 20, N_SHARDED)
    xq, yq = x[:40], y[:40]
    kw = dict(metrics=METRICS, ref_includes_query=True, progress=False)
    local_run = ee.evaluate(xq, yq, x, y, **kw)
    if how == "shards":
        res = ee.evaluate(xq, yq, x, y, shards=3, **kw)
    elif how == "pieces":
        paths = [tmp_path / f"p{i}.npy" for i in range(2)]
        np.save(paths[0], x[:20_000])
        np.save(paths[1], x[20_000:])
        res = ee.evaluate(xq, yq, x, y, shards=paths, **kw)
    elif how == "dask":
        distributed = pytest.importorskip("distributed")
        with (
            distributed.LocalCluster(
                processes=False, n_workers=2, threads_per_worker=1, dashboard_address=":0"
            ) as cluster,
            distributed.Client(cluster) as client,
        ):
            res = ee.evaluate(xq, yq, x, y, backend="dask", client=client, **kw)
    else:  # leave-one-out in shards of 2,048 codes: the symmetric engine's keys
        monkeypatch.setattr(sharded, "on_column_grid", lambda n_ref: True)
        x, y = x[:5000], y[:5000]
        res = ee.evaluate(x, y, metrics=WINDOWS, shards=3, progress=False)
        local_run = ee.evaluate(x, y, metrics=WINDOWS, progress=False)
        for m in WINDOWS:
            np.testing.assert_array_equal(res.per_query[m], local_run.per_query[m], err_msg=m)
        assert res.n_ties == local_run.n_ties
        return
    _, want = oracle.summary(xq, yq, x, y, metrics=METRICS, ref_includes_query=True)
    for m in METRICS:
        np.testing.assert_allclose(res.per_query[m], want[m], rtol=1e-12, atol=0, err_msg=m)
        np.testing.assert_array_equal(res.per_query[m], local_run.per_query[m], err_msg=m)
    assert res.n_ties == local_run.n_ties and res.n_ties["precision_at_1"] > 0


@pytest.mark.parametrize("distance", ["euclidean", "inner_product", "cosine"])
@pytest.mark.parametrize("loo", [False, True])
def test_binary_codes_on_the_torch_backend_take_exact_keys(distance, loo, no_float64, monkeypatch):
    # the torch backend (here on the CPU, float32 products) takes the codes' keys as exact too:
    # no float64 decision, the local engine's values and tie flags bit for bit
    pytest.importorskip("torch")
    import embedeval.search.torch_backend as torch_backend

    # this backend's own pipeline (what a GPU runs), not the local deep engine the CPU takes
    monkeypatch.setattr(torch_backend, "_local_deep", lambda task, device: False)
    x = _codes(600, 12, seed=10)
    y = np.random.default_rng(11).integers(0, 100 if loo else 8, 600)  # loo: shallow windows
    if loo:  # the symmetric engine takes sets without identical rows: 20-bit codes, distinct
        x = np.unique(_codes(700, 20, seed=12), axis=0)[:600]
        assert len(x) == 600
    args = (x, y) if loo else (x[:100], y[:100], x[100:], y[100:])
    # leave-one-out windows with no label threshold (mrr): the local symmetric engine
    metrics = [m for m in WINDOWS if m != "mrr"] if loo else METRICS
    kw = dict(metrics=metrics, distance=distance, progress=False)
    res = ee.evaluate(*args, backend="torch", device="cpu", **kw)
    local_run = ee.evaluate(*args, **kw)
    for m in metrics:
        np.testing.assert_array_equal(res.per_query[m], local_run.per_query[m], err_msg=m)
    assert res.n_ties == local_run.n_ties and res.n_ties["precision_at_1"] > 0
    assert res.settings["torch"]["engine"] == ("local symmetric" if loo else "whole rows")
    if not loo and distance != "cosine":  # (the oracle's cosine rounds exact ties apart)
        _, want = oracle.summary(*args, metrics=METRICS, distance=distance)
        for m in METRICS:
            np.testing.assert_allclose(res.per_query[m], want[m], rtol=1e-12, atol=0, err_msg=m)


@pytest.mark.parametrize("distance", ["euclidean", "inner_product"])
@pytest.mark.parametrize("backend", ["local", "torch"])
def test_neighbors_of_binary_codes_take_exact_keys(distance, backend, monkeypatch):
    # k nearest codes: every tie at the k-th distance ranked by index with no float64 decision
    # (every bound zero), against a stable sort of float64 distances; the distances reported
    # are those values.  The torch backend on the CPU too, under precision="auto" (which
    # would otherwise filter in bfloat16 and decide its band in float64): no decision at all.
    kw = {}
    if backend == "torch":
        pytest.importorskip("torch")
        import embedeval.search.torch_backend as torch_backend

        kw = dict(backend="torch", device="cpu")
        for name in ("decide_task_block", "_device_decided"):
            monkeypatch.setattr(torch_backend, name, None)  # calling it fails the test
    original = decide.decide

    def zero_bounds_only(block, xq, xb, distance, bounds, *args, **kwargs):
        assert not np.any(bounds), "exact keys need no float64 decision"
        return original(block, xq, xb, distance, bounds, *args, **kwargs)

    monkeypatch.setattr(decide, "decide", zero_bounds_only)
    x = _codes(3000, 12, seed=13)
    q = _codes(50, 12, seed=14)
    dist, idx = ee.neighbors(q, 15, x, distance=distance, **kw)
    x64, q64 = x.astype(np.float64), q.astype(np.float64)
    for i in range(len(q)):
        if distance == "euclidean":
            d = np.sqrt(((x64 - q64[i]) ** 2).sum(axis=1))
            order = np.argsort(d, kind="stable")[:15]
        else:
            d = x64 @ q64[i]
            order = np.argsort(-d, kind="stable")[:15]
        assert idx[i].tolist() == order.tolist(), i
        np.testing.assert_array_equal(dist[i], d[order].astype(np.float32))


def test_torch_auto_precision_takes_exact_float32_keys_on_the_cpu(no_float64):
    # precision="auto" on a CPU would filter a shallow search in bfloat16 (a band to decide);
    # binary codes take the exact float32 keys instead: no float64 decision, the local values
    pytest.importorskip("torch")
    x = _codes(2000, 16, seed=15)
    y = np.random.default_rng(16).integers(0, 20, 2000)
    kw = dict(metrics=["precision_at_1", "recall_at_5"], k=5, progress=False)
    res = ee.evaluate(x[:200], y[:200], x[200:], y[200:], backend="torch", device="cpu",
                      precision="auto", **kw)  # fmt: skip
    local_run = ee.evaluate(x[:200], y[:200], x[200:], y[200:], **kw)
    assert res.settings["torch"]["precision"] == "float32"
    for m in kw["metrics"]:
        np.testing.assert_array_equal(res.per_query[m], local_run.per_query[m], err_msg=m)
    assert res.n_ties == local_run.n_ties
