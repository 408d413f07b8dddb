"""Distribution: a module's ops on one rank of a parallel plan, as a small symbolic program.

A :class:`~.plan.Plan` fixes the mesh (``tp``, ``cp``, ``dp`` = ``ep`` × ``edp``, ``pp``), sequence
parallelism, ZeRO/FSDP, gradient synchronisation, dtypes. :func:`build_programs` turns each module
of a model into :class:`~.program.Program` s — the forward pass, the backward pass (optionally with
the forward recomputed first) and the gradient-synchronisation/optimizer step — whose nodes are
compute ops with local FLOPs and bytes, and collectives with their group (a set of mesh axes)
and bytes. Sizes stay :class:`~.expr.Expr` until :mod:`.instantiate` substitutes numbers.

This module assembles those programs from the passes :class:`~.sharding._Builder` emits (how each
op is split is described in :mod:`.sharding`): the backward's gradient accumulation, the ports
between programs, recomputation, tied weights, ZeRO gathers, the gradient buckets and their
synchronisation, the optimizer step and the resident bytes.
"""

from __future__ import annotations

from dataclasses import fields

from ettools.graph import CollectiveType, NodeType
from ettools.redistribute import Layout, redistribute

from .autodiff import Backward, backward, param_like
from .expr import ZERO, Expr, product
from .ir import Model, Module

# DTYPE_BYTES, EW_FLOPS and the types below stay importable here (synth, replay.search read them)
from .plan import AXES, DTYPE_BYTES, Plan  # noqa: F401
from .program import (
    _COLL_NAME,
    Handle,
    ModulePrograms,
    PNode,
    Program,
    _norm,
    _norm_axes,
    _sym,
    shard_expr,
)
from .sharding import EW_FLOPS, _Builder  # noqa: F401


def _fsdp_gather(b: _Builder, buckets: list[tuple[tuple[str, ...], list[str]]], shard_of) -> None:
    """ZeRO-3: all-gather each bucket's parameters at the start of a pass."""
    for axes, params in buckets:
        shard = shard_of(axes)
        if not shard:
            continue
        total = ZERO
        for p in params:
            total = total + b.numel(p) * b.plan.param_bytes / shard_expr(b.param_layout(p))
        local = total / product(_sym(a) for a in shard)
        row = b.prog.add(PNode(NodeType.COMM_COLL_NODE, f"all_gather {b.mod.name}.params", ZERO, local,
                               int(CollectiveType.ALL_GATHER), shard))
        for p in params:
            b.param_rows[p] = (row,)


def _params_into(b: _Builder) -> None:
    for p in b.mod.params:
        b.H[p] = Handle(b.param_rows.get(p, ()), (), b.param_layout(p))
    for op in b.mod.ops:  # views of weights are free and available to both passes
        if op.kind in ("view", "split") and param_like(b.mod, op.inputs[0]):
            b.emit(op)
    for t in b.mod.tensors.values():
        if t.kind == "data":
            b.H[t.name] = Handle((), (), b.canonical(t.letters, data=True))


def _emit_forward(b: _Builder) -> None:
    for i, x in enumerate(b.mod.inputs):
        b.H[x] = Handle((), (f"in:{i}",), b.canonical(b.letters(x)))
    for op in b.mod.ops:
        b.emit(op)


