"""Pipeline parallelism: stages of layers, micro-batches, GPipe or 1F1B, send/recv on every cut.

:func:`pipeline_parallel` turns each rank of the input into ``pp`` stage ranks (numbered
``p·W + r``):

1. **Layers.** The forward units of a step are cut where the fewest tensors cross (a residual
   stream: one); the pieces between cuts are compared by their operator names and the longest
   periodic run is the stack of layers (a transformer layer is an attention piece and an MLP
   piece, period 2). Pieces before the run (embedding) go to the first stage, pieces after it
   (final norm, head, loss) to the last. Without repetition every piece is a layer.
2. **Stages.** Contiguous layers per stage: ``stages=[n0, n1, …]`` layers per stage, or balanced
   by cost (FLOPs of GEMMs and attention plus elements touched by other ops, forward and backward)
   minimizing the most loaded stage (cost: measured compute time of a unit and its backward, the
   FLOP estimate where a unit has no measured time); ``split="ops"`` instead cuts the step's
   forward ops into ``pp`` runs of equal count (TrioSim's split, for comparison). A backward unit goes with its forward unit; data
   preparation, ``zero_grad`` and post-step work run on every stage; optimizer work goes to the
   stage owning its parameter (shared multi-tensor ops run everywhere).
3. **Micro-batches.** The step is rescaled to ``batch / micro_batches``
   (:func:`ettools.scaler.rescale.rescale_graph`) and the stage's forward and backward units are
   copied once per micro-batch (node ids offset by ``(m + 1) × stride``), laid out one after the
   other in schedule order: GPipe (all forwards, then all backwards) or 1F1B (``pp − p − 1``
   warm-up forwards, then one forward and one backward alternately, then the remaining
   backwards). Data preparation and the optimizer run once, at full size; the optimizer waits for
   the last micro-batch's gradients.
4. **Send/recv.** Every tensor crossing a cut becomes, per micro-batch, a ``COMM_SEND`` on the
   producing stage and a ``COMM_RECV`` on the next (tag ``m``; its gradient back: tag
   ``M + m``; further tensors on the same cut add ``2M`` per tensor), sized as the micro-batch's
   tensor. A tensor crossing several stages is relayed stage by stage.

Collectives already in the graph (tensor parallelism applied first) move with their units; their
groups are replicated per stage (``G@pp<p>``). ``meta["scaler_grads"]`` of each stage lists its
last micro-batch's gradients for :func:`ettools.scaler.dp.data_parallel`.
"""

from __future__ import annotations

import numpy as np

from ettools.graph import EdgeKind, NodeType, RankGraph, Trace, TraceMeta
from ettools.scaler.assemble import Block, assemble
from ettools.scaler.dims import infer_dims
from ettools.scaler.dp import consumer_row, gradient_events, producer_row, unit_device_rows
from ettools.scaler.edit import Editor, Stamper, comm_time_us
from ettools.scaler.flow import UnitFlow
from ettools.scaler.mesh import shift_groups, used_groups
from ettools.scaler.model import (
    BWD,
    FWD,
    OPT,
    POST,
    PRE,
    ZERO,
    ScaleError,
    StepModel,
    analyze,
    input_ranks,
    optimizer_families,
    storage_keys,
)
from ettools.scaler.proof import prove
from ettools.scaler.rescale import op_cost, rescale_graph

SCHEDULES = ("gpipe", "1f1b")
SPLITS = ("time", "ops")


# ---- layers and stages ----------------------------------------------------------------------------

