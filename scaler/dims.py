"""Which tensor dimensions carry a model dimension (batch, sequence, …): labels by propagation.

Rescaling a captured step means changing some dimension of many tensors, but only where it
stands for the dimension being scaled: in the sample GPT at batch 8, ``256`` is the token count
``32 × 8`` in ``[256, 64]`` (scales), the vocabulary in ``[64, 256]`` (does not) and both in
``[256, 256]`` (the first one does). :func:`label_dims` decides per tensor dimension by following
the data through the ops of the step, from **seeds**:

* ``batch`` / ``seq``: the data the step starts from — tensors the ``PRE`` phase produces
  (data loading, token ids, position ids) and tensors read by forward units that nothing in the
  step produced and that are not parameters (an input image, the targets) — labelled where a
  dimension equals the current value;
* any other named dimension: every tensor dimension equal to its current value, parameters
  included (growing ``hidden`` grows the weights).

then through every op that has tensor inputs and outputs, in execution order:

1. op rules: ``mm``/``addmm``/``bmm``/``matmul``/``linear`` (rows from the first operand,
   columns from the second, the contracted dimension dropped), ``t``/``transpose``/``permute``
   (dimensions moved as the op's integer arguments say), ``view``/``reshape``/``flatten``
   (dimensions grouped by equal running products; a merged group is labelled if any part was,
   a split group labels the part equal to the seed value);
2. an output with the shape of a labelled input takes its labels (element-wise ops, copies,
   in-place updates);
3. otherwise each input is aligned with the output from the right (broadcasting) and from the
   left (indexing, ``embedding``, ``unsqueeze``, reductions); an output dimension equal to an
   aligned labelled input dimension is labelled.

Labels only spread: a dimension once labelled stays labelled. Integer arguments other than
tensor shapes (a ``view``'s size list) are not rewritten.
"""

from __future__ import annotations

import ast
import re
from typing import Any

import numpy as np

from ettools.graph import RankGraph
from ettools.scaler.model import BWD, FWD, PRE, ScaleError, StepModel, storage_keys

_MM = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|_addmm_activation)$")
_MATMUL = re.compile(r"^aten::(matmul|linear)$")
_TRANSPOSE = re.compile(r"^aten::(t|transpose|transpose_|swapaxes|numpy_T)$")
_PERMUTE = re.compile(r"^aten::permute$")
_VIEW = re.compile(r"^aten::(view|reshape|_reshape_alias|_unsafe_view|flatten|unflatten|view_as|reshape_as)$")
_SDPA = re.compile(r"scaled_dot_product|flash_attention|efficient_attention")
_RECV = re.compile(r"^c10d::recv|^gloo:recv|^nccl:recv|^recv_act")
_CONV = re.compile(r"^aten::(conv\w*|convolution|_convolution|cudnn_convolution\w*)$")


class DimLabels:
    """Per tensor-table dimension entry: does it carry the dimension (``lab``, aligned with ``TensorTable.dims``)."""

    def __init__(self, g: RankGraph, lab: np.ndarray, value: int) -> None:
        self.g = g
        self.lab = lab
        self.value = value

    def of(self, t: int) -> np.ndarray:
        """Labels of tensor row ``t``'s dimensions."""
        p = self.g.tensors.shape_ptr
        return self.lab[p[t]:p[t + 1]]


def _args(g: RankGraph, row: int) -> list[Any]:
    col = g.attrs.get("inputs")
    if col is None:
        return []
    v = col.get(row)
    if not v:
        return []
    try:
        return ast.literal_eval(v[0])
    except (ValueError, SyntaxError):
        return []


def _name_hits(g: RankGraph, pattern: re.Pattern) -> np.ndarray:
    """Rows whose name matches ``pattern`` (one search per distinct name)."""
    uniq, inv = np.unique(g.name, return_inverse=True)
    hit = np.array([u >= 0 and bool(pattern.search(g.strings[int(u)])) for u in uniq], bool)
    return hit[inv] if len(uniq) else np.zeros(0, bool)


