"""Structure digests in Chakra headers (issue 27): ``ettools synth`` writes each rank file's class
(a digest of all it shares with the files of its structure, and its group key per slot); a reader
that trusts them builds a rank from a file of the same digest and the rank's header alone.

What is checked against independent facts: the trusting read equals the full read of every file;
the header's keys are groups of ``comm_group.json`` that hold the rank and cover every ``pg_name``
its file names; pipeline stages (different node lists) never share a digest; a file without the
digest is read in full; a rewrite does not carry a digest its graph no longer has.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from ettools.cli import main
from ettools.converters.chakra.reader import read_chakra, read_header
from ettools.converters.symbolic import synthesize
from ettools.converters.symbolic.write import write_synth
from ettools.graph import NODE_COLUMNS, NodeType

PLAN = dict(model="gpt3-5b", dims={"L": 2}, tp=2, pp=2, dp=2, batch=8, micro_batch=2)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    write_synth(synthesize(**PLAN), out, progress=False)
    return out


def _decoded(g, col):
    v = getattr(g, col)
    if col in ("name", "comm_group"):
        return [g.strings[i] if i >= 0 else None for i in v.tolist()]
    return v


def _same_graph(a, b) -> None:
    assert len(a) == len(b)
    for col in NODE_COLUMNS:
        x, y = _decoded(a, col), _decoded(b, col)
        if isinstance(x, list):
            assert x == y, col
        else:
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), col
    assert np.array_equal(a.dep_ptr, b.dep_ptr) and np.array_equal(a.dep_id, b.dep_id)
    assert {k: v for k, v in a.meta.items() if k != "chakra_decoder"} == \
        {k: v for k, v in b.meta.items() if k != "chakra_decoder"}


def test_trusting_read_equals_the_full_read(written):
    full = read_chakra(written)
    trusted = read_chakra(written, trust_structure=True)
    digests = {full.graphs[r].meta["structure"] for r in full.graphs}
    assert len(full.graphs) == 8
    # one file per digest is read; every other rank is built from its header
    assert trusted.meta.extra["ranks_from_headers"] == 8 - len(digests)
    assert sum(g.meta["chakra_decoder"] == "header" for g in trusted.graphs.values()) == 8 - len(digests)
    for r in full.graphs:
        _same_graph(full.graphs[r], trusted.graphs[r])
    # the pipeline's sends and receives were moved to each rank's own peer
    sends = [r for r, g in full.graphs.items() if (g.type == NodeType.COMM_SEND_NODE).any()]
    assert sends


def test_header_keys_are_the_ranks_groups(written):
    groups = json.loads((written / "comm_group.json").read_text())
    full = read_chakra(written)
    for r, g in full.graphs.items():
        head = read_header(written / f"synth.{r}.et")
        keys = head["slot_groups"]
        assert keys and all(r in groups[k] for k in keys)
        named = {g.strings[i] for i in g.comm_group[g.comm_group >= 0].tolist()}
        assert named <= set(keys)
        assert head["structure"] == g.meta["structure"]


def test_stages_never_share_a_digest(written):
    full = read_chakra(written)
    by_digest: dict[str, set] = {}
    for g in full.graphs.values():
        by_digest.setdefault(g.meta["structure"], set()).add(tuple(g.names()))
    # one node list per digest, and the two stages' node lists differ
    assert all(len(v) == 1 for v in by_digest.values())
    assert len({next(iter(v)) for v in by_digest.values()}) >= 2


def test_a_file_without_a_digest_is_read_in_full(written, tmp_path):
    out = tmp_path / "mixed"
    out.mkdir()
    for p in written.iterdir():
        (out / p.name).write_bytes(p.read_bytes())
    # rank 3 rewritten by the plain Chakra writer: same graph, no digest in its header
    res = CliRunner().invoke(main, ["convert", str(written / "synth.3.et"), "--to", "chakra", "-o",
                                    str(tmp_path / "r3"), "--quiet"])
    assert res.exit_code == 0, res.output
    (rewritten,) = sorted((tmp_path / "r3").glob("*.et"))
    assert "structure" not in (read_header(rewritten) or {})
    (out / "synth.3.et").write_bytes(rewritten.read_bytes())
    trusted = read_chakra(out, trust_structure=True)
    assert trusted.graphs[3].meta["chakra_decoder"] != "header"
    assert trusted.meta.extra["ranks_from_headers"] == read_chakra(written, trust_structure=True) \
        .meta.extra["ranks_from_headers"] - 1


def test_symmetric_replay_reads_one_file_per_structure(written):
    runner = CliRunner()
    sym = runner.invoke(main, ["replay", str(written), "--symmetric", "--json", "--quiet"])
    full = runner.invoke(main, ["replay", str(written), "--no-symmetric", "--json", "--quiet"])
    assert sym.exit_code == 0 and full.exit_code == 0, sym.output + full.output
    a, b = json.loads(sym.output), json.loads(full.output)
    assert a["ranks_from_headers"] > 0 and b["ranks_from_headers"] == 0
    assert a["simulated_ranks"] < b["simulated_ranks"] == 8
    assert a["step_time_us"] == pytest.approx(b["step_time_us"], rel=1e-9)
    default = json.loads(runner.invoke(main, ["replay", str(written), "--json", "--quiet"]).output)
    assert default["symmetric"] and default["ranks_from_headers"] == a["ranks_from_headers"]
    assert default["step_time_us"] == a["step_time_us"]
    text = runner.invoke(main, ["replay", str(written), "--symmetric", "--quiet"]).output
    assert "rank files built from their header's structure digest" in text
