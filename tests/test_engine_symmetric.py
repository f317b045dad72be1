"""The symmetric leave-one-out engine (each product computed once): the brute-force oracle, the
one-sided engine on well-separated data, and bit-identity across threads and backends."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import embedeval.engine.symmetric as sym
import embedeval.search.local as engine
from embedeval import evaluate
from embedeval.engine.candidates import from_sortable_bits, sortable_bits
from embedeval.engine.exact import PreparedSearch
from tests import oracle

METRICS = ["precision_at_1", "r_precision", "map_at_r", "recall_at_5", "precision_at_3"]


def _same(a, b):
    assert a.per_query.keys() == b.per_query.keys()
    for name in a.per_query:
        np.testing.assert_array_equal(a.per_query[name], b.per_query[name], err_msg=name)
    assert a.n_ties == b.n_ties


def _one_sided(monkeypatch):
    """Force leave-one-out through the one-sided engine (the path before this engine)."""
    monkeypatch.setattr(engine, "uses_symmetric_engine", lambda task: False)


def _float64_decision(monkeypatch):
    """Keep small-integer data on the float64 decision (exact float32 keys not detected)."""
    monkeypatch.setattr(engine, "with_exact_keys", lambda task: task)


def _distinct_grid(seed, n, dim, low=-3, high=4):
    """Distinct small-integer points: every key is an exact float32 integer, so distance ties
    are exact and the oracle's float64 order is the engine's, yet no two rows are identical."""
    rng = np.random.default_rng(seed)
    x = np.unique(rng.integers(low, high, size=(4 * n, dim)), axis=0)
    x = x[rng.permutation(len(x))[:n]].astype(np.float32)
    assert len(x) == n
    return x


def _separated(seed, n, dim=16, n_classes=40):
    """Real-valued clusters far apart relative to their spread: no near-ties decide a value."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, n)
    centers = 10 * rng.standard_normal((n_classes, dim))
    x = (centers[y] + 0.5 * rng.standard_normal((n, dim))).astype(np.float32)
    return x, y


def _check_oracle(x, y, distance="euclidean", **kw):
    got = evaluate(x, y, metrics=METRICS, distance=distance, progress=False, **kw)
    qg = kw.get("query_groups")
    _, expected, _ = oracle.evaluate(x, y, metrics=METRICS, distance=distance, qg=qg, rg=qg)
    for m in METRICS:
        np.testing.assert_allclose(got.per_query[m], expected[m], rtol=0, atol=1e-12, err_msg=m)
    return got


@pytest.mark.parametrize("distance", ["euclidean", "inner_product"])
@pytest.mark.parametrize("exact_keys", [True, False])
def test_exact_ties_on_distinct_grid_points_match_the_oracle(monkeypatch, distance, exact_keys):
    # 1,500 distinct integer points in 4-D: two tiles, exact ties everywhere (ranked by index),
    # with the float32 keys taken as exact or decided in float64.
    if not exact_keys:
        _float64_decision(monkeypatch)
    x = _distinct_grid(0, 1500, 4)
    y = np.random.default_rng(1).integers(0, 30, len(x))
    got = _check_oracle(x, y, distance)
    assert got.n_ties["map_at_r"] > 0  # ties do decide values here


def test_identical_rows_take_the_one_sided_engine_and_match_the_oracle(monkeypatch):
    x = _distinct_grid(2, 1200, 4)
    x[700:760] = x[:60]  # exact duplicates must stay exact ties
    y = np.random.default_rng(3).integers(0, 25, len(x))

    def refuse(*args, **kwargs):
        raise AssertionError("identical rows must take the one-sided engine")

    monkeypatch.setattr(engine, "symmetric_blocks", refuse)
    _check_oracle(x, y)


