"""ppl --dry-run (memory per length from the config alone), --device-map / --max-memory flags."""

import json

import pytest
from transformers import LlamaConfig
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.models.load import parse_max_memory
from ctxeval.models.memory import GIB, count_parameters, estimate

runner = CliRunner()


def test_llama2_7b_numbers():
    cfg = LlamaConfig(
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        intermediate_size=11008,
        vocab_size=32000,
        tie_word_embeddings=False,
    )
    assert count_parameters(cfg) == 6_738_415_616  # the published 6.74B
    (row,) = estimate(cfg, (32768,), "bfloat16", "eager", 1024)
    assert row.weights / GIB == pytest.approx(12.55, abs=0.01)
    assert row.kv_cache / GIB == pytest.approx(16.0)  # 2 x 32 layers x 4096 x 32k x 2 bytes
    assert row.attention / GIB == pytest.approx(128.0)  # eager: 2 x 32 heads x 32k^2 x 2 bytes
    (sdpa,) = estimate(cfg, (32768,), "bfloat16", "sdpa", 1024)
    assert sdpa.attention == 0 and sdpa.logits == 2 * 1024 * 32000 * 4


def test_dry_run_loads_nothing_and_writes_nothing(tmp_path, tiny_model_dir):
    result = runner.invoke(
        app, ["ppl", "--model", str(tiny_model_dir), "--dry-run", "--lengths", "64,1k", "--out", str(tmp_path / "r")]
    )
    assert result.exit_code == 0, result.output
    assert "weights" in result.output and "KV cache" in result.output and "1,024" in result.output
    assert not (tmp_path / "r").exists()


def test_device_map_on_cpu_and_max_memory_errors(tmp_path, tiny_model_dir, text_dir):
    base = ["ppl", "--model", str(tiny_model_dir), "--data", str(text_dir), "--lengths", "32,64"]
    ok = runner.invoke(app, [*base, "--device-map", "auto", "--max-memory", "cpu=2GiB", "--out", str(tmp_path / "a")])
    assert ok.exit_code == 0, ok.output
    assert json.loads((tmp_path / "a" / "run.json").read_text())["model"]["device"] == "cpu"
    for flags, fragment in (
        (["--max-memory", "cpu=2GiB"], "needs --device-map"),
        (["--device-map", "auto", "--max-memory", "cpu2GiB"], "DEVICE=SIZE"),
        (["--device-map", "everywhere"], "--device-map must be one of"),
    ):
        bad = runner.invoke(app, [*base, *flags, "--out", str(tmp_path / "b")])
        assert bad.exit_code == 2 and fragment in bad.output, bad.output
    assert parse_max_memory("0=70GiB, 1=70GiB,cpu=200GiB") == {0: "70GiB", 1: "70GiB", "cpu": "200GiB"}
