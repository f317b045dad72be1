"""``embedeval.Evaluator``: accumulate embeddings batch by batch, evaluate once.

The streaming counterpart of :func:`embedeval.evaluate` for training loops::

    ev = Evaluator(metrics=["precision_at_1", "map_at_r"], distance="cosine")
    for batch in val_loader:
        ev.update(model(batch.x), batch.y)
    res = ev.compute()      # == evaluate() on the concatenated batches
    ev.reset()

Batches go to host memory as they arrive (a torch tensor is detached and copied to the CPU, a
low-precision one upcast to float32), into buffers that grow geometrically, so accumulation costs
amortised O(1) per row and no Python object per batch survives.  Under ``torch.distributed``,
:meth:`Evaluator.compute` gathers every rank's rows and every rank returns the same result.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import numpy as np

from ..engine.custom import metric_infos
from ..engine.registry import PML_ALIASES
from ..utils.distributed import active_world, all_gather_arrays
from ..utils.errors import EmbedevalWarning, InputError, InputTypeError
from ..utils.validation import (
    as_any_labels,
    as_embeddings,
    as_int64,
    as_labels,
    as_vector,
    host_array,
    suggest,
)
from .evaluate import evaluate
from .result import EvaluationResult
from .settings import DATA_ARGUMENTS, EvaluationInputs, validate_arguments

__all__ = ["Evaluator"]

_SPLITS = (None, "query", "reference")


class _Growable:
    """An array that grows by appending rows, doubling its capacity when full."""

    def __init__(self) -> None:
        self._data: np.ndarray | None = None
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def append(self, rows: np.ndarray) -> None:
        if self._data is None:
            self._data = np.empty((max(rows.shape[0], 16), *rows.shape[1:]), dtype=rows.dtype)
        elif rows.dtype != self._data.dtype:
            self._promote(rows.dtype)
        need = self._n + rows.shape[0]
        if need > self._data.shape[0]:
            capacity = max(need, 2 * self._data.shape[0])
            grown = np.empty((capacity, *self._data.shape[1:]), dtype=self._data.dtype)
            grown[: self._n] = self._data[: self._n]
            self._data = grown
        self._data[self._n : need] = rows
        self._n = need

    def _promote(self, dtype: np.dtype) -> None:
        # Only the filled rows are converted: the spare capacity is uninitialised memory, whose
        # bytes need not decode as text (bytes labels promoted to str raised UnicodeDecodeError).
        if self._data is not None:
            grown = np.empty(self._data.shape, dtype=_common_dtype(self._data.dtype, dtype))
            grown[: self._n] = self._data[: self._n]
            self._data = grown

    def values(self) -> np.ndarray | None:
        return None if self._data is None else self._data[: self._n]


class _Side:
    """The rows accumulated for one side (the whole set, the queries or the references)."""

    FIELDS = ("embeddings", "labels", "indices", "groups", "confidences")

    def __init__(self) -> None:
        self.buffers = {name: _Growable() for name in self.FIELDS}
        self.present: dict[str, bool] | None = None

    def __len__(self) -> int:
        return len(self.buffers["embeddings"])

    def append(self, arrays: dict[str, np.ndarray | None], split: str | None) -> None:
        present = {name: arrays[name] is not None for name in self.FIELDS}
        if self.present is not None and present != self.present:
            changed = [n for n in self.FIELDS if present[n] != self.present[n]]
            where = "" if split is None else f" with split={split!r}"
            raise InputError(
                f"update(){where} was called with {', '.join(changed)} on some batches but not "
                "on others; pass them on every batch or on none."
            )
        self.check_width(arrays["embeddings"])
        _check_label_form(self.buffers["labels"].values(), arrays["labels"])
        self.present = present
        for name, rows in arrays.items():
            if rows is not None:
                self.buffers[name].append(rows)

    def check_width(self, x: np.ndarray) -> None:
        """Refuse embeddings whose dimension is not the earlier batches' (an empty batch's too:
        a (0, 3) batch after (n, 1) ones comes from another model, or a wrong reshape)."""
        earlier = self.buffers["embeddings"].values()
        if earlier is not None and x.shape[1] != earlier.shape[1]:
            raise InputError(
                f"embeddings of this batch have dimension {x.shape[1]} but earlier batches had "
                f"{earlier.shape[1]}; every batch must come from the same model (an empty batch "
                f"too: give it shape (0, {earlier.shape[1]}))."
            )

    def arrays(self) -> dict[str, np.ndarray]:
        out = {}
        for name, buffer in self.buffers.items():
            values = buffer.values()
            if values is not None:
                out[name] = values
        return out


def _check_label_form(earlier: np.ndarray | None, labels: np.ndarray) -> None:
    """Refuse a batch whose labels are not in the earlier batches' form (one per row, or a
    0/1 indicator array with as many label columns)."""
    if earlier is None or earlier.shape[1:] == labels.shape[1:]:
        return

    def form(a: np.ndarray) -> str:
        return f"{a.shape[1]} indicator columns" if a.ndim == 2 else "one label per row"

    raise InputError(
        f"labels of this batch have {form(labels)} but earlier batches had {form(earlier)}; "
        "give every batch its labels in the same form."
    )


class Evaluator:
    """Accumulate embeddings over batches (and processes), then evaluate them exactly.

    Parameters
    ----------
    metrics, k, distance, average :
        As in :func:`embedeval.evaluate`.
    primary_metric : str, optional
        The metric a training loop selects checkpoints by (default: the first metric).
        :attr:`higher_is_better` and :attr:`mode` say in which direction it improves.
    **options :
        Any other keyword argument of :func:`embedeval.evaluate` except the data (embeddings,
        labels, groups, confidences, which come through :meth:`update`): ``ci``,
        ``ref_includes_query``, ``higher_is_confident``, ``block_size``, ``n_threads``, ...
        Every option is checked when the Evaluator is built, by the same validation stage as
        :func:`embedeval.evaluate`.

    Notes
    -----
    ``update(..., split=None)`` accumulates one set, evaluated leave-one-out (each item is a
    query whose gallery is every other item).  ``split="query"`` / ``"reference"`` accumulate a
    query / gallery split instead; the two modes cannot be mixed between resets.

    Order and duplicates: without ``indices`` the rows are evaluated in the order they arrived.
    With ``indices`` (the dataset index of each row) the rows are evaluated in the order of their
    index, and a repeated index is kept once (its first occurrence) — what a
    ``DistributedSampler`` pads to make equal shards.  So the result is the one of
    :func:`embedeval.evaluate` on the dataset in its own order, whatever the batching, the number
    of processes and the padding.  Ties between equally distant references are broken by that
    order (ascending reference index), as in :func:`embedeval.evaluate`.  With
    ``ref_includes_query=True`` the references holding the queries' indices come first, in
    query order (query i is reference i).

    Distributed: when ``torch.distributed`` is initialised with several processes,
    :meth:`compute` is a collective call (every rank must call it): the rows of every rank are
    gathered on every rank, de-duplicated by ``indices``, and every rank computes and returns
    the same result.  A rank that received no rows (or no rows of one side of a split)
    contributes none.  Without ``indices`` padded duplicates cannot be recognised, which a
    warning says.

    Examples
    --------
    >>> import numpy as np
    >>> ev = Evaluator(metrics=["precision_at_1", "map_at_r"])
    >>> ev.update(np.array([[0.0], [0.1], [5.0]]), [0, 0, 1])
    >>> ev.update(np.array([[5.1], [9.0]]), [1, 2])
    >>> res = ev.compute()
    >>> res["precision_at_1"], res.n_lone  # the label-2 item has no partner: lone
    (1.0, 1)
    >>> ev.mode
    'max'
    """

    def __init__(
        self,
        *,
        metrics: Any = None,
        k: int | str | None = None,
        distance: str = "euclidean",
        average: str = "micro",
        primary_metric: str | None = None,
        **options: Any,
    ) -> None:
        _check_options(options)
        self._options = {"metrics": metrics, "k": k, "distance": distance, "average": average}
        self._options.update(options)
        _validate_early(self._options)
        infos = metric_infos(metrics, options.get("custom_metrics"))
        self._directions = {m.name: bool(m.higher_is_better) for m in infos}
        names = list(self._directions)
        if primary_metric is None:
            primary_metric = names[0]
        else:
            alias = PML_ALIASES.get(primary_metric, primary_metric)
            if alias not in names:
                raise InputError(
                    f"primary_metric={primary_metric!r} is not among the metrics computed "
                    f"({', '.join(names)}); add it to metrics= or pick one of those."
                    + suggest(primary_metric, names)
                )
            primary_metric = alias
        self.primary_metric: str = primary_metric
        self.reset()

    # ------------------------------------------------------------------ public
    @property
    def higher_is_better(self) -> bool:
        """Whether a larger :attr:`primary_metric` is better (True for every retrieval metric)."""
        return self._directions[self.primary_metric]

    @property
    def mode(self) -> str:
        """``"max"`` or ``"min"``: the direction for a checkpoint callback's ``mode=``."""
        return "max" if self.higher_is_better else "min"

    def reset(self) -> None:
        """Forget every accumulated row (keeps the settings)."""
        self._sides: dict[str | None, _Side] = {}

    @property
    def n_rows(self) -> int:
        """Rows accumulated in this process (before any gathering or de-duplication)."""
        return sum(len(side) for side in self._sides.values())

    def update(
        self,
        embeddings: Any,
        labels: Any,
        *,
        split: str | None = None,
        indices: Any = None,
        groups: Any = None,
        confidences: Any = None,
    ) -> None:
        """Add one batch of rows (an empty batch, e.g. one filtered to nothing, adds none).

        An empty batch must still have the embedding dimension of the earlier batches.

        Parameters
        ----------
        embeddings : array-like or torch tensor, shape (n, dim)
            A torch tensor (any device, any float dtype, with or without grad) is copied to
            host memory as float32.
        labels : array-like, shape (n,) or (n, n_labels)
            Class of each row (ints of any size, strings, hashables), or several labels per
            row as a 0/1 indicator array (relevant: shares a label); every batch the same form.
        split : {None, "query", "reference"}
            ``None``: one set evaluated leave-one-out; otherwise the side of a query/gallery
            split.
        indices : array-like of int, optional
            The dataset index of each row: orders the rows and drops repeated ones.
        groups : array-like, optional
            Group ids (camera, sequence, ...): references sharing a query's group are ignored.
        confidences : array-like, optional
            Per-query confidence (not with ``split="reference"``).
        """
        if split not in _SPLITS:
            raise InputError(
                f"split={split!r} is not valid; use None (one set, leave-one-out), 'query' or "
                "'reference'."
                + (suggest(split, ["query", "reference"]) if isinstance(split, str) else "")
            )
        self._check_mode(split)
        if split == "reference" and confidences is not None:
            raise InputError(
                "confidences belong to queries; pass them with split='query' (or split=None), "
                "not with split='reference'."
            )
        x = as_embeddings(host_array(embeddings), "embeddings", allow_empty=True)
        n = x.shape[0]
        if n == 0:  # adds nothing, and must not fix the labels' dtype or form for later batches
            per_row = {"labels": labels, "indices": indices, "groups": groups}
            _check_no_rows({**per_row, "confidences": confidences})
            if split in self._sides:
                self._sides[split].check_width(x)
            return
        arrays = {
            "embeddings": x,
            "labels": as_any_labels(host_array(labels), "labels", length=n, length_of="embeddings"),
            "indices": _as_indices(indices, n),
            "groups": None
            if groups is None
            else as_labels(
                host_array(groups), "groups", length=n, length_of="embeddings", groups=True
            ),
            "confidences": None
            if confidences is None
            else as_vector(
                host_array(confidences), "confidences", length=n, length_of="embeddings"
            ),
        }
        self._sides.setdefault(split, _Side()).append(arrays, split)

    def compute(self) -> EvaluationResult:
        """Evaluate everything accumulated since the last :meth:`reset`.

        A collective call under ``torch.distributed`` (see the class notes).  The result's
        per-query values follow the evaluated order: by ``indices`` when they were given, else
        the order of arrival (rank by rank when distributed).
        """
        sides = {split: side.arrays() for split, side in self._sides.items()}
        dist = active_world()
        if dist is not None:
            sides = _gather_sides(dist, sides)
        if not sides:
            raise InputError(
                "compute() was called before any update() with rows (or only empty batches "
                "were given); there is nothing to evaluate."
            )
        if None in sides and len(sides) > 1:  # only possible when ranks disagree
            raise InputError(
                "some processes called update() with split=None and others with split='query' "
                "/ 'reference'; every rank must accumulate the same kind of evaluation."
            )
        if None not in sides and set(sides) != {"query", "reference"}:
            missing = "reference" if "query" in sides else "query"
            raise InputError(
                f"rows were accumulated with split={next(iter(sides))!r} but none with "
                f"split={missing!r}; a query/gallery evaluation needs both."
            )
        sides = {split: _ordered(arrays) for split, arrays in sides.items()}
        if self._options.get("ref_includes_query") and None not in sides:
            sides["reference"] = _queries_first(sides["query"], sides["reference"])
        return evaluate(**_evaluate_arguments(sides), **self._options)

    # ------------------------------------------------------------------ helpers
    def _check_mode(self, split: str | None) -> None:
        if not self._sides:
            return
        one_set = None in self._sides
        if one_set != (split is None):
            raise InputError(
                f"update(split={split!r}) after updates with split="
                f"{'None' if one_set else repr(next(iter(self._sides)))}: one Evaluator holds "
                "either one set (split=None, leave-one-out) or a query/gallery split; call "
                "reset() or use two Evaluators."
            )