def infer_dims(m: StepModel) -> dict[str, int]:
    """Current ``batch`` (and ``seq`` where attention shows it) of a step, from its ops' shapes.

    Attention (``scaled_dot_product_attention`` query ``[batch, heads, seq, head_dim]``) gives
    both; else the first convolution's input ``[batch, C, …]``; else the first forward GEMM's
    input's first dimension. Empty when the trace has no tensors.
    """
    g = m.g
    t = g.tensors
    if not len(t):
        return {}
    names = g.strings
    fw = m.units[np.isin(m.phase[m.units], (FWD,))]
    rows = np.flatnonzero(np.isin(m.unit, fw) & (np.diff(g.in_ptr) > 0))
    rows = rows[np.lexsort((m.depth[rows], g.start[rows]))] if np.isfinite(g.start[rows]).all() else rows
    nm = [names[int(i)] for i in g.name[rows]]
    for r, s in zip(rows.tolist(), nm):
        if _SDPA.search(s):
            q = g.inputs_of(r)
            if len(q):
                shp = t.shape(int(q[0]))
                if len(shp) == 4:
                    return {"batch": int(shp[0]), "seq": int(shp[2])}
    for r, s in zip(rows.tolist(), nm):
        if _CONV.match(s):
            q = g.inputs_of(r)
            if len(q) and len(t.shape(int(q[0]))) >= 3:
                return {"batch": int(t.shape(int(q[0]))[0])}
    for r, s in zip(rows.tolist(), nm):
        if _MM.match(s) or _MATMUL.match(s):
            q = g.inputs_of(r)
            if len(q) and len(t.shape(int(q[0]))) >= 2:
                return {"batch": int(t.shape(int(q[0]))[0])}
    return {}


def label_dims(m: StepModel, name: str, value: int) -> DimLabels:
    """Labels of every tensor dimension that carries model dimension ``name`` of current size ``value``."""
    g = m.g
    t = g.tensors
    if not len(t):
        raise ScaleError(f"rank {g.rank}: rescaling '{name}' needs tensor shapes (a PyTorch ET, or ET+Kineto)")
    dims = t.dims
    ptr = t.shape_ptr
    owner = np.repeat(np.arange(len(t)), np.diff(ptr))
    lab = np.zeros(len(dims), bool)
    n = len(g)
    key = storage_keys(g)
    is_param = np.isin(key, m.param_storage)
    in_owner = np.repeat(np.arange(n), np.diff(g.in_ptr))
    out_owner = np.repeat(np.arange(n), np.diff(g.out_ptr))
    if name in ("batch", "seq"):
        produced = np.zeros(len(t), bool)
        produced[g.out_tensor] = True
        pre_out = np.zeros(len(t), bool)
        pre_out[g.out_tensor[m.phase[out_owner] == PRE]] = True
        fw_in = np.zeros(len(t), bool)
        fw_in[g.in_tensor[np.isin(m.phase[in_owner], (PRE, FWD))]] = True
        # tensors a pipeline stage receives are data too
        recv_out = np.zeros(len(t), bool)
        is_recv = _name_hits(g, _RECV)
        recv_out[g.out_tensor[is_recv[out_owner]]] = True
        recv_out[g.in_tensor[is_recv[in_owner]]] = True  # recv_ fills the buffer it is given
        seed_t = (pre_out | (fw_in & ~produced) | recv_out) & ~is_param
    else:
        seed_t = np.ones(len(t), bool)
    lab[:] = seed_t[owner] & (dims == value)
    if not lab.any():
        raise ScaleError(f"rank {g.rank}: no input tensor has a dimension of size {value} for '{name}'")
    # propagate in execution order (parents before their children)
    rows = np.flatnonzero((np.diff(g.in_ptr) > 0) & (np.diff(g.out_ptr) > 0))
    if np.isfinite(g.start[rows]).all():
        rows = rows[np.lexsort((m.depth[rows], g.id[rows], g.start[rows]))]
    else:
        rows = rows[np.argsort(g.id[rows], kind="stable")]
    names = g.strings
    shape = t.shape
    dl = dims.tolist()
    pl = ptr.tolist()

    def labs(x: int) -> list[bool]:
        return lab[pl[x]:pl[x + 1]].tolist()

    def shp(x: int) -> list[int]:
        return dl[pl[x]:pl[x + 1]]

    # saved activations: tensor rows only ever read, first in backward (unpacked saved tensors)
    produced_any = np.zeros(len(t), bool)
    produced_any[g.out_tensor] = True
    read_bwd = np.zeros(len(t), bool)
    read_bwd[g.in_tensor[m.phase[in_owner] == BWD]] = True
    read_early = np.zeros(len(t), bool)
    read_early[g.in_tensor[np.isin(m.phase[in_owner], (PRE, FWD))]] = True
    saved = read_bwd & ~produced_any & ~read_early & ~is_param
    parent = m.parent
    out_sets: dict[int, set[int]] = {}

    def outs_of(r: int) -> set[int]:
        s = out_sets.get(r)
        if s is None:
            s = out_sets[r] = set(g.out_tensor[g.out_ptr[r]:g.out_ptr[r + 1]].tolist())
        return s

    def from_ancestor(r: int, o: int) -> bool:
        # an output an enclosing op also returns: that op's rule decides it (its implementation,
        # e.g. as_strided inside transpose, says nothing about which dimension is which)
        p = int(parent[r])
        while p >= 0:
            if o in outs_of(p):
                return True
            p = int(parent[p])
        return False

    view_rows: list[int] = []
    for sweep in range(2):  # a second sweep catches tensors labelled late (in-place chains, nested ops)
        for r in rows.tolist():
            ins = g.in_tensor[g.in_ptr[r]:g.in_ptr[r + 1]].tolist()
            op = names[int(g.name[r])]
            if sweep == 0 and (_VIEW.match(op) or _TRANSPOSE.match(op) or _PERMUTE.match(op)):
                view_rows.append(r)
            if not any(lab[pl[x]:pl[x + 1]].any() for x in ins):
                continue
            outs = g.out_tensor[g.out_ptr[r]:g.out_ptr[r + 1]].tolist()
            for o in outs:
                so = shp(o)
                if not so or is_param[o] or from_ancestor(r, o):
                    continue
                new = _rule(g, r, op, ins, o, so, shp, labs, value)
                if new is not None and any(new):
                    cur = lab[pl[o]:pl[o + 1]]
                    lab[pl[o]:pl[o + 1]] = cur | np.asarray(new, bool)
        # a saved tensor unpacked in backward is a new tensor row over the forward tensor's storage
        _alias_by_storage(t, key, lab, owner, saved)
        # views whose output is labelled label their input (buffers allocated inside an op, then viewed)
        for r in view_rows:
            ins = [x for x in g.in_tensor[g.in_ptr[r]:g.in_ptr[r + 1]].tolist() if shp(x)]
            outs = g.out_tensor[g.out_ptr[r]:g.out_ptr[r + 1]].tolist()
            if not ins or not outs or is_param[ins[0]]:
                continue
            a, o = ins[0], outs[0]
            if not lab[pl[o]:pl[o + 1]].any() or lab[pl[a]:pl[a + 1]].any():
                continue
            op = names[int(g.name[r])]
            back = _reverse(g, r, op, shp(a), shp(o), labs(o), value)
            if back is not None:
                lab[pl[a]:pl[a + 1]] = np.asarray(back, bool)
    del shape
    return DimLabels(g, lab, value)


