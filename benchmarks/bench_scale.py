"""Benchmarks of the scaled backends: approximate index, its reported error, Dask.

Cases (run one at a time; each prints a JSON line and a short table):

* ``approx``  — N vectors (default 1,000,000), d=128, 10,000 classes, seeded synthetic clusters
  (L2-normalised float32, generated in blocks into a memory-mapped file in the temporary
  directory, never committed), evaluated end to end with an IVF index trained on 64 rows per list
  (``train_index(..., training_rows=)``, then passed to ``evaluate``); reports wall time, the
  index's timings and the exact-sample error (|MAP@R(approx) - MAP@R(exact)| on 10,000 queries).
* ``medium``  — the same generator at 100,000 vectors: a full exact run beside the approximate
  one, to check the error the 10,000-query sample reports against the error over all queries.
* ``sweep``   — a cheap pilot of several index configurations at full size (all N vectors in
  the index, only the 10,000-query sample searched, brute-force neighbours as the oracle).
* ``dask``    — 200,000 reference vectors, a query subset: local engine vs the Dask backend on
  a LocalCluster with one and with two single-threaded worker processes, beside the local
  engine on one thread (one worker's share) and on all; checks the numbers are identical.
* ``deep``    — full-depth ``map`` + P@1 on the hashing shape (``--queries`` of 5,000 queries
  against 50,000 rows, d = 64, 10 classes) through every backend, in one process: the local
  deep engine; ``shards=2`` at the default memory budget (the reference fits it: searched
  whole); the local engine and ``shards=2`` under a 16 MiB budget (the reference read shard
  by shard for each super-block of queries, against the local engine at that budget); the
  Dask backend on two single-threaded worker processes (the deep engine on each).  Times,
  ratios and whether the numbers are identical.

Usage::

    python -m benchmarks.bench_scale medium
    python -m benchmarks.bench_scale dask --queries 40000
    python -m benchmarks.bench_scale deep --queries 1000
    python -m benchmarks.bench_scale approx --n 1000000 --index IVF4096,Flat --nprobe 12
    python -m benchmarks.bench_scale approx --n 1000000 --index HNSW32 --ef-search 128
    python -m benchmarks.bench_scale sweep "IVF4096,Flat|nprobe=8,16" "HNSW32|efSearch=128"
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np

D = 128
N_CLASSES = 10_000
# Generated data and exact neighbours are cached here between runs (never committed).
CACHE_DIR = tempfile.gettempdir()


def cluster_cache_path(n: int, n_classes: int, seed: int, spread: float, tag: str = "") -> str:
    """File that ``make_clusters`` writes its vectors to (and reads them back from)."""
    name = f"embedeval_bench_scale_{n}_{n_classes}_{seed}_{spread}{tag}.f32"
    return os.path.join(CACHE_DIR, name)


def make_clusters(
    n: int,
    *,
    n_classes: int = N_CLASSES,
    seed: int = 0,
    spread: float = 0.12,
    intrinsic_dim: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded clusters, L2-normalised, written in blocks to a memory-mapped file in ``CACHE_DIR``.

    ``intrinsic_dim=None`` (the original, hard setting): class centres on the unit sphere of
    R^128 plus isotropic Gaussian noise (``spread`` per dimension) in all 128 dimensions.
    ``intrinsic_dim=r``: the same construction inside a random r-dimensional subspace (centres
    on its unit sphere, noise ``spread`` per latent dimension), mapped into R^128 by a seeded
    random orthonormal basis, so the data has intrinsic dimension r as real embedding spaces
    have a low one.  The default setting's files and values are unchanged.
    """
    tag = "" if intrinsic_dim is None else f"_r{intrinsic_dim}"
    path = cluster_cache_path(n, n_classes, seed, spread, tag)
    rng = np.random.default_rng(seed)
    r = D if intrinsic_dim is None else int(intrinsic_dim)
    centers = rng.standard_normal((n_classes, r)).astype(np.float32)
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    labels = rng.integers(0, n_classes, n)
    basis = None
    if intrinsic_dim is not None:
        basis = np.linalg.qr(rng.standard_normal((D, r)))[0].T.astype(np.float32)  # (r, D)
    if os.path.exists(path) and os.path.getsize(path) == n * D * 4:
        return np.memmap(path, dtype=np.float32, mode="r", shape=(n, D)), labels
    tmp = path + ".part"
    x = np.memmap(tmp, dtype=np.float32, mode="w+", shape=(n, D))
    step = 100_000
    for b, start in enumerate(range(0, n, step)):
        stop = min(start + step, n)
        block_rng = np.random.default_rng([seed, b])
        v = centers[labels[start:stop]] + spread * block_rng.standard_normal(
            (stop - start, r), dtype=np.float32
        )
        if basis is not None:
            v = v @ basis
        x[start:stop] = v / np.linalg.norm(v, axis=1, keepdims=True)
    x.flush()
    del x
    os.replace(tmp, path)  # atomic: a killed run never leaves a half-written data file
    return np.memmap(path, dtype=np.float32, mode="r", shape=(n, D)), labels


