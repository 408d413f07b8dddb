"""Compute time of each node: measured, calibrated or roofline, chosen per node with a fallback chain.

Sources (``SOURCES``; the order is the fallback chain after the requested source):

* ``measured`` — the node's own duration, when the trace has one (Kineto, PyTorch ET + Kineto,
  Chakra ``duration_micros``, synthesized estimates);
* ``calibrated`` — a :class:`~.calibrate.Fit` (per op class, time as a function of FLOPs and bytes,
  fitted on a real trace and stored as a small JSON file);
* ``fitted`` — the shipped op cost model of the replay's GPU (:mod:`.opmodel`, fitted on real
  kernels of that GPU by ``python -m ettools.replay.data.make_op_models``; ``data/op_models/``);
* ``transferred`` — another GPU's fitted op model scaled by the hardware ratios (peak FLOP/s per
  dtype, memory bandwidth, SM count), for GPUs (or op classes) without their own fit;
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
from ettools.graph import COMM_NODE_TYPES, EdgeKind, NodeType, RankGraph, Trace

SOURCES = ("measured", "calibrated", "roofline", "none", "fitted", "transferred")
MEASURED, CALIBRATED, ROOFLINE, NONE, FITTED, TRANSFERRED = range(6)
# fallback order after the requested source: the GPU's own fitted op model, then another GPU's
# moved by hardware ratios, and the roofline only where neither can say
_FALLBACK = (MEASURED, CALIBRATED, FITTED, TRANSFERRED, ROOFLINE)
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


def _norm(s: str) -> str:
    return "".join(ch for ch in s.lower() if ch.isalnum())


def _vendor(props: dict[str, Any]) -> str:
    """``amd`` or ``nvidia`` from the device name or, lacking one, the warp size (64 on AMD)."""
    name = str(props.get("name", "")).lower()
    if "amd" in name or "radeon" in name or "instinct" in name:
        return "amd"
    if "nvidia" in name or "tesla" in name or "geforce" in name:
        return "nvidia"
    return "amd" if props.get("warpSize") == 64 else "nvidia"


def _props_fit(spec: dict[str, Any], props: dict[str, Any], vendor: str) -> bool:
    """Whether the recorded properties agree with a preset's ``match`` (vendor, compute, SMs)."""
    if not spec or spec.get("vendor") != vendor:
        return False
    comp = spec.get("compute")
    if comp is not None and [props.get("computeMajor"), props.get("computeMinor")] != list(comp):
        return False
    sms = spec.get("sms")
    return sms is None or props.get("numSms") == sms


