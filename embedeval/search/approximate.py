"""Approximate search with a faiss index, and a measurement of how approximate it was.

Every query is searched in the index; the returned ``(D, I)`` lists are cleaned (padding ids -1,
the query itself and same-group references dropped), packed like the exact engine's candidates
(ranking key, then ascending reference index for ties) and scored by the same kernels.  Then a
seeded random sample of ``exact_sample`` non-lone queries is also evaluated exactly, and the
report says, on that sample: the kNN recall of the approximate lists, every metric both ways,
their difference and a paired bootstrap confidence interval of the difference.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine.candidates import Candidates, spans
from ..engine.duplicates import DuplicateRows
from ..engine.exact import (
    Exclusions,
    pack_codes,
    range_exponent,
    reference_duplicates,
    sort_block,
    sorted_candidates,
)
from ..engine.task import RetrievalTask, ScoredBlock, write_back
from ..metrics.resample import mean_difference_interval
from ..utils.errors import InputError, InputTypeError
from ..utils.progress import progress_bar
from ..utils.validation import check_choice, check_int
from .options import check_index_param

__all__ = ["search", "train_index"]

#: Rows used to train an index: faiss's k-means uses at most 256 points per centroid anyway.
_POINTS_PER_CENTROID = 256
#: Training rows for indexes without an inverted list (PQ codebooks, OPQ, ...).
_DEFAULT_TRAINING_ROWS = 65_536
_ADD_BLOCK = 65_536
_N_BOOT = 1000
_CI = 0.95
#: Cosine references whose mean unit vector is at least this long share one direction so
#: closely (mean squared distance to it at most 0.02) that float32 inner products of the unit
#: rows lose the digits telling them apart: an index built here searches them about it.
_CONCENTRATED = 0.99
#: Reference rows, at most, whose mean direction :func:`_shared_direction` measures.
_DIRECTION_ROWS = 4096
#: What :func:`search` returns about itself: its exact-sample report, which
#: :func:`embedeval.search.dispatch.run_search` files as :attr:`SearchOutcome.approximation`.
REPORT = "approximation"


def train_index(
    reference: Any,
    index: Any,
    *,
    distance: str = "euclidean",
    seed: int = 0,
    training_rows: int | None = None,
    clustering: str = "kmeans",
) -> Any:
    """Build and train a faiss index on a seeded subsample of ``reference``; return it empty.

    Save it with ``faiss.write_index(trained, path)`` and pass the path (or the object) as
    ``evaluate(..., index=path)``: the training (coarse centroids, codebooks) is reused and only
    the references are added, so several checkpoints of the same size are searched with the same
    index structure and one training.

    Parameters
    ----------
    reference : array-like, shape (n_reference, dim)
        Vectors to train on (memory-mapped arrays are read only at the sampled rows).
    index : str or faiss.Index
        A faiss factory string (``"IVF4096,Flat"``, ``"HNSW32"``, ``"IVF256,PQ32"``, ...), a
        path written by ``faiss.write_index``, or an index object (cloned, never modified).
    distance : {"euclidean", "cosine", "inner_product"}
        Euclidean uses ``METRIC_L2``; cosine L2-normalises and uses ``METRIC_INNER_PRODUCT``.
        (``evaluate`` with a factory string searches cosine references concentrated about
        one direction with ``METRIC_L2`` about it instead; a trained index is searched with the
        unit rows themselves, whose float32 products cannot rank such references.)
    seed : int
        Seed of the training subsample.
    training_rows : int, optional
        Rows to train on (default: see Notes).  Fewer rows train faster; faiss warns below 39
        rows per inverted list.
    clustering : {"kmeans", "two_level"}
        How an inverted-file index finds its ``nlist`` coarse centroids.  ``"kmeans"``: faiss's
        k-means over all centroids at once (the index's own ``train``), which costs
        rows x nlist x dim per iteration.  ``"two_level"``: k-means into ``sqrt(nlist)`` groups,
        then each group split into sub-centroids in proportion to its size
        (``faiss.contrib.clustering.two_level_clustering``), about ``sqrt(nlist) / 2`` times
        cheaper; this is what makes ``nlist`` of 16,384 or more trainable on a few cores.
        Centroids are L2-normalised for inner-product indexes.  Only for IVF indexes without a
        pre-transform.

    Returns
    -------
    faiss.Index
        A trained index holding no vectors.

    Notes
    -----
    Training subsample: ``min(n_reference, 256 * nlist)`` rows for an inverted-file index (faiss
    k-means would subsample to 256 points per centroid itself), ``min(n_reference, 65,536)``
    otherwise, drawn without replacement by ``numpy.random.default_rng(seed)``.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.random.default_rng(0).standard_normal((2000, 8)).astype("float32")
    >>> trained = train_index(x, "IVF16,Flat")
    >>> trained.is_trained, trained.ntotal, trained.nlist
    (True, 0, 16)
    """
    from ..utils.validation import as_embeddings

    distance = check_choice(distance, "distance", ("euclidean", "cosine", "inner_product"))
    seed = check_int(seed, "seed", minimum=0)
    training_rows = check_int(training_rows, "training_rows", allow_none=True)
    clustering = check_choice(clustering, "clustering", ("kmeans", "two_level"))
    xb = as_embeddings(reference, "reference")
    idx, _ = _open_index(index, xb.shape[1], distance)
    _train(idx, xb, distance, seed, training_rows, clustering)
    return idx


def _open_index(index: Any, dim: int, distance: str, tangent: bool = False) -> tuple[Any, str]:
    """The faiss index of ``index`` and its description; a factory string is built with the
    metric of ``distance`` (``METRIC_L2`` for cosine in ``tangent`` coordinates: see
    :class:`_Space`)."""
    import faiss

    l2 = distance == "euclidean" or tangent
    metric = faiss.METRIC_L2 if l2 else faiss.METRIC_INNER_PRODUCT
    if isinstance(index, faiss.Index):
        idx, desc = faiss.clone_index(index), f"<{type(index).__name__}>"
    elif isinstance(index, (str, os.PathLike)):
        text = os.fspath(index)
        if os.path.isfile(text):
            try:
                idx = faiss.read_index(text)
            except RuntimeError as exc:
                raise InputError(
                    f"index={text!r} is a file but not one written by faiss.write_index ({exc})."
                ) from exc
            desc = f"file:{os.path.basename(text)}"
        else:
            try:
                idx = faiss.index_factory(dim, text, metric)
            except RuntimeError as exc:
                first = str(exc).strip().splitlines()[-1][:200]
                raise InputError(
                    f"index={text!r} is neither an existing file nor a faiss index factory string "
                    f"faiss accepts ({first}). Examples: 'HNSW32', 'IVF1024,Flat', 'IVF256,PQ32'."
                ) from exc
            desc = text
    else:
        raise InputTypeError(
            "index must be a faiss factory string, a path written by faiss.write_index or a "
            f"faiss.Index; got {type(index).__name__}."
        )
    if idx.d != dim:
        raise InputError(
            f"index has dimension {idx.d} but the embeddings have {dim}; train the index on "
            "embeddings of the same model."
        )
    if idx.metric_type != metric:
        want = "METRIC_L2" if metric == faiss.METRIC_L2 else "METRIC_INNER_PRODUCT"
        raise InputError(
            f"distance={distance!r} needs a faiss index built with {want}; the given index uses "
            f"metric {idx.metric_type}. Build it with train_index(..., distance={distance!r})."
        )
    return idx, desc


def _prepare(x: np.ndarray, distance: str) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if distance == "cosine":
        norms = np.sqrt(np.einsum("ij,ij->i", x, x, dtype=np.float64))
        _check_nonzero(norms)
        x = x / norms.astype(np.float32)[:, None]
    return x


def _check_nonzero(norms: np.ndarray) -> None:
    if (norms == 0).any():
        raise InputError(
            "distance='cosine' needs non-zero vectors; a row is all zero "
            f"(first at row {int(np.flatnonzero(norms == 0)[0])} of its block)."
        )


def _unit_rows(x: np.ndarray) -> np.ndarray:
    """The rows of ``x`` scaled to unit L2 norm in float64 (an all-zero row is refused)."""
    x = np.asarray(x, dtype=np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", x, x))
    _check_nonzero(norms)
    return x / norms[:, None]


def _shared_direction(reference: np.ndarray, distance: str) -> np.ndarray | None:
    """For cosine, the mean direction ``m`` of the float64 unit rows of a seeded sample of
    ``reference`` (at most ``_DIRECTION_ROWS``) when they are concentrated about it (their mean
    is at least ``_CONCENTRATED`` long, as for embeddings sharing a large common offset), else
    ``None``.  Any ``m`` ranks as well (``|(u - m) - (v - m)| = |u - v|``): a sample only
    says whether the rows need it and where they lie, at no cost on a large reference set.

    Examples
    --------
    >>> x = np.random.default_rng(0).standard_normal((100, 4)).astype(np.float32)
    >>> _shared_direction(x, "cosine") is None, _shared_direction(x + 1000, "cosine").round(3)
    (True, array([0.5, 0.5, 0.5, 0.5]))
    """
    n = int(reference.shape[0])
    if distance != "cosine" or n == 0:
        return None
    rows = np.arange(n)
    if n > _DIRECTION_ROWS:
        rows = np.sort(np.random.default_rng(0).choice(n, _DIRECTION_ROWS, replace=False))
    total = _unit_rows(reference[rows]).sum(axis=0)
    length = float(np.linalg.norm(total))
    if length < _CONCENTRATED * rows.size:
        return None
    return total / length


@dataclass(frozen=True)
class _Space:
    """The coordinates faiss sees: the task's rows are the caller's times ``2**scale`` minus
    ``centre`` (:class:`embedeval.engine.task.RetrievalTask`); an index trained before the call
    (:func:`train_index`, a saved file) learnt its centroids and codebooks on the caller's
    rows, so it is added to and searched with those, recovered exactly (both steps invert
    exact operations), and its distances are brought back to the task's scale.

    Cosine rows concentrated about a ``direction`` m (:func:`_shared_direction`) all round to
    nearly the same float32 unit vector, whose inner products cannot tell them apart.  An index
    built here then holds the unit rows minus m, formed in float64 (small, so float32 keeps
    their digits), with ``METRIC_L2``: ``|(u - m) - (v - m)|**2 = |u - v|**2 = 2 - 2 u.v``
    ranks like the cosine, and half of it is the key ``1 - cos``."""

    scale: int = 0
    centre: np.ndarray | None = None
    direction: np.ndarray | None = None

    def rows(self, x: np.ndarray, distance: str) -> np.ndarray:
        """Rows of ``task.query`` / ``task.reference`` as the index must see them."""
        if self.direction is not None:  # float64 a few thousand rows at a time
            out = np.empty(x.shape, dtype=np.float32)
            for a in range(0, x.shape[0], _DIRECTION_ROWS):
                piece = slice(a, a + _DIRECTION_ROWS)
                out[piece] = _unit_rows(x[piece]) - self.direction
            return out
        if self.centre is not None:
            x = np.asarray(x, dtype=np.float32) + self.centre
        if self.scale:
            x = np.ldexp(np.asarray(x, dtype=np.float32), -self.scale)
        return _prepare(x, distance)

    def keys(self, dist: np.ndarray, distance: str) -> np.ndarray:
        """Ranking keys (ascending) from faiss's distances or products, on the task's scale
        (both grow like 2**(2 scale))."""
        if self.direction is not None:  # |u - v|**2 / 2 = 1 - cos: the cosine key plus 1
            return np.ldexp(dist, -1)
        dist = np.ldexp(dist, 2 * self.scale) if self.scale else dist
        return dist if distance == "euclidean" else -dist


def _space(task: RetrievalTask, idx: Any, given: bool) -> _Space:
    """The task's own coordinates for an index trained here or needing no training (a flat
    index: its products stay those of the centred rows), the caller's for one trained before."""
    import faiss

    flat = isinstance(faiss.downcast_index(idx), faiss.IndexFlat)
    if not given or not idx.is_trained or flat:
        return _Space()
    if task.scale < 0:  # scaled down because float32 keys of the caller's rows overflow
        raise InputError(
            f"the embeddings reach about 2**{-int(task.scale)}, where faiss's float32 distances "
            "overflow, and a trained index searches the rows as they were given. Divide the "
            f"embeddings by 2**{-int(task.scale)} before training the index and evaluating, or "
            "pass a factory string (e.g. index='IVF1024,Flat'), whose rows are scaled here."
        )
    return _Space(int(task.scale), task.centre)


