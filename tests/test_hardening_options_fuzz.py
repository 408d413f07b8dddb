"""Defects the options fuzzer (tests/fuzz/options.py) found, one test per class: each bad option now
exits 2 at once with one ``ettools: error:`` line naming it, and leaves nothing behind."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ettools.cli import main

REPO = Path(__file__).resolve().parents[1]
KINETO = REPO / "sample_traces/single/rank0.kineto.json.gz"
TRIOSIM = REPO.parent / "shared/traces/triosim/vgg13_h100_bs128"
SYNTH = ["synth", "--model", "gpt3-1.3b", "--dim", "L=1", "--seq", "128"]
SERVE = ["serve", "--model", "gpt3-1.3b", "--dim", "L=2", "--rate", "2", "--duration", "1", "--timing", "roofline"]
SEARCH = ["search", "--model", "gpt3-1.3b", "--dim", "L=2", "--gpus", "1", "--batch", "1", "--seq", "128",
          "--no-cache", "--workers", "1", "--timing", "roofline", "--zero", "0", "--recompute", "0",
          "--micro-batch", "1"]


def _one_line_exit_2(args: list[str], named: str, tmp_path: Path, limit_s: float = 10.0) -> None:
    """Run ``args`` in ``tmp_path``: exit 2, one stderr line naming ``named``, quickly, no files."""
    t0 = time.perf_counter()
    with contextlib.chdir(tmp_path):  # relative outputs land where they are looked for
        r = CliRunner().invoke(main, [*args, "-q"])
    left = [p for p in tmp_path.rglob("*") if p.name != "r.jsonl"]
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ettools: error:") and named in lines[0], r.stderr
    assert time.perf_counter() - t0 < limit_s
    assert not left, left


@pytest.mark.parametrize("args,named", [
    ([*SYNTH, "--tp", str(2**63), "-o", "out"], "--tp"),               # was OverflowError
    ([*SYNTH, "--dp", str(2**64), "-o", "out"], "--dp"),
    ([*SYNTH, "--dp", "2048", "--tp", "1024", "-o", "out"], "ranks"),  # each degree in range, the world not
    ([*SYNTH, "--vpp", str(10**30), "--schedule", "interleaved", "-o", "out"], "--vpp"),
    ([*SYNTH, "--batch", "65536", "-o", "out"], "micro-batches"),      # ran > 15 s, GBs for 2^20
    ([*SEARCH[:6], str(2**64), *SEARCH[7:]], "--gpus"),
    ([*SEARCH[:8], str(10**30), *SEARCH[9:]], "--batch"),
    ([*SEARCH[:10], "-1", *SEARCH[11:]], "--seq"),
])
def test_parallel_degrees_and_sizes_are_range_checked(tmp_path, args, named):
    _one_line_exit_2(args, named, tmp_path)


@pytest.mark.skipif(not TRIOSIM.exists(), reason="shared TrioSim trace not present")
@pytest.mark.parametrize("args,named", [
    (["--dp", "2", "--batch", str(2**64)], "--batch"),                 # was OverflowError in rescale
    (["--dp", "2", "--tp", str(2**64)], "--tp"),                       # was OverflowError in scale_tensors
    (["--dp", str(2**63)], "--dp"),                                    # ran past any limit
    (["--dp", "2048", "--tp", "1024"], "ranks"),
])
def test_scale_numbers_are_range_checked(tmp_path, args, named):
    _one_line_exit_2(["scale", str(TRIOSIM), *args, "-o", "out"], named, tmp_path)


def test_search_workers_are_bounded(tmp_path):
    """A process pool forks all its workers at once: --workers 10^30 was a fork bomb."""
    _one_line_exit_2([*SEARCH[:-1], "1", "--workers", str(10**30)], "--workers", tmp_path)


@pytest.mark.parametrize("timing", ["abc", "nan", str(2**63)])
def test_search_unknown_timing_is_refused(tmp_path, timing):
    """It reached the replay as a KeyError."""
    _one_line_exit_2([*SEARCH, "--timing", timing], "unknown timing", tmp_path)


@pytest.mark.parametrize("command", [["replay", str(KINETO)], SERVE])
@pytest.mark.parametrize("plot", ["out.json", "new.md", "x", "deep/out.html"])
def test_plot_path_matplotlib_cannot_write_is_refused_first(tmp_path, command, plot):
    """matplotlib picks the format by the suffix: a ValueError after the whole run, before."""
    pytest.importorskip("matplotlib")
    _one_line_exit_2([*command, "--plot", plot], "--plot", tmp_path)


@pytest.mark.parametrize("args,named", [
    (["--prompt-tokens", str(2**64)], "bad token count"),              # was OverflowError in numpy
    (["--output-tokens", str(10**30)], "bad token count"),
    (["--prompt-tokens", "exp:1e30"], "bad token count"),              # drew ~1e30 tokens: ran forever
    (["--output-tokens", "2-9999999"], "bad token count"),             # millions of decode iterations
    (["--prompt-tokens", "99999999"], "KV blocks"),                    # never admitted: endless loop
    (["--kv-tokens", "16"], "KV blocks"),                              # the same, from a tiny cache
])
def test_serve_token_counts_and_kv_room_are_checked(tmp_path, args, named):
    _one_line_exit_2([*SERVE, *args], named, tmp_path)


def test_serve_request_that_fits_the_kv_cache_still_runs(tmp_path):
    """The KV check refuses only what can never run: 16 + 4 tokens in a 64-token cache do."""
    r = CliRunner().invoke(main, [*SERVE, "--prompt-tokens", "16", "--output-tokens", "4", "--kv-tokens", "64",
                                  "--block-tokens", "16", "-q"])
    assert r.exit_code == 0, r.output


def test_requests_file_with_huge_token_count_is_refused(tmp_path):
    """The JSONL reader took 2^64 tokens into an int64 array (OverflowError)."""
    reqs = tmp_path / "r.jsonl"
    reqs.write_text(f'{{"arrival": 0, "prompt_tokens": {2**64}, "output_tokens": 4}}\n')
    _one_line_exit_2(["serve", "--model", "gpt3-1.3b", "--requests", str(reqs)], "line 1", tmp_path)


@pytest.mark.parametrize("axis,value", [
    ("--tp", str(2**64)), ("--pp", str(10**30)), ("--cp", str(2**63)),   # were ZeroDivisionError
    ("--bucket-mb", "inf"), ("--bucket-mb", "1e308"), ("--bucket-mb", "nan"),  # were OverflowError
    ("--vpp", "99999999"), ("--micro-batch", str(2**64)),
])
def test_search_axis_values_are_range_checked(tmp_path, axis, value):
    args = [a for a in SEARCH]
    if axis in args:
        args[args.index(axis) + 1] = value
    else:
        args += [axis, value]
    _one_line_exit_2(args, axis, tmp_path)


@pytest.mark.skipif(not TRIOSIM.exists(), reason="shared TrioSim trace not present")
@pytest.mark.parametrize("dim", [f"batch={2**64}", "batch=0", "batch=4:0", f"batch={10**30}:4"])
def test_scale_dimension_sizes_are_range_checked(tmp_path, dim):
    """scale parses its own NAME=NEW / NAME=OLD:NEW: 2^64 reached an int64 array (OverflowError)."""
    _one_line_exit_2(["scale", str(TRIOSIM), "--dim", dim, "-o", "out"], "--dim", tmp_path)