def identify_device(props: dict[str, Any]) -> dict[str, Any]:
    """A hardware description (``load_hardware`` input) for one ``deviceProperties`` entry.

    In order: the preset whose ``names`` occur in the device name; else the preset whose ``match``
    (vendor, compute capability, SM/CU count) the properties fit; among several, the one whose
    memory is closest to ``totalGlobalMem``. Else the device is not a preset: its peak is the
    same-vendor, same-major-architecture preset's per-SM peak times its own SM count (bandwidth
    kept), or the default preset's figures — either way ``detected`` says so. Never silently another GPU.
    """
    table = presets()
    name = str(props.get("name", "") or "")
    mem = props.get("totalGlobalMem")
    mem = int(mem) if isinstance(mem, (int, float)) and mem > 0 else None
    vendor = _vendor(props)
    sms = props.get("numSms")
    comp = f"{props.get('computeMajor')}.{props.get('computeMinor')}"

    def closest(keys: list[str]) -> str:
        if mem is None:
            return keys[0]
        return min(keys, key=lambda k: abs(float(table[k].get("memory_bytes", 0)) - mem))

    out: dict[str, Any] = {"device_name": name}
    if mem is not None:
        out["memory_bytes"] = mem
    nn = _norm(name)
    by_name = [k for k, v in table.items() if nn and any(_norm(x) in nn for x in v.get("names", [k]))]
    if by_name:
        key = closest(by_name)
        out.update(hardware=key, detected=f"device name {name!r}")
        return out
    by_props = [k for k, v in table.items() if _props_fit(v.get("match") or {}, props, vendor)]
    if by_props:
        key = closest(by_props)
        same = [k for k in by_props if k != key and table[k]["peak_tflops"] == table[key]["peak_tflops"]
                and table[k]["hbm_gbps"] == table[key]["hbm_gbps"]]
        alias = f" (same figures as {', '.join(same)})" if same else ""
        out.update(hardware=key, detected=f"device properties ({vendor}, compute {comp}, {sms} SMs/CUs) "
                                          f"of {name or 'an unnamed device'}: {key}{alias}")
        return out
    # not a preset: scale the closest architecture's per-SM peak by this device's SM count
    arch = [k for k, v in table.items() if (v.get("match") or {}).get("vendor") == vendor
            and list((v.get("match") or {}).get("compute", [None]))[:1] == [props.get("computeMajor")]
            and (v.get("match") or {}).get("sms")]
    label = name or f"unnamed {vendor} device"
    if arch and isinstance(sms, int) and sms > 0:
        base = arch[0]
        ratio = sms / float(table[base]["match"]["sms"])
        out.update(hardware=base, peak_tflops={d: round(v * ratio, 3) for d, v in table[base]["peak_tflops"].items()},
                   name=label, preset_label=label,
                   detected=f"{label} is not a preset: peak = {base}'s per-SM peak x {sms} SMs, "
                            f"{base}'s memory bandwidth (clock and bandwidth unknown)")
    else:
        out.update(hardware=DEFAULT_HARDWARE, name=label, preset_label=label,
                   detected=f"{label} is not a preset and its properties name no known architecture: "
                            f"{DEFAULT_HARDWARE} figures assumed")
    return out


def hardware_from_trace(trace: Any) -> dict[str, Any]:
    """The hardware description the trace itself names (see :func:`identify_device`): its first
    device's properties; else the device a synthesizer estimated its durations for; else the
    default preset, with ``detected`` saying that the trace names no device."""
    props = getattr(trace.meta, "device_properties", None) or []
    if props and isinstance(props[0], dict):
        return identify_device(props[0])
    for g in getattr(trace, "graphs", {}).values():
        dev = g.meta.get("estimated_for")
        if dev:
            key = next((k for k in presets() if k.lower() == str(dev).lower()), None)
            if key is not None:
                return {"hardware": key, "detected": f"the device its durations were estimated for ({key})"}
        break
    return {"hardware": DEFAULT_HARDWARE, "detected": f"default: the trace names no device ({DEFAULT_HARDWARE} assumed)"}


def hardware_label(hw: dict[str, Any]) -> str:
    """The name a report shows: the preset, or the trace's own device when it is not a preset."""
    return str(hw.get("preset_label") or hw.get("preset") or hw.get("name") or "?")


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
# ops that only make a new view or allocate (no kernel runs, no data moves): 0 FLOPs and 0 bytes
_NO_KERNEL = ("aten::view", "aten::_unsafe_view", "aten::reshape", "aten::as_strided", "aten::t",
              "aten::transpose", "aten::permute", "aten::expand", "aten::expand_as", "aten::slice",
              "aten::select", "aten::unsqueeze", "aten::squeeze", "aten::detach", "aten::detach_",
              "aten::alias", "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::resize_",
              "aten::set_", "aten::unbind", "aten::split", "aten::split_with_sizes", "aten::chunk",
              "aten::narrow", "aten::diagonal", "aten::lift_fresh", "aten::numpy_T", "aten::flatten",
              "aten::unflatten", "aten::view_as", "aten::_reshape_alias", "aten::is_nonzero",
              "aten::size", "aten::stride", "aten::item", "aten::_local_scalar_dense", "aten::contiguous",
              "aten::new_empty", "aten::new_empty_strided", "aten::to", "aten::_to_copy_meta")


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
    if has_io and len(rows):
        # view/allocation ops run no kernel (when they copy, a nested aten::copy_ does the work)
        ids = [i for i in (g.strings.lookup(x) for x in _NO_KERNEL) if i >= 0]
        if ids:
            nk = rows[np.isin(name_col[rows], ids)]
            flops[nk] = 0.0
            nbytes[nk] = 0.0
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


