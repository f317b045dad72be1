"""Relevance judgments in, runs out: TREC and BEIR qrels readers, TREC run writer and reader.

Qrels are ``{query_id: {doc_id: grade}}`` with ``str`` ids and ``int`` grades (0 or negative:
judged non-relevant; within the int64 range, as trec_eval holds them).  :func:`read_qrels`
takes such a dict (ids may be ``int``: they become ``str``; grades may be integral floats) or a
file, whose format it reads off the content:

* BEIR ``qrels/*.tsv``: a header line ``query-id<TAB>corpus-id<TAB>score``, then one
  tab-separated ``query-id corpus-id score`` line per judgment (ids may hold spaces);
* TREC qrels: ``query-id iteration doc-id grade`` per line, whitespace separated (the iteration
  column, usually 0, is ignored);
* three whitespace-separated columns ``query-id doc-id grade`` without a header (BEIR without
  its header line).

Every line of a file has the field count of its first judgment; blank lines are skipped; a file
ending in ``.gz`` is read through gzip.  The same (query, document) pair twice with different
grades is an error naming both lines; twice with the same grade is accepted.

:func:`write_trec_run` writes the ``query-id Q0 doc-id rank score tag`` lines trec_eval reads,
atomically; :func:`read_trec_run` reads them back as ``{query_id: {doc_id: score}}``.
"""

from __future__ import annotations

import gzip
import math
import numbers
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..utils.errors import FileFormatError, InputError, InputTypeError
from ..utils.files import not_a_file, write_text
from ..utils.validation import as_int64, refuse_object_array

__all__ = ["read_qrels", "read_trec_run", "unfit_run_id", "write_trec_run"]

_BEIR_HEADER = ("query-id", "corpus-id", "score")
#: Grades are held in int64 arrays (trec_eval keeps them in a C long): the range they take.
_GRADE_MIN, _GRADE_MAX = -(2**63), 2**63 - 1
_RANGE_HINT = (
    "grades must lie within the 64-bit integer range (-2**63 to 2**63 - 1, as trec_eval's C "
    "long holds them); use grades on a smaller scale."
)
_WHITESPACE = re.compile(r"\s")


# --------------------------------------------------------------------------- shared helpers
def _as_path(source: Any, name: str) -> Path:
    path = Path(source)
    if path.exists() and not path.is_dir() and not path.is_file():
        raise InputError(f"{name} file {not_a_file(path)}")
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise InputError(f"{name} file {str(path)!r} {what}; pass the path of a file.")
    return path


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """Non-blank lines with their 1-based numbers, without the line ending."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:  # utf-8-sig: a byte-order mark (Windows editors write one) is not part of the first id
        with opener(path, "rt", encoding="utf-8-sig", newline=None) as fh:
            for number, line in enumerate(fh, start=1):
                line = line.rstrip("\r\n")
                if line.strip():
                    yield number, line
    except (UnicodeDecodeError, OSError, EOFError) as exc:
        raise FileFormatError(
            f"{path}: cannot be read as UTF-8 text ({exc}); qrels and runs are text files."
        ) from None


def _grade(value: Any) -> int | None:
    """``value`` as an int when it is integral (int, numpy int, whole float), else None."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    return None


#: The spellings of a grade: a decimal integer ("2", "-1", "+3") or a whole decimal number
#: ("1.0", "1e3").  Python's int() and float() also read "1_0" as 10 and "٣" (an Arabic-Indic
#: digit) as 3, which no qrels file means as a grade (trec_eval's atol reads "1_0" as 1).
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _parse_grade(text: str) -> int | None:
    """The grade a qrels field spells, or None (not one of the spellings of :data:`_NUMBER`,
    or not integral)."""
    if not _NUMBER.fullmatch(text):
        return None
    try:
        return int(text)
    except ValueError:
        return _grade(float(text))


# --------------------------------------------------------------------------- qrels from a dict
def _id(value: Any, what: str, where: str = "qrels") -> str:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        return str(int(value))
    raise InputError(
        f"{where}: {what} {value!r} ({type(value).__name__}) is not a valid id; ids are non-empty "
        "str or int."
    )


