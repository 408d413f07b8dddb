"""Never a silent zero, and consistent reports (issue 11, mechanisms 6 and 7).

Every expectation is read independently from the raw files (gzip JSON, comm_group.json, the
presets' data-sheet JSON, ``synth --json``), not from the code under test.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from shared_kineto import read_json

from ettools.cli import main
from ettools.converters.kineto import read_kineto
from ettools.formats import load_trace
from ettools.replay import replay_trace

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
PRESETS = Path(__file__).resolve().parents[1] / "replay" / "hardware" / "presets.json"

# every GPU Kineto trace of ../shared/traces (one path per trace; a folder = its ranks)
GPU_TRACES = [
    "kineto/hta_alexnet_1rank", "kineto/hta_amd_mi250", "kineto/hta_event_sync_multistream",
    "kineto/hta_fwdbwd_1rank", "kineto/hta_nccl_2rank", "kineto/hta_world128_sampled",
    "kineto/hta_16rank_blocking_memcpy", "kineto/hta_8rank_rank3", "kineto/tracelens_mi300x_resnet_ddp8",
    "kineto/tracelens_mi210_gpu_only", "kineto/tb_resnet50_v100_legacy",
    "et_kineto/hta_simple_add/kineto.json.gz", "et_kineto/param_linear/kineto.json.gz",
    "et_kineto/param_resnet/kineto.json.gz", "et_kineto/triosim_vgg13_h100/kineto.json.gz",
    "et_kineto/param_dlrm_8rank/kineto",
    "hardware_pairs/qwen1.5_0.5b/h100.json.gz", "hardware_pairs/qwen1.5_0.5b/mi300x.json.gz",
    "hardware_pairs/bert_small/h100.json.gz", "hardware_pairs/bert_small/mi300x.json.gz",
    "inference/sglang_qwen3_8b_mi300x/decode_bs32.json.gz",
    "inference/vllm_mi300x_cudagraphs/decode_full_graph_execution.json.gz",
]


def run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.stdout, res.stderr


def raw_json(path: Path):
    return read_json(path)


@functools.cache
def synth_dir(tmp: str, *extra: str) -> tuple[Path, dict]:
    """A small synthesized job (tp 2 x dp 2) written with ``synth``, and its ``--json`` summary."""
    out = Path(tmp) / ("synth" + "".join(extra).replace(" ", ""))
    code, js, err = run("synth", "--model", "gpt3-5b", "--dim", "L=2", "--tp", "2", "--dp", "2",
                        "--batch", "4", "--micro-batch", "2", "-o", str(out), "--json", "-q", *extra)
    assert code == 0, err
    return out, json.loads(js)


@pytest.fixture(scope="module")
def tmp_module(tmp_path_factory):
    return str(tmp_path_factory.mktemp("silent"))


# ---- never a silent zero ----------------------------------------------------------------------------

@functools.cache
def et_only(path: Path):
    """(raw JSON, loaded trace) of an ET-only file, read once for both timings (only read)."""
    return raw_json(path), load_trace([path]).trace


@pytest.mark.parametrize("timing", ["measured", "roofline"])
def test_et_only_trace_replays_from_operator_shapes(timing):
    path = SHARED / "et_kineto/param_resnet/et.json.gz"
    raw, trace = et_only(path)
    nodes = raw["nodes"]
    # the file holds no durations, but convolutions with their shapes
    assert not any("dur" in n or "exclusive_dur" in n and n["exclusive_dur"] for n in nodes)
    convs = [n for n in nodes if n["name"] in ("aten::cudnn_convolution", "aten::convolution")]
    assert convs and all(n.get("inputs") for n in convs)
    res = replay_trace(trace, timing=timing)
    assert res.step_time_us > 0
    tb = res.time_by_source_us
    model = "roofline" if timing == "roofline" else "fitted"  # default: the GPU's fitted op model
    assert tb.get(model, 0) > 0 and tb.get("measured", 0) == 0
    assert "measured" not in res.to_json()  # no measured step to compare with
    text = res.summary_text()
    assert model in text.split("time by model")[1]


def test_synthesized_trace_communicates_without_network(tmp_module):
    out, _ = synth_dir(tmp_module)
    groups = json.loads((out / "comm_group.json").read_text())
    assert any(len(m) > 1 for m in groups.values())  # there are real collectives to time
    code, js, err = run("replay", str(out), "--json", "-q")
    assert code == 0, err
    d = json.loads(js)
    assert all(r["comm_us"] > 0 for r in d["ranks"].values())
    assert d["time_by_source_us"]["network"] > 0
    assert "measured" not in d["time_by_source_us"]


def test_system_retimes_synthesized_estimates(tmp_module):
    out, _ = synth_dir(tmp_module)
    peaks = {k: v["peak_tflops"]["bf16"] for k, v in json.loads(PRESETS.read_text()).items() if k in ("A100", "H100")}
    runs = {}
    for system in ("H100", "A100"):
        code, js, err = run("replay", str(out), "--system", system, "--json", "-q")
        assert code == 0, err
        runs[system] = json.loads(js)
    assert peaks["A100"] < peaks["H100"]
    # the A100 is slower: the synthesizer's H100 estimates were re-timed
    assert runs["A100"]["step_time_us"] > 1.5 * runs["H100"]["step_time_us"]
    for d in runs.values():
        assert all(0 < r["mfu"] <= 1.0 for r in d["ranks"].values())  # roofline never beats the peak
    assert runs["A100"]["hardware"] == "A100"


def test_synthesized_subset_times_collectives_of_absent_members(tmp_module):
    out, _ = synth_dir(tmp_module, "--ranks", "0-1")
    written = sorted(p.name for p in out.glob("*.et"))
    groups = json.loads((out / "comm_group.json").read_text())
    assert written == ["synth.0.et", "synth.1.et"]
    assert any(set(m) & {0, 1} and set(m) - {0, 1} for m in groups.values())  # a group reaching unwritten ranks
    code, js, err = run("replay", str(out), "--json", "-q")  # a declared subset is not a missing file
    assert code == 0, err
    d = json.loads(js)
    assert all(r["comm_us"] > 0 for r in d["ranks"].values())
    assert d["time_by_source_us"]["network"] > 0


def test_replay_reports_the_synthesizer_peak_memory(tmp_module):
    out, summary = synth_dir(tmp_module)
    code, js, err = run("replay", str(out), "--json", "-q")
    assert code == 0, err
    d = json.loads(js)
    for r, s in summary["ranks"].items():
        assert d["ranks"][r]["peak_memory_bytes"] == s["peak_memory_bytes"] > 0
        assert d["ranks"][r]["memory"]["source"] == "synth"


def test_missing_rank_file_is_an_error(tmp_path, tmp_module):
    src, _ = synth_dir(tmp_module)
    out = tmp_path / "job"
    out.mkdir()
    for p in src.iterdir():
        if p.name != "synth.2.et":
            (out / p.name).write_bytes(p.read_bytes())
    code, _, err = run("replay", str(out), "-q")
    assert code == 2 and "ranks 2 " in err and len(err.strip().splitlines()) == 1
    code, _, err = run("replay", str(out), "-q", "--allow-missing-ranks")
    assert code == 0, err


# ---- hardware from the trace's device properties ----------------------------------------------------

@pytest.mark.parametrize("rel,want", [
    ("kineto/tb_resnet50_v100_legacy/rank0.json.gz", "V100"),
    ("et_kineto/param_dlrm_8rank/kineto/rank0.json.gz", "V100"),
    ("kineto/hta_16rank_blocking_memcpy/rank0.json.gz", "A100"),
    ("kineto/tracelens_mi210_gpu_only/rank0.json.gz", "MI210"),
    ("kineto/tracelens_mi300x_resnet_ddp8/rank0.json.gz", "MI300X"),
    ("hardware_pairs/bert_small/h100.json.gz", "H100"),
])
def test_hardware_named_by_the_device(rel, want):
    props = raw_json(SHARED / rel)["deviceProperties"][0]
    assert want.lower() in props["name"].lower().replace(" ", "")
    res = replay_trace(read_kineto(SHARED / rel), memory=False)
    assert res.to_json()["hardware"].startswith(want)
    assert int(res.hardware["memory_bytes"]) == props["totalGlobalMem"]


def test_hardware_from_properties_when_the_name_is_missing():
    rel = "inference/vllm_mi300x_cudagraphs/decode_full_graph_execution.json.gz"
    props = raw_json(SHARED / rel)["deviceProperties"][0]
    assert props["name"] == "" and props["numSms"] == 304 and props["warpSize"] == 64
    from ettools.replay.compute import identify_device, load_hardware

    hw = load_hardware(identify_device(props))
    assert hw["preset"] == "MI300X" and "properties" in hw["detected"]
    # a device that is no preset: its own SM count scales its architecture's per-SM peak, and says so
    fake = dict(raw_json(SHARED / "kineto/hta_alexnet_1rank/rank0.json.gz")["deviceProperties"][0],
                name="NVIDIA Example 54SM", numSms=54)
    hw = load_hardware(identify_device(fake))
    a100 = json.loads(PRESETS.read_text())["A100"]["peak_tflops"]["bf16"]
    assert hw["peak_tflops"]["bf16"] == pytest.approx(a100 * 54 / 108, rel=1e-3)
    assert "not a preset" in hw["detected"] and "NVIDIA Example 54SM" in hw["detected"]


@pytest.mark.parametrize("names,want", [
    (["ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_64x3_tn"], "A100"),
    # the newest architecture among the kernels: Hopper runs sm80 kernels beside its own
    (["sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize96x128x32", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"], "H100"),
    (["volta_sgemm_128x64_nn", "void at::native::vectorized_elementwise_kernel<4>"], "V100"),
    (["void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_sm100f_128x128>"], "B200"),
    (["Cijk_Alik_Bljk_BBS_BH_MT128x128x64_gfx942_SN"], "MI300X"),
])
def test_gpu_inferred_from_kernel_names(names, want):
    from ettools.replay.devices import device_from_kernel_names

    hw = device_from_kernel_names(names)
    assert hw is not None and hw["preset"] == want
    assert "kernel names" in hw["detected"] and "guess" in hw["detected"]


@pytest.mark.parametrize("names", [
    ["void at::native::vectorized_elementwise_kernel<4>", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"],
    ["xmma_gemm_sm_750_tilesize64", "Cijk_Alik_Bljk_HHS_BH_MT64x64x32_SN"],  # no token of a preset: sm_750 is not sm75
])
def test_no_gpu_inferred_without_an_architecture_token(names):
    from ettools.replay.devices import device_from_kernel_names

    assert device_from_kernel_names(names) is None


def test_gpu_from_kernel_names_is_a_lower_bound_on_real_traces():
    """On every shared trace that does name its GPU, the device read from its kernel names alone
    (properties ignored) is of the same vendor and no newer an architecture than the named one —
    the claim the inference states (kernels built for an older architecture run on newer GPUs:
    the RTX 2080 Ti traces run 'volta_' kernels). Vendor and compute capability come from the raw
    deviceProperties; where the names carry a token, at least some traces must be placed."""
    from ettools.replay.devices import device_from_kernel_names

    placed = 0
    # every Kineto trace found by walking the folder (traces added later join), one rank per folder
    done: set[Path] = set()
    for path in sorted(SHARED.rglob("*.json.gz")):
        if path.parent in done:
            continue
        raw = raw_json(path)
        if not isinstance(raw, dict) or "traceEvents" not in raw:
            continue  # a PyTorch ET or another format
        done.add(path.parent)
        props = (raw.get("deviceProperties") or [{}])[0]
        if not props.get("name"):
            continue  # the device is not named: nothing to check against
        names = sorted({e["name"] for e in raw["traceEvents"] if e.get("cat") in ("kernel", "Kernel")})
        hw = device_from_kernel_names(names)
        if hw is None:
            continue
        placed += 1
        amd = props.get("warpSize") == 64
        assert hw["match"]["vendor"] == ("amd" if amd else "nvidia"), path
        assert tuple(hw["match"]["compute"]) <= (props["computeMajor"], props["computeMinor"]), path
    assert placed >= 8


def test_trace_without_device_properties_is_retimed_from_its_kernel_names():
    """hta_world128_sampled records no deviceProperties; its cuBLAS kernels are 'ampere_…'
    (read from the raw file here), so --system B200 re-times its device ops from A100 and says
    it guessed the source GPU, instead of keeping every device time as measured."""
    rel = "kineto/hta_world128_sampled/rank0.json.gz"
    raw = raw_json(SHARED / rel)
    assert not raw.get("deviceProperties")
    kernels = [e["name"] for e in raw["traceEvents"] if e.get("cat") == "kernel"]
    assert any(k.startswith("ampere_") for k in kernels) and not any("sm90" in k for k in kernels)
    r = CliRunner().invoke(main, ["replay", str(SHARED / rel), "--system", "B200", "--json", "-q"])
    assert r.exit_code == 0, r.output
    rt = json.loads(r.output)["retiming"]
    assert rt["from"] == "A100" and rt["to"] == "B200"
    assert "kernel names" in rt["source_detected"] and "ampere" in rt["source_detected"]
    assert rt["share_of_device_time"]["kept as measured"] < 0.05
    # B200's data sheet is well above A100's on both rates: the device time must shrink
    assert rt["device_us_retimed"] < 0.7 * rt["device_us_measured"]
    # the inferred GPU itself changes nothing, and the report says so
    r = CliRunner().invoke(main, ["replay", str(SHARED / rel), "--system", "A100", "--json", "-q"])
    assert r.exit_code == 0 and "measured on" in json.loads(r.output)["retiming"]["note"]


def test_presets_cite_their_data_sheets():
    raw = json.loads(PRESETS.read_text())
    for name in ("V100", "A100", "H100", "MI210", "MI250", "MI300X"):
        assert "data sheet" in raw[name]["source"] or "whitepaper" in raw[name]["source"]
    assert raw["V100"]["hbm_gbps"] == 900.0 and raw["V100"]["peak_tflops"]["fp16"] == 125.0


# ---- consistent reports ------------------------------------------------------------------------------

@functools.cache
def gpu_replay(rel: str):
    p = SHARED / rel
    files = sorted(p.glob("*.json.gz")) if p.is_dir() else [p]
    return replay_trace(load_trace(files).trace, memory=False)


@pytest.mark.parametrize("rel", GPU_TRACES)
def test_critical_path_within_the_replayed_span(rel):
    res = gpu_replay(rel)
    cp = res.critical_path()
    js = res.to_json()
    assert cp["length_us"] <= js["span_us"] * (1 + 1e-9) + 1e-6
    assert sum(cp["by_class_us"].values()) == pytest.approx(cp["length_us"], rel=1e-6, abs=1e-3)


def test_measured_only_when_the_trace_measured(tmp_module):
    out, _ = synth_dir(tmp_module)
    code, text, err = run("replay", str(out), "-q")
    assert code == 0 and "measured" not in text, text
    rel = "kineto/hta_fwdbwd_1rank/rank0.json.gz"
    steps = [e for e in raw_json(SHARED / rel)["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    assert steps
    text = gpu_replay("kineto/hta_fwdbwd_1rank").summary_text()
    assert "measured" in text


def test_plot_of_a_multi_step_trace_shows_one_step(tmp_path):
    rel = "kineto/hta_fwdbwd_1rank"
    steps = sorted({e["name"] for e in raw_json(SHARED / rel / "rank0.json.gz")["traceEvents"]
                    if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"})
    assert len(steps) >= 2
    res = gpu_replay(rel)
    part = res.step_breakdown(0)
    assert part["step"] in steps
    rr = res.ranks[0]
    # one step, not the whole span
    assert part["span_us"] < rr.span_us / (len(steps) - 1)
    assert part["span_us"] == pytest.approx(rr.steps_us[-1], rel=0.05)
    assert part["compute_us"] + part["comm_us"] - part["overlap_us"] + part["idle_us"] == pytest.approx(
        part["span_us"], rel=1e-6)
    png = res.plot(tmp_path / "p.png")
    assert png.stat().st_size > 1000
