"""The result of :func:`embedeval.evaluate`: summary, per-query and per-class values, counts."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ._errors import InputError

__all__ = ["EvaluationResult"]

_FORMAT = "embedeval.EvaluationResult/1"


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
        Everything needed to reproduce the run (k, distance, average, metrics, sizes, ...).
    confidence : dict of str to float
        Confidence/uncertainty metrics, when ``confidences=`` was given.
    ci : dict of str to (float, float)
        Bootstrap confidence intervals, when ``ci=`` was given.
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

    def __getitem__(self, name: str) -> float:
        from ._registry import PML_ALIASES

        key = PML_ALIASES.get(name, name)
        if key in self.metrics:
            return float(self.metrics[key])
        if key in self.confidence:
            return float(self.confidence[key])
        raise KeyError(
            f"{name!r} was not computed; available: {', '.join([*self.metrics, *self.confidence])}"
        )

    def __contains__(self, name: object) -> bool:
        return name in self.metrics or name in self.confidence

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with stable keys; NaN becomes ``None``."""
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
            "per_class": {
                m: [[_scalar(lab), _num(v)] for lab, v in table.items()]
                for m, table in self.per_class.items()
            },
            "query_labels": [_scalar(v) for v in self.query_labels.tolist()],
            "per_query": {m: [_num(v) for v in a.tolist()] for m, a in self.per_query.items()},
        }

    def to_json(self, path: str | os.PathLike | None = None, *, indent: int | None = 2) -> str:
        """Serialise to JSON; with ``path``, also write it atomically (temp file + rename)."""
        text = json.dumps(self.to_dict(), indent=indent, allow_nan=False)
        if path is not None:
            _write_atomic(Path(path), text)
        return text

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvaluationResult:
        """Rebuild a result written by :meth:`to_dict`."""
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise InputError(
                "data is not an embedeval result (missing or wrong 'format' key); pass what "
                "EvaluationResult.to_dict() or to_json() produced."
            )
        labels = data["query_labels"]
        return cls(
            metrics={k: _float(v) for k, v in data["metrics"].items()},
            per_query={
                m: np.array([_float(v) for v in a], dtype=np.float64)
                for m, a in data["per_query"].items()
            },
            per_class={
                m: {_key(lab): _float(v) for lab, v in rows}
                for m, rows in data["per_class"].items()
            },
            query_labels=np.array(labels, dtype=object if _mixed(labels) else None),
            n_queries=int(data["n_queries"]),
            n_lone=int(data["n_lone"]),
            n_ties={k: int(v) for k, v in data["n_ties"].items()},
            settings=dict(data["settings"]),
            confidence={k: _float(v) for k, v in data.get("confidence", {}).items()},
            ci={k: (_float(lo), _float(hi)) for k, (lo, hi) in data.get("ci", {}).items()},
            approximation=dict(data.get("approximation", {})),
        )

    @classmethod
    def from_json(cls, source: str | os.PathLike) -> EvaluationResult:
        """Rebuild a result from JSON text or from a path to a JSON file."""
        text = str(source)
        if isinstance(source, os.PathLike) or not text.lstrip().startswith("{"):
            text = Path(source).read_text()
        return cls.from_dict(json.loads(text))

    # ------------------------------------------------------------------ display
    def table(self) -> str:
        """The summary as an aligned text table (metric, value, CI, ties)."""
        rows = [("metric", "value", "95% CI" if self.ci else "", "ties")]
        for name, value in self.metrics.items():
            lo_hi = self.ci.get(name)
            ci = f"[{lo_hi[0]:.4f}, {lo_hi[1]:.4f}]" if lo_hi else ""
            rows.append((name, f"{value:.4f}", ci, str(self.n_ties.get(name, ""))))
        for name, value in self.confidence.items():
            rows.append((name, f"{value:.4f}", "", ""))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
            for row in rows
        ]
        lines.insert(1, "-" * len(lines[0]))
        return "\n".join(lines)

    def __repr__(self) -> str:
        s = self.settings
        head = (
            f"EvaluationResult({self.n_queries} queries, {self.n_lone} lone, "
            f"{s.get('n_reference', '?')} references, distance={s.get('distance')!r}, "
            f"k={s.get('k')!r}, average={s.get('average')!r})"
        )
        return head + "\n" + self.table()


def _num(v: Any) -> float | None:
    v = float(v)
    return None if math.isnan(v) else v


def _float(v: Any) -> float:
    return float("nan") if v is None else float(v)


def _scalar(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def _key(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def _mixed(values: list[Any]) -> bool:
    return len({type(v) for v in values}) > 1 or any(isinstance(v, list) for v in values)


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


def _write_atomic(path: Path, text: str) -> None:
    from ._files import write_text

    write_text(path, text)
