"""Symbolic tensor IR: modules of ops over tensors whose dimensions are symbolic.

Every tensor dimension carries a *letter* (its index in einsum notation) and every letter of a
module has a symbolic size (:class:`~.expr.Expr`), e.g. ``b=B s=S h=H q=3*H``. Letters also say
how a dimension may be split (see :mod:`.distribute`): ``b`` batch (data parallel), ``s``
sequence (context parallel, and the TP group under sequence parallelism), ``t`` a key/value
sequence (gathered for attention), ``e`` experts (expert parallel), ``c`` expert-buffer tokens
(carry the batch and sequence split); a parameter's ``role`` (``col``, ``row``, ``vocab``) says
which of its dimensions tensor parallelism splits. Partition symbols and partial-sum markers
(``B/dp``, ``S/tp``, ``@partial(tp)``) are attached only when a plan distributes the module, as a
:class:`ettools.redistribute.Layout`.

An :class:`Op` is ``outputs = kind[attrs](inputs)``: ``einsum`` (every contraction), elementwise
(``add``, ``mul``, ``gelu``, ``silu``, ``swiglu``, ``softmax``, …), norms, ``attention`` (fused,
FlashAttention-style), ``embedding``, ``cross_entropy``, ``scan`` (SSM), ``dispatch``/``combine``
(MoE), ``topk``, ``split`` (a free view). A :class:`Module` is a list of ops with its inputs,
parameters and outputs; a :class:`Model` chains modules (some repeated ``L`` times).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .expr import Expr, product

# Letters with a fixed meaning for distribution.
BATCH, SEQ, KVSEQ, EXPERT, TOKENS = "b", "s", "t", "e", "c"


@dataclass
class TensorDef:
    """A named tensor of a module: its dimension letters and what it is."""

    name: str
    letters: str
    kind: str = "act"  # act | param | data (graph input with no gradient, e.g. token ids)
    role: str = ""  # parameters: col | row | vocab | "" (how tensor parallelism splits it)
    view_of: str | None = None  # a free view (split) of another tensor
    elem_bytes: int | None = None  # fixed element size (data: 8); None: the plan's dtype

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return len(self.letters)


@dataclass
class Op:
    """``outputs = kind[attrs](inputs)``; ``name`` is what nodes are called (drives op classes)."""

    kind: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, str] = field(default_factory=dict)
    spec: str = ""  # einsum spec "bsh,hq->bsq"
    line: int = 0  # template line, for messages

    @property
    def name(self) -> str:
        """Node name stem: the attr ``name`` or the kind."""
        return self.attrs.get("name", self.kind)


@dataclass
class Module:
    """A template module: sizes of its letters, tensors, ops, activation inputs and outputs."""

    name: str
    sizes: dict[str, Expr] = field(default_factory=dict)
    tensors: dict[str, TensorDef] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)  # activations from the previous module, in order
    outputs: list[str] = field(default_factory=list)  # activations to the next module, in order
    source: str = ""
    cache: list[str] = field(default_factory=list)  # tensors an inference step keeps (KV cache)

    def size(self, letter: str) -> Expr:
        """Symbolic size of ``letter``."""
        try:
            return self.sizes[letter]
        except KeyError:
            raise KeyError(f"module {self.name}: letter {letter!r} has no size") from None

    def numel(self, tensor: str) -> Expr:
        """Symbolic element count of a tensor (global, undistributed)."""
        return product(self.size(c) for c in self.tensors[tensor].letters)

    @property
    def params(self) -> list[str]:
        """Parameter names in declaration order."""
        return [t.name for t in self.tensors.values() if t.kind == "param"]

    def producer(self) -> dict[str, int]:
        """Tensor name -> index of the op producing it."""
        out: dict[str, int] = {}
        for i, op in enumerate(self.ops):
            for t in op.outputs:
                out[t] = i
        return out


@dataclass
class ModuleUse:
    """One entry of a model: a module, how many times it repeats (symbolic), its role."""

    module: str
    repeat: Expr
    name: str = ""


@dataclass
class Model:
    """A model template: modules in order plus default values of its symbols."""

    name: str
    uses: list[ModuleUse]
    modules: dict[str, Module]
    defaults: dict[str, int] = field(default_factory=dict)
    source: str = ""
    # tied parameters: (user module, user param, owner module, owner param) — one weight used by
    # two modules (GPT's LM head is the token embedding): stored, counted and updated once
    ties: list[tuple[str, str, str, str]] = field(default_factory=list)

    def module(self, name: str) -> Module:
        """The module called ``name``."""
        return self.modules[name]
