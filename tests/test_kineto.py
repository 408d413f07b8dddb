"""Kineto reader on every real Kineto trace: counts read independently from the JSON, edges,
collectives, steps, bad input; the replayable pass and its self-replay."""

from __future__ import annotations

import collections
import functools
import gzip
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from shared_kineto import read_json

from ettools.converters.kineto import read_kineto
from ettools.errors import TraceError
from ettools.graph import COMM_NODE_TYPES, CollectiveType, EdgeKind, NodeType
from ettools.replayable import asap_schedule, measured_rows, prev_ge, replayable_trace, to_replayable

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "shared" / "traces"
SAMPLES = HERE.parent / "sample_traces"
GLOO_PAIR = HERE / "data" / "gloo_2rank"

KINETO_DIRS = [
    "kineto/hta_nccl_2rank",
    "kineto/hta_world128_sampled",
    "kineto/hta_fwdbwd_1rank",
    "kineto/hta_alexnet_1rank",
    "kineto/hta_event_sync_multistream",
    "kineto/hta_amd_mi250",
    "kineto/hta_cpu_only_gloo",
    "et_kineto/param_resnet/kineto.json.gz",
    "et_kineto/param_linear/kineto.json.gz",
    "et_kineto/hta_simple_add/kineto.json.gz",
    "et_kineto/triosim_vgg13_h100/kineto.json.gz",
]
SAMPLE_DIRS = sorted(p.name for p in SAMPLES.iterdir() if p.is_dir() and list(p.glob("*kineto*"))) \
    if SAMPLES.is_dir() else []

HOST_CATS = {"cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver"}
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
DTYPE = {"float": 4, "double": 8, "half": 2, "bfloat16": 2, "long": 8, "int": 4, "byte": 1, "char": 1,
         "unsigned char": 1, "signed char": 1, "c10::half": 2, "c10::bfloat16": 2, "long int": 8}
COLL = {"allreduce": CollectiveType.ALL_REDUCE, "broadcast": CollectiveType.BROADCAST,
        "allgather": CollectiveType.ALL_GATHER, "reducescatter": CollectiveType.REDUCE_SCATTER,
        "alltoall": CollectiveType.ALL_TO_ALL, "barrier": CollectiveType.BARRIER}


