"""The PyTorch backend (``backend="torch"``), run on the CPU: against the brute-force oracle and
bit for bit against the local engine on small-integer data (exact float32 keys, many ties and
duplicate vectors); GPU-only checks are skipped where no CUDA device is present."""

import dataclasses
import importlib
import math
import subprocess
import sys
import warnings

import numpy as np
import pytest

import embedeval as ee
from embedeval.utils.errors import InputError, InputTypeError

from . import oracle

torch = pytest.importorskip("torch")

from embedeval.engine import torch_kernels as tk  # noqa: E402
from embedeval.search import torch_backend as tb  # noqa: E402

METRICS = [
    "precision_at_1",
    "r_precision",
    "map_at_r",
    "map",
    "mrr",
    "recall_at_1",
    "recall_at_3",
    "precision_at_3",
]
WITH_MINP = [*METRICS, "minp"]  # re-id mINP: compared with the local engine
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (none is visible to torch)")
TORCH_BACKEND = importlib.import_module("embedeval.search.torch_backend")
LOCAL_DEEP = tb._local_deep
PREPARE = tb._prepare


@pytest.fixture(autouse=True)
def whole_rows_for_deep_rankings_too(monkeypatch):
    # The tests here exercise this backend's own pipeline (what a GPU runs), which on the CPU
    # hands full-depth rankings to the local deep engine (see the test right below).
    monkeypatch.setattr(tb, "_local_deep", lambda task, device: False)


@pytest.mark.parametrize("distance", ["euclidean", "inner_product"])
def test_full_depth_rankings_on_the_cpu_take_the_local_deep_engine(monkeypatch, distance):
    # full-depth map / mINP with few relevant references per row: the local deep engine, with
    # its own filter, the brute force's values; many relevant references (three classes):
    # this backend's pipeline
    monkeypatch.setattr(tb, "_local_deep", LOCAL_DEEP)
    x, y = int_data(21, 900, 60, dim=4, distance=distance)
    x = x + np.float32(0.25)  # not integers: the float64 filter
    kw = dict(metrics=["map", "precision_at_1"], distance=distance, backend="torch", device="cpu")
    got = ev(x[:80], y[:80], x, y, ref_includes_query=True, **kw)
    assert got.settings["torch"]["engine"] == "local deep"
    assert got.settings["torch"]["precision"] == "float64"
    _, want = oracle.summary(x[:80], y[:80], x, y, metrics=kw["metrics"], distance=distance,
                             ref_includes_query=True)  # fmt: skip
    for m in kw["metrics"]:
        np.testing.assert_allclose(got.per_query[m], want[m], rtol=1e-12, atol=0, err_msg=m)
    few = ev(x[:80], y[:80] % 3, x, y % 3, ref_includes_query=True, **kw)
    assert few.settings["torch"]["engine"] == "whole rows"
    # binary codes (exact keys) with groups and a bfloat16 request: the local deep engine too,
    # the local run's values
    codes = np.sign(np.random.default_rng(22).standard_normal((900, 16))).astype(np.float32)
    g = np.random.default_rng(23).integers(0, 7, 900)
    kw.update(query_groups=g[:80], reference_groups=g, precision="bf16")
    got = ev(codes[:80], y[:80], codes, y, **kw)
    assert got.settings["torch"]["engine"] == "local deep"
    kw = {k: v for k, v in kw.items() if k not in ("backend", "device", "precision")}
    assert_same(got, ev(codes[:80], y[:80], codes, y, **kw), kw["metrics"])


