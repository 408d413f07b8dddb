"""Emulated capture (``ettools capture --emulate GPU``): the project's own sample GPT scripts, run
with no device on an emulated H100, against the real gloo captures of the same scripts bundled in
``sample_traces/`` (independent data: those ran for real, with the profiler)."""

from __future__ import annotations

import gzip
import importlib.util
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson
import pytest

if importlib.util.find_spec("torch") is None:  # torch runs in the child processes only: not imported here
    pytest.skip("torch is not installed", allow_module_level=True)
if not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
    pytest.skip("emulated capture builds its device library with a C++ compiler; none here", allow_module_level=True)

from ettools.formats import load_trace  # noqa: E402
from ettools.graph import COMM_NODE_TYPES, CollectiveType  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
BERT_H100 = REPO.parent / "shared" / "traces" / "hardware_pairs" / "bert_small" / "h100.json.gz"
PLANS = ["single", "ddp", "tp_sp", "pp_1f1b", "fsdp", "moe_ep"]
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm")


def _capture(args: list[str], out: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ettools", "capture", "-o", str(out), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """Every capture of this module, two at a time (each is a few seconds of CPU, mostly ``import
    torch``): each plan's sample script on an emulated H100, the probe script on H100 and MI300X,
    the out-of-memory script, the MoE sample."""
    base = tmp_path_factory.mktemp("emulated")
    (base / "probe.py").write_text(GPU_SCRIPT)
    (base / "oom.py").write_text(OOM_SCRIPT)
    jobs = {plan: ["--emulate", "H100", "--steps", "2", "--", sys.executable, "-m", "sample_traces.train", plan,
                   "--steps", "2"] for plan in PLANS}
    jobs["probe-MI300X"] = ["--emulate", "MI300X", "--steps", "1", "--", sys.executable, str(base / "probe.py")]
    jobs["oom"] = ["--emulate", "H100", "--gpu-memory", "1", "--", sys.executable, str(base / "oom.py")]
    (base / "ddp_cuda.py").write_text(DDP_CUDA_SCRIPT)
    if BERT_H100.exists() and importlib.util.find_spec("transformers") is not None:
        jobs["bert_small"] = ["--emulate", "H100", "--steps", "2", "--", sys.executable, "-m", "sample_traces.hf_run",
                              str(REPO / "sample_traces" / "hf_configs" / "bert_small"), "--batch", "1", "--length",
                              "141", "--iters", "2"]
    jobs["torchrun_ddp"] = ["--emulate", "H100", "--", "torchrun", "--nproc-per-node", "2", str(base / "ddp_cuda.py")]
    if importlib.util.find_spec("transformers") is not None:
        (base / "generate.py").write_text(GENERATE_SCRIPT)
        jobs["generate"] = ["--emulate", "H100", "--steps", "2", "--", sys.executable, str(base / "generate.py")]
    (base / "compiled.py").write_text(COMPILE_SCRIPT)
    jobs["compiled"] = ["--emulate", "H100", "--", sys.executable, str(base / "compiled.py")]
    (base / "mask.py").write_text(MASK_SCRIPT)
    jobs["mask"] = ["--emulate", "H100", "--", sys.executable, str(base / "mask.py")]
    (base / "fsdp1.py").write_text(FSDP1_SCRIPT)
    jobs["fsdp1"] = ["--emulate", "H100", "--", "torchrun", "--nproc-per-node", "2", str(base / "fsdp1.py")]
    (base / "graphs.py").write_text(GRAPH_SCRIPT)
    jobs["graphs"] = ["--emulate", "H100", "--", sys.executable, str(base / "graphs.py")]

    def one(item: tuple[str, list[str]]) -> tuple[str, tuple[Path, subprocess.CompletedProcess]]:
        name, args = item
        return name, (base / name, _capture(args, base / name))

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, jobs.items()))


def _cpu_ops(path: Path) -> list[dict]:
    """The main thread's ops of the last ProfilerStep of one Kineto file, in issue order."""
    d = orjson.loads(gzip.open(path).read())
    ev = [e for e in d["traceEvents"] if e.get("ph") == "X"]
    step = [e for e in ev if e["name"].startswith("ProfilerStep")][-1]
    b, e_ = step["ts"], step["ts"] + step["dur"]
    ops = [e for e in ev if e.get("cat") == "cpu_op" and b <= e["ts"] <= e_ and e["tid"] == step["tid"]]
    return sorted(ops, key=lambda e: (e["ts"], -e["dur"]))


def _comms(folder: Path, rank: int) -> list[tuple[int, int, int]]:
    g = load_trace([folder]).trace.graphs[rank]
    rows = np.flatnonzero(np.isin(g.type, [int(t) for t in COMM_NODE_TYPES]))
    return [(int(g.type[r]), int(g.comm_type[r]), int(g.comm_bytes[r])) for r in rows]


@pytest.mark.parametrize("plan", PLANS)
def test_emulated_plan_matches_real_capture(plan: str, runs: dict) -> None:
    """Same matmuls (op and operand shapes) in the same order, and the same collectives and
    send/recv (type, Chakra bytes) in the same order, on every rank, as the real capture."""
    out, res = runs[plan]
    assert res.returncode == 0, res.stderr[-2000:]
    real_files = sorted((SAMPLES / plan).glob("rank*.kineto.json.gz"))
    emu_files = sorted(out.glob("rank*.kineto.json.gz"))
    assert [f.name for f in emu_files] == [f.name for f in real_files]
    for real, emu in zip(real_files, emu_files):
        want = [(e["name"], e["args"]["Input Dims"][:2]) for e in _cpu_ops(real) if e["name"] in MATMULS]
        got = [(e["name"], e["args"]["Input Dims"][:2]) for e in _cpu_ops(emu) if e["name"] in MATMULS]
        assert want and got == want
    for rank in range(len(real_files)):
        want = _comms(SAMPLES / plan, rank)
        assert _comms(out, rank) == want
        if plan != "single":
            assert want  # the plan communicates: the comparison is not empty


def test_emulated_trace_says_its_times_are_modelled(runs: dict) -> None:
    """The header names the emulated GPU and modelled durations; replay does not call them measured."""
    out, _ = runs["tp_sp"]
    d = orjson.loads(gzip.open(out / "rank0.kineto.json.gz").read())
    assert d["ettools"]["emulated"] is True and d["ettools"]["durations"] == "modelled"
    assert d["deviceProperties"][0]["name"].startswith("NVIDIA H100")
    from click.testing import CliRunner

    from ettools.cli import main

    rep = CliRunner().invoke(main, ["replay", str(out), "--json"])  # in this process: no second import
    assert rep.exit_code == 0, rep.stderr
    j = orjson.loads(rep.stdout)
    assert j["durations"] == "modelled" and j["emulated_gpu"] == "H100"
    assert "measured_step_time_us" not in j and "error_pct" not in j
    info = CliRunner().invoke(main, ["info", str(out), "--json"])
    assert orjson.loads(info.stdout)["durations"] == "modelled"


GPU_SCRIPT = """
import torch
p = torch.cuda.get_device_properties(0)
x = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
w = torch.nn.Linear(128, 256, device="cuda", dtype=torch.bfloat16)
y = torch.nn.functional.scaled_dot_product_attention(*(torch.randn(2, 4, 64, 32, device="cuda",
                                                                   dtype=torch.bfloat16),) * 3, is_causal=True)
# multi-head latent attention (DeepSeek-V3): query/key heads of 48, value heads of 32
qk = torch.randn(2, 4, 64, 48, device="cuda", dtype=torch.bfloat16)
z = torch.nn.functional.scaled_dot_product_attention(qk, qk, torch.randn(2, 4, 64, 32, device="cuda",
                                                                         dtype=torch.bfloat16), is_causal=True)
print(torch.cuda.is_available(), p.name, p.multi_processor_count, p.total_memory, (p.major, p.minor),
      w(x).device, y.shape, torch.cuda.memory_allocated() > 0, tuple(z.shape))
"""


def test_torch_cuda_answers_as_the_emulated_gpu(runs: dict) -> None:
    """torch.cuda reports the preset's GPU (MI300X: its name and 304 compute units, not the default
    H100's); tensors live on cuda; memory is accounted."""
    name, sms = "AMD Instinct MI300X", 304
    _, res = runs["probe-MI300X"]
    assert res.returncode == 0, res.stderr[-2000:]
    line = res.stdout.strip().splitlines()[-1]
    assert line.startswith(f"True {name}") and f" {sms} " in line
    assert "cuda:0 torch.Size([2, 4, 64, 32]) True" in line
    # attention's output has the value's head size (the definition softmax(QK^T)V), not the query's
    assert line.endswith(" (2, 4, 64, 32)")


OOM_SCRIPT = """
import torch
m = torch.nn.Linear(8192, 8192, device="cuda")  # 256 MiB of fp32 weights
opt = torch.optim.AdamW(m.parameters())
for _ in range(3):
    m(torch.randn(16, 8192, device="cuda")).sum().backward()
    opt.step()
"""


def test_allocation_past_emulated_memory_reports_oom(runs: dict) -> None:
    """A 1 GiB GPU cannot hold weights + grads + two Adam moments of 256 MiB each: the capture says
    OUT OF MEMORY in one line naming the program line, exit 1, and writes nothing."""
    out, res = runs["oom"]
    assert res.returncode == 1
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("ettools capture:")]
    assert len(lines) == 1 and "OUT OF MEMORY" in lines[0] and "oom.py:" in lines[0]
    assert not out.exists() or not list(out.glob("*.json.gz"))


