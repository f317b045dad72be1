"""A Lightning callback that evaluates the validation embeddings every validation epoch.

Requires the optional ``lightning`` package (``pip install lightning``).  The module's
``validation_step`` returns the batch's embeddings and labels; the callback accumulates them in
an :class:`embedeval.Evaluator`, evaluates at the end of the epoch (gathering every process's
rows under DDP, de-duplicated by ``indices`` when given) and logs flat ``{prefix + metric:
value}`` numbers (float64: the result's own floats) with ``LightningModule.log_dict``, where
``ModelCheckpoint(monitor=...)`` and the loggers find them.

Several validation dataloaders are evaluated separately, each as its own set, and logged
under Lightning's per-dataloader names: ``val/map_at_r/dataloader_idx_0``,
``val/map_at_r/dataloader_idx_1``, ... (the suffix ``self.log`` adds in ``validation_step``).
With one dataloader the names carry no suffix.  The exception is a query/gallery split: rows
returned with ``"split"`` (``"query"`` / ``"reference"``) form one evaluation whichever
dataloader they come from (queries from one loader, the gallery from another), logged without
a suffix.

Example
-------
::

    from embedeval.integrations.lightning import EmbeddingEvaluation

    class Model(L.LightningModule):
        def validation_step(self, batch, batch_idx):
            x, y, idx = batch
            return {"embeddings": self(x), "labels": y, "indices": idx}

    callback = EmbeddingEvaluation(metrics=["precision_at_1", "map_at_r"], distance="cosine")
    checkpoint = ModelCheckpoint(monitor="val/map_at_r", mode=callback.evaluator.mode)
    L.Trainer(callbacks=[callback, checkpoint]).fit(Model(), train_loader, val_loader)
"""

from __future__ import annotations

import copy
from typing import Any

from ..evaluation.evaluator import Evaluator
from ..utils.errors import InputError

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone ``pytorch_lightning`` distribution
    try:
        from pytorch_lightning.callbacks import Callback
    except ImportError as exc:
        raise ImportError(
            "embedeval.integrations.lightning needs Lightning: pip install lightning"
        ) from exc

__all__ = ["EmbeddingEvaluation"]

_UPDATE_KEYS = ("split", "indices", "groups", "confidences")


class EmbeddingEvaluation(Callback):
    """Evaluate validation embeddings with embedeval at the end of every validation epoch.

    Parameters
    ----------
    evaluator : Evaluator, optional
        The accumulator to use; by default one is built from ``**options``.  With several
        validation dataloaders each gets a fresh copy of it (same settings).
    prefix : str
        Put before every logged name (``"val/"`` gives ``"val/map_at_r"``).
    **options :
        Keyword arguments of :class:`embedeval.Evaluator` (``metrics``, ``k``, ``distance``,
        ``primary_metric``, ...), checked here, before any training.

    Notes
    -----
    ``validation_step`` must return a dict with ``"embeddings"`` and ``"labels"``, and may add
    ``"indices"`` (dataset positions: rows a ``DistributedSampler`` repeats are then counted
    once), ``"split"`` (``"query"`` / ``"reference"``), ``"groups"`` and ``"confidences"``.  The
    sanity-check batches Lightning runs before training are not evaluated.

    With several validation dataloaders, each is evaluated on its own rows (its ``indices`` are
    positions in its own dataset) and its metrics are logged as ``prefix + metric +
    "/dataloader_idx_N"``, as Lightning names what ``validation_step`` logs.  Rows returned
    with a ``"split"`` form one query/gallery evaluation across the dataloaders, logged without
    the suffix.  :attr:`results` maps the dataloader index (``None`` for a single dataloader or
    for the split) to the latest result; :attr:`result` is that result when there is only one.
    """

    def __init__(
        self, evaluator: Evaluator | None = None, *, prefix: str = "val/", **options: Any
    ) -> None:
        super().__init__()
        if evaluator is not None and options:
            raise InputError("pass either an Evaluator or its options, not both.")
        self.evaluator = evaluator if evaluator is not None else Evaluator(**options)
        self.prefix = prefix
        self.results: dict[int | None, Any] = {}
        self._loaders: dict[int, Evaluator] = {}

    @property
    def result(self) -> Any:
        """The latest result when one evaluation ran per epoch (else None: see :attr:`results`)."""
        return next(iter(self.results.values())) if len(self.results) == 1 else None

    def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.evaluator.reset()
        self._loaders = {}

    def on_validation_batch_end(
        self,
        trainer: Any,
        pl_module: Any,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int | None = None,
    ) -> None:
        # Lightning passes dataloader_idx only when there are several validation dataloaders.
        if trainer.sanity_checking:
            return
        _check_outputs(outputs)
        extra = {k: outputs[k] for k in _UPDATE_KEYS if k in outputs}
        key = None if outputs.get("split") is not None else dataloader_idx
        self._evaluator(key).update(outputs["embeddings"], outputs["labels"], **extra)

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        local = [k for k, ev in self._loaders.items() if ev.n_rows] + (
            [None] if self.evaluator.n_rows else []
        )
        keys = _agreed_keys(local)
        if not keys:
            return
        self.results = {}
        for key in keys:  # the same keys in the same order on every rank: compute() gathers
            evaluator = self._evaluator(key)
            self.results[key] = evaluator.compute()
            # Every rank computed the same numbers from the gathered rows: nothing to reduce.
            names = _log_names(self.results[key], self.prefix, key)
            pl_module.log_dict(_exact_values(names), sync_dist=False, add_dataloader_idx=False)
            evaluator.reset()

    def _evaluator(self, key: int | None) -> Evaluator:
        """The accumulator of dataloader ``key`` (None: the one evaluation of a single
        dataloader or of a query/gallery split), a fresh copy of :attr:`evaluator` if new."""
        if key is None:
            return self.evaluator
        if key not in self._loaders:
            fresh = copy.copy(self.evaluator)
            fresh.reset()  # its own buffers: the copy shares only the settings
            self._loaders[key] = fresh
        return self._loaders[key]


