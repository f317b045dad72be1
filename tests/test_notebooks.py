"""The notebooks in notebooks/ run top to bottom, and their committed outputs are a fresh run's.

The outputs are stored so that a reader sees the figures on a code-hosting page without running
anything; ``python tools/run_notebooks.py`` regenerates them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _runner():
    found = importlib.util.spec_from_file_location("run_notebooks", ROOT / "tools/run_notebooks.py")
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_matches_its_committed_outputs(path):
    nbformat = pytest.importorskip("nbformat", reason="test extra: nbformat")
    pytest.importorskip("nbclient", reason="test extra: nbclient")
    pytest.importorskip("ipykernel", reason="test extra: ipykernel")
    runner = _runner()
    committed = nbformat.read(path, as_version=4)
    fresh = runner.execute(path)
    got, want = runner.text_outputs(fresh), runner.text_outputs(committed)
    assert not any(kind == "error" for cell in got for kind, _ in cell)
    # The figures must render as images for a reader, not as "<Figure size ...>" text.
    assert any(kind == "image" for cell in got for kind, _ in cell), f"{path.name}: no figure"
    fix = "run `python tools/run_notebooks.py` and commit the notebook"
    assert any(want), f"{path.name} is committed without outputs; {fix}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"{path.name}, code cell {i + 1}: the committed outputs are stale; {fix}"
    # the stored notebook is already normalised (no timings, no interpreter version)
    assert committed.metadata.get("language_info") == {"name": "python"}, fix


def test_there_are_at_least_two_notebooks():
    assert len(NOTEBOOKS) >= 2
