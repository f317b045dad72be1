"""Judged-relevance retrieval: query and corpus embeddings plus qrels (TREC / BEIR / MS MARCO
relevance judgments, graded) to trec_eval's numbers, exactly, at corpus scale.

:func:`evaluate_qrels` streams the corpus past the queries (:mod:`embedeval.engine.corpus`):
each query keeps its exact top-``depth`` list (depth = the deepest cut-off asked, or
``run_depth``), and for full-depth metrics (``map``, ``ndcg``, ``mrr``, ``r_precision``) the
exact rank of every relevant judged document beyond it is the number of corpus documents that
beat it.  The ranks of the judged documents then give every metric
(:func:`embedeval.metrics.judged.judged_metric_values`, trec_eval's definitions).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..engine.corpus import (
    DISTANCES,
    BeatCounter,
    CorpusScan,
    Pairs,
    band_population,
    candidate_ranks,
    decide_top,
    default_block,
    near_wins,
    numpy_product,
    scan_queries,
    score_bounds,
    tie_keys,
)
from ..engine.corpus_shards import Float32Rows, StackedRows, float32_rows
from ..evaluation.compare import bootstrap_ci
from ..evaluation.result import EvaluationResult
from ..metrics.judged import (
    GAINS,
    NOT_RANKED,
    IRMetric,
    check_relevance_level,
    judged_metric_values,
    parse_ir_metrics,
    refuse_large_grade,
)
from ..search.options import PRECISIONS, TorchOptions, check_shards
from ..search.torch_backend import corpus_product
from ..utils.errors import InputError, InputTypeError
from ..utils.validation import (
    as_embeddings,
    check_bool,
    check_bootstrap,
    check_choice,
    check_int,
    host_array,
    refuse_object_array,
)
from .qrels_shards import CorpusSearch, corpus_search, shard_list

__all__ = ["QrelsResult", "evaluate_qrels", "unembedded_queries"]

TIES = ("index", "trec_eval")
MISSING = ("error", "zero")
_DEFAULT_RUN_DEPTH = 1000  # when only full-depth metrics are asked: BEIR's and MTEB's depth
_SHOW = 5  # ids echoed in an error message
#: The deepest lists ``precision="auto"`` filters with bfloat16: its band holds every document
#: within about 2**-6 of the depth-th cosine, all ordered in float64, which outweighs the
#: faster product beyond a few tens of documents (``benchmarks/bench_qrels.py``, 2 cores; AMD
#: EPYC: depth 10 0.7-0.8x the float32 time, depth 20 even, depth 40 1.2x; Intel Xeon with
#: AMX, candidates bounded by float64 dot products first: depth 40 0.75x, 100 1.1x, 1,000 5x)
_BF16_MAX_DEPTH = 10
#: A bfloat16 product on the CPU pays while its band leaves at most one candidate per this
#: many documents of the corpus a query: each candidate costs a float64 dot product of one
#: gathered row (the saving of the faster product grows with the corpus, the cost with the
#: candidates).  Measured on 200,000 x 768 (Intel Xeon with AMX, 2 cores), nDCG@K with the
#: sample's estimate of the candidates: K = 40, 180 a query, 1.6 s against 2.2 s in float32;
#: K = 100, 573, 2.4 s against 1.9-2.2 s; K = 200, 929, 3.6 s against 2.0-2.2 s.
_DOCS_PER_CANDIDATE = 500
#: The smallest corpus whose bfloat16 scan may fall back to float32 (one default block: below
#: it either product takes little time, and the product asked for is kept).
_FALLBACK_MIN_DOCS = 1 << 16


@dataclass(repr=False)
class QrelsResult(EvaluationResult):
    """The result of :func:`evaluate_qrels`: an :class:`~embedeval.EvaluationResult` (so
    ``res[name]``, ``res.metrics``, ``res.per_query``, ``to_json``, :func:`embedeval.compare`
    and :func:`embedeval.bootstrap_ci` work) plus the top-depth run.

    ``query_labels`` are the query ids: ``query_ids`` in their order, then (``missing="zero"``)
    the qrels queries without an embedding, whose values are 0.  ``per_query`` is NaN for a
    query without judgments (skipped).  ``n_queries`` counts the evaluated queries (missing
    ones included), ``n_lone`` (= ``n_skipped``) the skipped ones.

    The run: ``run_ids`` (the embedded, judged queries), ``run_rows`` / ``run_scores`` (their
    top-depth corpus rows, -1 past the end, and float64 scores, in rank order; formed on first
    use) and ``doc_ids``.
    The judgments of the ``run_ids``, in CSR form: query ``i`` holds entries
    ``judged_lims[i]:judged_lims[i + 1]`` of ``judged_rows`` (corpus row, -1: not in the
    corpus), ``judged_grades`` and ``judged_ranks`` (1-based rank in the exact ranking,
    :data:`~embedeval.metrics.judged.NOT_RANKED` when not retrieved within the depth, or
    excluded; relevant documents are ranked at any depth when a full-depth metric was asked).
    """

    n_missing: int = 0
    run_ids: list[str] = field(default_factory=list)
    doc_ids: list[str] = field(default_factory=list)
    judged_lims: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    judged_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    judged_grades: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    judged_ranks: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    _run: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    _ranker: Callable[[], tuple[np.ndarray, np.ndarray]] | None = field(
        default=None, repr=False, compare=False
    )
    #: False for a result read back from JSON, which keeps the numbers, not the run.
    _holds_run: bool = field(default=True, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """:meth:`EvaluationResult.to_dict` plus ``n_missing``; the run and the judgments are
        not written (a corpus-sized list of ids), so a result read back has no run."""
        return {**super().to_dict(), "n_missing": int(self.n_missing)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QrelsResult:
        """A result written by :meth:`to_dict`: its metrics, per-query values, intervals,
        settings and ``n_missing``.  It holds no run: :meth:`run`, :meth:`write_run` and
        :meth:`to_html` are errors on it, never an empty run."""
        res = super().from_dict(data)
        n_missing = data.get("n_missing", 0)
        if type(n_missing) is not int or not 0 <= n_missing <= res.n_queries:
            raise InputError(
                f"data['n_missing'] must be an integer from 0 to n_queries ({res.n_queries}); "
                f"got {n_missing!r}. Pass what QrelsResult.to_dict() or to_json() produced."
            )
        res.n_missing, res._holds_run = n_missing, False
        return res  # type: ignore[return-value]

    def _require_run(self, what: str) -> None:
        if not self._holds_run:
            raise InputError(
                f"{what} needs the run and the judgments, and this result was read back from "
                "JSON, which keeps only the metrics and per-query values; call evaluate_qrels "
                "again to rank the corpus."
            )

    def _top(self) -> tuple[np.ndarray, np.ndarray]:
        """The run, formed on first use: every candidate of the top lists re-scored in float64
        and sorted (the metrics only needed the ranks of the judged documents)."""
        self._require_run("the run (run_rows, run_scores, run(), write_run())")
        if self._run is None:
            empty = np.zeros((len(self.run_ids), 0))
            self._run = self._ranker() if self._ranker else (empty.astype(np.int64), empty)
            self._ranker = None  # the inputs are no longer held
        return self._run

    @property
    def run_rows(self) -> np.ndarray:
        """Corpus rows of each query's top list, best first (-1 pads a short corpus)."""
        return self._top()[0]

    @property
    def run_scores(self) -> np.ndarray:
        """The float64 scores of ``run_rows`` (NaN pads; under ``ties="trec_eval"`` rounded
        to float32, as trec_eval reads and ranks them)."""
        return self._top()[1]

    def _kept_depth(self, depth: int | None) -> int:
        """The run depth asked, checked against the documents kept per query."""
        kept = self.run_rows.shape[1]
        if depth is None:
            return kept
        depth = check_int(depth, "depth")
        if depth > kept and kept < len(self.doc_ids):
            raise InputError(
                f"depth={depth}, but the run kept {kept} documents per query (run_depth, or "
                f"the deepest cut-off of the metrics) of the {len(self.doc_ids)} in the corpus; "
                f"pass run_depth={depth} to evaluate_qrels, or a depth of at most {kept}."
            )
        return min(depth, kept)

    @property
    def n_evaluated(self) -> int:
        return int(self.n_queries)

    @property
    def n_skipped(self) -> int:
        return int(self.n_lone)

    def run(self, depth: int | None = None) -> dict[str, dict[str, float]]:
        """The ranked lists as ``{query id: {doc id: score}}`` (each query's first ``depth``
        documents; default: all that were kept), scores as float: the float64 scores the
        ranking was decided by (cosine, inner product, or minus the squared Euclidean
        distance, formed from the float32 inputs).  A ``depth`` beyond the documents kept is
        an error unless the corpus holds no more (see :meth:`write_run`)."""
        depth = self._kept_depth(depth)
        docs = np.asarray(self.doc_ids, dtype=object)
        out: dict[str, dict[str, float]] = {}
        for qid, rows, scores in zip(self.run_ids, self.run_rows, self.run_scores, strict=True):
            keep = rows[:depth] >= 0
            out[qid] = dict(
                zip(docs[rows[:depth][keep]].tolist(), scores[:depth][keep].tolist(), strict=True)
            )
        return out

    def write_run(
        self, path: str | os.PathLike, *, depth: int | None = None, tag: str = "embedeval"
    ) -> None:
        """Write the run as a TREC run file (``qid Q0 docid rank score tag``).

        The scores are the float64 scores the ranking was decided by, written with Python's
        shortest round-trip repr (as exact as ``%.17g``): trec_eval re-sorts a run by the
        score it reads, then by document id descending, so a score printed with fewer digits
        (``%.9g``, float32's precision) would merge near-ties the float64 decision separated
        and trec_eval would reorder them.  Read back exactly, trec_eval on the file gives
        these numbers under ``ties="trec_eval"`` for every metric cut at the file's depth or
        above; a full-depth metric (``map``, ``ndcg``, ``mrr``, ``r_precision``) also ranks
        relevant documents beyond the kept lists, so trec_eval reproduces it only from a run
        that holds them (``run_depth=`` of :func:`evaluate_qrels`).

        ``depth`` (default: every document kept, ``run_depth`` or the deepest cut-off) may not
        exceed the documents kept when the corpus holds more: the rest were never ranked, and
        a shorter file than asked would change trec_eval's numbers silently."""
        from .qrels_files import write_trec_run

        depth = self._kept_depth(depth)
        rows = self.run_rows[:, :depth]
        kept = rows >= 0
        lims = np.concatenate([[0], np.cumsum(kept.sum(axis=1))])
        docs = np.asarray(self.doc_ids, dtype=object)[rows[kept]]
        write_trec_run(path, self.run_ids, lims, docs, self.run_scores[:, :depth][kept], tag=tag)

    def to_html(self, path: str | os.PathLike, **options: Any) -> Path:  # type: ignore[override]
        """Write one self-contained HTML page of this judged-relevance result (atomically);
        returns the path.

        The page shows what was evaluated (input files, sizes, version, time, every setting:
        ties, relevance level, gain, missing queries, ...), the metric table (with the
        intervals when ``ci=`` was given), the per-query table (query id, judged and relevant
        documents, rank of the first relevant one, every metric; worst first, sortable) and a
        failure gallery: the ``gallery`` queries with the lowest ``gallery_metric`` (default:
        the first metric), each followed by its top ``gallery_k`` documents of the run the
        metrics were read from, with rank, doc id, score and qrels grade (relevant ones:
        grade >= ``relevance_level``, green with a ✓; judged not relevant: ✗; unjudged: ?),
        then the rank of its first relevant document.  CSS and thumbnails are inline; the page
        references no network address and reads the same without JavaScript.

        Parameters
        ----------
        images, reference_images : sequence of paths or arrays, optional
            One image per query row (in ``query_ids`` order) / per corpus row, shown as
            thumbnails (``thumbnail`` pixels, with Pillow); an unreadable file becomes a
            placeholder and one :class:`~embedeval.utils.errors.EmbedevalWarning`.
        texts, reference_texts : sequence of str, optional
            The query text per query row / the passage per corpus row, cut to ``max_chars``.
        gallery : int
            Queries in the gallery (default 20; 0 leaves it out).
        gallery_k : int
            Documents shown per query (default 5); at most the depth the run kept
            (``run_depth=``).
        gallery_metric : str, optional
            The metric that orders the per-query table and chooses the gallery (any spelling
            of :func:`~embedeval.metrics.judged.parse_ir_metrics`; default: the first metric).
        thumbnail : int
            Thumbnail size in pixels (default 64).
        max_chars : int
            Query texts and passages are cut to this many characters (default 300).
        table_rows : int
            Queries listed in the per-query table (the worst first; default 5,000), which
            bounds the page's size on large query sets.
        title : str, optional
            The page's title.

        Examples
        --------
        >>> import numpy as np, embedeval as ee, tempfile, os
        >>> docs = np.float32([[1, 0], [0.8, 0.6], [0, 1]])
        >>> res = ee.evaluate_qrels(np.float32([[1, 0.1]]), docs, {"q1": {"d2": 1, "d0": 0}},
        ...                         query_ids=["q1"], doc_ids=["d0", "d1", "d2"],
        ...                         metrics=["ndcg@3", "mrr"])
        >>> out = res.to_html(os.path.join(tempfile.mkdtemp(), "run.html"),
        ...                   reference_texts=["first", "second", "third passage"])
        >>> "third passage" in out.read_text(encoding="utf-8")
        True
        """
        from ..evaluation.html import write_html
        from ..evaluation.judged_html import judged_html

        self._require_run("to_html()")
        return write_html(path, judged_html(self, **options))

    def table(self) -> str:
        """The means as an aligned text table (metric, value, and the CI when computed)."""
        level = self.settings.get("ci") or 0.95
        rows = [("metric", "value", f"{level * 100:g}% CI" if self.ci else "")]
        for name, value in self.metrics.items():
            lo_hi = self.ci.get(name)
            rows.append(
                (name, f"{value:.4f}", f"[{lo_hi[0]:.4f}, {lo_hi[1]:.4f}]" if lo_hi else "")
            )
        width = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(r, width, strict=True)).rstrip() for r in rows
        ]
        return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])

    def __repr__(self) -> str:
        s = self.settings
        head = (
            f"QrelsResult({self.n_evaluated} queries evaluated, {self.n_skipped} skipped "
            f"(no judgments), {self.n_missing} missing (zero), {s.get('n_reference')} documents, "
            f"distance={s.get('distance')!r}, ties={s.get('ties')!r}, depth={s.get('depth')})"
        )
        return head + "\n" + self.table()


