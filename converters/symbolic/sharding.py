"""How each op of a module is split over the mesh: :class:`_Builder` emits one pass of one module
under a plan, op by op — the op's sharding, the collectives converting each input to the layout
the op needs, and the op's local FLOPs, bytes and shape.

The rule (a GSPMD-like one with Megatron-LM's choices):

1. a parameter fixes its letters' axes: ``@col`` splits its last dimension over ``tp``, ``@row``
   its first, ``@vocab`` the ``v`` letter; letter ``e`` is split over ``ep``. The same holds for
   the parameter's gradient when an op produces it;
2. other letters take the split their activation inputs already have (``f/tp`` after a column
   projection, heads in attention), if the axis is still free;
3. ``b`` takes the data-parallel axes, ``s`` takes ``cp`` and, under sequence parallelism,
   ``tp`` when no letter of the op took it (norms, residual adds, dropout run on ``S/tp``);
   ``c`` (expert-buffer tokens) takes what is left of those; ``t`` (key sequence) stays whole.

Each input is converted from the layout its producer left it in to the layout the op needs with
:func:`ettools.redistribute.redistribute`; an output gets the op's split of its letters and is
a partial sum over the axes of contracted letters. Gradient contributions are converted to the
layout of the forward tensor before they are summed; parameter gradients stay partial until the
synchronisation step reduces them per module and per group of axes (one bucket each). A
conversion is reused within a pass, not across passes: like Megatron-LM, the backward pass
gathers a sequence-parallel activation again rather than keeping the gathered copy.
"""

from __future__ import annotations

from fractions import Fraction

from ettools.graph import CollectiveType, NodeType
from ettools.redistribute import Layout, redistribute

from .autodiff import Backward, param_like
from .expr import ONE, ZERO, Expr, parse, product
from .ir import BATCH, EXPERT, KVSEQ, SEQ, TOKENS, Model, Module, Op
from .plan import AXES, Plan
from .program import _COLL_NAME, Handle, PNode, Program, _norm, _norm_axes, _sym, shard_expr
from .templates import OP_KINDS

_SPECIAL = (BATCH, SEQ, TOKENS, KVSEQ)

# FLOPs per output element of elementwise ops (forward); backward ops cost twice that.
EW_FLOPS = {"add": 1, "mul": 1, "scale": 1, "gelu": 8, "silu": 4, "relu": 1, "swiglu": 5, "geglu": 9,
            "softmax": 5, "dropout": 2, "rope": 3, "layernorm": 5, "rmsnorm": 4, "conv1d": 8, "topk": 1,
            "cross_entropy": 5, "add.bwd": 1}


