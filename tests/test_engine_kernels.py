"""The metric kernels one by one: hand-computed cases.

Every registry metric also goes through tests/test_common.py (range, direction, invariances,
the brute-force oracle, tie flags); this file holds what is specific to one kernel.
"""

from __future__ import annotations

import numpy as np

import embedeval as ee
from embedeval.engine import kernels as _kernels
from embedeval.engine.candidates import Candidates, sortable_bits
from embedeval.engine.registry import METRICS


def test_minp_flags_a_last_relevant_item_that_ties_across_the_cap():
    # Query at 0; references at distances 1 (relevant), 2 (not), 3 (not) and 3 (relevant):
    # ranked [1, 0, (0, 1)] with the last two tied.  With k = 3 the last relevant item is at
    # rank 4, past the cap: mINP = 0.  The other order of the tie puts it at rank 3: 2/3.
    q, ql = [[0.0]], [0]
    r, rl = [[-1.0], [2.0], [3.0], [-3.0]], [0, 1, 1, 0]
    res = ee.evaluate(q, ql, r, rl, metrics=["minp"], k=3)
    assert res["minp"] == 0.0
    assert res.n_ties["minp"] == 1


def test_minp_does_not_flag_a_tie_at_the_cap_too_full_of_relevant_items():
    # Ranked [1, (0, 1, 1)], the last three tied; with k = 2 one slot of the tie is inside the
    # cap, and two relevant items are in the tie: every order leaves one past the cap (0).
    q, ql = [[0.0]], [0]
    r, rl = [[-1.0], [2.0], [-2.0], [-2.0]], [0, 1, 0, 0]
    res = ee.evaluate(q, ql, r, rl, metrics=["minp"], k=2)
    assert res["minp"] == 0.0
    assert res.n_ties["minp"] == 0


def test_chunk_metrics_skips_cluster_metrics_and_gives_lone_queries_nan_without_a_tie():
    # Row 0 ranks [relevant, not]; row 1 is a lone query (R_q = 0) whose two references tie.
    lims = np.array([0, 2, 4])
    bits = sortable_bits(np.array([0.0, 1.0, 2.0, 2.0], dtype=np.float32))
    block = Candidates(np.arange(2), lims, np.array([0, 1, 0, 1]), bits)
    metrics = [METRICS["precision_at_1"], METRICS["nmi"]]
    values, ties = _kernels.chunk_metrics(
        block, np.array([0, 2]), np.array([0, 1]), np.array([1, 0]), np.array([2, 2]), metrics, None
    )
    assert list(values) == ["precision_at_1"]
    np.testing.assert_array_equal(values["precision_at_1"], [1.0, np.nan])
    assert ties["precision_at_1"].tolist() == [False, False]


def test_ranked_example_counts_the_relevant_items_it_lists():
    hits = _kernels.ranked_example([[0, 1, 0, 1], [0, 0]], n_relevant=[3, 0])
    # Row 0: hits at ranks 2 and 4, P@2 = 1/2 and P@4 = 2/4 summed over a window of 4.
    assert hits.hit_pos.tolist() == [1, 3]
    assert hits.precision_sums(np.array([4, 2])).tolist() == [1 / 2 + 2 / 4, 0.0]
    assert hits.last_hit_rank().tolist() == [4, 0]
