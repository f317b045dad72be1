"""One measurement of bench_qrels.py, run in its own process: prints one JSON line."""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import numpy as np

from benchmarks._common import PeakSampler, Timer, peak_rss_mb, rss_parts_mb
from benchmarks.bench_qrels import (
    CHUNK,
    FULL_DEPTH,
    SHALLOW,
    drop_page_cache,
    make_corpus,
    make_qrels_data,
    metric_names,
    pytrec_values,
    write_corpus_npy,
)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def embedeval_values(res: object) -> dict[str, float]:
    """The means of an evaluation result, whatever its shape (a result object or a mapping)."""
    metrics = getattr(res, "metrics", res)
    return {str(k): float(v) for k, v in dict(metrics).items()}


def faiss_pytrec(data, corpus, depth: int) -> dict[str, float]:
    import faiss

    index = faiss.IndexFlatIP(data.dim)
    for s in range(0, corpus.shape[0], CHUNK):  # cosine: unit rows, one chunk copied at a time
        c = np.array(corpus[s : s + CHUNK], dtype=np.float32)
        faiss.normalize_L2(c)
        index.add(c)
    q = data.queries.copy()
    faiss.normalize_L2(q)
    scores, idx = index.search(q, depth)
    del index
    docs = np.array(data.doc_ids, dtype=object)
    run, run10 = {}, {}
    for i, qid in enumerate(data.query_ids):
        keep = idx[i] >= 0
        names = docs[idx[i][keep]].tolist()
        vals = scores[i][keep].tolist()
        run[qid] = dict(zip(names, vals, strict=True))
        run10[qid] = dict(
            zip(names[:10], vals[:10], strict=True)
        )  # faiss's order: MRR@10 = recip_rank here
    return pytrec_values(data.qrels, run, depth, run10=run10)