def _rule(g: RankGraph, r: int, op: str, ins: list[int], o: int, so: list[int], shp, labs, value: int) -> list[bool] | None:
    """Labels of output ``o`` of row ``r`` (see the module docstring), or None."""
    k = len(so)
    tens = [x for x in ins if shp(x)]
    if _MM.match(op):
        ops = tens[-2:] if len(tens) >= 2 else tens
        if len(ops) == 2:
            a, b = shp(ops[0]), shp(ops[1])
            la, lb = labs(ops[0]), labs(ops[1])
            if len(a) == 2 and len(b) == 2 and k == 2:
                return [la[0], lb[1]]
            if len(a) == 3 and len(b) == 3 and k == 3:
                return [la[0] or lb[0], la[1], lb[2]]
    if _MATMUL.match(op) and len(tens) >= 2:
        a = shp(tens[0])
        la, lw = labs(tens[0]), labs(tens[1])
        if len(a) == k and len(a) >= 1:
            last = lw[0] if op.endswith("linear") else (lw[-1] if lw else False)
            return la[:-1] + [last]
    if _TRANSPOSE.match(op) and tens:
        a, la = shp(tens[0]), labs(tens[0])
        if len(a) == k:
            if op == "aten::t" or op == "aten::numpy_T":
                return la[::-1] if k <= 2 else None
            args = _args(g, r)
            if len(args) >= 3 and isinstance(args[1], int) and isinstance(args[2], int):
                d0, d1 = args[1] % k, args[2] % k
                out = list(la)
                out[d0], out[d1] = la[d1], la[d0]
                return out
            return None
    if _PERMUTE.match(op) and tens:
        a, la = shp(tens[0]), labs(tens[0])
        args = _args(g, r)
        if len(args) >= 2 and isinstance(args[1], list) and len(args[1]) == k == len(a):
            return [la[int(d) % k] for d in args[1]]
        return None
    if _VIEW.match(op) and tens:
        a, la = shp(tens[0]), labs(tens[0])
        if int(np.prod(a)) == int(np.prod(so)):
            return _regroup(a, la, so, value)
        return None
    # same shape as a labelled input
    for x in tens:
        if shp(x) == so and any(labs(x)):
            return labs(x)
    # aligned matches
    out = [False] * k
    for x in tens:
        a, la = shp(x), labs(x)
        if not any(la):
            continue
        n = len(a)
        for j in range(k):
            i = n - k + j  # right alignment
            if 0 <= i < n and la[i] and a[i] == so[j]:
                out[j] = True
            if j < n and la[j] and a[j] == so[j]:  # left alignment
                out[j] = True
    return out