def _is_op_model(fit: Any) -> bool:
    from .opmodel import OpModel

    return isinstance(fit, OpModel)


_OP_MODELS: dict[str, Any] = {}


def op_models_for(hw: dict[str, Any]) -> tuple[Any, Any]:
    """``(own, transferred)`` op models (:class:`.opmodel.OpModel`) for a hardware description:
    the shipped fit of its preset (None when there is none), and the classes it lacks — or fitted
    on fewer than :data:`.opmodel.MIN_CLASS_SAMPLES` distinct sizes — from other GPUs' fits moved
    to this hardware by :meth:`~.opmodel.OpModel.transfer_to`. Each such class comes from the
    nearest GPU (same vendor first, then the closest bf16 peak) that has it, fitted on enough sizes
    where it replaces an own class: a few sizes fix a class's rate only over the sizes they span
    (H100's attention, fitted on three short-sequence shapes, put an 8k-token causal attention at
    a third of the rate A100's 4,191-size fit moved to H100 gives), and its ratio to another GPU's
    class is not used to move that class either. A description whose peak or bandwidth was changed
    from its preset's is not that preset: only a transfer applies."""
    from .opmodel import MIN_CLASS_SAMPLES, OpModel

    key = str(hw.get("preset", ""))
    table = presets()
    fits = shipped_op_models()
    base = table.get(key, {})
    same = bool(base) and base.get("peak_tflops") == hw.get("peak_tflops") and \
        float(base.get("hbm_gbps", 0)) == float(hw.get("hbm_gbps", -1)) and not hw.get("preset_label")
    own = fits.get(key) if same else None
    sms = int((hw.get("match") or {}).get("sms") or (own.sms if own else 0) or 0)
    vendor = (hw.get("match") or {}).get("vendor")
    others = [k for k in fits if k != key or not same]
    if not others:
        return own, None
    bf = float(hw.get("peak_tflops", {}).get("bf16", 0) or 0)

    def dist(k: str) -> tuple[int, float, str]:
        v = table.get(k, {})
        return (0 if (v.get("match") or {}).get("vendor") == vendor else 1,
                abs(np.log(max(float(v.get("peak_tflops", {}).get("bf16", 1)), 1) / max(bf, 1))), k)

    def family(classes: dict[str, Any], name: str) -> dict[str, Any]:
        return {k: c for k, c in classes.items() if k.removesuffix("_shaped") == name}

    def well_sampled(classes: dict[str, Any], name: str) -> bool:
        fam = family(classes, name)
        return bool(fam) and all(c.sizes <= 0 or c.sizes >= MIN_CLASS_SAMPLES for c in fam.values())

    donors = sorted(others, key=dist)
    names = sorted({k.removesuffix("_shaped") for d in donors for k in fits[d].classes})
    weak = {n for n in names if own is not None and family(own.classes, n) and not well_sampled(own.classes, n)}
    # per class: the nearest donor that fitted it on enough sizes (else, for a class this GPU lacks,
    # the nearest that has it): a GPU without a fit of its own (H200) then takes the same fit of the
    # class as the GPU it is compared with (H100), so a term-wise transfer between them is one fit's
    source: dict[str, str] = {}
    for n in names:
        if own is not None and family(own.classes, n) and n not in weak:
            continue
        has = [d for d in donors if family(fits[d].classes, n)]
        pick = next((d for d in has if well_sampled(fits[d].classes, n)), None)
        if pick is None and n not in weak and has:
            pick = has[0]  # nobody fitted it on enough sizes: the nearest fit of it
        if pick is not None:
            source[n] = pick
    weak &= set(source)
    kept = own if own is None or not weak else OpModel(
        own.gpu, own.hw, own.sms, {k: c for k, c in own.classes.items() if k.removesuffix("_shaped") not in weak},
        own.sources)
    if not source:
        return kept, None
    ck = (tuple(sorted(source.items())), key, json.dumps(hw.get("peak_tflops"), sort_keys=True), hw.get("hbm_gbps"), sms)
    moved = _OP_MODELS.get(str(ck))
    if moved is None:
        classes: dict[str, Any] = {}
        first = None
        for d in sorted(set(source.values()), key=dist):
            # with this GPU's own (well-sampled) fit, each term moves by the ratio the two fits measured
            m = fits[d].transfer_to(key or hardware_label(hw), hw, sms or fits[d].sms, target_fit=kept)
            first = first or m
            classes.update({k: c for k, c in m.classes.items() if source.get(k.removesuffix("_shaped")) == d})
        moved = OpModel(first.gpu, first.hw, first.sms, dict(sorted(classes.items())), first.sources)
        _OP_MODELS[str(ck)] = moved
    return kept, moved


