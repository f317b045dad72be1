"""Bootstrap confidence intervals and paired comparison of checkpoints.

``bootstrap_ci`` gives percentile intervals for every metric of one result: queries are resampled
with replacement for ``average="micro"``; whole classes are resampled for ``"macro"`` (the
statistic is a mean over classes, so classes are the sampling unit).  ``compare`` puts several
results on the same queries side by side, with the difference to a baseline, a paired bootstrap
interval of that difference (the same resampled queries for both runs) and a two-sided p-value
from a paired bootstrap or a sign-flip permutation test.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..metrics.confidence import summary_arrays, summary_statistic
from ..metrics.resample import (
    EXACT_SIGN_FLIP_UNITS,
    bootstrap_p,
    draw_indices,
    percentile_interval,
    permutation_p,
    resampled_means,
)
from ..utils.errors import InputError, InputTypeError
from ..utils.files import write_text
from ..utils.progress import progress_bar
from ..utils.tables import markdown_table
from ..utils.validation import (
    as_label_indicator,
    as_labels,
    as_vector,
    check_choice,
    check_int,
    check_level,
    factorize,
    is_label_indicator,
    label_text,
    single_labels,
    suggest,
)

__all__ = ["Comparison", "bootstrap_ci", "compare"]


def bootstrap_ci(
    per_query: Mapping[str, Any] | Any,
    *,
    labels: Any = None,
    average: str | None = None,
    ci: float = 0.95,
    n_boot: int = 1000,
    seed: int = 0,
    metrics: Sequence[str] | None = None,
    progress: bool | None = False,
) -> dict[str, tuple[float, float]]:
    """Percentile bootstrap confidence intervals of per-query metric means.

    Parameters
    ----------
    per_query : dict of str to array, or EvaluationResult
        Per-query values (NaN = lone query, left out).  An ``EvaluationResult`` brings its own
        labels and averaging.
    labels : array-like, optional
        Query labels; required for ``average="macro"``.  Given with an ``EvaluationResult``,
        they replace its query labels.
    average : {"micro", "macro"}, optional
        Resample queries (micro) or classes (macro: the statistic is the mean of class means).
        Default: the result's own averaging for an ``EvaluationResult``, else ``"micro"``.  An
        ``EvaluationResult``'s intervals are those of the metrics it reports, so an ``average``
        other than its own is refused; pass ``result.per_query`` with ``labels=`` to resample
        another statistic.
    ci : float
        Confidence level, e.g. 0.95 -> the 2.5th and 97.5th percentiles of the replicates.
    n_boot : int
        Number of bootstrap resamples.
    seed : int
        Seed of ``numpy.random.default_rng``; results are reproducible.
    metrics : str or sequence of str, optional
        Which metrics (default: every key of ``per_query``).
    progress : bool, optional
        Show the resampling's own progress bar (``None``: only on a terminal).

    Returns
    -------
    dict of str to (low, high)

    Notes
    -----
    Micro: with the n non-lone values v_1..v_n, replicate b draws n indices uniformly with
    replacement and computes theta*_b = (1/n) sum_i c_bi v_i (c_bi = times query i was drawn).
    Macro: with the C class means m_c (over each class's non-lone queries), replicate b draws C
    classes with replacement and computes theta*_b = (1/C) sum_c c_bc m_c.  The interval is
    (q_{(1-ci)/2}, q_{(1+ci)/2}) of the B replicates, ``numpy.quantile``'s default linear
    interpolation between order statistics (the tie rule: equal replicates are one atom).

    Metrics with the same lone queries share the same resamples, so their intervals are jointly
    consistent.  Zero division: a metric whose every query is lone gets ``(nan, nan)``.  One
    query (or class) gives a zero-width interval at its value.

    Differences from ``scipy.stats.bootstrap``: its default is BCa; this is the percentile
    method (``method="percentile"`` there), and the macro statistic resamples classes, which
    scipy cannot express for a mean of group means.  PML's AccuracyCalculator has no intervals.

    Examples
    --------
    >>> lo, hi = bootstrap_ci({"precision_at_1": [1, 1, 1, 1]})["precision_at_1"]
    >>> (lo, hi)
    (1.0, 1.0)
    >>> # two values: replicate means 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4
    >>> bootstrap_ci({"m": [0.0, 1.0]}, ci=0.4, n_boot=2000)["m"]
    (0.5, 0.5)
    """
    from .result import EvaluationResult

    if average is not None:
        average = check_choice(average, "average", ("micro", "macro"))
    if isinstance(per_query, EvaluationResult):
        labels = per_query.query_labels if labels is None else labels
        average = _result_average(per_query, average)
        per_query = per_query.per_query
    average = "micro" if average is None else average
    ci = check_level(ci)
    n_boot = check_int(n_boot, "n_boot")
    seed = check_int(seed, "seed", minimum=0)
    columns, codes = _bootstrap_columns(per_query, labels, average, metrics)
    out: dict[str, tuple[float, float]] = {name: (math.nan, math.nan) for name in columns}
    # Metrics with the same lone (NaN) queries share one set of resamples: one draw serves
    # them all, and their intervals come from the same resampled query sets.
    by_mask: dict[bytes, list[str]] = {}
    for name, values in columns.items():
        by_mask.setdefault(np.isnan(values).tobytes(), []).append(name)
    with progress_bar(n_boot * len(by_mask), "bootstrap resamples", enabled=progress) as bar:
        for group_names in by_mask.values():
            stack = np.stack([columns[name] for name in group_names], axis=1)
            bounds = _mean_intervals(
                stack, codes if average == "macro" else None, ci, n_boot, seed, bar
            )
            for j, name in enumerate(group_names):
                out[name] = (float(bounds[0, j]), float(bounds[1, j]))
    return out


def _result_average(result: Any, average: Any) -> str:
    """The result's own averaging; an explicit ``average`` that differs is refused, since the
    intervals would then not be those of the metrics the result reports."""
    own = result.settings.get("average", "micro")
    if average is not None and average != own:
        raise InputError(
            f"average={average!r}, but the result was evaluated with average={own!r} and its "
            "intervals are those of its own metrics; drop average=, or pass result.per_query "
            f"with labels=result.query_labels and average={average!r} to resample that "
            "statistic instead."
        )
    return own


def _bootstrap_columns(
    per_query: Any, labels: Any, average: str, metrics: Any
) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """The checked per-query columns of :func:`bootstrap_ci` and the label codes (or None)."""
    if not isinstance(per_query, Mapping):
        raise InputTypeError(
            "per_query must be a dict of metric -> per-query values or an EvaluationResult; "
            f"got {type(per_query).__name__}."
        )
    names = _metric_list(metrics, list(per_query), "per_query")
    if average == "macro" and labels is None:
        raise InputError("average='macro' resamples classes, so labels are required.")
    codes, n_labels = _class_codes(labels, average)
    columns = {}
    for name in names:
        values = as_vector(
            per_query[name], f"per_query[{name!r}]", allow_nan=True, allow_empty=True
        )
        if n_labels is not None and n_labels != values.size:
            raise InputError(
                f"labels has {n_labels} values but per_query[{name!r}] has {values.size}; "
                "pass one label per query."
            )
        columns[name] = values
    return columns, codes


def _class_codes(labels: Any, average: str) -> tuple[np.ndarray | None, int | None]:
    """The class code of each query (None without labels, and for several labels per query
    under ``average="micro"``, which resamples queries and reads no class) and the number of
    labelled queries (None without labels)."""
    if labels is None:
        return None, None
    if is_label_indicator(labels):
        if average == "macro":
            raise InputError(
                "average='macro' resamples classes, which multi-label labels (a 2-D indicator "
                "array) do not partition; use average='micro', which resamples queries (evaluate "
                "with it, or pass it to bootstrap_ci)."
            )
        return None, as_label_indicator(labels, "labels").shape[0]
    (codes,), _ = factorize(as_labels(labels, "labels"))
    return codes, codes.size


def _mean_intervals(
    stack: np.ndarray, codes: np.ndarray | None, ci: float, n_boot: int, seed: int, bar: Any
) -> np.ndarray:
    """(2, m) percentile bounds of the column means of ``stack`` over its non-NaN rows (NaN
    when none); with ``codes`` the classes are resampled (mean of class means)."""
    ok = ~np.isnan(stack[:, 0])
    if not ok.any():
        bar.update(n_boot)
        return np.full((2, stack.shape[1]), math.nan)
    groups = None
    if codes is not None:
        (groups,), _ = factorize(codes[ok])
    reps = resampled_means(stack[ok], groups, n_boot, np.random.default_rng(seed), bar)
    tail = (1 - ci) / 2
    return np.quantile(reps, [tail, 1 - tail], axis=0)


def _metric_list(metrics: Any, available: list[str], where: str) -> list[str]:
    """``metrics`` as a list of known names (a single string is one metric, not its letters)."""
    if metrics is None:
        return available
    names = [metrics] if isinstance(metrics, str) else list(metrics)
    for m in names:
        if m not in available:
            raise InputError(
                f"metric {m!r} is not in {where} with per-query values (nmi/ami have none); "
                f"available: {', '.join(available)}.{suggest(str(m), available)}"
            )
    return names


@dataclass(frozen=True)
class Comparison:
    """Checkpoints side by side against a baseline (see :func:`compare`).

    ``rows`` holds one dict per (checkpoint, metric) with the stable keys ``checkpoint``,
    ``metric``, ``value``, ``ci_low``, ``ci_high``, ``diff``, ``diff_ci_low``, ``diff_ci_high``,
    ``p_value`` (the baseline's own diff is 0 and its p-value 1) and ``n_shared``.
    ``exact_p`` holds the (checkpoint, metric) pairs whose p-value is exact (the sign-flip test
    enumerated every pattern): the tables print those as numbers, however small, while a
    resampling p below 1 / n_boot is printed as ``<`` that resolution.
    """

    rows: list[dict[str, Any]]
    baseline: str
    names: list[str]
    metrics: list[str]
    settings: dict[str, Any] = field(default_factory=dict)
    exact_p: frozenset[tuple[str, str]] = frozenset()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (NaN becomes None) with a ``format`` tag and the settings."""
        return {
            "format": "embedeval.Comparison/1",
            "baseline": self.baseline,
            "checkpoints": self.names,
            "metrics": self.metrics,
            "settings": self.settings,
            "rows": [{k: _json_num(v) for k, v in row.items()} for row in self.rows],
        }

    def to_json(self, path: str | os.PathLike | None = None, *, indent: int = 2) -> str:
        """JSON text of :meth:`to_dict`; also written atomically to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=indent, allow_nan=False)
        if path is not None:
            write_text(_as_path(path), text)
        return text

    def _cells(self) -> tuple[list[str], list[list[str]]]:
        level = _percent(self.settings.get("ci", 0.95))
        head = [
            "checkpoint",
            "metric",
            "value",
            f"{level} CI",
            "diff vs " + self.baseline,
            "diff CI",
            "p",
        ]
        body = []
        for r in self.rows:
            body.append(
                [
                    r["checkpoint"],
                    r["metric"],
                    _fmt(r["value"]),
                    f"[{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}]",
                    "—" if r["checkpoint"] == self.baseline else _fmt_signed(r["diff"]),
                    ""
                    if r["checkpoint"] == self.baseline
                    else f"[{_fmt_signed(r['diff_ci_low'])}, {_fmt_signed(r['diff_ci_high'])}]",
                    ""
                    if r["checkpoint"] == self.baseline
                    else _fmt_p(r["p_value"], self.settings, self._is_exact(r)),
                ]
            )
        return head, body

    def _is_exact(self, row: dict[str, Any]) -> bool:
        return (row["checkpoint"], row["metric"]) in self.exact_p

    def to_html(
        self, path: str | os.PathLike, *, title: str | None = None, figures: bool = True
    ) -> Path:
        """Write one self-contained HTML page (atomically): the checkpoint table with intervals
        and paired differences against the baseline, sortable, and its plot; returns the path."""
        from .html import comparison_html, write_html

        return write_html(path, comparison_html(self, title=title, figures=figures))

    def to_markdown(self) -> str:
        """The table of ``repr`` as a Markdown table (4 decimals; a resampling p below 1/n_boot
        as '<', an exact one as a number)."""
        return markdown_table(*self._cells())

    def to_csv(self) -> str:
        """``rows`` as CSV text, full precision, header = the stable row keys."""
        buf = io.StringIO()
        keys = list(self.rows[0]) if self.rows else []
        writer = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        return buf.getvalue()

    def __repr__(self) -> str:
        head, body = self._cells()
        widths = [max(len(c) for c in col) for col in zip(head, *body, strict=True)]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in [head, *body]
        ]
        lines.insert(1, "-" * len(lines[0]))
        return "\n".join(lines)

    def plot(self, ax: Any = None, metrics: Sequence[str] | None = None) -> Any:
        """Metric value across checkpoints with CI bands; returns the matplotlib Figure."""
        from ..plots import plain_label, plot_checkpoints

        metrics = _metric_list(metrics, self.metrics, "this comparison")
        values, lows, highs = {}, {}, {}
        for m in metrics:
            rows = [r for r in self.rows if r["metric"] == m]
            values[m] = np.array([r["value"] for r in rows])
            lows[m] = np.array([r["ci_low"] for r in rows])
            highs[m] = np.array([r["ci_high"] for r in rows])
        # Drawn as written (no mathtext, no missing glyph, one line) and cut: a long file
        # name made a title wider than the figure.
        baseline = plain_label(self.baseline, 20)
        return plot_checkpoints(
            self.names,
            values,
            lows,
            highs,
            ax=ax,
            title=f"Checkpoints vs {baseline} ({_percent(self.settings.get('ci', 0.95))} CI)",
        )


def compare(
    results: Sequence[Any] | Mapping[str, Any],
    *,
    names: Sequence[str] | None = None,
    baseline: int | str = 0,
    metrics: Sequence[str] | None = None,
    ci: float = 0.95,
    n_boot: int = 1000,
    seed: int = 0,
    test: str = "bootstrap",
) -> Comparison:
    """Compare evaluation results on the same queries, with CIs and paired tests.

    Parameters
    ----------
    results : sequence or dict of EvaluationResult
        One result per checkpoint, all on the same queries (same count and labels).
    names : sequence of str, optional
        Checkpoint names (default: the dict keys, or ``run0``, ``run1``, ...).
    baseline : int or str
        The checkpoint the others are compared with.
    metrics : sequence of str, optional
        Default: the per-query metrics all results share.
    ci, n_boot, seed
        Bootstrap settings (see :func:`bootstrap_ci`).
    test : {"bootstrap", "permutation"}
        Paired bootstrap: p = 2 x min(share of resampled mean differences <= 0, >= 0), capped at
        1.  Permutation: random sign flips of the per-query differences (exact enumeration for at
        most 12 queries), p = share of |mean| >= the observed |mean|.

    Returns
    -------
    Comparison
        One row per (metric, checkpoint), metric-major: the checkpoint's value and its own
        bootstrap CI, the difference to the baseline, its paired CI and p-value, ``n_shared``.

    Notes
    -----
    Queries lone in any run are dropped from every paired statistic (``n_shared`` counts the
    rest), so ``diff`` can differ from the difference of the two ``value`` columns when runs
    have different lone queries.  If no query is shared, diff, its CI and p are NaN.  With
    ``average="macro"`` results, classes are resampled / flipped as units (the difference is
    the mean over classes of the class-mean differences).  Every checkpoint must use the same
    ``average`` and the same depth ``k`` (an int ``k`` truncates R-precision, MAP@R, MAP and
    MRR, so runs read to different depths are refused).

    The paired bootstrap resamples the same queries for every run, so the replicate of the
    difference is d*_b = theta*_b(run) - theta*_b(baseline), and its percentile interval is
    the CI of the difference.  Both tests assume the queries (or classes) are independent
    units; the sign-flip test also assumes that, under the null, each per-query difference is
    symmetric around 0 (exchangeable labels "run" / "baseline").  It matches
    ``scipy.stats.permutation_test(..., permutation_type="samples")`` on the differences,
    except that the Monte Carlo p-value here is (hits + 1) / (n_boot + 1) and two-sided by
    |mean| (scipy doubles the smaller tail; for the symmetric sign-flip distribution these
    agree).  A bootstrap p of 0 means no replicate crossed 0: read it as p < 1 / n_boot.

    Examples
    --------
    >>> import embedeval as ee
    >>> x = [[0.0], [0.2], [1.0], [1.2], [2.0], [2.2]]
    >>> y = [0, 0, 1, 1, 2, 2]
    >>> a = ee.evaluate(x, y)
    >>> b = ee.evaluate([[0.0], [1.0], [0.2], [2.0], [1.2], [2.2]], y)  # a worse checkpoint
    >>> cmp = compare({"good": a, "worse": b}, metrics=["precision_at_1"], n_boot=200)
    >>> [round(r["value"], 3) for r in cmp.rows]
    [1.0, 0.0]
    """
    runs, names = _as_runs(results, names)
    test = check_choice(test, "test", ("bootstrap", "permutation"))
    ci = check_level(ci)
    n_boot = check_int(n_boot, "n_boot")
    seed = check_int(seed, "seed", minimum=0)
    base = _baseline_index(baseline, names, len(runs))
    average = _common_average(runs, names)
    _check_same_depth(runs, names)
    shared = [m for m in runs[0].per_query if all(m in r.per_query for r in runs)]
    if not shared:
        raise InputError(
            "no metric has per-query values in every result (nmi/ami have none); evaluate the "
            "checkpoints with a kNN metric such as 'map_at_r'."
        )
    metrics, conf_keys = _split_confidence_metrics(metrics, shared, runs, names)
    metrics = _metric_list(metrics, shared, "every result")
    settings = {"ci": ci, "n_boot": n_boot, "seed": seed, "test": test, "average": average}
    rows, exact = _metric_rows(runs, names, base, metrics, settings)
    if conf_keys:  # their permutation p is always drawn at random: never exact
        rows += confidence_rows(
            runs, names, base, conf_keys, ci=ci, n_boot=n_boot, seed=seed, test=test
        )
    return Comparison(rows, names[base], names, [*metrics, *conf_keys], settings, exact)


def _as_runs(results: Any, names: Any) -> tuple[list[Any], list[str]]:
    """The results as a list of EvaluationResult and their checked, unique names."""
    from .result import EvaluationResult

    if isinstance(results, Mapping):
        names = list(results) if names is None else list(names)
        runs = list(results.values())
    else:
        if isinstance(results, (EvaluationResult, str)) or not isinstance(results, Sequence):
            raise InputTypeError(
                "results must be a list or dict of EvaluationResult (one per checkpoint); got "
                f"{type(results).__name__}. Wrap a single result in a list."
            )
        runs = list(results)
        names = [f"run{i}" for i in range(len(runs))] if names is None else list(names)
    if not runs:
        raise InputError("results is empty; pass at least one EvaluationResult.")
    for i, r in enumerate(runs):
        if not isinstance(r, EvaluationResult):
            raise InputTypeError(
                f"results[{i}] is a {type(r).__name__}, not an EvaluationResult; evaluate each "
                "checkpoint with embedeval.evaluate first."
            )
    if len(names) != len(runs):
        raise InputError(f"names has {len(names)} entries but there are {len(runs)} results.")
    for i, name in enumerate(names):
        if not isinstance(name, str):
            raise InputTypeError(
                f"names[{i}] is {name!r} of type {type(name).__name__}; checkpoint names must "
                f"be strings (e.g. str({name!r}))."
            )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InputError(
            f"checkpoint names must be unique; {', '.join(map(repr, repeated))} repeated. "
            "Pass distinct names=."
        )
    return runs, names


def _baseline_index(baseline: Any, names: list[str], n_runs: int) -> int:
    if isinstance(baseline, str):
        if baseline not in names:
            raise InputError(
                f"baseline={baseline!r} is not one of the checkpoints "
                f"({', '.join(names)}).{suggest(baseline, names)}"
            )
        return names.index(baseline)
    base = check_int(baseline, "baseline", minimum=0)
    if base >= n_runs:
        raise InputError(f"baseline={base} but there are only {n_runs} results.")
    return base


def _common_average(runs: list[Any], names: list[str]) -> str:
    """The ``average`` every run shares, after checking that all are on the same queries."""
    first = runs[0]
    first_labels = np.asarray(first.query_labels, dtype=object)
    average = first.settings.get("average", "micro")
    for name, r in zip(names, runs, strict=True):
        if r.n_queries != first.n_queries:
            raise InputError(
                f"checkpoint {name!r} was evaluated on different queries ({r.n_queries} queries) "
                f"than {names[0]!r} ({first.n_queries}); paired comparison needs the same "
                "queries in the same order."
            )
        labels = np.asarray(r.query_labels, dtype=object)
        _check_label_form(labels, first_labels, name, names[0])
        if labels.shape[0] != first_labels.shape[0]:
            # n_queries can agree while the label rows do not: a judged-relevance result also
            # lists its skipped queries (no judgments), which n_queries leaves out
            raise InputError(
                f"checkpoint {name!r} lists {labels.shape[0]} queries and {names[0]!r} "
                f"{first_labels.shape[0]}; paired comparison needs the same queries in the same "
                "order."
            )
        bad = _differing_rows(labels, first_labels)
        if bad.size:
            i = int(bad[0])
            raise InputError(
                f"checkpoint {name!r} has different query labels than {names[0]!r} at "
                f"{bad.size} of {labels.shape[0]} queries, first at query {i} "
                f"({label_text(labels[i])!r} vs {label_text(first_labels[i])!r}); paired "
                "comparison needs the same queries in the same order."
            )
        if r.settings.get("average", "micro") != average:
            raise InputError(
                f"checkpoint {name!r} was evaluated with average="
                f"{r.settings.get('average', 'micro')!r} but {names[0]!r} with "
                f"average={average!r}; evaluate every checkpoint with the same average."
            )
    return average


def _check_same_depth(runs: list[Any], names: list[str]) -> None:
    """Refuse runs read to different depths: an int ``k`` truncates R-precision, MAP@R, MAP and
    MRR (PML's semantics), so the same name would be another metric in each run and their
    difference would measure the depth, not the checkpoint."""
    depth = runs[0].settings.get("k_used")
    for name, r in zip(names, runs, strict=True):
        own = r.settings.get("k_used")
        if own != depth:
            raise InputError(
                f"checkpoint {name!r} was evaluated with k={_depth(r)} but {names[0]!r} with "
                f"k={_depth(runs[0])}; a depth k truncates r_precision, map_at_r, map and mrr, "
                "so the runs' metrics would not be the same; evaluate every checkpoint with "
                "the same k."
            )


def _depth(result: Any) -> str:
    """The depth a result was read to, as asked (``max_bin_count`` with the depth it meant)."""
    asked, used = result.settings.get("k"), result.settings.get("k_used")
    if used is None:
        return "None (exact)"
    return f"{asked!r} (depth {used})" if asked != used else repr(used)


def _check_label_form(labels: np.ndarray, first: np.ndarray, name: str, first_name: str) -> None:
    """Refuse labels of another form (one per query against an indicator array, or indicator
    arrays of different widths) by their forms: row by row, their label texts can read alike
    (label 0 and the row that has only label column 0 both print as ``'0'``)."""
    if labels.shape[1:] == first.shape[1:]:
        return

    def form(a: np.ndarray) -> str:
        return f"{a.shape[1]} indicator columns" if a.ndim == 2 else "one label per query"

    raise InputError(
        f"checkpoint {name!r} has its query labels as {form(labels)} but {first_name!r} as "
        f"{form(first)}; paired comparison needs the same queries with the same labels."
    )


def _differing_rows(labels: np.ndarray, first: np.ndarray) -> np.ndarray:
    """The queries whose labels differ (of the same count of rows; labels in another form,
    one per query against an indicator array, differ everywhere)."""
    if labels.shape != first.shape:
        return np.arange(labels.shape[0])
    differ = labels != first
    return np.flatnonzero(differ.any(axis=1) if differ.ndim == 2 else differ)


def _row(name: str, metric: str, value: float, ci: tuple[float, float], n: int) -> dict[str, Any]:
    """A comparison row with the baseline's neutral difference (0, CI [0, 0], p = 1)."""
    return {
        "checkpoint": name,
        "metric": metric,
        "value": value,
        "ci_low": ci[0],
        "ci_high": ci[1],
        "diff": 0.0,
        "diff_ci_low": 0.0,
        "diff_ci_high": 0.0,
        "p_value": 1.0,
        "n_shared": n,
    }


def _metric_rows(
    runs: list[Any], names: list[str], base: int, metrics: list[str], settings: dict[str, Any]
) -> tuple[list[dict[str, Any]], frozenset[tuple[str, str]]]:
    """Rows of the per-query metrics: own intervals, paired differences to the baseline; and
    the (checkpoint, metric) pairs whose p-value is exact."""
    ci, n_boot, seed = settings["ci"], settings["n_boot"], settings["seed"]
    average = settings["average"]
    labels = runs[0].query_labels
    codes, _ = _class_codes(labels, average)
    # Each run's own intervals: one call per run, so its metrics share one set of resamples.
    own_ci = [
        bootstrap_ci(
            {m: r.per_query[m] for m in metrics},
            labels=labels,
            average=average,
            ci=ci,
            n_boot=n_boot,
            seed=seed,
        )
        for r in runs
    ]
    rows, exact = [], set()
    for m in metrics:
        stack = np.stack([r.per_query[m] for r in runs], axis=1)
        ok = ~np.isnan(stack).any(axis=1)
        groups = None
        if average == "macro":
            (groups,), _ = factorize(codes[ok])
        vals = stack[ok]
        rng = np.random.default_rng(seed)
        reps = resampled_means(vals, groups, n_boot, rng) if vals.size else None
        units = len(vals) if groups is None else len(np.unique(groups))
        enumerated = settings["test"] == "permutation" and 0 < units <= EXACT_SIGN_FLIP_UNITS
        for i, name in enumerate(names):
            row = _row(
                name, m, float(runs[i].metrics.get(m, math.nan)), own_ci[i][m], int(ok.sum())
            )
            if i != base:
                row.update(_paired_difference(vals, groups, reps, i, base, settings))
                if enumerated:
                    exact.add((name, m))
            rows.append(row)
    return rows, frozenset(exact)


def _paired_difference(
    vals: np.ndarray,
    groups: np.ndarray | None,
    reps: np.ndarray | None,
    i: int,
    base: int,
    settings: dict[str, Any],
) -> dict[str, float]:
    """diff, its paired percentile interval and p-value of run ``i`` against ``base``."""
    if reps is None:  # no query is non-lone in every run
        return {
            "diff": math.nan,
            "diff_ci_low": math.nan,
            "diff_ci_high": math.nan,
            "p_value": math.nan,
        }
    tail = (1 - settings["ci"]) / 2
    diff_reps = reps[:, i] - reps[:, base]
    observed = _point(vals[:, i] - vals[:, base], groups)
    lo, hi = np.quantile(diff_reps, [tail, 1 - tail])
    if settings["test"] == "bootstrap":
        p = bootstrap_p(diff_reps, scale=_magnitude(vals))
    else:
        n_boot, seed = settings["n_boot"], settings["seed"]
        p = permutation_p(vals[:, i] - vals[:, base], groups, n_boot, seed)
    return {
        "diff": float(observed),
        "diff_ci_low": float(lo),
        "diff_ci_high": float(hi),
        "p_value": float(p),
    }


def _split_confidence_metrics(
    metrics: Any, shared: list[str], runs: list[Any], names: list[str]
) -> tuple[Any, list[str]]:
    """Separate confidence metrics (``aurc_map_at_r``, ``ece``, ...) from per-query ones.

    A confidence metric is compared by recomputing it on paired resamples, which needs every
    run's per-query confidences (``evaluate(..., confidences=...)``).
    """
    if metrics is None:
        return None, []
    requested = [metrics] if isinstance(metrics, str) else list(metrics)
    conf_keys = [m for m in requested if m not in shared and any(m in r.confidence for r in runs)]
    for key in conf_keys:
        for name, r in zip(names, runs, strict=True):
            if key not in r.confidence or r.query_confidences is None:
                raise InputError(
                    f"confidence metric {key!r} cannot be compared: checkpoint {name!r} was "
                    "evaluated without its per-query confidences; evaluate every checkpoint "
                    "with evaluate(..., confidences=...)."
                )
    return [m for m in requested if m not in conf_keys], conf_keys


def _magnitude(values: np.ndarray) -> float:
    """The size of the values a mean averages (at least 1): the scale of its rounding error."""
    finite = np.abs(values[np.isfinite(values)])
    return max(1.0, float(finite.max(initial=0.0)))


def _point(diff: np.ndarray, groups: np.ndarray | None) -> float:
    if groups is None:
        return float(diff.mean())
    n = int(groups.max()) + 1
    return float((np.bincount(groups, weights=diff, minlength=n) / np.bincount(groups)).mean())


def _fmt_p(p: float, settings: dict[str, Any], exact: bool = False) -> str:
    """A p-value for the tables, 4 decimals.

    A resampling p-value cannot resolve below 1 / n_boot: say "<" rather than print 0.  An
    exact one (every sign pattern enumerated) is at least 2 / 2**12, so 4 decimals show it.

    >>> _fmt_p(0.0, {"n_boot": 1000}), _fmt_p(2 / 4096, {"n_boot": 1000}, exact=True)
    ('<1e-03', '0.0005')
    """
    n_boot = settings.get("n_boot", 1000)
    if exact:
        return f"{p:.4f}"
    return f"<{_resolution(n_boot)}" if p < 1.0 / n_boot else f"{p:.4f}"


def _resolution(n_boot: int) -> str:
    """1 / n_boot rounded up to one significant digit (rounding down would claim a finer
    resolution than the resamples have), in the table's e-notation.

    >>> _resolution(1000), _resolution(800), _resolution(300), _resolution(1)
    ('1e-03', '2e-03', '4e-03', '1e+00')
    """
    exponent = len(str(n_boot))  # 10**(exponent - 1) <= n_boot < 10**exponent
    digit = -(-(10**exponent) // n_boot)  # ceil: 1 / n_boot <= digit * 10**-exponent, in ints
    return f"{digit * 10.0**-exponent:.0e}"


def _percent(level: float) -> str:
    """An interval's level as a percentage, with the digits it was given (a whole percent
    would head a 97.5 % interval "98% CI").

    >>> _percent(0.95), _percent(0.975)
    ('95%', '97.5%')
    """
    return f"{100 * level:g}%"


def _fmt(v: float) -> str:
    return "nan" if _is_nan(v) else f"{v:.4f}"


def _fmt_signed(v: float) -> str:
    return "nan" if _is_nan(v) else f"{v:+.4f}"


def _is_nan(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _json_num(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, np.generic):
        return v.item()
    return v


def _as_path(path: str | os.PathLike):
    from pathlib import Path

    return Path(path)


def _needed_metrics(per_query: dict[str, np.ndarray], keys: Sequence[str]) -> list[str]:
    """The per-query metrics the confidence ``keys`` are computed from (the rest is skipped)."""
    return list(dict.fromkeys(_source_metric(per_query, k) for k in keys))


def _source_metric(per_query: dict[str, np.ndarray], key: str) -> str:
    """The per-query metric the confidence metric ``key`` reads: ``m`` for an area such as
    ``aurc_m``; for r_auroc, ece, brier, open-set ... the 0/1 correctness of precision_at_1
    (else recall_at_1)."""
    own = [m for m in per_query if key.endswith("_" + m)]
    if own:
        return max(own, key=len)
    return next(m for m in ("precision_at_1", "recall_at_1") if m in per_query)


def _confidence_units(runs: Sequence[Any], key: str) -> int:
    """The queries the confidence metric ``key`` reads in every run: those not lone in any run
    (lone queries are left out, as by the per-query metrics), except for the open-set metrics,
    which read every query (the lone ones as out-of-gallery)."""
    if key.startswith("open_set_"):
        return int(runs[0].n_queries)
    column = _source_metric(runs[0].per_query, key)
    lone = np.zeros(runs[0].n_queries, dtype=bool)
    for r in runs:
        lone |= np.isnan(np.asarray(r.per_query[column], dtype=np.float64))
    return int(lone.size - lone.sum())


def paired_confidence_replicates(
    runs: Sequence[Any],
    keys: Sequence[str],
    *,
    n_boot: int,
    seed: int,
    swap: bool = False,
    drop: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Per key, (n_boot, n_runs) replicates of confidence metrics on shared resamples.

    Every run sees the same resampled query indices in a replicate (the draws of
    :func:`embedeval.metrics.resample.draw_indices`), so differences between runs are paired.  With
    ``swap=True`` (two runs) a replicate instead exchanges the two runs' (per-query values,
    confidence), query by query with probability 1/2: both runs change, so the replicates'
    differences follow the null distribution of a paired permutation test.  The queries where
    ``drop`` holds are read as lone in every run.
    """
    if swap and len(runs) != 2:
        raise ValueError(f"swap=True exchanges the queries of two runs; got {len(runs)} runs")
    rng = np.random.default_rng(seed)
    prepared = [_confidence_statistic(r, keys, drop) for r in runs]
    n = prepared[0][1][1].size
    out = {k: np.empty((n_boot, len(runs))) for k in keys}
    for b in range(n_boot):
        if swap:
            flip = rng.integers(0, 2, size=n).astype(bool)
            first, second = prepared[0][1], prepared[1][1]
            draws = [_swapped(first, second, flip), _swapped(second, first, flip)]
        else:
            (idx,) = next(draw_indices(rng, n, 1, 1))
            draws = [[a[idx] for a in arrays] for _, arrays in prepared]
        for i, ((stat, _), drawn) in enumerate(zip(prepared, draws, strict=True)):
            for k, v in stat(*drawn).items():
                out[k][b, i] = v
    return out


def _confidence_statistic(
    result: Any, keys: Sequence[str], drop: np.ndarray | None
) -> tuple[Any, list[np.ndarray]]:
    """The statistic giving ``keys`` from one run's resampled arrays, and those arrays (the
    per-query values of the queries where ``drop`` holds made NaN: lone)."""
    per_query = {}
    for m in _needed_metrics(result.per_query, keys):
        values = np.asarray(result.per_query[m], dtype=np.float64)
        per_query[m] = values if drop is None else np.where(drop, math.nan, values)
    labels = single_labels(result.query_labels)  # class-wise ECE: one class per query
    names, arrays = summary_arrays(per_query, result.query_confidences, labels)
    higher = bool(result.settings.get("higher_is_confident", True))
    return summary_statistic(names, higher, True, list(keys)), arrays


def _lone_in_some_runs(runs: Sequence[Any], key: str) -> np.ndarray | None:
    """The queries lone in some runs but not in all, which the paired statistics of ``key``
    leave out of every run (None when there are none, and for the open-set metrics, which read
    every query)."""
    if key.startswith("open_set_"):
        return None
    column = _source_metric(runs[0].per_query, key)
    lone = np.stack([np.isnan(np.asarray(r.per_query[column], np.float64)) for r in runs])
    some = lone.any(axis=0) & ~lone.all(axis=0)
    return some if some.any() else None


def _swapped(arrays: list[np.ndarray], other: list[np.ndarray], flip: np.ndarray) -> list:
    """``arrays`` with the rows where ``flip`` holds taken from ``other`` instead."""
    return [
        np.where(flip if a.ndim == 1 else flip[:, None], b, a)
        for a, b in zip(arrays, other, strict=True)
    ]


def confidence_rows(
    runs: Sequence[Any],
    names: Sequence[str],
    base: int,
    keys: Sequence[str],
    *,
    ci: float,
    n_boot: int,
    seed: int,
    test: str,
) -> list[dict[str, Any]]:
    """:func:`compare` rows for confidence metrics (AURC, ECE, R-AUROC, ...).

    Each replicate recomputes the metric for every run on the same resampled queries; a run's
    interval is the percentile interval of its replicates, the difference's interval that of
    the paired differences, and p is the paired bootstrap p-value (``test="bootstrap"``) or the
    share of query-wise swaps with the baseline whose |difference| reaches the observed one
    (``test="permutation"``, (hits + 1) / (n_boot + 1)).  ``n_shared`` counts the queries the
    statistic reads in every run: those lone in no run, or every query for the open-set metrics.
    The value and its interval are the run's own (over its own non-lone queries); the
    difference, its interval and p are over the shared queries, as for the per-query metrics.
    """
    rows: list[dict[str, Any]] = []
    all_reps = paired_confidence_replicates(runs, keys, n_boot=n_boot, seed=seed)
    for key in keys:
        reps = all_reps[key]
        values = [float(r.confidence[key]) for r in runs]
        n_shared = _confidence_units(runs, key)
        drop = _lone_in_some_runs(runs, key)
        paired, shared = _on_shared_queries(runs, key, drop, reps, values, n_boot, seed)
        for i, name in enumerate(names):
            own = percentile_interval(reps[:, i], ci)
            row = _row(name, key, values[i], own, n_shared)
            if i == base:
                rows.append(row)
                continue
            d = paired[:, i] - paired[:, base]
            d = d[np.isfinite(d)]
            dlo, dhi = percentile_interval(d, ci)
            observed = shared[i] - shared[base]
            if test == "bootstrap":
                p = bootstrap_p(d, scale=_magnitude(paired)) if d.size else math.nan
            else:
                p = _swap_p([runs[base], runs[i]], key, observed, (n_boot, seed), drop)
            row.update(diff=observed, diff_ci_low=dlo, diff_ci_high=dhi, p_value=float(p))
            rows.append(row)
    return rows


def _on_shared_queries(
    runs: Sequence[Any],
    key: str,
    drop: np.ndarray | None,
    reps: np.ndarray,
    values: list[float],
    n_boot: int,
    seed: int,
) -> tuple[np.ndarray, list[float]]:
    """The replicates and values of ``key`` with the queries where ``drop`` holds read as lone
    in every run (the runs' own ``reps`` and ``values`` when ``drop`` is None)."""
    if drop is None:
        return reps, values
    paired = paired_confidence_replicates(runs, [key], n_boot=n_boot, seed=seed, drop=drop)
    shared = []
    for r in runs:
        stat, arrays = _confidence_statistic(r, [key], drop)
        shared.append(float(stat(*arrays)[key]))
    return paired[key], shared


def _swap_p(
    pair: list[Any], key: str, observed: float, draws: tuple[int, int], drop: np.ndarray | None
) -> float:
    """Share of ``draws = (n_boot, seed)`` query-wise swaps of the pair whose |difference|
    reaches |observed| (the queries where ``drop`` holds read as lone in both)."""
    n_boot, seed = draws
    swaps = paired_confidence_replicates(
        pair, [key], n_boot=n_boot, seed=seed, swap=True, drop=drop
    )[key]
    stat = np.abs(swaps[:, 1] - swaps[:, 0])
    hits = int(np.sum(stat >= abs(observed) - 1e-12))
    return (hits + 1) / (n_boot + 1)
