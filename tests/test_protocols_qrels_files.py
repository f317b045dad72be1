"""embedeval.protocols.qrels_files: qrels readers and the TREC run writer, against pytrec_eval's
parsers, a csv-module reader and hand-written files; every error names its line."""

from __future__ import annotations

import csv
import gzip
import os

import numpy as np
import pytest

from embedeval.protocols.qrels_files import read_qrels, read_trec_run, write_trec_run
from embedeval.utils.errors import FileFormatError, InputError, InputTypeError


def random_qrels(seed: int, n_queries: int = 30) -> dict[str, dict[str, int]]:
    rng = np.random.default_rng(seed)
    return {
        f"q{q}": {
            f"doc{d}": int(rng.integers(-1, 4))
            for d in rng.choice(500, rng.integers(1, 20), replace=False)
        }
        for q in range(n_queries)
    }


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------- dict qrels
def test_dict_ids_become_str_and_grades_int():
    got = read_qrels({1: {"a": np.int64(2), 5: 1.0, "c": np.float32(0)}, "q": {"d": -1}})
    assert got == {"1": {"a": 2, "5": 1, "c": 0}, "q": {"d": -1}}
    assert all(type(g) is int for docs in got.values() for g in docs.values())
    assert read_qrels({"q": {}}) == {"q": {}}  # a query with no judgment is kept


@pytest.mark.parametrize(
    ("qrels", "needles"),
    [
        ({"q1": {"d1": 1.5}}, ["qrels['q1']['d1'] = 1.5", "not an integer grade"]),
        ({"q1": {"d1": True}}, ["qrels['q1']['d1'] = True"]),
        ({"q1": {"d1": "2"}}, ["'2'", "not an integer grade"]),
        ({"q1": {"d1": float("nan")}}, ["nan"]),
        ({1.5: {"d1": 1}}, ["query id 1.5", "str or int"]),
        ({"q1": {None: 1}}, ["document id of query 'q1' None"]),
        ({"": {"d": 1}}, ["query id ''"]),
        ({1: {"d": 1}, "1": {"d": 1}}, ["appears twice", "'1'"]),
        ({"q": {1: 1, "1": 2}}, ["grades 1 and 2"]),
        ({"q1": [("d1", 1)]}, ["qrels['q1'] must be a dict"]),
        ({"q1": {"d1": 2**63}}, ["qrels['q1']['d1'] = 9223372036854775808", "64-bit"]),
        ({"q1": {"d1": -(2**63) - 1}}, ["64-bit"]),
        ({"q1": {"d1": 1e19}}, ["1e+19", "64-bit"]),
        ({}, ["qrels is empty"]),
    ],
)
def test_bad_dicts(qrels, needles):
    with pytest.raises(InputError) as info:
        read_qrels(qrels)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))


def test_bad_source_type():
    with pytest.raises(InputTypeError, match="TREC or BEIR"):
        read_qrels([("q", "d", 1)])


# --------------------------------------------------------------------------- files
def test_trec_qrels_match_pytrec_eval_parser(tmp_path):
    pytrec_eval = pytest.importorskip("pytrec_eval")
    qrels = random_qrels(0)
    text = "".join(f"{q} 0 {d} {g}\n" for q, docs in qrels.items() for d, g in docs.items())
    path = write(tmp_path, "qrels.txt", text)
    with open(path) as fh:
        expected = dict(pytrec_eval.parse_qrel(fh))
    assert read_qrels(path) == expected == qrels
    assert read_qrels(str(path)) == expected


def test_beir_tsv_matches_a_csv_reader(tmp_path):
    qrels = random_qrels(1)
    qrels["q0"]["doc with spaces"] = 1
    rows = [(q, d, g) for q, docs in qrels.items() for d, g in docs.items()]
    path = tmp_path / "test.tsv"
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
        writer.writerow(["query-id", "corpus-id", "score"])
        writer.writerows(rows)
    expected: dict = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            expected.setdefault(row["query-id"], {})[row["corpus-id"]] = int(row["score"])
    assert read_qrels(path) == expected == qrels


def test_three_columns_crlf_blank_lines_and_gzip(tmp_path):
    text = "q1 d1 2\r\n\r\nq1 d2 0\r\n   \r\nq2 d1 -1\r\n"
    expected = {"q1": {"d1": 2, "d2": 0}, "q2": {"d1": -1}}
    assert read_qrels(write(tmp_path, "three.txt", text)) == expected
    gz = tmp_path / "qrels.txt.gz"
    with gzip.open(gz, "wt") as fh:
        fh.write("q1 0 d1 2\nq1 0 d2 0\nq2 0 d1 -1\n")
    assert read_qrels(gz) == expected


@pytest.mark.parametrize(
    "text", ["q1 0 d1 1\nq2 0 d2 0\n", "query-id\tcorpus-id\tscore\nq1\td1\t1\n"]
)
def test_a_byte_order_mark_is_not_part_of_the_first_line(tmp_path, text):
    path = tmp_path / "qrels.txt"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    plain = tmp_path / "plain.txt"
    plain.write_bytes(text.encode())
    assert read_qrels(path) == read_qrels(plain)
    assert "q1" in read_qrels(path)


