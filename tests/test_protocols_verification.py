"""Verification metrics against scikit-learn, hand-computed cases and plain-loop oracles."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
from sklearn.metrics import roc_curve

import embedeval as ee
from embedeval.protocols import verification as ver

# ---------------------------------------------------------------------------- oracles


def tar_at_far_loop(scores, genuine, far):
    """Brute force: every observed score (and +inf) as threshold, accept score >= t."""
    scores = [float(s) for s in scores]
    n_gen = sum(1 for g in genuine if g)
    n_imp = len(scores) - n_gen
    best = 0.0
    for t in [*set(scores), float("inf")]:
        fa = sum(1 for s, g in zip(scores, genuine, strict=True) if not g and s >= t)
        ta = sum(1 for s, g in zip(scores, genuine, strict=True) if g and s >= t)
        if fa / n_imp <= far:
            best = max(best, ta / n_gen)
    return best


def sklearn_tar_at_far(scores, genuine, far):
    fpr, tpr, _ = roc_curve(genuine, scores, drop_intermediate=False)
    return float(tpr[fpr <= far].max())


def tied_pairs(rng, n):
    """Scores on a coarse grid (many ties, genuine and impostor mixed) and genuine flags."""
    scores = rng.integers(0, 12, n) / 4.0
    genuine = rng.random(n) < 0.3 + 0.05 * scores
    genuine[:2] = [True, False]
    return scores, genuine


# ---------------------------------------------------------------------------- roc / tar_at_far


def test_six_pair_roc_by_hand():
    # genuine scores 0.9, 0.8, 0.4; impostor scores 0.7, 0.4, 0.1 (a genuine-impostor tie at 0.4)
    scores = [0.9, 0.7, 0.8, 0.4, 0.4, 0.1]
    genuine = [True, False, True, True, False, False]
    r = ver.roc(scores, genuine)
    # t=inf: nothing; t=0.9: 1/3 gen; t=0.8: 2/3 gen; t=0.7: 2/3 gen, 1/3 imp;
    # t=0.4: 3/3 gen, 2/3 imp (the tie is accepted together); t=0.1: all.
    assert r.thresholds.tolist() == [np.inf, 0.9, 0.8, 0.7, 0.4, 0.1]
    np.testing.assert_allclose(r.tar, [0, 1 / 3, 2 / 3, 2 / 3, 1, 1])
    np.testing.assert_allclose(r.far, [0, 0, 0, 1 / 3, 2 / 3, 1])
    with pytest.warns(ee.EmbedevalWarning, match="far=0.3"):  # 3 impostors: 0.3 < 1/3
        res = ver.tar_at_far(scores, genuine, far=[0.3, 1 / 3, 0.5, 2 / 3])
    # FAR <= 0.3 allows no impostor: best is t=0.8 (TAR 2/3); 1/3 allows one: still 2/3 (t=0.7
    # adds no genuine); 0.5 still one impostor; 2/3 allows two: t=0.4, TAR 1.
    np.testing.assert_allclose(res.tar, [2 / 3, 2 / 3, 2 / 3, 1.0])
    assert res.threshold.tolist() == [0.8, 0.7, 0.7, 0.4]
    np.testing.assert_allclose(res.far_achieved, [0, 1 / 3, 1 / 3, 2 / 3])
    # EER: FAR - FNMR goes -1, -2/3, -1/3, 0 at t=0.7 (FAR = FNMR = 1/3).
    assert ver.eer(scores, genuine) == pytest.approx(1 / 3)


@pytest.mark.parametrize("seed", range(6))
def test_roc_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    scores, genuine = tied_pairs(rng, 200)
    r = ver.roc(scores, genuine)
    fpr, tpr, thr = roc_curve(genuine, scores, drop_intermediate=False)
    np.testing.assert_array_equal(r.far, fpr)
    np.testing.assert_array_equal(r.tar, tpr)
    np.testing.assert_array_equal(r.thresholds, thr)


@pytest.mark.parametrize("seed", range(8))
def test_tar_at_far_matches_sklearn_and_loop(seed):
    rng = np.random.default_rng(seed)
    scores, genuine = tied_pairs(rng, 150)
    if seed % 2:
        scores = rng.standard_normal(150) + genuine  # continuous, no ties
    fars = [0.001, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ee.EmbedevalWarning)
        res = ver.tar_at_far(scores, genuine, far=fars)
    for f, got, thr in zip(fars, res.tar, res.threshold, strict=True):
        assert got == sklearn_tar_at_far(scores, genuine, f)
        assert got == tar_at_far_loop(scores, genuine, f)
        # The stated threshold achieves the stated TAR under the accept rule score >= t.
        assert np.mean(scores[genuine] >= thr) == got
        assert np.mean(scores[~genuine] >= thr) <= f


def test_distances_flip_the_accept_rule():
    rng = np.random.default_rng(3)
    scores, genuine = tied_pairs(rng, 100)
    sim = ver.tar_at_far(scores, genuine, far=[0.1, 0.3])
    dist = ver.tar_at_far(-scores, genuine, far=[0.1, 0.3], higher_is_similar=False)
    np.testing.assert_array_equal(sim.tar, dist.tar)
    np.testing.assert_array_equal(sim.threshold, -dist.threshold)
    assert ver.eer(-scores, genuine, higher_is_similar=False) == ver.eer(scores, genuine)


def test_too_few_impostors_is_flagged_not_extrapolated():
    scores = [0.9, 0.8, 0.7, 0.6]
    genuine = [True, False, True, False]
    with pytest.warns(ee.EmbedevalWarning, match="fewer than 1/FAR"):
        res = ver.tar_at_far(scores, genuine, far=[1e-3, 0.5])
    assert res.resolved.tolist() == [False, True]
    # FAR 1e-3 with 2 impostors: only FAR = 0 qualifies -> accept score >= 0.9, TAR 1/2.
    assert res.tar.tolist() == [0.5, 1.0]
    assert "fewer impostor pairs than 1/FAR" in res.table()


def test_fnmr_and_det_are_complements():
    rng = np.random.default_rng(5)
    scores, genuine = tied_pairs(rng, 120)
    fars = [0.05, 0.2]
    np.testing.assert_allclose(
        ver.fnmr_at_fmr(scores, genuine, fars), 1 - ver.tar_at_far(scores, genuine, fars).tar
    )
    fmr, fnmr, _ = ver.det_curve(scores, genuine)
    fpr, tpr, _ = roc_curve(genuine, scores, drop_intermediate=False)
    np.testing.assert_array_equal(fmr, fpr)
    np.testing.assert_allclose(fnmr, 1 - tpr)


def eer_loop(scores, genuine):
    """Walk sklearn's ROC and interpolate where FAR - FNMR changes sign."""
    fpr, tpr, _ = roc_curve(genuine, scores, drop_intermediate=False)
    prev = None
    for far, tar in zip(fpr, tpr, strict=True):
        d = far - (1 - tar)
        if d >= 0:
            if d == 0:
                return far
            pfar, pd = prev
            return pfar + (far - pfar) * (-pd) / (d - pd)
        prev = (far, d)
    raise AssertionError


