"""embedeval.io: every format round-trips, large .npy stays memory-mapped, nothing unpickles."""

from __future__ import annotations

import os

import numpy as np
import pytest

import embedeval as ee
from embedeval.io import load_array, load_embeddings

X = np.arange(24, dtype=np.float32).reshape(6, 4)
Y = np.array([0, 0, 1, 1, 2, 2])


def test_npy_is_memory_mapped(tmp_path):
    np.save(tmp_path / "x.npy", X)
    f = load_embeddings(tmp_path / "x.npy")
    assert isinstance(f.embeddings, np.memmap)
    assert f.labels is None and f.name == "x"


def test_npz_with_optional_keys(tmp_path):
    np.savez(
        tmp_path / "x.npz",
        embeddings=X,
        labels=np.array(list("aabbcc")),
        confidences=np.linspace(0, 1, 6),
        sigmas=np.ones(6),
        groups=[1, 2, 1, 2, 1, 2],
    )
    f = load_embeddings(tmp_path / "x.npz")
    assert f.labels.tolist() == list("aabbcc")
    assert f.confidences.tolist() == np.linspace(0, 1, 6).tolist()
    assert f.groups.tolist() == [1, 2, 1, 2, 1, 2]


def test_safetensors_round_trip(tmp_path):
    st = pytest.importorskip("safetensors.numpy", reason="optional extra [safetensors]")
    st.save_file({"embeddings": X, "labels": Y}, str(tmp_path / "x.safetensors"))
    f = load_embeddings(tmp_path / "x.safetensors")
    np.testing.assert_array_equal(f.embeddings, X)
    assert f.labels.tolist() == Y.tolist()


def test_parquet_round_trip(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="optional extra [parquet]")
    import pyarrow.parquet as pq

    table = pa.table({"embedding": [row.tolist() for row in X], "label": list("aabbcc")})
    pq.write_table(table, tmp_path / "x.parquet")
    f = load_embeddings(tmp_path / "x.parquet")
    np.testing.assert_array_equal(f.embeddings, X)
    assert f.labels.tolist() == list("aabbcc")


@pytest.mark.parametrize(
    ("rows", "needle"),
    [
        # 3 + 5 = 2 rows of 4: a flat reshape would give [[0, 1, 2, 3], [4, 5, 6, 7]]
        ([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0, 6.0, 7.0]], "row 1 of the embedding column holds 5 "
         "values but row 0 holds 3"),
        ([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0, 6.0], [7.0]], "row 2 of the embedding column holds 3"),
        ([[0.0, 1.0], None, [2.0, 3.0]], "row 1 of the embedding column is empty (null)"),
        ([None, [2.0, 3.0]], "row 0 of the embedding column is empty (null)"),
    ],
)  # fmt: skip
def test_parquet_rows_of_different_lengths_are_refused(tmp_path, rows, needle):
    pa = pytest.importorskip("pyarrow", reason="optional extra [parquet]")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"embedding": rows, "label": [0] * len(rows)}), tmp_path / "r.parquet")
    with pytest.raises(ee.FileFormatError) as err:
        load_embeddings(tmp_path / "r.parquet")
    assert str(err.value).startswith(f"{tmp_path / 'r.parquet'}: {needle}")


def test_parquet_fixed_size_lists_and_several_chunks_keep_their_rows(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="optional extra [parquet]")
    import pyarrow.parquet as pq

    fixed = pa.FixedSizeListArray.from_arrays(pa.array(X.ravel()), 4)
    pq.write_table(pa.table({"embedding": fixed, "label": Y}), tmp_path / "f.parquet")
    np.testing.assert_array_equal(load_embeddings(tmp_path / "f.parquet").embeddings, X)
    table = pa.table({"embedding": [row.tolist() for row in X], "label": Y})
    pq.write_table(table, tmp_path / "c.parquet", row_group_size=2)
    np.testing.assert_array_equal(load_embeddings(tmp_path / "c.parquet").embeddings, X)


def test_label_files(tmp_path):
    (tmp_path / "l.txt").write_text("a\nb\n")
    assert load_array(tmp_path / "l.txt").tolist() == ["a", "b"]
    np.save(tmp_path / "l.npy", Y)
    assert load_array(tmp_path / "l.npy").tolist() == Y.tolist()


def _text(tmp_path, content, encoding="utf-8"):
    path = tmp_path / "values.txt"
    path.write_text(content, encoding=encoding)
    return path


