"""`ctxeval tune` refuses bad input in one line, exit code 2, before any search."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from ctxeval.cli import app

runner = CliRunner()


TRAINED, TARGET, S = 128, 256, 2.0  # the tiny model's trained length; the target of every search here; the factor


SMALL = ["--target-length", str(TARGET), "--tune-docs", "1", "--heldout-docs", "1"]


def tune(*args):
    return runner.invoke(app, ["tune", *map(str, args)])


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["-m", "pi"], ["pi", "--search-factor"]),
        (["-m", "none"], ["none"]),
        (["--target-length", "128"], ["not beyond the trained length 128"]),
        (["--target-length", "64"], ["not beyond the trained length 128"]),
        (["--space", "beta_fast=-1:4"], ["beta_fast must be > 0"]),
        (["-m", "yarn+self-extend", "--space", "self-extend.group_size=0:4"], ["group_size must be >= 1"]),
        (["-m", "ntk", "--space", "alpha=0.5:2"], ["alpha must be >= 1"]),
        (["--space", "beta_fast=4:1"], ["LOW < HIGH"]),
        (["--space", "beta_fast=1"], ["NAME=LOW:HIGH"]),
        (["--space", "beta_fast=a:b"], ["NAME=LOW:HIGH"]),
        (["--space", "beta_fast=1:4:cubic"], ["NAME=LOW:HIGH"]),
        (["--space", "window=1:4"], ["not a searched parameter", "beta_fast"]),
        (["-m", "yarn:beta_fast=4", "--space", "beta_fast=1:8"], ["not a searched parameter"]),
        (["--sampler", "bogus"], ["--sampler", "tpe"]),
        (["-m", "longrope:long_factor=1"], ["long_factor"]),
    ],
)
def test_bad_input_is_one_line_exit_2(args, fragments, tmp_path):
    """Bug caught: a check moved after the run directory is created (a directory left behind, more stderr lines), or
    a check that raises ValueError instead of CtxevalError (a traceback, exit 1)."""
    out = tmp_path / "run"
    result = tune(*SMALL, "--trials", "3", *args, "--out", out)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in result.output
    assert not out.exists()


@pytest.mark.parametrize("flags", [[], ["--search-factor"]])
def test_none_is_not_told_to_search_its_factor(flags, tmp_path):
    """`-m none` has no factor: the advice must not be --search-factor (which cannot help it, and may already be
    given). Bug caught (present): build_space's 'no parameter to search besides its factor; use --search-factor'
    written for every method without ranges, including none."""
    result = tune(*SMALL, "--trials", "3", "-m", "none", *flags, "--out", tmp_path / "run")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert "--search-factor" not in lines[0] and "besides its factor" not in lines[0], lines[0]


@pytest.mark.parametrize(
    "args,option", [(["--tune-docs", "500"], "--tune-docs"), (["--target-length", "64k"], "--target-length")]
)
def test_too_few_documents_names_the_tune_options(args, option, tmp_path):
    """More documents than the data holds (--tune-docs 500), or none long enough (--target-length 64k): the error must
    name the options of `tune`. Bug caught: the ppl command's wording leaking through from
    corpora.select_long_documents ('--docs 501 was asked; use --docs 12', 'use shorter --lengths')."""
    out = tmp_path / "run"
    result = tune(*SMALL, "--trials", "3", *args, "--out", out)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.stderr
    assert not out.exists()
    assert option in lines[0], lines[0]
    assert "--docs " not in lines[0] and "--lengths" not in lines[0], lines[0]


def test_export_that_cannot_be_written_fails_before_the_search(tmp_path):
    """--export naming a file, or the model's own directory: one line, exit 2, no run directory. Bug caught: the checks
    running only after the search and the held-out run (minutes lost, or a NotADirectoryError traceback)."""
    from ctxeval.util.paths import TINY_MODEL_DIR

    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    for where, words in ((a_file, "is a file"), (TINY_MODEL_DIR, "exists and is not an earlier export")):
        out = tmp_path / "run"
        result = tune(*SMALL, "--trials", "2", "--export", where, "--out", out)
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.output, result.stderr
        assert not out.exists()
