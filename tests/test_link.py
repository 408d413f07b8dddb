"""ET ↔ Kineto linking on the real pairs: rates, kernel parents, rf_id vs sequence, output graph."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from shared_kineto import read_json

from ettools.converters.kineto import read_kineto
from ettools.converters.link import LinkReport, align_sequences, link_et_kineto, read_linked
from ettools.converters.pytorch_et import read_pytorch_et
from ettools.graph import CollectiveType, EdgeKind, NodeType, Trace


def read_k(path: Path | list[Path]) -> Trace:
    return read_kineto(path)


GLOO = Path(__file__).resolve().parent / "data" / "gloo_2rank"
PAIRS = ["hta_simple_add", "param_linear", "triosim_vgg13_h100"]
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def raw_events(path: Path) -> list[dict]:
    return read_json(path)["traceEvents"]


@pytest.fixture(scope="module")
def linked(shared_traces: Path) -> dict[str, tuple[Trace, LinkReport, Trace]]:
    out = {}
    for name in PAIRS + ["param_resnet"]:
        d = shared_traces / "et_kineto" / name
        et = read_pytorch_et(d / "et.json.gz")
        trace, report = link_et_kineto(et, read_k(d / "kineto.json.gz"))
        out[name] = (trace, report, et)
    return out


def enclosing_ops(events: list[dict]) -> dict[int, list[str]]:
    """correlation -> names of the host ops enclosing its runtime call, innermost first."""
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime")]
    host.sort(key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    out: dict[int, list[str]] = {}
    stack: list[dict] = []
    tid = None
    for e in host:
        if e["tid"] != tid:
            stack, tid = [], e["tid"]
        while stack and stack[-1]["ts"] + stack[-1]["dur"] < e["ts"] + e["dur"]:
            stack.pop()
        if e["cat"] == "cuda_runtime":
            if "correlation" in e.get("args", {}):
                out[e["args"]["correlation"]] = [x["name"] for x in reversed(stack)]
        else:
            stack.append(e)
    return out


@pytest.mark.parametrize("name", PAIRS)
def test_linking_rate_and_host_matches(linked, name):
    trace, report, et = linked[name]
    assert report.method == "sequence"  # these Kineto traces carry no Record function id
    assert report.et_host_ops == len(et[0])
    assert report.linking_rate >= 0.95, str(report)
    assert report.host_match_rate >= 0.95, str(report)
    assert report.device_ops_in_window <= report.device_ops_total
    assert not report.warnings


@pytest.mark.parametrize("name", PAIRS)
def test_kernel_parents_are_their_enclosing_ops(linked, name, shared_traces):
    """Each attached device op hangs off an ET op named like a Kineto op enclosing its launch."""
    trace, report, et = linked[name]
    g = trace[0]
    events = raw_events(shared_traces / "et_kineto" / name / "kineto.json.gz")
    chains = enclosing_ops(events)
    n_et = len(et[0])
    dev = np.arange(n_et, len(g))
    assert len(dev) == report.device_ops_attached
    assert (g.is_cpu_op[dev] == 0).all()
    corr = g.attr("correlation").as_dict()
    src, dst, kind = g.edge_rows()
    launch = {int(d): int(s) for s, d, k in zip(src, dst, kind) if k == EdgeKind.LAUNCH}
    innermost = 0
    for d in dev.tolist():
        parent = launch[d]
        assert 0 <= parent < n_et
        chain = chains[corr[d]]
        assert g.name_of(parent) in chain
        innermost += g.name_of(parent) == chain[0]
    assert innermost >= 0.95 * len(dev)


def test_param_linear_picks_the_iteration_the_et_recorded(linked, shared_traces):
    """The Kineto trace holds 40 iterations, the ET one: autograd sequence numbers must agree."""
    trace, report, et = linked["param_linear"]
    g = trace[0]
    events = raw_events(shared_traces / "et_kineto/param_linear/kineto.json.gz")
    by_ext = {e["args"]["External id"]: e for e in events
              if e.get("cat") in ("cpu_op", "user_annotation") and "External id" in e.get("args", {})}
    ext = g.attr("kineto_ext_id").as_dict()
    seq = g.attr("seq_id").as_dict()
    checked = 0
    for row, x in ext.items():
        e = by_ext[x]
        assert e["name"] == g.name_of(row)
        if seq.get(row, -1) >= 0 and "Sequence number" in e["args"]:
            assert e["args"]["Sequence number"] == seq[row]
            checked += 1
    assert checked > 100
    # the window is one of the 40 iterations: far fewer device ops than the whole trace
    assert report.device_ops_in_window * 10 < report.device_ops_total


def test_times_come_from_the_matched_kineto_op(linked, shared_traces):
    trace, _, _ = linked["triosim_vgg13_h100"]
    g = trace[0]
    events = raw_events(shared_traces / "et_kineto/triosim_vgg13_h100/kineto.json.gz")
    by_ext = {e["args"]["External id"]: e for e in events
              if e.get("cat") in ("cpu_op", "user_annotation") and "External id" in e.get("args", {})}
    ext = g.attr("kineto_ext_id").as_dict()
    rows = sorted(ext)
    # durations equal the events'; start differences equal ts differences (origins may differ)
    for r in rows:
        assert g.dur[r] == pytest.approx(by_ext[ext[r]]["dur"], abs=1e-3)
    t0 = by_ext[ext[rows[0]]]["ts"] - g.start[rows[0]]
    for r in rows:
        assert g.start[r] == pytest.approx(by_ext[ext[r]]["ts"] - t0, abs=1e-3)
    unmatched = np.setdiff1d(np.arange(len(g)), rows)
    assert np.isnan(g.start[unmatched[g.is_cpu_op[unmatched] == 1]]).all()


@pytest.mark.parametrize("name", PAIRS + ["param_resnet"])
def test_output_graph_is_sound(linked, name):
    trace, report, et = linked[name]
    g = trace[0]
    assert g.dangling_edges() == 0
    assert g.topological_order() is not None
    n_et = len(et[0])
    # ET part unchanged in ids, names, edges
    assert g.id[:n_et].tolist() == et[0].id.tolist()
    assert g.names()[:n_et] == et[0].names()
    assert len(np.unique(g.id)) == len(g)
    # every device op: one LAUNCH edge to an ET op, at most one ORDER edge to a device op
    src, dst, kind = g.edge_rows()
    dev = dst >= n_et
    assert ((kind[dev] == EdgeKind.LAUNCH) | (kind[dev] == EdgeKind.ORDER)).all()
    assert np.bincount(dst[dev & (kind == EdgeKind.LAUNCH)] - n_et, minlength=len(g) - n_et).tolist() == [1] * (len(g) - n_et)
    assert (src[dev & (kind == EdgeKind.LAUNCH)] < n_et).all()
    assert (src[dev & (kind == EdgeKind.ORDER)] >= n_et).all()
    json.dumps(report.to_dict())


def test_param_resnet_pair_is_flagged_as_two_runs(linked):
    """The PARAM ResNet ET (DDP ResNet-50, 2024) and Kineto (ResNet-18, 2023) are different runs:
    the linker must say so rather than claim a link."""
    trace, report, et = linked["param_resnet"]
    assert report.host_match_rate < 0.5
    assert any("may not come from the same run" in w for w in report.warnings)


# ---- rf_id vs sequence on a pair that has record-function ids ----------------------------------
def gloo_pair(rank: int) -> tuple[Trace, Trace]:
    et = read_pytorch_et(GLOO / f"rank{rank}.et.json.gz")
    return et, read_k(GLOO / f"rank{rank}.kineto.json.gz")


@pytest.mark.parametrize("rank", [0, 1])
def test_rf_id_and_sequence_linking_agree(rank):
    et, k = gloo_pair(rank)
    by_rf, rep_rf = link_et_kineto(et, k)
    assert rep_rf.method == "rf_id"
    assert rep_rf.host_ops_matched == rep_rf.et_host_ops
    for g in k:
        del g.attrs["rf_id"]
    by_seq, rep_seq = link_et_kineto(et, k)
    assert rep_seq.method == "sequence"
    a = by_rf[rank].attr("kineto_ext_id").as_dict()
    b = by_seq[rank].attr("kineto_ext_id").as_dict()
    assert len(b) >= 0.95 * len(a)
    assert sum(a[r] == b[r] for r in b) == len(b)


def test_rf_id_matches_follow_record_function_ids():
    et, k = gloo_pair(0)
    trace, _ = link_et_kineto(et, k)
    g = trace[0]
    events = raw_events(GLOO / "rank0.kineto.json.gz")
    rf_of_ext = {e["args"]["External id"]: e["args"].get("Record function id") for e in events
                 if e.get("cat") in ("cpu_op", "user_annotation") and "External id" in e.get("args", {})}
    rf = g.attr("rf_id").as_dict()
    ext = g.attr("kineto_ext_id").as_dict()
    assert ext and all(rf_of_ext[x] == rf[r] for r, x in ext.items())


# ---- alignment on perturbed input ---------------------------------------------------------------
def test_alignment_survives_missing_and_extra_ops(linked):
    """Drop 10 % of the Kineto host ops and add unrelated ones: matches stay the same ops."""
    trace, _, et = linked["triosim_vgg13_h100"]
    rng = np.random.default_rng(0)
    a = et[0].name.tolist()
    b_full = list(a)
    keep = rng.random(len(b_full)) > 0.1
    b, origin = [], []
    for i, (x, kp) in enumerate(zip(b_full, keep)):
        if rng.random() < 0.05:
            b.append(-7)  # a foreign op
            origin.append(-1)
        if kp:
            b.append(x)
            origin.append(i)
    pairs, _ = align_sequences(a, b)
    # every surviving op finds a partner with its name, in order ...
    assert len(pairs) >= 0.95 * sum(keep)
    assert all(a[i] == b[j] for i, j in pairs)
    # ... mostly the very same op: where a repeated pattern lost a copy, which copy is gone is
    # undecidable from names alone, so some matches shift to an equal-named neighbour
    right = sum(origin[j] == i for i, j in pairs)
    assert right >= 0.7 * sum(keep)
    assert all(i1 < i2 and j1 < j2 for (i1, j1), (i2, j2) in zip(pairs, pairs[1:]))


def test_anchors_choose_the_right_repetition():
    """Ten identical iterations in b; sequence numbers say a is the seventh."""
    pattern = [0, -1, 1, 2, -1, 3]
    it = [1, 2, 3, 4, 2, 5]
    a = it
    a_seq = [60 + s if s >= 0 else -1 for s in pattern]
    b = it * 10
    b_seq = [10 * k + s if s >= 0 else -1 for k in range(10) for s in pattern]
    pairs, anchors = align_sequences(a, b, a_seq, b_seq)
    assert anchors == 4
    assert pairs == [(i, 36 + i) for i in range(6)]
    # without sequence numbers the first repetition is as good as any
    assert align_sequences(a, b)[0] == [(i, i) for i in range(6)]


def test_report_string_and_dict(linked):
    _, report, _ = linked["hta_simple_add"]
    d = report.to_dict()
    assert d["device_ops_attached"] == report.device_ops_attached
    assert d["linking_rate"] == pytest.approx(report.linking_rate)
    assert "host ops" in str(report) and report.method in str(report)


def test_two_gloo_ranks_one_comm_node_per_collective():
    """Linked by rank; the gloo transfer span becomes the comm node, its c10d op is demoted."""
    et = read_pytorch_et(sorted(GLOO.glob("rank*.et.json.gz")))
    trace, report = link_et_kineto(et, read_k(sorted(GLOO.glob("rank*.kineto.json.gz"))))
    assert trace.ranks == [0, 1] and sorted(report.per_rank) == [0, 1]
    assert report.method == "rf_id" and report.host_ops_matched == report.et_host_ops
    for rank in (0, 1):
        g, e = trace[rank], et[rank]
        comm = np.flatnonzero(g.type != NodeType.COMP_NODE)
        assert all(g.name_of(r).startswith("gloo:") for r in comm)
        # one comm node per ET collective, same types and bytes as the ET reader found on c10d ops
        e_comm = np.flatnonzero(e.type != NodeType.COMP_NODE)
        assert sorted(zip(g.comm_type[comm].tolist(), g.comm_bytes[comm].tolist())) == sorted(
            zip(e.comm_type[e_comm].tolist(), e.comm_bytes[e_comm].tolist()))
        demoted = g.attr("host_comm_type").as_dict()
        assert sorted(demoted) == sorted(e_comm.tolist())
        assert all(g.type[r] == NodeType.COMP_NODE and g.comm_type[r] == -1 for r in demoted)
        p2p = [r for r in comm if g.type[r] in (NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE)]
        assert len(p2p) == 1 and g.comm_peer[p2p[0]] == 1 - rank and g.comm_tag[p2p[0]] == 7
        assert CollectiveType.REDUCE_SCATTER in g.comm_type[comm].tolist()


def test_read_linked(shared_traces):
    d = shared_traces / "et_kineto" / "hta_simple_add"
    trace, report = read_linked(d / "et.json.gz", d / "kineto.json.gz")
    assert report.linking_rate == 1.0 and report.device_ops_attached > 0
    assert trace.meta.extra["link"]["device_ops_attached"] == report.device_ops_attached


def _nccl_pair(kernel_has_comm: bool) -> tuple[Trace, Trace]:
    """A hand-built ET and Kineto of one all_reduce launched through record_param_comms."""
    from ettools.graph import GraphBuilder, ProcessGroup, StringTable, TraceMeta

    s1 = StringTable()
    e = GraphBuilder(0, s1)
    names = ["c10d::allreduce_", "record_param_comms", "nccl:all_reduce"]
    for i, n in enumerate(names):
        e.add_node(n, resource="thread 1", is_cpu_op=1, node_id=10 + i)
        row = e.last_row
        e.set_attr(row, "rf_id", 100 + i, "int64_val")
        if i:
            e.add_dep(row, 10 + i - 1, EdgeKind.NEST)
    e.set(1, "type", int(NodeType.COMM_COLL_NODE))
    e.set(1, "comm_type", int(CollectiveType.ALL_REDUCE))
    e.set(1, "comm_bytes", 400)
    e.set(1, "comm_group", "0")
    meta = TraceMeta(world_size=2)
    meta.add_group(ProcessGroup("0", (0, 1)))
    et = Trace(meta, {0: e.build()}, s1)

    s2 = StringTable()
    k = GraphBuilder(0, s2)
    for i, n in enumerate(names + ["cudaLaunchKernel"]):
        row = k.add_node(n, start=10.0 + i, dur=10.0 - 2 * i, resource="thread 77", is_cpu_op=1, node_id=i)
        k.set_attr(row, "cat", "cuda_runtime" if i == 3 else "cpu_op", "string_val")
        if i < 3:
            k.set_attr(row, "rf_id", 100 + i, "int64_val")
        k.set_attr(row, "ext_id", 500 + i, "int64_val")
        if i:
            k.add_dep(row, i - 1, EdgeKind.NEST)
    k.set_attr(3, "correlation", 9, "int64_val")
    row = k.add_node("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                     start=20.0, dur=50.0, resource="stream 7", is_cpu_op=0, node_id=4)
    k.set_attr(row, "cat", "kernel", "string_val")
    k.set_attr(row, "correlation", 9, "int64_val")
    k.add_dep(row, 3, EdgeKind.LAUNCH)
    if kernel_has_comm:
        k.set(row, "type", int(NodeType.COMM_COLL_NODE))
        k.set(row, "comm_type", int(CollectiveType.ALL_REDUCE))
        k.set(row, "comm_bytes", 400)
        k.set(row, "comm_group", "0")
    return et, Trace(TraceMeta(world_size=2), {0: k.build()}, s2)


@pytest.mark.parametrize("kernel_has_comm", [True, False])
def test_nccl_kernel_becomes_the_comm_node(kernel_has_comm):
    et, k = _nccl_pair(kernel_has_comm)
    trace, report = link_et_kineto(et, k)
    g = trace[0]
    assert report.method == "rf_id" and report.linking_rate == 1.0 and report.device_ops_attached == 1
    comm = np.flatnonzero(g.type != NodeType.COMP_NODE).tolist()
    assert [g.name_of(r) for r in comm] == [g.name_of(3)] and g.name_of(3).startswith("ncclDevKernel")
    assert (g.comm_type[3], g.comm_bytes[3], g.group_name(3)) == (CollectiveType.ALL_REDUCE, 400, "0")
    assert g.attr("host_comm_bytes").as_dict() == {1: 400} and g.comm_type[1] == -1
    # launched from the deepest matched op, timed, with the launch offset
    assert g.deps_of(3)[0] == (12, EdgeKind.LAUNCH)
    assert g.start[3] == 20.0 and g.start[0] == 10.0 and g.dur[2] == 6.0
    assert g.attr("launch_offset_us").get(3) == pytest.approx(13.0 - 12.0)
    assert g.attr("launch_api").get(3) == "cudaLaunchKernel"


# ---- the project's own captures: record-function ids present, many parallel plans ------------
SAMPLE_DIR = Path(__file__).resolve().parents[1] / "sample_traces"
SAMPLES = sorted(p.name for p in SAMPLE_DIR.iterdir() if p.is_dir() and any(p.glob("rank*.et.json.gz")))


@pytest.mark.parametrize("scenario", SAMPLES)
def test_sample_captures_rf_id_and_sequence_agree(scenario):
    d = SAMPLE_DIR / scenario
    et = read_pytorch_et(sorted(d.glob("rank*.et.json.gz")))
    k = read_k(sorted(d.glob("rank*.kineto.json.gz")))
    by_rf, rep_rf = link_et_kineto(et, k)
    assert rep_rf.method == "rf_id" and rep_rf.host_ops_matched == rep_rf.et_host_ops
    # the collective count is unchanged: the gloo span replaces its c10d op as the comm node
    for r in et.ranks:
        assert (by_rf[r].type != NodeType.COMP_NODE).sum() == (et[r].type != NodeType.COMP_NODE).sum()
        assert by_rf[r].dangling_edges() == 0 and by_rf[r].topological_order() is not None
    for g in k:
        g.attrs.pop("rf_id", None)
    by_seq, rep_seq = link_et_kineto(et, k)
    assert rep_seq.method == "sequence"
    assert rep_seq.host_ops_matched >= 0.95 * rep_seq.et_host_ops
    for r in et.ranks:
        a = by_rf[r].attr("kineto_ext_id").as_dict()
        b = by_seq[r].attr("kineto_ext_id").as_dict()
        assert sum(a.get(x) == y for x, y in b.items()) >= 0.99 * len(b)
