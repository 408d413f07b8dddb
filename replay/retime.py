"""Re-timing a measured trace for another GPU: every device op of the source trace gets the time
the target GPU would take, anchored on what the source GPU measured.

Each device kernel is timed by the op models (:mod:`.opmodel`) of both GPUs — the shipped fit of
each, or another GPU's fit moved to it (:func:`.opregistry.op_models_for`) — split into its terms:
the per-kernel floor (launch to finish of a kernel that does nearly nothing) and the work above it
(FLOPs at the achieved rate, bytes at the achieved bandwidth). The measured time is split the same
way — the floor is paid in full, the rest is work — and each part moves by the ratio of the two
models' terms: ``t' = min(t, a_s)·a_t/a_s + (t − min(t, a_s))·w_t/w_s``. Anchoring on the
measurement keeps what the models share (a kernel slower than its shape suggests stays slower) and
moves only what differs between the GPUs.

How a kernel's terms are found (``how``):

* **by shape** — the host op that launched it recorded its operands (Kineto ``Input Dims`` /
  ``Input type`` / ``Concrete Inputs``, kept as the op's ``inputs``): GEMM m·n·k, attention
  batch·heads·queries·keys, convolution output, the bytes a memory-bound op moves, and the dtype.
  Used when the kernel does what its op does (its name classifies as the op's class; a kernel
  whose name says nothing takes its op's class). A copy or memset with its byte count is timed
  by shape too.
* **by class transfer** — no operands (a device-only trace, an op recorded without shapes, a
  helper kernel of another class than its op): the class is read off the kernel name (GEMM,
  attention, convolution, memory-bound of a kind), the dtype off its name tokens, and the two
  models' terms of that class at a reference size give the ratios.
* **kept** — neither model has a fit for its class: the measured time stays, and the op is named
  in the report.

Collectives and send/recv are not compute: the network model times them (see the replay).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ettools.classify import classify
from ettools.graph import COMM_NODE_TYPES, EdgeKind, RankGraph

from .devices import Hardware
from .opfeatures import (
    ATTENTION,
    CONV,
    EMBEDDING,
    GEMM,
    MEM_KINDS,
    MEMORY,
    OTHER,
    dominant_float_type,
    op_features,
)

NOT_DEVICE, BY_SHAPE, BY_CLASS, KEPT = range(4)
HOW = ("not a device op", "by shape", "by class transfer", "kept as measured")

_DT_GROUP = {"bf16": "half", "fp16": "half", "fp32": "fp32", "tf32": "tf32", "int8": "int8", "fp8": "int8"}
_NAME_DTYPE = [(re.compile(p, re.IGNORECASE), d) for p, d in (
    (r"e4m3|e5m2|fp8|f8f8|_f8_|mxe2m1|fp4", "int8"), (r"bf16|bfloat16|__nv_bfloat16|_bf_", "half"),
    (r"f16|fp16|half|hgemm|h1688|h16816|_hh_", "half"), (r"tf32|1688gemm_tf32|xf32", "tf32"),
    (r"sgemm|fp32|float|_ss_|s1688|_sss_", "fp32"))]
_KERNEL_KIND = [(re.compile(p, re.IGNORECASE), k) for p, k in (
    (r"norm|moments|gammabeta", "norm"), (r"softmax|cross_entropy|nll_loss", "softmax"),
    (r"reduce|sum_kernel|mean_kernel|argmax|max_kernel|histogram", "reduction"),
    (r"copy|memcpy|memset|fill|cat_?array|transpose|permute|reshape_and_cache", "copy"),
    (r"multi_tensor|adam|sgd|optimizer", "optimizer"),
    (r"index|gather|scatter|embedding|sort|topk|routing", "index"), (r"triton", "fused"))]


def kernel_dtype(name: str, default: str = "half") -> str:
    """Dtype group (``half``, ``fp32``, ``tf32``, ``int8``) a kernel name shows, else ``default``."""
    for rx, d in _NAME_DTYPE:
        if rx.search(name):
            return d
    return default


def kernel_class(name: str) -> tuple[int, int]:
    """``(op-model class, memory kind or -1)`` of a device kernel from its name (communication:
    ``(-1, -1)``): GEMM, attention and convolution kernels by :func:`ettools.classify.classify`,
    everything else memory-bound, its kind from the name."""
    c = classify(name)
    if c == "Communication":
        return -1, -1
    if c == "GeMM":
        conv = re.search(r"conv|dgrad|wgrad|winograd|implicit_gemm|scudnn|im2col|fft2d|^igemm_", name, re.IGNORECASE)
        return (CONV if conv else GEMM), -1
    if c == "Attention":
        return ATTENTION, -1
    for rx, k in _KERNEL_KIND:
        if rx.search(name):
            return MEMORY, MEM_KINDS.index(k)
    return MEMORY, MEM_KINDS.index("elementwise")


@dataclass
class Retiming:
    """Re-timed durations of one rank graph for another GPU (see the module doc)."""

    source: str
    target: str
    dur: np.ndarray  # per node: the re-timed duration (the measured one where not re-timed)
    how: np.ndarray  # per node: NOT_DEVICE, BY_SHAPE, BY_CLASS or KEPT
    measured: np.ndarray  # per node: the source GPU's measured duration
    kept_names: dict[str, float] = field(default_factory=dict)  # kept op name -> measured µs

    def summary(self) -> dict[str, Any]:
        """Shares of the source's measured device time re-timed by shape, by class transfer and
        kept, the device time before and after, and the kept ops (largest first)."""
        dev = self.how != NOT_DEVICE
        total = float(self.measured[dev].sum())
        by = {HOW[h]: float(self.measured[self.how == h].sum()) for h in (BY_SHAPE, BY_CLASS, KEPT)}
        return {"from": self.source, "to": self.target, "device_ops": int(dev.sum()),
                "device_us_measured": total, "device_us_retimed": float(self.dur[dev].sum()),
                "share_of_device_time": {k: (v / total if total else 0.0) for k, v in by.items()},
                "ops": {HOW[h]: int((self.how == h).sum()) for h in (BY_SHAPE, BY_CLASS, KEPT)},
                "kept_ops": dict(sorted(self.kept_names.items(), key=lambda kv: (-kv[1], kv[0]))[:20])}


def _parents(g: RankGraph) -> tuple[np.ndarray, np.ndarray]:
    """``(nest parent, launcher)`` per node (-1 where none)."""
    n = len(g)
    src, dst, kind = g.edge_rows()
    parent = np.full(n, -1, np.int64)
    launcher = np.full(n, -1, np.int64)
    ok = src >= 0
    sel = ok & (kind == EdgeKind.NEST)
    parent[dst[sel]] = src[sel]
    sel = ok & (kind == EdgeKind.LAUNCH)
    launcher[dst[sel]] = src[sel]
    return parent, launcher


def _parse(text: Any) -> Any:
    if not isinstance(text, str) or not text:
        return None
    import orjson

    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        import ast

        try:  # the PyTorch ET reader keeps Python's str() of its lists
            return ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None


def launching_op(g: RankGraph, rows: np.ndarray) -> np.ndarray:
    """For each of ``rows`` (device ops), the innermost host op with recorded operands (``inputs``)
    that encloses the call that launched it; -1 where there is none."""
    col = g.attrs.get("inputs")
    out = np.full(len(rows), -1, np.int64)
    if col is None or not len(col.rows):
        return out
    has = np.zeros(len(g), bool)
    has[np.asarray(col.rows)] = True
    parent, launcher = _parents(g)
    cur = launcher[rows]
    for _ in range(64):  # up the nesting from the launch call to the first op with operands
        live = (cur >= 0) & (out < 0)
        if not live.any():
            break
        hit = live & has[np.maximum(cur, 0)]
        out[hit] = cur[hit]
        cur = np.where(live & ~hit, parent[np.maximum(cur, 0)], -1)
    return out


def device_op_columns(g: RankGraph, rows: np.ndarray, default_dtype: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Op-model columns (:meth:`.opmodel.OpModel.predict`) of device ops ``rows`` and whether each
    is described by shape (its launching op's operands, or a copy's byte count)."""
    n = len(rows)
    cols: dict[str, np.ndarray] = {
        "cls": np.full(n, OTHER, np.int8), "kind": np.full(n, -1, np.int8), "dtype": np.full(n, default_dtype, object),
        "flops": np.full(n, -1.0), "nbytes": np.full(n, -1.0), "kernels": np.ones(n), "m": np.full(n, -1.0),
        "n": np.full(n, -1.0), "k": np.full(n, -1.0), "batch": np.full(n, -1.0), "hdim": np.full(n, -1.0),
        "causal": np.zeros(n, np.int8)}
    shaped = np.zeros(n, bool)
    if not n:
        return cols, shaped
    # one classification per distinct kernel name
    uniq, inv = np.unique(g.name[rows], return_inverse=True)
    per_name = [(*kernel_class(nm), kernel_dtype(nm, default_dtype)) for nm in g.strings.decode(uniq)]
    cols["cls"] = np.array([c for c, _, _ in per_name], np.int8)[inv]
    cols["kind"] = np.array([k for _, k, _ in per_name], np.int8)[inv]
    cols["dtype"] = np.array([d for _, _, d in per_name], object)[inv]
    # copies and memsets with their byte count (the Kineto reader keeps it as tensor_size)
    size = g.tensor_size[rows].astype(float)
    cp = (size > 0) & (cols["cls"] == MEMORY)
    cols["nbytes"][cp] = 2.0 * size[cp]
    cols["flops"][cp] = 0.0
    cols["kind"][cp] = MEM_KINDS.index("copy")
    shaped |= cp
    ops = launching_op(g, rows)
    col = g.attrs.get("inputs")
    has_op = ops >= 0
    if col is None or not has_op.any():
        return cols, shaped
    # one feature extraction per distinct launching op, then columns for every kernel at once
    uops, oinv = np.unique(ops[has_op], return_inverse=True)
    op_names = g.strings.decode(g.name[uops])
    keys = ("cls", "kind", "flops", "nbytes", "m", "n", "k", "batch", "hdim", "causal")
    table = np.full((len(uops), len(keys)), -1.0)
    op_dtype = np.full(len(uops), default_dtype, object)
    parsed = [tuple(_parse(x) for x in v) if (v := col.get(o)) else (None, None, None) for o in uops.tolist()]
    list_type = dominant_float_type(types for _, _, types in parsed)  # TensorList elements: no dtype recorded
    for j, (nm, (concrete, dims, types)) in enumerate(zip(op_names, parsed)):
        if not (isinstance(dims, list) and isinstance(types, list)):
            continue
        f = op_features(nm, dims, types, concrete, list_type)
        if f.nbytes <= 0 or f.cls == OTHER:
            continue
        table[j] = [f.cls, f.kind if f.cls == MEMORY else -1, f.flops, f.nbytes, f.m, f.n, f.k, f.batch,
                    f.hdim, f.causal]
        op_dtype[j] = _DT_GROUP.get(f.dtype, f.dtype)
    at = np.flatnonzero(has_op)
    t = table[oinv]
    fcls = t[:, 0]
    kc = cols["cls"][at]
    # the kernel does its op's work: the same class (a GEMM kernel of a convolution too), or a
    # memory-bound kernel of a gather
    use = (fcls >= 0) & ((kc == fcls) | ((kc == MEMORY) & (fcls == EMBEDDING)) | ((kc == GEMM) & (fcls == CONV)))
    i = at[use]
    t = t[use]
    cols["cls"][i] = t[:, 0].astype(np.int8)
    kind = t[:, 1]
    cols["kind"][i] = np.where(kind >= 0, kind, cols["kind"][i]).astype(np.int8)
    cols["dtype"][i] = op_dtype[oinv[use]]
    for c, key in enumerate(keys[2:], start=2):
        if key == "causal":
            cols[key][i] = np.maximum(t[:, c], 0).astype(np.int8)
        else:
            cols[key][i] = t[:, c]
    shaped[i] = True
    return cols, shaped


