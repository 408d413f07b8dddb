"""One ``Hardware`` type (issue 28, item 3): the simulated hardware is a frozen dataclass built from
the presets, a user's description and trace detection, and no signature takes it as a dict."""

from __future__ import annotations

import ast
import dataclasses
import json
import pickle
from pathlib import Path

import pytest

from ettools.replay.devices import (
    Hardware,
    hardware_from_trace,
    identify_device,
    kernel_gaps,
    load_hardware,
    peak_flops,
    presets,
)

REPO = Path(__file__).resolve().parents[1]
PRESETS = REPO / "replay" / "hardware" / "presets.json"


def test_load_hardware_is_the_preset_json_as_before():
    """The JSON form of a loaded preset is the preset's entry, its name, its kernel gap and the
    default dtype: the dict ``load_hardware`` returned before it returned a ``Hardware``."""
    raw = json.loads(PRESETS.read_text())
    gaps = kernel_gaps()
    for name in presets():
        hw = load_hardware(name)
        assert isinstance(hw, Hardware)
        want = {**raw[name], "preset": name}
        if name in gaps:
            want["kernel_gap_us"] = float(gaps[name]["gap_us"])
        want.setdefault("dtype", "bf16")
        got = hw.to_dict()
        assert {k: v for k, v in got.items() if k != "kernel_gap_source"} == want
        assert json.loads(json.dumps(got)) == got  # plain, JSON-ready
        assert Hardware.from_dict(got) == hw
        assert dict(hw) == got and hw["peak_tflops"] == raw[name]["peak_tflops"]  # the read-only mapping view


def test_hardware_is_frozen_and_replace_copies():
    hw = load_hardware("A100")
    with pytest.raises(dataclasses.FrozenInstanceError):
        hw.dtype = "fp32"  # type: ignore[misc]
    with pytest.raises(TypeError):
        hw.peak_tflops["bf16"] = 1.0  # type: ignore[index]
    fp32 = hw.replace(dtype="fp32")
    assert hw.dtype == "bf16" and fp32.dtype == "fp32"
    assert peak_flops(fp32) == pytest.approx(hw.peak_tflops["fp32"] * 1e12)
    assert pickle.loads(pickle.dumps(hw)) == hw
    assert load_hardware(hw) is hw


def test_user_description_over_a_preset():
    hw = load_hardware({"hardware": "H100", "network": {"scale_out_gbps": 25.0}, "peak-perf": 500,
                        "overlap_slowdown": 0.1, "my-key": [1, 2]})
    assert hw.preset == "H100" and hw.network["scale_out_gbps"] == 25.0 and hw.network["gpus_per_node"] == 8
    assert set(hw.peak_tflops.values()) == {500.0} and hw.overlap_slowdown == 0.1
    assert hw.extra == {"my-key": [1, 2]} and hw.to_dict()["my-key"] == [1, 2] and hw["my-key"] == [1, 2]
    assert "detected" not in hw and hw.get("detected") is None and hw.detected is None


def test_detection_builds_hardware():
    props = {"name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85 * 2**30, "computeMajor": 9, "computeMinor": 0,
             "numSms": 132}
    hw = identify_device(props)
    assert isinstance(hw, Hardware) and hw.preset == "H100" and hw.device_name == props["name"]
    assert hw.memory_bytes == props["totalGlobalMem"] and "device name" in (hw.detected or "")

    class _Meta:
        device_properties: list = []

    class _Trace:
        meta = _Meta()
        graphs: dict = {}

    found = hardware_from_trace(_Trace())
    assert isinstance(found, Hardware) and found.label == "H100" and found.detected.startswith("default")


_HW_NAMES = {"hw", "hardware", "gpu", "spec"}


def test_no_signature_takes_the_hardware_as_a_dict():
    """No function of the distribution annotates a hardware parameter (``hw``, ``hardware``,
    ``gpu``, ``spec``) as a dict: it is a :class:`Hardware` (or, for ``gpu``, a preset name)."""
    bad = []
    for root in ("replay", "ettools", "converters", "scaler"):
        for f in sorted((REPO / root).rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text(), str(f))):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                a = node.args
                for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                    if arg.arg in _HW_NAMES and arg.annotation is not None:
                        ann = ast.unparse(arg.annotation)
                        if "dict" in ann.lower() or "mapping" in ann.lower():
                            bad.append(f"{f.relative_to(REPO)}:{node.lineno} {node.name}({arg.arg}: {ann})")
    assert not bad, bad
