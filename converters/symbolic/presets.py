"""Model presets: a built-in template plus published dimensions.

Symbols: ``L`` layers, ``H`` hidden, ``F`` FFN hidden (per expert for MoE), ``NH`` attention
heads, ``KV`` key/value heads (GQA; ``KV = NH`` is multi-head, 1 multi-query), ``HD`` head
dimension, ``V`` vocabulary (padded to a multiple of 128 as Megatron-LM does where the paper's
vocabulary does not divide), ``S`` default sequence length; MoE: ``E`` routed experts, ``K``
experts per token, ``ES`` shared experts, ``FD`` FFN hidden of the dense layers, ``LD`` dense
layers before the MoE layers; MLA: ``QR`` query LoRA rank (0: none), ``KR`` key/value LoRA rank,
``DN`` no-RoPE head dim, ``DR`` RoPE head dim, ``DV`` value head dim; Mamba: ``N`` state size,
``X`` expansion, ``R`` Δ rank, ``CK`` conv kernel.
Sources: GPT-3 paper (Brown et al. 2020, Table 2.1); Llama 3 herd paper (Table 3); Mixtral paper;
DeepSeekMoE paper / HF config (deepseek-moe-16b-base); DeepSeek-V2(-Lite) HF configs; PaLM paper
(Table 1); Mamba paper / HF config (state-spaces/mamba-2.8b).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Preset:
    """A named model: template, dimension values and defaults it implies for synthesis."""

    name: str
    template: str
    dims: dict[str, int]
    note: str = ""
    options: dict[str, object] = field(default_factory=dict)


def _gpt(L: int, H: int, NH: int, S: int = 2048, V: int = 51200) -> dict[str, int]:
    return {"L": L, "H": H, "NH": NH, "F": 4 * H, "S": S, "V": V}


def _llama(L: int, H: int, NH: int, KV: int, F: int, V: int = 128256, S: int = 8192) -> dict[str, int]:
    return {"L": L, "H": H, "NH": NH, "KV": KV, "HD": H // NH, "F": F, "V": V, "S": S}


PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset("gpt3-125m", "gpt", _gpt(12, 768, 12)),
    Preset("gpt3-1.3b", "gpt", _gpt(24, 2048, 16)),
    Preset("gpt3-5b", "gpt", _gpt(24, 4096, 32), "STAGE's GPT-3-5B: dmodel 4096, dff 16384, 32 heads, 24 layers"),
    Preset("gpt3-5b-stage", "gpt_stage", _gpt(24, 4096, 32),
           "GPT-3-5B modelled as STAGE does (one-hot embeddings, fused attention weight)",
           {"grad_sync": "microbatch", "optimizer": None, "fsdp_modules": ("stage_block",),
            "vocab_parallel": False}),
    Preset("gpt3-6.7b", "gpt", _gpt(32, 4096, 32)),
    Preset("gpt3-13b", "gpt", _gpt(40, 5120, 40), "the paper's d_model 5140 does not split into 40 heads of 128"),
    Preset("gpt3-175b", "gpt", _gpt(96, 12288, 96)),
    Preset("llama3-8b", "llama", _llama(32, 4096, 32, 8, 14336)),
    Preset("llama3-70b", "llama", _llama(80, 8192, 64, 8, 28672)),
    Preset("llama3-405b", "llama", _llama(126, 16384, 128, 8, 53248)),
    Preset("mixtral-8x7b", "moe", {**_llama(32, 4096, 32, 8, 14336, V=32000, S=4096), "E": 8, "K": 2}),
    Preset("deepseek-moe-16b", "deepseek_moe",
           {"L": 27, "LD": 1, "H": 2048, "NH": 16, "KV": 16, "HD": 128, "F": 1408, "FD": 10944,
            "E": 64, "K": 6, "ES": 2, "V": 102400, "S": 4096},
           "28 layers: 1 dense + 27 MoE (64 routed experts, top-6, 2 shared)"),
    Preset("deepseek-v2-lite", "mla",
           {"L": 26, "LD": 1, "H": 2048, "NH": 16, "KR": 512, "DN": 128, "DR": 64, "DV": 128,
            "F": 1408, "FD": 10944, "E": 64, "K": 6, "ES": 2, "V": 102400, "S": 4096},
           "27 layers: 1 dense + 26 MoE, multi-head latent attention (no query LoRA)"),
    Preset("gpt-j-6b", "gptj", {"L": 28, "H": 4096, "NH": 16, "HD": 256, "RD": 64, "F": 16384, "V": 50400,
                                "S": 2048},
           "parallel attention/FFN blocks, rotary on 64 of each head's 256 dimensions, untied head"),
    Preset("gpt-neox-20b", "gptj", {"L": 44, "H": 6144, "NH": 64, "HD": 96, "RD": 24, "F": 24576, "V": 50432,
                                    "S": 2048},
           "parallel attention/FFN blocks, rotary on 24 of each head's 96 dimensions (rotary_pct 0.25)"),
    Preset("palm-540b", "palm", {"L": 118, "H": 18432, "NH": 48, "KV": 1, "HD": 256, "F": 73728,
                                 "V": 256000, "S": 2048},
           "parallel attention/FFN blocks, multi-query attention, SwiGLU"),
    Preset("mamba-2.8b", "mamba", {"L": 64, "H": 2560, "X": 2, "N": 16, "R": 160, "CK": 4, "V": 50304,
                                   "S": 2048}),
]}


# Dimensions a preset family derives from others (the rule its published values follow): an
# override of an input re-derives them unless they are given too. GPT-3: FFN = 4 x hidden (Brown et
# al. Table 2.1); Llama/Mixtral/DeepSeekMoE: head dim = hidden / heads. Others (Llama's FFN, PaLM's
# head dim) are published values with no exact rule: they stay as given.
DERIVED: dict[str, dict[str, str]] = {
    "gpt": {"F": "4*H"},
    "gpt_stage": {"F": "4*H"},
    "llama": {"HD": "H/NH"},
    "moe": {"HD": "H/NH"},
    "deepseek_moe": {"HD": "H/NH"},
}


def derived_dims(preset: Preset) -> dict[str, str]:
    """``{dimension: rule}`` the preset derives (e.g. ``{"F": "4*H"}``); empty if none."""
    return dict(DERIVED.get(preset.template, {}))


def get_preset(name: str) -> Preset | None:
    """The preset ``name`` (case-insensitive), or None."""
    return PRESETS.get(name.lower())


def preset_names() -> list[str]:
    """All preset names."""
    return sorted(PRESETS)
