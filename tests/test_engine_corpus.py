"""The corpus engine's rankings are the float64 rankings of the float32 inputs: a brute-force
float64 oracle written here (plain column loops over float64 copies, stable sorts), checked
through evaluate_qrels (its run, and pytrec_eval on the oracle's ranking) on data where float32
scores cannot decide: a large common offset (Euclidean keys cancel in float32), near-ties one
float32 bit apart, and small-integer data with exact ties, duplicated rows and multiples."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import embedeval as ee

from .oracle import fixed_order_keys as oracle_keys
from .oracle import pytrec_measure

pytrec_eval = pytest.importorskip("pytrec_eval")

NAMES = ["ndcg@5", "map", "mrr", "recall@10", "precision@5", "r_precision"]
DEPTH = 12


# ---------------------------------------------------------------------------- the oracle
def oracle_scores(q: np.ndarray, keys: np.ndarray, distance: str) -> np.ndarray:
    """Scores from keys: -key, or the cosine sign(s) sqrt(s^2 / ||x||^2) / ||q||."""
    if distance != "cosine":
        return -keys
    q64 = q.astype(np.float64)
    q_sq = 0.0
    for j in range(q64.size):
        q_sq += q64[j] * q64[j]
    return -np.sign(keys) * np.sqrt(np.abs(keys)) / np.sqrt(q_sq)


def oracle_ranking(q, corpus, doc_ids, distance, ties):
    """Corpus rows in rank order and their scores."""
    keys = oracle_keys(q, corpus, distance)
    scores = oracle_scores(q, keys, distance)
    rows = list(range(corpus.shape[0]))
    if ties == "index":
        rows.sort(key=lambda r: (keys[r], r))
    else:  # trec_eval: score read as float32 descending, then doc id descending as strings
        read = scores.astype(np.float32)
        rows.sort(key=lambda r: doc_ids[r], reverse=True)
        rows.sort(key=lambda r: -read[r])  # stable
    return np.array(rows), scores[rows]


def check(queries, corpus, qids, dids, qrels, distance, ties, block_sizes, products=(), given=None):
    """``products``: keyword sets of further runs (another product), each bit-identical to
    the first, which the oracle checks.  ``given``: the corpus passed to the engine (default
    ``corpus``, the float32 rows the oracle ranks)."""
    runs = [{"block_size": b} for b in block_sizes] + [dict(p) for p in products]
    results = [
        ee.evaluate_qrels(
            queries,
            corpus if given is None else given,
            qrels,
            query_ids=qids,
            doc_ids=dids,
            metrics=list(NAMES),
            distance=distance,
            ties=ties,
            run_depth=DEPTH,
            n_threads=2,
            **kw,
        )
        for kw in runs
    ]
    run = {}
    for i, qid in enumerate(qids):
        rows, scores = oracle_ranking(queries[i], corpus, dids, distance, ties)
        got = results[0].run_rows[i]
        assert got.tolist() == rows[:DEPTH].tolist(), (qid, got, rows[:DEPTH])
        if ties == "trec_eval":  # the run holds the scores trec_eval reads
            scores = scores.astype(np.float32).astype(np.float64)
        np.testing.assert_array_equal(results[0].run_scores[i], scores[:DEPTH])
        # pytrec_eval reads the oracle's order through strictly decreasing scores
        run[qid] = {dids[r]: float(len(rows) - k) for k, r in enumerate(rows)}
    measures = {pytrec_measure(n)[0] for n in NAMES}
    expected = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
    for name in NAMES:
        key = pytrec_measure(name)[1]
        want = np.array([expected[q][key] for q in qids])
        np.testing.assert_allclose(results[0].per_query[name], want, rtol=0, atol=1e-12)
        for other in results[1:]:  # bit-identical whatever the block shapes
            np.testing.assert_array_equal(other.per_query[name], results[0].per_query[name])
            np.testing.assert_array_equal(other.run_rows, results[0].run_rows)
            np.testing.assert_array_equal(other.run_scores, results[0].run_scores)
    return results[0]


def judged(rng, n_docs, n_q, dids, close=None):
    """Graded qrels: a few random documents per query, plus ``close[i]`` (relevant) when given."""
    qrels = {}
    for i in range(n_q):
        docs = rng.choice(n_docs, 8, replace=False)
        grades = rng.choice([0, 1, 2], docs.size)
        qrels[f"q{i}"] = {dids[d]: int(g) for d, g in zip(docs, grades, strict=True)}
        if close is not None:
            for d, g in close[i]:
                qrels[f"q{i}"][dids[d]] = g
    return qrels


# ---------------------------------------------------------------------------- the cases
@pytest.mark.parametrize("ties", ["index", "trec_eval"])
def test_large_common_offset_euclidean(ties):
    # float32 keys ||x||^2 - 2 q.x near 8e6 cannot resolve distances of 1e-4: the engine centres
    rng = np.random.default_rng(0)
    n_docs, n_q, dim = 400, 12, 8
    classes = rng.normal(0, 0.02, (6, dim))
    corpus = 1000 + classes[rng.integers(0, 6, n_docs)] + rng.normal(0, 0.01, (n_docs, dim))
    corpus = corpus.astype(np.float32)
    queries = 1000 + classes[rng.integers(0, 6, n_q)] + rng.normal(0, 0.01, (n_q, dim))
    queries = queries.astype(np.float32)
    dids = [f"d{v}" for v in rng.permutation(n_docs)]
    qrels = judged(rng, n_docs, n_q, dids)
    qids = [f"q{i}" for i in range(n_q)]
    check(queries, corpus, qids, dids, qrels, "euclidean", ties, [None, 37, 100])


@pytest.mark.parametrize("distance", ["euclidean", "inner_product", "cosine"])
@pytest.mark.parametrize("ties", ["index", "trec_eval"])
def test_near_ties_one_float32_bit_apart(distance, ties):
    # each query has pairs x, x' (x' = x with one coordinate one float32 step away) near the top
    # and deep in the ranking, one relevant and one not: only float64 orders them
    rng = np.random.default_rng(1)
    n_base, n_q, dim = 300, 10, 8
    base = rng.standard_normal((n_base, dim)).astype(np.float32)
    queries = rng.standard_normal((n_q, dim)).astype(np.float32)
    extra, close = [], []
    for i in range(n_q):
        pairs = []
        for scale in (0.999, 0.0):  # one pair at the top, one deep
            x = (queries[i] * scale + rng.normal(0, 0.05, dim)).astype(np.float32)
            y = x.copy()
            j = int(rng.integers(dim))
            y[j] = np.nextafter(y[j], np.float32(rng.choice([-np.inf, np.inf])))  # float32 step
            a = n_base + len(extra)
            extra += [x, y]
            pairs += [(a, 1), (a + 1, 0)] if rng.random() < 0.5 else [(a, 0), (a + 1, 2)]
        close.append(pairs)
    corpus = np.concatenate([base, np.array(extra, np.float32)])
    n_docs = corpus.shape[0]
    dids = [f"d{v}" for v in rng.permutation(n_docs)]
    qrels = judged(rng, n_docs, n_q, dids, close)
    qids = [f"q{i}" for i in range(n_q)]
    check(queries, corpus, qids, dids, qrels, distance, ties, [None, 40, 64])


def exact_scores_only(monkeypatch, exact):
    """``exact``: the scan must take its float32 scores as exact (any float64 key fails the
    test); else they are not taken as exact (the band decides these integers' ties)."""
    import embedeval.engine.corpus as corpus_engine

    def refuse(*args, **kwargs):
        raise AssertionError("exact scores need no float64 key")

    if exact:
        monkeypatch.setattr(corpus_engine, "rank_keys", refuse)
    else:
        monkeypatch.setattr(corpus_engine, "integer_scores", lambda *args: None)


@pytest.mark.parametrize("split", [False, True, "from the top lists"])
@pytest.mark.parametrize(
    ("distance", "exact"),
    [("euclidean", True), ("euclidean", False), ("inner_product", True),
     ("inner_product", False), ("cosine", False)],
)  # fmt: skip
@pytest.mark.parametrize("ties", ["index", "trec_eval"])
def test_small_integers_exact_ties_and_duplicates(monkeypatch, distance, exact, ties, split):
    # split: 512 bytes of scores per product, so each block splits into parts of 32 or 33
    # corpus rows, one product each (the judged documents' ranks included); "from the top
    # lists": the judged documents' ranks read from the decided lists (the wide-band path).
    # exact: the float32 scores of these integers are the exact scores, taken as they are
    # (cosine scores are quotients: never)
    import embedeval.engine.corpus as corpus_engine

    exact_scores_only(monkeypatch, exact)
    if split is True:
        monkeypatch.setattr(corpus_engine, "_CHUNK_BYTES", 512)
    if split == "from the top lists":
        monkeypatch.setattr(corpus_engine, "_shared_near", lambda n_near, n_candidates: True)
    rng = np.random.default_rng(2)
    n_docs, n_q, dim = 300, 15, 3
    corpus = rng.integers(-2, 3, (n_docs, dim)).astype(np.float32)
    corpus[rng.choice(n_docs, 60, replace=False)] = corpus[rng.choice(n_docs, 60)]
    corpus[:4] = [[1, 1, 0], [3, 3, 0], [2, 2, 0], [0, 0, 0]]  # cosine ties, a zero row
    queries = rng.integers(-2, 3, (n_q, dim)).astype(np.float32)
    queries[0] = [1, 2, 0]
    dids = [f"d{v}" for v in rng.permutation(n_docs)]
    close = [[(0, 1), (1, 0), (2, 2)]] * n_q
    qrels = judged(rng, n_docs, n_q, dids, close)
    qids = [f"q{i}" for i in range(n_q)]
    check(queries, corpus, qids, dids, qrels, distance, ties, [None, 37, 64])


@pytest.mark.parametrize("codes", ["signs", "bits"])
@pytest.mark.parametrize("ties", ["index", "trec_eval"])
def test_binary_codes_tie_in_bulk_without_float64_keys(monkeypatch, codes, ties):
    # 16-bit codes: 17 distances for 1,500 documents, so nearly every judged document ties
    # with dozens of others (the run and full-depth metrics alike); the scores are exact, and
    # nothing is re-scored in float64
    exact_scores_only(monkeypatch, True)
    rng = np.random.default_rng(11)
    n_docs, n_q, dim = 1500, 8, 16
    corpus = rng.integers(0, 2, (n_docs, dim)).astype(np.float32)
    queries = rng.integers(0, 2, (n_q, dim)).astype(np.float32)
    if codes == "signs":
        corpus, queries = 2 * corpus - 1, 2 * queries - 1
        queries[::2] = rng.integers(-2, 3, (n_q // 2, dim))  # norms like sqrt(37): cosines
        queries[::2, 0] = 3  # that float32 rounds (no zero row)
    dids = [f"d{v}" for v in rng.permutation(n_docs)]
    qrels = judged(rng, n_docs, n_q, dids)
    qids = [f"q{i}" for i in range(n_q)]
    # cosine on codes of one norm ({-1, 1}) runs as the inner product, reporting cosines
    distances = ["euclidean", "inner_product"] + (["cosine"] if codes == "signs" else [])
    for distance in distances:
        res = check(queries, corpus, qids, dids, qrels, distance, ties, [None, 100])
        assert res.settings["precision"] == "float32" and res.settings["distance"] == distance


def test_exact_scores_keep_no_near_candidates_and_list_no_near_documents(monkeypatch):
    # 8-bit codes tie in bulk at the 10th score: the banded scan keeps every tied document as
    # a candidate (and the counter lists them as near documents), the exact one keeps the
    # first 10 and counts the rest; the same decided lists and ranks either way
    from embedeval.engine import corpus as engine

    rng = np.random.default_rng(12)
    c = rng.integers(0, 2, (600, 8)).astype(np.float32)
    q = rng.integers(0, 2, (5, 8)).astype(np.float32)
    none = engine.Pairs(np.zeros(0, np.int64), np.zeros(0, np.int64))
    keys = engine.tie_keys(None, 600, "index")
    pairs = engine.Pairs(np.repeat(np.arange(5), 3), rng.choice(600, 15))
    out = {}
    for exact in (False, True):
        scan = engine.CorpusScan(q, None, "inner_product", 10, keys, none, exact=exact)
        query, codes, _ = engine.scan_top(c, scan)
        counted = engine._counting_pass(c, scan, pairs, engine.score_bounds(c, scan, pairs))
        out[exact] = (np.bincount(query), engine.decide_top(c, scan, query, codes, True),
                      counted, engine.scan_ranks(c, scan, pairs, counted.bounds))  # fmt: skip
    assert (out[True][0] == 10).all() and (out[False][0] > 10).all()
    for a, b in zip(out[True][1], out[False][1], strict=True):
        np.testing.assert_array_equal(a, b)
    assert not out[True][2].near and sum(p.size for p, _ in out[False][2].near) > 100
    np.testing.assert_array_equal(out[True][3], out[False][3])


def test_judged_ranks_from_the_top_lists_when_nothing_is_retrieved(monkeypatch):
    # the judged ranks read from the decided lists (the wide-band path), one query with every
    # document excluded (its judged document is never retrieved: 0 everywhere), the other's
    # relevant document 2nd of 2
    import embedeval.engine.corpus as corpus_engine

    monkeypatch.setattr(corpus_engine, "_shared_near", lambda n_near, n_candidates: True)
    q = np.float32([[1, 0], [1, 0]])
    c = np.float32([[1, 0], [0, 1]])
    res = ee.evaluate_qrels(
        q, c, {"a": {"d0": 1}, "b": {"d1": 1}}, query_ids=["a", "b"], doc_ids=["d0", "d1"],
        metrics=["mrr@10", "ndcg@10"], exclude={"a": ["d0", "d1"]},
    )  # fmt: skip
    assert res.per_query["mrr@10"].tolist() == [0.0, 0.5]
    np.testing.assert_allclose(res.per_query["ndcg@10"], [0.0, 1 / np.log2(3)], rtol=1e-15)


TORCH_PRODUCTS = [
    {"backend": "torch", "device": "cpu", "precision": "bf16"},
    {"backend": "torch", "device": "cpu", "precision": "bf16", "block_size": 40},
    {"backend": "torch", "device": "cpu", "precision": "float32"},
]


@pytest.mark.parametrize("distance", ["euclidean", "inner_product", "cosine"])
@pytest.mark.parametrize("ties", ["index", "trec_eval"])
def test_bfloat16_filter_rows_equal_in_bfloat16_and_near_ties(distance, ties):
    # per query, rows equal once rounded to bfloat16 (8-bit mantissa) but not in float32, near
    # the top and deep, one relevant and one not; a common offset for the Euclidean case
    pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    n_base, n_q, dim = 300, 10, 8
    offset = 100.0 if distance == "euclidean" else 0.0
    base = rng.standard_normal((n_base, dim)) + offset
    queries = (rng.standard_normal((n_q, dim)) + offset).astype(np.float32)
    extra, close = [], []
    for i in range(n_q):
        pairs = []
        for scale in (0.999, 0.0):
            x = (queries[i] - offset) * scale + rng.normal(0, 0.05, dim) + offset
            x = x.astype(np.float32)
            bits = x.view(np.uint32) & np.uint32(0xFFFF0000)  # a bfloat16 value, exactly
            x = (bits | np.uint32(0x1000)).view(np.float32)  # a quarter of its step above
            y = (bits | rng.integers(0x0001, 0x7FFF, dim).astype(np.uint32)).view(np.float32)
            a = n_base + len(extra)
            extra += [x, y]  # both round to the bfloat16 `bits`
            pairs += [(a, 1), (a + 1, 0)] if rng.random() < 0.5 else [(a, 0), (a + 1, 2)]
        close.append(pairs)
    corpus = np.concatenate([base.astype(np.float32), np.array(extra, np.float32)])
    n_docs = corpus.shape[0]
    dids = [f"d{v}" for v in rng.permutation(n_docs)]
    qrels = judged(rng, n_docs, n_q, dids, close)
    qids = [f"q{i}" for i in range(n_q)]
    check(queries, corpus, qids, dids, qrels, distance, ties, [None], TORCH_PRODUCTS)


@pytest.mark.parametrize("distance", ["euclidean", "inner_product", "cosine"])
def test_bfloat16_filter_small_integers_and_offsets(distance):
    # exact ties, duplicates and multiples (small integers), then the large common offset
    pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    n_docs, n_q, dim = 300, 15, 3
    corpus = rng.integers(-2, 3, (n_docs, dim)).astype(np.float32)
    corpus[rng.choice(n_docs, 60, replace=False)] = corpus[rng.choice(n_docs, 60)]
    corpus[:4] = [[1, 1, 0], [3, 3, 0], [2, 2, 0], [0, 0, 0]]
    queries = rng.integers(-2, 3, (n_q, dim)).astype(np.float32)
    dids = [f"d{v}" for v in rng.permutation(n_docs)]
    qrels = judged(rng, n_docs, n_q, dids, [[(0, 1), (1, 0), (2, 2)]] * n_q)
    qids = [f"q{i}" for i in range(n_q)]
    check(queries, corpus, qids, dids, qrels, distance, "index", [None], TORCH_PRODUCTS)
    if distance == "euclidean":
        classes = rng.normal(0, 0.02, (6, 8))
        far = 1000 + classes[rng.integers(0, 6, 400)] + rng.normal(0, 0.01, (400, 8))
        q_far = 1000 + classes[rng.integers(0, 6, 12)] + rng.normal(0, 0.01, (12, 8))
        dids = [f"d{v}" for v in rng.permutation(400)]
        qrels = judged(rng, 400, 12, dids)
        qids = [f"q{i}" for i in range(12)]
        far, q_far = far.astype(np.float32), q_far.astype(np.float32)
        check(q_far, far, qids, dids, qrels, distance, "trec_eval", [None], TORCH_PRODUCTS)


def test_written_run_reproduces_the_ranking_in_trec_eval(tmp_path):
    # near-ties one float32 bit apart: trec_eval reads scores as float32, so where the float64
    # scores round to one float32 value it ranks by doc id; ties="trec_eval" does the same, and
    # the run file carries the float64 scores exactly
    rng = np.random.default_rng(3)
    corpus = rng.standard_normal((200, 8)).astype(np.float32)
    queries = rng.standard_normal((6, 8)).astype(np.float32)
    corpus[1] = corpus[0]
    corpus[1, 3] = np.nextafter(corpus[0, 3], np.float32(1))
    queries[:] = corpus[0] + rng.normal(0, 1e-3, (6, 8)).astype(np.float32)
    dids = [f"d{i}" for i in range(200)]
    qids = [f"q{i}" for i in range(6)]
    qrels = {q: {"d0": 1, "d1": 0, "d7": 1} for q in qids}
    res = ee.evaluate_qrels(
        queries,
        corpus,
        qrels,
        query_ids=qids,
        doc_ids=dids,
        metrics=["mrr", "map"],
        distance="inner_product",
        ties="trec_eval",
        run_depth=200,
    )
    res.write_run(tmp_path / "run.txt")
    run: dict = {}
    for line in (tmp_path / "run.txt").read_text().splitlines():
        q, _, d, _, s, _ = line.split()
        run.setdefault(q, {})[d] = float(s)
    assert run == res.run()  # every float64 score read back exactly
    out = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank", "map"}).evaluate(run)
    for i, q in enumerate(qids):
        assert res.per_query["mrr"][i] == pytest.approx(out[q]["recip_rank"], abs=1e-12)
        assert res.per_query["map"][i] == pytest.approx(out[q]["map"], abs=1e-12)


@pytest.mark.parametrize("distance", ["euclidean", "inner_product", "cosine"])
def test_row_sums_are_the_column_loop_bit_for_bit(distance):
    # the corpus engine's float64 keys (sums over all rows, a column at a time) against the
    # column loop of decide.exact_keys, on random rows and small integers with multiples
    from embedeval.engine.corpus import CorpusScan, Pairs, pair_keys, tie_keys
    from embedeval.engine.decide import exact_keys

    none = Pairs(np.zeros(0, np.int64), np.zeros(0, np.int64))

    rng = np.random.default_rng(4)
    # 768 columns: several chunks of pairs on two threads; 1 and 15 pairs: a chunk of a few
    for dim, n in ((1, 400), (3, 400), (17, 400), (64, 400), (768, 3000), (768, 15), (40, 1)):
        x = rng.standard_normal((n, dim)).astype(np.float32)
        x[: n // 2] *= np.float32(1e6)  # magnitudes apart: the order of the sums shows
        ints = rng.integers(-2, 3, (n, dim)).astype(np.float32)
        ints[~ints.any(axis=1)] = 1
        ints[n // 2 : 2 * (n // 2)] = ints[: n // 2] * rng.integers(1, 4, (n // 2, 1))
        for rows in (x, ints):
            groups = np.sort(rng.integers(0, 9, n))
            queries = rng.standard_normal((9, dim)).astype(np.float32)
            keys = tie_keys(None, n, "index")
            scan = CorpusScan(queries, None, distance, 1, keys, none, raw=queries, n_threads=2)
            # every row once, then rows met by several pairs (a row read once per chunk)
            for at in (np.arange(n), rng.integers(0, n, n)):
                want = exact_keys(queries[groups], rows[at], distance, groups, at) + 0.0
                got = pair_keys(rows, scan, groups, at, groups)
                np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("distance", ["euclidean", "inner_product", "cosine"])
def test_score_bounds_hold_the_exact_score_tightly(distance):
    # each pair's exact score (fractions; the cosine's square roots in 60 decimal digits)
    # lies within its float64 bounds, themselves within 1e-12 of its magnitude, on rows of
    # mixed magnitudes far from the origin and a zero corpus row
    from decimal import Decimal, getcontext
    from fractions import Fraction

    from embedeval.engine.corpus import CorpusScan, Pairs, score_bounds, tie_keys

    getcontext().prec = 60
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((50, 96)) * np.exp(rng.normal(0, 2, (50, 96))) + 300).astype(
        np.float32
    )
    x[7] = 0
    q = (rng.standard_normal((6, 96)) + 300).astype(np.float32)
    # six queries in a piece of pairs (a dot product per pair), or two (one product with each)
    pairs = Pairs(
        np.concatenate([np.repeat(np.arange(6), 40), np.repeat([1, 4], 60)]),
        rng.integers(0, 50, 360),
    )
    none = Pairs(np.zeros(0, np.int64), np.zeros(0, np.int64))
    scan = CorpusScan(q, None, distance, 1, tie_keys(None, 50, "index"), none, raw=q)
    lo, hi = score_bounds(x, scan, pairs)
    two = score_bounds(x, scan, Pairs(pairs.query[240:], pairs.row[240:]))
    lo, hi = np.concatenate([lo[:240], two[0]]), np.concatenate([hi[:240], two[1]])
    for i, (a, b) in enumerate(zip(pairs.query, pairs.row, strict=True)):
        qa, xb = [Fraction(float(v)) for v in q[a]], [Fraction(float(v)) for v in x[b]]
        dot = sum(u * v for u, v in zip(qa, xb, strict=True))
        if distance == "euclidean":
            exact = -sum((u - v) ** 2 for u, v in zip(qa, xb, strict=True))
        elif distance == "inner_product":
            exact = dot
        else:
            norms = [Decimal(sum(v * v for v in r).numerator) / Decimal(
                sum(v * v for v in r).denominator) for r in (qa, xb)]  # fmt: skip
            denominator = norms[0].sqrt() * norms[1].sqrt()
            exact = 0 if not denominator else Decimal(dot.numerator) / Decimal(
                dot.denominator) / denominator  # fmt: skip
        exact = Fraction(exact)
        assert Fraction(lo[i]) <= exact <= Fraction(hi[i]), i
        magnitude = abs(float(exact)) + (1.0 if distance == "cosine" else 0.0)
        assert hi[i] - lo[i] <= 1e-12 * magnitude + 1e-299, i


@pytest.mark.parametrize(("seed", "piece_bytes"), [(2, 2 << 20), (3, 2 << 20), (4, 3000)])
def test_count_passing_counts_scores_above_and_at_each_threshold(monkeypatch, seed, piece_bytes):
    """Per pair (row, thresholds hi >= lo): scores strictly above ``hi`` and at or above
    ``lo``, and the columns of the scores between them where there are more than ``own``
    of them, checked by a plain loop; on scores rounded to one decimal (many equal to a
    threshold), NaN scores, NaN thresholds (excluded pairs, counting nothing), rows whose
    thresholds are all low (most scores pass), all high, equal (no range), or spread over
    the whole range of the scores, and a row without pairs.  With small pieces, the bucket
    numbers are formed two rows at a time."""
    import embedeval.engine.corpus as corpus_engine
    from embedeval.engine.corpus import _count_passing

    monkeypatch.setattr(corpus_engine, "_BUCKET_BYTES", piece_bytes)

    rng = np.random.default_rng(seed)
    s = np.round(rng.standard_normal((40, 300)), 1).astype(np.float32)
    s[rng.random(s.shape) < 0.05] = np.nan
    qs = np.sort(rng.integers(1, 40, 150))  # row 0 has no pair
    kind = rng.integers(0, 4, 40)[qs]
    level = np.select(
        [kind == 0, kind == 1, kind == 2],
        [-2.0 + np.round(rng.random(qs.size), 1), 1.5 + np.round(rng.random(qs.size), 1), 0.3],
        np.round(rng.uniform(-3, 3, qs.size), 1),
    )
    lo = level.astype(np.float32)
    hi = (level + np.where(kind == 2, 0.0, 0.1)).astype(np.float32)
    hi[::17] = lo[::17] = np.nan
    own = rng.integers(0, 2, qs.size)
    above, reach, at, col = _count_passing(s, hi, lo, qs, own)
    got = sorted(zip(at.tolist(), col.tolist(), strict=True))
    want = []
    for i in range(qs.size):
        row = s[qs[i]]
        assert above[i] == sum(1 for v in row if v > hi[i])
        assert reach[i] == sum(1 for v in row if v >= lo[i])
        between = [c for c, v in enumerate(row) if lo[i] <= v <= hi[i]]
        if len(between) > own[i]:
            want += [(i, c) for c in between]
    assert got == sorted(want)
    assert len(want) > 100
    # a limit on the near scores: met exactly, the same; one short, none are listed
    at, col = _count_passing(s, hi, lo, qs, own, len(want))[2:]
    assert sorted(zip(at.tolist(), col.tolist(), strict=True)) == sorted(want)
    assert _count_passing(s, hi, lo, qs, own, len(want) - 1)[2:] == (None, None)


@pytest.mark.parametrize(("seed", "ranked_by_column"), [(5, True), (6, False), (7, False)])
def test_count_ties_counts_higher_scores_and_equal_ones_of_smaller_tie_key(seed, ranked_by_column):
    """Exact scores: per pair, the scores of its row above its own, the equal ones whose tie
    rank is below the pair's, and all equal ones less its own document; checked by a plain
    loop on integer scores (most rows tie in bulk), NaN scores and NaN pair scores (excluded
    pairs, counting nothing), tie ranks that are the columns or a permutation of them, and pair
    ranks from 0 to the number of columns."""
    from embedeval.engine.corpus import _count_ties

    rng = np.random.default_rng(seed)
    s = rng.integers(-3, 4, (30, 200)).astype(np.float32)
    s[rng.random(s.shape) < 0.05] = np.nan
    qs = np.sort(rng.integers(1, 30, 120))  # row 0 has no pair
    score = rng.integers(-4, 5, qs.size).astype(np.float32)
    score[::13] = np.nan
    col_rank = None if ranked_by_column else rng.permutation(200)
    pair_rank = rng.integers(0, 201, qs.size)
    own = rng.integers(0, 2, qs.size)
    above, before, tied = _count_ties(s, score, qs, own, col_rank, pair_rank)
    rank = np.arange(200) if col_rank is None else col_rank
    for i in range(qs.size):
        row = s[qs[i]]
        if np.isnan(score[i]):
            assert (above[i], before[i]) == (0, 0)
            continue
        assert above[i] == sum(1 for v in row if v > score[i])
        equal = [c for c, v in enumerate(row) if v == score[i]]
        assert before[i] == sum(1 for c in equal if rank[c] < pair_rank[i])
        assert tied[i] == max(len(equal) - own[i], 0)
    assert before.sum() > 500


@pytest.mark.parametrize("ties", ["index", "trec_eval"])
def test_exact_tie_ranks_with_excluded_documents_match_a_loop(ties):
    """exact_tie_ranks on integer scores with excluded (query, document) pairs, some of them
    the pairs asked about: per pair, 1 + the documents that score higher or equal with a smaller
    tie key, the equal ones before it, and the equal ones besides itself, every excluded
    document left out (an excluded pair's own document included), by a plain loop; and an
    exact scan refuses to list ties."""
    from embedeval.engine.corpus import (
        CorpusScan,
        Pairs,
        exact_tie_ranks,
        scan_ranks,
        score_bounds,
        tie_keys,
    )

    rng = np.random.default_rng(8)
    n_docs, n_q = 400, 6
    corpus = rng.integers(-1, 2, (n_docs, 3)).astype(np.float32)
    queries = rng.integers(-1, 2, (n_q, 3)).astype(np.float32)
    keys = tie_keys([f"d{rng.integers(10**6)}" for _ in range(n_docs)], n_docs, ties)
    drawn = zip(
        rng.integers(0, n_q, 150).tolist(), rng.integers(0, n_docs, 150).tolist(), strict=True
    )
    excluded = sorted(set(drawn))
    asked = {(q, r) for q in range(n_q) for r in rng.integers(0, n_docs, 20).tolist()}
    asked = sorted(asked | set(excluded[::10]))  # some excluded pairs asked about too
    as_pairs = lambda p: Pairs(*(np.array(c, dtype=np.int64) for c in zip(*p, strict=True)))  # noqa: E731
    pairs = as_pairs(asked)
    scan = CorpusScan(queries, None, "inner_product", 5, keys, as_pairs(excluded), exact=True,
                      ties=ties)  # fmt: skip
    rank, before, tied = exact_tie_ranks(corpus, scan, pairs)
    excluded = set(excluded)
    scores = queries.astype(np.float64) @ corpus.T.astype(np.float64)
    for i, (q, r) in enumerate(zip(pairs.query.tolist(), pairs.row.tolist(), strict=True)):
        live = [d for d in range(n_docs) if (q, d) not in excluded and d != r]
        equal = [d for d in live if scores[q, d] == scores[q, r]]
        ahead = [d for d in equal if keys[d] < keys[r]]
        higher = [d for d in live if scores[q, d] > scores[q, r]]
        assert (rank[i], before[i], tied[i]) == (1 + len(higher) + len(ahead), len(ahead),
                                                 len(equal)), i  # fmt: skip
    assert len(set(asked) & excluded) >= 10
    with pytest.raises(ValueError, match="exact_tie_ranks"):
        scan_ranks(corpus, scan, pairs, score_bounds(corpus, scan, pairs), equal=True)
    from embedeval.engine.corpus import BeatCounter

    outside = Pairs(np.array([0]), np.array([n_docs + 3]))  # another shard's row
    with pytest.raises(ValueError, match="pair_keys"):
        BeatCounter(scan, outside, (np.zeros(1), np.zeros(1)))


@pytest.mark.parametrize("ties", ["index", "trec_eval"])
@pytest.mark.parametrize("block", [64, 600])
def test_banded_ranks_of_excluded_documents_with_identical_twins(ties, block):
    """scan_ranks (float scores, bands) of pairs some of which are excluded, on documents with
    one identical twin each (exact ties): 1 + the non-excluded other documents with a higher
    float64 score, or an equal one and a smaller tie key, by a plain loop; a pair whose own
    document is excluded does not count it among the equal scores."""
    from embedeval.engine.corpus import CorpusScan, Pairs, scan_ranks, score_bounds, tie_keys

    rng = np.random.default_rng(3)
    n_docs, n_q = 600, 6
    corpus = rng.standard_normal((n_docs, 5)).astype(np.float32)
    corpus[300:400] = corpus[:100]  # documents 0..99 each have an identical twin
    queries = rng.standard_normal((n_q, 5)).astype(np.float32)
    keys = tie_keys([f"d{rng.integers(10**6)}" for _ in range(n_docs)], n_docs, ties)
    drawn = zip(rng.integers(0, n_q, 200).tolist(), rng.integers(0, 400, 200).tolist(), strict=True)
    excluded = sorted(set(drawn))
    asked = {(q, r) for q in range(n_q) for r in [*range(0, 100, 7), *range(300, 400, 7)]}
    asked = sorted(asked | set(excluded[::3]))
    as_pairs = lambda p: Pairs(*(np.array(c, dtype=np.int64) for c in zip(*p, strict=True)))  # noqa: E731
    pairs = as_pairs(asked)
    scan = CorpusScan(queries, None, "inner_product", 5, keys, as_pairs(excluded), ties=ties,
                      block=block)  # fmt: skip
    rank = scan_ranks(corpus, scan, pairs, score_bounds(corpus, scan, pairs))
    gone = set(excluded)
    s = queries.astype(np.float64) @ corpus.T.astype(np.float64)
    for i, (q, r) in enumerate(asked):
        live = [d for d in range(n_docs) if (q, d) not in gone and d != r]
        ahead = [d for d in live if s[q, d] > s[q, r] or (s[q, d] == s[q, r] and keys[d] < keys[r])]
        assert rank[i] == 1 + len(ahead), (q, r)
    assert sum((q, r) in gone and (q, (r + 300) % 600) not in gone for q, r in asked) > 10


@pytest.mark.parametrize("block", [64, 700])
def test_scan_top_candidates_sorted_and_holding_the_float64_top(block):
    """scan_top's candidates: query ascending, codes strictly ascending within a query (the
    kept and the near codes interleaved), at least ``depth`` per query and every document of
    the float64 top ``depth`` among them; on small-integer data whose float32 scores tie in
    long runs, so rows hold near codes and the kept lists are merged many times."""
    from embedeval.engine.corpus import CorpusScan, Pairs, code_rows, scan_top, tie_keys

    rng = np.random.default_rng(5)
    n_docs, n_q, depth = 3000, 9, 6
    corpus = rng.integers(-2, 3, (n_docs, 4)).astype(np.float32)
    queries = rng.integers(-2, 3, (n_q, 4)).astype(np.float32)
    none = Pairs(np.zeros(0, np.int64), np.zeros(0, np.int64))
    scan = CorpusScan(
        queries, None, "inner_product", depth, tie_keys(None, n_docs, "index"), none, block=block
    )
    query, codes, _ = scan_top(corpus, scan, floor=np.full(n_q, -np.inf, np.float32))
    assert np.all(np.diff(query) >= 0)
    same = query[1:] == query[:-1]
    assert np.all(codes[1:][same] > codes[:-1][same])
    counts = np.bincount(query, minlength=n_q)
    assert counts.min() >= depth and counts.max() > depth  # near codes present
    rows = code_rows(codes, None)
    for i in range(n_q):
        keys = oracle_keys(queries[i], corpus, "inner_product")
        best = sorted(range(n_docs), key=lambda r: (keys[r], r))[:depth]
        assert set(best) <= set(rows[query == i].tolist())


@pytest.mark.parametrize(
    ("n_q", "threads", "want"),
    [
        (1000, 2, (500, 2)),
        (2500, 2, (417, 6)),
        (1000, 3, (334, 3)),
        (5, 2, (3, 2)),
        (0, 2, (1, 1)),
    ],
)
def test_query_chunks_are_equal_and_a_multiple_of_the_threads(n_q, threads, want):
    # numpy products take at most about 512 queries a chunk, in chunks of equal size, a
    # multiple of the threads: 2,500 queries on 2 threads take 6 chunks of 417 (not five of
    # 512 and one of 60), 1,000 on 3 threads 3 of 334; a block then splits into parts of at
    # most 16 MiB of scores
    from embedeval.engine.corpus import CorpusScan, Pairs, tie_keys

    none = Pairs(np.zeros(0, np.int64), np.zeros(0, np.int64))
    q = np.zeros((n_q, 4), np.float32)
    scan = CorpusScan(
        q, None, "inner_product", 1, tie_keys(None, 9, "index"), none, block=65536,
        n_threads=threads,
    )  # fmt: skip
    assert (scan.chunk, scan.n_chunks) == want
    assert scan.step == min(65536, (16 << 20) // (4 * scan.chunk))
    parts = list(scan.parts(100, np.zeros((65536, 4), np.float32), None))
    k = len(parts)  # parts of equal size, one where the scores of the block fit
    assert k == -(-65536 // scan.step)
    assert [p[0] for p in parts] == [100 + i * 65536 // k for i in range(k)]
    assert sum(p[1].shape[0] for p in parts) == 65536
    assert max(p[1].shape[0] for p in parts) <= scan.step


def test_a_device_product_takes_whole_blocks_in_chunks_of_16_mib():
    # a device product keeps one block on the device while the chunks pass: no parts, and
    # chunks of 16 MiB of scores (10,486-row blocks: at most 400 queries; 1,000 on 2 threads
    # take 4 chunks of 250)
    from embedeval.engine.corpus import CorpusScan, Pairs, tie_keys

    none = Pairs(np.zeros(0, np.int64), np.zeros(0, np.int64))
    scan = CorpusScan(
        np.zeros((1000, 4), np.float32), None, "inner_product", 1, tie_keys(None, 9, "index"),
        none, block=10486, n_threads=2, product=lambda q, b: q @ b.T,
    )  # fmt: skip
    assert (scan.chunk, scan.n_chunks, scan.step) == (250, 4, 10486)
    blk = np.zeros((10486, 4), np.float32)
    assert [(a, p is blk) for a, p, _ in scan.parts(7, blk, None)] == [(7, True)]


def test_unit_rows_are_the_exact_unit_rows_rounded_once():
    # every element within u (1 + 2**-20) of x_i / ||x|| computed with exact sums (fsum), on
    # wide rows of mixed magnitudes, where a float32 norm and division err by ~d/2 roundings
    import math

    from embedeval.engine.corpus import unit_rows

    rng = np.random.default_rng(6)
    x = (rng.standard_normal((40, 768)) * np.exp(rng.normal(0, 3, (40, 768)))).astype(np.float32)
    x[0] = 0
    x[1, :] = np.float32(1e-30)
    out, sq = unit_rows(x, np.empty_like(x))
    u = 2.0**-24 * (1 + 2.0**-20)
    for i in range(x.shape[0]):
        row = [float(v) for v in x[i]]
        exact_sq = math.fsum(v * v for v in row)
        assert abs(sq[i] - exact_sq) <= 768 * 2.0**-53 * exact_sq, i  # any summation order
        norm = math.sqrt(exact_sq)
        for j in range(0, 768, 7):
            exact = row[j] / norm if norm else 0.0
            assert abs(float(out[i, j]) - exact) <= u * abs(exact) + 1e-45, (i, j)


def test_cosine_scales_are_the_float64_inverse_norms_rounded_once():
    # 1 / ||x|| from an exact sum of squares (fsum), rounded once to float32: equal to that
    # rounding or one float32 step from it (the float64 norm errs by ~d 2**-53); zero rows 0;
    # a non-zero row whose squared norm lies outside [2**-40, 2**200] gives None
    import math

    from embedeval.engine.corpus import cosine_scales
    from embedeval.utils.errors import InputError

    rng = np.random.default_rng(7)
    x = (rng.standard_normal((30, 768)) * np.exp(rng.normal(0, 3, (30, 768)))).astype(np.float32)
    x[0] = 0
    got = cosine_scales(x)
    for i in range(x.shape[0]):
        exact_sq = math.fsum(float(v) * float(v) for v in x[i])
        want = np.float32(1 / math.sqrt(exact_sq)) if exact_sq else np.float32(0)
        assert abs(int(got[i].view(np.int32)) - int(want.view(np.int32))) <= 1, i
    assert got[0] == 0
    for value in (1e-21, 1e31):  # squared norms of 8 such values: 8e-42 and 8e62
        y = np.ones((3, 8), np.float32)
        y[1] = value
        assert cosine_scales(y) is None
    assert cosine_scales(np.full((2, 8), 1e-6, np.float32)) is not None  # 8e-12 > 2**-40
    bad = np.ones((4, 8), np.float32)
    bad[2, 5] = np.nan
    with pytest.raises(InputError, match="corpus row 12 "):
        cosine_scales(bad, start=10)


@pytest.mark.parametrize("ties", ["index", "trec_eval"])
def test_cosine_rows_of_extreme_norms_stay_exact(monkeypatch, ties):
    # cosine multiplies the corpus rows as stored and scales each column by 1 / ||x||; blocks
    # holding a zero row keep that path, blocks with a row too small (products below float32's
    # normal range) or too large (a product that overflows float32) take unit rows: every
    # ranking the float64 one, with multiples and rows one float32 step apart
    import embedeval.engine.corpus as corpus_engine

    rng = np.random.default_rng(8)
    n_q, dim = 6, 8
    queries = np.abs(rng.standard_normal((n_q, dim))).astype(np.float32)
    base = np.abs(rng.standard_normal((120, dim))).astype(np.float32)
    base[5] = 0
    base[40:48] = base[:8] * np.float32(2.0**-122)  # elements near 1e-37: products underflow
    base[80:88] = base[8:16] / base[8:16].max(axis=1, keepdims=True) * np.float32(3e38)
    base[100:110] = base[:10] * np.float32(3)  # multiples: one cosine
    base[110:120] = base[:10]
    for i in range(110, 120):
        j = int(rng.integers(dim))
        base[i, j] = np.nextafter(base[i, j], np.float32(np.inf))
    dids = [f"d{v}" for v in rng.permutation(base.shape[0])]
    qrels = judged(rng, base.shape[0], n_q, dids)
    qids = [f"q{i}" for i in range(n_q)]
    real = corpus_engine.cosine_scales
    seen = []

    def spy(rows, start=0):
        out = real(rows, start)
        seen.append(out is None)
        return out

    monkeypatch.setattr(corpus_engine, "cosine_scales", spy)
    products = []
    if importlib.util.find_spec("torch") is not None:  # the bfloat16 filter scales them too
        products = [{"backend": "torch", "device": "cpu", "precision": "bf16", "block_size": 40}]
    check(queries, base, qids, dids, qrels, "cosine", ties, [40, None], products)
    assert any(seen) and not all(seen)  # both paths were taken


@pytest.mark.parametrize("stored", ["memory", "memory-mapped"])
@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_a_float64_corpus_is_ranked_as_its_float32_rows(tmp_path, stored, distance):
    # rows apart only below float32's precision (and in reverse index order) are duplicates
    # once rounded to float32, the inputs every ranking is defined on: they tie, by index
    rng = np.random.default_rng(9)
    n_q, dim = 5, 8
    queries = rng.standard_normal((n_q, dim)).astype(np.float32)
    base = rng.standard_normal((60, dim)).astype(np.float32)
    wide = np.repeat(base.astype(np.float64), 3, axis=0)
    wide[:, 0] -= np.tile([0.0, 1e-11, 2e-11], 60) * np.sign(wide[:, 0])  # not float32 steps
    corpus32 = wide.astype(np.float32)
    assert np.array_equal(corpus32, np.repeat(base, 3, axis=0))
    given = wide
    if stored == "memory-mapped":
        np.save(tmp_path / "corpus.npy", wide)
        given = np.load(tmp_path / "corpus.npy", mmap_mode="r")
    dids = [f"d{v}" for v in rng.permutation(corpus32.shape[0])]
    qrels = judged(rng, corpus32.shape[0], n_q, dids)
    qids = [f"q{i}" for i in range(n_q)]
    res = check(
        queries, corpus32, qids, dids, qrels, distance, "index", [None, 50], given=given,
        products=[{"shards": 2}],
    )  # fmt: skip
    pieces = [given[:100], given[100:]]  # the corpus as a list of float64 pieces
    listed = ee.evaluate_qrels(
        queries, None, qrels, query_ids=qids, doc_ids=dids, metrics=list(NAMES),
        distance=distance, run_depth=DEPTH, shards=pieces,
    )  # fmt: skip
    np.testing.assert_array_equal(listed.run_rows, res.run_rows)
    for name in NAMES:
        np.testing.assert_array_equal(listed.per_query[name], res.per_query[name])


def test_pair_keys_tie_positive_multiples_of_a_row_within_a_group():
    # rows x, 3x, 5x and 0.75x (exact in float32) have one cosine but, summed in float64,
    # keys that differ in their last bits: within a group (a query) each takes the fixed-order
    # key of the one of smallest row index (x), in whatever order the pairs come; other rows
    # keep their own
    from embedeval.engine.corpus import CorpusScan, Pairs, pair_keys, tie_keys

    rng = np.random.default_rng(7)
    dim = 64
    base = (rng.integers(-(2**20), 2**20, (6, dim)) * 2.0**-20).astype(np.float32)
    corpus = np.concatenate([base, base * 3, base * 5, base * 0.75, rng.standard_normal((4, dim))])
    corpus = corpus.astype(np.float32)
    q = rng.standard_normal((3, dim)).astype(np.float32)
    n = corpus.shape[0]
    qi = np.repeat(np.arange(3), n)
    rows = np.tile(rng.permutation(n), 3)
    none = Pairs(np.zeros(0, np.int64), np.zeros(0, np.int64))
    scan = CorpusScan(q, None, "cosine", 1, tie_keys(None, n, "index"), none, raw=q)
    keys = pair_keys(corpus, scan, qi, rows, qi)
    differ = 0
    for g in range(3):
        plain = oracle_keys(q[g], corpus, "cosine")
        for i in np.flatnonzero(qi == g):
            r = int(rows[i])
            smallest = r % 6 if r < 24 else r
            assert keys[i] == plain[smallest], (g, r)
        differ += sum(len({plain[b + 6 * m] for m in range(4)}) > 1 for b in range(6))
    assert differ > 0  # the multiples' own keys do differ: the tie is what makes them equal


@pytest.mark.parametrize("span", [3, 40])
def test_spanned_marks_each_pairs_buckets(span):
    # narrow spans are marked one by one, wide ones (more than the table) by a running sum
    from embedeval.engine.corpus import _spanned

    rng = np.random.default_rng(span)
    rows = np.sort(rng.integers(0, 6, 30))
    lo = rng.integers(0, 42 - span, 30)
    hi = lo + rng.integers(0, span, 30)
    want = np.zeros((6, 42), bool)
    for r, a, b in zip(rows, lo, hi, strict=True):
        want[r, a : b + 1] = True
    np.testing.assert_array_equal(_spanned(lo, hi, rows, 6, 42).reshape(6, 42), want)


def test_count_passing_with_infinite_thresholds():
    # a widened score that overflows float32 is an infinite threshold; NaN scores never count
    from embedeval.engine.corpus import _count_passing

    # (the -inf score of the second row is at or above a -inf threshold, and near it)
    inf = np.inf
    s = np.float32([[1, 2, np.nan, 3e38], [1, 2, np.nan, -inf]])
    hi = np.float32([inf, 1.5, -inf, inf, 2.0, 1.5, -inf])
    lo = np.float32([0.0, -inf, -inf, inf, 2.0, -inf, -inf])
    qs = np.int64([0, 0, 0, 0, 0, 1, 1])
    own = np.int64([0, 0, 0, 0, 1, 0, 0])
    above, reach, at, col = _count_passing(s, hi, lo, qs, own)
    assert above.tolist() == [0, 2, 3, 0, 1, 1, 2]
    assert reach.tolist() == [3, 3, 3, 0, 2, 3, 3]
    near = sorted(zip(at.tolist(), col.tolist(), strict=True))
    assert near == [(0, 0), (0, 1), (0, 3), (1, 0), (5, 0), (5, 3), (6, 3)]


@pytest.mark.parametrize("bad", [np.nan, np.inf, 9e18])
def test_a_corpus_row_that_is_not_finite_is_refused_by_number(bad):
    # 8 columns of 9e18: each value finite, the float32 squared norm (6.5e38) is not
    from embedeval.utils.errors import InputError

    corpus = np.ones((6, 8), np.float32)
    corpus[3] = bad if bad == 9e18 else 1.0
    corpus[3, 0] = bad
    with pytest.raises(InputError, match="corpus row 3 .*rescale"):
        ee.evaluate_qrels(
            corpus[:1], corpus, {"q": {"0": 1}}, query_ids=["q"], doc_ids=range(6),
            metrics=["map"], distance="euclidean",
        )  # fmt: skip


@pytest.mark.parametrize("stored", ["memory", "memory-mapped"])
def test_a_float64_value_beyond_float32_is_refused_by_row(tmp_path, stored):
    # the corpus is ranked as float32 rows: 1e50 has no float32 value, and the error says so
    from embedeval.utils.errors import InputError

    corpus = np.ones((6, 4))
    corpus[4, 2] = 1e50
    if stored == "memory-mapped":
        np.save(tmp_path / "c.npy", corpus)
        corpus = np.load(tmp_path / "c.npy", mmap_mode="r")
    with pytest.raises(InputError, match=r"corpus row 4 .*beyond about 3\.4e38"):
        ee.evaluate_qrels(
            np.float32([[1, 0, 0, 0]]), corpus, {"q": {"0": 1}}, query_ids=["q"],
            doc_ids=range(6), metrics=["map"], distance="cosine",
        )  # fmt: skip


def test_a_tensor_core_product_widens_the_band_by_its_accumulation_term():
    """A device product that ran on tensor cores (it says so) takes 16 times float32's
    accumulation term: for inner products the band grows by 2 * 15 gamma_{d+1} (1 + 2**-20)
    ||q|| M; numpy's product keeps one."""
    from embedeval.engine.corpus import CorpusScan, Pairs, numpy_product, tie_keys

    rng = np.random.default_rng(9)
    q = rng.standard_normal((4, 64)).astype(np.float32)
    none = Pairs(np.zeros(0, np.int64), np.zeros(0, np.int64))

    def on_tensor_cores(a, b):
        return a @ b.T

    on_tensor_cores.tensor_cores = True
    bands = []
    for product in (numpy_product, on_tensor_cores):
        scan = CorpusScan(q, None, "inner_product", 1, tie_keys(None, 10, "index"), none, raw=q,
                          product=product, precision="bf16", m_sq=4.0)  # fmt: skip
        bands.append(scan.band())
    u = 2.0**-24
    gamma_65 = 65 * u / (1 - 65 * u)
    expected = 2 * 15 * gamma_65 * (1 + 2.0**-20) * np.sqrt(scan.q_sq) * 2.0
    np.testing.assert_allclose(bands[1] - bands[0], expected, rtol=1e-9)


@pytest.mark.parametrize("seed", range(5))
def test_overlapping_intervals_against_pairwise_checks(seed):
    # the candidates whose float64 bounds meet another's bounds within their cluster, which the
    # ordering of the top lists re-scores: a plain pairwise check (closed intervals), with
    # equal ends, nested and chained intervals, and groups whose values interleave
    from embedeval.engine.corpus import _overlapping

    rng = np.random.default_rng(seed)
    n = 300
    group = rng.integers(0, 12, n)
    lo = rng.integers(0, 200, n).astype(np.float64)
    hi = lo + rng.choice([0, 0, 1, 3, 40], n)
    want = np.zeros(n, dtype=bool)
    for i in range(n):
        for j in range(n):
            if i != j and group[i] == group[j] and lo[i] <= hi[j] and lo[j] <= hi[i]:
                want[i] = True
    np.testing.assert_array_equal(_overlapping(group, lo, hi), want)


def test_pending_candidates_wait_for_one_merge_only_under_a_sampled_floor():
    # with a sampled floor about twice the depth reach it: a chunk's candidates wait for one
    # merge at the end (up to 3 x its kept codes); with none (a small corpus, a chunk scanned
    # again) every score is a candidate, so they are merged every 256 queries' depth, and the
    # merges raise the threshold early (500 queries at depth 5,000: 1.28 million candidates
    # pending at most, not 7.5 million)
    from embedeval.engine.corpus import _ChunkTop

    floor = np.full(500, 0.25, dtype=np.float32)
    assert _ChunkTop(500, 5000, floor).cap == 3 * 500 * 5000
    assert _ChunkTop(500, 5000, np.full(500, -np.inf, np.float32)).cap == 256 * 5000
    assert _ChunkTop(10, 3, np.full(10, -np.inf, np.float32)).cap == 1 << 16


@pytest.mark.parametrize("merge_bytes", [64 << 20, 8 * 9 * 2])
def test_a_chunk_merge_keeps_the_depth_best_and_the_near_ones_at_the_cut(monkeypatch, merge_bytes):
    # candidates of several parts (each grouped by query) merged into the kept codes: per query
    # the depth best (score descending, then key ascending; -0.0 and +0.0 are one score), and
    # as near codes the others that score at least the depth-th; a small merge buffer splits
    # the queries into several steps
    from embedeval.engine import corpus

    monkeypatch.setattr(corpus, "_MERGE_BYTES", merge_bytes)
    rng = np.random.default_rng(7)
    n, depth = 9, 4
    chunk = corpus._ChunkTop(n, depth, np.full(n, -np.inf, dtype=np.float32))
    given: list[list[tuple[float, int]]] = [[] for _ in range(n)]
    key = 0
    parts = [(np.sort(rng.integers(0, n - 1, int(rng.integers(0, 14)))), None) for _ in range(6)]
    # the last query's depth-th score is -0.0, and a +0.0 of a larger key ties with it
    parts.append((np.full(6, n - 1), np.float32([2.0, 0.5, -0.0, 0.5, 0.0, -1.0])))
    for rows, scores in parts:
        if scores is None:
            scores = rng.choice(np.float32([-1.0, -0.0, 0.0, 0.5, 2.0]), rows.size)
        for r, s in zip(rows.tolist(), scores.tolist(), strict=True):
            given[r].append((s, key))
            key += 1
        keys = np.arange(key - rows.size, key, dtype=np.uint64)
        chunk.add(rows, corpus.pack_codes(scores, keys))
    chunk.flush()

    def best_first(pair):
        s, k = pair
        return (-s, k)

    def decoded(codes):
        return {(float(corpus.code_scores(c)), int(c & np.uint64(0xFFFFFFFF))) for c in codes}

    near_rows, near_codes = chunk.near
    for r in range(n):
        want = sorted(given[r], key=best_first)
        kept = chunk.top[r][chunk.top[r] != corpus.EMPTY]
        assert decoded(kept) == set(want[:depth])
        cut = want[depth - 1][0] if len(want) >= depth else -np.inf
        near = decoded(near_codes[near_rows == r])
        assert near == {p for p in want[depth:] if p[0] >= cut}
    assert np.all(np.diff(near_rows) >= 0)


def test_only_an_in_memory_float32_corpus_multiplied_as_stored_takes_the_largest_blocks(tmp_path):
    from embedeval.engine.corpus import default_block

    budget = 256 << 20  # an eighth of it holds a copied block of 768 float32 values a row
    rows = np.zeros((100, 768), np.float32)
    np.save(tmp_path / "c.npy", rows)
    mapped = np.load(tmp_path / "c.npy", mmap_mode="r")
    assert default_block(rows, budget, None, True) == 65536
    assert default_block(mapped, budget, None, True) == budget // 8 // (768 * 4)  # page cache
    assert default_block(rows.astype(np.float16), budget, None, True) == 10922  # a copy
    assert default_block(np.asfortranarray(rows), budget, None, True) == 10922
    assert default_block(rows, budget, np.zeros(768, np.float32), True) == 10922  # centred
    assert default_block(rows, budget, None, False) == 10922  # a device product's input
    assert default_block(rows, 1 << 20, None, False) == 1024  # at least 1,024 rows
