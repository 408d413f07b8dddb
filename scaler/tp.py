"""Tensor parallelism (Megatron-style) and sequence parallelism on a captured step.

:func:`tensor_parallel` splits every rank of the input over ``tp`` ranks. Decisions are made per
**unit** (top-level operator, :mod:`ettools.scaler.model`): an ``aten::linear`` is split as a
whole and everything nested in it (``aten::matmul``, ``aten::mm``, views, the kernels they
launched) follows, so the number of matmuls per rank is unchanged and each is counted once.

1. **Layers.** Forward units of GEMM/convolution class that read a parameter are the splittable
   layers (``aten::linear``, ``aten::addmm``, ``aten::conv2d``, …). In forward order, a layer is
   paired with the next one when data flows from the first to the second without passing through
   another layer (``qkv → attention → proj``, ``fc1 → act → fc2``, ``conv → relu → conv``): the
   first is **column**-parallel (weight split along its output features), the second
   **row**-parallel (along its input features; its output is a partial sum). Layers left without
   a partner (an LM head, a classifier) stay replicated. The units on the data path between a
   pair (attention, activations, views) are the **region**: they run on ``1/tp`` of the heads /
   features.
2. **Sequence parallelism** (``sp=True``): the residual stream is split along the sequence
   between regions. It starts at the tensor added to the first row layer's output (the block
   input, after the embedding) and covers every unit downstream of it that is not a layer, a
   region, or after an unpaired layer (head, loss): norms, residual adds, dropout run on
   ``S/tp``. The norms' parameter gradients are then partial over ``tp`` and are all-reduced once
   after backward (one bucket, Megatron's ``allreduce_sequence_parallel_grads``).
3. **Collectives** come from :func:`ettools.redistribute.redistribute` (the matcher the
   synthesizer uses): each forward tensor is converted from the layout its producer leaves
   (replicated, sequence-split, feature-split or partial) to the layout its consumers need, and
   in backward its gradient from the consumers' layout (partial after a column layer's input
   gradient) back to the producer's. That gives Megatron's operators: with SP an all-gather before
   each column layer and a reduce-scatter after each row layer, their transposes in backward (and
   an all-gather of a column layer's input again for its weight gradient, ``sp_regather``); without
   SP an all-reduce after each row layer and after each column layer's input gradient.
4. **Cost.** FLOPs (``num_ops``), bytes (``tensor_size``) and tensor sizes of layer, region and
   (with SP) sequence-parallel units and of their backward units are divided by ``tp``; so is the
   optimizer work on split weights. Durations follow the trace's own time model on each op's
   cost before and after (:mod:`ettools.scaler.cost`; ``time_model="proportional"``: divided by
   ``tp``). On host-only traces the thread timeline is re-laid out
   (:func:`ettools.scaler.timeline.repack`); on GPU traces kernels shrink in place.

Tensor sizes come from the trace's tensors (PyTorch ET); a trace without them cannot be split
(:class:`~ettools.scaler.model.ScaleError`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ettools.classify import classify_names
from ettools.graph import CollectiveType, RankGraph, Trace
from ettools.redistribute import Layout, redistribute
from ettools.scaler.dims import infer_dims, label_dims
from ettools.scaler.edit import Editor
from ettools.scaler.flow import UnitFlow
from ettools.scaler.insert import Inserter as _Inserter
from ettools.scaler.insert import Step as _Step
from ettools.scaler.mesh import axis_group_name, replicate
from ettools.scaler.model import (
    BWD,
    FWD,
    OPT,
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
from ettools.scaler.rescale import _row_costs, _unit_factor, time_ratio
from ettools.scaler.tensors import scale_tensors
from ettools.scaler.timeline import repack, scale_device
from ettools.scaler.triosim import is_flat, tp_flagged_rank

# abstract activation layouts over (sequence, batch, features)
REP = Layout.replicated(3)
SEQ = Layout((("tp",), (), ()))
HID = Layout(((), (), ("tp",)))
PART = Layout(((), (), ()), ("tp",))

COL, ROW, REGION, SPLIT_SEQ, REPL = "col", "row", "region", "sp", "rep"
_LAYER = re.compile(r"^aten::(linear|addmm|matmul|mm|conv\w*|_convolution\w*|convolution|cudnn_convolution\w*)$")


@dataclass
class TPPlan:
    """Roles of the forward units of one rank (see the module docstring)."""

    role: dict[int, str] = field(default_factory=dict)
    pairs: list[tuple[int, int]] = field(default_factory=list)
    sp_norm_params: int = 0  # bytes of parameters read by sequence-parallel units (their grads need an all-reduce)
    sp_param_units: list[tuple[int, int]] = field(default_factory=list)  # (unit row, parameter bytes)
    split_params: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # storage keys of split weights


def _out_bytes(g: RankGraph, m: StepModel, unit: int, members: np.ndarray) -> int:
    """Bytes of a unit's activation output: the largest output tensor of the unit row, else of its rows."""
    nb = g.tensors.nbytes
    o = g.outputs_of(unit)
    if len(o):
        return int(nb[o].max())
    outs = [g.outputs_of(r) for r in members.tolist()]
    outs = [x for x in outs if len(x)]
    return int(max(nb[x].max() for x in outs)) if outs else 0


