"""Figures a person can read: numbers on every log axis, no two series alike, the legend out of the data when
there are many, one painter for a run's heatmaps and the report's."""

import colorsys
import re

import numpy as np
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


def test_more_families_than_any_palette_holds_get_colours_of_their_own_and_a_legend_that_fits(figures):
    """Issue 53: `ctxeval report results/*/ --html` ended in StopIteration once a figure held more method families
    than SPARE_COLORS had left; a runs folder grows the same way. 45 families, every known one among them."""
    known = list(PL.FAMILY_COLORS)
    unknown = [f"method-{i}" for i in range(45 - len(known))]
    curves = [
        PL.Curve(f"{f}(x=1)", f, [64, 128, 256], [1.0 + i, 2.0 + i, 3.0 + i]) for i, f in enumerate(known + unknown)
    ]
    assert len(curves) > len(PL.FAMILY_COLORS) + len(PL.SPARE_COLORS)
    styles = PL.curve_styles(curves)
    looks = [(s["color"], s["ls"], s["marker"]) for s in styles]
    assert len(set(looks)) == len(looks)  # no two curves alike
    spare = [mcolors.to_hex(s["color"]) for s in styles[len(known) :]]
    assert len(set(spare)) == len(spare)  # each unknown family a colour of its own
    assert not set(spare) & {mcolors.to_hex(c) for c in PL.FAMILY_COLORS.values()}  # none a known family's
    PL.plot_curves(curves, "x.png", title="t", xlabel="length", ylabel="y")
    fig = figures[0]
    fig.canvas.draw()
    legend = fig.axes[0].get_legend()
    assert len(legend.get_texts()) == len(curves)
    box = legend.get_window_extent()
    assert box.y0 >= 0 and box.y1 <= fig.bbox.height + 1  # the legend's columns fit the figure's height


def test_a_legend_of_long_wrapped_labels_fits_the_figure(figures):
    """Tune trials' labels wrap over 2-3 lines each: the legend's height counts lines, not entries."""
    label = "longrope(attention_factor=0.9449,factor=8,long_factor=16xa2538801,short_factor=16xebd5d1ff,start={})"
    curves = [PL.Curve(label.format(i), "longrope", [128, 1024], [1.0 + i, 2.0 + i]) for i in range(30)]
    PL.plot_curves(curves, "x.png", title="t", xlabel="length", ylabel="y")
    fig = figures[0]
    fig.canvas.draw()
    box = fig.axes[0].get_legend().get_window_extent()
    assert box.y0 >= 0 and box.y1 <= fig.bbox.height + 1  # (saved with a tight box, its columns widen the image)


def test_heatmap_panel_marks_failures_and_the_original_length(figures):
    grid = pd.DataFrame([[1.0, float("nan")], [0.5, float("nan")]], index=[0.0, 100.0], columns=[128, 256])
    status = pd.DataFrame([["ok", "oom"], ["ok", "missing"]], index=grid.index, columns=grid.columns)
    PL.plot_heatmaps([PL.HeatmapPanel("none", grid, status, 128)], "x.png", "title")
    texts = [t.get_text() for t in figures[0].axes[0].texts]
    assert texts == ["100%", "OOM", "50%", "—"]
    assert [line.get_xdata()[0] for line in figures[0].axes[0].lines] == [0.5]  # dashed: past 128


def luminance(color):
    """WCAG 2 relative luminance of a matplotlib colour."""
    channels = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in mcolors.to_rgb(color)]
    return 0.2126 * channels[0] + 0.7152 * channels[1] + 0.0722 * channels[2]


def contrast(a, b):
    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def heatmap_axes(figures, values, statuses=None):
    grid = pd.DataFrame([values], index=[50.0], columns=[64 * 2**i for i in range(len(values))])
    status = pd.DataFrame([statuses or ["ok"] * len(values)], index=grid.index, columns=grid.columns)
    PL.plot_heatmaps([PL.HeatmapPanel("m", grid, status, 128)], "x.png", "title")
    return figures[-1].axes[0]


def test_the_heatmap_scale_is_colour_blind_safe(figures):
    """Issue 39: needle, RULER and tune heatmaps were red-yellow-green, which a red-green colour-blind reader cannot
    order. The scale's lightness must rise from 0 to 1 (readable by lightness alone, in grey too)."""
    ax = heatmap_axes(figures, [0.0, 0.5, 1.0])
    cmap = ax.images[0].get_cmap()
    lightness = [luminance(cmap(x)) for x in [i / 64 for i in range(65)]]
    assert all(b > a for a, b in zip(lightness, lightness[1:])), cmap.name
    assert lightness[-1] - lightness[0] > 0.5  # dark to light, not a band of one lightness
    # the grey of a cell not measured is no colour of the scale
    bad = np.array(cmap.get_bad()[:3])
    assert min(np.linalg.norm(bad - np.array(cmap(i / 64)[:3])) for i in range(65)) > 0.15


