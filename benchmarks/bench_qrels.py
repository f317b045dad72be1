"""IR evaluation against graded qrels: ``embedeval.evaluate_qrels`` vs the physical limit, faiss +
pytrec_eval, BEIR's exact search, a memory-mapped corpus and the ``positives=`` path, in one run.

Data (seeded, generated here, never stored): a corpus of 200,000 x 768 float32 rows with norms
drawn in [0.5, 2] (so cosine really normalises), 1,000 queries, and graded qrels (0-3): each
query judges 20-50 documents (about half of them grade 0, at least one relevant) that were built
at a cosine a ~ U(lo, hi) to it, higher grades nearer (grade 3: 0.1-0.4, 2: 0.05-0.25,
1: 0-0.16, 0: 0-0.2), while an unrelated row sits at cosine ~ N(0, 1/sqrt(768)) (the 10th
nearest at ~0.16, the 1,000th at ~0.093 at full size); so the metrics are far from 0 and 1
(nDCG@10 ~0.67, MAP@100 ~0.33, Recall@1000 ~0.65).  5 % of the judged rows (80 % of them
relevant) are copied exactly to an unjudged id: exact score ties between a relevant and a
non-relevant document, on which the tie rules of the tools differ.  Ids are strings (``"q17"``,
``"d123456"``).

Cases (each in a fresh process: wall time, CPU time, peak RSS and the sampled peaks of its
anonymous and file-backed parts):

1. ``product``   numpy ``queries @ chunk.T`` over corpus chunks of 50,000 into one reused result
   buffer: the physical limit.
2. ``faiss``     faiss ``IndexFlatIP`` (rows normalised chunk by chunk on the way in), top-depth
   search, the run dict, then ``pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10",
   "map_cut.100", "recall.100", "recall.<depth>", "P.10"})`` on it: what BEIR's and MTEB's faiss
   paths do.  MRR@10: trec_eval has no cut-off for ``recip_rank``, so a second evaluator
   computes ``recip_rank`` on the run cut to each query's first 10 (faiss's order).
3. ``beir``      BEIR's ``DenseRetrievalExactSearch`` (``corpus_chunk_size=50000``) through
   ``EvaluateRetrieval(..., score_function="cos_sim").retrieve`` with a model whose
   ``encode_queries`` / ``encode_corpus`` hand back the precomputed arrays, then
   ``EvaluateRetrieval.evaluate(qrels, results, [10, 100, depth])`` and
   ``evaluate_custom(..., metric="mrr")``.  The corpus / queries dicts BEIR takes as input are
   built before the timing.
4. ``embedeval``       ``ee.evaluate_qrels(q, c, qrels, query_ids=, doc_ids=, metrics=[...],
   distance="cosine")`` ("not available" until that function exists).
5. ``embedeval_mmap``  the same on the corpus written once to a float32 ``.npy`` and opened with
   ``np.load(path, mmap_mode="r")`` (page cache warm); ``embedeval_mmap16`` on a float16 copy.
   Peak RSS counts every page of the mapped file the process has touched (``RssFile``), which
   the kernel can drop at any time because the file holds them: the sampled peak of
   ``RssAnon`` is the memory the evaluation itself allocated.  ``--cgroup-limit MB`` also runs
   the float32 case inside a memory cgroup of that size (``benchmarks/_memlimit.py``) after
   dropping the file from the page cache, so every page it reads is charged to the group: it
   completes only if the evaluation streams the file instead of holding it.
6. ``positives``  ``ee.evaluate(q, None, c, None, positives=..., distance="cosine")`` (the
   streamed corpus engine: each positive's rank counted, no row sorted)
   (positives = each query's documents of grade >= 1) with ``map``, ``mrr`` (both full depth:
   that path has no cut-offs but ``precision_at_k``) and ``precision_at_10``.
   ``positives_shallow``: the same path with the top-10 metrics only (``mrr`` and
   ``precision_at_10`` under ``k=10``, the hit rate ``recall_at_10``): a positive that ten
   documents certainly beat is no longer counted.
7. ``torch_bf16``  ``embedeval`` with ``backend="torch", device="cpu", precision="bf16"``: the
   product of bfloat16 copies filters, the band it needs is re-scored in float64 (same values).
8. ``full_depth``  ``evaluate_qrels`` with trec_eval's uncut ``ndcg`` and ``map`` (every
   relevant document's rank in the whole corpus) beside nDCG@10 and MRR@10.
9. ``shallow``, ``shallow_bf16``  nDCG@10, MRR@10 and P@10 only (depth 10), numpy, then the
   torch CPU backend's bfloat16 filter (what ``precision="auto"`` takes at that depth on a CPU
   with AVX512-BF16 or AMX).  PyTorch is imported before the timing.

Run::

    python -m benchmarks.bench_qrels                      # everything at full size
    python -m benchmarks.bench_qrels --quick              # 20,000 x 768, 200 queries
    python -m benchmarks.bench_qrels --cases product,faiss --corpus 50000
    python -m benchmarks.bench_qrels --cgroup-limit 400   # + the memmap case under 400 MiB
    python -m benchmarks.bench_qrels --memory-budget 2048 # embedeval's blocks from 2 GiB
    python -m benchmarks.bench_qrels --cases product,embedeval --repeat 5  # median of 5 rounds
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np

from benchmarks._common import child_setup, machine, run_child

CHUNK = 50_000  # corpus rows per product in the "product" case (BEIR's corpus_chunk_size)
BLOCK = 8_192  # corpus rows generated per seeded block (fixes the data for any chunking)
GRADE_P = (0.5, 0.25, 0.15, 0.1)  # probability of grades 0..3 among judged documents
COSINE = {0: (0.0, 0.2), 1: (0.0, 0.16), 2: (0.05, 0.25), 3: (0.1, 0.4)}  # a ~ U(lo, hi)
CASES = (
    "product",
    "faiss",
    "beir",
    "embedeval",
    "embedeval_mmap",
    "embedeval_mmap16",
    "positives",
    "positives_shallow",
    "full_depth",
    "torch_bf16",
    "shallow",
    "shallow_bf16",
)
#: The shallow cases' metrics: what a BEIR / MTEB leaderboard reports first.
SHALLOW = ["ndcg@10", "mrr@10", "precision@10"]
#: The full_depth case's metrics: trec_eval's uncut ``ndcg`` and ``map`` beside two shallow ones.
FULL_DEPTH = ["ndcg", "map", "ndcg@10", "mrr@10"]
TARGETS = {
    "time / product": 1.3,
    "time / faiss": 0.65,
    "time / beir": 0.2,
    "memory over corpus MB": 300,
    "memmap peak MB": 1024,
    "bf16 time / product": 0.4,
}


def metric_names(depth: int) -> list[str]:
    """The metrics every IR case reports, in ``evaluate_qrels``'s spelling."""
    names = ["ndcg@10", "map@100", "mrr@10", "recall@100", f"recall@{depth}", "precision@10"]
    return list(dict.fromkeys(names))  # depth 100: one recall


