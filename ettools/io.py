"""File helpers shared by every reader and writer: gzip-or-plain input, JSON, atomic output."""

from __future__ import annotations

import contextlib
import errno
import gzip
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, NamedTuple

import numpy as np
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


def load_json(path: str | os.PathLike, data: bytes | None = None, items_of: str | None = None) -> Any:
    """Parse ``path`` (plain or gzip) as JSON with orjson; errors name the file and position.

    ``items_of``: the top-level key whose array must hold objects (a format's event/node list),
    checked on the raw bytes before the parse (:func:`check_items_are_objects`). Text read here is
    checked for nesting too dense to parse within the memory bound (:func:`check_json_shape`)."""
    raw = read_bytes(path) if data is None else data
    if items_of is not None:
        check_items_are_objects(path, raw, items_of)
    elif data is None:  # given ``data`` was checked by the caller
        check_json_shape(path, raw)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise TraceError(path, f"not valid JSON: {e}") from None


# Pre-scan of raw JSON bytes, before a full parse: a top-level array whose items are not objects
# (a 50 MB file of small nested arrays) would become tens of millions of Python objects (~40x the
# file) before any reader could look at its shape. Brackets outside strings give the nesting depth;
# quotes outside escapes give the strings; work is done in fixed-size blocks so the scan's own
# temporaries stay a few MB whatever the file size.
_SCAN_BLOCK = 1 << 19
_BRACKETS = bytes(1 if ch in b"[]{}" else 0 for ch in range(256))
_WS = np.zeros(256, bool)
_WS[list(b" \t\r\n")] = True
_NON_WS = re.compile(rb"[^ \t\r\n]")
_OPEN_ITEM, _CLOSE_ITEM, _CLOSE_ARRAY = 1, 2, 3


def _skip_ws(a: np.ndarray, raw: bytes, pos: np.ndarray) -> np.ndarray:
    """First non-whitespace position at or after each of ``pos`` (``len(raw)`` when none)."""
    n = a.size
    pos = np.minimum(pos, n)
    for _ in range(8):  # JSON writers put a few spaces/newlines between items
        live = np.flatnonzero(pos < n)
        ws = live[_WS[a[pos[live]]]]
        if not ws.size:
            return pos
        pos[ws] += 1
    for i in ws:  # long whitespace runs: the C regex engine skips them
        m = _NON_WS.search(raw, int(pos[i]))
        pos[i] = m.start() if m else n
    return pos


def _what(raw: bytes, pos: int) -> str:
    ch = raw[pos:pos + 1]
    if ch == b"[":
        return "an array"
    if ch == b'"':
        return "a string"
    if ch in (b"t", b"f"):
        return "a boolean"
    if ch == b"n":
        return "null"
    if ch and (ch.isdigit() or ch == b"-"):
        return "a number"
    return "not valid JSON"


def _escaped_quotes(c: np.ndarray, carry: int) -> np.ndarray:
    """Positions in block ``c`` of quotes that end an odd run of backslashes (escaped); ``carry``:
    parity of the backslash run that ends the previous block."""
    bs = np.flatnonzero(c == 92)
    if not bs.size:
        return np.zeros(1, np.int64) if carry and c[0] == 34 else bs
    first = np.ones(bs.size, bool)
    first[1:] = np.diff(bs) != 1
    last = np.ones(bs.size, bool)
    last[:-1] = first[1:]
    r0, r1 = bs[first], bs[last]  # runs of backslashes [r0, r1]
    odd = ((r1 - r0 + 1 + (r0 == 0) * carry) & 1).astype(bool)
    nxt = r1 + 1
    hit = odd & (nxt < c.size)
    hit[hit] = c[nxt[hit]] == 34
    out = nxt[hit]
    if carry and c[0] == 34:
        out = np.concatenate([[0], out])
    return out