def case_approx(args: argparse.Namespace) -> dict:
    from embedeval import evaluate, train_index

    load_start = round(os.getloadavg()[0], 2)
    t_start = time.perf_counter()
    x, y = make_clusters(
        args.n, n_classes=args.classes, spread=args.spread, intrinsic_dim=args.intrinsic_dim
    )
    t_data = time.perf_counter() - t_start
    t0 = time.perf_counter()
    coarse = args.index.split(",")[0]
    nlist = int(coarse[3:].split("_")[0]) if coarse.startswith("IVF") else 0
    rows = args.training_rows or (64 * nlist if nlist else None)
    trained = train_index(x, args.index, seed=0, training_rows=rows, clustering=args.clustering)
    t_train = time.perf_counter() - t0
    params: dict = {"nprobe": args.nprobe} if nlist else {}
    if "_HNSW" in coarse:
        params["quantizer_efSearch"] = max(args.quantizer_ef, args.nprobe)
    if args.ef_search:
        params["efSearch"] = args.ef_search
    t0 = time.perf_counter()
    res = evaluate(
        x,
        y,
        index=trained,
        index_params=params or None,
        exact_sample=args.exact_sample,
        progress=False,
    )
    t_eval = time.perf_counter() - t0
    report = res.approximation
    m = report["metrics"]["map_at_r"]
    return {
        "case": "approx",
        "n": args.n,
        "spread": args.spread,
        "intrinsic_dim": args.intrinsic_dim,
        "index": args.index,
        "index_params": params,
        "clustering": args.clustering,
        "training_rows": rows,
        "load_avg_1min_start_end": [load_start, round(os.getloadavg()[0], 2)],
        "data_s": round(t_data, 1),
        "train_s": round(t_train, 1),
        "evaluate_s": round(t_eval, 1),
        "end_to_end_s": round(time.perf_counter() - t_start, 1),
        "metrics": res.metrics,
        "knn_recall": report["knn_recall"],
        "map_at_r_sample_exact": m["exact"],
        "map_at_r_sample_approx": m["approximate"],
        "map_at_r_abs_diff": abs(m["difference"]),
        "map_at_r_diff_ci": m["difference_ci"],
        "timings": report["timings"],
        "n_sample": report["n_sample"],
    }