MASK_SCRIPT = """
import torch
x = torch.randn(1024, device="cuda")
kept = x[x > 0]  # how many: only the device knows
print(kept.shape)
"""


def test_value_dependent_shape_is_named(runs: dict) -> None:
    """An op whose output shape depends on the values of a device tensor stops the capture with
    one line naming the op and the program line."""
    _, res = runs["mask"]
    assert res.returncode != 0
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("ettools capture:")]
    assert len(lines) == 1, res.stderr[-2000:]
    assert "depends on tensor values" in lines[0] and "mask.py:4" in lines[0]


GRAPH_SCRIPT = """
import torch
m = torch.nn.Linear(64, 64).cuda()
for _ in range(2):
    m(torch.randn(8, 64, device="cuda"))
graph = torch.cuda.CUDAGraph()
"""


def test_cuda_graphs_are_refused_by_name_after_the_steps_before(runs: dict) -> None:
    """CUDA graph capture is not emulated: creating one stops the program with a line naming the
    call and its program line (the CPU build's placeholder said "dummy base class", and the capture
    exited 0); the steps before it are written, as a real capture writes them, and the exit status
    is the program's."""
    out, res = runs["graphs"]
    assert res.returncode == 1
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("ettools capture:")]
    assert any("CUDAGraph" in ln and "not emulated" in ln and "graphs.py:6" in ln and "warning" not in ln
               for ln in lines), lines
    assert lines[-1].endswith("exited with status 1 after its captured steps")
    assert (out / "rank0.kineto.json.gz").exists()


