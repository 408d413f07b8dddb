"""Protobuf wire format, vectorized: encode many messages at once with numpy.

The Chakra writer builds the bytes of a whole chunk of nodes column by column instead of
building one protobuf message per node. The unit is a :data:`Seg`, a CSR list of byte strings
``(buf, ptr)``: entry ``i`` is ``buf[ptr[i]:ptr[i+1]]`` (``buf`` is ``uint8``, ``ptr`` is
``int64`` of length ``m + 1`` with ``ptr[0] == 0`` and ``ptr[-1] == len(buf)``). A field of
``n`` messages is a Seg with ``n`` entries (empty where the field is absent); a message is the
concatenation (:func:`concat`) of its field Segs in field-number order, which is the order the
protobuf runtime serializes in, so the bytes equal ``Message.SerializeToString()`` of the same
content (tests check that byte for byte). Every function is O(entries + bytes) in numpy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

Seg = tuple[np.ndarray, np.ndarray]

WT_VARINT, WT_I64, WT_LEN, WT_I32 = 0, 1, 2, 5
_EMPTY_U8 = np.zeros(0, np.uint8)
_THRESHOLDS = [np.uint64(1) << np.uint64(7 * k) for k in range(1, 10)]


def tag(field_number: int, wire_type: int) -> bytes:
    """Encoded key of a field."""
    return varint_bytes((field_number << 3) | wire_type)


def varint_bytes(value: int) -> bytes:
    """One varint (``value`` taken modulo 2**64, so negative int32/int64 encode as protobuf does)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def empty(m: int) -> Seg:
    """``m`` empty entries."""
    return _EMPTY_U8, np.zeros(m + 1, np.int64)


def lengths(seg: Seg) -> np.ndarray:
    """Byte length of every entry."""
    return np.diff(seg[1])


def _ptr(lens: np.ndarray) -> np.ndarray:
    ptr = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=ptr[1:])
    return ptr


def varint_sizes(v: np.ndarray) -> np.ndarray:
    """Encoded size (1..10) of every ``uint64`` in ``v``."""
    n = np.ones(len(v), np.int64)
    for t in _THRESHOLDS:
        n += v >= t
    return n


def varints(values: np.ndarray) -> Seg:
    """One varint per value (``int64`` values are taken as two's complement ``uint64``)."""
    v = np.asarray(values)
    if v.dtype != np.uint64:
        v = v.astype(np.int64, copy=False).view(np.uint64)
    sizes = varint_sizes(v)
    ptr = _ptr(sizes)
    out = np.empty(int(ptr[-1]), np.uint8)
    pos = ptr[:-1].copy()
    rem = v
    left = sizes
    while len(pos):
        more = left > 1
        out[pos] = (rem & np.uint64(0x7F)).astype(np.uint8) | (more.astype(np.uint8) << np.uint8(7))
        if not more.any():
            break
        pos, rem, left = pos[more] + 1, rem[more] >> np.uint64(7), left[more] - 1
    return out, ptr


def varint_matrix(values: np.ndarray, length: int) -> np.ndarray:
    """``[len(values), length]`` bytes: each value's varint (all must have that length)."""
    v = np.asarray(values, np.uint64)
    out = np.empty((len(v), length), np.uint8)
    for k in range(length):
        byte = (v >> np.uint64(7 * k)) & np.uint64(0x7F)
        if k < length - 1:
            byte |= np.uint64(0x80)
        out[:, k] = byte.astype(np.uint8)
    return out


def zigzag(values: np.ndarray) -> np.ndarray:
    """ZigZag transform of signed integers (``sint32``/``sint64``), as ``uint64``."""
    v = np.asarray(values, np.int64)
    return ((v << 1) ^ (v >> 63)).view(np.uint64)


def fixed(values: np.ndarray, dtype: str) -> Seg:
    """Little-endian fixed-width encoding (``dtype`` like ``"<f8"``, ``"<u4"``)."""
    a = np.ascontiguousarray(np.asarray(values).astype(dtype))
    width = a.dtype.itemsize
    return a.view(np.uint8).reshape(-1).copy(), np.arange(len(a) + 1, dtype=np.int64) * width


def const(data: bytes, present: np.ndarray) -> Seg:
    """``data`` where ``present`` is true, empty elsewhere."""
    present = np.asarray(present, bool)
    k = int(present.sum())
    buf = np.tile(np.frombuffer(data, np.uint8), k) if k and data else _EMPTY_U8
    return buf, _ptr(present.astype(np.int64) * len(data))


def const_all(data: bytes, m: int) -> Seg:
    """``data`` in each of ``m`` entries."""
    return const(data, np.ones(m, bool))


def from_bytes_list(items: Sequence[bytes]) -> Seg:
    """A Seg from Python byte strings (one entry each)."""
    lens = np.array([len(b) for b in items], np.int64)
    buf = np.frombuffer(b"".join(items), np.uint8) if len(items) else _EMPTY_U8
    return buf, _ptr(lens)


