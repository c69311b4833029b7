"""A tune run's own outputs (report/tune.py: tune.md, trials.csv, figures) and tune runs in `ctxeval report`, on real
`ctxeval tune` runs of the bundled tiny model (made once for the module)."""

import csv
import json
import math
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.report.kinds.tune_data import (
    Heldout,
    best_so_far,
    fmt_params,
    inv_freq,
    pair_scales,
    pareto_front,
    read_tune,
    trial_rows,
)
from ctxeval.report.kinds.tune_outputs import render_tune, trials_frame
from ctxeval.report.runs import expand_run_args
from ctxeval.report.tables import fmt_ppl
from ctxeval.rope.methods import Geometry, compute
from ctxeval.runs.store import read_rows

pytest.importorskip("optuna")
runner = CliRunner()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tune runs of YaRN at 1k: `a` (12 trials, a guard some trials break, a --compare spec and an export) and
    `b` (6 trials, another seed, a guard the defaults keep, so it has a winner whatever the sampler draws)."""
    root = tmp_path_factory.mktemp("tune-runs")
    a, b = root / "yarn-a", root / "yarn-b"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CTXEVAL_CACHE", str(root / "cache"))
        for args in (
            [
                "--out",
                str(a),
                "--trials",
                "12",
                "--short-tolerance",
                "0.3",
                "--export",
                str(root / "export"),
                "--compare",
                "yarn:factor=8,beta_fast=4,beta_slow=0.25",
            ],
            ["--out", str(b), "--trials", "6", "--seed", "1", "--short-tolerance", "0.5"],
        ):
            result = runner.invoke(app, ["tune", "--target-length", "1k", *args])
            assert result.exit_code == 0, result.output
    return a, b


def record(run_dir):
    return json.loads((run_dir / "run.json").read_text())


def heldout_dir(run_dir):
    return run_dir / record(run_dir)["tune"]["heldout_dir"]


def md_table(text, heading):
    """The first markdown table after `heading`: (headers, rows of cells)."""
    lines = text.split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    block = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        block.append([c.strip() for c in line.strip("|").split("|")])
    return block[0], block[2:]


def recomputed(run_dir):
    """(label, length) -> exp(summed NLL / summed tokens) over the held-out run's documents."""
    sums = {}
    for row in read_rows(heldout_dir(run_dir) / "rows.jsonl"):
        nll, n = sums.get((row["label"], row["length"]), (0.0, 0))
        sums[(row["label"], row["length"])] = (nll + row["nll_sum"], n + row["n_tokens"])
    return {key: math.exp(nll / n) for key, (nll, n) in sums.items()}


# -- tune.md -----------------------------------------------------------------------------------------------------


def test_tune_md_heldout_table_equals_a_recomputation_from_the_heldout_rows(runs):
    # a per-document mean instead of the token-weighted one, swapped columns or another winner's run all show here
    a, _ = runs
    rec = record(a)
    short, target, winner = rec["spec"]["short"], rec["spec"]["target"], rec["tune"]["winner"]["label"]
    headers, rows = md_table((a / "tune.md").read_text(), "## Held-out documents")
    assert headers[1:3] == [f"ppl at {short} (trained)", "ppl at 1k (target)"]
    want = recomputed(a)
    held_spec = record(heldout_dir(a))["spec"]
    assert rows[0][0] == f"★ {winner} (tuned)"  # the winner first, marked
    assert [r[0] for r in rows[1:]] == [m for m in held_spec["methods"] if m != winner]
    assert "yarn(beta_fast=4,beta_slow=0.25,factor=8)" in held_spec["methods"]  # --compare is re-measured
    for row in rows:
        label = winner if row[0].startswith("★") else row[0]
        assert row[1] == fmt_ppl(want[(label, short)]) and row[2] == fmt_ppl(want[(label, target)])
        if label != winner:
            assert row[3] == f"{want[(label, target)] / want[(winner, target)] - 1:+.2%}"


