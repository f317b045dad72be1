"""The deep-ranking engine (ranks of the relevant references alone) against the brute-force
oracle and against the candidate engine it replaces (bit for bit: same keys, same kernels)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import embedeval as ee
import embedeval.engine.deep as deep
import embedeval.search.local as local
from embedeval.engine.candidates import from_sortable_bits, sortable_bits
from embedeval.engine.deep import deep_applies, deep_blocks, flagged_keys
from embedeval.engine.exact import DEFAULT_MEMORY_BUDGET, sorted_candidates
from embedeval.engine.task import write_back
from embedeval.evaluation.settings import EvaluationInputs, validate_arguments
from embedeval.evaluation.stages import plan_search, prepare_data
from tests import oracle

METRICS = ["precision_at_1", "r_precision", "map_at_r", "map", "mrr", "recall_at_5"]


def _data(kind: str, n: int = 240, classes: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    if kind == "integer":  # exact ties everywhere, and duplicated rows
        x = rng.integers(-2, 3, size=(n, 6)).astype(np.float32)
        x[10:20] = x[0:10]
    else:
        x = rng.standard_normal((n, 16)).astype(np.float32)
        x[5:8] = x[0:3]
    return x, rng.integers(0, classes, n)


def _task(x, y, xr=None, yr=None, **kwargs):
    inputs = EvaluationInputs(x, y, xr, yr, kwargs.pop("query_groups", None))
    settings = validate_arguments(inputs, **kwargs)
    return plan_search(settings, prepare_data(settings, inputs)).task


def _candidate_engine(task):
    depth, threshold = task.depth()
    values, ties = task.empty_outputs()
    blocks = sorted_candidates(
        task.query,
        task.reference,
        distance=task.distance,
        depth=depth,
        exclusions=task.exclusions,
        n_valid=task.n_valid,
        positive_threshold=task.positive_threshold(threshold),
        finish=task.scored,
    )
    write_back(values, ties, blocks)
    return values, ties


def _deep_engine(task, block_size=None):
    values, ties = task.empty_outputs()
    blocks = deep_blocks(task, block_size=block_size, memory_budget=DEFAULT_MEMORY_BUDGET)
    write_back(values, ties, blocks)
    return values, ties


# Integer vectors: float32 keys are exact, so float32 and the oracle's float64 rank alike
# (cosine keys are rounded quotients, and random floats have near-ties float32 cannot tell
# apart; the bit-for-bit test below covers those against the candidate engine).
# 6 classes: about 50 relevant keys in rows of 300, located by searching codes of every key
# (row_codes); 60 classes: about 5, each searched in its own row
@pytest.mark.parametrize("distance", ["euclidean", "inner_product"])
@pytest.mark.parametrize("classes", [3, 6, 60])
@pytest.mark.parametrize("exact_keys", [True, False])
def test_deep_engine_matches_oracle(monkeypatch, distance, classes, exact_keys):
    # exact_keys=False: the float32 keys of these integers are not taken as exact (the float64
    # filter and decision run on them).
    if not exact_keys:
        monkeypatch.setattr(local, "with_exact_keys", lambda task: task)
    x, y = _data("integer", n=300, classes=classes)
    res = ee.evaluate(x, y, metrics=METRICS, distance=distance, progress=False)
    _, per_query = oracle.summary(x, y, metrics=METRICS, distance=distance)
    for m in METRICS:
        np.testing.assert_allclose(res.per_query[m], per_query[m], rtol=1e-12, err_msg=m)


def test_candidates_sorted_in_runs_of_rows_match_oracle(monkeypatch):
    # runs of about 50 codes: a block's candidates are sorted a few rows at a time (windows
    # only, so the candidate engine runs)
    import embedeval.engine.exact as exact

    monkeypatch.setattr(exact, "_SORT_RUN", 50)
    calls = []
    sort_row_runs = exact.sort_row_runs
    monkeypatch.setattr(
        exact, "sort_row_runs", lambda c, lims: calls.append(1) or sort_row_runs(c, lims)
    )
    metrics = [m for m in METRICS if m != "map"]
    x, y = _data("integer", n=300, classes=60)
    res = ee.evaluate(x, y, metrics=metrics, distance="euclidean", progress=False)
    _, per_query = oracle.summary(x, y, metrics=metrics, distance="euclidean")
    assert calls
    for m in metrics:
        np.testing.assert_allclose(res.per_query[m], per_query[m], rtol=1e-12, err_msg=m)


@pytest.mark.parametrize("exact_keys", [True, False])
def test_deep_engine_with_reference_and_groups_matches_oracle(monkeypatch, exact_keys):
    if not exact_keys:
        monkeypatch.setattr(local, "with_exact_keys", lambda task: task)
    x, y = _data("integer", n=300, classes=30)
    g = np.random.default_rng(1).integers(0, 4, 300)
    xq, yq, gq, xr, yr, gr = x[:90], y[:90], g[:90], x[90:], y[90:], g[90:]
    res = ee.evaluate(
        xq, yq, xr, yr, metrics=METRICS, query_groups=gq, reference_groups=gr, progress=False
    )
    _, per_query = oracle.summary(xq, yq, xr, yr, metrics=METRICS, qg=gq, rg=gr)
    for m in METRICS:
        np.testing.assert_allclose(res.per_query[m], per_query[m], rtol=1e-12, err_msg=m)


@pytest.mark.parametrize("kind", ["integer", "float"])
@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize(
    "metrics", [["map"], ["map", "minp", "precision_at_1"], ["map", *METRICS[:3], "mrr"]]
)
@pytest.mark.parametrize("k", [None])
def test_deep_engine_is_the_candidate_engine_bit_for_bit(kind, distance, metrics, k):
    x, y = _data(kind, n=400, classes=80)
    task = _task(x, y, metrics=metrics, k=k, distance=distance)
    if not deep_applies(task):
        pytest.skip("shallow: the candidate engine runs")
    want_values, want_ties = _candidate_engine(task)
    for block_size in (None, 37):
        values, ties = _deep_engine(task, block_size)
        for m in metrics:
            assert np.array_equal(values[m], want_values[m], equal_nan=True), m
            assert np.array_equal(ties[m], want_ties[m]), m


def test_deep_applies_to_full_depth_rankings_with_few_relevant_references():
    x, y = _data("float", n=400, classes=80)  # R_q about 4 of 399
    assert deep_applies(_task(x, y, metrics=["map"]))
    assert deep_applies(_task(x, y, metrics=["map_at_r", "minp"]))
    assert not deep_applies(_task(x, y, metrics=["map_at_r"]))
    assert not deep_applies(_task(x, y, metrics=["mrr"]))
    assert not deep_applies(_task(x, y, metrics=["map"], k=50))
    x, y = _data("float", n=400, classes=2)  # R_q about 200: the candidate engine
    assert not deep_applies(_task(x, y, metrics=["map"]))


# Near misses: rows where non-relevant keys lie within the float32 bound of relevant ones are
# ranked in place from float64 keys.  The oracle below ranks by the float64 keys as the float64
# decision defines them (one column at a time, in order), ties by reference index.


def _crowded(n: int = 2000, classes: int = 20, seed: int = 3):
    """Unit rows crowded into a small cap (so keys of both kinds interleave closely), classes
    drawn at random, and pairs of rows one float32 ulp apart with different labels."""
    rng = np.random.default_rng(seed)
    x = np.zeros((n, 16), dtype=np.float32)
    x[:, 0] = 1.0
    x += 0.01 * rng.standard_normal((n, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = rng.integers(0, classes, n)
    for i in range(0, 200, 2):  # row i + 1 is row i with one coordinate moved by one ulp
        x[i + 1] = x[i]
        x[i + 1, i % 16] = np.nextafter(x[i, i % 16], np.float32(2))
        y[i + 1] = (y[i] + 1) % classes
    return x, y


def _float64_ranking_oracle(xq, yq, xr, yr, distance, loo):
    """Per query: AP over the whole ranking, P@1, and whether a relevant and a non-relevant
    reference have equal keys, at most the last relevant key; keys ``sum_j (q_j - x_j)**2`` or
    ``-sum_j q_j x_j`` in float64, column by column; stable sort by (key, reference index)."""
    q, r = xq.astype(np.float64), xr.astype(np.float64)
    keys = np.zeros((len(q), len(r)))
    for j in range(q.shape[1]):
        if distance == "euclidean":
            keys += (q[:, j, None] - r[None, :, j]) ** 2
        else:
            keys -= q[:, j, None] * r[None, :, j]
    return _oracle_from_keys(keys, yq, yr, loo)


def _oracle_from_keys(keys, yq, yr, loo):
    """:func:`_float64_ranking_oracle` from a float64 key matrix (queries x references)."""
    n_q, n_r = keys.shape
    ap, p1, tie = np.full(n_q, np.nan), np.full(n_q, np.nan), np.zeros(n_q, bool)
    for i in range(n_q):
        idx = np.array([j for j in range(n_r) if not (loo and j == i)])
        idx = idx[np.lexsort((idx, keys[i, idx]))]
        rel = _relevant(yq[i], yr[idx])
        if not rel.any():
            continue
        ranks = np.flatnonzero(rel) + 1
        ap[i] = np.mean(np.arange(1, ranks.size + 1) / ranks)
        p1[i] = float(rel[0])
        k = keys[i, idx]
        inside = k <= k[ranks[-1] - 1]
        tie[i] = bool(set(k[rel & inside]) & set(k[~rel & inside]))
    return ap, p1, tie


@pytest.mark.parametrize("distance", ["euclidean", "inner_product", "cosine"])
def test_float64_filter_ranks_far_from_the_origin_and_ties_identical_rows(distance):
    """The deep engine's default filter (keys rounded from a float64 product, float64 copies
    of the rows and of the duplicate representatives): rows far from the origin, identical
    rows (and, for cosine, positive multiples) with different labels, rows one ulp apart,
    against fixed-order float64 keys per query."""
    rng = np.random.default_rng(11)
    n, d = 600, 12
    y = rng.integers(0, 6, n)
    x = rng.standard_normal((6, d)).astype(np.float32)[y] * 0.05
    x += 0.02 * rng.standard_normal((n, d)).astype(np.float32)
    if distance == "euclidean":
        x += np.float32(1000.0)
    x[1:60:3] = x[0:60:3]  # identical rows, other labels
    y[1:60:3] = (y[0:60:3] + 1) % 6
    x[2:60:3] = x[0:60:3]
    x[2:60:3, 1] = np.nextafter(x[0:60:3, 1], np.float32(np.inf))  # one ulp apart
    if distance == "cosine":
        x[60:90] = 2 * x[90:120]  # the same point after normalisation
        y[60:90] = (y[90:120] + 2) % 6
    task = _task(x, y, metrics=["map", "precision_at_1"], distance=distance)
    assert deep.filter_precision(task) == "float64"
    values, ties = _deep_engine(task, 64)
    keys = np.stack([oracle.fixed_order_keys(x[i], x, distance) for i in range(n)])
    ap, p1, tie = _oracle_from_keys(keys, y, y, loo=True)
    np.testing.assert_allclose(values["map"], ap, rtol=1e-12)
    np.testing.assert_array_equal(values["precision_at_1"], p1)
    np.testing.assert_array_equal(ties["map"], tie)


def _count_paths(monkeypatch):
    """Counters of the near-miss items ranked in place and of the crowded rows."""

    seen = {"near": 0, "near_rows": 0, "crowded_rows": 0}
    band_ahead = deep._band_ahead
    lock = threading.Lock()  # blocks run on worker threads

    def counted_band(row, *args):
        with lock:
            seen["near"] += row.size
            seen["near_rows"] += np.unique(row).size
        return band_ahead(row, *args)

    crowded_rows = deep._crowded_rows

    def counted_crowded(*args):
        out = crowded_rows(*args)
        if out is not None:  # rows ranked from float64 keys of the whole row, also in place
            with lock:
                seen["near_rows"] += out[0].size
                seen["crowded_rows"] += out[0].size
        return out

    monkeypatch.setattr(deep, "_band_ahead", counted_band)
    monkeypatch.setattr(deep, "_crowded_rows", counted_crowded)
    return seen


@pytest.mark.parametrize("precision", ["float32", "float64"])
@pytest.mark.parametrize("distance", ["euclidean", "inner_product"])
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("block_size", [None, 37, 300])
def test_near_miss_rows_are_ranked_in_place_as_float64_orders_them(
    monkeypatch, precision, distance, split, block_size
):
    """Both filter products, float32 keys (most rows hold near misses) and keys rounded from
    a float64 product, against the float64 brute force."""
    monkeypatch.setattr(deep, "filter_precision", lambda task: precision)
    x, y = _crowded()
    if split:
        args, oracle_args = (
            (x[:500], y[:500], x[500:], y[500:]),
            (x[:500], y[:500], x[500:], y[500:]),
        )
    else:
        args, oracle_args = (x, y), (x, y, x, y)
    task = _task(*args, metrics=["map", "precision_at_1"], distance=distance)
    seen = _count_paths(monkeypatch)
    values, ties = _deep_engine(task, block_size)
    ap, p1, tie = _float64_ranking_oracle(*oracle_args, distance, loo=not split)
    if precision == "float32":
        assert seen["near_rows"] > 0.5 * task.n_query  # most rows hold near misses
    assert tie.sum() <= 2  # a float64 tie of the kinds: 1 ulp lost in a sum
    np.testing.assert_allclose(values["map"], ap, rtol=1e-12)
    np.testing.assert_array_equal(values["precision_at_1"], p1)
    np.testing.assert_array_equal(ties["map"], tie)


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("copies", [False, True])
def test_rows_crowded_with_near_misses_rank_from_float64_row_keys(monkeypatch, split, copies):
    """Three classes in a tiny cap (inner products all near 1: nearly every relevant key has
    non-relevant keys inside its float32 band, as in hashing's mAP@all): rows are ranked from
    float64 keys of the whole row.  Pairs one ulp apart with different labels stay there;
    identical rows with different labels (``copies``) tie exactly, and the rows that see such
    a tie go to the band-by-band path, which ranks the tie by index and flags it."""
    rng = np.random.default_rng(5)
    x = np.zeros((1500, 8), dtype=np.float32)
    x[:, 0] = 1.0
    x += 0.003 * rng.standard_normal(x.shape).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = rng.integers(0, 3, 1500)
    x[1:40:2] = x[0:40:2]
    x[1:40:2, 3] = np.nextafter(x[1:40:2, 3], np.float32(2))
    y[1:40:2] = (y[0:40:2] + 1) % 3
    if copies:
        x[40:50], y[40:50] = x[50:60], (y[50:60] + 1) % 3  # identical rows, other labels
    args = (x[:300], y[:300], x[300:], y[300:]) if split else (x, y)
    oracle_args = args if split else (x, y, x, y)
    task = _task(*args, metrics=["map", "precision_at_1"], distance="inner_product")
    monkeypatch.setattr(deep, "filter_precision", lambda task: "float32")
    seen = _count_paths(monkeypatch)
    values, ties = _deep_engine(task, 64)
    ap, p1, tie = _float64_ranking_oracle(*oracle_args, "inner_product", loo=not split)
    if not copies:  # with copies nearly every row sees an exact tie between the kinds
        assert seen["crowded_rows"] > 0.5 * task.n_query
    np.testing.assert_allclose(values["map"], ap, rtol=1e-12)
    np.testing.assert_array_equal(values["precision_at_1"], p1)
    np.testing.assert_array_equal(ties["map"], tie)


@pytest.mark.parametrize("distance", ["euclidean", "inner_product"])
@pytest.mark.parametrize("block_size", [None, 53])
def test_exact_ties_between_kinds_are_flagged_and_valued_by_reference_index(distance, block_size):
    rng = np.random.default_rng(4)
    x = rng.integers(-2, 3, size=(600, 5)).astype(np.float32)
    x[20:40] = x[0:20]  # identical rows
    y = rng.integers(0, 15, 600)
    task = _task(x, y, metrics=["map", "precision_at_1"], distance=distance)
    values, ties = _deep_engine(task, block_size)
    ap, p1, tie = _float64_ranking_oracle(x, y, x, y, distance, loo=True)
    np.testing.assert_allclose(values["map"], ap, rtol=1e-12)
    np.testing.assert_array_equal(values["precision_at_1"], p1)
    assert tie.sum() > 100
    np.testing.assert_array_equal(ties["map"], tie)


@pytest.mark.parametrize("precision", ["float32", "float64"])
@pytest.mark.parametrize("distance", ["euclidean", "inner_product"])
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("ints", [False, True, "multi-label"])
def test_near_misses_among_identical_rows_only_are_ranked_by_index(
    monkeypatch, precision, distance, split, ints
):
    """Deep rankings (four classes) with 80 groups of 2 to 5 identical rows of mixed labels,
    several relevant and non-relevant copies per query, as hashing databases have them; ten
    groups also have a row one ulp away under another label, inside their band.  A relevant
    copy whose band holds nothing but its own copies is ranked without float64 (copies of
    smaller index ahead, all of them tied with it); the others band by band; both against
    the float64 brute force, tie flags included.  ``ints``: small integers in 3 dimensions
    (float32 keys exact, many runs of equal keys beside the groups', whose float32 key values
    can equal another run's float64 key).  ``"multi-label"``: random floats, each row with one
    or two of four labels (an indicator matrix), relevant when it shares one with the query."""
    monkeypatch.setattr(deep, "filter_precision", lambda task: precision)
    rng = np.random.default_rng(8)
    n, d = 900, 8
    x = rng.standard_normal((n, d)).astype(np.float32)
    if ints is True:
        x = rng.integers(-3, 4, (n, 3)).astype(np.float32)
    y = rng.integers(0, 4, n)
    if ints == "multi-label":
        y = np.eye(4, dtype=np.int64)[y] | np.eye(4, dtype=np.int64)[rng.integers(0, 4, n)]
    rows = rng.permutation(n)
    at = 0
    for g in range(80):
        size = int(rng.integers(2, 6))
        members = rows[at : at + size]
        at += size
        x[members] = x[members[0]]
        y[members] = _labels_like(y, rng, size)
        if g < 10:  # a neighbour one ulp away, another label
            other = rows[at]
            at += 1
            x[other] = x[members[0]]
            x[other, 2] = np.nextafter(x[other, 2], np.float32(np.inf))
            y[other] = np.roll(y[members[0]], 1) if y.ndim == 2 else (y[members[0]] + 1) % 4
    args = (x[:300], y[:300], x[300:], y[300:]) if split else (x, y)
    oracle_args = args if split else (x, y, x, y)
    task = _task(*args, metrics=["map", "precision_at_1"], distance=distance)
    seen = _count_paths(monkeypatch)
    resolved = [0]
    twin_items = deep._twin_items

    def counted_twins(*a):
        out = twin_items(*a)
        resolved[0] += 0 if out is None else out[0].size
        return out

    monkeypatch.setattr(deep, "_twin_items", counted_twins)
    settle_twins = deep._settle_twins  # the same, in rows ranked by a whole sort

    def counted_settled(*a):
        out = settle_twins(*a)
        resolved[0] += 0 if out is None else out[0].size
        return out

    monkeypatch.setattr(deep, "_settle_twins", counted_settled)
    runs = set()  # (query, first place, last place) of each run of tied kinds
    score_ranks = deep.score_ranks

    def kept_runs(task, start, ranks):
        block_row, first, last, _ = ranks.blocks
        runs.update(zip((start + block_row).tolist(), first.tolist(), last.tolist(), strict=True))
        return score_ranks(task, start, ranks)

    monkeypatch.setattr(deep, "score_ranks", kept_runs)
    values, ties = _deep_engine(task, 128)
    ap, p1, tie = _float64_ranking_oracle(*oracle_args, distance, loo=not split)
    assert resolved[0] > task.n_query  # twins ranked by index
    # the one-ulp neighbours: near misses of float32 keys (float64 keys, sorted whole, set
    # them apart from the groups without a band)
    assert seen["near"] > 0 or precision == "float64"
    assert tie.sum() > 0.5 * task.n_query
    np.testing.assert_allclose(values["map"], ap, rtol=1e-12)
    np.testing.assert_array_equal(values["precision_at_1"], p1)
    np.testing.assert_array_equal(ties["map"], tie)
    assert runs == _mixed_runs(*oracle_args, distance, loo=not split)


def _labels_like(y, rng, size):
    """``size`` random labels of ``y``'s kind: class numbers 0..3, or indicator rows of one or
    two of four labels."""
    drawn = rng.integers(0, 4, size)
    if y.ndim == 1:
        return drawn
    return np.eye(4, dtype=y.dtype)[drawn] | np.eye(4, dtype=y.dtype)[rng.integers(0, 4, size)]


def _relevant(yq_i, yr):
    """Which references (labels ``yr``) are relevant to a query of label(s) ``yq_i``: the same
    class, or (indicator rows) at least one shared label."""
    if np.ndim(yr) == 2:
        return (np.asarray(yr, bool) & np.asarray(yq_i, bool)).any(axis=1)
    return yr == yq_i


def _mixed_runs(xq, yq, xr, yr, distance, loo):
    """Per query, the runs of equal float64 keys (column-order sums) that hold relevant and
    non-relevant references, as ``(query, first place, last place)`` (0-based places)."""
    q, r = xq.astype(np.float64), xr.astype(np.float64)
    runs = set()
    for i in range(len(q)):
        keys = np.zeros(len(r))
        for j in range(q.shape[1]):
            keys += (q[i, j] - r[:, j]) ** 2 if distance == "euclidean" else -q[i, j] * r[:, j]
        idx = np.array([j for j in range(len(r)) if not (loo and j == i)])
        idx = idx[np.lexsort((idx, keys[idx]))]
        k, rel = keys[idx], _relevant(yq[i], yr[idx])
        start = 0
        for end in range(1, len(k) + 1):  # runs of equal keys: places start..end-1
            if end == len(k) or k[end] != k[start]:
                if 0 < rel[start:end].sum() < end - start:
                    runs.add((i, start, end - 1))
                start = end
    return runs


def test_flagged_keys_order_as_float_keys_up_to_the_flag():
    """Against float comparisons of the keys: every sign, zeros of both signs, subnormals,
    +inf; a flagged non-relevant key lies below an even threshold exactly when its key does,
    and sorting keeps the float order of keys more than one unit in the last place apart."""
    rng = np.random.default_rng(12)
    bits = rng.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32)
    keys = bits.view(np.float32).copy()
    keys[~np.isfinite(keys)] = np.inf
    keys[:40] = [0.0, -0.0, 1e-45, -1e-45, 3e-45, -3e-45, 1.0, np.nextafter(1.0, 2.0)] * 5
    relevant = rng.random(keys.size) < 0.5
    relevant &= np.isfinite(keys)
    flagged = flagged_keys(keys[None], relevant[None])[0]
    assert np.array_equal(flagged & 1, relevant.astype(np.uint32))
    t_keys = rng.choice(keys[np.isfinite(keys)], 300)
    t_bits = sortable_bits(t_keys) & np.uint32(0xFFFFFFFE)  # even thresholds
    t_vals = from_sortable_bits(t_bits)
    other = ~relevant
    for t, v in zip(t_bits, t_vals, strict=True):
        assert np.array_equal(flagged[other] < t, keys[other] < v)
    order = np.argsort(flagged, kind="stable")
    k = keys[order].astype(np.float64)
    ulp = np.spacing(np.abs(keys[order]).astype(np.float32)).astype(np.float64)
    behind = k[:-1] > k[1:] + np.maximum(ulp[:-1], ulp[1:])
    assert not behind.any()


def test_item_bands_hold_the_band_around_either_key_a_flag_stands_for():
    """A relevant item's flagged bits stand for its key or the float below: the returned
    ``[lo, hi]`` must hold ``key -+ band`` for both (float64 arithmetic), with ``lo`` even."""
    rng = np.random.default_rng(14)
    n = 20_000
    keys = (2.0 ** rng.integers(-149, 30, n) * rng.uniform(1, 2, n)).astype(np.float32)
    keys *= rng.choice(np.array([-1, 1], np.float32), n)
    keys[:6] = [0.0, -0.0, 1e-45, -1e-45, 2e-45, -2e-45]
    band = np.abs(keys.astype(np.float64)) * rng.uniform(0, 2**-21, n) + 2.0**-149 * rng.integers(
        0, 4, n
    )
    e64 = np.abs(keys.astype(np.float64)) * 2.0**-50
    for err in (None, e64):
        lo, hi = deep._item_bands(sortable_bits(keys) | np.uint32(1), band, err)
        assert np.all((lo & 1 == 0) | (lo == sortable_bits(np.float32(-np.inf))))
        lo_f = from_sortable_bits(lo).astype(np.float64)
        hi_f = from_sortable_bits(hi).astype(np.float64)
        for key in (keys, from_sortable_bits(sortable_bits(keys) | np.uint32(1))):
            k = key.astype(np.float64)
            need = band if err is None else np.minimum(band, deep.relative_band(key, err))
            assert np.all(lo_f <= k - need) and np.all(hi_f >= k + need)


def test_near_items_are_the_items_whose_band_may_hold_a_non_relevant_key():
    """Against a plain loop: an item is near when some non-relevant key of its row (its
    flagged bits ``e`` or ``e + 1``) may lie in its band, or the band passes the row's cut."""
    rng = np.random.default_rng(15)
    b, n = 6, 40
    keys = (np.uint32(0x3F800000) + rng.integers(0, 150, (b, n)).astype(np.uint32)).view(np.float32)
    relevant = rng.random((b, n)) < 0.4
    rows = np.sort(flagged_keys(keys, relevant), axis=1)
    # even rows compacted as the engine does: keys past the farthest relevant one left out
    cut = np.where(
        np.arange(b) % 2, np.uint32(0xFFFFFFFF), rows.max(axis=1, where=rows & 1 == 1, initial=0)
    )
    rows[rows > cut[:, None]] = 0xFFFFFFFE
    flat_at = np.flatnonzero(rows & 1)
    row, pos = np.divmod(flat_at, n)
    item = rows.ravel()[flat_at]
    lo = (item - rng.integers(1, 6, item.size).astype(np.uint32)) & np.uint32(0xFFFFFFFE)
    hi = item + rng.integers(0, 5, item.size).astype(np.uint32)
    near = deep._near_items(rows, (row, pos, flat_at), lo, hi, cut)
    want = []
    for i in range(item.size):
        other = rows[row[i]][(rows[row[i]] & 1) == 0]
        other = other[other <= cut[row[i]]]
        held = ((other <= hi[i]) & (other + 1 >= lo[i])).any()
        want.append(bool(held or hi[i] > cut[row[i]]))
    assert 0 < sum(want) < len(want)
    assert near.tolist() == want


def test_deep_engine_ranks_subnormal_and_signed_zero_keys():
    """Inner products of order 2**-140 (float32 subnormals, zeros of both signs, exact ties
    between relevant and non-relevant references) against the float64 brute force."""
    rng = np.random.default_rng(13)
    x = (rng.integers(-3, 4, size=(400, 4)) * 2.0**-70).astype(np.float32)
    y = rng.integers(0, 40, 400)
    task = _task(x, y, metrics=["map", "precision_at_1"], distance="inner_product")
    assert deep_applies(task)
    values, ties = _deep_engine(task, 64)
    ap, p1, tie = _float64_ranking_oracle(x, y, x, y, "inner_product", loo=True)
    assert tie.sum() > 50
    np.testing.assert_allclose(values["map"], ap, rtol=1e-12)
    np.testing.assert_array_equal(values["precision_at_1"], p1)
    np.testing.assert_array_equal(ties["map"], tie)


def test_relative_band_covers_every_pair_whose_float32_order_is_not_the_float64_one():
    """Keys rounded once to float32 from float64 values within ``e64`` of the fixed-order
    keys: wherever the float32 keys order two pairs against their fixed-order keys, the
    float32 keys lie within the band of the first (pairs straddling a rounding boundary, keys
    of every sign and size, subnormals included)."""
    rng = np.random.default_rng(8)
    n = 200_000
    size = 2.0 ** rng.integers(-140, 20, n) * rng.uniform(1, 2, n) * rng.choice([-1, 1], n)
    e64 = np.abs(size) * 2.0**-45 + 2.0**-160
    # Fixed-order keys F_a < F_b straddling a float32 boundary; the products err within e64.
    f_a = size
    f_b = size + rng.uniform(0, 2, n) * e64
    k_a = (f_a + rng.uniform(-1, 1, n) * e64).astype(np.float32)
    k_b = (f_b + rng.uniform(-1, 1, n) * e64).astype(np.float32)
    k_a[::2], k_b[::2] = np.nextafter(k_b[::2], np.float32(-np.inf)), k_b[::2]
    f_a[::2] = f_b[::2] + e64[::2]  # the float64 order reversed across adjacent floats
    reversed_ = (k_a < k_b) & (f_a > f_b)
    assert reversed_.sum() > n // 4
    gap = k_b[reversed_].astype(np.float64) - k_a[reversed_]
    band = deep.relative_band(k_a[reversed_], e64[reversed_])
    assert np.all(gap <= band)


@pytest.mark.parametrize("width", [0, 1, 2, 5, 8, 9, 64])
@pytest.mark.parametrize("right", [False, True])
def test_rows_searchsorted_is_searchsorted_row_by_row(width, right):
    # against numpy's own searchsorted, one row at a time: ties, -0.0 beside 0.0, +inf padding,
    # values below and above every entry; float32 keys and uint64 codes
    from embedeval.engine.candidates import rows_searchsorted, sortable_bits

    rng = np.random.default_rng(width)
    rows = np.sort(rng.integers(-2, 3, (6, width)).astype(np.float32), axis=1)
    if width:
        rows[0, : width // 2] = -0.0
        rows[1, -1] = np.inf
    at = rng.integers(0, 6, 50)
    values = rng.integers(-3, 4, 50).astype(np.float32)
    values[::7] = 0.0
    values[1::7] = -0.0
    side = "right" if right else "left"
    for table, v in ((rows, values), (sortable_bits(rows).astype(np.uint64), None)):
        v = table[at, rng.integers(0, max(width, 1), 50)] if v is None and width else v
        if v is None:
            continue
        want = [np.searchsorted(table[a], x, side) for a, x in zip(at, v, strict=True)]
        assert rows_searchsorted(table, at, v, right).tolist() == want


def _mirror_pairs(seed: int, n_q: int = 60, n_r: int = 400):
    """Queries (half of them) with equal coordinates 0 and 2; references in pairs that swap
    those coordinates under different labels, so for those queries each pair's keys are equal
    in exact arithmetic and their fixed-order float64 keys equal or one unit apart (the sums
    meet the columns in another order): only the float64 decision can rank such a pair."""
    rng = np.random.default_rng(seed)
    xq = rng.standard_normal((n_q, 8)).astype(np.float32)
    xq[::2, 2] = xq[::2, 0]  # the other queries tell each pair apart by far
    xr = rng.standard_normal((n_r, 8)).astype(np.float32)
    xr[1::2] = xr[0::2][:, [2, 1, 0, 3, 4, 5, 6, 7]]
    yq, yr = rng.integers(0, 4, n_q), rng.integers(0, 4, n_r)
    yr[1::2] = (yr[0::2] + 1) % 4
    return xq, yq, xr, yr


def _banded_rows_of_a_checked_run(monkeypatch, xq, yq, xr, yr, distance):
    """The query rows the deep engine sent to the bands, once its map, P@1 and tie flags are
    checked against the fixed-order float64 keys of every pair (stable sort by index)."""
    task = _task(xq, yq, xr, yr, metrics=["map", "precision_at_1"], distance=distance)
    banded = []
    real = deep.relevant_ranks
    monkeypatch.setattr(
        deep, "relevant_ranks", lambda *a, **k: banded.append(a[1].shape[0]) or real(*a, **k)
    )
    values, ties = _deep_engine(task)
    keys = np.array([oracle.fixed_order_keys(q, xr, distance) for q in xq])
    ap, p1, tie = _oracle_from_keys(keys, yq, yr, loo=False)
    np.testing.assert_allclose(values["map"], ap, rtol=1e-12)
    np.testing.assert_array_equal(values["precision_at_1"], p1)
    np.testing.assert_array_equal(ties["map"], tie)
    return sum(banded)


@pytest.mark.parametrize("distance", ["euclidean", "inner_product", "cosine"])
def test_flagged_float64_keys_leave_near_ties_to_the_float64_decision(monkeypatch, distance):
    xq, yq, xr, yr = _mirror_pairs(13)
    banded = _banded_rows_of_a_checked_run(monkeypatch, xq, yq, xr, yr, distance)
    assert 0 < banded < len(xq)  # the rows with such a pair, and only they, were banded


@pytest.mark.parametrize("seed", range(12))
def test_flagged_ranks_decide_the_rows_whose_keys_order_every_mixed_pair(seed):
    """Against a plain loop: keys within ``bound`` of the true keys (here the keys themselves
    plus noise), near-ties and exact ties between kinds planted in some rows."""
    rng = np.random.default_rng(seed)
    b, n, bound = 9, 50, 1e-9
    true = rng.standard_normal((b, n))
    true[::3, 1] = true[::3, 0] + 0.5 * bound  # near-tie between two references
    true[1::3, 3] = true[1::3, 2]  # exact tie
    keys = true + rng.uniform(-bound, bound, (b, n))
    excluded = rng.random((b, n)) < 0.1
    keys[excluded], true[excluded] = np.inf, np.inf
    relevant = (rng.random((b, n)) < 0.3) & ~excluded
    found, undecided = deep.flagged_ranks(keys.copy(), relevant, 8.0, bound)
    n_hits, ranks = found.n_hits, found.hit_pos
    got = iter(ranks.tolist())
    for i in range(b):
        order = sorted(range(n), key=lambda j: (true[i, j], j))
        rel = [bool(relevant[i, j]) for j in order]
        fin = [np.isfinite(keys[i, j]) for j in order]
        # the function's promise: a row holding two references of different kinds whose
        # keys lie within 2 bound is left undecided (farther apart, the keys order them)
        mixed_close = any(
            relevant[i, a] != relevant[i, c] and np.isfinite(keys[i, a]) and np.isfinite(keys[i, c])
            and abs(keys[i, a] - keys[i, c]) <= 2 * bound
            for a in range(n) for c in range(a + 1, n)
        )  # fmt: skip
        if mixed_close:
            assert undecided[i], i
        if undecided[i]:
            assert n_hits[i] == 0
            continue
        want = [p for p in range(n) if rel[p] and fin[p]]
        assert n_hits[i] == len(want)
        assert [next(got) for _ in want] == want


def test_flagged_ranks_leave_keys_a_flag_apart_undecided():
    # Keys one unit in the last place apart, exact (bound 0): the relevance flag in the lowest
    # bit moves the relevant key up and the other down, so their flagged values come out in the
    # other order; the row must be left to the float64 decision, not ranked from the sort.
    keys = np.array([[1.0, np.nextafter(1.0, 2.0)], [1.0, 1.5]])
    relevant = np.array([[True, False], [True, False]])
    found, undecided = deep.flagged_ranks(keys, relevant, 2.0, 0.0)
    n_hits, ranks = found.n_hits, found.hit_pos
    assert undecided.tolist() == [True, False]
    assert n_hits.tolist() == [0, 1] and ranks.tolist() == [0]


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_a_pair_of_identical_rows_under_other_labels_is_ranked_by_index_without_the_bands(
    monkeypatch, distance
):
    xq, yq, xr, yr = _mirror_pairs(17)
    xq[:, 2] = xq[:, 0] + 1.0  # no mirror ties: only the copies below tie across kinds
    xr[10], yr[10] = xr[3], (yr[3] + 1) % 4  # one identical pair under two labels
    # the queries of one of the pair's two labels hold a tie across kinds: the pair's keys
    # are equal, nothing else lies near them, so its indices rank it
    assert _banded_rows_of_a_checked_run(monkeypatch, xq, yq, xr, yr, distance) == 0


@pytest.mark.parametrize("distance", ["euclidean", "inner_product", "cosine"])
def test_many_groups_of_identical_rows_under_other_labels_are_ranked_by_index(
    monkeypatch, distance
):
    # Groups of two to five identical references with labels drawn at random (so a query's
    # row holds groups whose relevant members come before, between and after the others by
    # index), against the fixed-order float64 keys; with inner products half of the keys are
    # negative, where the relevance flag moves a key down instead of up.
    rng = np.random.default_rng(23)
    xq = rng.standard_normal((40, 6)).astype(np.float32)
    xr = rng.standard_normal((300, 6)).astype(np.float32)
    yq, yr = rng.integers(0, 3, 40), rng.integers(0, 3, 300)
    for members in np.split(rng.permutation(300)[:140], np.cumsum(rng.integers(2, 6, 40)))[:40]:
        xr[members] = xr[members[0]]
        yr[members] = rng.integers(0, 3, members.size)
    assert _banded_rows_of_a_checked_run(monkeypatch, xq, yq, xr, yr, distance) == 0


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("side", [-1, 1])
@pytest.mark.parametrize("far", [False, True])
def test_flagged_ranks_settle_a_group_only_when_no_other_key_is_near(sign, side, far):
    # Members 0 and 1 identical (key K), 0 relevant; reference 2 two units in the last place
    # (or far) below or above them, of the kind the relevance flags do not put next to the
    # other kind (so only the group's own check can see it): left to the bands when near.
    # A flag moves a positive key up and a negative one down.
    k = sign * 0.75
    x = k + side * (2.0**-45 if far else 2 * 2.0**-53)
    x_relevant = (side > 0) == (sign > 0)
    keys = np.array([[k, k, x, 5.0]])
    relevant = np.array([[True, False, x_relevant, False]])
    groups = (np.array([0, 1]), np.array([0]), np.array([2]))
    found, undecided = deep.flagged_ranks(keys.copy(), relevant, 8.0, 2.0**-50, groups)
    assert undecided.tolist() == [not far]
    if far:  # index 0 before index 1 in the tie; reference 2 before or after both
        group_at = 0 if side > 0 else 1
        want = sorted([group_at] + ([2 if side > 0 else 0] if x_relevant else []))
        assert found.hit_pos.tolist() == want
        run_row, first, last, first_mixed = found.blocks
        runs = (run_row.tolist(), first.tolist(), last.tolist())
        assert runs == ([0], [group_at], [group_at + 1])
        assert first_mixed.tolist() == [group_at]


def test_identical_rows_beside_a_near_tie_go_to_the_bands(monkeypatch):
    # A group of identical rows under two labels, and another reference whose inner product
    # with one query equals theirs (the coordinate it differs in is 0 in that query): the
    # group's run is no longer alone, so that row is banded.
    xq, yq, xr, yr = _mirror_pairs(19)
    xq[:, 2] = xq[:, 0] + 1.0
    xr[10], yr[10] = xr[3], (yr[3] + 1) % 4
    xr[11] = xr[3]
    xr[11, 7] = np.nextafter(xr[3, 7], np.float32(np.inf))
    xq[0, 7] = 0.0  # query 0 cannot tell reference 11 from the pair
    yq[0] = yr[3]
    assert _banded_rows_of_a_checked_run(monkeypatch, xq, yq, xr, yr, "inner_product") >= 1


def test_band_members_of_subnormal_bands_are_all_found():
    # A band a few subnormal steps wide (keys of a zero query, or of products below float32's
    # normal range) makes the bucket scale 1 / width overflow float32: every key in the band
    # must still be returned, each once, checked against the band itself.
    keys = np.zeros((2, 6), dtype=np.float32)
    keys[1] = [0.0, 1.0, -1.0, 0.0, 2e-45, 1e-44]
    relevant = np.array([[1, 0, 1, 0, 0, 1], [1, 0, 0, 1, 1, 1]], dtype=bool)
    lo, hi = np.float32([-4e-45, -4e-45]), np.float32([6e-45, 6e-45])
    r, c, _, rel = deep._band_members(keys, relevant, np.array([0, 1]), lo, hi)
    want = [(i, j) for i in range(2) for j in range(6) if lo[i] <= keys[i, j] <= hi[i]]
    assert sorted(zip(r.tolist(), c.tolist(), strict=True)) == want
    np.testing.assert_array_equal(rel, relevant[r, c])
