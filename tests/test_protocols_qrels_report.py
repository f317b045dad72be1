"""The judged-relevance HTML report (``QrelsResult.to_html``, ``retrieve --report``): its numbers
are the result's, its gallery is the brute-force ranking with the qrels grades, it speaks IR
(no classes, no labels), it is self-contained, and a real browser renders it."""

from __future__ import annotations

import json
import warnings
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

import embedeval as ee
from embedeval.utils.errors import EmbedevalWarning, InputError
from tests.test_cli import _one_line_error, run
from tests.test_evaluation_html import _chromium, _images, assert_offline, parse, render

LEVEL = 1


def make_case(seed=3, n_docs=120, n_queries=18):
    """Integer embeddings (float32 inner products exact: many exact ties), duplicated corpus
    rows, graded qrels with -1 and 0, a judged document outside the corpus, a query with
    nothing relevant, queries without judgments, a qrels query without an embedding."""
    rng = np.random.default_rng(seed)
    corpus = rng.integers(-2, 3, (n_docs, 3)).astype(np.float32)
    corpus[60:80] = corpus[:20]
    queries = rng.integers(-2, 3, (n_queries, 3)).astype(np.float32)
    doc_ids = [f"d{v:03d}" for v in rng.permutation(900)[:n_docs]]
    query_ids = [f"q{i}" for i in range(n_queries)]
    qrels = {}
    for i, qid in enumerate(query_ids):
        if i % 6 == 5:
            continue  # embedded, not judged: skipped
        docs = rng.choice(n_docs, 8, replace=False)
        grades = rng.choice([-1, 0, 0, 1, 2], docs.size)
        if i in (4, 7):
            grades[:] = 0  # q4: nothing relevant; q7: its one relevant document is not indexed
        qrels[qid] = {doc_ids[d]: int(g) for d, g in zip(docs, grades, strict=True)}
        if i != 4:
            qrels[qid]["nowhere"] = 2  # judged, not in the corpus
    qrels["ghost"] = {doc_ids[0]: 1}  # no embedding: 0 with missing="zero"
    return queries, corpus, query_ids, doc_ids, qrels


def brute_ranking(query, corpus, doc_ids, ties):
    """Corpus rows of one query, best first: float64 inner products, equal scores by row
    (``index``) or by doc id descending (``trec_eval``)."""
    scores = corpus.astype(np.float64) @ query.astype(np.float64)
    rows = list(range(len(doc_ids)))
    if ties == "index":
        return sorted(rows, key=lambda j: (-scores[j], j)), scores
    by_id = sorted(rows, key=lambda j: doc_ids[j], reverse=True)
    return sorted(by_id, key=lambda j: -scores[j]), scores  # stable: id order kept in ties


def brute_first_relevant(ranking, doc_ids, judged):
    for n, j in enumerate(ranking):
        if judged.get(doc_ids[j], -9) >= LEVEL:
            return n + 1
    return None


def evaluate(case, ties="index", **kw):
    queries, corpus, query_ids, doc_ids, qrels = case
    kw.setdefault("metrics", ["ndcg@10", "mrr", "recall@20"])
    return ee.evaluate_qrels(
        queries, corpus, qrels, query_ids=query_ids, doc_ids=doc_ids, distance="inner_product",
        ties=ties, missing="zero", relevance_level=LEVEL, progress=False, **kw,
    )  # fmt: skip


class _Text(HTMLParser):
    """The page's visible text (no style, no script) and the per-query table's rows."""

    def __init__(self):
        super().__init__()
        self.text, self.rows, self._skip, self._row = [], [], False, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self._skip = tag in ("style", "script")
        if tag == "tr" and "data-qid" in a and "data-query" not in a:
            self._row = {"qid": a["data-qid"], "v": []}
            self.rows.append(self._row)
        if self._row is not None and tag == "td":
            self._row["v"].append(a.get("data-v"))

    def handle_endtag(self, tag):
        self._skip = False if tag in ("style", "script") else self._skip
        if tag == "tr":
            self._row = None

    def handle_data(self, data):
        if not self._skip:
            self.text.append(data)


def visible(path):
    p = _Text()
    p.feed(Path(path).read_text(encoding="utf-8"))
    return p