def build_module(model: Model, mod: Module, plan: Plan) -> ModulePrograms:
    """Forward, backward and synchronisation programs of ``mod`` under ``plan``."""
    bw = backward(mod)

    # backward first (without FSDP gathers) only to learn the parameter-gradient layouts
    probe = _Builder(model, mod, plan, bw, "probe")
    _params_into(probe)
    _emit_forward(probe)
    fwd_layouts = {t: h.layout for t, h in probe.H.items()}
    _emit_backward(probe, fwd_layouts)
    pgrad_partial = {p: _norm_axes(probe.H[g].layout.partial) for p, g in bw.param_grads.items()}
    buckets_d: dict[tuple[str, ...], list[str]] = {}
    for p, axes in pgrad_partial.items():
        buckets_d.setdefault(tuple(a for a in axes if a != "tp"), []).append(p)
    buckets = sorted(buckets_d.items(), key=lambda kv: [AXES.index(a) for a in kv[0]])
    tied_user, tied_owner = _ties_of(model, mod, plan)
    if tied_user and plan.pp == 1:
        # one weight on this stage: the owner module stores, reduces and updates it
        buckets = [(ax, [p for p in ps if p not in tied_user]) for ax, ps in buckets]
        buckets = [(ax, ps) for ax, ps in buckets if ps]
    sharded = plan.zero >= 1 and (plan.zero < 3 or plan.fsdp(mod.name))

    def shard_of(axes: tuple[str, ...]) -> tuple[str, ...]:
        return axes if sharded else ()

    # forward
    fb = _Builder(model, mod, plan, bw, f"{mod.name}.fwd")
    if fb.is_fsdp:
        _fsdp_gather(fb, buckets, shard_of)
    _params_into(fb)
    _emit_forward(fb)
    for i, o in enumerate(mod.outputs):
        h = fb.convert(o, fb.handle(o), fb.canonical(fb.letters(o)))
        fb.prog.exports[f"out:{i}"] = (h.rows, h.imports)
    saved_total = ZERO
    seen_rows: set[tuple[int, ...]] = set()
    for t in bw.saved:
        h = fb.H[t]
        fb.prog.exports[f"t:{t}"] = (h.rows, h.imports)
        if not fb.is_data(t) and h.rows and h.rows not in seen_rows:
            seen_rows.add(h.rows)
            saved_total = saved_total + fb.local_bytes(t, h.layout)
    reuse: dict[tuple[str, Layout], str] = {}
    saved_set = set(bw.saved)
    for (t, lo), h in list(fb.cache.items()):
        if t in saved_set and h.rows:
            port = f"tc:{len(reuse)}"
            reuse[(t, lo)] = port
            fb.prog.exports[port] = (h.rows, h.imports)
    core = core_attention_ops(mod) if plan.recompute == "selective" else []
    internal = {t for i in core for t in mod.ops[i].outputs if _is_score(mod, t)}
    if internal:  # selective: the s x s score tensors are not kept; the backward recomputes them
        saved_total = ZERO
        seen_rows.clear()
        for t in bw.saved:
            h = fb.H[t]
            if t not in internal and not fb.is_data(t) and h.rows and h.rows not in seen_rows:
                seen_rows.add(h.rows)
                saved_total = saved_total + fb.local_bytes(t, h.layout)
        reuse = {k: v for k, v in reuse.items() if k[0] not in internal}
    # a core input the backward itself does not read is kept for the recomputation
    core_inputs = list(dict.fromkeys(x for i in core for x in mod.ops[i].inputs
                                     if x not in saved_set and x not in internal))
    for x in core_inputs:
        h = fb.H[x]
        fb.prog.exports[f"t:{x}"] = (h.rows, h.imports)
        if not fb.is_data(x) and h.rows and h.rows not in seen_rows:
            seen_rows.add(h.rows)
            saved_total = saved_total + fb.local_bytes(x, h.layout)
    if plan.recompute == "full":  # only the module inputs are kept; the rest is recomputed in the backward
        saved_total = ZERO
        for x in mod.inputs:
            saved_total = saved_total + fb.local_bytes(x, fb.canonical(fb.letters(x)))
    fb.prog.saved_bytes = saved_total
    fb.prog.model_flops = _model_flops(fb.prog)
    fwd_layouts = {t: h.layout for t, h in fb.H.items()}

    # backward
    bb = _Builder(model, mod, plan, bw, f"{mod.name}.bwd")
    if bb.is_fsdp:
        _fsdp_gather(bb, buckets, shard_of)
    _params_into(bb)
    if plan.recompute == "full":
        _emit_forward(bb)
        bb.cache.clear()  # the backward gathers again what the recomputation gathered
    else:
        bb.reuse = reuse
        for t in (*bw.saved, *core_inputs):
            if t in internal:
                continue
            lo = fwd_layouts[t]
            bb.H[t] = Handle((), () if bb.is_data(t) else (f"t:{t}",), lo)
        for i in core:  # selective: the core attention again, from its kept inputs
            bb.emit(mod.ops[i])
    _emit_backward(bb, fwd_layouts)
    for i, x in enumerate(mod.inputs):
        g = bw.gin.get(x)
        if g is not None:
            h = bb.H[g]
            bb.prog.exports[f"gin:{i}"] = (h.rows, h.imports)
    for p, g in bw.param_grads.items():
        h = bb.H[g]
        bb.prog.exports[f"pgrad:{p}"] = (h.rows, h.imports)
    pgrad_layout = {p: bb.H[g].layout for p, g in bw.param_grads.items()}

    # the tied weight's gradient is the sum of both uses: on one stage the owner's reduction also
    # waits for the user module's contribution; across stages (first and last pipeline stage keep
    # a copy each) the copies' gradients are all-reduced over the embedding group after the
    # data-parallel reduction, as Megatron-LM does. Under DualPipe the first and last ranks each
    # hold the embedding of one model copy and the head of the other, and the mirror reduction
    # (:mod:`.dualpipe`) already sums both copies over exactly those two ranks: the tied sum is
    # then a local add of two gradients each rank has, no collective of its own (not modelled)
    extra = {p: (f"tgrad:{um}:{up}",) for p, (um, up) in tied_owner.items()} if plan.pp == 1 else {}
    emb = set(tied_owner) | set(tied_user) if plan.pp > 1 and plan.schedule != "dualpipe" else set()
    sync = _sync_program(fb, mod, plan, buckets, shard_of, pgrad_layout, last=False, extra_imports=extra)
    fp8_weights = {p for op in mod.ops if fb.is_fp8_gemm(op) for p in op.inputs if fb.is_weight(p)}
    step = _sync_program(fb, mod, plan, buckets, shard_of, pgrad_layout, last=True, extra_imports=extra,
                         emb_params=emb, fp8_weights=fp8_weights)
    step.param_bytes = _resident_bytes(fb, mod, plan, buckets, shard_of, pgrad_layout)
    out_bytes = [fb.local_bytes(o, fb.canonical(fb.letters(o))) for o in mod.outputs]
    return ModulePrograms(mod.name, fb.prog, bb.prog, sync, step, len(mod.inputs), len(mod.outputs), buckets,
                          out_bytes)


