"""Execute the notebooks in notebooks/ top to bottom and store their outputs in place.

    python tools/run_notebooks.py            # every notebook
    python tools/run_notebooks.py notebooks/reality_check.ipynb

Run from the repository root with embedeval importable (``pip install .``, or PYTHONPATH=.).
The stored notebooks are deterministic: fixed seeds, execution counts 1..n, no timing metadata,
no interpreter version, and figures written without a software stamp.  tests/test_notebooks.py
executes them afresh and checks that every text output matches what is committed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def execute(path: Path, timeout: int = 300) -> Any:
    """Run one notebook in a fresh kernel (working folder: the repository root) and return it
    normalised."""
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    ).execute()
    return normalise(nb)


def normalise(nb: Any) -> Any:
    """Drop what changes from run to run or machine to machine (times, versions, counts)."""
    nb.metadata.pop("widgets", None)
    nb.metadata["language_info"] = {"name": "python"}
    count = 0
    for i, cell in enumerate(nb.cells):
        cell.metadata.pop("execution", None)
        if not cell.get("id"):  # nbformat 4.5 wants one; a fixed id keeps the file stable
            cell["id"] = f"cell-{i}"
        if cell.cell_type != "code":
            continue
        count += 1
        cell.execution_count = count
        cell["outputs"] = _merge_streams(cell.get("outputs", []))
        for out in cell.get("outputs", []):
            if "execution_count" in out:
                out["execution_count"] = count
            out.get("metadata", {}).pop("needs_background", None)
    return nb


def _merge_streams(outputs: list[Any]) -> list[Any]:
    """Join consecutive pieces of the same stream: the kernel splits printed text into as many
    messages as its flushes happened to make, which differs from run to run."""
    merged: list[Any] = []
    for out in outputs:
        last = merged[-1] if merged else None
        if (
            out["output_type"] == "stream"
            and last is not None
            and last["output_type"] == "stream"
            and last["name"] == out["name"]
        ):
            last["text"] += out["text"]
        else:
            merged.append(out)
    return merged


def text_outputs(nb: Any) -> list[list[tuple[str, str]]]:
    """Per code cell, its outputs reduced to what must not change between runs: stream and
    plain-text results verbatim, images by kind only (their bytes depend on the font stack)."""
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outs = []
        for out in _merge_streams([dict(o) for o in cell.get("outputs", [])]):
            if out["output_type"] == "stream":
                outs.append((out["name"], out["text"]))
            elif out["output_type"] == "error":
                outs.append(("error", out["ename"]))
            else:
                data = out.get("data", {})
                outs.append(
                    ("image" if "image/png" in data else "text", data.get("text/plain", ""))
                )
        cells.append(outs)
    return cells


def main(argv: list[str]) -> int:
    import nbformat

    paths = [Path(p) for p in argv] or sorted(NOTEBOOKS.glob("*.ipynb"))
    for path in paths:
        nb = execute(path)
        nbformat.write(nb, path)
        print(f"executed {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
