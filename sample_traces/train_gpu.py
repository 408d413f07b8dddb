"""The sample decoder trained on one GPU: ``python -m sample_traces.train_gpu SIZE``.

Like ``train.py`` this knows nothing about profiling; ``ettools capture`` records a step from
outside (``python -m sample_traces.regenerate_gpu`` on a machine with a GPU). The sizes span
launch-bound (``tiny``, the CPU ``single`` scenario's model) to GPU-bound (``large``), so the
real GPU captures test prediction where the host and where the device sets the pace. Prints the
loss of every step (which synchronizes the device once per step, as most training loops do).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from sample_traces.models.config import GPTConfig
from sample_traces.scenarios import BASE

# name -> (config, parameter dtype). Dimensions are a scaled-down Llama: GQA, gated FFN.
GPU_SIZES: dict[str, tuple[GPTConfig, str]] = {
    "tiny": (BASE, "float32"),
    "small": (
        replace(BASE, vocab=8192, seq=256, hidden=512, heads=8, kv_heads=4, ffn_hidden=1408, layers=4),
        "float32",
    ),
    "medium": (
        replace(BASE, vocab=32000, seq=1024, hidden=1024, heads=16, kv_heads=8, ffn_hidden=2816, layers=8),
        "bfloat16",
    ),
    "medium_b16": (
        replace(
            BASE, vocab=32000, seq=1024, batch=16, hidden=1024, heads=16, kv_heads=8, ffn_hidden=2816, layers=8
        ),
        "bfloat16",
    ),
    "large": (
        replace(BASE, vocab=32000, seq=2048, batch=16, hidden=2048, heads=16, kv_heads=8, ffn_hidden=5632, layers=8),
        "bfloat16",
    ),
    "medium_moe": (
        replace(
            BASE, vocab=32000, seq=1024, hidden=1024, heads=16, kv_heads=8, ffn_hidden=1408, layers=4,
            moe_experts=8, moe_top_k=2,
        ),
        "bfloat16",
    ),
}
STEPS = 6


def main(argv: list[str] | None = None) -> int:
    """Train ``STEPS`` AdamW steps of the chosen size on ``cuda``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("size", choices=sorted(GPU_SIZES))
    ap.add_argument("--steps", type=int, default=STEPS)
    args = ap.parse_args(argv)
    if not 1 <= args.steps <= 1000:
        ap.error("--steps must be 1..1000")
    import torch

    from sample_traces.models.gpt import GPT, batch_for

    if not torch.cuda.is_available():
        print("train_gpu: no CUDA/ROCm device", file=sys.stderr)
        return 2
    cfg, dtype = GPU_SIZES[args.size]
    device = torch.device("cuda")
    model = GPT(cfg).to(device=device, dtype=getattr(torch, dtype))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(1, args.steps + 1):
        tokens, targets = (t.to(device, non_blocking=True) for t in batch_for(cfg, step))
        opt.zero_grad(set_to_none=True)
        loss = model(tokens, targets)
        loss.backward()
        opt.step()
        print(f"{args.size} step {step} loss {loss.item():.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