def _qrels_from_dict(source: Mapping) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    for raw_qid, docs in source.items():
        qid = _id(raw_qid, "query id")
        if qid in qrels:
            raise InputError(
                f"qrels: query id {raw_qid!r} appears twice once ids are strings (as {qid!r}); "
                "keep one spelling."
            )
        if not isinstance(docs, Mapping):
            raise InputError(
                f"qrels[{raw_qid!r}] must be a dict {{doc_id: grade}}; got {type(docs).__name__}."
            )
        judged: dict[str, int] = {}
        for raw_doc, value in docs.items():
            # exact str / int first: the general checks cost more than the rest of a judgment
            ok = type(raw_doc) is str and raw_doc
            doc = raw_doc if ok else _id(raw_doc, f"document id of query {raw_qid!r}")
            grade = value if type(value) is int else _grade(value)
            if grade is None:
                raise InputError(
                    f"qrels[{raw_qid!r}][{raw_doc!r}] = {value!r} is not an integer grade; "
                    "grades are integers (0 or negative: judged non-relevant)."
                )
            if not _GRADE_MIN <= grade <= _GRADE_MAX:
                raise InputError(f"qrels[{raw_qid!r}][{raw_doc!r}] = {value!r}: {_RANGE_HINT}")
            if doc in judged and judged[doc] != grade:
                raise InputError(
                    f"qrels[{raw_qid!r}]: document {doc!r} has grades {judged[doc]} and {grade} "
                    "(int and str spellings of one id); keep one."
                )
            judged[doc] = grade
        qrels[qid] = judged
    if not qrels:
        raise InputError("qrels is empty; give at least one query with its judged documents.")
    return qrels


# --------------------------------------------------------------------------- qrels from a file
#: The whitespace that separates fields, as trec_eval's C ``isspace`` reads it: ASCII only.  A
#: no-break space or another Unicode separator inside an id belongs to the id (``str.split()``
#: would cut the id there, shifting every later field).
_ASCII_SPACE = " \t\n\r\f\v"
_FIELD = re.compile(f"[^{_ASCII_SPACE}]+")


def _fields(line: str) -> list[str]:
    """The fields of ``line`` separated by ASCII whitespace.

    >>> _fields("q1 0 d\u00a07\t2")
    ['q1', '0', 'd\xa07', '2']
    """
    return _FIELD.findall(line)


def _tab_fields(line: str) -> list[str]:
    """The tab-separated fields of a BEIR line, each stripped of ASCII whitespace."""
    return [f.strip(_ASCII_SPACE) for f in line.split("\t")]


def _layout(first: str, path: Path) -> tuple[bool, Any, int]:
    """(header?, how to split a line, field count) read off the first non-blank line."""
    if tuple(field.lower() for field in _fields(first)) == _BEIR_HEADER:
        return True, (_tab_fields if "\t" in first else _fields), 3
    count = len(_fields(first))
    if count not in (3, 4):
        raise FileFormatError(
            f"{path}, line 1: {count} fields ({first[:80]!r}); a qrels line is 'query-id "
            "iteration doc-id grade' (TREC) or 'query-id doc-id grade', and a BEIR file starts "
            "with the header 'query-id<TAB>corpus-id<TAB>score'."
        )
    return False, _fields, count


def _first_line_of(path: Path, pair: tuple[str, str], fields_of: Any, doc_field: int) -> int:
    """The first line holding the (query, document) ``pair``: only read again on an error."""
    for number, line in _lines(path):
        fields = fields_of(line)
        if len(fields) > doc_field and (fields[0], fields[doc_field]) == pair:
            return number
    return 0  # not reached: the pair was read from this file


def _judgment(path: Path, number: int, line: str, split: Any, count: int, header: bool):
    fields = split(line)
    layout = "query-id doc-id grade" if count == 3 else "query-id iteration doc-id grade"
    if len(fields) == count and not all(fields):
        raise FileFormatError(
            f"{path}, line {number}: an empty field ({line[:80]!r}); every field of "
            f"'{layout}' must hold something."
        )
    if len(fields) != count:
        raise FileFormatError(
            f"{path}, line {number}: {len(fields)} fields ({line[:80]!r}); every line of this "
            f"file must be '{layout}' ({count} fields, like its first line)."
        )
    grade = _parse_grade(fields[-1])
    if grade is None:
        hint = (
            " A BEIR file must start with the header 'query-id<TAB>corpus-id<TAB>score'."
            if number == 1 and not header
            else ""
        )
        raise FileFormatError(
            f"{path}, line {number}: grade {fields[-1]!r} is not an integer; the last field of "
            f"'{layout}' is an integer grade (0 or negative: judged non-relevant).{hint}"
        )
    if not _GRADE_MIN <= grade <= _GRADE_MAX:
        raise FileFormatError(f"{path}, line {number}: grade {fields[-1]!r}: {_RANGE_HINT}")
    return fields[0], fields[-2], grade


