"""One self-contained HTML page per evaluation or comparison (``to_html``, ``--report``).

The page holds everything inline — CSS, the figures as PNG data URIs, the gallery thumbnails —
and references no network address, so it can be mailed or archived and still opens the same.
A few lines of inline JavaScript make the tables sortable; without JavaScript the page reads
the same, each table already in its most useful order (the per-class table worst first).

The builder lives in the evaluation layer, beside :class:`EvaluationResult` and
:class:`Comparison`, because their ``to_html`` methods call it and a folder never imports from a
folder above it; everything it draws comes from the layers below (figures, the exact search).
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..utils.errors import EmbedevalWarning, InputError
from ..utils.files import atomic_path
from ..utils.validation import (
    as_any_labels,
    check_int,
    label_sizes,
    label_text,
    refuse_object_array,
)
from .figures import FIGURE_TITLES, higher_is_better, main_metric, run_figures
from .gallery import GalleryRow, confident_errors, gallery_rows, worst_queries

__all__ = ["comparison_html", "evaluation_html", "write_html"]

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1180px;
padding:0 1.2em 3em;color:#1b1b1b;background:#fff}
h1{font-size:1.6em;margin:.8em 0 .2em}h2{font-size:1.25em;margin:1.6em 0 .5em;
border-bottom:1px solid #ddd;padding-bottom:.2em}h3{font-size:1.05em}
.sub{color:#555;margin:0 0 1em}.warn{background:#fff4e0;border-left:4px solid #e08a00;
padding:.5em .8em}table{border-collapse:collapse;margin:.4em 0 1em}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
table.sortable th{cursor:pointer}dl.kv{display:grid;grid-template-columns:max-content auto;
gap:.15em 1em}dl.kv dt{font-weight:600}dl.kv dd{margin:0;word-break:break-all}
figure{display:inline-block;width:min(480px,100%);margin:.5em 1em 1em 0;vertical-align:top}
figure img{width:100%;border:1px solid #eee}figcaption{color:#444;font-size:.9em}
.gallery td{text-align:center;min-width:72px}.gallery td.q{background:#eef3fb}
.ok{background:#e3f4e3;border:2px solid #2a8a2a}.bad{background:#fbe5e5;border:2px solid #c03030}
.sym{font-weight:700;font-size:1.1em}.ok .sym{color:#1e6e1e}.bad .sym{color:#a01818}
.unj{background:#f3f3f3;border:2px dashed #999}.unj .sym{color:#555}
.ph{display:inline-block;background:#eee;color:#777;font-size:11px;line-height:1.2;
padding:.4em;border:1px dashed #aaa}.cap{display:block;max-width:160px;font-size:12px}
.meta{display:block;font-size:12px;color:#333}details{margin:.5em 0}
"""

_SORT_JS = """
document.querySelectorAll('table.sortable').forEach(function(t){
 t.querySelectorAll('th').forEach(function(th,col){th.title='click to sort';
  th.addEventListener('click',function(){var b=t.tBodies[0],rs=Array.from(b.rows);
   var up=th.dataset.dir!=='asc';th.dataset.dir=up?'asc':'desc';
   rs.sort(function(x,y){var a=x.cells[col].dataset.v,c=y.cells[col].dataset.v;
    var p=a!==undefined?parseFloat(a):NaN,q=c!==undefined?parseFloat(c):NaN,r;
    if(!isNaN(p)||!isNaN(q)){r=isNaN(p)?1:isNaN(q)?-1:p-q;}
    else{r=x.cells[col].textContent.localeCompare(y.cells[col].textContent);}
    return up?r:-r;});rs.forEach(function(r){b.appendChild(r);});});});});
"""


def write_html(path: str | os.PathLike, text: str) -> Path:
    """Write a page atomically, UTF-8 whatever the locale.

    A lone surrogate (how Python reads a file name that is not UTF-8, or a label holding one)
    has no UTF-8 form: it is written as its escape (``\\udce9``), so the page is still
    written and still valid UTF-8.
    """
    target = Path(path)
    if target.suffix.lower() not in (".html", ".htm"):
        raise InputError(f"path {str(path)!r}: an HTML report is written to a .html file.")
    with atomic_path(target) as tmp:
        tmp.write_bytes(text.encode("utf-8", errors="backslashreplace"))
    return target


def _page(title: str, body: list[str]) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>\n"
        + "\n".join(body)
        + f"\n<script>{_SORT_JS}</script>\n</body></html>\n"
    )


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{float(value):.{digits}f}"


