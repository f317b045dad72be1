"""Judged relevance on binary hash codes: ``embedeval.evaluate_qrels`` and ``evaluate(...,
positives=)`` on 64-bit codes, where the float32 scores are exact, against the product alone,
faiss's binary index + pytrec_eval, and the same engine deciding the codes' ties in float64, in
one run.

Data (seeded, generated here): a corpus of 200,000 codes in ``{-1, 1}^64`` (float32), 1,000
query codes, and graded qrels (0-3): each query judges 30 documents at distinct random rows, made
by flipping ``k`` of its bits (``k`` in 8..30; grade 3 for ``k <= 13``, 2 for ``k <= 17``, 1 for
``k <= 21``, else 0), except one in ten, left a random code but graded the same (judged relevant
documents that rank deep, as in every real collection).  An unrelated code lies at a Hamming
distance of about 32 +- 4, the 1,000th nearest at about 21: the top lists end inside runs of
thousands of documents at one distance, the relevant documents straddle every cut-off, and
every judged document ties with hundreds or thousands of others.  Inner products rank as
Hamming distances do (``q.x = 64 - 2 hamming``).

Cases (each in a fresh process: wall time, CPU time, peak RSS):

1. ``product``  numpy ``queries @ chunk.T`` over corpus chunks of 50,000 into one buffer.
2. ``faiss``    faiss ``IndexBinaryFlat`` (the codes packed to 8 bytes) top-1,000 Hamming search,
   the run dict, then ``pytrec_eval`` (``ndcg_cut.10``, ``map_cut.100``, ``recall.100``,
   ``recall.1000``, ``P.10``, and ``recip_rank`` on the run cut at 10).  Its ties fall where
   its heap leaves them.
3. ``embedeval``  ``ee.evaluate_qrels(..., distance="inner_product")`` (nDCG@10, MAP@100,
   MRR@10, Recall@100, Recall@1000, P@10): the scores are exact, ties by corpus row.
4. ``full_depth``  the same with trec_eval's uncut ``map`` and ``ndcg`` beside nDCG@10.
5. ``positives``  ``ee.evaluate(q, None, c, None, positives=..., distance="inner_product")``
   (positives: grade >= 1) with ``map``, ``mrr`` and ``precision_at_10``.
6. ``cosine``  case 3 with ``distance="cosine"`` (``evaluate_qrels``' default): the codes share
   one norm, so the scan multiplies them as the inner product and reports cosines.
7. ``*_float64`` (``embedeval_float64``, ``full_depth_float64``, ``positives_float64``,
   ``cosine_float64``): the same with the scores not taken as exact, so the float32 band
   decides every tie in float64 (what the engine did before it recognised exact scores; same
   values).

Run::

    python -m benchmarks.bench_qrels_codes               # everything at full size
    python -m benchmarks.bench_qrels_codes --quick       # 50,000 codes, 250 queries
    python -m benchmarks.bench_qrels_codes --cases embedeval,embedeval_float64
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import numpy as np

from benchmarks._common import machine, run_child

CASES = (
    "product",
    "faiss",
    "embedeval",
    "embedeval_float64",
    "full_depth",
    "full_depth_float64",
    "positives",
    "positives_float64",
    "cosine",
    "cosine_float64",
)
BITS = 64
DEPTH = 1000
METRICS = ["ndcg@10", "map@100", "mrr@10", "recall@100", "recall@1000", "precision@10"]
FULL = ["ndcg", "map", "ndcg@10"]
JUDGED = 30  # judged documents per query
NOISE = 0.1  # the fraction of them left random codes (relevant documents ranked deep)


def make_codes(n_corpus: int, n_queries: int, seed: int = 0):
    """Corpus and query codes, string ids, and the graded qrels (see the module)."""
    rng = np.random.default_rng(seed)
    corpus = (2 * rng.integers(0, 2, (n_corpus, BITS), dtype=np.int8) - 1).astype(np.float32)
    queries = (2 * rng.integers(0, 2, (n_queries, BITS), dtype=np.int8) - 1).astype(np.float32)
    doc_ids = [f"d{j}" for j in range(n_corpus)]
    query_ids = [f"q{i}" for i in range(n_queries)]
    qrels = {}
    placed = rng.choice(n_corpus, (n_queries, JUDGED), replace=False)  # distinct rows
    for i, qid in enumerate(query_ids):
        flips = rng.integers(8, 31, JUDGED)
        judged = {}
        for r, k in zip(placed[i].tolist(), flips.tolist(), strict=True):
            if rng.random() >= NOISE:  # else the row stays a random code: judged all the same
                code = queries[i].copy()
                code[rng.choice(BITS, k, replace=False)] *= -1
                corpus[r] = code
            judged[doc_ids[r]] = grade_of(k)
        qrels[qid] = judged
    return queries, corpus, query_ids, doc_ids, qrels


def grade_of(flips: int) -> int:
    """The grade of a document ``flips`` bits from its query."""
    return 3 if flips <= 13 else 2 if flips <= 17 else 1 if flips <= 21 else 0


def _product(q, c) -> dict:
    out = np.empty((q.shape[0], 50_000), np.float32)
    for a in range(0, c.shape[0], 50_000):
        part = c[a : a + 50_000]
        np.matmul(q, part.T, out=out[:, : part.shape[0]])
    return {}


def _faiss(q, c, qids, dids, qrels) -> dict:
    import faiss
    import pytrec_eval

    index = faiss.IndexBinaryFlat(BITS)
    index.add(np.packbits(c > 0, axis=1))
    dist, idx = index.search(np.packbits(q > 0, axis=1), DEPTH)
    run = {
        qid: {
            dids[j]: float(BITS - d) for j, d in zip(idx[i].tolist(), dist[i].tolist(), strict=True)
        }
        for i, qid in enumerate(qids)
    }
    measures = {"ndcg_cut.10", "map_cut.100", "recall.100", "recall.1000", "P.10"}
    values = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
    top10 = {qid: dict(list(docs.items())[:10]) for qid, docs in run.items()}
    rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
    names = {"ndcg_cut_10": "ndcg@10", "map_cut_100": "map@100", "recall_100": "recall@100",
             "recall_1000": "recall@1000", "P_10": "precision@10"}  # fmt: skip
    out = {n: float(np.mean([v[k] for v in values.values()])) for k, n in names.items()}
    out["mrr@10"] = float(np.mean([v["recip_rank"] for v in rr.values()]))
    return out


def _not_exact() -> None:
    """The scores not taken as exact: the engine's float32 band and float64 decisions."""
    import embedeval.engine.corpus as corpus_engine

    corpus_engine.integer_scores = lambda *args: None


