"""The notebooks in notebooks/ run top to bottom (SPEC §10)."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path):
    nbformat = pytest.importorskip("nbformat", reason="test extra: nbformat")
    nbclient = pytest.importorskip("nbclient", reason="test extra: nbclient")
    pytest.importorskip("ipykernel", reason="test extra: ipykernel")
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(
        nb,
        timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent.parent)}},
    ).execute()
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.output_type == "error"
    ]
    assert not errors
    # The figures must render as images for a reader, not as "<Figure size ...>" text.
    images = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if "image/png" in o.get("data", {})
    ]
    assert images, f"{path.name} shows no figure"


def test_there_are_at_least_two_notebooks():
    assert len(NOTEBOOKS) >= 2
