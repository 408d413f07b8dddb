"""TrioSim's extrapolation semantics for traces that are a flat list of operators (TrioSim CSVs).

TrioSim (Li et al., *TrioSim*, ISCA 2025; sarchlab/triosim) turns one GPU's operator trace into a
multi-GPU one. Two of its rules need more than the step analysis every pass shares
(:mod:`ettools.scaler.model`), and are modelled here, as behaviour:

* **Tensor parallelism by flag** (:func:`tp_flagged_rank`). The trace marks the operators TP
  splits (the CSV's ``tpflag`` column, kept as ``triosim_tpflag``; without it TrioSim's tracer rule:
  forward ``conv2d``/``linear``/``embedding``, and the backward op of such an op that reads its
  parameter). Every flagged op — forward and backward — runs ``1/N`` of its time, work and bytes,
  and its parameters (and their gradients) are split ``N`` ways; ops not flagged run whole, on
  whole activations. So a flagged op's result is a partial one that all ``N`` ranks need whole:
  after a flagged **forward** op, an all-reduce of its output; after a flagged **backward** op, an
  all-reduce of the input gradient it computes (its output shaped like the forward op's activation
  input; where the trace records none, the forward op's activation input size; none when that
  input is the step's data, which needs no gradient). As in TrioSim, the next op waits for the
  all-reduce. Optimizer ops run ``1/N`` of the parameter/gradient bytes they touch that are split.
  :func:`ettools.scaler.tp.tensor_parallel` uses this on graphs without host ops and the
  Megatron column/row pairing (found by data flow) on graphs with host ops, whose ops it can
  follow into their kernels.
* **Batch regression** (:func:`batch_time_ratio`). Rescaling the batch of a flat trace re-times
  each op by a line fitted on the trace's own ops of the same kind (op name): time ``t = a + b·x``
  with ``x`` the elements of the op's batch-carrying tensors (its activations in TrioSim's
  ``InputSize``/``OutputSize``; weights do not grow with the batch), by least squares over that
  kind's ops; a negative intercept refits through the origin, a kind seen at one
  size (or with a non-positive slope) scales in proportion to ``x``. The op's measured time is
  multiplied by ``(a + b·x_new) / (a + b·x_old)``: compute-bound work grows linearly with the
  batch, above a floor ``a`` that small ops keep. A backward op whose recorded tensors carry no
  batch dimension (``AddmmBackward0`` recorded with its weight only) takes the element ratio of
  its forward op: it contracts over the same batch.
"""

from __future__ import annotations

import re

import numpy as np

from ettools.graph import CollectiveType, NodeType, RankGraph
from ettools.scaler.dp import optimizer_gradient_pairs
from ettools.scaler.edit import Editor
from ettools.scaler.flow import UnitFlow
from ettools.scaler.insert import Inserter, Step
from ettools.scaler.model import BWD, FWD, OPT, PRE, ScaleError, StepModel, analyze, storage_keys
from ettools.scaler.tensors import scale_tensors

FLAG_ATTR = "triosim_tpflag"
_TP_NAME = re.compile(r"^aten::(conv\dd|convolution|linear|embedding)$")


def is_flat(g: RankGraph) -> bool:
    """The graph has no host ops: each compute op is its own unit (a TrioSim CSV, a device-only trace)."""
    return len(g) > 0 and not (g.is_cpu_op != 0).any()


def _gradients(m: StepModel) -> tuple[np.ndarray, dict[int, int]]:
    """(sorted storage keys of the gradients the optimizer reads, gradient key -> its parameter's key)."""
    found = optimizer_gradient_pairs(m)
    if not found:
        return np.zeros(0, np.int64), {}
    grads, pair = found
    keys = np.unique(np.asarray([k for _, k, _ in grads], np.int64))
    return keys, {int(k): int(p) for (_, k, _), p in zip(grads, pair) if p >= 0}