def _skip_ws_back(a: np.ndarray, raw: bytes, pos: np.ndarray) -> np.ndarray:
    """Last non-whitespace position at or before each of ``pos`` (-1 when none)."""
    pos = pos.copy()
    for _ in range(8):
        live = np.flatnonzero(pos >= 0)
        ws = live[_WS[a[pos[live]]]]
        if not ws.size:
            return pos
        pos[ws] -= 1
    for i in ws:  # long whitespace runs
        pos[i] = _run_start(raw, int(pos[i]) + 1, b" \t\r\n") - 1
    return pos


def _run_start(raw: bytes, end: int, chars: bytes) -> int:
    """Start of the run of bytes from ``chars`` that ends just before ``end``."""
    width = 64
    while True:  # windows that double: no copy of the whole prefix for a short run
        lo = max(0, end - width)
        kept = len(raw[lo:end].rstrip(chars))
        if kept or lo == 0:
            return lo + kept
        width *= 2


def _after_key(a: np.ndarray, raw: bytes, opens: np.ndarray, needle: bytes) -> np.ndarray:
    """Which of the ``[`` at ``opens`` follow ``needle`` (a quoted key), a colon and whitespace only,
    the key's opening quote not escaped."""
    p = _skip_ws_back(a, raw, opens - 1)
    ok = p >= 0
    ok[ok] = a[p[ok]] == 58
    e = _skip_ws_back(a, raw, np.where(ok, p - 1, -1))
    kq = e - (len(needle) - 1)
    ok &= kq >= 0
    if ok.any():
        span = kq[ok][:, None] + np.arange(len(needle))
        ok[ok] = (a[span] == np.frombuffer(needle, np.uint8)).all(1)
    for i in np.flatnonzero(ok):  # a key whose quote follows an odd run of backslashes is text
        k = int(kq[i])
        ok[i] = (k - _run_start(raw, k, b"\\")) % 2 == 0
    return ok


class JsonShape(NamedTuple):
    """What :func:`scan_shape` read from raw JSON text, before any parse."""

    bad_item: tuple[int, str] | None  # (index, kind) of the first key-array item that is not an object
    containers: int  # arrays and objects (brackets outside strings); counted whole only when bad_item is None
    densest_at: int  # byte offset of the scan block (_SCAN_BLOCK bytes) that opens the most of them
    densest_items: tuple[int, int] | None  # first and last key-array items that block touches


def first_non_object(raw: bytes, key: str) -> tuple[int, str] | None:
    """``(index, kind)`` of the first item that is not a JSON object in an array under ``key`` in the
    top-level object of the JSON text ``raw``; None when every item is an object (or there is no
    such array, or the text is not JSON: the parser says so). Peak extra memory: a few MB."""
    if raw.find(b'"' + key.encode() + b'"') < 0:  # a file without the key needs no item scan
        return None
    return scan_shape(raw, key).bad_item


