"""Measure the collectives of this machine through ``torch.distributed``, like nccl-tests.

``measure_collectives`` starts ``ranks`` worker processes on this machine (``gloo`` on CPU tensors,
or ``nccl`` with one GPU per rank), times all-reduce, all-gather, reduce-scatter, all-to-all and
send/recv at each message size, and writes one CSV per kind in the column layout of Vidur's
network tables (``all_reduce.csv``, ``send_recv.csv``, … with ``time_stats.<op>.median`` in ms,
``num_workers``, ``devices_per_node``, ``size``), so that the same reader and fit turn them into a
network model (``ettools calibrate --network --measure``).

Why it exists: a rewrite inserts collectives that the source trace never ran, so their cost has to
come from somewhere other than the trace. A made-up bus is wrong by an order of magnitude on a busy
host (a 32 KB gloo all-gather costs hundreds of µs there, not tens); these tables are what the
machine itself does, measured through the same Python call path a training script uses.

``size`` follows Chakra's ``comm_size`` meaning: the buffer for all-reduce, each rank's input for
all-gather, the full input for reduce-scatter, each rank's total for all-to-all, the message for
send/recv. Each repetition starts after a barrier; its time is the *shortest* of the members'
durations — the member that arrived last waits for nobody, so its duration is the collective's own
cost, without the arrival skew a barrier leaves. Send/recv is a ping-pong between ranks ``2i`` and
``2i+1`` timed on the even one (half the round trip), as the OSU latency test does: a send may
return before delivery, and a receive would absorb the sender's lag leaving the barrier.
"""

from __future__ import annotations

import csv
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import orjson

BACKENDS = ("gloo", "nccl")
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
DEFAULT_SIZES = tuple(1 << k for k in range(10, 25, 2))  # 1 KiB .. 16 MiB, factors of 4
MAX_RANKS = 256
MAX_REPS = 10_000
MAX_SIZE = 1 << 31
_WARMUP = 3


class CollBenchError(Exception):
    """A measurement that could not be made (bad option, missing torch, a worker that failed)."""


def check_options(backend: str, ranks: int, sizes: Sequence[int], reps: int) -> None:
    """Range-check the options that size the measurement (raises CollBenchError naming the bad one)."""
    if backend not in BACKENDS:
        raise CollBenchError(f"--measure: unknown backend {backend!r} (one of {', '.join(BACKENDS)})")
    if not 2 <= ranks <= MAX_RANKS:
        raise CollBenchError(f"--ranks: {ranks} is out of range (2 .. {MAX_RANKS})")
    if not 1 <= reps <= MAX_REPS:
        raise CollBenchError(f"--reps: {reps} is out of range (1 .. {MAX_REPS})")
    if len(set(sizes)) < 3:
        raise CollBenchError(f"--sizes: {len(set(sizes))} distinct size(s) given; a fit per kind needs at least 3")
    for s in sizes:
        if not ranks * 4 <= s <= MAX_SIZE:
            raise CollBenchError(f"--sizes: {s} bytes is out of range ({ranks * 4} .. {MAX_SIZE}: "
                                 f"at least one float32 per rank)")
    # each process holds the buffer, its all-gather output (ranks x) and two more of its size
    need = max(sizes) * (ranks + 3)
    if backend == "gloo":
        need *= ranks  # every member lives in this machine's memory
        have = _host_memory_bytes()
        if have and need > have // 2:
            raise CollBenchError(f"--sizes: {max(sizes)} bytes on {ranks} ranks needs {need / 2**30:.1f} GiB of "
                                 f"buffers, more than half of this machine's {have / 2**30:.1f} GiB")


