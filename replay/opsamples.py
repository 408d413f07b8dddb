"""Operator samples with shapes for fitting compute models (:mod:`.opmodel`), read from real data:

* Kineto traces whose CPU ops record ``Input Dims``/``Input type`` — each device kernel is linked to
  the host op that launched it (kernel ``correlation`` → runtime launch → the innermost CPU op open
  on that thread at the launch; else the kernel's ``External id``), and an op's sample is the summed
  time of its compute kernels (collective kernels are not compute);
* Vidur's op-time tables (``vidur_profiling/compute/<gpu>/<org>/<model>/mlp.csv`` and
  ``attention.csv``): per-operator GPU time of one transformer layer at a known shape.

A sample carries its op class (:data:`OP_CLASSES`), dtype group, FLOPs, bytes moved, GEMM shape
(``m, n, k, batch``; -1 when not a GEMM) and the measured time in µs. Everything is columnar numpy.

What an op is (class, dtype, FLOPs, bytes, shape) is :mod:`.opfeatures`'s; this module reads the
measured times and pairs them with it.
"""

from __future__ import annotations

import csv
import gzip
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from ettools.errors import TraceError
from ettools.gcpause import no_gc
from ettools.intervals import covered_length, merge_intervals

# re-exported: the op models, the re-timing, converters and tests import these from here
from .opfeatures import (  # noqa: F401
    _COMM_RE,
    _DT_BYTES,
    _FUSED_RE,
    _GEMM_KERNEL_RE,
    ATTENTION,
    CONV,
    COPY,
    DTYPES,
    ELEMENTWISE,
    EMBEDDING,
    FLASH_TILE,
    FUSED,
    GEMM,
    INDEX,
    MEM_KINDS,
    MEMORY,
    NORM,
    OP_CLASSES,
    OPTIMIZER,
    OTHER,
    REDUCTION,
    SOFTMAX,
    OpFeatures,
    _numel,
    _tensor_args,
    attention_keys,
    attention_shape,
    conv_out_shape,
    dominant_float_type,
    et_operands_as_kineto,
    flash_causal_keys,
    fp32_math,
    fp32_math_of_name,
    gemm_mnk,
    memory_bytes,
    memory_kind,
    op_class,
    op_features,
)


@dataclass
class OpSamples:
    """Columnar op samples (see the module docstring); ``group`` names where each came from
    (a model, a trace), for cross-validation by group."""

    name: list[str] = field(default_factory=list)
    cls: list[int] = field(default_factory=list)
    dtype: list[str] = field(default_factory=list)
    flops: list[float] = field(default_factory=list)
    nbytes: list[float] = field(default_factory=list)
    m: list[int] = field(default_factory=list)
    n: list[int] = field(default_factory=list)
    k: list[int] = field(default_factory=list)
    batch: list[int] = field(default_factory=list)
    kind: list[int] = field(default_factory=list)
    hdim: list[int] = field(default_factory=list)
    causal: list[int] = field(default_factory=list)
    kernels: list[int] = field(default_factory=list)
    dur: list[float] = field(default_factory=list)
    group: list[str] = field(default_factory=list)
    overlap: list[float] = field(default_factory=list)

    def add(self, name: str, f: OpFeatures, dur: float, kernels: int, group: str, overlap: float = 0.0) -> None:
        """Append one sample (``overlap``: the share of its kernel time a collective kernel ran
        beside it on the GPU, 0 for a table's isolated measurement)."""
        self.name.append(name)
        self.cls.append(f.cls)
        self.dtype.append(f.dtype)
        self.flops.append(f.flops)
        self.nbytes.append(f.nbytes)
        self.m.append(f.m)
        self.n.append(f.n)
        self.k.append(f.k)
        self.batch.append(f.batch)
        self.kind.append(f.kind)
        self.hdim.append(f.hdim)
        self.causal.append(f.causal)
        self.kernels.append(kernels)
        self.dur.append(dur)
        self.group.append(group)
        self.overlap.append(overlap)

    def extend(self, other: OpSamples) -> None:
        """Append all of ``other``."""
        for k in self.__dataclass_fields__:
            getattr(self, k).extend(getattr(other, k))

    def arrays(self) -> dict[str, np.ndarray]:
        """Columns as numpy arrays."""
        return {"name": np.asarray(self.name, object), "cls": np.asarray(self.cls, np.int8),
                "dtype": np.asarray(self.dtype, object), "flops": np.asarray(self.flops, float),
                "nbytes": np.asarray(self.nbytes, float), "m": np.asarray(self.m, float),
                "n": np.asarray(self.n, float), "k": np.asarray(self.k, float),
                "batch": np.asarray(self.batch, float), "kind": np.asarray(self.kind, np.int8),
                "hdim": np.asarray(self.hdim, float), "causal": np.asarray(self.causal, np.int8), "kernels": np.asarray(self.kernels, float),
                "dur": np.asarray(self.dur, float), "group": np.asarray(self.group, object),
                "overlap": np.asarray(self.overlap, float)}

    def __len__(self) -> int:
        return len(self.dur)


