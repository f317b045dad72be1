"""embedeval.report.datasets: toy spaces obey their definitions; simulations touch what they
should."""

from __future__ import annotations

import numpy as np
import pytest

import embedeval as ee
from embedeval.report import datasets as ds

# The documented bands, copied by hand (not read from the module).
DOCUMENTED_BANDS = {
    1: [(-1, -2 / 3), (-1 / 3, 0), (0, 1 / 3), (2 / 3, 1)],
    2: [(-1, 0), (0, 1)],
    3: [(-1, -1 / 3), (1 / 3, 1)],
}


@pytest.mark.parametrize("which", [1, 2, 3])
def test_reality_check_spaces_follow_their_bands(which):
    x, y = ds.reality_check_example(2000, which, seed=3)
    bands = DOCUMENTED_BANDS[which]
    inside = np.zeros(len(x), dtype=bool)
    for lo, hi in bands:
        inside |= (x[:, 0] >= lo) & (x[:, 0] <= hi)
    assert inside.all()
    assert ((x[:, 1] >= 0) & (x[:, 1] <= 1)).all()
    np.testing.assert_array_equal(y, (x[:, 0] > 0).astype(int))
    # equal density: the share in each band is proportional to its width
    widths = np.array([hi - lo for lo, hi in bands])
    shares = [np.mean((x[:, 0] >= lo) & (x[:, 0] <= hi)) for lo, hi in bands]
    np.testing.assert_allclose(shares, widths / widths.sum(), atol=0.04)
    x2, _ = ds.reality_check_example(2000, which, seed=3)
    np.testing.assert_array_equal(x, x2)
    assert x.shape == (2000, 2) and x.dtype == np.float64


@pytest.mark.parametrize("which", [1, 2, 3])
def test_reality_check_x_is_uniform_within_the_bands(which):
    stats = pytest.importorskip("scipy.stats")
    x, _ = ds.reality_check_example(3000, which, seed=5)
    # map x through the CDF of the uniform law on the union of bands: must be U(0, 1)
    bands = DOCUMENTED_BANDS[which]
    total = sum(hi - lo for lo, hi in bands)
    cdf = np.zeros(len(x))
    below = 0.0
    for lo, hi in bands:
        inside = (x[:, 0] >= lo) & (x[:, 0] <= hi)
        cdf[inside] = (below + x[inside, 0] - lo) / total
        below += hi - lo
    assert stats.kstest(cdf, "uniform").pvalue > 0.001
    assert stats.kstest(x[:, 1], "uniform").pvalue > 0.001


def test_reality_check_metrics_rank_the_spaces():
    # Example 3 (two well-separated bands) is the best clustered: MAP@R must say so.
    vals = []
    for which in (1, 2, 3):
        x, y = ds.reality_check_example(400, which, seed=0)
        vals.append(ee.evaluate(x, y, metrics=["map_at_r"])["map_at_r"])
    assert vals[0] < vals[1] < vals[2]


def test_corruption_touches_exactly_the_chosen_subset():
    y = np.repeat(np.arange(5), 20)
    y2, mask = ds.corrupt_labels(y, fraction=0.25, seed=1)
    assert mask.sum() == 25
    assert (y2[mask] != y[mask]).all() and (y2[~mask] == y[~mask]).all()
    x = np.zeros((10, 3))
    moved, m = ds.move_points(x, scale=1.0, indices=[2, 5])
    assert m.sum() == 2 and (moved[~m] == 0).all() and (moved[m] != 0).all()
    with pytest.raises(ee.InputError, match="fraction= or indices="):
        ds.corrupt_labels(y)


def test_simulated_confidences_and_sweeps():
    c = ds.simulate_confidences(
        np.array([True, False] * 50), corrupted_level=0.1, clean_level=0.9, noise=0.01, seed=0
    )
    assert c[::2].mean() == pytest.approx(0.1, abs=0.01) and c[1::2].mean() == pytest.approx(
        0.9, abs=0.01
    )
    x, y = ds.reality_check_example(300, 2, seed=0)
    sweep = ds.confidence_sweep(x, y, levels=[0.0, 1.0], clean_level=0.5, seed=0)
    # flipped points least confident -> low AUERC and high R-AUROC; most confident -> reverse
    assert sweep["auerc_recall_at_1"][0] < sweep["auerc_recall_at_1"][1]
    assert sweep["r_auroc"][0] > 0.5 > sweep["r_auroc"][1]
    corr = ds.sigma_rank_correlation_sweep(300, injected=[0.0, 0.4], seed=0)
    assert corr["statistic"][0] < 0 < corr["statistic"][1]


