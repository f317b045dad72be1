"""Submodules of a folder imported on first attribute access (PEP 562), so ``import embedeval``
stays cheap while ``ee.metrics.ranking`` works without an explicit import."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable
from typing import Any


def lazy_modules(
    package: str, path: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Return ``__getattr__`` and ``__dir__`` for a package whose submodules load on first use.

    ``path`` is the package's ``__path__``: every module found there is offered, so a new
    module needs no registration.

    Examples
    --------
    >>> import embedeval.metrics as m
    >>> getattr_, dir_ = lazy_modules(m.__name__, m.__path__)
    >>> getattr_("ranking").__name__
    'embedeval.metrics.ranking'
    >>> "ranking" in dir_()
    True
    """
    known = tuple(sorted(info.name for info in pkgutil.iter_modules(list(path))))

    def __getattr__(name: str) -> Any:
        if name in known:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return list(known)

    return __getattr__, __dir__
