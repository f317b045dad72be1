"""``embedeval demo``: a real embedding evaluation with nothing to download.

scikit-learn's handwritten digits (1,797 images of 8x8 pixels, 10 classes) are split in half,
stratified; the evaluation half is embedded three ways — raw pixels (64 dims), PCA to 8 dims (a
lossy compression) and a learned linear metric, NeighborhoodComponentsAnalysis to 16 dims, both
fitted on the training half — and each is evaluated leave-one-out with 95% bootstrap intervals
and paired tests against raw pixels.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

METRICS = ["precision_at_1", "r_precision", "map_at_r", "map", "mrr", "recall_at_10"]


def embed_digits(seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The three embeddings of the evaluation half, and its labels."""
    from sklearn.datasets import load_digits
    from sklearn.decomposition import PCA
    from sklearn.model_selection import train_test_split
    from sklearn.neighbors import NeighborhoodComponentsAnalysis

    x, y = load_digits(return_X_y=True)
    x_train, x_eval, y_train, y_eval = train_test_split(
        x, y, test_size=0.5, stratify=y, random_state=seed
    )
    pca = PCA(n_components=8, random_state=seed).fit(x_train)
    nca = NeighborhoodComponentsAnalysis(n_components=16, max_iter=300, random_state=seed)
    nca.fit(x_train, y_train)
    return {
        "raw_pixels": x_eval.astype(np.float32),
        "pca8": pca.transform(x_eval).astype(np.float32),
        "nca16": nca.transform(x_eval).astype(np.float32),
    }, y_eval


def summarize(rows: list[dict[str, Any]], baseline: str, metrics: tuple[str, ...]) -> list[str]:
    """One plain sentence per (checkpoint, metric): the paired difference to ``baseline`` and
    whether its 95% interval excludes zero.

    Examples
    --------
    >>> summarize([{"checkpoint": "nca", "metric": "map_at_r", "diff": 0.02,
    ...             "diff_ci_low": 0.01, "diff_ci_high": 0.03}], "raw", ("map_at_r",))
    ['nca vs raw, map_at_r: +0.0200 [+0.0100, +0.0300] -> better (the interval excludes 0)']
    """
    out = []
    for r in rows:
        if r["checkpoint"] == baseline or r["metric"] not in metrics:
            continue
        low, high = r["diff_ci_low"], r["diff_ci_high"]
        verdict = (
            "better (the interval excludes 0)"
            if low > 0
            else "worse (the interval excludes 0)"
            if high < 0
            else "no clear difference (the interval contains 0)"
        )
        out.append(
            f"{r['checkpoint']} vs {baseline}, {r['metric']}: {r['diff']:+.4f} "
            f"[{low:+.4f}, {high:+.4f}] -> {verdict}"
        )
    return out


