"""Open-set detection against scikit-learn, hand-computed cases and brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from embedeval.metrics import openset as os_
from embedeval.utils.errors import InputError


def test_detection_by_hand():
    # enrolled confidences .9 .7 .7 .4 ; out-of-gallery .8 .7 .1
    g = [1, 1, 1, 1, 0, 0, 0]
    c = [0.9, 0.7, 0.7, 0.4, 0.8, 0.7, 0.1]
    out = os_.open_set_detection(g, c, tpr=0.75)
    # pairs (enrolled > out) out of 4 x 3 = 12:
    # .9 beats .8 .7 .1 (3); each .7 beats .1, ties .7 (1 + 1/2, twice); .4 beats .1 (1)
    assert out["auroc"] == pytest.approx((3 + 2 * 1.5 + 1) / 12)
    # thresholds .9: TPR 1/4; .8: 1/4; .7: 3/4 >= 0.75 -> FPR = #out >= .7 / 3 = 2/3
    assert out["fpr_at_tpr"] == pytest.approx(2 / 3)
    assert out["threshold"] == 0.7
    # 95%: only t = .4 reaches TPR 1 -> FPR = 2/3 (the .8 and .7 out queries)
    assert os_.open_set_detection(g, c)["fpr_at_tpr"] == pytest.approx(2 / 3)


def test_fpr_at_tpr_by_loop_over_thresholds_and_sklearn_auroc():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    g = rng.integers(0, 2, 300)
    c = (rng.normal(size=300) + g).round(1)  # ties
    out = os_.open_set_detection(g, c)
    assert out["auroc"] == pytest.approx(roc_auc_score(g, c))
    best = None
    for t in sorted(set(c.tolist())):
        tpr = sum(1 for ci, gi in zip(c, g, strict=True) if gi and ci >= t) / g.sum()
        fpr = sum(1 for ci, gi in zip(c, g, strict=True) if not gi and ci >= t) / (300 - g.sum())
        if tpr >= 0.95 and (best is None or fpr < best):
            best = fpr
    assert out["fpr_at_tpr"] == pytest.approx(best)


def test_invariances():
    rng = np.random.default_rng(1)
    g = rng.integers(0, 2, 200)
    c = rng.normal(size=200) + g
    base = os_.open_set_detection(g, c)
    moved = os_.open_set_detection(g, np.exp(c))
    assert moved["auroc"] == pytest.approx(base["auroc"])
    assert moved["fpr_at_tpr"] == pytest.approx(base["fpr_at_tpr"])
    perm = rng.permutation(200)
    assert os_.open_set_detection(g[perm], c[perm])["auroc"] == pytest.approx(base["auroc"])
    sigma = os_.open_set_detection(g, -c, higher_is_confident=False)
    assert sigma["auroc"] == pytest.approx(base["auroc"])
    assert sigma["fpr_at_tpr"] == pytest.approx(base["fpr_at_tpr"])


def _curve_brute(scores, g, c):
    """Mean over every order of tied confidences of the all-query decision error."""
    n = len(g)
    rows = []
    for perm in itertools.permutations(range(n)):
        order = sorted(perm, key=lambda i: c[i])  # least confident first = rejected first
        curve = []
        for j in range(n + 1):
            rejected = set(order[:j])
            cost = 0.0
            for i in range(n):
                if i in rejected:
                    cost += 0.0 if g[i] == 0 else 1.0
                else:
                    cost += (1 - scores[i]) if g[i] == 1 else 1.0
            curve.append(cost / n)
        rows.append(curve)
    return np.mean(rows, axis=0)


@pytest.mark.parametrize("seed", range(4))
def test_reject_curve_against_enumeration(seed):
    rng = np.random.default_rng(seed)
    g = rng.integers(0, 2, 6)
    scores = np.where(g == 1, rng.choice([0.0, 0.5, 1.0], 6), np.nan)
    c = rng.integers(0, 3, 6).astype(float)
    cur = os_.open_set_reject_curve(scores, g, c)
    expected = _curve_brute(np.nan_to_num(scores), g, c)
    assert cur.error == pytest.approx(expected)
    assert cur.area == pytest.approx(expected.mean())
    assert cur.oracle_area <= cur.area + 1e-12


def test_reject_curve_four_queries_by_hand():
    # q0 enrolled right (.9), q1 enrolled wrong (.2), q2 out (.5), q3 out (.1)
    cur = os_.open_set_reject_curve([1, 0, np.nan, np.nan], [1, 1, 0, 0], [0.9, 0.2, 0.5, 0.1])
    # reject none: costs 0 + 1 + 1 + 1 = 3/4; then q3 -> 2/4; q1 -> 2/4; q2 -> 1/4; q0 -> 2/4
    assert cur.error.tolist() == pytest.approx([3 / 4, 2 / 4, 2 / 4, 1 / 4, 2 / 4])
    # the oracle rejects the two out queries first: 3/4, 2/4, 1/4, then q1 (no change) 1/4, 2/4
    assert cur.oracle_error.tolist() == pytest.approx([3 / 4, 2 / 4, 1 / 4, 1 / 4, 2 / 4])


def test_bad_input():
    with pytest.raises(InputError, match="in_gallery"):
        os_.open_set_detection([2, 1], [0.1, 0.2])
    with pytest.raises(InputError, match="tpr"):
        os_.open_set_detection([0, 1], [0.1, 0.2], tpr=1.5)
    with pytest.raises(InputError, match=r"scores\[0\] = nan of an enrolled query \(1 such\)"):
        os_.open_set_reject_curve([np.nan, 1], [1, 0], [0.1, 0.2])
    with pytest.raises(InputError, match=r"scores\[1\] = 1.5 of an enrolled query"):
        os_.open_set_reject_curve([0.5, 1.5, 2.0], [1, 1, 0], [0.1, 0.2, 0.3])


def test_threshold_is_reported_in_sigma_units():
    # sigmas: enrolled 0.1 0.2 0.3 0.6, out 0.5 0.9; accept sigma <= t
    g = [1, 1, 1, 1, 0, 0]
    sigma = [0.1, 0.2, 0.3, 0.6, 0.5, 0.9]
    out = os_.open_set_detection(g, sigma, tpr=0.75, higher_is_confident=False)
    # t = 0.3 accepts 3/4 enrolled and no out query
    assert (out["threshold"], out["fpr_at_tpr"]) == (0.3, 0.0)


def test_integer_confidences_float64_cannot_separate_are_an_error():
    # 2**53 + 1 and 2**53 are one float64: compared as floats they would silently tie (an
    # AUROC of 1/2 where the correct order gives 1).
    from sklearn.metrics import roc_auc_score

    c = np.array([2**53 + 1, 2**53, 7], dtype=np.int64)
    g = [1, 0, 1]
    for call in (os_.open_set_detection, lambda g, c: os_.open_set_reject_curve(g, g, c)):
        with pytest.raises(InputError, match="confidence holds the distinct integers"):
            call(g, c)
    # shifted into float64's exact range, the same order is accepted and ranked right
    got = os_.open_set_detection(g, c - 7)["auroc"]
    assert got == pytest.approx(roc_auc_score(g, [2, 1, 0]))
