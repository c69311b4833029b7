"""`ctxeval tune -m yarn -m ntk -m longrope`: one budget split between methods, each method's search a run of its own
in a sub-directory, the winner of them all, one held-out re-measure of every winner, resume, bad input, the tables.

On the bundled tiny model at a 256-token target (s = 2), 9 trials (3 per method). Each test names, in its docstring,
a one-line bug it catches.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from ctxeval.cli import app

runner = CliRunner()
TARGET = 256
ARGS = ["--target-length", str(TARGET), "--tune-docs", "1", "--heldout-docs", "1", "--short-tolerance", "0.2"]
METHODS = ["-m", "yarn", "-m", "ntk", "-m", "longrope"]


def tune(*args):
    return runner.invoke(app, ["tune", *map(str, args)])


def rows_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "rows.jsonl").read_text().splitlines() if line.strip()]


def record_of(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "run.json").read_text())


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    out = tmp_path_factory.mktemp("families") / "run"
    result = tune(*METHODS, *ARGS, "--trials", "9", "--out", out)
    assert result.exit_code == 0, result.output
    return SimpleNamespace(dir=out, output=result.output)


def test_the_budget_is_split_and_each_method_is_a_tune_run_of_its_own(families):
    """3 measured trials per method, each in search-<method>/ with its own run.json, rows and study; the parent's rows
    mirror them with their method's directory. Bug caught: every method given the whole --trials, or the shares
    computed but one study shared by all (a method's trials counted against another's)."""
    for name, method in (("search-yarn", "yarn"), ("search-ntk", "ntk"), ("search-longrope", "longrope")):
        sub = families.dir / name
        record = record_of(sub)
        assert record["spec"]["method"] == method and record["search"]["trials"] == 3
        ok = [r for r in rows_of(sub) if r.get("status") == "ok"]
        assert len(ok) == 3 and {r["method"] for r in ok} == {method}
        assert (sub / "study.db").is_file() and (sub / "tune.md").is_file()
    mirrored = rows_of(families.dir)
    assert sorted(r["family"] for r in mirrored if r.get("status") == "ok") == sorted(
        ["search-yarn"] * 3 + ["search-ntk"] * 3 + ["search-longrope"] * 3
    )


def test_the_winner_of_them_all_is_the_lowest_tuning_ppl_of_any_method(families):
    """Recomputed from the sub-runs' rows: the lowest target ppl among every method's trials that kept the guard.
    Bug caught: the winner taken from the first method searched, or the held-out documents choosing it."""
    best = min(
        (r for name in ("search-yarn", "search-ntk", "search-longrope") for r in rows_of(families.dir / name)
         if r.get("status") == "ok" and r.get("feasible")),
        key=lambda r: r["value"],
    )  # fmt: skip
    tune_record = record_of(families.dir)["tune"]
    assert tune_record["winner"]["label"] == best["label"]
    assert tune_record["winner"]["ppl_target"] == pytest.approx(best["value"], rel=1e-12)
    assert [f["dir"] for f in tune_record["families"]] == ["search-yarn", "search-ntk", "search-longrope"]


def test_every_winner_is_re_measured_once_on_the_heldout_documents_with_the_baselines(families):
    """One held-out ppl run holds each method's winner, none, pi, ntk and yarn at s = 2 and yarn's and ntk's defaults
    (LongRoPE has none), on the held-out document alone. Bug caught: only the overall winner re-measured, or a
    held-out run per method (the baselines measured three times)."""
    tune_record = record_of(families.dir)["tune"]
    held = families.dir / tune_record["heldout_dir"]
    labels = set(record_of(held)["spec"]["methods"])
    winners = {f["winner"]["label"] for f in tune_record["families"] if f.get("winner")}
    assert len(winners) == 3 and winners <= labels
    assert {"none", "pi(factor=2)", "ntk(factor=2)", "yarn(factor=2)"} <= labels
    heldout_doc = [d["doc"] for d in record_of(families.dir)["data"]["documents"] if d["role"] == "heldout"]
    assert {r["doc"] for r in rows_of(held)} == set(heldout_doc)
    assert len([p for p in families.dir.iterdir() if p.name.startswith("heldout-")]) == 1


def test_tune_md_ranks_every_method_on_the_heldout_documents(families):
    """The ranking is by held-out ppl at the target, each method's winner starred. Bug caught: ranked by the tuning
    ppl, or the ranking sorted descending."""
    text = (families.dir / "tune.md").read_text()
    assert "# Tune: which method on tiny, target 256" in text and (families.dir / "tune-methods.png").is_file()
    table = text.split("## Held-out documents")[1]
    ranked = [line for line in table.splitlines() if line.startswith("| ") and line[2].isdigit()]
    values = [float(line.split("|")[4]) for line in ranked]
    assert values == sorted(values) and len(ranked) >= 7
    assert sum("★" in line for line in ranked) == 3


def test_more_trials_measure_only_the_difference(tmp_path):
    """9 then 12 trials: the rerun measures 3 (one more per method) and reuses 9. Bug caught: the shares in the run's
    spec (a rerun with more trials refused as another run), or each method's study restarted."""
    out = tmp_path / "run"
    first = tune("-m", "yarn", "-m", "ntk", *ARGS, "--trials", "4", "--out", out)
    assert first.exit_code == 0, first.output
    again = tune("-m", "yarn", "-m", "ntk", *ARGS, "--trials", "6", "--out", out)
    assert again.exit_code == 0, again.output
    assert "2 points measured, 4 reused" in again.output
    for name in ("search-yarn", "search-ntk"):
        assert len([r for r in rows_of(out / name) if r.get("status") == "ok"]) == 3


