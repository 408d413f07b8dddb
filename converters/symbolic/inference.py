"""Inference graphs: a training template turned into its prefill or decode forward pass.

:func:`inference_model` rewrites every module of a :class:`~.ir.Model` (a copy; the training model
is untouched) so that the synthesizer builds one forward step of a serving engine:

* the *query* sequence letter ``s`` is the tokens each sequence processes this step (``S``: the
  prompt, or a prompt chunk, in prefill; 1 — or the draft tokens + 1 under speculative decoding —
  in decode) and the *key* letter ``t`` is the context the step attends over (``T``: the cache so
  far plus the new tokens);
* the **KV cache** is a tensor: the tensors a module caches (its ``cache`` statement, default the
  key and value inputs of each attention op) go through one ``kv_cache`` op that appends the new
  tokens (reads and writes their bytes) and yields cache tensors over ``t``; everything computed
  from the cache up to the attention runs over the whole context. For grouped-query attention the
  cache is ``T × KV × HD`` keys and values per layer; for multi-head latent attention
  (``cache latn kpe``) it is the compressed latent plus the RoPE key; in prefill the up-projection
  of the cached latent runs over the context (the non-absorbed form), in decode, when the
  ``cache`` statement names the heads (``cache latn kpe heads=NH``), the absorbed form (see
  :func:`_absorb`): the attention reads the latent cache once, for every head;
* the attention op reads the whole cache, so its bytes carry the KV reads and the roofline sees
  decode as memory-bound; a causal attention over a prefix costs ``4·s·(t − s/2)·d`` FLOPs per head
  (``s`` new queries, ``t`` keys), which is the training formula when ``t = s``;
* the loss goes (no labels, no backward, no optimizer); the LM head projects only the tokens that
  produce a next token (``SH``: one per sequence in prefill, ``S`` in decode);
* state-space blocks (no attention) keep their recurrent state out of the cache accounting.

The synthesizer then builds forward programs only (:func:`.distribute.build_programs` with
``plan.phase``), micro-batches flow through the pipeline stages forward only, and each stage
reports the bytes of its KV cache (``kv_cache_bytes``) next to its weights.
"""

from __future__ import annotations

import copy

from .expr import Expr, parse
from .ir import KVSEQ, SEQ, Model, Module, Op, TensorDef

PHASES = ("train", "prefill", "decode")


def inference_model(model: Model, phase: str = "prefill") -> Model:
    """A copy of ``model`` whose modules compute one inference forward step (see the module doc)."""
    mods = {name: infer_module(mod, phase) for name, mod in model.modules.items()}
    return Model(model.name, list(model.uses), mods, dict(model.defaults), model.source)


def _options(mod: Module) -> dict[str, str]:
    """``key=value`` items of the module's ``cache`` statement (removed from the cached names)."""
    opts = dict(c.split("=", 1) for c in mod.cache if "=" in c)
    mod.cache = [c for c in mod.cache if "=" not in c]
    return opts


def _absorb(mod: Module, heads: Expr) -> None:
    """MLA's absorbed decode (DeepSeek-V2 §2.1.2; FlashMLA): the up-projection ``W`` of the cached
    latent (``kvb = latent·W``, split into no-RoPE keys and values, keys joined with the RoPE key)
    is folded into the query (``q_nope·W_UK`` per head) and the output (``·W_UV`` per head), so the
    attention runs over the cache itself: one shared key of latent + RoPE dims read once as keys
    and (its latent part) as values, queries and outputs per head of those widths."""
    prod = mod.producer()
    cache = set(mod.cache)
    ein = next((op for op in mod.ops if op.kind == "einsum" and op.inputs[0] in cache
                and mod.tensors[op.inputs[1]].kind == "param"), None)
    if ein is None:
        raise ValueError(f"module {mod.name}: heads= needs a cached latent up-projected by a parameter")
    lat, w = ein.inputs
    spl = next(op for op in mod.ops if op.kind == "split" and op.inputs[0] == ein.outputs[0])
    kn, vv = spl.outputs
    rope = next(op for op in mod.ops if op.kind == "rope" and op.inputs[0] == kn)
    kp = rope.inputs[1]
    att = next(op for op in mod.ops if op.kind == "attention" and op.inputs[1] == rope.outputs[0])
    q, out = att.inputs[0], att.outputs[0]
    T = mod.tensors
    m, r = T[lat].letters[-1], T[kp].letters[-1]
    n, o = T[kn].letters[-1], T[vv].letters[-1]
    used = {c for t in T.values() for c in t.letters} | set(mod.sizes) | {"b", "s", "t", "e", "c", "v"}
    g, d, u, z = [c for c in "abcdefghijklmnopqrstuvwxyz" if c not in used][:4]
    mod.sizes.update({g: heads, d: mod.sizes[n] / heads, u: mod.sizes[o] / heads, z: mod.sizes[m] + mod.sizes[r]})
    bs = T[q].letters[:2]
    for name, letters, view in (("kvc", bs + z, None), ("q_nope", bs + g + d, q), ("q_pe", bs + g + r, q),
                                ("w_uk", m + g + d, w), ("w_uv", m + g + u, w), ("q_lat", bs + g + m, None),
                                ("q_abs", bs + g + z, None), ("o_lat", bs + g + m, None), ("o_head", bs + g + u, None)):
        T[name] = TensorDef(name, letters, view_of=view)
    for t in (ein.outputs[0], kn, vv, rope.outputs[0]):
        del T[t]
    zero = {"flops": "0"}
    cat = Op("rope", [lat, kp], ["kvc"], {"name": "cache_cat", **zero})  # the cache entry: latent ‖ RoPE key
    new = [Op("split", [q], ["q_nope", "q_pe"]), Op("split", [w], ["w_uk", "w_uv"]),
           Op("einsum", ["q_nope", "w_uk"], ["q_lat"], {"name": "absorb_uk"}, f"{bs + g + d},{m + g + d}->{bs + g + m}"),
           Op("rope", ["q_lat", "q_pe"], ["q_abs"], {"name": "q_cat", **zero}),
           Op("attention", ["q_abs", "kvc", "kvc"], ["o_lat"], dict(att.attrs)),
           Op("einsum", ["o_lat", "w_uv"], ["o_head"], {"name": "absorb_uv"}, f"{bs + g + m},{m + g + u}->{bs + g + u}"),
           Op("view", ["o_head"], [out])]
    after = max(prod[lat], prod[kp])
    ops: list[Op] = []
    for i, op in enumerate(mod.ops):
        if op is att:
            ops += new
        elif op not in (ein, spl, rope):
            ops.append(op)
        if i == after:
            ops.append(cat)
    mod.ops = ops
    mod.cache = ["kvc"]


