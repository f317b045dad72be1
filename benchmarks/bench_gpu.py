"""GPU benchmark: embedeval's PyTorch backend against PML 2.9 and a bare torch kNN, one run.

For each case, on the same device and with the embeddings already there:

* ``embedeval``       ``ee.evaluate(x, y, backend="torch", device=...)`` (the default filter:
                      TF32 on a GPU from Ampere on, see ``resolve_precision`` in
                      ``embedeval/search/torch_backend.py``)
* ``embedeval_bf16``, ``embedeval_float32``  the same with ``precision="bf16"`` /
                      ``"float32"``
* ``pml``             PML 2.9 ``AccuracyCalculator(knn_func=CustomKNN(LpDistance()))``,
                      ``k="max_bin_count"`` (``k=None`` for full-depth MAP), as PML is run
* ``topk``            a bare ``addmm`` (||r||^2 - 2 q.r) + ``topk`` in 4,096-query blocks
* ``products``        the ``addmm`` products alone (what any exact method must compute), and
                      the bfloat16 products alone
* ``cpu_engine``      the local CPU engine on the host (every core), for the exactness count

Cases: ``sop``, ``large``, ``map`` (the data of ``benchmarks/bench_core.py``), ``1m``
(1,000,000 x 128, 10,000 classes of 100, P@1 / R-Precision / MAP@R; the CPU engine is run on a
seeded sample of ``--cpu-sample`` queries against the whole set, each query excluding only
itself) and ``qrels`` (bench_qrels's 200,000 x 768 corpus on the host, 1,000 queries:
``evaluate_qrels`` on the host and with the corpus blocks multiplied on the device in float32
and bfloat16, deep and shallow metrics, beside the bare device product and ``topk``).  The
report gives seconds, peak device memory, the ratios embedeval / other, the largest metric
difference from PML, and, per embedeval row, how many queries' values differ from the CPU
engine's: every ranking is decided in float64, so the answer should be 0 at every precision
(differing queries are checked in float64 for references closer than the float32 bound).

Run on a CUDA machine (PyTorch with CUDA and ``pytorch-metric-learning==2.9.0``; faiss is not
needed)::

    python -m benchmarks.bench_gpu                      # every case, report on stdout
    python -m benchmarks.bench_gpu --out results.md     # also write the Markdown report
    python -m benchmarks.bench_gpu --small              # small sizes on the CPU: a smoke run
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks._common import machine, make_data

METRICS = {
    "sop": ["precision_at_1", "r_precision", "map_at_r"],
    "large": ["precision_at_1", "r_precision", "map_at_r"],
    "map": ["map"],
    "1m": ["precision_at_1", "r_precision", "map_at_r"],
}
PML_NAMES = {
    "precision_at_1": "precision_at_1",
    "r_precision": "r_precision",
    "map_at_r": "mean_average_precision_at_r",
    "map": "mean_average_precision",
}
TARGETS = {
    "sop": "embedeval <= 0.15 x PML",
    "large": "embedeval <= 0.3 x PML",
    "map": "-",
    "1m": "embedeval <= 4 s (exact), <= 1.6 x products",
    "qrels": "-",
}
BLOCK = 4096
#: embedeval's rows: the default filter (``"auto"``: TF32 on a recent GPU) and the bfloat16
#: and float32 filters.
VARIANTS = {"embedeval": "auto", "embedeval_bf16": "bf16", "embedeval_float32": "float32"}


def clustered(sizes: list[int], spread: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """bench_core's recipe (Gaussian classes around random centres, L2-normalised, shuffled)
    for other sizes."""
    rng = np.random.default_rng(seed)
    d = 128
    labels = np.repeat(np.arange(len(sizes)), sizes)
    centers = rng.standard_normal((len(sizes), d)).astype(np.float32)
    x = rng.standard_normal((labels.size, d), dtype=np.float32)
    x *= np.float32(spread / 3)
    x += centers[labels]
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    perm = rng.permutation(labels.size)
    return np.ascontiguousarray(x[perm]), labels[perm].astype(np.int64)


def case_data(case: str, small: bool) -> tuple[np.ndarray, np.ndarray]:
    if not small:
        return clustered([100] * 10_000, 6.0, 0) if case == "1m" else make_data(case)
    sizes = {
        "sop": ([2, 3, 4, 5, 6, 7, 8, 9] * 140, 4.0),
        "large": ([800] * 5, 9.0),
        "map": ([100] * 20, 6.0),
        "1m": ([100] * 500, 6.0),
    }[case]
    return clustered(*sizes, seed=0)


class Rows(dict):
    """``{method: (seconds, peak MiB)}`` of a case, each printed as it is measured (a run cut
    short still reports what it finished)."""

    def __init__(self, case: str, quiet: bool) -> None:
        super().__init__()
        self.case, self.quiet = case, quiet

    def add(self, name: str, seconds: float, peak: float) -> None:
        self[name] = (seconds, peak)
        if not self.quiet:
            print(f"  [{self.case}] {name}: {seconds:.3f} s, {peak:,.0f} MiB", flush=True)


class Clock:
    """Wall time of a call, synchronising the device before and after."""

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch, self.device = torch, device

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def __call__(self, fn: Callable[[], Any], repeat: int = 1) -> tuple[float, float, Any]:
        """(best seconds, peak device MiB, last result)."""
        best, out = float("inf"), None
        for _ in range(repeat):
            out = None
            if self.device.type == "cuda":
                self.torch.cuda.empty_cache()
                self.torch.cuda.reset_peak_memory_stats(self.device)
            self.sync()
            t0 = time.perf_counter()
            out = fn()
            self.sync()
            best = min(best, time.perf_counter() - t0)
        peak = 0.0
        if self.device.type == "cuda":
            peak = self.torch.cuda.max_memory_allocated(self.device) / 2**20
        return best, peak, out


def blocks_of_keys(torch: Any, x: Any, each: Callable[[Any], Any]) -> None:
    """addmm of ||r||^2 - 2 q.r for 4,096-query blocks, each handed to ``each``."""
    sq = (x * x).sum(dim=1)
    for s in range(0, x.shape[0], BLOCK):
        each(torch.addmm(sq, x[s : s + BLOCK], x.T, beta=1.0, alpha=-2.0))


def bf16_products(xb: Any) -> None:
    """The bfloat16 products of 4,096-query blocks against every row, each dropped at once."""
    for s in range(0, xb.shape[0], BLOCK):
        xb[s : s + BLOCK] @ xb.T


def run_pml(torch: Any, xt: Any, yt: Any, case: str, batch: bool) -> dict[str, float]:
    from pytorch_metric_learning.distances import LpDistance
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
    from pytorch_metric_learning.utils.inference import CustomKNN

    calc = AccuracyCalculator(
        include=tuple(PML_NAMES[m] for m in METRICS[case]),
        k=None if case == "map" else "max_bin_count",
        device=xt.device,
        knn_func=CustomKNN(LpDistance(), batch_size=BLOCK if batch else None),
    )
    out = calc.get_accuracy(xt, yt)
    return {m: float(out[PML_NAMES[m]]) for m in METRICS[case]}


def differing(a: dict[str, np.ndarray], b: dict[str, np.ndarray], rows: Any = None) -> np.ndarray:
    """Mask of the queries whose value of any metric differs (bit for bit; NaN equals NaN)."""
    bad = None
    for name, values in b.items():
        mine = a[name] if rows is None else a[name][rows]
        diff = ~((mine == values) | (np.isnan(mine) & np.isnan(values)))
        bad = diff if bad is None else bad | diff
    return bad


def rounding_explained(x: np.ndarray, y: np.ndarray, queries: np.ndarray, full_map: bool) -> int:
    """How many of ``queries`` (leave-one-out rows) have, inside their metric window, two
    adjacent references of different relevance whose exact (float64) keys are closer than the
    float32 error bounds of their two keys, so float32 products may rank them either way.

    Key ||r||^2 - 2 q.r; a float32 dot product of d terms errs by at most about
    (d + 2) u (2 sum|q_i r_i| + ||r||^2), u = 2**-24.
    """
    d = x.shape[1]
    u = 2.0**-24
    x64 = x.astype(np.float64)
    sq = (x64 * x64).sum(axis=1)
    explained = 0
    for i in queries:
        q = x64[i]
        keys = sq - 2.0 * (x64 @ q)
        bound = (d + 2) * u * (2.0 * (np.abs(x64) @ np.abs(q)) + sq)
        keys[i] = np.inf
        order = np.argsort(keys, kind="stable")[:-1]
        rel = y[order] == y[i]
        hits = np.flatnonzero(rel)
        if hits.size == 0:
            continue
        window = hits[-1] + 1 if full_map else hits.size + 1
        j = np.arange(min(window, order.size - 1))
        a, b = order[j], order[j + 1]
        close = (keys[b] - keys[a]) <= bound[a] + bound[b]
        explained += bool((close & (rel[j] != rel[j + 1])).any())
    return explained


def one_case(
    torch: Any, device: Any, case: str, args: argparse.Namespace, out: list[str], quiet=False
) -> None:
    import embedeval as ee

    clock = Clock(torch, device)
    x, y = case_data(case, args.small)
    n = x.shape[0]
    metrics = METRICS[case]
    xt = torch.from_numpy(x).to(device)
    yt = torch.from_numpy(y).to(device)
    repeat = 1 if case == "1m" else args.repeat
    rows = Rows(case, quiet)

    def ours(precision: str) -> Any:
        return ee.evaluate(
            xt, yt, metrics=metrics, backend="torch", device=str(device), precision=precision,
            progress=False,
        )  # fmt: skip

    results: dict[str, Any] = {}
    for variant, precision in VARIANTS.items():
        t, peak, results[variant] = clock(lambda p=precision: ours(p), repeat)
        rows.add(variant, t, peak)
        if not quiet:  # which products filtered, where the blocks were decided
            print(f"    {results[variant].settings.get('torch')}", flush=True)
    res = results["embedeval"]

    t, peak, _ = clock(lambda: blocks_of_keys(torch, xt, lambda keys: None), repeat)
    rows.add("products", t, peak)
    xb = xt.to(torch.bfloat16)
    t, peak, _ = clock(lambda: bf16_products(xb), repeat)
    rows.add("products (bf16)", t, peak)
    depth = {"sop": 101, "large": int(np.bincount(y).max()) + 1, "map": n, "1m": 101}[case]
    depth = min(depth, n)
    t, peak, _ = clock(
        lambda: blocks_of_keys(torch, xt, lambda keys: torch.topk(keys, depth, largest=False)),
        repeat,
    )
    rows.add(f"topk (k={depth})", t, peak)

    pml_values = None
    if not args.no_pml and (case != "1m" or args.pml_1m):
        t, peak, pml_values = clock(lambda: run_pml(torch, xt, yt, case, case == "1m"), repeat)
        rows.add("pml", t, peak)

    # The CPU engine on the host: every query, or a sample for the million.
    if case == "1m":
        sample = np.sort(np.random.default_rng(1).choice(n, min(args.cpu_sample, n), False))
        t0 = time.perf_counter()
        cpu = ee.evaluate(
            x[sample], y[sample], x, y, metrics=metrics, query_groups=sample,
            reference_groups=np.arange(n), progress=False,
        )  # fmt: skip
        cpu_seconds = time.perf_counter() - t0
        checked, cpu_rows = sample.size, sample
    else:
        t0 = time.perf_counter()
        cpu = ee.evaluate(x, y, metrics=metrics, progress=False)
        cpu_seconds = time.perf_counter() - t0
        checked, cpu_rows = n, None
    differ_mask = differing(res.per_query, cpu.per_query, cpu_rows)
    value_gap = max(
        float(np.nanmax(np.abs(res.per_query[m][sample] - cpu.per_query[m]), initial=0.0))
        for m in metrics
        for sample in [slice(None) if cpu_rows is None else cpu_rows]
    )
    differ = {
        v: int(differing(r.per_query, cpu.per_query, cpu_rows).sum()) for v, r in results.items()
    }
    sample_rows = np.arange(n) if cpu_rows is None else cpu_rows
    checked_rows = sample_rows[differ_mask][: args.explain]
    explained = rounding_explained(x, y, checked_rows, case == "map")

    first_line = len(out)
    out.append(f"\n### {case}: {n:,} x {x.shape[1]}, {np.unique(y).size:,} classes")
    out.append(f"metrics {', '.join(metrics)}; target: {TARGETS[case]}\n")
    out.append("| method | seconds | peak device MiB | embedeval / method |")
    out.append("|---|---:|---:|---:|")
    mine = rows["embedeval"][0]
    for name, (t, peak) in rows.items():
        out.append(f"| {name} | {t:.3f} | {peak:,.0f} | {mine / t:.3f} |")
    out.append(f"| cpu_engine (host, {checked:,} queries) | {cpu_seconds:.3f} | - | - |")
    vals = ", ".join(f"{m}={v:.6f}" for m, v in res.metrics.items())
    out.append(f"\nembedeval values: {vals}")
    if pml_values is not None:
        gap = max(abs(res.metrics[m] - pml_values[m]) for m in metrics)
        out.append(f"max |embedeval - PML| over metrics: {gap:.2e}")
    counts = ", ".join(f"{v} {c}" for v, c in differ.items())
    out.append(
        f"queries whose values differ from the CPU engine (of {checked:,} checked; exact: 0): "
        f"{counts}; largest difference (embedeval) {value_gap:.1e}; "
        f"n_ties: {res.n_ties}"
    )
    if checked_rows.size:
        out.append(
            f"of {checked_rows.size} differing queries checked in float64, {explained} have two "
            "references of different relevance inside their window closer than the float32 "
            "error bound of their keys"
        )
    if not quiet:
        print("\n".join(out[first_line:]), flush=True)


def qrels_case(torch: Any, device: Any, args: argparse.Namespace, out: list[str]) -> None:
    """bench_qrels's data (200,000 x 768 cosine, 1,000 queries, graded qrels with exact
    duplicates) through ``evaluate_qrels``: the host's numpy engine, then the corpus blocks
    multiplied on ``device`` at each precision; the bare device product and ``topk`` with the
    corpus already there; every per-query value compared with the host engine's."""
    import embedeval as ee
    from benchmarks.bench_qrels import SHALLOW, make_corpus, make_qrels_data, metric_names

    n_corpus, n_queries = (20_000, 200) if args.small else (200_000, 1_000)
    data = make_qrels_data(n_corpus, n_queries)
    corpus = make_corpus(data)
    clock = Clock(torch, device)
    deep = metric_names(min(1000, n_corpus))

    def run(metrics: list[str], **kw: Any) -> Any:
        return ee.evaluate_qrels(
            data.queries, corpus, data.qrels, query_ids=data.query_ids, doc_ids=data.doc_ids,
            metrics=metrics, distance="cosine", progress=False, **kw,
        )  # fmt: skip

    torch_kw = {"backend": "torch", "device": str(device)}
    plan = {
        "host numpy (deep)": (deep, {}),
        "torch float32 (deep)": (deep, {**torch_kw, "precision": "float32"}),
        "torch bf16 (deep)": (deep, {**torch_kw, "precision": "bf16"}),
        "host numpy (shallow)": (SHALLOW, {}),
        "torch auto (shallow)": (SHALLOW, torch_kw),
        "torch bf16 (shallow)": (SHALLOW, {**torch_kw, "precision": "bf16"}),
    }
    rows, results = {}, {}

    def add(name: str, t: float, peak: float, precision: str) -> None:
        rows[name] = (t, peak, precision)
        print(f"  [qrels] {name}: {t:.3f} s, {peak:,.0f} MiB ({precision})", flush=True)

    for name, (metrics, kw) in plan.items():
        t, peak, results[name] = clock(lambda m=metrics, k=kw: run(m, **k))
        add(name, t, peak, results[name].settings.get("precision", "float32"))
    qn = torch.nn.functional.normalize(torch.from_numpy(data.queries).to(device), dim=1)
    cn = torch.nn.functional.normalize(torch.from_numpy(corpus).to(device), dim=1)
    for name, dtype in (
        ("device product float32", torch.float32),
        ("device product bf16", torch.bfloat16),
    ):
        a, b = qn.to(dtype), cn.to(dtype)
        add(name, *clock(lambda a=a, b=b: a @ b.T)[:2], "-")
    add("device product + topk(1000)", *clock(lambda: torch.topk(qn @ cn.T, 1000))[:2], "-")

    first_line = len(out)
    out.append(f"\n### qrels: {n_corpus:,} x 768 cosine corpus (host), {n_queries:,} queries")
    out.append("| method | seconds | peak device MiB | precision |")
    out.append("|---|---:|---:|---|")
    out.extend(f"| {k} | {t:.3f} | {p:,.0f} | {prec} |" for k, (t, p, prec) in rows.items())
    for kind in ("deep", "shallow"):
        ref = results[f"host numpy ({kind})"]
        for name, res in results.items():
            if name.endswith(f"({kind})") and res is not ref:
                bad = differing(res.per_query, ref.per_query)
                out.append(f"{name}: {int(bad.sum())} queries differ from the host engine")
    vals = ", ".join(f"{m}={v:.4f}" for m, v in results["host numpy (deep)"].metrics.items())
    out.append(f"values: {vals}")
    print("\n".join(out[first_line:]), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cases", nargs="*", default=["sop", "large", "map", "qrels", "1m"])
    parser.add_argument("--small", action="store_true", help="small sizes (a CPU smoke run)")
    parser.add_argument("--device", default=None, help="default: cuda if present (else cpu)")
    parser.add_argument("--repeat", type=int, default=2, help="best of N (not for 1m)")
    parser.add_argument("--cpu-sample", type=int, default=10_000, help="1m: CPU-checked queries")
    parser.add_argument("--explain", type=int, default=100, help="differing queries to check")
    parser.add_argument("--no-pml", action="store_true")
    parser.add_argument("--pml-1m", action="store_true", help="also run PML at 1M (batched)")
    parser.add_argument("--out", default=None, help="also write the Markdown report here")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")

    import torch

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "none (CPU run)"
    out = [
        "## bench_gpu" + (" --small (CPU smoke run, not GPU figures)" if args.small else ""),
        f"device: {device} / GPU: {gpu}; torch {torch.__version__}; "
        f"Python {platform.python_version()}; host: {machine()}",
    ]
    print("\n".join(out), flush=True)
    # Warm-up: CUDA context, cuBLAS handles and kernels of every method, untimed.
    warm = argparse.Namespace(**{**vars(args), "small": True, "repeat": 1})
    sink: list[str] = []
    if device.type == "cuda":
        one_case(torch, device, "map", warm, sink, quiet=True)
    for case in args.cases:
        if case == "qrels":
            qrels_case(torch, device, args, out)
        else:
            one_case(torch, device, case, args, out)
        if args.out:  # after every case, so a run cut short keeps what it finished
            with open(args.out, "w") as fh:
                fh.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
