"""Efficiency-aware per-class op cost models, fitted on real kernels (issue 12).

Every op class has a functional form whose constants are all fitted (``scipy.optimize.least_squares``
on log time, soft-L1 loss, so a 2 µs kernel and a 2 ms one weigh alike and outliers do not
dominate); none is hand-set:

* ``gemm`` (also batched):  ``t = a·kernels + ((F_q/P_dtype)^p + (B/W)^p)^(1/p)`` where, when the
  shape (m, n, k, batch) is known, ``F_q = 2·S·⌈tiles·s/S⌉·T²·(k/s + k0)`` counts the work of whole
  waves of T×T output tiles over the S SMs (wave quantization, and a fixed per-tile cost k0 that makes
  short-k GEMMs slow), a grid of fewer tiles than SMs split along k into s = ⌊S/tiles⌋ parts (split-K,
  each at least T deep; else s = 1); without a shape (a synthesized op knows FLOPs and bytes only) a second,
  shape-free form ``F_q = F`` is fitted on the same kernels. T is picked among 64/128/256 by the fit.
* ``attention`` (fused flash/SDPA kernels): the same soft max of FLOPs and bytes, where, when the
  shape (batch b, heads h, seq_q, seq_kv, head dim) is known, ``F_q = F·S·T·max(⌈tiles/S⌉·(keys +
  s0), seq_kv + s0) / (b·h·seq_q·keys)``: the kernel gives each SM query tiles of T rows (``tiles =
  b·h·⌈seq_q/T⌉``), each streaming the keys its queries see plus a fixed per-tile cost s0 in key
  units (Q load, softmax rescale, output write: short sequences run far from peak); under a causal
  mask a tile streams the cache before the chunk (all visible) and the chunk's keys up to its last
  row (the mean, about half of seq_q). A kernel that appends the chunk's K/V to the cache
  (``causal`` = 2, FlashAttention's split-KV kvcache kernel) computes the chunk in whole 128-key
  blocks (mean ``seq_q/2 + 64``), a chunk key costing ``1 + append`` cache keys (every query tile
  copies the new keys it sees first; fitted where such ops over several seq_q/seq_kv exist), and
  a grid of fewer than 0.8·S tiles is split along the keys as its split-KV heuristic picks
  (fewest splits within 85 % of the best wave efficiency); another kernel's grid that fills less
  than the SMs is split in whole T-key blocks (a sequence of one block is not split). A wave is
  bounded by its longest tile (all seq_kv keys). T (64/128) and s0 are fitted; without a shape,
  ``F_q = F``. Fitted on fewer than 8 distinct shapes (one trace's attention has one
  shape), only the rate and s0 are fitted: T is FlashAttention's 128-row query tile, the floor
  the memory kernels' ``a``, bytes at the data-sheet bandwidth as the roofline's max.
* ``conv``: ``t = a·kernels + ((F/P)^p + (B/W)^p)^(1/p)`` (own P, W, p).
* ``memory`` (elementwise, norms, softmax, copies, optimizer), ``embedding`` (gathers) and ``other``
  (custom ops): ``t = a_kind·kernels + B/W_kind`` — bytes at an achieved bandwidth above a
  per-kernel floor; each memory kind (elementwise, reduction, norm, softmax, copy, optimizer, index,
  fused torch.compile graph) with enough samples has its own bandwidth, the others share one, and
  each with enough distinct sizes of small kernels its own floor (a norm's block reduction and two
  passes take about twice an elementwise kernel's launch-to-finish time), the others share the
  class's.

``a`` is the launch/latency floor per kernel; P (achieved FLOP/s per dtype group), W (achieved
bandwidth) and p (how sharply compute and memory bound meet) are the class's efficiency. A class
without enough samples on this GPU is *transferred*: another GPU's fit of that class scaled by the
hardware ratios (peak FLOP/s of the dtype, memory bandwidth, SM count); else roofline.

A fit (:class:`OpModel`) is JSON: the GPU, its SM count/peaks/bandwidth, each class's parameters,
sample count and cross-validated MAPE, and the list of sources it was fitted on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ettools.errors import TraceError
from ettools.io import atomic_write, load_json

from .opsamples import (
    ATTENTION,
    CONV,
    DTYPES,
    EMBEDDING,
    FLASH_TILE,
    GEMM,
    MEM_KINDS,
    MEMORY,
    OP_CLASSES,
    OTHER,
    attention_keys,
    flash_causal_keys,
)

FORMAT = "ettools-op-model"
MIN_CLASS_SAMPLES = 8  # fewer than this: the class is transferred, not fitted
_ALONE = 0.1  # an op with less of its kernel time beside a collective kernel than this ran alone
_MIN_FLOOR_US = 0.5  # a fitted per-kernel floor below this is unidentified (no kernel launches faster)
_TILES = (64, 128, 256)
_ATTN_TILES = (64, 128)  # query rows per FlashAttention thread block (FA2/FA3, CK tiles)
_MMA_ROWS = 16  # rows of the smallest tensor-core MMA tile: fewer queries than this are decode-like
_PEAK_KEY = {"half": "bf16", "fp32": "fp32", "fp64": "fp64", "int8": "int8", "tf32": "tf32", "fp8": "fp8"}


def _softmax(x: np.ndarray, y: np.ndarray, p: float) -> np.ndarray:
    m = np.maximum(x, y)
    m = np.where(m > 0, m, 1e-30)
    return m * ((x / m) ** p + (y / m) ** p) ** (1.0 / p)


_ELEM_BYTES = {"half": 2, "fp32": 4, "tf32": 4, "fp64": 8, "int8": 1, "fp8": 1}
_TENSOR_CORE = ("half", "tf32", "int8", "fp8")  # dtype groups multiplied on tensor cores (fp32: SIMT)


def misaligned(cols: dict[str, np.ndarray]) -> np.ndarray:
    """Tensor-core GEMM rows whose n or k (the leading dimensions of row-major A[m,k], B[k,n],
    C[m,n], as PyTorch lays them out) is not a multiple of 16 bytes: their kernels cannot use
    128-bit vector loads (CUTLASS/cuBLAS ``align1``/``align2`` kernels; on Hopper an sm80 kernel,
    no TMA) and run slower. SIMT fp32/fp64 GEMMs (``sgemm``) have no vector-width variants and are
    not counted: cuBLAS runs unaligned fp32 shapes on them at their usual rate (A100 hta_8rank:
    every unaligned TF32 GEMM is an ``align1`` kernel, every aligned one ``align4``; its unaligned
    ``ampere_sgemm`` kernels run at the aligned SIMT rate)."""
    dt = np.asarray(cols["dtype"]).astype(str)
    dt_u, inv = np.unique(dt, return_inverse=True)
    vec = np.array([16 // _ELEM_BYTES.get(d, 2) for d in dt_u], float)[np.ravel(inv)]
    tc = np.array([d in _TENSOR_CORE for d in dt_u], bool)[np.ravel(inv)]
    n, k = cols["n"], cols["k"]
    return tc & (n > 0) & (k > 0) & ((np.mod(n, vec) != 0) | (np.mod(k, vec) != 0))


def _gemm_work(cols: dict[str, np.ndarray], sms: int, tile: int, k0: float) -> tuple[np.ndarray, np.ndarray]:
    """Wave-quantized GEMM FLOPs (see module doc) as ``(k part, per-tile part)``: the FLOPs of the
    k loop, and the fixed per-tile cost k0 in FLOPs at the reference rate; rows without a shape keep
    their FLOPs (per-tile part 0)."""
    m, n, k, b = cols["m"], cols["n"], cols["k"], np.maximum(cols["batch"], 1)
    shaped = (m > 0) & (n > 0) & (k > 0)
    tiles = np.ceil(np.maximum(m, 1) / tile) * np.ceil(np.maximum(n, 1) / tile) * b
    # split-K: a grid of fewer tiles than SMs is split along k (cuBLAS/CUTLASS split-K and stream-K,
    # a reduce kernel after) into up to ⌊S/tiles⌋ parts of at least one T-deep k block each
    splits = np.clip(np.minimum(np.floor(max(sms, 1) / tiles), np.floor(np.maximum(k, 1) / tile)), 1, None)
    waves = np.ceil(tiles * splits / max(sms, 1))
    per = 2.0 * sms * waves * tile * tile
    return np.where(shaped, per * np.maximum(k, 0) / splits, cols["flops"]), np.where(shaped, per * k0, 0.0)


def _fa_splits(tiles: np.ndarray, kblocks: np.ndarray, sms: int) -> np.ndarray:
    """Key splits FlashAttention-2's split-KV heuristic picks (``num_splits_heuristic``): none for
    a grid of at least 0.8·S tiles; else the fewest splits (each at least one key block, and a
    count that changes the blocks per split) whose wave efficiency ``n/⌈n⌉`` (n = tiles·splits/S)
    is within 85 % of the best over up to 128 splits. A100 Vidur table: 64 query tiles over 108
    SMs take 3 splits (2 waves at 89 %), not ⌊108/64⌋ = 1."""
    out = np.ones(len(tiles))
    few = tiles < 0.8 * max(sms, 1)
    if not few.any():
        return out
    t, nb = tiles[few][:, None], np.maximum(kblocks[few], 1)[:, None]
    s = np.arange(1, min(max(sms, 1), 128) + 1, dtype=float)[None, :]
    nw = t * s / max(sms, 1)
    ok = s <= nb
    eff = np.where(ok, nw / np.ceil(nw), 0.0)
    best = eff.max(axis=1, keepdims=True)
    # a split count that leaves the blocks per split unchanged is never taken (FA's eligibility)
    prev = np.maximum(s - 1, 1)
    elig = ok & ((s == 1) | (np.ceil(nb / s) != np.ceil(nb / prev)))
    pick = elig & (eff >= 0.85 * best)
    out[few] = np.where(pick.any(axis=1), s[0][np.argmax(pick, axis=1)], 1.0)
    return out


def _attention_work(cols: dict[str, np.ndarray], sms: int, tile: int, s0: float, d_ref: float,
                    skip: float = 1.0, append: float = 0.0) -> np.ndarray:
    """Tile/wave-quantized attention FLOPs (see module doc); rows without a shape keep their FLOPs.
    Columns: m, n, k, batch = seq_q, seq_kv, heads·head_dim, batch; ``hdim`` the head dim (unknown:
    ``d_ref``, the fit's median); ``causal`` (2: a kernel that also appends the chunk's K/V to the
    cache). Under a causal mask a query tile streams the keys before the chunk (the cache, all
    visible) and the chunk's keys up to its last row (an appending kernel: in whole
    :data:`.opsamples.FLASH_TILE`-key blocks, mean ``seq_q/2 + 64``); ``skip``: the share of the masked half the kernel skips (1: all,
    as FlashAttention; 0: it computes the full rectangle). ``append``: extra cost of a chunk key
    over a cache key in a kernel that appends (FlashAttention's ``flash_attn_with_kvcache`` with
    k/v: every query tile copies the new keys it sees into the cache before attending to them).
    A grid of an appending kernel that fills less than the SMs is split along the keys as
    FlashAttention's split-KV heuristic does (:func:`_fa_splits`); of another kernel into
    ⌊S/tiles⌋ parts of at least one T-key block each."""
    sq, sk, hd, b = cols["m"], cols["n"], cols["k"], cols["batch"]
    # a decode-like row (fewer queries than one tensor-core row block) is not a query tile: its
    # kernels (flash-decoding, paged attention) pack the queries and split the keys over the SMs and
    # are bound by reading the cache, so it keeps its FLOPs (padding 1 query to a T-row tile would
    # charge T times its work: a Llama-3-8B decode step at batch 32 took 35 ms of attention)
    shaped = (sq >= _MMA_ROWS) & (sk > 0) & (hd > 0) & (b > 0)
    hdim = cols.get("hdim")
    d = np.where(hdim > 0, hdim, d_ref) if hdim is not None else np.full(len(sq), d_ref)
    heads = np.maximum(np.round(np.maximum(hd, 1) / np.maximum(d, 1)), 1)
    causal = cols.get("causal")
    cz = (causal > 0) if causal is not None else np.zeros(len(sq), bool)
    ap = (causal >= 2) if causal is not None else np.zeros(len(sq), bool)
    keys = attention_keys(sq, sk, cz)  # the FLOP convention of the samples (masked half skipped)
    q1 = np.maximum(sq, 1)
    cache = np.maximum(sk - q1, 0)
    # chunk keys a causal query tile of the appending (split-KV) kernel computes: whole 128-key
    # blocks up to its last row's last key (A100 Vidur held out c >= 1024: +6.6 % vs +16.1 % with
    # the exact mean); other causal kernels at the exact mean, as before (the few-shape H100/MI300X
    # fits: whole blocks raised their CV MAPE 12 -> 15 % and 4 -> 46 %)
    new = np.minimum(q1 - skip * np.maximum(q1 / 2.0 - FLASH_TILE / 2.0, 0.0), np.minimum(q1, sk))
    w_new = 1.0 + append * ap
    run = np.where(cz, np.where(ap, cache + w_new * new, np.maximum(sk - skip * sq / 2.0, 0.5)), sk)
    longest = np.where(ap, cache + w_new * np.minimum(q1, sk), np.maximum(sk, 1))  # the last query tile's
    tiles = np.maximum(b, 1) * heads * np.ceil(q1 / tile)
    # the appending kernel is FlashAttention's split-KV kernel, split by its heuristic; a plain
    # forward kernel's grid is its query tiles (H100 bert: 16 tiles on 132 SMs, unsplit), split
    # only where a whole T-key block per split fills more SMs (flash-decoding)
    plain = np.clip(np.minimum(np.floor(max(sms, 1) / tiles), np.floor(np.maximum(sk, 1) / tile)), 1, None)
    splits = np.where(ap, _fa_splits(tiles, np.ceil(np.maximum(sk, 1) / FLASH_TILE), sms), plain)
    waves = np.ceil(tiles * splits / max(sms, 1))
    per_sm = tile * np.maximum(waves * (run / splits + s0), longest / splits + s0)
    ideal = np.maximum(b, 1) * heads * q1 * np.maximum(keys, 0.5)
    return np.where(shaped, cols["flops"] * max(sms, 1) * per_sm / ideal, cols["flops"])


def _per_kind(by_kind: dict[str, float], shared: float, kind: np.ndarray | None) -> np.ndarray | float:
    """Per row, the value of its memory kind (``by_kind``, keyed by :data:`.opsamples.MEM_KINDS`)
    where fitted, else ``shared``; ``shared`` alone without per-kind values or kinds."""
    if not by_kind or kind is None:
        return shared
    tab = np.array([by_kind.get(k, shared) for k in MEM_KINDS] + [shared])
    return tab[np.where((kind >= 0) & (kind < len(MEM_KINDS)), kind, len(MEM_KINDS)).astype(int)]


def loaded_bandwidth_ratio(achieved: float, peak_src: float, peak_dst: float, sms_src: int, sms_dst: int) -> float:
    """Target/source ratio of the bandwidth a memory-bound kernel class achieves, moved by a closed
    memory loop (Little's law with queueing) rather than by the peaks alone.

    The SMs keep a bounded number of bytes in flight, so unloaded they would stream ``X`` B/s;
    latency grows as the memory nears its peak ``B``, and the kernels achieve
    ``W = X / (1 + X / B)``. The source GPU's achieved ``W`` and peak give its ``X``; the target's
    ``X`` scales with its SM count (the same per-SM concurrency); its ``W`` follows from its peak.
    A kernel class that reached its source's peak moves by the peak ratio; one far below it
    (limited by the bytes its SMs keep in flight) gains little from a faster memory."""
    if not (achieved > 0 and peak_src > 0 and peak_dst > 0 and sms_src > 0 and sms_dst > 0):
        return peak_dst / peak_src if peak_src > 0 and peak_dst > 0 else 1.0
    u = min(achieved / peak_src, 0.98)  # at or above the peak the loop is memory-bound: peak ratio
    x_dst = (u / (1.0 - u)) * peak_src * (sms_dst / sms_src)
    w_dst = x_dst / (1.0 + x_dst / peak_dst)
    return w_dst / (u * peak_src)


@dataclass
class ClassFit:
    """Fitted constants of one class (see module doc); ``P`` per dtype group in FLOP/s, ``W`` B/s,
    ``a`` µs per kernel."""

    form: str  # "compute" (soft max of FLOPs and bytes) or "memory" (bytes + floor)
    a: float
    W: float
    P: dict[str, float] = field(default_factory=dict)
    p: float = 1.0
    tile: int = 0  # GEMM shaped form: tile edge (0: shape-free)
    k0: float = 0.0
    n: int = 0
    cv_mape: float | None = None
    transferred_from: str | None = None
    peaks: dict[str, float] = field(default_factory=dict)  # the GPU's data-sheet TFLOP/s (dtype ratios)
    Wk: dict[str, float] = field(default_factory=dict)  # memory form: bandwidth per memory kind
    ak: dict[str, float] = field(default_factory=dict)  # memory form: per-kernel floor (µs) per memory kind
    work: str = "gemm"  # shaped form: "gemm" (k0 per tile in k) or "attention" (k0 = s0 per tile in keys)
    d_ref: float = 0.0  # attention shaped form: head dim assumed where an op's is unknown (median fitted)
    skip: float = 1.0  # attention shaped form: share of the causally masked half the kernels skip
    append: float = 0.0  # attention shaped form: extra cost of a chunk key in a K/V-appending kernel
    sizes: int = 0  # distinct (FLOPs, bytes) points fitted on (0: unknown); few: the floor is not separable
    misalign: float = 1.0  # GEMM shaped form: share of the speed (time above the floor) of an unaligned GEMM
    contention: float = 0.0  # slowdown per unit of overlap with a collective kernel (t·(1 + c·overlap))
    misalign_from: str | None = None  # misaligned rate taken from these GPUs' fits (not measured here)

    def bandwidth(self, cols: dict[str, np.ndarray]) -> np.ndarray | float:
        """Achieved bandwidth per row: its memory kind's where fitted, else the shared one."""
        return _per_kind(self.Wk, self.W, cols.get("kind"))

    def floor(self, cols: dict[str, np.ndarray]) -> np.ndarray | float:
        """Per-kernel floor (µs) per row: its memory kind's where fitted, else the shared one."""
        return _per_kind(self.ak, self.a, cols.get("kind"))

    def predict(self, cols: dict[str, np.ndarray], sms: int) -> np.ndarray:
        """Predicted µs of each row of ``cols`` (flops, nbytes, dtype, kernels, m, n, k, batch)."""
        nk = np.maximum(cols.get("kernels", np.ones(len(cols["nbytes"]))), 1)
        tb = np.maximum(cols["nbytes"], 0) / (self.bandwidth(cols) if self.form == "memory" else self.W) * 1e6
        slow = 1.0 + self.contention * np.clip(cols["overlap"], 0.0, 1.0) if self.contention and "overlap" in cols \
            else 1.0
        if self.form == "memory":
            return (self.floor(cols) * nk + tb) * slow
        f0 = 0.0
        if not self.tile:
            f = np.maximum(cols["flops"], 0)
        elif self.work == "attention":
            f = _attention_work(cols, sms, self.tile, self.k0, self.d_ref, self.skip, self.append)
        else:
            f, f0 = _gemm_work(cols, sms, self.tile, self.k0)
        dt_u, inv = np.unique(np.asarray(cols["dtype"]).astype(str), return_inverse=True)
        P = np.array([self.rate(d) for d in dt_u], float)[np.ravel(inv)]
        # the per-tile cost (epilogue, prologue) is a time, the same for every dtype: k0 is in
        # k-steps at the half-precision rate (a SIMT fp32 GEMM's short-k tiles are not 8x slower)
        tf = (f / P + f0 / self.rate("half")) * 1e6
        core = _softmax(tf, tb, self.p)
        if self.tile and self.work == "gemm" and self.misalign != 1.0:
            # an unaligned kernel (no 16-byte vector loads) is slowed as a whole, its memory
            # traffic as well as its math: a memory-bound one (vocab projection of few tokens)
            # too; the launch floor is not
            core = np.where(misaligned(cols), core / self.misalign, core)
        return (self.a * nk + core) * slow

    def rate(self, dtype: str) -> float:
        """Achieved FLOP/s of a dtype group: fitted, else a fitted group's rate scaled by the
        data-sheet peak ratio of the two dtypes (``peaks``: the GPU's ``peak_tflops``)."""
        v = self.P.get(dtype)
        if v is not None:
            return v
        base = "half" if "half" in self.P else next(iter(self.P))
        if self.peaks:
            return self.P[base] * peak_flops_dtype({"peak_tflops": self.peaks}, dtype) / \
                peak_flops_dtype({"peak_tflops": self.peaks}, base)
        return self.P[base]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        d: dict[str, Any] = {"form": self.form, "a_us": self.a, "W_Bps": self.W, "n": self.n}
        if self.form == "compute":
            d.update(P_flops=self.P, p=self.p)
        if self.Wk:
            d["W_kind_Bps"] = self.Wk
        if self.ak:
            d["a_kind_us"] = self.ak
        if self.tile:
            d.update(tile=self.tile, k0=self.k0)
            if self.work != "gemm":
                d.update(work=self.work, d_ref=self.d_ref, causal_skip=self.skip)
                if self.append:
                    d["append_cost"] = self.append
            if self.misalign != 1.0:
                d["misaligned_rate"] = self.misalign
            if self.misalign_from:
                d["misaligned_from"] = self.misalign_from
        if self.contention:
            d["contention"] = self.contention
        if self.cv_mape is not None:
            d["cv_mape_pct"] = self.cv_mape
        if self.sizes:
            d["sizes"] = self.sizes
        if self.transferred_from:
            d["transferred_from"] = self.transferred_from
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClassFit:
        """Inverse of :meth:`to_dict`."""
        return cls(d["form"], float(d["a_us"]), float(d["W_Bps"]), {k: float(v) for k, v in d.get("P_flops", {}).items()},
                   float(d.get("p", 1.0)), int(d.get("tile", 0)), float(d.get("k0", 0.0)), int(d.get("n", 0)),
                   d.get("cv_mape_pct"), d.get("transferred_from"),
                   Wk={k: float(v) for k, v in d.get("W_kind_Bps", {}).items()},
                   ak={k: float(v) for k, v in d.get("a_kind_us", {}).items()}, work=str(d.get("work", "gemm")),
                   d_ref=float(d.get("d_ref", 0.0)), skip=float(d.get("causal_skip", 1.0)),
                   append=float(d.get("append_cost", 0.0)),
                   sizes=int(d.get("sizes", 0)), misalign=float(d.get("misaligned_rate", 1.0)),
                   contention=float(d.get("contention", 0.0)), misalign_from=d.get("misaligned_from"))


def _fit_class(cols: dict[str, np.ndarray], form: str, sms: int, shaped: bool, hw: dict[str, Any],
               work: str = "gemm", a_min: float = 0.0) -> ClassFit:
    """Least squares on log time for one class (see module doc); ``a_min``: a lower bound of the
    per-kernel floor."""
    from scipy.optimize import least_squares

    # a dtype group gets its own FLOP rate only with enough distinct sizes (repeated kernels of one
    # shape are one point: a few skinny shapes of one trace would set a rate for every shape); its
    # rows are fitted then. Other groups take a fitted group's rate at the data-sheet ratio (rate()).
    sizes = np.stack([cols["flops"], cols["nbytes"]], axis=1)
    dts = [d for d in DTYPES if len(np.unique(sizes[cols["dtype"] == d], axis=0)) >= MIN_CLASS_SAMPLES] \
        if form == "compute" else []
    if form == "compute" and not dts:  # few sizes of any: the class's rate is its commonest group's
        cnt = [(cols["dtype"] == d).sum() for d in DTYPES]
        dts = [DTYPES[int(np.argmax(cnt))]] if max(cnt) >= MIN_CLASS_SAMPLES else []
    if form == "compute":
        keep = np.isin(cols["dtype"], dts)
        if not keep.any():
            raise ValueError("no dtype group with enough samples")
        cols = {k: v[keep] for k, v in cols.items()}
    if shaped and work == "attention" and _distinct_shapes(cols) < MIN_CLASS_SAMPLES:
        return _fit_attention_few(cols, sms, hw, dts, a_min)
    t = cols["dur"]
    logt = np.log(t)
    bw0 = float(hw.get("hbm_gbps", 2000.0)) * 1e9
    a0 = float(np.percentile(t, 5))

    # memory kinds with enough samples get their own bandwidth (parameters after a and W)
    # — only kinds with enough kernels big enough to show it (≥ 5 µs of bytes at the data-sheet
    # bandwidth); small kernels only measure the floor
    kcol = cols.get("kind")
    big = cols["nbytes"] / (float(hw.get("hbm_gbps", 2000.0)) * 1e9) >= 5e-6
    kinds = [i for i in range(len(MEM_KINDS)) if kcol is not None and (big & (kcol == i)).sum() >= MIN_CLASS_SAMPLES] \
        if form == "memory" else []
    # ... and their own per-kernel floor: a norm or reduction kernel does a block reduction and
    # two passes over its rows, so its launch-to-finish time is about twice an elementwise one's
    # (H100 bert: 3.1 vs 1.7 µs; MI300X resnet: 7.3 vs 3.6 µs). Only kinds with enough distinct
    # sizes of small kernels (below 5 µs of bytes at the data-sheet bandwidth: their time is mostly
    # floor; repeated kernels of one size are one point) from at least two sources: one workload's
    # kernels of a kind share its geometry (A100 hta_8rank's column sums take 8-18 µs at 0.1-2 MB,
    # hta_16rank's row sums 5 µs), a floor of that workload, not of the kind
    grp = cols.get("group")

    def _sources(sel: np.ndarray) -> int:
        return len(np.unique(grp[sel])) if grp is not None else 2

    fkinds = [i for i in range(len(MEM_KINDS)) if kcol is not None
              and len(np.unique(cols["nbytes"][~big & (kcol == i)])) >= MIN_CLASS_SAMPLES
              and _sources(~big & (kcol == i)) >= 2] if form == "memory" else []

    def build(x: np.ndarray, tile: int) -> ClassFit:
        a, W = np.exp(x[0]), np.exp(x[1])
        if form == "memory":
            return ClassFit("memory", a, W, Wk={MEM_KINDS[k]: float(np.exp(x[2 + i])) for i, k in enumerate(kinds)},
                            ak={MEM_KINDS[k]: float(np.exp(x[2 + len(kinds) + i])) for i, k in enumerate(fkinds)})
        P = {d: float(np.exp(x[2 + i])) for i, d in enumerate(dts)}
        p = 1.0 + np.exp(x[2 + len(dts)])
        k0 = float(np.exp(x[3 + len(dts)])) if tile else 0.0
        sk = float(1.0 / (1.0 + np.exp(-x[4 + len(dts)]))) if tile and fit_skip and not fit_app else 1.0
        app = float(np.exp(x[4 + len(dts)])) if tile and fit_skip and fit_app else 0.0
        ma = float(1.0 / (1.0 + np.exp(-x[4 + len(dts)]))) if tile and fit_align else 1.0
        return ClassFit("compute", float(a), float(W), P, float(p), tile, k0, work=work, d_ref=d_ref, skip=sk, append=app,
                        peaks=dict(hw.get("peak_tflops", {})), misalign=ma)

    def resid(x: np.ndarray, tile: int) -> np.ndarray:
        return np.log(np.maximum(build(x, tile).predict(cols, sms), 1e-6)) - logt

    x0 = [np.log(max(a0 * 0.5, 1e-3)), np.log(bw0 * 0.5)]
    lo_w = lo_a = -np.inf
    if kinds or fkinds:
        # the shared bandwidth and floor (kinds without their own) are the one-bandwidth,
        # one-floor fit of every row: the class's floor, a lower bound of the compute classes'
        # and the ratio transfer_to moves the floors of kinds without a pair by
        base = _fit_class({k: v for k, v in cols.items() if k != "kind"}, form, sms, shaped, hw)
        x0 = [np.log(base.a), np.log(base.W)]
        lo_w = np.log(base.W) - 1e-3  # held (a bound of ±0.1 %: least_squares needs lb < ub)
        lo_a = np.log(base.a) - 1e-3 if fkinds else -np.inf
        x0 += [np.log(base.W)] * len(kinds) + [np.log(base.a)] * len(fkinds)
    if form == "compute":
        x0 += [np.log(peak_flops_dtype(hw, d) * 0.5) for d in dts] + [np.log(2.0)]
    best: tuple[float, ClassFit] | None = None
    d_ref = 0.0
    fit_skip = fit_app = False
    # the rate of unaligned GEMMs is seen only with enough distinct unaligned shapes
    mis = misaligned(cols) if shaped and work == "gemm" else np.zeros(0, bool)
    if mis.any():
        # ... among kernels that do measurable math: an unaligned GEMM whose FLOPs take less than
        # the class's fastest kernels (5th percentile of time) at the data-sheet peak is launch
        # bound, its time says nothing of its rate
        dt_u, inv = np.unique(np.asarray(cols["dtype"]).astype(str), return_inverse=True)
        peak = np.array([peak_flops_dtype(hw, d) for d in dt_u])[np.ravel(inv)]
        mis &= cols["flops"] / peak * 1e6 >= a0
    fit_align = bool(mis.any()) and len(np.unique(np.stack([cols[k][mis] for k in ("m", "n", "k", "batch")], axis=1),
                                                  axis=0)) >= MIN_CLASS_SAMPLES
    if shaped and work == "attention":
        hd = cols.get("hdim", np.zeros(0))
        d_ref = float(np.median(hd[hd > 0])) if (hd > 0).any() else 128.0
        # how much of the masked half the kernels skip is seen only where causal ops differ in
        # seq_q/seq_kv (a chunk after a cache); elsewhere the kernels' own convention (all of it)
        cz = (cols.get("causal", np.zeros(0)) > 0) & (cols["m"] > 0) & (cols["n"] > 0)
        fit_skip = len(np.unique(np.round(cols["m"][cz] / cols["n"][cz], 2))) >= 3
        # ... and where those are kernels that append the chunk's K/V to the cache (causal == 2),
        # the extra cost of a chunk key over a cache key instead: FlashAttention's kvcache kernel
        # skips the masked blocks, but every query tile first copies the new keys it sees (A100
        # Vidur table: a chunk key costs about 3x a cache key per tile, fitted over c >= 512)
        fit_app = fit_skip and bool((cols["causal"][cz] >= 2).any())
    for tile in ((_ATTN_TILES if work == "attention" else _TILES) if shaped else (0,)):
        xs = np.array(x0 + ([np.log(32.0)] if tile else []) + ([2.0] if tile and (fit_skip or fit_align) else []), float)
        if tile and fit_app:
            xs[-1] = 0.0  # κ = 1 to start
        # physical ceilings (data sheet): a FLOP rate at most the dtype's tensor-core peak, a
        # bandwidth at most twice HBM (small working sets run from cache); floors unbounded
        hi = np.full(len(xs), np.inf)
        hi[1] = np.log(2.0 * bw0) if not (kinds or fkinds) else lo_w + 2e-3
        if fkinds:
            hi[0] = lo_a + 2e-3
        hi[2:2 + len(kinds)] = np.log(2.0 * bw0)
        for i, d in enumerate(dts):
            hi[2 + i] = np.log(peak_flops_dtype(hw, d))
        xs = np.minimum(xs, hi - 1e-6)
        lo = np.full(len(xs), -np.inf)
        lo[0], lo[1] = lo_a, lo_w
        lo[2 + len(kinds):2 + len(kinds) + len(fkinds)] = np.log(_MIN_FLOOR_US)  # no kernel launches faster
        xs = np.maximum(xs, lo + 1e-6)
        if a_min > 0:
            lo[0] = np.log(a_min)
            xs[0] = max(xs[0], lo[0] + 1e-3)
        r = least_squares(resid, xs, args=(tile,), loss="soft_l1", f_scale=0.1, max_nfev=400, bounds=(lo, hi))
        cost = float(np.mean(np.abs(np.expm1(resid(r.x, tile)))))
        if best is None or cost < best[0]:
            best = (cost, build(r.x, tile))
    assert best is not None
    cf = best[1]
    cf.n = int(len(t))
    cf.sizes = len(np.unique(np.stack([cols["flops"], cols["nbytes"]], axis=1), axis=0))
    return cf


def _fit_attention_few(cols: dict[str, np.ndarray], sms: int, hw: dict[str, Any], dts: list[str],
                       a_min: float) -> ClassFit:
    """The shaped attention form fitted on a few distinct shapes (fewer than
    :data:`MIN_CLASS_SAMPLES`, at least two; one trace's attention has one shape): only the FLOP rate
    and the per-tile cost s0 are fitted — the two numbers a few shapes tell apart (one-wave kernels
    of short sequences are mostly per-tile cost, many-wave ones mostly rate). The rest is not
    identifiable there and is taken where it is measured: the floor is the per-kernel floor of the
    GPU's memory-bound kernels (``a_min``; without it the floor is fitted too, from three shapes),
    the query tile is FlashAttention's (:data:`.opsamples.FLASH_TILE`; CK's too), bytes are at the
    data-sheet bandwidth and meet the FLOPs as the roofline's max (a fused kernel streams K/V
    behind its math), and the kernels skip the whole masked half."""
    from scipy.optimize import least_squares

    n_shapes = _distinct_shapes(cols)
    free_a = a_min <= 0
    if n_shapes < 2 + int(free_a):
        raise ValueError("too few attention shapes")
    hd = cols.get("hdim", np.zeros(0))
    d_ref = float(np.median(hd[hd > 0])) if (hd > 0).any() else 128.0
    bw0 = float(hw.get("hbm_gbps", 2000.0)) * 1e9
    logt = np.log(cols["dur"])
    peaks = dict(hw.get("peak_tflops", {}))

    def build(x: np.ndarray) -> ClassFit:
        a = float(np.exp(x[2])) if free_a else float(a_min)
        return ClassFit("compute", a, bw0, {d: float(np.exp(x[0])) for d in dts}, 1e3, FLASH_TILE,
                        float(np.exp(x[1])), work="attention", d_ref=d_ref, skip=1.0, peaks=peaks)

    hi = np.array([np.log(min(peak_flops_dtype(hw, d) for d in dts)), np.inf] + ([np.inf] if free_a else []))
    x0 = np.array([hi[0] - np.log(4.0), np.log(64.0)] + ([np.log(max(float(np.min(cols["dur"])) * 0.5, 1e-3))]
                                                          if free_a else []))
    r = least_squares(lambda x: np.log(np.maximum(build(x).predict(cols, sms), 1e-6)) - logt, x0,
                      loss="soft_l1", f_scale=0.1, max_nfev=400, bounds=(np.full(len(x0), -np.inf), hi))
    cf = build(r.x)
    cf.n = int(len(cols["dur"]))
    cf.sizes = len(np.unique(np.stack([cols["flops"], cols["nbytes"]], axis=1), axis=0))
    return cf


def peak_flops_dtype(hw: dict[str, Any], dtype: str) -> float:
    """Data-sheet peak FLOP/s of a dtype group on ``hw`` (``half`` = bf16/fp16)."""
    tab = hw.get("peak_tflops", {})
    if dtype == "half" and (tab.get("fp16") or tab.get("bf16")):
        # fp16 and bf16 share a group: the faster (V100's tensor cores run fp16 only; bf16 is SIMT there)
        return float(max(tab.get("fp16") or 0.0, tab.get("bf16") or 0.0)) * 1e12
    v = tab.get(_PEAK_KEY.get(dtype, dtype)) or (tab.get("fp32") if dtype == "tf32" else None) or tab.get("fp16") or tab.get("bf16") or max(tab.values() or [100.0])
    return float(v) * 1e12


_SHAPED = {GEMM: "gemm", ATTENTION: "attention"}  # classes with a shaped form (its work function)
_FORM = {GEMM: "compute", ATTENTION: "compute", CONV: "compute", EMBEDDING: "memory", MEMORY: "memory",
         OTHER: "memory"}


def _preset_match(gpu: str) -> dict[str, Any]:
    """``match`` of the hardware preset named ``gpu`` (presets.json); empty where unknown."""
    from .compute import presets

    for name, p in presets().items():
        if gpu == name or gpu in p.get("names", []):
            return p.get("match") or {}
    return {}


def _vendor(gpu: str) -> str | None:
    """The vendor of a hardware preset (``match.vendor`` in presets.json); None where unknown."""
    return _preset_match(gpu).get("vendor")


def _architecture(match: dict[str, Any]) -> tuple[str, tuple[int, ...]] | None:
    """``(vendor, compute capability)`` of a preset's ``match``; None where either is unknown: GPUs
    of one architecture share their SM design (and the bytes it keeps in flight)."""
    if match.get("vendor") and match.get("compute"):
        return str(match["vendor"]), tuple(int(x) for x in match["compute"])
    return None


def _distinct_shapes(cols: dict[str, np.ndarray]) -> int:
    """Distinct known shapes among the rows: a shaped form has more constants (tile, per-tile cost)
    than a few shapes can tell apart — repeated kernels of one shape are one point."""
    sh = cols["m"] > 0
    if not sh.any():
        return 0
    key = np.stack([cols[k][sh] for k in ("m", "n", "k", "batch")] + [cols.get("hdim", cols["m"])[sh]], axis=1)
    return len(np.unique(key, axis=0))


def class_key(cls: int, shaped: bool) -> str:
    """JSON key of a class fit (the GEMM class has a shaped and a shape-free form)."""
    return OP_CLASSES[cls] + ("_shaped" if shaped else "")


# GEMM shapes on which two GPUs' shaped GEMM fits are compared (transformer-like: a decode-size
# batch to a long-sequence prefill, hidden sizes 1k-16k); the ratio barely moves with the choice
# (0.72-0.79 H100->MI300X over grids from 64-row to 16k-row GEMMs)
_REF_M = (256.0, 1024.0, 4096.0, 16384.0)
_REF_NK = (1024.0, 4096.0, 16384.0)


def _gemm_throughput_ratio(tgt: OpModel, src: OpModel, dtype: str) -> float | None:
    """Target/source GEMM throughput ratio of ``dtype``: the time the source GPU's shaped GEMM fit
    predicts for a fixed set of shapes (:data:`_REF_M` × :data:`_REF_NK`², floor left out) over the
    target's — each fit with its own SM count (wave quantization), tile, per-tile cost and rate.
    The shape-free rates of two fits are not comparable: each is an average over the shapes its
    GPU's data happened to hold (an H100 fit on 70B-model GEMMs near peak against an MI300X fit on
    small models' GEMMs). None unless both fits have a measured shaped GEMM form."""
    key = class_key(GEMM, True)
    t, s = tgt.classes.get(key), src.classes.get(key)
    if t is None or s is None or t.transferred_from or s.transferred_from or min(t.n, s.n) < MIN_CLASS_SAMPLES:
        return None
    g = np.array([(m, n, k) for m in _REF_M for n in _REF_NK for k in _REF_NK])
    m, n, k = g.T
    cols = {"m": m, "n": n, "k": k, "batch": np.ones(len(g)), "flops": 2.0 * m * n * k,
            "nbytes": _ELEM_BYTES.get(dtype, 2) * (m * k + k * n + m * n), "dtype": np.full(len(g), dtype, object),
            "kernels": np.ones(len(g))}
    ts = replace(s, a=0.0, contention=0.0).predict(cols, src.sms).sum()
    tt = replace(t, a=0.0, contention=0.0).predict(cols, tgt.sms).sum()
    return float(ts / tt) if tt > 0 and ts > 0 else None


@dataclass
class OpModel:
    """Per-class op cost models of one GPU (see the module doc)."""

    gpu: str
    hw: dict[str, Any]
    sms: int
    classes: dict[str, ClassFit] = field(default_factory=dict)
    sources: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def fit(cls, cols: dict[str, np.ndarray], gpu: str, hw: dict[str, Any], sms: int,
            sources: list[dict[str, Any]] | None = None) -> OpModel:
        """Fit every class with at least :data:`MIN_CLASS_SAMPLES` samples."""
        m = cls(gpu, {k: hw[k] for k in ("peak_tflops", "hbm_gbps") if k in hw}, int(sms), {}, sources or [])
        ok = (cols["dur"] > 0) & (cols["nbytes"] > 0)
        ovl = cols["overlap"] if "overlap" in cols else np.zeros(len(ok))
        # memory-bound classes first: their many tiny kernels measure the per-kernel floor, a lower
        # bound of every compute kernel's (a kernel that does nearly nothing takes at least the
        # launch-to-finish time of an elementwise one). A compute class's own data often cannot
        # tell its floor apart (GEMMs of one token are weight-read bound; the per-tile cost of the
        # shaped form absorbs it)
        a_min = 0.0
        for c in (MEMORY, EMBEDDING, GEMM, ATTENTION, CONV):
            if c == GEMM and class_key(MEMORY, False) in m.classes:
                a_min = m.classes[class_key(MEMORY, False)].a
            if c == OTHER:
                continue  # custom ops: their arguments do not describe their work; not fitted
            sel = ok & (cols["cls"] == c)
            if sel.sum() < MIN_CLASS_SAMPLES:
                continue
            # the class's terms are those of a kernel alone on the GPU: ops that ran beside a
            # collective kernel are fitted after (contention), where enough ran alone
            alone = sel & (ovl < _ALONE)
            if alone.sum() >= MIN_CLASS_SAMPLES:
                sel = alone
            sub = {k: v[sel] for k, v in cols.items()}
            if _FORM[c] == "compute":
                sub_ok = sub["flops"] > 0
                sub = {k: v[sub_ok] for k, v in sub.items()}
                if len(sub["dur"]) < MIN_CLASS_SAMPLES:
                    continue
            try:
                m.classes[class_key(c, False)] = _fit_class(sub, _FORM[c], m.sms, False, hw, a_min=a_min)
                if c in _SHAPED and _distinct_shapes(sub) >= (2 if c == ATTENTION else MIN_CLASS_SAMPLES):
                    m.classes[class_key(c, True)] = _fit_class(sub, "compute", m.sms, True, hw, _SHAPED[c],
                                                               a_min=a_min)
            except ValueError:
                continue
        m._fit_contention(cols, ok & (ovl >= _ALONE))
        m._set_peaks()
        return m

    def _fit_contention(self, cols: dict[str, np.ndarray], rows: np.ndarray) -> None:
        """Contention: a kernel that runs beside a collective kernel shares the SMs (NCCL holds
        some for its channels) and memory bandwidth with it, so its time grows with the share of it
        overlapped: ``t·(1 + c·overlap)``. ``c`` is fitted (log time, soft-L1) on the rows of each
        class that overlapped, given the class's alone prediction — per class with at least
        :data:`MIN_CLASS_SAMPLES` distinct overlapped sizes, else one ``c`` over every class's
        overlapped rows (where those reach the count); no term without such data."""
        from scipy.optimize import least_squares

        if not rows.any():
            return
        sub = {k: v[rows] for k, v in cols.items()}
        pred = self.predict({**sub, "overlap": np.zeros(len(sub["dur"]))})
        good = np.isfinite(pred) & (pred > 0)
        if not good.any():
            return
        sub = {k: v[good] for k, v in sub.items()}
        r = np.log(sub["dur"]) - np.log(pred[good])
        ov = np.clip(sub["overlap"], 0.0, 1.0)

        def fit(sel: np.ndarray) -> float | None:
            if len(np.unique(np.stack([sub["flops"][sel], sub["nbytes"][sel]], 1), axis=0)) < MIN_CLASS_SAMPLES:
                return None
            res = least_squares(lambda x: np.log1p(np.exp(x[0]) * ov[sel]) - r[sel], [0.0], loss="soft_l1",
                                f_scale=0.1, bounds=([-20.0], [5.0]))
            return float(np.exp(res.x[0]))

        pooled = fit(np.ones(len(r), bool))
        for c in range(len(OP_CLASSES)):
            own = fit(sub["cls"] == c) if (sub["cls"] == c).any() else None
            v = own if own is not None else pooled
            if v is None:
                continue
            for k in (class_key(c, False), class_key(c, True)):
                if k in self.classes:
                    self.classes[k].contention = v

    def borrow_misaligned(self, donors: list[OpModel]) -> None:
        """Fallback for the unaligned-GEMM rate (:attr:`ClassFit.misalign`) where this GPU's own
        kernels do not measure it (fewer than :data:`MIN_CLASS_SAMPLES` unaligned shapes doing
        measurable math): the median of the rates the ``donors`` (other GPUs' fits) *measured* on
        their own kernels — a dimensionless property of the kernel library (no 16-byte vector
        loads), not of the GPU, so only donors of the same vendor lend it (CUTLASS/cuBLAS
        ``align1``/``align2`` kernels; bert's vocab GEMM, n = 30522, runs 2x its aligned prediction
        on H100 but at it on MI300X's hipBLASLt). A donor's own borrowed or transferred rate is never
        passed on. Recorded in the fit as ``misaligned_from``."""
        key = class_key(GEMM, True)
        own = self.classes.get(key)
        if own is None or own.misalign != 1.0 or own.misalign_from:
            return
        mine = _vendor(self.gpu)
        got = sorted((d.gpu, d.classes[key].misalign) for d in donors
                     if d.gpu != self.gpu and key in d.classes and d.classes[key].misalign != 1.0
                     and not d.classes[key].misalign_from and not d.classes[key].transferred_from
                     and (mine is None or _vendor(d.gpu) in (None, mine)))
        if got:
            own.misalign = float(np.median([v for _, v in got]))
            own.misalign_from = ",".join(g for g, _ in got)

    def _set_peaks(self) -> None:
        for c in self.classes.values():
            c.peaks = dict(self.hw.get("peak_tflops", {}))

    def transfer_to(self, gpu: str, hw: dict[str, Any], sms: int, target_fit: OpModel | None = None,
                    source_fit: OpModel | None = None) -> OpModel:
        """This fit moved to another GPU term by term: each class keeps its form (tile, per-tile
        cost, how compute and memory bound meet) and its floor, FLOP rate and bandwidth are each
        multiplied by the target/source ratio of *that term*, taken where it is measured; the SM
        count is the target's (wave quantization).

        Without fits of both GPUs the ratios are the data sheet's (peak FLOP/s of the dtype, memory
        bandwidth; floors kept). With ``target_fit`` (the target GPU's own fit, on other workloads)
        and ``source_fit`` (the source GPU's fit on other workloads; default this one) each ratio
        is the two fits' own, from the class that measures the term best:

        * floor (launch/latency per kernel): the class's two floors where both fits have the class
          (≥ :data:`MIN_CLASS_SAMPLES`) and both floors are identified (≥ 0.5 µs: a fitted floor
          below any kernel's launch time was absorbed by the other terms), else the memory class's
          (its many small kernels pin the floor; ROCm's is about twice CUDA's);
        * FLOP rate per dtype: of the GEMM class (both forms), and of a class without a pair of its
          own, the GEMM throughput ratio of the two fits' shaped GEMM forms predicting the same
          reference shapes (:func:`_gemm_throughput_ratio`: shape-free rates average over whatever
          shapes each GPU's data held; H100->MI300X 0.77-0.79 on every leave-one-model-out pair of
          fits, where the shape-free rates give 0.74-0.90); of another class (attention, conv) the
          class's two shape-free rates (the shaped forms' rates depend on their fitted tile and
          per-tile cost, so are not comparable as numbers); else the shape-free GEMM rates; else
          the data sheet's; a moved rate is capped at the target's data-sheet peak (the fit's own
          ceiling: a one-model fit pinned at the source's peak, times a ratio above 1, would exceed it);
        * per-kernel floor of a memory kind (:attr:`ClassFit.ak`): the two memory fits' floors of
          the kind where both have one (identified, as above), else the class's floor ratio;
        * bandwidth of a memory-form class: per memory kind where both memory fits have the kind,
          else their shared bandwidths; without a target fit, between GPUs of one architecture
          (vendor and compute capability: the same SM design), the source's achieved bandwidth of
          the kind moved by :func:`loaded_bandwidth_ratio` (not the data-sheet ratio: a kernel
          that reached 60 % of one GPU's peak does not reach 60 % of a faster memory's with the
          same SMs); else the data-sheet ratio; of a compute-form class: its FLOP-rate ratio — the byte
          term of a GEMM/attention fit is the kernel's data-movement efficiency on the shapes it
          saw (fitted far below or above HBM), not an HBM measurement, and the hardware ratio
          measured for the kernel class is its throughput's.

        A class fitted on fewer than :data:`MIN_CLASS_SAMPLES` distinct sizes (one workload's few
        shapes) cannot tell its floor from its size-dependent work: of its fitted floor, only up to
        the source GPU's measured floor for the class moves at the floor ratio, the rest (fixed
        work per kernel) at the class's throughput ratio. A class this fit lacks is the
        ``source_fit``'s, moved alike. Ratios of parameters, not of the two fits' predictions: the
        target fit's shaped forms were fitted on other shapes, and scaling each term keeps the
        source fit's total right whichever way it split it."""
        out = OpModel(gpu, {k: hw[k] for k in ("peak_tflops", "hbm_gbps") if k in hw}, int(sms), {},
                      [{"transferred_from": self.gpu}])
        src, tgt = source_fit or self, target_fit

        def sheet_p(d: str) -> float:
            return peak_flops_dtype(hw, d) / peak_flops_dtype(self.hw, d)

        def pair(name: str) -> tuple[ClassFit, ClassFit] | None:
            t = tgt.classes.get(name) if tgt else None
            s = src.classes.get(name)
            ok = t is not None and s is not None and min(t.n, s.n) >= MIN_CLASS_SAMPLES
            return (t, s) if ok else None  # type: ignore[return-value]

        mem, gem = pair(class_key(MEMORY, False)), pair(class_key(GEMM, False))
        peak_s, peak_t = float(self.hw.get("hbm_gbps", 1.0)) * 1e9, float(hw.get("hbm_gbps", 1.0)) * 1e9
        bw_sheet = peak_t / peak_s
        r_a0 = mem[0].a / mem[1].a if mem and min(mem[0].a, mem[1].a) >= _MIN_FLOOR_US else 1.0
        # the closed memory loop assumes the same per-SM concurrency: one architecture's GPUs only
        arch = _architecture(_preset_match(self.gpu))
        same_arch = arch is not None and arch == _architecture(hw.get("match") or {})
        src_mem = src.classes.get(class_key(MEMORY, False)) if same_arch else None
        r_w0 = (mem[0].W / mem[1].W if mem
                else loaded_bandwidth_ratio(src_mem.W, peak_s, peak_t, self.sms, sms) if src_mem else bw_sheet)

        def r_w(kind: str) -> float:
            if mem and kind in mem[0].Wk and kind in mem[1].Wk:
                return mem[0].Wk[kind] / mem[1].Wk[kind]
            if not mem and src_mem is not None and kind in src_mem.Wk:
                return loaded_bandwidth_ratio(src_mem.Wk[kind], peak_s, peak_t, self.sms, sms)
            return r_w0

        def r_ak(kind: str, r_a: float) -> float:
            # a memory kind's floor: the two memory fits' floors of the kind, else the class's ratio
            if mem and min(mem[0].ak.get(kind, 0.0), mem[1].ak.get(kind, 0.0)) >= _MIN_FLOOR_US:
                return mem[0].ak[kind] / mem[1].ak[kind]
            return r_a

        grid: dict[str, float | None] = {}

        def r_gemm(d: str) -> float | None:
            if d not in grid:
                grid[d] = _gemm_throughput_ratio(tgt, src, d) if tgt is not None else None
            return grid[d]

        own = dict(self.classes)
        for k, c in src.classes.items():  # a class this fit lacks: the source GPU's other fit of it
            if k.removesuffix("_shaped") not in self.classes:
                own.setdefault(k, c)
        for k, c in own.items():
            pc = pair(k.removesuffix("_shaped"))
            r_a = pc[0].a / pc[1].a if pc and min(pc[0].a, pc[1].a) >= _MIN_FLOOR_US else r_a0
            # a floor fitted on few sizes is not separable from the size-dependent terms: the part
            # above the source GPU's measured floor for the class is per-kernel work, moved at the
            # class's throughput ratio; only the rest is launch/latency, moved at the floor ratio
            ref = pc[1].a if pc else mem[1].a if mem else c.a
            fl = min(c.a, ref) if 0 < c.sizes < MIN_CLASS_SAMPLES else c.a
            if c.form == "memory":
                out.classes[k] = replace(c, a=fl * r_a + (c.a - fl) / r_w0, W=c.W * r_w0, P={}, cv_mape=None,
                                         transferred_from=self.gpu, Wk={kk: v * r_w(kk) for kk, v in c.Wk.items()},
                                         ak={kk: v * r_ak(kk, r_a) for kk, v in c.ak.items()})
                continue
            own_pc = bool(pc and pc[0].P and pc[1].P)
            rates = pc if own_pc else gem if gem and gem[0].P and gem[1].P else None
            P = {d: v * (rates[0].rate(d) / rates[1].rate(d) if rates else sheet_p(d)) for d, v in c.P.items()}
            if (k.removesuffix("_shaped") == class_key(GEMM, False) or not own_pc) and all(
                    r_gemm(d) is not None for d in c.P):
                # GEMM throughput: the two GPUs' shape-aware fits on the same shapes (see r_gemm)
                P = {d: v * r_gemm(d) for d, v in c.P.items()}  # type: ignore[operator]
                rates = rates or (c, c)  # measured: the byte term moves with the throughput too
            base = "half" if "half" in c.P else next(iter(c.P), None)
            r_p = P[base] / c.P[base] if base else 1.0
            # the fit's physical ceiling holds on the target too: no rate above its data-sheet peak
            P = {d: min(v, peak_flops_dtype(hw, d)) for d, v in P.items()}
            # every other field (tile, per-tile cost, misaligned rate, contention, ...) is a share or
            # a shape constant of the kernels, kept as fitted
            out.classes[k] = replace(c, a=fl * r_a + (c.a - fl) / r_p, W=c.W * (r_p if rates else bw_sheet), P=P,
                                     cv_mape=None, transferred_from=self.gpu)
        out._set_peaks()
        return out

    def _class_rows(self, cols: dict[str, np.ndarray]) -> Iterator[tuple[int, np.ndarray, ClassFit,
                                                                        ClassFit | None, np.ndarray | None]]:
        """For each class with a fit: ``(class, rows, fit, shaped fit or None, shaped mask of the
        rows or None)`` — the fits :meth:`predict` times those rows with (an embedding without a fit
        of its own takes the memory class's: gathers move bytes; so does a decode-like attention
        row, fewer queries than one tensor-core row block: flash-decoding and paged-attention
        kernels stream the cache's K and V, and the attention fits are fitted on prefill kernels,
        whose byte term is their data movement behind the math, not a bandwidth — A100's put a
        Llama-3-8B decode step's attention at 4x the cache read at HBM speed, where Vidur's A100
        decode kernels run at about 60 % of it)."""
        cl = cols["cls"]
        mem = self.classes.get(class_key(MEMORY, False))
        for c in range(len(OP_CLASSES)):
            sel = cl == c
            if c == ATTENTION and mem is not None and "m" in cols:
                decode = sel & (cols["m"] > 0) & (cols["m"] < _MMA_ROWS)
                if decode.any():
                    yield c, decode, mem, None, None
                    sel = sel & ~decode
            if not sel.any():
                continue
            fit = self.classes.get(class_key(c, False))
            if fit is None and c == EMBEDDING:
                fit = self.classes.get(class_key(MEMORY, False))
            if fit is None:
                continue
            shaped_fit = self.classes.get(class_key(c, True)) if c in _SHAPED else None
            shaped = None
            if shaped_fit is not None:
                shaped = (cols["m"][sel] > 0) & (cols["n"][sel] > 0) & (cols["k"][sel] > 0)
            yield c, sel, fit, shaped_fit, shaped

    def predict(self, cols: dict[str, np.ndarray]) -> np.ndarray:
        """Predicted µs per row (NaN for a class this model has no fit of)."""
        out = np.full(len(cols["nbytes"]), np.nan)
        for c, sel, fit, shaped_fit, shaped in self._class_rows(cols):
            sub = {k: v[sel] for k, v in cols.items()}
            t = fit.predict(sub, self.sms)
            if shaped_fit is not None and shaped is not None and shaped.any():
                t = np.where(shaped, shaped_fit.predict(sub, self.sms), t)
            if _FORM[c] == "compute":
                t = np.where(sub["flops"] >= 0, t, np.nan)
            out[sel] = np.where(sub["nbytes"] >= 0, t, np.nan)
        return out

    def contention(self, cols: dict[str, np.ndarray]) -> np.ndarray:
        """Per row, the contention slope ``c`` (:attr:`ClassFit.contention`) of the class fit that
        :meth:`predict` times it with (0 where no fit applies)."""
        out = np.zeros(len(cols["nbytes"]))
        for _c, sel, fit, shaped_fit, shaped in self._class_rows(cols):
            v = np.full(int(sel.sum()), float(fit.contention))
            if shaped_fit is not None and shaped is not None:
                v[shaped] = float(shaped_fit.contention)
            out[sel] = v
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"format": FORMAT, "version": 1, "gpu": self.gpu, "sms": self.sms, "hardware": self.hw,
                "model": __doc__.split("\n\n")[1].strip() if __doc__ else "",
                "classes": {k: v.to_dict() for k, v in sorted(self.classes.items())},
                "sources": self.sources}

    def save(self, path: str | Path) -> Path:
        """Write as JSON (atomically)."""
        path = Path(path)
        with atomic_write(path) as f:
            f.write(json.dumps(self.to_dict(), indent=1).encode())
        return path

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "<fit>") -> OpModel:
        """Inverse of :meth:`to_dict`."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise TraceError(where, f"not an ettools op model (expected format {FORMAT!r})")
        m = cls(str(d["gpu"]), dict(d.get("hardware", {})), int(d.get("sms", 0)),
                {k: ClassFit.from_dict(v) for k, v in d.get("classes", {}).items()}, list(d.get("sources", [])))
        m._set_peaks()
        return m

    @classmethod
    def load(cls, path: str | Path) -> OpModel:
        """Read a model written by :meth:`save`."""
        p = Path(path)
        d = load_json(p)
        return cls.from_dict(d, str(p))


def mape(pred: np.ndarray, actual: np.ndarray) -> float:
    """Mean absolute percentage error in % (NaN predictions left out)."""
    ok = np.isfinite(pred) & (actual > 0)
    return float(100.0 * np.mean(np.abs(pred[ok] - actual[ok]) / actual[ok])) if ok.any() else float("nan")


def cross_validate(cols: dict[str, np.ndarray], gpu: str, hw: dict[str, Any], sms: int,
                   donors: list[OpModel] | None = None) -> dict[str, Any]:
    """Leave-one-group-out (a group is a model or trace): fit on the others, predict the held-out
    group. Returns per-class MAPE (``gemm`` uses the shape-aware form where shapes are known) and,
    per group, predicted vs measured total time. ``donors``: other GPUs' fits each fold borrows
    from as the shipped fit does (:meth:`OpModel.borrow_misaligned`)."""
    groups = sorted(set(cols["group"].tolist()))
    pred = np.full(len(cols["dur"]), np.nan)
    for g in groups:
        test = cols["group"] == g
        train = {k: v[~test] for k, v in cols.items()}
        if len(train["dur"]) < MIN_CLASS_SAMPLES:
            continue
        m = OpModel.fit(train, gpu, hw, sms)
        m.borrow_misaligned(donors or [])
        pred[test] = m.predict({k: v[test] for k, v in cols.items()})
    per_class = {}
    for c in range(len(OP_CLASSES)):
        sel = cols["cls"] == c
        if sel.any():
            per_class[OP_CLASSES[c]] = {"n": int(sel.sum()), "mape_pct": mape(pred[sel], cols["dur"][sel]),
                                        "predicted": int(np.isfinite(pred[sel]).sum())}
    per_group = {}
    for g in groups:
        sel = (cols["group"] == g) & np.isfinite(pred)
        meas = float(cols["dur"][sel].sum())
        per_group[g] = {"measured_us": meas, "predicted_us": float(pred[sel].sum()),
                        "error_pct": 100.0 * (float(pred[sel].sum()) - meas) / meas if meas else float("nan"),
                        "coverage": float(sel.sum() / max((cols["group"] == g).sum(), 1))}
    return {"groups": groups, "per_class": per_class, "per_group": per_group, "pred": pred}


_DTYPE_GROUP = {"bf16": "half", "fp16": "half", "half": "half", "bfloat16": "half", "float16": "half",
                "fp32": "fp32", "float32": "fp32", "float": "fp32", "tf32": "tf32", "fp64": "fp64",
                "fp8": "fp8", "float8": "fp8", "int8": "int8"}


def graph_cols(g: Any, flops: np.ndarray, nbytes: np.ndarray, hw: dict[str, Any]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``(rows, columns)`` of the model targets of a rank graph for :meth:`OpModel.predict`: class
    from the op name (one classification per distinct name), dtype group from the graph's (or the
    hardware's) dtype, FLOPs and bytes from :func:`.compute.node_features`; one kernel each. A GEMM
    whose local shape the graph carries (the ``gemm_shape`` attribute a synthesizer writes: m, n, k,
    batch) is timed by the shaped form (wave quantization) when 2·m·n·k·batch is its FLOP count
    (a rewrite that changed its work without its shape falls back to the shape-free form)."""
    from .compute import is_model_target
    from .opsamples import fp32_math_of_name, memory_kind, op_class

    rows = np.flatnonzero(is_model_target(g))
    uniq, inv = np.unique(g.name[rows], return_inverse=True)
    names_u = g.strings.decode(uniq) if len(uniq) else []
    cls_u = np.array([op_class(s) for s in names_u], np.int8) if len(uniq) else np.zeros(0, np.int8)
    kind_u = np.array([memory_kind(s) if c == MEMORY else -1 for s, c in zip(names_u, cls_u)], np.int8) \
        if len(uniq) else np.zeros(0, np.int8)
    dt = _DTYPE_GROUP.get(str(g.meta.get("dtype") or hw.get("dtype") or "bf16").lower(), "half")
    dt_u = np.full(len(uniq), dt, object)
    if dt == "fp32":  # an fp32 GEMM/conv runs TF32 or SIMT math: its kernel name or PyTorch's default
        tf = peak_flops_dtype(hw, "tf32") > peak_flops_dtype(hw, "fp32")
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
        if (vals == "fp8").any() and not hw.get("peak_tflops", {}).get("fp8"):
            raise ValueError(f"the trace has FP8 GEMMs but {hw.get('name') or hw.get('preset') or 'this GPU'} "
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


def _predict_graph(self: OpModel, g: Any, flops: np.ndarray, nbytes: np.ndarray, hw: dict[str, Any]) -> np.ndarray:
    """Predicted µs of every model target of ``g`` (NaN elsewhere and where no class fit applies)."""
    out = np.full(len(g), np.nan)
    rows, cols = graph_cols(g, flops, nbytes, hw)
    if len(rows):
        out[rows] = self.predict(cols)
    return out


OpModel.predict_graph = _predict_graph  # type: ignore[attr-defined]
