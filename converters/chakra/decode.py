"""Vectorized decoding of Chakra ``Node`` frames: the fast path of the ``.et`` reader.

Instead of one protobuf message per node, the fields of a whole chunk of nodes are scanned in
lockstep with numpy: step ``k`` reads the ``k``-th field of every message that has one, so the
number of numpy passes is the number of fields of the longest message, not the number of
nodes. Attributes (``Node.attr``) are scanned the same way one level down, grouped by name with
a hash checked byte for byte, and their values converted per kind in bulk.

The result is the same :class:`~ettools.converters.chakra.mapping.Collected` the protobuf decoder
(:func:`~ettools.converters.chakra.mapping.collect_messages`) produces, with the same Python values.
Anything this decoder does not handle exactly as the protobuf runtime would (a malformed
frame, groups, unknown wire types, a known field with an unexpected wire type, a repeated
singular field, several values in one attribute's oneof, invalid UTF-8)
makes :func:`collect_wire` return None, and the caller decodes that file with protobuf, which
also produces the precise error for bad input. List-valued attributes are decoded one by one
with protobuf.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ettools.graph import StringTable
from ettools.schema import et_def_pb2 as pb

from .attributes import _ATTR_FIELDS
from .mapping import Collected, _AttrAcc

log = logging.getLogger(__name__)

CHUNK = 1 << 15  # nodes per bulk step: arrays stay in cache
_PAD = 16  # zero bytes after the data, so reads up to 10 bytes past a cursor stay in bounds

_KIND_OF_FIELD = {num: kind for kind, num in _ATTR_FIELDS.items()}
_VARINT_KINDS = {"int32_val", "int64_val", "uint32_val", "uint64_val", "bool_val", "sint32_val", "sint64_val"}
_I64_KINDS = {"fixed64_val", "sfixed64_val", "double_val"}
_I32_KINDS = {"fixed32_val", "sfixed32_val", "float_val"}
_LEN_KINDS = {"string_val", "bytes_val"}  # lists are length-delimited too, decoded with protobuf


class _Unsupported(Exception):
    """Input this decoder does not reproduce exactly: use the protobuf path."""


_HI = np.uint64(0x8080808080808080)
_LO7 = np.uint64(0x7F7F7F7F7F7F7F7F)
_ONE = np.uint64(1)
_B0HI = np.uint64(0x80)
_B0LO = np.uint64(0x7F)
# pack 7-bit groups of 8 bytes into 56 bits: merge pairs of bytes, then of 14-bit, then 28-bit groups
_PACK = [
    (np.uint64(0x007F007F007F007F), np.uint64(0x7F007F007F007F00), np.uint64(1)),
    (np.uint64(0x00003FFF00003FFF), np.uint64(0x3FFF00003FFF0000), np.uint64(2)),
    (np.uint64(0x000000000FFFFFFF), np.uint64(0x0FFFFFFF00000000), np.uint64(4)),
]


def words(buf: np.ndarray) -> np.ndarray:
    """A view giving, at every byte offset, the little-endian 64-bit word starting there."""
    return np.ndarray((len(buf) - 7,), dtype="<u8", buffer=buf, offset=0, strides=(1,))


def _varints(bufs: tuple[np.ndarray, np.ndarray], pos: np.ndarray, limit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varints starting at ``pos``; returns ``(values as uint64, positions after them)``.

    One 8-byte gather per varint: the terminating byte (high bit clear) is found with bit
    operations and the 7-bit groups packed with shifts. Varints of 9-10 bytes take a byte loop.
    """
    buf, w8 = bufs
    w = w8[pos]
    if not (w & _B0HI).any():  # all one byte long: the common case for keys and small values
        p = pos + 1
        if (p > limit).any():
            raise _Unsupported("varint runs past the end of its message")
        return w & _B0LO, p
    term = ~w & _HI
    t = term & (~term + _ONE)  # lowest terminating byte's high bit (0 when none in 8 bytes)
    # t = 2**(8k+7) for a (k+1)-byte varint: frexp's exponent is 8k+8
    nbytes = (np.frexp(t.astype(np.float64))[1] >> 3).astype(np.int64)
    x = w & ((t << _ONE) - _ONE) & _LO7
    for keep, move, shift in _PACK:
        x = (x & keep) | ((x & move) >> shift)
    long = np.flatnonzero(term == 0)
    if len(long):
        x[long], end = _long_varints(buf, pos[long])
        nbytes[long] = end - pos[long]
    p = pos + nbytes
    if (p > limit).any():
        raise _Unsupported("varint runs past the end of its message")
    return x, p


