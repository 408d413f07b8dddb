"""``is_acyclic`` (sorting only the stretches of rows that backward edges cover) against networkx's
own ``is_directed_acyclic_graph`` on random graphs shaped like real ones: rows mostly following
their dependencies, with local and long back references, self-loops and dangling edges."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from ettools.graph_algorithms import _Edges, is_acyclic


def _oracle(n: int, src: np.ndarray, dst: np.ndarray) -> bool:
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    keep = src >= 0
    g.add_edges_from(zip(src[keep].tolist(), dst[keep].tolist()))
    return nx.is_directed_acyclic_graph(g)


@pytest.mark.parametrize("seed", range(40))
def test_agrees_with_networkx_on_random_graphs(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 400))
    m = int(rng.integers(1, 3 * n))
    src = rng.integers(0, n, m)
    span = rng.integers(1, 20, m)
    dst = np.minimum(src + span, n - 1)  # forward edges: rows follow their dependencies
    nb = int(rng.integers(0, 6))  # a few backward references, local or long
    if nb:
        at = rng.integers(0, m, nb)
        reach = rng.integers(0, n, nb) if seed % 3 == 0 else rng.integers(0, 8, nb)
        dst[at] = np.maximum(src[at] - reach, 0)
    if seed % 5 == 0:
        src[rng.integers(0, m)] = -1  # a dangling edge: ignored by both
    assert is_acyclic(_Edges(n, src, dst)) == _oracle(n, src, dst)


def test_known_cases():
    e = np.asarray
    assert is_acyclic(_Edges(3, e([0, 1]), e([1, 2])))
    assert not is_acyclic(_Edges(3, e([1]), e([1])))  # a self-loop
    assert not is_acyclic(_Edges(5, e([0, 1, 2, 3, 4]), e([1, 2, 3, 4, 0])))  # one long back edge
    assert is_acyclic(_Edges(5, e([4, 2]), e([3, 0])))  # back edges, no cycle
    assert not is_acyclic(_Edges(6, e([1, 2, 3, 4, 4]), e([2, 3, 4, 5, 2])))  # a cycle inside a stretch


def test_synthesized_graphs_are_acyclic():
    from ettools.converters.symbolic import synthesize

    res = synthesize("gpt3-5b", {"L": 4}, tp=2, pp=2, dp=2, batch=8, micro_batch=2, sp=True, zero=1,
                     schedule="interleaved", vpp=2)
    for g in res.trace.graphs.values():
        src, dst, _ = g.edge_rows()
        assert (src >= dst).any()  # the case the stretches are for
        assert is_acyclic(g) and _oracle(len(g), src, dst)


SHARED = __import__("pathlib").Path(__file__).resolve().parents[1].parent / "shared" / "traces"


@pytest.mark.parametrize("name", ["kineto/hta_alexnet_1rank", "kineto/hta_nccl_2rank", "pytorch_et/chakra_2rank_nccl",
                                  "chakra"])
def test_agrees_with_networkx_on_real_traces(name):
    """Real traces as the readers build them (Kineto, PyTorch ET, Chakra): the same answer as
    networkx, per rank."""
    from ettools.formats import load_trace

    path = SHARED / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    trace = load_trace([path]).trace
    for g in trace.graphs.values():
        src, dst, _ = g.edge_rows()
        assert is_acyclic(g) == _oracle(len(g), src, dst)
