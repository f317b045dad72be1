"""Search backends behind one interface (``search(task, options)`` yielding scored blocks): the
local engine, shards, Dask, an approximate faiss index and PyTorch; their options; and the public
:func:`~embedeval.search.neighbors.neighbors`."""

from ..utils.lazy import lazy_modules

__getattr__, __dir__ = lazy_modules(__name__, __path__)
