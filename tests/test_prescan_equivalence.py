"""The pre-parse shape scan (``ettools.io.first_non_object``) gives the same answer as its earlier,
slower form on random JSON texts, valid and broken (inserted quotes, backslashes, brackets, commas,
keys; deleted bytes), with blocks so small that every string, escape run and key straddles a block
edge. ``tests/test_hardening_memory.py`` checks it against ``json`` itself on valid documents."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest

import ettools.json_scan as scan


def _reference(raw: bytes, key: str) -> tuple[int, str] | None:
    """The scan as it was before the single-pass rewrite (commit ead358b), kept as the reference."""
    # bytes.find runs at memchr speed; the regex only checks what follows each hit
    needle = b'"' + key.encode() + b'"'
    tail = re.compile(rb'[ \t\r\n]*:[ \t\r\n]*\[')
    found = []
    at = raw.find(needle)
    while at >= 0:
        m = tail.match(raw, at + len(needle))
        if m:
            found.append((at, m.end() - 1))
        at = raw.find(needle, at + 1)
    if not found:
        return None
    keyq = np.array([k for k, _ in found], np.int64)
    opens = np.array([o for _, o in found], np.int64)
    a = np.frombuffer(raw, np.uint8)
    n = a.size
    in_str = 0  # inside a string at the block's start
    depth = 0
    bs_carry = 0  # parity of the backslash run that ends the previous block
    prev: tuple[int, int] | None = None  # (position, kind) of the last level-2 event of the open array
    items = 0  # items seen in the open array
    for start in range(0, n, scan._SCAN_BLOCK):
        c = a[start:start + scan._SCAN_BLOCK]
        q = np.flatnonzero(c == 34)
        if q.size:  # a quote after an odd run of backslashes is escaped
            esc = np.zeros(q.size, bool)
            after_bs = np.zeros(q.size, bool)
            after_bs[q > 0] = c[q[q > 0] - 1] == 92
            if q[0] == 0:
                esc[0] = bool(bs_carry)
            if after_bs.any():
                bs = np.flatnonzero(c == 92)
                first = np.ones(bs.size, bool)
                first[1:] = np.diff(bs) != 1
                run0 = bs[np.maximum.accumulate(np.where(first, np.arange(bs.size), 0))]
                cq = q[after_bs]
                r0 = run0[np.searchsorted(bs, cq - 1)]
                esc[after_bs] = ((cq - r0 + (r0 == 0) * bs_carry) & 1).astype(bool)
            if esc.any():
                q = q[~esc]
        if c[-1] == 92:
            rest = np.flatnonzero(c[::-1] != 92)
            bs_carry = (int(rest[0]) & 1) if rest.size else (c.size + bs_carry) & 1
        else:
            bs_carry = 0
        b = np.flatnonzero(np.frombuffer(raw[start:start + scan._SCAN_BLOCK].translate(scan._BRACKETS), np.bool_))
        if q.size:
            b = b[(np.searchsorted(q, b) & 1) == in_str]  # an even number of quotes before: outside
        elif in_str:
            b = b[:0]
        in_str ^= q.size & 1
        if not b.size:
            continue
        ch = c[b]
        op = (ch == 91) | (ch == 123)
        step = np.where(op, 1, -1)
        after = np.cumsum(step)
        after += depth
        depth = int(after[-1])
        lo, hi = np.searchsorted(opens, [start, start + c.size])
        if prev is None and lo == hi:
            continue
        before = after - step
        gb = b + start
        starts = []  # key arrays opened in this block: '[' at depth 1 after a real "key":
        for kq, o in zip(keyq[lo:hi], opens[lo:hi], strict=True):
            i = int(np.searchsorted(gb, o))
            if i < gb.size and gb[i] == o and before[i] == 1:
                run = len(raw[:kq]) - len(raw[:kq].rstrip(b"\\")) if raw[kq - 1:kq] == b"\\" else 0
                if run % 2 == 0:
                    starts.append(i)
        i0 = 0
        while True:
            if prev is None:
                starts = [s for s in starts if s >= i0]
                if not starts:
                    break
                i0 = starts.pop(0) + 1
                prev, items = (int(gb[i0 - 1]), 0), 0
            closes = np.flatnonzero(after[i0:] == 1)
            i1 = i0 + int(closes[0]) + 1 if closes.size else b.size
            seg = slice(i0, i1)
            kind = np.where(op[seg] & (before[seg] == 2), scan._OPEN_ITEM,
                            np.where(~op[seg] & (after[seg] == 2), scan._CLOSE_ITEM,
                                     np.where(~op[seg] & (before[seg] == 2), scan._CLOSE_ARRAY, 0)))
            ev = np.flatnonzero(kind)
            pos = np.concatenate([[prev[0]], gb[seg][ev]])
            kinds = np.concatenate([[prev[1]], kind[ev]])
            cur = np.flatnonzero(kinds[1:] != scan._CLOSE_ITEM) + 1  # item opens and the array's close
            if cur.size:
                p_pos, p_kind, c_pos = pos[cur - 1], kinds[cur - 1], pos[cur]
                nxt = scan._skip_ws(a, raw, p_pos + 1)
                comma = (p_kind == scan._CLOSE_ITEM) & (kinds[cur] == scan._OPEN_ITEM)
                ok = ~comma & (nxt == c_pos)
                if comma.any():  # between two items: whitespace, one comma, whitespace
                    has = comma & (nxt < n)
                    has[has] = a[nxt[has]] == 44
                    after_comma = scan._skip_ws(a, raw, np.where(has, nxt + 1, n))
                    ok |= has & (after_comma == c_pos)
                    nxt = np.where(has, after_comma, nxt)
                bad_array = (kinds[cur] == scan._OPEN_ITEM) & (a[c_pos] == 91)
                bad = np.flatnonzero(~ok | bad_array)
                opened = np.cumsum(kinds[cur] == scan._OPEN_ITEM)
                if bad.size:
                    j = int(bad[0])
                    at = int(nxt[j]) if not ok[j] else int(c_pos[j])
                    if raw[at:at + 1] == b",":  # '{...}, 3]': the item is what follows the comma
                        at = int(scan._skip_ws(a, raw, np.array([at + 1]))[0])
                    before_j = int(opened[j]) - int(kinds[cur[j]] == scan._OPEN_ITEM)  # items ahead of it
                    return items + before_j, scan._what(raw, at)
                items += int(opened[-1])
            prev = (int(pos[-1]), int(kinds[-1]))
            if not closes.size:
                break
            prev = None
            i0 = i1
    return None


_SCALARS = [1, -2.5, 'a"]}[{\\', "\\", '\\\\"', True, None, "x", " " * 20, "traceEvents",
            '\\"traceEvents\\": [']


def _doc(rng: random.Random) -> bytes:
    def value(depth: int) -> object:
        r = rng.random()
        if depth > 3 or r < 0.3:
            return rng.choice(_SCALARS)
        if r < 0.6:
            return [value(depth + 1) for _ in range(rng.randrange(3))]
        return {rng.choice(["k", '"', "[", "traceEvents"]): value(depth + 1) for _ in range(rng.randrange(3))}

    items = [{"a": value(1)} if rng.random() < 0.9 else value(1) for _ in range(rng.randrange(6))]
    doc = {"x": value(1), "traceEvents": items, "y": value(1)}
    if rng.random() < 0.3:  # the key nested deeper, and a longer key that starts the same
        doc = {"traceEvents": items, "z": {"traceEvents": [1]}, "traceEvents2": [3]}
    text = json.dumps(doc, indent=rng.choice([None, 1, 4]),
                      separators=rng.choice([None, (",", ":"), (" , ", " : "), (",\n\n   \t ", ":")]))
    raw = bytearray(text.encode())
    for _ in range(rng.choice([0, 0, 1, 2, 5])):  # broken JSON too: the answers must still agree
        p = rng.randrange(len(raw) + 1)
        r = rng.random()
        if r < 0.4:
            raw[p:p] = rng.choice([b'"', b"\\", b"[", b"]", b"{", b"}", b",", b" ", b"3", b":"])
        elif r < 0.8 and p < len(raw):
            del raw[p]
        else:
            raw[p:p] = b'"traceEvents":['
    return bytes(raw)


@pytest.mark.parametrize("block", [1 << 19, 7, 3, 1])
def test_scan_agrees_with_reference(monkeypatch, block):
    monkeypatch.setattr(scan, "_SCAN_BLOCK", block)
    rng = random.Random(1000 + block)
    for _ in range(800 if block > 3 else 300):
        raw = _doc(rng)
        assert scan.first_non_object(raw, "traceEvents") == _reference(raw, "traceEvents"), raw


def test_scan_agrees_on_long_runs(monkeypatch):
    # whitespace and backslash runs longer than the vector steps (8) and than a block
    monkeypatch.setattr(scan, "_SCAN_BLOCK", 64)
    for ws in (0, 9, 200):
        for bs in (1, 2, 9, 10, 130, 131):
            pad = b" " * ws
            raw = (b'{"a": "' + b"\\" * bs + b'", ' + pad + b'"traceEvents"' + pad + b":" + pad
                   + b"[" + pad + b'{"k": 1}' + pad + b"," + pad + b"7" + pad + b"]}")
            assert scan.first_non_object(raw, "traceEvents") == _reference(raw, "traceEvents"), raw