@pytest.mark.parametrize("n", [2, 3, 17, 1023, 1024, 1025, 2100])
@pytest.mark.parametrize("exact_keys", [True, False])
def test_odd_sizes_match_the_oracle(monkeypatch, n, exact_keys):
    # n = 2 (one pair), smaller than a tile, exactly a tile, one past it, several tiles.
    if not exact_keys:
        _float64_decision(monkeypatch)
    x = _distinct_grid(n, n, 6)
    y = np.random.default_rng(n).integers(0, max(1, n // 6), n)
    _check_oracle(x, y)


@pytest.mark.parametrize("exact_keys", [True, False])
def test_groups_match_the_oracle(monkeypatch, exact_keys):
    if not exact_keys:
        _float64_decision(monkeypatch)
    x = _distinct_grid(5, 1300, 5)
    rng = np.random.default_rng(6)
    y, g = rng.integers(0, 20, len(x)), rng.integers(0, 50, len(x))
    _check_oracle(x, y, query_groups=g)


@pytest.mark.parametrize("distance", ["euclidean", "cosine", "inner_product"])
def test_equal_to_the_one_sided_engine_on_well_separated_data(monkeypatch, distance):
    x, y = _separated(8, 2600)
    sym_run = evaluate(x, y, metrics=METRICS, distance=distance, progress=False)
    split = evaluate(
        x, y, x, y, ref_includes_query=True, metrics=METRICS, distance=distance, progress=False
    )
    _one_sided(monkeypatch)
    before = evaluate(x, y, metrics=METRICS, distance=distance, progress=False)
    for other in (split, before):
        _same(sym_run, other)
        assert sym_run.metrics == other.metrics


def test_threads_and_memory_budget_do_not_change_a_bit():
    # Real-valued data (rounding matters) in several tiles; one thread, two threads, and a
    # budget so small that far tile pairs are multiplied once per side.
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3100, 12)).astype(np.float32)
    y = rng.integers(0, 40, len(x))  # R ~ 77: deep enough for many near-ties
    runs = [
        evaluate(x, y, metrics=METRICS, n_threads=t, memory_budget=b, progress=False)
        for t, b in ((1, 2**28), (2, 2**28), (2, 2**20))
    ]
    assert sym.stripe_window(np.full(3100, 78), 2**20) == 1
    for other in runs[1:]:
        _same(runs[0], other)


def test_short_thresholds_are_redone_over_every_reference(monkeypatch):
    x, y = _separated(12, 1500)
    expected = evaluate(x, y, metrics=METRICS, progress=False)
    real = sym.sample_thresholds

    def too_low(*args):
        tau = real(*args)
        tau[::3] = -1e30  # no candidate at all: these queries must be redone
        return tau

    monkeypatch.setattr(sym, "sample_thresholds", too_low)
    _same(evaluate(x, y, metrics=METRICS, progress=False), expected)


@pytest.mark.parametrize("exact_keys", [False, True])
def test_thresholds_short_by_less_than_the_band_are_redone(monkeypatch, exact_keys):
    # A subsample threshold one float32 step below the query's depth-th key still keeps that
    # many keys once widened by the keys' bound, but not every key up to the depth-th one
    # widened, which the float64 decision reads: such a query is redone over every reference.
    # Small-integer rows make every key an exact integer, so the depth-th key is known here.
    # Taken as exact, the keys have no band: such a query holds too few keys and is redone
    # for that, once (it then holds every reference: not again for its threshold).
    if not exact_keys:
        _float64_decision(monkeypatch)
    x = _distinct_grid(21, 1200, 6)
    y = np.random.default_rng(21).integers(0, 30, 1200)
    x64 = x.astype(np.float64)
    keys = (x64 * x64).sum(1)[None, :] - 2.0 * x64 @ x64.T  # the key: ||r||^2 - 2 q.r
    np.fill_diagonal(keys, np.inf)
    real, redone = sym.sample_thresholds, []

    def one_step_low(sample_keys, start, need, *rest):
        tau = real(sample_keys, start, need, *rest)
        kth = np.sort(keys[start : start + need.size], axis=1)[np.arange(need.size), need - 1]
        tau[::2] = np.nextafter(kth.astype(np.float32), np.float32(-np.inf))[::2]
        return tau

    redo = sym._redo

    def spy(plan, q0, rows):
        redone.extend((q0 + rows).tolist())
        return redo(plan, q0, rows)

    monkeypatch.setattr(sym, "sample_thresholds", one_step_low)
    monkeypatch.setattr(sym, "_redo", spy)
    _check_oracle(x, y)  # the float64 brute force (exact ties among these keys by index)
    assert sorted(redone) == list(range(0, 1200, 2))