def case_sweep(args: argparse.Namespace) -> list[dict]:
    """A cheap pilot of index configurations at full size: each index is trained and filled
    with all N vectors, but only a seeded sample of ``--exact-sample`` queries is searched
    (faiss alone, k = --k) and compared with brute-force neighbours (``IndexFlatL2``, cached in
    the temporary directory).  Full-search time is extrapolated as sample time x N / sample;
    the MAP@R here is a plain re-implementation (leave-one-out, R = class size - 1), not
    embedeval's."""
    import faiss

    from embedeval import train_index

    x, y = make_clusters(
        args.n, n_classes=args.classes, spread=args.spread, intrinsic_dim=args.intrinsic_dim
    )
    x = np.ascontiguousarray(x)
    counts = np.bincount(y)
    rng = np.random.default_rng(0)
    sample = np.sort(rng.choice(np.flatnonzero(counts[y] > 1), args.exact_sample, replace=False))
    r_q = counts[y[sample]] - 1
    depth = 256
    gt_path = os.path.join(
        CACHE_DIR,
        f"embedeval_bench_scale_gt_{args.n}_{args.classes}_{args.spread}_{args.intrinsic_dim}_"
        f"{args.exact_sample}.npy",
    )
    if os.path.exists(gt_path):
        truth = np.load(gt_path)
    else:
        flat = faiss.IndexFlatL2(D)
        flat.add(x)
        truth = flat.search(x[sample], depth)[1]
        np.save(gt_path, truth)
        del flat

    def lists(ids: np.ndarray, k: int) -> np.ndarray:
        out = np.full((ids.shape[0], k), -1, dtype=np.int64)
        for i in range(ids.shape[0]):  # drop the query itself and faiss's -1 padding
            row = ids[i][(ids[i] != sample[i]) & (ids[i] >= 0)][:k]
            out[i, : row.size] = row
        return out

    def map_at_r(ranked: np.ndarray) -> np.ndarray:
        pos = np.arange(1, ranked.shape[1] + 1)
        rel = (y[np.maximum(ranked, 0)] == y[sample][:, None]) & (ranked >= 0)
        rel &= pos[None, :] <= r_q[:, None]
        return (np.cumsum(rel, axis=1) / pos * rel).sum(axis=1) / r_q

    exact_lists = lists(truth, depth - 1)
    exact_map = map_at_r(exact_lists)
    out = []
    for config in args.configs:
        key, *opts = config.split("|")  # "IVF4096,Flat|nprobe=8,16" or "HNSW32|efSearch=128"
        param, values = opts[0].split("=") if opts else ("", "0")
        t0 = time.perf_counter()
        trained = train_index(
            x, key, training_rows=args.training_rows, clustering=args.clustering
        ) if key.startswith("IVF") else faiss.index_factory(D, key)  # fmt: skip
        t_train = time.perf_counter() - t0
        t0 = time.perf_counter()
        for a in range(0, args.n, 65536):
            trained.add(x[a : a + 65536])
        t_add = time.perf_counter() - t0
        for value in map(int, values.split(",")):
            if param:
                faiss.ParameterSpace().set_index_parameter(trained, param, value)
            t0 = time.perf_counter()
            ids = trained.search(x[sample], args.k)[1]
            t_search = time.perf_counter() - t0
            found = lists(ids, args.k - 1)
            recall = np.mean([
                np.intersect1d(found[i, : r_q[i]], exact_lists[i, : r_q[i]]).size / r_q[i]
                for i in range(sample.size)
            ])  # fmt: skip
            diff = map_at_r(found) - exact_map
            boots = [diff[rng.integers(0, diff.size, diff.size)].mean() for _ in range(1000)]
            row = {
                "index": key, param or "-": value, "k": args.k, "train_s": round(t_train, 1),
                "add_s": round(t_add, 1), "search_sample_s": round(t_search, 2),
                "search_all_estimate_s": round(t_search * args.n / sample.size, 1),
                "knn_recall": round(float(recall), 4),
                "map_at_r_exact": round(float(exact_map.mean()), 4),
                "map_at_r_diff": round(float(diff.mean()), 5),
                "diff_ci": [round(float(v), 5) for v in np.quantile(boots, [0.025, 0.975])],
                "load_avg_1min": round(os.getloadavg()[0], 2),
            }  # fmt: skip
            print(json.dumps(row), flush=True)
            out.append(row)
    return out


