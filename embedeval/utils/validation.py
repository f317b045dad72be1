"""Argument and array validation shared by every public function.

Validation happens once, before any work, and raises :class:`~embedeval.utils.errors.InputError`
(a ``ValueError``) or :class:`~embedeval.utils.errors.InputTypeError` (a ``TypeError``) with a
message
that names the argument, states the rule, echoes what was found and suggests the fix.
"""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Iterable, Sequence, Sized
from typing import Any

import numpy as np

from .errors import InputError, InputTypeError

__all__ = [
    "as_any_labels",
    "as_embeddings",
    "as_int64",
    "as_label_indicator",
    "as_labels",
    "as_labels_like",
    "as_vector",
    "check_bootstrap",
    "check_choice",
    "check_int",
    "check_positive",
    "check_probability",
    "check_same_dimension",
    "check_same_label_kind",
    "check_same_length",
    "divide",
    "factorize",
    "host_array",
    "is_label_indicator",
    "label_keys",
    "label_sizes",
    "label_text",
    "refuse_object_array",
    "single_labels",
    "suggest",
    "zero_rows",
]


def suggest(name: str, choices: Iterable[str]) -> str:
    """Return ``" Did you mean 'x'?"`` for the nearest choice, or ``""`` when none is close."""
    close = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=0.5)
    return f" Did you mean {close[0]!r}?" if close else ""


def check_choice(value: Any, name: str, choices: Sequence[str]) -> str:
    """Check that ``value`` is one of ``choices`` (strings) and return it."""
    if not isinstance(value, str) or value not in choices:
        hint = suggest(value, choices) if isinstance(value, str) else ""
        raise InputError(
            f"{name}={value!r} is not valid; use one of {', '.join(map(repr, choices))}.{hint}"
        )
    return value


def check_int(
    value: Any,
    name: str,
    *,
    minimum: int | None = 1,
    allow_none: bool = False,
    maximum: int | None = None,
) -> int | None:
    """Check that ``value`` is an integer (not a bool, not a float) ``>= minimum`` (and
    ``<= maximum`` when given)."""
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        extra = " or None" if allow_none else ""
        raise InputError(
            f"{name} must be an integer{extra}; got {value!r} of type {type(value).__name__}."
            + (f" Use {name}={int(value)}." if _is_whole_float(value) else "")
        )
    value = int(value)
    if minimum is not None and value < minimum:
        raise InputError(f"{name} must be >= {minimum}; got {value}.")
    if maximum is not None and value > maximum:
        raise InputError(f"{name} must be <= {maximum}; got {value}.")
    return value


def as_int64(values: Any, name: str, fix: str) -> np.ndarray:
    """An integer array (any int or uint dtype) as int64, refusing a uint64 value above the
    largest int64: the cast would silently wrap it to a negative number; and an integer no
    64-bit integer holds, which makes numpy keep the array as Python objects.  ``fix`` ends the
    message (what the values should be).  Other dtypes are left to the caller to judge.

    >>> as_int64(np.array([1, 2], dtype=np.uint64), "ranks", "Pass 1-based ranks.").dtype
    dtype('int64')
    """
    arr = np.asarray(values)
    big = _first_beyond_64_bits(arr)
    if big is not None:
        # Named as such: "got dtype object" would hide that the value, not its type, is wrong.
        raise InputError(
            f"{name} holds the integer {big}, beyond 64-bit integers (-2**63 .. 2**64 - 1). {fix}"
        )
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise InputError(
            f"{name} holds {int(arr.max())}, above the largest int64 (2**63 - 1), which would "
            f"wrap to a negative number. {fix}"
        )
    return arr.astype(np.int64, copy=False) if arr.dtype.kind in "iu" else arr


def _is_whole_float(value: Any) -> bool:
    """A float with an integer value (``3.0``), whose integer the error message suggests; not
    a bool (``True`` is not a count of 1)."""
    if isinstance(value, (bool, np.bool_)):
        return False
    return isinstance(value, numbers.Real) and float(value).is_integer()


def check_positive(value: Any, name: str) -> float:
    """Check that ``value`` is a finite real number > 0 (NumPy scalars too, not a bool)."""
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, numbers.Real)
        or not 0 < float(value) < float("inf")
    ):
        raise InputError(f"{name} must be a positive number (finite, > 0); got {value!r}.")
    return float(value)


