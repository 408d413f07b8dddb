"""Capture the small ET + Kineto pair in tests/data/gloo_2rank (2 gloo ranks on CPU).

Run from the repository root: ``python tests/data/capture_gloo_pair.py`` (needs torch).
A tiny MLP step with DDP-style all_reduce, all_gather, reduce_scatter, broadcast and a
send/recv pair; the profiler records one step with an ExecutionTraceObserver, so the Kineto
events carry ``Record function id``.
"""

from __future__ import annotations

import gzip
import os
import shutil
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

OUT = Path(__file__).resolve().parent / "gloo_2rank"


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, rank: int) -> None:
    x = torch.randn(8, 16)
    loss = model(x).sum()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    opt.zero_grad()
    t = torch.ones(4) * rank
    out = [torch.empty(4) for _ in range(2)]
    dist.all_gather(out, t)
    rs = torch.empty(2)
    dist.reduce_scatter_tensor(rs, torch.ones(4))
    dist.broadcast(t, src=0)
    if rank == 0:
        dist.send(torch.arange(6, dtype=torch.float32), dst=1, tag=7)
    else:
        buf = torch.empty(6)
        dist.recv(buf, src=0, tag=7)


def _worker(rank: int, port: int, tmp: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    et_path = os.path.join(tmp, f"rank{rank}.et.json")
    k_path = os.path.join(tmp, f"rank{rank}.kineto.json")
    et = ExecutionTraceObserver().register_callback(et_path)
    with profile(
        activities=[ProfilerActivity.CPU], record_shapes=True,
        schedule=schedule(wait=1, warmup=1, active=1),
        execution_trace_observer=et, on_trace_ready=lambda p: p.export_chrome_trace(k_path),
    ) as prof:
        for _ in range(3):
            _step(model, opt, rank)
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    tmp = OUT.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_worker, args=(port, str(tmp)), nprocs=2, start_method="fork")
    OUT.mkdir(exist_ok=True)
    for f in sorted(tmp.iterdir()):
        with open(f, "rb") as src, gzip.GzipFile(OUT / (f.name + ".gz"), "wb", mtime=0) as dst:
            shutil.copyfileobj(src, dst)
    shutil.rmtree(tmp)
    print("wrote", sorted(p.name for p in OUT.iterdir()), file=sys.stderr)


if __name__ == "__main__":
    main()
