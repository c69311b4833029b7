"""Issue 26, item 2: a method named without a factor measures something. Static methods whose factor defaults to 1
get the factor that covers the longest length asked (longest / trained, shown in the label); a method that stays
plain RoPE at the lengths asked is named in a note; an unknown name gets the nearest one."""

from __future__ import annotations

import json
import random

from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.rope.methods import Geometry
from ctxeval.specs import default_factor, expand_specs, plain_rope_notes, with_default_factors

G = Geometry(rotary_dim=16, base=10_000.0, original_length=128)


def labels(specs):
    return [s.label for s in specs]


def test_open_factors_cover_the_longest_length():
    specs = expand_specs(["none", "yarn", "pi", "ntk", "ntk-by-parts", "yarn:beta_fast=4,beta_slow=0.25"])
    out, notes = with_default_factors(specs, 1024, G)
    assert labels(out) == [
        "none",
        "yarn(factor=8)",
        "pi(factor=8)",
        "ntk(factor=8)",
        "ntk-by-parts(factor=8)",
        "yarn(beta_fast=4,beta_slow=0.25,factor=8)",
    ]
    assert notes == [
        "yarn, pi, ntk, ntk-by-parts, yarn(beta_fast=4,beta_slow=0.25): factor 8 = the longest length "
        "1,024 / the trained length 128; give --factor or NAME:factor=S to choose"
    ]


def test_given_factors_and_methods_with_their_own_defaults_are_kept():
    specs = expand_specs(
        [
            "yarn:factor=4",
            "ntk:alpha=2",
            "ntk:base=50000",
            "dynamic-ntk",
            "dynamic-ntk:rule=paper",
            "llama3",
            "dynamic-yarn",
            "none+logn",
            "self-extend",
        ]
    )
    out, notes = with_default_factors(specs, 1024, G)
    assert labels(out) == labels(specs) and notes == []
    swept = expand_specs(["yarn", "pi"], factors=[2, 4])  # --factor wins over the default
    assert labels(with_default_factors(swept, 1024, G)[0]) == labels(swept)


def test_the_method_own_original_length_sets_its_factor_and_duplicates_merge():
    specs = expand_specs(["yarn:original_max_position_embeddings=64", "yarn", "yarn:factor=8"])
    out, notes = with_default_factors(specs, 1024, G)
    assert labels(out) == ["yarn(factor=16,original_max_position_embeddings=64)", "yarn(factor=8)"]
    assert len(notes) == 2 and "1,024 / the trained length 64" in notes[0]


def test_a_length_within_the_trained_one_gives_factor_1_and_says_so():
    out, notes = with_default_factors(expand_specs(["pi"]), 100, G)
    assert labels(out) == ["pi(factor=1)"]
    assert notes == [
        "pi: factor 1, as the longest length 100 is within the trained length 128; give --factor or "
        "NAME:factor=S to choose"
    ]


def test_default_factor_covers_the_length_by_at_most_a_hundredth():
    draw = random.Random(26)
    cases = [(1024, 128), (300, 128), (131_072, 4096), (4097, 4096), (4096, 4096), (1, 8192), (3 * 4096, 4096)]
    cases += [(draw.randint(1, 2_000_000), draw.randint(1, 200_000)) for _ in range(2000)]
    for longest, trained in cases:
        f = default_factor(longest, trained)
        assert f >= 1 and f * trained >= longest * (1 - 1e-12), (longest, trained, f)
        assert f == 1 or f - longest / trained < 0.01 + 1e-12, (longest, trained, f)
        assert round(f, 2) == f
    assert default_factor(131_072, 4096) == 32 and default_factor(300, 128) == 2.35