# --------------------------------------------------------------------------- inputs
def _ids(ids: Any, n: int, name: str, rows: str) -> tuple[list[str], dict[str, int]]:
    """Ids as strings, one per row, unique; and the row of each id (one dictionary serves
    both: building it is most of the cost for millions of ids)."""
    if ids is None:
        raise InputError(f"{name} is required: one id per {rows} row, e.g. {name}=['1', '2', ...].")
    arr = host_array(ids)
    out = arr.tolist() if isinstance(arr, np.ndarray) else list(arr)
    if set(map(type, out)) != {str}:  # ids all str (the common case) need no conversion
        _refuse_bytes(out, name)
        out = list(map(str, out))
    if len(out) != n:
        raise InputError(f"{name} has {len(out)} ids but there are {n} {rows} rows; give one each.")
    index = dict(zip(out, range(n), strict=True))
    if len(index) != n:
        seen: set[str] = set()
        dup = next(v for v in out if v in seen or seen.add(v))
        raise InputError(f"{name} holds {dup!r} more than once; ids must be unique.")
    return out, index


def _refuse_bytes(values: list[Any], name: str) -> None:
    """Refuse bytes ids: ``str(b"d1")`` is ``"b'd1'"``, which no qrels id matches, so every
    judged document would silently count as absent from the corpus (every metric 0)."""
    found = next((v for v in values if isinstance(v, bytes)), None)
    if found is not None:
        raise InputTypeError(
            f"{name} holds bytes ({found!r}); ids are str or int, compared as strings with the "
            f"qrels ids. Decode them first, e.g. [v.decode() for v in {name}]."
        )


