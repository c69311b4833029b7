"""The CLI as a user runs it (typer's CliRunner): help, plan numbers, one-line user errors with exit code 2."""

import csv
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.rope.methods import Geometry, compute

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]
GEOM = ["--head-dim", "64", "--base", "10000", "--original-length", "2048"]


def run(*args):
    return runner.invoke(app, list(args))


@pytest.mark.parametrize(
    "command", [[], ["methods"], ["plan"], ["ppl"], ["needle"], ["passkey"], ["entropy"], ["report"], ["bound"]]
)
def test_help(command):
    result = run(*command, "--help")
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_methods_lists_every_method():
    result = run("methods", "--format", "json")
    assert result.exit_code == 0
    names = [m["name"] for m in json.loads(result.stdout)]
    assert names == [
        "none",
        "native",
        "pi",
        "ntk",
        "ntk-mixed",
        "dynamic-ntk",
        "ntk-by-parts",
        "yarn",
        "dynamic-yarn",
        "llama3",
        "longrope",
        "self-extend",
        "rerope",
        "leaky-rerope",
        "logn",
        "dca",
        "string",
        "qscale-llama4",
        "qscale-mistral",
    ]
    table = run("methods")
    assert "beta_fast=32" in table.stdout and "alpha=beta_slow" in table.stdout


def test_methods_csv_has_a_header_and_one_row_per_method():
    # the issue: --format advertised csv and refused it ('methods supports --format table or json')
    listed = json.loads(run("methods", "--format", "json").stdout)
    result = run("methods", "--format", "csv")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert result.stdout.splitlines()[0] == "name,kind,aliases,length_dependent,parameters,param_aliases,summary"
    assert [r["name"] for r in rows] == [m["name"] for m in listed]
    yarn = next(r for r in rows if r["name"] == "yarn")
    assert yarn["kind"] == "frequency" and yarn["length_dependent"] == "false"
    assert (
        "beta_fast=32.0; beta_slow=1.0" in yarn["parameters"]
        and yarn["param_aliases"] == "alpha=beta_slow; beta=beta_fast"
    )
    assert next(r for r in rows if r["name"] == "pi")["aliases"] == "linear"
    assert "csv (one row per method)" in run("methods", "--help").stdout


def test_bound_says_where_the_rows_that_differ_from_the_paper_are_explained():
    # the issue: '6 of 11 rows match the paper's Table 1' pointed nowhere; 16,000 is one of the rows that differ
    result = runner.invoke(app, ["bound", "--head-dim", "128", "--lengths", "1000,16000"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "1 of 2 rows match the paper's Table 1" in text
    page, anchor = text.split("(why, and what was tried: ")[1].split(")")[0].split("#")
    doc = (REPO / page).read_text()
    slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.*)$", doc, re.M)}
    assert anchor in slugs  # the section is there, and it explains the rows that differ
    section = doc.split("## Reproducing the paper's Table 1")[1].split("\n## ")[0]
    assert "16,000 | 3.1e5 | 3.2e5" in section and "the base the paper prints fails the criterion" in section


@pytest.mark.parametrize(
    "spec,flags,length",
    [
        ("yarn:factor=4,beta_fast=32,beta_slow=1", [], None),
        ("yarn", ["--factor", "8"], None),
        ("dynamic-ntk:factor=2", ["--length", "8192"], 8192),
        ("llama3", [], None),
    ],
)
def test_plan_json_equals_methods(spec, flags, length):
    result = run("plan", "--method", spec, *flags, *GEOM, "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    name, _, rest = spec.partition(":")
    params = dict(kv.split("=") for kv in rest.split(",")) if rest else {}
    if "--factor" in flags:
        params["factor"] = flags[1]
    want = compute(name, Geometry(64, 10000.0, 2048), params, length)
    got = np.array([p["inv_freq"] for p in data["pairs"]])
    np.testing.assert_array_equal(got, want.inv_freq)
    assert data["attention_factor"] == want.attention_factor
    assert {p["group"] for p in data["pairs"]} <= {"extrapolated", "blended", "interpolated"}


def test_plan_table_csv_and_plot(tmp_path):
    table = run("plan", "--method", "yarn", "--factor", "16", *GEOM)
    assert table.exit_code == 0
    assert (
        "interpolated" in table.stdout
        and "extrapolated" in table.stdout
        and "attention factor 1.277259" in table.stdout
    )
    csv_out = run("plan", "--method", "pi:factor=2", *GEOM, "--format", "csv")
    lines = csv_out.stdout.strip().splitlines()
    assert lines[0] == "pair,wavelength,ratio,inv_freq,scale,group" and len(lines) == 33
    png = tmp_path / "plan.png"
    assert run("plan", "--method", "yarn", "--factor", "4", *GEOM, "--plot", str(png)).exit_code == 0
    assert png.stat().st_size > 5000


def test_plan_from_model_dir(tmp_path):
    from helpers import tiny_llama

    tiny_llama().save_pretrained(tmp_path / "m")
    result = run("plan", "--method", "pi:factor=2", "--model", str(tmp_path / "m"), "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["geometry"]["original_length"] == 64


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["plan", "--method", "warp", *GEOM], "unknown method"),
        (["plan", "--method", "pi:factor=0.5", *GEOM], "factor must be >= 1"),
        (["plan", "--method", "yarn", "--factor", "0.5", *GEOM], "factor must be >= 1"),
        (["plan", "--method", "yarn:beta_slow=32,beta_fast=1", *GEOM], "beta_slow"),
        (["plan", "--method", "yarn", "--head-dim", "64"], "needs --base"),
        (["plan", "--method", "yarn", "--model", "/no/such/dir"], "neither a model directory"),
    ],
)
def test_user_errors_are_one_line_exit_2(args, fragment):
    result = run(*args)
    assert result.exit_code == 2
    assert fragment in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_debug_shows_traceback():
    result = run("--debug", "plan", "--method", "warp", *GEOM)
    assert result.exit_code != 0 and result.exception is not None


def test_the_cli_starts_without_the_heavy_libraries():
    """`ctxeval --help`, `methods` and `plan` answer at once: importing the CLI loads no torch, transformers,
    pandas or matplotlib (the commands import the evaluation and report modules when they run)."""
    import subprocess
    import sys

    code = (
        "import sys, ctxeval.cli\n"
        "print(sorted(m for m in ('torch', 'transformers', 'pandas', 'matplotlib') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
