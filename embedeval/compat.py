"""Drop-in replacements for other libraries' evaluation entry points.

:class:`AccuracyCalculator` takes pytorch-metric-learning 2.9's constructor and
``get_accuracy`` call and returns the same dict, computed by :func:`embedeval.evaluate`, so a PML
user switches by changing one import::

    # from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
    from embedeval.compat import AccuracyCalculator

The numbers equal PML's wherever PML is right.  Where it is not, the shim gives the right
number: an int ``k`` larger than the reference set (PML's faiss search pads with index -1, which
reads the last reference's label), integer labels of 2**24 or more (PML casts labels to float32,
merging neighbouring ids), and ties between equally distant references (ranked by ascending
reference index here, in faiss's order there, which can differ).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .evaluation.evaluate import evaluate
from .utils.errors import EmbedevalWarning, InputError, InputTypeError
from .utils.validation import host_array

__all__ = ["AccuracyCalculator", "UnsupportedCombination"]

#: PML's metric names and embedeval's keys, in the order PML's dict lists them.
PML_METRICS = {
    "AMI": "ami",
    "NMI": "nmi",
    "mean_average_precision": "map",
    "mean_average_precision_at_r": "map_at_r",
    "mean_reciprocal_rank": "mrr",
    "precision_at_1": "precision_at_1",
    "r_precision": "r_precision",
}
_CLUSTERING = ("AMI", "NMI")


class UnsupportedCombination(InputError, NotImplementedError):
    """A combination of options PML itself refuses with ``NotImplementedError``."""


class AccuracyCalculator:
    """pytorch-metric-learning 2.9's ``AccuracyCalculator``, computed by embedeval.

    Parameters
    ----------
    include, exclude : tuple of str
        PML metric names to compute / leave out (default: all seven: ``AMI``, ``NMI``,
        ``mean_average_precision``, ``mean_average_precision_at_r``, ``mean_reciprocal_rank``,
        ``precision_at_1``, ``r_precision``).
    avg_of_avgs : bool
        Average per class, then over classes (``average="macro"``).
    return_per_class : bool
        Each retrieval metric becomes a list of per-class values, classes in ascending label
        order (NMI/AMI stay scalars, as in PML).
    k : None, int or "max_bin_count"
        As in PML: ``None`` ranks every reference, an int caps the ranking at depth k,
        ``"max_bin_count"`` at the largest class size.
    label_comparison_fn : callable, optional
        PML's custom label comparison ``fn(a, b) -> bool tensor``.  Supported when it splits
        the labels into classes (comparing one column of multi-column labels, floats within
        clusters, even a relation that never matches a label with itself on a query/gallery
        split): the classes are read off it once per call.  A relation that does not define
        classes raises an error.
    device : optional
        Accepted for compatibility; the evaluation runs on the CPU.
    knn_func, kmeans_func : optional
        Ignored with a warning: the search is embedeval's exact engine and the clustering is
        PML's default recipe (faiss k-means, 20 iterations, seed 1234).

    Examples
    --------
    >>> import numpy as np
    >>> calc = AccuracyCalculator(include=("precision_at_1", "r_precision"))
    >>> x = np.array([[0.0], [0.1], [1.0], [1.1]], dtype=np.float32)
    >>> calc.get_accuracy(x, np.array([0, 0, 1, 1]))
    {'precision_at_1': 1.0, 'r_precision': 1.0}
    """

    def __init__(
        self,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        avg_of_avgs: bool = False,
        return_per_class: bool = False,
        k: int | str | None = None,
        label_comparison_fn: Callable[[Any, Any], Any] | None = None,
        device: Any = None,
        knn_func: Any = None,
        kmeans_func: Any = None,
    ) -> None:
        self.metrics = _select(tuple(PML_METRICS), include, exclude)
        if avg_of_avgs and return_per_class:
            raise InputError("avg_of_avgs and return_per_class are mutually exclusive (as in PML).")
        if not (
            (isinstance(k, int) and not isinstance(k, bool) and k > 0)
            or k in (None, "max_bin_count")
        ):
            raise InputError(
                f"k must be an integer greater than 0, None or 'max_bin_count'; got {k!r}."
            )
        if label_comparison_fn is not None and any(m in _CLUSTERING for m in self.metrics):
            raise UnsupportedCombination(
                "a custom label_comparison_fn cannot be combined with NMI/AMI (as in PML); "
                "exclude=('NMI', 'AMI')."
            )
        for name, value in (("knn_func", knn_func), ("kmeans_func", kmeans_func)):
            if value is not None:
                warnings.warn(
                    f"{name} is ignored: embedeval searches exactly with its own engine and "
                    "clusters with PML's default faiss k-means.",
                    EmbedevalWarning,
                    stacklevel=2,
                )
        self.avg_of_avgs = bool(avg_of_avgs)
        self.return_per_class = bool(return_per_class)
        self.k = k
        self.label_comparison_fn = label_comparison_fn
        self.device = device

    def get_curr_metrics(self) -> list[str]:
        """The PML metric names this calculator computes."""
        return list(self.metrics)

    def get_accuracy(
        self,
        query: Any,
        query_labels: Any,
        reference: Any = None,
        reference_labels: Any = None,
        ref_includes_query: bool = False,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
    ) -> dict[str, Any]:
        """PML's ``get_accuracy``: a dict from PML metric name to value.

        ``reference=None`` evaluates the queries leave-one-out (PML: the reference is the query
        set, each query excluded from its own neighbours).  ``include`` / ``exclude`` narrow the
        constructor's metrics for this call.
        """
        _check_names(include, "include")
        _check_names(exclude, "exclude")
        names = [m for m in self.metrics if (not include or m in include) and m not in exclude]
        yq, yr = (
            _labels(query_labels),
            None if reference_labels is None else _labels(reference_labels),
        )
        if self.label_comparison_fn is not None:
            yq, yr = _classes_from_comparison(self.label_comparison_fn, yq, yr)
        else:
            yq, yr = _float_classes(yq, yr)
        result = evaluate(
            host_array(query),
            yq,
            None if reference is None else host_array(reference),
            yr,
            metrics=[PML_METRICS[m] for m in names] or None,
            k=self.k,
            ref_includes_query=bool(ref_includes_query) and reference is not None,
            average="macro" if self.avg_of_avgs else "micro",
        )
        return {m: self._value(result, m) for m in names}

    def _value(self, result: Any, pml_name: str) -> Any:
        key = PML_METRICS[pml_name]
        if not self.return_per_class or pml_name in _CLUSTERING:
            return float(result.metrics[key])
        table = result.per_class.get(key, {})
        return [value for _, value in sorted(table.items(), key=lambda kv: kv[0])]


def _check_names(names: Sequence[str], argument: str) -> None:
    if not isinstance(names, (tuple, list)):
        raise InputTypeError(f"{argument} must be a tuple or list of metric names; got {names!r}.")
    unknown = [n for n in names if n not in PML_METRICS]
    if unknown:
        raise InputError(
            f"{argument} has unknown metric(s) {unknown}; PML's names are {', '.join(PML_METRICS)}."
        )


def _select(all_names: tuple[str, ...], include: Sequence[str], exclude: Sequence[str]) -> tuple:
    _check_names(include, "include")
    _check_names(exclude, "exclude")
    chosen = include or all_names
    return tuple(m for m in all_names if m in chosen and m not in exclude)


def _labels(labels: Any) -> np.ndarray:
    """Labels as given; multi-column labels (PML compares every column) become row tuples."""
    arr = np.asarray(host_array(labels))
    if arr.ndim == 2 and arr.shape[1] > 1:
        rows = np.empty(arr.shape[0], dtype=object)
        rows[:] = [tuple(r) for r in arr.tolist()]
        return rows
    return arr


def _float_classes(yq: np.ndarray, yr: np.ndarray | None) -> tuple[np.ndarray, Any]:
    """Float labels (PML compares them with ``==``, e.g. 0.5 vs 1.5) as integer class codes.

    embedeval takes class ids, not fractions; codes in ascending label order keep the classes
    and their order (``return_per_class``).  Both sides are coded together so a query's class
    is the same code in the reference.
    """
    if yq.dtype.kind != "f" and (yr is None or yr.dtype.kind != "f"):
        return yq, yr
    both = yq if yr is None else np.concatenate([yq, yr])
    _, codes = np.unique(both, return_inverse=True)
    codes = codes.reshape(-1)
    return codes[: len(yq)], None if yr is None else codes[len(yq) :]


def _classes_from_comparison(
    fn: Callable[[Any, Any], Any], yq: np.ndarray, yr: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Turn a label comparison function into class codes the exact engine can use.

    The function is called as PML calls it: one query label (a batch of one) against every
    distinct reference label.  A query/reference split works whenever the reference labels a
    query label matches form the same group for every query label that matches any of them
    (the groups do not overlap): each group becomes a class, the query labels take their
    group's class, and labels matching nothing get classes of their own (lone).  Equality of
    one column, closeness of floats within clusters, and relations that never match a label
    with itself qualify.  Leave-one-out needs a relation that also matches every label with
    itself, since each item is then a query and a reference at once.
    """
    ref = yq if yr is None else yr
    uq, ur = _unique_rows(yq), _unique_rows(ref)
    match = _match_matrix(fn, uq, ur)
    groups, group_of_query = np.unique(match, axis=0, return_inverse=True)
    group_of_query = group_of_query.reshape(-1)
    members = groups.sum(axis=0)  # how many distinct groups hold each reference label
    if (members > 1).any():
        raise InputError(
            "label_comparison_fn matches some reference label with query labels that match "
            "different sets of reference labels, so it does not split the labels into classes "
            "that exact retrieval metrics can use."
        )
    n_groups = groups.shape[0]
    ref_class = np.where(members == 1, np.argmax(groups, axis=0), n_groups + np.arange(len(ur)))
    empty = ~groups.any(axis=1)
    query_class = np.where(
        empty[group_of_query], n_groups + len(ur) + np.arange(len(uq)), group_of_query
    )
    code_q = dict(zip(uq, query_class.tolist(), strict=True))
    code_r = dict(zip(ur, ref_class.tolist(), strict=True))
    q = np.fromiter((code_q[v] for v in yq.tolist()), dtype=np.int64, count=len(yq))
    if yr is None:
        if any(code_q[v] != code_r[v] for v in uq):
            raise InputError(
                "label_comparison_fn does not match every label with itself, so leave-one-out "
                "(reference=None) cannot tell a query's class; pass the gallery as reference."
            )
        return q, None
    return q, np.fromiter((code_r[v] for v in yr.tolist()), dtype=np.int64, count=len(yr))


def _match_matrix(fn: Callable[[Any, Any], Any], uq: list[Any], ur: list[Any]) -> np.ndarray:
    """fn(query label, every reference label) for every distinct query label, as booleans."""
    import torch

    def tensor(labels: list[Any]) -> Any:
        return torch.as_tensor(np.array([list(u) if isinstance(u, tuple) else u for u in labels]))

    tq, tr = tensor(uq), tensor(ur)
    rows = [np.asarray(fn(tq[i : i + 1], tr)).reshape(-1) for i in range(len(uq))]
    return np.stack(rows).astype(bool)


def _unique_rows(labels: np.ndarray) -> list[Any]:
    seen: dict[Any, None] = {}
    for v in labels.tolist():
        seen.setdefault(v, None)
    return list(seen)