def plan_tensor_parallel(m: StepModel, flow: UnitFlow, sp: bool) -> TPPlan:
    """Layer pairs, regions and sequence-parallel units of every step (forward units only)."""
    g = m.g
    plan = TPPlan()
    fw_all = m.units[np.isin(m.phase[m.units], (PRE, FWD))]
    names = g.strings.decode(g.name[fw_all])
    cls = classify_names(g.name[fw_all], g.strings)
    is_layer = np.array([bool(_LAYER.match(s)) for s in names], bool) & (cls == 0) & m.param_units[fw_all]
    split: list[int] = []
    key = storage_keys(g)
    for s in m.steps:
        in_step = m.step[fw_all] == s
        fw = fw_all[in_step]
        layers = fw_all[in_step & is_layer]
        fw_set = set(fw.tolist())
        layer_set = set(layers.tolist())
        i = 0
        unpaired: list[int] = []
        while i < len(layers):
            a = int(layers[i])
            if i + 1 < len(layers):
                b = int(layers[i + 1])
                if b in flow.reach([a], True, stop=layer_set, within=fw_set):
                    plan.pairs.append((a, b))
                    plan.role[a], plan.role[b] = COL, ROW
                    fwd_reach = flow.reach([a], True, stop=layer_set, within=fw_set)
                    back_reach = flow.reach([b], False, stop=layer_set, within=fw_set)
                    for u in (fwd_reach & back_reach) - layer_set:
                        plan.role[u] = REGION
                    i += 2
                    continue
            unpaired.append(a)
            i += 1
        for u in unpaired:
            plan.role[u] = REPL
        if sp:
            row0 = next((b for a, b in plan.pairs if m.step[a] == s), None)
            if row0 is None:
                raise ScaleError(f"rank {g.rank}: sequence parallelism needs paired layers; step {s} has none")
            x0 = None
            for c in flow.succ.get(row0, []):
                others = [p for p in flow.pred.get(c, []) if p != row0 and p in fw_set]
                if others:
                    x0 = max(others, key=lambda p: float(g.start[p]) if np.isfinite(g.start[p]) else 0.0)
                    break
            if x0 is None:
                raise ScaleError(
                    f"rank {g.rank}: sequence parallelism needs a residual stream: nothing is added to the "
                    f"output of node {int(g.id[row0])} ({g.name_of(row0)})")
            post = flow.reach(unpaired, True, within=fw_set) | set(unpaired)
            down = flow.reach([x0], True, within=fw_set)
            for u in down:
                if u not in plan.role and u not in post:
                    plan.role[u] = SPLIT_SEQ
        # weights of split layers
        for a, b in plan.pairs:
            if m.step[a] != s:
                continue
            for u in (a, b):
                split.extend(_param_keys(m, u, key).tolist())
    if sp:
        sp_units = [u for u, r in plan.role.items() if r == SPLIT_SEQ]
        seen: set[int] = set()
        total = 0
        for u in sorted(sp_units, key=lambda x: (float(g.start[x]) if np.isfinite(g.start[x]) else 0.0, x)):
            for k, nb in zip(*_param_tensors(m, u, key)):
                if k not in seen:
                    seen.add(k)
                    total += nb
                    plan.sp_param_units.append((u, nb))
        plan.sp_norm_params = total
    plan.split_params = np.unique(np.asarray(split, np.int64))
    return plan