def _corpus(corpus: Any) -> np.ndarray | Float32Rows:
    """The corpus checked 2-D and numeric, as the engine reads it
    (:func:`~embedeval.engine.corpus_shards.float32_rows`: float32 rows, a memory map never
    copied)."""
    arr = host_array(corpus)
    if not isinstance(arr, np.ndarray):
        arr = as_embeddings(arr, "corpus")
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise InputError(f"corpus must be 2-D (n_documents, dim), not empty; got {arr.shape}.")
    refuse_object_array(arr, "corpus", "pass a numeric (n_documents, dim) array.")
    if arr.dtype.kind not in "fiu":
        raise InputTypeError(f"corpus must be numeric; got dtype {arr.dtype}.")
    return float32_rows(arr)


def _qrels(qrels: Any) -> dict[str, dict[str, int]]:
    """``{qid: {docid: grade}}`` from a dict or a TREC / BEIR qrels file, without the queries
    given no judgments (``{}``): those are not judged, and pytrec_eval leaves them out too."""
    from .qrels_files import read_qrels

    judged = {qid: docs for qid, docs in read_qrels(qrels).items() if docs}
    if not judged:
        raise InputError("qrels judge no document; give at least one query with its judgments.")
    return judged


def _exclusions(
    exclude: Any, identical: bool, eval_ids: list[str], doc_index: dict[str, int]
) -> Pairs:
    """The (query, corpus row) pairs never retrieved."""
    qs: list[int] = []
    rows: list[int] = []
    if identical:
        for i, qid in enumerate(eval_ids):
            if qid in doc_index:
                qs.append(i)
                rows.append(doc_index[qid])
    if exclude is not None:
        if not isinstance(exclude, Mapping):
            raise InputTypeError(
                f"exclude must be a dict {{query id: [doc id, ...]}}; got {type(exclude).__name__}."
            )
        position = {qid: i for i, qid in enumerate(eval_ids)}
        for qid, docs in exclude.items():
            excluded = _excluded_docs(qid, docs)  # checked for every query, evaluated or not
            i = position.get(str(qid))
            if i is None:
                continue  # a query without judgments, or not embedded: nothing is ranked for it
            for d in excluded:
                if d in doc_index:  # a doc outside the corpus is never retrieved anyway
                    qs.append(i)
                    rows.append(doc_index[d])
    pairs = np.unique(np.array([qs, rows], dtype=np.int64).reshape(2, -1), axis=1)
    return Pairs(pairs[0], pairs[1])