def _cell(value: Any) -> str:
    """A numeric cell: a count as is, a value at 4 decimals; sorted on its full value
    (``data-v``)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return f'<td class="num" data-v="{int(value)}">{int(value)}</td>'
    v = float("nan") if value is None else float(value)
    key = "" if math.isnan(v) else f' data-v="{v!r}"'
    return f'<td class="num"{key}>{_num(v)}</td>'


def _table(head: Sequence[str], rows: list[str], *, cls: str = "", ident: str = "") -> str:
    attrs = (f' id="{ident}"' if ident else "") + (f' class="{cls}"' if cls else "")
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    return f"<table{attrs}><thead><tr>{th}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _kv(items: dict[str, Any]) -> str:
    cells = "".join(f"<dt>{_e(k)}</dt><dd>{_e(_show(v))}</dd>" for k, v in items.items())
    return f'<dl class="kv">{cells}</dl>'


def _show(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(_show(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={_show(v)}" for k, v in value.items())
    return str(value)


def _figure_uri(fig: Any, dpi: int = 80) -> str:
    """A matplotlib figure as a PNG data URI (closed afterwards)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    finally:
        plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


# ----------------------------------------------------------------------------- evaluation page
def evaluation_html(
    res: Any,
    inputs: dict[str, Any] | None = None,
    *,
    images: Sequence[Any] | None = None,
    reference_images: Sequence[Any] | None = None,
    texts: Sequence[Any] | None = None,
    reference_texts: Sequence[Any] | None = None,
    gallery: int = 20,
    gallery_metric: str | None = None,
    gallery_k: int = 5,
    thumbnail: int = 64,
    figures: bool = True,
    title: str | None = None,
) -> str:
    """The HTML page of one :class:`~embedeval.evaluation.result.EvaluationResult`.

    ``inputs`` are the keyword arguments the result was evaluated with (``query``,
    ``query_labels``, ``reference``, ``reference_labels``, ``ref_includes_query``, groups):
    with them the page adds the distance histograms, the k sweep and the failure gallery.  See
    :meth:`EvaluationResult.to_html` for the other options.

    Examples
    --------
    >>> import embedeval as ee
    >>> res = ee.evaluate([[0.0], [0.1], [1.0], [1.2]], [0, 0, 1, 1], progress=False)
    >>> page = evaluation_html(res, figures=False)
    >>> page.startswith("<!DOCTYPE html>"), 'data-metric="map_at_r"' in page
    (True, True)
    """
    gallery, gallery_k, thumbnail = _gallery_sizes(gallery, gallery_k, thumbnail)
    title = title or "embedeval report"
    body = [f"<h1>{_e(title)}</h1>", _subtitle(res), _NAV]
    if res.approximation:
        body.append(_approximation(res))
    body += [_what(res), _metrics(res)]
    conf = _confidence_tables(res)
    body += [conf] if conf else []
    body.append(_per_class(res))
    if figures:
        body.append(_figures(res, inputs))
    if gallery:
        media = _Media(images, reference_images, texts, reference_texts, thumbnail, inputs)
        body.append(_gallery(res, inputs, gallery, gallery_metric, gallery_k, media))
        media.warn()
    return _page(title, body)


def _gallery_sizes(gallery: int, gallery_k: int, thumbnail: int) -> tuple[int, int, int]:
    """Queries in the gallery, items per query and thumbnail pixels, checked."""
    return (
        check_int(gallery, "gallery", minimum=0),
        check_int(gallery_k, "gallery_k"),
        check_int(thumbnail, "thumbnail", minimum=8, maximum=512),
    )


def _nav(sections: dict[str, str]) -> str:
    """The line of links to a page's sections: what was evaluated, the metrics, ``sections``
    (``{anchor: title}``), the failure gallery."""
    every = {"s-what": "what was evaluated", "s-metrics": "metrics", **sections}
    every["s-gallery"] = "failure gallery"
    links = " · ".join(f'<a href="#{a}">{_e(t)}</a>' for a, t in every.items())
    return f'<p class="sub">Sections: {links}</p>'


_NAV = _nav({"s-classes": "per class", "s-figures": "figures"})