def _log_names(result: Any, prefix: str, dataloader_idx: int | None) -> dict[str, float]:
    """The logged ``{name: value}`` of one result: ``prefix + metric``, followed by
    Lightning's ``/dataloader_idx_N`` for dataloader N of several.

    >>> import embedeval as ee
    >>> res = ee.evaluate([[0.0], [0.1], [1.0], [1.1]], [0, 0, 1, 1], metrics=["map_at_r"])
    >>> _log_names(res, "val/", 1)
    {'val/map_at_r/dataloader_idx_1': 1.0}
    """
    names = result.to_log_dict(prefix=prefix)
    if dataloader_idx is None:
        return names
    return {f"{name}/dataloader_idx_{dataloader_idx}": v for name, v in names.items()}


def _exact_values(names: dict[str, float]) -> dict[str, Any]:
    """The logged numbers as float64 CPU tensors, so that what a logger, ``callback_metrics``
    and ``ModelCheckpoint(monitor=...)`` see is the result's float bit for bit.

    ``LightningModule.log`` stores a Python float in the default dtype, float32, which would
    round 2/3 to 0.6666666865 and could make two different checkpoints look tied; a float64
    tensor is kept as float64 (CPU: every device's loop accepts it, MPS has no float64).

    >>> _exact_values({"val/map": 2 / 3})["val/map"].item() == 2 / 3
    True
    """
    import torch  # present wherever Lightning is

    return {name: torch.tensor(v, dtype=torch.float64) for name, v in names.items()}


def _check_outputs(outputs: Any) -> None:
    if isinstance(outputs, dict):
        missing = [k for k in ("embeddings", "labels") if k not in outputs]
        keys = ", ".join(sorted(map(repr, outputs))) or "none"
        got = f"a dict without {' and '.join(map(repr, missing))} (its keys: {keys})"
    else:
        missing, got = ["embeddings", "labels"], type(outputs).__name__
    if missing:
        raise InputError(
            "validation_step must return a dict with 'embeddings' and 'labels' (and "
            f"optionally {', '.join(map(repr, _UPDATE_KEYS))}); got {got}."
        )


def _agreed_keys(local: list[int | None]) -> list[int | None]:
    """The evaluations to compute, None first: under DDP the union over the ranks, since
    :meth:`Evaluator.compute` is collective and a rank may hold no rows of a dataloader."""
    from ..utils.distributed import active_world

    keys = set(local)
    dist = active_world()
    if dist is not None:
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, sorted(keys, key=_order))
        keys = {k for part in gathered for k in part}
    return sorted(keys, key=_order)


def _order(key: int | None) -> int:
    return -1 if key is None else int(key)
