"""Crashes on input become one line naming the file and exit 2; silent garbage is refused or
counted under ``info --json`` ``problems``; contradictory options are refused. Each case is built
here from a real trace, parsed with json/gzip in the test."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ettools.cli import main

REPO = Path(__file__).resolve().parents[1]
SINGLE = REPO / "sample_traces" / "single"
SHARED = REPO.parent / "shared" / "traces"


def run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, [*args, "-q"])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res.exit_code, res.stdout, res.stderr


def refused(path: Path, *needles: str) -> str:
    for cmd in (["info", str(path)], ["convert", str(path), "-o", str(path.parent / "out")]):
        code, _, err = run(*cmd)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1, err
        assert path.name in lines[0] and len(lines[0]) < 400, err
        for n in needles:
            assert n in lines[0], err
        assert not (path.parent / "out").exists() or not any((path.parent / "out").iterdir())
    return lines[0]


def kineto() -> dict:
    return json.loads(gzip.decompress((SINGLE / "rank0.kineto.json.gz").read_bytes()))


def first_x(doc: dict) -> dict:
    return next(e for e in doc["traceEvents"] if e.get("ph") == "X")


def deep(n: int) -> str:
    return "[" * n + "1" + "]" * n


def write(tmp_path: Path, name: str, doc: object, splice: str | None = None) -> Path:
    text = json.dumps(doc)
    if splice is not None:
        text = text.replace('"@@"', splice, 1)
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("field,value", [("cat", {"a": 1}), ("ph", ["X"])])
def test_kineto_unhashable_fields(tmp_path, field, value):
    doc = kineto()
    first_x(doc)[field] = value
    refused(write(tmp_path, "k.json", doc), field)


def test_kineto_dur_nested_1000_deep(tmp_path):
    doc = kineto()
    first_x(doc)["dur"] = "@@"
    refused(write(tmp_path, "k.json", doc, deep(1000)), "nested")



@pytest.mark.parametrize("field,value", [("dur", 2**64), ("dur", 1e19), ("ts", 1e30), ("ts", -(10**18))])
def test_kineto_time_beyond_int64_ns_refused(tmp_path, field, value):
    # 2^63 ns is ~9.2e15 us: no clock reading lies beyond it; a step time of 1e19 us is garbage
    doc = kineto()
    i = max(j for j, e in enumerate(doc["traceEvents"]) if e.get("ph") == "X")
    doc["traceEvents"][i][field] = value
    refused(write(tmp_path, "k.json", doc), f"traceEvents[{i}]", "not a clock reading")

def test_astrasim_node_type_nested_1000_deep(tmp_path):
    doc = json.loads((SHARED / "astrasim_json/small_workload.json").read_text())
    doc["workload_graph"][0]["NodeType"] = "@@"
    refused(write(tmp_path, "a.json", doc, deep(1000)))



@pytest.mark.parametrize("to", ["astrasim-json"])
def test_value_nested_300_deep_is_an_output_error(tmp_path, to):
    # readable (orjson reads 1,024 levels) but not writable as JSON (orjson writes 255): one line
    doc = json.loads((SHARED / "astrasim_json/small_workload.json").read_text())
    doc["workload_name"] = "@@"  # carried to the output
    p = write(tmp_path, "a.json", doc, deep(300))
    out = tmp_path / "out"
    code, _, err = run("convert", str(p), "--to", to, "-o", str(out))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "nested too deep" in lines[0], err
    assert not out.exists() or not any(out.iterdir())

def test_chakra_json_nested_5000_deep(tmp_path):
    src = tmp_path / "cj"
    code, _, err = run("convert", str(SHARED / "chakra/resnet_converted.0.et"), "-o", str(src), "--to", "chakra-json",
                       "--allow-defects")
    assert code == 0, err
    text = (src / "trace.0.json").read_text()
    assert '"nodes": [' in text
    p = tmp_path / "deep.0.json"
    p.write_text(text.replace('"nodes": [', '"nodes": [' + deep(5000) + ",", 1))
    refused(p)


@pytest.mark.parametrize("info,words", [({"rank": 0, "world_size": 2**40}, "world_size"),
                                        ({"rank": 5, "world_size": 2}, "rank 5"),
                                        ({"rank": "zero", "world_size": 2}, "rank")])
def test_kineto_world_and_rank(tmp_path, info, words):
    doc = kineto()
    doc["distributedInfo"] = info
    refused(write(tmp_path, "k.json", doc), words)


def test_comm_group_naming_rank_1e9(tmp_path):
    out = tmp_path / "c"
    code, _, err = run("synth", "--model", "gpt3-5b", "--dim", "L=1", "--dp", "2", "-o", str(out))
    assert code == 0, err
    groups = json.loads((out / "comm_group.json").read_text())
    key = next(iter(groups))
    groups[key] = [*groups[key], 10**9]
    (out / "comm_group.json").write_text(json.dumps(groups))
    code, _, err = run("info", str(out))
    assert code == 2 and "comm_group.json" in err and "1000000000" in err and err.count("\n") == 1


def test_triosim_byte_count_beyond_int64(tmp_path):
    src = SHARED / "triosim/vgg13_h100_bs128"
    d = tmp_path / "trio"
    d.mkdir()
    import csv
    import io

    rows = list(csv.reader(io.StringIO((src / "tensor.csv").read_text())))
    assert rows[0][3] == "TensorNumElement" and rows[1][3].isdigit()
    rows[1][3] = str(10**23)
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    (d / "tensor.csv").write_text(buf.getvalue())
    (d / "trace.csv").write_text((src / "trace.csv").read_text())
    code, _, err = run("info", str(d))
    assert code == 2 and "tensor.csv" in err and "64 bits" in err


def test_error_messages_are_bounded_and_escaped(tmp_path):
    doc = kineto()
    doc["distributedInfo"] = {"rank": "\x1b[31m" + "y" * 100_000, "world_size": 2}
    line = refused(write(tmp_path, "k.json", doc))
    assert "\x1b" not in line and len(line) < 400


def test_nul_bytes_named_json_gz(tmp_path):
    p = tmp_path / "t.json.gz"
    p.write_bytes(b"\0" * 100)
    code, out, err = run("info", str(p), "--json")
    # either refused, or read as something with nodes; never an empty trace read as fine
    assert code == 2 or json.loads(out)["nodes"] > 0, (code, err)


def test_negative_durations_are_counted(tmp_path):
    doc = kineto()
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    for e in xs[:3]:
        e["dur"] = -5
    p = write(tmp_path, "k.json", doc)
    code, out, err = run("info", str(p), "--json")
    assert code == 0, err
    assert json.loads(out)["problems"]["negative_durations_clamped"] == 3


def test_cycles_counted_and_never_written_for_astrasim(tmp_path):
    doc = json.loads((SHARED / "astrasim_json/small_workload.json").read_text())
    g = doc["workload_graph"]
    assert g[1]["data_deps"] == [g[0]["Id"]]
    g[0]["data_deps"] = [g[1]["Id"]]  # 0 -> 1 -> 0
    p = write(tmp_path, "a.json", doc)
    code, out, err = run("info", str(p), "--json")
    assert code == 0 and json.loads(out)["problems"]["dependency_cycles"] == 1
    assert "cycle" in err
    code, _, err = run("convert", str(p), "-o", str(tmp_path / "o"), "--to", "astrasim-json")
    assert code == 2 and "cycle" in err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_duplicate_ids_refused(tmp_path):
    doc = json.loads((SHARED / "astrasim_json/small_workload.json").read_text())
    doc["workload_graph"][2]["Id"] = doc["workload_graph"][1]["Id"]
    refused(write(tmp_path, "a.json", doc), "duplicate")


@pytest.mark.parametrize("args", [
    ["scale", "SINGLE", "-o", "OUT"],
    ["scale", "SINGLE", "-o", "OUT", "--dp", "0"],
    ["scale", "SINGLE", "-o", "OUT", "--tp", "2", "--schedule", "gpipe"],
    ["scale", "SINGLE", "-o", "OUT", "--tp", "2", "--micro-batches", "4"],
    ["scale", "SINGLE", "-o", "OUT", "--sp"],
    ["synth", "--model", "gpt3-5b", "--fsdp", "--zero", "1", "-o", "OUT"],
    ["synth", "--model", "gpt3-5b", "--sp", "-o", "OUT"],
    ["synth", "--model", "gpt3-5b", "--pp", "2", "--vpp", "2", "-o", "OUT"],
    ["synth", "--model", "gpt3-5b", "--dp", "0", "-o", "OUT"],
    ["synth", "--model", "gpt3-5b", "--dim", "FOO=3", "-o", "OUT"],
    ["synth", "--model", "gpt3-5b", "--dim", "B=4", "-o", "OUT"],
    ["synth", "--model", "gpt3-5b", "--dim", "L=0", "-o", "OUT"],
    ["synth", "--model", "llama3-8b", "--dim", "H=1000", "--dim", "L=1", "-o", "OUT"],
    ["replay", "SINGLE", "--congestion", "--symmetric"],
])
def test_contradictory_options_refused(tmp_path, args):
    args = [str(SINGLE) if a == "SINGLE" else str(tmp_path / "o") if a == "OUT" else a for a in args]
    code, _, err = run(*args)
    assert code == 2 and err.count("\n") == 1 and err.startswith("ettools: error:"), err
    assert not (tmp_path / "o").exists()


def test_synth_unknown_dimension_names_the_known_ones(tmp_path):
    code, _, err = run("synth", "--model", "llama3-8b", "--dim", "FOO=3", "-o", str(tmp_path / "o"))
    assert code == 2 and "FOO" in err
    # the known ones: the symbols the Llama template's header lists (read from the template file)
    tpl = (REPO / "converters/symbolic/templates/llama.txt").read_text()
    comments = " ".join(line.lstrip("# ") for line in tpl.splitlines() if line.startswith("#"))
    items = comments.split("Symbols:")[1].split(".")[0].split(",")  # "B micro-batch, S sequence, …"
    symbols = {item.split()[0] for item in items if item.strip()} - {"B"}  # B is --micro-batch
    assert {"H", "F", "L"} <= symbols
    known = set(err.strip().rsplit("known ", 1)[1].split(", "))
    assert symbols <= known, err


def _synth_bytes(tmp_path, tag, *dims):
    out = tmp_path / tag
    code, _, err = run("synth", "--model", "gpt3-5b", *[a for d in dims for a in ("--dim", d)], "-o", str(out))
    assert code == 0, err
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}, err


def test_synth_derived_dimension_follows_its_input(tmp_path):
    # GPT-3 (Brown et al., Table 2.1): d_ff = 4 d_model; H=2048 alone must equal H=2048 F=8192
    derived, note = _synth_bytes(tmp_path, "a", "H=2048", "L=1")
    given, _ = _synth_bytes(tmp_path, "b", "H=2048", "F=8192", "L=1")
    stale, _ = _synth_bytes(tmp_path, "c", "H=2048", "F=16384", "L=1")
    assert derived == given and derived != stale
    assert "F = 4*H = 8192" in note


def test_synth_list_models_lists_presets_and_every_template():
    code, out, err = run("synth", "--list-models")
    assert code == 0, err
    names = {line.split()[0] for line in out.splitlines() if line.startswith("  ")}
    on_disk = {p.stem for p in (REPO / "converters/symbolic/templates").glob("*.txt")}
    assert on_disk <= names
    assert {"gpt3-175b", "llama3-70b"} <= names  # presets the README uses
    assert "F = 4*H" in out


def test_kineto_pg_config_not_a_list_refused(tmp_path):
    doc = kineto()
    doc["distributedInfo"] = {"rank": 0, "world_size": 1, "pg_config": 2.5}
    refused(write(tmp_path, "k.json", doc), "pg_config")


def test_kineto_flow_with_object_tid_is_ignored(tmp_path):
    doc = kineto()
    flow = next(e for e in doc["traceEvents"] if e.get("ph") == "f" and e.get("cat") == "fwdbwd")
    flow["tid"] = {"a": 1}
    p = write(tmp_path, "k.json", doc)
    code, _, err = run("convert", str(p), "-o", str(tmp_path / "out"))
    assert code == 0, err


@pytest.mark.parametrize("where,value", [(("values", 3), 2**70), (("values", 3), 1.8e19), (("values", 4), 2**40),
                                         (("values", 4), -(2**63)), (("shapes", 0), 2**63)])
def test_et_tensor_field_beyond_its_column_refused(tmp_path, where, value):
    # numel/ids int64, item size int32, numel x itemsize and shape dims int64 (fuzz cases 13169, 42887, ...)
    doc = json.loads(gzip.decompress((SINGLE / "rank0.et.json.gz").read_bytes()))
    node = next(n for n in doc["nodes"] if ((n.get("outputs") or {}).get("types") or [""])[0].startswith("Tensor(")
                and n["outputs"]["shapes"][0])
    node["outputs"][where[0]][0][where[1]] = value
    refused(write(tmp_path, "rank0.et.json", doc), "int64")
