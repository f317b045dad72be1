"""Array helpers shared by every backend, on numpy arrays and torch tensors alike.

They recognise a tensor without importing torch, validate embeddings where they live (a GPU
tensor is never copied to the host to be checked), scale inputs whose keys would leave float32's
range by an exact power of two, and import torch with an error that says how to install it.
Both the CPU engine's callers and the torch backend use them, so they sit below both.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..utils.errors import InputError, InputTypeError
from ..utils.validation import as_embeddings, host_array
from .exact import column_stats, exact_centre, range_exponent

__all__ = [
    "as_search_input",
    "centre_for_distance",
    "check_lead_on_device",
    "import_torch",
    "is_device_tensor",
    "scale_for_range",
    "times_power_of_two",
    "to_host",
]


_INSTALL = 'pip install torch (or the package\'s extra: pip install "embedeval-exact[torch]")'


def import_torch() -> Any:
    """``torch``, or an :class:`InputError` saying how to install it."""
    try:
        import torch
    except ImportError as exc:
        raise InputError(
            f"backend='torch' needs PyTorch, which is not installed; {_INSTALL}. The default "
            "backend='local' runs without it."
        ) from exc
    return torch


def is_device_tensor(x: Any) -> bool:
    """True for a torch tensor on an accelerator (checked without importing torch)."""
    if not type(x).__module__.startswith("torch"):
        return False
    device = getattr(x, "device", None)
    return getattr(device, "type", "cpu") != "cpu"


def as_search_input(x: Any, name: str) -> Any:
    """A torch tensor stays a tensor on its device (checked: 2-D, floating point, finite; cast
    to float32 there, so bfloat16 works too); anything else goes through the CPU engine's
    validation."""
    if not (type(x).__module__.startswith("torch") and hasattr(x, "is_floating_point")):
        return as_embeddings(x, name)
    torch = import_torch()
    if not x.is_floating_point():
        raise InputTypeError(
            f"{name} is a {x.dtype} tensor; embeddings must be floating point ({name}.float())."
        )
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise InputError(
            f"{name} must be a non-empty 2-D tensor (n_items, dim); got {tuple(x.shape)}."
        )
    x = x.detach().to(torch.float32)
    finite = torch.isfinite(x).all(dim=1)
    if not bool(finite.all()):
        bad = torch.nonzero(~finite).flatten()
        raise InputError(
            f"{name} has NaN or infinite values in {bad.numel()} row(s), first at row "
            f"{int(bad[0])}; drop or repair those rows before evaluating."
        )
    return x


def scale_for_range(xq: Any, xb: Any, distance: str, same: bool) -> tuple[Any, Any, int]:
    """:func:`embedeval.engine.exact.range_exponent` for numpy arrays and device tensors alike, and
    the
    inputs times 2**scale (exact: a power of two)."""

    def proxy(x: Any) -> Any:  # a tensor's largest |x| is read on its device, not copied
        if isinstance(x, np.ndarray) or not hasattr(x, "abs"):
            return x
        return np.full((1, x.shape[1]), float(x.abs().max()) if x.numel() else 0.0)

    scale = range_exponent([proxy(xq)] if same else [proxy(xq), proxy(xb)], distance)
    if scale:
        xq = times_power_of_two(xq, scale)
        xb = xq if same else times_power_of_two(xb, scale)
    return xq, xb, scale


def centre_for_distance(xq: Any, xb: Any, distance: str, same: bool) -> tuple[Any, Any, Any]:
    """The inputs translated by the exact centre of :func:`embedeval.engine.exact.exact_centre`
    (Euclidean only: a translation changes cosines and inner products), and the centre
    (float32, or ``None`` when the inputs stay as they are).  Every value of the rows is
    translated exactly, so distances, ties and identical rows are those of the inputs; numpy
    arrays and device tensors alike (a tensor's column statistics are read on its device).

    >>> x = np.array([[1000.0, 1.0], [1000.5, -1.0]], np.float32)
    >>> xq, xb, c = centre_for_distance(x, x, "euclidean", same=True)
    >>> xq.tolist(), c.tolist(), xb is xq
    ([[-0.25, 1.0], [0.25, -1.0]], [1000.25, 0.0], True)
    """
    if distance != "euclidean":
        return xq, xb, None
    arrays = [xq] if same else [xq, xb]
    if all(isinstance(x, np.ndarray) or not hasattr(x, "amin") for x in arrays):
        centre = exact_centre(*column_stats(arrays))
    else:
        centre = exact_centre(*_tensor_stats(arrays))
    if centre is None:
        return xq, xb, None
    xq = _minus(xq, centre)
    return xq, xq if same else _minus(xb, centre), centre


def _tensor_stats(arrays: list[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`embedeval.engine.exact.column_stats` of arrays some of which are device tensors
    (a tensor's computed on its device, a host array's on the host)."""
    torch = import_torch()
    lows, highs, total, count = [], [], 0.0, 0
    for x in arrays:
        n = int(x.shape[0])
        if isinstance(x, np.ndarray) or not hasattr(x, "amin"):
            lo, hi, mean = column_stats([x])
            part = mean * n
        else:
            lo, hi = x.amin(dim=0).cpu().numpy(), x.amax(dim=0).cpu().numpy()
            part = x.to(torch.float64).sum(dim=0).cpu().numpy()
        lows.append(lo)
        highs.append(hi)
        total, count = total + part, count + n
    return np.min(lows, axis=0), np.max(highs, axis=0), total / max(count, 1)


def _minus(x: Any, centre: np.ndarray) -> Any:
    if isinstance(x, np.ndarray) or not hasattr(x, "device"):
        return np.subtract(x, centre, dtype=np.float32)
    return x - import_torch().as_tensor(centre, device=x.device)


def times_power_of_two(x: Any, scale: int) -> Any:
    if isinstance(x, np.ndarray):
        return np.ldexp(x, scale, dtype=np.float32)
    half = scale // 2  # two factors, each within float32's range
    return x * 2.0**half * 2.0 ** (scale - half)


def check_lead_on_device(xq: Any, xb: Any) -> None:
    """``ref_includes_query`` for device tensors: the queries are the first reference rows."""
    torch = import_torch()
    device = next((a.device for a in (xq, xb) if hasattr(a, "device")), "cpu")
    n = xq.shape[0]
    lead = torch.as_tensor(xb[:n], device=device) if xb.shape[0] >= n else None
    if lead is None or not bool((lead == torch.as_tensor(xq, device=device)).all()):
        raise InputError(
            "ref_includes_query=True needs the queries to be the first rows of reference (query "
            "i is reference i), but they are not. Pass reference=None for leave-one-out, or "
            "ref_includes_query=False for a disjoint gallery."
        )


def to_host(x: Any) -> np.ndarray:
    """A device tensor copied to a float32 numpy array (for NMI/AMI, which run on the CPU)."""
    return np.asarray(host_array(x), dtype=np.float32)