def _subtitle(res: Any) -> str:
    p, s = res.provenance, res.settings
    when = p.get("created", "?")
    return (
        f'<p class="sub">embedeval {_e(p.get("embedeval_version", "?"))} · {_e(when)} · '
        f"{res.n_queries} queries ({res.n_lone} lone) · {s.get('n_reference', '?')} references · "
        f"distance {_e(s.get('distance'))} · k {_e(s.get('k'))} · average {_e(s.get('average'))}"
        "</p>"
    )


def _approximation(res: Any) -> str:
    from .approximation import approximation_lines

    lines = approximation_lines(res.approximation)
    text = "<br>".join(_e(line) for line in lines)
    return f'<h2>Approximate search</h2><p class="warn" id="approximation">{text}</p>'


def _what(res: Any, sizes: dict[str, Any] | None = None) -> str:
    """The input files, the ``sizes`` (default: a labelled evaluation's) and every setting."""
    p = res.provenance
    rows = [
        f"<tr><td>{_e(i.get('role'))}</td><td>{_e(i.get('name', i.get('path')))}</td>"
        f"<td><code>{_e(i.get('sha256', ''))}</code></td></tr>"
        for i in p.get("inputs", [])
    ]
    files = _table(["role", "file", "SHA-256"], rows) if rows else "<p>Evaluated from Python.</p>"
    sizes = sizes or {
        "queries": res.n_queries,
        "lone queries (no relevant reference, left out)": res.n_lone,
        "references": res.settings.get("n_reference"),
        "dimension": res.settings.get("dim"),
        "classes": res.settings.get("n_classes"),
    }
    command = " ".join(p.get("command", [])) if p.get("command") else None
    extra = {"command": command} if command else {}
    return (
        '<h2 id="s-what">What was evaluated</h2>'
        + files
        + _kv({**sizes, **extra})
        + "<details><summary>Every setting</summary>"
        + _kv(res.settings)
        + (_kv(p["options"]) if isinstance(p.get("options"), dict) else "")
        + "</details>"
    )


_TIES_NOTE = (
    "ties: queries whose value could change under another order of equally distant references "
    "(equal distances are ranked by reference index)."
)


def _metrics(res: Any, note: str = _TIES_NOTE, tie_counts: bool = True) -> str:
    """The metric table (value, interval, and with ``tie_counts`` the tied queries), then
    ``note``."""
    level = res.settings.get("ci") or 0.95
    ci_head = f"{level * 100:g}% CI" if res.ci else "CI"
    rows = []
    for name, value in res.metrics.items():
        lo_hi = res.ci.get(name)
        ci = f"[{_num(lo_hi[0])}, {_num(lo_hi[1])}]" if lo_hi else ""
        ties = f"<td class='num'>{_e(res.n_ties.get(name, ''))}</td>" if tie_counts else ""
        rows.append(
            f'<tr data-metric="{_e(name)}" data-value="{float(value)!r}"><td>{_e(name)}</td>'
            f"{_cell(value)}<td>{ci}</td>{ties}</tr>"
        )
    head = ["metric", "value", ci_head, *(["ties"] if tie_counts else [])]
    return (
        "<h2 id='s-metrics'>Metrics</h2>"
        + _table(head, rows, ident="metrics")
        + f"<p class='sub'>{_e(note)}</p>"
    )


def _confidence_tables(res: Any) -> str:
    if not res.confidence:
        return ""
    rows = []
    for name, value in res.confidence.items():
        lo_hi = res.ci.get(name)
        ci = f"[{_num(lo_hi[0])}, {_num(lo_hi[1])}]" if lo_hi else ""
        rows.append(f"<tr><td>{_e(name)}</td>{_cell(value)}<td>{ci}</td></tr>")
    head = ["confidence metric", "value", "CI"]
    return "<h2>Confidence metrics</h2>" + _table(head, rows, cls="sortable", ident="confidence")


def _per_class(res: Any) -> str:
    if not res.per_class:
        return ""
    metrics = list(res.per_class)
    size = label_sizes(res.query_labels)
    main = main_metric(res) or metrics[0]
    table = res.per_class[main]
    sign = 1.0 if higher_is_better(res, main) else -1.0
    order = sorted(table, key=lambda lab: (math.isnan(table[lab]), sign * table[lab], str(lab)))
    rows = [
        f"<tr><td>{_e(lab)}</td>{_cell(size.get(lab, 0))}"
        + "".join(_cell(res.per_class[m].get(lab, float("nan"))) for m in metrics)
        + "</tr>"
        for lab in order
    ]
    return (
        "<h2 id='s-classes'>Per class</h2>"
        f"<p class='sub'>{len(order)} classes, worst {_e(main)} first; click a column to sort.</p>"
        + _table(["label", "queries", *metrics], rows, cls="sortable", ident="per-class")
    )


