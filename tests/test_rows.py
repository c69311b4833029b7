"""The row contract (ctxeval/rows.py) as every command writes it, and the rules the reports share with the runs."""

import json
import math
from pathlib import Path

import numpy as np
from transformers import LlamaConfig
from typer.testing import CliRunner

from ctxeval import rows as R
from ctxeval.cli import app
from ctxeval.geometry import trained_length, trained_length_of_record

runner = CliRunner()


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines() if line.strip()]


def test_every_kind_writes_metric_and_value(tmp_path, tiny_model_dir, text_dir):
    common = ["--model", str(tiny_model_dir), "--device", "cpu"]
    runs = {
        "ppl": ["ppl", *common, "--data", str(text_dir), "--lengths", "32,64"],
        "needle": ["needle", *common, "--haystack", str(text_dir), "--lengths", "320", "--depths", "0,100",
                   "--scoring", "forced"],
        "passkey": ["passkey", *common, "--lengths", "320", "--samples", "2", "--scoring", "forced"],
        "entropy": ["entropy", *common, "--data", str(text_dir), "--lengths", "32,64"],
    }
    for kind, args in runs.items():
        result = runner.invoke(app, [*args, "--out", str(tmp_path / kind)])
        assert result.exit_code == 0, result.output
        rows = _rows(tmp_path / kind)
        assert rows and all(r["metric"] == R.METRICS[kind] and r["task"] == kind for r in rows)
        assert all(set(R.REQUIRED[kind]) <= set(r) for r in rows)
        field = {"ppl": None, "needle": "correct", "passkey": "correct", "entropy": "entropy"}[kind]
        for r in rows:
            expected = r["nll_sum"] / r["n_tokens"] if kind == "ppl" else r[field]
            assert r["value"] == expected


def test_uniform_entropy_is_the_mean_log_of_visible_keys():
    for length in (1, 2, 7, 128, 5000):
        assert math.isclose(R.uniform_entropy(length), float(np.mean(np.log(np.arange(1, length + 1)))),
                            rel_tol=1e-12, abs_tol=1e-15)


def test_point_key_keeps_types_apart():
    assert R.point_key({"length": 1}, ["length"]) != R.point_key({"length": "1"}, ["length"])
    assert R.point_key({"a": 1, "b": 2}, ["b", "a"]) == ('2', '1')


def test_one_trained_length_rule():
    plain = LlamaConfig(max_position_embeddings=4096, rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    shipped = LlamaConfig(max_position_embeddings=131072, rope_parameters={
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192})
    assert trained_length(plain) == 4096
    assert trained_length(shipped) == 8192  # a shipped scaling counts from the original length
    from transformers import GPT2Config

    assert trained_length(GPT2Config(n_positions=1024)) == 1024  # no RoPE: max_position_embeddings
    record = {"rope": {"original_length": 8192}, "max_position_embeddings": 131072}
    assert trained_length_of_record(record) == 8192
    assert trained_length_of_record({"rope": {"original_length": None}, "max_position_embeddings": 1024}) == 1024