COMPILE_SCRIPT = """
import torch
m = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).cuda()
step = torch.compile(m)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(3):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    step(torch.randn(32, 256, device="cuda")).pow(2).mean().backward()
    end.record()
    torch.cuda.synchronize()
    print("step ms", start.elapsed_time(end), "samples/s", 32 / (start.elapsed_time(end) / 1e3), flush=True)
    opt.step()
"""


def test_torch_compile_is_said_to_run_eagerly(runs: dict) -> None:
    """The fake device has no compiler: a torch.compile'd model records its eager ops (its GELU is
    an aten op, not a generated kernel), and both the capture's output and the trace header say
    that one compiled region was recorded that way."""
    out, res = runs["compiled"]
    assert res.returncode == 0, res.stderr[-2000:]
    assert "called torch.compile 1 time(s)" in res.stderr and "eager" in res.stderr
    d = orjson.loads(gzip.open(out / "rank0.kineto.json.gz").read())
    assert d["ettools"]["compiled_regions"] == 1
    assert any(e["name"] == "aten::gelu" for e in _cpu_ops(out / "rank0.kineto.json.gz"))


def test_cuda_event_timing_is_answered_nan_and_said(runs: dict) -> None:
    """A script that logs its step time with CUDA events goes on (it used to stop with an error):
    nothing runs to time, so ``elapsed_time`` is NaN (never a made-up figure), and the capture's
    output and trace header count the timings asked."""
    out, res = runs["compiled"]
    assert res.returncode == 0, res.stderr[-2000:]
    assert "step ms nan samples/s nan" in res.stdout
    assert "CUDA event timing(s) (Event.elapsed_time) were answered NaN" in res.stderr
    d = orjson.loads(gzip.open(out / "rank0.kineto.json.gz").read())
    assert d["ettools"]["event_timings"] >= 2  # two per logged step, at least one step logged


