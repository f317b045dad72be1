"""The installed command line, run as a subprocess on real files."""

from __future__ import annotations

import html
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests import oracle

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


def test_exact_sample_zero_skips_the_error_report_like_the_api(files):
    # evaluate(..., exact_sample=0) is valid (no query searched twice); the flag takes it too.
    pytest.importorskip("faiss")
    out = files / "out.json"
    args = ("--index", "Flat", "--exact-sample", 0, "--json", out)
    proc = run("evaluate", files / "ckpt.npz", *args)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["approximation"]["n_sample"] == 0
    assert data["approximation"]["knn_recall"] is None
    summary, _ = oracle.summary(X, Y, metrics=["map_at_r"])
    assert data["metrics"]["map_at_r"] == pytest.approx(summary["map_at_r"])


def test_seed_draws_the_exact_sample_of_index_without_ci(files):
    # --seed chooses the queries searched exactly too (as evaluate(..., seed=)), with or
    # without --ci: the report's exact value is the mean over that seeded sample.
    pytest.importorskip("faiss")
    out = files / "out.json"
    args = ("--index", "Flat", "--exact-sample", 2, "--seed", 3, "--metrics", "map_at_r")
    proc = run("evaluate", files / "ckpt.npz", *args, "--json", out)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())["approximation"]
    sample = np.random.default_rng(3).choice(5, 2, replace=False)  # every query has a match
    _, per_query = oracle.summary(X, Y, metrics=["map_at_r"])
    expected = np.mean(np.asarray(per_query["map_at_r"])[sample])
    assert report["seed"] == 3 and report["n_sample"] == 2
    assert report["metrics"]["map_at_r"]["exact"] == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("metrics", "named"), [(["map"], "map"), (["mrr", "precision_at_1"], "mrr")]
)
def test_index_without_k_refuses_full_depth_metrics_by_their_flags(files, metrics, named):
    # map / mrr read each query's ranking to its farthest (nearest) relevant reference, which an
    # approximate index cannot promise: refused naming --index and --k, before any search
    out = files / "out.json"
    proc = run("evaluate", files / "ckpt.npz", "--index", "Flat", "--metrics", *metrics,
               "--json", out)  # fmt: skip
    _one_line_error(proc, "--index Flat without --k", named, "add --k")
    assert "k=None" not in proc.stderr and not out.exists()


def test_errors_from_within_the_run_name_the_search_flags(files):
    # a bad factory string is found by faiss, deep in the run: the message names the flag as
    # typed, not the library's keyword (index='Bogus99')
    pytest.importorskip("faiss")
    proc = run("evaluate", files / "ckpt.npz", "--index", "Bogus99", "--k", "3")
    _one_line_error(proc, "--index Bogus99 is neither an existing file nor a faiss index")
    assert "index=" not in proc.stderr


def test_a_cuda_device_without_a_gpu_is_named_by_its_flags(files):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible")
    proc = run("evaluate", files / "ckpt.npz", "--device", "cuda")
    _one_line_error(proc, "--device cuda, but PyTorch sees no CUDA GPU", "Use --device cpu")
    assert "device=" not in proc.stderr and "backend=" not in proc.stderr


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
    summary, _ = oracle.summary(X, Y, metrics=["map_at_r", "map", "mrr"])
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
    proc = subprocess.run(
        [exe, "evaluate", str(files / "missing.npz")], capture_output=True, text=True, timeout=300
    )
    _one_line_error(proc, "missing.npz", "no such file")


def test_version_and_help():
    import embedeval

    assert run("--version").stdout == f"embedeval {embedeval.__version__}\n"
    out = run("evaluate", "--help").stdout
    assert "examples:" in out and "--reference" in out
    top = run("--help").stdout
    for command in ("evaluate", "compare", "figures", "demo", "examples:", "130"):
        assert command in top, command