def _train(
    idx: Any,
    xb: np.ndarray,
    distance: str,
    seed: int,
    training_rows: int | None = None,
    clustering: str = "kmeans",
    space: _Space | None = None,
) -> int:
    """Train ``idx`` (when it needs it) on a seeded subsample, in the coordinates of ``space``;
    return the rows used."""
    import faiss

    ivf = faiss.try_extract_index_ivf(idx)
    if clustering == "two_level" and (ivf is None or isinstance(idx, faiss.IndexPreTransform)):
        raise InputError(
            "clustering='two_level' trains the coarse centroids of an inverted-file index "
            f"without a pre-transform; {type(idx).__name__} is not one. Use clustering='kmeans'."
        )
    if idx.is_trained:
        return 0
    n_ref = xb.shape[0]
    if ivf is not None:
        if ivf.nlist > n_ref:
            raise InputError(
                f"the index has nlist={ivf.nlist} inverted lists but there are only {n_ref} "
                "references; use a smaller nlist (about sqrt(n_reference) to 16 * sqrt)."
            )
        n_train = min(n_ref, _POINTS_PER_CENTROID * ivf.nlist)
    else:
        n_train = min(n_ref, _DEFAULT_TRAINING_ROWS)
    if training_rows is not None:
        n_train = min(n_ref, training_rows)
    rows = np.arange(n_ref)
    if n_train < n_ref:
        rows = np.sort(np.random.default_rng(seed).choice(n_ref, n_train, replace=False))
    xt = (space or _Space()).rows(xb[rows], distance)
    exponent = range_exponent([xt], distance)
    if exponent < 0:  # faiss's k-means would abort the process on infinite distances
        raise InputError(
            f"the reference reaches about 2**{-exponent}, where faiss's float32 distances "
            f"overflow; divide the embeddings by 2**{-exponent} before training the index (and "
            "evaluate the divided embeddings), or pass a factory string to evaluate, which "
            "scales them itself."
        )
    try:
        if clustering == "two_level":
            _two_level_centroids(ivf, xt, seed)
        idx.train(xt)  # with a filled quantizer this only trains the codes (PQ, SQ, ...)
    except RuntimeError as exc:
        raise InputError(f"faiss could not train the index on {n_train} rows: {exc}") from exc
    return int(n_train)


