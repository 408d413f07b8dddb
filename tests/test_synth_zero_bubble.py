"""Zero-bubble ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): the backward
split into B (input gradients) and W (weight gradients), W deferred into the bubbles.

The bubble formulas are the paper's: 1F1B idles (p − 1)(T_F + T_B + T_W) per stage, ZB-H1
(p − 1)(T_F + T_B − T_W). The schedule is checked with a unit-time executor written here (each
stage runs its units in order; a forward waits for the previous stage's, a B for the next stage's)."""

from __future__ import annotations

import pytest

from ettools.converters.symbolic.schedule import stage_units
from ettools.converters.symbolic.synth import synthesize
from ettools.replay import replay_trace


def _makespan(schedule: str, p: int, m: int, tf: float, tb: float, tw: float) -> float:
    orders = [stage_units(schedule, p, s, m) for s in range(p)]
    cost = {"F": tf, "B": tb if schedule == "zb-h1" else tb + tw, "W": tw}
    end: dict[tuple[str, int, int], float] = {}
    at, clock = [0] * p, [0.0] * p
    moved = True
    while moved:
        moved = False
        for s in range(p):
            while at[s] < len(orders[s]):
                kind, mb, _c = orders[s][at[s]]
                dep = ("F", s - 1, mb) if kind == "F" and s > 0 else ("B", s + 1, mb) if kind == "B" and s < p - 1 else None
                if dep is not None and dep not in end:
                    break
                start = max(clock[s], end[dep] if dep else 0.0)
                clock[s] = end[(kind, s, mb)] = start + cost[kind]
                at[s] += 1
                moved = True
    assert all(at[s] == len(orders[s]) for s in range(p)), "the schedule deadlocks"
    return max(clock)


@pytest.mark.parametrize("p,m", [(4, 8), (8, 16), (6, 12)])
@pytest.mark.parametrize("tf,tb,tw", [(1.0, 1.0, 1.0), (1.0, 1.2, 0.8)])
def test_bubbles_match_the_papers_formulas(p, m, tf, tb, tw):
    work = m * (tf + tb + tw)
    assert _makespan("zb-h1", p, m, tf, tb, tw) == pytest.approx(work + (p - 1) * (tf + tb - tw))
    assert _makespan("1f1b", p, m, tf, tb, tw) == pytest.approx(work + (p - 1) * (tf + tb + tw))


@pytest.mark.parametrize("p,m", [(4, 8), (3, 2), (5, 5)])
def test_same_in_flight_forwards_as_1f1b_and_every_unit_once(p, m):
    for s in range(p):
        units = stage_units("zb-h1", p, s, m)
        for kind in "FBW":
            assert sorted(i for k, i, _c in units if k == kind) == list(range(m))
        for i in range(m):  # F before B before W of each micro-batch
            assert units.index(("F", i, 0)) < units.index(("B", i, 0)) < units.index(("W", i, 0))
        live = peak = 0
        for k, _i, _c in units:
            live += {"F": 1, "B": -1, "W": 0}[k]
            peak = max(peak, live)
        ref = max(sum(1 for k, _i, _c in stage_units("1f1b", p, s, m)[:j] if k == "F")
                  - sum(1 for k, _i, _c in stage_units("1f1b", p, s, m)[:j] if k == "B")
                  for j in range(2 * m + 1))
        assert peak == ref


def test_replayed_step_shorter_than_1f1b_with_the_same_work():
    """A balanced pipeline (small vocabulary: no heavy last stage): the same nodes, less idle."""
    kw = dict(pp=4, batch=8, micro_batch=1, tie_embeddings=False)
    runs = {s: replay_trace(synthesize("gpt3-1.3b", {"L": 8, "V": 512}, schedule=s, **kw).trace)
            for s in ("1f1b", "zb-h1")}
    one, zb = runs["1f1b"], runs["zb-h1"]
    for r in one.ranks:
        assert zb.ranks[r].compute_us == pytest.approx(one.ranks[r].compute_us, rel=1e-9)
    assert zb.step_time_us < 0.95 * one.step_time_us


def test_weight_gradients_run_where_the_schedule_puts_them():
    """On the last of 4 stages ZB-H1 defers 3 weight gradients: W0 starts after B3 ends."""
    res = synthesize("gpt3-1.3b", {"L": 8, "V": 512}, pp=4, schedule="zb-h1", batch=8, micro_batch=1,
                     tie_embeddings=False)
    rep = replay_trace(res.trace)
    rank = max(rep.ranks)
    start, end = rep.replayed_times(rank)
    names = res.rank_graph(rank).names()
    wgrad = [i for i, n in enumerate(names) if n.startswith("matmul.wgrad")]
    dgrad = [i for i, n in enumerate(names) if n.startswith("matmul.dgrad")]
    per_mb_w, per_mb_b = len(wgrad) // 8, len(dgrad) // 8
    first_w = min(start[i] for i in sorted(wgrad)[:per_mb_w])
    b3_end = max(end[i] for i in sorted(dgrad)[3 * per_mb_b:4 * per_mb_b])
    assert first_w >= b3_end
