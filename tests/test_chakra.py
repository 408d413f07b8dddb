"""Chakra .et and Chakra JSON: reading the real ResNet file, faithful and strict writing, bad input.

Expectations are read off the files independently: frames are split with a varint reader written
here and decoded with the protobuf classes, never with the code under test.
"""

from __future__ import annotations

import gzip
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from chakra_decoding import decode, split_frames
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from ettools.converters import chakra as chakra_mod
from ettools.converters.chakra import read_chakra, write_chakra
from ettools.converters.chakra import writer as chakra_writer
from ettools.converters.chakra_json import read_chakra_json, write_chakra_json
from ettools.errors import TraceError
from ettools.graph import (
    AttrColumn,
    CollectiveType,
    EdgeKind,
    GraphBuilder,
    NodeType,
    ProcessGroup,
    StringTable,
    Trace,
    TraceMeta,
)
from ettools.schema import et_def_pb2 as pb

# What ASTRA-sim reads (chakra-format.md): attribute -> the one value field to write.
ASTRA_KINDS = {
    "is_cpu_op": "bool_val",
    "num_ops": "int64_val",
    "tensor_size": "uint64_val",
    "comm_type": "int64_val",
    "comm_size": "int64_val",
    "pg_name": "string_val",
    "comm_src": "int32_val",
    "comm_dst": "int32_val",
    "comm_tag": "int32_val",
    "involved_dim": "bool_list",
}


# ---- independent decoding --------------------------------------------------------------------
def attr_dict(msg) -> dict[str, tuple[str, object]]:
    out = {}
    for a in msg.attr:
        kind = a.WhichOneof("value")
        if kind is None:
            out[a.name] = (None, None)
            continue
        v = getattr(a, kind)
        out[a.name] = (kind, list(v.values) if kind.endswith("_list") else v)
    return out


def node_dict(n) -> dict:
    """Every field of a Node: what semantic equality compares."""
    return {
        "id": n.id, "name": n.name, "type": n.type,
        "data_deps": list(n.data_deps), "ctrl_deps": list(n.ctrl_deps),
        "start": n.start_time_micros, "dur": n.duration_micros,
        "inputs": (n.HasField("inputs"), n.inputs.values, n.inputs.shapes, n.inputs.types),
        "outputs": (n.HasField("outputs"), n.outputs.values, n.outputs.shapes, n.outputs.types),
        "attr": attr_dict(n),
    }


@pytest.fixture(scope="module")
def resnet(shared_traces: Path) -> Path:
    return shared_traces / "chakra" / "resnet_converted.0.et"


@pytest.fixture(scope="module")
def resnet_pb(resnet: Path):
    return decode(resnet)


@pytest.fixture(scope="module")
def resnet_trace(resnet: Path) -> Trace:
    return read_chakra(resnet)


# ---- reading the real file -------------------------------------------------------------------
def test_read_resnet_counts_match_independent_decode(resnet_trace, resnet_pb):
    _, nodes = resnet_pb
    g = resnet_trace[0]
    assert resnet_trace.ranks == [0]
    assert len(nodes) == 3664  # issue 2 / traces README
    by_type = Counter(n.type for n in nodes)
    assert by_type == {pb.COMP_NODE: 3643, pb.COMM_COLL_NODE: 21}
    assert len(g) == len(nodes)
    assert Counter(g.type.tolist()) == by_type
    assert g.num_edges == sum(len(n.data_deps) + len(n.ctrl_deps) for n in nodes)
    assert int((g.dep_kind == EdgeKind.DATA).sum()) == sum(len(n.data_deps) for n in nodes)
    # comm attributes: present on 7 collectives only
    with_comm = [n.id for n in nodes if "comm_type" in attr_dict(n)]
    assert sorted(g.id[g.comm_type >= 0].tolist()) == sorted(with_comm)
    assert int((g.is_cpu_op >= 0).sum()) == sum("is_cpu_op" in attr_dict(n) for n in nodes)


