"""generate_figures writes every documented figure, deterministically; the committed PNGs
are a fresh run's."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from matplotlib.image import imread  # noqa: E402

from embedeval.report.figures import FIGURES, generate_figures  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DOCUMENTED_NAMES = {
    "reality_check_example1.png",
    "reality_check_example2.png",
    "reality_check_example3.png",
    "confidence_example2.png",
    "confidence_recall_metrics.png",
    "rank_corr_over_simulated_sigmas.png",
    "error_reject_curve.png",
    "checkpoint_comparison.png",
    "k_sweep.png",
    "per_class.png",
    "distance_histograms.png",
}


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("figs")
    return generate_figures(out, seed=0)


def _pixels(path):
    return imread(path)[..., :3]


def test_the_command_line_writes_the_public_functions_figures(generated, tmp_path, capsys):
    # `embedeval figures --out DIR` and embedeval.report.figures.generate_figures are one public
    # way to
    # regenerate the figures: same files, same bytes, one path printed per figure.
    import embedeval as ee
    from embedeval.cli import main

    assert ee.figures.generate_figures is generate_figures
    assert main(["figures", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out.split()
    assert [Path(p).name for p in printed] == [p.name for p in generated]
    for p in generated:
        assert (tmp_path / p.name).read_bytes() == p.read_bytes(), p.name


def test_every_spec_figure_is_written(generated):
    assert {p.name for p in generated} == DOCUMENTED_NAMES == set(FIGURES)
    assert len(generated) == len(DOCUMENTED_NAMES)
    for p in generated:
        img = _pixels(p)
        h, w = img.shape[:2]
        assert w >= 400 and h >= 300, p.name
        assert img.std() > 0.05, f"{p.name} is blank"
        assert p.stat().st_size < 150_000, p.name


def test_generate_figures_is_deterministic(generated, tmp_path):
    again = {p.name: p for p in generate_figures(tmp_path, seed=0)}
    for p in generated:
        np.testing.assert_array_equal(_pixels(p), _pixels(again[p.name]), err_msg=p.name)


def test_committed_figures_match_a_fresh_run(generated):
    # The PNGs in figures/ are the output of generate_figures(seed=0), not a stale edit.
    for p in generated:
        committed = REPO / "figures" / p.name
        assert committed.exists(), p.name
        a, b = _pixels(p), _pixels(committed)
        assert a.shape == b.shape, p.name
        assert np.mean(np.abs(a - b) > 0.02) < 0.002, p.name


def test_docs_show_every_figure():
    text = (REPO / "docs" / "figures.md").read_text()
    shown = set(re.findall(r"!\[[^\]]*\]\(\.\./figures/([\w.]+\.png)\)", text))
    assert shown == DOCUMENTED_NAMES
