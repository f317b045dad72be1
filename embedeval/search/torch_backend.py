"""The PyTorch backend: the exact engine's search and metric kernels on a GPU (or the CPU).

:func:`run_torch` consumes the same :class:`~embedeval.engine.task.RetrievalTask` as the other
backends and returns the same per-query values and tie flags.  Per block of queries, on the
device:

1. keys ``||r||^2 - 2 q.r`` (Euclidean) or ``-q.r`` (cosine, inner product) from the filter
   product (float32; TF32 or bfloat16 when asked for, or bfloat16 by ``precision="auto"``, see
   :func:`_search_precision`); identical reference rows get their first member's key (so they
   tie and rank by index); excluded references (self, same group) get ``+inf``;
2. a per-query cut-off at that query's depth: an order statistic of a fixed column sample with a
   safety margin (the exact order statistic of the whole row when the sample cannot tell, or
   when the cut-off kept too few), raised to the farthest / nearest same-label reference for
   full-depth MAP / MRR, and never above the largest finite key;
3. every key at or below the cut-off, widened by the product's error bound, is kept (ties at
   the cut are kept whole) and the kept (row, key, reference) triples are sorted as packed
   int64 codes, i.e. by key and then by ascending reference index; the sorted keys then give
   each row's exact order statistic, and only the keys at or below it (widened alike) go on,
   so a sample's safety margin costs one sort, not the float64 decision and the kernels;
4. the metric kernels (:mod:`embedeval.engine.torch_kernels`, a port of
:mod:`embedeval.engine.kernels`:
   searchsorted, cumulative counts, segment sums in numpy's summation order), so only per-query
   values leave the device, and they are bit-identical to the local engine's whenever the keys
   are.

Between steps 3 and 4 each block is put in float64 order.  On a GPU that happens on the device
(:mod:`embedeval.engine.torch_decide`: every candidate takes a float64 product key, only runs
closer than float64's bound take the fixed-order keys); on the CPU the host's
sparse decision (:mod:`embedeval.engine.decide`) re-scores only the near-ties.  The cut-offs of
step 2 are widened by the filter product's error bound (float32, TF32 or bfloat16), and a block
whose TF32 / bfloat16 band would keep too many keys beyond its cut-offs is filtered again with a
float32 product (:func:`_band_too_wide`): the values never depend on the product, only the time.
On the CPU the float32 products of step 1 are the local engine's own (same code, block layout
and single-threaded BLAS).

Memory is bounded by query blocks sized from a budget (default half the free device memory);
no buffer grows with n_query x depth.  torch is imported only when this backend is used.
"""

from __future__ import annotations

import contextlib
import math
import threading
import warnings
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..engine.arrays import import_torch, to_host
from ..engine.candidates import Candidates
from ..engine.corpus import numpy_product
from ..engine.decide import decide_task_block, first_k, rounding_of, task_norms
from ..engine.deep import deep_applies, deep_blocks, filter_precision
from ..engine.exact import DEFAULT_MEMORY_BUDGET, TINY_NORM
from ..engine.integers import exact_in_float32
from ..engine.labels import is_label_sets
from ..engine.threads import one_torch_thread
from ..engine.torch_decide import decide_on_device
from ..engine.torch_kernels import DeviceKernels
from ..utils.errors import InputError
from ..utils.progress import progress_bar
from .local import local_blocks, with_exact_keys
from .options import TorchOptions

__all__ = [
    "run_torch",
    "torch_neighbors",
]

_FMAX = float(np.finfo(np.float32).max)
_SAMPLE = 4096
_TOPK_MAX = 2048  # deepest order statistic taken by topk rather than a full sort
_MAX_BLOCK = 8192
_BYTES_PER_KEY = 12  # keys, the comparison mask, exclusion / label masks and their temporaries
_BYTES_PER_CANDIDATE = 80  # packed codes, their sort, decoded index / bits, kernel arrays
# more per candidate when the float64 decision runs on the device: keys, magnitudes, rows, two
# sort permutations (engine/torch_decide.py)
_BYTES_PER_DECIDED = 80


def _budget(torch: Any, device: Any, memory: float | int | None) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if memory is None:
            return int(free * 0.5)
        return int(free * memory) if memory <= 1 else int(memory)
    if memory is None:
        return 2 * DEFAULT_MEMORY_BUDGET
    return int(memory) if memory > 1 else int(memory * 4 * DEFAULT_MEMORY_BUDGET)


@contextlib.contextmanager
def _matmul_precision(torch: Any, tf32: bool) -> Iterator[None]:
    """TF32 on or off for CUDA float32 products during this call only (restored afterwards),
    and bfloat16 products reduced in float32 only (cuBLAS may otherwise round split-K partial
    sums to bfloat16, outside the error bound the decision uses).

    PyTorch >= 2.9 keeps the setting in ``torch.backends.cuda.matmul.fp32_precision``; reading
    the legacy ``get_float32_matmul_precision`` fails once a user has set the new one, so the
    new flag is used where it exists and the legacy ``allow_tf32`` otherwise.
    """
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        name, value = "fp32_precision", ("tf32" if tf32 else "ieee")
    else:  # pragma: no cover - PyTorch < 2.9
        name, value = "allow_tf32", tf32
    settings = [(name, value)]
    if hasattr(matmul, "allow_bf16_reduced_precision_reduction"):
        settings.append(("allow_bf16_reduced_precision_reduction", False))
    before = [(n, getattr(matmul, n)) for n, _ in settings]
    for n, v in settings:
        setattr(matmul, n, v)
    try:
        yield
    finally:
        for n, v in before:
            setattr(matmul, n, v)


def resolve_precision(torch: Any, precision: str, device: Any) -> str:
    """The product ``precision`` (:data:`embedeval.search.options.PRECISIONS`) on ``device``:
    ``"auto"`` is ``"bf16"`` on a CPU that multiplies bfloat16 natively (AVX512-BF16 or AMX
    through oneDNN), ``"tf32"`` on a CUDA GPU that has TF32 (compute capability 8.0 or
    more), else ``"float32"``; ``"tf32"`` asked of a device without it (TF32 is a CUDA mode) is
    ``"float32"``, which is what such a device multiplies in, so the record says so.

    On a GPU the product is a small part of a search's time, and bfloat16's wider band leaves
    more candidates to the rest; TF32's band is narrow enough.  Measured on an H200
    (``python -m benchmarks.bench_gpu``, every value exact): 1,000,000 x 128 leave-one-out
    12.2 s in TF32, 15.3 s in float32, 17.0 s in bfloat16; SOP-like 60,000 x 128 0.120,
    0.124 and 0.138 s; the deep cases alike within 3 %."""
    if precision == "tf32" and device.type != "cuda":
        return "float32"
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "tf32" if torch.cuda.get_device_capability(device)[0] >= 8 else "float32"
    if device.type != "cpu":
        return "float32"
    mkldnn = torch.backends.mkldnn
    native = mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return "bf16" if native else "float32"