# ---------------------------------------------------------------------------- data
@dataclass
class QrelsData:
    """Everything but the corpus rows, which ``corpus_block`` generates block by block."""

    n_corpus: int
    dim: int
    seed: int
    queries: np.ndarray  # (n_queries, dim) float32, norms in [0.5, 2]
    qhat: np.ndarray  # the unit query directions
    query_ids: list[str]
    doc_ids: list[str]
    qrels: dict[str, dict[str, int]]
    judged_rows: np.ndarray  # corpus rows built near a query, sorted
    judged_query: np.ndarray  # the query each was built for
    judged_cosine: np.ndarray  # its cosine to that query (before float32 rounding)
    judged_grade: np.ndarray
    dup_src: np.ndarray  # judged rows copied exactly ...
    dup_dst: np.ndarray  # ... to these unjudged rows
    scale: np.ndarray  # (n_corpus,) row norms

    def positives(self) -> list[list[int]]:
        """Per query, the corpus rows of grade >= 1 (``evaluate(..., positives=)``)."""
        out: list[list[int]] = [[] for _ in self.query_ids]
        for r, q, g in zip(
            self.judged_rows.tolist(),
            self.judged_query.tolist(),
            self.judged_grade.tolist(),
            strict=True,
        ):
            if g >= 1:
                out[q].append(r)
        return [sorted(p) for p in out]


