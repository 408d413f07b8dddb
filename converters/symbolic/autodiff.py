"""Backward ops derived from a module's forward ops (reverse-mode, one rule per op kind).

:func:`backward` walks the forward ops in reverse and emits, for each op with a gradient flowing
into it, the op(s) that compute its inputs' gradients:

=================  =============================================================================
forward            backward
=================  =============================================================================
einsum A,B→O       ``matmul.dgrad`` einsum O,B→A for an activation, ``matmul.wgrad`` for a parameter
add                none: each addend's gradient is the output gradient (a broadcast addend's is
                   summed, ``add.bwd``)
mul, gelu, …       one ``<op>.bwd`` elementwise op giving every differentiable input's gradient
layernorm/rmsnorm  ``<norm>.bwd``: input gradient and the weight/bias gradients
attention          ``attention.bwd``: dq, dk, dv in one fused op
embedding          ``embedding.bwd``: the table's gradient (ids have none)
cross_entropy      ``cross_entropy.bwd``: the logits' gradient (the loss seeds the backward pass)
dispatch/combine   the inverse permutation (``dispatch.bwd``/``combine.bwd``)
split/view         none: a view's gradient is a view of its base's
=================  =============================================================================

A tensor used by several ops receives several gradient *contributions*; the distributor turns
them into one gradient with ``add.grad`` ops (after converting each to the tensor's layout).
Gradient tensors are named ``grad:<tensor>`` (contributions ``grad:<tensor>#k``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .ir import Module, Op, TensorDef
from .templates import OP_KINDS

NON_DIFF = ("topk",)


@dataclass
class Backward:
    """The backward pass of a module.

    ``steps`` is the ordered list of ``("op", Op)`` (compute a gradient contribution) and
    ``("accum", tensor)`` (all contributions to ``grad:<tensor>`` are in; sum them) entries.
    ``contribs[t]`` lists the contribution tensor names of ``t``; ``tensors`` defines every
    gradient tensor (letters as the forward tensor's). ``gout`` maps module outputs to their
    incoming gradient names, ``gin`` module inputs to their gradient (``None`` if they get none).
    ``saved`` lists the forward tensors the backward reads.
    """

    steps: list[tuple[str, object]] = field(default_factory=list)
    contribs: dict[str, list[str]] = field(default_factory=dict)
    tensors: dict[str, TensorDef] = field(default_factory=dict)
    grad_of: dict[str, str] = field(default_factory=dict)  # grad tensor -> forward tensor
    gout: dict[str, str] = field(default_factory=dict)
    gin: dict[str, str | None] = field(default_factory=dict)
    saved: list[str] = field(default_factory=list)
    param_grads: dict[str, str] = field(default_factory=dict)  # param -> its final grad tensor


def grad_name(t: str) -> str:
    """Name of the (accumulated) gradient of ``t``."""
    return f"grad:{t}"


def param_like(mod: Module, t: str) -> bool:
    """A parameter or a view of one (a weight, not an activation)."""
    d = mod.tensors[t]
    while d.view_of is not None and d.kind != "param":
        d = mod.tensors[d.view_of]
    return d.kind == "param"


def requires_grad(mod: Module) -> set[str]:
    """Tensors whose gradient is needed: parameters, activation inputs and what depends on them."""
    need = {t.name for t in mod.tensors.values() if t.kind == "param" or (t.kind == "act" and t.name in mod.inputs)}
    for op in mod.ops:
        if op.kind in NON_DIFF:
            continue
        if any(i in need for i in op.inputs):
            need.update(op.outputs)
    return need


def backward(mod: Module) -> Backward:
    """Derive the backward pass of ``mod`` (see the module docstring)."""
    bw = Backward()
    need = requires_grad(mod)
    T = mod.tensors
    pending: dict[str, list[str]] = {}  # tensor -> contribution names so far
    saved: dict[str, None] = {}

    def contribute(t: str) -> str:
        """A new contribution name for grad of t (views forward to their base)."""
        lst = pending.setdefault(t, [])
        name = f"grad:{t}#{len(lst)}"
        lst.append(name)
        bw.tensors[name] = TensorDef(name, T[t].letters, "act")
        bw.grad_of[name] = t
        return name

    def use(t: str) -> str:
        if not param_like(mod, t):
            saved.setdefault(t, None)
        return t

    def finish(t: str) -> str | None:
        """Close t's gradient: an accumulation step if it has contributions."""
        if t not in pending:
            return None
        g = grad_name(t)
        if g not in bw.tensors:
            bw.tensors[g] = TensorDef(g, T[t].letters, "act")
            bw.grad_of[g] = t
            bw.contribs[t] = pending[t]
            bw.steps.append(("accum", t))
        return g

    # gradients entering through the module outputs
    for o in mod.outputs:
        if o in need:
            name = f"gout:{o}"
            bw.tensors[name] = TensorDef(name, T[o].letters, "act")
            bw.grad_of[name] = o
            bw.gout[o] = name
            pending.setdefault(o, []).append(name)

    for op in reversed(mod.ops):
        if op.kind in NON_DIFF or not any(o in need for o in op.outputs):
            continue
        cls = OP_KINDS[op.kind][0]
        is_loss = cls == "loss"
        if op.kind in ("split", "view"):
            # gradient of a view is a contribution to its base, made of the views' gradients
            base = op.inputs[0]
            parts = [finish(o) for o in op.outputs]
            parts = [p for p in parts if p is not None]
            if parts and base in need:
                lst = pending.setdefault(base, [])
                name = f"grad:{base}#{len(lst)}"
                lst.append(name)
                bw.tensors[name] = TensorDef(name, T[base].letters, "act")
                bw.grad_of[name] = base
                bw.steps.append(("join", (name, base, tuple(parts), tuple(op.outputs))))
            continue
        douts = [finish(o) for o in op.outputs]
        if not is_loss and all(d is None for d in douts):
            continue
        diff_in = [i for i in op.inputs if i in need and T[i].kind != "data"]
        if op.kind == "einsum":
            lhs, rhs = op.spec.split("->")
            a_l, b_l = lhs.split(",")
            a, b = op.inputs
            d = douts[0]
            if d is None:
                continue
            for x, x_l, other, other_l in ((a, a_l, b, b_l), (b, b_l, a, a_l)):
                if x not in diff_in:
                    continue
                g = contribute(x)
                kind = "matmul.wgrad" if param_like(mod, x) else "matmul.dgrad"
                # keep the forward operand order so the FLOP count reads the same
                spec = f"{rhs},{other_l}->{x_l}" if x is a else f"{other_l},{rhs}->{x_l}"
                ins = [d, use(other)] if x is a else [use(other), d]
                attrs = {"name": kind, "fwd": op.outputs[0]}
                attrs.update({k: v for k, v in op.attrs.items() if k in ("loop", "nosp")})
                bw.steps.append(("op", Op("einsum", ins, [g], attrs, spec, op.line)))
            continue
        if op.kind == "add":
            d = douts[0]
            out_l = T[op.outputs[0]].letters
            for x in diff_in:
                g = contribute(x)
                if T[x].letters == out_l:
                    bw.steps.append(("alias", (g, d)))
                else:  # broadcast addend: its gradient is the output gradient summed
                    attrs = {"name": "add.bwd", "ew": "1"}
                    attrs.update({k: v for k, v in op.attrs.items() if k in ("loop", "nosp")})
                    bw.steps.append(("op", Op("add.bwd", [d], [g], attrs, line=op.line)))
            continue
        if not diff_in and not is_loss:
            continue
        grads = [contribute(x) for x in diff_in]
        ins = [d for d in douts if d is not None]
        # what each rule reads from the forward pass
        if op.kind == "attention":
            ins += [use(i) for i in op.inputs] + [use(op.outputs[0])]
        elif op.kind in ("embedding",):
            ins += [use(i) for i in op.inputs if not param_like(mod, i)]
        elif op.kind in ("dispatch", "combine"):
            ins += [use(i) for i in op.inputs[1:]]
        elif op.kind in ("softmax",):
            ins += [use(op.outputs[0])]
        else:
            ins += [use(i) for i in op.inputs]
        attrs = dict(op.attrs)
        attrs["name"] = f"{op.name}.bwd"
        attrs["fwd_kind"] = op.kind
        attrs["fwd"] = op.outputs[0]
        bw.steps.append(("op", Op(f"{op.kind}.bwd", ins, grads, attrs, op.spec, op.line)))

    # gradients leaving through the module inputs, and the parameters' gradients
    for i in mod.inputs:
        bw.gin[i] = finish(i)
    for p in mod.params:
        g = finish(p)
        if g is not None:
            bw.param_grads[p] = g
    bw.saved = list(saved)
    return bw
