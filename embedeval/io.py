"""Reading embedding files: ``.npy``, ``.npz``, ``.safetensors``, ``.parquet``.  Never unpickles.

* ``.npy`` — one 2-D array of embeddings, memory-mapped (not read whole).  Labels come from a
  separate file (``--labels``).
* ``.npz`` — keys ``embeddings`` and ``labels`` (required together unless labels come from a
  separate file), optional ``confidences``, ``sigmas``, ``groups``.
* ``.safetensors`` (``pip install "embedeval-exact[safetensors]"``) — the same tensor names; labels
  must be numeric (the format stores tensors only).
* ``.parquet`` (``pip install "embedeval-exact[parquet]"``) — one row per item: a list (or
  fixed-size list) column ``embedding`` (or ``embeddings``), and scalar columns ``label`` /
  ``labels``, ``confidence`` / ``confidences``, ``sigma`` / ``sigmas``, ``group`` / ``groups``.
* Label files may also be ``.txt`` / ``.csv`` (UTF-8) with one label per line: integers when
  every line is a plain decimal integer (any size, kept exact), numbers when every line is a
  decimal, strings otherwise.
"""

from __future__ import annotations

import math
import os
import re
import tokenize
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .utils.errors import FileFormatError
from .utils.files import install_hint, not_a_file, read_lines
from .utils.validation import (
    as_embeddings,
    as_label_indicator,
    as_labels,
    as_vector,
    is_label_indicator,
)

__all__ = [
    "EmbeddingFile",
    "load_array",
    "load_embeddings",
    "load_retrieval_embeddings",
    "read_ids",
]

EMBEDDING_SUFFIXES = (".npy", ".npz", ".safetensors", ".parquet")
_TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar")
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
    if not path.is_file():
        raise FileFormatError(not_a_file(path))


def _is_torch_zip(path: Path) -> bool:
    # torch.save writes a zip whose members sit in one folder beside a pickle, "<name>/data.pkl"
    # (read from the zip's directory only: nothing is unpickled).
    try:
        with zipfile.ZipFile(path) as zf:
            return any(n.endswith("/data.pkl") or n == "data.pkl" for n in zf.namelist())
    except (zipfile.BadZipFile, OSError, ValueError):
        return False


def _torch_error(path: Path) -> FileFormatError:
    out = path.stem + ("_numpy.npy" if path.suffix.lower() == ".npy" else ".npy")
    return FileFormatError(
        f"{path} is a PyTorch file (torch.save); embedeval never unpickles files, because "
        'unpickling can run arbitrary code. Convert it once with: python -c "import numpy, '
        f"torch; numpy.save('{out}', torch.load('{path}').float().numpy())\" and pass {out} "
        "(labels the same way, to a separate .npy, or np.savez both into one .npz)."
    )


#: How torch.save's legacy (pre-1.6, non-zip) format begins: a protocol-2 pickle of torch's
#: magic number 0x1950a86a20f9469cfc6c as a 10-byte LONG1, recognised from the bytes alone.
_TORCH_LEGACY_HEAD = b"\x80\x02\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little")


def _refuse_torch(path: Path) -> None:
    with open(path, "rb") as fh:
        head = fh.read(len(_TORCH_LEGACY_HEAD))
    if (
        (head.startswith(b"PK\x03\x04") and _is_torch_zip(path))
        or head == _TORCH_LEGACY_HEAD
        or (head[:1] == b"\x80" and path.suffix.lower() in _TORCH_SUFFIXES)
    ):
        raise _torch_error(path)


def _check_header(path: Path) -> None:
    # np.load with allow_pickle=False calls every non-NumPy file "pickled data"; say what it is.
    with open(path, "rb") as fh:
        head = fh.read(6)
    is_npy, is_zip = head == b"\x93NUMPY", head.startswith(b"PK\x03\x04")
    _refuse_torch(path)
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


#: What a damaged file raises while it is read: truncation, a bad CRC, a corrupt deflate
#: stream, a header that does not parse (numpy tokenizes it: a cut header is a TokenError), a
#: zip member flagged as encrypted (RuntimeError) or stored with an unknown compression method
#: (NotImplementedError, a RuntimeError).
_DAMAGED = (
    zipfile.BadZipFile,
    zlib.error,
    EOFError,
    OSError,
    ValueError,
    MemoryError,
    RuntimeError,
    SyntaxError,
    tokenize.TokenError,
)


