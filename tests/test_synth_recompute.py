"""Activation recomputation as Megatron-LM defines it: ``full`` runs each layer's forward again in
its backward and keeps only the layer inputs; ``selective`` (``--recompute-granularity selective``,
Korthikanti et al. 2022) recomputes only the core attention -- the s x s scores, their softmax
and dropout -- and keeps everything else. Expected values come from the model's dimensions."""

from __future__ import annotations

import numpy as np
import pytest

from ettools.converters.symbolic.synth import synthesize
from ettools.graph import NodeType

B, S, H, NH, L, TP = 2, 512, 1024, 16, 2, 2
DIMS = {"L": L, "H": H, "NH": NH, "F": 4 * H, "V": 1024, "S": S}


def _plan(template: str, recompute):
    return synthesize(template, DIMS, tp=TP, batch=B, micro_batch=B, seq=S, recompute=recompute)


def _flops(res) -> float:
    g = res.rank_graph(0)
    comp = (g.type == NodeType.COMP_NODE) & (g.num_ops > 0)
    return float(g.num_ops[comp].sum())


def _peak(res) -> int:
    from ettools.converters.symbolic.synth import synth_summary

    return int(synth_summary(res)["ranks"]["0"]["peak_memory_bytes"])


def test_selective_recomputes_the_attention_score_gemms_only():
    """Unfused attention: the extra work is the two s x s batched GEMMs (Q·K^T and P·V, 2·b·s²·h
    FLOPs each per layer, split over TP) plus the softmax and dropout over the scores; a full
    recompute adds a whole forward (about a third of forward + backward)."""
    none, sel, full = (_flops(_plan("gpt_unfused", m)) for m in ("none", "selective", "full"))
    score_gemms = L * 2 * (2 * B * S * S * H) / TP
    assert score_gemms <= sel - none <= 1.05 * score_gemms
    assert full - none > 5 * (sel - none)


def test_selective_keeps_less_than_none_and_more_than_full():
    """Per layer, selective drops the saved softmax output and dropout output (2 bytes each over
    b · heads · s² / tp elements) from what no recomputation keeps."""
    none, sel, full = (_peak(_plan("gpt_unfused", m)) for m in ("none", "selective", "full"))
    dropped = L * 2 * 2 * B * NH * S * S // TP
    assert full < sel < none
    assert 0.95 * dropped <= none - sel <= 1.25 * dropped


def test_selective_with_fused_attention_runs_the_attention_kernel_again():
    """With a fused (flash) attention op Megatron-Core checkpoints the core attention module: its
    forward runs again in the backward; nothing of the s x s square was kept to begin with."""
    none, sel = (_plan("gpt3-1.3b", m) for m in ("none", "selective"))
    g_none, g_sel = none.rank_graph(0), sel.rank_graph(0)
    n_attn = [sum(1 for n in g.names() if n.startswith("attention") and "bwd" not in n) for g in (g_none, g_sel)]
    assert n_attn[1] == 2 * n_attn[0] > 0
    assert _flops(sel) > _flops(none)


def test_recompute_modes_are_named_and_checked():
    with pytest.raises(ValueError, match="recompute must be one of"):
        _plan("gpt_unfused", "partial")
    a, b = _plan("gpt_unfused", True), _plan("gpt_unfused", "full")
    assert np.array_equal(a.rank_graph(0).num_ops, b.rank_graph(0).num_ops)