def _common_dtype(a: np.dtype, b: np.dtype) -> Any:
    """A dtype holding both exactly: numpy's promotion, or Python objects where none exists
    (int64 with uint64 would round through float64; numpy would decode bytes into str, making
    the different labels b"a" and "a" one, and would turn numbers into text, making 1 and "1"
    one, where Python objects keep the mix for evaluate to refuse).

    >>> _common_dtype(np.dtype("S1"), np.dtype("U2")), _common_dtype(np.dtype("U1"), np.dtype("U3"))
    (<class 'object'>, dtype('<U3'))
    >>> _common_dtype(np.dtype("U1"), np.dtype("int64"))
    <class 'object'>
    """
    kinds = {a.kind, b.kind}
    if kinds in ({"i", "u"}, {"S", "U"}) or (len(kinds) > 1 and kinds & {"S", "U"}):
        return object
    try:
        return np.result_type(a, b)
    except TypeError:
        return object


def _check_options(options: dict[str, Any]) -> None:
    # The data under evaluate's names (query_labels) and under update's (labels, indices).
    data = set(DATA_ARGUMENTS) | set(inspect.signature(Evaluator.update).parameters) - {"self"}
    allowed = set(inspect.signature(evaluate).parameters) - data
    for name in options:
        if name in data:
            raise InputTypeError(
                f"Evaluator() does not take {name}=; pass the data batch by batch to update()."
            )
        if name not in allowed:
            raise InputTypeError(
                f"Evaluator() got an unexpected keyword argument {name!r}."
                + suggest(name, sorted(allowed))
            )


