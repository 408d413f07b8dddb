"""Emulated capture at scale: ``python tests/bench/bench_emulate_scale.py [--ranks 64] [--seq 4096]``.

A Llama-3-8B-sized ``transformers`` model (``LlamaForCausalLM`` from a config: hidden 4,096, 32
layers, 32 heads, 8 KV heads, vocabulary 128,256) trained with FSDP2 (``fully_shard`` per layer,
bf16 parameters, fp32 reduction) by an unmodified ``torchrun`` script, captured with ``ettools
capture --emulate H100`` on this machine. Prints the capture's wall time and the peak RSS of its
process tree against the issue's limits (10 minutes, 8 GiB) as ratios, the dedup line, and the
replayed step (modelled, not measured).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIMIT_S, LIMIT_RSS = 600.0, 8 << 30
SCRIPT = """
import os, sys, torch, torch.distributed as dist, transformers
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
config = transformers.AutoConfig.from_pretrained(sys.argv[1])
with torch.device("meta"):
    model = transformers.LlamaForCausalLM(config)
mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
for layer in model.model.layers:
    fully_shard(layer, mp_policy=mp)
fully_shard(model, mp_policy=mp)
model.to_empty(device="cuda")
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(3):
    ids = torch.randint(0, config.vocab_size, (1, int(sys.argv[2])), device="cuda")
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()
"""


def main(argv: list[str] | None = None) -> int:
    """Run the capture and print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--seq", type=int, default=4096)
    args = ap.parse_args(argv)
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        cfg_dir = Path(tmp) / "llama3_8b"
        cfg_dir.mkdir()
        cfg = transformers.LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                       num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                       max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=False)
        (cfg_dir / "config.json").write_text(json.dumps(cfg.to_dict()))
        script = Path(tmp) / "train_fsdp.py"
        script.write_text(SCRIPT)
        out = Path(tmp) / "out"
        nodes = max(1, args.ranks // 8)
        per_node = args.ranks // nodes
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "ettools", "capture", "--emulate", "H100", "-o", str(out), "--",
                              "torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(per_node), str(script),
                              str(cfg_dir), str(args.seq)], cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        lines = [ln for ln in res.stderr.splitlines() if ln.startswith("ettools capture:") and "emulated rank" not in ln]
        print("\n".join(lines))
        if res.returncode != 0:
            print(f"capture failed (exit {res.returncode})")
            return 1
        rep = subprocess.run([sys.executable, "-m", "ettools", "replay", str(out), "--json"], cwd=REPO,
                             capture_output=True, text=True)
        step = json.loads(rep.stdout)["step_time_us"] / 1e3 if rep.returncode == 0 else float("nan")
    print(f"Llama-3-8B FSDP2, {args.ranks} emulated H100s, sequence {args.seq}: capture {wall:.1f} s "
          f"({wall / LIMIT_S:.2f} of the 10-minute limit), peak RSS of a process {rss / 2**30:.2f} GiB "
          f"({rss / LIMIT_RSS:.2f} of 8 GiB); replayed step {step:.1f} ms (modelled)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