def case_medium(args: argparse.Namespace) -> dict:
    from embedeval import evaluate

    n = args.n if args.n != 1_000_000 else 100_000
    x, y = make_clusters(n, n_classes=n // 100)
    x = np.asarray(x)
    t0 = time.perf_counter()
    exact = evaluate(x, y, progress=False)
    t_exact = time.perf_counter() - t0
    t0 = time.perf_counter()
    approx = evaluate(
        x,
        y,
        index=args.index,
        index_params={"nprobe": args.nprobe} if "IVF" in args.index else None,
        exact_sample=args.exact_sample,
        progress=False,
    )
    t_approx = time.perf_counter() - t0
    out = {"case": "medium", "n": n, "index": args.index, "nprobe": args.nprobe}
    out.update(exact_s=round(t_exact, 1), approx_s=round(t_approx, 1))
    out["knn_recall_sample"] = approx.approximation["knn_recall"]
    for name, m in approx.approximation["metrics"].items():
        out[name] = {
            "full_diff": approx[name] - exact[name],
            "sample_diff": m["difference"],
            "sample_ci": m["difference_ci"],
        }
    return out


def case_dask(args: argparse.Namespace) -> dict:
    from distributed import Client, LocalCluster
    from threadpoolctl import threadpool_limits

    from embedeval import evaluate

    n = 200_000
    x, y = make_clusters(n, n_classes=n // 100)
    x = np.asarray(x)
    q, yq = x[: args.queries], y[: args.queries]
    out: dict = {"case": "dask", "n_reference": n, "n_query": args.queries}
    with threadpool_limits(1, user_api="blas"):
        for threads in (1, None):  # one engine thread (= one Dask worker's share), then all
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                local = evaluate(
                    q, yq, x, y, ref_includes_query=True, progress=False, n_threads=threads
                )
                times.append(time.perf_counter() - t0)
            out["local_1thread_s" if threads == 1 else "local_all_threads_s"] = round(min(times), 2)
        for workers in (1, 2):
            with (
                LocalCluster(
                    n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
                ) as cluster,
                Client(cluster) as client,
            ):
                times = []
                for _ in range(args.repeat):  # best of N: the machine is shared
                    t0 = time.perf_counter()
                    res = evaluate(
                        q, yq, x, y, ref_includes_query=True, backend="dask", client=client,
                        progress=False,
                    )  # fmt: skip
                    times.append(time.perf_counter() - t0)
                out[f"dask_{workers}w_s"] = round(min(times), 2)
                out[f"dask_{workers}w_identical"] = all(
                    np.array_equal(res.per_query[k], local.per_query[k], equal_nan=True)
                    for k in local.per_query
                )
    out["speedup_1_to_2_workers"] = round(out["dask_1w_s"] / out["dask_2w_s"], 2)
    out["overhead_1w_vs_local"] = round(out["dask_1w_s"] / out["local_1thread_s"] - 1, 3)
    return out


def case_deep(args: argparse.Namespace) -> dict:
    from distributed import Client, LocalCluster

    from benchmarks._common import make_split
    from embedeval import evaluate

    split = make_split("hashing")
    n_q = min(args.queries, split["xq"].shape[0])
    q, yq, x, y = split["xq"][:n_q], split["yq"][:n_q], split["xr"], split["yr"]
    kw = dict(metrics=["map", "precision_at_1"], progress=False)
    out: dict = {"case": "deep", "n_query": n_q, "n_reference": int(x.shape[0]), "dim": 64}

    results: dict = {}

    def timed(name: str, base: str | None = None, **extra) -> None:
        """Best of ``--repeat`` runs; values and time against the run named ``base``."""
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            results[name] = evaluate(q, yq, x, y, **kw, **extra)
            times.append(time.perf_counter() - t0)
        out[f"{name}_s"] = round(min(times), 2)
        if base is not None:
            out[f"{name}_identical"] = all(
                np.array_equal(results[name].per_query[m], results[base].per_query[m],
                               equal_nan=True)
                for m in kw["metrics"]
            )  # fmt: skip
            out[f"{name}_x_{base}"] = round(out[f"{name}_s"] / out[f"{base}_s"], 2)

    small = 16 * 2**20  # below the reference's float64 copy: read shard by shard
    timed("local")
    timed("shards_whole", "local", shards=2)
    timed("local_16mib", "local", memory_budget=small)
    timed("shards_16mib", "local_16mib", shards=2, memory_budget=small)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
        as cluster,
        Client(cluster) as client,
    ):  # fmt: skip
        timed("dask_2w", "local", backend="dask", client=client)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=["approx", "medium", "dask", "sweep", "deep"])
    parser.add_argument("configs", nargs="*", help="sweep: 'IVF4096,Flat|nprobe=8,16' ...")
    parser.add_argument("--k", type=int, default=128, help="sweep: search depth")
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--index", default="IVF1024,Flat")
    parser.add_argument("--nprobe", type=int, default=16)
    parser.add_argument("--exact-sample", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=40_000)
    parser.add_argument("--spread", type=float, default=0.09)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--training-rows", type=int, default=None)
    parser.add_argument("--intrinsic-dim", type=int, default=None)
    parser.add_argument("--classes", type=int, default=N_CLASSES, help="approx, sweep")
    parser.add_argument("--clustering", choices=["kmeans", "two_level"], default="kmeans")
    parser.add_argument("--quantizer-ef", type=int, default=64)
    parser.add_argument("--ef-search", type=int, default=None)
    args = parser.parse_intermixed_args()
    cases = {
        "approx": case_approx, "medium": case_medium, "dask": case_dask, "sweep": case_sweep,
        "deep": case_deep,
    }  # fmt: skip
    out = cases[args.case](args)
    print(json.dumps(out, default=float))


if __name__ == "__main__":
    main()