# ---- an independent reading of the raw JSON --------------------------------------------------
def files_of(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(q for q in path.iterdir() if q.name.endswith(".json.gz") and "et." not in q.name)


@functools.lru_cache(maxsize=4)  # parsed JSON is large: keep a few
def raw(path: Path) -> dict:
    return read_json(path)


@functools.cache
def load(path: Path, steps: str | None = None):
    return read_kineto(path, steps=steps)


def resolve(name: str) -> Path:
    return SHARED / name


def expected_kept(events: list[dict]) -> list[dict]:
    """Complete events of node categories kept by the step rule (host: start in the chosen steps'
    span; device: launched by a kept runtime call, or start in span without a launcher)."""
    xs = [e for e in events if e.get("ph") == "X"]
    steps = [e for e in xs if e.get("cat") == "user_annotation" and re.fullmatch(r"ProfilerStep#\d+", e["name"])]
    if steps:
        s0 = min(e["ts"] for e in steps)
        s1 = max(e["ts"] + e["dur"] for e in steps)
    else:
        s0, s1 = -math.inf, math.inf
    host = [e for e in xs if e.get("cat") in HOST_CATS and s0 <= e["ts"] < s1]
    runtime_all = {e["args"]["correlation"]: e for e in xs if e.get("cat") in ("cuda_runtime", "cuda_driver")
                   and "correlation" in e.get("args", {})}
    kept_rt = {e["args"]["correlation"] for e in host if e.get("cat") in ("cuda_runtime", "cuda_driver")
               and "correlation" in e.get("args", {})}
    dev = []
    for e in xs:
        if e.get("cat") not in DEVICE_CATS:
            continue
        c = e.get("args", {}).get("correlation")
        if c in runtime_all:
            if c in kept_rt:
                dev.append(e)
        elif s0 <= e["ts"] < s1:
            dev.append(e)
    return host + dev


def graph_cats(g) -> collections.Counter:
    col = g.attr("cat")
    return collections.Counter(col.values) if col is not None else collections.Counter()


# ---- every shared Kineto trace ---------------------------------------------------------------
@pytest.mark.parametrize("name", KINETO_DIRS)
def test_node_counts_per_category(name):
    trace = load(resolve(name))
    for path in files_of(resolve(name)):
        data = raw(path)
        rank = data.get("distributedInfo", {}).get("rank", 0)
        want = collections.Counter(e["cat"] for e in expected_kept(data["traceEvents"]))
        g = trace[rank]
        assert graph_cats(g) == want, path
        assert len(g) == sum(want.values())


@pytest.mark.parametrize("name", KINETO_DIRS)
def test_graph_invariants(name):
    trace = load(resolve(name))
    for g in trace:
        assert g.topological_order() is not None, "cycle"
        assert g.dangling_edges() == 0
        ids = g.id
        assert len(np.unique(ids)) == len(ids)
        host = g.is_cpu_op == 1
        res = np.array(g.strings.decode(g.resource))
        assert all(r.startswith("thread ") for r in res[host])
        assert all("stream " in r for r in res[~host])
        # every COMM_COLL is complete and its group is known
        for i in np.flatnonzero(g.type == NodeType.COMM_COLL_NODE):
            assert g.comm_type[i] >= 0 and g.comm_bytes[i] >= 0
            assert g.group_name(i) in trace.meta.process_groups
        gap = g.attr("gap_before_us")
        if gap is not None:
            assert min(gap.values) >= 0
        # NEST edges point to a host op containing the child's start
        src, dst, kind = g.edge_rows()
        nest = kind == EdgeKind.NEST
        assert np.all(g.start[src[nest]] <= g.start[dst[nest]])
        assert np.all(g.start[dst[nest]] <= g.start[src[nest]] + g.dur[src[nest]])


@pytest.mark.parametrize("name", KINETO_DIRS)
def test_every_launched_op_has_launch_edge(name):
    trace = load(resolve(name))
    for g in trace:
        corr = g.attr("correlation").as_dict() if g.attr("correlation") else {}
        cat = g.attr("cat").as_dict()
        runtime = {c: r for r, c in corr.items() if cat[r] in ("cuda_runtime", "cuda_driver")}
        src, dst, kind = g.edge_rows()
        launch = dict(zip(dst[kind == EdgeKind.LAUNCH].tolist(), src[kind == EdgeKind.LAUNCH].tolist()))
        n_dev = 0
        for r in np.flatnonzero(g.is_cpu_op == 0).tolist():
            c = corr.get(r)
            if c in runtime:
                n_dev += 1
                assert launch.get(r) == runtime[c], (g.rank, r)
        assert n_dev == len([r for r in launch if g.is_cpu_op[r] == 0])


def test_attribute_contract_small():
    path = resolve("et_kineto/hta_simple_add/kineto.json.gz")
    trace = load(path)
    g = trace[0]
    origin = trace.meta.extra["kineto_time_origin_us"]
    by_key = {}
    for e in expected_kept(raw(path)["traceEvents"]):
        by_key[(e["cat"], e["name"], round(e["ts"], 1))] = e
    cats = g.attr("cat").as_dict()
    for r in range(len(g)):
        e = by_key[(cats[r], g.name_of(r), round(g.start[r] + origin, 1))]
        a = e.get("args", {})
        assert g.attr("ext_id").get(r) == a.get("External id")
        rf_col = g.attr("rf_id")
        assert (rf_col.get(r) if rf_col else None) == (a.get("Record function id") or None)
        assert g.attr("correlation").get(r) == a.get("correlation")
        assert (g.attr("seq").get(r) if g.attr("seq") else None) == a.get("Sequence number")
        assert g.dur[r] == pytest.approx(e["dur"])


# ---- collectives ----------------------------------------------------------------------------
def test_nccl_kernels_are_comm_coll_with_in_msg_bytes():
    path = resolve("kineto/hta_nccl_2rank/rank0.json.gz")
    g = load(resolve("kineto/hta_nccl_2rank"))[0]
    trace = load(resolve("kineto/hta_nccl_2rank"))
    kernels = [e for e in expected_kept(raw(path)["traceEvents"])
               if e["cat"] == "kernel" and e["name"].startswith(("ncclKernel", "ncclDevKernel"))]
    assert len(kernels) == 21
    corr = {c: r for r, c in g.attr("correlation").as_dict().items()}
    for e in kernels:
        a = e["args"]
        r = corr[a["correlation"]]
        assert g.type[r] == NodeType.COMM_COLL_NODE
        assert g.comm_bytes[r] == a["In msg nelems"] * DTYPE[a["dtype"].lower()]
        assert g.comm_type[r] == COLL[a["Collective name"].replace("_", "")]
        assert g.group_name(r) == a["Process Group Name"]
        assert trace.meta.process_groups[a["Process Group Name"]].ranks == (0, 1)
    assert (np.isin(g.type, [int(t) for t in COMM_NODE_TYPES])).sum() == 21
    assert trace.meta.world_size == 2


def test_world128_two_ranks_one_trace():
    trace = load(resolve("kineto/hta_world128_sampled"))
    assert trace.ranks == [0, 1]
    assert trace.meta.world_size == 128
    for g in trace:
        path = resolve(f"kineto/hta_world128_sampled/rank{g.rank}.json.gz")
        n_nccl = sum(1 for e in expected_kept(raw(path)["traceEvents"])
                     if e["cat"] == "kernel" and e["name"].startswith("ncclKernel"))
        comm = np.flatnonzero(np.isin(g.type, [int(t) for t in COMM_NODE_TYPES]))
        assert len(comm) == n_nccl == 10
        for r in comm:
            assert trace.meta.process_groups[g.group_name(r)].ranks == tuple(range(128))
        # all-to-all kernels get their bytes from the nccl:all_to_all span around the launch
        assert (g.comm_bytes[comm] > 0).all()


def test_cpu_only_gloo_comm_nodes():
    path = resolve("kineto/hta_cpu_only_gloo/rank34.json.gz")
    trace = load(resolve("kineto/hta_cpu_only_gloo"))
    assert trace.ranks == [34] and trace.meta.world_size == 300
    pg = raw(path)["distributedInfo"]["pg_config"]
    assert set(trace.meta.process_groups) == {p["pg_name"] for p in pg}
    g = trace[34]
    spans = [e for e in expected_kept(raw(path)["traceEvents"]) if e["name"].startswith("gloo:")]
    comm = np.flatnonzero(g.type == NodeType.COMM_COLL_NODE)
    assert len(comm) == len(spans) > 0
    want = sorted(math.prod(e["args"]["Input Dims"][0]) * DTYPE[e["args"]["Input type"][0]] for e in spans)
    assert sorted(g.comm_bytes[comm].tolist()) == want
    assert (g.comm_type[comm] == CollectiveType.ALL_REDUCE).all()


def _expected_collectives(manifest: dict, scenario: str, rank: int) -> collections.Counter:
    out = collections.Counter()
    for c in manifest["scenarios"][scenario]["expected_collectives"].get(str(rank), []):
        out[(c["type"], c["bytes"])] += c["count"]
    return out


def _graph_collectives(g) -> collections.Counter:
    out = collections.Counter()
    for i in np.flatnonzero(np.isin(g.type, [int(t) for t in COMM_NODE_TYPES])).tolist():
        t = int(g.type[i])
        name = CollectiveType(int(g.comm_type[i])).name if t == NodeType.COMM_COLL_NODE else (
            "SEND" if t == NodeType.COMM_SEND_NODE else "RECV")
        out[(name, int(g.comm_bytes[i]))] += 1
    return out


def _check_p2p_pairs(trace) -> int:
    sends, recvs = collections.Counter(), collections.Counter()
    for g in trace:
        for i in np.flatnonzero(g.type == NodeType.COMM_SEND_NODE).tolist():
            sends[(g.rank, int(g.comm_peer[i]), int(g.comm_tag[i]), int(g.comm_bytes[i]))] += 1
        for i in np.flatnonzero(g.type == NodeType.COMM_RECV_NODE).tolist():
            recvs[(int(g.comm_peer[i]), g.rank, int(g.comm_tag[i]), int(g.comm_bytes[i]))] += 1
    assert sends == recvs
    return sum(sends.values())


@pytest.mark.skipif(not SAMPLE_DIRS, reason="no sample captures")
@pytest.mark.parametrize("scenario", SAMPLE_DIRS)
def test_gloo_sample_captures(scenario):
    manifest = json.loads((SAMPLES / "manifest.json").read_text())
    trace = read_kineto(SAMPLES / scenario)
    for g in trace:
        assert _graph_collectives(g) == _expected_collectives(manifest, scenario, g.rank)
        assert g.topological_order() is not None and g.dangling_edges() == 0
        for i in np.flatnonzero(g.type == NodeType.COMM_COLL_NODE):
            assert g.group_name(i) in trace.meta.process_groups
        # every gloo transfer is tied to the c10d op that issued it
        src, dst, kind = g.edge_rows()
        issued = {int(d): g.name_of(s) for s, d, k in zip(src, dst, kind) if k == EdgeKind.LAUNCH}
        for i in np.flatnonzero(np.isin(g.type, [int(t) for t in COMM_NODE_TYPES])).tolist():
            assert issued[i].startswith("c10d::")
    _check_p2p_pairs(trace)


@pytest.mark.skipif(not (SAMPLES / "pp_1f1b").is_dir(), reason="no pipeline capture")
def test_gloo_send_recv_pair_across_ranks():
    trace = read_kineto(SAMPLES / "pp_1f1b")
    assert _check_p2p_pairs(trace) == 8
    for g in trace:
        res = set(g.strings.decode(g.resource[g.type == NodeType.COMM_SEND_NODE]))
        assert all(r.endswith(" p2p") for r in res)


def test_gloo_pair_from_tests_data():
    files = sorted(GLOO_PAIR.glob("rank*.kineto.json.gz"))
    trace = read_kineto(files)
    assert trace.ranks == [0, 1]
    for g in trace:
        raw_spans = [e for e in expected_kept(raw(files[g.rank])["traceEvents"]) if e["name"].startswith("gloo:")]
        comm = np.isin(g.type, [int(t) for t in COMM_NODE_TYPES])
        assert comm.sum() == len(raw_spans)


# ---- devices, syncs, flows ------------------------------------------------------------------
def test_amd_device_naming():
    trace = load(resolve("kineto/hta_amd_mi250"))
    g = trace[0]
    assert g.meta["devices"] == [2]
    dev = g.is_cpu_op == 0
    assert set(g.strings.decode(g.resource[dev])) == {"stream 0"}
    src, dst, kind = g.edge_rows()
    launchers = {g.name_of(s) for s, k in zip(src, kind) if k == EdgeKind.LAUNCH}
    assert launchers <= {"hipLaunchKernel", "hipExtModuleLaunchKernel", "hipMemcpyWithStream"}
    assert "hipLaunchKernel" in launchers
    assert len(trace.meta.device_properties) == 4


def _last_before(ops: list[dict], stream: int, corr: int) -> dict | None:
    cands = [e for e in ops if e["args"].get("stream") == stream and e["args"]["correlation"] < corr]
    return max(cands, key=lambda e: e["args"]["correlation"]) if cands else None


def test_event_sync_multistream_sync_edges():
    path = resolve("kineto/hta_event_sync_multistream/rank0.json.gz")
    ev = raw(path)["traceEvents"]
    g = load(resolve("kineto/hta_event_sync_multistream"))[0]
    corr = {c: r for r, c in g.attr("correlation").as_dict().items() if g.is_cpu_op[r] == 0}
    host_corr = {c: r for r, c in g.attr("correlation").as_dict().items() if g.is_cpu_op[r] == 1}
    ops = [e for e in ev if e.get("cat") in DEVICE_CATS]
    src, dst, kind = g.edge_rows()
    sync = set(zip(dst[kind == EdgeKind.SYNC].tolist(), src[kind == EdgeKind.SYNC].tolist()))
    want = set()
    for s in (e for e in ev if e.get("cat") == "cuda_sync"):
        a = s["args"]
        if a["cuda_sync_kind"] == "Stream Wait Event":
            tgt = _last_before(ops, a["wait_on_stream"], a["wait_on_cuda_event_record_corr_id"])
            waiter = min((e for e in ops if e["args"]["stream"] == a["stream"] and e["args"]["correlation"] > a["correlation"]),
                         key=lambda e: e["args"]["correlation"])
            want.add((corr[waiter["args"]["correlation"]], corr[tgt["args"]["correlation"]]))
        elif a["cuda_sync_kind"] == "Event Sync" and a["wait_on_stream"] >= 0:
            call = [e for e in ev if e.get("cat") == "cuda_runtime" and e["args"]["correlation"] == a["correlation"]][0]
            if call["name"] != "cudaEventQuery":  # a query does not block
                tgt = _last_before(ops, a["wait_on_stream"], a["wait_on_cuda_event_record_corr_id"])
                want.add((host_corr[a["correlation"]], corr[tgt["args"]["correlation"]]))
        elif a["cuda_sync_kind"] == "Context Sync":
            for stream in {e["args"]["stream"] for e in ops}:
                tgt = _last_before(ops, stream, a["correlation"])
                if tgt is not None:
                    want.add((host_corr[a["correlation"]], corr[tgt["args"]["correlation"]]))
    assert want and sync == want


def test_alexnet_stream_sync_edges():
    g = load(resolve("kineto/hta_alexnet_1rank"))[0]
    src, dst, kind = g.edge_rows()
    sync = kind == EdgeKind.SYNC
    callers = collections.Counter(g.name_of(d) for d in dst[sync])
    assert callers["cudaStreamSynchronize"] > 0 and callers["cudaDeviceSynchronize"] > 0
    # a sync never waits for an op launched after it, and the wait ends before the call returns
    c = g.attr("correlation")
    for s, d in zip(src[sync], dst[sync]):
        if g.is_cpu_op[d] == 1:
            assert c.get(s) < c.get(d)
            assert g.start[s] + g.dur[s] <= g.start[d] + g.dur[d] + 1.0


def test_guessed_syncs_are_marked_and_consistent():
    g = load(resolve("kineto/hta_nccl_2rank"))[0]  # no cuda_sync events in this trace
    src, dst, kind = g.edge_rows()
    guessed = kind == EdgeKind.SYNC_GUESSED
    assert guessed.sum() == g.meta["sync_guessed"] > 0
    assert not (kind == EdgeKind.SYNC).any()
    end = g.start + g.dur
    for s, d in zip(src[guessed], dst[guessed]):
        limit = end[d] if g.is_cpu_op[d] == 1 else g.start[d]
        assert end[s] <= limit + 1.0


def test_fwdbwd_flows_become_ctrl_edges():
    path = resolve("kineto/hta_fwdbwd_1rank/rank0.json.gz")
    flows = collections.defaultdict(set)
    for e in raw(path)["traceEvents"]:
        if e.get("cat") == "fwdbwd":
            flows[e["id"]].add(e["ph"])
    pairs = sum(1 for v in flows.values() if v == {"s", "f"})
    g = load(resolve("kineto/hta_fwdbwd_1rank"))[0]
    src, dst, kind = g.edge_rows()
    ctrl = kind == EdgeKind.CTRL
    assert ctrl.sum() == pairs == 905
    assert np.all(g.start[src[ctrl]] < g.start[dst[ctrl]])  # forward before backward


def test_launch_facts():
    g = load(resolve("kineto/hta_fwdbwd_1rank"))[0]
    assert 0 < g.meta["launch_latency_us"] < 50
    assert 0 < g.meta["stream_gap_us"] < 5
    blocked = g.attr("launch_blocked")
    assert blocked is not None and len(blocked.rows) == g.meta["launch_blocked"] > 100
    assert 500 < g.meta["launch_queue_depth"] < 2000
    # blocked launches are long calls
    runtime = np.array([c == "cuda_runtime" for c in g.attr("cat").values])
    assert np.median(g.dur[blocked.rows]) > 5 * np.median(g.dur[runtime])


def test_memory_events():
    path = SHARED / "et_kineto/triosim_vgg13_h100/kineto.json.gz"
    g = load(path)[0]
    mem = [e for e in raw(path)["traceEvents"] if e.get("name") == "[memory]"]
    m = g.meta["memory"]
    assert len(m["ts"]) == len(mem) > 0
    assert sorted(m["total_allocated"].tolist()) == sorted(e["args"]["Total Allocated"] for e in mem)
    assert np.all(np.diff(m["ts"]) >= 0)


# ---- steps ----------------------------------------------------------------------------------
def test_steps_selection():
    path = resolve("kineto/hta_fwdbwd_1rank")
    full = load(path)[0]
    assert [s[0] for s in full.meta["steps"]] == [f"ProfilerStep#{i}" for i in range(101, 106)]
    one = read_kineto(path, steps="103")[0]
    assert [s[0] for s in one.meta["steps"]] == ["ProfilerStep#103"]
    _, s0, s1 = one.meta["steps"][0]
    assert len(one) < len(full) / 3
    host = one.is_cpu_op == 1
    assert np.all((one.start[host] >= s0) & (one.start[host] < s1))
    assert one.meta["step_times_us"][0] == pytest.approx(s1 - s0)
    two = read_kineto(path, steps="102-103")[0]
    assert [s[0] for s in two.meta["steps"]] == ["ProfilerStep#102", "ProfilerStep#103"]
    assert len(one) < len(two) < len(full)
    # device ops follow their launching call even when they run after the step ends
    assert one.dangling_edges() == 0
    with pytest.raises(TraceError, match="ProfilerStep#7"):
        read_kineto(path, steps="7")
    with pytest.raises(TraceError, match="bad steps"):
        read_kineto(path, steps="x")


def test_world128_both_ranks_keep_the_same_step():
    trace = read_kineto(resolve("kineto/hta_world128_sampled"), steps="552")
    for g in trace:
        assert [s[0] for s in g.meta["steps"]] == ["ProfilerStep#552"]


# ---- bad input ------------------------------------------------------------------------------
def _write(tmp_path: Path, name: str, payload: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(payload)
    return p


@pytest.mark.parametrize(
    "name,payload,message",
    [
        ("a.json", b"{not json", "not valid JSON"),
        ("b.json.gz", gzip.compress(b'{"traceEvents": []}', mtime=0)[:-12], "gzip"),
        ("c.json", b'{"foo": 1}', "traceEvents"),
        ("d.json", b'{"traceEvents": {"a": 1}}', "expected a list"),
        ("e.json", b"[1, 2]", "expected a JSON object"),
        ("f.json", b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "dur": 1}]}', r"traceEvents\[0\].*'ts'"),
        ("g.json", b'{"traceEvents": [{"ph": "M"}, {"ph": "X", "cat": "cpu_op", "name": "x", "ts": 1}]}',
         r"traceEvents\[1\].*'dur'"),
        ("h.json", b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "ts": "soon", "dur": 1}]}', "non-numeric"),
        ("i.json", b'{"traceEvents": [{"cat": "cpu_op"}]}', r"traceEvents\[0\] has no 'ph'"),
        ("j.json", b'{"traceEvents": [3]}', r"traceEvents\[0\] is not an object"),
    ],
)
def test_bad_input_names_the_file(tmp_path, name, payload, message):
    p = _write(tmp_path, name, payload)
    with pytest.raises(TraceError, match=message) as err:
        read_kineto(p)
    assert str(p) in str(err.value)


