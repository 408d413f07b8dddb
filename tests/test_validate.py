"""``ettools.validate`` on the sample captures and real shared traces.

Expected values come from the sample manifest (the collectives each plan implies), from the
capture files read here with plain ``gzip``/``json``, or from the graph columns of the edited
node — never from the validator itself.
"""

from __future__ import annotations

import base64
import json
import re
from collections import Counter
from functools import cache
from html import escape as html_escape
from pathlib import Path

import numpy as np
import orjson
import pytest
from shared_kineto import read_json

from ettools.classify import CLASSES, classify
from ettools.formats import load_trace
from ettools.graph import CollectiveType, EdgeKind, NodeType, Trace
from ettools.validate import MEASURES, counted_ops, validate
from ettools.validate_report import NO_MATPLOTLIB, chart_png, render_report

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
MANIFEST = json.loads((SAMPLES / "manifest.json").read_text())
SCENARIOS = sorted(MANIFEST["scenarios"])
ROW = {"ALL_REDUCE": "AllReduce", "ALL_GATHER": "AllGather", "REDUCE_SCATTER": "ReduceScatter",
       "ALL_TO_ALL": "AllToAll", "SEND": "Send", "RECV": "Recv"}


@cache
def linked(scenario: str) -> Trace:
    """A sample capture read as ET + Kineto (linked)."""
    return load_trace([SAMPLES / scenario]).trace


@cache
def kineto_only(scenario: str) -> Trace:
    """The same capture read from its Kineto files alone."""
    return load_trace(sorted((SAMPLES / scenario).glob("rank*.kineto.json.gz"))).trace


def expected(scenario: str, rank: int) -> dict[str, tuple[int, int]]:
    """{row: (calls, bytes)} the manifest promises for one rank."""
    out: dict[str, list[int]] = {}
    for e in MANIFEST["scenarios"][scenario]["expected_collectives"][str(rank)]:
        c = out.setdefault(ROW[e["type"]], [0, 0])
        c[0] += e["count"]
        c[1] += e["count"] * e["bytes"]
    return {k: (v[0], v[1]) for k, v in out.items()}


def assert_all_zero(res, skip: set[tuple[str, str, str]] = frozenset()) -> None:
    """Every rank and total cell has error 0 (or is not comparable), except ``skip`` cells."""
    for name, t in res.tables.items():
        for col in t.columns:
            for row, cell in t.cells[col].items():
                if (name, col, row) in skip:
                    continue
                assert cell.error_pct in (0.0, None), (name, col, row, cell)


# ---- self-comparison -----------------------------------------------------------------------------

@pytest.mark.parametrize("scenario", SCENARIOS)
def test_self_validation_is_exact_on_every_sample(scenario):
    t = linked(scenario)
    res = validate(t, t)
    assert res.max_error_pct == 0.0
    assert res.exceeds(0.0) == []
    assert_all_zero(res)
    # what a timed capture must offer: counts, comm, times and steps
    assert {"op_counts", "comm_counts", "comm_bytes", "compute_time", "step_time"} <= set(res.tables)
    assert [p[0] for p in res.pairs] == [str(r) for r in t.ranks]


@pytest.mark.parametrize("path", [
    "kineto/hta_nccl_2rank/rank0.json.gz",
    "kineto/hta_world128_sampled",
    "et_kineto/param_resnet",
    "chakra/resnet_converted.0.et",
    "triosim/vgg13_h100_bs128/trace.csv",
])
def test_self_validation_is_exact_on_shared_traces(shared_traces, path):
    t = load_trace([shared_traces / path]).trace
    res = validate(t, t)
    assert res.max_error_pct == 0.0
    assert_all_zero(res)
    assert "op_counts" in res.tables


