"""The state of reading one PyTorch ET rank file (:class:`_EtRank`): its graph builder and the
rows of its tensor table, one per distinct tensor value and shape, added as tensors are first met."""

from __future__ import annotations

from pathlib import Path

from ettools.converters.pytorch_et_nodes import tensor_keys
from ettools.graph import GraphBuilder, StringTable


class _EtRank:
    """State of reading one rank file."""

    def __init__(self, path: Path, rank: int, strings: StringTable) -> None:
        self.path = path
        self.rank = rank
        self.strings = strings
        self.builder = GraphBuilder(rank, strings)
        self._tensor_rows: dict[tuple, int] = {}
        self._checked: dict[tuple, tuple] = {}  # tensor keys checked (tensor_keys)

    # ---- tensors ----------------------------------------------------------------------
    def tensors_of(self, values: list, shapes: list, types: list) -> list[tuple[int, tuple[int, int], int]]:
        """Tensor rows in an IOInfo, with their (tensor_id, storage_id) key and bytes."""
        return self.rows_of(tensor_keys(self.path, values, shapes, types, self._checked))

    def rows_of(self, keys: list[tuple]) -> list[tuple[int, tuple[int, int], int]]:
        """(tensor row, (tensor_id, storage_id), bytes) of each tensor key of :func:`tensor_keys`,
        a row added for each key not seen before (rows in the order tensors are first met)."""
        out: list[tuple[int, tuple[int, int], int]] = []
        row_of = self._tensor_rows
        for key in keys:
            row = row_of.get(key)
            if row is None:
                row = self._new_tensor(key[:6], key[7], key[6][7:-1], key[6])
            out.append((row, (key[0], key[1]), key[3] * key[4]))
        return out

    def _new_tensor(self, tv: tuple, shp: tuple, dtype: str, tkey: str) -> int:
        tid, sid, off, numel, itemsize, dev = tv  # checked by tensor_keys
        if not all(type(x) is int for x in shp):
            shp = ()
        row = self.builder.add_tensor(
            shp, int(itemsize), dtype=dtype, device=dev, tensor_id=int(tid),
            storage_id=int(sid), offset=int(off), numel=int(numel),
        )
        self._tensor_rows[(*tv, tkey, shp)] = row
        return row
