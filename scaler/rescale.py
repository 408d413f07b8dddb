"""Rescaling a captured step: another batch, sequence length or any named dimension.

:func:`rescale` changes, on every rank:

* **tensor shapes** — the dimensions :func:`ettools.scaler.dims.label_dims` finds carrying the
  scaled dimension are multiplied by ``new/old`` (a non-integral result is a
  :class:`~ettools.scaler.model.ScaleError` naming the tensor's node); element counts and the
  ``inputs``/``outputs`` strings follow (:func:`ettools.scaler.tensors.apply_dims`);
* **cost, by the op's own rule** — GEMMs and convolutions by their FLOPs (``2·M·N·K``: linear
  in batch and sequence, and in a weight gradient through the contracted dimension), attention
  by ``batch·heads·seq²·head_dim`` (quadratic in sequence), everything else by the bytes it
  touches. Rows without tensors (autograd wrappers, launch calls, kernels) take the ratio of the
  nearest enclosing / launching op that has them. ``num_ops`` follows the FLOP ratio,
  ``tensor_size`` the byte ratio, ``comm_bytes`` of a collective the byte ratio of its tensors;
* **durations** — measured × a ratio from the op's cost before and after: by default the
  trace's own affine time model (:mod:`ettools.scaler.cost`: per-call overhead plus cost, fitted
  on the ops the trace holds at several sizes), ``time_model="proportional"`` for the plain cost
  ratio; on a graph without host ops (a TrioSim CSV) TrioSim's regression instead
  (:func:`ettools.scaler.triosim.batch_time_ratio`: per op kind, time linear in the elements the
  op reads and writes, fitted on the trace's own ops; ``time_model="triosim"`` forces it); with a calibrated compute model (``fit``: a
  :class:`ettools.replay.calibrate.Fit` or its JSON file) device ops take measured ×
  ``fit(new) / fit(old)``. On host-only traces the thread timeline is
  re-laid out (:func:`ettools.scaler.timeline.repack`), each unit scaled by the time-weighted
  ratio of the ops inside it.

Current values: ``batch`` and ``seq`` are read off the trace (:func:`ettools.scaler.dims.infer_dims`)
unless given as ``(old, new)``; other names need ``(old, new)``.
"""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from ettools.graph import COMM_NODE_TYPES, RankGraph, Trace
from ettools.scaler.cost import affine_ratio
from ettools.scaler.dims import infer_dims, label_dims
from ettools.scaler.edit import Editor
from ettools.scaler.model import BWD, ScaleError, StepModel, analyze, storage_keys
from ettools.scaler.proof import prove
from ettools.scaler.tensors import apply_dims
from ettools.scaler.timeline import repack
from ettools.scaler.triosim import batch_time_ratio, is_flat

_GEMM = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_addmm_activation|addmv|mv|dot|einsum)$")
_CONV = re.compile(r"^aten::(conv\w*|convolution|_convolution|cudnn_convolution\w*|mkldnn_convolution|"
                   r"convolution_backward\w*|slow_conv\w*)$")
_ATTN = re.compile(r"scaled_dot_product|flash_attention|efficient_attention|_attention_")

Change = tuple[str, int, int]  # (dimension name, old, new)


def _numel(s: tuple[int, ...]) -> float:
    n = 1.0
    for x in s:
        n *= max(int(x), 0)
    return n