def scan_shape(raw: bytes, key: str | None, bounds: list[tuple[int, int]] | None = None) -> JsonShape:
    """One pass over the JSON text ``raw`` (no parse): the first item of a top-level ``key`` array
    that is not an object (see :func:`first_non_object`; ``key`` None: no item check), and how many
    arrays/objects the text holds (what a parse turns into the costliest Python objects) with where
    they are densest. Peak extra memory: a few MB.

    ``bounds``, when given, receives where the ``key`` arrays are, for a reader that parses one a
    slice at a time: (``_OPEN_ITEM``, offset) of the first item opened in each scan block, between
    (0, offset of an array's ``[``) and (``_CLOSE_ARRAY``, offset of its ``]``)."""
    needle = b'"' + key.encode() + b'"' if key is not None else b""
    has_key = bool(needle) and raw.find(needle) >= 0  # usually near the start: cheap
    containers = 0
    dense_n, dense_at = -1, 0  # containers opened in the densest block so far, and its start
    dense_lo: int | None = None  # key-array item open at its start (or the next one)
    dense_items: tuple[int, int] | None = None
    pending = False  # the block just scanned is the densest: its last item is read after it
    a = np.frombuffer(raw, np.uint8)
    n = a.size
    in_str = 0  # inside a string at the block's start
    depth = 0
    bs_carry = 0  # parity of the backslash run that ends the previous block
    prev: tuple[int, int] | None = None  # (position, kind) of the last level-2 event of the open array
    items = 0  # items seen in the open array
    block = min(_SCAN_BLOCK, max(n, 1))
    t = np.empty(block, np.uint8)  # scratch, reused: the scan's temporaries stay a few MB
    quote = np.empty(block, np.bool_)
    for start in range(0, n, block):
        if pending:
            dense_items, pending = _items_span(dense_lo, prev, items), False
        c = a[start:start + block]
        m = c.size
        # brackets: c | 0x20 folds '[' ']' onto '{' '}'; minus '{' leaves 0 or 2, the only values
        # that vanish under & ~2: one exact test in four vector ops, no table lookup
        tb = t[:m]
        np.bitwise_or(c, 0x20, out=tb)
        np.subtract(tb, 0x7B, out=tb)
        np.bitwise_and(tb, 0xFD, out=tb)
        b = np.flatnonzero(tb == 0)
        q = quote[:m]
        np.equal(c, 34, out=q)
        if raw.find(b"\\", start, start + m) >= 0 or (bs_carry and c[0] == 34):
            q[_escaped_quotes(c, bs_carry)] = False  # a quote after an odd run of backslashes
        if c[-1] == 92:
            rest = np.flatnonzero(c[::-1] != 92)
            bs_carry = (int(rest[0]) & 1) if rest.size else (m + bs_carry) & 1
        else:
            bs_carry = 0
        # quotes before each bracket, mod 256 (parity is all that counts): one summing pass; a
        # bracket is never a quote, so a bracket at 0 repeating index 0 adds nothing
        seg = np.add.reduceat(q.view(np.uint8), np.concatenate([[0], b]), dtype=np.uint8)
        par = np.bitwise_and(np.cumsum(seg, dtype=np.uint8), 1)
        b = b[par[:-1] == in_str]  # outside a string: the quotes before, with in_str, are even
        in_str ^= int(par[-1])
        if not b.size:
            continue
        ch = c[b]
        op = (ch == 91) | (ch == 123)
        opened_here = int(np.count_nonzero(op))
        containers += opened_here
        if opened_here > dense_n:
            dense_n, dense_at, pending = opened_here, start, has_key
            dense_lo = None if prev is None else items - (prev[1] == _OPEN_ITEM)
            dense_items = None
        if not has_key:  # the count is all that is wanted
            continue
        step = np.where(op, 1, -1)
        after = np.cumsum(step)
        after += depth
        depth = int(after[-1])
        before = after - step
        gb = b + start
        # key arrays opened in this block: a '[' opened at depth 1 right after a real "key": (found
        # from the brackets, not by searching the text for the key: that costs a full pass)
        cand = np.flatnonzero(op & (before == 1) & (ch == 91))
        starts = cand[_after_key(a, raw, gb[cand], needle)].tolist() if cand.size else []
        if prev is None and not starts:
            continue
        i0 = 0
        while True:
            if prev is None:
                starts = [s for s in starts if s >= i0]
                if not starts:
                    break
                i0 = starts.pop(0) + 1
                prev, items = (int(gb[i0 - 1]), 0), 0
                if bounds is not None:
                    bounds.append((0, prev[0]))
            closes = np.flatnonzero(after[i0:] == 1)
            i1 = i0 + int(closes[0]) + 1 if closes.size else b.size
            seg = slice(i0, i1)
            kind = np.where(op[seg] & (before[seg] == 2), _OPEN_ITEM,
                            np.where(~op[seg] & (after[seg] == 2), _CLOSE_ITEM,
                                     np.where(~op[seg] & (before[seg] == 2), _CLOSE_ARRAY, 0)))
            ev = np.flatnonzero(kind)
            pos = np.concatenate([[prev[0]], gb[seg][ev]])
            kinds = np.concatenate([[prev[1]], kind[ev]])
            cur = np.flatnonzero(kinds[1:] != _CLOSE_ITEM) + 1  # item opens and the array's close
            if cur.size:
                p_pos, p_kind, c_pos = pos[cur - 1], kinds[cur - 1], pos[cur]
                nxt = _skip_ws(a, raw, p_pos + 1)
                comma = (p_kind == _CLOSE_ITEM) & (kinds[cur] == _OPEN_ITEM)
                ok = ~comma & (nxt == c_pos)
                if comma.any():  # between two items: whitespace, one comma, whitespace
                    has = comma & (nxt < n)
                    has[has] = a[nxt[has]] == 44
                    after_comma = _skip_ws(a, raw, np.where(has, nxt + 1, n))
                    ok |= has & (after_comma == c_pos)
                    nxt = np.where(has, after_comma, nxt)
                bad_array = (kinds[cur] == _OPEN_ITEM) & (a[c_pos] == 91)
                bad = np.flatnonzero(~ok | bad_array)
                opened = np.cumsum(kinds[cur] == _OPEN_ITEM)
                if bad.size:
                    j = int(bad[0])
                    at = int(nxt[j]) if not ok[j] else int(c_pos[j])
                    if raw[at:at + 1] == b",":  # '{...}, 3]': the item is what follows the comma
                        at = int(_skip_ws(a, raw, np.array([at + 1]))[0])
                    before_j = int(opened[j]) - int(kinds[cur[j]] == _OPEN_ITEM)  # items ahead of it
                    return JsonShape((items + before_j, _what(raw, at)), containers, dense_at, None)
                items += int(opened[-1])
                if bounds is not None and opened[-1]:  # the block's first item: a place to cut
                    bounds.append((_OPEN_ITEM, int(c_pos[np.argmax(kinds[cur] == _OPEN_ITEM)])))
            prev = (int(pos[-1]), int(kinds[-1]))
            if not closes.size:
                break
            if bounds is not None:
                bounds.append((_CLOSE_ARRAY, int(gb[i0 + int(closes[0])])))
            prev = None
            i0 = i1
    if pending:
        dense_items = _items_span(dense_lo, prev, items)
    return JsonShape(None, containers, dense_at, dense_items)


