"""What the rewriter knows about a captured training step: the analysis every pass starts from.

:func:`analyze` reads one :class:`~ettools.graph.RankGraph` (host ops nested with ``NEST`` edges,
device ops hanging off their launch calls, as the Kineto / PyTorch ET readers build it) and
returns a :class:`StepModel`:

* **units** — the top-level operators: host ops none of whose ancestors is an operator (only
  annotations such as ``ProfilerStep#N``, ``## forward ##``, ``Optimizer.step#…``,
  ``nn.Module: …``, ``DistributedDataParallel.forward``). A backward unit is one
  ``autograd::engine::evaluate_function: XBackward0``. Every host row maps to the unit containing
  it, every device op to the unit of the host op that launched it (``LAUNCH`` edge), every
  nested communication node to its host op's unit. Rewrites act on units (a unit moves, scales or
  is copied with everything in it), so ``aten::linear → aten::matmul → aten::mm`` is one decision.
* **phases** — ``PRE`` (data preparation before the first operator that reads a parameter),
  ``FWD``, ``BWD`` (autograd-engine work, ``AccumulateGrad``, DDP reducer hooks), ``OPT`` (inside
  ``Optimizer.step``), ``ZERO`` (inside ``Optimizer.zero_grad``), ``POST`` (after the last backward
  unit of the step, not optimizer work).
* **steps** — the ``ProfilerStep#N`` windows (``meta["steps"]`` of Kineto graphs, else the
  annotation rows); units outside every window belong to step 0.
* **forward ↔ backward** — ``fwd_of[u]`` for a backward unit: the forward unit whose autograd
  node it runs, joined on the sequence number (ET ``seq_id``, Kineto ``seq``); backward units
  without one (``AccumulateGrad``, reducer hooks) take the forward unit of the backward unit
  before them.
* **parameters** — with a tensor table: the storages read by forward units and written by the
  optimizer (``param_storage``); units reading them are *parametric*.

**Traces without host ops** (a TrioSim CSV, a device-only trace): every compute op is its own unit;
a phase the trace states (TrioSim's ``stage`` column, ``triosim_stage``) wins over names; a backward
op maps to its forward op by the parameter storage both read, and the non-parametric backward ops
just before it to the ops that followed that layer in forward, in reverse order.

Everything is computed with numpy over the graph's columns; loops run per tree level or per unit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ettools.classify import classify_names
from ettools.graph import COMM_NODE_TYPES, EdgeKind, NodeType, RankGraph, Trace

PRE, FWD, BWD, OPT, ZERO, POST = 0, 1, 2, 3, 4, 5
PHASE_NAMES = ("PRE", "FWD", "BWD", "OPT", "ZERO", "POST")

_ANNOTATION = re.compile(
    r"^ProfilerStep#|^Optimizer\.|^nn\.Module|^## |^DistributedDataParallel\.|^\[pytorch\|profiler|"
    r"^FullyShardedDataParallel\.|^PipelineSchedule|^## forward|^## backward"
)
_BACKWARD = re.compile(
    r"^autograd::engine::evaluate_function: |Backward\d*$|^torch::autograd::AccumulateGrad|"
    r"^torch::distributed::reducer::|^torch\.distributed\.ddp\.reducer::|^autograd::"
)
_AUTOGRAD_NODE = re.compile(r"Backward\d*$|AccumulateGrad$")
_OPT_SCOPE = re.compile(r"^Optimizer\.step")
_ZERO_SCOPE = re.compile(r"^Optimizer\.zero_grad")
_STEP = re.compile(r"^ProfilerStep#")
# the phase a trace states for each op (TrioSim's ``stage`` column, kept as ``triosim_stage``)
_STAGE_ATTR = "triosim_stage"
_STAGE_PHASE = {"forward": 1, "backward": 2, "optimizer": 3}


class ScaleError(ValueError):
    """A rewrite cannot be done on this trace; the message says why (and names the node)."""


def input_ranks(trace: Trace, what: str) -> tuple[int, list[tuple[int, RankGraph]]]:
    """``(W, [(rank, graph), …])`` for every rank ``0..W-1`` of ``trace``; a missing rank is a ScaleError.

    ``W`` is the larger of the world size and the highest rank present + 1; ``what`` names the
    pass in the error.
    """
    W = max(trace.meta.world_size, max(trace.graphs, default=-1) + 1)
    out = []
    for r in range(W):
        g = trace.graphs.get(r)
        if g is None:
            raise ScaleError(f"rank {r} of {W} is missing: {what} needs every rank")
        out.append((r, g))
    return W, out


@dataclass
class StepModel:
    """The analysis of one rank graph (see the module docstring)."""

    g: RankGraph
    parent: np.ndarray  # NEST parent row, -1 for roots
    depth: np.ndarray  # nesting depth (roots 0)
    annotation: np.ndarray  # bool: row is an annotation (ProfilerStep, ## forward ##, ...)
    unit: np.ndarray  # unit row of every row (-1: annotation or unattached device op)
    launcher: np.ndarray  # host row that launched a device op (-1)
    units: np.ndarray  # unit rows in execution order
    phase: np.ndarray  # phase of every row (-1 where unit is -1)
    step: np.ndarray  # step index of every row
    fwd_of: np.ndarray  # per row: forward unit of a backward unit (-1); indexed by unit row
    fwd_exact: np.ndarray  # per row: True where fwd_of came from a sequence number
    param_storage: np.ndarray  # storage keys of parameters (sorted), empty without tensors
    param_units: np.ndarray  # bool per row: the unit reads a parameter (set on unit rows)
    has_device: bool  # the graph has device ops (GPU trace): compute lives on the device
    meta: dict = field(default_factory=dict)

    # ---- derived views ------------------------------------------------------------------------
    @property
    def steps(self) -> list[int]:
        """Step indices present among the units."""
        return sorted(set(self.step[self.units].tolist())) if len(self.units) else [0]

    def members(self, units: np.ndarray) -> np.ndarray:
        """Bool mask of every row belonging to one of ``units``."""
        m = np.zeros(len(self.g) + 1, bool)
        m[np.asarray(units, np.int64)] = True
        return m[np.where(self.unit >= 0, self.unit, len(self.g))]

    def rows_by_unit(self) -> tuple[np.ndarray, np.ndarray]:
        """``(order, ptr)``: rows sorted by unit so that unit ``units[k]``'s rows are ``order[ptr[k]:ptr[k+1]]``."""
        n = len(self.g)
        pos = np.full(n + 1, len(self.units), np.int64)
        pos[self.units] = np.arange(len(self.units))
        key = pos[np.where(self.unit >= 0, self.unit, n)]
        order = np.argsort(key, kind="stable")
        ptr = np.zeros(len(self.units) + 2, np.int64)
        np.cumsum(np.bincount(key, minlength=len(self.units) + 1), out=ptr[1:])
        return order, ptr[: len(self.units) + 1]


