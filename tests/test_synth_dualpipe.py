"""DualPipe (DeepSeek-V3 technical report, §3.2.1 and Table 2): two copies of the model, half the
micro-batches entering at each end, overlapped forward/backward pairs.

Table 2's bubbles, with F a forward chunk, B a full backward chunk, W its weight-gradient part and
F&B two mutually overlapped forward and backward chunks: 1F1B (PP − 1)(F + B), ZB1P
(PP − 1)(F + B − 2W), DualPipe (PP/2 − 1)(F&B + B − 3W). They are checked with a unit-time executor
written here (each rank runs its units in order; a forward waits for the previous stage's in its
direction, a backward for the next stage's; an overlapped pair starts once both halves may and
lasts F&B). DualPipe's bubble is the longest a rank idles. Table 2's figure holds exactly when a
backward's input-gradient part costs a forward (B − W = F, the setting of the report's Figure 5 and
of the zero-bubble paper's analysis); the costs below keep that and vary the overlap gain."""

from __future__ import annotations

import pytest
from test_synth_zero_bubble import _makespan

from ettools.converters.symbolic.dualpipe import chunk_stage, dualpipe_units
from ettools.converters.symbolic.synth import synthesize
from ettools.replay import replay_trace

FORWARD, BACKWARD = ("F", "OF"), ("B", "OB", "I")


def _dualpipe_run(pp: int, m: int, f: float, b: float, w: float, fb: float) -> tuple[float, list[float]]:
    """(makespan, each rank's busy time) of DualPipe with unit costs; b is a full backward."""
    orders = [dualpipe_units(pp, r, m) for r in range(pp)]
    cost = {"F": f, "B": b, "I": b - w, "W": w}
    end: dict[tuple[str, int, int], float] = {}
    at, clock, busy = [0] * pp, [0.0] * pp, [0.0] * pp

    def dep(kind: str, r: int, mb: int, c: int) -> tuple[str, int, int] | None:
        step = 1 if c == 0 else -1  # chunk 0 flows towards rank pp - 1, chunk 1 back
        peer = r - step if kind in FORWARD else r + step if kind in BACKWARD else -1
        return ("F" if kind in FORWARD else "B", peer, mb) if 0 <= peer < pp else None

    moved = True
    while moved:
        moved = False
        for r in range(pp):
            while at[r] < len(orders[r]):
                group = orders[r][at[r]:at[r] + (2 if orders[r][at[r]][0] == "OF" else 1)]
                deps = [d for d in (dep(k, r, mb, c) for k, mb, c in group) if d is not None]
                if any(d not in end for d in deps):
                    break
                t = fb if len(group) == 2 else cost[group[0][0]]
                clock[r] = max([clock[r]] + [end[d] for d in deps]) + t
                busy[r] += t
                for k, mb, _c in group:
                    end[("F" if k in FORWARD else "B" if k in BACKWARD else "W", r, mb)] = clock[r]
                at[r] += len(group)
                moved = True
    assert all(at[r] == len(orders[r]) for r in range(pp)), "the schedule deadlocks"
    return max(clock), busy


@pytest.mark.parametrize("pp,m", [(4, 8), (6, 12), (8, 20)])
@pytest.mark.parametrize("f,b,w,fb", [(1.0, 2.0, 1.0, 3.0), (1.0, 2.0, 1.0, 2.5), (1.2, 2.0, 0.8, 2.6),
                                      (1.0, 1.5, 0.5, 2.2)])