_OP_DIR = Path(__file__).with_name("data") / "op_models"
_SHIPPED: dict[str, Any] | None = None


def shipped_op_models() -> dict[str, Any]:
    """The shipped op models (preset name -> :class:`.opmodel.OpModel`) in ``data/op_models/``."""
    global _SHIPPED
    if _SHIPPED is None:
        from .opmodel import OpModel

        _SHIPPED = {}
        for f in sorted(_OP_DIR.glob("*.json")) if _OP_DIR.is_dir() else []:
            m = OpModel.load(f)
            _SHIPPED[m.gpu] = m
    return _SHIPPED


def is_model_target(g: RankGraph) -> np.ndarray:
    """Nodes whose time a compute model may replace: device (or unplaced) compute nodes, and host
    compute nodes without a measured duration (a PyTorch ET alone: its operators' time is the
    device work they launch)."""
    comm = np.isin(g.type, [int(x) for x in COMM_NODE_TYPES])
    unmeasured_host = (g.is_cpu_op == 1) & ~(np.isfinite(g.dur) & (g.dur >= 0))
    out = ((g.is_cpu_op != 1) | unmeasured_host) & ~comm & (g.type != NodeType.METADATA_NODE)
    hold = g.strings.lookup("device_hold")  # a measured wait of the device, not an operator
    if hold >= 0:
        out &= g.name != hold
    return out


def _candidates(g: RankGraph, hw: dict[str, Any], fit: Any, features: tuple[np.ndarray, np.ndarray],
                astra_roofline: tuple[float, float] | None,
                contention: dict[int, np.ndarray] | None = None) -> dict[int, np.ndarray]:
    """Per source code, each node's time under that source (NaN where it cannot say).

    ``contention``: filled with each op-model source's per-node contention slope (0 elsewhere)."""
    flops, nbytes = features
    measured = np.where(np.isfinite(g.dur) & (g.dur >= 0), g.dur, np.nan)
    cand: dict[int, np.ndarray] = {MEASURED: measured}
    cols_once: list[Any] = []

    def by_model(model: Any, code: int) -> np.ndarray:
        # the model targets' columns are built once for every op model of this graph
        if not cols_once:
            from .opmodel import graph_cols

            cols_once.append(graph_cols(g, flops, nbytes, hw))
        rows, cols = cols_once[0]
        out = np.full(len(g), np.nan)
        if len(rows):
            out[rows] = model.predict(cols)
        if contention is not None:
            c = np.zeros(len(g))
            if len(rows):
                c[rows] = model.contention(cols)
            contention[code] = c
        return out

    if fit is not None:
        cand[CALIBRATED] = by_model(fit, CALIBRATED) if _is_op_model(fit) \
            else fit.predict_graph(g, flops, nbytes)
    if astra_roofline is None:  # an ASTRA-sim system file asks for its own roofline
        own, moved = op_models_for(hw)
        if own is not None:
            cand[FITTED] = by_model(own, FITTED)
        if moved is not None:
            cand[TRANSFERRED] = by_model(moved, TRANSFERRED)
    if astra_roofline is not None:
        peak, bw = astra_roofline
        tf = np.where(flops >= 0, flops / peak, np.nan)
        tb = np.where(nbytes >= 0, nbytes / bw, np.nan)
        cand[ROOFLINE] = np.fmax(tf, tb) * 1e6
    else:
        gdt = (getattr(g, "meta", None) or {}).get("dtype")  # the graph's own math dtype (synthesized fp32)
        cand[ROOFLINE] = roofline_us(flops, nbytes, dict(hw, dtype=gdt) if gdt else hw)
        cdt = (getattr(g, "attrs", None) or {}).get("compute_dtype")
        if cdt is not None and len(cdt.rows):  # ops whose math runs another dtype (FP8 GEMMs)
            for d in sorted({str(v).lower() for v in cdt.values}):
                if not hw.get("peak_tflops", {}).get(d):
                    raise ValueError(f"the trace has {d.upper()} GEMMs but {hardware_label(hw)} has no {d.upper()} "
                                     f"tensor cores (its peak_tflops lists no {d})")
                rows = cdt.rows[np.array([str(v).lower() == d for v in cdt.values])]
                cand[ROOFLINE][rows] = roofline_us(flops[rows], nbytes[rows], dict(hw, dtype=d))
    return cand