def torch_product(device: str, precision: str = "float32") -> Callable[..., np.ndarray]:
    """A product on a torch device: the block (and once, the query chunk) moved there, the
    float32 result brought back.  Another library's float32 sums may differ in the last bit
    from numpy's: the scan's bound holds for any summation order, so the ranking is the same.
    ``precision``: ``"float32"``, ``"tf32"`` (CUDA float32 products with a 10-bit mantissa)
    or ``"bf16"`` (bfloat16 copies of both sides, accumulated in float32); the scan's band
    (:meth:`embedeval.engine.corpus.CorpusScan.band`) covers each one's rounding."""
    import torch

    dev = torch.device(device)
    low = torch.bfloat16 if precision == "bf16" else torch.float32
    cache: dict[Any, Any] = {}
    lock = threading.Lock()  # the scan's threads share the copies

    def on_device(q: np.ndarray, blk: np.ndarray) -> tuple[Any, Any]:
        with lock:
            # the scan's query chunks are views of one array that outlives the product
            key = (q.__array_interface__["data"][0], q.shape)
            tq = cache.get(key)
            if tq is None:  # each query chunk moves once
                tq = _read_only_tensor(torch, np.ascontiguousarray(q)).to(dev).to(low)
                cache[key] = tq
            held = cache.get("block")
            # the block itself is kept with its copy: while held, no other array can have
            # its identity (an id alone can be reused by the next pass's first block)
            if held is None or held[0] is not blk:  # each block moves once
                held = (blk, _read_only_tensor(torch, blk).to(dev).to(low))
                cache["block"] = held
        return tq, held[1]

    inside = [0, None]  # threads inside a product, and the settings they share

    @contextlib.contextmanager
    def settings() -> Iterator[None]:
        # set by the first thread in, restored by the last out (each thread restoring what it
        # found could leave another thread's settings behind)
        with lock:
            if inside[0] == 0:
                inside[1] = _matmul_precision(torch, precision == "tf32")
                inside[1].__enter__()
            inside[0] += 1
        try:
            yield
        finally:
            with lock:
                inside[0] -= 1
                if inside[0] == 0:
                    inside[1].__exit__(None, None, None)

    def product(q: np.ndarray, blk: np.ndarray) -> np.ndarray:
        tq, tb = on_device(q, blk)
        # on the CPU the scan's worker threads share the cores: each product takes one
        one = one_torch_thread(torch) if dev.type == "cpu" else contextlib.nullcontext()
        with settings(), one:
            return (tq @ tb.T).float().cpu().numpy()

    # read by the scan's band (embedeval.engine.decide.rounding_of)
    product.tensor_cores = dev.type == "cuda" and precision != "float32"  # type: ignore[attr-defined]
    return product


def corpus_product(options: Any, shallow: bool) -> tuple[Callable[..., np.ndarray], str]:
    """The corpus engine's device product for ``options`` (:class:`TorchOptions`) and its
    precision: ``"auto"`` takes bfloat16 only for ``shallow`` rankings on a CPU that
    multiplies it natively (:func:`resolve_precision`; a deep ranking's band holds thousands
    of documents per query, all re-scored in float64 on the host); TF32 exists only on GPUs
    (float32 elsewhere), and a float32 product on the CPU is numpy's."""
    torch = import_torch()
    dev = torch.device(options.device)
    chosen = options.precision
    if chosen == "auto":  # GPUs: float32 (a TF32 scan is not measured to pay for its band)
        shallow = shallow and dev.type == "cpu"
        chosen = resolve_precision(torch, "auto", dev) if shallow else "float32"
    if chosen == "tf32" and dev.type != "cuda":
        chosen = "float32"
    if chosen == "float32" and dev.type == "cpu":
        # the same float32 product (the same bound) in numpy's chunks of the scan: torch's
        # float32 product of whole blocks ran the benchmark's scan 1.4-1.6x slower here
        return numpy_product, chosen
    return torch_product(options.device, chosen), chosen


# ---------------------------------------------------------------------------------- search


@dataclass
class _Search:
    """Device-side query and reference matrices, duplicate map and exclusion codes."""

    torch: Any
    queries: Any  # float32 (n_query, dim), normalised for cosine
    reference: Any  # float32 (n_ref, dim)
    sq_ref: Any | None  # ||r||^2 for the Euclidean key
    dup_members: Any | None  # reference rows that have an identical earlier twin
    dup_first: Any | None  # that twin (first member of the group), aligned with dup_members
    self_index: bool
    query_groups: Any | None
    reference_groups: Any | None
    #: On the CPU: the local engine's own product code and query-block size (see _prepare).
    engine: Any | None = None
    engine_block: int = 0
    #: bfloat16 copies of the queries and references (the "bf16" filter product), else None.
    low: tuple[Any, Any] | None = None
    #: The task's float32 rows on the device, as given (cosine: before normalisation), for
    #: the float64 decision on the device (:mod:`embedeval.engine.torch_decide`).
    raw: tuple[Any, Any] | None = None
    #: The filter product: "float32", "tf32" (the matmul settings of the search) or "bf16".
    precision: str = "float32"

    @property
    def n_reference(self) -> int:
        return int(self.reference.shape[0])

    def _engine_products(self, start: int, stop: int) -> np.ndarray:
        """Keys of rows [start, stop) multiplied exactly as the local engine multiplies them:
        its query blocks (BLAS rounds a product's rows differently for different row counts),
        its column tiles (:func:`embedeval.engine.exact.grid_keys`) and one BLAS thread per
        product."""
        from ..engine.exact import grid_keys
        from ..engine.threads import single_threaded_blas

        n_query, n_ref, bs = int(self.queries.shape[0]), self.n_reference, self.engine_block
        out = np.empty((stop - start, n_ref), dtype=np.float32)
        with single_threaded_blas():
            for e0 in range(start - start % bs, stop, bs):
                e1 = min(e0 + bs, n_query)
                a, b = max(e0, start), min(e1, stop)
                keys = grid_keys(self.engine, slice(e0, e1), 0, n_ref)
                out[a - start : b - start] = keys[a - e0 : b - e0]
        return out

    def keys(self, start: int, stop: int, float32: bool = False) -> Any:
        """Ranking keys of queries [start, stop) against every reference, exclusions at +inf;
        from the filter product, or a float32 one (``float32``: no TF32, no bfloat16)."""
        torch = self.torch
        if float32 and self.precision != "float32":
            with _matmul_precision(torch, False):
                return replace(self, low=None, precision="float32").keys(start, stop)
        q = self.queries[start:stop]
        if self.engine is not None:
            keys = torch.from_numpy(self._engine_products(start, stop))
        elif self.low is not None:
            keys = _low_keys(torch, self.low[0][start:stop], self.low[1], self.sq_ref)
        # One product, nothing more over the block: a 1-D bias lets cuBLAS add ||r||^2 in the
        # product's epilogue, and negating the (small) query block is exact.
        elif self.sq_ref is not None:
            keys = torch.addmm(self.sq_ref, q, self.reference.T, beta=1.0, alpha=-2.0)
        else:
            keys = torch.mm(-q, self.reference.T)
        if self.dup_members is not None:
            keys[:, self.dup_members] = keys[:, self.dup_first]
        if self.self_index:
            rows = torch.arange(start, min(stop, self.n_reference), device=keys.device)
            keys[rows - start, rows] = math.inf
        if self.reference_groups is not None:
            same = self.query_groups[start:stop, None] == self.reference_groups[None, :]
            keys.masked_fill_(same, math.inf)
        return keys


