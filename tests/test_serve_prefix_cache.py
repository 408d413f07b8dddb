"""Prefix caching in ``ettools serve`` (issue 24): shared prompt prefixes prefilled once per engine."""

from __future__ import annotations

import numpy as np
import pytest

from ettools.errors import TraceError
from ettools.replay.serve import StepCost, simulate_serving, synthetic
from ettools.replay.serve.engine import EngineConfig, run_engine
from ettools.replay.serve.workload import Workload, load_requests


class _Linear:
    """A cost that charges every new token 10 µs and nothing else: prefill work is visible as time."""

    gpus = 1
    alpha_us = 0.0

    def iteration_us(self, n_tokens, n_logits, decode_context, prefill_pairs, n_seqs=None):
        return 10.0 * n_tokens


def _spaced(n: int, prompt: int, prefix: int, groups: list[int], gap_us: float = 1e6):
    arr = np.arange(n) * gap_us
    return arr, np.full(n, prompt), np.full(n, 4), np.full(n, prefix), np.asarray(groups)


def test_hits_are_whole_blocks_of_the_prefix_after_its_first_prefill():
    # 6 requests, 2 groups, prefix 100 tokens of 16-token blocks: 96 cacheable; the first of each
    # group prefills everything, the four others skip 96 tokens each
    arr, pr, out, pre, grp = _spaced(6, 300, 100, [0, 1, 0, 1, 0, 1])
    r = run_engine(arr, pr, out, _Linear(), EngineConfig(block_tokens=16), pre, grp)
    assert r.prefix_hit_tokens == 4 * 96
    ttft = r.first_token - arr
    assert ttft[:2] == pytest.approx([3000.0, 3000.0])  # 300 tokens at 10 us
    assert ttft[2:] == pytest.approx([(300 - 96) * 10.0] * 4)


def test_no_caching_without_groups_or_when_off():
    arr, pr, out, pre, grp = _spaced(4, 300, 100, [0, 0, 0, 0])
    plain = run_engine(arr, pr, out, _Linear(), EngineConfig(block_tokens=16))
    ungrouped = run_engine(arr, pr, out, _Linear(), EngineConfig(block_tokens=16), pre, np.full(4, -1))
    assert plain.prefix_hit_tokens == ungrouped.prefix_hit_tokens == 0
    np.testing.assert_array_equal(plain.first_token, ungrouped.first_token)
    static = run_engine(arr, pr, out, _Linear(), EngineConfig(policy="static", block_tokens=16), pre, grp)
    assert static.prefix_hit_tokens == 0  # static batching has no prefix cache


def test_a_whole_cached_prompt_still_computes_its_last_token():
    arr, pr, out, pre, grp = _spaced(2, 64, 64, [0, 0])
    r = run_engine(arr, pr, out, _Linear(), EngineConfig(block_tokens=16), pre, grp)
    assert r.prefix_hit_tokens == 48  # 3 of the 4 blocks: the last block holds the token computed anew
    assert r.first_token[1] - arr[1] == pytest.approx(16 * 10.0)


def test_cached_blocks_are_evicted_rather_than_blocking_admission():
    # a cache of 40 blocks; each request needs 20 (prefix 160 tokens = 10 blocks) and there are 20
    # groups: without eviction the cached prefixes would fill the cache and admission would stall
    n = 60
    arr = np.arange(n) * 1e4
    r = run_engine(arr, np.full(n, 300), np.full(n, 16), _Linear(), EngineConfig(block_tokens=16, kv_blocks=40),
                   np.full(n, 160), np.arange(n) % 20)
    assert np.isfinite(r.finish).all()
    assert r.kv_used.max() <= 40


def test_serving_with_a_shared_system_prompt():
    cost = StepCost("llama3-8b", dims={"L": 4}, system="H100")
    w = synthetic(4.0, None, 30.0, "128", "32", seed=2, shared_prefix=1024, prefix_groups=3)
    assert (w.prompt == 1024 + 128).all() and set(np.unique(w.group)) <= {0, 1, 2}
    on = simulate_serving("llama3-8b", w, cost=cost).to_json()
    off = simulate_serving("llama3-8b", w, cost=cost, prefix_caching=False).to_json()
    groups = len(np.unique(w.group))
    assert on["prefix_cache"]["hit_tokens"] == (len(w) - groups) * 1024  # 1,024 = 64 whole blocks
    assert off["prefix_cache"]["hit_tokens"] == 0 and not off["prefix_cache"]["enabled"]
    assert on["ttft_ms"]["p50"] < 0.8 * off["ttft_ms"]["p50"]
    assert on["kv"]["peak_utilization"] < off["kv"]["peak_utilization"]


def test_jsonl_prefix_fields(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text('{"arrival": 0, "prompt_tokens": 50, "output_tokens": 2, "prefix_group": 7, "prefix_tokens": 32}\n'
                 '{"arrival": 1, "prompt_tokens": 40, "output_tokens": 2}\n')
    w = load_requests(f)
    assert w.group.tolist() == [7, -1] and w.prefix.tolist() == [32, 0]
    f.write_text('{"arrival": 0, "prompt_tokens": 50, "output_tokens": 2, "prefix_group": 1, "prefix_tokens": 51}\n')
    with pytest.raises(TraceError, match="line 1: prefix_group"):
        load_requests(f)


def test_workload_bounds():
    with pytest.raises(ValueError, match="prefix groups"):
        synthetic(1.0, None, 1.0, "8", "8", shared_prefix=8, prefix_groups=0)
    with pytest.raises(ValueError, match="shared prefix"):
        synthetic(1.0, None, 1.0, "8", "8", shared_prefix=-1)
    assert Workload(np.zeros(1), np.ones(1, np.int64), np.ones(1, np.int64)).subset(np.arange(1)) == (None, None)
