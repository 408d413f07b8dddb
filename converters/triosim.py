"""TrioSim's CSV trace input: ``trace.csv`` (one row per operator) and ``tensor.csv`` (tensors).

TrioSim (sarchlab/triosim, ``trace.go``) reads a directory holding both files, by column position:

``trace.csv``: ``OperatorID, OperatorName, Operator_input, Operator_output, Operator_cudatime,
Operator_cudatimenooverlap, InputSize, OutputSize, gpuid, stage, tpflag``. Tensor lists are
``[4; 6; 8]`` (ids), sizes are element counts in the same form. TrioSim replays
``Operator_cudatimenooverlap`` (the sum of the operator's kernel times, µs);
``Operator_cudatime`` is the span from its first kernel's start to its last kernel's end.
``stage`` is forward/backward/optimizer, ``tpflag`` 1 marks layers tensor parallelism splits.

``tensor.csv``: ``Index, TensorID, TensorShape, TensorNumElement, TensorEachByte, TensorType,
TensorStorgeid, gpuid`` — one row per use of a tensor by an operator of the profiled run (so a
tensor id repeats; TrioSim keeps the last row of each id), ``TensorType`` the role of that use
(input, weight, output, grad_output, …), shapes written ``[128, 3, 224, 224]``.

Graph mapping (one rank): each operator is a COMP node (id = OperatorID, is_cpu_op 0, resource
``gpu <gpuid>``) with ``dur`` = ``Operator_cudatimenooverlap`` and attributes ``triosim_cudatime``
(double), ``triosim_stage`` (string), ``triosim_tpflag`` (int64); ``tensor_size`` is the bytes of
its input and output tensors. The tensor table holds ``tensor.csv``'s rows in file order
(element bytes, storage id, shape, device ``cuda:<gpuid>``), their roles in
``RankGraph.meta["triosim_tensor_type"]``; a node's inputs/outputs point at the last row of each
id, as TrioSim resolves them. Dependencies: a DATA edge from the operator that last wrote a tensor
to each later operator reading it (an in-place op, output = input, depends on the previous
writer), and an ORDER edge from each operator to the next, since TrioSim runs them in file order
on one device. A size list that disagrees with the tensor table is kept in ``triosim_input_size``
/ ``triosim_output_size`` (int64 lists). There are no start times.

Writing a graph that did not come from TrioSim: when device ops hang off host ops by LAUNCH edges
(Kineto, or PyTorch ET linked with Kineto), the operators are the outermost host ops named
``…::…`` that launched compute device time, directly or through ops nested in them, as TrioSim's
tracer builds them: ``Operator_cudatimenooverlap`` the sum of those device ops' durations,
``Operator_cudatime`` their span, the tensors the op's own (ET) inputs/outputs. Otherwise the
operators are the COMP nodes that are not host ops (all COMP nodes if that leaves none), with
their own durations. Either way in execution order; stage and
tpflag follow TrioSim's tracer when the attributes are absent (``autograd…`` → backward,
``aten::_for…`` → optimizer, else forward; tpflag 1 for ``aten::conv2d``/``linear``/``embedding``);
tensor rows are written one per use (inputs "input", outputs "output"). Communication nodes are
not written: TrioSim adds communication itself when it extrapolates to several GPUs.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from ettools.checks import execution_order
from ettools.errors import TraceError
from ettools.graph import EdgeKind, GraphBuilder, NodeType, RankGraph, Trace, new_trace
from ettools.io import OutputSet, read_bytes, short

TRACE_COLUMNS = ["OperatorID", "OperatorName", "Operator_input", "Operator_output", "Operator_cudatime",
                 "Operator_cudatimenooverlap", "InputSize", "OutputSize", "gpuid", "stage", "tpflag"]
TENSOR_COLUMNS = ["Index", "TensorID", "TensorShape", "TensorNumElement", "TensorEachByte", "TensorType",
                  "TensorStorgeid", "gpuid"]
ROLE_KEY = "triosim_tensor_type"
TP_OPS = ("aten::conv2d", "aten::linear", "aten::embedding")
_GPU = re.compile(r"^(?:gpu|cuda)[ :]?(\d+)$")


def _files(path: Path) -> tuple[Path, Path]:
    if path.is_dir():
        return path / "trace.csv", path / "tensor.csv"
    return path.parent / "trace.csv" if path.name == "tensor.csv" else path, path.parent / "tensor.csv"


def _rows(path: Path, columns: list[str]) -> list[list[str]]:
    """Data rows of a CSV file, columns in ``columns`` order (checked against the header)."""
    if not path.exists():
        raise TraceError(path, "no such file (a TrioSim trace needs trace.csv and tensor.csv side by side)")
    try:
        text = read_bytes(path).decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise TraceError(path, f"not UTF-8 text (byte offset {e.start})") from None
    try:
        rows = list(csv.reader(io.StringIO(text, newline=""), skipinitialspace=True))
    except csv.Error as e:
        raise TraceError(path, f"not valid CSV: {e}") from None
    if not rows:
        raise TraceError(path, "empty file")
    header = [h.strip() for h in rows[0]]
    missing = [c for c in columns if c not in header]
    if missing:
        raise TraceError(path, f"not a TrioSim {path.name}: header lacks column(s) {', '.join(missing)}")
    pos = [header.index(c) for c in columns]
    out = []
    for i, r in enumerate(rows[1:], start=2):
        if not r or all(not x.strip() for x in r):
            continue
        if len(r) < len(header):
            raise TraceError(path, f"line {i}: {len(r)} fields, the header has {len(header)}")
        out.append([r[p].strip() for p in pos] + [str(i)])
    return out


def _int(path: Path, line: str, col: str, s: str) -> int:
    try:
        v = int(s.strip().strip("'"))
    except ValueError:
        raise TraceError(path, f"line {line}: {col} must be an integer, got {short(s, 80)}") from None
    if not -(2**63) <= v < 2**63:  # kept in int64 columns
        raise TraceError(path, f"line {line}: {col} {short(v, 40)} does not fit in 64 bits")
    return v


def _num(path: Path, line: str, col: str, s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise TraceError(path, f"line {line}: {col} must be a number, got {s!r}") from None
    if not math.isfinite(v) or v < 0:
        raise TraceError(path, f"line {line}: {col} must be a non-negative number, got {s!r}")
    return v


def _int_list(path: Path, line: str, col: str, s: str, sep: str = ";") -> list[int]:
    body = s.strip()
    if not (body.startswith("[") and body.endswith("]")):
        raise TraceError(path, f"line {line}: {col} must be a bracketed list like [1; 2], got {s!r}")
    body = body[1:-1].replace(" ", "")
    if not body:
        return []
    return [_int(path, line, col, t) for t in body.split(sep)]


def read_triosim(path: str | os.PathLike, rank: int = 0) -> Trace:
    """Read a TrioSim trace (its directory, or its ``trace.csv`` with ``tensor.csv`` beside it).

    Returns a one-rank trace (``rank``); see the module docstring for the mapping. Raises
    :class:`TraceError` naming the file and line on malformed input.
    """
    trace_csv, tensor_csv = _files(Path(path))
    ops = _rows(trace_csv, TRACE_COLUMNS)
    tens = _rows(tensor_csv, TENSOR_COLUMNS)
    trace, strings = new_trace(source="triosim", world_size=rank + 1)
    b = GraphBuilder(rank, strings)
    roles: list[str] = []
    last_row: dict[int, int] = {}
    numel: list[int] = []
    nbytes: list[int] = []
    for r in tens:
        line = r[-1]
        _index, tid, shape_s, n_s, eb_s, role, sid, gpu = r[:8]
        shape = _int_list(tensor_csv, line, "TensorShape", shape_s, sep=",")
        n = _int(tensor_csv, line, "TensorNumElement", n_s)
        eb = _int(tensor_csv, line, "TensorEachByte", eb_s)
        t = _int(tensor_csv, line, "TensorID", tid)
        row = b.add_tensor(shape, eb, device=f"cuda:{_int(tensor_csv, line, 'gpuid', gpu)}", tensor_id=t,
                           storage_id=_int(tensor_csv, line, "TensorStorgeid", sid), numel=n)
        last_row[t] = row
        roles.append(role)
        numel.append(n)
        nbytes.append(n * eb)
    writer: dict[int, int] = {}  # tensor id -> id of the operator that last wrote it
    seen: set[int] = set()
    prev: int | None = None
    for r in ops:
        line = r[-1]
        oid = _int(trace_csv, line, "OperatorID", r[0])
        if oid in seen:
            raise TraceError(trace_csv, f"line {line}: duplicate OperatorID {oid}")
        seen.add(oid)
        ins = _int_list(trace_csv, line, "Operator_input", r[2])
        outs = _int_list(trace_csv, line, "Operator_output", r[3])
        rows_in, rows_out = [], []
        for col, ids, dest in (("Operator_input", ins, rows_in), ("Operator_output", outs, rows_out)):
            for t in ids:
                if t not in last_row:
                    raise TraceError(trace_csv, f"line {line}: {col} names tensor {t}, absent from tensor.csv")
                dest.append(last_row[t])
        cudatime = _num(trace_csv, line, "Operator_cudatime", r[4])
        nooverlap = _num(trace_csv, line, "Operator_cudatimenooverlap", r[5])
        gpu = _int(trace_csv, line, "gpuid", r[8])
        tsize = sum(nbytes[x] for x in rows_in + rows_out)
        b.add_node(r[1], NodeType.COMP_NODE, dur=nooverlap, resource=f"gpu {gpu}", is_cpu_op=0,
                   tensor_size=tsize, node_id=oid)
        row = b.last_row
        b.set_attr(row, "triosim_cudatime", cudatime, "double_val")
        b.set_attr(row, "triosim_stage", r[9], "string_val")
        b.set_attr(row, "triosim_tpflag", _int(trace_csv, line, "tpflag", r[10]), "int64_val")
        for col, key, rows_t in (("InputSize", "triosim_input_size", rows_in),
                                 ("OutputSize", "triosim_output_size", rows_out)):
            sizes = _int_list(trace_csv, line, col, r[6] if col == "InputSize" else r[7])
            if sizes != [numel[x] for x in rows_t]:
                b.set_attr(row, key, sizes, "int64_list")
        b.add_io(row, rows_in, rows_out)
        deps = list(dict.fromkeys(writer[t] for t in ins if t in writer and writer[t] != oid))
        for d in deps:
            b.add_dep(row, d, EdgeKind.DATA)
        if prev is not None and prev not in deps:
            b.add_dep(row, prev, EdgeKind.ORDER)
        for t in outs:
            writer[t] = oid
        prev = oid
    g = b.build(meta={ROLE_KEY: roles})
    trace.graphs[rank] = g
    return trace


# ---- writing -------------------------------------------------------------------------------------

def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def _list(vals: list[Any]) -> str:
    return "[" + "; ".join(str(v) for v in vals) + "]"


def _or(v: Any, default: Any) -> Any:
    return default if v is None else v


def _gpu_of(name: str, default: int = 0) -> int:
    m = _GPU.match(name.strip().lower())
    return int(m.group(1)) if m else default


def _device_time_by_op(g: RankGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """For a graph with launch structure: ``(op rows, GPU time sum, GPU span)`` per operator.

    An operator is an outermost host op whose name has ``::`` (``aten::…``, ``autograd::…``;
    annotations such as ``ProfilerStep#3`` or ``## forward ##`` are not); its device time is that
    of the compute device ops launched from it or from ops nested in it (LAUNCH, then NEST
    edges), as TrioSim's tracer attributes kernels to the outermost ``cpu_op``. None when the
    graph has no LAUNCH edge from a host op.
    """
    src, dst, kind = g.edge_rows()
    launch = (kind == EdgeKind.LAUNCH) & (src >= 0)
    if not launch.any():
        return None
    n = len(g)
    parent = np.full(n, -1, np.int64)
    nest = (kind == EdgeKind.NEST) & (src >= 0)
    parent[dst[nest][::-1]] = src[nest][::-1]  # first NEST dependency of each child wins
    host = (g.is_cpu_op == 1) & (g.type == NodeType.COMP_NODE)
    names = g.names()
    oplike = host & np.array(["::" in nm for nm in names], bool)
    top = np.full(n, -2, np.int64)  # -2 unknown, -1 none, else row of the outermost op-like ancestor
    par = parent.tolist()
    opl = oplike.tolist()
    tl = top.tolist()
    for r in range(n):
        chain = []
        u = r
        while u >= 0 and tl[u] == -2 and len(chain) <= n:
            chain.append(u)
            u = par[u]
        best = tl[u] if u >= 0 and tl[u] != -2 else -1
        for v in reversed(chain):  # outermost first
            if best < 0 and opl[v]:
                best = v
            tl[v] = best
    top = np.asarray(tl, np.int64)
    dev = (g.is_cpu_op == 0) & (g.type == NodeType.COMP_NODE)
    sel = launch & dev[dst]
    op_of = top[src[sel]]
    kern = dst[sel]
    ok = op_of >= 0
    op_of, kern = op_of[ok], kern[ok]
    if not len(kern):
        return np.zeros(0, np.int64), np.zeros(0), np.zeros(0)
    d = np.nan_to_num(g.dur[kern], nan=0.0)
    ops, inv = np.unique(op_of, return_inverse=True)
    total = np.bincount(inv, weights=d, minlength=len(ops))
    st = g.start[kern]
    lo = np.full(len(ops), np.inf)
    hi = np.full(len(ops), -np.inf)
    np.minimum.at(lo, inv, np.where(np.isnan(st), np.inf, st))
    np.maximum.at(hi, inv, np.where(np.isnan(st), -np.inf, st + d))
    span = np.where(np.isfinite(lo) & np.isfinite(hi), hi - lo, total)
    # µs sums and differences of ns-resolution times: drop float noise below a picosecond
    return ops, np.round(total, 6), np.round(span, 6)


def _operators(g: RankGraph) -> tuple[np.ndarray, dict[int, float], dict[int, float]]:
    """Rows written as TrioSim operators, in execution order, with their (cudatimenooverlap, cudatime)."""
    order = execution_order(g)
    by_op = _device_time_by_op(g)
    if by_op is not None and len(by_op[0]):
        ops, total, span = by_op
        keep = np.zeros(len(g), bool)
        keep[ops] = True
        return (order[keep[order]], dict(zip(ops.tolist(), total.tolist())),
                dict(zip(ops.tolist(), span.tolist())))
    comp = g.type == NodeType.COMP_NODE
    sel = comp & (g.is_cpu_op != 1)
    if not sel.any():
        sel = comp
    rows = order[sel[order]]
    d = {r: (float(g.dur[r]) if math.isfinite(g.dur[r]) else 0.0) for r in rows.tolist()}
    return rows, d, d


def write_triosim(trace: Trace, outdir: str | os.PathLike, rank: int = 0) -> list[Path]:
    """Write rank ``rank`` of ``trace`` as ``outdir/trace.csv`` and ``outdir/tensor.csv``; returns both paths.

    A graph read by :func:`read_triosim` is written back cell for cell; others as the module
    docstring describes. Raises ValueError if ``rank`` is not in the trace.
    """
    if rank not in trace.graphs:
        raise ValueError(f"rank {rank} is not in the trace (ranks: {trace.ranks[:8]})")
    g = trace.graphs[rank]
    outdir = Path(outdir)
    t = g.tensors
    roles = g.meta.get(ROLE_KEY)
    native = isinstance(roles, list) and len(roles) == len(t)
    if native:
        ops = np.flatnonzero(g.type == NodeType.COMP_NODE)
        nooverlap = {r: (float(g.dur[r]) if math.isfinite(g.dur[r]) else 0.0) for r in ops.tolist()}
        cudatime = nooverlap
    else:
        ops, nooverlap, cudatime = _operators(g)
    # tensor ids: the table's, or fresh ones above them for tensors that have none
    tid = t.tensor_id.astype(np.int64).copy()
    if len(tid) and (tid < 0).any():
        base = int(max(tid.max(), t.storage_id.max(), -1)) + 1
        tid = np.where(tid >= 0, tid, base + np.arange(len(tid)))
    sid = np.where(t.storage_id >= 0, t.storage_id, tid)
    gpu_of_dev = {d: _gpu_of(g.strings[d]) if d >= 0 else 0 for d in np.unique(t.device).tolist()}
    names = g.names()
    resource = g.resource
    attrs = {k: (g.attrs[k].as_dict() if k in g.attrs else {}) for k in (
        "triosim_cudatime", "triosim_stage", "triosim_tpflag", "triosim_input_size", "triosim_output_size")}

    op_buf = io.StringIO()
    w = csv.writer(op_buf, lineterminator="\n")
    w.writerow(TRACE_COLUMNS)
    uses: list[tuple[int, str]] = []  # (tensor row, role) in write order, for non-native graphs
    for r in ops.tolist():
        ins, outs = g.inputs_of(r).tolist(), g.outputs_of(r).tolist()
        uses += [(x, "input") for x in ins] + [(x, "output") for x in outs]
        d = nooverlap[r]
        name = names[r]
        res = int(resource[r])
        stage = attrs["triosim_stage"].get(r)
        if stage is None:
            stage = "backward" if name.startswith("autograd") else (
                "optimizer" if name.startswith("aten::_for") else "forward")
        tp = attrs["triosim_tpflag"].get(r)
        if tp is None:
            tp = 1 if name in TP_OPS else 0
        w.writerow([
            int(g.id[r]), name, _list(tid[ins].tolist()), _list(tid[outs].tolist()),
            _fmt(attrs["triosim_cudatime"].get(r, cudatime[r])), _fmt(d),
            _list(_or(attrs["triosim_input_size"].get(r), t.numel[ins].tolist())),
            _list(_or(attrs["triosim_output_size"].get(r), t.numel[outs].tolist())),
            _gpu_of(g.strings[res]) if res >= 0 else 0, stage, int(tp),
        ])
    ten_buf = io.StringIO()
    w = csv.writer(ten_buf, lineterminator="\n")
    w.writerow(TENSOR_COLUMNS)
    rows = list(enumerate(roles)) if native else uses
    for index, (x, role) in enumerate(rows):
        w.writerow([index, int(tid[x]), "[" + ", ".join(str(v) for v in t.shape(x)) + "]",
                    int(t.numel[x]), int(t.elem_bytes[x]), role, int(sid[x]),
                    gpu_of_dev.get(int(t.device[x]), 0)])
    paths = [outdir / "trace.csv", outdir / "tensor.csv"]
    with OutputSet() as out:
        for p, buf in zip(paths, (op_buf, ten_buf)):
            f = out.open(p)
            try:
                f.write(buf.getvalue().encode("utf-8"))
            finally:
                f.close()
    return paths
