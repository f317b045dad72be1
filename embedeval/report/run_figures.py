"""What ``embedeval evaluate`` writes besides the table: input hashes, each query's nearest
counted reference, and the figures of one run (``--plots DIR``)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..evaluation.figures import pair_distances as _pair_distances  # noqa: F401
from ..utils.validation import factorize

#: The figures ``--plots`` writes; the confidence ones only when confidences are given.
PLOT_NAMES = (
    "per_class",
    "distance_histograms",
    "k_sweep",
    "error_reject_curve",
    "confidence_recall",
)


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def top1(inputs: dict[str, Any], res: Any, n_threads: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Index and distance of each query's nearest *counted* reference (its own row and its
    group excluded, as in the evaluation); -1 and NaN when it can see none.

    Searched in query blocks at a depth that outlasts the largest excluded set, so memory is
    bounded by the block, never by n_query x n_reference.
    """
    from ..search.neighbors import neighbors

    xq = np.asarray(inputs["query"])
    xb = inputs.get("reference")
    self_index = xb is None or bool(inputs.get("ref_includes_query"))
    xb = xq if xb is None else np.asarray(xb)
    gq, gb = inputs.get("query_groups"), inputs.get("reference_groups")
    if gq is not None and gb is None:
        gb = gq
    n_q, n_b = xq.shape[0], xb.shape[0]
    if gq is not None:
        (cq, cb), _ = factorize(np.asarray(gq), np.asarray(gb))
        excluded = np.bincount(cb, minlength=int(max(cq.max(), cb.max())) + 1)[cq]
    else:
        cq = cb = None
        excluded = np.zeros(n_q, dtype=np.int64)
    depth = int(min(n_b, int(excluded.max(initial=0)) + int(self_index) + 1))
    idx = np.full(n_q, -1, dtype=np.int64)
    dist = np.full(n_q, np.nan)
    step = max(1, 4_000_000 // max(depth, 1))
    for s in range(0, n_q, step):
        e = min(s + step, n_q)
        d, i = neighbors(xq[s:e], depth, xb, distance=res.settings["distance"], n_threads=n_threads)
        ok = np.ones(i.shape, dtype=bool)
        if self_index:
            ok &= i != np.arange(s, e)[:, None]
        if cq is not None:
            ok &= cb[i] != cq[s:e, None]
        first = ok.argmax(axis=1)
        has = ok[np.arange(e - s), first]
        rows = np.flatnonzero(has)
        idx[s + rows] = i[rows, first[rows]]
        dist[s + rows] = d[rows, first[rows]]
    return idx, dist


def write_plots(res: Any, inputs: dict[str, Any], folder: str, fmt: str = "png") -> list[Path]:
    """Write the figures of one evaluation to ``folder``; returns the paths written."""
    from .. import plots
    from ..evaluation.figures import run_figures

    out = Path(folder)
    written = []
    for name, fig in run_figures(res, inputs).items():
        if name not in PLOT_NAMES:
            _close(fig)
            continue
        written.append(plots.save_figure(fig, out / f"{name}.{fmt}", dpi=200))
        _close(fig)
    return written


def _close(fig: Any) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)
