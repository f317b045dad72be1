"""embedeval.compat.AccuracyCalculator: PML 2.9's API and numbers, and the right number where
PML is wrong.  PML itself is the oracle where it is installed (the parity suite installs it)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import embedeval as ee
from embedeval.compat import AccuracyCalculator

ALL = [
    "AMI",
    "NMI",
    "mean_average_precision",
    "mean_average_precision_at_r",
    "mean_reciprocal_rank",
    "precision_at_1",
    "r_precision",
]


def _pml():
    torch = pytest.importorskip("torch", reason="the parity suite needs torch")
    acc = pytest.importorskip(
        "pytorch_metric_learning.utils.accuracy_calculator",
        reason="pytorch-metric-learning 2.9 is the oracle",
    )
    return torch, acc.AccuracyCalculator


def _data(seed, n=400, dim=12, n_classes=25):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim)).astype(np.float32)  # continuous: no distance ties
    y = rng.integers(0, n_classes, n)
    return x, y


def _compare(a, b):
    assert list(a) == list(b)
    for name in a:
        np.testing.assert_allclose(np.asarray(a[name]), np.asarray(b[name]), rtol=0, atol=2e-7)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"avg_of_avgs": True},
        {"return_per_class": True},
        {"k": 7},
        {"k": "max_bin_count"},
        {"include": ("precision_at_1", "mean_reciprocal_rank")},
        {"exclude": ("NMI", "AMI", "r_precision")},
    ],
)
@pytest.mark.parametrize("split", [False, True])
def test_equals_pml(options, split):
    torch, PML = _pml()
    x, y = _data(seed=len(options) + 10 * split)
    args = (x[:150], y[:150], x[150:], y[150:]) if split else (x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = PML(device=torch.device("cpu"), **options).get_accuracy(*args)
        got = AccuracyCalculator(**options).get_accuracy(*args)
    _compare(want, got)


def test_ref_includes_query_and_call_level_include_equal_pml():
    torch, PML = _pml()
    x, y = _data(seed=3)
    q, yq = x[:100], y[:100]
    want = PML(device=torch.device("cpu")).get_accuracy(
        q, yq, x, y, ref_includes_query=True, include=("precision_at_1", "r_precision")
    )
    got = AccuracyCalculator().get_accuracy(
        q, yq, x, y, ref_includes_query=True, include=("precision_at_1", "r_precision")
    )
    _compare(want, got)


def test_torch_inputs_and_lone_queries_equal_pml():
    torch, PML = _pml()
    x, y = _data(seed=4, n=120)
    y[:5] = 1000 + np.arange(5)  # five classes of one member: lone queries
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    opts = {"exclude": ("NMI", "AMI")}
    _compare(
        PML(device=torch.device("cpu"), **opts).get_accuracy(tx, ty),
        AccuracyCalculator(**opts).get_accuracy(tx, ty),
    )


def test_custom_label_comparison_equal_pml():
    torch, PML = _pml()
    x, y = _data(seed=5)
    labels = np.stack([y, np.random.default_rng(0).integers(0, 3, len(y))], axis=1)

    def first_column(a, b):
        return a[..., 0] == b[..., 0]

    opts = {"exclude": ("NMI", "AMI"), "label_comparison_fn": first_column}
    args = (x[:150], labels[:150], x[150:], labels[150:])
    _compare(
        PML(device=torch.device("cpu"), **opts).get_accuracy(*args),
        AccuracyCalculator(**opts).get_accuracy(*args),
    )


def test_multi_column_labels_compare_every_column_by_hand():
    # rows 0 and 1 share both columns; row 2 shares only the first column with them
    x = np.array([[0.0], [1.0], [0.5], [9.0], [9.5]], dtype=np.float32)
    labels = np.array([[1, 1], [1, 1], [1, 2], [3, 3], [3, 3]])
    got = AccuracyCalculator(include=("precision_at_1",)).get_accuracy(x, labels)
    # query 0: nearest is row 2 (0.5 away, other class) -> 0; query 1: nearest row 2 -> 0;
    # row 2 is lone; queries 3, 4 hit each other -> 1, 1.  Mean over 4 non-lone: 2/4
    assert got == {"precision_at_1": 0.5}


def test_defaults_are_pmls_seven_metrics_in_pmls_order():
    x, y = _data(seed=6, n=60, n_classes=4)
    assert list(AccuracyCalculator().get_accuracy(x, y)) == ALL
    assert AccuracyCalculator(exclude=("NMI",)).get_curr_metrics() == [m for m in ALL if m != "NMI"]


def test_right_where_pml_is_wrong_labels_above_2_24():
    # PML casts labels to float32, which merges 16777216 and 16777217 into one class (it would
    # report 1.0).  Exactly: class 2**24 = rows 0 and 4, class 2**24 + 1 = row 1 (lone), class
    # 7 = rows 2 and 3.  Queries 0 and 4 find row 1 first (0.1 away): 0 each; rows 2 and 3 hit
    # each other: 1 each.  P@1 = (0 + 0 + 1 + 1) / 4.
    x = np.array([[0.0], [0.1], [5.0], [5.1], [0.2]], dtype=np.float32)
    y = np.array([2**24, 2**24 + 1, 7, 7, 2**24])
    got = AccuracyCalculator(include=("precision_at_1",)).get_accuracy(x, y)
    assert got == {"precision_at_1": 0.5}


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"k": 0}, ValueError),
        ({"k": 1.5}, ValueError),
        ({"include": ("precision_at_2",)}, ValueError),
        ({"include": "precision_at_1"}, TypeError),
        ({"avg_of_avgs": True, "return_per_class": True}, ValueError),
    ],
)
def test_bad_arguments_raise_like_pml(kwargs, error):
    with pytest.raises(error):
        AccuracyCalculator(**kwargs)


def test_custom_comparison_that_is_not_an_equivalence_is_refused():
    pytest.importorskip("torch")
    x, y = _data(seed=7, n=20, n_classes=5)

    def within_one(a, b):  # 1~2 and 2~3 but not 1~3
        return (a - b).abs() <= 1

    calc = AccuracyCalculator(exclude=("NMI", "AMI"), label_comparison_fn=within_one)
    with pytest.raises(ee.InputError, match="classes"):
        calc.get_accuracy(x, y)


def test_knn_func_is_ignored_with_a_warning():
    with pytest.warns(ee.EmbedevalWarning, match="knn_func is ignored"):
        AccuracyCalculator(knn_func=object())


# ---------------------------------------------------------------- PML 2.9's own test cases
# The inputs and hand-computed expectations of pytorch-metric-learning's accuracy-calculator
# tests, re-encoded: the shim must reproduce them (and PML, where installed).


def _pml_or_none():
    try:
        torch, PML = _pml()
    except pytest.skip.Exception:
        return None
    return lambda **kw: PML(device=torch.device("cpu"), **kw)


def _check_case(kwargs, args, expected):
    got = AccuracyCalculator(**kwargs).get_accuracy(*args)
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-6), name
    pml = _pml_or_none()
    if pml is not None:
        want = pml(**kwargs).get_accuracy(*args)
        for name in expected:
            assert got[name] == pytest.approx(want[name], rel=1e-6), name


def test_pml_case_identity_and_interleaved_reference():
    q = np.arange(10)[:, None]
    _check_case(
        {},
        (q, np.arange(10), q, np.arange(10), False),
        dict.fromkeys(
            ["precision_at_1", "r_precision", "mean_average_precision_at_r",
             "mean_average_precision"], 1.0),
    )  # fmt: skip
    # reference: the 10 queries at 0..9, then 10 points of label 1 at 0.5, 1.5, ..., 9.5
    ref = (np.arange(20) / 2.0)[:, None]
    ref = np.concatenate([ref[::2], ref[1::2]])
    ref_labels = np.concatenate([np.arange(10), np.ones(10)])
    _check_case(
        {},
        (q, np.arange(10), ref, ref_labels, True),
        {
            "precision_at_1": 1.0,
            "r_precision": 0.5,
            "mean_average_precision_at_r": (1 + 2 / 2 + 3 / 5 + 4 / 7 + 5 / 9) / 10,
            "mean_average_precision": (
                1 + 2 / 2 + 3 / 5 + 4 / 7 + 5 / 9 + 6 / 11 + 7 / 13 + 8 / 15 + 9 / 17 + 10 / 19
            )
            / 10,
        },
    )


def _far_apart_case():
    q = np.arange(10)[:, None].copy()
    r = np.arange(10)[:, None].copy()
    q[-1], r[0] = 100, -100
    return q, r


def test_pml_case_global_and_per_class_averages():
    q, r = _far_apart_case()
    ql = np.array([0] * 9 + [1])
    rl = np.array([1] + [0] * 9)
    args = (q, ql, r, rl, False)
    _check_case(
        {"avg_of_avgs": False},
        args,
        {"precision_at_1": 0.9, "r_precision": 0.9, "mean_average_precision_at_r": 0.9,
         "mean_average_precision": 0.9 + 0.01},
    )  # fmt: skip
    _check_case(
        {"avg_of_avgs": True},
        args,
        {"precision_at_1": 0.5, "r_precision": 0.5, "mean_average_precision_at_r": 0.5,
         "mean_average_precision": (1 + 0.1) / 2},
    )  # fmt: skip


def _same_first_other_second(x, y):  # never matches a label with itself
    return (x[..., 0] == y[..., 0]) & (x[..., 1] != y[..., 1])


def test_pml_case_comparison_that_never_matches_a_label_with_itself():
    pytest.importorskip("torch")
    q, r = _far_apart_case()
    ql = np.array([(0, 2)] * 9 + [(1, 2)])
    rl = np.array([(1, 3)] + [(0, 3)] * 9)
    base = {"exclude": ("NMI", "AMI"), "label_comparison_fn": _same_first_other_second}
    _check_case(
        {**base, "avg_of_avgs": False},
        (q, ql, r, rl, False),
        {"precision_at_1": 0.9, "r_precision": 0.9, "mean_average_precision_at_r": 0.9,
         "mean_average_precision": 0.9 + 0.01},
    )  # fmt: skip
    simple = (
        np.arange(2)[:, None],
        np.array([(1, 3), (7, 3)]),
        np.arange(5)[:, None],
        np.array([(1, 3), (7, 4), (1, 4), (1, 5), (1, 6)]),
        False,
    )
    expected = {
        "precision_at_1": 0.5,
        "r_precision": (1 / 3 + 1) / 2,
        "mean_average_precision_at_r": ((1 / 3) / 3 + 1) / 2,
        "mean_average_precision": ((1 / 3 + 2 / 4 + 3 / 5) / 3 + 1) / 2,
    }
    _check_case({**base, "avg_of_avgs": False}, simple, expected)
    _check_case({**base, "avg_of_avgs": True}, simple, expected)
    with pytest.raises(NotImplementedError):
        AccuracyCalculator(include=("NMI", "AMI"), label_comparison_fn=_same_first_other_second)


def test_pml_case_float_labels_compared_within_one():
    pytest.importorskip("torch")

    def close(x, y):
        return (x - y).abs() < 1

    base = {"exclude": ("NMI", "AMI"), "label_comparison_fn": close}
    q, r = np.array([0, 3])[:, None], np.array([0, 3, 1, 2])[:, None]
    ql = np.array([0.01, 0.02])
    _check_case(
        base,
        (q, ql, r, np.array([10.0, 0.03, 0.04, 0.05]), False),
        {"precision_at_1": (0 + 1) / 2, "r_precision": (2 / 3 + 3 / 3) / 2,
         "mean_average_precision_at_r": ((0 + 1 / 2 + 2 / 3) / 3 + 1) / 2,
         "mean_average_precision": ((0 + 1 / 2 + 2 / 3 + 3 / 4) / 3 + 1) / 2},
    )  # fmt: skip
    # the queries are the first reference rows
    r2 = np.array([0, 3, 1, 2])[:, None]
    _check_case(
        base,
        (q, ql, r2, np.array([0.01, 0.02, 10, 0.03]), True),
        {"precision_at_1": 0.5, "r_precision": 0.5,
         "mean_average_precision_at_r": ((0 + 1 / 2) / 2 + 1 / 2) / 2,
         "mean_average_precision": ((0 + 1 / 2 + 2 / 3) / 2 + (1 + 2 / 3) / 2) / 2},
    )  # fmt: skip


def test_pml_case_colocated_items_of_different_labels():
    # two items at each of two points, one of each label: the query's twin is the other label
    got = AccuracyCalculator(include=("precision_at_1",)).get_accuracy(
        np.array([[10], [10], [20], [20]]), np.array([1, 0, 1, 0])
    )
    assert got["precision_at_1"] == 0.0


def test_pml_case_every_item_at_one_point():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 10_000)
    got = AccuracyCalculator(include=("precision_at_1",), k=1).get_accuracy(
        np.zeros((10_000, 2)), labels
    )
    # all distances tie: the nearest is the lowest other index; about half share the label
    assert got["precision_at_1"] == pytest.approx(0.5, rel=0.1)


def test_pml_case_queries_must_lead_the_reference():
    q = np.array([[0], [10], [20]])
    ql = np.array([0, 1, 2])
    calc = AccuracyCalculator(include=("precision_at_1",))
    calc.get_accuracy(q, ql, np.array([[0], [5], [10], [15], [20]]), np.array([0, 9, 1, 8, 2]))
    with pytest.raises(ValueError):
        calc.get_accuracy(
            q, ql, np.array([[0], [5], [10], [15], [20]]), np.array([0, 9, 1, 8, 2]), True
        )
    calc.get_accuracy(
        q, ql, np.array([[0], [10], [20], [5], [15]]), np.array([0, 1, 2, 8, 9]), True
    )


@pytest.mark.parametrize("k", [-1, 0, 1.5, "max"])
def test_pml_case_invalid_k(k):
    with pytest.raises(ValueError):
        AccuracyCalculator(k=k)


@pytest.mark.parametrize("ecfss", [False, True])
@pytest.mark.parametrize("max_k", [None, 98, "max_bin_count"])
@pytest.mark.parametrize("n_classes", [2, 11, 103])
def test_pml_case_large_k_against_pml(ecfss, max_k, n_classes):
    torch, PML = _pml()
    rng = np.random.default_rng(493 + n_classes)
    x = rng.random((1000, 5)).astype(np.float32)
    y = rng.integers(0, n_classes, 1000)
    include = ("mean_average_precision", "mean_average_precision_at_r", "precision_at_1")
    kw = {} if max_k is None else {"k": max_k}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = PML(device=torch.device("cpu"), **kw).get_accuracy(x, y, x, y, ecfss, include)
        got = AccuracyCalculator(**kw).get_accuracy(x, y, x, y, ecfss, include)
    for name in include:
        assert got[name] == pytest.approx(want[name], abs=1e-5), name


def test_fractional_float_labels_equal_pml():
    # PML compares labels with ==, so 0.05 and 0.15 are two classes; embedeval itself takes
    # class ids only, so the shim must code them.  PML 2.9 is the oracle, per class too.
    torch, PML = _pml()
    x, y = _data(seed=11, n=90, n_classes=6)
    y[:2] = [40, 41]  # two lone classes
    yf = torch.from_numpy(y * 0.1 + 0.05)
    xr, yr = _data(seed=12, n=70, n_classes=6)
    yrf = torch.from_numpy(yr * 0.1 + 0.05)
    tx, txr = torch.from_numpy(x), torch.from_numpy(xr)
    for opts in ({}, {"return_per_class": True}, {"avg_of_avgs": True}):
        opts = {"exclude": ("NMI", "AMI"), **opts}
        _compare(PML(**opts).get_accuracy(tx, yf), AccuracyCalculator(**opts).get_accuracy(tx, yf))
        _compare(
            PML(**opts).get_accuracy(tx, yf, txr, yrf),
            AccuracyCalculator(**opts).get_accuracy(tx, yf, txr, yrf),
        )


def _ranked_label_case():
    """Queries whose five nearest references carry given labels, in a given order.

    Query i sits far out on its own axis; reference j's coordinate on that axis sets its rank
    for query i (10 - t for the t-th neighbour, 0 beyond), and a last coordinate gives every
    reference the same norm, so the squared distance is a constant minus 2 * 1000 * coordinate.
    """
    knn = [[0, 1, 1, 2, 2], [1, 0, 1, 1, 3], [4, 4, 4, 4, 2],
           [3, 1, 3, 1, 3], [0, 0, 4, 2, 2], [1, 2, 3, 4, 5]]  # fmt: skip
    ref_labels = np.repeat([0, 1, 2, 3, 4, 5], [2, 3, 5, 4, 5, 1])
    a = np.zeros((6, len(ref_labels)))
    for i, row in enumerate(knn):
        used: set[int] = set()
        for t, lab in enumerate(row):
            j = next(j for j in range(len(ref_labels)) if ref_labels[j] == lab and j not in used)
            used.add(j)
            a[i, j] = 10 - t
    q = np.hstack([1000.0 * np.eye(6), np.zeros((6, 1))])
    norm2 = (a**2).sum(axis=0)
    r = np.hstack([a.T, np.sqrt(norm2.max() - norm2)[:, None]])
    q, r = (np.ascontiguousarray(v, dtype=np.float32) for v in (q, r))  # what PML's faiss takes
    return q, np.array([1, 1, 2, 3, 4, 0]), r, ref_labels


def test_pml_case_ranked_labels_global_macro_and_per_class():
    # PML's main accuracy-calculator case, given there as ranked neighbour labels: query labels
    # 1, 1, 2, 3, 4, 0 (R = 3, 3, 5, 4, 5, 2), each query's values by hand from its ranked
    # labels; per class: [label 0, mean of the two label-1 queries, label 2, label 3, label 4].
    per_query = {
        "precision_at_1": [0, 1, 0, 1, 0, 0],
        "r_precision": [2 / 3, 2 / 3, 1 / 5, 2 / 4, 1 / 5, 0],
        "mean_average_precision_at_r": [
            (1 / 2 + 2 / 3) / 3, (1 + 2 / 3) / 3, (1 / 5) / 5, (1 + 2 / 3) / 4, (1 / 3) / 5, 0
        ],
        "mean_average_precision": [
            (1 / 2 + 2 / 3) / 3, (1 + 2 / 3 + 3 / 4) / 3, (1 / 5) / 5,
            (1 + 2 / 3 + 3 / 5) / 4, (1 / 3) / 5, 0,
        ],
        "mean_reciprocal_rank": [1 / 2, 1, 1 / 5, 1, 1 / 3, 0],
    }  # fmt: skip
    args = _ranked_label_case()
    classes = {n: [v[5], (v[0] + v[1]) / 2, v[2], v[3], v[4]] for n, v in per_query.items()}
    base = {"exclude": ("NMI", "AMI"), "k": 5}  # the case lists five neighbours per query
    _check_case(base, args, {n: np.mean(v) for n, v in per_query.items()})
    _check_case({**base, "avg_of_avgs": True}, args, {n: np.mean(v) for n, v in classes.items()})
    got = AccuracyCalculator(**base, return_per_class=True).get_accuracy(*args)
    for name, want in classes.items():
        np.testing.assert_allclose(got[name], want, rtol=1e-12, atol=1e-12)