def _validate_early(options: dict[str, Any]) -> None:
    """Run evaluate's validation stage on the options now, so that a bad ``ci=`` fails when
    the Evaluator is built, not after an epoch of accumulation.  The data arrive later:
    stand-ins say only which arrays the options imply (a gallery for ``ref_includes_query``,
    confidences for ``reject_from="both"``)."""
    flag = options.get("ref_includes_query", False)
    gallery = 0 if isinstance(flag, (bool, np.bool_)) and flag else None
    conf = 0 if options.get("reject_from") == "both" else None
    stand_in = EvaluationInputs(None, None, gallery, gallery, confidences=conf)
    validate_arguments(stand_in, **options)


def _check_no_rows(per_row: dict[str, Any]) -> None:
    """Refuse rows given with an empty batch of embeddings (``None`` means not given).

    >>> _check_no_rows({"labels": [], "groups": None})
    >>> _check_no_rows({"labels": [3]})
    Traceback (most recent call last):
    ...
    embedeval.utils.errors.InputError: labels has 1 row(s) but embeddings has none; pass one \
labels entry per embedding row (none for an empty batch).
    """
    for name, value in per_row.items():
        if value is None:
            continue
        shape = np.shape(host_array(value))
        if not shape or shape[0] != 0:
            rows = f"{shape[0]} row(s)" if shape else "a scalar"
            raise InputError(
                f"{name} has {rows} but embeddings has none; pass one {name} entry per "
                "embedding row (none for an empty batch)."
            )


