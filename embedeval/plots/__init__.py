"""Matplotlib figures drawn from the arrays they are given (no metric is computed here).

Every function takes an optional ``ax``, returns the Figure and imports matplotlib on first use.
This folder sits just above :mod:`embedeval.utils`, so the statistics modules can offer ``.plot()``
on their results without importing anything above them.
"""

from .draw import *  # noqa: F403  (the figures are this folder's public names)
from .draw import __all__ as __all__
