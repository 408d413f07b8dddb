"""PyTorch ET reader on every real ET file: counts, attributes, IO strings, tensors, edges, comm."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from shared_kineto import read_json

from ettools.converters.pytorch_et import et_rank_files, read_pytorch_et
from ettools.errors import TraceError
from ettools.graph import CollectiveType, EdgeKind, NodeType

ET_FILES = [
    "et_kineto/hta_simple_add/et.json.gz",
    "et_kineto/param_linear/et.json.gz",
    "et_kineto/param_resnet/et.json.gz",
    "et_kineto/triosim_vgg13_h100/et.json.gz",
    "pytorch_et/chakra_2rank_nccl/rank0_et.json.gz",
]
SMALL = [f for f in ET_FILES if "resnet" not in f]
GLOO = Path(__file__).resolve().parent / "data" / "gloo_2rank"
DTYPE_BYTES = {"Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Long": 8, "Int": 4, "Byte": 1, "Char": 1}


# ---- an independent reading of the raw JSON --------------------------------------------------
def raw(path: Path) -> dict:
    return read_json(path)


def norm(n: dict) -> dict:
    """A node in one shape whatever the schema: id, name, parent, attrs, inputs, outputs."""
    if "attrs" in n:
        return {"id": n["id"], "name": n["name"], "parent": n["ctrl_deps"],
                "attrs": {a["name"]: a["value"] for a in n["attrs"]},
                "inputs": (n["inputs"]["values"], n["inputs"]["shapes"], n["inputs"]["types"]),
                "outputs": (n["outputs"]["values"], n["outputs"]["shapes"], n["outputs"]["types"])}
    skip = {"id", "name", "parent", "inputs", "input_shapes", "input_types", "outputs", "output_shapes", "output_types"}
    return {"id": n["id"], "name": n["name"], "parent": n["parent"],
            "attrs": {k: v for k, v in n.items() if k not in skip},
            "inputs": (n["inputs"], n["input_shapes"], n["input_types"]),
            "outputs": (n["outputs"], n["output_shapes"], n["output_types"])}


def is_dropped(name: str) -> bool:
    return name.startswith("[pytorch|profiler|execution_") or name == "## process_group:init ##"


def tensor_keys(values: list) -> set[tuple[int, int]]:
    """(tensor_id, storage_id) of every defined tensor value, nested lists included."""
    out = set()
    stack = list(values)
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            if len(v) == 6 and isinstance(v[5], str) and all(isinstance(x, int) for x in v[:5]):
                if v[1] != 0 or v[3] * v[4] > 0:
                    out.add((v[0], v[1]))
            else:
                stack.extend(v)
    return out


@pytest.fixture(scope="module")
def loaded(shared_traces: Path) -> dict[str, tuple]:
    out = {}
    for rel in ET_FILES:
        p = shared_traces / rel
        nodes = [norm(n) for n in raw(p)["nodes"]]
        out[rel] = (read_pytorch_et(p), nodes)
    return out


# ---- counts, names, attributes, IO ------------------------------------------------------------
@pytest.mark.parametrize("rel", ET_FILES)
def test_nodes_match_the_file(loaded, rel):
    trace, nodes = loaded[rel]
    assert trace.ranks == [0]
    g = trace[0]
    kept = sorted((n for n in nodes if not is_dropped(n["name"])), key=lambda n: n["id"])
    assert len(g) == len(kept)
    assert g.id.tolist() == [n["id"] for n in kept]
    assert g.names() == [n["name"] for n in kept]
    assert (g.is_cpu_op == 1).all()
    dropped = g.meta["et"]["dropped"]
    assert sum(dropped.values()) == len(nodes) - len(kept)
    # attributes keep their values and get Chakra kinds
    for name in ("rf_id", "seq_id", "tid", "fw_parent"):
        col = g.attr(name)
        assert col.kind == "int64_val"
        assert col.as_dict() == {r: n["attrs"][name] for r, n in enumerate(kept)}
    assert g.attr("op_schema").kind == "string_val"
    assert g.attr("op_schema").as_dict() == {r: n["attrs"]["op_schema"] for r, n in enumerate(kept)}
    # resources name the ET thread
    assert [g.strings[x] for x in g.resource] == [f"thread {n['attrs']['tid']}" for n in kept]


@pytest.mark.parametrize("rel", ET_FILES)
def test_io_strings_like_chakra(loaded, rel):
    trace, nodes = loaded[rel]
    g = trace[0]
    kept = sorted((n for n in nodes if not is_dropped(n["name"])), key=lambda n: n["id"])
    ins, outs = g.attr("inputs"), g.attr("outputs")
    assert ins.kind == outs.kind == "io"
    for r in range(0, len(kept), max(1, len(kept) // 500)):
        assert ins.get(r) == tuple(str(x) for x in kept[r]["inputs"])
        assert outs.get(r) == tuple(str(x) for x in kept[r]["outputs"])


def test_io_string_format_matches_chakra_converter_output():
    # Chakra's converter writes Python str() of the lists (seen in chakra/resnet_converted.0.et).
    values = [[[4, 5, 0, 64, 4, "cuda:0"]], 0]
    assert str(values) == "[[[4, 5, 0, 64, 4, 'cuda:0']], 0]"


@pytest.mark.parametrize("rel", ET_FILES)
def test_tensors_and_io_lists(loaded, rel):
    trace, nodes = loaded[rel]
    g = trace[0]
    kept = sorted((n for n in nodes if not is_dropped(n["name"])), key=lambda n: n["id"])
    t = g.tensors
    for r, n in enumerate(kept):
        got_in = {(int(t.tensor_id[x]), int(t.storage_id[x])) for x in g.inputs_of(r)}
        got_out = {(int(t.tensor_id[x]), int(t.storage_id[x])) for x in g.outputs_of(r)}
        assert tensor_keys(n["inputs"][0]) <= got_in
        assert tensor_keys(n["outputs"][0]) <= got_out
    # a sample tensor row carries the value's fields
    first = next(n for n in kept if n["inputs"][2] and n["inputs"][2][0].startswith("Tensor("))
    r = kept.index(first)
    v, shape, typ = first["inputs"][0][0], first["inputs"][1][0], first["inputs"][2][0]
    row = int(g.inputs_of(r)[0])
    assert [int(t.tensor_id[row]), int(t.storage_id[row]), int(t.offset[row]), int(t.numel[row]),
            int(t.elem_bytes[row]), g.strings[t.device[row]]] == v
    assert list(t.shape(row)) == shape
    assert g.strings[t.dtype[row]] == typ[len("Tensor("):-1]


# ---- edges -----------------------------------------------------------------------------------
@pytest.mark.parametrize("rel", ET_FILES)
def test_graph_is_acyclic_without_dangling_edges(loaded, rel):
    g = loaded[rel][0][0]
    assert g.dangling_edges() == 0
    assert g.topological_order() is not None
    src, dst, _ = g.edge_rows()
    assert (g.id[src] < g.id[dst]).all()  # every dependency is on an earlier op


@pytest.mark.parametrize("rel", ET_FILES)
def test_nest_and_order_edges(loaded, rel):
    trace, nodes = loaded[rel]
    g = trace[0]
    by_id = {n["id"]: n for n in nodes}
    kept = sorted((n for n in nodes if not is_dropped(n["name"])), key=lambda n: n["id"])
    nest = {(int(g.id[d]), int(g.id[s])) for s, d, k in zip(*g.edge_rows()) if k == EdgeKind.NEST}
    expected = {(n["id"], n["parent"]) for n in kept if not is_dropped(by_id[n["parent"]]["name"])}
    assert nest == expected
    # top-level ops of each thread follow one another
    order = {(int(g.id[d]), int(g.id[s])) for s, d, k in zip(*g.edge_rows()) if k == EdgeKind.ORDER}
    tops: dict[int, list[int]] = {}
    for n in kept:
        if is_dropped(by_id[n["parent"]]["name"]):
            tops.setdefault(n["attrs"]["tid"], []).append(n["id"])
    for ids in tops.values():
        for a, b in zip(ids, ids[1:]):
            assert (b, a) in order


@pytest.mark.parametrize("rel", ET_FILES)
def test_data_edges_follow_tensors(loaded, rel):
    trace, nodes = loaded[rel]
    g = trace[0]
    by_id = {n["id"]: n for n in nodes}
    src, dst, kind = g.edge_rows()
    data = kind == EdgeKind.DATA
    assert data.sum() > 0
    for s, d in zip(src[data], dst[data]):
        w, r = by_id[int(g.id[s])], by_id[int(g.id[d])]
        assert tensor_keys(w["outputs"][0]) & tensor_keys(r["inputs"][0]), (w["name"], r["name"])


def ancestors(by_id: dict, nid: int) -> set[int]:
    out, p = set(), by_id[nid]["parent"]
    while p in by_id and p not in out and p != by_id[p]["parent"]:
        out.add(p)
        p = by_id[p]["parent"]
    return out | ({p} if p in by_id else set())


@pytest.mark.parametrize("rel", SMALL)
def test_data_edges_are_the_last_earlier_writers(loaded, rel):
    """Brute force oracle: for each op and tensor it reads, scan back for the last writer."""
    trace, nodes = loaded[rel]
    g = trace[0]
    by_id = {n["id"]: n for n in nodes}
    kept = sorted((n for n in nodes if not is_dropped(n["name"])), key=lambda n: n["id"])
    outs = [tensor_keys(n["outputs"][0]) for n in kept]
    expected = set()
    for i, n in enumerate(kept):
        anc = ancestors(by_id, n["id"])
        for key in tensor_keys(n["inputs"][0]):
            for j in range(i - 1, -1, -1):
                if key in outs[j] and kept[j]["id"] not in anc:
                    expected.add((n["id"], kept[j]["id"]))
                    break
    got = {(int(g.id[d]), int(g.id[s])) for s, d, k in zip(*g.edge_rows()) if k == EdgeKind.DATA}
    assert got == expected


# ---- process groups and communication ----------------------------------------------------------
def test_process_groups_chakra_2rank(loaded):
    trace, nodes = loaded["pytorch_et/chakra_2rank_nccl/rank0_et.json.gz"]
    init = next(n for n in nodes if n["name"] == "## process_group:init ##")
    declared = json.loads(init["inputs"][0][0])
    assert set(trace.meta.process_groups) == {d["pg_name"] for d in declared}
    for d in declared:
        grp = trace.meta.process_groups[d["pg_name"]]
        assert grp.ranks == tuple(d["ranks"] or range(d["group_size"]))
        assert grp.backend == d["backend_config"]
    assert trace.meta.world_size == max(d["group_size"] for d in declared)


def test_comm_nodes_chakra_2rank(loaded):
    trace, nodes = loaded["pytorch_et/chakra_2rank_nccl/rank0_et.json.gz"]
    g = trace[0]
    rpc = {n["id"]: n for n in nodes if n["name"] == "record_param_comms"
           and "all_gather" in n["inputs"][0]}
    comm_rows = np.flatnonzero(g.type == NodeType.COMM_COLL_NODE)
    assert {int(g.id[r]) for r in comm_rows} == set(rpc)
    for r in comm_rows:
        n = rpc[int(g.id[r])]
        t = n["inputs"][0][0][0]  # the one input tensor
        assert g.comm_type[r] == CollectiveType.ALL_GATHER
        assert g.comm_bytes[r] == t[3] * t[4]
        assert g.group_name(r) in trace.meta.process_groups
    assert len(comm_rows) == 10


def test_comm_nodes_param_resnet_bytes_from_et_attributes(loaded):
    trace, nodes = loaded["et_kineto/param_resnet/et.json.gz"]
    g = trace[0]
    rpc = {n["id"]: n for n in nodes if n["name"] == "record_param_comms"
           and n["attrs"].get("collective_name") not in (None, "wait")}
    comm_rows = np.flatnonzero(g.type != NodeType.COMP_NODE)
    assert {int(g.id[r]) for r in comm_rows} == set(rpc)
    names = {"allreduce": CollectiveType.ALL_REDUCE, "broadcast": CollectiveType.BROADCAST}
    for r in comm_rows:
        a = rpc[int(g.id[r])]["attrs"]
        assert g.comm_type[r] == names[a["collective_name"]]
        assert g.comm_bytes[r] == a["in_msg_nelems"] * DTYPE_BYTES[a["dtype"]]
        assert g.group_name(r) == a["pg_name"]
    # exactly one comm node per collective: the c10d parents stay compute nodes
    c10d = [r for r in range(len(g)) if g.name_of(r).startswith("c10d::")]
    assert c10d and all(g.type[r] == NodeType.COMP_NODE for r in c10d)


def gloo_et() -> list[Path]:
    return sorted(GLOO.glob("rank*.et.json.gz"))


def test_gloo_two_ranks_from_directory(tmp_path):
    for f in gloo_et():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    trace = read_pytorch_et(tmp_path)
    assert trace.ranks == [0, 1]
    for r in (0, 1):
        assert trace[r].meta["et"]["path"].endswith(f"rank{r}.et.json.gz")


def test_gloo_comm_nodes_peers_and_groups():
    trace = read_pytorch_et(gloo_et())
    assert trace.ranks == [0, 1]
    assert trace.meta.world_size == 2
    assert trace.meta.process_groups["0"].ranks == (0, 1)
    for rank in (0, 1):
        g = trace[rank]
        raw_nodes = {n["id"]: norm(n) for n in raw(GLOO / f"rank{rank}.et.json.gz")["nodes"]}
        comm = np.flatnonzero(g.type != NodeType.COMP_NODE)
        names = sorted(g.name_of(r) for r in comm)
        assert names.count("c10d::allreduce_") == 4
        for r in comm:
            n = raw_nodes[int(g.id[r])]
            v = n["inputs"][0]
            if g.name_of(r) == "c10d::allgather_":
                assert g.comm_type[r] == CollectiveType.ALL_GATHER
                t = v[1][0]  # per-rank input
                assert g.comm_bytes[r] == t[3] * t[4]
            elif g.name_of(r) == "c10d::_reduce_scatter_base_":
                assert g.comm_type[r] == CollectiveType.REDUCE_SCATTER
                assert g.comm_bytes[r] == v[1][3] * v[1][4]  # full input
            elif g.name_of(r) == "c10d::allreduce_":
                assert g.comm_bytes[r] == sum(t[3] * t[4] for t in v[0])
            elif g.name_of(r) in ("c10d::send", "c10d::recv_"):
                assert g.type[r] == (NodeType.COMM_SEND_NODE if rank == 0 else NodeType.COMM_RECV_NODE)
                assert g.comm_peer[r] == 1 - rank
                assert g.comm_tag[r] == v[3] == 7
                assert g.comm_bytes[r] == v[0][0][3] * v[0][0][4]
            assert g.group_name(r) == "0"


# ---- files, ranks, bad input -------------------------------------------------------------------
def test_rank_from_file_names(tmp_path):
    for name in ("rank3.et.json", "trace_rank_5.json.gz"):
        (tmp_path / name).write_text("{}")
    assert sorted(r for r, _ in et_rank_files(tmp_path)) == [3, 5]
    assert et_rank_files(tmp_path / "rank3.et.json")[0][0] == 3
    (tmp_path / "x.json").write_text("{}")
    assert et_rank_files([tmp_path / "x.json"])[0][0] is None


def test_rank_given_twice_is_an_error(tmp_path, shared_traces):
    src = (shared_traces / "pytorch_et/chakra_2rank_nccl/rank0_et.json.gz").read_bytes()
    (tmp_path / "rank0.json.gz").write_bytes(src)
    (tmp_path / "rank_0.json.gz").write_bytes(src)
    with pytest.raises(TraceError, match="rank 0 given twice"):
        read_pytorch_et(tmp_path)


def minimal(schema: str = "1.1.1-chakra.0.0.4", nodes: list | None = None) -> dict:
    if nodes is None:
        nodes = [{"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 1,
                  "inputs": {"values": [], "shapes": [], "types": []},
                  "outputs": {"values": [], "shapes": [], "types": []}, "attrs": []},
                 {"id": 2, "name": "aten::add", "ctrl_deps": 1,
                  "inputs": {"values": [], "shapes": [], "types": []},
                  "outputs": {"values": [], "shapes": [], "types": []},
                  "attrs": [{"name": "tid", "type": "uint64", "value": 1}]}]
    return {"schema": schema, "pid": 1, "nodes": nodes}


def write(tmp_path: Path, obj, name: str = "et.json") -> Path:
    p = tmp_path / name
    p.write_bytes(obj if isinstance(obj, bytes) else json.dumps(obj).encode())
    return p


def test_minimal_file_reads(tmp_path):
    g = read_pytorch_et(write(tmp_path, minimal()))[0]
    assert g.names() == ["aten::add"]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"{not json", "not valid JSON"),
        ([1, 2], "top level is not a JSON object"),
        ({"schema": "1.0.1"}, "no 'nodes' list"),
        (minimal("9.9.9"), "unsupported ET schema version '9.9.9'"),
        (minimal(nodes=[{"name": "x", "ctrl_deps": 0}]), "node 0: missing or invalid 'id'"),
        (minimal(nodes=[{"id": 1, "name": "a"}, {"id": 2, "ctrl_deps": 1}]), "node 1 (id 2): missing or invalid 'name'"),
        (minimal(nodes=[{"id": 1, "name": "a"}, {"id": 1, "name": "b"}]), "duplicate id 1"),
        ({"schema": "1.1.1-chakra.0.0.4", "nodes": {"a": 1}}, "'nodes' is not a list"),
        (minimal(nodes=[{"id": 3, "name": "## process_group:init ##", "ctrl_deps": 1,
                         "inputs": {"values": ["[{oops"], "shapes": [[]], "types": ["String"]}}]),
         "process-group string is not JSON"),
        (minimal(nodes=[{"id": 3, "name": "aten::x", "ctrl_deps": 1, "inputs": [1]}]), "'inputs' is not an object"),
        (minimal(nodes=[{"id": 3, "name": "aten::x", "ctrl_deps": 1, "attrs": {"a": 1}}]), "malformed 'attrs' list"),
    ],
)
def test_bad_input_names_file_and_problem(tmp_path, content, message):
    p = write(tmp_path, content)
    with pytest.raises(TraceError) as e:
        read_pytorch_et(p)
    assert str(p) in str(e.value)
    assert message in str(e.value)


def test_truncated_gzip(tmp_path, shared_traces):
    data = (shared_traces / "et_kineto/hta_simple_add/et.json.gz").read_bytes()
    p = write(tmp_path, data[: len(data) // 2], "et.json.gz")
    with pytest.raises(TraceError, match="truncated or corrupt gzip"):
        read_pytorch_et(p)


def test_missing_file(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        read_pytorch_et(tmp_path / "nope.json")


def test_rank_from_record_param_comms_when_the_name_has_none(tmp_path, shared_traces):
    doc = raw(shared_traces / "pytorch_et/chakra_2rank_nccl/rank0_et.json.gz")
    for n in doc["nodes"]:
        if n["name"] == "record_param_comms":
            types = n["inputs"]["types"]
            k = types.index("String")
            n["inputs"]["values"][k - 1] = 1  # the rank argument, just before the collective name
    trace = read_pytorch_et(write(tmp_path, doc, "trace.json"))
    assert trace.ranks == [1]
    assert trace[1].rank == 1


SAMPLE_DIR = Path(__file__).resolve().parents[1] / "sample_traces"
SAMPLE_ET = sorted(SAMPLE_DIR.glob("*/rank*.et.json.gz"))


@pytest.mark.parametrize("path", SAMPLE_ET, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_sample_capture_et_files(path):
    nodes = raw(path)["nodes"]
    trace = read_pytorch_et(path)
    g = trace[trace.ranks[0]]
    assert trace.ranks == [int(path.name[4])]
    assert len(g) == sum(not is_dropped(n["name"]) for n in nodes)
    assert g.dangling_edges() == 0 and g.topological_order() is not None
    # gloo: no record_param_comms, every c10d op is the comm node of its call ...
    c10d = {n["id"] for n in nodes if n["name"].startswith("c10d::")}
    comm = np.flatnonzero(g.type != NodeType.COMP_NODE)
    assert {int(g.id[r]) for r in comm} == c10d
    assert all(g.group_name(r) in trace.meta.process_groups for r in comm)
    # ... and its bytes are what the gloo transfer right after it reads (Chakra comm_size:
    # all_gather per-rank input, reduce_scatter full input, all_to_all per-rank total)
    gloo = sorted((n for n in nodes if n["name"].startswith("gloo:")), key=lambda n: n["id"])

    def nbytes(v):
        if isinstance(v, list) and len(v) == 6 and isinstance(v[5], str):
            return v[3] * v[4]
        return sum(nbytes(x) for x in v) if isinstance(v, list) else 0

    for r in comm:
        nxt = next(n for n in gloo if n["id"] > g.id[r])
        assert g.comm_bytes[r] == nbytes(norm(nxt)["inputs"][0]), g.name_of(r)