def test_tune_md_says_what_was_searched_the_guard_the_winner_and_the_export(runs):
    a, _ = runs
    rec, text = record(a), (a / "tune.md").read_text()
    trials = trial_rows(read_rows(a / "rows.jsonl"))
    ok = [r for r in trials if r["status"] == "ok"]
    refused = sum(r["status"] == "invalid" for r in trials)
    assert len(trials) - refused == rec["tune"]["trials"] == 12  # --trials counts the points measured
    assert (
        f"trials: 12 ({len(ok)} measured, {sum(r['feasible'] for r in ok)} of them kept the guard; "
        f"{12 - len(ok)} failed), and {refused} more points refused"
    ) in text
    assert f"searched: `{rec['spec']['space']}`" in text
    assert f"{sum(r.get('forwards') or 0 for r in trials):,} forwards" in text
    baseline = rec["tune"]["baseline_short"]
    assert f"plain RoPE's {baseline:.2f} there, i.e. at most {baseline * 1.3:.2f}" in text
    winner = rec["tune"]["winner"]
    best = min((r for r in ok if r["feasible"]), key=lambda r: r["value"])
    assert winner["trial"] == best["trial"]
    assert f"Trial {winner['trial']}: `{winner['label']}`" in text
    assert f"perplexity {winner['ppl_target']:.2f} at 1k" in text
    check = rec["tune"]["export"]["verification"]
    assert f"verification ({'passed' if check['passed'] else 'FAILED'})" in text
    assert f"{check['max_rel_diff_ppl']:.2e} in perplexity" in text
    assert json.dumps(rec["tune"]["export"]["rope_parameters"], sort_keys=True) in text
    _, top = md_table(text, "## The best trials")
    assert [int(r[1]) for r in top] == [
        r["trial"] for r in sorted((r for r in ok if r["feasible"]), key=lambda r: r["value"])
    ][:10]


def test_trials_csv_has_one_line_per_trial_with_its_parameters_as_columns(runs):
    a, _ = runs
    rows = trial_rows(read_rows(a / "rows.jsonl"))
    with open(a / "trials.csv", newline="") as f:
        lines = list(csv.DictReader(f))
    assert [int(line["trial"]) for line in lines] == list(range(len(rows))) == [r["trial"] for r in rows]
    for line, row in zip(lines, rows):
        assert line["status"] == row["status"] and line["label"] == row["label"]
        for name, value in row["params"].items():
            assert float(line[name]) == pytest.approx(value, rel=1e-5)
        if row["status"] == "ok":
            assert float(line["ppl_target"]) == pytest.approx(row["value"], rel=1e-5)
            assert float(line["short_rise"]) == pytest.approx(row["short_rise"], rel=1e-5, abs=1e-9)
            assert line["feasible"] == str(row["feasible"])
        else:
            assert line["ppl_target"] == line["ppl_short"] == line["feasible"] == ""


def test_trials_frame_orders_per_pair_factors_by_index():
    rows = [
        {
            "trial": 0,
            "status": "ok",
            "label": "longrope(x)",
            "value": 9.0,
            "ppl_short": 5.0,
            "short_rise": 0.0,
            "feasible": True,
            "params": {f"long_factor.{i}": float(i) for i in (0, 1, 10, 2, 9)},
        }
    ]
    frame = trials_frame(rows)
    assert [c for c in frame.columns if c.startswith("long_factor")] == [f"long_factor.{i}" for i in (0, 1, 2, 9, 10)]


