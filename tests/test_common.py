"""Checks every metric of the registry passes, driven by ``embedeval.engine.registry.METRICS``.

Each retrieval metric (and the custom-metric machinery, through three user metrics) is run
through the same checks: its registry entry is complete, its values lie in ``value_range`` and
equal a brute-force oracle on data full of ties and duplicates, a perfect embedding scores the
best end of the range and a reversed one the worst (``higher_is_better``), values are invariant
under query permutation, class relabelling and power-of-two scaling, a duplicated reference does
what the tie rule says, bad parameters raise an ``InputError`` naming the argument, and PML's
names resolve.  Expected values come from ``tests/oracle.py`` (a Python loop per query over a
full float64 sort) or are written out by hand.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import embedeval as ee
from embedeval.engine import kernels as _kernels
from embedeval.engine import torch_kernels as _torch_kernels
from embedeval.engine.custom import custom_infos
from embedeval.engine.registry import METRICS, PML_ALIASES, parse_metrics
from embedeval.utils.errors import InputError, InputTypeError

from . import oracle

# An int k below R_q warns that R-precision / MAP@R are PML's truncated variants; intended here.
pytestmark = pytest.mark.filterwarnings("ignore:k=.*truncated at depth k")

DISTANCES = ("euclidean", "cosine", "inner_product")
RETRIEVAL = sorted(name for name, m in METRICS.items() if m.kind == "knn")
CLUSTER = sorted(name for name, m in METRICS.items() if m.kind == "cluster")


def _hits_over_r(relevant, n_relevant):
    return relevant.sum(axis=1) / n_relevant


def _average_precision(relevant, n_relevant):
    ranks = np.arange(1, relevant.shape[1] + 1)
    return (relevant * np.cumsum(relevant, axis=1) / ranks).sum(axis=1) / n_relevant


def _misses_in_3(relevant, n_relevant):
    return 3.0 - relevant.sum(axis=1)


#: User metrics covering the three depths, with their definitions on one ranking (a Python
#: list of 0/1, nearest first) for the oracle.
CUSTOM = {
    "custom_hits_over_r": ee.RetrievalMetric(_hits_over_r, depth="R", value_range=(0, 1)),
    "custom_ap": ee.RetrievalMetric(_average_precision, depth="all", value_range=(0.0, 1.0)),
    "custom_misses_in_3": ee.RetrievalMetric(
        _misses_in_3, depth=3, higher_is_better=False, value_range=(0, 3)
    ),
}
CUSTOM_INFOS = {m.name: m for m in custom_infos(CUSTOM, lambda name: False)}
ALL = RETRIEVAL + sorted(CUSTOM)


def info(name):
    return CUSTOM_INFOS[name] if name in CUSTOM else METRICS[name]


def definition(name, rel, k):
    """One query's value of ``name`` from its full ranking ``rel`` (the oracle's side)."""
    n_rel = sum(rel)
    if n_rel == 0:
        return math.nan
    cap = len(rel) if k is None else min(k, len(rel))
    if name == "minp":  # R_q / rank of the last relevant item, 0 when the cap hides it
        last = max(i + 1 for i, v in enumerate(rel) if v)
        return n_rel / last if last <= cap else 0.0
    if name == "custom_hits_over_r":
        window = n_rel if k is None else min(n_rel, k)
        return sum(rel[:window]) / n_rel
    if name == "custom_ap":
        return oracle.metric_value("map", rel, k)
    if name == "custom_misses_in_3":
        return 3.0 - sum(rel[:3])
    return oracle.metric_value(name, rel, k)


def expected(name, q, ql, r=None, rl=None, *, k=None, distance="euclidean"):
    ranks = oracle.rankings(q, ql, r, rl, distance=distance)
    return np.array([definition(name, rel, k) for rel, _ in ranks])


def run(name, q, ql, r=None, rl=None, **kw):
    """embedeval's result for one metric (built-in or custom)."""
    if name in CUSTOM:
        return ee.evaluate(q, ql, r, rl, metrics=[], custom_metrics={name: CUSTOM[name]}, **kw)
    return ee.evaluate(q, ql, r, rl, metrics=[name], **kw)


