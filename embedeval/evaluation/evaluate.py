"""``embedeval.evaluate``: exact, streaming retrieval metrics of an embedding set."""

from __future__ import annotations

from typing import Any

from ..engine.exact import DEFAULT_MEMORY_BUDGET
from ..utils.validation import as_embeddings, as_vector, single_labels
from .rejection import fraction_label, kept_counts, reevaluation_settings, rejection_curve
from .relevance_lists import evaluate_with_lists
from .result import EvaluationResult
from .settings import DATA_ARGUMENTS, EvaluationInputs, EvaluationSettings, validate_arguments
from .stages import EvaluationData, SearchPlan, evaluate_prepared, prepare_data

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
    n_boot: int | None = None,
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
    precision: str = "auto",
) -> EvaluationResult:
    """Evaluate embeddings by exact kNN retrieval: P@1, R-Precision, MAP@R, MAP, MRR, Recall@k.

    Parameters
    ----------
    query : array-like, shape (n_query, dim)
        Query embeddings (numpy, lists, memory-mapped arrays, anything with ``__array__``;
        float16/32/64 are searched in float32).
    query_labels : array-like, shape (n_query,) or (n_query, n_labels)
        Class of each query: ints of any size (never cast to float), strings, any hashable; or
        several labels per query as a 0/1 indicator array (scikit-learn's multilabel format),
        where a reference is relevant when it shares at least one label with the query (the
        reference labels then come in the same form, with the same columns).
    reference, reference_labels : array-like, optional
        The gallery.  ``None`` means leave-one-out over the query set (each query is excluded
        from its own ranking by identity).
    metrics : list of str, optional
        Keys among ``precision_at_1``, ``r_precision``, ``map_at_r``, ``map``, ``mrr``,
        ``minp`` (re-id mINP: R_q / rank of the last relevant reference), ``recall_at_{k}``
        (a hit rate, as metric-learning papers use it), ``precision_at_{k}``, ``map_at_{k}``
        (average precision over the k nearest divided by the relevant among them: the hashing
        literature's mAP@k), ``nmi``, ``ami`` (PML spellings accepted).
        Default: P@1, R-Precision, MAP@R, Recall@10 (Recall@k instead of Recall@10 when an
        int ``k`` below 10 caps the ranking).
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
        :func:`embedeval.metrics.confidence.confidence_summary`; class-wise ECE needs one class
        per query, so multi-label runs leave it out); with ``ci=`` each of them also gets a
        bootstrap interval in ``result.ci`` (queries resampled, the statistic recomputed).
    reject_from : {"queries", "both"}
        ``"queries"``: the error-reject curve rejects queries and keeps the gallery whole.
        ``"both"`` (leave-one-out only) also recomputes every metric after removing each
        fraction in ``rejection_fractions`` of the least confident items from queries and
        gallery alike (the face-recognition protocol): keys ``both_<metric>@<fraction>``, the
        fraction with two decimals (``@0.10``), or all it needs when two lose digits
        (``@0.125``).
    ci : float, optional
        Adds percentile bootstrap confidence intervals at this level (``result.ci``), resampling
        queries (micro) or classes (macro), ``n_boot`` resamples (default 1000; refused without
        ``ci``), seeded by ``seed``.
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
        merged exactly: the numbers are identical to the unsharded engine.  A full-depth
        ranking the unsharded engine gives its deep engine (``map`` / ``minp`` with
        ``k=None``, relevant references at most a fifth of the reference on average) is
        searched whole when the reference fits ``memory_budget`` in float64 (sharding only
        bounds memory), else by the deep engine over keys read shard by shard
        (``docs/scale.md``).
    backend : {"local", "dask", "torch"}
        ``"dask"`` ships query blocks to the workers of ``client`` (a ``dask.distributed.Client``).
        ``"torch"`` runs the exact search and the metric kernels with PyTorch on ``device``
        (needs ``pip install torch``); torch tensors on a GPU select it by themselves and are
        evaluated where they are, without a copy to the host (except with multi-label labels,
        which the local engine ranks from a host copy, whichever backend).
    block_size : int, optional
        Queries per block; default from ``memory_budget`` (bytes of working memory per thread).
        With ``positives=``, where the references stream past every query, references per
        block.
    progress : bool, optional
        Progress bar on stderr; ``None`` shows it only on a terminal.
    n_threads : int, optional
        Threads of the search (default: the usable cores, at most 8).  The exact local and
        sharded engines (and the ``reject_from="both"`` re-evaluations) search and score a
        query block per thread with single-threaded BLAS; with ``index`` faiss runs on that
        many OpenMP threads, and with ``backend="torch"`` PyTorch's CPU operations and the
        host engines it uses take that many threads too.  Results do not depend on it; peak
        working memory is about ``n_threads * memory_budget``.  With ``backend="dask"`` it is
        refused: the cluster's workers run on the threads they were started with.
    device : str, optional
        ``backend="torch"`` only: ``"cuda"``, ``"cuda:1"``, ``"cpu"`` (default: the device of
        GPU tensors, else ``"cuda"`` when available, else ``"cpu"``).
    device_memory : float or int, optional
        ``backend="torch"`` only: working memory of the query blocks, as a fraction of the
        device's free memory or in bytes (default: half the free GPU memory).
    tf32 : bool
        ``backend="torch"`` only: TF32 filter products on the GPU (the same as
        ``precision="tf32"``, which ``"auto"`` chooses on GPUs from Ampere on).
    precision : {"auto", "float32", "tf32", "bf16"}
        ``backend="torch"`` only: the product that filters candidates.  Every ranking is still
        decided in float64 (near-ties within the product's error bound are re-scored), so this
        changes the speed, never a value.  ``"auto"`` (default): TF32 on a GPU from Ampere
        on, bfloat16 on a CPU with AVX512-BF16 or AMX (shallow query / reference searches
        only), else float32.  Dense data (a few large classes) can be slower with
        ``"bf16"``: its wider bound leaves more near-ties to re-score.
    positives, junk : list of lists of int, optional
        Relevance given per query as reference indices instead of labels (landmark retrieval:
        revisited Oxford / Paris): pass ``query_labels=None`` and ``reference_labels=None``.
        Each query's ``junk`` items are removed from its ranking before every metric, and
        R_q = ``len(positives[q])``; a list may not repeat an index, nor hold one in both lists
        of a query (an error names the query and the index).  The references are streamed
        past the queries (``n_threads`` threads; each block multiplied on a torch device with
        ``backend="torch"``, in float32 unless ``precision`` says otherwise: every positive's
        rank is a deep one, whose bfloat16 band would hold too much).  See
        :mod:`embedeval.protocols.landmarks`.

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

    Every argument is checked before any work, whichever path it belongs to (a bad ``ci=`` or
    ``n_boot=`` fails at once, not after the search), and an option that the chosen path would
    ignore is refused: ``index_params`` / ``exact_sample`` without ``index``, ``client`` without
    ``backend="dask"``, ``device`` / ``device_memory`` / ``tf32`` without ``backend="torch"``,
    ``rejection_fractions`` without ``reject_from="both"``, and ``n_threads``,
    ``custom_metrics``, groups, confidences, ``index``, ``shards`` or another backend with
    ``positives=``.  The stages: validation (:mod:`embedeval.evaluation.settings`), then data, plan,
    search and summary (:mod:`embedeval.evaluation.stages`), then the confidence summary, the
    reject-both curve (:mod:`embedeval.evaluation.rejection`) and the bootstrap intervals.

    Examples
    --------
    >>> res = evaluate([[0.0], [1.0], [2.0], [10.0], [11.0]], ["a", "b", "a", "b", "b"],
    ...                metrics=["precision_at_1", "map_at_r"])
    >>> res["precision_at_1"]  # a(0)->b(1), b(1)->a(0), a(2)->b(1) miss; the b at 10, 11 hit
    0.4
    >>> res.per_query["map_at_r"].round(4).tolist()
    [0.0, 0.0, 0.0, 0.5, 0.5]
    """
    # Nothing else is bound yet, so locals() holds exactly evaluate's parameters: every one of
    # them reaches the validation stage, none can be forgotten on the way.
    options = dict(locals())
    inputs = EvaluationInputs(**{name: options.pop(name) for name in DATA_ARGUMENTS})
    return run_evaluation(validate_arguments(inputs, **options), inputs)


