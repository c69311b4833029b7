"""A run's own outputs (report/single.py): the passkey run's figure, the heatmaps' scale and titles."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from report.run_dirs import needle_run

from ctxeval.report import plots as PL
from ctxeval.report.kinds.needle import render_retrieval


@pytest.fixture
def figures(monkeypatch):
    """Capture the figures (path name -> figure); the files are still written."""
    kept = {}
    save = PL.save

    def keep(fig, path, tight=True):
        kept[Path(path).name] = fig
        fig.canvas.draw()  # tick labels exist once drawn (save closes the figure)
        return save(fig, path, tight)

    monkeypatch.setattr(PL, "save", keep)
    return kept


def store_of(run_dir):
    rows = [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]
    return SimpleNamespace(dir=run_dir, rows=lambda: rows, record={})


def test_a_passkey_run_draws_accuracy_by_length_with_the_threshold_in_percent(tmp_path, figures):
    """Issue 39: `ctxeval passkey` wrote no figure of its own (needle writes heatmap-<method>.png)."""
    run = needle_run(
        tmp_path,
        "pk",
        task="passkey",
        samples=5,
        haystack="filler",
        acc={
            "none": {128: [1, 1, 1, 1, 1], 256: [1, 1, 0, 0, 0], 512: [0, 0, 0, 0, 0]},
            "yarn(factor=4)": {128: [1, 1, 1, 1, 1], 256: [1, 1, 1, 1, 0], 512: [1, 1, 1, 0, 0]},
        },
    )
    specs = [SimpleNamespace(label="none"), SimpleNamespace(label="yarn(factor=4)")]
    out = render_retrieval(store_of(run), "passkey", specs, 128, 0.8, "m1: passkey in filler")
    assert (run / "passkey.png").stat().st_size > 0
    assert out.wrote == f"wrote {run}/table.md, summary.csv, passkey.csv, passkey.png"
    assert not list(run.glob("heatmap-*.png"))  # random depths: no depth x length grid
    fig = figures["passkey.png"]
    ax = fig.axes[0]
    assert ax.get_title() == "m1: passkey in filler: accuracy by length"
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.lines}
    assert lines["none"] == pytest.approx([100.0, 40.0, 0.0])
    assert lines["yarn(factor=4)"] == pytest.approx([100.0, 80.0, 60.0])
    assert lines["threshold 80%"] == [80.0, 80.0]  # the same unit as the axis
    assert "original length 128" in lines
    ticks = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert "0%" in ticks and "100%" in ticks and all(t.endswith("%") for t in ticks)


def test_a_needle_run_s_heatmaps_use_the_colour_blind_safe_scale(tmp_path, figures):
    run = needle_run(tmp_path, "n", acc={"none": {64: 1, 128: 1, 256: 0}, "yarn(factor=2)": {64: 1, 256: 1}})
    specs = [SimpleNamespace(label="none"), SimpleNamespace(label="yarn(factor=2)")]
    out = render_retrieval(store_of(run), "needle", specs, 128, 0.8, "m1: ruler in austen")
    assert out.wrote.endswith("heatmap-*.png") and not (run / "passkey.png").exists()
    fig = figures["heatmap-none.png"]
    assert fig.axes[0].images[0].get_cmap().name == PL.HEATMAP_CMAP
    title = fig._suptitle.get_text()  # a lone panel is narrow: the title may take a second line, no more
    assert title.replace("\n", " ") == "none: m1: ruler in austen (dashed: past the original length 128)"
    assert title.count("\n") <= 1
    texts = {t.get_text(): t.get_color() for t in fig.axes[0].texts}
    assert texts == {"100%": "black", "0%": "white"}