def _unit_rows(m: StepModel, u: int) -> np.ndarray:
    return np.flatnonzero(m.unit == u)


def _param_tensors(m: StepModel, u: int, key: np.ndarray) -> tuple[list[int], list[int]]:
    """(storage keys, bytes) of the parameters a unit reads (one entry per storage)."""
    g = m.g
    rows = _unit_rows(m, u)
    ts = np.unique(np.concatenate([g.inputs_of(r) for r in rows.tolist()] + [np.zeros(0, np.int64)]))
    if not len(ts):
        return [], []
    k = key[ts]
    isp = np.isin(k, m.param_storage)
    out_k, out_b = [], []
    nb = g.tensors.nbytes
    for kk in np.unique(k[isp]).tolist():
        out_k.append(int(kk))
        out_b.append(int(nb[ts[k == kk]].max()))
    return out_k, out_b


def _param_keys(m: StepModel, u: int, key: np.ndarray) -> np.ndarray:
    return np.asarray(_param_tensors(m, u, key)[0], np.int64)


def _layouts(role: str) -> tuple[Layout, Layout]:
    """(layout the unit needs its activation inputs in, layout of its output)."""
    if role == COL:
        return REP, HID
    if role == REGION:
        return HID, HID
    if role == ROW:
        return HID, PART
    if role == SPLIT_SEQ:
        return SEQ, SEQ
    return REP, REP


def _optimizer_factor(m: StepModel, split: np.ndarray, tp: int) -> np.ndarray:
    """Per row: ``1/tp`` for optimizer / zero-grad work on split weights (their states follow them)."""
    g = m.g
    f = np.ones(len(g))
    if not len(split) or not len(g.tensors):
        return f
    split_keys = set(split.tolist())
    # a unit is split when its family's work touches split state
    for u, ks in optimizer_families(m).items():
        if ks & split_keys:
            f[m.unit == u] = 1.0 / tp
    return f


def _check_divisible(g: RankGraph, split_params: np.ndarray, tp: int) -> None:
    """Every weight to split must have a dimension ``tp`` divides (heads, features); else ScaleError."""
    t = g.tensors
    keys = storage_keys(g)
    for row in np.flatnonzero(np.isin(keys, split_params)).tolist():
        shape = t.shape(row)
        if shape and not any(d % tp == 0 and d >= tp for d in shape):
            raise ScaleError(f"rank {g.rank}: tensor parallelism over {tp} ranks cannot split weight "
                             f"tensor {int(t.tensor_id[row])} of shape {list(shape)}: no dimension divides by {tp}")


