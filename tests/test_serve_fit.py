"""``ettools calibrate --serving`` and ``ettools serve --cost`` (issue 17) on real serving traces.

Iteration shapes and device times are read here from the raw gzip JSON (the ``execute_…`` span's
name, the kernels after it), not from ettools' loaders; the fit must reproduce its own iterations,
and the cross-engine prediction (SGLang Qwen3-8B → vLLM GPT-OSS-20B and back) must be reported
with the error it really has (the two engines' kernels differ; no bound is claimed).
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from ettools.cli import main

ROOT = Path(__file__).resolve().parents[2] / "shared" / "traces" / "inference"
SGL = [ROOT / "sglang_qwen3_8b_mi300x" / f for f in ("decode_bs32.json.gz", "prefill_extend_bs15.json.gz")]
VLL = [ROOT / "vllm_mi300x_cudagraphs" / f for f in ("decode_full_graph_execution.json.gz",
                                                     "prefilldecode_piecewise_graph_execution.json.gz")]
# published dimensions: Qwen3-8B (36 layers, 4096 hidden, 32 q / 8 KV heads of 128, FFN 12288,
# vocab 151936) on the llama template; GPT-OSS-20B (24 layers, 2880 hidden, 64 q / 8 KV heads of
# 64, 32 experts of 2880 top-4, vocab 201088) on the moe template
QWEN = ["--model", "llama3-8b", "--dim", "L=36", "--dim", "F=12288", "--dim", "V=151936"]
GPTOSS = ["--model", "moe", *[x for d in ("L=24", "H=2880", "NH=64", "KV=8", "HD=64", "F=2880", "E=32", "K=4",
                                          "V=201088") for x in ("--dim", d)]]

pytestmark = pytest.mark.skipif(not all(p.exists() for p in SGL + VLL), reason="shared inference traces missing")


def _raw_iteration(path: Path) -> dict:
    """The execute span's shape and the device time of the kernels from it on, from the raw file."""
    ev = json.load(gzip.open(path))["traceEvents"]
    span = next(e for e in ev if e.get("ph") == "X" and str(e.get("name", "")).startswith("execute_"))
    m = re.search(r"execute_(\d+)_context_\d+\(sq\d+sk\d+sqsq(\d+)sqsk(\d+)\)_generation_\d+\(sq\d+sk(\d+)",
                  span["name"])
    tokens, sqsq, sqsk, dctx = (int(x) for x in m.groups())
    k = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev
               if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e["ts"] >= span["ts"])
    busy, end = 0.0, -1e300
    for s, e in k:  # union of the kernel intervals
        busy += max(0.0, e - max(s, end))
        end = max(end, e)
    return {"tokens": tokens, "pairs": sqsk - sqsq / 2, "context": dctx, "device_us": busy}


def _calibrate(paths, model, out, *extra):
    res = CliRunner().invoke(main, ["calibrate", "--serving", *map(str, paths), *model, "-o", str(out), *extra])
    assert res.exit_code == 0, res.output
    return res.output


def test_fit_reproduces_its_own_iterations(tmp_path):
    out = tmp_path / "sglang.json"
    _calibrate(SGL, QWEN, out)
    c = json.loads(out.read_text())["coef"]
    for p in SGL:
        r = _raw_iteration(p)
        t = c["a_us"] + c["b_us_per_token"] * r["tokens"] + c["c_us_per_context_token"] * r["context"] \
            + c["d_us_per_pair"] * r["pairs"]
        assert t == pytest.approx(r["device_us"], rel=0.01), p.name
    # decode is cheap per token and prefill is not: both pieces were fitted, non-negative
    assert c["a_us"] > 0 and c["b_us_per_token"] > 0 and c["c_us_per_context_token"] > 0 and c["d_us_per_pair"] > 0


def test_cross_engine_prediction_error_is_reported(tmp_path):
    sg, vl = tmp_path / "sglang.json", tmp_path / "vllm.json"
    _calibrate(SGL, QWEN, sg)
    text = _calibrate(VLL, GPTOSS, vl, "--predict", str(sg))
    back = _calibrate(SGL, QWEN, tmp_path / "again.json", "--predict", str(vl))
    for paths, output in ((VLL, text), (SGL, back)):
        block = output.split("predicted by", 1)[1].splitlines()[1:]
        assert len(block) == len(paths)
        for p, line in zip(paths, block):
            raw = _raw_iteration(p)
            meas, pred, err = re.search(r"measured\s+([\d.]+) ms, predicted\s+([\d.]+) ms \(([-+\d.]+) %\)",
                                        line).groups()
            assert float(meas) == pytest.approx(raw["device_us"] / 1e3, abs=2e-3)
            assert float(err) == pytest.approx(100 * (float(pred) * 1e3 - raw["device_us"]) / raw["device_us"],
                                               abs=0.1)


def test_serve_with_fit_uses_no_replays_and_its_decode_time(tmp_path):
    fit = tmp_path / "sglang.json"
    _calibrate(SGL, QWEN, fit)
    c = json.loads(fit.read_text())["coef"]
    h = json.loads(fit.read_text())["host"]  # the GPU's wait for the host (tests/test_serve_host.py checks it)
    req = tmp_path / "one.jsonl"
    req.write_text(json.dumps({"arrival": 0.0, "prompt_tokens": 1000, "output_tokens": 101}) + "\n")
    res = CliRunner().invoke(main, ["serve", *QWEN, "--system", "MI300X", "--requests", str(req), "--cost", str(fit),
                                    "--json"])
    assert res.exit_code == 0, res.output
    j = json.loads(res.output)
    assert j["engine"]["replays"] == 0
    # one sequence decoding alone: each step is a + b + c·(its context) + the host overhead of one
    # sequence, contexts 1001 … 1100
    mean_ctx = 1000 + (1 + 100) / 2
    tpot = (c["a_us"] + c["b_us_per_token"] + c["c_us_per_context_token"] * mean_ctx
            + h["const_us"] + h["per_seq_us"]) / 1e3
    assert j["tpot_ms"]["p50"] == pytest.approx(tpot, rel=0.02)
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    res = CliRunner().invoke(main, ["serve", *QWEN, "--requests", str(req), "--cost", str(bad)])
    assert res.exit_code == 2 and "bad.json" in res.output
