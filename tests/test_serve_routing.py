"""Request routing across serving engines (issue 24: load-aware routing across replicas)."""

from __future__ import annotations

import numpy as np
import pytest

from ettools.replay.serve import StepCost, simulate_serving
from ettools.replay.serve.routing import route
from ettools.replay.serve.workload import Workload


class _Tokens:
    """Every token costs 1 µs: a request's estimated work is prompt + output × per-sequence decode."""

    def iteration_us(self, n_tokens, n_logits, decode_context, prefill_pairs, n_seqs=None):
        return float(n_tokens)


def _brute(arr, work, n):
    """Least backlog by direct simulation; among idle engines the one idle longest (then the lowest)."""
    free_at, out = np.zeros(n), []
    for t, w in zip(arr, work):
        backlog = np.maximum(free_at - t, 0.0)
        idle = backlog == 0
        k = int(np.argmin(np.where(idle, free_at, np.inf))) if idle.any() else int(np.argmin(backlog))
        out.append(k)
        free_at[k] = max(free_at[k], t) + w
    return np.array(out)


def test_round_robin_is_arrival_order_modulo_engines():
    assert route(np.arange(7.0), np.ones(7), np.ones(7), 3, "round-robin").tolist() == [0, 1, 2, 0, 1, 2, 0]


def test_least_work_matches_a_direct_backlog_simulation():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n, e = int(rng.integers(1, 300)), int(rng.integers(1, 9))
        arr = np.sort(rng.uniform(0, 1e4, n))
        prompt, output = rng.integers(1, 500, n), rng.integers(1, 50, n)
        got = route(arr, prompt, output, e, "least-work", _Tokens())
        work = prompt + output * 1.0  # per-sequence decode time of a batch of 32 at 1 µs/token: 1 µs
        assert got.tolist() == _brute(arr, work, e).tolist()


def test_prefix_routing_pins_groups_and_balances_the_rest():
    group = np.array([3, -1, 1, -1, 3, 2, -1])
    eng = route(np.arange(7.0), np.full(7, 10), np.full(7, 1), 2, "prefix", _Tokens(), group)
    assert all(eng[i] == group[i] % 2 for i in range(7) if group[i] >= 0)


def test_least_work_spreads_long_requests_round_robin_stacks():
    # long and short requests alternate: round-robin sends every long one to engine 0
    n = 40
    w = Workload(np.arange(n) * 0.02, np.where(np.arange(n) % 2 == 0, 4096, 64), np.full(n, 64))
    cost = StepCost("llama3-8b", system="H100")
    rr = simulate_serving("llama3-8b", w, gpus=2, cost=cost).to_json()
    lw = simulate_serving("llama3-8b", w, gpus=2, cost=cost, routing="least-work").to_json()
    assert lw["ttft_ms"]["p99"] < rr["ttft_ms"]["p99"]


def test_prefix_routing_raises_the_cache_hit_rate():
    rng = np.random.default_rng(1)
    n = 80
    w = Workload(np.arange(n) * 0.2, np.full(n, 1024 + 64), np.full(n, 16), np.full(n, 1024), rng.integers(0, 4, n))
    cost = StepCost("llama3-8b", dims={"L": 4}, system="H100")
    rr = simulate_serving("llama3-8b", w, gpus=4, cost=cost).to_json()["prefix_cache"]["hit_tokens"]
    px = simulate_serving("llama3-8b", w, gpus=4, cost=cost, routing="prefix").to_json()["prefix_cache"]["hit_tokens"]
    # prefix routing prefills each of the 4 prefixes once; round-robin once per (engine, group) met
    assert px == (n - 4) * 1024
    assert rr < px


def test_unknown_routing_refused():
    with pytest.raises(ValueError, match="unknown routing"):
        route(np.zeros(2), np.ones(2), np.ones(2), 2, "random")
