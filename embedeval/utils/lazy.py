"""Submodules of a folder imported on first attribute access (PEP 562), so ``import embedeval``
stays cheap while ``ee.metrics.ranking`` works without an explicit import."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any


def lazy_modules(
    package: str, names: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Return ``__getattr__`` and ``__dir__`` for a package whose submodules load on first use.

    Examples
    --------
    >>> getattr_, dir_ = lazy_modules("embedeval.metrics", ["ranking"])
    >>> getattr_("ranking").__name__
    'embedeval.metrics.ranking'
    >>> dir_()
    ['ranking']
    """
    known = tuple(sorted(names))

    def __getattr__(name: str) -> Any:
        if name in known:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return list(known)

    return __getattr__, __dir__
