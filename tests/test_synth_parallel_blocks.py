"""Parallel attention + MLP blocks (GPT-J, GPT-NeoX, PaLM) and partial rotary embeddings.

Expected values are the models' published shapes worked out by hand here: a parallel block
``x + attn(ln(x)) + mlp(ln(x))`` needs one tensor-parallel all-reduce in the forward (the two
branches' partial sums added first) and one in the backward (the two gradients of ``ln(x)``
added first), where a sequential block needs two each."""

from __future__ import annotations

import numpy as np
import pytest

from ettools.converters.symbolic.synth import synthesize


def _tp_all_reduces(model: str, layers: int) -> int:
    g = synthesize(model, {"L": layers}, tp=2, batch=1, micro_batch=1, seq=128).rank_graph(0)
    return sum(1 for n in g.names() if n.startswith("all_reduce"))


@pytest.mark.parametrize("model,per_layer", [("gpt-j-6b", 2), ("gpt-neox-20b", 2), ("palm-540b", 2),
                                             ("gpt3-1.3b", 4), ("llama3-8b", 4)])
def test_all_reduces_per_layer(model, per_layer):
    assert _tp_all_reduces(model, 3) - _tp_all_reduces(model, 2) == per_layer


@pytest.mark.parametrize("model,nh,hd,rd", [("gpt-j-6b", 16, 256, 64), ("gpt-neox-20b", 64, 96, 24)])
def test_partial_rotary_rotates_rd_of_hd_dimensions(model, nh, hd, rd):
    """RoPE costs 3 FLOPs per rotated element: 3·b·s·heads·RD over the tp=2 shard, for q and k."""
    g = synthesize(model, {"L": 1}, tp=2, batch=1, micro_batch=1, seq=128).rank_graph(0)
    flops = np.asarray(g.num_ops, float)
    rope = [flops[i] for i, n in enumerate(g.names()) if n.startswith("rope ")]
    assert rope == [3 * 128 * nh * rd / 2] * 2


def test_gptj_parameters():
    """GPT-J-6B (H 4096, F 16384, 28 layers, vocabulary 50,400, untied head, one LayerNorm per
    parallel block) without the linear biases the template leaves out (6,050,258,944 of the
    published 6.05 B): 2·V·H + L·(2H + 4H² + 2HF) + 2H, counted from what its optimizer updates."""
    V, H, F, L = 50400, 4096, 16384, 28
    expected = 2 * V * H + L * (2 * H + 4 * H * H + 2 * H * F) + 2 * H
    g = synthesize("gpt-j-6b", batch=1, micro_batch=1, seq=128).rank_graph(0)
    flops = np.asarray(g.num_ops, float)
    updated = sum(flops[i] for i, n in enumerate(g.names()) if n.startswith("adam ")) / 12  # 12 FLOPs per parameter
    assert updated == expected