@pytest.mark.parametrize("seed", range(5))
def test_eer_matches_interpolation_loop(seed):
    rng = np.random.default_rng(seed)
    scores, genuine = tied_pairs(rng, 90)
    assert ver.eer(scores, genuine) == pytest.approx(eer_loop(scores, genuine), abs=1e-15)


def test_eer_by_hand_interpolated():
    # genuine 0.9, 0.5; impostor 0.7, 0.3.  ROC: (far, fnmr) = (0, 1), (0, .5), (.5, .5) at 0.7:
    # d = 0 exactly -> EER 0.5.  Shift the impostor to 0.6 and add one at 0.55:
    assert ver.eer([0.9, 0.5, 0.7, 0.3], [True, True, False, False]) == 0.5
    # genuine 0.9, 0.5; impostor 0.7, 0.6, 0.3: points (0,.5) d=-.5 at 0.9; (1/3,.5) d=-1/6 at
    # 0.7; (2/3,.5) d=1/6 at 0.6 -> crossing halfway: FAR = 1/3 + (1/3)(1/2) = 1/2.
    assert ver.eer([0.9, 0.5, 0.7, 0.6, 0.3], [True, True, False, False, False]) == 0.5


# ---------------------------------------------------------------------------- k-fold (LFW)


def kfold_loop(scores, genuine, n_folds):
    """LFW: consecutive folds; best threshold on the other folds among midpoints of distinct
    training scores (plus above/below all), ties to the highest; accuracy on the held-out fold."""
    n = len(scores)
    sizes = [len(c) for c in np.array_split(np.arange(n), n_folds)]
    bounds = [0]
    for s in sizes:
        bounds.append(bounds[-1] + s)
    accs = []
    for f in range(n_folds):
        train = [i for i in range(n) if not bounds[f] <= i < bounds[f + 1]]
        distinct = sorted({float(scores[i]) for i in train}, reverse=True)
        cands = [np.inf] + [(a + b) / 2 for a, b in itertools.pairwise(distinct)] + [-np.inf]
        best_t, best_acc = None, -1
        for t in cands:  # highest first, so a later tie does not replace it
            acc = sum((scores[i] >= t) == genuine[i] for i in train)
            if acc > best_acc:
                best_t, best_acc = t, acc
        test = range(bounds[f], bounds[f + 1])
        accs.append(sum((scores[i] >= best_t) == genuine[i] for i in test) / len(test))
    return float(np.mean(accs)), float(np.std(accs)), accs