def nest_parent(g: RankGraph) -> np.ndarray:
    """NEST parent row of every row (-1 for roots)."""
    src, dst, kind = g.edge_rows()
    m = (kind == EdgeKind.NEST) & (src >= 0)
    parent = np.full(len(g), -1, np.int64)
    parent[dst[m]] = src[m]
    return parent


def tree_depth(parent: np.ndarray) -> np.ndarray:
    """Depth of every row in the NEST forest (pointer jumping, O(n log depth))."""
    n = len(parent)
    depth = np.where(parent >= 0, 1, 0).astype(np.int64)
    anc = parent.copy()
    for _ in range(64):
        live = anc >= 0
        if not live.any():
            break
        nxt = np.where(live, parent[np.maximum(anc, 0)], -1)
        depth += (nxt >= 0) & live
        anc = nxt
    if n and (anc >= 0).any():
        raise ValueError("NEST edges form a cycle or nest deeper than 64 levels")
    return depth


def _name_mask(g: RankGraph, pattern: re.Pattern) -> np.ndarray:
    """Rows whose name matches ``pattern`` (one regex per distinct name)."""
    names = g.name
    uniq, inv = np.unique(names, return_inverse=True)
    s = g.strings
    hit = np.array([u >= 0 and bool(pattern.search(s[int(u)])) for u in uniq], bool)
    return hit[inv] if len(uniq) else np.zeros(0, bool)