def _figures(res: Any, inputs: dict[str, Any] | None) -> str:
    figs = run_figures(res, inputs)
    parts = []
    for name, title in FIGURE_TITLES.items():
        if name in figs:
            uri = _figure_uri(figs[name])
            parts.append(
                f'<figure id="fig-{name}"><img src="{uri}" alt="{_e(title)}">'
                f"<figcaption>{_e(title)}</figcaption></figure>"
            )
    empty = "<p>No figure applies to this run.</p>"
    return '<h2 id="s-figures">Figures</h2>' + ("".join(parts) or empty)


# ----------------------------------------------------------------------------- failure gallery
_GALLERY_INPUTS = (
    "query",
    "query_labels",
    "reference",
    "reference_labels",
    "ref_includes_query",
    "query_groups",
    "reference_groups",
)


_MEDIA_OPTIONS = (
    *("images", "reference_images", "texts", "reference_texts"),
    *("thumbnail", "max_chars"),
)


class _Media:
    """What each query and reference row shows: a thumbnail, a caption, or nothing; images that
    cannot be read become placeholders, reported by one warning.

    Leave-one-out (no ``reference`` among ``inputs``, unless ``shared=False``) the query images
    and texts serve as the references' too; captions longer than ``max_chars`` are cut."""

    def __init__(
        self,
        images: Any,
        reference_images: Any,
        texts: Any,
        reference_texts: Any,
        size: int,
        inputs: dict[str, Any] | None,
        *,
        shared: bool = True,
        max_chars: int | None = None,
    ) -> None:
        loo = shared and (inputs is None or inputs.get("reference") is None)
        self.size = size
        self.max_chars = max_chars
        self.images = _listed(images, "images")
        self.texts = _listed(texts, "texts")
        self.ref_images = _listed(reference_images, "reference_images")
        self.ref_texts = _listed(reference_texts, "reference_texts")
        if loo:  # leave-one-out: the references are the queries
            self.ref_images = self.images if self.ref_images is None else self.ref_images
            self.ref_texts = self.texts if self.ref_texts is None else self.ref_texts
        self.cache: dict[str, str | None] = {}
        self.failed: list[str] = []

    @classmethod
    def from_options(cls, options: dict[str, Any], *, max_chars: int) -> _Media:
        """A page's media from its keyword options (``images``, ``reference_images``,
        ``texts``, ``reference_texts``, ``thumbnail``, ``max_chars``), queries and references
        apart; any other name is refused."""
        unknown = sorted(set(options) - set(_MEDIA_OPTIONS))
        if unknown:
            raise InputError(
                f"to_html() has no option {unknown[0]!r}; help(res.to_html) lists them (what "
                f"the gallery shows: {', '.join(_MEDIA_OPTIONS)})."
            )
        return cls(
            *(options.get(name) for name in _MEDIA_OPTIONS[:4]),
            check_int(options.get("thumbnail", 64), "thumbnail", minimum=8, maximum=512),
            None,
            shared=False,
            max_chars=check_int(options.get("max_chars", max_chars), "max_chars", minimum=8),
        )

    def check(self, n_query: int, n_reference: int) -> None:
        for name, seq, n in (
            ("images", self.images, n_query),
            ("texts", self.texts, n_query),
            ("reference_images", self.ref_images, n_reference),
            ("reference_texts", self.ref_texts, n_reference),
        ):
            if seq is not None and len(seq) != n:
                raise InputError(
                    f"{name} has {len(seq)} entries but there are {n} rows; pass one entry per "
                    "row, in the order of the embeddings."
                )

    def show(self, row: int, reference: bool) -> str:
        images = self.ref_images if reference else self.images
        texts = self.ref_texts if reference else self.texts
        out = ""
        if images is not None:
            item = images[row]
            shared = reference and images is self.images  # leave-one-out: the query images
            name = f"{'reference_images' if reference and not shared else 'images'}[{row}]"
            uri = self._thumbnail(item) if _is_path(item) else _array_uri(item, self.size, name)
            out += (
                f'<img src="{uri}" alt="row {row}">'
                if uri
                else f'<span class="ph" title="{_e(item)}">image<br>unavailable</span>'
            )
        if texts is not None:
            out += f'<span class="cap">{_e(_clip(texts[row], self.max_chars))}</span>'
        return out

    def _thumbnail(self, path: Any) -> str | None:
        key = str(path)
        if key not in self.cache:
            self.cache[key] = _thumbnail(key, self.size, self.failed)
        return self.cache[key]

    def warn(self) -> None:
        if self.failed:
            warnings.warn(
                f"{len(self.failed)} image(s) of the gallery could not be read and are shown as "
                f"placeholders; first: {self.failed[0]}. Check the image paths (one per row, "
                "relative to the current folder).",
                EmbedevalWarning,
                stacklevel=4,
            )


