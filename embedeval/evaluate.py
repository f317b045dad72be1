"""``embedeval.evaluate``: exact, streaming retrieval metrics of an embedding set."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from ._engine import RetrievalTask
from ._errors import EmbedevalWarning, InputError, InputTypeError
from ._registry import MetricInfo, default_metrics
from ._search import SearchOptions, run_search
from ._torch_backend import (
    as_search_input,
    check_lead_on_device,
    scale_for_range,
    to_host,
)
from ._validation import (
    as_embeddings,
    as_labels,
    as_vector,
    check_bool,
    check_choice,
    check_fractions,
    check_int,
    check_level,
    factorize,
)
from .custom import metric_infos
from .knn import (
    DEFAULT_MEMORY_BUDGET,
    DISTANCES,
    Exclusions,
    check_queries_lead_reference,
)
from .result import EvaluationResult, warn_if_biased

__all__ = ["evaluate"]


def evaluate(
    query: Any,
    query_labels: Any,
    reference: Any = None,
    reference_labels: Any = None,
    *,
    metrics: Any = None,
    custom_metrics: Any = None,
    k: int | str | None = None,
    distance: str = "euclidean",
    ref_includes_query: bool = False,
    average: str = "micro",
    query_groups: Any = None,
    reference_groups: Any = None,
    confidences: Any = None,
    higher_is_confident: bool = True,
    reject_from: str = "queries",
    rejection_fractions: Any = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5),
    ci: float | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    index: str | None = None,
    index_params: dict[str, Any] | None = None,
    exact_sample: int | None = None,
    shards: Any = None,
    backend: str = "local",
    client: Any = None,
    block_size: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    progress: bool | None = None,
    n_threads: int | None = None,
    positives: Any = None,
    junk: Any = None,
    device: str | None = None,
    device_memory: float | None = None,
    tf32: bool = False,
) -> EvaluationResult:
    """Evaluate embeddings by exact kNN retrieval: P@1, R-Precision, MAP@R, MAP, MRR, Recall@k.

    Parameters
    ----------
    query : array-like, shape (n_query, dim)
        Query embeddings (numpy, lists, memory-mapped arrays, anything with ``__array__``;
        float16/32/64 are searched in float32).
    query_labels : array-like, shape (n_query,)
        Class of each query: ints of any size (never cast to float), strings, any hashable.
    reference, reference_labels : array-like, optional
        The gallery.  ``None`` means leave-one-out over the query set (each query is excluded
        from its own ranking by identity).
    metrics : list of str, optional
        Keys among ``precision_at_1``, ``r_precision``, ``map_at_r``, ``map``, ``mrr``,
        ``minp`` (re-id mINP: R_q / rank of the last relevant reference), ``recall_at_{k}``,
        ``precision_at_{k}``, ``nmi``, ``ami`` (PML spellings accepted).
        Default: P@1, R-Precision, MAP@R, Recall@1, Recall@10 (Recall@k instead of Recall@10
        when an int ``k`` below 10 caps the ranking).
    custom_metrics : dict of str to RetrievalMetric, optional
        Your own per-query metrics, ``{name: embedeval.RetrievalMetric(fn, depth=...)}``,
        computed in the same streaming blocks from the same ranking and reported beside the
        built-in ones (``metrics=[]`` computes only these).  See :class:`embedeval.RetrievalMetric`.
    k : None, int or "max_bin_count"
        ``None`` (default): exact, every metric reads the depth it needs.  An int caps every
        ranking at depth k with PML's semantics (relevance window min(R_q, k); ``r_precision``
        divides by it, ``map_at_r`` and ``map`` by R_q; ``mrr`` is 0 without a hit in the top k);
        a k larger than the reference set is clamped (k must be below 2**63).
        ``"max_bin_count"``: k = max R_q, decided once on the whole gallery (the
        ``reject_from="both"`` re-evaluations keep that k).
    distance : {"euclidean", "cosine", "inner_product"}
    ref_includes_query : bool
        PML's convention: the queries are the first rows of ``reference`` and each is excluded
        from its own ranking (checked).  An error with ``reference=None``, which is already
        leave-one-out.
    average : {"micro", "macro"}
        Mean over non-lone queries, or mean per class then over classes (PML ``avg_of_avgs``).
    query_groups, reference_groups : array-like, optional
        Group ids (camera, sequence, ...); references sharing the query's group are ignored.
        With ``reference=None`` pass only ``query_groups``.
    confidences : array-like, shape (n_query,), optional
        Per-query confidence (higher = more certain unless ``higher_is_confident=False``, e.g.
        for sigmas); fills ``result.confidence`` with AUERC, AURC / E-AURC / AUGRC, R-AUROC,
        calibration errors and open-set detection (see
        :func:`embedeval.confidence.confidence_summary`); with ``ci=`` each of them also gets
        a bootstrap interval in ``result.ci`` (queries resampled, the statistic recomputed).
    reject_from : {"queries", "both"}
        ``"queries"``: the error-reject curve rejects queries and keeps the gallery whole.
        ``"both"`` (leave-one-out only) also recomputes every metric after removing each
        fraction in ``rejection_fractions`` of the least confident items from queries and
        gallery alike (the face-recognition protocol): keys ``both_<metric>@<fraction>``.
    ci : float, optional
        Adds percentile bootstrap confidence intervals at this level (``result.ci``), resampling
        queries (micro) or classes (macro), ``n_boot`` resamples, seeded by ``seed``.
    index : str, optional
        A faiss index factory string (``"HNSW32"``, ``"IVF4096,Flat"``, ...) for approximate
        search; the result then reports, on ``exact_sample`` random queries evaluated both ways,
        the kNN recall and every metric exactly and approximately (``result.approximation``).
    index_params : dict, optional
        Search-time parameters such as ``{"nprobe": 64}`` or ``{"efSearch": 128}``; only with
        ``index``.
    exact_sample : int, optional
        Queries evaluated exactly as well when ``index`` is given (default 10,000); only with
        ``index``.
    shards : optional
        Split the reference set into shards (an int count, or a list of arrays / ``.npy`` paths)
        merged exactly: the numbers are identical to the unsharded engine.
    backend : {"local", "dask", "torch"}
        ``"dask"`` ships query blocks to the workers of ``client`` (a ``dask.distributed.Client``).
        ``"torch"`` runs the exact search and the metric kernels with PyTorch on ``device``
        (needs ``pip install torch``); torch tensors on a GPU select it by themselves and are
        evaluated where they are, without a copy to the host.
    block_size : int, optional
        Queries per block; default from ``memory_budget`` (bytes of working memory per thread).
    progress : bool, optional
        Progress bar on stderr; ``None`` shows it only on a terminal.
    n_threads : int, optional
        Threads of the exact local engine (``backend="local"`` without ``index``/``shards``, and
        the ``reject_from="both"`` re-evaluations), each searching and scoring its own query
        block with single-threaded BLAS (default: the usable cores, at most 8).  Results do not
        depend on it; peak working memory is about ``n_threads * memory_budget``.  The sharded
        backend runs one block at a time, faiss indexes use faiss's own threads, and Dask uses
        its workers.
    device : str, optional
        ``backend="torch"`` only: ``"cuda"``, ``"cuda:1"``, ``"cpu"`` (default: the device of
        GPU tensors, else ``"cuda"`` when available, else ``"cpu"``).
    device_memory : float or int, optional
        ``backend="torch"`` only: working memory of the query blocks, as a fraction of the
        device's free memory or in bytes (default: half the free GPU memory).
    tf32 : bool
        ``backend="torch"`` only: allow TF32 products on the GPU (faster, about 3 decimal
        digits per product: near neighbours may be ranked differently).  Off by default.
    positives, junk : list of lists of int, optional
        Relevance given per query as reference indices instead of labels (landmark retrieval:
        revisited Oxford / Paris): pass ``query_labels=None`` and ``reference_labels=None``.
        Each query's ``junk`` items are removed from its ranking before every metric, and
        R_q = ``len(positives[q])``.  See :mod:`embedeval.landmarks`.

    Returns
    -------
    EvaluationResult

    Notes
    -----
    R_q is the number of references with the query's label that the query can see (itself and
    its group excluded).  Lone queries (R_q = 0) get NaN and are left out of every average
    (``result.n_lone`` counts them).  Equal distances are ranked by ascending reference index;
    ``result.n_ties`` counts queries whose value depends on that choice.  Identical reference
    vectors are always at exactly equal distances (whatever the backend or block size), so they
    are such ties.

    Examples
    --------
    >>> res = evaluate([[0.0], [1.0], [2.0], [10.0], [11.0]], ["a", "b", "a", "b", "b"],
    ...                metrics=["precision_at_1", "map_at_r"])
    >>> res["precision_at_1"]  # a(0)->b(1), b(1)->a(0), a(2)->b(1) miss; the b at 10, 11 hit
    0.4
    >>> res.per_query["map_at_r"].round(4).tolist()
    [0.0, 0.0, 0.0, 0.5, 0.5]
    """
    if positives is not None or junk is not None:
        from .landmarks import evaluate_with_lists

        return evaluate_with_lists(
            query,
            query_labels,
            reference,
            reference_labels,
            positives=positives,
            junk=junk,
            metrics=metrics,
            k=k,
            distance=distance,
            average=average,
            ci=ci,
            n_boot=n_boot,
            seed=seed,
            block_size=block_size,
            memory_budget=memory_budget,
            unsupported={
                "query_groups": query_groups is not None,
                "reference_groups": reference_groups is not None,
                "confidences": confidences is not None,
                "index": index is not None,
                "shards": shards is not None,
                "ref_includes_query": bool(ref_includes_query),
                f"backend={backend!r}": backend != "local",
            },
        )
    # ---- arguments
    default = metrics is None
    infos = metric_infos(metrics, custom_metrics)
    search = SearchOptions.make(
        like=query,
        backend=backend,
        index=index,
        index_params=index_params,
        exact_sample=exact_sample,
        shards=shards,
        client=client,
        block_size=block_size,
        memory_budget=memory_budget,
        n_threads=n_threads,
        progress=progress,
        seed=seed,
        device=device,
        device_memory=device_memory,
        tf32=tf32,
    )
    torch_options = search.torch
    reject_from = check_choice(reject_from, "reject_from", ("queries", "both"))
    if reject_from == "both" and (confidences is None or reference is not None):
        raise InputError(
            "reject_from='both' removes rejected items from queries and gallery alike, so it "
            "needs confidences= and leave-one-out evaluation (reference=None)."
        )
    if confidences is not None:
        check_bool(higher_is_confident, "higher_is_confident")
        if reject_from == "both":
            rejection_fractions = check_fractions(rejection_fractions)
    distance = check_choice(distance, "distance", DISTANCES)
    average = check_choice(average, "average", ("micro", "macro"))
    if isinstance(k, str):
        check_choice(k, "k", ("max_bin_count",))
    else:
        k = check_int(k, "k", allow_none=True, maximum=2**63 - 1)
    # Validate everything before any work, so a bad ci= does not fail after an hour of search.
    if ci is not None:
        ci = check_level(ci)
        n_boot = check_int(n_boot, "n_boot")
        seed = check_int(seed, "seed", minimum=0)
    if not isinstance(ref_includes_query, (bool, np.bool_)):
        raise InputTypeError(
            f"ref_includes_query must be True or False; got {ref_includes_query!r}."
        )

    # ---- arrays
    xq = as_search_input(query, "query") if torch_options else as_embeddings(query, "query")
    n_query = xq.shape[0]
    yq = as_labels(query_labels, "query_labels", length=n_query, length_of="query")
    leave_one_out = reference is None
    if leave_one_out and ref_includes_query:
        raise InputError(
            "ref_includes_query=True was given with reference=None, which already means "
            "leave-one-out over the queries (each query's own row excluded). Drop "
            "ref_includes_query, or pass as reference the gallery whose first rows are the queries."
        )
    if leave_one_out:
        if reference_labels is not None:
            raise InputError(
                "reference_labels was given without reference; pass both, or neither for "
                "leave-one-out over the queries."
            )
        if reference_groups is not None:
            raise InputError(
                "reference_groups was given without reference; with reference=None the query "
                "set is the gallery, so pass only query_groups."
            )
        xb, yb = xq, yq
        self_index = True
    else:
        if torch_options:
            xb = as_search_input(reference, "reference")
        else:
            xb = as_embeddings(reference, "reference")
        if reference_labels is None:
            raise InputError("reference_labels is required when reference is given.")
        yb = as_labels(
            reference_labels, "reference_labels", length=xb.shape[0], length_of="reference"
        )
        if xb.shape[1] != xq.shape[1]:
            raise InputError(
                f"query has dimension {xq.shape[1]} but reference has {xb.shape[1]}; both must "
                "come from the same embedding model."
            )
        self_index = bool(ref_includes_query)
        if self_index and torch_options is not None:
            check_lead_on_device(xq, xb)
        elif self_index:
            check_queries_lead_reference(xq, xb)
    n_ref = xb.shape[0]
    # Keys would overflow or underflow float32: rank the data times 2**scale.
    xq, xb, scale = scale_for_range(xq, xb, distance, same=leave_one_out)
    if leave_one_out:
        (q_codes,), uniques = factorize(yq)
        r_codes = q_codes
    else:
        (q_codes, r_codes), uniques = factorize(yq, yb)
    if uniques.size < 2**31:  # the kernels gather a label code per candidate: half the bytes
        q_codes = q_codes.astype(np.int32)
        r_codes = q_codes if leave_one_out else r_codes.astype(np.int32)
    if self_index and not leave_one_out:
        differ = np.flatnonzero(q_codes != r_codes[:n_query])
        if differ.size:
            raise InputError(
                "ref_includes_query=True, but query_labels and the first reference_labels differ "
                f"(first at row {int(differ[0])}); the queries must be the first reference rows "
                "with the same labels."
            )
    exclusions, relevant, n_valid = _exclusions(
        q_codes,
        r_codes,
        self_index,
        leave_one_out,
        query_groups,
        reference_groups,
        n_query,
        n_ref,
    )
    conf = None
    if confidences is not None:
        conf = as_vector(confidences, "confidences", length=n_query, length_of="query")
        if reject_from == "both":
            _check_something_remains(rejection_fractions, n_query)

    # ---- depth
    k_used: int | None
    if k == "max_bin_count":
        k_used = max(int(relevant.max(initial=0)), 1)
    else:
        k_used = k
    if default:  # a cap below 10 (int or max_bin_count) reports Recall@cap, never fails
        infos = metric_infos(default_metrics(k_used), custom_metrics)
    _check_cutoffs(infos, k_used, k)
    max_relevant = int(relevant.max(initial=0))
    truncated = [m.name for m in infos if m.depth == "r"]
    if isinstance(k, int) and k < max_relevant and truncated:
        warnings.warn(
            f"k={k} is below the largest R_q ({max_relevant}), so {', '.join(truncated)} are "
            "truncated at depth k (PML's semantics), not the textbook MAP@R / R-precision. "
            "Use k=None (exact) unless you need PML's truncated numbers.",
            EmbedevalWarning,
            stacklevel=2,
        )
    knn_infos = [m for m in infos if m.kind == "knn"]
    n_lone = int((relevant == 0).sum())

    task = RetrievalTask(
        query=xq,
        reference=xb,
        query_codes=q_codes,
        reference_codes=r_codes,
        relevant=relevant,
        n_valid=n_valid,
        exclusions=exclusions,
        metrics=tuple(knn_infos),
        # A k beyond the gallery means the whole gallery (min(k, n_valid) = n_valid): clamped,
        # so that depth arithmetic (k + 1) cannot overflow.
        k=None if k_used is None else min(k_used, n_ref),
        distance=distance,
        scale=scale,
    )
    outcome = run_search(task, search)
    per_query, tie_flags, approximation = outcome.values, outcome.ties, outcome.approximation
    warn_if_biased(approximation)

    # ---- aggregate
    summary: dict[str, float] = {}
    per_class: dict[str, dict[Any, float]] = {}
    for m in infos:
        if m.kind == "knn":
            summary[m.name], per_class[m.name] = _aggregate(
                per_query[m.name], q_codes, uniques, average
            )
        else:
            summary[m.name] = _cluster_metric(m.name, to_host(xq), q_codes)
    if knn_infos and n_lone == n_query:
        warnings.warn(
            f"every one of the {n_query} queries is lone (no other member of its class among the "
            "references), so every retrieval metric is NaN.",
            EmbedevalWarning,
            stacklevel=2,
        )
    settings = {
        "metrics": [m.name for m in infos],
        "k": k,
        "k_used": k_used,
        "distance": distance,
        "average": average,
        "leave_one_out": leave_one_out,
        "ref_includes_query": bool(ref_includes_query),
        "groups": query_groups is not None,
        "n_reference": n_ref,
        "dim": int(xq.shape[1]),
        "n_classes": len(np.unique(q_codes)),
    }
    result = EvaluationResult(
        metrics=summary,
        per_query=per_query,
        per_class=per_class,
        query_labels=yq,
        n_queries=n_query,
        n_lone=n_lone,
        n_ties={name: int(flags.sum()) for name, flags in tie_flags.items()},
        settings=settings,
        approximation=approximation,
    )
    if conf is not None and per_query:
        from .confidence import confidence_summary

        result.confidence = confidence_summary(
            per_query, conf, higher_is_confident=higher_is_confident, labels=yq
        )
        result.query_confidences = conf
        settings["higher_is_confident"] = bool(higher_is_confident)
        settings["reject_from"] = reject_from
        if reject_from == "both":
            from .rejection import reject_both_curve

            curve = reject_both_curve(
                xq,
                yq,
                conf,
                fractions=rejection_fractions,
                metrics=[m.name for m in knn_infos if m.function is None],
                custom_metrics=custom_metrics,
                higher_is_confident=higher_is_confident,
                k=k_used if k == "max_bin_count" else k,
                distance=distance,
                average=average,
                query_groups=query_groups,
                block_size=block_size,
                memory_budget=memory_budget,
                progress=False,
                n_threads=n_threads,
            )
            for name, values in curve.metrics.items():
                for f, v in zip(curve.fractions, values, strict=True):
                    result.confidence[f"both_{name}@{f:.2f}"] = float(v)
    if ci is not None and per_query:
        from .compare import bootstrap_ci

        result.ci = bootstrap_ci(
            per_query,
            labels=yq,
            average=average,
            ci=ci,
            n_boot=n_boot,
            seed=seed,
            progress=progress,
        )
        if conf is not None:
            from ._resample import confidence_ci

            result.ci.update(
                confidence_ci(
                    per_query,
                    conf,
                    labels=yq,
                    higher_is_confident=higher_is_confident,
                    ci=ci,
                    n_boot=n_boot,
                    seed=seed,
                )
            )
        settings.update(ci=ci, n_boot=n_boot, seed=seed)
    return result


def _exclusions(
    q_codes: np.ndarray,
    r_codes: np.ndarray,
    self_index: bool,
    leave_one_out: bool,
    query_groups: Any,
    reference_groups: Any,
    n_query: int,
    n_ref: int,
) -> tuple[Exclusions, np.ndarray, np.ndarray]:
    """Exclusion rules, R_q and the number of references each query can see — by counting, in
    O(n), without touching an n_query x n_reference matrix."""
    n_classes = int(max(q_codes.max(), r_codes.max())) + 1
    relevant = np.bincount(r_codes, minlength=n_classes)[q_codes].astype(np.int64)
    n_valid = np.full(n_query, n_ref, dtype=np.int64)
    if self_index:
        relevant -= 1  # the query's own row has its label (checked for ref_includes_query)
        n_valid -= 1
    if query_groups is None and reference_groups is None:
        return Exclusions(self_index=self_index), relevant, n_valid
    if query_groups is None or (reference_groups is None and not leave_one_out):
        raise InputError(
            "query_groups and reference_groups go together: pass both (one group id per query "
            "and per reference row), or neither."
        )
    gq = as_labels(query_groups, "query_groups", length=n_query, length_of="query")
    if leave_one_out:
        (qg,), _ = factorize(gq)
        rg = qg
    else:
        gr = as_labels(reference_groups, "reference_groups", length=n_ref, length_of="reference")
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


def _check_something_remains(fractions: Any, n: int) -> None:
    """Every rejection fraction must leave at least one item to evaluate."""
    import math

    for f in np.atleast_1d(fractions):
        if n - math.ceil(float(f) * n - 1e-12) < 1:
            raise InputError(
                f"rejection_fractions holds {float(f)}, which rejects all {n} items and leaves "
                "nothing to evaluate; use fractions below (n - 1) / n."
            )


def _check_cutoffs(infos: list[MetricInfo], k_used: int | None, k: Any) -> None:
    if k_used is None:
        return
    too_deep = [m.name for m in infos if m.depth == "fixed" and m.cutoff > k_used]
    if too_deep:
        raise InputError(
            f"k={k!r} caps the ranking at depth {k_used}, but {', '.join(too_deep)} need(s) a "
            "deeper ranking; raise k or use k=None."
        )


def _aggregate(
    values: np.ndarray, codes: np.ndarray, uniques: np.ndarray, average: str
) -> tuple[float, dict[Any, float]]:
    ok = ~np.isnan(values)
    if not ok.any():
        return float("nan"), {}
    n_classes = uniques.size
    sums = np.bincount(codes[ok], weights=values[ok], minlength=n_classes)
    counts = np.bincount(codes[ok], minlength=n_classes)
    present = np.flatnonzero(counts)
    class_means = sums[present] / counts[present]
    per_class = {
        (u.item() if isinstance(u, np.generic) else u): float(v)
        for u, v in zip(uniques[present], class_means, strict=True)
    }
    value = float(class_means.mean()) if average == "macro" else float(values[ok].mean())
    return value, per_class


def _cluster_metric(name: str, xq: np.ndarray, codes: np.ndarray) -> float:
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
