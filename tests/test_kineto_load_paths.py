"""The fast Kineto load paths give what the plain ones give.

The block reader (``_extract_blocks``: phases read as one string, fields straight into codes, flow
ends and kernel geometry read while their block is in cache) must build the same graph as the
event-by-event checked reader, which reads every field with its own pass over the events; the start
order, the fwdbwd binding and the serving-step top level are checked against the plain numpy
formulations they replace (``np.lexsort``, a per-flow dict, ``prev_ge``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from shared_kineto import read_json

from ettools.converters import kineto as K
from ettools.converters import kineto_events as KE
from ettools.replayable import prev_ge

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
TRACES = ["kineto/hta_nccl_2rank/rank0.json.gz", "kineto/hta_fwdbwd_1rank/rank0.json.gz",
          "kineto/tracelens_mi210_gpu_only/rank0.json.gz", "kineto/tb_resnet50_v100_legacy/rank0.json.gz"]


def _graph_state(trace: object) -> list[object]:
    out: list[object] = []
    for r, g in trace.graphs.items():  # type: ignore[attr-defined]
        cols = {k: v.tolist() for k, v in g.columns.items()}
        attrs = {k: (a.kind, a.rows.tolist(), list(a.values)) for k, a in sorted(g.attrs.items())}
        meta = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in g.meta.items() if k != "memory"}
        out.append((r, cols, g.dep_ptr.tolist(), g.dep_id.tolist(), g.dep_kind.tolist(), attrs, repr(meta)))
    return out


@pytest.mark.parametrize("name", TRACES)
def test_block_reader_builds_the_checked_readers_graph(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = SHARED / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    fast = K.read_kineto(path)
    calls = []

    def irregular(*args: object) -> KE.Events:
        calls.append(1)
        raise KE._Irregular

    monkeypatch.setattr(KE, "_extract_blocks", irregular)  # every file through the checked reader
    slow = K.read_kineto(path)
    assert calls, "the checked reader was not used"
    assert _graph_state(fast) == _graph_state(slow)
    # the fwdbwd flows of the raw file bind as many CTRL edges on both paths (read from the JSON)
    raw = read_json(path)["traceEvents"]
    flows = [e for e in raw if e.get("cat") == "fwdbwd"]
    ctrl = sum(int((g.dep_kind == int(K.EdgeKind.CTRL)).sum()) for g in fast)
    assert ctrl <= len({e.get("id") for e in flows})


def test_start_order_is_lexsort_by_start_then_longer_first() -> None:
    rng = np.random.default_rng(7)
    for _ in range(500):
        n = int(rng.integers(0, 80))
        ts = rng.integers(0, int(rng.integers(1, 30)), n) * rng.choice([1.0, 0.5, 1e-3])
        dur = rng.integers(0, 5, n).astype(np.float64)
        assert (KE.start_order(ts, dur) == np.lexsort((-dur, ts))).all()


def test_top_level_by_running_max_is_prev_ge() -> None:
    rng = np.random.default_rng(3)
    for _ in range(500):
        n = int(rng.integers(1, 60))
        end = rng.integers(0, 12, n).astype(np.float64) / rng.choice([1, 4])
        top = np.ones(n, bool)
        top[1:] = np.maximum.accumulate(end)[:-1] < end[1:]
        assert (top == (prev_ge(end, end) < 0)).all()
