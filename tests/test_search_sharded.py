"""Sharded exact search (``evaluate(..., shards=...)``): bit-identical to the local engine.

Two kinds of data: Gaussian floats, where BLAS rounding depends on product shapes (so a shard
split that multiplied differently shaped products would show up as different bits), and
small-integer grids, where every key is an exact integer, exact ties are everywhere, and a naive
float64 brute-force loop written below is an exact oracle.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import embedeval.search.sharded as sharded
from embedeval import evaluate
from embedeval.engine.exact import PreparedSearch, grid_keys
from embedeval.utils.errors import FileFormatError, InputError, InputTypeError

N_REF = 40_000  # above 16 tiles of 2048 columns: the engine multiplies in tiles, shards apply
DEEP_FITS = sharded.deep_fits_in_memory


@pytest.fixture(autouse=True)
def shards_for_deep_rankings_too(monkeypatch):
    # Every test here is about reading the reference shard by shard, which full-depth map on
    # references this small would skip for the local deep engine (see the test right below).
    monkeypatch.setattr(sharded, "deep_fits_in_memory", lambda task, budget: False)


@pytest.mark.parametrize(("budget", "whole"), [(2**28, True), (2**21, False)])
def test_deep_rankings_search_the_reference_whole_when_it_fits_the_budget(
    gauss, monkeypatch, budget, whole
):
    # 40,000 x 8 references take 2.56 MB in float64: within 256 MiB they are ranked by the
    # local deep engine, above a 2 MiB budget by the deep engine over keys read shard by
    # shard; a window metric, or full-depth map over a few large classes, by the shards' merge
    monkeypatch.setattr(sharded, "deep_fits_in_memory", DEEP_FITS)
    calls = {"_sharded_blocks": [], "_sharded_deep_blocks": []}
    for name, seen in calls.items():
        real = getattr(sharded, name)

        def spy(*args, real=real, seen=seen):
            seen.append(args)
            yield from real(*args)

        monkeypatch.setattr(sharded, name, spy)
    x, y, _ = gauss
    kw = dict(metrics=["map", "precision_at_1"], memory_budget=budget, progress=False)
    local = evaluate(x[:200], y[:200], x, y, **kw)
    _same(local, evaluate(x[:200], y[:200], x, y, shards=3, **kw))
    assert bool(calls["_sharded_deep_blocks"]) is not whole and not calls["_sharded_blocks"]
    evaluate(x[:200], y[:200], x, y, shards=3, metrics=["map_at_r"], memory_budget=budget)
    few = y % 3  # R_q about 13,000: the candidate engine locally, the merge here
    _same(evaluate(x[:50], few[:50], x, few, **kw),
          evaluate(x[:50], few[:50], x, few, shards=3, **kw))  # fmt: skip
    assert len(calls["_sharded_blocks"]) == 2


def _same(a, b):
    assert a.per_query.keys() == b.per_query.keys()
    for name in a.per_query:
        np.testing.assert_array_equal(a.per_query[name], b.per_query[name], err_msg=name)
    assert a.n_ties == b.n_ties
    assert a.metrics == b.metrics or all(
        (np.isnan(a.metrics[m]) and np.isnan(b.metrics[m])) or a.metrics[m] == b.metrics[m]
        for m in a.metrics
    )


@pytest.fixture(scope="module")
def gauss():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((N_REF, 8)).astype(np.float32)
    x[300:400] = x[:100]  # exact duplicates: tied keys
    y = rng.integers(0, 300, N_REF)
    g = rng.integers(0, 40, N_REF)
    return x, y, g


@pytest.fixture(scope="module")
def grid():
    rng = np.random.default_rng(3)
    x = rng.integers(-2, 3, size=(N_REF, 4)).astype(np.float32)  # 625 distinct points: ties
    y = rng.integers(0, 50, N_REF)
    return x, y


def test_blas_products_differ_by_shape_but_grid_keys_do_not(gauss):
    # The reason for the tile grid: the same dot products in differently shaped products are
    # not guaranteed to round alike; grid_keys makes a shard's keys equal the whole's.
    x, _, _ = gauss
    whole = PreparedSearch.build(x[:600], x, "euclidean")
    a, b = 2048 * 7, 2048 * 13
    shard = PreparedSearch.build(x[:600], x[a:b], "euclidean")
    for rows in (slice(0, 512), slice(512, 600)):
        full = grid_keys(whole, rows, 0, N_REF)
        part = np.concatenate(
            [shard.keys(rows, slice(c, c + 2048)) for c in range(0, b - a, 2048)], axis=1
        )
        assert np.array_equal(full[:, a:b], part)


@pytest.mark.parametrize("shards", [2, 3, 7])
def test_int_shards_equal_local_bit_for_bit(gauss, shards):
    x, y, _ = gauss
    kw = dict(
        metrics=["precision_at_1", "r_precision", "map_at_r", "recall_at_5", "precision_at_3"]
    )
    local = evaluate(x[:1500], y[:1500], x, y, ref_includes_query=True, **kw)
    sharded = evaluate(x[:1500], y[:1500], x, y, ref_includes_query=True, shards=shards, **kw)
    _same(local, sharded)
    assert local.n_ties["map_at_r"] > 0  # the duplicates do create ties


def test_leave_one_out_with_groups_equals_local(gauss):
    x, y, g = gauss
    q = x[:20000]
    local = evaluate(q, y[:20000], query_groups=g[:20000], metrics=["precision_at_1", "map_at_r"])
    sharded = evaluate(
        q, y[:20000], query_groups=g[:20000], metrics=["precision_at_1", "map_at_r"], shards=2
    )
    _same(local, sharded)


@pytest.mark.parametrize("distance", ["cosine", "inner_product"])
def test_full_depth_map_and_mrr_equal_local(gauss, distance):
    # k=None for map/mrr: the global farthest / nearest same-label key sets the threshold.
    x, y, _ = gauss
    kw = dict(metrics=["map", "mrr"], distance=distance)
    local = evaluate(x[:250], y[:250], x, y, **kw)
    sharded = evaluate(x[:250], y[:250], x, y, shards=4, **kw)
    _same(local, sharded)


def test_int_k_and_groups_against_reference_equal_local(gauss):
    x, y, g = gauss
    kw = dict(k=20, metrics=["map_at_r", "r_precision", "map", "mrr", "recall_at_10"])
    args = (x[:800], y[:800], x, y)
    with pytest.warns(UserWarning):
        local = evaluate(*args, query_groups=g[:800], reference_groups=g, **kw)
    with pytest.warns(UserWarning):
        sharded = evaluate(*args, query_groups=g[:800], reference_groups=g, shards=5, **kw)
    _same(local, sharded)


def test_list_of_arrays_and_memmapped_files_equal_local(gauss, tmp_path):
    x, y, _ = gauss
    cuts = [0, 5000, 23000, 31000, N_REF]  # not on the 2048 grid: re-cut internally
    paths = []
    for i, (a, b) in enumerate(itertools.pairwise(cuts)):
        p = tmp_path / f"shard{i}.npy"
        np.save(p, x[a:b])
        paths.append(str(p))
    local = evaluate(x[:700], y[:700], x, y)
    from_files = evaluate(x[:700], y[:700], x, y, shards=paths)
    arrays = [np.load(p, mmap_mode="r") for p in paths]
    from_arrays = evaluate(x[:700], y[:700], x, y, shards=arrays)
    _same(local, from_files)
    _same(local, from_arrays)


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_deep_rankings_from_shard_files_match_the_oracle(tmp_path, distance):
    # Full-depth map and mINP over a reference in memory-mapped pieces, beyond a 1 MiB budget
    # (several query super-blocks, each reading every piece): identical rows across pieces,
    # some relabelled (exact ties between relevant and non-relevant references), a far-off
    # common offset (Euclidean: centred), groups; against a brute force.
    from tests import oracle

    rng = np.random.default_rng(17)
    x = rng.standard_normal((N_REF, 6)).astype(np.float32)
    x[36_000:] = x[:4_000]  # copies in the last piece of rows in the first
    y = rng.integers(0, 200, N_REF)
    y[38_000:] = rng.integers(0, 200, 2_000)  # half of the copies relabelled
    if distance == "euclidean":
        x += np.float32(64)
    g = rng.integers(0, 30, N_REF)
    paths = []
    for i, (a, b) in enumerate(itertools.pairwise([0, 15_000, 29_000, N_REF])):
        paths.append(tmp_path / f"p{i}.npy")
        np.save(paths[-1], x[a:b])
    q = np.concatenate([x[:40], x[38_000:38_040]])
    qy, qg = np.concatenate([y[:40], y[38_000:38_040]]), np.concatenate([g[:40], g[38_000:38_040]])
    kw = dict(metrics=["map", "minp", "precision_at_1"], distance=distance, progress=False)
    groups = dict(query_groups=qg, reference_groups=g)
    got = evaluate(q, qy, x, y, shards=paths, memory_budget=2**20, block_size=16, **groups, **kw)
    _same(evaluate(q, qy, x, y, **groups, **kw), got)
    checked = ["map", "precision_at_1"]  # (mINP: against the local engine above)
    _, want = oracle.summary(q[::4], qy[::4], x, y, metrics=checked, distance=distance,
                             qg=qg[::4], rg=g)  # fmt: skip
    for m in checked:
        np.testing.assert_allclose(got.per_query[m][::4], want[m], rtol=1e-12, err_msg=m)


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_deep_rankings_in_shards_tie_identical_rows_exactly(distance):
    # multiples of 0.1 on a coarse grid (not integers): most rows have identical copies and
    # distances tie exactly; read shard by shard beyond a 1 MiB budget, each copy must take
    # its representative's key at the keys' own (float64) precision, or the copies fall out of
    # their ties; Euclidean against the brute force, cosine against the local engine
    from tests import oracle

    rng = np.random.default_rng(0)
    steps = np.float32([-5, -4, -3, -2, -1, 1, 2, 3, 4, 5])
    x = (rng.choice(steps, (33_000, 4)) * np.float32(0.1)).astype(np.float32)
    y = rng.integers(0, 10, 33_000)
    q, qy = x[:6] + np.float32(0.05), y[:6]
    kw = dict(metrics=["map"], distance=distance, memory_budget=2**20, progress=False)
    got = evaluate(q, qy, x, y, shards=2, **kw)
    _same(evaluate(q, qy, x, y, **kw), got)
    if distance == "euclidean":
        _, want = oracle.summary(q, qy, x, y, metrics=["map"])
        np.testing.assert_allclose(got.per_query["map"], want["map"], rtol=1e-12)


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_deep_leave_one_out_in_shards_matches_the_oracle(monkeypatch, distance):
    # leave-one-out full-depth map and mINP read shard by shard (3 shards of 2,048-row tiles,
    # forced on a set this small), with groups and identical rows under other labels
    from tests import oracle

    monkeypatch.setattr(sharded, "on_column_grid", lambda n_ref: True)
    rng = np.random.default_rng(19)
    x = rng.standard_normal((5000, 5)).astype(np.float32)
    x[4000:4400] = x[:400]
    y = rng.integers(0, 60, 5000)
    g = rng.integers(0, 25, 5000)
    kw = dict(metrics=["map", "minp", "precision_at_1"], distance=distance, query_groups=g,
              progress=False)  # fmt: skip
    got = evaluate(x, y, shards=3, memory_budget=2**22, **kw)
    _same(evaluate(x, y, **kw), got)
    if distance == "euclidean":
        few = np.r_[0:60, 4000:4060]  # each query's own row is in its group: excluded too
        _, want = oracle.summary(x[few], y[few], x, y, metrics=["map", "precision_at_1"],
                                 qg=g[few], rg=g)  # fmt: skip
        for m in ("map", "precision_at_1"):
            np.testing.assert_allclose(got.per_query[m][few], want[m], rtol=1e-12, err_msg=m)


def test_zero_rows_under_cosine_are_named_by_their_reference_row(gauss):
    x, y, _ = gauss
    x = x.copy()
    x[[20_000, 20_001, 30_000]] = 0
    for kw in (dict(metrics=["map"]), dict(metrics=["precision_at_1"])):
        with pytest.raises(InputError, match=r"3 row\(s\) of reference .*first at row 20000"):
            evaluate(x[:3], y[:3], x, y, shards=2, distance="cosine", **kw)


def test_small_reference_is_one_shard(gauss):
    x, y, _ = gauss
    local = evaluate(x[:3000], y[:3000])
    _same(local, evaluate(x[:3000], y[:3000], shards=3))
    _same(local, evaluate(x[:3000], y[:3000], shards=[x[:1000], x[1000:3000]]))


# ---- an independent oracle on exact-integer data


def _oracle(q, ql, r, rl, self_exclude):
    """Plain loop: float64 distances, stable sort by (distance, index), metrics by definition."""
    out = {"precision_at_1": [], "map_at_r": [], "r_precision": [], "map": [], "mrr": []}
    for i in range(len(q)):
        d = ((r.astype(np.float64) - q[i]) ** 2).sum(axis=1)
        idx = np.arange(len(r))
        keep = idx != i if self_exclude else np.ones(len(r), bool)
        order = idx[keep][np.lexsort((idx[keep], d[keep]))]
        rel = (rl[order] == ql[i]).astype(float)
        big_r = int(rel.sum())
        if big_r == 0:
            for v in out.values():
                v.append(np.nan)
            continue
        prec = np.cumsum(rel) / np.arange(1, len(rel) + 1)
        out["precision_at_1"].append(rel[0])
        out["r_precision"].append(rel[:big_r].sum() / big_r)
        out["map_at_r"].append((prec[:big_r] * rel[:big_r]).sum() / big_r)
        out["map"].append((prec * rel).sum() / big_r)
        out["mrr"].append(1.0 / (np.flatnonzero(rel)[0] + 1))
    return {k: np.array(v) for k, v in out.items()}


def test_oracle_on_hand_case():
    q = np.array([[0.0], [1.0], [3.0]])
    got = _oracle(q, np.array([0, 1, 0]), q, np.array([0, 1, 0]), True)
    # query 0: ranking 1 (b), 3 (a) -> P@1 0, MAP@R = 0, AP = (1/2)/1, RR = 1/2
    assert got["precision_at_1"][0] == 0 and got["map"][0] == 0.5 and got["mrr"][0] == 0.5
    assert np.isnan(got["map"][1])  # the only "1" is lone


@pytest.mark.parametrize("exact_keys", [True, False])
def test_ties_on_integer_grid_match_oracle(grid, exact_keys, monkeypatch):
    # exact_keys=False: the float32 keys of these integers are not taken as exact (the float64
    # decision orders their ties)
    if not exact_keys:
        import embedeval.search.sharded as sharded

        monkeypatch.setattr(sharded, "with_exact_keys", lambda task, reference=None: task)
    x, y = grid
    metrics = ["precision_at_1", "r_precision", "map_at_r", "map", "mrr"]
    res = evaluate(x[:40], y[:40], x, y, ref_includes_query=True, metrics=metrics, shards=3)
    want = _oracle(x[:40], y[:40], x, y, True)
    for name in metrics:
        np.testing.assert_allclose(res.per_query[name], want[name], rtol=1e-12, err_msg=name)
    assert res.n_ties["precision_at_1"] > 0


def test_progress_bar_counts_shards(gauss, capsys):
    x, y, _ = gauss
    evaluate(x[:50], y[:50], x, y, shards=2, progress=True, metrics=["precision_at_1"])
    assert "2/2 shard passes" in capsys.readouterr().err


# ---- bad input


def test_bad_shards_values(gauss, tmp_path):
    x, y, _ = gauss
    args = (x[:10], y[:10], x, y)
    with pytest.raises(InputError, match="shards must be >= 1"):
        evaluate(*args, shards=0)
    with pytest.raises(InputError, match="shards must be an integer"):
        evaluate(*args, shards=2.0)
    with pytest.raises(InputError, match="empty list"):
        evaluate(*args, shards=[])
    with pytest.raises(InputError, match="rows in total"):
        evaluate(*args, shards=[x[:100], x[100:200]])
    with pytest.raises(InputError, match=r"shape \(n_rows > 0, 8\)"):
        evaluate(*args, shards=[x[:, :4]])
    with pytest.raises(InputTypeError, match="numpy array or a .npy path"):
        evaluate(*args, shards=[x.tolist()])
    with pytest.raises(InputTypeError, match="numeric"):
        evaluate(*args, shards=[x.astype(object)])
    with pytest.raises(FileFormatError, match="not a .npy file"):
        evaluate(*args, shards=[str(tmp_path / "a.txt")])
    with pytest.raises(FileFormatError, match="no such file"):
        evaluate(*args, shards=[str(tmp_path / "missing.npy")])
    pickled = tmp_path / "obj.npy"
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(FileFormatError, match="unpickling"):
        evaluate(*args, shards=[str(pickled)])
    bad = x.copy()
    bad[N_REF - 5, 2] = np.nan
    with pytest.raises(InputError, match=f"first at reference row {N_REF - 5}"):
        evaluate(*args, shards=[bad])


def test_a_shard_with_an_integer_beyond_64_bits_is_named(gauss):
    x, y, _ = gauss
    piece = x.astype(object)
    piece[3, 1] = 2**70  # numpy keeps it as a Python object, not as a number it can hold
    with pytest.raises(InputTypeError, match=rf"shards\[0\] holds the integer {2**70}, beyond"):
        evaluate(x[:10], y[:10], x, y, shards=[piece])


def test_shards_that_are_not_the_reference_in_order_are_refused(gauss, tmp_path):
    x, y, _ = gauss
    args = (x[:10], y[:10], x, y)
    half = N_REF // 2
    with pytest.raises(InputError, match="shards.0. row 0 differs from reference row 0"):
        evaluate(*args, shards=[x[half:], x[:half]])
    other = x[half:].copy()
    other[half // 2] += 1.0  # the middle row of the second piece, from "another file"
    np.save(tmp_path / "b.npy", other)
    want = f"shards.1. row {half // 2} differs from reference row {half + half // 2}"
    with pytest.raises(InputError, match=want):
        evaluate(*args, shards=[x[:half], str(tmp_path / "b.npy")])


def test_bad_combinations(gauss):
    x, y, _ = gauss
    args = (x[:10], y[:10], x, y)
    with pytest.raises(InputError, match="index_params was given without index"):
        evaluate(*args, shards=2, index_params={"nprobe": 2})
    with pytest.raises(InputError, match="cannot be combined"):
        evaluate(*args, shards=2, index="Flat")
    with pytest.raises(InputError, match="client= is only used"):
        evaluate(*args, shards=2, client=object())
    with pytest.raises(InputError, match="block_size must be >= 1"):
        evaluate(*args, shards=2, block_size=0)
    gq = np.arange(10)
    gr = np.arange(N_REF) + 1  # the own row sits in another group than its query
    with pytest.raises(InputError, match="only supported by the local exact backend"):
        evaluate(*args, ref_includes_query=True, query_groups=gq, reference_groups=gr, shards=2)


def test_rows_whose_threshold_falls_short_are_redone_exactly(gauss, monkeypatch):
    # Force the rare case where the subsample threshold keeps too few candidates: every query
    # is then searched again over every valid reference of every shard.
    import embedeval.search.sharded as sharded

    x, y, g = gauss
    kw = dict(metrics=["precision_at_1", "map_at_r", "recall_at_10"])
    args = (x[:60], y[:60], x, y)
    local = evaluate(*args, query_groups=g[:60], reference_groups=g, memory_budget=2**20, **kw)

    def too_low(task, read, plan):
        return np.full(task.n_query, -np.finfo(np.float32).max, dtype=np.float32)

    monkeypatch.setattr(sharded, "_thresholds", too_low)
    small = sharded._super_blocks
    monkeypatch.setattr(sharded, "_super_blocks", lambda n, b, p, m: small(n, b, p, 2**12))
    redone = evaluate(
        *args, query_groups=g[:60], reference_groups=g, shards=3, memory_budget=2**20, **kw
    )
    _same(local, redone)


def test_query_super_blocks_under_a_small_budget_equal_local(gauss, monkeypatch):
    # Full-depth AP keeps most of each ranking until the last shard: a small budget splits the
    # queries into several super-blocks, each reading every shard.
    x, y, _ = gauss
    kw = dict(metrics=["map", "precision_at_1"], memory_budget=2**22)
    local = evaluate(x[:120], y[:120], x, y, **kw)
    sharded = evaluate(x[:120], y[:120], x, y, shards=2, progress=True, **kw)
    _same(local, sharded)


def test_a_group_covering_most_of_the_gallery_agrees_with_brute_force():
    # 40,000 references, all but 12 in the queries' group: the sampled depth cut-off is
    # infinite, which used to let excluded references into the local engine's map/mrr (values
    # far above 1) while the sharded backend filtered them: the two disagreed.
    rng = np.random.default_rng(5)
    x = rng.standard_normal((N_REF, 4)).astype(np.float32)
    y = rng.integers(0, 2, N_REF)
    g = np.zeros(N_REF, dtype=np.int64)
    g[rng.choice(N_REF, 12, replace=False)] = 1
    q = rng.standard_normal((6, 4)).astype(np.float32)
    qy, qg = np.array([0, 1, 0, 1, 0, 1]), np.zeros(6, dtype=np.int64)
    kw = dict(query_groups=qg, reference_groups=g, metrics=["map", "mrr", "r_precision"])
    local = evaluate(q, qy, x, y, **kw)
    sharded = evaluate(q, qy, x, y, shards=3, **kw)
    _same(local, sharded)
    keep = np.flatnonzero(g == 1)  # the only references the queries can see
    d = ((x[keep].astype(np.float64)[None] - q.astype(np.float64)[:, None]) ** 2).sum(-1)
    for i in range(6):
        order = keep[np.lexsort((keep, d[i]))]
        rel = y[order] == qy[i]
        hits = np.flatnonzero(rel)
        ap = np.mean(np.arange(1, hits.size + 1) / (hits + 1.0))
        assert local.per_query["map"][i] == pytest.approx(ap, rel=1e-9)
        assert local.per_query["mrr"][i] == pytest.approx(1.0 / (hits[0] + 1), rel=1e-9)
        assert local.per_query["r_precision"][i] == pytest.approx(rel[: hits.size].mean())


def test_huge_inputs_in_shard_files_rank_like_the_unscaled_data(gauss, tmp_path):
    # Times 2**70 the float32 keys overflow; the search scales by an exact power of two, also
    # for rows read from shard files, so values and ties equal those of the unscaled data.
    x, y, _ = gauss
    big = x * np.float32(2.0**70)
    paths = []
    for i, (a, b) in enumerate([(0, 15000), (15000, N_REF)]):
        paths.append(str(tmp_path / f"big{i}.npy"))
        np.save(paths[-1], big[a:b])
    kw = dict(metrics=["precision_at_1", "map_at_r"])
    _same(evaluate(x[:300], y[:300], x, y, **kw),
          evaluate(big[:300], y[:300], big, y, shards=paths, **kw))  # fmt: skip