@pytest.mark.parametrize("seed", range(4))
def test_kfold_accuracy_matches_lfw_loop(seed):
    rng = np.random.default_rng(seed)
    scores, genuine = tied_pairs(rng, 103)
    mean, std, per_fold = ver.kfold_accuracy(scores, genuine, n_folds=10)
    want_mean, want_std, want = kfold_loop(scores, genuine, 10)
    np.testing.assert_allclose(per_fold, want, rtol=0, atol=1e-15)
    assert mean == pytest.approx(want_mean) and std == pytest.approx(want_std)


def test_kfold_explicit_folds_by_hand():
    # Fold 0 trains on fold 1 (genuine 0.8, impostor 0.2 -> best midpoint 0.5, both right) and
    # tests 0.6 (genuine, accepted) and 0.4 (impostor, rejected): 1.0.  Fold 1 trains on fold 0
    # (genuine 0.6, impostor 0.4 -> 0.5) and tests 0.8, 0.2: 1.0.
    mean, std, per_fold = ver.kfold_accuracy(
        [0.6, 0.4, 0.8, 0.2], [True, False, True, False], folds=[0, 0, 1, 1]
    )
    assert per_fold.tolist() == [1.0, 1.0] and mean == 1.0 and std == 0.0


def test_kfold_training_ties_go_to_the_strictest_threshold_counted_exactly():
    # Fold 0 holds one impostor at 1.0; its training pairs are 5 genuine and 5 impostors at 1.0
    # and 10 impostors at 0.0. Rejecting everything and accepting scores >= 0.5 both get 15 of
    # 20 right (accuracies that floating-point rates round apart); the strictest, rejecting
    # everything, rejects the held-out impostor: 1.0. Fold 1 trains on that impostor alone
    # (reject everything) and so scores its 15 impostors of 20 right: 0.75.
    scores = np.array([1.0] + [1.0] * 10 + [0.0] * 10)
    genuine = np.array([False] + [True] * 5 + [False] * 15)
    _, _, per_fold = ver.kfold_accuracy(scores, genuine, folds=np.array([0] + [1] * 20))
    assert per_fold.tolist() == [1.0, 0.75]
    # Distances: training pairs at 0 (genuine), 0 and 5 (impostors) tie 2/3 between rejecting
    # everything and accepting distances <= 2.5; the strictest (the lowest distance threshold)
    # rejects the held-out genuine pair at distance 0: 0. Fold 1 trains on that genuine pair
    # (accept everything): 1 of 3 right.
    d, g = np.array([0.0, 0.0, 0.0, 5.0]), np.array([True, True, False, False])
    _, _, per_fold = ver.kfold_accuracy(d, g, folds=np.array([0, 1, 1, 1]), higher_is_similar=False)
    assert per_fold.tolist() == pytest.approx([0.0, 1 / 3], abs=1e-15)


def test_kfold_training_folds_of_one_kind():
    # Pairs stored genuine first, then impostors; 2 consecutive folds.  Fold 0 (the genuine
    # 0.9, 0.8) trains on two impostors: rejecting everything is right on both, so nothing is
    # accepted and the held-out genuine pairs score 0/2.  Fold 1 trains on two genuine pairs:
    # accept everything, so the held-out impostors score 0/2.  Mean 0, std 0.
    mean, std, per_fold = ver.kfold_accuracy(
        [0.9, 0.8, 0.1, 0.2], [True, True, False, False], n_folds=2
    )
    assert per_fold.tolist() == [0.0, 0.0] and mean == 0.0 and std == 0.0
    # Three folds: fold 2 (impostors 0.1, 0.2) trains on genuine 0.9, 0.8 and impostor 0.3:
    # best t = midpoint (0.8 + 0.3) / 2 = 0.55 rejects both held-out impostors: 2/2.
    # The same loop as the LFW oracle above gives every fold.
    scores, genuine = [0.9, 0.8, 0.3, 0.1, 0.2, 0.25], [True, True, False, False, False, False]
    _, _, per_fold = ver.kfold_accuracy(scores, genuine, n_folds=3)
    assert per_fold.tolist() == kfold_loop(scores, genuine, 3)[2]


@pytest.mark.parametrize("held_out_genuine", [False, True])
@pytest.mark.parametrize("higher_is_similar", [True, False])
def test_kfold_threshold_separates_adjacent_floats_and_extreme_scores(
    higher_is_similar, held_out_genuine
):
    # Fold 1 holds one pair, an impostor at a (or a genuine pair at b > a); fold 0 trains on it
    # alone (reject, or accept, everything) and gets 1 of its 3 pairs right. Fold 1 trains on
    # genuine pairs at b and impostors at a: every training pair is right only when b is
    # accepted and a rejected, so its held-out pair is right: 1/1, whatever the gap b - a
    # (adjacent floats, whose midpoint rounds to one of them) and however large the scores.
    genuine = np.array([True, False, True, False])
    if held_out_genuine:
        genuine = ~genuine
    folds = np.array([0, 0, 0, 1])
    sign = 1.0 if higher_is_similar else -1.0
    for a, b in ((1.0, np.nextafter(1.0, 2.0)), (1e308, 1.5e308), (-1.5e308, 1.5e308)):
        scores = sign * np.where(genuine, b, a)
        _, _, per_fold = ver.kfold_accuracy(
            scores, genuine, folds=folds, higher_is_similar=higher_is_similar
        )
        assert per_fold.tolist() == [1 / 3, 1.0], (a, b)