# ---- Kineto ----------------------------------------------------------------------------------------

_OP_CATS = {"cpu_op", "Operator", "user_annotation_cpu_op"}
_RT_CATS = {"cuda_runtime", "Runtime", "hip_runtime", "cuda_driver"}
_K_CATS = {"kernel", "Kernel"}


def _load_json(path: Path) -> dict[str, Any]:
    """The trace's JSON: parsed by orjson (no cyclic-GC passes over the new objects); where orjson
    refuses the file (NaN, integers past 64 bits, invalid UTF-8, not JSON) as the standard json
    reads it, or fails on it."""
    try:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
            raw = f.read()
        with no_gc():
            d = orjson.loads(raw)
    except (OSError, orjson.JSONDecodeError):
        d = _load_json_text(path)
    if not isinstance(d, dict) or not isinstance(d.get("traceEvents"), list):
        raise TraceError(path, "not a Kineto JSON trace (no traceEvents)")
    return d


def _load_json_text(path: Path) -> Any:
    try:
        op = gzip.open if path.suffix == ".gz" else open
        with op(path, "rt") as f:
            d = json.load(f)
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(path, f"not a Kineto JSON trace: {e}") from None
    return d


def kineto_device(path: str | Path) -> dict[str, Any]:
    """The first ``deviceProperties`` entry of a Kineto trace ({} when absent)."""
    d = _load_json(Path(path))
    props = d.get("deviceProperties") or []
    return props[0] if props and isinstance(props[0], dict) else {}


def _memo_search(rx: re.Pattern[str]) -> Callable[[str], bool]:
    """``bool(rx.search(name))``, remembered per name."""
    seen: dict[str, bool] = {}

    def found(name: str) -> bool:
        v = seen.get(name)
        if v is None:
            v = seen[name] = rx.search(name) is not None
        return v

    return found