class _Builder:
    """Emits one program of one module under a plan."""

    def __init__(self, model: Model, mod: Module, plan: Plan, bw: Backward, key: str,
                 fwd_layouts: dict[str, Layout] | None = None) -> None:
        self.model = model
        self.mod = mod
        self.plan = plan
        self.bw = bw
        self.prog = Program(key)
        self.H: dict[str, Handle] = {}
        self.cache: dict[tuple[str, Layout], Handle] = {}
        self.fwd_layouts = fwd_layouts or {}
        self.T = dict(mod.tensors)
        self.T.update(bw.tensors)
        self.param_rows: dict[str, tuple[int, ...]] = {}
        self.is_fsdp = plan.fsdp(mod.name)
        self._producer = mod.producer()
        self.reuse: dict[tuple[str, Layout], str] = {}  # conversions the forward pass exports
        self._regather = True

    # ---- tensors ----------------------------------------------------------------------------
    def letters(self, t: str) -> str:
        return self.T[t].letters

    def elem_bytes(self, t: str) -> float:
        d = self.T[t]
        if d.elem_bytes is not None:
            return d.elem_bytes
        if self.plan.kv_bytes and t.endswith(".cache"):  # the KV cache's own storage dtype
            return self.plan.kv_bytes
        if t.startswith("grad:") or t.startswith("gout:"):
            base = self.bw.grad_of.get(t)
            if base is not None and param_like(self.mod, base):
                return self.plan.grad_bytes
        if param_like(self.mod, t) if t in self.mod.tensors else False:
            # weight-only quantization keeps the embedding and the vocabulary projection (@vocab) and
            # the 1-D parameters (norm scales, biases) in the activation dtype, as AWQ/GPTQ/MXFP4 do
            if self.plan.param_bytes != self.plan.act_bytes and (d.role == "vocab" or len(d.letters) < 2):
                return self.plan.act_bytes
            return self.plan.param_bytes
        return self.plan.act_bytes

    def numel(self, t: str) -> Expr:
        return product(self.mod.size(c) for c in self.letters(t))

    def local_bytes(self, t: str, layout: Layout) -> Expr:
        return self.numel(t) * self.elem_bytes(t) / shard_expr(layout)

    def canonical(self, letters: str, data: bool = False) -> Layout:
        """Layout of a tensor between modules: batch on dp, sequence on cp (and tp under SP)."""
        p = self.plan
        dims = []
        for c in letters:
            if c == BATCH:
                dims.append(p.batch_axes)
            elif c == SEQ:
                dims.append(_norm_axes([a for a in ("cp",) + (("tp",) if p.sp and not data else ())
                                        if a in p.axes]))
            else:
                dims.append(())
        return Layout(tuple(dims))

    def param_layout(self, name: str) -> Layout:
        """Compute layout of a parameter (or of a view of one, positionally)."""
        d = self.mod.tensors[name]
        if d.view_of is not None and d.kind != "param":
            base = self.param_layout(d.view_of)
            return Layout(base.dims[: d.rank] + ((),) * (d.rank - len(base.dims[: d.rank])))
        p = self.plan
        axes = set(p.axes)
        dims: list[list[str]] = [[] for _ in d.letters]
        if "tp" in axes and d.role:
            plain = [i for i, c in enumerate(d.letters) if c != EXPERT]  # roles skip the expert dim
            if d.role == "col":
                dims[plain[-1]].append("tp")
            elif d.role == "row":
                dims[plain[0]].append("tp")
            elif d.role == "vocab" and "v" in d.letters and p.vocab_parallel:
                dims[d.letters.index("v")].append("tp")
        if "ep" in axes and EXPERT in d.letters:
            dims[d.letters.index(EXPERT)].append("ep")
        return Layout(tuple(tuple(x) for x in dims))

    # ---- conversion ---------------------------------------------------------------------------
    def convert(self, t: str, h: Handle, dst: Layout) -> Handle:
        dst = _norm(dst)
        if _norm(h.layout) == dst:
            return h
        key = (t, dst)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        steps = redistribute(h.layout, dst, self.local_bytes(t, h.layout), _sym, AXES)
        if self.reuse:
            # the forward pass kept converted copies of this tensor (all-to-all'd tokens): start
            # from the furthest one reached without an all-gather (all-gathered tensors are
            # gathered again instead, as Megatron-LM does to save memory)
            for k in range(len(steps), 0, -1):
                if self._regather and any(st.kind == CollectiveType.ALL_GATHER for st in steps[:k]):
                    continue
                port = self.reuse.get((t, _norm(steps[k - 1].layout_after)))
                if port is not None:
                    mid = _norm(steps[k - 1].layout_after)
                    h = Handle((), (port,), mid)
                    steps = redistribute(mid, dst, self.local_bytes(t, mid), _sym, AXES)
                    break
        rows, imports = h.rows, h.imports
        for st in steps:
            name = f"{_COLL_NAME[st.kind]} {self.mod.name}.{t}"
            row = self.prog.add(PNode(NodeType.COMM_COLL_NODE, name, ZERO, st.bytes, int(st.kind),
                                      _norm_axes(st.axes), rows, imports))
            rows, imports = (row,), ()
            self.cache.setdefault((t, _norm(st.layout_after)), Handle(rows, imports, _norm(st.layout_after)))
        out = Handle(rows, imports, dst)
        self.cache[key] = out
        return out

    # ---- sharding -----------------------------------------------------------------------------
    def op_sharding(self, op: Op, operands: list[tuple[str, str]], out_letters: list[str],
                    rename: dict[str, str], merge: bool) -> dict[str, tuple[str, ...]]:
        """Axes of each (renamed) letter of the op: parameters first, then inputs, then defaults.

        An axis splits at most one letter of an op (letters that are the same dimension under
        two names — query and key/value heads in attention — are renamed to one first).
        """
        p = self.plan
        asg: dict[str, tuple[str, ...]] = {}
        used: set[str] = set()

        def give(c: str, ax) -> None:
            asg[c] = tuple(ax)
            used.update(ax)

        # 1. parameters (inputs that are weights, outputs that are weight gradients)
        anchors = [(n, ls) for n, ls in operands if self.is_weight(n)]
        anchors += [(n, ls) for n, ls in zip(op.outputs, out_letters) if self.is_weight(n)]
        for n, ls in anchors:
            lay = self.weight_layout(n)
            for c, ax in zip(ls, lay.dims):
                c = rename.get(c, c)
                if ax and c not in asg and not (used & set(ax)):
                    give(c, ax)
        # 2. what the activation inputs carry (non-special letters)
        for n, ls in operands:
            if self.is_weight(n) or n not in self.H:
                continue
            for c, ax in zip(ls, self.H[n].layout.dims):
                c = rename.get(c, c)
                if c in _SPECIAL or c in asg or not ax or (merge and c == EXPERT):
                    continue
                if not (used & set(ax)):
                    give(c, ax)
        # 3. defaults
        all_letters = {rename.get(c, c) for _, ls in operands for c in ls}
        all_letters |= {rename.get(c, c) for ls in out_letters for c in ls}

        def take(c: str, axes) -> None:
            give(c, [a for a in axes if a in p.axes and a not in used])

        seq_axes = ("cp",) + (("tp",) if p.sp and "nosp" not in op.attrs else ())
        if BATCH in all_letters and BATCH not in asg:
            take(BATCH, p.batch_axes)
        if SEQ in all_letters and SEQ not in asg:
            take(SEQ, seq_axes)
        if merge:
            asg[TOKENS] = _norm_axes(asg.get(BATCH, ()) + asg.get(SEQ, ()))
            asg[EXPERT] = ()
        elif TOKENS in all_letters and TOKENS not in asg:
            take(TOKENS, p.batch_axes + seq_axes)
        for c in all_letters:
            asg.setdefault(c, ())
        return {c: _norm_axes(ax) for c, ax in asg.items()}

    def is_weight(self, n: str) -> bool:
        """A parameter, a view of one, or a parameter's gradient (contribution)."""
        if n in self.mod.tensors:
            return param_like(self.mod, n)
        base = self.bw.grad_of.get(n)
        return base is not None and param_like(self.mod, base)

    def weight_layout(self, n: str) -> Layout:
        if n in self.mod.tensors:
            return self.param_layout(n)
        return self.param_layout(self.bw.grad_of[n])

    # ---- emission -----------------------------------------------------------------------------
    def handle(self, t: str) -> Handle:
        h = self.H.get(t)
        if h is None:
            raise KeyError(f"module {self.mod.name}: tensor {t!r} used before it is produced")
        return h

    def emit(self, op: Op) -> None:
        kind = op.kind
        base_kind = op.attrs.get("fwd_kind", kind)
        cls = OP_KINDS.get(base_kind, ("ew",))[0] if kind != "add.bwd" else "ew"
        is_bwd = kind.endswith(".bwd") and kind != "add.bwd"
        if cls == "view" and not is_bwd:
            src = self.handle(op.inputs[0])
            for o in op.outputs:
                r = len(self.letters(o))
                dims = src.layout.dims[:r] + ((),) * (r - len(src.layout.dims[:r]))  # a view adding dims
                self.H[o] = Handle(src.rows, src.imports, Layout(dims, src.layout.partial))
            return
        in_letters = [self.letters(i) for i in op.inputs]
        out_letters = [self.letters(o) for o in op.outputs]
        if kind == "einsum":
            lhs, rhs = op.spec.split("->")
            in_letters, out_letters = lhs.split(","), [rhs]
        rename = self.rename_for(op)
        merge = base_kind in ("dispatch", "combine")
        operands = list(zip(op.inputs, in_letters))
        asg = self.op_sharding(op, operands, out_letters, rename, merge)

        def lay(ls: str) -> Layout:
            return Layout(tuple(asg[rename.get(c, c)] for c in ls))

        rows: list[int] = []
        imports: list[str] = []
        in_bytes = ZERO
        carry = self.carried_partial(op, base_kind, is_bwd, operands, asg)
        # a tensor-parallel projection gathers its sequence-parallel input again in the backward
        # (Megatron); a replicated consumer keeps what it gathered
        self._regather = any("tp" in self.weight_layout(n).axes() for n, _ in operands if self.is_weight(n)) \
            or any("tp" in self.weight_layout(o).axes() for o in op.outputs if self.is_weight(o))
        counted: set[str] = set()
        fp8 = self.is_fp8_gemm(op)
        for n, ls in operands:
            h = self.handle(n)
            if self.is_weight(n):
                hc = h
            elif self.is_data(n):
                hc = Handle(h.rows, h.imports, lay(ls))
            else:
                want = lay(ls)
                keep = tuple(a for a in h.layout.partial if a in carry)
                hc = self.convert(n, h, Layout(want.dims, keep))
                # the backward reads the FP8 transpose its forward cast kept; gradients are cast anew
                if fp8 and ("fwd" not in op.attrs or n.startswith(("grad:", "gout:"))):
                    hc = self.fp8_cast(n, hc)
            rows += hc.rows
            imports += hc.imports
            if cls == "embedding" and not is_bwd and self.is_weight(n):
                continue  # a lookup reads the rows it gathers (counted as its output), not the table
            if n in counted:
                continue  # one tensor passed twice (MLA's latent as keys and values) is read once
            counted.add(n)
            nb = self.local_bytes(n, hc.layout)
            in_bytes = in_bytes + (nb / self.elem_bytes(n) if fp8 else nb)  # FP8 operands: 1 byte
        op_letters = {rename.get(c, c) for ls in in_letters + out_letters for c in ls}
        used_axes = {a for c in op_letters for a in asg.get(c, ())}
        shard = product(_sym(a) for a in sorted(used_axes))
        flops = self.flops(op, base_kind, cls, is_bwd, in_letters, out_letters) / shard
        out_layouts = []
        out_bytes = ZERO
        for o, ls in zip(op.outputs, out_letters):
            present = {rename.get(c, c) for c in ls}
            if merge:
                present |= {BATCH, SEQ, TOKENS}
            kept = {a for c in present for a in asg.get(c, ())}
            partial = [a for c in op_letters - present for a in asg.get(c, ()) if a not in kept]
            partial = list(dict.fromkeys(partial))
            partial += [a for a in carry if a not in partial]
            lo = _norm(Layout(lay(ls).dims, tuple(partial)))
            out_layouts.append(lo)
            out_bytes = out_bytes + self.local_bytes(o, lo)
        stem = "matmul" if op.name == "einsum" else op.name
        name = f"{stem} {self.mod.name}.{op.attrs.get('fwd', op.outputs[0])}"
        repeat = ONE
        loop = op.attrs.get("loop")
        if loop:  # one node per local index of the loop letter (e.g. a Python loop over experts)
            repeat = self.mod.size(loop) / product(_sym(a) for a in asg.get(rename.get(loop, loop), ()))
        # appending to the KV cache moves the new tokens' keys/values only (read them, write them)
        # (written in the cache's dtype when it has its own)
        nbytes = in_bytes * (1 + self.plan.kv_bytes / self.plan.act_bytes if self.plan.kv_bytes else 2) \
            if cls == "kvcache" else in_bytes + out_bytes
        if cls == "embedding" and not is_bwd:
            nbytes = in_bytes + 2 * out_bytes  # gathered rows read, then written
        shape_kind, shape = self.local_shape(op, cls, is_bwd, in_letters, out_letters, asg, rename)
        if fp8 and shape_kind == "gemm":
            shape_kind = "gemm_fp8"
        causal: tuple[Expr, ...] = ()
        if cls == "attention" and ("causal" in op.attrs or "causal_prefix" in op.attrs):
            causal = self.attention_lengths(op, is_bwd)
        # model-FLOPs convention: forward matmuls and attention (exact causal half), nothing else
        mflops = flops if (not is_bwd and (kind == "einsum" or cls == "attention")) else ZERO
        row = self.prog.add(PNode(NodeType.COMP_NODE, name, flops, nbytes, -1, (),
                                  tuple(dict.fromkeys(rows)), tuple(dict.fromkeys(imports)), repeat,
                                  shape_kind, shape, causal, mflops))
        for o, lo in zip(op.outputs, out_layouts):
            self.H[o] = Handle((row,), (), lo)
            if cls == "loss" and not is_bwd and lo.partial:
                # the loss is reduced where it is computed (vocab-parallel cross-entropy)
                self.H[o] = self.convert(o, self.H[o], lo.without_partial())

    def is_fp8_gemm(self, op: Op) -> bool:
        """Under ``plan.fp8_gemms``: a linear layer's GEMM (an einsum with a weight operand, or the
        weight-gradient einsum), as Transformer Engine runs in FP8. The vocabulary projection stays
        in the activation dtype (Megatron-Core builds its output layer outside Transformer Engine)."""
        if not self.plan.fp8_gemms or op.kind != "einsum":
            return False
        ws = [n for n in (*op.inputs, *op.outputs) if self.is_weight(n)]
        if not ws:
            return False
        base = [self.bw.grad_of.get(n, n) for n in ws]
        return not any(self.mod.tensors[b].role == "vocab" for b in base if b in self.mod.tensors)

    def fp8_cast(self, n: str, h: Handle) -> Handle:
        """The FP8 copy of an activation or gradient a GEMM reads: one cast-transpose kernel per
        tensor and layout (read in the activation dtype, written as FP8 and its FP8 transpose, the
        per-tensor amax taken on the way), shared by every GEMM that reads it. An inference step
        writes no transpose (no backward reads it): one quantize kernel."""
        key = (f"fp8:{n}", h.layout)
        got = self.cache.get(key)
        if got is not None:
            return got
        nb = self.local_bytes(n, h.layout)
        numel = nb / self.elem_bytes(n)
        written = numel if self.plan.phase != "train" else 2 * numel
        row = self.prog.add(PNode(NodeType.COMP_NODE, f"fp8_cast {self.mod.name}.{n}", numel, nb + written,
                                  -1, (), h.rows, h.imports))
        out = Handle((row,), (), h.layout)
        self.cache[key] = out
        return out

    def local_shape(self, op: Op, cls: str, is_bwd: bool, in_letters: list[str], out_letters: list[str],
                    asg: dict[str, tuple[str, ...]], rename: dict[str, str]) -> tuple[str, tuple[Expr, ...]]:
        """The local shape one run of ``op`` works on (sizes divided by the mesh axes sharding
        each letter; a loop letter counts one index per run), for shape-aware compute models.

        An einsum ``A,B->O`` is a (batched) GEMM: batch = letters in A, B and O, m = in A and O
        only, n = in B and O only, k = the contracted rest. Attention: (batch, query length,
        key/value length, heads·head dim) of its query and key tensors."""
        loop = op.attrs.get("loop")

        def local(c: str) -> Expr:
            if c == loop:
                return ONE
            r = rename.get(c, c)
            return self.mod.size(c) / product(_sym(a) for a in asg.get(r, ()))

        if op.kind == "einsum" and len(in_letters) == 2 and len(out_letters) == 1:
            a, b, o = set(in_letters[0]), set(in_letters[1]), set(out_letters[0])
            bat = a & b & o
            m, n = (a & o) - b, (b & o) - a
            k = (a | b) - o
            if o - a - b:
                return "", ()
            return "gemm", tuple(product(local(c) for c in sorted(s)) for s in (m, n, k, bat))
        if cls == "attention":
            q = self.mod.tensors[op.attrs.get("fwd", op.outputs[0])]
            qi = self.mod.ops[self._producer[q.name]].inputs if is_bwd else op.inputs
            ql, kl = self.mod.tensors[qi[0]].letters, self.mod.tensors[qi[1]].letters
            if len(ql) < 3 or len(kl) < 2:
                return "", ()
            # [batch, seq, features...]: features are heads·head_dim (one letter or two)
            return "attention", (local(ql[0]), local(ql[1]), local(kl[1]),
                                 product(local(c) for c in ql[2:]))
        return "", ()

    def attention_lengths(self, op: Op, is_bwd: bool) -> tuple[Expr, Expr]:
        """Global (query length, key length) of an attention op (its forward's for a backward)."""
        q = self.mod.tensors[op.attrs.get("fwd", op.outputs[0])]
        qi = self.mod.ops[self._producer[q.name]].inputs if is_bwd else op.inputs
        return (self.mod.size(self.mod.tensors[qi[0]].letters[1]), self.mod.size(self.mod.tensors[qi[1]].letters[1]))

    def carried_partial(self, op: Op, base_kind: str, is_bwd: bool, operands, asg) -> set[str]:
        """Partial-sum axes an op linear in its inputs passes to its outputs instead of reducing.

        Only axes no letter of the op uses. Sum-like ops (add, accumulation) carry an axis every
        input is partial over; product-like ops (einsum, embedding/dispatch gradients) an axis
        exactly one input is partial over.
        """
        used = {a for ax in asg.values() for a in ax}
        acts = [self.handle(n).layout.partial for n, _ in operands
                if not self.is_weight(n) and not self.is_data(n)]
        if not acts or not any(acts):
            return set()
        kind = op.kind
        if kind in ("add", "add.bwd") or (kind == "scale"):
            common = set(acts[0]).intersection(*map(set, acts[1:])) if kind == "add" else set(acts[0])
            return {a for a in common if a not in used}
        if kind == "einsum" or kind in ("embedding.bwd", "dispatch", "combine", "dispatch.bwd", "combine.bwd"):
            counts: dict[str, int] = {}
            for pa in acts:
                for a in pa:
                    counts[a] = counts.get(a, 0) + 1
            return {a for a, k in counts.items() if k == 1 and a not in used}
        return set()

    def is_data(self, n: str) -> bool:
        return n in self.mod.tensors and self.mod.tensors[n].kind == "data"

    def rename_for(self, op: Op) -> dict[str, str]:
        """Letters that name the same dimension as another for splitting purposes.

        Elementwise-like ops: output letters are positional copies of the first input's.
        Attention: the key/value head dimension is the query head dimension (both split by tp).
        """
        kind = op.attrs.get("fwd_kind", op.kind)
        cls = OP_KINDS.get(kind, ("ew",))[0]
        if cls not in ("ew", "norm", "scan", "other", "attention"):
            return {}
        fwd_name = op.attrs.get("fwd", op.outputs[0])
        prod = self._producer.get(fwd_name)
        if prod is None:
            return {}
        fop = self.mod.ops[prod]
        if cls == "attention":
            head = self.mod.tensors[fop.inputs[0]].letters[-1]
            return {self.mod.tensors[i].letters[-1]: head for i in fop.inputs[1:]
                    if self.mod.tensors[i].letters[-1] != head}
        ins = self.mod.tensors[fop.inputs[0]].letters
        outs = self.mod.tensors[fop.outputs[0]].letters
        return {o: i for o, i in zip(outs, ins) if o != i}

    def flops(self, op: Op, base_kind: str, cls: str, is_bwd: bool, in_letters: list[str],
              out_letters: list[str]) -> Expr:
        size = self.mod.size
        if op.kind == "einsum":
            letters = sorted({c for ls in in_letters + out_letters for c in ls})
            return 2 * product(size(c) for c in letters)
        mult = parse(op.attrs["flops"]) if "flops" in op.attrs else None
        if cls == "attention":
            q = self.mod.tensors[op.attrs.get("fwd", op.outputs[0])]
            qi = self.mod.ops[self._producer[q.name]].inputs if is_bwd else op.inputs
            qn = product(size(c) for c in self.mod.tensors[qi[0]].letters)
            on = product(size(c) for c in q.letters)  # scores over the query width, P·V over the output's
            t = self.mod.tensors[qi[1]].letters[1]
            f = 2 * (qn + on) * size(t)
            if "causal" in op.attrs:
                f = f / 2
            elif "causal_prefix" in op.attrs:  # s new queries after t - s cached keys
                f = 2 * (qn + on) * (size(t) - size(self.mod.tensors[qi[0]].letters[1]) / 2)
            return f * Fraction(5, 2) if is_bwd else f
        if cls in ("embedding", "dispatch", "combine", "view", "kvcache"):
            return ZERO
        ref = in_letters[0] if is_bwd or cls == "loss" else out_letters[0]
        n = product(size(c) for c in ref)
        k = mult if mult is not None else Expr.const(EW_FLOPS.get(base_kind, 1))
        if cls == "loss" and is_bwd:
            n = product(size(c) for c in in_letters[0])
        return n * k * (2 if is_bwd else 1)

