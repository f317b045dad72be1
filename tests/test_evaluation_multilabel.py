"""Several labels per item (a 2-D 0/1 indicator array) through everything that reports a run:
bootstrap intervals, paired comparison, the training-loop Evaluator, confidences, the reject-both
curve, JSON, the failure gallery, the k sweep, pair distances, the HTML page and the CLI.

A reference is relevant when it shares a label with the query; every expected value comes from
hand-computed fractions or from the plain loops below."""

from __future__ import annotations

import csv
import io
import math
import subprocess
import sys

import numpy as np
import pytest

import embedeval as ee
from embedeval.evaluation.figures import k_sweep_values
from embedeval.evaluation.gallery import gallery_rows
from embedeval.evaluation.rejection import reject_both_curve
from embedeval.metrics.pairs import positive_negative_distances
from embedeval.utils.errors import InputError

# Points 0, 1, 3, 7 on a line with labels {A}, {B}, {A, B}, {A}.  Leave-one-out, by hand:
# AP 7/12, 1/2, 1, 5/6 (map 35/48); nearest neighbours 1, 0, 1, 2, so P@1 = 0, 0, 1, 1
# (point 3's {A, B} shares B with point 1, point 7's {A} shares A with point 3).
X4 = np.float32([[0, 0], [1, 0], [3, 0], [7, 0]])
Y4 = np.array([[1, 0], [0, 1], [1, 1], [1, 0]], dtype=np.int8)

_RNG = np.random.default_rng(11)
X = _RNG.integers(0, 5, size=(48, 3)).astype(np.float32)  # duplicates and exact ties
Y = (_RNG.random((48, 4)) < 0.3).astype(np.int8)  # some rows with no label at all


def _shares(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.any(a.astype(bool) & b.astype(bool)))


def _ranked(x: np.ndarray, y: np.ndarray, i: int) -> list[tuple[int, bool]]:
    """Leave-one-out ranking of query ``i``: (reference, relevant), nearest first, equal
    float64 distances by reference index."""
    d = [(float(np.sum((x[i].astype(np.float64) - x[j]) ** 2)), j) for j in range(len(x))]
    return [(j, _shares(y[i], y[j])) for _, j in sorted(d) if j != i]


def _hit_rate(x: np.ndarray, y: np.ndarray, k: int) -> list[float]:
    """Per query, 1 when one of its k nearest shares a label (NaN without any relevant)."""
    out = []
    for i in range(len(x)):
        rel = [r for _, r in _ranked(x, y, i)]
        out.append(float(any(rel[:k])) if any(rel) else math.nan)
    return out


def _average_precision(x: np.ndarray, y: np.ndarray) -> list[float]:
    """Per query, AP over the whole ranking, divided by the relevant count (NaN without any)."""
    out = []
    for i in range(len(x)):
        rel = [r for _, r in _ranked(x, y, i)]
        hits = [n + 1 for n, r in enumerate(rel) if r]
        ap = sum((j + 1) / rank for j, rank in enumerate(hits)) / len(hits) if hits else math.nan
        out.append(ap)
    return out


# --------------------------------------------------------------------------- intervals
def test_bootstrap_of_a_multi_label_run_resamples_queries_and_refuses_classes():
    res = ee.evaluate(X4, Y4, metrics=["map", "precision_at_1"])
    assert res["map"] == pytest.approx(35 / 48, abs=1e-15)
    assert res.per_query["precision_at_1"].tolist() == [0, 0, 1, 1]
    # micro resamples queries and reads no class: the intervals of the bare per-query values
    plain = {m: res.per_query[m] for m in ("map", "precision_at_1")}
    assert ee.bootstrap_ci(res, n_boot=300) == ee.bootstrap_ci(plain, n_boot=300)
    with pytest.raises(InputError, match="average='micro'"):
        ee.bootstrap_ci(plain, labels=Y4, average="macro", n_boot=10)


