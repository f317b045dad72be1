"""Labels in a result's JSON, written so that they read back as the labels they were.

JSON holds numbers, strings, booleans, null and lists; labels may also be bytes (what h5py
returns for string datasets), tuples, dates (``datetime64`` arrays) or integers beyond float64's
53 bits (``uint64`` hashes).  Each label that JSON lacks becomes a one-key object naming its
kind (``{"bytes": ...}``, ``{"tuple": [...]}``, ``{"date": "2020-01-01"}``, a numpy date as its
count and unit), and the array's dtype is written beside the labels (a ``datetime64`` array as
its counts), so uint64, bytes and date arrays come back with their dtype.  A label of any
other type (a time with a time zone, a frozenset) is refused with its value and type named:
nothing is written that cannot be read back.
"""

from __future__ import annotations

import datetime
from typing import Any

import numpy as np

from ..utils.errors import InputError

__all__ = ["label_from_json", "label_to_json", "labels_from_json", "labels_to_json"]


def label_to_json(label: Any) -> Any:
    """One label in JSON form (as ``tolist()`` gives array elements, or a per-class key).

    >>> label_to_json(b"cat"), label_to_json((1, "a")), label_to_json(np.uint64(2**63))
    ({'bytes': 'cat'}, {'tuple': [1, 'a']}, 9223372036854775808)
    >>> label_to_json(np.datetime64("2020-01-01T00:00:00.000000001"))
    {'datetime64': [1577836800000000001, 'datetime64[ns]']}
    """
    if isinstance(label, (np.datetime64, np.timedelta64)):  # exact: the count and its unit
        kind = "datetime64" if isinstance(label, np.datetime64) else "timedelta64"
        return {kind: [int(label.view(np.int64)), label.dtype.name]}
    if isinstance(label, np.generic):
        label = label.item()
    if label is None or isinstance(label, (bool, int, float, str)):
        return label
    if isinstance(label, bytes):
        return {"bytes": label.decode("latin-1")}  # every byte value, one character each
    if isinstance(label, tuple):
        return {"tuple": [label_to_json(v) for v in label]}
    if isinstance(label, datetime.timedelta):
        return {"timedelta": [label.days, label.seconds, label.microseconds]}
    if isinstance(label, datetime.datetime) and label.tzinfo is None:
        return {"datetime": label.isoformat()}
    if isinstance(label, datetime.date) and not isinstance(label, datetime.datetime):
        return {"date": label.isoformat()}
    raise InputError(
        f"the label {label!r} (type {type(label).__name__}) has no JSON form; write results "
        "with labels that are ints, floats, strings, bytes, dates and times without a time "
        "zone, or tuples of these."
    )


def label_from_json(value: Any) -> Any:
    """A label read back from :func:`label_to_json` (a list, as older files wrote tuples, is a
    tuple); a malformed object is a ``ValueError``.

    >>> label_from_json({"bytes": "cat"}), label_from_json({"tuple": [1, "a"]})
    (b'cat', (1, 'a'))
    """
    if isinstance(value, list):
        return tuple(label_from_json(v) for v in value)
    if not isinstance(value, dict):
        return value
    if len(value) != 1:
        raise ValueError(f"a label object has one key naming its kind: {value!r}")
    ((kind, inner),) = value.items()
    decode = _DECODERS.get(kind)
    if decode is None:
        raise ValueError(f"unknown label kind {kind!r} (one of {', '.join(_DECODERS)})")
    try:
        return decode(inner)
    except (TypeError, AttributeError, OverflowError) as exc:
        raise ValueError(f"a {kind} label cannot be read from {inner!r} ({exc})") from exc


def _numpy_time(inner: list) -> Any:
    count, dtype = inner
    return np.array(int(count), dtype=np.int64).view(np.dtype(str(dtype)))[()]


_DECODERS = {
    "bytes": lambda s: s.encode("latin-1"),
    "tuple": lambda items: tuple(label_from_json(v) for v in items),
    "date": datetime.date.fromisoformat,
    "datetime": datetime.datetime.fromisoformat,
    "timedelta": lambda parts: datetime.timedelta(*parts),
    "datetime64": _numpy_time,
    "timedelta64": _numpy_time,
}


def labels_to_json(labels: np.ndarray) -> tuple[list[Any], str | None]:
    """The query labels as a JSON list and the dtype to read them back with (None for an
    object array).  A 2-D indicator array (several labels per query) is its rows of booleans.

    >>> labels_to_json(np.array([2**63, 5], dtype=np.uint64))
    ([9223372036854775808, 5], '<u8')
    """
    if labels.ndim == 2:
        return labels.astype(bool).tolist(), None
    if labels.dtype.kind in "mM":  # dates and durations of any unit, NaT included: their counts
        return labels.view(np.int64).tolist(), labels.dtype.str
    dtype = None if labels.dtype == object else labels.dtype.str
    return [label_to_json(v) for v in labels.tolist()], dtype


def labels_from_json(values: list[Any], dtype: str | None, multi_label: bool) -> np.ndarray:
    """The query labels written by :func:`labels_to_json`: with their dtype when one was
    written, else one object per label (strings or ints of one type become their array, ints
    that no integer dtype holds stay objects).

    >>> labels_from_json([{"bytes": "a"}, {"bytes": "b"}], "|S1", False)
    array([b'a', b'b'], dtype='|S1')
    """
    if multi_label:
        return np.array(values, dtype=bool).reshape(len(values), -1)
    if dtype is not None and np.dtype(dtype).kind in "mM":
        return np.array(values, dtype=np.int64).view(np.dtype(dtype))
    labels = [label_from_json(v) for v in values]
    if dtype is not None:
        return np.array(labels, dtype=np.dtype(dtype))
    if len({type(v) for v in labels}) == 1 and not isinstance(labels[0], tuple):
        array = np.array(labels)
        # Ints both beyond int64 and negative fit no integer dtype: numpy makes them float64,
        # which merges labels 2**63 and 2**63 + 1, so they stay Python ints.
        if type(labels[0]) is not int or array.dtype.kind in "iu":
            return array
    out = np.empty(len(labels), dtype=object)
    for i, v in enumerate(labels):  # one by one: a tuple stays one label, not a row
        out[i] = v
    return out