def _is_score(mod: Module, t: str) -> bool:
    """A tensor spanning the sequence twice (query × key positions: attention scores, their
    softmax and dropout) -- what selective recomputation drops (Korthikanti et al., 2022)."""
    s = mod.sizes.get("s")
    letters = mod.tensors[t].letters if t in mod.tensors else ""
    return s is not None and sum(1 for c in set(letters) if mod.sizes.get(c) == s) >= 2


def core_attention_ops(mod: Module) -> list[int]:
    """Indices of the ops Megatron's ``--recompute-granularity selective`` recomputes: a fused
    ``attention`` op, or the ops producing or reading the score tensors of an unfused one."""
    out = []
    for i, op in enumerate(mod.ops):
        if op.kind == "attention" or any(_is_score(mod, t) for t in (*op.inputs, *op.outputs)):
            out.append(i)
    return out


def _model_flops(prog: Program) -> Expr:
    """Forward FLOPs of a program under the model-FLOPs convention (sum of its nodes' ``mflops``)."""
    total = ZERO
    for nd in prog.nodes:
        total = total + nd.mflops
    return total


def _ties_of(model: Model, mod: Module, plan: Plan) -> tuple[dict[str, tuple[str, str]], dict[str, tuple[str, str]]]:
    """``(user, owner)``: this module's parameters tied to another module's (``{param: (other
    module, other param)}``), as the using side (the LM head) and as the owning side (the
    embedding). Empty when the plan unties them."""
    user: dict[str, tuple[str, str]] = {}
    owner: dict[str, tuple[str, str]] = {}
    if plan.tie:
        for um, up, om, op_ in model.ties:
            if um == mod.name:
                user[up] = (om, op_)
            if om == mod.name:
                owner[op_] = (um, up)
    return user, owner