def kineto_op_samples(path: str | Path, group: str | None = None) -> tuple[OpSamples, dict[str, Any]]:
    """Op samples of one Kineto trace, and a summary (device properties, kernels seen, linked,
    compute µs total and linked). An op's time is the sum of its compute kernels; ops whose
    arguments carry no tensor shapes are skipped (counted as unlinked)."""
    path = Path(path)
    d = _load_json(path)
    ev = d["traceEvents"]
    grp = group or str(path)
    ops: list[dict[str, Any]] = []
    by_ext: dict[Any, int] = {}
    rts: dict[Any, dict[str, Any]] = {}
    kernels: list[dict[str, Any]] = []
    for e in ev:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        c = e.get("cat")
        if c in _OP_CATS:
            ops.append(e)
        elif c in _RT_CATS:
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                rts[corr] = e
        elif c in _K_CATS:
            kernels.append(e)
    # innermost op open at each launch: sweep each thread's ops and launches in time order
    by_thread: dict[tuple[Any, Any], list[tuple[float, int, int]]] = {}
    for i, o in enumerate(ops):
        ext = (o.get("args") or {}).get("External id")
        if ext is not None:
            by_ext.setdefault(ext, i)
        by_thread.setdefault((o.get("pid"), o.get("tid")), []).append((float(o["ts"]), 0, i))
    launches = list(rts.items())
    for j, (_corr, r) in enumerate(launches):
        by_thread.setdefault((r.get("pid"), r.get("tid")), []).append((float(r["ts"]), 1, j))
    owner: dict[Any, int] = {}
    for items in by_thread.values():
        items.sort(key=lambda x: (x[0], x[1]))
        stack: list[tuple[float, int]] = []
        for ts, kind, idx in items:
            while stack and stack[-1][0] < ts:
                stack.pop()
            if kind == 0:
                o = ops[idx]
                stack.append((ts + float(o.get("dur", 0)), idx))
            elif stack:
                owner[launches[idx][0]] = stack[-1][1]
    tot: dict[int, float] = {}
    cnt: dict[int, int] = {}
    gtot: dict[int, float] = {}
    gcnt: dict[int, int] = {}
    knames: dict[int, set[str]] = {}  # the kernel names of each op (fp32 math mode: TF32 or SIMT)
    summary = {"source": str(path), "kernels": 0, "compute_us": 0.0, "linked_us": 0.0, "linked": 0}
    props = d.get("deviceProperties") or []
    summary["device"] = props[0] if props and isinstance(props[0], dict) else {}
    # collective kernels' busy intervals on the device (merged): a compute kernel that runs beside
    # one shares the SMs and memory with it (NCCL holds SMs for its channels) and runs slower
    is_comm = _memo_search(_COMM_RE)  # kernel names repeat: each distinct one searched once
    comm = [(float(k.get("ts", 0) or 0), float(k.get("dur", 0) or 0)) for k in kernels
            if is_comm(str(k.get("name", ""))) and float(k.get("dur", 0) or 0) > 0]
    cs, ce = merge_intervals(np.array([c[0] for c in comm]), np.array([c[0] + c[1] for c in comm]))
    comp = [k for k in kernels if not is_comm(str(k.get("name", ""))) and float(k.get("dur", 0) or 0) > 0]
    k_ts = np.fromiter((float(k.get("ts", 0) or 0) for k in comp), float, len(comp))
    k_dur = np.fromiter((float(k.get("dur", 0) or 0) for k in comp), float, len(comp))
    k_ovl = covered_length(cs, ce, k_ts, k_ts + k_dur)
    otot: dict[int, float] = {}
    is_gemm = _memo_search(_GEMM_KERNEL_RE)
    for kev, ov in zip(comp, k_ovl.tolist()):
        name = str(kev.get("name", ""))
        dur = float(kev.get("dur", 0) or 0)
        summary["kernels"] += 1
        summary["compute_us"] += dur
        a = kev.get("args") or {}
        oi = owner.get(a.get("correlation"))
        if oi is None:
            oi = by_ext.get(a.get("External id"))
        if oi is None:
            continue
        tot[oi] = tot.get(oi, 0.0) + dur
        cnt[oi] = cnt.get(oi, 0) + 1
        otot[oi] = otot.get(oi, 0.0) + ov
        if is_gemm(name):
            gtot[oi] = gtot.get(oi, 0.0) + dur
            gcnt[oi] = gcnt.get(oi, 0) + 1
        knames.setdefault(oi, set()).add(name)
    # what a TensorList argument's elements are taken to be: the profiler records no dtype for them
    list_type = dominant_float_type((o.get("args") or {}).get("Input type") for o in ops)
    # a compiled graph's forward (by autograd sequence number): its backward reads what it saved
    fwd_bytes: dict[Any, float] = {}
    for o in ops:
        a = o.get("args") or {}
        if _FUSED_RE.search(str(o.get("name", ""))) and "Backward" not in str(o.get("name")) \
                and a.get("Sequence number") is not None and isinstance(a.get("Input Dims"), list):
            ta = _tensor_args(a["Input Dims"], a.get("Input type") or [], list_type)
            fwd_bytes[a["Sequence number"]] = float(sum(_numel(sh) * _DT_BYTES.get(ty, 4) for sh, ty in ta))
    out = OpSamples()
    for oi, t in tot.items():
        o = ops[oi]
        a = o.get("args") or {}
        dims, types = a.get("Input Dims"), a.get("Input type")
        if not isinstance(dims, list) or not isinstance(types, list):
            continue
        nm = str(o.get("name", ""))
        conc = a.get("Concrete Inputs")
        f = op_features(nm, dims, types, conc if isinstance(conc, list) else None, list_type)
        nk = cnt[oi]
        if not nm.startswith("aten::"):
            if _FUSED_RE.search(nm):
                # torch.compile region: its device work is its own kernels (generated Triton
                # kernels, library GEMMs), not its operand list — a forward takes the weights its
                # GEMMs read, a backward reads its forward's saved tensors, and which of them each
                # fused kernel reads is not recorded (on real traces its operands' bytes at HBM rate are
                # anything from a fraction to many times the fused kernels' time). So it is class ``other``: kept out of the fit and not predicted from its
                # operands (a replay times it from its measured kernels). Its library GEMMs, with
                # no recorded shape, are left out of the sample.
                t -= gtot.get(oi, 0.0)
                nk -= gcnt.get(oi, 0)
                ta = _tensor_args(dims, types, list_type)
                by = float(sum(_numel(sh) * _DT_BYTES.get(ty, 4) for sh, ty in ta))
                if "Backward" in nm:
                    by += 2.0 * fwd_bytes.get(a.get("Sequence number"), 0.0)
                f = OpFeatures(OTHER, f.dtype, by / 4.0, by, kind=FUSED)
                if t <= 0 or nk <= 0:
                    continue
            else:
                f.cls = OTHER  # autograd C++ nodes, fbgemm: their arguments do not say the work
        if f.nbytes <= 0:
            continue
        if f.dtype == "fp32" and f.cls in (GEMM, CONV):
            f.dtype = fp32_math(f.cls, sorted(knames.get(oi, ())))
        out.add(nm, f, t, nk, grp, min(otot.get(oi, 0.0) / max(tot[oi], 1e-9), 1.0))
        summary["linked"] += cnt[oi]
        summary["linked_us"] += t
    return out, summary