def _alias_by_storage(t, key: np.ndarray, lab: np.ndarray, owner: np.ndarray, only: np.ndarray) -> None:
    """Unlabelled tensor rows in ``only`` take the labels of a labelled row with the same storage, offset and shape."""
    has = np.zeros(len(t), bool)
    has[owner[lab]] = True
    known: dict[tuple, np.ndarray] = {}
    for r in np.flatnonzero(has).tolist():
        known.setdefault((int(key[r]), int(t.offset[r]), t.shape(r)), lab[t.shape_ptr[r]:t.shape_ptr[r + 1]].copy())
    for r in np.flatnonzero(~has & only).tolist():
        hit = known.get((int(key[r]), int(t.offset[r]), t.shape(r)))
        if hit is not None:
            lab[t.shape_ptr[r]:t.shape_ptr[r + 1]] = hit


def _reverse(g: RankGraph, r: int, op: str, a: list[int], o: list[int], lo: list[bool], value: int) -> list[bool] | None:
    """Labels of the input of a view/transpose/permute from its labelled output."""
    k = len(a)
    if _VIEW.match(op):
        return _regroup(o, lo, a, value) if int(np.prod(a)) == int(np.prod(o)) else None
    if len(o) != k:
        return None
    if op in ("aten::t", "aten::numpy_T"):
        return lo[::-1] if k <= 2 else None
    args = _args(g, r)
    if _TRANSPOSE.match(op) and len(args) >= 3 and isinstance(args[1], int) and isinstance(args[2], int):
        d0, d1 = args[1] % k, args[2] % k
        out = list(lo)
        out[d0], out[d1] = lo[d1], lo[d0]
        return out
    if _PERMUTE.match(op) and len(args) >= 2 and isinstance(args[1], list) and len(args[1]) == k:
        out = [False] * k
        for j, d in enumerate(args[1]):
            out[int(d) % k] = lo[j]
        return out
    return None


def _regroup(a: list[int], la: list[bool], b: list[int], value: int) -> list[bool]:
    """Labels of a view ``a → b``: dimensions grouped by equal running products."""
    out = [False] * len(b)
    i = j = 0
    while i < len(a) or j < len(b):
        gi, gj = [], []
        pa = pb = 1
        if i < len(a):
            pa *= a[i]
            gi.append(i)
            i += 1
        if j < len(b):
            pb *= b[j]
            gj.append(j)
            j += 1
        while pa != pb and (i < len(a) or j < len(b)):
            if pa < pb and i < len(a):
                pa *= a[i]
                gi.append(i)
                i += 1
            elif j < len(b):
                pb *= b[j]
                gj.append(j)
                j += 1
            else:
                pa *= a[i]
                gi.append(i)
                i += 1
        # size-1 dims join the group they sit next to without carrying anything
        if not any(la[x] for x in gi):
            continue
        if len(gj) == 1:
            out[gj[0]] = True
            continue
        hit = [y for y in gj if b[y] == value]
        if not hit:
            hit = [y for y in gj if b[y] % value == 0 and b[y] > 1]
        if hit:
            out[hit[0]] = True
    return out


__all__ = ["DimLabels", "infer_dims", "label_dims"]
