"""A Hugging Face ``config.json`` as a model preset: the built-in template of its architecture
family with the config's dimensions (``ettools synth --model path/to/config.json``; a folder
holding one works too).

The mapping reads the fields ``transformers`` itself reads (``num_hidden_layers``,
``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``,
``intermediate_size``, ``vocab_size``, and the MoE / MLA / rotary fields of each family). The
sequence length is the template's default capped at ``max_position_embeddings`` (a config states
the longest context, not the training length: ``--seq`` sets it). A family without a template here,
or a feature the template does not have (DeepSeek-V3's query LoRA), is refused with the reason,
never approximated silently.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .ir import Model
from .presets import Preset
from .templates import load_template

# model_type -> template: decoders that are Llama's shapes (RMSNorm/LayerNorm, GQA, RoPE, gated FFN
# of three matrices), whatever their activation or weight fusion
_LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "olmo", "olmo2", "granite",
               "internlm2")
SUPPORTED = (*_LLAMA_LIKE, "mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_neox", "gptj", "gpt2")


def config_path(model: str | Path) -> Path | None:
    """The ``config.json`` that ``model`` names (the file, or a folder holding one), or None."""
    p = Path(str(model))
    if p.is_dir() and (p / "config.json").is_file():
        return p / "config.json"
    if p.is_file() and p.suffix == ".json":
        return p
    return None


def _int(cfg: dict[str, Any], *keys: str, default: int | None = None) -> int:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    if default is not None:
        return default
    raise ValueError(f"config.json has no positive integer {' or '.join(keys)}")


def hf_model(path: Path) -> tuple[Model, Preset]:
    """The template and the :class:`~.presets.Preset` of a Hugging Face config (module doc): the
    sequence is the template's default capped at the config's context; when the config ties its
    LM head to the embedding and the template cannot, the preset's ``notes`` option says so
    (synthesis prints its notes)."""
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise ValueError(f"{path}: not a Hugging Face config (no model_type)")
    kind = str(cfg["model_type"])
    name = f"{path.parent.name or 'hf'} ({kind} config)"
    if kind in _LLAMA_LIKE or kind in ("mixtral", "qwen3_moe"):
        nh = _int(cfg, "num_attention_heads")
        h = _int(cfg, "hidden_size")
        dims = {"L": _int(cfg, "num_hidden_layers"), "H": h, "NH": nh,
                "KV": _int(cfg, "num_key_value_heads", default=nh), "HD": _int(cfg, "head_dim", default=h // nh),
                "F": _int(cfg, "intermediate_size"), "V": _int(cfg, "vocab_size")}
        template = "llama"
        if kind == "mixtral":
            template = "moe"
            dims.update(E=_int(cfg, "num_local_experts"), K=_int(cfg, "num_experts_per_tok"))
        elif kind == "qwen3_moe":
            if cfg.get("mlp_only_layers") or _int(cfg, "decoder_sparse_step", default=1) != 1:
                raise ValueError(f"{path}: qwen3_moe with dense layers between the MoE layers has no template here")
            template = "moe"
            dims.update(E=_int(cfg, "num_experts"), K=_int(cfg, "num_experts_per_tok"),
                        F=_int(cfg, "moe_intermediate_size"))
    elif kind in ("deepseek_v2", "deepseek_v3"):
        if cfg.get("q_lora_rank"):
            raise ValueError(f"{path}: {kind} with a query LoRA (q_lora_rank {cfg['q_lora_rank']}) has no template "
                             "here (the mla template projects the query at full rank)")
        ld = _int(cfg, "first_k_dense_replace", default=0)
        if ld < 1:
            raise ValueError(f"{path}: {kind} without a dense first layer (first_k_dense_replace 0) has no template here")
        if _int(cfg, "num_hidden_layers") <= ld:
            raise ValueError(f"{path}: {kind} with no MoE layer (num_hidden_layers <= first_k_dense_replace {ld}) "
                             "has no template here")
        template = "mla"
        dims = {"L": _int(cfg, "num_hidden_layers") - ld, "LD": ld, "H": _int(cfg, "hidden_size"),
                "NH": _int(cfg, "num_attention_heads"), "KR": _int(cfg, "kv_lora_rank"),
                "DN": _int(cfg, "qk_nope_head_dim"), "DR": _int(cfg, "qk_rope_head_dim"),
                "DV": _int(cfg, "v_head_dim"), "F": _int(cfg, "moe_intermediate_size"),
                "FD": _int(cfg, "intermediate_size"), "E": _int(cfg, "n_routed_experts"),
                "K": _int(cfg, "num_experts_per_tok"), "ES": _int(cfg, "n_shared_experts", default=1),
                "V": _int(cfg, "vocab_size")}
    elif kind in ("gpt_neox", "gptj"):
        nh = _int(cfg, "num_attention_heads", "n_head")
        h = _int(cfg, "hidden_size", "n_embd")
        hd = h // nh
        rd = (_int(cfg, "rotary_dim", default=hd) if kind == "gptj"
              else max(1, round(float(cfg.get("rotary_pct", 1.0)) * hd)))
        template = "gptj"
        dims = {"L": _int(cfg, "num_hidden_layers", "n_layer"), "H": h, "NH": nh, "HD": hd, "RD": rd,
                "F": _int(cfg, "intermediate_size", "n_inner", default=4 * h), "V": _int(cfg, "vocab_size")}
    elif kind == "gpt2":
        h = _int(cfg, "n_embd", "hidden_size")
        template = "gpt"
        dims = {"L": _int(cfg, "n_layer", "num_hidden_layers"), "H": h, "F": _int(cfg, "n_inner", default=4 * h),
                "V": _int(cfg, "vocab_size")}
    else:
        raise ValueError(f"{path}: model_type {kind!r} has no template here (supported: {', '.join(SUPPORTED)}; "
                         "or write a template file)")
    model = load_template(template)
    default_seq = int(model.defaults.get("S", 2048))
    context = _int(cfg, "max_position_embeddings", "n_positions", "n_ctx", default=default_seq)
    dims["S"] = min(default_seq, context)
    note = (f"from {path}: {kind} as the {template} template; sequence {dims['S']} "
            f"(the template's default {default_seq} capped at the config's context {context}; --seq sets it)")
    notes = [f"{path.name}: {kind} as the {template} template, sequence {dims['S']} (the template's default "
             f"{default_seq} capped at the config's context {context}; --seq sets it)"]
    tied = bool(cfg.get("tie_word_embeddings", kind == "gpt2"))
    if tied and not model.ties:
        notes.append(f"{path.name} ties the LM head to the token embedding; the {template} template keeps them "
                     f"apart: one more {dims['V']} x {dims['H']} matrix of weights, gradients and optimizer state")
    return model, Preset(name, template, dims, note, {"notes": tuple(notes)})
