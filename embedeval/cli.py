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

EPILOG_COMPARE = """examples:
  embedeval compare runs/epoch_*.npz --ci 0.95 --plot curve.png
  embedeval compare a.npz b.npz --baseline b --test permutation --markdown table.md
"""


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
        "nmi ami (default: P@1, R-Prec, MAP@R, R@1, R@10)",
    )
    g.add_argument(
        "--k", default=None, help="depth cap: an integer or max_bin_count (default: exact)"
    )
    g.add_argument(
        "--distance", default="euclidean", choices=("euclidean", "cosine", "inner_product")
    )
    g.add_argument("--average", default="micro", choices=("micro", "macro"))
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
        type=float,
        default=None,
        metavar="LEVEL",
        help="bootstrap confidence intervals, e.g. 0.95",
    )
    g.add_argument("--n-boot", type=int, default=1000)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--quiet", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="embedeval",
        description="Evaluate metric-learning embeddings: exact kNN retrieval metrics (P@1, "
        "R-Precision, MAP@R, MAP, MRR, Recall@k, NMI/AMI), confidence metrics, figures and "
        "checkpoint comparison with confidence intervals.",
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
    p.add_argument("--test", default="bootstrap", choices=("bootstrap", "permutation"))
    p.add_argument("--plot", metavar="OUT", help="metric-vs-checkpoint figure (.png/.svg/.pdf)")
    p.add_argument("--json", metavar="OUT")
    p.add_argument("--markdown", metavar="OUT")

    p = sub.add_parser("figures", help="regenerate every committed figure")
    p.add_argument("--out", default="figures", help="output folder (default: figures/)")

    p = sub.add_parser("demo", help="evaluate scikit-learn's digits embedded three ways")
    p.add_argument("--out", default="embedeval-demo", help="report folder")
    p.add_argument("--quiet", action="store_true")
    return parser


def _parse_k(value: str | None) -> int | str | None:
    if value is None or value == "max_bin_count":
        return value
    try:
        return int(value)
    except ValueError:
        raise InputError(f"--k must be an integer or max_bin_count; got {value!r}.") from None


def _evaluate_file(args: argparse.Namespace, path: str) -> Any:
    from .evaluate import evaluate
    from .io import load_array, load_embeddings

    data = load_embeddings(path)
    labels = data.labels
    if args.labels:
        labels = load_array(args.labels, what="labels")
    if labels is None:
        raise InputError(f"{path} has no labels; pass --labels FILE or store 'labels' in an .npz.")
    if len(labels) != data.embeddings.shape[0]:
        raise InputError(
            f"--labels has {len(labels)} labels but {path} has "
            f"{data.embeddings.shape[0]} rows; pass one label per embedding row."
        )
    kwargs: dict[str, Any] = {}
    if args.ref_includes_query and not args.reference:
        raise InputError(
            "--ref-includes-query needs --reference: without a gallery the run is already "
            "leave-one-out over the queries (each query's own row excluded). Drop "
            "--ref-includes-query, or pass the gallery whose first rows are the queries."
        )
    if args.reference:
        ref = load_embeddings(args.reference)
        ref_labels = load_array(args.reference_labels) if args.reference_labels else ref.labels
        if ref_labels is None:
            raise InputError(f"{args.reference} has no labels; pass --reference-labels FILE.")
        if ref.embeddings.shape[1] != data.embeddings.shape[1]:
            raise InputError(
                f"{path} has dimension {data.embeddings.shape[1]} but {args.reference} has "
                f"{ref.embeddings.shape[1]}; both must come from the same model."
            )
        kwargs.update(
            reference=ref.embeddings,
            reference_labels=ref_labels,
            ref_includes_query=args.ref_includes_query,
        )
        ref_groups = (
            load_array(args.reference_groups, what="groups")
            if args.reference_groups
            else ref.groups
        )
        if ref_groups is not None:
            kwargs["reference_groups"] = ref_groups
    groups = load_array(args.groups, what="groups") if args.groups else data.groups
    if groups is not None:
        kwargs["query_groups"] = groups
    confidences, lower = None, args.lower_is_confident
    if args.confidences:
        confidences = load_array(args.confidences, what="confidences")
    elif data.confidences is not None:
        confidences = data.confidences
    elif data.sigmas is not None:
        confidences, lower = data.sigmas, True
    return evaluate(
        data.embeddings,
        labels,
        metrics=args.metrics,
        k=_parse_k(args.k),
        distance=args.distance,
        average=args.average,
        confidences=confidences,
        higher_is_confident=not lower,
        ci=args.ci,
        n_boot=args.n_boot,
        seed=args.seed,
        progress=False if args.quiet else None,
        **kwargs,
    )


def _summary(res: Any) -> str:
    return (
        f"{res.n_queries} queries ({res.n_lone} lone, left out), "
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


def _check_output(path: str | None, suffixes: tuple[str, ...], flag: str) -> None:
    if path is None:
        return
    if Path(path).suffix.lower() not in suffixes:
        raise InputError(f"{flag} {path}: use a file ending in {' or '.join(suffixes)}.")


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
    names = [Path(f).stem for f in args.files]
    if len(set(names)) != len(names):
        names = [str(Path(f)) for f in args.files]
    results = {}
    for name, f in zip(names, args.files, strict=True):
        if not args.quiet:
            print(f"evaluating {f} ...", file=sys.stderr)
        results[name] = _evaluate_file(args, f)
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

    for path in generate_figures(args.out):
        print(path)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo

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
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (EmbedevalError, FileFormatError) as exc:
        print(f"embedeval: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        print(f"embedeval: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "embedeval: interrupted; no output was written for the unfinished step.",
            file=sys.stderr,
        )
        return 130


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
