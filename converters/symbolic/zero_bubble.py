"""Zero-bubble pipelining's split of a module's backward program (Qi et al., "Zero Bubble
Pipeline Parallelism", ICLR 2024): ``B`` computes the input gradients (on the pipeline's critical
path), ``W`` the weight gradients (``matmul.wgrad`` nodes and whatever consumes them), which the
schedule defers into the bubbles. ``W`` reads what ``B`` computed through ports ``bw:<row>``."""

from __future__ import annotations

from typing import Any

import numpy as np

from ettools.graph import StringTable

WGRAD_PREFIX = "matmul.wgrad"


def split_weight_grads(prog: Any, strings: StringTable) -> tuple[Any, Any]:
    """``(B, W)`` programs of the backward program ``prog``: W holds the weight-gradient GEMMs and
    their descendants in ``prog``; an edge from B into W becomes W's import ``bw:<B row>``, which B
    exports. An export whose rows all lie in one part stays with that part; the others are split."""
    names = strings.decode(prog.cols["name"])
    in_w = np.array([n.startswith(WGRAD_PREFIX) for n in names], bool)
    # descendants of a weight gradient (its accumulation, casts of it) belong to W too
    changed = True
    while changed:
        add = in_w[prog.e_src] & ~in_w[prog.e_dst]
        changed = bool(add.any())
        in_w[prog.e_dst[add]] = True
    if not in_w.any():
        return prog, _empty(prog)
    b_rows, w_rows = np.flatnonzero(~in_w), np.flatnonzero(in_w)
    new = np.full(prog.n, -1, np.int64)
    new[b_rows] = np.arange(len(b_rows))
    new[w_rows] = np.arange(len(w_rows))
    bb = ~in_w[prog.e_src] & ~in_w[prog.e_dst]
    ww = in_w[prog.e_src] & in_w[prog.e_dst]
    cross = ~in_w[prog.e_src] & in_w[prog.e_dst]
    if (in_w[prog.e_src] & ~in_w[prog.e_dst]).any():
        raise ValueError(f"{prog.key}: a weight gradient feeds an input gradient; the backward cannot be split")
    b_imp: dict[str, np.ndarray] = {}
    w_imp: dict[str, np.ndarray] = {}
    for port, rows in prog.imports.items():
        rb, rw = rows[~in_w[rows]], rows[in_w[rows]]
        if len(rb):
            b_imp[port] = new[rb]
        if len(rw):
            w_imp[port] = new[rw]
    b_exp: dict[str, tuple[np.ndarray, tuple[str, ...]]] = {}
    w_exp: dict[str, tuple[np.ndarray, tuple[str, ...]]] = {}
    for port, (rows, through) in prog.exports.items():
        rb, rw = rows[~in_w[rows]], rows[in_w[rows]]
        if len(rw):
            w_exp[port] = (new[rw], ())
        if len(rb) or through or not len(rw):
            b_exp[port] = (new[rb], through)
    for s in np.unique(prog.e_src[cross]):
        port = f"bw:{int(new[s])}"
        b_exp[port] = (np.array([new[s]], np.int64), ())
        w_imp[port] = new[prog.e_dst[cross & (prog.e_src == s)]]
    compiled = type(prog)  # .compiled's Compiled, taken from the program (this module imports none)
    b = compiled(f"{prog.key}:B", len(b_rows), {k: v[b_rows] for k, v in prog.cols.items()},
                 new[prog.e_src[bb]], new[prog.e_dst[bb]], b_imp, b_exp, prog.saved_bytes, prog.param_bytes,
                 prog.grad_bytes, prog.cache_bytes, prog.model_flops)
    # the weight-gradient GEMMs depend on B's outputs only, not on each other: chained in their
    # order, so the whole W half runs where the schedule puts it (the schedule chains only an
    # instance's first node), not as soon as B has produced its inputs
    seq = np.arange(len(w_rows) - 1, dtype=np.int64)
    w = compiled(f"{prog.key}:W", len(w_rows), {k: v[w_rows] for k, v in prog.cols.items()},
                 np.concatenate([new[prog.e_src[ww]], seq]), np.concatenate([new[prog.e_dst[ww]], seq + 1]),
                 w_imp, w_exp)
    return b, w


def _empty(prog: Any) -> Any:
    z = np.zeros(0, np.int64)
    return type(prog)(f"{prog.key}:W", 0, {k: v[:0] for k, v in prog.cols.items()}, z, z, {}, {})