def test_unknown_categories_are_counted_not_fatal(tmp_path):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "a", "ts": 0, "dur": 10, "pid": 1, "tid": 1, "args": {}},
        {"ph": "X", "cat": "mystery", "name": "b", "ts": 1, "dur": 1, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "mystery", "name": "c", "ts": 2, "dur": 1, "pid": 1, "tid": 1},
        {"ph": "Q", "name": "odd"},
    ]
    p = _write(tmp_path, "rank5.json", json.dumps({"traceEvents": events}).encode())
    trace = read_kineto(p)
    assert trace.ranks == [5]  # rank from the file name
    assert len(trace[5]) == 1 and trace[5].meta["skipped"] == {"mystery": 2}


def test_duplicate_rank_rejected(tmp_path):
    body = json.dumps({"distributedInfo": {"rank": 0, "world_size": 2}, "traceEvents": []}).encode()
    a = _write(tmp_path, "x_kineto_a.json", body)
    b = _write(tmp_path, "x_kineto_b.json", body)
    with pytest.raises(TraceError, match="rank 0 already read"):
        read_kineto([a, b])


def test_directory_of_et_kineto_pairs_reads_kineto_halves():
    trace = read_kineto(GLOO_PAIR)
    assert trace.ranks == [0, 1]


# ---- replayable pass -------------------------------------------------------------------------
REPLAY_CASES = [
    ("kineto/hta_alexnet_1rank", 0),
    ("kineto/hta_fwdbwd_1rank", 0),
    ("kineto/hta_nccl_2rank", 0),
]


