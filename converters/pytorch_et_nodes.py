"""PyTorch ET nodes one at a time: what the reader takes of each node before the nodes are in id order.

:func:`~ettools.converters.pytorch_et.read_et_rank` reads each node's attributes
(:func:`node_attrs`), its IOInfo strings and tensor keys (:func:`node_io`), all of which the graph
keeps, then numbers rows, columns and tensors in id order (:func:`add_attrs`, ``_EtRank.rows_of``).
From a whole parsed document it does so node by node in id order. On a file whose ``nodes`` are
parsed a slice at a time (:class:`ettools.json_chunks.ItemChunks`; issue 26: a whole parse holds
every node's nested lists, ~8x the text), :func:`read_chunks` checks (:func:`node_head`) and reads
each node into a :class:`NodeRecord` as its slice is parsed, in file order, and the node object is
dropped, but for the few that later passes read again. Any problem there raises, and the caller
reads the file again as a whole document, so that errors are those of the whole read.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from ettools.errors import TraceError
from ettools.etvalues import walk_tensors
from ettools.io import short
from ettools.json_chunks import ItemChunks

PG_INIT_NAME = "## process_group:init ##"
_ROOT_PREFIXES = ("[pytorch|profiler|execution_trace|", "[pytorch|profiler|execution_graph|")

# ET attribute type -> Chakra AttributeProto value field.
_ATTR_KINDS = {
    "uint64": "int64_val",
    "int64": "int64_val",
    "uint32": "int64_val",
    "int32": "int64_val",
    "int": "int64_val",
    "bool": "bool_val",
    "double": "double_val",
    "float": "double_val",
    "string": "string_val",
}
# Keys of a 1.0.1 node that are structure, not attributes.
_FLAT_STRUCTURE = {
    "id", "name", "parent", "ctrl_deps", "inputs", "input_shapes", "input_types",
    "outputs", "output_shapes", "output_types", "input_strides", "output_strides",
}

_TENSOR_DTYPE = re.compile(r"Tensor\((.*?)\)(?=,|\]|$)")


def tensor_keys(path: Path, values: list, shapes: list, types: list, checked: dict[tuple, tuple]) -> list[tuple]:
    """The tensors of an IOInfo, each as its key ``(tensor_id, storage_id, offset, numel, itemsize,
    device, "Tensor(<dtype>)", shape)`` (which tensor rows are keyed by): a pure function of the
    node, so that it can run before the rows are numbered. Each key is checked once (``checked``:
    keys already checked, each kept once and shared). A value that is no tensor raises
    TypeError/ValueError; a tensor whose numbers no int64 holds, :class:`TraceError`."""
    out: list[tuple] = []
    nt, ns = len(types), len(shapes)
    for k, v in enumerate(values):
        if type(v) is not list:
            continue
        t = types[k] if k < nt else ""
        if "Tensor" not in t:
            continue
        s = shapes[k] if k < ns else None
        if t[:7] == "Tensor(" and len(v) == 6 and type(v[5]) is str:  # the common case: one tensor
            found = [(v, s)]
            tkeys = [t]
        else:
            found = []
            walk_tensors(v, s, found)
            dtypes = _TENSOR_DTYPE.findall(t)
            if len(dtypes) != len(found):
                dtypes = [""] * len(found)
            tkeys = [f"Tensor({dt})" for dt in dtypes]
        for (tv, shape), tkey in zip(found, tkeys):
            key = (*tv, tkey, tuple(shape) if type(shape) is list else ())
            known = checked.get(key)  # (hashing raises TypeError for a value no key can hold)
            if known is None:
                _check_tensor(path, key)
                known = checked[key] = key
            key[3] * key[4]  # noqa: B018  (bytes: what the rows take; raises as reading them would)
            out.append(known)
    return out


def _check_tensor(path: Path, key: tuple) -> None:
    """Refuse a tensor whose numbers the tensor table's columns cannot hold."""
    tid, sid, off, numel, itemsize, dev = key[:6]
    shp = key[7]
    ints = (tid, sid, off, numel, itemsize)
    if not all(type(x) is int and -(1 << 63) <= x < (1 << 63) for x in ints) \
            or not 0 <= itemsize < (1 << 31) or not 0 <= numel * itemsize < (1 << 63) \
            or any(type(x) is int and not -(1 << 63) <= x < (1 << 63) for x in shp):
        # the tensor table's columns: int64 ids/offset/numel/bytes/dims, int32 item size
        tv = key[:6]
        raise TraceError(path, f"tensor [{', '.join(short(x, 40) for x in tv)}] of shape "
                         f"[{', '.join(short(x, 30) for x in shp[:8])}]: [id, storage, offset, numel, itemsize, device] must be "
                         "integers within int64 (item size within int32, numel x itemsize and dims too)")