def _host_memory_bytes() -> int:
    """Physical memory of this machine (0 where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure_collectives(backend: str, ranks: int, out_dir: Path, sizes: Sequence[int] = DEFAULT_SIZES,
                        reps: int = 20, log: Callable[[str], None] | None = None) -> list[Path]:
    """Time every collective kind at every size on ``ranks`` local processes; write the CSVs into
    ``out_dir`` and return their paths. Needs torch (the ``capture`` extra)."""
    check_options(backend, ranks, sizes, reps)
    try:
        import torch  # noqa: F401  (only to fail early with a clear message)
    except ImportError:
        raise CollBenchError("--measure needs torch: pip install 'ettools[capture]'") from None
    if backend == "nccl":
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < ranks:
            raise CollBenchError(f"--measure nccl: {ranks} ranks need {ranks} GPUs, this machine has {have}")
    out_dir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="ettools-collbench-") as tmp:
        spec = {"backend": backend, "world": ranks, "port": port, "sizes": [int(s) for s in sizes],
                "reps": int(reps), "dir": tmp}
        spec_file = Path(tmp) / "spec.json"
        spec_file.write_bytes(orjson.dumps(spec))
        if log:
            log(f"measuring {', '.join(KINDS)} with {backend} on {ranks} processes, "
                f"{len(sizes)} sizes x {reps} repetitions")
        procs = [subprocess.Popen([sys.executable, "-m", "ettools.collbench", str(spec_file), str(r)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for r in range(ranks)]
        errors = []
        for r, p in enumerate(procs):
            _, err = p.communicate()
            if p.returncode:
                last = (err.decode(errors="replace").strip().splitlines() or ["(no message)"])[-1]
                errors.append(f"rank {r} exited {p.returncode}: {last}")
        if errors:
            raise CollBenchError("collective benchmark failed: " + "; ".join(errors))
        times = [orjson.loads((Path(tmp) / f"rank{r}.json").read_bytes()) for r in range(ranks)]
    return _write_tables(times, ranks, out_dir)


def _write_tables(times: list[dict[str, dict[str, list[float]]]], ranks: int, out_dir: Path) -> list[Path]:
    """One Vidur-layout CSV per kind: per size, statistics (ms) over the repetitions of the shortest
    member duration."""
    written = []
    for kind in KINDS:
        rows = []
        for size in sorted({int(s) for t in times for s in t.get(kind, {})}):
            members = [t[kind][str(size)] for t in times if str(size) in t.get(kind, {})]
            per_rep = [min(v) for v in zip(*members)]
            if not per_rep:
                continue
            n = 2 if kind == "send_recv" else ranks
            ms = [x * 1e3 for x in per_rep]
            rows.append({f"time_stats.{kind}.min": min(ms), f"time_stats.{kind}.max": max(ms),
                         f"time_stats.{kind}.mean": statistics.fmean(ms),
                         f"time_stats.{kind}.median": statistics.median(ms),
                         f"time_stats.{kind}.std": statistics.pstdev(ms), "rank": 0, "num_workers": n,
                         "size": size, "collective": kind, "devices_per_node": n, "max_devices_per_node": ranks})
        if not rows:
            continue
        path = out_dir / f"{kind}.csv"
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["", *rows[0]])
            w.writeheader()
            for i, row in enumerate(rows):
                w.writerow({"": i, **{k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()}})
        written.append(path)
    return written


def _operations(dist, rank: int, world: int, buf, shard, gathered, a2a_out) -> dict[str, Callable[[], object]]:
    """The timed call of each kind on these buffers (send/recv only for a member with a partner)."""
    ops: dict[str, Callable[[], object]] = {
        "all_reduce": lambda: dist.all_reduce(buf),
        "all_gather": lambda: dist.all_gather_into_tensor(gathered, buf),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, buf),
        "all_to_all": lambda: dist.all_to_all_single(a2a_out, buf),
    }
    peer = rank ^ 1
    if peer < world:  # ping-pong, timed on the even member: half the round trip is one message
        if rank % 2 == 0:
            ops["send_recv"] = lambda: (dist.send(buf, peer), dist.recv(buf, peer))
        else:
            ops["send_recv"] = lambda: (dist.recv(buf, peer), dist.send(buf, peer))
    return ops


def _worker(job: dict, rank: int) -> None:
    """One member: time every kind and size, write ``rank<N>.json`` (seconds per repetition)."""
    import time

    import torch
    import torch.distributed as dist

    world, backend = int(job["world"]), job["backend"]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(job["port"]))
    torch.set_num_threads(1)
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world)

    def sync() -> None:
        if backend == "nccl":
            torch.cuda.synchronize(device)

    out: dict[str, dict[str, list[float]]] = {k: {} for k in KINDS}
    for size in job["sizes"]:
        n = max(world, int(size) // 4 // world * world)  # float32 elements, a multiple of the world size
        buf = torch.ones(n, device=device)
        shard = torch.ones(n // world, device=device)
        gathered = torch.empty(n * world, device=device)
        a2a_out = torch.empty(n, device=device)
        ops = _operations(dist, rank, world, buf, shard, gathered, a2a_out)
        for kind in KINDS:
            op = ops.get(kind)
            samples = []
            for i in range(_WARMUP + int(job["reps"])):
                dist.barrier()
                sync()
                t0 = time.perf_counter()
                if op is not None:
                    op()
                    sync()
                if i >= _WARMUP and op is not None:
                    samples.append((time.perf_counter() - t0) / (2 if kind == "send_recv" else 1))
            if samples and (kind != "send_recv" or rank % 2 == 0):
                out[kind][str(n * 4)] = samples
    dist.barrier()
    dist.destroy_process_group()
    Path(job["dir"], f"rank{rank}.json").write_bytes(orjson.dumps(out))


if __name__ == "__main__":
    _worker(orjson.loads(Path(sys.argv[1]).read_bytes()), int(sys.argv[2]))