def _span_error(g) -> tuple[float, object]:
    rg = to_replayable(g)
    _, end = asap_schedule(rg)
    measured = (g.start + g.dur)[measured_rows(g)].max() - g.start.min()
    replayed = end[measured_rows(rg)].max()
    return (replayed - measured) / measured, rg


@pytest.mark.parametrize("name,rank", REPLAY_CASES)
def test_self_replay_reproduces_measured_span(name, rank):
    g = load(resolve(name))[rank]
    err, rg = _span_error(g)
    assert abs(err) < 0.02, f"self-replay off by {100 * err:.2f}%"
    assert not (rg.dep_kind == EdgeKind.NEST).any()
    assert rg.topological_order() is not None and rg.dangling_edges() == 0
    # comm nodes and device ops intact
    comm = np.isin(g.type, [int(t) for t in COMM_NODE_TYPES])
    rcomm = np.isin(rg.type, [int(t) for t in COMM_NODE_TYPES])
    assert sorted(g.id[comm].tolist()) == sorted(rg.id[rcomm].tolist())
    pos = rg.rows_of(g.id[comm])
    assert np.array_equal(rg.comm_bytes[pos], g.comm_bytes[comm])
    holds = np.array([n == "device_hold" for n in rg.names()], bool)  # measured unexplained holds
    assert ((rg.is_cpu_op == 0) & ~holds).sum() == (g.is_cpu_op == 0).sum()
    # host threads are chains: every host node has at most one host predecessor on its thread
    src, dst, kind = rg.edge_rows()
    order = kind == EdgeKind.ORDER
    host_order = order & (rg.is_cpu_op[src] == 1) & (rg.is_cpu_op[dst] == 1)
    assert np.bincount(dst[host_order], minlength=len(rg)).max() <= 1


