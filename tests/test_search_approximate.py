"""Approximate search (``evaluate(..., index=...)``) and its error report.

Exact-equivalent configurations ("Flat", IVF with nprobe = nlist) must reproduce exact results.
On small-integer data every squared distance is an exact integer for faiss and for the engine
alike, so equal distances are exact ties, both sides break them by reference index, and the
comparison can be bit for bit; a plain float64 loop written below is the independent oracle.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

faiss = pytest.importorskip("faiss", reason="approximate search needs faiss")

from embedeval import evaluate  # noqa: E402
from embedeval.search.approximate import train_index  # noqa: E402
from embedeval.utils.errors import InputError, InputTypeError  # noqa: E402

METRICS = ["precision_at_1", "r_precision", "map_at_r", "recall_at_5", "precision_at_3"]


@pytest.fixture(scope="module")
def grid():
    rng = np.random.default_rng(5)
    x = rng.integers(-3, 4, size=(4000, 6)).astype(np.float32)
    x[200:300] = x[:100]
    y = rng.integers(0, 40, 4000)
    g = rng.integers(0, 25, 4000)
    return x, y, g


@pytest.fixture(scope="module")
def clusters():
    # 20,000 vectors in 400 noisy clusters: an approximate index makes real mistakes.
    rng = np.random.default_rng(9)
    centers = rng.standard_normal((400, 32)).astype(np.float32)
    y = rng.integers(0, 400, 20_000)
    x = centers[y] + 0.9 * rng.standard_normal((20_000, 32)).astype(np.float32)
    return x.astype(np.float32), y


def _oracle_p1_mapr(x, y, rows, distance="euclidean"):
    """Plain loop over a few queries (leave-one-out): float64 distances (squared Euclidean, or
    minus the cosine of the float64 unit rows), ties by index."""
    x64 = x.astype(np.float64)
    if distance == "cosine":
        x64 = x64 / np.linalg.norm(x64, axis=1, keepdims=True)
    p1, mapr = [], []
    idx = np.arange(len(x))
    for i in rows:
        if distance == "cosine":
            d = -(x64 @ x64[i])
        else:
            d = ((x64 - x64[i]) ** 2).sum(axis=1)
        keep = idx != i
        order = idx[keep][np.lexsort((idx[keep], d[keep]))]
        rel = (y[order] == y[i]).astype(float)
        r = int(rel.sum())
        prec = np.cumsum(rel[:r]) / np.arange(1, r + 1)
        p1.append(rel[0])
        mapr.append((prec * rel[:r]).sum() / r)
    return np.array(p1), np.array(mapr)


def test_oracle_hand_case():
    x = np.array([[0.0], [1.0], [3.0], [4.0]], dtype=np.float32)
    y = np.array([0, 1, 0, 1])
    p1, mapr = _oracle_p1_mapr(x, y, [0, 3])
    # query 0 ranks 1 (b), 3 (a): P@1 0, MAP@R 0; query 3 ranks 3 (a), 1 (b): P@1 0, MAP@R 0
    assert p1.tolist() == [0.0, 0.0] and mapr.tolist() == [0.0, 0.0]


@pytest.mark.parametrize(("index", "params"), [("Flat", None), ("IVF16,Flat", {"nprobe": 16})])
def test_exact_equivalent_index_reproduces_exact(grid, index, params):
    x, y, _ = grid
    exact = evaluate(x, y, metrics=METRICS)
    approx = evaluate(x, y, metrics=METRICS, index=index, index_params=params, exact_sample=500)
    for name in METRICS:
        np.testing.assert_array_equal(approx.per_query[name], exact.per_query[name], name)
    assert approx.n_ties == exact.n_ties
    report = approx.approximation
    assert report["knn_recall"] == 1.0
    assert report["n_sample"] == 500
    for name in METRICS:
        assert report["metrics"][name]["difference"] == 0.0
        assert report["metrics"][name]["difference_ci"] == [0.0, 0.0]
    p1, mapr = _oracle_p1_mapr(x, y, range(0, 4000, 200))
    np.testing.assert_allclose(approx.per_query["precision_at_1"][::200], p1)
    np.testing.assert_allclose(approx.per_query["map_at_r"][::200], mapr, rtol=1e-12)


def test_groups_and_inner_product_with_flat_equal_exact(grid):
    x, y, g = grid
    kw = dict(metrics=METRICS, query_groups=g[:1000], reference_groups=g)
    exact = evaluate(x[:1000], y[:1000], x, y, distance="inner_product", **kw)
    approx = evaluate(
        x[:1000], y[:1000], x, y, distance="inner_product", index="Flat", exact_sample=0, **kw
    )
    for name in METRICS:
        np.testing.assert_array_equal(approx.per_query[name], exact.per_query[name], name)
    assert approx.approximation["n_sample"] == 0 and approx.approximation["metrics"] == {}


def test_reported_error_matches_a_full_exact_run(clusters):
    x, y = clusters
    metrics = ["precision_at_1", "map_at_r"]
    exact = evaluate(x, y, metrics=metrics)
    approx = evaluate(
        x, y, metrics=metrics, index="IVF64,Flat", index_params={"nprobe": 2}, exact_sample=3000
    )
    report = approx.approximation
    assert 0.5 < report["knn_recall"] < 0.99  # a real approximation, measured
    full_diff = approx["map_at_r"] - exact["map_at_r"]
    lo, hi = report["metrics"]["map_at_r"]["difference_ci"]
    assert lo < hi
    # The sample's confidence interval covers the difference over all 20,000 queries, and the
    # sample's exact value estimates the full exact value.
    assert lo - 1e-3 <= full_diff <= hi + 1e-3
    assert abs(report["metrics"]["map_at_r"]["exact"] - exact["map_at_r"]) < 0.01
    assert json.loads(json.dumps(report)) == report


def test_knn_recall_of_lists_shorter_than_the_depth_counts_only_their_own_references():
    # IVF32 with nprobe=1 on 600 rows of 3 classes: every query's inverted list (about 19
    # references) is far shorter than R (about 200), so the approximate lists end early.
    rng = np.random.default_rng(4)
    x = rng.standard_normal((600, 4)).astype(np.float32)
    y = rng.integers(0, 3, 600)
    res = evaluate(x, y, metrics=["map_at_r"], index="IVF32,Flat",
                   index_params={"nprobe": 1}, exact_sample=600)  # fmt: skip
    # Oracle: the same index built with faiss directly, every probed reference asked for.
    idx = faiss.index_factory(4, "IVF32,Flat")
    idx.train(x)
    idx.add(x)
    idx.nprobe = 1
    _, found = idx.search(x, 600)
    x64, rows, recall = x.astype(np.float64), np.arange(600), []
    for q in range(600):
        d = ((x64 - x64[q]) ** 2).sum(axis=1)
        r = int((y == y[q]).sum()) - 1
        exact = rows[rows != q][np.lexsort((rows[rows != q], d[rows != q]))][:r]
        approx = found[q][(found[q] >= 0) & (found[q] != q)]
        approx = approx[np.lexsort((approx, d[approx]))][:r]
        assert approx.size < r
        recall.append(np.intersect1d(exact, approx).size / r)
    assert res.approximation["n_sample"] == 600
    assert res.approximation["knn_recall"] == pytest.approx(np.mean(recall), abs=1e-12)


def test_whole_population_sample_gives_the_full_numbers(clusters):
    x, y = clusters
    q, yq = x[:3000], y[:3000]
    exact = evaluate(q, yq, x, y, metrics=["map_at_r"])
    approx = evaluate(q, yq, x, y, metrics=["map_at_r"], index="HNSW32", exact_sample=10_000)
    m = approx.approximation["metrics"]["map_at_r"]
    assert approx.approximation["n_sample"] == 3000 - exact.n_lone
    assert m["exact"] == pytest.approx(exact["map_at_r"], abs=1e-12)
    assert m["approximate"] == pytest.approx(approx["map_at_r"], abs=1e-12)


def test_trained_index_is_saved_and_reused(grid, tmp_path):
    x, y = grid[0][:2000], grid[1][:2000]
    trained = train_index(x, "IVF16,Flat", seed=3)
    assert trained.is_trained and trained.ntotal == 0
    path = tmp_path / "ivf16.faiss"
    faiss.write_index(trained, str(path))
    exact = evaluate(x, y, metrics=METRICS)
    for given in (trained, str(path)):
        res = evaluate(x, y, metrics=METRICS, index=given, index_params={"nprobe": 16})
        np.testing.assert_array_equal(res.per_query["map_at_r"], exact.per_query["map_at_r"])
        assert res.approximation["training_rows"] == 0  # reused, not retrained
    assert trained.ntotal == 0  # the caller's object is cloned, never filled
    # Another "checkpoint" of the same size through the same trained index.
    x2 = x[::-1].copy()
    y2 = y[::-1].copy()
    res2 = evaluate(x2, y2, metrics=METRICS, index=str(path), index_params={"nprobe": 16})
    exact2 = evaluate(x2, y2, metrics=METRICS)
    np.testing.assert_array_equal(res2.per_query["r_precision"], exact2.per_query["r_precision"])


@pytest.mark.parametrize("move", ["offset", "tiny"])
def test_trained_index_searches_the_data_it_was_trained_on(move):
    # Data far from the origin (translated by the engine) or tiny (scaled by a power of two):
    # an index trained on the caller's rows must be filled and searched with those rows, so
    # its lists are those faiss gives for them.  Oracle: the same trained index searched by
    # faiss directly, P@1 read off its list with a plain loop.
    rng = np.random.default_rng(11)
    y = rng.integers(0, 60, 3000)
    x = rng.standard_normal((60, 16))[y] + 0.8 * rng.standard_normal((3000, 16))
    x = (x + 1000.0 if move == "offset" else x * 2.0**-45).astype(np.float32)
    trained = train_index(x, "IVF32,Flat", seed=1)
    res = evaluate(x, y, metrics=["precision_at_1"], index=trained, index_params={"nprobe": 1})
    oracle_index = faiss.clone_index(trained)
    oracle_index.add(x)
    oracle_index.nprobe = 1
    _, ids = oracle_index.search(x, 2)
    p1 = []
    for q in range(len(x)):
        found = [i for i in ids[q] if i >= 0 and i != q]
        p1.append(float(bool(found) and y[found[0]] == y[q]))
    exact = evaluate(x, y, metrics=["precision_at_1"])
    assert not np.array_equal(p1, exact.per_query["precision_at_1"])  # nprobe=1 misses some
    np.testing.assert_array_equal(res.per_query["precision_at_1"], p1)


@pytest.fixture(scope="module")
def far_clusters():
    # 20 classes of unit-scale noise around a common offset of 10,000: every unit row lies
    # within about 1e-4 of one direction.
    rng = np.random.default_rng(3)
    y = rng.integers(0, 20, 1500)
    x = rng.standard_normal((20, 8))[y] + 0.6 * rng.standard_normal((1500, 8)) + 1e4
    return x.astype(np.float32), y


@pytest.mark.parametrize(("index", "params"), [("Flat", None), ("IVF8,Flat", {"nprobe": 8})])
def test_cosine_of_rows_sharing_a_large_offset_lists_the_nearest_references(
    far_clusters, index, params
):
    # float32 inner products of such unit rows cannot tell them apart (the index listed an
    # arbitrary set: MAP@R 0.40 instead of 0.46); searched about their common direction, an
    # index that scans every reference lists exactly the nearest ones.
    x, y = far_clusters
    res = evaluate(x, y, metrics=["precision_at_1", "map_at_r"], distance="cosine",
                   index=index, index_params=params, exact_sample=300)  # fmt: skip
    p1, mapr = _oracle_p1_mapr(x, y, range(len(x)), "cosine")
    np.testing.assert_array_equal(res.per_query["precision_at_1"], p1)
    np.testing.assert_allclose(res.per_query["map_at_r"], mapr, rtol=1e-12)


def test_knn_recall_compares_with_the_exact_float64_order(far_clusters):
    # The exact sample's lists were cut at depth d in float32 key order, which ranks these
    # rows arbitrarily: a Flat index, listing exactly the nearest references, was reported at
    # kNN recall 0.07.
    x, y = far_clusters
    metrics = ["precision_at_1", "map_at_r"]
    flat = evaluate(x, y, metrics=metrics, distance="cosine", index="Flat", exact_sample=1500)
    assert flat.approximation["knn_recall"] == 1.0
    _, mapr = _oracle_p1_mapr(x, y, range(len(x)), "cosine")
    exact = flat.approximation["metrics"]["map_at_r"]["exact"]
    assert exact == pytest.approx(mapr.mean(), rel=1e-12)
    # A graph index resolves them about as well as the same data at the origin.
    recall = {}
    for offset in (0, 10_000):
        moved = (x.astype(np.float64) - 10_000 + offset).astype(np.float32)
        res = evaluate(moved, y, metrics=metrics, distance="cosine", index="HNSW16",
                       index_params={"efSearch": 32}, exact_sample=1500)  # fmt: skip
        recall[offset] = res.approximation["knn_recall"]
    assert recall[10_000] >= recall[0] - 0.02


def test_int_k_makes_map_and_mrr_possible(grid):
    x, y, _ = grid
    exact = evaluate(x, y, metrics=["map", "mrr"], k=30)
    approx = evaluate(x, y, metrics=["map", "mrr"], k=30, index="Flat", exact_sample=100)
    np.testing.assert_array_equal(approx.per_query["map"], exact.per_query["map"])
    np.testing.assert_array_equal(approx.per_query["mrr"], exact.per_query["mrr"])


# ---- bad input


def test_full_depth_map_needs_an_int_k(grid):
    x, y, _ = grid
    for metric in ("map", "mrr", "minp"):
        with pytest.raises(InputError, match=f"the rankings that {metric} read.*Pass an int k"):
            evaluate(x, y, metrics=["precision_at_1", metric], index="Flat")


def test_bad_index_arguments(grid, tmp_path):
    x, y, _ = grid
    with pytest.raises(InputError, match="neither an existing file nor a faiss index factory"):
        evaluate(x, y, index="IVF16,Flaat")
    with pytest.raises(InputTypeError, match="index must be a faiss factory string"):
        evaluate(x, y, index=16)
    with pytest.raises(InputError, match="dimension 4 but the embeddings have 6"):
        evaluate(x, y, index=faiss.IndexFlatL2(4))
    with pytest.raises(InputError, match="METRIC_INNER_PRODUCT"):
        evaluate(x, y, index=faiss.IndexFlatL2(6), distance="cosine")
    not_faiss = tmp_path / "notes.faiss"
    not_faiss.write_text("hello")
    with pytest.raises(InputError, match="not one written by faiss.write_index"):
        evaluate(x, y, index=str(not_faiss))
    with pytest.raises(InputError, match="nlist=8192 inverted lists but there are only 4000"):
        evaluate(x, y, index="IVF8192,Flat")
    with pytest.raises(InputTypeError, match="index_params must be a dict"):
        evaluate(x, y, index="Flat", index_params=[("nprobe", 2)])
    with pytest.raises(InputError, match="index_params\\['nprobbe'\\]"):
        evaluate(x, y, index="IVF16,Flat", index_params={"nprobbe": 2})
    with pytest.raises(InputError, match="exact_sample must be >= 0"):
        evaluate(x, y, index="Flat", exact_sample=-1)
    with pytest.raises(InputError, match="exact_sample must be an integer"):
        evaluate(x, y, index="Flat", exact_sample=0.5)
    with pytest.raises(InputError, match="seed must be >= 0"):
        evaluate(x, y, index="Flat", seed=-3)
    with pytest.raises(InputError, match="cannot be combined"):
        evaluate(x, y, index="Flat", backend="dask")
    with pytest.raises(InputError, match="non-zero vectors"):
        z = x.copy()
        z[7] = 0
        evaluate(z, y, index="Flat", distance="cosine")


@pytest.mark.parametrize(
    ("index", "params", "message"),
    [
        ("IVF16,Flat", {"nprobe": 0}, r"index_params\['nprobe'\] must be >= 1; got 0"),
        ("IVF16,Flat", {"nprobe": -2}, r"index_params\['nprobe'\] must be >= 1; got -2"),
        ("IVF16,Flat", {"nprobe": 2.5}, r"index_params\['nprobe'\] must be an integer"),
        ("HNSW8", {"efSearch": 0}, r"index_params\['efSearch'\] must be >= 1"),
        ("HNSW8", {"efSearch": 10**12}, r"index_params\['efSearch'\] must be <= 2147483647"),
        ("IVF16,Flat", {"nprobe": True}, r"index_params\['nprobe'\] must be an integer"),
    ],
)
def test_search_parameters_faiss_cannot_use_are_refused(grid, index, params, message):
    # faiss casts every parameter from a double: nprobe=0 failed inside its search, a
    # fraction was truncated and efSearch past 2**31 - 1 wrapped to a negative int.
    x, y, _ = grid
    with pytest.raises(InputError, match=message):
        evaluate(x[:1000], y[:1000], index=index, index_params=params)


def test_id_map_index_lists_reference_rows(grid):
    # An IDMap index takes vectors only with ids; the ids are the reference rows.
    x, y, _ = grid
    res = evaluate(x, y, metrics=["precision_at_1", "map_at_r"], index="IDMap,Flat")
    rows = np.arange(0, len(x), 250)
    p1, mapr = _oracle_p1_mapr(x, y, rows)
    np.testing.assert_array_equal(res.per_query["precision_at_1"][rows], p1)
    np.testing.assert_allclose(res.per_query["map_at_r"][rows], mapr, rtol=1e-12)


def test_bad_train_index_arguments(grid):
    x, _, _ = grid
    with pytest.raises(InputError, match="training_rows must be >= 1"):
        train_index(x, "IVF16,Flat", training_rows=0)
    with pytest.raises(InputError, match="distance='manhattan' is not valid"):
        train_index(x, "IVF16,Flat", distance="manhattan")
    with pytest.raises(InputError, match="seed must be an integer"):
        train_index(x, "IVF16,Flat", seed=1.5)
    with pytest.raises(InputError, match="must be 2-D"):
        train_index(x[0], "IVF16,Flat")


def test_too_few_training_rows_is_a_clear_error(grid):
    x, _, _ = grid
    with pytest.raises(InputError, match="could not train the index on 10 rows"):
        train_index(x, "IVF16,Flat", training_rows=10)


# ---- two-level k-means for large nlist


@pytest.mark.parametrize(
    ("index", "distance"),
    [("IVF64,Flat", "euclidean"), ("IVF64_HNSW16,Flat", "euclidean"), ("IVF64,Flat", "cosine")],
)
def test_two_level_index_with_all_lists_probed_reproduces_exact(grid, index, distance):
    x, y, _ = grid
    trained = train_index(x, index, clustering="two_level", distance=distance, seed=2)
    ivf = faiss.extract_index_ivf(trained)
    assert trained.is_trained and trained.ntotal == 0 and ivf.quantizer.ntotal == 64
    params = {"nprobe": 64}
    if "HNSW" in index:
        params["quantizer_efSearch"] = 256  # the HNSW quantizer must rank all 64 lists
    exact = evaluate(x, y, metrics=METRICS, distance=distance)
    approx = evaluate(x, y, metrics=METRICS, distance=distance, index=trained, index_params=params)
    if distance == "euclidean":  # integer data: exact ties, comparable bit for bit
        for name in METRICS:
            np.testing.assert_array_equal(approx.per_query[name], exact.per_query[name], name)
        _, mapr = _oracle_p1_mapr(x, y, range(0, 4000, 400))
        np.testing.assert_allclose(approx.per_query["map_at_r"][::400], mapr, rtol=1e-12)
    # cosine: float rounding of the normalised vectors can swap (near-)tied neighbours
    tolerance = 0.01 if distance == "cosine" else 0
    assert approx.approximation["knn_recall"] == pytest.approx(1.0, abs=tolerance)


def test_two_level_centroids_partition_the_data_like_kmeans(clusters):
    # An independent check of the centroids: assigning every vector to its nearest centroid
    # (plain numpy argmin) costs a k-means objective close to faiss's flat k-means.
    x, _ = clusters
    objective = {}
    for clustering in ("kmeans", "two_level"):
        trained = train_index(x, "IVF100,Flat", clustering=clustering, seed=0)
        # np.asarray: once PML has imported faiss.contrib.torch_utils (the parity suite does),
        # faiss's reconstruct_n returns a torch tensor.
        quantizer = faiss.extract_index_ivf(trained).quantizer
        c = np.asarray(quantizer.reconstruct_n(0, 100), dtype=np.float64)
        d = (x.astype(np.float64) ** 2).sum(1)[:, None] - 2 * x @ c.T + (c**2).sum(1)[None]
        objective[clustering] = d.min(axis=1).mean()
        assert np.unique(d.argmin(axis=1)).size > 90  # (nearly) every list is used
    assert objective["two_level"] < 1.1 * objective["kmeans"]


def test_two_level_bad_input(grid):
    x, _, _ = grid
    with pytest.raises(InputError, match="clustering='kmenas' is not valid"):
        train_index(x, "IVF16,Flat", clustering="kmenas")
    with pytest.raises(InputError, match="inverted-file index without a pre-transform"):
        train_index(x, "HNSW16", clustering="two_level")
    with pytest.raises(InputError, match="inverted-file index without a pre-transform"):
        train_index(x, "PCA4,IVF16,Flat", clustering="two_level")
    with pytest.raises(InputError, match="could not train the index on 10 rows"):
        train_index(x, "IVF16,Flat", clustering="two_level", training_rows=10)


def test_twins_in_a_faiss_list_share_one_key_and_are_all_listed():
    # References 1, 4 and 6 are identical (one group), 2 and 5 another.  Query 0's list holds
    # 4 (key 2.0) and 1 (key 2.5, rounded apart) but not 6; query 1's list holds 5 only, and
    # its own group holds reference 2.  Expected: query 0 gets 1, 4, 6 at key 2.0 plus its
    # plain reference 3; query 1 gets 5 at its key, not 2 (same group as the query).
    from embedeval.engine.duplicates import DuplicateRows
    from embedeval.engine.exact import Exclusions
    from embedeval.search.approximate import _tie_duplicates

    dups = DuplicateRows(members=np.array([1, 2, 4, 5, 6]), group=np.array([0, 1, 0, 1, 0]),
                         first=np.array([1, 2]))  # fmt: skip
    row = np.array([0, 0, 0, 1])
    ref = np.array([4, 3, 1, 5])
    key = np.array([2.0, 3.0, 2.5, 1.0], dtype=np.float32)
    groups = Exclusions(query_groups=np.array([10, 20]),
                        reference_groups=np.array([0, 0, 20, 0, 0, 0, 0]))  # fmt: skip
    r, c, k = _tie_duplicates(row, ref, key, dups, groups, 0)
    got = sorted(zip(r.tolist(), c.tolist(), k.tolist(), strict=True))
    assert got == [(0, 1, 2.0), (0, 3, 3.0), (0, 4, 2.0), (0, 6, 2.0), (1, 5, 1.0)]


def test_bad_search_parameters_are_refused_before_the_index_is_built(grid, monkeypatch):
    # a wrong nprobe must not cost a training run (minutes on a large set) before it is refused
    import faiss

    def built(*args, **kwargs):
        raise AssertionError("the index was built before its parameters were checked")

    monkeypatch.setattr(faiss, "index_factory", built)
    x, y, _ = grid
    with pytest.raises(InputError, match=r"index_params\['nprobe'\] must be >= 1; got 0"):
        evaluate(x[:1000], y[:1000], index="IVF16,Flat", index_params={"nprobe": 0})


@pytest.mark.parametrize("params", [{"efSearch": 16}, {"nprobe": 2, "polysemous": 1}])
def test_parameters_the_index_lacks_are_refused_before_training(grid, monkeypatch, params):
    # an IVF index trains for minutes on a large set: a name it lacks must be refused first
    def trained(self, x):
        raise AssertionError("the index was trained before its parameters were checked")

    monkeypatch.setattr(faiss.IndexIVFFlat, "train", trained)
    x, y, _ = grid
    name = list(params)[-1]
    with pytest.raises(InputError, match=rf"index_params\['{name}'\]=1\d* cannot be set"):
        evaluate(x[:1000], y[:1000], index="IVF16,Flat", index_params=params)


def test_search_k_is_the_k_faiss_was_asked_for():
    # Leave-one-out MAP@R with R = 9: depth R + 1 plus the query's own row, rounded up to the
    # next power of two (docs/scale.md), is k = 16 for every query.
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 3)).astype(np.float32)
    y = np.repeat(np.arange(4), 10)
    res = evaluate(x, y, metrics=["map_at_r"], index="Flat", exact_sample=0)
    assert res.approximation["search_k"] == 2 ** int(np.ceil(np.log2(9 + 1 + 1)))


def test_rows_whose_float32_distances_overflow_are_refused_by_a_trained_index():
    # Values near 1e25: squared distances (~1e51) overflow float32, the precision faiss
    # computes in.  Training on them aborted the process inside faiss's k-means, and a trained
    # index searched them in the given coordinates (infinite distances, recall 0); a factory
    # string is trained here on rows scaled to [0.5, 1) and still works.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 6)).astype(np.float32)
    y = rng.integers(0, 5, 300)
    big = x * np.float32(1e25)
    with pytest.raises(InputError, match=r"float32 distances overflow; divide the embeddings"):
        train_index(big, "IVF8,Flat")
    trained = train_index(x, "IVF8,Flat")
    with pytest.raises(InputError, match=r"reach about 2\*\*86, where faiss's float32"):
        evaluate(big, y, index=trained)
    res = evaluate(big, y, metrics=["precision_at_1"], index="IVF8,Flat",
                   index_params={"nprobe": 8}, exact_sample=0)  # fmt: skip
    x64, rows = x.astype(np.float64), np.arange(300)
    first = [min((r for r in rows if r != q), key=lambda r: (((x64[r] - x64[q]) ** 2).sum(), r))
             for q in rows]  # fmt: skip
    np.testing.assert_array_equal(res.per_query["precision_at_1"], y[first] == y)