GENERATE_SCRIPT = """
import torch, transformers
config = transformers.LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512)
model = transformers.LlamaForCausalLM(config).to("cuda", dtype=torch.bfloat16).eval()
ids = torch.randint(0, 1024, (2, 32), device="cuda")
model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False, pad_token_id=0)
"""


def test_generation_loop_stops_after_the_captured_step(runs: dict) -> None:
    """``generate`` stops when a device value says every sequence is done; emulation answers such
    reads with 0, so the loop alone would never end. A program with no optimizer steps by its
    top-level module calls and is stopped when the call after the last asked-for step begins:
    step 2 is the first decode step, whose attention reads the 32 prompt positions + 1 new."""
    out, res = runs["generate"]
    assert res.returncode == 0, res.stderr[-2000:]
    attn = [e for e in _cpu_ops(out / "rank0.kineto.json.gz") if "attention" in e["name"]]
    assert len(attn) == 2  # one per layer
    for e in attn:
        q, k = e["args"]["Input Dims"][:2]
        assert q[-2] == 1 and k[-2] == 32 + 1


DDP_CUDA_SCRIPT = """
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
model = DDP(torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]).cuda(),
            device_ids=[int(os.environ["LOCAL_RANK"])], bucket_cap_mb=4)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(torch.randn(64, 1024, device="cuda")).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
"""
ASTRASIM = REPO.parent / "shared" / "tools" / "astrasim"

FSDP1_SCRIPT = """
import torch, torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
dist.init_process_group("nccl")
torch.cuda.set_device(dist.get_rank())
m = FSDP(torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda())
opt = torch.optim.AdamW(m.parameters())
for _ in range(3):
    m(torch.randn(64, 512, device="cuda")).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
"""


