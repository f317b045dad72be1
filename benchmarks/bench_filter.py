"""The torch backend's bfloat16 filter on the CPU against the numpy path and the bare product.

Every ranking is decided in float64 whatever product filters the candidates (see
``docs/design.md``, "Exact rankings"), so the filter's precision changes the time, never a
value: this script checks that the values are equal and prints the times.  In one run, each
measurement in its own process, repeated and interleaved (the best of the repeats is kept):

* ``embedeval``     — ``evaluate(x, y)``, the local numpy engine (float32 BLAS products)
* ``torch_bf16``    — ``evaluate(x, y, backend="torch", device="cpu", precision="bf16")``:
  bfloat16 products (oneDNN's AVX512-BF16 / AMX kernels where the CPU has them)
* ``torch_float32`` — the same with float32 products
* ``product``       — the blocked float32 product of the same shape alone (numpy, both cores)

Cases are those of ``bench_core`` (``benchmarks/_common.py``): ``sop`` (60,000 vectors in
classes of 2–9, leave-one-out, P@1 + R-Precision + MAP@R) by default. Run::

    python -m benchmarks.bench_filter                  # sop, best of 2
    python -m benchmarks.bench_filter sop large --repeat 1
"""

from __future__ import annotations

import argparse

from benchmarks._common import machine, run_child

METHODS = ("embedeval", "torch_bf16", "torch_float32", "product")


def measure(case: str, repeat: int) -> dict[str, dict]:
    """Best (smallest wall time) of ``repeat`` interleaved runs of every method."""
    best: dict[str, dict] = {}
    for _ in range(repeat):
        for method in METHODS:
            r = run_child("benchmarks._core_child", method, case)
            old = best.get(method)
            if old is None or ("error" in old and "error" not in r):
                best[method] = r
            elif "error" not in r and r["seconds"] < old["seconds"]:
                best[method] = r
    return best


def report(case: str, rows: dict[str, dict]) -> None:
    print(f"\n## {case}")
    print(f"{'method':<14} {'wall s':>8} {'peak MB':>9} {'x numpy path':>13} {'x product':>10}")
    base = rows["embedeval"].get("seconds")
    prod = rows["product"].get("seconds")
    for method, r in rows.items():
        if "error" in r:
            print(f"{method:<14} failed: {r['error']}")
            continue
        s = r["seconds"]
        ratio = f"{s / base:13.3f}" if base else f"{'-':>13}"
        vs_prod = f"{s / prod:10.3f}" if prod else f"{'-':>10}"
        print(f"{method:<14} {s:8.2f} {r['peak_mb']:9.0f} {ratio} {vs_prod}")
    values = {m: r["values"] for m, r in rows.items() if r.get("values")}
    first = next(iter(values.values()), {})
    same = all(v == first for v in values.values())
    print("values equal in every path:", same, {k: round(v, 6) for k, v in first.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", default=["sop"])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    print(machine())
    for case in args.cases:
        report(case, measure(case, args.repeat))


if __name__ == "__main__":
    main()