def _as_indices(indices: Any, n: int) -> np.ndarray | None:
    if indices is None:
        return None
    # Held as int64 so batches of any integer dtype compare: as_int64 refuses a uint64 index
    # that would wrap to a negative one (and collide with another row's), and names an
    # integer beyond 64 bits rather than its object dtype.
    arr = as_int64(host_array(indices), "indices", "Pass dataset positions below 2**63.")
    if arr.ndim != 1 or arr.shape[0] != n:
        raise InputError(
            f"indices must be 1-D with one dataset index per row ({n}); got shape {arr.shape}."
        )
    if arr.dtype.kind not in "iu":
        raise InputTypeError(
            f"indices must be integers (dataset positions); got dtype {arr.dtype}."
        )
    return arr.astype(np.int64)


def _gather_sides(dist: Any, sides: dict[str | None, dict[str, np.ndarray]]) -> dict:
    # The group names appear in the gather's errors ("labels (query rows): ..."): one set
    # evaluated leave-one-out is "all".
    flat = {
        f"{split or 'all'}.{name}": a
        for split, arrays in sides.items()
        for name, a in arrays.items()
    }
    gathered = all_gather_arrays(dist, flat)
    out: dict[str | None, dict[str, np.ndarray]] = {}
    for key, parts in gathered.items():
        split_name, name = key.split(".", 1)
        split = None if split_name == "all" else split_name
        out.setdefault(split, {})[name] = np.concatenate(parts)
    if any("indices" not in arrays for arrays in out.values()):
        warnings.warn(
            "compute() gathered rows from several processes without indices=, so rows that a "
            "DistributedSampler repeats to pad the shards are counted twice; pass the dataset "
            "index of each row to update(indices=...) to drop them.",
            EmbedevalWarning,
            stacklevel=3,
        )
    return out


