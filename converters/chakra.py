"""Chakra execution traces (``.et``, schema 0.0.4): streaming reader and vectorized writer.

A Chakra trace is one file per rank, ``<prefix>.<rank>.et``: a stream of varint-length-prefixed
protobuf messages, a ``GlobalMetadata`` first and then one ``Node`` per frame (see
``../shared/notes/chakra-format.md``), plain or gzipped, plus a ``comm_group.json`` naming the
members of each communicator.

Mapping between a Chakra ``Node`` and a row of :class:`~ettools.graph.RankGraph` (one mapping,
used by both this module and :mod:`ettools.converters.chakra_json`):

* ``id``, ``name``, ``type``, ``start_time_micros`` → ``start`` (NaN for every node when all are
  0: the file has no start times), ``duration_micros`` → ``dur``;
  ``data_deps`` → :attr:`EdgeKind.DATA` edges, ``ctrl_deps`` → :attr:`EdgeKind.CTRL` edges (each
  list keeps its order; the writer writes every non-DATA kind as ``ctrl_deps``).
* Attributes with a column: ``is_cpu_op``, ``num_ops``, ``tensor_size``, ``comm_type``,
  ``comm_size`` → ``comm_bytes``, ``pg_name`` → ``comm_group``, ``comm_tag``, ``resource`` (an
  ettools extension, ``string_val``), and ``comm_src``/``comm_dst`` → ``comm_peer`` (the side that
  is not the file's own rank, on SEND/RECV nodes). A value a column cannot hold (wrong field
  kind, out of range, a second copy on the same node, src/dst not naming the own rank) stays a
  sparse attribute instead, so nothing is lost. A field kind other than the one ASTRA-sim reads
  is remembered per rank in ``RankGraph.meta["chakra_attr_kinds"]`` and reused by the faithful
  writer.
* Every other attribute → a sparse :class:`~ettools.graph.AttrColumn` of the same name whose
  ``kind`` is its value field (``"int64_val"``, ``"bool_list"`` with a list value, …; ``"none"``
  for an attribute with no value). Should one name come with several kinds in a rank, the first
  kind keeps the plain name and the others are stored as ``"<name>@<kind>"`` (the writer strips
  the suffix). ``AttributeProto.doc_string`` is not kept.
* ``inputs``/``outputs`` (``IOInfo``) → attribute columns ``"inputs"``/``"outputs"`` of kind
  ``"io"`` holding ``(values, shapes, types)``, only when not all empty.
* ``GlobalMetadata`` → ``RankGraph.meta["chakra_metadata"] = {"version": str, "attr":
  [(name, kind, value), ...]}``, written back as read. Reader notes (a zero-length frame ending
  the stream early) go to ``RankGraph.meta["chakra_notes"]``.

The writer has two modes. ``strict=True`` (everything ettools builds) writes what ASTRA-sim
accepts: no METADATA/INVALID nodes (dropped, their dependencies passed on to their dependents),
no dangling, self or duplicate dependencies (dropped and counted), the value kinds of the
table in chakra-format.md, and every COMM_COLL with ``comm_type``, ``comm_size`` and ``pg_name``
(every SEND/RECV with peer, size and tag) or a ``ValueError`` naming the node. Process groups
get decimal keys of one width, ``"1"``, ``"2"``, … (``"10"``, ``"11"``, … from 10 groups on) in
natural order of their names (``"2"`` before ``"10"``, then text) and ``pg_name`` is that key; one
width lets ranks that differ only in their groups be written as one encoding with the keys
patched (see :class:`_SharedEncodings`). ``strict=False`` writes a foreign Chakra file's nodes
as read (group names verbatim). Both emit nodes in ascending id order and produce the same
bytes for the same graph. The node bytes are built column-wise by
:mod:`ettools.converters.chakra_wire`, not one protobuf message at a time; they equal what
the protobuf runtime serializes for the same message (tested byte for byte).

The reader splits frames itself and decodes the nodes in bulk with numpy
(:mod:`ettools.converters.chakra_decode`); a file with encodings that decoder leaves alone
(unknown fields, a repeated singular field, ...) is decoded one ``pb.Node`` at a time instead,
which gives identical graphs (``RankGraph.meta["chakra_decoder"]`` says which ran). Bad input
raises :class:`~ettools.errors.TraceError` naming the file and the frame number and byte offset.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from google.protobuf.message import DecodeError

from ettools.converters import chakra_wire as w
from ettools.errors import TraceError
from ettools.graph import (
    COMM_NODE_TYPES,
    NODE_COLUMNS,
    AttrColumn,
    CollectiveType,
    EdgeKind,
    NodeType,
    ProcessGroup,
    RankGraph,
    StringTable,
    Trace,
    TraceMeta,
    content_identity,
    structure_identity,
)
from ettools.io import OutputSet, load_json, read_bytes
from ettools.schema import et_def_pb2 as pb

log = logging.getLogger(__name__)
Seg = w.Seg

DEFAULT_VERSION = "0.0.4"
COMM_GROUP_FILE = "comm_group.json"
# nodes encoded per array of frames: the encoding's temporaries cost ~1.2 KB per node (65,536 nodes:
# ~80 MB, the peak of a whole convert); 8,192 keep them ~10 MB at the same CPU time (issue 26)
CHUNK_NODES = 1 << 13

# ---- attribute value kinds --------------------------------------------------------------------
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


# ---- paths -------------------------------------------------------------------------------------
_ET_SUFFIXES = (".et", ".et.gz")


def rank_of(path: Path) -> int | None:
    """Rank number in a file name (``trace.3.et``, ``rank3.et``), if any."""
    from ettools.formats import rank_from_name

    return rank_from_name(path)


def resolve_rank_files(paths: list[Path] | Path, suffixes: tuple[str, ...] = _ET_SUFFIXES) -> list[tuple[int, Path]]:
    """``(rank, file)`` pairs from files and/or directories of ``<prefix>.<rank><suffix>`` files.

    A single file whose name has no number is rank 0.
    """
    items = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    files: list[Path] = []
    for p in items:
        if p.is_dir():
            kids = sorted(
                q for q in p.iterdir()
                if q.is_file() and not q.name.startswith(".") and q.name.endswith(suffixes)
            )
            if not kids:
                raise TraceError(p, f"directory holds no {' or '.join(suffixes)} files")
            files.extend(kids)
        elif p.is_file():
            files.append(p)
        else:
            raise TraceError(p, "no such file or directory")
    if not files:
        raise TraceError(items[0] if items else ".", "no input files")
    out: list[tuple[int, Path]] = []
    seen: dict[int, Path] = {}
    for f in files:
        r = rank_of(f)
        if r is None:
            if len(files) > 1:
                raise TraceError(f, "cannot tell the rank from the file name (expected <prefix>.<rank>.et)")
            r = 0
        if r in seen:
            raise TraceError(f, f"rank {r} given twice (also {seen[r]})")
        seen[r] = f
        out.append((r, f))
    return sorted(out)


def read_comm_groups(path: Path, meta: TraceMeta) -> None:
    """Add the groups of a ``comm_group.json`` (``{"1": [0, 1], ...}``) to ``meta``."""
    obj = load_json(path)
    if not isinstance(obj, dict):
        raise TraceError(path, "expected an object mapping group ids to lists of ranks")
    for key in sorted(obj, key=natural_key):
        ranks = obj[key]
        if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0
                                                  for r in ranks):
            raise TraceError(path, f"group {key!r}: expected a list of non-negative integer ranks")
        try:
            meta.add_group(ProcessGroup(name=str(key), ranks=tuple(ranks)))
        except ValueError as e:
            raise TraceError(path, str(e)) from None
        if ranks:
            meta.world_size = max(meta.world_size, max(ranks) + 1)


def natural_key(s: str) -> tuple:
    """Sort key putting ``"2"`` before ``"10"`` (numbers by value, then text)."""
    parts = re.split(r"(\d+)", s)
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts if p != "")


# ---- reading -----------------------------------------------------------------------------------
def frame_bounds(data: bytes, path: Path, notes: list[str] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(offsets, payload starts, payload ends)`` of every frame of a Chakra stream, as arrays.

    Frame ``k`` (numbered from 1 in messages) starts at byte ``offsets[k-1]`` with its length
    varint. Raises :class:`TraceError` for an empty stream, a truncated or overlong length
    varint, or a frame running past the end. A zero-length frame after the first ends the
    stream (as in Chakra's reader); that is recorded in ``notes``. A zero-length first frame
    is an empty GlobalMetadata.
    """
    n = len(data)
    if n == 0:
        raise TraceError(path, "empty file: no GlobalMetadata frame")
    offsets: list[int] = []
    off_append = offsets.append
    pos = 0
    while pos < n:
        b = data[pos]
        if b < 0x80 and b:  # lengths below 128 and 16384: the common cases, decoded inline
            off_append(pos)
            pos += 1 + b
            continue
        if b and pos + 1 < n and data[pos + 1]:
            b2 = data[pos + 1]
            if b2 < 0x80:
                off_append(pos)
                pos += 2 + ((b & 0x7F) | (b2 << 7))
                continue
        length, head = _slow_varint(data, pos, len(offsets) + 1, path)
        if length == 0 and offsets:
            if notes is not None:
                notes.append(
                    f"zero-length frame {len(offsets) + 1} at byte offset {pos} ends the stream"
                    + (f"; {n - head} following bytes ignored" if head < n else "")
                )
            return _bounds(data, offsets, pos)
        off_append(pos)
        pos = head + length
    if pos > n:
        last = offsets[-1]
        length, head = _slow_varint(data, last, len(offsets), path)
        raise TraceError(
            path,
            f"frame {len(offsets)} at byte offset {last} declares {length} bytes but only {n - head} "
            "remain (file cut short?)",
        )
    return _bounds(data, offsets, pos)