#: The products (``"mm"``, ``"addmm"``) whose float32 result of bfloat16 inputs (``out_dtype``)
#: this PyTorch refused on a GPU: those take the four passes of :func:`_low_keys` from then on.
_NO_OUT_DTYPE: set[str] = set()


def _low_keys(torch: Any, q: Any, r: Any, sq_ref: Any | None) -> Any:
    """Keys of bfloat16 rows ``q`` against ``r`` (``||r||^2 - 2 q.r`` with ``sq_ref``, else
    ``-q.r``), accumulated in float32.

    On a GPU the product returns float32 (``out_dtype``, PyTorch 2.9 on)
    with the bias ``||r||^2`` added in its epilogue: one pass over the key block (on an H200,
    11.9 ms instead of 18.4 ms for 2,147 x 1,000,000 x 128).  Otherwise, or where this PyTorch
    refuses ``out_dtype``, the result is rounded to bfloat16, widened, scaled and biased (four
    passes).  The bound of :func:`embedeval.engine.decide.key_bounds` with ``input_u = 2**-9``
    allows for that rounding to bfloat16; the float32 result skips it, and the rest is the same
    in both (the factor -2 is exact, the bias one float32 addition), so the bound holds for
    both.  Running out of device memory is raised, not taken for a missing ``out_dtype``."""
    op = "mm" if sq_ref is None else "addmm"
    if q.device.type == "cuda" and op not in _NO_OUT_DTYPE:
        try:
            if sq_ref is None:
                return torch.mm(-q, r.T, out_dtype=torch.float32)
            return torch.addmm(sq_ref, q, r.T, beta=1.0, alpha=-2.0, out_dtype=torch.float32)
        except (TypeError, RuntimeError) as err:  # an older PyTorch: the four passes below
            if "out of memory" in str(err).lower() or type(err).__name__ in _DEVICE_ERRORS:
                raise
            _NO_OUT_DTYPE.add(op)
    keys = torch.mm(q, r.T).float().mul_(-2.0)
    return keys.add_(sq_ref) if sq_ref is not None else keys.mul_(0.5)


#: Errors of the device itself, never a sign that ``out_dtype`` is missing.
_DEVICE_ERRORS = ("OutOfMemoryError", "AcceleratorError")


def _prepare(
    torch: Any, task: Any, device: Any, engine: tuple[Any, int] | None, precision: str = "float32"
) -> _Search:
    """Device-side matrices of ``task``.  With ``engine`` (on the CPU: see
    :func:`_engine_search`), the keys are the local engine's own products; with ``precision``
    ``"bf16"``, products of bfloat16 copies."""

    def put(x: Any) -> Any:
        if isinstance(x, np.ndarray):
            x = _read_only_tensor(torch, np.ascontiguousarray(x))
        return x.to(device=device, dtype=torch.float32)

    xq = put(task.query)
    xb = xq if task.reference is task.query else put(task.reference)
    raw = (xq, xb)
    sq_ref = None
    same = xb  # rows that every query ranks alike are the identical rows of this
    if task.distance == "cosine":  # positive multiples are one direction: tied
        same = _directions(xb)
        xq = _normalize(torch, xq, "query")
        xb = xq if task.reference is task.query else _normalize(torch, xb, "reference")
    elif task.distance == "euclidean":
        sq_ref = (xb * xb).sum(dim=1)
    members, first = _duplicate_rows(torch, same)
    ex = task.exclusions

    def codes(a: Any) -> Any:
        return None if a is None else torch.as_tensor(np.asarray(a, dtype=np.int64), device=device)

    search, block = (None, 0) if engine is None else engine
    low = None
    if precision == "bf16":
        low_q = xq.to(torch.bfloat16)
        low = (low_q, low_q if xb is xq else xb.to(torch.bfloat16))
    return _Search(
        torch, xq, xb, sq_ref, members, first, bool(ex.self_index),
        codes(ex.query_groups), codes(ex.reference_groups), search, block, low, raw, precision,
    )  # fmt: skip


def _engine_search(
    task: Any, need: np.ndarray, label: Any, opts: TorchOptions, device: Any
) -> tuple[Any, int] | None:
    """On the CPU: the local engine's prepared product (identical references tied as it ties
    them) and its query-block size for ``task``, so that both engines see bit-identical float32
    keys on any data (PyTorch's and numpy's BLAS sum a dot product in different orders);
    everything after the product is this module's.  ``None`` on other devices."""
    if device.type != "cpu" or not opts.engine_keys or opts.precision == "bf16":
        return None
    from ..engine.exact import PreparedSearch, block_layout, reference_duplicates, representatives
    from ..engine.symmetric import SymmetricSearch, SymmetricSet, symmetric_applies

    xq = to_host(task.query)
    xb = xq if task.reference is task.query else to_host(task.reference)
    n_ref = int(xb.shape[0])
    dups = reference_duplicates(xb, task.distance)
    search = PreparedSearch.build(xq, xb, task.distance)
    search = search.with_duplicates(dups, representatives(xb, dups, task.distance), slice(0, n_ref))
    if symmetric_applies(task, label, dups):  # leave-one-out: the engine's canonical keys
        search = SymmetricSearch.wrap(search, SymmetricSet.from_search(search, task.distance))
    n_groups = 0 if dups is None else dups.n_groups
    _, block, _ = block_layout(
        need, n_ref, label is not None, opts.block_size, opts.memory_budget, n_groups
    )
    return search, block


