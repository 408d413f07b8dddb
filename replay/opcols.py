"""The columns an op model predicts from, built from a rank graph's model targets.

:func:`graph_cols` turns the nodes :func:`.features.is_model_target` selects into the columns of
:meth:`.opmodel.OpModel.predict` (class, memory kind, dtype group, FLOPs, bytes, kernels, and the
GEMM/attention shapes a synthesizer writes as ``gemm_shape``/``attention_shape`` attributes).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .devices import Hardware
from .features import is_model_target
from .opclass import peak_flops_dtype
from .opfeatures import (
    ATTENTION,
    CONV,
    GEMM,
    MEMORY,
    attention_keys,
    flash_causal_keys,
    fp32_math_of_name,
    memory_kind,
    op_class,
)

_DTYPE_GROUP = {"bf16": "half", "fp16": "half", "half": "half", "bfloat16": "half", "float16": "half",
                "fp32": "fp32", "float32": "fp32", "float": "fp32", "tf32": "tf32", "fp64": "fp64",
                "fp8": "fp8", "float8": "fp8", "int8": "int8"}


def graph_cols(g: Any, flops: np.ndarray, nbytes: np.ndarray, hw: Hardware) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``(rows, columns)`` of the model targets of a rank graph for :meth:`OpModel.predict`: class
    from the op name (one classification per distinct name), dtype group from the graph's (or the
    hardware's) dtype, FLOPs and bytes from :func:`.features.node_features`; one kernel each. A GEMM
    whose local shape the graph carries (the ``gemm_shape`` attribute a synthesizer writes: m, n, k,
    batch) is timed by the shaped form (wave quantization) when 2·m·n·k·batch is its FLOP count
    (a rewrite that changed its work without its shape falls back to the shape-free form)."""
    rows = np.flatnonzero(is_model_target(g))
    uniq, inv = np.unique(g.name[rows], return_inverse=True)
    names_u = g.strings.decode(uniq) if len(uniq) else []
    cls_u = np.array([op_class(s) for s in names_u], np.int8) if len(uniq) else np.zeros(0, np.int8)
    kind_u = np.array([memory_kind(s) if c == MEMORY else -1 for s, c in zip(names_u, cls_u)], np.int8) \
        if len(uniq) else np.zeros(0, np.int8)
    dt = _DTYPE_GROUP.get(str(g.meta.get("dtype") or hw.dtype or "bf16").lower(), "half")
    dt_u = np.full(len(uniq), dt, object)
    if dt == "fp32":  # an fp32 GEMM/conv runs TF32 or SIMT math: its kernel name or PyTorch's default
        tf = peak_flops_dtype(hw.peak_tflops, "tf32") > peak_flops_dtype(hw.peak_tflops, "fp32")
        for i, (s, c) in enumerate(zip(names_u, cls_u)):
            if c in (GEMM, CONV):
                dt_u[i] = fp32_math_of_name(int(c), s, tf)
    n = len(rows)
    neg = np.full(n, -1.0)
    cols = {"cls": cls_u[inv] if n else np.zeros(0, np.int8), "kind": kind_u[inv] if n else np.zeros(0, np.int8),
            "dtype": dt_u[inv] if n else np.zeros(0, object),
            "flops": flops[rows].astype(float), "nbytes": nbytes[rows].astype(float),
            "kernels": np.ones(n), "m": neg, "n": neg, "k": neg, "batch": neg.copy(), "hdim": neg.copy(),
            "causal": np.zeros(n, np.int8)}
    attrs = g.attrs if hasattr(g, "attrs") else {}
    cdt = attrs.get("compute_dtype")
    if cdt is not None and len(cdt.rows) and n:  # per-op math dtype (FP8 GEMMs of an FP8 training plan)
        pos = np.searchsorted(rows, cdt.rows)
        ok = (pos < n) & (rows[np.minimum(pos, n - 1)] == cdt.rows)
        vals = np.array([_DTYPE_GROUP.get(str(v).lower(), dt) for v in cdt.values], object)
        if (vals == "fp8").any() and not hw.peak_tflops.get("fp8"):
            raise ValueError(f"the trace has FP8 GEMMs but {hw.name or hw.preset or 'this GPU'} "
                             "has no FP8 tensor cores (its peak_tflops lists no fp8)")
        cols["dtype"] = cols["dtype"].copy()
        cols["dtype"][pos[ok]] = vals[ok]
    shp = attrs.get("gemm_shape")
    if shp is not None and len(shp.rows) and n:
        _gemm_shape_cols(cols, rows, shp)
    shp = attrs.get("attention_shape")
    if shp is not None and len(shp.rows) and n:
        _attention_shape_cols(cols, rows, shp)
    return rows, cols


