"""``embedeval retrieve``: the command line of evaluate_qrels, run as a subprocess on files."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from tests.test_cli import _one_line_error, run

pytrec_eval = pytest.importorskip("pytrec_eval")


@pytest.fixture()
def files(tmp_path):
    """Integer-valued embeddings (exact ties), ids in files and inside an .npz, TREC qrels."""
    rng = np.random.default_rng(0)
    corpus = rng.integers(-2, 3, (200, 4)).astype(np.float32)
    corpus[100:120] = corpus[:20]  # duplicated rows: exact ties under cosine too
    queries = rng.integers(-2, 3, (15, 4)).astype(np.float32)
    doc_ids = [f"doc{v}" for v in rng.permutation(1000)[:200]]
    query_ids = [f"q{i}" for i in range(15)]
    lines = []
    for qid in query_ids[:12]:  # q12..q14 have no judgments
        for d in rng.choice(200, 10, replace=False):
            lines.append(f"{qid} 0 {doc_ids[d]} {rng.integers(0, 3)}")
    np.save(tmp_path / "corpus.npy", corpus.astype(np.float16))  # small integers: exact
    np.savez(tmp_path / "queries.npz", embeddings=queries, ids=np.array(query_ids))
    (tmp_path / "docs.txt").write_text("\n".join(doc_ids) + "\n")
    (tmp_path / "qrels.txt").write_text("\n".join(lines) + "\n")
    return tmp_path, queries, corpus, query_ids, doc_ids


def _args(d, *extra):
    return [
        "retrieve",
        d / "queries.npz",
        "--corpus",
        d / "corpus.npy",
        "--doc-ids",
        d / "docs.txt",
        "--qrels",
        d / "qrels.txt",
        *extra,
    ]


def test_retrieve_matches_pytrec_eval_and_writes_outputs(files):
    d, queries, corpus, query_ids, doc_ids = files
    out = d / "out"
    proc = run(
        *_args(
            d,
            "--ties",
            "trec_eval",
            "--metrics",
            "ndcg@5",
            "map",
            "P_5",
            "recip_rank",
            "--run",
            out / "run.trec",
            "--depth",
            "200",
            "--json",
            out / "res.json",
            "--per-query",
            out / "pq.csv",
        )
    )
    assert proc.returncode == 0, proc.stderr
    qrels, run_dict = _qrels_and_cosine_run(d, queries, corpus, query_ids, doc_ids)
    measures = {"ndcg_cut.5", "map", "P.5", "recip_rank"}
    expected = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run_dict)
    keys = {"ndcg@5": "ndcg_cut_5", "map": "map", "precision@5": "P_5", "mrr": "recip_rank"}
    res = json.loads((out / "res.json").read_text())
    for name, key in keys.items():
        mean = np.mean([v[key] for v in expected.values()])
        assert res["metrics"][name] == pytest.approx(mean, abs=1e-12)
    rows = list(csv.DictReader((out / "pq.csv").open()))
    assert [r["query_id"] for r in rows] == query_ids
    for r in rows:
        if r["query_id"] in expected:
            assert float(r["map"]) == pytest.approx(expected[r["query_id"]]["map"], abs=1e-12)
        else:
            assert r["map"] == ""  # no judgments: skipped
    # trec_eval on the written run (all 200 documents) gives the same numbers
    from_file = {}
    for line in (out / "run.trec").read_text().splitlines():
        q, _, doc, _, score, _ = line.split()
        from_file.setdefault(q, {})[doc] = float(score)
    again = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(from_file)
    for q in expected:
        for key in keys.values():
            assert again[q][key] == pytest.approx(expected[q][key], abs=1e-12)


def test_bad_inputs_one_line_exit_2_nothing_written(files):
    d = files[0]
    run_file = d / "never.trec"
    (d / "dup.txt").write_text("a\nb\na\n")
    proc = run(
        *_args(d)[:4],
        "--doc-ids",
        d / "dup.txt",
        "--qrels",
        d / "qrels.txt",
        "--run",
        run_file,
    )
    _one_line_error(proc, "dup.txt line 3", "'a' already on line 1")
    (d / "bad.txt").write_text("q1 0 doc1 1\nq2 0 doc2\n")
    proc = run(*_args(d)[:-1], d / "bad.txt", "--run", run_file)
    _one_line_error(proc, "bad.txt", "line 2")
    (d / "grade.txt").write_text("q1 0 doc1 1.5\n")
    proc = run(*_args(d)[:-1], d / "grade.txt", "--run", run_file)
    _one_line_error(proc, "grade.txt", "line 1", "integer")
    (d / "huge.txt").write_text("q1 0 doc1 1\nq1 0 doc2 99999999999999999999\n")
    proc = run(*_args(d)[:-1], d / "huge.txt", "--run", run_file)
    _one_line_error(proc, "huge.txt", "line 2", "64-bit integer range")
    np.save(d / "wide.npy", np.zeros((200, 5), np.float32))
    proc = run(
        "retrieve",
        d / "queries.npz",
        "--corpus",
        d / "wide.npy",
        "--doc-ids",
        d / "docs.txt",
        "--qrels",
        d / "qrels.txt",
        "--run",
        run_file,
    )
    _one_line_error(proc, "dimension 4", "wide.npy has 5")
    proc = run(
        "retrieve",
        d / "corpus.npy",
        "--corpus",
        d / "corpus.npy",
        "--doc-ids",
        d / "docs.txt",
        "--qrels",
        d / "qrels.txt",
        "--run",
        run_file,
    )
    _one_line_error(proc, "corpus.npy holds no ids", "--query-ids")
    (d / "short.txt").write_text("doc1\ndoc2\n")
    proc = run(
        "retrieve",
        d / "queries.npz",
        "--corpus",
        d / "corpus.npy",
        "--doc-ids",
        d / "short.txt",
        "--qrels",
        d / "qrels.txt",
        "--run",
        run_file,
    )
    _one_line_error(proc, "short.txt has 2 ids", "200 rows")
    (d / "ghost.txt").write_text("ghost 0 doc1 1\n")
    proc = run(*_args(d)[:-1], d / "ghost.txt", "--run", run_file)
    _one_line_error(proc, "ghost.txt: 1 judged queries", "('ghost')", "--missing zero")
    proc = run(*_args(d), "--relevance-level", "0", "--run", run_file)
    _one_line_error(proc, "--relevance-level", "must be a positive integer; got '0'")
    assert not run_file.exists()
    # an id a TREC run cannot hold: refused before any work or output, naming file and line
    ids = files[4]
    (d / "spaced.txt").write_text("\n".join([*ids[:6], "doc 9", *ids[7:]]) + "\n")
    outputs = [d / "never.json", d / "never.csv"]
    proc = run(
        *_args(d)[:4], "--doc-ids", d / "spaced.txt", "--qrels", d / "qrels.txt",
        "--run", run_file, "--json", outputs[0], "--per-query", outputs[1],
    )  # fmt: skip
    _one_line_error(proc, "spaced.txt line 7", "'doc 9' holds whitespace")
    assert proc.stdout == "" and not any(p.exists() for p in [run_file, *outputs])


def test_a_run_with_no_ranked_query_is_an_empty_file(files, tmp_path):
    # no embedded query has judgments (the judged one is missing, counted as 0): the run has
    # no line, and writing it gives an empty file, as from the API
    d = files[0]
    (d / "other.txt").write_text("elsewhere 0 doc1 1\n")
    out = tmp_path / "run.trec"
    proc = run(*_args(d)[:-1], d / "other.txt", "--missing", "zero", "--run", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == ""


def test_search_options_reach_retrieve(files):
    # Gaussian embeddings: no two documents score within a rounding of each other, so the
    # torch product (whose float32 sums may differ from numpy's in the last bit) ranks alike.
    pytest.importorskip("torch")
    d = files[0]
    rng = np.random.default_rng(5)
    np.save(d / "corpus.npy", rng.standard_normal((200, 8)).astype(np.float32))
    np.savez(d / "queries.npz", embeddings=rng.standard_normal((15, 8)).astype(np.float32),
             ids=np.array([f"q{i}" for i in range(15)]))  # fmt: skip
    local = run(*_args(d, "--json", d / "local.json"))
    assert local.returncode == 0, local.stderr
    on_torch = run(*_args(d, "--json", d / "torch.json", "--device", "cpu"))
    assert on_torch.returncode == 0, on_torch.stderr
    a = json.loads((d / "local.json").read_text())["per_query"]
    b = json.loads((d / "torch.json").read_text())["per_query"]
    assert a == b
    proc = run(*_args(d, "--index", "HNSW32", "--run", d / "never.trec"))
    _one_line_error(proc, "--index", "exactly")
    assert not (d / "never.trec").exists()
    proc = run(*_args(d, "--index-param", "nprobe=4"))  # not "add --index": retrieve has none
    _one_line_error(proc, "--index-param", "exactly")
    assert "add --index" not in proc.stderr


def test_retrieve_bfloat16_filter_gives_the_local_numbers(files):
    # small-integer rows with exact ties and duplicates: a bfloat16 product only filters, the
    # band it needs is re-scored in float64, so the values and the run are the local ones
    pytest.importorskip("torch")
    d = files[0]
    extra = ("--metrics", "map", "ndcg@10", "mrr@10", "--ties", "trec_eval", "--depth", "20")
    local = run(*_args(d, *extra, "--json", d / "local.json", "--run", d / "local.trec"))
    assert local.returncode == 0, local.stderr
    low = run(
        *_args(d, *extra, "--device", "cpu", "--precision", "bf16", "--json", d / "bf.json",
               "--run", d / "bf.trec")
    )  # fmt: skip
    assert low.returncode == 0, low.stderr
    a, b = (json.loads((d / f).read_text()) for f in ("local.json", "bf.json"))
    assert a["per_query"] == b["per_query"]
    assert b["settings"]["precision"] == "bf16"
    assert a["settings"]["precision"] == "float32"
    assert (d / "local.trec").read_text() == (d / "bf.trec").read_text()
    proc = run(*_args(d, "--precision", "bf16", "--run", d / "never.trec"))
    _one_line_error(proc, "precision", "backend")
    assert not (d / "never.trec").exists()


def test_retrieve_shards_and_dask_give_the_local_numbers(files):
    # --shards N: the corpus scanned in N pieces; --backend dask: the pieces on the workers of
    # a local in-process cluster; merged exactly, so every per-query value is the local one
    pytest.importorskip("distributed")
    d = files[0]
    extra = ("--metrics", "map", "ndcg@10", "recall@5", "--ties", "trec_eval")
    local = run(*_args(d, *extra, "--json", d / "local.json", "--run", d / "local.trec"))
    assert local.returncode == 0, local.stderr
    sharded = run(
        *_args(d, *extra, "--shards", "3", "--json", d / "sh.json", "--run", d / "sh.trec")
    )
    assert sharded.returncode == 0, sharded.stderr
    dask = run(*_args(d, *extra, "--backend", "dask", "--shards", "2", "--json", d / "dk.json"))
    assert dask.returncode == 0, dask.stderr
    a = json.loads((d / "local.json").read_text())
    for other in ("sh.json", "dk.json"):
        b = json.loads((d / other).read_text())
        assert a["per_query"] == b["per_query"]
        assert a["metrics"] == b["metrics"]
    assert (d / "local.trec").read_text() == (d / "sh.trec").read_text()
    proc = run(*_args(d, "--shards", "0", "--run", d / "never.trec"))
    _one_line_error(proc, "shards")
    assert not (d / "never.trec").exists()


def test_retrieve_scheduler_address(files):
    # --scheduler: a scheduler reached over TCP (here a cluster of this test process)
    distributed = pytest.importorskip("distributed")
    d = files[0]
    local = run(*_args(d, "--metrics", "map", "--json", d / "local.json"))
    assert local.returncode == 0, local.stderr
    with distributed.LocalCluster(
        processes=False, protocol="tcp", n_workers=2, threads_per_worker=1, dashboard_address=":0"
    ) as cluster:
        proc = run(*_args(d, "--metrics", "map", "--scheduler", cluster.scheduler_address,
                          "--json", d / "cluster.json"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    a = json.loads((d / "local.json").read_text())
    b = json.loads((d / "cluster.json").read_text())
    assert a["per_query"] == b["per_query"]
    assert b["settings"]["shards"] == 2  # one piece per worker


def _qrels_and_cosine_run(d, queries, corpus, query_ids, doc_ids):
    """The fixture's qrels and its cosine ranking as a pytrec_eval run dict: sign(s) s^2 /
    ||x||^2 in float64 ranks like the cosine, and equal rational cosines of these small-integer
    rows stay exactly equal (a computed cosine would round them apart)."""
    qrels = {}
    for line in (d / "qrels.txt").read_text().splitlines():
        q, _, doc, g = line.split()
        qrels.setdefault(q, {})[doc] = int(g)
    s = queries.astype(np.float64) @ corpus.astype(np.float64).T
    scores = np.sign(s) * s * s / (corpus.astype(np.float64) ** 2).sum(axis=1)
    run_dict = {
        q: dict(zip(doc_ids, scores[i].tolist(), strict=True)) for i, q in enumerate(query_ids)
    }
    return qrels, run_dict


def _pytrec_means(d, queries, corpus, query_ids, doc_ids, measures):
    """pytrec_eval's means over the judged queries, on the cosine ranking of the fixture."""
    qrels, run_dict = _qrels_and_cosine_run(d, queries, corpus, query_ids, doc_ids)
    per_query = pytrec_eval.RelevanceEvaluator(qrels, set(measures)).evaluate(run_dict)
    return {m: np.mean([v[m] for v in per_query.values()]) for m in measures}