def _chain(cand: dict[int, np.ndarray], timing: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first source of the fallback chain that knows each node's time."""
    first = {"measured": MEASURED, "calibrated": CALIBRATED, "roofline": ROOFLINE, "fitted": FITTED}[timing]
    chain = [first] + [s for s in _FALLBACK if s != first]
    tdur = np.full(n, np.nan)
    tsrc = np.full(n, NONE, np.int8)
    for s in reversed(chain):
        c = cand.get(s)
        if c is None:
            continue
        ok = np.isfinite(c) & (c >= 0)
        tdur = np.where(ok, c, tdur)
        tsrc = np.where(ok, s, tsrc)
    return tdur, tsrc


def nested_durations(source: RankGraph, timing: str, hw: dict[str, Any], fit: Any = None,
                     astra_roofline: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(dur µs, source code)`` of each top-level op of a nested graph without measured times: the
    sum of the modelled times of its innermost ops (the ones that do the work: ``aten::linear``
    is its ``aten::addmm``), each timed by the fallback chain from its shapes. Rows that are not
    top-level get NaN; a top-level op whose innermost ops are all unknown gets ``NONE``."""
    n = len(source)
    src, dst, kind = source.edge_rows()
    nest = (kind == EdgeKind.NEST) & (src >= 0)
    parent = np.arange(n, dtype=np.int64)
    parent[dst[nest]] = src[nest]
    has_child = np.zeros(n, bool)
    has_child[src[nest]] = True
    root = parent.copy()
    for _ in range(64):  # pointer jumping: log2(depth) rounds
        nxt = root[root]
        if np.array_equal(nxt, root):
            break
        root = nxt
    comm = np.isin(source.type, [int(x) for x in COMM_NODE_TYPES])
    leaf = ~has_child & ~comm & (source.type != NodeType.METADATA_NODE)
    cand = _candidates(source, hw, fit, node_features(source), astra_roofline)
    tdur, tsrc = _chain(cand, timing, n)
    ok = leaf & np.isfinite(tdur)
    total = np.bincount(root[ok], weights=tdur[ok], minlength=n)
    # the source that timed most of each top-level op's time
    code = np.full(n, NONE, np.int8)
    best = np.zeros(n)
    for c in _FALLBACK:
        sel = ok & (tsrc == c)
        t = np.bincount(root[sel], weights=tdur[sel], minlength=n)
        cnt = np.bincount(root[sel], minlength=n)
        take = (cnt > 0) & ((t > best) | (code == NONE))
        code[take] = c
        best = np.where(take, t, best)
    top = root == np.arange(n)
    out = np.where(top & (code != NONE), total, np.nan)
    return out, np.where(top, code, NONE).astype(np.int8)


def node_timing(g: RankGraph, timing: str, hw: dict[str, Any], fit: Any = None,
                features: tuple[np.ndarray, np.ndarray] | None = None,
                astra_roofline: tuple[float, float] | None = None,
                source: RankGraph | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dur µs, source code, contention)`` per node for ``timing`` in
    ``measured``/``calibrated``/``roofline``.

    The requested source is tried first, then the rest of :data:`SOURCES` in order. Comm nodes get
    their measured duration (or NaN): the network decides their transfer time.
    ``astra_roofline``: ``(peak FLOP/s, bytes/s)`` from an ASTRA-sim system file, overriding ``hw``.
    ``source``: the nested graph ``g`` keeps only the top-level ops of (the fallback form); its
    unmeasured top-level ops then take :func:`nested_durations`.

    ``contention``: the slope ``c`` of the op-model class fit that timed the node (a kernel beside a
    collective kernel of its GPU runs ``1 + c`` times slower: :attr:`.opmodel.ClassFit.contention`;
    the engine applies it while a transfer of the rank is in flight); 0 for every node whose time
    is measured (a captured kernel already ran beside the transfers it overlapped), timed by a
    calibration without a contention term, by the roofline, or by the summed nested ops of the
    fallback form.
    """
    n = len(g)
    cont = np.zeros(n)
    measured = np.where(np.isfinite(g.dur) & (g.dur >= 0), g.dur, np.nan)
    target = is_model_target(g)
    dur = measured.copy()
    src = np.where(np.isnan(measured), NONE, MEASURED).astype(np.int8)
    if not target.any():
        return (np.nan_to_num(dur, nan=0.0) if n else dur), src, cont
    if features is None:
        features = node_features(g)
    ccand: dict[int, np.ndarray] = {}
    cand = _candidates(g, hw, fit, features, astra_roofline, ccand)
    tdur, tsrc = _chain(cand, timing, n)
    own = np.ones(n, bool)  # timed by their own features (not by summed nested ops)
    if source is not None and source is not g and (source.dep_kind == EdgeKind.NEST).any():
        ndur, nsrc = nested_durations(source, timing, hw, fit, astra_roofline)
        rows = source.rows_of(g.id)
        okr = rows >= 0
        nd = np.full(n, np.nan)
        ns = np.full(n, NONE, np.int8)
        nd[okr] = ndur[rows[okr]]
        ns[okr] = nsrc[rows[okr]]
        # an unmeasured op with nested ops: their summed time (its own shapes would count its
        # children's work again, or miss it when it is a module-level op)
        use = target & np.isnan(measured) & np.isfinite(nd)
        tdur = np.where(use, nd, tdur)
        tsrc = np.where(use, ns, tsrc)
        own = ~use
    dur = np.where(target, tdur, dur)
    src = np.where(target, tsrc, src).astype(np.int8)
    for code, c in ccand.items():
        cont = np.where(target & own & (src == code), c, cont)
    comm = np.isin(g.type, [int(x) for x in COMM_NODE_TYPES])
    dur = np.where(comm, measured, np.nan_to_num(dur, nan=0.0))
    return dur, src, cont


def node_durations(g: RankGraph, timing: str, hw: dict[str, Any], fit: Any = None,
                   features: tuple[np.ndarray, np.ndarray] | None = None,
                   astra_roofline: tuple[float, float] | None = None,
                   source: RankGraph | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(dur µs, source code)`` per node: :func:`node_timing` without the contention slopes."""
    dur, src, _ = node_timing(g, timing, hw, fit, features, astra_roofline, source)
    return dur, src


def estimated(g: RankGraph) -> bool:
    """Whether ``g``'s durations are a synthesizer's estimates (``meta["durations"] == "estimated"``,
    kept in a Chakra file's GlobalMetadata), not measurements."""
    return str(g.meta.get("durations", "")) == "estimated"


def without_estimates(trace: Trace) -> Trace:
    """``trace`` with estimated durations dropped: a node without a measured duration is timed by
    the compute model on the hardware of the replay (``--system``), a transfer by the network.
    Ranks that shared a duration array share its replacement (stamped ranks stay cheap)."""
    if not any(estimated(g) for g in trace.graphs.values()):
        return trace
    blank: dict[int, np.ndarray] = {}
    graphs = {}
    for r, g in trace.graphs.items():
        if estimated(g):
            d = g.dur
            nan = blank.get(id(d))
            if nan is None:
                nan = blank[id(d)] = np.full(len(g), np.nan)
            g = g.replace(dur=nan)
        graphs[r] = g
    return Trace(trace.meta, graphs, trace.strings)
