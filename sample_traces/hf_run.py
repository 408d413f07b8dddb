"""A plain Hugging Face forward loop, as a user would write it: ``python -m sample_traces.hf_run
CONFIG_DIR --batch B --length L [--iters N]``.

Builds the model of ``CONFIG_DIR/config.json`` (its ``architectures[0]``, or the ``transformers``
class ``--model-class`` names, e.g. the base ``Qwen2Model`` a trace ran without its LM head; random
weights, nothing downloaded) in bfloat16 on ``cuda`` with SDPA attention and runs ``N`` forwards under
``inference_mode``, synchronizing after each (the way the TraceLens ``hardware_pairs`` traces and
``sample_traces/hf_forward.py`` profiled theirs). Token models get ``B × L`` random ids, vision
models ``B`` images of ``L × L``. Used by ``ettools capture --emulate`` in
``tests/bench/bench_emulate_hf.py`` (no GPU needed there).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Run the forwards; print one line per iteration."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", type=Path, help="folder with config.json")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--length", type=int, required=True, help="tokens per sequence, or image side in pixels")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--model-class", default=None, help="transformers class to build (default: the config's architectures[0])")
    args = ap.parse_args(argv)
    import torch
    import transformers

    cfg = json.loads((args.config / "config.json").read_text())
    config = transformers.AutoConfig.from_pretrained(args.config)
    config._attn_implementation = "sdpa"
    model_cls = getattr(transformers, args.model_class or cfg["architectures"][0], None)
    if model_cls is None:
        ap.error(f"--model-class {args.model_class}: no such transformers class")
    model = model_cls(config).to("cuda", dtype=torch.bfloat16).eval()
    if "pixel" in model.main_input_name:
        inputs = {"pixel_values": torch.randn(args.batch, 3, args.length, args.length, device="cuda",
                                              dtype=torch.bfloat16)}
    else:
        inputs = {"input_ids": torch.randint(0, config.vocab_size, (args.batch, args.length), device="cuda")}
    with torch.inference_mode():
        for i in range(args.iters):
            model(**inputs)
            torch.cuda.synchronize()
            print(f"iteration {i + 1}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
