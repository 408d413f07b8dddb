"""Distribution: a module's ops on one rank of a parallel plan, as a small symbolic program.

A :class:`Plan` fixes the mesh (``tp``, ``cp``, ``dp`` = ``ep`` × ``edp``, ``pp``), sequence
parallelism, ZeRO/FSDP, gradient synchronisation, dtypes. :func:`build_programs` turns each module
of a model into :class:`Program` s — the forward pass, the backward pass (optionally with the
forward recomputed first) and the gradient-synchronisation/optimizer step — whose nodes are
compute ops with local FLOPs and bytes, and collectives with their group (a set of mesh axes)
and bytes. Sizes stay :class:`~.expr.Expr` until :mod:`.instantiate` substitutes numbers.

How each op is split (a GSPMD-like rule with Megatron-LM's choices):

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

from dataclasses import dataclass, field
from fractions import Fraction

from ettools.graph import CollectiveType, NodeType
from ettools.redistribute import Layout, redistribute

from .autodiff import Backward, backward, param_like
from .expr import ONE, ZERO, Expr, parse, product
from .ir import BATCH, EXPERT, KVSEQ, SEQ, TOKENS, Model, Module, Op
from .templates import OP_KINDS

AXES = ("tp", "cp", "ep", "edp")  # mesh order, fastest first (pp is outermost, not a tensor axis)
DTYPE_BYTES = {"fp32": 4, "float32": 4, "tf32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2,
               "fp8": 1, "float8": 1}
_SPECIAL = (BATCH, SEQ, TOKENS, KVSEQ)

# FLOPs per output element of elementwise ops (forward); backward ops cost twice that.
EW_FLOPS = {"add": 1, "mul": 1, "scale": 1, "gelu": 8, "silu": 4, "relu": 1, "swiglu": 5, "geglu": 9,
            "softmax": 5, "dropout": 2, "rope": 3, "layernorm": 5, "rmsnorm": 4, "conv1d": 8, "topk": 1,
            "cross_entropy": 5, "add.bwd": 1}


@dataclass
class Plan:
    """A parallel plan and training setup (plain values)."""

    tp: int = 1
    cp: int = 1
    dp: int = 1  # data-parallel degree, expert parallelism included
    ep: int = 1
    pp: int = 1
    sp: bool = False  # Megatron sequence parallelism over the TP group
    zero: int = 0  # 0 DDP, 1/2 sharded optimizer (and gradients), 3 FSDP
    fsdp_modules: tuple[str, ...] | None = None  # ZeRO-3 only these module names (None: all)
    schedule: str = "1f1b"  # gpipe | 1f1b | interleaved | deepspeed | zb-h1
    vpp: int = 1  # model chunks per stage (interleaved)
    micro_batches: int = 1
    recompute: str = "none"  # none | full (each module's forward again) | selective (core attention)
    act_bytes: int = 2
    param_bytes: int = 2
    grad_bytes: int = 2
    grad_sync: str = "iteration"  # iteration | microbatch
    optimizer: str | None = "adam"
    vocab_parallel: bool = True  # @vocab parameters split over tp
    bucket_mb: float | None = None  # DDP-style gradient buckets across modules (None: one per module)
    phase: str = "train"  # train | prefill | decode (inference: forward programs only)
    # Megatron's pipeline scatter/gather: without SP each TP rank sends 1/tp of a boundary
    # activation (or its gradient) and the receiving stage all-gathers it over its TP group
    pp_scatter_gather: bool = False
    # gradient collectives after the whole backward pass (else each bucket as soon as its
    # gradients exist, overlapped with the rest of the backward)
    dp_after_backward: bool = False
    tie: bool = True  # honour the model's tied parameters (``tie`` statements); False: untied copies
    # Transformer Engine FP8 training: the linear layers' GEMMs (forward, dgrad, wgrad) in FP8 with
    # their operands cast (and transposed) by separate kernels, everything else in ``act_bytes``
    fp8_gemms: bool = False

    def __post_init__(self) -> None:
        for k in ("tp", "cp", "dp", "ep", "pp", "vpp", "micro_batches"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k} must be >= 1, got {getattr(self, k)}")
        if self.dp % self.ep:
            raise ValueError(f"ep ({self.ep}) must divide dp ({self.dp}): experts are split over data-parallel ranks")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"zero must be 0, 1, 2 or 3, got {self.zero}")
        if self.grad_sync not in ("iteration", "microbatch"):
            raise ValueError(f"grad_sync must be 'iteration' or 'microbatch', got {self.grad_sync!r}")
        if self.phase not in ("train", "prefill", "decode"):
            raise ValueError(f"phase must be train, prefill or decode, got {self.phase!r}")
        if self.schedule not in ("gpipe", "1f1b", "interleaved", "deepspeed", "zb-h1"):
            raise ValueError(f"schedule must be gpipe, 1f1b, interleaved, deepspeed or zb-h1, got {self.schedule!r}")
        if self.schedule == "deepspeed" and self.zero > 1:
            raise ValueError(f"DeepSpeed's pipeline engine runs ZeRO stage 0 or 1, not {self.zero}")

    @property
    def edp(self) -> int:
        """Data-parallel ranks per expert-parallel group."""
        return self.dp // self.ep

    def size(self, axis: str) -> int:
        """Ranks along a mesh axis."""
        return {"tp": self.tp, "cp": self.cp, "ep": self.ep, "edp": self.edp, "pp": self.pp}[axis]

    @property
    def axes(self) -> tuple[str, ...]:
        """Tensor axes with more than one rank, mesh order."""
        return tuple(a for a in AXES if self.size(a) > 1)

    @property
    def batch_axes(self) -> tuple[str, ...]:
        """The data-parallel axes that split the batch."""
        return tuple(a for a in ("ep", "edp") if self.size(a) > 1)

    @property
    def world(self) -> int:
        """Total ranks."""
        return self.tp * self.cp * self.dp * self.pp

    def fsdp(self, module: str) -> bool:
        """Whether ``module``'s parameters are sharded (ZeRO-3) and gathered before use."""
        return self.zero == 3 and (self.fsdp_modules is None or module in self.fsdp_modules)