def _read_only_tensor(torch: Any, x: np.ndarray) -> Any:
    """``torch.from_numpy(x)`` without PyTorch's warning for a read-only array (a memory map,
    a loaded ``.npy``): the tensor is only read, never written in place."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(x)


def _normalize(torch: Any, x: Any, name: str) -> Any:
    """Unit rows as the CPU engine forms them (:func:`embedeval.engine.exact.normalize_rows`):
    norms in float64 rounded to float32, rows of a subnormal norm first scaled by a power of
    two."""
    norms = torch.sqrt((x.double() * x.double()).sum(dim=1))
    zero = torch.nonzero(norms == 0).flatten()
    if zero.numel():
        raise InputError(
            f"distance='cosine' needs non-zero vectors; {zero.numel()} row(s) of {name} are all "
            f"zero (first at row {int(zero[0])}). Drop them or use distance='euclidean'."
        )
    out = x / norms.float()[:, None]
    tiny = torch.nonzero(norms < TINY_NORM).flatten()
    if tiny.numel():
        scale = torch.ldexp(torch.ones_like(norms[tiny]), 1 - torch.frexp(norms[tiny])[1])
        rows = (x[tiny].double() * scale[:, None]).float()
        out[tiny] = rows / (norms[tiny] * scale).float()[:, None]
    return out


def _directions(x: Any) -> Any:
    """float32 rows divided by their largest ``|component|`` in float64: equal exactly for
    positive multiples (:func:`embedeval.engine.decide.direction_rows`)."""
    return x.double() / x.abs().amax(dim=1, keepdim=True).double().clamp_min(1e-300)


def _duplicate_rows(torch: Any, x: Any, chunk: int = 65536) -> tuple[Any, Any]:
    """(members, first member of their group) for rows of ``x`` (float32 or float64) with an
    identical earlier row.

    A random linear hash of each row's bits (int64 arithmetic wraps) finds candidate groups in
    one pass; only rows whose hash repeats are compared exactly.
    """
    n = x.shape[0]
    words = x.shape[1] * x.element_size() // 4
    gen = np.random.default_rng(0).integers(1, 2**62, words, dtype=np.int64) | 1
    mult = torch.as_tensor(gen, device=x.device)
    hashes = torch.empty(n, dtype=torch.int64, device=x.device)
    for a in range(0, n, chunk):
        bits = (x[a : a + chunk] + 0.0).view(torch.int32).to(torch.int64)
        hashes[a : a + chunk] = (bits * mult).sum(dim=1)
    sorted_h, order = torch.sort(hashes, stable=True)
    same = sorted_h[1:] == sorted_h[:-1]
    repeated = torch.zeros(n, dtype=torch.bool, device=x.device)
    repeated[1:] |= same
    repeated[:-1] |= same
    candidates = torch.sort(order[repeated]).values
    if candidates.numel() == 0:
        return None, None
    rows = x[candidates] + 0.0
    _, inverse = torch.unique(rows, dim=0, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1,), n, dtype=torch.int64, device=x.device)
    first.scatter_reduce_(0, inverse, candidates, reduce="amin")
    first_of = first[inverse]
    twin = first_of != candidates
    if not bool(twin.any()):
        return None, None
    return candidates[twin], first_of[twin]


def _sortable(torch: Any, keys: Any) -> Any:
    """float32 keys as int64 in [0, 2**32) whose order is the float order (-0.0 as +0.0)."""
    bits = (keys + 0.0).view(torch.int32).to(torch.int64)
    low = bits & 0xFFFFFFFF
    return torch.where(bits < 0, 0xFFFFFFFF - low, low | 0x80000000)


def _block_size(
    need: np.ndarray, n_ref: int, label: bool, budget: int, given: int | None, per_candidate: int
) -> int:
    # At most 2**31 keys per block: some CUDA kernels (nonzero among them in older PyTorch)
    # index with 32-bit integers.
    cap = max(1, (2**31 - 1) // n_ref)
    if given is not None:
        return min(int(given), cap)
    expected = n_ref if label else min(n_ref, int(need.max(initial=0) * 1.5) + 256)
    per_row = n_ref * _BYTES_PER_KEY + expected * per_candidate
    return int(max(1, min(_MAX_BLOCK, budget // per_row, cap)))


def _exact_tau(torch: Any, keys: Any, rows: Any, need: Any, chunk: int) -> Any:
    """The need-th smallest key of each of ``rows`` (-inf for need 0): a partial selection
    (``topk``) of ``chunk`` rows at a time, or a sort when the deepest need is large."""
    out = torch.empty(rows.shape, dtype=torch.float32, device=keys.device)
    deepest = int(need.max()) if need.numel() else 0
    for a in range(0, rows.numel(), chunk):
        part = keys[rows[a : a + chunk]]
        if 0 < deepest <= min(_TOPK_MAX, keys.shape[1] // 4):
            ordered = torch.topk(part, deepest, dim=1, largest=False, sorted=True).values
        else:
            ordered = torch.sort(part, dim=1).values
        at = (need[a : a + chunk] - 1).clamp(min=0, max=keys.shape[1] - 1)
        out[a : a + chunk] = ordered.gather(1, at[:, None])[:, 0]
    return torch.where(need > 0, out, torch.full_like(out, -math.inf))


def _thresholds(torch: Any, keys: Any, need: Any, sample: Any, chunk: int) -> Any:
    """Per-row cut-offs meant to keep at least ``need`` keys: the (j+1)-th smallest of the
    column sample's m keys with j = s*need + 4*sqrt(s*need) + 2 and s = m / n_reference (four
    binomial standard deviations of margin), or the exact order statistic when j >= m.  The
    caller redoes the rare row that comes out short."""
    b, n_ref = keys.shape
    tau = torch.full((b,), math.inf, dtype=torch.float32, device=keys.device)
    exact = need > 0
    if sample is not None:
        m = sample.numel()
        expected = need.double() * (m / n_ref)
        j = torch.ceil(expected + 4.0 * expected.sqrt() + 2.0).long()
        usable = (j < m) & (need > 0)
        if bool(usable.any()):
            rows = torch.nonzero(usable).flatten()
            part = keys[:, sample][rows]
            deepest = int(j[rows].max()) + 1
            if deepest <= _TOPK_MAX:  # a partial selection is much cheaper than a sort
                part = torch.topk(part, deepest, dim=1, largest=False, sorted=True).values
            else:
                part = torch.sort(part, dim=1).values
            tau[rows] = part.gather(1, j[rows, None])[:, 0]
        exact = (need > 0) & ~usable
    tau[need == 0] = -math.inf
    rows = torch.nonzero(exact).flatten()
    if rows.numel():
        tau[rows] = _exact_tau(torch, keys, rows, need[rows], chunk)
    return tau


def _cap(torch: Any, tau: Any, label_tau: Any | None) -> Any:
    """Raise cut-offs to the label threshold; never above the largest finite key, so that
    excluded references (+inf) are never candidates."""
    if label_tau is not None:
        tau = torch.maximum(tau, label_tau)
    return tau.clamp(max=_FMAX)


def _label_tau(torch: Any, keys: Any, how: str, q_codes: Any, r_codes: Any) -> Any:
    """Key of the farthest ("max") or nearest ("min") visible same-label reference per row."""
    positive = (q_codes[:, None] == r_codes[None, :]) & (keys <= _FMAX)
    if how == "max":
        return torch.where(positive, keys, -math.inf).amax(dim=1)
    out = torch.where(positive, keys, math.inf).amin(dim=1)
    return torch.where(torch.isfinite(out), out, torch.full_like(out, -math.inf))


@dataclass
class _DeviceCandidates:
    """Sorted candidates on the device (CSR, like
    :class:`~embedeval.engine.candidates.Candidates`)."""

    start: int
    lims: Any  # int64 (b + 1,)
    index: Any  # int64 reference indices, nearest first, ties by ascending index
    bits: Any  # int64 sortable key bits (equal = exact tie)
    #: The product that filtered them and its ``(scale, input_u)`` (the host decision's bound).
    precision: str = "float32"
    rounding: tuple[float, float] = (1.0, 0.0)

    @classmethod
    def from_host(cls, torch: Any, block: Candidates, device: Any) -> _DeviceCandidates:
        """``block`` (host candidates, e.g. re-ordered in float64) on ``device``."""

        def put(a: np.ndarray) -> Any:
            return torch.as_tensor(np.asarray(a, dtype=np.int64), device=device)

        start = int(block.queries[0]) if block.queries.size else 0
        return cls(start, put(block.lims), put(block.index), put(block.bits))

    def to_host(self) -> Candidates:
        b = self.lims.numel() - 1
        return Candidates(
            np.arange(self.start, self.start + b),
            self.lims.cpu().numpy(),
            self.index.cpu().numpy(),
            self.bits.cpu().numpy().astype(np.uint32),
        )


def _widener(torch: Any, reach: Any, device: Any) -> Any:
    """``band(rows, tau)``: device thresholds of the query ``rows`` (a block start, or global
    indices) widened by their :class:`embedeval.engine.decide.Reach` band (computed on the
    host from the thresholds, rounded up in float32)."""

    def band(rows: Any, tau: Any) -> Any:
        host = tau.cpu().numpy()
        if isinstance(rows, int):
            rows = slice(rows, rows + host.size)
        else:
            rows = rows.cpu().numpy()
        return torch.as_tensor(reach.widen(rows, host), device=device)

    return band


def _collect(
    torch: Any,
    keys: Any,
    tau: Any,
    need: Any,
    label_tau: Any | None,
    start: int,
    chunk: int,
    band: Any,
) -> _DeviceCandidates:
    """Every (row, reference) with key <= its exact cut-off widened by ``band`` (the float64
    decision's band, :func:`_widener`), sorted by (row, key, reference index).

    The keys under the given (sampled) cut-offs ``tau`` are gathered and sorted first; a row
    that kept fewer than ``need`` gets the exact order statistic first; the sorted keys then
    give every row's exact cut-off (:func:`_exact_cut`), and only the keys under it are kept.
    A row whose sampled cut-off, widened, still lies below its exact one widened (a sample
    can fall short by less than the band) is gathered again under the exact one."""
    n_ref = keys.shape[1]
    if label_tau is not None:
        label_tau = band(start, label_tau)
    tau = _cap(torch, band(start, tau), label_tau)
    lims, code, row = _gathered(torch, keys, tau)
    short = torch.nonzero(lims[1:] - lims[:-1] < need).flatten()
    if short.numel():  # rare: the sampled cut-off of these rows kept too few; redo them exactly
        redo = _exact_tau(torch, keys, short, need[short], chunk)
        redo = band(start + short, redo)
        tau[short] = _cap(torch, redo, None if label_tau is None else label_tau[short])
        lims, code, row = _gathered(torch, keys, tau)
    col_bits = max(1, (n_ref - 1).bit_length())
    bits = (code >> col_bits) & 0xFFFFFFFF
    if bits.numel():  # sampled cut-offs keep more than the exact ones: cut back to those
        cut = _exact_cut(torch, lims, bits, need, label_tau, start, band)
        if bool((cut > tau).any()):  # rare: gather those rows again under the exact cut-off
            lims, code, row = _gathered(torch, keys, torch.maximum(tau, cut))
            bits = (code >> col_bits) & 0xFFFFFFFF
        keep = bits <= _sortable(torch, cut)[row]
        code, bits = code[keep], bits[keep]
        lims = torch.nn.functional.pad(torch.cumsum(keep, 0), (1, 0))[lims]
    return _DeviceCandidates(start, lims, code & ((1 << col_bits) - 1), bits)


def _gathered(torch: Any, keys: Any, tau: Any) -> tuple[Any, Any, Any]:
    """The keys at or below each row's ``tau`` as CSR ``lims`` and packed codes (key bits,
    then reference index) sorted within each row, and each code's row."""
    b, n_ref = keys.shape
    # One pass over the keys (the comparison); row counts come from the few kept positions.
    bounds = torch.arange(b + 1, device=keys.device) * n_ref
    flat = torch.nonzero((keys <= tau[:, None]).view(-1)).flatten()
    lims = torch.searchsorted(flat, bounds)
    col_bits = max(1, (n_ref - 1).bit_length())
    if col_bits > 30:
        raise InputError("the torch backend supports at most 2**30 reference vectors.")
    # (row in chunk, key bits, reference) packed in 63 bits: one sort orders by key, then index.
    rows_per_sort = 1 << (31 - col_bits)
    row = torch.div(flat, n_ref, rounding_mode="floor")
    code = (_sortable(torch, keys.view(-1)[flat]) << col_bits) | (flat - row * n_ref)
    del flat
    lims_host = lims.cpu().numpy()
    for r0 in range(0, b, rows_per_sort):
        r1 = min(r0 + rows_per_sort, b)
        a, e = int(lims_host[r0]), int(lims_host[r1])
        if e > a:
            seg = code[a:e] | ((row[a:e] - r0) << (32 + col_bits))
            code[a:e] = torch.sort(seg).values
    return lims, code, row