def tied_data(seed, n=48, dim=3, n_classes=4):
    """Small-integer vectors (27 distinct ones for 48 rows: exact ties and duplicates in every
    distance, computed exactly in float32 and float64) and a class with one member (NaN)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(1, 4, (n, dim)).astype(np.float32)
    x[5] = x[4]
    y = rng.integers(0, n_classes, n)
    y[-1] = n_classes
    return x, y


def float_data(seed, n_query=30, n_ref=50, dim=4, n_classes=4):
    """Random float vectors (no exact ties), split into queries and references."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(n_query, dim)).astype(np.float32)
    r = rng.normal(size=(n_ref, dim)).astype(np.float32)
    return q, rng.integers(0, n_classes, n_query), r, rng.integers(0, n_classes, n_ref)


def depth_cap(name):
    """An int k the metric accepts (a fixed cut-off needs k >= its cut-off)."""
    cutoff = info(name).cutoff or 0
    return max(cutoff, 4)


# ---------------------------------------------------------------------------- the registry


@pytest.mark.parametrize("name", sorted(METRICS))
def test_registry_entry_is_complete(name):
    m = METRICS[name]
    assert m.name == name
    assert m.kind in ("knn", "cluster")
    assert isinstance(m.higher_is_better, bool)
    low, high = m.value_range
    assert low < high
    assert m.description
    if m.kind == "knn":
        kernel = _kernels.KERNELS[m.kernel]
        assert "Tie" in kernel.__doc__ and ">>>" in kernel.__doc__
        assert ">>>" in _torch_kernels.KERNELS[m.kernel].__doc__
        assert m.depth in ("one", "r", "full", "first_hit", "fixed")
        assert (m.cutoff is not None) == (m.depth in ("one", "fixed"))
    else:
        assert m.kernel is None


def test_every_kernel_is_used_by_a_metric():
    used = {m.kernel for m in METRICS.values()} | {m.kernel for m in CUSTOM_INFOS.values()}
    assert set(_kernels.KERNELS) <= used
    assert set(_torch_kernels.KERNELS) <= used


@pytest.mark.parametrize("name", ALL)
def test_custom_and_builtin_entries_share_the_shape(name):
    m = info(name)
    assert m.kind == "knn" and m.kernel in _kernels.KERNELS
    assert _torch_kernels.DeviceKernels.supports(m) == (name not in CUSTOM)


# ------------------------------------------------------------------- range and the oracle


@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize("name", ALL)
def test_values_lie_in_the_value_range_with_ties_and_duplicates(name, distance):
    x, y = tied_data(1)
    low, high = info(name).value_range
    for k in (None, depth_cap(name)):
        res = run(name, x, y, k=k, distance=distance)
        values = res.per_query[name]
        assert np.isnan(values[-1])  # the lone query
        live = values[~np.isnan(values)]
        assert live.size == values.size - 1
        assert ((live >= low) & (live <= high)).all()
        assert low <= res[name] <= high


@pytest.mark.parametrize("name", RETRIEVAL)
def test_a_saved_result_with_a_value_outside_the_range_is_refused(name):
    x, y = tied_data(17)
    data = run(name, x, y).to_dict()
    assert ee.EvaluationResult.from_dict(data).per_query[name].size == len(y)
    low, high = METRICS[name].value_range
    for bad in (high + 0.5, low - 0.5):
        data["per_query"][name][0] = bad
        with pytest.raises(InputError, match=rf"per_query.*{name}.*{bad}"):
            ee.EvaluationResult.from_dict(data)


@pytest.mark.parametrize("name", CLUSTER)
def test_cluster_metrics_lie_in_the_value_range(name):
    x, y = tied_data(2)
    low, high = METRICS[name].value_range
    assert low <= run(name, x, y)[name] <= high


@pytest.mark.parametrize("distance", ["euclidean", "inner_product"])
@pytest.mark.parametrize("name", ALL)
def test_values_equal_the_oracle_with_ties_and_duplicates(name, distance):
    # Small integers: every key is exact in float32 and float64, so both sides see the same
    # ties and break them by reference index.
    x, y = tied_data(3)
    for k in (None, depth_cap(name)):
        got = run(name, x, y, k=k, distance=distance).per_query[name]
        want = expected(name, x, y, k=k, distance=distance)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0, equal_nan=True)