def _int_attr(g: RankGraph, name: str) -> np.ndarray:
    col = g.attrs.get(name)
    out = np.full(len(g), -1, np.int64)
    if col is None or not len(col.rows):
        return out
    vals = np.array([v if isinstance(v, (int, np.integer)) else -1 for v in col.values], np.int64)
    out[col.rows] = vals
    return out


def _str_attr(g: RankGraph, name: str) -> np.ndarray:
    col = g.attrs.get(name)
    out = np.full(len(g), "", object)
    if col is not None and len(col.rows):
        out[col.rows] = np.array(col.values, object)
    return out


def storage_keys(g: RankGraph) -> np.ndarray:
    """One int64 key per tensor row naming its storage (storage id, else tensor id, else the row)."""
    t = g.tensors
    if not len(t):
        return np.zeros(0, np.int64)
    return np.where(t.storage_id > 0, t.storage_id,
                    np.where(t.tensor_id >= 0, -(t.tensor_id + 2), -(np.arange(len(t)) + 1) * (1 << 40)))


def _ancestor_flags(parent: np.ndarray, depth: np.ndarray, mark: np.ndarray) -> np.ndarray:
    """Rows with ``mark`` set on themselves or an ancestor."""
    out = mark.copy()
    for d in range(1, int(depth.max(initial=0)) + 1):
        rows = np.flatnonzero(depth == d)
        out[rows] |= out[parent[rows]]
    return out


