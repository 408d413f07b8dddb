"""Data parallelism: replicas of every rank plus the gradient all-reduce, bucketed like DDP.

:func:`data_parallel` turns each rank of the input into ``dp`` replicas (see
:mod:`ettools.scaler.mesh` for rank numbering and group names). Each replica runs the same
step on its own batch (the per-rank batch is unchanged: rescale first for strong scaling) and
all-reduces its gradients:

* **Gradient inventory** (:func:`gradient_events`), per step, in the order gradients become ready:
  the backward ``AccumulateGrad`` units, sized by their gradient tensor (traces with tensors:
  PyTorch ET, linked ET+Kineto). A trace without tensors but with DDP's reducer
  (``torch::distributed::reducer::mul_out`` hooks, ``record_param_comms`` where each bucket was
  launched, ``copy_bucket_to_grad`` copying it back) gives its own buckets: bucket *k* holds the
  gradients whose hooks ran before its launch, sized by the copies back (Kineto ``bytes`` of the
  device-to-device memcpy each launches). A graph the pipeline pass built lists its
  last-micro-batch gradients in ``meta["scaler_grads"]``.
* **Buckets** — DDP's rule: gradients in ready order fill a bucket until it reaches
  ``first_bucket_mb`` (the first) or ``bucket_mb`` (the others); a trace's own DDP buckets are
  kept as they are.
* **All-reduce nodes** — one ``COMM_COLL_NODE`` ``ALL_REDUCE`` per bucket in the DP group
  (Chakra ``comm_size`` = the bucket's bytes), after the bucket's last gradient (``overlap=True``,
  DDP's overlap with the rest of backward) or after the last backward unit (``overlap=False``);
  the first optimizer unit of the step (else the unit after backward) waits for all of them;
  consecutive all-reduces of a rank are chained (one communicator runs them in order). On a GPU
  trace the all-reduce waits for the last kernel launched by the producing unit and the consumer's
  first kernel waits for it (the host does not block); on a host-only trace the host ops do.
* **Reducer host work** (``host_work=True``, host-only traces bucketed here): DDP's reducer copies
  each gradient, scaled by ``1/dp``, into its bucket inside the gradient's hook (``reducer::mul_out``:
  an ``aten::mul`` of the gradient plus an ``aten::to`` wrapping the scalar) and copies the reduced
  bucket back into every gradient before the optimizer runs (``copy_bucket_to_grad``: an
  ``aten::copy_``). On a CPU that is host time the single-process trace does not contain; each
  piece is timed by the trace's own ops of that name (:func:`op_time_at`), the hook added to the
  gradient's unit and the copies to the step's first optimizer unit, and the thread re-laid out
  (:func:`ettools.scaler.timeline.repack`). On GPU traces the same work is small kernels behind
  the host and is not added.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ettools.graph import CollectiveType, EdgeKind, NodeType, RankGraph, Trace
from ettools.scaler.cost import fit_line
from ettools.scaler.edit import Editor, Stamper, comm_time_us
from ettools.scaler.mesh import axis_group_name, replicate
from ettools.scaler.model import (
    BWD,
    FWD,
    OPT,
    POST,
    PRE,
    ScaleError,
    StepModel,
    analyze,
    input_ranks,
    storage_keys,
)
from ettools.scaler.proof import prove
from ettools.scaler.timeline import repack

MB = 1 << 20


@dataclass
class GradEvent:
    """A gradient (or a trace's own DDP bucket) becoming ready."""

    row: int  # row after which it is ready (a backward unit, or a bucket's launch op)
    nbytes: int
    step: int
    bucket: int = -1  # the trace's own bucket index (DDP reducer), -1 when bucketing is ours
    consumer: int = -1  # row that must wait for the bucket's all-reduce (DDP copy-back), -1: optimizer


def _tensor_bytes(g: RankGraph, rows: np.ndarray, inputs: bool = True) -> np.ndarray:
    """Largest input (or output) tensor of each row, in bytes (0 if none)."""
    ptr, lst = (g.in_ptr, g.in_tensor) if inputs else (g.out_ptr, g.out_tensor)
    nb = g.tensors.nbytes if len(g.tensors) else np.zeros(0, np.int64)
    out = np.zeros(len(rows), np.int64)
    for k, r in enumerate(np.asarray(rows, np.int64).tolist()):
        ts = lst[ptr[r]:ptr[r + 1]]
        if len(ts):
            out[k] = int(nb[ts].max())
    return out


def op_time_at(g: RankGraph, name: str, nbytes: np.ndarray | float) -> np.ndarray | None:
    """Time (µs) the trace's own ``name`` ops take on tensors of ``nbytes`` (an array or a
    number, result shaped alike); None when the trace has no timed ``name`` op.

    Per size: the median time of those ops at exactly that size (their largest tensor) when there
    are any; else a line ``t = a + b·bytes`` (``a, b >= 0``) through the median time at each size
    when the trace holds the op at two sizes or more; else the op's median time.
    """
    code = g.strings.lookup(name)
    rows = np.flatnonzero(g.name == code) if code >= 0 else np.zeros(0, np.int64)
    rows = rows[np.isfinite(g.dur[rows]) & (g.dur[rows] > 0)]
    if not len(rows):
        return None
    want = np.asarray(nbytes, np.float64)
    dur = g.dur[rows]
    size = np.maximum(_tensor_bytes(g, rows, True), _tensor_bytes(g, rows, False)).astype(np.float64)
    line = fit_line(size, dur) if (size > 0).all() else None
    out = np.full(want.shape, float(np.median(dur))) if line is None else line[0] + line[1] * want
    sizes, inv = np.unique(size, return_inverse=True)
    medians = np.array([np.median(dur[inv == k]) for k in range(len(sizes))])
    k = np.clip(np.searchsorted(sizes, want), 0, len(sizes) - 1)
    exact = sizes[k] == want
    return np.where(exact, medians[k], out)


def reducer_host_us(g: RankGraph, events: list[GradEvent]) -> tuple[np.ndarray, np.ndarray]:
    """Per event: DDP's host time in the gradient's hook and in copying its bucket slice back (µs).

    See the module docstring; a piece whose op the trace never ran counts as 0.
    """
    nb = np.array([e.nbytes for e in events], np.float64)
    zero = np.zeros(len(events))
    wrap = op_time_at(g, "aten::to", 8.0)  # the scalar 1/dp becomes a one-element tensor
    mul = op_time_at(g, "aten::mul", nb)
    back = op_time_at(g, "aten::copy_", nb)
    hook = (zero if mul is None else mul) + (0.0 if wrap is None else float(wrap))
    return hook, zero if back is None else back


def gradient_events(m: StepModel) -> list[GradEvent]:
    """Gradients in ready order per step (see the module docstring); raises :class:`ScaleError` if unsized."""
    g = m.g
    pre = g.meta.get("scaler_grads")
    if pre is not None:
        rows = g.rows_of(np.asarray([e[0] for e in pre], np.uint64))
        return [GradEvent(int(r), int(e[1]), int(e[2])) for r, e in zip(rows.tolist(), pre)]
    names = np.array(g.strings.decode(g.name), object) if len(g) else np.zeros(0, object)
    bwd_units = m.units[m.phase[m.units] == BWD]
    acc = np.array(["AccumulateGrad" in s for s in names[bwd_units]], bool) if len(bwd_units) else np.zeros(0, bool)
    acc_units = bwd_units[acc]
    if len(acc_units) and len(g.tensors):
        order, ptr = m.rows_by_unit()
        upos = np.full(len(g), -1, np.int64)
        upos[m.units] = np.arange(len(m.units))
        events = []
        for u in acc_units.tolist():
            k = upos[u]
            rows = order[ptr[k]:ptr[k + 1]]
            # the AccumulateGrad node's own input is the gradient (a DDP hook nested in it also
            # touches the whole flat bucket)
            own = rows[names[rows] == "torch::autograd::AccumulateGrad"]
            nb = int(_tensor_bytes(g, own if len(own) else rows).max(initial=0))
            if nb > 0:
                events.append(GradEvent(u, nb, int(m.step[u])))
        if events:
            return events
    ddp = _ddp_buckets(m, names)
    if ddp:
        return ddp
    if not len(acc_units):
        opt = optimizer_gradients(m)
        if opt:
            return opt
    if len(acc_units):
        raise ScaleError(
            f"rank {g.rank}: {len(acc_units)} gradients (AccumulateGrad, first node id "
            f"{int(g.id[acc_units[0]])}) but no tensor sizes to size them: give the PyTorch ET with "
            "the Kineto trace, or a trace of a DDP run")
    return []


def optimizer_gradient_pairs(m: StepModel) -> tuple[list[tuple[int, int, int]], list[int]] | None:
    """``([(tensor row, storage key, optimizer row), …], [paired parameter key or -1, …])`` of the
    gradients the optimizer reads (see :func:`optimizer_gradients`); None when there are none."""
    g = m.g
    P = len(m.param_storage)
    if not P or not len(g.tensors):
        return None
    key = storage_keys(g)
    nb = g.tensors.nbytes
    opt_rows = np.flatnonzero(m.phase == OPT)
    if not len(opt_rows):
        return None
    names = g.strings.decode(g.name[opt_rows])
    params = set(m.param_storage.tolist())
    written: set[int] = set()
    reads: list[tuple[int, np.ndarray]] = []
    param_order: list[int] = []
    for r, nm in zip(opt_rows.tolist(), names):
        ins = g.inputs_of(r)
        k = key[ins]
        written.update(key[g.outputs_of(r)].tolist())
        if nm.endswith("_") and len(ins):
            nself = P if ("_foreach_" in nm and len(ins) % P == 0) else 1
            written.update(k[:nself].tolist())
        if not param_order and len(k) >= P and all(x in params for x in k[:P].tolist()):
            param_order = k[:P].tolist()
        reads.append((r, ins))
    seen: set[int] = set()
    grads: list[tuple[int, int, int]] = []  # (tensor row, storage key, optimizer row)
    for r, ins in reads:
        for x, k in zip(ins.tolist(), key[ins].tolist()):
            if k in params or k in written or k in seen or nb[x] <= 0:
                continue
            seen.add(k)
            grads.append((x, k, r))
    if not grads:
        return None
    # pair with parameters: by position when the lists line up, else the first unpaired one of that size
    p_bytes: dict[int, int] = {}
    for x in np.flatnonzero(np.isin(key, m.param_storage)).tolist():
        p_bytes[int(key[x])] = max(p_bytes.get(int(key[x]), 0), int(nb[x]))
    order = param_order or sorted(params)
    pair: list[int] = []
    if len(grads) == len(order) and all(nb[x] == p_bytes.get(p, -1) for (x, _, _), p in zip(grads, order)):
        pair = list(order)
    else:
        free = list(order)
        for x, _, _ in grads:
            hit = next((p for p in free if p_bytes.get(p, -1) == nb[x]), -1)
            if hit >= 0:
                free.remove(hit)
            pair.append(hit)
    return grads, pair


def optimizer_gradients(m: StepModel) -> list[GradEvent]:
    """Gradients read by the optimizer (traces without ``AccumulateGrad``: TrioSim CSVs, flat op lists).

    The optimizer updates the parameters in place; what else it reads is optimizer state (which
    it also writes: an in-place op writes its first argument, a multi-tensor ``_foreach_…_`` op its
    first list of one tensor per parameter) or the gradients, which it only reads. A gradient is
    ready after the backward op that writes its storage, else after the last backward op of the
    forward op reading its parameter (gradients and parameters pair up by position in the
    optimizer's per-parameter lists, else by size), else after the step's last backward op.
    Ready order is backward order; gradients ready together come in reverse parameter order.
    """
    found = optimizer_gradient_pairs(m)
    if not found:
        return []
    grads, pair = found
    g = m.g
    key = storage_keys(g)
    nb = g.tensors.nbytes
    # where each gradient becomes ready
    n = len(g)
    out_owner = np.repeat(np.arange(n), np.diff(g.out_ptr))
    out_key = key[g.out_tensor]
    bw_out = m.phase[out_owner] == BWD
    writer: dict[int, int] = {}
    for r, k in zip(out_owner[bw_out].tolist(), out_key[bw_out].tolist()):
        writer[k] = r
    in_owner = np.repeat(np.arange(n), np.diff(g.in_ptr))
    in_key = key[g.in_tensor]
    fw_in = np.isin(m.phase[in_owner], (FWD, PRE)) & np.isin(in_key, m.param_storage)
    reader: dict[int, int] = {}
    for r, k in zip(in_owner[fw_in].tolist(), in_key[fw_in].tolist()):
        reader[k] = int(m.unit[r])
    bw_units = m.units[m.phase[m.units] == BWD]
    upos = np.full(n, -1, np.int64)
    upos[m.units] = np.arange(len(m.units))
    last_bwd_of: dict[int, int] = {}
    for u in bw_units.tolist():
        last_bwd_of[int(m.fwd_of[u])] = u
    events = []
    for j, ((x, k, r), p) in enumerate(zip(grads, pair)):
        s = int(m.step[r])
        in_step = bw_units[m.step[bw_units] == s]
        w = writer.get(k, -1)
        if w >= 0:
            ready = int(m.unit[w])
        elif p in reader and reader[p] in last_bwd_of:
            ready = last_bwd_of[reader[p]]
        elif len(in_step):
            ready = int(in_step[-1])
        else:
            continue
        events.append((int(upos[ready]), -j, GradEvent(ready, int(nb[x]), s)))
    events.sort(key=lambda e: (e[0], e[1]))
    return [e[2] for e in events]


_BACKWARD_KERNEL = re.compile(r"backward|bwd|wgrad|dgrad|_wrw_", re.I)


def no_gradients_message(m: StepModel, what: str) -> str:
    """Why ``what`` (a pass needing gradients) cannot run on ``m``'s graph: the one-line error it raises.

    Names what the trace shows (backward work, by op or kernel name) and what it lacks (tensors,
    optimizer ops, ``AccumulateGrad``), so the user knows which trace to give instead.
    """
    g = m.g
    names = g.strings.decode(g.name) if len(g) else []
    bwd_rows = np.flatnonzero(m.phase == BWD)
    hint = next((s for s in names if _BACKWARD_KERNEL.search(s)), None)
    if hint is None and len(bwd_rows):
        hint = names[int(bwd_rows[0])]
    lacks = []
    if not len(g.tensors):
        lacks.append("no tensor sizes")
    if not (m.phase == OPT).any():
        lacks.append("no optimizer ops")
    if not any("AccumulateGrad" in s for s in names):
        lacks.append("no AccumulateGrad ops")
    if not (g.is_cpu_op != 0).any():
        lacks.append("no host ops")
    lack = ", ".join(lacks) or "no gradient the optimizer reads"
    if hint is None:
        return (f"rank {g.rank}: {what} found no gradient to all-reduce: the trace shows no backward pass "
                f"(an inference step?) and has {lack}; the result would be unconnected copies")
    mt = _BACKWARD_KERNEL.search(hint)
    a = max(0, mt.start() - 30) if mt and len(hint) > 60 else 0
    short = hint[a:a + 60] + ("..." if len(hint) > a + 60 else "")
    return (f"rank {g.rank}: {what} found no gradient to all-reduce: the step has backward work "
            f"({short!r}) but {lack} to find and size its gradients (give a PyTorch ET with the Kineto "
            "trace, a DDP run's trace, or a TrioSim CSV with its tensor table)")


def _ddp_buckets(m: StepModel, names: np.ndarray) -> list[GradEvent]:
    """A DDP run's own buckets, from its reducer hooks and copy-backs (traces without tensors)."""
    g = m.g
    launches = np.flatnonzero((names == "record_param_comms") & (m.phase == BWD))
    if not len(launches):
        return []
    hooks = np.flatnonzero((names == "torch::distributed::reducer::mul_out") & (m.phase == BWD))
    copies = np.flatnonzero(names == "torch.distributed.ddp.reducer::copy_bucket_to_grad")
    if not len(hooks) or not len(copies):
        return []
    # bytes each copy-back moves: the device memcpy its launch call started
    # device rows below each copy-back: walk launchers and NEST parents up to the copy-back row
    dev = np.flatnonzero((g.is_cpu_op == 0) & (g.tensor_size > 0))
    host_of = np.where(m.launcher[dev] >= 0, m.launcher[dev], m.parent[dev])
    is_copy = np.zeros(len(g), bool)
    is_copy[copies] = True
    owner = np.full(len(dev), -1, np.int64)
    cur = host_of.copy()
    for _ in range(int(m.depth.max(initial=0)) + 1):
        live = (cur >= 0) & (owner < 0)
        hit = live & is_copy[np.maximum(cur, 0)]
        owner[hit] = cur[hit]
        cur = np.where(live & ~hit, m.parent[np.maximum(cur, 0)], -1)
    pos = np.full(len(g), -1, np.int64)
    pos[copies] = np.arange(len(copies))
    copy_bytes = np.zeros(len(copies), np.int64)
    ok = owner >= 0
    np.add.at(copy_bytes, pos[owner[ok]], g.tensor_size[dev[ok]])
    events: list[GradEvent] = []
    start = g.start
    for s in np.unique(m.step[launches]).tolist():
        la = launches[m.step[launches] == s]
        la = la[np.argsort(start[la], kind="stable")]
        hk = hooks[m.step[hooks] == s]
        hk = hk[np.argsort(start[hk], kind="stable")]
        cp = np.flatnonzero(m.step[copies] == s)
        cp = cp[np.argsort(start[copies[cp]], kind="stable")]
        # hooks per bucket: those starting before the bucket's launch (and after the previous one)
        counts = np.diff(np.concatenate([[0], np.searchsorted(start[hk], start[la], side="right")]))
        if counts.sum() != len(cp) or (copy_bytes[cp] <= 0).any():
            raise ScaleError(
                f"rank {g.rank}: DDP buckets of step {s} cannot be sized: {int(counts.sum())} gradient "
                f"hooks but {len(cp)} sized copy-backs (first launch node id {int(g.id[la[0]])})")
        pos = 0
        for b, (row, c) in enumerate(zip(la.tolist(), counts.tolist())):
            chunk = cp[pos:pos + c]
            pos += c
            events.append(GradEvent(row, int(copy_bytes[chunk].sum()), int(s), bucket=b,
                                    consumer=int(copies[chunk[0]]) if len(chunk) else -1))
    return events


def make_buckets(events: list[GradEvent], bucket_mb: float, first_bucket_mb: float | None) -> list[list[GradEvent]]:
    """Group ready-ordered gradients into DDP buckets (per step; a trace's own buckets kept)."""
    out: list[list[GradEvent]] = []
    by_step: dict[int, list[GradEvent]] = {}
    for e in events:
        by_step.setdefault(e.step, []).append(e)
    for _, evs in sorted(by_step.items()):
        if evs and evs[0].bucket >= 0:
            out.extend([e] for e in evs)
            continue
        cur: list[GradEvent] = []
        size = 0
        cap = (first_bucket_mb if first_bucket_mb is not None else bucket_mb) * MB
        for e in evs:
            cur.append(e)
            size += e.nbytes
            if size >= cap:
                out.append(cur)
                cur, size, cap = [], 0, bucket_mb * MB
        if cur:
            out.append(cur)
    return out


def unit_device_rows(m: StepModel) -> dict[int, np.ndarray]:
    """Device rows of every unit that launched any, sorted by start time."""
    g = m.g
    dev = np.flatnonzero((g.is_cpu_op == 0) & (m.unit >= 0) & (g.type == NodeType.COMP_NODE))
    if not len(dev):
        return {}
    u = m.unit[dev]
    o = np.lexsort((g.start[dev], u))
    dev, u = dev[o], u[o]
    cut = np.flatnonzero(np.diff(u)) + 1
    return {int(x[0]): y for x, y in zip(np.split(u, cut), np.split(dev, cut))}


def producer_row(m: StepModel, row: int, devs: dict[int, np.ndarray]) -> int:
    """The row a communication after ``row`` waits for: its unit's last kernel on a GPU trace, else ``row``."""
    u = int(m.unit[row]) if row >= 0 else -1
    d = devs.get(u)
    if d is not None and len(d):
        return int(d[np.argmax(m.g.start[d] + np.nan_to_num(m.g.dur[d]))])
    return row


def consumer_row(m: StepModel, row: int, devs: dict[int, np.ndarray]) -> int:
    """The row that waits for a communication before ``row``: its unit's first kernel on a GPU trace, else ``row``."""
    u = int(m.unit[row]) if row >= 0 else -1
    d = devs.get(u)
    if d is not None and len(d):
        return int(d[0])
    return row


def add_gradient_allreduce(g: RankGraph, group: str, group_size: int, bucket_mb: float = 25.0,
                           first_bucket_mb: float | None = 1.0, overlap: bool = True,
                           model: StepModel | None = None, exclude_ids: set[int] | None = None,
                           host_work: bool = False) -> RankGraph:
    """``g`` plus one ``ALL_REDUCE`` per gradient bucket in ``group`` (see the module docstring).

    ``exclude_ids``: node ids of gradient units to leave out (gradients another group reduces);
    ``host_work``: add DDP's reducer host work (host-only traces whose buckets are made here).
    """
    m = model if model is not None else analyze(g)
    events = gradient_events(m)
    if not events:
        raise ScaleError(no_gradients_message(m, f"data parallelism over {group_size} ranks"))
    if exclude_ids:
        events = [e for e in events if int(g.id[e.row]) not in exclude_ids]
    if not events:
        return g
    buckets = make_buckets(events, bucket_mb, first_bucket_mb)
    ed = Editor(g)
    devs = unit_device_rows(m)
    on_device = m.has_device
    start, dur = g.start, np.nan_to_num(g.dur)
    if host_work and not on_device and events[0].bucket < 0:
        start, dur = _with_reducer_work(ed, m, events)
        dur = np.nan_to_num(dur)
    prev_id: dict[int, int] = {}
    ar_ids: dict[int, list[int]] = {}
    last_bwd: dict[int, int] = {}
    for u in m.units[m.phase[m.units] == BWD].tolist():
        last_bwd[int(m.step[u])] = u
    for k, b in enumerate(buckets):
        s = b[-1].step
        nbytes = int(sum(e.nbytes for e in b))
        after = b[-1].row if overlap else last_bwd.get(s, b[-1].row)
        prod = producer_row(m, after, devs)
        t0 = float(start[prod] + dur[prod]) if np.isfinite(start[prod]) else np.nan
        row, nid = ed.add_node(
            f"all_reduce grad_bucket_{k}", NodeType.COMM_COLL_NODE, start=t0,
            dur=comm_time_us("ALL_REDUCE", nbytes, group_size, on_device), is_cpu_op=0 if on_device else 1,
            comm_type=int(CollectiveType.ALL_REDUCE), comm_bytes=nbytes, comm_group=group,
            resource=f"comm {group}",
        )
        ed.set_attr(row, "scaler", "dp_grad_allreduce", "string_val")
        ed.add_edge(row, int(g.id[prod]), EdgeKind.DATA)
        if s in prev_id:
            ed.add_edge(row, prev_id[s], EdgeKind.ORDER)
        prev_id[s] = nid
        ar_ids.setdefault(s, []).append(nid)
        cons = b[-1].consumer
        if cons >= 0:
            ed.add_edge(consumer_row(m, cons, devs), nid, EdgeKind.DATA)
    # the optimizer (or whatever follows backward) waits for every all-reduce of its step
    for s, ids in ar_ids.items():
        cons = _after_backward(m, s)
        if cons < 0:
            continue
        c = consumer_row(m, cons, devs)
        for nid in ids:
            ed.add_edge(c, nid, EdgeKind.DATA)
    return ed.build()


def _with_reducer_work(ed: Editor, m: StepModel, events: list[GradEvent]) -> tuple[np.ndarray, np.ndarray]:
    """Lengthen gradient and optimizer units by DDP's reducer work; return the new start/dur columns."""
    g = m.g
    hook, back = reducer_host_us(g, events)
    extra = np.zeros(len(g))
    np.add.at(extra, np.array([e.row for e in events], np.int64), hook)
    steps, at = np.unique(np.array([e.step for e in events], np.int64), return_inverse=True)
    per_step = np.bincount(at, weights=back, minlength=len(steps))
    for s, total in zip(steps.tolist(), per_step.tolist()):
        cons = _after_backward(m, s)
        if cons >= 0:
            extra[int(m.unit[cons])] += total
    span = np.nan_to_num(g.dur)
    factor = np.ones(len(g))
    grow = (extra > 0) & (span > 0)
    factor[grow] = (span[grow] + extra[grow]) / span[grow]
    start, dur = repack(m, factor)
    ed.set_column("start", start)
    ed.set_column("dur", dur)
    return start, dur


def _after_backward(m: StepModel, step: int) -> int:
    """First optimizer unit of ``step``; else the first unit after its backward; -1 if none."""
    u = m.units[(m.step[m.units] == step) & (m.phase[m.units] == OPT)]
    if len(u):
        return int(u[0])
    u = m.units[(m.step[m.units] == step) & (m.phase[m.units] == POST)]
    return int(u[0]) if len(u) else -1


def _with_groups(base: RankGraph, g: RankGraph) -> np.ndarray:
    """``base``'s group column with the first ``len(g)`` rows (the source rows) taken from ``g``."""
    if g.comm_group is base.comm_group[: len(g)] or np.array_equal(g.comm_group, base.comm_group[: len(g)]):
        return base.comm_group
    out = base.comm_group.copy()
    out[: len(g)] = g.comm_group
    return out


def data_parallel(trace: Trace, dp: int, bucket_mb: float = 25.0, first_bucket_mb: float | None = 1.0,
                  overlap: bool = True, check: bool = True, host_work: bool = True) -> Trace:
    """Every rank of ``trace`` as ``dp`` data-parallel replicas with bucketed gradient all-reduce.

    ``host_work``: add DDP's reducer host work on host-only traces (see the module docstring).

    Ranks are numbered ``d·W + r`` (``W`` input ranks); rank ``r``'s replicas form group
    ``"dp"`` (``W == 1``) or ``"dp<r>"``. ``dp == 1`` still inserts nothing and returns ``trace``.
    """
    if dp < 1:
        raise ValueError(f"dp must be >= 1, got {dp}")
    if dp == 1:
        return trace
    W, ranks = input_ranks(trace, "data_parallel")
    templates: dict[int, RankGraph] = {}
    done: dict[tuple, tuple[RankGraph, str]] = {}
    stamper = Stamper()
    for r, g in ranks:
        group = axis_group_name("dp", r, W)
        # ranks that differ only in their groups (tensor-parallel peers) share one template
        key = (id(g.columns["id"]), id(g.dep_id), id(g.comm_bytes), id(g.tensors))
        hit = done.get(key)
        if hit is None:
            t = add_gradient_allreduce(g, group, dp, bucket_mb, first_bucket_mb, overlap, host_work=host_work)
            done[key] = (t, group)
        else:
            base, bgroup = hit
            # the base's own groups map to this rank's (same names unless stamped per rank)
            t = stamper.stamp(base.replace(comm_group=_with_groups(base, g)), r, {bgroup: group})
        templates[r] = t if t.rank == r else t.with_rank(r)
    out = replicate(templates, trace.meta, trace.strings, dp, "dp", W)
    return prove(out, "data_parallel") if check else out


__all__ = ["GradEvent", "ScaleError", "add_gradient_allreduce", "data_parallel", "gradient_events", "make_buckets",
           "op_time_at", "optimizer_gradients", "reducer_host_us"]
