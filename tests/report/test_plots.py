"""Figures a person can read: numbers on every log axis, no two series alike, the legend out of the data when
there are many, one painter for a run's heatmaps and the report's."""

import colorsys
import re

import pandas as pd
import pytest
from matplotlib import colors as mcolors

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
    curves = [
        PL.Curve("none", "none", [2048, 4096, 8192, 16384], [28.97, 25.04, 25.74, 53.13]),
        PL.Curve("yarn(factor=2)", "yarn", [2048, 4096, 8192, 16384], [29.73, 25.68, 26.38, 26.66]),
    ]
    PL.plot_curves(curves, "x.png", title="t", xlabel="length", ylabel="perplexity", originals={8192: "L"}, log_y=True)
    ax = figures[0].axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert len(labels) >= 3 and all(label.replace(",", "").replace(".", "").isdigit() for label in labels)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["2k", "4k", "8k", "16k"]


def same_hue(a, b):
    d = abs(colorsys.rgb_to_hls(*mcolors.to_rgb(a))[0] - colorsys.rgb_to_hls(*mcolors.to_rgb(b))[0])
    return min(d, 1 - d) < 0.01  # hue is an angle: red sits at both ends


def test_no_two_series_look_alike_and_families_keep_their_colour():
    labels = [
        "none",
        "pi(factor=4)",
        "pi(factor=8)",
        "ntk(factor=4)",
        "yarn(factor=4)",
        "yarn(factor=8)",
        "yarn(beta_fast=4,beta_slow=0.25,factor=8)",
        "dynamic-ntk",
        "my-method",
        "other-method",
        "self-extend(group_size=4)",
        "spare(x=1)",
    ]
    curves = [PL.Curve(label, PL.method_family(label), [1], [1.0]) for label in labels]
    styles = PL.curve_styles(curves)
    looks = [(s["color"], s["ls"], s["marker"]) for s in styles]
    assert len(set(looks)) == len(looks)
    assert styles[0]["color"] == mcolors.to_hex(PL.FAMILY_COLORS["none"])  # a lone variant: the family's colour
    assert len({styles[i]["color"] for i in (4, 5, 6)}) == 3  # yarn's variants: three shades of yarn's hue
    assert all(same_hue(styles[i]["color"], PL.FAMILY_COLORS["yarn"]) for i in (4, 5, 6))
    assert len({styles[i]["color"] for i in (8, 9, 11)}) == 3  # unknown families get colours of their own,
    assert styles[11]["color"] != styles[10]["color"]  # not the spare colour a known family in the figure has


def test_five_variants_of_one_family_differ_in_colour_style_and_marker(figures):
    """Issue 26: the entropy figure drew five YaRN variants in one red; read back from the drawn lines."""
    labels = [
        "none",
        "yarn(factor=4)",
        "yarn(attention_factor=1,factor=4)",
        "yarn(factor=8)",
        "yarn(attention_factor=1,factor=8)",
        "yarn(beta_fast=4,beta_slow=0.25,factor=4)",
        "pi(factor=4)",
        "ntk(factor=4)+logn",
        "rerope(window=32)",
        "logn",
    ]
    curves = [PL.Curve(label, PL.method_family(label), [64, 128], [1.0 + i, 2.0 + i]) for i, label in enumerate(labels)]
    curves.append(PL.Curve("uniform", "uniform", [64, 128], [9.0, 10.0], reference=True))
    PL.plot_curves(curves, "x.png", title="t", xlabel="length", ylabel="y", originals={128: "L"})
    lines = {line.get_label(): line for line in figures[0].axes[0].lines}
    looks = [
        (mcolors.to_hex(lines[label].get_color()), lines[label].get_linestyle(), lines[label].get_marker())
        for label in labels
    ]
    assert len(set(looks)) == len(labels)
    yarn = [looks[i] for i in range(1, 6)]
    for part in range(3):  # shade, line style and marker each tell the five apart where they can
        assert len({look[part] for look in yarn}) >= 4
    assert len({look[0] for look in yarn}) == 5
    reds = sorted(colorsys.rgb_to_hls(*mcolors.to_rgb(c))[1] for c, _, _ in yarn)
    assert reds[-1] - reds[0] > 0.3  # dark to light, not five near-identical reds


def test_an_identical_series_is_drawn_once_and_named_in_the_legend(figures):
    """Issue 26: ruler figures hid dynamic-ntk under none (same scores at every length)."""
    curves = [
        PL.Curve("none", "none", [1024, 2048], [50.15, 44.7]),
        PL.Curve("dynamic-ntk", "dynamic-ntk", [1024, 2048], [50.15, 44.7 + 1e-12]),
        PL.Curve("yarn(factor=2)", "yarn", [1024, 2048], [50.15, 42.1]),  # the same at one length only
        PL.Curve("rerope", "rerope", [1024], [50.15]),
        PL.Curve("self-extend", "self-extend", [1024, 2048], [50.15, 42.1]),
        PL.Curve("uniform", "uniform", [1024, 2048], [50.15, 44.7], reference=True),
    ]
    PL.plot_curves(
        curves, "x.png", title="t", xlabel="length", ylabel="score", threshold=85.6, threshold_label="threshold"
    )
    ax = figures[0].axes[0]
    drawn = [line.get_label() for line in ax.lines if line.get_label() != "threshold"]
    assert drawn == ["none (= dynamic-ntk)", "yarn(factor=2) (= self-extend)", "rerope", "uniform"]
    assert [t.get_text() for t in ax.get_legend().get_texts()][:2] == [
        "none (= dynamic-ntk)",
        "yarn(factor=2) (= self-extend)",
    ]


RULER_TITLE = (
    "RULER (1 of 3)\ntasks niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,"
    "niah_multikey_3,niah_multivalue,niah_multiquery,vt,cwe,fwe · samples 2 · seed 42 · essays austen "
    "(substitute for RULER's Paul Graham... · essay sha256 ae4140c6e5ab543c · template base"
)


@pytest.mark.parametrize("width", [60, 110])
def test_titles_wrap_between_words_and_list_items_never_inside_a_word(width):
    """Issue 26: the RULER title broke `niah_multivalu|e`."""
    wrapped = PL.wrap_title(RULER_TITLE, width).split("\n")
    assert wrapped[0] == "RULER (1 of 3)" and all(len(line) <= width for line in wrapped)
    words = [w for w in re.split(r"[ ,]", RULER_TITLE.replace("\n", " ")) if w]
    assert [w for line in wrapped for w in re.split(r"[ ,]", line) if w] == words  # every word whole, in order
    assert " ".join(wrapped).replace(", ", ",").replace(" ", "") == RULER_TITLE.replace("\n", "").replace(" ", "")


def test_a_word_longer_than_a_line_breaks_after_an_underscore():
    assert PL.wrap_title("x " + "a" * 20 + "_" + "b" * 20, 25) == "x " + "a" * 20 + "_\n" + "b" * 20
    assert PL.wrap_title("a" * 20 + "_" + "b" * 20, 50) == "a" * 20 + "_" + "b" * 20  # fits: not broken
    assert PL.wrap_title("a" * 30, 10) == "a" * 30  # nowhere safe to break: one line, whole


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
