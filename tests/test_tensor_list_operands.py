"""Tensor-list operands (``aten::cat``, ``aten::stack``, ``_foreach_*``): the profiler records a
``TensorList`` argument by its elements' shapes and no dtype. Their bytes used to count as zero, so
every concatenation (the KV-cache and rotary ``cat`` of Hugging Face decoders) was timed at the
launch floor, by the emulated capture and by ``replay --system``. The elements now take the trace's
dominant floating dtype. Expected bytes are computed here from the raw trace's own fields."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest

from ettools.replay.opfeatures import MEMORY, dominant_float_type, op_features
from ettools.replay.opsamples import kineto_op_samples

REPO = Path(__file__).resolve().parents[1]
GPT2_H200 = REPO / "sample_traces" / "hf_h200" / "gpt2.json.gz"  # a real H200 capture (sample_traces/README.md)
QWEN_H100 = REPO.parent / "shared" / "traces" / "hardware_pairs" / "qwen1.5_0.5b" / "h100.json.gz"  # TraceLens
BYTES = {"c10::BFloat16": 2, "c10::Half": 2, "float": 4}


def test_cat_of_a_tensor_list_moves_its_elements_twice():
    """A concatenation reads every element and writes their sum: 2 × the elements' bytes in the
    given element type; without one the op stays unsized (no invented dtype)."""
    dims, types = [[[0], [8, 12, 1024, 64]], []], ["TensorList", "Scalar"]
    f = op_features("aten::cat", dims, types, ["", "-2"], "c10::BFloat16")
    assert f.cls == MEMORY and f.dtype == "half"
    assert f.nbytes == 2 * 8 * 12 * 1024 * 64 * 2
    assert op_features("aten::cat", dims, types, ["", "-2"], "float").nbytes == 2 * 8 * 12 * 1024 * 64 * 4
    assert op_features("aten::cat", dims, types, ["", "-2"]).nbytes == 0


def test_dominant_float_type_counts_only_floating_arguments():
    lists = [["c10::BFloat16", "c10::BFloat16", "long int"], ["float", "Scalar"], ["c10::BFloat16"], "junk", None]
    assert dominant_float_type(lists) == "c10::BFloat16"
    assert dominant_float_type([["long int", "bool"], ["TensorList"]]) is None


def _raw_cats(path: Path) -> tuple[list[dict], str]:
    """The trace's ``aten::cat`` ops with tensor-list operands, and its most common floating
    ``Input type`` (counted here over the raw events)."""
    ev = [e for e in json.loads(gzip.open(path).read())["traceEvents"] if e.get("ph") == "X"]
    counts: dict[str, int] = {}
    for e in ev:
        if e.get("cat") == "cpu_op":
            for t in (e.get("args") or {}).get("Input type") or []:
                if t in BYTES:
                    counts[t] = counts.get(t, 0) + 1
    cats = [e for e in ev if e.get("cat") == "cpu_op" and e["name"] == "aten::cat"
            and ((e.get("args") or {}).get("Input type") or [None])[0] == "TensorList"]
    return cats, max(counts, key=counts.__getitem__)


@pytest.mark.parametrize("path", [GPT2_H200, QWEN_H100], ids=["gpt2_h200", "qwen_h100"])
def test_real_trace_concatenations_are_sized_samples(path: Path):
    """On real traces every tensor-list ``cat`` that launched a kernel is an op sample whose bytes
    are twice its elements' in the trace's dtype (GPT-2's KV-cache concatenation on our H200
    capture, Qwen's rotary concatenation on a TraceLens H100 trace), not a launch floor."""
    if not path.exists():
        pytest.skip(f"{path.name} not present")
    cats, dtype = _raw_cats(path)
    assert dtype == "c10::BFloat16" and len(cats) >= 12
    expect = sorted(2.0 * sum(math.prod(s) for s in c["args"]["Input Dims"][0]) * BYTES[dtype] for c in cats)
    s, _ = kineto_op_samples(path)
    c = s.arrays()
    mine = np.asarray(c["name"]) == "aten::cat"
    assert int(mine.sum()) == len(cats)
    assert sorted(c["nbytes"][mine].tolist()) == pytest.approx(expect)
    by = c["nbytes"][mine]
    assert (by > 0).all() and np.median(by) > 1e6  # megabytes per layer, not a launch floor