@pytest.mark.parametrize("name", KINETO_DIRS)
def test_replayable_on_every_trace(name):
    rtrace = replayable_trace(load(resolve(name)))
    assert rtrace.ranks == load(resolve(name)).ranks
    for rg in rtrace:
        assert rg.topological_order() is not None and rg.dangling_edges() == 0
        assert not (rg.dep_kind == EdgeKind.NEST).any()
        assert np.all(rg.dur >= 0)
        gaps = np.array([n == "host_gap" for n in rg.names()])
        assert np.all(rg.is_cpu_op[gaps] == 1)


@pytest.mark.skipif(not SAMPLE_DIRS, reason="no sample captures")
@pytest.mark.parametrize("scenario", SAMPLE_DIRS)
def test_replayable_gloo_samples(scenario):
    for g in read_kineto(SAMPLES / scenario):
        err, rg = _span_error(g)
        assert abs(err) < 0.02
        assert rg.topological_order() is not None and rg.dangling_edges() == 0


def test_what_if_faster_kernels_shorten_gpu_bound_replay():
    g = load(resolve("kineto/hta_fwdbwd_1rank"))[0]
    rg = to_replayable(g)
    _, end = asap_schedule(rg)
    dev = rg.is_cpu_op == 0
    half = rg.replace(dur=np.where(dev, rg.dur * 0.5, rg.dur))
    _, end2 = asap_schedule(half)
    assert end2.max() < 0.9 * end.max()  # GPU-bound: faster kernels matter


