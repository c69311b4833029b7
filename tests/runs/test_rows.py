"""The row contract (ctxeval/runs/rows.py) as every command writes it, and the rules the reports share with the runs."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from transformers import LlamaConfig
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.errors import CtxevalError
from ctxeval.rope.geometry import trained_length, trained_length_of_record
from ctxeval.runs import rows as R

runner = CliRunner()


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines() if line.strip()]


def test_every_kind_writes_metric_and_value(tmp_path, tiny_model_dir, text_dir):
    common = ["--model", str(tiny_model_dir), "--device", "cpu"]
    runs = {
        "ppl": ["ppl", *common, "--data", str(text_dir), "--lengths", "32,64"],
        "needle": [
            "needle",
            *common,
            "--haystack",
            str(text_dir),
            "--lengths",
            "320",
            "--depths",
            "0,100",
            "--scoring",
            "forced",
        ],
        "passkey": [
            "passkey",
            *common,
            "--lengths",
            "320",
            "--samples",
            "2",
            "--scoring",
            "forced",
            "--protocol",
            "ctxeval",
        ],
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
        assert math.isclose(
            R.uniform_entropy(length), float(np.mean(np.log(np.arange(1, length + 1)))), rel_tol=1e-12, abs_tol=1e-15
        )


def test_point_key_keeps_types_apart():
    assert R.point_key({"length": 1}, ["length"]) != R.point_key({"length": "1"}, ["length"])
    assert R.point_key({"a": 1, "b": 2}, ["b", "a"]) == ("2", "1")
    # a dict-valued field is one key whatever its insertion order; a value JSON cannot hold is keyed by its text
    assert (
        R.point_key({"p": {"b": 1, "a": 2}}, ["p"])
        == R.point_key({"p": {"a": 2, "b": 1}}, ["p"])
        == ('{"a": 2, "b": 1}',)
    )
    assert R.point_key({"doc": Path("/d/a.txt")}, ["doc"]) == ('"/d/a.txt"',)


@pytest.mark.parametrize(
    "text, tokens",
    [
        ("4k", 4096),
        ("4K", 4096),
        (" 300 ", 300),
        ("1.5k", 1536),
        ("0", 0),
        ("2048", 2048),
        ("128k", 131072),
        ("0.5K", 512),
    ],
)
def test_token_counts_as_options_give_them(text, tokens):
    assert R.parse_token_count(text, "--lengths") == tokens


@pytest.mark.parametrize(
    "text, message",
    [
        ("abc", "--lengths: 'abc' is not a token count; write e.g. 512 or 4k"),
        ("k", "--lengths: 'k' is not a token count; write e.g. 512 or 4k"),
        ("-1", "--lengths: '-1' must be a whole number of tokens >= 0"),
        ("0.5", "--lengths: '0.5' must be a whole number of tokens >= 0"),
        ("1.0001k", "--lengths: '1.0001k' must be a whole number of tokens >= 0"),
    ],
)
def test_bad_token_counts_say_what_to_write(text, message):
    with pytest.raises(CtxevalError) as caught:
        R.parse_token_count(text, "--lengths")
    assert str(caught.value) == message


@pytest.mark.parametrize(
    "n, shown",
    [
        (1024, "1k"),
        (2048, "2k"),
        (3072, "3k"),
        (131072, "128k"),
        (1000, "1000"),
        (1536, "1536"),
        (1025, "1025"),
        (512, "512"),
        (0, "0"),
        (64, "64"),
    ],
)
def test_lengths_are_shown_in_k_only_when_whole(n, shown):
    assert R.fmt_length(n) == shown


def test_a_cell_without_a_value_says_why():
    assert [R.status_label(s) for s in ("oom", "skipped", "no key tokens", "error", None, "", "OOM")] == [
        "OOM",
        "skip",
        "no keys",
        "—",
        "—",
        "—",
        "—",
    ]


def test_one_trained_length_rule():
    plain = LlamaConfig(max_position_embeddings=4096, rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    shipped = LlamaConfig(
        max_position_embeddings=131072,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 5e5,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    assert trained_length(plain) == 4096
    assert trained_length(shipped) == 8192  # a shipped scaling counts from the original length
    from transformers import GPT2Config

    assert trained_length(GPT2Config(n_positions=1024)) == 1024  # no RoPE: max_position_embeddings
    record = {"rope": {"original_length": 8192}, "max_position_embeddings": 131072}
    assert trained_length_of_record(record) == 8192
    assert trained_length_of_record({"rope": {"original_length": None}, "max_position_embeddings": 1024}) == 1024
