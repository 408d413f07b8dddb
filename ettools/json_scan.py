"""Pre-scan of raw JSON text, before any parse: what it will cost and whether its shape is sound.

One vectorized pass over the bytes (no parse) finds the first item of a top-level array (a
format's event/node list) that is not an object, counts the arrays/objects a parse would build,
and where they are densest; :func:`check_items_are_objects` and :func:`check_json_shape` refuse a
file, in one line naming it, that a parse could not hold within :data:`MEMORY_BOUND` times its
size. :mod:`ettools.json_chunks` reuses the scan's item boundaries to parse a list a slice at a time.
"""

from __future__ import annotations

import os
import re
import sys
from typing import NamedTuple

import numpy as np

from ettools.errors import TraceError

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
_WS_STEPS = 32  # whitespace bytes _skip_ws steps over vectorized before a regex per position
_OPEN_ITEM, _CLOSE_ITEM, _CLOSE_ARRAY = 1, 2, 3


def _skip_ws(a: np.ndarray, raw: bytes, pos: np.ndarray) -> np.ndarray:
    """First non-whitespace position at or after each of ``pos`` (``len(raw)`` when none)."""
    n = a.size
    pos = np.minimum(pos, n)
    live = np.flatnonzero(pos < n)
    # JSON writers put a few spaces/newlines between items, an indenting one a newline and 8-16
    # spaces: a byte a step, each step only over the positions still on whitespace (a run past
    # 8 bytes went to the per-item loop below: 25 k regex calls, as long as the scan, on such a file)
    for _ in range(_WS_STEPS):
        ws = live[_WS[a[pos[live]]]]
        if not ws.size:
            return pos
        pos[ws] += 1
        live = ws[pos[ws] < n]
    for i in live:  # long whitespace runs: the C regex engine skips them
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