@pytest.mark.parametrize("before", [False, True])
def test_trec_eval_dotted_metric_names_are_metrics_not_files(files, before):
    # trec_eval's own spellings hold a dot (P.10, ndcg_cut.5): they are metrics, never the
    # queries file, whether --metrics comes after the queries or before them.
    d, queries, corpus, query_ids, doc_ids = files
    out = d / "res.json"
    metrics = ["--metrics", "map", "P.10", "ndcg_cut.5"]
    args = _args(d, "--ties", "trec_eval", "--json", out)
    proc = run(args[0], *metrics, *args[1:]) if before else run(*args, *metrics)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(out.read_text())["metrics"]
    expected = _pytrec_means(d, queries, corpus, query_ids, doc_ids, ["map", "P_10", "ndcg_cut_5"])
    assert list(got) == ["map", "precision@10", "ndcg@5"]
    assert got["map"] == pytest.approx(expected["map"], abs=1e-12)
    assert got["precision@10"] == pytest.approx(expected["P_10"], abs=1e-12)
    assert got["ndcg@5"] == pytest.approx(expected["ndcg_cut_5"], abs=1e-12)


def test_depth_without_run_or_report_is_refused_before_any_output(files):
    # --depth shapes the run file and the report's gallery, never a metric: alone it would be
    # silently ignored, like a --thumbnail without --report
    d = files[0]
    (d / "res.json").write_text("keep me")
    proc = run(*_args(d, "--depth", "5", "--json", d / "res.json"))
    _one_line_error(proc, "--depth", "--run")
    assert (d / "res.json").read_text() == "keep me"
    ok = run(*_args(d, "--depth", "5", "--run", d / "run.trec"))
    assert ok.returncode == 0, ok.stderr
    lines = (d / "run.trec").read_text().splitlines()
    per_query = {}
    for line in lines:
        per_query[line.split()[0]] = per_query.get(line.split()[0], 0) + 1
    assert set(per_query.values()) == {5}


def test_gallery_metric_the_run_lacks_names_the_flag(files):
    d = files[0]
    report = d / "never.html"
    proc = run(*_args(d, "--metrics", "ndcg@10", "--report", report, "--gallery-metric", "map"))
    _one_line_error(proc, "--gallery-metric map", "ndcg@10", "--metrics")
    assert "gallery_metric=" not in proc.stderr and not report.exists()


def test_repeated_id_inside_an_npz_names_the_file(files):
    d, queries = files[0], files[1]
    ids = np.array([f"q{i % 14}" for i in range(15)])  # q0 twice: rows 0 and 14
    np.savez(d / "twice.npz", embeddings=queries, ids=ids)
    proc = run("retrieve", d / "twice.npz", *_args(d)[2:], "--json", d / "never.json")
    _one_line_error(proc, "twice.npz", "'q0'", "rows 0 and 14")
    assert not (d / "never.json").exists()