@pytest.mark.parametrize("name", ALL)
def test_values_equal_the_oracle_under_cosine(name):
    q, ql, r, rl = float_data(4)
    for k in (None, depth_cap(name)):
        got = run(name, q, ql, r, rl, k=k, distance="cosine").per_query[name]
        want = expected(name, q, ql, r, rl, k=k, distance="cosine")
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0, equal_nan=True)


# ----------------------------------------------------------------------------- direction


def opposed(reverse, n_query=4, n_ref=120):
    """Queries of class 0 at -1 and of class 1 at +1; the references of a class at distance
    10 to 11.19 on their queries' side (perfect) or on the other side (reversed), so every
    relevant reference comes before every other one, or after."""
    q = np.r_[np.full(n_query, -1.0), np.full(n_query, 1.0)][:, None]
    ql = np.repeat([0, 1], n_query)
    far = 10.0 + np.arange(n_ref) / 100.0
    side = 1.0 if reverse else -1.0
    r = np.r_[side * far, -side * far][:, None]
    return q, ql, r, np.repeat([0, 1], n_ref)


def best_and_worst(m):
    low, high = m.value_range
    return (high, low) if m.higher_is_better else (low, high)


@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize("name", RETRIEVAL + CLUSTER)
def test_a_perfect_embedding_scores_the_best_end(name, distance):
    best, _ = best_and_worst(METRICS[name])
    for k in (None, 120):
        res = run(name, *opposed(reverse=False), k=k, distance=distance)
        assert res[name] == best
        if name in res.per_query:
            assert (res.per_query[name] == best).all()


@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize("name", RETRIEVAL)
def test_a_reversed_embedding_scores_the_worst_end(name, distance):
    best, worst = best_and_worst(METRICS[name])
    # k = 120, the number of other-class references: every relevant one lies past the cap.
    res = run(name, *opposed(reverse=True), k=120, distance=distance)
    assert (res.per_query[name] == worst).all()
    # Without the cap, MAP, MRR and mINP still see the relevant references at ranks 121-240.
    uncapped = run(name, *opposed(reverse=True), distance=distance).per_query[name]
    if METRICS[name].depth in ("full", "first_hit"):
        assert ((uncapped != worst) & (uncapped != best)).all()
    else:
        assert (uncapped == worst).all()


@pytest.mark.parametrize("name", sorted(CUSTOM))
def test_custom_metrics_follow_their_declared_direction(name):
    perfect = run(name, *opposed(reverse=False), k=120)[name]
    reversed_ = run(name, *opposed(reverse=True), k=120)[name]
    better = perfect > reversed_ if CUSTOM[name].higher_is_better else perfect < reversed_
    assert better


@pytest.mark.parametrize("name", ALL + CLUSTER)
def test_the_evaluator_reads_the_direction_from_the_registry(name):
    if name in CUSTOM:
        ev = ee.Evaluator(metrics=[], custom_metrics={name: CUSTOM[name]})
    else:
        ev = ee.Evaluator(metrics=[name])
    assert ev.higher_is_better == info(name).higher_is_better
    assert ev.mode == ("max" if info(name).higher_is_better else "min")


# ---------------------------------------------------------------------------- invariances


@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize("name", ALL)
def test_permuting_queries_permutes_their_values(name, distance):
    x, y = tied_data(5)
    q, ql, r, rl = x[:20], y[:20], x[20:], y[20:]
    perm = np.random.default_rng(0).permutation(20)
    base = run(name, q, ql, r, rl, distance=distance)
    moved = run(name, q[perm], ql[perm], r, rl, distance=distance)
    np.testing.assert_array_equal(moved.per_query[name], base.per_query[name][perm])
    assert moved.n_ties[name] == base.n_ties[name]


@pytest.mark.parametrize("name", ALL + CLUSTER)
def test_relabelling_classes_changes_nothing(name):
    x, y = tied_data(6)
    names = np.array(["kiwi", "fig", "apple", "date", "plum"])  # a bijection, order changed
    base = run(name, x, y)
    renamed = run(name, x, names[y])
    if name in CLUSTER:  # the same clusters; the mutual information adds classes in label order
        assert renamed[name] == pytest.approx(base[name], rel=1e-12, abs=0)
    else:
        assert renamed[name] == base[name]
    if name in base.per_query:
        np.testing.assert_array_equal(renamed.per_query[name], base.per_query[name])
        assert renamed.n_ties[name] == base.n_ties[name]


