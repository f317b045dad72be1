"""The oracle in tests/oracle.py checked against fractions computed by hand."""

import math
from fractions import Fraction as F

import pytest

from tests import oracle

# 1-D points 0, 1, 3, 6 with labels a, a, b, a; leave-one-out, Euclidean.
# q0: neighbours 1(a) 2(b) 3(a) -> rel 1 0 1;  q1: 0(a) 2(b) 3(a) -> 1 0 1
# q2: the only b -> lone;                       q3: 2(b) 1(a) 0(a) -> 0 1 1
X = [[0.0], [1.0], [3.0], [6.0]]
Y = ["a", "a", "b", "a"]
METRICS = ["precision_at_1", "r_precision", "map_at_r", "map", "mrr", "recall_at_2"]


def test_hand_case_exact_depth():
    m, pq, pc = oracle.evaluate(X, Y, metrics=METRICS)
    assert m["precision_at_1"] == pytest.approx(float(F(2, 3)))
    assert m["r_precision"] == pytest.approx(0.5)
    # map_at_r: q0 = q1 = 1/2, q3 = (0 + 1/2)/2 = 1/4
    assert m["map_at_r"] == pytest.approx(float(F(5, 12)))
    # map: q0 = q1 = (1 + 2/3)/2 = 5/6, q3 = (1/2 + 2/3)/2 = 7/12
    assert m["map"] == pytest.approx(float(F(3, 4)))
    assert m["mrr"] == pytest.approx(float(F(5, 6)))
    assert m["recall_at_2"] == 1.0
    assert math.isnan(pq["map"][2])
    assert pc["map"] == {"a": pytest.approx(0.75)}


def test_hand_case_int_k_one():
    m, _, _ = oracle.evaluate(X, Y, metrics=METRICS, k=1)
    assert m["r_precision"] == pytest.approx(float(F(2, 3)))  # window min(R, 1) = 1
    assert m["map_at_r"] == pytest.approx(float(F(1, 3)))  # divisor stays R = 2
    assert m["mrr"] == pytest.approx(float(F(2, 3)))  # q3's first hit is at rank 2 > k


def test_hand_case_macro_and_ties():
    # Split: references at 1 (label 0), 1 (label 1), 2 (label 0); query at 0 with label 1.
    # Tie at distance 1 broken by index: ref0 (irrelevant) before ref1 (relevant).
    _m, pq, _ = oracle.evaluate(
        [[0.0]], [1], [[1.0], [1.0], [2.0]], [0, 1, 0], metrics=["precision_at_1", "mrr"]
    )
    assert pq["precision_at_1"] == [0.0]
    assert pq["mrr"] == [0.5]
    rel, dist = oracle.rankings([[0.0]], [1], [[1.0], [1.0], [2.0]], [0, 1, 0])[0]
    assert oracle.tie_straddles(rel, dist, 1)
    assert not oracle.tie_straddles(rel, dist, 2)
    # macro: class means 1 and 0 with 3 and 1 queries -> 1/2, micro 3/4
    Xs, Ys = [[0.0], [0.1], [0.2], [5.0], [5.1]], [0, 0, 0, 1, 2]
    mi, _, _ = oracle.evaluate(Xs, Ys, metrics=["precision_at_1"])
    ma, _, _ = oracle.evaluate(Xs, Ys, metrics=["precision_at_1"], average="macro")
    # class 1 and 2 are lone (one member each)
    assert mi["precision_at_1"] == 1.0 and ma["precision_at_1"] == 1.0
    Xs, Ys = [[0.0], [0.1], [0.3], [5.0], [0.2]], [0, 0, 0, 1, 1]
    mi, pq, _ = oracle.evaluate(Xs, Ys, metrics=["precision_at_1"])
    ma, _, _ = oracle.evaluate(Xs, Ys, metrics=["precision_at_1"], average="macro")
    # q0->0.1(0) 1; q1->0.0/0.2 tie? no: |0.1-0|=.1,|0.1-.2|=.1 tie -> index 0 (label 0) 1;
    # q2->0.2(1) 0; q3->0.3(0) 0; q4->0.1|0.3 tie -> index 1 (label 0) 0
    assert pq["precision_at_1"] == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert mi["precision_at_1"] == pytest.approx(0.4)
    assert ma["precision_at_1"] == pytest.approx((F(2, 3) + 0) / 2)