def _items_span(lo: int | None, prev: tuple[int, int] | None, items: int) -> tuple[int, int] | None:
    """First and last key-array items a block touched: ``lo`` the one open at its start (or the
    next; None: outside the array then, so the array opened inside the block and its first item is
    0); ``prev``/``items`` the scan's state at its end (None: outside the array)."""
    if prev is None:
        return None if lo is None else (lo, max(lo, items - 1))
    hi = items - 1
    lo = 0 if lo is None else lo
    return (lo, hi) if hi >= lo else None


# Nesting too dense to parse within the memory bound (issue 15: peak <= 4x the input). Each array or
# object becomes a Python list/dict of at least sys.getsizeof([]) bytes (56 on 64-bit CPython; ~110
# measured with its slot and allocator overhead), while the text spends as little as 2-3 bytes on it:
# a well-formed trace whose args hold megabytes of [[1],[2]] costs ~35x its size. When the text plus
# that least cost already passes the bound, the parse cannot stay within it: refused. Real traces
# hold one container per 31 (PyTorch ET) to 58-156 (Kineto) bytes, i.e. 1-1.8x of the 3x allowed.
# Not covered: huge arrays of scalars (50 MB of floats/strings/ints > 256 in args parse at ~14-20x),
# since a real PyTorch ET's parse alone already takes ~6x its text: a lower bound counting scalars
# against 4x would refuse real traces; that case needs a parse that skips unread args values.
MEMORY_BOUND = 4  # peak memory per byte of JSON text the readers promise
_CONTAINER_BYTES = sys.getsizeof([])
# ... unless the parse is small beside the interpreter and libraries themselves (~45 MB): a small
# file of nested lists is no memory risk, and the bound means nothing below the process's own size.
_SMALL_PARSE = 64 << 20


