"""TrioSim's published extrapolation semantics on TrioSim CSVs: TP by the ``tpflag`` column, PP's
equal-op-count split, batch rescaling by per-kind regression, standard DP after backward — on the
VGG-13 sample and on a synthetic 3-layer MLP written here (a model not under ../shared).

Expected values are computed here from the CSV files with the csv module and numpy.
"""

from __future__ import annotations

import ast
import csv
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ettools.checks import verify
from ettools.cli import main
from ettools.formats import load_trace
from ettools.graph import CollectiveType, NodeType
from ettools.replay import replay_trace
from ettools.scaler import scale_trace


def _ids(cell: str) -> list[int]:
    body = cell.strip()[1:-1].replace(" ", "")
    return [int(x) for x in body.split(";")] if body else []


def _read(d: Path) -> dict:
    """The CSV pair as plain Python: op rows, and per tensor id its last row (as TrioSim resolves ids)."""
    with open(d / "tensor.csv", newline="") as f:
        trows = list(csv.DictReader(f))
    with open(d / "trace.csv", newline="") as f:
        ops = list(csv.DictReader(f))
    last = {int(r["TensorID"]): r for r in trows}
    roles: dict[int, set[str]] = {}
    for r in trows:
        roles.setdefault(int(r["TensorID"]), set()).add(r["TensorType"])
    nbytes = {t: int(r["TensorNumElement"]) * int(r["TensorEachByte"]) for t, r in last.items()}
    numel = {t: int(r["TensorNumElement"]) for t, r in last.items()}
    shape = {t: ast.literal_eval(r["TensorShape"]) for t, r in last.items()}
    storage = {t: int(r["TensorStorgeid"]) for t, r in last.items()}
    return {"ops": ops, "nbytes": nbytes, "numel": numel, "shape": shape, "storage": storage, "roles": roles}


@pytest.fixture(scope="module")
def raw(trio_dir: Path) -> dict:
    return _read(trio_dir)


def _colls(g, kind=CollectiveType.ALL_REDUCE) -> list[tuple[str, int]]:
    names = g.names()
    rows = np.flatnonzero((g.type == NodeType.COMM_COLL_NODE) & (g.comm_type == kind))
    return [(names[r], int(g.comm_bytes[r])) for r in rows.tolist()]


def _expected_tp(raw: dict) -> tuple[list[int], list[int]]:
    """(forward all-reduce bytes in op order, backward all-reduce bytes sorted), from the CSV alone.

    Forward: every flagged forward op's output bytes. Backward: one all-reduce per flagged layer
    of its input gradient, shaped like the layer's activation input (first input); none for a
    layer whose input no op wrote (the data batch).
    """
    ops = raw["ops"]
    written = {raw["storage"][t] for r in ops for t in _ids(r["Operator_output"])}
    fwd = [r for r in ops if r["stage"] == "forward" and r["tpflag"] == "1"]
    f_bytes = [sum(raw["nbytes"][t] for t in _ids(r["Operator_output"])) for r in fwd]
    b_bytes = sorted(raw["nbytes"][_ids(r["Operator_input"])[0]] for r in fwd
                     if raw["storage"][_ids(r["Operator_input"])[0]] in written)
    return f_bytes, b_bytes


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_allreduces_the_flagged_ops_outputs(trio, raw, tp):
    out = scale_trace(trio, tp=tp)
    assert out.meta.world_size == tp and verify(out) == []
    f_bytes, b_bytes = _expected_tp(raw)
    assert len(f_bytes) == 13  # VGG-13: 10 conv + 3 linear flagged in forward
    for g in out.graphs.values():
        c = _colls(g)
        assert [b for n, b in c if n.endswith(".fwd")] == f_bytes
        assert sorted(b for n, b in c if n.endswith(".bwd")) == b_bytes
        assert len(c) == len(f_bytes) + len(b_bytes)
    # flagged ops run 1/tp of their recorded time, the others all of it
    g = out.graphs[0]
    dur = {int(i): float(d) for i, d, t in zip(g.id, g.dur, g.type) if t == NodeType.COMP_NODE}
    for r in raw["ops"]:
        if r["stage"] == "optimizer":
            continue
        want = float(r["Operator_cudatimenooverlap"]) / (tp if r["tpflag"] == "1" else 1)
        assert dur[int(r["OperatorID"])] == pytest.approx(want)


def test_tp_then_dp_reduces_the_split_gradients(trio, raw):
    # every parameter of VGG-13 belongs to a flagged layer: DDP all-reduces half of each gradient
    params = [t for r in raw["ops"] if r["stage"] == "forward" and r["tpflag"] == "1"
              for t in _ids(r["Operator_input"])[1:]]
    out = scale_trace(trio, tp=2, dp=2)
    assert out.meta.world_size == 4 and verify(out) == []
    for g in out.graphs.values():
        dp_bytes = sum(b for n, b in _colls(g) if not n.startswith("all_reduce tp."))
        assert dp_bytes == sum(raw["nbytes"][t] for t in params) // 2


