"""The report's files (report/render.py): figures with one short title each, the protocol kept out of them and of
the headings, passkey accuracy and its threshold in one unit, and a tune group's search figures beside its tables."""

import json
from pathlib import Path

import pytest
from matplotlib import colors as mcolors
from report.run_dirs import entropy_run, needle_run, ppl_run

from ctxeval.report import figures as report_figures
from ctxeval.report import merged, render
from ctxeval.report import plots as PL
from ctxeval.report.runs import field_label, fmt_value

REPO = Path(__file__).resolve().parents[2]
TITLE_MAX = 100  # characters of a figure title: one line over the figure


@pytest.fixture
def figures(monkeypatch):
    """Capture the figures instead of writing them: path name -> figure."""
    kept = {}
    monkeypatch.setattr(PL, "save", lambda fig, path, tight=True: kept.setdefault(Path(path).name, fig) and path)
    return kept


@pytest.fixture
def committed(monkeypatch):
    """A report over committed runs (results/), their names relative to the checkout as on the command line."""
    monkeypatch.chdir(REPO)
    return lambda *names: merged.build_report([f"results/{name}" for name in names])


def report_of_every_curve_kind(root):
    runs = [
        ppl_run(root, "a", ppl={"none": {64: 10.0, 128: 12.0}, "yarn(factor=2)": {64: 11.0, 128: 11.5}}),
        needle_run(
            root,
            "n",
            acc={label: {64: 1, 128: 0, 256: 1, 512: 0} for label in ("none", "pi(factor=4)", "ntk(factor=4)", "x")},
        ),
        needle_run(
            root,
            "k",
            task="passkey",
            samples=5,
            haystack="filler",
            acc={"none": {64: [1, 1, 1, 1, 1], 128: [1, 1, 1, 1, 0], 256: [1, 0, 0, 0, 0]}},
        ),
        entropy_run(root, "e"),
    ]
    return merged.build_report(runs)


def titles(fig):
    found = [fig._suptitle.get_text()] if fig._suptitle is not None else []
    return found + [ax.get_title() for ax in fig.axes if ax.get_title()]


def test_figure_titles_are_one_short_line_without_the_protocol(tmp_path, figures):
    """Issue 39: every report figure's title carried the group's whole protocol (3-5 lines of text). Now: the kind,
    the models and what is plotted, on one line; the protocol is in the captions."""
    rep = report_of_every_curve_kind(tmp_path)
    images = render.write_plots(rep, tmp_path / "out")
    assert set(images) == {"ppl-1", "needle-1", "passkey-1", "entropy-1"}
    for group in rep.groups:
        fig = figures[images[group.id]]
        main = titles(fig)[0]  # a heatmap grid's suptitle, a curve figure's axes title
        assert "\n" not in main and len(main) <= TITLE_MAX, main
        assert main.startswith(group.short_title + " · m1: "), main
        assert group.description not in main and "·" not in main.split(": ", 1)[1], main
    needle = titles(figures[images["needle-1"]])
    assert needle[0] == "Needle in a haystack · m1: accuracy by depth and length (dashed: past the original length)"
    assert needle[1:] == ["none", "pi(factor=4)", "ntk(factor=4)", "x"]  # the panels: one method each


def test_the_passkey_figure_draws_accuracy_and_threshold_in_percent(tmp_path, figures):
    """Issue 39: the passkey plot's y axis ran 0-1 while its threshold said 80%."""
    rep = report_of_every_curve_kind(tmp_path)
    images = render.write_plots(rep, tmp_path / "out")
    ax = figures[images["passkey-1"]].axes[0]
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.lines}
    assert lines["none"] == pytest.approx([100.0, 80.0, 20.0])
    assert lines["threshold 80%"] == [80.0, 80.0]
    figures[images["passkey-1"]].canvas.draw()
    ticks = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert ticks and all(t.endswith("%") for t in ticks) and "100%" in ticks and ax.get_ylim()[1] < 110


def test_a_needle_grid_of_the_report_is_colour_blind_safe(tmp_path, figures):
    rep = report_of_every_curve_kind(tmp_path)
    images = render.write_plots(rep, tmp_path / "out")
    fig = figures[images["needle-1"]]
    assert {ax.images[0].get_cmap().name for ax in fig.axes if ax.images} == {PL.HEATMAP_CMAP}
    for ax in fig.axes:
        for text in ax.texts:  # a 100% cell (light) reads black, a 0% cell (dark) white
            want = "black" if text.get_text() == "100%" else "white"
            assert mcolors.to_hex(text.get_color()) == mcolors.to_hex(want), text.get_text()


LONG_HEADINGS = ("ruler-smollm2-austen", "ruler-smollm2-austen-attention", "ruler-tiny-pydoc")