def check_json_shape(path: str | os.PathLike, raw: bytes, key: str | None = None,
                     shape: JsonShape | None = None) -> None:
    """Refuse (one line naming ``path``) JSON text whose arrays/objects are so many that its parse
    cannot stay within :data:`MEMORY_BOUND` times its size; ``key`` names the top-level array whose
    items the message points into (the densest part). ``shape``: a scan already made."""
    if shape is None:
        shape = scan_shape(raw, key)
    least = shape.containers * _CONTAINER_BYTES
    if len(raw) + least <= MEMORY_BOUND * len(raw) or least <= _SMALL_PARSE:
        return
    where = f"the {_SCAN_BLOCK >> 10} KB from byte {shape.densest_at:,}"
    if shape.densest_items is not None and key is not None:
        lo, hi = shape.densest_items
        where = f"{key}[{lo}]" + (f" to [{hi}]" if hi > lo else "") + f", {where}"
    raise TraceError(
        path, f"{shape.containers:,} nested arrays/objects in {len(raw) / (1 << 20):.1f} MB of JSON (one per "
        f"{len(raw) / shape.containers:.1f} bytes): parsing needs at least {(len(raw) + least) / (1 << 20):,.0f} "
        f"MB, over {MEMORY_BOUND}x the text; refused (densest in {where})")


def check_items_are_objects(path: str | os.PathLike, raw: bytes, key: str,
                            bounds: list[tuple[int, int]] | None = None) -> None:
    """Refuse (one line naming ``path``) JSON text whose top-level ``key`` array holds an item that is
    not an object, or whose nesting is too dense to parse within the memory bound
    (:func:`check_json_shape`), before it is parsed: cheap (one pass over the bytes), and keeps a
    malformed or pathological file from costing ~40x its size. ``bounds``: see :func:`scan_shape`."""
    shape = scan_shape(raw, key, bounds)
    if shape.bad_item is not None:
        raise TraceError(path, f"{key}[{shape.bad_item[0]}] is not an object ({shape.bad_item[1]})")
    check_json_shape(path, raw, key, shape)



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


def short(value: object, limit: int = 200) -> str:
    """``repr``-like text of ``value`` for an error message: bounded length, control characters escaped.

    Never recurses into deep containers (a value nested 1,000 deep would overflow ``repr``).
    """
    if isinstance(value, (dict, list, tuple)):
        text = f"<{type(value).__name__} of {len(value)}>"
    elif isinstance(value, str):
        text = repr(value[: limit + 1])  # repr escapes control characters
    elif isinstance(value, (int, float, bool)) or value is None:
        text = repr(value) if not isinstance(value, int) or value.bit_length() < 700 else "<huge int>"
    else:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def clean_message(text: str, limit: int = 300) -> str:
    """One printable line of at most ``limit`` characters: control characters escaped, the middle cut."""
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    if len(text) > limit:
        text = text[: limit - 40] + " … " + text[-37:]
    return text


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


def check_output_file(path: str | os.PathLike) -> Path:
    """Refuse early an output file path that cannot be written: an existing non-regular file
    (directory, FIFO, device, symlink) or a parent that is a file; returns ``path``."""
    path = Path(path)
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
        self._pending: dict[Path, Path] = {}  # final -> staged temporary
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
        path = Path(path)
        if len(path.name.encode("utf-8", "surrogateescape")) > _NAME_MAX:
            raise OutputError(path, "cannot write: file name too long")
        stage = self._stage(path)
        tmp = stage / f"{len(self._pending)}.tmp"
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
        for final in self._pending:  # refuse before anything moves
            check_output_file(final)
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


def write_json(path: str | os.PathLike, obj: Any, indent: bool = False) -> None:
    """Atomically write ``obj`` as JSON (sorted keys, so output bytes are deterministic)."""
    opts = orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY
    if indent:
        opts |= orjson.OPT_INDENT_2
    data = json_bytes(obj, path, opts)
    with atomic_write(path) as f:
        f.write(data)