def test_every_heatmap_cell_text_is_readable_on_its_cell(figures):
    """Issue 39: black text on every cell; on a dark cell it disappears. Every cell's text keeps WCAG's 4.5:1."""
    values = [0.0, 0.1, 0.25, 0.4, 0.5, 0.6, 0.75, 0.9, 1.0, float("nan"), float("nan")]
    ax = heatmap_axes(figures, values, ["ok"] * 9 + ["oom", "missing"])
    image = ax.images[0]
    cells = image.cmap(image.norm(np.ma.masked_invalid(values)))
    texts = ax.texts
    assert len(texts) == len(values)
    for text, cell in zip(texts, cells):
        ratio = contrast(text.get_color(), cell)
        assert ratio >= 4.5, (text.get_text(), text.get_color(), mcolors.to_hex(cell), round(ratio, 2))


def test_the_original_length_line_shows_on_dark_and_light_cells(figures):
    ax = heatmap_axes(figures, [1.0, 0.0, 0.0])
    (line,) = ax.lines
    strokes = [luminance(line.get_color())] + [
        luminance(effect._gc["foreground"]) for effect in line.get_path_effects() if "foreground" in effect._gc
    ]
    assert max(strokes) > 0.8 and min(strokes) < 0.05  # a light dash edged in black: seen on both ends of the scale


@pytest.mark.parametrize("methods, lengths, per_row", [(4, 4, 2), (7, 3, 2), (11, 4, 2), (2, 6, 1), (3, 2, 3)])
def test_a_grid_of_heatmaps_fits_the_html_column(tmp_path, methods, lengths, per_row):
    """Issue 39: the 4-method needle figure was 2,256 px wide and overflowed the HTML page at a 1400 px window.
    Panels now wrap into rows so the saved PNG fits the page's 1,264 px column at full size."""
    from matplotlib import image as mpimg

    columns = [128 * 2**i for i in range(lengths)]
    depths = [0.0, 25.0, 50.0, 75.0, 100.0]
    grid = pd.DataFrame([[0.5] * lengths] * len(depths), index=depths, columns=columns)
    status = pd.DataFrame("ok", index=grid.index, columns=grid.columns)
    panels = [PL.HeatmapPanel(f"yarn(factor={2**i})", grid, status, 128) for i in range(methods)]
    path = PL.plot_heatmaps(panels, tmp_path / "h.png", "Needle in a haystack · tiny: accuracy by depth and length")
    width = mpimg.imread(path).shape[1]
    assert width <= PL.PAGE_WIDTH_PX, width
    assert PL.heatmap_columns(methods, max(3.0, 0.8 * lengths + 1.2)) == per_row  # as many a row as fit
    assert width > 0.6 * PL.PAGE_WIDTH_PX or per_row == methods  # a row is not left half empty


def test_percent_curves_put_the_threshold_on_the_axis_unit(figures):
    """Issue 39: the passkey plot's y axis ran 0-1 while its threshold said 80%: both in percent now."""
    curves = [PL.Curve("none", "none", [1024, 2048, 4096], [1.0, 0.6, 0.8])]
    PL.plot_curves(
        curves, "x.png", title="t", xlabel="length", ylabel="accuracy", threshold=0.8, y_percent=True, originals=None
    )
    ax = figures[0].axes[0]
    drawn = {line.get_label(): list(line.get_ydata()) for line in ax.lines}
    assert drawn["none"] == [100.0, 60.0, 80.0]
    assert drawn["threshold 80%"] == [80.0, 80.0]
    low, high = ax.get_ylim()
    assert low <= 0 and 100 <= high <= 110
    figures[0].canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert labels and all(label.endswith("%") for label in labels) and "100%" in labels


def test_close_length_ticks_stagger_their_labels_instead_of_printing_over_each_other():
    """112 and 128 tokens are 0.19 octaves apart: their labels overlapped ('112128'); the second goes a line lower.
    Octave-spaced lengths keep one line."""
    import matplotlib.pyplot as plt

    from ctxeval.report.plots import length_axis

    fig, ax = plt.subplots()
    length_axis(ax, [128, 112, 256, 512, 1024, 1100, 1200])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["112", "\n128", "256", "512", "1k", "\n1100", "1200"]
    length_axis(ax, [64, 128, 256])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["64", "128", "256"]
    plt.close(fig)