def make_qrels_data(n_corpus: int, n_queries: int, dim: int = 768, seed: int = 0) -> QrelsData:
    """Seeded queries, qrels and the recipe of the corpus (see the module docstring)."""
    rng = np.random.default_rng([seed, 0])
    q = rng.standard_normal((n_queries, dim), dtype=np.float32)
    qhat = q / np.linalg.norm(q, axis=1, keepdims=True)
    queries = (qhat * rng.uniform(0.5, 2.0, (n_queries, 1))).astype(np.float32)
    counts = rng.integers(20, 51, n_queries)
    budget = n_corpus // 3  # judged rows, leaving most of the corpus unjudged
    if counts.sum() > budget:
        counts = np.maximum(2, counts * budget // counts.sum())
    total = int(counts.sum())
    if total > budget:
        raise ValueError(f"corpus of {n_corpus} rows too small for {n_queries} queries")
    perm = rng.permutation(n_corpus)
    rows, unjudged = perm[:total], perm[total:]
    query_of = np.repeat(np.arange(n_queries), counts)
    grade = rng.choice(4, size=total, p=GRADE_P)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    for qi, s in enumerate(starts):  # at least one relevant document per query
        if not grade[s : s + counts[qi]].any():
            grade[s] = rng.integers(1, 4)
    lo = np.array([COSINE[g][0] for g in range(4)])[grade]
    hi = np.array([COSINE[g][1] for g in range(4)])[grade]
    cosine = lo + (hi - lo) * rng.random(total)
    n_dup = max(1, total // 20)  # 5 % of the judged rows get an exact copy
    relevant = np.flatnonzero(grade >= 1)
    nonrel = np.flatnonzero(grade == 0)
    n_rel_src = min(relevant.size, int(0.8 * n_dup))
    src_pos = np.concatenate(
        [
            rng.choice(relevant, n_rel_src, replace=False),
            rng.choice(nonrel, min(nonrel.size, n_dup - n_rel_src), replace=False),
        ]
    )
    dup_src = rows[src_pos]
    dup_dst = rng.choice(unjudged, dup_src.size, replace=False)
    scale = rng.uniform(0.5, 2.0, n_corpus).astype(np.float32)
    scale[dup_dst] = scale[dup_src]
    query_ids = [f"q{i}" for i in range(n_queries)]
    doc_ids = [f"d{i}" for i in range(n_corpus)]
    qrels: dict[str, dict[str, int]] = {qid: {} for qid in query_ids}
    for r, qi, g in zip(rows.tolist(), query_of.tolist(), grade.tolist(), strict=True):
        qrels[query_ids[qi]][doc_ids[r]] = g
    order = np.argsort(rows)
    return QrelsData(
        n_corpus=n_corpus,
        dim=dim,
        seed=seed,
        queries=queries,
        qhat=qhat,
        query_ids=query_ids,
        doc_ids=doc_ids,
        qrels=qrels,
        judged_rows=rows[order],
        judged_query=query_of[order],
        judged_cosine=cosine[order],
        judged_grade=grade[order],
        dup_src=dup_src,
        dup_dst=dup_dst,
        scale=scale,
    )


def corpus_block(data: QrelsData, b: int) -> np.ndarray:
    """Rows ``b * BLOCK`` up to ``(b + 1) * BLOCK`` of the corpus, before the duplicates are
    copied in: random directions, judged rows turned towards their query, scaled norms."""
    start, stop = b * BLOCK, min((b + 1) * BLOCK, data.n_corpus)
    x = np.random.default_rng([data.seed, 1, b]).standard_normal(
        (stop - start, data.dim), dtype=np.float32
    )
    lo, hi = np.searchsorted(data.judged_rows, [start, stop])
    if hi > lo:
        local = data.judged_rows[lo:hi] - start
        u = data.qhat[data.judged_query[lo:hi]]
        a = data.judged_cosine[lo:hi, None].astype(np.float32)
        n = x[local]
        n -= np.einsum("ij,ij->i", n, u)[:, None] * u  # orthogonal to the query
        n /= np.linalg.norm(n, axis=1, keepdims=True)
        x[local] = a * u + np.sqrt(1 - a * a) * n
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x *= data.scale[start:stop, None]
    return x


def fill_corpus(data: QrelsData, out: np.ndarray) -> np.ndarray:
    """Write the whole corpus into ``out`` (an array or a writable memmap) block by block."""
    for b in range(-(-data.n_corpus // BLOCK)):
        start = b * BLOCK
        out[start : start + BLOCK] = corpus_block(data, b)
    out[data.dup_dst] = out[data.dup_src]  # exact copies: exact score ties
    return out


def make_corpus(data: QrelsData) -> np.ndarray:
    """The corpus in memory, without temporaries of its size."""
    return fill_corpus(data, np.empty((data.n_corpus, data.dim), np.float32))


def write_corpus_npy(data: QrelsData, path: str, dtype: str = "float32") -> None:
    """The corpus as a ``.npy`` file (``np.load(path, mmap_mode="r")`` opens it)."""
    out = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(data.n_corpus, data.dim))
    fill_corpus(data, out)
    out.flush()
    del out


def drop_page_cache(path: str) -> None:
    """Write the file back and drop its pages from the page cache, so that the next reader
    faults every page in (and a memory cgroup charges them to that reader)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def filesystem_type(path: str) -> str:
    """Type of the file system holding ``path`` (tmpfs pages cannot be dropped without swap)."""
    best, kind = "", "?"
    path = os.path.realpath(path)
    with open("/proc/mounts") as fh:
        for line in fh:
            parts = line.split()
            mount = parts[1]
            inside = path == mount or path.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) > len(best):
                best, kind = mount, parts[2]
    return kind


# ---------------------------------------------------------------------------- pytrec_eval
def pytrec_measures(depth: int) -> set[str]:
    return {"ndcg_cut.10", "map_cut.100", "recall.100", f"recall.{depth}", "P.10"}


def top_of_run(run: dict[str, dict[str, float]], k: int) -> dict[str, dict[str, float]]:
    """Each query's first ``k`` documents in trec_eval's order (score descending, equal scores
    by document id descending), for ``recip_rank`` at a cut-off."""
    return {
        qid: dict(sorted(docs.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)[:k])
        for qid, docs in run.items()
    }


def pytrec_values(
    qrels: dict[str, dict[str, int]],
    run: dict[str, dict[str, float]],
    depth: int,
    run10: dict[str, dict[str, float]] | None = None,
    per_query: bool = False,
) -> dict:
    """Means over the queries (or per query) of the IR metrics by pytrec_eval; MRR@10 is
    ``recip_rank`` on ``run10`` (default: ``top_of_run(run, 10)``)."""
    import pytrec_eval

    scores = pytrec_eval.RelevanceEvaluator(qrels, pytrec_measures(depth)).evaluate(run)
    rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(
        top_of_run(run, 10) if run10 is None else run10
    )
    keys = {
        "ndcg@10": "ndcg_cut_10",
        "map@100": "map_cut_100",
        "recall@100": "recall_100",
        f"recall@{depth}": f"recall_{depth}",
        "precision@10": "P_10",
    }
    table = {name: {qid: s[key] for qid, s in scores.items()} for name, key in keys.items()}
    table["mrr@10"] = {qid: s["recip_rank"] for qid, s in rr.items()}
    table = {name: table[name] for name in metric_names(depth)}
    if per_query:
        return table
    return {name: float(np.mean(list(v.values()))) for name, v in table.items()}


# ---------------------------------------------------------------------------- report
def median_run(runs: list[dict], product: list[dict] | None) -> dict:
    """A case's report over its rounds: the run of median time (the first failure, if any), with
    every round's time and the median over rounds of its ratio to the product *of the same
    round* (a round runs every case once, so the machine's drift between rounds cancels).

    >>> r = median_run([{"seconds": 3.0}, {"seconds": 2.0}, {"seconds": 4.0}],
    ...                [{"seconds": 2.0}, {"seconds": 1.0}, {"seconds": 2.0}])
    >>> r["seconds"], r["rounds"], r["product_ratio"]
    (3.0, [3.0, 2.0, 4.0], 2.0)
    """
    for r in runs:
        if "seconds" not in r:
            return r
    out = dict(sorted(runs, key=lambda r: r["seconds"])[(len(runs) - 1) // 2])
    out["rounds"] = [r["seconds"] for r in runs]
    if product and len(product) == len(runs) and all("seconds" in p for p in product):
        ratios = [r["seconds"] / p["seconds"] for r, p in zip(runs, product, strict=True)]
        out["product_ratio"] = float(np.median(ratios))
    return out


def _x_product(r: dict, product: dict) -> float:
    """The ratio to the product: the median of the rounds' ratios where there are rounds."""
    return r.get("product_ratio", r["seconds"] / product["seconds"])


def _fmt_time(r: dict) -> str:
    return f"{r['seconds']:8.2f} {r['cpu_seconds']:7.2f}"


def report(rows: dict[str, dict], corpus_mb: float, depth: int, limited: dict | None) -> None:
    product = rows.get("product", {})
    print(
        f"\n{'case':<18} {'wall s':>8} {'cpu s':>7} {'peak MB':>8} {'anon MB':>8} {'file MB':>8}"
        f" {'data MB':>8} {'x product':>10}"
    )
    for case, r in rows.items():
        if "error" in r:
            print(f"{case:<18} failed: {r['error']}")
            continue
        if "unavailable" in r:
            print(f"{case:<18} not available: {r['unavailable']}")
            continue
        ratio = f"{_x_product(r, product):10.3f}" if "seconds" in product else ""
        print(
            f"{case:<18} {_fmt_time(r)} {r['peak_mb']:8.0f} {r['peak_anon_mb']:8.0f}"
            f" {r['peak_file_mb']:8.0f} {r['data_mb']:8.0f} {ratio}"
        )
    print(
        "peak MB = ru_maxrss (anonymous + mapped file pages); anon / file MB = sampled peaks of "
        "RssAnon / RssFile; data MB = RSS before the timed part"
    )
    if any(len(r.get("rounds", [])) > 1 for r in rows.values()):
        print("rounds (wall s; the row above is the median round, x product the median ratio):")
        for case, r in rows.items():
            if len(r.get("rounds", [])) > 1:
                print(f"  {case:<18} " + " ".join(f"{t:.2f}" for t in r["rounds"]))

    names = metric_names(depth)
    print(f"\n{'values':<24} " + " ".join(f"{n:>12}" for n in names))
    for case, r in rows.items():
        for label, vals in (("", r.get("values")), (" (pytrec check)", r.get("check"))):
            if vals:
                cells = [f"{vals[n]:12.6f}" if n in vals else f"{'-':>12}" for n in names]
                print(f"{case + label:<24} " + " ".join(cells))
        other = {k: v for k, v in (r.get("values") or {}).items() if k not in names}
        if other:
            print(f"{case:<24} " + ", ".join(f"{k}={v:.6f}" for k, v in other.items()))
    ref = rows.get("faiss", {}).get("values")
    for case in ("beir", "embedeval", "embedeval_mmap", "embedeval_mmap16", "positives",
                 "positives_shallow", "full_depth", "torch_bf16", "shallow",
                 "shallow_bf16"):  # fmt: skip
        vals = rows.get(case, {}).get("values")
        common = [n for n in names if ref and vals and n in vals]
        if common:
            diff = max(abs(vals[n] - ref[n]) for n in common)
            print(f"max |{case} - faiss+pytrec_eval| over {', '.join(common)}: {diff:.2e}")

    print(f"\ntargets (corpus = {corpus_mb:.0f} MB):")
    for case in ("embedeval", "embedeval_mmap", "embedeval_mmap16", "positives",
                 "positives_shallow"):  # fmt: skip
        r = rows.get(case)
        if not r or "seconds" not in r:
            state = "not run" if not r else ("not available" if "unavailable" in r else "failed")
            print(f"  {case}: {state}")
            continue
        parts = []
        for other, key in (("product", "time / product"), ("faiss", "time / faiss")):
            o = rows.get(other, {})
            if "seconds" in o:
                x = _x_product(r, o) if other == "product" else r["seconds"] / o["seconds"]
                ok = "met" if x <= TARGETS[key] else "MISSED"
                parts.append(f"{x:.3f} x {other} (target <= {TARGETS[key]}: {ok})")
        o = rows.get("beir", {})
        if "seconds" in o:
            x = r["seconds"] / o["seconds"]
            ok = "met" if x <= TARGETS["time / beir"] else "MISSED"
            parts.append(f"{x:.3f} x BEIR (target <= {TARGETS['time / beir']}: {ok})")
        if case.startswith("embedeval_mmap"):
            cap = TARGETS["memmap peak MB"]
            ok = "met" if r["peak_mb"] <= cap else "MISSED"
            parts.append(
                f"peak RSS {r['peak_mb']:.0f} MB (target <= {cap}: {ok}; anonymous "
                f"{r['peak_anon_mb']:.0f} MB)"
            )
        else:
            cap = corpus_mb + TARGETS["memory over corpus MB"]
            ok = "met" if r["peak_mb"] <= cap else "MISSED"
            parts.append(f"peak RSS {r['peak_mb']:.0f} MB (target <= {cap:.0f}: {ok})")
        print(f"  {case}: " + "; ".join(parts))
    for case in ("full_depth", "torch_bf16", "shallow", "shallow_bf16"):
        r, o = rows.get(case, {}), rows.get("product", {})
        if "seconds" in r and "seconds" in o:
            x, cap = _x_product(r, o), TARGETS["bf16 time / product"]
            goal = f" (target for a bfloat16 filter <= {cap}: {'met' if x <= cap else 'MISSED'})"
            print(f"  {case}: {x:.3f} x product" + (goal if case.endswith("bf16") else ""))
    if limited is not None:
        print(f"\nmemory-mapped float32 corpus under a memory cgroup: {limited['summary']}")


# ---------------------------------------------------------------------------- driver
def run_limited_case(args: argparse.Namespace, path: str) -> dict:
    from benchmarks._memlimit import MemoryLimitUnavailable, run_limited

    drop_page_cache(path)
    env, root = child_setup()
    argv = [sys.executable, "-m", "benchmarks._qrels_child", "embedeval_mmap", *child_args(args)]
    argv += ["--path", path]
    try:
        lr = run_limited(argv, args.cgroup_limit, env=env, cwd=root)
    except MemoryLimitUnavailable as exc:
        return {"summary": f"not run: {exc}"}
    out: dict = {}
    if lr.returncode == 0 and lr.stdout.strip():
        out = json.loads(lr.stdout.strip().splitlines()[-1])
    if "unavailable" in out:
        state = f"not run: {out['unavailable']}"
    elif lr.completed:
        state = (
            f"COMPLETED in {out['seconds']:.2f} s (peak RSS {out['peak_mb']:.0f} MB, anonymous "
            f"{out['peak_anon_mb']:.0f} MB)"
        )
    elif lr.oom_kills:
        state = f"KILLED by the OOM killer (rc {lr.returncode})"
    else:
        tail = lr.stderr.strip().splitlines()[-1:] or ["no output"]
        state = f"FAILED (rc {lr.returncode}): {tail[0]}"
    peak = f"{lr.peak_mb:.0f}" if lr.peak_mb is not None else "?"
    out["summary"] = (
        f"{state}; limit {lr.limit_mb:.0f} MiB (cgroup {lr.cgroup}, {os.path.dirname(lr.path)}/"
        f"<group>), the group's peak charge {peak} MiB (anonymous + page cache it faulted in), "
        "file dropped from the page cache first"
    )
    return out


def child_args(args: argparse.Namespace) -> list[str]:
    return [
        "--corpus",
        str(args.corpus),
        "--queries",
        str(args.queries),
        "--dim",
        str(args.dim),
        "--depth",
        str(args.depth),
        "--seed",
        str(args.seed),
        *(["--memory-budget", str(args.memory_budget)] if args.memory_budget else []),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=int, default=None, help="corpus rows (200,000)")
    parser.add_argument("--queries", type=int, default=None, help="queries (1,000)")
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--depth", type=int, default=1000, help="top-k searched (>= 100)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated subset")
    parser.add_argument("--quick", action="store_true", help="20,000 rows, 200 queries")
    parser.add_argument(
        "--cgroup-limit", type=float, default=None, metavar="MB", help="memmap case under a limit"
    )
    parser.add_argument("--tmpdir", default=None, help="where the .npy files go (not tmpfs)")
    parser.add_argument(
        "--repeat", type=int, default=1, metavar="N",
        help="rounds of every case (each in its own process); the median round is reported",
    )  # fmt: skip
    parser.add_argument(
        "--memory-budget", type=int, default=None, metavar="MiB",
        help="embedeval's memory_budget (default: the library's, 256 MiB)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    args.corpus = args.corpus or (20_000 if args.quick else 200_000)
    args.queries = args.queries or (200 if args.quick else 1_000)
    if args.depth < 100:
        parser.error("--depth must be at least 100 (Recall@100 and MAP@100 read that deep)")
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose among {', '.join(CASES)}")

    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"machine: {machine()}")
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {load}; corpus "
        f"{args.corpus:,} x {args.dim} float32, {args.queries:,} queries, depth {args.depth}, "
        f"seed {args.seed}"
        + (f", memory_budget {args.memory_budget} MiB" if args.memory_budget else "")
    )
    corpus_mb = args.corpus * args.dim * 4 / 2**20
    need_files = any(c.startswith("embedeval_mmap") for c in cases) or args.cgroup_limit
    tmp = tempfile.mkdtemp(prefix="embedeval_bench_qrels_", dir=args.tmpdir) if need_files else ""
    rows: dict[str, dict] = {}
    limited = None
    try:
        if need_files:
            kind = filesystem_type(tmp)
            if kind == "tmpfs":
                print(f"warning: {tmp} is on tmpfs: its pages are memory, not a file; --tmpdir")
            w = run_child("benchmarks._qrels_child", "write", *child_args(args), "--path", tmp)
            if "error" in w:
                raise SystemExit(f"writing the corpus files failed: {w['error']}")
            print(f"corpus files written in {w['seconds']:.1f} s ({kind})")
        runs: dict[str, list[dict]] = {case: [] for case in cases}
        for _ in range(max(1, args.repeat)):  # rounds: the machine's speed drifts between them
            for case in cases:
                extra = []
                if case == "embedeval_mmap":
                    extra = ["--path", os.path.join(tmp, "corpus_f32.npy")]
                elif case == "embedeval_mmap16":
                    extra = ["--path", os.path.join(tmp, "corpus_f16.npy")]
                runs[case].append(
                    run_child("benchmarks._qrels_child", case, *child_args(args), *extra)
                )
        rows = {case: median_run(rs, runs.get("product")) for case, rs in runs.items()}
        if args.cgroup_limit:
            limited = run_limited_case(args, os.path.join(tmp, "corpus_f32.npy"))
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    report(rows, corpus_mb, args.depth, limited)


if __name__ == "__main__":
    main()
