"""``serve --max-model-len``: requests longer than the model's context are rejected on arrival, as
engines refuse them, instead of being served."""

from __future__ import annotations

import numpy as np
from click.testing import CliRunner

from ettools.cli import main
from ettools.replay.serve import simulate_serving
from ettools.replay.serve.workload import Workload


def test_requests_past_the_max_model_length_are_rejected_not_served():
    """Every fifth request asks for 3,000 + 64 tokens against a 2,048-token limit: exactly those are
    rejected (no first token, no finish); every other request is served and finishes."""
    n = 40
    prompt = np.where(np.arange(n) % 5 == 0, 3000, 500).astype(np.int64)
    wl = Workload(np.arange(n) * 0.05, prompt, np.full(n, 64, np.int64))
    res = simulate_serving("llama3-8b", wl, max_model_len=2048)
    too_long = (prompt + 64) > 2048
    assert int(too_long.sum()) == 8
    assert np.isnan(res.finish_s[too_long]).all() and np.isnan(res.first_s[too_long]).all()
    assert np.isfinite(res.finish_s[~too_long]).all()
    j = res.to_json()
    assert j["rejected"] == 8 and j["requests"] == n
    assert np.isfinite(j["mean_in_system"])
    unlimited = simulate_serving("llama3-8b", wl)
    assert unlimited.to_json()["rejected"] == 0 and np.isfinite(unlimited.finish_s).all()


def test_cli_says_how_many_were_rejected():
    r = CliRunner().invoke(main, ["serve", "--model", "llama3-8b", "--rate", "4", "--duration", "5",
                                  "--prompt-tokens", "4000", "--output-tokens", "64", "--max-model-len", "2048"])
    assert r.exit_code == 0, r.output
    assert "rejected on arrival:" in r.output and "max model length 2,048" in r.output
