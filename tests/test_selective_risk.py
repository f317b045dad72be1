"""AURC, E-AURC, AUGRC, selective risk and coverage at risk against brute-force oracles."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from embedeval import confidence as cf
from embedeval._errors import InputError


def _risks_over_orders(scores, conf):
    """(E_k, G_k) for k = 1..n, averaged over every order of the tied confidences."""
    scores, conf = np.asarray(scores, float), np.asarray(conf, float)
    n = len(scores)
    sel, gen = [], []
    for perm in itertools.permutations(range(n)):
        order = sorted(perm, key=lambda i: -conf[i])  # stable: ties keep the permutation order
        errs = 1 - scores[order]
        sel.append([sum(errs[:k]) / k for k in range(1, n + 1)])
        gen.append([sum(errs[:k]) / n for k in range(1, n + 1)])
    return np.mean(sel, axis=0), np.mean(gen, axis=0)


def _mean_rule(v):
    total = 0.0
    for x in v:  # one term per coverage level k/n
        total += x
    return total / len(v)


def _trapezoid_rule(v):
    n = len(v)
    points = [0.0, *v]  # the curve starts at (coverage 0, value 0)
    return sum((points[k] + points[k + 1]) / 2 * (1 / n) for k in range(n))


def test_four_queries_by_hand():
    # confidences 0.9, 0.8, 0.2, 0.1 -> errors (most confident first) 0, 0, 1, 1
    erc = cf.error_reject_curve([1, 1, 0, 0], [0.9, 0.8, 0.2, 0.1])
    # E_k = 0/1, 0/2, 1/3, 2/4; mean rule: (0 + 0 + 1/3 + 1/2) / 4 = 5/24
    assert erc.aurc == pytest.approx(5 / 24)
    # the order is the oracle order, so E-AURC = 0
    assert erc.eaurc == pytest.approx(0.0)
    # G_k = 0/4, 0/4, 1/4, 2/4: (0 + 0 + 1/4 + 2/4) / 4 = 3/16
    assert erc.augrc == pytest.approx(3 / 16)
    worst = cf.error_reject_curve([1, 1, 0, 0], [0.1, 0.2, 0.8, 0.9])
    # E_k = 1/1, 2/2, 2/3, 2/4 -> AURC = (1 + 1 + 2/3 + 1/2) / 4 = 19/24; E-AURC = 19/24 - 5/24
    assert worst.aurc == pytest.approx(19 / 24)
    assert worst.eaurc == pytest.approx(14 / 24)
    # G_k = 1/4, 2/4, 2/4, 2/4 -> AUGRC = (1/4 + 1/2 + 1/2 + 1/2) / 4 = 7/16
    assert worst.augrc == pytest.approx(7 / 16)
    # trapezoid: (1/4) [1 + 1 + 2/3 + (1/2)/2] = 35/48
    t = cf.error_reject_curve([1, 1, 0, 0], [0.1, 0.2, 0.8, 0.9], integration="trapezoid")
    assert t.aurc == pytest.approx(35 / 48)
    # oracle trapezoid: (1/4) [0 + 0 + 1/3 + (1/2)/2] = 7/48
    assert t.eaurc == pytest.approx(35 / 48 - 7 / 48)
    # AUGRC trapezoid: (1/4) [1/4 + 1/2 + 1/2 + (1/2)/2] = 3/8
    assert t.augrc == pytest.approx(3 / 8)


def test_four_queries_with_a_tied_block_by_hand():
    # errors 1, 0, 0 tied at confidence 0.5 after a correct query at 0.9
    erc = cf.error_reject_curve([1, 0, 1, 1], [0.9, 0.5, 0.5, 0.5])
    # k=1: 0; k=2: one of the block kept, expected error 1/3 -> E_2 = (1/3)/2 = 1/6
    # k=3: two kept, expected error 2/3 -> E_3 = (2/3)/3 = 2/9; k=4: E_4 = 1/4
    assert erc.error[::-1].tolist() == pytest.approx([0, 1 / 6, 2 / 9, 1 / 4])
    assert erc.aurc == pytest.approx((0 + 1 / 6 + 2 / 9 + 1 / 4) / 4)
    # G_k = 0, (1/3)/4, (2/3)/4, 1/4
    assert erc.augrc == pytest.approx((0 + 1 / 12 + 1 / 6 + 1 / 4) / 4)


def test_trapezoid_reproduces_the_probabilistic_embeddings_aurcc():
    # The verification test case of the probabilistic-embeddings library: correctness
    # T T T F T T F T T T with confidences below.  Most confident first the errors are
    # 0 (1.0), 1 (0.9), seven 0s (0.5), 1 (0.1), so E_k = 0, 1/2, 1/3, ..., 1/9, 2/10.
    correct = [1, 1, 1, 0, 1, 1, 0, 1, 1, 1]
    conf = [0.5, 0.5, 0.5, 0.1, 0.5, 0.5, 0.9, 0.5, 0.5, 1.0]
    t = cf.error_reject_curve(correct, conf, integration="trapezoid")
    expected = 0.1 * (sum(1 / j for j in range(2, 10)) + 2 / 10 / 2)
    assert t.aurc == pytest.approx(expected)
    assert round(t.aurc, 5) == 0.19290
    m = cf.error_reject_curve(correct, conf, integration="mean")
    assert round(m.aurc, 5) == 0.20290  # trapezoid + E_10 / (2 n) = 0.19290 + 0.2 / 20
    assert m.aurc == pytest.approx(m.auerc)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("integration", ["mean", "trapezoid"])
def test_against_enumeration_of_tied_orders(seed, integration):
    rng = np.random.default_rng(seed)
    n = 6
    scores = rng.choice([0.0, 0.25, 1.0], size=n)
    conf = rng.integers(0, 3, size=n).astype(float)  # many ties
    sel, gen = _risks_over_orders(scores, conf)
    rule = _mean_rule if integration == "mean" else _trapezoid_rule
    erc = cf.error_reject_curve(scores, conf, integration=integration)
    assert erc.aurc == pytest.approx(rule(sel))
    assert erc.augrc == pytest.approx(rule(gen))
    oracle_errs = np.sort(1 - scores)
    oracle_sel = [oracle_errs[:k].sum() / k for k in range(1, n + 1)]
    oracle_gen = [oracle_errs[:k].sum() / n for k in range(1, n + 1)]
    assert erc.eaurc == pytest.approx(rule(sel) - rule(oracle_sel))
    assert erc.oracle_augrc == pytest.approx(rule(oracle_gen))


def test_invariances():
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 2, 200).astype(float)
    conf = rng.normal(size=200).round(1)  # ties
    base = cf.error_reject_curve(scores, conf)
    for transformed in (np.exp(conf), 3 * conf + 7, np.arctan(conf)):
        other = cf.error_reject_curve(scores, transformed)
        assert other.aurc == pytest.approx(base.aurc)
        assert other.augrc == pytest.approx(base.augrc)
        assert other.eaurc == pytest.approx(base.eaurc)
    perm = rng.permutation(200)
    shuffled = cf.error_reject_curve(scores[perm], conf[perm])
    assert shuffled.aurc == pytest.approx(base.aurc)
    assert shuffled.augrc == pytest.approx(base.augrc)
    sigma = cf.error_reject_curve(scores, -conf * 2, higher_is_confident=False)
    assert sigma.aurc == pytest.approx(base.aurc)


def test_random_baselines():
    # A single tied block is a random order: E_k = mean error for every k.
    scores = np.array([1, 0, 0, 1, 1, 0, 1, 1], float)
    e = 1 - scores.mean()  # 3/8
    erc = cf.error_reject_curve(scores, np.zeros(8))
    assert erc.aurc == pytest.approx(e)
    n = 8
    assert erc.augrc == pytest.approx(e * (n + 1) / (2 * n))
    t = cf.error_reject_curve(scores, np.zeros(8), integration="trapezoid")
    assert t.augrc == pytest.approx(e / 2)


def test_selective_risk_and_coverage_at_risk_by_loops():
    rng = np.random.default_rng(5)
    scores = rng.integers(0, 2, 40).astype(float)
    conf = rng.permutation(40).astype(float)  # no ties: plain sort is the oracle
    order = np.argsort(-conf)
    errs = 1 - scores[order]
    erc = cf.error_reject_curve(scores, conf)
    for k in range(1, 41):
        assert erc.selective_risk(k / 40) == pytest.approx(errs[:k].mean())
    assert erc.selective_risk(0.001) == pytest.approx(errs[0])  # ⌈0.04⌉ = 1 query kept
    for r in (0.0, 0.1, 0.3, 0.5, 1.0):
        best = 0.0
        for k in range(1, 41):
            if errs[:k].mean() <= r + 1e-12:
                best = max(best, k / 40)
        assert erc.coverage_at_risk(r) == best


def test_bad_arguments_name_themselves():
    erc = cf.error_reject_curve([1, 0], [0.5, 0.2])
    with pytest.raises(InputError, match="coverage"):
        erc.selective_risk(0)
    with pytest.raises(InputError, match="risk"):
        erc.coverage_at_risk(1.5)
    with pytest.raises(InputError, match="integration"):
        cf.error_reject_curve([1, 0], [0.5, 0.2], integration="simpson")
    assert math.isfinite(erc.aurc)


@pytest.mark.parametrize("seed", range(5))
def test_trapezoid_augrc_equals_the_curve_through_one_point_per_threshold(seed):
    # Independent construction: one risk-coverage point per distinct confidence (a threshold
    # keeps every query at or above it, so ties are never split), joined by straight lines
    # from (0, 0).  G is linear inside a tied block, so this is the block expectation.
    rng = np.random.default_rng(seed)
    n = 50
    scores = rng.choice([0.0, 0.5, 1.0], size=n)
    conf = rng.integers(0, 8, size=n).astype(float)
    cov, risk = [0.0], [0.0]
    for t in sorted(set(conf.tolist()), reverse=True):
        kept = conf >= t
        cov.append(kept.sum() / n)
        risk.append((1 - scores[kept]).sum() / n)
    area = sum((cov[i + 1] - cov[i]) * (risk[i] + risk[i + 1]) / 2 for i in range(len(cov) - 1))
    erc = cf.error_reject_curve(scores, conf, integration="trapezoid")
    assert erc.augrc == pytest.approx(area)
