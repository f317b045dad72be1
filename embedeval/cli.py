"""The ``embedeval`` command line (also ``python -m embedeval``).

Every error is one line on stderr (``embedeval: error: ...``) naming the file or argument and the
fix, with exit status 2; outputs are written atomically, so a failed run never leaves a half
file nor clobbers an existing one.

Each subcommand is two functions: ``_add_<name>_command`` declares its options (called from
:func:`build_parser`) and ``cmd_<name>`` runs it (listed in :data:`COMMANDS`). The options that
``evaluate`` and ``compare`` share are declared once, one group per concern of
:func:`embedeval.evaluate`.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import logging
import math
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .utils.errors import EmbedevalError, FileFormatError, InputError
from .utils.files import not_a_file, read_lines, write_text
from .utils.tables import markdown_table
from .utils.validation import as_labels, as_vector, label_sizes, label_text
from .utils.version import __version__

EPILOG_EVALUATE = """examples:
  embedeval evaluate ckpt_epoch10.npz
  embedeval evaluate q.npy --labels ql.npy --reference g.npy --reference-labels gl.npy \\
      --metrics map_at_r precision_at_1 --distance cosine --json out.json --per-class classes.csv
  embedeval evaluate ckpt.npz --ci 0.95 --metrics map_at_r mrr recall_at_5 --average macro
  embedeval evaluate ckpt.npz --k max_bin_count --plots figs/ --per-query queries.csv

Label files hold one value per line (no header, no id column). The JSON records the inputs
(name, SHA-256), the version, the time and every option. A warning is one line on stderr;
errors are one line with exit status 2; a closed stdout (| head) is no error: the outputs
are still written.
"""

EPILOG_MAIN = """examples:
  embedeval demo --out report/            # scikit-learn digits, three embeddings, a report
  embedeval evaluate ckpt.npz             # leave-one-out table on the terminal
  embedeval compare runs/epoch_*.npz --ci 0.95 --plot curve.png
  embedeval figures --out figures/        # regenerate every committed figure

Run 'embedeval COMMAND --help' for a command's options. Errors are one line on stderr with
exit status 2; an interrupted run (Ctrl-C) exits with status 130. Outputs are written
atomically: a failed run leaves an existing output file as it was.
"""

EPILOG_COMPARE = """examples:
  embedeval compare runs/epoch_*.npz --ci 0.95 --plot curve.png
  embedeval compare a.npz b.npz --baseline b --test permutation --markdown table.md

Checkpoints are taken in natural order of their names (epoch_2 before epoch_10), whatever
order the shell gives; --keep-order keeps the order given.
"""


class _Parser(argparse.ArgumentParser):
    """argparse with the package's error format: one line on stderr, exit status 2."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        hint = f"see '{self.prog} --help'"
        self.exit(2, f"embedeval: error: {_one_line(message)}; {hint}.\n")


_MAX_K = 2**62  # far above any reference set, and safe in int64 arithmetic


def _k_value(value: str) -> int | str:
    if value == "max_bin_count":
        return value
    try:
        k = int(value)
    except ValueError:
        k = 0
    if k < 1:
        raise argparse.ArgumentTypeError(
            f"must be a positive integer or max_bin_count; got {value!r}"
        )
    if k > _MAX_K:  # a larger cap means "no cap": say so instead of overflowing int64
        raise argparse.ArgumentTypeError(
            f"{value} is too large (at most {_MAX_K}); omit --k for the exact, uncapped ranking"
        )
    return k


def _int_in(low: int, high: int, what: str) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high``; ``what`` names the range in
    the error."""

    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            n = low - 1
        if not low <= n <= high:
            raise argparse.ArgumentTypeError(f"must be {what}; got {value!r}")
        return n

    return parse


_positive_int = _int_in(1, _MAX_K, "a positive integer")
_count = _int_in(0, _MAX_K, "a whole number, 0 or more")
_thumbnail = _int_in(8, 512, "a size in pixels from 8 to 512")


def _level(value: str) -> float:
    try:
        level = float(value)
    except ValueError:
        level = math.nan
    if not 0 < level < 1:
        raise argparse.ArgumentTypeError(
            f"must be a confidence level strictly between 0 and 1, e.g. 0.95; got {value!r}"
        )
    return level


def _add_evaluation_options(p: argparse.ArgumentParser, always_resampled: bool = False) -> None:
    """The options shared by ``evaluate`` and ``compare``, one group per concern of
    :func:`embedeval.evaluate` (protocol, metrics, confidences, statistics, search);
    ``always_resampled``: the command resamples without ``--ci`` too (``compare``, at 0.95)."""
    _add_protocol_options(p.add_argument_group("inputs and protocol"))
    _add_metric_options(p.add_argument_group("metrics"))
    _add_confidence_options(p.add_argument_group("confidences"))
    resampled = "queries resampled for micro, classes for macro"
    if always_resampled:
        resampled += "; default: 0.95"
    _add_statistics_options(p.add_argument_group("statistics"), resampled)
    add_search_options(p)


def _add_protocol_options(g: Any) -> None:
    """Labels, the gallery and what each query may not retrieve."""
    g.add_argument(
        "--labels", metavar="FILE", help="labels file (.npy/.npz/.txt/.csv/.tsv) for a .npy input"
    )
    g.add_argument(
        "--reference", metavar="FILE", help="gallery embeddings (default: leave-one-out)"
    )
    g.add_argument("--reference-labels", metavar="FILE", help="gallery labels file")
    g.add_argument(
        "--ref-includes-query",
        action="store_true",
        help="the queries are the first gallery rows (PML's convention)",
    )
    g.add_argument("--groups", metavar="FILE", help="query group ids (same-group refs ignored)")
    g.add_argument("--reference-groups", metavar="FILE", help="gallery group ids")


def _add_metric_options(g: Any) -> None:
    """Which metrics, at which depth, under which distance and average."""
    g.add_argument(
        "--metrics",
        nargs="+",
        metavar="NAME",
        help="precision_at_1 r_precision map_at_r map map_at_K mrr minp recall_at_K "
        "precision_at_K nmi ami (default: P@1, R-Prec, MAP@R, R@10; R@k when --k caps the "
        "ranking below 10)",
    )
    g.add_argument(
        "--k",
        default=None,
        type=_k_value,
        help="depth cap: a positive integer (PML's truncation) or max_bin_count "
        "(default: exact, no cap)",
    )
    g.add_argument(
        "--distance",
        default="euclidean",
        choices=("euclidean", "cosine", "inner_product"),
        help="how references are ranked (default: euclidean)",
    )
    g.add_argument(
        "--average",
        default="micro",
        choices=("micro", "macro"),
        help="micro: mean over queries; macro: mean per class, then over classes (default: micro)",
    )


def _add_confidence_options(g: Any) -> None:
    """Per-query confidences and their direction."""
    g.add_argument(
        "--confidences",
        metavar="FILE",
        help="per-query confidences (default: the npz 'confidences' or 'sigmas' key)",
    )
    g.add_argument(
        "--lower-is-confident",
        action="store_true",
        help="the confidences are uncertainties (sigmas); 'sigmas' keys imply it",
    )


def _add_statistics_options(
    g: Any, resampled: str = "queries resampled for micro, classes for macro", index: bool = True
) -> None:
    """Bootstrap confidence intervals; ``resampled``: what the command resamples; ``index``:
    the command takes ``--index``, whose exact sample ``--seed`` draws too."""
    g.add_argument(
        "--ci",
        type=_level,
        default=None,
        metavar="LEVEL",
        help=f"bootstrap confidence intervals at this level, e.g. 0.95 ({resampled})",
    )
    g.add_argument(
        "--n-boot",
        type=_positive_int,
        default=None,
        metavar="N",
        help="bootstrap resamples (default: 1000)",
    )
    g.add_argument(
        "--seed",
        type=_count,
        default=None,
        help="seed of the bootstrap resampling"
        + (", and with --index of the exact sample and the index's training rows" if index else "")
        + " (default: 0)",
    )


def _bootstrap_options(args: argparse.Namespace, *, always: bool = False) -> None:
    """Fill in ``--n-boot`` / ``--seed``; refuse them where nothing is resampled (no ``--ci``,
    unless the command always resamples, as ``compare`` does), since they would be ignored.
    ``--index`` uses ``--seed`` without ``--ci``: it draws the exact sample, the training rows
    and the error report's bootstrap."""
    if not always and args.ci is None:
        seeded = getattr(args, "index", None) is not None
        given = [
            flag
            for flag, value in (("--n-boot", args.n_boot), ("--seed", args.seed))
            if value is not None and not (seeded and flag == "--seed")
        ]
        if given:
            raise InputError(
                f"{given[0]} sets the bootstrap of --ci, and without --ci nothing is resampled; "
                f"add --ci 0.95, or drop {given[0]}."
            )
    if always or args.ci is not None:  # else None: the library refuses n_boot without ci
        args.n_boot = 1000 if args.n_boot is None else args.n_boot
    args.seed = 0 if args.seed is None else args.seed


