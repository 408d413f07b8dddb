"""Programs as arrays: a symbolic program evaluated with numbers into node columns, internal
edges and port rows (:class:`Compiled`, :func:`compile_program`); the gradient buckets merged
over modules (:func:`merge_sync`) and the one-node send/receive programs of pipeline boundaries;
and the roofline device model that times compute nodes (:data:`DEFAULT_DEVICE`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ettools.graph import CollectiveType, NodeType, StringTable

from .expr import Expr
from .program import Program

# per-node local op shapes (see PNode.shape): kind code -> attribute name on the rank graph
SHAPE_KINDS = {"gemm": 1, "attention": 2, "gemm_fp8": 3}
SHAPE_ATTRS = {1: "gemm_shape", 2: "attention_shape"}
FP8_GEMM = 3  # a GEMM Transformer Engine runs in FP8: ``gemm_shape`` plus ``compute_dtype`` = fp8
SHAPE_COLS = ("shape_kind", "shape")  # stage-graph columns; not node columns of a RankGraph
# a simple device model for durations (H100 SXM, dense bf16): FLOP/s and bytes/s
DEFAULT_DEVICE = {"name": "H100", "peak_flops": 989e12, "mem_bw": 3.35e12}


@dataclass
class Compiled:
    """A program with numbers: node columns, internal edges, import rows, exports."""

    key: str
    n: int
    cols: dict[str, np.ndarray]
    e_src: np.ndarray
    e_dst: np.ndarray
    imports: dict[str, np.ndarray]
    exports: dict[str, tuple[np.ndarray, tuple[str, ...]]]
    saved_bytes: int = 0
    param_bytes: int = 0
    grad_bytes: int = 0
    cache_bytes: int = 0
    model_flops: int = 0  # forward FLOPs under the model-FLOPs convention (see PNode.mflops)


def _int(e: Expr, env: dict[str, Any], what: str) -> int:
    v = e.value(env)
    if v.denominator != 1:
        # sizes that do not divide: round up (the last rank holds the remainder), like real shards
        return math.ceil(v)
    return int(v)


def compile_program(prog: Program, env: dict[str, Any], strings: StringTable, slots: dict[tuple, int],
                    device: dict[str, float]) -> Compiled:
    """Evaluate a program's expressions with ``env`` and lay its nodes out as columns.

    A node repeated ``k`` times (a loop over local experts) becomes ``k`` rows sharing its work;
    an edge between two nodes repeated the same number of times joins copy ``i`` to copy ``i``,
    any other edge joins every copy to every copy.
    """
    reps = [max(_int(nd.repeat, env, nd.name), 1) for nd in prog.nodes]
    first = np.zeros(len(reps) + 1, np.int64)
    np.cumsum(reps, out=first[1:])
    n = int(first[-1])
    typ = np.empty(n, np.uint8)
    name = np.empty(n, np.int32)
    num_ops = np.full(n, -1, np.int64)
    tsize = np.full(n, -1, np.int64)
    ctype = np.full(n, -1, np.int8)
    cbytes = np.full(n, -1, np.int64)
    slot = np.full(n, -1, np.int32)
    dur = np.full(n, np.nan)
    skind = np.zeros(n, np.int8)
    shape = np.full((n, 4), -1, np.int64)
    src: list[int] = []
    dst: list[int] = []
    imports: dict[str, list[int]] = {}
    peak, bw = device["peak_flops"], device["mem_bw"]
    for i, nd in enumerate(prog.nodes):
        k = reps[i]
        a, b = int(first[i]), int(first[i + 1])
        typ[a:b] = int(nd.type)
        name[a:b] = strings.intern(nd.name)
        if nd.type == NodeType.COMP_NODE:
            f = _int(nd.flops / k, env, nd.name)
            if nd.causal:
                # the kernel computes whole tiles on and below the diagonal, not the exact half the
                # symbolic count (keys = sk - sq/2) holds
                from ettools.replay.opsamples import flash_causal_keys

                sq, sk = (float(e.value(env)) for e in nd.causal)
                half = max(sk - sq / 2.0, 0.5)
                f = int(round(f * flash_causal_keys(math.ceil(sq), math.ceil(sk)) / half))
            by = _int(nd.bytes / k, env, nd.name)
            num_ops[a:b] = f
            tsize[a:b] = by
            dur[a:b] = max(f / peak, by / bw) * 1e6
            if nd.shape_kind and len(nd.shape) == 4:
                skind[a:b] = SHAPE_KINDS[nd.shape_kind]
                shape[a:b] = [_int(e, env, nd.name) for e in nd.shape]
        else:
            ctype[a:b] = nd.ctype
            cbytes[a:b] = _int(nd.bytes, env, nd.name)
            slot[a:b] = slots.setdefault(nd.axes, len(slots))
        for d in nd.deps:
            da, db = int(first[d]), int(first[d + 1])
            if db - da == k and k > 1:
                src.extend(range(da, db))
                dst.extend(range(a, b))
            else:
                for x in range(da, db):
                    src.extend([x] * k)
                    dst.extend(range(a, b))
        for p in nd.imports:
            imports.setdefault(p, []).extend(range(a, b))
    cols = {"type": typ, "name": name, "num_ops": num_ops, "tensor_size": tsize, "comm_type": ctype,
            "comm_bytes": cbytes, "slot": slot, "dur": dur, "shape_kind": skind, "shape": shape}
    exports = {}
    for key, (rows, imp) in prog.exports.items():
        expanded = [x for r in rows for x in range(int(first[r]), int(first[r + 1]))]
        exports[key] = (np.asarray(expanded, np.int64), tuple(imp))
    return Compiled(prog.key, n, cols, np.asarray(src, np.int64), np.asarray(dst, np.int64),
                    {k: np.asarray(v, np.int64) for k, v in imports.items()}, exports,
                    _int(prog.saved_bytes, env, "saved"), _int(prog.param_bytes, env, "params"),
                    _int(prog.grad_bytes, env, "grads"), _int(prog.cache_bytes, env, "cache"),
                    _int(prog.model_flops, env, "model_flops"))


def merge_sync(members: list[tuple[int, Compiled]], strings: StringTable, name: str) -> Compiled:
    """One gradient bucket over several modules: their synchronisation programs with the
    collectives of the same type and group merged (bytes summed), imports qualified by module
    position (``pgrad@<pos>:<param>``)."""
    rows: list[tuple] = []  # merged row -> (type, name, num_ops, tsize, ctype, cbytes, slot, dur)
    index: dict[tuple, int] = {}
    src: list[int] = []
    dst: list[int] = []
    imports: dict[str, list[int]] = {}
    for pos, c in members:
        seen: dict[tuple, int] = {}
        local_to_merged = []
        for i in range(c.n):
            t = int(c.cols["type"][i])
            if t == NodeType.COMM_COLL_NODE:
                k = (int(c.cols["comm_type"][i]), int(c.cols["slot"][i]))
                occ = seen.get(k, 0)
                seen[k] = occ + 1
                key = k + (occ,)
                m = index.get(key)
                if m is None:
                    m = index[key] = len(rows)
                    rows.append([t, strings.intern(f"{name}"), -1, -1, k[0], 0, k[1], np.nan, 0, (-1,) * 4])
                rows[m][5] += int(c.cols["comm_bytes"][i])
            else:
                m = len(rows)
                rows.append([t, int(c.cols["name"][i]), int(c.cols["num_ops"][i]), int(c.cols["tensor_size"][i]),
                             -1, -1, -1, float(c.cols["dur"][i]), int(c.cols["shape_kind"][i]),
                             tuple(c.cols["shape"][i].tolist())])
            local_to_merged.append(m)
        for a, b in zip(c.e_src.tolist(), c.e_dst.tolist()):
            if local_to_merged[a] != local_to_merged[b]:
                src.append(local_to_merged[a])
                dst.append(local_to_merged[b])
        for port, rr in c.imports.items():
            head, _, rest = port.partition(":")
            q = f"{head}@{pos}:{rest}"
            for r in rr.tolist():
                imports.setdefault(q, []).append(local_to_merged[r])
    cols = {
        "type": np.array([r[0] for r in rows], np.uint8), "name": np.array([r[1] for r in rows], np.int32),
        "num_ops": np.array([r[2] for r in rows], np.int64), "tensor_size": np.array([r[3] for r in rows], np.int64),
        "comm_type": np.array([r[4] for r in rows], np.int8), "comm_bytes": np.array([r[5] for r in rows], np.int64),
        "slot": np.array([r[6] for r in rows], np.int32), "dur": np.array([r[7] for r in rows], np.float64),
        "shape_kind": np.array([r[8] for r in rows], np.int8),
        "shape": np.array([r[9] for r in rows], np.int64).reshape(len(rows), 4),
    }
    pairs = sorted(set(zip(src, dst)))
    return Compiled(name, len(rows), cols, np.array([a for a, _ in pairs], np.int64),
                    np.array([b for _, b in pairs], np.int64),
                    {k: np.asarray(sorted(set(v)), np.int64) for k, v in imports.items()}, {})


def _one_node_cols(strings: StringTable, ntype: NodeType, name: str, num_ops: int = -1, tensor_size: int = -1,
                   comm_bytes: int = -1, dur: float = np.nan) -> dict[str, np.ndarray]:
    """The columns of a one-node program."""
    return {"type": np.array([int(ntype)], np.uint8), "name": np.array([strings.intern(name)], np.int32),
            "num_ops": np.array([num_ops], np.int64), "tensor_size": np.array([tensor_size], np.int64),
            "comm_type": np.array([-1], np.int8), "comm_bytes": np.array([comm_bytes], np.int64),
            "slot": np.array([-1], np.int32), "dur": np.array([dur]), "shape_kind": np.zeros(1, np.int8),
            "shape": np.full((1, 4), -1, np.int64)}


def _accumulate_program(name: str, strings: StringTable, numel: int, nbytes: int,
                        device: dict[str, float] | None) -> Compiled:
    """A one-node elementwise program of ``numel`` additions moving ``nbytes``, timed on ``device``
    as :func:`compile_program` times its nodes (a replay with ``system`` re-times it by its class)."""
    dur = max(numel / device["peak_flops"], nbytes / device["mem_bw"]) * 1e6 if device else np.nan
    z = np.zeros(0, np.int64)
    return Compiled(name, 1, _one_node_cols(strings, NodeType.COMP_NODE, name, numel, nbytes, dur=dur), z, z, {}, {})


def _p2p_program(kind: str, name: str, strings: StringTable, nbytes: int, gather_slot: int = -1) -> Compiled:
    """A one-node program: a send (imports ``src``) or a receive (exports ``out``). With
    ``gather_slot`` >= 0 a receive is followed by an all-gather of what it got over that slot's
    group (the TP group: pipeline scatter/gather), which the consumers read instead."""
    if kind == "recv" and gather_slot >= 0:
        one = _p2p_program(kind, name, strings, nbytes)
        ag = int(CollectiveType.ALL_GATHER)
        cols = {k: np.concatenate([v, v]) for k, v in one.cols.items()}
        cols["type"][1] = int(NodeType.COMM_COLL_NODE)
        cols["name"][1] = strings.intern(name.replace("recv_", "all_gather pp.", 1))
        cols["comm_type"][1] = ag
        cols["slot"][1] = gather_slot
        return Compiled(name, 2, cols, np.array([0], np.int64), np.array([1], np.int64), {},
                        {"out": (np.array([1], np.int64), ())})
    t = NodeType.COMM_SEND_NODE if kind == "send" else NodeType.COMM_RECV_NODE
    cols = _one_node_cols(strings, t, name, comm_bytes=nbytes)
    z = np.zeros(0, np.int64)
    imports = {"src": np.array([0], np.int64)} if kind == "send" else {}
    exports = {"out": (np.array([0], np.int64), ())} if kind == "recv" else {}
    return Compiled(name, 1, cols, z, z, imports, exports)
