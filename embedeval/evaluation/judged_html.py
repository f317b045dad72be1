"""The HTML page of a judged-relevance result (``QrelsResult.to_html``, ``retrieve --report``).

The page speaks of queries, documents and qrels grades: what was evaluated (files, sizes and
the conventions that decide the values: ties, relevance level, gain, missing queries), the
metric table, the per-query table (worst first) and a failure gallery whose rows are the
result's own run, so every document shown is where the metrics found it.  It is built from the
blocks of :mod:`embedeval.evaluation.html` (page, tables, thumbnails, captions) and, like the
evaluation page, references no network address.

It reads the result's arrays only (``per_query``, ``run_rows``, the judgments in CSR form), so
it lives beside the evaluation page; :class:`~embedeval.protocols.qrels.QrelsResult` calls it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..metrics.judged import NOT_RANKED, parse_ir_metrics
from ..utils.errors import InputError
from ..utils.validation import as_int64, check_int
from .gallery import worst_queries
from .html import (
    _cell,
    _e,
    _gallery_sizes,
    _Media,
    _metrics,
    _nav,
    _num,
    _page,
    _table,
    _what,
)

__all__ = ["first_relevant_ranks", "gallery_metric_name", "judged_counts", "judged_html"]

_TIES = {
    "index": "scores decided in float64; equal ones ordered by corpus row",
    "trec_eval": "float64 scores rounded to float32 (as trec_eval reads a run); equal ones "
    "ordered by doc id, descending (trec_eval's order)",
}


def judged_counts(lims: Any, grades: Any, relevance_level: int) -> tuple[np.ndarray, np.ndarray]:
    """Judged and relevant (grade >= ``relevance_level``) documents of each query of a CSR
    judgment list (query ``i`` holds ``grades[lims[i]:lims[i + 1]]``).

    >>> judged_counts([0, 3, 3, 5], [2, 0, 1, -1, 1], 1)
    ([3, 0, 2], [2, 0, 1])
    """
    lims, grades = _int64(lims, "lims"), _int64(grades, "grades")
    n_judged = np.diff(lims)
    query = np.repeat(np.arange(n_judged.size), n_judged)
    relevant = np.bincount(query[grades >= relevance_level], minlength=n_judged.size)
    return n_judged.tolist(), relevant.tolist()


def first_relevant_ranks(lims: Any, grades: Any, ranks: Any, relevance_level: int) -> np.ndarray:
    """The rank of each query's first relevant document: the least rank of its judged documents
    with grade >= ``relevance_level``; 0 when none of them is ranked.

    >>> first_relevant_ranks([0, 3, 5], [2, 0, 1, 1, 0], [7, 1, 3, NOT_RANKED, 1], 1).tolist()
    [3, 0]
    """
    lims, grades, ranks = _int64(lims, "lims"), np.asarray(grades), _int64(ranks, "ranks")
    query = np.repeat(np.arange(lims.size - 1), np.diff(lims))
    ok = (grades >= relevance_level) & (ranks != NOT_RANKED)
    first = np.full(lims.size - 1, np.iinfo(np.int64).max)
    np.minimum.at(first, query[ok], ranks[ok])
    return np.where(first == np.iinfo(np.int64).max, 0, first)


def _int64(values: Any, name: str) -> np.ndarray:
    """A judgment array as int64; a uint64 value int64 cannot hold is an error, not a wrap."""
    fix = "Pass the arrays of a QrelsResult (judged_lims, judged_grades, judged_ranks)."
    return as_int64(values, name, fix).astype(np.int64, copy=False)


def gallery_metric_name(names: Sequence[str], gallery_metric: str | None) -> str:
    """The metric that orders the per-query table and the gallery: ``gallery_metric`` in any
    spelling :func:`~embedeval.metrics.judged.parse_ir_metrics` reads, or the first of
    ``names``.

    >>> gallery_metric_name(["ndcg@10", "map"], "ndcg_cut_10"), gallery_metric_name(["map"], None)
    ('ndcg@10', 'map')
    """
    if gallery_metric is None and names:
        return names[0]
    try:
        metric = parse_ir_metrics([gallery_metric])[0].name
    except (InputError, TypeError, ValueError):
        metric = gallery_metric
    if metric not in names:
        raise InputError(
            f"gallery_metric={gallery_metric!r} is not a metric of this result; choose one of "
            f"{', '.join(names) or '(none)'}."
        )
    return metric


class _Judged:
    """The result's queries as the page needs them: per-query row -> run row, the counts and
    the first relevant rank of every run query."""

    def __init__(self, res: Any) -> None:
        s = res.settings
        self.level = int(s["relevance_level"])
        position = {qid: p for p, qid in enumerate(res.query_labels.tolist())}
        self.run_of = np.full(len(position), -1, dtype=np.int64)
        self.run_of[[position[q] for q in res.run_ids]] = np.arange(len(res.run_ids))
        self.n_judged, self.n_relevant = judged_counts(
            res.judged_lims, res.judged_grades, self.level
        )
        self.first = first_relevant_ranks(
            res.judged_lims, res.judged_grades, res.judged_ranks, self.level
        ).tolist()
        # full-depth metrics rank every relevant document; cut-off ones only the top depth
        self.full = any(m.depth is None for m in parse_ir_metrics(s["metrics"]))
        self.depth = int(res.run_rows.shape[1])

    def grades(self, res: Any, i: int) -> dict[int, int]:
        """Corpus row -> grade of run query ``i``'s judged documents in the corpus."""
        a, b = int(res.judged_lims[i]), int(res.judged_lims[i + 1])
        return dict(
            zip(res.judged_rows[a:b].tolist(), res.judged_grades[a:b].tolist(), strict=True)
        )

    def first_text(self, i: int) -> str:
        if self.first[i]:
            return f"rank {self.first[i]}"
        if not self.n_relevant[i]:
            return "no relevant judgment"
        if self.full:
            return "none retrieved (not in the corpus, or excluded)"
        return f"none retrieved within depth {self.depth}"