def add_search_options(p: argparse.ArgumentParser) -> Any:
    """Add the "search" argument group (how the search runs, never what it finds) to a command;
    :func:`search_arguments` turns the parsed values into :func:`embedeval.evaluate` keywords.
    Returns the group."""
    g = p.add_argument_group(
        "search",
        "Which engine searches: local (default, exact, threads), torch (--device), dask "
        "(--scheduler, or a local in-process cluster without it), sharded (--shards) or an "
        "approximate faiss index (--index). An option the chosen search would ignore is an error.",
    )
    g.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        metavar="N",
        help="threads of the search (default: every usable core, at most 8; with --index, "
        "faiss's threads; with --backend torch, PyTorch's CPU threads too; with --backend dask "
        "and no --scheduler, the local cluster's); the numbers do not depend on it",
    )
    g.add_argument(
        "--backend",
        choices=("local", "torch", "dask"),
        default=None,
        help="search backend (default: local; torch with --device, dask with --scheduler)",
    )
    g.add_argument(
        "--device",
        metavar="DEVICE",
        help="torch device of the torch backend: cpu, cuda or cuda:N (implies --backend torch)",
    )
    g.add_argument(
        "--precision",
        choices=("auto", "float32", "tf32", "bf16"),
        default=None,
        help="the torch backend's filter product: auto (default: TF32 on a GPU that has it, "
        "bfloat16 on a CPU that has it for shallow searches, else float32; retrieve takes "
        "float32 on a GPU and bfloat16 only for metrics at depth 10 or less), float32, tf32 or "
        "bf16; rankings are decided in float64 either way, so the numbers do not depend on it",
    )
    g.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="Dask scheduler address, e.g. tcp://10.0.0.5:8786 (implies --backend dask); "
        "--backend dask without it starts a local in-process cluster for the run",
    )
    _add_scale_options(g)
    g.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar (it is only shown when stderr is a terminal)",
    )
    return g


def _add_scale_options(g: Any) -> None:
    """Sharded and approximate search, and the working memory."""
    g.add_argument(
        "--shards",
        type=_positive_int,
        default=None,
        metavar="N",
        help="split the reference set into N shards merged exactly (same numbers)",
    )
    g.add_argument(
        "--index",
        metavar="FACTORY",
        help="approximate search with a faiss index factory string, e.g. HNSW32 or IVF1024,Flat; "
        "the result reports its error against exact search on --exact-sample queries",
    )
    g.add_argument(
        "--index-param",
        action="append",
        type=_index_param,
        metavar="NAME=VALUE",
        help="search-time parameter of --index, e.g. nprobe=64 or efSearch=128 (repeatable)",
    )
    g.add_argument(
        "--exact-sample",
        type=_count,
        default=None,
        metavar="N",
        help="queries also searched exactly to measure --index's error (default: 10000; 0: "
        "none, no error report)",
    )
    g.add_argument(
        "--memory-budget",
        type=_bytes,
        default=None,
        metavar="BYTES",
        help="working memory per thread, e.g. 256M or 2G (default: 256M)",
    )


def _index_param(value: str) -> tuple[str, Any]:
    name, sep, text = value.partition("=")
    if not sep or not name.strip() or not text.strip():
        raise argparse.ArgumentTypeError(f"must be NAME=VALUE, e.g. nprobe=64; got {value!r}")
    for kind in (int, float):
        try:
            return name.strip(), kind(text)
        except ValueError:
            pass
    return name.strip(), text.strip()


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _bytes(value: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)i?B?\s*", value, flags=re.IGNORECASE)
    if not match or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(
            f"must be a positive number of bytes, optionally with K, M, G or T (e.g. 512M); "
            f"got {value!r}"
        )
    size = int(match.group(1)) * _UNITS[match.group(2).upper()]
    if size < _UNITS["M"]:  # the search's smallest working memory
        raise argparse.ArgumentTypeError(f"must be at least 1M (e.g. 256M); got {value!r}")
    return size


def _chosen_backend(args: argparse.Namespace) -> str:
    """``--backend``, or the one ``--device`` / ``--scheduler`` imply (local without them)."""
    if args.backend is not None:
        return args.backend
    return "torch" if args.device else "dask" if args.scheduler else "local"


def check_search_flags(args: argparse.Namespace, *, corpus: bool = False) -> None:
    """Refuse, by their flags and before any work, the search options the chosen backend would
    ignore or cannot combine (the library refuses them too, but names its keywords).
    ``corpus``: the command scans a corpus exactly (``retrieve``): the options of ``--index``
    are refused whatever else is given, and ``--shards`` go with every backend."""
    backend = _chosen_backend(args)
    given = [
        flag
        for flag, value in (
            ("--index", args.index),
            ("--index-param", args.index_param),
            ("--exact-sample", args.exact_sample),
        )
        if value is not None
    ]
    if given and corpus:
        raise InputError(
            f"{given[0]} is an option of approximate search, and {args.command} ranks the "
            "corpus exactly; drop it."
        )
    if given and args.index is None:
        raise InputError(
            f"{given[0]} is an option of approximate search with --index FACTORY, which was "
            "not given; add --index (e.g. --index IVF1024,Flat) or drop it."
        )
    if backend != "torch":
        for flag, value in (("--device", args.device), ("--precision", args.precision)):
            if value is not None:
                raise InputError(
                    f"{flag} {value} is an option of the torch backend, and the backend here "
                    f"is {backend}; pass --backend torch (--device alone implies it), or drop "
                    f"{flag}."
                )
    if not corpus:
        _check_search_combination(args, backend)


def _check_search_combination(args: argparse.Namespace, backend: str) -> None:
    """``--index`` and ``--shards`` against the backend of ``evaluate`` / ``compare``."""
    if args.index is not None and (args.shards is not None or backend != "local"):
        other = f"--shards {args.shards}" if args.shards is not None else f"--backend {backend}"
        raise InputError(
            f"--index {args.index} (approximate search, which faiss runs in parallel itself) "
            f"cannot be combined with {other}; drop one of them."
        )
    if args.index is not None and args.k is None:
        _check_index_depth(args)
    if args.shards is not None and backend != "local":
        raise InputError(
            f"--shards {args.shards} splits the reference set for the local backend, and the "
            f"backend here is {backend} ("
            + ("every worker gets the whole reference" if backend == "dask" else "one device")
            + "); drop one of them."
        )


def _check_index_depth(args: argparse.Namespace) -> None:
    """``--index`` without ``--k``: refuse, by the flags, metrics whose rankings reach each
    query's farthest (or nearest) relevant reference, which an approximate index cannot
    promise to return (the library refuses them too, naming its keywords)."""
    from .engine.registry import default_metrics, parse_metrics

    names = default_metrics(None) if args.metrics is None else args.metrics
    deep = [m.name for m in parse_metrics(names) if m.depth in ("full", "first_hit")]
    if deep:
        raise InputError(
            f"--index {args.index} without --k: {', '.join(deep)} read each query's ranking "
            "down to its farthest (or nearest) relevant reference, which an approximate index "
            "cannot promise to return; add --k (e.g. --k 1000) to evaluate at a fixed depth, "
            "or drop --index for exact search."
        )


