"""The PyTorch ET reader on nodes parsed a slice at a time (issue 26: memory) reads what the
whole-document read reads: the same graphs on real ETs cut into small slices (without falling back
to the whole read), and the same errors for malformed nodes (it falls back and names them)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ettools.json_chunks as J
import ettools.json_scan as scan
from ettools.converters.pytorch_et import read_pytorch_et
from ettools.errors import TraceError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
ETS = ["et_kineto/param_linear/et.json.gz", "et_kineto/hta_simple_add/et.json.gz",
       "et_kineto/param_dlrm_8rank/et", "pytorch_et/chakra_2rank_nccl/rank0_et.json.gz"]


def _state(trace: object) -> str:
    out: list[object] = [repr(trace.meta)]  # type: ignore[attr-defined]
    for r, g in trace.graphs.items():  # type: ignore[attr-defined]
        cols = {k: v.tolist() for k, v in g.columns.items()}
        attrs = {k: (a.kind, a.rows.tolist(), list(a.values)) for k, a in sorted(g.attrs.items())}
        meta = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in g.meta.items()}
        t = g.tensors
        tensors = [getattr(t, k).tolist() for k in ("tensor_id", "storage_id", "offset", "numel", "elem_bytes",
                                                      "dtype", "device", "shape_ptr", "dims")]
        io = [getattr(g, k).tolist() for k in ("in_ptr", "in_tensor", "out_ptr", "out_tensor")]
        out.append((r, cols, g.dep_ptr.tolist(), g.dep_id.tolist(), g.dep_kind.tolist(), attrs, meta, tensors, io))
    return repr(out)


def _no_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    def full(self: J.ItemChunks) -> object:
        raise AssertionError(f"{self.path}: read as a whole document")

    monkeypatch.setattr(J.ItemChunks, "full", full)


@pytest.mark.parametrize("name", ETS)
def test_small_slices_read_what_the_whole_read_reads(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = SHARED / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    with monkeypatch.context() as m:
        m.setattr(J, "_cut", lambda bounds: None)  # parsed whole
        whole = _state(read_pytorch_et(path))
    monkeypatch.setattr(scan, "_SCAN_BLOCK", 1024)
    monkeypatch.setattr(J, "CHUNK_BYTES", 1)  # a slice per 1 KB scan block
    _no_fallback(monkeypatch)
    assert _state(read_pytorch_et(path)) == whole


def _node(i: int, **extra: object) -> dict:
    n = {"id": i, "name": f"aten::op{i}", "ctrl_deps": 1,
         "inputs": {"values": [[i, i, 0, 4, 4, "cuda:0"]], "shapes": [[4]], "types": ["Tensor(float)"]},
         "outputs": {"values": [], "shapes": [], "types": []},
         "attrs": [{"name": "rf_id", "type": "uint64", "value": i}, {"name": "tid", "type": "uint64", "value": 1}]}
    n.update(extra)
    return n


def _et(nodes: list[dict]) -> dict:
    root = {"id": 1, "name": "[pytorch|profiler|execution_trace|thread]", "ctrl_deps": 0,
            "inputs": {"values": [], "shapes": [], "types": []}, "outputs": {"values": [], "shapes": [], "types": []},
            "attrs": []}
    return {"schema": "1.1.0-chakra.0.0.4", "pid": 1, "time": "t", "start_ts": 0, "finish_ts": 1,
            "nodes": [root, *nodes]}


_BAD = {  # (node 42's defect, the node named)
    # no "type": read only for a new column (rf_id is one after node 2: node 61 is named)
    "attr type": ({"attrs": [{"name": "rf_id", "value": 1}]}, "(id 61)"),
    "attr type, new column": ({"attrs": [{"name": "other", "value": 1}]}, "(id 42)"),
    "attr name": ({"attrs": [{"name": 7, "type": "uint64", "value": 1}]}, "(id 42)"),
    "attrs list": ({"attrs": 5}, "(id 42)"),
    "tensor": ({"inputs": {"values": [[1, 2, [0], 4, 4, "cuda:0"]], "shapes": [[4]],
                           "types": ["Tensor(float)"]}}, "(id 42): malformed tensor value"),
    "tensor numel": ({"inputs": {"values": [[1, 2, 0, "x", 4, "cuda:0"]], "shapes": [[4]],
                                 "types": ["Tensor(float)"]}}, "tensor [1, 2, 0, 'x'"),
    "huge tensor": ({"inputs": {"values": [[1, 2, 0, 1 << 62, 8, "cuda:0"]], "shapes": [[4]],
                                "types": ["Tensor(float)"]}}, "tensor [1, 2, 0, 4611686018427387904, 8"),
    "io": ({"outputs": [1, 2]}, "(id 42)"),
}


@pytest.mark.parametrize("case", sorted(_BAD))
def test_a_malformed_node_is_named_as_by_the_whole_read(case: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = [_node(i) for i in range(2, 60)]
    defect, named = _BAD[case]
    nodes[40] = _node(42, **defect)
    nodes.append(_node(61, **_BAD["attr name"][0]))  # a second problem, later in id order
    nodes.reverse()  # file order is not id order: the whole read names the first in id order
    p = tmp_path / "et.json"
    p.write_text(json.dumps(_et(nodes)))
    with monkeypatch.context() as m:
        m.setattr(J, "_cut", lambda bounds: None)
        with pytest.raises(TraceError) as whole:
            read_pytorch_et(p)
    monkeypatch.setattr(J, "CHUNK_BYTES", 1)
    with pytest.raises(TraceError) as chunked:
        read_pytorch_et(p)
    assert str(chunked.value) == str(whole.value)
    assert named in str(whole.value), str(whole.value)