def test_bubbles_match_table_2(pp, m, f, b, w, fb):
    span, busy = _dualpipe_run(pp, m, f, b, w, fb)
    assert max(span - x for x in busy) == pytest.approx((pp / 2 - 1) * (fb + b - 3 * w))
    # the same costs under 1F1B and ZB1P (ZB-H1); that executor takes the input-gradient part
    work = m * (f + b)
    assert _makespan("1f1b", pp, m, f, b - w, w) - work == pytest.approx((pp - 1) * (f + b))
    assert _makespan("zb-h1", pp, m, f, b - w, w) - work == pytest.approx((pp - 1) * (f + b - 2 * w))


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (4, 14), (6, 12), (8, 16)])
def test_every_unit_once_and_pp_plus_1_micro_batches_in_flight(pp, m):
    """Each rank forwards and backwards each of its chunk's micro-batches once (chunk 0 the first
    half, chunk 1 the second), a split backward's weight half after it, overlapped halves adjacent;
    at most PP + 1 micro-batches' activations held (Table 2's activation column; 1F1B: PP)."""
    for r in range(pp):
        units = dualpipe_units(pp, r, m)
        for c, mbs in ((0, range(m // 2)), (1, range(m // 2, m))):
            assert sorted(i for k, i, cc in units if k in FORWARD and cc == c) == list(mbs)
            assert sorted(i for k, i, cc in units if k in BACKWARD and cc == c) == list(mbs)
        for j, (k, i, c) in enumerate(units):
            if k == "OF":
                assert units[j + 1][0] == "OB" and units[j + 1][2] != c
            if k == "I":
                assert ("W", i, c) in units[j + 1:]
        assert sum(k == "W" for k, _i, _c in units) == sum(k == "I" for k, _i, _c in units)
        live = peak = 0
        for k, _i, _c in units:
            live += 1 if k in FORWARD else -1 if k in ("B", "OB", "W") else 0
            peak = max(peak, live)
        assert peak == pp + 1


@pytest.mark.parametrize("pp,m,rule", [(3, 12, "even number of pipeline stages"), (4, 7, "even"),
                                       (4, 6, "at least 2 x pp")])
def test_refused_outside_its_rules(pp, m, rule):
    with pytest.raises(ValueError, match=rule):
        synthesize("gpt3-1.3b", {"L": 12}, pp=pp, schedule="dualpipe", batch=m, micro_batch=1)


def test_chunks_and_mirror_reduction():
    """Rank r runs stage r of the forward copy and stage pp-1-r of the reverse one; after its last
    unit it all-reduces both chunks' gradients with rank pp-1-r, and the optimizer waits for that."""
    res = synthesize("gpt3-1.3b", {"L": 8, "V": 512}, pp=4, schedule="dualpipe", batch=8, micro_batch=1,
                     tie_embeddings=False)
    groups = res.trace.meta.process_groups
    assert sorted(g.ranks for g in groups.values() if g.desc == "mirror") == [(0, 3), (1, 2)]
    assert [chunk_stage(4, 1, c) for c in (0, 1)] == [1, 2]
    for r in range(4):
        g = res.rank_graph(r)
        names = g.names()
        red = [i for i, n in enumerate(names) if n == "all_reduce dualpipe.mirror_grads"]
        assert len(red) == 1
        assert groups[g.strings.decode(g.comm_group[red[:1]])[0]].ranks == (min(r, 3 - r), max(r, 3 - r))
        deps = set(g.dep_id[g.dep_ptr[red[0]]:g.dep_ptr[red[0] + 1]].tolist())
        assert max(i for i, n in enumerate(names) if n.startswith("matmul.wgrad")) in deps
        opt = [i for i, n in enumerate(names) if n.startswith("adam ")]
        assert opt and all(red[0] in g.dep_id[g.dep_ptr[i]:g.dep_ptr[i + 1]].tolist() for i in opt)
    # ranks 0 and 3 hold the same two stages (each the other's copy): the same bytes reduced
    b = [int(res.rank_graph(r).comm_bytes[res.rank_graph(r).names().index("all_reduce dualpipe.mirror_grads")])
         for r in range(4)]
    assert b[0] == b[3] > 0 and b[1] == b[2] > 0


def test_activation_memory_is_pp_plus_1_micro_batches():
    """The replay's memory report (the synthesizer's peak) holds PP + 1 micro-batches of a middle
    rank's chunk (both its chunks are two layers), where 1F1B's stage 1 holds PP − 1."""
    kw = dict(pp=4, batch=8, micro_batch=1, tie_embeddings=False)
    dual = synthesize("gpt3-1.3b", {"L": 8, "V": 512}, schedule="dualpipe", **kw)
    one = synthesize("gpt3-1.3b", {"L": 8, "V": 512}, schedule="1f1b", **kw)
    assert dual.stages[1].activation_bytes * 3 == one.stages[1].activation_bytes * 5
    rep = replay_trace(dual.trace)
    assert rep.memory[1]["peak_bytes"] == dual.stages[1].peak_memory


def test_tied_embedding_needs_no_collective_of_its_own():
    """Ranks 0 and pp-1 hold one copy's embedding and the other's head: the mirror reduction over
    those two ranks sums them, so no embedding all-reduce is issued and the bytes stay the same."""
    kw = dict(pp=4, schedule="dualpipe", batch=8, micro_batch=1)
    tied = synthesize("gpt3-1.3b", {"L": 8}, tie_embeddings=True, **kw)
    untied = synthesize("gpt3-1.3b", {"L": 8}, tie_embeddings=False, **kw)
    for r in range(4):
        names = tied.rank_graph(r).names()
        assert not any(n.endswith("embedding_grads") for n in names)
        i = names.index("all_reduce dualpipe.mirror_grads")
        j = untied.rank_graph(r).names().index("all_reduce dualpipe.mirror_grads")
        assert tied.rank_graph(r).comm_bytes[i] == untied.rank_graph(r).comm_bytes[j]


def test_overlapped_backward_does_not_wait_for_its_forward():
    """In a pair the backward's receive follows what came before the pair, not the forward beside
    it (under 1F1B every receive follows the send just before it)."""
    for schedule, overlapped in (("dualpipe", True), ("1f1b", False)):
        res = synthesize("gpt3-1.3b", {"L": 8, "V": 512}, pp=4, schedule=schedule, batch=8, micro_batch=1,
                         tie_embeddings=False)
        g = res.rank_graph(1)
        names = g.names()
        pairs = [i for i in range(1, len(names)) if names[i].startswith("recv_grad") and names[i - 1].startswith("send_act")]
        free = [i for i in pairs if i - 1 not in g.dep_id[g.dep_ptr[i]:g.dep_ptr[i + 1]].tolist()]
        assert pairs and (len(free) > 0) == overlapped


def test_command_line(tmp_path):
    from click.testing import CliRunner

    from ettools.cli import main

    base = ["synth", "--model", "gpt3-5b", "--dim", "L=8", "--pp", "4", "--schedule", "dualpipe", "--micro-batch", "1",
            "--quiet"]
    ok = CliRunner().invoke(main, [*base, "--batch", "8", "-o", str(tmp_path / "ok")])
    assert ok.exit_code == 0, ok.output
    assert len(list((tmp_path / "ok").glob("*.et"))) == 4
    bad = CliRunner().invoke(main, [*base, "--batch", "4", "-o", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "2 x pp" in bad.output and len(bad.output.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()
