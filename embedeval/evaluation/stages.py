"""The core stages of :func:`embedeval.evaluate`, after validation: data, plan, run, summarise.

1. :func:`prepare_data` checks the arrays and turns them into what the engine reads: embeddings
   (scaled into float32's range), integer label codes, the exclusion rules, R_q and the number
   of references each query can see (:class:`EvaluationData`).
2. :func:`plan_search` resolves the depth (``k="max_bin_count"``), the default metrics and the
   cut-offs, and builds the :class:`embedeval.search.local.RetrievalTask` (:class:`SearchPlan`).
3. :func:`embedeval.search.dispatch.run_search` hands the task to the backend the settings select.
4. :func:`summarise` aggregates the per-query values (micro / macro), adds NMI / AMI and wraps
   everything in an :class:`embedeval.evaluation.result.EvaluationResult`.

:func:`evaluate_prepared` chains 2-4; the add-ons (confidence summary, reject-both curve,
bootstrap intervals) live above, in :mod:`embedeval.evaluate` and
:mod:`embedeval.evaluation.rejection`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine.arrays import (
    as_search_input,
    centre_for_distance,
    check_lead_on_device,
    scale_for_range,
    to_host,
)
from ..engine.exact import Exclusions
from ..engine.labels import is_label_sets, match_matrix, match_pairs, pack_label_sets
from ..engine.registry import MetricInfo
from ..metrics.averages import aggregate, aggregate_label_sets
from ..search.dispatch import SearchOutcome, run_search
from ..search.local import RetrievalTask
from ..search.neighbors import check_queries_lead_reference
from ..utils.errors import EmbedevalWarning, InputError
from ..utils.validation import (
    as_any_labels,
    as_embeddings,
    as_labels,
    as_labels_like,
    check_same_dimension,
    check_same_label_kind,
    factorize,
)
from .approximation import warn_if_biased
from .result import EvaluationResult
from .settings import EvaluationInputs, EvaluationSettings, metrics_at_depth, warn_truncated

__all__ = [
    "EvaluationData",
    "SearchPlan",
    "evaluate_core",
    "evaluate_prepared",
    "plan_search",
    "prepare_data",
    "summarise",
]


@dataclass(frozen=True)
class EvaluationData:
    """The checked arrays of one evaluation, as the engine reads them.

    ``query`` / ``reference`` are the embeddings times 2**``scale``, minus ``centre`` when it
    is not None (numpy, or tensors on their device for the torch backend; the same object when
    leave-one-out); ``query_codes`` / ``reference_codes`` index ``uniques``, or, for
    multi-label data (``query_labels`` a 2-D bool indicator array), are the packed label sets
    of :mod:`embedeval.engine.labels` and ``uniques`` the label columns; ``relevant`` is R_q
    and ``n_valid`` the number of
    references each query can see.
    """

    query: Any
    reference: Any
    query_labels: np.ndarray
    query_codes: np.ndarray
    reference_codes: np.ndarray
    uniques: np.ndarray
    exclusions: Exclusions
    relevant: np.ndarray
    n_valid: np.ndarray
    scale: int
    centre: np.ndarray | None = None

    @property
    def n_query(self) -> int:
        return int(self.query.shape[0])

    @property
    def n_reference(self) -> int:
        return int(self.reference.shape[0])


@dataclass(frozen=True)
class SearchPlan:
    """The resolved depth and metrics, and the task handed to the search backend."""

    infos: tuple[MetricInfo, ...]
    k_used: int | None
    task: RetrievalTask

    @property
    def knn_infos(self) -> tuple[MetricInfo, ...]:
        """The metrics read from the ranking (all but NMI / AMI)."""
        return self.task.metrics


# ---------------------------------------------------------------------------- data
def prepare_data(settings: EvaluationSettings, inputs: EvaluationInputs) -> EvaluationData:
    """Check the arrays and derive label codes, exclusions, R_q and n_valid (no search).

    Examples
    --------
    >>> from embedeval.evaluation.settings import EvaluationInputs, validate_arguments
    >>> inputs = EvaluationInputs([[0.0], [1.0], [5.0]], ["a", "b", "a"])
    >>> data = prepare_data(validate_arguments(inputs), inputs)
    >>> data.query_codes.tolist(), data.relevant.tolist(), data.n_valid.tolist()
    ([0, 1, 0], [1, 0, 1], [2, 2, 2])
    """
    on_device = settings.search.torch is not None
    if on_device:
        xq = as_search_input(inputs.query, "query")
    else:
        xq = as_embeddings(inputs.query, "query")
    yq = as_any_labels(inputs.query_labels, "query_labels", length=xq.shape[0], length_of="query")
    multi = yq.ndim == 2
    leave_one_out = settings.protocol.leave_one_out
    self_index = leave_one_out or settings.protocol.ref_includes_query
    if leave_one_out:
        xb, yb = xq, yq
    else:
        xb, yb = _reference(inputs, xq, on_device, self_index, yq.shape[1] if multi else None)
        if not multi:  # 1 and "1" never share a class: every query would be lone, silently
            check_same_label_kind(yq, "query_labels", yb, "reference_labels")
    # Keys would overflow or underflow float32: rank the data times 2**scale.
    xq, xb, scale = scale_for_range(xq, xb, settings.metrics.distance, same=leave_one_out)
    # Norms that dwarf the distances cancel every digit of the Euclidean keys: translate the
    # data by a centre whose subtraction is exact (distances and ties unchanged).
    xq, xb, centre = centre_for_distance(xq, xb, settings.metrics.distance, same=leave_one_out)
    if multi:
        q_codes = pack_label_sets(yq)
        r_codes = q_codes if leave_one_out else pack_label_sets(yb)
        uniques = np.arange(yq.shape[1])
    else:
        q_codes, r_codes, uniques = _label_codes(yq, yb, leave_one_out)
    if self_index and not leave_one_out:
        own = r_codes[: xq.shape[0]]
        differ = np.flatnonzero((q_codes != own).any(axis=1) if multi else q_codes != own)
        if differ.size:
            raise InputError(
                "ref_includes_query=True, but query_labels and the first reference_labels differ "
                f"(first at row {int(differ[0])}); the queries must be the first reference rows "
                "with the same labels."
            )
    exclusions, relevant, n_valid = exclusion_counts(
        q_codes, r_codes, self_index, leave_one_out, inputs.query_groups, inputs.reference_groups
    )
    return EvaluationData(
        xq, xb, yq, q_codes, r_codes, uniques, exclusions, relevant, n_valid, scale, centre
    )


def _reference(
    inputs: EvaluationInputs, xq: Any, on_device: bool, queries_lead: bool, n_labels: int | None
) -> tuple[Any, np.ndarray]:
    """The gallery and its labels, checked against the queries (``queries_lead``: PML's
    ``ref_includes_query``, the queries are the first reference rows; ``n_labels``: the
    columns of the queries' label indicator array, None for single labels)."""
    if on_device:
        xb = as_search_input(inputs.reference, "reference")
    else:
        xb = as_embeddings(inputs.reference, "reference")
    yb = as_labels_like(
        inputs.reference_labels,
        "reference_labels",
        n_labels=n_labels,
        length=xb.shape[0],
        length_of="reference",
    )
    check_same_dimension(xq, xb, "reference")
    if queries_lead and on_device:
        check_lead_on_device(xq, xb)
    elif queries_lead:
        check_queries_lead_reference(xq, xb)
    return xb, yb


def _label_codes(
    yq: np.ndarray, yb: np.ndarray, leave_one_out: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shared integer codes of the query and reference labels, and the labels they stand for."""
    if leave_one_out:
        (q_codes,), uniques = factorize(yq)
        r_codes = q_codes
    else:
        (q_codes, r_codes), uniques = factorize(yq, yb)
    if uniques.size < 2**31:  # the kernels gather a label code per candidate: half the bytes
        q_codes = q_codes.astype(np.int32)
        r_codes = q_codes if leave_one_out else r_codes.astype(np.int32)
    return q_codes, r_codes, uniques


def exclusion_counts(
    q_codes: np.ndarray,
    r_codes: np.ndarray,
    self_index: bool,
    leave_one_out: bool,
    query_groups: Any,
    reference_groups: Any,
) -> tuple[Exclusions, np.ndarray, np.ndarray]:
    """Exclusion rules, R_q and the number of references each query can see — by counting, in
    O(n), without touching an n_query x n_reference matrix.

    R_q counts the references with the query's label outside the query's group and other than
    the query itself; n_valid counts every reference outside the group, the query excluded.

    Examples
    --------
    >>> codes = np.array([0, 0, 1])
    >>> ex, r_q, n_valid = exclusion_counts(codes, codes, True, True, None, None)
    >>> r_q.tolist(), n_valid.tolist()  # leave-one-out: 2 - 1, 2 - 1, 1 - 1 same-label others
    ([1, 1, 0], [2, 2, 2])
    """
    if is_label_sets(q_codes):
        return _label_set_counts(
            q_codes, r_codes, self_index, leave_one_out, query_groups, reference_groups
        )
    n_query, n_ref = q_codes.shape[0], r_codes.shape[0]
    n_classes = int(max(q_codes.max(), r_codes.max())) + 1
    relevant = np.bincount(r_codes, minlength=n_classes)[q_codes].astype(np.int64)
    n_valid = np.full(n_query, n_ref, dtype=np.int64)
    if self_index:
        relevant -= 1  # the query's own row has its label (checked for ref_includes_query)
        n_valid -= 1
    if query_groups is None and reference_groups is None:
        return Exclusions(self_index=self_index), relevant, n_valid
    gq = as_labels(query_groups, "query_groups", length=n_query, length_of="query", groups=True)
    if leave_one_out:
        (qg,), _ = factorize(gq)
        rg = qg
    else:
        gr = as_labels(
            reference_groups, "reference_groups", length=n_ref, length_of="reference", groups=True
        )
        # group "0" never equals group 0: a mix would hide nothing, silently
        check_same_label_kind(gq, "query_groups", gr, "reference_groups")
        (qg, rg), _ = factorize(gq, gr)
    n_groups = int(max(qg.max(), rg.max())) + 1
    same_group = np.bincount(rg, minlength=n_groups)[qg]
    pair_ref = r_codes.astype(np.int64) * n_groups + rg
    pair_query = q_codes.astype(np.int64) * n_groups + qg
    uniq, counts = np.unique(pair_ref, return_counts=True)
    pos = np.clip(np.searchsorted(uniq, pair_query), 0, max(uniq.size - 1, 0))
    same_label_group = np.where(uniq[pos] == pair_query, counts[pos], 0)
    relevant = np.bincount(r_codes, minlength=n_classes)[q_codes] - same_label_group
    n_valid = n_ref - same_group
    if self_index:
        # The query's own row is excluded even when its reference group differs.
        own_group_differs = rg[:n_query] != qg
        relevant = relevant - own_group_differs
        n_valid = n_valid - own_group_differs
    ex = Exclusions(self_index=self_index, query_groups=qg, reference_groups=rg)
    return ex, relevant.astype(np.int64), n_valid.astype(np.int64)


def _label_set_counts(
    q_sets: np.ndarray,
    r_sets: np.ndarray,
    self_index: bool,
    leave_one_out: bool,
    query_groups: Any,
    reference_groups: Any,
) -> tuple[Exclusions, np.ndarray, np.ndarray]:
    """:func:`exclusion_counts` of packed label sets: R_q counts the references sharing at
    least one label with the query, outside its group and other than itself.

    The references are counted per distinct label set (few, in multi-label data sets), and
    the excluded ones (the query itself, its group) subtracted pair by pair.

    >>> sets = np.array([[1], [3], [2], [0]], dtype=np.uint64)  # {0}, {0, 1}, {1}, {}
    >>> _, r_q, n_valid = _label_set_counts(sets, sets, True, True, None, None)
    >>> r_q.tolist(), n_valid.tolist()
    ([1, 2, 1, 0], [3, 3, 3, 3])
    """
    zeros_q = np.zeros(q_sets.shape[0], dtype=np.int32)
    zeros_r = zeros_q if leave_one_out else np.zeros(r_sets.shape[0], dtype=np.int32)
    ex, _, n_valid = exclusion_counts(
        zeros_q, zeros_r, self_index, leave_one_out, query_groups, reference_groups
    )
    distinct_r, r_counts = np.unique(r_sets, axis=0, return_counts=True)
    distinct_q, q_inverse = np.unique(q_sets, axis=0, return_inverse=True)
    totals = np.empty(distinct_q.shape[0], dtype=np.int64)
    step = max(1, (1 << 24) // max(1, distinct_r.shape[0]))
    for a in range(0, distinct_q.shape[0], step):  # bounded memory: blocks of distinct sets
        totals[a : a + step] = match_matrix(distinct_q[a : a + step], distinct_r) @ r_counts
    relevant = totals[q_inverse.ravel()]
    if self_index:
        # The own row shares its labels with the query unless it has none; with groups it is
        # counted below when it lies in the query's group.
        own_counted = np.zeros(q_sets.shape[0], dtype=bool)
        if ex.query_groups is not None:
            own_counted = ex.reference_groups[: q_sets.shape[0]] == ex.query_groups
        relevant -= (q_sets != 0).any(axis=1) & ~own_counted
    if ex.query_groups is not None:
        relevant -= _same_group_matches(q_sets, r_sets, ex.query_groups, ex.reference_groups)
    return ex, relevant, n_valid


def _same_group_matches(
    q_sets: np.ndarray, r_sets: np.ndarray, qg: np.ndarray, rg: np.ndarray
) -> np.ndarray:
    """Per query, the references of its own group sharing a label with it, pair by pair in
    chunks of at most 2**22 pairs."""
    order = np.argsort(rg, kind="stable")
    lo = np.searchsorted(rg[order], qg, side="left")
    sizes = np.searchsorted(rg[order], qg, side="right") - lo
    ends = np.cumsum(sizes)
    out = np.zeros(q_sets.shape[0], dtype=np.int64)
    start = 0
    while start < q_sets.shape[0]:
        before = ends[start - 1] if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, before + (1 << 22), side="right")))
        size = sizes[start:stop]
        q = np.repeat(np.arange(start, stop), size)
        offsets = np.arange(q.size) - np.repeat(np.cumsum(size) - size, size)
        ref = order[np.repeat(lo[start:stop], size) + offsets]
        shared = match_pairs(q_sets[q], r_sets[ref])
        out[start:stop] = np.bincount(q[shared] - start, minlength=stop - start)
        start = stop
    return out


# ---------------------------------------------------------------------------- plan
def plan_search(settings: EvaluationSettings, data: EvaluationData) -> SearchPlan:
    """Resolve the depth and the metrics, check the cut-offs, and build the retrieval task.

    ``k="max_bin_count"`` becomes the largest R_q (at least 1); with ``metrics=None`` the
    default set follows that depth (Recall@k instead of Recall@10 below 10).

    Examples
    --------
    >>> from embedeval.evaluation.settings import EvaluationInputs, validate_arguments
    >>> inputs = EvaluationInputs([[0.0], [1.0], [2.0], [5.0]], [0, 0, 0, 1])
    >>> settings = validate_arguments(inputs, k="max_bin_count")
    >>> plan = plan_search(settings, prepare_data(settings, inputs))
    >>> plan.k_used, [m.name for m in plan.infos][-1]  # R_q of the 0s: 3 - 1 = 2
    (2, 'recall_at_2')
    """
    ms = settings.metrics
    if is_label_sets(data.query_codes):
        _check_label_sets(settings)
    max_relevant = int(data.relevant.max(initial=0))
    k_used = max(max_relevant, 1) if ms.k == "max_bin_count" else ms.k
    infos = metrics_at_depth(ms, k_used)  # max_bin_count's depth is known only now
    warn_truncated(ms.k, max_relevant, infos, stacklevel=5)
    task = RetrievalTask(
        query=data.query,
        reference=data.reference,
        query_codes=data.query_codes,
        reference_codes=data.reference_codes,
        relevant=data.relevant,
        n_valid=data.n_valid,
        exclusions=data.exclusions,
        metrics=tuple(m for m in infos if m.kind == "knn"),
        # A k beyond the gallery means the whole gallery (min(k, n_valid) = n_valid): clamped,
        # so that depth arithmetic (k + 1) cannot overflow.
        k=None if k_used is None else min(k_used, data.n_reference),
        distance=ms.distance,
        scale=data.scale,
        centre=data.centre,
    )
    return SearchPlan(infos, k_used, task)


def _check_label_sets(settings: EvaluationSettings) -> None:
    """Refuse what multi-label relevance does not define or no backend supports."""
    cluster = [m.name for m in settings.metrics.infos if m.kind == "cluster"]
    if cluster:
        raise InputError(
            f"metrics: {', '.join(cluster)} compare clusters with one label per item; with "
            "multi-label labels (a 2-D indicator array) drop them or pass one label per item."
        )
    if settings.statistics.ci is not None and settings.metrics.average == "macro":
        raise InputError(
            "ci= with average='macro' resamples classes, which multi-label labels (a 2-D "
            "indicator array) do not partition; use average='micro' (queries are resampled)."
        )


# ---------------------------------------------------------------------------- summarise
def summarise(
    settings: EvaluationSettings, data: EvaluationData, plan: SearchPlan, outcome: SearchOutcome
) -> EvaluationResult:
    """Averages (micro or macro, lone queries left out), per-class means, NMI / AMI, and the
    result object with the settings that produced it."""
    warn_if_biased(outcome.approximation, stacklevel=6)
    average = settings.metrics.average
    summary: dict[str, float] = {}
    per_class: dict[str, dict[Any, float]] = {}
    multi = is_label_sets(data.query_codes)
    for m in plan.infos:
        if m.kind == "knn" and multi:
            summary[m.name], per_class[m.name] = aggregate_label_sets(
                outcome.values[m.name], data.query_labels, average
            )
        elif m.kind == "knn":
            summary[m.name], per_class[m.name] = aggregate(
                outcome.values[m.name], data.query_codes, data.uniques, average
            )
        else:
            summary[m.name] = cluster_metric(m.name, to_host(data.query), data.query_codes)
    n_lone = int((data.relevant == 0).sum())
    if plan.knn_infos and n_lone == data.n_query:
        warnings.warn(
            f"every one of the {data.n_query} queries is lone (no other member of its class "
            "among the references), so every retrieval metric is NaN.",
            EmbedevalWarning,
            stacklevel=5,
        )
    return EvaluationResult(
        metrics=summary,
        per_query=outcome.values,
        per_class=per_class,
        query_labels=data.query_labels,
        n_queries=data.n_query,
        n_lone=n_lone,
        n_ties={name: int(flags.sum()) for name, flags in outcome.ties.items()},
        settings=_settings_record(settings, data, plan, outcome.search),
        approximation=outcome.approximation,
    )


def _settings_record(
    settings: EvaluationSettings,
    data: EvaluationData,
    plan: SearchPlan,
    search: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The settings as :attr:`EvaluationResult.settings` reports them: the options, the data's
    shape, the backend, what the torch backend reports of its products (``"torch"``) and, when
    some are, the metrics where lower is better (``"lower_is_better"``)."""
    torch = {"torch": dict(search)} if search else {}
    # Only a custom metric can be lower-is-better; the report reads this to put its worst first.
    lower = [m.name for m in plan.infos if not m.higher_is_better]
    return {
        "metrics": [m.name for m in plan.infos],
        "k": settings.metrics.k,
        "k_used": plan.k_used,
        "distance": settings.metrics.distance,
        "average": settings.metrics.average,
        "leave_one_out": settings.protocol.leave_one_out,
        "ref_includes_query": settings.protocol.ref_includes_query,
        "groups": settings.protocol.grouped,
        "n_reference": data.n_reference,
        "dim": int(data.query.shape[1]),
        "n_classes": _n_classes(data),
        "multi_label": is_label_sets(data.query_codes),
        "backend": settings.search.engine,
        **({"lower_is_better": lower} if lower else {}),
        **torch,
    }


def _n_classes(data: EvaluationData) -> int:
    """Distinct query labels (multi-label: labels some query has)."""
    if is_label_sets(data.query_codes):
        return int(np.asarray(data.query_labels).any(axis=0).sum())
    return len(np.unique(data.query_codes))


def cluster_metric(name: str, xq: np.ndarray, codes: np.ndarray) -> float:
    """NMI / AMI of faiss k-means clusters (PML's setup: 20 iterations, faiss's default seed
    1234, one cluster per distinct query label) against the labels, arithmetic normalisation."""
    import faiss
    from sklearn.metrics import adjusted_mutual_info_score, normalized_mutual_info_score

    n_clusters = int(np.unique(codes).size)
    x = np.ascontiguousarray(xq, dtype=np.float32)
    if n_clusters < 2 or n_clusters >= x.shape[0]:
        clusters = codes if n_clusters >= x.shape[0] else np.zeros_like(codes)
    else:
        # min_points_per_centroid only gates faiss's "WARNING clustering N points to K
        # centroids" (printed straight to stderr below 39 points per cluster); it changes
        # nothing else, so the clusters stay PML's.
        kmeans = faiss.Kmeans(
            x.shape[1],
            n_clusters,
            niter=20,
            seed=1234,
            verbose=False,
            min_points_per_centroid=1,
        )
        kmeans.train(x)
        _, assigned = kmeans.index.search(x, 1)
        clusters = assigned[:, 0]
    score = normalized_mutual_info_score if name == "nmi" else adjusted_mutual_info_score
    return float(score(codes, clusters))


# ---------------------------------------------------------------------------- chained
def evaluate_prepared(
    settings: EvaluationSettings, data: EvaluationData
) -> tuple[EvaluationResult, SearchPlan]:
    """Plan, run and summarise the search of checked data (no add-ons); the plan comes back
    too, for the add-ons that re-use its resolved depth and metrics."""
    plan = plan_search(settings, data)
    outcome = run_search(plan.task, settings.search)
    return summarise(settings, data, plan, outcome), plan


def evaluate_core(settings: EvaluationSettings, inputs: EvaluationInputs) -> EvaluationResult:
    """The whole core pipeline on unchecked arrays: data, plan, run, summarise."""
    return evaluate_prepared(settings, prepare_data(settings, inputs))[0]