def _listed(values: Any, name: str) -> list[Any] | None:
    if values is None:
        return None
    if isinstance(values, (str, bytes, os.PathLike)):
        raise InputError(
            f"{name} must be a sequence with one entry per row, not a single path ({values!r}); "
            "on the command line pass a file with one entry per line."
        )
    return list(values)


def _clip(text: Any, max_chars: int | None) -> str:
    """``text`` cut to ``max_chars`` characters (an ellipsis marks the cut).

    >>> _clip("a long passage", 6), _clip("short", 6)
    ('a lon…', 'short')
    """
    text = str(text)
    if max_chars is None or len(text) <= max_chars:
        return text
    return text[: max_chars - 1] + "…"


def _is_path(item: Any) -> bool:
    return isinstance(item, (str, os.PathLike))


def _pixels(pixels: Any, name: str) -> np.ndarray:
    """An image given as an array, as uint8 pixels: H x W grey, or H x W x 3 RGB (x 2 grey and
    alpha, x 4 RGBA); integers are the 0..255 levels, floats (and booleans) a fraction in
    [0, 1] (beyond it clipped, NaN black).  Anything else is refused, naming ``name``.

    >>> _pixels(np.array([[0, 255]]), "images[0]").dtype.name
    'uint8'
    """
    a = np.asarray(pixels)
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    if not (a.ndim == 2 or (a.ndim == 3 and a.shape[2] in (2, 3, 4))) or 0 in a.shape:
        raise InputError(
            f"{name} has shape {a.shape}; an image array is H x W (grey) or H x W x 3 (RGB)."
        )
    if a.dtype == np.uint8:
        return a
    refuse_object_array(a, name, "pass uint8 levels or floats in [0, 1].", InputError)
    if a.dtype.kind in "iu":  # levels, as they are: scaling them as fractions shows white
        if a.min() < 0 or a.max() > 255:
            raise InputError(
                f"{name} holds integers from {a.min()} to {a.max()}; integer pixels are the "
                "levels 0..255 (pass floats in [0, 1] for fractions)."
            )
        return a.astype(np.uint8)
    if a.dtype.kind not in "fb":
        raise InputError(
            f"{name} has dtype {a.dtype}; pass uint8 levels or floats in [0, 1], or a file path."
        )
    fraction = np.nan_to_num(np.clip(a.astype(np.float64), 0.0, 1.0), nan=0.0)
    return (fraction * 255).round().astype(np.uint8)


