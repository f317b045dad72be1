"""reject_both_curve: each step is the core pipeline on the kept items; options checked first."""

from __future__ import annotations

import math

import numpy as np
import pytest

import embedeval as ee
from embedeval.evaluation import rejection
from embedeval.evaluation.rejection import kept_counts, reject_both_curve

X = np.array([[0.0], [0.1], [1.0], [1.1], [0.5], [0.6]], dtype=np.float32)
Y = np.array([0, 0, 1, 1, 1, 0])
C = np.array([0.9, 0.8, 0.7, 0.6, 0.1, 0.2])


@pytest.fixture
def steps(monkeypatch):
    calls = []
    real = rejection.evaluate_core

    def counting(settings, inputs):
        calls.append(len(inputs.query))
        return real(settings, inputs)

    monkeypatch.setattr(rejection, "evaluate_core", counting)
    return calls


def test_each_step_evaluates_the_kept_items_leave_one_out(steps):
    cur = reject_both_curve(X, Y, C, fractions=[0.0, 0.34], metrics=["precision_at_1"])
    # 6 - ceil(0.34 * 6) = 6 - 3 = 3 kept: rows 0, 1, 2 (the most confident), labels 0, 0, 1.
    assert steps == [6, 3]
    assert cur.n_kept.tolist() == [6, 3]
    # kept rows 0 (0.0), 1 (0.1), 2 (1.0): 0 -> 1 hit, 1 -> 0 hit, 2 is lone -> P@1 = 2 / 2
    assert cur.metrics["precision_at_1"][1] == 1.0


def test_a_fraction_that_keeps_nothing_is_refused_before_any_step(steps):
    with pytest.raises(ee.InputError, match="fractions holds 0.9"):
        reject_both_curve(X, Y, C, fractions=[0.0, 0.9])
    assert steps == []  # used to evaluate the 0.0 step first


@pytest.mark.parametrize("option", [{"ci": 0.9}, {"reference": X}, {"n_boot": 10}])
def test_options_of_other_protocols_and_add_ons_are_refused(option, steps):
    name = next(iter(option))
    with pytest.raises(ee.InputError, match=f"does not take {name}"):
        reject_both_curve(X, Y, C, **option)
    assert steps == []


@pytest.mark.parametrize(
    ("option", "match"),
    [({"k": "deep"}, "k="), ({"block_size": 0}, "block_size"), ({"average": "x"}, "average")],
)
def test_forwarded_options_are_checked_before_the_first_step(option, match, steps):
    with pytest.raises(ee.InputError, match=match):
        reject_both_curve(X, Y, C, **option)
    assert steps == []


def test_kept_counts_by_hand():
    # n = 10: ceil(0.15 * 10) = 2 rejected, ceil(0.5 * 10) = 5 rejected
    assert kept_counts(np.array([0.0, 0.15, 0.5]), 10) == [10, 8, 5]
    with pytest.raises(ee.InputError, match="rejection_fractions holds 0.95"):
        kept_counts(np.array([0.95]), 10)


@pytest.mark.parametrize(
    "fraction, n", [(0.28, 100_000), (0.07, 3_000_000), (0.14, 10_000_000), (1 / 7, 7)]
)
def test_kept_counts_reject_ceil_of_the_fraction_times_n_at_large_n(fraction, n):
    # The float product f·n lands above a whole count (0.28·100000 = 28000.000000000004), which
    # an absolute slack of 1e-12 does not absorb at large n.  The count is read from the
    # fraction as written (a decimal, or j / n).
    from fractions import Fraction

    written = Fraction(1, 7) if fraction == 1 / 7 else Fraction(repr(fraction))
    expected = n - math.ceil(written * n)
    assert kept_counts(np.array([fraction]), n) == [expected]