def _fwd_counts(out) -> list[int]:
    counts = []
    for p in range(out.meta.world_size):
        g = out.graphs[p]
        names = g.names()
        comp = np.flatnonzero(g.type == NodeType.COMP_NODE)
        counts.append(sum(1 for r in comp.tolist() if not names[r].startswith(("autograd::", "aten::_foreach"))))
    return counts


@pytest.mark.parametrize("pp", [2, 3, 4])
def test_pp_equal_op_split(trio, raw, pp):
    n_fwd = sum(r["stage"] == "forward" for r in raw["ops"])
    out = scale_trace(trio, pp=pp, micro_batches=1, pp_split="ops")
    assert verify(out) == []
    counts = _fwd_counts(out)
    assert sum(counts) == n_fwd and max(counts) - min(counts) <= 1
    timed = _fwd_counts(scale_trace(trio, pp=pp, micro_batches=1))
    assert sum(timed) == n_fwd and timed != counts  # the time-balanced split is another one


def _no_batch(raw: dict) -> set[int]:
    """Tensor ids without a batch dimension: parameters, backward outputs shaped like a parameter
    (their gradients), and everything the optimizer touches."""
    params = {t for t, roles in raw["roles"].items() if roles & {"weight", "bias=None"}}
    pshapes = {tuple(raw["shape"][t]) for t in params}
    out = set(params)
    for r in raw["ops"]:
        if r["stage"] == "backward":
            out |= {t for t in _ids(r["Operator_output"]) if tuple(raw["shape"][t]) in pshapes}
        elif r["stage"] == "optimizer":
            out |= set(_ids(r["Operator_input"]) + _ids(r["Operator_output"]))
    return out


def _regression_ratio(raw: dict, batch: int, new: int) -> dict[int, float]:
    """Per op id: duration ratio from a per-kind line fitted here with numpy on the CSV's own rows.

    ``x`` is the elements of the op's batch-carrying tensors (first dimension the batch, not shaped
    like a weight or bias); time = a + b·x by least squares per OperatorName, a negative intercept
    refitted through the origin, a kind at one size in proportion to x.
    """
    def carries(t: int) -> bool:
        s = raw["shape"][t]
        return bool(s) and s[0] == batch and t not in _no_batch(raw)

    x = {}
    for r in raw["ops"]:
        ts = _ids(r["Operator_input"]) + _ids(r["Operator_output"])
        x[int(r["OperatorID"])] = float(sum(raw["numel"][t] for t in ts if carries(t)))
    by_kind: dict[str, list[dict]] = {}
    for r in raw["ops"]:
        if x[int(r["OperatorID"])] > 0 and float(r["Operator_cudatimenooverlap"]) > 0:
            by_kind.setdefault(r["OperatorName"], []).append(r)
    out = {}
    k = new / batch
    for rows in by_kind.values():
        xs = np.array([x[int(r["OperatorID"])] for r in rows])
        ts = np.array([float(r["Operator_cudatimenooverlap"]) for r in rows])
        a, b = 0.0, ts.sum() / xs.sum()
        if len(set(xs.tolist())) >= 2:
            b1, a1 = np.polyfit(xs, ts, 1)
            if a1 < 0:
                a1, b1 = 0.0, float(xs @ ts / (xs @ xs))
            if b1 > 0:
                a, b = a1, b1
        for r, xi in zip(rows, xs):
            out[int(r["OperatorID"])] = (a + b * k * xi) / (a + b * xi)
    return out


def test_batch_rescale_by_regression(trio, raw):
    out = scale_trace(trio, batch=256)
    assert verify(out) == []
    g0, g = trio.graphs[0], out.graphs[0]
    want = _regression_ratio(raw, 128, 256)
    assert len(want) > 50
    ratio = {int(i): float(d1) / float(d0) for i, d0, d1 in zip(g0.id, g0.dur, g.dur) if d0 > 0}
    for oid, w in want.items():
        assert ratio[oid] == pytest.approx(w, rel=1e-6), oid
    # compute grows, sublinearly overall (small ops keep their floor), the optimizer not at all
    assert 1.3 < g.dur.sum() / g0.dur.sum() < 2.0
    for r in raw["ops"]:
        if r["stage"] == "optimizer":
            assert ratio[int(r["OperatorID"])] == pytest.approx(1.0)
        if r["OperatorName"].endswith("AddmmBackward0"):  # recorded with its weight only: its forward's ratio
            assert ratio[int(r["OperatorID"])] > 1.0
    # activations forward ops write doubled on their batch dimension; parameters and gradients unchanged
    t0, t1 = g0.tensors, g.tensors
    nob = _no_batch(raw)
    written = {t for r in raw["ops"] if r["stage"] == "forward" for t in _ids(r["Operator_output"])}
    rows = np.unique(g0.out_tensor)
    ids = t0.tensor_id[rows]
    act = np.array([int(i) in written and int(i) not in nob and t0.shape(int(x))[:1] == (128,)
                    for i, x in zip(ids, rows)])
    assert act.sum() > 15
    assert (t1.numel[rows[act]] == 2 * t0.numel[rows[act]]).all()
    fixed = np.flatnonzero(np.isin(t0.tensor_id, sorted(nob)))
    assert (t1.numel[fixed] == t0.numel[fixed]).all()


