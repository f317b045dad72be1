"""Gathering accumulated arrays across the processes of a ``torch.distributed`` job.

Every rank sends its arrays to every other rank (``all_gather``), so every rank ends up with the
same union and computes the same result: no rank waits on a broadcast that a rank-0-only
computation would need.  Numeric arrays travel as tensors (padded to the longest rank); arrays of
strings or other Python objects go through ``all_gather_object``.  torch is never imported here:
the module is only used when the caller's process already has ``torch.distributed`` running.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .errors import InputError

__all__ = ["active_world", "all_gather_arrays"]


def active_world() -> Any | None:
    """``torch.distributed`` when it is initialised with more than one process, else ``None``.

    Looks only at an already imported torch, so a process that never imported torch pays
    nothing and is never treated as distributed.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist if dist.get_world_size() > 1 else None


def all_gather_arrays(dist: Any, arrays: dict[str, np.ndarray]) -> dict[str, list[np.ndarray]]:
    """Each key's array from every rank, in rank order.

    Keys read ``"group.field"``.  A rank may lack a whole group (it accumulated no rows of it,
    e.g. a rank that received no data): it contributes zero rows.  A rank that has a group must
    have the same fields as the others, with arrays that agree in dtype kind and trailing shape
    (signed and unsigned integers may mix: that key comes back as Python ints, exactly);
    a rank that differs is named in the error, which every rank raises alike (the layouts are
    exchanged first, so no rank is left waiting in a collective).
    """
    layout = {name: (a.shape, a.dtype.str) for name, a in arrays.items()}
    layouts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(layouts, layout)
    layouts = _fill_absent_groups(layouts)
    _check_layouts(layouts)
    out: dict[str, list[np.ndarray]] = {}
    for name in sorted(layouts[0]):
        a = arrays.get(name)
        if a is None:  # this rank holds no rows of the group: send an empty array
            a = np.empty(layouts[dist.get_rank()][name][0], dtype=layouts[0][name][1])
        kinds = {np.dtype(lay[name][1]).kind for lay in layouts}
        if kinds == {"i", "u"}:
            # No numeric dtype holds both exactly (int64 with uint64 would round through
            # float64): Python ints, as one process's Evaluator keeps such a mix.
            parts = [None] * dist.get_world_size()
            dist.all_gather_object(parts, a.astype(object))
            out[name] = list(parts)
        elif a.dtype.kind in "biuf":
            out[name] = _gather_numeric(dist, a, [lay[name] for lay in layouts])
        else:
            parts: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(parts, a)
            out[name] = list(parts)
    return out


def _fill_absent_groups(layouts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give every rank an empty entry for each group it lacks, shaped like another rank's."""
    owner: dict[str, tuple[int, list[str]]] = {}
    for rank, lay in enumerate(layouts):
        for group in {key.split(".", 1)[0] for key in lay}:
            keys = sorted(key for key in lay if key.split(".", 1)[0] == group)
            seen = owner.setdefault(group, (rank, keys))
            if seen[1] != keys:
                raise InputError(
                    f"rank {rank} accumulated {_fields(keys)} but rank {seen[0]} accumulated "
                    f"{_fields(seen[1])} ({group} rows); every rank must call update() with the "
                    "same arguments (indices / groups / confidences on all ranks or on none)."
                )
    filled = []
    for lay in layouts:
        lay = dict(lay)
        for rank, keys in owner.values():
            for key in keys:
                if key not in lay:
                    shape, dtype = layouts[rank][key]
                    lay[key] = ((0, *shape[1:]), dtype)
        filled.append(lay)
    return filled


def _check_layouts(layouts: list[dict[str, Any]]) -> None:
    first = layouts[0]
    for rank, lay in enumerate(layouts[1:], start=1):
        if set(lay) != set(first):
            raise InputError(
                f"rank {rank} accumulated {sorted(lay)} but rank 0 accumulated {sorted(first)}; "
                "every rank must call update() with the same arguments (the same split, and "
                "indices / groups / confidences on all ranks or on none)."
            )
        for name, (shape, dtype) in lay.items():
            shape0, dtype0 = first[name]
            if tuple(shape[1:]) != tuple(shape0[1:]) or _kind(dtype) != _kind(dtype0):
                group, field = name.split(".", 1)
                raise InputError(
                    f"{field} ({group} rows): rank {rank} has shape {tuple(shape)} / dtype "
                    f"{dtype} but rank 0 has {tuple(shape0)} / {dtype0}; every rank must "
                    "produce the same kind of embeddings and labels."
                )


def _kind(dtype: str) -> str:
    """The dtype's kind, signed and unsigned integers alike (gathered exactly as Python ints)."""
    kind = np.dtype(dtype).kind
    return "i" if kind == "u" else kind


def _fields(keys: list[str]) -> list[str]:
    """The field names of ``"group.field"`` keys."""
    return [key.split(".", 1)[1] for key in keys]


def _gather_numeric(dist: Any, a: np.ndarray, layouts: list[Any]) -> list[np.ndarray]:
    import torch

    dtype = np.result_type(*[np.dtype(d) for _, d in layouts])
    longest = max(shape[0] for shape, _ in layouts)
    device = _device(dist, torch)
    padded = np.zeros((longest, *a.shape[1:]), dtype=dtype)
    padded[: a.shape[0]] = a
    local = torch.from_numpy(_torch_compatible(padded)).to(device)
    parts = [torch.empty_like(local) for _ in layouts]
    dist.all_gather(parts, local)
    return [
        _restore(p.cpu().numpy(), dtype)[: shape[0]]
        for p, (shape, _) in zip(parts, layouts, strict=True)
    ]


def _device(dist: Any, torch: Any) -> Any:
    # NCCL moves only CUDA tensors; gloo and mpi take host tensors.
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _torch_compatible(a: np.ndarray) -> np.ndarray:
    # torch has no uint32/uint64 collectives: move the bits through a signed view of equal width.
    if a.dtype == np.uint64:
        return a.view(np.int64)
    if a.dtype == np.uint32:
        return a.view(np.int32)
    if a.dtype == np.uint16:
        return a.astype(np.int32)
    return a


def _restore(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if dtype in (np.uint64, np.uint32):
        return a.view(dtype)
    return a.astype(dtype, copy=False)