def _emit_backward(b: _Builder, fwd_layouts: dict[str, Layout]) -> None:
    bw = b.bw
    mod = b.mod
    for i, o in enumerate(mod.outputs):
        g = bw.gout.get(o)
        if g is not None:
            b.H[g] = Handle((), (f"gout:{i}",), b.canonical(b.letters(o)))
    for kind, item in bw.steps:
        if kind == "op":
            b.emit(item)
        elif kind == "alias":
            g, d = item
            b.H[g] = b.handle(d)
        elif kind == "join":
            name, base, parts, views = item
            rows: list[int] = []
            imports: list[str] = []
            partial: tuple[str, ...] = ()
            for pt in parts:
                h = b.handle(pt)
                rows += h.rows
                imports += h.imports
                partial = partial or h.layout.partial
            if param_like(mod, base):
                lo = Layout(b.param_layout(base).dims, partial)
            else:
                lo = fwd_layouts[base].without_partial()
            b.H[name] = Handle(tuple(dict.fromkeys(rows)), tuple(dict.fromkeys(imports)), _norm(lo))
        elif kind == "accum":
            t = item
            contribs = bw.contribs[t]
            g = f"grad:{t}"
            if param_like(mod, t):
                hs = [b.handle(c) for c in contribs]
                target = hs[0].layout
                hs = [h if _norm(h.layout) == _norm(target) else Handle(h.rows, h.imports, target) for h in hs]
            else:
                fl = fwd_layouts[t]
                keepable = set(b.plan.batch_axes) | ({"cp"} & set(b.plan.axes))
                keepable -= fl.axes()
                parts = [set(b.handle(c).layout.partial) & keepable for c in contribs]
                keep = _norm_axes(set.intersection(*parts)) if parts else ()
                target = Layout(fl.dims, keep)
                raw = [b.handle(c) for c in contribs]
                if len({_norm(h.layout) for h in raw}) == 1 and len(raw) > 1 and _norm(raw[0].layout) != _norm(target):
                    # contributions alike (a parallel block's two branches, both partial over tp):
                    # summed where they are, then reduced once, as Megatron/Mesh-TF do
                    b.H[g] = b.convert(g, _sum_grads(b, t, raw, raw[0].layout), target)
                    continue
                hs = [b.convert(c, b.handle(c), target) for c in contribs]
            acc = _sum_grads(b, t, hs, target)
            b.H[g] = Handle(acc.rows, acc.imports, _norm(target))


def _sum_grads(b: _Builder, t: str, hs: list[Handle], layout: Layout) -> Handle:
    """The gradient contributions ``hs`` of tensor ``t`` (all in ``layout``) added up, one add node
    per extra contribution."""
    g = f"grad:{t}"
    acc = hs[0]
    for h in hs[1:]:
        row = b.prog.add(PNode(NodeType.COMP_NODE, f"add.grad {b.mod.name}.{t}",
                               b.numel(g) / shard_expr(layout), 3 * b.local_bytes(g, layout), -1, (),
                               tuple(dict.fromkeys(acc.rows + h.rows)),
                               tuple(dict.fromkeys(acc.imports + h.imports))))
        acc = Handle((row,), (), layout)
    return acc