def _ancestors(g, row: int) -> set[int]:
    src, dst, _ = g.edge_rows()
    preds: dict[int, list[int]] = {}
    for s, d in zip(src.tolist(), dst.tolist()):
        if s >= 0:
            preds.setdefault(d, []).append(s)
    seen, stack = set(), [row]
    while stack:
        for p in preds.get(stack.pop(), []):
            if p not in seen:
                seen.add(p)
                stack.append(p)
    return seen


def test_standard_dp_cli_reduces_after_the_last_backward_op(trio_dir: Path, raw, tmp_path: Path):
    res = CliRunner().invoke(main, ["scale", str(trio_dir), "--dp", "2", "--dp-after-backward", "-o",
                                    str(tmp_path / "o"), "-q"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["scale", str(trio_dir), "--pp-split", "ops", "-o", str(tmp_path / "p")])
    assert res.exit_code == 2 and "--pp" in res.output
    tr = load_trace([trio_dir]).trace
    out = scale_trace(tr, dp=2, dp_overlap=False)
    last_bwd = max(int(r["OperatorID"]) for r in raw["ops"] if r["stage"] == "backward")
    for g in out.graphs.values():
        lb = int(g.rows_of(np.asarray([last_bwd], np.uint64))[0])
        coll = np.flatnonzero(g.type == NodeType.COMM_COLL_NODE)
        assert len(coll)
        for c in coll.tolist():  # every all-reduce waits for the whole backward pass
            assert lb in _ancestors(g, c)
    # DDP (the default) launches its first bucket before the backward pass ends
    g = scale_trace(tr, dp=2).graphs[0]
    lb = int(g.rows_of(np.asarray([last_bwd], np.uint64))[0])
    first = np.flatnonzero(g.type == NodeType.COMM_COLL_NODE)[0]
    assert lb not in _ancestors(g, int(first))


# ---- another model: a 3-layer MLP written here in TrioSim's format ----------------------------------

def _mlp_csv(d: Path, batch: int = 32, widths=(64, 128, 96, 10)) -> Path:
    """A TrioSim trace of a 3-layer MLP (linear-relu-linear-relu-linear, cross-entropy, backward, SGD).

    Backward ops record their full tensors (grad_out, input, weight -> grad_in, grad_w, grad_b; no
    grad_in for the first layer); op
    times grow with the work, plus a small per-op floor.
    """
    d.mkdir()
    tens = [["Index", "TensorID", "TensorShape", "TensorNumElement", "TensorEachByte", "TensorType",
             "TensorStorgeid", "gpuid"]]
    ops = [["OperatorID", "OperatorName", "Operator_input", "Operator_output", "Operator_cudatime",
            "Operator_cudatimenooverlap", "InputSize", "OutputSize", "gpuid", "stage", "tpflag"]]
    shapes: dict[int, list[int]] = {}
    nid = [1]

    def t(shape: list[int], role: str) -> int:
        i = nid[0]
        nid[0] += 1
        shapes[i] = shape
        tens.append([len(tens) - 1, i, str(shape), int(np.prod(shape)), 4, role, i + 10000, 0])
        return i

    def op(name: str, ins: list[int], outs: list[int], stage: str, flag: int, us: float) -> None:
        sz = lambda ts: "[" + "; ".join(str(int(np.prod(shapes[x]))) for x in ts) + "]"  # noqa: E731
        lst = lambda ts: "[" + "; ".join(map(str, ts)) + "]"  # noqa: E731
        ops.append([len(ops), name, lst(ins), lst(outs), us, us, sz(ins), sz(outs), 0, stage, flag])

    x = t([batch, widths[0]], "input")
    params, acts, outs_ = [], [x], []
    for i in range(3):
        w, b = t([widths[i + 1], widths[i]], "weight"), t([widths[i + 1]], "bias=None")
        y = t([batch, widths[i + 1]], "output")
        op("aten::linear", [acts[-1], w, b], [y], "forward", 1, 2.0 + batch * widths[i] * widths[i + 1] / 2e4)
        params += [w, b]
        outs_.append(y)
        if i < 2:
            z = t([batch, widths[i + 1]], "output")
            op("aten::relu", [y], [z], "forward", 0, 1.0 + batch * widths[i + 1] / 1e4)
            acts.append(z)
    tgt = t([batch], "target")
    loss = t([1], "output")
    op("aten::cross_entropy_loss", [outs_[-1], tgt], [loss], "forward", 0, 3.0)
    g = t([batch, widths[3]], "output")
    op("autograd::engine::evaluate_function: LogSoftmaxBackward0", [loss, outs_[-1]], [g], "backward", 0, 2.0)
    grads = {}
    for i in reversed(range(3)):
        w, b = params[2 * i], params[2 * i + 1]
        # the first layer computes no input gradient: its input (the data) needs none
        gi = t([batch, widths[i]], "output") if i > 0 else None
        gw, gb = t(list(shapes[w]), "output"), t(list(shapes[b]), "output")
        op("autograd::engine::evaluate_function: AddmmBackward0", [g, acts[i], w], [gi, gw, gb] if gi else [gw, gb],
           "backward", 1, 3.0 + batch * widths[i] * widths[i + 1] / 1e4)
        grads[w], grads[b] = gw, gb
        if i > 0:
            g2 = t([batch, widths[i]], "output")
            op("autograd::engine::evaluate_function: ReluBackward0", [gi, acts[i]], [g2], "backward", 0,
               1.0 + batch * widths[i] / 1e4)
            g = g2
    ins = params + [grads[p] for p in params]
    op("aten::_foreach_add_", ins, [], "optimizer", 0, 8.0)
    for name, rows in (("tensor.csv", tens), ("trace.csv", ops)):
        with open(d / name, "w", newline="") as f:
            csv.writer(f).writerows(rows)
    return d


@pytest.fixture(scope="module")
def mlp_dir(tmp_path_factory) -> Path:
    return _mlp_csv(tmp_path_factory.mktemp("mlp") / "mlp3")


def test_mlp_dp_tp_pp_and_batch(mlp_dir: Path):
    raw = _read(mlp_dir)
    tr = load_trace([mlp_dir]).trace
    params = [t for r in raw["ops"] if r["OperatorName"] == "aten::linear" for t in _ids(r["Operator_input"])[1:]]
    grad_bytes = sum(raw["nbytes"][t] for t in params)
    # DDP: the 6 gradients, overlapped and not
    for overlap in (True, False):
        out = scale_trace(tr, dp=2, dp_overlap=overlap)
        assert verify(out) == []
        assert {sum(b for _, b in _colls(g)) for g in out.graphs.values()} == {grad_bytes}
    # TP: flagged outputs forward, input gradients backward (the first layer's input is the data)
    out = scale_trace(tr, tp=2)
    assert verify(out) == []
    f_bytes, b_bytes = _expected_tp(raw)
    c = _colls(out.graphs[0])
    assert [b for n, b in c if n.endswith(".fwd")] == f_bytes
    assert sorted(b for n, b in c if n.endswith(".bwd")) == b_bytes == sorted(
        raw["nbytes"][t] for t in (_ids(r["Operator_output"])[0] for r in raw["ops"]
                                   if r["OperatorName"].endswith("AddmmBackward0")) if raw["shape"][t][1] != 64)
    # PP: both splits cut the 6 forward ops; replay gives each stage less compute and some communication
    single = replay_trace(tr).ranks[0]
    for split, pp, micro in (("ops", 2, 1), ("ops", 3, 2), ("time", 2, 1), ("time", 2, 2)):
        out = scale_trace(tr, pp=pp, micro_batches=micro, pp_split=split)
        assert verify(out) == []
        counts = [c // micro for c in _fwd_counts(out)]
        assert sum(counts) == 6 and min(counts) >= 1
        if split == "ops":
            assert max(counts) - min(counts) <= 1
        for rr in replay_trace(out).ranks.values():
            assert rr.compute_us < single.compute_us and rr.comm_us > 0
    # batch 32 -> 64 by the regression fitted here
    out = scale_trace(tr, batch=64)
    want = _regression_ratio(raw, 32, 64)
    g0, g = tr.graphs[0], out.graphs[0]
    ratio = {int(i): float(d1) / float(d0) for i, d0, d1 in zip(g0.id, g0.dur, g.dur) if d0 > 0}
    for oid, w in want.items():
        assert ratio[oid] == pytest.approx(w, rel=1e-6), oid
