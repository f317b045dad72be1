"""evaluate_qrels against pytrec_eval (trec_eval) on full brute-force runs, and against a
brute-force ranking oracle written here for ties="index"."""

from __future__ import annotations

import numpy as np
import pytest

import embedeval as ee
from embedeval.utils.errors import InputError, InputTypeError

from .oracle import fixed_order_keys, pytrec_measure

pytrec_eval = pytest.importorskip("pytrec_eval")

# our names, each with its pytrec_eval measure (oracle.pytrec_measure)
PYTREC = [
    "ndcg@5", "ndcg@10", "ndcg", "map@10", "map", "recall@5", "recall@20", "precision@5",
    "precision@10", "mrr", "hit_rate@1", "hit_rate@5", "r_precision",
]  # fmt: skip


def make_case(seed: int, n_docs: int = 300, n_queries: int = 40, dim: int = 4):
    """Integer-valued embeddings (float32 products exact: many exact ties), duplicated corpus
    rows, graded qrels with grade 0 and negative grades, judged docs outside the corpus,
    queries with nothing relevant, queries without judgments."""
    rng = np.random.default_rng(seed)
    corpus = rng.integers(-2, 3, (n_docs, dim)).astype(np.float32)
    corpus[rng.choice(n_docs, n_docs // 5, replace=False)] = corpus[rng.choice(n_docs, n_docs // 5)]
    queries = rng.integers(-2, 3, (n_queries, dim)).astype(np.float32)
    doc_ids = [f"d{v}" for v in rng.permutation(10 * n_docs)[:n_docs]]  # ids not in row order
    query_ids = [f"q{i}" for i in range(n_queries)]
    qrels: dict[str, dict[str, int]] = {}
    for i in range(n_queries):
        if i % 7 == 3:
            continue  # embedded, not judged: skipped
        docs = rng.choice(n_docs, int(rng.integers(1, 25)), replace=False)
        grades = rng.choice([-1, 0, 0, 1, 2, 3], docs.size)
        if i % 5 == 1:
            grades[:] = 0  # nothing relevant: scores 0 and counts
        qrels[query_ids[i]] = {doc_ids[d]: int(g) for d, g in zip(docs, grades, strict=True)}
        qrels[query_ids[i]][f"absent{i}"] = 2  # judged, never retrieved: counts in R
    return queries, corpus, query_ids, doc_ids, qrels


def brute_run(queries, corpus, query_ids, doc_ids, qids=None):
    """Every document of every judged query with its float32 inner product."""
    scores = (queries @ corpus.T).astype(np.float32)
    return {
        qid: {d: float(s) for d, s in zip(doc_ids, scores[i].tolist(), strict=True)}
        for i, qid in enumerate(query_ids)
        if qids is None or qid in qids
    }


def pytrec(qrels, run, names, level=1):
    measures = {pytrec_measure(n)[0] for n in names}
    out = pytrec_eval.RelevanceEvaluator(qrels, measures, relevance_level=level).evaluate(run)
    return {n: {q: v[pytrec_measure(n)[1]] for q, v in out.items()} for n in names}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("block_size", [None, 37])
def test_matches_pytrec_eval_per_query(seed, block_size):
    queries, corpus, qids, dids, qrels = make_case(seed)
    names = list(PYTREC)
    res = ee.evaluate_qrels(
        queries,
        corpus,
        qrels,
        query_ids=qids,
        doc_ids=dids,
        metrics=names,
        distance="inner_product",
        ties="trec_eval",
        block_size=block_size,
        n_threads=2,
    )
    expected = pytrec(qrels, brute_run(queries, corpus, qids, dids, qrels), names)
    for name in names:
        for i, qid in enumerate(qids):
            if qid in qrels:
                assert res.per_query[name][i] == pytest.approx(expected[name][qid], abs=1e-12)
            else:
                assert np.isnan(res.per_query[name][i])
        assert res[name] == pytest.approx(np.mean(list(expected[name].values())), abs=1e-12)
    assert res.n_skipped == sum(q not in qrels for q in qids)
    assert res.n_evaluated == len(qrels)


def test_relevance_level_matches_pytrec_eval():
    queries, corpus, qids, dids, qrels = make_case(5)
    names = ["map", "recall@20", "precision@5", "mrr", "r_precision", "ndcg@10"]
    res = ee.evaluate_qrels(
        queries,
        corpus,
        qrels,
        query_ids=qids,
        doc_ids=dids,
        metrics=names,
        distance="inner_product",
        ties="trec_eval",
        relevance_level=2,
    )
    expected = pytrec(qrels, brute_run(queries, corpus, qids, dids, qrels), names, level=2)
    for name in names:
        got = {q: res.per_query[name][i] for i, q in enumerate(qids) if q in qrels}
        assert got == pytest.approx(expected[name], abs=1e-12)


def test_cosine_random_floats_match_pytrec_eval():
    rng = np.random.default_rng(3)
    corpus = rng.standard_normal((500, 16)).astype(np.float32) * rng.uniform(0.5, 2, (500, 1))
    corpus = corpus.astype(np.float32)
    queries = rng.standard_normal((30, 16)).astype(np.float32)
    dids, qids = [str(i) for i in range(500)], [str(1000 + i) for i in range(30)]
    qrels = {
        q: {str(d): int(rng.integers(0, 4)) for d in rng.choice(500, 30, replace=False)}
        for q in qids
    }
    names = list(PYTREC)
    res = ee.evaluate_qrels(
        queries, corpus, qrels, query_ids=qids, doc_ids=dids, metrics=names, ties="trec_eval"
    )
    unit_q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    unit_c = corpus / np.linalg.norm(corpus, axis=1, keepdims=True)
    expected = pytrec(qrels, brute_run(unit_q, unit_c, qids, dids), names)
    for name in names:
        got = {q: res.per_query[name][i] for i, q in enumerate(qids)}
        assert got == pytest.approx(expected[name], abs=1e-12)


def test_written_run_reproduces_values(tmp_path):
    from embedeval.protocols.qrels_files import read_trec_run

    queries, corpus, qids, dids, qrels = make_case(4)
    names = ["ndcg@10", "map@10", "recall@20", "precision@5", "hit_rate@1"]
    res = ee.evaluate_qrels(
        queries,
        corpus,
        qrels,
        query_ids=qids,
        doc_ids=dids,
        metrics=names,
        distance="inner_product",
        ties="trec_eval",
    )
    path = tmp_path / "run.trec"
    res.write_run(path, depth=20)
    run = read_trec_run(path)
    expected = pytrec(qrels, run, names)
    for name in names:
        got = {q: res.per_query[name][i] for i, q in enumerate(qids) if q in qrels}
        assert got == pytest.approx(expected[name], abs=1e-12)


def test_run_deeper_than_kept_is_refused_and_run_depth_reproduces_full_map(tmp_path):
    from embedeval.protocols.qrels_files import read_trec_run

    queries, corpus, qids, dids, qrels = make_case(5)
    args = (queries, corpus, qrels)
    ids = {"query_ids": qids, "doc_ids": dids, "distance": "inner_product", "ties": "trec_eval"}
    # only full-depth metrics: 1,000 documents kept, here the whole corpus
    res = ee.evaluate_qrels(*args, **ids, metrics=["map"])
    assert res.run_rows.shape[1] >= len(dids)
    shallow = ee.evaluate_qrels(*args, **ids, metrics=["map", "precision@5"], run_depth=20)
    for ask in (lambda: shallow.write_run(tmp_path / "r.trec", depth=300), lambda: shallow.run(21)):
        with pytest.raises(InputError, match="run_depth=") as err:
            ask()
        assert "20 documents" in str(err.value)
    assert not (tmp_path / "r.trec").exists()
    assert all(len(docs) == 20 for docs in shallow.run(20).values())
    # a run holding every document gives trec_eval the full-depth MAP
    res.write_run(tmp_path / "full.trec")
    expected = pytrec(qrels, read_trec_run(tmp_path / "full.trec"), ["map"])["map"]
    got = {q: res.per_query["map"][i] for i, q in enumerate(qids) if q in qrels}
    assert got == pytest.approx(expected, abs=1e-12)


# ---------------------------------------------------------------------------- ties="index"
def oracle_ranks(queries, corpus, query_ids, doc_ids, qrels, excluded=frozenset()):
    """Full ranking per query by a stable sort on (-score, row); rank of each judged doc."""
    scores = queries @ corpus.T
    out = {}
    for i, qid in enumerate(query_ids):
        if qid not in qrels:
            continue
        rows = [j for j in range(len(doc_ids)) if (qid, doc_ids[j]) not in excluded]
        rows.sort(key=lambda j: (-scores[i, j], j))
        position = {doc_ids[j]: r + 1 for r, j in enumerate(rows)}
        out[qid] = {d: position.get(d) for d in qrels[qid]}
    return out


def oracle_values(ranks, qrels, k):
    """precision@k, recall@k, mrr (full depth) and map (full depth) from the ranks."""
    out = {"precision": {}, "recall": {}, "mrr": {}, "map": {}}
    for qid, rank in ranks.items():
        rel = [d for d, g in qrels[qid].items() if g >= 1]
        found = sorted(rank[d] for d in rel if rank[d] is not None)
        top = [r for r in found if r <= k]
        out["precision"][qid] = len(top) / k
        out["recall"][qid] = len(top) / len(rel) if rel else 0.0
        out["mrr"][qid] = 1 / found[0] if found else 0.0
        ap = sum((n + 1) / r for n, r in enumerate(found))
        out["map"][qid] = ap / len(rel) if rel else 0.0
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_index_ties_against_brute_force_oracle(seed):
    queries, corpus, qids, dids, qrels = make_case(seed)
    res = ee.evaluate_qrels(
        queries,
        corpus,
        qrels,
        query_ids=qids,
        doc_ids=dids,
        metrics=["precision@10", "recall@10", "mrr", "map"],
        distance="inner_product",
        block_size=50,
    )
    expected = oracle_values(oracle_ranks(queries, corpus, qids, dids, qrels), qrels, 10)
    for ours, theirs in (
        ("precision@10", "precision"),
        ("recall@10", "recall"),
        ("mrr", "mrr"),
        ("map", "map"),
    ):
        got = {q: res.per_query[ours][i] for i, q in enumerate(qids) if q in qrels}
        assert got == pytest.approx(expected[theirs], abs=1e-12)


def float64_oracle_ranks(queries, corpus, query_ids, doc_ids, qrels, distance):
    """Rank of each judged doc by (fixed-order float64 key, row), one query at a time."""
    out = {}
    for i, qid in enumerate(query_ids):
        if qid in qrels:
            keys = fixed_order_keys(queries[i], corpus, distance)
            order = np.lexsort((np.arange(len(doc_ids)), keys))
            position = {doc_ids[j]: r + 1 for r, j in enumerate(order.tolist())}
            out[qid] = {d: position.get(d) for d in qrels[qid]}
    return out


def assert_float64_values(res, case, distance, k, names):
    """``res``'s per-query values equal the float64 oracle's (:func:`oracle_values` at ``k``);
    ``names``: (our metric, the oracle's)."""
    queries, corpus, qids, dids, qrels = case
    ranks = float64_oracle_ranks(queries, corpus, qids, dids, qrels, distance)
    expected = oracle_values(ranks, qrels, k)
    for ours, theirs in names:
        got = {q: res.per_query[ours][i] for i, q in enumerate(qids)}
        assert got == pytest.approx(expected[theirs], abs=1e-12), ours


def growing_norms_case(seed):
    """Euclidean rows whose norms grow block by block (blocks of 150: the band grows with
    them; the queries are short), exact copies, and twins one ulp apart in the last block."""
    rng = np.random.default_rng(seed)
    n, dim = 600, 6
    scale = np.repeat(np.float32([0.01, 1, 30, 1000]), n // 4)[:, None]
    corpus = (rng.standard_normal((n, dim)) * scale).astype(np.float32)
    src = rng.choice(n, 60)
    corpus[src // 150 * 150 + rng.integers(0, 150, 60)] = corpus[src]  # copies, same block
    # twins in the last block (the largest norms), one ulp apart in a coordinate that every
    # query shares with them: their distances differ by far less than float32 resolves there
    twins = 450 + rng.choice(150, 40, replace=False)
    corpus[twins[:20], 0] = 1
    corpus[twins[20:]] = corpus[twins[:20]]
    corpus[twins[20:], 0] = np.nextafter(np.float32(1), np.float32(2))
    queries = (rng.standard_normal((30, dim)) * 0.01).astype(np.float32)
    queries[:, 0] = 1
    queries[:5] = corpus[twins[:5]]  # a query at a row: its one-ulp neighbour ties in float32
    dids = [f"d{j}" for j in range(n)]
    qids = [f"q{i}" for i in range(30)]
    qrels = {}
    for i, qid in enumerate(qids):
        docs = rng.choice(n, 12, replace=False).tolist()
        t = i if i < 5 else int(rng.integers(0, 20))  # a pair of twins judged
        docs[:2] = [int(twins[20 + t]), int(twins[t])]
        grades = rng.integers(0, 3, 12)
        grades[0] = max(grades[0], 1)
        qrels[qid] = {dids[j]: int(g) for j, g in zip(docs, grades, strict=True)}
    return queries, corpus, qids, dids, qrels


def _count_passes(monkeypatch):
    from embedeval.engine import corpus as engine

    passes = []
    original = engine._blocks

    def counted(*args, **kwargs):
        passes.append(args[2])
        return original(*args, **kwargs)

    monkeypatch.setattr(engine, "_blocks", counted)
    return passes


@pytest.mark.parametrize(("seed", "shards"), [(0, None), (1, None), (0, 3), (1, 2)])
def test_full_depth_ranks_counted_in_the_one_pass(seed, shards, monkeypatch):
    """Full-depth metrics read the corpus (each shard) once: the top pass also counts what
    beats every judged document; the ranks are the float64 ones (ties by row)."""
    queries, corpus, qids, dids, qrels = growing_norms_case(seed)
    passes = _count_passes(monkeypatch)
    res = ee.evaluate_qrels(
        queries, corpus, qrels, query_ids=qids, doc_ids=dids, distance="euclidean",
        metrics=["precision@5", "recall@5", "mrr", "map"], block_size=150, n_threads=2,
        shards=shards,
    )  # fmt: skip
    assert len(passes) == (shards or 1)
    names = [("precision@5", "precision"), ("recall@5", "recall"), ("mrr", "mrr"), ("map", "map")]
    assert_float64_values(res, (queries, corpus, qids, dids, qrels), "euclidean", 5, names)


@pytest.mark.parametrize("shards", [None, 3])
def test_full_depth_counts_again_past_the_near_limit(shards, monkeypatch):
    """Past its limit of near documents the top pass's counter gives up, and the judged
    documents beyond the top lists are counted in a pass of their own: the same ranks."""
    from embedeval.protocols import qrels as qrels_module

    queries, corpus, qids, dids, qrels = growing_norms_case(3)
    monkeypatch.setattr(qrels_module, "_NEAR_LIMIT", 5)
    passes = _count_passes(monkeypatch)
    res = ee.evaluate_qrels(
        queries, corpus, qrels, query_ids=qids, doc_ids=dids, distance="euclidean",
        metrics=["precision@5", "map"], block_size=150, n_threads=2, shards=shards,
    )  # fmt: skip
    assert len(passes) == 2 * (shards or 1)
    case = (queries, corpus, qids, dids, qrels)
    assert_float64_values(res, case, "euclidean", 5, [("precision@5", "precision"), ("map", "map")])


def test_full_depth_counts_survive_a_second_top_pass(monkeypatch):
    """A floor too high for some queries scans their chunks again for the top lists; what
    beats each judged document was counted in the first pass and is not counted twice."""
    from embedeval.engine import corpus as engine

    queries, corpus, qids, dids, qrels = growing_norms_case(2)
    original = engine.sample_floor

    def too_high(corpus_, scan, size=4096):
        floor = np.asarray(original(corpus_, scan, size), dtype=np.float32).copy()
        floor[::3] = np.float32(1e30)  # above every score: those queries find nothing
        return floor

    monkeypatch.setattr(engine, "sample_floor", too_high)
    passes = _count_passes(monkeypatch)
    res = ee.evaluate_qrels(
        queries, corpus, qrels, query_ids=qids, doc_ids=dids, distance="inner_product",
        metrics=["precision@5", "map"], block_size=150, n_threads=2,
    )  # fmt: skip
    assert len(passes) == 2
    case = (queries, corpus, qids, dids, qrels)
    names = [("precision@5", "precision"), ("map", "map")]
    assert_float64_values(res, case, "inner_product", 5, names)


def test_top_lists_of_many_queries_merged_in_row_ranges():
    """600 queries on one thread (two chunks of 300 queries, each merged 256 rows at a time)
    and deep lists (several merges during the scan): every query's run is the float64
    order, ties by row, and the judged ranks are the oracle's."""
    rng = np.random.default_rng(12)
    corpus = rng.integers(-3, 4, (3000, 8)).astype(np.float32)
    corpus[2000:2400] = corpus[:400]  # exact ties
    queries = rng.integers(-3, 4, (600, 8)).astype(np.float32)
    dids = [f"d{j}" for j in range(3000)]
    qids = [f"q{i}" for i in range(600)]
    qrels = {q: {dids[j]: int(rng.integers(0, 3)) for j in rng.choice(3000, 8)} for q in qids}
    res = ee.evaluate_qrels(
        queries, corpus, qrels, query_ids=qids, doc_ids=dids, distance="inner_product",
        metrics=["precision@150", "map"], block_size=700, n_threads=1,
    )  # fmt: skip
    keys = -(queries.astype(np.float64) @ corpus.T.astype(np.float64))  # small integers: exact
    run = res.run()
    for i in range(0, 600, 7):
        order = np.lexsort((np.arange(3000), keys[i]))[:150]
        assert list(run[qids[i]]) == [dids[j] for j in order]
    case = (queries, corpus, qids, dids, qrels)
    names = [("precision@150", "precision"), ("map", "map")]
    assert_float64_values(res, case, "inner_product", 150, names)


def test_run_lists_against_brute_force_oracle():
    queries, corpus, qids, dids, qrels = make_case(6)
    res = ee.evaluate_qrels(
        queries,
        corpus,
        qrels,
        query_ids=qids,
        doc_ids=dids,
        metrics=["precision@7"],
        distance="inner_product",
        block_size=40,
    )
    scores = queries @ corpus.T
    run = res.run()
    for i, qid in enumerate(qids):
        if qid in qrels:
            rows = sorted(range(len(dids)), key=lambda j: (-scores[i, j], j))[:7]
            assert list(run[qid]) == [dids[j] for j in rows]
            assert list(run[qid].values()) == [float(scores[i, j]) for j in rows]


def test_exclusions_and_identical_ids():
    queries, corpus, _, dids, qrels = make_case(7, n_queries=10)
    qids = dids[:10]  # queries share ids with documents (BEIR's ArguAna, Quora)
    qrels = {qids[i]: v for i, v in enumerate(qrels.values()) if i < 10}
    exclude = {qids[0]: [dids[20], dids[21]], "not-a-query": [dids[1]]}
    res = ee.evaluate_qrels(
        queries,
        corpus,
        qrels,
        query_ids=qids,
        doc_ids=dids,
        metrics=["precision@10", "map"],
        distance="inner_product",
        ignore_identical_ids=True,
        exclude=exclude,
    )
    excluded = {(q, q) for q in qids} | {(qids[0], dids[20]), (qids[0], dids[21])}
    ranks = oracle_ranks(queries, corpus, qids, dids, qrels, excluded)
    expected = oracle_values(ranks, qrels, 10)
    got = {q: res.per_query["precision@10"][i] for i, q in enumerate(qids) if q in qrels}
    assert got == pytest.approx(expected["precision"], abs=1e-12)
    got = {q: res.per_query["map"][i] for i, q in enumerate(qids) if q in qrels}
    assert got == pytest.approx(expected["map"], abs=1e-12)
    for qid, docs in res.run().items():
        assert qid not in docs


@pytest.mark.parametrize(
    ("exclude", "message"),
    [
        ({"q0": 5}, r"exclude\['q0'\] must be a list of doc ids.*got int 5"),
        ({"q0": None}, r"exclude\['q0'\] must be a list of doc ids.*got NoneType"),
        ({"q0": "d1"}, r"exclude\['q0'\] must be a list of doc ids.*got str 'd1'"),
        ({"not-a-query": 3}, r"exclude\['not-a-query'\] must be a list of doc ids"),
        ({"q0": [b"d1"]}, r"exclude\['q0'\] holds bytes \(b'd1'\)"),
        ({b"q0": ["d1"]}, r"exclude holds the bytes query id b'q0'"),
    ],
)
def test_exclude_refuses_what_is_not_a_list_of_ids(exclude, message):
    # a bare id raised a bare TypeError ("'int' object is not iterable"), and bytes ids
    # ("b'd1'" once a string) matched nothing, so nothing was left out without a word
    corpus = np.float32([[1, 0], [0, 1], [1, 1]])
    with pytest.raises(InputTypeError, match=message):
        ee.evaluate_qrels(
            np.float32([[1, 0]]),
            corpus,
            {"q0": {"d1": 1}},
            query_ids=["q0"],
            doc_ids=["d0", "d1", "d2"],
            metrics=["map"],
            exclude=exclude,
        )


def test_compare_names_the_query_lists_of_results_with_skipped_queries():
    # a result lists its skipped queries (no judgments) too, which n_queries leaves out: the
    # messages counted the differing labels against n_queries ("4 of 2 queries") and, for
    # lists of different lengths, showed two equal labels as the first difference
    corpus = np.float32([[1, 0], [0, 1], [1, 1]])
    queries = np.float32([[1, 0], [0, 1], [1, 2], [2, 1], [1, 1]])
    qrels = {"q0": {"d1": 1}, "q1": {"d0": 1}}  # q2, q3, q4: embedded, not judged

    def run(rows):
        return ee.evaluate_qrels(
            queries[rows],
            corpus,
            qrels,
            query_ids=[f"q{i}" for i in rows],
            doc_ids=["d0", "d1", "d2"],
            metrics=["map"],
        )

    base = run([0, 1, 2, 3])
    with pytest.raises(InputError, match=r"at 4 of 4 queries, first at query 0 \('q3' vs 'q0'\)"):
        ee.compare({"a": base, "b": run([3, 2, 1, 0])})
    with pytest.raises(InputError, match=r"'b' lists 5 queries and 'a' 4; paired"):
        ee.compare({"a": base, "b": run([0, 1, 2, 3, 4])})


# ---------------------------------------------------------------------------- conventions
def test_missing_queries_error_or_zero():
    queries, corpus, qids, dids, qrels = make_case(8)
    qrels = {**qrels, "ghost1": {dids[0]: 1}, "ghost2": {dids[1]: 2}}
    with pytest.raises(InputError, match="ghost1.*missing='zero'"):
        ee.evaluate_qrels(queries, corpus, qrels, query_ids=qids, doc_ids=dids)
    res = ee.evaluate_qrels(
        queries,
        corpus,
        qrels,
        query_ids=qids,
        doc_ids=dids,
        metrics=["precision@5"],
        distance="inner_product",
        missing="zero",
    )
    judged = {q: v for q, v in qrels.items() if q in qids}
    expected = pytrec(judged, brute_run(queries, corpus, qids, dids, judged), ["precision@5"])
    values = [*expected["precision@5"].values(), 0.0, 0.0]  # trec_eval -c: 0 for each
    assert res["precision@5"] == pytest.approx(np.mean(values), abs=1e-12)
    assert res.n_missing == 2
    assert list(res.query_labels[-2:]) == ["ghost1", "ghost2"]


def test_bad_input_is_named():
    queries, corpus, qids, dids, qrels = make_case(9)
    with pytest.raises(InputError, match="doc_ids holds 'd.*' more than once"):
        ee.evaluate_qrels(queries, corpus, qrels, query_ids=qids, doc_ids=[dids[0], *dids[:-1]])
    with pytest.raises(InputError, match="dimension 4 but the corpus has 3"):
        ee.evaluate_qrels(queries, corpus[:, :3], qrels, query_ids=qids, doc_ids=dids)
    with pytest.raises(InputError, match="query_ids has 2 ids"):
        ee.evaluate_qrels(queries, corpus, qrels, query_ids=qids[:2], doc_ids=dids)
    with pytest.raises(InputError, match="shards must be"):
        ee.evaluate_qrels(queries, corpus, qrels, query_ids=qids, doc_ids=dids, shards=-2)
    with pytest.raises(InputError, match="ties="):
        ee.evaluate_qrels(queries, corpus, qrels, query_ids=qids, doc_ids=dids, ties="random")
    for level in (0, -1):  # grades <= 0 are never relevant (pytrec_eval refuses these too)
        with pytest.raises(InputError, match=f"relevance_level must be at least 1; got {level}"):
            ee.evaluate_qrels(
                queries, corpus, qrels, query_ids=qids, doc_ids=dids, relevance_level=level
            )
    with pytest.raises(InputError, match="gain="):
        ee.evaluate_qrels(queries, corpus, qrels, query_ids=qids, doc_ids=dids, gain="exp")


@pytest.mark.parametrize("wrap", [np.array, list, lambda v: np.array(v, dtype=object)])
def test_bytes_ids_are_refused_not_stringified(wrap):
    # str(b"d1") is "b'd1'", which no qrels id matches: every judged document would count as
    # absent from the corpus and every value would be 0 without a word.
    corpus = np.float32([[1, 0], [0, 1]])
    kw = dict(metrics=["mrr"], progress=False)
    with pytest.raises(InputTypeError, match=r"doc_ids holds bytes \(b'd0'\)"):
        ee.evaluate_qrels(
            np.float32([[1, 0]]), corpus, {"q": {"d0": 1}}, query_ids=["q"],
            doc_ids=wrap([b"d0", b"d1"]), **kw,
        )  # fmt: skip
    with pytest.raises(InputTypeError, match=r"query_ids holds bytes \(b'q'\)"):
        ee.evaluate_qrels(
            np.float32([[1, 0]]), corpus, {"q": {"d0": 1}}, query_ids=wrap([b"q"]),
            doc_ids=["d0", "d1"], **kw,
        )  # fmt: skip


def test_exponential_gain_takes_grades_up_to_959_and_names_a_larger_one():
    corpus = np.float32([[1, 0], [0.9, 0.1], [0.5, 0.5], [0, 1]])
    ids = ["a", "b", "c", "d"]

    def ndcg(grade_b, grade_c=1):
        return ee.evaluate_qrels(
            np.float32([[1, 0]]), corpus, {"q": {"a": 1, "b": grade_b, "c": grade_c}},
            query_ids=["q"], doc_ids=ids, metrics=["ndcg"], gain="exponential", progress=False,
        )  # fmt: skip

    # a (gain 1) at rank 1, b (gain 2**959 - 1) at rank 2, c (gain 1) at rank 3: by hand
    big = 2.0**959 - 1
    dcg = 1 + big / np.log2(3) + 1 / np.log2(4)
    assert ndcg(959)["ndcg"] == pytest.approx(dcg / (big + 1 / np.log2(3) + 1 / np.log2(4)))
    # three gains of 2**959 - 1 sum to a finite DCG
    dcg = 1 + big / np.log2(3) + big / np.log2(4)
    assert ndcg(959, 959)["ndcg"] == pytest.approx(dcg / (big + big / np.log2(3) + 1 / 2))
    with pytest.raises(InputError, match="document 'b' of query 'q' grade 960"):
        ndcg(960)


def test_a_euclidean_query_whose_squared_norm_overflows_float32_is_refused_by_its_row():
    # as a corpus row of that size is; the unjudged first query keeps the numbering the caller's
    corpus = np.float32([[1, 1], [1, -1], [-1, 1]])
    queries = np.float32([[1, 0], [0.5, 0.5], [3e19, 1e19]])
    qrels = {"b": {"x": 1}, "c": {"y": 1}}
    kw = dict(query_ids=["a", "b", "c"], doc_ids=["x", "y", "z"], progress=False)
    with pytest.raises(InputError, match="query row 2 .* overflows float32"):
        ee.evaluate_qrels(queries, corpus, qrels, distance="euclidean", **kw)
    # by hand: b is nearest x (0.5 against 2.5 and 2.5); c's inner products are 4e19, 2e19 and
    # -2e19; c's cosines 0.89, 0.45, -0.45: y second either way
    for distance in ("inner_product", "cosine"):
        got = ee.evaluate_qrels(queries, corpus, qrels, distance=distance, **kw)
        np.testing.assert_array_equal(got.per_query["mrr@10"], [np.nan, 1.0, 0.5])
    # a query that is not evaluated is not refused
    got = ee.evaluate_qrels(queries, corpus, {"b": {"x": 1}}, distance="euclidean", **kw)
    np.testing.assert_array_equal(got.per_query["mrr@10"], [np.nan, 1.0, np.nan])
    # nor is data far from the origin: the distances are measured from the corpus's centre
    # (column 0 holds one value, so column 1 decides: 0.01, 3.61 and 0.16)
    far = np.float32([[2e19, 1], [2e19, -1], [2e19, 0.5]])
    got = ee.evaluate_qrels(
        np.float32([[2e19, 0.9]]), far, {"q": {"z": 1}}, query_ids=["q"], doc_ids=["x", "y", "z"],
        distance="euclidean", progress=False,
    )  # fmt: skip
    assert got.per_query["mrr@10"].tolist() == [0.5]


def test_int_ids_are_strings_and_result_interfaces():
    rng = np.random.default_rng(10)
    corpus = rng.standard_normal((50, 8)).astype(np.float32)
    queries = corpus[:5] + 0.01
    qrels = {str(i): {str(i): 1} for i in range(5)}
    res = ee.evaluate_qrels(
        queries,
        corpus,
        qrels,
        query_ids=range(5),
        doc_ids=range(50),
        metrics=["mrr@10", "recall@1"],
        ci=0.9,
        n_boot=200,
    )
    assert res["mrr@10"] == 1.0 and res["recall@1"] == 1.0  # each query next to its document
    assert set(res.ci) == {"mrr@10", "recall@1"}
    assert '"mrr@10": 1.0' in res.to_json()
    assert "QrelsResult(5 queries evaluated" in repr(res)
    worse = ee.evaluate_qrels(
        queries[::-1].copy(),
        corpus,
        qrels,
        query_ids=range(5),
        doc_ids=range(50),
        metrics=["mrr@10"],
    )
    cmp = ee.compare({"good": res, "worse": worse}, metrics=["mrr@10"], n_boot=100)
    assert round(cmp.rows[0]["value"], 3) == 1.0


def test_float16_memmap_and_torch_backend(tmp_path):
    queries, corpus, qids, dids, qrels = make_case(11)
    names = ["ndcg@10", "map", "recall@20"]
    kw = dict(
        query_ids=qids, doc_ids=dids, metrics=names, distance="inner_product", ties="trec_eval"
    )
    base = ee.evaluate_qrels(queries, corpus, qrels, **kw)
    path = tmp_path / "corpus16.npy"
    np.save(path, corpus.astype(np.float16))  # small integers: exact in float16
    mm = ee.evaluate_qrels(queries, np.load(path, mmap_mode="r"), qrels, block_size=64, **kw)
    expected = pytrec(qrels, brute_run(queries, corpus, qids, dids, qrels), names)
    for name in names:
        np.testing.assert_array_equal(mm.per_query[name], base.per_query[name])
        got = {q: base.per_query[name][i] for i, q in enumerate(qids) if q in qrels}
        assert got == pytest.approx(expected[name], abs=1e-12)
    torch = pytest.importorskip("torch")
    tq = ee.evaluate_qrels(
        torch.from_numpy(queries),
        torch.from_numpy(corpus),
        qrels,
        backend="torch",
        device="cpu",
        **kw,
    )
    for name in names:
        np.testing.assert_array_equal(tq.per_query[name], base.per_query[name])


def test_precision_auto_filters_shallow_lists_in_bfloat16_and_is_torch_only(monkeypatch):
    import embedeval.protocols.qrels as qrels_module

    # a corpus this small never pays for a bfloat16 band (see the next test): no fall back here
    monkeypatch.setattr(qrels_module, "_DOCS_PER_CANDIDATE", 1e-9)
    queries, corpus, qids, dids, qrels = make_case(13)
    kw = dict(query_ids=qids, doc_ids=dids, distance="inner_product", ties="trec_eval")
    for bad in ({"precision": "bf16"}, {"device": "cpu"}):
        with pytest.raises(InputError, match=f"{next(iter(bad))}=.*backend='torch'"):
            ee.evaluate_qrels(queries, corpus, qrels, metrics=["mrr@10"], **kw, **bad)
    with pytest.raises(InputError, match="precision='fp8' is not valid; use one of"):
        ee.evaluate_qrels(queries, corpus, qrels, metrics=["mrr@10"], precision="fp8", **kw)
    torch = pytest.importorskip("torch")
    mkldnn = torch.backends.mkldnn
    native = mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    for names, want in ((["ndcg@10", "mrr@10"], "bf16" if native else "float32"),
                        (["ndcg@10", "recall@100"], "float32"), (["map"], "float32")):  # fmt: skip
        base = ee.evaluate_qrels(queries, corpus, qrels, metrics=names, **kw)
        res = ee.evaluate_qrels(
            queries, corpus, qrels, metrics=names, backend="torch", device="cpu", **kw
        )
        assert res.settings["precision"] == want, names
        for name in names:
            np.testing.assert_array_equal(res.per_query[name], base.per_query[name])


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_bfloat16_falls_back_to_float32_where_its_band_holds_too_many_documents(device):
    # dense scores at depth 500: the sample says the band holds thousands of documents a
    # query, more than one per 500 of the corpus, so the scan multiplies in float32; a copy of
    # a document as the query at depth 1, where the band holds a handful, and a corpus below
    # the size where a fall back is considered: bfloat16.  Values: pytrec_eval's on the
    # float64 cosines rounded to float32 (ties="trec_eval")
    torch = pytest.importorskip("torch")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    mkldnn = torch.backends.mkldnn
    native = mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if device == "cpu" and not native:
        pytest.skip("this CPU has no native bfloat16 product")
    rng = np.random.default_rng(3)
    n = 70_000
    corpus = rng.standard_normal((n, 32)).astype(np.float32)
    queries = corpus[rng.choice(n, 8, replace=False)].copy()
    dids, qids = [f"d{i}" for i in range(n)], [f"q{i}" for i in range(8)]
    qrels = {q: {dids[j]: 1 for j in rng.choice(n, 30, replace=False)} for q in qids}
    kw = dict(query_ids=qids, distance="cosine", ties="trec_eval")
    q64, c64 = queries.astype(np.float64), corpus.astype(np.float64)
    cosines = (q64 @ c64.T) / np.outer(np.linalg.norm(q64, axis=1), np.linalg.norm(c64, axis=1))
    cases = ((["ndcg@500", "recall@500"], "float32", n), (["precision@1"], "bf16", n),
             (["ndcg@500"], "bf16", 60_000))  # fmt: skip
    for names, want, rows in cases:
        kept = {q: {d: g for d, g in j.items() if int(d[1:]) < rows} for q, j in qrels.items()}
        res = ee.evaluate_qrels(
            queries, corpus[:rows], kept, metrics=names, doc_ids=dids[:rows], backend="torch",
            device=device, precision="bf16", **kw,
        )  # fmt: skip
        assert res.settings["precision"] == want, (names, rows)
        assert res.settings["precision_asked"] == "bf16"
        scores = cosines[:, :rows].astype(np.float32).tolist()
        run = {q: dict(zip(dids[:rows], scores[i], strict=True)) for i, q in enumerate(qids)}
        expected = pytrec(kept, run, names)
        for name in names:
            got = {q: res.per_query[name][i] for i, q in enumerate(qids)}
            assert got == pytest.approx(expected[name], abs=1e-12), (name, rows)


def test_band_population_counts_the_band_when_the_sample_is_the_corpus():
    # corpus smaller than the sample: every row is sampled and the depth-th score is the
    # query's own, so the estimate is the mean count of scores at least band below it
    # (integer inner products: exact float32 scores; the band comes from the scan)
    from embedeval.engine.corpus import CorpusScan, Pairs, band_population, tie_keys

    rng = np.random.default_rng(4)
    corpus = rng.integers(-30, 31, (700, 6)).astype(np.float32)  # bfloat16 band: about 60
    queries = rng.integers(-30, 31, (30, 6)).astype(np.float32)
    for depth, precision in ((1, "float32"), (5, "bf16"), (40, "bf16")):
        none = Pairs(np.zeros(0, int), np.zeros(0, int))
        keys = tie_keys(None, 700, "index")
        scan = CorpusScan(queries, None, "inner_product", depth, keys, none, precision=precision)
        band = scan.band(float((corpus.astype(np.float64) ** 2).sum(axis=1).max()))
        counts = []
        for i in range(30):
            s = [float(np.dot(queries[i].astype(np.float64), row)) for row in corpus]
            kth = sorted(s, reverse=True)[depth - 1]
            counts.append(sum(v >= kth - band[i] for v in s))
        assert band_population(corpus, scan) == pytest.approx(np.mean(counts), rel=1e-12)


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(not _has_cuda(), reason="needs torch with a CUDA device")
def test_torch_cuda_backend():
    queries, corpus, qids, dids, qrels = make_case(12)
    kw = dict(query_ids=qids, doc_ids=dids, metrics=["ndcg@10", "map"], distance="inner_product")
    base = ee.evaluate_qrels(queries, corpus, qrels, **kw)
    gpu = ee.evaluate_qrels(queries, corpus, qrels, backend="torch", device="cuda", **kw)
    for name in ("ndcg@10", "map"):
        np.testing.assert_array_equal(gpu.per_query[name], base.per_query[name])


# ---------------------------------------------------------------------------- engine pieces
def test_scan_top_redoes_queries_whose_floor_was_too_high():
    from embedeval.engine.corpus import CorpusScan, Pairs, decide_top, scan_top, tie_keys

    rng = np.random.default_rng(13)
    corpus = rng.integers(-3, 4, (500, 4)).astype(np.float32)
    queries = rng.integers(-3, 4, (9, 4)).astype(np.float32)
    none = Pairs(np.zeros(0, np.int64), np.zeros(0, np.int64))
    scan = CorpusScan(
        queries,
        None,
        "inner_product",
        30,
        tie_keys(None, 500, "index"),
        none,
        block=64,
        n_threads=2,
    )
    floor = np.full(9, 1e9, dtype=np.float32)  # nothing reaches it: every chunk is redone
    query, codes, _ = scan_top(corpus, scan, floor=floor)
    top = decide_top(corpus, scan, query, codes, False)[0]
    scores = queries @ corpus.T
    for i in range(9):
        expected = sorted(range(500), key=lambda j: (-scores[i, j], j))[:30]
        assert top[i].tolist() == expected


# ---------------------------------------------------------------------------- memory limit
CHILD = """
import json, sys
import numpy as np
import embedeval as ee
corpus = np.load(sys.argv[1], mmap_mode="r")
queries = np.load(sys.argv[2])
qrels = json.loads(open(sys.argv[3]).read())
res = ee.evaluate_qrels(queries, corpus, qrels, query_ids=range(len(queries)),
                        doc_ids=range(len(corpus)), metrics=["ndcg@10", "map", "recall@100"],
                        block_size=8192, n_threads=2)
print(json.dumps({k: v.tolist() for k, v in res.per_query.items()}))
"""


def test_memmapped_corpus_larger_than_the_memory_limit(tmp_path):
    import json
    import os
    import sys

    memlimit = pytest.importorskip("benchmarks._memlimit")
    if memlimit.memory_cgroup() is None:
        pytest.skip("no writable memory cgroup (needs root and a memory controller)")
    rng = np.random.default_rng(14)
    n, dim, n_q = 100_000, 768, 40  # a 307 MB float32 corpus file under a 200 MiB limit
    path = tmp_path / "corpus.npy"
    corpus = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, dim))
    for s in range(0, n, 10_000):
        corpus[s : s + 10_000] = rng.standard_normal((min(10_000, n - s), dim), np.float32)
    corpus.flush()
    queries = (corpus[:n_q] + 0.5 * rng.standard_normal((n_q, dim), np.float32)).astype(np.float32)
    del corpus
    qrels = {str(i): {str(i): 2, str(int(rng.integers(n))): 1, str(n + i): 1} for i in range(n_q)}
    np.save(tmp_path / "queries.npy", queries)
    (tmp_path / "qrels.json").write_text(json.dumps(qrels))
    fd = os.open(path, os.O_RDONLY)  # the file's pages out of the cache: the child reads them
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    argv = [
        sys.executable,
        "-c",
        CHILD,
        str(path),
        str(tmp_path / "queries.npy"),
        str(tmp_path / "qrels.json"),
    ]
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "OMP_NUM_THREADS": "2"}
    r = memlimit.run_limited(argv, 200, env=env, timeout=300)
    assert r.completed, r.stderr[-2000:]
    assert r.peak_mb is None or r.peak_mb <= 200
    got = json.loads(r.stdout)
    in_memory = np.load(path)  # in this process: no limit
    expected = ee.evaluate_qrels(
        queries,
        in_memory,
        qrels,
        query_ids=range(n_q),
        doc_ids=range(n),
        metrics=["ndcg@10", "map", "recall@100"],
    )
    for name, values in expected.per_query.items():
        np.testing.assert_array_equal(np.asarray(got[name]), values)
    # independent check of one metric: recall@100 from a brute-force float32 cosine ranking
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    scores = unit(queries) @ unit(in_memory).T
    for i in range(n_q):
        top = set(np.argsort(-scores[i], kind="stable")[:100].tolist())
        rel = [int(d) for d in qrels[str(i)]]
        assert got["recall@100"][i] == pytest.approx(sum(d in top for d in rel) / 3, abs=1e-12)


def test_only_missing_judged_queries():
    corpus = np.eye(4, dtype=np.float32)
    res = ee.evaluate_qrels(
        corpus[:2],
        corpus,
        {"other": {"0": 1}},
        query_ids=["a", "b"],
        doc_ids=range(4),
        metrics=["map", "precision@2"],
        missing="zero",
    )
    # "other" has no embedding: it counts as 0; a and b have no judgments: skipped
    assert res["map"] == 0.0 and res.n_missing == 1 and res.n_skipped == 2
    assert np.isnan(res.per_query["map"][:2]).all()
    assert res.n_evaluated == 1 and res.run() == {}  # no query was ranked


def test_a_query_given_no_judgments_is_skipped_as_pytrec_eval_skips_it():
    # {"q0": {}}: q0 is embedded but judged nothing; pytrec_eval leaves it out of its results,
    # so it is skipped (NaN, not in the mean), with missing="zero" too
    qrels = {"q0": {}, "q1": {"a": 1}, "q2": {}}
    run = {"q0": {"a": 1.0}, "q1": {"a": 1.0}}
    want = pytrec_eval.RelevanceEvaluator(qrels, {"map"}).evaluate(run)
    assert list(want) == ["q1"]
    for missing in ("error", "zero"):
        res = ee.evaluate_qrels(
            np.float32([[1, 0], [0, 1]]), np.float32([[1, 0]]), qrels, query_ids=["q0", "q1"],
            doc_ids=["a"], metrics=["map"], missing=missing,
        )  # fmt: skip
        assert np.isnan(res.per_query["map"][0]) and res.per_query["map"][1] == want["q1"]["map"]
        assert res["map"] == 1.0 and res.n_skipped == 1 and res.n_missing == 0
    with pytest.raises(InputError, match="qrels judge no document"):
        ee.evaluate_qrels(np.float32([[1, 0]]), np.float32([[1, 0]]), {"q0": {}},
                          query_ids=["q0"], doc_ids=["a"])  # fmt: skip


def test_zero_query_ties_with_every_document():
    # a zero query scores 0 against every document under cosine: one tie over the corpus
    rng = np.random.default_rng(15)
    corpus = rng.standard_normal((3000, 8)).astype(np.float32)
    queries = np.zeros((2, 8), np.float32)
    qrels = {"0": {"5": 1, "2999": 1}, "1": {"17": 2}}
    res = ee.evaluate_qrels(
        queries,
        corpus,
        qrels,
        query_ids=["0", "1"],
        doc_ids=range(3000),
        metrics=["precision@10", "map", "mrr"],
        block_size=700,
    )
    # ties="index": rank = row + 1
    assert res.per_query["mrr"].tolist() == [1 / 6, 1 / 18]
    assert res.per_query["map"].tolist() == pytest.approx([(1 / 6 + 2 / 3000) / 2, 1 / 18])
    assert res.per_query["precision@10"].tolist() == [0.1, 0.0]


def test_result_read_back_from_json_keeps_missing_count_and_refuses_the_run(tmp_path):
    # One judged query ("qx") has no embedding: counted as 0 under missing="zero".
    docs = np.float32([[1, 0], [0.8, 0.6], [0, 1], [-1, 0]])
    qrels = {"q1": {"d2": 1}, "q2": {"d0": 1}, "qx": {"d1": 1}}
    res = ee.evaluate_qrels(
        np.float32([[0, 1], [1, 0]]), docs, qrels, query_ids=["q1", "q2"],
        doc_ids=["d0", "d1", "d2", "d3"], metrics=["mrr", "ndcg@2"], missing="zero",
    )  # fmt: skip
    back = type(res).from_json(res.to_json())
    assert (res.n_missing, back.n_missing) == (1, 1)
    assert back.per_query["mrr"].tolist() == [1.0, 1.0, 0.0]  # each query's nearest is its doc
    assert back.metrics == res.metrics and "1 missing (zero)" in repr(back)
    # The JSON keeps no run: writing one would give an empty TREC file, not an error.
    with pytest.raises(InputError, match="read back from JSON"):
        back.write_run(tmp_path / "run.txt")
    with pytest.raises(InputError, match="read back from JSON"):
        back.to_html(tmp_path / "page.html")
    assert not (tmp_path / "run.txt").exists() and not (tmp_path / "page.html").exists()
    assert list(res.run()["q1"]) == ["d2", "d1"]  # the original still holds its run
