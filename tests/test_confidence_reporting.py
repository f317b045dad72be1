"""Confidence metrics through evaluate, its bootstrap intervals, JSON, compare and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import embedeval as ee

ROOT = Path(__file__).resolve().parents[1]


def _ece_loop(correct, conf, bins=10):
    total = 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        members = [i for i in range(len(conf)) if lo < conf[i] <= hi or (b == 0 and conf[i] == 0)]
        if members:
            acc = sum(correct[i] for i in members) / len(members)
            mc = sum(conf[i] for i in members) / len(members)
            total += len(members) / len(conf) * abs(acc - mc)
    return total


def _aurc_loop(correct, conf):
    """Mean over k of the error of the k most confident (no ties in these tests)."""
    order = sorted(range(len(conf)), key=lambda i: -conf[i])
    return sum(sum(1 - correct[i] for i in order[:k]) / k for k in range(1, len(conf) + 1)) / len(
        conf
    )


def test_evaluate_reports_the_new_metrics_on_a_hand_case():
    # 1-D points: 0 and 0.1 (class a), 1 and 3 (class b), 1.05 (class a)
    x = [[0.0], [0.1], [1.0], [3.0], [1.05]]
    y = ["a", "a", "b", "b", "a"]
    conf = [0.9, 0.8, 0.3, 0.6, 0.2]
    res = ee.evaluate(x, y, confidences=conf, metrics=["precision_at_1"])
    # nearest neighbours: 0->0.1 (a, right), 0.1->0 (right), 1->1.05 (a, wrong for b),
    # 3->1.05 (a, wrong), 1.05->1 (b, wrong): correct = 1, 1, 0, 0, 0
    correct = [1, 1, 0, 0, 0]
    assert res.per_query["precision_at_1"].tolist() == correct
    # most confident first: .9 (e0) .8 (e0) .6 (e1) .3 (e1) .2 (e1):
    # AURC = (0 + 0 + 1/3 + 2/4 + 3/5) / 5
    assert res.confidence["aurc_precision_at_1"] == pytest.approx((1 / 3 + 1 / 2 + 3 / 5) / 5)
    # AUGRC = (0 + 0 + 1/5 + 2/5 + 3/5) / 5
    assert res.confidence["augrc_precision_at_1"] == pytest.approx(6 / 25)
    # E-AURC: the order is already the oracle's, 0
    assert res.confidence["eaurc_precision_at_1"] == pytest.approx(0.0)
    # bins of 0.1: .9 -> (.8, .9] gap |1 - .9|; .8 -> (.7, .8] |1 - .8|; .6 |0 - .6|;
    # .3 |0 - .3|; .2 |0 - .2| -> ECE = (.1 + .2 + .6 + .3 + .2) / 5
    assert res.confidence["ece"] == pytest.approx(1.4 / 5)
    # Brier = (.01 + .04 + .36 + .09 + .04) / 5
    assert res.confidence["brier"] == pytest.approx(0.54 / 5)
    # class a: .9 .8 right, .2 wrong -> (.1 + .2 + .2)/3; class b: (.3 + .6)/2
    assert res.confidence["classwise_ece"] == pytest.approx((0.5 / 3 + 0.9 / 2) / 2)


def test_sigma_confidences_skip_calibration_but_keep_ranking_metrics():
    x = [[0.0], [0.1], [1.0], [3.0], [1.05]]
    y = [0, 0, 1, 1, 0]
    res = ee.evaluate(
        x,
        y,
        confidences=[2.0, 3.0, 8.0, 5.0, 9.0],
        higher_is_confident=False,
        metrics=["precision_at_1"],
    )
    assert "ece" not in res.confidence  # a sigma is no probability of being right
    assert res.confidence["aurc_precision_at_1"] == pytest.approx((1 / 3 + 1 / 2 + 3 / 5) / 5)


def test_open_set_keys_read_lone_queries_as_out_of_gallery():
    from sklearn.metrics import roc_auc_score

    x = [[0.0], [0.1], [1.0], [1.1], [5.0], [6.0]]
    y = [0, 0, 1, 1, 2, 3]  # classes 2 and 3 have no other member: lone = out of gallery
    conf = [0.9, 0.6, 0.8, 0.3, 0.5, 0.1]
    res = ee.evaluate(x, y, confidences=conf, metrics=["precision_at_1"])
    enrolled = [1, 1, 1, 1, 0, 0]
    assert res.confidence["open_set_auroc"] == pytest.approx(roc_auc_score(enrolled, conf))
    # enrolled .9 .8 .6 .3: TPR >= .95 only at t = .3, which accepts out .5 -> FPR 1/2
    assert res.confidence["open_set_fpr_at_95tpr"] == pytest.approx(0.5)


def test_ci_of_aurc_and_ece_by_loop_with_the_same_draws():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 3))
    y = rng.integers(0, 6, 60)
    conf = rng.permutation(60) / 60 + 0.005  # distinct, in (0, 1)
    res = ee.evaluate(x, y, confidences=conf, metrics=["precision_at_1"], ci=0.8, n_boot=40)
    correct = res.per_query["precision_at_1"]
    draws = np.random.default_rng(0)
    aurcs, eces = [], []
    for _ in range(40):
        idx = draws.integers(0, 60, size=60)
        c, s = conf[idx], correct[idx]
        # duplicated queries are tied blocks; a tie of equal errors changes nothing, and a
        # duplicate has the same error, so a plain stable sort gives the expectation here
        aurcs.append(_aurc_loop(list(s), list(c)))
        eces.append(_ece_loop(list(s), list(c)))
    assert res.ci["aurc_precision_at_1"] == pytest.approx(tuple(np.quantile(aurcs, [0.1, 0.9])))
    assert res.ci["ece"] == pytest.approx(tuple(np.quantile(eces, [0.1, 0.9])))


def _two_checkpoints():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(80, 4))
    y = rng.integers(0, 8, 80)
    good = rng.permutation(80) / 80 + 0.005
    a = ee.evaluate(x, y, confidences=good, metrics=["precision_at_1"])
    b = ee.evaluate(x, y, confidences=good * 0.5, metrics=["precision_at_1"])
    return a, b, good


def test_compare_confidence_metric_paired_interval_by_loop():
    a, b, conf = _two_checkpoints()
    cmp = ee.compare({"a": a, "b": b}, metrics=["ece"], ci=0.8, n_boot=50, seed=2)
    rows = {r["checkpoint"]: r for r in cmp.rows}
    assert rows["a"]["value"] == pytest.approx(a.confidence["ece"])
    assert rows["b"]["diff"] == pytest.approx(b.confidence["ece"] - a.confidence["ece"])
    s = a.per_query["precision_at_1"]
    draws = np.random.default_rng(2)
    diffs = []
    for _ in range(50):
        idx = draws.integers(0, 80, size=80)
        diffs.append(
            _ece_loop(list(s[idx]), list(conf[idx] * 0.5))
            - _ece_loop(list(s[idx]), list(conf[idx]))
        )
    lo, hi = np.quantile(diffs, [0.1, 0.9])
    assert (rows["b"]["diff_ci_low"], rows["b"]["diff_ci_high"]) == pytest.approx((lo, hi))
    perm = ee.compare({"a": a, "b": b}, metrics=["ece"], n_boot=50, test="permutation")
    assert 0 < perm.rows[1]["p_value"] <= 1


def test_compare_from_json_and_missing_confidences():
    a, b, _ = _two_checkpoints()
    a2 = ee.EvaluationResult.from_dict(json.loads(a.to_json()))
    assert a2.query_confidences == pytest.approx(a.query_confidences)
    cmp = ee.compare([a2, b], metrics=["precision_at_1", "augrc_precision_at_1"], n_boot=20)
    assert cmp.metrics == ["precision_at_1", "augrc_precision_at_1"]
    bare = ee.EvaluationResult.from_dict(
        {k: v for k, v in a.to_dict().items() if k != "query_confidences"}
    )
    with pytest.raises(ee.InputError, match="confidences"):
        ee.compare([bare, b], metrics=["augrc_precision_at_1"], n_boot=20)


def _compare_cli(tmp_path, *options):
    """`embedeval compare a.npz b.npz OPTIONS` in a subprocess, with this checkout importable."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "embedeval",
            "compare",
            tmp_path / "a.npz",
            tmp_path / "b.npz",
            *options,
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=300,
    )


