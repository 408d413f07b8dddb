"""Wire bytes of a node's fields for the writer, built column-wise with :mod:`ettools.converters.chakra_wire`:
complete ``Node.attr`` entries per attribute kind, ``IOInfo`` entries and interned string fields,
and which edge kinds are written as ``data_deps``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ettools.converters import chakra_wire as w
from ettools.graph import EdgeKind, StringTable

from .attributes import _ATTR_FIELDS, BYTES_KINDS, FIXED_KINDS, VARINT_KINDS, ZIGZAG_KINDS, attr_message

Seg = w.Seg


# A device op's dependency on the host op that launched it is a data dependency, as in Chakra's own
# converter (a GPU node's data_deps name its CPU op); other non-DATA kinds are ctrl_deps.
_DATA_DEP_KINDS = (EdgeKind.DATA, EdgeKind.LAUNCH)


def _attr_prefix(name: str, kind: str) -> bytes:
    nb = name.encode()
    return w.tag(1, w.WT_LEN) + w.varint_bytes(len(nb)) + nb


def _value_seg(kind: str, values: Any) -> Seg | None:
    """Field-key-plus-value bytes of ``values`` for a scalar kind, vectorized; None for other kinds."""
    number = _ATTR_FIELDS.get(kind)
    if kind in VARINT_KINDS:
        arr = np.asarray(values)
        if arr.dtype == object:
            return None
        if arr.dtype.kind == "f":
            return None
        enc = w.varints(arr if arr.dtype == np.uint64 else arr.astype(np.int64))
        return w.concat([w.const_all(w.tag(number, w.WT_VARINT), len(arr)), enc])
    if kind in ZIGZAG_KINDS:
        arr = np.asarray(values)
        if arr.dtype == object:
            return None
        return w.concat([w.const_all(w.tag(number, w.WT_VARINT), len(arr)), w.varints(w.zigzag(arr))])
    if kind in FIXED_KINDS:
        dtype = FIXED_KINDS[kind]
        wt = w.WT_I32 if dtype[-1] == "4" else w.WT_I64
        arr = np.asarray(values)
        if arr.dtype == object:
            return None
        return w.concat([w.const_all(w.tag(number, wt), len(arr)), w.fixed(arr, dtype)])
    if kind in BYTES_KINDS:
        key = w.tag(number, w.WT_LEN)

        def enc(v: Any) -> bytes:
            b = v.encode() if isinstance(v, str) else bytes(v)
            return key + w.varint_bytes(len(b)) + b

        return w.cached_bytes(values, enc)
    return None


_ATTR_KEY = w.tag(10, w.WT_LEN)


def attr_entries(name: str, kind: str, values: Any) -> Seg:
    """Complete ``Node.attr`` entries (key, length, AttributeProto) for ``values`` of one attribute."""
    k = len(values)
    vseg = _value_seg(kind, values) if k else None
    if vseg is not None:
        body = w.concat([w.const_all(_attr_prefix(name, kind), k), vseg])
        return w.length_delimited(_ATTR_KEY, body, np.ones(k, bool))

    def enc(v: Any) -> bytes:
        b = attr_message(name, kind, list(v) if isinstance(v, tuple) else v).SerializeToString()
        return _ATTR_KEY + w.varint_bytes(len(b)) + b

    hashable = [tuple(v) if isinstance(v, list) else v for v in values]
    return w.cached_bytes(hashable, enc)


def _io_entries(fname: str, values: list[Any]) -> Seg:
    key = w.tag(8 if fname == "inputs" else 9, w.WT_LEN)

    def enc(v: Any) -> bytes:
        # IOInfo {string values = 1; string shapes = 2; string types = 3;}: empty strings left out
        parts = []
        for number, text in zip((0x0A, 0x12, 0x1A), v):
            if text:
                raw = text.encode()
                parts.append(bytes((number,)) + w.varint_bytes(len(raw)) + raw)
        b = b"".join(parts)
        return key + w.varint_bytes(len(b)) + b

    return w.cached_bytes([tuple(v) for v in values], enc)


class _StringField:
    """Encoded ``key + len + utf8`` of interned strings, computed once per string id.

    ``omit_empty`` leaves out empty strings (a proto3 scalar field); ``rename`` maps a string to
    the one written (process-group name -> key). Id -1 (absent) is always left out.
    """

    def __init__(self, strings: StringTable, key: bytes, omit_empty: bool = True,
                 rename: dict[str, str] | None = None) -> None:
        self.strings = strings
        self.key = key
        self.omit_empty = omit_empty
        self.rename = rename
        self.cache: dict[int, bytes] = {}

    def _encode(self, sid: int) -> bytes:
        if sid < 0:
            return b""
        s = self.strings[sid]
        if self.rename is not None:
            s = self.rename.get(s, s)
        raw = s.encode()
        if not raw and self.omit_empty:
            return b""
        return self.key + w.varint_bytes(len(raw)) + raw

    def seg(self, ids: np.ndarray) -> Seg:
        """Entries for an array of string ids."""
        uniq, inv = np.unique(ids, return_inverse=True)
        cache = self.cache
        table = []
        for sid in uniq.tolist():
            b = cache.get(sid)
            if b is None:
                b = cache[sid] = self._encode(sid)
            table.append(b)
        return w.take(w.from_bytes_list(table), inv.reshape(-1))
