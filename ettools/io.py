"""File helpers shared by every reader and writer: gzip-or-plain input, JSON, atomic output.

This module reads files and parses or writes JSON; the helpers beside it are re-exported here,
so ``ettools.io`` stays the one name to import them by: the pre-parse shape scan
(:mod:`ettools.json_scan`), output places and names (:mod:`ettools.output_paths`), whole-or-nothing
writes (:mod:`ettools.output_files`), signals (:mod:`ettools.signals`) and message text
(:mod:`ettools.messages`).

The shape scan (numpy) and the whole-or-nothing writers (``tempfile``, ``shutil``) are re-exported
through a module ``__getattr__`` (PEP 562): imported on first use, so that a command that neither
pre-scans nor writes files (``ettools info --help``, the command line itself) does not load them
(issue 27, item 4).
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from ettools.errors import TraceError
from ettools.messages import clean_message, short  # noqa: F401  (re-exported)
from ettools.output_paths import (  # noqa: F401  (re-exported)
    OutputError,
    _os_problem,
    check_name,
    check_output_dir,
    check_output_file,
)
from ettools.signals import Terminated, handle_sigterm  # noqa: F401  (re-exported)

if TYPE_CHECKING:  # re-exported on first use by __getattr__ below
    from ettools.json_scan import (  # noqa: F401
        MEMORY_BOUND,
        JsonShape,
        check_items_are_objects,
        check_json_shape,
        first_non_object,
        scan_shape,
    )
    from ettools.output_files import OutputSet, _GuardedFile, atomic_write  # noqa: F401

GZIP_MAGIC = b"\x1f\x8b"
_JSON_SCAN = ("MEMORY_BOUND", "JsonShape", "check_items_are_objects", "check_json_shape", "first_non_object",
              "scan_shape")
_OUTPUT_FILES = ("OutputSet", "_GuardedFile", "atomic_write")


def __getattr__(name: str) -> Any:
    """The re-exported names of :mod:`ettools.json_scan` and :mod:`ettools.output_files`, each
    module imported when one of its names is first asked for (PEP 562; see the module docstring)."""
    if name in _JSON_SCAN:
        from ettools import json_scan as mod
    elif name in _OUTPUT_FILES:
        from ettools import output_files as mod
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(mod, name)
    return value


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


def load_json(path: str | os.PathLike, data: bytes | None = None, items_of: str | None = None) -> Any:
    """Parse ``path`` (plain or gzip) as JSON with orjson; errors name the file and position.

    ``items_of``: the top-level key whose array must hold objects (a format's event/node list),
    checked on the raw bytes before the parse (:func:`check_items_are_objects`). Text read here is
    checked for nesting too dense to parse within the memory bound (:func:`check_json_shape`)."""
    from ettools.json_scan import check_items_are_objects, check_json_shape

    raw = read_bytes(path) if data is None else data
    if items_of is not None:
        check_items_are_objects(path, raw, items_of)
    elif data is None:  # given ``data`` was checked by the caller
        check_json_shape(path, raw)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise TraceError(path, f"not valid JSON: {e}") from None


def json_bytes(obj: Any, path: str | os.PathLike, option: int = 0) -> bytes:
    """``orjson.dumps(obj)``; a value it cannot write (nested over its 255 levels, an integer beyond
    64 bits: both readable from a trace) is an :class:`OutputError` naming ``path``, not a crash."""
    try:
        return orjson.dumps(obj, option=option)
    except TypeError as e:  # orjson.JSONEncodeError
        why = "a value in the trace is nested too deep" if "ecursion" in str(e) else clean_message(str(e), 120)
        raise OutputError(path, f"cannot write JSON: {why}") from None


def expect(cond: bool, path: str | os.PathLike, problem: str) -> None:
    """Raise :class:`TraceError` for ``path`` unless ``cond``."""
    if not cond:
        raise TraceError(path, problem)


def write_json(path: str | os.PathLike, obj: Any, indent: bool = False) -> None:
    """Atomically write ``obj`` as JSON (sorted keys, so output bytes are deterministic)."""
    opts = orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY
    if indent:
        opts |= orjson.OPT_INDENT_2
    from ettools.output_files import atomic_write

    data = json_bytes(obj, path, opts)
    with atomic_write(path) as f:
        f.write(data)
