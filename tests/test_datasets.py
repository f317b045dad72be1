"""embedeval.datasets: toy spaces obey their definitions; simulations touch what they should."""

from __future__ import annotations

import numpy as np
import pytest

import embedeval as ee
from embedeval import datasets as ds


@pytest.mark.parametrize("which", [1, 2, 3])
def test_reality_check_spaces_follow_their_bands(which):
    x, y = ds.reality_check_example(2000, which, seed=3)
    bands = ds.REALITY_CHECK_BANDS[which]
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