def test_read_resnet_every_node_matches(resnet_trace, resnet_pb):
    _, nodes = resnet_pb
    g = resnet_trace[0]
    assert g.id.tolist() == [n.id for n in nodes]
    for row, n in enumerate(nodes):
        v = g.node(row)
        assert v.name == n.name and int(v.type) == n.type
        assert v.data_deps == list(n.data_deps) and v.ctrl_deps == list(n.ctrl_deps)
        assert v.dur == n.duration_micros
        # the file sets no start_time_micros at all: no start times are claimed
        assert n.start_time_micros == 0 and math.isnan(v.start)
        attrs = attr_dict(n)
        if "is_cpu_op" in attrs:
            assert v.is_cpu_op == int(attrs["is_cpu_op"][1])
        if "comm_size" in attrs:
            assert v.comm_bytes == attrs["comm_size"][1] and v.comm_type == attrs["comm_type"][1]
        for name, (kind, value) in attrs.items():
            if name in g.attrs:
                assert g.attrs[name].kind == kind
                assert v.attrs[name] == value
        assert v.attrs["inputs"] == (n.inputs.values, n.inputs.shapes, n.inputs.types)


def test_global_metadata_kept(resnet_trace, resnet_pb):
    gm, _ = resnet_pb
    md = resnet_trace[0].meta["chakra_metadata"]
    assert md["version"] == gm.version
    assert [(n, v) for n, _, v in md["attr"]] == [(a.name, getattr(a, a.WhichOneof("value"))) for a in gm.attr]


# ---- faithful round trip ---------------------------------------------------------------------
def test_chakra_graph_chakra_keeps_everything(resnet_trace, resnet_pb, tmp_path):
    paths = write_chakra(resnet_trace, tmp_path, "rt", strict=False)
    assert [p.name for p in paths] == ["rt.0.et", "comm_group.json"]
    gm0, nodes0 = resnet_pb
    gm1, nodes1 = decode(tmp_path / "rt.0.et")
    assert gm1 == gm0
    assert len(nodes1) == len(nodes0)
    assert [node_dict(n) for n in nodes1] == [node_dict(n) for n in nodes0]
    # the foreign file's defects stay: 14 collectives without comm attributes
    bare0 = [n.id for n in nodes0 if n.type == pb.COMM_COLL_NODE and "comm_type" not in attr_dict(n)]
    bare1 = [n.id for n in nodes1 if n.type == pb.COMM_COLL_NODE and "comm_type" not in attr_dict(n)]
    assert len(bare0) == 21 - 7 and bare1 == bare0
    assert json.loads((tmp_path / "comm_group.json").read_bytes()) == {}


def test_writer_bytes_are_protobuf_serialization(resnet_trace, tmp_path):
    """Byte-for-byte: each frame equals what the protobuf runtime serializes for the decoded node."""
    write_chakra(resnet_trace, tmp_path, "rt", strict=False)
    frames = split_frames((tmp_path / "rt.0.et").read_bytes())
    for f in frames[1:]:
        assert pb.Node.FromString(f).SerializeToString() == f


def test_gzip_input_reads_like_plain(resnet, resnet_trace, tmp_path):
    gz = tmp_path / "resnet.0.et.gz"
    gz.write_bytes(gzip.compress(resnet.read_bytes()))
    other = read_chakra(gz)
    a, b = resnet_trace[0], other[0]
    for col in ("id", "name", "type", "dur", "is_cpu_op", "comm_type", "comm_bytes"):
        assert np.array_equal(a.columns[col], b.columns[col])
    assert np.array_equal(a.dep_id, b.dep_id) and np.array_equal(a.dep_kind, b.dep_kind)
    assert a.attrs.keys() == b.attrs.keys()


def test_deterministic_bytes(resnet_trace, tmp_path):
    write_chakra(resnet_trace, tmp_path / "a", strict=False)
    write_chakra(resnet_trace, tmp_path / "b", strict=False)
    assert (tmp_path / "a" / "trace.0.et").read_bytes() == (tmp_path / "b" / "trace.0.et").read_bytes()
    t = small_trace()
    write_chakra(t, tmp_path / "c")
    write_chakra(t, tmp_path / "d")
    for name in ("trace.0.et", "trace.1.et", "comm_group.json"):
        assert (tmp_path / "c" / name).read_bytes() == (tmp_path / "d" / name).read_bytes()