def test_plain_rope_notes_name_exactly_the_methods_that_change_nothing():
    specs = expand_specs(
        [
            "none",
            "yarn:factor=1",
            "pi:factor=1",
            "ntk:factor=1",
            "ntk-by-parts:factor=1",
            "yarn:factor=2",
            "dynamic-ntk",
            "llama3:factor=1",
            "self-extend",
            "native",
        ]
    )
    specs += expand_specs(["pi:factor=1"], temperatures=[1.2])
    notes = plain_rope_notes(specs, [64, 128], G)
    flagged = [n.split(" is plain RoPE")[0] for n in notes]
    assert flagged == [
        "yarn(factor=1)",
        "pi(factor=1)",
        "ntk(factor=1)",
        "ntk-by-parts(factor=1)",
        "dynamic-ntk",
        "llama3(factor=1)",
    ]
    assert "it rescales only longer sequences" in notes[4]
    past = plain_rope_notes(expand_specs(["dynamic-ntk", "dynamic-yarn"]), [64, 256], G)
    assert past == []  # past the trained length the dynamic methods rescale


def run_cli(tmp_path, *args):
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result


def test_ppl_rows_differ_from_none_when_methods_are_named_bare(tmp_path):
    out = tmp_path / "run"
    result = run_cli(
        tmp_path,
        "ppl",
        "--model",
        "tiny",
        "--lengths",
        "64,256",
        "-m",
        "none",
        "-m",
        "yarn",
        "-m",
        "pi",
        "--docs",
        "1",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    assert "yarn, pi: factor 2 = the longest length 256 / the trained length 128" in result.stderr
    run = json.loads((out / "run.json").read_text())
    assert run["spec"]["methods"] == ["none", "yarn(factor=2)", "pi(factor=2)"]
    table = (out / "table.md").read_text()
    rows = {
        line.split("|")[1].strip(): line.split("|")[2:-1]
        for line in table.splitlines()
        if line.startswith("| ") and "factor" in line or line.startswith("| none")
    }
    assert rows["yarn(factor=2)"] != rows["none"] and rows["pi(factor=2)"] != rows["none"]


def test_ppl_within_the_trained_length_warns_that_bare_methods_are_plain(tmp_path):
    result = run_cli(
        tmp_path,
        "ppl",
        "--model",
        "tiny",
        "--lengths",
        "64",
        "-m",
        "none",
        "-m",
        "yarn",
        "--docs",
        "1",
        "--out",
        str(tmp_path / "run"),
    )
    assert result.exit_code == 0, result.output
    assert "note: yarn(factor=1) is plain RoPE at this factor: it measures the same as none" in result.stderr


def test_passkey_labels_carry_the_default_factor(tmp_path):
    out = tmp_path / "run"
    result = run_cli(
        tmp_path,
        "passkey",
        "--model",
        "tiny",
        "--lengths",
        "256",
        "--samples",
        "1",
        "-m",
        "yarn",
        "--protocol",
        "ctxeval",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    assert json.loads((out / "run.json").read_text())["spec"]["methods"] == ["yarn(factor=2)"]


def test_an_unknown_name_suggests_the_nearest_of_both_kinds(tmp_path):
    result = run_cli(tmp_path, "ppl", "--model", "tiny", "-m", "yarn+log-n")
    assert result.exit_code == 2
    assert "unknown method 'log-n' in 'yarn+log-n'; did you mean 'logn'?" in result.stderr
    assert "self-extend, rerope, leaky-rerope, logn" in result.stderr


def test_methods_lists_which_factors_default_to_the_longest_length(tmp_path):
    result = run_cli(tmp_path, "methods", "--format", "json")
    factors = {m["name"]: p for m in json.loads(result.stdout) for p in m["params"] if p["name"] == "factor"}
    with_rule = sorted(name for name, p in factors.items() if "measuring_default" in p)
    assert with_rule == ["ntk", "ntk-by-parts", "pi", "yarn"]


def test_plan_takes_the_default_factor_from_length(tmp_path):
    geometry = ["--head-dim", "64", "--base", "10000", "--original-length", "4096", "--format", "json"]
    result = run_cli(tmp_path, "plan", "-m", "yarn", *geometry, "--length", "16384")
    assert json.loads(result.stdout)["params"]["factor"] == 4
    assert "factor 4 = the longest length 16,384 / the trained length 4,096" in result.stderr
    bare = run_cli(tmp_path, "plan", "-m", "yarn", *geometry)
    assert json.loads(bare.stdout)["params"]["factor"] == 1 and "yarn is plain RoPE at this factor" in bare.stderr