def test_groups_and_ref_includes_query():
    # query rows are the first reference rows; group exclusion removes same-group references
    Q, QL = [[0.0], [1.0]], ["a", "a"]
    Rf, RL = [*Q, [0.5], [2.0]], [*QL, "a", "b"]
    _, pq, _ = oracle.evaluate(Q, QL, Rf, RL, metrics=["map"], ref_includes_query=True)
    # q0: 0.5(a) 1.0(a) 2.0(b) -> 1; q1: 0.5(a) 0.0(a) 2.0(b) -> 1
    assert pq["map"] == [1.0, 1.0]
    _, pq, _ = oracle.evaluate(
        Q, QL, Rf, RL, metrics=["map"], ref_includes_query=True, qg=[1, 2], rg=[1, 2, 1, 9]
    )
    # q0 (group 1) loses ref2: ranking 1.0(a) 2.0(b) -> 1;
    # q1 (group 2) keeps ref2 (group 1): 0.5(a) 0.0(a) 2.0(b) -> 1
    assert pq["map"] == [1.0, 1.0]
    _, pq, _ = oracle.evaluate(
        Q, QL, Rf, RL, metrics=["map", "mrr"], qg=[1, 2], rg=[2, 1, 1, 1], ref_includes_query=True
    )
    # q0 (group 1): refs 1, 2, 3 are group 1 -> removed; ref0 is itself -> lone
    assert math.isnan(pq["map"][0])
    # q1 (group 2): ref0 is group 2 -> removed; ref1 self; refs 0.5(a), 2.0(b) -> 1
    assert pq["map"][1] == 1.0


def test_summary_per_query_on_five_points():
    # 1-D points 0, 1, 2, 10, 11 with labels a b a b b, leave-one-out:
    # q0: 1b 2a 10b 11b -> map 1/2;  q1: 0a 2a (tie, by index) 10b 11b -> map (1/3 + 2/4)/2
    # q2: 1b 0a 10b 11b -> map 1/2;  q3: 11b 2a 1b 0a -> map (1 + 2/3)/2;  q4 like q3
    x5, y5 = [[0.0], [1.0], [2.0], [10.0], [11.0]], ["a", "b", "a", "b", "b"]
    _, pq = oracle.summary(x5, y5, metrics=["map", "mrr"])
    assert pq["map"].tolist() == pytest.approx([1 / 2, 5 / 12, 1 / 2, 5 / 6, 5 / 6])
    assert pq["mrr"].tolist() == pytest.approx([1 / 2, 1 / 3, 1 / 2, 1, 1])


def test_summary_micro_and_macro_by_hand():
    # Same four points as the first cases: per-query precision_at_1 is 1, 1, lone, 0.
    micro, pq = oracle.summary(X, Y, metrics=["precision_at_1"])
    macro, _ = oracle.summary(X, Y, metrics=["precision_at_1"], average="macro")
    assert math.isnan(pq["precision_at_1"][2])
    assert micro["precision_at_1"] == pytest.approx(float(F(2, 3)))
    # class a holds the three live queries (b's only query is lone): macro = 2/3 as well
    assert macro["precision_at_1"] == pytest.approx(float(F(2, 3)))
    # five points of test_hand_case_macro_and_ties: class 0 mean 2/3, class 1 mean 0
    xs, ys = [[0.0], [0.1], [0.3], [5.0], [0.2]], [0, 0, 0, 1, 1]
    macro, _ = oracle.summary(xs, ys, metrics=["precision_at_1"], average="macro")
    assert macro["precision_at_1"] == pytest.approx(float((F(2, 3) + 0) / 2))
    only_lone, _ = oracle.summary([[0.0], [1.0]], ["a", "b"], metrics=["map"])
    assert math.isnan(only_lone["map"])
