"""``evaluate_qrels(..., shards=)`` and ``client=``: the corpus scanned in pieces (here or on Dask
workers) gives the unsharded numbers bit for bit, and a float64 brute force agrees."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import embedeval as ee
from embedeval.utils.errors import InputError

METRICS = ["map", "ndcg", "mrr", "recall@5", "ndcg@10", "r_precision"]


@pytest.fixture(scope="module")
def data():
    """Integer-valued rows (exact ties) duplicated across every shard boundary used below, and
    near-ties (a row and the same row nudged by one float32 step), with graded qrels that judge
    duplicates and near-ties of each query's best documents."""
    rng = np.random.default_rng(3)
    n, d = 600, 6
    corpus = rng.integers(-3, 4, (n, d)).astype(np.float32)
    corpus[300:340] = corpus[:40]  # copies in another shard
    corpus[500:520] = corpus[250:270]
    near = corpus[100:120].copy()
    near[:, 0] = np.nextafter(near[:, 0], np.float32(np.inf))
    corpus[560:580] = near
    queries = rng.integers(-3, 4, (25, d)).astype(np.float32)
    queries[:5] = corpus[:5]  # queries equal to duplicated rows
    doc_ids = [f"d{v:04d}" for v in rng.permutation(n)]
    query_ids = [f"q{i}" for i in range(25)]
    qrels = {}
    for i, qid in enumerate(query_ids[:22]):  # q22..q24 have no judgments
        judged = [*rng.choice(n, 12, replace=False).tolist(), i, 300 + i, 100 + i, 560 + i]
        qrels[qid] = {doc_ids[r]: int(rng.integers(0, 3)) for r in judged}
    return queries, corpus, qrels, query_ids, doc_ids


def _run(data, corpus, **kw):
    queries, _, qrels, query_ids, doc_ids = data
    # excluded pairs in every shard: a query's duplicated judged row, and rows near the cuts
    exclude = {
        qid: [doc_ids[300 + i], doc_ids[36], doc_ids[311]] for i, qid in enumerate(query_ids)
    }
    return ee.evaluate_qrels(
        queries, corpus, qrels, query_ids=query_ids, doc_ids=doc_ids, metrics=METRICS,
        run_depth=12, block_size=64, progress=False, exclude=exclude, **kw,
    )  # fmt: skip


def _assert_same(a, b):
    for name in METRICS:
        np.testing.assert_array_equal(a.per_query[name], b.per_query[name])
    np.testing.assert_array_equal(a.judged_ranks, b.judged_ranks)
    np.testing.assert_array_equal(a.run_rows, b.run_rows)
    np.testing.assert_array_equal(a.run_scores, b.run_scores)


@pytest.mark.parametrize("ties", ["index", "trec_eval"])
@pytest.mark.parametrize("distance", ["cosine", "euclidean", "inner_product"])
def test_shards_bit_identical(data, tmp_path, ties, distance):
    corpus = data[1]
    whole = _run(data, corpus, ties=ties, distance=distance)
    assert whole.settings["shards"] == 1
    split = _run(data, corpus, ties=ties, distance=distance, shards=4)
    assert split.settings["shards"] == 4
    _assert_same(whole, split)
    cuts = [0, 37, 310, 505, 600]  # duplicates and near-ties straddle every cut
    pieces = [corpus[a:b] for a, b in itertools.pairwise(cuts)]
    _assert_same(whole, _run(data, None, ties=ties, distance=distance, shards=pieces))
    paths = []
    for i, p in enumerate(pieces):
        paths.append(tmp_path / f"part{i}.npy")
        np.save(paths[-1], p)
    _assert_same(whole, _run(data, None, ties=ties, distance=distance, shards=paths))


