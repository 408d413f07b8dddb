"""What every ``ettools`` subcommand shares: error handling (:func:`handle_errors`, one stderr line
and exit code 2), ``--quiet``, JSON output, ``NAME=N`` dimension options, NaN-proof float ranges
and the size limits options are checked against.

Below :mod:`ettools.cli` (which re-exports every name) and the subcommands that live with their
engines (:mod:`ettools.replay.search.cli`, :mod:`ettools.replay.serve.calibrate_cli`), so that
those import these helpers without importing the command group that registers them.
"""

from __future__ import annotations

import atexit
import functools
import gc
import os
import sys
from collections.abc import Callable
from typing import Any

import click
import orjson

from ettools.errors import TraceError
from ettools.io import Terminated, clean_message, handle_sigterm
from ettools.progress import set_quiet

MAX_DIM = 1 << 40  # a model dimension, batch or sequence beyond this overflows the sizes it multiplies into
MAX_WORLD = 1 << 20  # ranks of a plan (and each parallel degree): every rank is a graph or a file


def _fail(message: str, code: int = 2) -> None:
    click.echo(f"ettools: error: {clean_message(message)}", err=True)
    sys.exit(code)


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn bad-input and bad-output exceptions into one stderr line and exit code 2.

    SIGINT exits 130 and SIGTERM 143, after every temporary file is removed (writers stage their
    files and remove them while the exception unwinds).
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        handle_sigterm()
        try:
            return fn(*args, **kwargs)
        except TraceError as e:
            _fail(str(e))
        except Terminated:
            _fail("terminated", 143)
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        except RecursionError:  # a reader that recursed on input nested thousands deep
            _fail("input nested too deeply to read (thousands of levels)")
        except MemoryError:
            _fail("out of memory")
        except OSError as e:  # a file outside the readers' and writers' own checks
            where = e.filename if e.filename is not None else "ettools"
            _fail(f"{where}: {e.strerror or type(e).__name__}")

    return wrapper


class FiniteRange(click.FloatRange):
    """``click.FloatRange`` that also refuses NaN (every comparison with NaN is false, so a plain
    range lets it through to the code that sizes loops and memory with it)."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        rv = super().convert(value, param, ctx)
        if isinstance(rv, float) and rv != rv:
            self.fail(f"{value!r} is not a number", param, ctx)
        return rv


def quiet_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--quiet``: no progress bars."""

    def callback(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        if value:
            set_quiet(True)
        return value

    return click.option("--quiet", "-q", is_flag=True, expose_value=False, callback=callback,
                        help="No progress bars.")(fn)


_exit_gc_skipped = False


def skip_exit_gc() -> None:
    """At the interpreter's exit, skip the collector's passes over every object still alive: numpy's
    and click's modules and what a command leaves (~0.15 s of CPU after ``ettools info`` is done,
    issue 27). The objects are frozen (``gc.freeze``) by an exit hook, so the passes look at none
    of them; only a reference cycle left unreachable then goes unfinalized, so a command that
    writes files closes them first (``info`` writes none). A hook, not a freeze now: a command run
    in-process (the tests' ``CliRunner``) must not freeze its caller's objects before the caller
    is done; registered once per process."""
    global _exit_gc_skipped
    if not _exit_gc_skipped:
        atexit.register(gc.freeze)
        _exit_gc_skipped = True


def import_numpy_without_blas_threads() -> None:
    """Import numpy (when it is not yet) with OpenBLAS's thread pool sized to one thread, for a command
    that does no linear algebra (``ettools info``). numpy's OpenBLAS starts a thread per CPU when it is
    loaded, and each one busy-waits before it sleeps: CPU time that a command which never calls BLAS
    pays for nothing (issue 27, item 4: ~50-90 ms of CPU per run on a 2-CPU machine). OpenBLAS reads
    ``OPENBLAS_NUM_THREADS`` once, as it is loaded; it is set only for that import and removed after,
    so child processes see the environment unchanged. A value the user set is kept; a process that
    has imported numpy already keeps its pool (the pool is then as it was sized at that import)."""
    if "numpy" in sys.modules or "OPENBLAS_NUM_THREADS" in os.environ:
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        os.environ.pop("OPENBLAS_NUM_THREADS", None)


def print_json(obj: Any) -> None:
    """Print ``obj`` as JSON on stdout (sorted keys, numpy values allowed)."""
    sys.stdout.buffer.write(
        orjson.dumps(obj, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_INDENT_2)
    )
    sys.stdout.buffer.write(b"\n")


def parse_dims(items: tuple[str, ...], kind: type = int, option: str = "--dim") -> dict[str, Any]:
    """``("L=4", "H=1024")`` → ``{"L": 4, "H": 1024}`` (values converted by ``kind``); else a usage error."""
    out: dict[str, Any] = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            v = kind(value)
        except ValueError:
            what = "INTEGER" if kind is int else "NUMBER"
            raise click.BadParameter(f"expected NAME={what}, got {item!r}", param_hint=option) from None
        if kind is int and not 0 <= v <= MAX_DIM:
            # a dimension sizes tensors and loops: refused here, before any product of it overflows
            raise click.BadParameter(f"{name.strip()} = {v} is outside 0..{MAX_DIM:,}", param_hint=option)
        out[name.strip()] = v
    return out