@pytest.mark.parametrize(
    ("content", "what", "expected", "kind"),
    [
        # a byte-order mark ("UTF-8 with BOM", as Excel and Notepad save) is not in the value
        ("\ufeffcat\ncat\ndog\ndog\n", "labels", ["cat", "cat", "dog", "dog"], "U"),
        ("\ufeff1\n1\n2\n2\n", "labels", [1, 1, 2, 2], "i"),
        # plain decimal integers, signed or with leading zeros, are integers
        ("007\n7\n-3\n+3\n", "labels", [7, 7, -3, 3], "i"),
        # other spellings Python's int() / float() take keep the file as text: no merging
        ("1_0\n1_0\n10\n10\n", "labels", ["1_0", "1_0", "10", "10"], "U"),
        ("1e3\n1e3\n1000\n1000\n", "labels", ["1e3", "1e3", "1000", "1000"], "U"),
        ("3\n\u0663\n", "labels", ["3", "\u0663"], "U"),
        ("1\nnan\n", "groups", ["1", "nan"], "U"),
        # decimals stay numbers (whole ones are class ids; fractional ones are refused later)
        ("1.0\n2\n", "labels", [1.0, 2.0], "f"),
        # confidences are measurements: exponents and NaN are numbers there
        ("1e-3\n0.5\nnan\n", "confidences", [0.001, 0.5, float("nan")], "f"),
        # integers past int64 are kept exactly, never through float64
        (
            "18446744073709551616\n18446744073709551617\n-1\n",
            "labels",
            [2**64, 2**64 + 1, -1],
            "O",
        ),
    ],
)
def test_text_value_files_read_each_spelling_as_documented(tmp_path, content, what, expected, kind):
    arr = load_array(_text(tmp_path, content), what=what)
    assert arr.dtype.kind == kind
    np.testing.assert_array_equal(arr, np.array(expected, dtype=arr.dtype))
    assert [type(v) for v in arr.tolist()] == [type(v) for v in expected]


@pytest.mark.parametrize("content", ["", "\n  \n\n"])
def test_an_empty_text_value_file_is_refused_by_name(tmp_path, content):
    path = _text(tmp_path, content)
    with pytest.raises(ee.FileFormatError) as err:
        load_array(path)
    assert str(err.value).startswith(f"{path} is empty; a labels file holds one value per line")


def test_a_blank_line_inside_a_text_value_file_is_refused_with_its_line(tmp_path):
    # skipped, it shifted every later value onto the previous row; blank lines at the end stay
    # harmless, and other errors give the file's own line numbers
    assert load_array(_text(tmp_path, "a\nb\n\n  \n")).tolist() == ["a", "b"]
    for content, line in (("a\n\nb\n", 2), ("\na\n", 1), ("a\nb\n \nc\n", 3)):
        with pytest.raises(ee.FileFormatError, match=rf"values.txt line {line} is empty"):
            load_array(_text(tmp_path, content))
    with pytest.raises(ee.FileFormatError, match=r"values.txt line 3 has several columns"):
        load_array(_text(tmp_path, "a\nb\nc,d\n"))


def test_bad_files(tmp_path):
    with pytest.raises(ee.FileFormatError, match="no such file"):
        load_embeddings(tmp_path / "missing.npy")
    (tmp_path / "x.csv").write_text("1,2\n")
    with pytest.raises(ee.FileFormatError, match="unknown file type '.csv'"):
        load_embeddings(tmp_path / "x.csv")
    np.savez(tmp_path / "k.npz", vectors=X)
    with pytest.raises(ee.FileFormatError, match="no 'embeddings' array .*vectors"):
        load_embeddings(tmp_path / "k.npz")
    np.save(tmp_path / "p.npy", np.array([{"a": 1}] * 3, dtype=object), allow_pickle=True)
    with pytest.raises(ee.FileFormatError, match="never unpickles"):
        load_embeddings(tmp_path / "p.npy")
    bad = X.copy()
    bad[[2, 4], 1] = np.nan
    np.savez(tmp_path / "nan.npz", embeddings=bad, labels=Y)
    with pytest.raises(
        ee.InputError, match=r"NaN or infinite values in 2 row\(s\), first at row 2"
    ):
        load_embeddings(tmp_path / "nan.npz")
    np.savez(tmp_path / "len.npz", embeddings=X, labels=Y[:4])
    with pytest.raises(ee.InputError, match="has 4 labels but there are 6"):
        load_embeddings(tmp_path / "len.npz")


def test_files_that_are_not_what_their_suffix_says(tmp_path):
    (tmp_path / "junk.npy").write_bytes(b"hello world")
    with pytest.raises(ee.FileFormatError, match=r"junk.npy is not a .npy file"):
        load_embeddings(tmp_path / "junk.npy")
    (tmp_path / "empty.npz").write_bytes(b"")
    with pytest.raises(ee.FileFormatError, match=r"empty.npz is not a .npz \(zip\) archive"):
        load_embeddings(tmp_path / "empty.npz")
    import pickle

    (tmp_path / "p.npy").write_bytes(pickle.dumps({"a": 1}, protocol=2))
    with pytest.raises(ee.FileFormatError, match="is a Python pickle"):
        load_embeddings(tmp_path / "p.npy")
    np.save(tmp_path / "x.npy", X)
    (tmp_path / "x.npz").write_bytes((tmp_path / "x.npy").read_bytes())
    with pytest.raises(ee.FileFormatError, match="x.npz is a .npy file named .npz"):
        load_embeddings(tmp_path / "x.npz")
    np.savez(tmp_path / "y.npz", embeddings=X, labels=Y)
    (tmp_path / "y.npy").write_bytes((tmp_path / "y.npz").read_bytes())
    with pytest.raises(ee.FileFormatError, match="y.npy is a .npz file named .npy"):
        load_embeddings(tmp_path / "y.npy")
    with pytest.raises(ee.FileFormatError, match="y.npy is a .npz file named .npy"):
        load_array(tmp_path / "y.npy")