def op_cost(name: str, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> tuple[float, bool]:
    """``(cost, is_flops)`` of one op from its shapes: FLOPs for GEMM/conv/attention, else bytes-like size."""
    mats = [s for s in ins if len(s) >= 2]
    out = outs[0] if outs else ()
    if _ATTN.search(name) and mats:
        q = mats[0]
        if len(q) >= 3:
            return 4.0 * _numel(q) * q[-2], True
    if _GEMM.match(name) and len(mats) >= 2:
        if name == "aten::linear":
            return 2.0 * _numel(mats[0]) * mats[1][0], True
        a = mats[-2]
        k = a[-1]
        return 2.0 * (_numel(out) if out else _numel(a)) * k, True
    if _CONV.match(name) and len(mats) >= 2:
        w = mats[1] if "backward" not in name else (mats[2] if len(mats) >= 3 else mats[1])
        base = out if out and "backward" not in name else mats[0]
        return 2.0 * _numel(base) * _numel(w) / max(w[0], 1), True
    return sum(_numel(s) for s in ins) + sum(_numel(s) for s in outs), False


def _row_costs(g: RankGraph, tensors) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per row: (cost, is_flops, bytes, output bytes) from the rows' tensor shapes (NaN where a row has none)."""
    n = len(g)
    cost = np.full(n, np.nan)
    nbytes = np.full(n, np.nan)
    obytes = np.full(n, np.nan)
    flops = np.zeros(n, bool)
    eb = tensors.elem_bytes
    rows = np.flatnonzero((np.diff(g.in_ptr) > 0) | (np.diff(g.out_ptr) > 0))
    names = g.strings
    for r in rows.tolist():
        ins = g.in_tensor[g.in_ptr[r]:g.in_ptr[r + 1]].tolist()
        outs = g.out_tensor[g.out_ptr[r]:g.out_ptr[r + 1]].tolist()
        c, f = op_cost(names[int(g.name[r])], [tensors.shape(i) for i in ins], [tensors.shape(o) for o in outs])
        cost[r], flops[r] = c, f
        nbytes[r] = float(sum(_numel(tensors.shape(x)) * max(int(eb[x]), 1) for x in set(ins + outs)))
        if outs:
            obytes[r] = float(max(_numel(tensors.shape(x)) * max(int(eb[x]), 1) for x in outs))
    return cost, flops, nbytes, obytes


def _inherit(m: StepModel, val: np.ndarray) -> np.ndarray:
    """Rows without a value take their nearest ancestor's (device ops: their launcher's chain)."""
    out = val.copy()
    up = np.where(m.launcher >= 0, m.launcher, m.parent)
    cur = up.copy()
    miss = np.isnan(out)
    for _ in range(int(m.depth.max(initial=0)) + 2):
        live = miss & (cur >= 0)
        if not live.any():
            break
        v = out[np.maximum(cur, 0)]
        hit = live & ~np.isnan(v)
        out[hit] = v[hit]
        miss &= ~hit
        cur = np.where(live & ~hit, m.parent[np.maximum(cur, 0)], -1)
    return out


def _resolve(m: StepModel, batch: Any, seq: Any, dims: dict[str, Any] | None) -> list[Change]:
    """``(name, old, new)`` for every dimension to change."""
    inferred: dict[str, int] | None = None
    want: dict[str, Any] = {}
    if batch is not None:
        want["batch"] = batch
    if seq is not None:
        want["seq"] = seq
    for k, v in (dims or {}).items():
        want[k] = v
    out: list[Change] = []
    for name, v in want.items():
        if isinstance(v, (tuple, list)):
            old, new = int(v[0]), int(v[1])
        else:
            new = int(v)
            if name not in ("batch", "seq"):
                raise ScaleError(f"rescaling '{name}' needs its current size too: give {name}=(old, new)")
            if inferred is None:
                inferred = infer_dims(m)
            if name not in inferred:
                raise ScaleError(f"rank {m.g.rank}: cannot tell the current '{name}' from the trace; "
                                 f"give {name}=(old, new)")
            old = inferred[name]
        if old <= 0 or new <= 0:
            raise ScaleError(f"'{name}' sizes must be positive, got {old} -> {new}")
        if old != new:
            out.append((name, old, new))
    return out


def time_ratio(m: StepModel, cost_old: np.ndarray, cost_new: np.ndarray) -> np.ndarray:
    """Per row: duration ratio of the trace's own affine time model (:func:`ettools.scaler.cost.affine_ratio`).

    Fitted on the ops that do the work: device ops on a GPU trace (costed by the host op that
    launched them), leaf host ops otherwise; rows without a cost inherit their parent's ratio.
    """
    g = m.g
    co = _inherit(m, cost_old)
    cn = _inherit(m, cost_new)
    if m.has_device:
        leaf = (g.is_cpu_op == 0) & (g.type == 4)
    else:
        has_child = np.zeros(len(g), bool)
        has_child[m.parent[m.parent >= 0]] = True
        leaf = ~has_child & (g.is_cpu_op != 0)
    return _inherit(m, affine_ratio(g, leaf, co, cn))


def rescale_graph(g: RankGraph, changes: list[Change], fit: Any = None, model: StepModel | None = None,
                  time_model: str = "affine") -> RankGraph:
    """One rank graph with the dimension ``changes`` applied (see the module docstring)."""
    if not changes:
        return g
    m = model if model is not None else analyze(g)
    t = g.tensors
    if not len(t):
        raise ScaleError(f"rank {g.rank}: rescaling needs tensor shapes (a PyTorch ET, or ET+Kineto)")
    new_dims = t.dims.astype(object)
    owner = np.repeat(np.arange(len(t)), np.diff(t.shape_ptr))
    for name, old, new in changes:
        lab = label_dims(m, name, old).lab
        if name in ("batch", "seq"):
            lab = lab & ~_param_shaped_grads(m)[owner]
        r = Fraction(new, old)
        idx = np.flatnonzero(lab)
        for i in idx.tolist():
            new_dims[i] = new_dims[i] * r
    bad = [i for i, d in enumerate(new_dims.tolist()) if isinstance(d, Fraction) and d.denominator != 1]
    if bad:
        tr = int(owner[bad[0]])
        users = np.repeat(np.arange(len(g)), np.diff(g.in_ptr))[g.in_tensor == tr]
        where = f"node {int(g.id[users[0]])} ({g.name_of(int(users[0]))})" if len(users) else f"tensor row {tr}"
        raise ScaleError(f"rank {g.rank}: dimension {t.dims[bad[0]]} of a tensor of {where} does not scale to an "
                         f"integer ({' and '.join(f'{n} {o}->{w}' for n, o, w in changes)})")
    dims = np.array([int(d) for d in new_dims.tolist()], np.int64)
    ed = Editor(g)
    apply_dims(ed, dims)
    old_cost, is_flops, old_bytes, old_out = _row_costs(g, t)
    new_cost, _, new_bytes, new_out = _row_costs(g, ed.tensors)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(old_cost > 0, new_cost / old_cost, np.nan)
        bratio = np.where(old_bytes > 0, new_bytes / old_bytes, np.nan)
    ratio = np.nan_to_num(_inherit(m, ratio), nan=1.0)
    bratio = _inherit(m, bratio)
    # collectives a pass inserted (no tensors, no parent) move their producer's tensor
    comm = np.isin(g.type, [int(x) for x in COMM_NODE_TYPES])
    loose = np.flatnonzero(comm & np.isnan(bratio) & (m.unit >= 0))
    with np.errstate(invalid="ignore", divide="ignore"):
        oratio = np.where(old_out > 0, new_out / old_out, np.nan)
    lu = m.unit[loose]
    via = oratio[lu]
    fo = m.fwd_of[lu]
    # a backward unit moves gradients shaped like its forward unit's output
    via = np.where(np.isnan(via) & (fo >= 0), oratio[np.maximum(fo, 0)], via)
    bratio[loose] = via
    sc = g.attrs.get("scaler")
    if sc is not None:
        for r, v in zip(sc.rows.tolist(), sc.values):
            if isinstance(v, str) and (v.endswith("sp_grads") or v == "dp_grad_allreduce"):
                bratio[r] = 1.0  # gradients of parameters: no batch or sequence in them
    bratio = np.nan_to_num(bratio, nan=1.0)
    n = len(g)
    rows = np.arange(n)
    ed.scale("num_ops", rows, np.where(is_flops | (g.num_ops >= 0), ratio, 1.0))
    ed.scale("tensor_size", rows, bratio)
    ed.scale("comm_bytes", np.flatnonzero(comm), bratio[comm])
    dur_ratio = ratio.copy()
    if time_model == "triosim" or (time_model == "affine" and is_flat(g)):
        # a flat op list (TrioSim CSV): TrioSim's per-kind regression on the elements ops touch
        dur_ratio = batch_time_ratio(g, m, t.numel, ed.tensors.numel)
    elif time_model == "affine":
        aff = time_ratio(m, old_cost, new_cost)
        dur_ratio = np.where(np.isfinite(aff), aff, dur_ratio)
    elif time_model != "proportional":
        raise ValueError(f"unknown time model {time_model!r}: affine, proportional or triosim")
    dur_ratio[comm] = 1.0  # the network decides a transfer's time
    if fit is not None:
        dur_ratio = _fit_ratio(fit, g, ed, dur_ratio)
    if m.has_device:
        dev = (g.is_cpu_op == 0) & ~comm
        d = g.dur.copy()
        d[dev] = d[dev] * dur_ratio[dev]
        ed.set_column("dur", d)
    else:
        unit_f = _unit_factor(m, dur_ratio)
        s, d = repack(m, unit_f)
        ed.set_column("start", s)
        ed.set_column("dur", d)
    ed.meta["scaler_rescale"] = [[nme, o, w] for nme, o, w in changes]
    return ed.build()


def _param_shaped_grads(m: StepModel) -> np.ndarray:
    """Per tensor row: written by a backward op and shaped like a parameter its forward op reads —
    that parameter's gradient, which has no batch or sequence dimension whatever its sizes."""
    g = m.g
    t = g.tensors
    out = np.zeros(len(t), bool)
    if not len(m.param_storage):
        return out
    key = storage_keys(g)
    bw = np.flatnonzero((m.phase == BWD) & (m.fwd_of >= 0) & (np.diff(g.out_ptr) > 0))
    for r in bw.tolist():
        ins = g.inputs_of(int(m.fwd_of[r]))
        shapes = {t.shape(int(x)) for x in ins[np.isin(key[ins], m.param_storage)].tolist()}
        if shapes:
            for x in g.outputs_of(r).tolist():
                if t.shape(int(x)) in shapes:
                    out[x] = True
    return out


def _unit_factor(m: StepModel, ratio: np.ndarray) -> np.ndarray:
    """Per unit row: the time-weighted ratio of its leaf rows (rows with no nested child)."""
    g = m.g
    n = len(g)
    has_child = np.zeros(n, bool)
    has_child[m.parent[m.parent >= 0]] = True
    leaf = ~has_child & (m.unit >= 0) & np.isfinite(g.dur)
    w = np.where(leaf, np.maximum(g.dur, 1e-3), 0.0)
    num = np.zeros(n)
    den = np.zeros(n)
    u = np.maximum(m.unit, 0)
    np.add.at(num, u[leaf], (w * ratio)[leaf])
    np.add.at(den, u[leaf], w[leaf])
    f = np.ones(n)
    ok = den > 0
    f[ok] = num[ok] / den[ok]
    return f


def _fit_ratio(fit: Any, g: RankGraph, ed: Editor, dur_ratio: np.ndarray) -> np.ndarray:
    """Device ops: ``fit(new) / fit(old)`` where the fit predicts both.

    The fit's models of FLOPs and bytes are used, not its table of exact kernel launches: a
    rescaled kernel would be launched with another geometry, which the trace cannot know.
    """
    from ettools.classify import classify_names
    from ettools.replay.calibrate import Fit
    from ettools.replay.compute import is_model_target, node_features

    if isinstance(fit, (str, Path)):
        fit = Fit.load(fit)
    new_g = ed.build()
    rows = np.flatnonzero(is_model_target(g))
    out = dur_ratio.copy()
    if not len(rows):
        return out
    names = g.strings.decode(g.name[rows])
    cls = classify_names(g.name[rows], g.strings)
    f0, b0 = node_features(g)
    f1, b1 = node_features(new_g)
    old = fit.predict(names, cls, f0[rows], b0[rows])
    new = fit.predict(names, cls, f1[rows], b1[rows])
    ok = np.isfinite(old) & np.isfinite(new) & (old > 0)
    out[rows[ok]] = new[ok] / old[ok]
    return out


def rescale(trace: Trace, batch: int | tuple[int, int] | None = None, seq: int | tuple[int, int] | None = None,
            dims: dict[str, int | tuple[int, int]] | None = None, fit: Any = None, check: bool = True,
            time_model: str = "affine") -> Trace:
    """``trace`` with batch / sequence / named dimensions changed on every rank (see the module docstring).

    Ranks sharing arrays are rescaled once. Communication groups and ranks are unchanged.
    """
    graphs: dict[int, RankGraph] = {}
    done: dict[tuple, RankGraph] = {}
    changes_of: dict[tuple, list[Change]] = {}
    for r in trace.ranks:
        g = trace.graphs[r]
        key = (id(g.columns["id"]), id(g.dep_id), id(g.tensors), id(g.comm_group), id(g.comm_peer))
        out = done.get(key)
        if out is None:
            m = analyze(g)
            ch = _resolve(m, batch, seq, dims)
            changes_of[key] = ch
            out = done[key] = rescale_graph(g, ch, fit, m, time_model)
        graphs[r] = out if out.rank == r else out.with_rank(r)
    out = Trace(trace.meta, graphs, trace.strings)
    return prove(out, "rescale") if check else out


__all__ = ["op_cost", "rescale", "rescale_graph"]
