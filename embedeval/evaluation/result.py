"""The result of :func:`embedeval.evaluate`: summary, per-query and per-class values, counts."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..utils.errors import InputError
from ..utils.files import run_stamp, write_text
from .approximation import approximation_lines
from .label_json import label_from_json, label_to_json, labels_from_json, labels_to_json

__all__ = ["EvaluationResult"]

_FORMAT = "embedeval.EvaluationResult/1"


def _canonical(name: object) -> object:
    from ..engine.registry import PML_ALIASES

    return PML_ALIASES.get(name, name) if isinstance(name, str) else name


@dataclass
class EvaluationResult:
    """Metrics of one embedding set, with the per-query values they were averaged from.

    Attributes
    ----------
    metrics : dict of str to float
        One number per metric (NaN when every query is lone).
    per_query : dict of str to ndarray
        float64 values aligned with the queries; NaN for lone queries.  NMI/AMI have none.
    per_class : dict of str to dict
        Metric -> {label: mean over that class's non-lone queries}, keyed by the caller's labels.
    query_labels : ndarray
        The query labels as given (aligned with ``per_query``).
    n_queries, n_lone : int
        Queries evaluated, and those left out because no other member of their class is among
        the references.
    n_ties : dict of str to int
        Queries whose value could change under another ordering of equally distant references.
    settings : dict
        Everything needed to reproduce the run (k, distance, average, metrics, sizes, ...), the
        search ``backend`` that ran it, and with ``backend="torch"`` its record under
        ``"torch"`` (device, filter precision, engine, where blocks were decided in float64,
        blocks per product).  ``"lower_is_better"`` lists the custom metrics declared with
        ``higher_is_better=False`` (absent when there are none).
    confidence : dict of str to float
        Confidence/uncertainty metrics, when ``confidences=`` was given.
    ci : dict of str to (float, float)
        Bootstrap confidence intervals, when ``ci=`` was given.
    query_confidences : ndarray or None
        The per-query confidences given to ``evaluate(confidences=...)`` (so :func:`compare`
        can bootstrap the confidence metrics); None without them.
    approximation : dict
        With an approximate ``index=``: the kNN recall against exact search and every metric
        both ways on a random sample of queries (see :func:`embedeval.evaluate`).

    Examples
    --------
    >>> import embedeval as ee
    >>> res = ee.evaluate([[0.0], [0.1], [1.0], [1.1]], [0, 0, 1, 1], metrics=["map_at_r"])
    >>> res["map_at_r"]
    1.0
    """

    metrics: dict[str, float]
    per_query: dict[str, np.ndarray]
    per_class: dict[str, dict[Any, float]]
    query_labels: np.ndarray
    n_queries: int
    n_lone: int
    n_ties: dict[str, int]
    settings: dict[str, Any]
    confidence: dict[str, float] = field(default_factory=dict)
    ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    approximation: dict[str, Any] = field(default_factory=dict)
    query_confidences: np.ndarray | None = None
    provenance: dict[str, Any] = field(default_factory=run_stamp)

    # ------------------------------------------------------------------ the dict interface
    # Like the dict PML's AccuracyCalculator returns: keys() are the metric and confidence
    # names, so dict(res), {**res}, `name in res` and res[name] agree (PML spellings too).
    def __getitem__(self, name: str) -> float:
        key = _canonical(name)
        if key in self.metrics:
            return float(self.metrics[key])
        if key in self.confidence:
            return float(self.confidence[key])
        raise KeyError(
            f"{name!r} was not computed; available: {', '.join([*self.metrics, *self.confidence])}"
        )

    def __contains__(self, name: object) -> bool:
        key = _canonical(name)
        return key in self.metrics or key in self.confidence

    def keys(self) -> list[str]:
        """The metric names, then the confidence-metric names (``dict(res)`` uses them)."""
        return [*self.metrics, *self.confidence]

    def values(self) -> list[float]:
        return [self[k] for k in self.keys()]

    def items(self) -> list[tuple[str, float]]:
        return [(k, self[k]) for k in self.keys()]

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.metrics) + len(self.confidence)

    def __bool__(self) -> bool:  # a result is a result even when it holds no metric
        return True

    def cmc(self, max_rank: int = 50) -> np.ndarray:
        """Cumulative match characteristic: ``cmc[r - 1]`` = fraction of non-lone queries whose
        first relevant reference is within the first r, for r = 1..max_rank.

        Read from the per-query reciprocal ranks, so ``"mrr"`` must be among the metrics; the
        mean is over queries (micro) whatever ``average`` was.  ``cmc[0]`` equals Precision@1
        and ``cmc[r - 1]`` equals ``recall_at_{r}``.

        Examples
        --------
        >>> import embedeval as ee
        >>> res = ee.evaluate([[0.0], [0.1], [0.3], [1.0], [1.1]], [0, 0, 1, 1, 0],
        ...                   metrics=["mrr"])
        >>> res.cmc(3).tolist()  # first relevant at ranks 1, 1, 3, 2, 3
        [0.4, 0.6, 1.0]
        """
        from ..utils.validation import check_int

        max_rank = check_int(max_rank, "max_rank")
        if "mrr" not in self.per_query:
            raise InputError(
                "cmc() reads the rank of each query's first relevant reference from the "
                "per-query MRR; evaluate again with 'mrr' among the metrics."
            )
        k = self.settings.get("k_used")
        if isinstance(k, int) and max_rank > k:
            raise InputError(
                f"max_rank={max_rank} is deeper than the ranking that was read (k={k}); "
                f"use max_rank <= {k}, or evaluate with k=None."
            )
        rr = self.per_query["mrr"]
        rr = rr[~np.isnan(rr)]
        if not rr.size:
            raise InputError(
                "cmc() has no query to average: every query is lone (no relevant reference it "
                "may see, e.g. every match of a re-id query is in its own camera)."
            )
        with np.errstate(divide="ignore"):
            first = np.where(rr > 0, np.rint(1.0 / rr), np.inf)
        ranks = np.arange(1, max_rank + 1)
        return (first[None, :] <= ranks[:, None]).mean(axis=1)

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with stable keys; NaN becomes ``None``; labels JSON lacks (bytes,
        tuples, dates) become one-key objects (:mod:`embedeval.evaluation.label_json`)."""
        labels, dtype = labels_to_json(self.query_labels)
        return {
            "format": _FORMAT,
            "metrics": {k: _num(v) for k, v in self.metrics.items()},
            "ci": {k: [_num(lo), _num(hi)] for k, (lo, hi) in self.ci.items()},
            "confidence": {k: _num(v) for k, v in self.confidence.items()},
            "n_queries": int(self.n_queries),
            "n_lone": int(self.n_lone),
            "n_ties": {k: int(v) for k, v in self.n_ties.items()},
            "settings": _jsonable(self.settings),
            "approximation": _jsonable(self.approximation),
            "provenance": _jsonable(self.provenance),
            "per_class": {
                m: [[label_to_json(lab), _num(v)] for lab, v in table.items()]
                for m, table in self.per_class.items()
            },
            "query_labels": labels,
            **({} if dtype is None else {"query_labels_dtype": dtype}),
            "per_query": {m: [_num(v) for v in a.tolist()] for m, a in self.per_query.items()},
            **(
                {}
                if self.query_confidences is None
                else {"query_confidences": [_num(v) for v in self.query_confidences.tolist()]}
            ),
        }

    def to_json(self, path: str | os.PathLike | None = None, *, indent: int | None = 2) -> str:
        """Serialise to JSON; with ``path``, also write it atomically (temp file + rename)."""
        text = json.dumps(self.to_dict(), indent=indent, allow_nan=False)
        if path is not None:
            write_text(Path(path), text)
        return text

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvaluationResult:
        """Rebuild a result written by :meth:`to_dict`.

        Raises :class:`~embedeval.utils.errors.InputError` when ``data`` is not such a dict: a wrong
        or missing ``format`` tag, missing keys, values of the wrong type, or per-query lists
        that are not aligned with ``query_labels``.
        """
        _check_result_dict(data)
        labels = data["query_labels"]
        label_dtype = data.get("query_labels_dtype")
        multi = bool(data["settings"].get("multi_label"))
        try:
            return cls(
                metrics={k: _float(v) for k, v in data["metrics"].items()},
                per_query={
                    m: np.array([_float(v) for v in a], dtype=np.float64)
                    for m, a in data["per_query"].items()
                },
                per_class={
                    m: {label_from_json(lab): _float(v) for lab, v in rows}
                    for m, rows in data["per_class"].items()
                },
                query_labels=labels_from_json(labels, label_dtype, multi),
                n_queries=int(data["n_queries"]),
                n_lone=int(data["n_lone"]),
                n_ties={k: int(v) for k, v in data["n_ties"].items()},
                settings=dict(data["settings"]),
                confidence={k: _float(v) for k, v in data.get("confidence", {}).items()},
                ci={k: (_float(lo), _float(hi)) for k, (lo, hi) in data.get("ci", {}).items()},
                query_confidences=(
                    None
                    if data.get("query_confidences") is None
                    else np.array([_float(v) for v in data["query_confidences"]])
                ),
                approximation=dict(data.get("approximation", {})),
                provenance=dict(data.get("provenance", {})),
            )
        except (TypeError, ValueError) as exc:  # a value of the wrong kind deeper down
            raise InputError(
                f"data is not a valid embedeval result: a value has the wrong type ({exc}). "
                "Pass what EvaluationResult.to_dict() or to_json() produced, unedited."
            ) from exc

    @classmethod
    def from_json(cls, source: str | os.PathLike) -> EvaluationResult:
        """Rebuild a result from JSON text or from a path to a JSON file.

        Raises :class:`~embedeval.utils.errors.InputError` when the text is not valid JSON (a
        truncated file, say) or not a result (see :meth:`from_dict`), and ``FileNotFoundError``
        for a path that does not exist.
        """
        text = str(source)
        where = "source"
        if isinstance(source, os.PathLike) or not text.lstrip().startswith("{"):
            where = f"source file {str(source)!r}"
            try:
                text = Path(source).read_text(encoding="utf-8")  # as to_json writes it
            except UnicodeDecodeError as exc:
                raise InputError(
                    f"{where} is not UTF-8 text (byte {exc.start} cannot be decoded), so not "
                    "a result written by EvaluationResult.to_json(); pass that JSON file."
                ) from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"{where} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}, "
                f"{len(text)} characters in all); EvaluationResult.to_json() writes complete "
                "JSON, so this text was truncated or edited: write it again with to_json()."
            ) from exc
        return cls.from_dict(data)

    def to_log_dict(self, prefix: str = "") -> dict[str, float]:
        """Flat ``{prefix + name: float}`` for TensorBoard, Weights & Biases or Lightning.

        Holds every metric, every confidence metric and, when ``ci=`` was given, the interval
        bounds as ``<name>_ci_low`` / ``<name>_ci_high``.  NaN stays NaN.

        Examples
        --------
        >>> import embedeval as ee
        >>> res = ee.evaluate([[0.0], [0.1], [1.0], [1.1]], [0, 0, 1, 1], metrics=["map_at_r"])
        >>> res.to_log_dict(prefix="val/")
        {'val/map_at_r': 1.0}
        """
        out = {f"{prefix}{name}": float(v) for name, v in self.metrics.items()}
        out.update({f"{prefix}{name}": float(v) for name, v in self.confidence.items()})
        for name, (lo, hi) in self.ci.items():
            out[f"{prefix}{name}_ci_low"] = float(lo)
            out[f"{prefix}{name}_ci_high"] = float(hi)
        return out

    def to_html(
        self,
        path: str | os.PathLike,
        *,
        query: Any = None,
        reference: Any = None,
        reference_labels: Any = None,
        query_groups: Any = None,
        reference_groups: Any = None,
        images: Any = None,
        reference_images: Any = None,
        texts: Any = None,
        reference_texts: Any = None,
        gallery: int = 20,
        gallery_metric: str | None = None,
        gallery_k: int = 5,
        thumbnail: int = 64,
        figures: bool = True,
        title: str | None = None,
    ) -> Path:
        """Write one self-contained HTML page of this result (atomically); returns the path.

        The page shows what was evaluated (sizes, every setting, version, time, input files),
        the metrics with their intervals and tie counts, an approximate run's error report,
        the per-class table (worst first, sortable), the figures of the run and the failure
        gallery.  It references no network address: CSS, figures and thumbnails are inline.

        The result keeps numbers, not embeddings: pass the arrays given to
        :func:`embedeval.evaluate` (``query``, and ``reference``, ``reference_labels`` and the
        groups when the run had them; the query labels and confidences are the result's own)
        to add the distance histograms, the k sweep and the gallery.  Without ``query`` the
        page has the numbers, the per-class figure and the confidence figures.

        Parameters
        ----------
        images, reference_images : sequence of paths or arrays, optional
            One image per query / reference row, shown downscaled (``thumbnail`` pixels, with
            Pillow) in the gallery: a file path, or the pixels (H x W grey or H x W x 3, integer
            levels 0..255 or floats in [0, 1]).  An unreadable file becomes a placeholder and one
            :class:`~embedeval.utils.errors.EmbedevalWarning`.  Leave-one-out: ``images`` serves
            both.
        texts, reference_texts : sequence of str, optional
            A caption per row instead of (or beside) images.
        gallery : int
            Queries per gallery table: the ``gallery`` worst by ``gallery_metric`` (default:
            MAP@R, else R-Precision, else P@1) and, with confidences, the ``gallery`` most
            confident errors (top-1 not relevant).  Worst is lowest, or highest for a custom
            metric declared ``higher_is_better=False``.  0 leaves the gallery out.
        gallery_k : int
            References shown per query (its nearest that count, from the exact engine with the
            run's exclusions); the rank of the first relevant one is shown when deeper.
        figures : bool
            False leaves the figures out (faster, smaller).

        Examples
        --------
        >>> import embedeval as ee, tempfile, os
        >>> x, y = [[0.0], [0.1], [1.0], [1.2]], [0, 0, 1, 1]
        >>> res = ee.evaluate(x, y, progress=False)
        >>> out = res.to_html(os.path.join(tempfile.mkdtemp(), "run.html"), query=x, figures=False)
        >>> "<table" in out.read_text(encoding="utf-8")
        True
        """
        from .html import evaluation_html, write_html

        inputs = self._html_inputs(
            query, reference, reference_labels, query_groups, reference_groups
        )
        page = evaluation_html(
            self,
            inputs,
            images=images,
            reference_images=reference_images,
            texts=texts,
            reference_texts=reference_texts,
            gallery=gallery,
            gallery_metric=gallery_metric,
            gallery_k=gallery_k,
            thumbnail=thumbnail,
            figures=figures,
            title=title,
        )
        return write_html(path, page)

    def _html_inputs(
        self, query: Any, reference: Any, reference_labels: Any, query_groups: Any, ref_groups: Any
    ) -> dict[str, Any] | None:
        """The evaluation's inputs for the page, checked against this result's sizes."""
        if query is None:
            if reference is not None:
                raise InputError("reference= needs query= too (the gallery searches from it).")
            return None
        if "relevance" in self.settings:
            raise InputError(
                "this result was evaluated with positives=/junk= lists, not labels: its page "
                "has no gallery nor distance figures. Call to_html(path) without query=."
            )
        n = len(query)
        if n != self.n_queries:
            raise InputError(
                f"query has {n} rows but this result has {self.n_queries} queries; pass the "
                "query embeddings that were evaluated."
            )
        loo = bool(self.settings.get("leave_one_out", reference is None))
        if loo != (reference is None) or (reference is not None and reference_labels is None):
            raise InputError(
                "reference= and reference_labels= must be given exactly when the evaluation had "
                f"a reference set (this one {'did not' if loo else 'did'})."
            )
        _check_evaluated(self.settings, query, reference, query_groups is not None)
        return {
            "query": query,
            "query_labels": self.query_labels,
            "reference": reference,
            "reference_labels": reference_labels,
            "ref_includes_query": bool(self.settings.get("ref_includes_query", False)),
            "query_groups": query_groups,
            "reference_groups": ref_groups,
            "confidences": self.query_confidences,
        }

    # ------------------------------------------------------------------ display
    def table(self) -> str:
        """The summary as an aligned text table (metric, value, CI, ties)."""
        level = self.settings.get("ci") or 0.95
        rows = [("metric", "value", f"{level * 100:g}% CI" if self.ci else "", "ties")]
        for name, value in self.metrics.items():
            lo_hi = self.ci.get(name)
            ci = f"[{lo_hi[0]:.4f}, {lo_hi[1]:.4f}]" if lo_hi else ""
            rows.append((name, f"{value:.4f}", ci, str(self.n_ties.get(name, ""))))
        areas, scalars = self._confidence_rows(level)
        lines = _aligned(rows)
        if areas:
            lines += ["", "error-reject areas (lower is better)", *_aligned(areas)]
        if scalars:
            lines += ["", *_aligned(scalars)]
        return "\n".join(lines + approximation_lines(self.approximation))

    def _confidence_rows(self, level: float) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
        """The confidence metrics as two tables: one row per metric of its error-reject areas,
        then the other confidence metrics (R-AUROC, ECE, ...) with their intervals."""
        names = [m for m in self.per_query if f"auerc_{m}" in self.confidence]
        shown = {f"{a}_{m}" for a in _AREAS for m in names if f"{a}_{m}" in self.confidence}
        areas = [("metric", *(_AREA_TITLES[a] for a in _AREAS))] if names else []
        for m in names:
            cells = [self.confidence.get(f"{a}_{m}") for a in _AREAS]
            areas.append((m, *("" if v is None else f"{v:.4f}" for v in cells)))
        ci_title = f"{level * 100:g}% CI" if self.ci else ""
        scalars = [("confidence metric", "value", ci_title)]
        for name, value in self.confidence.items():
            if name not in shown:
                lo_hi = self.ci.get(name)
                ci = f"[{lo_hi[0]:.4f}, {lo_hi[1]:.4f}]" if lo_hi else ""
                scalars.append((name, f"{value:.4f}", ci))
        return areas, scalars if len(scalars) > 1 else []

    def __repr__(self) -> str:
        s = self.settings
        head = (
            f"EvaluationResult({'APPROXIMATE, ' if self.approximation else ''}"
            f"{self.n_queries} queries, {self.n_lone} lone, "
            f"{s.get('n_reference', '?')} references, distance={s.get('distance')!r}, "
            f"k={s.get('k')!r}, average={s.get('average')!r})"
        )
        return head + "\n" + self.table()