def _embedeval(q, c, qids, dids, qrels, metrics, distance="inner_product") -> dict:
    import embedeval as ee

    res = ee.evaluate_qrels(q, c, qrels, query_ids=qids, doc_ids=dids, metrics=metrics,
                            distance=distance, progress=False)  # fmt: skip
    return {n: float(res[n]) for n in metrics}


def _positives(q, c, qids, dids, qrels) -> dict:
    import embedeval as ee

    row = {d: j for j, d in enumerate(dids)}
    pos = [sorted(row[d] for d, g in qrels[qid].items() if g >= 1) for qid in qids]
    names = ["map", "mrr", "precision_at_10"]
    res = ee.evaluate(q, None, c, None, positives=pos, metrics=names,
                      distance="inner_product", progress=False)  # fmt: skip
    return {n: float(res[n]) for n in names}


def child(case: str, n_corpus: int, n_queries: int) -> None:
    q, c, qids, dids, qrels = make_codes(n_corpus, n_queries)
    if case.endswith("_float64"):
        _not_exact()
    base = case.removesuffix("_float64")
    t0, c0 = time.perf_counter(), time.process_time()
    if base == "product":
        values = _product(q, c)
    elif base == "faiss":
        values = _faiss(q, c, qids, dids, qrels)
    elif base == "positives":
        values = _positives(q, c, qids, dids, qrels)
    elif base == "cosine":
        values = _embedeval(q, c, qids, dids, qrels, METRICS, "cosine")
    else:
        values = _embedeval(q, c, qids, dids, qrels, FULL if base == "full_depth" else METRICS)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"wall": wall, "cpu": cpu, "peak_mb": peak, "values": values}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated subset")
    parser.add_argument("--quick", action="store_true", help="50,000 codes, 250 queries")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    n_corpus, n_queries = (50_000, 250) if args.quick else (200_000, 1_000)
    if args.child:
        child(args.child, n_corpus, n_queries)
        return
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose among {', '.join(CASES)}")
    print(f"# {machine()}")
    print(f"# {n_corpus:,} codes of {BITS} bits, {n_queries:,} queries, depth {DEPTH}")
    rows = {}
    for case in cases:
        extra = ["--quick"] if args.quick else []
        rows[case] = r = run_child("benchmarks.bench_qrels_codes", "--child", case, *extra)
        print(f"{case}: {json.dumps(r)}", file=sys.stderr)
    base = rows.get("product", {}).get("wall")
    print("| case | wall s | cpu s | peak MB | x product |")
    print("|---|---|---|---|---|")
    for case, r in rows.items():
        if "error" in r:
            print(f"| {case} | failed: {r['error']} | | | |")
            continue
        ratio = f"{r['wall'] / base:.2f}" if base else "-"
        print(f"| {case} | {r['wall']:.2f} | {r['cpu']:.2f} | {r['peak_mb']:,.0f} | {ratio} |")
    for case, r in rows.items():
        if r.get("values"):
            print(f"{case}: " + ", ".join(f"{k} {v:.6f}" for k, v in r["values"].items()))


if __name__ == "__main__":
    main()
