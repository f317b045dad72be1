"""Atomic output: write to a temporary file beside the target, then rename over it.

A failed or interrupted run therefore never leaves a half-written file, and never clobbers an
existing output (the rename only happens after the write succeeded). A replaced file keeps its
permission bits, and a file the user may not write is refused, as a plain write would be.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import InputError

__all__ = [
    "DISTRIBUTION",
    "atomic_path",
    "escape_surrogates",
    "install_hint",
    "not_a_file",
    "read_lines",
    "run_stamp",
    "write_text",
]

#: The name on PyPI (the import name and the command stay ``embedeval``).
DISTRIBUTION = "embedeval-exact"


def install_hint(extra: str) -> str:
    """How to install an optional extra, released or from a clone.

    >>> print(install_hint("dask"))
    pip install "embedeval-exact[dask]" (from a clone of the repository: pip install ".[dask]")
    """
    return (
        f'pip install "{DISTRIBUTION}[{extra}]" (from a clone of the repository: '
        f'pip install ".[{extra}]")'
    )


def _umask() -> int:
    """The process's umask, read without changing it where Linux reports it: setting it to 0
    and back would, for that instant, give files other threads create mode 0666."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _mode_for(target: Path) -> int:
    """The permission bits the written file gets: those of the file it replaces, else 0666
    less the umask; a file this user may not write is refused (the rename alone would not
    stop it, as it needs only the folder to be writable)."""
    if not target.is_file():
        return 0o666 & ~_umask()
    if not os.access(target, os.W_OK):
        raise InputError(
            f"{target} is read-only; make it writable (chmod u+w) or choose another path."
        )
    return stat.S_IMODE(target.stat().st_mode)


#: The longest file name most file systems take, in bytes, and the random part of a
#: ``mkstemp`` name.
_NAME_MAX, _RANDOM = 255, 8


def _temp_affixes(name: str) -> tuple[str, str]:
    """The prefix and suffix of the temporary file beside ``name``: ``.<name>.`` and its
    suffix, the name cut so that the temporary name is no longer than the longest file name
    (a name that fits the file system would otherwise fail to write after all the work).

    >>> _temp_affixes("out.json")
    ('.out.json.', '.json')
    >>> prefix, suffix = _temp_affixes("a" * 250 + ".json")
    >>> len(prefix) + _RANDOM + len(suffix)
    255
    """
    suffix = Path(name).suffix or ".tmp"
    if len(suffix.encode()) > _NAME_MAX // 2:
        suffix = ".tmp"
    room = _NAME_MAX - _RANDOM - len(suffix.encode()) - 2
    short = name.encode()[:room].decode(errors="ignore")  # whole characters only
    return f".{short}.", suffix


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces ``path``, keeping the mode of the
    file it replaces (a new file gets 0666 less the umask)."""
    target = Path(path)
    mode = _mode_for(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    prefix, suffix = _temp_affixes(target.name)
    tmp_path = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=target.parent)
        os.close(fd)
        tmp_path = Path(tmp)
        yield tmp_path
        os.chmod(tmp_path, mode)
        os.replace(tmp_path, target)
    except BaseException as exc:
        if tmp_path is not None:
            tmp_path.unlink(missing_ok=True)
        _name_the_output(exc, target.parent, prefix, path)
        raise


def _name_the_output(
    exc: BaseException, folder: Path, prefix: str, path: str | os.PathLike
) -> None:
    """Point an ``OSError`` about the temporary file (``prefix...`` in ``folder``) at the
    output ``path`` asked for: a failed write (disk full, a folder that takes no new file)
    must name a path its reader knows, and the temporary one is gone by then."""
    named = getattr(exc, "filename", None) if isinstance(exc, OSError) else None
    if not isinstance(named, str | bytes | os.PathLike):
        return
    failed = Path(os.fsdecode(named))
    if failed.parent == folder and failed.name.startswith(prefix):
        exc.filename = os.fspath(path)


def escape_surrogates(text: str) -> str:
    r"""``text`` with each lone surrogate written as its escape: how Python reads a file name
    that is not UTF-8 (``os.fsdecode``), which no UTF-8 file and no font can hold.

    >>> print(escape_surrogates(os.fsdecode(b"caf\xe9")))
    caf\udce9
    """
    return text.encode("utf-8", errors="backslashreplace").decode("utf-8")


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically, as UTF-8.

    UTF-8 whatever the locale: labels and ids are often not ASCII, and the locale's encoding
    (ASCII under ``LC_ALL=C``, cp1252 on Windows) would fail on them after all the work, or
    write a file that the readers, which read UTF-8, misread.  A lone surrogate (how Python
    reads a file name that is not UTF-8) has no UTF-8 form: it is written as its escape
    (``\\udce9``) rather than failing the write.
    """
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8", errors="backslashreplace")
    return Path(path)


def not_a_file(path: str | os.PathLike) -> str:
    """Why an input that is a pipe, a device or a socket is refused: an input is read more
    than once (its first bytes tell its format, then its values; the command line also
    records its SHA-256), and a pipe gives its bytes to the first read only, or blocks on
    the next one."""
    return (
        f"{path} is not a regular file (a pipe, a device or a socket); inputs are read more "
        "than once, so write it to a file first and pass that file."
    )


def read_lines(path: str | os.PathLike) -> list[str]:
    """The lines of a UTF-8 text file (a byte-order mark dropped), split at line ends only.

    A line ends at ``\\n``, ``\\r\\n`` or ``\\r``, as files and ``csv`` read them;
    ``str.splitlines`` also splits at form feeds, ``\\x1c``-``\\x1e``, NEL and U+2028 / U+2029,
    which a label, an id or a passage may hold, and would shift every later row.  Raises
    ``UnicodeDecodeError`` for a file that is not UTF-8.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "rows.txt")
    >>> _ = open(p, "w", encoding="utf-8").write("one\\u2028line\\r\\ntwo\\n")
    >>> read_lines(p)
    ['one\\u2028line', 'two']
    """
    text = Path(path).read_text(encoding="utf-8-sig")  # universal newlines: CRLF, CR -> LF
    lines = text.split("\n")
    if lines[-1] == "":  # the end of the last line, not an empty line after it
        lines.pop()
    return lines


def run_stamp() -> dict[str, Any]:
    """When and with which version a result was computed (the CLI adds the input files)."""
    from datetime import datetime, timezone

    from .version import __version__

    return {
        "embedeval_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
