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
import threading
from collections import deque
from collections.abc import Callable, Iterator
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
_DIR_MODE = 0o777 & ~_umask()


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

    Use it as a context manager: files opened with :meth:`open` (themselves context managers),
    written with :meth:`write_file` or handed over with :meth:`submit` are written into a hidden
    staging folder, moved into place when the block ends without error, and the staging folder is
    removed either way. An output folder that does not exist yet is staged whole beside it and
    appears with one rename; files into an existing folder are staged inside it and moved one by
    one. The commit is all or nothing: a failing move rolls back the ones done (replaced files come
    back), and SIGINT/SIGTERM wait until the commit or roll-back is whole. Only regular files are
    replaced.

    ``clear_stale`` (default): rank files of the same pattern (``<name>.<N>.<ext>``) already in the
    folder that this set does not write — another run's ranks — are removed in the same commit, so
    a folder never mixes two runs. Pass ``False`` for a deliberately partial write (some ranks).
    :attr:`paths` lists the files written, once committed; :attr:`removed` the stale files cleared.
    """

    def __init__(self, clear_stale: bool = True) -> None:
        self._pending: dict[Path, str] = {}  # final -> staged temporary
        self._stages: dict[Path, Path] = {}  # output folder -> its staging folder
        self._fresh: set[Path] = set()  # output folders that did not exist: staged whole, one rename
        self._writer: _BackgroundWriter | None = None
        self._count = 0  # temporaries named so far
        self.clear_stale = clear_stale
        self.paths: list[Path] = []  # the final paths, once committed
        self.removed: list[Path] = []  # stale rank files cleared by the commit

    def _stage(self, path: Path) -> Path:
        folder = path.parent
        stage = self._stages.get(folder)
        if stage is None:
            check_output_dir(folder)
            fresh = not os.path.lexists(folder)
            home = folder.parent if fresh else folder
            _mkdir(home, folder)
            _sweep_dead_stages(home)
            try:
                stage = Path(tempfile.mkdtemp(prefix=f"{_STAGE_PREFIX}{os.getpid()}-", dir=home))
                if fresh:  # it becomes the output folder: the usual mode, not mkdtemp's 0700
                    os.chmod(stage, _DIR_MODE)
            except OSError as e:
                raise OutputError(folder, f"cannot write: {_os_problem(e)}") from None
            self._stages[folder] = stage
            if fresh:
                self._fresh.add(folder)
        return stage

    def _staged_name(self, path: Path) -> tuple[str, int]:
        """Where ``path`` is staged and the flags that create it there: its own name in a fresh
        folder's stage (the folder is moved whole; a second write of the path truncates), a new
        numbered temporary otherwise."""
        if len(path.name.encode("utf-8", "surrogateescape")) > _NAME_MAX:
            raise OutputError(path, "cannot write: file name too long")
        stage = self._stage(path)
        if path.parent in self._fresh:
            return f"{stage}{os.sep}{path.name}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        self._count += 1
        return f"{stage}{os.sep}{self._count}.tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL

    def open(self, path: str | os.PathLike, compress: bool | None = None) -> IO[bytes]:
        """A binary file object for ``path``; the caller closes it."""
        path = path if isinstance(path, Path) else Path(path)  # thousands of rank files: no re-parse
        tmp, flags = self._staged_name(path)
        f = _open_staged(tmp, flags, path)
        self._pending[path] = tmp
        if compress is None:
            compress = path.suffix == ".gz"
        if compress:
            return _ClosingGzip(f)
        return f

    def write_file(self, path: str | os.PathLike, data: bytes) -> None:
        """Stage a whole file's bytes."""
        with self.open(path, compress=False) as f:
            f.write(data)

    def submit(self, path: str | os.PathLike, data: Any, release: Callable[[Any], None] | None = None) -> None:
        """Stage a whole file's bytes (any buffer) from a background thread while the caller goes
        on; ``release(data)`` is called once they are written (a buffer pool takes the buffer back).
        The caller must not change ``data`` before that. A write error is raised by the next
        :meth:`submit` or by the commit."""
        path = path if isinstance(path, Path) else Path(path)
        tmp, flags = self._staged_name(path)
        if self._writer is None:
            self._writer = _BackgroundWriter()
        elif path in self._pending and path.parent in self._fresh:
            self._writer.drain()  # the same staged name again: the first write must be done
        self._pending[path] = tmp
        self._writer.put(tmp, flags, path, data, release)

    def _finish_writes(self, cancel: bool = False) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close(cancel)

    def _stale(self, whole: set[Path]) -> list[Path]:
        if not self.clear_stale:
            return []
        patterns: dict[Path, set[tuple[str, str]]] = {}
        for final in self._pending:
            if final.parent in whole:
                continue  # a folder this set creates holds no other run's files
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
        try:
            self._finish_writes()
        except BaseException:
            self.abort()
            raise
        whole = {f for f in self._fresh if not os.path.lexists(f)}  # still absent: moved by one rename
        for folder in whole:
            check_output_dir(folder)
        parents: set[Path] = set(whole)
        for final in self._pending:  # refuse before anything moves (each folder's ancestry checked once)
            parent = final.parent
            if parent not in whole:
                check_output_file(final, check_parent=parent not in parents)
                parents.add(parent)
        stale = self._stale(whole)
        done: list[tuple[Path, Path | None]] = []  # (final, backup of what it replaced)
        cleared: list[tuple[Path, Path]] = []  # (stale file, where it waits in staging)
        moved: list[tuple[Path, Path]] = []  # (fresh output folder, its stage)
        with _signals_deferred():
            current = None
            try:
                for i, p in enumerate(stale):
                    current = p
                    hold = self._stages[p.parent] / f".ettools-stale.{i}"
                    os.rename(p, hold)
                    cleared.append((p, hold))
                for folder in sorted(whole):
                    current = folder
                    os.rename(self._stages[folder], folder)
                    moved.append((folder, self._stages[folder]))
                for i, (final, tmp) in enumerate(self._pending.items()):
                    if final.parent in whole:
                        continue
                    current = final
                    backup = None
                    if os.path.lexists(final):
                        backup = self._stages[final.parent] / f".ettools-old.{i}"
                        try:
                            os.link(final, backup, follow_symlinks=False)  # keeps final in place meanwhile
                        except OSError:
                            os.rename(final, backup)
                    done.append((final, backup))
                    os.replace(tmp, final)
            except BaseException as e:
                self._roll_back(done, cleared, moved)
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
    def _roll_back(done: list[tuple[Path, Path | None]], cleared: list[tuple[Path, Path]],
                   moved: list[tuple[Path, Path]]) -> None:
        for final, backup in reversed(done):
            with contextlib.suppress(OSError):
                if backup is not None:
                    os.replace(backup, final)
                elif os.path.lexists(final):
                    os.unlink(final)
        for folder, stage in reversed(moved):
            with contextlib.suppress(OSError):
                os.rename(folder, stage)
        for p, hold in reversed(cleared):
            with contextlib.suppress(OSError):
                os.rename(hold, p)

    def _cleanup(self) -> None:
        for stage in self._stages.values():
            shutil.rmtree(stage, ignore_errors=True)
        self._stages.clear()
        self._fresh.clear()

    def abort(self) -> None:
        """Remove every staged file (and the staging folders)."""
        with _signals_deferred():
            with contextlib.suppress(Exception):
                self._finish_writes(cancel=True)
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