def _read_qrels_file(path: Path) -> dict[str, dict[str, int]]:
    lines = _lines(path)
    first = next(lines, None)
    if first is None:
        raise FileFormatError(f"{path}: the qrels file is empty; it must hold judgments.")
    header, split, count = _layout(first[1], path)
    qrels: dict[str, dict[str, int]] = {}
    for number, line in lines if header else _chain(first, lines):
        qid, doc, grade = _judgment(path, number, line, split, count, header)
        judged = qrels.setdefault(qid, {})
        if judged.setdefault(doc, grade) != grade:
            before = _first_line_of(path, (qid, doc), split, count - 2)
            raise FileFormatError(
                f"{path}, line {number}: query {qid!r}, document {doc!r} has grade {grade}, but "
                f"line {before} gave it grade {judged[doc]}; keep one judgment per pair."
            )
    if not qrels:
        raise FileFormatError(f"{path}: the qrels file holds a header and no judgment.")
    return qrels


def _chain(first: tuple[int, str], rest: Iterator[tuple[int, str]]):
    yield first
    yield from rest


def read_qrels(source: Any) -> dict[str, dict[str, int]]:
    """Relevance judgments ``{query_id: {doc_id: grade}}`` from a dict or a qrels file.

    Parameters
    ----------
    source
        A dict ``{query_id: {doc_id: grade}}`` (ids ``str`` or ``int``, grades integral), or the
        path of a TREC qrels file, a BEIR ``qrels/*.tsv`` file or a three-column file (see the
        module docstring; ``.gz`` allowed).

    Returns
    -------
    dict
        A new dict with ``str`` ids and ``int`` grades, queries and documents in input order.

    Examples
    --------
    >>> read_qrels({1: {"d3": 2, 7: 0.0}})
    {'1': {'d3': 2, '7': 0}}
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "test.tsv"
    >>> _ = path.write_text("query-id\\tcorpus-id\\tscore\\nq1\\tdoc 1\\t1\\nq1\\td2\\t0\\n")
    >>> read_qrels(path)
    {'q1': {'doc 1': 1, 'd2': 0}}
    """
    if isinstance(source, Mapping):
        return _qrels_from_dict(source)
    if isinstance(source, (str, os.PathLike)):
        return _read_qrels_file(_as_path(source, "qrels"))
    raise InputTypeError(
        f"qrels must be a dict {{query_id: {{doc_id: grade}}}} or the path of a TREC or BEIR "
        f"qrels file; got {type(source).__name__}."
    )


# --------------------------------------------------------------------------- runs
def _id_list(values: Any, size: int, name: str) -> list[str]:
    ids = values.tolist() if isinstance(values, np.ndarray) else list(values)
    if len(ids) != size:
        raise InputError(f"{name} must hold {size} ids (one per line of the run); got {len(ids)}.")
    ids = [v if isinstance(v, str) else _id(v, "id", name) for v in ids]
    bad = unfit_run_id(ids)
    if bad is not None:
        raise InputError(
            f"{name} holds {ids[bad]!r}; ids in a TREC run must be non-empty and free of "
            "whitespace. Replace the whitespace (e.g. with '_') in the ids before writing."
        )
    return ids


def unfit_run_id(ids: Sequence[str]) -> int | None:
    """The position of the first id a TREC run cannot hold (empty, or holding whitespace, on
    which its lines are split), or None.  One regular-expression pass over all ids joined.

    >>> unfit_run_id(["d1", "d 2", ""]), unfit_run_id(["d1", ""]), unfit_run_id(["d1"])
    (1, 1, None)
    """
    joined = "\x00" + "\x00".join(ids) + "\x00"
    found = re.search(r"\s|\x00\x00", joined) if ids else None
    return None if found is None else joined.count("\x00", 0, found.start() + 1) - 1