def test_prev_ge_matches_brute_force():
    rng = np.random.default_rng(1)
    vals = rng.integers(0, 50, 300).astype(float)
    q = rng.integers(0, 50, 300).astype(float)
    got = prev_ge(vals, q)
    for i in range(300):
        want = max((j for j in range(i) if vals[j] >= q[i]), default=-1)
        assert got[i] == want
    pos = rng.integers(-1, 300, 300)
    got = prev_ge(vals, q, pos)
    for k in range(300):
        want = max((j for j in range(pos[k] + 1) if vals[j] >= q[k]), default=-1)
        assert got[k] == want


# ---- small synthetic traces for what no shared trace has ------------------------------------
def _rt(name, ts, dur, corr, tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "External id": corr}}


def _kernel(name, ts, dur, corr, device=0, stream=7, **args):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": stream, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "device": device, "stream": stream, **args}}


def test_several_devices_name_their_streams(tmp_path):
    events = [_rt("cudaLaunchKernel", 0, 5, 1), _kernel("k", 10, 3, 1, device=0),
              _rt("cudaLaunchKernel", 6, 5, 2), _kernel("k", 12, 3, 2, device=1)]
    p = _write(tmp_path, "t.json", json.dumps({"traceEvents": events}).encode())
    g = read_kineto(p)[0]
    assert sorted(g.strings.decode(g.resource[g.is_cpu_op == 0])) == ["device 0 stream 7", "device 1 stream 7"]
    assert g.meta["devices"] == [0, 1]