_AREAS = ("auerc", "oracle_auerc", "random_auerc", "excess_auerc", "aurc", "eaurc", "augrc")
_AREA_TITLES = {
    "auerc": "AUERC",
    "oracle_auerc": "oracle",
    "random_auerc": "random",
    "excess_auerc": "excess",
    "aurc": "AURC",
    "eaurc": "E-AURC",
    "augrc": "AUGRC",
}


def _aligned(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows of cells as text lines: the first column left-aligned, the others right-aligned,
    a rule under the header row."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    return lines


#: Keys every result dict has, with the JSON type of their value.
_REQUIRED = {
    "metrics": dict,
    "per_query": dict,
    "per_class": dict,
    "query_labels": list,
    "n_queries": int,
    "n_lone": int,
    "n_ties": dict,
    "settings": dict,
}
_OPTIONAL = {
    "ci": dict,
    "confidence": dict,
    "approximation": dict,
    "query_confidences": list,
    "provenance": dict,
    "query_labels_dtype": str,
}
_KIND = {
    dict: "a dict (JSON object)",
    list: "a list (JSON array)",
    int: "an integer",
    str: "a string",
}


def _check_result_dict(data: Any) -> None:
    """Raise InputError unless ``data`` has the shape :meth:`EvaluationResult.to_dict` gives."""
    fix = "Pass what EvaluationResult.to_dict() or to_json() produced."
    if not isinstance(data, dict):
        raise InputError(
            f"data is not an embedeval result: expected a dict, got {type(data).__name__}. {fix}"
        )
    if data.get("format") != _FORMAT:
        found = f"'format' is {data['format']!r}" if "format" in data else "no 'format' key"
        raise InputError(
            f"data is not an embedeval result (missing or wrong 'format' key: {found}, expected "
            f"{_FORMAT!r}). {fix}"
        )
    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise InputError(
            f"data is an incomplete embedeval result: missing key(s) {', '.join(missing)}. {fix}"
        )
    for key, kind in [*_REQUIRED.items(), *_OPTIONAL.items()]:
        value = data.get(key, kind())
        # bool is an int subclass in Python, never a count here.
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise InputError(
                f"data[{key!r}] must be {_KIND[kind]}; got {type(value).__name__} "
                f"({_short(value)}). {fix}"
            )
    n = len(data["query_labels"])
    if "query_confidences" in data and len(data["query_confidences"]) != n:
        raise InputError(
            f"data['query_confidences'] must be aligned with query_labels ({n} labels); got "
            f"{len(data['query_confidences'])} values. {fix}"
        )
    for name, values in data["per_query"].items():
        if not isinstance(values, list) or len(values) != n:
            got = f"{len(values)} values" if isinstance(values, list) else type(values).__name__
            raise InputError(
                f"data['per_query'][{name!r}] must be a list aligned with query_labels "
                f"({n} labels); got {got}. The result was edited or assembled from different "
                f"runs. {fix}"
            )
        _check_value_range(name, values, fix)


def _check_value_range(name: str, values: list[Any], fix: str) -> None:
    """A built-in metric's saved per-query values lie in its registry ``value_range``."""
    from ..engine.registry import METRICS

    if name not in METRICS:  # a custom metric: its range is not saved
        return
    low, high = METRICS[name].value_range
    outside = [v for v in values if isinstance(v, (int, float)) and not low <= v <= high]
    if outside:
        raise InputError(
            f"data['per_query'][{name!r}] holds {outside[0]!r}, outside the range of {name} "
            f"[{low}, {high}]; the result was edited or damaged. {fix}"
        )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _num(v: Any) -> float | None:
    v = float(v)
    return None if math.isnan(v) else v


def _float(v: Any) -> float:
    return float("nan") if v is None else float(v)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and math.isnan(obj):
        return None
    return obj


def _check_evaluated(settings: dict[str, Any], query: Any, reference: Any, groups: bool) -> None:
    """Refuse page inputs that cannot be those evaluated: the gallery, the k sweep and the
    histograms search the arrays given, so a reference set of another size, another dimension
    or groups the run did not have (or lacked) would show another ranking than the metrics'.
    Settings a result does not record (an older file) are not checked."""
    n_ref, dim, grouped = (settings.get(k) for k in ("n_reference", "dim", "groups"))
    if reference is not None and n_ref is not None and len(reference) != n_ref:
        raise InputError(
            f"reference has {len(reference)} rows but this result was evaluated against "
            f"{n_ref}; pass the reference embeddings that were evaluated."
        )
    width = np.shape(query)[1] if np.ndim(query) == 2 else None
    if dim is not None and width is not None and width != dim:
        raise InputError(
            f"query has dimension {width} but this result was evaluated in dimension {dim}; "
            "pass the embeddings that were evaluated."
        )
    if grouped is not None and bool(grouped) != groups:
        raise InputError(
            "this result was evaluated with groups: pass its query_groups= (and "
            "reference_groups=), so the gallery excludes the references the run excluded."
            if grouped
            else "this result was evaluated without groups: drop query_groups= / "
            "reference_groups=, which would exclude references the run ranked."
        )
