"""Profile a Hugging Face model's forward pass on a GPU: ``python -m sample_traces.hf_forward OUT [MODEL ...]``.

The models are built from their configurations (random weights, nothing downloaded) and
profiled the way the TraceLens ``hardware_pairs`` traces in ``../shared/traces`` were:
``inference_mode``, bfloat16, 5 warm-up forwards, 1 waited, 1 recorded (``ProfilerStep``), the
device synchronized after each, ``record_shapes``, ``profile_memory``, ``with_stack``,
``with_flops``, ``with_modules``. ``qwen1.5_0.5b`` runs the shared pair's model at the batch and
length its metadata names (16 × 2048; the shared traces' tokenized input is 16 × 559, so the
two are not the same run); the others are models no shared trace has. Needs ``transformers``
and a GPU; writes ``OUT/<model>.json.gz`` and ``OUT/hf_manifest.json``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import time
from pathlib import Path

# name -> (config class, config kwargs, model class, input kind, batch, sequence length)
HF_MODELS: dict[str, tuple[str, dict, str, str, int, int]] = {
    "qwen1.5_0.5b": ("Qwen2Config", {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 24,
                     "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 151936,
                     "max_position_embeddings": 32768, "tie_word_embeddings": True},
                     "Qwen2ForCausalLM", "tokens", 16, 2048),
    # the tokenized length of the shared pair's input (its Input Dims), not the nominal 2048
    "qwen1.5_0.5b_s559": ("Qwen2Config", {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 24,
                          "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 151936,
                          "max_position_embeddings": 32768, "tie_word_embeddings": True},
                          "Qwen2ForCausalLM", "tokens", 16, 559),
    "gpt2": ("GPT2Config", {}, "GPT2LMHeadModel", "tokens", 8, 1024),
    "tinyllama_1.1b": ("LlamaConfig", {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
                       "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000,
                       "max_position_embeddings": 2048}, "LlamaForCausalLM", "tokens", 4, 2048),
    "bert_base": ("BertConfig", {}, "BertForMaskedLM", "tokens", 16, 512),
    "vit_base": ("ViTConfig", {}, "ViTForImageClassification", "pixels", 32, 224),
}


def profile_model(name: str, out: Path) -> dict:
    """Profile one model's forward; return its manifest entry."""
    import torch
    import transformers
    from torch.profiler import ProfilerActivity, profile, schedule

    cfg_cls, kwargs, model_cls, kind, batch, length = HF_MODELS[name]
    config = getattr(transformers, cfg_cls)(**kwargs)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).to("cuda", dtype=torch.bfloat16).eval()
    if kind == "tokens":
        inputs = {"input_ids": torch.randint(0, config.vocab_size, (batch, length), device="cuda")}
    else:
        inputs = {"pixel_values": torch.randn(batch, 3, length, length, device="cuda", dtype=torch.bfloat16)}
    warmups, wait = 5, 1
    t0 = time.perf_counter()
    with torch.inference_mode():
        for _ in range(warmups):
            model(**inputs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                     schedule=schedule(wait=wait, warmup=1, active=1), record_shapes=True,
                     profile_memory=True, with_stack=True, with_flops=True, with_modules=True) as prof:
            for _ in range(wait + 2):
                model(**inputs)
                torch.cuda.synchronize()
                prof.step()
    raw = out / f"{name}.json"
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.GzipFile(out / f"{name}.json.gz", "wb", mtime=0) as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    return {"config_class": cfg_cls, "config": kwargs, "model_class": model_cls, "input": kind,
            "batch": batch, "length": length, "dtype": "bfloat16", "grad_mode": "inference_mode",
            "warmups": warmups + 1, "wait": wait, "wall_s": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    """Profile the chosen models (default: all) into ``OUT``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("models", nargs="*", metavar="MODEL", help=f"default: all of {', '.join(HF_MODELS)}")
    args = ap.parse_args(argv)
    unknown = [m for m in args.models if m not in HF_MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; choose from {', '.join(HF_MODELS)}")
    import torch
    import transformers

    args.out.mkdir(parents=True, exist_ok=True)
    manifest = {"generated_by": "python -m sample_traces.hf_forward", "gpu": torch.cuda.get_device_name(0),
                "torch": torch.__version__, "transformers": transformers.__version__, "models": {}}
    for name in args.models or list(HF_MODELS):
        manifest["models"][name] = profile_model(name, args.out)
        print(f"{name}: {manifest['models'][name]['wall_s']} s", flush=True)
    (args.out / "hf_manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