def _exact_cut(
    torch: Any, lims: Any, bits: Any, need: Any, label_tau: Any, start: int, band: Any
) -> Any:
    """Per row, the cut-off an exact order statistic gives, read off a block's sorted
    candidates (CSR ``lims``, sortable key ``bits``) that hold every key up to it: the
    need-th smallest key of the row widened by ``band``, raised to the widened ``label_tau``
    (``+inf`` capped, i.e. every key, for a row that holds fewer than ``need``).  A sampled
    cut-off keeps several times the depth (a 1/64 column sample at depth 101 keeps about 600
    keys a row); the float64 decision and the metric kernels then read only what this one
    keeps, the same candidates as when the order statistic is taken over the whole row."""
    at = (lims[:-1] + need - 1).clamp(min=0, max=int(bits.numel()) - 1)
    tau = _float_of_sortable(torch, bits[at])
    tau = torch.where(need > 0, tau, torch.full_like(tau, -math.inf))
    # a row holding fewer than need candidates (every key it can see) keeps them all
    tau = torch.where(lims[1:] - lims[:-1] < need, torch.full_like(tau, math.inf), tau)
    return _cap(torch, band(start, tau), label_tau)


def _float_of_sortable(torch: Any, bits: Any) -> Any:
    """float32 values of :func:`_sortable` codes (its inverse)."""
    positive = bits >= 0x80000000
    raw = torch.where(positive, bits & 0x7FFFFFFF, 0xFFFFFFFF - bits)
    raw = torch.where(raw >= 0x80000000, raw - (1 << 32), raw)
    return raw.to(torch.int32).view(torch.float32)