class PrecomputedModel:
    """What BEIR's dense search calls: ``encode_queries`` and ``encode_corpus``, handing back
    the precomputed embeddings (the corpus dicts carry their row as ``"row"``)."""

    def __init__(self, queries: np.ndarray, corpus: np.ndarray, query_ids: list[str]) -> None:
        self.queries, self.corpus, self.query_ids = queries, corpus, query_ids

    def encode_queries(self, queries: list[str], **kwargs: object):
        import torch

        if list(queries) != self.query_ids:  # the query texts are their ids
            raise RuntimeError("BEIR passed the queries in another order")
        return torch.from_numpy(self.queries)

    def encode_corpus(self, docs: list[dict], **kwargs: object):
        import torch

        rows = np.fromiter((d["row"] for d in docs), np.int64, len(docs))
        if rows.size and np.array_equal(rows, np.arange(rows[0], rows[0] + rows.size)):
            return torch.from_numpy(self.corpus[rows[0] : rows[0] + rows.size])  # no copy
        return torch.from_numpy(self.corpus[rows])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("method")
    parser.add_argument("--corpus", type=int, required=True)
    parser.add_argument("--queries", type=int, required=True)
    parser.add_argument("--dim", type=int, required=True)
    parser.add_argument("--depth", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--path", default=None)
    parser.add_argument("--memory-budget", type=int, default=None)  # MiB
    args = parser.parse_args()
    budget = {} if args.memory_budget is None else {"memory_budget": args.memory_budget << 20}
    method, depth = args.method, args.depth
    data = make_qrels_data(args.corpus, args.queries, args.dim, args.seed)

    if method == "write":  # the memory-mapped cases' files, written once
        t0 = time.perf_counter()
        for dtype, name in (("float32", "corpus_f32.npy"), ("float16", "corpus_f16.npy")):
            path = os.path.join(args.path, name)
            write_corpus_npy(data, path, dtype)
            drop_page_cache(path)  # written back, so no dirty pages are left to any reader
        print(json.dumps({"seconds": time.perf_counter() - t0}))
        return

    if method.startswith("embedeval_mmap"):
        corpus = np.load(args.path, mmap_mode="r")
    else:
        corpus = make_corpus(data)
    values: dict[str, float] = {}
    check: dict[str, float] = {}
    ee_metrics = metric_names(depth)
    torch_kw: dict[str, str] = {}
    if method.endswith("bf16"):
        try:
            import torch  # imported outside the timing
        except ImportError:
            print(json.dumps({"unavailable": "PyTorch is not installed (pip install torch)"}))
            return
        torch_kw = {"backend": "torch", "device": "cpu", "precision": "bf16"}
    if method.startswith("shallow"):
        ee_metrics = list(SHALLOW)
    if method == "full_depth":
        ee_metrics = list(FULL_DEPTH)
    if method in (
        "embedeval", "embedeval_mmap", "embedeval_mmap16", "positives", "positives_shallow",
        "full_depth", "torch_bf16", "shallow", "shallow_bf16",
    ):  # fmt: skip
        import embedeval as ee

        if not method.startswith("positives") and not hasattr(ee, "evaluate_qrels"):
            print(json.dumps({"unavailable": "embedeval has no evaluate_qrels yet"}))
            return
    if method == "beir":
        import torch
        from beir.retrieval.evaluation import EvaluateRetrieval
        from beir.retrieval.search.dense import DenseRetrievalExactSearch

        # BEIR's inputs: corpus and queries as dicts (equal text lengths keep the corpus order
        # in its longest-first sort, so each chunk is a slice of the array).
        beir_corpus = {d: {"title": "", "text": "", "row": i} for i, d in enumerate(data.doc_ids)}
        beir_queries = {qid: qid for qid in data.query_ids}
        model = PrecomputedModel(data.queries, corpus, data.query_ids)
        torch.set_grad_enabled(False)
    if method.startswith("positives"):
        positives = data.positives()

    base = peak_rss_mb()
    data_mb = sum(rss_parts_mb().values())
    cpu0 = cpu_seconds()
    with PeakSampler() as sampler:
        if method == "product":
            q = data.queries
            with Timer() as t:
                buf = np.empty((q.shape[0], min(CHUNK, corpus.shape[0])), np.float32)
                for s in range(0, corpus.shape[0], CHUNK):
                    c = corpus[s : s + CHUNK]
                    out = (
                        buf
                        if c.shape[0] == buf.shape[1]
                        else np.empty((q.shape[0], c.shape[0]), q.dtype)
                    )
                    np.matmul(q, c.T, out=out)  # one result buffer, faulted in once
        elif method == "faiss":
            with Timer() as t:
                values = faiss_pytrec(data, corpus, depth)
        elif method == "beir":
            k_values = sorted({10, 100, depth})
            with Timer() as t:
                retriever = DenseRetrievalExactSearch(
                    model, batch_size=128, corpus_chunk_size=CHUNK, show_progress_bar=False
                )
                er = EvaluateRetrieval(retriever, k_values=k_values, score_function="cos_sim")
                results = er.retrieve(beir_corpus, beir_queries)
                ndcg, _map, recall, precision = EvaluateRetrieval.evaluate(
                    data.qrels, results, k_values
                )
                mrr = EvaluateRetrieval.evaluate_custom(data.qrels, results, k_values, "mrr")
            values = {
                "ndcg@10": ndcg["NDCG@10"],
                "map@100": _map["MAP@100"],
                "mrr@10": mrr["MRR@10"],
                "recall@100": recall["Recall@100"],
                f"recall@{depth}": recall[f"Recall@{depth}"],
                "precision@10": precision["P@10"],
            }
        elif method in (
            "embedeval", "embedeval_mmap", "embedeval_mmap16", "full_depth", "torch_bf16",
            "shallow", "shallow_bf16",
        ):  # fmt: skip
            with Timer() as t:
                res = ee.evaluate_qrels(
                    data.queries,
                    corpus,
                    data.qrels,
                    query_ids=data.query_ids,
                    doc_ids=data.doc_ids,
                    metrics=ee_metrics,
                    distance="cosine",
                    **budget,
                    **torch_kw,
                )
            values = embedeval_values(res)
        elif method.startswith("positives"):
            # "positives_shallow": the top-10 metrics only (every metric cut at k = 10)
            shallow = method == "positives_shallow"
            names = ["mrr", "precision_at_10"] + (["recall_at_10"] if shallow else ["map"])
            with Timer() as t:
                res = ee.evaluate(
                    data.queries,
                    None,
                    corpus,
                    None,
                    positives=positives,
                    metrics=names,
                    k=10 if shallow else None,
                    distance="cosine",
                    progress=False,
                    **budget,
                )
            got = embedeval_values(res)
            values = {
                "mrr@10" if shallow else "mrr (full depth)": got["mrr"],
                "precision@10": got["precision_at_10"],
            }
            if shallow:
                values["hit rate@10"] = got["recall_at_10"]
            else:
                values["map (full depth)"] = got["map"]
        else:
            raise ValueError(method)
    cpu = cpu_seconds() - cpu0
    if method == "beir":  # outside the timing: pytrec_eval itself on BEIR's run
        check = pytrec_values(data.qrels, results, depth)
    print(
        json.dumps(
            {
                "seconds": t.seconds,
                "cpu_seconds": cpu,
                "peak_mb": peak_rss_mb(),
                "baseline_mb": base,
                "data_mb": data_mb,
                "peak_anon_mb": sampler.peak_anon_mb,
                "peak_file_mb": sampler.peak_file_mb,
                "values": values,
                "check": check,
                "at": time.time(),
            }
        )
    )


if __name__ == "__main__":
    main()
