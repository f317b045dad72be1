"""A Lightning callback that evaluates the validation embeddings every validation epoch.

Requires the optional ``lightning`` package (``pip install lightning``).  The module's
``validation_step`` returns the batch's embeddings and labels; the callback accumulates them in
an :class:`embedeval.Evaluator`, evaluates at the end of the epoch (gathering every process's
rows under DDP, de-duplicated by ``indices`` when given) and logs flat ``{prefix + metric:
value}`` numbers with ``LightningModule.log_dict``, where ``ModelCheckpoint(monitor=...)`` and
the loggers find them.

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
        The accumulator to use; by default one is built from ``**options``.
    prefix : str
        Put before every logged name (``"val/"`` gives ``"val/map_at_r"``).
    **options :
        Keyword arguments of :class:`embedeval.Evaluator` (``metrics``, ``k``, ``distance``,
        ``primary_metric``, ...).

    Notes
    -----
    ``validation_step`` must return a dict with ``"embeddings"`` and ``"labels"``, and may add
    ``"indices"`` (dataset positions: rows a ``DistributedSampler`` repeats are then counted
    once), ``"split"`` (``"query"`` / ``"reference"``), ``"groups"`` and ``"confidences"``.  The
    sanity-check batches Lightning runs before training are not evaluated.  The latest result is
    kept as :attr:`result`.
    """

    def __init__(
        self, evaluator: Evaluator | None = None, *, prefix: str = "val/", **options: Any
    ) -> None:
        super().__init__()
        if evaluator is not None and options:
            raise InputError("pass either an Evaluator or its options, not both.")
        self.evaluator = evaluator if evaluator is not None else Evaluator(**options)
        self.prefix = prefix
        self.result: Any = None

    def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.evaluator.reset()

    def on_validation_batch_end(
        self,
        trainer: Any,
        pl_module: Any,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if trainer.sanity_checking:
            return
        if not isinstance(outputs, dict) or not {"embeddings", "labels"} <= set(outputs):
            raise InputError(
                "validation_step must return a dict with 'embeddings' and 'labels' (and "
                f"optionally {', '.join(map(repr, _UPDATE_KEYS))}); got "
                f"{type(outputs).__name__}."
            )
        extra = {k: outputs[k] for k in _UPDATE_KEYS if k in outputs}
        self.evaluator.update(outputs["embeddings"], outputs["labels"], **extra)

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking or (self.evaluator.n_rows == 0 and not _distributed()):
            return
        self.result = self.evaluator.compute()
        # Every rank computed the same numbers from the gathered rows: nothing to reduce.
        pl_module.log_dict(self.result.to_log_dict(prefix=self.prefix), sync_dist=False)
        self.evaluator.reset()


def _distributed() -> bool:
    from ..utils.distributed import active_world

    return active_world() is not None
