"""A pause of Python's cyclic garbage collector around work that allocates many small objects and
frees none until it returns (parsing, building a replay program, the event loop): every full pass
would walk all the live objects again, so such work would grow faster than its size."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """No cyclic-GC passes inside the block; the collector's previous state is restored after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
