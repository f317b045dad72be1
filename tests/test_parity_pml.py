"""Parity with pytorch-metric-learning 2.9's AccuracyCalculator, and the cases where PML is wrong.

Needs ``pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu`` (the
CPU-only build) and ``pip install pytorch-metric-learning==2.9.0``; skipped otherwise.  Data
are random floats (no near-ties), so both agree to float rounding.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pml = pytest.importorskip(
    "pytorch_metric_learning",
    reason="PML 2.9 not installed: pip install torch==2.13.0 --index-url "
    "https://download.pytorch.org/whl/cpu && pip install pytorch-metric-learning==2.9.0",
)
torch = pytest.importorskip("torch")
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator  # noqa: E402

import embedeval as ee  # noqa: E402

NAMES = {
    "precision_at_1": "precision_at_1",
    "r_precision": "r_precision",
    "mean_average_precision_at_r": "map_at_r",
    "mean_average_precision": "map",
    "mean_reciprocal_rank": "mrr",
}


def _data(seed, n, n_classes, d=8):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)).astype(np.float32), rng.integers(0, n_classes, n)


def _pml(include, k, avg, q, ql, r=None, rl=None, per_class=False):
    calc = AccuracyCalculator(
        include=tuple(include),
        k=k,
        avg_of_avgs=avg == "macro",
        return_per_class=per_class,
        device=torch.device("cpu"),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if r is None:
            return calc.get_accuracy(torch.from_numpy(q), torch.from_numpy(ql))
        return calc.get_accuracy(
            torch.from_numpy(q),
            torch.from_numpy(ql),
            torch.from_numpy(r),
            torch.from_numpy(rl),
            False,
        )


@pytest.mark.parametrize("k", [None, 5, "max_bin_count"])
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("average", ["micro", "macro"])
def test_parity_with_pml(k, split, average):
    q, ql = _data(1, 700, 25)
    r, rl = _data(2, 900, 25) if split else (None, None)
    expected = _pml(NAMES, k, average, q, ql, r, rl)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = (q, ql) if r is None else (q, ql, r, rl)
        res = ee.evaluate(*args, metrics=list(NAMES), k=k, average=average)
    for pml_name, key in NAMES.items():
        assert res[key] == pytest.approx(expected[pml_name], abs=1e-6), key


def test_per_class_values_match_pml():
    q, ql = _data(3, 500, 12)
    expected = _pml(
        ["precision_at_1", "mean_average_precision_at_r"], None, "micro", q, ql, per_class=True
    )
    res = ee.evaluate(q, ql, metrics=["precision_at_1", "map_at_r"], average="macro")
    classes = sorted(res.per_class["map_at_r"])  # PML orders classes by sorted label
    got = [res.per_class["map_at_r"][c] for c in classes]
    np.testing.assert_allclose(got, expected["mean_average_precision_at_r"], atol=1e-6)


# 600 points / 6 classes = 100 per cluster; 60 / 6 = 10 per cluster is below faiss's
# min_points_per_centroid (39), where faiss warns on stderr and embedeval silences it.
@pytest.mark.parametrize("n", [600, 60])
def test_nmi_ami_match_pml_exactly(n):
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((6, 8)) * 2
    y = rng.integers(0, 6, n)
    x = (centers[y] + rng.standard_normal((n, 8))).astype(np.float32)
    expected = _pml(["NMI", "AMI"], None, "micro", x, y)
    res = ee.evaluate(x, y, metrics=["NMI", "AMI"])
    # Same faiss k-means (20 iterations, seed 1234) on the same float32 data: identical clusters.
    assert res["nmi"] == pytest.approx(expected["NMI"], abs=1e-12)
    assert res["ami"] == pytest.approx(expected["AMI"], abs=1e-12)


def test_pml_wrong_k_larger_than_reference_set():
    # 4 queries, 6 references; k=10 > 6.  faiss pads with index -1, PML reads label[-1].
    q = np.array([[0.0], [1.0], [10.0], [11.0]], dtype=np.float32)
    r = np.array([[0.1], [1.1], [10.1], [11.1], [20.0], [30.0]], dtype=np.float32)
    ql = np.array([0, 0, 1, 1])
    rl = np.array([0, 0, 1, 1, 2, 1])  # the last reference label (used by the -1 pads) is 1
    expected = _pml(["mean_average_precision"], 10, "micro", q, ql, r, rl)
    assert expected["mean_average_precision"] > 1  # PML's value is not an average precision
    res = ee.evaluate(q, ql, r, rl, metrics=["map"], k=10)
    # By hand: q0 ranks 0.1(0) 1.1(0) -> AP 1; q1: 1.1(0) 0.1(0) -> 1; q2: 10.1(1) 11.1(1), the
    # third label-1 reference at 30 comes 6th -> (1 + 1 + 3/6)/3; q3 the same.
    assert res["map"] == pytest.approx((1 + 1 + 2 * (2.5 / 3)) / 4)


def test_pml_wrong_large_integer_labels():
    x = np.array([[0.0], [0.1], [5.0], [5.1]], dtype=np.float32)
    y = np.array([2**24, 2**24 + 1, 2**24, 2**24 + 1], dtype=np.int64)
    expected = _pml(["precision_at_1"], None, "micro", x, y)
    assert expected["precision_at_1"] == 1.0  # float32 cast merges the two labels
    res = ee.evaluate(x, y, metrics=["precision_at_1"])
    assert res["precision_at_1"] == 0.0  # each nearest neighbour has the other label


def test_pml_wrong_mrr_alone_crashes_and_embedeval_works():
    x, y = _data(5, 60, 4)
    with pytest.raises(Exception):  # noqa: B017 - PML raises a bare KeyError / RuntimeError
        _pml(["mean_reciprocal_rank"], None, "micro", x, y)
    res = ee.evaluate(x, y, metrics=["mrr"])
    assert 0 < res["mrr"] <= 1


def test_mrr_in_float64_where_pml_uses_float32():
    # 1/3 has no exact float32 value: PML's per-query MRR carries float32 rounding.
    x = np.array([[0.0], [1.0], [1.5], [1.7], [100.0]], dtype=np.float32)
    y = np.array([0, 1, 2, 0, 0])
    expected = _pml(
        ["precision_at_1", "mean_reciprocal_rank"], None, "micro", x[:1], y[:1], x[1:], y[1:]
    )
    assert expected["mean_reciprocal_rank"] == float(np.float32(1 / 3)) != 1 / 3
    res = ee.evaluate(x[:1], y[:1], x[1:], y[1:], metrics=["mrr"])
    assert res["mrr"] == 1 / 3  # exactly the float64 value


# ---- other distances, int k per class, the independent oracle vs PML


def _pml_knn(include, k, avg, q, ql, r, rl, knn_func, per_class=False):
    calc = AccuracyCalculator(
        include=tuple(include),
        k=k,
        avg_of_avgs=avg == "macro",
        return_per_class=per_class,
        device=torch.device("cpu"),
        knn_func=knn_func,
    )
    t = torch.from_numpy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if r is None:
            return calc.get_accuracy(t(q), t(ql))
        return calc.get_accuracy(t(q), t(ql), t(r), t(rl), False)


@pytest.mark.parametrize(
    ("distance", "split"),
    [("cosine", False), ("cosine", True), ("inner_product", False), ("inner_product", True)],
)
@pytest.mark.parametrize("k", [None, 4])
def test_parity_with_pml_for_similarity_distances(distance, k, split):
    from pytorch_metric_learning.distances import CosineSimilarity, DotProductSimilarity
    from pytorch_metric_learning.utils.inference import CustomKNN

    # PML's distances L2-normalise by default, which would make its dot product a cosine
    sim = (
        CosineSimilarity()
        if distance == "cosine"
        else DotProductSimilarity(normalize_embeddings=False)
    )
    knn = CustomKNN(sim)
    q, ql = _data(11, 300, 10)
    r, rl = _data(12, 400, 10) if split else (None, None)
    names = {n: v for n, v in NAMES.items() if n != "mean_reciprocal_rank"}
    names["mean_reciprocal_rank"] = "mrr"
    expected = _pml_knn(names, k, "micro", q, ql, r, rl, knn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = (q, ql) if r is None else (q, ql, r, rl)
        res = ee.evaluate(*args, metrics=list(names), k=k, distance=distance, progress=False)
    for pml_name, key in names.items():
        assert res[key] == pytest.approx(expected[pml_name], abs=1e-6), key


def test_per_class_values_match_pml_on_a_split_with_int_k():
    q, ql = _data(13, 300, 8)
    r, rl = _data(14, 500, 8)
    inc = ["precision_at_1", "r_precision", "mean_average_precision_at_r"]
    expected = _pml(inc, 6, "micro", q, ql, r, rl, per_class=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = ee.evaluate(q, ql, r, rl, metrics=inc, k=6, progress=False)
    for pml_name in inc:
        key = NAMES[pml_name]
        classes = sorted(res.per_class[key])
        got = [res.per_class[key][c] for c in classes]
        np.testing.assert_allclose(got, expected[pml_name], atol=1e-6, err_msg=key)


@pytest.mark.parametrize("k", [None, 3])
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("average", ["micro", "macro"])
def test_the_independent_oracle_agrees_with_pml(k, split, average):
    # checks tests/oracle.py itself against an outside implementation (no embedeval involved)
    from tests import oracle

    q, ql = _data(21, 60, 5, d=4)
    r, rl = _data(22, 70, 5, d=4) if split else (None, None)
    expected = _pml(NAMES, k, average, q, ql, r, rl)
    want, _, _ = oracle.evaluate(q, ql, r, rl, metrics=list(NAMES.values()), k=k, average=average)
    for pml_name, key in NAMES.items():
        assert want[key] == pytest.approx(expected[pml_name], abs=1e-6), key


@pytest.mark.parametrize("seed", [0, 3, 7])
def test_identical_vectors_match_pml(seed):
    # 600 rows drawn from 150 distinct Gaussian vectors: PML (faiss) gives identical vectors
    # equal distances and removes the query's own index; embedeval ranks the twins by index.
    # Their numbers agree (they differed by up to 0.01 when twins were rounded apart).
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((150, 24)).astype(np.float32)
    x, y = base[rng.integers(0, 150, 600)], rng.integers(0, 5, 600)
    names = {k: v for k, v in NAMES.items() if v != "map"}
    expected = _pml(names, "max_bin_count", "micro", x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = ee.evaluate(x, y, metrics=list(names.values()), k="max_bin_count")
    for pml_name, key in names.items():
        assert res[key] == pytest.approx(expected[pml_name], abs=1e-6), key  # PML: float32
