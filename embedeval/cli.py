"""The ``embedeval`` command line (also ``python -m embedeval``).

Every error is one line on stderr (``embedeval: error: ...``) naming the file or argument and the
fix, with exit status 2; outputs are written atomically, so a failed run never leaves a half
file nor clobbers an existing one.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__
from ._errors import EmbedevalError, FileFormatError, InputError
from ._files import write_text

EPILOG_EVALUATE = """examples:
  embedeval evaluate ckpt_epoch10.npz
  embedeval evaluate q.npy --labels ql.npy --reference g.npy --reference-labels gl.npy \\
      --metrics map_at_r precision_at_1 --distance cosine --json out.json --per-class classes.csv
  embedeval evaluate ckpt.npz --ci 0.95 --metrics map_at_r mrr recall_at_5 --average macro
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
"""


class _Parser(argparse.ArgumentParser):
    """argparse with the package's error format: one line on stderr, exit status 2."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        hint = f"see '{self.prog} --help'"
        self.exit(2, f"embedeval: error: {_one_line(message)}; {hint}.\n")


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
    return k


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer; got {value!r}")
    return n


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


def _add_evaluation_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("evaluation")
    g.add_argument("--labels", metavar="FILE", help="labels file (.npy/.npz/.txt) for a .npy input")
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
    g.add_argument(
        "--metrics",
        nargs="+",
        metavar="NAME",
        help="precision_at_1 r_precision map_at_r map mrr recall_at_K precision_at_K "
        "nmi ami (default: P@1, R-Prec, MAP@R, R@10; R@k when --k caps the ranking below 10)",
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
    g.add_argument(
        "--ci",
        type=_level,
        default=None,
        metavar="LEVEL",
        help="bootstrap confidence intervals at this level, e.g. 0.95 (queries resampled for "
        "micro, classes for macro)",
    )
    g.add_argument(
        "--n-boot",
        type=_positive_int,
        default=1000,
        metavar="N",
        help="bootstrap resamples (default: 1000)",
    )
    g.add_argument(
        "--seed", type=int, default=0, help="seed of the bootstrap resampling (default: 0)"
    )
    g.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        metavar="N",
        help="worker threads of the exact search (default: every usable core, at most 8); "
        "the numbers do not depend on it",
    )
    g.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar (it is only shown when stderr is a terminal)",
    )


