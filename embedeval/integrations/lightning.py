"""A Lightning callback that evaluates the validation embeddings every validation epoch, and
the test embeddings of ``trainer.test``.

Requires the optional ``lightning`` package (``pip install lightning``).  The module's
``validation_step`` (and ``test_step``) returns the batch's embeddings and labels; the callback
accumulates them in an :class:`embedeval.Evaluator`, evaluates at the end of the epoch
(gathering every process's rows under DDP, de-duplicated by ``indices`` when given) and logs
flat ``{prefix + metric: value}`` numbers (float64: the result's own floats) with
``LightningModule.log_dict``, where ``ModelCheckpoint(monitor=...)`` and the loggers find them.
The validation loop logs under ``prefix`` (``"val/map_at_r"``), the test loop under
``test_prefix`` (``"test/map_at_r"``); the two loops accumulate and keep their results
separately (:attr:`~EmbeddingEvaluation.results`, :attr:`~EmbeddingEvaluation.test_results`).

Several dataloaders in a loop are evaluated separately, each as its own set, and logged
under Lightning's per-dataloader names: ``val/map_at_r/dataloader_idx_0``,
``val/map_at_r/dataloader_idx_1``, ... (the suffix ``self.log`` adds in ``validation_step``;
likewise ``test/map_at_r/dataloader_idx_0``, ...).  With one dataloader the names carry no
suffix.  The exception is a query/gallery split: rows returned with ``"split"`` (``"query"`` /
``"reference"``) form one evaluation whichever dataloader of the loop they come from (queries
from one loader, the gallery from another), logged without a suffix.

Example
-------
::

    from embedeval.integrations.lightning import EmbeddingEvaluation

    class Model(L.LightningModule):
        def validation_step(self, batch, batch_idx):
            x, y, idx = batch
            return {"embeddings": self(x), "labels": y, "indices": idx}

        test_step = validation_step  # for trainer.test: logged as "test/map_at_r"

    callback = EmbeddingEvaluation(metrics=["precision_at_1", "map_at_r"], distance="cosine")
    checkpoint = ModelCheckpoint(monitor="val/map_at_r", mode=callback.evaluator.mode)
    trainer = L.Trainer(callbacks=[callback, checkpoint])
    trainer.fit(Model(), train_loader, val_loader)
    trainer.test(ckpt_path="best", dataloaders=test_loader)  # callback.test_result
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
_LOOPS = ("validation", "test")


class EmbeddingEvaluation(Callback):
    """Evaluate validation and test embeddings with embedeval at the end of every validation
    epoch and of every test run.

    Parameters
    ----------
    evaluator : Evaluator, optional
        The settings to use; by default an Evaluator is built from ``**options``.  Every
        evaluation (each loop, each dataloader) accumulates in a fresh copy of it (same
        settings), so validation and test rows never mix.
    prefix : str
        Put before every name logged by the validation loop (``"val/"`` gives
        ``"val/map_at_r"``).
    test_prefix : str or None
        Put before every name logged by the test loop (``"test/"`` gives ``"test/map_at_r"``);
        None leaves the test loop alone (for a ``test_step`` that returns something else).
    **options :
        Keyword arguments of :class:`embedeval.Evaluator` (``metrics``, ``k``, ``distance``,
        ``primary_metric``, ...), checked here, before any training.

    Notes
    -----
    ``validation_step`` and ``test_step`` must return a dict with ``"embeddings"`` and
    ``"labels"``, and may add ``"indices"`` (dataset positions: rows a ``DistributedSampler``
    repeats are then counted once), ``"split"`` (``"query"`` / ``"reference"``), ``"groups"``
    and ``"confidences"``.  The sanity-check batches Lightning runs before training are not
    evaluated.

    With several dataloaders in a loop, each is evaluated on its own rows (its ``indices`` are
    positions in its own dataset) and its metrics are logged as ``prefix + metric +
    "/dataloader_idx_N"``, as Lightning names what a step logs.  Rows returned with a
    ``"split"`` form one query/gallery evaluation across the loop's dataloaders, logged without
    the suffix.  :attr:`results` (validation) and :attr:`test_results` (test) map the
    dataloader index (``None`` for a single dataloader or for the split) to the loop's latest
    result; :attr:`result` and :attr:`test_result` are that result when there is only one.
    """

    def __init__(
        self,
        evaluator: Evaluator | None = None,
        *,
        prefix: str = "val/",
        test_prefix: str | None = "test/",
        **options: Any,
    ) -> None:
        super().__init__()
        if evaluator is not None and options:
            raise InputError("pass either an Evaluator or its options, not both.")
        self.evaluator = evaluator if evaluator is not None else Evaluator(**options)
        self.prefix = prefix
        self.test_prefix = test_prefix
        self._results: dict[str, dict[int | None, Any]] = {loop: {} for loop in _LOOPS}
        self._accumulators: dict[str, dict[int | None, Evaluator]] = {loop: {} for loop in _LOOPS}

    @property
    def results(self) -> dict[int | None, Any]:
        """The latest validation result of each dataloader (None: one dataloader or a split)."""
        return self._results["validation"]

    @property
    def test_results(self) -> dict[int | None, Any]:
        """The latest test result of each dataloader (None: one dataloader or a split)."""
        return self._results["test"]

    @property
    def result(self) -> Any:
        """The latest validation result when there is one (else None: see :attr:`results`)."""
        return _single(self.results)

    @property
    def test_result(self) -> Any:
        """The latest test result when there is one (else None: see :attr:`test_results`)."""
        return _single(self.test_results)

    def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._accumulators["validation"] = {}

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
        if not trainer.sanity_checking:
            self._collect("validation", outputs, dataloader_idx)

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self._finish("validation", pl_module, self.prefix)

    def on_test_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._accumulators["test"] = {}

    def on_test_batch_end(
        self,
        trainer: Any,
        pl_module: Any,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int | None = None,
    ) -> None:
        # As for validation: dataloader_idx only when there are several test dataloaders.
        if self.test_prefix is not None:
            self._collect("test", outputs, dataloader_idx)

    def on_test_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.test_prefix is not None:
            self._finish("test", pl_module, self.test_prefix)

    def _collect(self, loop: str, outputs: Any, dataloader_idx: int | None) -> None:
        """Add one batch's step outputs to the accumulator of its evaluation in ``loop``."""
        _check_outputs(outputs, f"{loop}_step")
        extra = {k: outputs[k] for k in _UPDATE_KEYS if k in outputs}
        key = None if outputs.get("split") is not None else dataloader_idx
        self._evaluator(loop, key).update(outputs["embeddings"], outputs["labels"], **extra)

    def _finish(self, loop: str, pl_module: Any, prefix: str) -> None:
        """Compute and log every evaluation of ``loop``, keeping the results of that loop."""
        accumulators = self._accumulators[loop]
        keys = _agreed_keys([k for k, ev in accumulators.items() if ev.n_rows])
        if not keys:
            return
        results: dict[int | None, Any] = {}
        for key in keys:  # the same keys in the same order on every rank: compute() gathers
            evaluator = self._evaluator(loop, key)
            results[key] = evaluator.compute()
            # Every rank computed the same numbers from the gathered rows: nothing to reduce.
            names = _log_names(results[key], prefix, key)
            pl_module.log_dict(_exact_values(names), sync_dist=False, add_dataloader_idx=False)
            evaluator.reset()
        self._results[loop] = results

    def _evaluator(self, loop: str, key: int | None) -> Evaluator:
        """The accumulator of evaluation ``key`` in ``loop`` (a dataloader index, or None for
        the one evaluation of a single dataloader or of a query/gallery split), a fresh copy
        of :attr:`evaluator` if new."""
        accumulators = self._accumulators[loop]
        if key not in accumulators:
            fresh = copy.copy(self.evaluator)
            fresh.reset()  # its own buffers: the copy shares only the settings
            accumulators[key] = fresh
        return accumulators[key]


def _single(results: dict[int | None, Any]) -> Any:
    return next(iter(results.values())) if len(results) == 1 else None


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


def _check_outputs(outputs: Any, step: str) -> None:
    """Refuse ``step``'s return value unless it is a dict with embeddings and labels."""
    if isinstance(outputs, dict):
        missing = [k for k in ("embeddings", "labels") if k not in outputs]
        keys = ", ".join(sorted(map(repr, outputs))) or "none"
        got = f"a dict without {' and '.join(map(repr, missing))} (its keys: {keys})"
    else:
        missing, got = ["embeddings", "labels"], type(outputs).__name__
    if missing:
        hint = (
            " (or pass test_prefix=None to leave the test loop alone)"
            if step == "test_step"
            else ""
        )
        raise InputError(
            f"{step} must return a dict with 'embeddings' and 'labels' (and "
            f"optionally {', '.join(map(repr, _UPDATE_KEYS))}){hint}; got {got}."
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
