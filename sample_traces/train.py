"""Plain training script for one sample scenario: ``python -m sample_traces.train SCENARIO``.

Nothing here knows about profiling: ``ettools capture`` (see ``regenerate.py``) records a step
from outside. Multi-rank scenarios fork their ranks from this process (torch is imported once,
before the fork) and join a gloo process group on 127.0.0.1 at a free port. Each rank uses one
intra-op thread. Prints the loss of every step (rank 0, or the last pipeline stage).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import sys

import torch
import torch._dynamo  # noqa: F401  (Optimizer.step imports it lazily: do it once, before forking)
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from sample_traces.models import parallel
from sample_traces.models.gpt import GPT, batch_for
from sample_traces.scenarios import SCENARIOS, STEPS, Scenario


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(sc: Scenario, rank: int, steps: int) -> None:
    """Build the model for ``sc``'s plan on this rank and run ``steps`` optimizer steps."""
    torch.set_num_threads(1)
    cfg, plan = sc.cfg, sc.plan
    group = dist.group.WORLD if sc.world > 1 else None
    model = GPT(cfg)
    after_backward = None  # explicit gradient synchronization, when the plan needs one
    replica = rank  # data-parallel replica index, selects the batch
    run = None
    if plan["tp"] > 1:
        model = parallel.TPModel(model, rank, plan["tp"], group, plan["sp_regather_input"])
        sp = model.sp_params()
        after_backward = lambda: parallel.allreduce_grads(sp, group, average=False)  # noqa: E731
        replica = 0
    elif plan["pp"] > 1:
        model = parallel.Stage(model, rank, plan["pp"])
        replica = 0

        def run(tokens, targets):  # noqa: ANN001, ANN202
            return parallel.pipeline_step(
                model, tokens, targets, plan["micro_batches"], plan["schedule"], cfg.hidden
            )
    elif plan["ep"] > 1:
        model = parallel.make_expert_parallel(model, rank, plan["ep"], group)
        dense = parallel.dense_params(model)
        after_backward = lambda: parallel.allreduce_grads(dense, group, average=True)  # noqa: E731
    elif plan["fsdp"] > 1:
        model = parallel.FSDPModel(model, rank, plan["fsdp"], group)
    elif plan["dp"] > 1:
        model = DDP(model, bucket_cap_mb=plan["bucket_cap_mb"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(1, steps + 1):
        tokens, targets = batch_for(cfg, step, replica)
        opt.zero_grad(set_to_none=True)
        if run is not None:
            loss = run(tokens, targets)
        else:
            loss = model(tokens, targets)
            loss.backward()
        if after_backward is not None:
            after_backward()
        opt.step()
        if loss is not None and (rank == 0 or plan["pp"] > 1):
            print(f"{sc.name} rank {rank} step {step} loss {loss.item():.6f}", flush=True)


def _worker(sc: Scenario, rank: int, port: int, steps: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=sc.world)
    try:
        train(sc, rank, steps)
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Run one scenario (all its ranks); exit code 1 when a rank failed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--steps", type=int, default=STEPS)
    args = ap.parse_args(argv)
    sc = SCENARIOS[args.scenario]
    if sc.world == 1:
        train(sc, 0, args.steps)
        return 0
    port = _free_port()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_worker, args=(sc, r, port, args.steps)) for r in range(sc.world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    bad = [r for r, p in enumerate(procs) if p.exitcode != 0]
    if bad:
        print(f"{sc.name}: rank(s) {bad} failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
