"""``--congestion`` respects every dependency: a 1F1B pipeline converted to Chakra and replayed with
flow-level bandwidth sharing starts no node before every node it depends on has ended. Dependencies are
read from the raw .et frames (data_deps + ctrl_deps), never from ettools' graph."""

from __future__ import annotations

from pathlib import Path

from ettools.convert import convert_trace
from ettools.converters.chakra import iter_frames, read_chakra
from ettools.formats import load_trace
from ettools.replay import replay_trace
from ettools.schema import et_def_pb2 as pb

REPO = Path(__file__).resolve().parents[1]


def _raw_deps(path: Path) -> list[tuple[int, int]]:
    """(node id, id it depends on) for every data or ctrl dependency in the file."""
    out = []
    for k, (_i, _o, payload) in enumerate(iter_frames(path.read_bytes(), path)):
        if k == 0:
            continue
        n = pb.Node()
        n.ParseFromString(payload)
        out += [(n.id, d) for d in list(n.data_deps) + list(n.ctrl_deps)]
    return out


def test_congestion_replay_starts_no_node_before_its_dependencies(tmp_path):
    out = tmp_path / "et"
    convert_trace(load_trace([REPO / "sample_traces" / "pp_1f1b"]), out, "chakra")
    net = tmp_path / "ring.yml"
    net.write_text("topology: [ Ring ]\nnpus_count: [ 2 ]\nbandwidth: [ 50.0 ]\nlatency: [ 500.0 ]\n")
    files = sorted(out.glob("trace.*.et"))
    res = replay_trace(read_chakra(files, comm_group=out / "comm_group.json"), network=net, congestion=True,
                       memory=False)
    checked = 0
    for f in files:
        rank = int(f.name.split(".")[1])
        start, end = res.replayed_times(rank)
        g = res.built.preps[rank].graph
        row = {int(i): r for r, i in enumerate(g.id.tolist())}
        for nid, dep in _raw_deps(f):
            a, b = row[nid], row[dep]
            assert start[a] >= end[b] - 1e-6, (rank, nid, dep, start[a], end[b])
            checked += 1
    assert checked > 100
