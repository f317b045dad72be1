"""Ranking benchmark: AP@100, nDCG@10, MRR and P@10 for 100,000 queries x 100 ranked items.

embedeval (vectorised numpy) against ranx (numba; its Qrels/Run are built and the JIT warmed up
outside the timing) and scikit-learn looped over queries (timed on 2,000 queries, extrapolated).
Run: ``python -m benchmarks.bench_ranking``.
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks._common import machine

N_Q, N = 100_000, 100


def main() -> None:
    rng = np.random.default_rng(0)
    y = (rng.random((N_Q, N)) < 0.1).astype(np.int8)
    y[:, 0] |= (y.sum(1) == 0).astype(np.int8)
    s = rng.random((N_Q, N))  # distinct scores, so every library ranks identically
    print(f"machine: {machine()}")
    from embedeval.metrics import ranking as rk

    t = time.perf_counter()
    ours = {
        "ap@100": rk.average_precision(y, s, k=100),
        "ndcg@10": rk.ndcg(y, s, k=10),
        "mrr": rk.reciprocal_rank(y, s),
        "p@10": rk.precision_at_k(y, s, k=10),
    }
    t_ours = time.perf_counter() - t
    print(f"embedeval: {t_ours:.2f} s")

    try:
        import ranx
    except ImportError:
        ranx = None
    if ranx is not None:
        qrels = {f"q{q:06d}": {f"d{j}": 1 for j in np.flatnonzero(y[q])} for q in range(N_Q)}
        run = {f"q{q:06d}": {f"d{j}": float(s[q, j]) for j in range(N)} for q in range(N_Q)}
        qrels, run = ranx.Qrels(qrels), ranx.Run(run)
        ranx.evaluate(qrels, run, ["map@100", "ndcg@10", "mrr", "precision@10"])  # JIT warm-up
        t = time.perf_counter()
        theirs = ranx.evaluate(
            qrels, run, ["map@100", "ndcg@10", "mrr", "precision@10"], return_mean=False
        )
        t_ranx = time.perf_counter() - t
        diff = max(
            np.abs(ours["ap@100"] - theirs["map@100"]).max(),
            np.abs(ours["ndcg@10"] - theirs["ndcg@10"]).max(),
            np.abs(ours["mrr"] - theirs["mrr"]).max(),
            np.abs(ours["p@10"] - theirs["precision@10"]).max(),
        )
        print(
            f"ranx:      {t_ranx:.2f} s   embedeval / ranx = {t_ours / t_ranx:.2f}   "
            f"max |diff| = {diff:.1e}"
        )

    from sklearn.metrics import average_precision_score, ndcg_score

    sub = 2_000
    t = time.perf_counter()
    for q in range(sub):
        average_precision_score(y[q], s[q])
        ndcg_score(y[q : q + 1], s[q : q + 1], k=10)
    t_sk = (time.perf_counter() - t) * N_Q / sub
    print(
        f"sklearn loop (AP + nDCG only, extrapolated from {sub} queries): {t_sk:.1f} s   "
        f"embedeval / sklearn = {t_ours / t_sk:.4f}"
    )


if __name__ == "__main__":
    main()
