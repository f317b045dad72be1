"""The package's top level: its public names, a cheap ``import embedeval``, and docs that only
use public modules."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import embedeval as ee

ROOT = Path(__file__).resolve().parents[1]


def _fresh_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_import_loads_no_heavy_dependency():
    # faiss, matplotlib, scikit-learn and torch load on first use, never on `import embedeval`;
    # reaching the lazy names (without calling them) must not load them either.
    heavy = ("faiss", "matplotlib", "sklearn", "torch")
    proc = _fresh_python(
        "import sys, embedeval as ee\n"
        "ee.train_index, ee.Comparison, ee.report.figures.generate_figures, ee.plots.plot_roc\n"
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_import_and_the_command_line_start_load_no_pipeline_module():
    # `import embedeval` (and `import embedeval.cli`, what the command runs first) reads the
    # errors, the version and the utilities only: the engine, the search and the evaluation
    # modules load when a function is first used, so `--help` and a Ctrl-C come at once
    proc = _fresh_python(
        "import sys, embedeval, embedeval.cli\n"
        "print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('embedeval.')}))\n"
        "from embedeval import evaluate\n"
        "print('embedeval.engine.exact' in sys.modules)"
    )
    assert proc.returncode == 0, proc.stderr
    loaded, after = proc.stdout.split("\n")[:2]
    assert loaded == "['cli', 'utils']"
    assert after == "True"


def test_every_public_name_resolves():
    for name in ee.__all__:
        assert getattr(ee, name) is not None, name
    folders = {"utils", "plots", "metrics", "engine", "search", "evaluation", "protocols", "report"}
    assert {"Comparison", "train_index", "integrations", *folders} <= set(dir(ee))
    with pytest.raises(AttributeError, match="no attribute '_approx_private'"):
        ee._approx_private  # noqa: B018


def test_short_names_of_earlier_releases_are_the_layered_modules():
    import embedeval.metrics.ranking
    import embedeval.protocols.reid
    import embedeval.report.figures

    assert ee.ranking is embedeval.metrics.ranking
    assert ee.reid is embedeval.protocols.reid
    assert ee.figures is embedeval.report.figures


def test_compare_returns_the_exported_comparison():
    x = np.array([[0.0], [0.1], [5.0], [5.1]])
    y = np.array([0, 0, 1, 1])
    runs = {"a": ee.evaluate(x, y, metrics=["precision_at_1"])}
    runs["b"] = ee.evaluate(x[::-1].copy(), y, metrics=["precision_at_1"])
    cmp = ee.compare(runs, n_boot=50)
    assert isinstance(cmp, ee.Comparison)
    assert sys.modules["embedeval.evaluation.compare"].Comparison is ee.Comparison


def _precision_at_1_leave_one_out(x: np.ndarray, y: np.ndarray) -> float:
    # Plain loop: the nearest other row by Euclidean distance (the data have no ties).
    hits = []
    for i in range(len(x)):
        d = np.sqrt(((x - x[i]) ** 2).sum(axis=1))
        d[i] = np.inf
        hits.append(float(y[int(np.argmin(d))] == y[i]))
    return float(np.mean(hits))


def test_train_index_gives_an_index_that_evaluate_reuses_unchanged():
    pytest.importorskip("faiss")
    rng = np.random.default_rng(3)
    y = np.repeat(np.arange(4), 25)
    x = (np.repeat(rng.standard_normal((4, 8)), 25, axis=0) + rng.standard_normal((100, 8))).astype(
        np.float32
    )
    # One inverted list: the index scans every reference, so its neighbours are the exact ones.
    trained = ee.train_index(x, "IVF1,Flat")
    assert trained.is_trained and trained.ntotal == 0
    res = ee.evaluate(x, y, metrics=["precision_at_1"], index=trained)
    assert res["precision_at_1"] == pytest.approx(_precision_at_1_leave_one_out(x, y), abs=1e-12)
    assert trained.ntotal == 0  # the references went into a copy


_PRIVATE = re.compile(
    r"\bembedeval(\.\w+)*\._[a-z]\w*|\bfrom embedeval[\w.]* import [^\n]*\b_[a-z]"
)


def _user_facing_texts():
    yield ROOT / "README.md", (ROOT / "README.md").read_text()
    for path in sorted((ROOT / "docs").glob("*.md")):
        yield path, path.read_text()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        yield path, "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    for folder in ("benchmarks", "tools"):
        for path in sorted((ROOT / folder).glob("*.py")):
            yield path, path.read_text()


def test_docs_notebooks_and_benchmarks_use_public_modules_only():
    found = [
        f"{path.relative_to(ROOT)}: {m.group(0)}"
        for path, text in _user_facing_texts()
        for m in _PRIVATE.finditer(text)
    ]
    assert found == []


def test_the_private_module_pattern_catches_what_it_should():
    for bad in (
        "embedeval._approx.train_index(ref)",
        "from embedeval._figures import generate_figures",
        "from embedeval.search.neighbors import _sort_block",
    ):
        assert _PRIVATE.search(bad), bad
    for good in (
        "embedeval.train_index(ref)",
        "from embedeval.report.figures import generate_figures",
    ):
        assert not _PRIVATE.search(good), good