def check_bootstrap(ci: Any, n_boot: Any, seed: Any) -> tuple[float | None, int, int]:
    """``(ci, n_boot, seed)`` of percentile bootstrap intervals, checked, ``n_boot`` defaulting
    to 1000; an ``n_boot`` given without ``ci`` is refused, as nothing would be resampled.

    >>> check_bootstrap(0.95, None, 0)
    (0.95, 1000, 0)
    """
    if ci is None and n_boot is not None:
        raise InputError(
            f"n_boot={n_boot!r} sets the resamples of the bootstrap intervals, and without ci= "
            "nothing is resampled; pass ci=0.95 as well, or drop n_boot."
        )
    level = None if ci is None else check_level(ci)
    n_boot = 1000 if n_boot is None else check_int(n_boot, "n_boot")
    return level, n_boot, check_int(seed, "seed", minimum=0)


def check_probability(value: Any, name: str, *, open_left: bool = True) -> float:
    """Check that ``value`` is a real number in (0, 1] (or [0, 1] when ``open_left=False``)."""
    interval = "(0, 1]" if open_left else "[0, 1]"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise InputError(f"{name} must be a number in {interval}; got {value!r}.")
    value = float(value)
    low_ok = value > 0 if open_left else value >= 0
    if not (low_ok and value <= 1):
        raise InputError(f"{name} must be in {interval}; got {value}.")
    return value


def check_bool(value: Any, name: str) -> bool:
    """``value`` if it is a bool, else an error: a string such as "False" is truthy and would
    silently flip a sign convention.

    >>> check_bool(True, "higher_is_confident")
    True
    """
    if not isinstance(value, (bool, np.bool_)):
        raise InputError(f"{name} must be True or False; got {value!r}.")
    return bool(value)


def check_level(ci: Any, name: str = "ci") -> float:
    """A confidence level strictly between 0 and 1, as a float.

    >>> check_level(0.95)
    0.95
    """
    if isinstance(ci, (bool, np.bool_)) or not isinstance(ci, numbers.Real) or not 0 < ci < 1:
        raise InputError(f"{name} must be a confidence level strictly between 0 and 1; got {ci!r}.")
    return float(ci)


def check_fractions(fractions: Any, name: str = "rejection_fractions") -> np.ndarray:
    """Rejection fractions as a 1-D float array of numbers in [0, 1), or a clear error.

    >>> check_fractions((0.0, 0.25)).tolist()
    [0.0, 0.25]
    """
    fr = np.asarray([check_probability(f, name, open_left=False) for f in np.atleast_1d(fractions)])
    if fr.size == 0:
        raise InputError(f"{name} is empty; pass fractions such as (0.0, 0.1, 0.2).")
    if np.any(fr >= 1):
        raise InputError(f"{name} must be < 1 (something must remain to evaluate); got {fr}.")
    return fr


def host_array(x: Any) -> Any:
    """A torch tensor (any device, with or without grad) as a host numpy array; else ``x``.

    bfloat16 / float16 tensors become float32 (exact: every such value is a float32; numpy has
    no bfloat16).  Works without importing torch: a tensor is recognised by its methods.
    """
    if not (hasattr(x, "detach") and hasattr(x, "cpu") and hasattr(x, "numpy")):
        return x
    t = x.detach()
    if t.is_floating_point() and t.element_size() < 4:
        t = t.float()
    return t.cpu().numpy()


def _asarray(x: Any, name: str) -> np.ndarray:
    if x is None:
        raise InputError(f"{name} is required; got None.")
    if isinstance(x, np.ndarray):
        return x
    x = host_array(x)
    try:
        return np.asarray(x)
    except (ValueError, TypeError) as exc:  # ragged lists and the like
        raise InputError(f"{name} cannot be read as an array: {exc}") from exc


def refuse_object_array(
    arr: np.ndarray, name: str, fix: str, error: type[Exception] = InputTypeError
) -> None:
    """Raise ``error`` when ``arr`` is an object array (``fix``: what to pass).

    numpy keeps integers that no 64-bit integer holds (``2**70``) as Python objects, so such
    values get their own message: it is their size, not their type, that needs fixing.

    >>> try:
    ...     refuse_object_array(np.array([[2**70, 1]]), "query", "pass numbers.")
    ... except InputTypeError as exc:
    ...     print(str(exc)[:61])
    query holds the integer 1180591620717411303424, beyond 64-bit
    """
    if arr.dtype != object:
        return
    shown = _first_beyond_64_bits(arr)
    if shown is None:
        raise error(f"{name} is an object array; {fix}")
    raise error(
        f"{name} holds the integer {shown}, beyond 64-bit integers (-2**63 .. 2**64 - 1), so "
        f"numpy keeps {name} as Python objects; convert it to floats "
        f"(np.asarray({name}, dtype=np.float64)) or rescale its values."
    )


