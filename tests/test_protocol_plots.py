"""ROC / DET / CMC figures draw the arrays they are given."""

from __future__ import annotations

import numpy as np
import pytest

import embedeval as ee
from embedeval import plots
from embedeval import verification as ver

SCORES = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]
GENUINE = [True, True, False, True, False, True, False, False]


def test_roc_draws_curve_and_operating_points():
    r = ver.roc(SCORES, GENUINE)
    op = ver.tar_at_far(SCORES, GENUINE, far=[0.25, 0.5])
    fig = plots.plot_roc({"a": r}, operating_points=op)
    ax = fig.axes[0]
    curve, marks = ax.get_lines()[:2]
    np.testing.assert_array_equal(curve.get_ydata(), r.tar)
    # Impostors 0.7, 0.5, 0.3, 0.2.  FAR 0.25 lets one pass: accept > 0.5 -> genuine 0.9, 0.8,
    # 0.6 = 3/4.  FAR 0.5 lets two pass: accept > 0.3 -> all 4 genuine = 1.
    assert marks.get_xdata().tolist() == [0.25, 0.5]
    assert marks.get_ydata().tolist() == [0.75, 1.0]
    assert ax.get_title() and ax.get_xlabel() and ax.get_legend() is not None


def test_det_draws_fnmr():
    r = ver.roc(SCORES, GENUINE)
    fig = plots.plot_det(r)
    y = fig.axes[0].get_lines()[0].get_ydata()
    # FNMR 0 cannot sit on a log axis: drawn at half the finest step (1/4 genuine -> 1/8).
    np.testing.assert_allclose(y, np.maximum(1 - r.tar, 1 / 8))


def test_cmc_plot_from_result():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 3)).astype(np.float32)
    y = rng.integers(0, 5, 40)
    cmc = ee.evaluate(x, y, metrics=["mrr"]).cmc(10)
    fig = plots.plot_cmc({"m": cmc})
    line = fig.axes[0].get_lines()[0]
    assert line.get_xdata().tolist() == list(range(1, 11))
    np.testing.assert_array_equal(line.get_ydata(), cmc)


def test_plot_roc_rejects_other_objects():
    with pytest.raises(ee.InputTypeError, match="RocCurve"):
        plots.plot_roc({"a": [0.1, 0.2]})