def _excluded_docs(qid: Any, docs: Any) -> list[str]:
    """``exclude[qid]``, the doc ids as strings, after refusing what is not a collection of
    ids: a bare id (a str would be iterated character by character, an int not at all) and
    bytes, whose ``str`` (``"b'd1'"``) matches no document, so nothing would be left out
    without a word."""
    if isinstance(qid, bytes):
        raise InputTypeError(
            f"exclude holds the bytes query id {qid!r}; ids are str or int, compared as strings "
            "with query_ids. Decode it first, e.g. qid.decode()."
        )
    if isinstance(docs, (str, bytes)) or not isinstance(docs, Iterable):
        raise InputTypeError(
            f"exclude[{qid!r}] must be a list of doc ids, e.g. exclude={{{qid!r}: ['d1', 'd2']}}; "
            f"got {type(docs).__name__} {docs!r:.40}."
        )
    values = list(docs)
    _refuse_bytes(values, f"exclude[{qid!r}]")
    return [str(d) for d in values]


@dataclass
class _Judgments:
    """Each evaluated query's judged documents in CSR form (corpus row -1: not in the corpus)."""

    lims: np.ndarray
    rows: np.ndarray
    grades: np.ndarray

    @property
    def query(self) -> np.ndarray:
        return np.repeat(np.arange(self.lims.size - 1), np.diff(self.lims))


def _refuse_overflowing_queries(scan: CorpusScan, rows: np.ndarray) -> None:
    """Refuse, as corpus rows are, a Euclidean query whose squared norm (after the exact
    centring) overflows float32, named by its row in the caller's queries (``rows``: the scanned
    queries' rows): its scores would not be finite.  Inner products and cosines take such rows."""
    norms = scan.query_norms
    if norms is None or np.isfinite(norms).all():
        return
    row = int(rows[np.flatnonzero(~np.isfinite(norms))[0]])
    raise InputError(
        f"query row {row} holds values so large that its squared norm overflows float32 (about "
        "1e19 and above, measured from the centre of the corpus); rescale the queries and the "
        "corpus by the same power of two, or use distance='cosine'."
    )


def _check_grades(qrels: dict[str, dict[str, int]], gain: str) -> dict[str, dict[str, int]]:
    """``qrels``, after refusing, for ``gain="exponential"``, a grade whose gains could sum past
    float64's range (:func:`embedeval.metrics.judged.refuse_large_grade`), naming it."""
    for qid, docs in qrels.items() if gain == "exponential" else ():
        for doc, grade in docs.items():
            refuse_large_grade(grade, f"qrels give document {doc!r} of query {qid!r} grade")
    return qrels


def _judgments(
    qrels: dict[str, dict[str, int]], eval_ids: list[str], doc_index: dict[str, int]
) -> _Judgments:
    counts = [len(qrels[qid]) for qid in eval_ids]
    rows = [doc_index.get(d, -1) for qid in eval_ids for d in qrels[qid]]
    grades = [g for qid in eval_ids for g in qrels[qid].values()]
    return _Judgments(
        np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]),
        np.asarray(rows, dtype=np.int64),
        np.asarray(grades, dtype=np.int64),
    )


def unembedded_queries(qrels: dict[str, Any], query_ids: Any) -> tuple[list[str], str]:
    """The judged queries of ``qrels`` that no id of ``query_ids`` names (ids compared as
    strings), and the first few of them as an error message shows them.

    >>> unembedded_queries({"a": {}, "b": {}, "c": {}}, ["a", 7])
    (['b', 'c'], "'b', 'c'")
    """
    ids = query_ids.tolist() if isinstance(query_ids, np.ndarray) else query_ids
    known = {str(v) for v in ids}
    absent = [qid for qid in qrels if qid not in known]
    shown = ", ".join(map(repr, absent[:_SHOW])) + (", ..." if len(absent) > _SHOW else "")
    return absent, shown


def _missing(
    qrels: dict[str, dict[str, int]], query_ids: list[str], missing: str, where: str
) -> list[str]:
    """qrels queries without an embedding: an error, or (``missing="zero"``) their ids."""
    absent, shown = unembedded_queries(qrels, query_ids)
    if absent and missing == "error":
        raise InputError(
            f"{len(absent)} qrels queries have no embedding in {where} ({shown}); embed them, "
            "drop them from the qrels, or pass missing='zero' to count them as 0 (trec_eval -c)."
        )
    return absent