def _open_staged(tmp: str, flags: int, path: Path) -> _GuardedFile:
    try:
        fd = os.open(tmp, flags, _FILE_MODE)  # the mode is already masked: the file gets exactly it
    except OSError as e:
        raise OutputError(path, f"cannot write: {_os_problem(e)}") from None
    return _GuardedFile(os.fdopen(fd, "wb"), path)


class _BackgroundWriter:
    """Threads writing whole staged files while the caller prepares the next ones; at most
    ``limit`` bytes wait (a caller that runs ahead waits). Creating and filling a file is kernel
    work that runs outside the GIL, so two threads keep two cores busy where the disk's per-file
    cost dominates. The first error is kept and raised to the caller; later files are skipped."""

    def __init__(self, threads: int = 2, limit: int = 64 << 20) -> None:
        self._queue: deque[tuple[str, int, Path, Any, Callable[[Any], None] | None, int]] = deque()
        self._cond = threading.Condition()
        self._waiting = 0  # bytes queued or being written
        self._busy = 0  # files being written
        self._limit = limit
        self._closing = False
        self._cancel = False
        self.error: BaseException | None = None
        self._threads = [threading.Thread(target=self._run, name=f"ettools-output-writer-{i}", daemon=True)
                         for i in range(threads)]
        for t in self._threads:
            t.start()

    def put(self, tmp: str, flags: int, path: Path, data: Any, release: Callable[[Any], None] | None) -> None:
        n = memoryview(data).nbytes
        with self._cond:
            while self.error is None and self._waiting and self._waiting + n > self._limit:
                self._cond.wait()
            if self.error is not None:
                raise self.error
            self._queue.append((tmp, flags, path, data, release, n))
            self._waiting += n
            self._cond.notify_all()

    def drain(self) -> None:
        """Wait until every queued file is written (a second write of a staged name must follow
        the first); raise the first error."""
        with self._cond:
            while self.error is None and (self._queue or self._busy):
                self._cond.wait()
            if self.error is not None:
                raise self.error

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                tmp, flags, path, data, release, n = self._queue.popleft()
                skip = self._cancel or self.error is not None
                self._busy += 1
            if not skip:
                try:
                    with _open_staged(tmp, flags, path) as f:
                        f.write(data)
                except BaseException as e:  # handed to the caller's thread
                    with self._cond:
                        self.error = self.error or e
            if release is not None:
                release(data)
            with self._cond:
                self._waiting -= n
                self._busy -= 1
                self._cond.notify_all()

    def close(self, cancel: bool = False) -> None:
        """Wait for the queued files (``cancel``: skip those not started); raise the first error."""
        with self._cond:
            self._closing = True
            self._cancel = self._cancel or cancel
            self._cond.notify_all()
        for t in self._threads:
            t.join()
        if self.error is not None and not cancel:
            raise self.error


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