def test_grades_at_the_ends_of_the_int64_range_are_accepted(tmp_path):
    text = "q1 0 d1 9223372036854775807\nq1 0 d2 -9223372036854775808\n"
    assert read_qrels(write(tmp_path, "q.txt", text)) == {"q1": {"d1": 2**63 - 1, "d2": -(2**63)}}


def test_repeated_identical_judgment_and_integral_float_grade_are_accepted(tmp_path):
    path = write(
        tmp_path, "q.txt", "q1 0 d1 1\nq1 0 d1 1\nq1 0 d2 2.0\nq1 0 d3 +1e1\nq1 0 d4 -07\n"
    )
    assert read_qrels(path) == {"q1": {"d1": 1, "d2": 2, "d3": 10, "d4": -7}}


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("q1 0 d1 1\nq1 0 d2\n", ["line 2", "3 fields", "'query-id iteration doc-id grade'"]),
        ("q1 0 d1 1\n\n\nq1 0 d2 1 x\n", ["line 4", "5 fields"]),
        ("q1 d1 1\nq1 0 d2 1\n", ["line 2", "4 fields", "'query-id doc-id grade'"]),
        ("q1 0 d1 1\nq1 0 d2 high\n", ["line 2", "grade 'high' is not an integer"]),
        ("q1 0 d1 1\nq1 0 d2 0.5\n", ["line 2", "grade '0.5'"]),
        # Python's int() reads these as 10 and 3; trec_eval's atol reads "1_0" as 1
        ("q1 0 d1 1\nq1 0 d2 1_0\n", ["line 2", "grade '1_0' is not an integer"]),
        ("q1 d1 \u0663\n", ["line 1", "grade '\u0663' is not an integer"]),
        ("q1 d1 1.0_0\n", ["line 1", "grade '1.0_0' is not an integer"]),
        ("q1 0 d1 1\nq1 0 d2 9223372036854775808\n", ["line 2", "64-bit integer range"]),
        ("q1 d1 -9223372036854775809\n", ["line 1", "64-bit integer range"]),
        ("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\n", ["line 3", "2 fields"]),
        ("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\t\t1\n", ["line 3", "an empty field"]),
        ("qid\tdocid\trel\nq1\td1\t1\n", ["line 1", "'rel' is not an integer", "header"]),
        ("q1 0 d1 1 5 6\n", ["line 1", "6 fields", "BEIR file starts with the header"]),
        ("q1 0 d1 1\nq2 0 d1 1\nq1 0 d1 2\n", ["line 3", "grade 2", "line 1 gave it grade 1"]),
        ("", ["empty"]),
        ("\n  \n", ["empty"]),
        ("query-id\tcorpus-id\tscore\n", ["no judgment"]),
    ],
)
def test_file_errors_name_the_line(tmp_path, text, needles):
    path = write(tmp_path, "qrels.txt", text)
    with pytest.raises(FileFormatError) as info:
        read_qrels(path)
    assert str(path) in str(info.value)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))


def test_missing_directory_and_binary_files(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        read_qrels(tmp_path / "nope.txt")
    with pytest.raises(InputError, match="is a directory"):
        read_qrels(tmp_path)
    binary = tmp_path / "qrels.bin"
    binary.write_bytes(b"\xff\xfe\x00q1 0 d1 1\n")
    with pytest.raises(FileFormatError, match="UTF-8"):
        read_qrels(binary)


# --------------------------------------------------------------------------- runs
def test_written_run_parses_back_exactly(tmp_path):
    pytrec_eval = pytest.importorskip("pytrec_eval")
    rng = np.random.default_rng(2)
    counts = rng.integers(0, 30, 40)
    lims = np.concatenate([[0], np.cumsum(counts)])
    scores = np.concatenate([np.sort(rng.normal(size=c))[::-1] for c in counts]).astype(np.float32)
    doc_ids = np.array([f"doc{i}" for i in range(lims[-1])])
    query_ids = [f"q{i}" for i in range(40)]
    path = write_trec_run(tmp_path / "run.txt", query_ids, lims, doc_ids, scores, tag="sys1")
    with open(path) as fh:
        parsed = dict(pytrec_eval.parse_run(fh))
    assert read_trec_run(path) == parsed
    lines = path.read_text().splitlines()
    assert len(lines) == lims[-1]
    for q in range(40):
        for j in range(lims[q], lims[q + 1]):
            qid, q0, doc, rank, score, tag = lines[j].split()
            assert (qid, q0, doc, int(rank), tag) == (
                query_ids[q],
                "Q0",
                doc_ids[j],
                j - lims[q] + 1,
                "sys1",
            )
            assert np.float32(float(score)) == scores[j]  # float32 round-trips
            assert np.float32(parsed[qid][doc]) == scores[j]


def test_float64_scores_round_trip_and_integers_are_accepted(tmp_path):
    scores = np.array([1 / 3, 1e-300, -2.5e10])
    path = write_trec_run(tmp_path / "run.txt", [7], [0, 3], [1, 2, 3], scores)
    assert read_trec_run(path) == {"7": {"1": 1 / 3, "2": 1e-300, "3": -2.5e10}}
    path = write_trec_run(tmp_path / "int.txt", ["q"], [0, 2], ["a", "b"], [3, 1])
    assert path.read_text() == "q Q0 a 1 3.0 embedeval\nq Q0 b 2 1.0 embedeval\n"


def test_trec_eval_reads_the_written_run_like_the_dict(tmp_path):
    pytrec_eval = pytest.importorskip("pytrec_eval")
    qrels = {"q1": {"a": 1, "c": 2}, "q2": {"b": 1}}
    path = write_trec_run(
        tmp_path / "run.txt", ["q1", "q2"], [0, 3, 4], ["c", "b", "a", "b"], [0.9, 0.5, 0.1, 2.0]
    )
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"map", "ndcg"})
    run = {"q1": {"c": 0.9, "b": 0.5, "a": 0.1}, "q2": {"b": 2.0}}
    assert evaluator.evaluate(read_trec_run(path)) == evaluator.evaluate(run)


