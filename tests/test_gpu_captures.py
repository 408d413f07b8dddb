"""The real H100 captures of the sample decoder (``sample_traces/gpu_h100``, made with
``python -m sample_traces.regenerate_gpu``) and of Hugging Face forwards (``sample_traces/hf_h100``).

Expected values are read from the raw gzip JSON with plain ``json`` here, never from ettools.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
from click.testing import CliRunner
from shared_kineto import read_json

from ettools.cli import main
from ettools.formats import load_trace
from ettools.graph import EdgeKind
from ettools.replay.opsamples import GEMM, et_operands_as_kineto, op_features

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
GPU = SAMPLES / "gpu_h100"
HF = SAMPLES / "hf_h100"
SIZES = sorted(json.loads((GPU / "manifest.json").read_text())["sizes"])
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


@cache
def _raw(path: Path) -> dict:
    return read_json(path)


def _step_and_device(path: Path) -> tuple[float, float, list[tuple[float, float]]]:
    """``(step ts, step dur, device intervals)`` of a one-step Kineto file."""
    ev = _raw(path)["traceEvents"]
    (step,) = [e for e in ev if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"
               and e.get("cat") != "gpu_user_annotation"]
    dev = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in ev if e.get("cat") in DEVICE_CATS]
    return float(step["ts"]), float(step["dur"]), dev


def _busy(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Union length of ``intervals`` clipped to ``[lo, hi]``."""
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi):
        if cur_e is None or s > cur_e:
            busy += (cur_e - cur_s) if cur_e is not None else 0.0
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return busy + ((cur_e - cur_s) if cur_e is not None else 0.0)


def run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.stdout


def test_manifest_names_the_gpu_the_traces_show():
    man = json.loads((GPU / "manifest.json").read_text())
    assert set(SIZES) >= {"tiny", "small", "medium", "medium_b16", "large"}
    for size in SIZES:
        props = _raw(GPU / size / "rank0.kineto.json.gz")["deviceProperties"]
        assert props[0]["name"] == man["device"]["gpu"] == "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("size", SIZES)
def test_every_device_op_is_linked_to_its_launch(size):
    g = load_trace([str(GPU / size)]).trace.graphs[0]
    src, dst, kind = g.edge_rows()
    launched = set(dst[(kind == EdgeKind.LAUNCH) & (src >= 0)].tolist())
    dev = [i for i in range(len(g)) if g.is_cpu_op[i] != 1]
    raw_dev = [e for e in _raw(GPU / size / "rank0.kineto.json.gz")["traceEvents"] if e.get("cat") in DEVICE_CATS]
    assert len(dev) == len(raw_dev) > 100
    assert all(i in launched for i in dev)