# ---------------------------------------------------------------------------- from embeddings


def test_pair_scores_cosine_is_float64():
    # The docstring promises float64 scores: a vector with itself is 1 to float64 precision,
    # and scikit-learn's paired cosine distances (float64) agree to 1e-12.
    from sklearn.metrics.pairwise import paired_cosine_distances

    rng = np.random.default_rng(0)
    a = rng.standard_normal((200, 32)).astype(np.float32)
    b = rng.standard_normal((200, 32)).astype(np.float32)
    np.testing.assert_allclose(ver.pair_scores(a, a), 1.0, rtol=0, atol=1e-14)
    want = 1.0 - paired_cosine_distances(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(ver.pair_scores(a, b), want, rtol=0, atol=1e-12)


def test_pair_scores_three_distances_by_hand():
    a = np.array([[3.0, 4.0], [1.0, 0.0]])
    b = np.array([[6.0, 8.0], [0.0, 2.0]])
    np.testing.assert_allclose(ver.pair_scores(a, b, distance="cosine"), [1.0, 0.0])
    np.testing.assert_allclose(ver.pair_scores(a, b, distance="inner_product"), [50.0, 0.0])
    np.testing.assert_allclose(ver.pair_scores(a, b, distance="euclidean"), [5.0, np.sqrt(5)])


def test_pair_scores_sqeuclidean_by_hand_and_against_numpy():
    # (3-6)^2 + (4-8)^2 = 9 + 16 = 25; (1-0)^2 + (0-2)^2 = 1 + 4 = 5; a pair with itself: 0.
    a = np.array([[3.0, 4.0], [1.0, 0.0], [2.0, -1.0]])
    b = np.array([[6.0, 8.0], [0.0, 2.0], [2.0, -1.0]])
    assert ver.pair_scores(a, b, distance="sqeuclidean").tolist() == [25.0, 5.0, 0.0]
    # Random float32 rows: the plain sum of squared differences, in float64.
    rng = np.random.default_rng(3)
    a = rng.standard_normal((50, 16)).astype(np.float32)
    b = rng.standard_normal((50, 16)).astype(np.float32)
    want = np.sum((a.astype(np.float64) - b.astype(np.float64)) ** 2, 1)
    got = ver.pair_scores(a, b, distance="sqeuclidean")
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=0)
    assert got.dtype == np.float64


def lfw_grid_loop(dist, same, grid, n_folds):
    """The insightface / facenet 10-fold accuracy (their calculate_roc / calculate_accuracy),
    written from its description: folds from scikit-learn's ``KFold(n_folds, shuffle=False)``;
    per fold, the training accuracy of ``dist < t`` for every grid value, the first grid value
    with the best one, and the accuracy of that threshold on the held-out fold."""
    from sklearn.model_selection import KFold

    accs = []
    for train, test in KFold(n_splits=n_folds, shuffle=False).split(np.arange(len(dist))):
        best_t, best_acc = None, -1.0
        for t in grid:
            acc = np.mean((dist[train] < t) == same[train])
            if acc > best_acc:  # strict: a later grid value with the same accuracy loses
                best_t, best_acc = t, acc
        accs.append(np.mean((dist[test] < best_t) == same[test]))
    return accs


@pytest.mark.parametrize("n_pairs", [600, 605])
def test_kfold_accuracy_reproduces_the_insightface_recipe_fold_by_fold(n_pairs):
    # The standard recipe in one call: squared distances of unit vectors, grid 0..4 step 0.01.
    # kfold_accuracy's folds are consecutive blocks, the first n % 10 one pair larger (605 pairs:
    # five folds of 61, five of 60), which is KFold(10, shuffle=False); among grid values with
    # equal training accuracy both take the first (the smallest).  The scripts accept d < t and
    # embedeval d <= t: they can differ only for a distance exactly on a grid value, and no
    # distance here is one (checked).
    rng = np.random.default_rng(7)
    a = rng.standard_normal((n_pairs, 16))
    a /= np.linalg.norm(a, axis=1, keepdims=True)
    same = rng.random(n_pairs) < 0.5
    other = rng.standard_normal((n_pairs, 16))
    other /= np.linalg.norm(other, axis=1, keepdims=True)
    b = np.where(same[:, None], a + 0.35 * rng.standard_normal((n_pairs, 16)), other)
    b /= np.linalg.norm(b, axis=1, keepdims=True)
    a, b = a.astype(np.float32), b.astype(np.float32)  # embeddings are searched in float32
    dist = np.sum((a.astype(np.float64) - b.astype(np.float64)) ** 2, 1)
    grid = np.arange(0, 4, 0.01)
    assert not np.isin(dist, grid).any()
    want = lfw_grid_loop(dist, same, grid, 10)
    mean, std, per_fold = ver.kfold_accuracy(
        ver.pair_scores(a, b, distance="sqeuclidean"),
        same,
        thresholds=grid,
        higher_is_similar=False,
    )
    assert per_fold.tolist() == want
    assert mean == pytest.approx(np.mean(want)) and std == pytest.approx(np.std(want))
    assert 0.5 < mean < 1.0  # neither trivial nor perfect: the threshold matters


