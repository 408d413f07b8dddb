"""Symbolic programs: the data a module's pass on one rank is written in — nodes (:class:`PNode`:
compute with FLOPs and bytes, or a collective with its group of mesh axes), programs with their
ports (:class:`Program`), the programs of one module (:class:`ModulePrograms`), where a tensor's
value comes from (:class:`Handle`) and the layout helpers the builders share."""

from __future__ import annotations

from dataclasses import dataclass, field

from ettools.graph import CollectiveType, NodeType
from ettools.redistribute import Layout

from .expr import ONE, ZERO, Expr, product
from .plan import AXES


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


_COLL_NAME = {
    CollectiveType.ALL_REDUCE: "all_reduce",
    CollectiveType.ALL_GATHER: "all_gather",
    CollectiveType.REDUCE_SCATTER: "reduce_scatter",
    CollectiveType.ALL_TO_ALL: "all_to_all",
}


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

