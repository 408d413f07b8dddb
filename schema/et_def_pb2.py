"""Python bindings for Chakra's ``et_def.proto`` (schema 0.0.4), built at import time.

Chakra ships ``protoc`` output, which refuses protobuf runtimes older than the ``protoc`` that
made it (its bindings fail on protobuf 5.29 and 4.25). Here the file descriptor is assembled
with ``descriptor_pb2`` and the message classes are obtained from the runtime's own message
factory, so the same module loads on every protobuf release from 4.21 to the newest.
The field names and numbers mirror ``et_def.proto`` beside this file; a test checks both agree.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_PACKAGE = "ChakraProtoMsg"
_FD = descriptor_pb2.FieldDescriptorProto

# (scalar type, protobuf type enum) of every XList message and oneof member of AttributeProto,
# in field-number order starting at 3: name_val = odd number, name_list = even number.
_ATTR_SCALARS = [
    ("double", _FD.TYPE_DOUBLE, "DoubleList"),
    ("float", _FD.TYPE_FLOAT, "FloatList"),
    ("int32", _FD.TYPE_INT32, "Int32List"),
    ("int64", _FD.TYPE_INT64, "Int64List"),
    ("uint32", _FD.TYPE_UINT32, "Uint32List"),
    ("uint64", _FD.TYPE_UINT64, "Uint64List"),
    ("sint32", _FD.TYPE_SINT32, "Sint32List"),
    ("sint64", _FD.TYPE_SINT64, "Sint64List"),
    ("fixed32", _FD.TYPE_FIXED32, "Fixed32List"),
    ("fixed64", _FD.TYPE_FIXED64, "Fixed64List"),
    ("sfixed32", _FD.TYPE_SFIXED32, "Sfixed32List"),
    ("sfixed64", _FD.TYPE_SFIXED64, "Sfixed64List"),
    ("bool", _FD.TYPE_BOOL, "BoolList"),
    ("string", _FD.TYPE_STRING, "StringList"),
    ("bytes", _FD.TYPE_BYTES, "BytesList"),
]

NODE_TYPES = [
    "INVALID_NODE",
    "METADATA_NODE",
    "MEM_LOAD_NODE",
    "MEM_STORE_NODE",
    "COMP_NODE",
    "COMM_SEND_NODE",
    "COMM_RECV_NODE",
    "COMM_COLL_NODE",
]
COLLECTIVE_TYPES = [
    "ALL_REDUCE",
    "REDUCE",
    "ALL_GATHER",
    "GATHER",
    "SCATTER",
    "BROADCAST",
    "ALL_TO_ALL",
    "REDUCE_SCATTER",
    "REDUCE_SCATTER_BLOCK",
    "BARRIER",
]


def _field(msg, name: str, number: int, ftype: int, label: int = _FD.LABEL_OPTIONAL,
           type_name: str | None = None, oneof: int | None = None) -> None:
    f = msg.field.add()
    f.name = name
    f.number = number
    f.type = ftype
    f.label = label
    if type_name:
        f.type_name = f".{_PACKAGE}.{type_name}"
    if oneof is not None:
        f.oneof_index = oneof


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto()
    fdp.name = "ettools_et_def.proto"
    fdp.package = _PACKAGE
    fdp.syntax = "proto3"

    attr = fdp.message_type.add()
    attr.name = "AttributeProto"
    attr.oneof_decl.add().name = "value"
    _field(attr, "name", 1, _FD.TYPE_STRING)
    _field(attr, "doc_string", 2, _FD.TYPE_STRING)
    for i, (scalar, ftype, list_name) in enumerate(_ATTR_SCALARS):
        _field(attr, f"{scalar}_val", 3 + 2 * i, ftype, oneof=0)
        _field(attr, f"{scalar}_list", 4 + 2 * i, _FD.TYPE_MESSAGE, type_name=list_name, oneof=0)
    for _scalar, ftype, list_name in _ATTR_SCALARS:
        lst = fdp.message_type.add()
        lst.name = list_name
        _field(lst, "values", 1, ftype, label=_FD.LABEL_REPEATED)

    for enum_name, values in (("NodeType", NODE_TYPES), ("CollectiveCommType", COLLECTIVE_TYPES)):
        enum = fdp.enum_type.add()
        enum.name = enum_name
        for number, value_name in enumerate(values):
            v = enum.value.add()
            v.name = value_name
            v.number = number

    meta = fdp.message_type.add()
    meta.name = "GlobalMetadata"
    _field(meta, "version", 1, _FD.TYPE_STRING)
    _field(meta, "attr", 2, _FD.TYPE_MESSAGE, _FD.LABEL_REPEATED, "AttributeProto")

    io = fdp.message_type.add()
    io.name = "IOInfo"
    for number, name in enumerate(("values", "shapes", "types"), start=1):
        _field(io, name, number, _FD.TYPE_STRING)

    tensor = fdp.message_type.add()
    tensor.name = "Tensor"
    for number, name in enumerate(("tensor_id", "storage_id", "offset", "num_elem", "elem_bytes"), 1):
        _field(tensor, name, number, _FD.TYPE_UINT64)
    _field(tensor, "device", 6, _FD.TYPE_STRING)

    node = fdp.message_type.add()
    node.name = "Node"
    _field(node, "id", 1, _FD.TYPE_UINT64)
    _field(node, "name", 2, _FD.TYPE_STRING)
    _field(node, "type", 3, _FD.TYPE_ENUM, type_name="NodeType")
    _field(node, "ctrl_deps", 4, _FD.TYPE_UINT64, _FD.LABEL_REPEATED)
    _field(node, "data_deps", 5, _FD.TYPE_UINT64, _FD.LABEL_REPEATED)
    _field(node, "start_time_micros", 6, _FD.TYPE_UINT64)
    _field(node, "duration_micros", 7, _FD.TYPE_UINT64)
    _field(node, "inputs", 8, _FD.TYPE_MESSAGE, type_name="IOInfo")
    _field(node, "outputs", 9, _FD.TYPE_MESSAGE, type_name="IOInfo")
    _field(node, "attr", 10, _FD.TYPE_MESSAGE, _FD.LABEL_REPEATED, "AttributeProto")
    return fdp


def _build_classes() -> dict[str, type]:
    # A private pool: never collides with a genuine Chakra et_def_pb2 loaded in the same process.
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file_descriptor())
    get_class = getattr(message_factory, "GetMessageClass", None)
    factory = None if get_class else message_factory.MessageFactory(pool)
    classes = {}
    for name in ["AttributeProto", "GlobalMetadata", "IOInfo", "Tensor", "Node"] + [
        list_name for _, _, list_name in _ATTR_SCALARS
    ]:
        desc = pool.FindMessageTypeByName(f"{_PACKAGE}.{name}")
        classes[name] = get_class(desc) if get_class else factory.GetPrototype(desc)
    return classes


_CLASSES = _build_classes()
AttributeProto = _CLASSES["AttributeProto"]
GlobalMetadata = _CLASSES["GlobalMetadata"]
IOInfo = _CLASSES["IOInfo"]
Tensor = _CLASSES["Tensor"]
Node = _CLASSES["Node"]
DoubleList = _CLASSES["DoubleList"]
FloatList = _CLASSES["FloatList"]
Int32List = _CLASSES["Int32List"]
Int64List = _CLASSES["Int64List"]
Uint32List = _CLASSES["Uint32List"]
Uint64List = _CLASSES["Uint64List"]
Sint32List = _CLASSES["Sint32List"]
Sint64List = _CLASSES["Sint64List"]
Fixed32List = _CLASSES["Fixed32List"]
Fixed64List = _CLASSES["Fixed64List"]
Sfixed32List = _CLASSES["Sfixed32List"]
Sfixed64List = _CLASSES["Sfixed64List"]
BoolList = _CLASSES["BoolList"]
StringList = _CLASSES["StringList"]
BytesList = _CLASSES["BytesList"]

# Enum values as module constants, as protoc output provides them.
for _number, _name in enumerate(NODE_TYPES):
    globals()[_name] = _number
for _number, _name in enumerate(COLLECTIVE_TYPES):
    globals()[_name] = _number