def _run_arrays(lims: Any, scores: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lims = as_int64(lims, "lims", "Pass query offsets into the document rows (0 first).")
    if lims.ndim != 1 or lims.size == 0 or lims.dtype.kind not in "iu":
        raise InputError(f"lims must be a 1-D integer array; got {lims.dtype}, {lims.shape}.")
    counts = np.diff(lims)
    if lims[0] != 0 or np.any(counts < 0):
        raise InputError("lims must start at 0 and never decrease (lims[q]:lims[q+1] is query q).")
    scores = np.asarray(scores)
    refuse_object_array(scores, "scores", "pass a 1-D numeric array.", InputError)
    if scores.shape != (int(lims[-1]),) or scores.dtype.kind not in "fiu":
        raise InputError(
            f"scores must be a 1-D numeric array of lims[-1] = {int(lims[-1])} values; got "
            f"dtype {scores.dtype}, shape {scores.shape}."
        )
    if not np.all(np.isfinite(scores)):
        raise InputError("scores hold NaN or infinity; trec_eval needs finite scores.")
    qid = np.repeat(np.arange(counts.size), counts)
    rising = (qid[1:] == qid[:-1]) & (scores[1:] > scores[:-1])
    if rising.any():
        q = int(qid[np.flatnonzero(rising)[0]])
        raise InputError(
            f"scores of query {q} increase along its ranking; trec_eval ranks by score, higher "
            "first. Pass similarities best first (for distances, pass their negatives)."
        )
    return lims, scores, qid


def write_trec_run(
    path: str | os.PathLike,
    query_ids: Any,
    lims: Any,
    doc_ids: Any,
    scores: Any,
    *,
    tag: str = "embedeval",
) -> Path:
    """Write a ranking as a TREC run file (``query-id Q0 doc-id rank score tag``), atomically.

    Query q's ranking is entries ``lims[q]:lims[q+1]`` of ``doc_ids`` and ``scores``, best first;
    ranks are written 1-based in that order.  Scores must not increase along a ranking
    (trec_eval re-sorts by score and breaks ties by document id, descending, so with tied scores
    its order can differ from the rank column).  A float32 score is written with ``%.9g``, a
    float64 one with Python's shortest repr: both read back to the same value.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.txt"
    >>> _ = write_trec_run(path, ["q1", "q2"], [0, 2, 3], ["d7", "d1", "d7"],
    ...                    np.array([0.5, 0.25, 0.125], dtype=np.float32))
    >>> print(path.read_text(), end="")
    q1 Q0 d7 1 0.5 embedeval
    q1 Q0 d1 2 0.25 embedeval
    q2 Q0 d7 1 0.125 embedeval
    """
    lims, scores, qid = _run_arrays(lims, scores)
    queries = _id_list(query_ids, lims.size - 1, "query_ids")
    docs = _id_list(doc_ids, scores.size, "doc_ids")
    if not isinstance(tag, str) or not tag or _WHITESPACE.search(tag):
        raise InputError(f"tag={tag!r} must be a non-empty string without whitespace.")
    per_line = np.asarray(queries, dtype=object)[qid].tolist()
    ranks = (np.arange(scores.size) - lims[:-1][qid] + 1).tolist()
    if scores.dtype.itemsize <= 4 and scores.dtype.kind == "f":
        values = [f"{s:.9g}" for s in scores.tolist()]
    else:
        values = list(map(repr, scores.astype(np.float64).tolist()))
    tail = f" {tag}\n"
    text = "".join(
        [
            f"{q} Q0 {d} {r} {s}{tail}"
            for q, d, r, s in zip(per_line, docs, ranks, values, strict=True)
        ]
    )
    return write_text(path, text)


def read_trec_run(path: str | os.PathLike) -> dict[str, dict[str, float]]:
    """Read a TREC run file (``query-id Q0 doc-id rank score tag``) as ``{qid: {doc_id: score}}``.

    The rank column is not used (trec_eval ignores it too: it ranks by score).  A document twice
    in one query is an error naming both lines.

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.txt"
    >>> _ = path.write_text("q1 Q0 d7 1 0.5 bm25\\nq1 Q0 d1 2 0.25 bm25\\n")
    >>> read_trec_run(path)
    {'q1': {'d7': 0.5, 'd1': 0.25}}
    """
    path = _as_path(path, "run")
    run: dict[str, dict[str, float]] = {}
    for number, line in _lines(path):
        fields = _fields(line)
        if len(fields) != 6:
            raise FileFormatError(
                f"{path}, line {number}: {len(fields)} fields ({line[:80]!r}); a TREC run line "
                "is 'query-id Q0 doc-id rank score tag' (6 fields)."
            )
        qid, doc = fields[0], fields[2]
        try:
            score = float(fields[4])
        except ValueError:
            score = math.nan
        if math.isnan(score):
            raise FileFormatError(
                f"{path}, line {number}: score {fields[4]!r} is not a number; the fifth field "
                "of 'query-id Q0 doc-id rank score tag' is the score."
            )
        docs = run.setdefault(qid, {})
        if doc in docs:
            before = _first_line_of(path, (qid, doc), _fields, 2)
            raise FileFormatError(
                f"{path}, line {number}: document {doc!r} appears twice for query {qid!r} (also "
                f"line {before}); a run ranks each document once per query."
            )
        docs[doc] = score
    if not run:
        raise FileFormatError(f"{path}: the run file is empty.")
    return run