def test_side_file_npz_with_several_arrays_names_the_key_to_use(tmp_path):
    np.savez(tmp_path / "two.npz", a=Y, b=Y)
    with pytest.raises(ee.FileFormatError, match=r"none named 'groups'; name it 'groups'"):
        load_array(tmp_path / "two.npz", what="groups")
    np.savez(tmp_path / "named.npz", other=Y[::-1], groups=Y)
    assert load_array(tmp_path / "named.npz", what="groups").tolist() == Y.tolist()


def test_retrieval_npz_ids_stored_as_bytes_are_decoded(tmp_path):
    from embedeval.io import load_retrieval_embeddings

    x = np.eye(3, dtype=np.float32)
    # an "S" array (ids encoded before saving): str() would give "b'd0'", matching no qrels id
    np.savez(tmp_path / "b.npz", embeddings=x, ids=np.array([v.encode() for v in ["d0", "é", "7"]]))
    assert load_retrieval_embeddings(tmp_path / "b.npz")[1] == ["d0", "é", "7"]
    np.savez(tmp_path / "n.npz", embeddings=x, ids=np.array([7, 8, 9]))
    assert load_retrieval_embeddings(tmp_path / "n.npz")[1] == ["7", "8", "9"]
    np.savez(tmp_path / "bad.npz", embeddings=x, ids=np.array([b"a", b"\xff", b"c"]))
    with pytest.raises(ee.utils.errors.FileFormatError, match="bad.npz: its ids array holds bytes"):
        load_retrieval_embeddings(tmp_path / "bad.npz")


def test_an_ids_file_with_a_byte_order_mark(tmp_path):
    from embedeval.io import read_ids

    path = tmp_path / "ids.txt"
    path.write_bytes(b"\xef\xbb\xbfq1\r\nq2\r\n")
    assert read_ids(path) == ["q1", "q2"]


def test_text_files_split_rows_at_line_ends_only(tmp_path):
    from embedeval.io import read_ids

    # U+2028, NEL and a form feed inside a value are characters of it, not line ends: the
    # file has three rows, as a file read line by line (or csv) sees it.
    path = tmp_path / "rows.txt"
    path.write_bytes("a\u2028b\r\nc\x85d\re\x0cf\n".encode())
    assert load_array(path).tolist() == ["a\u2028b", "c\x85d", "e\x0cf"]
    assert read_ids(path) == ["a\u2028b", "c\x85d", "e\x0cf"]


@pytest.mark.skipif(not os.path.exists(os.devnull) or os.name != "posix", reason="POSIX")
def test_an_input_that_is_not_a_regular_file_is_refused_by_name(tmp_path):
    from embedeval.io import read_ids

    # A device (as a pipe: /dev/fd/63 from `--labels <(cut ...)`) would be read in part by
    # the format check, then found empty, or block on a second read.
    for name, read in (("l.txt", load_array), ("e.npy", load_embeddings), ("i.txt", read_ids)):
        path = tmp_path / name
        path.symlink_to(os.devnull)
        with pytest.raises(ee.FileFormatError) as err:
            read(path)
        assert str(err.value).startswith(f"{path} is not a regular file (a pipe")


def test_an_npz_holding_two_arrays_of_one_name_is_refused(tmp_path):
    import warnings
    import zipfile

    np.save(tmp_path / "a.npy", Y)
    np.save(tmp_path / "b.npy", Y[::-1])
    for second in ("labels.npy", "labels"):  # np.load reads 'labels' as either member
        path = tmp_path / "two.npz"
        with warnings.catch_warnings(), zipfile.ZipFile(path, "w") as zf:
            warnings.simplefilter("ignore")  # zipfile warns of the duplicate name
            np.save(tmp_path / "x.npy", X)
            zf.write(tmp_path / "x.npy", "embeddings.npy")
            zf.write(tmp_path / "a.npy", "labels.npy")
            zf.write(tmp_path / "b.npy", second)
        with pytest.raises(ee.FileFormatError, match="holds 2 arrays named 'labels'"):
            load_embeddings(path)
        with pytest.raises(ee.FileFormatError, match="holds 2 arrays named 'labels'"):
            load_array(path)


@pytest.mark.filterwarnings("ignore:Stored array in format 3.0")
def test_npy_format_version_3_gets_the_same_checks(tmp_path):
    # np.save writes format 3.0 for field names outside Latin-1
    path = tmp_path / "obj.npy"
    np.save(path, np.zeros(3, dtype=[("\u20ac", "O")]), allow_pickle=True)
    assert path.read_bytes()[6:8] == b"\x03\x00"
    with pytest.raises(ee.FileFormatError, match="holds pickled Python objects"):
        load_array(path)
    cut = tmp_path / "cut.npy"
    np.save(cut, np.zeros(50, dtype=[("\u20ac", "f8")]))
    cut.write_bytes(cut.read_bytes()[:-8])
    with pytest.raises(ee.FileFormatError, match=r"header says shape \(50,\).* holds 392"):
        load_array(cut)
