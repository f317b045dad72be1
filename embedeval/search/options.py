"""How to search: the validated search options of one evaluation.

:func:`embedeval.evaluate` separates *what* to compute (a
:class:`embedeval.engine.task.RetrievalTask`:
embeddings, label codes, exclusions, metrics, depth) from *how* to search for it (a
:class:`SearchOptions`: backend, approximate index, shards, Dask client, block size, memory,
threads, progress, torch device).  :meth:`SearchOptions.make` checks every option once, on every
path, before any work, so an option that the chosen path would ignore is refused rather than
silently dropped; :attr:`SearchOptions.engine` names the backend module that will run the search
(:mod:`embedeval.search.dispatch`).
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine.arrays import import_torch, is_device_tensor
from ..engine.exact import DEFAULT_MEMORY_BUDGET
from ..utils.errors import InputError, InputTypeError
from ..utils.validation import check_bool, check_choice, check_int

__all__ = [
    "BACKENDS",
    "PRECISIONS",
    "SearchOptions",
    "TorchOptions",
    "check_index_param",
    "check_shards",
]

#: The values of ``backend=``.
BACKENDS = ("local", "dask", "torch")


@dataclass(frozen=True)
class SearchOptions:
    """Validated search settings (see :func:`embedeval.evaluate` for each option's meaning).

    ``torch`` holds the torch backend's own options when ``backend == "torch"``.
    """

    backend: str = "local"
    index: str | None = None
    index_params: Mapping[str, Any] | None = None
    exact_sample: int = 10_000
    shards: Any = None
    client: Any = None
    block_size: int | None = None
    memory_budget: int = DEFAULT_MEMORY_BUDGET
    n_threads: int | None = None
    progress: bool | None = None
    seed: int = 0
    torch: Any = None

    @classmethod
    def make(
        cls,
        *,
        like: Any = None,
        backend: str = "local",
        index: str | None = None,
        index_params: Mapping[str, Any] | None = None,
        exact_sample: int | None = None,
        shards: Any = None,
        client: Any = None,
        block_size: int | None = None,
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        n_threads: int | None = None,
        progress: bool | None = None,
        seed: int = 0,
        device: str | None = None,
        device_memory: float | None = None,
        tf32: bool = False,
        precision: str = "auto",
    ) -> SearchOptions:
        """Check every search option, whichever path it belongs to; ``like`` is the query
        input (GPU tensors select the torch backend by themselves)."""
        backend = _resolve_backend(backend, like, index, shards)
        block_size = check_int(block_size, "block_size", allow_none=True)
        memory_budget = check_int(memory_budget, "memory_budget", minimum=1 << 20)
        n_threads = check_int(n_threads, "n_threads", allow_none=True)
        if progress is not None:
            check_bool(progress, "progress")
        torch_options = _torch_options(
            backend, like, device, device_memory, (tf32, precision), block_size, progress,
            memory_budget,
        )  # fmt: skip
        if torch_options is not None and (
            index is not None or shards is not None or client is not None
        ):
            raise InputError(
                "backend='torch' is an exact search on one device; index=, shards= and client= "
                "belong to other backends. Drop them."
            )
        exact_sample = _check_index_options(index, index_params, exact_sample)
        _check_combination(backend, index, shards, client)
        if backend == "dask" and n_threads is not None:
            raise InputError(
                f"n_threads={n_threads} sets the threads of a search in this process; with "
                "backend='dask' the cluster's workers run it on the threads they were started "
                "with (dask worker --nthreads). Drop n_threads."
            )
        shards = check_shards(shards)
        return cls(
            backend=backend,
            index=index,
            index_params=index_params,
            exact_sample=10_000 if exact_sample is None else exact_sample,
            shards=shards,
            client=client,
            block_size=block_size,
            memory_budget=memory_budget,
            n_threads=n_threads,
            progress=progress,
            seed=check_int(seed, "seed", minimum=0),
            torch=torch_options,
        )

    @property
    def engine(self) -> str:
        """The backend that runs the search: ``"torch"``, ``"approximate"`` (``index=``),
        ``"sharded"`` (``shards=``), ``"dask"`` or ``"local"``."""
        if self.torch is not None:
            return "torch"
        if self.index is not None:
            return "approximate"
        if self.shards is not None:
            return "sharded"
        return "dask" if self.backend == "dask" else "local"


def _resolve_backend(backend: Any, like: Any, index: Any, shards: Any) -> str:
    backend = check_choice(backend, "backend", BACKENDS)
    if backend == "local" and index is None and shards is None and like is not None:
        if is_device_tensor(like):
            return "torch"  # GPU tensors are evaluated on their GPU
    return backend


def _torch_options(
    backend: str,
    like: Any,
    device: Any,
    device_memory: Any,
    products: tuple[Any, Any],
    block_size: int | None,
    progress: bool | None,
    memory_budget: int,
) -> Any:
    tf32, precision = products
    if backend != "torch":
        if device is not None or device_memory is not None or tf32 is not False:
            raise InputError(
                "device=, device_memory= and tf32= are options of backend='torch'; pass "
                "backend='torch' or drop them."
            )
        if precision != "auto":
            raise InputError(
                f"precision={precision!r} chooses the torch backend's product; pass "
                "backend='torch' or drop it (the other backends multiply in float32)."
            )
        return None
    return TorchOptions.make(
        device,
        device_memory,
        tf32,
        block_size,
        like=like,
        progress=progress,
        memory_budget=memory_budget,
        precision=precision,
    )


def _check_index_options(index: Any, index_params: Any, exact_sample: Any) -> int | None:
    """Options of approximate search without ``index=`` are refused, not silently ignored."""
    if index is None:
        for name, value in (("index_params", index_params), ("exact_sample", exact_sample)):
            if value is not None:
                raise InputError(
                    f"{name} was given without index; it only applies to approximate search, "
                    "e.g. index='IVF1024,Flat', index_params={'nprobe': 32}, exact_sample=2000. "
                    f"Drop {name} for exact search."
                )
        return None
    if index_params is not None and not isinstance(index_params, Mapping):
        raise InputTypeError(
            f"index_params must be a dict of faiss search parameters such as {{'nprobe': 32}}; "
            f"got {type(index_params).__name__}."
        )
    for name, value in (index_params or {}).items():  # before any training, not after it
        if isinstance(name, str):
            check_index_param(name, value)
    return check_int(exact_sample, "exact_sample", minimum=0, allow_none=True)


#: Search parameters that count something (inverted lists probed, graph candidates kept).
#: faiss reads every value as a double and casts it: 0 makes the search itself fail, a
#: fraction is truncated and a value past 2**31 - 1 wraps to a negative int.
_COUNT_PARAMS = ("nprobe", "efSearch")


def check_index_param(name: str, value: Any) -> Any:
    """``index_params[name]`` checked before faiss casts it (see :data:`_COUNT_PARAMS`): checked
    when the options are read, before an index is trained, and again where it is set.

    >>> check_index_param("nprobe", 32), check_index_param("quantizer_efSearch", 64)
    (32, 64)
    """
    label = f"index_params[{name!r}]"
    if name.removeprefix("quantizer_") in _COUNT_PARAMS:
        return check_int(value, label, minimum=1, maximum=2**31 - 1)
    if isinstance(value, (bool, np.bool_)) or (
        isinstance(value, numbers.Real) and not math.isfinite(value)
    ):
        raise InputError(f"{label} must be a finite number; got {value!r}.")
    return value


def _check_combination(backend: str, index: Any, shards: Any, client: Any) -> None:
    if client is not None and backend != "dask":
        raise InputError(
            f"client= is only used with backend='dask' (the backend here is {backend!r}, which "
            "would ignore it); pass backend='dask' to search on the cluster, or drop client."
        )
    if index is not None and (shards is not None or backend != "local"):
        raise InputError(
            "index= (approximate search) cannot be combined with shards= or backend='dask'; "
            "faiss already searches its index in parallel. Drop shards/backend."
        )
    if backend == "dask" and shards is not None:
        raise InputError(
            "backend='dask' scatters the whole reference to every worker; shards= is for the "
            "local backend. Drop one of them."
        )


def check_shards(shards: Any) -> Any:
    """``shards``: ``None``, an int >= 1, or a non-empty list of arrays / ``.npy`` paths (the
    pieces themselves are checked against the reference where they are read)."""
    if shards is None:
        return None
    if isinstance(shards, (list, tuple)):
        if not shards:
            raise InputError("shards is an empty list; pass an int or at least one array/path.")
        return shards
    # one path or one array is a list of one piece the caller forgot to wrap: an int check
    # would call it "not an integer" and never say that pieces go in a list
    if isinstance(shards, (str, os.PathLike)) or (isinstance(shards, np.ndarray) and shards.ndim):
        piece = "array" if isinstance(shards, np.ndarray) else repr(os.fspath(shards))
        raise InputError(
            "shards must be an int (the number of pieces) or a list of arrays / .npy paths; "
            f"got one {type(shards).__name__}. Pass it in a list: shards=[{piece}]."
        )
    return check_int(shards, "shards")


#: The torch backend's filter products.  ``"float32"``; ``"tf32"`` (float32 inputs rounded to
#: a 10-bit mantissa in the product: GPUs from Ampere on); ``"bf16"`` (inputs rounded to
#: bfloat16, products accumulated in float32: oneDNN's AVX512-BF16 / AMX kernels on CPUs that
#: have them, tensor cores on GPUs), each with its own error bound; ``"auto"``: ``"tf32"`` on a
#: GPU that has it, ``"bf16"`` on a CPU that multiplies bfloat16 natively (only for shallow
#: query / reference searches), else ``"float32"``.
PRECISIONS = ("auto", "float32", "tf32", "bf16")


@dataclass(frozen=True)
class TorchOptions:
    """How the torch backend runs.

    ``device``: a torch device string (``"cuda"``, ``"cuda:1"``, ``"cpu"``).  ``memory``: the
    working-memory budget in bytes, or a fraction of the device's free memory (``None``: half
    the free memory on a GPU, 512 MiB on the CPU).  ``tf32``: allow TF32 products (faster on
    Ampere and later, ~10-bit mantissa products: rankings of near neighbours may change).
    ``block_size``: queries per block (default: from the budget).  ``kernels``: ``"torch"``
    (on the device) or ``"numpy"`` (sorted candidates scored on the host).  ``progress``: a
    progress bar on stderr (``None``: only on a terminal).  ``engine_keys``: on the CPU, compute
    the keys with the local engine's product code in its block layout (``memory_budget`` is
    that engine's) when the product is float32.  ``precision``: the product that filters the
    candidates (see :data:`PRECISIONS`); every ranking is decided in float64 whatever it is, so
    it changes the speed, never a value.  ``device_decision``: decide each block's order in
    float64 on the device (:mod:`embedeval.engine.torch_decide`) rather than on the host
    (``None``: on GPUs); the same order either way.
    """

    device: str = "cpu"
    memory: float | int | None = None
    tf32: bool = False
    block_size: int | None = None
    kernels: str = "torch"
    progress: bool | None = False
    engine_keys: bool = True
    memory_budget: int = DEFAULT_MEMORY_BUDGET
    precision: str = "auto"
    device_decision: bool | None = None

    @classmethod
    def make(
        cls,
        device: Any,
        memory: Any = None,
        tf32: Any = False,
        block_size: int | None = None,
        like: Any = None,
        progress: bool | None = False,
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        precision: str = "auto",
    ) -> TorchOptions:
        """Validated options; ``device=None`` takes the device of tensor ``like`` (or cuda when
        available, else the CPU)."""
        torch = import_torch()
        if device is None:
            if is_device_tensor(like):
                device = str(like.device)
            else:
                device = "cuda" if torch.cuda.is_available() else "cpu"
        if not isinstance(device, (str, torch.device)):
            raise InputTypeError(
                f"device must be a string such as 'cuda', 'cuda:0' or 'cpu'; got {device!r}."
            )
        try:
            dev = torch.device(device)
        except (RuntimeError, ValueError) as exc:
            raise InputError(
                f"device={device!r} is not a torch device; use 'cuda', 'cuda:0' or 'cpu'."
            ) from exc
        if dev.type not in ("cpu", "cuda"):
            # other device types (mps, xpu, meta, ...) would fail deep inside the search,
            # e.g. where the float64 decision or the candidate extraction runs on them
            raise InputError(
                f"device={device!r}: the torch backend runs on 'cpu', 'cuda' or 'cuda:N', not "
                f"on {dev.type!r} devices. Pass device='cpu' (and tensors moved there with "
                "x.cpu()) or device='cuda'."
            )
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise InputError(
                f"device={device!r}, but PyTorch sees no CUDA GPU (torch.cuda.is_available() is "
                "False: a CPU-only torch build or no driver). Use device='cpu' or the default "
                "backend='local'."
            )
        if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InputError(
                f"device={device!r}, but only {torch.cuda.device_count()} CUDA device(s) exist."
            )
        if memory is not None:
            ok = isinstance(memory, numbers.Real) and not isinstance(memory, bool)
            if not ok or not (0 < memory <= 1 or (memory >= 1 << 20 and float(memory) % 1 == 0)):
                raise InputError(
                    f"device_memory must be a fraction of the free device memory in (0, 1] or a "
                    f"number of bytes >= 1 MiB; got {memory!r}."
                )
        if not isinstance(tf32, (bool, np.bool_)):
            raise InputTypeError(f"tf32 must be True or False; got {tf32!r}.")
        precision = check_choice(precision, "precision", PRECISIONS)
        if tf32 and precision not in ("auto", "tf32"):
            raise InputError(
                f"tf32=True asks for TF32 products but precision={precision!r}; drop one of them."
            )
        tf32 = bool(tf32) or precision == "tf32"  # either spelling turns TF32 products on
        return cls(
            str(dev), memory, tf32, block_size, progress=progress,
            memory_budget=memory_budget, precision="tf32" if tf32 else precision,
        )  # fmt: skip
