"""``ettools synth --model CONFIG``: a Hugging Face ``config.json`` (file or folder) as a model.

Expected values are read from the raw config files here, or counted by ``transformers`` itself
(a model built on the meta device), never taken from the mapping under test."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ettools.cli import main

REPO = Path(__file__).resolve().parents[1]
TINYLLAMA = REPO / "sample_traces" / "hf_configs" / "tinyllama_1.1b"
QWEN = REPO / "sample_traces" / "hf_configs" / "qwen1.5_0.5b"


def _synth(model: Path, tmp_path: Path, *extra: str) -> tuple[int, str, dict]:
    r = CliRunner().invoke(main, ["synth", "--model", str(model), "--batch", "2", "-o", str(tmp_path / "out"),
                                  "--json", "-q", *extra])
    return r.exit_code, r.stderr, (json.loads(r.stdout) if r.exit_code == 0 else {})


def test_llama_config_gives_its_dimensions(tmp_path: Path) -> None:
    cfg = json.loads((TINYLLAMA / "config.json").read_text())
    code, err, j = _synth(TINYLLAMA, tmp_path)
    assert code == 0, err
    want = {"L": cfg["num_hidden_layers"], "H": cfg["hidden_size"], "NH": cfg["num_attention_heads"],
            "KV": cfg["num_key_value_heads"], "HD": cfg["hidden_size"] // cfg["num_attention_heads"],
            "F": cfg["intermediate_size"], "V": cfg["vocab_size"]}
    assert {k: j["dims"][k] for k in want} == want
    # the config's context (2,048) is shorter than the template's default sequence: it caps it
    assert j["dims"]["S"] == min(cfg["max_position_embeddings"], 8192)


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
def test_resident_memory_scales_as_transformers_counts_parameters(tmp_path: Path) -> None:
    """Two untied Llama configs: weights, gradients and optimizer state grow as the parameter
    counts ``transformers`` gives for the same configs."""
    import torch
    import transformers

    small = tmp_path / "small"
    small.mkdir()
    transformers.LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                             num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048,
                             tie_word_embeddings=False).save_pretrained(small)
    counts, resident = [], []
    for i, folder in enumerate((TINYLLAMA, small)):
        config = transformers.AutoConfig.from_pretrained(folder)
        assert not config.tie_word_embeddings
        with torch.device("meta"):
            counts.append(sum(p.numel() for p in transformers.LlamaForCausalLM(config).parameters()))
        code, err, j = _synth(folder, tmp_path / str(i))
        assert code == 0, err
        resident.append(j["ranks"]["0"]["resident_bytes"])
    assert resident[0] / resident[1] == pytest.approx(counts[0] / counts[1], rel=1e-9)


def test_tied_config_on_an_untied_template_is_said(tmp_path: Path) -> None:
    cfg = json.loads((QWEN / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is True
    code, err, _ = _synth(QWEN, tmp_path)
    assert code == 0
    assert "ties the LM head" in err and f"{cfg['vocab_size']} x {cfg['hidden_size']}" in err


@pytest.mark.parametrize("cfg,words", [
    ({"model_type": "opt", "hidden_size": 256}, "model_type 'opt' has no template"),
    ({"model_type": "deepseek_v3", "q_lora_rank": 64, "first_k_dense_replace": 1}, "q_lora_rank 64"),
    ({"model_type": "llama", "hidden_size": 256}, "no positive integer num_attention_heads"),
    ({"model_type": "deepseek_v2", "first_k_dense_replace": 2, "num_hidden_layers": 2}, "no MoE layer"),
    ("{not json", "not a readable JSON file"),
])
def test_unsupported_configs_exit_2_naming_why(cfg: dict | str, words: str, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    code, err, _ = _synth(path, tmp_path)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0]
    assert not (tmp_path / "out").exists()
