"""`ctxeval needle` and `ctxeval passkey` as a user runs them: outputs, resume, bad input."""

import csv
import json

import pytest
from typer.testing import CliRunner

from ctxeval.cli import app

runner = CliRunner()


def needle(*args):
    return runner.invoke(app, ["needle", *args])


def test_needle_cli_outputs_and_resume(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    args = [
        "--model",
        str(tiny_model_dir),
        "--lengths",
        "400,500",
        "--depths",
        "0,50,100",
        "--samples",
        "2",
        "--method",
        "none",
        "--method",
        "yarn:factor=4",
        "--scoring",
        "forced",
        "--out",
        str(out),
    ]
    first = needle(*args)
    assert first.exit_code == 0, first.output
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 2 * 3 * 2
    assert all(r["prompt_tokens"] + r["answer_tokens"] == r["length"] for r in rows)
    for name in ("table.md", "summary.csv", "heatmap-none.png", "heatmap-yarn-factor-4.png"):
        assert (out / name).stat().st_size > 0, name
    assert "accuracy by depth and length" in (out / "table.md").read_text()
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "success" and run["scoring"]["llm_judge"] is False
    again = needle(*args)
    assert again.exit_code == 0
    assert len((out / "rows.jsonl").read_text().splitlines()) == len(rows)


def test_passkey_cli(tmp_path, tiny_model_dir):
    out = tmp_path / "pk"
    result = runner.invoke(
        app,
        [
            "passkey",
            "--model",
            str(tiny_model_dir),
            "--lengths",
            "300,400",
            "--samples",
            "3",
            "--max-new-tokens",
            "6",
            "--protocol",
            "ctxeval",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and len({r["depth"] for r in rows}) > 1  # random depth per sample
    assert all(r["prompt_tokens"] + 6 == r["length"] for r in rows)
    assert "Passkey context" in (out / "table.md").read_text()
    # its own figure, as needle writes heatmap-<method>.png (issue 39): accuracy by length, listed in the wrote line
    assert (out / "passkey.png").read_bytes().startswith(b"\x89PNG")
    assert f"wrote {out}/table.md, summary.csv, passkey.csv, passkey.png" in " ".join(result.stderr.split())
    # passkey.csv from the rows by the YaRN paper's rule (Table 5): the longest length at >= 80 %, and the mean
    # accuracy of every length up to it
    accuracy = {n: sum(r["correct"] for r in rows if r["length"] == n) / 3 for n in (300, 400)}
    context = max([n for n, a in accuracy.items() if a >= 0.8], default=None)
    table = list(csv.DictReader((out / "passkey.csv").open()))
    assert [r["method"] for r in table] == ["none"]
    assert (float(table[0]["passkey context"]) if table[0]["passkey context"] else None) == context
    upto = [accuracy[n] for n in accuracy if context is not None and n <= context]
    mean = table[0]["passkey accuracy"]
    assert float(mean) == pytest.approx(sum(upto) / len(upto)) if upto else mean == ""


@pytest.mark.parametrize(
    "extra,fragment",
    [
        (["--depths", "0,150"], "0..100"),
        (["--lengths", "40"], "shorter than the instruction"),
        (["--samples", "0"], "--samples"),
        (["--needle", "haystack-king"], "unknown needle preset"),
        (["--haystack", "SHORT", "--lengths", "2000"], "haystack"),
        (["--scoring", "judge"], "--scoring"),
        (["--chat-template", "on"], "no chat template"),
        (["--needle-text", "The {value} of {foo}."], "{foo}"),
        (["--out", "AFILE"], "not a directory"),
    ],
)
def test_needle_bad_input(tmp_path, tiny_model_dir, extra, fragment):
    short = tmp_path / "short.txt"
    short.write_text("A short haystack. " * 20)
    afile = tmp_path / "afile"
    afile.write_text("x")
    extra = [str(short) if e == "SHORT" else str(afile) if e == "AFILE" else e for e in extra]
    out = [] if "--out" in extra else ["--out", str(tmp_path / "o")]
    result = needle("--model", str(tiny_model_dir), "--lengths", "400", *out, *extra)
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output