def run_evaluation(settings: EvaluationSettings, inputs: EvaluationInputs) -> EvaluationResult:
    """Every stage after validation: data, plan, run, summarise, then the add-ons.

    Relevance lists (``positives=``) take the landmark path of :mod:`embedeval.protocols.landmarks`;
    labels take the core pipeline of :mod:`embedeval.evaluation.stages`.  The confidences are
    checked
    with the other arrays, before the search; the confidence summary, the reject-both curve
    and the bootstrap intervals are computed from the per-query values afterwards.
    """
    if settings.protocol.lists:
        result = evaluate_with_lists(settings, inputs)
    else:
        data = prepare_data(settings, inputs)
        conf = _confidences(settings, inputs, data.n_query)
        result, plan = evaluate_prepared(settings, data)
        if conf is not None and result.per_query:
            _add_confidence(result, settings, inputs, data, plan, conf)
    if settings.statistics.ci is not None and result.per_query:
        _add_intervals(result, settings)
    return result


def _confidences(settings: EvaluationSettings, inputs: EvaluationInputs, n_query: int) -> Any:
    """The per-query confidences, checked (with the rejection fractions) before any search."""
    if not settings.confidence.given:
        return None
    conf = as_vector(inputs.confidences, "confidences", length=n_query, length_of="query")
    if settings.confidence.reject_from == "both":
        kept_counts(settings.confidence.rejection_fractions, n_query)
    return conf


