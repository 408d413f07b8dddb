"""Compute time of each node: measured, calibrated or roofline, chosen per node with a fallback chain.

Sources (``SOURCES``; the order is the fallback chain after the requested source):

* ``measured`` — the node's own duration, when the trace has one (Kineto, PyTorch ET + Kineto,
  Chakra ``duration_micros``, synthesized estimates);
* ``calibrated`` — a :class:`~.calibrate.Fit` (per op class, time as a function of FLOPs and bytes,
  fitted on a real trace and stored as a small JSON file);
* ``roofline`` — ``max(FLOPs / peak, bytes / memory bandwidth)`` from ``num_ops``/``tensor_size`` and
  a hardware description (ASTRA-sim's ``num_ops / min(peak, bw · num_ops / tensor_size)``);
* ``none`` — nothing known: 0 µs (counted, reported).

Host nodes (``is_cpu_op`` 1: framework ops, runtime calls, host gaps) always replay their measured
duration; the models apply to device ops and nodes of unknown placement.

FLOPs and bytes of a node (:func:`node_features`) are its ``num_ops``/``tensor_size`` columns when
present; otherwise, for graphs carrying PyTorch ET tensors, they are derived from the shapes of the
op (or, for a kernel, of the host op that launched it): ``aten::mm``/``addmm``/``bmm``/``baddbmm``/
``matmul``/``linear`` 2·M·N·K; convolutions ``2 · numel(output) · numel(weight) / out_channels``
(their backward twice that); anything else one FLOP per output element. Bytes are the distinct
input and output tensors' bytes.

Hardware presets live in ``hardware/presets.json`` (A100, H100, H200, B200, MI300X: peak TFLOP/s per
dtype, HBM GB/s, memory bytes, default network); :func:`load_hardware` merges a user file or dict
over a preset.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ettools.errors import TraceError
from ettools.graph import COMM_NODE_TYPES, EdgeKind, NodeType, RankGraph

SOURCES = ("measured", "calibrated", "roofline", "none")
MEASURED, CALIBRATED, ROOFLINE, NONE = range(4)
_PRESETS_FILE = Path(__file__).with_name("hardware") / "presets.json"
DEFAULT_HARDWARE = "H100"


def presets() -> dict[str, dict[str, Any]]:
    """The hardware presets (name -> description)."""
    data = json.loads(_PRESETS_FILE.read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def load_hardware(system: str | Path | dict[str, Any] | None, world: int = 1) -> dict[str, Any]:
    """A hardware description: a preset name, a JSON file or a dict (``"hardware": "<preset>"`` to
    start from a preset, then any of ``peak_tflops`` {dtype: TFLOP/s}, ``hbm_gbps``, ``memory_bytes``,
    ``dtype``, ``launch_queue_depth``, ``overlap_slowdown``, ``network``), or None for the default
    (H100). ASTRA-sim keys ``peak-perf`` (TFLOP/s) and ``local-mem-bw`` (GB/s) are understood too.
    """
    table = presets()
    if system is None:
        raw: dict[str, Any] = {}
    elif isinstance(system, dict):
        raw = dict(system)
    else:
        s = str(system)
        key = next((k for k in table if k.lower() == s.lower()), None)
        if key is not None:
            raw = {"hardware": key}
        else:
            p = Path(s)
            try:
                raw = json.loads(p.read_text())
            except FileNotFoundError:
                raise TraceError(p, f"no such file (nor a hardware preset: {', '.join(table)})") from None
            except json.JSONDecodeError as e:
                raise TraceError(p, f"not valid JSON: {e}") from None
            if not isinstance(raw, dict):
                raise TraceError(p, "system description must be a JSON object")
    base_name = str(raw.get("hardware", DEFAULT_HARDWARE))
    key = next((k for k in table if k.lower() == base_name.lower()), None)
    if key is None:
        raise TraceError(str(system), f"unknown hardware preset {base_name!r} (known: {', '.join(table)})")
    hw = json.loads(json.dumps(table[key]))
    hw["preset"] = key
    for k, v in raw.items():
        if k == "peak_tflops" and isinstance(v, dict):
            hw["peak_tflops"].update({str(a): float(b) for a, b in v.items()})
        elif k == "network" and isinstance(v, dict):
            hw["network"].update(v)
        elif k == "peak-perf":
            hw["peak_tflops"] = {d: float(v) for d in hw["peak_tflops"]}
        elif k == "local-mem-bw":
            hw["hbm_gbps"] = float(v)
        elif k != "hardware":
            hw[k] = v
    hw.setdefault("dtype", "bf16")
    return hw


def hardware_from_trace(trace: Any) -> dict[str, Any] | None:
    """A hardware description from the trace's device properties: the preset named in the device's
    name (``NVIDIA H100 80GB HBM3`` → H100) and its ``totalGlobalMem``; None if nothing is known."""
    props = getattr(trace.meta, "device_properties", None) or []
    if not props or not isinstance(props[0], dict):
        return None
    name = str(props[0].get("name", ""))
    out: dict[str, Any] = {}
    for key in presets():
        if key.lower() in name.lower().replace(" ", ""):
            out["hardware"] = key
            break
    mem = props[0].get("totalGlobalMem")
    if isinstance(mem, (int, float)) and mem > 0:
        out["memory_bytes"] = int(mem)
    out["device_name"] = name
    return out or None


def peak_flops(hw: dict[str, Any], dtype: str | None = None) -> float:
    """Peak FLOP/s of ``dtype`` (default the description's ``dtype``)."""
    d = (dtype or hw.get("dtype") or "bf16").lower()
    table = hw["peak_tflops"]
    v = table.get(d) or table.get("bf16") or max(table.values())
    return float(v) * 1e12


def roofline_us(flops: np.ndarray, nbytes: np.ndarray, hw: dict[str, Any]) -> np.ndarray:
    """``max(flops / peak, bytes / bandwidth)`` in µs; NaN where neither is known."""
    f = np.asarray(flops, np.float64)
    b = np.asarray(nbytes, np.float64)
    peak = peak_flops(hw)
    bw = float(hw["hbm_gbps"]) * 1e9
    tf = np.where(f >= 0, f / peak, np.nan)
    tb = np.where(b >= 0, b / bw, np.nan)
    t = np.fmax(tf, tb) * 1e6
    return t


# ---- features ----------------------------------------------------------------------------------

_MM = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
       "aten::addbmm", "aten::einsum")
