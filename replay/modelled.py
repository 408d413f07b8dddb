"""Times for ops that never ran: device ops described by their operands, collectives by their
sizes, timed on a GPU's op models and network (used by emulated capture).

:func:`device_op_times` gives each op the time the target GPU's op model predicts from its shape
(:func:`.opfeatures.op_features`: GEMM m·n·k, attention, convolution, the bytes a memory-bound op
moves), the model of the GPU itself where it has a fit, else another GPU's fit moved to it
(:func:`.opregistry.op_models_for`). An op whose class no model has, or whose operands say nothing
(``how == "floor"``), gets the floor of the memory-bound class: the cost of a launch that does
almost nothing. :func:`collective_times` times collectives and send/recv on the network the
hardware preset implies (:func:`.network.default_network`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .devices import Hardware
from .opfeatures import MEM_KINDS, MEMORY, OTHER, dominant_float_type, op_features
from .opregistry import op_models_for
from .retime import _DT_GROUP, _terms

BY_SHAPE, FLOOR = "by shape", "floor"
_KEYS = ("flops", "nbytes", "m", "n", "k", "batch", "hdim")


def device_op_times(ops: list[tuple[str, list[Any], list[Any], list[Any]]], hw: Hardware
                    ) -> tuple[np.ndarray, list[str]]:
    """µs per op ``(name, dims, types, concrete)`` on ``hw``, and how each was timed."""
    n = len(ops)
    cols: dict[str, np.ndarray] = {
        "cls": np.full(n, OTHER, np.int8), "kind": np.full(n, -1, np.int8), "dtype": np.full(n, "half", object),
        "flops": np.full(n, -1.0), "nbytes": np.full(n, -1.0), "kernels": np.ones(n), "m": np.full(n, -1.0),
        "n": np.full(n, -1.0), "k": np.full(n, -1.0), "batch": np.full(n, -1.0), "hdim": np.full(n, -1.0),
        "causal": np.zeros(n, np.int8)}
    cache: dict[str, Any] = {}
    list_type = dominant_float_type(types for _, _, types, _ in ops)  # TensorList elements: no dtype recorded
    for i, (name, dims, types, conc) in enumerate(ops):
        key = repr((name, dims, types, conc))
        f = cache.get(key)
        if f is None:
            f = cache[key] = op_features(name, dims, types, conc, list_type)
        if f.cls == OTHER or f.nbytes <= 0:
            continue
        cols["cls"][i] = f.cls
        cols["kind"][i] = f.kind if f.cls == MEMORY else -1
        cols["dtype"][i] = _DT_GROUP.get(f.dtype, f.dtype)
        for k in _KEYS:
            cols[k][i] = getattr(f, k)
        cols["causal"][i] = max(int(f.causal), 0)
    own, moved = op_models_for(hw)
    models = tuple(m for m in (own, moved) if m is not None)
    floor, total = _terms(models, cols) if models else (np.full(n, np.nan), np.full(n, np.nan))
    how = [BY_SHAPE] * n
    bad = ~np.isfinite(total)
    if bad.any():
        # a launch that does nearly nothing: the memory-bound class at one byte
        ref = {k: v[bad].copy() for k, v in cols.items()}
        ref["cls"][:] = MEMORY
        ref["kind"][:] = MEM_KINDS.index("copy")
        ref["nbytes"][:] = 1.0
        ref["flops"][:] = 0.0
        for k in ("m", "n", "k", "batch", "hdim"):
            ref[k][:] = -1.0
        fl, tot = _terms(models, ref) if models else (np.full(int(bad.sum()), np.nan),) * 2
        total[bad] = np.where(np.isfinite(tot), tot, 2.0)
        for i in np.flatnonzero(bad).tolist():
            how[i] = FLOOR
    return np.maximum(total, 0.0), how


def collective_times(colls: list[dict[str, Any]], hw: Hardware, world: int) -> np.ndarray:
    """µs per collective (``coll``, ``comm_type`` (Chakra's collective enum), ``in_nelems`` /
    ``out_nelems``, ``elem_bytes``, ``ranks``, ``self``, ``peer``) on the network the preset ``hw``
    implies for ``world`` ranks."""
    from .network import default_network

    if not colls:
        return np.zeros(0)
    net = default_network(max(world, max((max(c["ranks"]) + 1 for c in colls if c.get("ranks")), default=1)), hw)
    out = np.zeros(len(colls))
    for i, c in enumerate(colls):
        # Chakra's comm_size: the per-rank input (all-gather: one rank's part; reduce-scatter: the
        # whole input; all-reduce: the buffer); a receive has only its output
        n_in, n_out = int(c.get("in_nelems", 0)), int(c.get("out_nelems", 0))
        nbytes = (n_in if n_in > 0 else n_out) * int(c.get("elem_bytes", 2))
        ranks = tuple(c.get("ranks") or ())
        if c["coll"] in ("send", "recv"):
            me = int(c.get("self", ranks[0] if ranks else 0))
            peer = c.get("peer")
            if peer is None or peer == me:
                continue
            src, dst = (me, int(peer)) if c["coll"] == "send" else (int(peer), me)
            out[i] = net.send_time(src, dst, nbytes) / 1e3
            continue
        if c.get("comm_type") is None or len(ranks) <= 1 or nbytes <= 0:
            continue
        out[i] = net.collective_time(int(c["comm_type"]), nbytes, ranks) / 1e3
    return out