# ------------------------------------------------------------------------------ Python API
@pytest.mark.parametrize("ties", ["index", "trec_eval"])
def test_gallery_rows_are_the_brute_force_ranking_with_the_qrels_grades(tmp_path, ties):
    case = make_case()
    queries, corpus, query_ids, doc_ids, qrels = case
    res = evaluate(case, ties)
    out = res.to_html(tmp_path / "q.html", gallery=7, gallery_k=6, gallery_metric="mrr")
    # the worst 7 embedded, judged queries by MRR from the brute-force ranking, ties by row
    first, rr = {}, {}
    for i, qid in enumerate(query_ids):
        if qid in qrels:
            ranking, _ = brute_ranking(queries[i], corpus, doc_ids, ties)
            first[i] = brute_first_relevant(ranking, doc_ids, qrels[qid])
            rr[i] = 0.0 if first[i] is None else 1.0 / first[i]
    worst = sorted(rr, key=lambda i: (rr[i], i))[:7]
    rows = parse(out).rows["gallery-worst"]
    assert [r["query"] for r in rows] == worst
    for row in rows:
        i = row["query"]
        ranking, _ = brute_ranking(queries[i], corpus, doc_ids, ties)
        cells = row["cells"]
        assert [c["data-doc"] for c in cells] == [doc_ids[j] for j in ranking[:6]]
        assert [int(c["data-rank"]) for c in cells] == [1, 2, 3, 4, 5, 6]
        for c in cells:
            grade = qrels[query_ids[i]].get(c["data-doc"])
            assert c["data-grade"] == ("" if grade is None else str(grade))
            relevant = grade is not None and grade >= LEVEL
            assert c["data-relevant"] == str(int(relevant))
            want = "ok" if relevant else "unj" if grade is None else "bad"
            assert c["class"] == want
        assert row["first"] == first[i]
    assert_offline(out)


def test_page_numbers_are_the_result_and_the_per_query_table_is_worst_first(tmp_path):
    case = make_case()
    qrels = case[4]
    res = evaluate(case, ci=0.9, n_boot=40)
    out = res.to_html(tmp_path / "n.html", gallery=0)
    page = parse(out)
    shown = {a["data-metric"]: float(a["data-value"]) for t, a in page.tags if "data-metric" in a}
    assert shown == res.metrics
    text = visible(out)
    # worst nDCG@10 first (the first metric), equal values by position; skipped ones not listed
    values = res.per_query["ndcg@10"]
    labels = res.query_labels.tolist()
    order = sorted(
        (p for p in range(len(labels)) if not np.isnan(values[p])), key=lambda p: (values[p], p)
    )
    assert [r["qid"] for r in text.rows] == [labels[p] for p in order]
    for r in text.rows:
        judged = qrels[r["qid"]]
        n_rel = sum(g >= LEVEL for g in judged.values())
        if r["qid"] == "ghost":  # no embedding: no run, no counts
            assert r["v"][1:4] == [None, None, None]
            continue
        assert [int(r["v"][1]), int(r["v"][2])] == [len(judged), n_rel]
    words = " ".join(text.text)
    assert "90% CI" in words and "trec_eval" in words
    for needle in ("relevance_level", "ignore_identical_ids", "gain", "missing", "ties"):
        assert needle in words
    assert "class" not in words.lower() and "label" not in words.lower()


def test_first_relevant_beyond_the_kept_depth(tmp_path):
    case = make_case()
    queries, corpus, query_ids, doc_ids, qrels = case
    cut = evaluate(case, metrics=["precision@3"])  # depth 3, no full-depth ranks
    full = evaluate(case, metrics=["precision@3", "map"])  # every relevant document ranked
    a = {r["query"]: r for r in parse(cut.to_html(tmp_path / "a.html", gallery=20)).rows[
        "gallery-worst"]}  # fmt: skip
    b = {r["query"]: r for r in parse(full.to_html(tmp_path / "b.html", gallery=20)).rows[
        "gallery-worst"]}  # fmt: skip
    deep = 0
    for i in set(a) & set(b):
        ranking, _ = brute_ranking(queries[i], corpus, doc_ids, "index")
        first = brute_first_relevant(ranking, doc_ids, qrels[query_ids[i]])
        assert b[i]["first"] == first
        assert a[i]["first"] == (first if first is not None and first <= 3 else None)
        assert len(a[i]["cells"]) == 3  # gallery_k 5 cut to the kept depth
        deep += first is not None and first > 3
    assert deep >= 2
    text = " ".join(visible(tmp_path / "a.html").text)
    assert "none retrieved within depth 3" in text and "kept 3 documents per query" in text
    assert "no relevant judgment" in text  # q4: only grade-0 judgments
    rows = visible(tmp_path / "b.html").text
    assert "none retrieved (not in the corpus, or excluded)" in " ".join(rows)  # q7


