"""``serve --network`` / ``StepCost(network=...)``: a given network (here a fit of measured
collective tables, ``ettools calibrate --network``) times the engine's tensor-parallel collectives,
not only the prefill→decode KV transfer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ettools.cli import main
from ettools.graph import NodeType
from ettools.replay.netfit import CommFit
from ettools.replay.serve import StepCost

ALPHA_US = 100.0


def _fit(alpha_us: float) -> dict:
    """A network whose every ring step costs ``alpha_us`` and whose bytes are free."""
    return CommFit(alpha_us, 0.0, 10, source=f"test: {alpha_us} us per ring step").to_dict()


@pytest.mark.parametrize("tp", [2, 4])
def test_each_tp_all_reduce_of_a_decode_step_pays_the_given_network(tp: int) -> None:
    dims = {"L": 4}
    free = StepCost("llama3-8b", system="H100", tp=tp, dims=dims, network=_fit(0.0))
    slow = StepCost("llama3-8b", system="H100", tp=tp, dims=dims, network=_fit(ALPHA_US))
    t_free, _ = free.replay("decode", 8, 1024)
    t_slow, _ = slow.replay("decode", 8, 1024)
    g = free._synth("decode", 8, 1024).trace.graphs[0]
    colls = int((g.type == NodeType.COMM_COLL_NODE).sum())
    assert colls > 0
    # all collectives of a TP decode step are on the critical path: ring all-reduce, 2 (n - 1) steps
    assert t_slow - t_free == pytest.approx(colls * 2 * (tp - 1) * ALPHA_US, rel=0.01)


def test_serve_network_option_times_the_engine(tmp_path: Path) -> None:
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(_fit(ALPHA_US)))
    base = ["serve", "--model", "llama3-8b", "--dim", "L=4", "--gpus", "2", "--tp", "2", "--rate", "2",
            "--duration", "5", "--json"]
    default = json.loads(CliRunner().invoke(main, base).output)
    given = json.loads(CliRunner().invoke(main, [*base, "--network", str(slow)]).output)
    # 100 µs per ring step is far slower than NVLink's default: every decode step is longer
    assert given["tpot_ms"]["p50"] > default["tpot_ms"]["p50"] + 1.0
