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
* ``attention_decode`` (an attention op with fewer queries than one tensor-core row block:
  flash-decoding and paged-attention kernels): ``t = a·kernels + B/W`` with B the cache's K and V,
  which these kernels stream. Fitted where decode kernels were measured (Vidur's A100 table); a
  GPU whose kernels measured none takes the nearest same-vendor GPU's fit moved term by term
  (:meth:`OpModel.borrow_decode`), else the memory class times such rows.
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

The pieces: :mod:`.opclass` (one class's forms and :class:`ClassFit`), :mod:`.opfit` (fitting the
constants), :mod:`.opcols` (the columns of a rank graph's ops); this module the per-GPU model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ettools.errors import TraceError
from ettools.io import atomic_write, load_json

from .devices import Hardware, presets

# re-exported: tests and benches import the forms' pieces from here
from .opclass import (  # noqa: F401
    _ELEM_BYTES,
    _FORM,
    _MIN_FLOOR_US,
    _SHAPED,
    DECODE_KEY,
    MIN_CLASS_SAMPLES,
    ClassFit,
    _gemm_work,
    class_key,
    decode_rows,
    loaded_bandwidth_ratio,
    misaligned,
    peak_flops_dtype,
)
from .opcols import graph_cols
from .opfeatures import ATTENTION, EMBEDDING, GEMM, MEMORY, OP_CLASSES  # noqa: F401
from .opfit import _ALONE, _fit_class, fit_classes, fit_contention  # noqa: F401

FORMAT = "ettools-op-model"


def _figures(hw: Hardware) -> dict[str, Any]:
    """The figures an :class:`OpModel` keeps of the GPU it was fitted on or moved to (its ``hw``)."""
    return {"peak_tflops": dict(hw.peak_tflops), "hbm_gbps": hw.hbm_gbps}


def _preset_match(gpu: str) -> dict[str, Any]:
    """``match`` of the hardware preset named ``gpu`` (presets.json); empty where unknown."""
    for name, p in presets().items():
        if gpu == name or gpu in p.get("names", []):
            return p.get("match") or {}
    return {}


def _vendor(gpu: str) -> str | None:
    """The vendor of a hardware preset (``match.vendor`` in presets.json); None where unknown."""
    return _preset_match(gpu).get("vendor")


def _architecture(match: Mapping[str, Any]) -> tuple[str, tuple[int, ...]] | None:
    """``(vendor, compute capability)`` of a preset's ``match``; None where either is unknown: GPUs
    of one architecture share their SM design (and the bytes it keeps in flight)."""
    if match.get("vendor") and match.get("compute"):
        return str(match["vendor"]), tuple(int(x) for x in match["compute"])
    return None


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
    hw: dict[str, Any]  # the fitted GPU's data-sheet figures (``peak_tflops``, ``hbm_gbps``; the file's ``hw``)
    sms: int
    classes: dict[str, ClassFit] = field(default_factory=dict)
    sources: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def fit(cls, cols: dict[str, np.ndarray], gpu: str, hw: Hardware, sms: int,
            sources: list[dict[str, Any]] | None = None) -> OpModel:
        """Fit every class with at least :data:`MIN_CLASS_SAMPLES` samples."""
        m = cls(gpu, _figures(hw), int(sms), {}, sources or [])
        ok = (cols["dur"] > 0) & (cols["nbytes"] > 0)
        ovl = cols["overlap"] if "overlap" in cols else np.zeros(len(ok))
        m.classes.update(fit_classes(cols, ok, ovl, hw, m.sms))
        fit_contention(m.classes, m.predict, cols, ok & (ovl >= _ALONE))
        m._set_peaks()
        return m

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

    def borrow_decode(self, donors: list[OpModel], hw: Hardware) -> None:
        """Fallback for the decode-attention fit (:data:`.opclass.DECODE_KEY`) where this GPU's own
        kernels measured no decode attention: the nearest same-vendor donor's *measured* fit (the
        closest bf16 peak; one kernel library's flash-decoding and paged-attention kernels), moved
        to this GPU by :meth:`transfer_to` against this fit (its floor at the two memory classes'
        floor ratio, its bandwidth at their bandwidth ratio). Without such a donor decode rows
        stay on the memory class. Recorded as the class's ``transferred_from``."""
        if DECODE_KEY in self.classes:
            return
        mine = _vendor(self.gpu)
        bf = float(hw.peak_tflops.get("bf16", 0) or 0)

        def dist(d: OpModel) -> float:
            return abs(np.log(max(float(d.hw.get("peak_tflops", {}).get("bf16", 1) or 1), 1.0) / max(bf, 1.0)))

        got = sorted((d for d in donors if d.gpu != self.gpu and DECODE_KEY in d.classes
                      and not d.classes[DECODE_KEY].transferred_from
                      and mine is not None and _vendor(d.gpu) == mine), key=lambda d: (dist(d), d.gpu))
        if not got:
            return
        moved = got[0].transfer_to(self.gpu, hw, self.sms or got[0].sms, target_fit=self)
        c = moved.classes[DECODE_KEY]
        c.peaks = dict(self.hw.get("peak_tflops", {}))
        self.classes[DECODE_KEY] = c

    def _set_peaks(self) -> None:
        for c in self.classes.values():
            c.peaks = dict(self.hw.get("peak_tflops", {}))

    def transfer_to(self, gpu: str, hw: Hardware, sms: int, target_fit: OpModel | None = None,
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
        out = OpModel(gpu, _figures(hw), int(sms), {},
                      [{"transferred_from": self.gpu}])
        src, tgt = source_fit or self, target_fit

        def sheet_p(d: str) -> float:
            return peak_flops_dtype(hw.peak_tflops, d) / peak_flops_dtype(self.hw.get("peak_tflops", {}), d)

        def pair(name: str) -> tuple[ClassFit, ClassFit] | None:
            t = tgt.classes.get(name) if tgt else None
            s = src.classes.get(name)
            ok = t is not None and s is not None and min(t.n, s.n) >= MIN_CLASS_SAMPLES
            return (t, s) if ok else None  # type: ignore[return-value]

        mem, gem = pair(class_key(MEMORY, False)), pair(class_key(GEMM, False))
        peak_s, peak_t = float(self.hw.get("hbm_gbps", 1.0)) * 1e9, float(hw.hbm_gbps) * 1e9
        bw_sheet = peak_t / peak_s
        r_a0 = mem[0].a / mem[1].a if mem and min(mem[0].a, mem[1].a) >= _MIN_FLOOR_US else 1.0
        # the closed memory loop assumes the same per-SM concurrency: one architecture's GPUs only
        arch = _architecture(_preset_match(self.gpu))
        same_arch = arch is not None and arch == _architecture(hw.match)
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
            P = {d: min(v, peak_flops_dtype(hw.peak_tflops, d)) for d, v in P.items()}
            # every other field (tile, per-tile cost, misaligned rate, contention, ...) is a share or
            # a shape constant of the kernels, kept as fitted
            # unmeasured byte term: within one architecture the bytes a class streams are limited by
            # what its SMs keep in flight, as for the memory class (the closed memory loop)
            r_bytes = r_p if rates else loaded_bandwidth_ratio(c.W, peak_s, peak_t, self.sms, sms) if same_arch \
                else bw_sheet
            out.classes[k] = replace(c, a=fl * r_a + (c.a - fl) / r_p, W=c.W * r_bytes, P=P,
                                     cv_mape=None, transferred_from=self.gpu)
        out._set_peaks()
        return out

    def _class_rows(self, cols: dict[str, np.ndarray]) -> Iterator[tuple[int, np.ndarray, ClassFit,
                                                                        ClassFit | None, np.ndarray | None]]:
        """For each class with a fit: ``(class, rows, fit, shaped fit or None, shaped mask of the
        rows or None)`` — the fits :meth:`predict` times those rows with (an embedding without a fit
        of its own takes the memory class's: gathers move bytes). A decode-like attention row
        (fewer queries than one tensor-core row block: flash-decoding and paged-attention kernels
        stream the cache's K and V) takes the decode-attention fit (:data:`.opclass.DECODE_KEY`),
        else the memory class's: the attention fits are fitted on prefill kernels, whose byte term
        is their data movement behind the math, not a bandwidth — A100's put a Llama-3-8B decode
        step's attention at 4x the cache read at HBM speed."""
        cl = cols["cls"]
        decode_fit = self.classes.get(DECODE_KEY) or self.classes.get(class_key(MEMORY, False))
        for c in range(len(OP_CLASSES)):
            sel = cl == c
            if c == ATTENTION and decode_fit is not None:
                decode = sel & decode_rows(cols)
                if decode.any():
                    yield c, decode, decode_fit, None, None
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

    def predict_graph(self, g: Any, flops: np.ndarray, nbytes: np.ndarray, hw: Hardware) -> np.ndarray:
        """Predicted µs of every model target of ``g`` (NaN elsewhere and where no class fit applies)."""
        out = np.full(len(g), np.nan)
        rows, cols = graph_cols(g, flops, nbytes, hw)
        if len(rows):
            out[rows] = self.predict(cols)
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


def cross_validate(cols: dict[str, np.ndarray], gpu: str, hw: Hardware, sms: int,
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
        m.borrow_decode(donors or [], hw)
        pred[test] = m.predict({k: v[test] for k, v in cols.items()})
    per_class = {}
    decode = decode_rows(cols)
    for name, sel in [(OP_CLASSES[c], (cols["cls"] == c) & ~decode) for c in range(len(OP_CLASSES))] + \
            [(DECODE_KEY, decode)]:
        if sel.any():
            per_class[name] = {"n": int(sel.sum()), "mape_pct": mape(pred[sel], cols["dur"][sel]),
                               "predicted": int(np.isfinite(pred[sel]).sum())}
    per_group = {}
    for g in groups:
        sel = (cols["group"] == g) & np.isfinite(pred)
        meas = float(cols["dur"][sel].sum())
        per_group[g] = {"measured_us": meas, "predicted_us": float(pred[sel].sum()),
                        "error_pct": 100.0 * (float(pred[sel].sum()) - meas) / meas if meas else float("nan"),
                        "coverage": float(sel.sum() / max((cols["group"] == g).sum(), 1))}
    return {"groups": groups, "per_class": per_class, "per_group": per_group, "pred": pred}
