"""The event loop's columns (:mod:`.engine`): the program's arrays copied into typed, unboxed
:class:`array.array` columns in the loop's node order, each in the narrowest type that holds it.

Python lists would cost a pointer and a boxed number (~36 bytes) per item; numpy arrays are slow
to read one item at a time; ``array`` items read about as fast as a list's at 1-8 bytes each. The
loop's columns are most of the replay's peak memory, so they are filled in place (no intermediate
copy of a column) and the adjacency, whose temporaries are the largest, first.
"""

from __future__ import annotations

from array import array

import numpy as np

I32 = np.iinfo(np.int32)
# array typecodes of the event loop's columns, narrowest first, and their numpy dtypes
INT_CODES = ("b", "h", "i", "q")
DTYPE = {"b": np.int8, "h": np.int16, "i": np.int32, "q": np.int64, "d": np.float64}


def narrowest(a: np.ndarray) -> str:
    """The narrowest typecode that holds every value of ``a``: 8 bytes per float; 1, 2, 4 or 8 per
    integer (a lane or kind column takes a byte or two a node where a list took ~36)."""
    if a.dtype.kind == "f":
        return "d"
    lo, hi = (int(a.min()), int(a.max())) if len(a) else (0, 0)
    return next(c for c in INT_CODES if np.iinfo(DTYPE[c]).min <= lo and hi <= np.iinfo(DTYPE[c]).max)


def typed(tc: str, n: int) -> tuple[array, np.ndarray]:
    """A zeroed typed array of ``n`` items of typecode ``tc`` and a writable numpy view of its
    buffer (numpy fills it in place: no intermediate copy of the column is made)."""
    out = array(tc, [0]) * n
    return out, np.frombuffer(out, DTYPE[tc])


def compact(a: np.ndarray, take: np.ndarray | None = None) -> array:
    """A typed, unboxed copy of a column (its items in the order ``take``, if given) for the event
    loop (:func:`narrowest`); element reads cost about what a list's do."""
    a = np.asarray(a)
    out, view = typed(narrowest(a), len(a) if take is None else len(take))
    src = a if a.dtype == view.dtype else a.astype(view.dtype)
    if take is None:
        view[:] = src
    else:
        np.take(src, take, out=view, mode="clip")  # indices are valid: clip skips a buffered copy
    return out


def interleaved(rank_of: np.ndarray, rank_offset: np.ndarray) -> np.ndarray | None:
    """A node order (new position -> node) that puts the nodes ranks run at about the same time next
    to each other: by the node's position within its rank (``rank_of``, ranks starting at
    ``rank_offset``) as a fraction of the rank's nodes, then by rank; each rank keeps its own order.
    The program lays ranks out one after another, so at 1,024 ranks every event touched another
    rank's far-away slice of each column and the loop paid a cache miss per access (7-8 µs per node
    against 5 µs at 64 ranks for the same node count). None for one rank."""
    n = len(rank_of)
    if n == 0 or len(rank_offset) <= 2:
        return None
    rank = np.asarray(rank_of, np.int64)
    first = np.asarray(rank_offset, np.int64)
    frac = np.arange(n, dtype=np.int64)
    frac -= first[rank]
    frac = frac / np.maximum(np.diff(first), 1)[rank]
    return np.lexsort((rank, frac))


def csr_permuted(ptr: np.ndarray, idx: np.ndarray, perm: np.ndarray, inv: np.ndarray) -> tuple[array, array]:
    """Adjacency ``ptr``/``idx`` with the nodes in the order ``perm`` (and ``inv`` its inverse), as
    typed arrays; the temporaries are 4-byte where the edge count allows."""
    ptr = np.asarray(ptr, np.int64)
    m = int(ptr[-1]) if len(ptr) else 0
    it = np.int32 if m <= I32.max else np.int64
    deg = np.diff(ptr).astype(it)[perm]
    nptr = np.zeros(len(deg) + 1, np.int64)
    np.cumsum(deg, out=nptr[1:])
    take = np.repeat((ptr[:-1][perm] - nptr[:-1]).astype(it), deg)
    del deg
    take += np.arange(m, dtype=it)
    return compact(nptr), compact(inv, np.asarray(idx)[take])