def _sync_program(fb: _Builder, mod: Module, plan: Plan, buckets, shard_of, pgrad_layout, last: bool,
                  extra_imports: dict[str, tuple[str, ...]] | None = None,
                  emb_params: set[str] | None = None, fp8_weights: set[str] | None = None) -> Program:
    """Gradient reduction per bucket; on the last micro-batch also the optimizer and ZeRO-1/2 gathers.

    A bucket holds the parameters whose gradients are partial over the same data-parallel axes;
    those also partial over ``tp`` (norm weights under sequence parallelism, replicated
    embeddings) are first all-reduced over the TP group, as Megatron-LM does. ``extra_imports``:
    more gradient sources of a parameter (a tied weight's other use); ``emb_params``: tied
    parameters whose copies are all-reduced over the embedding group (axis ``emb``: the first and
    last pipeline stage) after the data-parallel reduction, on the last micro-batch.
    """
    prog = Program(f"{mod.name}.{'step' if last else 'sync'}")
    sync_now = last or plan.grad_sync == "microbatch"
    for _axes, params in buckets:
        for p in params:
            prog.grad_bytes = prog.grad_bytes + \
                fb.numel(p) / shard_expr(pgrad_layout[p].without_partial()) * plan.grad_bytes
    for axes, params in buckets:
        numel = ZERO
        tp_numel = ZERO
        for p in params:
            n = fb.numel(p) / shard_expr(pgrad_layout[p].without_partial())
            numel = numel + n
            if "tp" in pgrad_layout[p].partial:
                tp_numel = tp_numel + n
        shard = shard_of(axes)
        shard_e = product(_sym(a) for a in shard)
        rows: tuple[int, ...] = ()
        imports = tuple(f"pgrad:{p}" for p in params) + \
            tuple(x for p in params for x in (extra_imports or {}).get(p, ()))
        if sync_now:
            if tp_numel != ZERO:
                r = prog.add(PNode(NodeType.COMM_COLL_NODE, f"all_reduce {mod.name}.grads", ZERO,
                                   tp_numel * plan.grad_bytes, int(CollectiveType.ALL_REDUCE), ("tp",), (),
                                   tuple(f"pgrad:{p}" for p in params if "tp" in pgrad_layout[p].partial)))
                rows = (r,)
            src = Layout(((),), axes)
            dst = Layout((shard,))
            for st in redistribute(src, dst, numel * plan.grad_bytes, _sym, AXES):
                r = prog.add(PNode(NodeType.COMM_COLL_NODE, f"{_COLL_NAME[st.kind]} {mod.name}.grads", ZERO,
                                   st.bytes, int(st.kind), _norm_axes(st.axes), rows, imports))
                rows = (r,)
        tied = [p for p in params if p in (emb_params or ())]
        if last and tied:
            nb = ZERO
            for p in tied:
                nb = nb + fb.numel(p) / shard_expr(pgrad_layout[p].without_partial()) * plan.grad_bytes
            r = prog.add(PNode(NodeType.COMM_COLL_NODE, f"all_reduce {mod.name}.embedding_grads", ZERO, nb,
                               int(CollectiveType.ALL_REDUCE), ("emb",), rows, () if rows else imports))
            rows = (r,)
        if last and plan.optimizer:
            local = numel / shard_e
            r = prog.add(PNode(NodeType.COMP_NODE, f"{plan.optimizer} {mod.name}.params", 12 * local,
                               (2 * plan.param_bytes + plan.grad_bytes + 12) * local, -1, (), rows,
                               () if rows else imports))
            rows = (r,)
        fp8_w = ZERO
        for p in params if last else ():
            if p in (fp8_weights or ()):
                fp8_w = fp8_w + fb.numel(p) / shard_expr(pgrad_layout[p].without_partial())
        if fp8_w != ZERO:  # the updated weights cast to FP8 (and transposed) once per step
            r = prog.add(PNode(NodeType.COMP_NODE, f"fp8_cast {mod.name}.weights", fp8_w,
                               (plan.param_bytes + 2) * fp8_w, -1, (), rows, () if rows else imports))
            rows = (r,)
            if shard and plan.zero in (1, 2):
                prog.add(PNode(NodeType.COMM_COLL_NODE, f"all_gather {mod.name}.params", ZERO,
                               local * plan.param_bytes, int(CollectiveType.ALL_GATHER), shard, rows))
    return prog


def _resident_bytes(fb: _Builder, mod: Module, plan: Plan, buckets, shard_of, pgrad_layout) -> Expr:
    """Weights (sharded under ZeRO-3), gradients (sharded from ZeRO-2), fp32 master weights and two
    Adam moments (sharded from ZeRO-1) of one module instance on one rank."""
    total = ZERO
    for axes, params in buckets:
        numel = ZERO
        for p in params:
            numel = numel + fb.numel(p) / shard_expr(pgrad_layout[p].without_partial())
        shard_e = product(_sym(a) for a in shard_of(axes))
        w = numel * plan.param_bytes / (shard_e if plan.zero == 3 else 1)
        gr = numel * plan.grad_bytes / (shard_e if plan.zero >= 2 else 1)
        opt = numel * 12 / (shard_e if plan.zero >= 1 else 1) if plan.optimizer else ZERO
        total = total + w + gr + opt
    return total


