"""Ranks that differ only in their groups are written as one encoding with the group keys patched.

A TP 2 × DP 8 rewrite of ``sample_traces/single`` (16 ranks stamped from one graph, 10 groups, so
two-digit keys). Properties are read from the written files with the protobuf classes
(``tests/chakra_decoding.py``) and ``comm_group.json`` with ``json``: every collective names a key
of one width whose group holds the rank; the node ids/types/dependencies of every rank equal the
source graph's; each rank's file equals that rank written alone (no structure shared, so fully
encoded); writing twice gives the same bytes; a rank outside a group it names is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from chakra_decoding import decode

from ettools.converters.chakra import write_chakra
from ettools.formats import load_trace
from ettools.graph import NodeType, ProcessGroup
from ettools.scaler import data_parallel, tensor_parallel


@pytest.fixture(scope="module")
def stamped(sample_traces: Path):
    t = load_trace([sample_traces / "single"]).trace
    return data_parallel(tensor_parallel(t, 2), 8)


def _pg_names(path: Path) -> list[tuple[int, str]]:
    _, nodes = decode(path)
    out = []
    for n in nodes:
        if n.type == NodeType.COMM_COLL_NODE:
            a = {x.name: x for x in n.attr}
            out.append((n.id, a["pg_name"].string_val))
    return out


def test_patched_keys_name_the_ranks_groups(stamped, tmp_path):
    assert len(stamped.meta.process_groups) >= 10  # keys of two digits
    paths = write_chakra(stamped, tmp_path / "a")
    groups = json.loads((tmp_path / "a" / "comm_group.json").read_text())
    assert len({len(k) for k in groups}) == 1 and all(int(k) > 0 for k in groups)
    seen = set()
    for r in stamped.ranks:
        names = _pg_names(tmp_path / "a" / f"trace.{r}.et")
        assert names, f"rank {r} has no collectives"
        for _, key in names:
            assert r in groups[key], (r, key)
            seen.add(key)
        # the source graph's collectives, group by group, are the file's (id -> this rank's group size)
        g = stamped.graphs[r]
        coll = np.flatnonzero(g.type == NodeType.COMM_COLL_NODE)
        src = {int(g.columns["id"][i]): len(stamped.meta.process_groups[g.strings[int(g.comm_group[i])]].ranks)
               for i in coll}
        assert {i: len(groups[k]) for i, k in names} == src
    assert seen == set(groups)  # every group used by some rank
    # each rank's bytes equal that rank written on its own (nothing shared: encoded in full)
    for r in (0, 1, 7, 15):
        alone = write_chakra(stamped, tmp_path / f"alone{r}", ranks=[r])
        et = [p for p in alone if p.suffix == ".et"][0]
        assert et.read_bytes() == (tmp_path / "a" / f"trace.{r}.et").read_bytes(), r
    again = write_chakra(stamped, tmp_path / "b")
    assert [p.read_bytes() for p in paths] == [p.read_bytes() for p in again]


def test_patched_rank_outside_its_group_refused(stamped, tmp_path):
    meta = stamped.meta
    g5 = stamped.graphs[5]
    gname = next(g5.strings[int(x)] for x in np.unique(g5.comm_group) if x >= 0)
    old = meta.process_groups[gname]
    meta.process_groups[gname] = ProcessGroup(old.name, tuple(r for r in old.ranks if r != 5), old.desc, old.backend)
    try:
        with pytest.raises(ValueError, match="do not include rank 5"):
            write_chakra(stamped, tmp_path / "bad")
    finally:
        meta.process_groups[gname] = old


def _same_graph(a, b) -> None:
    """``a`` and ``b`` hold the same nodes, dependencies, attributes and metadata (strings by value)."""
    assert a.rank == b.rank
    for k in a.columns:
        x, y = a.columns[k], b.columns[k]
        if k in ("name", "comm_group", "resource"):
            assert [a.strings[i] if i >= 0 else None for i in x.tolist()] == \
                [b.strings[i] if i >= 0 else None for i in y.tolist()], (a.rank, k)
        else:
            assert np.array_equal(x, y, equal_nan=True), (a.rank, k)
    for k in ("dep_ptr", "dep_id", "dep_kind"):
        assert np.array_equal(getattr(a, k), getattr(b, k)), (a.rank, k)
    assert set(a.attrs) == set(b.attrs)
    for k in a.attrs:
        assert np.array_equal(a.attrs[k].rows, b.attrs[k].rows) and list(a.attrs[k].values) == list(b.attrs[k].values)
    drop = ("chakra_decoder",)
    assert repr({k: v for k, v in a.meta.items() if k not in drop}) == repr({k: v for k, v in b.meta.items()
                                                                             if k not in drop})


@pytest.mark.parametrize("case", ["tp2_dp8", "synth_dp2_tp2_pp2"])
def test_stamped_files_read_as_decoded(case, stamped, tmp_path):
    """Files equal but for group keys and peers share one decoded graph's arrays; each rank's graph
    equals that file decoded on its own, also for a file changed outside those values."""
    from ettools.converters.chakra import read_chakra, read_chakra_file, resolve_rank_files
    from ettools.graph import StringTable, structure_identity

    out = tmp_path / case
    if case == "tp2_dp8":
        write_chakra(stamped, out)
    else:
        from ettools.converters.symbolic import synthesize
        from ettools.converters.symbolic.write import write_synth

        write_synth(synthesize("gpt3-5b", dp=2, tp=2, pp=2), out, name="trace", progress=False)
    files = resolve_rank_files([out])
    # one rank's file changed outside the group keys and peers: a node name's first letter
    victim = files[3][1]
    data = bytearray(victim.read_bytes())
    _, nodes = decode(victim)
    name = nodes[0].name.encode()
    at = bytes(data).index(b"\x12" + bytes([len(name)]) + name) + 2  # Node.name (field 2) of the first node
    data[at] = ord("Z") if data[at] != ord("Z") else ord("Y")
    changed = data[at:at + len(name)].decode()
    victim.write_bytes(bytes(data))
    tr = read_chakra([out])
    assert len({structure_identity(g) for g in tr.graphs.values()}) < len(tr.graphs)  # arrays shared
    p2p = 0
    for r, f in files:
        alone = read_chakra_file(f, r, StringTable())
        _same_graph(tr.graphs[r], alone)
        p2p += int((alone.comm_peer >= 0).sum())
    assert (case == "tp2_dp8") or p2p > 0  # the pipeline case patches peers
    r3 = next(r for r, f in files if f == victim)
    assert changed in {tr.strings[int(i)] for i in tr.graphs[r3].columns["name"]}


def test_patched_peers_pair_up(sample_traces, tmp_path):
    """PP 2 × DP 8: sends/recvs carry each rank's own comm_src/comm_dst (patched varints); every send
    has its recv on the peer (same tag, mirrored ranks); bytes equal each rank written alone."""
    from ettools.scaler import pipeline_parallel

    t = data_parallel(pipeline_parallel(load_trace([sample_traces / "single"]).trace, 2), 8)
    out = tmp_path / "pp"
    write_chakra(t, out)
    sends, recvs = set(), set()
    for r in t.ranks:
        _, nodes = decode(out / f"trace.{r}.et")
        for n in nodes:
            a = {x.name: x for x in n.attr}
            if n.type == NodeType.COMM_SEND_NODE:
                assert a["comm_src"].int32_val == r
                sends.add((r, a["comm_dst"].int32_val, a["comm_tag"].int32_val))
            elif n.type == NodeType.COMM_RECV_NODE:
                assert a["comm_dst"].int32_val == r
                recvs.add((a["comm_src"].int32_val, r, a["comm_tag"].int32_val))
    assert sends and sends == recvs
    assert {s for s, d, _ in sends} == set(t.ranks)  # every rank sends (activations or gradients)
    for r in (0, 1, 9, 15):
        alone = [p for p in write_chakra(t, tmp_path / f"alone{r}", ranks=[r]) if p.suffix == ".et"][0]
        assert alone.read_bytes() == (out / f"trace.{r}.et").read_bytes(), r


def test_astrasim_forms_run_once_per_structure(stamped):
    """ASTRA-sim's host and collective forms read no group or peer column, so the 16 ranks (one
    structure, each its own groups) share one result: every rank keeps its own rank, groups,
    peers and metadata, and all share the result's other arrays (they still encode once)."""
    from ettools.converters.chakra import astrasim_collective_form, astrasim_host_form
    from ettools.converters.chakra.astrasim import HOST_CHAIN_META
    from ettools.graph import structure_identity

    src = stamped.graphs
    assert len({id(g.comm_group) for g in src.values()}) > 1  # the ranks' groups differ
    t = astrasim_host_form(stamped)
    t, _ = astrasim_collective_form(t, t.ranks)
    first = t.graphs[min(t.ranks)]
    assert first is not src[min(t.ranks)]  # the host form changed the graph (threads merged)
    for r, g in t.graphs.items():
        assert g.rank == r
        assert np.array_equal(g.comm_group, src[r].comm_group) and np.array_equal(g.comm_peer, src[r].comm_peer)
        assert g.meta.get(HOST_CHAIN_META) is True
        assert all(g.meta.get(k) == v for k, v in src[r].meta.items() if k != HOST_CHAIN_META)
        assert structure_identity(g) == structure_identity(first)