def test_sqeuclidean_is_refused_where_embeddings_are_scored_internally():
    x, labels = np.eye(4), [0, 0, 1, 1]
    with pytest.raises(ee.InputError, match=r"sqeuclidean.*pair_scores only.*'euclidean'"):
        ver.tar_at_far_all_pairs(x, labels, distance="sqeuclidean")
    with pytest.raises(ee.InputError, match=r"sqeuclidean.*pair_scores only.*square them"):
        ver.open_set_identification(x, [0, 1, 2, 3], x[:2], [0, 1], distance="sqeuclidean")
    with pytest.raises(ee.InputError, match=r"distance='manhattan'.*'sqeuclidean'"):
        ver.pair_scores(x, x, distance="manhattan")


def all_pair_scores_loop(x, labels, distance):
    scores, genuine = [], []
    n = len(x)
    for i in range(n):
        for j in range(i + 1, n):
            a, b = x[i].astype(np.float64), x[j].astype(np.float64)
            if distance == "euclidean":
                s = -np.sqrt(((a - b) ** 2).sum())
            elif distance == "cosine":
                s = a @ b / np.sqrt((a @ a) * (b @ b))
            else:
                s = a @ b
            scores.append(s)
            genuine.append(labels[i] == labels[j])
    return np.array(scores), np.array(genuine)


def integer_set(seed, n=90, dim=6):
    """Small integer vectors with 4 non-zero +-1 entries: norm 2, so cosine scores, inner
    products and squared distances are exact in float32 -- and heavily tied."""
    rng = np.random.default_rng(seed)
    x = np.zeros((n, dim), np.float32)
    for i in range(n):
        cols = rng.choice(dim, 4, replace=False)
        x[i, cols] = rng.choice([-1.0, 1.0], 4)
    labels = rng.integers(0, 12, n)
    # Members of a class share most of their vector, so genuine scores run higher.
    x[labels % 2 == 0, 0] = 1.0
    return x, labels


@pytest.mark.parametrize("distance", ["cosine", "inner_product", "euclidean"])
@pytest.mark.parametrize("sample_size", [3, 50, 100_000])
def test_all_pairs_exact_against_sklearn_on_every_pair(distance, sample_size):
    x, labels = integer_set(7)
    fars = [1e-3, 0.01, 0.05, 0.2, 0.6, 1.0]
    scores, genuine = all_pair_scores_loop(x, labels, distance)
    got = ver.tar_at_far_all_pairs(
        x, labels, far=fars, distance=distance, block_size=7, sample_size=sample_size, seed=1
    )
    assert got.n_genuine == genuine.sum() and got.n_impostor == (~genuine).sum()
    for f, tar, thr, fa in zip(fars, got.tar, got.threshold, got.far_achieved, strict=True):
        assert tar == sklearn_tar_at_far(scores, genuine, f)
        # The stated threshold is a float32 score (a distance for Euclidean): compare with the
        # float64 oracle scores up to float32 rounding.
        t = thr if distance != "euclidean" else -thr
        assert np.isclose(np.mean(scores[genuine] >= t - 1e-6), tar)
        assert np.isclose(np.mean(scores[~genuine] >= t - 1e-6), fa) and fa <= f