def _bounds(data: bytes, offsets: list[int], end: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Frame offsets -> ``(offsets, payload starts, payload ends)``; frames are contiguous."""
    off = np.asarray(offsets, np.int64)
    ends = np.empty_like(off)
    ends[:-1] = off[1:]
    if len(off):
        ends[-1] = end
    # payload starts after each length varint: its size from the stop bit of its bytes
    raw = np.frombuffer(data, np.uint8)
    size = np.ones(len(off), np.int64)
    cont = raw[off] >= 0x80
    k = 1
    while cont.any():
        size += cont
        nxt = np.minimum(off + k, len(raw) - 1)
        cont &= raw[nxt] >= 0x80
        k += 1
    return off, off + size, ends


def _slow_varint(data: bytes, pos: int, index: int, path: Path) -> tuple[int, int]:
    start = pos
    value = shift = 0
    n = len(data)
    while True:
        if pos >= n:
            raise TraceError(path, f"frame {index} at byte offset {start}: length varint truncated by end of file")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise TraceError(path, f"frame {index} at byte offset {start}: malformed length varint")


def iter_frames(data: bytes, path: Path, notes: list[str] | None = None) -> Iterator[tuple[int, int, bytes]]:
    """``(frame number from 1, byte offset, payload)`` of every frame (see :func:`frame_bounds`)."""
    offsets, starts, ends = frame_bounds(data, path, notes)
    for k, (off, a, b) in enumerate(zip(offsets.tolist(), starts.tolist(), ends.tolist())):
        yield k + 1, off, data[a:b]


def _parse(cls: Any, payload: bytes, path: Path, index: int, offset: int) -> Any:
    msg = cls()
    try:
        msg.ParseFromString(payload)
    except (DecodeError, RuntimeError, ValueError) as e:
        what = "GlobalMetadata" if cls is pb.GlobalMetadata else "Node"
        raise TraceError(path, f"frame {index} at byte offset {offset} does not parse as {what} ({e})") from None
    return msg


def metadata_to_dict(gm: Any) -> dict[str, Any]:
    """``GlobalMetadata`` as ``{"version": str, "attr": [(name, kind, value), ...]}``."""
    return {"version": gm.version, "attr": [(a.name, *attr_value(a)) for a in gm.attr]}


def metadata_message(meta: dict[str, Any] | None, strict: bool) -> Any:
    """The ``GlobalMetadata`` to write: the source's (version and attributes) when known."""
    gm = pb.GlobalMetadata()
    if meta:
        gm.version = meta.get("version", "") or ("" if not strict else DEFAULT_VERSION)
        for name, kind, value in meta.get("attr", ()):
            gm.attr.append(attr_message(name, kind, value))
    else:
        gm.version = DEFAULT_VERSION
    if gm.ByteSize() == 0:  # a zero-length frame would read as end of stream
        gm.version = DEFAULT_VERSION
    return gm


# GlobalMetadata attributes ettools writes and reads back into ``RankGraph.meta`` (name -> meta key):
# whether the node durations are estimates (a synthesizer's) and for which device, the synthesizer's
# peak memory of the rank, which ranks a partial write holds ("0-63,100") and the rank's FLOPs per
# iteration under the model-FLOPs convention (the MFU numerator; a double: it can pass 2^63).
SYNTH_META_ATTRS: dict[str, tuple[str, str]] = {
    "ettools_durations": ("durations", "string_val"),
    "ettools_estimated_for": ("estimated_for", "string_val"),
    "ettools_peak_memory_bytes": ("peak_memory_bytes", "int64_val"),
    "ettools_ranks_written": ("ranks_written", "string_val"),
    "ettools_model_flops": ("model_flops", "double_val"),
    "ettools_emulated_gpu": ("emulated_gpu", "string_val"),
}


def synth_metadata(meta: dict[str, Any], version: str = DEFAULT_VERSION) -> dict[str, Any]:
    """A ``chakra_metadata`` dict carrying the :data:`SYNTH_META_ATTRS` present in ``meta``."""
    attrs = []
    for name, (key, kind) in SYNTH_META_ATTRS.items():
        v = meta.get(key)
        if v is not None:
            attrs.append((name, kind, int(v) if kind == "int64_val" else float(v) if kind == "double_val" else str(v)))
    return {"version": version, "attr": attrs}


def _apply_synth_metadata(g: RankGraph) -> None:
    """Copy the :data:`SYNTH_META_ATTRS` of the file's GlobalMetadata into ``g.meta``."""
    md = g.meta.get("chakra_metadata") or {}
    for name, _kind, value in md.get("attr", ()):
        spec = SYNTH_META_ATTRS.get(name)
        if spec is not None and value is not None:
            g.meta[spec[0]] = value


def parse_rank_list(text: str) -> list[int]:
    """``"0-3,8"`` -> ``[0, 1, 2, 3, 8]``."""
    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def format_rank_list(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``."""
    rs = sorted(set(int(r) for r in ranks))
    parts: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(parts)


def missing_ranks(trace: Trace) -> list[int]:
    """Ranks of the job whose file is absent: ranks ``0 .. world-1`` (world from the file names and
    ``comm_group.json``), or the ranks a partial write says it wrote, minus the ranks read."""
    declared: set[int] = set()
    for g in trace.graphs.values():
        if g.meta.get("ranks_written"):
            declared.update(parse_rank_list(g.meta["ranks_written"]))
    want = declared or set(range(trace.meta.world_size))
    return sorted(want - set(trace.graphs))


@dataclass
class _AttrAcc:
    rows: Any = field(default_factory=list)  # list or int64 array of node rows
    values: list[Any] = field(default_factory=list)


@dataclass
class Collected:
    """The fields of a rank's nodes, gathered by a decoder before the graph is built.

    ``dep_id`` holds every node's data deps then its ctrl deps; ``dep_counts`` is ``(n, 2)``:
    the number of each. ``attrs`` maps ``(name, kind)`` to the rows and values carrying it, in
    order of first appearance; ``io`` maps ``"inputs"``/``"outputs"`` to non-empty IOInfo tuples.
    """

    ids: np.ndarray
    names: np.ndarray
    types: np.ndarray
    starts: np.ndarray
    durs: np.ndarray
    dep_id: np.ndarray
    dep_counts: np.ndarray
    attrs: dict[tuple[str, str], _AttrAcc]
    io: dict[str, _AttrAcc]


def collect_messages(nodes: Iterable[Any], strings: StringTable) -> Collected:
    """Gather the fields of ``pb.Node`` messages (the reference decoder; JSON uses it too)."""
    ids: list[int] = []
    names: list[int] = []
    types: list[int] = []
    starts: list[int] = []
    durs: list[int] = []
    dep_ids: list[int] = []
    dep_counts: list[int] = []  # per node: number of data deps, number of ctrl deps
    attrs: dict[tuple[str, str], _AttrAcc] = {}
    io: dict[str, _AttrAcc] = {"inputs": _AttrAcc(), "outputs": _AttrAcc()}
    intern = strings.intern
    ids_append, names_append, types_append = ids.append, names.append, types.append
    starts_append, durs_append = starts.append, durs.append
    dep_extend, cnt_append = dep_ids.extend, dep_counts.append
    attrs_get = attrs.get
    row = 0
    for node in nodes:
        ids_append(node.id)
        names_append(intern(node.name))
        types_append(node.type)
        starts_append(node.start_time_micros)
        durs_append(node.duration_micros)
        dd = node.data_deps
        cd = node.ctrl_deps
        dep_extend(dd)
        dep_extend(cd)
        cnt_append(len(dd))
        cnt_append(len(cd))
        for a in node.attr:
            kind = a.WhichOneof("value")
            if kind is None:
                kind, v = "none", None
            else:
                v = getattr(a, kind)
                if kind[-1] == "t":  # *_list
                    v = list(v.values)
            key = (a.name, kind)
            acc = attrs_get(key)
            if acc is None:
                acc = attrs[key] = _AttrAcc()
            acc.rows.append(row)
            acc.values.append(v)
        for fname in IO_ATTRS:
            if node.HasField(fname):
                m = getattr(node, fname)
                t = (m.values, m.shapes, m.types)
                if t[0] or t[1] or t[2]:
                    acc = io[fname]
                    acc.rows.append(row)
                    acc.values.append(t)
        row += 1
    return Collected(
        ids=np.asarray(ids, np.uint64),
        names=np.asarray(names, np.int32),
        types=np.asarray(types, np.int64),
        starts=np.asarray(starts, np.float64),
        durs=np.asarray(durs, np.float64),
        dep_id=np.asarray(dep_ids, np.uint64),
        dep_counts=np.asarray(dep_counts, np.int64).reshape(row, 2),
        attrs=attrs,
        io=io,
    )


def build_rank_graph(
    col: Collected, rank: int, strings: StringTable, path: Path, meta: dict[str, Any] | None = None,
    first_frame: int | None = 2,
) -> RankGraph:
    """The rank graph of collected node fields: the one Chakra Node -> graph mapping.

    ``first_frame`` is the frame number of the first node in error messages (None: say the
    node's index instead, as for JSON).
    """
    n = len(col.ids)
    type_arr = col.types
    bad = np.flatnonzero((type_arr < 0) | (type_arr > max(NodeType)))
    if len(bad):
        k = int(bad[0])
        where = f"frame {k + first_frame}" if first_frame is not None else f"node {k}"
        raise TraceError(path, f"{where} (node id {int(col.ids[k])}) has unknown node type {int(type_arr[k])}")
    starts = np.asarray(col.starts, np.float64)
    if n and not starts.any():
        # every start_time_micros is 0: the file carries no start times (Chakra's converter and
        # synthesizers leave them unset), so none is claimed — a replay must not call them measured
        starts = np.full(n, np.nan)
    durs = np.asarray(col.durs, np.float64)
    comm = (type_arr >= NodeType.COMM_SEND_NODE) & (type_arr <= NodeType.COMM_COLL_NODE)
    if n and (comm & (durs == 0)).any():
        # proto3 cannot tell an unset duration_micros from 0, and no transfer takes 0 µs: a
        # collective or send/recv written with 0 has no known time (the network model times it)
        durs = np.where(comm & (durs == 0), np.nan, durs)
    columns: dict[str, np.ndarray] = {
        "id": col.ids,
        "name": col.names,
        "type": type_arr.astype(np.uint8),
        "start": starts,
        "dur": durs,
    }
    for c, (dtype, absent) in NODE_COLUMNS.items():
        columns.setdefault(c, np.full(n, absent, dtype))
    counts = col.dep_counts.reshape(-1)
    dep_kind = np.repeat(np.tile(np.array([EdgeKind.DATA, EdgeKind.CTRL], np.uint8), n), counts)
    dep_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(col.dep_counts.sum(axis=1), out=dep_ptr[1:])
    rmeta: dict[str, Any] = dict(meta or {})
    attr_cols, kinds = _attrs_to_columns(col.attrs, col.io, columns, rank, strings)
    if kinds:
        rmeta["chakra_attr_kinds"] = kinds
    return RankGraph(rank, strings, columns, dep_ptr, col.dep_id, dep_kind, attr_cols, meta=rmeta)


def nodes_to_graph(
    nodes: Iterable[Any], rank: int, strings: StringTable, path: Path, meta: dict[str, Any] | None = None,
    first_frame: int | None = 2,
) -> RankGraph:
    """Build the rank graph of a stream of ``pb.Node`` messages (see :func:`build_rank_graph`)."""
    return build_rank_graph(collect_messages(nodes, strings), rank, strings, path, meta, first_frame)


def _int_values(values: Any) -> tuple[np.ndarray, np.ndarray]:
    """Integers (a list, or an array from the bulk decoder) as ``int64`` plus a mask of those that fit."""
    arr = np.asarray(values)
    if arr.dtype.kind in "bi" or (arr.dtype.kind == "u" and arr.dtype.itemsize < 8):
        return arr.astype(np.int64), np.ones(len(arr), bool)
    if arr.dtype == np.uint64:
        ok = arr <= np.uint64(_I63)
        return np.where(ok, arr, 0).astype(np.int64), ok
    ok = np.array([isinstance(v, int) and -(1 << 63) <= v <= _I63 for v in values], bool)
    return np.array([v if o else 0 for v, o in zip(values, ok)], np.int64), ok


def _first_per_row(rows: np.ndarray) -> np.ndarray:
    first = np.ones(len(rows), bool)
    first[1:] = rows[1:] != rows[:-1]
    return first


def _attrs_to_columns(
    attrs: dict[tuple[str, str], _AttrAcc],
    io: dict[str, _AttrAcc],
    columns: dict[str, np.ndarray],
    rank: int,
    strings: StringTable,
) -> tuple[dict[str, AttrColumn], dict[str, str]]:
    """Move column attributes into ``columns``; the rest become sparse AttrColumns."""
    kinds: dict[str, str] = {}
    # Entries still to place, per attribute name, kinds in first-seen order.
    left: dict[str, list[tuple[str, np.ndarray, Any, np.ndarray]]] = {}
    for (name, kind), acc in attrs.items():
        left.setdefault(name, []).append((kind, np.asarray(acc.rows, np.int64), acc.values,
                                          np.ones(len(acc.rows), bool)))

    def pick(name: str, accept: frozenset[str] | set[str]) -> tuple[str, np.ndarray, list[Any], np.ndarray] | None:
        for entry in left.get(name, ()):
            if entry[0] in accept:
                return entry
        return None

    for name, (col, canon, lo, hi) in INT_COLUMN_ATTRS.items():
        entry = pick(name, INT_KINDS)
        if entry is None:
            continue
        kind, rows, values, unplaced = entry
        vals, ok = _int_values(values)
        take = ok & (vals >= lo) & (vals <= hi) & _first_per_row(rows)
        if take.any():
            columns[col][rows[take]] = vals[take]
            unplaced &= ~take
            if kind != canon:
                kinds[name] = kind
    for name, col in STR_COLUMN_ATTRS.items():
        entry = pick(name, {"string_val"})
        if entry is None:
            continue
        kind, rows, values, unplaced = entry
        take = _first_per_row(rows)
        idx = np.flatnonzero(take)
        ids = {v: strings.intern(v) for v in dict.fromkeys(values)}  # intern each distinct value once
        columns[col][rows[idx]] = [ids[values[i]] for i in idx.tolist()]
        unplaced &= ~take

    src, dst = pick("comm_src", INT_KINDS), pick("comm_dst", INT_KINDS)
    if src is not None and dst is not None:
        _peer_columns(src, dst, columns, rank, kinds)

    out: dict[str, AttrColumn] = {}
    for fname, acc in io.items():
        if len(acc.rows):
            out[fname] = AttrColumn("io", np.asarray(acc.rows, np.int64), acc.values)
    for name, entries in left.items():
        for kind, rows, values, unplaced in entries:
            if not unplaced.any():
                continue
            if isinstance(values, np.ndarray):
                vals = (values if unplaced.all() else values[unplaced]).tolist()
            elif unplaced.all():
                vals = values
            else:
                vals = [v for v, u in zip(values, unplaced.tolist()) if u]
            key = name if name not in out else f"{name}@{kind}"
            out[key] = AttrColumn(kind, rows[unplaced], vals)
    return out, kinds


def _peer_columns(src: tuple, dst: tuple, columns: dict[str, np.ndarray], rank: int, kinds: dict[str, str]) -> None:
    """comm_src/comm_dst of SEND/RECV nodes -> comm_peer, when one side is the file's own rank."""
    s_kind, s_rows, s_values, s_unplaced = src
    d_kind, d_rows, d_values, d_unplaced = dst
    s_vals, s_ok = _int_values(s_values)
    d_vals, d_ok = _int_values(d_values)
    s_first, d_first = _first_per_row(s_rows), _first_per_row(d_rows)
    s_idx = np.flatnonzero(s_ok & s_first)
    d_idx = np.flatnonzero(d_ok & d_first)
    both, si, di = np.intersect1d(s_rows[s_idx], d_rows[d_idx], assume_unique=True, return_indices=True)
    si, di = s_idx[si], d_idx[di]
    t = columns["type"][both]
    sv, dv = s_vals[si], d_vals[di]
    send = (t == NodeType.COMM_SEND_NODE) & (sv == rank) & (dv >= 0) & (dv <= _I31)
    recv = (t == NodeType.COMM_RECV_NODE) & (dv == rank) & (sv >= 0) & (sv <= _I31)
    take = send | recv
    if not take.any():
        return
    columns["comm_peer"][both[take]] = np.where(send, dv, sv)[take]
    s_unplaced[si[take]] = False
    d_unplaced[di[take]] = False
    if s_kind != PEER_KIND:
        kinds["comm_src"] = s_kind
    if d_kind != PEER_KIND:
        kinds["comm_dst"] = d_kind


def read_chakra_file(path: Path, rank: int, strings: StringTable, fast: bool = True,
                     stamped: _StampedFiles | None = None) -> RankGraph:
    """One ``.et`` file (plain or gzip) as the graph of ``rank``.

    ``fast`` decodes the nodes in bulk (:mod:`ettools.converters.chakra_decode`), falling back
    to one protobuf message per node for anything unusual; ``fast=False`` always uses protobuf.
    ``stamped``: files read before; a file equal to one of them but for its group keys and peers
    (ranks a writer stamped from one graph) shares that graph's arrays instead of being decoded.
    """
    from ettools.converters.chakra_decode import collect_wire

    path = Path(path)
    data = read_bytes(path)
    if stamped is not None:
        g = stamped.graph(data, path, rank)
        if g is not None:
            return g
    notes: list[str] = []
    offsets, starts, ends = frame_bounds(data, path, notes)
    gm = _parse(pb.GlobalMetadata, data[starts[0] : ends[0]], path, 1, int(offsets[0]))
    col = collect_wire(data, starts[1:], ends[1:], strings) if fast else None
    decoder = "bulk" if col is not None else "protobuf"
    if col is None:
        nodes = (
            _parse(pb.Node, data[a:b], path, k + 2, off)
            for k, (off, a, b) in enumerate(zip(offsets[1:].tolist(), starts[1:].tolist(), ends[1:].tolist()))
        )
        col = collect_messages(nodes, strings)
    meta = {"chakra_metadata": metadata_to_dict(gm), "source_file": str(path), "chakra_decoder": decoder}
    meta.update(take_ettools_metadata(meta["chakra_metadata"]))  # steps, stream gap, launch queue
    g = build_rank_graph(col, rank, strings, path, meta)
    g = restore_launch_edges(g)
    _apply_synth_metadata(g)
    if notes:
        g.meta["chakra_notes"] = notes
        for note in notes:
            log.warning("%s: %s", path, note)
    if stamped is not None and decoder == "bulk":
        stamped.add(data, g, starts, ends)
    return g


_PG_SITE = re.compile(re.escape(b"\x0a\x07pg_name\xea\x01"))  # AttributeProto name + string_val key
_SRC_SITE = re.compile(re.escape(b"\x0a\x08comm_src\x38"))  # name + int32_val key
_DST_SITE = re.compile(re.escape(b"\x0a\x08comm_dst\x38"))


class _StampedFile:
    """A decoded rank file whose ``pg_name`` values and ``comm_src``/``comm_dst`` varints sit at known
    byte ranges: a later file of the same length whose bytes differ only inside those ranges is the
    same graph with other groups and peers (arrays shared with this one, no decoding)."""

    def __init__(self, data: bytes, g: RankGraph, starts: np.ndarray, ends: np.ndarray) -> None:
        self.ok = False
        if {"pg_name", "comm_src", "comm_dst"} & set(g.attrs) or "chakra_notes" in g.meta:
            return  # some value was not placed in a column: the full decoder's business
        self.g = g
        self.arr = np.frombuffer(data, np.uint8)
        self.pg_rows = np.flatnonzero(g.comm_group >= 0)
        self.p2p_rows = np.flatnonzero(g.comm_peer >= 0)
        mask = np.zeros(len(data), bool)
        pg = self._sites(data, _PG_SITE, self.pg_rows, starts, ends, 1)
        src = self._sites(data, _SRC_SITE, self.p2p_rows, starts, ends, 0)
        dst = self._sites(data, _DST_SITE, self.p2p_rows, starts, ends, 0)
        if pg is None or src is None or dst is None:
            return
        (self.pg_pos, self.pg_len), (self.src_pos, self.src_len), (self.dst_pos, self.dst_len) = pg, src, dst
        strings = g.strings
        if any(data[a:a + n] != strings[int(i)].encode() for a, n, i in
               zip(self.pg_pos.tolist(), self.pg_len.tolist(), g.comm_group[self.pg_rows].tolist())):
            return
        self.send = g.type[self.p2p_rows] == NodeType.COMM_SEND_NODE
        src_v, dst_v = self._varints(self.arr, self.src_pos, self.src_len), self._varints(self.arr, self.dst_pos,
                                                                                             self.dst_len)
        if src_v is None or dst_v is None:
            return
        peer = g.comm_peer[self.p2p_rows]
        if not (np.where(self.send, src_v, dst_v) == g.rank).all() or not (np.where(self.send, dst_v, src_v)
                                                                              == peer).all():
            return
        for pos, lens in ((self.pg_pos, self.pg_len), (self.src_pos, self.src_len), (self.dst_pos, self.dst_len)):
            if len(pos):
                mask[np.repeat(pos, lens) + (np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens))] = True
        self.mask = mask
        self.ok = True

    @staticmethod
    def _sites(data: bytes, pat: re.Pattern, rows: np.ndarray, starts: np.ndarray, ends: np.ndarray,
               prefixed: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(value offsets, lengths) of ``pat``'s values, one in the frame of each of ``rows`` (file
        order), or None. ``prefixed``: a one-byte length precedes the value (a string), else a varint."""
        hits = np.array([m.end() for m in pat.finditer(data)], np.int64)
        if len(hits) != len(rows) or (len(rows) and not ((starts[rows + 1] <= hits) & (hits < ends[rows + 1])).all()):
            return None
        b = np.frombuffer(data, np.uint8)
        if prefixed:
            lens = b[np.minimum(hits, len(b) - 1)].astype(np.int64)
            if (lens >= 0x80).any():
                return None
            return hits + 1, lens
        lens = np.ones(len(hits), np.int64)
        more = (b[np.minimum(hits, len(b) - 1)] & 0x80) != 0
        k = 1
        while more.any() and k < 10:
            lens += more
            more &= (b[np.minimum(hits + k, len(b) - 1)] & 0x80) != 0
            k += 1
        return hits, lens

    @staticmethod
    def _varints(b: np.ndarray, pos: np.ndarray, lens: np.ndarray) -> np.ndarray | None:
        """Values of the varints at ``pos`` that each take exactly ``lens`` bytes (else None)."""
        v = np.zeros(len(pos), np.uint64)
        for k in range(int(lens.max(initial=0))):
            on = lens > k
            byte = b[pos[on] + k]
            cont = (byte & 0x80) != 0
            if (cont != (lens[on] > k + 1)).any():
                return None
            v[on] |= (byte & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        return v.astype(np.int64)

    def graph(self, data: bytes, path: Path, rank: int) -> RankGraph | None:
        """``data`` (as rank ``rank``) as this file's graph with its own groups and peers, or None."""
        b = np.frombuffer(data, np.uint8)
        if not self.mask[np.flatnonzero(b != self.arr)].all():
            return None
        g = self.g
        cols: dict[str, np.ndarray] = {}
        if len(self.p2p_rows):
            src_v, dst_v = self._varints(b, self.src_pos, self.src_len), self._varints(b, self.dst_pos, self.dst_len)
            if src_v is None or dst_v is None:
                return None
            own, peer = np.where(self.send, src_v, dst_v), np.where(self.send, dst_v, src_v)
            if (own != rank).any() or (peer < 0).any() or (peer > _I31).any():
                return None
            col = g.comm_peer.copy()
            col[self.p2p_rows] = peer
            cols["comm_peer"] = col
        if len(self.pg_rows):
            keys = [data[a:a + n] for a, n in zip(self.pg_pos.tolist(), self.pg_len.tolist())]
            try:
                ids = {k: g.strings.intern(k.decode()) for k in dict.fromkeys(keys)}
            except UnicodeDecodeError:
                return None
            col = g.comm_group.copy()
            col[self.pg_rows] = [ids[k] for k in keys]
            cols["comm_group"] = col
        h = g.replace(**cols)
        h.rank = int(rank)
        h.meta["source_file"] = str(path)
        return h


class _StampedFiles:
    """Rank files read so far that later files may be stamped from (see :class:`_StampedFile`)."""

    _PER_LENGTH = 4  # templates of one byte length tried at most
    _LIMIT = 1 << 28  # template bytes kept at most

    def __init__(self) -> None:
        self.by_len: dict[int, list[_StampedFile]] = {}
        self.size = 0

    def graph(self, data: bytes, path: Path, rank: int) -> RankGraph | None:
        """The graph of ``data`` stamped from a kept file, or None."""
        for t in self.by_len.get(len(data), ()):
            g = t.graph(data, path, rank)
            if g is not None:
                return g
        return None

    def add(self, data: bytes, g: RankGraph, starts: np.ndarray, ends: np.ndarray) -> None:
        """Keep ``g`` (decoded from ``data``) for later files, if it qualifies and room is left."""
        same = self.by_len.setdefault(len(data), [])
        if len(same) >= self._PER_LENGTH or self.size + len(data) > self._LIMIT:
            return
        t = _StampedFile(data, g, starts, ends)
        if t.ok:
            same.append(t)
            self.size += len(data)


def read_chakra(paths: list[Path] | Path, comm_group: Path | None = None, fast: bool = True,
                check_ranks: bool = False) -> Trace:
    """Read Chakra ``.et`` files into a :class:`Trace`.

    ``paths`` is one file, several, or directories of ``<prefix>.<rank>.et`` files (plain or
    gzip, detected from content); the rank comes from the file name (a single file without a
    number is rank 0). Process groups come from ``comm_group`` or a ``comm_group.json`` beside
    the files. Bad input raises :class:`TraceError` naming the file and frame/byte offset.
    ``check_ranks``: a job whose rank files are not all there (:func:`missing_ranks`) is bad input.
    """
    from ettools.progress import progress

    files = resolve_rank_files(paths)
    strings = StringTable()
    meta = TraceMeta(world_size=1, source="chakra")
    graphs: dict[int, RankGraph] = {}
    stamped = _StampedFiles() if fast else None
    for rank, f in progress(files, "reading Chakra", total=len(files), unit="file"):
        g = read_chakra_file(f, rank, strings, fast, stamped)
        graphs[rank] = g
        meta.world_size = max(meta.world_size, rank + 1)
        meta.extra.setdefault("chakra_version", g.meta["chakra_metadata"]["version"])
    group_files = [Path(comm_group)] if comm_group is not None else sorted(
        {f.parent / COMM_GROUP_FILE for _, f in files if (f.parent / COMM_GROUP_FILE).is_file()}
    )
    for gf in group_files:
        read_comm_groups(gf, meta)
    trace = Trace(meta, graphs, strings)
    if check_ranks:
        gone = missing_ranks(trace)
        if gone:
            where = files[0][1].parent
            raise TraceError(where, f"rank files missing for ranks {format_rank_list(gone)} of {meta.world_size} "
                                    f"(a replay would time their collectives wrongly); pass "
                                    f"--allow-missing-ranks to read the ranks present")
    return trace


# ---- writing -----------------------------------------------------------------------------------
@dataclass
class WriteStats:
    """What the strict writer changed, summed over ranks."""

    nodes: int = 0
    dropped_nodes: int = 0  # METADATA/INVALID nodes left out
    passed_through_deps: int = 0  # dependencies inherited from a dropped node
    dangling_deps: int = 0
    self_deps: int = 0
    duplicate_deps: int = 0
    dropped_attrs: int = 0  # sparse copies of column attributes left out (strict)

    def as_dict(self) -> dict[str, int]:
        """The counts as a dict."""
        return dict(self.__dict__)


def group_keys(meta: TraceMeta, strict: bool) -> dict[str, str]:
    """Process-group name -> the key written as ``pg_name`` and in ``comm_group.json``.

    Strict: decimal keys of one width (``"1"`` … ``"9"``; ``"10"`` … ``"99"`` for 10 to 90
    groups; ``"100"`` … for more), in natural order of the names: every rank's ``pg_name`` bytes
    then have the same length, so ranks that differ only in their groups share one encoding with
    the keys patched in. Keys are ``> 0`` (ASTRA-sim reads them as group ids). Faithful: the
    names themselves.
    """
    names = sorted(meta.process_groups, key=natural_key)
    if strict:
        width = 1
        while 9 * 10 ** (width - 1) < len(names):
            width += 1
        base = 10 ** (width - 1)
        return {nm: str(base + i) for i, nm in enumerate(names)}
    return {nm: nm for nm in names}


def comm_group_json(meta: TraceMeta, keys: dict[str, str]) -> bytes:
    """``comm_group.json`` bytes: ``{key: [global ranks]}`` in key order."""
    obj = {keys[nm]: list(meta.process_groups[nm].ranks) for nm in keys}
    return orjson.dumps(obj) + b"\n"


def _strict_edges(g: RankGraph, keep_row: np.ndarray, stats: WriteStats) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edges ``(owner row, dep id, is_data)`` for the strict writer, in owner-major stored order.

    Dependencies on dropped nodes are replaced by the dropped node's own dependencies
    (transitively, in place); dangling, self and duplicate dependencies are removed.
    """
    deg = np.diff(g.dep_ptr)
    n = len(g)
    all_src = g.rows_of(g.dep_id) if len(g.dep_id) else np.zeros(0, np.int64)
    all_data = np.isin(g.dep_kind, _DATA_DEP_KINDS)
    owner = np.repeat(np.arange(n, dtype=np.int64), deg)
    sel = keep_row[owner]
    e_owner, e_id, e_src, e_data = owner[sel], g.dep_id[sel], all_src[sel], all_data[sel]
    dropped = ~keep_row
    limit = int(dropped.sum()) + 1
    rounds = 0
    while len(e_src):
        via = np.zeros(len(e_src), bool)
        has = e_src >= 0
        via[has] = dropped[e_src[has]]
        if not via.any():
            break
        rounds += 1
        if rounds > limit:  # a cycle among dropped nodes: nothing more to inherit
            keep = ~via
            e_owner, e_id, e_src, e_data = e_owner[keep], e_id[keep], e_src[keep], e_data[keep]
            break
        parents = np.flatnonzero(via)
        p_rows = e_src[parents]
        cnt = deg[p_rows]
        total = int(cnt.sum())
        child = np.repeat(g.dep_ptr[p_rows] - np.concatenate(([0], np.cumsum(cnt)[:-1])), cnt) + np.arange(total)
        kept = np.flatnonzero(~via)
        k1 = np.concatenate((kept, np.repeat(parents, cnt)))
        k2 = np.concatenate((np.zeros(len(kept), np.int64), np.arange(total) + 1))
        o = np.lexsort((k2, k1))
        stats.passed_through_deps += total
        e_owner = np.concatenate((e_owner[kept], np.repeat(e_owner[parents], cnt)))[o]
        e_id = np.concatenate((e_id[kept], g.dep_id[child]))[o]
        e_src = np.concatenate((e_src[kept], all_src[child]))[o]
        e_data = np.concatenate((e_data[kept], np.repeat(e_data[parents], cnt) & all_data[child]))[o]
    dangling = e_src < 0
    self_dep = e_src == e_owner
    stats.dangling_deps += int(dangling.sum())
    stats.self_deps += int(self_dep.sum())
    keep = ~(dangling | self_dep)
    e_owner, e_id, e_data = e_owner[keep], e_id[keep], e_data[keep]
    if len(e_id):
        o = np.lexsort((e_data, e_id, e_owner))  # stable: first of equal edges comes first
        s_owner, s_id, s_data = e_owner[o], e_id[o], e_data[o]
        dup = np.zeros(len(o), bool)
        dup[1:] = (s_owner[1:] == s_owner[:-1]) & (s_id[1:] == s_id[:-1]) & (s_data[1:] == s_data[:-1])
        if dup.any():
            stats.duplicate_deps += int(dup.sum())
            keep = np.ones(len(o), bool)
            keep[o[dup]] = False
            e_owner, e_id, e_data = e_owner[keep], e_id[keep], e_data[keep]
    return e_owner, e_id, e_data


def _node_label(g: RankGraph, row: int) -> str:
    return f"rank {g.rank}: node {int(g.columns['id'][row])} ({g.name_of(row)!r})"


def _check_strict(g: RankGraph, rows: np.ndarray, meta: TraceMeta, check_groups: bool = True) -> None:
    """Refuse comm nodes a simulator cannot run (raises ValueError naming the first); ``check_groups``:
    also that every group named is defined and holds the rank."""
    c = g.columns
    t = c["type"][rows]
    coll = t == NodeType.COMM_COLL_NODE
    p2p = (t == NodeType.COMM_SEND_NODE) | (t == NodeType.COMM_RECV_NODE)
    checks = [
        (coll, "comm_type", c["comm_type"][rows] < 0),
        (coll | p2p, "comm_size", c["comm_bytes"][rows] < 0),
        (coll, "pg_name (process group)", c["comm_group"][rows] < 0),
        (p2p, "peer (comm_src/comm_dst)", c["comm_peer"][rows] < 0),
        (p2p, "comm_tag", c["comm_tag"][rows] < 0),
    ]
    for on, what, missing in checks:
        bad = np.flatnonzero(on & missing)
        if len(bad):
            row = int(rows[bad[0]])
            raise ValueError(
                f"{_node_label(g, row)} is a {NodeType(int(c['type'][row])).name} without {what} "
                f"({len(bad)} such node(s) in the rank)"
            )
    ct = c["comm_type"][rows]
    bad = np.flatnonzero(coll & (ct > max(CollectiveType)))
    if len(bad):
        row = int(rows[bad[0]])
        raise ValueError(f"{_node_label(g, row)} has unknown collective type {int(c['comm_type'][row])}")
    tags = c["comm_tag"][rows]
    bad = np.flatnonzero(tags > _I31)
    if len(bad):
        row = int(rows[bad[0]])
        raise ValueError(f"{_node_label(g, row)} has comm_tag {int(tags[bad[0]])}, beyond int32")
    groups = c["comm_group"][rows]
    used = np.unique(groups[groups >= 0]) if check_groups else groups[:0]
    for gid in used.tolist():
        gname = g.strings[gid]
        row = int(rows[np.flatnonzero(groups == gid)[0]])
        pg = meta.process_groups.get(gname)
        if pg is None:
            raise ValueError(
                f"{_node_label(g, row)} names process group {gname!r}, which the trace does not define"
            )
        if g.rank not in pg.ranks:
            raise ValueError(
                f"{_node_label(g, row)} names process group {gname!r}, whose ranks {list(pg.ranks)} "
                f"do not include rank {g.rank}"
            )


# Attribute sources: the entries of one attribute over the emitted nodes.
@dataclass
class _AttrSource:
    pos: np.ndarray  # emission positions, ascending
    encode: Any  # (k0, k1) -> Seg of complete field-10 (or IOInfo field) entries


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


def _time_us(col: np.ndarray) -> np.ndarray:
    v = np.where(np.isfinite(col) & (col > 0), col, 0.0)
    return np.rint(v).astype(np.uint64)


# ---- measured time kept: unbiased durations, steps, the device's per-op gap -------------------
# GlobalMetadata attributes (an ettools extension; ASTRA-sim ignores GlobalMetadata attributes):
STEP_NAMES_ATTR = "ettools_step_names"  # string_list: ProfilerStep names, in order
STEP_START_ATTR = "ettools_step_start_us"  # double_list: their starts, on the file's start_time clock
STEP_END_ATTR = "ettools_step_end_us"  # double_list: their ends
STREAM_GAP_ATTR = "ettools_stream_gap_us"  # double_val: per-op device gap left out of duration_micros
LAUNCH_NAMES_ATTR = "ettools_launch_typical_names"  # string_list: launch calls (runtime call names)
LAUNCH_US_ATTR = "ettools_launch_typical_us"  # double_list: their median unblocked duration
LAUNCH_DEPTH_ATTR = "ettools_launch_queue_depth"  # int64_val: the launch queue depth the trace showed
RANK_CLOCK_ATTR = "ettools_rank_clock"  # string_val: start_time_micros of all ranks on one clock ("common",
# "collectives") or each rank's own ("none"), as the Kineto reader placed them (rank skew)
ETTOOLS_META_ATTRS = frozenset({STEP_NAMES_ATTR, STEP_START_ATTR, STEP_END_ATTR, STREAM_GAP_ATTR,
                                LAUNCH_NAMES_ATTR, LAUNCH_US_ATTR, LAUNCH_DEPTH_ATTR, RANK_CLOCK_ATTR})
STREAM_GAP_META = "chakra_stream_gap_us"  # RankGraph.meta key of the gap read back
LAUNCH_TYPICAL_META = "launch_typical_us"  # RankGraph.meta: {launch call name: µs} (replay's launch queue)
# A device op's dependency on the host op that launched it is a data dependency, as in Chakra's own
# converter (a GPU node's data_deps name its CPU op); other non-DATA kinds are ctrl_deps.
_DATA_DEP_KINDS = (EdgeKind.DATA, EdgeKind.LAUNCH)


def restore_launch_edges(g: RankGraph) -> RankGraph:
    """In a file ettools wrote from a measured trace (its GlobalMetadata has the launch attributes),
    a data dependency of a device node on a host node is the launch: give it back its kind."""
    if LAUNCH_TYPICAL_META not in g.meta or not len(g.dep_id):
        return g
    src, dst, kind = g.edge_rows()
    ok = src >= 0
    launch = ok & (kind == EdgeKind.DATA)
    launch[ok] &= (g.is_cpu_op[src[ok]] == 1) & (g.is_cpu_op[dst[ok]] == 0)
    if not launch.any():
        return g
    # edge_rows lists edges in stored (owner-major) order, the order of dep_kind
    out = g.replace()
    out.dep_kind = np.where(launch, np.uint8(EdgeKind.LAUNCH), g.dep_kind).astype(g.dep_kind.dtype)
    return out


def included_stream_gap(g: RankGraph) -> float:
    """µs that :func:`ettools.replayable.to_replayable` added to every device op's ``dur`` of ``g``
    (its ``meta["replayable"]["stream_gap_us"]``), 0 for any other graph."""
    rep = g.meta.get("replayable")
    gap = rep.get("stream_gap_us") if isinstance(rep, dict) else None
    return float(gap) if gap is not None and np.isfinite(gap) and gap > 0 else 0.0


def diffused_us(dur: np.ndarray, lane: np.ndarray, start: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Durations as integer µs without bias: error diffusion along each lane.

    Within a lane (nodes sorted by start time, then id) node ``i`` gets
    ``round(S_i) - round(S_{i-1})`` with ``S_i`` the exact running sum of the lane's durations, so
    the rounding remainder is carried to the next node: every run of consecutive nodes of a lane
    (a step, a phase) sums to within 1 µs of its exact total, however many nodes it holds (plain
    rounding biases each node by up to 0.5 µs). Non-finite and negative durations count as 0.
    Deterministic: same arrays, same result.
    """
    x = np.where(np.isfinite(dur) & (dur > 0), dur, 0.0).astype(np.float64)
    n = len(x)
    if n == 0:
        return np.zeros(0, np.uint64)
    t = np.where(np.isfinite(start), start, np.inf)
    o = np.lexsort((ids, t, lane))
    xs = x[o]
    ls = lane[o]
    first = np.ones(n, bool)
    first[1:] = ls[1:] != ls[:-1]
    # running sum restarted at every lane: subtract the lane's total before its first node
    c = np.cumsum(xs)
    seg = np.cumsum(first) - 1
    base = (c - xs)[first]
    run = c - base[seg]
    r = np.floor(run + 0.5)
    prev = np.empty(n)
    prev[1:] = r[:-1]
    prev[first] = 0.0
    out = np.empty(n, np.uint64)
    out[o] = np.maximum(r - prev, 0.0).astype(np.uint64)
    return out


def duration_lanes(g: RankGraph, rows: np.ndarray) -> np.ndarray:
    """Lane of each row for :func:`diffused_us`: its resource (thread, stream), else host or device.

    The replay's ``device_hold`` nodes (measured waits on a stream) get a lane of their own beside
    their stream's, so the stream's operators alone keep sums exact to 1 µs over any run of them.
    """
    res = g.columns["resource"][rows].astype(np.int64)
    lane = np.where(res >= 0, res, np.where(g.columns["is_cpu_op"][rows] == 1, -2, -3))
    hold = g.strings.lookup("device_hold")
    is_hold = (g.columns["name"][rows] == hold) if hold >= 0 else np.zeros(len(rows), bool)
    return lane * 2 + is_hold


def ettools_metadata_attrs(g: RankGraph) -> list[tuple[str, str, Any]]:
    """The ettools GlobalMetadata attributes of a rank: its ProfilerSteps and its stream gap."""
    out: list[tuple[str, str, Any]] = []
    steps = g.meta.get("steps") or []
    if steps:
        out.append((STEP_NAMES_ATTR, "string_list", [str(s[0]) for s in steps]))
        out.append((STEP_START_ATTR, "double_list", [float(s[1]) for s in steps]))
        out.append((STEP_END_ATTR, "double_list", [float(s[2]) for s in steps]))
    gap = included_stream_gap(g) or float(g.meta.get(STREAM_GAP_META) or 0.0)
    if gap > 0:
        out.append((STREAM_GAP_ATTR, "double_val", gap))
    typical = g.meta.get(LAUNCH_TYPICAL_META)
    if isinstance(typical, dict):
        names = sorted(typical)
        out.append((LAUNCH_NAMES_ATTR, "string_list", names))
        out.append((LAUNCH_US_ATTR, "double_list", [float(typical[k]) for k in names]))
        depth = g.meta.get("launch_queue_depth")
        if depth:
            out.append((LAUNCH_DEPTH_ATTR, "int64_val", int(depth)))
        clock = g.meta.get("rank_clock")
        if clock:
            out.append((RANK_CLOCK_ATTR, "string_val", str(clock)))
    # a rewrite's durations (a synthesizer's "estimated" travels in its own metadata)
    kept = {a[0] for a in (metadata_for(g) or {}).get("attr", ())}
    if str(g.meta.get("durations", "")) in ("rewritten", "modelled") and "ettools_durations" not in kept:
        out.append(("ettools_durations", "string_val", str(g.meta["durations"])))
    if g.meta.get("emulated_gpu") and "ettools_emulated_gpu" not in kept:
        out.append(("ettools_emulated_gpu", "string_val", str(g.meta["emulated_gpu"])))
    return out


def take_ettools_metadata(md: dict[str, Any]) -> dict[str, Any]:
    """Reader side of :func:`ettools_metadata_attrs`: removes the ettools attributes from a read
    GlobalMetadata dict (so a rewrite does not repeat them) and returns the rank meta entries
    they stand for (``steps``, :data:`STREAM_GAP_META`). Malformed ones are left in place."""
    attrs = md.get("attr") or []
    by_name = {name: (kind, value) for name, kind, value in attrs if name in ETTOOLS_META_ATTRS}
    if not by_name:
        return {}
    out: dict[str, Any] = {}
    used: set[str] = set()
    names, starts, ends = (by_name.get(a) for a in (STEP_NAMES_ATTR, STEP_START_ATTR, STEP_END_ATTR))
    if (names and starts and ends and names[0] == "string_list" and starts[0] == ends[0] == "double_list"
            and len(names[1]) == len(starts[1]) == len(ends[1])):
        # on the file's whole-µs clock: a step holds the nodes whose start_time_micros falls in it
        # (its first slice starts at the step's start, which rounds like the step's own start)
        out["steps"] = [(str(nm), float(np.rint(s)), float(np.rint(e)))
                        for nm, s, e in zip(names[1], starts[1], ends[1])]
        used |= {STEP_NAMES_ATTR, STEP_START_ATTR, STEP_END_ATTR}
    gap = by_name.get(STREAM_GAP_ATTR)
    if gap and gap[0] == "double_val" and np.isfinite(gap[1]) and gap[1] > 0:
        out[STREAM_GAP_META] = float(gap[1])
        used.add(STREAM_GAP_ATTR)
    lnames, lus = by_name.get(LAUNCH_NAMES_ATTR), by_name.get(LAUNCH_US_ATTR)
    if (lnames and lus and lnames[0] == "string_list" and lus[0] == "double_list"
            and len(lnames[1]) == len(lus[1])):
        out[LAUNCH_TYPICAL_META] = {str(k): float(v) for k, v in zip(lnames[1], lus[1])}
        used |= {LAUNCH_NAMES_ATTR, LAUNCH_US_ATTR}
        depth = by_name.get(LAUNCH_DEPTH_ATTR)
        if depth and depth[0] == "int64_val" and depth[1] > 0:
            out["launch_queue_depth"] = int(depth[1])
            used.add(LAUNCH_DEPTH_ATTR)
        clock = by_name.get(RANK_CLOCK_ATTR)
        if clock and clock[0] == "string_val":
            out["rank_clock"] = str(clock[1])
            used.add(RANK_CLOCK_ATTR)
    md["attr"] = [a for a in attrs if a[0] not in used]
    return out


# ---- ASTRA-sim's host model: one CPU node at a time per rank ------------------------------------
HOST_CHAIN_META = "astrasim_host_chain"  # RankGraph.meta: set on graphs already made one host chain


def one_host_chain(g: RankGraph) -> RankGraph:
    """The rank with the host work ASTRA-sim can run as ettools replays it.

    ASTRA-sim runs one CPU node of a rank at a time, whatever thread it came from, and rejects
    communication nodes marked as CPU ops. So: comm nodes get ``is_cpu_op = 0`` (their host thread
    still waits for them through its own dependencies); and when CPU nodes come from several
    threads, they are merged into one chain in end order made consistent with every dependency
    (:func:`_dependency_order`; each depends on the one before it,
    an ORDER edge written as a ctrl dependency). An idle ``host_gap`` node of one thread that
    other threads' work covered keeps only the part of its interval no earlier chain node
    covered (in a single chain, the other threads' work already fills it). The replay of the
    result (one lane's worth of host work) and ASTRA-sim's then run the same host timeline.
    Returns ``g`` itself when nothing changes.
    """
    if g.meta.get(HOST_CHAIN_META):
        return g
    c = g.columns
    t = c["type"]
    cpu = c["is_cpu_op"] == 1
    comm_cpu = cpu & np.isin(t, [int(x) for x in COMM_NODE_TYPES])
    host = cpu & ~comm_cpu & (t != NodeType.METADATA_NODE) & (t != NodeType.INVALID_NODE)
    rows = np.flatnonzero(host)
    threads = np.unique(c["resource"][rows]) if len(rows) else rows
    # A rank with device work keeps its threads: their concurrency feeds the device streams, and a
    # conversion must replay like its source (the chain would serialize real overlap). Host-only
    # ranks (CPU/gloo captures) become one chain.
    device = (~cpu & (t == NodeType.COMP_NODE)).any()
    if device:
        threads = threads[:1]
    if not comm_cpu.any() and len(threads) <= 1:
        return g
    cols: dict[str, np.ndarray] = {}
    if comm_cpu.any():
        cols["is_cpu_op"] = np.where(comm_cpu, 0, c["is_cpu_op"]).astype(c["is_cpu_op"].dtype)
    out = g.replace(**cols)
    if len(threads) > 1:
        start = c["start"][rows]
        dur = np.nan_to_num(c["dur"][rows], nan=0.0)
        key = _dependency_order(g)
        if key is None:  # the graph has a cycle already: leave the threads as they are
            out.meta[HOST_CHAIN_META] = True
            return out
        o = np.argsort(key[rows], kind="stable")
        chain = rows[o]
        s, d = start[o], dur[o]
        end = s + d
        frontier = np.maximum.accumulate(np.concatenate(([-np.inf], end[:-1])))
        gap_sid = g.strings.lookup("host_gap")
        if gap_sid >= 0:
            is_gap = c["name"][chain] == gap_sid
            if is_gap.any():
                covered = np.maximum(end - np.maximum(s, frontier), 0.0)
                new_dur = c["dur"].copy()
                new_dur[chain[is_gap]] = np.where(np.isfinite(s[is_gap]), covered[is_gap], new_dur[chain[is_gap]])
                out.columns["dur"] = new_dur
        # chain edges: chain[i] after chain[i-1]
        n = len(g)
        owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(g.dep_ptr))
        add_owner = chain[1:]
        add_id = c["id"][chain[:-1]].astype(np.uint64)
        all_owner = np.concatenate((owner, add_owner))
        so = np.argsort(all_owner, kind="stable")
        out.dep_id = np.concatenate((g.dep_id, add_id))[so]
        out.dep_kind = np.concatenate((g.dep_kind, np.full(len(add_id), int(EdgeKind.ORDER), np.uint8)))[so]
        out.dep_ptr = np.concatenate(([0], np.cumsum(np.bincount(all_owner, minlength=n)))).astype(np.int64)
    out.meta[HOST_CHAIN_META] = True
    return out


def _dependency_order(g: RankGraph, max_rounds: int = 10000) -> np.ndarray | None:
    """A sort key of every node that respects every dependency and otherwise follows the end times
    (then start, then id): a node ends after what it depends on, so end order is nearly right; the
    few edges it contradicts (a guessed wait whose idle gap ended before its target) are fixed by
    moving the dependent after its dependency, repeated until none is left. None on a cycle."""
    c = g.columns
    start = np.where(np.isfinite(c["start"]), c["start"], np.inf)
    fin = start + np.nan_to_num(c["dur"], nan=0.0)
    key = np.empty(len(g))
    key[np.lexsort((c["id"], start, fin))] = np.arange(len(g), dtype=np.float64)
    src, dst, _ = g.edge_rows()
    ok = src >= 0
    src, dst = src[ok], dst[ok]
    for _ in range(max_rounds):
        viol = key[src] >= key[dst]
        if not viol.any():
            return key
        np.maximum.at(key, dst[viol], key[src[viol]] + 0.5)
    return None


ASTRASIM_UNSUPPORTED = (CollectiveType.REDUCE, CollectiveType.GATHER, CollectiveType.SCATTER,
                        CollectiveType.REDUCE_SCATTER_BLOCK, CollectiveType.BARRIER)


def astrasim_world(trace: Trace, selected: list[int]) -> dict[str, Any]:
    """Whether the written set is one ASTRA-sim can run as a whole world (``ettools convert --json``):
    ``{"world", "ranks_written", "missing", "runnable", "warning"}`` (``warning`` None when runnable)."""
    world = max(int(trace.meta.world_size or 0), max(selected, default=-1) + 1)
    missing = sorted(set(range(world)) - set(selected))
    lines = [w for w in astrasim_warnings(trace, selected) if w.startswith("ASTRA-sim needs")]
    return {"world": world, "ranks_written": len(selected), "missing": format_rank_list(missing) if missing else "",
            "runnable": not lines, "warning": lines[0] if lines else None}


def astrasim_warnings(trace: Trace, selected: list[int]) -> list[str]:
    """What keeps ASTRA-sim from running the written set: ranks missing from the world (it needs a
    file for every rank and at least 2 NPUs) and collective types it does not simulate."""
    out: list[str] = []
    world = max(int(trace.meta.world_size or 0), max(selected, default=-1) + 1)
    if world < 2:
        out.append("ASTRA-sim needs at least 2 NPUs: this set has 1 rank")
    elif len(selected) < world:
        out.append(f"ASTRA-sim needs every rank: {len(selected)} of {world} ranks written "
                   f"(missing {format_rank_list(sorted(set(range(world)) - set(selected)))})")
    bad = np.asarray([int(t) for t in ASTRASIM_UNSUPPORTED])
    counts: dict[str, int] = {}
    seen: set[int] = set()
    for r in selected:
        g = trace.graphs[r]
        if id(g.columns["comm_type"]) in seen:
            continue
        seen.add(id(g.columns["comm_type"]))
        sel = (g.type == NodeType.COMM_COLL_NODE) & np.isin(g.comm_type, bad)
        for ct in g.comm_type[sel].tolist():
            counts[CollectiveType(ct).name] = counts.get(CollectiveType(ct).name, 0) + 1
    if counts:
        out.append("ASTRA-sim does not simulate " + ", ".join(f"{k} ({v} node(s))" for k, v in sorted(counts.items())))
    return out


# Collective types ASTRA-sim does not simulate, written as the family ettools' network times them
# as (replay/network.py coll_kind), so both run the same collective: a reduce or scatter moves what a
# reduce-scatter does on every link of a ring, a gather what an all-gather does, a barrier is an
# all-reduce of (almost) nothing.
ASTRASIM_LOWERING = {
    int(CollectiveType.REDUCE): int(CollectiveType.REDUCE_SCATTER),
    int(CollectiveType.SCATTER): int(CollectiveType.REDUCE_SCATTER),
    int(CollectiveType.REDUCE_SCATTER_BLOCK): int(CollectiveType.REDUCE_SCATTER),
    int(CollectiveType.GATHER): int(CollectiveType.ALL_GATHER),
    int(CollectiveType.BARRIER): int(CollectiveType.ALL_REDUCE),
}


def astrasim_min_bytes(world: int) -> int:
    """Smallest collective ASTRA-sim runs safely: its system layer splits a collective into
    ``preferred-dataset-splits`` chunks and those over the NPUs; an all-gather whose chunks fall
    below a byte per NPU loops forever (3 B on 8 NPUs) or finishes no rank (0 B). 4 KiB, or 16 B per
    rank beyond 256 ranks, covers up to 16 splits (80 ns at 50 GB/s)."""
    return max(4096, 16 * int(world))


def astrasim_collective_form(trace: Trace, ranks: list[int]) -> tuple[Trace, dict[str, int]]:
    """Collectives written so ASTRA-sim simulates them: unsupported types lowered
    (:data:`ASTRASIM_LOWERING`), all-gathers and lowered barriers floored to
    :func:`astrasim_min_bytes`. Returns the trace and ``{type name: nodes lowered}``."""
    world = max(int(trace.meta.world_size or 0), max(ranks, default=-1) + 1)
    floor = astrasim_min_bytes(world)
    src = np.asarray(list(ASTRASIM_LOWERING), np.int64)
    lut = np.arange(256, dtype=np.int64)
    lut[src] = list(ASTRASIM_LOWERING.values())
    memo: dict[tuple, RankGraph] = {}
    graphs: dict[int, RankGraph] = {}
    counts: dict[str, int] = {}
    for r in ranks:
        g = trace.graphs[r]
        k = content_identity(g)
        h = memo.get(k)
        if h is None:
            coll = g.type == NodeType.COMM_COLL_NODE
            ct = g.comm_type.astype(np.int64)
            low = coll & np.isin(ct, src)
            small = coll & (np.isin(ct, [int(CollectiveType.ALL_GATHER), int(CollectiveType.GATHER),
                                          int(CollectiveType.BARRIER)])) & (g.comm_bytes < floor)
            if not (low.any() or small.any()):
                h = g
            else:
                for t in ct[low].tolist():
                    counts[CollectiveType(t).name] = counts.get(CollectiveType(t).name, 0) + 1
                new_ct = np.where(low, lut[np.clip(ct, 0, 255)], ct).astype(g.comm_type.dtype)
                new_b = np.where(small, floor, g.comm_bytes).astype(g.comm_bytes.dtype)
                h = g.replace(comm_type=new_ct, comm_bytes=new_b)
            memo[k] = h
        elif h is not g and h.rank != r:
            h = h.with_rank(r)
        graphs[r] = h
    if all(graphs[r] is trace.graphs[r] for r in ranks):
        return trace, counts
    return Trace(trace.meta, {**trace.graphs, **graphs}, trace.strings), counts


RANK_RELEASE_NAME = "rank_release"


def _with_release_node(g: RankGraph, release_us: float, t0: float) -> RankGraph:
    """``g`` with a leading host node of ``release_us`` (start ``t0``) that every source depends on."""
    n = len(g)
    c = g.columns
    written = (c["type"] != NodeType.METADATA_NODE) & (c["type"] != NodeType.INVALID_NODE)
    src = np.flatnonzero(written & (np.diff(g.dep_ptr) == 0))
    rid = int(c["id"].max()) + 1 if n else 0
    cols = {k: np.concatenate((v, np.asarray([NODE_COLUMNS[k][1]], v.dtype))) for k, v in c.items()}
    cols["id"][n] = rid
    cols["name"][n] = g.strings.intern(RANK_RELEASE_NAME)
    cols["type"][n] = int(NodeType.COMP_NODE)
    cols["is_cpu_op"][n] = 1
    cols["start"][n] = t0
    cols["dur"][n] = release_us
    owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(g.dep_ptr))
    all_owner = np.concatenate((owner, src))
    so = np.argsort(all_owner, kind="stable")
    dep_id = np.concatenate((g.dep_id, np.full(len(src), rid, np.uint64)))[so]
    dep_kind = np.concatenate((g.dep_kind, np.full(len(src), int(EdgeKind.ORDER), np.uint8)))[so]
    dep_ptr = np.concatenate(([0], np.cumsum(np.bincount(all_owner, minlength=n + 1)))).astype(np.int64)
    ptr1 = np.concatenate((g.in_ptr, g.in_ptr[-1:])) if len(g.in_ptr) == n + 1 else None
    ptr2 = np.concatenate((g.out_ptr, g.out_ptr[-1:])) if len(g.out_ptr) == n + 1 else None
    return RankGraph(g.rank, g.strings, cols, dep_ptr, dep_id, dep_kind, dict(g.attrs), g.tensors,
                     ptr1, g.in_tensor, ptr2, g.out_tensor, dict(g.meta))


