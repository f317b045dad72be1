"""Worker threads of the exact engine, and the one-BLAS-thread-per-product rule.

The engine parallelises over query blocks (every numpy pass then runs on all cores, not only the
product) and multiplies with one BLAS thread per product, so that float32 keys do not depend on
the number of threads or on how BLAS would split a product.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import itertools
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["default_threads", "in_order", "one_torch_thread", "single_threaded_blas"]

_MAX_THREADS = 8


def default_threads() -> int:
    """Worker threads the engine uses by default: the cores this process may run on (at most
    8: each thread holds its own block of working memory)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, _MAX_THREADS))


_BLAS_LOCK = threading.Lock()
_BLAS_STATE: dict[str, Any] = {"users": 0, "controller": None, "limiter": None}


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Limit BLAS to one thread per call while the engine runs.

    The engine parallelises over query blocks instead (every numpy pass then runs on all cores,
    not only the product), and a product's float32 rounding depends on how BLAS splits it among
    threads: with one thread per product, keys — hence ties and values — do not depend on the
    machine's core count or on ``n_threads``, and distributed workers reproduce them.  The limit
    is process-wide (that is how BLAS libraries work), so it is reference-counted: concurrent
    runs in one process (user threads, a Dask worker's threads) keep it until the last one ends,
    and the caller's setting comes back then.
    """
    with _BLAS_LOCK:
        if _BLAS_STATE["users"] == 0:
            if _BLAS_STATE["controller"] is None:
                from threadpoolctl import ThreadpoolController

                _BLAS_STATE["controller"] = ThreadpoolController()
            _BLAS_STATE["limiter"] = _BLAS_STATE["controller"].limit(limits=1, user_api="blas")
        _BLAS_STATE["users"] += 1
    try:
        yield
    finally:
        with _BLAS_LOCK:
            _BLAS_STATE["users"] -= 1
            if _BLAS_STATE["users"] == 0:
                _BLAS_STATE["limiter"].restore_original_limits()
                _BLAS_STATE["limiter"] = None


@contextlib.contextmanager
def one_torch_thread(torch: Any) -> Iterator[None]:
    """PyTorch's CPU operations in the calling thread on one thread of their own.

    The engine's worker threads already keep every core busy: a bfloat16 product that also
    splits itself over every core (PyTorch's default) runs two workers' products on four
    threads over two cores: measured 1.45x slower per 1,024 x 1,024 tile than one thread each.
    OpenMP keeps the setting per thread (and as the default of threads started meanwhile), so
    it is restored on the way out.
    """
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


_POOLS: dict[int, concurrent.futures.ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()
_POOLS_PID = [os.getpid()]
_IN_WORKER = threading.local()


def _pool(n_threads: int) -> concurrent.futures.ThreadPoolExecutor:
    """The process's pool of ``n_threads`` engine threads, started once: a pass over a corpus
    runs two parallel steps per block, and starting fresh threads for each took about 1 % of
    a 2-second evaluation.  A forked child starts its own (the parent's threads are not in it)."""
    with _POOLS_LOCK:
        if _POOLS_PID[0] != os.getpid():
            _POOLS.clear()
            _POOLS_PID[0] = os.getpid()
        pool = _POOLS.get(n_threads)
        if pool is None:
            pool = concurrent.futures.ThreadPoolExecutor(
                n_threads, "embedeval-engine", initializer=_mark_worker
            )
            _POOLS[n_threads] = pool
        return pool


def _mark_worker() -> None:
    _IN_WORKER.active = True


def in_order(
    fn: Callable[[int], Any], items: Iterable[int], n_threads: int | None
) -> Iterator[tuple[int, Any]]:
    """``(item, fn(item))`` in the order of ``items``, computed by ``n_threads`` threads with at
    most ``n_threads`` results waiting, so memory stays that of a few blocks.  Called from one
    of those threads (a step inside a step), it runs in that thread: the cores are busy
    already, and a worker waiting for work queued behind it could wait forever.

    >>> list(in_order(lambda i: i * i, range(4), 2))
    [(0, 0), (1, 1), (2, 4), (3, 9)]
    """
    n_threads = default_threads() if n_threads is None else n_threads
    items = list(items)
    if n_threads <= 1 or len(items) <= 1 or getattr(_IN_WORKER, "active", False):
        for item in items:
            yield item, fn(item)
        return
    waiting: collections.deque = collections.deque()
    feed = iter(items)
    pool = _pool(n_threads)
    try:
        for item in itertools.islice(feed, n_threads):
            waiting.append((item, pool.submit(fn, item)))
        while waiting:
            item, future = waiting.popleft()
            result = future.result()
            for nxt in itertools.islice(feed, 1):
                waiting.append((nxt, pool.submit(fn, nxt)))
            yield item, result
    finally:
        # An error, Ctrl-C or an abandoned generator: start no further block, and let the
        # ones already running end before returning (their buffers are the caller's).
        for _, future in waiting:
            future.cancel()
        concurrent.futures.wait([f for _, f in waiting])
