"""The validation stage of evaluate: every option is checked on every path, before any search.

Each bad option is tried on every path (local, shards, Dask without a cluster, approximate
index, torch, relevance lists, reject-both, bootstrap intervals).  The search entry points are
replaced by functions that fail the test, so an error raised after the search started, or no
error at all, is caught.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import embedeval as ee
from embedeval.evaluation import relevance_lists
from embedeval.evaluation import stages as _pipeline
from embedeval.evaluation.settings import EvaluationInputs, validate_arguments

X = np.random.default_rng(0).normal(size=(12, 3)).astype(np.float32)
Y = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])


class _NotAClient:
    """Stands in for a dask.distributed.Client: validation must never touch it."""


def _lists_call(**options):
    return dict(
        query=X[:3],
        query_labels=None,
        reference=X,
        reference_labels=None,
        positives=[[0, 1], [3], [4, 5]],
        junk=[[2], [], []],
        **options,
    )


#: Every path of evaluate, as the keyword arguments that select it.
PATHS = {
    "local": lambda **o: dict(query=X, query_labels=Y, **o),
    "shards": lambda **o: dict(query=X, query_labels=Y, shards=2, **o),
    "dask": lambda **o: dict(query=X, query_labels=Y, backend="dask", client=_NotAClient(), **o),
    "index": lambda **o: dict(query=X, query_labels=Y, index="Flat", **o),
    "torch": lambda **o: dict(query=X, query_labels=Y, backend="torch", device="cpu", **o),
    "positives": _lists_call,
    "reject_both": lambda **o: dict(
        query=X, query_labels=Y, confidences=np.linspace(0, 1, 12), reject_from="both", **o
    ),
    "ci": lambda **o: dict(query=X, query_labels=Y, ci=0.9, **o),
}

#: One bad value per option, and the argument name the error must carry.
BAD_OPTIONS = [
    ("metrics", ["precision_at_one"]),
    ("metrics", 5),
    ("custom_metrics", 5),
    ("k", "deep"),
    ("k", 0),
    ("distance", "manhattan"),
    ("average", "median"),
    ("ref_includes_query", "yes"),
    ("higher_is_confident", "no"),
    ("reject_from", "gallery"),
    ("rejection_fractions", [0.1, 1.5]),
    ("ci", 1.5),
    ("n_boot", 0),
    ("n_boot", 10.5),
    ("seed", -1),
    ("block_size", 0),
    ("memory_budget", 10),
    ("progress", "yes"),
    ("n_threads", 0),
    ("exact_sample", "many"),
    ("index_params", [("nprobe", 4)]),
    ("backend", "gpu"),
    ("tf32", "yes"),
    ("device", "tpu"),
    ("device_memory", -1),
]


@pytest.fixture
def no_search(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the search ran before the bad option was refused")

    monkeypatch.setattr(_pipeline, "run_search", fail)
    monkeypatch.setattr(relevance_lists, "evaluate_listed", fail)


def _names(message: str, argument: str) -> bool:
    return re.search(rf"(?<![A-Za-z_]){re.escape(argument)}(?![A-Za-z_])", message) is not None


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize(("argument", "value"), BAD_OPTIONS, ids=lambda v: repr(v)[:20])
def test_every_bad_option_is_refused_on_every_path_before_any_search(
    path, argument, value, no_search
):
    if path == "torch":
        pytest.importorskip("torch")
    call = {**PATHS[path](), argument: value}  # a path's own value of it is the one spoilt
    with pytest.raises((ee.InputError, ee.InputTypeError)) as info:
        ee.evaluate(**call)
    assert _names(str(info.value), argument), str(info.value)


#: Options that a path would ignore, given to it: refused, naming the option.
IGNORED = [
    ("local", {"index_params": {"nprobe": 4}}, "index_params"),
    ("local", {"exact_sample": 100}, "exact_sample"),
    ("local", {"client": _NotAClient()}, "client"),
    ("local", {"device": "cpu"}, "device"),
    ("local", {"tf32": True}, "tf32"),
    ("local", {"rejection_fractions": [0.0, 0.3]}, "rejection_fractions"),
    ("local", {"reject_from": "both"}, "reject_from"),
    ("shards", {"client": _NotAClient()}, "client"),
    ("shards", {"index_params": {"nprobe": 4}}, "index_params"),
    ("ci", {"rejection_fractions": [0.0, 0.3]}, "rejection_fractions"),
    ("positives", {"custom_metrics": {}}, "custom_metrics"),
    ("positives", {"index": "Flat"}, "index"),
    ("positives", {"shards": 2}, "shards"),
    ("positives", {"backend": "dask", "client": _NotAClient()}, "backend"),
    ("positives", {"confidences": np.ones(3)}, "confidences"),
    ("positives", {"query_groups": [0, 1, 2]}, "query_groups"),
    ("positives", {"ref_includes_query": True}, "ref_includes_query"),
    ("positives", {"average": "macro"}, "average"),
    ("positives", {"k": "max_bin_count"}, "k"),
    ("positives", {"metrics": ["nmi"]}, "nmi"),
    ("dask", {"shards": 2}, "shards"),
    ("index", {"shards": 2}, "shards"),
]


@pytest.mark.parametrize(("path", "options", "argument"), IGNORED)
def test_an_option_the_path_would_ignore_is_refused_before_any_search(
    path, options, argument, no_search
):
    with pytest.raises((ee.InputError, ee.InputTypeError)) as info:
        ee.evaluate(**PATHS[path](**options))
    assert _names(str(info.value), argument), str(info.value)


def test_n_boot_without_ci_is_refused_and_checked_with_it():
    # Without ci= nothing is resampled: an n_boot given alone (a typo, or intervals expected)
    # was silently ignored.
    with pytest.raises(ee.InputError, match=r"n_boot=500 sets the resamples.*pass ci=0.95"):
        ee.evaluate(X, Y, n_boot=500)
    with pytest.raises(ee.InputError, match="n_boot must be >= 1"):
        ee.evaluate(X, Y, ci=0.9, n_boot=0)
    with pytest.raises(ee.InputError, match=r"n_boot=500 sets the resamples"):
        ee.evaluate_qrels(X, X, {"0": {"1": 1}}, query_ids=range(12), doc_ids=range(12),
                          n_boot=500)  # fmt: skip


def test_an_int_k_too_shallow_for_a_cutoff_is_refused_before_the_search(no_search):
    with pytest.raises(ee.InputError, match=r"k=3 caps the ranking at depth 3.*recall_at_5"):
        ee.evaluate(X, Y, k=3, metrics=["recall_at_5"])


def test_settings_are_frozen_and_grouped_by_concern():
    s = validate_arguments(
        EvaluationInputs(X, Y, confidences=np.ones(12)),
        metrics=["map_at_r"],
        k="max_bin_count",
        average="macro",
        higher_is_confident=False,
        ci=0.95,
        n_boot=200,
        seed=3,
        block_size=4,
    )
    assert [m.name for m in s.metrics.infos] == ["map_at_r"]
    assert (s.metrics.k, s.metrics.average, s.metrics.default) == ("max_bin_count", "macro", False)
    assert (s.protocol.leave_one_out, s.protocol.lists) == (True, False)
    assert (s.confidence.given, s.confidence.higher_is_confident) == (True, False)
    assert (s.statistics.ci, s.statistics.n_boot, s.statistics.seed) == (0.95, 200, 3)
    assert (s.search.backend, s.search.block_size, s.search.seed) == ("local", 4, 3)
    with pytest.raises(AttributeError):
        s.statistics.ci = 0.5  # type: ignore[misc]


def test_default_metrics_are_marked_for_the_plan_stage():
    s = validate_arguments(EvaluationInputs(X, Y))
    assert s.metrics.default is True
    s = validate_arguments(EvaluationInputs(X, Y), metrics=["mrr"])
    assert s.metrics.default is False


def test_every_parameter_of_evaluate_reaches_the_validation_stage():
    import inspect

    from embedeval.evaluation.settings import DATA_ARGUMENTS, SEARCH_ARGUMENTS
    from embedeval.search.dispatch import SearchOptions

    evaluate_params = set(inspect.signature(ee.evaluate).parameters)
    named = set(inspect.signature(validate_arguments).parameters) - {"inputs", "search"}
    search = set(inspect.signature(SearchOptions.make).parameters) - {"like", "seed"}
    assert set(SEARCH_ARGUMENTS) == search
    assert evaluate_params == set(DATA_ARGUMENTS) | named | search
