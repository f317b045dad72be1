"""One measurement of bench_core.py, run in its own process: prints one JSON line."""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np

from benchmarks._common import Timer, make_data, make_split, peak_rss_mb

METRICS = {
    "sop": ["precision_at_1", "r_precision", "map_at_r"],
    "large": ["precision_at_1", "r_precision", "map_at_r"],
    "map": ["map"],
    "separated": ["precision_at_1", "r_precision", "map_at_r"],
    "reid": ["map", "precision_at_1"],
    "hashing": ["map"],
    "hashing_dups": ["map"],
    "hashing_codes": ["map"],
}
#: Query / gallery cases (the others are leave-one-out).
SPLIT = ("reid", "hashing", "hashing_dups", "hashing_codes")
#: Deep rankings: timed against the product and "product + sort every row" of their shape.
DEEP = ("large", "map", "reid", "hashing", "hashing_dups", "hashing_codes")
#: Queries whose values are checked against the brute force (float64, stable sort).
N_CHECK = 100
PML_NAMES = {
    "precision_at_1": "precision_at_1",
    "r_precision": "r_precision",
    "map_at_r": "mean_average_precision_at_r",
    "map": "mean_average_precision",
}


def product(xq: np.ndarray, xr: np.ndarray, sort: bool) -> None:
    """The blocked float32 product of the evaluation's shape (keys ``||r||^2 - 2 q.r``), and,
    with ``sort``, ``np.sort`` of every row of keys: what a plain script pays."""
    norms = np.einsum("ij,ij->i", xr, xr)
    for s in range(0, xq.shape[0], 1024):
        g = xq[s : s + 1024] @ xr.T
        g *= -2
        g += norms
        if sort:
            g.sort(axis=1)


def brute_values(data: dict, metrics: list[str], rows: np.ndarray) -> dict[str, np.ndarray]:
    """Per-query values of ``rows`` from float64 distances, a stable sort by (distance,
    reference index), exclusions (self, same group) removed, and the definitions."""
    xq, yq, xr, yr = data["xq"], data["yq"], data["xr"], data["yr"]
    out = {m: np.full(rows.size, np.nan) for m in metrics}
    for t, i in enumerate(rows):
        d = ((xr.astype(np.float64) - xq[i].astype(np.float64)) ** 2).sum(axis=1)
        keep = np.ones(xr.shape[0], dtype=bool)
        if data.get("loo"):
            keep[i] = False
        if "gq" in data:
            keep &= data["gr"] != data["gq"][i]
        j = np.flatnonzero(keep)
        rel = yr[j[np.lexsort((j, d[j]))]] == yq[i]
        n_rel = int(rel.sum())
        if n_rel == 0:
            continue
        prec = np.cumsum(rel) / np.arange(1, rel.size + 1)
        for m in metrics:
            if m == "map":
                out[m][t] = prec[rel].sum() / n_rel
            elif m == "precision_at_1":
                out[m][t] = float(rel[0])
            elif m == "r_precision":
                out[m][t] = rel[:n_rel].sum() / n_rel
            elif m == "map_at_r":
                out[m][t] = prec[:n_rel][rel[:n_rel]].sum() / n_rel
    return out


def main(method: str, case: str) -> None:
    if case in SPLIT:
        data = make_split(case)
    else:
        x, y = make_data(case)
        data = {"xq": x, "yq": y, "xr": x, "yr": y, "loo": True}
    base = peak_rss_mb()
    values: dict[str, float] = {}
    check: dict[str, float] = {}
    if method in ("product", "product_sort"):
        with Timer() as t:
            product(data["xq"], data["xr"], method == "product_sort")
    elif method in ("embedeval", "embedeval_1t") and case in DEEP:
        import embedeval as ee

        threads = 1 if method == "embedeval_1t" else None
        args = (data["xq"], data["yq"]) if case not in SPLIT else (
            data["xq"], data["yq"], data["xr"], data["yr"])  # fmt: skip
        groups = (
            {"query_groups": data["gq"], "reference_groups": data["gr"]} if "gq" in data else {}
        )
        with Timer() as t:
            res = ee.evaluate(*args, metrics=METRICS[case], progress=False, n_threads=threads,
                              **groups)  # fmt: skip
        values = dict(res.metrics)
        rows = np.random.default_rng(1).choice(data["xq"].shape[0], N_CHECK, replace=False)
        want = brute_values(data, METRICS[case], rows)
        for m in METRICS[case]:
            check[m] = float(np.nanmax(np.abs(res.per_query[m][rows] - want[m])))
    elif method in ("embedeval", "embedeval_1t"):
        import embedeval as ee

        threads = 1 if method == "embedeval_1t" else None  # None: every usable core
        with Timer() as t:
            res = ee.evaluate(
                x, y, metrics=METRICS[case], k=None, progress=False, n_threads=threads
            )
        values = dict(res.metrics)
    elif method.startswith("torch_"):  # torch_bf16, torch_float32: the torch backend on the CPU
        import torch

        import embedeval as ee

        torch.ones(8, 8) @ torch.ones(8, 8)  # load the library before the clock starts
        options = {"backend": "torch", "device": "cpu", "precision": method[6:]}
        with Timer() as t:
            res = ee.evaluate(x, y, metrics=METRICS[case], k=None, progress=False, **options)
        values = dict(res.metrics)
    elif method == "faiss":
        import faiss

        counts = np.bincount(y)
        k = int(counts.max()) + 1  # max R + 1: the depth MAP@R needs, self included
        if case == "map":
            k = x.shape[0]
        with Timer() as t:
            index = faiss.IndexFlatL2(x.shape[1])
            index.add(x)
            index.search(x, min(k, 2048) if case == "map" else k)
    elif method == "blas":
        with Timer() as t:
            block = 4096
            norms = np.einsum("ij,ij->i", x, x)
            for s in range(0, x.shape[0], block):
                g = x[s : s + block] @ x.T
                g *= -2
                g += norms
    elif method == "pml":
        import torch
        from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

        warnings.filterwarnings("ignore")
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        base = peak_rss_mb()
        # How PML is run in practice: k="max_bin_count" for P@1 / R-Precision / MAP@R (k=None
        # would ask faiss for n x n neighbours: 28.8 GB at 60k), k=None for full-depth MAP.
        calc = AccuracyCalculator(
            include=tuple(PML_NAMES[m] for m in METRICS[case]),
            k=None if case == "map" else "max_bin_count",
            device=torch.device("cpu"),
        )
        with Timer() as t:
            out = calc.get_accuracy(xt, yt)
        values = {m: float(out[PML_NAMES[m]]) for m in METRICS[case]}
    else:
        raise ValueError(method)
    print(
        json.dumps(
            {
                "seconds": t.seconds,
                "peak_mb": peak_rss_mb(),
                "baseline_mb": base,
                "values": values,
                "check": check,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