def test_dask_bit_identical(data, tmp_path):
    distributed = pytest.importorskip("distributed")
    corpus = data[1]
    np.save(tmp_path / "a.npy", corpus[:250])
    np.save(tmp_path / "b.npy", corpus[250:])
    with (
        distributed.LocalCluster(
            processes=False, n_workers=2, threads_per_worker=1, dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        for ties in ("index", "trec_eval"):
            whole = _run(data, corpus, ties=ties)
            on_workers = _run(data, corpus, ties=ties, backend="dask", client=client)
            assert on_workers.settings["shards"] == 2  # one per worker
            _assert_same(whole, on_workers)
            files = [tmp_path / "a.npy", tmp_path / "b.npy"]
            _assert_same(
                whole, _run(data, None, ties=ties, backend="dask", client=client, shards=files)
            )
        with pytest.raises(InputError, match="backend='dask'"):
            _run(data, corpus, client=client)
        # a float64 memory map (read as float32 rows): its pieces go to the workers as stored
        np.save(tmp_path / "c64.npy", corpus.astype(np.float64))
        mapped = np.load(tmp_path / "c64.npy", mmap_mode="r")
        _assert_same(_run(data, corpus), _run(data, mapped, backend="dask", client=client))


def test_one_piece_and_more_shards_than_rows(data, tmp_path):
    corpus = data[1]
    whole = _run(data, corpus)
    np.save(tmp_path / "all.npy", corpus)
    _assert_same(whole, _run(data, None, shards=[tmp_path / "all.npy"]))
    queries, _, qrels, query_ids, doc_ids = data
    small = {q: {d: g for d, g in v.items() if d in doc_ids[:3]} for q, v in qrels.items()}
    a = ee.evaluate_qrels(queries, corpus[:3], small, query_ids=query_ids, doc_ids=doc_ids[:3],
                          metrics=METRICS, progress=False)  # fmt: skip
    b = ee.evaluate_qrels(queries, corpus[:3], small, query_ids=query_ids, doc_ids=doc_ids[:3],
                          metrics=METRICS, progress=False, shards=5)  # fmt: skip
    assert b.settings["shards"] == 3
    _assert_same(a, b)


def _brute_force(queries, corpus, judged_rows, doc_ids=None):
    """Rank (1-based) of each judged row by float64 inner products, plain loops (the integer
    inputs make every float64 sum exact); equal scores by corpus row, or (``doc_ids``) by doc
    id descending, trec_eval's order."""
    q64, c64 = queries.astype(np.float64), corpus.astype(np.float64)
    ranks = []
    for i, rows in enumerate(judged_rows):
        scores = [float(np.dot(q64[i], c64[j])) for j in range(len(c64))]
        out = {}
        for r in rows:
            out[r] = 1 + sum(
                1
                for j, s in enumerate(scores)
                if s > scores[r]
                or (s == scores[r] and (j < r if doc_ids is None else doc_ids[j] > doc_ids[r]))
            )
        ranks.append(out)
    return ranks


def test_shards_match_a_float64_brute_force(data):
    queries, corpus, qrels, query_ids, doc_ids = data
    res = ee.evaluate_qrels(
        queries, None, qrels, query_ids=query_ids, doc_ids=doc_ids, metrics=METRICS,
        distance="inner_product", run_depth=12, block_size=64, progress=False,
        shards=[corpus[:333], corpus[333:]],
    )  # fmt: skip
    row_of = {d: j for j, d in enumerate(doc_ids)}
    judged = [[row_of[d] for d in qrels[qid]] for qid in query_ids[:22]]
    truth = _brute_force(queries, corpus, judged)
    for i, qid in enumerate(query_ids[:22]):
        grades = qrels[qid]
        ranks = sorted(truth[i][row_of[d]] for d, g in grades.items() if g >= 1)
        n_rel = len(ranks)
        ap = sum((k + 1) / r for k, r in enumerate(ranks)) / n_rel if n_rel else 0.0
        recall5 = sum(r <= 5 for r in ranks) / n_rel if n_rel else 0.0
        assert res.per_query["map"][i] == pytest.approx(ap, abs=1e-12)
        assert res.per_query["recall@5"][i] == pytest.approx(recall5, abs=1e-12)
        lo, hi = res.judged_lims[i], res.judged_lims[i + 1]
        for row, rank, grade in zip(
            res.judged_rows[lo:hi], res.judged_ranks[lo:hi], res.judged_grades[lo:hi], strict=True
        ):
            if grade >= 1 or rank <= 12:  # relevant ones at any depth, others within the run
                assert rank == truth[i][int(row)]


@pytest.mark.parametrize("ties", ["index", "trec_eval"])
def test_exact_integer_scores_in_shards_match_a_float64_brute_force(data, monkeypatch, ties):
    # integers only (the nudged rows restored): the float32 scores are exact, so each shard
    # counts the ties of judged documents that lie in other shards by their tie keys, and
    # nothing is re-scored in float64 (a float64 key fails the test)
    import embedeval.engine.corpus as corpus_engine

    def refuse(*args, **kwargs):
        raise AssertionError("exact scores need no float64 key")

    queries, corpus, qrels, query_ids, doc_ids = data
    corpus = corpus.copy()
    corpus[560:580] = corpus[100:120]  # exact copies instead of near-ties
    monkeypatch.setattr(corpus_engine, "rank_keys", refuse)
    kw = dict(query_ids=query_ids, doc_ids=doc_ids, metrics=METRICS, distance="inner_product",
              run_depth=12, block_size=64, progress=False, ties=ties)  # fmt: skip
    whole = ee.evaluate_qrels(queries, corpus, qrels, **kw)
    split = ee.evaluate_qrels(queries, None, qrels, shards=[corpus[:333], corpus[333:]], **kw)
    _assert_same(whole, split)
    _assert_same(whole, ee.evaluate_qrels(queries, corpus, qrels, shards=3, **kw))
    row_of = {d: j for j, d in enumerate(doc_ids)}
    judged = [[row_of[d] for d in qrels[qid]] for qid in query_ids[:22]]
    truth = _brute_force(queries, corpus, judged, doc_ids if ties == "trec_eval" else None)
    for i in range(22):
        lo, hi = split.judged_lims[i], split.judged_lims[i + 1]
        for row, rank, grade in zip(
            split.judged_rows[lo:hi],
            split.judged_ranks[lo:hi],
            split.judged_grades[lo:hi],
            strict=True,
        ):
            if grade >= 1 or rank <= 12:  # relevant ones at any depth, others within the run
                assert rank == truth[i][int(row)]


def _cosine_key(q: np.ndarray, x: np.ndarray) -> float:
    """The float64 cosine key (smaller is better) summed in column order: -sign(s) s^2 / |x|^2."""
    s = n = 0.0
    for a, b in zip(q.astype(np.float64), x.astype(np.float64), strict=True):
        s += a * b
    for b in x.astype(np.float64):
        n += b * b
    return -np.sign(s) * s * s / n


@pytest.mark.parametrize("shards", [None, 2, 3])
def test_multiples_across_shards_take_the_key_of_the_smallest_row(shards):
    # A (row 0) and B = 3A (row 16) are positive multiples: one cosine, whose float64 key is
    # A's (the smaller row), here larger than B's own by a rounding.  J (row 17) swaps B's
    # first two columns, which the query weighs equally: J's key equals B's own exactly.  So
    # J ties neither A nor B, and neither beats it; a shard holding B but not A must not let
    # B's own key tie J (and beat it on index)
    rng = np.random.default_rng(11)
    t, w = rng.standard_normal(2).astype(np.float32)
    q = np.float32([t, t, w])
    for _ in range(1000):  # rows of 22-bit mantissas: 3 x is exact in float32
        a = (rng.integers(2**21, 2**22, 3) * 2.0 ** rng.integers(-30, -20, 3)).astype(np.float32)
        a *= np.sign(q)  # near the query: ahead of every filler below
        b = a * np.float32(3)
        if a[0] != a[1] and _cosine_key(q, a) > _cosine_key(q, b):
            break
    assert a[0] != a[1] and _cosine_key(q, a) > _cosine_key(q, b)
    j = b[[1, 0, 2]]
    assert _cosine_key(q, j) == _cosine_key(q, b)
    better = q + rng.normal(0, 1e-3, (15, 3)).astype(np.float32)  # rows 1-15
    worse = rng.standard_normal((12, 3)).astype(np.float32) - 3 * q  # rows 18-29
    corpus = np.concatenate([a[None], better, b[None], j[None], worse]).astype(np.float32)
    keys = [_cosine_key(q, x) for x in corpus]
    keys[16] = keys[0]  # B takes A's key
    want = 1 + sum(k < keys[17] or (k == keys[17] and r < 17) for r, k in enumerate(keys))
    doc_ids = [f"d{r}" for r in range(corpus.shape[0])]
    res = ee.evaluate_qrels(
        q[None], corpus, {"q": {"d17": 1}}, query_ids=["q"], doc_ids=doc_ids,
        metrics=["mrr", "map"], distance="cosine", run_depth=2, shards=shards, n_threads=1,
    )  # fmt: skip
    assert res["mrr"] == 1 / want


def test_bad_shards(data, tmp_path):
    corpus = data[1]
    with pytest.raises(InputError, match="shards"):
        _run(data, corpus, shards=0)
    with pytest.raises(InputError, match=r"shards\[1\]"):
        _run(data, None, shards=[corpus[:300], np.zeros((300, 5), np.float32)])
    path = tmp_path / "corpus.npy"
    np.save(path, corpus)
    with pytest.raises(InputError, match=r"one str\. Pass it in a list: shards=\[.*corpus\.npy'\]"):
        _run(data, None, shards=str(path))
    with pytest.raises(InputError, match="shards"):
        _run(data, corpus, shards=2, backend="torch")
    with pytest.raises(InputError, match="corpus must be None"):
        _run(data, corpus, shards=[corpus[:300], corpus[300:]])
    with pytest.raises(InputError, match="doc_ids"):
        _run(data, None, shards=[corpus[:300]])
    with pytest.raises(InputError, match="client"):
        _run(data, corpus, backend="dask")


def test_dask_runs_repeated_on_the_same_corpus(data):
    # Each run scatters its shards and releases them when it ends.  Scattered under a key
    # derived from their content, the next run's shards would take the same keys, and the
    # scheduler, handling the earlier release late, dropped them under the running tasks
    # ("lost dependencies"): a run repeated in a notebook failed at random.
    distributed = pytest.importorskip("distributed")
    corpus = data[1]
    whole = _run(data, corpus)
    with (
        distributed.LocalCluster(
            processes=False, n_workers=2, threads_per_worker=1, dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        for _ in range(6):
            _assert_same(whole, _run(data, corpus, backend="dask", client=client, shards=3))


@pytest.mark.parametrize("distance", ["cosine", "euclidean", "inner_product"])
def test_a_bad_row_in_a_shard_is_named_by_its_corpus_row(data, distance):
    # each shard is scanned by itself; its error must count rows from the corpus's first
    corpus = data[1].copy()
    corpus[437, 2] = np.nan
    for shards in (None, 3, [corpus[:200], corpus[200:401], corpus[401:]]):
        whole = None if isinstance(shards, list) else corpus
        with pytest.raises(InputError, match="corpus row 437 holds NaN"):
            _run(data, whole, shards=shards, distance=distance)
