"""Memory on big input: a Kineto file whose events are not objects, and a well-formed trace of any JSON
format whose values nest megabytes of small arrays, are refused from their raw bytes before a parse
that would cost ~20-40x their size; the pre-scan agrees with ``json`` on random documents."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

import ettools.json_scan as scan
from ettools.io import first_non_object

MB = 1 << 20

# Peak RSS of one CLI run, read inside the child from VmHWM (per address space: unlike ru_maxrss it
# does not inherit the high-water mark of the forking test process).
_PEAK = """
import re, sys
from ettools.cli import main
try:
    main(sys.argv[1:], prog_name="ettools")
except SystemExit as e:
    code = e.code
hwm = re.search(r"VmHWM:\\s*(\\d+) kB", open("/proc/self/status").read()).group(1)
print("PEAK", int(hwm) * 1024, code, file=sys.stderr)
"""


def _peak(*args: str) -> tuple[int, int, str]:
    res = subprocess.run([sys.executable, "-c", _PEAK, *args], capture_output=True, text=True, timeout=120)
    lines = res.stderr.strip().splitlines()
    _, peak, code = lines[-1].split()
    return int(peak), int(code), "\n".join(lines[:-1])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM is read from /proc")
@pytest.mark.parametrize("item", [b"[[1]]", b"[[[[0]]]]", b"7"])
def test_50mb_of_small_non_object_events_refused_within_4x(tmp_path, item):
    # 1,000 genuine events first, then small arrays/numbers to 50 MB: the first bad one is index 1000
    good = b'{"ph":"X","name":"k","cat":"kernel","ts":1,"dur":1,"pid":0,"tid":7}'
    n_bad = (50 * MB - 1000 * (len(good) + 1)) // (len(item) + 1)
    p = tmp_path / "nested.json"
    with p.open("wb") as f:
        f.write(b'{"traceEvents":[' + b",".join([good] * 1000))
        block = (b"," + item) * 100_000
        for _ in range(n_bad // 100_000):
            f.write(block)
        f.write((b"," + item) * (n_bad % 100_000) + b"]}")
    size = p.stat().st_size
    assert size >= 50 * MB - 64
    peak, code, err = _peak("info", str(p))
    assert code == 2, err
    assert err.count("\n") == 0 and p.name in err and "traceEvents[1000]" in err, err
    assert peak <= 4 * size, f"peak RSS {peak / MB:.0f} MB for a {size / MB:.0f} MB file"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM is read from /proc")
@pytest.mark.parametrize("head,key", [
    (b'{"schema": "1.0.1", "pid": 1, "nodes": [', "nodes"),  # PyTorch ET
    (b'{"global_metadata": {}, "nodes": [', "nodes"),  # Chakra JSON
    (b'{"workload_graph": [', "workload_graph"),  # ASTRA-sim JSON
])
def test_50mb_node_list_of_arrays_refused_within_4x(tmp_path, head, key):
    p = tmp_path / "nested.json"
    with p.open("wb") as f:
        f.write(head + b'{"id": 1}')
        block = b",[[1]]" * 100_000
        for _ in range(50 * MB // len(block)):
            f.write(block)
        f.write(b"]}")
    size = p.stat().st_size
    peak, code, err = _peak("info", str(p))
    assert code == 2 and err.count("\n") == 0 and f"{key}[1]" in err, err
    assert peak <= 4 * size, f"peak RSS {peak / MB:.0f} MB for a {size / MB:.0f} MB file"


def _expected(text: str) -> tuple[int, str] | None:
    """First non-object item of the top-level traceEvents, read with the standard json module."""
    doc = json.loads(text)
    ev = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(ev, list):
        return None
    for i, x in enumerate(ev):
        if not isinstance(x, dict):
            kinds = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
            return i, kinds.get(type(x), "a number")
    return None


@pytest.mark.parametrize("block", [scan._SCAN_BLOCK, 7, 1])
def test_prescan_agrees_with_json(monkeypatch, block):
    # blocks of 1 and 7 bytes put every string, escape run and item boundary across a block edge
    monkeypatch.setattr(scan, "_SCAN_BLOCK", block)
    rng = random.Random(block)
    scalars = [1, -2.5, 'a"]}[{\\', "\\", '\\\\"', True, None, "x", " " * 20, "traceEvents"]

    def value(depth: int) -> object:
        r = rng.random()
        if depth > 3 or r < 0.3:
            return rng.choice(scalars)
        if r < 0.6:
            return [value(depth + 1) for _ in range(rng.randrange(3))]
        return {rng.choice(["k", '"', "[", "traceEvents"]): value(depth + 1) for _ in range(rng.randrange(3))}

    for _ in range(600 if block > 1 else 200):
        items = [{"a": value(1)} if rng.random() < 0.9 else value(1) for _ in range(rng.randrange(6))]
        doc = {"x": value(1), "traceEvents": items, "y": value(1)}
        text = json.dumps(doc, indent=rng.choice([None, 1, 4]),
                          separators=rng.choice([None, (",", ":"), (" , ", " : "), (",\n\n   \t ", ":")]))
        assert first_non_object(text.encode(), "traceEvents") == _expected(text), text


def test_prescan_accepts_every_shared_kineto_trace():
    import gzip

    shared = Path(__file__).resolve().parents[2] / "shared" / "traces"
    paths = sorted(shared.glob("kineto/*/*.json.gz"))[:6]
    if not paths:
        pytest.skip("no shared traces")
    for p in paths:
        raw = gzip.decompress(p.read_bytes())
        assert first_non_object(raw, "traceEvents") == _expected(raw.decode("utf-8", "replace")), p


# Well-formed traces whose values nest huge arrays (every item an object): the parse would turn each
# 3-byte "[1]" into a ~100-byte Python list. Each case: (head, one filler event/node before the bulk,
# (head, a unit repeated to ~50 MB, tail, the item array's key, the index of the item holding the bulk).
_EV = b'{"ph":"X","name":"k","cat":"kernel","ts":1,"dur":1,"pid":0,"tid":7,"args":{"stream":7}}'
_DIMS = b'[' + b",".join([b"[[1,2],[3]]"] * 300) + b']'
_TYPES = b'[' + b",".join([b'"float"'] * 300) + b']'
_CAT = (b',{"ph":"X","name":"aten::cat","cat":"cpu_op","ts":5,"dur":1,"pid":0,"tid":1,'
        b'"args":{"Input Dims":' + _DIMS + b',"Input type":' + _TYPES + b'}}')
_ET_NODE = (b'{"id":%d,"name":"aten::cat","ctrl_deps":1,"inputs":{"values":[],"shapes":[],"types":[]},'
            b'"outputs":{"values":[],"shapes":[],"types":[]},"attrs":[')
_NESTED_CASES = {
    # one event whose args hold 50 MB of [[1],[2]]
    "kineto_args": (b'{"traceEvents":[' + b",".join([_EV] * 1000) +
                    b',{"ph":"X","name":"aten::cat","cat":"cpu_op","ts":5,"dur":1,"pid":0,"tid":1,"args":{"Input Dims":[',
                    b"[[1],[2]],", b"[0]]}}]}", "traceEvents", 1000),
    # many events, each with long Input Dims and Input type lists
    "kineto_many": (b'{"traceEvents":[' + _EV, _CAT, b"]}", "traceEvents", None),
    # a PyTorch ET node with a huge nested attribute value
    "pytorch_et": (b'{"schema":"1.1.0-chakra.0.0.4","pid":1,"time":"t","start_ts":1,"finish_ts":2,"nodes":[' +
                   (_ET_NODE % 1) + b']},' + (_ET_NODE % 2) + b'{"name":"x","type":"string","value":[',
                   b"[[1],[2]],", b"[0]]}]}]}", "nodes", 1),
    # a Chakra JSON node with a huge nested attribute
    "chakra_json": (b'{"global_metadata":{"version":"0.0.4"},"nodes":[{"id":0,"name":"a","type":"COMP_NODE"},'
                    b'{"id":1,"name":"b","type":"COMP_NODE","attr":[{"name":"x","int64List":{"values":[',
                    b"[[1],[2]],", b"[0]]}}]}]}", "nodes", 1),
    # an ASTRA-sim workload node with a huge nested field
    "astrasim_json": (b'{"workload_graph":[{"Id":0,"Name":"a","NodeType":4,"ctrlDeps":[],"data_deps":[],"runtime":1},'
                      b'{"Id":1,"Name":"b","NodeType":4,"ctrlDeps":[],"data_deps":[],"runtime":1,"x":[',
                      b"[[1],[2]],", b"[0]]}]}", "workload_graph", 1),
    # no item array at all (sniffed as Kineto by schemaVersion): the count still runs
    "kineto_no_events": (b'{"schemaVersion":1,"junk":[', b"[[1],[2]],", b"[0]]}", None, None),
}


def _write_nested(p: Path, case: str, size: int) -> None:
    head, unit, tail, _, _ = _NESTED_CASES[case]
    reps = (size - len(head)) // len(unit)
    block = unit * 10_000
    with p.open("wb") as f:
        f.write(head)
        for _ in range(reps // 10_000):
            f.write(block)
        f.write(unit * (reps % 10_000) + tail)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM is read from /proc")
@pytest.mark.parametrize("case", sorted(_NESTED_CASES))
def test_50mb_wellformed_nested_values_refused_within_4x(tmp_path, case):
    small = tmp_path / "small.json"
    _write_nested(small, case, 100_000)
    doc = json.loads(small.read_bytes())  # well-formed (the same text with fewer repeats)
    key, item = _NESTED_CASES[case][3:]
    assert key is None or all(isinstance(x, dict) for x in doc[key])
    p = tmp_path / f"{case}.json"
    _write_nested(p, case, 50 * MB)
    raw = p.read_bytes()
    size = len(raw)
    # no string in these files holds a bracket: every '[' and '{' is an array or object
    containers = raw.count(b"[") + raw.count(b"{")
    del raw
    peak, code, err = _peak("info", str(p))
    assert code == 2, err
    assert err.count("\n") == 0 and p.name in err, err
    assert f"{containers:,} nested arrays/objects" in err, err
    if item is not None:
        assert f"{key}[{item}]" in err, err
    elif key is not None:
        assert f"{key}[" in err, err
    assert peak <= 4 * size, f"peak RSS {peak / MB:.0f} MB for a {size / MB:.0f} MB file"


def test_small_nested_args_still_read(tmp_path):
    # dense nesting in a small file is no memory risk: read as before (2,000 events' args)
    from ettools.converters.kineto import read_kineto

    events = [{"ph": "X", "name": "aten::cat", "cat": "cpu_op", "ts": i, "dur": 1, "pid": 0, "tid": 1,
               "args": {"Input Dims": [[[1], [2]]] * 50}} for i in range(2000)]
    p = tmp_path / "small.json"
    p.write_text(json.dumps({"traceEvents": events}))
    assert p.stat().st_size > MB
    trace = read_kineto(p)
    assert sum(len(g) for g in trace.graphs.values()) >= 2000


def _containers(doc: object) -> int:
    stack, n = [doc], 0
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            n += 1
            stack.extend(x.values())
        elif isinstance(x, list):
            n += 1
            stack.extend(x)
    return n


@pytest.mark.parametrize("block", [scan._SCAN_BLOCK, 7, 1])
def test_container_count_agrees_with_json(monkeypatch, block):
    # brackets inside strings (and after escaped quotes) are not containers; blocks of 1 and 7 bytes
    # split every string and escape run
    monkeypatch.setattr(scan, "_SCAN_BLOCK", block)
    rng = random.Random(block + 1)
    scalars = [1, 'a"]}[{\\', "\\", '\\\\"', "[[", "{", True, None]

    def value(depth: int) -> object:
        r = rng.random()
        if depth > 4 or r < 0.3:
            return rng.choice(scalars)
        if r < 0.65:
            return [value(depth + 1) for _ in range(rng.randrange(4))]
        return {rng.choice(["k", "[", "traceEvents"]): value(depth + 1) for _ in range(rng.randrange(3))}

    for _ in range(300 if block > 1 else 100):
        doc = {"x": value(1), "traceEvents": [{"a": value(1)} for _ in range(rng.randrange(5))], "y": value(1)}
        text = json.dumps(doc, indent=rng.choice([None, 1])).encode()
        for key in ("traceEvents", None):
            assert scan.scan_shape(text, key).containers == _containers(doc), text


def test_shared_traces_pass_the_density_check():
    import gzip

    shared = Path(__file__).resolve().parents[2] / "shared" / "traces"
    paths = sorted(shared.glob("*/*/*.json.gz")) + sorted(shared.glob("astrasim_json/*.json"))
    if not paths:
        pytest.skip("no shared traces")
    for p in paths[::3]:  # a third of them: every format is there, the test stays short
        raw = p.read_bytes()
        raw = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        key = next((k for k in ("traceEvents", "workload_graph", "nodes") if f'"{k}"'.encode() in raw), None)
        scan.check_items_are_objects(p, raw, key) if key else scan.check_json_shape(p, raw)
        assert scan.scan_shape(raw, key).containers == _containers(json.loads(raw)), p