def _depth(parsed: list[IRMetric], run_depth: int | None) -> tuple[int, bool]:
    """The top-depth kept per query, and whether full-depth ranks are needed."""
    cuts = [m.depth for m in parsed if m.depth is not None]
    if run_depth is not None:
        cuts.append(check_int(run_depth, "run_depth"))
    full = any(m.depth is None for m in parsed)
    return (max(cuts) if cuts else _DEFAULT_RUN_DEPTH), full


# --------------------------------------------------------------------------- ranks
#: Near documents (16 bytes each) the top pass collects for full-depth metrics, at most: past
#: it, the pairs beyond the top lists are counted again, alone (the benchmark's 1,000 queries
#: with 17,500 relevant judged documents collect about 650,000).
_NEAR_LIMIT = 1 << 22


def _full_counter(
    search: CorpusSearch, scan: CorpusScan, judged: _Judgments, level: int
) -> tuple[np.ndarray, BeatCounter]:
    """For full-depth metrics: the judged documents a full-depth metric reads (in the corpus,
    a grade of at least ``min(level, 1)``) and a counter of what beats each of them, which
    the top pass feeds from its own products (one pass over the corpus, or over each shard)."""
    at = np.flatnonzero((judged.rows >= 0) & (judged.grades >= min(level, 1)))
    pairs = Pairs(judged.query[at], judged.rows[at])
    bounds = score_bounds(search.rows, scan, pairs)
    return at, BeatCounter(scan, pairs, bounds, _NEAR_LIMIT)


def _counted_ranks(
    search: CorpusSearch, scan: CorpusScan, counted: tuple[np.ndarray, BeatCounter], idx: np.ndarray
) -> np.ndarray:
    """Ranks of the judged documents ``idx`` (among the counter's) from the counts of the top
    pass: 1 + the certain beats + the near documents that beat them in float64.  A counter
    that gave up (large runs of ties: more near documents than its limit, most of them maybe
    for pairs inside the top lists) is replaced by a pass that counts for ``idx`` alone."""
    at, counter = counted
    pos = np.searchsorted(at, idx)
    if counter.overflowed:
        pairs = Pairs(counter.pairs.query[pos], counter.pairs.row[pos])
        counter = BeatCounter(scan, pairs, (counter.bounds[0][pos], counter.bounds[1][pos]))
        none = np.zeros(0, dtype=np.int64)
        search.top(scan, Pairs(none, none), counter)
        pos = np.arange(idx.size)
    beats, p, r = counter.result()
    wanted = np.zeros(counter.pairs.query.size, dtype=bool)
    wanted[pos] = True
    keep = wanted[p]  # the near documents of the pairs ranked in the top lists: not needed
    if not keep.all():  # (one copy of the near documents at a time)
        p, r = p[keep], r[keep]
    del keep
    wins = near_wins(search.rows, scan, counter.pairs, p, r)
    return 1 + beats[pos] + wins[pos]


def _ranks(
    search: CorpusSearch,
    scan: CorpusScan,
    judged: _Judgments,
    candidates: tuple[np.ndarray, np.ndarray],
    pair_scores: np.ndarray,
    level: int,
    counted: tuple[np.ndarray, BeatCounter] | None,
) -> np.ndarray:
    """The 1-based rank of each judged document (NOT_RANKED: not retrieved or beyond depth):
    within the top lists (:func:`candidate_ranks`), else (full-depth metrics) from the counts
    of the top pass (``counted``: :func:`_full_counter`)."""
    q = judged.query
    ranks = np.full(q.size, NOT_RANKED, dtype=np.int64)
    present = np.flatnonzero((judged.rows >= 0) & ~np.isnan(pair_scores))
    if present.size and scan.depth:
        pairs = Pairs(q[present], judged.rows[present])
        rank = candidate_ranks(search.rows, scan, candidates, pairs, pair_scores[present])
        ranks[present[rank > 0]] = rank[rank > 0]
    if counted is not None:
        # only a relevant document's rank enters a full-depth metric (nDCG: a positive grade)
        beyond = (ranks == NOT_RANKED) & (judged.rows >= 0) & ~np.isnan(pair_scores)
        beyond &= judged.grades >= min(level, 1)
        idx = np.flatnonzero(beyond)
        if idx.size:
            ranks[idx] = _counted_ranks(search, scan, counted, idx)
    return ranks