def test_figures_are_written_and_listed(runs):
    a, _ = runs
    out = render_tune(a)
    for name in ("tune-objective.png", "tune-factors.png", "tune-pareto.png"):
        assert (a / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
        assert name in out.wrote
    assert [t.title.split(":")[0] for t in out.tables] == ["held-out documents", out.tables[1].title.split(":")[0]]
    assert out.tables[0].rows[0][0].startswith("★")


# -- the numbers behind the figures ------------------------------------------------------------------------------


def test_best_so_far_is_monotone_and_counts_only_trials_that_kept_the_guard(runs):
    a, _ = runs
    line = best_so_far(trial_rows(read_rows(a / "rows.jsonl")))
    assert line and all(later <= earlier for (_, earlier), (_, later) in zip(line, line[1:]))
    assert line[-1][1] == record(a)["tune"]["winner"]["ppl_target"]
    rows = [
        {"trial": 0, "status": "ok", "value": 50.0, "feasible": False},  # lower, but broke the guard
        {"trial": 1, "status": "ok", "value": 90.0, "feasible": True},
        {"trial": 2, "status": "invalid", "value": None},
        {"trial": 3, "status": "ok", "value": 95.0, "feasible": True},
        {"trial": 4, "status": "ok", "value": 80.0, "feasible": True},
    ]
    assert best_so_far(rows) == [(1, 90.0), (2, 90.0), (3, 90.0), (4, 80.0)]


def test_pareto_front_against_a_hand_written_example():
    points = [(1.0, 5.0), (2.0, 3.0), (3.0, 4.0), (4.0, 1.0), (2.0, 3.0), (5.0, 5.0), (1.0, 6.0), (4.0, 2.0)]
    # (3, 4) is beaten by (2, 3); (5, 5) by all; (1, 6) by (1, 5) (equal x); (4, 2) by (4, 1); equal points both stay
    assert pareto_front(points) == [0, 1, 4, 3]
    assert pareto_front([]) == [] and pareto_front([(7.0, 7.0)]) == [0]


def test_pair_scales_are_plain_rope_over_the_method(runs):
    # the ratio upside down would put PI at 1/8
    a, _ = runs
    held = read_tune(a).heldout
    scales = pair_scales(held, held.labels)
    assert scales["pi(factor=8)"] == pytest.approx([8.0] * 16, rel=1e-6)
    assert scales["none"] == pytest.approx([1.0] * 16)
    entry = record(heldout_dir(a))["methods"][held.winner]
    geometry = Geometry(**entry["geometry"])
    want = (
        geometry.default_inv_freq()
        / compute("yarn", geometry, {k: v for k, v in entry["params"].items() if v is not None}).inv_freq
    )
    assert scales[held.winner] == pytest.approx(list(want), rel=1e-6)


def test_inv_freq_takes_the_target_length_entry_of_a_length_dependent_method(tmp_path):
    methods = {
        "longrope(x)": {
            "method": "longrope",
            "geometry": {"rotary_dim": 4, "base": 100.0, "original_length": 8},
            "effective": [{"length": 8, "inv_freq": [1.0, 0.1]}, {"length": 64, "inv_freq": [0.5, 0.01]}],
        },
        "none": {"method": "none", "geometry": {"rotary_dim": 4, "base": 100.0, "original_length": 8}},
    }
    held = Heldout(tmp_path, {"methods": methods}, "longrope(x)", ["longrope(x)", "none"], 8, 64, {}, {}, [])
    assert inv_freq(held, "longrope(x)") == [0.5, 0.01]
    assert inv_freq(held, "none") == [1.0, 0.1]  # no read-back record: computed from the geometry
    assert pair_scales(held, ["longrope(x)"]) == {"longrope(x)": pytest.approx([2.0, 10.0])}
    # LongRoPE's short factors: the entry at the trained length (tune-factors.png's dashed line)
    assert inv_freq(held, "longrope(x)", 8) == [1.0, 0.1]
    assert pair_scales(held, ["longrope(x)"], 8) == {"longrope(x)": pytest.approx([1.0, 1.0])}


def absolute_paths(text: str) -> list[str]:
    """Absolute paths of this machine a committed file could carry: /tmp, /work, /home, /root, the pytest temp dir."""
    return re.findall(r"(?<![\w.])/(?:tmp|work|home|root|private|var)/[^\s`'\")]*", text)


def test_tune_md_and_run_json_name_no_absolute_temp_path(runs):
    # the issue: results/tune-tiny-pydoc-yarn/tune.md named '/tmp/export-tiny-yarn' and the model's own directory
    a, _ = runs
    text, export = (a / "tune.md").read_text(), record(a)["tune"]["export"]
    assert absolute_paths(text) == [] and str(a.parent) not in text
    assert "- directory: `export` (config.json with these rope_parameters, weights linked from `tiny`'s files" in text
    assert export["verification"]["directory"] == "export" and export["weights_linked_from"] == "tiny"
    assert absolute_paths(json.dumps(export)) == []


def test_an_older_record_with_absolute_paths_is_shown_by_names(runs, tmp_path):
    a, _ = runs
    run = tmp_path / "old"
    shutil.copytree(a, run)
    rec = record(run)
    rec["tune"]["export"]["verification"]["directory"] = "/tmp/export-tiny-yarn"  # what issue 39 found committed
    rec["tune"]["export"]["weights_linked_from"] = "/work/main/ctxeval/tiny/model"
    (run / "run.json").write_text(json.dumps(rec))
    render_tune(run)
    text = (run / "tune.md").read_text()
    assert "- directory: `export-tiny-yarn` (config.json" in text and "linked from `tiny`'s files" in text
    assert absolute_paths(text) == []


def test_the_committed_tune_results_name_no_absolute_path():
    results = Path(__file__).resolve().parents[2] / "results"
    tune_runs = sorted(results.glob("tune-*/run.json"))
    assert len(tune_runs) >= 3
    for path in tune_runs:
        assert absolute_paths((path.parent / "tune.md").read_text()) == [], path.parent.name
        assert absolute_paths(json.dumps(json.loads(path.read_text())["tune"].get("export") or {})) == []


def test_tune_prints_its_best_trials_whole_at_80_columns(runs, tmp_path):
    # the issue: at 80 columns the best-trials table had an empty rank column and its numbers one digit per line;
    # a rerun of a finished search measures nothing and prints the tables again
    _, b = runs
    run = tmp_path / "b"
    shutil.copytree(b, run)
    args = ["tune", "--target-length", "1k", "--out", str(run), "--trials", "6", "--seed", "1"]
    result = runner.invoke(app, [*args, "--short-tolerance", "0.5"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert max(len(line) for line in out.splitlines()) <= 80
    words = {w for line in out.splitlines() for w in line.replace("│", " ").split()}
    top = out.split("best trial(s) that kept the guard")[1]
    ranks = [line.replace("│", " ").split()[0] for line in top.splitlines() if re.match(r"^│\s+\d", line)]
    feasible = sorted(
        (r for r in trial_rows(read_rows(run / "rows.jsonl")) if r.get("feasible")), key=lambda r: r["value"]
    )
    assert ranks == [str(i) for i in range(1, len(feasible[:10]) + 1)]
    for r in feasible[:10]:
        assert {str(r["trial"]), fmt_ppl(r["value"]), fmt_ppl(r["ppl_short"])} <= words
        assert set(fmt_params(r["params"]).split()) <= words  # each parameter whole, on one line


# -- ctxeval report ----------------------------------------------------------------------------------------------


def test_report_on_two_tune_runs_prints_one_tune_row_per_run(runs):
    a, b = runs
    result = runner.invoke(app, ["report", str(a), str(b)])
    assert result.exit_code == 0, result.output
    headers, rows = md_table(result.stdout, "## Tuned methods")
    assert headers[:4] == ["model", "method (tuned winner)", "target", "trials"]
    assert len(rows) == 2
    for row, run_dir in zip(rows, (a, b)):
        rec, want = record(run_dir), recomputed(run_dir)
        winner = rec["tune"]["winner"]["label"]
        assert row[1] == winner and row[3] == str(rec["tune"]["trials"])
        cell = dict(zip(headers, row))
        assert cell["tuning ppl @ target"] == fmt_ppl(rec["tune"]["winner"]["ppl_target"])
        assert cell["held-out @ trained"] == fmt_ppl(want[(winner, 128)])
        assert cell["held-out @ target"] == fmt_ppl(want[(winner, 1024)])
        assert cell["none @ target"] == fmt_ppl(want[("none", 1024)])
        assert cell["yarn defaults @ target"] == fmt_ppl(want[("yarn(factor=8)", 1024)])
        others = {k: v for k, v in want.items() if k[1] == 1024 and k[0] != winner}
        assert cell["best other @ target"] == fmt_ppl(min(others.values()))
    data = json.loads(runner.invoke(app, ["report", str(a), str(b), "-f", "json"]).stdout)
    tune = next(g for g in data["groups"] if g["kind"] == "tune")
    assert [r["method"] for r in tune["tables"][0]["rows"]] == [
        record(a)["tune"]["winner"]["label"],
        record(b)["tune"]["winner"]["label"],
    ]
    lines = runner.invoke(app, ["report", str(a), str(b), "-f", "csv"]).stdout.splitlines()
    assert sum(line.startswith("tune-1,") and ",held-out tuned at target," in line for line in lines) == 2


def test_report_over_a_tune_run_includes_its_heldout_ppl_table(runs, tmp_path):
    a, _ = runs
    held = heldout_dir(a)
    result = runner.invoke(app, ["report", str(a)])
    assert result.exit_code == 0, result.output
    headers, rows = md_table(result.stdout, "## Perplexity")
    want = recomputed(a)
    assert headers == ["model", "method", "128", "1k"]
    assert [r[1] for r in rows] == record(held)["spec"]["methods"]
    for row in rows:
        assert row[2:] == [fmt_ppl(want[(row[1], 128)]), fmt_ppl(want[(row[1], 1024)])]
    # named explicitly as well: used once, no "given twice" note
    kept, notes = expand_run_args([a, held])
    assert kept == [a, held] and notes == []
    kept, notes = expand_run_args([a.parent])  # a folder of tune runs brings each one's held-out run
    assert heldout_dir(a) in kept and heldout_dir(runs[1]) in kept
    html = tmp_path / "r.html"
    assert runner.invoke(app, ["report", str(a), "--html", str(html)]).exit_code == 0
    text = html.read_text()
    assert 'id="tune-1"' in text and 'id="ppl-1"' in text


def test_a_tune_run_without_a_winner(runs, tmp_path):
    # what a search leaves when no trial kept the guard: no held-out run, no winner
    _, b = runs
    run = tmp_path / "no-winner"
    shutil.copytree(b, run, ignore=shutil.ignore_patterns("heldout-trial-*", "*.png", "tune.md", "trials.csv"))
    rec = record(run)
    rec["tune"]["winner"] = None
    rec["tune"].pop("heldout_dir")
    (run / "run.json").write_text(json.dumps(rec))
    rows = [{**r, "feasible": False} if r["status"] == "ok" else r for r in read_rows(run / "rows.jsonl")]
    (run / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = render_tune(run)
    text = (run / "tune.md").read_text()
    assert "No trial kept the guard" in text and "## Held-out documents" not in text
    assert "tune-factors.png" not in out.wrote and (run / "tune-pareto.png").is_file()
    assert any("No trial kept the guard" in n for n in out.notes)
    result = runner.invoke(app, ["report", str(run)])
    assert result.exit_code == 0, result.output
    _, table = md_table(result.stdout, "## Tuned methods")
    assert table[0][1] == "yarn (no trial kept the guard)" and table[0][5:] == ["—"] * 6
    assert "## Perplexity" not in result.stdout


def test_no_committed_result_names_a_path_of_the_machine_that_made_it():
    """Issue 39: committed results named this machine's checkout, virtual environment and home (the model cache,
    the SmolLM2 GGUF, argv[0], tune's scratch export directory); records now keep the program by name and bundled
    paths from ctxeval/, ~ or site-packages/."""
    import re
    from pathlib import Path

    results = Path(__file__).resolve().parents[2] / "results"
    machine = re.compile(r"/(?:root|home/[^/\"]+|work|tmp)/")
    found = [
        str(path.relative_to(results))
        for path in results.rglob("*")
        if path.is_file() and path.suffix in {".json", ".md", ".csv", ".html"} and machine.search(path.read_text())
    ]
    assert not found, found


def test_a_method_with_no_feasible_trial_is_named_in_the_methods_figure(tmp_path, monkeypatch):
    """Bug caught (present before): tune-methods.png left out a method none of whose trials kept the guard, so the
    figure read as if it had not been searched."""
    import ctxeval.report.kinds.tune_plots as plots

    legends = []

    def keep(fig, path):
        import matplotlib.pyplot as plt

        legends.extend(t.get_text() for t in fig.axes[0].get_legend().get_texts())
        plt.close(fig)
        return path

    monkeypatch.setattr(plots, "save", keep)
    plots.plot_families({"yarn": [(1, 70.0), (2, 66.0)], "ntk": []}, 1024, tmp_path / "m.png", "which method")
    assert legends == ["yarn (best 66.00)", "ntk (no trial kept the guard)"]