def analyze(g: RankGraph) -> StepModel:
    """The :class:`StepModel` of ``g`` (see the module docstring)."""
    n = len(g)
    parent = nest_parent(g)
    depth = tree_depth(parent)
    host = g.is_cpu_op != 0
    is_comm = np.isin(g.type, [int(t) for t in COMM_NODE_TYPES])
    cat = _str_attr(g, "cat")
    annotation = host & ~is_comm & (_name_mask(g, _ANNOTATION) | (cat == "user_annotation"))
    # device ops hang off their launch calls
    src, dst, kind = g.edge_rows()
    launcher = np.full(n, -1, np.int64)
    lm = (kind == EdgeKind.LAUNCH) & (src >= 0)
    launcher[dst[lm]] = src[lm]
    # unit: the outermost non-annotation ancestor
    unit = np.full(n, -1, np.int64)
    maxd = int(depth.max(initial=0))
    for d in range(maxd + 1):
        rows = np.flatnonzero((depth == d) & host & ~(is_comm & (parent < 0)))
        if not len(rows):
            continue
        p = parent[rows]
        inherited = np.where(p >= 0, unit[np.maximum(p, 0)], -1)
        unit[rows] = np.where(inherited >= 0, inherited, np.where(annotation[rows], -1, rows))
    # device ops (and comm nodes off the host) take their launcher's unit; nested device ops their parent's
    dev = np.flatnonzero(~host)
    if len(dev):
        via_launch = np.where(launcher[dev] >= 0, unit[np.maximum(launcher[dev], 0)], -1)
        via_parent = np.where(parent[dev] >= 0, unit[np.maximum(parent[dev], 0)], -1)
        unit[dev] = np.where(via_launch >= 0, via_launch, via_parent)
    # a trace without host ops (TrioSim CSV, a device-only trace): every compute op is its own unit
    flat = not host.any()
    if flat:
        ops = np.flatnonzero((g.type == NodeType.COMP_NODE) & (unit < 0) & (parent < 0))
        unit[ops] = ops
    # communication nodes a pass inserted (no parent, no launcher) belong to the unit they follow
    loose = np.flatnonzero(is_comm & (unit < 0))
    if len(loose):
        dsrc, ddst, dkind = src, dst, kind
        sel = (dsrc >= 0) & np.isin(ddst, loose) & (dkind != EdgeKind.ORDER)
        for _ in range(4):  # chains of inserted collectives
            prod_unit = np.full(n, -1, np.int64)
            d_rows, s_rows = ddst[sel], dsrc[sel]
            ok = unit[s_rows] >= 0
            prod_unit[d_rows[ok][::-1]] = unit[s_rows[ok]][::-1]  # first dependency wins
            fill = loose[(unit[loose] < 0) & (prod_unit[loose] >= 0)]
            if not len(fill):
                break
            unit[fill] = prod_unit[fill]
    is_unit = (unit == np.arange(n))
    urows = np.flatnonzero(is_unit)
    start = g.start
    if np.isfinite(start[urows]).all():
        urows = urows[np.lexsort((g.id[urows], start[urows]))]
    else:
        urows = urows[np.argsort(g.id[urows], kind="stable")]

    # steps: ProfilerStep windows
    step = np.zeros(n, np.int64)
    windows = []
    steps_meta = g.meta.get("steps")
    if steps_meta:
        windows = [(float(s[1]), float(s[2])) for s in steps_meta]
    else:
        srows = np.flatnonzero(_name_mask(g, _STEP) & annotation)
        srows = srows[np.argsort(start[srows], kind="stable")]
        windows = [(float(start[r]), float(start[r] + g.dur[r])) for r in srows.tolist()
                   if np.isfinite(start[r])]
    if windows and np.isfinite(start[urows]).all():
        w0 = np.array([w[0] for w in windows])
        k = np.searchsorted(w0, start[urows], side="right") - 1
        step_u = np.maximum(k, 0)
        step[urows] = step_u
    # phases
    opt_scope = _ancestor_flags(parent, depth, annotation & _name_mask(g, _OPT_SCOPE))
    zero_scope = _ancestor_flags(parent, depth, annotation & _name_mask(g, _ZERO_SCOPE))
    bwd_name = _name_mask(g, _BACKWARD)
    phase_u = np.full(len(urows), FWD, np.int64)
    bw = bwd_name[urows]
    # a unit on a thread where (nearly) every unit is backward work is backward work too
    res_u = g.resource[urows]
    for r in np.unique(res_u).tolist():
        m = res_u == r
        if m.sum() >= 4 and bw[m].mean() > 0.9:
            bw = bw | m
    phase_u[bw] = BWD
    phase_u[opt_scope[urows]] = OPT
    phase_u[zero_scope[urows]] = ZERO
    # a phase the trace states itself wins over names
    stated = _str_attr(g, _STAGE_ATTR)[urows]
    for name, ph in _STAGE_PHASE.items():
        phase_u[stated == name] = ph
    step_u = step[urows]
    for s in np.unique(step_u).tolist():
        ms = step_u == s
        idx = np.flatnonzero(ms)
        b = idx[phase_u[idx] == BWD]
        if len(b):
            last_b = b[-1]
            after = idx[(idx > last_b) & (phase_u[idx] == FWD)]
            phase_u[after] = POST
    phase = np.full(n, -1, np.int64)
    pu = np.full(n, -1, np.int64)
    pu[urows] = phase_u
    has_unit = unit >= 0
    phase[has_unit] = pu[unit[has_unit]]
    step[has_unit] = step[unit[has_unit]]

    # forward <-> backward
    seq = _int_attr(g, "seq_id")
    if (seq < 0).all():
        seq = _int_attr(g, "seq")
    fwd_of = np.full(n, -1, np.int64)
    fwd_exact = np.zeros(n, bool)
    fwd_rows = np.flatnonzero((phase == FWD) & (seq >= 0) & host)
    if len(fwd_rows):
        # the last forward row recording each sequence number: ops that create no autograd node
        # (slicing the input batch) record the counter's next value too, before the op that uses it
        tkey = start[fwd_rows] if np.isfinite(start[fwd_rows]).all() else g.id[fwd_rows].astype(np.float64)
        o = np.lexsort((depth[fwd_rows], tkey, seq[fwd_rows]))
        fr = fwd_rows[o]
        keep = np.ones(len(fr), bool)
        keep[:-1] = seq[fr][1:] != seq[fr][:-1]
        fr = fr[keep]
        fseq = seq[fr]
        bcand = np.flatnonzero((phase == BWD) & (seq >= 0) & _name_mask(g, _AUTOGRAD_NODE) & host)
        pos = np.searchsorted(fseq, seq[bcand])
        pos_c = np.minimum(pos, len(fseq) - 1)
        ok = fseq[pos_c] == seq[bcand]
        bu = unit[bcand[ok]]
        fu = unit[fr[pos_c[ok]]]
        # first mapping per backward unit
        ordr = np.argsort(bu, kind="stable")
        bu, fu = bu[ordr], fu[ordr]
        first = np.ones(len(bu), bool)
        first[1:] = bu[1:] != bu[:-1]
        fwd_of[bu[first]] = fu[first]
        fwd_exact[bu[first]] = True
    # unmapped backward units inherit from the previous mapped backward unit of their step
    bunits = urows[phase_u == BWD]
    last = -1
    last_step = -1
    for u in bunits.tolist():
        if step[u] != last_step:
            last, last_step = -1, step[u]
        if fwd_of[u] >= 0:
            last = fwd_of[u]
        else:
            fwd_of[u] = last

    # parameters (needs tensors)
    param_storage = np.zeros(0, np.int64)
    param_units = np.zeros(n, bool)
    if len(g.tensors) and len(g.in_tensor):
        key = storage_keys(g)
        in_owner = np.repeat(np.arange(n), np.diff(g.in_ptr))
        out_owner = np.repeat(np.arange(n), np.diff(g.out_ptr))
        in_key = key[g.in_tensor]
        out_key = key[g.out_tensor]
        # a parameter is read by the forward pass before anything in the step writes its storage
        # (views write it too, later), and the optimizer updates it; storages the allocator reused
        # for activations are first written in the step
        t_in = start[in_owner] if np.isfinite(start).all() else g.id[in_owner].astype(np.float64)
        t_out = start[out_owner] if np.isfinite(start).all() else g.id[out_owner].astype(np.float64)
        fw_in = np.isin(phase[in_owner], (FWD, PRE))
        uk, inv_in = np.unique(in_key[fw_in], return_inverse=True)
        first_read = np.full(len(uk), np.inf)
        np.minimum.at(first_read, inv_in, t_in[fw_in])
        pos = np.searchsorted(uk, out_key)
        pos_c = np.minimum(pos, max(len(uk) - 1, 0))
        hit = (len(uk) > 0) & (uk[pos_c] == out_key) if len(uk) else np.zeros(len(out_key), bool)
        first_write = np.full(len(uk), np.inf)
        np.minimum.at(first_write, pos_c[hit], t_out[hit])
        opt_written = np.unique(np.concatenate([out_key[phase[out_owner] == OPT],
                                                in_key[(phase[in_owner] == OPT) & _inplace(g, in_owner)]]))
        param_storage = uk[(first_read < first_write) & np.isin(uk, opt_written)]
        reads = np.isin(in_key, param_storage) & (phase[in_owner] == FWD)
        param_units[unit[in_owner[reads]]] = True
    else:
        # without tensors: GeMM / embedding-like units are the parametric ones
        cls = classify_names(g.name[urows], g.strings)
        names = g.strings.decode(g.name[urows])
        emb = np.array(["embedding" in s or "conv" in s or "linear" in s for s in names], bool)
        param_units[urows[(cls == 0) | emb]] = True
    if flat and len(param_storage):
        _flat_fwd_of(g, urows, phase, step, param_storage, fwd_of)
    # PRE: forward units of a step before its first parametric unit
    for s in np.unique(step_u).tolist():
        idx = np.flatnonzero((step_u == s) & (phase_u == FWD))
        par = idx[param_units[urows[idx]]]
        if len(par):
            pre = idx[idx < par[0]]
            phase_u[pre] = PRE
    pu[urows] = phase_u
    phase[has_unit] = pu[unit[has_unit]]
    return StepModel(
        g=g, parent=parent, depth=depth, annotation=annotation, unit=unit, launcher=launcher,
        units=urows, phase=phase, step=step, fwd_of=fwd_of, fwd_exact=fwd_exact,
        param_storage=param_storage, param_units=param_units, has_device=bool((g.is_cpu_op == 0).any()),
    )