def test_cli_compare_with_confidence_metrics(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(40, 3))
    y = rng.integers(0, 5, 40)
    np.savez(tmp_path / "a.npz", embeddings=x, labels=y, confidences=rng.uniform(0, 1, 40))
    np.savez(tmp_path / "b.npz", embeddings=x, labels=y, confidences=rng.uniform(0, 1, 40))
    proc = _compare_cli(
        tmp_path,
        "--metrics",
        "precision_at_1",
        "--confidence-metrics",
        "aurc_precision_at_1,ece",
        "--n-boot",
        "20",
        "--json",
        tmp_path / "c.json",
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["metrics"] == ["precision_at_1", "aurc_precision_at_1", "ece"]
    bad = _compare_cli(tmp_path, "--confidence-metrics", "aurcc")
    assert bad.returncode == 2 and "aurcc" in bad.stderr


def test_compare_confidence_metrics_across_runs_with_different_metric_sets():
    a, _, conf = _two_checkpoints()
    rng = np.random.default_rng(4)
    x = rng.normal(size=(80, 4))
    y = a.query_labels
    c = ee.evaluate(x, y, confidences=conf, metrics=["precision_at_1", "map_at_r"])
    keys = ["aurc_precision_at_1", "r_auroc", "brier"]
    cmp = ee.compare({"a": a, "c": c}, metrics=keys, n_boot=30, test="permutation")
    assert [r["metric"] for r in cmp.rows] == [k for k in keys for _ in range(2)]
    # identical runs: every swap leaves the difference at 0, so p = (30 + 1) / (30 + 1)
    same = ee.compare({"a": a, "a2": a}, metrics=["ece"], n_boot=30, test="permutation")
    assert same.rows[1]["p_value"] == 1.0 and same.rows[1]["diff"] == 0.0
