"""Defects reported where they are read (issue 26): ``convert`` drops what has one sound repair
(a dependency naming a node id not in the rank, a node depending on itself) and says so with a
count; it refuses a dependency cycle through 2+ nodes (exit 2, one line, nothing written) unless
``--allow-defects``. ``info`` and ``replay`` say each defect kind read in one warning line.

Expectations are counted here from the protobuf nodes (decoded with the schema classes alone,
``tests/chakra_decoding.py``) and networkx, not by the code under test."""

from __future__ import annotations

import re
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from chakra_decoding import decode
from click.testing import CliRunner
from google.protobuf.internal.encoder import _VarintBytes

from ettools.cli import main
from ettools.graph import EdgeKind, GraphBuilder, StringTable
from ettools.repair import drop_unsound_deps, repair_trace
from ettools.schema import et_def_pb2 as pb

RESNET = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "chakra" / "resnet_converted.0.et"


def run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.stdout, res.stderr


def lines(text: str) -> list[str]:
    return [x for x in text.splitlines() if x.strip()]


def counts(nodes: list) -> dict[str, int]:
    """Dangling and self-dependencies, and the cycles of 2+ nodes left once both are dropped
    (strongly connected sets of 2+ nodes), counted from decoded protobuf nodes."""
    ids = {n.id for n in nodes}
    dangling = selfs = 0
    dg = nx.DiGraph()
    for n in nodes:
        for d in list(n.data_deps) + list(n.ctrl_deps):
            if d not in ids:
                dangling += 1
            elif d == n.id:
                selfs += 1
            else:
                dg.add_edge(d, n.id)
    sccs = [c for c in nx.strongly_connected_components(dg) if len(c) > 1]
    return {"dangling": dangling, "self": selfs, "cycles": len(sccs), "sccs": sccs}


def write_et(path: Path, nodes: list[tuple]) -> Path:
    """A Chakra file built with the pb classes: ``(id, type, data_deps, ctrl_deps)`` per node."""
    gm = pb.GlobalMetadata(version="0.0.4")
    parts = [gm.SerializeToString()]
    for nid, ntype, data, ctrl in nodes:
        n = pb.Node(id=nid, name=f"op{nid}", type=ntype, duration_micros=5)
        n.data_deps.extend(data)
        n.ctrl_deps.extend(ctrl)
        a = n.attr.add()
        a.name, a.bool_val = "is_cpu_op", False
        parts.append(n.SerializeToString())
    path.write_bytes(b"".join(_VarintBytes(len(p)) + p for p in parts))
    return path


# ---- the real file Chakra's own converter wrote ----------------------------------------------

@pytest.fixture(scope="module")
def resnet() -> dict:
    if not RESNET.exists():
        pytest.skip("shared Chakra trace not present")
    _, nodes = decode(RESNET)
    return {"nodes": nodes, **counts(nodes)}


def test_real_file_counts(resnet):
    # what the issue reports (1,277 dangling, 383 self, 452 cycles counting self-loops as cycles)
    assert resnet["dangling"] == 1277 and resnet["self"] == 383
    assert resnet["cycles"] == 417  # 35 of the 452 were only self-loops


def test_real_file_refused_without_flag(resnet, tmp_path):
    out = tmp_path / "out"
    code, stdout, stderr = run("convert", str(RESNET), "--to", "chakra", "-o", str(out))
    assert code == 2, stderr
    (line,) = lines(stderr)
    assert line.startswith("ettools: error: ") and "ASTRA-sim" in line and "would not run" in line
    m = re.search(r"dependency cycle of (\d+) nodes: ([\d >-]+)", line)
    cyc = [int(x) for x in m.group(2).split(" -> ")]
    assert cyc[0] == cyc[-1] and len(cyc) - 1 == int(m.group(1)) >= 2
    assert any(set(cyc) <= c for c in resnet["sccs"])  # a real cycle of the file
    assert f"and {resnet['cycles'] - 1:,} more" in line
    assert not out.exists() or not any(out.iterdir())


def test_real_file_allow_defects_repairs_and_warns(resnet, tmp_path):
    out = tmp_path / "out"
    code, _, stderr = run("convert", str(RESNET), "--to", "chakra", "-o", str(out), "--allow-defects", "-q")
    assert code == 0, stderr
    warn = lines(stderr)
    assert f"ettools: warning: dropped {resnet['dangling']:,} dangling dependencies (node ids not in the trace)" in warn
    assert f"ettools: warning: dropped {resnet['self']:,} self-dependencies (a node depending on itself)" in warn
    kept = [x for x in warn if x.startswith(f"ettools: warning: kept {resnet['cycles']:,} dependency cycle")]
    assert len(kept) == 1 and "ASTRA-sim will not finish" in kept[0]
    _, nodes = decode(out / "trace.0.et")
    assert [n.id for n in nodes] == [n.id for n in resnet["nodes"]]
    got = counts(nodes)
    assert got["dangling"] == got["self"] == 0 and got["cycles"] == resnet["cycles"]


