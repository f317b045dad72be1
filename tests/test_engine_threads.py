"""The engine's worker threads: results in order, items taken by free threads, a step inside a
step, a forked child."""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading

import pytest

from embedeval.engine.threads import each, in_order


def test_results_come_in_the_order_of_the_items_whatever_order_they_finish_in():
    import time

    def slow_first(i):
        time.sleep(0.05 if i == 0 else 0.0)
        return i * i

    assert list(in_order(slow_first, range(6), 3)) == [(i, i * i) for i in range(6)]


def test_a_step_inside_a_step_runs_in_its_worker_thread_and_returns_in_order():
    def inner(i):
        names = []

        def leaf(j):
            names.append(threading.current_thread().name)
            return i * 10 + j

        values = [v for _, v in in_order(leaf, range(3), 2)]
        return values, set(names)

    out = list(in_order(inner, range(4), 2))
    assert [v for _, (v, _) in out] == [[i * 10 + j for j in range(3)] for i in range(4)]
    for _, (_, names) in out:
        assert len(names) == 1  # the worker that ran the outer step, nothing more


def test_an_error_in_a_step_reaches_the_caller():
    def fail_on_two(i):
        if i == 2:
            raise ValueError("step 2")
        return i

    with pytest.raises(ValueError, match="step 2"):
        list(in_order(fail_on_two, range(5), 2))
    assert list(in_order(lambda i: i + 1, range(3), 2)) == [(0, 1), (1, 2), (2, 3)]


def test_each_lets_a_free_thread_take_the_next_item_while_another_runs_long():

    release = threading.Event()
    finished = []

    def step(i):
        if i == 0:  # runs until every other item has ended on the other thread
            assert release.wait(10), "the other items waited for the first one"
        finished.append(i)
        if len(finished) == 5:
            release.set()

    each(step, range(6), 2)
    assert sorted(finished) == list(range(6)) and finished[-1] == 0


def test_each_raises_the_first_error_and_starts_nothing_after_it():
    started = []

    def fail_on_one(i):
        import time

        started.append(i)
        time.sleep(0.01)
        if i == 1:
            raise ValueError("item 1")

    with pytest.raises(ValueError, match="item 1"):
        each(fail_on_one, range(50), 2)
    assert len(started) < 50  # the items still queued were cancelled
    seen = []
    each(seen.append, range(3), 1)  # one thread: inline, in order
    assert seen == [0, 1, 2]


def _child(out):
    out.put([v for _, v in in_order(lambda i: i * 3, range(5), 2)])


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_a_forked_child_starts_threads_of_its_own():
    list(in_order(lambda i: i, range(4), 2))  # the parent's pool exists before the fork
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=_child, args=(out,))
    proc.start()
    proc.join(30)
    alive = proc.is_alive()
    if alive:
        proc.kill()
    assert not alive, "the child waited for threads it does not have"
    assert out.get(timeout=5) == [0, 3, 6, 9, 12]


def _engine_threads():
    return [t for t in threading.enumerate() if t.name.startswith("embedeval-engine")]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_idle_engine_threads_are_joined_before_a_fork():
    # the pool outlives a call (no fresh threads per parallel step), but not a fork: the
    # child would not have those threads, and Python warns about forking with threads running
    list(in_order(lambda i: i, range(4), 2))
    assert _engine_threads()
    pid = os.fork()
    if pid == 0:  # the child: runs in parallel on threads of its own, then leaves at once
        os._exit(0 if [v for _, v in in_order(lambda i: i + 1, range(3), 2)] == [1, 2, 3] else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not _engine_threads()
    assert list(in_order(lambda i: -i, range(3), 2)) == [(0, 0), (1, -1), (2, -2)]


def test_one_idle_pool_at_most():
    from embedeval.engine import threads

    list(in_order(lambda i: i, range(6), 3))
    list(in_order(lambda i: i, range(6), 2))
    assert sorted(threads._POOLS) == [2]


def test_thread_cap_limits_faiss_and_the_engine_default_then_restores_them():
    import faiss

    from embedeval.engine.threads import default_threads, thread_cap

    before, engine_before = faiss.omp_get_max_threads(), default_threads()
    with thread_cap(1, [faiss]):
        assert (faiss.omp_get_max_threads(), default_threads()) == (1, 1)
    assert (faiss.omp_get_max_threads(), default_threads()) == (before, engine_before)
    with pytest.raises(RuntimeError), thread_cap(3, [faiss]):
        raise RuntimeError  # restored on an error too
    assert faiss.omp_get_max_threads() == before


@pytest.mark.parametrize(
    ("options", "module", "library"),
    [
        ({"index": "IVF4,Flat", "k": 5}, "embedeval.search.approximate", "faiss"),
        ({"backend": "torch", "device": "cpu"}, "embedeval.search.torch_backend", "torch"),
    ],
)
def test_n_threads_reaches_the_libraries_a_backend_runs_on(monkeypatch, options, module, library):
    import importlib

    import numpy as np

    import embedeval as ee
    from embedeval.engine.threads import default_threads

    lib = pytest.importorskip(library)
    get = lib.omp_get_max_threads if library == "faiss" else lib.get_num_threads
    put = lib.omp_set_num_threads if library == "faiss" else lib.set_num_threads
    old = get()
    put(2)  # a library setting the cap must lower, whatever the machine's cores
    backend = importlib.import_module(module)
    seen = []

    def spy(task, opts):
        seen.append((get(), default_threads()))
        return (yield from real(task, opts))

    real = backend.search
    monkeypatch.setattr(backend, "search", spy)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((200, 8)).astype(np.float32), rng.integers(0, 10, 200)
    try:
        ee.evaluate(x, y, metrics=["precision_at_1"], n_threads=1, progress=False, **options)
        assert seen == [(1, 1)] and get() == 2
    finally:
        put(old)


def test_n_threads_with_a_dask_cluster_is_refused():
    import numpy as np

    import embedeval as ee

    x = np.eye(4, dtype=np.float32)
    with pytest.raises(ee.InputError, match=r"n_threads=2 .* --nthreads"):
        ee.evaluate(x, np.arange(4) % 2, backend="dask", client=object(), n_threads=2)


def test_neighbors_n_threads_reaches_torch(monkeypatch):
    import numpy as np

    import embedeval as ee
    from embedeval.search import torch_backend

    torch = pytest.importorskip("torch")
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    seen = []

    def spy(*args):
        seen.append(torch.get_num_threads())
        return real(*args)

    real = torch_backend.torch_neighbors
    monkeypatch.setattr(torch_backend, "torch_neighbors", spy)
    x = np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32)
    try:
        _, idx = ee.neighbors(x, 3, backend="torch", device="cpu", n_threads=1)
        assert seen == [1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(old)
    assert np.array_equal(idx, ee.neighbors(x, 3)[1])