# ---- Chakra JSON -----------------------------------------------------------------------------
def test_json_round_trip_equals_binary_round_trip(resnet_trace, resnet_pb, tmp_path):
    jpaths = write_chakra_json(resnet_trace, tmp_path / "j", "rt", strict=False)
    assert [p.name for p in jpaths] == ["rt.0.json", "comm_group.json"]
    doc = json.loads(jpaths[0].read_bytes())
    assert set(doc) == {"global_metadata", "nodes"}
    _, nodes0 = resnet_pb
    assert len(doc["nodes"]) == len(nodes0)
    # the JSON is the protobuf JSON mapping of the same nodes
    for d, n in zip(doc["nodes"][:200], nodes0[:200]):
        assert node_dict(json_format.ParseDict(d, pb.Node())) == node_dict(n)
    back = read_chakra_json(jpaths[0])
    write_chakra(back, tmp_path / "b1", strict=False)
    write_chakra(resnet_trace, tmp_path / "b2", strict=False)
    assert (tmp_path / "b1" / "trace.0.et").read_bytes() == (tmp_path / "b2" / "trace.0.et").read_bytes()


def test_json_reads_chakra_jsonizer_output(resnet_pb, tmp_path):
    """Chakra's jsonizer writes MessageToJson of the metadata then of every node, concatenated."""
    gm, nodes = resnet_pb
    p = tmp_path / "jsonized.json"
    p.write_text("".join(json_format.MessageToJson(m) for m in [gm, *nodes[:50]]))
    t = read_chakra_json(p)
    assert t[0].id.tolist() == [n.id for n in nodes[:50]]


def test_json_strict_writer_and_directory_read(tmp_path):
    t = small_trace()
    write_chakra_json(t, tmp_path, "s")
    back = read_chakra_json(tmp_path)
    assert back.ranks == [0, 1]
    assert set(back.meta.process_groups) == {"1", "2"}


# ---- strict writer on hand-made graphs -------------------------------------------------------
def small_trace() -> Trace:
    """Two ranks: compute, a METADATA node in a chain, a collective, a send/recv pair."""
    strings = StringTable()
    meta = TraceMeta(world_size=2)
    meta.add_group(ProcessGroup("world", (0, 1)))
    meta.add_group(ProcessGroup("pair", (0, 1)))
    graphs = {}
    for r in (0, 1):
        b = GraphBuilder(r, strings)
        a = b.add_node("matmul", start=10.0, dur=5.4, resource="stream 7", is_cpu_op=0, num_ops=1 << 40,
                       tensor_size=4096)
        m = b.add_node("## metadata ##", NodeType.METADATA_NODE)
        b.add_dep(b.last_row, a, EdgeKind.DATA)
        c = b.add_node("nccl:all_reduce", NodeType.COMM_COLL_NODE, start=20.0, dur=3.0, is_cpu_op=0,
                       comm_type=CollectiveType.ALL_REDUCE, comm_bytes=1 << 20, comm_group="world")
        b.add_dep(b.last_row, m, EdgeKind.CTRL)  # passes through to `a`
        b.add_dep(b.last_row, 999, EdgeKind.CTRL)  # dangling
        b.set_attr(b.last_row, "involved_dim", [True, False], "bool_list")
        kind = NodeType.COMM_SEND_NODE if r == 0 else NodeType.COMM_RECV_NODE
        s = b.add_node("nccl:send" if r == 0 else "nccl:recv", kind, start=30.0, dur=1.0,
                       comm_bytes=256, comm_peer=1 - r, comm_tag=3, comm_group="pair")
        b.add_dep(b.last_row, c, EdgeKind.ORDER)
        b.add_dep(b.last_row, a, EdgeKind.DATA)
        b.add_node("relu", start=40.0, dur=1.0, is_cpu_op=0, num_ops=10, tensor_size=8)
        b.add_dep(b.last_row, s, EdgeKind.SYNC)
        b.set_attr(b.last_row, "tid", 7, "int64_val")
        graphs[r] = b.build()
    return Trace(meta, graphs, strings)