def tp_flags(m: StepModel) -> np.ndarray:
    """Per row: the op is one TrioSim's tensor parallelism splits (see the module docstring)."""
    g = m.g
    n = len(g)
    comp = (g.type == NodeType.COMP_NODE) & (m.unit >= 0)
    col = g.attrs.get(FLAG_ATTR)
    flag = np.zeros(n, bool)
    if col is not None and len(col.rows):
        vals = np.array([isinstance(v, (int, np.integer)) and int(v) != 0 for v in col.values], bool)
        flag[col.rows[vals]] = True
        return flag & comp
    names = g.strings.decode(g.name)
    fwd = np.isin(m.phase, (PRE, FWD)) & comp
    flag[fwd] = [bool(_TP_NAME.match(names[r])) for r in np.flatnonzero(fwd).tolist()]
    flag[fwd] &= m.param_units[np.maximum(m.unit[fwd], 0)]
    bw = np.flatnonzero((m.phase == BWD) & comp & (m.fwd_of >= 0))
    if len(bw) and len(g.tensors):
        key = storage_keys(g)
        reads_param = np.array([np.isin(key[g.inputs_of(r)], m.param_storage).any() for r in bw.tolist()], bool)
        flag[bw] = flag[m.fwd_of[bw]] & reads_param
    return flag


def _activation_inputs(g: RankGraph, key: np.ndarray, params: np.ndarray, row: int) -> np.ndarray:
    ins = g.inputs_of(row)
    return ins[~np.isin(key[ins], params)]


def tp_flagged_rank(g: RankGraph, tp: int, group: str) -> RankGraph:
    """One template rank of TrioSim-style tensor parallelism over ``tp`` ranks (see the module docstring)."""
    m = analyze(g)
    if not len(g.tensors):
        raise ScaleError(f"rank {g.rank}: tensor parallelism needs tensor sizes (a TrioSim CSV, a PyTorch ET, "
                         "or ET+Kineto); this trace has none")
    flag = tp_flags(m)
    if not flag.any():
        raise ScaleError(f"rank {g.rank}: no operator is flagged for tensor parallelism (tpflag column all 0, "
                         "and no conv/linear/embedding op reading a parameter)")
    n = len(g)
    key = storage_keys(g)
    t = g.tensors
    nb = t.nbytes
    flagged = np.flatnonzero(flag)
    # parameters read by flagged ops, and the gradients of those parameters
    split_keys = set()
    for r in flagged.tolist():
        k = key[g.inputs_of(r)]
        split_keys.update(k[np.isin(k, m.param_storage)].tolist())
    grads, param_of = _gradients(m)
    for r in flagged[m.phase[flagged] == BWD].tolist():  # gradients the flagged backward ops write
        k = key[g.outputs_of(r)]
        split_keys.update(k[np.isin(k, grads)].tolist())
    # gradients of split parameters (paired by the optimizer's per-parameter lists)
    split_keys.update(k for k, p in param_of.items() if p in split_keys)
    split = np.asarray(sorted(split_keys), np.int64)
    row_f = np.where(flag, 1.0 / tp, 1.0)
    # optimizer ops: the split share of the parameter / gradient bytes they touch
    pg = np.union1d(m.param_storage, grads)
    for r in np.flatnonzero(m.phase == OPT).tolist():
        ts = np.concatenate([g.inputs_of(r), g.outputs_of(r)])
        sel = ts[np.isin(key[ts], pg)]
        tot = float(nb[sel].sum())
        if tot > 0:
            part = float(nb[sel[np.isin(key[sel], split)]].sum())
            row_f[r] = 1.0 - part / tot * (1.0 - 1.0 / tp)
    ed = Editor(g)
    rows = np.arange(n)
    ed.scale("num_ops", rows, row_f)
    ed.scale("tensor_size", rows, row_f)
    ed.scale("dur", rows, row_f)  # TrioSim: the recorded time divided by N
    # activations stay whole (the all-reduces make them so): only split parameters change shape
    scale_tensors(ed, m, np.ones(n), split, tp)
    ed.meta["scaler_tp"] = {"tp": tp, "mode": "flagged", "flagged": int(len(flagged))}
    # ---- all-reduces after flagged ops ----------------------------------------------------------
    flow = UnitFlow(m)
    ins = Inserter(ed, m, group, tp)
    order = m.units
    nxt = {int(a): int(b) for a, b in zip(order[:-1].tolist(), order[1:].tolist())}
    # storages some op writes (a view such as a flatten shares its producer's storage)
    produced = np.isin(key, key[g.out_tensor])
    for r in flagged.tolist():
        if m.phase[r] == BWD:
            f = int(m.fwd_of[r])
            if f < 0:
                continue
            act = _activation_inputs(g, key, m.param_storage, f)
            outs = g.outputs_of(r)
            want = set(t.numel[act].tolist())
            grad_in = [x for x in outs.tolist() if int(t.numel[x]) in want and key[x] not in grads]
            if grad_in:
                nbytes = int(nb[grad_in].sum())
            else:  # not recorded: shaped like the forward input, unless that is the step's data
                act = act[produced[act] & (nb[act] > 0)]
                nbytes = int(nb[act].sum())
            phase = "bwd"
        else:
            nbytes = int(nb[g.outputs_of(r)].sum())
            phase = "fwd"
        if nbytes <= 0:
            continue
        before = sorted({c for c in flow.succ.get(r, []) if m.unit[c] == c} | ({nxt[r]} if r in nxt else set()))
        ins.chain([Step(CollectiveType.ALL_REDUCE, nbytes)], after=r, before=before, phase=phase)
    if not ins.nodes:
        raise ScaleError(f"rank {g.rank}: the {len(flagged)} flagged ops have no output to all-reduce")
    ins.order()
    return ed.build()