def test_paired_comparison_of_multi_label_runs_by_hand():
    a = ee.evaluate(X4, Y4, metrics=["map"])
    # point 3 moved to 0.6 ({A, B}), by hand: query 0 ranks 2 (rel), 1, 3 (rel): AP 5/6;
    # query 1 ranks 2 (its only relevant) first: 1; query 2: 1, 0, 3, all relevant: 1;
    # query 3 ranks 1, 2 (rel), 0 (rel): AP (1/2 + 2/3) / 2 = 7/12
    x = X4.copy()
    x[2, 0] = 0.6
    b = ee.evaluate(x, Y4, metrics=["map"])
    assert b.per_query["map"].tolist() == pytest.approx([5 / 6, 1, 1, 7 / 12], abs=1e-15)
    rows = ee.compare({"a": a, "b": b}, n_boot=200).rows
    diff = next(r for r in rows if r["checkpoint"] == "b")["diff"]
    assert diff == pytest.approx((5 / 6 + 1 + 1 + 7 / 12) / 4 - 35 / 48, abs=1e-12)
    other = Y4.copy()
    other[3] = [0, 1]
    c = ee.evaluate(X4, other, metrics=["map"])
    with pytest.raises(InputError, match="at 1 of 4 queries, first at query 3 .'1' vs '0'"):
        ee.compare({"a": a, "c": c})
    # the row with only label column 0 and the label 0 both read '0': the forms are named
    wider = ee.evaluate(X4, np.hstack([Y4, np.zeros((4, 1), np.int8)]), metrics=["map"])
    one = ee.evaluate(X4, Y4.argmax(axis=1), metrics=["map"])
    with pytest.raises(InputError, match="as 3 indicator columns but 'a' as 2 indicator"):
        ee.compare({"a": a, "w": wider})
    with pytest.raises(InputError, match="as one label per query but 'a' as 2 indicator"):
        ee.compare({"a": a, "one": one})


# --------------------------------------------------------------------------- the Evaluator
def test_evaluator_accumulates_indicator_batches_and_refuses_a_change_of_form():
    ev = ee.Evaluator(metrics=["map", "precision_at_1"])
    for s in (slice(0, 20), slice(20, 48)):
        ev.update(X[s], Y[s])
    res = ev.compute()
    np.testing.assert_allclose(res.per_query["map"], _average_precision(X, Y), rtol=0, atol=1e-15)
    hits = _hit_rate(X, Y, 1)
    np.testing.assert_array_equal(res.per_query["precision_at_1"], hits)
    with pytest.raises(InputError, match="one label per row but earlier batches had 4"):
        ev.update(X[:3], np.arange(3))


# --------------------------------------------------------------------------- confidences
def test_confidences_of_a_multi_label_run_leave_out_class_wise_calibration():
    conf = np.linspace(0.9, 0.1, X.shape[0])
    res = ee.evaluate(X, Y, metrics=["precision_at_1"], confidences=conf, ci=0.9, n_boot=50)
    assert "classwise_ece" not in res.confidence and "ece" in res.confidence
    single = ee.evaluate(X, np.arange(48) % 3, metrics=["precision_at_1"], confidences=conf)
    assert "classwise_ece" in single.confidence
    curve = reject_both_curve(X, Y, conf, fractions=[0.0, 0.25], metrics=["precision_at_1"])
    keep = np.sort(np.argsort(-conf, kind="stable")[:36])
    want = [np.nanmean(_hit_rate(X, Y, 1)), np.nanmean(_hit_rate(X[keep], Y[keep], 1))]
    assert curve.metrics["precision_at_1"].tolist() == pytest.approx(want, abs=1e-15)


def test_json_round_trip_keeps_the_indicator_labels():
    res = ee.evaluate(X, Y, metrics=["map"])
    back = ee.EvaluationResult.from_json(res.to_json())
    assert back.query_labels.dtype == bool and back.query_labels.shape == (48, 4)
    np.testing.assert_array_equal(back.query_labels, Y.astype(bool))
    assert back.per_class == res.per_class


# --------------------------------------------------------------------------- figures and pages
def test_gallery_marks_references_sharing_a_label():
    rows = gallery_rows(np.arange(48), 5, query=X, query_labels=Y)
    for row in rows:
        ranked = _ranked(X, Y, row.query)
        assert row.indices.tolist() == [j for j, _ in ranked[:5]]
        assert row.relevant.tolist() == [r for _, r in ranked[:5]]
        first = next((n + 1 for n, (_, r) in enumerate(ranked) if r), None)
        assert row.first_relevant == first


def test_k_sweep_macro_is_the_mean_over_labels():
    res = ee.evaluate(X, Y, metrics=["precision_at_1"], average="macro")
    got = k_sweep_values(res, {"query": X, "query_labels": Y}, [1, 3])["Recall@k (hit rate)"]
    for k, value in zip([1, 3], got, strict=True):
        hits = np.array(_hit_rate(X, Y, k))
        counted = ~np.isnan(np.array(_hit_rate(X, Y, 1)))
        means = [hits[counted & (Y[:, c] == 1)].mean() for c in range(4)
                 if (counted & (Y[:, c] == 1)).any()]  # fmt: skip
        assert value == pytest.approx(np.mean(means), abs=1e-12)


def test_pair_distances_positives_share_a_label_and_negatives_none():
    # items at 2**i: every distance names its pair
    x = (2.0 ** np.arange(8))[:, None]
    y = np.array([[1, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 1],
                  [0, 0, 1], [0, 0, 0], [1, 0, 0], [0, 1, 1]])  # fmt: skip
    pair = {abs(x[i, 0] - x[j, 0]): (i, j) for i in range(8) for j in range(i + 1, 8)}
    pos, neg = positive_negative_distances(x, y, max_pairs=400, seed=3)
    assert pos.size == 400 and neg.size == 400
    assert all(_shares(y[pair[d][0]], y[pair[d][1]]) for d in pos.tolist())
    assert not any(_shares(y[pair[d][0]], y[pair[d][1]]) for d in neg.tolist())