def _io_triplet(node: dict, side: str, flat: bool, path: Path, index: int) -> tuple[list, list, list]:
    """(values, shapes, types) of ``inputs`` or ``outputs`` in either schema family."""
    if flat:
        values = node.get(side, [])
        shapes = node.get(f"{side[:-1]}_shapes", [])
        types = node.get(f"{side[:-1]}_types", [])
    else:
        io = node.get(side)
        if io is None:
            return [], [], []
        if type(io) is not dict:
            raise TraceError(path, f"node {index} (id {node.get('id')}): '{side}' is not an object")
        values = io.get("values", [])
        shapes = io.get("shapes", [])
        types = io.get("types", [])
    if type(values) is not list or type(shapes) is not list or type(types) is not list:
        raise TraceError(path, f"node {index} (id {node.get('id')}): malformed '{side}'")
    return values, shapes, types


_NO_TYPE = object()  # an ET attribute without "type"


def node_attrs(path: Path, n: dict, i: int, nid: int, flat: bool) -> tuple:
    """The attributes of node ``i`` as one flat tuple (name, ET type or None, value, name, …), in
    order (the last of one name wins, as in a dict); a malformed ``attrs`` list raises."""
    if flat:
        return tuple(x for k, v in n.items() if k not in _FLAT_STRUCTURE for x in (k, None, v))
    out: list[Any] = []
    try:
        for a in n.get("attrs", ()):
            k, v = a["name"], a["value"]
            hash(k)  # a name no dict can hold: malformed
            out += (k, a.get("type", _NO_TYPE), v)
    except (KeyError, TypeError, AttributeError):
        raise TraceError(path, f"node {i} (id {nid}): malformed 'attrs' list") from None
    return tuple(out)


def add_attrs(path: Path, acols: dict[str, tuple[str, list[int], list[Any]]], items: tuple, row: int,
              i: int, nid: int, flat: bool) -> None:
    """Append node ``row``'s attributes (:func:`node_attrs`) to their columns, a column's kind from
    the ET type (the Python type in 1.0.1 files) of the first node that has it."""
    kinds = _ATTR_KINDS
    try:
        for j in range(0, len(items), 3):
            k, t, v = items[j], items[j + 1], items[j + 2]
            col = acols.get(k)
            if col is not None:
                col[1].append(row)
                col[2].append(v)
            elif flat:
                acols[k] = (_py_kind(v), [row], [v])
            else:
                if type(k) is not str:  # checked once per new name: attribute names sort as text
                    raise TraceError(path, f"node {i} (id {nid}): attribute name {short(k, 60)} is not a string")
                if t is _NO_TYPE:
                    raise KeyError("type")
                acols[k] = (kinds.get(t, ""), [row], [v])
    except (KeyError, TypeError):
        raise TraceError(path, f"node {i} (id {nid}): malformed 'attrs' list") from None