def judged_html(
    res: Any,
    *,
    gallery: int = 20,
    gallery_metric: str | None = None,
    gallery_k: int = 5,
    table_rows: int = 5000,
    title: str | None = None,
    **media: Any,
) -> str:
    """The HTML page of a :class:`~embedeval.protocols.qrels.QrelsResult`; see its
    :meth:`~embedeval.protocols.qrels.QrelsResult.to_html` for the options.  ``media``:
    ``images``, ``reference_images``, ``texts``, ``reference_texts`` (one per query row / corpus
    row), ``thumbnail`` (pixels, default 64), ``max_chars`` (texts cut, default 300).

    Examples
    --------
    >>> import numpy as np, embedeval as ee
    >>> res = ee.evaluate_qrels(np.float32([[1, 0]]), np.float32([[1, 0], [0, 1]]),
    ...                         {"q": {"b": 1}}, query_ids=["q"], doc_ids=["a", "b"],
    ...                         metrics=["ndcg@2"])
    >>> page = judged_html(res)
    >>> 'data-metric="ndcg@2"' in page, 'data-doc="b"' in page, "classes" in page
    (True, True, False)
    """
    pictures = _Media.from_options(media, max_chars=300)
    gallery, gallery_k, _ = _gallery_sizes(gallery, gallery_k, pictures.size)
    table_rows = check_int(table_rows, "table_rows", minimum=0)
    metric = gallery_metric_name(list(res.per_query), gallery_metric)
    title = title or "embedeval report: judged relevance"
    judged = _Judged(res)
    body = [f"<h1>{_e(title)}</h1>", _subtitle(res), _NAV, _what(res, _sizes(res))]
    body += [_metrics(res, _metrics_note(res), tie_counts=False)]
    body.append(_per_query(res, judged, metric, table_rows))
    if gallery:
        pictures.check(int(res.settings["n_query"]), int(res.settings["n_reference"]))
        body.append(_gallery(res, judged, metric, gallery, gallery_k, pictures))
        pictures.warn()
    return _page(title, body)


_NAV = _nav({"s-queries": "per query"})


def _subtitle(res: Any) -> str:
    p, s = res.provenance, res.settings
    return (
        f'<p class="sub">embedeval {_e(p.get("embedeval_version", "?"))} · '
        f"{_e(p.get('created', '?'))} · {res.n_evaluated} queries evaluated "
        f"({res.n_skipped} skipped: no judgments; {res.n_missing} without an embedding, "
        f"counted as 0) · {s.get('n_reference', '?')} documents · distance "
        f"{_e(s.get('distance'))} · ties {_e(s.get('ties'))}</p>"
    )


def _sizes(res: Any) -> dict[str, Any]:
    """What the page states first: the counts, then the conventions that decide the values."""
    s = res.settings
    return {
        "query rows": s.get("n_query"),
        "queries evaluated (embedded and judged)": res.n_evaluated - res.n_missing,
        "qrels queries without an embedding (0 for every metric)": res.n_missing,
        "queries skipped (embedded, no judgments)": res.n_skipped,
        "documents (corpus rows)": s.get("n_reference"),
        "judgments (of the embedded queries)": s.get("n_judgments"),
        "judged documents not in the corpus": s.get("n_judged_not_in_corpus"),
        "excluded (query, document) pairs": s.get("n_excluded"),
        "documents kept per query (depth)": s.get("depth"),
        "metrics": s.get("metrics"),
        "distance": s.get("distance"),
        "ties": f"{s.get('ties')}: {_TIES.get(s.get('ties'), '')}",
        "relevance_level": f"{s.get('relevance_level')} (relevant: grade ≥ "
        f"{s.get('relevance_level')}; nDCG uses every positive grade)",
        "gain": s.get("gain"),
        "missing": s.get("missing"),
        "ignore_identical_ids": s.get("ignore_identical_ids"),
    }


