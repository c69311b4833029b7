"""RULER tasks with a depth axis (issue 41): the score by the answer's depth per method and length, the "lost in the
middle" figure and the depth x length heatmaps, in a run's own table.md and in `ctxeval report` (markdown, files,
HTML); a depth whose sample failed shows the failure as the RULER table does; rows without a depth change nothing."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from ctxeval.report import plots as PL
from ctxeval.report import tables
from ctxeval.report.html import to_html
from ctxeval.report.kinds.ruler import render_ruler
from ctxeval.report.merged import build_report
from ctxeval.report.render import group_figures, to_markdown, write_plots, write_report
from ctxeval.runs.rows import MISSING

TASKS = ["niah_single_1", "litm:kv"]
LABELS = ["none", "yarn(factor=2)"]
LENGTHS = (1024, 2048)
DEPTHS = (0.0, 50.0, 100.0)


def cell_index(label: str, length: int, depth: float) -> int:
    return LABELS.index(label) * 6 + LENGTHS.index(length) * 3 + DEPTHS.index(depth)


def expected(label: str, length: int, depth: float) -> float:
    """The cell's mean by hand: samples 1.0 and 0.08 i (i = the cell's index) -> (1 + 0.08 i) / 2 x 100."""
    return 50.0 + 4.0 * cell_index(label, length, depth)


def ruler_row(label, task, length, sample, score=None, status="ok", **extra):
    row = {"model": "m", "method": label.split("(")[0], "label": label, "params": {}, "task": "ruler"}
    row.update(ruler_task=task, length=length, sample=sample, status=status, **extra)
    if status == "ok":
        row.update(value=score, score=score)
    return row


def depth_rows(failed=None, with_depth=True):
    """niah_single_1 (no depth, every sample 1.0) and litm:kv: per (method, length, depth) two samples, 1.0 and
    0.08 x the cell's index; `failed` = (label, length, depth, status): that cell's second sample failed."""
    rows = []
    for label in LABELS:
        for length in LENGTHS:
            rows += [ruler_row(label, "niah_single_1", length, s, 1.0) for s in (0, 1)]
            for k, depth in enumerate(DEPTHS):
                where = {"depth": depth} if with_depth else {}
                rows.append(ruler_row(label, "litm:kv", length, 2 * k, 1.0, **where))
                if failed is not None and failed[:3] == (label, length, depth):
                    rows.append(ruler_row(label, "litm:kv", length, 2 * k + 1, status=failed[3], **where))
                else:
                    score = 0.08 * cell_index(label, length, depth)
                    rows.append(ruler_row(label, "litm:kv", length, 2 * k + 1, score, **where))
    return rows


def write_run(path, rows):
    record = {
        "status": "success",
        "started": "2026-01-01T00:00:00+00:00",
        "spec": {
            "task": "ruler",
            "model": "m",
            "dtype": "float32",
            "tasks": TASKS,
            "lengths": list(LENGTHS),
            "samples": 6,
            "seed": 42,
            "template": "base",
            "methods": LABELS,
        },
        "model": {"name": "m", "dtype": "float32", "max_position_embeddings": 1024},
        "protocol": {"threshold": 85.6},
    }
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps(record))
    (path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def depth_table(rep):
    found = [t for t in rep.tables if t.kind == "ruler-depth"]
    assert len(found) == 1 and found[0].task == "litm:kv"
    return found[0]


def test_the_depth_table_holds_the_mean_score_per_method_length_and_depth(tmp_path):
    table = depth_table(build_report([write_run(tmp_path / "r", depth_rows())]))
    assert table.headers == ["model", "method", "length", "0%", "50%", "100%"]
    assert table.columns == ["model", "method", "length", "0", "50", "100"] and table.depths == [0.0, 50.0, 100.0]
    assert [row[:3] for row in table.rows] == [["m", label, L] for label in LABELS for L in LENGTHS]
    for row in table.rows:
        assert row[3:] == pytest.approx([expected(row[1], row[2], d) for d in DEPTHS]), row[:3]
    # by hand: yarn at 2k, depth 50: samples 1.0 and 0.08 x 10 = 0.8 -> 90.0
    yarn_2k = next(c for c in table.cells if c[1] == "yarn(factor=2)" and c[2] == "2k")
    assert yarn_2k == ["m", "yarn(factor=2)", "2k", "86.0", "90.0", "94.0"]
    assert table.cells[0] == ["m", "none", "1k", "50.0", "54.0", "58.0"]


@pytest.mark.parametrize("failed_status, shown", [("oom", "OOM"), ("error", MISSING)])
def test_a_depth_with_a_failed_sample_shows_the_failure_as_the_ruler_table_does(tmp_path, failed_status, shown):
    rows = depth_rows(failed=("none", 2048, 50.0, failed_status))
    rep = build_report([write_run(tmp_path / "r", rows)])
    table = depth_table(rep)
    row = table.rows[1]
    assert row[:3] == ["m", "none", 2048] and row[4] is None, "scored from the sample that succeeded, or 0"
    assert row[3] == expected("none", 2048, 0.0) and row[5] == expected("none", 2048, 100.0)
    assert table.status[1][4] == failed_status and table.cells[1][4] == shown
    ruler = next(t for t in rep.tables if t.kind == "ruler")  # the RULER table: litm:kv at 2k missing there too
    assert dict(zip(ruler.columns, ruler.rows[0]))["2048"] is None and ruler.status[0][3] == "missing"


def test_a_failed_sample_without_a_depth_fails_every_depth_of_its_task_and_length():
    rows = depth_rows() + [ruler_row("none", "litm:kv", 1024, 9, status="oom")]
    scores = tables.ruler_depth_scores(rows)
    mine = scores[(scores["label"] == "none") & (scores["length"] == 1024)]
    assert list(mine["status"]) == ["oom"] * 3 and mine["score"].isna().all()
    other = scores[(scores["label"] == "none") & (scores["length"] == 2048)]
    assert list(other["score"]) == [expected("none", 2048, d) for d in DEPTHS]


def test_many_depths_are_binned_into_five_ranges():
    where = tables.depth_columns([10.0 * k for k in range(11)])
    assert where[0.0] == (10.0, "0-20%") and where[19.9 if 19.9 in where else 10.0] == (10.0, "0-20%")
    assert where[50.0] == (50.0, "40-60%") and where[100.0] == (90.0, "80-100%") and where[80.0][1] == "80-100%"
    assert tables.depth_columns([0.0, 24.46, 100.0]) == {
        0.0: (0.0, "0%"),
        24.46: (24.46, "24.5%"),
        100.0: (100.0, "100%"),
    }
    rows = [ruler_row("none", "t", 1024, k, float(k % 2), depth=10.0 * k) for k in range(11)]
    scores = tables.ruler_depth_scores(rows)
    assert list(scores["depth_label"]) == ["0-20%", "20-40%", "40-60%", "60-80%", "80-100%"]
    assert list(scores["score"]) == [50.0, 50.0, 50.0, 50.0, pytest.approx(100 / 3, abs=0.01)]  # 80, 90, 100


def test_the_figures_are_written_and_shown_in_the_ruler_section_of_the_markdown_and_the_html(tmp_path):
    rep = build_report([write_run(tmp_path / "r", depth_rows())])
    written = {p.name for p in write_report(rep, tmp_path / "out")}
    assert {"ruler-m-litm-kv-by-depth.png", "ruler-m-litm-kv-depth-heatmap.png", "ruler-m.png"} <= written
    md = (tmp_path / "out" / "table.md").read_text()
    section = md.split("## RULER")[1]
    for name in ("ruler-m.png", "ruler-m-litm-kv-by-depth.png", "ruler-m-litm-kv-depth-heatmap.png"):
        assert f"]({name})" in section
    assert "### litm:kv: score by depth" in section and "| m     | none           | 1k     | 50.0 | 54.0 | 58.0 |" in md
    assert section.index("### litm:kv") < section.index("ruler-m-litm-kv-by-depth.png")
    figures = json.loads((tmp_path / "out" / "report.json").read_text())["groups"][0]["figures"]
    assert figures == ["ruler-m.png", "ruler-m-litm-kv-by-depth.png", "ruler-m-litm-kv-depth-heatmap.png"]
    images = write_plots(rep, tmp_path / "html-figures")
    page = to_html(rep, {k: tmp_path / "html-figures" / v for k, v in images.items()})
    ruler = page.split('id="group-ruler-1"')[1].split("</section>")[0]
    assert 'id="ruler-1-depth-litm-kv"' in ruler and "litm:kv: score by depth" in ruler
    for key in ("ruler-1-depth-litm-kv-by-depth", "ruler-1-depth-litm-kv-depth-heatmap"):
        assert f'<figure id="fig-{key}"><img alt="RULER: litm:kv, score by' in ruler


def test_rows_without_a_depth_make_no_depth_table_or_figure(tmp_path):
    rep = build_report([write_run(tmp_path / "r", depth_rows(with_depth=False))])
    assert [t.kind for t in rep.tables] == ["ruler"]
    assert set(write_plots(rep, tmp_path / "out")) == {"ruler-1"}
    assert "score by depth" not in to_markdown(rep)
    store = SimpleNamespace(dir=tmp_path, rows=lambda: depth_rows(with_depth=False), record={})
    out = render_ruler(store, [SimpleNamespace(label=label) for label in LABELS], TASKS, 1024, 85.6, 6, "m: RULER")
    assert len(out.tables) == 2 and not list(tmp_path.glob("depth-*.png"))
    assert "score by depth" not in (tmp_path / "table.md").read_text()


def test_a_runs_own_tables_show_the_depths_within_80_columns_with_both_figures(tmp_path):
    rows = depth_rows(failed=("yarn(factor=2)", 1024, 100.0, "oom"))
    store = SimpleNamespace(dir=tmp_path, rows=lambda: rows, record={})
    out = render_ruler(store, [SimpleNamespace(label=label) for label in LABELS], TASKS, 1024, 85.6, 6, "m: RULER")
    printed = out.tables[-1]
    assert printed.title == "litm:kv: score by depth" and printed.headers == ["method", "length", "0%", "50%", "100%"]
    assert printed.rows[2] == ["yarn(factor=2)", "1k", "74.0", "78.0", "OOM"]
    md = (tmp_path / "table.md").read_text()
    section = md.split("## litm:kv: score by depth")[1]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    assert len(lines) == 6 and all(len(line) <= 80 for line in lines)
    assert "](depth-litm-kv.png)" in section and "](depth-heatmap-litm-kv.png)" in section
    assert (tmp_path / "depth-litm-kv.png").stat().st_size > 0 and (tmp_path / "depth-heatmap-litm-kv.png").exists()
    assert "depth-*.png" in out.wrote


@pytest.fixture
def figures(monkeypatch):
    kept = []
    monkeypatch.setattr(PL, "save", lambda fig, path, tight=True: kept.append(fig) or path)
    return kept


def test_the_lost_in_the_middle_figure_has_a_panel_per_length_a_line_per_method(tmp_path, figures):
    table = depth_table(build_report([write_run(tmp_path / "r", depth_rows())]))
    PL.plot_depth_curves(table, lambda m, lb: lb, tmp_path / "x.png", "RULER · m: litm:kv, score by depth")
    fig = figures[0]
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["context length 1k", "context length 2k"]
    assert axes[0].get_ylabel() == "score (%)" and "depth of the answer" in axes[0].get_xlabel()
    assert [t.get_text() for t in axes[0].get_xticklabels()] == ["0%", "50%", "100%"]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == LABELS
    assert "litm:kv" in fig._suptitle.get_text() and "m" in fig._suptitle.get_text()
    yarn = axes[1].lines[1]
    assert list(yarn.get_xdata()) == list(DEPTHS)
    assert list(yarn.get_ydata()) == pytest.approx([expected("yarn(factor=2)", 2048, d) for d in DEPTHS])
    panels = PL.depth_panels(table, lambda m, lb: lb, {"m": 1024})
    assert [p.title for p in panels] == LABELS and list(panels[0].grid.columns) == list(LENGTHS)
    assert panels[1].grid.loc[50.0, 2048] == pytest.approx(0.9) and panels[0].row_labels == ["0%", "50%", "100%"]
    assert not any(math.isnan(v) for v in panels[0].grid.to_numpy().ravel())


def test_a_task_whose_name_starts_another_gets_its_own_figure_captions(tmp_path):
    rows = depth_rows() + [dict(r, ruler_task="litm") for r in depth_rows() if r["ruler_task"] == "litm:kv"]
    rep = build_report([write_run(tmp_path / "r", rows)])
    assert [t.id for t in rep.tables] == ["ruler-1", "ruler-1-depth-litm-kv", "ruler-1-depth-litm"]
    images = write_plots(rep, tmp_path / "out")
    captions = {key: caption for key, _, caption in group_figures(rep.groups[0], images)}
    assert captions["ruler-1-depth-litm-by-depth"].startswith("RULER: litm, score by the answer's depth")
    assert captions["ruler-1-depth-litm-kv-depth-heatmap"] == "RULER: litm:kv, score by depth and length"
