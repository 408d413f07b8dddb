"""Chakra reader/writer throughput: nodes/s on a ~1M-node synthetic trace and on the real ResNet file.

Run: ``python tests/bench/bench_chakra.py [--nodes 1048576] [--ranks 8] [--readme]``. Target: writer
>= 100,000 nodes/s (issue 2). ``--readme`` prints the Chakra row of ``converters/README.md``'s Speed
table (block ``<!-- bench:chakra -->``) between ``<!-- readme:begin -->`` and ``<!-- readme:end -->``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from ettools.converters.chakra import read_chakra, write_chakra
from ettools.converters.chakra_json import read_chakra_json, write_chakra_json
from ettools.graph import (
    AttrColumn,
    CollectiveType,
    EdgeKind,
    NodeType,
    ProcessGroup,
    RankGraph,
    StringTable,
    Trace,
    TraceMeta,
)

RESNET = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "chakra" / "resnet_converted.0.et"


def synthetic_trace(nodes: int = 1 << 20, ranks: int = 8, seed: int = 0) -> Trace:
    """A trace shaped like what ettools builds from Kineto: per rank mostly COMP kernels with
    is_cpu_op/num_ops/tensor_size/resource/times, a collective every 50 nodes (comm_type, bytes,
    group), a send/recv pair every 500, two dependencies per node (stream order + a data edge), and
    a sparse integer attribute on a third of the nodes."""
    rng = np.random.default_rng(seed)
    strings = StringTable()
    names = np.array([strings.intern(f"void kernel_{i}<float, {i % 7}>(Params)") for i in range(2000)], np.int32)
    resources = np.array([strings.intern(f"stream {s}") for s in (7, 13, 21, 22)], np.int32)
    meta = TraceMeta(world_size=ranks, source="synthetic")
    meta.add_group(ProcessGroup("0", tuple(range(ranks))))
    meta.add_group(ProcessGroup("1", tuple(range(0, ranks, 2))))
    meta.add_group(ProcessGroup("2", tuple(range(1, ranks, 2))))
    world, even, odd = (strings.intern(k) for k in ("0", "1", "2"))
    per_rank = nodes // ranks
    graphs = {}
    for r in range(ranks):
        n = per_rank
        idx = np.arange(n)
        types = np.full(n, NodeType.COMP_NODE, np.uint8)
        coll = idx % 50 == 49
        types[coll] = NodeType.COMM_COLL_NODE
        send = (idx % 500 == 123) & (r % 2 == 0)
        recv = (idx % 500 == 123) & (r % 2 == 1)
        types[send] = NodeType.COMM_SEND_NODE
        types[recv] = NodeType.COMM_RECV_NODE
        comm = coll | send | recv
        dur = np.round(rng.exponential(20.0, n), 3)
        start = np.cumsum(dur + 1.0)
        cols = {
            "id": idx.astype(np.uint64),
            "name": names[rng.integers(0, len(names), n)],
            "type": types,
            "start": start,
            "dur": dur,
            "resource": resources[idx % len(resources)],
            "is_cpu_op": np.where(idx % 3 == 0, 1, 0).astype(np.int8),
            "num_ops": np.where(comm, -1, rng.integers(1 << 10, 1 << 34, n)),
            "tensor_size": np.where(comm, -1, rng.integers(1 << 8, 1 << 28, n)),
            "comm_type": np.where(coll, int(CollectiveType.ALL_REDUCE), -1).astype(np.int8),
            "comm_bytes": np.where(comm, rng.integers(1 << 10, 1 << 30, n), -1),
            "comm_group": np.where(coll, np.where(idx % 2 == 0, world, even if r % 2 == 0 else odd), -1).astype(
                np.int32
            ),
            "comm_peer": np.where(send, r + 1, np.where(recv, r - 1, -1)).astype(np.int32),
            "comm_tag": np.where(send | recv, idx // 500, -1),
        }
        # dependency 1: previous node (ORDER); dependency 2: a random earlier node (DATA)
        order_dep = idx[1:] - 1
        data_dep = np.maximum(idx[2:] - rng.integers(2, 64, n - 2), 0)
        dst = np.concatenate((idx[1:], idx[2:]))
        dep = np.concatenate((order_dep, data_dep))
        kind = np.concatenate((np.full(n - 1, EdgeKind.ORDER), np.full(n - 2, EdgeKind.DATA))).astype(np.uint8)
        o = np.argsort(dst, kind="stable")
        dep_ptr = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(dst, minlength=n), out=dep_ptr[1:])
        tid_rows = idx[idx % 3 == 0]
        attrs = {"correlation": AttrColumn("int64_val", tid_rows, (tid_rows * 7 + r).tolist())}
        graphs[r] = RankGraph(r, strings, cols, dep_ptr, dep[o].astype(np.uint64), kind[o], attrs)
    return Trace(meta, graphs, strings)


def _time(fn, repeat: int = 1) -> tuple[float, float]:
    """Best ``(wall, CPU)`` seconds over ``repeat`` runs (CPU time is steadier on a shared machine)."""
    best_wall = best_cpu = float("inf")
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        best_wall = min(best_wall, time.perf_counter() - w)
        best_cpu = min(best_cpu, time.process_time() - c)
    return best_wall, best_cpu


def _line(what: str, n: int, t: tuple[float, float], extra: str = "") -> str:
    wall, cpu = t
    return (f"  {what:<22} {wall:7.3f} s wall {n / wall:>11,.0f} nodes/s | {cpu:7.3f} s CPU "
            f"{n / cpu:>11,.0f} nodes/s{extra}")


def main() -> None:
    """Print the figures."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1 << 20)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--json", action="store_true", help="also time Chakra JSON on the ResNet file")
    ap.add_argument("--readme", action="store_true", help="print the README block")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_chakra."))
    try:
        t = time.perf_counter()
        trace = synthetic_trace(args.nodes, args.ranks)
        n = trace.num_nodes
        print(f"synthetic trace: {n:,} nodes, {args.ranks} ranks, "
              f"{sum(g.num_edges for g in trace):,} deps (built in {time.perf_counter() - t:.2f} s)")
        out = tmp / "synth"
        t = _time(lambda: write_chakra(trace, out, "synth"), 2)
        target = "OK" if n / max(t) >= 100_000 else "MISSED"
        print(_line("write (strict)", n, t, f"  (target >= 100,000 nodes/s: {target})"))
        tr = _time(lambda: read_chakra(out), 2)
        print(_line("read (bulk decoder)", n, tr))
        if args.readme:
            print("<!-- readme:begin -->")
            print("| what | figure | target / anchor |\n| --- | --- | --- |")
            print(f"| Chakra writer and reader, {n:,} synthetic nodes on {args.ranks} ranks (`bench_chakra.py`, "
                  f"best of 2, one run) | writer **{n / t[0]:,.0f} nodes/s** ({n / t[1]:,.0f} per CPU second); "
                  f"reader {n / tr[0]:,.0f} nodes/s | writer ≥ 100,000 nodes/s "
                  f"({'met' if n / max(t) >= 100_000 else 'not met'}) |")
            print("<!-- readme:end -->")
        print(_line("read (protobuf)", n, _time(lambda: read_chakra(out, fast=False))))

        if RESNET.is_file():
            res = read_chakra(RESNET)
            n = res.num_nodes
            print(f"resnet_converted.0.et: {n:,} nodes, {res[0].num_edges:,} deps, "
                  f"{RESNET.stat().st_size / 1e6:.1f} MB")
            print(_line("read (bulk decoder)", n, _time(lambda: read_chakra(RESNET), 5)))
            print(_line("read (protobuf)", n, _time(lambda: read_chakra(RESNET, fast=False), 5)))
            print(_line("write (faithful)", n, _time(lambda: write_chakra(res, tmp / "r", "r", strict=False), 5)))
            if args.json:
                print(_line("JSON write", n, _time(lambda: write_chakra_json(res, tmp / "rj", "r", strict=False))))
                print(_line("JSON read", n, _time(lambda: read_chakra_json(tmp / "rj" / "r.0.json"))))
        else:
            print(f"(no {RESNET}: ResNet figures skipped)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
