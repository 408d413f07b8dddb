"""The collective matcher: which collectives turn one distribution of a tensor into another.

Shared by the synthesizer (:mod:`ettools.converters.symbolic`) and the rewriter
(:mod:`ettools.scaler`): one implementation.

A :class:`Layout` says how a tensor of ``rank`` dimensions is spread over the named axes of a
device mesh (``"tp"``, ``"cp"``, ``"dp"``, ``"ep"``, …): ``dims[i]`` is the tuple of axes that
split dimension ``i`` (in mesh order; empty: replicated along it), and ``partial`` the axes over
which each rank holds only a partial sum (the ``@1/tp`` marker of a row-parallel matmul's output).
An axis appears at most once in a layout (on one dimension, or as partial). A consumer that is
linear in the tensor may accept it partial over some axes (``dst.partial`` ⊆ ``src.partial``):
those axes are left alone.

:func:`redistribute` compares a producer layout with the layout a consumer needs and returns the
:class:`Step` list that converts one into the other, axis by axis (the rules of STAGE's Table IV):

=========================  =========================  ====================================
producer (axis ``a``)      consumer needs             collective over the ``a`` group
=========================  =========================  ====================================
dim *i* split by ``a``      dim *i* split by ``a``     none
dim *i* split by ``a``      not split by ``a``         AllGather
dim *i* split by ``a``      dim *j* ≠ *i* split        AllToAll
partial over ``a``          dim *j* split by ``a``     ReduceScatter
partial over ``a``          replicated over ``a``      AllReduce
replicated over ``a``       dim *j* split by ``a``     none (each rank keeps its slice)
=========================  =========================  ====================================

Axes needing the same kind of collective are merged into one collective over their product group
(an AllReduce over ``dp`` and ``cp`` is one AllReduce over the ``dp×cp`` group), and several kinds
compose in the order that moves the fewest bytes: ReduceScatter, AllReduce, AllToAll, AllGather
(so "partial over tp, needed split over tp and gathered over cp" is ReduceScatter(tp) then
AllGather(cp), a Table IV composite). A consumer never needs a partial tensor.

Bytes follow Chakra's ``comm_size`` (what :mod:`ettools.graph` stores in ``comm_bytes``): the
per-rank buffer — AllReduce the local buffer, ReduceScatter its full local input, AllGather its
local (per-rank) input, AllToAll the local buffer. :func:`redistribute` works on any number type
that supports ``*`` and ``/`` by ints — plain ints or :class:`~ettools.converters.symbolic.expr.Expr`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ettools.graph import CollectiveType


@dataclass(frozen=True)
class Layout:
    """Distribution of a tensor over mesh axes (see the module docstring)."""

    dims: tuple[tuple[str, ...], ...]
    partial: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for axes in (*self.dims, self.partial):
            for a in axes:
                if a in seen:
                    raise ValueError(f"axis {a!r} used twice in layout {self}")
                seen.add(a)

    @staticmethod
    def replicated(rank: int) -> Layout:
        """No axis splits any dimension; nothing partial."""
        return Layout(((),) * rank)

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return len(self.dims)

    def axes(self) -> frozenset[str]:
        """Every axis that splits a dimension (partial axes not included)."""
        return frozenset(a for axes in self.dims for a in axes)

    def dim_of(self, axis: str) -> int | None:
        """The dimension ``axis`` splits, or None."""
        for i, axes in enumerate(self.dims):
            if axis in axes:
                return i
        return None

    def without_partial(self) -> Layout:
        """The same split with the partial-sum marker dropped (the layout of a reduced tensor)."""
        return Layout(self.dims)

    def shard_factor(self, sizes: Mapping[str, Any]) -> Any:
        """Product of the sizes of all splitting axes (the local buffer is the global one divided by it)."""
        f = 1
        for a in self.axes():
            f = f * sizes[a]
        return f

    def __str__(self) -> str:
        d = ", ".join("/".join(a) if a else "*" for a in self.dims)
        return f"[{d}]" + (f"@partial({','.join(self.partial)})" if self.partial else "")


@dataclass(frozen=True)
class Step:
    """One collective of a conversion: its type, the axes of its group and its Chakra bytes."""

    kind: CollectiveType
    axes: tuple[str, ...]
    bytes: Any
    layout_after: Layout


_ORDER = (CollectiveType.REDUCE_SCATTER, CollectiveType.ALL_REDUCE, CollectiveType.ALL_TO_ALL,
          CollectiveType.ALL_GATHER)


def plan_axes(src: Layout, dst: Layout) -> dict[CollectiveType, list[str]]:
    """Per collective type, the axes that need it to go from ``src`` to ``dst`` (no byte counts)."""
    if src.rank != dst.rank:
        raise ValueError(f"layouts of different rank: {src} vs {dst}")
    extra = set(dst.partial) - set(src.partial)
    if extra:
        raise ValueError(f"cannot make a tensor partial over {sorted(extra)} ({src} -> {dst})")
    need: dict[CollectiveType, list[str]] = {k: [] for k in _ORDER}
    for a in src.partial:
        if a in dst.partial:  # a linear consumer takes the partial sum as it is
            continue
        need[CollectiveType.REDUCE_SCATTER if dst.dim_of(a) is not None else CollectiveType.ALL_REDUCE].append(a)
    for a in src.axes():
        i, j = src.dim_of(a), dst.dim_of(a)
        if j is None:
            need[CollectiveType.ALL_GATHER].append(a)
        elif i != j:
            need[CollectiveType.ALL_TO_ALL].append(a)
    return need


def redistribute(
    src: Layout,
    dst: Layout,
    local_bytes: Any,
    axis_size: Mapping[str, Any] | Callable[[str], Any],
    order: Sequence[str] | None = None,
) -> list[Step]:
    """The collectives converting a tensor from ``src`` to ``dst``; ``[]`` when no data moves.

    ``local_bytes`` is the size of the producer's local buffer; ``axis_size`` the number of ranks
    along each axis (a mapping or a function; axes of size 1 are skipped). ``order`` (mesh axis
    order) sorts the axes of a merged group; default: alphabetical.
    """
    size = axis_size if callable(axis_size) else axis_size.__getitem__
    need = plan_axes(src, dst)
    rank_of_axis = {a: i for i, a in enumerate(order)} if order is not None else None

    def sort(axes: list[str]) -> tuple[str, ...]:
        return tuple(sorted(axes, key=(lambda a: rank_of_axis.get(a, 1 << 30)) if rank_of_axis else None))

    steps: list[Step] = []
    cur_bytes = local_bytes
    dims = [list(axes) for axes in src.dims]
    partial = list(src.partial)

    def current() -> Layout:
        return Layout(tuple(tuple(d) for d in dims), tuple(partial))

    def group(axes: list[str]) -> Any:
        g = 1
        for a in axes:
            g = g * size(a)
        return g

    # ReduceScatter: partial -> split along the dimension the consumer wants
    rs = [a for a in need[CollectiveType.REDUCE_SCATTER] if _real(size(a))]
    trivially = [a for a in need[CollectiveType.REDUCE_SCATTER] if a not in rs]
    for a in trivially:  # size-1 axes: nothing to reduce, just relabel
        partial.remove(a)
        dims[dst.dim_of(a)].append(a)
    if rs:
        for a in rs:
            partial.remove(a)
            dims[dst.dim_of(a)].append(a)
        steps.append(Step(CollectiveType.REDUCE_SCATTER, sort(rs), cur_bytes, current()))
        cur_bytes = cur_bytes / group(rs)
    ar = need[CollectiveType.ALL_REDUCE]
    for a in ar:
        partial.remove(a)
    ar = [a for a in ar if _real(size(a))]
    if ar:
        steps.append(Step(CollectiveType.ALL_REDUCE, sort(ar), cur_bytes, current()))
    for a in need[CollectiveType.ALL_TO_ALL]:
        dims[src.dim_of(a)].remove(a)
        dims[dst.dim_of(a)].append(a)
        if _real(size(a)):
            steps.append(Step(CollectiveType.ALL_TO_ALL, (a,), cur_bytes, current()))
    ag = need[CollectiveType.ALL_GATHER]
    for a in ag:
        dims[src.dim_of(a)].remove(a)
    ag = [a for a in ag if _real(size(a))]
    if ag:
        steps.append(Step(CollectiveType.ALL_GATHER, sort(ag), cur_bytes, current()))
        cur_bytes = cur_bytes * group(ag)
    # axes the consumer splits but the producer had replicated: a local slice, no data moves
    return steps


def _real(n: Any) -> bool:
    """An axis of more than one rank (symbolic sizes count as real)."""
    try:
        return int(n) != 1
    except (TypeError, ValueError):
        return True


def conversion_bytes(steps: Sequence[Step]) -> Any:
    """Sum of the Chakra bytes of a conversion."""
    total = 0
    for s in steps:
        total = total + s.bytes
    return total


__all__ = ["Layout", "Step", "conversion_bytes", "plan_axes", "redistribute"]
