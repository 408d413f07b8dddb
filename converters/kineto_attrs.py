"""The per-node attributes of a Kineto rank (the contract with the ET linker and the compute
model): ``cat``, ``ext_id``, ``rf_id``, ``seq``, ``correlation``, kernel ``grid``/``block``,
the operands (``inputs``) of ops recorded with shapes, and the ``tensor_size`` of copies and sets.
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from ettools.converters.kineto_blocks import HUGE, operand_value
from ettools.converters.kineto_events import (
    ABSENT,
    ANNOT,
    CPU_OP,
    KERNEL,
    MEMCPY,
    MEMSET,
    _pick,
    arg_values,
    class_mask,
    int_column,
)
from ettools.converters.kineto_rank import _Rank

_ABSENT = ABSENT  # sentinel for a missing integer arg
_OP_OR_ANNOT = class_mask((CPU_OP, ANNOT))
_COPY_OR_SET = class_mask((MEMCPY, MEMSET))
_int_column = int_column


def _attributes(r: _Rank) -> None:
    """The contract attributes cat/ext_id/rf_id/correlation/seq, and tensor_size of copies."""
    n = r.n
    e = r.e
    r.set_attr("cat", "string_val", np.arange(n), e.pick_cat(r.order))
    ids = e.int_arg("External id", r.order)
    rows = np.flatnonzero(ids != _ABSENT)
    r.set_attr("ext_id", "int64_val", rows, ids[rows].tolist())
    host = np.flatnonzero(_OP_OR_ANNOT[r.cls])
    rf = e.int_arg("Record function id", r.order[host])
    ok = (rf != 0) & (rf != _ABSENT)
    r.set_attr("rf_id", "int64_val", host[ok], rf[ok].tolist())
    sq = e.int_arg("Sequence number", r.order[host])
    ok = sq != _ABSENT
    r.set_attr("seq", "int64_val", host[ok], sq[ok].tolist())
    rows = np.flatnonzero(r.corr != _ABSENT)
    r.set_attr("correlation", "int64_val", rows, r.corr[rows].tolist())
    # launch geometry of kernels: what the calibrated compute model keys on
    kern = np.flatnonzero(r.cls == KERNEL)
    geom = e.kernel_geom
    if geom:  # read by the block reader: kernel k of the file is entry k
        at = (np.cumsum(e.cls == KERNEL) - 1)[r.order[kern]]
        grid, block = _pick(geom["grid"], at), _pick(geom["block"], at)
    else:
        ka = e.pick("args", r.order[kern])
        grid = arg_values(ka, "grid", None)
        block = arg_values(ka, "block", None)
    ok = np.fromiter(map(list.__instancecheck__, grid), bool, len(grid))
    ok &= np.fromiter(map(list.__instancecheck__, block), bool, len(block))
    if ok.any():
        sel = np.flatnonzero(ok)
        rows = kern[sel]
        gl, bl = _pick(grid, sel), _pick(block, sel)
        if not geom.get("int_only") and not set(map(type, chain.from_iterable(gl))) | set(
                map(type, chain.from_iterable(bl))) <= {int}:
            # numbers other than ints (the usual [x, y, z] of ints is kept as read)
            try:
                gl = np.asarray(gl, np.int64).tolist()
                bl = np.asarray(bl, np.int64).tolist()
            except (TypeError, ValueError, OverflowError):
                gl = [[int(x) for x in g] for g in gl]
                bl = [[int(x) for x in b] for b in bl]
        r.set_attr("grid", "int64_list", rows, gl)
        r.set_attr("block", "int64_list", rows, bl)
    _operand_shapes(r)
    cp = np.flatnonzero(_COPY_OR_SET[r.cls])
    r.tensor_size = np.full(n, -1, np.int64)
    if len(cp):
        b = _int_column(arg_values(e.pick("args", r.order[cp]), "bytes", _ABSENT))
        r.tensor_size[cp] = np.where(b == _ABSENT, -1, b)


def _operand_shapes(r: _Rank) -> None:
    """``inputs`` (Chakra ``IOInfo``: values, shapes, types) of the host ops recorded with shapes:
    ``Concrete Inputs``, ``Input Dims`` and ``Input type`` as JSON text. A compute model reads the
    work of each kernel off its launching op's operands (another GPU's time, a what-if)."""
    ops = np.flatnonzero(r.cls == CPU_OP)
    if not len(ops):
        return
    e = r.e
    if e.operands is not None:  # read by the block reader (operand_value of each op's args)
        vals = list(map(e.operands.get, r.order[ops].tolist()))
    else:
        vals = list(map(operand_value, e.pick("args", r.order[ops])))
    sel = [k for k, v in enumerate(vals) if v is not None]
    if not sel:
        return
    # operands no device holds (a dimension past 2^40, a tensor past 2^50 elements): not used as
    # shapes, counted (they would size FLOPs and bytes of the op's kernels)
    huge = sum(1 for k in sel if vals[k] is HUGE)
    if huge:
        r.meta["implausible_operands"] = huge
    keep = [k for k in sel if vals[k] is not HUGE and vals[k][1]]
    if keep:
        r.set_attr("inputs", "io", ops[keep], [vals[k] for k in keep])
