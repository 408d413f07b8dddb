"""One op class's cost model: the work functions of its forms and :class:`ClassFit`, which times rows.

The functional forms (GEMM and attention wave/tile quantization, the soft max of FLOP and byte
time, the memory form's per-kind bandwidth and floor) are described in :mod:`.opmodel`'s module
docstring; fitting their constants is :mod:`.opfit`'s job, combining the classes of one GPU
:mod:`.opmodel`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .opfeatures import (
    ATTENTION,
    CONV,
    EMBEDDING,
    FLASH_TILE,
    GEMM,
    MEM_KINDS,
    MEMORY,
    OP_CLASSES,
    OTHER,
    attention_keys,
)

MIN_CLASS_SAMPLES = 8  # fewer than this: the class is transferred, not fitted
_MIN_FLOOR_US = 0.5  # a fitted per-kernel floor below this is unidentified (no kernel launches faster)
_MMA_ROWS = 16  # rows of the smallest tensor-core MMA tile: fewer queries than this are decode-like
_PEAK_KEY = {"half": "bf16", "fp32": "fp32", "fp64": "fp64", "int8": "int8", "tf32": "tf32", "fp8": "fp8"}


def _softmax(x: np.ndarray, y: np.ndarray, p: float) -> np.ndarray:
    m = np.maximum(x, y)
    m = np.where(m > 0, m, 1e-30)
    return m * ((x / m) ** p + (y / m) ** p) ** (1.0 / p)


_ELEM_BYTES = {"half": 2, "fp32": 4, "tf32": 4, "fp64": 8, "int8": 1, "fp8": 1}
_TENSOR_CORE = ("half", "tf32", "int8", "fp8")  # dtype groups multiplied on tensor cores (fp32: SIMT)


def dtype_groups(dtype: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct dtype groups of a ``dtype`` column (as strings, sorted) and each row's index
    into them."""
    dt_u, inv = np.unique(np.asarray(dtype).astype(str), return_inverse=True)
    return dt_u, np.ravel(inv)


@dataclass(frozen=True)
class RowFacts:
    """What :meth:`ClassFit.predict` reads from the rows' dtypes whatever the constants: their
    dtype groups (:func:`dtype_groups`) and which rows are :func:`misaligned`. A fit, which
    predicts the same rows for every trial of its constants, works them out once."""

    groups: tuple[np.ndarray, np.ndarray]
    misaligned: np.ndarray

    @classmethod
    def of(cls, cols: dict[str, np.ndarray]) -> RowFacts:
        return cls(dtype_groups(cols["dtype"]), misaligned(cols))