def test_canonical_keys_of_i_j_and_j_i_come_from_one_product():
    # Both keys of a pair come from one product entry: the entry of the lower tile's row and
    # the higher tile's column (on a diagonal tile, the upper triangle), less the query's own
    # squared norm (Euclidean) or as it is (cosine).
    rng = np.random.default_rng(13)
    x = rng.standard_normal((2300, 24)).astype(np.float32)
    rows = np.array([0, 5, 1023, 1024, 2299])
    t = sym.TILE
    for distance in ("euclidean", "cosine"):
        whole = sym.SymmetricSet.from_search(PreparedSearch.build(x, x, distance), distance)
        k = sym.canonical_keys(whole, rows, 0, 2300)
        for i, j in [(0, 1), (0, 2), (1, 2), (2, 3), (3, 4), (0, 4)]:
            lo, hi = rows[i], rows[j]  # lo < hi
            entry = whole.product(lo // t, hi // t)[lo % t, hi % t]
            own = np.float32(0) if whole.sq is None else whole.sq
            assert k[i, hi] == (entry if whole.sq is None else entry - own[lo])
            assert k[j, lo] == (entry if whole.sq is None else entry - own[hi])
        ref = oracle.pairwise(x[rows], x, distance)
        want = (
            ref if distance == "cosine" else ref**2 - (x[rows].astype(float) ** 2).sum(1)[:, None]
        )
        np.testing.assert_allclose(k, want, rtol=0, atol=1e-4)


def test_schedule_multiplies_every_pair_once_per_side():
    for n_tiles, window in ((1, 1), (4, 1), (5, 2), (6, 6)):
        sides = {}
        for a, b, s in sym.schedule(n_tiles, window):
            assert a <= b
            for side in s:
                key = (a, b, side) if a != b or side == "r" else None
                if key:
                    assert key not in sides
                    sides[key] = True
        want = {(a, b, s) for a in range(n_tiles) for b in range(a, n_tiles) for s in "rc"}
        want -= {(a, a, "c") for a in range(n_tiles)}
        assert set(sides) == want


def test_local_sharded_and_dask_are_bit_identical_on_leave_one_out():
    # 33,000 rows: more than 16 column tiles of 2,048, so the sharded backend splits the set.
    rng = np.random.default_rng(21)
    x = rng.standard_normal((33_000, 6)).astype(np.float32)
    y = rng.integers(0, 3000, len(x))
    g = rng.integers(0, 3000, len(x))
    kw = dict(metrics=["precision_at_1", "map_at_r", "recall_at_10"], progress=False)
    for extra in ({}, {"query_groups": g}):
        local = evaluate(x, y, **kw, **extra)
        assert local.n_ties["precision_at_1"] >= 0
        _same(local, evaluate(x, y, shards=3, **kw, **extra))


def test_sharded_leave_one_out_sees_an_array_changed_in_place():
    # The sharded backend prepares the set's factors once per evaluation: a second evaluation
    # of the same array object, changed in place, must not reuse the first one's.
    rng = np.random.default_rng(25)
    x = rng.standard_normal((33_000, 6)).astype(np.float32)
    y = rng.integers(0, 3000, len(x))
    kw = dict(metrics=["precision_at_1", "map_at_r"], progress=False)
    evaluate(x, y, shards=3, **kw)
    x[:] = rng.standard_normal(x.shape).astype(np.float32)
    _same(evaluate(x, y, **kw), evaluate(x, y, shards=3, **kw))
    assert not sym._SETS  # nothing kept once the evaluations are over


def test_dask_is_bit_identical_on_leave_one_out():
    distributed = pytest.importorskip("distributed")
    rng = np.random.default_rng(22)
    x = rng.standard_normal((2500, 10)).astype(np.float32)
    y = rng.integers(0, 30, len(x))
    kw = dict(metrics=METRICS, progress=False)
    with distributed.Client(
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False)
    ) as client:
        _same(evaluate(x, y, **kw), evaluate(x, y, backend="dask", client=client, **kw))