def test_strict_writer_guarantees(tmp_path):
    t = small_trace()
    report: dict[str, int] = {}
    paths = write_chakra(t, tmp_path, "s", report=report)
    assert sorted(p.name for p in paths) == ["comm_group.json", "s.0.et", "s.1.et"]
    groups = json.loads((tmp_path / "comm_group.json").read_bytes())
    assert groups == {"1": [0, 1], "2": [0, 1]}
    assert report["dropped_nodes"] == 2 and report["dangling_deps"] == 2
    for r in (0, 1):
        gm, nodes = decode(tmp_path / f"s.{r}.et")
        assert gm.version == "0.0.4"
        ids = [n.id for n in nodes]
        assert ids == sorted(ids)
        assert all(n.type not in (pb.METADATA_NODE, pb.INVALID_NODE) for n in nodes)
        for n in nodes:  # no dangling dependency
            assert set(n.data_deps) | set(n.ctrl_deps) <= set(ids)
        by_name = {n.name: n for n in nodes}
        # the METADATA node is gone and the collective inherits its dependency on matmul
        coll = by_name["nccl:all_reduce"]
        assert list(coll.ctrl_deps) == [by_name["matmul"].id] and list(coll.data_deps) == []
        for n in nodes:
            attrs = attr_dict(n)
            for name, (kind, _) in attrs.items():
                if name in ASTRA_KINDS:
                    assert kind == ASTRA_KINDS[name], (name, kind)
            if n.type == pb.COMM_COLL_NODE:
                assert attrs["comm_type"] == ("int64_val", CollectiveType.ALL_REDUCE)
                assert attrs["comm_size"] == ("int64_val", 1 << 20)
                assert attrs["pg_name"][0] == "string_val" and attrs["pg_name"][1] in groups
                assert attrs["involved_dim"] == ("bool_list", [True, False])
            if n.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
                own = "comm_src" if n.type == pb.COMM_SEND_NODE else "comm_dst"
                other = "comm_dst" if own == "comm_src" else "comm_src"
                assert attrs[own] == ("int32_val", r) and attrs[other] == ("int32_val", 1 - r)
                assert attrs["comm_tag"] == ("int32_val", 3) and attrs["comm_size"] == ("int64_val", 256)
        assert by_name["matmul"].duration_micros == 5 and by_name["matmul"].start_time_micros == 10
        assert attr_dict(by_name["matmul"])["num_ops"] == ("int64_val", 1 << 40)


def test_strict_output_reads_back(tmp_path):
    t = small_trace()
    write_chakra(t, tmp_path, "s")
    back = read_chakra(tmp_path)
    assert back.ranks == [0, 1]
    assert {k: pg.ranks for k, pg in back.meta.process_groups.items()} == {"1": (0, 1), "2": (0, 1)}
    for r in (0, 1):
        g = back[r]
        rows = {g.name_of(i): i for i in range(len(g))}
        send = rows["nccl:send" if r == 0 else "nccl:recv"]
        assert g.comm_peer[send] == 1 - r and g.comm_tag[send] == 3 and g.comm_bytes[send] == 256
        assert "comm_src" not in g.attrs and "comm_dst" not in g.attrs
        assert g.attrs["tid"].kind == "int64_val" and g.attrs["tid"].as_dict() == {rows["relu"]: 7}
        assert g.resource[rows["matmul"]] >= 0 and g.strings[g.resource[rows["matmul"]]] == "stream 7"
        assert g.dangling_edges() == 0


def _bad_trace(**node_kw) -> Trace:
    strings = StringTable()
    meta = TraceMeta(world_size=4)
    meta.add_group(ProcessGroup("world", (0, 1, 2, 3)))
    meta.add_group(ProcessGroup("other", (2, 3)))
    b = GraphBuilder(1, strings, first_id=40)
    b.add_node("ok", dur=1.0)
    b.add_node(**node_kw)
    return Trace(meta, {1: b.build()}, strings)


