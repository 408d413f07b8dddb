"""Closed-loop load (``serve --concurrency C``), as genai-perf and ``vllm bench serve
--max-concurrency`` drive an engine: C clients, each sending its next request when its previous
one finishes.

The properties are checked from the per-request times the simulation returns, against laws of
closed systems (the response-time law X = N / R with no think time), not against the simulator's
own counters.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from ettools.cli import main
from ettools.replay.serve import StepCost, simulate_serving
from ettools.replay.serve.workload import Workload


@pytest.fixture(scope="module")
def cost():
    return StepCost("llama3-8b", dims={"L": 4}, system="H100")


def _wl(n: int, prompt: int = 512, output: int = 64, seed: int = 0) -> Workload:
    rng = np.random.default_rng(seed)
    return Workload(np.zeros(n), rng.integers(prompt // 2, prompt * 2, n), rng.integers(output // 2, output * 2, n))


@pytest.mark.parametrize("scheduler", ["continuous", "chunked", "static"])
def test_one_client_sends_each_request_when_the_last_finishes(cost, scheduler):
    r = simulate_serving("llama3-8b", _wl(12), cost=cost, concurrency=1, scheduler=scheduler)
    arr, fin = r.workload.arrival_s, r.finish_s
    assert arr[0] == 0.0
    assert np.allclose(arr[1:], fin[:-1], rtol=0, atol=1e-12)
    assert (r.first_s > arr).all() and (fin > r.first_s).all()


@pytest.mark.parametrize("clients", [3, 8])
def test_never_more_requests_in_flight_than_clients_and_the_response_time_law(cost, clients):
    n = 40 * clients
    r = simulate_serving("llama3-8b", _wl(n), cost=cost, concurrency=clients, scheduler="chunked")
    arr, fin = r.workload.arrival_s, r.finish_s
    # requests in the system just after each arrival: arrived and not finished
    events = np.sort(arr)
    in_flight = np.array([((arr <= t) & (fin > t)).sum() for t in events])
    assert in_flight.max() == clients
    # the response-time law of a closed system without think time: throughput = clients / mean
    # response time, over the steady part (the first and last waves left out)
    keep = (np.arange(n) >= clients) & (np.arange(n) < n - clients)
    span = fin[keep].max() - arr[keep].min()
    x = keep.sum() / span
    r_mean = (fin - arr)[keep].mean()
    assert x * r_mean == pytest.approx(clients, rel=0.05)


def test_more_clients_more_throughput_and_longer_latency(cost):
    res = {c: simulate_serving("llama3-8b", _wl(30 * c), cost=cost, concurrency=c, scheduler="chunked").to_json()
           for c in (1, 4, 16)}
    tput = [res[c]["tokens_per_s"] for c in (1, 4, 16)]
    tpot = [res[c]["tpot_ms"]["mean"] for c in (1, 4, 16)]
    assert tput[0] < tput[1] < tput[2]
    assert tpot[0] < tpot[1] < tpot[2]


def test_clients_spread_over_engines(cost):
    """Two engines, five clients: three on engine 0, two on engine 1 (client j on engine j mod 2)."""
    n = 50
    r = simulate_serving("llama3-8b", _wl(n), cost=cost, gpus=2, concurrency=5, scheduler="chunked")
    arr, fin = r.workload.arrival_s, r.finish_s
    for k, clients in ((0, 3), (1, 2)):
        a, f = arr[k::2], fin[k::2]
        assert max(((a <= t) & (f > t)).sum() for t in a) == clients


def test_closed_loop_refuses_what_it_does_not_model(cost):
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        simulate_serving("llama3-8b", _wl(4), cost=cost, concurrency=0)
    with pytest.raises(ValueError, match="closed loop"):
        simulate_serving("llama3-8b", _wl(4), cost=cost, gpus=2, prefill_gpus=1, concurrency=2)


def test_cli_concurrency():
    args = ["serve", "--model", "llama3-8b", "--dim", "L=2", "--num-requests", "24", "--prompt-tokens", "256",
            "--output-tokens", "32", "--json", "--quiet"]
    res = CliRunner().invoke(main, [*args, "--concurrency", "4"])
    assert res.exit_code == 0, res.output
    j = json.loads(res.output)
    assert j["requests"] == 24 and j["options"]["concurrency"] == 4
    assert j["mean_in_system"] == pytest.approx(4, rel=0.05)
    for bad in ("0", "-3", "1000000000000"):
        r = CliRunner().invoke(main, [*args, "--concurrency", bad])
        assert r.exit_code == 2 and "--concurrency" in r.output, (bad, r.output)
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--dim", "L=2", "--rate", "1", "--concurrency", "2"])
    assert r.exit_code == 2 and "--concurrency" in r.output
