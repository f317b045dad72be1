"""embedeval.metrics.classification against scikit-learn on random data with ties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import embedeval as ee
from embedeval.metrics import classification as cl

RNG = np.random.default_rng(0)


def test_confusion_matrix_matches_sklearn_and_orientation():
    from sklearn.metrics import confusion_matrix

    t = RNG.integers(0, 4, 200)
    p = RNG.integers(0, 4, 200)
    np.testing.assert_array_equal(cl.confusion_matrix(t, p), confusion_matrix(t, p))
    np.testing.assert_array_equal(
        cl.confusion_matrix(t, p, labels=[3, 1, 0, 2]), confusion_matrix(t, p, labels=[3, 1, 0, 2])
    )
    # rows = actual: one actual-0 item predicted as 1 sits in row 0, column 1
    assert cl.confusion_matrix(["a", "b"], ["b", "b"]).tolist() == [[0, 1], [0, 1]]


@pytest.mark.parametrize("average", [None, "macro", "weighted", "micro"])
def test_rates_match_sklearn(average):
    from sklearn.metrics import accuracy_score, precision_recall_fscore_support

    t = RNG.integers(0, 5, 300)
    p = RNG.integers(0, 5, 300)
    r = cl.rates(t, p, average=average, beta=2.0)
    sp, sr, sf, _ = precision_recall_fscore_support(t, p, average=average, zero_division=0)
    sf2 = precision_recall_fscore_support(t, p, average=average, beta=2.0, zero_division=0)[2]
    np.testing.assert_allclose(r["precision"], sp)
    np.testing.assert_allclose(r["recall"], sr)
    np.testing.assert_allclose(r["f1"], sf)
    np.testing.assert_allclose(r["f_beta"], sf2)
    assert r["accuracy"] == pytest.approx(accuracy_score(t, p))


def test_rates_by_hand_binary():
    r = cl.rates([1, 1, 1, 0, 0], [1, 1, 0, 1, 0], labels=[0, 1])
    # class 1: tp 2, fn 1, fp 1, tn 1
    assert r["tpr"][1] == pytest.approx(2 / 3)
    assert r["tnr"][1] == pytest.approx(1 / 2)
    assert r["npv"][1] == pytest.approx(1 / 2)
    assert r["fdr"][1] == pytest.approx(1 / 3)
    assert r["for"][1] == pytest.approx(1 / 2)
    assert r["prevalence"][1] == pytest.approx(3 / 5)
    assert r["error_rate"] == pytest.approx(2 / 5)


def test_zero_division_policy():
    with pytest.warns(ee.EmbedevalWarning, match="precision is undefined"):
        r = cl.rates([0, 0], [0, 0], labels=[0, 1])
    assert r["precision"][1] == 0.0
    r = cl.rates([0, 0], [0, 0], labels=[0, 1], zero_division=1.0)
    assert r["precision"][1] == 1.0


def test_curves_match_sklearn_with_ties():
    from sklearn.metrics import precision_recall_curve, roc_auc_score, roc_curve

    for _ in range(10):
        t = RNG.integers(0, 2, 80)
        s = RNG.integers(0, 7, 80).astype(float)
        fpr, tpr, th = cl.roc_curve(t, s)
        sf, st, sth = roc_curve(t, s, drop_intermediate=False)
        np.testing.assert_allclose(fpr, sf)
        np.testing.assert_allclose(tpr, st)
        np.testing.assert_allclose(th[1:], sth[1:])
        assert cl.roc_auc(t, s) == pytest.approx(roc_auc_score(t, s))
        p, r, th2 = cl.pr_curve(t, s)
        sp, sr, sth2 = precision_recall_curve(t, s)
        # scikit-learn lists increasing thresholds and appends (1, 0)
        np.testing.assert_allclose(p, sp[:-1][::-1])
        np.testing.assert_allclose(r, sr[:-1][::-1])
        np.testing.assert_allclose(th2, sth2[::-1])


def test_threshold_selection_brute_force():
    t = RNG.integers(0, 2, 60)
    s = RNG.integers(0, 10, 60).astype(float)
    th, j = cl.select_threshold(t, s, method="youden")
    best = max(np.mean(s[t == 1] >= c) - np.mean(s[t == 0] >= c) for c in np.unique(s))
    assert j == pytest.approx(best)
    th, acc = cl.select_threshold(t, s, method="accuracy")
    best_acc = max(np.mean((s >= c) == (t == 1)) for c in [*np.unique(s), np.inf])
    assert acc == pytest.approx(best_acc)
    assert acc == pytest.approx(np.mean((s >= th) == (t == 1)))


def test_top_k_accuracy_matches_sklearn():
    from sklearn.metrics import top_k_accuracy_score

    t = RNG.integers(0, 6, 100)
    s = RNG.random((100, 6))
    for k in (1, 2, 4):
        assert cl.top_k_accuracy(t, s, k=k) == pytest.approx(top_k_accuracy_score(t, s, k=k))


def test_bad_input():
    with pytest.raises(ee.InputError, match="y_pred has 1 labels but there are 2"):
        cl.confusion_matrix([0, 1], [0])
    with pytest.raises(ee.InputError, match="not in labels"):
        cl.confusion_matrix([0, 5], [0, 1], labels=[0, 1])
    with pytest.raises(ee.InputError, match="both classes"):
        cl.select_threshold([1, 1], [0.1, 0.2])
    with pytest.raises(ee.InputError, match="binary"):
        cl.roc_curve([0, 2], [0.1, 0.2])
    with pytest.raises(ee.InputError, match="method="):
        cl.select_threshold([0, 1], [0.1, 0.2], method="f1")


def test_top_k_ties_count_as_hits_unlike_sklearn():
    # the true class ties with the only other class at k=1: a hit here; scikit-learn ranks
    # column 1 first and misses
    assert cl.top_k_accuracy([0], [[0.5, 0.5]], k=1) == 1.0
    assert cl.top_k_accuracy([0, 1], [[0.2, 0.5, 0.5], [0.1, 0.7, 0.9]], k=1) == 0.0
    assert cl.top_k_accuracy([0, 1], [[0.2, 0.5, 0.5], [0.1, 0.7, 0.9]], k=2) == 0.5


def test_fallout_zero_division_follows_the_policy():
    # no actual negatives for class 0 (every item is class 0) -> fall-out of class 0 undefined
    r = cl.rates([0, 0], [0, 0], labels=[0, 1], zero_division=math.nan)
    assert math.isnan(r["fpr"][0]) and r["fpr"][1] == 0.0
    with pytest.warns(ee.EmbedevalWarning, match="fall-out"):
        cl.rates([0, 0], [0, 0], labels=[0, 1])


def test_closest_to_01_threshold_by_hand():
    # ROC points (0,0), (0,.5), (.5,.5), (.5,1), (1,1): nearest to (0, 1) is (0, .5) or (.5, 1)
    # at distance 0.5; the first (higher) threshold wins
    th, d = cl.select_threshold([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8], method="closest_to_01")
    assert (th, d) == (0.8, 0.5)


def test_top_k_bad_scores():
    with pytest.raises(ee.InputError, match="NaN or infinite value"):
        cl.top_k_accuracy([0, 1], [[0.1, np.nan], [0.2, 0.3]], k=1)
    with pytest.raises(ee.InputError, match="numeric 2-D"):
        cl.top_k_accuracy([0, 1], np.array([["a", "b"], ["c", "d"]], dtype=object), k=1)
    with pytest.raises(ee.InputError, match="must be 2-D"):
        cl.top_k_accuracy([0, 1], [0.1, 0.2], k=1)
    with pytest.raises(ee.InputError, match="k must be >= 1"):
        cl.top_k_accuracy([0, 1], [[0.1, 0.2], [0.2, 0.3]], k=0)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(-3, 3)), min_size=2, max_size=12))
def test_roc_auc_is_the_pair_count_and_transform_invariant(pairs):
    t, s = (np.array(v) for v in zip(*pairs, strict=True))
    if t.min() == t.max():
        return
    # Mann-Whitney by a plain double loop: P(score_pos > score_neg) + 1/2 P(tie)
    pos, neg = s[t == 1], s[t == 0]
    wins = sum((a > b) + 0.5 * (a == b) for a in pos for b in neg)
    assert cl.roc_auc(t, s) == pytest.approx(wins / (pos.size * neg.size))
    assert cl.roc_auc(t, np.exp(s.astype(float)) + 5) == pytest.approx(cl.roc_auc(t, s))


def test_average_precision_matches_sklearn_with_ties_and_by_hand():
    from sklearn.metrics import average_precision_score

    # by hand: thresholds 0.8 (1 of 1 right), 0.4, 0.35 (2 of 3): 1/2 * 1 + 1/2 * 2/3
    assert cl.average_precision([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == pytest.approx(5 / 6)
    # a tie block enters together: both items at 0.5, one positive -> precision 1/2 there
    assert cl.average_precision([1, 0], [0.5, 0.5]) == pytest.approx(0.5)
    for _ in range(20):
        t = RNG.integers(0, 2, 60)
        t[0] = 1
        s = RNG.integers(0, 5, 60).astype(float)
        assert cl.average_precision(t, s) == pytest.approx(average_precision_score(t, s))
    # no positive: recall is undefined, so AP is NaN with a warning (the single-class rule)
    with pytest.warns(ee.EmbedevalWarning, match="single-class"):
        assert math.isnan(cl.average_precision([0, 0], [0.1, 0.2]))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: cl.rates([0, 1], [0, 1], average="macr"), "Did you mean 'macro'"),
        (lambda: cl.rates([0, 1], [0, 1], beta=-1.0), "beta must be a positive number"),
        (lambda: cl.rates([0, 1], [0, 1], zero_division="skip"), "zero_division must be"),
        (lambda: cl.select_threshold([0, 1], [0.1, 0.2], method="youdn"), "Did you mean 'youden'"),
        (lambda: cl.confusion_matrix([0, 1], [0, 1], labels=[0, 1, 1]), "repeated"),
        (lambda: cl.confusion_matrix([], []), "empty"),
        (lambda: cl.confusion_matrix([0, np.nan], [0, 1]), "1 NaN or infinite label"),
        (lambda: cl.confusion_matrix([[0, 1], [1, 0]], [0, 1]), "must be 1-D"),
        (lambda: cl.roc_auc([0, 1], [np.nan, 0.2]), "y_score has 1 NaN"),
        (lambda: cl.roc_auc([0, 1, 1], [0.1, 0.2]), "y_score has 2 values but 3"),
        (lambda: cl.pr_curve([0, 1], ["a", "b"]), "y_score must be numeric"),
        (lambda: cl.top_k_accuracy([0, 1], [[0.1, 0.2], [0.2, 0.3]], labels=[0]), "1 classes"),
        (lambda: cl.top_k_accuracy([0, 7], [[0.1, 0.2], [0.2, 0.3]]), "not in labels"),
    ],
)
def test_more_bad_input(call, match):
    with pytest.raises((ee.InputError, ee.InputTypeError), match=match):
        call()


@pytest.mark.parametrize("average", [None, "macro", "weighted", "micro"])
def test_every_rate_from_sklearn_one_vs_rest_counts(average):
    from sklearn.metrics import multilabel_confusion_matrix

    rng = np.random.default_rng(40)
    t = rng.integers(0, 4, 250)
    p = rng.integers(0, 4, 250)
    mcm = multilabel_confusion_matrix(t, p, labels=[0, 1, 2, 3])  # [[tn, fp], [fn, tp]] per class
    tn, fp, fn, tp = (mcm[:, i, j].astype(float) for i, j in ((0, 0), (0, 1), (1, 0), (1, 1)))
    if average == "micro":
        tn, fp, fn, tp = (np.array([v.sum()]) for v in (tn, fp, fn, tp))
    want = {
        "tpr": tp / (tp + fn),
        "tnr": tn / (tn + fp),
        "ppv": tp / (tp + fp),
        "npv": tn / (tn + fn),
        "fpr": fp / (fp + tn),
        "fnr": fn / (fn + tp),
        "fdr": fp / (fp + tp),
        "for": fn / (fn + tn),
        "prevalence": (tp + fn) / (tp + fn + fp + tn),
    }
    r = cl.rates(t, p, average=average)
    support = (mcm[:, 1, 0] + mcm[:, 1, 1]).astype(float)
    for key, value in want.items():
        if average in ("macro", "weighted"):
            value = np.average(value, weights=None if average == "macro" else support)
        np.testing.assert_allclose(r[key], value, err_msg=key)
    assert r["error_rate"] == pytest.approx(np.mean(t != p))


def test_closest_to_01_threshold_brute_force():
    for seed in range(5):
        rng = np.random.default_rng(seed)
        t = rng.integers(0, 2, 50)
        t[:2] = [0, 1]
        s = rng.integers(0, 8, 50).astype(float)
        th, d = cl.select_threshold(t, s, method="closest_to_01")
        dists = [
            math.hypot(np.mean(s[t == 0] >= c), 1 - np.mean(s[t == 1] >= c))
            for c in [np.inf, *np.unique(s)]
        ]
        assert d == pytest.approx(min(dists))
        assert math.hypot(np.mean(s[t == 0] >= th), 1 - np.mean(s[t == 1] >= th)) == pytest.approx(
            d
        )


def test_top_k_accuracy_with_tied_scores_matches_sklearn_where_the_tie_rule_is_moot():
    from sklearn.metrics import top_k_accuracy_score

    rng = np.random.default_rng(11)
    t = rng.integers(0, 5, 400)
    s = rng.integers(0, 4, (400, 5)).astype(float)  # many ties
    true_score = s[np.arange(400), t]
    # rows where no other class ties the true class: both tie rules agree there
    moot = (s == true_score[:, None]).sum(1) == 1
    for k in (1, 2, 3):
        ours = ee.classification.top_k_accuracy(t[moot], s[moot], k=k)
        assert ours == pytest.approx(top_k_accuracy_score(t[moot], s[moot], k=k, labels=range(5)))
        # and on every row, a plain loop: hit when fewer than k classes score strictly higher
        loop = np.mean([sum(v > row[c] for v in row) < k for row, c in zip(s, t, strict=True)])
        assert ee.classification.top_k_accuracy(t, s, k=k) == pytest.approx(loop)


def test_class_accuracy_woman_man_child_by_hand():
    # actual 20 Women, 20 Men, 60 Children; recognised as Woman 13/4/2, Man 2/15/1,
    # Child 5/1/57 (column = actual class), so confusion (rows actual, columns predicted):
    # Woman: 13 W, 2 M, 5 C; Man: 4 W, 15 M, 1 C; Child: 2 W, 1 M, 57 C.
    cells = {("W", "W"): 13, ("W", "M"): 2, ("W", "C"): 5}
    cells |= {("M", "W"): 4, ("M", "M"): 15, ("M", "C"): 1}
    cells |= {("C", "W"): 2, ("C", "M"): 1, ("C", "C"): 57}
    t = [a for (a, _), c in cells.items() for _ in range(c)]
    p = [b for (_, b), c in cells.items() for _ in range(c)]
    r = cl.rates(t, p, labels=["W", "M", "C"])
    # Woman: TP 13, FN 2 + 5 = 7, FP 4 + 2 = 6, TN 100 - 13 - 7 - 6 = 74 -> (13 + 74)/100
    # Man:   TP 15, FN 5, FP 2 + 1 = 3, TN 77 -> (15 + 77)/100 = 92/100
    # Child: TP 57, FN 3, FP 6, TN 34 -> (57 + 34)/100 = 91/100
    assert r["class_accuracy"].tolist() == pytest.approx([87 / 100, 92 / 100, 91 / 100])
    assert r["accuracy"] == pytest.approx((13 + 15 + 57) / 100)
    macro = cl.rates(t, p, labels=["W", "M", "C"], average="macro")
    assert macro["class_accuracy"] == pytest.approx((87 + 92 + 91) / 300)
    weighted = cl.rates(t, p, labels=["W", "M", "C"], average="weighted")
    assert weighted["class_accuracy"] == pytest.approx((20 * 87 + 20 * 92 + 60 * 91) / 10000)
    micro = cl.rates(t, p, average="micro")
    # pooled: (85 + (74 + 77 + 34)) / 300 = 270 / 300
    assert micro["class_accuracy"] == pytest.approx(270 / 300)


@pytest.mark.parametrize("pos_label", [1, 0])
def test_binary_average_matches_sklearn(pos_label):
    from sklearn import metrics as skm

    rng = np.random.default_rng(pos_label)
    t = rng.integers(0, 2, 60)
    p = rng.integers(0, 2, 60)
    r = cl.rates(t, p, average="binary", pos_label=pos_label)
    assert isinstance(r["recall"], float)
    kw = {"pos_label": pos_label, "average": "binary"}
    assert r["recall"] == pytest.approx(skm.recall_score(t, p, **kw))
    assert r["precision"] == pytest.approx(skm.precision_score(t, p, **kw))
    assert r["f1"] == pytest.approx(skm.f1_score(t, p, **kw))
    assert r["f_beta"] == pytest.approx(skm.fbeta_score(t, p, beta=1.0, **kw))
    tn, fp, fn, tp = skm.confusion_matrix(t, p, labels=[1 - pos_label, pos_label]).ravel()
    assert (r["tp"], r["fp"], r["fn"], r["tn"]) == (tp, fp, fn, tn)
    assert r["class_accuracy"] == pytest.approx(skm.accuracy_score(t, p))


def test_binary_average_string_labels_and_errors():
    r = cl.rates(["a", "b", "b"], ["a", "a", "b"], average="binary", pos_label="b")
    # positive "b": TP 1, FN 1, FP 0 -> recall 1/2, precision 1/1
    assert (r["recall"], r["precision"]) == (0.5, 1.0)
    with pytest.raises(ee.InputError, match="pos_label='c'"):
        cl.rates(["a", "b"], ["a", "b"], average="binary", pos_label="c")
    with pytest.raises(ee.InputError, match="at most two classes"):
        cl.rates([0, 1, 2], [0, 1, 2], average="binary")


def test_binary_average_with_only_negatives_matches_sklearn():
    import warnings

    from sklearn import metrics as skm

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = cl.rates([0, 0, 0], [0, 0, 0], average="binary", pos_label=1, zero_division=0.0)
        expected = skm.recall_score([0, 0, 0], [0, 0, 0], zero_division=0.0)
    # no positive at all: TP = FP = FN = 0, TN = 3, recall 0/0 -> zero_division
    assert (r["tp"], r["fp"], r["fn"], r["tn"]) == (0.0, 0.0, 0.0, 3.0)
    assert r["recall"] == expected == 0.0
    assert r["class_accuracy"] == 1.0  # (0 + 3) / 3


def _best_threshold_exact(t, s, method):
    """The first threshold (from +inf down) with the best criterion, in exact fractions."""
    from fractions import Fraction

    t, s = np.asarray(t), np.asarray(s, dtype=float)
    pos, neg = int(t.sum()), int(t.size - t.sum())
    best = None
    for c in [np.inf, *sorted(set(s.tolist()), reverse=True)]:
        tp, fp = int(((s >= c) & (t == 1)).sum()), int(((s >= c) & (t == 0)).sum())
        tpr, fpr = Fraction(tp, pos), Fraction(fp, neg)
        key = {
            "youden": tpr - fpr,
            "closest_to_01": -(fpr**2 + (1 - tpr) ** 2),
            "accuracy": Fraction(tp + neg - fp, t.size),
        }[method]
        if best is None or key > best[1]:
            best = (c, key)
    return best[0]


@pytest.mark.parametrize("method", ["youden", "closest_to_01", "accuracy"])
@pytest.mark.parametrize(
    ("t", "s"),
    [
        # J = 1/3 at 4 (1/3 - 0) and at 1 (1 - 2/3): in floats the second is larger
        ([1, 1, 1, 0, 0, 0], [1, 4, 2, 2, 2, 0]),
        # distance sqrt(5)/3 at 2 and at 1 along different float paths
        ([1, 1, 0, 1, 0, 0], [0, 1, 1, 2, 0, 2]),
        ([0, 1, 0, 1, 1, 0], [1, 2, 3, 4, 0, 4]),
        ([1, 1, 1, 0, 0, 0], [18, 99, 16, 68, 91, 8]),
    ],
)
def test_select_threshold_first_wins_exact_ties(t, s, method):
    th, _ = cl.select_threshold(t, s, method=method)
    assert th == _best_threshold_exact(t, s, method)


def test_select_threshold_first_wins_exact_ties_fuzzed():
    rng = np.random.default_rng(11)
    for _ in range(300):
        t = rng.integers(0, 2, 7)
        t[:2] = [0, 1]
        s = rng.integers(0, 5, 7).astype(float)
        for method in ("youden", "closest_to_01", "accuracy"):
            want = _best_threshold_exact(t, s, method)
            assert cl.select_threshold(t, s, method=method)[0] == want


@pytest.mark.parametrize("beta", [np.float32(2.0), np.int64(2), 0.5])
def test_rates_f_beta_takes_numpy_scalars_like_sklearn(beta):
    from sklearn.metrics import fbeta_score

    t, p = [0, 1, 2, 1, 0, 2], [0, 2, 2, 1, 1, 0]
    got = cl.rates(t, p, beta=beta, average="macro")["f_beta"]
    assert got == pytest.approx(fbeta_score(t, p, beta=float(beta), average="macro"))


def test_rates_refuses_an_infinite_beta():
    with pytest.raises(ee.InputError, match="beta must be a positive number"):
        cl.rates([0, 1], [1, 1], beta=math.inf)


def test_top_k_accuracy_refuses_repeated_labels_like_sklearn():
    from sklearn.metrics import top_k_accuracy_score

    y, s = ["a", "b"], [[0.1, 0.9, 0.5], [0.2, 0.3, 0.1]]
    with pytest.raises(ValueError, match="unique"):
        top_k_accuracy_score(y, s, k=1, labels=["a", "b", "a"])
    with pytest.raises(ee.InputError, match="labels has repeated values"):
        cl.top_k_accuracy(y, s, k=1, labels=["a", "b", "a"])


def test_integer_scores_float64_cannot_separate_are_an_error():
    from sklearn.metrics import roc_auc_score

    t, s = [1, 0, 1], np.array([2**53 + 1, 2**53, 7], dtype=np.int64)
    for call in (cl.roc_auc, cl.average_precision, cl.roc_curve, cl.select_threshold):
        with pytest.raises(ee.InputError, match="y_score holds the distinct integers"):
            call(t, s)
    assert cl.roc_auc(t, s - 7) == pytest.approx(roc_auc_score(t, s))
    scores = np.array([[2**53 + 1, 2**53], [3, 1]], dtype=np.int64)
    with pytest.raises(ee.InputError, match="y_score holds the distinct integers"):
        cl.top_k_accuracy([1, 0], scores, k=1)


def test_a_list_mixing_ints_and_floats_refuses_integers_float64_merges():
    # [2**53 + 1, 2**53, 0.5] as one list becomes float64 at once: the two ints would tie
    t, s = [1, 0, 0], [2**53 + 1, 2**53, 0.5]
    for call in (cl.roc_auc, cl.average_precision, cl.roc_curve):
        with pytest.raises(ee.InputError, match="y_score holds the distinct integers"):
            call(t, s)
    with pytest.raises(ee.InputError, match="y_score holds the distinct integers"):
        cl.top_k_accuracy([0, 1], [[2**53 + 1, 2**53], [0.5, 1]], k=1)


def test_object_labels_are_ordered_sorted_like_the_same_labels_as_strings():
    # a pandas column of strings is an object array; its classes are still the sorted union,
    # as scikit-learn orders them, not the order they first appear in
    from sklearn.metrics import confusion_matrix, recall_score

    t, p = ["b", "b", "a", "c"], ["b", "a", "a", "b"]
    t_obj, p_obj = np.array(t, dtype=object), np.array(p, dtype=object)
    want = confusion_matrix(t, p, labels=["a", "b", "c"])
    assert cl.confusion_matrix(t_obj, p_obj).tolist() == want.tolist()
    assert cl.confusion_matrix(t_obj, p).tolist() == want.tolist()
    got = cl.rates(t_obj, p_obj, zero_division=0.0)["recall"]
    assert got.tolist() == recall_score(t, p, average=None, zero_division=0.0).tolist()
    # tuples sort too; integers held as objects sort by value
    assert cl.confusion_matrix([(2,), (1,)], [(2,), (2,)]).tolist() == [[0, 1], [0, 1]]
    ints = np.array([10, 2, 2], dtype=object)
    assert cl.confusion_matrix(ints, ints).tolist() == [[2, 0], [0, 1]]


@pytest.mark.parametrize(
    ("y_true", "y_pred"),
    [([0, 1], ["0", "1"]), (["a", "b"], [0, 1]), (np.array([0, 1], dtype=object), [b"0", b"1"])],
)
def test_text_predictions_beside_number_truth_are_refused_like_sklearn(y_true, y_pred):
    # 1 and "1" never share a class: every item would silently count as wrong (accuracy 0)
    from sklearn.metrics import accuracy_score

    with pytest.raises(ValueError, match="Mix of label input types"):
        accuracy_score([0, 1], ["0", "1"])
    with pytest.raises(ee.InputError, match="y_true holds .* but y_pred holds"):
        cl.confusion_matrix(y_true, y_pred)
    with pytest.raises(ee.InputError, match="convert both to one type"):
        cl.rates(y_true, y_pred)


def test_top_k_accuracy_names_the_label_missing_from_labels():
    with pytest.raises(ee.InputError, match=r"1 label\(s\) not in labels, first 'c' at index 2"):
        cl.top_k_accuracy(["a", "b", "c"], np.eye(3)[:, :2], labels=["a", "b"])
    with pytest.raises(ee.InputError, match=r"first 7 at index 1; .*\(default 0..1\)"):
        cl.top_k_accuracy([0, 7], [[0.1, 0.2], [0.2, 0.3]])
    with pytest.raises(ee.InputError, match="y_score has no columns"):
        cl.top_k_accuracy([0], np.zeros((1, 0)))
