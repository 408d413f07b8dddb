"""Expert parallelism for mixture-of-experts layers: experts sharded over ranks, tokens exchanged all-to-all.

:func:`expert_parallel` turns each rank into ``ep`` ranks (``e·W + r``, group ``"ep"`` /
``"ep<r>"``) that are data-parallel replicas for everything but the experts:

1. **MoE layers.** A forward unit producing a 3-D dispatch buffer ``[E, C, h]`` that ``E ≥ 2``
   ``select`` units read one expert slice each; expert *e* is every forward unit reachable from its
   ``select`` before the first unit all experts reach (the combine, e.g. ``stack``).
2. **Sharding.** Each rank keeps ``E / ep`` experts and drops the others (forward, backward,
   gradient accumulation and optimizer work on their parameters); a kept expert now serves the
   tokens of all ``ep`` ranks: its activations' capacity dimension ``C`` grows ``ep``-fold and so
   do its cost and durations (the timeline is re-laid out on host-only traces).
3. **All-to-all.** The dispatch buffer goes from "experts whole, tokens local" to "experts split"
   and the combined expert output back, in forward and again in backward:
   :func:`ettools.redistribute.redistribute` of ``[E, C, h]`` between ``C``-split and ``E``-split
   layouts over ``ep`` gives one ``ALL_TO_ALL`` of the per-rank buffer each time (4 per layer).
4. **Dense gradients** are all-reduced over the ``ep`` group like data parallelism (DDP buckets);
   expert gradients are not (each rank owns its experts).
"""

from __future__ import annotations

import numpy as np

from ettools.graph import EdgeKind, NodeType, RankGraph, Trace
from ettools.redistribute import Layout, redistribute
from ettools.scaler.dp import add_gradient_allreduce, consumer_row, producer_row, unit_device_rows
from ettools.scaler.edit import Editor, comm_time_us
from ettools.scaler.flow import UnitFlow
from ettools.scaler.mesh import axis_group_name, replicate
from ettools.scaler.model import (
    BWD,
    FWD,
    ScaleError,
    StepModel,
    analyze,
    input_ranks,
    optimizer_families,
    storage_keys,
)
from ettools.scaler.proof import prove
from ettools.scaler.tensors import apply_dims
from ettools.scaler.timeline import repack

TOKENS_SPLIT = Layout(((), ("ep",), ()))
EXPERTS_SPLIT = Layout((("ep",), (), ()))


def find_moe_layers(m: StepModel, flow: UnitFlow) -> list[dict]:
    """MoE layers: ``{"dispatch": unit, "experts": [[units of expert e], …], "combine": unit}``."""
    g = m.g
    t = g.tensors
    out = []
    fw = m.units[m.phase[m.units] == FWD]
    fw_set = set(fw.tolist())
    for d in fw.tolist():
        o = g.outputs_of(d)
        if not len(o) or len(t.shape(int(o[0]))) != 3:
            continue
        e_count = t.shape(int(o[0]))[0]
        sel = [c for c in flow.succ.get(d, []) if c in fw_set and g.name_of(c).endswith("select")]
        if len(sel) < 2 or len(sel) != e_count:
            continue
        sel.sort(key=lambda u: (float(g.start[u]) if np.isfinite(g.start[u]) else 0.0, u))
        reach = [flow.reach([s], True, within=fw_set) for s in sel]
        common = set.intersection(*reach)
        if not common:
            continue
        combine = min(common, key=lambda u: (float(g.start[u]) if np.isfinite(g.start[u]) else 0.0, u))
        after = flow.reach([combine], True, within=fw_set) | {combine}
        experts = [sorted(({s} | r) - after, key=lambda u: (float(g.start[u]), u)) for s, r in zip(sel, reach)]
        out.append({"dispatch": d, "experts": experts, "combine": combine, "capacity": t.shape(int(o[0]))[1]})
    return out


