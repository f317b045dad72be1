"""One measurement of bench_core.py, run in its own process: prints one JSON line."""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np

from benchmarks._common import Timer, make_data, peak_rss_mb

METRICS = {
    "sop": ["precision_at_1", "r_precision", "map_at_r"],
    "large": ["precision_at_1", "r_precision", "map_at_r"],
    "map": ["map"],
    "separated": ["precision_at_1", "r_precision", "map_at_r"],
}
PML_NAMES = {
    "precision_at_1": "precision_at_1",
    "r_precision": "r_precision",
    "map_at_r": "mean_average_precision_at_r",
    "map": "mean_average_precision",
}


def main(method: str, case: str) -> None:
    x, y = make_data(case)
    base = peak_rss_mb()
    values: dict[str, float] = {}
    if method in ("embedeval", "embedeval_1t"):
        import embedeval as ee

        threads = 1 if method == "embedeval_1t" else None  # None: every usable core
        with Timer() as t:
            res = ee.evaluate(
                x, y, metrics=METRICS[case], k=None, progress=False, n_threads=threads
            )
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
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