def _first_beyond_64_bits(arr: np.ndarray) -> str | None:
    """The first integer of an object array that neither int64 nor uint64 holds, as shown in
    messages (a long one shortened); None when there is none or ``arr`` is not an object array.
    """
    if arr.dtype != object:
        return None
    big = next((v for v in arr.flat if _beyond_64_bits(v)), None)
    if big is None:
        return None
    digits = str(big)
    return digits if len(digits) <= 30 else f"{digits[:12]}... ({len(digits)} digits)"


def _beyond_64_bits(value: Any) -> bool:
    """An integer (not a bool) that neither int64 nor uint64 holds."""
    return (
        isinstance(value, numbers.Integral)
        and not isinstance(value, (bool, np.bool_))
        and not -(2**63) <= int(value) < 2**64
    )


def _describe_bad_rows(bad: np.ndarray) -> str:
    rows = np.flatnonzero(bad)
    return f"{rows.size} row(s), first at row {int(rows[0])}"


def as_embeddings(
    x: Any,
    name: str = "embeddings",
    *,
    dtype: Any = np.float32,
    allow_empty: bool = False,
) -> np.ndarray:
    """Return ``x`` as a finite 2-D float array of ``dtype`` (no copy when it already is one).

    Memory-mapped float32 arrays stay memory-mapped.  float16/float64 inputs are converted.
    """
    arr = _asarray(x, name)
    refuse_object_array(arr, name, "pass a numeric array (e.g. np.stack(list_of_vectors)).")
    if arr.dtype.kind not in "fiub":
        raise InputTypeError(f"{name} must be numeric; got dtype {arr.dtype}.")
    if arr.ndim != 2:
        hint = (
            " Use x.reshape(1, -1) for a single vector or x.reshape(-1, 1) for 1-D features."
            if arr.ndim == 1
            else " Flatten the trailing axes first, e.g. x.reshape(len(x), -1)."
            if arr.ndim > 2
            else ""
        )
        raise InputError(f"{name} must be 2-D (n_items, dim); got shape {arr.shape}.{hint}")
    if arr.shape[0] == 0 and not allow_empty:
        raise InputError(f"{name} is empty (shape {arr.shape}); pass at least one vector.")
    if arr.shape[1] == 0:  # rows, but vectors of no dimension: nothing to measure a distance on
        raise InputError(
            f"{name} has no columns (shape {arr.shape}): its vectors have zero dimensions; "
            "pass (n_items, dim) embeddings with dim >= 1."
        )
    given = arr
    if arr.dtype != dtype:
        with np.errstate(over="ignore"):  # values beyond the range: refused below, by name
            arr = arr.astype(dtype)
    if arr.dtype.kind == "f":
        finite = _rows_finite(arr)
        if not finite.all():
            _refuse_not_finite(given, finite, name, arr.dtype)
    return arr


def _refuse_not_finite(given: np.ndarray, finite: np.ndarray, name: str, dtype: np.dtype) -> None:
    """Raise for the rows that are not ``finite`` once converted to ``dtype``: as given (NaN,
    inf), or finite values beyond its range (float64 ``1e200`` in float32)."""
    bad = ~finite
    if given.dtype.kind == "f":
        overflow = bad.copy()
        overflow[bad] = _rows_finite(given[bad])
        if overflow.any():
            raise InputError(
                f"{name} has values beyond {dtype}'s range (about {np.finfo(dtype).max:.1e}) in "
                f"{_describe_bad_rows(overflow)}, which would become infinite; rescale it first, "
                f"e.g. {name} / 2**k for a k that brings its largest value within that range."
            )
    raise InputError(
        f"{name} has NaN or infinite values in {_describe_bad_rows(bad)}; "
        "drop or repair those rows before evaluating."
    )


def _rows_finite(arr: np.ndarray, block: int = 8192) -> np.ndarray:
    """Whether each row of a float array is finite, a block at a time (a memory-mapped file is
    read once, never copied whole).  A row's sum of squares is NaN or infinite where one of
    its values is (squares are never negative: no ``inf - inf`` hides one), so one vectorised
    sum per row finds the suspects; only those whose squares merely overflow (finite values
    above about 1e19 in float32) are then checked value by value."""
    out = np.ones(arr.shape[0], dtype=bool)
    for start in range(0, arr.shape[0], block):
        rows = arr[start : start + block]
        odd = np.flatnonzero(~np.isfinite(_row_squares(rows)))
        if odd.size:
            out[start + odd] = np.isfinite(rows[odd]).all(axis=1)
    return out