# --------------------------------------------------------------------------- the API
def evaluate_qrels(
    queries: Any,
    corpus: Any,
    qrels: Any,
    *,
    query_ids: Any,
    doc_ids: Any,
    metrics: Any = None,
    distance: str = "cosine",
    ties: str = "index",
    relevance_level: int = 1,
    gain: str = "linear",
    missing: str = "error",
    ignore_identical_ids: bool = False,
    exclude: Mapping[Any, Sequence[Any]] | None = None,
    run_depth: int | None = None,
    ci: float | None = None,
    n_boot: int | None = None,
    seed: int = 0,
    block_size: int | None = None,
    memory_budget: int = 256 * 2**20,
    n_threads: int | None = None,
    progress: bool | None = None,
    backend: str = "local",
    device: str | None = None,
    precision: str = "auto",
    shards: int | Sequence[Any] | None = None,
    client: Any = None,
) -> QrelsResult:
    """IR metrics of query embeddings against a corpus, judged by qrels, as trec_eval defines
    them, from an exact ranking of the whole corpus.

    Parameters
    ----------
    queries, corpus : array-like (n, dim)
        numpy arrays, memory-mapped ``.npy`` files (float32 or float16: the corpus is streamed
        in blocks, never copied whole) or torch tensors.  ``corpus=None`` when ``shards`` is a
        list (the pieces are the corpus).
    qrels : dict or path
        ``{query id: {doc id: grade}}`` or a TREC (``qid 0 docid grade``) / BEIR (tsv with a
        header) qrels file.  Grades are integers; 0 and negative grades are judged
        non-relevant.
    query_ids, doc_ids : sequence
        One id per row (str or int; compared as strings; bytes are refused), unique.
    metrics : list of str, optional
        IR metric names (:func:`embedeval.metrics.judged.parse_ir_metrics`; trec_eval, ranx and
        ir_measures spellings too).  Default: ndcg@10, map@100, mrr@10, recall@100,
        recall@1000, precision@10.
    distance : {"cosine", "inner_product", "euclidean"}
        The score is the cosine, the inner product or ``-||q - d||^2``, larger is better, and
        the ranking is that of the float64 keys of the float32 inputs
        (:func:`embedeval.engine.decide.exact_keys`): float32 products only filter, and
        documents whose float32 scores are too close to order are re-scored in float64.
    ties : {"index", "trec_eval"}
        Order of documents with *equal float64 keys*: by corpus row (``"index"``, faiss's
        flat index), or, for equal float64 scores, by document id descending as strings
        (``"trec_eval"``: trec_eval and pytrec_eval sort a run this way, so a written run
        reproduces these numbers exactly).
    relevance_level : int
        Relevant means grade >= this (trec_eval ``-l``), at least 1 (a grade <= 0 is never
        relevant); nDCG uses every positive grade.
    gain : {"linear", "exponential"}
        nDCG gain: the grade (trec_eval) or 2^grade - 1 (grades up to 959).
    missing : {"error", "zero"}
        A qrels query without an embedding: an error listing them, or a 0 for every metric,
        counted in the mean (trec_eval ``-c``).
    ignore_identical_ids : bool
        Never retrieve a document whose id equals the query id (BEIR / MTEB).
    exclude : dict, optional
        ``{query id: [doc id, ...]}`` never retrieved for that query.  Excluded and
        not-indexed judged documents still count in R (the relevant judged documents).
    run_depth : int, optional
        Documents kept per query for :meth:`QrelsResult.run`: at least this many, and never
        fewer than the deepest cut-off of ``metrics``, which the metrics read (default: the
        deepest cut-off, 1,000 when only full-depth metrics are asked).
    ci, n_boot, seed
        Percentile bootstrap intervals of the means over the evaluated queries at level
        ``ci``, ``n_boot`` resamples (default 1000; refused without ``ci``), seeded by
        ``seed``.
    block_size, memory_budget, n_threads, progress
        Corpus rows per block (default: 65,536 for an in-memory float32 corpus, which is
        multiplied as stored; else an eighth of ``memory_budget`` for the block's float32
        copy), worker threads, progress bar over the corpus (default: when stderr is a
        terminal).
    backend, device
        ``"local"`` (numpy), ``"torch"`` (each corpus block moved to ``device`` for its
        product; the ranking stays on the host; default device: the GPU when PyTorch sees
        one, else the CPU) or ``"dask"`` (with ``client``).
    precision : {"auto", "float32", "tf32", "bf16"}
        The torch backend's filter product: bfloat16 copies of both sides (``"bf16"``,
        accumulated in float32), TF32 (CUDA only; on the CPU it is float32) or float32 (on
        the CPU, numpy's product);
        ``"auto"``: bfloat16 on a CPU that multiplies it natively when no metric reads
        deeper than 10 documents (nDCG@10, MRR@10, P@10), else float32 (on a GPU the
        product is a small part of the time, see Notes).  A bfloat16 or TF32 scan of at
        least 65,536 documents whose band a corpus sample shows to hold more than one
        document per 500 of the corpus a query multiplies in float32 instead
        (``settings["precision"]`` says which ran, ``"precision_asked"`` what this argument
        was).  The scores only filter: the band of documents re-scored in float64
        widens with the product's rounding, so the numbers are the same whatever the
        precision; only the time changes.  The other backends multiply in float32 (anything
        but ``"auto"`` is then an error).
    shards : int or list, optional
        The corpus in shards, each scanned by itself and merged exactly (bit-identical
        numbers, :mod:`embedeval.engine.corpus_shards`): an int N splits the corpus rows into N
        contiguous parts; a list of arrays or ``.npy`` paths (memory-mapped) *is* the corpus
        in pieces (``corpus=None``; concatenated in order, one ``doc_ids`` entry per row).
        Numpy products only (not with ``backend="torch"``).
    client : distributed.Client, optional
        With ``backend="dask"``: the shards are scanned on the cluster's workers (``.npy``
        paths are opened there; arrays are scattered), and merged here.  Without ``shards``,
        one contiguous shard per worker.

    Returns
    -------
    QrelsResult

    Notes
    -----
    Which queries count (pytrec_eval's rule): every query with an embedding and judgments; a
    query whose judgments hold nothing relevant scores 0 and counts; a query with an embedding
    and no judgments is skipped (NaN, ``n_skipped``).  A query's value depends only on the
    ranks of its judged documents; equal float64 keys are ordered by ``ties``, so the
    ranking, hence every value, is deterministic and the same whatever ``block_size``.
    Memory: the queries, one corpus block and O(n_queries x depth), plus the near-ties.

    A bfloat16 product errs by up to about ``2**-7`` of ``||q|| ||d||``: every document
    within twice that of the depth-th score is a candidate and is re-scored in float64, and
    documents that close to each other are ordered in float64 too (a float64 dot product
    each, and a fixed-order sum where those meet).  At depth 1,000 on a corpus of a few
    hundred thousand that is a few thousand documents per query, which costs more on the host
    than the faster product saves on a two-core CPU (``benchmarks/bench_qrels.py``: even at
    depth 20 on an AMD EPYC, measured before the float64 dot-product bounds; between depth 40
    and 100 on an Intel Xeon with AMX, after them); for metrics at depth 10 it pays (0.6-0.8x
    the float32 time).  So ``"auto"`` takes bfloat16 for lists of at most 10 documents
    and float32 beyond, unlike :func:`embedeval.evaluate`.  On a GPU it takes float32 at
    every depth: the product is a small part of the scan there (an H200 took 0.9 s for the
    depth-1,000 scan of ``benchmarks/bench_gpu.py``'s ``qrels`` case in float32 and 14.4 s
    with a bfloat16 product and no fall-back).

    Examples
    --------
    >>> import numpy as np, embedeval as ee
    >>> docs = np.float32([[1, 0], [0.8, 0.6], [0, 1]])
    >>> qrels = {"q1": {"d2": 1, "d0": 0}}
    >>> res = ee.evaluate_qrels(np.float32([[1, 0.1]]), docs, qrels, query_ids=["q1"],
    ...                         doc_ids=["d0", "d1", "d2"], metrics=["mrr", "recall@2"])
    >>> res["mrr"], res["recall@2"]  # d2 ranks 3rd of 3
    (0.3333333333333333, 0.0)
    """
    distance = check_choice(distance, "distance", DISTANCES)
    ci, n_boot, seed = check_bootstrap(ci, n_boot, seed)  # before the scan, not after it
    ties = check_choice(ties, "ties", TIES)
    missing = check_choice(missing, "missing", MISSING)
    backend = check_choice(backend, "backend", ("local", "torch", "dask"))
    precision = check_choice(precision, "precision", PRECISIONS)
    ignore_identical_ids = check_bool(ignore_identical_ids, "ignore_identical_ids")
    _check_distributed(backend, shards, client)
    parsed = parse_ir_metrics(metrics)
    level, gain = check_relevance_level(relevance_level), check_choice(gain, "gain", GAINS)
    depth, full = _depth(parsed, run_depth)
    q_all, docs, qids, (dids, doc_index), pieces = _inputs(
        queries, corpus, query_ids, doc_ids, shards
    )
    judgments = _check_grades(_qrels(qrels), gain)
    absent = _missing(judgments, qids, missing, "queries")
    eval_pos = np.array([i for i, qid in enumerate(qids) if qid in judgments], dtype=np.int64)
    eval_ids = [qids[i] for i in eval_pos.tolist()]
    judged = _judgments(judgments, eval_ids, doc_index)
    product, chosen, fallback = _product(backend, device, precision, queries, depth, full)
    scan = _plan(
        q_all[eval_pos],
        docs,
        depth,
        tie_keys(dids, len(dids), ties),
        ties,
        _exclusions(exclude, ignore_identical_ids, eval_ids, doc_index),
        distance=distance,
        block_size=block_size,
        memory_budget=memory_budget,
        n_threads=n_threads,
        progress=progress,
        product=(product, chosen),
    )
    _refuse_overflowing_queries(scan, eval_pos)
    if fallback is not None and _band_too_wide(docs, scan):
        scan = replace(scan, product=fallback[0], precision=fallback[1])
    search = corpus_search(docs, pieces, shards, client, progress)
    pairs = Pairs(judged.query, np.maximum(judged.rows, 0))
    counted = _full_counter(search, scan, judged, level) if full else None
    cand_q, cand_codes, pair_scores = search.top(scan, pairs, counted and counted[1])
    pair_scores[judged.rows < 0] = np.nan
    ranks = _ranks(search, scan, judged, (cand_q, cand_codes), pair_scores, level, counted)
    values = judged_metric_values(
        parsed, judged.lims, ranks, judged.grades, relevance_level=level, gain=gain
    )
    settings = {
        "metrics": [m.name for m in parsed], "distance": distance, "ties": ties,
        "relevance_level": level, "gain": gain, "missing": missing,
        "ignore_identical_ids": ignore_identical_ids, "backend": backend, "device": device,
        "precision": scan.precision, "precision_asked": precision,
        "shards": len(search.pieces),
        "ci": ci, "n_boot": n_boot, "seed": seed,
        **_counts(scan, depth, q_all, docs, judged),
    }  # fmt: skip
    res = _result(values, qids, eval_pos, absent, settings, eval_ids, dids)
    res._ranker = lambda: decide_top(search.rows, scan, cand_q, cand_codes, True)
    res.judged_lims, res.judged_rows, res.judged_grades = judged.lims, judged.rows, judged.grades
    res.judged_ranks = ranks
    return res


