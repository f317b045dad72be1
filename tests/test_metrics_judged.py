"""embedeval.metrics.judged against pytrec_eval (trec_eval 9), ranx and hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedeval.metrics.judged import (
    DEFAULT_IR_METRICS,
    NOT_RANKED,
    IRMetric,
    judged_metric_values,
    parse_ir_metrics,
)
from embedeval.utils.errors import InputError, InputTypeError

# trec_eval measure -> our canonical name
TREC_NAMES = {
    "ndcg_cut_10": "ndcg@10",
    "ndcg_cut_3": "ndcg@3",
    "ndcg": "ndcg",
    "map_cut_100": "map@100",
    "map_cut_5": "map@5",
    "map": "map",
    "recall_100": "recall@100",
    "recall_5": "recall@5",
    "P_10": "precision@10",
    "P_5": "precision@5",
    "recip_rank": "mrr",
    "success_10": "hit_rate@10",
    "success_1": "hit_rate@1",
    "Rprec": "r_precision",
}
TREC_MEASURES = {
    "ndcg_cut.3,10",
    "ndcg",
    "map_cut.5,100",
    "map",
    "recall.5,100",
    "P.5,10",
    "recip_rank",
    "success.1,10",
    "Rprec",
}


# --------------------------------------------------------------------------- helpers
def random_collection(seed: int, n_queries: int = 60, n_docs: int = 40, low_grade: int = -3):
    """Random graded qrels and runs with distinct scores, as trec_eval dicts.

    Covers judged documents not retrieved, unjudged retrieved ones, grade 0 and negative
    judgments, queries with nothing relevant or nothing retrieved, and runs shorter than k.
    """
    rng = np.random.default_rng(seed)
    docs = [f"d{i}" for i in range(n_docs)]
    qrels, run = {}, {}
    for q in range(n_queries):
        judged = rng.choice(n_docs, rng.integers(1, 25), replace=False)
        qrels[f"q{q}"] = {docs[j]: int(rng.integers(low_grade, 4)) for j in judged}
        retrieved = rng.choice(n_docs, rng.integers(0, n_docs), replace=False)
        scores = rng.permutation(3 * n_docs)[: retrieved.size] / 7.0  # distinct
        run[f"q{q}"] = {docs[d]: float(s) for d, s in zip(retrieved, scores, strict=True)}
    return qrels, run


def to_csr(qrels: dict, run: dict, depth: int | None = None):
    """Ranks of judged documents read off the run by a plain sort (best score first)."""
    lims, ranks, grades = [0], [], []
    for qid, judged in qrels.items():
        ordered = sorted(run.get(qid, {}), key=lambda d: -run[qid][d])[:depth]
        position = {doc: i + 1 for i, doc in enumerate(ordered)}
        for doc, grade in judged.items():
            ranks.append(position.get(doc, NOT_RANKED))
            grades.append(grade)
        lims.append(len(ranks))
    return np.array(lims), np.array(ranks, dtype=np.int64), np.array(grades)


def trec_eval(qrels: dict, run: dict, measures: set, level: int = 1) -> dict:
    """pytrec_eval's values, negative grades given as 0.

    trec_eval assumes grades >= 0 and uses -1 and -2 as its own markers: negative grades
    corrupt its memory (a crash at -2, a hang after a few hundred evaluations at -1).  A
    negative grade means judged non-relevant, exactly like 0, so the oracle gets 0.
    """
    pytrec_eval = pytest.importorskip("pytrec_eval")
    clipped = {q: {d: max(g, 0) for d, g in docs.items()} for q, docs in qrels.items()}
    evaluator = pytrec_eval.RelevanceEvaluator(clipped, measures, relevance_level=level)
    return evaluator.evaluate(run)


# --------------------------------------------------------------------------- pytrec_eval parity
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("level", [1, 2, 3])
def test_every_measure_matches_pytrec_eval(seed, level):
    qrels, run = random_collection(seed)
    expected = trec_eval(qrels, run, TREC_MEASURES, level)
    got = judged_metric_values(
        list(TREC_NAMES.values()), *to_csr(qrels, run), relevance_level=level
    )
    for trec_name, name in TREC_NAMES.items():
        want = np.array([expected[q][trec_name] for q in qrels])
        np.testing.assert_allclose(got[name], want, rtol=0, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("seed", [3, 4])
def test_mrr_at_k_is_recip_rank_of_the_run_cut_at_k(seed):
    qrels, run = random_collection(seed)
    for k in (1, 3, 10):
        cut = {q: dict(sorted(docs.items(), key=lambda kv: -kv[1])[:k]) for q, docs in run.items()}
        expected = trec_eval(qrels, cut, {"recip_rank"})
        got = judged_metric_values([f"mrr@{k}"], *to_csr(qrels, run))[f"mrr@{k}"]
        want = np.array([expected[q]["recip_rank"] for q in qrels])
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_a_run_searched_to_a_depth_matches_trec_eval_on_the_cut_run():
    # What the search layer produces: ranks only down to its depth, NOT_RANKED below.
    qrels, run = random_collection(5)
    cut = {q: dict(sorted(docs.items(), key=lambda kv: -kv[1])[:10]) for q, docs in run.items()}
    expected = trec_eval(qrels, cut, {"ndcg_cut.10", "P.10", "recall.5", "map_cut.5"})
    names = {"ndcg_cut_10": "ndcg@10", "P_10": "precision@10", "recall_5": "recall@5"}
    names["map_cut_5"] = "map@5"
    got = judged_metric_values(list(names.values()), *to_csr(qrels, run, depth=10))
    for trec_name, name in names.items():
        want = np.array([expected[q][trec_name] for q in qrels])
        np.testing.assert_allclose(got[name], want, rtol=0, atol=1e-12, err_msg=name)


def test_negative_grades_give_no_gain_and_count_as_judged_non_relevant():
    # By hand (the pytrec_eval oracle above sees negative grades as 0): gain 0, never
    # relevant, but judged.
    deep = judged_metric_values(
        ["ndcg@2", "judged@2", "precision@2", "mrr"], [0, 3], [1, 2, 3], [-7, 2, 1]
    )
    ideal = 2 / math.log2(2) + 1 / math.log2(3)
    assert deep["ndcg@2"][0] == pytest.approx((2 / math.log2(3)) / ideal, abs=1e-15)
    assert (deep["judged@2"][0], deep["precision@2"][0], deep["mrr"][0]) == (1.0, 0.5, 0.5)
    exp = judged_metric_values(["ndcg@2"], [0, 3], [1, 2, 3], [-7, 2, 1], gain="exponential")
    assert exp["ndcg@2"][0] == pytest.approx((3 / math.log2(3)) / (3 + 1 / math.log2(3)), rel=1e-15)


@st.composite
def small_collections(draw):
    """A few queries over a handful of documents: every overlap of judged and retrieved sets."""
    n_docs = draw(st.integers(1, 12))
    qrels, run = {}, {}
    for q in range(draw(st.integers(1, 4))):
        judged = draw(
            st.lists(st.integers(0, n_docs - 1), min_size=1, max_size=n_docs, unique=True)
        )
        grades = draw(st.lists(st.integers(-3, 3), min_size=len(judged), max_size=len(judged)))
        order = draw(st.permutations(range(n_docs)))
        depth = draw(st.integers(0, n_docs))
        qrels[f"q{q}"] = {f"d{j}": g for j, g in zip(judged, grades, strict=True)}
        run[f"q{q}"] = {f"d{d}": float(n_docs - i) for i, d in enumerate(order[:depth])}
    return qrels, run, draw(st.integers(1, 3))


@settings(max_examples=150, deadline=None)
@given(small_collections())
def test_small_collections_match_pytrec_eval(collection):
    qrels, run, level = collection
    measures = {"ndcg_cut.3", "ndcg", "map_cut.5", "map", "recall.5", "P.5", "recip_rank"}
    measures |= {"success.1,10", "Rprec"}
    expected = trec_eval(qrels, run, measures, level)
    names = {k: v for k, v in TREC_NAMES.items() if k not in ("ndcg_cut_10", "map_cut_100")}
    names = {k: v for k, v in names.items() if k not in ("recall_100", "P_10")}
    got = judged_metric_values(list(names.values()), *to_csr(qrels, run), relevance_level=level)
    for trec_name, name in names.items():
        want = [expected[q][trec_name] for q in qrels]
        np.testing.assert_allclose(got[name], want, rtol=0, atol=1e-12, err_msg=name)


def test_huge_ranks_sort_like_small_ones():
    # ranks near 2**62 take the overflow-safe sorting path; the values depend on order only
    big = 2**61
    lims, grades = [0, 3, 5], [1, 0, 2, 1, 1]
    small = judged_metric_values(["map"], lims, [3, 1, 2, 2, 1], grades)
    huge = judged_metric_values(["map", "mrr"], lims, [big + 2, 1, big, big + 1, 1], grades)
    assert small["map"].tolist() == [pytest.approx((1 / 2 + 2 / 3) / 2), 1.0]
    assert huge["map"][0] == pytest.approx((1 / big + 2 / (big + 2)) / 2, rel=1e-12)
    assert huge["map"][1] == pytest.approx((1 + 2 / (big + 1)) / 2, rel=1e-12)
    assert huge["mrr"].tolist() == [1 / big, 1.0]


# --------------------------------------------------------------------------- ranx, second oracle
def test_matches_ranx_including_exponential_gain():
    ranx = pytest.importorskip("ranx")
    qrels, run = random_collection(6, low_grade=0)
    # ranx needs a relevant document and a non-empty run for every query
    # (and returns per-query values in sorted id order)
    keep = sorted(q for q in qrels if run[q] and max(qrels[q].values()) > 0)
    qrels = {q: qrels[q] for q in keep}
    run = {q: run[q] for q in keep}
    metrics = {
        "ndcg@10": "ndcg@10",
        "ndcg_burges@10": "ndcg@10",
        "map@100": "map@100",
        "mrr@10": "mrr@10",
        "recall@100": "recall@100",
        "precision@10": "precision@10",
        "hit_rate@10": "hit_rate@10",
        "r-precision": "r_precision",
    }
    csr = to_csr(qrels, run)
    for ranx_name, name in metrics.items():
        gain = "exponential" if "burges" in ranx_name else "linear"
        scores = ranx.evaluate(
            ranx.Qrels(qrels), ranx.Run(run), ranx_name, return_mean=False, make_comparable=True
        )
        got = judged_metric_values([name], *csr, gain=gain)[name]
        np.testing.assert_allclose(got, np.asarray(scores), rtol=0, atol=1e-12, err_msg=ranx_name)


# --------------------------------------------------------------------------- hand cases
def test_textbook_ndcg_at_10():
    # Top 10 grades 0 2 1 3 0 2 0 3 1 3; the query's judged relevant set holds five documents of
    # grade 3 and ten of grade 2 (and the two grade-1 documents retrieved).
    top = [0, 2, 1, 3, 0, 2, 0, 3, 1, 3]
    grades = top + [3, 3] + [2] * 8
    ranks = list(range(1, 11)) + [NOT_RANKED] * 10
    dcg = (
        2 / math.log2(3)
        + 1 / math.log2(4)
        + 3 / math.log2(5)
        + 2 / math.log2(7)
        + 3 / math.log2(9)
        + 1 / math.log2(10)
        + 3 / math.log2(11)
    )
    ideal = 3 * (1 + 1 / math.log2(3) + 1 / 2 + 1 / math.log2(5) + 1 / math.log2(6)) + 2 * (
        1 / math.log2(7)
        + 1 / math.log2(8)
        + 1 / math.log2(9)
        + 1 / math.log2(10)
        + 1 / math.log2(11)
    )
    got = judged_metric_values(["ndcg@10"], [0, 20], ranks, grades)["ndcg@10"][0]
    assert got == pytest.approx(dcg / ideal, rel=1e-14)
    assert round(got, 2) == 0.49


def test_exponential_gain_by_hand():
    # grades 2, 0, 3 at ranks 1-3; a grade-1 document not retrieved
    got = judged_metric_values(
        ["ndcg@3", "ndcg"], [0, 4], [1, 2, 3, NOT_RANKED], [2, 0, 3, 1], gain="exponential"
    )
    dcg = 3 / 1 + 7 / 2
    assert got["ndcg@3"][0] == pytest.approx(dcg / (7 + 3 / math.log2(3) + 1 / 2), rel=1e-15)
    assert got["ndcg"][0] == pytest.approx(dcg / (7 + 3 / math.log2(3) + 1 / 2 + 0), rel=1e-15)


def test_ap_mrr_precision_by_hand():
    # Relevant at ranks 1, 3, 6 and one relevant never retrieved (R = 4); grade 0 at rank 2,
    # 4 unjudged ranks between them.
    lims, ranks, grades = [0, 5], [1, 3, 6, NOT_RANKED, 2], [1, 2, 1, 3, 0]
    names = ["map", "map@5", "mrr", "mrr@2", "precision@5", "recall@5", "r_precision", "judged@5"]
    got = {n: v[0] for n, v in judged_metric_values(names, lims, ranks, grades).items()}
    assert got["map"] == pytest.approx((1 + 2 / 3 + 3 / 6) / 4, rel=1e-15)
    assert got["map@5"] == pytest.approx((1 + 2 / 3) / 4, rel=1e-15)
    assert (got["mrr"], got["mrr@2"]) == (1.0, 1.0)
    assert got["precision@5"] == 2 / 5 and got["recall@5"] == 2 / 4
    assert got["r_precision"] == 2 / 4  # top 4 holds ranks 1 and 3
    assert got["judged@5"] == 3 / 5
    level2 = judged_metric_values(["mrr", "mrr@2", "map"], lims, ranks, grades, relevance_level=2)
    assert (level2["mrr"][0], level2["mrr@2"][0]) == (1 / 3, 0.0)
    assert level2["map"][0] == pytest.approx((1 / 3) / 2, rel=1e-15)


def test_fewer_documents_than_k_still_divide_by_k():
    # a corpus of 3 documents, all judged relevant and retrieved: P@10 = 3/10 (trec_eval's rule)
    got = judged_metric_values(
        ["precision@10", "judged@10", "recall@10"], [0, 3], [1, 2, 3], [1] * 3
    )
    assert (got["precision@10"][0], got["judged@10"][0], got["recall@10"][0]) == (0.3, 0.3, 1.0)


def test_queries_without_judgments_or_relevant_documents_score_zero():
    lims, ranks, grades = [0, 0, 2, 3], [1, 2, 1], [0, -1, 2]
    got = judged_metric_values([*DEFAULT_IR_METRICS, "r_precision", "ndcg"], lims, ranks, grades)
    for name, values in got.items():
        assert values.tolist()[:2] == [0.0, 0.0], name
        assert values.dtype == np.float64 and values.shape == (3,)
    assert got["ndcg@10"][2] == 1.0 and got["mrr@10"][2] == 1.0


def test_no_queries():
    got = judged_metric_values(["ndcg@10", "map"], [0], [], [])
    assert got["ndcg@10"].shape == (0,) and got["map"].dtype == np.float64


# --------------------------------------------------------------------------- parsing
def test_every_spelling_parses_to_the_canonical_metric():
    spellings = {
        "ndcg@10": "ndcg@10",
        "ndcg_cut_10": "ndcg@10",
        "ndcg_cut.10": "ndcg@10",
        "nDCG@10": "ndcg@10",
        "ndcg": "ndcg",
        "map_cut_100": "map@100",
        "map_cut.100": "map@100",
        "map@100": "map@100",
        "AP": "map",
        "map": "map",
        "recip_rank": "mrr",
        "RR@10": "mrr@10",
        "mrr@10": "mrr@10",
        "P_10": "precision@10",
        "P.10": "precision@10",
        "P@10": "precision@10",
        "precision@10": "precision@10",
        "recall_100": "recall@100",
        "recall.100": "recall@100",
        "R@100": "recall@100",
        "success_10": "hit_rate@10",
        "success.10": "hit_rate@10",
        "success@10": "hit_rate@10",
        "hit_rate@10": "hit_rate@10",
        "Rprec": "r_precision",
        "r-precision": "r_precision",
        "r_precision": "r_precision",
        "Judged@10": "judged@10",
    }
    for spelling, canonical in spellings.items():
        (metric,) = parse_ir_metrics([spelling])
        assert metric.name == canonical, spelling


def test_parsed_fields_depth_defaults_and_duplicates():
    parsed = parse_ir_metrics(["ndcg_cut_10", "ndcg@10", "r_precision", "map", "P_5", "P@5"])
    assert parsed == [
        IRMetric("ndcg@10", "ndcg", 10),
        IRMetric("r_precision", "r_precision", None),
        IRMetric("map", "map", None),
        IRMetric("precision@5", "precision", 5),
    ]
    assert [m.depth for m in parsed] == [10, None, None, 5]
    assert [m.name for m in parse_ir_metrics(None)] == list(DEFAULT_IR_METRICS)
    assert parse_ir_metrics("mrr") == [IRMetric("mrr", "mrr", None)]
    assert parse_ir_metrics([IRMetric("recall@7", "recall", 7)])[0].k == 7


@pytest.mark.parametrize(
    ("name", "needles"),
    [
        ("recall_at_10", ["'recall@10'", "'hit_rate@10'", "hit rate", "relevant retrieved"]),
        ("precision_at_10", ["'precision@10'"]),
        ("precision_at_1", ["'precision@1'"]),
        ("map_at_r", ["MAP@R", "'r_precision'"]),
        ("ndgc@10", ["unknown IR metric", "Did you mean 'ndcg@10'"]),
        ("bpref", ["unknown IR metric 'bpref'"]),
        ("ndcg@0", ["positive integer", "'0'"]),
        ("ndcg@-3", ["positive integer"]),
        ("P@2.5", ["positive integer", "'2.5'"]),
        ("recall", ["needs a cut-off", "'recall@10'"]),
        ("ndcg_cut", ["needs a cut-off"]),
        ("judged", ["needs a cut-off"]),
        ("r_precision@10", ["takes no cut-off"]),
    ],
)
def test_bad_names_say_what_to_write(name, needles):
    with pytest.raises(InputError) as info:
        parse_ir_metrics([name])
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))


def test_bad_metric_containers():
    with pytest.raises(InputTypeError, match="metric names"):
        parse_ir_metrics([10])
    with pytest.raises(InputTypeError, match="list of names"):
        parse_ir_metrics(10)
    with pytest.raises(InputError, match="empty"):
        parse_ir_metrics([])


# --------------------------------------------------------------------------- bad arrays
@pytest.mark.parametrize(
    ("lims", "ranks", "grades", "needle"),
    [
        ([1, 2], [1], [1], "start at 0"),
        ([0, 2, 1], [1, 2], [1, 1], "never decrease"),
        ([0, 2], [1], [1, 1], "lims\\[-1\\] = 2"),
        ([0, 2], [1, 2, 3], [1, 1, 1], "lims\\[-1\\] = 2"),
        ([0, 1], [0], [1], "1-based"),
        ([0, 2], [3, 3], [1, 0], "two judged documents at rank 3"),
        ([0, 1], [1.0], [1], "integer array"),
        ([0, 1], [1], [0.5], "integer array"),
        ([[0, 1]], [1], [1], "1-D"),
    ],
)
def test_bad_csr_arrays(lims, ranks, grades, needle):
    with pytest.raises(InputError, match=needle):
        judged_metric_values(["map"], lims, ranks, grades)


@pytest.mark.parametrize("name", ["lims", "ranks", "grades"])
def test_uint64_values_above_int64_are_refused_not_wrapped(name):
    arrays = {"lims": [0, 2], "ranks": [2, 1], "grades": [1, 0]}
    arrays[name] = np.array(arrays[name], dtype=np.uint64)
    arrays[name][-1] = np.uint64(2**63)  # as int64 it would read -2**63
    with pytest.raises(InputError, match=f"{name} holds 9223372036854775808, above the largest"):
        judged_metric_values(["mrr"], arrays["lims"], arrays["ranks"], arrays["grades"])


@pytest.mark.parametrize("name", ["lims", "ranks", "grades"])
def test_integers_beyond_64_bits_are_named(name):
    arrays = {"lims": [0, 2], "ranks": [2, 1], "grades": [1, 0]}
    arrays[name] = [*arrays[name][:-1], 2**70]  # numpy keeps it as a Python object
    with pytest.raises(InputError, match=f"{name} holds the integer {2**70}, beyond 64-bit"):
        judged_metric_values(["mrr"], arrays["lims"], arrays["ranks"], arrays["grades"])


def test_uint64_arrays_within_int64_are_read_as_given():
    # the relevant document is at rank 2: reciprocal rank 1/2
    u = np.uint64
    got = judged_metric_values(
        ["mrr"], np.array([0, 2], u), np.array([2, 1], u), np.array([1, 0], u)
    )
    assert got["mrr"].tolist() == [0.5]


def test_bad_options():
    with pytest.raises(InputError, match="gain"):
        judged_metric_values(["ndcg"], [0, 1], [1], [1], gain="exp")
    with pytest.raises(InputError, match="relevance_level"):
        judged_metric_values(["map"], [0, 1], [1], [1], relevance_level=1.5)
    with pytest.raises(InputError, match="relevance_level must be at least 1; got 0"):
        judged_metric_values(["map"], [0, 1], [1], [0], relevance_level=0)
    with pytest.raises(InputError, match="grades holds, at position 1, 960"):
        judged_metric_values(["ndcg"], [0, 2], [1, 2], [1, 960], gain="exponential")


def test_two_not_ranked_documents_are_allowed():
    got = judged_metric_values(["recall@5"], [0, 3], [NOT_RANKED, 1, NOT_RANKED], [1, 1, 2])
    assert got["recall@5"][0] == pytest.approx(1 / 3)
