"""`ctxeval ppl`'s LongPPL and --position-buckets options: bad input refused in one line."""

import pytest
from typer.testing import CliRunner

from ctxeval.cli import app

runner = CliRunner()


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--key-tokens-context", "128"], "not shorter than the longest length"),
        (["--protocol", "sliding", "--stride", "32"], "use --protocol truncate"),
        (["--key-tokens-method", "dynamic-ntk"], "depends on the sequence length"),
    ],
)
def test_longppl_bad_input_is_one_line_exit_2(tmp_path, tiny_model_dir, text_dir, extra, fragment):
    result = runner.invoke(
        app,
        [
            "ppl",
            "--model",
            str(tiny_model_dir),
            "--data",
            str(text_dir),
            "--lengths",
            "64,128",
            "--key-tokens",
            str(tiny_model_dir),
            "--out",
            str(tmp_path / "r"),
            *extra,
        ],
    )
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1


def test_evaluator_with_another_tokenizer_is_refused(tmp_path, tiny_model_dir, text_dir):
    from ctxeval.tiny import MODEL_DIR

    result = runner.invoke(
        app,
        [
            "ppl",
            "--model",
            str(tiny_model_dir),
            "--data",
            str(text_dir),
            "--lengths",
            "64,128",
            "--key-tokens",
            str(MODEL_DIR),
            "--key-tokens-context",
            "32",
            "--out",
            str(tmp_path / "r"),
        ],
    )
    assert result.exit_code == 2, result.output
    assert "another tokenizer" in result.stderr


def test_bad_position_buckets_fail_before_loading(tmp_path, text_dir):
    result = runner.invoke(
        app,
        [
            "ppl",
            "--model",
            "/nonexistent",
            "--data",
            str(text_dir),
            "--lengths",
            "64,128",
            "--position-buckets",
            "1,64,32",
            "--out",
            str(tmp_path / "r"),
        ],
    )
    assert result.exit_code == 2 and "increase strictly" in result.stderr
