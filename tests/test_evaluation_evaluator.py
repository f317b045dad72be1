"""embedeval.Evaluator: batches (and processes) accumulate to exactly what evaluate() computes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import embedeval as ee
from embedeval.evaluation.evaluator import _Growable

from . import oracle

METRICS = ["precision_at_1", "r_precision", "map_at_r", "map", "recall_at_5"]


def _data(n=240, dim=6, n_classes=15, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(-4, 5, size=(n, dim)).astype(np.float32)  # small ints: exact distances, ties
    x[10] = x[3]  # exact duplicates are normal data
    y = rng.integers(0, n_classes, n)
    return x, y


def _batches(n, sizes):
    start = 0
    for size in sizes:
        yield slice(start, min(start + size, n))
        start += size
        if start >= n:
            return


def _assert_same(a, b):
    assert a.metrics.keys() == b.metrics.keys()
    for name in a.per_query:
        np.testing.assert_array_equal(a.per_query[name], b.per_query[name])
    assert a.n_ties == b.n_ties and a.n_lone == b.n_lone


@pytest.mark.parametrize("sizes", [[240], [1] * 240, [7, 1, 100, 13, 200]])
def test_batches_equal_evaluate_on_the_concatenation(sizes):
    x, y = _data()
    ev = ee.Evaluator(metrics=METRICS)
    for sl in _batches(len(x), sizes):
        ev.update(x[sl], y[sl])
    got = ev.compute()
    _assert_same(got, ee.evaluate(x, y, metrics=METRICS))
    # and against the independent brute-force oracle
    _, want, _ = oracle.evaluate(x, y.tolist(), metrics=METRICS)
    for name in METRICS:
        np.testing.assert_allclose(got.per_query[name], want[name], rtol=0, atol=1e-12)


def test_empty_batches_add_nothing():
    # A filtered batch can be empty.  Its labels (here float64, as np.array([]) is) must not
    # fix the buffer's dtype: 2**60 + c would round to one class in float64.
    torch = pytest.importorskip("torch")
    x, y = _data(n=40)
    big = np.int64(2**60) + y
    ev = ee.Evaluator(metrics=METRICS)
    ev.update(np.empty((0, x.shape[1])), np.array([]))
    ev.update(x[:25], big[:25])
    ev.update(torch.empty(0, x.shape[1]), torch.empty(0, dtype=torch.int64), indices=None)
    ev.update(x[25:], big[25:])
    ev.update(x[:0], big[:0])
    got = ev.compute()
    assert got.n_queries == 40
    _, want, _ = oracle.evaluate(x, y.tolist(), metrics=METRICS)
    for name in METRICS:
        np.testing.assert_allclose(got.per_query[name], want[name], rtol=0, atol=1e-12)
    with pytest.raises(ee.InputError, match="labels has 2 row"):
        ev.update(x[:0], big[:2])
    only_empty = ee.Evaluator()
    only_empty.update(x[:0], y[:0])
    with pytest.raises(ee.InputError, match="only empty batches"):
        only_empty.compute()


@pytest.mark.parametrize("split", [None, "query", "reference"])
def test_an_empty_batch_of_another_dimension_is_refused(split):
    x, y = _data(n=20)
    ev = ee.Evaluator()
    ev.update(x[:10, :1], y[:10], split=split)
    with pytest.raises(ee.InputError, match=r"dimension 3 but earlier batches had 1.*\(0, 1\)"):
        ev.update(np.zeros((0, 3)), [], split=split)
    ev.update(np.zeros((0, 1)), [], split=split)  # an empty batch of the same dimension adds none
    assert ev.n_rows == 10


def test_query_reference_split_with_groups_and_confidences():
    x, y = _data(seed=1)
    rng = np.random.default_rng(5)
    g = rng.integers(0, 4, len(x))
    c = rng.random(len(x))
    q, r = slice(0, 80), slice(80, None)
    ev = ee.Evaluator(metrics=METRICS)
    for sl in _batches(80, [30, 30, 30]):
        ev.update(x[q][sl], y[q][sl], split="query", groups=g[q][sl], confidences=c[q][sl])
    for sl in _batches(160, [50, 50, 60]):
        ev.update(x[r][sl], y[r][sl], split="reference", groups=g[r][sl])
    got = ev.compute()
    want = ee.evaluate(
        x[q],
        y[q],
        x[r],
        y[r],
        metrics=METRICS,
        query_groups=g[q],
        reference_groups=g[r],
        confidences=c[q],
    )
    _assert_same(got, want)
    assert got.confidence == want.confidence


def test_indices_order_rows_and_drop_repeats():
    x, y = _data(n=60, seed=2)
    perm = np.random.default_rng(3).permutation(60)
    ev = ee.Evaluator(metrics=METRICS)
    ev.update(x[perm[:25]], y[perm[:25]], indices=perm[:25])
    ev.update(x[perm[25:]], y[perm[25:]], indices=perm[25:])
    ev.update(x[perm[:4]], y[perm[:4]], indices=perm[:4])  # padding repeats four rows
    _assert_same(ev.compute(), ee.evaluate(x, y, metrics=METRICS))


def test_ref_includes_query_matches_query_and_reference_rows_by_index():
    # Queries are dataset rows 30..39 and the gallery is the whole dataset (queries included):
    # each query sees the other 59 rows, i.e. the brute-force leave-one-out values of rows 30..39.
    rng = np.random.default_rng(12)
    x = rng.standard_normal((60, 4)).astype(np.float32)  # continuous: no distance ties
    y = rng.integers(0, 5, 60)
    qi = np.arange(30, 40)
    ev = ee.Evaluator(metrics=METRICS, ref_includes_query=True)
    ev.update(x[qi], y[qi], split="query", indices=qi)
    for sl in _batches(60, [25, 35]):
        ev.update(x[sl], y[sl], split="reference", indices=np.arange(60)[sl])
    got = ev.compute()
    _, want, _ = oracle.evaluate(x, y.tolist(), metrics=METRICS)
    for name in METRICS:
        np.testing.assert_allclose(
            got.per_query[name], np.array(want[name])[qi], rtol=0, atol=1e-12
        )
    missing = ee.Evaluator(metrics=METRICS, ref_includes_query=True)
    missing.update(x[qi], y[qi], split="query", indices=qi)
    missing.update(x[:30], y[:30], split="reference", indices=np.arange(30))
    with pytest.raises(ee.InputError, match="not among the reference indices"):
        missing.compute()


def test_torch_tensors_bf16_and_grad_are_accepted():
    torch = pytest.importorskip("torch")
    x, y = _data(n=50, seed=4)
    t = torch.from_numpy(x).to(torch.bfloat16).requires_grad_(True)
    ev = ee.Evaluator(metrics=["precision_at_1"])
    ev.update(t, torch.from_numpy(y))
    # small integers are exact in bfloat16, so the upcast values equal the originals
    _assert_same(ev.compute(), ee.evaluate(x, y, metrics=["precision_at_1"]))


def test_reset_and_primary_metric():
    x, y = _data(n=40)
    ev = ee.Evaluator(metrics=["precision_at_1", "map_at_r"], primary_metric="map_at_r")
    assert ev.mode == "max" and ev.higher_is_better
    ev.update(x, y)
    assert ev.n_rows == 40
    ev.reset()
    assert ev.n_rows == 0
    with pytest.raises(ee.InputError, match="before any update"):
        ev.compute()
    with pytest.raises(ee.InputError, match="primary_metric"):
        ee.Evaluator(metrics=["precision_at_1"], primary_metric="map_at_r")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"query_labels": [1]}, "update"),
        ({"distanse": "cosine"}, "distance"),
        ({"metrics": ["map_at_rr"]}, "map_at_r"),
        ({"average": "mean"}, "average"),
        ({"labels": [0, 1]}, r"does not take labels=; pass the data batch by batch to update"),
        ({"indices": [0, 1]}, r"does not take indices="),
    ],
)
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises((ee.InputError, ee.InputTypeError), match=match):
        ee.Evaluator(**kwargs)


def test_indices_above_int64_are_refused():
    # 2**63 held as int64 would wrap to -2**63 and could match another row's index.
    x, y = _data(n=20)
    x, y = x[:4], y[:4]
    ev = ee.Evaluator()
    with pytest.raises(ee.InputError, match="below 2\\*\\*63"):
        ev.update(x, y, indices=np.array([0, 1, 2, 2**63], dtype=np.uint64))
    ev.update(x, y, indices=np.array([0, 1, 2, 2**63 - 1], dtype=np.uint64))  # the largest
    with pytest.raises(ee.InputError, match=f"indices holds the integer {2**70}, beyond 64-bit"):
        ee.Evaluator().update(x, y, indices=[0, 1, 2, 2**70])


def test_bad_updates():
    x, y = _data(n=20)
    ev = ee.Evaluator()
    ev.update(x[:10], y[:10])
    with pytest.raises(ee.InputError, match="split"):
        ev.update(x[10:], y[10:], split="query")
    with pytest.raises(ee.InputError, match="indices"):
        ev.update(x[10:], y[10:], indices=np.arange(10, 20))
    with pytest.raises(ee.InputError, match="dimension"):
        ev.update(x[10:, :3], y[10:])
    with pytest.raises(ee.InputError, match="split="):
        ev.update(x, y, split="querry")
    split = ee.Evaluator()
    split.update(x, y, split="query")
    with pytest.raises(ee.InputError, match="reference"):
        split.compute()
    with pytest.raises(ee.InputError, match="confidences"):
        split.update(x, y, split="reference", confidences=np.ones(20))


def test_growable_amortises_and_keeps_exact_labels():
    buf = _Growable()
    for i in range(100):
        buf.append(np.array([i, i + 1], dtype=np.int64))
    assert buf.values().tolist() == [v for i in range(100) for v in (i, i + 1)]
    assert buf._data.shape[0] < 2 * 200 + 16  # capacity stays within a factor two of the rows
    labels = _Growable()
    labels.append(np.array([2**62], dtype=np.int64))
    labels.append(np.array([2**63 + 1], dtype=np.uint64))  # no exact common numeric type
    assert labels.values().tolist() == [2**62, 2**63 + 1]


def test_bytes_and_str_labels_from_different_batches_stay_different_labels():
    # The promotion of the bytes buffer decoded its uninitialised spare rows (and would have
    # made b"a" equal to "a").
    x = np.array([[0.0], [1.0], [3.0], [4.0], [9.0], [10.0]], dtype=np.float32)
    labels = [b"a", b"b", b"a", "a", "b", "b"]
    ev = ee.Evaluator(metrics=["precision_at_1", "map"])
    ev.update(x[:3], np.array(labels[:3]))
    ev.update(x[3:], np.array(labels[3:]))
    got = ev.compute()
    _, want, _ = oracle.evaluate(x, labels, metrics=["precision_at_1", "map"])
    for name in ("precision_at_1", "map"):
        np.testing.assert_allclose(got.per_query[name], want[name], rtol=0, atol=1e-12)
    # by hand: only "b" (rows 4 and 5) finds its partner first
    assert got.per_query["precision_at_1"].tolist()[4:] == [1.0, 1.0]
    assert np.isnan(got.per_query["precision_at_1"][:4]).tolist() == [False, True, False, True]


@pytest.mark.parametrize(
    "batches",
    [(["1", "1"], [1, 1]), ([1, 1], ["1", "1"]), ([True, True], ["True", "True"])],
)
def test_text_and_number_labels_from_different_batches_are_refused(batches):
    # numpy promotes numbers with text to text, which made the label 1 of one batch equal to
    # the label "1" of another; evaluate() refuses such a mix in one array
    x = np.array([[0.0], [1.0], [3.0], [4.0]], dtype=np.float32)
    with pytest.raises(ee.InputError, match="mixes text and numbers"):
        ee.evaluate(x, np.array(batches[0] + batches[1], dtype=object))
    ev = ee.Evaluator(metrics=["precision_at_1"])
    ev.update(x[:2], np.array(batches[0]))
    ev.update(x[2:], np.array(batches[1]))
    with pytest.raises(ee.InputError, match="mixes text and numbers"):
        ev.compute()


# ---------------------------------------------------------------- two processes (gloo, CPU)

_WORKER = textwrap.dedent(
    """
    import os, sys, json
    import numpy as np, torch, torch.distributed as dist
    import embedeval as ee

    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    data = np.load(os.environ["EE_DATA"])
    x, y, order = data["x"], data["y"], data["order"]
    # DistributedSampler-like shards: unequal sizes, the last rank padded with repeats
    mine = order[rank::world]
    if rank == world - 1:
        mine = np.concatenate([mine, order[:3]])
    ev = ee.Evaluator(metrics=%(metrics)r)
    for s in range(0, len(mine), 16):
        part = mine[s : s + 16]
        ev.update(torch.from_numpy(x[part]), torch.from_numpy(y[part]), indices=part)
    res = ev.compute()
    with open(out, "w") as f:
        json.dump({k: v.tolist() for k, v in res.per_query.items()}, f)
    dist.destroy_process_group()
    """
)


def _launch(tmp_path, source, *, world, **env_extra):
    """Run ``source`` as ``world`` processes of one gloo job; each writes out<rank>.json."""
    script = tmp_path / "worker.py"
    script.write_text(source)
    port = str(_free_port())
    env = {**os.environ, "EE_DATA": str(tmp_path / "data.npz"), "OMP_NUM_THREADS": "1"}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), str(world), port, str(tmp_path / f"out{r}.json")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for r in range(world)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()[-2000:]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_processes_equal_one_process_on_the_union(tmp_path):
    pytest.importorskip("torch")
    x, y = _data(n=157, seed=6)
    order = np.random.default_rng(7).permutation(157)
    np.savez(tmp_path / "data.npz", x=x, y=y, order=order)
    _launch(tmp_path, _WORKER % {"metrics": METRICS}, world=2)
    want = ee.evaluate(x, y, metrics=METRICS)
    for r in range(2):
        got = json.loads((tmp_path / f"out{r}.json").read_text())
        for name in METRICS:
            np.testing.assert_array_equal(
                np.array(got[name], dtype=float), want.per_query[name], err_msg=f"rank {r}"
            )


_SCENARIO_WORKER = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np, torch, torch.distributed as dist
    import embedeval as ee

    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    data = np.load(os.environ["EE_DATA"])
    x, y, g, c = data["x"], data["y"].astype(str), data["g"], data["c"]
    plans = json.loads(os.environ["EE_PLANS"])
    results = []
    for plan in plans:  # plan[rank]: [[split, [dataset indices]], ...]
        ev = ee.Evaluator(metrics=%(metrics)r)
        for split, part in plan[rank]:
            part = np.array(part, dtype=np.int64)
            extra = {} if split == "reference" else {"confidences": c[part]}
            ev.update(torch.from_numpy(x[part]), y[part], split=split, indices=part,
                      groups=g[part], **extra)
        try:
            res = ev.compute()
            results.append({k: v.tolist() for k, v in res.per_query.items()})
        except ee.InputError as e:
            results.append(str(e))
    with open(out, "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()
    """
)


