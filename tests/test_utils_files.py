"""Atomic output files: permission bits kept, read-only files refused, nothing half written."""

from __future__ import annotations

import os

import numpy as np
import pytest

import embedeval as ee
from embedeval.utils import files


def test_a_new_output_gets_0666_less_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        files.write_text(tmp_path / "new.json", "{}")
    finally:
        os.umask(old)
    assert (tmp_path / "new.json").stat().st_mode & 0o777 == 0o640


def test_a_replaced_output_keeps_its_mode(tmp_path):
    out = tmp_path / "out.json"
    out.write_text("old")
    out.chmod(0o604)
    files.write_text(out, "new")
    assert out.read_text() == "new"
    assert out.stat().st_mode & 0o777 == 0o604


def _read_only(tmp_path, monkeypatch):
    out = tmp_path / "out.json"
    out.write_text("keep me")
    out.chmod(0o444)
    if os.geteuid() == 0:  # root may write any file: make the check see what a user would
        real = os.access
        monkeypatch.setattr(
            files.os, "access", lambda p, m: False if os.fspath(p) == str(out) else real(p, m)
        )
    return out


def test_a_read_only_output_is_refused_and_kept(tmp_path, monkeypatch):
    out = _read_only(tmp_path, monkeypatch)
    with pytest.raises(ee.InputError, match="read-only"):
        files.write_text(out, "new")
    assert out.read_text() == "keep me"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temporary file left


def test_the_cli_refuses_a_read_only_output_before_any_work(tmp_path, monkeypatch, capsys):
    from embedeval.cli import main

    out = _read_only(tmp_path, monkeypatch)
    np.savez(tmp_path / "c.npz", embeddings=np.eye(4), labels=[0, 0, 1, 1])
    code = main(["evaluate", str(tmp_path / "c.npz"), "--json", str(out)])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--json" in err[0] and "read-only" in err[0]
    assert out.read_text() == "keep me"


def test_a_full_disk_is_reported_under_the_output_name_not_the_temporary_one(
    tmp_path, monkeypatch, capsys
):
    import errno
    from pathlib import Path

    from embedeval.cli import main

    def no_space(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))

    np.savez(tmp_path / "c.npz", embeddings=np.eye(4), labels=[0, 0, 1, 1])
    out = tmp_path / "out" / "classes.csv"
    monkeypatch.setattr(Path, "write_text", no_space)
    code = main(["evaluate", str(tmp_path / "c.npz"), "--per-class", str(out)])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"embedeval: error: {out}: No space left")
    assert list((tmp_path / "out").iterdir()) == []  # no temporary file left


def test_text_outputs_are_utf8_whatever_the_locale(tmp_path):
    # Labels and ids are often not ASCII (a cat class '猫', a doc id 'é'); in a locale whose
    # encoding cannot hold them (LC_ALL=C without UTF-8 mode here, cp1252 on Windows) the
    # per-class table, the run file and the Markdown must still be written, as UTF-8, like
    # every input file is read.
    import subprocess
    import sys

    out = tmp_path / "labels.csv"
    text = "label,n\n猫,3\né|x,2\n"
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0"}
    env["PYTHONCOERCECLOCALE"] = "0"
    code = f"from embedeval.utils.files import write_text; write_text({str(out)!r}, {text!a})"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == text.encode("utf-8")


def test_text_outputs_write_names_undecodable_as_utf8_escaped(tmp_path):
    # A file name that is not UTF-8 reaches Python with lone surrogates (os.fsdecode); as a
    # checkpoint name or label it failed the UTF-8 encoding after all the work.
    out = tmp_path / "cmp.md"
    files.write_text(out, "| " + os.fsdecode(b"caf\xe9") + " |\n")
    assert out.read_bytes() == b"| caf\\udce9 |\n"


def test_result_json_is_read_as_utf8_whatever_the_locale(tmp_path):
    # the JSON of a result holding a label like '猫' (written by hand or by another tool with
    # the characters as they are) loads in a locale whose encoding cannot decode them
    import subprocess
    import sys

    import numpy as np

    import embedeval as ee

    res = ee.evaluate(np.float32([[0], [1], [5], [6]]), ["猫", "猫", "é", "é"], metrics=["map"])
    path = tmp_path / "res.json"
    path.write_bytes(res.to_json().replace("\\u732b", "猫").encode("utf-8"))
    assert "猫".encode() in path.read_bytes()
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0"}
    env["PYTHONCOERCECLOCALE"] = "0"
    code = (
        "import pathlib, embedeval as ee; "
        f"r = ee.EvaluationResult.from_json(pathlib.Path({str(path)!r})); print(r['map'])"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout) == 1.0


@pytest.mark.parametrize("stem", ["a" * 250, "é" * 125])
def test_an_output_whose_name_is_as_long_as_allowed_is_written(tmp_path, stem):
    out = tmp_path / f"{stem}.json"  # 255 bytes: the longest name the file system takes
    assert len(out.name.encode()) == 255
    files.write_text(out, "{}")
    assert out.read_text() == "{}"
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary file left