def misaligned(cols: dict[str, np.ndarray]) -> np.ndarray:
    """Tensor-core GEMM rows whose n or k (the leading dimensions of row-major A[m,k], B[k,n],
    C[m,n], as PyTorch lays them out) is not a multiple of 16 bytes: their kernels cannot use
    128-bit vector loads (CUTLASS/cuBLAS ``align1``/``align2`` kernels; on Hopper an sm80 kernel,
    no TMA) and run slower. SIMT fp32/fp64 GEMMs (``sgemm``) have no vector-width variants and are
    not counted: cuBLAS runs unaligned fp32 shapes on them at their usual rate (A100 hta_8rank:
    every unaligned TF32 GEMM is an ``align1`` kernel, every aligned one ``align4``; its unaligned
    ``ampere_sgemm`` kernels run at the aligned SIMT rate)."""
    dt_u, inv = dtype_groups(cols["dtype"])
    vec = np.array([16 // _ELEM_BYTES.get(d, 2) for d in dt_u], float)[inv]
    tc = np.array([d in _TENSOR_CORE for d in dt_u], bool)[inv]
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
    :data:`.opfeatures.FLASH_TILE`-key blocks, mean ``seq_q/2 + 64``); ``skip``: the share of the masked half the kernel skips (1: all,
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
    # blocks up to its last row's last key (the held-out error of long cached chunks drops this way:
    # tests/bench/bench_compute_loo.py); other causal kernels at the exact mean (whole blocks
    # raised the cross-validated error of the few-shape fits)
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
    """Per row, the value of its memory kind (``by_kind``, keyed by :data:`.opfeatures.MEM_KINDS`)
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

    def predict(self, cols: dict[str, np.ndarray], sms: int, facts: RowFacts | None = None) -> np.ndarray:
        """Predicted µs of each row of ``cols`` (flops, nbytes, dtype, kernels, m, n, k, batch);
        ``facts``: ``RowFacts.of(cols)`` where already worked out (the same result, sooner)."""
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
        dt_u, inv = facts.groups if facts is not None else dtype_groups(cols["dtype"])
        P = np.array([self.rate(d) for d in dt_u], float)[inv]
        # the per-tile cost (epilogue, prologue) is a time, the same for every dtype: k0 is in
        # k-steps at the half-precision rate (a SIMT fp32 GEMM's short-k tiles are not 8x slower)
        tf = (f / P + f0 / self.rate("half")) * 1e6
        core = _softmax(tf, tb, self.p)
        if self.tile and self.work == "gemm" and self.misalign != 1.0:
            # an unaligned kernel (no 16-byte vector loads) is slowed as a whole, its memory
            # traffic as well as its math: a memory-bound one (vocab projection of few tokens)
            # too; the launch floor is not
            core = np.where(facts.misaligned if facts is not None else misaligned(cols), core / self.misalign, core)
        return (self.a * nk + core) * slow

    def rate(self, dtype: str) -> float:
        """Achieved FLOP/s of a dtype group: fitted, else a fitted group's rate scaled by the
        data-sheet peak ratio of the two dtypes (``peaks``: the GPU's ``peak_tflops``)."""
        v = self.P.get(dtype)
        if v is not None:
            return v
        base = "half" if "half" in self.P else next(iter(self.P))
        if self.peaks:
            return self.P[base] * peak_flops_dtype(self.peaks, dtype) / peak_flops_dtype(self.peaks, base)
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


def peak_flops_dtype(tab: Mapping[str, float], dtype: str) -> float:
    """Data-sheet peak FLOP/s of a dtype group from a GPU's peak table (``peak_tflops``: TFLOP/s per
    dtype; ``half`` = bf16/fp16)."""
    if dtype == "half" and (tab.get("fp16") or tab.get("bf16")):
        # fp16 and bf16 share a group: the faster (V100's tensor cores run fp16 only; bf16 is SIMT there)
        return float(max(tab.get("fp16") or 0.0, tab.get("bf16") or 0.0)) * 1e12
    v = tab.get(_PEAK_KEY.get(dtype, dtype)) or (tab.get("fp32") if dtype == "tf32" else None) or tab.get("fp16") or tab.get("bf16") or max(tab.values() or [100.0])
    return float(v) * 1e12


_SHAPED = {GEMM: "gemm", ATTENTION: "attention"}  # classes with a shaped form (its work function)
_FORM = {GEMM: "compute", ATTENTION: "compute", CONV: "compute", EMBEDDING: "memory", MEMORY: "memory",
         OTHER: "memory"}


def class_key(cls: int, shaped: bool) -> str:
    """JSON key of a class fit (the GEMM class has a shaped and a shape-free form)."""
    return OP_CLASSES[cls] + ("_shaped" if shaped else "")


# decode attention (flash-decoding, paged attention: one or a few queries per sequence over a KV
# cache) is its own fit, memory form: its kernels stream the cache, unlike the prefill kernels the
# attention fits see, whose byte term is data movement behind the math
DECODE_KEY = "attention_decode"


def decode_rows(cols: dict[str, np.ndarray]) -> np.ndarray:
    """Attention rows with fewer queries than one tensor-core row block (:data:`_MMA_ROWS`):
    decode-like, timed by the :data:`DECODE_KEY` fit."""
    m = cols.get("m")
    if m is None:
        return np.zeros(len(cols["cls"]), bool)
    return (cols["cls"] == ATTENTION) & (m > 0) & (m < _MMA_ROWS)

