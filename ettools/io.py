"""File helpers shared by every reader and writer: gzip-or-plain input, JSON, atomic output."""

from __future__ import annotations

import contextlib
import gzip
import os
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from ettools.errors import TraceError

GZIP_MAGIC = b"\x1f\x8b"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates files 0600; outputs get the usual mode instead.
_FILE_MODE = 0o666 & ~_umask()


def read_bytes(path: str | os.PathLike) -> bytes:
    """Whole content of ``path``, gunzipped when it is gzip (detected from content, not name)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise TraceError(p, "no such file") from None
    except IsADirectoryError:
        raise TraceError(p, "is a directory, expected a file") from None
    except OSError as e:
        raise TraceError(p, f"cannot read: {e.strerror}") from None
    if raw[:2] == GZIP_MAGIC:
        try:
            return gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as e:
            raise TraceError(p, f"truncated or corrupt gzip data ({e})") from None
    return raw


def load_json(path: str | os.PathLike, data: bytes | None = None) -> Any:
    """Parse ``path`` (plain or gzip) as JSON with orjson; errors name the file and position."""
    raw = read_bytes(path) if data is None else data
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise TraceError(path, f"not valid JSON: {e}") from None


def expect(cond: bool, path: str | os.PathLike, problem: str) -> None:
    """Raise :class:`TraceError` for ``path`` unless ``cond``."""
    if not cond:
        raise TraceError(path, problem)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", compress: bool | None = None) -> Iterator[IO[Any]]:
    """Write ``path`` through a temporary file in the same folder, renamed into place on success.

    Nothing is left behind when the block raises. ``compress`` (default: name ends in ``.gz``)
    gzips the stream with a fixed mtime so output bytes are deterministic.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if compress is None:
        compress = path.suffix == ".gz"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, _FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as raw:
            if compress:
                with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz:
                    yield gz if "b" in mode else _text(gz)
            else:
                yield raw if "b" in mode else _text(raw)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _text(binary: IO[bytes]) -> IO[str]:
    import io

    return io.TextIOWrapper(binary, encoding="utf-8", write_through=True)


class OutputSet:
    """Several output files committed together: all appear, or none (on error none are left).

    Use it as a context manager: files opened with :meth:`open` (themselves context managers) are
    written to temporaries, renamed into place when the block ends without error, removed when
    it raises; :attr:`paths` then lists the files written.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[str, Path]] = []
        self.paths: list[Path] = []  # the final paths, once committed

    def open(self, path: str | os.PathLike, compress: bool | None = None) -> IO[bytes]:
        """A binary file object for ``path``; the caller closes it."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.fchmod(fd, _FILE_MODE)
        self._pending.append((tmp, path))
        f = os.fdopen(fd, "wb")
        if compress is None:
            compress = path.suffix == ".gz"
        if compress:
            return _ClosingGzip(f)
        return f

    def write_file(self, path: str | os.PathLike, data: bytes) -> None:
        """Stage a whole file's bytes."""
        with self.open(path, compress=False) as f:
            f.write(data)

    def commit(self) -> list[Path]:
        """Rename every temporary into place; returns the final paths (also in :attr:`paths`)."""
        for tmp, final in self._pending:
            os.replace(tmp, final)
            self.paths.append(final)
        self._pending.clear()
        return list(self.paths)

    def abort(self) -> None:
        """Remove every temporary."""
        for tmp, _ in self._pending:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self._pending.clear()

    def __enter__(self) -> OutputSet:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


class _ClosingGzip(gzip.GzipFile):
    """A deterministic GzipFile that also closes the file beneath it."""

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6)
        self._raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


def write_json(path: str | os.PathLike, obj: Any, indent: bool = False) -> None:
    """Atomically write ``obj`` as JSON (sorted keys, so output bytes are deterministic)."""
    opts = orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY
    if indent:
        opts |= orjson.OPT_INDENT_2
    with atomic_write(path) as f:
        f.write(orjson.dumps(obj, option=opts))
