"""The tables a rank graph holds beside its node columns: the :class:`StringTable` every rank of a
trace shares, sparse typed attributes (:class:`AttrColumn`), the per-rank :class:`TensorTable`,
and :class:`Node`, the read-only one-node view. See :mod:`ettools.graph`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ettools.graph_schema import EdgeKind, NodeType


class StringTable:
    """Interns strings to dense ``int32`` ids shared by every rank of a trace."""

    __slots__ = ("_index", "_strings")

    def __init__(self, strings: Iterable[str] = ()) -> None:
        self._strings: list[str] = []
        self._index: dict[str, int] = {}
        for s in strings:
            self.intern(s)

    def intern(self, s: str) -> int:
        """Return the id of ``s``, adding it if new."""
        i = self._index.get(s)
        if i is None:
            i = len(self._strings)
            self._strings.append(s)
            self._index[s] = i
        return i

    def lookup(self, s: str) -> int:
        """Return the id of ``s`` or -1 if it was never interned."""
        return self._index.get(s, -1)

    def __getitem__(self, i: int) -> str:
        return self._strings[i]

    def __len__(self) -> int:
        return len(self._strings)

    def decode(self, ids: np.ndarray) -> list[str]:
        """Strings of an array of ids (``-1`` gives ``""``)."""
        s = self._strings
        return [s[i] if i >= 0 else "" for i in ids.tolist()]


@dataclass
class AttrColumn:
    """A sparse, typed attribute: ``values[k]`` belongs to node row ``rows[k]``."""

    kind: str
    rows: np.ndarray
    values: list[Any]

    def get(self, row: int, default: Any = None) -> Any:
        """Value on node ``row`` or ``default``."""
        k = int(np.searchsorted(self.rows, row))
        if k < len(self.rows) and self.rows[k] == row:
            return self.values[k]
        return default

    def as_dict(self) -> dict[int, Any]:
        """``{row: value}``."""
        return dict(zip(self.rows.tolist(), self.values))


@dataclass
class TensorTable:
    """Tensors of one rank, in columns; ``shape`` of row ``t`` is ``dims[shape_ptr[t]:shape_ptr[t+1]]``."""

    tensor_id: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    storage_id: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    offset: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    numel: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    elem_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    dtype: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    device: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    shape_ptr: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    dims: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.tensor_id)

    @property
    def nbytes(self) -> np.ndarray:
        """Bytes of each tensor (element count × element size)."""
        return self.numel * self.elem_bytes

    def shape(self, t: int) -> tuple[int, ...]:
        """Shape of tensor row ``t``."""
        return tuple(self.dims[self.shape_ptr[t] : self.shape_ptr[t + 1]].tolist())


@dataclass
class Node:
    """A read-only view of one node, for tests, debugging and small tools (slow path)."""

    id: int
    name: str
    type: NodeType
    start: float
    dur: float
    resource: str
    is_cpu_op: int
    num_ops: int
    tensor_size: int
    comm_type: int
    comm_bytes: int
    comm_group: str
    comm_peer: int
    comm_tag: int
    deps: list[tuple[int, EdgeKind]]
    attrs: dict[str, Any]
    inputs: list[int]
    outputs: list[int]

    @property
    def data_deps(self) -> list[int]:
        """Ids of DATA dependencies."""
        return [d for d, k in self.deps if k == EdgeKind.DATA]

    @property
    def ctrl_deps(self) -> list[int]:
        """Ids of all non-DATA dependencies."""
        return [d for d, k in self.deps if k != EdgeKind.DATA]
