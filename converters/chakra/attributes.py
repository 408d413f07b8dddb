"""Chakra attribute kinds: which ``AttributeProto`` value fields exist, which attributes live in
node columns (and the field kind ASTRA-sim reads for each), and attribute values to and from
protobuf. Shared by the reader (:mod:`.mapping`, :mod:`.decode`) and the writer (:mod:`.encodings`).
"""

from __future__ import annotations

from typing import Any

from ettools.schema import et_def_pb2 as pb

_ATTR_FIELDS = {f.name: f.number for f in pb.AttributeProto.DESCRIPTOR.fields if f.number >= 3}
VALUE_KINDS = frozenset(_ATTR_FIELDS)
VARINT_KINDS = frozenset({"int32_val", "int64_val", "uint32_val", "uint64_val", "bool_val"})
ZIGZAG_KINDS = frozenset({"sint32_val", "sint64_val"})
FIXED_KINDS = {
    "fixed32_val": "<u4", "sfixed32_val": "<i4", "float_val": "<f4",
    "fixed64_val": "<u8", "sfixed64_val": "<i8", "double_val": "<f8",
}
INT_KINDS = VARINT_KINDS | ZIGZAG_KINDS | {"fixed32_val", "sfixed32_val", "fixed64_val", "sfixed64_val"}
BYTES_KINDS = frozenset({"string_val", "bytes_val"})

# Attributes that live in node columns: attribute -> (column, kind ASTRA-sim reads, lo, hi).
_I63 = (1 << 63) - 1
_I31 = (1 << 31) - 1
INT_COLUMN_ATTRS: dict[str, tuple[str, str, int, int]] = {
    "is_cpu_op": ("is_cpu_op", "bool_val", 0, 1),
    "num_ops": ("num_ops", "int64_val", 0, _I63),
    "tensor_size": ("tensor_size", "uint64_val", 0, _I63),
    "comm_type": ("comm_type", "int64_val", 0, 127),
    "comm_size": ("comm_bytes", "int64_val", 0, _I63),
    "comm_tag": ("comm_tag", "int32_val", 0, _I63),
}
STR_COLUMN_ATTRS: dict[str, str] = {"pg_name": "comm_group", "resource": "resource"}
PEER_ATTRS = ("comm_src", "comm_dst")
PEER_KIND = "int32_val"
COLUMN_ATTR_NAMES = frozenset(INT_COLUMN_ATTRS) | frozenset(STR_COLUMN_ATTRS) | frozenset(PEER_ATTRS)
IO_ATTRS = ("inputs", "outputs")


def canonical_kind(attr: str) -> str | None:
    """The value field ASTRA-sim reads for a column attribute (None for other attributes)."""
    if attr in INT_COLUMN_ATTRS:
        return INT_COLUMN_ATTRS[attr][1]
    if attr in STR_COLUMN_ATTRS:
        return "string_val"
    if attr in PEER_ATTRS:
        return PEER_KIND
    return None


def split_attr_key(key: str) -> tuple[str, str | None]:
    """``"tid@int32_val"`` -> ``("tid", "int32_val")``; a plain name -> ``(name, None)``."""
    name, sep, kind = key.rpartition("@")
    if sep and (kind in VALUE_KINDS or kind == "none"):
        return name, kind
    return key, None


# ---- attribute values <-> protobuf ------------------------------------------------------------
def attr_value(a: Any) -> tuple[str, Any]:
    """``(kind, value)`` of an ``AttributeProto`` (list kinds give a list; no value: ``("none", None)``)."""
    kind = a.WhichOneof("value")
    if kind is None:
        return "none", None
    v = getattr(a, kind)
    if kind[-1] == "t":  # *_list
        return kind, list(v.values)
    return kind, v


def set_attr_value(a: Any, kind: str, value: Any) -> None:
    """Store ``value`` in field ``kind`` of the ``AttributeProto`` ``a``."""
    if kind == "none":
        return
    if kind.endswith("_list"):
        lst = getattr(a, kind)
        lst.SetInParent()
        lst.values.extend(value)
    else:
        setattr(a, kind, value)


def attr_message(name: str, kind: str, value: Any) -> Any:
    """A new ``AttributeProto``."""
    a = pb.AttributeProto(name=name)
    set_attr_value(a, kind, value)
    return a