def test_halving_every_kernel_of_the_gpu_bound_capture():
    """``large`` keeps the GPU busy ≥ 90 % of its step: halving every kernel shortens the step by
    40-50 % of its GPU-busy time (not 0 %, not the whole step)."""
    ts, dur, dev = _step_and_device(GPU / "large" / "rank0.kineto.json.gz")
    busy = _busy(dev, ts, ts + dur)
    assert busy / dur >= 0.9
    code, out = run("replay", str(GPU / "large"), "--what-if", "device=0.5", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["measured_step_time_us"] == pytest.approx(dur, rel=1e-6)
    cut = dur - d["step_time_us"]
    assert 0.40 * busy <= cut <= 0.50 * busy, f"shortened {cut:.0f} µs of {busy:.0f} µs busy"


def test_device_running_past_the_annotation_is_reported():
    """The host launched ``large``'s step in ~half the time its kernels took: the output says how
    long the step is between device-activity boundaries; a trace synchronized each step has no
    such warning."""
    ts, dur, dev = _step_and_device(GPU / "large" / "rank0.kineto.json.gz")
    boundary = max(e for _, e in dev) - ts
    assert boundary > 1.5 * dur
    code, out = run("replay", str(GPU / "large"), "--json")
    assert json.loads(out)["measured_device_bound_step_time_us"] == pytest.approx(boundary, rel=1e-3)
    code, out = run("replay", str(GPU / "large"))
    assert code == 0 and "warning: the device ran past the step annotations" in out
    assert f"{boundary / 1000:.2f}" in out
    code, out = run("replay", str(HF / "bert_base.json.gz"))
    assert code == 0 and "device ran past" not in out


def test_execution_trace_operands_time_kernels_by_shape():
    """A Kineto + ET capture takes its operands from the ET (``Tensor(c10::BFloat16)`` and the
    like): nearly all device time is re-timed by shape, not by class."""
    code, out = run("replay", str(GPU / "large"), "--system", "MI300X", "--json")
    assert code == 0
    share = json.loads(out)["retiming"]["share_of_device_time"]
    assert share["by shape"] >= 0.9


def test_et_operands_read_as_kineto_ones():
    values = [[134, 73, 0, 67108864, 2, "cuda:0"], [130, 126, 0, 8388608, 2, "cuda:0"], 2048, True, None]
    types = ["Tensor(c10::BFloat16)", "Tensor(c10::BFloat16)", "Int", "Bool", "None"]
    conc, kt = et_operands_as_kineto(values, types)
    assert kt == ["c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar", ""]
    assert conc == ["", "", "2048", "True", ""]
    f = op_features("aten::mm", [[32768, 2048], [2048, 4096]], types[:2], values[:2])
    assert f.cls == GEMM and f.dtype == "half"
    assert f.flops == 2 * 32768 * 2048 * 4096


@pytest.mark.parametrize("name", ["qwen1.5_0.5b", "gpt2", "tinyllama_1.1b", "bert_base", "vit_base"])
def test_hf_forward_self_replays(name):
    path = HF / f"{name}.json.gz"
    ts, dur, dev = _step_and_device(path)
    code, out = run("replay", str(path), "--json")
    assert code == 0
    d = json.loads(out)
    assert d["measured_step_time_us"] == pytest.approx(dur, rel=1e-6)
    assert abs(d["step_time_us"] - dur) <= 0.02 * dur


def test_device_bound_step_is_the_steady_period():
    """``large_steps4-6`` records steps 4-6 of the same run: steps 5 and 6 begin by waiting for the
    previous step's kernels (the loss read syncs), so their annotations are the loop's period. The
    step measured between device-activity boundaries matches them; the annotation mean (dragged by
    step 4, which the host launched ahead of its kernels) does not."""
    ev = _raw(GPU / "large_steps4-6" / "rank0.kineto.json.gz")["traceEvents"]
    steps = sorted((e["name"], float(e["dur"])) for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")
                   and e.get("ph") == "X" and e.get("cat") != "gpu_user_annotation")
    assert [n for n, _ in steps] == ["ProfilerStep#4", "ProfilerStep#5", "ProfilerStep#6"]
    steady = (steps[1][1] + steps[2][1]) / 2
    code, out = run("replay", str(GPU / "large_steps4-6"), "--json")
    d = json.loads(out)
    assert abs(d["measured_device_bound_step_time_us"] - steady) <= 0.05 * steady
    assert d["measured_step_time_us"] < 0.9 * steady


H200 = SAMPLES / "gpu_h200"


def _device_us(folder: Path) -> float:
    """Kernel + memcpy + memset µs of a capture's Kineto file, by plain json."""
    ev = _raw(folder / "rank0.kineto.json.gz")["traceEvents"]
    return sum(float(e["dur"]) for e in ev if e.get("cat") in DEVICE_CATS)


@pytest.mark.parametrize("size", ["small", "medium", "medium_b16", "large"])
@pytest.mark.parametrize("src,dst,target", [(GPU, H200, "H200"), (H200, GPU, "H100")])
def test_other_gpu_device_time_predicted(size, src, dst, target):
    """Held out (no op model was fitted on these captures; the H200 has no fit): the device time of
    the same program on the other GPU within 10 %."""
    code, out = run("replay", str(src / size), "--system", target, "--json")
    assert code == 0
    pred = json.loads(out)["retiming"]["device_us_retimed"]
    meas = _device_us(dst / size)
    assert abs(pred - meas) <= 0.10 * meas, f"{pred:.0f} vs {meas:.0f} µs"


@pytest.mark.parametrize("src,dst,target", [(GPU, H200, "H200"), (H200, GPU, "H100")])
def test_other_gpu_gpu_bound_step_predicted(src, dst, target):
    """The GPU-bound ``large`` step between device-activity boundaries on the other GPU within 5 %
    (copying the source's would be 8-9 % off)."""
    ts, dur, dev = _step_and_device(dst / "large" / "rank0.kineto.json.gz")
    meas = max(e for _, e in dev) - ts
    code, out = run("replay", str(src / "large"), "--system", target, "--json")
    assert code == 0
    pred = json.loads(out)["device_bound_step_time_us"]
    assert abs(pred - meas) <= 0.05 * meas, f"{pred:.0f} vs {meas:.0f} µs"


def test_borrowed_op_model_is_named():
    """The H200 has no fit of its own: the output says whose fit timed it."""
    code, out = run("replay", str(GPU / "large"), "--system", "H200", "--json")
    models = json.loads(out)["retiming"]["op_models"]
    assert models["H100"].startswith("its own fit") and "H100 fit moved to it" in models["H200"]
    # H100's attention is fitted on three shapes: both GPUs time it by A100's 4,191-size fit
    assert "attention from the A100 fit" in models["H100"] and "attention from the A100 fit" in models["H200"]
    code, out = run("replay", str(GPU / "large"), "--system", "H200")
    assert "op model of H200: no fit of its own" in out
