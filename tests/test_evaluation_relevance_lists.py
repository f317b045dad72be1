"""positives= / junk= on the streaming corpus engine against a brute-force float64 oracle written
in `tests/oracle.py`: every reference's fixed-order float64 key, junk removed, a stable
sort by (key, index); ranks of the positives and the metrics from their definitions."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import embedeval as ee
from embedeval.evaluation.relevance_lists import positive_ranks

from .oracle import fixed_order_keys as oracle_keys


def oracle_ranks(xq, xb, pos, junk, distance):
    """Per query, the sorted 0-based ranks of its positives in the junk-free ranking."""
    out = []
    for i in range(xq.shape[0]):
        keys = oracle_keys(xq[i], xb, distance)
        rows = [r for r in sorted(range(xb.shape[0]), key=lambda r: (keys[r], r))]
        rows = [r for r in rows if r not in set(junk[i])]
        out.append(sorted(rows.index(p) for p in pos[i]))
    return out


def oracle_metrics(ranks):
    """map, mrr, precision_at_1, r_precision, map_at_r from 0-based ranks (R = len)."""
    out = {n: [] for n in ("map", "mrr", "precision_at_1", "r_precision", "map_at_r")}
    for r in ranks:
        big_r = len(r)
        if not big_r:
            for v in out.values():
                v.append(np.nan)
            continue
        out["map"].append(sum((k + 1) / (p + 1) for k, p in enumerate(r)) / big_r)
        out["mrr"].append(1 / (r[0] + 1))
        out["precision_at_1"].append(float(r[0] == 0))
        out["r_precision"].append(sum(p < big_r for p in r) / big_r)
        at_r = sum((k + 1) / (p + 1) for k, p in enumerate(r) if p < big_r)
        out["map_at_r"].append(at_r / big_r)
    return {n: np.array(v) for n, v in out.items()}


def near_tie_case(seed, offset):
    """Each query has two references one float32 step apart near it, one positive; with
    ``offset`` every coordinate sits near 1000 (float32 Euclidean keys cancel)."""
    rng = np.random.default_rng(seed)
    n_ref, n_q, dim = 250, 12, 8
    base = 1000.0 if offset else 0.0
    scale = 0.02 if offset else 1.0
    xb = (base + scale * rng.standard_normal((n_ref, dim))).astype(np.float32)
    xq = (base + scale * rng.standard_normal((n_q, dim))).astype(np.float32)
    pos, junk = [], []
    for i in range(n_q):
        a, b = 2 * i, 2 * i + 1
        xb[a] = (xq[i] + scale * 0.05 * rng.standard_normal(dim)).astype(np.float32)
        xb[b] = xb[a]
        j = int(rng.integers(dim))
        xb[b, j] = np.nextafter(xb[a, j], np.float32(rng.choice([-np.inf, np.inf])))
        others = rng.choice(np.arange(2 * n_q, n_ref), 9, replace=False)
        chosen = [a if rng.random() < 0.5 else b, *others[:4].tolist()]
        pos.append(sorted(chosen) if i % 5 else [])
        junk.append(sorted(others[4:].tolist()))
    return xq, xb, pos, junk


@pytest.mark.parametrize("distance", ["euclidean", "cosine", "inner_product"])
@pytest.mark.parametrize("offset", [False, True])
def test_ranks_and_metrics_match_the_float64_oracle(distance, offset):
    if offset and distance != "euclidean":
        pytest.skip("the large common offset matters for the Euclidean key")
    xq, xb, pos, junk = near_tie_case(0, offset)
    expected = oracle_ranks(xq, xb, pos, junk, distance)
    got, lims = positive_ranks(xq, xb, pos, junk, distance=distance)
    assert [got[lims[i] : lims[i + 1]].tolist() for i in range(len(pos))] == expected
    names = ["map", "mrr", "precision_at_1", "r_precision", "map_at_r"]
    res = ee.evaluate(
        xq, None, xb, None, positives=pos, junk=junk, metrics=names, distance=distance
    )
    want = oracle_metrics(expected)
    for name in names:
        np.testing.assert_allclose(res.per_query[name], want[name], rtol=0, atol=1e-12)
        assert res.n_ties[name] == 0


SEARCHES = [
    {"n_threads": 1},
    {"backend": "torch", "device": "cpu", "precision": "float32"},
    {"backend": "torch", "device": "cpu", "precision": "bf16"},
]


@pytest.mark.parametrize("search", SEARCHES, ids=["one-thread", "torch", "torch-bf16"])
@pytest.mark.parametrize(
    "case", ["euclidean", "offset", "cosine", "inner_product", "underflow", "integers"]
)
def test_other_searches_match_the_float64_oracle(search, case):
    # one worker thread, or each block multiplied by torch on the CPU (float32 or bfloat16
    # copies: a wider band, decided in float64 alike), on near ties one float32 step apart,
    # a large common offset, products below float32's normal range and small integers with
    # duplicated rows (exact ties with non-positives, tie flags counted)
    if search.get("backend") == "torch":
        pytest.importorskip("torch")
    distance = case if case in ("cosine", "inner_product") else "euclidean"
    if case in ("underflow", "integers"):
        rng = np.random.default_rng(9)
        scale = 5e-23 if case == "underflow" else 1.0
        xb = (rng.integers(-3, 4, (60, 6)) * scale).astype(np.float32)
        xb[30:40] = xb[:10]
        xq = (rng.integers(-3, 4, (12, 6)) * scale).astype(np.float32)
        pos = [sorted(rng.choice(40, 3, replace=False).tolist()) for _ in range(12)]
        junk = [sorted(rng.choice(np.arange(40, 60), 2, replace=False).tolist()) for _ in range(12)]
    else:
        xq, xb, pos, junk = near_tie_case(0, case == "offset")
    names = ["map", "mrr", "precision_at_1", "r_precision", "map_at_r"]
    res = ee.evaluate(
        xq, None, xb, None, positives=pos, junk=junk, metrics=names, distance=distance, **search
    )
    want = oracle_metrics(oracle_ranks(xq, xb, pos, junk, distance))
    for name in names:
        np.testing.assert_allclose(res.per_query[name], want[name], rtol=0, atol=1e-12)
    base = ee.evaluate(xq, None, xb, None, positives=pos, junk=junk, metrics=names,
                       distance=distance)  # fmt: skip
    assert res.n_ties == base.n_ties
    assert res.settings["precision"] == search.get("precision", "float32")


def test_exact_tie_with_a_non_positive_keeps_the_tie_flag():
    # reference 1 duplicates positive 0: the tie block mixes the two, ranked by index
    xb = np.array([[1, 0], [1, 0], [0, 1], [5, 5]], np.float32)
    xq = np.array([[1, 0.1], [0, 1]], np.float32)
    res = ee.evaluate(xq, None, xb, None, positives=[[1], [2]], metrics=["precision_at_1", "mrr"])
    # query 0: positive 1 ranks 2nd behind its copy 0 (index order); query 1: first, no tie
    assert res.per_query["mrr"].tolist() == [0.5, 1.0]
    assert res.per_query["precision_at_1"].tolist() == [0.0, 1.0]
    assert res.n_ties["precision_at_1"] == 1 and res.n_ties["mrr"] == 1


@pytest.mark.parametrize(
    ("query", "rows"),
    [
        # copies and a positive multiple (9x) of one row, and another row with the same cosine
        ([0, 0, 0.8], [[-2, 4, 2], [-18, 36, 18], [-2, 4, 2], [10, 5, 5]]),
        # multiples, one of them with a negative zero
        ([5e-4, 1.5e-3], [[0, 15], [0, 1], [-0.0, 1]]),
    ],
)
def test_equal_cosines_rank_by_index(query, rows):
    # every row has the same cosine with the query (by hand: 1/sqrt(6), and 0.9487), so with
    # each row as the only positive its rank is its index
    xb = np.float32(rows)
    xq = np.float32([query] * len(rows))
    ranks, _ = positive_ranks(xq, xb, [[i] for i in range(len(rows))], distance="cosine")
    assert ranks.tolist() == list(range(len(rows)))


@pytest.mark.parametrize("distance", ["euclidean", "inner_product"])
def test_scores_in_float32_underflow_match_the_float64_oracle(distance):
    # coordinates near 1e-22: float32 products fall below float32's normal range
    rng = np.random.default_rng(9)
    xb = (rng.integers(-3, 4, (40, 6)) * 5e-23).astype(np.float32)
    xq = (rng.integers(-3, 4, (12, 6)) * 5e-23).astype(np.float32)
    pos = [sorted(rng.choice(40, 3, replace=False).tolist()) for _ in range(12)]
    junk = [[] for _ in range(12)]
    ranks, lims = positive_ranks(xq, xb, pos, distance=distance)
    want = oracle_ranks(xq, xb, pos, junk, distance)
    assert [ranks[lims[i] : lims[i + 1]].tolist() for i in range(12)] == want


@pytest.mark.parametrize("mapped", [False, True])
@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_near_documents_re_scored_in_several_batches_match_the_oracle(
    monkeypatch, tmp_path, distance, mapped
):
    # small integers: many exact ties and near-ties, so every query has near documents; with
    # a batch of at most 7 of them (16 times that memory-mapped) they are re-scored over many
    # batches, 16 rows at a time: by query, or by row (a memory-mapped corpus: several
    # queries to a piece); 256 bytes of scores per product split the corpus into parts of
    # 40 rows, each counted on its own (16 float64 rows of 4 values: 512 bytes)
    import embedeval.engine.corpus as corpus_engine

    monkeypatch.setattr(corpus_engine, "_NEAR_PAIRS", 7)
    monkeypatch.setattr(corpus_engine, "_KEY_BYTES", 512)
    monkeypatch.setattr(corpus_engine, "_CHUNK_BYTES", 256)
    rng = np.random.default_rng(4)
    xb = rng.integers(-2, 3, (120, 4)).astype(np.float32)
    xb[(xb == 0).all(axis=1), 0] = 1  # cosine: no zero row
    xq = rng.integers(-2, 3, (15, 4)).astype(np.float32)
    pos = [sorted(rng.choice(120, 6, replace=False).tolist()) for _ in range(15)]
    junk = [[] for _ in range(15)]
    if mapped:
        np.save(tmp_path / "corpus.npy", xb)
        xb = np.load(tmp_path / "corpus.npy", mmap_mode="r")
    ranks, lims = positive_ranks(xq, xb, pos, distance=distance)
    want = oracle_ranks(xq, xb, pos, junk, distance)
    assert [ranks[lims[i] : lims[i + 1]].tolist() for i in range(15)] == want
    # a query's AP depends on the order within a block of equal keys that holds a positive
    # and another reference: the tie flag counts those queries
    res = ee.evaluate(xq, None, xb, None, positives=pos, metrics=["map"], distance=distance)
    np.testing.assert_allclose(res.per_query["map"], oracle_metrics(want)["map"], atol=1e-12)
    mixed = 0
    for i in range(15):
        keys = oracle_keys(xq[i], xb, distance)
        others = np.setdiff1d(np.arange(120), pos[i])
        mixed += bool(np.isin(keys[pos[i]], keys[others]).any())
    assert mixed > 0 and res.n_ties["map"] == mixed


def test_cosine_ranks_rows_whose_float32_squared_norm_overflows():
    # row 3 has eight values of +-9e18: finite, its float32 squared norm (6.5e38) is not; the
    # cosine needs only its direction (float64 norms), so it is ranked, not refused
    rng = np.random.default_rng(5)
    xb = rng.standard_normal((30, 8)).astype(np.float32)
    xb[3] = np.float32(9e18) * np.sign(rng.standard_normal(8)).astype(np.float32)
    xq = np.vstack([xb[3] / np.float32(1e18) + 0.1, rng.standard_normal((5, 8))])
    xq = xq.astype(np.float32)
    pos = [[3, 7], [3], [1, 3, 4], [2], [3, 9], [0]]
    ranks, lims = positive_ranks(xq, xb, pos, distance="cosine")
    want = oracle_ranks(xq, xb, pos, [[] for _ in pos], "cosine")
    assert [ranks[lims[i] : lims[i + 1]].tolist() for i in range(len(pos))] == want
    assert want[0][0] == 0  # the large row is the first query's nearest


def test_a_reference_the_query_does_not_rank_lends_no_key_to_its_multiples():
    # rows 0 and 1 are positive multiples (15, -10) and (21, -14); row 2, (2, -3), has the same
    # real cosine with the query but another direction. Summed in float64, rows 1 and 2 get
    # one key and row 0 a key one unit larger. Ranked, row 0 lends its key to its multiple
    # row 1, and row 2 comes first; junk, same-group or deleted, row 0 lends nothing, rows 1
    # and 2 tie and row 1 (smaller index) comes first.
    q = np.float32([[29.66666603088379, -29.66666603088379]])
    x = np.float32([[15, -10], [21, -14], [2, -3]])
    keys = oracle_keys(q[0], x, "cosine")
    assert keys[1] == keys[2] and keys[0] > keys[1]  # the premise, by the plain float64 loop

    def rank_of_row_2(rows):
        # multiples (the same bytes after scaling by the largest |component|) take the key of
        # the one of smallest index among the ranked rows
        first, key = {}, {}
        for r in rows:
            shape = (x[r] / np.abs(x[r]).max()).tobytes()
            key[r] = keys[first.setdefault(shape, r)]
        return sorted(rows, key=lambda r: (key[r], r)).index(2)

    ranked, without_0 = rank_of_row_2([0, 1, 2]), rank_of_row_2([1, 2])
    assert (ranked, without_0) == (0, 1)
    lists = ee.evaluate(q, None, x, None, positives=[[2]], junk=[[0]], metrics=["mrr"],
                        distance="cosine")  # fmt: skip
    full = ee.evaluate(q, None, x, None, positives=[[2]], metrics=["mrr"], distance="cosine")
    grouped = ee.evaluate(q, [1], x, [0, 0, 1], metrics=["mrr"], distance="cosine",
                          query_groups=[7], reference_groups=[7, 8, 8])  # fmt: skip
    deleted = ee.evaluate(q, [1], x[1:], [0, 1], metrics=["mrr"], distance="cosine")
    assert full.per_query["mrr"].tolist() == [1 / (ranked + 1)]
    for res in (lists, grouped, deleted):
        assert res.per_query["mrr"].tolist() == [1 / (without_0 + 1)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tie_blocks_from_counts_match_a_loop_over_the_ranking(seed):
    # integer keys (bulk ties): per query, the blocks of equal keys holding a positive and
    # another reference, and the first neighbour pair of different relevance, by a plain loop
    # over the ranking; the counts each positive brings (its rank, the members of its key
    # before it and in all) are read from the same ranking
    from types import SimpleNamespace

    from embedeval.evaluation.relevance_lists import _counted_blocks

    rng = np.random.default_rng(seed)
    n_q, n_ref = 6, 40
    want_blocks, want_none = [], []
    query, rank0, before, tied = [], [], [], []
    for i in range(n_q):
        keys = rng.integers(0, 6, n_ref)
        pos = set(rng.choice(n_ref, int(rng.integers(0, 12)), replace=False).tolist())
        if i % 2:  # a block of positives alone: not mixed
            pos |= {r for r in range(n_ref) if keys[r] == keys.min()}
        order = sorted(range(n_ref), key=lambda r: (keys[r], r))
        rel = [r in pos for r in order]
        first_step = None
        for start in range(n_ref):
            if start and keys[order[start - 1]] == keys[order[start]]:
                continue
            end = start
            while end + 1 < n_ref and keys[order[end + 1]] == keys[order[start]]:
                end += 1
            members = rel[start : end + 1]
            if any(members) and not all(members):
                want_blocks.append((i, start, end))
                k = next(j for j in range(start, end) if rel[j] != rel[j + 1])
                first_step = k if first_step is None else min(first_step, k)
        want_none.append(first_step)
        for place, r in enumerate(order):
            if r in pos:
                same = [s for s in range(n_ref) if keys[s] == keys[r] and s != r]
                query.append(i)
                rank0.append(place)
                before.append(sum(1 for s in same if s < r))
                tied.append(len(same))
    pairs = SimpleNamespace(query=np.array(query, dtype=np.int64))
    q, first, last, none = _counted_blocks(
        pairs, np.array(rank0), np.array(before), np.array(tied), n_q
    )
    assert list(zip(q.tolist(), first.tolist(), last.tolist(), strict=True)) == want_blocks
    big = np.iinfo(np.int64).max // 2
    assert [None if v == big else v for v in none.tolist()] == want_none
    assert len(want_blocks) > 5


@pytest.mark.parametrize("distance", ["euclidean", "inner_product", "cosine"])
@pytest.mark.parametrize("exact", [True, False])
def test_binary_codes_positives_and_junk_match_the_oracle(monkeypatch, distance, exact):
    # 12-bit codes: 13 distances for 400 references, so positives tie with non-positives in
    # bulk; exact: the scores are taken as exact (a float64 key fails the test), else the band
    # decides; the tie flags agree between the two
    import embedeval.engine.corpus as corpus_engine

    def refuse(*args, **kwargs):
        raise AssertionError("exact scores need no float64 key")

    rng = np.random.default_rng(4)
    xb = (2 * rng.integers(0, 2, (400, 12)) - 1).astype(np.float32)
    xq = (2 * rng.integers(0, 2, (10, 12)) - 1).astype(np.float32)
    pos = [sorted(rng.choice(400, 30, replace=False).tolist()) for _ in range(10)]
    junk = [sorted(set(rng.choice(400, 20).tolist()) - set(p)) for p in pos]
    names = ["map", "mrr", "precision_at_1", "r_precision", "map_at_r"]
    if exact:
        monkeypatch.setattr(corpus_engine, "rank_keys", refuse)
    else:
        monkeypatch.setattr(corpus_engine, "integer_scores", lambda *args: None)
    res = ee.evaluate(
        xq, None, xb, None, positives=pos, junk=junk, metrics=names, distance=distance
    )
    want = oracle_metrics(oracle_ranks(xq, xb, pos, junk, distance))
    for name in names:
        np.testing.assert_allclose(res.per_query[name], want[name], rtol=0, atol=1e-12)
    assert res.n_ties["map"] > 0
    monkeypatch.undo()
    if exact:
        monkeypatch.setattr(corpus_engine, "integer_scores", lambda *args: None)
    other = ee.evaluate(  # the other path
        xq, None, xb, None, positives=pos, junk=junk, metrics=names, distance=distance,
        n_threads=1,
    )  # fmt: skip
    assert res.n_ties == other.n_ties


@pytest.mark.parametrize("distance", ["euclidean", "inner_product"])
def test_a_query_whose_squared_norm_overflows_float32_is_still_ranked(distance):
    # Query 1 is 1e19 times larger than the references: its float64 squared distances all
    # round to the same number (ties by index: 0, 1, 2), and its inner products are 4e19,
    # 2e19 and -2e19 (the same order); its positive, reference 1, ranks second either way.
    c = np.float32([[1, 1], [1, -1], [-1, 1]])
    q = np.float32([[0, 1], [3e19, 1e19]])
    got = ee.evaluate(q, None, c, None, metrics=["map", "mrr"], positives=[[0], [1]],
                      distance=distance)  # fmt: skip
    assert got.per_query["map"].tolist() == [1.0, 0.5]
    assert got.per_query["mrr"].tolist() == [1.0, 0.5]


SHALLOW = ["precision_at_1", "precision_at_5", "recall_at_5", "map_at_5", "r_precision",
           "map_at_r"]  # fmt: skip


def oracle_shallow(ranks, n_valid):
    """The shallow metrics of :data:`SHALLOW` from 0-based ranks (R = len; recall_at_k is
    the hit rate; map_at_k divides by the relevant items found in the first min(k, n_valid))."""
    out = {n: [] for n in SHALLOW}
    for r, n in zip(ranks, n_valid, strict=True):
        big_r = len(r)
        if not big_r:
            for v in out.values():
                v.append(np.nan)
            continue
        out["precision_at_1"].append(float(r[0] == 0))
        out["precision_at_5"].append(sum(p < 5 for p in r) / 5)
        out["recall_at_5"].append(float(r[0] < 5))
        top = [p for p in r if p < min(5, n)]
        out["map_at_5"].append(sum((j + 1) / (p + 1) for j, p in enumerate(top)) / len(top)
                               if top else 0.0)  # fmt: skip
        out["r_precision"].append(sum(p < big_r for p in r) / big_r)
        at_r = sum((j + 1) / (p + 1) for j, p in enumerate(r) if p < big_r)
        out["map_at_r"].append(at_r / big_r)
    return {n: np.array(v) for n, v in out.items()}


def tied_case(scale):
    """Small integers times ``scale`` (not exact float32 scores: below float32's normal range,
    or not dyadic), many rows duplicated, each query's positives among them: exact ties
    between positives and other references in and past the first places."""
    rng = np.random.default_rng(9)
    xb = (rng.integers(-3, 4, (150, 6)) * scale).astype(np.float32)
    xb[100:130] = xb[:30]
    xq = (rng.integers(-3, 4, (12, 6)) * scale).astype(np.float32)
    pos = [sorted(rng.choice(130, 6, replace=False).tolist()) for _ in range(12)]
    junk = [sorted(rng.choice(np.arange(130, 150), 2, replace=False).tolist()) for _ in range(12)]
    return xq, xb, pos, junk


@pytest.mark.parametrize("case", ["near", "offset", "tied", "underflow"])
def test_shallow_metrics_read_only_the_first_places_and_match_the_oracle(case):
    """Metrics that read a query's first k or R_q places only: positives certainly past them
    are not ranked exactly (no float64 decision for them), and the values still match the
    float64 oracle; the tie flags are those of the full ranking (computed alongside ``map``,
    which ranks every positive)."""
    if case in ("tied", "underflow"):
        xq, xb, pos, junk = tied_case(0.1 if case == "tied" else 5e-23)
    else:
        xq, xb, pos, junk = near_tie_case(3, case == "offset")
    full = _check_shallow(xq, xb, pos, junk)
    if case in ("tied", "underflow"):
        assert sum(full.n_ties.values()) > 0


def _check_shallow(xq, xb, pos, junk):
    """The :data:`SHALLOW` metrics against the float64 oracle, and their values and tie flags
    against those computed beside ``map`` (which ranks every positive); that run returned."""
    ranks = oracle_ranks(xq, xb, pos, junk, "euclidean")
    n_valid = [xb.shape[0] - len(j) for j in junk]
    res = ee.evaluate(xq, None, xb, None, positives=pos, junk=junk, metrics=SHALLOW)
    full = ee.evaluate(xq, None, xb, None, positives=pos, junk=junk, metrics=[*SHALLOW, "map"])
    want = oracle_shallow(ranks, n_valid)
    for name in SHALLOW:
        np.testing.assert_allclose(res.per_query[name], want[name], rtol=0, atol=1e-12)
        np.testing.assert_array_equal(res.per_query[name], full.per_query[name])
        assert res.n_ties[name] == full.n_ties[name]
    return full


def test_k_caps_the_places_every_metric_reads():
    """``k`` with full-depth metrics: only the first k places are read, so the capped ranks
    give the values of the ranking cut at k (the oracle's ranks past k dropped)."""
    xq, xb, pos, junk = near_tie_case(4, False)
    ranks = oracle_ranks(xq, xb, pos, junk, "euclidean")
    res = ee.evaluate(xq, None, xb, None, positives=pos, junk=junk, metrics=["map", "mrr"], k=5)
    for i, r in enumerate(ranks):
        if not r:
            assert np.isnan(res.per_query["map"][i])
            continue
        top = [p for p in r if p < 5]
        want_map = sum((j + 1) / (p + 1) for j, p in enumerate(top)) / len(r)
        assert res.per_query["map"][i] == pytest.approx(want_map, abs=1e-12)
        assert res.per_query["mrr"][i] == pytest.approx(1 / (r[0] + 1) if r[0] < 5 else 0.0)


@pytest.mark.parametrize("case", ["near", "tied"])
def test_shallow_metrics_stop_counting_positives_past_their_places(monkeypatch, case):
    """Blocks of 16 references: a positive that enough references certainly beat is past
    every place the shallow metrics read, and is no longer counted in the next blocks; the
    values and tie flags still match the float64 oracle and the full ranking's."""
    import embedeval.engine.corpus as corpus_engine

    monkeypatch.setattr(corpus_engine, "default_block", lambda *args: 16)
    counted = []
    real = corpus_engine.BeatCounter.counted_queries

    def spy(self):
        queries = real(self)
        counted.append(queries.size)
        return queries

    monkeypatch.setattr(corpus_engine.BeatCounter, "counted_queries", spy)
    xq, xb, pos, junk = tied_case(0.1) if case == "tied" else near_tie_case(3, False)
    _check_shallow(xq, xb, pos, junk)
    # the shallow run's first block counted every positive, a later one fewer
    assert counted[0] == sum(len(p) for p in pos) and min(counted) < counted[0]


# ---------------------------------------------------------------------------- list forms
# References at 0, 1, 2, 3 on a line, one query at 0: reference j is at distance j.

LINE4 = np.arange(4.0)[:, None]


def test_a_boolean_relevance_mask_is_not_read_as_indices():
    # A mask row [False, True] names reference 1; read as indices it would be {0, 1} (step AP 1
    # instead of the 1/2 of reference 1 ranked 2nd).
    with pytest.raises(ee.InputTypeError, match=r"positives\[0\] must hold integer reference"):
        ee.evaluate([[0.0]], None, LINE4, None, positives=[[False, True]], metrics=["map"])
    with pytest.raises(ee.InputTypeError, match=r"junk\[0\] must hold integer reference"):
        ee.evaluate([[0.0]], None, LINE4, None, positives=[[2]], junk=[[True]])


def test_lists_keyed_by_query_are_refused_not_read_as_their_keys():
    # Iterated, {0: [3], 1: [2]} gives its keys 0 and 1: positives [[0], [1]] in silence.
    with pytest.raises(ee.InputTypeError, match=r"in query order; got a dict"):
        ee.evaluate([[0.0], [0.0]], None, LINE4, None, positives={0: [3], 1: [2]})


def test_an_index_beyond_int64_is_outside_the_reference_set():
    with pytest.raises(
        ee.InputError,
        match=rf"positives\[1\] \(query 1\) holds index {2**70}, outside the reference set "
        r"\(0\.\.3\)",
    ):
        ee.evaluate([[0.0], [0.0]], None, LINE4, None, positives=[[1], [2, 2**70]])
    with pytest.raises(ee.InputError, match=r"junk\[0\] \(query 0\) holds index -1, outside"):
        ee.evaluate([[0.0]], None, LINE4, None, positives=[[1]], junk=[[-1]])


def test_default_metrics_follow_k_as_with_labels():
    # Query at 0, references at 0..3 (reference j at distance j), positives {0, 3}: by hand,
    # P@1 = 1, R-precision (window 2: references 0, 1) = 1/2, MAP@R = (1/1) / 2, and the hit
    # rate in the top 3 (references 0, 1, 2) is 1.  Recall@10 would need depth 10 > k = 3.
    res = ee.evaluate([[0.0]], None, LINE4, None, positives=[[0, 3]], k=3)
    assert res.metrics == {
        "precision_at_1": 1.0, "r_precision": 0.5, "map_at_r": 0.5, "recall_at_3": 1.0
    }  # fmt: skip
    with pytest.warns(ee.EmbedevalWarning, match="truncated at depth k"):  # R_q = 2 > k
        res = ee.evaluate([[0.0]], None, LINE4, None, positives=[[0, 3]], k=1)
    assert list(res.metrics) == ["precision_at_1", "r_precision", "map_at_r"]


def test_k_below_the_largest_positives_list_warns_that_r_metrics_are_truncated():
    # R_q = 3 > k = 2: R-precision reads min(R_q, k) = 2 places (references 0, 1 of positives
    # {1, 2, 3}: 1/2), not the textbook 3 (2/3), as on the label path, which warns.
    with pytest.warns(ee.EmbedevalWarning, match=r"k=2 is below the largest R_q \(3"):
        res = ee.evaluate([[0.0]], None, LINE4, None, positives=[[1, 2, 3]], k=2,
                          metrics=["r_precision"])  # fmt: skip
    assert res["r_precision"] == 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # k = R_q, or no R-metric: nothing is truncated
        ee.evaluate([[0.0]], None, LINE4, None, positives=[[1, 2]], k=2, metrics=["r_precision"])
        ee.evaluate([[0.0]], None, LINE4, None, positives=[[1, 2, 3]], k=2, metrics=["map"])


def test_every_query_without_positives_warns_that_every_metric_is_nan():
    with pytest.warns(ee.EmbedevalWarning, match="every one of the 2 queries is lone"):
        res = ee.evaluate([[0.0], [1.0]], None, LINE4, None, positives=[[], []], metrics=["map"])
    assert np.isnan(res["map"]) and res.n_lone == 2


def test_block_size_sets_the_references_per_streamed_block(monkeypatch):
    # positives= streams the references past the queries: block_size counts references there,
    # and every block size gives the brute-force values
    from embedeval.engine import corpus

    seen = []
    real = corpus.CorpusScan

    def spy(*args, **kwargs):
        seen.append(kwargs["block"])
        return real(*args, **kwargs)

    monkeypatch.setattr(corpus, "CorpusScan", spy)
    rng = np.random.default_rng(3)
    xq = rng.integers(-2, 3, (6, 3)).astype(np.float32)
    xb = rng.integers(-2, 3, (40, 3)).astype(np.float32)
    pos = [list(rng.choice(40, 4, replace=False)) for _ in range(6)]
    res = ee.evaluate(xq, None, xb, None, positives=pos, metrics=["map"], block_size=7)
    assert seen == [7]
    for q in range(6):
        d = ((xb.astype(np.float64) - xq[q]) ** 2).sum(axis=1)
        order = np.lexsort((np.arange(40), d))
        rel = np.isin(order, pos[q])
        want = (np.cumsum(rel) / np.arange(1, 41))[rel].mean()
        assert res.per_query["map"][q] == pytest.approx(want, abs=1e-12)
