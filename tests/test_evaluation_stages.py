"""The core stages of evaluate: data (exclusions, R_q, n_valid), plan, summarise."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import embedeval as ee
from embedeval.evaluation.settings import EvaluationInputs, validate_arguments
from embedeval.evaluation.stages import exclusion_counts, plan_search, prepare_data
from embedeval.metrics.averages import aggregate


def _brute_counts(qy, ry, qg, rg, self_index):
    """R_q and n_valid by a plain double loop over (query, reference) pairs."""
    relevant, n_valid = [], []
    for i in range(len(qy)):
        r = v = 0
        for j in range(len(ry)):
            if self_index and i == j:
                continue
            if qg is not None and qg[i] == rg[j]:
                continue
            v += 1
            r += qy[i] == ry[j]
        relevant.append(r)
        n_valid.append(v)
    return relevant, n_valid


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("case", ["loo", "split", "ric"])
@pytest.mark.parametrize("grouped", [False, True])
def test_exclusion_counts_match_a_pairwise_loop(seed, case, grouped):
    rng = np.random.default_rng(seed)
    n_q, n_r = 9, 9 if case == "loo" else 14
    qy = rng.integers(0, 3, n_q)
    ry = qy if case == "loo" else np.concatenate([qy, rng.integers(0, 3, n_r - n_q)])
    if case == "split":
        ry = rng.integers(0, 3, n_r)
    qg = rng.integers(0, 3, n_q) if grouped else None
    rg = None
    if grouped:
        rg = qg if case == "loo" else rng.integers(0, 3, n_r)  # own group may differ (ric)
    self_index = case != "split"
    _, relevant, n_valid = exclusion_counts(
        qy, ry, self_index, case == "loo", qg, None if case == "loo" else rg
    )
    want_r, want_v = _brute_counts(qy, ry, qg, rg, self_index)
    assert relevant.tolist() == want_r
    assert n_valid.tolist() == want_v


def test_aggregate_micro_and_macro_by_hand():
    values = np.array([1.0, 0.5, 0.0, np.nan, 1.0])
    codes = np.array([0, 0, 1, 1, 2])
    uniques = np.array(["a", "b", "c"])
    # micro: (1 + 0.5 + 0 + 1) / 4 = 0.625; macro: (0.75 + 0 + 1) / 3
    assert aggregate(values, codes, uniques, "micro")[0] == 0.625
    value, per_class = aggregate(values, codes, uniques, "macro")
    assert value == pytest.approx(1.75 / 3)
    assert per_class == {"a": 0.75, "b": 0.0, "c": 1.0}
    assert np.isnan(aggregate(np.full(2, np.nan), codes[:2], uniques, "micro")[0])


def test_plan_resolves_max_bin_count_and_the_default_metrics():
    x = np.arange(10, dtype=np.float32)[:, None]
    y = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2, 3])  # largest R_q: 4 - 1 = 3
    settings = validate_arguments(EvaluationInputs(x, y), k="max_bin_count")
    plan = plan_search(settings, prepare_data(settings, EvaluationInputs(x, y)))
    assert plan.k_used == 3
    assert [m.name for m in plan.infos] == [
        "precision_at_1",
        "r_precision",
        "map_at_r",
        "recall_at_3",
    ]
    assert plan.task.k == 3


def test_data_stage_keeps_the_labels_and_counts_lone_queries():
    x = np.arange(5, dtype=np.float32)[:, None]
    inputs = EvaluationInputs(x, ["a", "b", "a", "c", "b"])
    data = prepare_data(validate_arguments(inputs), inputs)
    assert data.query_labels.tolist() == ["a", "b", "a", "c", "b"]
    assert data.relevant.tolist() == [1, 1, 1, 0, 1]
    assert data.n_valid.tolist() == [4, 4, 4, 4, 4]
    assert data.query is data.reference


def test_warnings_point_at_the_caller_of_evaluate():
    x = np.arange(6, dtype=np.float32)[:, None]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ee.evaluate(x, [0, 0, 0, 1, 1, 1], k=1, metrics=["map_at_r"])  # k below R_q = 2
        ee.evaluate(x, [0, 1, 2, 3, 4, 5])  # every query lone
    assert len(caught) == 2
    assert {w.filename for w in caught} == {__file__}


def test_aggregate_keys_are_python_scalars_for_object_labels():
    uniques = np.empty(2, dtype=object)
    uniques[:] = [np.int64(7), "a"]
    value, per_class = aggregate(np.array([1.0, 0.0]), np.array([0, 1]), uniques, "macro")
    assert value == 0.5 and per_class == {7: 1.0, "a": 0.0}
    assert [type(k) for k in per_class] == [int, str]
