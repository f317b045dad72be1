"""Leave-one-out with each product computed once, against the same work without symmetry.

For each ``bench_core`` case, and ``separated`` (40,000 rows in classes of six far apart, where
every value is 1; see ``benchmarks/_common.py``), in one run and each measurement in its own
process, repeated and interleaved (the best of the repeats is kept):

* ``loo``       — ``evaluate(x, y)``: leave-one-out, the symmetric engine where it applies
* ``one_sided`` — the same leave-one-out through the one-sided engine (every product twice):
  ``evaluate(x, y, x.copy(), y, ref_includes_query=True)``, each query excluded by identity
* ``split``     — ``evaluate(x, y, x.copy(), y)``: an explicit query/reference split of equal
  size, the same amount of work without symmetry (values differ: each query finds its copy)
* ``faiss``     — ``IndexFlatL2`` + ``search`` with k = max R + 1 (capped at 2,048)

Ratios of wall time are printed; CPU time (both cores' work) is printed too, since it moves less
when other jobs share the machine.  ``map`` (full-depth MAP, ``k=None``) needs whole rows and
takes the one-sided engine, so ``loo`` and ``one_sided`` are the same there.  Run::

    python -m benchmarks.bench_symmetric                 # sop, large, map; best of 3
    python -m benchmarks.bench_symmetric sop --repeat 2  # some cases
    python -m benchmarks.bench_symmetric separated       # 40,000 rows in well-separated classes
"""

from __future__ import annotations

import argparse

from benchmarks._common import machine, run_child

METHODS = ("loo", "one_sided", "split", "faiss")


def measure(case: str, repeat: int) -> dict[str, dict]:
    """Best (smallest wall time) of ``repeat`` interleaved runs of every method."""
    best: dict[str, dict] = {}
    for _ in range(repeat):
        for method in METHODS:
            r = run_child("benchmarks._symmetric_child", method, case)
            if "error" in r:
                best.setdefault(method, r)
            elif (
                "error" in best.get(method, {"error": ""}) or r["seconds"] < best[method]["seconds"]
            ):
                best[method] = r
    return best


def report(case: str, rows: dict[str, dict]) -> None:
    print(f"\n## {case}")
    print(f"{'method':<10} {'wall s':>8} {'cpu s':>8} {'peak MB':>9}  values")
    for method, r in rows.items():
        if "error" in r:
            print(f"{method:<10} failed: {r['error']}")
            continue
        vals = ", ".join(f"{k}={v:.6f}" for k, v in r["values"].items())
        print(
            f"{method:<10} {r['seconds']:8.2f} {r['cpu_seconds']:8.2f} {r['peak_mb']:9.0f}  {vals}"
        )
    loo = rows["loo"]
    for other in ("one_sided", "split", "faiss"):
        r = rows[other]
        if "error" not in r and "error" not in loo:
            print(
                f"loo / {other}: wall x{loo['seconds'] / r['seconds']:.3f}, "
                f"cpu x{loo['cpu_seconds'] / r['cpu_seconds']:.3f}"
            )
    same = loo.get("values") == rows["one_sided"].get("values")
    print(f"loo values equal to the one-sided engine's: {same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", default=["sop", "large", "map"])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {machine()}")
    for case in args.cases:
        report(case, measure(case, args.repeat))


if __name__ == "__main__":
    main()
