"""The HTML report (``to_html``, ``--report``): self-contained, agreeing with the numbers and with
the exact search, robust to broken images, and rendered by a real browser."""

from __future__ import annotations

import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import warnings
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

import embedeval as ee
from embedeval.utils.errors import EmbedevalWarning, InputError
from tests import oracle

ROOT = Path(__file__).resolve().parents[1]

# Integer coordinates: duplicated rows and exactly tied distances, four classes.
_RNG = np.random.default_rng(7)
X = _RNG.integers(0, 4, size=(36, 2)).astype(np.float32)
Y = np.arange(36) % 4
CONF = np.round(_RNG.random(36), 3)


# ------------------------------------------------------------------------------ page parsing
class _Page(HTMLParser):
    """Every tag with its attributes, the text, and the gallery rows with their cells."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.rows: dict[str, list[dict]] = {}
        self._table: str | None = None
        self._row: dict | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "table":
            self._table = a.get("id")
        if tag == "tr" and "data-query" in a:
            self._row = {"query": int(a["data-query"]), "cells": [], "imgs": 0, "ph": 0}
            self.rows.setdefault(self._table, []).append(self._row)
        if self._row is not None:
            if tag == "td" and "data-index" in a:
                self._row["cells"].append(a)
            if tag == "td" and "data-first-relevant" in a:
                v = a["data-first-relevant"]
                self._row["first"] = int(v) if v else None
            if tag == "img":
                self._row["imgs"] += 1
            if tag == "span" and a.get("class") == "ph":
                self._row["ph"] += 1

    def handle_endtag(self, tag):
        if tag == "tr":
            self._row = None
        if tag == "table":
            self._table = None

    def handle_data(self, data):
        self.text.append(data)


def parse(path) -> _Page:
    page = _Page()
    page.feed(Path(path).read_text(encoding="utf-8"))
    return page


def _cells(path, table_id, column):
    """The ``data-v`` of one column of a table, row by row."""

    class Cells(HTMLParser):
        def __init__(self):
            super().__init__()
            self.inside, self.col, self.out = False, -1, []

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag == "table":
                self.inside = a.get("id") == table_id
            if self.inside and tag == "tr":
                self.col = -1
            if self.inside and tag == "td":
                self.col += 1
                if self.col == column:
                    self.out.append(a.get("data-v"))

    p = Cells()
    p.feed(Path(path).read_text(encoding="utf-8"))
    return p.out


def assert_offline(path) -> None:
    """No reference to any network address: no external src/href, no http(s) anywhere."""
    text = Path(path).read_text(encoding="utf-8")
    assert "http://" not in text and "https://" not in text and "//cdn" not in text
    page = parse(path)
    for tag, attrs in page.tags:
        for key in ("src", "href"):
            value = attrs.get(key)
            if value is not None:
                assert value.startswith("data:") or value.startswith("#"), (tag, value[:40])
        assert tag not in ("link", "iframe", "object", "embed"), tag
        if tag == "script":
            assert "src" not in attrs


# ------------------------------------------------------------------------------ brute force
def brute_ranking(q, x, y, *, reference=None, ref_labels=None, groups=None, ref_groups=None):
    """Counted references of query ``q`` in rank order: float64 distances, ties by index, the
    own row (leave-one-out) and same-group references removed."""
    loo = reference is None
    r = x if loo else reference
    rl = y if loo else ref_labels
    rg = groups if loo else ref_groups
    d = np.sqrt(((r.astype(np.float64) - x[q]) ** 2).sum(axis=1))
    keep = np.ones(len(r), dtype=bool)
    if loo:
        keep[q] = False
    if groups is not None:
        keep &= rg != groups[q]
    j = np.flatnonzero(keep)
    j = j[np.lexsort((j, d[j]))]
    rel = [bool(rl[i] == y[q]) for i in j]
    return j.tolist(), d[j].tolist(), rel


def first_relevant(rel):
    return next((n + 1 for n, r in enumerate(rel) if r), None)


def brute_map_at_r(rel):
    r = sum(rel)
    if r == 0:
        return math.nan
    hits, total = 0, 0.0
    for n, v in enumerate(rel[:r]):
        if v:
            hits += 1
            total += hits / (n + 1)
    return total / r


# ------------------------------------------------------------------------------ Python API
def test_gallery_rows_are_the_exact_neighbours_of_the_worst_queries(tmp_path):
    res = ee.evaluate(X, Y, metrics=["map_at_r", "precision_at_1"], progress=False)
    out = res.to_html(tmp_path / "run.html", query=X, gallery=6, gallery_k=4, figures=False)
    page = parse(out)
    rows = page.rows["gallery-worst"]
    # The worst six by MAP@R from the definition, equal values by query index.
    values = [brute_map_at_r(brute_ranking(q, X, Y)[2]) for q in range(len(X))]
    expected = sorted(range(len(X)), key=lambda q: (values[q], q))[:6]
    assert [r["query"] for r in rows] == expected
    _, idx = ee.neighbors(X, 4)
    for row in rows:
        q = row["query"]
        got = [int(c["data-index"]) for c in row["cells"]]
        assert got == idx[q].tolist()
        j, _, rel = brute_ranking(q, X, Y)
        assert got == j[:4]
        assert [c["data-relevant"] == "1" for c in row["cells"]] == rel[:4]
        assert [int(c["data-rank"]) for c in row["cells"]] == [1, 2, 3, 4]
        assert row["first"] == first_relevant(rel)
    assert_offline(out)


def test_gallery_of_a_lower_is_better_custom_metric_shows_its_highest_values(tmp_path):
    # The rank of the first relevant reference: a larger rank is a worse query.
    def first_rank(relevant, n_relevant):
        return relevant.argmax(axis=1) + 1.0

    metric = ee.RetrievalMetric(first_rank, depth="all", higher_is_better=False)
    res = ee.evaluate(X, Y, metrics=[], custom_metrics={"first_rank": metric}, progress=False)
    assert res.settings["lower_is_better"] == ["first_rank"]
    out = res.to_html(tmp_path / "rank.html", query=X, gallery=6, gallery_k=2, figures=False)
    ranks = [first_relevant(brute_ranking(q, X, Y)[2]) for q in range(len(X))]
    expected = sorted(range(len(X)), key=lambda q: (-ranks[q], q))[:6]
    assert [r["query"] for r in parse(out).rows["gallery-worst"]] == expected
    assert "The 6 queries with the highest first_rank" in out.read_text(encoding="utf-8")
    # The per-class table, worst first: class mean ranks from the highest down.
    means = [np.mean([ranks[q] for q in range(len(X)) if Y[q] == c]) for c in range(4)]
    shown = [float(v) for v in _cells(out, "per-class", 2)]
    assert shown == pytest.approx(sorted(means, reverse=True), rel=1e-12)


def test_per_class_figure_of_a_lower_is_better_custom_metric_shows_its_highest_first():
    from embedeval.evaluation.figures import run_figures

    def first_rank(relevant, n_relevant):
        return relevant.argmax(axis=1) + 1.0

    metric = ee.RetrievalMetric(first_rank, depth="all", higher_is_better=False)
    res = ee.evaluate(X, Y, metrics=[], custom_metrics={"first_rank": metric}, progress=False)
    ax = run_figures(res, None)["per_class"].axes[0]
    ranks = [first_relevant(brute_ranking(q, X, Y)[2]) for q in range(len(X))]
    means = {c: np.mean([ranks[q] for q in range(len(X)) if Y[q] == c]) for c in range(4)}
    worst_first = sorted(means, key=lambda c: -means[c])
    assert [t.get_text() for t in ax.get_yticklabels()] == [str(c) for c in worst_first]
    widths = [p.get_width() for p in ax.patches]
    assert widths == pytest.approx([means[c] for c in worst_first], rel=1e-12)
    assert "lower is better" in ax.get_xlabel()


@pytest.mark.parametrize(
    ("rows", "needle"),
    [
        (np.array([2**64 - 1], dtype=np.uint64), "rows holds 18446744073709551615, above"),
        ([-1], "rows holds -1, not a query row"),
        ([36], "rows holds 36, not a query row"),
        ([1.0], "rows must hold integer query positions"),
        ([2**70], f"rows holds the integer {2**70}, beyond 64-bit"),
    ],
)
def test_gallery_rows_refuses_positions_outside_the_queries(rows, needle):
    from embedeval.evaluation.gallery import gallery_rows

    with pytest.raises(InputError, match=needle):
        gallery_rows(rows, 2, query=X, query_labels=Y)
    # within range, any integer dtype reads as given
    got = gallery_rows(np.array([35, 0], dtype=np.uint64), 1, query=X, query_labels=Y)
    assert [r.query for r in got] == [35, 0]
    assert [r.indices.tolist() for r in got] == [brute_ranking(q, X, Y)[0][:1] for q in (35, 0)]


@pytest.mark.parametrize("rows", [[], np.array([], dtype=np.int64), np.zeros(0, np.uint64)])
def test_gallery_rows_of_no_rows_are_none(rows):
    from embedeval.evaluation.gallery import gallery_rows

    assert gallery_rows(rows, 2, query=X, query_labels=Y) == []
    # the other arguments are still checked
    with pytest.raises(InputError, match="k must be >= 1"):
        gallery_rows(rows, 0, query=X, query_labels=Y)
    with pytest.raises(InputError, match="query_labels"):
        gallery_rows(rows, 2, query=X, query_labels=Y[:3])


def test_gallery_with_a_reference_set_and_groups_skips_excluded_references(tmp_path):
    xq, yq = X[:12], Y[:12]
    xb, yb = X[8:], Y[8:]
    gq, gb = np.arange(12) % 3, np.arange(28) % 3
    res = ee.evaluate(
        xq, yq, xb, yb, query_groups=gq, reference_groups=gb, metrics=["mrr"], progress=False
    )
    out = res.to_html(
        tmp_path / "g.html",
        query=xq,
        reference=xb,
        reference_labels=yb,
        query_groups=gq,
        reference_groups=gb,
        gallery=12,
        gallery_k=3,
        figures=False,
    )
    rows = parse(out).rows["gallery-worst"]
    assert len(rows) == 12
    for row in rows:
        q = row["query"]
        j, _, rel = brute_ranking(q, xq, yq, reference=xb, ref_labels=yb, groups=gq, ref_groups=gb)
        assert [int(c["data-index"]) for c in row["cells"]] == j[:3]
        assert all(gb[int(c["data-index"])] != gq[q] for c in row["cells"])
        assert row["first"] == first_relevant(rel)
    _, i = ee.neighbors(xq, 3, xb, query_groups=gq, reference_groups=gb)
    for row in rows:
        assert [int(c["data-index"]) for c in row["cells"]] == i[row["query"]].tolist()


def test_first_relevant_rank_beyond_k_is_found_by_a_deeper_search(tmp_path):
    # Query 0's only same-class reference is the farthest of 40.
    x = np.arange(41, dtype=np.float32)[:, None]
    y = np.r_[0, np.ones(39, dtype=int), 0]
    res = ee.evaluate(x, y, metrics=["mrr"], progress=False)
    rows = parse(res.to_html(tmp_path / "d.html", query=x, gallery=1, gallery_k=2, figures=False))
    row = rows.rows["gallery-worst"][0]
    assert row["query"] in (0, 40) and row["first"] == 40


def test_most_confident_errors_with_confidences(tmp_path):
    res = ee.evaluate(
        X, Y, confidences=CONF, metrics=["precision_at_1", "map_at_r"], progress=False
    )
    out = res.to_html(tmp_path / "c.html", query=X, gallery=5, gallery_k=2)
    page = parse(out)
    errors = [q for q in range(len(X)) if not brute_ranking(q, X, Y)[2][0]]
    expected = sorted(errors, key=lambda q: (-CONF[q], q))[:5]
    assert [r["query"] for r in page.rows["gallery-confident"]] == expected
    ids = {a.get("id") for _, a in page.tags}
    assert {"fig-error_reject_curve", "fig-confidence_recall", "fig-reliability"} <= ids
    assert {"fig-per_class", "fig-distance_histograms", "fig-k_sweep"} <= ids
    assert "confidence" in ids
    assert_offline(out)


def _images(folder, n, broken):
    from PIL import Image

    paths = []
    for i in range(n):
        p = folder / f"{i}.png"
        if i in broken:
            p.write_bytes(b"not an image")  # unreadable, and also some missing files below
        else:
            Image.new("RGB", (40 + i, 30), (10 * i % 255, 80, 160)).save(p)
        paths.append(str(p))
    return paths


def test_broken_images_become_placeholders_and_one_warning(tmp_path):
    paths = _images(tmp_path, len(X), broken={1, 2})
    paths[3] = str(tmp_path / "missing.png")
    res = ee.evaluate(X, Y, metrics=["map_at_r"], progress=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = res.to_html(
            tmp_path / "i.html", query=X, images=paths, gallery=len(X), gallery_k=3, figures=False
        )
    ours = [w for w in caught if issubclass(w.category, EmbedevalWarning)]
    assert len(ours) == 1 and "placeholder" in str(ours[0].message)
    rows = parse(out).rows["gallery-worst"]
    bad = {1, 2, 3}
    for row in rows:
        shown = [row["query"], *(int(c["data-index"]) for c in row["cells"])]
        assert row["ph"] == sum(s in bad for s in shown)
        assert row["imgs"] == sum(s not in bad for s in shown)
    assert_offline(out)


def test_texts_are_captions_and_escaped(tmp_path):
    texts = [f"<b>item {i}</b> & co" for i in range(len(X))]
    res = ee.evaluate(X, Y, metrics=["map_at_r"], progress=False)
    out = res.to_html(tmp_path / "t.html", query=X, texts=texts, gallery=2, figures=False)
    text = out.read_text(encoding="utf-8")
    assert "&lt;b&gt;item" in text and "<b>item" not in text


def test_without_embeddings_the_page_has_the_numbers_and_says_how_to_get_the_gallery(tmp_path):
    res = ee.evaluate(X, Y, metrics=["map_at_r"], progress=False)
    out = res.to_html(tmp_path / "n.html")
    text = out.read_text(encoding="utf-8")
    assert "pass <code>query=</code>" in text
    assert not parse(out).rows


@pytest.mark.parametrize(
    ("labels", "options", "what"),
    [
        (np.arange(36), {}, "any per-query metric"),  # every query lone
        (np.arange(36), {"gallery_metric": "map_at_r"}, "map_at_r"),
        (Y, {"metrics": ["ami"]}, "any per-query metric"),
    ],
)
def test_a_run_without_per_query_values_gets_a_page_without_gallery(
    tmp_path, labels, options, what
):
    gallery_metric = options.pop("gallery_metric", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EmbedevalWarning)  # every query lone
        res = ee.evaluate(X, labels, progress=False, **options)
    out = res.to_html(tmp_path / "r.html", query=X, gallery_metric=gallery_metric, figures=False)
    assert f"No gallery: no query has a value of {what}" in out.read_text()
    assert not parse(out).rows


def test_bad_arguments_raise_and_write_nothing(tmp_path):
    res = ee.evaluate(X, Y, metrics=["map_at_r"], progress=False)
    target = tmp_path / "x.html"
    cases = [
        (dict(query=X[:5]), "36 queries"),
        (dict(query=X, reference=X, reference_labels=Y), "reference"),
        (dict(query=X, gallery_metric="mrr"), "gallery_metric"),
        (dict(query=X, images=["a.png"]), "images has 1 entries"),
        (dict(query=X, images="a.png"), "single path"),
        (dict(query=X, images=[np.zeros(5, np.uint8)] * len(X)), r"images\[\d+\] has shape"),
        (dict(query=X, images=[np.full((3, 3), 300)] * len(X)), "from 300 to 300"),
        (
            dict(query=X, images=[np.full((3, 3), 2**70)] * len(X)),
            rf"images\[\d+\] holds the integer {2**70}, beyond 64",
        ),
    ]
    for kwargs, needle in cases:
        with pytest.raises(InputError, match=needle):
            res.to_html(target, figures=False, **kwargs)
    with pytest.raises(InputError, match=".html"):
        res.to_html(tmp_path / "x.txt")
    assert not list(tmp_path.iterdir())


def test_embeddings_that_were_not_evaluated_are_refused(tmp_path):
    # The page searches the arrays it is given: a reference set of another size, groups the
    # run did not have (or missing ones) or another dimension would give a gallery, k sweep and
    # histograms of another ranking than the metrics', silently.
    groups = np.arange(36) % 3
    grouped = ee.evaluate(X, Y, metrics=["map_at_r"], query_groups=groups, progress=False)
    plain = ee.evaluate(X, Y, metrics=["map_at_r"], progress=False)
    with_ref = ee.evaluate(X[:10], Y[:10], reference=X, reference_labels=Y, progress=False)
    cases = [
        (with_ref, dict(query=X[:10], reference=X[:20], reference_labels=Y[:20]), "against 36"),
        (grouped, dict(query=X), "query_groups"),
        (plain, dict(query=X, query_groups=groups), "query_groups"),
        (plain, dict(query=np.c_[X, X]), "dimension 2"),
    ]
    for res, kwargs, needle in cases:
        with pytest.raises(InputError, match=needle):
            res.to_html(tmp_path / "x.html", figures=False, **kwargs)
    assert not list(tmp_path.iterdir())
    grouped.to_html(tmp_path / "ok.html", query=X, query_groups=groups, figures=False)


def test_comparison_page(tmp_path):
    runs = {
        "a": ee.evaluate(X, Y, metrics=["map_at_r", "precision_at_1"], progress=False),
        "b": ee.evaluate(
            X + (Y[:, None] * 0.5), Y, metrics=["map_at_r", "precision_at_1"], progress=False
        ),
    }
    cmp = ee.compare(runs, n_boot=50)
    out = cmp.to_html(tmp_path / "cmp.html")
    page = parse(out)
    rows = [a for t, a in page.tags if t == "tr" and "data-checkpoint" in a]
    assert sorted((r["data-checkpoint"], r["data-metric"]) for r in rows) == [
        (c, m) for c in ("a", "b") for m in ("map_at_r", "precision_at_1")
    ]
    # The value column holds each checkpoint's metric, from the definitions.
    want = {
        "a": oracle.evaluate(X, Y, metrics=["map_at_r", "precision_at_1"])[0],
        "b": oracle.evaluate(X + (Y[:, None] * 0.5), Y, metrics=["map_at_r", "precision_at_1"])[0],
    }
    values = [float(v) for v in _cells(out, "comparison", 2)]
    expected = [want[r["data-checkpoint"]][r["data-metric"]] for r in rows]
    assert values == pytest.approx(expected, abs=1e-12)
    ids = {a.get("id") for _, a in page.tags}
    assert {"comparison", "fig-checkpoints"} <= ids
    assert_offline(out)


# ------------------------------------------------------------------------------ command line
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


@pytest.fixture
def run_files(tmp_path):
    np.savez(tmp_path / "ckpt.npz", embeddings=X, labels=Y, confidences=CONF)
    paths = _images(tmp_path, len(X), broken={5})
    (tmp_path / "images.txt").write_text(
        "\n".join(Path(p).name for p in paths) + "\n", encoding="utf-8"
    )
    return tmp_path


def test_cli_report_metrics_equal_the_json_and_the_oracle(run_files):
    f = run_files
    proc = run(
        "evaluate",
        f / "ckpt.npz",
        "--metrics",
        "precision_at_1",
        "map_at_r",
        "--ci",
        "0.9",
        "--n-boot",
        "50",
        "--json",
        f / "r.json",
        "--report",
        f / "r.html",
        "--images",
        f / "images.txt",
        "--gallery",
        "4",
        "--quiet",
    )
    assert proc.returncode == 0, proc.stderr
    warn = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warn) == 1 and "placeholder" in warn[0]
    data = json.loads((f / "r.json").read_text())
    page = parse(f / "r.html")
    shown = {a["data-metric"]: float(a["data-value"]) for t, a in page.tags if "data-metric" in a}
    assert shown == data["metrics"]
    want, _, _ = oracle.evaluate(X, Y, metrics=["precision_at_1", "map_at_r"])
    for name, value in want.items():
        assert shown[name] == pytest.approx(value, abs=1e-12)
    assert len(page.rows["gallery-worst"]) == 4 and len(page.rows["gallery-confident"]) == 4
    assert "ckpt.npz" in "".join(page.text)
    assert_offline(f / "r.html")


def test_cli_compare_report(run_files):
    f = run_files
    np.savez(f / "other.npz", embeddings=X * 2 + Y[:, None], labels=Y)
    proc = run(
        "compare",
        f / "ckpt.npz",
        f / "other.npz",
        "--n-boot",
        "50",
        "--report",
        f / "cmp.html",
        "--quiet",
    )
    assert proc.returncode == 0, proc.stderr
    assert (f / "cmp.html").exists()
    assert_offline(f / "cmp.html")


def test_cli_device_cpu_and_shards_give_the_local_numbers(run_files):
    pytest.importorskip("torch")
    f = run_files
    outs = {}
    for name, extra in {
        "local": [],
        "torch": ["--device", "cpu"],
        "shards": ["--shards", "3"],
        "bf16": ["--device", "cpu", "--precision", "bf16"],
    }.items():
        proc = run("evaluate", f / "ckpt.npz", "--json", f / f"{name}.json", "--quiet", *extra)
        assert proc.returncode == 0, proc.stderr
        outs[name] = json.loads((f / f"{name}.json").read_text())
    # the same settings, but for the backend each run records and the torch backend's record
    torch_run = dict(outs["torch"]["settings"])
    assert torch_run.pop("backend") == "torch" and torch_run.pop("torch")["device"] == "cpu"
    local = dict(outs["local"]["settings"])
    assert local.pop("backend") == "local" and torch_run == local
    assert outs["shards"]["settings"]["backend"] == "sharded"
    assert outs["bf16"]["settings"]["torch"]["precision"] == "bf16"
    for name in ("torch", "shards", "bf16"):
        assert outs[name]["metrics"] == outs["local"]["metrics"]


def test_cli_dask_backend_on_a_scheduler_started_here(run_files):
    distributed = pytest.importorskip("distributed")
    f = run_files
    # Threads in this process, reached over TCP by the command line's own process.
    with distributed.LocalCluster(
        processes=False,
        n_workers=1,
        threads_per_worker=1,
        protocol="tcp",
        host="127.0.0.1",
        scheduler_port=0,
        dashboard_address=":0",  # any free port: no warning about a port in use
    ) as cluster:
        proc = run(
            "evaluate",
            f / "ckpt.npz",
            "--scheduler",
            cluster.scheduler_address,
            "--json",
            f / "dask.json",
            "--quiet",
        )
    assert proc.returncode == 0, proc.stderr
    want, _, _ = oracle.evaluate(X, Y, metrics=["precision_at_1", "r_precision", "map_at_r"])
    got = json.loads((f / "dask.json").read_text())["metrics"]
    for name, value in want.items():
        assert got[name] == pytest.approx(value, abs=1e-12)


def test_cli_dask_backend_without_scheduler_runs_a_local_cluster(run_files):
    pytest.importorskip("distributed")
    proc = run("evaluate", run_files / "ckpt.npz", "--backend", "dask", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr


def test_cli_threads_size_the_local_dask_cluster():
    pytest.importorskip("distributed")
    from embedeval.cli import _dask_client

    with _dask_client(None, 3) as client:
        assert sorted(client.nthreads().values()) == [3]


def test_cli_local_dask_cluster_shows_errors_but_not_warnings():
    # The run's own cluster keeps its workers' warnings (a Ctrl-C cancelling their tasks logged
    # one line per task) off the CLI's one-line output; in a process of its own, since pytest
    # captures log records itself.
    pytest.importorskip("distributed")
    code = (
        "import logging\n"
        "from embedeval.cli import _dask_client\n"
        "with _dask_client(None, 1):\n"
        "    log = logging.getLogger('distributed.worker.state_machine')\n"
        "    log.warning('a cancelled task')\n"
        "    log.error('a failed worker')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "a failed worker" in proc.stderr and "a cancelled task" not in proc.stderr


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--backend", "local", "--device", "cpu"], ["--device cpu", "--backend torch"]),
        (["--index-param", "nprobe=4"], ["--index-param", "--index FACTORY"]),
        (["--exact-sample", "5"], ["--exact-sample", "--index FACTORY"]),
        (["--backend", "dask", "--precision", "bf16"], ["--precision bf16", "is dask"]),
        (["--index", "HNSW32", "--shards", "2"], ["--index HNSW32", "--shards 2"]),
        (["--index", "HNSW32", "--device", "cpu"], ["--index HNSW32", "--backend torch"]),
        (["--shards", "2", "--backend", "dask"], ["--shards 2", "whole reference"]),
        (["--shards", "2", "--device", "cpu"], ["--shards 2", "is torch"]),
        (["--index-param", "nprobe"], ["--index-param", "NAME=VALUE"]),
        (["--memory-budget", "12Q"], ["--memory-budget"]),
        (["--backend", "local", "--scheduler", "tcp://127.0.0.1:1"], ["--scheduler"]),
        (["--scheduler", "tcp://127.0.0.1:1", "--threads", "2"], ["--threads", "--nthreads"]),
        (["--backend", "gpu"], ["--backend"]),
        (["--shards", "0"], ["--shards"]),
        (["--precision", "bf16"], ["--precision bf16", "--backend torch"]),
        (["--precision", "fp8"], ["--precision"]),
        (["--images", "x.txt"], ["--report"]),
        (["--report", "out.txt"], ["--report", ".html"]),
    ],
)
def test_cli_bad_search_and_report_options_exit_2_with_one_line(run_files, args, needles, capsys):
    from embedeval.cli import main

    try:  # in-process: argparse's own refusals end in SystemExit, the others return
        status = main(["evaluate", str(run_files / "ckpt.npz"), "--quiet", *args])
    except SystemExit as stop:
        status = stop.code
    assert status == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("embedeval: error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def test_cli_help_groups_the_search_options():
    from embedeval.cli import build_parser

    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices
    for command in ("evaluate", "compare"):
        groups = {g.title: g for g in sub[command]._action_groups}
        flags = {o for a in groups["search"]._group_actions for o in a.option_strings}
        assert {
            "--device",
            "--backend",
            "--scheduler",
            "--shards",
            "--index",
            "--index-param",
            "--exact-sample",
            "--memory-budget",
            "--precision",
        } <= flags, command


# ------------------------------------------------------------------------------ real browser
_PROBE = """<script>
window.addEventListener('load', function () {
  var bad = 0;
  document.querySelectorAll('img').forEach(function (im) {
    im.setAttribute('data-natural-width', im.naturalWidth);
    if (!im.complete || im.naturalWidth === 0) { bad += 1; }
  });
  document.body.setAttribute('data-broken-images', bad);
  document.body.setAttribute('data-resources',
    performance.getEntriesByType('resource').map(function (e) { return e.name; }).join(' '));
  document.body.setAttribute('data-probed', 'yes');
});
</script></body>"""


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def render(browser, html_path, folder, height):
    """Open the page in headless Chromium (network names unresolvable) with the probe script:
    check its screenshot is a drawn page and every image and resource is loaded inline; return
    the rendered DOM, parsed and as text."""
    probed = folder / "probed.html"
    probed.write_text(
        Path(html_path).read_text(encoding="utf-8").replace("</body>", _PROBE), encoding="utf-8"
    )
    flags = [
        browser,
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        "--no-first-run",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        f"--window-size=1200,{height}",
        f"--user-data-dir={folder / 'profile'}",
        "--virtual-time-budget=5000",
    ]
    shot = folder / "shot.png"
    subprocess.run(
        [*flags, f"--screenshot={shot}", probed.as_uri()],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert shot.exists() and shot.stat().st_size > 10_000
    from PIL import Image

    with Image.open(shot) as im:
        assert im.size == (1200, height)
        assert np.asarray(im.convert("L")).std() > 5  # not a blank page
    dom = subprocess.run(
        [*flags, "--dump-dom", probed.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    ).stdout
    page = _Page()
    page.feed(dom)
    body = next(a for t, a in page.tags if t == "body")
    assert body.get("data-probed") == "yes", dom[:300]
    assert body["data-broken-images"] == "0"
    assert all(r.startswith("data:") for r in body["data-resources"].split())
    assert "https://" not in dom and "http://" not in dom
    return page, dom


def test_the_report_renders_in_headless_chromium(run_files):
    browser = _chromium()
    if browser is None:
        pytest.skip("Chromium is not installed (apt-get install -y chromium)")
    f = run_files
    proc = run(
        "evaluate",
        f / "ckpt.npz",
        "--report",
        f / "r.html",
        "--images",
        f / "images.txt",
        "--gallery",
        "5",
        "--quiet",
    )
    assert proc.returncode == 0, proc.stderr
    page, dom = render(browser, f / "r.html", f, height=2400)
    widths = [int(a["data-natural-width"]) for t, a in page.tags if t == "img"]
    # 5 worst + 5 confident errors, 1 query + 5 references each, less image 5's placeholders,
    # plus the figures.
    assert widths and min(widths) > 0
    assert len(page.rows["gallery-worst"]) == 5 and len(page.rows["gallery-confident"]) == 5
    assert any(t == "table" and a.get("id") == "metrics" for t, a in page.tags)
    assert "https://" not in dom and "http://" not in dom


def test_per_class_table_worst_first_with_class_sizes(tmp_path):
    y = np.r_[Y, [0, 0]]  # class 0 has two more queries
    x = np.r_[X, [[9.0, 9.0], [9.0, 9.0]]].astype(np.float32)
    res = ee.evaluate(x, y, metrics=["map_at_r"], progress=False)
    out = res.to_html(tmp_path / "pc.html", query=x, gallery=0, figures=False)
    _, _, per_class = oracle.evaluate(x, y, metrics=["map_at_r"])
    expected = sorted(per_class["map_at_r"].items(), key=lambda kv: (kv[1], str(kv[0])))
    values = [float(v) for v in _cells(out, "per-class", 2)]
    sizes = [int(v) for v in _cells(out, "per-class", 1)]
    assert values == pytest.approx([v for _, v in expected], abs=1e-12)
    assert sizes == [int((y == lab).sum()) for lab, _ in expected]


@pytest.mark.parametrize(
    "unit", ["datetime64[ns]", "datetime64[D]", "timedelta64[ns]", "timedelta64[s]"]
)
def test_per_class_sizes_of_date_and_duration_labels(tmp_path, unit):
    # Nanosecond dates and durations are per-class keys as numpy scalars (Python's types cannot
    # hold nanoseconds); the sizes column must count them under the same keys.
    y = (np.arange(36) % 4 + 1).astype(unit)
    res = ee.evaluate(X, y, metrics=["map_at_r"], progress=False)
    out = res.to_html(tmp_path / "d.html", gallery=0, figures=False)
    sizes = sorted(int(v) for v in _cells(out, "per-class", 1))
    assert sizes == [9, 9, 9, 9]


def test_names_undecodable_as_utf8_are_written_escaped(tmp_path):
    # Python reads a file name that is not UTF-8 with lone surrogates (os.fsdecode); the CLI
    # titles the page by its input file, and such a name failed the UTF-8 encoding after all the
    # work, leaving no page.
    name = os.fsdecode(b"caf\xe9.npz")
    res = ee.evaluate(X, Y, metrics=["map_at_r"], progress=False)
    out = res.to_html(tmp_path / "u.html", query=X, texts=[name] * len(X), title=name, gallery=2)
    page = out.read_bytes().decode("utf-8")
    assert page.count("caf\\udce9.npz") >= 3  # the title, the heading, a caption


def test_figures_draw_names_undecodable_as_utf8(tmp_path):
    # Checkpoint names are file stems and labels may come from file names: a lone surrogate
    # made matplotlib's font layout fail, so the page (and compare --report) was not written.
    name = os.fsdecode(b"caf\xe9")
    y = np.where(Y == 0, name, "b")
    res = ee.evaluate(X, y, metrics=["map_at_r"], progress=False)
    page = res.to_html(tmp_path / "f.html", query=X, gallery=0).read_text(encoding="utf-8")
    assert 'id="fig-per_class"' in page and "caf\\udce9" in page
    cmp = ee.compare({name: res, "other": res}, n_boot=10)
    page = cmp.to_html(tmp_path / "c.html").read_text(encoding="utf-8")
    assert 'id="fig-checkpoints"' in page and "caf\\udce9" in page


def test_an_approximate_run_shows_its_error_report(tmp_path):
    pytest.importorskip("faiss")
    res = ee.evaluate(X, Y, metrics=["map_at_r"], index="HNSW8", exact_sample=20, progress=False)
    out = res.to_html(tmp_path / "a.html", query=X, gallery=2, figures=False)
    page = parse(out)
    assert any(a.get("id") == "approximation" for _, a in page.tags)
    assert "APPROXIMATE search (HNSW8)" in "".join(page.text)
    # the gallery searches exactly: its neighbours are said not to be the index's
    assert any(a.get("id") == "gallery-exact" for _, a in page.tags)
    exact = ee.evaluate(X, Y, metrics=["map_at_r"], progress=False)
    page = parse(exact.to_html(tmp_path / "e.html", query=X, gallery=2, figures=False))
    assert not any(a.get("id") == "gallery-exact" for _, a in page.tags)


def test_a_relevance_list_run_has_a_page_without_gallery(tmp_path):
    q = np.array([[0.0, 0.0]])
    g = np.array([[0.0, 1.0], [0.0, 2.0], [0.0, 3.0], [0.0, 4.0]])
    res = ee.evaluate(q, None, g, None, positives=[[1, 3]], junk=[[0]], metrics=["map"])
    out = res.to_html(tmp_path / "l.html")
    shown = {
        a["data-metric"]: float(a["data-value"]) for t, a in parse(out).tags if "data-metric" in a
    }
    assert shown == {"map": pytest.approx((1 / 1 + 2 / 3) / 2)}  # ranks 1 and 3 once 0 is junk
    with pytest.raises(InputError, match="positives="):
        res.to_html(tmp_path / "l2.html", query=q)


def test_gallery_with_ref_includes_query_skips_the_own_row(tmp_path):
    xb, yb = X, Y  # the 10 queries are the first 10 reference rows (PML's convention)
    res = ee.evaluate(X[:10], Y[:10], xb, yb, ref_includes_query=True, metrics=["map_at_r"])
    out = res.to_html(
        tmp_path / "r.html",
        query=X[:10],
        reference=xb,
        reference_labels=yb,
        gallery=10,
        gallery_k=3,
        figures=False,
    )
    for row in parse(out).rows["gallery-worst"]:
        q = row["query"]
        d = np.sqrt(((xb.astype(np.float64) - X[q]) ** 2).sum(axis=1))
        j = [c for c in np.lexsort((np.arange(len(xb)), d)).tolist() if c != q]
        assert [int(c["data-index"]) for c in row["cells"]] == j[:3]
        assert row["first"] == first_relevant([bool(yb[c] == Y[q]) for c in j])


@pytest.mark.parametrize("average", ["micro", "macro"])
@pytest.mark.parametrize("split", ["loo", "groups", "reference"])
def test_k_sweep_values_match_the_brute_force(average, split):
    from embedeval.evaluation.figures import k_sweep_values

    rng = np.random.default_rng(11)
    x = rng.integers(-2, 3, size=(60, 3)).astype(np.float32)
    x[10:14] = x[0]  # duplicates: exact ties
    y = rng.integers(0, 5, 60)
    y[59] = 9  # a lone query
    kw: dict = {"query": x, "query_labels": y}
    ref = {}
    if split == "groups":
        kw["query_groups"] = rng.integers(0, 4, 60)
        ref = {"qg": kw["query_groups"], "rg": kw["query_groups"]}
    if split == "reference":
        kw = {
            "query": x[:20],
            "query_labels": y[:20],
            "reference": x[20:],
            "reference_labels": y[20:],
        }
    ks = [1, 2, 5, 10]
    names = [f"recall_at_{k}" for k in ks] + [f"precision_at_{k}" for k in ks]
    res = ee.evaluate(**kw, metrics=["map_at_r"], average=average, progress=False)
    got = k_sweep_values(res, kw, ks)
    q, ql = kw["query"], kw["query_labels"]
    r, rl = kw.get("reference"), kw.get("reference_labels")
    expected, _ = oracle.summary(
        q, list(ql), r, None if rl is None else list(rl), metrics=names, average=average, **ref
    )
    assert got["Recall@k (hit rate)"] == pytest.approx(
        [expected[f"recall_at_{k}"] for k in ks], abs=1e-12
    )
    assert got["Precision@k"] == pytest.approx(
        [expected[f"precision_at_{k}"] for k in ks], abs=1e-12
    )


def test_gallery_headings_count_the_rows_they_show(tmp_path):
    # Four queries, two lone (labels 1 and 2: no other item shares them), and query 1 (at 1.0)
    # nearer to row 2 (1.2, label 1) than to row 0: two ranked queries, one error, not 20.
    x = np.array([[0.0], [1.0], [1.2], [5.0]])
    y = [0, 0, 1, 2]
    conf = np.array([0.9, 0.8, 0.7, 0.6])
    res = ee.evaluate(x, y, confidences=conf, metrics=["precision_at_1", "map_at_r"])
    out = res.to_html(tmp_path / "g.html", query=x, gallery=20, figures=False)
    text = out.read_text(encoding="utf-8")
    page = parse(out)
    headings = re.findall(r"<h3>(.*?)</h3>", text)
    assert headings == [
        "The 2 queries with the lowest map_at_r",
        "The 1 most confident errors (top-1 not relevant)",
    ]
    assert len(page.rows["gallery-worst"]) == 2 and len(page.rows["gallery-confident"]) == 1


@pytest.mark.parametrize(
    "dtype, top, ext",
    [(np.uint16, 65535, "png"), (np.uint16, 4095, "png"), (np.int32, 70000, "tif"),
     (np.float32, 1.0, "tif")],
)  # fmt: skip
def test_thumbnails_of_deep_images_span_their_range(tmp_path, dtype, top, ext):
    # 16-bit, 12-bit in 16, 32-bit integer and float greyscale: a left-to-right ramp from 0 to
    # `top` must show as a ramp from black to white, not as a square clipped to white.
    import base64
    import io

    from PIL import Image

    from embedeval.evaluation.html import _thumbnail

    ramp = np.tile(np.linspace(0, top, 32), (16, 1)).astype(dtype)
    path = tmp_path / f"deep.{ext}"
    Image.fromarray(ramp).save(path)
    failed: list[str] = []
    uri = _thumbnail(str(path), 64, failed)
    assert not failed and uri is not None
    shown = Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))
    grey = np.asarray(shown.convert("L"), dtype=np.float64)
    expected = np.tile(np.linspace(0, 255, 32), (16, 1))  # the ramp stretched over 0..255
    assert grey.shape == expected.shape
    assert np.abs(grey - expected).mean() < 6  # JPEG's loss, a few levels


def test_thumbnails_are_upright_as_their_exif_orientation_says(tmp_path):
    # Stored 40 wide and 20 high, EXIF orientation 6 ("rotate 90° clockwise to view"): the
    # photo is seen 20 wide and 40 high, its stored top row (red) on the right.
    import base64
    import io

    from PIL import Image

    from embedeval.evaluation.html import _thumbnail

    stored = np.zeros((20, 40, 3), dtype=np.uint8)
    stored[:5] = (255, 0, 0)
    im = Image.fromarray(stored)
    exif = im.getexif()
    exif[0x0112] = 6
    path = tmp_path / "photo.jpg"
    im.save(path, exif=exif)
    failed: list[str] = []
    uri = _thumbnail(str(path), 64, failed)
    shown = np.asarray(Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))))
    assert not failed and shown.shape[:2] == (40, 20)
    assert shown[:, -3:, 0].mean() > 200 and shown[:, :3, 0].mean() < 60


def test_image_arrays_of_integer_levels_show_those_levels(tmp_path):
    # Integer pixels are the levels 0..255 whatever their dtype: 100 is drawn as grey 100, not
    # read as a fraction and clipped to white; a trailing channel of one is grey too.
    import base64

    from PIL import Image

    res = ee.evaluate(X, Y, metrics=["map_at_r"], progress=False)
    for pixels in (np.full((6, 4), 100, dtype=np.int64), np.full((6, 4, 1), 100, np.uint16)):
        out = res.to_html(
            tmp_path / "a.html", query=X, images=[pixels] * len(X), gallery=1, figures=False
        )
        uri = re.search(r'<img src="data:image/png;base64,([^"]+)"', out.read_text("utf-8"))
        shown = np.asarray(Image.open(io.BytesIO(base64.b64decode(uri.group(1)))))
        assert shown.shape == (64, 43) and (shown == 100).all()


def test_an_inner_product_run_shows_the_key_it_ranked_by():
    # items at 1, 2, 4 (class 0) and 8 (class 1): every inner product names its pair, and
    # the histograms show minus the inner products, not Euclidean distances
    from embedeval.evaluation.figures import pair_distances, run_figures

    x = np.float32([[1.0], [2.0], [4.0], [8.0]])
    y = [0, 0, 0, 1]
    res = ee.evaluate(x, y, metrics=["precision_at_1"], distance="inner_product", progress=False)
    pos, neg = pair_distances(res, {"query": x, "query_labels": y})
    assert set(pos.tolist()) <= {-2.0, -4.0, -8.0} and set(neg.tolist()) <= {-8.0, -16.0, -32.0}
    assert pos.size and neg.size
    fig = run_figures(res, {"query": x, "query_labels": y})["distance_histograms"]
    assert fig.axes[0].get_xlabel() == "minus the inner product (lower: closer)"