def batch_time_ratio(g: RankGraph, m: StepModel, old_numel: np.ndarray, new_numel: np.ndarray) -> np.ndarray:
    """Per row: TrioSim-style duration ratio for a batch rescale of a flat trace (see the module docstring).

    ``old_numel`` / ``new_numel`` are the tensor table's element counts before and after the
    rescale; ``x`` of an op is the elements of its tensors that change (the batch-carrying ones:
    activations, not weights). Rows without such tensors (optimizer, communication) get 1.
    """
    n = len(g)
    moved = old_numel != new_numel
    x_old = np.zeros(n)
    x_new = np.zeros(n)
    for ptr, lst in ((g.in_ptr, g.in_tensor), (g.out_ptr, g.out_tensor)):
        owner = np.repeat(np.arange(n), np.diff(ptr))
        mv = moved[lst]
        np.add.at(x_old, owner[mv], old_numel[lst][mv].astype(np.float64))
        np.add.at(x_new, owner[mv], new_numel[lst][mv].astype(np.float64))
    comp = g.type == NodeType.COMP_NODE
    dur = np.nan_to_num(g.dur, nan=0.0)
    out = np.ones(n)
    with np.errstate(invalid="ignore", divide="ignore"):
        xr = np.where(x_old > 0, x_new / x_old, 1.0)
    ok = comp & (x_old > 0) & (dur > 0)
    names = g.name
    for nm in np.unique(names[ok]).tolist():
        rows = np.flatnonzero(ok & (names == nm))
        a, b = fit_kind(x_old[rows], dur[rows])
        out[rows] = (a + b * x_new[rows]) / (a + b * x_old[rows])
    rest = comp & ~ok & (x_old > 0)  # no measured time: in proportion
    out[rest] = xr[rest]
    # a backward op recorded without the batch contracts over its forward op's batch
    bw = np.flatnonzero(comp & (m.phase == BWD) & (m.fwd_of >= 0) & (x_old == 0))
    if len(bw):
        out[bw] = out[m.fwd_of[bw]]
    return out


def fit_kind(x: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """``(a, b)`` of ``t = a + b·x`` for one op kind: least squares, a negative intercept refitted
    through the origin; one distinct size or a non-positive slope: the line through the origin and
    the kind's total (time in proportion to ``x``). ``x`` must be positive."""
    x = np.asarray(x, np.float64)
    t = np.asarray(t, np.float64)
    if len(np.unique(x)) >= 2:
        A = np.stack([np.ones(len(x)), x], axis=1)
        (a, b), *_ = np.linalg.lstsq(A, t, rcond=None)
        if a < 0:  # through the origin
            a, b = 0.0, float(x @ t / (x @ x))
        if b > 0:
            return float(a), float(b)
    return 0.0, float(t.sum() / x.sum()) if x.sum() > 0 else 0.0


__all__ = ["batch_time_ratio", "fit_kind", "is_flat", "tp_flagged_rank", "tp_flags"]
