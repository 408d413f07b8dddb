"""Memory on big input: a Kineto file whose events are not objects is refused from its raw bytes,
before a parse that would cost ~40x its size; the pre-scan agrees with ``json`` on random documents."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

import ettools.io as eio
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


@pytest.mark.parametrize("block", [eio._SCAN_BLOCK, 7, 1])
def test_prescan_agrees_with_json(monkeypatch, block):
    # blocks of 1 and 7 bytes put every string, escape run and item boundary across a block edge
    monkeypatch.setattr(eio, "_SCAN_BLOCK", block)
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