def _terms(models: tuple[Any, ...], cols: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``(floor µs, total µs)`` per row by a GPU's op models, best first (its own fit, another
    GPU's moved to it, ...; NaN where none has a fit of the row's class)."""
    n = len(cols["nbytes"])
    floor = np.full(n, np.nan)
    total = np.full(n, np.nan)
    for m in reversed(models):  # the last first: a better one overrides
        if m is None:
            continue
        with np.errstate(all="ignore"):
            t = m.predict(cols)
        for _c, sel, fit, shaped_fit, shaped in m._class_rows(cols):
            sub = {k: v[sel] for k, v in cols.items()}
            a = np.broadcast_to(np.asarray(fit.floor(sub) if fit.form == "memory" else fit.a, float), (int(sel.sum()),))
            if shaped_fit is not None and shaped is not None:
                a = np.where(shaped, shaped_fit.a, a)
            ok = np.isfinite(t[sel])
            idx = np.flatnonzero(sel)[ok]
            floor[idx] = a[ok] * np.maximum(sub["kernels"][ok], 1)
            total[idx] = t[sel][ok]
    return floor, total


_REF_FLOPS, _REF_BYTES = 1e12, 1e9  # a class-transfer reference: work well above every floor


def _class_reference(cols: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    """Shape-free columns of ``rows`` at a reference size: compute classes compute-bound at
    ``_REF_FLOPS``, memory classes at ``_REF_BYTES`` — the work term's rate of the class."""
    sub = {k: v[rows].copy() for k, v in cols.items()}
    comp = np.isin(sub["cls"], [GEMM, ATTENTION, CONV])
    sub["flops"] = np.where(comp, _REF_FLOPS, 0.0)
    sub["nbytes"] = np.where(comp, _REF_BYTES / 1e3, _REF_BYTES)
    for key in ("m", "n", "k", "batch", "hdim"):
        sub[key] = np.full(len(rows), -1.0)
    return sub


