"""The hardware a replay simulates: presets, user descriptions, detection from a trace, peaks.

The simulated hardware is one immutable :class:`Hardware` (typed fields; ``to_dict`` /
``from_dict`` for its JSON form), passed to every function that reads the hardware. Presets live in
``hardware/presets.json`` (A100, H100, H200, B200, MI300X, ...: peak TFLOP/s per dtype, HBM GB/s,
memory bytes, default network); :func:`load_hardware` builds a :class:`Hardware` from a preset name,
a user file or dict merged over a preset; :func:`identify_device` and :func:`hardware_from_trace`
build the one a trace's device properties name; :func:`peak_flops` / :func:`roofline_us` read the
figures.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ettools.errors import TraceError

_PRESETS_FILE = Path(__file__).with_name("hardware") / "presets.json"
_GAPS_FILE = Path(__file__).with_name("data") / "kernel_gaps.json"
DEFAULT_HARDWARE = "H100"


class FrozenMap(Mapping[str, Any]):
    """A read-only mapping (a ``dict`` copied once): the nested tables of a :class:`Hardware`
    (peak TFLOP/s per dtype, the network, the preset's ``match``). Equal to a ``dict`` with the same
    items; :meth:`to_dict` gives a plain, JSON-ready copy."""

    __slots__ = ("_d",)

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        self._d: dict[str, Any] = dict(data or {})

    def __getitem__(self, key: str) -> Any:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __repr__(self) -> str:
        return f"FrozenMap({self._d!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self._d == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenMap, (self._d,))

    def to_dict(self) -> dict[str, Any]:
        """A plain ``dict`` copy (nested lists and dicts copied too)."""
        return copy.deepcopy(self._d)


def _frozen(v: Mapping[str, Any] | None) -> FrozenMap:
    return v if isinstance(v, FrozenMap) else FrozenMap(v)


# Hardware's JSON keys, in the order of its ``to_dict`` (absent: the optional ones left None)
_FIELDS = ("name", "names", "match", "kernel_arch", "source", "peak_tflops", "dtype", "hbm_gbps", "memory_bytes",
           "launch_queue_depth", "network", "preset", "kernel_gap_us", "kernel_gap_source",
           "overlap_slowdown", "detected", "device_name", "preset_label")


@dataclass(frozen=True, eq=True)
class Hardware(Mapping[str, Any]):
    """The hardware a replay simulates: one GPU (figures per device) and its default network.

    Built by :func:`load_hardware` (a preset, a user's JSON or dict over a preset) and by
    :func:`identify_device` / :func:`hardware_from_trace` (the device a trace names); immutable:
    :meth:`replace` returns a changed copy. The fields are the keys of the hardware JSON
    (``presets.json``, a ``--system`` file): :meth:`to_dict` writes that form and :meth:`from_dict`
    reads it; keys this class does not know are kept in ``extra``. Read-only ``hw["key"]`` /
    ``hw.get("key")`` access over that JSON form is kept for callers written against the dict.

    ``peak_tflops``: dense peak TFLOP/s per dtype; ``hbm_gbps``: memory bandwidth (10^9 B/s);
    ``memory_bytes``: device memory; ``dtype``: the dtype :func:`peak_flops` defaults to;
    ``launch_queue_depth``: kernels the launch queue holds; ``network``: ``gpus_per_node``,
    ``scale_up_gbps``/``_latency_ns``, ``scale_out_gbps``/``_latency_ns``; ``names``/``match``:
    how a trace's device is recognised as this preset (``match.sms``: SM/CU count);
    ``kernel_arch``: architecture tokens of its kernels' names (a trace without device properties);
    ``source``: where the preset's figures come from; ``kernel_gap_us``/``kernel_gap_source``: the
    kernel-to-kernel stream gap and its origin; ``overlap_slowdown``: the user's compute slowdown
    under overlapping communication; ``detected``: how the hardware was chosen; ``device_name``:
    the trace's device name; ``preset_label``: the name shown when the device is not a preset.
    Optional fields left None are absent from the JSON form.
    """

    name: str = ""
    names: tuple[str, ...] = ()
    match: Mapping[str, Any] = field(default_factory=FrozenMap)
    kernel_arch: tuple[str, ...] = ()
    source: str = ""
    peak_tflops: Mapping[str, float] = field(default_factory=FrozenMap)
    dtype: str = "bf16"
    hbm_gbps: float = 0.0
    memory_bytes: int = 0
    launch_queue_depth: int = 1024
    network: Mapping[str, Any] = field(default_factory=FrozenMap)
    preset: str = ""
    kernel_gap_us: float | None = None
    kernel_gap_source: str | None = None
    overlap_slowdown: float | None = None
    detected: str | None = None
    device_name: str | None = None
    preset_label: str | None = None
    extra: Mapping[str, Any] = field(default_factory=FrozenMap)

    def __post_init__(self) -> None:
        for k in ("match", "peak_tflops", "network", "extra"):
            object.__setattr__(self, k, _frozen(getattr(self, k)))
        object.__setattr__(self, "names", tuple(self.names))
        object.__setattr__(self, "kernel_arch", tuple(self.kernel_arch))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Hardware:
        """A :class:`Hardware` from its JSON form (:meth:`to_dict`); unknown keys go to ``extra``."""
        kw: dict[str, Any] = {k: d[k] for k in _FIELDS if k in d and d[k] is not None}
        for k, conv in (("hbm_gbps", float), ("memory_bytes", int), ("launch_queue_depth", int),
                        ("kernel_gap_us", float), ("overlap_slowdown", float)):
            if k in kw:
                kw[k] = conv(kw[k])
        if "peak_tflops" in kw:
            kw["peak_tflops"] = {str(a): float(b) for a, b in kw["peak_tflops"].items()}
        extra = {k: v for k, v in d.items() if k not in _FIELDS and k != "extra"}
        return cls(**kw, extra={**dict(d.get("extra") or {}), **extra})

    def to_dict(self) -> dict[str, Any]:
        """The hardware JSON form: every field set (optional ones when not None), then ``extra``;
        plain, JSON-ready values."""
        out: dict[str, Any] = {}
        for k in _FIELDS:
            v = getattr(self, k)
            if v is None:
                continue
            out[k] = v.to_dict() if isinstance(v, FrozenMap) else list(v) if isinstance(v, tuple) else v
        out.update(self.extra.to_dict())  # type: ignore[attr-defined]
        return out

    def replace(self, **changes: Any) -> Hardware:
        """A copy with ``changes`` (field names) applied."""
        return dataclasses.replace(self, **changes)

    @property
    def label(self) -> str:
        """The name a report shows: the preset, or the trace's own device when it is not a preset."""
        return str(self.preset_label or self.preset or self.name or "?")

    @property
    def sms(self) -> int:
        """The SM/CU count of ``match`` (0 where unknown)."""
        return int(self.match.get("sms") or 0)

    # the read-only mapping view over the JSON form
    def __getitem__(self, key: str) -> Any:
        if key in _FIELDS:
            v = getattr(self, key)
            if v is None:
                raise KeyError(key)
            return list(v) if isinstance(v, tuple) else v
        return self.extra[key]

    def __iter__(self) -> Iterator[str]:
        return iter([k for k in _FIELDS if getattr(self, k) is not None] + list(self.extra))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, key: object) -> bool:
        return (key in _FIELDS and getattr(self, str(key)) is not None) or key in self.extra

    __hash__ = None  # type: ignore[assignment]


def presets() -> dict[str, dict[str, Any]]:
    """The hardware presets (name -> description)."""
    data = json.loads(_PRESETS_FILE.read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def load_hardware(system: str | Path | Mapping[str, Any] | Hardware | None, world: int = 1) -> Hardware:
    """The :class:`Hardware` of a description: a preset name, a JSON file or a dict
    (``"hardware": "<preset>"`` to start from a preset, then any of ``peak_tflops`` {dtype: TFLOP/s},
    ``hbm_gbps``, ``memory_bytes``, ``dtype``, ``launch_queue_depth``, ``overlap_slowdown``,
    ``kernel_gap_us``, ``network``; other keys are kept in :attr:`Hardware.extra`), None for the
    default (H100), or a :class:`Hardware` (returned as it is). ASTRA-sim keys ``peak-perf``
    (TFLOP/s) and ``local-mem-bw`` (GB/s) are understood too. ``world`` is not used.
    """
    if isinstance(system, Hardware):
        return system
    table = presets()
    if system is None:
        raw: dict[str, Any] = {}
    elif isinstance(system, Mapping):
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
    desc = json.loads(json.dumps(table[key]))
    desc["preset"] = key
    gap = kernel_gaps().get(key)
    if gap is not None:
        desc["kernel_gap_us"] = float(gap["gap_us"])
        desc["kernel_gap_source"] = (f"borrowed from {gap['borrowed_from']} (no {key} trace)" if "borrowed_from" in gap
                                     else f"median of {len(gap['traces'])} real {key}-class traces, data/kernel_gaps.json")
    for k, v in raw.items():
        if k == "peak_tflops" and isinstance(v, Mapping):
            desc["peak_tflops"].update({str(a): float(b) for a, b in v.items()})
        elif k == "network" and isinstance(v, Mapping):
            desc["network"].update(v)
        elif k == "peak-perf":
            desc["peak_tflops"] = {d: float(v) for d in desc["peak_tflops"]}
        elif k == "local-mem-bw":
            desc["hbm_gbps"] = float(v)
        elif k != "hardware":
            desc[k] = v
    desc.setdefault("dtype", "bf16")
    if "kernel_gap_us" in raw:
        desc["kernel_gap_source"] = "given"
    return Hardware.from_dict(desc)


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


def _props_fit(match: dict[str, Any], props: dict[str, Any], vendor: str) -> bool:
    """Whether the recorded properties agree with a preset's ``match`` (vendor, compute, SMs)."""
    if not match or match.get("vendor") != vendor:
        return False
    comp = match.get("compute")
    if comp is not None and [props.get("computeMajor"), props.get("computeMinor")] != list(comp):
        return False
    sms = match.get("sms")
    return sms is None or props.get("numSms") == sms


def identify_device(props: dict[str, Any]) -> Hardware:
    """The :class:`Hardware` of one ``deviceProperties`` entry.

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
        return load_hardware(out)
    by_props = [k for k, v in table.items() if _props_fit(v.get("match") or {}, props, vendor)]
    if by_props:
        key = closest(by_props)
        same = [k for k in by_props if k != key and table[k]["peak_tflops"] == table[key]["peak_tflops"]
                and table[k]["hbm_gbps"] == table[key]["hbm_gbps"]]
        alias = f" (same figures as {', '.join(same)})" if same else ""
        out.update(hardware=key, detected=f"device properties ({vendor}, compute {comp}, {sms} SMs/CUs) "
                                          f"of {name or 'an unnamed device'}: {key}{alias}")
        return load_hardware(out)
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
    return load_hardware(out)


def hardware_from_trace(trace: Any) -> Hardware:
    """The :class:`Hardware` the trace itself names (see :func:`identify_device`): its first
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
                return load_hardware({"hardware": key, "detected": f"the device its durations were estimated for ({key})"})
        break
    inferred = device_from_kernel_names(_device_op_names(trace))
    if inferred is not None:
        return inferred
    return load_hardware({"hardware": DEFAULT_HARDWARE,
                          "detected": f"default: the trace names no device ({DEFAULT_HARDWARE} assumed)"})


def _device_op_names(trace: Any) -> list[str]:
    """The distinct names of the device ops (``is_cpu_op == 0``) of the trace's first rank graph."""
    for g in getattr(trace, "graphs", {}).values():
        rows = np.flatnonzero(np.asarray(g.is_cpu_op) == 0)
        return [str(g.strings[i]) for i in np.unique(np.asarray(g.name)[rows]).tolist()]
    return []


def device_from_kernel_names(names: list[str]) -> Hardware | None:
    """The preset of the newest architecture whose ``kernel_arch`` tokens the kernel ``names`` carry
    (``ampere_fp16_s16816gemm…``, ``sm90_xmma_gemm…``, AMD ``…gfx942…``), or None when none does.

    For traces that record no device properties. A kernel built for an older architecture also
    runs on newer GPUs, so the answer is a lower bound on the architecture and the part (memory
    size, SXM or PCIe) a guess: ``detected`` says both, and which tokens were seen.
    """
    table = presets()
    seen: dict[str, set[str]] = {}
    low = [n.lower() for n in names]
    for key, v in table.items():
        for tok in v.get("kernel_arch", []):
            t = str(tok).lower()
            # smNN also as sm_NN, with a letter suffix (sm90a, sm100f); never inside a longer token
            body = f"sm_?{t[2:]}[a-z]?" if re.fullmatch(r"sm\d+", t) else re.escape(t)
            pat = re.compile(rf"(?<![a-z0-9]){body}(?![a-z0-9])")
            if any(pat.search(n) for n in low):
                seen.setdefault(key, set()).add(t)
    if not seen:
        return None

    def generation(k: str) -> tuple[int, ...]:
        return tuple((table[k].get("match") or {}).get("compute") or (0,))

    newest = max(generation(k) for k in seen)
    keys = [k for k in seen if generation(k) == newest]  # file order: the first is the usual part
    key = keys[0]
    alias = f"; {', '.join(keys[1:])} share the architecture" if len(keys) > 1 else ""
    return load_hardware({"hardware": key, "detected":
                          f"kernel names: the trace records no device; its kernels were built for "
                          f"{'/'.join(sorted(seen[key]))} (the newest architecture among them), taken as "
                          f"{key}{alias} — a guess: kernels of an older architecture also run on newer GPUs"})


def hardware_label(hw: Hardware) -> str:
    """The name a report shows: the preset, or the trace's own device when it is not a preset."""
    return hw.label


def peak_flops(hw: Hardware, dtype: str | None = None) -> float:
    """Peak FLOP/s of ``dtype`` (default the hardware's ``dtype``)."""
    d = (dtype or hw.dtype or "bf16").lower()
    table = hw.peak_tflops
    v = table.get(d) or table.get("bf16") or max(table.values())
    return float(v) * 1e12


def roofline_us(flops: np.ndarray, nbytes: np.ndarray, hw: Hardware) -> np.ndarray:
    """``max(flops / peak, bytes / bandwidth)`` in µs; NaN where neither is known."""
    f = np.asarray(flops, np.float64)
    b = np.asarray(nbytes, np.float64)
    peak = peak_flops(hw)
    bw = float(hw.hbm_gbps) * 1e9
    tf = np.where(f >= 0, f / peak, np.nan)
    tb = np.where(b >= 0, b / bw, np.nan)
    t = np.fmax(tf, tb) * 1e6
    return t
