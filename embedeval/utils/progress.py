"""A dependency-free progress bar on stderr, shown only when stderr is a terminal."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager


class _Bar:
    def __init__(self, total: int, unit: str, enabled: bool) -> None:
        self.total, self.unit, self.enabled = total, unit, enabled
        self.done = 0
        self.start = time.perf_counter()
        self._last = 0.0

    def update(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self._last < 0.2 and self.done < self.total:
            return
        self._last = now
        frac = self.done / self.total if self.total else 1.0
        elapsed = now - self.start
        eta = elapsed * (1 - frac) / frac if frac > 0 else 0.0
        filled = int(30 * frac)
        sys.stderr.write(
            f"\r[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} {self.unit} "
            f"{elapsed:5.1f}s elapsed, {eta:5.1f}s left "
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.done:
            sys.stderr.write("\n")
            sys.stderr.flush()


@contextmanager
def progress_bar(total: int, unit: str, *, enabled: bool | None = None) -> Iterator[_Bar]:
    """Yield a bar with ``update(n)``; ``enabled=None`` means "only if stderr is a terminal"."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    bar = _Bar(total, unit, bool(enabled))
    try:
        yield bar
    finally:
        bar.close()
