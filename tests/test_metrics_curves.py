"""One AUROC, one average precision, one PR curve and one rule for single-class input.

Every entry point that computes these values is checked against scikit-learn on data with
ties, and every one of them returns NaN with a warning on single-class input.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import embedeval as ee
from embedeval.metrics import classification as cl
from embedeval.metrics import confidence as cf
from embedeval.metrics import openset, ranking

RNG = np.random.default_rng(1234)


def _tied_binary(n: int = 80, levels: int = 6):
    t = RNG.integers(0, 2, n)
    t[:2] = [0, 1]  # both classes
    return t, RNG.integers(0, levels, n).astype(float) / levels


def test_every_auroc_matches_sklearn_with_ties():
    from sklearn.metrics import roc_auc_score

    for _ in range(15):
        t, s = _tied_binary()
        expected = roc_auc_score(t, s)
        assert cl.roc_auc(t, s) == pytest.approx(expected, abs=1e-12)
        assert cf.confidence_auroc(t, s) == pytest.approx(expected, abs=1e-12)
        assert openset.open_set_detection(t, s)["auroc"] == pytest.approx(expected, abs=1e-12)
        # a sigma is a negated confidence: the AUROC of the reversed order
        sigma = cf.confidence_auroc(t, -s, higher_is_confident=False)
        assert sigma == pytest.approx(expected, abs=1e-12)


def test_auroc_by_hand_with_a_tie():
    # positives 0.9, 0.5; negatives 0.5, 0.1: pairs (0.9,0.5) 1, (0.9,0.1) 1, (0.5,0.5) 1/2,
    # (0.5,0.1) 1 -> 3.5 / 4
    assert cl.roc_auc([1, 1, 0, 0], [0.9, 0.5, 0.5, 0.1]) == 0.875
    assert cf.confidence_auroc([1, 1, 0, 0], [0.9, 0.5, 0.5, 0.1]) == 0.875


def test_one_average_precision_matches_sklearn_with_ties():
    from sklearn.metrics import average_precision_score

    rows_t, rows_s = [], []
    for _ in range(15):
        t, s = _tied_binary()
        expected = average_precision_score(t, s)
        assert cl.average_precision(t, s) == pytest.approx(expected, abs=1e-12)
        assert ranking.average_precision(t, s, ties="threshold") == pytest.approx(
            expected, abs=1e-12
        )
        rows_t.append(t)
        rows_s.append(s)
    # the 2-D (one query per row) form gives the same per-row values
    per_row = ranking.average_precision(np.array(rows_t), np.array(rows_s), ties="threshold")
    expected = [average_precision_score(t, s) for t, s in zip(rows_t, rows_s, strict=True)]
    assert per_row == pytest.approx(expected, abs=1e-12)


def test_average_precision_by_hand_with_a_tie_block():
    # sorted: 0.9 (pos) | 0.5, 0.5 (pos, neg) | 0.1 (pos); thresholds: P=1 at R=1/3,
    # P=2/3 at R=2/3, P=3/4 at R=1 -> AP = (1/3)(1 + 2/3 + 3/4) = 29/36
    t, s = [1, 1, 0, 1], [0.9, 0.5, 0.5, 0.1]
    assert cl.average_precision(t, s) == pytest.approx(29 / 36, abs=1e-15)
    assert ranking.average_precision(t, s, ties="threshold") == pytest.approx(29 / 36, abs=1e-15)


def test_one_pr_curve_matches_sklearn_with_ties():
    from sklearn.metrics import precision_recall_curve

    for _ in range(10):
        t, s = _tied_binary()
        p_sk, r_sk, th_sk = precision_recall_curve(t, s)
        # scikit-learn: thresholds increasing, plus a final (precision 1, recall 0) point
        for p, r, th in (cl.pr_curve(t, s), ranking.precision_recall_curve(t, s)):
            assert p == pytest.approx(p_sk[:-1][::-1], abs=1e-12)
            assert r == pytest.approx(r_sk[:-1][::-1], abs=1e-12)
            assert th.tolist() == th_sk[::-1].tolist()


SINGLE_CLASS = [
    ("roc_auc, all positive", lambda: cl.roc_auc([1, 1, 1], [0.1, 0.5, 0.5])),
    ("roc_auc, all negative", lambda: cl.roc_auc([0, 0], [0.1, 0.5])),
    ("confidence_auroc, all right", lambda: cf.confidence_auroc([1, 1], [0.2, 0.3])),
    ("confidence_auroc, all wrong", lambda: cf.confidence_auroc([0, 0], [0.2, 0.3])),
    (
        "open_set_detection, all enrolled",
        lambda: openset.open_set_detection([1, 1], [0.2, 0.3])["auroc"],
    ),
    (
        "open_set_detection, none enrolled",
        lambda: openset.open_set_detection([0, 0], [0.2, 0.3])["auroc"],
    ),
    ("average_precision, no positive", lambda: cl.average_precision([0, 0], [0.2, 0.3])),
    ("pr_curve recall, no positive", lambda: cl.pr_curve([0, 0], [0.2, 0.3])[1][0]),
    ("roc_curve tpr, no positive", lambda: cl.roc_curve([0, 0], [0.2, 0.3])[1][-1]),
    ("roc_curve fpr, no negative", lambda: cl.roc_curve([1, 1], [0.2, 0.3])[0][-1]),
]


@pytest.mark.parametrize(("case", "call"), SINGLE_CLASS, ids=[c for c, _ in SINGLE_CLASS])
def test_single_class_input_is_nan_with_a_warning(case, call):
    with pytest.warns(ee.EmbedevalWarning, match="single-class input"):
        value = call()
    assert math.isnan(value), case


def test_single_class_rule_agrees_with_sklearn_for_auroc():
    import warnings

    from sklearn.metrics import roc_auc_score

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            sk = roc_auc_score([1, 1, 1], [0.1, 0.5, 0.5])
        except ValueError:  # older scikit-learn raised here; 1.9 returns NaN
            pytest.skip("this scikit-learn raises on one class")
        assert math.isnan(sk)
        assert math.isnan(cl.roc_auc([1, 1, 1], [0.1, 0.5, 0.5]))


def test_all_positive_average_precision_is_one():
    # every threshold keeps only positives: precision 1 at every recall step
    assert cl.average_precision([1, 1, 1], [0.3, 0.3, 0.9]) == 1.0


def test_ranking_keeps_zero_division_for_a_query_without_relevant_items():
    # the per-query ranking metrics use zero_division (MAP averages such queries);
    # zero_division=nan gives the single-class NaN of the binary functions
    with pytest.warns(ee.EmbedevalWarning, match="no relevant item"):
        assert ranking.average_precision([0, 0], [0.2, 0.3]) == 0.0
    assert math.isnan(
        ranking.average_precision([0, 0], [0.2, 0.3], ties="threshold", zero_division=math.nan)
    )


def test_summary_reports_nan_r_auroc_when_every_query_is_right():
    out = cf.confidence_summary({"precision_at_1": np.ones(4)}, np.array([0.1, 0.2, 0.3, 0.4]))
    assert math.isnan(out["r_auroc"])


def test_select_threshold_needs_both_classes():
    with pytest.raises(ee.InputError, match="both classes"):
        cl.select_threshold([0, 0], [0.1, 0.2])