def run_demo(
    out_dir: str | os.PathLike = "embedeval-demo",
    *,
    seed: int = 0,
    progress: bool | None = None,
    stream: Any = None,
) -> dict[str, Any]:
    """Run the demo, print the comparison and write ``report.html`` (NCA-16's page with its
    failure gallery), ``comparison.html``, ``report.json``, ``report.md`` and figures.

    Parameters
    ----------
    out_dir : str or path-like
        Report folder (created if missing); every file is written atomically.
    seed : int
        Seed of the split, the fitted embeddings and every bootstrap.
    progress : bool or None
        Progress bar of each evaluation (None: only on a terminal).
    stream : file-like or None
        Where the text goes (default: standard output).

    Returns
    -------
    dict
        The report also written to ``report.json``.
    """
    from ..evaluation.compare import compare
    from ..utils.files import write_text

    stream = sys.stdout if stream is None else stream
    out = Path(out_dir)
    print(
        "embedeval demo: scikit-learn digits, evaluation half (899 images, 10 classes),\n"
        "embedded as raw pixels, PCA-8 and NCA-16 (a learned linear metric)\n",
        file=stream,
    )
    embeddings, labels = embed_digits(seed)
    results = _evaluate_all(embeddings, labels, seed, progress)
    cmp = compare(results, baseline="raw_pixels", n_boot=1000, seed=seed)
    print(repr(cmp), file=stream)
    findings = summarize(cmp.to_dict()["rows"], "raw_pixels", ("precision_at_1", "map_at_r"))
    print(
        "\nWhat it shows (paired difference to raw pixels, 95% bootstrap interval):",
        file=stream,
    )
    for line in findings:
        print(f"  {line}", file=stream)
    figures = _demo_figures(cmp, results, embeddings, labels, seed)
    report = {
        "dataset": "sklearn.datasets.load_digits, stratified 50% evaluation split",
        "comparison": cmp.to_dict(),
        "results": {name: res.to_dict() for name, res in results.items()},
        "figures": sorted(figures),
        "findings": findings,
    }
    write_text(out / "report.json", json.dumps(report, indent=2, allow_nan=False))
    write_text(out / "report.md", _markdown(cmp, findings, sorted(figures)))
    _save_figures(figures, out)
    # The learned metric's page, its failure gallery showing the digits themselves.
    pixels = 255 - embeddings["raw_pixels"].reshape(-1, 8, 8) * 15
    results["nca16"].to_html(
        out / "report.html",
        query=embeddings["nca16"],
        images=pixels.astype(np.uint8),
        gallery=12,
        gallery_k=6,
        thumbnail=40,
        title="embedeval demo: digits embedded by NCA-16",
    )
    cmp.to_html(out / "comparison.html", title="embedeval demo: three embeddings of the digits")
    print(
        f"\nreport written to {out.resolve()}/ (report.html, comparison.html, report.json, "
        f"report.md, {len(figures)} figures)",
        file=stream,
    )
    return report


def _evaluate_all(
    embeddings: dict[str, np.ndarray], labels: np.ndarray, seed: int, progress: bool | None
) -> dict[str, Any]:
    from ..evaluation.evaluate import evaluate

    return {
        name: evaluate(
            x, labels, metrics=METRICS, ci=0.95, n_boot=1000, seed=seed, progress=progress
        )
        for name, x in embeddings.items()
    }


def _demo_figures(
    cmp: Any,
    results: dict[str, Any],
    embeddings: dict[str, np.ndarray],
    labels: np.ndarray,
    seed: int,
) -> dict[str, Any]:
    """The report's figures by file name: the comparison, NCA-16's classes, two histograms."""
    from .. import plots
    from . import datasets

    figures = {
        "comparison.png": cmp.plot(metrics=["precision_at_1", "map_at_r", "map"]),
        "per_class_nca16.png": plots.plot_per_class(
            list(results["nca16"].per_class["map_at_r"]),
            list(results["nca16"].per_class["map_at_r"].values()),
            metric="MAP@R (NCA-16)",
        ),
    }
    for name in ("raw_pixels", "nca16"):
        pos, neg = datasets.positive_negative_distances(
            embeddings[name], labels, max_pairs=20_000, seed=seed
        )
        figures[f"distances_{name}.png"] = plots.plot_distance_histograms(
            pos, neg, unit=f"Euclidean distance ({name})"
        )
    return figures


def _save_figures(figures: dict[str, Any], out: Path) -> None:
    from .. import plots

    for name, fig in figures.items():
        plots.save_figure(fig, out / name)


def _markdown(cmp: Any, findings: list[str], figure_names: list[str]) -> str:
    """``report.md``: the comparison table, the findings and the figures."""
    md = [
        "# embedeval demo report",
        "",
        "scikit-learn digits, evaluation half, leave-one-out; "
        "95% bootstrap CIs; paired bootstrap p-values against raw pixels.",
        "",
        cmp.to_markdown(),
        "",
        "## What it shows",
        "",
        "Paired differences to raw pixels on the same queries, with 95% bootstrap intervals; "
        "an interval that excludes 0 is a difference this evaluation set can resolve. P@1 only "
        "asks for one same-class nearest neighbour; MAP@R asks for *all* of them first, so it "
        "also sees how well each class is clustered:",
        "",
        *(f"* {line}" for line in findings),
        "",
    ]
    md += [f"![{name}]({name})" for name in figure_names]
    return "\n".join(md) + "\n"
