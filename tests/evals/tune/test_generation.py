"""`ctxeval tune --passkey N`: the held-out check by generation, an ordinary passkey run nested in the tune run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ctxeval.cli import app

runner = CliRunner()
TUNE = ["tune", "--model", "tiny", "-m", "yarn", "--target-length", "512", "--trials", "4", "--tune-docs", "1"]
TUNE += ["--heldout-docs", "1"]


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "rows.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def checked(tmp_path_factory, module_cache):
    base = tmp_path_factory.mktemp("tune-passkey")
    result = runner.invoke(app, [*TUNE, "--passkey", "3", "--out", str(base / "run")])
    assert result.exit_code == 0, result.output
    return base / "run", result


def test_the_check_runs_the_winner_plain_rope_and_yarn_on_the_same_prompts(checked):
    """Bug caught: the check measuring only the winner (nothing to compare with), another length than the target, or
    prompts that differ between methods (another seed per method)."""
    run, result = checked
    tune = json.loads((run / "run.json").read_text())["tune"]
    where = run / tune["passkey_dir"]
    assert tune["passkey_dir"] == "passkey-" + tune["heldout_dir"].removeprefix("heldout-")
    rows = rows_of(where)
    labels = {r["label"] for r in rows}
    assert labels == {tune["winner"]["label"], "none", "yarn(factor=4)"}
    assert all(r["length"] == 512 and r["protocol"] == "yarn" and r["status"] == "ok" for r in rows)
    by_label = {
        label: sorted((r["sample"], r["answer"], r["depth"]) for r in rows if r["label"] == label) for label in labels
    }
    assert len({tuple(v) for v in by_label.values()}) == 1 and len(by_label["none"]) == 3
    assert "## Passkey at the target" in (run / "tune.md").read_text()
    assert "passkey at the target" in result.output


def test_the_check_is_ctxeval_passkeys_own_protocol(checked, tmp_path):
    """The nested run equals `ctxeval passkey --protocol yarn` at the same length, samples and seed: the same keys,
    positions, replies and scores for plain RoPE. Bug caught: BOS added (the repo adds none), another length search,
    or another max_new_tokens."""
    run, _ = checked
    tune = json.loads((run / "run.json").read_text())["tune"]
    nested = sorted(
        (r["sample"], r["answer"], r["depth"], r["response"], r["correct"], r["prompt_tokens"])
        for r in rows_of(run / tune["passkey_dir"])
        if r["label"] == "none"
    )
    args = ["passkey", "--model", "tiny", "--lengths", "512", "--samples", "3", "--protocol", "yarn", "-m", "none"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "alone")])
    assert result.exit_code == 0, result.output
    alone = sorted(
        (r["sample"], r["answer"], r["depth"], r["response"], r["correct"], r["prompt_tokens"])
        for r in rows_of(tmp_path / "alone")
    )
    assert nested == alone


def test_a_rerun_measures_nothing_again(checked):
    run, _ = checked
    tune = json.loads((run / "run.json").read_text())["tune"]
    before = (run / tune["passkey_dir"] / "rows.jsonl").read_text()
    result = runner.invoke(app, [*TUNE, "--passkey", "3", "--out", str(run)])
    assert result.exit_code == 0, result.output
    assert (run / tune["passkey_dir"] / "rows.jsonl").read_text() == before


def test_a_negative_count_is_refused_before_the_model_loads(tmp_path):
    result = runner.invoke(app, [*TUNE, "--passkey", "-1", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert "--passkey" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()
