"""Where outputs go, checked before anything is written: plain output names, an output file or
folder whose place cannot be written (a directory, FIFO or device in the way, a parent that is a
file), and OS errors told as one-line :class:`OutputError` messages."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ettools.errors import TraceError
from ettools.messages import short


class OutputError(TraceError):
    """An output that cannot be written (bad place, no space, read-only, refused replacement)."""


_NAME_MAX = 255  # bytes per path component on every common file system


def check_name(name: str, option: str = "--name") -> str:
    """``name`` when it is a plain file-name stem (no folder part, not hidden, not too long); else ValueError.

    Output files are ``<name>.<rank>.<ext>`` inside the output folder: a ``/``, ``..`` or an absolute
    name would write outside it, and a leading ``.`` would hide the files (staging uses that prefix).
    """
    bad = None
    if not name:
        bad = "is empty"
    elif "/" in name or "\\" in name or "\0" in name:
        bad = "must be a plain file name (no '/', '\\' or NUL): it names files inside -o"
    elif name.startswith("."):
        bad = "must not start with '.' (no hidden, '.' or '..' names)"
    elif any(ord(c) < 32 or ord(c) == 127 for c in name):
        bad = "must not contain control characters"
    elif len(name.encode("utf-8", "surrogateescape")) > _NAME_MAX - 40:
        bad = f"is {len(name)} characters: at most {_NAME_MAX - 40} bytes leave room for '.<rank>.<ext>'"
    if bad:
        raise ValueError(f"{option} {short(name, 60)} {bad}")
    return name


def _kind(st: os.stat_result) -> str:
    m = st.st_mode
    for test, word in ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(m):
            return word
    return "not a regular file"


def _os_problem(e: OSError) -> str:
    names = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
             errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
             errno.EPERM: "operation not permitted (immutable or protected)",
             errno.ENAMETOOLONG: "file name too long", errno.ENOTDIR: "a path component is a file, not a folder",
             errno.EEXIST: "exists and is not a folder", errno.EISDIR: "is a directory",
             errno.EXDEV: "crosses file systems"}
    return names.get(e.errno, e.strerror or type(e).__name__)


def check_output_file(path: str | os.PathLike, check_parent: bool = True) -> Path:
    """Refuse early an output file path that cannot be written: an existing non-regular file
    (directory, FIFO, device, symlink) or (unless ``check_parent`` is false: the caller checked
    it) a parent that is a file; returns ``path``."""
    path = path if isinstance(path, Path) else Path(path)
    try:
        st = path.lstat()
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise OutputError(path, f"cannot write: {_os_problem(e)}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputError(path, f"cannot write: {_kind(st)} is there (only a regular file is replaced)")
    if len(path.name.encode("utf-8", "surrogateescape")) > _NAME_MAX:
        raise OutputError(path, "cannot write: file name too long")
    if check_parent:
        _check_parent(path.parent, path)
    return path


def check_output_dir(path: str | os.PathLike) -> Path:
    """Refuse early an output folder that is an existing file (or lies under one); returns ``path``."""
    path = Path(path)
    _check_parent(path, path)
    return path


def _check_parent(folder: Path, shown: Path) -> None:
    p = folder
    while True:  # the nearest existing ancestor must be a folder
        try:
            st = p.stat()
        except FileNotFoundError:
            if p.parent == p:
                return
            p = p.parent
            continue
        except OSError as e:
            raise OutputError(shown, f"cannot write: {_os_problem(e)}") from None
        if not stat.S_ISDIR(st.st_mode):
            what = "a file" if stat.S_ISREG(st.st_mode) else _kind(st)
            if p == shown:
                raise OutputError(shown, f"cannot write: {what} is there, expected a folder")
            raise OutputError(shown, f"cannot write: {p} is {what}, not a folder")
        return


def _mkdir(folder: Path, shown: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _check_parent(folder, shown)
        raise OutputError(shown, f"cannot create folder {folder}: {_os_problem(e)}") from None
