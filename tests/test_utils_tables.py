"""embedeval.utils.tables: Markdown tables keep every cell in its column, read back by a
CommonMark-style cell splitter written here (a backslash escapes the next character)."""

from __future__ import annotations

import numpy as np
import pytest

import embedeval as ee
from embedeval.utils.tables import markdown_table


def _read_back(text: str) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        cells, cur, i = [], "", 1  # past the leading "|"
        while i < len(line):
            ch = line[i]
            if ch == "\\" and i + 1 < len(line):
                cur, i = cur + line[i + 1], i + 2
                continue
            if ch == "|":
                cells.append(cur.strip())
                cur = ""
            else:
                cur += ch
            i += 1
        rows.append(cells)
    return rows


@pytest.mark.parametrize(
    "cell",
    ["a|b", "ends with \\", "\\|", "<script>alert(1)</script>", "x\ny", "r\r\nn", "u\u2028v", ""],
)
def test_every_cell_reads_back_in_its_column(cell):
    text = markdown_table(["label", "n"], [[cell, "1"], ["plain", "2"]])
    rows = _read_back(text)
    assert len(text.splitlines()) == 4  # head, rule, two rows: no cell broke its line
    flat = cell.replace("\r\n", " ").replace("\n", " ").replace("\u2028", " ")
    assert (
        rows[0] == ["label", "n"] and rows[2] == [flat.strip(), "1"] and rows[3] == ["plain", "2"]
    )
    assert "<" not in text.replace("\\<", "")  # no raw HTML for a renderer to run or drop


def test_a_less_than_sign_that_starts_no_tag_is_written_as_is():
    # a p-value floor reads "<1e-03", not "\\<1e-03"; a tag or an autolink is escaped
    text = markdown_table(["p", "x"], [["<1e-03", "< 5"], ["<b>", "<https://x.org>"]])
    assert "| <1e-03 | < 5 |" in text and "| \\<b> | \\<https://x.org> |" in text


def test_comparison_markdown_keeps_a_pipe_in_a_checkpoint_name():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((40, 4)).astype(np.float32), np.arange(40) % 4
    runs = {"a|b": ee.evaluate(x, y, metrics=["precision_at_1"]),
            "c": ee.evaluate(x + 0.5, y, metrics=["precision_at_1"])}  # fmt: skip
    rows = _read_back(ee.compare(runs, n_boot=50).to_markdown())
    assert [r[0] for r in rows[2:]] == ["a|b", "c"]
    assert {len(r) for r in rows} == {len(rows[0])}
