"""Plain-text tables: Markdown (GitHub-flavoured) from a header and rows of cells."""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["markdown_table"]

#: Line breaks of every kind: a cell is one line of the table.
_BREAKS = re.compile(r"\r\n|[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")


#: A ``<`` that starts raw HTML or an autolink (a tag, ``</``, ``<!``, ``<?``); ``<1e-03`` does not.
_TAG_START = re.compile(r"<(?=[A-Za-z/!?])")


def _cell(text: str) -> str:
    """One cell as written: line breaks as spaces; ``|`` (which would end the cell) and a ``<``
    that would start raw HTML (rendered or dropped) escaped with a backslash, as CommonMark
    allows for any ASCII punctuation."""
    text = _BREAKS.sub(" ", text).replace("\\", "\\\\").replace("|", "\\|")
    return _TAG_START.sub(r"\\<", text)


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table of ``head`` and ``rows`` (cells as text), each cell kept in its column
    whatever it holds.

    >>> print(markdown_table(["label", "p"], [["a|b", "<1e-03"], ["<i>x</i>", "0.5"]]), end="")
    | label | p |
    |---|---|
    | a\\|b | <1e-03 |
    | \\<i>x\\</i> | 0.5 |
    """
    lines = ["| " + " | ".join(map(_cell, head)) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(map(_cell, row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"