# ---- Vidur tables ----------------------------------------------------------------------------------

def vidur_mlp_samples(path: str | Path, group: str | None = None) -> OpSamples:
    """Op samples of one Vidur ``mlp.csv`` (fp16; times are ms medians): the layer's GEMMs at their
    (tokens × out × in) shape per tensor-parallel shard, norms, activation, RoPE, residual add and
    embedding as memory-bound ops with the bytes they must move."""
    path = Path(path)
    grp = group or path.parent.name
    out = OpSamples()
    try:
        rows = list(csv.DictReader(path.open()))
    except OSError as e:
        raise TraceError(path, f"cannot read: {e}") from None
    e2 = 2  # fp16
    for r in rows:
        try:
            tok = int(r["num_tokens"])
            tp = int(r["num_tensor_parallel_workers"])
            nh, nkv, h, f = int(r["n_head"]), int(r["n_kv_head"]), int(r["n_embd"]), int(r["n_expanded_embd"])
            gated = str(r.get("use_gated_mlp", "")).strip() == "True"
        except (KeyError, ValueError):
            raise TraceError(path, "not a Vidur mlp.csv (num_tokens, n_head, n_embd, ... columns)") from None
        hd = h // nh
        qkv = (nh + 2 * nkv) * hd // tp
        ff = f // tp
        gemms = {"attn_pre_proj": (tok, qkv, h), "attn_post_proj": (tok, h, nh * hd // tp),
                 "mlp_up_proj": (tok, 2 * ff if gated else ff, h), "mlp_down_proj": (tok, h, ff)}
        mem = {"input_layernorm": (2 * tok * h * e2, NORM), "post_attention_layernorm": (2 * tok * h * e2, NORM),
               "add": (3 * tok * h * e2, ELEMENTWISE),
               "mlp_act": ((3 if gated else 2) * tok * ff * e2, ELEMENTWISE),
               "attn_rope": (2 * tok * (nh + nkv) * hd // tp * e2, ELEMENTWISE)}
        for op, (m, n, k) in gemms.items():
            v = r.get(f"time_stats.{op}.median")
            if not v:
                continue
            out.add(f"vidur:{op}", OpFeatures(GEMM, "half", 2.0 * m * n * k, float(e2 * (m * k + k * n + m * n)),
                                                m, n, k, 1), float(v) * 1e3, 1, grp)
        for op, (by, kd) in mem.items():
            v = r.get(f"time_stats.{op}.median")
            if not v:
                continue
            out.add(f"vidur:{op}", OpFeatures(MEMORY, "half", by / (2 * e2), float(by), kind=kd),
                    float(v) * 1e3, 1, grp)
        v = r.get("time_stats.emb.median")
        if v:
            moved = tok * h * e2
            out.add("vidur:emb", OpFeatures(EMBEDDING, "half", float(tok), float(2 * moved + tok * 8)),
                    float(v) * 1e3, 1, grp)
    return out


def _attention_rows(path: str | Path, phase: str) -> Iterator[tuple[dict[str, str], float]]:
    """``(row, µs)`` of the ``phase`` ("prefill" or "decode") rows of Vidur's ``attention.csv``
    that have a positive median time."""
    want = "True" if phase == "prefill" else "False"
    with Path(path).open() as f:
        for r in csv.DictReader(f):
            v = r.get(f"time_stats.attn_{phase}.median")
            if str(r.get("is_prefill")) == want and v and float(v) > 0:
                yield r, float(v) * 1e3


def vidur_decode_samples(path: str | Path, group: str = "vidur-attention") -> OpSamples:
    """Decode attention samples of Vidur's ``attention.csv`` (``time_stats.attn_decode``: one new
    query per sequence over a cache of ``kv_cache_size`` tokens, ``batch_size`` sequences): FLOPs
    4·b·h·d·kv, bytes the cache's K and V (``n_kv_head``/TP heads, at least one: KV heads are
    replicated when TP exceeds them) plus q and out, fp16. Rows are grouped by cache length
    (``<group>/decode-kv<512``, ``<2048``, ``>=2048``): cross-validation then predicts cache
    lengths the fit has not seen (the table is one model's head layout)."""
    out = OpSamples()
    for r, us in _attention_rows(path, "decode"):
        tp = int(r["num_tensor_parallel_workers"])
        nq, h = int(r["n_q_head"]), int(r["n_embd"])
        nh, nkv, hd = max(nq // tp, 1), max(int(r["n_kv_head"]) // tp, 1), h // nq
        kv, b = int(r["kv_cache_size"]), int(r["batch_size"])
        fl = 4.0 * b * nh * hd * kv
        by = 2.0 * b * (2 * nh * hd + 2 * kv * nkv * hd)
        out.add("vidur:attn_decode", OpFeatures(ATTENTION, "half", fl, by, 1, kv, nh * hd, b, hdim=hd),
                us, 1, group + ("/decode-kv<512" if kv < 512 else "/decode-kv<2048" if kv < 2048
                                            else "/decode-kv>=2048"))
    return out


def vidur_attention_samples(path: str | Path, group: str = "vidur-attention") -> OpSamples:
    """Prefill attention samples of Vidur's ``attention.csv`` (FlashAttention, fp16, one sequence):
    causal FLOPs 4·h·d·c·(kv + c/2) for a chunk c over a cache kv, bytes of q, k, v, out. The table
    is one model, so its rows are grouped by chunk length (``<group>/chunk<256``, ``<1024``,
    ``>=1024``): cross-validation then predicts sequence lengths the fit has not seen. ``causal``
    is 2: Vidur's profiler calls ``flash_attn_with_kvcache`` with the chunk's k and v, which the
    kernel appends to the paged cache (every query tile copies the new keys it sees)."""
    out = OpSamples()
    for r, us in _attention_rows(path, "prefill"):
        tp = int(r["num_tensor_parallel_workers"])
        nh, nkv, h = int(r["n_q_head"]) // tp, int(r["n_kv_head"]) // tp, int(r["n_embd"])
        hd = h // int(r["n_q_head"])
        c, kv, b = int(r["prefill_chunk_size"]), int(r["kv_cache_size"]), int(r["batch_size"])
        fl = 4.0 * b * nh * hd * c * attention_keys(c, kv + c, True)
        by = 2.0 * b * (2 * c * nh * hd + 2 * (c + kv) * nkv * hd)
        out.add("vidur:attn_prefill", OpFeatures(ATTENTION, "half", fl, by, c, kv + c, nh * hd, b, hdim=hd, causal=2),
                us, 1, group + ("/chunk<256" if c < 256 else "/chunk<1024" if c < 1024 else "/chunk>=1024"))
    return out
