"""Numbers that size memory or loops are range-checked where they enter (issue 26): each case exits
2 at once with one line naming what is wrong, and nothing is written."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ettools.cli import main

REPO = Path(__file__).resolve().parents[1]
KINETO = REPO.parent / "shared" / "traces" / "kineto" / "hta_16rank_blocking_memcpy" / "rank0.json.gz"


@pytest.mark.parametrize("args,named", [
    (["--micro-batch", "0"], "--micro-batch"),                        # was ZeroDivisionError
    (["--dim", "H=" + "1" + "0" * 30], "H = "),                       # was OverflowError
    (["--dim", "L=" + "1" + "0" * 30], "L = "),
    (["--dim", "V=" + "1" + "0" * 20], "V = "),
    (["--dim", f"H={1 << 40}"], "gpt_embedding.wte"),                # fits the option, not a tensor
    (["--dim", f"L={1 << 40}"], "module uses"),                       # was out of memory
    (["--batch", str(1 << 40), "--micro-batch", "1"], "micro-batches"),  # was killed
    (["--dp", "2", "--ranks", "0-99999999"], "--ranks"),              # ran > 100 s, 10 GB
    (["--ranks", "3-1"], "--ranks"),
])
def test_synth_numbers_checked_where_they_enter(tmp_path, args, named):
    out = tmp_path / "out"
    t0 = time.perf_counter()
    r = CliRunner().invoke(main, ["synth", "--model", "gpt3-1.3b", *args, "-o", str(out)])
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and named in lines[0], r.output
    assert time.perf_counter() - t0 < 10.0
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.skipif(not KINETO.exists(), reason="shared Kineto trace not present")
def test_step_range_beyond_any_trace_is_refused_before_reading():
    t0 = time.perf_counter()
    r = CliRunner().invoke(main, ["info", str(KINETO), "--steps", "2-99999999"])
    assert r.exit_code == 2 and "more than" in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert time.perf_counter() - t0 < 10.0


ET_ONE_RANK = REPO.parent / "shared" / "traces" / "et_kineto" / "param_resnet" / "et.json.gz"


@pytest.mark.skipif(not ET_ONE_RANK.exists(), reason="shared PyTorch ET not present")
def test_one_rank_et_without_group_record_converts(tmp_path):
    """A single-GPU PyTorch ET whose collectives name group '0' with no process_group:init record
    is valid (its group can only be the one-rank world); it was refused with exit 2."""
    import gzip
    import json

    doc = json.loads(gzip.open(ET_ONE_RANK).read())
    doc["nodes"] = [n for n in doc["nodes"] if n["name"] != "## process_group:init ##"]
    src = tmp_path / "et.json"
    src.write_text(json.dumps(doc))
    r = CliRunner().invoke(main, ["convert", str(src), "--to", "chakra", "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "out" / "comm_group.json").exists()


NCCL_KINETO = REPO.parent / "shared" / "traces" / "kineto" / "hta_nccl_2rank" / "rank0.json.gz"


def _mutated(tmp_path: Path, what: str) -> Path:
    import gzip
    import json

    doc = json.loads(gzip.open(NCCL_KINETO).read())
    for e in doc["traceEvents"]:
        a = e.get("args") if isinstance(e, dict) else None
        if not isinstance(a, dict):
            continue
        if what == "id" and "External id" in a:
            a["External id"] = 2**64 - 1
            break
        if what == "nelems":
            for k in ("In msg nelems", "Out msg nelems"):
                if k in a:
                    a[k] = 2**60
    out = tmp_path / f"{what}.json"
    out.write_text(json.dumps(doc))
    return out


@pytest.mark.skipif(not NCCL_KINETO.exists(), reason="shared Kineto trace not present")
@pytest.mark.parametrize("what,named", [("id", "'External id'"), ("nelems", "beyond 2^50 B")])
@pytest.mark.parametrize("command", [["info"], ["replay"], ["convert", "--to", "chakra", "-o", "OUT"]])
def test_huge_integers_in_a_trace_exit_2_naming_them(tmp_path, what, named, command):
    """An int arg of 2^64 - 1, an NCCL element count of 2^60: OverflowError tracebacks before."""
    src = _mutated(tmp_path, what)
    args = [str(tmp_path / "out") if a == "OUT" else a for a in command]
    r = CliRunner().invoke(main, [args[0], str(src), *args[1:]])
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and named in lines[0], r.output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.skipif(not NCCL_KINETO.exists(), reason="shared Kineto trace not present")
@pytest.mark.parametrize("command", ["info", "replay"])
def test_negative_durations_are_said_in_the_text_output(tmp_path, command):
    """Three kernels with dur -5: counted as 0 and said (only info --json listed them)."""
    import gzip
    import json

    doc = json.loads(gzip.open(NCCL_KINETO).read())
    kernels = [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("cat") == "kernel"]
    for e in kernels[:3]:
        e["dur"] = -5
    src = tmp_path / "neg.json"
    src.write_text(json.dumps(doc))
    r = CliRunner().invoke(main, [command, str(src)])
    assert r.exit_code == 0, r.output
    assert "3 event(s) with a negative duration, counted as 0" in r.output


def test_a_rewrites_step_is_not_labelled_measured(tmp_path):
    """`scale` output replays as an estimate: the source capture's step is not this plan's (it was
    printed as "measured 23.778 ms, +3.57 %" for a TP 2 rewrite of a one-rank capture)."""
    import json

    from ettools.formats import load_trace

    out = tmp_path / "tp2"
    r = CliRunner().invoke(main, ["scale", str(REPO / "sample_traces" / "single"), "--tp", "2", "-o", str(out), "-q"])
    assert r.exit_code == 0, r.output
    assert all(g.meta.get("durations") == "rewritten" for g in load_trace([out]).trace.graphs.values())
    text = CliRunner().invoke(main, ["replay", str(out)]).output
    assert "this plan was not measured" in text and "(measured " not in text
    d = json.loads(CliRunner().invoke(main, ["replay", str(out), "--json", "-q"]).output)
    assert "error_pct" not in d and "measured_step_time_us" not in d and d["source_measured_step_time_us"] > 0


def test_ettools_alone_prints_the_help_as_help():
    """It printed the help as one error line of literal "\\n"."""
    r = CliRunner().invoke(main, [])
    assert r.exit_code == 0
    lines = r.output.splitlines()
    assert lines[0].startswith("Usage: ") and len(lines) > 10 and "\\n" not in r.output
    assert any(line.strip().startswith("synth") for line in lines)


def test_library_warnings_are_prefixed_lines(tmp_path):
    """A one-rank set cannot run in ASTRA-sim: the Chakra writer's note is an `ettools: warning:`
    line (it came out bare through logging's last-resort handler)."""
    r = CliRunner().invoke(main, ["convert", str(REPO / "sample_traces" / "single"), "-o", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    notes = [line for line in r.output.splitlines() if "ASTRA-sim needs at least 2 NPUs" in line]
    assert notes and all(line.startswith("ettools: warning: ") for line in notes), r.output


BERT_H100 = REPO.parent / "shared" / "traces" / "hardware_pairs" / "bert_small" / "h100.json.gz"


@pytest.mark.skipif(not BERT_H100.exists(), reason="shared hardware-pair trace not present")
def test_operands_no_device_holds_are_not_used_as_shapes(tmp_path):
    """Two GEMMs whose recorded operands are [[2^32, 2^32], ...] (2^64 elements): the trace still
    reads, the text output says how many ops' operands were set aside, and re-timing for another
    GPU stays finite (those kernels move by their class, not by a 2^64-element shape)."""
    import gzip
    import json

    doc = json.loads(gzip.open(BERT_H100).read())
    ops = [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("name") == "aten::addmm"]
    for e in ops[:2]:
        e["args"]["Input Dims"] = [[2 ** 32], [2 ** 32, 2 ** 32], [2 ** 32, 512], [], []]
    src = tmp_path / "huge.json"
    src.write_text(json.dumps(doc))
    r = CliRunner().invoke(main, ["replay", str(src), "--system", "MI300X", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[r.output.index("{"):])
    assert 0 < out["step_time_us"] < 1e6
    r = CliRunner().invoke(main, ["info", str(src)])
    assert "2 op(s) record operands no device holds" in r.output


@pytest.mark.parametrize("args,option", [
    (["validate", "sample_traces/ddp", "sample_traces/ddp", "--tolerance", "nan"], "--tolerance"),
    (["scale", "sample_traces/single", "--dp", "2", "--bucket-mb", "nan", "-o", "OUT"], "--bucket-mb"),
    (["scale", "sample_traces/single", "--dp", "2", "--device-memory", "nan", "-o", "OUT"], "--device-memory"),
    (["synth", "--model", "gpt3-1.3b", "--bucket-mb", "nan", "-o", "OUT"], "--bucket-mb"),
    (["serve", "--model", "llama3-8b", "--rate", "nan"], "--rate"),
    (["search", "--model", "gpt3-1.3b", "--gpus", "8", "--memory-gib", "nan"], "--memory-gib"),
    (["capture", "--emulate", "H100", "--gpu-memory", "nan", "-o", "OUT", "--", "python", "-c", "pass"],
     "--gpu-memory"),
])
def test_nan_options_exit_2_naming_the_option(tmp_path, monkeypatch, args, option):
    """NaN passes every plain range check (all its comparisons are false): each float option that
    sizes work refuses it in one line naming the option, before anything runs or is written."""
    monkeypatch.chdir(REPO)
    out = tmp_path / "out"
    r = CliRunner().invoke(main, [str(out) if a == "OUT" else a for a in args])
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and option in lines[0] and "not a number" in lines[0], r.output
    assert not out.exists()


def test_emulated_torchrun_world_is_range_checked(tmp_path):
    """A torchrun command asking for 10^10 ranks under --emulate: one line naming the count and the
    limit, exit 2, before any rank runs or any file is written."""
    t0 = time.monotonic()
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["capture", "--emulate", "H100", "-o", str(out), "--", "torchrun",
                                  "--nproc-per-node", "100000", "--nnodes", "100000", "train.py"])
    assert r.exit_code == 2 and time.monotonic() - t0 < 1.0
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "10,000,000,000 ranks" in lines[0] and "1,048,576" in lines[0], r.output
    assert not out.exists()