# ---- programs -----------------------------------------------------------------------------------

@dataclass
class PNode:
    """One node of a program: compute (FLOPs, bytes) or collective (type, axes, bytes)."""

    type: NodeType
    name: str
    flops: Expr = ZERO
    bytes: Expr = ZERO  # compute: tensor_size; collective: Chakra comm_size
    ctype: int = -1
    axes: tuple[str, ...] = ()
    deps: tuple[int, ...] = ()
    imports: tuple[str, ...] = ()
    repeat: Expr = ONE  # the op runs this many times (a loop over local experts), work split evenly
    # local shape of one run of the op (after sharding), for compute models: ``gemm`` (m, n, k,
    # batch) or ``attention`` (batch, seq_q, seq_kv, heads·head_dim); empty when not known
    shape_kind: str = ""
    shape: tuple[Expr, ...] = ()
    # a causally masked fused attention: (global query length, global key length); its FLOPs are
    # counted at the kernel's tile granularity when numbers are known (:func:`flash_causal_keys`)
    causal: tuple[Expr, ...] = ()
    # FLOPs under the model-FLOPs convention (MFU): matmuls, and attention with the causal mask's
    # exact half; forward nodes only (the backward counts twice that)
    mflops: Expr = ZERO


@dataclass
class Program:
    """A module's pass on one rank: nodes, and ports to the programs around it.

    ``exports[port] = (rows, imports)``: the rows producing what the port carries (and imports it
    passes through unchanged). Ports: ``out:i``/``in:i`` (activations between modules),
    ``gout:i``/``gin:i`` (their gradients), ``t:<tensor>`` (forward tensors the backward reads),
    ``pgrad:<param>`` (parameter gradients for the synchronisation step).
    """

    key: str
    nodes: list[PNode] = field(default_factory=list)
    exports: dict[str, tuple[tuple[int, ...], tuple[str, ...]]] = field(default_factory=dict)
    saved_bytes: Expr = ZERO  # activations kept from the forward pass for the backward (fwd only)
    param_bytes: Expr = ZERO  # parameter, gradient and optimizer bytes resident on the rank (sync)
    grad_bytes: Expr = ZERO  # local gradient bytes the synchronisation reduces (sync)
    cache_bytes: Expr = ZERO  # KV-cache bytes the rank keeps for this module (inference fwd)
    model_flops: Expr = ZERO  # forward FLOPs under the model-FLOPs convention (fwd only)

    def add(self, node: PNode) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1