def _two_level_centroids(ivf: Any, xt: np.ndarray, seed: int) -> None:
    """Fill ``ivf``'s quantizer with ``nlist`` centroids from two-level k-means."""
    import faiss
    from faiss.contrib.clustering import two_level_clustering

    nlist = int(ivf.nlist)
    if xt.shape[0] < nlist:
        raise RuntimeError(f"two-level k-means needs at least nlist={nlist} training rows")
    coarse = max(1, round(np.sqrt(nlist)))
    centroids, _ = two_level_clustering(xt, coarse, nlist, seed=seed)
    centroids = np.ascontiguousarray(centroids, dtype=np.float32)
    if ivf.metric_type != faiss.METRIC_L2:  # inner product ranks by direction, not norm
        centroids /= np.maximum(np.linalg.norm(centroids, axis=1, keepdims=True), 1e-30)
    ivf.quantizer.train(centroids)
    ivf.quantizer.add(centroids)


def _set_params(idx: Any, params: dict[str, Any]) -> None:
    import faiss

    space = faiss.ParameterSpace()
    for name, value in params.items():
        if not isinstance(name, str):
            raise InputTypeError(f"index_params keys must be strings; got {name!r}.")
        value = check_index_param(name, value)
        try:
            space.set_index_parameter(idx, name, value)
        except (RuntimeError, TypeError) as exc:
            raise InputError(
                f"index_params[{name!r}]={value!r} cannot be set on this index ({exc}). Use "
                "'nprobe' for IVF indexes and 'efSearch' for HNSW."
            ) from exc


