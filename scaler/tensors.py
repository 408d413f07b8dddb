"""Changing tensor shapes in a rank graph: the tensor table and the ``inputs``/``outputs`` strings.

The PyTorch ET reader keeps every node's inputs and outputs twice: as rows of the rank's
:class:`~ettools.graph.TensorTable` (shape, element count) and as Chakra ``IOInfo`` strings
(``(values, shapes, types)`` written with ``str()``). A pass that changes shapes calls
:func:`apply_dims` with the new dimensions of every tensor row: element counts follow
(``numel × new/old``), and the strings of every node touching a changed tensor are rewritten
the way the reader wrote them, tensor by tensor in the reader's order, so the two stay equal.
"""

from __future__ import annotations

import ast
from dataclasses import replace

import numpy as np

from ettools.etvalues import walk_tensors
from ettools.graph import AttrColumn
from ettools.scaler.edit import Editor
from ettools.scaler.model import StepModel, storage_keys


def _rewrite(io: tuple[str, str, str], tensors: list[tuple[tuple[int, ...], int]]) -> tuple[str, str, str]:
    """``io`` with the k-th tensor given shape/numel ``tensors[k]``."""
    vals_s, shapes_s, types_s = io
    try:
        values = ast.literal_eval(vals_s)
        shapes = ast.literal_eval(shapes_s)
        types = ast.literal_eval(types_s)
    except (ValueError, SyntaxError):
        return io
    k = 0
    nt, ns = len(types), len(shapes)
    for i, v in enumerate(values):
        if type(v) is not list:
            continue
        t = types[i] if i < nt else ""
        if "Tensor" not in t:
            continue
        if t[:7] == "Tensor(" and len(v) == 6 and type(v[5]) is str:
            if k < len(tensors):
                shp, numel = tensors[k]
                v[3] = int(numel)
                if i < ns and type(shapes[i]) is list and len(shapes[i]) == len(shp):
                    shapes[i] = list(shp)
            k += 1
            continue
        found: list = []
        walk_tensors(v, shapes[i] if i < ns else None, found)
        for tv, sh in found:
            if k < len(tensors):
                shp, numel = tensors[k]
                tv[3] = int(numel)
                if type(sh) is list and len(sh) == len(shp) and all(type(x) is int for x in sh):
                    sh[:] = list(shp)
            k += 1
    return (str(values), str(shapes), types_s)


def apply_dims(ed: Editor, dims: np.ndarray) -> None:
    """Give ``ed``'s tensor table the dimensions ``dims`` (same layout as ``TensorTable.dims``)."""
    t = ed.tensors
    if not len(t):
        return
    dims = np.asarray(dims, np.int64)
    changed_dim = dims != t.dims
    if not changed_dim.any():
        return
    owner = np.repeat(np.arange(len(t)), np.diff(t.shape_ptr))
    changed = np.zeros(len(t), bool)
    changed[owner[changed_dim]] = True
    old_prod = np.ones(len(t), np.float64)
    new_prod = np.ones(len(t), np.float64)
    np.multiply.at(old_prod, owner, t.dims.astype(np.float64))
    np.multiply.at(new_prod, owner, dims.astype(np.float64))
    ratio = np.where(old_prod > 0, new_prod / np.maximum(old_prod, 1.0), 1.0)
    numel = np.where(changed, np.rint(t.numel * ratio), t.numel).astype(np.int64)
    new_t = replace(t, dims=dims, numel=numel)
    ed.tensors = new_t
    g = ed.g
    for side, ptr, lst in (("inputs", g.in_ptr, g.in_tensor), ("outputs", g.out_ptr, g.out_tensor)):
        col = ed.attrs_replaced.get(side) or g.attrs.get(side)
        if col is None or not len(lst):
            continue
        node_of = np.repeat(np.arange(len(g)), np.diff(ptr))
        touched = np.unique(node_of[changed[lst]])
        if not len(touched):
            continue
        pos = np.searchsorted(col.rows, touched)
        ok = (pos < len(col.rows)) & (col.rows[np.minimum(pos, len(col.rows) - 1)] == touched)
        values = list(col.values)
        for r, p in zip(touched[ok].tolist(), pos[ok].tolist()):
            ts = lst[ptr[r]:ptr[r + 1]]
            values[p] = _rewrite(values[p], [(new_t.shape(int(x)), int(numel[x])) for x in ts])
        ed.attrs_replaced[side] = AttrColumn(col.kind, col.rows, values)


def scale_tensors(ed: Editor, m: StepModel, row_f: np.ndarray, split_keys: np.ndarray, k: int,
                  prefer_first: np.ndarray | None = None, seq_lab: np.ndarray | None = None) -> None:
    """Divide by ``k`` the tensors produced by rows with factor ``1/k`` and the split parameters.

    Tensors of ``prefer_first`` rows (sequence-split activations) are divided along their sequence
    dimension (``seq_lab``: :func:`ettools.scaler.dims.label_dims` labels; without them the first
    divisible dimension of a tensor of two or more dimensions); one without it (a norm's weight
    gradient: a full-size partial sum) keeps its shape. Others are divided along their last
    divisible dimension (features, heads). Tensors with no divisible dimension keep their shape.
    """
    g = m.g
    t = ed.tensors
    if not len(t) or k <= 1:
        return
    n = len(g)
    tf = np.ones(len(t))
    first = np.zeros(len(t), bool)
    out_owner = np.repeat(np.arange(n), np.diff(g.out_ptr))
    np.minimum.at(tf, g.out_tensor, row_f[out_owner])
    if prefer_first is not None:
        hit = prefer_first[out_owner] & (row_f[out_owner] < 1.0)
        first[g.out_tensor[hit]] = True
    key = storage_keys(g)
    tf[np.isin(key, split_keys)] = 1.0 / k
    dims = t.dims.copy()
    for r in np.flatnonzero(tf < 1.0).tolist():
        a, b = int(t.shape_ptr[r]), int(t.shape_ptr[r + 1])
        if a == b:
            continue
        seg = dims[a:b]
        ok = (seg % k == 0) & (seg >= k)
        if first[r]:
            ok &= seq_lab[a:b] if seq_lab is not None else np.full(b - a, b - a >= 2)
        cand = np.flatnonzero(ok)
        if not len(cand):
            continue
        j = int(cand[0] if first[r] else cand[-1])
        seg[j] //= k
    apply_dims(ed, dims)


__all__ = ["apply_dims", "scale_tensors"]