def with_fallback(models: tuple[Any, ...], other: Any, hw: Hardware, label: str) -> tuple[Any, ...]:
    """``models`` of a GPU with, last, the other GPU's own fit moved to it (its classes that
    neither own nor moved fit has get the other GPU's fit moved by the data sheet or the fits' ratios:
    a class ratio that is the two GPUs' relative speed, not a fit of this GPU)."""
    if other is None:
        return models
    sms = hw.sms or int(other.sms)
    try:
        return (*models, other.transfer_to(label, hw, sms))
    except (ValueError, KeyError, ZeroDivisionError):
        return models


def retime_graph(g: RankGraph, source: str, target: str, src_models: tuple[Any, ...],
                 dst_models: tuple[Any, ...], default_dtype: str = "half") -> Retiming:
    """Re-time every measured device compute op of ``g`` from GPU ``source`` to ``target`` (see the
    module doc); ``*_models``: each GPU's op models, best first (:func:`_terms`)."""
    meas = np.where(np.isfinite(g.dur) & (g.dur >= 0), g.dur, 0.0).astype(float)
    comm = np.isin(g.type, [int(x) for x in COMM_NODE_TYPES])
    hold = g.strings.lookup("device_hold")
    dev = (g.is_cpu_op != 1) & ~comm & np.isfinite(g.dur) & (g.dur >= 0)
    if hold >= 0:
        dev &= g.name != hold
    rows = np.flatnonzero(dev)
    how = np.full(len(g), NOT_DEVICE, np.int8)
    dur = meas.copy()
    kept: dict[str, float] = {}
    if not len(rows):
        return Retiming(source, target, dur, how, meas, kept)
    cols, shaped = device_op_columns(g, rows, default_dtype)
    comm_kernel = cols["cls"] == -1  # a collective kernel the reader kept as compute: never re-timed here
    cols["cls"] = np.where(comm_kernel, OTHER, cols["cls"]).astype(np.int8)
    t = meas[rows]
    new = np.full(len(rows), np.nan)
    code = np.full(len(rows), KEPT, np.int8)
    # by shape
    fs, ps = _terms(src_models, cols)
    ft, pt = _terms(dst_models, cols)
    ok = shaped & np.isfinite(ps) & np.isfinite(pt) & (fs > 0) & (ps > 0)
    new[ok] = _move(t[ok], fs[ok], ps[ok], ft[ok], pt[ok])
    code[ok] = BY_SHAPE
    # by class transfer
    rest = np.flatnonzero(~ok & ~comm_kernel)
    if len(rest):
        ref = _class_reference(cols, rest)
        fs2, ps2 = _terms(src_models, ref)
        ft2, pt2 = _terms(dst_models, ref)
        ok2 = np.isfinite(ps2) & np.isfinite(pt2) & (fs2 > 0) & (ps2 > fs2)
        r = rest[ok2]
        new[r] = _move(t[r], fs2[ok2], ps2[ok2], ft2[ok2], pt2[ok2])
        code[r] = BY_CLASS
    keep = code == KEPT
    new[keep] = t[keep]
    dur[rows] = new
    how[rows] = code
    if keep.any():
        kn = g.strings.decode(g.name[rows[keep]])
        for nm, v in zip(kn, t[keep].tolist()):
            kept[nm] = kept.get(nm, 0.0) + v
    return Retiming(source, target, dur, how, meas, kept)


def _move(t: np.ndarray, fs: np.ndarray, ps: np.ndarray, ft: np.ndarray, pt: np.ndarray) -> np.ndarray:
    """Measured ``t`` split into the floor (paid in full, up to ``fs``) and the work above it, each
    moved by the ratio of the target's term to the source's (work: ``(pt−ft)/(ps−fs)``; a source
    model with no work above its floor moves the whole time by ``pt/ps``)."""
    floor = np.minimum(t, fs)
    ws, wt = ps - fs, pt - ft
    rw = np.where(ws > 1e-9, wt / np.maximum(ws, 1e-9), pt / ps)
    return floor * (ft / fs) + (t - floor) * rw