def _check_npy_size(fh: Any, size: int, where: str) -> None:
    """Refuse a .npy stream whose header claims more bytes than it holds, before allocating."""
    fmt = np.lib.format
    version = fmt.read_magic(fh)
    if version not in ((1, 0), (2, 0), (3, 0)):
        return  # np.load refuses an unknown version by itself
    # Version 3 is version 2 with a UTF-8 header (non-Latin-1 field names); read as Latin-1,
    # those names change, never the shape, the item size or whether it holds objects.
    read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
    shape, _, dtype = read(fh)
    if dtype.hasobject:
        raise FileFormatError(
            f"{where} holds pickled Python objects (an object array); embedeval never "
            "unpickles files, because unpickling can run arbitrary code. Re-save it with a "
            "numeric or string dtype, e.g. np.save(path, np.asarray(x, dtype=np.float32))."
        )
    need = math.prod(shape) * dtype.itemsize
    if need > size - fh.tell():
        raise FileFormatError(
            f"{where} is truncated or damaged: its header says shape {shape} of {dtype} "
            f"({need} bytes) but the file holds {max(size - fh.tell(), 0)}; write it again "
            "with np.save / np.savez."
        )


def _damaged(path: Path, exc: BaseException) -> FileFormatError:
    detail = " ".join(str(exc).split()) or type(exc).__name__
    return FileFormatError(
        f"{path} cannot be read: the file is truncated or damaged ({detail}); write it again "
        "with np.save / np.savez."
    )


def _np_load(path: Path, mmap: bool) -> Any:
    _check_header(path)
    if path.suffix.lower() == ".npz":
        raise AssertionError("use _read_npz for .npz files")  # pragma: no cover
    try:
        with open(path, "rb") as fh:
            _check_npy_size(fh, os.fstat(fh.fileno()).st_size, str(path))
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except FileFormatError:
        raise
    except _DAMAGED as exc:
        raise _damaged(path, exc) from None


def _read_npz(path: Path, choose: Any) -> dict[str, np.ndarray]:
    """The members of an .npz that ``choose(keys)`` names, each checked against its stored
    size before it is allocated; any damage is one FileFormatError."""
    _check_header(path)
    try:
        with zipfile.ZipFile(path) as zf:
            members = [i.filename.removesuffix(".npy") for i in zf.infolist()]
            infos = dict(zip(members, zf.infolist(), strict=True))
            out = {}
            for key in choose(list(infos)):
                _refuse_duplicate(path, key, members)
                with zf.open(infos[key]) as fh:
                    _check_npy_size(fh, infos[key].file_size, f"{path} (array {key!r})")
                with zf.open(infos[key]) as fh:
                    out[key] = np.lib.format.read_array(fh, allow_pickle=False)
            return out
    except FileFormatError:
        raise
    except _DAMAGED as exc:
        raise _damaged(path, exc) from None


def _refuse_duplicate(path: Path, key: str, members: list[str]) -> None:
    """A zip may hold two members of one name (or ``x`` beside ``x.npy``); np.savez never
    writes them, and reading one of them silently (the last, as NumPy does) could take the
    labels of another run."""
    if members.count(key) > 1:
        raise FileFormatError(
            f"{path} holds {members.count(key)} arrays named {key!r}; an .npz written by "
            "np.savez has one of each name: write it again with np.savez."
        )


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

        def choose(keys: list[str]) -> list[str]:
            if "embeddings" not in keys:
                raise FileFormatError(
                    f"{path} has no 'embeddings' array (it has: {', '.join(keys) or 'nothing'}); "
                    "save it with np.savez(path, embeddings=..., labels=...)."
                )
            return [k for k in ("embeddings", "labels", *_OPTIONAL) if k in keys]

        arrays = _read_npz(path, choose)
    elif suffix == ".safetensors":
        _refuse_torch(path)  # torch.save under this name gets its conversion, not a parse error
        arrays = _load_safetensors(path)
    elif suffix == ".parquet":
        _refuse_torch(path)
        arrays = _load_parquet(path)
    else:
        _refuse_torch(path)  # a PyTorch file (.pt, .pth, ...) gets its conversion
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
        out["labels"] = _labels_or_indicators(arrays["labels"], f"{path} (labels)", n)
    for key in ("confidences", "sigmas"):
        if arrays.get(key) is not None:
            out[key] = as_vector(arrays[key], f"{path} ({key})", length=n, length_of="embeddings")
    if arrays.get("groups") is not None:
        out["groups"] = as_labels(
            arrays["groups"], f"{path} (groups)", length=n, length_of="embeddings", groups=True
        )
    return EmbeddingFile(**out)


