"""The text format of model templates, and the built-in templates (``templates/*.txt``).

A template file holds ``module`` blocks and one ``model`` block; ``#`` starts a comment::

    module mlp
      size b=B s=S h=H f=F
      input x:bsh                       # activations from the previous module, in order
      param w1:hf@col w2:fh@row         # @col/@row/@vocab: how tensor parallelism splits it
      u = einsum[bsh,hf->bsf](x, w1)    # every contraction is an einsum
      a = gelu(u)                       # elementwise: output letters follow the first input
      y = einsum[bsf,fh->bsh](a, w2)
      output y
    end

    model tiny
      defaults B=1 S=128 H=64 F=256 L=2
      use mlp x L                       # repeated modules are the "layers" pipelining splits
    end

A model block may tie two parameters of modules used once each: ``tie head.wlm = embed.wte``
(one weight: stored, reduced and updated once; across pipeline stages each end keeps a copy and
their gradients are all-reduced over the embedding group, see :mod:`.distribute`).

Statements inside a module: ``size LETTER=EXPR …`` (symbolic sizes, no spaces inside an
expression), ``input NAME:LETTERS …`` (activations from the previous module; they always get a
gradient, even in the first module), ``data NAME:LETTERS …`` (graph inputs without gradient,
such as token ids), ``param NAME:LETTERS[@ROLE] …``, ``output NAME …``, ``cache NAME …`` (what an
inference step keeps per token, see :mod:`.inference`; default the attention's keys and values) and op lines
``OUT[, OUT…] = KIND[ATTRS](IN, …) [-> LETTERS[, LETTERS…]]``. ``ATTRS`` is the einsum spec for
``einsum`` (flags after a ``;``: ``einsum[bsh,hv->bsv; nosp]``) and ``key=value``/flag items
otherwise. Flags: ``causal`` (attention), ``flops=K`` (FLOPs per output element), ``name=…``
(node name stem), ``loop=LETTER`` (one node per local index of that letter, e.g. a Python loop
over experts), ``nosp`` (the op runs on the whole sequence even under sequence parallelism: a
replicated embedding or head). Op kinds are listed in :data:`OP_KINDS`. Letters ``b s t e c``
have fixed meanings (see :mod:`.ir`).

Errors raise :class:`ettools.errors.TraceError` naming the file and line.
"""

from __future__ import annotations

import re
from pathlib import Path

from ettools.errors import TraceError

from .expr import parse
from .ir import Model, Module, ModuleUse, Op, TensorDef

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"

# kind -> (class of the node, min inputs, max inputs or None)
OP_KINDS: dict[str, tuple[str, int, int | None]] = {
    "einsum": ("gemm", 2, 2),
    "add": ("ew", 2, None),
    "mul": ("ew", 2, None),
    "scale": ("ew", 1, 1),
    "gelu": ("ew", 1, 1),
    "silu": ("ew", 1, 1),
    "relu": ("ew", 1, 1),
    "swiglu": ("ew", 1, 1),
    "geglu": ("ew", 1, 1),
    "softmax": ("ew", 1, 1),
    "dropout": ("ew", 1, 1),
    "rope": ("ew", 1, 2),
    "layernorm": ("norm", 1, 3),
    "rmsnorm": ("norm", 1, 2),
    "attention": ("attention", 3, 3),
    "embedding": ("embedding", 2, 2),
    "cross_entropy": ("loss", 1, 2),
    "scan": ("scan", 1, None),
    "conv1d": ("ew", 1, 3),
    "topk": ("other", 1, 1),
    "dispatch": ("dispatch", 1, 2),
    "combine": ("combine", 1, 2),
    "split": ("view", 1, 1),
    "kv_cache": ("kvcache", 1, None),
    "view": ("view", 1, 1),
}