def test_gaussian_clusters_and_pair_distances():
    x, y = ds.gaussian_clusters(300, 6, 8, spread=0.5, seed=0)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1, atol=1e-6)
    pos, neg = ds.positive_negative_distances(x, y, max_pairs=2000, seed=0)
    assert pos.mean() < neg.mean()
    assert pos.size <= 2000 and neg.size == 2000


def test_seeds_are_arguments_not_global_state():
    np.random.seed(0)  # noqa: NPY002 - global state must not matter
    a = ds.gaussian_clusters(50, 5, 4, seed=7)[0]
    np.random.seed(123)  # noqa: NPY002
    b = ds.gaussian_clusters(50, 5, 4, seed=7)[0]
    np.testing.assert_array_equal(a, b)
    c = ds.gaussian_clusters(50, 5, 4, seed=8)[0]
    assert not np.array_equal(a, c)
    # classes as equal as possible: 50 points over 5 classes -> 10 each (hand count)
    assert np.bincount(ds.gaussian_clusters(50, 5, 4, seed=7)[1]).tolist() == [10] * 5


def test_corrupt_by_indices_and_move_by_fraction():
    y = np.array([0, 1, 2, 0, 1, 2])
    y2, mask = ds.corrupt_labels(y, indices=[0, 4], seed=3)
    assert mask.tolist() == [True, False, False, False, True, False]
    assert y2[0] in (1, 2) and y2[4] in (0, 2)
    np.testing.assert_array_equal(y2[~mask], y[~mask])
    moved, m = ds.move_points(np.zeros((20, 2)), scale=2.0, fraction=0.5, seed=0)
    assert m.sum() == 10  # round(0.5 * 20)
    assert (np.abs(moved[m]).sum(axis=1) > 0).all() and (moved[~m] == 0).all()


def test_sigma_sweep_sign_against_scipy_on_a_hand_case():
    stats = pytest.importorskip("scipy.stats")
    corr = ds.sigma_rank_correlation_sweep(200, injected=[0.05, 0.45], noise=0.0, seed=1)
    # with no noise the truth is two-valued; the prediction tracks it exactly at 0.45
    assert corr["statistic"][1] == pytest.approx(1.0)
    truth = np.r_[np.full(40, 0.5), np.full(160, 0.1)]
    pred = np.r_[np.full(40, 0.05), np.full(160, 0.1)]
    assert corr["statistic"][0] == pytest.approx(stats.spearmanr(pred, truth).statistic)