def build_parser() -> argparse.ArgumentParser:
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

    p = sub.add_parser(
        "evaluate",
        help="evaluate one embedding file",
        epilog=EPILOG_EVALUATE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", help="embeddings: .npy, .npz, .safetensors or .parquet")
    _add_evaluation_options(p)
    o = p.add_argument_group("outputs")
    o.add_argument("--json", metavar="OUT", help="write the full result as JSON")
    o.add_argument("--per-class", metavar="OUT", help="per-class table (.csv or .md)")
    o.add_argument("--per-query", metavar="OUT", help="per-query values (.csv)")

    p = sub.add_parser(
        "compare",
        help="compare checkpoints on the same queries",
        epilog=EPILOG_COMPARE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("files", nargs="+", help="one embedding file per checkpoint")
    _add_evaluation_options(p)
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

    p = sub.add_parser(
        "figures",
        help="regenerate every committed figure",
        description="Write the figures of the README (SPEC section 7) as PNGs, from fixed "
        "seeds: the same command gives the same pixels.",
    )
    p.add_argument("--out", default="figures", help="output folder (default: figures/)")

    p = sub.add_parser(
        "demo",
        help="evaluate scikit-learn's digits embedded three ways",
        description="Embed scikit-learn's handwritten digits as raw pixels, PCA-8 and NCA-16 (a "
        "learned linear metric), evaluate each leave-one-out with 95% bootstrap intervals, "
        "print the comparison and write report.json, report.md and figures to --out. Nothing "
        "is downloaded.",
    )
    p.add_argument(
        "--out", default="embedeval-demo", help="report folder (default: embedeval-demo/)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def _loaded(flag: str, path: str, n: int, of: str, what: str) -> np.ndarray:
    # Checked here, not only in evaluate(), so the message names the flag and the file.
    from .io import load_array

    arr = load_array(path, what=what)
    if len(arr) != n:
        raise InputError(
            f"{flag} {path} has {len(arr)} values but {of} has {n} rows; "
            "pass one value per embedding row, in the same order."
        )
    return arr


def _evaluate_file(args: argparse.Namespace, path: str, *, with_ci: bool = True) -> Any:
    from .evaluate import evaluate
    from .io import load_embeddings

    data = load_embeddings(path)
    n = data.embeddings.shape[0]
    labels = data.labels
    if args.labels:
        labels = _loaded("--labels", args.labels, n, path, "labels")
    if labels is None:
        raise InputError(f"{path} has no labels; pass --labels FILE or store 'labels' in an .npz.")
    kwargs: dict[str, Any] = {}
    if args.ref_includes_query and not args.reference:
        raise InputError(
            "--ref-includes-query needs --reference: without a gallery the run is already "
            "leave-one-out over the queries (each query's own row excluded). Drop "
            "--ref-includes-query, or pass the gallery whose first rows are the queries."
        )
    if args.reference:
        ref = load_embeddings(args.reference)
        n_ref = ref.embeddings.shape[0]
        if ref.embeddings.shape[1] != data.embeddings.shape[1]:
            raise InputError(
                f"{path} has dimension {data.embeddings.shape[1]} but --reference "
                f"{args.reference} has {ref.embeddings.shape[1]}; both must come from the same "
                "model."
            )
        ref_labels = (
            _loaded("--reference-labels", args.reference_labels, n_ref, args.reference, "labels")
            if args.reference_labels
            else ref.labels
        )
        if ref_labels is None:
            raise InputError(f"{args.reference} has no labels; pass --reference-labels FILE.")
        kwargs.update(
            reference=ref.embeddings,
            reference_labels=ref_labels,
            ref_includes_query=args.ref_includes_query,
        )
        ref_groups = (
            _loaded("--reference-groups", args.reference_groups, n_ref, args.reference, "groups")
            if args.reference_groups
            else ref.groups
        )
        if ref_groups is not None:
            kwargs["reference_groups"] = ref_groups
    elif args.reference_labels or args.reference_groups:
        raise InputError(
            "--reference-labels and --reference-groups need --reference FILE (without it the "
            "evaluation is leave-one-out over the queries)."
        )
    groups = _loaded("--groups", args.groups, n, path, "groups") if args.groups else data.groups
    if groups is not None:
        kwargs["query_groups"] = groups
    confidences, lower = None, args.lower_is_confident
    if args.confidences:
        confidences = _loaded("--confidences", args.confidences, n, path, "confidences")
    elif data.confidences is not None:
        confidences = data.confidences
    elif data.sigmas is not None:
        confidences, lower = data.sigmas, True
    return evaluate(
        data.embeddings,
        labels,
        metrics=args.metrics,
        k=args.k,
        distance=args.distance,
        average=args.average,
        confidences=confidences,
        higher_is_confident=not lower,
        ci=args.ci if with_ci else None,
        n_boot=args.n_boot,
        seed=args.seed,
        progress=False if args.quiet else None,
        n_threads=args.threads,
        **kwargs,
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
    counts = {}
    for lab in res.query_labels.tolist():
        counts[lab] = counts.get(lab, 0) + 1
    rows = [
        [str(lab), str(counts.get(lab, 0))]
        + [f"{res.per_class[m].get(lab, math.nan):.6f}" for m in metrics]
        for lab in labels
    ]
    head = ["label", "n_queries", *metrics]
    if suffix == ".md":
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(head)
    w.writerows(rows)
    return buf.getvalue()


def _per_query_table(res: Any) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    metrics = list(res.per_query)
    w.writerow(["query", "label", *metrics])
    for i, lab in enumerate(res.query_labels.tolist()):
        w.writerow(
            [
                i,
                lab,
                *(
                    ("" if np.isnan(res.per_query[m][i]) else f"{res.per_query[m][i]:.6f}")
                    for m in metrics
                ),
            ]
        )
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


def cmd_evaluate(args: argparse.Namespace) -> int:
    _check_output(args.per_class, (".csv", ".md"), "--per-class")
    _check_output(args.per_query, (".csv",), "--per-query")
    _check_output(args.json, (".json",), "--json")
    res = _evaluate_file(args, args.file)
    print(f"{args.file}: {_summary(res)}")
    print(res.table())
    if args.json:
        res.to_json(args.json)
    if args.per_class:
        write_text(args.per_class, _per_class_table(res, Path(args.per_class).suffix.lower()))
    if args.per_query:
        write_text(args.per_query, _per_query_table(res))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from .compare import compare

    _check_output(args.json, (".json",), "--json")
    _check_output(args.markdown, (".md",), "--markdown")
    _check_output(args.plot, (".png", ".svg", ".pdf"), "--plot")
    show = not args.quiet and sys.stderr.isatty()
    names = [Path(f).stem for f in args.files]
    if len(set(names)) != len(names):
        names = [str(Path(f)) for f in args.files]
    if len(set(names)) != len(names):  # the same file twice: keep both rows apart
        names = [f"{n} #{i + 1}" for i, n in enumerate(names)]
    if args.baseline is not None and args.baseline not in names:
        raise InputError(
            f"--baseline {args.baseline!r} is not one of the checkpoints "
            f"({', '.join(names)}); pass one of those names (file stems)."
        )
    results = {}
    for name, f in zip(names, args.files, strict=True):
        if show:
            print(f"evaluating {f} ...", file=sys.stderr)
        # compare() draws its own (paired) resamples; a per-file bootstrap would be wasted work
        results[name] = _evaluate_file(args, f, with_ci=False)
    cmp = compare(
        results,
        baseline=args.baseline if args.baseline is not None else 0,
        ci=args.ci or 0.95,
        n_boot=args.n_boot,
        seed=args.seed,
        test=args.test,
    )
    print(repr(cmp))
    if args.json:
        cmp.to_json(args.json)
    if args.markdown:
        write_text(args.markdown, cmp.to_markdown())
    if args.plot:
        from .plots import save_figure

        save_figure(cmp.plot(), args.plot)
    return 0


def cmd_figures(args: argparse.Namespace) -> int:
    from ._figures import generate_figures

    _check_output(args.out, None, "--out")
    for path in generate_figures(args.out):
        print(path)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo

    _check_output(args.out, None, "--out")
    run_demo(args.out, progress=False if args.quiet else None)
    return 0


COMMANDS = {
    "evaluate": cmd_evaluate,
    "compare": cmd_compare,
    "figures": cmd_figures,
    "demo": cmd_demo,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 2 bad input)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        return _interrupted()
    try:
        return COMMANDS[args.command](args)
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
    return " ".join(str(exc).split())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
