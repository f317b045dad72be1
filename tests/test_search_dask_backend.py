"""Dask backend (``evaluate(..., backend="dask", client=...)``): equal to the local engine bit for
bit on a two-process LocalCluster, cancellation on Ctrl-C, bad input."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

distributed = pytest.importorskip(
    "distributed", reason="the Dask backend needs dask.distributed (pip install '.[dask]')"
)

from embedeval import evaluate  # noqa: E402
from embedeval.utils.errors import InputError, InputTypeError  # noqa: E402

N_REF = 40_000  # above 16 tiles: the engine multiplies in 2048-column tiles


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    )
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((N_REF, 8)).astype(np.float32)
    x[500:600] = x[:100]  # exact duplicates: tied keys
    y = rng.integers(0, 300, N_REF)
    g = rng.integers(0, 30, N_REF)
    return x, y, g


def _same(a, b):
    for name in a.per_query:
        np.testing.assert_array_equal(a.per_query[name], b.per_query[name], err_msg=name)
    assert a.n_ties == b.n_ties


def test_gallery_with_self_rows_equals_local(client, data):
    x, y, _ = data
    args = (x[:3000], y[:3000], x, y)
    local = evaluate(*args, ref_includes_query=True)
    remote = evaluate(*args, ref_includes_query=True, backend="dask", client=client)
    _same(local, remote)
    assert local.n_ties["map_at_r"] > 0


def test_leave_one_out_with_groups_equals_local(client, data):
    x, y, g = data
    kw = dict(query_groups=g[:8000], metrics=["precision_at_1", "map_at_r", "r_precision"])
    local = evaluate(x[:8000], y[:8000], **kw)
    remote = evaluate(x[:8000], y[:8000], backend="dask", client=client, **kw)
    _same(local, remote)


@pytest.mark.parametrize("n_classes", [300, 3])
def test_full_depth_map_mrr_equal_local(client, data, n_classes, monkeypatch):
    # 300 classes: the deep engine on every worker; 3 (R_q about 13,000, over a fifth of the
    # references): the candidates, as locally
    import embedeval.search.dask_backend as dask_backend

    calls = []
    real = dask_backend._deep_on_workers
    monkeypatch.setattr(dask_backend, "_deep_on_workers", lambda *a: calls.append(1) or real(*a))
    x, _, _ = data
    y = np.random.default_rng(n_classes).integers(0, n_classes, N_REF)
    kw = dict(metrics=["map", "mrr"], distance="cosine")
    local = evaluate(x[:300], y[:300], x, y, **kw)
    remote = evaluate(x[:300], y[:300], x, y, backend="dask", client=client, **kw)
    _same(local, remote)
    assert bool(calls) is (n_classes == 300)


def test_deep_rankings_on_workers_match_the_oracle(client):
    # Leave-one-out with groups, identical rows under two labels (exact ties between relevant
    # and non-relevant references) and blocks of 37 queries: each worker's deep engine starts
    # its blocks where its queries start, and every value is the brute force's.
    from tests import oracle

    rng = np.random.default_rng(13)
    x = rng.standard_normal((3000, 6)).astype(np.float32)
    x[2000:2400] = x[:400]
    y = rng.integers(0, 40, 3000)
    g = rng.integers(0, 25, 3000)
    kw = dict(metrics=["map", "precision_at_1", "map_at_r"], query_groups=g)
    remote = evaluate(x, y, backend="dask", client=client, block_size=37, **kw)
    _same(evaluate(x, y, **kw), remote)
    _, want, _ = oracle.evaluate(x, y, metrics=kw["metrics"], qg=g)
    for m in kw["metrics"]:
        np.testing.assert_allclose(remote.per_query[m], want[m], rtol=1e-12, err_msg=m)


def test_small_blocks_are_cut_where_the_engine_cuts(client, data):
    # An explicit small block size: tasks must start on block boundaries to reproduce keys.
    x, y, _ = data
    local = evaluate(x[:1000], y[:1000], x, y, block_size=37)
    remote = evaluate(x[:1000], y[:1000], x, y, block_size=37, backend="dask", client=client)
    _same(local, remote)


def test_keyboard_interrupt_cancels_futures(client, data, monkeypatch):
    import embedeval.search.dask_backend as dask_backend

    class _Bar:
        def update(self, n):
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def interrupting_bar(*args, **kwargs):
        yield _Bar()

    cancelled = []
    real_cancel = client.cancel

    def spy(futures, *args, **kwargs):
        cancelled.extend(futures)
        return real_cancel(futures, *args, **kwargs)

    monkeypatch.setattr(dask_backend, "progress_bar", interrupting_bar)
    monkeypatch.setattr(client, "cancel", spy)
    x, y, _ = data
    with pytest.raises(KeyboardInterrupt):
        evaluate(x[:4000], y[:4000], x, y, backend="dask", client=client)
    assert len(cancelled) >= 2  # every submitted task was cancelled, not only the finished one


def test_bad_client_and_combinations(client, data):
    x, y, _ = data
    args = (x[:10], y[:10], x[:100], y[:100])
    with pytest.raises(InputError, match="needs client="):
        evaluate(*args, backend="dask")
    with pytest.raises(InputTypeError, match="dask.distributed.Client"):
        evaluate(*args, backend="dask", client="tcp://localhost:8786")
    with pytest.raises(InputError, match="shards= is for the local backend"):
        evaluate(*args, backend="dask", client=client, shards=2)
    with pytest.raises(InputError, match="backend='dask' is not valid|is not valid"):
        evaluate(*args, backend="dusk", client=client)


def test_twins_are_ties_ranked_by_index_like_the_oracle(client):
    # 40,000 references drawn from 4,000 distinct Gaussian vectors: identical references must
    # share one key on every worker, so the tie rule (ascending index) decides their order.
    from tests import oracle

    rng = np.random.default_rng(12)
    base = rng.standard_normal((4000, 8)).astype(np.float32)
    x = base[rng.integers(0, 4000, N_REF)]
    y = rng.integers(0, 50, N_REF)
    kw = dict(metrics=["precision_at_1", "map_at_r", "recall_at_2"])
    local = evaluate(x[:300], y[:300], x, y, ref_includes_query=True, **kw)
    remote = evaluate(x[:300], y[:300], x, y, ref_includes_query=True, backend="dask",
                      client=client, **kw)  # fmt: skip
    _same(local, remote)
    _, want, _ = oracle.evaluate(x[:10], y[:10], x, y, ref_includes_query=True, **kw)
    for m in kw["metrics"]:
        np.testing.assert_allclose(remote.per_query[m][:10], want[m], rtol=1e-12, err_msg=m)


def test_full_depth_runs_repeated_on_the_same_data():
    # Full-depth map scatters the whole task; scattered under a key derived from its content,
    # the next run on the same data took the same key, and the scheduler, handling the
    # earlier release late, dropped it under the running tasks ("lost dependencies").
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3000, 4)).astype(np.float32)
    y = rng.integers(0, 10, 3000)
    kw = dict(metrics=["map"], progress=False)
    local = evaluate(x[:500], y[:500], x, y, **kw)
    with (
        distributed.LocalCluster(
            processes=False, n_workers=2, threads_per_worker=1, dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        for _ in range(8):
            _same(local, evaluate(x[:500], y[:500], x, y, backend="dask", client=client, **kw))


def test_a_cancelled_task_raises_its_error():
    # as_completed(with_results=True) hands a cancelled future's error over as its result
    # instead of raising it; it must not be taken for a block of values.
    import embedeval.search.dask_backend as dask_backend

    class _Client:
        def scatter(self, data, **kwargs):
            return data

        def submit(self, fn, *args, **kwargs):
            return fn

        def cancel(self, futures):
            pass

    error = distributed.client.FutureCancelledError("k", reason="lost dependencies")

    def as_completed(futures, with_results):
        yield futures[0], error

    blocks = dask_backend._on_workers(_Client(), as_completed, None, iter([(len,)]), False)
    with pytest.raises(distributed.client.FutureCancelledError, match="lost dependencies"):
        next(blocks)
