"""Model dimensions of the sample decoder (no torch import: the manifest is computed from it)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class GPTConfig:
    """Model dimensions; ``batch`` is the per-replica batch of one optimizer step."""

    vocab: int = 256
    seq: int = 32
    batch: int = 8
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    ffn_hidden: int = 128
    gated: bool = True
    norm: str = "layernorm"  # or "rmsnorm"
    moe_experts: int = 0  # 0: dense FFN
    moe_top_k: int = 2
    moe_capacity_factor: float = 1.0
    seed: int = 1234

    @property
    def head_dim(self) -> int:
        """Per-head width."""
        return self.hidden // self.heads

    def capacity(self, tokens: int) -> int:
        """Slots per expert for ``tokens`` routed tokens (GShard: ceil(cf * k * T / E))."""
        return math.ceil(self.moe_capacity_factor * self.moe_top_k * tokens / self.moe_experts)

    def to_dict(self) -> dict:
        """Plain dict for the manifest."""
        return asdict(self)
