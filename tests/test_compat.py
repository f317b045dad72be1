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
    with pytest.raises(ee.InputError, match="equivalence"):
        calc.get_accuracy(x, y)


def test_knn_func_is_ignored_with_a_warning():
    with pytest.warns(ee.EmbedevalWarning, match="knn_func is ignored"):
        AccuracyCalculator(knn_func=object())