def test_headings_are_one_line_and_the_protocol_line_keeps_every_field(committed):
    """Issue 39: RULER's headings listed all 11 tasks and the essays' remark (over 200 characters)."""
    rep = committed(*LONG_HEADINGS)
    assert max(len(g.title) for g in rep.groups) > 200  # the groups' full titles, as report.json keeps them
    md = render.to_markdown(rep)
    headings = [line[3:] for line in md.splitlines() if line.startswith("## ")]
    assert headings == [report_figures.heading(g) for g in rep.groups]
    assert all(len(h) <= report_figures.HEADING_MAX for h in headings), headings
    assert headings[0] == ("RULER (1 of 3): 11 tasks, essays austen, essay sha256 ae4140c6e5ab543c"), headings[0]
    assert headings[1].startswith("RULER (2 of 3): tasks niah_single_2, essays austen")
    for group in rep.groups:  # every field, whole, on the line under the heading
        assert f"Protocol: {group.description}." in md
        shown = [f"{field_label(f)} {fmt_value(group.key.get(f))}" for f in group.distinguishing]
        assert all(field in group.description for field in shown), shown


def test_a_short_heading_is_the_group_title_unchanged(tmp_path):
    rep = report_of_every_curve_kind(tmp_path)
    assert [report_figures.heading(g) for g in rep.groups] == [g.title for g in rep.groups]
    assert "\n## Passkey retrieval\n" in render.to_markdown(rep)


def test_report_out_writes_a_tune_run_s_figures_and_lists_them(committed, tmp_path):
    """Issue 39: `ctxeval report --out` over a tune run drew nothing for it (its search figures were only in the run
    directory), so the HTML page had none either."""
    rep = committed("tune-tiny-pydoc-yarn")
    out = tmp_path / "report"
    written = [p.name for p in render.write_report(rep, out) if p.suffix == ".png"]
    tune = next(g for g in rep.groups if g.kind == "tune")
    stem = render.figure_stems(rep.groups)[tune.id]
    expected = [f"{stem}-{part}.png" for part in ("objective", "pareto", "factors")]
    assert set(expected) <= set(written)
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no folder left over from the drawing
    record = json.loads((out / "report.json").read_text())
    listed = next(g for g in record["groups"] if g["id"] == tune.id)["figures"]
    assert sorted(listed) == sorted(expected)
    md = (out / "table.md").read_text()
    for name in expected:
        assert f"]({name})" in md
    assert "perplexity at the target by trial, with the best so far" in md

    # a later report into the same folder without the tune run removes the tune figures it no longer draws
    ppl_only = merged.build_report(["results/tune-tiny-pydoc-yarn/heldout-trial-200"])
    render.write_report(ppl_only, out)
    assert not [name for name in expected if (out / name).exists()]


def test_two_tune_runs_in_one_group_get_a_figure_set_each(committed, tmp_path):
    rep = committed("tune-tiny-pydoc-yarn", "tune-tiny-pydoc-longrope")
    tune = next(g for g in rep.groups if g.kind == "tune")
    assert len(tune.runs) == 2
    images = render.write_plots(rep, tmp_path)
    keys = sorted(k for k in images if k.startswith(tune.id + "-"))
    assert keys == sorted(f"{tune.id}-run{k}-{part}" for k in (1, 2) for part in ("objective", "pareto", "factors"))
    stem = render.figure_stems(rep.groups)[tune.id]
    assert sorted(images[k] for k in keys) == sorted(
        f"{stem}-{method}-{part}.png" for method in ("yarn", "longrope") for part in ("objective", "pareto", "factors")
    )  # named by each run's method
    assert all((tmp_path / images[k]).is_file() for k in keys)
    captions = [c for _, _, c in render.group_figures(tune, images)]
    assert sum("results/tune-tiny-pydoc-yarn" in c for c in captions) == 3
    assert sum("results/tune-tiny-pydoc-longrope" in c for c in captions) == 3


def test_two_tune_runs_of_one_method_are_told_apart_by_their_order(tmp_path):
    import shutil

    for name in ("first", "second"):
        shutil.copytree(REPO / "results" / "tune-tiny-pydoc-yarn", tmp_path / name)
    rep = merged.build_report([tmp_path / "first", tmp_path / "second"])
    tune = next(g for g in rep.groups if g.kind == "tune")
    assert len(tune.runs) == 2
    images = render.write_plots(rep, tmp_path / "out")
    stem = render.figure_stems(rep.groups)[tune.id]
    assert {images[f"{tune.id}-run{k}-objective"] for k in (1, 2)} == {
        f"{stem}-run1-objective.png",
        f"{stem}-run2-objective.png",
    }