def _add_confidence(
    result: EvaluationResult,
    settings: EvaluationSettings,
    inputs: EvaluationInputs,
    data: EvaluationData,
    plan: SearchPlan,
    conf: Any,
) -> None:
    """Confidence summary in ``result.confidence``; with ``reject_from="both"`` the
    ``both_<metric>@<fraction>`` points of the reject-both curve too."""
    from ..metrics.confidence import confidence_summary

    options = settings.confidence
    result.confidence = confidence_summary(
        result.per_query,
        conf,
        higher_is_confident=options.higher_is_confident,
        labels=single_labels(data.query_labels),
        skip_empty=True,  # every query lone: NaN metrics and a warning already, no error
    )
    result.query_confidences = conf
    result.settings["higher_is_confident"] = options.higher_is_confident
    result.settings["reject_from"] = options.reject_from
    if options.reject_from != "both":
        return
    # The steps keep the depth the whole set resolved "max_bin_count" to.
    k = plan.k_used if settings.metrics.k == "max_bin_count" else settings.metrics.k
    curve = rejection_curve(
        reevaluation_settings(settings, plan.knn_infos, k),
        as_embeddings(data.query, "embeddings"),
        data.query_labels,
        conf if options.higher_is_confident else -conf,
        inputs.query_groups,
        options.rejection_fractions,
    )
    for name, values in curve.metrics.items():
        for f, v in zip(curve.fractions, values, strict=True):
            result.confidence[f"both_{name}@{fraction_label(f)}"] = float(v)


def _add_intervals(result: EvaluationResult, settings: EvaluationSettings) -> None:
    """Percentile bootstrap intervals of every metric (and of every confidence statistic when
    confidences were given) in ``result.ci``: queries resampled (micro) or classes (macro)."""
    from ..metrics.confidence import confidence_ci
    from .compare import bootstrap_ci

    stats = settings.statistics
    # Micro intervals resample queries and need no labels; multi-label labels (2-D) have no
    # class per query (macro intervals are refused for them before the search).
    labels = None if result.settings.get("multi_label") else result.query_labels
    result.ci = bootstrap_ci(
        result.per_query,
        labels=labels,
        average=settings.metrics.average,
        ci=stats.ci,
        n_boot=stats.n_boot,
        seed=stats.seed,
        progress=settings.search.progress,
    )
    if result.query_confidences is not None:
        result.ci.update(
            confidence_ci(
                result.per_query,
                result.query_confidences,
                labels=labels,
                higher_is_confident=settings.confidence.higher_is_confident,
                ci=stats.ci,
                n_boot=stats.n_boot,
                seed=stats.seed,
            )
        )
    result.settings.update(ci=stats.ci, n_boot=stats.n_boot, seed=stats.seed)