@pytest.mark.parametrize(
    "args,message",
    [
        (["-m", "yarn", "-m", "yarn", "--trials", "4"], "names a method twice"),
        (["-m", "yarn", "-m", "ntk", "-m", "longrope", "--trials", "2"], "cannot be split between 3 methods"),
        (["-m", "yarn", "-m", "ntk", "--space", "beta_fast=1:8", "--trials", "4"], "--space applies to one method"),
    ],
)
def test_bad_input_across_methods_is_one_line_before_the_model_loads(args, message, tmp_path, monkeypatch):
    """Bug caught: a repeated method searched twice, fewer trials than methods leaving one with none, --space applied
    to whichever method has the parameter."""
    import ctxeval.cli.run as run_mod

    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(run_mod, "load_model", no_load)
    result = tune(*args, "--target-length", "256", "--out", tmp_path / "run")
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()


def test_the_methods_curve_per_method_is_the_best_so_far_of_its_own_trials(families):
    """tune.md's best ppl per method equals the minimum over that method's feasible rows. Bug caught: the table read
    from the parent's mirrored rows by trial number alone (three methods' trial 0 folded into one)."""
    text = (families.dir / "tune.md").read_text()
    section = text.split("## Each method's winner")[1].split("\n## ")[0]
    for name, method in (("search-yarn", "yarn"), ("search-ntk", "ntk"), ("search-longrope", "longrope")):
        best = min(
            (r["value"] for r in rows_of(families.dir / name) if r.get("status") == "ok" and r.get("feasible")),
            default=math.nan,
        )
        line = next(x for x in section.splitlines() if x.startswith(f"| {method} "))
        assert float(line.split("|")[5]) == pytest.approx(best, abs=0.006)


def test_plain_ropes_baseline_is_measured_once_for_all_methods(families):
    """Every method's study holds the same plain-RoPE perplexity at the trained length, measured by the first search
    and given to the others (at 16k on 2 CPU cores that forward costs as much as a trial). Bug caught: the baseline
    not handed on (each search measures it again), or handed to a study of other documents."""
    baselines = [record_of(families.dir / d)["tune"]["baseline_short"] for d in ("search-yarn", "search-ntk")]
    baselines.append(record_of(families.dir / "search-longrope")["tune"]["baseline_short"])
    assert len(set(baselines)) == 1 and baselines[0] > 1


# --time-budget across methods and for one method: test_time_budget.py (a fake clock, no wall-clock bounds)