def _unit_cost(m: StepModel) -> np.ndarray:
    """Per unit row: its measured compute time plus its backward's, the cost stages balance.

    The time is what the hardware took: device op durations on a GPU trace (host leaf ops on a
    CPU trace). Where some unit has no measured time, the estimate instead: FLOPs of GEMM/attention
    rows plus elements touched by others.
    """
    g = m.g
    comp = (g.type == NodeType.COMP_NODE) & (m.unit >= 0)
    if m.has_device:
        leaf = comp & (g.is_cpu_op == 0)
    else:
        has_kid = np.zeros(len(g), bool)
        has_kid[m.parent[m.parent >= 0]] = True
        leaf = comp & ~has_kid
    d = np.where(leaf, np.nan_to_num(g.dur, nan=0.0), 0.0)
    t = np.bincount(np.where(leaf, m.unit, 0), weights=d, minlength=len(g))
    fw = m.units[np.isin(m.phase[m.units], (FWD, PRE))]
    if len(fw) and (t[fw] > 0).all():
        bw = m.units[m.phase[m.units] == BWD]
        fo = m.fwd_of[bw]
        ok = fo >= 0
        np.add.at(t, fo[ok], t[bw[ok]])
        return t
    cost = np.zeros(len(g))
    t = g.tensors
    rows = np.flatnonzero((np.diff(g.in_ptr) > 0) | (np.diff(g.out_ptr) > 0))
    names = g.strings
    has_child = np.zeros(len(g), bool)
    has_child[m.parent[m.parent >= 0]] = True
    for r in rows.tolist():
        if has_child[r] or m.unit[r] < 0:
            continue
        ins = [t.shape(int(x)) for x in g.in_tensor[g.in_ptr[r]:g.in_ptr[r + 1]]]
        outs = [t.shape(int(x)) for x in g.out_tensor[g.out_ptr[r]:g.out_ptr[r + 1]]]
        c, _ = op_cost(names[int(g.name[r])], ins, outs)
        cost[m.unit[r]] += c
    if not cost.any():  # no tensors: measured time
        d = np.nan_to_num(g.dur)
        np.add.at(cost, np.maximum(m.unit, 0), np.where(m.unit >= 0, d, 0.0))
    # backward work counts for its forward unit
    bw = m.units[m.phase[m.units] == BWD]
    fo = m.fwd_of[bw]
    ok = fo >= 0
    np.add.at(cost, fo[ok], cost[bw[ok]])
    return cost