def build_inference_module(model: Model, mod: Module, plan: Plan) -> ModulePrograms:
    """The forward program of ``mod`` for an inference step (``plan.phase`` prefill or decode):
    no backward, no gradient synchronisation; the resident bytes are the local weights and the
    forward program's ``cache_bytes`` the local KV cache of the micro-batch (see :mod:`.inference`)."""
    fb = _Builder(model, mod, plan, Backward(), f"{mod.name}.fwd")
    _params_into(fb)
    _emit_forward(fb)
    for i, o in enumerate(mod.outputs):
        h = fb.convert(o, fb.handle(o), fb.canonical(fb.letters(o)))
        fb.prog.exports[f"out:{i}"] = (h.rows, h.imports)
    cache = ZERO
    for op in mod.ops:
        if op.kind == "kv_cache":
            for o in op.outputs:
                cache = cache + fb.local_bytes(o, fb.H[o].layout.without_partial())
    fb.prog.cache_bytes = cache
    fb.prog.model_flops = _model_flops(fb.prog)
    step = Program(f"{mod.name}.step")
    weights = ZERO
    tied_user = _ties_of(model, mod, plan)[0] if plan.pp == 1 else {}
    for p in mod.params:
        if p in tied_user:  # stored once, by the owner module
            continue
        weights = weights + fb.local_bytes(p, fb.param_layout(p))
    step.param_bytes = weights
    out_bytes = [fb.local_bytes(o, fb.canonical(fb.letters(o))) for o in mod.outputs]
    return ModulePrograms(mod.name, fb.prog, Program(f"{mod.name}.bwd"), Program(f"{mod.name}.sync"), step,
                          len(mod.inputs), len(mod.outputs), [], out_bytes)


def build_programs(model: Model, plan: Plan, cache: dict | None = None) -> dict[str, ModulePrograms]:
    """:func:`build_module` (or :func:`build_inference_module`) for every module the model uses.

    ``cache``: a dict shared by calls (one process's, e.g. a search worker's) that returns the
    programs of an earlier call whose model and plan agree on everything the build reads
    (:func:`programs_key`); programs are never modified once built, so callers share them."""
    key = None
    if cache is not None:
        # a model from a file or template is named by it; one built in memory only by itself
        key = (model.name, model.source, None if model.source else id(model), programs_key(plan))
        hit = cache.get(key)
        if hit is not None:
            return hit[1]
    build = build_module if plan.phase == "train" else build_inference_module
    out: dict[str, ModulePrograms] = {}
    for use in model.uses:
        if use.module not in out:
            out[use.module] = build(model, model.module(use.module), plan)
    if key is not None:
        if len(cache) >= PROGRAMS_CACHE_SIZE:
            cache.pop(next(iter(cache)))  # the oldest
        cache[key] = (model, out)  # the model kept alive: its id names it while the entry lives
    return out


PROGRAMS_CACHE_SIZE = 64  # program sets a cache of build_programs keeps (a few modules each)
# Plan fields the programs never read: degrees stay symbols (``tp``, ``edp``, …) and the build reads
# only which axes have more than one rank (``axes``, ``batch_axes``) and whether pp is 1; the
# schedule only as "dualpipe or not"; micro-batches, chunks, buckets, pipeline scatter/gather and
# where gradient collectives go are the stage's (:mod:`.stage`), not a module's
_UNREAD = frozenset({"tp", "cp", "dp", "ep", "pp", "schedule", "vpp", "micro_batches", "bucket_mb",
                     "pp_scatter_gather", "dp_after_backward", "grad_accumulation"})


def programs_key(plan: Plan) -> tuple:
    """What :func:`build_programs` reads of ``plan``: two plans with one key get the same programs.
    Every field but those listed in ``_UNREAD`` (so a field added to :class:`~.plan.Plan` is keyed
    until shown unread), plus the axes with more than one rank, ``pp == 1`` and ``dualpipe``."""
    rest = tuple((f.name, _hashable(getattr(plan, f.name))) for f in fields(plan) if f.name not in _UNREAD)
    return (plan.axes, plan.pp == 1, plan.schedule == "dualpipe") + rest


def _hashable(v):
    if isinstance(v, (set, frozenset)):
        return tuple(sorted(v))
    return tuple(v) if isinstance(v, list) else v