def zero_rows(arr: np.ndarray, block: int = 8192) -> np.ndarray:
    """Indices of the rows of a finite float array that are all zero, a block at a time.  A
    zero row's sum of squares is 0; so is that of a row of values too small to square (below
    about 1e-23 in float32), so only the rows the screen finds are read value by value.

    >>> zero_rows(np.float32([[0, 0], [1e-30, 0], [0, 2]])).tolist()
    [0]
    """
    found = [np.zeros(0, np.int64)]
    for start in range(0, arr.shape[0], block):
        rows = arr[start : start + block]
        maybe = np.flatnonzero(_row_squares(rows) == 0)
        found.append(start + maybe[~rows[maybe].any(axis=1)])
    return np.concatenate(found)


def _row_squares(rows: np.ndarray) -> np.ndarray:
    """Each row's sum of squares in the rows' own float type (NaN or infinite where a value is,
    or where the sum overflows; 0 where every square underflows): a screen, not a norm."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.einsum("ij,ij->i", rows, rows)


def as_vector(
    x: Any,
    name: str,
    *,
    length: int | None = None,
    length_of: str | None = None,
    dtype: Any = np.float64,
    allow_nan: bool = False,
    allow_empty: bool = False,
) -> np.ndarray:
    """Return ``x`` as a 1-D numeric array of ``dtype`` (checked length and finiteness)."""
    arr = _asarray(x, name)
    refuse_object_array(arr, name, "pass numbers.")
    if arr.dtype.kind not in "fiub":
        raise InputTypeError(
            f"{name} must be numeric; got dtype {arr.dtype}. Pass one number per item."
        )
    if arr.ndim != 1:
        raise InputError(f"{name} must be 1-D; got shape {arr.shape}.")
    if arr.size == 0 and not allow_empty:
        raise InputError(f"{name} is empty; pass at least one value.")
    if length is not None and arr.shape[0] != length:
        other = f" (the length of {length_of})" if length_of else ""
        raise InputError(f"{name} has {arr.shape[0]} values but {length} are needed{other}.")
    arr = arr.astype(dtype, copy=False)
    if arr.dtype.kind == "f":
        bad = np.isinf(arr) if allow_nan else ~np.isfinite(arr)
        if bad.any():
            what = "infinite" if allow_nan else "NaN or infinite"
            rows = np.flatnonzero(bad)
            raise InputError(
                f"{name} has {rows.size} {what} value(s), first at index {int(rows[0])}; "
                "drop or repair them."
            )
    return arr


def as_labels(
    y: Any,
    name: str = "labels",
    *,
    length: int | None = None,
    length_of: str | None = None,
    groups: bool = False,
) -> np.ndarray:
    """Return labels as a 1-D array, never cast to float.

    Integers keep their dtype (2**24 and 2**24 + 1 stay distinct), strings stay strings, other
    hashables become an object array (a list of tuples of different lengths too).  Float labels
    are accepted only when they are whole numbers and NaN-free, because a label of 0.5 is almost
    always a mistake.  ``groups=True`` checks group ids (``query_groups``, ...) the same way,
    with messages about groups: an item has one group, never several.
    """
    arr = _asarray(_list_labels(y), name)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise InputError(f"{name} must be 1-D {_not_one_per_item(arr.shape, groups)}")
    if arr.size == 0:
        raise InputError(f"{name} is empty; pass one {'group id' if groups else 'label'} per item.")
    if length is not None and arr.shape[0] != length:
        other = f" rows of {length_of}" if length_of else " items"
        raise InputError(
            f"{name} has {arr.shape[0]} labels but there are {length}{other}; "
            "pass one label per embedding row."
        )
    if arr.dtype.kind == "f":
        if not np.isfinite(arr).all():
            rows = np.flatnonzero(~np.isfinite(arr))
            raise InputError(
                f"{name} has {rows.size} NaN or infinite label(s), first at index {int(rows[0])}; "
                "every item needs a class id (an integer or a string): repair those labels, or "
                "drop those items."
            )
        fractional = np.flatnonzero(arr != np.round(arr))
        if fractional.size:
            i = int(fractional[0])
            raise InputError(
                f"{name} has {fractional.size} non-integer float label(s), first at index {i} "
                f"({arr[i]!r}); labels are class ids: pass integers or strings."
            )
    elif arr.dtype == object:
        for i, v in enumerate(arr):
            try:
                hash(v)
            except TypeError as exc:
                raise InputTypeError(
                    f"{name} must hold hashable values (ints, strings, tuples); the value at "
                    f"index {i} is {v!r} of type {type(v).__name__} ({exc})."
                ) from exc
        # None (and a float NaN, as pandas stores a missing string) is a missing label, not a
        # class of its own: every None would silently become relevant to every other None.
        missing = np.fromiter((_is_missing(v) for v in arr), dtype=bool, count=arr.size)
        if missing.any():
            rows = np.flatnonzero(missing)
            i = int(rows[0])
            raise InputError(
                f"{name} has {rows.size} missing label(s) (None or NaN), first at index {i} "
                f"({arr[i]!r}); every item needs a class label: drop those rows (with their "
                "embeddings) or give them a label."
            )
        _refuse_text_beside_numbers(arr, name)
    elif arr.dtype.kind in "mM" and np.isnat(arr).any():  # NaT: a missing date, as None above
        rows = np.flatnonzero(np.isnat(arr))
        raise InputError(
            f"{name} has {rows.size} missing label(s) (NaT), first at index {int(rows[0])}; "
            "every item needs a class label: drop those rows (with their embeddings) or give "
            "them a label."
        )
    return arr


def _not_one_per_item(shape: tuple[int, ...], groups: bool) -> str:
    """The rest of the message for labels or group ids of ``shape``, not 1-D: a 2-D labels
    array may be meant as several labels per item, a 2-D groups array never is.

    >>> _not_one_per_item((4, 2), groups=True)[:54]
    '(one group id per item); got shape (4, 2). An item bel'
    """
    if groups:
        return (
            f"(one group id per item); got shape {shape}. An item belongs to exactly one group "
            "(its camera, sequence, source, ...): pass one id per item, e.g. "
            "np.unique(groups, axis=0, return_inverse=True)[1] for one id per distinct row."
        )
    return (
        f"(one label per item); got shape {shape}. For several labels per item pass a 2-D 0/1 "
        "indicator array of shape (n, n_labels)."
    )


def is_label_indicator(y: Any) -> bool:
    """Whether ``y`` is given as a 2-D label indicator array (several labels per item), the
    multilabel format of scikit-learn: shape (n, n_labels) with at least two columns."""
    if y is None:
        return False
    shape = np.shape(host_array(_list_labels(y)))
    return len(shape) == 2 and shape[1] >= 2


def _list_labels(y: Any) -> Any:
    """A list or tuple of labels as an array, converted once: numpy's array, or for a ragged
    list (tuples of several lengths) one object per element; anything else unchanged."""
    if not isinstance(y, (list, tuple)):
        return y
    try:
        arr = np.asarray(y)
    except ValueError:
        return _objects(y)
    except TypeError:
        return y  # as_labels names the argument
    # numpy would merge labels that differ: numbers beside text all become text (1 and "1"),
    # and integers that no integer dtype holds together (2**63 beside -1) become float64
    # (2**63 and 2**63 + 1); kept as given, as_labels judges them as objects
    if arr.ndim == 1 and arr.dtype.kind in "US" and not all(isinstance(v, (str, bytes)) for v in y):
        return _objects(y)
    if arr.ndim == 1 and arr.dtype.kind == "f" and any(_big_integer(v) for v in y):
        return _objects(y)
    return arr


def _objects(values: Sequence[Any]) -> np.ndarray:
    """One object per element (a tuple stays one label, not a row)."""
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def _big_integer(value: Any) -> bool:
    """An integer that float64 does not hold exactly."""
    return isinstance(value, numbers.Integral) and abs(int(value)) > 2**53


def _refuse_text_beside_numbers(arr: np.ndarray, name: str) -> None:
    """Object labels that mix text and numbers: 1 and "1" are one class to tools that read
    labels as text and two to the others, so the mix is almost always a reading mistake."""
    text = number = None
    for i, v in enumerate(arr):
        if isinstance(v, (str, bytes)):
            text = i if text is None else text
        elif isinstance(v, numbers.Number) and not isinstance(v, np.timedelta64):  # a duration
            number = i if number is None else number
        if text is not None and number is not None:
            raise InputError(
                f"{name} mixes text and numbers ({arr[text]!r} at index {text}, {arr[number]!r} "
                f"at index {number}); convert every label to one type (all str or all int)."
            )


def _label_kind(arr: np.ndarray) -> tuple[str, Any] | None:
    """("text", "bytes" or "numbers", a first value) of checked labels (which never mix text
    and numbers), or None for labels that are none of them (tuples, dates)."""
    if arr.dtype.kind in "US":
        return ("text" if arr.dtype.kind == "U" else "bytes"), arr[0].item()
    if arr.dtype.kind in "iufb":
        return "numbers", arr[0].item()
    for v in arr:
        if isinstance(v, (str, bytes)):
            return ("text" if isinstance(v, str) else "bytes"), v
        if isinstance(v, numbers.Number) and not isinstance(v, np.timedelta64):
            return "numbers", v
    return None


def check_same_label_kind(a: np.ndarray, name_a: str, b: np.ndarray, name_b: str) -> None:
    """Refuse two checked label arrays meant to share classes when they hold different kinds of
    value (text, bytes, numbers): 1, "1" and b"1" are different classes, so every item would
    silently mismatch (as when predictions read from a text file meet integer ground truth)."""
    ka, kb = _label_kind(a), _label_kind(b)
    if ka is not None and kb is not None and ka[0] != kb[0]:
        raise InputError(
            f"{name_a} holds {ka[0]} (e.g. {ka[1]!r}) but {name_b} holds {kb[0]} (e.g. "
            f"{kb[1]!r}), which never share a class; convert both to one type (all str or all "
            "int; bytes.decode() for bytes)."
        )


def as_label_indicator(
    y: Any,
    name: str = "labels",
    *,
    length: int | None = None,
    length_of: str | None = None,
    n_labels: int | None = None,
) -> np.ndarray:
    """Return a 2-D 0/1 label indicator array (n, n_labels) as bool; ``n_labels``: the number
    of columns it must have (the query's, for the reference).

    >>> as_label_indicator([[1, 0], [1, 1]]).tolist()
    [[True, False], [True, True]]
    """
    arr = _asarray(_dense(y), name)
    if arr.ndim != 2 or arr.shape[1] < 2:
        raise InputError(
            f"{name} must be a 2-D 0/1 indicator array (n, n_labels) like the queries' labels; "
            f"got shape {arr.shape}. Give query and reference labels in the same format."
        )
    if length is not None and arr.shape[0] != length:
        other = f" rows of {length_of}" if length_of else " items"
        raise InputError(
            f"{name} has {arr.shape[0]} rows but there are {length}{other}; pass one row of "
            "label indicators per embedding row."
        )
    if n_labels is not None and arr.shape[1] != n_labels:
        raise InputError(
            f"{name} has {arr.shape[1]} label columns but the query labels have {n_labels}; "
            "both indicator arrays must list the same labels in the same columns."
        )
    arr = _numbers_of_objects(arr)
    if arr.dtype != bool:
        if arr.dtype.kind not in "iuf":
            raise InputTypeError(f"{name} must hold 0/1 numbers or booleans; got {arr.dtype}.")
        bad = np.flatnonzero(((arr != 0) & (arr != 1)).any(axis=1))
        if bad.size:
            i = int(bad[0])
            raise InputError(
                f"{name} must hold only 0 and 1 (label indicators); row {i} is "
                f"{arr[i].tolist()!r}. Multi-label targets are 0/1 columns, one per label."
            )
    return arr.astype(bool)


def _numbers_of_objects(arr: np.ndarray) -> np.ndarray:
    """An object array of plain numbers and booleans as float64; else ``arr`` unchanged.

    A pandas DataFrame whose columns mix bool and int, or use the nullable ``Int8`` dtype, comes
    out of ``np.asarray`` as objects although each value is a 0/1 number (a missing value, not
    a number, keeps the array as it is, to be refused by its dtype).

    >>> _numbers_of_objects(np.array([[True, 0], [1, 1.0]], dtype=object)).dtype
    dtype('float64')
    """
    if arr.dtype != object or not all(
        isinstance(v, (bool, int, float, np.bool_, np.integer, np.floating)) for v in arr.flat
    ):
        return arr
    return np.array([float(v) for v in arr.flat], dtype=np.float64).reshape(arr.shape)


def _dense(y: Any) -> Any:
    """A scipy sparse matrix (``MultiLabelBinarizer(sparse_output=True)`` gives one) as a
    dense array, which numpy would otherwise read as one object of shape (); else ``y``."""
    if hasattr(y, "toarray") and hasattr(y, "nnz"):
        return y.toarray()
    return y


def as_any_labels(
    y: Any, name: str = "labels", *, length: int | None = None, length_of: str | None = None
) -> np.ndarray:
    """Labels in either form :func:`embedeval.evaluate` takes: one per item (1-D, as
    :func:`as_labels`) or a 2-D 0/1 indicator array (several per item, as
    :func:`as_label_indicator`).

    >>> as_any_labels([3, 1]).tolist(), as_any_labels([[1, 0], [1, 1]]).shape
    ([3, 1], (2, 2))
    """
    y = _list_labels(y)
    check = as_label_indicator if is_label_indicator(y) else as_labels
    return check(y, name, length=length, length_of=length_of)


def as_labels_like(
    y: Any,
    name: str,
    *,
    n_labels: int | None,
    length: int | None = None,
    length_of: str | None = None,
) -> np.ndarray:
    """Labels in the form of the queries' labels: a 2-D 0/1 indicator array of ``n_labels``
    columns (as :func:`as_label_indicator`), or for ``n_labels=None`` one label per item (as
    :func:`as_labels`), where a 2-D indicator array is refused as a mix of the two forms.

    The query labels fix the form, so :func:`as_labels`' own advice (pass a 2-D indicator array
    for several labels per item) would point at what the caller already did.

    >>> as_labels_like([3, 1], "reference_labels", n_labels=None).tolist()
    [3, 1]
    >>> as_labels_like([[1, 0]], "reference_labels", n_labels=2).tolist()
    [[True, False]]
    """
    if n_labels is not None:
        return as_label_indicator(y, name, length=length, length_of=length_of, n_labels=n_labels)
    y = _list_labels(y)
    if is_label_indicator(y):
        raise InputError(
            f"{name} has shape {np.shape(host_array(y))} (several labels per item, a 2-D "
            "indicator array) but query_labels give one label per item; give both in the same "
            "form: one label per item, or 0/1 indicator arrays with the same label columns."
        )
    return as_labels(y, name, length=length, length_of=length_of)


def single_labels(labels: Any) -> Any:
    """``labels`` when they give one class per item, else None (a 2-D indicator array): what
    statistics over classes that partition the items (class-wise calibration) are given.

    >>> single_labels([0, 1]), single_labels(np.eye(2))
    ([0, 1], None)
    """
    return None if is_label_indicator(labels) else labels


def label_sizes(labels: np.ndarray) -> dict[Any, int]:
    """How many items carry each label: per class for one label per item, per label column
    (its index) for a 2-D indicator array, where an item counts once for every label it has.

    >>> label_sizes(np.array(["b", "a", "b"])), label_sizes(np.array([[1, 0], [1, 1]]))
    ({'b': 2, 'a': 1}, {0: 2, 1: 1})
    """
    if np.ndim(labels) == 2:
        return dict(enumerate(np.count_nonzero(labels, axis=0).tolist()))
    sizes: dict[Any, int] = {}
    for lab in label_keys(np.asarray(labels)):
        sizes[lab] = sizes.get(lab, 0) + 1
    return sizes


def label_keys(labels: np.ndarray) -> list[Any]:
    """One label per item as the keys of a per-class table: Python scalars, except nanosecond
    dates and durations, which stay numpy scalars (``tolist()`` makes them plain integers, so
    they would print as counts and match no date); numpy scalars inside an object array become
    Python ones.

    >>> label_keys(np.array([3, 1])), label_keys(np.array(["2020-01-01"], dtype="M8[ns]"))
    ([3, 1], [np.datetime64('2020-01-01T00:00:00.000000000')])
    """
    keys = labels.tolist()  # one C pass; a loop over the classes cost far more
    if labels.dtype.kind in "mM" and keys and isinstance(keys[0], int):
        return list(labels)
    if labels.dtype == object:
        return [k.item() if isinstance(k, np.generic) else k for k in keys]
    return keys


def label_text(label: Any) -> str:
    """A label as one table cell: the label itself, or for a row of a 2-D indicator array the
    indices of the labels it has, joined by ``;`` (empty when it has none).

    >>> label_text(7), label_text((1, 2)), label_text(np.array([True, False, True]))
    ('7', '(1, 2)', '0;2')
    """
    if isinstance(label, np.ndarray) and label.ndim == 1:  # not a tuple label: rows only
        return ";".join(str(i) for i in np.flatnonzero(label).tolist())
    if isinstance(label, (np.datetime64, np.timedelta64)):  # item() of nanoseconds is an int
        return str(label)
    return str(label.item() if isinstance(label, np.generic) else label)


def _is_missing(value: Any) -> bool:
    if isinstance(value, (np.datetime64, np.timedelta64)):
        return bool(np.isnat(value))
    return value is None or (isinstance(value, (float, np.floating)) and value != value)


def factorize(*label_arrays: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """Map several label arrays onto shared integer codes ``0..n_classes-1``.

    Returns ``(codes_per_array, uniques)``; ``uniques[codes] == labels``.  Exact for integers of
    any size and for strings (numpy's ``unique``); other hashables go through a dictionary.
    """
    sizes = [len(a) for a in label_arrays]
    kinds = {a.dtype.kind for a in label_arrays}
    if len(label_arrays) > 1 and len(kinds) > 1:
        label_arrays = _common_exact_dtype(label_arrays, kinds)
    joined = np.concatenate(label_arrays)
    if joined.dtype == object:
        table: dict[Any, int] = {}
        codes = np.fromiter(
            (table.setdefault(v, len(table)) for v in joined), dtype=np.int64, count=joined.size
        )
        uniques = np.empty(len(table), dtype=object)
        uniques[:] = list(table)
        # Order classes by first appearance is fine for hashables that do not sort.
    else:
        uniques, codes = np.unique(joined, return_inverse=True)
        codes = codes.astype(np.int64, copy=False).ravel()
    out = np.split(codes, np.cumsum(sizes)[:-1])
    return out, uniques


def _common_exact_dtype(arrays: tuple[np.ndarray, ...], kinds: set[str]) -> tuple[np.ndarray, ...]:
    """The label arrays in one dtype that compares them exactly.

    numpy promotes uint64 with int64 (and integers with floats) to float64, which merges
    labels such as 2**60 and 2**60 + 1.  Whole-number labels of any numeric kind become int64
    when every value fits, uint64 when none is negative, and Python objects (exact, slower)
    otherwise; strings mixed with numbers are compared as Python objects.
    """
    if not kinds <= set("iubf"):
        return tuple(a.astype(object) for a in arrays)
    lows, highs = [], []
    for a in arrays:
        if a.size:
            lo, hi = a.min(), a.max()
            lows.append(int(lo))
            highs.append(int(hi))
    low, high = min(lows, default=0), max(highs, default=0)
    if "f" in kinds and max(abs(low), abs(high)) >= 2**53:
        # Whole floats that large are not exact integers of the user's data: keep them exact
        # as Python numbers (int == float compares exactly in Python).
        return tuple(a.astype(object) for a in arrays)
    if high < 2**63:
        return tuple(a.astype(np.int64) for a in arrays)
    if low >= 0:
        return tuple(a.astype(np.uint64) for a in arrays)
    return tuple(a.astype(object) for a in arrays)


def check_same_length(name_a: str, a: Sized, name_b: str, b: Sized) -> None:
    """Raise when two aligned inputs differ in length."""
    if len(a) != len(b):
        raise InputError(
            f"{name_a} has {len(a)} items but {name_b} has {len(b)}; they must be aligned "
            "one to one."
        )


def check_same_dimension(query: Any, other: Any, other_name: str) -> None:
    """Raise when the query embeddings and ``other_name`` (the reference or gallery) have
    different dimensions, as embeddings of two different models would."""
    if other.shape[1] != query.shape[1]:
        raise InputError(
            f"query has dimension {query.shape[1]} but {other_name} has {other.shape[1]}; both "
            "must come from the same embedding model."
        )


def divide(num: Any, den: Any, zero_division: Any, message: str) -> np.ndarray:
    """``num / den`` elementwise, where a zero denominator follows the ``zero_division`` policy:
    ``"warn"`` (0.0 and an :class:`EmbedevalWarning` saying ``message``) or a number (0.0, 1.0,
    nan) used silently."""
    import warnings

    from .errors import EmbedevalWarning

    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    zero = den == 0
    with np.errstate(invalid="ignore", divide="ignore"):
        out = num / np.where(zero, 1, den)
    warn = isinstance(zero_division, str) and zero_division == "warn"
    if warn:
        fill = 0.0
    elif isinstance(zero_division, numbers.Real) and not isinstance(
        zero_division, (bool, np.bool_)
    ):  # NumPy scalars too: np.float32(np.nan), np.int64(1)
        fill = float(zero_division)
    else:
        raise InputError(
            f"zero_division must be 'warn' or a number (0.0, 1.0, nan); got {zero_division!r}."
        )
    if zero.any():
        if warn:
            warnings.warn(
                f"{message.format(n=int(zero.sum()))}; set to 0.0 (zero_division='warn'; pass "
                "zero_division=0.0, 1.0 or nan to choose).",
                EmbedevalWarning,
                stacklevel=4,
            )
        out[zero] = fill
    return out
