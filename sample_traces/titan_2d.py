"""A torchtitan-style training script: FSDP2 (``fully_shard``) over a data-parallel mesh dimension
and DTensor tensor parallelism (``parallelize_module``, column- then row-wise linears) over the
other, from one 2-D ``init_device_mesh``; a vocabulary-parallel output layer whose loss is computed
on the vocabulary shards (``loss_parallel``), as torchtitan trains:
``torchrun --nproc-per-node 4 -m sample_traces.titan_2d``.

Runs on CUDA with NCCL where a GPU is (or is emulated: ``ettools capture --emulate H100 -- torchrun
...``), else on the CPU with gloo (``ettools capture -- torchrun ...``), so the two captures can be
compared; ``--dp`` × ``--tp`` must equal the world size.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    loss_parallel,
    parallelize_module,
)


class FeedForward(nn.Module):
    """One MLP block: the column-parallel up projection, the row-parallel down projection."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, 4 * dim, bias=False)
        self.w2 = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(torch.relu(self.w1(x)))


class Stack(nn.Module):
    """Residual MLP blocks, a norm and an output layer over ``vocab`` classes (the logits)."""

    def __init__(self, dim: int, layers: int, vocab: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(FeedForward(dim) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer(x)
        return self.head(self.norm(x))


def main() -> None:
    """Train a few steps."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    mesh = init_device_mesh(device, (args.dp, args.tp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = Stack(args.dim, args.layers, args.vocab).to(device)
    for layer in model.layers:
        parallelize_module(layer, mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        fully_shard(layer, mesh=mesh["dp"])
    # the logits stay sharded over the vocabulary; the loss is computed on the shards
    parallelize_module(model, mesh["tp"], {"head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)})
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(args.steps):
        x = torch.randn(8, args.dim, device=device)
        target = torch.randint(0, args.vocab, (8,), device=device)
        with loss_parallel():
            nn.functional.cross_entropy(model(x), target).backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