def _ep_rank(g: RankGraph, ep: int, group: str, bucket_mb: float, first_bucket_mb: float | None) -> RankGraph:
    m = analyze(g)
    flow = UnitFlow(m)
    layers = find_moe_layers(m, flow)
    if not layers:
        raise ScaleError(f"rank {g.rank}: no mixture-of-experts layer (a [E, C, h] buffer read by one select per "
                         "expert) to shard")
    n = len(g)
    bw = m.units[m.phase[m.units] == BWD]
    fo = m.fwd_of[bw]
    kept: set[int] = set()
    dropped: set[int] = set()
    for layer in layers:
        E = len(layer["experts"])
        if E % ep:
            raise ScaleError(f"rank {g.rank}: {E} experts of the layer at node {int(g.id[layer['dispatch']])} "
                             f"do not divide over ep={ep}")
        for e, units in enumerate(layer["experts"]):
            (kept if e < E // ep else dropped).update(units)
    kept_b = set(bw[np.isin(fo, list(kept))].tolist())
    dropped_b = set(bw[np.isin(fo, list(dropped))].tolist())
    # optimizer work on dropped experts' parameters
    key = storage_keys(g)
    dropped_params: set[int] = set()
    kept_params: set[int] = set()
    for units, acc in ((dropped, dropped_params), (kept, kept_params)):
        for u in units:
            for r in np.flatnonzero(m.unit == u).tolist():
                ks = key[g.inputs_of(r)]
                acc.update(ks[np.isin(ks, m.param_storage)].tolist())
    drop_units = dropped | dropped_b
    for u, ks in optimizer_families(m, adopt=True).items():
        if ks & dropped_params and not ks & kept_params:
            drop_units.add(u)
    keep_units = kept | kept_b
    # cost and time: kept experts serve ep ranks' tokens; dropped units take no time
    unit_f = np.ones(n)
    unit_f[list(keep_units)] = float(ep)
    unit_f[list(drop_units)] = 0.0
    row_f = np.where(m.unit >= 0, unit_f[np.maximum(m.unit, 0)], 1.0)
    ed = Editor(g)
    ed.scale("num_ops", np.arange(n), row_f)
    ed.scale("tensor_size", np.arange(n), row_f)
    if m.has_device:
        d = g.dur.copy()
        dev = g.is_cpu_op == 0
        d[dev] *= row_f[dev]
        ed.set_column("dur", d)
    else:
        s, d = repack(m, unit_f)
        ed.set_column("start", s)
        ed.set_column("dur", d)
    _scale_capacity(ed, m, keep_units, layers, ep)
    # all-to-all around the experts, forward and backward
    devs = unit_device_rows(m)
    bwd_of: dict[int, list[int]] = {}
    for u, f in zip(bw.tolist(), fo.tolist()):
        if f >= 0:
            bwd_of.setdefault(f, []).append(u)
    nodes: list[tuple[float, int, int]] = []
    upos = np.full(n, -1.0)
    upos[m.units] = np.arange(len(m.units), dtype=np.float64)

    def a2a(after: int | None, before: list[int], nbytes: int, label: str) -> None:
        steps = redistribute(TOKENS_SPLIT, EXPERTS_SPLIT, nbytes, {"ep": ep})
        start = ed.current("start")
        dur = ed.current("dur")
        prev = -1
        t0 = float("nan")
        pos = float(upos[int(m.unit[after])]) if after is not None and m.unit[after] >= 0 else 0.0
        if after is not None:
            pr = producer_row(m, after, devs)
            prev = int(g.id[pr])
            t0 = float(start[pr] + np.nan_to_num(dur[pr]))
        for st in steps:
            row, nid = ed.add_node(f"all_to_all ep.{label}", NodeType.COMM_COLL_NODE, start=t0,
                                   dur=comm_time_us("ALL_TO_ALL", int(st.bytes), ep, m.has_device),
                                   is_cpu_op=0 if m.has_device else 1, comm_type=int(st.kind),
                                   comm_bytes=int(st.bytes), comm_group=group, resource=f"comm {group}")
            ed.set_attr(row, "scaler", f"ep.{label}", "string_val")
            if prev >= 0:
                ed.add_edge(row, prev, EdgeKind.DATA)
            nodes.append((pos, row, nid))
            prev = nid
        for c in before:
            ed.add_edge(consumer_row(m, c, devs), prev, EdgeKind.DATA)

    t = g.tensors
    for layer in layers:
        d, s = layer["dispatch"], layer["combine"]
        E = len(layer["experts"])
        kept_sel = [units[0] for units in layer["experts"][: E // ep]]
        nb_d = int(t.nbytes[g.outputs_of(d)].max())
        so = g.outputs_of(s)
        nb_s = int(t.nbytes[so].max()) if len(so) else nb_d
        s_cons = [c for c in flow.succ.get(s, []) if m.phase[c] == FWD]
        a2a(d, kept_sel, nb_d, "dispatch")
        a2a(s, s_cons, nb_s, "combine")
        cb = [u for c in s_cons for u in bwd_of.get(c, [])]
        if cb and bwd_of.get(s):
            a2a(max(cb, key=lambda u: (float(g.start[u]), u)), [min(bwd_of[s], key=lambda u: (float(g.start[u]), u))],
                nb_s, "combine.bwd")
        sb = [u for x in kept_sel for u in bwd_of.get(x, [])]
        if sb and bwd_of.get(d):
            a2a(max(sb, key=lambda u: (float(g.start[u]), u)), [min(bwd_of[d], key=lambda u: (float(g.start[u]), u))],
                nb_d, "dispatch.bwd")
    order = sorted(nodes, key=lambda x: (x[0], x[1]))  # program order of the units they follow
    for (_, _, a), (_, rb, _) in zip(order[:-1], order[1:]):
        ed.add_edge(rb, a, EdgeKind.ORDER)
    out = ed.build()
    keep = ~np.isin(np.arange(len(out)), np.flatnonzero(np.isin(m.unit, list(drop_units))))
    out = out.select(keep)
    # dense gradients over the ep group (expert gradients stay local)
    expert_acc = {int(g.id[u]) for u in kept_b}
    return add_gradient_allreduce(out, group, ep, bucket_mb, first_bucket_mb,
                                  exclude_ids=expert_acc)


def _scale_capacity(ed: Editor, m: StepModel, units: set[int], layers: list[dict], ep: int) -> None:
    """Kept experts' activation tensors: the capacity dimension ``C`` grows ``ep``-fold."""
    g = m.g
    t = ed.tensors
    if not len(t):
        return
    key = storage_keys(g)
    caps = {int(layer["capacity"]) for layer in layers}
    param_shapes = {t.shape(int(x)) for x in np.flatnonzero(np.isin(key, m.param_storage))}
    rows = np.flatnonzero(np.isin(m.unit, list(units)))
    dims = t.dims.copy()
    done: set[int] = set()
    for r in rows.tolist():
        for x in np.concatenate([g.inputs_of(r), g.outputs_of(r)]).tolist():
            if x in done or key[x] in m.param_storage:
                continue
            done.add(x)
            shp = t.shape(x)
            if shp in param_shapes:
                continue
            a = int(t.shape_ptr[x])
            for j, v in enumerate(shp):
                if v in caps:
                    dims[a + j] = v * ep
                    break
    apply_dims(ed, dims)


def expert_parallel(trace: Trace, ep: int, bucket_mb: float = 25.0, first_bucket_mb: float | None = 1.0,
                    check: bool = True) -> Trace:
    """Every rank of ``trace`` as ``ep`` expert-parallel ranks (see the module docstring)."""
    if ep < 1:
        raise ValueError(f"ep must be >= 1, got {ep}")
    if ep == 1:
        return trace
    W, ranks = input_ranks(trace, "expert_parallel")
    templates = {r: _ep_rank(g, ep, axis_group_name("ep", r, W), bucket_mb, first_bucket_mb) for r, g in ranks}
    out = replicate(templates, trace.meta, trace.strings, ep, "ep", W)
    return prove(out, "expert_parallel") if check else out


__all__ = ["expert_parallel", "find_moe_layers"]
