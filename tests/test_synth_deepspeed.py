"""DeepSpeed's pipeline engine as a plan (``--schedule deepspeed``): its TrainSchedule's steps,
its deferred blocking exchanges, its reductions after the last step, ZeRO stage 0/1 only.

Expected values come from DeepSpeed's schedule as documented (``deepspeed/runtime/pipe/schedule.py``):
stage ``s`` of ``p`` runs the forward of micro-batch ``i`` at step ``2i + s`` and its backward at
step ``2i + 2p - 1 - s``, out of ``2(m + p - 1)`` steps; a forward step receives its activation and
then sends the previous step's input gradient."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from graph_walk import ancestors

from ettools.cli import main
from ettools.converters.symbolic.schedule import stage_units
from ettools.converters.symbolic.synth import synthesize
from ettools.replay import replay_trace


@pytest.mark.parametrize("pp,m", [(4, 8), (3, 5), (2, 1), (5, 3)])
def test_steps_follow_deepspeeds_closed_form(pp, m):
    for s in range(pp):
        steps = stage_units("deepspeed", pp, s, m)
        assert len(steps) == 2 * (m + pp - 1)
        for i in range(m):
            assert steps[2 * i + s] == ("F", i, 0)
            assert steps[2 * i + 2 * pp - 1 - s] == ("B", i, 0)
        busy = [u for u in steps if u[0] in ("F", "B")]
        assert len(busy) == 2 * m  # every other step is idle
        live = peak = 0
        for kind, _i, _c in busy:
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
        assert peak == min(pp - s, m)  # DeepSpeed keeps at most p - s activations in flight


def _names(res, rank):
    return [n for n in res.rank_graph(rank).names() if n.startswith(("send_", "recv_"))]


def test_a_forward_step_receives_before_it_sends_the_previous_gradient():
    """Stage 1 of 4 in its steady state: recv_act(next) comes before send_grad(previous) —
    Megatron's 1F1B sends the gradient right after the backward, before the next receive."""
    kw = dict(pp=4, batch=8, micro_batch=1)
    ds = _names(synthesize("gpt3-1.3b", {"L": 8}, schedule="deepspeed", **kw), 1)
    mg = _names(synthesize("gpt3-1.3b", {"L": 8}, schedule="1f1b", **kw), 1)
    first_send_grad = ds.index("send_grad gpt_block")
    assert ds[first_send_grad - 1] == "recv_act gpt_block"
    i = mg.index("send_grad gpt_block")
    assert mg[i - 1] == "recv_grad gpt_block"  # the contrast: sent before the next receive


def test_same_bubble_as_1f1b_without_communication():
    """Both schedules take (m + p - 1)(tF + tB) on balanced stages: the replayed steps agree."""
    kw = dict(pp=4, batch=8, micro_batch=1, tie_embeddings=False, grad_accumulation="separate")
    ds = replay_trace(synthesize("gpt3-1.3b", {"L": 8}, schedule="deepspeed", **kw).trace)
    mg = replay_trace(synthesize("gpt3-1.3b", {"L": 8}, schedule="1f1b", **kw).trace)
    assert ds.step_time_us == pytest.approx(mg.step_time_us, rel=0.02)


def test_gradient_reductions_wait_for_the_last_step():
    res = synthesize("gpt3-1.3b", {"L": 8}, pp=2, dp=2, batch=8, micro_batch=2, zero=1, schedule="deepspeed")
    g = res.rank_graph(0)  # stage 0: its last step sends nothing, its reductions follow its last backward
    g1 = res.rank_graph(2)  # stage 1: the last step is an idle forward step that sends the last gradient
    for graph in (g, g1):
        names = graph.names()
        last_p2p = max(i for i, n in enumerate(names) if n.startswith(("send_", "recv_")))
        for r in (i for i, n in enumerate(names) if n.startswith("reduce_scatter")):
            seen = ancestors(graph, r)
            assert last_p2p in seen, names[r]


