"""Core benchmark: embedeval vs faiss flat search alone vs raw BLAS vs PML 2.9, in one run.

Cases (float32, d=128, L2-normalised, seeded; see ``benchmarks/_common.py``):

* ``sop``   — 60,000 vectors in ~11,000 classes (SOP-like), P@1 + R-Precision + MAP@R
* ``large`` — 20,000 vectors in 5 classes of 4,000, P@1 + R-Precision + MAP@R
* ``map``   — 10,000 vectors in 100 classes, full-depth MAP (``k=None``)
* ``reid``  — 3,368 queries x 15,913 gallery, d=2,048, identity x camera groups, MAP + P@1
* ``hashing`` — 5,000 queries x 50,000 database items, d=64, 10 classes, MAP (mAP@all)
* ``hashing_dups`` — ``hashing`` with 2,500 duplicated database items (half relabelled: exact
  ties between relevant and non-relevant items) and 100 queries copied from the database
* ``hashing_codes`` — ``hashing`` as 64-bit binary codes in ``{-1, 1}`` (the sign of a seeded
  projection), what deep-hashing papers rank (Hamming ranking = Euclidean ranking), mAP@all

Deep rankings (``large``, ``map``, ``reid`` and the ``hashing`` cases) are also timed
against what a plain script pays for the same shape, in the same run: ``product`` (the blocked
float32 product, 1,024 query rows at a time) and ``product_sort`` (that plus ``np.sort`` of
every row of keys);
their embedeval values are checked against a brute force (float64 distances, stable sort by
distance then index) on 100 seeded queries ("check": the largest per-query difference).

``embedeval`` runs with its default worker threads (every usable core), ``embedeval_1t`` with
``n_threads=1`` (one core for everything but nothing else changed), so the gain from the threads
is visible in the same run.  Each measurement runs in its own process (peak memory = that
process's ``ru_maxrss``).  faiss is
``IndexFlatL2`` + ``search`` with k = max R + 1 (the depth MAP@R needs); for ``map`` faiss would
need k = n, so it is run at k = 2048 as a lower bound.  Run::

    python -m benchmarks.bench_core            # all cases, PML included when installed
    python -m benchmarks.bench_core sop large  # some cases
"""

from __future__ import annotations

import argparse
import importlib.util

from benchmarks._common import machine, run_child

TARGETS = {
    "sop": "wall <= faiss; <= 0.4 x PML wall; peak memory <= 0.1 x PML",
    "large": "<= 0.35 x faiss (k = max R + 1); <= 0.12 x PML time and memory; "
    "<= 0.8 x product + sort",
    "map": "<= 0.1 x PML time; <= 0.05 x PML memory; <= 1.0 x product + sort",
    "reid": "<= 1.1 x product + sort",
    "hashing": "<= 1.0 x product + sort",
    "hashing_dups": "<= 1.0 x product + sort",
    "hashing_codes": "<= 1.0 x product + sort",
}
SPLIT = ("reid", "hashing", "hashing_dups", "hashing_codes")
DEEP = ("large", "map", "reid", "hashing", "hashing_dups", "hashing_codes")


def main(cases: list[str]) -> None:
    have_pml = importlib.util.find_spec("pytorch_metric_learning") is not None
    print(f"machine: {machine()}")
    for case in cases:
        rows = {}
        methods: tuple[str, ...] = ("embedeval", "embedeval_1t")
        if case not in SPLIT:
            methods += ("faiss", "blas", *(["pml"] if have_pml else []))
        if case in DEEP:
            methods += ("product", "product_sort")
        for method in methods:
            rows[method] = run_child("benchmarks._core_child", method, case)
        print(f"\n## {case}  (target: {TARGETS[case]})")
        print(f"{'method':<12} {'wall s':>8} {'peak MB':>9}  values")
        for method, r in rows.items():
            if "error" in r:
                print(f"{method:<12} failed: {r['error']}")
                continue
            vals = ", ".join(f"{k}={v:.6f}" for k, v in r["values"].items())
            print(f"{method:<12} {r['seconds']:8.2f} {r['peak_mb']:9.0f}  {vals}")
        ours = rows["embedeval"]
        if ours.get("check"):
            worst = ", ".join(f"{k}={v:.1e}" for k, v in ours["check"].items())
            print(f"brute-force check (largest per-query |difference|, 100 queries): {worst}")
        for other in ("embedeval_1t", "faiss", "blas", "pml", "product", "product_sort"):
            r = rows.get(other)
            if r and "error" not in r and "error" not in ours:
                print(
                    f"embedeval / {other}: time x{ours['seconds'] / r['seconds']:.3f}, "
                    f"peak memory x{ours['peak_mb'] / r['peak_mb']:.3f}"
                )
        pml = rows.get("pml")
        if pml and "error" not in pml and "error" not in ours:
            diff = max(abs(ours["values"][k] - pml["values"][k]) for k in pml["values"])
            print(f"max |embedeval - PML| over metrics: {diff:.2e}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", default=list(TARGETS), help=", ".join(TARGETS))
    args = parser.parse_args()
    unknown = [c for c in args.cases if c not in TARGETS]
    if unknown:
        parser.error(f"unknown case {unknown[0]!r}: choose from {', '.join(TARGETS)}")
    main(args.cases)