def _flat_fwd_of(g: RankGraph, urows: np.ndarray, phase: np.ndarray, step: np.ndarray,
                 param_storage: np.ndarray, fwd_of: np.ndarray) -> None:
    """``fwd_of`` of a graph whose ops are its units (no sequence numbers): by the parameters they read.

    A backward op reading a parameter (a weight, or a view of its storage) computes that
    parameter's layer's gradients: it maps to the last forward op reading the same storage. The
    backward ops reading none (activation, pooling, loss backward) that run just before it are the
    backward of the forward ops that followed that layer up to the next parametric op, in reverse:
    the one right before it maps to the op right after the layer, and so on (extra ones map to the
    layer itself). Backward ops after the last mapped one take its forward op.
    """
    key = storage_keys(g)
    n = len(g)
    in_owner = np.repeat(np.arange(n), np.diff(g.in_ptr))
    in_key = key[g.in_tensor]
    isp = np.isin(in_key, param_storage)
    fw = isp & np.isin(phase[in_owner], (FWD, PRE))
    last_reader: dict[int, int] = {}
    for r, k in zip(in_owner[fw].tolist(), in_key[fw].tolist()):  # rows ascend: the last reader wins
        last_reader[k] = r
    parametric = np.zeros(n, bool)
    parametric[in_owner[fw]] = True
    bw = isp & (phase[in_owner] == BWD)
    for r, k in zip(in_owner[bw].tolist(), in_key[bw].tolist()):
        f = last_reader.get(k, -1)
        if f >= 0 and fwd_of[r] < 0:
            fwd_of[r] = f
    fwd_units = urows[np.isin(phase[urows], (FWD, PRE))]
    fpos = {int(u): i for i, u in enumerate(fwd_units.tolist())}
    bunits = urows[phase[urows] == BWD]
    for s in np.unique(step[bunits]).tolist():
        b = bunits[step[bunits] == s].tolist()
        run: list[int] = []
        last = -1
        for u in b:
            f = int(fwd_of[u])
            if f < 0:
                run.append(u)
                continue
            last = f
            if run and f in fpos:
                after = []
                for v in fwd_units[fpos[f] + 1:].tolist():
                    if parametric[v] or step[v] != s:
                        break
                    after.append(v)
                for i, x in enumerate(reversed(run)):
                    fwd_of[x] = after[i] if i < len(after) else f
            run = []
        for x in run:
            fwd_of[x] = last


