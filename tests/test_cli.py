"""The CLI end to end: convert every real trace to Chakra and check the files with the schema
alone; info's JSON contract; bad input gives one line, exit code 2 and no output."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from chakra_decoding import decode as decode_et
from click.testing import CliRunner
from shared_kineto import read_json

from ettools.cli import main
from ettools.schema import et_def_pb2 as pb

SOURCES = [
    "kineto/hta_nccl_2rank",
    "kineto/hta_world128_sampled",
    "kineto/hta_fwdbwd_1rank",
    "kineto/hta_alexnet_1rank",
    "kineto/hta_event_sync_multistream",
    "kineto/hta_amd_mi250",
    "kineto/hta_cpu_only_gloo",
    "et_kineto/param_resnet",
    "et_kineto/param_linear",
    "et_kineto/hta_simple_add",
    "et_kineto/triosim_vgg13_h100",
    "et_kineto/param_linear/et.json.gz",
    "pytorch_et/chakra_2rank_nccl",
    "astrasim_json/small_workload.json",
    "triosim/vgg13_h100_bs128",
]


def run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.stdout, res.stderr


def check_chakra_dir(outdir: Path) -> int:
    groups = json.loads((outdir / "comm_group.json").read_text())
    assert all(k.isdigit() and int(k) > 0 for k in groups)
    total = 0
    for et in sorted(outdir.glob("*.et")):
        _, nodes = decode_et(et)
        assert nodes, et
        ids = {n.id for n in nodes}
        for n in nodes:
            assert n.type not in (pb.METADATA_NODE, pb.INVALID_NODE)
            missing = [d for d in list(n.data_deps) + list(n.ctrl_deps) if d not in ids]
            assert not missing, f"{et}: node {n.id} depends on missing {missing[:3]}"
            attrs = {a.name: a for a in n.attr}
            assert attrs["is_cpu_op"].WhichOneof("value") == "bool_val"
            if n.type == pb.COMM_COLL_NODE:
                assert attrs["comm_type"].WhichOneof("value") == "int64_val"
                assert attrs["comm_size"].WhichOneof("value") == "int64_val"
                assert attrs["comm_size"].int64_val >= 0
                assert attrs["pg_name"].WhichOneof("value") == "string_val"
                assert attrs["pg_name"].string_val in groups
            if n.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
                for key in ("comm_src", "comm_dst", "comm_tag"):
                    assert attrs[key].WhichOneof("value") == "int32_val"
        total += len(nodes)
    return total


@pytest.mark.parametrize("source", SOURCES)
def test_convert_every_real_trace_to_valid_chakra(shared_traces, tmp_path, source):
    code, out, err = run("convert", str(shared_traces / source), "-o", str(tmp_path), "-q")
    assert code == 0, err
    assert check_chakra_dir(tmp_path) > 0


@pytest.mark.parametrize("scenario", ["ddp", "tp_sp", "pp_1f1b", "moe_ep", "fsdp"])
def test_convert_sample_captures_and_count_comm(sample_traces, tmp_path, scenario):
    code, out, err = run("convert", str(sample_traces / scenario), "-o", str(tmp_path), "-q")
    assert code == 0, err
    check_chakra_dir(tmp_path)
    # the collectives in the Chakra files are the ones the manifest derives from the plan
    manifest = json.loads((sample_traces / "manifest.json").read_text())["scenarios"][scenario]
    for rank, expected in manifest["expected_collectives"].items():
        _, nodes = decode_et(tmp_path / f"trace.{rank}.et")
        got: dict[str, list[int]] = {}
        for n in nodes:
            attrs = {a.name: a for a in n.attr}
            if n.type == pb.COMM_COLL_NODE:
                key = pb.COLLECTIVE_TYPES[attrs["comm_type"].int64_val]
            elif n.type == pb.COMM_SEND_NODE:
                key = "SEND"
            elif n.type == pb.COMM_RECV_NODE:
                key = "RECV"
            else:
                continue
            got.setdefault(key, []).append(attrs["comm_size"].int64_val)
        want: dict[str, list[int]] = {}
        for e in expected:
            want.setdefault(e["type"], []).extend([e["bytes"]] * e["count"])
        assert {k: sorted(v) for k, v in got.items()} == {k: sorted(v) for k, v in want.items()}


def test_chakra_to_chakra_keeps_a_foreign_file_as_is(shared_traces, tmp_path):
    """Every node kept; only the dependencies with one sound repair (dangling, self) dropped (its
    cycles need --allow-defects: tests/test_convert_defects.py)."""
    src = shared_traces / "chakra" / "resnet_converted.0.et"
    code, _, err = run("convert", str(src), "-o", str(tmp_path), "-q", "--allow-defects")
    assert code == 0, err
    _, a = decode_et(src)
    _, b = decode_et(tmp_path / "trace.0.et")
    assert len(a) == len(b) == 3664
    assert [n.id for n in a] == [n.id for n in b]
    ids = {n.id for n in a}
    assert sum(sum(d in ids and d != n.id for d in n.data_deps) for n in a) == sum(len(n.data_deps) for n in b)


def test_convert_is_deterministic(shared_traces, tmp_path):
    src = shared_traces / "kineto" / "hta_nccl_2rank"
    for sub in ("a", "b"):
        assert run("convert", str(src), "-o", str(tmp_path / sub), "-q")[0] == 0
    for f in (tmp_path / "a").iterdir():
        assert f.read_bytes() == (tmp_path / "b" / f.name).read_bytes(), f.name


@pytest.mark.parametrize("to,pattern", [("chrome", "*.chrome.json"), ("astrasim-json", "*.json"),
                                        ("chakra-json", "*.json"), ("triosim", "*.csv")])
def test_other_writers(shared_traces, tmp_path, to, pattern):
    src = shared_traces / "et_kineto" / "triosim_vgg13_h100"
    code, _, err = run("convert", str(src), "--to", to, "-o", str(tmp_path), "-q")
    assert code == 0, err
    assert list(tmp_path.glob(pattern))


def test_info_json_contract(shared_traces):
    code, out, err = run("info", str(shared_traces / "kineto" / "hta_world128_sampled"), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["world_size"] == 128
    assert set(report["ranks"]) == {"0", "1"}
    for r in report["ranks"].values():
        assert r["nodes"] == sum(r["by_type"].values())
        assert set(r["by_type"]) <= {"COMP_NODE", "COMM_COLL_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE",
                                     "MEM_LOAD_NODE", "MEM_STORE_NODE"}
        for key, c in r["comm"].items():
            assert key in set(pb.COLLECTIVE_TYPES) | {"SEND", "RECV", "UNKNOWN"}
            assert c["count"] >= 0 and c["bytes"] >= 0
        assert {"ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "ALL_TO_ALL", "SEND", "RECV"} <= set(r["comm"])
    # NCCL kernels per rank, counted from the raw file
    for rank in (0, 1):
        raw = read_json(shared_traces / f"kineto/hta_world128_sampled/rank{rank}.json.gz")
        nccl = sum(1 for e in raw["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e["name"])
        assert report["ranks"][str(rank)]["by_type"]["COMM_COLL_NODE"] == nccl


def test_info_reports_foreign_defects(shared_traces):
    code, out, _ = run("info", str(shared_traces / "chakra" / "resnet_converted.0.et"), "--json")
    r = json.loads(out)["ranks"]["0"]
    assert r["dangling_deps"] == 1277
    assert r["comm_missing_attrs"]["comm_type"] == 14
    assert r["comm_missing_attrs"]["pg_name"] == 21
    code, text, _ = run("info", str(shared_traces / "chakra" / "resnet_converted.0.et"))
    assert "1,277 dependencies name missing nodes" in text


def drop_first_collective(path: Path) -> int:
    """Rewrite a Chakra file without its first COMM_COLL node (and edges to it); returns its bytes."""
    from google.protobuf.internal.encoder import _VarintBytes

    meta, nodes = decode_et(path)
    coll = [n for n in nodes if n.type == pb.COMM_COLL_NODE]
    victim = coll[0]
    kept = [n for n in nodes if n.id != victim.id]
    for n in kept:
        for deps in (n.data_deps, n.ctrl_deps):
            vals = [d for d in deps if d != victim.id]
            del deps[:]
            deps.extend(vals)
    with open(path, "wb") as f:
        for m in [meta] + kept:
            b = m.SerializeToString()
            f.write(_VarintBytes(len(b)) + b)
    return {a.name: a for a in victim.attr}["comm_size"].int64_val


def test_info_reports_unmatched_collective(sample_traces, tmp_path):
    # drop rank 1's first collective from a Chakra copy of the TP+SP capture: info must name it
    assert run("convert", str(sample_traces / "tp_sp"), "-o", str(tmp_path), "-q")[0] == 0
    drop_first_collective(tmp_path / "trace.1.et")
    code, out, _ = run("info", str(tmp_path), "--json")
    report = json.loads(out)
    assert report["collectives"]["unmatched_count"] >= 1
    assert any(u["rank"] in (0, 1) for u in report["collectives"]["unmatched"])


def test_validate_tolerance_exit_codes_and_report(sample_traces, tmp_path):
    ref, cand = tmp_path / "ref", tmp_path / "cand"
    assert run("convert", str(sample_traces / "tp_sp"), "-o", str(ref), "-q")[0] == 0
    shutil.copytree(ref, cand)  # the same conversion (its bytes are deterministic: test_chakra_fidelity)
    code, out, _ = run("validate", str(ref), str(ref), "--tolerance", "0", "--json")
    assert code == 0 and json.loads(out)["max_error_pct"] == 0
    dropped = drop_first_collective(cand / "trace.1.et")
    assert dropped > 0
    gate = ["--measure", "comm_counts", "--measure", "comm_bytes"]
    code, out, err = run("validate", str(ref), str(cand), "--tolerance", "0.5", *gate, "--json",
                         "--report", str(tmp_path / "r.html"))
    assert code == 1 and "comm_counts" in err and "comm_bytes" in err
    result = json.loads(out)
    # one of 46 collectives is gone: 1/46 of the calls
    assert abs(result["errors"]["comm_counts"] - 100 / 46) < 1e-6
    html = (tmp_path / "r.html").read_text()
    assert "data:image/png;base64," in html or "matplotlib" in html
    # a looser gate passes
    code, _, _ = run("validate", str(ref), str(cand), "--tolerance", "5", *gate)
    assert code == 0


BAD_INPUTS = {
    "not_json.json": b"this is { not json",
    "wrong_shape.json": b'{"foo": 1}',
    "truncated.json.gz": gzip.compress(b'{"traceEvents": []}' * 100)[:40],
    "empty.et": b"",
    "cut_frame.et": b"\x09\x0a\x03abc",  # length 9, only 5 bytes follow
    "events_not_list.json": b'{"traceEvents": 5, "schemaVersion": 1}',
    "bad_schema_et.json": b'{"schema": "9.9.9", "pid": 1, "nodes": []}',
    "corrupt.json.gz": b"\x1f\x8b\x08\x00garbage that is not deflate data",
    "no_id.astrasim.json": b'{"workload_graph": [{"Name": "a"}]}',
    "bad_node.chakra.json": b'{"global_metadata": {}, "nodes": [{"id": "x"}]}',
    "et_node_without_id.json": b'{"schema": "1.0.1", "pid": 1, "nodes": [{"name": "a"}]}',
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_one_line_exit_2_no_output(tmp_path, name):
    bad = tmp_path / name
    bad.write_bytes(BAD_INPUTS[name])
    out = tmp_path / "out"
    code, stdout, stderr = run("convert", str(bad), "-o", str(out), "-q")
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0], stderr
    assert not out.exists() or not any(out.iterdir())


def test_console_script_exit_code_and_message(tmp_path):
    bad = tmp_path / "x.et"
    bad.write_bytes(b"\x80")  # a varint that never ends
    proc = subprocess.run([sys.executable, "-m", "ettools.cli", "info", str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "x.et" in proc.stderr


def test_synth_writes_matched_chakra_and_json(tmp_path):
    code, out, err = run("synth", "--model", "llama3-8b", "--dim", "L=4", "--tp", "2", "--pp", "2",
                         "--dp", "2", "--batch", "8", "--micro-batch", "2", "-o", str(tmp_path), "--json", "-q")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["world_size"] == 8 and len(summary["ranks"]) == 8
    for r in summary["ranks"].values():
        assert set(r["ops"]) == {"GeMM", "Attention", "ElementWise", "Others"}
        assert r["ops"]["GeMM"] > 0 and r["peak_memory_bytes"] > 0
    assert check_chakra_dir(tmp_path) > 0
    code, out, _ = run("info", str(tmp_path), "--json")
    info = json.loads(out)
    assert info["collectives"]["unmatched_count"] == 0 and info["collectives"]["matched"] > 0
    assert info["p2p"]["unmatched_count"] == 0 and info["p2p"]["matched"] > 0
    # the ranks object of synth --json is info's, plus op classes and memory
    for rank, r in info["ranks"].items():
        assert r["comm"] == summary["ranks"][rank]["comm"]
        assert r["by_type"] == summary["ranks"][rank]["by_type"]


@pytest.mark.parametrize("args,needle", [
    (["--model", "no-such-model"], "no-such-model"),
    (["--model", "gpt3-5b", "--tp", "3"], "tp = 3"),
])
def test_synth_bad_arguments_exit_2(tmp_path, args, needle):
    code, _, err = run("synth", *args, "-o", str(tmp_path / "o"), "-q")
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_replay_json_and_what_if(shared_traces):
    src = str(shared_traces / "kineto" / "hta_fwdbwd_1rank")
    code, out, err = run("replay", src, "--json", "-q")
    assert code == 0, err
    base = json.loads(out)
    assert base["measured_step_time_us"] > 0
    assert abs(base["step_time_us"] - base["measured_step_time_us"]) / base["measured_step_time_us"] < 0.02
    assert set(base["ranks"]["0"]) >= {"step_time_us", "compute_us", "comm_us", "exposed_comm_us",
                                       "peak_memory_bytes"}
    code, out, _ = run("replay", src, "--json", "--what-if", "device=0.5", "-q")
    faster = json.loads(out)
    assert faster["step_time_us"] < 0.7 * base["step_time_us"]  # GPU-bound: kernels dominate


def test_replay_deadlock_exit_1(sample_traces, tmp_path):
    assert run("convert", str(sample_traces / "tp_sp"), "-o", str(tmp_path), "-q")[0] == 0
    drop_first_collective(tmp_path / "trace.1.et")
    code, _, err = run("replay", str(tmp_path), "-q")
    assert code == 1 and "deadlock" in err


def test_calibrate_then_replay(shared_traces, tmp_path):
    fit = tmp_path / "fit.json"
    code, _, err = run("calibrate", str(shared_traces / "et_kineto/param_linear/kineto.json.gz"),
                       "-o", str(fit), "-q")
    assert code == 0 and fit.exists(), err
    code, out, err = run("replay", str(shared_traces / "et_kineto/param_linear/kineto.json.gz"),
                         "--timing", f"calibrated:{fit}", "--json", "-q")
    assert code == 0, err
    assert json.loads(out)["step_time_us"] > 0


def test_scale_single_to_tp_sp_matches_the_capture(sample_traces, tmp_path):
    out = tmp_path / "tp"
    code, stdout, err = run("scale", str(sample_traces / "single"), "-o", str(out), "--tp", "2", "--sp",
                            "--json", "-q")
    assert code == 0, err
    summary = json.loads(stdout)
    assert set(summary["ranks"]) == {"0", "1"}
    check_chakra_dir(out)
    # the written rewrite carries exactly the real 2-rank capture's collectives
    code, _, err = run("validate", str(sample_traces / "tp_sp"), str(out), "--tolerance", "0",
                       "--measure", "comm_counts", "--measure", "comm_bytes", "-q")
    assert code == 0, err
    # host ops sliced for Chakra cannot be counted as operators: said, and a gate on them fails
    code, stdout, err = run("validate", str(sample_traces / "tp_sp"), str(out), "--tolerance", "0",
                            "--measure", "op_counts", "--json", "-q")
    assert code == 1 and "could not be compared" in err
    assert "op_counts" in json.loads(stdout)["skipped"]


def test_scale_dp_with_and_without_ddp_host_work(sample_traces, tmp_path):
    spans = {}
    for flag in ("--ddp-host-work", "--no-ddp-host-work"):
        code, stdout, err = run("scale", str(sample_traces / "single"), "-o", str(tmp_path / flag), "--dp", "2",
                                flag, "--json", "-q")
        assert code == 0, err
        r0 = json.loads(stdout)["ranks"]["0"]
        spans[flag] = r0["end_us"] - r0["start_us"]
    source = json.loads(run("info", str(sample_traces / "single"), "--json", "-q")[1])["ranks"]["0"]
    # without it the host timeline is the capture's; with it, DDP's 21 gradient copies add > 1 ms
    assert spans["--no-ddp-host-work"] == pytest.approx(source["end_us"] - source["start_us"])
    assert spans["--ddp-host-work"] - spans["--no-ddp-host-work"] > 1000.0


def test_scale_reshard_to_1024_ranks(shared_traces, tmp_path):
    code, _, err = run("scale", str(shared_traces / "et_kineto/triosim_vgg13_h100"), "-o", str(tmp_path),
                       "--dp", "1024", "-q")
    assert code == 0, err
    files = sorted(tmp_path.glob("*.et"))
    assert len(files) == 1024
    groups = json.loads((tmp_path / "comm_group.json").read_text())
    assert sorted(len(v) for v in groups.values())[-1] == 1024
    # stamped replicas: identical bytes on every rank (no send/recv, one data-parallel group)
    assert files[0].read_bytes() == files[-1].read_bytes()


@pytest.mark.parametrize("args,needle", [
    (["--tp", "3"], "cannot rewrite"),
    (["--dim", "hidden"], "NAME=NEW"),
])
def test_scale_bad_arguments_exit_2(sample_traces, tmp_path, args, needle):
    code, _, err = run("scale", str(sample_traces / "single"), "-o", str(tmp_path / "o"), *args, "-q")
    assert code == 2 and needle in err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


# scenario -> ettools synth arguments for the sample GPT of the same plan (see tests/test_synth_captures.py)
SYNTH_PLANS = {
    "single": ["--model", "sample_gpt"],
    "ddp": ["--model", "sample_gpt", "--dp", "2", "--batch", "16", "--micro-batch", "16", "--bucket-mb", "100"],
    "fsdp": ["--model", "sample_gpt", "--dp", "2", "--fsdp", "--batch", "16", "--micro-batch", "16"],
    "tp_sp": ["--model", "sample_gpt", "--tp", "2", "--sp", "--no-vocab-parallel", "--batch", "8",
              "--micro-batch", "8", "--bucket-mb", "100"],
    "pp_1f1b": ["--model", "sample_gpt", "--pp", "2", "--schedule", "1f1b", "--batch", "8", "--micro-batch", "2"],
    "moe_ep": ["--model", "sample_moe", "--dp", "2", "--ep", "2", "--batch", "16", "--micro-batch", "16",
               "--bucket-mb", "100"],
}


@pytest.mark.parametrize("scenario", sorted(SYNTH_PLANS))
def test_synth_equals_capture_through_validate(sample_traces, tmp_path, scenario):
    """Matmuls, attention, collective counts and bytes of the synthesized plan equal the capture's."""
    code, _, err = run("synth", *SYNTH_PLANS[scenario], "--dtype", "fp32", "-o", str(tmp_path), "-q")
    assert code == 0, err
    code, out, err = run("validate", str(sample_traces / scenario), str(tmp_path), "--json", "--tolerance", "0",
                         "--measure", "op_counts", "--op-class", "GeMM", "--op-class", "Attention",
                         "--measure", "comm_counts", "--measure", "comm_bytes", "-q")
    assert code == 0, err + out
    result = json.loads(out)
    assert result["max_error_pct"] == 0
    assert result["tables"]["op_counts"]["cells"]["total"]["GeMM"]["reference"] > 0