def ev(*args, **kw):
    kw.setdefault("progress", False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ee.evaluate(*args, **kw)


def int_data(seed, n, n_classes, dim=3, distance="euclidean"):
    """Small-integer vectors (exact float32 keys), about a tenth of them exact copies.

    For cosine every row has 1 or 4 non-zero entries of +-1, so the normalised entries are
    +-1 or +-0.5 and every cosine is an exact multiple of 1/4.
    """
    rng = np.random.default_rng(seed)
    if distance == "cosine":
        x = np.zeros((n, dim + 3), dtype=np.float32)
        for i in range(n):
            nz = rng.choice(dim + 3, 4 if rng.random() < 0.6 else 1, replace=False)
            x[i, nz] = rng.choice([-1.0, 1.0], nz.size)
    else:
        x = rng.integers(-2, 3, (n, dim)).astype(np.float32)
    copies = rng.choice(n, n // 10, replace=False)
    x[copies] = x[rng.choice(n, copies.size)]
    return x, rng.integers(0, n_classes, n)


def assert_same(a, b, names):
    for m in names:
        np.testing.assert_array_equal(a.per_query[m], b.per_query[m], err_msg=m)
        assert a.n_ties[m] == b.n_ties[m], m
        assert a[m] == b[m] or (math.isnan(a[m]) and math.isnan(b[m])), m


SETUPS = {
    "loo": lambda x, y, rng: dict(),
    "split": lambda x, y, rng: dict(reference=x[40:], reference_labels=y[40:], q=slice(0, 40)),
    "ref_includes_query": lambda x, y, rng: dict(
        reference=x, reference_labels=y, ref_includes_query=True, q=slice(0, 50)
    ),
    "groups": lambda x, y, rng: dict(query_groups=rng.integers(0, 6, x.shape[0])),
    "ref_includes_query_groups": lambda x, y, rng: dict(
        reference=x,
        reference_labels=y,
        ref_includes_query=True,
        q=slice(0, 50),
        query_groups=rng.integers(0, 5, 50),
        reference_groups=rng.integers(0, 5, x.shape[0]),  # own row often in another group
    ),
    "split_groups": lambda x, y, rng: dict(
        reference=x[40:],
        reference_labels=y[40:],
        q=slice(0, 40),
        query_groups=rng.integers(0, 4, 40),
        reference_groups=rng.integers(0, 4, x.shape[0] - 40),
    ),
}


def _call(x, y, setup, seed, **kw):
    opts = SETUPS[setup](x, y, np.random.default_rng(seed + 1))
    q = opts.pop("q", slice(None))
    return x[q], y[q], opts, kw


@pytest.mark.parametrize("setup", list(SETUPS))
@pytest.mark.parametrize("distance", ["euclidean", "cosine", "inner_product"])
@pytest.mark.parametrize("k", [None, 4, "max_bin_count"])
def test_matches_the_oracle(setup, distance, k):
    x, y = int_data(3, 110, 9, distance=distance)
    xq, yq, opts, _ = _call(x, y, setup, 3)
    got = ev(xq, yq, metrics=METRICS, k=k, distance=distance, backend="torch", device="cpu", **opts)
    groups = {"qg": opts.get("query_groups"), "rg": opts.get("reference_groups")}
    _, expected, _ = oracle.evaluate(
        xq,
        yq,
        opts.get("reference"),
        opts.get("reference_labels"),
        metrics=METRICS,
        k=k,
        distance=distance,
        ref_includes_query=opts.get("ref_includes_query", False),
        **groups,
    )
    for m, values in expected.items():
        np.testing.assert_allclose(got.per_query[m], values, rtol=0, atol=1e-12, err_msg=m)


@pytest.mark.parametrize("setup", list(SETUPS))
@pytest.mark.parametrize("distance", ["euclidean", "cosine", "inner_product"])
@pytest.mark.parametrize("k", [None, 2, 7, "max_bin_count"])
def test_bit_identical_to_the_local_engine(setup, distance, k):
    average = "macro" if setup in ("split", "groups") else "micro"
    x, y = int_data(5, 160, 12, distance=distance)
    xq, yq, opts, _ = _call(x, y, setup, 5)
    names = METRICS if k != 2 else ["precision_at_1", "r_precision", "map_at_r", "map", "mrr"]
    if k is None:
        names = [*names, "minp"]
    kw = dict(metrics=names, k=k, distance=distance, average=average, **opts)
    assert_same(ev(xq, yq, backend="torch", device="cpu", **kw), ev(xq, yq, **kw), names)


@pytest.mark.parametrize("setup", ["loo", "split", "ref_includes_query", "groups"])
@pytest.mark.parametrize("distance", ["euclidean", "cosine", "inner_product"])
def test_torch_products_bit_identical_on_exact_data(monkeypatch, setup, distance):
    """The GPU's code path: keys from torch's own product (on the CPU here)."""
    x, y = int_data(6, 160, 12, distance=distance)
    xq, yq, opts, _ = _call(x, y, setup, 6)
    kw = dict(metrics=WITH_MINP, distance=distance, **opts)
    expected = ev(xq, yq, **kw)
    _force(monkeypatch, engine_keys=False)
    assert_same(ev(xq, yq, backend="torch", device="cpu", **kw), expected, WITH_MINP)


@pytest.mark.parametrize("distance", ["euclidean", "cosine", "inner_product"])
@pytest.mark.parametrize("k", [None, 5])
def test_bit_identical_to_the_local_engine_on_real_valued_data(distance, k):
    """On the CPU the keys come from the local engine's own products, so even values that hinge
    on float32 rounding (deep windows of large classes) agree exactly."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((700, 12)).astype(np.float32)
    y = rng.integers(0, 4, 700)  # R ~ 175: deep windows, many near-ties
    groups = rng.integers(0, 9, 700)
    for kw in ({}, {"query_groups": groups}, {"reference": x, "reference_labels": y}):
        kw = dict(metrics=METRICS, distance=distance, k=k, **kw)
        assert_same(ev(x, y, backend="torch", device="cpu", **kw), ev(x, y, **kw), METRICS)


def _force(monkeypatch, **changes):
    run = TORCH_BACKEND.torch_blocks
    monkeypatch.setattr(
        TORCH_BACKEND, "torch_blocks", lambda task, o: run(task, dataclasses.replace(o, **changes))
    )


@pytest.mark.parametrize("setup", ["loo", "split_groups"])
def test_column_sample_cut_offs_small_blocks_and_host_kernels(monkeypatch, setup):
    """A 32-column sample (so most cut-offs come from it, some too short and redone), blocks of
    7 queries, and the numpy kernels on the device's candidates: the same values."""
    x, y = int_data(8, 400, 40, dim=4)
    xq, yq, opts, _ = _call(x, y, setup, 8)
    expected = ev(xq, yq, metrics=METRICS, **opts)
    monkeypatch.setattr(tb, "_SAMPLE", 32)
    got = ev(xq, yq, metrics=METRICS, backend="torch", device="cpu", block_size=7, **opts)
    assert_same(got, expected, METRICS)
    _force(monkeypatch, kernels="numpy")
    assert_same(
        ev(xq, yq, metrics=METRICS, backend="torch", device="cpu", **opts), expected, METRICS
    )


def test_short_cut_offs_are_redone_exactly(monkeypatch):
    """Cut-offs that keep nothing (as a sample might, very rarely): every row is redone with its
    exact order statistic, one row per sort, and nothing changes."""
    x, y = int_data(9, 150, 10)
    expected = ev(x, y, metrics=METRICS)
    monkeypatch.setattr(
        tb, "_thresholds", lambda torch, keys, *a: torch.full((keys.shape[0],), -math.inf)
    )
    monkeypatch.setattr(tb, "_budget", lambda *a: 4 * 16 * 150)  # one row per exact sort
    got = ev(x, y, metrics=METRICS, backend="torch", device="cpu", block_size=64)
    assert_same(got, expected, METRICS)


def test_loose_cut_offs_are_cut_back_to_the_exact_order_statistic():
    """A cut-off that keeps every key (as a column sample keeps several times the depth): the
    block's candidates are those at or below the need-th smallest key of their row widened by
    the band, raised to the widened label cut-off, sorted by key then index (ties kept
    whole); a plain loop over sorted rows is the oracle."""
    rng = np.random.default_rng(5)
    keys = rng.integers(0, 20, (7, 60)).astype(np.float32)  # many exact ties
    keys[2, ::2] = np.inf  # excluded: the row sees 30 keys, fewer than it needs
    need = np.array([0, 1, 40, 5, 17, 60, 3])
    label = np.array([-np.inf, 2.0, -np.inf, 19.0, 1.0, -np.inf, 30.0], np.float32)
    for label_tau in (None, label):
        got = tb._collect(
            torch, torch.from_numpy(keys), torch.full((7,), math.inf), torch.from_numpy(need),
            None if label_tau is None else torch.from_numpy(label_tau), 0, 64,
            lambda rows, tau: tau + 0.5,
        )  # fmt: skip
        for r in range(7):
            row = keys[r]
            cut = np.sort(row)[need[r] - 1] + 0.5 if need[r] else -np.inf
            cut = min(cut, np.finfo(np.float32).max)  # excluded keys (+inf) never pass
            if label_tau is not None:
                cut = max(cut, label_tau[r] + 0.5)
            want = sorted(np.flatnonzero(row <= cut).tolist(), key=lambda j: (row[j], j))
            a, e = int(got.lims[r]), int(got.lims[r + 1])
            assert got.index[a:e].tolist() == want, (r, label_tau is None)
            assert (
                got.bits[a:e].tolist() == tb._sortable(torch, torch.from_numpy(row[want])).tolist()
            )


def test_a_cut_off_short_by_less_than_the_band_is_gathered_again():
    """A sampled cut-off below the exact order statistic, but by less than the band, keeps
    at least ``need`` keys once widened, yet not the keys between its widened value and the
    exact one's: the block is gathered again under the exact cut-off.  Keys in quarters, the
    given cut-offs 0.3 below the need-th key, a band of 0.5: the keys 0.25 above the need-th
    one must be there (a plain loop is the oracle)."""
    rng = np.random.default_rng(8)
    keys = (rng.integers(0, 80, (6, 50)) / 4).astype(np.float32)
    need = np.array([1, 4, 9, 20, 33, 50])
    exact = np.sort(keys, axis=1)[np.arange(6), need - 1]
    got = tb._collect(
        torch, torch.from_numpy(keys), torch.from_numpy(exact - 0.3), torch.from_numpy(need),
        None, 0, 64, lambda rows, tau: tau + 0.5,
    )  # fmt: skip
    for r in range(6):
        row = keys[r]
        want = sorted(np.flatnonzero(row <= exact[r] + 0.5).tolist(), key=lambda j: (row[j], j))
        a, e = int(got.lims[r]), int(got.lims[r + 1])
        assert got.index[a:e].tolist() == want, r
    # the data holds such keys: the sampled cut-offs alone would have missed them
    assert (keys == (exact + 0.25)[:, None]).any(axis=1).sum() >= 3


def test_tie_counts_match_the_oracle():
    # 1-D points 0, -1, 1, 10, 11 labelled 0, 0, 1, 1, 5:
    # q0 sees -1 (label 0) and 1 (label 1) both at distance 1: by index -1 first, P@1 = 1, and a
    # mixed tie block straddles rank 1 (the one tie).  q1 -> 0 hit; q2 -> 0 miss; q3 -> 11
    # miss; q4 is the only label 5: lone.
    x = np.array([[0.0], [-1.0], [1.0], [10.0], [11.0]], dtype=np.float32)
    y = [0, 0, 1, 1, 5]
    res = ev(x, y, metrics=["precision_at_1"], backend="torch", device="cpu")
    np.testing.assert_array_equal(res.per_query["precision_at_1"], [1.0, 1.0, 0.0, 0.0, np.nan])
    assert res.n_ties["precision_at_1"] == 1
    ranks = oracle.rankings(x, y)
    assert sum(oracle.tie_straddles(rel, d, 1) for rel, d in ranks if sum(rel)) == 1


def test_identical_real_valued_references_rank_by_index():
    """Real-valued (not exactly representable) vectors, each stored twice: the two copies tie
    and the lower index comes first, whatever position the product rounds them in."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal((300, 24)).astype(np.float32)
    ref = np.concatenate([base, base])[rng.permutation(600)]
    queries = rng.standard_normal((50, 24)).astype(np.float32)
    for distance in ("euclidean", "cosine", "inner_product"):
        d, i = ee.neighbors(queries, 2, ref, distance=distance, backend="torch", device="cpu")
        assert (ref[i[:, 0]] == ref[i[:, 1]]).all()
        assert (i[:, 0] < i[:, 1]).all()
        assert (d[:, 0] == d[:, 1]).all()


@pytest.mark.parametrize("distance", ["euclidean", "cosine", "inner_product"])
def test_neighbors_match_the_oracle_and_the_local_engine(distance):
    x, _ = int_data(11, 90, 5, distance=distance)
    d, i = ee.neighbors(x, 6, distance=distance, backend="torch", device="cpu")
    d0, i0 = ee.neighbors(x, 6, distance=distance)
    np.testing.assert_array_equal(i, i0)
    np.testing.assert_array_equal(d, d0)
    scores = oracle.pairwise(x, x, distance)
    for q in range(x.shape[0]):
        order = sorted((j for j in range(x.shape[0]) if j != q), key=lambda j: (scores[q, j], j))
        assert i[q].tolist() == order[:6]
        sign = 1 if distance == "euclidean" else -1
        np.testing.assert_allclose(d[q], sign * scores[q, order[:6]], rtol=1e-6, atol=1e-6)


def test_neighbors_on_a_gallery_with_exclude_self():
    x, _ = int_data(12, 60, 3)
    got = ee.neighbors(x[:20], 5, x, exclude_self=True, backend="torch", device="cpu")
    want = ee.neighbors(x[:20], 5, x, exclude_self=True)
    np.testing.assert_array_equal(got[1], want[1])
    assert ee.neighbors(x[:3], 100, x[:5], backend="torch", device="cpu")[1].shape == (3, 5)


def test_lone_queries_confidences_and_ci_follow_the_local_engine():
    x, y = int_data(13, 120, 30)
    y[:5] = 1000 + np.arange(5)  # five lone queries
    conf = np.random.default_rng(0).random(120)
    kw = dict(metrics=METRICS, confidences=conf, ci=0.9, n_boot=50)
    got = ev(x, y, backend="torch", device="cpu", **kw)
    want = ev(x, y, **kw)
    assert_same(got, want, METRICS)
    assert got.n_lone == want.n_lone >= 5
    assert got.confidence == want.confidence
    assert got.ci == want.ci


def test_custom_metrics_are_scored_on_the_host_from_the_device_ranking():
    def precision_at_4(relevant, n_relevant):  # relevant: (queries, 4) hits in rank order
        return relevant.sum(axis=1) / 4.0

    x, y = int_data(17, 150, 10)
    custom = {"mine": ee.RetrievalMetric(precision_at_4, depth=4)}
    kw = dict(metrics=["map_at_r", "precision_at_4"], custom_metrics=custom)
    got = ev(x, y, backend="torch", device="cpu", **kw)
    assert_same(got, ev(x, y, **kw), ["map_at_r", "precision_at_4", "mine"])
    np.testing.assert_array_equal(got.per_query["mine"], got.per_query["precision_at_4"])


def test_half_precision_and_tensor_inputs_are_upcast():
    x, y = int_data(14, 100, 8)
    want = ev(x, y, metrics=METRICS)
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        got = ev(torch.from_numpy(x).to(dtype), y, metrics=METRICS, backend="torch", device="cpu")
        assert_same(got, want, METRICS)


def test_a_tiny_memory_budget_gives_the_same_values():
    x, y = int_data(15, 200, 10)
    want = ev(x, y, metrics=METRICS)
    got = ev(x, y, metrics=METRICS, backend="torch", device="cpu", device_memory=1 << 20)
    assert_same(got, want, METRICS)


def test_tf32_setting_is_restored():
    x, y = int_data(16, 50, 5)
    x = x + 0.5  # not integers: the exact float32 keys of small integers would keep TF32 off
    flag = (
        "fp32_precision" if hasattr(torch.backends.cuda.matmul, "fp32_precision") else "allow_tf32"
    )
    before = getattr(torch.backends.cuda.matmul, flag)
    seen = []
    run = tk.DeviceKernels.score

    def spy(self, block):
        seen.append(getattr(torch.backends.cuda.matmul, flag))
        return run(self, block)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tk.DeviceKernels, "score", spy)
        for asked in ({"tf32": True}, {"precision": "tf32"}):
            # TF32 is a CUDA mode: a CPU multiplies in float32, says so, and leaves it off
            got = ev(x, y, backend="torch", device="cpu", **asked)
            assert seen[-1] in ("ieee", False)
            assert got.settings["torch"]["precision"] == "float32"
        ev(x, y, backend="torch", device="cpu")
        assert seen[-1] in ("ieee", False)  # off by default
        mp.setattr(tb, "_search_precision", lambda *a: "tf32")  # "auto" on a recent GPU
        ev(x, y, backend="torch", device="cpu")
        assert seen[-1] in ("tf32", True)  # chosen, not asked for: on as well
        keys = tb._Search.keys

        def spy_keys(self, *a, **k):
            seen.append(getattr(torch.backends.cuda.matmul, flag))
            return keys(self, *a, **k)

        mp.setattr(tb._Search, "keys", spy_keys)
        ee.neighbors(x, 3, backend="torch", device="cpu")
        assert seen[-1] in ("tf32", True)  # the neighbour search alike
    assert getattr(torch.backends.cuda.matmul, flag) == before


@pytest.mark.parametrize("precision", ["float32", "bf16"])
def test_corpus_product_never_reuses_the_copy_of_a_freed_block(precision):
    # each block is a fresh array freed before the next one exists, as a second pass over the
    # corpus meets its first block after the first pass's last: Python may give the new
    # array the freed one's id, and the product must still multiply the new rows
    product = tb.torch_product("cpu", precision)
    rng = np.random.default_rng(1)
    q = rng.integers(-3, 4, (8, 16)).astype(np.float32)
    rows = rng.integers(-3, 4, (900, 16)).astype(np.float32)
    for start in range(0, 900, 30):  # views of the corpus, as the scan's blocks are
        blk = rows[start : start + 30]
        np.testing.assert_array_equal(product(q, blk), q @ blk.T)  # small integers: exact
        del blk


def test_corpus_products_on_threads_restore_the_settings_they_found():
    # the corpus scan's threads share one product: the first in sets the matmul settings, the
    # last out restores what the user had (here the opposite of what the product sets)
    import threading

    matmul = torch.backends.cuda.matmul
    flag = "fp32_precision" if hasattr(matmul, "fp32_precision") else "allow_tf32"
    before = getattr(matmul, flag)
    user = "tf32" if flag == "fp32_precision" else True
    setattr(matmul, flag, user)
    try:
        product = tb.torch_product("cpu", "float32")
        rng = np.random.default_rng(0)
        q = rng.integers(-3, 4, (64, 16)).astype(np.float32)
        blk = rng.integers(-3, 4, (300, 16)).astype(np.float32)
        errors = []

        def work():
            try:
                for _ in range(100):
                    np.testing.assert_array_equal(product(q, blk), q @ blk.T)  # exact: integers
            except AssertionError as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert getattr(matmul, flag) == user
    finally:
        setattr(matmul, flag, before)


# ------------------------------------------------------------------------------ bad input


def test_import_and_local_engine_never_import_torch():
    code = (
        "import sys, numpy as np, embedeval as ee; "
        "ee.evaluate(np.eye(4, dtype='float32'), [0, 0, 1, 1], progress=False); "
        "ee.neighbors(np.eye(4), 2); assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_torch_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(InputError, match="pip install torch"):
        ev(np.eye(3), [0, 0, 1], backend="torch", device="cpu")


@pytest.mark.parametrize("device", ["gpu0", "cuda:x", "tpu"])
def test_bad_device_string(device):
    with pytest.raises(InputError, match="device"):
        ev(np.eye(3), [0, 0, 1], backend="torch", device=device)


@pytest.mark.parametrize("device", ["mps", "meta", "xpu", "xla"])
def test_device_types_other_than_cpu_and_cuda_are_refused_before_the_search(device):
    with pytest.raises(InputError, match=rf"device='{device}'.*'cpu', 'cuda'"):
        ev(np.eye(3), [0, 0, 1], backend="torch", device=device)
    with pytest.raises(InputError, match=rf"device='{device}'"):
        ee.neighbors(np.eye(3, dtype=np.float32), 1, backend="torch", device=device)


@pytest.mark.skipif(CUDA, reason="checks the message when no CUDA GPU is present")
def test_cuda_without_a_gpu_says_so():
    with pytest.raises(InputError, match="no CUDA GPU"):
        ev(np.eye(3), [0, 0, 1], backend="torch", device="cuda")


def test_bad_options():
    x, y = np.eye(3), [0, 0, 1]
    with pytest.raises(InputTypeError, match="tf32"):
        ev(x, y, backend="torch", device="cpu", tf32="yes")
    with pytest.raises(InputError, match="device_memory"):
        ev(x, y, backend="torch", device="cpu", device_memory=5)
    with pytest.raises(InputError, match="backend='torch'"):
        ev(x, y, device="cpu")
    with pytest.raises(InputError, match="shards"):
        ev(x, y, backend="torch", device="cpu", shards=2)
    with pytest.raises(InputTypeError, match="query"):
        ev(torch.ones(3, 2, dtype=torch.complex64), y, backend="torch", device="cpu")
    with pytest.raises(InputError, match="backend"):
        ee.neighbors(x, 1, backend="gpu")


# ------------------------------------------------------------------------------ GPU only


@needs_cuda
def test_cuda_tensors_are_evaluated_on_their_gpu_without_a_backend():
    x, y = int_data(20, 300, 20)
    want = ev(x, y, metrics=METRICS)
    got = ev(torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda(), metrics=METRICS)
    assert_same(got, want, METRICS)
    split = ev(
        torch.from_numpy(x[:50]).cuda(), y[:50], x, y, metrics=METRICS, ref_includes_query=True
    )
    assert_same(split, ev(x[:50], y[:50], x, y, metrics=METRICS, ref_includes_query=True), METRICS)


@needs_cuda
def test_cuda_bit_identical_to_the_local_engine():
    x, y = int_data(21, 2000, 50, dim=4)
    groups = np.random.default_rng(0).integers(0, 7, 2000)
    for kw in ({}, {"k": 5}, {"query_groups": groups}, {"distance": "inner_product"}):
        want = ev(x, y, metrics=METRICS, **kw)
        assert_same(ev(x, y, metrics=METRICS, backend="torch", device="cuda", **kw), want, METRICS)


@needs_cuda
def test_cuda_integer_tensors_are_refused():
    with pytest.raises(InputTypeError, match="floating point"):
        ev(torch.ones(4, 2, dtype=torch.int64, device="cuda"), [0, 0, 1, 1])


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"backend": "torch", "device": "cpu", "precision": "fp8"}, "precision"),
        ({"precision": "bf16"}, "backend='torch'"),
        ({"backend": "torch", "device": "cpu", "tf32": True, "precision": "bf16"}, "tf32"),
    ],
)
def test_precision_option_is_checked(options, words):
    x = np.eye(4, dtype=np.float32)
    with pytest.raises(InputError, match=words):
        ee.evaluate(x, np.array([0, 0, 1, 1]), **options)


def test_bf16_filter_gives_the_float32_filter_values_on_clustered_data():
    """The filter's precision changes which candidates are re-scored, never a value: both
    equal a float64 brute force (independent loop) on data with duplicates."""
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 40, 600)
    x = (rng.standard_normal((40, 32))[labels] + 0.4 * rng.standard_normal((600, 32))).astype(
        np.float32
    )
    x[300:320] = x[:20]  # duplicated rows, some across labels
    options = {"metrics": ["precision_at_1", "map_at_r"], "backend": "torch", "device": "cpu"}
    runs = [ee.evaluate(x, labels, precision=p, **options) for p in ("float32", "bf16")]
    d = ((x[:, None, :].astype(np.float64) - x[None, :, :]) ** 2).sum(-1)
    p1 = []
    for i in range(x.shape[0]):
        order = [j for j in np.lexsort((np.arange(600), d[i])) if j != i]
        p1.append(float(labels[order[0]] == labels[i]))
    for res in runs:
        np.testing.assert_array_equal(res.per_query["precision_at_1"], p1)
    np.testing.assert_array_equal(runs[0].per_query["map_at_r"], runs[1].per_query["map_at_r"])


def test_cosine_duplicate_groups_are_exact_multiples():
    # (1, 1, 0) and (3, 3, 0) are one direction (their float32 unit rows differ in the last
    # bit), (-3, -3, 0) is not; the last two rows are one float32 step apart in one coordinate
    # and have the same float32 unit row, yet different float64 cosines: not a group
    from embedeval.search.torch_backend import _directions, _duplicate_rows, _normalize

    near = np.float32([-1.0717402, 0.08650638, -1.9918329, 0.8990633, 0.5023496, -0.66447455,
                       -0.8412369, -0.20012608])  # fmt: skip
    other = near.copy()
    other[6] = np.float32(-0.8412368)
    ones = np.float32([1, 1, 0, 0, 0, 0, 0, 0])
    x = torch.from_numpy(np.vstack([ones, near, 3 * ones, other, -3 * ones]))
    unit = _normalize(torch, x, "x")
    assert torch.equal(unit[1], unit[3]) and not torch.equal(unit[0], unit[2])
    members, first = _duplicate_rows(torch, _directions(x))
    assert members.tolist() == [2] and first.tolist() == [0]


def _gpu_path(monkeypatch, **changes):
    """The code path a GPU runs, on the CPU: torch's own products (no local-engine keys, no
    local symmetric engine) and the float64 decision on the device."""
    monkeypatch.setattr(TORCH_BACKEND, "_local_symmetric", lambda task, device: False)
    _force(monkeypatch, engine_keys=False, device_decision=True, **changes)


@pytest.mark.parametrize("setup", list(SETUPS))
@pytest.mark.parametrize("distance", ["euclidean", "cosine", "inner_product"])
@pytest.mark.parametrize("precision", ["float32", "bf16"])
def test_device_decision_bit_identical_on_exact_data(monkeypatch, setup, distance, precision):
    """Small integers (exact ties, duplicates, cosine multiples): the float64 decision made on
    the device gives the local engine's values and tie counts."""
    x, y = int_data(9, 170, 12, distance=distance)
    xq, yq, opts, _ = _call(x, y, setup, 9)
    kw = dict(metrics=WITH_MINP, distance=distance, **opts)
    expected = ev(xq, yq, **kw)
    _gpu_path(monkeypatch)
    got = ev(xq, yq, backend="torch", device="cpu", precision=precision, **kw)
    assert_same(got, expected, WITH_MINP)


@pytest.mark.parametrize("distance", ["euclidean", "cosine", "inner_product"])
@pytest.mark.parametrize("kernels", ["torch", "numpy"])
def test_device_decision_on_real_valued_data_equals_the_oracle(monkeypatch, distance, kernels):
    """Deep windows of large classes (many near-ties) far from the origin, blocks of 64 queries
    and a dense re-scoring (every candidate of a block): the float64 brute force's values."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((600, 10)) * 0.05 + 40.0).astype(np.float32)
    y = rng.integers(0, 3, 600)
    _gpu_path(monkeypatch, block_size=64, kernels=kernels)
    for precision in ("float32", "bf16"):
        got = ev(x, y, metrics=METRICS, distance=distance, backend="torch", device="cpu",
                 precision=precision)  # fmt: skip
        _, expected, _ = oracle.evaluate(x, y, None, None, metrics=METRICS, distance=distance)
        for m, values in expected.items():
            np.testing.assert_allclose(got.per_query[m], values, rtol=0, atol=1e-12, err_msg=m)


def test_device_decision_neighbors_in_float64_order(monkeypatch):
    rng = np.random.default_rng(12)
    x = rng.integers(-2, 3, (300, 3)).astype(np.float32)
    _gpu_path(monkeypatch)
    d, i = ee.neighbors(x[:50], 6, x, backend="torch", device="cpu")
    b = x.astype(np.float64)
    for row in range(50):
        d2 = ((b - b[row]) ** 2).sum(axis=1)
        order = np.argsort(d2, kind="stable")[:6]
        assert i[row].tolist() == order.tolist()
        np.testing.assert_array_equal(d[row], np.sqrt(d2[order]).astype(np.float32))


@pytest.mark.parametrize("distance", ["euclidean", "cosine", "inner_product"])
def test_device_decision_orders_references_one_float32_step_apart(monkeypatch, distance):
    """Each query has, at the top of its ranking and deeper, a reference and its copy with one
    coordinate one float32 step away, of different labels: only float64 keys order them."""
    rng = np.random.default_rng(13)
    n_q, dim = 24, 8
    xq = rng.standard_normal((n_q, dim)).astype(np.float32)
    yq = np.arange(n_q) % 5
    refs, labels = [rng.standard_normal((300, dim)).astype(np.float32)], [np.full(300, 7)]
    for i in range(n_q):
        for scale in (0.999, 0.3):
            a = (xq[i] * scale + rng.normal(0, 0.05, dim)).astype(np.float32)
            b = a.copy()
            j = int(rng.integers(dim))
            b[j] = np.nextafter(b[j], np.float32(rng.choice([-np.inf, np.inf])))
            refs.append(np.stack([a, b]))
            pair = [yq[i], 6] if rng.random() < 0.5 else [6, yq[i]]
            labels.append(np.array(pair))
    xb, yb = np.concatenate(refs), np.concatenate(labels)
    _gpu_path(monkeypatch)
    names = ["precision_at_1", "map_at_r", "map", "mrr"]
    got = ev(xq, yq, xb, yb, metrics=names, distance=distance, backend="torch", device="cpu",
             precision="float32")  # fmt: skip
    _, expected, _ = oracle.evaluate(xq, yq, xb, yb, metrics=names, distance=distance)
    for m, values in expected.items():
        np.testing.assert_allclose(got.per_query[m], values, rtol=0, atol=1e-12, err_msg=m)


def test_device_decision_ties_positive_multiples_under_cosine(monkeypatch):
    """Rows that are positive multiples (x 3, x 5, x 0.75) of earlier rows tie exactly under
    cosine and rank by index, whatever the rounding of their float64 products."""
    rng = np.random.default_rng(14)
    base = rng.integers(-3, 4, (120, 4)).astype(np.float32)
    base[np.abs(base).sum(axis=1) == 0, 0] = 1.0
    x = np.concatenate([base, base[:60] * 3, base[30:90] * 5, base[::2] * 0.75])
    y = rng.integers(0, 6, x.shape[0])
    kw = dict(metrics=WITH_MINP, distance="cosine", reference=x, reference_labels=y)
    expected = ev(x[:80], y[:80], **kw)
    _gpu_path(monkeypatch)
    assert_same(ev(x[:80], y[:80], backend="torch", device="cpu", **kw), expected, WITH_MINP)


def _spy_band_checks(monkeypatch):
    """Record each block's verdict of the coarse-filter check."""
    verdicts = []
    check = TORCH_BACKEND._band_too_wide

    def spy(*args):
        verdicts.append(check(*args))
        return verdicts[-1]

    monkeypatch.setattr(TORCH_BACKEND, "_band_too_wide", spy)
    return verdicts


def test_a_block_whose_bf16_band_is_too_wide_is_filtered_again_in_float32(monkeypatch):
    """Dense real-valued data (R ~ 1,200 of 6,000): a bfloat16 band would hold hundreds of keys
    per row beyond the cut-off, so blocks fall back to float32; values stay the local
    engine's."""
    rng = np.random.default_rng(15)
    x = rng.standard_normal((6000, 64)).astype(np.float32)
    y = rng.integers(0, 5, 6000)
    names = ["precision_at_1", "r_precision", "map_at_r"]
    expected = ev(x[:300], y[:300], x, y, metrics=names, ref_includes_query=True)
    for decide_here in (False, True):
        with pytest.MonkeyPatch.context() as mp:
            verdicts = _spy_band_checks(mp)
            _force(mp, engine_keys=False, device_decision=decide_here, block_size=30)
            got = ev(x[:300], y[:300], x, y, metrics=names, ref_includes_query=True,
                     backend="torch", device="cpu", precision="bf16")  # fmt: skip
        # ten blocks: the first falls back, the next seven skip the coarse product, the
        # ninth tries it again and falls back
        assert verdicts == [True, True]
        assert got.settings["torch"]["blocks"] == {"float32": 10}
        assert got.settings["torch"]["decision"] == ("device" if decide_here else "host")
        assert_same(got, expected, names)


def test_a_narrow_bf16_band_keeps_the_bf16_filter(monkeypatch):
    """Tight classes far apart (SOP-like: a few members each): the bfloat16 band holds almost
    nothing beyond the cut-off, so no block falls back."""
    rng = np.random.default_rng(16)
    centres = rng.standard_normal((300, 32)) * 10
    y = np.repeat(np.arange(300), 4)
    x = (centres[y] + rng.standard_normal((1200, 32)) * 0.01).astype(np.float32)
    verdicts = _spy_band_checks(monkeypatch)
    _force(monkeypatch, engine_keys=False, block_size=400)
    names = ["precision_at_1", "map_at_r"]
    got = ev(x[:800], y[:800], x, y, metrics=names, ref_includes_query=True, backend="torch",
             device="cpu", precision="bf16")  # fmt: skip
    assert verdicts == [False, False]
    assert got.settings["backend"] == "torch"
    assert got.settings["torch"] == {
        "device": "cpu", "precision": "bf16", "engine": "whole rows", "decision": "host",
        "blocks": {"bf16": 2},
    }  # fmt: skip
    want = ev(x[:800], y[:800], x, y, metrics=names, ref_includes_query=True)
    assert want.settings["backend"] == "local" and "torch" not in want.settings
    assert_same(got, want, names)


@pytest.mark.parametrize("distance", ["euclidean", "inner_product"])
def test_fixed_order_keys_on_the_device_are_the_hosts_bit_for_bit(distance):
    from embedeval.engine.decide import exact_keys
    from embedeval.engine.torch_decide import fixed_order_keys

    rng = np.random.default_rng(17)
    for x in (
        rng.standard_normal((300, 37)).astype(np.float32),
        (rng.standard_normal((300, 37)) * 1e-3 + 250.0).astype(np.float32),
        (rng.standard_normal((300, 37)) * np.exp(rng.normal(0, 8, (300, 37)))).astype(np.float32),
    ):
        qi, ri = rng.integers(0, 300, 5000), rng.integers(0, 300, 5000)
        want = exact_keys(x[qi], x[ri], distance)
        xt = torch.from_numpy(x)
        got = fixed_order_keys(torch, xt, xt, torch.from_numpy(qi), torch.from_numpy(ri),
                               distance, chunk=777).numpy()  # fmt: skip
        np.testing.assert_array_equal(got, want)


def test_auto_filters_in_tf32_on_a_gpu_that_has_it(monkeypatch):
    # on a GPU the product is a small part of the search and bfloat16's wider band costs more
    # than it saves: "auto" is TF32 from compute capability 8.0 on, float32 before (resolved
    # without a GPU: the capability is faked); a precision asked for stays
    for capability, want in (((9, 0), "tf32"), ((8, 0), "tf32"), ((7, 5), "float32")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d, c=capability: c)
        for name in ("cuda", "cuda:1"):
            assert tb.resolve_precision(torch, "auto", torch.device(name)) == want
            assert tb.resolve_precision(torch, "bf16", torch.device(name)) == "bf16"


def test_auto_filters_with_bf16_on_the_cpu_only_for_shallow_one_sided_searches():
    """precision="auto" on the CPU: bfloat16 (where oneDNN has it) for a shallow query /
    reference search; float32 for leave-one-out (the local symmetric engine) and for deep or
    full-depth rankings, where a bfloat16 band costs more in float64 decisions than it saves."""
    native = torch.backends.mkldnn.is_available() and bool(
        torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )
    x, y = int_data(18, 400, 40, dim=4)
    x = x + 0.5  # not integers, whose exact float32 keys "auto" takes over any band
    runs = {
        "shallow split": (dict(reference=x, reference_labels=y, ref_includes_query=True),
                          ["precision_at_1", "recall_at_10"], "bf16" if native else "float32"),
        "deep split": (dict(reference=x, reference_labels=y, ref_includes_query=True),
                       ["map"], "float32"),
        "window deeper than 16": (dict(reference=x, reference_labels=y, ref_includes_query=True),
                                  ["precision_at_20"], "float32"),
    }  # fmt: skip
    for name, (kw, names, expected) in runs.items():
        got = ev(x[:60], y[:60], metrics=names, backend="torch", device="cpu", **kw)
        assert got.settings["torch"]["precision"] == expected, name
        assert_same(got, ev(x[:60], y[:60], metrics=names, **kw), names)
    # leave-one-out without identical rows: the local symmetric engine, in float32
    z = np.random.default_rng(18).standard_normal((300, 8)).astype(np.float32)
    got = ev(z, y[:300], metrics=["precision_at_1"], backend="torch", device="cpu")
    assert got.settings["torch"]["engine"] == "local symmetric"
    assert got.settings["torch"]["precision"] == "float32"


def test_cosine_rows_of_subnormal_values_in_the_torch_pipeline(monkeypatch):
    # The pipeline a GPU runs, with float32 products on its own normalised rows: a row of
    # subnormal values whose float32 norm would keep too few bits.  Exact cosines with q = (1, 0)
    # (by hand): row 1 at 0.569 beats row 0 at 20 / sqrt(1241) = 0.5677.
    monkeypatch.setattr(
        tb, "_prepare", lambda t, task, dev, engine, p="float32": PREPARE(t, task, dev, None, p)
    )
    t = np.float32(2.0**-149)
    rng = np.random.default_rng(0)
    fill = np.c_[rng.uniform(-1, 0.3, 3000), rng.uniform(0.5, 1, 3000)]
    x = np.vstack([[[20 * t, 29 * t], [0.569, np.sqrt(1 - 0.569**2)]], fill]).astype(np.float32)
    _, idx = ee.neighbors(np.float32([[1, 0]]), 1, x, distance="cosine", backend="torch",
                          device="cpu", precision="float32")  # fmt: skip
    assert idx[0].tolist() == [1]


class _OnDevice:
    """A CPU tensor that reports a CUDA device (for :func:`tb._low_keys`'s choice of path)."""

    device = dataclasses.make_dataclass("D", [("type", str)])("cuda")

    def __init__(self, t):
        self.t = t

    def __neg__(self):
        return _OnDevice(-self.t)

    @property
    def T(self):
        return _OnDevice(self.t.T)


@pytest.mark.parametrize("error", [TypeError("unexpected keyword 'out_dtype'"), "oom"])
def test_bf16_keys_fall_back_to_four_passes_only_where_out_dtype_is_missing(monkeypatch, error):
    monkeypatch.setattr(tb, "_NO_OUT_DTYPE", set())
    if error == "oom":
        error = torch.cuda.OutOfMemoryError("CUDA out of memory")
    tried = []

    def mm(a, b, out_dtype=None):
        if out_dtype is not None:
            tried.append(1)
            raise error
        return torch.mm(a.t, b.t)

    fake = dataclasses.make_dataclass("T", ["mm", "float32"])(mm, torch.float32)
    q, r = torch.randn(3, 4).bfloat16(), torch.randn(5, 4).bfloat16()
    if isinstance(error, torch.cuda.OutOfMemoryError):  # the device's own error: raised
        with pytest.raises(torch.cuda.OutOfMemoryError):
            tb._low_keys(fake, _OnDevice(q), _OnDevice(r), None)
        assert tb._NO_OUT_DTYPE == set()
        return
    for _ in range(2):  # tried once, then the four passes straight away
        keys = tb._low_keys(fake, _OnDevice(q), _OnDevice(r), None)
        # the four passes by hand: the bfloat16 product, negated
        np.testing.assert_array_equal(keys.numpy(), -torch.mm(q, r.T).float().numpy())
    assert tried == [1] and tb._NO_OUT_DTYPE == {"mm"}


def test_read_only_inputs_raise_no_warning():
    # a loaded .npy or a memory map is read-only: torch.from_numpy warns about such arrays,
    # which the backend only reads
    rng = np.random.default_rng(5)
    ref = rng.standard_normal((40, 4)).astype(np.float32)
    ref.flags.writeable = False
    labels = np.arange(40) % 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = ee.evaluate(ref[:10], labels[:10], ref, labels, backend="torch", device="cpu")
    want = ee.evaluate(ref[:10], labels[:10], ref, labels)
    for m, values in want.per_query.items():
        np.testing.assert_array_equal(got.per_query[m], values)