def _candidate_blocks(
    torch: Any,
    search: _Search,
    need: np.ndarray,
    label: Any,
    opts: TorchOptions,
    reaches: dict[str, tuple[Any, tuple[float, float]]],
) -> Iterator[_DeviceCandidates]:
    """Sorted candidates of each query block (see the module for the steps), thresholds widened
    by the :class:`embedeval.engine.decide.Reach` of the product that filtered them
    (``reaches``: precision -> (reach, rounding)).  A block whose coarse filter (TF32,
    bfloat16) would let through too many keys beyond its cut-offs is filtered again with a
    float32 product (:func:`_band_too_wide`)."""
    device = search.queries.device
    bands = {p: _widener(torch, reach, device) for p, (reach, _) in reaches.items()}
    n_query, n_ref = int(search.queries.shape[0]), search.n_reference
    budget = _budget(torch, device, opts.memory)
    per_candidate = _BYTES_PER_CANDIDATE + _BYTES_PER_DECIDED * _decides_on_device(opts, device)
    block = _block_size(need, n_ref, label is not None, budget, opts.block_size, per_candidate)
    if search.engine_block:  # whole local-engine blocks (see _prepare)
        block = search.engine_block * max(1, block // search.engine_block)
    sort_rows = max(1, budget // (4 * 16 * n_ref))  # rows per exact sort (values + indices)
    sample = None
    # A sample of ~1/64 of the columns (at least _SAMPLE): the margin of the cut-off, hence the
    # surplus of candidates to sort, shrinks as the sample grows (1M references: ~6x depth 101
    # with 15,625 columns instead of ~15x with 4,096).
    m = min(max(_SAMPLE, n_ref // 64), 16 * _SAMPLE)
    if n_ref > 2 * m:
        picked = np.sort(np.random.default_rng(0).choice(n_ref, m, replace=False))
        sample = torch.as_tensor(picked, device=device)
    need_t = torch.as_tensor(need, device=device)
    codes = None
    if label is not None:
        codes = (torch.as_tensor(label[1], device=device), torch.as_tensor(label[2], device=device))
    limit = _band_limit(n_ref, int(search.queries.shape[1]), per_candidate)

    def filtered(start: int, stop: int, float32: bool) -> tuple[Any, Any, Any]:
        keys = search.keys(start, stop, float32)
        label_tau = None
        if codes is not None:
            label_tau = _label_tau(torch, keys, label[0], codes[0][start:stop], codes[1])
        return keys, label_tau, _thresholds(torch, keys, need_t[start:stop], sample, sort_rows)

    skip = 0  # blocks left that go straight to float32 after a fallback
    for start in range(0, n_query, block):
        stop = min(start + block, n_query)
        precision = search.precision if skip == 0 else "float32"
        skip = max(0, skip - 1)
        keys, label_tau, tau = filtered(start, stop, precision == "float32")
        if precision != "float32":
            cut = tau if label_tau is None else _cap(torch, tau, label_tau)
            if _band_too_wide(torch, keys, cut, sample, bands[precision], start, limit):
                del keys
                # neighbouring blocks are usually alike: the next few skip the coarse product
                # (at most 1 in _RETRY blocks is multiplied twice)
                precision, skip = "float32", _RETRY - 1
                keys, label_tau, tau = filtered(start, stop, True)
        found = _collect(
            torch, keys, tau, need_t[start:stop], label_tau, start, sort_rows, bands[precision]
        )
        yield replace(found, precision=precision, rounding=reaches[precision][1])
        del keys


#: After a block falls back to float32, the next ``_RETRY - 1`` blocks are filtered in float32.
_RETRY = 8


def _band_limit(n_ref: int, dim: int, per_candidate: int) -> int:
    """Keys per row beyond the cut-off that a coarse filter may let through before a float32
    product of the block costs less: one float32 product row (``2 dim n_ref`` flops, ~50
    TFLOP/s on a current GPU) against ~1.5 ns per extra candidate (kept, sorted, re-scored in
    float64), at least 256; and at most what half the row's key memory holds in candidates,
    so that the block's budget stays about right."""
    memory = n_ref * _BYTES_PER_KEY // (2 * per_candidate)
    return max(256, min(n_ref * dim // 32768, memory))


def _band_too_wide(
    torch: Any, keys: Any, tau: Any, sample: Any, band: Any, start: int, limit: int
) -> bool:
    """Whether widening the cut-offs ``tau`` by the filter's ``band`` would keep, per row on
    average, more than ``limit`` keys beyond them (counted on the column ``sample``, scaled to
    the whole row)."""
    part = keys if sample is None else keys[:, sample]
    wide = band(start, tau)
    extra = (part <= wide[:, None]).sum(dim=1) - (part <= tau[:, None]).sum(dim=1)
    return float(extra.double().mean()) * keys.shape[1] / part.shape[1] > limit


def _device(torch: Any, opts: TorchOptions) -> Any:
    return torch.device(opts.device)


def search(task: Any, options: Any) -> Generator[Any, None, dict[str, Any]]:
    """The torch backend's entry point (see :mod:`embedeval.search.dispatch`): the scored blocks of
    ``task`` computed with ``options.torch`` (:class:`TorchOptions`)."""
    return torch_blocks(task, options.torch)


def run_torch(
    task: Any, options: TorchOptions
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """:func:`torch_blocks` gathered: per-query values (NaN for lone queries) and tie flags;
    the same contract as :func:`embedeval.search.local.run_local`."""
    from ..engine.task import write_back

    values, ties = task.empty_outputs()
    write_back(values, ties, torch_blocks(task, options))
    return values, ties


def torch_blocks(task: Any, options: TorchOptions) -> Generator[Any, None, dict[str, Any]]:
    """Scored blocks (:class:`embedeval.engine.task.ScoredBlock`) of ``task``, searched on
    ``options.device``; returns the record of the search (``EvaluationResult.settings
    ["torch"]``): the device, the filter precision, the engine (``"whole rows"``, or on the CPU
    ``"local symmetric"`` or ``"local deep"``), where blocks were decided in float64, and how
    many blocks each product filtered (a coarse one falls back to float32 where its band is too
    wide)."""
    torch = import_torch()
    if not task.has_work:
        return {}
    device = _device(torch, options)
    if is_label_sets(task.query_codes):  # the device kernels compare one label per item
        yield from _label_set_blocks(task, options)
        return {"device": str(device), "precision": "float32", "engine": "local label sets"}
    depth, threshold = task.depth()
    need = np.minimum(depth, task.n_valid)
    label = None if threshold is None else (threshold, task.query_codes, task.reference_codes)
    # Custom metrics (Python callables over host arrays) and any metric without a port here
    # are scored on the host, from the same device ranking.
    host = options.kernels == "numpy" or not all(map(DeviceKernels.supports, task.metrics))
    bar = progress_bar(task.n_query, "queries", enabled=options.progress)
    chosen = _search_precision(torch, options.precision, device, task, need, label)
    task, chosen = _exact_keys(task, options, device, chosen)
    options = replace(options, precision=chosen)
    # TF32 products on when TF32 was chosen ("auto" on a GPU), not only when asked for
    with torch.no_grad(), _matmul_precision(torch, chosen == "tf32"), bar as bar:
        report = {"device": str(device), "precision": options.precision}
        if _local_symmetric(task, device):
            yield from _local_blocks(task, options, bar)
            return {**report, "engine": "local symmetric", "decision": "host"}
        if _local_deep(task, device):
            yield from _deep_blocks(task, options, bar)
            precision = filter_precision(task)  # the deep engine's own filter
            return {**report, "precision": precision, "engine": "local deep", "decision": "host"}
        engine = _engine_search(task, need, label, options, device)
        search = _prepare(torch, task, device, engine, options.precision)
        kernels = None if host else DeviceKernels(torch, task, device)
        reaches = _reaches(task, options.precision, device)
        on_device = _decides_on_device(options, device)
        blocks: dict[str, int] = {}
        for block in _candidate_blocks(torch, search, need, label, options, reaches):
            yield _scored(torch, task, search, block, kernels, on_device)
            blocks[block.precision] = blocks.get(block.precision, 0) + 1
            bar.update(block.lims.numel() - 1)
    decision = "device" if on_device else "host"
    return {**report, "engine": "whole rows", "decision": decision, "blocks": blocks}


def _scored(
    torch: Any,
    task: Any,
    search: _Search,
    block: _DeviceCandidates,
    kernels: DeviceKernels | None,
    on_device: bool,
) -> Any:
    """A block's scored values: decided in float64 on the device or on the host, scored by
    the device ``kernels`` (``None``: on the host)."""
    from ..engine.task import ScoredBlock

    rows = slice(block.start, block.start + block.lims.numel() - 1)
    exact = block.rounding == rounding_of("exact")  # exact keys: the filter order is the ranking
    if exact or on_device:
        if not exact:
            block = _device_decided(torch, search, task, block)
        if kernels is None:
            return ScoredBlock(rows, *task.score_decided(block.to_host()))
        return ScoredBlock(rows, *kernels.score(block))
    if kernels is None:
        return ScoredBlock(rows, *task.score_block(block.to_host(), block.rounding))
    # Near-ties the filter keys cannot order are decided on the host in float64.
    on_host = block.to_host()
    decided = decide_task_block(task, on_host, *block.rounding)
    if decided is not on_host:
        block = _DeviceCandidates.from_host(torch, decided, block.index.device)
    return ScoredBlock(rows, *kernels.score(block))


def _reaches(task: Any, precision: str, device: Any) -> dict[str, tuple[Any, tuple[float, float]]]:
    """Per product that may filter a block (``precision``, and float32 to fall back on), the
    :class:`embedeval.engine.decide.Reach` of its bound and its ``(scale, input_u)``."""
    norms, dim = task_norms(task), int(task.reference.shape[1])
    out = {}
    for p in dict.fromkeys((precision, "float32")):
        exact = p == "float32" and task.precision == "exact"  # IEEE float32: exact keys
        rounding = rounding_of("exact" if exact else p, device.type == "cuda")
        out[p] = (norms.reach(task.distance, dim, *rounding), rounding)
    return out


#: The deepest ranking ``precision="auto"`` filters with bfloat16 on the CPU.
_CPU_BF16_MAX_DEPTH = 16


def _search_precision(
    torch: Any, precision: str, device: Any, task: Any, need: np.ndarray, label: Any
) -> str:
    """The filter product of a search: :func:`resolve_precision`, except that on the CPU
    ``"auto"`` keeps bfloat16 only for a shallow one-sided search (no full-depth metric, depth
    at most :data:`_CPU_BF16_MAX_DEPTH`).  There the host decides every pair its band leaves
    ambiguous, and a bfloat16 band leaves many: measured on a 2-core AMD EPYC with
    AVX512-BF16 (``python -m benchmarks.bench_gpu --small``), leave-one-out took 1.3-5 times
    as long as in float32 (SOP-like 6,160: 0.42 s against 0.09 s; 5 x 800: 1.35 s against
    1.04 s; 50,000 in 500 classes: 21.9 s against 5.5 s) and full-depth MAP over 2,000 rows
    1.9 s against 0.3 s, while 3,000 SOP-like queries against 60,000 took 1.4 s against
    1.8 s."""
    chosen = resolve_precision(torch, precision, device)
    if precision != "auto" or device.type != "cpu" or chosen == "float32":
        return chosen
    shallow = label is None and int(np.max(need, initial=0)) <= _CPU_BF16_MAX_DEPTH
    return chosen if shallow and not _local_symmetric(task, device) else "float32"


def _decides_on_device(options: TorchOptions, device: Any) -> bool:
    """Whether blocks are decided in float64 on the device (GPUs) or on the host (the CPU, where
    the host's sparse decision re-scores fewer pairs)."""
    if options.device_decision is not None:
        return bool(options.device_decision)
    return device.type != "cpu"


def _device_decided(torch: Any, search: _Search, task: Any, block: Any) -> Any:
    """``block`` (filter order) in float64 order, decided on its device."""
    index, bits = decide_on_device(
        torch, block.lims, block.index, block.start, search.raw, (task.query, task.reference),
        task.distance,
    )  # fmt: skip
    return _DeviceCandidates(block.start, block.lims, index, bits)


def _local_symmetric(task: Any, device: Any) -> bool:
    """Whether a CPU search takes the local symmetric engine (with this search's product
    precision): on the CPU that engine (each leave-one-out product once, candidates kept by
    tile) is many times faster than this module's whole-row pipeline, and the values are the
    same."""
    from ..engine.symmetric import uses_symmetric_engine

    return device.type == "cpu" and uses_symmetric_engine(task)


def _local_deep(task: Any, device: Any) -> bool:
    """Whether a CPU search takes the local deep engine (full-depth AP / mINP over relevant
    references at most a fifth of the reference, :func:`~embedeval.engine.deep.deep_applies`):
    each row's keys sorted once and the relevant ones located, where this module's pipeline
    extracts and orders nearly every key of every row (1,000 hashing-shaped queries against
    50,000 rows, ``map`` + P@1: 53 s against 1.6-1.8 s), with the same values.  Its filter is its
    own (float64 keys, or exact ones on small integers) whatever ``precision`` asked."""
    return device.type == "cpu" and deep_applies(task)


def _label_set_blocks(task: Any, options: TorchOptions) -> Iterator[Any]:
    """The local engine's scored blocks of a multi-label ``task`` (packed label sets, which
    this module's kernels and label cut-offs do not read), on host copies of its rows: the
    same values as ``backend="local"``, whatever the device."""
    xq = to_host(task.query)
    xb = xq if task.reference is task.query else to_host(task.reference)
    yield from local_blocks(
        replace(task, query=xq, reference=xb),
        memory_budget=options.memory_budget,
        progress=options.progress,
    )


def _deep_blocks(task: Any, options: TorchOptions, bar: Any) -> Iterator[Any]:
    """The local deep engine's scored blocks of ``task``."""
    for block in deep_blocks(task, memory_budget=options.memory_budget, progress=False):
        yield block
        bar.update(block.rows.stop - block.rows.start)


def _local_blocks(task: Any, options: TorchOptions, bar: Any) -> Iterator[Any]:
    """The local symmetric engine's scored blocks of ``task`` with ``options.precision``
    products (float32 or bfloat16; TF32 exists only on GPUs)."""
    from ..engine.symmetric import symmetric_blocks

    low = replace(task, precision="bf16" if options.precision == "bf16" else "float32")
    low = task if task.precision == "exact" else low
    for block in symmetric_blocks(low, memory_budget=options.memory_budget, progress=False):
        yield block
        rows = block.rows
        bar.update(rows.stop - rows.start if isinstance(rows, slice) else len(rows))


def _exact_keys(
    task: Any, options: TorchOptions, device: Any, chosen: str, same_distance: bool = False
) -> tuple[Any, str]:
    """``(task, product precision)``: small integers (binary codes) get exact keys, as in the
    local engine (:func:`~embedeval.search.local.with_exact_keys`), from IEEE float32 products
    (chosen, or ``"auto"`` on a CPU, where it is preferred to a bfloat16 band that would need
    float64 decisions).  ``same_distance``: keep the task's distance (neighbours report it, so
    cosine is not run as the inner product and keeps its band)."""
    auto_cpu = options.precision == "auto" and device.type == "cpu"
    if chosen != "float32" and not auto_cpu:
        return task, chosen
    if same_distance:
        exact = exact_in_float32(task.query, task.reference, task.distance)
        exact_task = replace(task, precision="exact") if exact else task
    else:
        exact_task = with_exact_keys(task)
    return (exact_task, "float32") if exact_task.precision == "exact" else (task, chosen)


def torch_neighbors(
    xq: Any, xb: Any, k: int, distance: str, exclude_self: bool, options: TorchOptions
) -> tuple[np.ndarray, np.ndarray]:
    """``(distances, indices)`` of the k nearest references, as :func:`embedeval.neighbors`
    (the distances in float64, rounded to float32 by the caller)."""
    from ..engine.exact import Exclusions
    from ..engine.task import RetrievalTask

    torch = import_torch()
    n_query = int(xq.shape[0])
    dist = np.empty((n_query, k), dtype=np.float64)  # rounded to float32 by the caller
    idx = np.empty((n_query, k), dtype=np.int64)
    if k == 0:
        return dist, idx
    device = _device(torch, options)
    zeros = np.zeros(n_query, dtype=np.int64)
    task = RetrievalTask(
        xq, xb, zeros, np.zeros(int(xb.shape[0]), dtype=np.int64), zeros, zeros,
        Exclusions(self_index=exclude_self), (), None, distance,
    )  # fmt: skip
    need = np.full(n_query, k, dtype=np.int64)
    chosen = _search_precision(torch, options.precision, device, task, need, None)
    task, chosen = _exact_keys(task, options, device, chosen, same_distance=True)
    options = replace(options, precision=chosen)
    with torch.no_grad(), _matmul_precision(torch, chosen == "tf32"):
        engine = _engine_search(task, need, None, options, device)
        search = _prepare(torch, task, device, engine, options.precision)
        reaches = _reaches(task, options.precision, device)
        for block in _candidate_blocks(torch, search, need, None, options, reaches):
            b = block.lims.numel() - 1
            rows = slice(block.start, block.start + b)
            if block.rounding == rounding_of("exact"):  # exact keys: the filter order
                decided = block.to_host()
            elif _decides_on_device(options, device):
                decided = _device_decided(torch, search, task, block).to_host()
            else:
                decided = decide_task_block(task, block.to_host(), *block.rounding)
            dist[rows], idx[rows] = first_k(task, decided, k)
    return dist, idx
