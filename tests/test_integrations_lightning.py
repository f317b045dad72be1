"""The Lightning callback logs what evaluate() computes on the validation embeddings."""

from __future__ import annotations

import numpy as np
import pytest

import embedeval as ee

torch = pytest.importorskip("torch", reason="the Lightning callback needs torch")
L = pytest.importorskip("lightning", reason="the Lightning callback needs lightning")

from embedeval.integrations.lightning import EmbeddingEvaluation  # noqa: E402

METRICS = ["precision_at_1", "map_at_r"]


class _Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(5, 3)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        return self(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        x, y, idx = batch
        return {"embeddings": self(x), "labels": y, "indices": idx}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _loader(x, y, batch_size):
    ds = torch.utils.data.TensorDataset(
        torch.from_numpy(x), torch.from_numpy(y), torch.arange(len(x))
    )
    return torch.utils.data.DataLoader(ds, batch_size=batch_size)


def _trainer(tmp_path, callback, **options):
    """A quiet one-device CPU Trainer with ``callback`` and nothing written but to tmp_path."""
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        **options,
    )


def test_callback_logs_the_metrics_of_the_validation_set(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((90, 5)).astype(np.float32)
    y = rng.integers(0, 6, 90)
    model = _Model()
    callback = EmbeddingEvaluation(metrics=METRICS, primary_metric="map_at_r")
    trainer = _trainer(tmp_path, callback, max_epochs=2, num_sanity_val_steps=1)
    trainer.fit(model, _loader(x, y, 32), _loader(x, y, 17))
    with torch.no_grad():
        emb = model(torch.from_numpy(x)).numpy()
    want = ee.evaluate(emb, y, metrics=METRICS)
    for name in METRICS:
        assert trainer.callback_metrics[f"val/{name}"].item() == pytest.approx(want[name], abs=1e-6)
    np.testing.assert_array_equal(callback.result.per_query["map_at_r"], want.per_query["map_at_r"])
    assert callback.evaluator.mode == "max"


def test_logged_values_are_the_results_floats_not_float32_roundings(tmp_path):
    class Identity(_Model):
        def validation_step(self, batch, batch_idx):
            return {"embeddings": batch[0], "labels": batch[1]}

    # On a line: 0 and 1 are class 0, 10 and 11 class 1, and 20 is class 0 again.  The first
    # four find their partner at distance 1; 20's nearest are 11, 10, then 1 (rank 3).
    x = np.array([[0.0], [1.0], [10.0], [11.0], [20.0]], dtype=np.float32)
    y = np.array([0, 0, 1, 1, 0])
    callback = EmbeddingEvaluation(metrics=["precision_at_1", "mrr"])
    trainer = _trainer(tmp_path, callback)
    model = Identity()
    model.net = torch.nn.Linear(1, 1)
    (logged,) = trainer.validate(model, _loader(x, y, 2), verbose=False)
    # float32 would give 0.800000011920929 and 0.8666666746139526
    assert logged == {"val/precision_at_1": 4 / 5, "val/mrr": (4 + 1 / 3) / 5}
    assert trainer.callback_metrics["val/mrr"].item() == (4 + 1 / 3) / 5


def test_validation_step_must_return_embeddings_and_labels(tmp_path):
    class Bad(_Model):
        def validation_step(self, batch, batch_idx):
            return self(batch[0])

    rng = np.random.default_rng(1)
    x = rng.standard_normal((20, 5)).astype(np.float32)
    y = rng.integers(0, 3, 20)
    trainer = _trainer(tmp_path, EmbeddingEvaluation(), max_epochs=1, num_sanity_val_steps=0)
    with pytest.raises(ee.InputError, match="embeddings"):
        trainer.fit(Bad(), _loader(x, y, 10), _loader(x, y, 10))


def test_a_k_too_shallow_for_a_cutoff_is_refused_when_the_callback_is_built():
    # not after a training epoch and a validation epoch
    with pytest.raises(ee.InputError, match=r"k=5 caps the ranking at depth 5.*recall_at_10"):
        EmbeddingEvaluation(metrics=["recall_at_10"], k=5)


class _TwoLoaderModel(_Model):
    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        x, y, idx = batch
        return {"embeddings": self(x), "labels": y, "indices": idx}


def test_each_validation_dataloader_is_evaluated_on_its_own(tmp_path):
    # Two datasets whose indices are each their own positions 0..n-1: pooled, the second
    # one's rows 0..29 used to count as repeats of the first one's and were dropped.
    rng = np.random.default_rng(2)
    xa, ya = rng.standard_normal((30, 5)).astype(np.float32), np.arange(30) % 3
    xb, yb = rng.standard_normal((40, 5)).astype(np.float32), np.arange(40) % 4
    model = _TwoLoaderModel()
    callback = EmbeddingEvaluation(metrics=METRICS)
    trainer = _trainer(tmp_path, callback, max_epochs=1, num_sanity_val_steps=0)
    trainer.fit(model, _loader(xa, ya, 10), [_loader(xa, ya, 8), _loader(xb, yb, 8)])
    logged = set(trainer.callback_metrics)
    for i, (x, y) in enumerate(((xa, ya), (xb, yb))):
        with torch.no_grad():
            want = ee.evaluate(model(torch.from_numpy(x)).numpy(), y, metrics=METRICS)
        for name in METRICS:
            value = trainer.callback_metrics[f"val/{name}/dataloader_idx_{i}"].item()
            assert value == pytest.approx(want[name], abs=1e-6)
        got = callback.results[i]
        assert got.n_queries == len(y)
        np.testing.assert_array_equal(got.per_query["map_at_r"], want.per_query["map_at_r"])
    # Lightning's per-dataloader names only: no pooled number next to them
    assert not {f"val/{name}" for name in METRICS} & logged
    assert callback.result is None  # two evaluations: read results


def test_a_split_across_two_dataloaders_is_one_evaluation_without_suffix(tmp_path):
    class Split(_Model):
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            x, y, idx = batch
            side = ("query", "reference")[dataloader_idx]
            return {"embeddings": self(x), "labels": y, "indices": idx, "split": side}

    rng = np.random.default_rng(3)
    xq, yq = rng.standard_normal((12, 5)).astype(np.float32), np.arange(12) % 4
    xr, yr = rng.standard_normal((30, 5)).astype(np.float32), np.arange(30) % 4
    model = Split()
    callback = EmbeddingEvaluation(metrics=METRICS)
    trainer = _trainer(tmp_path, callback, max_epochs=1, num_sanity_val_steps=0)
    trainer.fit(model, _loader(xq, yq, 6), [_loader(xq, yq, 5), _loader(xr, yr, 7)])
    with torch.no_grad():
        q, r = model(torch.from_numpy(xq)).numpy(), model(torch.from_numpy(xr)).numpy()
    want = ee.evaluate(q, yq, r, yr, metrics=METRICS)
    for name in METRICS:
        assert trainer.callback_metrics[f"val/{name}"].item() == pytest.approx(want[name], abs=1e-6)
    assert list(callback.results) == [None]
    np.testing.assert_array_equal(callback.result.per_query["map_at_r"], want.per_query["map_at_r"])


def test_a_missing_key_is_named(tmp_path):
    class NoLabels(_Model):
        def validation_step(self, batch, batch_idx):
            return {"embeddings": self(batch[0]), "label": batch[1]}

    rng = np.random.default_rng(4)
    x = rng.standard_normal((20, 5)).astype(np.float32)
    y = rng.integers(0, 3, 20)
    trainer = _trainer(tmp_path, EmbeddingEvaluation(), max_epochs=1, num_sanity_val_steps=0)
    with pytest.raises(
        ee.InputError, match=r"got a dict without 'labels' \(its keys: 'embeddings', 'label'\)"
    ):
        trainer.fit(NoLabels(), _loader(x, y, 10), _loader(x, y, 10))


class _TestedModel(_Model):
    def test_step(self, batch, batch_idx, dataloader_idx=0):
        x, y, idx = batch
        return {"embeddings": self(x), "labels": y, "indices": idx}


def test_trainer_test_logs_the_test_set_apart_from_the_validation_set(tmp_path):
    rng = np.random.default_rng(5)
    xv, yv = rng.standard_normal((30, 5)).astype(np.float32), np.arange(30) % 3
    xt, yt = rng.standard_normal((44, 5)).astype(np.float32), np.arange(44) % 4
    model = _TestedModel()
    callback = EmbeddingEvaluation(metrics=METRICS)
    trainer = _trainer(tmp_path, callback, max_epochs=1, num_sanity_val_steps=0)
    trainer.fit(model, _loader(xv, yv, 10), _loader(xv, yv, 8))
    with torch.no_grad():
        want_val = ee.evaluate(model(torch.from_numpy(xv)).numpy(), yv, metrics=METRICS)
        want_test = ee.evaluate(model(torch.from_numpy(xt)).numpy(), yt, metrics=METRICS)
    for name in METRICS:
        value = trainer.callback_metrics[f"val/{name}"].item()
        assert value == pytest.approx(want_val[name], abs=1e-6)
    (logged,) = trainer.test(model, _loader(xt, yt, 9), verbose=False)
    assert set(logged) == {f"test/{name}" for name in METRICS}
    for name in METRICS:
        assert logged[f"test/{name}"] == pytest.approx(want_test[name], abs=1e-6)
    # each loop kept its own rows and its own result
    assert callback.result.n_queries == 30 and callback.test_result.n_queries == 44
    np.testing.assert_array_equal(
        callback.result.per_query["map_at_r"], want_val.per_query["map_at_r"]
    )
    got = callback.test_result.per_query["map_at_r"]
    np.testing.assert_array_equal(got, want_test.per_query["map_at_r"])


class _Identity(_Model):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(1, 1)

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        return {"embeddings": batch[0], "labels": batch[1]}


def test_the_test_loop_logs_the_hand_computed_fractions_under_test_prefix(tmp_path):
    # The line of test_logged_values_are_the_results_floats_not_float32_roundings: 20's
    # nearest of its class is 1, at rank 3.
    x = np.array([[0.0], [1.0], [10.0], [11.0], [20.0]], dtype=np.float32)
    y = np.array([0, 0, 1, 1, 0])
    callback = EmbeddingEvaluation(metrics=["precision_at_1", "mrr"], test_prefix="holdout/")
    trainer = _trainer(tmp_path, callback)
    (logged,) = trainer.test(_Identity(), _loader(x, y, 2), verbose=False)
    assert logged == {"holdout/precision_at_1": 4 / 5, "holdout/mrr": (4 + 1 / 3) / 5}
    assert callback.results == {} and callback.result is None  # no validation ran


def test_each_test_dataloader_is_evaluated_on_its_own(tmp_path):
    # 0 and 1 pair up, 4 does not (its nearest, 1, is 3 away, 9 is 5): P@1 = 3/4.  Two
    # points of one class: P@1 = 1.
    xa, ya = np.array([[0.0], [1.0], [4.0], [9.0]], dtype=np.float32), np.array([0, 0, 1, 1])
    xb, yb = np.array([[0.0], [3.0]], dtype=np.float32), np.array([7, 7])
    callback = EmbeddingEvaluation(metrics=["precision_at_1"])
    trainer = _trainer(tmp_path, callback)
    per_loader = trainer.test(_Identity(), [_loader(xa, ya, 3), _loader(xb, yb, 3)], verbose=False)
    # logged at the epoch's end, the names reach every dataloader's dict of Lightning's answer
    logged = {name: v for part in per_loader for name, v in part.items()}
    assert logged == {
        "test/precision_at_1/dataloader_idx_0": 3 / 4,
        "test/precision_at_1/dataloader_idx_1": 1.0,
    }
    assert callback.test_results[0].n_queries == 4 and callback.test_results[1].n_queries == 2
    assert callback.test_result is None  # two evaluations: read test_results


def test_test_prefix_none_leaves_the_test_loop_alone(tmp_path):
    class Other(_Model):
        def test_step(self, batch, batch_idx):
            self.log("test/loss", self(batch[0]).pow(2).mean())

    x, y = np.zeros((6, 5), dtype=np.float32), np.arange(6) % 2
    callback = EmbeddingEvaluation(metrics=["precision_at_1"], test_prefix=None)
    (logged,) = _trainer(tmp_path, callback).test(Other(), _loader(x, y, 3), verbose=False)
    assert set(logged) == {"test/loss"} and callback.test_results == {}


def test_test_step_must_return_embeddings_and_labels(tmp_path):
    class Bad(_Model):
        def test_step(self, batch, batch_idx):
            return self(batch[0])

    x, y = np.zeros((6, 5), dtype=np.float32), np.arange(6) % 2
    trainer = _trainer(tmp_path, EmbeddingEvaluation())
    with pytest.raises(ee.InputError, match=r"^test_step must return a dict with 'embeddings'"):
        trainer.test(Bad(), _loader(x, y, 3), verbose=False)