def test_html_page_counts_queries_per_label(tmp_path):
    res = ee.evaluate(X4, Y4, metrics=["map"])
    res.to_html(tmp_path / "r.html", query=X4)
    text = (tmp_path / "r.html").read_text()
    # label 0 (A): three queries, AP 7/12, 1, 5/6; label 1 (B): two, AP 1/2, 1
    assert '<tr><td>0</td><td class="num" data-v="3">' in text
    assert '<tr><td>1</td><td class="num" data-v="2">' in text
    row = text.split('<tr><td>0</td><td class="num" data-v="3">3</td>', 1)[1]
    value = float(row.split('data-v="', 1)[1].split('"', 1)[0])
    assert value == pytest.approx((7 / 12 + 1 + 5 / 6) / 3, abs=1e-15)


def test_cli_tables_report_and_plots(tmp_path):
    np.savez(tmp_path / "ml.npz", embeddings=X4, labels=Y4)
    args = ["--metrics", "map", "precision_at_1", "--per-class", "pc.csv", "--per-query",
            "pq.csv", "--report", "r.html", "--plots", "figs"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "embedeval", "evaluate", "ml.npz", *args],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    per_class = list(csv.DictReader(io.StringIO((tmp_path / "pc.csv").read_text())))
    assert [(r["label"], r["n_queries"]) for r in per_class] == [("0", "3"), ("1", "2")]
    # label A: AP 7/12, 1, 5/6 ; label B: AP 1/2, 1
    assert float(per_class[0]["map"]) == pytest.approx((7 / 12 + 1 + 5 / 6) / 3, abs=1e-6)
    per_query = list(csv.DictReader(io.StringIO((tmp_path / "pq.csv").read_text())))
    assert [r["label"] for r in per_query] == ["0", "1", "0;1", "0"]
    assert [r["top1_index"] for r in per_query] == ["1", "0", "1", "2"]
    assert [r["top1_label"] for r in per_query] == ["1", "0", "1", "0;1"]
    assert (tmp_path / "r.html").stat().st_size > 0
    assert {p.name for p in (tmp_path / "figs").iterdir()} >= {"k_sweep.png", "per_class.png"}


# ------------------------------------------------------------------ labels in other shapes
@pytest.mark.parametrize(
    "labels",
    [
        np.arange(48).reshape(-1, 1) % 5,  # one column: one label per row
        [(i % 5,) * (1 + i % 2) for i in range(48)],  # tuples of two lengths, in a list
    ],
)
def test_report_pages_read_reference_labels_as_evaluate_does(tmp_path, labels):
    xq, yq = X[:12], labels[:12]
    res = ee.evaluate(xq, yq, X, labels, metrics=["map", "precision_at_1"])
    res.to_html(tmp_path / "r.html", query=xq, reference=X, reference_labels=labels)
    text = (tmp_path / "r.html").read_text()
    as_text = [str(v[0]) if isinstance(v, np.ndarray) else str(v) for v in labels]
    shown = {c.split("</span>")[0] for c in text.split("<span class='meta'>label ")[1:]}
    assert shown and shown <= set(as_text)  # each gallery cell names a label as given


def test_pair_histograms_join_labels_by_class_not_by_text():
    from embedeval.evaluation.figures import _joint_labels

    codes = _joint_labels(np.array([5, 6, 5]), np.array(["5", "6", "6"], dtype=object))
    # 5 and "5" are different classes (as evaluate finds no relevant reference between them)
    assert codes[0] == codes[2] and codes[0] != codes[3] and codes[4] == codes[5]
    assert codes[1] != codes[4]


@pytest.mark.parametrize(
    "call",
    [
        lambda y1, y2: ee.evaluate(X[:6], y1[:6], X, y2, metrics=["map"]),
        lambda y1, y2: gallery_rows(
            [0], 3, query=X[:6], query_labels=y1[:6], reference=X, reference_labels=y2
        ),
    ],
)
def test_indicator_reference_labels_beside_single_query_labels_name_the_mix(call):
    # the query labels fix the form: a 2-D indicator reference is a mix of the two forms, not
    # a reference that should have been given as indicators
    with pytest.raises(InputError, match=r"reference_labels has shape \(48, 4\).*query_labels"):
        call(np.arange(48) % 3, Y)
    with pytest.raises(InputError, match=r"reference_labels must be a 2-D 0/1 indicator"):
        call(Y, np.arange(48) % 3)