_CONV = ("aten::convolution", "aten::_convolution", "aten::cudnn_convolution", "aten::conv2d",
         "aten::conv1d", "aten::conv3d", "aten::mkldnn_convolution", "aten::miopen_convolution")
_CONV_BWD = ("aten::convolution_backward", "aten::cudnn_convolution_backward",
             "aten::miopen_convolution_backward")


def _shape_flops(name: str, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> float:
    """FLOPs of one op from its name and tensor shapes (see the module docstring)."""
    def numel(s: tuple[int, ...]) -> int:
        n = 1
        for x in s:
            n *= max(int(x), 0)
        return n

    mats = [s for s in ins if len(s) >= 2]
    out = outs[0] if outs else ()
    if name in _MM and len(mats) >= 2:
        a, b = mats[-2], mats[-1]
        if name == "aten::linear":  # x [..., K], W [N, K]
            x, w = mats[0], mats[1]
            return 2.0 * numel(x) * w[0]
        k = a[-1]
        return 2.0 * (numel(out) if out else numel(a) // max(k, 1) * b[-1]) * k
    if name in _CONV and len(mats) >= 2 and out:
        w = mats[1]
        return 2.0 * numel(out) * numel(w) / max(w[0], 1)
    if name in _CONV_BWD and len(mats) >= 3:
        gout, w = mats[0], mats[2]
        return 4.0 * numel(gout) * numel(w) / max(w[0], 1)
    if out:
        return float(numel(out))
    return float(max((numel(s) for s in ins), default=0))


def node_features(g: RankGraph) -> tuple[np.ndarray, np.ndarray]:
    """``(flops, bytes)`` per node (-1 unknown): columns first, then ET tensor shapes (see module doc).

    Device ops without their own figures take their launching host op's.
    """
    flops = g.num_ops.astype(np.float64)
    nbytes = g.tensor_size.astype(np.float64)
    flops[g.num_ops < 0] = -1.0
    nbytes[g.tensor_size < 0] = -1.0
    t = g.tensors
    has_io = len(t) and (len(g.in_tensor) or len(g.out_tensor))
    if has_io:
        tb = (np.maximum(t.numel, 0) * np.maximum(t.elem_bytes, 0)).astype(np.float64)
        in_cnt, out_cnt = np.diff(g.in_ptr), np.diff(g.out_ptr)
        rows = np.flatnonzero(((in_cnt > 0) | (out_cnt > 0)) & ((flops < 0) | (nbytes < 0)))
        names = g.strings
        name_col = g.name
        for r in rows.tolist():
            ins = g.in_tensor[g.in_ptr[r]:g.in_ptr[r + 1]]
            outs = g.out_tensor[g.out_ptr[r]:g.out_ptr[r + 1]]
            if nbytes[r] < 0:
                nbytes[r] = float(tb[np.unique(np.concatenate((ins, outs)))].sum())
            if flops[r] < 0:
                nm = names[int(name_col[r])]
                flops[r] = _shape_flops(nm, [t.shape(int(i)) for i in ins], [t.shape(int(o)) for o in outs])
    # device ops inherit from their launcher
    src, dst, kind = g.edge_rows()
    sel = (kind == EdgeKind.LAUNCH) & (src >= 0)
    if sel.any():
        s, d = src[sel], dst[sel]
        dev = g.is_cpu_op[d] != 1
        s, d = s[dev], d[dev]
        fl = flops[d] < 0
        flops[d[fl]] = flops[s[fl]]
        by = nbytes[d] < 0
        nbytes[d[by]] = nbytes[s[by]]
    return flops, nbytes


def is_model_target(g: RankGraph) -> np.ndarray:
    """Nodes whose time a compute model may replace: device (or unplaced) compute nodes."""
    comm = np.isin(g.type, [int(x) for x in COMM_NODE_TYPES])
    return (g.is_cpu_op != 1) & ~comm & (g.type != NodeType.METADATA_NODE)


def node_durations(g: RankGraph, timing: str, hw: dict[str, Any], fit: Any = None,
                   features: tuple[np.ndarray, np.ndarray] | None = None,
                   astra_roofline: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(dur µs, source code)`` per node for ``timing`` in ``measured``/``calibrated``/``roofline``.

    The requested source is tried first, then the rest of :data:`SOURCES` in order. Comm nodes get
    their measured duration (or NaN): the network decides their transfer time.
    ``astra_roofline``: ``(peak FLOP/s, bytes/s)`` from an ASTRA-sim system file, overriding ``hw``.
    """
    n = len(g)
    measured = np.where(np.isfinite(g.dur) & (g.dur >= 0), g.dur, np.nan)
    target = is_model_target(g)
    dur = measured.copy()
    src = np.where(np.isnan(measured), NONE, MEASURED).astype(np.int8)
    if not target.any():
        return np.nan_to_num(dur, nan=0.0) if n else dur, src
    if features is None:
        features = node_features(g)
    flops, nbytes = features
    cand: dict[int, np.ndarray] = {MEASURED: measured}
    if fit is not None:
        cand[CALIBRATED] = fit.predict_graph(g, flops, nbytes)
    if astra_roofline is not None:
        peak, bw = astra_roofline
        tf = np.where(flops >= 0, flops / peak, np.nan)
        tb = np.where(nbytes >= 0, nbytes / bw, np.nan)
        cand[ROOFLINE] = np.fmax(tf, tb) * 1e6
    else:
        cand[ROOFLINE] = roofline_us(flops, nbytes, hw)
    first = {"measured": MEASURED, "calibrated": CALIBRATED, "roofline": ROOFLINE}[timing]
    chain = [first] + [s for s in (MEASURED, CALIBRATED, ROOFLINE) if s != first]
    tdur = np.full(n, np.nan)
    tsrc = np.full(n, NONE, np.int8)
    for s in reversed(chain):
        c = cand.get(s)
        if c is None:
            continue
        ok = np.isfinite(c) & (c >= 0)
        tdur = np.where(ok, c, tdur)
        tsrc = np.where(ok, s, tsrc)
    dur = np.where(target, tdur, dur)
    src = np.where(target, tsrc, src).astype(np.int8)
    comm = np.isin(g.type, [int(x) for x in COMM_NODE_TYPES])
    dur = np.where(comm, measured, np.nan_to_num(dur, nan=0.0))
    return dur, src
