"""Rankings of data far from the origin (norms that dwarf the distances) against a float64 brute
force written here: float64 distances of the float32 inputs, a stable sort by reference index,
P@1 and MAP@R from their definitions; in every backend, leave-one-out and query/reference."""

from __future__ import annotations

import numpy as np
import pytest

import embedeval as ee
from embedeval.engine.arrays import centre_for_distance
from embedeval.engine.exact import exact_centre

METRICS = ["precision_at_1", "map_at_r"]


def offset_data(n, d, classes, offset, spread, noise, seed=0):
    """Classes around ``offset`` in every coordinate: centres ``spread``, rows ``noise`` apart."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    centres = rng.normal(0.0, spread, (classes, d))
    return (offset + centres[y] + rng.normal(0.0, noise, (n, d))).astype(np.float32), y


def brute_force(xq, yq, xb, yb, leave_one_out):
    """Per query P@1 and MAP@R from float64 squared distances, ties by reference index."""
    b = xb.astype(np.float64)
    p1, map_r = [], []
    for i, q in enumerate(xq.astype(np.float64)):
        d2 = ((b - q) ** 2).sum(axis=1)
        same = yb == yq[i]
        keep = np.ones(len(b), dtype=bool)
        if leave_one_out:
            keep[i] = False
        order = np.flatnonzero(keep)
        order = order[np.argsort(d2[order], kind="stable")]
        rel = same[order]
        r = int(rel.sum())
        p1.append(float(rel[0]))
        hits = rel[:r]
        map_r.append(float(sum(np.cumsum(hits)[j] / (j + 1) for j in np.flatnonzero(hits)) / r))
    return {"precision_at_1": np.array(p1), "map_at_r": np.array(map_r)}


def assert_equal_to(result, truth):
    for name, expected in truth.items():
        got = np.asarray(result.per_query[name])
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12, err_msg=name)


@pytest.fixture(scope="module")
def far():
    """3,000 x 8 around 1000: float32 keys ||x||^2 - 2 q.x cancel every digit here (P@1 of
    the uncentred product: 0.04 against 0.92)."""
    return offset_data(1500, 8, 30, 1000.0, 0.02, 0.01)


@pytest.fixture(scope="module")
def far_truth(far):
    x, y = far
    return brute_force(x, y, x, y, True)


BACKENDS = [
    pytest.param({}, id="local"),
    pytest.param({"shards": 3}, id="sharded"),
    pytest.param({"backend": "torch", "device": "cpu"}, id="torch-cpu"),
    pytest.param({"n_threads": 1, "block_size": 100}, id="local-small-blocks"),
]


@pytest.mark.parametrize("options", BACKENDS)
def test_leave_one_out_far_from_origin_equals_float64(far, far_truth, options):
    if options.get("backend") == "torch":
        pytest.importorskip("torch")
    x, y = far
    assert_equal_to(ee.evaluate(x, y, metrics=METRICS, **options), far_truth)


def test_leave_one_out_symmetric_and_one_sided_engines_agree_with_float64(far, far_truth):
    x, y = far
    # A label threshold (full-depth MAP) takes the one-sided engine; MAP@R the symmetric one.
    result = ee.evaluate(x, y, metrics=[*METRICS, "map"])
    assert_equal_to(result, far_truth)


def test_high_dimension_offset_100_equals_float64():
    x, y = offset_data(1200, 128, 60, 100.0, 0.02, 0.05, seed=3)
    truth = brute_force(x, y, x, y, True)
    del truth["map_at_r"]  # centring alone leaves float32 near-ties deep in the rankings
    assert_equal_to(ee.evaluate(x, y, metrics=METRICS), truth)


@pytest.mark.parametrize("options", BACKENDS[:3])
def test_query_reference_split_far_from_origin(options):
    if options.get("backend") == "torch":
        pytest.importorskip("torch")
    # Above 16 column tiles of 2048: the sharded backend really cuts the reference.
    xb, yb = offset_data(34_000, 8, 40, -5000.0, 0.05, 0.02, seed=5)
    xq, yq = offset_data(150, 8, 40, -5000.0, 0.05, 0.02, seed=6)
    truth = brute_force(xq, yq, xb, yb, False)
    assert_equal_to(ee.evaluate(xq, yq, xb, yb, metrics=METRICS, **options), truth)


def test_neighbors_far_from_origin_returns_float64_order_and_distances(far):
    x, _ = far
    q = x[:40]
    d, i = ee.neighbors(q, 5, x[40:])
    b = x[40:].astype(np.float64)
    for row in range(q.shape[0]):
        d2 = ((b - q[row].astype(np.float64)) ** 2).sum(axis=1)
        order = np.argsort(d2, kind="stable")[:5]
        assert i[row].tolist() == order.tolist()
        np.testing.assert_allclose(d[row], np.sqrt(d2[order]), rtol=1e-5)


def test_exact_centre_hand_values():
    lo = np.array([999.0, -4.0, -8.0, 1.0, 5.0], dtype=np.float32)
    hi = np.array([1001.0, 4.0, -3.0, 5.0, 5.0], dtype=np.float32)
    mean = np.array([1000.5, 0.0, -5.0, 2.0, 5.0])
    # Column 1 spans zero, column 3 a factor of 5: they stay; column 2 is clipped to [-6, -4].
    assert exact_centre(lo, hi, mean).tolist() == [1000.5, 0.0, -5.0, 0.0, 5.0]
    assert exact_centre(lo[1:2], hi[1:2], mean[1:2]) is None


def test_centring_is_exact_and_keeps_identical_rows_identical():
    rng = np.random.default_rng(1)
    x = (rng.uniform(1.0, 3.9, (500, 6)) * rng.choice([1, -1, 1e3], 6)).astype(np.float32)
    x[10] = x[20]
    xq, xb, centre = centre_for_distance(x, x, "euclidean", same=True)
    assert centre is not None and xb is xq
    # Exact: the float32 difference is the float64 difference of the same float32 values.
    np.testing.assert_array_equal(
        xq.astype(np.float64), x.astype(np.float64) - centre.astype(np.float64)
    )
    assert (xq[10] == xq[20]).all()
    assert centre_for_distance(x, x, "cosine", same=True)[2] is None


def test_data_around_the_origin_is_not_translated():
    x = np.random.default_rng(2).integers(-3, 4, (200, 5)).astype(np.float32)
    xq, _, centre = centre_for_distance(x, x, "euclidean", same=True)
    assert centre is None and xq is x


def test_dask_far_from_origin_equals_float64(far, far_truth):
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        x, y = far
        result = ee.evaluate(x, y, metrics=METRICS, backend="dask", client=client)
    assert_equal_to(result, far_truth)


def test_tensor_queries_with_a_host_reference_are_centred_like_host_arrays(far, far_truth):
    torch = pytest.importorskip("torch")
    x, y = far
    xq, xb, centre = centre_for_distance(torch.from_numpy(x[:100]), x, "euclidean", same=False)
    # The centre from every row (the column range [999.9, 1000.1] allows it): the translated
    # rows are exactly the original float32 rows minus that centre, in their own kind.
    assert centre is not None and isinstance(xq, torch.Tensor) and isinstance(xb, np.ndarray)
    shift = x.astype(np.float64) - centre.astype(np.float64)
    np.testing.assert_array_equal(xq.numpy().astype(np.float64), shift[:100])
    np.testing.assert_array_equal(xb.astype(np.float64), shift)
    got = ee.evaluate(torch.from_numpy(x), y, x, y, metrics=METRICS, ref_includes_query=True,
                      backend="torch", device="cpu")  # fmt: skip
    assert_equal_to(got, far_truth)