def test_three_gloo_processes_with_empty_ranks_string_labels_groups_and_splits(tmp_path):
    pytest.importorskip("torch")

    x, y = _data(n=90, seed=8)
    rng = np.random.default_rng(9)
    g, c = rng.integers(0, 3, 90), rng.random(90)
    np.savez(tmp_path / "data.npz", x=x, y=y, g=g, c=c)
    order = rng.permutation(90).tolist()
    q, r = sorted(order[:25]), sorted(order[25:])
    plans = [
        # rank 2 received no rows at all; rank 1 carries padded repeats of rank 0's rows
        [[[None, order[:40]]], [[None, order[40:] + order[:6]]], []],
        # a split where rank 0 holds only references, rank 1 only queries, rank 2 nothing
        [[["reference", r]], [["query", q]], []],
        # ranks that disagree about the kind of evaluation: the same error everywhere
        [[[None, order[:40]]], [["query", q]], [["reference", r]]],
    ]
    _launch(tmp_path, _SCENARIO_WORKER % {"metrics": METRICS}, world=3, EE_PLANS=json.dumps(plans))
    ys = y.astype(str)
    want = [
        oracle.evaluate(x, ys.tolist(), metrics=METRICS, qg=g)[1],
        oracle.evaluate(
            x[q],
            ys[q].tolist(),
            x[r],
            ys[r].tolist(),
            metrics=METRICS,
            qg=g[q],
            rg=g[r],
        )[1],
    ]
    for k in range(3):
        got = json.loads((tmp_path / f"out{k}.json").read_text())
        for case in range(2):
            for name in METRICS:
                np.testing.assert_allclose(
                    np.array(got[case][name], dtype=float),
                    want[case][name],
                    rtol=0,
                    atol=1e-12,
                    err_msg=f"rank {k}, case {case}",
                )
        assert "split=None and others" in got[2]