def _inputs(
    queries: Any, corpus: Any, query_ids: Any, doc_ids: Any, shards: Any
) -> tuple[np.ndarray, Any, list[str], tuple[list[str], dict[str, int]], list[np.ndarray] | None]:
    """Checked queries (float32, in memory), corpus (as given, or the ``shards`` pieces read as
    one), the ids as strings (the doc ids with the row of each), and the pieces (None: no list
    of shards)."""
    q_all = as_embeddings(queries, "queries")
    pieces = shard_list(corpus, shards, q_all.shape[1])
    docs = _corpus(corpus) if pieces is None else StackedRows(pieces)
    if docs.shape[1] != q_all.shape[1]:
        raise InputError(
            f"queries have dimension {q_all.shape[1]} but the corpus has {docs.shape[1]}; embed "
            "both with the same model."
        )
    qids = _ids(query_ids, q_all.shape[0], "query_ids", "query")[0]
    dids, doc_index = _ids(doc_ids, docs.shape[0], "doc_ids", "corpus")
    return q_all, docs, qids, (dids, doc_index), pieces


def _counts(
    scan: CorpusScan, depth: int, queries: np.ndarray, docs: np.ndarray, judged: _Judgments
) -> dict[str, Any]:
    return {
        "depth": depth, "n_query": int(queries.shape[0]), "n_reference": int(docs.shape[0]),
        "n_judgments": int(judged.rows.size),
        "n_judged_not_in_corpus": int(np.count_nonzero(judged.rows < 0)),
        "n_excluded": int(scan.excluded.row.size), "block_size": scan.block, "average": "micro",
    }  # fmt: skip