def search(task: RetrievalTask, options: Any) -> Iterator[ScoredBlock]:
    """The approximate backend's entry point (see :mod:`embedeval.search.dispatch`): scored blocks
    of
    approximate per-query values and tie flags; returns the report of their error."""
    index_params = {} if options.index_params is None else dict(options.index_params)
    depth, threshold = task.depth()
    if threshold is not None:
        deep = [m.name for m in task.metrics if m.depth in ("full", "first_hit")]
        raise InputError(
            f"with k=None, the rankings that {', '.join(deep) or 'these metrics'} read reach each "
            "query's farthest (or nearest) same-label reference, which an approximate index "
            "cannot promise to return. Pass an "
            "int k (e.g. k=1000) to evaluate them at a fixed depth, or drop index= for exact "
            "search."
        )
    timings: dict[str, float] = {}
    idx, desc, n_train, space = _filled_index(
        task, options.index, index_params, options.seed, timings
    )
    candidates = np.flatnonzero(task.relevant > 0)
    n_sample = min(options.exact_sample, candidates.size)
    rng = np.random.default_rng(options.seed)
    sample = np.sort(rng.choice(candidates, n_sample, replace=False))
    ranked = np.minimum(np.maximum(depth - 1, 0), task.n_valid)  # positions the metrics read
    seen = _SampleRecord(sample, ranked, task.metrics)
    t0 = time.perf_counter()
    search_k = yield from _search_all((idx, space), task, depth, seen, options.memory_budget,
                                      options.progress)  # fmt: skip
    timings["search_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    report = _exact_sample(task, seen, options.seed, options.memory_budget)
    timings["exact_sample_s"] = time.perf_counter() - t0
    return {
        "index": desc,
        "index_params": {str(k): _jsonable(v) for k, v in index_params.items()},
        "training_rows": n_train,
        "seed": options.seed,
        "search_k": int(search_k),
        **report,
        "timings": {k: round(v, 3) for k, v in timings.items()},
    }


def _filled_index(
    task: RetrievalTask,
    index: Any,
    index_params: dict[str, Any],
    seed: int,
    timings: dict[str, float],
) -> tuple[Any, str, int, _Space]:
    """The faiss index of ``index`` trained (unless it is) and holding the task's reference,
    its description, the rows it was trained on and the coordinates it works in; ``timings``
    gets train_s and add_s."""
    n_ref = int(task.reference.shape[0])
    t0 = time.perf_counter()
    # A factory string builds the index here; an object or a file may arrive trained.
    given = not isinstance(index, (str, os.PathLike)) or os.path.isfile(os.fspath(index))
    direction = None if given else _shared_direction(task.reference, task.distance)
    dim = int(task.reference.shape[1])
    idx, desc = _open_index(index, dim, task.distance, tangent=direction is not None)
    space = _space(task, idx, given) if direction is None else _Space(direction=direction)
    # A parameter this index does not have is refused before the training (minutes on a large
    # set), and set again once trained: training may reset some (a polysemous threshold).
    _set_params(idx, index_params)
    n_train = _train(idx, task.reference, task.distance, seed, space=space)
    timings["train_s"] = time.perf_counter() - t0
    _set_params(idx, index_params)
    t0 = time.perf_counter()
    if idx.ntotal:
        idx.reset()  # keep the training, replace the vectors by this reference set
    for a in range(0, n_ref, _ADD_BLOCK):
        rows = space.rows(task.reference[a : a + _ADD_BLOCK], task.distance)
        if hasattr(idx, "id_map"):  # IDMap / IDMap2 take ids only: the reference rows
            idx.add_with_ids(rows, np.arange(a, a + rows.shape[0], dtype=np.int64))
        else:
            idx.add(rows)
    timings["add_s"] = time.perf_counter() - t0
    return idx, desc, n_train, space


def _jsonable(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


class _SampleRecord:
    """The approximate lists and values of the exact-sample queries, kept as blocks go by."""

    def __init__(self, sample: np.ndarray, ranked: np.ndarray, metrics: Any) -> None:
        self.sample = sample
        self.ranked = ranked
        self.lists: dict[int, np.ndarray] = {}
        self.values = {m.name: np.full(sample.size, np.nan) for m in metrics}

    def keep(self, cands: Candidates, block: ScoredBlock) -> None:
        """Record the sample queries of one scored block of candidates (in the order the
        metrics read them)."""
        start, stop = int(cands.queries[0]), int(cands.queries[-1]) + 1
        lo, hi = np.searchsorted(self.sample, [start, stop])
        for name, v in block.values.items():
            self.values[name][lo:hi] = v[self.sample[lo:hi] - start]
        for q in self.sample[lo:hi]:
            # An index may return fewer than ``ranked`` references (a short inverted list):
            # the list ends at the query's own end, never in the next query's candidates.
            first, end = cands.lims[q - start], cands.lims[q - start + 1]
            self.lists[int(q)] = cands.index[first : min(end, first + self.ranked[q])].copy()


def _search_all(
    index: tuple[Any, _Space],
    task: RetrievalTask,
    depth: np.ndarray,
    seen: _SampleRecord,
    memory_budget: int,
    progress: bool | None,
) -> Iterator[ScoredBlock]:
    """Search every non-lone query in ``index`` (the faiss index and its coordinates), yield
    its cleaned list scored, record the sample's lists; return the largest k asked of faiss
    (a power of two, doubled for a query searched again)."""
    n_query, n_ref = task.n_query, int(task.reference.shape[0])
    col_bits = max(1, int(n_ref - 1).bit_length())
    # Excluded references (self, same group) take slots in faiss's list: ask for that many more.
    k_query = np.where(depth > 0, np.minimum(n_ref, depth + (n_ref - task.n_valid)), 0)
    k_max = int(k_query.max(initial=0))
    exclusions = task.exclusions.by_group(n_query, n_ref)
    if k_max == 0:
        return 0
    searched = 0
    dups = reference_duplicates(task.reference, task.distance)
    block = max(1, min(4096, memory_budget // (k_max * 40), 2 ** (32 - col_bits)))
    need = np.minimum(depth, task.n_valid)
    with progress_bar(n_query, "queries", enabled=progress) as bar:
        for start in range(0, n_query, block):
            stop = min(start + block, n_query)
            code, counts, k_used = _block_lists(index, task, exclusions, start, stop,
                                                k_query[start:stop], need[start:stop], col_bits,
                                                dups)  # fmt: skip
            searched = max(searched, k_used)
            # The float64-decided order: the one the metrics read and the kNN recall compares.
            cands = task.decided(sort_block(code, counts, start, col_bits, False))
            scored = ScoredBlock(cands.queries, *task.score_decided(cands))
            seen.keep(cands, scored)
            yield scored
            bar.update(stop - start)
    return searched


def _block_lists(
    index: tuple[Any, _Space],
    task: RetrievalTask,
    exclusions: Exclusions,
    start: int,
    stop: int,
    k_query: np.ndarray,
    need: np.ndarray,
    col_bits: int,
    dups: DuplicateRows | None = None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Packed (row, key bits, reference) codes of each query's cleaned faiss list, the count
    per query and the largest k searched.

    Each query is searched with k = the next power of two >= its own k (so its list does not
    depend on which queries share its block).  faiss cuts a block of equal distances at k in
    an arbitrary order, so a full list drops its last tie block, and a query left with fewer
    than ``need`` valid references is searched again with twice the k.
    """
    idx, space = index
    n_ref = int(task.reference.shape[0])
    kq = np.where(k_query > 0, 2 ** np.ceil(np.log2(np.maximum(k_query, 1))), 0)
    kq = np.minimum(kq, n_ref).astype(np.int64)
    pending = np.flatnonzero(kq > 0)
    parts, counts = [], np.zeros(stop - start, dtype=np.int64)
    xq = space.rows(task.query[start:stop], task.distance)
    while pending.size:
        retry = []
        for k in np.unique(kq[pending]):
            rows = pending[kq[pending] == k]
            dist, ids = idx.search(xq[rows], int(k))
            keys = space.keys(dist, task.distance)
            got = ids >= 0
            complete = ~got[:, -1] | (k >= n_ref)  # fewer than k came back: nothing was cut
            last = np.where(got, keys, -np.inf).max(axis=1)
            keep = got & (complete[:, None] | (keys < last[:, None]))
            if exclusions.reference_groups is not None:
                safe = np.where(keep, ids, 0)
                keep &= exclusions.other_group(start + rows[:, None], safe)
            n_keep = keep.sum(axis=1)
            short = ~complete & (n_keep < need[rows])
            if short.any():
                retry.append(rows[short])
                keep[short] = False
            r, c = np.nonzero(keep)
            r, ref, key = rows[r], ids[r, c], keys[r, c]
            if dups is not None:
                r, ref, key = _tie_duplicates(r, ref, key, dups, exclusions, start)
            parts.append(pack_codes(r, key, ref, col_bits))
            counts += np.bincount(r, minlength=counts.size)
        pending = np.concatenate(retry) if retry else np.empty(0, dtype=np.int64)
        kq[pending] = np.minimum(2 * kq[pending], n_ref)
    code = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint64)
    return code, counts, int(kq.max(initial=0))  # each query's last k is its largest


def _tie_duplicates(
    row: np.ndarray,
    ref: np.ndarray,
    key: np.ndarray,
    dups: DuplicateRows,
    exclusions: Exclusions,
    start: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Give identical references one key per query (the smallest faiss returned for any of
    them) and list every visible member of the group: faiss computes each distance on its own
    and may round twins apart or return only some of them."""
    at = np.minimum(np.searchsorted(dups.members, ref), dups.members.size - 1)
    twin = dups.members[at] == ref
    if not twin.any():
        return row, ref, key
    n_groups = dups.n_groups
    pair, where = np.unique(
        row[twin].astype(np.int64) * n_groups + dups.group[at[twin]], return_inverse=True
    )
    shared = np.full(pair.size, np.inf, dtype=np.float32)
    np.minimum.at(shared, where.ravel(), key[twin])
    order = np.argsort(dups.group, kind="stable")
    lims = np.concatenate(([0], np.cumsum(np.bincount(dups.group, minlength=n_groups))))
    g = pair % n_groups
    sizes = lims[g + 1] - lims[g]
    new_ref = dups.members[order][spans(lims[g], sizes)]
    new_row = np.repeat(pair // n_groups, sizes)
    new_key = np.repeat(shared, sizes)
    if exclusions.reference_groups is not None:  # a twin in the query's group stays out
        visible = exclusions.other_group(start + new_row, new_ref)
        new_row, new_ref, new_key = new_row[visible], new_ref[visible], new_key[visible]
    plain = ~twin
    return (
        np.concatenate((row[plain], new_row)),
        np.concatenate((ref[plain], new_ref)),
        np.concatenate((key[plain], new_key)),
    )


def _exact_sample(
    task: RetrievalTask, seen: _SampleRecord, seed: int, memory_budget: int
) -> dict[str, Any]:
    """Exact values and neighbour lists of the sample queries, and the error report."""
    sample = seen.sample
    out: dict[str, Any] = {"n_sample": int(sample.size), "ci": _CI, "n_boot": _N_BOOT}
    if sample.size == 0:
        out.update(knn_recall=None, metrics={})
        return out
    sub = task.subset(sample)
    exact, exact_ties = sub.empty_outputs()
    recall = np.full(sample.size, np.nan)
    write_back(exact, exact_ties, _exact_blocks(sub, seen, recall, memory_budget))
    out["knn_recall"] = float(np.nanmean(recall)) if np.isfinite(recall).any() else None
    rng = np.random.default_rng(seed)
    out["metrics"] = {name: _difference(seen.values[name], e, rng) for name, e in exact.items()}
    return out


def _exact_blocks(
    sub: RetrievalTask, seen: _SampleRecord, recall: np.ndarray, memory_budget: int
) -> Iterator[ScoredBlock]:
    """The sample's exact scored blocks; ``recall`` gets each query's kNN recall against its
    first references in float64 order."""
    sample, ranked = seen.sample, seen.ranked
    # The engine's blocks come in float32 key order, which ties rows far from the origin (or
    # near-ties) arbitrarily; without metrics every near-tie is decided in float64, not only
    # those between a relevant and a non-relevant reference, so the first d are the exact ones.
    in_order = dataclasses.replace(sub, metrics=())
    for found in sorted_candidates(
        sub.query,
        sub.reference,
        distance=sub.distance,
        depth=sub.depth()[0],
        exclusions=sub.exclusions,
        n_valid=sub.n_valid,
        memory_budget=memory_budget,
        progress=False,
    ):
        block = in_order.decided(found)
        yield ScoredBlock(block.queries, *sub.score_decided(block))
        for i, q in enumerate(block.queries):
            d = int(ranked[sample[q]])
            if d == 0:
                continue
            truth = block.index[block.lims[i] : block.lims[i] + d]
            found = seen.lists.get(int(sample[q]), np.empty(0, dtype=truth.dtype))
            recall[q] = np.intersect1d(truth, found).size / d


def _difference(a: np.ndarray, e: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
    """Mean exact and approximate values of the sample, their difference and its percentile
    bootstrap interval (queries resampled with replacement)."""
    ok = ~(np.isnan(a) | np.isnan(e))
    diff = a[ok] - e[ok]
    entry = {
        "exact": float(e[ok].mean()) if ok.any() else None,
        "approximate": float(a[ok].mean()) if ok.any() else None,
        "difference": float(diff.mean()) if ok.any() else None,
        "difference_ci": None,
    }
    if diff.size > 1:
        lo, hi = mean_difference_interval(diff, ci=_CI, n_boot=_N_BOOT, rng=rng)
        entry["difference_ci"] = [lo, hi]
    return entry
