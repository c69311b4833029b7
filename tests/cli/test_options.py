"""Every option value is checked where its option type is declared: a bad value is one line on stderr, exit code
2, no traceback, and nothing is loaded or written."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.cli.options import Check, parse_depths
from ctxeval.errors import CtxevalError

runner = CliRunner()


RUN = str(Path(__file__).resolve().parents[2] / "results" / "ppl-tiny-pydoc")


@pytest.mark.parametrize(
    "args, message",
    [
        (["ppl", "--valid-tolerance", "-0.5"], "--valid-tolerance must be >= 0, got -0.5"),
        (["ppl", "--docs", "0"], "--docs must be >= 1, got 0"),
        (["ppl", "--seed", "-1"], "--seed must be >= 0, got -1"),
        (["ppl", "--chunk-size", "0"], "--chunk-size must be >= 1, got 0"),
        (["needle", "--seed", "-3"], "--seed must be >= 0, got -3"),
        (["needle", "--threshold", "0"], "--threshold must be in (0, 1], got 0.0"),
        (["needle", "--threshold", "1.5"], "--threshold must be in (0, 1], got 1.5"),
        (["needle", "--samples", "0"], "--samples must be >= 1, got 0"),
        (["needle", "--batch-size", "0"], "--batch-size must be >= 1, got 0"),
        (["needle", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
        (["passkey", "--samples", "-2"], "--samples must be >= 1, got -2"),
        (["entropy", "--query-chunk", "0"], "--query-chunk must be >= 1, got 0"),
        (["entropy", "--docs", "-1"], "--docs must be >= 1, got -1"),
        (["report", RUN, "--valid-tolerance", "-1"], "--valid-tolerance must be >= 0, got -1.0"),
        (
            [
                "plan",
                "--method",
                "dynamic-ntk:factor=2",
                "--head-dim",
                "64",
                "--base",
                "1e4",
                "--original-length",
                "2048",
                "--length",
                "-5",
            ],
            "--length must be >= 1, got -5",
        ),
        (
            ["plan", "--head-dim", "64", "--base", "1e4", "--original-length", "2048", "--partial-rotary-factor", "2"],
            "--partial-rotary-factor must be in (0, 1], got 2.0",
        ),
    ],
)
def test_bad_values_are_one_line_and_exit_2(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"error: {message}"]
    assert not (tmp_path / "runs").exists()  # refused before a run directory was made


def test_a_preset_value_passes_the_same_check(tmp_path):
    preset = tmp_path / "bad.toml"
    preset.write_text('kind = "ppl"\ndocs = 0\n')
    result = runner.invoke(app, ["ppl", "--task", str(preset)])
    assert result.exit_code == 2 and result.stderr.strip() == "error: --docs must be >= 1, got 0"


def test_check_ranges():
    assert Check("--x", minimum=1)(1) == 1 and Check("--x", above=0, maximum=1)(1.0) == 1.0
    with pytest.raises(CtxevalError, match=r"--x must be in \(0, 1\], got 0"):
        Check("--x", above=0, maximum=1)(0)
    assert Check("--x", minimum=0)(None) is None  # an option left out is not checked


def test_depth_parsing():
    assert parse_depths("0:100:5", "linear") == [0, 25, 50, 75, 100]
    sig = parse_depths("0:100:7", "sigmoid")
    assert sig[0] == 0 and sig[-1] == 100 and sig[1] - sig[0] < sig[3] - sig[2]
    with pytest.raises(CtxevalError, match="0..100"):
        parse_depths("0,120", "linear")