def test_device_unit_counts_every_kernel_copy_and_set_once(shared_traces):
    """A GPU Kineto trace: op classes = the classes of its device events, read here with json."""
    path = shared_traces / "kineto/hta_fwdbwd_1rank/rank0.json.gz"
    events = read_json(path)["traceEvents"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    lo, hi = min(s for s, _ in steps), max(e for _, e in steps)
    launches = {e["args"]["correlation"] for e in events
                if e.get("cat") == "cuda_runtime" and lo <= e["ts"] <= hi and "correlation" in e.get("args", {})}
    want = Counter(classify(e["name"]) for e in events
                   if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
                   and e.get("args", {}).get("correlation") in launches)
    t = load_trace([path]).trace
    res = validate(t, t)
    assert res.units == {"reference": ["device"], "candidate": ["device"]}
    got = {row: cell.reference for row, cell in res.tables["op_counts"].cells["0"].items()}
    assert got == {c: want.get(c, 0) for c in CLASSES}


# ---- the counting rule on the captures ----------------------------------------------------------

def _et_counts(scenario: str, rank: int) -> Counter:
    """Names of the rank's execution-trace nodes, read with plain gzip/json."""
    f = MANIFEST["scenarios"][scenario]["files"][str(rank)]["et"]
    et = read_json(SAMPLES / f)
    return Counter(n["name"] for n in et["nodes"])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_counting_rule_counts_each_operator_once(scenario):
    """GeMM = aten::mm nodes (each aten::linear holds exactly one; backward calls mm directly),
    Attention = SDPA calls + their backward nodes, Communication = the manifest's collectives."""
    t = linked(scenario)
    res = validate(t, t)
    for rank in t.ranks:
        names = _et_counts(scenario, rank)
        ops = {row: c.reference for row, c in res.tables["op_counts"].cells[str(rank)].items()}
        assert ops["GeMM"] == names["aten::mm"] > 0
        assert names["aten::linear"] > 0 and names["aten::matmul"] > 0  # nesting that must not double count
        assert ops["Attention"] == (names["aten::scaled_dot_product_attention"]
                                    + names["ScaledDotProductFlashAttentionForCpuBackward0"]) > 0
        exp = expected(scenario, rank)
        assert ops["Communication"] == sum(c for c, _ in exp.values())
        comm = {row: c.reference for row, c in res.tables["comm_counts"].cells[str(rank)].items() if c.reference}
        assert comm == {k: c for k, (c, _) in exp.items()}
        nbytes = {row: c.reference for row, c in res.tables["comm_bytes"].cells[str(rank)].items() if c.reference}
        assert nbytes == {k: b for k, (_, b) in exp.items()}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_kineto_alone_and_linked_readings_agree(scenario):
    """Nesting differs between the readings (gloo runloop work: nested in Kineto, orphaned in the
    ET); the counts must not."""
    res = validate(linked(scenario), kineto_only(scenario), measures=["op_counts", "comm_counts", "comm_bytes"])
    assert res.max_error_pct == 0.0
    assert_all_zero(res)


def test_nest_chain_counts_at_the_outermost_op():
    """aten::linear ⊃ aten::matmul ⊃ aten::mm: only the linear counts; the mm calls inside an
    autograd wrapper count each; a view chain counts once as Others."""
    t = linked("single")
    g = t[0]
    counted, codes, unit = counted_ops(g)
    assert unit == "host"
    names = np.array(g.names())
    assert counted[names == "aten::linear"].all()
    assert not counted[names == "aten::matmul"].any()
    src, dst, kind = g.edge_rows()
    parent = np.full(len(g), -1)
    nest = kind == EdgeKind.NEST
    parent[dst[nest]] = src[nest]
    mm = np.flatnonzero(names == "aten::mm")
    in_linear = np.array([names[parent[parent[r]]] == "aten::linear" for r in mm])
    assert not counted[mm[in_linear]].any()
    assert counted[mm[~in_linear]].all() and (~in_linear).sum() == 2 * (names == "MmBackward0").sum()
    assert not counted[names == "MmBackward0"].any()


@pytest.mark.parametrize("scenario", ["tp_sp", "moe_ep", "pp_1f1b"])
def test_counted_ops_never_nest_and_cover_every_leaf(scenario):
    """No counted op lies inside another; every leaf op lies in (or is) a counted op, or in a
    communication host op (``c10d::*``) whose comm node is the count."""
    for g in kineto_only(scenario):
        counted, _, _ = counted_ops(g)
        names = g.names()
        src, dst, kind = g.edge_rows()
        parent = np.full(len(g), -1)
        nest = kind == EdgeKind.NEST
        parent[dst[nest]] = src[nest]
        is_leaf = np.ones(len(g), bool)
        is_leaf[parent[parent >= 0]] = False
        comm = np.isin(g.type, [NodeType.COMM_COLL_NODE, NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE])
        for row in range(len(g)):
            chain = []
            a = parent[row]
            while a >= 0:
                chain.append(a)
                a = parent[a]
            if counted[row] and not comm[row]:
                assert not any(counted[a] for a in chain), names[row]
            if is_leaf[row] and not counted[row]:
                assert any(counted[a] or classify(names[a]) == "Communication" for a in [row, *chain]), names[row]


# ---- candidates with known edits -----------------------------------------------------------------

def _drop_one(t: Trace, rank: int, ctype: CollectiveType, which: int = 3) -> tuple[Trace, int]:
    """Copy of ``t`` without the ``which``-th collective of type ``ctype`` on ``rank``; its row."""
    g = t[rank]
    rows = np.flatnonzero((g.type == NodeType.COMM_COLL_NODE) & (g.comm_type == int(ctype)))
    row = int(rows[which])
    src, _, kind = g.edge_rows()
    assert not ((src == row) & (kind == EdgeKind.NEST)).any()  # nothing nested in it
    keep = np.ones(len(g), bool)
    keep[row] = False
    graphs = dict(t.graphs)
    graphs[rank] = g.select(keep)
    return Trace(t.meta, graphs, t.strings), row


@pytest.mark.parametrize("reading", [linked, kineto_only])
def test_dropped_collective_is_exactly_what_differs(reading):
    ref = reading("tp_sp")
    cand, row = _drop_one(ref, 1, CollectiveType.REDUCE_SCATTER)
    g = ref[1]
    exp = expected("tp_sp", 1)
    n_rs, b_rs = exp["ReduceScatter"]
    n_comm = sum(c for c, _ in exp.values())
    comm_rows = np.isin(g.type, [NodeType.COMM_COLL_NODE, NodeType.COMM_SEND_NODE, NodeType.COMM_RECV_NODE])
    t_comm = float(g.dur[comm_rows].sum())
    d = float(g.dur[row])

    res = validate(ref, cand)
    want = {
        ("comm_counts", "1", "ReduceScatter"): (n_rs, n_rs - 1),
        ("comm_bytes", "1", "ReduceScatter"): (b_rs, b_rs - b_rs // n_rs),
        ("op_counts", "1", "Communication"): (n_comm, n_comm - 1),
        ("compute_time", "1", "Communication"): (t_comm, t_comm - d),
    }
    found = {(name, col, r): (c.reference, c.candidate)
             for name, t in res.tables.items() for col, r, c in t.differing()}
    assert set(found) == set(want)
    for key, (r, c) in want.items():
        cell = res.tables[key[0]].cells[key[1]][key[2]]
        assert cell.reference == pytest.approx(r) and cell.candidate == pytest.approx(c)
        assert cell.error_pct == pytest.approx(abs(r - c) / r * 100)
    assert res.tables["comm_counts"].cells["1"]["ReduceScatter"].error_pct == pytest.approx(100 / n_rs)
    # total columns move by the same absolute amount; totals of other rows stay exact
    assert res.tables["comm_counts"].cells["total"]["ReduceScatter"].candidate == 2 * n_rs - 1
    skip = {(k[0], c, k[2]) for k in want for c in ("1", "total")}
    assert_all_zero(res, skip)
    # the measure's total error is Σ|c − r| / Σ r over both ranks
    n_total = sum(sum(c for c, _ in expected("tp_sp", r).values()) for r in (0, 1))
    assert res.errors["comm_counts"] == pytest.approx(100 / n_total)
    assert res.errors["step_time"] == 0.0


def test_dropping_the_only_all_reduce_is_100_percent():
    ref = linked("ddp")
    cand, _ = _drop_one(ref, 0, CollectiveType.ALL_REDUCE, which=0)
    res = validate(ref, cand)
    cell = res.tables["comm_counts"].cells["0"]["AllReduce"]
    assert (cell.reference, cell.candidate, cell.error_pct) == (1, 0, 100.0)
    assert res.tables["comm_bytes"].cells["0"]["AllReduce"].error_pct == 100.0
    assert res.tables["comm_counts"].cells["1"]["AllReduce"].error_pct == 0.0


@pytest.mark.parametrize("scenario", ["fsdp", "moe_ep", "pp_1f1b"])
def test_doubled_sizes_change_only_the_bytes(scenario):
    ref = linked(scenario)
    graphs = {r: g.replace(comm_bytes=np.where(g.comm_bytes >= 0, 2 * g.comm_bytes, g.comm_bytes))
              for r, g in ref.graphs.items()}
    res = validate(ref, Trace(ref.meta, graphs, ref.strings))
    t = res.tables["comm_bytes"]
    for rank in ref.ranks:
        for row, (_, nbytes) in expected(scenario, rank).items():
            cell = t.cells[str(rank)][row]
            assert (cell.reference, cell.candidate, cell.error_pct) == (nbytes, 2 * nbytes, 100.0)
    assert res.errors["comm_bytes"] == 100.0
    assert res.max_error_pct == 100.0
    assert {k: v for k, v in res.errors.items() if v} == {"comm_bytes": 100.0}
    assert res.exceeds(99.0) == ["comm_bytes"]
    assert res.exceeds(99.0, ["op_counts", "comm_counts"]) == []


# ---- tolerance logic ------------------------------------------------------------------------------

def test_exceeds_and_max_error_agree():
    ref = linked("tp_sp")
    cand, _ = _drop_one(ref, 1, CollectiveType.REDUCE_SCATTER)
    res = validate(ref, cand)
    top = res.max_error_pct
    assert top == max(res.errors.values()) > 0
    assert res.exceeds(top) == []  # equal to the tolerance passes
    assert res.exceeds(top * 0.999) != []
    assert set(res.exceeds(0.0)) == {m for m, e in res.errors.items() if e > 0}
    assert res.exceeds(0.0, ["step_time"]) == []
    assert res.exceeds(0.0, ["comm_counts", "step_time"]) == ["comm_counts"]
    with pytest.raises(ValueError, match="unknown measure"):
        res.exceeds(1.0, ["bogus"])
    with pytest.raises(ValueError, match="unknown measure"):
        validate(ref, cand, measures=["bogus"])


def test_a_measure_that_cannot_be_compared_fails_the_gate():
    t = linked("single")
    bare = Trace(t.meta, {0: t[0].replace(start=np.full(len(t[0]), np.nan), dur=np.full(len(t[0]), np.nan))},
                 t.strings)
    bare[0].meta.pop("steps", None)
    res = validate(t, bare)
    assert "step_time" in res.skipped and "compute_time" in res.skipped
    assert "step_time" not in res.errors
    assert res.exceeds(50.0) == []
    assert res.exceeds(50.0, ["op_counts", "step_time"]) == ["step_time"]


def test_measures_limit_the_tables():
    t = linked("ddp")
    res = validate(t, t, measures=["comm_bytes", "op_counts"])
    assert list(res.tables) == ["op_counts", "comm_bytes"]


# ---- ranks ----------------------------------------------------------------------------------------

def test_single_rank_candidate_is_compared_with_each_reference_rank():
    ref = linked("tp_sp")
    one = Trace(ref.meta, {0: ref[0]}, ref.strings)
    res = validate(ref, one)
    assert res.pairs == [("0", 0, 0), ("1", 1, 0)]
    assert res.tables["comm_counts"].column_error_pct["0"] == 0.0
    assert res.notes and "one rank" in res.notes[0]
    res = validate(one, ref)
    assert res.pairs == [("0", 0, 0), ("1", 0, 1)]


def test_ranks_in_common_and_no_ranks_in_common():
    ref = linked("tp_sp")
    a = Trace(ref.meta, {0: ref[0], 1: ref[1], 2: ref[1].with_rank(2)}, ref.strings)
    b = Trace(ref.meta, {0: ref[0], 1: ref[1], 3: ref[1].with_rank(3)}, ref.strings)
    res = validate(a, b)
    assert [p[0] for p in res.pairs] == ["0", "1"]
    assert any("only in the reference" in n and "[2]" in n for n in res.notes)
    c = Trace(ref.meta, {5: ref[0].with_rank(5), 6: ref[1].with_rank(6)}, ref.strings)
    with pytest.raises(ValueError, match="no ranks in common"):
        validate(ref, c)


def test_memory_from_kineto_events_is_compared():
    t = kineto_only("single")
    res = validate(t, t)
    assert res.tables["peak_memory"].cells["0"]["peak"].reference > 0
    m = t[0].meta["memory"]
    assert res.tables["peak_memory"].cells["0"]["peak"].reference == int(m["total_allocated"].max())
    half = Trace(t.meta, {0: t[0].replace()}, t.strings)
    half[0].meta["memory"] = dict(m, total_allocated=m["total_allocated"] // 2)
    res = validate(t, half)
    assert res.tables["peak_memory"].cells["0"]["peak"].error_pct == pytest.approx(50.0, abs=1e-3)


def test_synthesized_candidate_matches_the_capture_on_matmuls_and_attention():
    from ettools.converters.symbolic import synthesize

    ref = linked("single")
    cand = synthesize(model="sample_gpt").trace
    res = validate(ref, cand)
    ops = res.tables["op_counts"].cells["0"]
    assert ops["GeMM"].error_pct == 0.0 and ops["Attention"].error_pct == 0.0
    assert res.units == {"reference": ["host"], "candidate": ["device"]}
    assert any("different units" in n for n in res.notes)


# ---- JSON and reports -----------------------------------------------------------------------------

def _edited() -> tuple[Trace, Trace]:
    ref = linked("tp_sp")
    cand, _ = _drop_one(ref, 1, CollectiveType.REDUCE_SCATTER)
    return ref, cand


def test_json_shape():
    ref, cand = _edited()
    res = validate(ref, cand)
    doc = orjson.loads(orjson.dumps(res.to_json(), option=orjson.OPT_SORT_KEYS))
    assert isinstance(doc["max_error_pct"], float)
    assert set(doc["tables"]) <= set(MEASURES)
    assert set(doc["errors"]) == set(doc["tables"])
    for name, t in doc["tables"].items():
        assert t["columns"] == ["0", "1", "total"]
        assert t["error_pct"] == doc["errors"][name]
        for col in t["columns"]:
            assert sorted(t["cells"][col]) == sorted(t["rows"])
            for cell in t["cells"][col].values():
                assert set(cell) == {"reference", "candidate", "error_pct"}
    assert doc["tables"]["comm_counts"]["cells"]["1"]["ReduceScatter"] == {
        "reference": 8, "candidate": 7, "error_pct": 12.5}
    # linked captures keep Kineto's [memory] events: peak memory is compared, and dropping a
    # collective node does not change the measured curve
    assert doc["errors"]["peak_memory"] == 0
    assert doc["pairs"][1] == {"column": "1", "reference_rank": 1, "candidate_rank": 1}
    # deterministic
    again = orjson.dumps(validate(ref, cand).to_json(), option=orjson.OPT_SORT_KEYS)
    assert again == orjson.dumps(res.to_json(), option=orjson.OPT_SORT_KEYS)


def test_markdown_and_html_reports(tmp_path):
    pytest.importorskip("matplotlib")
    ref, cand = _edited()
    res = validate(ref, cand, reference_name="tp_sp capture", candidate_name="edited")
    md = render_report(res, tmp_path / "report.md")
    assert md[0] == tmp_path / "report.md"
    text = md[0].read_text()
    assert "| ReduceScatter |" in text and "12.5 %" in text
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(links) == len(res.tables) + 1
    for link in links:
        assert (tmp_path / link).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(md[1:]) == sorted(tmp_path / link for link in links)

    (page,) = render_report(res, tmp_path / "report.html")
    html = page.read_text()
    imgs = re.findall(r'<img [^>]*src="([^"]+)"', html)
    assert len(imgs) == len(res.tables) + 1
    for src in imgs:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert not re.search(r'(src|href)="(?!data:)', html)  # self-contained
    assert "tp_sp capture" in html and "12.5 %" in html
    assert chart_png(res.tables["comm_counts"]) == chart_png(res.tables["comm_counts"])  # deterministic
    with pytest.raises(ValueError, match=r"\.md or \.html"):
        render_report(res, tmp_path / "report.pdf")


def test_reports_without_matplotlib(tmp_path, monkeypatch):
    import ettools.validate_report as vr

    monkeypatch.setattr(vr, "have_matplotlib", lambda: False)
    t = linked("ddp")
    res = validate(t, t)
    (page,) = render_report(res, tmp_path / "r.html")
    html = page.read_text()
    assert "<img" not in html and html_escape(NO_MATPLOTLIB) in html and "AllReduce" in html
    md = render_report(res, tmp_path / "r.md")
    assert md == [tmp_path / "r.md"]
    assert NO_MATPLOTLIB in md[0].read_text()
    assert not (tmp_path / "r_charts").exists()


def test_step_time_of_a_step_sliced_for_chakra_is_its_span(tmp_path, sample_traces):
    """Chakra output cuts ProfilerStep#N into slices of one name: the step is their span."""
    from click.testing import CliRunner

    from ettools.cli import main
    from ettools.validate import step_time_of

    out = tmp_path / "rw"
    r = CliRunner().invoke(main, ["scale", str(sample_traces / "single"), "--tp", "2", "--sp", "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    g = load_trace([out]).trace.graphs[0]
    sid = g.strings.lookup("ProfilerStep#6")
    rows = np.flatnonzero(g.name == sid)
    assert len(rows) > 1  # sliced
    assert [s[0] for s in g.meta["steps"]] == ["ProfilerStep#6"]  # ettools' Chakra keeps the step
    g.meta.pop("steps")  # a Chakra file without step boundaries: the slices decide
    t, src = step_time_of(g)
    assert src == "ProfilerStep nodes"
    assert t == pytest.approx((g.start[rows] + g.dur[rows]).max() - g.start[rows].min())
    assert t > 10 * np.nanmax(g.dur[rows])
