"""Writing outputs whole or not at all: one file through a temporary renamed into place
(:func:`atomic_write`), several committed together (:class:`OutputSet`), staging folders a killed
run left behind swept away; gzip output with a fixed mtime, so bytes are deterministic."""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from ettools.output_paths import (
    _NAME_MAX,
    OutputError,
    _mkdir,
    _os_problem,
    check_output_dir,
    check_output_file,
)
from ettools.signals import _signals_deferred


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates files 0600; outputs get the usual mode instead.
_FILE_MODE = 0o666 & ~_umask()


_STAGE_PREFIX = ".ettools-stage-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _sweep_dead_stages(folder: Path) -> None:
    """Remove staging folders a killed run (SIGKILL, power loss) left behind in ``folder``."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if entry.name.startswith(_STAGE_PREFIX) and entry.is_dir(follow_symlinks=False):
                pid = entry.name[len(_STAGE_PREFIX):].split("-", 1)[0]
                if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
                    shutil.rmtree(entry.path, ignore_errors=True)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", compress: bool | None = None) -> Iterator[IO[Any]]:
    """Write ``path`` through a temporary file in the same folder, renamed into place on success.

    Nothing is left behind when the block raises (or on SIGINT/SIGTERM). ``compress`` (default:
    name ends in ``.gz``) gzips the stream with a fixed mtime so output bytes are deterministic.
    Only a regular file is replaced; problems with the place raise :class:`OutputError`.
    """
    path = Path(path)
    check_output_file(path)
    _mkdir(path.parent, path)
    if compress is None:
        compress = path.suffix == ".gz"
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:200]}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise OutputError(path, f"cannot write: {_os_problem(e)}") from None
    try:
        os.fchmod(fd, _FILE_MODE)
        try:
            with os.fdopen(fd, "wb") as raw:
                if compress:
                    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz:
                        yield gz if "b" in mode else _text(gz)
                else:
                    yield raw if "b" in mode else _text(raw)
            with _signals_deferred():
                check_output_file(path)
                os.replace(tmp, path)
        except OSError as e:
            if isinstance(e, OutputError):
                raise
            raise OutputError(path, f"cannot write: {_os_problem(e)}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _text(binary: IO[bytes]) -> IO[str]:
    import io

    return io.TextIOWrapper(binary, encoding="utf-8", write_through=True)


_RANK_FILE = re.compile(r"^(?P<stem>.+)\.(?P<rank>\d+)\.(?P<ext>[A-Za-z][\w.]*)$")


class OutputSet:
    """Several output files committed together: all appear, or none (on error none are left).

    Use it as a context manager: files opened with :meth:`open` (themselves context managers) are
    written into a hidden staging folder inside their output folder, moved into place when the
    block ends without error, and the staging folder is removed either way. The commit is all or
    nothing: a failing move rolls back the ones done (replaced files come back), and SIGINT/SIGTERM
    wait until the commit or roll-back is whole. Only regular files are replaced.

    ``clear_stale`` (default): rank files of the same pattern (``<name>.<N>.<ext>``) already in the
    folder that this set does not write — another run's ranks — are removed in the same commit, so
    a folder never mixes two runs. Pass ``False`` for a deliberately partial write (some ranks).
    :attr:`paths` lists the files written, once committed; :attr:`removed` the stale files cleared.
    """

    def __init__(self, clear_stale: bool = True) -> None:
        self._pending: dict[Path, str] = {}  # final -> staged temporary
        self._stages: dict[Path, Path] = {}  # output folder -> its staging folder
        self.clear_stale = clear_stale
        self.paths: list[Path] = []  # the final paths, once committed
        self.removed: list[Path] = []  # stale rank files cleared by the commit

    def _stage(self, path: Path) -> Path:
        folder = path.parent
        stage = self._stages.get(folder)
        if stage is None:
            check_output_dir(folder)
            _mkdir(folder, folder)
            _sweep_dead_stages(folder)
            try:
                stage = Path(tempfile.mkdtemp(prefix=f"{_STAGE_PREFIX}{os.getpid()}-", dir=folder))
            except OSError as e:
                raise OutputError(folder, f"cannot write: {_os_problem(e)}") from None
            self._stages[folder] = stage
        return stage

    def open(self, path: str | os.PathLike, compress: bool | None = None) -> IO[bytes]:
        """A binary file object for ``path``; the caller closes it."""
        path = path if isinstance(path, Path) else Path(path)  # thousands of rank files: no re-parse
        if len(path.name.encode("utf-8", "surrogateescape")) > _NAME_MAX:
            raise OutputError(path, "cannot write: file name too long")
        stage = self._stage(path)
        tmp = f"{stage}{os.sep}{len(self._pending)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
        except OSError as e:
            raise OutputError(path, f"cannot write: {_os_problem(e)}") from None
        os.fchmod(fd, _FILE_MODE)
        self._pending[path] = tmp
        f = _GuardedFile(os.fdopen(fd, "wb"), path)
        if compress is None:
            compress = path.suffix == ".gz"
        if compress:
            return _ClosingGzip(f)
        return f

    def write_file(self, path: str | os.PathLike, data: bytes) -> None:
        """Stage a whole file's bytes."""
        with self.open(path, compress=False) as f:
            f.write(data)

    def _stale(self) -> list[Path]:
        if not self.clear_stale:
            return []
        patterns: dict[Path, set[tuple[str, str]]] = {}
        for final in self._pending:
            m = _RANK_FILE.match(final.name)
            if m:
                patterns.setdefault(final.parent, set()).add((m["stem"], m["ext"]))
        out = []
        for folder, pats in patterns.items():
            with contextlib.suppress(OSError):
                for entry in os.scandir(folder):
                    m = _RANK_FILE.match(entry.name)
                    p = folder / entry.name
                    if m and (m["stem"], m["ext"]) in pats and p not in self._pending \
                            and entry.is_file(follow_symlinks=False):
                        out.append(p)
        return sorted(out)

    def commit(self) -> list[Path]:
        """Move every staged file into place, all or nothing; returns the final paths (also :attr:`paths`)."""
        parents: set[Path] = set()
        for final in self._pending:  # refuse before anything moves (each folder's ancestry checked once)
            parent = final.parent
            check_output_file(final, check_parent=parent not in parents)
            parents.add(parent)
        stale = self._stale()
        done: list[tuple[Path, Path | None]] = []  # (final, backup of what it replaced)
        cleared: list[tuple[Path, Path]] = []  # (stale file, where it waits in staging)
        with _signals_deferred():
            current = None
            try:
                for i, p in enumerate(stale):
                    current = p
                    hold = self._stages[p.parent] / f"stale.{i}"
                    os.rename(p, hold)
                    cleared.append((p, hold))
                for i, (final, tmp) in enumerate(self._pending.items()):
                    current = final
                    backup = None
                    if os.path.lexists(final):
                        backup = self._stages[final.parent] / f"old.{i}"
                        try:
                            os.link(final, backup, follow_symlinks=False)  # keeps final in place meanwhile
                        except OSError:
                            os.rename(final, backup)
                    done.append((final, backup))
                    os.replace(tmp, final)
            except BaseException as e:
                self._roll_back(done, cleared)
                self._cleanup()
                self._pending.clear()
                if isinstance(e, OSError) and not isinstance(e, OutputError):
                    raise OutputError(current or "output", f"cannot write: {_os_problem(e)}; "
                                      "nothing was changed") from None
                raise
            self.paths.extend(self._pending)
            self.removed.extend(p for p, _ in cleared)
            self._pending.clear()
            self._cleanup()
        return list(self.paths)

    @staticmethod
    def _roll_back(done: list[tuple[Path, Path | None]], cleared: list[tuple[Path, Path]]) -> None:
        for final, backup in reversed(done):
            with contextlib.suppress(OSError):
                if backup is not None:
                    os.replace(backup, final)
                elif os.path.lexists(final):
                    os.unlink(final)
        for p, hold in reversed(cleared):
            with contextlib.suppress(OSError):
                os.rename(hold, p)

    def _cleanup(self) -> None:
        for stage in self._stages.values():
            shutil.rmtree(stage, ignore_errors=True)
        self._stages.clear()

    def abort(self) -> None:
        """Remove every staged file (and the staging folders)."""
        with _signals_deferred():
            self._pending.clear()
            self._cleanup()

    def __enter__(self) -> OutputSet:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            try:
                self.commit()
            except BaseException:
                self.abort()  # a refused commit (a FIFO in the way) leaves no staging behind
                raise
        else:
            self.abort()


class _GuardedFile:
    """A staged file whose write errors (disk full, quota) name the output file."""

    def __init__(self, raw: IO[bytes], path: Path) -> None:
        self._raw = raw
        self._path = path

    def write(self, data: Any) -> int:
        try:
            return self._raw.write(data)
        except OSError as e:
            raise OutputError(self._path, f"cannot write: {_os_problem(e)}") from None

    def flush(self) -> None:
        try:
            self._raw.flush()
        except OSError as e:
            raise OutputError(self._path, f"cannot write: {_os_problem(e)}") from None

    def close(self) -> None:
        try:
            self._raw.close()
        except OSError as e:
            raise OutputError(self._path, f"cannot write: {_os_problem(e)}") from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    @property
    def closed(self) -> bool:
        return self._raw.closed

    def writable(self) -> bool:
        return True

    def __enter__(self) -> _GuardedFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _ClosingGzip(gzip.GzipFile):
    """A deterministic GzipFile that also closes the file beneath it."""

    def __init__(self, raw: Any) -> None:
        super().__init__(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6)
        self._raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()