def _check_distributed(backend: str, shards: Any, client: Any) -> None:
    """``shards`` / ``client`` against the backend (the client itself is checked later)."""
    if client is not None and backend != "dask":
        raise InputError(
            f"client= is only used with backend='dask' (the backend here is {backend!r}, which "
            "would ignore it); pass backend='dask' to scan the shards on the cluster, or drop "
            "client."
        )
    if backend == "dask" and client is None:
        raise InputError(
            "backend='dask' needs client=, a dask.distributed.Client connected to your cluster "
            "(e.g. Client('tcp://scheduler:8786'), or Client(LocalCluster()) on one machine)."
        )
    if shards is not None and backend == "torch":
        raise InputError(
            f"shards={_shown(shards)} scans the corpus in pieces with numpy products, and "
            "backend='torch' moves each block to a device; drop one of them."
        )
    check_shards(shards)


def _shown(shards: Any) -> str:
    return f"[{len(shards)} pieces]" if isinstance(shards, (list, tuple)) else repr(shards)


def _plan(
    queries: np.ndarray,
    corpus: np.ndarray,
    depth: int,
    keys: np.ndarray,
    ties: str,
    excluded: Pairs,
    *,
    distance: str,
    block_size: int | None,
    memory_budget: int,
    n_threads: int | None,
    progress: bool | None,
    product: tuple[Callable[..., np.ndarray], str],
) -> CorpusScan:
    """The scan: prepared queries, block size from the memory budget, the product."""
    budget = check_int(memory_budget, "memory_budget", minimum=1 << 20)  # bytes, as evaluate
    block_size = check_int(block_size, "block_size", allow_none=True)
    threads = check_int(n_threads, "n_threads", allow_none=True)
    numpy = product[0] is numpy_product
    side = scan_queries(queries, corpus, distance, numpy=numpy)
    if block_size is None:
        block_size = default_block(corpus, budget, side["centre"], numpy)
    return CorpusScan(
        **side,
        depth=depth,
        keys=keys,
        excluded=excluded,
        block=block_size,
        n_threads=threads,
        progress=progress,
        product=product[0],
        raw=np.ascontiguousarray(queries, dtype=np.float32),
        ties=ties,
        precision=product[1],
    )


def _product(
    backend: str, device: Any, precision: str, queries: Any, depth: int, full: bool
) -> tuple[Callable[..., np.ndarray], str, tuple[Callable[..., np.ndarray], str] | None]:
    """The block product and its precision: numpy float32, or on a torch device (``"auto"``:
    bfloat16 for shallow lists on a CPU that multiplies it natively, else float32); and, for a
    bfloat16 or TF32 product, the float32 one of the same device to fall back on
    (:func:`_band_too_wide`)."""
    if backend != "torch":
        if device is not None or precision != "auto":
            name = "device" if device is not None else "precision"
            raise InputError(
                f"{name}= chooses the torch backend's product (the {backend!r} backend "
                f"multiplies in float32 with numpy); pass backend='torch' or drop {name}."
            )
        return numpy_product, "float32", None
    opts = TorchOptions.make(device, like=queries, precision=precision)
    product, chosen = corpus_product(opts, depth <= _BF16_MAX_DEPTH and not full)
    if chosen == "float32":
        return product, chosen, None
    return product, chosen, corpus_product(replace(opts, precision="float32"), False)


def _band_too_wide(docs: Any, scan: CorpusScan) -> bool:
    """Whether a bfloat16 or TF32 scan would leave more candidates per query than it pays
    for: more than one per :data:`_DOCS_PER_CANDIDATE` documents of the corpus
    (:func:`~embedeval.engine.corpus.band_population`, from a sample), in a corpus of at
    least :data:`_FALLBACK_MIN_DOCS` documents (a smaller one keeps the product asked for).
    Every candidate is ordered in float64 on the host, whichever device multiplied: an H200
    took 14.4 s for bench_qrels's depth-1,000 scan with a bfloat16 product, 0.9 s in
    float32."""
    n = docs.shape[0]
    return n >= _FALLBACK_MIN_DOCS and band_population(docs, scan) > n / _DOCS_PER_CANDIDATE


def _result(
    values: dict[str, np.ndarray],
    qids: list[str],
    eval_pos: np.ndarray,
    absent: list[str],
    settings: dict[str, Any],
    eval_ids: list[str],
    dids: list[str],
) -> QrelsResult:
    """Per-query values in ``query_ids`` order (NaN: skipped), then the missing queries (0)."""
    n = len(qids)
    per_query = {}
    for name, v in values.items():
        full = np.full(n + len(absent), np.nan)
        full[eval_pos] = v
        full[n:] = 0.0
        per_query[name] = full
    means = {name: _mean(v) for name, v in per_query.items()}
    res = QrelsResult(
        metrics=means,
        per_query=per_query,
        per_class={},
        query_labels=np.asarray([*qids, *absent], dtype=object),
        n_queries=int(eval_pos.size + len(absent)),
        n_lone=int(n - eval_pos.size),
        n_ties={},
        settings=settings,
        n_missing=len(absent),
        run_ids=eval_ids,
        doc_ids=dids,
    )
    if settings["ci"] is not None:
        res.ci = bootstrap_ci(
            per_query, ci=settings["ci"], n_boot=settings["n_boot"], seed=settings["seed"]
        )
    return res


def _mean(v: np.ndarray) -> float:
    ok = ~np.isnan(v)
    return float(v[ok].mean()) if ok.any() else float("nan")
