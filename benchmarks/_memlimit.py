"""Run a child process under a hard memory limit (a Linux memory cgroup, v1 or v2).

``run_limited(argv, limit_mb)`` creates a fresh memory cgroup with the limit, starts the child
inside it (it joins the group between fork and exec, so every page it ever touches is charged
there), waits, reads the group's peak usage and OOM-kill count, and removes the group.  The limit
covers what the kernel charges to the group: anonymous memory *and* the page cache the child
faults in (the pages of a memory-mapped file it reads), which the kernel reclaims under the limit
instead of killing, as long as they are clean.  So a child that streams a memory-mapped file
larger than the limit completes, while one that allocates more than the limit is OOM-killed.

Needs root (or a delegated cgroup) and a writable memory controller:

* cgroup v1: ``/sys/fs/cgroup/memory`` (``memory.limit_in_bytes``, ``memory.memsw.limit_in_bytes``
  when swap accounting is on, ``memory.max_usage_in_bytes``, ``oom_kill`` in
  ``memory.oom_control``);
* cgroup v2: a ``cgroup2`` mount whose ``cgroup.controllers`` lists ``memory`` (``memory.max``,
  ``memory.swap.max``, ``memory.peak``, ``oom_kill`` in ``memory.events``).

``memory_cgroup()`` says which one is usable here (``None`` when neither is).
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from dataclasses import dataclass

V1_ROOT = "/sys/fs/cgroup/memory"


class MemoryLimitUnavailable(RuntimeError):
    """No writable memory cgroup on this machine (not root, or no memory controller)."""


@dataclass
class LimitedRun:
    """What ``run_limited`` saw: the child's exit and the group's accounting."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float
    limit_mb: float
    peak_mb: float | None  # the group's peak charge (anonymous + page cache), None if unknown
    oom_kills: int
    cgroup: str  # "v1" or "v2"
    path: str  # the group's directory (removed again)
    timed_out: bool = False

    @property
    def completed(self) -> bool:
        return self.returncode == 0 and self.oom_kills == 0 and not self.timed_out


def _cgroup2_mount() -> str | None:
    try:
        with open("/proc/mounts") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 3 and parts[2] == "cgroup2":
                    return parts[1]
    except OSError:
        pass
    return None


def memory_cgroup() -> tuple[str, str] | None:
    """``("v1", "/sys/fs/cgroup/memory")``, ``("v2", mount)`` or ``None``: where a memory-limited
    group can be created (v1 is preferred when both are mounted, as on hybrid hosts whose v2
    mount carries no controller)."""
    if os.path.isfile(os.path.join(V1_ROOT, "memory.limit_in_bytes")) and os.access(
        V1_ROOT, os.W_OK
    ):
        return "v1", V1_ROOT
    mount = _cgroup2_mount()
    if mount is not None:
        try:
            with open(os.path.join(mount, "cgroup.controllers")) as fh:
                controllers = fh.read().split()
        except OSError:
            controllers = []
        if "memory" in controllers and os.access(mount, os.W_OK):
            return "v2", mount
    return None


def _write(path: str, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def _field(text: str | None, name: str) -> int:
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return int(value)
    return 0


def _create_group(version: str, root: str, limit: int) -> str:
    path = os.path.join(root, f"embedeval-bench-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    if version == "v2":
        # The controller must be enabled for the root's children before a child group has it.
        control = os.path.join(root, "cgroup.subtree_control")
        if "memory" not in (_read(control) or "").split():
            _write(control, "+memory")
    os.mkdir(path)
    try:
        if version == "v1":
            _write(os.path.join(path, "memory.limit_in_bytes"), str(limit))
            swap = os.path.join(path, "memory.memsw.limit_in_bytes")
            if os.path.exists(swap):  # no swapping out of the limit either
                _write(swap, str(limit))
        else:
            _write(os.path.join(path, "memory.max"), str(limit))
            swap = os.path.join(path, "memory.swap.max")
            if os.path.exists(swap):
                _write(swap, "0")
    except OSError:
        os.rmdir(path)
        raise
    return path


def _remove_group(path: str) -> None:
    # Page cache still charged to the group moves to its parent when the group is removed; a
    # group whose last process is still exiting is busy for a moment.
    for _ in range(50):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


def run_limited(
    argv: list[str],
    limit_mb: float,
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    timeout: float | None = None,
) -> LimitedRun:
    """Run ``argv`` to completion inside a new memory cgroup limited to ``limit_mb`` MiB.

    Raises :class:`MemoryLimitUnavailable` when no memory cgroup can be created here.  A child
    killed by the OOM killer has a negative ``returncode`` (-9) and ``oom_kills >= 1``.
    """
    where = memory_cgroup()
    if where is None:
        raise MemoryLimitUnavailable(
            "no writable memory cgroup (needs root and a v1 memory controller or a v2 mount "
            "with the memory controller)"
        )
    version, root = where
    limit = int(limit_mb * 2**20)
    try:
        path = _create_group(version, root, limit)
    except OSError as exc:
        raise MemoryLimitUnavailable(f"cannot create a memory cgroup under {root}: {exc}") from exc
    procs = os.path.join(path, "cgroup.procs")

    def join_group() -> None:  # runs in the child between fork and exec
        _write(procs, str(os.getpid()))

    timed_out = False
    start = time.perf_counter()
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=cwd,
            preexec_fn=join_group,  # safe: the benchmark parents run no other threads
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            timed_out = True
        seconds = time.perf_counter() - start
        if version == "v1":
            peak_raw = _read(os.path.join(path, "memory.max_usage_in_bytes"))
            oom = _field(_read(os.path.join(path, "memory.oom_control")), "oom_kill")
        else:
            peak_raw = _read(os.path.join(path, "memory.peak"))
            oom = _field(_read(os.path.join(path, "memory.events")), "oom_kill")
        peak = int(peak_raw) / 2**20 if peak_raw and peak_raw.strip().isdigit() else None
    finally:
        _remove_group(path)
    return LimitedRun(
        returncode=proc.returncode,
        stdout=out,
        stderr=err,
        seconds=seconds,
        limit_mb=limit / 2**20,
        peak_mb=peak,
        oom_kills=oom,
        cgroup=version,
        path=path,
        timed_out=timed_out,
    )