@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize("name", ALL)
def test_scaling_by_a_power_of_two_changes_nothing(name, distance):
    q, ql, r, rl = float_data(7)
    q[3], r[8] = r[7], r[7]  # a query equal to a reference, and a duplicated reference
    base = run(name, q, ql, r, rl, distance=distance)
    for exponent in (-20, -3, 5, 40):
        scale = np.float32(2.0**exponent)
        got = run(name, q * scale, ql, r * scale, rl, distance=distance)
        np.testing.assert_array_equal(got.per_query[name], base.per_query[name])
        assert got.n_ties[name] == base.n_ties[name]


@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize("name", ALL)
def test_a_duplicated_reference_ranks_each_copy_after_its_original(name, distance):
    # The tie rule orders equal keys by ascending reference index, so with the reference
    # stacked twice every item is followed by its copy: the oracle's ranking of the stacked
    # reference.  Copies share a label, so no tie mixes relevant and non-relevant items.
    q, ql, r, rl = float_data(8)
    r2, rl2 = np.r_[r, r], np.r_[rl, rl]
    res = run(name, q, ql, r2, rl2, distance=distance)
    want = expected(name, q, ql, r2, rl2, distance=distance)
    np.testing.assert_allclose(res.per_query[name], want, rtol=1e-12, atol=0, equal_nan=True)
    assert res.n_ties[name] == 0
    if name in ("precision_at_1", "r_precision"):
        # Doubled ranking a a b b ...: the first item, and 2h hits among the first 2 R_q.
        single = run(name, q, ql, r, rl, distance=distance).per_query[name]
        np.testing.assert_array_equal(res.per_query[name], single)


def value_can_change(name, rel, dist, k):
    """Whether reordering the items of one block of equal distances changes the value (the
    meaning of a tie flag), by trying every arrangement of every mixed block."""
    base = definition(name, rel, k)
    start = 0
    while start < len(rel):
        stop = start + 1
        while stop < len(rel) and dist[stop] == dist[start]:
            stop += 1
        size, n_rel = stop - start, sum(rel[start:stop])
        for where in itertools.combinations(range(size), n_rel) if 0 < n_rel < size else ():
            block = [1 if i in where else 0 for i in range(size)]
            if abs(definition(name, rel[:start] + block + rel[stop:], k) - base) > 1e-12:
                return True
        start = stop
    return False


@pytest.mark.parametrize("distance", ["euclidean", "inner_product"])
@pytest.mark.parametrize("name", RETRIEVAL)
def test_tie_flags_mark_the_queries_whose_value_depends_on_the_tie_order(name, distance):
    dense = tied_data(15, n=40)  # most queries flagged
    rng = np.random.default_rng(16)  # 10 classes, 5**3 possible vectors: fewer ties, small R_q
    sparse = rng.integers(1, 6, (60, 3)).astype(np.float32), rng.integers(0, 10, 60)
    for x, y in (dense, sparse):
        ranks = oracle.rankings(x, y, distance=distance)
        for k in {None, depth_cap(name), max(12, depth_cap(name))}:
            res = run(name, x, y, k=k, distance=distance)
            want = [value_can_change(name, rel, dist, k) for rel, dist in ranks]
            assert res.n_ties[name] == sum(want), k


def test_a_tie_mixing_labels_is_flagged_and_broken_by_reference_index():
    # One query at 0; references 0 (label 1) and 1 (label 0) both at distance 1, then
    # reference 2 (label 0) at distance 2.  Ranked: [non-relevant, relevant, relevant] with
    # ranks 1 and 2 tied.  By hand: P@1 = 0, R-precision = 1/2 (R_q = 2), MAP@R = (1/2)/2,
    # MAP = (1/2 + 2/3)/2, MRR = 1/2, mINP = 2/3, Recall@1 = 0, P@5 = 2/5.
    q, ql = [[0.0]], [0]
    r, rl = [[1.0], [-1.0], [2.0]], [1, 0, 0]
    want = {
        "precision_at_1": 0.0,
        "r_precision": 1 / 2,
        "map_at_r": (1 / 2) / 2,
        "map": (1 / 2 + 2 / 3) / 2,
        "mrr": 1 / 2,
        "minp": 2 / 3,
        "recall_at_1": 0.0,
        "precision_at_5": 2 / 5,
    }
    res = ee.evaluate(q, ql, r, rl, metrics=list(want))
    for name, value in want.items():
        assert res[name] == pytest.approx(value, rel=1e-15), name
    # The tie straddles every cut-off at rank 1 and lies inside every rank-weighted window;
    # P@5 (all three items inside) and R-precision (cut at rank 2, after the tie) see none.
    # mINP's last relevant item (rank 3) is not in the tie.
    flagged = {name for name, n in res.n_ties.items() if n}
    assert flagged == {"precision_at_1", "map_at_r", "map", "mrr", "recall_at_1"}