def test_fsdp1_shards_its_flat_parameter(runs: dict) -> None:
    """FullyShardedDataParallel (FSDP1, still the common API) on 2 emulated ranks: one flat fp32
    parameter of (512 x 2048 + 2048) + (2048 x 512 + 512) elements, all-gathered once per step
    (the root is not resharded after its forward) from each rank's half and reduce-scattered once
    from the whole. It used to stop at its post-backward hook: ``Tensor.record_stream`` with an
    emulated stream ("unknown parameter type")."""
    out, res = runs["fsdp1"]
    assert res.returncode == 0, res.stderr[-2000:]
    flat = ((512 * 2048 + 2048) + (2048 * 512 + 512)) * 4
    for r in (0, 1):
        assert sorted(c[1:] for c in _comms(out, r)) == sorted([(int(CollectiveType.ALL_GATHER), flat // 2),
                                                                 (int(CollectiveType.REDUCE_SCATTER), flat)])


def test_torchrun_nccl_ddp_runs_in_astrasim(runs: dict, tmp_path: Path) -> None:
    """An unmodified torchrun + NCCL + DDP script on 2 emulated H100s: each rank all-reduces its
    4 MiB gradient buckets of 4 x (1024 x 1024 + 1024) fp32 parameters (two buckets at
    bucket_cap_mb=4: the parameter bytes, summed), as NCCL collectives over both ranks; the Chakra
    conversion runs in the real ASTRA-sim with every rank finished, agreeing with ettools replay."""
    import re

    out, res = runs["torchrun_ddp"]
    assert res.returncode == 0, res.stderr[-2000:]
    tr = load_trace([out]).trace
    assert sorted(tr.ranks) == [0, 1]
    params = 4 * (1024 * 1024 + 1024) * 4
    for r in (0, 1):
        comms = _comms(out, r)
        assert comms and all(c[1] == 0 for c in comms)  # ALL_REDUCE
        assert sum(c[2] for c in comms) == params
    if not (ASTRASIM / "run").exists():
        pytest.skip("ASTRA-sim not in ../shared/tools/astrasim")
    from ettools.convert import convert_trace
    from ettools.replay import replay_trace

    ch = tmp_path / "chakra"
    convert_trace(load_trace([out]), ch, "chakra")
    net, system = ASTRASIM / "configs" / "Ring_2npus.yml", ASTRASIM / "configs" / "sys_ring_1d.json"
    sim = subprocess.run([str(ASTRASIM / "run"), str(ch), "trace", str(net), str(system)], capture_output=True,
                         text=True, timeout=120)
    cycles = [int(x) for x in re.findall(r"sys\[\d+\] finished, (\d+) cycles", sim.stdout)]
    assert len(cycles) == 2
    ours = replay_trace(load_trace([ch]).trace, network=net, collectives=system).step_time_us
    assert ours == pytest.approx(max(cycles) / 1000.0, rel=0.02)


FOREVER_SCRIPT = """
import time, torch
x = torch.randn(8, device="cuda")
print("running", flush=True)
while True:
    x = x * 2
    time.sleep(0.01)
"""


def test_sigterm_ends_the_emulated_program_and_writes_nothing(tmp_path: Path) -> None:
    """SIGTERM to ``ettools capture --emulate``: exit 143 with one line, the program it runs (in
    its own session) ended within 2 s, no output folder."""
    import signal
    import time

    script = tmp_path / "forever.py"
    script.write_text(FOREVER_SCRIPT)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "ettools", "capture", "--emulate", "H100", "-o", str(out), "--",
                             sys.executable, str(script)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "running"  # the emulated program is up
    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 143 and time.monotonic() - t0 < 3.0
    assert err.strip().splitlines()[-1] == "ettools: error: terminated"
    left = subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True).stdout.split()
    assert not left
    assert not out.exists()


def test_hf_model_from_config_predicts_the_real_h100_trace(runs: dict) -> None:
    """bert-small (config from its model card, plain forward loop) emulated on an H100 against the
    real TraceLens H100 trace of the same model and input (1 x 141 tokens): the same number of GEMM
    and attention kernels, and the step's device time predicted within 15 % (the bench's figure)."""
    if "bert_small" not in runs:
        pytest.skip("transformers or the shared hardware-pair trace is missing")
    from ettools.classify import classify

    out, res = runs["bert_small"]
    assert res.returncode == 0, res.stderr[-2000:]

    def kernels(path: Path) -> tuple[dict[str, int], float]:
        d = orjson.loads(gzip.open(path).read())
        ev = [e for e in d["traceEvents"] if e.get("ph") == "X"]
        st = [e for e in ev if str(e.get("name", "")).startswith("ProfilerStep")][-1]
        ks = [e for e in ev if e.get("cat") == "kernel" and st["ts"] <= e["ts"] <= st["ts"] + st["dur"]]
        counts: dict[str, int] = {}
        for e in ks:
            c = classify(e["name"])
            counts[c] = counts.get(c, 0) + 1
        return counts, sum(e["dur"] for e in ks)

    real, real_us = kernels(BERT_H100)
    emu, emu_us = kernels(out / "rank0.kineto.json.gz")
    assert emu["GeMM"] == real["GeMM"] and emu["Attention"] == real["Attention"]
    assert abs(emu_us - real_us) / real_us < 0.15
