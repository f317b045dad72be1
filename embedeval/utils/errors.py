"""Exceptions and warnings raised by embedeval.

Every bad-input error is an :class:`InputError`, which is also a :class:`ValueError`, so
``except ValueError`` keeps working for callers that do not know this package.  Messages name the
argument, state the rule, echo what was found and say how to fix it.
"""

from __future__ import annotations


class EmbedevalError(Exception):
    """Base class of every exception raised on purpose by embedeval."""


class InputError(EmbedevalError, ValueError):
    """An argument has a bad value, shape, dtype or content."""


class InputTypeError(EmbedevalError, TypeError):
    """An argument has a type embedeval cannot use (for example an object array)."""


class FileFormatError(InputError):
    """A file cannot be read as embeddings (unknown extension, pickle, missing key, ...)."""


class EmbedevalWarning(UserWarning):
    """A result is valid but deserves attention (all queries lone, heavy ties, ...)."""
