"""Worker threads of the exact engine, and the one-BLAS-thread-per-product rule.

The engine parallelises over query blocks (every numpy pass then runs on all cores, not only the
product) and multiplies with one BLAS thread per product, so that float32 keys do not depend on
the number of threads or on how BLAS would split a product.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import itertools
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = [
    "default_threads",
    "each",
    "in_order",
    "one_torch_thread",
    "single_threaded_blas",
    "thread_cap",
]

_MAX_THREADS = 8
#: The ``n_threads`` a caller gave for the search running in this context (:func:`thread_cap`).
_CAP: contextvars.ContextVar[int | None] = contextvars.ContextVar("thread_cap", default=None)
#: A library's own thread count: (module, getter, setter) of the parallel libraries a search
#: may run on besides the engine's threads.
_LIBRARY_THREADS = {
    "faiss": ("omp_get_max_threads", "omp_set_num_threads"),
    "torch": ("get_num_threads", "set_num_threads"),
}


def default_threads() -> int:
    """Worker threads the engine uses by default: the cores this process may run on (at most
    8: each thread holds its own block of working memory), or the ``n_threads`` of the
    :func:`thread_cap` around the call."""
    cap = _CAP.get()
    if cap is not None:
        return cap
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, _MAX_THREADS))


@contextlib.contextmanager
def thread_cap(n_threads: int | None, libraries: Iterable[Any] = ()) -> Iterator[None]:
    """Run a search on ``n_threads`` threads (``None``: no limit of its own), whichever parts
    run it: the engine's default thread count in this context (:func:`default_threads`, which
    the torch backend's host engines read) and the thread count of each library module in
    ``libraries`` (faiss's OpenMP threads, PyTorch's CPU threads), restored on the way out.

    A library's setting is process-wide, so another thread of the caller's that uses the same
    library meanwhile runs under the limit too.

    >>> with thread_cap(3):
    ...     default_threads()
    3
    """
    if n_threads is None:
        yield
        return
    token = _CAP.set(n_threads)
    restore = []
    try:
        for module in libraries:
            get, put = (getattr(module, name) for name in _LIBRARY_THREADS[module.__name__])
            restore.append((put, get()))
            put(n_threads)
        yield
    finally:
        for put, before in reversed(restore):
            put(before)
        _CAP.reset(token)


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


@dataclasses.dataclass
class _Pool:
    executor: concurrent.futures.ThreadPoolExecutor
    users: int = 0  # in_order calls using it now


_POOLS: dict[int, _Pool] = {}
_POOLS_LOCK = threading.Lock()
_IN_WORKER = threading.local()


@contextlib.contextmanager
def _borrowed(n_threads: int) -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    """The process's pool of ``n_threads`` engine threads, started once and kept while idle: a
    pass over a corpus runs two parallel steps per block, and starting fresh threads for each
    took about 1 % of a 2-second evaluation.  At most one pool stays idle (a pool of another
    size is started only once the idle ones are closed), and none across a fork."""
    with _POOLS_LOCK:
        pool = _POOLS.get(n_threads)
        if pool is None:
            _close_idle(wait=False)
            executor = concurrent.futures.ThreadPoolExecutor(
                n_threads, "embedeval-engine", initializer=_mark_worker
            )
            pool = _POOLS[n_threads] = _Pool(executor)
        pool.users += 1
    try:
        yield pool.executor
    finally:
        with _POOLS_LOCK:
            pool.users -= 1


def _close_idle(wait: bool) -> None:
    """Shut down the pools no call is using (the caller holds the lock)."""
    for n, pool in list(_POOLS.items()):
        if pool.users == 0:
            del _POOLS[n]
            pool.executor.shutdown(wait=wait)


def _mark_worker() -> None:
    _IN_WORKER.active = True


def _before_fork() -> None:
    """Join the idle engine threads before a fork: the child would not have them, and Python
    warns about forking a process that runs other threads."""
    if not getattr(_IN_WORKER, "active", False):  # a worker cannot join its own pool
        with _POOLS_LOCK:
            _close_idle(wait=True)


def _after_fork_in_child() -> None:
    """A forked child has none of its parent's threads (and maybe a lock another thread
    held at the fork): it starts pools of its own."""
    global _POOLS_LOCK
    _POOLS_LOCK = threading.Lock()
    _POOLS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def in_order(
    fn: Callable[[int], Any], items: Iterable[int], n_threads: int | None
) -> Iterator[tuple[int, Any]]:
    """``(item, fn(item))`` in the order of ``items``, computed by ``n_threads`` threads with at
    most ``n_threads`` results waiting, so memory stays that of a few blocks.  Called from one
    of those threads (a step inside a step), it runs in that thread: the cores are busy
    already, and a worker waiting for work queued behind it could wait forever.  For the same
    reason a step must not wait for another thread that calls this function.

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
    with _borrowed(n_threads) as pool:
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


def each(fn: Callable[[Any], Any], items: Iterable[Any], n_threads: int | None) -> None:
    """Call ``fn`` on every item on ``n_threads`` threads, each taking the next item as soon as
    it is free, and return once all are done (the results are dropped).  Unlike
    :func:`in_order`, no thread waits for a slower one before the last items: on a machine
    whose cores run at different speeds from moment to moment (a shared virtual machine), a
    step split into more items than threads ends nearly together on every core.  Called from
    an engine thread, it runs in that thread (as :func:`in_order`).  An error is raised once
    the items already running have ended; the ones not started are cancelled.

    >>> seen = []
    >>> each(seen.append, range(5), 2)
    >>> sorted(seen)
    [0, 1, 2, 3, 4]
    """
    n_threads = default_threads() if n_threads is None else n_threads
    items = list(items)
    if n_threads <= 1 or len(items) <= 1 or getattr(_IN_WORKER, "active", False):
        for item in items:
            fn(item)
        return
    with _borrowed(n_threads) as pool:
        futures = [pool.submit(fn, item) for item in items]
        try:
            concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
        finally:  # an error or Ctrl-C: start nothing more, let the running items end
            for future in futures:
                future.cancel()
            concurrent.futures.wait(futures)
        for future in futures:
            if not future.cancelled():
                future.result()  # the first error, if any
