"""Reading embedding files: ``.npy``, ``.npz``, ``.safetensors``, ``.parquet``.  Never unpickles.

* ``.npy`` — one 2-D array of embeddings, memory-mapped (not read whole).  Labels come from a
  separate file (``--labels``).
* ``.npz`` — keys ``embeddings`` and ``labels`` (required together unless labels come from a
  separate file), optional ``confidences``, ``sigmas``, ``groups``.
* ``.safetensors`` (``pip install "embedeval[safetensors]"``) — the same tensor names; labels
  must be numeric (the format stores tensors only).
* ``.parquet`` (``pip install "embedeval[parquet]"``) — one row per item: a list (or
  fixed-size list) column ``embedding`` (or ``embeddings``), and scalar columns ``label`` /
  ``labels``, ``confidence`` / ``confidences``, ``sigma`` / ``sigmas``, ``group`` / ``groups``.
* Label files may also be ``.txt`` / ``.csv`` with one label per line (integers when every line
  is one, strings otherwise).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ._errors import FileFormatError
from ._validation import as_embeddings, as_labels, as_vector

__all__ = ["EmbeddingFile", "load_array", "load_embeddings"]

EMBEDDING_SUFFIXES = (".npy", ".npz", ".safetensors", ".parquet")
_OPTIONAL = ("confidences", "sigmas", "groups")


@dataclass(frozen=True)
class EmbeddingFile:
    """The arrays of one embedding file (optional ones are ``None`` when absent)."""

    path: Path
    embeddings: np.ndarray
    labels: np.ndarray | None = None
    confidences: np.ndarray | None = None
    sigmas: np.ndarray | None = None
    groups: np.ndarray | None = None

    @property
    def name(self) -> str:
        return self.path.stem


def _exists(path: Path) -> None:
    if not path.exists():
        raise FileFormatError(f"{path}: no such file; check the path.")
    if path.is_dir():
        raise FileFormatError(f"{path} is a directory; pass an embedding file.")


def _check_header(path: Path) -> None:
    # np.load with allow_pickle=False calls every non-NumPy file "pickled data"; say what it is.
    with open(path, "rb") as fh:
        head = fh.read(6)
    is_npy, is_zip = head == b"\x93NUMPY", head.startswith(b"PK\x03\x04")
    want_zip = path.suffix.lower() == ".npz"
    if (want_zip and is_zip) or (not want_zip and is_npy):
        return
    if is_npy or is_zip:
        real, other = (".npy", ".npz") if is_npy else (".npz", ".npy")
        raise FileFormatError(f"{path} is a {real} file named {other}; rename it to end in {real}.")
    if head[:1] == b"\x80":
        raise FileFormatError(
            f"{path} is a Python pickle, not a NumPy file; embedeval never unpickles files, "
            "because unpickling can run arbitrary code. Save the array with np.save or np.savez."
        )
    kind = "a .npz (zip) archive" if want_zip else "a .npy file"
    raise FileFormatError(
        f"{path} is not {kind} (no NumPy header; empty, truncated or another format); "
        "save the array with np.save or np.savez."
    )


def _np_load(path: Path, mmap: bool) -> Any:
    _check_header(path)
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except ValueError as exc:
        text = str(exc).lower()
        if "pickle" in text or "python objects" in text:
            raise FileFormatError(
                f"{path} holds pickled Python objects (an object array); embedeval never "
                "unpickles files, because unpickling can run arbitrary code. Re-save it with a "
                "numeric or string dtype, e.g. np.save(path, np.asarray(x, dtype=np.float32))."
            ) from None
        raise FileFormatError(f"{path} is not a valid NumPy file: {exc}") from None
    except (OSError, EOFError) as exc:
        raise FileFormatError(f"{path} cannot be read as a NumPy file: {exc}") from None


def load_embeddings(path: str | os.PathLike, *, mmap: bool = True) -> EmbeddingFile:
    """Read an embedding file (see the module docstring for the formats).

    Embeddings are validated (2-D, numeric, finite: the error gives the count of bad rows and
    the first one) and every other array is checked to have one value per row.

    Examples
    --------
    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> np.savez(os.path.join(d, "e.npz"), embeddings=np.eye(3), labels=[0, 1, 1])
    >>> f = load_embeddings(os.path.join(d, "e.npz"))
    >>> f.embeddings.shape, f.labels.tolist()
    ((3, 3), [0, 1, 1])
    """
    path = Path(path)
    _exists(path)
    suffix = path.suffix.lower()
    if suffix == ".npy":
        arrays = {"embeddings": _np_load(path, mmap)}
    elif suffix == ".npz":
        with _np_load(path, False) as npz:
            keys = list(npz.files)
            if "embeddings" not in keys:
                raise FileFormatError(
                    f"{path} has no 'embeddings' array (it has: {', '.join(keys) or 'nothing'}); "
                    "save it with np.savez(path, embeddings=..., labels=...)."
                )
            try:
                arrays = {k: npz[k] for k in ("embeddings", "labels", *_OPTIONAL) if k in keys}
            except ValueError:
                raise FileFormatError(
                    f"{path} holds pickled Python objects; embedeval never unpickles files. "
                    "Re-save labels as integers or fixed-width strings (np.asarray(labels, "
                    "dtype=str))."
                ) from None
    elif suffix == ".safetensors":
        arrays = _load_safetensors(path)
    elif suffix == ".parquet":
        arrays = _load_parquet(path)
    else:
        raise FileFormatError(
            f"{path}: unknown file type {suffix or '(no suffix)'!r}; use one of "
            f"{', '.join(EMBEDDING_SUFFIXES)}."
        )
    return _validated(path, arrays)


def _validated(path: Path, arrays: dict[str, Any]) -> EmbeddingFile:
    emb = as_embeddings(arrays["embeddings"], f"{path} (embeddings)")
    n = emb.shape[0]
    out: dict[str, Any] = {"path": path, "embeddings": emb}
    if arrays.get("labels") is not None:
        out["labels"] = as_labels(
            arrays["labels"], f"{path} (labels)", length=n, length_of="embeddings"
        )
    for key in ("confidences", "sigmas"):
        if arrays.get(key) is not None:
            out[key] = as_vector(arrays[key], f"{path} ({key})", length=n, length_of="embeddings")
    if arrays.get("groups") is not None:
        out["groups"] = as_labels(
            arrays["groups"], f"{path} (groups)", length=n, length_of="embeddings"
        )
    return EmbeddingFile(**out)


def _load_safetensors(path: Path) -> dict[str, Any]:
    try:
        from safetensors.numpy import load_file
    except ImportError:
        raise FileFormatError(
            f"{path}: reading .safetensors needs the safetensors package: "
            'pip install "embedeval[safetensors]".'
        ) from None
    try:
        tensors = load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types
        raise FileFormatError(f"{path} is not a valid safetensors file: {exc}") from None
    if "embeddings" not in tensors:
        raise FileFormatError(
            f"{path} has no 'embeddings' tensor (it has: {', '.join(tensors) or 'nothing'})."
        )
    return {k: tensors[k] for k in ("embeddings", "labels", *_OPTIONAL) if k in tensors}


def _load_parquet(path: Path) -> dict[str, Any]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise FileFormatError(
            f'{path}: reading .parquet needs pyarrow: pip install "embedeval[parquet]".'
        ) from None
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several error types
        raise FileFormatError(f"{path} is not a valid Parquet file: {exc}") from None
    names = table.column_names

    def column(*candidates: str) -> Any:
        for c in candidates:
            if c in names:
                return table.column(c)
        return None

    emb = column("embedding", "embeddings")
    if emb is None:
        raise FileFormatError(
            f"{path} has no 'embedding' column (it has: {', '.join(names)}); store one list "
            "of floats per row."
        )
    flat = emb.combine_chunks()
    try:
        values = flat.flatten().to_numpy(zero_copy_only=False)
        embeddings = values.reshape(len(flat), -1)
    except Exception as exc:
        raise FileFormatError(
            f"{path}: the embedding column is not a list of numbers ({exc}); "
            "every row must hold a vector of the same length."
        ) from None
    out: dict[str, Any] = {"embeddings": embeddings}
    for key, cands in (
        ("labels", ("label", "labels")),
        ("confidences", ("confidence", "confidences")),
        ("sigmas", ("sigma", "sigmas")),
        ("groups", ("group", "groups")),
    ):
        col = column(*cands)
        if col is not None:
            out[key] = (
                np.asarray(col.to_pylist())
                if key in ("labels", "groups")
                else col.to_numpy(zero_copy_only=False)
            )
    return out


def load_array(path: str | os.PathLike, *, what: str = "labels") -> np.ndarray:
    """Read a 1-D array (labels, confidences, groups) from ``.npy``, ``.npz`` (its single array
    or the key named ``what``), or a text file with one value per line.

    Examples
    --------
    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "labels.txt")
    >>> _ = open(p, "w").write("7\\n7\\n9\\n")
    >>> load_array(p).tolist()
    [7, 7, 9]
    """
    path = Path(path)
    _exists(path)
    suffix = path.suffix.lower()
    if suffix == ".npy":
        arr = np.asarray(_np_load(path, False))
    elif suffix == ".npz":
        with _np_load(path, False) as npz:
            keys = list(npz.files)
            key = what if what in keys else (keys[0] if len(keys) == 1 else None)
            if key is None:
                raise FileFormatError(
                    f"{path} has several arrays ({', '.join(keys)}) and none named {what!r}; "
                    f"name it {what!r} (np.savez(path, {what}=...)) or save it alone."
                )
            arr = npz[key]
    elif suffix in (".txt", ".csv", ".tsv", ""):
        lines = [ln.strip() for ln in path.read_text().splitlines() if ln.strip()]
        try:
            arr = np.array([int(v) for v in lines], dtype=np.int64)
        except ValueError:
            try:
                arr = np.array([float(v) for v in lines])
            except ValueError:
                arr = np.array(lines)
    else:
        raise FileFormatError(
            f"{path}: unknown file type {suffix!r} for {what}; use .npy, .npz or .txt."
        )
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise FileFormatError(
            f"{path}: {what} must be 1-D (one value per item); got shape {arr.shape}."
        )
    return arr