def astrasim_release_form(trace: Trace, ranks: list[int]) -> Trace:
    """Rank skew written so ASTRA-sim runs it: ASTRA-sim starts every rank at time 0, while ettools
    replays a measured set's ranks from their first event on the job's clock (a rank that entered
    the step late holds its peers in collectives). A rank whose first written event is ``d`` µs
    after the earliest rank's gets a leading host node ``rank_release`` of ``d`` µs that every
    source depends on, starting where the earliest rank starts — read back, every rank starts
    together and that node replays the skew, in ettools and in ASTRA-sim alike. Only ranks whose
    start times are on one clock (``rank_clock`` written) and all known qualify."""
    firsts: dict[int, float] = {}
    for r in ranks:
        g = trace.graphs[r]
        if not (isinstance(g.meta.get(LAUNCH_TYPICAL_META), dict) and g.meta.get("rank_clock")):
            continue
        c = g.columns
        written = (c["type"] != NodeType.METADATA_NODE) & (c["type"] != NodeType.INVALID_NODE)
        st = c["start"][written]
        if not len(st) or not np.isfinite(st).all():
            continue
        firsts[r] = float(_time_us(st).min())  # the whole-µs start the file will say
    if len(firsts) < 2:
        return trace
    t0 = min(firsts.values())
    graphs = {r: _with_release_node(trace.graphs[r], f - t0, t0) for r, f in firsts.items() if f - t0 >= 1}
    if not graphs:
        return trace
    return Trace(trace.meta, {**trace.graphs, **graphs}, trace.strings)