@dataclass(frozen=True)
class Handle:
    """Where a tensor's value comes from (rows of this program, imported ports) and its layout."""

    rows: tuple[int, ...]
    imports: tuple[str, ...]
    layout: Layout


def _sym(a: str) -> Expr:
    return Expr.sym(a)


def _norm_axes(axes) -> tuple[str, ...]:
    s = set(axes)
    return tuple(a for a in AXES if a in s)


def _norm(layout: Layout) -> Layout:
    return Layout(tuple(_norm_axes(d) for d in layout.dims), _norm_axes(layout.partial))


def shard_expr(layout: Layout) -> Expr:
    """Product of the axis symbols splitting ``layout``."""
    return product(_sym(a) for a in sorted(layout.axes()))


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

    def elem_bytes(self, t: str) -> int:
        d = self.T[t]
        if d.elem_bytes is not None:
            return d.elem_bytes
        if t.startswith("grad:") or t.startswith("gout:"):
            base = self.bw.grad_of.get(t)
            if base is not None and param_like(self.mod, base):
                return self.plan.grad_bytes
        if param_like(self.mod, t) if t in self.mod.tensors else False:
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
        nbytes = 2 * in_bytes if cls == "kvcache" else in_bytes + out_bytes
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
        per-tensor amax taken on the way), shared by every GEMM that reads it."""
        key = (f"fp8:{n}", h.layout)
        got = self.cache.get(key)
        if got is not None:
            return got
        nb = self.local_bytes(n, h.layout)
        numel = nb / self.elem_bytes(n)
        row = self.prog.add(PNode(NodeType.COMP_NODE, f"fp8_cast {self.mod.name}.{n}", numel, nb + 2 * numel,
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


_COLL_NAME = {
    CollectiveType.ALL_REDUCE: "all_reduce",
    CollectiveType.ALL_GATHER: "all_gather",
    CollectiveType.REDUCE_SCATTER: "reduce_scatter",
    CollectiveType.ALL_TO_ALL: "all_to_all",
}


# ---- programs of a module ---------------------------------------------------------------------------

@dataclass
class ModulePrograms:
    """The programs of one module under a plan, and facts the scheduler needs."""

    module: str
    fwd: Program
    bwd: Program
    sync: Program  # gradient synchronisation after a micro-batch's backward (may be empty)
    step: Program  # last micro-batch: synchronisation, optimizer, ZeRO parameter gather
    n_inputs: int
    n_outputs: int
    buckets: list[tuple[tuple[str, ...], list[str]]]  # (data-parallel axes, params)
    out_bytes: list[Expr] = field(default_factory=list)  # local bytes of each output between modules


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
    # data-parallel reduction, as Megatron-LM does
    extra = {p: (f"tgrad:{um}:{up}",) for p, (um, up) in tied_owner.items()} if plan.pp == 1 else {}
    emb = set(tied_owner) | set(tied_user) if plan.pp > 1 else set()
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


def build_programs(model: Model, plan: Plan) -> dict[str, ModulePrograms]:
    """:func:`build_module` (or :func:`build_inference_module`) for every module the model uses."""
    build = build_module if plan.phase == "train" else build_inference_module
    out: dict[str, ModulePrograms] = {}
    for use in model.uses:
        if use.module not in out:
            out[use.module] = build(model, model.module(use.module), plan)
    return out
