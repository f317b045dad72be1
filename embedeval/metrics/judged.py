"""trec_eval's IR metrics from the ranks of the judged documents, vectorised over queries.

Every measure trec_eval reports for a query depends only on where the *judged* documents of the
query sit in its ranking: an unjudged document retrieved at rank 3 changes nothing but the ranks
of the judged documents below it.  So a run is summarised, per query, by the 1-based rank of each
judged document (:data:`NOT_RANKED` when it was not retrieved: beyond the searched depth, or
absent from the corpus) and its grade, in CSR form:

* ``lims``: int64 ``(n_queries + 1,)``; query ``q`` owns entries ``lims[q]:lims[q + 1]``;
* ``ranks``: int64, the rank of each judged document in its query's ranking, or ``NOT_RANKED``;
* ``grades``: int64, each judged document's grade (0 or negative: judged non-relevant).

Definitions (those of trec_eval 9, checked against pytrec_eval).  A document is *relevant* when
its grade is ``>= relevance_level`` (trec_eval's ``-l``); R_q counts the relevant judged documents
of query q, retrieved or not.  Every quotient with a zero denominator is 0, as in trec_eval.

==================  =====================================================================
``precision@k``     relevant in the top k / k (k even when fewer than k documents exist)
``recall@k``        relevant in the top k / R_q
``hit_rate@k``      1 if a relevant document is in the top k (trec_eval ``success``)
``mrr@k``, ``mrr``  1 / rank of the first relevant document if that rank is <= k, else 0
``map@k``, ``map``  Σ over relevant d with rank(d) <= k of P@rank(d), divided by R_q
``r_precision``     relevant in the top R_q / R_q
``judged@k``        judged documents (any grade) in the top k / k (k even when fewer exist)
``ndcg@k``, ``ndcg``  DCG@k / ideal DCG@k, DCG@k = Σ_{rank <= k} gain(grade) / log2(rank + 1)
==================  =====================================================================

nDCG follows trec_eval exactly: the gain is the grade (``gain="linear"``, trec_eval's only gain)
or 2^grade − 1 (``gain="exponential"``); a grade <= 0 has gain 0 (a negative grade never
subtracts); ``relevance_level`` does not apply to nDCG (every positive grade has its gain); the
ideal DCG sorts *all* judged grades of the query, retrieved or not, and is cut at k.  nDCG is 0
when the ideal DCG is 0.  Ranks are given, so there are no ties to break here.

Example: the top 3 hold grades 0, 2 and 1 and a grade-3 document was not retrieved.

>>> import numpy as np
>>> lims = np.array([0, 4])
>>> ranks = np.array([1, 2, 3, NOT_RANKED])
>>> grades = np.array([0, 2, 1, 3])
>>> v = judged_metric_values(["mrr@10", "recall@3", "map", "ndcg@3"], lims, ranks, grades)
>>> float(v["mrr@10"][0]), float(v["recall@3"][0])  # first relevant at rank 2; 2 of 3 found
(0.5, 0.6666666666666666)
>>> float(v["map"][0]) == (1 / 2 + 2 / 3) / 3
True
>>> dcg = 2 / np.log2(3) + 1 / np.log2(4)
>>> ideal = 3 / np.log2(2) + 2 / np.log2(3) + 1 / np.log2(4)
>>> bool(np.isclose(v["ndcg@3"][0], dcg / ideal))
True
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..utils.errors import InputError, InputTypeError
from ..utils.validation import as_int64, check_choice, check_int, suggest

__all__ = [
    "DEFAULT_IR_METRICS",
    "GAINS",
    "MAX_EXPONENTIAL_GRADE",
    "NOT_RANKED",
    "IRMetric",
    "check_relevance_level",
    "judged_metric_values",
    "parse_ir_metrics",
    "refuse_large_grade",
]

#: The rank of a judged document that is not in the ranking (beyond the depth, or not indexed).
NOT_RANKED: int = int(np.iinfo(np.int64).max)

#: What :func:`parse_ir_metrics` returns for ``metrics=None`` (the BEIR / MTEB retrieval set).
DEFAULT_IR_METRICS = ("ndcg@10", "map@100", "mrr@10", "recall@100", "recall@1000", "precision@10")

_NEEDS_K = ("precision", "recall", "hit_rate", "judged")

#: nDCG's gains: the grade (trec_eval's) or ``2**grade - 1``.
GAINS = ("linear", "exponential")
#: The largest grade ``gain="exponential"`` takes: gains ``2**grade - 1`` below ``2**959``
#: keep every DCG, a sum of at most ``2**63`` of them, a finite float64 (below ``2**1023``).
MAX_EXPONENTIAL_GRADE = 959


def refuse_large_grade(grade: float, where: str) -> None:
    """The ``InputError`` of ``gain="exponential"`` for a ``grade`` above
    :data:`MAX_EXPONENTIAL_GRADE` (``where``: what holds it, for the message); nothing else.

    >>> refuse_large_grade(3, "grades")  # within range: nothing raised
    """
    if grade > MAX_EXPONENTIAL_GRADE:
        raise InputError(
            f"gain='exponential' needs grades of at most {MAX_EXPONENTIAL_GRADE} (beyond, sums of "
            f"2**grade - 1 overflow float64); {where} {grade:g}. Use gain='linear' or grades on "
            "a smaller scale."
        )


def check_relevance_level(value: Any) -> int:
    """``relevance_level`` as an int, at least 1: grades <= 0 are judged non-relevant, so a
    lower level would make them relevant (pytrec_eval refuses a level of 0 too).

    >>> check_relevance_level(2)
    2
    """
    level = check_int(value, "relevance_level", minimum=None)
    if level < 1:
        raise InputError(
            f"relevance_level must be at least 1; got {level}. A document is relevant when its "
            "grade is >= relevance_level, and grades <= 0 mean judged non-relevant (as in "
            "trec_eval; pytrec_eval refuses a level of 0 too)."
        )
    return level


# Every spelling (lower case) of a metric family: canonical, trec_eval, ranx and ir_measures.
_ALIASES = {
    "ndcg": "ndcg",
    "ndcg_cut": "ndcg",
    "map": "map",
    "map_cut": "map",
    "ap": "map",
    "mrr": "mrr",
    "recip_rank": "mrr",
    "rr": "mrr",
    "precision": "precision",
    "p": "precision",
    "recall": "recall",
    "r": "recall",
    "hit_rate": "hit_rate",
    "hitrate": "hit_rate",
    "hits": "hit_rate",
    "success": "hit_rate",
    "judged": "judged",
    "r_precision": "r_precision",
    "r-precision": "r_precision",
    "rprec": "r_precision",
}
_SPELLINGS = (
    "ndcg@10",
    "ndcg",
    "map@100",
    "map",
    "mrr@10",
    "mrr",
    "precision@10",
    "recall@100",
    "hit_rate@10",
    "r_precision",
    "judged@10",
    "ndcg_cut_10",
    "map_cut_100",
    "recip_rank",
    "P_10",
    "recall_100",
    "success_10",
    "Rprec",
)
_NAME = re.compile(r"^(?P<base>[a-z][a-z_\-]*?)(?:(?:@|_|\.)(?P<k>[+-]?\d+(?:\.\d*)?))?$")
_ML_NAME = re.compile(r"^(?P<base>recall|precision|map|mrr|ndcg|hit_rate)_at_(?P<k>\d+|r)$")


@dataclass(frozen=True)
class IRMetric:
    """One IR metric: its canonical ``name``, its ``kind`` and its cut-off ``k`` (or None).

    >>> IRMetric("ndcg@10", "ndcg", 10).depth, IRMetric("map", "map", None).depth
    (10, None)
    >>> IRMetric("r_precision", "r_precision", None).depth is None  # R_q can exceed any cut
    True
    """

    name: str
    kind: str
    k: int | None

    @property
    def depth(self) -> int | None:
        """How much of the ranking the metric reads: ``k``, or None for the whole ranking."""
        return None if self.kind == "r_precision" else self.k


def _metric(kind: str, k: int | None) -> IRMetric:
    return IRMetric(kind if k is None else f"{kind}@{k}", kind, k)


def _clash_message(name: str, base: str, k: str) -> str:
    if base == "recall":
        return (
            f"metric {name!r} is ambiguous: ee.evaluate's recall_at_{k} is the metric-learning "
            f"hit rate, IR recall is not. Use 'recall@{k}' for IR recall (relevant retrieved in "
            f"the top {k} / R, the relevant judged documents) or 'hit_rate@{k}' (1 if any "
            f"relevant document is in the top {k}, what evaluate calls recall_at_{k})."
        )
    if base == "map" and k == "r":
        return (
            f"metric {name!r} (MAP@R, from ee.evaluate) is not an IR metric here. Use "
            "'r_precision' (relevant in the top R / R), 'map' (average precision over the whole "
            "ranking) or 'map@k'."
        )
    spelled = f"{base}@{k}"
    return f"metric {name!r} is ee.evaluate's spelling; IR metrics here are named {spelled!r}."


def _parse_one(metric: Any) -> IRMetric:
    if isinstance(metric, IRMetric):
        return _parse_one(metric.name)
    if not isinstance(metric, str):
        raise InputTypeError(
            f"metrics must hold metric names (str); got {metric!r} of type "
            f"{type(metric).__name__}. Example: metrics=['ndcg@10', 'recall@100']."
        )
    low = metric.strip().lower()
    clash = _ML_NAME.match(low)
    if clash:
        raise InputError(_clash_message(metric, clash["base"], clash["k"]))
    match = _NAME.match(low)
    kind = _ALIASES.get(match["base"]) if match else None
    if kind is None:
        raise InputError(
            f"unknown IR metric {metric!r}; use one of {', '.join(_SPELLINGS)} (any cut-off)."
            + suggest(metric, _SPELLINGS)
        )
    if match["k"] is None:
        if kind in _NEEDS_K or match["base"] in ("ndcg_cut", "map_cut"):
            raise InputError(f"IR metric {metric!r} needs a cut-off k; write e.g. '{kind}@10'.")
        return _metric(kind, None)
    if kind == "r_precision":
        raise InputError(
            f"IR metric {metric!r}: r_precision takes no cut-off; write 'r_precision'."
        )
    k = match["k"]
    if not k.lstrip("+").isdigit() or int(k) < 1:
        raise InputError(
            f"IR metric {metric!r}: the cut-off k must be a positive integer; got {k!r}."
        )
    return _metric(kind, int(k))


def parse_ir_metrics(metrics: Any = None) -> list[IRMetric]:
    """Parse IR metric names (canonical, trec_eval, ranx or ir_measures spellings).

    Canonical names: ``ndcg@k``, ``ndcg``, ``map@k``, ``map``, ``mrr@k``, ``mrr``,
    ``precision@k``, ``recall@k``, ``hit_rate@k``, ``r_precision``, ``judged@k``.  Aliases (any
    case): trec_eval's ``ndcg_cut_10`` / ``ndcg_cut.10``, ``map_cut_100``, ``recip_rank``,
    ``P_10`` / ``P.10`` / ``P@10``, ``recall_100``, ``success_10`` (= ``hit_rate@10``), ``Rprec``;
    ranx's ``r-precision``; ir_measures' ``AP``, ``RR@10``, ``R@100``, ``Success@10``,
    ``Judged@10``.  ``None`` gives :data:`DEFAULT_IR_METRICS`; a string is one metric;
    duplicates are dropped, keeping the first.  ``ee.evaluate``'s names (``recall_at_10``: a hit
    rate there) are refused with the IR name to use.

    >>> [m.name for m in parse_ir_metrics(["NDCG_cut.10", "P_5", "recip_rank", "success@1"])]
    ['ndcg@10', 'precision@5', 'mrr', 'hit_rate@1']
    >>> parse_ir_metrics("recall_at_10")
    Traceback (most recent call last):
    ...
    embedeval.utils.errors.InputError: metric 'recall_at_10' is ambiguous: ee.evaluate's \
recall_at_10 is the metric-learning hit rate, IR recall is not. Use 'recall@10' for IR recall \
(relevant retrieved in the top 10 / R, the relevant judged documents) or 'hit_rate@10' (1 if any \
relevant document is in the top 10, what evaluate calls recall_at_10).
    """
    if metrics is None:
        metrics = DEFAULT_IR_METRICS
    if isinstance(metrics, (str, IRMetric)):
        metrics = [metrics]
    if not isinstance(metrics, Iterable):
        raise InputTypeError(
            f"metrics must be a metric name or a list of names; got {type(metrics).__name__}."
        )
    parsed = list(dict.fromkeys(_parse_one(m) for m in metrics))
    if not parsed:
        raise InputError("metrics is empty; give at least one, e.g. metrics=['ndcg@10'].")
    return parsed


# --------------------------------------------------------------------------- computation
# What each CSR array must hold, for the message refusing a uint64 value that int64 cannot.
_CSR_FIX = {
    "lims": "Pass entry offsets (query q owns entries lims[q]:lims[q + 1]).",
    "ranks": "Pass 1-based ranks, NOT_RANKED (2**63 - 1) for a judged document not retrieved.",
    "grades": "Pass grades within the 64-bit integer range, as trec_eval's C long holds them.",
}


def _check_csr(lims: Any, ranks: Any, grades: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    arrays = []
    for name, value in (("lims", lims), ("ranks", ranks), ("grades", grades)):
        arr = as_int64(value, name, _CSR_FIX[name])  # first: names an integer beyond 64 bits
        if arr.ndim != 1 or (arr.dtype.kind not in "iu" and arr.size):
            raise InputError(
                f"{name} must be a 1-D integer array; got dtype {arr.dtype}, shape {arr.shape}."
            )
        arrays.append(arr.astype(np.int64, copy=False))
    lims, ranks, grades = arrays
    if lims.size == 0 or lims[0] != 0 or np.any(np.diff(lims) < 0):
        raise InputError(
            "lims must start at 0 and never decrease (query q owns entries lims[q]:lims[q+1]); "
            f"got {lims[:8].tolist()}{' ...' if lims.size > 8 else ''}."
        )
    if ranks.shape != grades.shape or lims[-1] != ranks.size:
        raise InputError(
            f"ranks and grades must both hold lims[-1] = {int(lims[-1])} entries; got "
            f"{ranks.size} ranks and {grades.size} grades."
        )
    if ranks.size and ranks.min() < 1:
        raise InputError(
            f"ranks are 1-based (NOT_RANKED for a judged document not retrieved); got "
            f"{int(ranks.min())}."
        )
    return lims, ranks, grades


def _sort_within(qid: np.ndarray, key: np.ndarray) -> np.ndarray:
    """The order sorting entries by ``key`` (>= 0) inside each query; query blocks stay put.

    One argsort of ``qid * span + key`` (several times faster than ``np.lexsort``), with the
    unranked sentinel mapped just past the largest rank so the product cannot overflow.
    """
    finite = key != NOT_RANKED
    top = int(key[finite].max(initial=0)) + 1
    key = np.where(finite, key, top)
    span = top + 1
    if qid.size and int(qid[-1]) + 1 > (2**62) // span:
        return np.lexsort((key, qid))
    return np.argsort(qid * span + key, kind="stable")


class _Queries:
    """The judged documents of every query sorted by (query, rank), with per-query counts."""

    def __init__(self, lims: np.ndarray, ranks: np.ndarray, grades: np.ndarray, level: int):
        self.n = lims.size - 1
        self.starts = lims[:-1]
        qid = np.repeat(np.arange(self.n), np.diff(lims))
        order = _sort_within(qid, ranks)
        self.qid, self.rank, self.grade = qid, ranks[order], grades[order]
        ranked = self.rank != NOT_RANKED
        same = ranked[1:] & (self.rank[1:] == self.rank[:-1]) & (qid[1:] == qid[:-1])
        if same.any():
            at = int(np.flatnonzero(same)[0])
            raise InputError(
                f"ranks: query {int(qid[at])} has two judged documents at rank "
                f"{int(self.rank[at])}; each rank holds one document."
            )
        self.relevant = self.grade >= level
        self.n_relevant = self.count(self.relevant)
        rel_rank = self.rank[self.relevant]
        # Relevant documents above and at each relevant one: every relevant document is judged,
        # so this is the number of relevant documents in the top rank(d).
        rel_qid = qid[self.relevant]
        first = np.searchsorted(rel_qid, np.arange(self.n))
        self.rel_qid, self.rel_rank = rel_qid, rel_rank
        self.rel_seen = np.arange(1, rel_rank.size + 1) - first[rel_qid]
        self.first_rel = np.full(self.n, NOT_RANKED, dtype=np.int64)
        nonempty = self.n_relevant > 0
        self.first_rel[nonempty] = rel_rank[first[nonempty]]

    def count(self, mask: np.ndarray) -> np.ndarray:
        """Per-query number of entries where ``mask`` holds."""
        return np.bincount(self.qid[mask], minlength=self.n).astype(np.float64)

    def total(self, values: np.ndarray, mask: np.ndarray, qid: np.ndarray) -> np.ndarray:
        """Per-query sum of ``values[mask]``, added in rank order (trec_eval's order)."""
        # (bincount gives int64 when there are no entries at all)
        return np.bincount(qid[mask], weights=values[mask], minlength=self.n).astype(np.float64)

    def in_top(self, k: int | None) -> np.ndarray:
        return self.rank != NOT_RANKED if k is None else self.rank <= k


def _ratio(num: np.ndarray, den: np.ndarray | float) -> np.ndarray:
    den = np.broadcast_to(np.asarray(den, dtype=np.float64), num.shape)
    out = np.zeros(num.shape, dtype=np.float64)
    np.divide(num, den, out=out, where=den > 0)
    return out


def _gains(grades: np.ndarray, gain: str) -> np.ndarray:
    g = np.maximum(grades, 0).astype(np.float64)
    return g if gain == "linear" else np.exp2(g) - 1.0


def _ndcg(qs: _Queries, k: int | None, gain: str) -> np.ndarray:
    gains = _gains(qs.grade, gain)
    top = qs.in_top(k) & (gains > 0)
    rank = np.where(top, qs.rank, 1).astype(np.float64)
    dcg = qs.total(gains / np.log2(rank + 1.0), top, qs.qid)
    # The ideal ranking: every judged grade of the query, best first, cut at k.
    clipped = np.maximum(qs.grade, 0)
    order = _sort_within(qs.qid, clipped.max(initial=0) - clipped)
    ideal = gains[order]
    position = np.arange(1, ideal.size + 1) - qs.starts[qs.qid]
    keep = (ideal > 0) & (True if k is None else position <= k)
    idcg = qs.total(ideal / np.log2(position + 1.0), keep, qs.qid)
    return _ratio(dcg, idcg)


def _map(qs: _Queries, k: int | None) -> np.ndarray:
    ranked = qs.rel_rank != NOT_RANKED if k is None else qs.rel_rank <= k
    rank = np.where(ranked, qs.rel_rank, 1).astype(np.float64)
    return _ratio(qs.total(qs.rel_seen / rank, ranked, qs.rel_qid), qs.n_relevant)


def _value(qs: _Queries, metric: IRMetric, gain: str) -> np.ndarray:
    kind, k = metric.kind, metric.k
    if kind == "ndcg":
        return _ndcg(qs, k, gain)
    if kind == "map":
        return _map(qs, k)
    if kind == "mrr":
        hit = qs.first_rel != NOT_RANKED if k is None else qs.first_rel <= k
        return _ratio(hit.astype(np.float64), np.where(hit, qs.first_rel, 0).astype(np.float64))
    if kind == "r_precision":
        top = qs.rank <= qs.n_relevant[qs.qid]
        return _ratio(qs.count(qs.relevant & top), qs.n_relevant)
    if kind == "judged":
        return qs.count(qs.in_top(k)) / k
    hits = qs.count(qs.relevant & qs.in_top(k))
    if kind == "precision":
        return hits / k
    if kind == "recall":
        return _ratio(hits, qs.n_relevant)
    return (hits > 0).astype(np.float64)  # hit_rate


def judged_metric_values(
    metrics: Any,
    lims: Any,
    ranks: Any,
    grades: Any,
    *,
    relevance_level: int = 1,
    gain: str = "linear",
) -> dict[str, np.ndarray]:
    """Per-query IR metrics from the ranks and grades of each query's judged documents.

    Parameters
    ----------
    metrics
        Names or :class:`IRMetric` objects (anything :func:`parse_ir_metrics` accepts).
    lims, ranks, grades
        CSR arrays (see the module docstring): query q's judged documents are entries
        ``lims[q]:lims[q+1]``, with their 1-based rank (:data:`NOT_RANKED` when not retrieved)
        and their integer grade.  Ranks of one query must be distinct.
    relevance_level
        Relevant means grade >= ``relevance_level`` (trec_eval ``-l``), at least 1; not used
        by nDCG.
    gain
        nDCG's gain: ``"linear"`` (the grade, trec_eval's) or ``"exponential"`` (2^grade − 1,
        grades up to :data:`MAX_EXPONENTIAL_GRADE`); grades <= 0 have gain 0 either way.

    Returns
    -------
    dict
        Canonical metric name -> float64 array of per-query values (``n_queries``,).

    Examples
    --------
    Two queries; query 1 has nothing relevant (every value 0, as in trec_eval).

    >>> v = judged_metric_values(
    ...     ["precision@2", "hit_rate@1", "r_precision"],
    ...     lims=[0, 2, 3], ranks=[2, 1, 1], grades=[1, 1, 0])
    >>> {name: values.tolist() for name, values in v.items()}
    {'precision@2': [1.0, 0.0], 'hit_rate@1': [1.0, 0.0], 'r_precision': [1.0, 0.0]}
    """
    parsed = parse_ir_metrics(metrics)
    level = check_relevance_level(relevance_level)
    gain = check_choice(gain, "gain", GAINS)
    qs = _Queries(*_check_csr(lims, ranks, grades), level)
    if gain == "exponential" and qs.grade.size:
        top = int(qs.grade.max())
        at = int(np.flatnonzero(np.asarray(grades) == top)[0])
        refuse_large_grade(top, f"grades holds, at position {at},")
    return {m.name: _value(qs, m, gain) for m in parsed}
