"""``ettools serve`` options of issue 24: storage dtypes, eager mode, shared prefixes, mixed GPU pools."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from ettools.cli import main
from ettools.replay.serve import simulate_serving, synthetic

BASE = ["serve", "--model", "llama3-8b", "--dim", "L=4", "--rate", "2", "--duration", "10"]


@pytest.mark.parametrize("args,named", [
    (["--kv-dtype", "int3"], "--kv-dtype"),
    (["--weight-dtype", "bf17"], "--weight-dtype"),
    (["--shared-prefix", "-1"], "--shared-prefix"),
    (["--shared-prefix", str(1 << 31)], "--shared-prefix"),
    (["--prefix-groups", "0"], "--prefix-groups"),
    (["--prefill-tp", "0", "--gpus", "2", "--prefill-gpus", "1"], "--prefill-tp"),
    (["--prefill-system", "A100"], "--prefill-gpus"),  # a prefill pool option without a prefill pool
    (["--no-cuda-graphs", "--search"], "--no-cuda-graphs"),  # not modelled there: said, not ignored
])
def test_bad_new_serve_options_exit_2_with_one_line(args, named):
    t0 = time.perf_counter()
    r = CliRunner().invoke(main, [*BASE, *args])
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and named in lines[0], r.output
    assert time.perf_counter() - t0 < 5.0


def test_json_names_the_engine_storage_and_eager_floor():
    r = CliRunner().invoke(main, [*BASE, "--kv-dtype", "fp8", "--weight-dtype", "int4", "--no-cuda-graphs",
                                  "--json"])
    assert r.exit_code == 0, r.output
    e = json.loads(r.output)["engine"]
    assert (e["kv_dtype"], e["weight_dtype"], e["cuda_graphs"]) == ("fp8", "int4", False)
    assert e["eager_launch_us"] > 0 and "not counted" in e["eager_launch_source"]
    text = CliRunner().invoke(main, [*BASE, "--no-cuda-graphs"]).output
    assert "eager (no CUDA graphs)" in text


def test_shared_prefix_from_the_command_line():
    on = json.loads(CliRunner().invoke(main, [*BASE, "--shared-prefix", "512", "--json"]).output)
    off = json.loads(CliRunner().invoke(main, [*BASE, "--shared-prefix", "512", "--no-prefix-caching", "--json"]).output)
    assert on["prefix_cache"]["hit_tokens"] == (on["requests"] - 1) * 512  # one group: only the first prefills it
    assert off["prefix_cache"]["hit_tokens"] == 0
    assert on["ttft_ms"]["mean"] < off["ttft_ms"]["mean"]


def test_a_slower_prefill_pool_slows_first_tokens_only():
    w = synthetic(2.0, None, 20.0, "2048", "64", seed=5)
    kw = {"gpus": 2, "prefill_gpus": 1, "dims": {"L": 4}}
    same = simulate_serving("llama3-8b", w, system="H100", **kw).to_json()
    a100 = simulate_serving("llama3-8b", w, system="H100", prefill_system="A100", **kw).to_json()
    assert "prefill" not in same["engine"] and "A100" in a100["engine"]["prefill"]["system"]
    # A100's prefill (312 vs 989 dense TFLOP/s) is slower; decode runs on the same H100 pool
    assert a100["ttft_ms"]["p50"] > 1.5 * same["ttft_ms"]["p50"]
    assert a100["tpot_ms"]["p50"] == pytest.approx(same["tpot_ms"]["p50"], rel=0.02)
    tp2 = simulate_serving("llama3-8b", w, system="H100", **{**kw, "gpus": 3, "prefill_gpus": 2}, prefill_tp=2)
    assert tp2.to_json()["engine"]["prefill"]["tp"] == 2
