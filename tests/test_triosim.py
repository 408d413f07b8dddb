"""TrioSim CSV reader and writer (converters/triosim.py)."""

from __future__ import annotations

import csv
import shutil

import pytest

from ettools.converters.triosim import read_triosim, write_triosim
from ettools.errors import TraceError
from ettools.graph import EdgeKind, GraphBuilder, NodeType, new_trace


@pytest.fixture(scope="module")
def vgg(shared_traces):
    return shared_traces / "triosim" / "vgg13_h100_bs128"


def rows(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def ids(cell):
    body = cell.strip("[]").replace(" ", "")
    return [int(x) for x in body.split(";")] if body else []


def test_read_real_trace(vgg):
    ops = list(csv.DictReader(open(vgg / "trace.csv", newline="")))
    tens = list(csv.DictReader(open(vgg / "tensor.csv", newline="")))
    trace = read_triosim(vgg / "trace.csv")
    assert trace.ranks == [0]
    g = trace[0]
    assert len(g) == len(ops) and len(g.tensors) == len(tens)
    assert g.id.tolist() == [int(r["OperatorID"]) for r in ops]
    assert g.dur.tolist() == [float(r["Operator_cudatimenooverlap"]) for r in ops]
    assert (g.type == NodeType.COMP_NODE).all()
    assert g.tensors.nbytes.tolist() == [int(r["TensorNumElement"]) * int(r["TensorEachByte"]) for r in tens]
    # data dependencies: each input on the operator that last wrote that tensor id before
    writer: dict[int, int] = {}
    for r, row in zip(ops, range(len(g))):
        oid = int(r["OperatorID"])
        expected = {writer[t] for t in ids(r["Operator_input"]) if t in writer and writer[t] != oid}
        got = {d for d, k in g.deps_of(row) if k == EdgeKind.DATA}
        assert got == expected, oid
        for t in ids(r["Operator_output"]):
            writer[t] = oid
        # inputs resolve to tensors of the right id and size
        ins = g.inputs_of(row)
        assert g.tensors.tensor_id[ins].tolist() == ids(r["Operator_input"])
        assert g.tensors.numel[ins].tolist() == ids(r["InputSize"])
    assert g.topological_order() is not None


def test_round_trip_cell_for_cell(vgg, tmp_path):
    trace = read_triosim(vgg)
    paths = write_triosim(trace, tmp_path)
    assert paths == [tmp_path / "trace.csv", tmp_path / "tensor.csv"]
    assert rows(paths[0]) == rows(vgg / "trace.csv")
    assert rows(paths[1]) == rows(vgg / "tensor.csv")
    back = read_triosim(tmp_path)
    assert back[0].dur.tolist() == trace[0].dur.tolist()
    assert back[0].tensors.nbytes.tolist() == trace[0].tensors.nbytes.tolist()
    assert write_triosim(back, tmp_path / "again")[0].read_bytes() == paths[0].read_bytes()


def test_write_kineto_like_graph(tmp_path):
    """Host ops with nested runtime calls launching kernels: operators are the outermost ``::`` ops."""
    trace, strings = new_trace()
    b = GraphBuilder(0, strings)
    x = b.add_tensor([8, 16], 4, device="cuda:0", tensor_id=10, storage_id=11)
    w = b.add_tensor([16, 32], 2, device="cuda:0")  # no ids: the writer gives it one
    y = b.add_tensor([8, 32], 4, device="cuda:0", tensor_id=12, storage_id=13)
    step = b.add_node("ProfilerStep#1", start=0.0, dur=100.0, is_cpu_op=1)
    lin = b.add_node("aten::linear", start=1.0, dur=20.0, is_cpu_op=1)
    b.add_dep(b.last_row, step, EdgeKind.NEST)
    b.add_io(b.last_row, [x, w], [y])
    mm = b.add_node("aten::addmm", start=2.0, dur=10.0, is_cpu_op=1)  # nested: not an operator itself
    b.add_dep(b.last_row, lin, EdgeKind.NEST)
    rt = b.add_node("cudaLaunchKernel", start=3.0, dur=1.0, is_cpu_op=1)
    b.add_dep(b.last_row, mm, EdgeKind.NEST)
    k1 = b.add_node("gemm_kernel", start=10.0, dur=3.5, is_cpu_op=0, resource="stream 7")
    b.add_dep(b.last_row, rt, EdgeKind.LAUNCH)
    k2 = b.add_node("bias_kernel", start=20.0, dur=1.5, is_cpu_op=0, resource="stream 7")
    b.add_dep(b.last_row, lin, EdgeKind.LAUNCH)
    b.add_dep(b.last_row, k1, EdgeKind.ORDER)
    bwd = b.add_node("autograd::engine::evaluate_function: AddmmBackward0", start=50.0, dur=5.0, is_cpu_op=1)
    b.add_dep(b.last_row, step, EdgeKind.NEST)
    b.add_io(b.last_row, [y], [])
    b.add_node("bwd_kernel", start=52.0, dur=2.0, is_cpu_op=0, resource="stream 7")
    b.add_dep(b.last_row, bwd, EdgeKind.LAUNCH)
    b.add_dep(b.last_row, k2, EdgeKind.ORDER)
    b.add_node("aten::view", start=60.0, dur=1.0, is_cpu_op=1)  # no device time: not an operator
    b.add_node("allreduce", NodeType.COMM_COLL_NODE, start=70.0, dur=1.0, is_cpu_op=0)
    trace.graphs[0] = b.build()
    p_trace, p_tensor = write_triosim(trace, tmp_path)
    ops = list(csv.DictReader(open(p_trace, newline="")))
    assert [int(r["OperatorID"]) for r in ops] == [lin, bwd]
    assert [r["stage"] for r in ops] == ["forward", "backward"]
    assert [r["tpflag"] for r in ops] == ["1", "0"]
    assert ops[0]["Operator_cudatimenooverlap"] == "5" and ops[0]["Operator_cudatime"] == "11.5"
    assert ops[0]["InputSize"] == "[128; 512]" and ops[1]["Operator_cudatimenooverlap"] == "2"
    tens = list(csv.DictReader(open(p_tensor, newline="")))
    assert [r["TensorType"] for r in tens] == ["input", "input", "output", "input"]
    assert [r["TensorShape"] for r in tens][:2] == ["[8, 16]", "[16, 32]"]
    back = read_triosim(tmp_path)
    g = back[0]
    assert g.dur.tolist() == [5.0, 2.0]
    assert g.tensors.nbytes[g.inputs_of(0)].tolist() == [8 * 16 * 4, 16 * 32 * 2]
    assert g.deps_of(1) == [(lin, EdgeKind.DATA)]  # consumes y, written by the linear
    with pytest.raises(ValueError, match="rank 3"):
        write_triosim(trace, tmp_path, rank=3)


def test_write_graph_without_launch_edges(tmp_path):
    trace, strings = new_trace()
    b = GraphBuilder(0, strings)
    b.add_node("host_thing", dur=9.0, is_cpu_op=1)
    b.add_node("kernel_a", dur=2.25, is_cpu_op=0)
    b.add_dep(1, 0, EdgeKind.ORDER)
    b.add_node("kernel_b", dur=float("nan"), is_cpu_op=0)
    b.add_dep(2, 1, EdgeKind.ORDER)
    trace.graphs[0] = b.build()
    write_triosim(trace, tmp_path)
    ops = list(csv.DictReader(open(tmp_path / "trace.csv", newline="")))
    assert [(r["OperatorName"], r["Operator_cudatimenooverlap"]) for r in ops] == [
        ("kernel_a", "2.25"), ("kernel_b", "0")]


def copy(vgg, tmp_path):
    d = tmp_path / "t"
    d.mkdir(parents=True)
    for n in ("trace.csv", "tensor.csv"):
        shutil.copyfile(vgg / n, d / n)
    return d


def edit(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_bad_input(vgg, tmp_path):
    d = copy(vgg, tmp_path)
    (d / "tensor.csv").unlink()
    with pytest.raises(TraceError, match=r"tensor\.csv: no such file"):
        read_triosim(d)

    d = copy(vgg, tmp_path / "a")
    edit(d / "trace.csv", "Operator_cudatimenooverlap", "time")
    with pytest.raises(TraceError, match=r"trace\.csv: not a TrioSim trace\.csv: header lacks column\(s\) "
                                         r"Operator_cudatimenooverlap"):
        read_triosim(d)

    d = copy(vgg, tmp_path / "b")
    edit(d / "trace.csv", "2,aten::relu_,[14]", "2,aten::relu_,[99999]")
    with pytest.raises(TraceError, match=r"line 3: Operator_input names tensor 99999, absent from tensor.csv"):
        read_triosim(d)

    d = copy(vgg, tmp_path / "c")
    edit(d / "trace.csv", "2,aten::relu_,[14],[14],1083,1083", "2,aten::relu_,[14],[14],1083,slow")
    with pytest.raises(TraceError, match=r"line 3: Operator_cudatimenooverlap must be a number"):
        read_triosim(d)

    d = copy(vgg, tmp_path / "e")
    edit(d / "tensor.csv", '0,4,"[128, 3, 224, 224]"', '0,x4,"[128, 3, 224, 224]"')
    with pytest.raises(TraceError, match=r"tensor\.csv: line 2: TensorID must be an integer"):
        read_triosim(d)

    d = copy(vgg, tmp_path / "f")
    edit(d / "trace.csv", "\n2,aten::relu_", "\n1,aten::relu_")
    with pytest.raises(TraceError, match="line 3: duplicate OperatorID 1"):
        read_triosim(d)

    d = copy(vgg, tmp_path / "g")
    (d / "trace.csv").write_bytes(b"")
    with pytest.raises(TraceError, match="empty file"):
        read_triosim(d)