def test_memory_stays_far_below_the_distance_matrix():
    rng = np.random.default_rng(23)
    n = 6000
    x = rng.standard_normal((n, 16)).astype(np.float32)
    y = rng.integers(0, 600, n)
    tracemalloc.start()
    try:
        evaluate(x, y, metrics=METRICS, progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < n * n * 4 / 4  # a quarter of one float32 n x n matrix


def test_deep_rankings_take_the_one_sided_engine(monkeypatch):
    # 5 classes of 900: MAP@R needs 900 of 4,500 rows per query, above 1/32 of the set.
    rng = np.random.default_rng(24)
    x = rng.standard_normal((4500, 8)).astype(np.float32)
    y = np.repeat(np.arange(5), 900)

    def refuse(*args, **kwargs):
        raise AssertionError("deep rankings must take the one-sided engine")

    monkeypatch.setattr(engine, "symmetric_blocks", refuse)
    got = evaluate(x, y, metrics=["map_at_r"], progress=False)
    assert got.n_queries == 4500


def test_tighten_lowers_thresholds_to_the_need_th_key_and_keeps_its_ties():
    # One tile of 3 queries with hand-made candidate codes (row, key, reference): query 0 needs
    # 2 and holds keys 5, 1, 3, 3 -> its threshold becomes 3 and both 3s stay (a tie); query 1
    # needs 3 but holds 2 -> unchanged; query 2 needs 1 and holds 7, 2 -> 2.
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    whole = sym.SymmetricSet.from_search(PreparedSearch.build(x, x, "cosine"), "cosine")
    tau = np.full(3, 100.0, dtype=np.float32)
    plan = sym._Plan(None, whole, np.array([2, 3, 1]), tau, tau.copy(), None, col_bits=4)
    rows = np.array([0, 0, 0, 0, 1, 1, 2, 2])
    keys = np.array([5, 1, 3, 3, 4, 6, 7, 2], dtype=np.float32)
    refs = np.array([1, 2, 3, 4, 5, 6, 7, 8])
    codes = (
        (rows.astype(np.uint64) << np.uint64(36))
        | (sortable_bits(keys).astype(np.uint64) << np.uint64(4))
        | refs.astype(np.uint64)
    )
    kept = sym.tighten(plan, 0, codes.copy())
    assert plan.tau.tolist() == [3.0, 100.0, 2.0]
    assert plan.limit.tolist() == [3.0, 100.0, 2.0]  # cosine: the entry is the key
    assert ((kept >> np.uint64(36)).tolist(), (kept & np.uint64(15)).tolist()) == (
        [0, 0, 0, 1, 1, 2],
        [2, 3, 4, 5, 6, 8],
    )


@pytest.mark.parametrize("slack", [0, 10**9])
@pytest.mark.parametrize("exact_keys", [True, False])
def test_tightened_thresholds_keep_the_oracle_values_with_exact_ties(
    monkeypatch, slack, exact_keys
):
    # 5,000 distinct integer points in 6-D (five tiles, exact distance ties everywhere), about
    # 50 per class: thresholds tightened after every product (slack 0) or never (slack huge)
    # give the oracle's values, ties ranked by index; float32 keys taken as exact (no band) or
    # decided in float64.
    if not exact_keys:
        _float64_decision(monkeypatch)
    calls = []
    real = sym.tighten
    monkeypatch.setattr(sym, "_SLACK", slack)
    monkeypatch.setattr(sym, "tighten", lambda *a: calls.append(1) or real(*a))
    # A threshold tightened too far (or ties at it dropped) would leave a query short of its
    # depth, and the redo over every reference would hide it: none may happen here.
    monkeypatch.setattr(sym, "_redo", lambda *a: pytest.fail("a query came out short"))
    x = _distinct_grid(31, 5000, 6)
    y = np.random.default_rng(32).integers(0, 100, len(x))
    got = _check_oracle(x, y)
    assert got.n_ties["map_at_r"] > 0
    assert (len(calls) > 0) == (slack == 0)


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_tighten_matches_a_plain_loop_on_random_codes(distance):
    # Random codes with ties, +-0.0, rows short of their need, need 0 (tau -inf) and KEY_MAX,
    # against a per-row loop: tau, the entry limits and the kept codes.
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(2, 3000))
        tile = int(rng.integers(0, -(-n // sym.TILE)))
        m = min(sym.TILE, n - tile * sym.TILE)
        x = rng.standard_normal((n, 3)).astype(np.float32)
        whole = sym.SymmetricSet.from_search(PreparedSearch.build(x[:1], x, distance), distance)
        col_bits = max(1, int(n - 1).bit_length())
        need = rng.integers(0, 6, n)
        tau = rng.choice(np.array([3.4e38, 3.0, 0.5, -0.25], np.float32), n)
        tau[need <= 0] = -np.inf
        limit = sym.entry_limits(tau, whole.sq)
        plan = sym._Plan(None, whole, need, tau.copy(), limit.copy(), None, col_bits)
        rows = rng.integers(0, m, 150)
        keys = rng.choice(np.array([-1, -0.0, 0, 0.25, 0.5, 1, 2, 3], np.float32), 150)
        ok = keys <= tau[tile * sym.TILE + rows]
        rows, keys = rows[ok], keys[ok]
        refs = rng.choice(n, rows.size, replace=rows.size > n)
        codes = (
            (rows.astype(np.uint64) << np.uint64(32 + col_bits))
            | (sortable_bits(keys).astype(np.uint64) << np.uint64(col_bits))
            | refs.astype(np.uint64)
        )
        kept = sym.tighten(plan, tile, codes.copy())
        want = tau.copy()
        for r in range(m):
            q, sorted_keys = tile * sym.TILE + r, np.sort(keys[rows == r])
            if need[q] > 0 and sorted_keys.size >= need[q]:
                want[q] = min(want[q], sorted_keys[need[q] - 1] + np.float32(0))
        assert np.array_equal(plan.tau, want)
        changed = want != tau
        sq = None if whole.sq is None else whole.sq[changed]
        limit[changed] = sym.entry_limits(want[changed], sq)
        assert np.array_equal(plan.limit, limit)
        assert np.array_equal(kept, np.sort(codes[keys <= want[tile * sym.TILE + rows]]))


def test_tightening_while_products_finish_out_of_order_changes_no_value(monkeypatch):
    # Products finish in a shuffled order while thresholds are tightened after every add.
    import random
    import time

    rng = np.random.default_rng(5)
    x = rng.standard_normal((5000, 10)).astype(np.float32)
    y = rng.integers(0, 120, len(x))
    monkeypatch.setattr(sym, "_SLACK", 10**9)
    want = evaluate(x, y, metrics=METRICS, n_threads=1, progress=False)
    monkeypatch.setattr(sym, "_SLACK", 0)
    real = sym._tile_hits
    delays = random.Random(0)
    monkeypatch.setattr(
        sym, "_tile_hits", lambda *a: time.sleep(delays.random() * 0.003) or real(*a)
    )
    monkeypatch.setattr(sym, "_redo", lambda *a: pytest.fail("a query came out short"))
    for threads in (2, 4):
        _same(want, evaluate(x, y, metrics=METRICS, n_threads=threads, progress=False))


@pytest.mark.parametrize("distance", ["euclidean", "cosine", "inner_product"])
def test_factors_built_from_rows_equal_those_of_a_prepared_search(distance):
    # Every backend must derive the same canonical products: the engine builds the factors
    # straight from the rows, the Dask and torch backends from a prepared search.
    rng = np.random.default_rng(41)
    base = rng.standard_normal((700, 40)).astype(np.float32)
    for x in (base, base[:, ::2], np.asfortranarray(base)):  # C, strided and Fortran order
        a = sym.SymmetricSet.from_rows(x, distance)
        b = sym.SymmetricSet.from_search(PreparedSearch.build(x[:1], x, distance), distance)
        np.testing.assert_array_equal(a.left, b.left)
        np.testing.assert_array_equal(a.right, b.right)
        assert (a.sq is None) == (b.sq is None)
        if a.sq is not None:
            np.testing.assert_array_equal(a.sq, b.sq)


@pytest.mark.parametrize("n", [257, 1030, 1300])
@pytest.mark.parametrize("distance", ["euclidean", "cosine", "inner_product"])
def test_engine_tiles_give_every_canonical_key_once(n, distance):
    # With every entry passing (tau = +inf) the engine's tiles must hand out each off-diagonal
    # key exactly once and equal to canonical_keys; its product buffer starts as NaN, so a read
    # outside a diagonal tile's strips would show as a wrong or missing key.
    x = np.random.default_rng(n).standard_normal((n, 10)).astype(np.float32)[:, ::2]
    whole = sym.SymmetricSet.from_rows(x, distance)
    col_bits = max(1, int(n - 1).bit_length())
    inf = np.full(n, np.inf, dtype=np.float32)
    plan = sym._Plan(None, whole, np.ones(n, int), inf.copy(), inf.copy(), None, col_bits)
    plan.local.p = np.full(sym.TILE * sym.TILE, np.nan, dtype=np.float32)
    plan.local.mask = np.empty(sym.TILE * sym.TILE, dtype=bool)
    got = np.full((n, n), np.nan, dtype=np.float32)
    for a, b, sides in sym.schedule(plan.n_tiles, 1):
        for tile, codes in zip((a, b), sym._tile_hits(plan, a, b, sides), strict=True):
            if codes is None:
                continue
            q = (codes >> np.uint64(32 + col_bits)).astype(np.int64) + tile * sym.TILE
            bits = ((codes >> np.uint64(col_bits)) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
            r = (codes & np.uint64((1 << col_bits) - 1)).astype(np.int64)
            assert np.isnan(got[q, r]).all()  # each entry once
            got[q, r] = from_sortable_bits(bits)
    want = sym.canonical_keys(whole, np.arange(n), 0, n)
    off = ~np.eye(n, dtype=bool)
    assert np.array_equal(got.view(np.uint32)[off], want.view(np.uint32)[off])


@pytest.mark.parametrize("distance", ["euclidean", "inner_product"])
@pytest.mark.parametrize("exact_keys", [True, False])
def test_nearest_neighbours_across_strip_boundaries_match_the_oracle(
    monkeypatch, distance, exact_keys
):
    if not exact_keys:
        _float64_decision(monkeypatch)
    # Each row at a strip or tile boundary gets its nearest neighbour (same class) in the next
    # row, on the other side of the boundary.
    n = 2100
    x = 10 * _distinct_grid(99, n, 4)
    y = np.zeros(n, int)
    y[::2] = 1
    for r in (255, 511, 767, 1023, 1024 + 255, 2047):
        x[r + 1] = x[r]
        x[r + 1, 0] += 1
        y[r + 1] = y[r]
    _check_oracle(x, y, distance)
