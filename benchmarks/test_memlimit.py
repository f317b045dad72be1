"""``benchmarks._memlimit.run_limited``: a child over its memory limit is OOM-killed, one under it
completes, and the group is removed afterwards (skipped where no memory cgroup is writable)."""

from __future__ import annotations

import os
import sys

import pytest

from benchmarks._memlimit import memory_cgroup, run_limited

pytestmark = pytest.mark.skipif(memory_cgroup() is None, reason="no writable memory cgroup")


def test_within_the_limit_completes():
    r = run_limited([sys.executable, "-c", "a = bytearray(20 * 2**20); print(len(a))"], 200)
    assert r.completed and r.stdout.strip() == str(20 * 2**20)
    assert r.oom_kills == 0 and r.peak_mb is not None and 20 < r.peak_mb <= 200
    assert not os.path.exists(r.path)


def test_over_the_limit_is_killed():
    code = "a = bytearray(400 * 2**20); print(len(a))"  # bytearray touches every page
    r = run_limited([sys.executable, "-c", code], 150)
    assert not r.completed and r.oom_kills >= 1 and r.returncode < 0
    assert not os.path.exists(r.path)
