"""Verification benchmark: exact TAR@FAR over every pair of a labelled set.

Two measurements in one process, so that their ratio holds on a busy machine:

1. a subset of the SOP-like set (``--subset`` vectors, every pair materialised): embedeval's
   streamed ``tar_at_far_all_pairs`` against scikit-learn's ``roc_curve`` on the explicit
   upper-triangle scores (the float32 products themselves, then the TPR at the largest FPR <=
   each target); both TAR vectors are printed and must agree;
2. the full 60,000-vector SOP-like set (1.8e9 impostor pairs, which no n x n matrix holds):
   embedeval alone, with the time of the bare products (the BLAS floor) beside it.

Run: ``python -m benchmarks.bench_verification [--subset 6000] [--skip-full]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks._common import machine, make_data

FARS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)


def _sklearn_tar(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    from sklearn.metrics import roc_curve

    t = time.perf_counter()
    s = x @ x.T
    iu = np.triu_indices(x.shape[0], 1)
    scores, genuine = s[iu], y[iu[0]] == y[iu[1]]
    del s
    fpr, tpr, _ = roc_curve(genuine, scores)
    tar = np.array([tpr[fpr <= f].max() for f in FARS])
    return tar, time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--subset", type=int, default=6000)
    parser.add_argument("--skip-full", action="store_true")
    args = parser.parse_args()
    from embedeval.protocols.verification import tar_at_far_all_pairs

    print(f"machine: {machine()}")
    x, y = make_data("sop")
    xs, ys = x[: args.subset], y[: args.subset]
    t = time.perf_counter()
    ours = tar_at_far_all_pairs(xs, ys, far=FARS, distance="inner_product")
    t_ours = time.perf_counter() - t
    theirs, t_sk = _sklearn_tar(xs, ys)
    print(f"subset n={args.subset} ({ours.n_impostor:.3g} impostor pairs)")
    print(f"  embedeval TAR: {np.round(ours.tar, 4).tolist()}")
    print(f"  sklearn   TAR: {np.round(theirs, 4).tolist()}")
    print(f"  identical: {bool(np.array_equal(ours.tar, theirs))}")
    print(
        f"  embedeval {t_ours:.2f} s, sklearn (matrix + roc_curve) {t_sk:.2f} s, "
        f"embedeval / sklearn = {t_ours / t_sk:.3f}"
    )
    if args.skip_full:
        return
    t = time.perf_counter()
    full = tar_at_far_all_pairs(x, y, far=FARS, distance="inner_product")
    t_full = time.perf_counter() - t
    t = time.perf_counter()
    for a in range(0, x.shape[0], 512):
        x[a : a + 512] @ x[a:].T
    t_blas = time.perf_counter() - t
    print(
        f"full n={x.shape[0]} ({full.n_impostor:.3g} impostor pairs): {t_full:.1f} s "
        f"({full.settings['n_scans']} pass(es) over the pairs)"
    )
    print(
        f"  bare upper-triangle products (BLAS floor): {t_blas:.1f} s, ratio {t_full / t_blas:.2f}"
    )
    print(full.table())


if __name__ == "__main__":
    main()