def astrasim_host_form(trace: Trace, ranks: list[int] | None = None) -> Trace:
    """:func:`one_host_chain` of every rank (once per distinct graph: ranks sharing every array
    share the result, so stamped-out ranks still encode once)."""
    memo: dict[tuple, RankGraph] = {}
    graphs: dict[int, RankGraph] = {}
    changed = False
    for r in (trace.ranks if ranks is None else ranks):
        g = trace.graphs[r]
        k = content_identity(g)
        h = memo.get(k)
        if h is None:
            h = memo[k] = one_host_chain(g)
        elif h.rank != r:
            h = h.with_rank(r)
        changed |= h is not g
        graphs[r] = h
    if not changed:
        return trace
    return Trace(trace.meta, {**trace.graphs, **graphs}, trace.strings)


class _RankEncoder:
    """Turns one rank graph into Chakra frames, a chunk of nodes at a time."""

    def __init__(self, g: RankGraph, meta: TraceMeta, keys: dict[str, str], strict: bool,
                 stats: WriteStats, name_field: _StringField, check_groups: bool = True) -> None:
        self.g = g
        self.strict = strict
        c = g.columns
        n = len(g)
        types = c["type"]
        if strict:
            keep_row = (types != NodeType.METADATA_NODE) & (types != NodeType.INVALID_NODE)
            stats.dropped_nodes += int(n - keep_row.sum())
        else:
            keep_row = np.ones(n, bool)
        rows = np.flatnonzero(keep_row)
        order = rows[np.argsort(c["id"][rows], kind="stable")]
        self.order = order
        self.m = len(order)
        stats.nodes += self.m
        pos_of_row = np.full(n, -1, np.int64)
        pos_of_row[order] = np.arange(self.m)
        if strict:
            ids = c["id"][order]
            dup = np.flatnonzero(ids[1:] == ids[:-1])
            if len(dup):
                raise ValueError(f"rank {g.rank}: node id {int(ids[dup[0]])} is used by more than one node")
            _check_strict(g, order, meta, check_groups)
            e_owner, e_id, e_data = _strict_edges(g, keep_row, stats)
        else:
            e_owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(g.dep_ptr))
            e_id, e_data = g.dep_id, np.isin(g.dep_kind, _DATA_DEP_KINDS)
        e_pos = pos_of_row[e_owner]
        o = np.argsort(e_pos, kind="stable")
        self.e_pos, self.e_id, self.e_data = e_pos[o], e_id[o], e_data[o]

        self.name_field = name_field
        self.cols = {k: c[k][order] for k in ("id", "name", "type")}
        self.start = _time_us(c["start"][order])
        dur = c["dur"][order]
        gap = included_stream_gap(g)
        if gap:
            # measured device time in duration_micros; the gap goes to GlobalMetadata
            dur = np.where(c["is_cpu_op"][order] == 0, dur - gap, dur)
        self.dur = diffused_us(dur, duration_lanes(g, order), c["start"][order], self.cols["id"])
        self.sources = self._attr_sources(g, meta, keys, pos_of_row, stats)

    # -- attributes ----------------------------------------------------------------------------
    def _kind(self, attr: str) -> str:
        canon = canonical_kind(attr)
        assert canon is not None
        if self.strict:
            return canon
        return self.g.meta.get("chakra_attr_kinds", {}).get(attr, canon)

    def _column_source(self, attr: str, values: np.ndarray, present: np.ndarray) -> _AttrSource:
        pos = np.flatnonzero(present)
        vals = values[pos]
        kind = self._kind(attr)
        return _AttrSource(pos, lambda k0, k1: attr_entries(attr, kind, vals[k0:k1]))

    def _string_source(self, attr: str, ids: np.ndarray, rename: dict[str, str] | None) -> _AttrSource:
        pos = np.flatnonzero(ids >= 0)
        sids = ids[pos]
        inner = _StringField(self.g.strings, w.tag(_ATTR_FIELDS["string_val"], w.WT_LEN), False, rename)
        head = _attr_prefix(attr, "string_val")

        def encode(k0: int, k1: int) -> Seg:
            part = sids[k0:k1]
            body = w.concat([w.const_all(head, len(part)), inner.seg(part)])
            return w.length_delimited(_ATTR_KEY, body, np.ones(len(part), bool))

        return _AttrSource(pos, encode)

    def _attr_sources(self, g: RankGraph, meta: TraceMeta, keys: dict[str, str], pos_of_row: np.ndarray,
                      stats: WriteStats) -> list[_AttrSource]:
        c = g.columns
        order = self.order
        out: list[_AttrSource] = []
        io: dict[str, _AttrSource] = {}
        for attr, (col, _canon, _lo, _hi) in INT_COLUMN_ATTRS.items():
            v = c[col][order]
            if attr == "comm_tag":
                continue  # written after the peers, below
            out.append(self._column_source(attr, v, v >= 0))
            if attr == "comm_size":
                groups = c["comm_group"][order]
                out.append(self._string_source("pg_name", groups, keys if self.strict else None))
        t = c["type"][order]
        peer = c["comm_peer"][order].astype(np.int64)
        p2p = ((t == NodeType.COMM_SEND_NODE) | (t == NodeType.COMM_RECV_NODE)) & (peer >= 0)
        send = t == NodeType.COMM_SEND_NODE
        rank = np.int64(g.rank)
        out.append(self._column_source("comm_src", np.where(send, rank, peer), p2p))
        out.append(self._column_source("comm_dst", np.where(send, peer, rank), p2p))
        tag_col = c["comm_tag"][order]
        out.append(self._column_source("comm_tag", tag_col, tag_col >= 0))
        out.append(self._string_source("resource", c["resource"][order], None))

        for key, col in g.attrs.items():
            name, suffix = split_attr_key(key)
            if col.kind == "io" and name in IO_ATTRS and suffix is None:
                src = self._sparse(col, pos_of_row, lambda vals, name=name: _io_entries(name, vals))
                if src is not None:
                    io[name] = src
                continue
            if self.strict and name in COLUMN_ATTR_NAMES:
                stats.dropped_attrs += len(col.rows)
                continue
            kind = col.kind
            src = self._sparse(col, pos_of_row, lambda vals, name=name, kind=kind: attr_entries(name, kind, vals))
            if src is not None:
                out.append(src)
        self.io = [io.get("inputs"), io.get("outputs")]
        return out

    @staticmethod
    def _sparse(col: AttrColumn, pos_of_row: np.ndarray, enc: Any) -> _AttrSource | None:
        rows = np.asarray(col.rows, np.int64)
        pos = pos_of_row[rows] if len(rows) else rows
        sel = np.flatnonzero(pos >= 0)
        if not len(sel):
            return None
        o = sel[np.argsort(pos[sel], kind="stable")]
        values = col.values
        if len(o) == len(values) and (o == np.arange(len(o))).all():
            vals = values
        else:
            vals = [values[i] for i in o.tolist()]
        p = pos[o]
        if isinstance(vals, np.ndarray):
            vals = vals.tolist()
        return _AttrSource(p, lambda k0, k1: enc(vals[k0:k1]))

    # -- nodes ---------------------------------------------------------------------------------
    def chunks(self, chunk: int = CHUNK_NODES) -> Iterator[np.ndarray]:
        """Frames of the nodes, ``chunk`` nodes per array of bytes."""
        for a in range(0, self.m, chunk):
            b = min(a + chunk, self.m)
            yield self._encode(a, b)

    def _placed(self, src: _AttrSource | None, a: int, b: int) -> Seg | None:
        if src is None:
            return None
        k0, k1 = np.searchsorted(src.pos, [a, b])
        if k0 == k1:
            return None
        return w.scatter(src.encode(int(k0), int(k1)), src.pos[k0:k1] - a, b - a)

    def _encode(self, a: int, b: int) -> np.ndarray:
        m = b - a
        ids = self.cols["id"][a:b]
        types = self.cols["type"][a:b]
        segs: list[Seg] = [
            w.varint_field(1, ids, ids != 0),
            self.name_field.seg(self.cols["name"][a:b]),
            w.varint_field(3, types, types != 0),
        ]
        e0, e1 = np.searchsorted(self.e_pos, [a, b])
        e_pos, e_id, e_data = self.e_pos[e0:e1] - a, self.e_id[e0:e1], self.e_data[e0:e1]
        ctrl = ~e_data
        segs.append(w.packed_field(4, e_pos[ctrl], e_id[ctrl], m))
        segs.append(w.packed_field(5, e_pos[e_data], e_id[e_data], m))
        start, dur = self.start[a:b], self.dur[a:b]
        segs.append(w.varint_field(6, start, start != 0))
        segs.append(w.varint_field(7, dur, dur != 0))
        for src in self.io + self.sources:
            s = self._placed(src, a, b)
            if s is not None:
                segs.append(s)
        lens = np.sum([w.lengths(s) for s in segs], axis=0)
        if (lens == 0).any():
            row = int(self.order[a + int(np.flatnonzero(lens == 0)[0])])
            raise ValueError(
                f"{_node_label(self.g, row)} has only default fields: its empty frame would end the stream"
            )
        return w.frames(segs)[0]


