"""The hardware a replay simulates: presets, user descriptions, detection from a trace, peaks.

Hardware presets live in ``hardware/presets.json`` (A100, H100, H200, B200, MI300X: peak TFLOP/s per
dtype, HBM GB/s, memory bytes, default network); :func:`load_hardware` merges a user file or dict
over a preset, :func:`identify_device` and :func:`hardware_from_trace` pick the preset a trace's
device properties name, and :func:`peak_flops` / :func:`roofline_us` read the figures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ettools.errors import TraceError

_PRESETS_FILE = Path(__file__).with_name("hardware") / "presets.json"
_GAPS_FILE = Path(__file__).with_name("data") / "kernel_gaps.json"
DEFAULT_HARDWARE = "H100"


def presets() -> dict[str, dict[str, Any]]:
    """The hardware presets (name -> description)."""
    data = json.loads(_PRESETS_FILE.read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def load_hardware(system: str | Path | dict[str, Any] | None, world: int = 1) -> dict[str, Any]:
    """A hardware description: a preset name, a JSON file or a dict (``"hardware": "<preset>"`` to
    start from a preset, then any of ``peak_tflops`` {dtype: TFLOP/s}, ``hbm_gbps``, ``memory_bytes``,
    ``dtype``, ``launch_queue_depth``, ``overlap_slowdown``, ``kernel_gap_us``, ``network``), or None for the default
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
    gap = kernel_gaps().get(key)
    if gap is not None:
        hw["kernel_gap_us"] = float(gap["gap_us"])
        hw["kernel_gap_source"] = (f"borrowed from {gap['borrowed_from']} (no {key} trace)" if "borrowed_from" in gap
                                   else f"median of {len(gap['traces'])} real {key}-class traces, data/kernel_gaps.json")
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
    if "kernel_gap_us" in raw:
        hw["kernel_gap_source"] = "given"
    return hw


def kernel_gaps() -> dict[str, dict[str, Any]]:
    """Each preset's kernel-to-kernel gap on a stream (``data/kernel_gaps.json``, measured on real
    traces by ``make_kernel_gaps.py``; {} when the file is absent)."""
    try:
        return json.loads(_GAPS_FILE.read_text())["gpus"]
    except FileNotFoundError:
        return {}


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