_OP_RE = re.compile(
    r"^(?P<outs>[A-Za-z_][\w]*(?:\s*,\s*[A-Za-z_][\w]*)*)\s*=\s*(?P<kind>[A-Za-z_]\w*)"
    r"(?:\[(?P<attrs>[^\]]*)\])?\s*\((?P<ins>[^)]*)\)\s*(?:->\s*(?P<letters>.+))?$"
)
_DECL_RE = re.compile(r"^(?P<name>[A-Za-z_]\w*):(?P<letters>[a-z]+)(?:@(?P<role>\w+))?$")
_SIZE_RE = re.compile(r"^(?P<letter>[a-z])=(?P<expr>\S+)$")
_ROLES = ("col", "row", "vocab", "")


class _Parser:
    def __init__(self, text: str, path: str) -> None:
        self.text = text
        self.path = path
        self.modules: dict[str, Module] = {}
        self.tie_lines: list[int] = []
        self.model: Model | None = None

    def err(self, line: int, msg: str) -> TraceError:
        return TraceError(self.path, f"line {line}: {msg}")

    def run(self) -> Model:
        block: Module | Model | None = None
        for n, raw in enumerate(self.text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            head, _, rest = line.partition(" ")
            rest = rest.strip()
            if head in ("module", "model"):
                if block is not None:
                    raise self.err(n, f"'{head}' inside another block (missing 'end')")
                if not re.fullmatch(r"[A-Za-z_][\w\-]*", rest):
                    raise self.err(n, f"bad {head} name {rest!r}")
                if head == "module":
                    if rest in self.modules:
                        raise self.err(n, f"module {rest!r} defined twice")
                    block = Module(rest, source=self.path)
                else:
                    if self.model is not None:
                        raise self.err(n, "a second model block")
                    block = Model(rest, [], self.modules, source=self.path)
                continue
            if head == "end":
                if block is None:
                    raise self.err(n, "'end' without a block")
                if isinstance(block, Module):
                    self.finish_module(block, n)
                    self.modules[block.name] = block
                else:
                    self.model = block
                block = None
                continue
            if block is None:
                raise self.err(n, f"statement outside a module/model block: {line!r}")
            if isinstance(block, Model):
                self.model_line(block, head, rest, n)
            else:
                self.module_line(block, line, head, rest, n)
        if block is not None:
            raise self.err(len(self.text.splitlines()), f"block {block.name!r} has no 'end'")
        if self.model is None:
            raise TraceError(self.path, "no 'model' block")
        for use in self.model.uses:
            if use.module not in self.modules:
                raise TraceError(self.path, f"model uses unknown module {use.module!r}")
        if not self.model.uses:
            raise TraceError(self.path, "model uses no module")
        for (um, up, om, op_), n in zip(self.model.ties, self.tie_lines):
            self.check_tie(um, up, om, op_, n)
        return self.model

    def check_tie(self, um: str, up: str, om: str, op_: str, n: int) -> None:
        """A tie joins two parameters of the same size in two different modules used once each."""
        assert self.model is not None
        for mod, p in ((um, up), (om, op_)):
            if mod not in self.modules:
                raise self.err(n, f"tie: unknown module {mod!r}")
            t = self.modules[mod].tensors.get(p)
            if t is None or t.kind != "param":
                raise self.err(n, f"tie: {mod}.{p} is not a parameter")
            uses = [u for u in self.model.uses if u.module == mod]
            if len(uses) != 1 or not uses[0].repeat.is_const() or uses[0].repeat != parse("1"):
                raise self.err(n, f"tie: module {mod} must be used exactly once")
        if um == om:
            raise self.err(n, "tie: the two parameters must be in different modules")
        if self.modules[um].numel(up) != self.modules[om].numel(op_):
            raise self.err(n, f"tie: {um}.{up} and {om}.{op_} differ in size")

    # ---- model ---------------------------------------------------------------------------
    def model_line(self, m: Model, head: str, rest: str, n: int) -> None:
        if head == "defaults":
            for item in rest.split():
                k, eq, v = item.partition("=")
                if not eq or not re.fullmatch(r"[A-Za-z_]\w*", k) or not re.fullmatch(r"\d+", v):
                    raise self.err(n, f"bad default {item!r} (NAME=INTEGER)")
                m.defaults[k] = int(v)
        elif head == "use":
            mm = re.fullmatch(r"([A-Za-z_][\w\-]*)(?:\s+x\s+(\S+))?(?:\s+as\s+(\w+))?", rest)
            if not mm:
                raise self.err(n, f"bad use statement {rest!r} (use MODULE [x EXPR] [as NAME])")
            rep = self.expr(mm.group(2) or "1", n)
            m.uses.append(ModuleUse(mm.group(1), rep, mm.group(3) or mm.group(1)))
        elif head == "tie":
            mm = re.fullmatch(r"([A-Za-z_][\w\-]*)\.(\w+)\s*=\s*([A-Za-z_][\w\-]*)\.(\w+)", rest)
            if not mm:
                raise self.err(n, f"bad tie statement {rest!r} (tie MODULE.PARAM = MODULE.PARAM)")
            m.ties.append((mm.group(1), mm.group(2), mm.group(3), mm.group(4)))
            self.tie_lines.append(n)
        else:
            raise self.err(n, f"unknown model statement {head!r} (defaults, use, tie, end)")

    # ---- module --------------------------------------------------------------------------
    def expr(self, text: str, n: int):
        try:
            return parse(text)
        except ValueError as e:
            raise self.err(n, str(e)) from None

    def declare(self, mod: Module, t: TensorDef, n: int) -> None:
        if t.name in mod.tensors:
            raise self.err(n, f"tensor {t.name!r} defined twice")
        mod.tensors[t.name] = t

    def module_line(self, mod: Module, line: str, head: str, rest: str, n: int) -> None:
        if head == "size":
            for item in rest.split():
                mm = _SIZE_RE.match(item)
                if not mm:
                    raise self.err(n, f"bad size {item!r} (LETTER=EXPR without spaces)")
                mod.sizes[mm.group("letter")] = self.expr(mm.group("expr"), n)
            return
        if head in ("input", "data", "param"):
            for item in rest.split():
                mm = _DECL_RE.match(item)
                if not mm:
                    raise self.err(n, f"bad declaration {item!r} (NAME:LETTERS[@ROLE])")
                role = mm.group("role") or ""
                if role not in _ROLES:
                    raise self.err(n, f"unknown role @{role} (col, row, vocab)")
                if role and head != "param":
                    raise self.err(n, "only parameters take a role")
                kind = {"input": "act", "data": "data", "param": "param"}[head]
                t = TensorDef(mm.group("name"), mm.group("letters"), kind, role,
                              elem_bytes=8 if kind == "data" else None)
                self.declare(mod, t, n)
                if head == "input":
                    mod.inputs.append(t.name)
            return
        if head == "output":
            for item in rest.split():
                mod.outputs.append(item)
            return
        if head == "cache":  # what an inference step keeps per token (default: attention K and V)
            mod.cache.extend(rest.split())
            return
        mm = _OP_RE.match(line)
        if not mm:
            raise self.err(n, f"cannot read {line!r} (OUT = KIND[ATTRS](IN, ...) [-> LETTERS])")
        kind = mm.group("kind")
        if kind not in OP_KINDS:
            raise self.err(n, f"unknown op kind {kind!r} (known: {', '.join(sorted(OP_KINDS))})")
        outs = [s.strip() for s in mm.group("outs").split(",")]
        ins = [s.strip() for s in mm.group("ins").split(",") if s.strip()]
        _cls, lo, hi = OP_KINDS[kind]
        if len(ins) < lo or (hi is not None and len(ins) > hi):
            raise self.err(n, f"{kind} takes {lo}{'' if hi == lo else '..' + str(hi or 'n')} inputs, got {len(ins)}")
        for i in ins:
            if i not in mod.tensors:
                raise self.err(n, f"input {i!r} is not defined yet")
        attrs_txt = (mm.group("attrs") or "").strip()
        op = Op(kind, ins, outs, line=n)
        if kind == "einsum":
            spec_txt, _, flags = attrs_txt.partition(";")
            if not re.fullmatch(r"[a-z]+(,[a-z]+)*->[a-z]*", spec_txt.replace(" ", "")):
                raise self.err(n, f"einsum needs a spec like [bsh,hq->bsq], got [{attrs_txt}]")
            for item in [a.strip() for a in flags.split(",") if a.strip()]:
                k, eq, v = item.partition("=")
                op.attrs[k.strip()] = v.strip() if eq else "1"
            op.spec = spec_txt.replace(" ", "")
            lhs, rhs = op.spec.split("->")
            parts = lhs.split(",")
            if len(parts) != len(ins):
                raise self.err(n, f"einsum spec has {len(parts)} operands, op has {len(ins)} inputs")
            for p, i in zip(parts, ins):
                if p != mod.tensors[i].letters:
                    raise self.err(n, f"einsum operand {i!r} has letters {mod.tensors[i].letters!r}, spec says {p!r}")
            out_letters = [rhs]
            if len(outs) != 1:
                raise self.err(n, "einsum has one output")
        else:
            for item in [a.strip() for a in attrs_txt.split(",") if a.strip()]:
                k, eq, v = item.partition("=")
                op.attrs[k.strip()] = v.strip() if eq else "1"
            if mm.group("letters"):
                out_letters = [s.strip() for s in mm.group("letters").split(",")]
            elif kind in ("split", "view", "topk", "dispatch", "combine", "cross_entropy", "embedding"):
                raise self.err(n, f"{kind} needs its output letters (-> LETTERS)")
            else:
                out_letters = [mod.tensors[ins[0]].letters] * len(outs)
            if len(out_letters) != len(outs):
                raise self.err(n, f"{len(outs)} outputs but {len(out_letters)} letter groups")
        for o, lt in zip(outs, out_letters):
            if not re.fullmatch(r"[a-z]*", lt):
                raise self.err(n, f"bad letters {lt!r}")
            view = ins[0] if kind in ("split", "view") else None
            self.declare(mod, TensorDef(o, lt, "act", view_of=view), n)
        if kind in ("split", "view"):
            src = mod.tensors[ins[0]]
            for o in outs:
                if len(mod.tensors[o].letters) != src.rank:
                    raise self.err(n, f"view {o!r} must keep the rank of {ins[0]!r}")
        mod.ops.append(op)

    def finish_module(self, mod: Module, n: int) -> None:
        for t in mod.tensors.values():
            for c in t.letters:
                if c not in mod.sizes:
                    raise self.err(n, f"module {mod.name}: letter {c!r} of {t.name!r} has no size")
        for o in mod.outputs:
            if o not in mod.tensors:
                raise self.err(n, f"module {mod.name}: output {o!r} is not defined")
        if not mod.ops:
            raise self.err(n, f"module {mod.name} has no ops")


def parse_template(text: str, path: str = "<template>") -> Model:
    """Parse template text into a :class:`~.ir.Model`."""
    return _Parser(text, path).run()


def builtin_templates() -> list[str]:
    """Names of the built-in templates (``templates/<name>.txt``)."""
    return sorted(p.stem for p in TEMPLATE_DIR.glob("*.txt"))


def load_template(name_or_path: str | Path) -> Model:
    """A built-in template by name (``"gpt"``) or a template file by path."""
    p = Path(name_or_path)
    if not p.suffix and not p.exists():
        p = TEMPLATE_DIR / f"{name_or_path}.txt"
        if not p.exists():
            raise TraceError(str(name_or_path),
                             f"no such template (built-in: {', '.join(builtin_templates())})")
    try:
        text = p.read_text()
    except OSError as e:
        raise TraceError(str(p), f"cannot read template: {e.strerror}") from None
    return parse_template(text, str(p))
