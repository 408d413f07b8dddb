"""Rewriting real GPU traces to 8, 64 and 1,024 ranks: structurally sound, Chakra for ASTRA-sim.

Traces from ``../shared/traces``: ``et_kineto/triosim_vgg13_h100`` (VGG-13 on an H100, PyTorch
ET linked with Kineto: tensor sizes known) and ``kineto/hta_fwdbwd_1rank`` (a ResNet DDP run on
one GPU, Kineto alone, 5 steps: gradient buckets come from the run's own DDP reducer).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from chakra_decoding import decode_nodes
from shared_kineto import read_json

from ettools.checks import verify
from ettools.converters.chakra import read_chakra, write_chakra
from ettools.formats import load_trace
from ettools.graph import CollectiveType, NodeType, Trace
from ettools.replayable import replayable_trace as replayable
from ettools.scaler import data_parallel, reshard, scale_trace
from ettools.schema import et_def_pb2 as pb

# what ASTRA-sim reads (../shared/notes/chakra-format.md): attribute -> value field
ASTRA_KINDS = {
    "is_cpu_op": "bool_val", "num_ops": "int64_val", "tensor_size": "uint64_val", "comm_type": "int64_val",
    "comm_size": "int64_val", "pg_name": "string_val", "comm_src": "int32_val", "comm_dst": "int32_val",
    "comm_tag": "int32_val", "involved_dim": "bool_list",
}


def check_chakra(files: list[Path], world: int) -> None:
    groups = json.loads(next(f for f in files if f.name == "comm_group.json").read_bytes())
    for f in files:
        if f.suffix != ".et":
            continue
        rank = int(f.name.split(".")[-2])
        nodes = decode_nodes(f)
        ids = {n.id for n in nodes}
        assert nodes and all(n.type not in (pb.METADATA_NODE, pb.INVALID_NODE) for n in nodes)
        for n in nodes:
            assert set(n.data_deps) | set(n.ctrl_deps) <= ids, f"{f.name}: dangling dependency"
            attrs = {a.name: a.WhichOneof("value") for a in n.attr}
            for name, kind in attrs.items():
                if name in ASTRA_KINDS:
                    assert kind == ASTRA_KINDS[name], (f.name, n.name, name, kind)
            if n.type == pb.COMM_COLL_NODE:
                assert {"comm_type", "comm_size", "pg_name"} <= set(attrs), n.name
                pg = next(a.string_val for a in n.attr if a.name == "pg_name")
                assert rank in groups[pg] and all(0 <= r < world for r in groups[pg])


@pytest.fixture(scope="module")
def vgg(shared_traces: Path):
    return load_trace([shared_traces / "et_kineto" / "triosim_vgg13_h100"]).trace


@pytest.fixture(scope="module")
def hta_path(shared_traces: Path) -> Path:
    return shared_traces / "kineto" / "hta_fwdbwd_1rank"


@pytest.fixture(scope="module")
def hta(hta_path: Path):
    return load_trace([hta_path]).trace


def test_vgg_dp8_tp8dp8_and_1024(vgg, tmp_path: Path):
    dp8 = scale_trace(vgg, dp=8)
    assert dp8.meta.world_size == 8 and verify(dp8) == []
    # gradients of all 13 parameters-holding layers (VGG-13: 133,047,848 fp32 parameters)
    ar = [g for g in dp8.graphs.values()][0]
    coll = ar.comm_type[ar.type == NodeType.COMM_COLL_NODE]
    assert (coll == CollectiveType.ALL_REDUCE).all()
    params = sum(int(np.prod(vgg.graphs[0].tensors.shape(int(t)))) for t in _accumulated(vgg.graphs[0]))
    assert int(ar.comm_bytes[ar.type == NodeType.COMM_COLL_NODE].sum()) == 4 * params
    tpdp = scale_trace(vgg, tp=8, dp=8)
    assert tpdp.meta.world_size == 64 and verify(tpdp) == []
    big = reshard(tpdp, 128)  # the data-parallel axis 8 -> 128: 1,024 ranks
    assert big.meta.world_size == 1024 and len(big.graphs) == 1024 and verify(big) == []
    # ranks are stamped out: their node arrays are shared, not copied
    assert len({id(g.columns["id"]) for g in big.graphs.values()}) == 1
    for name, tr, ranks in (("dp8", dp8, None), ("tp8dp8", tpdp, None), ("r1024", big, [0, 7, 512, 1023])):
        rp = replayable(tr)
        assert verify(rp) == []
        files = write_chakra(rp, tmp_path / name, "vgg", strict=True, ranks=ranks)
        check_chakra(files, tr.meta.world_size)


def _accumulated(g) -> list[int]:
    """Gradient tensor rows of a captured step: the inputs of its AccumulateGrad nodes."""
    names = g.names()
    return [int(g.inputs_of(r)[0]) for r, s in enumerate(names) if s == "torch::autograd::AccumulateGrad"]


def test_hta_ddp_buckets_and_1024(hta, hta_path: Path, tmp_path: Path):
    dp8 = data_parallel(hta, 8)
    g = dp8.graphs[5]
    coll = np.flatnonzero(g.type == NodeType.COMM_COLL_NODE)
    # the run's own DDP buckets, sized from its copy-backs, equal what DDP logged for each launch
    raw = read_json(hta_path / "rank0.json.gz")
    nelems = [e["args"]["In msg nelems"] for e in raw["traceEvents"]
              if e["name"] == "record_param_comms" and e["args"].get("Collective name") == "allreduce"]
    assert sorted((g.comm_bytes[coll] // 4).tolist()) == sorted(nelems)
    for size in (64, 1024):  # DP 8 -> 64 and -> 1,024
        tr = reshard(dp8, size)
        assert tr.meta.world_size == size == len(tr.graphs)
        assert verify(tr) == []
        rp = replayable(tr)
        assert verify(rp) == []
        files = write_chakra(rp, tmp_path / f"r{size}", "hta", strict=True, ranks=[0, size - 1])
        check_chakra(files, size)
    assert list(tr.meta.process_groups["dp"].ranks) == list(range(1024))


def test_shared_encoding_equals_rank_by_rank_encoding(vgg, tmp_path: Path):
    tr = replayable(scale_trace(vgg, tp=2, dp=2))
    # the same graphs with every column copied: nothing shared, so every rank is encoded anew
    unshared = Trace(tr.meta, {r: g.replace(**{c: a.copy() for c, a in g.columns.items()})
                               for r, g in tr.graphs.items()}, tr.strings)
    a = write_chakra(tr, tmp_path / "a", "x")
    b = write_chakra(unshared, tmp_path / "b", "x")
    assert [p.name for p in sorted(a)] == [p.name for p in sorted(b)]
    for x, y in zip(sorted(a), sorted(b)):
        assert x.read_bytes() == y.read_bytes(), x.name
    back = read_chakra(sorted(p for p in a if p.suffix == ".et"))
    assert back.meta.world_size == 4 and verify(back) == []