def metadata_for(g: RankGraph) -> dict[str, Any] | None:
    """The Chakra GlobalMetadata kept on a rank graph, if it was read from Chakra."""
    return g.meta.get("chakra_metadata")


def encode_rank(g: RankGraph, meta: TraceMeta, keys: dict[str, str], strict: bool, stats: WriteStats,
                name_field: _StringField | None = None, check_groups: bool = True) -> Iterator[bytes | np.ndarray]:
    """The bytes of one rank's ``.et`` stream: GlobalMetadata frame, then node frames in chunks.
    ``check_groups=False`` skips the check that the rank belongs to the groups it names (for a
    probe encoding with other ranks)."""
    gm_msg = metadata_message(metadata_for(g), strict)
    for name, kind, value in ettools_metadata_attrs(g):
        gm_msg.attr.append(attr_message(name, kind, value))
    gm = gm_msg.SerializeToString()
    yield w.varint_bytes(len(gm)) + gm
    enc = _RankEncoder(g, meta, keys, strict, stats,
                       name_field or _StringField(g.strings, w.tag(2, w.WT_LEN)), check_groups)
    yield from enc.chunks()


class _SharedEncodings:
    """Encodings of rank graphs that share every array but their groups and peers, patched per rank.

    Ranks stamped out from one graph (shared arrays) encode to the same bytes except the
    ``pg_name`` values of their collectives (each rank's own groups) and the ``comm_src`` /
    ``comm_dst`` of their sends/recvs (their rank and peers). In strict mode every group key has one
    width (:func:`group_keys`), and ranks whose rank and peers have the same varint lengths share a
    structure, so a structure is encoded once — twice: as its first rank, and with every key set to
    ``"\\1" * width`` (instead of ``"\\0" * width``) and the rank and peers XOR 1 (same varint
    length, other first byte). The bytes that differ are exactly the key bytes and the first byte
    of each peer varint, in file order; each rank sharing the structure is written as a copy with
    its own keys and varints put in place (numpy scatters, no re-encoding). The rank's groups are
    checked as the encoder checks them (defined, and the rank a member).

    Only structures another selected rank shares are kept (at most ``_LIMIT`` bytes). Outside strict
    mode (group names verbatim, any length) the group and peer columns and the rank are part of
    the key: only identical ranks share.
    """

    _LIMIT = 1 << 29  # bytes kept at most

    def __init__(self, trace: Trace, selected: list[int], keys: dict[str, str], strict: bool) -> None:
        self.strict = strict
        self.meta = trace.meta
        self.width = len(next(iter(keys.values()))) if strict and keys else 0
        # key bytes by group name; members by group name (sets, for the per-rank check)
        self._key_bytes = {nm: k.encode() for nm, k in keys.items()} if strict else {}
        self._members: dict[str, frozenset[int]] = {}
        counts: dict[tuple, int] = {}
        for r in selected:
            k = self._key(trace.graphs[r])
            counts[k] = counts.get(k, 0) + 1
        self._repeated = {k for k, n in counts.items() if n > 1}
        self._tpl: dict[tuple, _Template | None] = {}
        self._size = 0

    def _key(self, g: RankGraph) -> tuple:
        attrs = tuple((k, id(v)) for k, v in sorted(g.attrs.items()))
        k = structure_identity(g) + (attrs, id(metadata_for(g)), repr(ettools_metadata_attrs(g)))
        p2p = (g.type == NodeType.COMM_SEND_NODE) | (g.type == NodeType.COMM_RECV_NODE)
        if not self.strict:
            return k + (id(g.comm_group), id(g.comm_peer), g.rank if p2p.any() else -1)
        # groups and peers patched: the key holds which nodes name a group / a peer and the varint
        # lengths of the rank and the peers, not their values
        peer = g.comm_peer[p2p].astype(np.int64)
        sizes = w.varint_sizes(peer.view(np.uint64)).astype(np.uint8) * (peer >= 0)
        rank_size = int(w.varint_sizes(np.array([g.rank], np.uint64))[0]) if p2p.any() else 0
        return k + (np.packbits(g.comm_group >= 0).tobytes(), sizes.tobytes(), rank_size)

    def wanted(self, g: RankGraph) -> bool:
        """Whether ``g``'s encoding will be needed again."""
        k = self._key(g)
        return k in self._repeated and k not in self._tpl and self._size < self._LIMIT

    def encode(self, g: RankGraph, keys: dict[str, str], stats: WriteStats, nf: _StringField | None) -> np.ndarray:
        """Encode ``g``'s structure, keep it, and return ``g``'s bytes."""
        before = stats.as_dict()

        def enc(h: RankGraph, k: dict[str, str], st: WriteStats, check: bool = True) -> np.ndarray:
            return np.frombuffer(b"".join(bytes(p) for p in encode_rank(h, self.meta, k, self.strict, st, nf, check)),
                                 np.uint8)

        key = self._key(g)
        if not self.strict:
            tpl = _Template(enc(g, keys, stats))
        else:
            a = enc(g, {nm: "\0" * self.width for nm in keys}, stats)
            tpl = self._sites(g, a, enc)
            if tpl is None:  # not found where expected (a writer change): encode every rank in full
                self._tpl[key] = None
                return enc(g, keys, WriteStats())
        self._tpl[key] = tpl
        tpl.stats = {k: v - before[k] for k, v in stats.as_dict().items()}
        self._size += len(tpl.data)
        return self._patched(g, tpl)

    def _sites(self, g: RankGraph, a: np.ndarray, enc: Any) -> _Template | None:
        """Where ``g``'s group keys and peer varints sit in its probe encoding ``a``."""
        t = g.type
        p2p = ((t == NodeType.COMM_SEND_NODE) | (t == NodeType.COMM_RECV_NODE)) & (g.comm_peer >= 0)
        keep = (t != NodeType.METADATA_NODE) & (t != NodeType.INVALID_NODE)
        rows = np.flatnonzero(keep & ((g.comm_group >= 0) | p2p))
        rows = rows[np.argsort(g.columns["id"][rows], kind="stable")]  # file order: ascending id
        peer = g.comm_peer.astype(np.int64)
        h = g.replace(comm_peer=np.where(p2p, peer ^ 1, peer).astype(g.comm_peer.dtype))
        h.rank = g.rank ^ 1
        b = enc(h, {nm: "\1" * self.width for nm in self._key_bytes}, WriteStats(), False)
        if len(a) != len(b):
            return None
        diff = np.flatnonzero(a != b)
        # per site row: the key (width bytes) then comm_src, comm_dst (one byte each): the writer's order
        has_pg, has_p2p = g.comm_group[rows] >= 0, p2p[rows]
        per = has_pg * self.width + has_p2p * 2
        if len(diff) != int(per.sum()):
            return None
        first = np.cumsum(per) - per
        pg_rows, pg_first = rows[has_pg], first[has_pg]
        pos = diff[pg_first] if len(pg_first) else pg_first
        if len(pos) and not (diff[pg_first[:, None] + np.arange(self.width)] == pos[:, None] + np.arange(self.width)).all():
            return None
        q_rows = rows[has_p2p]
        q_first = first[has_p2p] + has_pg[has_p2p] * self.width
        return _Template(a, pos, pg_rows, q_rows, diff[q_first] if len(q_first) else q_first,
                         diff[q_first + 1] if len(q_first) else q_first,
                         t[q_rows] == NodeType.COMM_SEND_NODE)

    def lookup(self, g: RankGraph, stats: WriteStats) -> np.ndarray | None:
        """``g``'s bytes from a kept structure (its groups checked, groups and peers patched in); None if none."""
        tpl = self._tpl.get(self._key(g))
        if tpl is None:
            return None
        for name, v in tpl.stats.items():
            setattr(stats, name, getattr(stats, name) + v)
        return self._patched(g, tpl)

    def _patched(self, g: RankGraph, tpl: _Template) -> np.ndarray:
        if not len(tpl.pos) and not len(tpl.p2p_rows):
            return tpl.data
        buf = tpl.data.copy()
        if len(tpl.pos):
            gids = g.comm_group[tpl.rows]
            uniq, inv = np.unique(gids, return_inverse=True)
            table = np.empty((len(uniq), self.width), np.uint8)
            for i, gid in enumerate(uniq.tolist()):
                gname = g.strings[gid]
                members = self._members.get(gname)
                if members is None:
                    pg = self.meta.process_groups.get(gname)
                    members = self._members[gname] = frozenset(pg.ranks) if pg is not None else frozenset()
                if g.rank not in members:
                    row = int(tpl.rows[np.flatnonzero(gids == gid)[0]])
                    pg = self.meta.process_groups.get(gname)
                    raise ValueError(
                        f"{_node_label(g, row)} names process group {gname!r}, which the trace does not define"
                        if pg is None else
                        f"{_node_label(g, row)} names process group {gname!r}, whose ranks {list(pg.ranks)} "
                        f"do not include rank {g.rank}")
                table[i] = np.frombuffer(self._key_bytes[gname], np.uint8)
            buf[tpl.pos[:, None] + np.arange(self.width)] = table[inv.reshape(-1)]
        if len(tpl.p2p_rows):
            peer = g.comm_peer[tpl.p2p_rows].astype(np.int64)
            rank = np.int64(g.rank)
            for pos, vals in ((tpl.src_pos, np.where(tpl.send, rank, peer)),
                              (tpl.dst_pos, np.where(tpl.send, peer, rank))):
                enc, ptr = w.varints(vals)  # lengths equal the template's (part of the key)
                buf[np.repeat(pos - ptr[:-1], np.diff(ptr)) + np.arange(len(enc))] = enc
        return buf