@pytest.mark.parametrize("block_size", [1, 2, 3, 6])
def test_all_pairs_identical_vectors_tie_at_distance_zero(block_size):
    # Three copies of u (labels 0, 0, 1) and three of w (labels 1, 2, 2).  The 6 pairs of
    # identical vectors are all at distance 0: genuine (0, 1) and (4, 5), impostors (0, 2),
    # (1, 2), (3, 4), (3, 5).  The 9 pairs u-w are at |u - w|: genuine (2, 3), 8 impostors.
    # So 3 genuine and 12 impostor pairs.  At FAR 0.25 (3 impostors allowed) the tied block at
    # 0 (4 impostors) cannot be accepted: TAR 0.  At FAR 1/3 it can: TAR 2/3.  A float32
    # ||u||^2 + ||w||^2 - 2 u.w puts w's copies about 0.01 apart, which split the tie.
    u = [-5.227484226226807, -4.1306352615356445]
    w = [-24.414674758911133, 17.997074127197266]
    x = np.array([u, u, u, w, w, w], np.float32)
    labels = np.array([0, 0, 1, 1, 2, 2])
    fars = [0.25, 1 / 3, 1.0]
    got = ver.tar_at_far_all_pairs(x, labels, far=fars, distance="euclidean", block_size=block_size)
    np.testing.assert_allclose(got.tar, [0.0, 2 / 3, 1.0])
    i, j = np.triu_indices(6, 1)
    dist = np.sqrt(((x[i].astype(np.float64) - x[j]) ** 2).sum(axis=1))
    fpr, tpr, _ = roc_curve(labels[i] == labels[j], -dist, drop_intermediate=False)
    np.testing.assert_allclose(got.tar, [tpr[fpr <= f].max() for f in fars])
    assert got.threshold[1] == 0.0 and got.far_achieved[1] == pytest.approx(4 / 12)