def test_zero_2_and_3_are_refused():
    with pytest.raises(ValueError, match="ZeRO stage 0 or 1"):
        synthesize("gpt3-1.3b", {"L": 4}, pp=2, dp=2, batch=4, micro_batch=2, zero=2, schedule="deepspeed")
    r = CliRunner().invoke(main, ["synth", "--model", "gpt3-1.3b", "--dim", "L=4", "--pp", "2", "--dp", "2",
                                  "--zero", "2", "--schedule", "deepspeed", "-o", "/nonexistent/x"])
    assert r.exit_code == 2 and "ZeRO stage 0 or 1" in r.output


def _accumulations(res, rank: int) -> dict[str, list[tuple[int, int]]]:
    g = res.rank_graph(rank)
    out: dict[str, list[tuple[int, int]]] = {}
    for i, n in enumerate(g.names()):
        if n.startswith("add.grad_accumulation "):
            out.setdefault(n.split(" ", 1)[1], []).append((int(g.columns["tensor_size"][i]),
                                                           int(g.columns["num_ops"][i])))
    return out


def test_separate_accumulation_adds_every_local_gradient_after_the_first_micro_batch():
    """Autograd accumulates a micro-batch's weight gradients into the earlier ones' with an in-place
    add (read both, write one): the GPT block (no biases: QKV, projection and the 4H MLP, 12 H^2
    weights, plus two LayerNorms' weight and bias, 4 H), bf16, once per block and micro-batch after
    the first. DeepSpeed's engine runs it so; a Megatron plan fuses it into the GEMMs (none)."""
    h, layers, m = 256, 2, 4
    dims = {"L": layers, "H": h, "F": 4 * h, "V": 1000, "S": 64}
    res = synthesize("gpt", dims, pp=1, batch=m, micro_batch=1, grad_accumulation="separate")
    acc = _accumulations(res, 0)
    block = 12 * h * h + 4 * h
    assert acc["gpt_block"] == [(3 * 2 * block, block)] * ((m - 1) * layers)
    assert acc["gpt_embedding"] == [(3 * 2 * (1000 + 64) * h, (1000 + 64) * h)] * (m - 1)
    assert _accumulations(synthesize("gpt", dims, pp=1, batch=m, micro_batch=1), 0) == {}
    # under TP 2 each rank accumulates its half of the block's weights (the LayerNorms whole)
    tp2 = _accumulations(synthesize("gpt", dims, tp=2, batch=m, micro_batch=1, grad_accumulation="separate"), 0)
    assert tp2["gpt_block"][0] == (3 * 2 * (6 * h * h + 4 * h), 6 * h * h + 4 * h)


def test_deepspeed_accumulates_separately_by_default_and_it_costs_time():
    kw = dict(pp=2, batch=8, micro_batch=1, tie_embeddings=False)
    ds = synthesize("gpt3-1.3b", {"L": 4}, schedule="deepspeed", **kw)
    assert sum(len(v) for v in _accumulations(ds, 0).values()) == (8 - 1) * (2 + 1)  # 2 blocks + embedding
    assert ds.plan.grad_accumulation == "separate"
    assert ds.trace.meta.extra["synth"]["plan"]["grad_accumulation"] == "separate"  # said in the trace
    fused = synthesize("gpt3-1.3b", {"L": 4}, schedule="deepspeed", grad_accumulation="fused", **kw)
    assert _accumulations(fused, 0) == {}
    assert replay_trace(ds.trace).step_time_us > replay_trace(fused.trace).step_time_us


def test_grad_accumulation_option_is_checked():
    runner = CliRunner()
    r = runner.invoke(main, ["synth", "--model", "gpt3-1.3b", "--phase", "decode", "--grad-accumulation",
                             "separate", "-o", "/nonexistent/x"])
    assert r.exit_code == 2 and "inference" in r.output
    r = runner.invoke(main, ["synth", "--model", "gpt3-1.3b", "--grad-accumulation", "sometimes", "-o", "/nonexistent/x"])
    assert r.exit_code == 2 and "--grad-accumulation" in r.output
    with pytest.raises(ValueError, match="grad_accumulation"):
        synthesize("gpt3-1.3b", {"L": 2}, grad_accumulation="sometimes")