def _hit_count(relevant, n_relevant):
    return relevant.sum(axis=1)


_MIXED_LABELS_WORKER = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np, torch, torch.distributed as dist
    import embedeval as ee

    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    data = np.load(os.environ["EE_DATA"])
    x, y = data["x"], data["y"]
    mine = np.arange(rank, len(x), world)
    results = []
    # rank 0 sends int64 labels, rank 1 uint64; then rank 1 sends strings
    for kind in ("uint64", "str"):
        labels = y[mine] if rank == 0 else y[mine].astype(kind)
        ev = ee.Evaluator(metrics=["precision_at_1", "map_at_r"])
        ev.update(torch.from_numpy(x[mine]), labels, indices=mine)
        try:
            results.append({k: v.tolist() for k, v in ev.compute().per_query.items()})
        except ee.InputError as e:
            results.append(str(e))
    with open(out, "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()
    """
)


def test_int64_and_uint64_labels_on_two_ranks_are_gathered_as_in_one_process(tmp_path):
    # One process promotes an int64 / uint64 mix to Python ints; the gather refused it with an
    # error about "None.labels", an internal key.
    pytest.importorskip("torch")
    x, y = _data(n=60, seed=10)
    np.savez(tmp_path / "data.npz", x=x, y=y.astype(np.int64))
    _launch(tmp_path, _MIXED_LABELS_WORKER, world=2)
    want = ee.evaluate(x, y, metrics=["precision_at_1", "map_at_r"])
    for r in range(2):
        mixed, strings = json.loads((tmp_path / f"out{r}.json").read_text())
        for name in ("precision_at_1", "map_at_r"):
            np.testing.assert_array_equal(np.array(mixed[name]), want.per_query[name])
        assert strings.startswith("labels (all rows): rank 1 has") and "None" not in strings


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ci": 1.5}, "ci must be"),
        ({"n_threads": 0}, "n_threads"),
        ({"index_params": {"nprobe": 4}}, "index_params was given without index"),
        ({"reject_from": "both", "ref_includes_query": True}, "reject_from='both'"),
        ({"positives": [[0]]}, "positives"),
        ({"metrics": ["recall_at_10"], "k": 5}, r"k=5 caps the ranking at depth 5.*recall_at_10"),
        (
            {"custom_metrics": {"hits_at_5": ee.RetrievalMetric(_hit_count, depth=5)}, "k": 3},
            r"k=3 caps the ranking at depth 3.*hits_at_5",
        ),
    ],
)
def test_every_option_is_checked_when_the_evaluator_is_built(kwargs, match):
    # Used to fail only in compute(), after the whole validation epoch was accumulated.
    with pytest.raises((ee.InputError, ee.InputTypeError), match=match):
        ee.Evaluator(**kwargs)


def test_a_numpy_bool_ref_includes_query_is_accepted_when_built():
    ev = ee.Evaluator(metrics=["precision_at_1"], ref_includes_query=np.True_)
    x = np.array([[0.0], [0.1], [5.0], [5.1]])
    ev.update(x[:2], [0, 1], split="query")
    ev.update(x, [0, 1, 0, 1], split="reference")
    # query 0 (0.0) sees 0.1 (label 1), 5.0 (0), 5.1 (1): nearest is 0.1, a miss; likewise
    # query 1 (0.1) -> 0.0 (label 0), a miss: P@1 = 0 / 2
    assert ev.compute()["precision_at_1"] == 0.0