@contextlib.contextmanager
def search_arguments(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """The "search" options of :func:`add_search_options` as :func:`embedeval.evaluate` keyword
    arguments; a Dask client it opens is closed on leaving.

    Only options given on the command line are passed: the combinations the chosen search would
    ignore are refused by :func:`check_search_flags` before any work, by their flags, and
    :func:`embedeval.evaluate` still refuses anything else it would ignore.
    """
    backend = _chosen_backend(args)
    kwargs: dict[str, Any] = {"backend": backend, "n_threads": args.threads}
    named = {
        "device": args.device,
        "shards": args.shards,
        "index": args.index,
        "index_params": dict(args.index_param) if args.index_param else None,
        "exact_sample": args.exact_sample,
        "memory_budget": args.memory_budget,
        "precision": args.precision,
    }
    kwargs.update({k: v for k, v in named.items() if v is not None})
    if backend != "dask":
        if args.scheduler:
            raise InputError(
                f"--scheduler {args.scheduler} is only used by --backend dask (the backend here "
                f"is {backend}); drop --scheduler or pass --backend dask."
            )
        yield kwargs
        return
    if args.threads is not None and args.scheduler:
        raise InputError(
            f"--threads {args.threads} sets the threads of a search on this machine; the "
            f"workers of --scheduler {args.scheduler} run it on the threads they were started "
            "with (dask worker --nthreads). Drop --threads."
        )
    del kwargs["n_threads"]  # the local cluster's threads, below
    with _dask_client(args.scheduler, args.threads) as client:
        yield {**kwargs, "client": client}


@contextlib.contextmanager
def _dask_client(address: str | None, threads: int | None = None) -> Iterator[Any]:
    """A client of the scheduler at ``address``, or of a local in-process cluster of
    ``threads`` threads (default: Dask's, one per core)."""
    try:
        from distributed import Client
    except ImportError as exc:
        raise InputError(
            "--backend dask needs Dask's distributed scheduler: pip install 'dask[distributed]'."
        ) from exc
    try:
        with warnings.catch_warnings():
            # A local cluster's dashboard moving to a free port is no news to the user.
            warnings.filterwarnings("ignore", message=r"Port \d+ is already in use")
            client = (
                Client(address, timeout=10)
                if address
                else Client(
                    processes=False,
                    dashboard_address=":0",
                    scheduler_port=0,
                    # a run's own cluster: its workers' warnings (tasks cancelled by Ctrl-C)
                    # are not the user's news; errors still reach the run as exceptions
                    silence_logs=logging.ERROR,
                    **({} if threads is None else {"n_workers": 1, "threads_per_worker": threads}),
                )
            )
    except (OSError, TimeoutError, ValueError) as exc:
        raise InputError(
            f"--scheduler {address}: cannot connect ({_one_line(exc)}); check the address "
            "(tcp://HOST:PORT) and that the scheduler is running."
        ) from exc
    try:
        yield client
    finally:
        client.close()


def build_parser() -> argparse.ArgumentParser:
    """The ``embedeval`` parser: one subcommand per entry of :data:`COMMANDS`."""
    parser = _Parser(
        prog="embedeval",
        description="Evaluate metric-learning embeddings: exact kNN retrieval metrics (P@1,\n"
        "R-Precision, MAP@R, MAP, MRR, Recall@k, NMI/AMI), confidence metrics, figures and\n"
        "checkpoint comparison with confidence intervals.",
        epilog=EPILOG_MAIN,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"embedeval {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_evaluate_command(sub)
    _add_compare_command(sub)
    _add_figures_command(sub)
    _add_demo_command(sub)
    _add_retrieve_command(sub)
    return parser


def _add_evaluate_command(sub: Any) -> None:
    """``evaluate FILE``: the evaluation options and where to write the results."""
    p = sub.add_parser(
        "evaluate",
        help="evaluate one embedding file",
        epilog=EPILOG_EVALUATE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", nargs="?", help="embeddings: .npy, .npz, .safetensors or .parquet")
    _add_evaluation_options(p)
    o = p.add_argument_group("outputs")
    o.add_argument("--json", metavar="OUT", help="write the full result as JSON")
    o.add_argument("--per-class", metavar="OUT", help="per-class table (.csv or .md)")
    o.add_argument(
        "--per-query",
        metavar="OUT",
        help="per-query CSV: query, label, confidence/sigma, the nearest counted reference "
        "(top1_index, top1_label, top1_distance) and every per-query metric",
    )
    o.add_argument(
        "--plots",
        metavar="DIR",
        help="write figures of this run to DIR: per-class (worst 30), distance histograms, "
        "k-sweep, and with confidences the error-vs-reject and confidence-vs-recall curves",
    )
    _add_report_options(p, o)
    o.add_argument(
        "--plot-format",
        default=None,
        choices=("png", "svg", "pdf"),
        help="format of the --plots figures (default: png, at 200 dpi)",
    )


_REPORT_HELP = {
    "report": "write one self-contained HTML page (.html): settings, metrics with CIs, per-class "
    "table, figures and a failure gallery (the worst queries and what they retrieved)",
    "images": "image paths, one per query row (relative to FILE's folder), shown as thumbnails",
    "reference_images": "image paths, one per reference row",
    "texts": "captions, one line per query row",
    "reference_texts": "captions, one per reference row",
    "gallery_metric": "the worst queries by this metric (default: map_at_r, else r_precision, "
    "else P@1)",
    "gallery_k": "references shown per query (default: 5)",
}


def _add_report_options(
    p: argparse.ArgumentParser, outputs: Any, helps: dict[str, str] | None = None
) -> None:
    """``--report`` and what its failure gallery shows; ``helps`` replaces the help of some
    (the command's own words for its rows)."""
    h = {**_REPORT_HELP, **(helps or {})}
    outputs.add_argument("--report", metavar="OUT", help=h["report"])
    g = p.add_argument_group("report gallery")
    for name in ("images", "reference_images", "texts", "reference_texts"):
        g.add_argument("--" + name.replace("_", "-"), metavar="FILE", help=h[name])
    g.add_argument(
        "--gallery",
        type=_count,
        default=None,
        metavar="N",
        help="queries per gallery table (default: 20; 0: no gallery)",
    )
    g.add_argument("--gallery-metric", metavar="NAME", help=h["gallery_metric"])
    g.add_argument(
        "--gallery-k", type=_positive_int, default=None, metavar="K", help=h["gallery_k"]
    )
    g.add_argument(
        "--thumbnail",
        type=_thumbnail,
        default=None,
        metavar="PX",
        help="thumbnail size in pixels (default: 64)",
    )


def _add_compare_command(sub: Any) -> None:
    """``compare FILES``: the evaluation options, the baseline, the test and the outputs."""
    p = sub.add_parser(
        "compare",
        help="compare checkpoints on the same queries",
        epilog=EPILOG_COMPARE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "files",
        nargs="*",
        help="one embedding file per checkpoint; ordered naturally by name (epoch_2 before "
        "epoch_10) unless --keep-order",
    )
    p.add_argument(
        "--keep-order",
        action="store_true",
        help="keep the checkpoints in the order given (default: natural order of the names, "
        "numbers compared as numbers)",
    )
    _add_evaluation_options(p, always_resampled=True)
    p.add_argument(
        "--baseline",
        default=None,
        help="checkpoint name (file stem) to compare against (default: the first)",
    )
    p.add_argument(
        "--test",
        default="bootstrap",
        choices=("bootstrap", "permutation"),
        help="paired test against the baseline over the shared queries: paired bootstrap or "
        "sign-flip permutation (default: bootstrap)",
    )
    p.add_argument("--plot", metavar="OUT", help="metric-vs-checkpoint figure (.png/.svg/.pdf)")
    p.add_argument("--json", metavar="OUT", help="write the comparison table as JSON")
    p.add_argument("--markdown", metavar="OUT", help="write the comparison table as Markdown")
    p.add_argument(
        "--report",
        metavar="OUT",
        help="write a self-contained HTML page (.html): the table with intervals and paired "
        "differences, and the plot",
    )
    p.add_argument(
        "--confidence-metrics",
        default=None,
        help="also compare these confidence metrics, comma-separated (e.g. "
        "aurc_precision_at_1,augrc_precision_at_1,ece,r_auroc; needs confidences)",
    )


def _add_figures_command(sub: Any) -> None:
    p = sub.add_parser(
        "figures",
        help="regenerate every committed figure",
        description="Write the figures of the README as PNGs, from fixed "
        "seeds: the same command gives the same pixels.",
    )
    p.add_argument("--out", default="figures", help="output folder (default: figures/)")


def _add_demo_command(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="evaluate scikit-learn's digits embedded three ways",
        description="Embed scikit-learn's handwritten digits as raw pixels, PCA-8 and NCA-16 (a "
        "learned linear metric), evaluate each leave-one-out with 95% bootstrap intervals, "
        "print the comparison and write report.json, report.md, figures and two HTML pages "
        "(report.html for NCA-16 with its failure gallery, comparison.html for the three) to "
        "--out. Nothing is downloaded.",
    )
    p.add_argument(
        "--out", default="embedeval-demo", help="report folder (default: embedeval-demo/)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _loaded(flag: str, path: str, n: int, of: str, what: str) -> np.ndarray:
    # Checked here, not only in evaluate(), so the message names the flag and the file.
    from .io import load_array

    arr = load_array(path, what=what, indicators=what == "labels")  # multi-label: 2-D 0/1
    if len(arr) != n:
        raise InputError(
            f"{flag} {path} has {len(arr)} values but {of} has {n} rows; "
            "pass one value per embedding row, in the same order."
        )
    # Checked here too, so that NaN, fractional or non-numeric values name the flag and file.
    if what == "confidences":
        as_vector(arr, f"{flag} {path}")
    elif arr.ndim == 1:
        as_labels(arr, f"{flag} {path}")
    return arr


def _load_inputs(args: argparse.Namespace, path: str) -> dict[str, Any]:
    """Every array of one evaluation, as keyword arguments of :func:`embedeval.evaluate`."""
    from .io import load_embeddings

    data = load_embeddings(path)
    n = data.embeddings.shape[0]
    labels = data.labels
    if args.labels:
        labels = _loaded("--labels", args.labels, n, path, "labels")
    if labels is None:
        raise InputError(f"{path} has no labels; pass --labels FILE or store 'labels' in an .npz.")
    kwargs: dict[str, Any] = {"query": data.embeddings, "query_labels": labels}
    if args.ref_includes_query and not args.reference:
        raise InputError(
            "--ref-includes-query needs --reference: without a gallery the run is already "
            "leave-one-out over the queries (each query's own row excluded). Drop "
            "--ref-includes-query, or pass the gallery whose first rows are the queries."
        )
    if args.reference:
        kwargs.update(_load_reference(args, path, data.embeddings.shape[1]))
    elif args.reference_labels or args.reference_groups:
        raise InputError(
            "--reference-labels and --reference-groups need --reference FILE (without it the "
            "evaluation is leave-one-out over the queries)."
        )
    groups = _loaded("--groups", args.groups, n, path, "groups") if args.groups else data.groups
    if groups is not None:
        kwargs["query_groups"] = groups
    _check_groups_pair(args, path, kwargs)
    confidences, lower = None, args.lower_is_confident
    if args.confidences:
        confidences = _loaded("--confidences", args.confidences, n, path, "confidences")
    elif data.confidences is not None:
        confidences = data.confidences
    elif data.sigmas is not None:
        confidences, lower = data.sigmas, True
    elif lower:
        raise InputError(
            f"--lower-is-confident says how to read confidences, and {path} has none; pass "
            "--confidences FILE (or store 'confidences' / 'sigmas' in the .npz), or drop it."
        )
    kwargs.update(confidences=confidences, higher_is_confident=not lower)
    return kwargs


def _check_groups_pair(args: argparse.Namespace, path: str, kwargs: dict[str, Any]) -> None:
    """With a gallery, group ids on one side only would be refused by evaluate() under its
    argument names; refuse them here under the flags and files they came from."""
    if not args.reference or ("query_groups" in kwargs) == ("reference_groups" in kwargs):
        return
    if "reference_groups" in kwargs:
        given = args.reference_groups and f"--reference-groups {args.reference_groups}"
        given, side, missing = given or f"{args.reference} (groups)", "queries have", "--groups"
    else:
        given = args.groups and f"--groups {args.groups}"
        given, side, missing = given or f"{path} (groups)", "gallery has", "--reference-groups"
    raise InputError(
        f"{given} gives group ids but the {side} none; pass {missing} FILE (one group id "
        "per row) so that both sides have them, or drop the groups."
    )


def _load_reference(args: argparse.Namespace, path: str, dim: int) -> dict[str, Any]:
    from .io import load_embeddings

    ref = load_embeddings(args.reference)
    n_ref = ref.embeddings.shape[0]
    if ref.embeddings.shape[1] != dim:
        raise InputError(
            f"{path} has dimension {dim} but --reference {args.reference} has "
            f"{ref.embeddings.shape[1]}; both must come from the same model."
        )
    ref_labels = (
        _loaded("--reference-labels", args.reference_labels, n_ref, args.reference, "labels")
        if args.reference_labels
        else ref.labels
    )
    if ref_labels is None:
        raise InputError(f"{args.reference} has no labels; pass --reference-labels FILE.")
    out = {
        "reference": ref.embeddings,
        "reference_labels": ref_labels,
        "ref_includes_query": args.ref_includes_query,
    }
    ref_groups = (
        _loaded("--reference-groups", args.reference_groups, n_ref, args.reference, "groups")
        if args.reference_groups
        else ref.groups
    )
    if ref_groups is not None:
        out["reference_groups"] = ref_groups
    return out


def _evaluate_file(
    args: argparse.Namespace,
    path: str,
    search: dict[str, Any],
    *,
    with_ci: bool = True,
    inputs: Any = None,
) -> Any:
    from .evaluation.evaluate import evaluate

    kwargs = _load_inputs(args, path) if inputs is None else inputs
    return evaluate(
        **kwargs,
        **search,
        metrics=args.metrics,
        k=args.k,
        distance=args.distance,
        average=args.average,
        ci=args.ci if with_ci else None,
        n_boot=args.n_boot if with_ci else None,
        seed=args.seed,
        progress=False if args.quiet else None,
    )


def _summary(res: Any) -> str:
    return (
        f"{res.n_queries} queries ({res.n_lone} lone: no same-class reference, left out), "
        f"{res.settings['n_reference']} references, distance={res.settings['distance']}, "
        f"k={res.settings['k']}, average={res.settings['average']}"
    )


def _per_class_table(res: Any, suffix: str) -> str:
    metrics = list(res.per_class)
    labels = list(next(iter(res.per_class.values()), {}))
    counts = label_sizes(res.query_labels)
    rows = [
        [str(lab), str(counts.get(lab, 0))]
        + [f"{res.per_class[m].get(lab, math.nan):.6f}" for m in metrics]
        for lab in labels
    ]
    head = ["label", "n_queries", *metrics]
    if suffix == ".md":
        return markdown_table(head, rows)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(head)
    w.writerows(rows)
    return buf.getvalue()


def _per_query_table(res: Any, top: tuple[np.ndarray, np.ndarray], inputs: dict) -> str:
    """One row per query: index, label, confidence when given, the nearest reference that
    counts (index, label, distance) and every per-query metric — error analysis needs no join."""
    idx, dist = top
    ref_labels = inputs.get("reference_labels", inputs["query_labels"])
    ref_labels = np.asarray(ref_labels)
    conf = inputs.get("confidences")
    conf_name = "confidence" if inputs.get("higher_is_confident", True) else "sigma"
    metrics = list(res.per_query)
    head = ["query", "label", *([conf_name] if conf is not None else [])]
    head += ["top1_index", "top1_label", "top1_distance", *metrics]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(head)
    columns = [res.per_query[m] for m in metrics]
    conf_list = np.asarray(conf, dtype=np.float64).tolist() if conf is not None else None
    for i, lab in enumerate(res.query_labels):
        j = int(idx[i])
        row = [i, label_text(lab), *([repr(conf_list[i])] if conf_list is not None else [])]
        row += [j, label_text(ref_labels[j]), repr(float(dist[i]))] if j >= 0 else ["", "", ""]
        row += ["" if np.isnan(c[i]) else f"{c[i]:.6f}" for c in columns]
        w.writerow(row)
    return buf.getvalue()


def _check_output(path: str | None, suffixes: tuple[str, ...] | None, flag: str) -> None:
    """Refuse an output that cannot be written *before* any work (a folder when ``suffixes``
    is None), so a long run never ends in a write error."""
    if path is None:
        return
    target = Path(path)
    if suffixes is not None:
        if target.suffix.lower() not in suffixes:
            raise InputError(f"{flag} {path}: use a file ending in {' or '.join(suffixes)}.")
        if target.is_dir():
            raise InputError(f"{flag} {path} is a folder; name a file inside it.")
        folder = target.parent
    else:
        folder = target
    # The nearest existing ancestor must be a writable folder (missing folders are created).
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(
            f"{flag} {path}: cannot write there, {existing} is a file, not a folder; "
            "choose another path."
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(
            f"{flag} {path}: cannot write there, folder {existing} is not writable; "
            "choose a writable path."
        )
    if suffixes is not None and target.is_file() and not os.access(target, os.W_OK):
        raise InputError(f"{flag} {path} is read-only; make it writable or choose another path.")


def _plot_paths(folder: str, fmt: str) -> list[str]:
    from .report.run_figures import PLOT_NAMES

    return [str(Path(folder) / f"{name}.{fmt}") for name in PLOT_NAMES]


def cmd_evaluate(args: argparse.Namespace) -> int:
    """``embedeval evaluate``: check every output, evaluate one file, print and write."""
    _bootstrap_options(args)
    check_search_flags(args)
    _check_output(args.per_class, (".csv", ".md"), "--per-class")
    _check_output(args.per_query, (".csv",), "--per-query")
    _check_output(args.json, (".json",), "--json")
    _check_output(args.plots, None, "--plots")
    _check_output(args.report, (".html",), "--report")
    _check_report_options(args)
    _check_gallery_metric(args, _run_metric_names(args))
    rows = _read_row_files(args)
    plot_files = _plot_paths(args.plots, args.plot_format) if args.plots else []
    _check_paths(args, [args.json, args.per_class, args.per_query, args.report, *plot_files])
    inputs = _load_inputs(args, args.file)
    _check_row_counts(
        args, rows, len(inputs["query"]), len(inputs.get("reference", inputs["query"]))
    )
    with warnings.catch_warnings(record=True) as caught, search_arguments(args) as search:
        warnings.simplefilter("always")
        res = _evaluate_file(args, args.file, search, inputs=inputs)
    _refuse_all_lone(res, args.file)  # before the warnings: the error says it all, once
    # With --k max_bin_count the default metrics follow the depth found in the data, so the
    # gallery metric is checked once more, still before any output is written.
    _check_gallery_metric(args, tuple(res.per_query))
    for w in caught:
        _show_warning(w.message, w.category)
    res.provenance.update(_provenance(args))
    _say(f"{args.file}: {_summary(res)}")
    _say(res.table())
    _write_evaluation(args, res, inputs, rows)
    return 0


def _run_metric_names(args: argparse.Namespace) -> tuple[str, ...] | None:
    """The per-query metrics the run will report, known from the options alone; None when the
    depth found in the data decides them (``--k max_bin_count`` with the default set)."""
    from .engine.registry import default_metrics, parse_metrics

    if args.metrics is None and args.k == "max_bin_count":
        return None
    names = default_metrics(args.k) if args.metrics is None else args.metrics
    return tuple(m.name for m in parse_metrics(names) if m.kind == "knn")


def _check_gallery_metric(args: argparse.Namespace, names: tuple[str, ...] | None) -> None:
    """Refuse a ``--gallery-metric`` the run has no per-query values of (``names``; None: the
    default set at a depth not yet known, whose last member is a Recall@k)."""
    from .engine.registry import DEFAULT_METRICS

    metric = args.gallery_metric
    if not args.report or metric is None:
        return
    if names is None:
        names = DEFAULT_METRICS[:-1]
        if re.fullmatch(r"recall_at_[1-9][0-9]*", metric):
            return
    if metric not in names:
        raise InputError(
            f"--gallery-metric {metric}: this run has no per-query values of it; choose one of "
            f"{', '.join(names) or '(none)'}, or add it to --metrics."
        )


def _write_evaluation(
    args: argparse.Namespace, res: Any, inputs: dict[str, Any], rows: dict[str, list[str]]
) -> None:
    """Every output of ``evaluate`` that was asked for."""
    if args.json:
        res.to_json(args.json)
    if args.per_class:
        write_text(args.per_class, _per_class_table(res, Path(args.per_class).suffix.lower()))
    if args.per_query:
        from .report.run_figures import top1

        write_text(args.per_query, _per_query_table(res, top1(inputs, res, args.threads), inputs))
    if args.plots:
        from .report.run_figures import write_plots

        for path in write_plots(res, inputs, args.plots, args.plot_format):
            _say(f"wrote {path}")
    if args.report:
        _write_report(args, res, inputs, rows)
        _say(f"wrote {args.report}")


#: Options that shape one output, the output that needs them, and their defaults (parsed as
#: None, so that one given without its output is told apart from the default).
_OUTPUT_OPTIONS = {
    "images": ("report", None),
    "reference_images": ("report", None),
    "texts": ("report", None),
    "reference_texts": ("report", None),
    "gallery_metric": ("report", None),
    "gallery": ("report", 20),
    "gallery_k": ("report", 5),
    "thumbnail": ("report", 64),
    "plot_format": ("plots", "png"),
}


def _check_report_options(args: argparse.Namespace) -> None:
    """Refuse an option of an output that was not asked for (``--thumbnail`` without
    ``--report``, ``--plot-format`` without ``--plots``), which would be ignored; then fill in
    the defaults."""
    for name, (output, default) in _OUTPUT_OPTIONS.items():
        if not hasattr(args, name):
            continue
        if getattr(args, name) is not None and not getattr(args, output, None):
            flag = "--" + name.replace("_", "-")
            if output == "plots":
                raise InputError(f"{flag} is the format of --plots: add --plots DIR, or drop it.")
            raise InputError(
                f"{flag} is shown in the HTML report: add --report OUT.html, or drop it."
            )
        if getattr(args, name) is None:
            setattr(args, name, default)


def _write_report(
    args: argparse.Namespace, res: Any, inputs: dict[str, Any], rows: dict[str, list[str]]
) -> None:
    with _warnings_shown():
        res.to_html(
            args.report,
            query=inputs["query"],
            reference=inputs.get("reference"),
            reference_labels=inputs.get("reference_labels"),
            query_groups=inputs.get("query_groups"),
            reference_groups=inputs.get("reference_groups"),
            title=f"embedeval report: {Path(args.file).name}",
            **_report_options(args, rows),
        )


def _report_options(args: argparse.Namespace, rows: dict[str, list[str]]) -> dict[str, Any]:
    """The gallery options of ``--report``: the media lists of :func:`_read_row_files` (image
    paths made relative to their list file's folder), sizes."""
    media: dict[str, Any] = dict.fromkeys(_ROW_FILES)
    for name, lines in rows.items():
        folder = Path(getattr(args, name)).parent
        media[name] = [str(folder / ln.strip()) for ln in lines] if "images" in name else lines
    return {
        **media,
        "gallery": args.gallery,
        "gallery_metric": args.gallery_metric,
        "gallery_k": args.gallery_k,
        "thumbnail": args.thumbnail,
    }


@contextlib.contextmanager
def _warnings_shown() -> Iterator[None]:
    """Warnings raised inside, each printed once as one line after it."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        _show_warning(w.message, w.category)


#: The report's one-entry-per-row files, and whose rows they follow.
_ROW_FILES = {
    "images": "query",
    "reference_images": "reference",
    "texts": "query",
    "reference_texts": "reference",
}


def _read_row_files(args: argparse.Namespace) -> dict[str, list[str]]:
    """The ``--images`` / ``--texts`` / ``--reference-*`` files given, read before any work so
    that a missing or non-UTF-8 file fails at once; one entry per line."""
    return {
        name: _row_lines("--" + name.replace("_", "-"), getattr(args, name))
        for name in _ROW_FILES
        if getattr(args, name, None)
    }


def _row_lines(flag: str, path: str) -> list[str]:
    """The lines of a UTF-8 text file (:func:`read_lines`: newlines only), a last empty line
    dropped."""
    if Path(path).exists() and not Path(path).is_dir() and not Path(path).is_file():
        raise InputError(f"{flag} {not_a_file(path)}")
    if not Path(path).is_file():
        what = "is a folder" if Path(path).is_dir() else "does not exist"
        raise InputError(f"{flag} {path} {what}; pass a text file with one entry per line.")
    try:
        lines = read_lines(path)
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{flag} {path} is not UTF-8 text (byte {exc.start} cannot be decoded); save it "
            "as UTF-8, one entry per line."
        ) from None
    if lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def _check_row_counts(
    args: argparse.Namespace, rows: dict[str, list[str]], n_query: int, n_ref: int
) -> None:
    """One entry per query row (``--images``, ``--texts``) or reference row (the others)."""
    for name, lines in rows.items():
        side = _ROW_FILES[name]
        n = n_query if side == "query" else n_ref
        if len(lines) != n:
            raise InputError(
                f"--{name.replace('_', '-')} {getattr(args, name)} has {len(lines)} lines but "
                f"there are {n} {side} rows; write one entry per {side} row, in the same order."
            )


def _refuse_all_lone(res: Any, path: str) -> None:
    if res.n_queries and res.n_lone == res.n_queries and res.per_query:
        n_labels = len(label_sizes(res.query_labels))
        hint = " every label is unique: wrong labels file?" if n_labels == res.n_queries else ""
        share, form = (
            ("sharing a label", "one row of 0/1 label indicators per item")
            if np.ndim(res.query_labels) == 2
            else ("with its label", "one label per row")
        )
        raise InputError(
            f"{path}: every one of the {res.n_queries} queries is lone (no other reference "
            f"{share}), so no retrieval metric is defined;{hint} Check --labels / "
            f"--reference-labels ({form}, same order as the embeddings)."
        )


def _provenance(args: argparse.Namespace) -> dict[str, Any]:
    from .report.run_figures import file_sha256

    return {
        "command": ["embedeval", *args.argv],
        "inputs": [
            {"role": flag, "path": path, "name": Path(path).name, "sha256": file_sha256(path)}
            for flag, path in _input_paths(args)
        ],
        "options": {k: v for k, v in sorted(vars(args).items()) if k not in ("command", "argv")},
    }


def natural_key(path: str) -> list[Any]:
    """Sort key comparing the digit runs of a name as numbers, the name before its suffix (so
    ``ck`` comes before ``ck2`` as it would without the ``.npz``).

    >>> sorted(["epoch_10.npz", "epoch_5.npz", "epoch_1.npz"], key=natural_key)
    ['epoch_1.npz', 'epoch_5.npz', 'epoch_10.npz']
    >>> sorted(["ck2.npz", "ck.npz", "ck10.npz"], key=natural_key)
    ['ck.npz', 'ck2.npz', 'ck10.npz']
    """
    name = Path(str(path))
    parts = re.split(r"(\d+)", str(name.with_suffix("")) if name.suffix else str(name))
    # the end of the name (then its suffix) before any further character or digit run
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts] + [(-1, 0, name.suffix)]


def _input_paths(args: argparse.Namespace) -> list[tuple[str, str]]:
    flags = (
        *("labels", "reference", "reference_labels", "groups", "reference_groups", "confidences"),
        *("images", "reference_images", "texts", "reference_texts"),
    )
    flags += ("queries", "query_ids", "corpus", "doc_ids", "qrels")  # retrieve
    named = [("--" + f.replace("_", "-"), getattr(args, f, None)) for f in flags]
    files = [args.file] if getattr(args, "file", None) else list(getattr(args, "files", []))
    return [("input", f) for f in files] + [(flag, p) for flag, p in named if p]


def _identity(path: str) -> Any:
    # An existing file is known by (device, inode): a symlink or a hard link to an input is the
    # input. A file yet to be written is known by its resolved path.
    try:
        st = os.stat(path)
        return (st.st_dev, st.st_ino)
    except OSError:
        return os.path.realpath(path)


def _check_paths(args: argparse.Namespace, outputs: Sequence[str | None]) -> None:
    """Refuse an output that would overwrite an input, and two outputs to the same file."""
    seen: dict[Any, str] = {}
    for flag, path in _input_paths(args):
        role = f"the {flag} file" if flag != "input" else "an input file"
        seen.setdefault(_identity(path), role)
    outs: dict[Any, str] = {}
    for out in outputs:
        if out is None:
            continue
        real = _identity(out)
        if real in seen:
            raise InputError(
                f"output {out} is {seen[real]}; writing it would destroy the input. Choose "
                "another output path."
            )
        if real in outs:
            raise InputError(
                f"two outputs name the same file {out}; one would overwrite the other. Give "
                "each output its own path."
            )
        outs[real] = out


def cmd_compare(args: argparse.Namespace) -> int:
    """``embedeval compare``: evaluate each checkpoint, compare them, print and write."""
    from .evaluation.compare import compare

    _bootstrap_options(args, always=True)
    check_search_flags(args)
    _check_output(args.json, (".json",), "--json")
    _check_output(args.markdown, (".md",), "--markdown")
    _check_output(args.plot, (".png", ".svg", ".pdf"), "--plot")
    _check_output(args.report, (".html",), "--report")
    show = not args.quiet and sys.stderr.isatty()
    if not args.keep_order:  # the shell gives epoch_1, epoch_10, epoch_5: plot epoch_5 second
        args.files = sorted(args.files, key=natural_key)
    _check_paths(args, [args.json, args.markdown, args.plot, args.report])
    names = _checkpoint_names(args.files)
    if args.baseline is not None and args.baseline not in names:
        raise InputError(
            f"--baseline {args.baseline!r} is not one of the checkpoints "
            f"({', '.join(names)}); pass one of those names (file stems)."
        )
    _check_confidence_metrics(args)
    with search_arguments(args) as search:
        results = _evaluate_checkpoints(args, names, search, show)
    cmp = compare(
        results,
        metrics=_compared_metrics(args.confidence_metrics, results),
        baseline=args.baseline if args.baseline is not None else 0,
        ci=args.ci or 0.95,
        n_boot=args.n_boot,
        seed=args.seed,
        test=args.test,
    )
    _say(repr(cmp))
    _write_comparison(args, cmp)
    return 0


def _evaluate_checkpoints(
    args: argparse.Namespace, names: list[str], search: dict[str, Any], show: bool
) -> dict[str, Any]:
    results = {}
    for name, f in zip(names, args.files, strict=True):
        if show:
            print(f"evaluating {f} ...", file=sys.stderr)
        inputs = _load_inputs(args, f)
        if args.confidence_metrics and inputs["confidences"] is None:
            raise InputError(
                f"--confidence-metrics needs confidences, and {f} has none; pass --confidences "
                "FILE or store 'confidences' (or 'sigmas') in each .npz."
            )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # compare() draws its own (paired) resamples; a per-file bootstrap is wasted work
            results[name] = _evaluate_file(args, f, search, with_ci=False, inputs=inputs)
        # before the warnings, as in evaluate: every metric NaN is said once, by the error
        _refuse_all_lone(results[name], f)
        for w in caught:
            _show_warning(w.message, w.category)
    return results


def _checkpoint_names(files: Sequence[str]) -> list[str]:
    """One distinct row name per checkpoint: the file stem, else the path, else a number."""
    names = [Path(f).stem for f in files]
    if len(set(names)) != len(names):
        names = [str(Path(f)) for f in files]
    if len(set(names)) != len(names):  # the same file twice: keep both rows apart
        names = [f"{n} #{i + 1}" for i, n in enumerate(names)]
    return names


def _confidence_names(text: str) -> list[str]:
    return [m.strip() for m in text.split(",") if m.strip()]


def _check_confidence_metrics(args: argparse.Namespace) -> None:
    """Refuse, before any evaluation, a ``--confidence-metrics`` name that no run with these
    ``--metrics`` gives (one whose value depends on the data is checked after evaluating)."""
    from .metrics.confidence import confidence_metric_names

    metrics = _run_metric_names(args) if args.confidence_metrics else None
    if metrics is None:  # not asked for, or the depth found in the data decides the metrics
        return
    known = confidence_metric_names(metrics)
    unknown = [m for m in _confidence_names(args.confidence_metrics) if m not in known]
    if unknown:
        raise InputError(
            f"--confidence-metrics {unknown[0]!r} is not a confidence metric of this run; choose "
            f"among {', '.join(known)} (the calibration and AUROC ones need precision_at_1)."
        )


def _compared_metrics(confidence_metrics: str | None, results: dict[str, Any]) -> Any:
    """The per-query metrics plus the ``--confidence-metrics`` asked for (None: the default)."""
    if not confidence_metrics:
        return None
    first = next(iter(results.values()))
    extra = _confidence_names(confidence_metrics)
    unknown = [m for m in extra if m not in first.confidence]
    if unknown:
        raise InputError(
            f"--confidence-metrics {unknown[0]!r} was not computed (are confidences "
            f"given?); available: {', '.join(first.confidence) or 'none'}."
        )
    return [*first.per_query, *extra]


def _write_comparison(args: argparse.Namespace, cmp: Any) -> None:
    if args.json:
        from .utils.files import run_stamp

        data = {**cmp.to_dict(), "provenance": {**run_stamp(), **_provenance(args)}}
        write_text(args.json, json.dumps(data, indent=2, allow_nan=False) + "\n")
    if args.markdown:
        write_text(args.markdown, cmp.to_markdown())
    if args.plot:
        from .plots import save_figure

        save_figure(cmp.plot(), args.plot, dpi=200)
    if args.report:
        cmp.to_html(args.report)
        _say(f"wrote {args.report}")


EPILOG_RETRIEVE = """examples:
  embedeval retrieve queries.npy --query-ids queries.txt --corpus corpus.npy \\
      --doc-ids docs.txt --qrels qrels/test.tsv
  embedeval retrieve q.npz --corpus c.npz --qrels test.qrels --ties trec_eval \\
      --metrics ndcg@10 map recall@1000 --run run.trec --depth 1000 --json res.json
  embedeval retrieve q.npz --corpus c.npz --qrels test.qrels --report run.html \\
      --texts queries.txt --reference-texts passages.txt   # worst queries, their top documents

QUERIES and --corpus: .npy (memory-mapped, float32 or float16), .npz (an 'ids' array inside
gives the ids), .safetensors, .parquet.  Id files: one id per line.  Qrels: TREC
('qid 0 docid grade') or BEIR tsv.  --ties trec_eval orders equal scores as trec_eval does
(doc id descending), so trec_eval on the --run file reproduces the numbers.
"""


def _add_retrieval_conventions(m: Any) -> None:
    """``retrieve``'s metrics and the conventions that decide their values."""
    m.add_argument(
        "--metrics",
        nargs="+",
        metavar="NAME",
        help="e.g. ndcg@10 map@100 mrr@10 recall@1000 precision@10 (trec_eval "
        "names too: ndcg_cut_10, P_10, recip_rank); default: that BEIR set",
    )
    m.add_argument(
        "--distance",
        default="cosine",
        choices=("cosine", "inner_product", "euclidean"),
        help="(default: cosine)",
    )
    m.add_argument(
        "--ties",
        default="index",
        choices=("index", "trec_eval"),
        help="equal scores by corpus row (index, default) or doc id descending (trec_eval)",
    )
    m.add_argument(
        "--missing",
        default="error",
        choices=("error", "zero"),
        help="a qrels query without an embedding: an error (default) or 0 (trec_eval -c)",
    )
    m.add_argument(
        "--relevance-level",
        type=_positive_int,
        default=1,
        metavar="N",
        help="relevant means grade >= N, N >= 1 (trec_eval -l; default: 1)",
    )
    m.add_argument(
        "--gain",
        default="linear",
        choices=("linear", "exponential"),
        help="nDCG gain: the grade (trec_eval, default) or 2^grade - 1 (grades up to 959)",
    )
    m.add_argument(
        "--ignore-identical-ids",
        action="store_true",
        help="never retrieve a document whose id is the query's (BEIR, MTEB)",
    )


def _add_retrieve_command(sub: Any) -> None:
    """``retrieve QUERIES``: judged-relevance IR metrics (qrels) of a query set on a corpus."""
    p = sub.add_parser(
        "retrieve",
        help="IR metrics against qrels (nDCG@10, MAP, MRR, recall@1000, ...), trec_eval's",
        epilog=EPILOG_RETRIEVE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Optional here only so that "--metrics a b QUERIES" can hand QUERIES back (_parse).
    p.add_argument(
        "queries", nargs="?", help="query embeddings: .npy, .npz, .safetensors or .parquet"
    )
    i = p.add_argument_group("inputs")
    i.add_argument("--query-ids", metavar="FILE", help="one query id per line")
    i.add_argument("--corpus", metavar="FILE", required=True, help="document embeddings")
    i.add_argument("--doc-ids", metavar="FILE", help="one document id per line")
    i.add_argument("--qrels", metavar="FILE", required=True, help="TREC or BEIR qrels file")
    _add_retrieval_conventions(p.add_argument_group("metrics and conventions"))
    _add_statistics_options(
        p.add_argument_group("statistics"), "the evaluated queries resampled", index=False
    )
    add_search_options(p)
    o = p.add_argument_group("outputs")
    o.add_argument("--run", metavar="OUT", help="write the ranking as a TREC run file")
    o.add_argument(
        "--depth",
        type=_positive_int,
        default=None,
        metavar="N",
        help="documents per query in --run (default: the deepest cut-off)",
    )
    o.add_argument("--json", metavar="OUT", help="write the full result as JSON")
    o.add_argument("--per-query", metavar="OUT", help="per-query CSV: query id and every metric")
    _add_report_options(p, o, _RETRIEVE_REPORT_HELP)


_RETRIEVE_REPORT_HELP = {
    "report": "write one self-contained HTML page (.html): inputs, conventions, metrics with "
    "CIs, the per-query table and a failure gallery (the worst queries, their top documents "
    "with qrels grades, relevant ones marked)",
    "reference_images": "image paths, one per corpus row",
    "texts": "query texts, one line per query row (shown cut to 300 characters)",
    "reference_texts": "passages, one line per corpus row (shown cut to 300 characters)",
    "gallery_metric": "the worst queries by this metric (default: the first metric)",
    "gallery_k": "documents shown per query (default: 5; at most the run's depth)",
}


def _retrieval_inputs(args: argparse.Namespace) -> dict[str, Any]:
    """The embeddings, ids and qrels of ``retrieve``; every error names its file."""
    from .io import load_retrieval_embeddings, read_ids
    from .protocols.qrels_files import read_qrels

    out: dict[str, Any] = {}
    for key, path, ids_flag, ids_path in (
        ("queries", args.queries, "--query-ids", args.query_ids),
        ("corpus", args.corpus, "--doc-ids", args.doc_ids),
    ):
        arr, inner = load_retrieval_embeddings(path)
        ids = read_ids(ids_path, ids_flag.lstrip("-")) if ids_path else inner
        if ids is None:
            raise InputError(
                f"{path} holds no ids; give {ids_flag} FILE (one id per line) or save them "
                "inside an .npz as np.savez(path, embeddings=..., ids=...)."
            )
        if len(ids) != arr.shape[0]:
            where = ids_path or f"{path} (ids)"
            raise InputError(
                f"{where} has {len(ids)} ids but {path} has {arr.shape[0]} rows; give one id "
                "per row, in row order."
            )
        if args.run is not None:  # before any work or output: a TREC line splits on whitespace
            _check_run_ids(ids, ids_path or f"{path} (ids)", "line" if ids_path else "entry")
        out[key], out[key + "_ids"] = arr, ids
    if out["queries"].shape[1] != out["corpus"].shape[1]:
        raise InputError(
            f"{args.queries} has dimension {out['queries'].shape[1]} but {args.corpus} has "
            f"{out['corpus'].shape[1]}; embed both with the same model."
        )
    out["qrels"] = read_qrels(args.qrels)
    _refuse_missing_queries(args, out["qrels"], out["queries_ids"])
    return out


def _refuse_missing_queries(args: argparse.Namespace, qrels: dict, ids: Any) -> None:
    """Judged queries without an embedding, named with the files and the flag that counts
    them (the library's own error names its keyword argument)."""
    from .protocols.qrels import unembedded_queries

    if args.missing != "error":
        return
    absent, shown = unembedded_queries(qrels, ids)
    if absent:
        raise InputError(
            f"{args.qrels}: {len(absent)} judged queries have no embedding in {args.queries} "
            f"({shown}); embed them, drop them from the qrels, or pass --missing zero to count "
            "them as 0 (trec_eval -c)."
        )


def _check_run_ids(ids: Any, where: str, entry: str) -> None:
    """Ids a TREC run can hold (``--run``): non-empty and free of whitespace, or an error
    naming ``where`` and the ``entry`` (``"line"`` of an ids file, else ``"entry"``)."""
    from .protocols.qrels_files import unfit_run_id

    text = [str(v) for v in ids]
    bad = unfit_run_id(text)
    if bad is None:
        return
    why = "is empty" if not text[bad] else f"{text[bad]!r} holds whitespace"
    raise InputError(
        f"{where} {entry} {bad + 1}: the id {why}, and a TREC run (--run) splits its lines on "
        "whitespace; give every row a non-empty id without spaces (e.g. '_' for them)."
    )


def _check_depth(args: argparse.Namespace) -> None:
    """``--depth`` shapes the run file and the report's gallery, never a metric: without
    either it would be ignored."""
    if args.depth is not None and not (args.run or args.report):
        raise InputError(
            "--depth is how many documents per query --run writes (and --report can show); "
            "add --run OUT, or drop --depth."
        )


def _check_judged_gallery_metric(metrics: list[str] | None, gallery_metric: str) -> None:
    """``retrieve --gallery-metric``: one of the run's ``--metrics`` in any spelling, refused
    by its flag (the library's own error names its keyword argument)."""
    from .evaluation.judged_html import gallery_metric_name
    from .metrics.judged import parse_ir_metrics

    names = [m.name for m in parse_ir_metrics(metrics)]
    try:
        gallery_metric_name(names, gallery_metric)
    except InputError:
        raise InputError(
            f"--gallery-metric {gallery_metric}: this run has no per-query values of it; "
            f"choose one of {', '.join(names)}, or add it to --metrics."
        ) from None


def cmd_retrieve(args: argparse.Namespace) -> int:
    """``embedeval retrieve``: check every output, evaluate, print and write."""
    from .protocols.qrels import evaluate_qrels

    _bootstrap_options(args)
    check_search_flags(args, corpus=True)
    if args.run is not None and Path(args.run).is_dir():
        raise InputError(f"--run {args.run} is a folder; name a file inside it.")
    _check_output(args.run, (Path(args.run or "").suffix.lower(),), "--run")
    _check_output(args.json, (".json",), "--json")
    _check_output(args.per_query, (".csv",), "--per-query")
    _check_output(args.report, (".html",), "--report")
    _check_report_options(args)
    _check_depth(args)
    if args.report and args.gallery_metric:  # before the work, not after it
        _check_judged_gallery_metric(args.metrics, args.gallery_metric)
    rows = _read_row_files(args)
    _check_paths(args, [args.run, args.json, args.per_query, args.report])
    inputs = _retrieval_inputs(args)
    _check_row_counts(args, rows, len(inputs["queries"]), len(inputs["corpus"]))
    with search_arguments(args) as search:
        res = evaluate_qrels(
            inputs["queries"],
            inputs["corpus"],
            inputs["qrels"],
            query_ids=inputs["queries_ids"],
            doc_ids=inputs["corpus_ids"],
            metrics=args.metrics,
            distance=args.distance,
            ties=args.ties,
            relevance_level=args.relevance_level,
            gain=args.gain,
            missing=args.missing,
            ignore_identical_ids=args.ignore_identical_ids,
            run_depth=args.depth,
            ci=args.ci,
            n_boot=args.n_boot,
            seed=args.seed,
            progress=False if args.quiet else None,
            **search,
        )
    res.provenance.update(_provenance(args))
    _say(
        f"{args.queries}: {res.n_evaluated} queries evaluated, {res.n_skipped} without "
        f"judgments skipped, {res.n_missing} missing counted as 0; "
        f"{res.settings['n_reference']} documents, distance={args.distance}, ties={args.ties}"
    )
    _say(res.table())
    if args.json:
        res.to_json(args.json)
    if args.per_query:
        write_text(args.per_query, _qrels_per_query(res))
    if args.run:
        res.write_run(args.run, depth=args.depth)
        _say(f"wrote {args.run}")
    if args.report:
        _write_qrels_report(args, res, rows)
        _say(f"wrote {args.report}")
    return 0


def _write_qrels_report(args: argparse.Namespace, res: Any, rows: dict[str, list[str]]) -> None:
    """``retrieve --report``: texts and images one per query row / corpus row."""
    options = _report_options(args, rows)
    with _warnings_shown():
        res.to_html(args.report, title=f"embedeval report: {Path(args.queries).name}", **options)


def _qrels_per_query(res: Any) -> str:
    """CSV: one row per query id (skipped ones empty), one column per metric."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    names = list(res.per_query)
    w.writerow(["query_id", *names])
    for i, qid in enumerate(res.query_labels.tolist()):
        vals = [res.per_query[n][i] for n in names]
        w.writerow([qid, *("" if math.isnan(v) else repr(float(v)) for v in vals)])
    return buf.getvalue()


def cmd_figures(args: argparse.Namespace) -> int:
    """``embedeval figures``: :func:`embedeval.report.figures.generate_figures` into ``--out``."""
    from .report.figures import generate_figures

    _check_output(args.out, None, "--out")
    for path in generate_figures(args.out):
        _say(str(path))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """``embedeval demo``: the digits demo, its report written to ``--out``."""
    from .report.demo import run_demo

    _check_output(args.out, None, "--out")
    run_demo(args.out, progress=False if args.quiet else None)
    return 0


COMMANDS = {
    "evaluate": cmd_evaluate,
    "retrieve": cmd_retrieve,
    "compare": cmd_compare,
    "figures": cmd_figures,
    "demo": cmd_demo,
}


def _is_file_name(entry: str, command: str) -> bool:
    """Whether a ``--metrics`` entry is an input file that the greedy option swallowed.

    ``evaluate`` / ``compare`` metric names never hold a dot or a slash; ``retrieve``'s do
    (trec_eval's ``P.10``, ``ndcg_cut.10``), so there only a path separator or an embedding
    file's suffix marks a file.
    """
    from .io import EMBEDDING_SUFFIXES

    if "/" in entry or os.sep in entry:
        return True
    if command == "retrieve":
        return Path(entry).suffix.lower() in EMBEDDING_SUFFIXES
    return "." in entry


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    args = parser.parse_args(argv)
    # "--metrics a b FILE" gives FILE to --metrics (nargs="+" is greedy): hand the trailing
    # entries that are file names back to the command's positional argument.
    metrics = list(getattr(args, "metrics", None) or [])
    moved: list[str] = []
    while metrics and _is_file_name(metrics[-1], args.command):
        moved.insert(0, metrics.pop())
    if moved:
        args.metrics = metrics or None
        if not metrics:
            parser.error("--metrics needs at least one metric name before the file names")
    if args.command in ("evaluate", "retrieve"):
        field = "file" if args.command == "evaluate" else "queries"
        files = moved + ([getattr(args, field)] if getattr(args, field) else [])
        if len(files) != 1:
            sub = "no embedding file given" if not files else f"one file expected: {files}"
            parser.error(f"{args.command}: {sub}")
        setattr(args, field, files[0])
    elif args.command == "compare":
        args.files = moved + list(args.files or [])
        if not args.files:
            parser.error("compare: no embedding files given")
    return args


def _show_warning(message: Any, category: Any, *_: Any, **__: Any) -> None:
    # A warning on the command line is one clean line, not Python's "file:line: Category".
    print(f"embedeval: warning: {_one_line(message)}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 2 bad input)."""
    parser = build_parser()
    try:
        args = _parse(parser, argv)
    except KeyboardInterrupt:
        return _interrupted()
    args.argv = list(sys.argv[1:] if argv is None else argv)
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        return _run(args)


def _say(text: str) -> None:
    """Print a line of the report; a reader that left (``| head -1``) does not stop the run.

    The outputs asked for (``--json``, ``--markdown``, plots) are written after the table, so
    a closed stdout must not end the run before them: the rest of the text goes to devnull.
    """
    try:
        print(text, flush=True)
    except BrokenPipeError:
        _stdout_to_devnull()


def _stdout_to_devnull() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _run(args: argparse.Namespace) -> int:
    try:
        status = COMMANDS[args.command](args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below
        return status
    except BrokenPipeError:
        # "embedeval ... | head -1": the reader left; that is not an error. Point stdout at
        # devnull so the interpreter's final flush does not complain either.
        _stdout_to_devnull()
        return 0
    except (EmbedevalError, FileFormatError) as exc:
        print(f"embedeval: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        print(
            f"embedeval: error: {where}{exc.strerror or exc}; check the path, its permissions "
            "and the free disk space.",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        return _interrupted()


def _interrupted() -> int:
    # 130 = 128 + SIGINT, the shell convention for Ctrl-C; atomic writes mean nothing is half.
    print(
        "embedeval: interrupted (Ctrl-C); files already written are complete, the unfinished "
        "one was not written.",
        file=sys.stderr,
    )
    return 130


def _one_line(exc: BaseException) -> str:
    return _flag_words(" ".join(str(exc).split()))


#: The library's spellings of the search options that are flags here (``index='IVF,Flat'``),
#: as the flags (``--index IVF,Flat``): a message from deep in a run names what was typed.
_KEYWORD_FLAGS = re.compile(r"\b(index|device|backend|precision)=(?:'([^']*)'|\"([^\"]*)\")")


def _flag_words(message: str) -> str:
    """``message`` with the search options' keyword spellings written as their flags.

    >>> print(_flag_words("device='cuda', but PyTorch sees no CUDA GPU. Use device='cpu'."))
    --device cuda, but PyTorch sees no CUDA GPU. Use --device cpu.
    """
    return _KEYWORD_FLAGS.sub(lambda m: f"--{m[1]} {m[2] if m[2] is not None else m[3]}", message)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