def _ordered(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Sort rows by dataset index and keep the first row of each index (no-op without)."""
    if "indices" not in arrays:
        return arrays
    _, first = np.unique(arrays["indices"], return_index=True)
    return {name: a[first] for name, a in arrays.items()}


def _queries_first(q: dict[str, np.ndarray], r: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Move the references that are queries (same dataset index) to the front, in query order.

    ``ref_includes_query=True`` means query i is reference row i; sorting both sides by index
    gives that only when the queries hold the smallest indices, so the rows are matched by index.
    """
    if "indices" not in q or "indices" not in r:
        return r
    pos = np.searchsorted(r["indices"], q["indices"])  # both sorted and de-duplicated
    pos = np.minimum(pos, len(r["indices"]) - 1)
    if not np.array_equal(r["indices"][pos], q["indices"]):
        raise InputError(
            "ref_includes_query=True, but some query indices are not among the reference "
            "indices; add every query row to the references too (update(..., "
            "split='reference')) or use ref_includes_query=False."
        )
    order = np.concatenate([pos, np.setdiff1d(np.arange(len(r["indices"])), pos)])
    return {name: a[order] for name, a in r.items()}


def _evaluate_arguments(sides: dict[str | None, dict[str, np.ndarray]]) -> dict[str, Any]:
    if None in sides:
        one = sides[None]
        return {
            "query": one["embeddings"],
            "query_labels": one["labels"],
            "query_groups": one.get("groups"),
            "confidences": one.get("confidences"),
        }
    q, r = sides["query"], sides["reference"]
    if ("groups" in q) != ("groups" in r):
        raise InputError(
            "groups were given for one side of the split only; pass groups with both the "
            "query and the reference batches, or with neither."
        )
    return {
        "query": q["embeddings"],
        "query_labels": q["labels"],
        "reference": r["embeddings"],
        "reference_labels": r["labels"],
        "query_groups": q.get("groups"),
        "reference_groups": r.get("groups"),
        "confidences": q.get("confidences"),
    }