def _array_uri(pixels: Any, size: int, name: str = "images") -> str:
    """An image given as an array (see :func:`_pixels`) as a PNG data URI, scaled to fit
    ``size`` x ``size``; small images are enlarged pixel by pixel."""
    from PIL import Image

    im = Image.fromarray(_pixels(pixels, name))
    scale = size / max(im.size)
    shape = (max(1, round(im.size[0] * scale)), max(1, round(im.size[1] * scale)))
    im = im.resize(shape, Image.Resampling.NEAREST if scale > 1 else Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    im.save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _thumbnail(path: str, size: int, failed: list[str]) -> str | None:
    """The image at ``path`` downscaled to fit ``size`` x ``size``, as a JPEG data URI (PNG when it
    has transparency); None (and ``path`` noted in ``failed``) when it cannot be read."""
    try:
        from PIL import Image, ImageOps

        with Image.open(path) as im:
            # upright as every viewer shows it (a phone photo stores its rotation in EXIF)
            im = _eight_bit(ImageOps.exif_transpose(im))
            im.thumbnail((size, size))
            alpha = "A" in im.mode or "transparency" in im.info
            im = im.convert("RGBA" if alpha else "RGB")
            buf = io.BytesIO()
            im.save(buf, format="PNG" if alpha else "JPEG", quality=85)
    except Exception as exc:  # any unreadable file is a placeholder, never a crash
        failed.append(f"{path} ({type(exc).__name__}: {' '.join(str(exc).split())[:80]})")
        return None
    kind = "png" if alpha else "jpeg"
    return f"data:image/{kind};base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _eight_bit(im: Any) -> Any:
    """An image of more than 8 bits per pixel (modes ``I;16``, ``I``, ``F``: 16-bit PNGs, TIFFs)
    as 8-bit grey with its own range stretched over 0..255; other images as they are.

    Pillow's own conversion to RGB clips every value above 255, which shows a 16-bit image as a
    white square.
    """
    from PIL import Image

    if im.mode not in ("I", "F") and not im.mode.startswith("I;16"):
        return im
    a = np.asarray(im, dtype=np.float64)
    finite = a[np.isfinite(a)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
    scaled = (a - lo) * (255.0 / (hi - lo)) if hi > lo else np.zeros_like(a)
    pixels = np.nan_to_num(scaled, nan=0.0, posinf=255.0, neginf=0.0).round()
    return Image.fromarray(pixels.astype(np.uint8))


def _gallery(
    res: Any, inputs: dict[str, Any] | None, n: int, metric: str | None, k: int, media: _Media
) -> str:
    head = '<h2 id="s-gallery">Failure gallery</h2>'
    if inputs is None or inputs.get("query") is None:
        return head + (
            "<p>The gallery needs the embeddings: pass <code>query=</code> (and "
            "<code>reference=</code>, labels and groups as given to <code>evaluate</code>) to "
            "<code>to_html</code>, or write the page with <code>embedeval evaluate --report</code>."
            "</p>"
        )
    if metric is not None and metric not in res.per_query:
        raise InputError(
            f"gallery_metric={metric!r} has no per-query values in this result; choose one of "
            f"{', '.join(res.per_query) or '(none)'}."
        )
    media.check(res.n_queries, res.settings.get("n_reference", 0))
    metric = metric or main_metric(res)
    if metric is None or np.isnan(res.per_query[metric]).all():
        what = "any per-query metric" if metric is None else metric
        return head + (
            f"<p>No gallery: no query has a value of {_e(what)} (every query is lone, or only "
            "NMI / AMI were asked for).</p>"
        )
    kw = {key: inputs[key] for key in _GALLERY_INPUTS if inputs.get(key) is not None}
    # Headings count the rows shown: fewer than n queries may be ranked, or be errors.
    up = higher_is_better(res, metric)
    worst = worst_queries(res.per_query[metric], n, up)
    title = f"The {worst.size} queries with the {'lowest' if up else 'highest'} {metric}"
    sections = [("worst", title, worst)]
    conf = res.query_confidences
    if conf is not None and "precision_at_1" in res.per_query:
        higher = bool(res.settings.get("higher_is_confident", True))
        rows = confident_errors(res.per_query["precision_at_1"], conf, n, higher)
        title = f"The {rows.size} most confident errors (top-1 not relevant)"
        sections.append(("confident", title, rows))
    chosen = np.unique(np.concatenate([rows for _, _, rows in sections]))
    found = gallery_rows(chosen, k, distance=res.settings["distance"], **kw)
    by_query = {r.query: r for r in found}
    labels = as_any_labels(inputs["query_labels"], "query_labels")
    ref_labels = (
        labels
        if inputs.get("reference") is None
        else as_any_labels(inputs["reference_labels"], "reference_labels")
    )
    out = [head, *_gallery_intro(res)]
    for ident, title, rows in sections:
        body = [
            _gallery_row(by_query[int(q)], k, res, metric, labels, ref_labels, media, conf)
            for q in rows.tolist()
        ]
        head_cells = ["query", *[f"#{r}" for r in range(1, k + 1)], "first relevant"]
        out.append(f"<h3>{_e(title)}</h3>")
        out.append(_table(head_cells, body, cls="gallery", ident=f"gallery-{ident}"))
    return "\n".join(out)


def _gallery_intro(res: Any) -> list[str]:
    """How to read the gallery's rows, and for an approximate run whose neighbours they are."""
    out = [
        "<p class='sub'>Each row: the query, then its nearest references that count (the "
        "query itself and references the protocol excludes are skipped), "
        "<span class='sym'>✓</span> relevant (same label, or a shared one for label sets), "
        "<span class='sym'>✗</span> not; "
        "the last column is the rank of the first relevant reference.</p>"
    ]
    if res.approximation:  # the gallery searches exactly: say whose neighbours these are
        out.append(
            "<p class='warn' id='gallery-exact'>The neighbours shown come from an exact search; "
            "the metrics above come from the approximate index, whose lists can differ.</p>"
        )
    return out


def _gallery_row(
    row: GalleryRow,
    width: int,
    res: Any,
    metric: str,
    labels: np.ndarray,
    ref_labels: np.ndarray,
    media: _Media,
    conf: Any,
) -> str:
    q = row.query
    extra = f"<span class='meta'>confidence {_num(conf[q])}</span>" if conf is not None else ""
    cells = [
        f'<td class="q">{media.show(q, False)}<span class="meta">query {q}</span>'
        f"<span class='meta'>label {_e(label_text(labels[q]))}</span>"
        f"<span class='meta'>{_e(metric)} {_num(res.per_query[metric][q])}</span>{extra}</td>"
    ]
    for rank, j, d, rel in zip(
        row.ranks.tolist(),
        row.indices.tolist(),
        row.distances.tolist(),
        row.relevant.tolist(),
        strict=True,
    ):
        mark, cls = ("✓", "ok") if rel else ("✗", "bad")
        cells.append(
            f'<td class="{cls}" data-rank="{rank}" data-index="{j}" data-relevant="{int(rel)}">'
            f'<span class="sym">{mark}</span> {media.show(j, True)}'
            f"<span class='meta'>#{rank} · ref {j}</span><span class='meta'>label "
            f"{_e(label_text(ref_labels[j]))}</span><span class='meta'>d {_num(d)}</span></td>"
        )
    first = row.first_relevant
    what = "none" if first is None else f"rank {first}"
    cells += ["<td></td>"] * (width + 1 - len(cells))
    cells.append(f'<td data-first-relevant="{first or ""}">{what}</td>')
    return f'<tr class="gallery-row" data-query="{q}">{"".join(cells)}</tr>'


# ----------------------------------------------------------------------------- comparison page
def comparison_html(cmp: Any, *, title: str | None = None, figures: bool = True) -> str:
    """The HTML page of a :class:`~embedeval.evaluation.compare.Comparison`: the checkpoint table
    with intervals and paired differences against the baseline, and its plot.

    Examples
    --------
    >>> import embedeval as ee
    >>> x, y = [[0.0], [0.1], [1.0], [1.2]], [0, 0, 1, 1]
    >>> runs = {"a": ee.evaluate(x, y), "b": ee.evaluate([[0.0], [0.9], [1.0], [1.2]], y)}
    >>> page = comparison_html(ee.compare(runs, n_boot=20), figures=False)
    >>> page.count('data-checkpoint="b"')  # one row per metric
    4
    """
    title = title or "embedeval comparison"
    s = cmp.settings
    sub = (
        f"<p class='sub'>{len(cmp.names)} checkpoints · baseline {_e(cmp.baseline)} · "
        f"{_e(s.get('test', 'bootstrap'))} test · {_e(s.get('n_boot', ''))} resamples</p>"
    )
    head, body = cmp._cells()
    rows = []
    for r, cells in zip(cmp.rows, body, strict=True):
        num = {2: r["value"], 4: None if r["checkpoint"] == cmp.baseline else r["diff"]}
        tds = "".join(
            _cell(num[i]) if i in num and num[i] is not None else f"<td>{_e(c)}</td>"
            for i, c in enumerate(cells)
        )
        who = f'data-checkpoint="{_e(r["checkpoint"])}" data-metric="{_e(r["metric"])}"'
        rows.append(f"<tr {who}>{tds}</tr>")
    parts = [f"<h1>{_e(title)}</h1>", sub, "<h2>Checkpoints</h2>"]
    parts.append(_table(head, rows, cls="sortable", ident="comparison"))
    parts.append(
        "<p class='sub'>diff: checkpoint minus baseline on the queries both share, with its "
        "paired interval; an interval that excludes 0 is a difference beyond resampling noise."
        "</p>"
    )
    if figures and cmp.rows:
        uri = _figure_uri(cmp.plot())
        parts.append(
            f'<h2>Figure</h2><figure id="fig-checkpoints"><img src="{uri}" alt="metrics per '
            'checkpoint"><figcaption>Metrics per checkpoint with their intervals</figcaption>'
            "</figure>"
        )
    parts.append(_kv({"settings": s}) if s else "")
    return _page(title, parts)
