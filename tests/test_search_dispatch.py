"""The backend interface (embedeval.search.dispatch): one module per backend, one write-back."""

from __future__ import annotations

import importlib
import pathlib
import sys
import types

import numpy as np
import pytest

import embedeval as ee
from embedeval.engine.task import ScoredBlock
from embedeval.search import dispatch as _search
from embedeval.search.dispatch import BACKEND_MODULES, SearchOptions, run_search
from embedeval.utils.errors import InputError


@pytest.mark.parametrize("name", sorted(BACKEND_MODULES))
def test_every_backend_module_has_one_search_entry(name):
    module = importlib.import_module(BACKEND_MODULES[name])
    assert callable(module.search)


@pytest.mark.parametrize(
    ("kwargs", "engine"),
    [
        ({}, "local"),
        ({"shards": 2}, "sharded"),
        ({"index": "Flat"}, "approximate"),
        ({"backend": "torch"}, "torch"),
    ],
)
def test_options_select_the_backend(kwargs, engine):
    if engine == "torch":
        pytest.importorskip("torch")
    assert SearchOptions.make(**kwargs).engine == engine


def test_shards_are_checked_with_the_other_options():
    with pytest.raises(InputError, match="empty list"):
        SearchOptions.make(shards=[])
    with pytest.raises(InputError, match="shards must be >= 1"):
        SearchOptions.make(shards=0)


@pytest.mark.parametrize("piece", ["part0.npy", pathlib.Path("part0.npy"), np.zeros((3, 2))])
def test_one_piece_not_in_a_list_is_refused_with_the_list_to_pass(piece):
    # a single path or array is a piece the caller forgot to wrap, not a bad integer
    with pytest.raises(InputError, match=r"list of arrays / \.npy paths.*shards=\["):
        SearchOptions.make(shards=piece)


def test_a_new_backend_is_one_module(monkeypatch):
    # A backend that scores queries 0 and 2 in two blocks and reports something of its own;
    # query 1 (never yielded) stays NaN, as a lone query does.
    def search(task, options):
        yield ScoredBlock(np.array([2]), {"precision_at_1": np.array([0.25])},
                          {"precision_at_1": np.array([True])})  # fmt: skip
        yield ScoredBlock(slice(0, 1), {"precision_at_1": np.array([1.0])},
                          {"precision_at_1": np.array([False])})  # fmt: skip
        return {"blocks": 2}

    module = types.ModuleType("fake_backend")
    module.search = search
    monkeypatch.setitem(sys.modules, "fake_backend", module)
    monkeypatch.setitem(_search.BACKEND_MODULES, "local", "fake_backend")
    x = np.array([[0.0], [1.0], [3.0]], dtype=np.float32)
    result = ee.evaluate(x, [0, 1, 0], metrics=["precision_at_1"], progress=False)
    np.testing.assert_array_equal(result.per_query["precision_at_1"], [1.0, np.nan, 0.25])


def test_run_search_returns_the_backend_report(monkeypatch):
    from embedeval.engine.exact import Exclusions
    from embedeval.engine.registry import METRICS
    from embedeval.engine.task import RetrievalTask

    def search(task, options):
        yield ScoredBlock(slice(0, 2), {"precision_at_1": np.array([0.5, 1.0])},
                          {"precision_at_1": np.array([False, True])})  # fmt: skip
        return {"index": "made up"}

    for name, report in (("fake_backend", None), ("fake_index", "approximation")):
        module = types.ModuleType(name)
        module.search = search
        if report:
            module.REPORT = report
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(_search.BACKEND_MODULES, "local", "fake_backend")
    monkeypatch.setitem(_search.BACKEND_MODULES, "approximate", "fake_index")
    x = np.zeros((2, 1), dtype=np.float32)
    codes = np.zeros(2, dtype=np.int64)
    task = RetrievalTask(x, x, codes, codes, codes + 1, codes + 1, Exclusions(self_index=True),
                         (METRICS["precision_at_1"],), None, "euclidean")  # fmt: skip
    # a module that says REPORT = "approximation" (the approximate index) reports its error
    # estimate; any other backend's report is its record of the search
    outcome = run_search(task, SearchOptions.make(index="Flat"))
    assert outcome.approximation == {"index": "made up"} and outcome.search == {}
    outcome = run_search(task, SearchOptions.make())
    assert outcome.approximation == {} and outcome.search == {"index": "made up"}
    assert outcome.values["precision_at_1"].tolist() == [0.5, 1.0]
    assert outcome.ties["precision_at_1"].tolist() == [False, True]