def test_texts_are_cut_and_escaped_and_broken_images_are_placeholders(tmp_path):
    case = make_case()
    res = evaluate(case)
    n_q, n_d = len(case[2]), len(case[3])
    passages = [f"<script>alert({j})</script> passage {j} " + "word " * 200 for j in range(n_d)]
    images = _images(tmp_path, n_q, broken={0, 1, 2, 3, 4, 6})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = res.to_html(
            tmp_path / "t.html", texts=[f"what is {i} & co?" for i in range(n_q)],
            reference_texts=passages, images=images, gallery=n_q, max_chars=120,
        )  # fmt: skip
    ours = [w for w in caught if issubclass(w.category, EmbedevalWarning)]
    assert len(ours) == 1 and "placeholder" in str(ours[0].message)
    text = out.read_text(encoding="utf-8")
    assert "<script>alert" not in text and "&lt;script&gt;alert(" in text
    assert "what is 1 &amp; co?" in text and "word " * 30 not in text
    for row in parse(out).rows["gallery-worst"]:
        assert (row["ph"], row["imgs"]) == (
            (1, 0) if row["query"] in {0, 1, 2, 3, 4, 6} else (0, 1)
        )
    assert_offline(out)


def test_bad_arguments_raise_and_write_nothing(tmp_path):
    res = evaluate(make_case())
    for kwargs, needle in [
        ({"gallery_metric": "map_at_r"}, "gallery_metric"),
        ({"texts": ["a"]}, "texts has 1 entries"),
        ({"reference_texts": "passages.txt"}, "single path"),
        ({"gallery_k": 0}, "gallery_k"),
        ({"query": np.zeros((3, 3))}, "no option 'query'"),
    ]:
        with pytest.raises(InputError, match=needle):
            res.to_html(tmp_path / "x.html", **kwargs)
    with pytest.raises(InputError, match=".html"):
        res.to_html(tmp_path / "x.txt")
    assert not list(tmp_path.iterdir())


def test_the_per_query_table_is_bounded(tmp_path):
    case = make_case()
    res = evaluate(case, metrics=["ndcg@10"])
    out = res.to_html(tmp_path / "b.html", table_rows=4, gallery=2)
    assert len(visible(out).rows) == 4
    # every qrels query is listed but for the cut: the judged embedded ones and the missing one
    assert f"The 4 worst of {len(case[4])} are listed" in " ".join(visible(out).text)
    assert out.stat().st_size < 10 * 2**20


