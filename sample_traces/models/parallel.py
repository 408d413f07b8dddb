"""Explicit parallel variants of :mod:`sample_traces.models.gpt` with exact collectives.

Every collective is an explicit ``torch.distributed`` call (gloo), most inside autograd
Functions, so what a capture contains follows from the model dimensions alone:

* **TP + SP** (Megatron-style): column-parallel then row-parallel linears. Forward:
  ``all_gather`` of the sequence-sharded input before each column linear, ``reduce_scatter`` after
  each row linear. Backward: the row linear all-gathers its output gradient; the column linear
  re-gathers its input for the weight gradient (Megatron does not keep the gathered input;
  ``regather=False`` keeps it instead) and reduce-scatters its input gradient. Embedding, final norm's head and the loss are replicated:
  the embedding output is split along the sequence (backward: all_gather), the final norm runs
  on the shard and its output is all-gathered for the replicated head (backward: split). The
  norms inside the SP region see only a sequence shard, so their gradients are summed with one
  ``all_reduce`` of the flattened norm gradients after backward.
* **PP**: two stages; activations and their gradients cross with ``send``/``recv``, tag ``m``
  for micro-batch ``m``'s activation and ``M + m`` for its gradient; GPipe and 1F1B.
* **EP**: each rank owns ``E / ep`` experts; the ``[E, C, h]`` dispatch buffer is exchanged with
  ``all_to_all_single`` before and after the experts (and the same two in backward). Dense
  (non-expert) gradients are averaged with one flattened ``all_reduce``.
* **FSDP** (ZeRO-3 style, explicit): each unit (embedding, every block, final) keeps a flat
  1/ws shard of its parameters (zero-padded to a multiple of ws). Forward all-gathers the unit
  and frees the full copy; backward all-gathers it again when the unit's backward starts
  (reshard after forward) and reduce-scatters the unit's flat gradient (then divides by ws).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.autograd import Function
from torch.func import functional_call

from sample_traces.models.gpt import GPT, GPTConfig, attention_core, ffn_activation

# torch 2.13 renamed the flat-tensor collectives (the old names warn); same c10d ops
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

# ---------------------------------------------------------------------------------------------
# tensor + sequence parallel


def _gather_seq(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    ws = dist.get_world_size(group)
    out = x.new_empty((x.shape[0] * ws, *x.shape[1:]))
    _all_gather_flat(out, x.contiguous(), group=group)
    return out


def _reduce_scatter_seq(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    ws = dist.get_world_size(group)
    out = x.new_empty((x.shape[0] // ws, *x.shape[1:]))
    _reduce_scatter_flat(out, x.contiguous(), group=group)
    return out


def _wgrad(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return g.reshape(-1, g.shape[-1]).t().mm(x.reshape(-1, x.shape[-1]))


class ColumnParallelSP(Function):
    """``y = all_gather_seq(x) @ w.T``; backward reduce-scatters ``dx``.

    With ``regather`` (Megatron's behaviour) only the shard ``x`` is kept and backward
    all-gathers it again for the weight gradient; without, the gathered input is kept.
    """

    @staticmethod
    def forward(ctx, x, w, group, regather=True):  # noqa: ANN001, D102
        total = _gather_seq(x, group)
        ctx.save_for_backward(x if regather else total, w)
        ctx.group, ctx.regather = group, regather
        return F.linear(total, w)

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001, D102
        saved, w = ctx.saved_tensors
        total = _gather_seq(saved, ctx.group) if ctx.regather else saved
        dx = _reduce_scatter_seq(g.matmul(w), ctx.group)
        return dx, _wgrad(g, total), None, None


class RowParallelSP(Function):
    """``y = reduce_scatter_seq(x @ w.T)``; backward all-gathers the output gradient."""

    @staticmethod
    def forward(ctx, x, w, group):  # noqa: ANN001, D102
        ctx.save_for_backward(x, w)
        ctx.group = group
        return _reduce_scatter_seq(F.linear(x, w), group)

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001, D102
        x, w = ctx.saved_tensors
        g = _gather_seq(g, ctx.group)
        return g.matmul(w), _wgrad(g, x), None


class ScatterToSP(Function):
    """Keep this rank's sequence chunk (no communication); backward all-gathers."""

    @staticmethod
    def forward(ctx, x, group):  # noqa: ANN001, D102
        ctx.group = group
        ws, r = dist.get_world_size(group), dist.get_rank(group)
        return x.chunk(ws, dim=0)[r].contiguous()

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001, D102
        return _gather_seq(g, ctx.group), None


class GatherFromSP(Function):
    """All-gather the sequence for a replicated consumer; backward keeps this rank's chunk."""

    @staticmethod
    def forward(ctx, x, group):  # noqa: ANN001, D102
        ctx.group = group
        return _gather_seq(x, group)

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001, D102
        ws, r = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        return g.chunk(ws, dim=0)[r].contiguous(), None


def _rows(w: torch.Tensor, parts: list[int], rank: int, tp: int) -> torch.Tensor:
    """Rank's share of each consecutive row block of sizes ``parts`` (fused QKV, gate/up)."""
    out, start = [], 0
    for p in parts:
        n = p // tp
        out.append(w[start + rank * n : start + (rank + 1) * n])
        start += p
    return torch.cat(out)


class TPBlock(nn.Module):
    """A :class:`~sample_traces.models.gpt.Block` with its linears split over ``tp`` ranks (SP)."""

    def __init__(
        self,
        block: nn.Module,
        cfg: GPTConfig,
        rank: int,
        tp: int,
        group: dist.ProcessGroup,
        regather: bool = True,
    ) -> None:
        super().__init__()
        self.regather = regather
        c = cfg
        if c.heads % tp or c.kv_heads % tp or c.ffn_hidden % tp or c.seq % tp:
            raise ValueError("heads, kv_heads, ffn_hidden and seq must divide by tp")
        self.group, self.gated = group, c.gated
        self.heads, self.kv_heads, self.head_dim = c.heads // tp, c.kv_heads // tp, c.head_dim
        self.norm1 = copy.deepcopy(block.norm1)
        self.norm2 = copy.deepcopy(block.norm2)
        d = c.head_dim
        w = block.attn.qkv.weight.detach()
        self.qkv = nn.Parameter(_rows(w, [c.heads * d, c.kv_heads * d, c.kv_heads * d], rank, tp).clone())
        w = block.attn.proj.weight.detach()
        self.proj = nn.Parameter(_rows(w.t(), [c.heads * d], rank, tp).t().contiguous())
        w = block.mlp.fc1.weight.detach()
        self.fc1 = nn.Parameter(_rows(w, [c.ffn_hidden] * (2 if c.gated else 1), rank, tp).clone())
        w = block.mlp.fc2.weight.detach()
        self.fc2 = nn.Parameter(_rows(w.t(), [c.ffn_hidden], rank, tp).t().contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.group
        qkv = ColumnParallelSP.apply(self.norm1(x), self.qkv, g, self.regather)
        a = attention_core(qkv, self.heads, self.kv_heads, self.head_dim)
        x = x + RowParallelSP.apply(a, self.proj, g)
        u = ffn_activation(ColumnParallelSP.apply(self.norm2(x), self.fc1, g, self.regather), self.gated)
        return x + RowParallelSP.apply(u, self.fc2, g)


class TPModel(nn.Module):
    """Megatron-style TP+SP decoder on ``group``; embedding and head replicated."""

    def __init__(
        self, model: GPT, rank: int, tp: int, group: dist.ProcessGroup, regather: bool = True
    ) -> None:
        super().__init__()
        self.group = group
        self.embedding = copy.deepcopy(model.embedding)
        self.blocks = nn.ModuleList(TPBlock(b, model.cfg, rank, tp, group, regather) for b in model.blocks)
        self.final = copy.deepcopy(model.final)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = ScatterToSP.apply(self.embedding(tokens), self.group)
        for block in self.blocks:
            x = block(x)
        x = GatherFromSP.apply(self.final.norm(x), self.group)
        logits = self.final.head(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.t().reshape(-1))

    def sp_params(self) -> list[nn.Parameter]:
        """Replicated parameters used on sequence shards: their gradients need a sum over TP."""
        mods = [m for b in self.blocks for m in (b.norm1, b.norm2)] + [self.final.norm]
        return [p for m in mods for p in m.parameters()]


def allreduce_grads(params: list[nn.Parameter], group: dist.ProcessGroup, average: bool) -> None:
    """One ``all_reduce`` of the flattened gradients of ``params`` (sum, or mean over the group)."""
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    if average:
        flat.div_(dist.get_world_size(group))
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


# ---------------------------------------------------------------------------------------------
# pipeline parallel


class Stage(nn.Module):
    """Stage ``rank`` of a 2-stage split: blocks ``[0, L/2)`` with the embedding, the rest with the head."""

    def __init__(self, model: GPT, rank: int, pp: int) -> None:
        super().__init__()
        if pp != 2:
            raise ValueError("the sample pipeline has exactly 2 stages")
        half = model.cfg.layers // 2
        self.first = rank == 0
        if self.first:
            self.embedding = copy.deepcopy(model.embedding)
            self.blocks = nn.ModuleList(copy.deepcopy(b) for b in model.blocks[:half])
        else:
            self.blocks = nn.ModuleList(copy.deepcopy(b) for b in model.blocks[half:])
            self.final = copy.deepcopy(model.final)

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if self.first:
            x = self.embedding(x)
        for b in self.blocks:
            x = b(x)
        return x if self.first else self.final(x, targets)


def pipeline_step(
    stage: Stage, tokens: torch.Tensor, targets: torch.Tensor, micro_batches: int, schedule: str, hidden: int
) -> torch.Tensor | None:
    """Forward and backward of one batch over ``micro_batches`` (GPipe or 1F1B); loss on the last stage."""
    m_total = micro_batches
    toks, tgts = tokens.chunk(m_total, dim=0), targets.chunk(m_total, dim=0)
    shape = (tokens.shape[1], tokens.shape[0] // m_total, hidden)  # [s, mb, h]
    if stage.first:
        outs: list[torch.Tensor] = []

        def fwd(m: int) -> None:
            outs.append(stage(toks[m]))

        def bwd(m: int, grad: torch.Tensor) -> None:
            outs[m].backward(grad)
            outs[m] = None

        if schedule == "gpipe":
            for m in range(m_total):
                fwd(m)
                dist.send(outs[m].detach(), 1, tag=m)
            for m in range(m_total):
                g = torch.empty(shape)
                dist.recv(g, 1, tag=m_total + m)
                bwd(m, g)
        else:  # 1F1B, warm-up of one forward on the first of two stages
            fwd(0)
            dist.send(outs[0].detach(), 1, tag=0)
            for m in range(m_total - 1):
                fwd(m + 1)
                g = torch.empty(shape)
                reqs = [dist.isend(outs[m + 1].detach(), 1, tag=m + 1), dist.irecv(g, 1, tag=m_total + m)]
                for r in reqs:
                    r.wait()
                bwd(m, g)
            g = torch.empty(shape)
            dist.recv(g, 1, tag=2 * m_total - 1)
            bwd(m_total - 1, g)
        return None

    total = torch.zeros(())
    inputs: list[torch.Tensor] = []
    losses: list[torch.Tensor] = []

    def recv_act(m: int) -> torch.Tensor:
        x = torch.empty(shape)
        dist.recv(x, 0, tag=m)
        return x

    def fwd(m: int, x: torch.Tensor) -> None:
        x.requires_grad_(True)
        inputs.append(x)
        losses.append(stage(x, tgts[m]) / m_total)

    def bwd(m: int) -> torch.Tensor:
        nonlocal total
        losses[m].backward()
        total = total + losses[m].detach()
        g = inputs[m].grad
        inputs[m] = losses[m] = None
        return g

    if schedule == "gpipe":
        for m in range(m_total):
            fwd(m, recv_act(m))
        for m in range(m_total):
            dist.send(bwd(m), 0, tag=m_total + m)
    else:  # 1F1B: the last stage alternates forward and backward from the start
        x = recv_act(0)
        for m in range(m_total):
            fwd(m, x)
            g = bwd(m)
            if m + 1 < m_total:
                x = torch.empty(shape)
                reqs = [dist.isend(g, 0, tag=m_total + m), dist.irecv(x, 0, tag=m + 1)]
                for r in reqs:
                    r.wait()
            else:
                dist.send(g, 0, tag=m_total + m)
    return total


# ---------------------------------------------------------------------------------------------
# expert parallel


class AllToAll(Function):
    """``all_to_all_single`` with equal splits; backward is the same exchange of gradients."""

    @staticmethod
    def forward(ctx, x, group):  # noqa: ANN001, D102
        ctx.group = group
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001, D102
        out = torch.empty_like(g)
        dist.all_to_all_single(out, g.contiguous(), group=ctx.group)
        return out, None


def make_expert_parallel(model: GPT, rank: int, ep: int, group: dist.ProcessGroup) -> GPT:
    """Keep this rank's ``E / ep`` experts in every MoE layer and route through all-to-all."""
    cfg = model.cfg
    if cfg.moe_experts % ep:
        raise ValueError("moe_experts must divide by ep")
    local = cfg.moe_experts // ep
    for block in model.blocks:
        moe = block.mlp
        moe.experts = nn.ModuleList(list(moe.experts)[rank * local : (rank + 1) * local])

        def run_experts(buf: torch.Tensor, moe=moe) -> torch.Tensor:  # noqa: ANN001
            e, c, h = buf.shape
            x = AllToAll.apply(buf, group).view(ep, local, c, h)  # [source rank, local expert, C, h]
            ys = [expert(x[:, i].reshape(ep * c, h)).view(ep, c, h) for i, expert in enumerate(moe.experts)]
            return AllToAll.apply(torch.stack(ys, dim=1).reshape(e, c, h), group)

        moe.run_experts = run_experts
    return model


def dense_params(model: GPT) -> list[nn.Parameter]:
    """Every parameter except the experts' (the ones data-parallel replicas share)."""
    expert = {id(p) for b in model.blocks if hasattr(b.mlp, "experts") for p in b.mlp.experts.parameters()}
    return [p for p in model.parameters() if id(p) not in expert]


# ---------------------------------------------------------------------------------------------
# fully sharded data parallel


class _GatherParams(Function):
    @staticmethod
    def forward(ctx, shard, unit):  # noqa: ANN001, D102
        ctx.unit = unit
        return unit.gather()

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001, D102
        unit = ctx.unit
        out = g.new_empty(unit.shard.shape)
        _reduce_scatter_flat(out, g.contiguous(), group=unit.group)
        out.div_(unit.ws)
        unit.full = None  # reshard
        return out, None


class _Saved:
    __slots__ = ("offset", "size", "stride")

    def __init__(self, t: torch.Tensor) -> None:
        self.offset, self.size, self.stride = t.storage_offset(), tuple(t.shape), tuple(t.stride())


class FSDPUnit(nn.Module):
    """One FSDP unit: a flat, padded 1/ws shard of ``module``'s parameters."""

    def __init__(self, module: nn.Module, rank: int, ws: int, group: dist.ProcessGroup) -> None:
        super().__init__()
        object.__setattr__(self, "module", module)  # not a submodule: its own weights are unused
        named = list(module.named_parameters())
        self.names = [n for n, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.numels = [p.numel() for _, p in named]
        self.numel = sum(self.numels)
        self.padded = math.ceil(self.numel / ws) * ws
        flat = F.pad(torch.cat([p.detach().reshape(-1) for _, p in named]), (0, self.padded - self.numel))
        self.shard = nn.Parameter(flat.view(ws, -1)[rank].clone())
        self.ws, self.group = ws, group
        self.full: torch.Tensor | None = None  # gathered again for backward
        self._ptr = -1

    def gather(self) -> torch.Tensor:
        """All-gather the full flat parameters."""
        out = self.shard.new_empty(self.padded)
        _all_gather_flat(out, self.shard.detach(), group=self.group)
        return out

    def _pack(self, t: torch.Tensor) -> object:
        if t.untyped_storage().data_ptr() == self._ptr:
            return _Saved(t)  # a view of the gathered parameters: do not keep it alive
        return t

    def _unpack(self, x: object) -> torch.Tensor:
        if isinstance(x, _Saved):
            if self.full is None:
                self.full = self.gather()
            return self.full.as_strided(x.size, x.stride, x.offset)
        return x

    def _pre_backward(self, grad: torch.Tensor) -> None:
        if self.full is None:
            self.full = self.gather()

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        full = _GatherParams.apply(self.shard, self)
        self._ptr = full.untyped_storage().data_ptr()
        params = {
            n: t.view(s)
            for n, t, s in zip(self.names, full[: self.numel].split(self.numels), self.shapes, strict=True)
        }
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            out = functional_call(self.module, params, args)
        self._ptr = -1
        out.register_hook(self._pre_backward)
        return out


class FSDPModel(nn.Module):
    """The decoder as FSDP units: embedding, each block, final (norm + head + loss)."""

    def __init__(self, model: GPT, rank: int, ws: int, group: dist.ProcessGroup) -> None:
        super().__init__()
        parts = [model.embedding, *model.blocks, model.final]
        self.units = nn.ModuleList(FSDPUnit(p, rank, ws, group) for p in parts)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.units[0](tokens)
        for unit in self.units[1:-1]:
            x = unit(x)
        return self.units[-1](x, targets)
