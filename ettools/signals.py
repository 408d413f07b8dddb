"""SIGINT/SIGTERM around output files: SIGTERM unwinds like Ctrl-C (temporaries are removed), and
both wait while a set of files is moved into place or rolled back."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM while files are moved or rolled back: a set is committed or undone
    whole, and the signal is raised right after.

    Python-level handlers (not a thread signal mask: a process-directed signal may land on any
    thread, e.g. tqdm's monitor) record the signal; Python runs handlers in the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError, OSError, TypeError):
            old[sig] = signal.signal(sig, lambda signum, frame: got.append(signum))
    try:
        yield
    finally:
        for sig, handler in old.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(sig, handler)
    if got:
        sig = got[0]
        handler = old.get(sig)
        if callable(handler):
            handler(sig, None)
        elif handler == signal.SIG_IGN:
            pass
        elif sig == signal.SIGTERM:
            raise Terminated()
        else:
            raise KeyboardInterrupt()


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like KeyboardInterrupt so every temporary is removed on the way out."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def handle_sigterm() -> None:
    """Make SIGTERM unwind like SIGINT (``finally`` blocks run, temporaries are removed)."""
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signal.SIGTERM, _on_sigterm)