def take(seg: Seg, idx: np.ndarray) -> Seg:
    """Entries ``seg[idx[0]], seg[idx[1]], ...`` (a gather; indices may repeat)."""
    buf, ptr = seg
    idx = np.asarray(idx, np.int64)
    lens = ptr[idx + 1] - ptr[idx]
    out_ptr = _ptr(lens)
    total = int(out_ptr[-1])
    if total == 0:
        return _EMPTY_U8, out_ptr
    src = np.repeat(ptr[idx] - out_ptr[:-1], lens) + np.arange(total, dtype=np.int64)
    return buf[src], out_ptr


def concat(segs: Sequence[Seg]) -> Seg:
    """Entry-wise concatenation: entry ``i`` of the result is ``segs[0][i] + segs[1][i] + ...``."""
    segs = [s for s in segs if len(s[0])] or list(segs[:1])
    if len(segs) == 1:
        return segs[0]
    n = len(segs[0][1]) - 1
    k = len(segs)
    # piece (i, j) = entry i of seg j; the output is the pieces in (i, j) order
    lens = np.empty((n, k), np.int64)
    src = np.empty((n, k), np.int64)
    base = 0
    for j, (buf, ptr) in enumerate(segs):
        np.subtract(ptr[1:], ptr[:-1], out=lens[:, j])
        np.add(ptr[:-1], base, out=src[:, j])
        base += len(buf)
    out_ptr = _ptr(lens.sum(axis=1))
    total = int(out_ptr[-1])
    flat_len = lens.reshape(-1)
    nz = flat_len > 0
    piece_len = flat_len[nz]
    piece_src = src.reshape(-1)[nz]
    # source index of every output byte by a cumulative sum of steps: +1 inside a piece, a jump
    # to the next piece's start at each piece boundary
    idx_type = np.int32 if base < 2**31 else np.int64
    step = np.ones(total, idx_type)
    starts = np.cumsum(piece_len) - piece_len
    step[0] = piece_src[0]
    step[starts[1:]] = piece_src[1:] - (piece_src[:-1] + piece_len[:-1] - 1)
    np.cumsum(step, out=step)
    return np.concatenate([buf for buf, _ in segs])[step], out_ptr


def scatter(seg: Seg, rows: np.ndarray, n: int) -> Seg:
    """Place entry ``k`` at row ``rows[k]`` of ``n`` rows (``rows`` ascending; a row may repeat,
    its entries are then concatenated in order); rows not named are empty."""
    rows = np.asarray(rows, np.int64)
    if len(rows) > 1 and (np.diff(rows) < 0).any():
        raise ValueError("scatter needs ascending rows")
    lens = np.bincount(rows, weights=np.diff(seg[1]), minlength=n).astype(np.int64) if len(rows) else np.zeros(
        n, np.int64
    )
    return seg[0], _ptr(lens)


def length_delimited(key: bytes, seg: Seg, present: np.ndarray | None = None) -> Seg:
    """``key + varint(len) + content`` for every entry where ``present`` (default: non-empty)."""
    lens = lengths(seg)
    if present is None:
        present = lens > 0
    pre_buf, pre_ptr = varints(lens[present])
    prefix = scatter((pre_buf, pre_ptr), np.flatnonzero(present), len(lens))
    return concat([const(key, present), prefix, seg])


def frames(segs: Sequence[Seg]) -> Seg:
    """Messages made of field ``segs`` (see :func:`concat`), each prefixed with its varint length:
    Chakra's framing of a message stream. One pass over the bytes."""
    total = np.sum([lengths(s) for s in segs], axis=0)
    return concat([varints(total), *segs])


def varint_field(field_number: int, values: np.ndarray, present: np.ndarray) -> Seg:
    """A varint field (``int32/64``, ``uint32/64``, ``bool``, enum) where ``present``."""
    present = np.asarray(present, bool)
    enc = varints(np.asarray(values)[present])
    return concat([const(tag(field_number, WT_VARINT), present), scatter(enc, np.flatnonzero(present), len(present))])


def packed_field(field_number: int, owner: np.ndarray, values: np.ndarray, n: int) -> Seg:
    """A packed repeated varint field of ``n`` messages: value ``k`` belongs to message ``owner[k]``
    (ascending, values of one message in their order)."""
    content = scatter(varints(values), owner, n)
    return length_delimited(tag(field_number, WT_LEN), content)


def cached_bytes(values: Sequence[object], encode: Callable[[object], bytes]) -> Seg:
    """``encode(v)`` for every value, computing each distinct (hashable) value once."""
    index: dict[object, int] = {}
    setdefault = index.setdefault
    codes = [setdefault(v, len(index)) for v in values]
    table = [encode(v) for v in index]
    if len(table) * 4 > len(codes) or sum(map(len, table)) > 64 * len(table):
        # mostly distinct or long values: joining the bytes objects beats a byte-level gather
        return from_bytes_list([table[c] for c in codes])
    return take(from_bytes_list(table), np.asarray(codes, np.int64))