def _labels_or_indicators(arr: Any, name: str, n: int) -> np.ndarray:
    """Labels, one per row, or a 2-D 0/1 indicator matrix of several columns (multi-label),
    with one row per embedding."""
    arr = np.asarray(arr)
    if is_label_indicator(arr) and _zeros_and_ones(arr):
        return as_label_indicator(arr, name, length=n, length_of="embeddings")
    return as_labels(arr, name, length=n, length_of="embeddings")


def _load_safetensors(path: Path) -> dict[str, Any]:
    try:
        from safetensors.numpy import load_file
    except ImportError:
        raise FileFormatError(
            f"{path}: reading .safetensors needs the safetensors package: "
            f"{install_hint('safetensors')}."
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
            f"{path}: reading .parquet needs pyarrow: {install_hint('parquet')}."
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
    out: dict[str, Any] = {"embeddings": _parquet_vectors(path, emb)}
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


def _parquet_vectors(path: Path, column: Any) -> np.ndarray:
    """The list column ``embedding`` as a (rows, dim) array; rows of different lengths are
    refused by their lengths, because a flat reshape would silently move values between rows
    whenever the lengths happen to add up to a multiple of the row count."""
    import pyarrow.compute as pc

    flat = column.combine_chunks()
    try:
        lengths = pc.list_value_length(flat).to_numpy(zero_copy_only=False)
        values = flat.flatten().to_numpy(zero_copy_only=False)
    except Exception as exc:  # pyarrow raises several error types
        raise FileFormatError(
            f"{path}: the embedding column is not a list of numbers ({exc}); "
            "every row must hold a vector of the same length."
        ) from None
    if len(lengths) == 0:
        return values.reshape(0, 0)  # refused as empty by the embedding checks
    # A null row has a NaN length, unequal to everything: it is found as row 0 or as a bad row.
    bad = np.flatnonzero(lengths != lengths[0])
    row = 0 if np.isnan(lengths[0]) else (int(bad[0]) if len(bad) else None)
    if row is not None:
        held = "is empty (null)" if np.isnan(lengths[row]) else f"holds {int(lengths[row])} values"
        first = "" if row == 0 else f" but row 0 holds {int(lengths[0])}"
        raise FileFormatError(
            f"{path}: row {row} of the embedding column {held}{first}; every row must hold a "
            "vector of the same length (write the embeddings again, one full vector per row)."
        )
    return values.reshape(len(lengths), int(lengths[0]))


def load_array(
    path: str | os.PathLike, *, what: str = "labels", indicators: bool = False
) -> np.ndarray:
    """Read a 1-D array (labels, confidences, groups) from ``.npy``, ``.npz`` (its single array
    or the key named ``what``), or a text file with one value per line; with ``indicators``,
    a 2-D array of several columns (multi-label 0/1 indicators) is returned as it is.

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

        def choose(keys: list[str]) -> list[str]:
            key = what if what in keys else (keys[0] if len(keys) == 1 else None)
            if key is None:
                raise FileFormatError(
                    f"{path} has several arrays ({', '.join(keys)}) and none named {what!r}; "
                    f"name it {what!r} (np.savez(path, {what}=...)) or save it alone."
                )
            return [key]

        (arr,) = _read_npz(path, choose).values()
    elif suffix in (".txt", ".csv", ".tsv", ""):
        _refuse_torch(path)  # a PyTorch file under a text name gets its conversion too
        arr = _read_text_column(path, what)
    else:
        _refuse_torch(path)
        raise FileFormatError(
            f"{path}: unknown file type {suffix!r} for {what}; use .npy, .npz or .txt."
        )
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim == 2 and arr.shape[1] > 1 and indicators and _zeros_and_ones(arr):
        return arr
    if arr.ndim == 2 and arr.shape[1] > 1:
        several = " or, for several labels per item, 0/1 indicators" if indicators else ""
        raise FileFormatError(
            f"{path}: {what} must be one column (one value per item){several}; got "
            f"{arr.shape[1]} columns (shape {arr.shape}). Save only the {what} column, e.g. "
            "np.save(path, table[:, 1])."
        )
    if arr.ndim != 1:
        raise FileFormatError(
            f"{path}: {what} must be 1-D (one value per item); got shape {arr.shape}."
        )
    return arr


def _zeros_and_ones(arr: np.ndarray) -> bool:
    """Whether a numeric or boolean array holds only 0 and 1 (a multi-label indicator)."""
    if arr.dtype.kind not in "biuf":
        return False
    return bool(((arr == 0) | (arr == 1)).all())


#: The spellings read as numbers: plain decimal integers, optionally signed ("007", "-3"), and
#: decimals with a point ("2.0"). Python's int() and float() also take "1_0", "٣" or "1e3",
#: which no one writes as a class id: such lines keep the file as text, so they are never
#: merged with a class spelled "10", "3" or "1000".
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.[0-9]*|\.[0-9]+)")
#: Confidences are measurements, not ids: exponents and NaN / inf (refused later, with their
#: row) are numbers there too.
_MEASUREMENT = re.compile(
    r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|nan|inf|infinity)", re.IGNORECASE
)


def _number(text: str, what: str) -> int | float | None:
    """``text`` as an int, a float or None (not a number), by the spellings above."""
    if _INTEGER.fullmatch(text):
        return int(text)
    pattern = _MEASUREMENT if what == "confidences" else _DECIMAL
    return float(text) if pattern.fullmatch(text) else None


#: First lines that name a column rather than hold a value.
_HEADER_WORDS = frozenset(
    "label labels class classes class_id classid category target y id name group groups "
    "group_id confidence confidences sigma sigmas".split()
)


def _text_lines(path: Path, what: str) -> list[str]:
    """The lines of a UTF-8 text file, stripped, blank lines at its end dropped; a byte-order
    mark (files saved as "UTF-8 with BOM") is not part of the first value.  A blank line
    before the last value is an error naming it: it would shift every later value onto the
    wrong row, or stand for a value that is missing (as the id files refuse it too)."""
    try:
        lines = [ln.strip() for ln in read_lines(path)]
    except UnicodeDecodeError:
        raise FileFormatError(
            f"{path} is not a UTF-8 text file; {what} files are .npy, .npz or UTF-8 text with "
            "one value per line."
        ) from None
    while lines and not lines[-1]:
        lines.pop()
    if "" in lines:
        raise FileFormatError(
            f"{path} line {lines.index('') + 1} is empty; a {what} file holds one value per "
            "line, one line per embedding row: remove the line or give its value."
        )
    if not lines:
        raise FileFormatError(
            f"{path} is empty; a {what} file holds one value per line, one line per embedding row."
        )
    return lines


def _read_text_column(path: Path, what: str) -> np.ndarray:
    """One value per line; a second column or a header line is refused, because either would
    silently make every row its own class."""
    lines = _text_lines(path, what)
    for i, line in enumerate(lines):
        if "," in line or "\t" in line or ";" in line:
            raise FileFormatError(
                f"{path} line {i + 1} has several columns ({line[:40]!r}); a {what} file holds "
                f"one value per line and nothing else: keep only the {what} column."
            )
    fields = [ln.split() for ln in lines]
    numeric = all(_number(v, what) is not None for f in fields for v in f)
    if all(len(f) > 1 for f in fields) and numeric:
        raise FileFormatError(
            f"{path} line 1 has {len(fields[0])} space-separated numbers ({lines[0][:40]!r}); a "
            f"{what} file holds one value per line and nothing else: keep only the {what} column."
        )
    values = [_number(v, what) for v in lines]
    header_word = lines[0].lower() in _HEADER_WORDS and lines.count(lines[0]) == 1
    numeric_below = all(v is not None for v in values[1:])
    if len(lines) > 1 and values[0] is None and (numeric_below or header_word):
        raise FileFormatError(
            f"{path} line 1 ({lines[0][:40]!r}) looks like a header above the {what}; "
            "remove it, the file must hold one value per line and nothing else."
        )
    if all(isinstance(v, int) for v in values):
        return _integers(values)
    if all(v is not None for v in values):
        return np.array(values, dtype=np.float64)
    return np.array(lines)


def _integers(values: list[int]) -> np.ndarray:
    """int64 when every value fits, else the exact Python integers (an object array): labels
    of any size are compared exactly, never through float64."""
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return np.array(values, dtype=object)


def _npz_ids(ids: np.ndarray, path: Path) -> list[str]:
    """The ids of an ``.npz`` as str: a bytes array (dtype ``S``) decoded as UTF-8, since
    ``str(b"d1")`` is ``"b'd1'"``, which no qrels id matches; numbers through ``str``."""
    if ids.dtype.kind == "S":
        try:
            text = [v.decode("utf-8") for v in ids.tolist()]
        except UnicodeDecodeError as exc:
            raise FileFormatError(
                f"{path}: its ids array holds bytes that are not UTF-8 ({exc}); save the ids "
                "as str."
            ) from None
    else:
        text = [str(v) for v in ids.tolist()]
    _refuse_repeated_id(text, path)
    return text


def _refuse_repeated_id(ids: list[str], path: Path) -> None:
    """Ids are unique, as :func:`read_ids` requires of an ids file: a repeated one is named
    with the file and both rows (the library would name only its keyword argument)."""
    seen: dict[str, int] = {}
    for row, value in enumerate(ids):
        if value in seen:
            raise FileFormatError(
                f"{path}: its ids array holds {value!r} at rows {seen[value]} and {row}; ids "
                "must be unique, one per embedding row: remove or rename one."
            )
        seen[value] = row


def load_retrieval_embeddings(path: str | os.PathLike) -> tuple[np.ndarray, list[str] | None]:
    """Embeddings for :func:`embedeval.evaluate_qrels`, and their ids when the file holds them.

    ``.npy``: memory-mapped as stored (float16 stays float16: the corpus is streamed, one
    block converted at a time); ``.npz``: the ``embeddings`` array and, when present, an
    ``ids`` array (one id per row); ``.safetensors`` / ``.parquet``: the embeddings as
    :func:`load_embeddings` reads them.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "c.npz")
    >>> np.savez(p, embeddings=np.eye(2, dtype=np.float32), ids=np.array(["a", "b"]))
    >>> x, ids = load_retrieval_embeddings(p)
    >>> x.shape, ids
    ((2, 2), ['a', 'b'])
    """
    path = Path(path)
    _exists(path)
    suffix = path.suffix.lower()
    ids = None
    if suffix == ".npy":
        arr = _np_load(path, True)
    elif suffix == ".npz":

        def choose(keys: list[str]) -> list[str]:
            if "embeddings" not in keys:
                raise FileFormatError(
                    f"{path} has no 'embeddings' array (it has: {', '.join(keys) or 'nothing'}); "
                    "save it with np.savez(path, embeddings=..., ids=...)."
                )
            return [k for k in ("embeddings", "ids") if k in keys]

        arrays = _read_npz(path, choose)
        arr = arrays["embeddings"]
        if "ids" in arrays:
            ids = _npz_ids(np.asarray(arrays["ids"]).ravel(), path)
    else:
        arr = load_embeddings(path).embeddings
    if arr.ndim != 2 or arr.dtype.kind not in "fiu" or 0 in arr.shape:
        raise FileFormatError(
            f"{path}: embeddings must be a non-empty 2-D numeric array (rows, dim); got shape "
            f"{arr.shape} of dtype {arr.dtype}."
        )
    return arr, ids


def read_ids(path: str | os.PathLike, what: str = "ids") -> list[str]:
    """One id per line of a text file (surrounding whitespace removed), unique; the error names
    the file and the line.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "ids.txt")
    >>> _ = open(p, "w").write("doc1\\n007\\n")
    >>> read_ids(p)
    ['doc1', '007']
    """
    path = Path(path)
    _exists(path)
    try:
        lines = read_lines(path)  # a byte-order mark (Windows editors write one) is no id
    except UnicodeDecodeError:
        raise FileFormatError(
            f"{path} is not a UTF-8 text file; {what} files hold one id per line."
        ) from None
    while lines and not lines[-1].strip():
        lines.pop()
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, 1):
        value = line.strip()
        if not value:
            raise FileFormatError(
                f"{path} line {number} is empty; {what} files hold one id per line, remove it."
            )
        if value in seen:
            raise FileFormatError(
                f"{path} line {number}: id {value!r} already on line {seen[value]}; ids must be "
                "unique, remove or rename one."
            )
        seen[value] = number
    return list(seen)