# ------------------------------------------------------------------------------ command line
@pytest.fixture
def cli_files(tmp_path):
    queries, corpus, query_ids, doc_ids, qrels = make_case()
    qrels.pop("ghost")
    np.save(tmp_path / "q.npy", queries)
    np.save(tmp_path / "c.npy", corpus)
    (tmp_path / "qids.txt").write_text("\n".join(query_ids) + "\n")
    (tmp_path / "dids.txt").write_text("\n".join(doc_ids) + "\n")
    lines = [f"{q} 0 {d} {g}" for q, docs in qrels.items() for d, g in docs.items()]
    (tmp_path / "qrels.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "texts.txt").write_text("\n".join(f"query <{q}>" for q in query_ids) + "\n")
    (tmp_path / "passages.txt").write_text("\n".join(f"passage {d}" for d in doc_ids) + "\n")
    paths = _images(tmp_path, len(doc_ids), broken={int(np.argmax(corpus.sum(1)))})
    (tmp_path / "images.txt").write_text("\n".join(Path(p).name for p in paths) + "\n")
    return tmp_path


def _retrieve(d, *extra):
    return [
        "retrieve", d / "q.npy", "--query-ids", d / "qids.txt", "--corpus", d / "c.npy",
        "--doc-ids", d / "dids.txt", "--qrels", d / "qrels.txt", "--distance", "inner_product",
        "--quiet", *extra,
    ]  # fmt: skip


def test_cli_report_metrics_equal_the_json(cli_files):
    d = cli_files
    proc = run(
        *_retrieve(d, "--metrics", "ndcg@10", "map", "--ci", "0.9", "--n-boot", "30", "--json",
                   d / "r.json", "--report", d / "r.html", "--texts", d / "texts.txt",
                   "--reference-texts", d / "passages.txt", "--reference-images",
                   d / "images.txt", "--gallery", "5", "--gallery-metric", "map")
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    warn = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warn) <= 1 and all("placeholder" in w for w in warn)
    data = json.loads((d / "r.json").read_text())
    page = parse(d / "r.html")
    shown = {a["data-metric"]: float(a["data-value"]) for t, a in page.tags if "data-metric" in a}
    assert shown == data["metrics"]
    labels = data["query_labels"]
    worst = sorted(
        (p for p, v in enumerate(data["per_query"]["map"]) if v is not None),
        key=lambda p: (data["per_query"]["map"][p], p),
    )[:5]
    assert [r["query"] for r in page.rows["gallery-worst"]] == worst
    text = (d / "r.html").read_text(encoding="utf-8")
    assert f"query &lt;{labels[worst[0]]}&gt;" in text and "passage d" in text
    assert "q.npy" in " ".join(page.text) and "qrels.txt" in " ".join(page.text)
    assert_offline(d / "r.html")


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--texts", "texts.txt"], ["--texts", "--report"]),
        (["--reference-images", "images.txt"], ["--reference-images", "--report"]),
        (["--report", "out.txt"], ["--report", ".html"]),
        (["--report", "out.html", "--gallery-metric", "map_at_r"], ["map_at_r"]),
        (["--report", "out.html", "--texts", "passages.txt"], ["--texts", "lines"]),
    ],
)
def test_cli_bad_report_options_exit_2_with_one_line(cli_files, extra, needles):
    d = cli_files
    proc = run(*_retrieve(d, *[d / e if e.endswith(".txt") else e for e in extra]))
    _one_line_error(proc, *needles)
    assert not (d / "out.html").exists()


def test_retrieve_help_names_the_report():
    proc = run("retrieve", "--help")
    assert proc.returncode == 0
    assert "--report" in proc.stdout and "qrels grades" in proc.stdout
    assert "--reference-texts" in proc.stdout and "corpus row" in proc.stdout


def test_first_relevant_ranks_refuses_uint64_ranks_above_int64():
    from embedeval.evaluation.judged_html import first_relevant_ranks, judged_counts

    # ranks 3 and 1 for the two relevant documents of query 0: its first relevant is rank 1
    u = np.uint64
    assert first_relevant_ranks([0, 3], [1, 0, 1], np.array([3, 2, 1], u), 1).tolist() == [1]
    with pytest.raises(InputError, match="ranks holds 9223372036854775808, above the largest"):
        first_relevant_ranks([0, 3], [1, 0, 1], np.array([3, 2, 2**63], u), 1)
    with pytest.raises(InputError, match="lims holds 9223372036854775811, above the largest"):
        judged_counts(np.array([0, 2**63 + 3], u), [1, 0, 1], 1)


# ------------------------------------------------------------------------------ real browser
def test_the_qrels_report_renders_in_headless_chromium(cli_files):
    browser = _chromium()
    if browser is None:
        pytest.skip("Chromium is not installed (apt-get install -y chromium)")
    d = cli_files  # its one broken image is a placeholder, not an <img>
    proc = run(*_retrieve(d, "--report", d / "r.html", "--reference-images", d / "images.txt",
                          "--texts", d / "texts.txt", "--gallery", "4"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    page, dom = render(browser, d / "r.html", d, height=2000)
    widths = [int(a["data-natural-width"]) for t, a in page.tags if t == "img"]
    assert widths and min(widths) > 0
    assert len(page.rows["gallery-worst"]) == 4
    assert any(t == "table" and a.get("id") == "per-query" for t, a in page.tags)
    assert "none retrieved" in dom or "rank " in dom
