"""The qrels benchmark's synthetic data and its pytrec_eval reference (``benchmarks.bench_qrels``),
on a tiny size, without timings."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import bench_qrels as bq

N, NQ, DIM, DEPTH = 3_000, 12, 768, 200


@pytest.fixture(scope="module")
def data():
    return bq.make_qrels_data(N, NQ, DIM, seed=1)


@pytest.fixture(scope="module")
def corpus(data):
    return bq.make_corpus(data)


def test_ids_and_qrels(data):
    assert data.query_ids[:2] == ["q0", "q1"] and data.doc_ids[-1] == f"d{N - 1}"
    assert list(data.qrels) == data.query_ids
    for qid, judged in data.qrels.items():
        assert set(judged.values()) <= {0, 1, 2, 3}
        assert max(judged.values()) >= 1, qid  # every query has a relevant document
    n_judged = sum(len(j) for j in data.qrels.values())
    assert n_judged == data.judged_rows.size <= N // 3
    pos = data.positives()
    assert [len(p) for p in pos] == [sum(g >= 1 for g in j.values()) for j in data.qrels.values()]


def test_corpus_is_seeded_and_has_exact_ties(data, corpus, tmp_path):
    assert corpus.shape == (N, DIM) and corpus.dtype == np.float32
    np.testing.assert_array_equal(corpus, bq.make_corpus(bq.make_qrels_data(N, NQ, DIM, seed=1)))
    norms = np.linalg.norm(corpus, axis=1)
    assert norms.min() > 0.49 and norms.max() < 2.01  # cosine has something to normalise
    # Duplicates: bit-identical copies of judged rows at unjudged ids.
    np.testing.assert_array_equal(corpus[data.dup_dst], corpus[data.dup_src])
    judged = {d for j in data.qrels.values() for d in j}
    assert not {data.doc_ids[i] for i in data.dup_dst} & judged
    assert {data.doc_ids[i] for i in data.dup_src} <= judged
    # A judged row sits at its drawn cosine to its query.
    u = data.queries[data.judged_query] / np.linalg.norm(
        data.queries[data.judged_query], axis=1, keepdims=True
    )
    x = corpus[data.judged_rows] / norms[data.judged_rows, None]
    np.testing.assert_allclose(np.einsum("ij,ij->i", x, u), data.judged_cosine, atol=1e-5)
    # The memory-mapped file holds the same rows.
    path = tmp_path / "c.npy"
    bq.write_corpus_npy(data, str(path))
    np.testing.assert_array_equal(np.load(path, mmap_mode="r"), corpus)


def _brute_force_run(data, corpus, depth):
    q = data.queries / np.linalg.norm(data.queries, axis=1, keepdims=True)
    c = corpus / np.linalg.norm(corpus, axis=1, keepdims=True)
    s = q @ c.T
    top = np.argsort(-s, axis=1, kind="stable")[:, :depth]
    return {
        qid: {data.doc_ids[j]: float(s[i, j]) for j in top[i]}
        for i, qid in enumerate(data.query_ids)
    }


def test_pytrec_reference(data, corpus):
    pytest.importorskip("pytrec_eval")
    run = _brute_force_run(data, corpus, DEPTH)
    values = bq.pytrec_values(data.qrels, run, DEPTH)
    assert list(values) == bq.metric_names(DEPTH)
    for name, v in values.items():
        assert 0.0 < v <= 1.0, name
    per_query = bq.pytrec_values(data.qrels, run, DEPTH, per_query=True)
    assert all(len(v) == NQ for v in per_query.values())
    assert values["precision@10"] == pytest.approx(
        np.mean(list(per_query["precision@10"].values()))
    )


def test_mrr_at_10_is_recip_rank_of_the_top_10():
    pytest.importorskip("pytrec_eval")
    qrels = {"q0": {"d11": 1, "d3": 0}, "q1": {"d0": 2}}
    scores = {f"d{j}": 1.0 - j / 100 for j in range(20)}  # d0 first, d19 last
    run = {"q0": dict(scores), "q1": dict(scores)}
    values = bq.pytrec_values(qrels, run, 100, per_query=True)
    assert values["mrr@10"] == {"q0": 0.0, "q1": 1.0}  # the hit at rank 12 is past the cut
    # Equal scores: trec_eval's order is by document id, descending ("d9" before "d10").
    tied = {"q0": {"d10": 0.5, "d9": 0.5}, "q1": {"d0": 0.5}}
    assert list(bq.top_of_run(tied, 1)["q0"]) == ["d9"]


def test_memory_budget_reaches_the_children_only_when_given():
    import argparse

    args = argparse.Namespace(corpus=10, queries=2, dim=4, depth=100, seed=0, memory_budget=None)
    assert "--memory-budget" not in bq.child_args(args)
    args.memory_budget = 2048
    assert bq.child_args(args)[-2:] == ["--memory-budget", "2048"]
