"""Figures a person can read: numbers on every log axis, no two series alike, the legend out of the data when
there are many, one painter for a run's heatmaps and the report's."""

import pandas as pd
import pytest

from ctxeval.report import plots as PL


@pytest.fixture
def figures(monkeypatch):
    """Capture the figures instead of writing them."""
    kept = []
    monkeypatch.setattr(PL, "save", lambda fig, path, tight=True: kept.append(fig) or path)
    return kept


@pytest.mark.parametrize("low, high", [(24.5, 56.0), (70.0, 152.0), (10.0, 990.0), (1.01, 1.09), (2.0, 3e5)])
def test_log_ticks_are_readable_values_inside_the_range(low, high):
    ticks = PL.log_ticks(low, high)
    assert len(ticks) >= 3 and all(low <= t <= high for t in ticks)
    assert all(len(f"{t:g}".replace(".", "").strip("0")) <= 3 for t in ticks)  # 25, 30, 1.04: never 26.73


def test_a_log_axis_within_one_decade_carries_numbers(figures):
    # SmolLM2 on Emma: every ppl between 25 and 56, where matplotlib's log axis labels nothing
    curves = [PL.Curve("none", "none", [2048, 4096, 8192, 16384], [28.97, 25.04, 25.74, 53.13]),
              PL.Curve("yarn(factor=2)", "yarn", [2048, 4096, 8192, 16384], [29.73, 25.68, 26.38, 26.66])]
    PL.plot_curves(curves, "x.png", title="t", xlabel="length", ylabel="perplexity", originals={8192: "L"}, log_y=True)
    ax = figures[0].axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert len(labels) >= 3 and all(label.replace(",", "").replace(".", "").isdigit() for label in labels)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["2k", "4k", "8k", "16k"]


def test_no_two_series_look_alike_and_families_keep_their_colour():
    labels = ["none", "pi(factor=4)", "pi(factor=8)", "ntk(factor=4)", "yarn(factor=4)", "yarn(factor=8)",
              "yarn(beta_fast=4,beta_slow=0.25,factor=8)", "dynamic-ntk", "my-method", "other-method"]
    curves = [PL.Curve(label, PL.method_family(label), [1], [1.0]) for label in labels]
    styles = PL.curve_styles(curves)
    looks = [(s["color"], s["ls"], s["marker"]) for s in styles]
    assert len(set(looks)) == len(looks)
    assert styles[4]["color"] == styles[5]["color"] == styles[6]["color"] == PL.FAMILY_COLORS["yarn"]
    assert styles[8]["color"] != styles[9]["color"]  # unknown families get colours of their own


def test_many_series_put_the_legend_outside(figures):
    curves = [PL.Curve(f"yarn(factor={f})", "yarn", [64, 128], [1.0 + f, 2.0 + f]) for f in range(7)]
    PL.plot_curves(curves, "x.png", title="t", xlabel="length", ylabel="y")
    legend = figures[0].axes[0].get_legend()
    assert legend.get_bbox_to_anchor().x0 > figures[0].axes[0].get_window_extent().x1 - 1  # right of the axes


def test_heatmap_panel_marks_failures_and_the_original_length(figures):
    grid = pd.DataFrame([[1.0, float("nan")], [0.5, float("nan")]], index=[0.0, 100.0], columns=[128, 256])
    status = pd.DataFrame([["ok", "oom"], ["ok", "missing"]], index=grid.index, columns=grid.columns)
    PL.plot_heatmaps([PL.HeatmapPanel("none", grid, status, 128)], "x.png", "title")
    texts = [t.get_text() for t in figures[0].axes[0].texts]
    assert texts == ["100%", "OOM", "50%", "—"]
    assert [line.get_xdata()[0] for line in figures[0].axes[0].lines] == [0.5]  # dashed: past 128