def test_all_pairs_pairs_with_a_twin_tie():
    # 52 vectors drawn from 17 distinct ones, 4 labels: pairs (a, c) and (b, c) with a = b are
    # equal in exact arithmetic, but a float32 product computes them at different places and
    # can round them a unit apart, splitting a tied genuine/impostor set at the cut.  Oracle:
    # scikit-learn on the float64 inner products of every pair (equal inputs, equal values).
    rng = np.random.default_rng(0)
    n, d = int(rng.integers(10, 60)), int(rng.integers(2, 12))
    base = rng.normal(size=(max(2, n // 3), d)).astype(np.float32)
    x = base[rng.integers(0, base.shape[0], n)]
    labels = rng.integers(0, 4, n)
    i, j = np.triu_indices(n, 1)
    scores = (x[i].astype(np.float64) * x[j]).sum(axis=1)
    fpr, tpr, _ = roc_curve(labels[i] == labels[j], scores, drop_intermediate=False)
    fars = np.arange(1, 40) / 40
    got = ver.tar_at_far_all_pairs(x, labels, far=fars, distance="inner_product", block_size=7)
    np.testing.assert_allclose(got.tar, [tpr[fpr <= f].max() for f in fars], rtol=0, atol=1e-12)


def test_all_pairs_unresolved_far_is_flagged():
    x, labels = integer_set(2, n=20)
    with pytest.warns(ee.EmbedevalWarning, match="fewer than 1/FAR"):
        got = ver.tar_at_far_all_pairs(x, labels, far=[1e-6, 0.1])
    assert got.resolved.tolist() == [False, True]


def test_all_pairs_random_float_data_matches_functional_core():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 30, 300)
    x = (rng.standard_normal((30, 16))[labels] + rng.standard_normal((300, 16))).astype(np.float32)
    fars = [1e-4, 1e-3, 1e-2, 0.1]
    got = ver.tar_at_far_all_pairs(x, labels, far=fars, distance="inner_product", block_size=33)
    # Oracle: the float32 products of every pair, then the functional core (checked above).
    s = x @ x.T
    iu = np.triu_indices(300, 1)
    want = ver.tar_at_far(s[iu], labels[iu[0]] == labels[iu[1]], far=fars)
    np.testing.assert_array_equal(got.tar, want.tar)
    # BLAS may round a float32 product differently for another block shape (one ulp).
    np.testing.assert_allclose(got.threshold, want.threshold, rtol=1e-6)


# ---------------------------------------------------------------------------- open set


def open_set_loop(q, yq, g, yg, fpir, rank):
    sims = q.astype(np.float64) @ g.astype(np.float64).T
    gal_ids = set(yg.tolist())
    mated_hits, nonmated_best = [], []
    rank1 = []
    for i in range(len(q)):
        row = sims[i]
        order = sorted(range(len(g)), key=lambda j: (-row[j], j))
        if yq[i] in gal_ids:
            pos = next(p for p, j in enumerate(order) if yg[j] == yq[i])
            rank1.append(pos == 0)
            mated_hits.append(row[order[pos]] if pos < rank else -np.inf)
        else:
            nonmated_best.append(row[order[0]])
    out = []
    for f in fpir:
        best = 0.0
        for t in [*mated_hits, *nonmated_best, np.inf]:
            if t == -np.inf:  # a mate beyond the rank is a miss at every threshold
                continue
            fp = sum(s >= t for s in nonmated_best) / len(nonmated_best)
            if fp <= f:
                best = max(best, sum(s >= t for s in mated_hits) / len(mated_hits))
        out.append(best)
    return out, float(np.mean(rank1))


@pytest.mark.parametrize("rank", [1, 3])
def test_open_set_matches_loop(rank):
    rng = np.random.default_rng(rank)
    g = rng.integers(-2, 3, (40, 5)).astype(np.float32)
    yg = rng.integers(0, 15, 40)
    q = rng.integers(-2, 3, (60, 5)).astype(np.float32)
    yq = rng.integers(0, 20, 60)
    fpir = [0.05, 0.1, 0.3, 1.0]
    with warnings.catch_warnings():  # FPIR 0.05 may be below 1 / (non-mated searches)
        warnings.simplefilter("ignore", ee.EmbedevalWarning)
        got = ver.open_set_identification(q, yq, g, yg, fpir, rank=rank, distance="inner_product")
    want, rank1 = open_set_loop(q, yq, g, yg, fpir, rank)
    np.testing.assert_allclose(got.dir, want, rtol=0, atol=1e-15)
    assert got.rank1 == pytest.approx(rank1)


# ---------------------------------------------------------------------------- bad input


def test_bad_input_messages():
    with pytest.raises(ee.InputError, match="genuine has no impostor"):
        ver.roc([0.1, 0.2], [True, True])
    with pytest.raises(ee.InputError, match="one flag per pair"):
        ver.roc([0.1, 0.2], [True])
    with pytest.raises(ee.InputError, match=r"far must hold false accept rates in \(0, 1\]"):
        ver.tar_at_far([0.1, 0.2], [True, False], far=[0.0])
    with pytest.raises(ee.InputTypeError, match="higher_is_similar"):
        ver.tar_at_far([0.1, 0.2], [True, False], higher_is_similar="yes")
    with pytest.raises(ee.InputError, match="no genuine"):
        ver.tar_at_far_all_pairs(np.eye(3), [0, 1, 2])
    with pytest.raises(ee.InputError, match="same shape"):
        ver.pair_scores(np.ones((2, 3)), np.ones((3, 3)))
    with pytest.raises(ee.InputError, match="no non-mated"):
        ver.open_set_identification(np.eye(2), [0, 1], np.eye(2), [0, 1])


def test_all_pairs_recovers_from_a_misplaced_bracket(monkeypatch):
    # The first brackets are placed at the very top of the impostor scores (far above the true
    # order statistics for most targets): the scan must notice and retry, and stay exact.
    x, labels = integer_set(5)
    scores, genuine = all_pair_scores_loop(x, labels, "inner_product")
    real = ver._brackets
    calls = []

    def misplaced(m, n_imp, sample, margin):
        calls.append(margin)
        if len(calls) == 1:
            top = np.float32(sample.max())
            return np.full(m.size, top), np.full(m.size, top)
        return real(m, n_imp, sample, margin)

    monkeypatch.setattr(ver, "_brackets", misplaced)
    fars = [0.01, 0.1, 0.5]
    got = ver.tar_at_far_all_pairs(x, labels, far=fars, distance="inner_product", block_size=9)
    assert len(calls) >= 2
    for f, tar in zip(fars, got.tar, strict=True):
        assert tar == sklearn_tar_at_far(scores, genuine, f)


def test_kfold_accuracy_on_a_grid_matches_published_loop():
    # The grid procedure of the published LFW scripts on arbitrary distances: a grid 0..4 step
    # 0.01, per fold the first grid value with the best training accuracy (accept distance < t),
    # accuracy on the fold.  (The scripts feed it squared distances of unit vectors: see the
    # insightface test above.)
    rng = np.random.default_rng(8)
    same = rng.random(600) < 0.5
    dist = np.where(same, rng.normal(0.9, 0.25, 600), rng.normal(1.5, 0.25, 600)).clip(0, 4)
    grid = np.arange(0, 4, 0.01)
    want = []
    for f in range(10):
        test = np.zeros(600, bool)
        test[f * 60 : (f + 1) * 60] = True
        train_acc = [np.mean((dist[~test] < t) == same[~test]) for t in grid]
        best = grid[int(np.argmax(train_acc))]
        want.append(np.mean((dist[test] < best) == same[test]))
    mean, std, per_fold = ver.kfold_accuracy(dist, same, thresholds=grid, higher_is_similar=False)
    np.testing.assert_allclose(per_fold, want)
    assert mean == pytest.approx(np.mean(want)) and std == pytest.approx(np.std(want))


def test_open_set_identical_gallery_rows_tie_and_rank_by_index():
    # Gallery row 6 is a copy of row 0, with another identity.  The query (identity "a", the
    # copy's) lies near row 0, so rows 0 and 6 are its two best, tied in exact arithmetic: the
    # tie goes to the lower index, row 0 ("b"), and the mate ranks 2nd -> rank-1 rate 0/1 and
    # DIR at rank 1 is 0.  A float32 product can score the copy one unit in the last place
    # higher and put the mate first.  The oracle: float64 products (equal for equal rows).
    rng = np.random.default_rng(0)
    d, ng = int(rng.integers(4, 20)), int(rng.integers(3, 10))
    gallery = rng.normal(size=(ng, d)).astype(np.float32)
    gallery[-1] = gallery[0]
    query = (gallery[:1] + 0.05 * rng.normal(size=(1, d))).astype(np.float32)
    query = np.vstack([query, -gallery[:1]])  # plus one non-mated search
    g_ids = [*"bcdefghij"[: ng - 1], "a"]
    s = query[:1].astype(np.float64) @ gallery.T.astype(np.float64)
    order = sorted(range(ng), key=lambda j: (-s[0, j], j))
    assert order[:2] == [0, ng - 1]  # the tie, broken by index
    got = ver.open_set_identification(
        query, ["a", "z"], gallery, g_ids, fpir=[1.0], distance="inner_product", block_size=1
    )
    assert got.rank1 == 0.0 and got.dir.tolist() == [0.0]


@pytest.mark.parametrize("distance", ["inner_product", "euclidean", "cosine"])
def test_open_set_ranks_scores_closer_than_float32_resolves(distance):
    # Query (1, 1), identity "a"; gallery row 0 (1, 0) is "b", row 1 (1, 1e-8) is the mate "a".
    # In float64 the mate is closer under every distance (inner product 1 + 1e-8 against 1;
    # squared distance (1 - 1e-8)^2 against 1; cosine (1 + 1e-8) / sqrt(2 (1 + 1e-16)) against
    # 1 / sqrt(2)), so it ranks first: rank-1 rate 1, as ee.evaluate ranks it. In float32 both
    # scores round to one value, a tie that the index gives to row 0.
    gallery = np.array([[1.0, 0.0], [1.0, 1e-8]], np.float32)
    query = np.array([[1.0, 1.0], [-1.0, -1.0]], np.float32)  # plus one non-mated search
    s = query[:1].astype(np.float64) @ gallery.T.astype(np.float64)
    if distance == "euclidean":
        s = -(((query[:1, None].astype(np.float64) - gallery[None]) ** 2).sum(-1))
    elif distance == "cosine":
        s = s / np.linalg.norm(gallery.astype(np.float64), axis=1)
    assert s[0, 1] > s[0, 0]
    got = ver.open_set_identification(
        query, ["a", "z"], gallery, ["b", "a"], fpir=[1.0], distance=distance
    )
    assert got.rank1 == 1.0 and got.dir.tolist() == [1.0]
    res = ee.evaluate(query[:1], ["a"], gallery, ["b", "a"], distance=distance)
    assert res["precision_at_1"] == 1.0


def test_open_set_identification_refuses_a_gallery_of_another_dimension():
    q, g = np.ones((3, 4), dtype=np.float32), np.ones((5, 6), dtype=np.float32)
    with pytest.raises(ee.InputError, match="query has dimension 4 but gallery has 6"):
        ver.open_set_identification(q, [0, 1, 2], g, [0, 1, 2, 3, 4])


def test_all_pairs_cosine_of_subnormal_rows_is_the_cosine_of_their_values():
    """Rows of subnormal float32 values (integer multiples of 2**-149, so their float64
    cosines, computed here, are those of the stored values): the thresholds are those
    cosines to float32 rounding, not a few percent off as with a subnormal norm."""
    from embedeval.protocols.verification import tar_at_far_all_pairs

    units = np.array([[3, 5], [5, 2], [1, 6], [6, 1], [2, 7], [7, 3]], dtype=np.float64)
    x = (units * 2.0**-149).astype(np.float32)
    assert np.array_equal(x.astype(np.float64) / 2.0**-149, units)  # stored exactly
    labels = np.array([0, 0, 1, 1, 2, 2])
    unit = units / np.linalg.norm(units, axis=1, keepdims=True)
    impostor = sorted(
        (float(unit[i] @ unit[j]) for i in range(6) for j in range(i + 1, 6)
         if labels[i] != labels[j]),
        reverse=True,
    )  # fmt: skip
    # accepted at score >= threshold: at most m impostors pass at the m-th largest score
    fars = [1.5 / len(impostor), 5.5 / len(impostor)]
    got = tar_at_far_all_pairs(x, labels, far=fars).threshold
    want = [impostor[0], impostor[4]]
    np.testing.assert_allclose(got, want, rtol=4 * 2.0**-24, atol=0)


def test_kfold_accuracy_refuses_n_folds_beside_folds():
    # folds decides the folds: an n_folds given with it would be silently ignored
    scores, genuine = np.arange(6.0), np.array([0, 1, 0, 1, 1, 1], bool)
    with pytest.raises(ee.InputError, match="n_folds=3 and folds= were both given"):
        ver.kfold_accuracy(scores, genuine, n_folds=3, folds=[0, 0, 1, 1, 2, 2])
    # the default alone still makes ten folds: one pair each here
    assert ver.kfold_accuracy(np.arange(10.0), np.arange(10) % 2 == 0)[2].size == 10