# ------------------------------------------------------------------------- bad parameters


@pytest.mark.parametrize("name", RETRIEVAL + CLUSTER)
def test_a_misspelt_metric_names_metrics_and_suggests_the_name(name):
    x, y = tied_data(9)
    with pytest.raises(InputError, match="metrics") as err:
        ee.evaluate(x, y, metrics=[name + "x"])
    assert repr(name + "x") in str(err.value)
    if not name[-1].isdigit():  # "recall_at_10x" suggests some recall_at_<k>
        assert repr(name) in str(err.value)


@pytest.mark.parametrize("bad", ["recall_at_0", "precision_at_0", "recall_at_-1", "recall_at_"])
def test_a_bad_cut_off_names_metrics(bad):
    with pytest.raises(InputError, match="metrics"):
        parse_metrics([bad])


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("k", [0, -3, 2.5, "deep", True])
def test_a_bad_k_names_k(name, k):
    x, y = tied_data(10)
    with pytest.raises((InputError, InputTypeError), match=r"\bk\b"):
        run(name, x, y, k=k)


@pytest.mark.parametrize("name", [n for n in RETRIEVAL if (METRICS[n].cutoff or 0) > 1])
def test_a_k_below_a_fixed_cut_off_names_k_and_the_metric(name):
    x, y = tied_data(11)
    cutoff = METRICS[name].cutoff
    with pytest.raises(InputError, match=rf"k={cutoff - 1}\b.*{name}"):
        run(name, x, y, k=cutoff - 1)


@pytest.mark.parametrize("name", sorted(METRICS) + sorted(PML_ALIASES))
def test_a_custom_metric_cannot_take_a_builtin_name(name):
    x, y = tied_data(12)
    with pytest.raises(InputError, match=repr(name)):
        ee.evaluate(x, y, custom_metrics={name: CUSTOM["custom_ap"]})


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"depth": 0}, "depth"),
        ({"depth": "r"}, "depth"),
        ({"depth": True}, "depth"),
        ({"value_range": (1.0, 0.0)}, "value_range"),
        ({"value_range": (0.0,)}, "value_range"),
        ({"value_range": "0-1"}, "value_range"),
    ],
)
def test_bad_custom_metric_parameters_name_the_argument(kwargs, argument):
    with pytest.raises(InputError, match=argument):
        ee.RetrievalMetric(_hits_over_r, **kwargs)


def test_a_custom_value_outside_its_range_names_the_metric():
    x, y = tied_data(13)
    too_big = ee.RetrievalMetric(lambda rel, n: rel.sum(axis=1) + 0.5, value_range=(0, 1))
    with pytest.raises(InputError, match="'too_big'.*value_range"):
        ee.evaluate(x, y, metrics=[], custom_metrics={"too_big": too_big})


# ---------------------------------------------------------------------------- PML's names


@pytest.mark.parametrize(("alias", "canonical"), sorted(PML_ALIASES.items()))
def test_pml_aliases_resolve_to_the_canonical_metric(alias, canonical):
    assert [m.name for m in parse_metrics([alias])] == [canonical]
    assert METRICS[canonical].pml_name == alias
    x, y = tied_data(14)
    by_alias = ee.evaluate(x, y, metrics=[alias])
    assert by_alias.keys() == [canonical]
    assert by_alias[canonical] == ee.evaluate(x, y, metrics=[canonical])[canonical]


@pytest.mark.parametrize("name", [n for n in sorted(METRICS) if METRICS[n].pml_name])
def test_every_pml_name_of_the_registry_is_accepted(name):
    assert [m.name for m in parse_metrics([METRICS[name].pml_name])] == [name]