def _swap(letters: str, a: str, b: str) -> str:
    return letters.replace(a, b)


def infer_module(mod: Module, phase: str = "prefill") -> Module:
    """One module's inference form (see the module docstring)."""
    mod = copy.deepcopy(mod)
    opts = _options(mod)
    if phase == "decode" and "heads" in opts:
        _absorb(mod, parse(opts["heads"]))
    is_head = any(op.kind == "cross_entropy" for op in mod.ops)
    # the loss and what only it reads (labels) go
    dropped = {o for op in mod.ops if op.kind == "cross_entropy" for o in op.outputs}
    mod.ops = [op for op in mod.ops if op.kind != "cross_entropy"]
    used = {i for op in mod.ops for i in op.inputs} | set(mod.outputs)
    for name in list(mod.tensors):
        t = mod.tensors[name]
        if name in dropped or (t.kind == "data" and name not in used):
            del mod.tensors[name]
    attn = [op for op in mod.ops if op.kind == "attention"]
    if is_head:
        mod.sizes[SEQ] = Expr.sym("SH")
    if KVSEQ in mod.sizes:
        mod.sizes[KVSEQ] = Expr.sym("T")
    if not attn:
        return mod
    cache = list(mod.cache)
    if not cache:
        for op in attn:
            cache += [i for i in op.inputs[1:] if i not in cache]
    for c in cache:
        if c not in mod.tensors:
            raise ValueError(f"module {mod.name}: cached tensor {c!r} is not defined")
    # tensors computed from the cache, up to (not through) the attention ops
    down = set(cache)
    for op in mod.ops:
        if op.kind != "attention" and any(i in down for i in op.inputs):
            down.update(op.outputs)
    producer = mod.producer()
    after = max((producer.get(c, -1) for c in cache), default=-1)
    for op in mod.ops[: after + 1]:
        if any(x in cache for x in op.inputs):
            raise ValueError(f"module {mod.name}: {op.name} (line {op.line}) reads a cached tensor before "
                             f"every cached tensor is produced")
    # letters: before the cache, keys are new tokens (t -> s); from the cache on, the context (s -> t)
    for name, t in mod.tensors.items():
        if name in down and name not in cache:
            t.letters = _swap(t.letters, SEQ, KVSEQ)
        elif t.kind != "param":
            t.letters = _swap(t.letters, KVSEQ, SEQ)
    cname = {c: f"{c}.cache" for c in cache}
    for c in cache:
        mod.tensors[cname[c]] = TensorDef(cname[c], _swap(mod.tensors[c].letters, SEQ, KVSEQ))
    new_ops: list[Op] = []
    if after < 0:
        new_ops.append(_cache_op(cache, cname))
    for i, op in enumerate(mod.ops):
        if i > after:
            op.inputs = [cname.get(x, x) for x in op.inputs]
        if op.kind == "einsum":
            outs = mod.tensors[op.outputs[0]].letters
            op.spec = ",".join(mod.tensors[x].letters for x in op.inputs) + "->" + outs
        if op.kind == "attention" and "causal" in op.attrs:
            del op.attrs["causal"]
            op.attrs["causal_prefix"] = "1"
        new_ops.append(op)
        if i == after:
            new_ops.append(_cache_op(cache, cname))
    mod.ops = new_ops
    return mod


def _cache_op(cache: list[str], cname: dict[str, str]) -> Op:
    return Op("kv_cache", list(cache), [cname[c] for c in cache], {"name": "kv_cache"})


__all__ = ["PHASES", "infer_module", "inference_model"]