def _tp_rank(g: RankGraph, tp: int, sp: bool, group: str, sp_regather: bool, time_model: str = "affine") -> RankGraph:
    """One template rank of ``tensor_parallel``."""
    m = analyze(g)
    if not len(g.tensors):
        raise ScaleError(f"rank {g.rank}: tensor parallelism needs tensor sizes (a PyTorch ET, or ET+Kineto); "
                         "this trace has none")
    flow = UnitFlow(m)
    plan = plan_tensor_parallel(m, flow, sp)
    if not plan.pairs:
        raise ScaleError(f"rank {g.rank}: no pair of layers to split for tensor parallelism "
                         "(linear/conv units reading parameters, feeding one another)")
    _check_divisible(g, plan.split_params, tp)
    n = len(g)
    inv = 1.0 / tp
    # ---- cost factors per row ---------------------------------------------------------------
    unit_f = np.ones(n)
    for u, r in plan.role.items():
        if r in (COL, ROW, REGION, SPLIT_SEQ):
            unit_f[u] = inv
    bw_units = m.units[m.phase[m.units] == BWD]
    fo = m.fwd_of[bw_units]
    has = fo >= 0
    unit_f[bw_units[has]] = unit_f[fo[has]]
    opt_f = _optimizer_factor(m, plan.split_params, tp)
    row_f = np.where(m.unit >= 0, unit_f[np.maximum(m.unit, 0)], 1.0)
    row_f = np.minimum(row_f, opt_f)
    opt_units = m.units[np.isin(m.phase[m.units], (OPT, ZERO))]
    unit_f[opt_units] = opt_f[opt_units]
    ed = Editor(g)
    ed.scale("num_ops", np.arange(n), row_f)
    ed.scale("tensor_size", np.arange(n), row_f)
    first = np.zeros(n, bool)
    first[[u for u, r in plan.role.items() if r == SPLIT_SEQ]] = True
    first[bw_units[has]] = first[fo[has]]  # their backward units produce sequence-split gradients
    first = first[np.maximum(m.unit, 0)] & (m.unit >= 0)
    seq_lab = None
    if sp:
        seq = infer_dims(m).get("seq")
        if seq is not None:
            try:
                seq_lab = label_dims(m, "seq", seq).lab
            except ScaleError:
                seq_lab = None
    scale_tensors(ed, m, row_f, plan.split_params, tp, prefer_first=first, seq_lab=seq_lab)
    # durations: the trace's own time model on each op's cost before and after the split
    if time_model == "affine":
        c_old = _row_costs(g, g.tensors)[0]
        c_new = _row_costs(g, ed.tensors)[0]
        aff = time_ratio(m, c_old, c_new)
        dur_f = np.where(np.isfinite(aff) & (row_f < 1.0), np.minimum(aff, 1.0), row_f)
    else:
        dur_f = row_f
    if m.has_device:
        ed.set_column("dur", scale_device(m, dur_f))
    else:
        s, d = repack(m, _unit_factor(m, dur_f))
        ed.set_column("start", s)
        ed.set_column("dur", d)
    ed.meta["scaler_tp"] = {"tp": tp, "sp": sp, "pairs": len(plan.pairs)}
    # ---- collectives ------------------------------------------------------------------------
    ins = _Inserter(ed, m, group, tp)
    role = plan.role
    members_cache: dict[int, np.ndarray] = {}

    def members(u: int) -> np.ndarray:
        r = members_cache.get(u)
        if r is None:
            r = members_cache[u] = _unit_rows(m, u)
        return r

    bwd_of: dict[int, list[int]] = {}
    for u in bw_units.tolist():
        f = int(m.fwd_of[u])
        if f >= 0:
            bwd_of.setdefault(f, []).append(u)
    regathered: dict[int, int] = {}
    for p in sorted(set(role) | {q for u in role for q in flow.pred.get(u, [])},
                    key=lambda x: (float(g.start[x]) if np.isfinite(g.start[x]) else 0.0, x)):
        if m.phase[p] not in (PRE, FWD):
            continue
        cons = [c for c in flow.succ.get(p, []) if m.phase[c] == FWD and m.step[c] == m.step[p]]
        if not cons:
            continue
        src = _layouts(role.get(p, REPL))[1]
        groups: dict[Layout, list[int]] = {}
        for c in cons:
            groups.setdefault(_layouts(role.get(c, REPL))[0], []).append(c)
        gbytes = _out_bytes(g, m, p, members(p))
        for dst, cs in groups.items():
            if gbytes <= 0:
                continue
            steps = redistribute(src, dst, gbytes // src.shard_factor({"tp": tp}), {"tp": tp})
            if steps:
                last = ins.chain(steps, after=p, before=cs, phase="fwd")
                if any(role.get(c) == COL for c in cs) and any(s.kind == CollectiveType.ALL_GATHER for s in steps):
                    for c in cs:
                        if role.get(c) == COL:
                            regathered[c] = next(int(s.bytes) for s in steps if s.kind == CollectiveType.ALL_GATHER)
                del last
            # backward: gradient from the consumers' layout back to the producer's
            src_b = Layout(dst.dims, ("tp",)) if any(role.get(c) == COL for c in cs) else dst
            dst_b = src.without_partial()
            bsteps = redistribute(src_b, dst_b, gbytes // src_b.shard_factor({"tp": tp}), {"tp": tp})
            if not bsteps:
                continue
            cb = [u for c in cs for u in bwd_of.get(c, [])]
            pb = bwd_of.get(p, [])
            if not cb or not pb:
                continue
            ins.chain(bsteps, after=_last(g, cb), before=[_first(g, pb)], phase="bwd")
    if sp_regather:
        for c, nbytes in regathered.items():
            bu = bwd_of.get(c, [])
            if not bu:
                continue
            gemm = [u for u in bu if _has_gemm(m, members(u))]
            target = _first(g, gemm or bu)
            prev = _previous_bwd(m, target)
            step = _Step(CollectiveType.ALL_GATHER, nbytes)
            ins.chain([step], after=prev if prev >= 0 else None, before=[target], phase="bwd.regather")
    # sequence-parallel parameter gradients: one all-reduce after the last backward unit
    if sp and plan.sp_norm_params > 0:
        for s in m.steps:
            bu = bw_units[m.step[bw_units] == s]
            if not len(bu):
                continue
            nxt = m.units[(m.step[m.units] == s) & (m.phase[m.units] == OPT)]
            nid = ins.chain([_Step(CollectiveType.ALL_REDUCE, plan.sp_norm_params)], after=int(bu[-1]),
                            before=[int(nxt[0])] if len(nxt) else [], phase="bwd.sp_grads")
            # which units' parameters it reduces (a pipeline pass splits it by stage)
            ed.meta.setdefault("scaler_sp_grads", {})[str(nid)] = [
                [int(g.id[u]), int(b)] for u, b in plan.sp_param_units if m.step[u] == s]
    ins.order()
    return ed.build()


def _has_gemm(m: StepModel, rows: np.ndarray) -> bool:
    return bool((classify_names(m.g.name[rows], m.g.strings) == 0).any())


def _first(g: RankGraph, units: list[int]) -> int:
    return min(units, key=lambda u: (float(g.start[u]) if np.isfinite(g.start[u]) else 0.0, u))


def _last(g: RankGraph, units: list[int]) -> int:
    return max(units, key=lambda u: (float(g.start[u] + np.nan_to_num(g.dur[u])) if np.isfinite(g.start[u]) else 0.0, u))


def _previous_bwd(m: StepModel, u: int) -> int:
    bu = m.units[(m.phase[m.units] == BWD) & (m.step[m.units] == m.step[u])]
    k = np.flatnonzero(bu == u)
    return int(bu[k[0] - 1]) if len(k) and k[0] > 0 else -1


def tensor_parallel(trace: Trace, tp: int, sp: bool = False, sp_regather: bool = True, check: bool = True,
                    time_model: str = "affine", mode: str = "auto") -> Trace:
    """Every rank of ``trace`` split over ``tp`` tensor-parallel ranks (see the module docstring).

    ``mode``: ``"megatron"`` (column/row pairs found by data flow), ``"flagged"`` (TrioSim's rule:
    every flagged op split, its output / input gradient all-reduced;
    :mod:`ettools.scaler.triosim`), or ``"auto"``: flagged on a graph without host ops (a TrioSim
    CSV: its ``tpflag`` column says what to split), Megatron otherwise. Sequence parallelism needs
    Megatron. Ranks are numbered ``t·W + r``; rank ``r``'s group is ``"tp"`` (``W == 1``) or ``"tp<r>"``.
    """
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    if mode not in ("auto", "megatron", "flagged"):
        raise ValueError(f"unknown tensor-parallel mode {mode!r}: auto, megatron or flagged")
    if tp == 1:
        return trace
    W, ranks = input_ranks(trace, "tensor_parallel")

    def one(g: RankGraph, group: str) -> RankGraph:
        flagged = mode == "flagged" or (mode == "auto" and not sp and is_flat(g))
        if flagged:
            if sp:
                raise ScaleError("sequence parallelism needs Megatron tensor parallelism (mode='megatron')")
            return tp_flagged_rank(g, tp, group)
        return _tp_rank(g, tp, sp, group, sp_regather, time_model)

    templates = {r: one(g, axis_group_name("tp", r, W)) for r, g in ranks}
    out = replicate(templates, trace.meta, trace.strings, tp, "tp", W)
    return prove(out, "tensor_parallel") if check else out


__all__ = ["TPPlan", "plan_tensor_parallel", "tensor_parallel"]