def find_layers(m: StepModel, flow: UnitFlow, fwd: np.ndarray) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """``(layers, prefix, suffix)``: unit arrays of the layer stack and what precedes / follows it."""
    n = len(fwd)
    if n == 0:
        return [], fwd, fwd
    pos = {int(u): i for i, u in enumerate(fwd.tolist())}
    last = np.arange(n)
    for i, u in enumerate(fwd.tolist()):
        cs = [pos[c] for c in flow.succ.get(u, []) if c in pos]
        if cs:
            last[i] = max(cs)
    diff = np.zeros(n + 1, np.int64)
    span = last > np.arange(n)
    np.add.at(diff, np.arange(n)[span], 1)
    np.add.at(diff, last[span], -1)
    crossing = np.cumsum(diff)[: n - 1]  # tensors crossing the boundary after unit i
    par = np.flatnonzero(m.param_units[fwd])
    lo = int(par[0]) if len(par) else 0
    cand_range = np.arange(lo, n - 1)
    live = cand_range[crossing[cand_range] > 0]
    if not len(live):
        return [fwd], fwd[:0], fwd[:0]
    best = int(crossing[live].min())
    cuts = live[crossing[live] == best]
    bounds = [0] + (cuts + 1).tolist() + [n]
    pieces = [fwd[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    names = m.g.name
    sig = [tuple(names[p].tolist()) for p in pieces]
    k = len(pieces)
    best_run = (1, 0, 1)  # (repeats, start, period)
    for period in range(1, k // 2 + 1):
        for j in range(k - period):
            r = 1
            while j + (r + 1) * period <= k and sig[j + r * period:j + (r + 1) * period] == sig[j:j + period]:
                r += 1
            if r >= 2 and (r * period > best_run[0] * best_run[2] or
                           (r * period == best_run[0] * best_run[2] and period < best_run[2])):
                best_run = (r, j, period)
    reps, j, period = best_run
    if reps < 2:
        return pieces, fwd[:0], fwd[:0]
    layers = [np.concatenate(pieces[j + i * period:j + (i + 1) * period]) for i in range(reps)]
    prefix = np.concatenate(pieces[:j]) if j else fwd[:0]
    end = j + reps * period
    suffix = np.concatenate(pieces[end:]) if end < k else fwd[:0]
    return layers, prefix, suffix


def assign_stages(costs: list[float], pp: int, head: float = 0.0, tail: float = 0.0,
                  stages: list[int] | None = None) -> list[int]:
    """Layers per stage: ``stages`` as given, or contiguous and balanced (min of the max stage cost)."""
    n = len(costs)
    if stages is not None:
        if len(stages) != pp or sum(stages) != n or min(stages) < 0:
            raise ScaleError(f"stages {stages} must give {pp} layer counts summing to the {n} layers found")
        return list(stages)
    if n < pp:
        raise ScaleError(f"{n} layers found, fewer than the {pp} pipeline stages")
    pre = np.concatenate([[0.0], np.cumsum(costs)])
    INF = float("inf")
    # best[s][i]: min over splits of the first i layers into s+1 stages of the max stage cost
    best = [[INF] * (n + 1) for _ in range(pp)]
    arg = [[0] * (n + 1) for _ in range(pp)]
    for i in range(1, n + 1):
        best[0][i] = head + pre[i] + (tail if pp == 1 and i == n else 0.0)
    for s in range(1, pp):
        for i in range(s + 1, n + 1):
            for j in range(s, i):
                c = pre[i] - pre[j] + (tail if s == pp - 1 and i == n else 0.0)
                v = max(best[s - 1][j], c)
                if v < best[s][i]:
                    best[s][i], arg[s][i] = v, j
    counts = []
    i = n
    for s in range(pp - 1, 0, -1):
        j = arg[s][i]
        counts.append(i - j)
        i = j
    counts.append(i)
    return counts[::-1]


def equal_counts(n: int, pp: int) -> list[int]:
    """``n`` operators over ``pp`` stages in counts differing by at most one (earlier stages take the extra)."""
    if n < pp:
        raise ScaleError(f"{n} forward ops found, fewer than the {pp} pipeline stages")
    return [n // pp + (1 if i < n % pp else 0) for i in range(pp)]


def schedule_order(kind: str, pp: int, p: int, micro: int) -> list[tuple[str, int]]:
    """``[("F"|"B", micro-batch), …]`` run by stage ``p``."""
    if kind == "gpipe":
        return [("F", i) for i in range(micro)] + [("B", i) for i in range(micro)]
    if kind != "1f1b":
        raise ValueError(f"unknown schedule {kind!r}; choose from {', '.join(SCHEDULES)}")
    warm = min(pp - p - 1, micro)
    out = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while f < micro:
        out.append(("F", f))
        f += 1
        out.append(("B", b))
        b += 1
    out += [("B", i) for i in range(b, micro)]
    return out


# ---- optimizer ownership --------------------------------------------------------------------------

def _opt_owner(m: StepModel, stage_of_unit: dict[int, int], pp: int) -> dict[int, set[int]]:
    """Stages each optimizer / zero-grad unit serves (empty set: all stages)."""
    g = m.g
    out: dict[int, set[int]] = {}
    if not len(g.tensors):
        return out
    key = storage_keys(g)
    # parameter storage -> stage (the forward unit reading it)
    pstage: dict[int, int] = {}
    in_owner = np.repeat(np.arange(len(g)), np.diff(g.in_ptr))
    ks = key[g.in_tensor]
    for k_, r in zip(ks.tolist(), in_owner.tolist()):
        u = int(m.unit[r])
        if u >= 0 and u in stage_of_unit and k_ in m.param_storage.tolist():
            pstage.setdefault(k_, stage_of_unit[u])
    for u, ks in optimizer_families(m, (OPT,), adopt=True).items():
        st = {pstage[k] for k in ks if k in pstage}
        if st:
            out.setdefault(u, set()).update(st)
    return out


# ---- one input rank ---------------------------------------------------------------------------------

def _stage_graphs(g: RankGraph, pp: int, schedule: str, micro: int, stages: list[int] | None,
                  split: str = "time") -> list[RankGraph]:
    if not len(g.tensors):
        raise ScaleError(f"rank {g.rank}: pipeline parallelism needs tensor sizes to size what crosses a stage "
                         "(a PyTorch ET, or ET+Kineto); this trace has none")
    m = analyze(g)
    flow = UnitFlow(m)
    n = len(g)
    units = m.units
    stage_of_unit: dict[int, int] = {}
    layer_info = []
    for s in m.steps:
        fwd = units[(m.step[units] == s) & (m.phase[units] == FWD)]
        if not len(fwd):
            continue
        if split == "ops":  # TrioSim's rule: the forward operator sequence cut into equal counts
            layers, prefix, suffix = [fwd[i:i + 1] for i in range(len(fwd))], fwd[:0], fwd[:0]
            counts = equal_counts(len(fwd), pp) if stages is None else assign_stages(
                [1.0] * len(fwd), pp, stages=stages)
        else:
            layers, prefix, suffix = find_layers(m, flow, fwd)
            cost = _unit_cost(m)
            counts = assign_stages([float(cost[x].sum()) for x in layers], pp, float(cost[prefix].sum()),
                                   float(cost[suffix].sum()), stages)
        k = 0
        for p, c in enumerate(counts):
            for li in range(k, k + c):
                for u in layers[li].tolist():
                    stage_of_unit[u] = p
            k += c
        for u in prefix.tolist():
            stage_of_unit[u] = 0
        for u in suffix.tolist():
            stage_of_unit[u] = pp - 1
        layer_info.append({"step": int(s), "layers": len(layers), "per_stage": counts, "split": split})
    if pp > 1:
        # a pipeline that cannot cut would give every stage rank the whole model: refuse
        fwd_all = units[m.phase[units] == FWD]
        if not len(fwd_all):
            raise ScaleError(f"rank {g.rank}: pipeline parallelism over {pp} stages found no forward ops to cut "
                             f"(the trace's {len(units)} ops/units have no forward phase)")
        owned = {stage_of_unit[u] for u in fwd_all.tolist() if u in stage_of_unit}
        empty = [p for p in range(pp) if p not in owned]
        if empty:
            raise ScaleError(f"rank {g.rank}: pipeline parallelism over {pp} stages cannot cut the forward pass: "
                             f"stage(s) {empty} would hold no forward op")
    bw = units[m.phase[units] == BWD]
    for u in bw.tolist():
        f = int(m.fwd_of[u])
        stage_of_unit[u] = stage_of_unit.get(f, pp - 1)
    opt_owner = _opt_owner(m, stage_of_unit, pp)
    # micro-batch source
    if micro > 1:
        b = infer_dims(m).get("batch")
        if b is None:
            raise ScaleError(f"rank {g.rank}: cannot tell the batch size to split into {micro} micro-batches")
        if b % micro:
            raise ScaleError(f"rank {g.rank}: batch {b} does not split into {micro} micro-batches")
        g_mb = rescale_graph(g, [("batch", b, b // micro)], model=m)
    else:
        g_mb = g
    grads = gradient_events(m) if (m.phase == BWD).any() else []
    out: list[RankGraph] = []
    sc = g.attrs.get("scaler")
    once = np.zeros(n, bool)  # gradient syncs run once per step, not per micro-batch
    if sc is not None:
        for r, v in zip(sc.rows.tolist(), sc.values):
            if isinstance(v, str) and (v.endswith("sp_grads") or v == "dp_grad_allreduce"):
                once[r] = True
    for p in range(pp):
        out.append(_build_stage(g, g_mb, m, flow, p, pp, schedule, micro, stage_of_unit, opt_owner, grads, once))
        out[-1].meta["scaler_pp"] = {"stage": p, "pp": pp, "schedule": schedule, "micro_batches": micro,
                                     "layers": layer_info}
    return out


def _block_span(g: RankGraph, rows: np.ndarray) -> tuple[float, float]:
    s = g.start[rows]
    e = s + np.nan_to_num(g.dur[rows])
    ok = np.isfinite(s)
    if not ok.any():
        return 0.0, 0.0
    return float(s[ok].min()), float(e[ok].max())


def _build_stage(g: RankGraph, g_mb: RankGraph, m: StepModel, flow: UnitFlow, p: int, pp: int, schedule: str,
                 micro: int, stage_of_unit: dict[int, int], opt_owner: dict[int, set[int]], grads, once) -> RankGraph:
    n = len(g)
    unit = m.unit
    phase = m.phase
    ustage = np.full(n + 1, -1, np.int64)
    for u, s in stage_of_unit.items():
        ustage[u] = s
    row_stage = ustage[np.where(unit >= 0, unit, n)]
    fwd_rows = np.flatnonzero((phase == FWD) & (row_stage == p) & ~once)
    bwd_rows = np.flatnonzero((phase == BWD) & (row_stage == p) & ~once)
    shared_pre = np.flatnonzero((unit < 0) | np.isin(phase, (PRE, ZERO)))
    post = np.zeros(n, bool)
    post[np.isin(phase, (POST,))] = True
    # once-per-step gradient syncs: sequence-parallel norm grads split by the stage owning them
    sp_info = g.meta.get("scaler_sp_grads", {})
    once_bytes: dict[int, int] = {}
    for r in np.flatnonzero(once).tolist():
        info = sp_info.get(str(int(g.id[r])))
        if info is None:
            post[r] = row_stage[r] == p
            continue
        urows = g.rows_of(np.asarray([x[0] for x in info], np.uint64))
        nb = sum(int(b) for (_, b), ur in zip(info, urows.tolist()) if ur >= 0 and ustage[ur] == p)
        if nb > 0:
            post[r] = True
            once_bytes[r] = nb
    opt = np.flatnonzero(phase == OPT)
    opt_keep = np.array([(not opt_owner.get(int(unit[r]))) or p in opt_owner.get(int(unit[r]), ()) for r in opt.tolist()],
                        bool) if len(opt) else np.zeros(0, bool)
    post[opt[opt_keep]] = True
    post_rows = np.flatnonzero(post)
    blocks = [Block(0, shared_pre, -1, 0.0)]
    order = schedule_order(schedule, pp, p, micro)
    # micro-batches start after the data preparation, with the gap the capture had before its forward
    pre_rows = shared_pre[np.isin(phase[shared_pre], (PRE, ZERO))]
    all_fwd = np.flatnonzero(phase == FWD)
    f0 = _block_span(g, all_fwd)[0] if len(all_fwd) else 0.0
    if len(pre_rows):
        pre_end = _block_span(g, pre_rows)[1]
        cursor = max(pre_end, f0) if np.isfinite(f0) else pre_end
    else:
        cursor = f0
    seq_blocks = []
    for kind, i in order:
        rows = fwd_rows if kind == "F" else bwd_rows
        if not len(rows):
            continue
        t0, t1 = _block_span(g_mb, rows)
        blocks.append(Block(1, rows, i, cursor - t0))
        seq_blocks.append((kind, i, rows))
        cursor += t1 - t0
    if len(post_rows):
        t0, _ = _block_span(g, post_rows)
        blocks.append(Block(0, post_rows, -1, cursor - t0 if np.isfinite(t0) else 0.0))
    last_b = max((i for k, i, _ in seq_blocks if k == "B"), default=micro - 1)
    asm = assemble([g, g_mb], blocks, micro, last_b)
    sg = asm.graph
    ed = Editor(sg)
    # consecutive micro-batch blocks run one after the other on the stage
    prev_last = -1
    for bi, b in enumerate(blocks[1:], start=1):
        if b.instance < 0:
            continue
        nr = asm.new_row[bi]
        top = nr[m.depth[b.rows] == m.depth[b.rows].min()]
        st = sg.start[top]
        first = int(top[np.argmin(st)]) if np.isfinite(st).all() else int(top[0])
        if prev_last >= 0:
            ed.add_edge(first, int(sg.id[prev_last]), EdgeKind.ORDER)
        en = st + np.nan_to_num(sg.dur[top])
        prev_last = int(top[np.argmax(en)]) if np.isfinite(en).all() else int(top[-1])
    if once_bytes:
        cb = ed.column("comm_bytes")
        for r, nb in once_bytes.items():
            nid = asm.id_of(-1, r)
            if nid >= 0:
                cb[int(sg.rows_of([nid])[0])] = nb
    _add_p2p(ed, asm, g_mb, m, flow, p, pp, micro, stage_of_unit)
    # gradients of this stage, from its last micro-batch (what data parallelism all-reduces)
    sel = []
    for e in grads:
        if ustage[int(unit[e.row])] == p if e.row >= 0 and unit[e.row] >= 0 else False:
            nid = asm.id_of(last_b, e.row)
            if nid >= 0:
                sel.append([nid, e.nbytes, e.step])
    ed.meta["scaler_grads"] = sel
    out = ed.build()
    return _respan(out)


def _respan(g: RankGraph) -> RankGraph:
    """Annotations span their (moved) children again; ``meta['steps']`` follows the step annotations."""
    from ettools.scaler.edit import retimed_steps
    from ettools.scaler.timeline import respan_tight

    m = analyze(g)
    start = g.start.copy()
    dur = g.dur.copy()
    respan_tight(m, start, dur)
    out = g.replace(start=start, dur=dur)
    if g.meta.get("steps"):
        out.meta["steps"] = retimed_steps(g.meta["steps"], g.names(), start, dur)
    return out


def _add_p2p(ed: Editor, asm, g_mb: RankGraph, m: StepModel, flow: UnitFlow, p: int, pp: int, micro: int,
             stage_of_unit: dict[int, int]) -> None:
    """Send/recv nodes of stage ``p`` for every tensor crossing its cuts (see the module docstring)."""
    sg = asm.graph
    on_device = m.has_device
    devs = unit_device_rows(m)
    # producers crossing each cut c (between stage c and c + 1), in forward order
    crossings: dict[int, list[int]] = {}
    for a, succ in flow.succ.items():
        if m.phase[a] != FWD or a not in stage_of_unit:
            continue
        sa = stage_of_unit[a]
        far = max((stage_of_unit.get(b, -1) for b in succ if m.phase[b] == FWD), default=-1)
        for c in range(sa, far):
            crossings.setdefault(c, []).append(a)
    for c in crossings:
        crossings[c].sort(key=lambda u: (float(m.g.start[u]) if np.isfinite(m.g.start[u]) else 0.0, u))
    bwd_of: dict[int, list[int]] = {}
    for u in m.units[m.phase[m.units] == BWD].tolist():
        f = int(m.fwd_of[u])
        if f >= 0:
            bwd_of.setdefault(f, []).append(u)
    t = g_mb.tensors
    kind_dev = 0 if on_device else 1

    def nbytes(a: int) -> int:
        o = g_mb.outputs_of(a)
        return int(t.nbytes[o].max()) if len(o) else 0

    def new_row(inst: int, row: int) -> int:
        nid = asm.id_of(inst, row)
        return int(sg.rows_of([nid])[0]) if nid >= 0 else -1

    def when(r: int, end: bool) -> float:
        s = float(sg.start[r])
        return s + (float(np.nan_to_num(sg.dur[r])) if end else 0.0)

    def node(kind: int, label: str, a: int, nb: int, peer: int, tag: int) -> tuple[int, int]:
        row, nid = ed.add_node(
            f"{label} {m.g.name_of(a)}", kind, start=float("nan"),
            dur=comm_time_us("SEND", nb, 2, on_device), is_cpu_op=kind_dev, comm_bytes=nb, comm_peer=peer,
            comm_tag=tag, resource="pp p2p")  # laneless: transfers overlap (replay)
        ed.set_attr(row, "scaler", f"pp.{label}", "string_val")
        return row, nid

    recv_act: dict[tuple[int, int], int] = {}  # (producer, micro-batch) -> recv node id on this stage
    recv_grad: dict[tuple[int, int], int] = {}
    pending: list[tuple[int, str, int, int]] = []  # relays wired after all nodes exist
    # from the previous stage: activations in, their gradients out
    cut = p - 1
    for k, a in enumerate(crossings.get(cut, []) if cut >= 0 else []):
        nb = nbytes(a)
        users = [b for b in flow.succ.get(a, []) if stage_of_unit.get(b) == p and m.phase[b] == FWD]
        for i in range(micro):
            row, nid = node(NodeType.COMM_RECV_NODE, "recv_act", a, nb, cut, i + 2 * micro * k)
            recv_act[(a, i)] = nid
            tmin = float("inf")
            for b in users:
                cr = new_row(i, consumer_row(m, b, devs))
                if cr >= 0:
                    ed.add_edge(cr, nid, EdgeKind.DATA)
                    tmin = min(tmin, when(cr, False))
            if np.isfinite(tmin):
                ed.set_new(row, "start", tmin)
            row_s, _ = node(NodeType.COMM_SEND_NODE, "send_grad", a, nb, cut, micro + i + 2 * micro * k)
            gb = [u for b in users for u in bwd_of.get(b, [])]
            if gb:
                last = max(gb, key=lambda u: (float(m.g.start[u] + np.nan_to_num(m.g.dur[u])), u))
                pr = new_row(i, producer_row(m, last, devs))
                if pr >= 0:
                    ed.add_edge(row_s, int(sg.id[pr]), EdgeKind.DATA)
                    ed.set_new(row_s, "start", when(pr, True))
            else:
                pending.append((row_s, "grad", a, i))
    # to the next stage: activations out, their gradients in
    cut = p
    for k, a in enumerate(crossings.get(cut, []) if cut < pp - 1 else []):
        nb = nbytes(a)
        for i in range(micro):
            row, _ = node(NodeType.COMM_SEND_NODE, "send_act", a, nb, cut + 1, i + 2 * micro * k)
            if stage_of_unit[a] == p:
                pr = new_row(i, producer_row(m, a, devs))
                if pr >= 0:
                    ed.add_edge(row, int(sg.id[pr]), EdgeKind.DATA)
                    ed.set_new(row, "start", when(pr, True))
            else:
                pending.append((row, "act", a, i))
            row_r, nid_r = node(NodeType.COMM_RECV_NODE, "recv_grad", a, nb, cut + 1, micro + i + 2 * micro * k)
            recv_grad[(a, i)] = nid_r
            if stage_of_unit[a] == p and bwd_of.get(a):
                first = min(bwd_of[a], key=lambda u: (float(m.g.start[u]), u))
                cr = new_row(i, consumer_row(m, first, devs))
                if cr >= 0:
                    ed.add_edge(cr, nid_r, EdgeKind.DATA)
                    ed.set_new(row_r, "start", when(cr, False))
    # a tensor passing through this stage: forward what was received
    for row, what, a, i in pending:
        dep = recv_act.get((a, i)) if what == "act" else recv_grad.get((a, i))
        if dep is not None:
            ed.add_edge(row, dep, EdgeKind.DATA)


def pipeline_parallel(trace: Trace, pp: int, schedule: str = "1f1b", micro_batches: int | None = None,
                      stages: list[int] | None = None, check: bool = True, split: str = "time") -> Trace:
    """Every rank of ``trace`` as ``pp`` pipeline stages (see the module docstring).

    ``micro_batches`` defaults to ``pp``; ``stages`` gives the layers per stage (else balanced).
    ``split``: ``"time"`` (layers balanced by measured compute time) or ``"ops"`` (TrioSim's rule,
    for comparison: the step's forward ops, each its own layer, cut into ``pp`` contiguous runs of
    equal count, ±1; ``stages`` then counts ops). Ranks are numbered ``p·W + r``.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown pipeline split {split!r}; choose from {', '.join(SPLITS)}")
    if pp < 1:
        raise ValueError(f"pp must be >= 1, got {pp}")
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose from {', '.join(SCHEDULES)}")
    micro = pp if micro_batches is None else int(micro_batches)
    if micro < 1:
        raise ValueError(f"micro_batches must be >= 1, got {micro}")
    if pp == 1 and micro == 1:
        return trace
    for g in trace.graphs.values():
        if (g.comm_peer >= 0).any():
            raise ScaleError(f"rank {g.rank} already has send/recv nodes: pipeline_parallel needs a trace without them")
    W, ranks = input_ranks(trace, "pipeline_parallel")
    per_rank = {r: _stage_graphs(g, pp, schedule, micro, stages, split) for r, g in ranks}
    meta = trace.meta
    new_meta = TraceMeta(world_size=W * pp, device_properties=list(meta.device_properties), source=meta.source,
                         extra=dict(meta.extra))
    used = used_groups({r: gg for r, lst in per_rank.items() for gg in [lst[0]]} | {
        W * (k + 1) + r: gg for r, lst in per_rank.items() for k, gg in enumerate(lst[1:])})
    stamper = Stamper()
    graphs: dict[int, RankGraph] = {}
    for p in range(pp):
        gmap = shift_groups(meta, new_meta, used, "pp", p, W)
        for r in range(W):
            pmap = {q: q * W + r for q in range(pp)}
            graphs[p * W + r] = stamper.stamp(per_rank[r][p], p * W + r, gmap, pmap)
    info = dict(new_meta.extra.get("scaler", {}))
    info["axes"] = [*info.get("axes", []), ["pp", pp]]
    new_meta.extra["scaler"] = info
    out = Trace(new_meta, graphs, trace.strings)
    return prove(out, "pipeline_parallel") if check else out


__all__ = ["assign_stages", "equal_counts", "find_layers", "pipeline_parallel", "schedule_order"]
