"""Shared helpers of the benchmark scripts: seeded data and a child-process runner.

Every measurement runs in a fresh Python process so that its peak resident memory (``ru_maxrss``)
is its own; the parent prints wall time, peak memory and ratios.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time

import numpy as np


def make_data(case: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Seeded float32, d=128, L2-normalised embeddings with class structure."""
    rng = np.random.default_rng(seed)
    d = 128
    if case == "sop":  # 60,000 vectors in ~11,000 classes of 2..8 (mean ~5.5), like SOP's test set
        sizes = []
        while sum(sizes) < 60_000:
            sizes.append(int(rng.integers(2, 10)))
        sizes[-1] -= sum(sizes) - 60_000
        sizes = [s for s in sizes if s > 0]
        spread = 4.0
    elif case == "large":  # 20,000 vectors in 5 classes of 4,000
        sizes = [4_000] * 5
        spread = 9.0
    elif case == "map":  # 10,000 vectors in 100 classes of 100
        sizes = [100] * 100
        spread = 6.0
    elif case == "separated":  # 40,000 vectors in classes of 6 far apart: every value is 1
        sizes = [6] * 6_666 + [4]
        spread = 0.15
    else:
        raise ValueError(case)
    labels = np.repeat(np.arange(len(sizes)), sizes)
    centers = rng.standard_normal((len(sizes), d)).astype(np.float32)
    x = centers[labels] + spread * rng.standard_normal((labels.size, d)).astype(np.float32) / 3
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    perm = rng.permutation(labels.size)
    return np.ascontiguousarray(x[perm]), labels[perm].astype(np.int64)


def make_split(case: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded query / gallery cases shaped like the re-identification and hashing protocols.

    * ``reid``: 3,368 queries x 15,913 gallery, d=2,048 (Market-1501's shape), 751 identities
      over 6 cameras; a query excludes the gallery images of its identity and camera (the
      groups are identity x camera).
    * ``hashing``: 5,000 queries x 50,000 database items, d=64, 10 classes (CIFAR-10-like
      hashing protocol).
    * ``hashing_dups``: ``hashing`` with duplicates, as real databases have them: 2,500
      database items are copies of others (half of them with another label: exact ties
      between relevant and non-relevant items) and 100 queries are copies of database items.
    * ``hashing_codes``: ``hashing`` as 64-bit binary codes in ``{-1, 1}``, the sign of a seeded
      random projection (what deep-hashing protocols rank; 65 distances, ties everywhere).
    """
    rng = np.random.default_rng(seed)
    if case == "reid":
        n_q, n_g, d, n_id, spread = 3_368, 15_913, 2_048, 751, 10.0
    elif case in ("hashing", "hashing_dups", "hashing_codes"):
        n_q, n_g, d, n_id, spread = 5_000, 50_000, 64, 10, 6.0
    else:
        raise ValueError(case)
    centers = rng.standard_normal((n_id, d)).astype(np.float32)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        ids = rng.integers(0, n_id, n)
        x = centers[ids] + spread * rng.standard_normal((n, d)).astype(np.float32) / 3
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return np.ascontiguousarray(x), ids.astype(np.int64)

    xq, yq = draw(n_q)
    xr, yr = draw(n_g)
    out = {"xq": xq, "yq": yq, "xr": xr, "yr": yr}
    if case == "reid":
        out["gq"] = yq * 6 + rng.integers(0, 6, n_q)
        out["gr"] = yr * 6 + rng.integers(0, 6, n_g)
    if case == "hashing_codes":
        projection = rng.standard_normal((d, 64)).astype(np.float32)
        for side in ("xq", "xr"):
            out[side] = np.where(out[side] @ projection >= 0, 1.0, -1.0).astype(np.float32)
    if case == "hashing_dups":
        src, dst = rng.choice(n_g, 2_500, replace=False), rng.choice(n_g, 2_500, replace=False)
        xr[dst] = xr[src]
        other = rng.random(2_500) < 0.5
        yr[dst] = np.where(other, (yr[src] + rng.integers(1, n_id, 2_500)) % n_id, yr[src])
        at = rng.choice(n_q, 100, replace=False)
        xq[at] = xr[rng.choice(n_g, 100, replace=False)]
    return out


def peak_rss_mb() -> float:
    import resource

    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024


def child_setup() -> tuple[dict[str, str], str]:
    """Environment and working directory of a child: the repository root first on the path."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env, root


def run_child(module: str, *args: str) -> dict:
    """Run ``python -m module args`` and parse the JSON line it prints last."""
    env, root = child_setup()
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, env=env, cwd=root
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rss_parts_mb() -> dict[str, float]:
    """The current resident memory split as the kernel counts it (``/proc/self/status``):
    ``RssAnon`` (private, allocated), ``RssFile`` (pages of mapped files, including a
    memory-mapped data file, reclaimable when clean) and ``RssShmem``."""
    parts = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("RssAnon:", "RssFile:", "RssShmem:")):
                key, value = line.split(":", 1)
                parts[key] = int(value.split()[0]) / 1024
    return parts


class PeakSampler:
    """Largest ``RssAnon`` and ``RssFile`` seen while the block runs, sampled every
    ``interval`` seconds by a background thread (``ru_maxrss`` gives only their peak sum)."""

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval
        self.peak_anon_mb = 0.0
        self.peak_file_mb = 0.0

    def _sample(self) -> None:
        parts = rss_parts_mb()
        self.peak_anon_mb = max(self.peak_anon_mb, parts.get("RssAnon", 0.0))
        self.peak_file_mb = max(self.peak_file_mb, parts.get("RssFile", 0.0))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> PeakSampler:
        import threading

        self._sample()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


class Timer:
    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start
