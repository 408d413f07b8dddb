"""A small GPT-style decoder for the sample captures (single-process reference model).

Activations use Megatron's ``[seq, batch, hidden]`` layout so the sequence dimension is the
leading, contiguous one that sequence parallelism splits. Linears have no bias. Options:
grouped-query attention (``kv_heads < heads``), gated FFN (SwiGLU: one fused ``fc1`` producing
gate and up halves), LayerNorm or RMSNorm, and a capacity-based top-k MoE FFN
(``moe_experts > 0``). Initialization is seeded (``GPTConfig.seed``), so every rank of a
parallel run builds bit-identical full weights and keeps its own shard.

The model is split in three kinds of part that the parallel variants reuse: ``Embedding``
(token + learned position), ``Block`` (norm, attention, norm, FFN/MoE, residuals) and ``Final``
(norm, LM head, cross-entropy loss).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sample_traces.models.config import GPTConfig

__all__ = ["GPT", "GPTConfig", "batch_for"]


def make_norm(cfg: GPTConfig) -> nn.Module:
    """LayerNorm (weight and bias) or RMSNorm (weight) over ``hidden``."""
    if cfg.norm == "layernorm":
        return nn.LayerNorm(cfg.hidden)
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.hidden)
    raise ValueError(f"unknown norm {cfg.norm!r}")


def attention_core(qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int) -> torch.Tensor:
    """Causal attention from fused ``qkv`` ``[s, b, (heads + 2 kv_heads) * d]`` to ``[s, b, heads * d]``."""
    s, b, _ = qkv.shape
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q = q.reshape(s, b, heads, head_dim).permute(1, 2, 0, 3)
    k = k.reshape(s, b, kv_heads, head_dim).permute(1, 2, 0, 3)
    v = v.reshape(s, b, kv_heads, head_dim).permute(1, 2, 0, 3)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=heads != kv_heads)
    return o.permute(2, 0, 1, 3).reshape(s, b, heads * head_dim)


def ffn_activation(h: torch.Tensor, gated: bool) -> torch.Tensor:
    """SwiGLU on the fused gate/up output, or GELU."""
    if gated:
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up
    return F.gelu(h)


class Embedding(nn.Module):
    """Token + learned position embedding; ``tokens [b, s]`` -> ``[s, b, h]``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.seq, cfg.hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tok(tokens.t()) + self.pos(pos).unsqueeze(1)


class Attention(nn.Module):
    """Fused QKV projection, causal (GQA) attention, output projection."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.qkv = nn.Linear(cfg.hidden, (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim, bias=False)
        self.proj = nn.Linear(cfg.heads * cfg.head_dim, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        return self.proj(attention_core(self.qkv(x), c.heads, c.kv_heads, c.head_dim))


class MLP(nn.Module):
    """``fc1`` (gate and up fused when gated), activation, ``fc2``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.gated = cfg.gated
        self.fc1 = nn.Linear(cfg.hidden, cfg.ffn_hidden * (2 if cfg.gated else 1), bias=False)
        self.fc2 = nn.Linear(cfg.ffn_hidden, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(ffn_activation(self.fc1(x), self.gated))


def route(logits: torch.Tensor, top_k: int, capacity: int) -> tuple[torch.Tensor, ...]:
    """Top-k routing with a fixed capacity per expert (GShard-style, first choices first).

    ``logits [T, E]`` -> ``(token, slot, weight)`` for the kept assignments: token row, slot
    ``expert * capacity + position`` in the dispatch buffer, and the renormalized gate weight.
    Assignments beyond an expert's capacity are dropped.
    """
    t, e = logits.shape
    probs = logits.softmax(dim=-1)
    w, idx = probs.topk(top_k, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    e_flat = idx.t().reshape(-1)  # choice-major: every first choice before any second choice
    onehot = F.one_hot(e_flat, e)
    pos = (onehot.cumsum(0) - 1).gather(1, e_flat.unsqueeze(1)).squeeze(1)
    keep = pos < capacity
    token = torch.arange(t, device=logits.device).repeat(top_k)[keep]
    slot = (e_flat * capacity + pos)[keep]
    return token, slot, w.t().reshape(-1)[keep]


class MoE(nn.Module):
    """Router + ``moe_experts`` FFN experts with a capacity-bounded dispatch buffer ``[E, C, h]``.

    ``experts`` holds the experts this process owns; :meth:`run_experts` maps the dispatch buffer
    to expert outputs (overridden by the expert-parallel variant, which all-to-alls it).
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.router = nn.Linear(cfg.hidden, cfg.moe_experts, bias=False)
        self.experts = nn.ModuleList(MLP(cfg) for _ in range(cfg.moe_experts))

    def run_experts(self, buf: torch.Tensor) -> torch.Tensor:
        """``buf [E, C, h]`` -> expert outputs ``[E, C, h]``."""
        return torch.stack([expert(buf[i]) for i, expert in enumerate(self.experts)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        s, b, h = x.shape
        x2 = x.reshape(s * b, h)
        cap = c.capacity(s * b)
        token, slot, weight = route(self.router(x2), c.moe_top_k, cap)
        buf = x2.new_zeros(c.moe_experts * cap, h).index_add(0, slot, x2.index_select(0, token))
        y = self.run_experts(buf.view(c.moe_experts, cap, h)).reshape(c.moe_experts * cap, h)
        out = x2.new_zeros(s * b, h).index_add(0, token, y.index_select(0, slot) * weight.unsqueeze(1))
        return out.view(s, b, h)


class Block(nn.Module):
    """Pre-norm decoder block."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.norm1 = make_norm(cfg)
        self.attn = Attention(cfg)
        self.norm2 = make_norm(cfg)
        self.mlp = MoE(cfg) if cfg.moe_experts else MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Final(nn.Module):
    """Final norm, LM head and mean cross-entropy; ``x [s, b, h]``, ``targets [b, s]``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.norm = make_norm(cfg)
        self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.t().reshape(-1))


class GPT(nn.Module):
    """The whole decoder: ``forward(tokens, targets) -> loss``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(cfg.seed)
        self.embedding = Embedding(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.final = Final(cfg)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
        torch.random.set_rng_state(gen_state)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x)
        return self.final(x, targets)


def batch_for(
    cfg: GPTConfig, step: int, replica: int = 0, batch: int | None = None
) -> tuple[torch.Tensor, ...]:
    """Deterministic random ``(tokens, targets)`` ``[b, s]`` for a step and data-parallel replica."""
    g = torch.Generator().manual_seed(cfg.seed * 1000003 + step * 101 + replica)
    b = cfg.batch if batch is None else batch
    data = torch.randint(0, cfg.vocab, (b, cfg.seq + 1), generator=g)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()