def test_real_file_info_says_each_kind(resnet):
    code, _, stderr = run("info", str(RESNET))
    assert code == 0
    warn = lines(stderr)
    for text in (f"{resnet['dangling']:,} dangling dependencies", f"{resnet['self']:,} self-dependencies",
                 f"{resnet['cycles']:,} dependency cycle(s) of 2+ nodes",
                 f"{sum(n.type == pb.COMM_COLL_NODE and 'comm_type' not in {a.name for a in n.attr} for n in resnet['nodes'])}"
                 " collective(s) without a comm_type"):
        assert sum(x.startswith(f"ettools: warning: {text}") for x in warn) == 1, (text, warn)


# ---- small files ---------------------------------------------------------------------------------

COMP, COLL = pb.COMP_NODE, pb.COMM_COLL_NODE


def test_dangling_and_self_dependency_repaired(tmp_path):
    src = write_et(tmp_path / "t.0.et", [
        (1, COMP, [], []),
        (2, COMP, [1, 2], []),      # 2 on itself
        (3, COMP, [2], [99]),       # 99 is not in the rank
    ])
    out = tmp_path / "out"
    code, _, stderr = run("convert", str(src), "-o", str(out), "-q")
    assert code == 0, stderr
    warn = lines(stderr)
    assert "ettools: warning: dropped 1 dangling dependencies (node ids not in the trace)" in warn
    assert "ettools: warning: dropped 1 self-dependencies (a node depending on itself)" in warn
    assert not any("cycle" in x for x in warn)
    _, nodes = decode(out / "trace.0.et")
    assert [(n.id, list(n.data_deps), list(n.ctrl_deps)) for n in nodes] == [(1, [], []), (2, [1], []), (3, [2], [])]


def test_three_node_cycle_refused(tmp_path):
    src = write_et(tmp_path / "t.0.et", [(1, COMP, [3], []), (2, COMP, [1], []), (3, COMP, [2], []),
                                        (4, COMP, [4], [])])
    out = tmp_path / "out"
    for to in ("chakra", "chakra-json", "astrasim-json"):
        code, _, stderr = run("convert", str(src), "--to", to, "-o", str(out))
        assert code == 2, stderr
        (line,) = lines(stderr)
        assert "dependency cycle of 3 nodes: 1 -> 2 -> 3 -> 1" in line and "ASTRA-sim" in line, line
        assert not out.exists() or not any(out.iterdir())
    code, _, stderr = run("convert", str(src), "-o", str(out), "-q", "--allow-defects")
    assert code == 0, stderr
    assert "ettools: warning: dropped 1 self-dependencies (a node depending on itself)" in lines(stderr)
    assert any(x.startswith("ettools: warning: kept 1 dependency cycle(s)") and "will not finish" in x
               for x in lines(stderr))
    _, nodes = decode(out / "trace.0.et")
    assert counts(nodes)["cycles"] == 1 and counts(nodes)["self"] == 0


def test_info_and_replay_say_each_defect_kind_once(tmp_path):
    src = write_et(tmp_path / "t.0.et", [
        (1, COMP, [], [7]),                  # dangling
        (2, COMP, [2], []),                  # self
        (3, COMP, [4], []), (4, COMP, [3], []),  # cycle of 2
        (5, COLL, [1], []),                  # collective without comm_type
    ])
    for cmd in (["info", str(src)], ["replay", str(src)]):
        _, _, stderr = run(*cmd)
        warn = [x for x in lines(stderr) if x.startswith("ettools: warning: ")]
        for text in ("1 dangling dependencies", "1 self-dependencies", "1 dependency cycle(s) of 2+ nodes",
                     "1 collective(s) without a comm_type"):
            assert sum(text in x for x in warn) == 1, (cmd, text, warn)


# ---- the graph -> graph repair -------------------------------------------------------------------

def test_drop_unsound_deps_keeps_every_other_edge():
    strings = StringTable()
    b = GraphBuilder(0, strings)
    for _ in range(4):
        b.add_node("op")
    b.add_dep(1, 0, EdgeKind.DATA)
    b.add_dep(1, 1, EdgeKind.CTRL)     # self
    b.add_dep(2, 50, EdgeKind.DATA)    # dangling
    b.add_dep(2, 1, EdgeKind.ORDER)
    b.add_dep(3, 3, EdgeKind.DATA)     # self
    b.add_dep(3, 2, EdgeKind.SYNC)
    g = b.build()
    h, rep = drop_unsound_deps(g)
    assert (rep.dangling, rep.self_deps) == (1, 2)
    assert [h.deps_of(r) for r in range(4)] == [[], [(0, EdgeKind.DATA)], [(1, EdgeKind.ORDER)],
                                               [(2, EdgeKind.SYNC)]]
    assert h.columns["id"] is g.columns["id"]  # node columns shared, not copied
    assert drop_unsound_deps(h)[0] is h
    # ranks sharing arrays are repaired once and keep sharing
    from ettools.graph import Trace, TraceMeta

    t = Trace(TraceMeta(world_size=2), {0: g, 1: g.with_rank(1)}, strings)
    t2, total = repair_trace(t)
    assert (total.dangling, total.self_deps) == (2, 4)
    assert t2[1].dep_id is t2[0].dep_id and t2[1].rank == 1
    assert np.array_equal(t2[1].dep_id, h.dep_id)