def test_nccl_send_recv_peers_and_tags_pair_up(tmp_path):
    def rank_file(rank, peer, op):
        ev = []
        for k in range(2):
            t = 100 * k
            args = {"Collective name": op, "In msg nelems": 1000, "Out msg nelems": 1000, "dtype": "Half",
                    "Process Group Name": "3", "Process Group Ranks": "[0, 1]", "Group size": 2,
                    "Dst Rank" if op == "send" else "Src Rank": peer}
            ev.append(_rt("cudaLaunchKernel", t, 5, 10 + k))
            ev.append(_kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", t + 10, 50, 10 + k, **args))
        return json.dumps({"distributedInfo": {"rank": rank, "world_size": 2, "backend": "nccl"},
                           "traceEvents": ev}).encode()

    a = _write(tmp_path, "rank0.json", rank_file(0, 1, "send"))
    b = _write(tmp_path, "rank1.json", rank_file(1, 0, "recv"))
    trace = read_kineto([a, b])
    assert _check_p2p_pairs(trace) == 2
    g0, g1 = trace[0], trace[1]
    s = np.flatnonzero(g0.type == NodeType.COMM_SEND_NODE)
    r = np.flatnonzero(g1.type == NodeType.COMM_RECV_NODE)
    assert g0.comm_peer[s].tolist() == [1, 1] and g1.comm_peer[r].tolist() == [0, 0]
    assert g0.comm_tag[s].tolist() == [0, 1] and (g0.comm_bytes[s] == 2000).all()
    assert trace.meta.process_groups["3"].ranks == (0, 1)


def test_record_param_comms_gives_metadata_to_bare_nccl_kernels(tmp_path):
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 100, "tid": 1, "ts": 0, "dur": 50,
         "args": {"Collective name": "_reduce_scatter_base", "In msg nelems": 4096, "Out msg nelems": 2048,
                  "dtype": "BFloat16", "Process Group Name": "0", "Process Group Ranks": "[0, 1]"}},
        _rt("cudaLaunchKernel", 10, 5, 7),
        _kernel("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 20, 9, 7),
    ]
    p = _write(tmp_path, "rank0.json", json.dumps({"distributedInfo": {"rank": 0, "world_size": 2},
                                                   "traceEvents": ev}).encode())
    g = read_kineto(p)[0]
    k = int(np.flatnonzero(g.type == NodeType.COMM_COLL_NODE)[0])
    assert g.comm_type[k] == CollectiveType.REDUCE_SCATTER and g.comm_bytes[k] == 4096 * 2
    assert g.attr("comm_source").get(k) == "record_param_comms"