def _shape_rows(rows: np.ndarray, shp: Any, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``(positions in rows, values)`` of the entries of a shape attribute column of ``width``."""
    vals = list(shp.values)
    ok_len = np.fromiter((isinstance(v, (list, tuple)) and len(v) == width for v in vals), bool, len(vals))
    if not ok_len.any():
        return np.zeros(0, np.int64), np.zeros((0, width))
    arr = np.array([v for v, o in zip(vals, ok_len) if o], np.float64)
    arows = np.asarray(shp.rows)[ok_len]
    pos = np.searchsorted(rows, arows)
    inb = pos < len(rows)
    hit = np.zeros(len(arows), bool)
    hit[inb] = rows[pos[inb]] == arows[inb]
    return pos[hit], arr[hit]


def _attention_shape_cols(cols: dict[str, np.ndarray], rows: np.ndarray, shp: Any) -> None:
    """Fill the shape columns of the attention rows of ``cols`` from an ``attention_shape`` column
    (batch, seq_q, seq_kv, heads·head_dim; head count unknown). Whether the op is causal and forward
    or backward is read from its FLOPs: 4·b·s_q·keys·(h·d) times 1 (forward) or 2.5 (backward),
    with keys = s_kv (full) or s_kv − s_q/2 (causal); an op whose FLOPs match none keeps the
    shape-free form (a rewrite changed its work)."""
    pos, arr = _shape_rows(rows, shp, 4)
    if not len(pos):
        return
    b, sq, sk, hd = arr.T
    fl = cols["flops"][pos]
    good = (arr.min(axis=1) > 0) & (cols["cls"][pos] == ATTENTION)
    causal = np.zeros(len(pos), bool)
    matched = np.zeros(len(pos), bool)
    half = attention_keys(sq, sk, np.full(len(pos), True))
    # synthesized causal ops count the kernel's tiles (flash_causal_keys); the fit's convention is
    # the exact half, so such an op's FLOPs are restated in it (the shaped form models the tiles)
    pairs, inv = np.unique(np.stack([sq, sk], 1), axis=0, return_inverse=True)  # few distinct shapes
    tiled = np.array([flash_causal_keys(q, k) for q, k in pairs])[np.ravel(inv)]
    rescale = np.ones(len(pos))
    # causal first: a causal op within one tile (seq_q <= 128) computes the full square, as a
    # non-causal one would; the synthesizer's templates mark their attention causal
    for c, keys, conv in ((True, half, False), (True, tiled, True),
                          (False, attention_keys(sq, sk, np.zeros(len(pos), bool)), False)):
        for mult in (1.0, 2.5):
            f = 4.0 * b * sq * keys * hd * mult
            hit = ~matched & (np.abs(f - fl) <= 0.01 * np.maximum(fl, 1.0))
            causal |= hit & c
            if conv:
                rescale[hit] = half[hit] / np.maximum(tiled[hit], 0.5)
            matched |= hit
    good &= matched
    if (rescale != 1.0).any():
        cols["flops"] = cols["flops"].copy()
        cols["flops"][pos[good]] *= rescale[good]
    pos, arr, causal = pos[good], arr[good], causal[good]
    for j, key in enumerate(("batch", "m", "n", "k")):
        cols[key] = cols[key].copy()
        cols[key][pos] = arr[:, j]
    cols["causal"] = cols["causal"].copy()
    cols["causal"][pos] = causal


def _gemm_shape_cols(cols: dict[str, np.ndarray], rows: np.ndarray, shp: Any) -> None:
    """Fill ``m, n, k, batch`` of the GEMM rows of ``cols`` from a ``gemm_shape`` attribute column."""
    pos, arr = _shape_rows(rows, shp, 4)
    if not len(pos):
        return
    work = 2.0 * arr.prod(axis=1)
    fl = cols["flops"][pos]
    good = (arr.min(axis=1) > 0) & (cols["cls"][pos] == GEMM) & (np.abs(work - fl) <= 0.01 * np.maximum(fl, 1.0))
    pos, arr = pos[good], arr[good]
    for j, key in enumerate(("m", "n", "k", "batch")):
        cols[key] = cols[key].copy()
        cols[key][pos] = arr[:, j]