_X, _Y = np.r_[np.eye(3), -np.eye(3)], np.array([0, 1, 0, 1, 0, 1])


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: ds.reality_check_example(10, 4), "which must be 1, 2 or 3"),
        (lambda: ds.reality_check_example(10, True), "which must be 1, 2 or 3; got True"),
        (lambda: ds.sigma_rank_correlation_sweep(50, fraction=None), r"^fraction must be"),
        (lambda: ds.reality_check_example(0, 1), "n"),
        (lambda: ds.reality_check_example(2.5, 1), "n"),
        (lambda: ds.gaussian_clusters(3, 5, 2), "n_classes"),
        (lambda: ds.gaussian_clusters(10, 2, 0), "dim"),
        (lambda: ds.gaussian_clusters(10, 2, 3, spread=-1.0), "spread"),
        (lambda: ds.gaussian_clusters(10, 2, 3, spread=float("nan")), "spread"),
        (lambda: ds.corrupt_labels([0, 1, 0], fraction=1.5), "fraction"),
        (lambda: ds.corrupt_labels([0, 1, 0], fraction=0.5, indices=[0]), "only one of"),
        (lambda: ds.corrupt_labels([0, 1, 0], indices=[3]), r"indices\[0\] = 3"),
        (lambda: ds.corrupt_labels([0, 1, 0], indices=[0, -1]), r"indices\[1\] = -1"),
        (lambda: ds.corrupt_labels([0, 1, 0], indices=[1, 1]), "repeat"),
        (lambda: ds.corrupt_labels([0, 1, 0], indices=[0.5]), "integer positions"),
        (lambda: ds.corrupt_labels([0, 0, 0], indices=[1]), "two classes"),
        (lambda: ds.corrupt_labels([0, 1, 0], indices=[1], seed=None), "seed"),
        (lambda: ds.move_points(np.zeros((3, 2)), scale=1.0, indices=[0], seed=-1), "seed"),
        (lambda: ds.confidence_sweep(_X, _Y, seed=1.5), "seed"),
        (lambda: ds.move_points(np.zeros((3, 2)), scale=-1.0, indices=[0]), "scale"),
        (lambda: ds.move_points(np.zeros((3, 2)), scale="big", indices=[0]), "scale"),
        (lambda: ds.move_points(np.zeros(3), scale=1.0, indices=[0]), "points"),
        (lambda: ds.simulate_confidences([0, 1], corrupted_level=0.1), "boolean mask"),
        (lambda: ds.simulate_confidences([True], corrupted_level=1.1), "corrupted_level"),
        (lambda: ds.simulate_confidences([True], corrupted_level=0.1, clean_level=-0.1), "clean"),
        (lambda: ds.simulate_confidences([True], corrupted_level=0.1, noise=-1), "noise"),
        (lambda: ds.sigma_rank_correlation_sweep(50, method="pearson"), "method"),
        (lambda: ds.sigma_rank_correlation_sweep(50, injected=[np.nan]), "injected"),
        (lambda: ds.sigma_rank_correlation_sweep(50, clean_sigma=-0.1), "clean_sigma"),
        (lambda: ds.sigma_rank_correlation_sweep(50, noise=-1.0), "noise"),
        (lambda: ds.sigma_rank_correlation_sweep(50, fraction=1.5), "fraction"),
        (lambda: ds.confidence_sweep(_X, _Y, levels=[0.5, 1.5]), r"levels\[1\] = 1.5"),
        (lambda: ds.confidence_sweep(_X, _Y, levels=[]), "levels"),
        (lambda: ds.confidence_sweep(_X, _Y, clean_level=2.0), "clean_level"),
        (lambda: ds.confidence_sweep(_X, _Y, fraction=-0.1), "fraction"),
        (lambda: ds.positive_negative_distances(np.zeros((3, 2)), [0, 1]), "labels"),
        (
            lambda: ds.positive_negative_distances(np.eye(3), [0, 1, 1], distance="l1"),
            "distance",
        ),
        (lambda: ds.positive_negative_distances(np.eye(3), [0, 1, 1], max_pairs=0), "max_pairs"),
        (
            lambda: ds.positive_negative_distances(
                [[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]], [0, 0, 1], distance="cosine"
            ),
            r"non-zero vectors; 1 row\(s\) of embeddings are all zero \(first at row 1\)",
        ),
    ],
)
def test_bad_inputs_raise_input_error(call, match):
    with pytest.raises(ee.InputError, match=match):
        call()


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_pair_distances_are_real_pairs_of_the_right_kind(distance):
    sk = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((12, 3))
    y = np.array([0, 1, 2] * 4)
    pos, neg = ds.positive_negative_distances(x, y, max_pairs=500, distance=distance, seed=0)
    d = sk.pairwise_distances(x, metric=distance)
    same = y[:, None] == y[None, :]
    off = ~np.eye(12, dtype=bool)
    pos_set, neg_set = d[same & off], d[~same]
    # each sampled distance is one of the brute-force pair distances of its kind
    assert np.abs(pos[:, None] - pos_set[None, :]).min(axis=1).max() < 1e-9
    assert np.abs(neg[:, None] - neg_set[None, :]).min(axis=1).max() < 1e-9
    # and i == j is never sampled (no zero self-distance among the positives)
    assert pos.min() > 0


def test_confidence_sweep_with_moved_points():
    # moving a subset far off its band makes those queries wrong; giving them low confidence
    # ranks the errors (R-AUROC > 1/2), high confidence ranks them backwards
    x, y = ds.reality_check_example(300, 3, seed=1)
    sweep = ds.confidence_sweep(
        x, y, levels=[0.0, 1.0], clean_level=0.5, corruption="move", scale=3.0, seed=0
    )
    assert sweep["r_auroc"][0] > 0.5 > sweep["r_auroc"][1]
    assert sweep["auerc_map_at_r"][0] < sweep["auerc_map_at_r"][1]
    with pytest.raises(ee.InputError, match="Did you mean 'move'"):
        ds.confidence_sweep(x, y, corruption="mov")
    with pytest.raises(ee.InputError, match="scale"):
        ds.confidence_sweep(x, y, corruption="move", scale=-1.0)


@pytest.mark.parametrize("corruption", ["flip", "move"])
def test_confidence_sweep_names_its_own_arguments_when_labels_and_points_disagree(corruption):
    x, y = ds.reality_check_example(40, 2, seed=0)
    with pytest.raises(ee.InputError, match=r"labels has 10 .* 40 rows of points"):
        ds.confidence_sweep(x, y[:10], corruption=corruption)