def _long_varints(buf: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    m = len(pos)
    val = np.zeros(m, np.uint64)
    p = pos.copy()
    idx = np.arange(m)
    for i in range(10):
        b = buf[p[idx]]
        val[idx] |= (b & 0x7F).astype(np.uint64) << np.uint64(7 * i)
        p[idx] += 1
        idx = idx[b >= 0x80]
        if not len(idx):
            return val, p
    raise _Unsupported("varint longer than 10 bytes")


def _fixed(bufs: tuple[np.ndarray, np.ndarray], pos: np.ndarray, width: int) -> np.ndarray:
    """Little-endian ``width``-byte values at ``pos`` as uint64."""
    w = bufs[1][pos]
    return w if width == 8 else w & np.uint64(0xFFFFFFFF)


class _Fields:
    """Every field of a set of messages: parallel arrays, ordered by (message, position)."""

    __slots__ = ("ln", "msg", "num", "start", "val", "wt")

    def __init__(self, bufs: tuple[np.ndarray, np.ndarray], start: np.ndarray, end: np.ndarray) -> None:
        buf = bufs
        cur = start.copy()
        act = np.flatnonzero(cur < end)
        parts = []
        while len(act):
            c, e = cur[act], end[act]
            key, c = _varints(buf, c, e)
            num = (key >> np.uint64(3)).astype(np.int64)
            wt = (key & np.uint64(7)).astype(np.int64)
            if ((num == 0) | (num >= 1 << 29)).any():
                raise _Unsupported("invalid field number")
            val = np.zeros(len(act), np.uint64)
            vstart = c.copy()
            ln = np.zeros(len(act), np.int64)
            s = wt == 0
            if s.any():
                val[s], c[s] = _varints(buf, c[s], e[s])
            s = wt == 2
            if s.any():
                length, c2 = _varints(buf, c[s], e[s])
                if (length > (e[s] - c2).astype(np.uint64)).any():
                    raise _Unsupported("length-delimited field runs past the end of its message")
                vstart[s] = c2
                ln[s] = length.astype(np.int64)
                c[s] = c2 + ln[s]
            for wire, width in ((1, 8), (5, 4)):
                s = wt == wire
                if s.any():
                    if (c[s] + width > e[s]).any():
                        raise _Unsupported("fixed-width field runs past the end of its message")
                    val[s] = _fixed(buf, c[s], width)
                    c[s] += width
            if ((wt == 3) | (wt == 4) | (wt > 5)).any():
                raise _Unsupported("group or invalid wire type")
            parts.append((act, num, wt, val, vstart, ln))
            cur[act] = c
            act = act[c < e]
        if parts:
            cat = [np.concatenate(x) for x in zip(*parts)]
            order = np.argsort(cat[0], kind="stable")  # steps are in position order already
            self.msg, self.num, self.wt, self.val, self.start, self.ln = (x[order] for x in cat)
        else:
            z = np.zeros(0, np.int64)
            self.msg, self.num, self.wt, self.ln, self.start = z, z, z, z, z
            self.val = np.zeros(0, np.uint64)

    def select(self, num: int, wire_types: tuple[int, ...]) -> np.ndarray:
        """Indices of field ``num`` (which must use one of ``wire_types``)."""
        idx = np.flatnonzero(self.num == num)
        if len(idx) and not np.isin(self.wt[idx], wire_types).all():
            raise _Unsupported(f"field {num} with an unexpected wire type")
        return idx

    def single(self, num: int, wire_type: int, m: int) -> tuple[np.ndarray, np.ndarray]:
        """``(has, index)`` per message of singular field ``num``."""
        idx = self.select(num, (wire_type,))
        msgs = self.msg[idx]
        if len(msgs) > 1 and (msgs[1:] == msgs[:-1]).any():
            raise _Unsupported(f"field {num} repeated in one message")
        has = np.zeros(m, bool)
        has[msgs] = True
        where = np.full(m, -1, np.int64)
        where[msgs] = idx
        return has, where


def _packed_varints(bufs: tuple[np.ndarray, np.ndarray], start: np.ndarray, ln: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decode packed varint runs ``buf[start:start+ln]``; returns ``(values, count per run)``.

    Varint boundaries come from the stop bits of the bytes; each varint is then read from one
    8-byte word (longer ones byte by byte).
    """
    buf, w8 = bufs
    total = int(ln.sum())
    if total == 0:
        return np.zeros(0, np.uint64), np.zeros(len(ln), np.int64)
    out_ptr = np.zeros(len(ln) + 1, np.int64)
    np.cumsum(ln, out=out_ptr[1:])
    idx = np.repeat(start - out_ptr[:-1], ln)
    idx += np.arange(total)
    term = buf[idx] < 0x80
    last = out_ptr[1:][ln > 0] - 1
    if not term[last].all():
        raise _Unsupported("packed run ends inside a varint")
    ends = np.flatnonzero(term)
    firsts = np.empty_like(ends)
    firsts[0] = 0
    firsts[1:] = ends[:-1] + 1
    nbytes = ends - firsts + 1
    at = idx[firsts]
    x = w8[at]
    short = nbytes < 8
    x[short] &= (np.uint64(1) << (8 * nbytes[short]).astype(np.uint64)) - np.uint64(1)
    x &= _LO7
    for keep, move, shift in _PACK:
        x = (x & keep) | ((x & move) >> shift)
    long = np.flatnonzero(nbytes > 8)
    if len(long):
        x[long], _ = _long_varints(buf, at[long])
    cum = np.zeros(total + 1, np.int64)
    np.cumsum(term, out=cum[1:])
    counts = cum[out_ptr[1:]] - cum[out_ptr[:-1]]
    return x, counts


def _repeated_varints(f: _Fields, bufs: tuple[np.ndarray, np.ndarray], num: int) -> tuple[np.ndarray, np.ndarray]:
    """Values of a repeated varint field (packed or not) with the message of each, in order."""
    idx = f.select(num, (0, 2))
    if not len(idx):
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    packed = f.wt[idx] == 2
    counts = np.ones(len(idx), np.int64)
    pv, pc = _packed_varints(bufs, f.start[idx[packed]], f.ln[idx[packed]])
    counts[packed] = pc
    out_ptr = np.zeros(len(idx) + 1, np.int64)
    np.cumsum(counts, out=out_ptr[1:])
    values = np.empty(int(out_ptr[-1]), np.uint64)
    values[out_ptr[:-1][~packed]] = f.val[idx[~packed]]
    if len(pv):
        pstarts = out_ptr[:-1][packed]
        values[np.repeat(pstarts - np.concatenate(([0], np.cumsum(pc)[:-1])), pc) + np.arange(len(pv))] = pv
    return values, np.repeat(f.msg[idx], counts)


_HASH_MUL = np.uint64(0x100000001B3)  # FNV prime: any odd multiplier works, collisions are checked


def _group_bytes(bufs: tuple[np.ndarray, np.ndarray], start: np.ndarray, ln: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group equal byte strings ``buf[start:start+ln]``: ``(code of each, index of each code's first)``.

    Works on 8-byte words: a polynomial hash over each string's words, then a word-for-word
    check of each string against the first of its group, so the grouping is exact (a hash
    collision raises :class:`_Unsupported`).
    """
    w8 = bufs[1]
    k = len(start)
    nw = (ln + 7) >> 3
    ptr = np.zeros(k + 1, np.int64)
    np.cumsum(nw, out=ptr[1:])
    total = int(ptr[-1])
    h = ln.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    if total:
        j = np.arange(total) - np.repeat(ptr[:-1], nw)
        words_ = w8[np.repeat(start, nw) + 8 * j]
        # the last word of a string keeps only the string's bytes
        tail = ln - 8 * (nw - 1)
        last = ptr[1:][nw > 0] - 1
        keep = np.where(tail[nw > 0] >= 8, np.uint64(0xFFFFFFFFFFFFFFFF),
                        (np.uint64(1) << (8 * tail[nw > 0]).astype(np.uint64)) - np.uint64(1))
        words_[last] &= keep
        powers = np.cumprod(np.full(int(nw.max()), _HASH_MUL, np.uint64))
        nz = np.flatnonzero(nw > 0)
        h[nz] += np.add.reduceat((words_ + np.uint64(1)) * powers[j], ptr[nz])
    _, first, inv = np.unique(h, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    rep = first[inv]
    if not (ln == ln[rep]).all():
        raise _Unsupported("string hash collision")
    if total:
        rep_words = w8[np.repeat(start[rep], nw) + 8 * j]
        rep_words[last] &= keep
        if not (words_ == rep_words).all():
            raise _Unsupported("string hash collision")
    return inv, first


def _strings(data: bytes, bufs: tuple[np.ndarray, np.ndarray], start: np.ndarray, ln: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """UTF-8 strings ``data[start:start+ln]`` as ``(code per string, distinct strings)``."""
    inv, first = _group_bytes(bufs, start, ln)
    # invalid UTF-8 raises UnicodeDecodeError: the caller falls back to protobuf
    uniq = [data[a : a + n].decode() for a, n in zip(start[first].tolist(), ln[first].tolist())]
    return inv, uniq


def _num_values(kind: str, v: np.ndarray) -> np.ndarray:
    """Values of varint/fixed attribute fields as an array whose ``tolist()`` equals what
    protobuf returns (int, bool or float)."""
    if kind in ("int64_val", "sfixed64_val"):
        return v.view(np.int64)
    if kind in ("uint64_val", "fixed64_val"):
        return v
    if kind in ("int32_val", "sfixed32_val"):
        return (v & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32).astype(np.int64)
    if kind in ("uint32_val", "fixed32_val"):
        return (v & np.uint64(0xFFFFFFFF)).astype(np.int64)
    if kind == "bool_val":
        return v != 0
    if kind == "sint64_val":
        return ((v >> np.uint64(1)) ^ (np.uint64(0) - (v & np.uint64(1)))).view(np.int64)
    if kind == "sint32_val":
        w = v & np.uint64(0xFFFFFFFF)
        return (w >> np.uint64(1)).astype(np.int64) ^ -(w & np.uint64(1)).astype(np.int64)
    if kind == "double_val":
        return v.view(np.float64)
    if kind == "float_val":
        return v.astype(np.uint32).view(np.float32)
    raise AssertionError(kind)


class _Decoder:
    def __init__(self, data: bytes, strings: StringTable) -> None:
        self.data = data
        self.buf = np.frombuffer(data + bytes(_PAD), np.uint8)
        self.bufs = (self.buf, words(self.buf))
        self.strings = strings
        self.attrs: dict[tuple[str, str], tuple[list[np.ndarray], list[Any]]] = {}
        self.io: dict[str, tuple[list[np.ndarray], list[list[Any]]]] = {"inputs": ([], []), "outputs": ([], [])}

    def names(self, start: np.ndarray, ln: np.ndarray, has: np.ndarray) -> np.ndarray:
        out = np.full(len(has), -1 if has.all() else self.strings.intern(""), np.int32)
        if has.any():
            inv, uniq = _strings(self.data, self.bufs, start, ln)
            intern = self.strings.intern
            out[has] = np.array([intern(u) for u in uniq], np.int32)[inv]
        return out

    def chunk(self, start: np.ndarray, end: np.ndarray, base: int) -> tuple[np.ndarray, ...]:
        m = len(start)
        f = _Fields(self.bufs, start, end)
        known = np.isin(f.num, np.arange(1, 11))
        if not known.all():
            raise _Unsupported("unknown Node field")
        cols = []
        for num in (1, 3, 6, 7):
            has, where = f.single(num, 0, m)
            v = np.zeros(m, np.uint64)
            v[has] = f.val[where[has]]
            cols.append(v)
        ids, types, starts, durs = cols
        types = (types & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32).astype(np.int64)
        has, where = f.single(2, 2, m)
        names = self.names(f.start[where[has]], f.ln[where[has]], has)
        data_v, data_m = _repeated_varints(f, self.bufs, 5)
        ctrl_v, ctrl_m = _repeated_varints(f, self.bufs, 4)
        counts = np.stack((np.bincount(data_m, minlength=m), np.bincount(ctrl_m, minlength=m)), axis=1)
        # per node: data deps, then ctrl deps
        owner = np.concatenate((data_m * 2, ctrl_m * 2 + 1))
        deps = np.concatenate((data_v, ctrl_v))[np.argsort(owner, kind="stable")]
        for num, fname in ((8, "inputs"), (9, "outputs")):
            has, where = f.single(num, 2, m)
            rows, vals = [], []
            for row, i in zip(np.flatnonzero(has).tolist(), where[has].tolist()):
                a = int(f.start[i])
                info = pb.IOInfo.FromString(self.data[a : a + int(f.ln[i])])
                t = (info.values, info.shapes, info.types)
                if t[0] or t[1] or t[2]:
                    rows.append(row + base)
                    vals.append(t)
            if rows:
                self.io[fname][0].append(np.asarray(rows, np.int64))
                self.io[fname][1].append(vals)
        idx = f.select(10, (2,))
        if len(idx):
            self.attributes(f.start[idx], f.start[idx] + f.ln[idx], f.msg[idx] + base)
        return ids, names, types, starts.astype(np.float64), durs.astype(np.float64), deps, counts

    def attributes(self, start: np.ndarray, end: np.ndarray, rows: np.ndarray) -> None:
        k = len(start)
        f = _Fields(self.bufs, start, end)
        if (f.num > 32).any():
            raise _Unsupported("unknown AttributeProto field")
        has_name, where = f.single(1, 2, k)
        f.select(2, (2,))  # doc_string: checked, not kept
        vidx = np.flatnonzero(f.num >= 3)
        vmsg = f.msg[vidx]
        if len(vmsg) > 1 and (vmsg[1:] == vmsg[:-1]).any():
            raise _Unsupported("several values in one attribute")
        field_of = np.zeros(k, np.int64)
        field_of[vmsg] = f.num[vidx]
        at = np.full(k, -1, np.int64)
        at[vmsg] = vidx
        # group attributes by (name, value field); names compared byte for byte
        name_len = np.zeros(k, np.int64)
        name_len[has_name] = f.ln[where[has_name]]
        name_start = np.zeros(k, np.int64)
        name_start[has_name] = f.start[where[has_name]]
        name_code, _ = _group_bytes(self.bufs, name_start, name_len)
        key = name_code * 64 + field_of
        uniq, first, inv = np.unique(key, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
        order = np.argsort(inv, kind="stable")
        bounds = np.concatenate(([0], np.cumsum(np.bincount(inv, minlength=len(uniq)))))
        for g in np.argsort(first, kind="stable").tolist():
            members = order[bounds[g] : bounds[g + 1]]
            r0 = int(first[g])
            name = self.data[int(name_start[r0]) : int(name_start[r0] + name_len[r0])].decode()
            num = int(field_of[r0])
            kind = _KIND_OF_FIELD.get(num, "none") if num else "none"
            vi = at[members]
            values: Any
            if kind == "none":
                values = [None] * len(members)
            elif kind in _VARINT_KINDS or kind in _I64_KINDS or kind in _I32_KINDS:
                wt = 0 if kind in _VARINT_KINDS else (1 if kind in _I64_KINDS else 5)
                if (f.wt[vi] != wt).any():
                    raise _Unsupported("attribute value with an unexpected wire type")
                values = _num_values(kind, f.val[vi])
            else:
                if (f.wt[vi] != 2).any():
                    raise _Unsupported("attribute value with an unexpected wire type")
                if kind == "string_val":
                    codes, uniq_s = _strings(self.data, self.bufs, f.start[vi], f.ln[vi])
                    values = [uniq_s[c] for c in codes.tolist()]
                elif kind == "bytes_val":
                    values = [self.data[a : a + n] for a, n in zip(f.start[vi].tolist(), f.ln[vi].tolist())]
                else:  # lists: protobuf, one attribute at a time
                    values = []
                    for a, b in zip(start[members].tolist(), end[members].tolist()):
                        msg = pb.AttributeProto.FromString(self.data[a:b])
                        values.append(list(getattr(msg, kind).values))
            acc = self.attrs.setdefault((name, kind), ([], []))
            acc[0].append(rows[members])
            acc[1].append(values)


def collect_wire(data: bytes, starts: np.ndarray, ends: np.ndarray, strings: StringTable) -> Collected | None:
    """Decode the Node frames ``data[starts[i]:ends[i]]`` in bulk; None if protobuf must do it."""
    dec = _Decoder(data, strings)
    parts = []
    try:
        for a in range(0, len(starts), CHUNK):
            parts.append(dec.chunk(starts[a : a + CHUNK], ends[a : a + CHUNK], a))
    except Exception as e:  # anything unexpected: the protobuf path decodes (or rejects) it exactly
        # names interned so far stay in the table, unused: harmless
        log.debug("bulk Chakra decoder declined (%s: %s); decoding with protobuf", type(e).__name__, e)
        return None
    if parts:
        ids, names, types, st, du, deps, counts = (np.concatenate(x) for x in zip(*parts))
    else:
        ids, deps = np.zeros(0, np.uint64), np.zeros(0, np.uint64)
        names, types = np.zeros(0, np.int32), np.zeros(0, np.int64)
        st = du = np.zeros(0, np.float64)
        counts = np.zeros((0, 2), np.int64)
    attrs = {}
    for key, (rows, values) in dec.attrs.items():
        if all(isinstance(part, np.ndarray) for part in values):
            vals: Any = np.concatenate(values)  # numbers stay an array until they must be a list
        else:
            vals = [v for part in values for v in part]
        attrs[key] = _AttrAcc(np.concatenate(rows), vals)
    io = {}
    for fname, (rows, values) in dec.io.items():
        io[fname] = _AttrAcc(np.concatenate(rows) if rows else [], [v for part in values for v in part])
    return Collected(ids=ids, names=names.astype(np.int32), types=types, starts=st, durs=du,
                     dep_id=deps.astype(np.uint64), dep_counts=counts.astype(np.int64), attrs=attrs, io=io)