@pytest.mark.parametrize(
    ("args", "kwargs", "needle"),
    [
        ((["q"], [0, 2], ["a", "b"], [1.0, 2.0]), {}, "increase along its ranking"),
        ((["q"], [0, 2], ["a", "b"], [1.0, np.nan]), {}, "NaN or infinity"),
        ((["q"], [0, 2], ["a b", "c"], [2.0, 1.0]), {}, "doc_ids holds 'a b'"),
        ((["q"], [0, 2], ["", "c"], [2.0, 1.0]), {}, "doc_ids holds ''"),
        ((["q 1"], [0, 1], ["a"], [1.0]), {}, "query_ids holds 'q 1'"),
        ((["q", "r"], [0, 1], ["a"], [1.0]), {}, "query_ids must hold 1 ids"),
        (([1.5], [0, 1], ["a"], [1.0]), {}, "query_ids: id 1.5 \\(float\\) is not a valid id"),
        ((["q"], [0, 2], ["a"], [2.0, 1.0]), {}, "doc_ids must hold 2 ids"),
        ((["q"], [0, 2], ["a", "b"], [2.0]), {}, "lims\\[-1\\] = 2"),
        ((["q"], [1, 2], ["a"], [2.0]), {}, "start at 0"),
        ((["q"], [0.0, 1.0], ["a"], [2.0]), {}, "integer array"),
        ((["q"], [0, 1], ["a"], [1.0]), {"tag": "my run"}, "tag='my run'"),
        ((["q"], [0, 1], ["a"], [2**70]), {}, f"scores holds the integer {2**70}, beyond 64"),
        ((["q"], [0, 2**70], ["a"], [1.0]), {}, f"lims holds the integer {2**70}, beyond 64"),
    ],
)
def test_bad_runs_write_nothing(tmp_path, args, kwargs, needle):
    path = write(tmp_path, "run.txt", "old content\n")
    with pytest.raises(InputError, match=needle):
        write_trec_run(path, *args, **kwargs)
    assert path.read_text() == "old content\n"


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("q1 Q0 d1 1 0.5 t\nq1 Q0 d2 2 0.4\n", ["line 2", "5 fields"]),
        ("q1 Q0 d1 1 0.5 t\n\nq1 Q0 d2 2 high t\n", ["line 3", "score 'high'"]),
        ("q1 Q0 d1 1 nan t\n", ["line 1", "score 'nan'"]),
        ("q1 Q0 d1 1 0.5 t\nq2 Q0 d1 1 0.5 t\nq1 Q0 d1 2 0.4 t\n", ["line 3", "also line 1"]),
        ("", ["empty"]),
    ],
)
def test_run_file_errors_name_the_line(tmp_path, text, needles):
    path = write(tmp_path, "run.txt", text)
    with pytest.raises(FileFormatError) as info:
        read_trec_run(path)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))


def test_fields_are_separated_by_ascii_whitespace_only(tmp_path):
    # trec_eval splits on C isspace: a no-break space or a Unicode separator inside an id stays
    # in the id (str.split() would have cut "d\xa07" in two and shifted the grade)
    trec = write(tmp_path, "q.txt", "q1 0 d\u00a07 2\nq1\t0\td\u20088 1\r\n")
    assert read_qrels(trec) == {"q1": {"d\u00a07": 2, "d\u20088": 1}}
    beir = write(tmp_path, "q.tsv", "query-id\tcorpus-id\tscore\nq\u00a01\t d\u00a02 \t3\n")
    assert read_qrels(beir) == {"q\u00a01": {"d\u00a02": 3}}
    run = write(tmp_path, "run.txt", "q1 Q0 d\u00a07 1 0.5 tag\n")
    assert read_trec_run(run) == {"q1": {"d\u00a07": 0.5}}


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_qrels_pipe_is_refused_as_not_a_regular_file(tmp_path):
    fifo = tmp_path / "test.qrels"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match=r"qrels file .*test.qrels is not a regular file"):
        read_qrels(fifo)
