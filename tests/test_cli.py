"""The installed command line, run as a subprocess on real files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.core_oracle import oracle

ROOT = Path(__file__).resolve().parents[1]
X = np.array([[0.0], [1.0], [2.0], [10.0], [11.0]], dtype=np.float32)
Y = np.array([0, 1, 0, 1, 1])


def run(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "embedeval", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def _one_line_error(proc, *needles):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("embedeval: error: ")
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


@pytest.fixture
def files(tmp_path):
    np.savez(tmp_path / "ckpt.npz", embeddings=X, labels=Y)
    np.save(tmp_path / "q.npy", X)
    np.save(tmp_path / "ql.npy", Y)
    return tmp_path


def test_evaluate_prints_and_writes_outputs_matching_the_oracle(files):
    proc = run(
        "evaluate",
        files / "ckpt.npz",
        "--metrics",
        "map_at_r",
        "map",
        "mrr",
        "--json",
        files / "out.json",
        "--per-class",
        files / "pc.csv",
        "--per-query",
        files / "pq.csv",
    )
    assert proc.returncode == 0, proc.stderr
    assert "map_at_r" in proc.stdout and "5 queries" in proc.stdout
    data = json.loads((files / "out.json").read_text())
    summary, _ = oracle(X, Y, metrics=["map_at_r", "map", "mrr"])
    for m, v in summary.items():
        assert data["metrics"][m] == pytest.approx(v)
    assert set(data) >= {"format", "metrics", "per_query", "per_class", "n_queries", "settings"}
    rows = (files / "pc.csv").read_text().splitlines()
    assert rows[0] == "label,n_queries,map_at_r,map,mrr" and len(rows) == 3
    assert len((files / "pq.csv").read_text().splitlines()) == 6


def test_evaluate_split_with_separate_label_files(files):
    proc = run(
        "evaluate",
        files / "q.npy",
        "--labels",
        files / "ql.npy",
        "--reference",
        files / "q.npy",
        "--reference-labels",
        files / "ql.npy",
        "--ref-includes-query",
        "--metrics",
        "precision_at_1",
        "--distance",
        "inner_product",
    )
    assert proc.returncode == 0, proc.stderr
    assert "precision_at_1" in proc.stdout


def test_console_script_when_installed(files):
    exe = shutil.which("embedeval")
    if exe is None:
        pytest.skip("the embedeval console script is not on PATH (package not installed)")
    proc = subprocess.run(
        [exe, "evaluate", str(files / "ckpt.npz")], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr


def test_version_and_help():
    assert run("--version").stdout.startswith("embedeval ")
    out = run("evaluate", "--help").stdout
    assert "examples:" in out and "--reference" in out


@pytest.mark.parametrize(
    ("make", "args", "needles"),
    [
        (None, ["evaluate", "missing.npz"], ["missing.npz", "no such file"]),
        (lambda d: (d / "x.csv").write_text("1"), ["evaluate", "x.csv"], ["unknown file type"]),
        (
            lambda d: np.savez(d / "k.npz", vectors=X),
            ["evaluate", "k.npz"],
            ["no 'embeddings'", "vectors"],
        ),
        (
            lambda d: np.save(d / "p.npy", np.array([{}] * 2, dtype=object), allow_pickle=True),
            ["evaluate", "p.npy", "--labels", "ql.npy"],
            ["never unpickles"],
        ),
        (
            lambda d: np.savez(d / "n.npz", embeddings=np.where(X == 2, np.inf, X), labels=Y),
            ["evaluate", "n.npz"],
            ["1 row(s), first at row 2"],
        ),
        (
            lambda d: np.savez(d / "l.npz", embeddings=X, labels=Y[:3]),
            ["evaluate", "l.npz"],
            ["3 labels", "5"],
        ),
        (
            lambda d: np.save(d / "g.npy", np.zeros((4, 3), np.float32)),
            [
                "evaluate",
                "q.npy",
                "--labels",
                "ql.npy",
                "--reference",
                "g.npy",
                "--reference-labels",
                "ql.npy",
            ],
            ["dimension 1", "has 3"],
        ),
        (None, ["evaluate", "ckpt.npz", "--metrics", "map_at_k"], ["Did you mean 'map_at_r'"]),
        (None, ["evaluate", "ckpt.npz", "--k", "five"], ["--k"]),
        (None, ["evaluate", "q.npy"], ["no labels"]),
        (
            None,
            ["evaluate", "ckpt.npz", "--ref-includes-query"],
            ["--ref-includes-query needs --reference", "leave-one-out"],
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(files, make, args, needles):
    if make is not None:
        make(files)
    _one_line_error(run(*args, cwd=files), *needles)


def test_failed_run_does_not_clobber_an_existing_output(files):
    out = files / "out.json"
    out.write_text("keep me")
    proc = run("evaluate", files / "ckpt.npz", "--metrics", "nope", "--json", out)
    assert proc.returncode == 2
    assert out.read_text() == "keep me"
    assert not [p for p in files.iterdir() if p.name.startswith(".out.json")]


def test_compare_and_figures_and_demo(files):
    rng = np.random.default_rng(0)
    for i, noise in enumerate((0.1, 3.0)):
        emb = np.repeat(np.eye(4), 10, axis=0) + noise * rng.standard_normal((40, 4))
        np.savez(files / f"epoch{i}.npz", embeddings=emb, labels=np.repeat(np.arange(4), 10))
    proc = run(
        "compare",
        files / "epoch0.npz",
        files / "epoch1.npz",
        "--metrics",
        "precision_at_1",
        "--n-boot",
        "200",
        "--plot",
        files / "c.png",
        "--json",
        files / "c.json",
        "--markdown",
        files / "c.md",
        "--quiet",
    )
    assert proc.returncode == 0, proc.stderr
    assert "epoch1" in proc.stdout and (files / "c.png").stat().st_size > 1000
    rows = json.loads((files / "c.json").read_text())["rows"]
    assert rows[1]["checkpoint"] == "epoch1" and rows[1]["diff"] < 0
    proc = run("figures", "--out", files / "figs")
    assert proc.returncode == 0, proc.stderr
    assert len(list((files / "figs").glob("*.png"))) == 11
    proc = run("demo", "--out", files / "demo", "--quiet")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((files / "demo" / "report.json").read_text())
    assert set(report["results"]) == {"raw_pixels", "pca8", "nca16"}
    assert (files / "demo" / "report.md").exists()