def _inplace(g: RankGraph, rows: np.ndarray) -> np.ndarray:
    """Whether each row is an in-place op (``aten::xxx_`` names, ``_foreach_xxx_``)."""
    mask = _name_mask(g, re.compile(r"_$|^aten::_foreach_\w+_$"))
    return mask[rows]


def optimizer_families(m: StepModel, phases: tuple[int, ...] = (OPT, ZERO), adopt: bool = False) -> dict[int, set[int]]:
    """Optimizer (and zero-grad) units grouped by the tensors they share, as ``{unit: parameter
    storage keys its family touches}``; a unit whose family touches no parameter maps to an empty set.

    A parameter's update is a chain of ops over the parameter, its gradient, its states and
    temporaries; two chains are one family only when they share a tensor. Tensors are identified by
    storage, allocation and tensor id: an op that writes a storage it does not read allocated it
    anew, and a tensor the trace gives another id is another tensor, so a temporary (or a Python
    scalar wrapped as a tensor, allocated by no op) whose freed memory the allocator hands to the
    next parameter's does not tie the two parameters' updates together (on a CPU capture nearly every
    optimizer temporary reuses an address, which made every update one family).

    ``adopt``: a unit whose family touches no parameter takes the family of the next unit in program
    order that does — a per-parameter loop keeps state that never meets the parameter tensor (Adam's
    step counter, read back with ``item()``) beside that parameter's update. For passes that keep
    or drop whole updates (expert and pipeline sharding), not for those that rescale them: a scalar
    counter costs the same on a shard.
    """
    g = m.g
    rows = np.flatnonzero(np.isin(m.phase, phases) & (m.unit >= 0))
    if not len(rows) or not len(g.tensors):
        return {}
    start = g.start[rows]
    rows = rows[np.argsort(np.where(np.isfinite(start), start, np.inf), kind="stable")]
    key = storage_keys(g)
    tid = g.tensors.tensor_id
    params = set(m.param_storage.tolist())
    parent: dict[int, int] = {}

    def find(u: int) -> int:
        while parent[u] != u:
            parent[u] = parent[parent[u]]
            u = parent[u]
        return u

    generation: dict[int, int] = {}
    touched: dict[int, set[int]] = {}
    uses: list[tuple[int, list[tuple[int, int, int]]]] = []
    written: set[tuple[int, int, int]] = set()
    for r in rows.tolist():
        u = int(m.unit[r])
        parent.setdefault(u, u)
        ti, to = g.inputs_of(r), g.outputs_of(r)
        ins, outs = key[ti].tolist(), key[to].tolist()
        read = set(ins)
        idents = [(k, generation.get(k, 0), int(t)) for k, t in zip(ins, tid[ti].tolist())]
        for k, t in zip(outs, tid[to].tolist()):
            if k not in read:  # a fresh allocation of this storage
                generation[k] = generation.get(k, 0) + 1
            ident = (k, generation.get(k, 0), int(t))
            idents.append(ident)
            written.add(ident)
        touched.setdefault(u, set()).update(k for k in read.union(outs) if k in params)
        uses.append((u, idents))
    # only tensors the step writes tie updates together: read-only inputs (gradients, Python
    # scalars wrapped as tensors whose freed memory the next call reuses) are not a shared state
    first_unit: dict[tuple[int, int, int], int] = {}
    for u, idents in uses:
        for ident in idents:
            if ident not in written:
                continue
            a, b = find(u), find(first_unit.setdefault(ident, u))
            if a != b:
                parent[max(a, b)] = min(a, b)
    family: dict[int, set[int]] = {}
    for u, ks in touched.items():
        family.setdefault(find(u), set()).update(ks)
    out = {u: family[find(u)] for u in parent}
    if adopt:
        following: set[int] = set()
        for u in reversed(list(dict.fromkeys(int(m.unit[r]) for r in rows.tolist()))):
            if out[u]:
                following = out[u]
            else:
                out[u] = following
    return out


__all__ = [
    "BWD", "FWD", "OPT", "PHASE_NAMES", "POST", "PRE", "ZERO", "ScaleError", "StepModel", "analyze", "nest_parent",
    "optimizer_families", "storage_keys", "tree_depth",
]