def test_every_option_has_help_text():
    import argparse

    from embedeval.cli import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, (name, action.option_strings or action.dest)


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
        (None, ["evaluate", "ckpt.npz", "--k", "five"], ["--k", "max_bin_count"]),
        (None, ["evaluate", "ckpt.npz", "--k", "0"], ["--k", "positive integer"]),
        (None, ["evaluate", "ckpt.npz", "--k", "2.5"], ["--k", "'2.5'"]),
        (None, ["evaluate", "ckpt.npz", "--ci", "1.5"], ["--ci", "between 0 and 1"]),
        (None, ["evaluate", "ckpt.npz", "--n-boot", "0"], ["--n-boot", "positive integer"]),
        (None, ["evaluate", "ckpt.npz", "--threads", "0"], ["--threads", "positive integer"]),
        (None, ["evaluate", "ckpt.npz", "--distance", "l1"], ["--distance", "'l1'", "cosine"]),
        (None, ["evaluate", "ckpt.npz", "--bogus"], ["unrecognized arguments: --bogus"]),
        (None, ["evaluat", "ckpt.npz"], ["invalid choice: 'evaluat'", "--help"]),
        (None, [], ["COMMAND", "--help"]),
        (None, ["evaluate", "q.npy"], ["no labels"]),
        (
            None,
            ["evaluate", "ckpt.npz", "--ref-includes-query"],
            ["--ref-includes-query needs --reference", "leave-one-out"],
        ),
        # a file that is not NumPy at all, a real pickle, and a .npy saved under .npz
        (
            lambda d: (d / "junk.npy").write_bytes(b"not numpy"),
            ["evaluate", "junk.npy", "--labels", "ql.npy"],
            ["junk.npy is not a .npy file", "np.save"],
        ),
        (
            lambda d: (d / "pk.npy").write_bytes(pickle.dumps([1.0, 2.0], protocol=4)),
            ["evaluate", "pk.npy", "--labels", "ql.npy"],
            ["pk.npy is a Python pickle", "never unpickles"],
        ),
        (
            lambda d: (d / "renamed.npz").write_bytes((d / "q.npy").read_bytes()),
            ["evaluate", "renamed.npz"],
            ["renamed.npz is a .npy file", "rename it to end in .npy"],
        ),
        (
            lambda d: np.savez(d / "pl.npz", embeddings=X, labels=np.array([{}] * 5, object)),
            ["evaluate", "pl.npz"],
            ["pl.npz", "never unpickles"],
        ),
        # side files of the wrong length are named by their flag
        (
            lambda d: np.save(d / "c3.npy", np.ones(3)),
            ["evaluate", "ckpt.npz", "--confidences", "c3.npy"],
            ["--confidences c3.npy has 3 values", "ckpt.npz has 5 rows"],
        ),
        (
            lambda d: np.save(d / "g2.npy", np.arange(2)),
            ["evaluate", "ckpt.npz", "--groups", "g2.npy"],
            ["--groups g2.npy has 2 values"],
        ),
        (
            lambda d: np.save(d / "rl.npy", Y[:4]),
            "evaluate q.npy --labels ql.npy --reference q.npy --reference-labels rl.npy".split(),
            ["--reference-labels rl.npy has 4 values", "q.npy has 5 rows"],
        ),
        (None, ["evaluate", "ckpt.npz", "--reference-labels", "ql.npy"], ["need --reference"]),
        (
            lambda d: np.savez(
                d / "nc.npz", embeddings=X, labels=Y, confidences=[np.nan, 1, 1, 1, 1]
            ),
            ["evaluate", "nc.npz"],
            ["nc.npz (confidences)", "first at index 0"],
        ),
        # outputs that cannot be written are refused before any work (no table on stdout)
        (
            None,
            ["evaluate", "ckpt.npz", "--json", "ckpt.npz/out.json"],
            ["--json ckpt.npz/out.json", "ckpt.npz is a file, not a folder"],
        ),
        (None, ["evaluate", "ckpt.npz", "--per-class", "pc.xlsx"], ["--per-class", ".csv or .md"]),
        (None, ["figures", "--out", "ckpt.npz/figs"], ["--out ckpt.npz/figs", "not a folder"]),
        (None, ["demo", "--out", "ckpt.npz"], ["--out ckpt.npz", "not a folder"]),
        (
            None,
            ["compare", "ckpt.npz", "q.npy", "--labels", "ql.npy", "--baseline", "epoch9"],
            ["--baseline 'epoch9'", "ckpt, q"],
        ),
        (
            lambda d: np.savez(d / "short.npz", embeddings=X[:4], labels=Y[:4]),
            ["compare", "ckpt.npz", "short.npz"],
            ["different queries", "same queries in the same order"],
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(files, make, args, needles):
    if make is not None:
        make(files)
    proc = run(*args, cwd=files)
    _one_line_error(proc, *needles)
    assert "metric" not in proc.stdout  # failed before printing a result table


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
    assert "## What it shows" in (files / "demo" / "report.md").read_text()
    assert "What it shows" in proc.stdout
    assert len(report["findings"]) == 4  # two checkpoints x (P@1, MAP@R) against raw pixels
    page = (files / "demo" / "report.html").read_text(encoding="utf-8")
    assert len(page.encode()) < 10 * 2**20 and "http://" not in page and "https://" not in page
    assert page.count('class="gallery-row"') == 12
    assert "https://" not in (files / "demo" / "comparison.html").read_text(encoding="utf-8")
    # The raw-pixel numbers of the demo, recomputed by the brute-force oracle on the same split.
    datasets = pytest.importorskip("sklearn.datasets")
    model_selection = pytest.importorskip("sklearn.model_selection")
    x, y = datasets.load_digits(return_X_y=True)
    _, x_eval, _, y_eval = model_selection.train_test_split(
        x, y, test_size=0.5, stratify=y, random_state=0
    )
    expected, _ = oracle.summary(x_eval, y_eval, metrics=["precision_at_1", "map_at_r"])
    for m, v in expected.items():
        assert report["results"]["raw_pixels"]["metrics"][m] == pytest.approx(v, abs=1e-9), m


# A fixed random set with 4 classes, 10 points each: every metric is checked against the
# brute-force oracle of tests/oracle.py, never against embedeval itself.
RNG = np.random.default_rng(7)
XS = (
    np.repeat(RNG.standard_normal((4, 3)), 10, axis=0) + 0.8 * RNG.standard_normal((40, 3))
).astype(np.float32)
YS = np.repeat(np.arange(4), 10)


def _json(path):
    return json.loads(Path(path).read_text())


def test_evaluate_split_values_match_the_oracle(tmp_path):
    np.save(tmp_path / "q.npy", XS[:16])
    np.save(tmp_path / "g.npy", XS[16:])
    (tmp_path / "ql.txt").write_text("\n".join(map(str, YS[:16])) + "\n")
    np.save(tmp_path / "gl.npy", YS[16:])
    metrics = ["map_at_r", "precision_at_1", "r_precision", "mrr"]
    proc = run(
        "evaluate", "q.npy", "--labels", "ql.txt", "--reference", "g.npy",
        "--reference-labels", "gl.npy", "--metrics", *metrics, "--distance", "cosine",
        "--json", "out.json", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    expected, _ = oracle.summary(
        XS[:16], YS[:16], XS[16:], YS[16:], metrics=metrics, distance="cosine"
    )
    got = _json(tmp_path / "out.json")
    for m in metrics:
        assert got["metrics"][m] == pytest.approx(expected[m], abs=1e-12), m
    assert "16 queries" in proc.stdout and "24 references" in proc.stdout


def test_evaluate_macro_max_bin_count_ci_and_tables(tmp_path):
    np.savez(tmp_path / "e.npz", embeddings=XS, labels=np.array([f"c{v}" for v in YS]))
    proc = run(
        "evaluate", "e.npz", "--metrics", "map_at_r", "precision_at_5", "--average", "macro",
        "--k", "max_bin_count", "--ci", "0.9", "--n-boot", "50", "--json", "o.json",
        "--per-class", "pc.md", "--per-query", "pq.csv", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    expected, per_query = oracle.summary(
        XS, YS, metrics=["map_at_r", "precision_at_5"], k="max_bin_count", average="macro"
    )
    got = _json(tmp_path / "o.json")
    for m, v in expected.items():
        assert got["metrics"][m] == pytest.approx(v, abs=1e-12)
        low, high = got["ci"][m]
        # percentile bootstrap over classes: the interval lies within the class means' range
        class_means = [per_query[m][YS == c].mean() for c in range(4)]
        assert min(class_means) - 1e-12 <= low <= high <= max(class_means) + 1e-12
    assert "90% CI" in proc.stdout
    md = (tmp_path / "pc.md").read_text().splitlines()
    assert md[0] == "| label | n_queries | map_at_r | precision_at_5 |"
    row = next(r for r in md if r.startswith("| c2 |"))
    assert row.split(" | ")[1] == "10"
    assert float(row.split(" | ")[2]) == pytest.approx(
        per_query["map_at_r"][YS == 2].mean(), abs=1e-6
    )
    pq = (tmp_path / "pq.csv").read_text().splitlines()
    head = "query,label,top1_index,top1_label,top1_distance,map_at_r,precision_at_5"
    assert pq[0] == head and len(pq) == 41
    assert float(pq[1].split(",")[5]) == pytest.approx(per_query["map_at_r"][0], abs=1e-6)


def test_sigmas_key_means_lower_is_confident(tmp_path):
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    sigmas = np.random.default_rng(3).random(40)
    np.savez(tmp_path / "s.npz", embeddings=XS, labels=YS, sigmas=sigmas)
    proc = run("evaluate", "s.npz", "--metrics", "precision_at_1", "--json", "o.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    _, per_query = oracle.summary(XS, YS, metrics=["precision_at_1"])
    correct = per_query["precision_at_1"]
    assert 0 < correct.sum() < 40  # both classes of outcome, so AUROC is defined
    expected = sklearn_metrics.roc_auc_score(correct, -sigmas)  # low sigma = confident
    assert _json(tmp_path / "o.json")["confidence"]["r_auroc"] == pytest.approx(expected)


@pytest.mark.parametrize("fmt", ["safetensors", "parquet"])
def test_optional_formats_through_the_cli(tmp_path, fmt):
    if fmt == "safetensors":
        st = pytest.importorskip("safetensors.numpy", reason="optional extra [safetensors]")
        st.save_file({"embeddings": XS, "labels": YS.astype(np.int64)}, str(tmp_path / "e.st"))
        (tmp_path / "e.st").rename(tmp_path / "e.safetensors")
    else:
        pa = pytest.importorskip("pyarrow", reason="optional extra [parquet]")
        import pyarrow.parquet as pq

        table = pa.table({"embedding": [r.tolist() for r in XS], "label": [f"c{v}" for v in YS]})
        pq.write_table(table, tmp_path / "e.parquet")
    proc = run("evaluate", f"e.{fmt}", "--metrics", "map_at_r", "--json", "o.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    expected, _ = oracle.summary(XS, YS, metrics=["map_at_r"])
    assert _json(tmp_path / "o.json")["metrics"]["map_at_r"] == pytest.approx(expected["map_at_r"])


def test_nmi_leaves_stderr_clean(tmp_path):
    # faiss prints a C-level "please provide at least ... training points" warning for small
    # sets; a clean run must print nothing on stderr.
    np.savez(tmp_path / "e.npz", embeddings=XS, labels=YS)
    proc = run("evaluate", "e.npz", "--metrics", "nmi", "ami", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_compare_permutation_with_a_named_baseline(tmp_path):
    noisy = XS + 2.0 * np.random.default_rng(1).standard_normal(XS.shape).astype(np.float32)
    np.savez(tmp_path / "good.npz", embeddings=XS, labels=YS)
    np.savez(tmp_path / "bad.npz", embeddings=noisy, labels=YS)
    proc = run(
        "compare", "bad.npz", "good.npz", "--baseline", "good", "--test", "permutation",
        "--metrics", "map_at_r", "--n-boot", "200", "--json", "c.json", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # progress lines only on a terminal
    assert "diff vs good" in proc.stdout
    rows = {r["checkpoint"]: r for r in _json(tmp_path / "c.json")["rows"]}
    good, _ = oracle.summary(XS, YS, metrics=["map_at_r"])
    bad, _ = oracle.summary(noisy, YS, metrics=["map_at_r"])
    assert rows["bad"]["diff"] == pytest.approx(bad["map_at_r"] - good["map_at_r"])


#: The command line with evaluate() replaced by a wait that marks its start: SIGINT then
#: lands inside embedeval's code, past start-up, the input reading and the output checks.
_BLOCKED_CLI = """
import pathlib, sys, time
import embedeval.evaluation.evaluate as ev
def wait(*args, **kwargs):
    pathlib.Path("started").touch()
    time.sleep(120)
ev.evaluate = wait
from embedeval.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_is_one_line_exit_130_and_keeps_an_existing_output(files):
    out = files / "out.json"
    out.write_text("keep me")
    proc = subprocess.Popen(
        [sys.executable, "-c", _BLOCKED_CLI, "evaluate", "q.npy", "--labels", "ql.npy",
         "--json", out],
        cwd=files,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        while not (files / "started").exists() and proc.poll() is None:
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("embedeval: interrupted"), err
    assert "Traceback" not in err
    assert out.read_text() == "keep me"


def test_compare_keeps_one_row_per_file_even_for_the_same_file_twice(files):
    proc = run("compare", "ckpt.npz", "ckpt.npz", "--metrics", "map_at_r", "--json", "c.json",
               cwd=files)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = _json(files / "c.json")["rows"]
    assert [r["checkpoint"] for r in rows] == ["ckpt.npz #1", "ckpt.npz #2"]
    assert rows[1]["diff"] == 0


@pytest.mark.parametrize("quiet", [False, True])
def test_progress_bar_only_on_a_terminal_and_not_with_quiet(files, quiet):
    pty = pytest.importorskip("pty", reason="needs a POSIX pseudo-terminal")
    master, slave = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "embedeval", "evaluate", "ckpt.npz"]
            + (["--quiet"] if quiet else []),
            cwd=files,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            stdout=subprocess.PIPE,
            stderr=slave,
            timeout=300,
        )
    finally:
        os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO once the terminal has no writer left
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    assert proc.returncode == 0
    # (on a pipe it never shows: test_nmi_leaves_stderr_clean checks an empty stderr)
    if quiet:
        assert seen == b""
    else:
        assert b"5/5 queries" in seen


def test_threads_option_gives_the_oracle_values_for_any_count(tmp_path):
    rng = np.random.default_rng(4)
    x = rng.integers(-3, 4, size=(120, 3)).astype(np.float32)  # exact keys, many ties
    y = rng.integers(0, 6, 120)
    np.savez(tmp_path / "e.npz", embeddings=x, labels=y)
    metrics = ["map_at_r", "precision_at_1", "mrr"]
    expected, _ = oracle.summary(x, y, metrics=metrics)
    for threads in ("1", "3"):
        proc = run(
            "evaluate", "e.npz", "--metrics", *metrics, "--threads", threads,
            "--json", f"t{threads}.json", cwd=tmp_path,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        got = _json(tmp_path / f"t{threads}.json")
        for m in metrics:
            assert got["metrics"][m] == pytest.approx(expected[m], abs=1e-12), (threads, m)


# ---------------------------------------------------------------- a new user's first hour


def _clusters(n_classes, per_class, dim=8, seed=0, spread=1.0):
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(n_classes), per_class)
    centers = rng.standard_normal((n_classes, dim)) * 2
    x = (centers[y] + spread * rng.standard_normal((y.size, dim))).astype(np.float32)
    return x, y


def test_max_bin_count_adapts_the_default_metrics_and_drops_recall_at_1(tmp_path):
    # 4 classes of 10: max_bin_count = 9, so the default Recall@10 cannot be read; Recall@9 is.
    x, y = _clusters(4, 10, seed=1, spread=2.0)
    np.savez(tmp_path / "e.npz", embeddings=x, labels=y)
    proc = run(
        "evaluate", tmp_path / "e.npz", "--k", "max_bin_count", "--json", tmp_path / "o.json"
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "o.json").read_text())
    assert list(data["metrics"]) == ["precision_at_1", "r_precision", "map_at_r", "recall_at_9"]
    want, _ = oracle.summary(x, y, metrics=["precision_at_1", "recall_at_9"], k=9)
    assert data["metrics"]["recall_at_9"] == pytest.approx(want["recall_at_9"])
    assert "recall_at_1 " not in proc.stdout
    # without a cap: P@1, R-Prec, MAP@R, R@10 and no recall_at_1
    proc = run("evaluate", tmp_path / "e.npz", "--json", tmp_path / "o.json")
    assert list(json.loads((tmp_path / "o.json").read_text())["metrics"]) == [
        "precision_at_1",
        "r_precision",
        "map_at_r",
        "recall_at_10",
    ]


def _rows_of(stdout, names):
    """Order in which the names first appear in the printed comparison."""
    pos = {n: stdout.index(n) for n in names}
    return sorted(names, key=pos.get)


def test_compare_orders_checkpoints_naturally_unless_keep_order(tmp_path):
    x, y = _clusters(5, 6)
    paths = []
    for epoch in (1, 10, 5):  # the order a shell glob gives
        p = tmp_path / f"epoch_{epoch}.npz"
        np.savez(p, embeddings=x + 0.01 * epoch, labels=y)
        paths.append(p)
    proc = run("compare", *paths, "--metrics", "map_at_r", "--n-boot", "50", "--json",
               tmp_path / "c.json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = json.loads((tmp_path / "c.json").read_text())["rows"]
    order = list(dict.fromkeys(r["checkpoint"] for r in rows))
    assert order == ["epoch_1", "epoch_5", "epoch_10"]
    prov = json.loads((tmp_path / "c.json").read_text())["provenance"]
    assert [i["name"] for i in prov["inputs"]] == ["epoch_1.npz", "epoch_5.npz", "epoch_10.npz"]
    proc = run("compare", *paths, "--keep-order", "--metrics", "map_at_r", "--n-boot", "50",
               "--json", tmp_path / "c.json")  # fmt: skip
    rows = json.loads((tmp_path / "c.json").read_text())["rows"]
    assert list(dict.fromkeys(r["checkpoint"] for r in rows)) == ["epoch_1", "epoch_10", "epoch_5"]


def test_label_files_with_two_columns_or_a_header_are_refused(files):
    (files / "two.csv").write_text("id,label\n" + "".join(f"{i},{v}\n" for i, v in enumerate(Y)))
    _one_line_error(run("evaluate", files / "q.npy", "--labels", files / "two.csv"),
                    "two.csv", "several columns")  # fmt: skip
    (files / "two.tsv").write_text("".join(f"{i}\t{v}\n" for i, v in enumerate(Y)))
    _one_line_error(run("evaluate", files / "q.npy", "--labels", files / "two.tsv"),
                    "several columns")  # fmt: skip
    (files / "head.txt").write_text("label\n" + "".join(f"{v}\n" for v in Y))
    _one_line_error(run("evaluate", files / "q.npy", "--labels", files / "head.txt"),
                    "head.txt", "header")  # fmt: skip
    (files / "head2.txt").write_text("Label\ncat\ndog\ncat\ndog\ndog\n")  # header above names
    _one_line_error(run("evaluate", files / "q.npy", "--labels", files / "head2.txt"),
                    "head2.txt", "header")  # fmt: skip
    (files / "spaced.txt").write_text("".join(f"{i} {v}\n" for i, v in enumerate(Y)))
    _one_line_error(run("evaluate", files / "q.npy", "--labels", files / "spaced.txt"),
                    "space-separated")  # fmt: skip
    np.save(files / "table.npy", np.stack([np.arange(5), Y], axis=1))
    _one_line_error(run("evaluate", files / "q.npy", "--labels", files / "table.npy"),
                    "2 columns")  # fmt: skip
    # string labels (no header question) still load
    (files / "names.txt").write_text("cat\ndog\ncat\ndog\ndog\n")
    assert run("evaluate", files / "q.npy", "--labels", files / "names.txt").returncode == 0


def test_every_query_lone_is_an_error_not_a_table_of_nan(files):
    (files / "ids.txt").write_text("".join(f"{i}\n" for i in range(5)))
    proc = run("evaluate", files / "q.npy", "--labels", files / "ids.txt")
    _one_line_error(proc, "lone", "every label is unique")


def test_compare_with_a_checkpoint_of_lone_queries_is_one_line_of_error(files):
    # the run's own warning that every metric is NaN would be a second line before the error
    np.savez(files / "apart.npz", embeddings=X, labels=np.arange(5))
    proc = run("compare", files / "ckpt.npz", files / "apart.npz", "--json", files / "c.json")
    _one_line_error(proc, "apart.npz", "lone", "every label is unique")
    assert not (files / "c.json").exists()


def test_pytorch_files_are_recognised_by_content_and_never_unpickled(tmp_path):
    torch = pytest.importorskip("torch")
    t = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    torch.save(t, tmp_path / "e.npy")
    torch.save(t, tmp_path / "e.pt")
    torch.save(t, tmp_path / "old.pth", _use_new_zipfile_serialization=False)
    for name in ("e.npy", "e.pt", "old.pth"):
        proc = run("evaluate", tmp_path / name, "--labels", tmp_path / "l.txt")
        _one_line_error(proc, name, "PyTorch", "torch.load", "numpy.save")


def test_pytorch_files_named_safetensors_or_parquet_get_the_conversion(tmp_path):
    torch = pytest.importorskip("torch")
    t = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    for name in ("e.safetensors", "e.parquet"):
        torch.save(t, tmp_path / name)
        proc = run("evaluate", tmp_path / name, "--labels", tmp_path / "l.txt")
        _one_line_error(proc, name, "PyTorch", "torch.load", "numpy.save")


def test_legacy_pytorch_files_under_any_name_get_the_conversion(tmp_path, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    import pickle

    def refuse(*_, **__):
        raise AssertionError("a file was unpickled")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    t = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    monkeypatch.chdir(tmp_path)
    np.save(tmp_path / "x.npy", np.zeros((4, 3), np.float32))
    (tmp_path / "l.txt").write_text("0\n0\n1\n1\n")
    for name, argv in (
        ("old.npy", ["old.npy", "--labels", "l.txt"]),
        ("old.npz", ["old.npz"]),
        ("old.safetensors", ["old.safetensors", "--labels", "l.txt"]),
        ("old.parquet", ["old.parquet", "--labels", "l.txt"]),
        ("old.txt", ["x.npy", "--labels", "old.txt"]),
    ):
        torch.save(t, tmp_path / name, _use_new_zipfile_serialization=False)
        assert _main_status(["evaluate", *argv]) == 2, name
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1, err
        assert err.startswith(f"embedeval: error: {name} is a PyTorch file (torch.save)"), err
        assert "torch.load" in err and "numpy.save" in err


def test_bfloat16_tensor_in_the_python_api():
    torch = pytest.importorskip("torch")
    import embedeval as ee

    x = torch.tensor([[0.0], [0.125], [1.0], [1.125]], dtype=torch.bfloat16)
    # classes {0, 1} and {2, 3} are each other's nearest: MAP@R = 1 (every value is exact in
    # bfloat16, so the float32 copy is the same data)
    res = ee.evaluate(x, [0, 0, 1, 1], metrics=["map_at_r"])
    assert res["map_at_r"] == 1.0


def test_a_giant_k_is_one_line(files):
    _one_line_error(run("evaluate", files / "ckpt.npz", "--k", "9223372036854775808"), "--k")
    _one_line_error(run("evaluate", files / "ckpt.npz", "--n-boot", str(2**70)), "--n-boot")


def test_a_closed_stdout_is_not_an_error(files):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "embedeval", "evaluate", str(files / "ckpt.npz")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    proc.stdout.close()  # the reader leaves before the first line, as `| head -0` would
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0, err
    assert err == ""


def test_a_closed_stdout_still_writes_the_outputs(files):
    # A table longer than the pipe buffer (80 rows of ~100 characters): the reader is gone
    # before it is printed, yet --json and --markdown must still be written, with the numbers.
    metrics = ["precision_at_1", "map_at_r", "r_precision", "mrr"]
    names = []
    for i in range(20):
        shutil.copy(files / "ckpt.npz", files / f"checkpoint_number_{i:02d}.npz")
        names.append(str(files / f"checkpoint_number_{i:02d}.npz"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "embedeval", "compare", *names, "--n-boot", "20",
           "--metrics", *metrics, "--json", str(files / "c.json"),
           "--markdown", str(files / "t.md")]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0, err
    assert (files / "t.md").exists(), err
    rows = json.loads((files / "c.json").read_text())["rows"]
    assert len(rows) == 20 * 4
    summary, _ = oracle.summary(X, Y, metrics=metrics)
    for row in rows:
        assert row["value"] == pytest.approx(summary[row["metric"]], rel=1e-12)


def test_warnings_print_as_one_clean_line(tmp_path):
    x, y = _clusters(3, 6)
    np.savez(tmp_path / "e.npz", embeddings=x, labels=y)
    proc = run("evaluate", tmp_path / "e.npz", "--k", "2", "--metrics", "map_at_r")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("embedeval: warning: k=2 is below"), lines
    assert "warnings.warn" not in proc.stderr and "EmbedevalWarning" not in proc.stderr


def test_metrics_before_the_file_does_not_swallow_it(files):
    proc = run("evaluate", "--metrics", "map_at_r", "precision_at_1", files / "ckpt.npz")
    assert proc.returncode == 0, proc.stderr
    summary, _ = oracle.summary(X, Y, metrics=["map_at_r", "precision_at_1"])
    assert f"{summary['map_at_r']:.4f}" in proc.stdout
    proc = run("compare", "--metrics", "map_at_r", files / "ckpt.npz", files / "ckpt.npz",
               "--n-boot", "20")  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_bootstrap_phase_has_its_own_progress(capsys):
    import embedeval as ee

    x, y = _clusters(3, 5)
    ee.evaluate(x, y, metrics=["map_at_r"], ci=0.9, n_boot=300, progress=True)
    err = capsys.readouterr().err
    assert "300/300 bootstrap resamples" in err


def _npz_bytes(tmp_path, compressed=False):
    x, y = _clusters(3, 5)
    p = tmp_path / "src.npz"
    (np.savez_compressed if compressed else np.savez)(p, embeddings=x, labels=y)
    return p.read_bytes(), y


def _giant_npy(path, shape=(10**12,)):
    with open(path, "wb") as fh:
        np.lib.format.write_array_header_1_0(
            fh, {"descr": "<f4", "fortran_order": False, "shape": shape}
        )
        fh.write(b"\0" * 64)


def test_damaged_npz_and_giant_headers_are_one_line(tmp_path):
    import zipfile

    raw, y = _npz_bytes(tmp_path)
    (tmp_path / "trunc.npz").write_bytes(raw[:500])
    crc = bytearray(raw)
    crc[len(raw) // 3] ^= 0xFF  # inside the stored embeddings data: the CRC no longer matches
    (tmp_path / "crc.npz").write_bytes(bytes(crc))
    comp, _ = _npz_bytes(tmp_path, compressed=True)
    bad = bytearray(comp)
    for i in range(60, 120):
        bad[i] ^= 0x5A  # scramble the deflate stream of the first member
    (tmp_path / "deflate.npz").write_bytes(bytes(bad))
    _giant_npy(tmp_path / "giant.npy")
    with zipfile.ZipFile(tmp_path / "giantm.npz", "w") as zf:
        zf.writestr("embeddings.npy", (tmp_path / "giant.npy").read_bytes())
        zf.writestr("labels.npy", b"")
    np.save(tmp_path / "y.npy", y)
    np.savez(tmp_path / "ok.npz", embeddings=_clusters(3, 5)[0], labels=y)
    for args in (
        ["trunc.npz"],
        ["crc.npz"],
        ["deflate.npz"],
        ["giantm.npz"],
        ["giant.npy", "--labels", "y.npy"],
        ["ok.npz", "--labels", "giant.npy"],
        ["ok.npz", "--confidences", "giant.npy"],
    ):
        proc = run("evaluate", *args, cwd=tmp_path)
        _one_line_error(proc, "truncated or damaged")


def _patched_zip(raw, flag_bit=0, method=None):
    """An .npz whose local and central headers claim an encrypted member (``flag_bit=1``) or an
    unknown compression ``method`` (zip layout: flags at +6/+8, method at +8/+10)."""
    import struct

    out = bytearray(raw)
    for sig, flags, meth in ((b"PK\x03\x04", 6, 8), (b"PK\x01\x02", 8, 10)):
        j = out.find(sig)
        while j >= 0:
            out[j + flags] |= flag_bit
            if method is not None:
                out[j + meth : j + meth + 2] = struct.pack("<H", method)
            j = out.find(sig, j + 1)
    return bytes(out)


def test_a_cut_npy_header_or_an_odd_zip_member_is_one_line(tmp_path, monkeypatch, capsys):
    raw, y = _npz_bytes(tmp_path)
    np.save(tmp_path / "y.npy", y)
    np.save(tmp_path / "x.npy", _clusters(3, 5)[0])
    header = bytearray((tmp_path / "x.npy").read_bytes())
    cut = header.index(b"(15, 8)") + 3  # "'shape': (15" then NUL bytes: the tokenizer fails
    header[cut : cut + 8] = bytes(8)
    (tmp_path / "hdr.npy").write_bytes(bytes(header))
    (tmp_path / "enc.npz").write_bytes(_patched_zip(raw, flag_bit=1))
    (tmp_path / "meth.npz").write_bytes(_patched_zip(raw, method=99))
    monkeypatch.chdir(tmp_path)
    for args, name in (
        (["hdr.npy", "--labels", "y.npy"], "hdr.npy"),
        (["x.npy", "--labels", "hdr.npy"], "hdr.npy"),
        (["enc.npz"], "enc.npz"),
        (["meth.npz"], "meth.npz"),
    ):
        assert _main_status(["evaluate", *args]) == 2, args
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1, err
        assert err.startswith(f"embedeval: error: {name} cannot be read: the file is truncated")


def test_outputs_never_overwrite_inputs_or_each_other(files):
    labels = files / "l.csv"
    labels.write_text("".join(f"{v}\n" for v in Y))
    before = labels.read_text()
    proc = run("evaluate", files / "q.npy", "--labels", labels, "--per-class", labels)
    _one_line_error(proc, "l.csv", "input")
    assert labels.read_text() == before
    proc = run("evaluate", files / "ckpt.npz", "--per-class", files / "same.csv",
               "--per-query", files / "same.csv")  # fmt: skip
    _one_line_error(proc, "same.csv", "same file")
    assert not (files / "same.csv").exists()
    os.link(labels, files / "hard.csv")  # another name for the labels file
    proc = run("evaluate", files / "q.npy", "--labels", labels, "--per-query", files / "hard.csv")
    _one_line_error(proc, "hard.csv", "input")
    assert labels.read_text() == before


def test_plots_folder_for_your_own_model(tmp_path):
    import matplotlib.image as mpimg

    x, y = _clusters(40, 5, seed=3, spread=1.5)
    rng = np.random.default_rng(0)
    conf = rng.random(y.size)
    np.savez(tmp_path / "e.npz", embeddings=x, labels=y, confidences=conf)
    proc = run("evaluate", tmp_path / "e.npz", "--plots", tmp_path / "P")
    assert proc.returncode == 0, proc.stderr
    names = sorted(p.name for p in (tmp_path / "P").iterdir())
    assert names == [
        "confidence_recall.png",
        "distance_histograms.png",
        "error_reject_curve.png",
        "k_sweep.png",
        "per_class.png",
    ]
    # 6 x 4.2 inches at 200 dpi
    assert mpimg.imread(tmp_path / "P" / "k_sweep.png").shape[:2] == (840, 1200)
    np.savez(tmp_path / "n.npz", embeddings=x, labels=y)
    proc = run("evaluate", tmp_path / "n.npz", "--plots", tmp_path / "S", "--plot-format", "svg")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "S").iterdir()) == [
        "distance_histograms.svg",
        "k_sweep.svg",
        "per_class.svg",
    ]
    assert (tmp_path / "S" / "k_sweep.svg").read_text().lstrip().startswith("<?xml")


def test_distance_histograms_count_each_item_once_with_ref_includes_query():
    # The queries are the first gallery rows: the sampled positive pairs must be pairs of
    # distinct gallery items, never a query with its own copy (a false spike at distance 0).
    from scipy.spatial.distance import cdist

    import embedeval as ee
    from embedeval.report.run_figures import _pair_distances

    rng = np.random.default_rng(4)
    x = rng.standard_normal((60, 3)).astype(np.float32)
    y = np.repeat(np.arange(6), 10)
    inputs = dict(
        query=x[:20], query_labels=y[:20], reference=x, reference_labels=y, ref_includes_query=True
    )
    res = ee.evaluate(**inputs, progress=False)
    pos, _ = _pair_distances(res, inputs)
    d = cdist(x.astype(np.float64), x.astype(np.float64))
    same = (y[:, None] == y[None, :]) & ~np.eye(60, dtype=bool)
    allowed = np.unique(d[same])  # every distance between two distinct same-class items
    assert allowed.min() > 0.01
    assert pos.size > 0
    assert np.abs(pos[:, None] - allowed[None, :]).min(axis=1).max() < 1e-5


def test_plots_with_one_constant_sigma(tmp_path):
    # A model that outputs the same sigma for every query: the figures are still drawn.
    x, y = _clusters(10, 4, seed=1, spread=1.5)
    np.savez(tmp_path / "e.npz", embeddings=x, labels=y, sigmas=np.ones(y.size))
    proc = run("evaluate", tmp_path / "e.npz", "--plots", tmp_path / "P")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "P" / "confidence_recall.png").exists()


def test_per_class_markdown_keeps_a_pipe_inside_a_label_in_one_cell(tmp_path):
    import re

    x = np.array([[0.0], [1.0], [5.0], [6.0]], dtype=np.float32)
    np.savez(tmp_path / "e.npz", embeddings=x, labels=np.array(["a|b", "a|b", "c", "c"]))
    proc = run("evaluate", tmp_path / "e.npz", "--metrics", "precision_at_1",
               "--per-class", tmp_path / "c.md")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = (tmp_path / "c.md").read_text().splitlines()
    # cells split on unescaped pipes (GitHub's rule); each class's nearest is its twin: P@1 = 1
    rows = [[c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", ln)[1:-1]]
            for ln in lines]  # fmt: skip
    assert rows[0] == ["label", "n_queries", "precision_at_1"]
    assert rows[2:] == [["a|b", "2", "1.000000"], ["c", "2", "1.000000"]]


def test_metrics_help_names_every_metric():
    # the metric keys of the README's table (recall_at_{k} / precision_at_{k} spelt with K)
    keys = "precision_at_1 r_precision map_at_r map mrr minp recall_at_K precision_at_K nmi ami"
    for command in ("evaluate", "compare"):
        proc = run(command, "--help")
        assert proc.returncode == 0, proc.stderr
        words = " ".join(proc.stdout.split()).split()
        for key in keys.split():
            assert key in words, (command, key)


def test_per_class_plot_shows_the_worst_30_by_default():
    from embedeval.plots import plot_per_class

    vals = np.linspace(1.0, 0.0, 2000)
    fig = plot_per_class(list(range(2000)), vals)
    ticks = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert ticks == [str(i) for i in range(1999, 1969, -1)]  # the 30 lowest, worst first
    assert fig.get_size_inches()[1] < 12
    assert len(plot_per_class(list(range(50)), vals[:50], top=None).axes[0].get_yticks()) == 50


def test_distance_histogram_samples_positives_by_class():
    from embedeval.report.datasets import positive_negative_distances

    # 10,000 classes of 2: a uniform pair shares a class with probability 1/19,999
    rng = np.random.default_rng(0)
    x = rng.standard_normal((20_000, 4)).astype(np.float32)
    y = np.repeat(np.arange(10_000), 2)
    pos, neg = positive_negative_distances(x, y, max_pairs=5000, seed=0)
    assert pos.size == 5000 and neg.size == 5000
    # every positive is the distance of a class's one pair (brute force per class)
    pair = np.linalg.norm(x[0::2].astype(np.float64) - x[1::2], axis=1)
    assert np.isin(np.round(pos, 6), np.round(pair, 6)).all()


def test_json_provenance_and_per_query_columns(tmp_path):
    import hashlib

    x, y = _clusters(4, 5, seed=2, spread=1.5)
    groups = np.arange(y.size) % 3
    conf = np.linspace(0.1, 0.9, y.size)
    np.savez(tmp_path / "e.npz", embeddings=x, labels=y, groups=groups, confidences=conf)
    proc = run("evaluate", tmp_path / "e.npz", "--metrics", "precision_at_1", "map_at_r",
               "--json", tmp_path / "o.json", "--per-query", tmp_path / "pq.csv",
               "--distance", "cosine")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    prov = json.loads((tmp_path / "o.json").read_text())["provenance"]
    import embedeval

    assert prov["embedeval_version"] == embedeval.__version__ and prov["created"].startswith("20")
    (inp,) = prov["inputs"]
    assert inp["name"] == "e.npz"
    assert inp["sha256"] == hashlib.sha256((tmp_path / "e.npz").read_bytes()).hexdigest()
    # every option, defaults included; n_boot only with --ci (nothing was resampled)
    assert prov["options"]["distance"] == "cosine" and prov["options"]["n_boot"] is None
    assert prov["options"]["seed"] == 0
    rows = (tmp_path / "pq.csv").read_text().splitlines()
    assert rows[0] == (
        "query,label,confidence,top1_index,top1_label,top1_distance,precision_at_1,map_at_r"
    )
    # brute force: cosine similarity, own row and own group excluded, ties by lower index
    xn = x.astype(np.float64) / np.linalg.norm(x, axis=1, keepdims=True)
    for i, row in enumerate(rows[1:]):
        cells = row.split(",")
        best, best_sim = -1, -np.inf
        for j in range(y.size):
            if j == i or groups[j] == groups[i]:
                continue
            sim = float(xn[i] @ xn[j])
            if sim > best_sim + 1e-6:
                best, best_sim = j, sim
        assert int(cells[0]) == i and int(cells[1]) == y[i]
        assert float(cells[2]) == pytest.approx(conf[i])
        assert int(cells[3]) == best and int(cells[4]) == y[best]
        assert float(cells[5]) == pytest.approx(best_sim, abs=1e-5)
        assert float(cells[6]) == float(y[best] == y[i])


def test_result_behaves_like_a_dict():
    import embedeval as ee

    res = ee.evaluate(X, Y, metrics=["map_at_r", "precision_at_1"])
    assert res.keys() == ["map_at_r", "precision_at_1"]
    d = dict(res)
    assert d == {"map_at_r": res["map_at_r"], "precision_at_1": res["precision_at_1"]}
    assert {**res} == d and len(res) == 2 and list(res) == res.keys()
    assert "mean_average_precision_at_r" in res
    assert res["mean_average_precision_at_r"] == res["map_at_r"]
    assert "map" not in res and res.get("map") is None
    # oracle: 5 points at 0, 1, 2, 10, 11, labels 0 1 0 1 1 -> P@1 hits for 10 and 11 only
    assert d["precision_at_1"] == pytest.approx(2 / 5)


def test_approximate_results_say_so_and_warn_when_biased():
    import embedeval as ee
    from embedeval.utils.errors import EmbedevalWarning

    rng = np.random.default_rng(0)
    x, y = _clusters(50, 40, dim=16, seed=0, spread=1.5)
    x = x + 0.01 * rng.standard_normal(x.shape).astype(np.float32)
    with pytest.warns(EmbedevalWarning, match="beyond sampling noise"):
        res = ee.evaluate(x, y, metrics=["map_at_r"], index="IVF64,Flat",
                          index_params={"nprobe": 1}, exact_sample=500)  # fmt: skip
    text = repr(res)
    assert "APPROXIMATE" in text and "kNN recall" in text
    a = res.approximation["metrics"]["map_at_r"]
    lo, hi = a["difference_ci"]
    assert hi < 0 or lo > 0
    assert f"{a['difference']:+.4f}" in res.table()


@pytest.mark.parametrize("stored", ["labels file", "npz key"])
def test_evaluate_multi_label_indicators(tmp_path, stored):
    # points 0, 1, 3, 7 on a line with labels {A}, {B}, {A, B}, {A} (indicator columns A, B);
    # relevant = sharing a label. Leave-one-out, by hand: AP 7/12, 1/2, 1, 5/6 -> map 35/48;
    # nearest neighbours 1, 0, 1, 2 -> P@1 = 2/4
    x = np.float32([[0, 0], [1, 0], [3, 0], [7, 0]])
    y = np.array([[1, 0], [0, 1], [1, 1], [1, 0]], dtype=np.int8)
    if stored == "npz key":
        np.savez(tmp_path / "xy.npz", embeddings=x, labels=y)
        args = ["xy.npz"]
    else:
        np.save(tmp_path / "x.npy", x)
        np.save(tmp_path / "y.npy", y)
        args = ["x.npy", "--labels", "y.npy"]
    proc = run(
        "evaluate", *args, "--metrics", "map", "precision_at_1", "--json", "out.json",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = _json(tmp_path / "out.json")["metrics"]
    assert got["map"] == pytest.approx(35 / 48, abs=1e-12)
    assert got["precision_at_1"] == 0.5
    np.savez(tmp_path / "short.npz", embeddings=x, labels=y[:3])  # 3 indicator rows for 4
    _one_line_error(run("evaluate", "short.npz", cwd=tmp_path), "3 rows", "4 rows of embeddings")
    np.save(tmp_path / "bad.npy", np.array([[2, 0], [0, 1], [1, 1], [1, 0]]))
    bad = run("evaluate", "x.npy" if stored != "npz key" else "xy.npz", "--labels", "bad.npy",
              cwd=tmp_path)  # fmt: skip
    _one_line_error(bad, "one column", "0/1 indicators")
    apart = np.array([[1, 0], [0, 1], [0, 0], [0, 0]])
    np.savez(tmp_path / "apart.npz", embeddings=x, labels=apart)
    lone = run("evaluate", "apart.npz", cwd=tmp_path)  # no two rows share a label
    _one_line_error(lone, "no other reference sharing a label", "0/1 label indicators per item")


def _main_status(argv):
    from embedeval.cli import main

    try:  # in-process: argparse's own refusals end in SystemExit, the others return
        return main(list(map(str, argv)))
    except SystemExit as stop:
        return stop.code


def test_report_captions_are_split_at_newlines_only(files, monkeypatch, capsys):
    # A caption may hold characters str.splitlines() also breaks at (form feed, U+0085, U+2028,
    # U+001C); a captions file has one caption per newline, as a labels file has one label.
    monkeypatch.chdir(files)
    captions = ["page\x0cbreak", "next\x85line", "line\u2028separator", "fs\x1c", "plain"]
    n = len(X)
    rows = [captions[i % len(captions)] + f" {i}" for i in range(n)]
    (files / "texts.txt").write_text("\r\n".join(rows) + "\r\n", encoding="utf-8")
    args = ["evaluate", "ckpt.npz", "--report", "r.html", "--texts", "texts.txt", "--quiet"]
    status = _main_status([*args, "--gallery", n])
    assert status == 0, capsys.readouterr().err
    page = (files / "r.html").read_text(encoding="utf-8")
    shown = re.findall(r'<span class="cap">([^<]*)</span>', page)
    assert shown and set(map(html.unescape, shown)) <= set(rows)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--report", "r.html", "--gallery-metric", "nope"], ["--gallery-metric nope", "map_at_r"]),
        (
            ["--report", "r.html", "--metrics", "map", "--gallery-metric", "mrr"],
            ["--gallery-metric mrr", "choose one of map,"],
        ),
        (["--gallery-metric", "map_at_r"], ["--gallery-metric", "--report"]),
        (["--gallery", "3"], ["--gallery ", "--report"]),
        (["--gallery", "0"], ["--gallery ", "--report"]),
        (["--gallery-k", "3"], ["--gallery-k", "--report"]),
        (["--thumbnail", "32"], ["--thumbnail", "--report"]),
        (["--plot-format", "svg"], ["--plot-format", "--plots"]),
        (["--report", "r.html", "--gallery", "-1"], ["--gallery", "0 or more", "'-1'"]),
        (["--report", "r.html", "--thumbnail", "4"], ["--thumbnail", "8 to 512"]),
        (
            ["--report", "r.html", "--images", "one.txt"],
            ["--images one.txt has 1 lines", "5 query"],
        ),
        (
            ["--report", "r.html", "--reference-texts", "one.txt"],
            ["--reference-texts one.txt has 1 lines", "5 reference rows"],
        ),
        (["--report", "r.html", "--texts", "latin1.txt"], ["--texts latin1.txt", "not UTF-8"]),
        (
            ["--report", "r.html", "--reference-images", "absent.txt"],
            ["--reference-images absent.txt does not exist"],
        ),
    ],
)
def test_report_options_are_refused_before_any_evaluation_or_output(
    files, monkeypatch, capsys, args, needles
):
    import embedeval.evaluation.evaluate as evaluation

    def never(*_, **__):
        raise AssertionError("evaluated before the options were checked")

    monkeypatch.setattr(evaluation, "evaluate", never)
    monkeypatch.chdir(files)
    (files / "out.json").write_text("keep me")
    (files / "one.txt").write_text("a.png\n")
    (files / "latin1.txt").write_bytes(b"caf\xe9\n" * 5)
    status = _main_status(["evaluate", "ckpt.npz", "--json", "out.json", *args])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("embedeval: error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert (files / "out.json").read_text() == "keep me"
    assert not (files / "r.html").exists()


def test_gallery_metric_of_a_data_decided_depth_is_checked_before_any_output(files, capsys):
    # Y = 0 1 0 1 1: the largest class holds 3 rows, so leave-one-out R_q is at most 2 and
    # --k max_bin_count makes the default set end in recall_at_2, not recall_at_7.
    out = files / "out.json"
    out.write_text("keep me")
    argv = ["evaluate", files / "ckpt.npz", "--k", "max_bin_count", "--json", out]
    status = _main_status([*argv, "--report", files / "r.html", "--gallery-metric", "recall_at_7"])
    stdout, err = capsys.readouterr()
    assert status == 2 and stdout == ""
    assert err.startswith("embedeval: error: --gallery-metric recall_at_7") and "recall_at_2" in err
    assert out.read_text() == "keep me" and not (files / "r.html").exists()
    good = [*argv, "--report", files / "r.html", "--gallery-metric", "recall_at_2", "--quiet"]
    assert _main_status(good) == 0
    assert (files / "r.html").exists()


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--confidence-metrics", "bogus"], ["--confidence-metrics 'bogus'", "aurc_map_at_r"]),
        (["--confidence-metrics", "r_auroc"], ["needs confidences", "ckpt.npz has none"]),
    ],
)
def test_compare_confidence_metrics_are_checked_before_any_evaluation(
    files, monkeypatch, capsys, extra, needles
):
    import embedeval.evaluation.evaluate as evaluation

    def never(*_, **__):
        raise AssertionError("evaluated before the options were checked")

    monkeypatch.setattr(evaluation, "evaluate", never)
    status = _main_status(["compare", files / "ckpt.npz", files / "ckpt.npz", *extra])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("embedeval: error: ")
    for n in needles:
        assert n in err, (n, err)


def test_label_text_files_big_integers_a_bom_and_an_empty_file(files, monkeypatch, capsys):
    # X = 0 1 2 10 11: with classes {0, 2} and {1, 10, 11} P@1 is 2/5 (rows 3 and 4 only);
    # the two ids differ only past int64, and the first line carries a byte-order mark.
    monkeypatch.chdir(files)
    big = ["18446744073709551616", "18446744073709551617"]
    lines = [big[0], big[1], big[0], big[1], big[1]]
    (files / "big.txt").write_text("\ufeff" + "\n".join(lines) + "\n", encoding="utf-8")
    argv = ["evaluate", "q.npy", "--labels", "big.txt", "--metrics", "precision_at_1"]
    assert _main_status([*argv, "--per-class", "pc.csv"]) == 0
    assert (files / "pc.csv").read_text().splitlines()[1:] == [
        f"{big[0]},2,0.000000",
        f"{big[1]},3,0.666667",
    ]
    capsys.readouterr()
    (files / "empty.txt").write_text("")
    assert _main_status(["evaluate", "q.npy", "--labels", "empty.txt"]) == 2
    out, err = capsys.readouterr()
    assert (
        out == ""
        and err
        == "embedeval: error: empty.txt is empty; a labels file holds one "
        "value per line, one line per embedding row.\n"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["evaluate", "ckpt.npz", "--n-boot", "50"],
            "--n-boot sets the bootstrap of --ci, and without --ci nothing is resampled; add "
            "--ci 0.95, or drop --n-boot.",
        ),
        (
            ["evaluate", "ckpt.npz", "--seed", "3"],
            "--seed sets the bootstrap of --ci, and without --ci nothing is resampled; add "
            "--ci 0.95, or drop --seed.",
        ),
        (
            ["evaluate", "ckpt.npz", "--lower-is-confident"],
            "--lower-is-confident says how to read confidences, and ckpt.npz has none; pass "
            "--confidences FILE (or store 'confidences' / 'sigmas' in the .npz), or drop it.",
        ),
        (
            ["compare", "ckpt.npz", "ckpt.npz", "--lower-is-confident"],
            "--lower-is-confident says how to read confidences, and ckpt.npz has none; pass "
            "--confidences FILE (or store 'confidences' / 'sigmas' in the .npz), or drop it.",
        ),
    ],
)
def test_options_the_run_would_ignore_are_refused(files, monkeypatch, capsys, argv, message):
    import embedeval.evaluation.evaluate as evaluation

    def never(*_, **__):
        raise AssertionError("evaluated although an option would be ignored")

    monkeypatch.setattr(evaluation, "evaluate", never)
    monkeypatch.chdir(files)
    assert _main_status(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"embedeval: error: {message}\n"


@pytest.mark.parametrize(
    ("extra", "start"),
    [
        (["--labels", "ynan.npy"], "--labels ynan.npy has 1 NaN or infinite label(s), first at "
         "index 2; every item needs a class id"),
        (["--labels", "ql.npy", "--reference", "q.npy", "--reference-labels", "yhalf.npy"],
         "--reference-labels yhalf.npy has 1 non-integer float label(s), first at index 1"),
        (["--labels", "ql.npy", "--confidences", "letters.npy"],
         "--confidences letters.npy must be numeric; got dtype <U1. Pass one number per item."),
        (["--labels", "ql.npy", "--groups", "gnan.npy"],
         "--groups gnan.npy has 1 NaN or infinite label(s), first at index 0"),
        (["--labels", "ql.npy", "--memory-budget", "1K"],
         "argument --memory-budget: must be at least 1M (e.g. 256M); got '1K'"),
        (["--labels", "ql.npy", "--ci", "0.9", "--seed", "-1"],
         "argument --seed: must be a whole number, 0 or more; got '-1'"),
        (["--labels", "ql.npy", "--reference", "q.npy", "--reference-labels", "ql.npy",
          "--reference-groups", "g.npy"],
         "--reference-groups g.npy gives group ids but the queries have none; pass --groups FILE"),
        (["--labels", "ql.npy", "--reference", "q.npy", "--reference-labels", "ql.npy",
          "--groups", "g.npy"],
         "--groups g.npy gives group ids but the gallery has none; pass --reference-groups FILE"),
    ],
)  # fmt: skip
def test_errors_name_the_flag_and_file_not_the_python_argument(files, monkeypatch, capsys, extra,
                                                               start):  # fmt: skip
    monkeypatch.chdir(files)
    np.save(files / "ynan.npy", np.array([0.0, 1.0, np.nan, 1.0, 1.0]))
    np.save(files / "yhalf.npy", np.array([0.0, 1.5, 0.0, 1.0, 1.0]))
    np.save(files / "letters.npy", np.array(list("abcde")))
    np.save(files / "gnan.npy", np.array([np.nan, 1.0, 0.0, 1.0, 1.0]))
    np.save(files / "g.npy", np.arange(5))
    assert _main_status(["evaluate", "q.npy", *extra]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"embedeval: error: {start}"), err


@pytest.mark.parametrize("command", ["evaluate", "compare", "retrieve", "figures", "demo"])
def test_help_examples_are_one_command_per_line_or_continued(command):
    # an example split over lines must end each but the last with a backslash: a lone "\" in
    # the epilog's source joins the lines into one with a run of spaces before an option
    import re

    from embedeval.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices[command]
    examples = [ln for ln in sub.format_help().splitlines() if ln.startswith("  embedeval ")]
    for line in examples:
        assert not re.search(r"\S {3,}--", line), line


def test_report_texts_are_split_at_line_ends_only(tmp_path, capsys):
    from embedeval.cli import main

    np.savez(tmp_path / "e.npz", embeddings=np.eye(4), labels=[0, 0, 1, 1])
    # four passages, one per line; two hold characters str.splitlines would split at
    (tmp_path / "t.txt").write_text("one\u2028two\nthree\nfour\x0cfive\nsix\n", encoding="utf-8")
    code = main(
        [
            "evaluate", str(tmp_path / "e.npz"), "--quiet", "--report", str(tmp_path / "r.html"),
            "--texts", str(tmp_path / "t.txt"),
        ]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err  # not "--texts ... has 6 lines but there are 4 query rows"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_report_row_file_that_is_a_pipe_is_not_called_missing(tmp_path, capsys):
    from embedeval.cli import main

    np.savez(tmp_path / "e.npz", embeddings=np.eye(4), labels=[0, 0, 1, 1])
    os.mkfifo(tmp_path / "t.txt")
    code = main(
        [
            "evaluate", str(tmp_path / "e.npz"), "--report", str(tmp_path / "r.html"),
            "--texts", str(tmp_path / "t.txt"),
        ]
    )  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "--texts" in err[0] and "t.txt is not a regular file (a pipe" in err[0]