@pytest.mark.parametrize(
    "kw, missing",
    [
        (dict(name="ar_no_size", type=NodeType.COMM_COLL_NODE, comm_type=0, comm_group="world"), "comm_size"),
        (dict(name="ar_no_type", type=NodeType.COMM_COLL_NODE, comm_bytes=8, comm_group="world"), "comm_type"),
        (dict(name="ar_no_group", type=NodeType.COMM_COLL_NODE, comm_type=0, comm_bytes=8), "pg_name"),
        (dict(name="send_no_tag", type=NodeType.COMM_SEND_NODE, comm_bytes=8, comm_peer=0), "comm_tag"),
        (dict(name="recv_no_peer", type=NodeType.COMM_RECV_NODE, comm_bytes=8, comm_tag=1), "peer"),
        (dict(name="ar_bad_group", type=NodeType.COMM_COLL_NODE, comm_type=0, comm_bytes=8,
              comm_group="tp"), "'tp'"),
        (dict(name="ar_not_member", type=NodeType.COMM_COLL_NODE, comm_type=0, comm_bytes=8,
              comm_group="other"), "do not include rank 1"),
        (dict(name="ar_bad_type", type=NodeType.COMM_COLL_NODE, comm_type=42, comm_bytes=8,
              comm_group="world"), "unknown collective type 42"),
    ],
)
def test_strict_writer_refuses_incomplete_comm_nodes(tmp_path, kw, missing):
    t = _bad_trace(**kw)
    with pytest.raises(ValueError) as err:
        write_chakra(t, tmp_path / "out")
    msg = str(err.value)
    assert "rank 1" in msg and "node 41" in msg and kw["name"] in msg and missing in msg
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_no_output_left_on_failure(tmp_path, monkeypatch):
    t = small_trace()
    # a later rank fails: nothing from earlier ranks remains
    bad = _bad_trace(name="ar", type=NodeType.COMM_COLL_NODE, comm_type=0)
    t.graphs[1] = bad.graphs[1]
    t.graphs[1].strings = t.strings
    with pytest.raises(ValueError):
        write_chakra(t, tmp_path)
    assert list(tmp_path.iterdir()) == []

    # an I/O failure at the very end (comm_group.json) leaves nothing either
    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(chakra_writer, "comm_group_json", boom)  # the name write_chakra calls
    with pytest.raises(OSError):
        write_chakra(small_trace(), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_all_default_node_rejected(tmp_path):
    strings = StringTable()
    b = GraphBuilder(0, strings, first_id=0)
    b.add_node("", NodeType.INVALID_NODE)
    t = Trace(TraceMeta(), {0: b.build()}, strings)
    with pytest.raises(ValueError, match="empty frame"):
        write_chakra(t, tmp_path, strict=False)
    assert list(tmp_path.iterdir()) == []


# ---- attribute kinds and foreign oddities ----------------------------------------------------
ODD_ATTRS = [
    ("d", "double_val", 2.5), ("f", "float_val", 0.5), ("s64", "sint64_val", -7), ("s32", "sint32_val", -3),
    ("fx32", "fixed32_val", 9), ("fx64", "fixed64_val", 1 << 40), ("sf32", "sfixed32_val", -9),
    ("sf64", "sfixed64_val", -(1 << 40)), ("u32", "uint32_val", 4000000000), ("i32", "int32_val", -1),
    ("by", "bytes_val", b"\x00\xff"), ("sl", "string_list", ["a", "b"]), ("il", "int64_list", [1, -2]),
    ("dl", "double_list", [0.25]), ("bl", "bool_list", []), ("nothing", "none", None),
]


def _pb_stream(path: Path, nodes: list, version: str = "0.0.4") -> None:
    parts = []
    for m in [pb.GlobalMetadata(version=version), *nodes]:
        b = m.SerializeToString()
        length = len(b)
        enc = bytearray()
        while length >= 0x80:
            enc.append((length & 0x7F) | 0x80)
            length >>= 7
        enc.append(length)
        parts.append(bytes(enc) + b)
    path.write_bytes(b"".join(parts))


def test_every_attribute_kind_round_trips(tmp_path):
    node = pb.Node(id=5, name="odd", type=pb.COMP_NODE)
    for name, kind, value in ODD_ATTRS:
        node.attr.append(chakra_mod.attr_message(name, kind, value))
    src = tmp_path / "odd.0.et"
    _pb_stream(src, [node])
    t = read_chakra(src)
    for name, kind, value in ODD_ATTRS:
        col = t[0].attrs[name]
        assert col.kind == kind and col.values == [value]
    write_chakra(t, tmp_path / "out", strict=False)
    _, (back,) = decode(tmp_path / "out" / "trace.0.et")
    assert node_dict(back) == node_dict(node)
    assert [a.WhichOneof("value") for a in back.attr] == [None if k == "none" else k for _, k, _ in ODD_ATTRS]


def test_foreign_kinds_and_peers_are_kept(tmp_path):
    """Column attributes in unusual value fields, odd values and send/recv peers survive."""
    a = chakra_mod.attr_message
    nodes = [
        pb.Node(id=1, name="k", type=pb.COMP_NODE, attr=[a("is_cpu_op", "int32_val", 1), a("num_ops", "int64_val", -5)]),
        pb.Node(id=2, name="r", type=pb.COMM_RECV_NODE, data_deps=[1],
                attr=[a("comm_src", "int32_val", 3), a("comm_dst", "int32_val", 2), a("comm_tag", "int64_val", 9),
                      a("comm_size", "int64_val", 64)]),
        pb.Node(id=3, name="s", type=pb.COMM_SEND_NODE, ctrl_deps=[77],
                attr=[a("comm_src", "int32_val", 5), a("comm_dst", "int32_val", 0)]),  # src is not rank 2
        pb.Node(id=4, name="c", type=pb.COMM_COLL_NODE, attr=[a("pg_name", "int64_val", 7), a("tid", "int64_val", 1),
                                                             a("tid", "string_val", "x")]),
    ]
    src = tmp_path / "f.2.et"
    _pb_stream(src, nodes, version="")
    t = read_chakra(src)
    g = t[2]
    assert g.is_cpu_op.tolist() == [1, -1, -1, -1] and g.meta["chakra_attr_kinds"]["is_cpu_op"] == "int32_val"
    assert g.attrs["num_ops"].as_dict() == {0: -5}  # a negative count does not fit the column
    assert g.comm_peer.tolist() == [-1, 3, -1, -1] and g.comm_tag.tolist() == [-1, 9, -1, -1]
    assert g.attrs["comm_src"].as_dict() == {2: 5} and g.attrs["comm_dst"].as_dict() == {2: 0}
    assert g.attrs["pg_name"].kind == "int64_val" and g.comm_group.tolist() == [-1] * 4
    assert g.attrs["tid"].kind == "int64_val" and g.attrs["tid@string_val"].values == ["x"]
    assert g.dangling_edges() == 1
    write_chakra(t, tmp_path / "out", strict=False)
    gm, back = decode(tmp_path / "out" / "trace.2.et")
    assert gm.version == "0.0.4"  # an empty GlobalMetadata would read as end of stream
    assert [node_dict(n) | {"attr": sorted(n.attr, key=lambda x: x.name)} for n in back] == [
        node_dict(n) | {"attr": sorted(n.attr, key=lambda x: x.name)} for n in nodes
    ]


def test_zero_length_frame_ends_stream(tmp_path):
    src = tmp_path / "z.et"
    _pb_stream(src, [pb.Node(id=1, name="a", type=pb.COMP_NODE), pb.Node(id=2, name="b", type=pb.COMP_NODE)])
    data = split_frames(src.read_bytes())
    src.write_bytes(bytes([len(data[0])]) + data[0] + bytes([len(data[1])]) + data[1] + b"\x00" +
                    bytes([len(data[2])]) + data[2])
    t = read_chakra(src)
    assert t[0].id.tolist() == [1]
    assert "zero-length frame 3" in t[0].meta["chakra_notes"][0]


# ---- bad input -------------------------------------------------------------------------------
def _meta_frame() -> bytes:
    b = pb.GlobalMetadata(version="0.0.4").SerializeToString()
    return bytes([len(b)]) + b


def test_bad_input_raises_trace_error(resnet, tmp_path):
    raw = resnet.read_bytes()
    frames = split_frames(raw)
    cases = {}
    gz = gzip.compress(raw)
    cases["trunc.et.gz"] = (gz[: len(gz) // 2], "gzip")
    # cut inside the third frame
    cut_at = sum(len(f) + 1 for f in frames[:2]) + 40
    cases["cut.et"] = (raw[:cut_at], "frame ")
    cases["varint.et"] = (_meta_frame() + b"\xff\xff", "varint")
    garbage = b"\xff\xff\xff\xff\xff"
    with pytest.raises(DecodeError):  # the payload really is not a Node
        pb.Node.FromString(garbage)
    cases["garbage.et"] = (_meta_frame() + bytes([len(garbage)]) + garbage, "frame 2")
    cases["empty.et"] = (b"", "empty")
    for name, (data, expect) in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(TraceError) as err:
            read_chakra(p)
        msg = str(err.value)
        assert name in msg and expect in msg, msg
        if name != "trunc.et.gz" and name != "empty.et":
            assert "offset" in msg, msg


def test_cut_frame_names_frame_and_offset(resnet, tmp_path):
    raw = resnet.read_bytes()
    p = tmp_path / "cut.0.et"
    p.write_bytes(raw[:-10])
    frames = split_frames(raw)
    # the last frame starts where its length varint starts
    payload_at = len(raw) - len(frames[-1])
    with pytest.raises(TraceError) as err:
        read_chakra(p)
    msg = str(err.value)
    assert f"frame {len(frames)} at byte offset" in msg
    offset = int(msg.split("byte offset ")[1].split()[0])
    assert payload_at - 3 <= offset < payload_at and raw[offset:payload_at][-1] < 0x80


def test_json_bad_input(tmp_path):
    cases = {
        "notjson.json": b"{nope",
        "shape.json": b'{"workload": []}',
        "node.json": b'{"global_metadata": {}, "nodes": [{"id": "x"}]}',
        "empty.json": b"",
    }
    for name, data in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(TraceError) as err:
            read_chakra_json(p)
        assert name in str(err.value)


def test_comm_group_json_read_and_rank_from_names(tmp_path):
    t = small_trace()
    write_chakra(t, tmp_path, "job")
    (tmp_path / "comm_group.json").write_text('{"1": [0, 1], "2": "x"}')
    with pytest.raises(TraceError, match="comm_group.json"):
        read_chakra(tmp_path)


def test_ranks_subset_and_missing_rank(tmp_path):
    t = small_trace()
    paths = write_chakra(t, tmp_path, "x", ranks=[1])
    assert sorted(p.name for p in paths) == ["comm_group.json", "x.1.et"]
    with pytest.raises(ValueError):
        write_chakra(t, tmp_path, "x", ranks=[5])


def test_sparse_attrs_follow_id_order(tmp_path):
    """Nodes stored out of id order are written sorted, their attributes and deps with them."""
    strings = StringTable()
    b = GraphBuilder(0, strings)
    for nid in (30, 10, 20):
        b.add_node(f"n{nid}", node_id=nid, dur=float(nid))
        b.set_attr(b.last_row, "tag", nid * 2, "int64_val")
        if nid != 10:
            b.add_dep(b.last_row, 10, EdgeKind.DATA)
    t = Trace(TraceMeta(), {0: b.build()}, strings)
    write_chakra(t, tmp_path)
    _, nodes = decode(tmp_path / "trace.0.et")
    assert [(n.id, n.name, n.duration_micros, attr_dict(n)["tag"][1], list(n.data_deps)) for n in nodes] == [
        (10, "n10", 10, 20, []), (20, "n20", 20, 40, [10]), (30, "n30", 30, 60, [10])
    ]


def test_attr_column_values_unchanged_by_writer(resnet_trace, tmp_path):
    """Writing must not mutate the graph (columns shared with other passes)."""
    g = resnet_trace[0]
    before = {k: (v.rows.copy(), list(v.values)) for k, v in g.attrs.items()}
    write_chakra(resnet_trace, tmp_path, strict=False)
    for k, (rows, values) in before.items():
        assert np.array_equal(g.attrs[k].rows, rows) and g.attrs[k].values == values
    assert isinstance(g.attrs["tid"], AttrColumn)


# ---- the bulk decoder agrees with protobuf ---------------------------------------------------
def assert_same_graph(a, b) -> None:
    """Two rank graphs hold the same nodes, edges and attributes (string ids may differ)."""
    assert a.names() == b.names()
    for col in a.columns:
        x, y = a.columns[col], b.columns[col]
        if col in ("name", "resource", "comm_group"):
            assert a.strings.decode(x) == b.strings.decode(y), col
        else:
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), col
    assert np.array_equal(a.dep_ptr, b.dep_ptr) and np.array_equal(a.dep_id, b.dep_id)
    assert np.array_equal(a.dep_kind, b.dep_kind)
    assert list(a.attrs) == list(b.attrs)
    for k in a.attrs:
        ca, cb = a.attrs[k], b.attrs[k]
        assert ca.kind == cb.kind and np.array_equal(ca.rows, cb.rows), k
        assert ca.values == cb.values and [type(v) for v in ca.values] == [type(v) for v in cb.values], k
    strip = ("chakra_decoder",)
    assert {k: v for k, v in a.meta.items() if k not in strip} == {k: v for k, v in b.meta.items() if k not in strip}


def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _raw_stream(path: Path, payloads: list[bytes]) -> None:
    gm = pb.GlobalMetadata(version="0.0.4").SerializeToString()
    path.write_bytes(b"".join(_varint(len(p)) + p for p in [gm, *payloads]))


def test_bulk_decoder_matches_protobuf_on_real_and_written_files(resnet, tmp_path):
    fast, slow = read_chakra(resnet, fast=True), read_chakra(resnet, fast=False)
    assert fast[0].meta["chakra_decoder"] == "bulk" and slow[0].meta["chakra_decoder"] == "protobuf"
    assert_same_graph(fast[0], slow[0])
    write_chakra(small_trace(), tmp_path, "s")
    fast, slow = read_chakra(tmp_path, fast=True), read_chakra(tmp_path, fast=False)
    for r in fast.ranks:
        assert fast[r].meta["chakra_decoder"] == "bulk"
        assert_same_graph(fast[r], slow[r])


def test_bulk_decoder_values_of_every_kind(tmp_path):
    nodes = []
    for i in range(40):
        n = pb.Node(id=1000 + i, name=f"n{i % 3}" if i % 5 else "", type=pb.COMP_NODE if i % 7 else pb.COMM_COLL_NODE,
                    data_deps=[1000 + j for j in range(i % 4)], ctrl_deps=[(1 << 60) + i] if i % 2 else [],
                    start_time_micros=(1 << 40) + i, duration_micros=i)
        for name, kind, value in ODD_ATTRS[: 1 + i % len(ODD_ATTRS)]:
            n.attr.append(chakra_mod.attr_message(name, kind, value))
        n.attr.append(chakra_mod.attr_message("neg", "int64_val", -(1 << 62) - i))  # 10-byte varint
        n.attr.append(chakra_mod.attr_message("tensor_size", "uint64_val", (1 << 64) - 1 - i))  # too big: sparse
        n.attr.append(chakra_mod.attr_message("pg_name", "string_val", "é" * (i % 3)))
        if i % 3 == 0:
            n.inputs.values = f"[[{i}]]"
        nodes.append(n)
    src = tmp_path / "kinds.0.et"
    _pb_stream(src, nodes)
    fast, slow = read_chakra(src, fast=True), read_chakra(src, fast=False)
    assert fast[0].meta["chakra_decoder"] == "bulk"
    assert_same_graph(fast[0], slow[0])
    assert fast[0].attrs["tensor_size"].values[0] == (1 << 64) - 1


@pytest.mark.parametrize(
    "case, decoder",
    [("unpacked_deps", "bulk"), ("unknown_field", "protobuf"), ("repeated_id", "protobuf"),
     ("two_values", "protobuf"), ("bad_utf8", None), ("group_wire_type", "protobuf"), ("bad_ioinfo", None)],
)
def test_bulk_decoder_unusual_encodings(tmp_path, case, decoder):
    """Unusual but valid encodings read exactly as protobuf reads them (the bulk decoder handles
    unpacked repeated fields and leaves the rest to protobuf); invalid ones raise TraceError."""
    base = pb.Node(id=5, name="x", type=pb.COMP_NODE, data_deps=[1, 2], attr=[chakra_mod.attr_message("k", "int64_val", 3)])
    good = base.SerializeToString()
    payload = {
        "unpacked_deps": good + b"\x28\x07\x28\x09",  # data_deps 7 and 9 as separate varint fields
        "unknown_field": good + b"\x78\x01",  # field 15
        "repeated_id": good + b"\x08\x06",  # id again: the last one wins
        "two_values": good + b"\x52\x07\x0a\x01k\x48\x01\x38\x02",  # attr with int64_val and int32_val
        "bad_utf8": good + b"\x12\x02\xff\xfe",
        "group_wire_type": good + b"\x7b\x7c",  # an empty group (field 15): valid, unknown
        "bad_ioinfo": good + b"\x42\x03\xff\xff\xff",  # inputs: a corrupt IOInfo
    }[case]
    src = tmp_path / f"{case}.0.et"
    _raw_stream(src, [good, payload])
    if decoder is None:
        with pytest.raises(DecodeError):  # protobuf itself refuses the frame
            pb.Node.FromString(payload)
        with pytest.raises(TraceError, match="frame 3 at byte offset"):
            read_chakra(src)
        return
    expect = pb.Node.FromString(payload)
    fast, slow = read_chakra(src, fast=True), read_chakra(src, fast=False)
    assert fast[0].meta["chakra_decoder"] == decoder
    assert_same_graph(fast[0], slow[0])
    assert fast[0].node(1).id == expect.id and fast[0].node(1).data_deps == list(expect.data_deps)