def _metrics_note(res: Any) -> str:
    ties = _TIES.get(res.settings.get("ties"), "")
    return (
        f"Means over the {res.n_evaluated} evaluated queries, trec_eval's definitions, from the "
        f"exact ranking of the whole corpus; {ties}."
    )


def _per_query(res: Any, judged: _Judged, metric: str, limit: int) -> str:
    """Every evaluated query (at most ``limit``), worst ``metric`` first, sortable."""
    order = worst_queries(res.per_query[metric], len(res.query_labels))
    shown = order[:limit].tolist()
    names = list(res.per_query)
    labels = res.query_labels.tolist()
    rows = []
    for p in shown:
        i = int(judged.run_of[p])
        counts = (
            [judged.n_judged[i], judged.n_relevant[i], judged.first[i] or None]
            if i >= 0
            else [None, None, None]
        )
        who = _e(labels[p]) + ("" if i >= 0 else " (no embedding)")
        rows.append(
            f'<tr data-qid="{_e(labels[p])}"><td>{who}</td>'
            + "".join(_cell(c) for c in counts)
            + "".join(_cell(res.per_query[m][p]) for m in names)
            + "</tr>"
        )
    cut = (
        f" The {len(shown)} worst of {order.size} are listed; every query is in the per-query "
        "CSV (<code>--per-query</code>) and in <code>res.per_query</code>."
        if len(shown) < order.size
        else ""
    )
    head = ["query id", "judged", "relevant", "first relevant rank", *names]
    return (
        "<h2 id='s-queries'>Per query</h2>"
        f"<p class='sub'>{order.size} queries, worst {_e(metric)} first; click a column to "
        f"sort. Skipped queries (no judgments) are not listed.{cut}</p>"
        + _table(head, rows, cls="sortable", ident="per-query")
    )


def _gallery(res: Any, judged: _Judged, metric: str, n: int, k: int, media: _Media) -> str:
    """The ``n`` run queries with the lowest ``metric``, each with its top-``k`` documents."""
    values = np.where(judged.run_of >= 0, res.per_query[metric], np.nan)
    chosen = worst_queries(values, n).tolist()
    shown = min(k, judged.depth)
    cut = (
        f" The run kept {judged.depth} documents per query: pass a deeper run_depth= "
        "(<code>--depth</code>) to see more."
        if shown < k
        else ""
    )
    level = judged.level
    rows = [_gallery_row(res, judged, p, metric, shown, media) for p in chosen]
    head = ["query", *[f"#{r}" for r in range(1, shown + 1)], "first relevant"]
    return (
        '<h2 id="s-gallery">Failure gallery</h2>'
        f"<h3>The {len(chosen)} queries with the lowest {_e(metric)}</h3>"
        "<p class='sub'>Each row: the query, then its top documents in the ranking the metrics "
        f"were read from, with the qrels grade: <span class='sym'>✓</span> relevant (grade ≥ "
        f"{level}), <span class='sym'>✗</span> judged not relevant, <span class='sym'>?</span> "
        f"unjudged; the last column is the rank of the first relevant document.{cut}</p>"
        + _table(head, rows, cls="gallery", ident="gallery-worst")
    )


def _gallery_row(res: Any, judged: _Judged, p: int, metric: str, k: int, media: _Media) -> str:
    i = int(judged.run_of[p])
    qid = res.query_labels[p]
    cells = [
        f'<td class="q">{media.show(p, False)}<span class="meta">query {_e(qid)}</span>'
        f"<span class='meta'>{_e(metric)} {_num(res.per_query[metric][p])}</span>"
        f"<span class='meta'>{judged.n_judged[i]} judged · {judged.n_relevant[i]} relevant"
        "</span></td>"
    ]
    grades = judged.grades(res, i)
    top = zip(res.run_rows[i, :k].tolist(), res.run_scores[i, :k].tolist(), strict=True)
    for rank, (j, score) in enumerate(top):
        if j < 0:
            cells.append("<td></td>")
            continue
        g = grades.get(j)
        rel = g is not None and g >= judged.level
        cls, sym = ("ok", "✓") if rel else ("unj", "?") if g is None else ("bad", "✗")
        doc = res.doc_ids[j]
        cells.append(
            f'<td class="{cls}" data-rank="{rank + 1}" data-doc="{_e(doc)}" data-index="{j}" '
            f'data-grade="{"" if g is None else g}" data-relevant="{int(rel)}">'
            f"<span class='sym'>{sym}</span><span class='meta'>#{rank + 1} · {_e(doc)}</span>"
            f"<span class='meta'>{'unjudged' if g is None else f'grade {g}'} · score "
            f"{_num(score)}</span>{media.show(j, True)}</td>"
        )
    first = judged.first[i]
    cells.append(f'<td data-first-relevant="{first or ""}">{_e(judged.first_text(i))}</td>')
    return f'<tr class="gallery-row" data-query="{p}" data-qid="{_e(qid)}">{"".join(cells)}</tr>'
