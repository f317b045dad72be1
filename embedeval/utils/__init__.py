"""Foundations every layer may use: error classes, argument checks, atomic file writes, progress
bars, gathering across processes and the version.  Nothing here imports another folder."""

from .lazy import lazy_modules

__getattr__, __dir__ = lazy_modules(__name__, __path__)