def node_io(path: Path, n: dict, i: int, nid: int, flat: bool, checked: dict[tuple, tuple]) -> tuple:
    """(input IOInfo strings, output IOInfo strings, input tensor keys, output tensor keys, input
    values, input types) of node ``i`` (strings as Chakra's converter writes them, ``str()``)."""
    if flat:
        iv, ish, ity = _io_triplet(n, "inputs", True, path, i)
        ov, osh, oty = _io_triplet(n, "outputs", True, path, i)
    else:
        io = n.get("inputs")
        if io is None:
            iv, ish, ity = [], [], []
        elif type(io) is dict and type(iv := io.get("values", [])) is list \
                and type(ish := io.get("shapes", [])) is list and type(ity := io.get("types", [])) is list:
            pass
        else:
            iv, ish, ity = _io_triplet(n, "inputs", False, path, i)
        io = n.get("outputs")
        if io is None:
            ov, osh, oty = [], [], []
        elif type(io) is dict and type(ov := io.get("values", [])) is list \
                and type(osh := io.get("shapes", [])) is list and type(oty := io.get("types", [])) is list:
            pass
        else:
            ov, osh, oty = _io_triplet(n, "outputs", False, path, i)
    its, ots = str(ity), str(oty)
    try:
        tin = tensor_keys(path, iv, ish, ity, checked) if "Tensor" in its else []
        tout = tensor_keys(path, ov, osh, oty, checked) if "Tensor" in ots else []
    except (TypeError, ValueError) as e:
        raise TraceError(path, f"node {i} (id {nid}): malformed tensor value ({e})") from None
    return (str(iv), str(ish), its), (str(ov), str(osh), ots), tin, tout, iv, ity


class NodeRecord:
    """What pass 2 reads of one node, read before the nodes are in id order: its attributes
    (:func:`node_attrs`), IOInfo (:func:`node_io`), and the node itself only where the
    communication pass reads it again (``c10d::`` ops; else a stand-in with its name)."""

    __slots__ = ("attrs", "io", "node")

    def __init__(self, attrs: tuple, io: tuple, node: dict) -> None:
        self.attrs, self.io, self.node = attrs, io, node


def node_head(path: Path, n: Any, i: int, flat: bool) -> tuple[int, int, str, int]:
    """(id, file index, name, parent id or -1) of node ``i``, checked."""
    if type(n) is not dict:
        raise TraceError(path, f"node {i}: not a JSON object")
    nid = n.get("id")
    if type(nid) is not int or nid < 0:
        raise TraceError(path, f"node {i}: missing or invalid 'id'")
    name = n.get("name")
    if type(name) is not str:
        raise TraceError(path, f"node {i} (id {nid}): missing or invalid 'name'")
    parent = n.get("parent" if flat else "ctrl_deps", -1)
    if type(parent) is not int:
        parent = -1
    return nid, i, name, parent


def _py_kind(v: Any) -> str:
    """Chakra value field for a plain JSON value of a 1.0.1 node ("" when it needs ``str``)."""
    t = type(v)
    if t is int:
        return "int64_val"
    if t is str:
        return "string_val"
    if t is bool:
        return "bool_val"
    if t is float:
        return "double_val"
    return ""


def read_chunks(path: Path, chunks: ItemChunks, flat: bool) -> tuple[list[tuple[int, int, str, int, Any]], int]:
    """(id, file index, name, parent, record or node) of every node in file order, and how many."""
    out: list[tuple[int, int, str, int, Any]] = []
    checked: dict[tuple, tuple] = {}  # tensor keys checked, each kept once (tensors recur)
    names: dict[str, str] = {}  # attribute names, types and string values, kept once (they recur)
    i = 0
    for chunk in chunks:
        for n in chunk:
            nid, _, name, parent = node_head(path, n, i, flat)
            if name.startswith(_ROOT_PREFIXES) or name == PG_INIT_NAME:
                out.append((nid, i, name, parent, n))  # dropped, its groups read later: kept whole
            else:
                attrs = tuple(names.setdefault(x, x) if type(x) is str else x
                              for x in node_attrs(path, n, i, nid, flat))
                ins, outs, tin, tout, iv, ity = node_io(path, n, i, nid, flat, checked)
                comm = name == "record_param_comms" or name.startswith("c10d::")
                io = (ins, outs, tin, tout, iv if comm else [], ity if comm else [])
                out.append((nid, i, sys.intern(name), parent,
                            NodeRecord(attrs, io, n if comm else {"name": name})))
            i += 1
        del chunk
    return out, i
