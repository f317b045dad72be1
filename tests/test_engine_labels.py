"""Multi-label relevance (2-D 0/1 label indicators: relevant = shares a label) and the hashing
mAP@k (``map_at_{k}``), against a brute force written here: plain loops, float64 distances, a
stable sort by (distance, reference index)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import embedeval as ee
from embedeval.utils.errors import InputError, InputTypeError


# ---------------------------------------------------------------------------- brute force
def brute_rankings(xq, yq, xr=None, yr=None, qg=None, rg=None, distance="euclidean"):
    """Per query, the relevance (0/1) of its valid references in rank order."""
    loo = xr is None
    if loo:
        xr, yr, rg = xq, yq, qg
    out = []
    for i in range(len(xq)):
        dist, refs = [], []
        for j in range(len(xr)):
            if loo and i == j:
                continue
            if qg is not None and qg[i] == rg[j]:
                continue
            a, b = np.asarray(xq[i], np.float64), np.asarray(xr[j], np.float64)
            dist.append(math.fsum((a - b) ** 2) if distance == "euclidean" else -math.fsum(a * b))
            refs.append(j)
        order = sorted(range(len(refs)), key=lambda t: (dist[t], refs[t]))
        shared = [int(any(yq[i][c] and yr[refs[t]][c] for c in range(len(yq[i])))) for t in order]
        out.append(shared)
    return out


def brute_value(name, rel):
    n_rel = sum(rel)
    if n_rel == 0:
        return math.nan
    if name == "precision_at_1":
        return float(rel[0])
    if name == "map":
        hits, total = 0, 0.0
        for i, r in enumerate(rel):
            if r:
                hits += 1
                total += hits / (i + 1)
        return total / n_rel
    if name.startswith("map_at_"):
        k = int(name[len("map_at_") :])
        hits, total = 0, 0.0
        for i, r in enumerate(rel[:k]):
            if r:
                hits += 1
                total += hits / (i + 1)
        return total / hits if hits else 0.0
    raise ValueError(name)


def _data(n=120, n_labels=5, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(-2, 3, size=(n, 4)).astype(np.float32)  # exact ties everywhere
    x[20:30] = x[0:10]  # duplicated rows
    y = (rng.random((n, n_labels)) < 0.3).astype(np.int64)
    y[5] = 0  # a query without labels: lone
    return x, y


METRICS = ["map", "precision_at_1", "map_at_7", "map_at_40"]


def _check(res, ranks, metrics=METRICS):
    for m in metrics:
        want = np.array([brute_value(m, rel) for rel in ranks])
        np.testing.assert_allclose(res.per_query[m], want, rtol=1e-12, atol=0, err_msg=m)


# ---------------------------------------------------------------------------- values
@pytest.mark.parametrize("distance", ["euclidean", "inner_product"])
def test_leave_one_out_matches_brute_force(distance):
    x, y = _data()
    res = ee.evaluate(x, y, metrics=METRICS, distance=distance, progress=False)
    ranks = brute_rankings(x, y, distance=distance)
    _check(res, ranks)
    assert np.isnan(res.per_query["map"][5])  # no label: nothing is relevant to it


@pytest.mark.parametrize("options", [{}, {"shards": 2}, {"block_size": 7}])
def test_candidate_engine_and_shards_match_brute_force(options):
    x, y = _data()
    shallow = ["precision_at_1", "map_at_7"]  # no full-depth metric: the candidate engine
    res = ee.evaluate(x, y, metrics=shallow, progress=False, **options)
    _check(res, brute_rankings(x, y), shallow)
    res = ee.evaluate(x, y, metrics=METRICS, progress=False, **options)
    _check(res, brute_rankings(x, y))


def test_query_and_reference_sets_match_brute_force():
    x, y = _data(n=160)
    xq, yq, xr, yr = x[:50], y[:50], x[50:], y[50:]
    res = ee.evaluate(xq, yq, xr, yr, metrics=METRICS, progress=False)
    _check(res, brute_rankings(xq, yq, xr, yr))


def test_data_frames_of_mixed_or_nullable_columns_match_brute_force():
    pd = pytest.importorskip("pandas")
    x, y = _data(n=60, n_labels=3)
    # numpy reads both frames as objects: bool beside int columns, and nullable Int8 columns
    mixed = pd.DataFrame({"a": y[:, 0].astype(bool), "b": y[:, 1], "c": y[:, 2]})
    nullable = pd.DataFrame({c: pd.array(y[:, i], dtype="Int8") for i, c in enumerate("abc")})
    for frame in (mixed, nullable):
        _check(ee.evaluate(x, frame, metrics=METRICS, progress=False), brute_rankings(x, y))
    nullable.loc[4, "b"] = None
    with pytest.raises(InputTypeError, match="query_labels must hold 0/1 numbers"):
        ee.evaluate(x, nullable)


def test_sparse_indicator_matrices_match_brute_force():
    sparse = pytest.importorskip("scipy.sparse")
    x, y = _data(n=90)
    xq, yq, xr, yr = x[:30], y[:30], x[30:], y[30:]
    res = ee.evaluate(xq, sparse.csr_matrix(yq), xr, sparse.csr_matrix(yr), metrics=METRICS)
    _check(res, brute_rankings(xq, yq, xr, yr))
    ev = ee.Evaluator(metrics=METRICS)
    ev.update(x, sparse.csr_matrix(y))
    _check(ev.compute(), brute_rankings(x, y))
    bad = y.copy()
    bad[3, 1] = 2
    with pytest.raises(InputError, match="query_labels must hold only 0 and 1"):
        ee.evaluate(x, sparse.csr_matrix(bad))


def test_groups_match_brute_force():
    x, y = _data()
    g = np.random.default_rng(3).integers(0, 6, len(x))
    res = ee.evaluate(x, y, metrics=METRICS, query_groups=g, progress=False)
    _check(res, brute_rankings(x, y, qg=g))


def test_more_than_64_labels_use_several_words():
    x, _ = _data(n=90)
    rng = np.random.default_rng(5)
    y = (rng.random((90, 130)) < 0.02).astype(np.int64)
    y[:, 129] = rng.random(90) < 0.3  # the last word matters
    res = ee.evaluate(x, y, metrics=METRICS, progress=False)
    _check(res, brute_rankings(x, y))


def test_r_q_counts_references_sharing_a_label():
    # Items: {0}, {0, 1}, {1}, {} -> R_q leave-one-out: 1, 2, 1, 0 (hand-counted).
    x = np.array([[0.0], [1.0], [2.0], [3.0]], np.float32)
    y = np.array([[1, 0], [1, 1], [0, 1], [0, 0]])
    res = ee.evaluate(x, y, metrics=["map", "r_precision"], progress=False)
    # Query 0 ranks 1 (rel), 2, 3: AP = 1; query 1 ranks 0, 2 (both rel): AP = 1;
    # query 2 ranks 1 (rel), 3, 0: AP = 1; query 3: lone.
    assert res.per_query["map"][:3].tolist() == [1.0, 1.0, 1.0]
    assert math.isnan(res.per_query["map"][3])
    assert res.n_lone == 1


def test_per_class_counts_a_query_in_each_of_its_labels():
    x = np.array([[0.0], [1.0], [3.0], [6.0]], np.float32)
    y = np.array([[1, 0], [1, 1], [0, 1], [1, 0]])
    res = ee.evaluate(x, y, metrics=["precision_at_1"], average="macro", progress=False)
    # Nearest: 0 -> 1 (shares 0): 1; 1 -> 0 (shares 0): 1; 2 -> 1 (shares 1): 1;
    # 3 -> 2 (shares none): 0.  Label 0: queries 0, 1, 3 -> 2/3; label 1: queries 1, 2 -> 1.
    assert res.per_class["precision_at_1"] == pytest.approx({0: 2 / 3, 1: 1.0})
    assert res.metrics["precision_at_1"] == pytest.approx((2 / 3 + 1.0) / 2)
    micro = ee.evaluate(x, y, metrics=["precision_at_1"], progress=False)
    assert micro.metrics["precision_at_1"] == pytest.approx(3 / 4)


def test_map_at_k_hand_computed():
    # One query at 0; references at 1..5 with labels r, n, r, n, r (single labels).
    x = np.array([[0.0], [1.0], [2.0], [3.0], [4.0], [5.0]], np.float32)
    y = np.array([0, 0, 1, 0, 1, 0])
    res = ee.evaluate(x[:1], y[:1], x[1:], y[1:], metrics=["map_at_2", "map_at_4", "map"])
    assert res.per_query["map_at_2"][0] == 1.0  # 1/1, one hit
    assert res.per_query["map_at_4"][0] == pytest.approx((1 + 2 / 3) / 2)
    assert res.per_query["map"][0] == pytest.approx((1 + 2 / 3 + 3 / 5) / 3)


def test_map_at_k_is_zero_without_a_hit_in_the_top_k():
    x = np.array([[0.0], [1.0], [2.0], [3.0]], np.float32)
    y = np.array([0, 1, 1, 0])
    res = ee.evaluate(x[:1], y[:1], x[1:], y[1:], metrics=["map_at_2"])
    assert res.per_query["map_at_2"][0] == 0.0


# ---------------------------------------------------------------------------- input errors
def test_reference_labels_must_have_the_same_columns():
    x, y = _data(n=40)
    with pytest.raises(InputError, match="label columns"):
        ee.evaluate(x[:10], y[:10], x[10:], y[10:, :3])


def test_indicators_must_be_zero_or_one():
    x, y = _data(n=40)
    y = y.copy()
    y[3, 1] = 2
    with pytest.raises(InputError, match="only 0 and 1"):
        ee.evaluate(x, y)


def test_cluster_metrics_are_refused():
    x, y = _data(n=40)
    with pytest.raises(InputError, match="nmi"):
        ee.evaluate(x, y, metrics=["map", "nmi"])


def test_macro_intervals_are_refused_before_the_search():
    x, y = _data(n=40)
    with pytest.raises(InputError, match="average='micro'"):
        ee.evaluate(x, y, metrics=["map"], ci=0.9, n_boot=10, average="macro")


@pytest.mark.parametrize("precision", ["float32", "bf16"])
def test_torch_backend_matches_brute_force(precision):
    torch = pytest.importorskip("torch")
    x, y = _data(n=90)
    g = np.arange(90) % 4
    opts = {"backend": "torch", "device": "cpu", "precision": precision, "progress": False}
    res = ee.evaluate(torch.from_numpy(x), y, metrics=METRICS, query_groups=g, **opts)
    assert res.settings["torch"]["engine"] == "local label sets"
    _check(res, brute_rankings(x, y, qg=g))
    res = ee.evaluate(x[:30], y[:30], x[30:], y[30:], metrics=METRICS, **opts)
    _check(res, brute_rankings(x[:30], y[:30], x[30:], y[30:]))


def test_gpu_tensors_with_label_sets_take_the_local_engine(monkeypatch):
    torch = pytest.importorskip("torch")
    import embedeval.search.options as options

    # CPU tensors stand in for GPU ones: the check that lets a GPU tensor choose the backend
    # sees every tensor as one on a device; the torch backend it selects hands label sets to
    # the local engine
    monkeypatch.setattr(options, "is_device_tensor", lambda x: isinstance(x, torch.Tensor))
    x, y = _data(n=40)
    res = ee.evaluate(torch.from_numpy(x), y, metrics=METRICS, progress=False)
    assert res.settings["backend"] == "torch"
    assert res.settings["torch"]["engine"] == "local label sets"
    _check(res, brute_rankings(x, y))


def test_micro_intervals_resample_queries():
    x, y = _data(n=60)
    res = ee.evaluate(x, y, metrics=["map"], ci=0.9, n_boot=200, seed=0, progress=False)
    low, high = res.ci["map"]
    assert low <= res.metrics["map"] <= high


def test_sparse_label_sets_take_the_deep_engine_and_match_brute_force():
    from embedeval.engine.deep import deep_applies
    from embedeval.evaluation.settings import EvaluationInputs, validate_arguments
    from embedeval.evaluation.stages import plan_search, prepare_data

    rng = np.random.default_rng(7)
    x = rng.integers(-2, 3, size=(500, 4)).astype(np.float32)
    x[40:60] = x[0:20]
    y = (rng.random((500, 200)) < 0.006).astype(np.int64)
    inputs = EvaluationInputs(x, y)
    settings = validate_arguments(inputs, metrics=METRICS)
    assert deep_applies(plan_search(settings, prepare_data(settings, inputs)).task)
    res = ee.evaluate(x, y, metrics=METRICS, progress=False)
    _check(res, brute_rankings(x, y))