@dataclass
class _Template:
    """One structure's bytes and where its per-rank values sit: group keys (byte offsets, rows in
    file order) and the sends/recvs' comm_src/comm_dst varints."""

    data: np.ndarray
    pos: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    p2p_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    src_pos: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    dst_pos: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    send: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    stats: dict[str, int] = field(default_factory=dict)


def write_chakra(
    trace: Trace,
    outdir: Path,
    name: str = "trace",
    strict: bool = True,
    ranks: list[int] | None = None,
    report: dict[str, int] | None = None,
) -> list[Path]:
    """Write ``outdir/<name>.<rank>.et`` per rank and ``outdir/comm_group.json``; returns the paths.

    All files appear or none (temporaries renamed at the end). ``strict`` (the default, for
    everything ettools builds) applies the guarantees in the module docstring and raises
    ``ValueError`` naming the rank and node that breaks them; ``strict=False`` writes a Chakra
    source faithfully. ``ranks`` limits the ranks written. ``report``, if given, receives the
    counts of :class:`WriteStats`.
    """
    outdir = Path(outdir)
    keys = group_keys(trace.meta, strict)
    stats = WriteStats()
    selected = trace.ranks if ranks is None else sorted(ranks)
    missing = [r for r in selected if r not in trace.graphs]
    if missing:
        raise ValueError(f"ranks not in the trace: {missing}")
    if strict:
        trace = astrasim_release_form(astrasim_host_form(trace, selected), selected)
        trace, lowered = astrasim_collective_form(trace, selected)
        if lowered:
            log.info("Chakra writer: collectives ASTRA-sim does not simulate written as the ones ettools "
                     "times them as: %s", ", ".join(f"{k} -> {CollectiveType(ASTRASIM_LOWERING[int(CollectiveType[k])]).name}"
                                                    f" ({v} node(s))" for k, v in sorted(lowered.items())))
        for line in astrasim_warnings(trace, selected):
            log.warning("%s", line)
    from ettools.progress import progress

    with OutputSet(clear_stale=ranks is None) as out:  # a partial write keeps the other ranks
        name_field = _StringField(trace.strings, w.tag(2, w.WT_LEN))
        # Ranks stamped out from one graph (shared arrays) encode to the same bytes: encode once.
        shared = _SharedEncodings(trace, selected, keys, strict)
        for r in progress(selected, "writing Chakra", total=len(selected), unit="rank"):
            g = trace.graphs[r]
            nf = name_field if g.strings is trace.strings else None  # the shared cache fits one table
            data = shared.lookup(g, stats)
            if data is None and shared.wanted(g):
                data = shared.encode(g, keys, stats, nf)
            with out.open(outdir / f"{name}.{r}.et", compress=False) as f:
                if data is not None:
                    f.write(data)
                else:
                    for part in encode_rank(g, trace.meta, keys, strict, stats, nf):
                        f.write(part)
        out.write_file(outdir / COMM_GROUP_FILE, comm_group_json(trace.meta, keys))
    paths = out.paths
    _log_stats(stats)
    if report is not None:
        report.update(stats.as_dict())
    return paths


def _log_stats(stats: WriteStats) -> None:
    changed = {k: v for k, v in stats.as_dict().items() if k != "nodes" and v}
    if changed:
        log.info("Chakra writer: %s", ", ".join(f"{k}={v}" for k, v in changed.items()))


__all__ = [
    "WriteStats",
    "attr_entries",
    "attr_message",
    "attr_value",
    "canonical_kind",
    "comm_group_json",
    "encode_rank",
    "group_keys",
    "iter_frames",
    "metadata_message",
    "metadata_to_dict",
    "nodes_to_graph",
    "read_chakra",
    "read_chakra_file",
    "resolve_rank_files",
    "set_attr_value",
    "write_chakra",
]

