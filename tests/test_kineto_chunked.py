"""The Kineto reader's chunked parse (issue 26: memory ≤ 4x the input) reads what a whole parse reads.

``ettools/json_chunks.py`` parses a file's ``traceEvents`` a slice of text at a time, cut where the
byte pre-scan saw items begin, and the block reader keeps no event objects. Checked here: the
graphs equal those of the whole-document parse on real traces, cut into many small slices; the
documents where a cut is unsafe (two ``traceEvents`` keys, a non-list, trailing bytes, invalid
JSON inside an event) are parsed whole, with the whole parse's result or error; the one-buffer
gunzip gives ``gzip.decompress``'s bytes or defers to it; and ``info`` on a large shared trace
peaks within 4x its uncompressed size.
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ettools.io as eio
import ettools.json_chunks as KL
import ettools.json_scan as scan
from ettools.converters import kineto as K
from ettools.errors import TraceError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
TRACES = ["kineto/hta_nccl_2rank/rank0.json.gz", "kineto/hta_cpu_only_gloo/rank34.json.gz",
          "kineto/hta_event_sync_multistream/rank0.json.gz", "et_kineto/hta_simple_add/kineto.json.gz",
          "et_kineto/triosim_vgg13_h100/kineto.json.gz"]  # the last with [memory] events


def _state(trace: K.Trace) -> str:
    """Everything a graph holds, as text (NaN compares equal to NaN in text)."""
    out: list[object] = [repr(trace.meta)]
    for r, g in trace.graphs.items():
        cols = {k: v.tolist() for k, v in g.columns.items()}
        attrs = {k: (a.kind, a.rows.tolist(), list(a.values)) for k, a in sorted(g.attrs.items())}
        meta = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in g.meta.items() if k != "memory"}
        mem = {k: v.tolist() for k, v in g.meta.get("memory", {}).items()}
        out.append((r, cols, g.dep_ptr.tolist(), g.dep_id.tolist(), g.dep_kind.tolist(), attrs, meta, mem))
    return repr(out)


def _whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(KL, "_cut", lambda bounds: None)  # every file parsed as one document


@pytest.mark.parametrize("name", TRACES)
def test_small_slices_read_what_the_whole_parse_reads(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = SHARED / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    with monkeypatch.context() as m:
        _whole(m)
        whole = _state(K.read_kineto(path))
    seen: list[int] = []
    load = KL.load_chunked

    def counting(p: Path, key: str) -> tuple[object, KL.ItemChunks | None]:
        data, chunks = load(p, key)
        assert chunks is not None, "the shared trace was not cut"
        seen.append(len(chunks.starts))
        return data, chunks

    # a cut at the first item of every 1 KB scan block: up to thousands of slices
    monkeypatch.setattr(scan, "_SCAN_BLOCK", 1024)
    monkeypatch.setattr(KL, "CHUNK_BYTES", 1)
    monkeypatch.setattr(K, "load_chunked", counting)
    assert _state(K.read_kineto(path)) == whole
    assert seen and seen[0] >= 2


def _doc(events: list[dict], **extra: object) -> dict:
    return {"schemaVersion": 1, "traceEvents": events, **extra}


_EV = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "ts": i * 10, "dur": 5, "pid": 1, "tid": 1,
        "args": {"External id": i}} for i in range(50)]


def _write(p: Path, text: str) -> Path:
    p.write_text(text)
    return p


def test_a_cut_is_made_only_when_it_is_safe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(KL, "CHUNK_BYTES", 1)
    plain = _write(tmp_path / "a.json", json.dumps(_doc(_EV, deviceProperties=[{"name": "x"}]), indent=1))
    data, chunks = KL.load_chunked(plain, "traceEvents")
    assert chunks is not None and data["traceEvents"] == [] and data["deviceProperties"] == [{"name": "x"}]
    events = [e for c in chunks for e in c]
    assert events == _EV
    # a second traceEvents key (the last wins in a parse), a non-list, an empty list, trailing garbage
    dup = '{"traceEvents": [' + json.dumps(_EV[0]) + '], "traceEvents": [' + json.dumps(_EV[1]) + "]}"
    for text, whole in ((dup, True), ('{"traceEvents": 5}', True), ('{"traceEvents": []}', False)):
        data, chunks = KL.load_chunked(_write(tmp_path / "b.json", text), "traceEvents")
        assert (chunks is None) == whole, text
        assert whole or data["traceEvents"] == []
    assert KL.load_chunked(_write(tmp_path / "b.json", dup), "traceEvents")[0]["traceEvents"] == [_EV[1]]
    with pytest.raises(TraceError, match="not valid JSON"):
        KL.load_chunked(_write(tmp_path / "c.json", json.dumps(_doc(_EV)) + " x"), "traceEvents")


def test_invalid_json_inside_an_event_gets_the_whole_parse_error(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    text = json.dumps(_doc(_EV)).replace('"op30"', '"op30\\q"')  # a bad escape, deep in the array
    p = _write(tmp_path / "bad.json", text)
    with monkeypatch.context() as m:
        _whole(m)
        with pytest.raises(TraceError) as whole:
            K.read_kineto(p)
    monkeypatch.setattr(KL, "CHUNK_BYTES", 1)
    with pytest.raises(TraceError) as chunked:
        K.read_kineto(p)
    assert str(chunked.value) == str(whole.value) and "not valid JSON" in str(whole.value)


def test_an_irregular_event_in_a_later_slice_goes_to_the_checked_reader(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    ev = [dict(e) for e in _EV]
    del ev[40]["dur"]  # named by the checked reader with its index in traceEvents
    ev[45]["ts"] = 1e30  # (the first problem found is the missing field)
    p = _write(tmp_path / "irr.json", json.dumps(_doc(ev)))
    monkeypatch.setattr(KL, "CHUNK_BYTES", 1)
    with pytest.raises(TraceError, match=r"traceEvents\[40\] \(ph X\) has no 'dur' field"):
        K.read_kineto(p)
    del ev[40]
    p = _write(tmp_path / "irr.json", json.dumps(_doc(ev)))
    with pytest.raises(TraceError, match=r"traceEvents\[44\] \(ph X\) has ts 1e\+30"):
        K.read_kineto(p)  # the block reader's rows know their event's index


def test_one_buffer_gunzip_gives_gzip_decompress_bytes(tmp_path: Path) -> None:
    raw = json.dumps(_doc(_EV * 400)).encode()
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(raw))
    out = KL.read_text(p)
    assert isinstance(out, bytearray) and out == raw
    # two members and trailing garbage: read_bytes decides, as before
    p.write_bytes(gzip.compress(raw[:100]) + gzip.compress(raw[100:]))
    assert KL.read_text(p) == raw
    p.write_bytes(gzip.compress(raw)[:-30])
    with pytest.raises(TraceError) as ours:
        KL.read_text(p)
    with pytest.raises(TraceError) as theirs:
        eio.read_bytes(p)
    assert str(ours.value) == str(theirs.value)
    q = tmp_path / "plain.json"
    q.write_bytes(raw)
    assert KL.read_text(q) == raw


def _largest_kineto() -> Path | None:
    paths = sorted(SHARED.glob("kineto/*/*.json.gz"), key=lambda p: (-p.stat().st_size, str(p)))
    return paths[0] if paths else None


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM is read from /proc")
def test_info_of_a_large_shared_trace_peaks_within_4x_its_size() -> None:
    path = _largest_kineto()
    if path is None:
        pytest.skip("no shared traces")
    size = len(gzip.decompress(path.read_bytes()))
    code = ("import re, sys\nfrom ettools.cli import main\ntry:\n    main(sys.argv[1:], prog_name='ettools')\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "print('PEAK', re.search(r'VmHWM:\\s*(\\d+) kB', open('/proc/self/status').read()).group(1))")
    res = subprocess.run([sys.executable, "-c", code, "info", str(path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    peak = int(re.search(r"PEAK (\d+)", res.stdout).group(1)) * 1024
    assert size > 20 << 20, f"{path} is no large trace ({size} bytes)"
    assert peak <= 4 * size, f"info peaks at {peak / 2**20:.0f} MB for {size / 2**20:.1f} MB of JSON ({path})"


def test_events_without_args_cat_or_tid_stay_on_the_block_reader(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # optional fields take the checked reader's defaults (no args, cat "", tid 0) without sending
    # the file to it (which reads the whole document at once)
    from ettools.converters import kineto_events as KE

    ev = [dict(e) for e in _EV]
    for e in ev[::3]:
        del e["args"]
    del ev[4]["cat"], ev[5]["tid"]
    ev.append({"ph": "X", "cat": "kernel", "name": "k", "ts": 12, "dur": 3, "pid": 0, "tid": 7})
    p = _write(tmp_path / "opt.json", json.dumps(_doc(ev)))
    with monkeypatch.context() as m:
        def irregular(*args: object) -> KE.Events:
            raise KE._Irregular

        m.setattr(KE, "_extract_blocks", irregular)
        checked = _state(K.read_kineto(p))
    monkeypatch.setattr(KL, "CHUNK_BYTES", 1)

    def full(self: KL.ItemChunks) -> object:
        raise AssertionError("read as a whole document")

    monkeypatch.setattr(KL.ItemChunks, "full", full)
    assert _state(K.read_kineto(p)) == checked
