"""Every figure ctxeval draws, for a run's own directory and for `ctxeval report` alike: curves against the
context length (perplexity, attention entropy, passkey accuracy), needle heatmaps, and the per-pair frequency plan.

Readability rules, applied in one place: length axes are log2 with a labelled tick at every evaluated length; a
log y axis carries numbers at readable values (1-2-5 steps, finer when the data span less than a decade); every
series differs from every other (hue by method family; shade, line style and marker by parameters or model); a
series identical to another is drawn once and its legend entry names both; titles wrap between words or list items,
never inside a word; the legend moves outside the axes past four entries; original lengths are marked with black
vertical lines. Heatmaps use a colour-blind-safe scale whose lightness rises with the score (viridis), each cell's
text black or white by the cell's luminance, and wrap into rows so that a grid fits the HTML report's column.
"""

from __future__ import annotations

import colorsys
import itertools
import math
import re
import warnings
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import matplotlib

matplotlib.use("Agg")  # files only; never open a window
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib import colors as mcolors  # noqa: E402
from matplotlib import patheffects, ticker  # noqa: E402

from ..errors import CtxevalError  # noqa: E402
from ..runs.rows import fmt_length, status_label  # noqa: E402
from ..util.textfiles import atomic_path  # noqa: E402
from .tables import Table  # noqa: E402

# one colour per method family, the same in every figure; unknown families take the remaining colours in order
FAMILY_COLORS = {
    "none": "tab:blue",
    "native": "tab:brown",
    "pi": "tab:orange",
    "linear": "tab:orange",
    "ntk": "tab:green",
    "dynamic-ntk": "tab:olive",
    "ntk-by-parts": "tab:cyan",
    "yarn": "tab:red",
    "dynamic-yarn": "tab:pink",
    "llama3": "tab:purple",
    "longrope": "#1b9e77",
    # attention methods (on plain RoPE; on a frequency method they take its colour and another style)
    "self-extend": "#e7298a",
    "rerope": "black",
    "leaky-rerope": "#000080",
    "logn": "#666666",
    # position encodings, when a figure compares models that differ in it (their unmodified curves)
    "RoPE": "tab:blue",
    "NoPE": "#7570b3",
    "ALiBi": "#d95f02",
    "learned": "#66a61e",
    "sinusoidal": "#a6761d",
}
SPARE_COLORS = ["tab:gray", "#7570b3", "#e7298a", "#66a61e", "#d95f02", "#1a1a80"]
# the variants of one family (other factors or parameters, other models): a shade of its hue, and line style x marker
SHADE_LIGHTNESS = (0.27, 0.70)  # HLS lightness of the darkest and the lightest variant of a family
SHADE_STEP = 0.16  # lightness between neighbouring shades when few variants leave room
VARIANT_STYLES = [
    ("-", "o"),
    ("--", "s"),
    (":", "^"),
    ("-.", "D"),
    ("-", "v"),
    ("--", "P"),
    (":", "X"),
    ("-.", "*"),
    ("-", "h"),
    ("--", "<"),
]
LEGEND_INSIDE_MAX = 4  # legend entries (curves and marker lines) that fit inside the axes
LEGEND_COLUMN_LINES = 26  # legend lines (fontsize 7, with the space between entries) a 5-inch figure holds
LEGEND_WIDTH = 56  # characters of a legend entry's line (a longer one wraps, as titles do, not widening the figure)
CLOSE_TICKS_LOG2 = 0.4  # length ticks nearer than this (in octaves) would print their labels over each other
DPI = 120  # every figure's resolution: inches x 120 = pixels in the PNG
# Heatmap scale: viridis is perceptually uniform and its lightness rises monotonically from 0 (dark blue-violet) to 1
# (light yellow), so its order reads without telling red from green (and in grey print); it holds no grey, so the
# light grey of a cell that was not measured is never taken for a score.
HEATMAP_CMAP = "viridis"
NOT_MEASURED_COLOR = "#dddddd"
# the HTML report's column is 1,264 px (report.css: main 1320 px less 2 x 28 px padding): a grid of heatmaps wraps
# into rows to stay within it, so that the page shows it at full size without scrolling sideways
PAGE_WIDTH_PX = 1264
PAGE_WIDTH_IN = (PAGE_WIDTH_PX - 24) / DPI  # figure width, less a margin for savefig's tight bounding box


@dataclass(frozen=True)
class Curve:
    """One series against the context length."""

    label: str  # legend text
    family: str  # method name: decides the colour
    xs: list[float]  # context lengths (a depth figure: depths, %)
    ys: list[float]
    reference: bool = False  # a reference line (uniform attention): grey, dashed, no markers


@dataclass(frozen=True)
class HeatmapPanel:
    """One grid of scores in [0, 1]: rows = needle depth % (or `row_labels`), columns = context length."""

    title: str
    grid: Any  # DataFrame of accuracies (NaN where nothing was measured)
    status: Any  # DataFrame of statuses (ok / oom / skipped / missing), same shape
    original_length: int | None = None
    row_labels: list[str] | None = None  # default: the index as depth percentages


def method_family(label: str) -> str:
    """'yarn(factor=4)' -> 'yarn'."""
    return str(label).split("(", 1)[0].strip()


def _title_pieces(line: str, width: int) -> list[tuple[str, str]]:
    """(separator, text) pieces a title line may break between: words, the items of a comma list, and in a word
    longer than a whole line also the parts of an identifier (after `_`, `-`, `/`, `.`)."""
    pieces: list[tuple[str, str]] = []
    for word in line.split(" "):
        sep = " "
        for item in re.split(r"(?<=,)(?=.)", word):
            parts = re.split(r"(?<=[_\-/.])(?=.)", item) if len(item) > width else [item]
            for part in parts:
                pieces.append((sep, part))
                sep = ""
    return pieces


def wrap_title(title: str, width: int = 110) -> str:
    """Each line of a title folded at `width` characters, so that a long protocol line cannot widen the figure:
    between words, after a comma of a list, or (in a word longer than a line) after `_`, `-`, `/` or `.`; never
    inside a word. A word with none of these longer than `width` keeps its own line."""
    out = []
    for line in title.split("\n"):
        current = ""
        for sep, text in _title_pieces(line, width):
            if current and len(current) + len(sep) + len(text) > width:
                out.append(current.rstrip())
                current = text
            else:
                current += (sep if current else "") + text
        out.append(current.rstrip())
    return "\n".join(out)


def save(fig: Any, path: Path, tight: bool = True) -> Path:
    path = Path(path)
    kind = path.suffix.lstrip(".").lower() or "png"
    if kind not in fig.canvas.get_supported_filetypes():
        plt.close(fig)
        raise CtxevalError(
            f"cannot write figure {path}: '.{kind}' is not an image format matplotlib writes; use .png, .svg or .pdf"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if tight:
            with warnings.catch_warnings():  # a legend of many columns beside the axes: bbox_inches below fits it
                warnings.filterwarnings("ignore", "Tight layout not applied", UserWarning)
                fig.tight_layout()
        with atomic_path(path, "figure") as tmp:  # a crash leaves the old figure or the new one, never half of one
            fig.savefig(tmp, dpi=DPI, bbox_inches="tight", format=kind)
    except OSError as exc:
        raise CtxevalError(
            f"cannot write figure {path} ({exc.strerror or type(exc).__name__}); choose another path"
        ) from None
    finally:
        plt.close(fig)
    return path


def family_shades(color: Any, n: int) -> list[str]:
    """n shades of one hue, dark to light (the colour itself for n = 1): the variants of one method family."""
    if n <= 1:
        return [mcolors.to_hex(color)]
    hue, _, saturation = colorsys.rgb_to_hls(*mcolors.to_rgb(color))
    low, high = SHADE_LIGHTNESS
    step = min(SHADE_STEP, (high - low) / (n - 1))
    middle = (low + high) / 2
    return [mcolors.to_hex(colorsys.hls_to_rgb(hue, middle + (i - (n - 1) / 2) * step, saturation)) for i in range(n)]


def spare_colors(taken: set[str]) -> Iterator[str]:
    """Colours for families FAMILY_COLORS does not name, never running out: SPARE_COLORS not yet taken, then hues
    a golden angle apart (distinct from their neighbours however many are needed), each once."""
    for color in SPARE_COLORS:
        if mcolors.to_hex(color) not in taken:
            taken.add(mcolors.to_hex(color))
            yield color
    for k in itertools.count():
        hue = (0.11 + k * 0.381966) % 1.0  # the golden angle, as a fraction of the circle
        lightness = (0.38, 0.55, 0.30)[(k // 8) % 3]  # later rounds darker or lighter, so no two coincide
        color = mcolors.to_hex(colorsys.hls_to_rgb(hue, lightness, 0.75))
        if color not in taken:
            taken.add(color)
            yield color


def curve_styles(curves: Sequence[Curve]) -> list[dict[str, Any]]:
    """Matplotlib styles: the hue says the family (FAMILY_COLORS, the same in every figure); the family's n-th
    variant gets the n-th shade of it and the n-th (line style, marker). No two measured curves share a
    (colour, line style, marker)."""
    counts = Counter(c.family for c in curves if not c.reference)
    colors = {family: FAMILY_COLORS[family] for family in counts if family in FAMILY_COLORS}
    spare = spare_colors(set(map(mcolors.to_hex, colors.values())))
    for family in counts:
        colors.setdefault(family, next(spare))
    shades = {family: family_shades(colors[family], n) for family, n in counts.items()}
    variants: Counter[str] = Counter()
    seen: set[tuple[str, str, str]] = set()
    styles = []
    for curve in curves:
        if curve.reference:
            styles.append({"color": "grey", "ls": "--", "lw": 1.2, "marker": None})
            continue
        n = variants[curve.family]
        variants[curve.family] += 1
        color = shades[curve.family][n]
        free = (
            k
            for k in range(n, n + len(VARIANT_STYLES))  # another family may have the same colour (greys)
            if (color, *VARIANT_STYLES[k % len(VARIANT_STYLES)]) not in seen
        )
        ls, marker = VARIANT_STYLES[next(free, n) % len(VARIANT_STYLES)]
        seen.add((color, ls, marker))
        styles.append({"color": color, "ls": ls, "marker": marker, "ms": 4.5, "lw": 1.5})
    return styles


def same_points(a: Curve, b: Curve) -> bool:
    """Two curves with the same lengths and the same values (to float rounding): one would hide the other."""
    return list(a.xs) == list(b.xs) and all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12) for x, y in zip(a.ys, b.ys))


def merge_identical(curves: Sequence[Curve]) -> list[tuple[int, str]]:
    """(index, legend text) of the curves to draw: a curve identical to an earlier one is not drawn again; the earlier
    one's legend says `label (= other, ...)` instead, so no series disappears under another unnoticed."""
    twins: dict[int, list[str]] = {}
    drawn: list[int] = []
    for i, curve in enumerate(curves):
        first = next(
            (j for j in drawn if not curve.reference and not curves[j].reference and same_points(curves[j], curve)),
            None,
        )
        if first is None:
            drawn.append(i)
        else:
            twins.setdefault(first, []).append(curve.label)
    return [(i, curves[i].label + (f" (= {', '.join(twins[i])})" if i in twins else "")) for i in drawn]


def length_axis(ax: Any, lengths: Sequence[int]) -> None:
    """log2 x axis with one labelled tick per evaluated length (1k = 1024)."""
    lengths = sorted(set(int(x) for x in lengths))
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths)
    labels, previous_low = [], None  # a label close to the one before it (112 and 128) goes a line lower
    for x, before in zip(lengths, [None, *lengths[:-1]]):
        low = bool(before) and np.log2(x / before) < CLOSE_TICKS_LOG2 and not previous_low  # 0: no log distance
        labels.append(("\n" if low else "") + fmt_length(x))
        previous_low = low
    ax.set_xticklabels(labels)
    ax.xaxis.set_minor_locator(ticker.NullLocator())


def log_ticks(low: float, high: float) -> list[float]:
    """Readable tick values for a log axis over [low, high]: at least three, from the coarsest of the mantissa sets
    1 / 1-2-5 / 1-1.5-2-3-5-7 / 1-1.2-1.5-...-9 that gives at least four (else three); round, evenly spaced values
    for a range narrower than that."""
    mantissas = [(1,), (1, 2, 5), (1, 1.5, 2, 3, 5, 7), (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9)]
    decades = range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1)
    candidates = [[m * 10.0**e for e in decades for m in mants if low <= m * 10.0**e <= high] for mants in mantissas]
    for wanted in (4, 3):
        for ticks in candidates:
            if len(ticks) >= wanted:
                return ticks
    # a range narrower than 1-1.2 (ppl 1.01 to 1.09): evenly spaced round values, as on a linear axis
    steps = ticker.MaxNLocator(nbins=4, steps=[1, 2, 5, 10]).tick_values(low, high)
    return [float(t) for t in steps if low <= t <= high]


def _tick_text(value: float, _pos: Any = None) -> str:
    return f"{value:,.0f}" if value >= 1000 else f"{value:g}"


def readable_log_y(ax: Any) -> None:
    """Numbers on a log y axis at readable values within its current limits (no unlabelled decades)."""
    low, high = ax.get_ylim()
    ax.yaxis.set_major_locator(ticker.FixedLocator(log_ticks(low, high)))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(_tick_text))
    ax.yaxis.set_minor_locator(ticker.NullLocator())
    ax.set_ylim(low, high)


def plot_curves(
    curves: Sequence[Curve],
    path: Path,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    originals: dict[int, str] | None = None,
    log_y: bool = False,
    threshold: float | None = None,
    threshold_label: str | None = None,
    ylim: tuple[float, float] | None = None,
    x_ticks: Sequence[int] | None = None,
    y_percent: bool = False,
) -> Path:
    """Curves against the context length on one figure. `originals`: original length -> legend text (marked with
    black vertical lines); `threshold`: a grey horizontal line (accuracy figures); `x_ticks`: the labelled x
    positions when the points do not sit on them (loss-by-position buckets, drawn at their centres); `y_percent`:
    the values and the threshold are fractions, drawn on a 0-100% axis (both in the same unit)."""
    if y_percent:
        curves = [replace(c, ys=[100.0 * y for y in c.ys]) for c in curves]
        threshold_label = threshold_label or (f"threshold {threshold:.0%}" if threshold is not None else None)
        threshold = 100.0 * threshold if threshold is not None else None
        ylim = ylim or (-5.0, 105.0)
    measured = [c for c in curves if c.xs]
    styles = curve_styles(measured)
    drawn = merge_identical(measured)
    entries = len(drawn) + len(originals or {}) + (threshold is not None)
    legend_outside = entries > LEGEND_INSIDE_MAX
    lines = sum(wrap_title(label, LEGEND_WIDTH).count("\n") + 1 for _, label in drawn) + entries - len(drawn)
    legend_columns = math.ceil(lines / LEGEND_COLUMN_LINES)  # a column taller than the axes would be cut off
    fig, ax = plt.subplots(figsize=(10.5 if legend_outside else 8, 5))  # saved tight: the columns widen the image
    for i, label in drawn:
        ax.plot(measured[i].xs, measured[i].ys, label=wrap_title(label, LEGEND_WIDTH), **styles[i])
    lengths = sorted({x for c in measured for x in c.xs})
    if x_ticks:
        lengths = sorted(set(x_ticks))
    for i, (L, text) in enumerate(sorted((originals or {}).items())):
        if lengths and min(lengths) <= L <= max(lengths):
            ax.axvline(L, color="black", ls=[":", "--", "-."][i % 3], lw=1, label=text)
    if threshold is not None:
        ax.axhline(threshold, color="grey", lw=1, ls="--", label=threshold_label or f"threshold {threshold:.0%}")
    if ylim is not None:
        ax.set_ylim(*ylim)
    if y_percent:
        ax.yaxis.set_major_locator(ticker.MultipleLocator(20))
        ax.yaxis.set_major_formatter(ticker.PercentFormatter(xmax=100, decimals=0))
    if log_y:
        ax.set_yscale("log")
        readable_log_y(ax)
    length_axis(ax, lengths)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel + (" (log scale)" if log_y else ""))
    ax.set_title(wrap_title(title), fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    if legend_outside:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, ncols=legend_columns)
    else:
        ax.legend(fontsize=8, loc="best")
    return save(fig, path)


def relative_luminance(color: Any) -> float:
    """WCAG 2's relative luminance of a colour (0 black, 1 white)."""
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in mcolors.to_rgb(color)]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def text_color(background: Any) -> str:
    """Black or white, whichever contrasts more with `background` (WCAG's contrast ratio)."""
    luminance = relative_luminance(background)
    return "black" if (luminance + 0.05) / 0.05 >= 1.05 / (luminance + 0.05) else "white"


def paint_heatmap(ax: Any, panel: HeatmapPanel, fontsize: int = 8) -> Any:
    """One accuracy grid on `ax` (viridis: dark at 0, light at 1; values printed in black or white, whichever reads on
    the cell; a dashed line where the lengths pass the original length). Returns the image for a colour bar."""
    values = panel.grid.to_numpy(dtype=float)
    cmap = matplotlib.colormaps[HEATMAP_CMAP].with_extremes(bad=NOT_MEASURED_COLOR)
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=0, vmax=1, aspect="auto")
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            v = values[i, j]
            text = f"{v:.0%}" if not math.isnan(v) else status_label(str(panel.status.iat[i, j]))
            cell = cmap(image.norm(v)) if not math.isnan(v) else NOT_MEASURED_COLOR
            ax.text(j, i, text, ha="center", va="center", fontsize=fontsize, color=text_color(cell))
    ax.set_xticks(range(values.shape[1]))
    ax.set_xticklabels([fmt_length(int(c)) for c in panel.grid.columns], fontsize=fontsize)
    ax.set_yticks(range(values.shape[0]))
    ax.set_yticklabels(panel.row_labels or [f"{d:g}%" for d in panel.grid.index], fontsize=fontsize)
    L = panel.original_length
    past = [j for j, c in enumerate(panel.grid.columns) if L is not None and c > L]
    if past:  # a white dash edged in black: seen on the dark and the light end of the scale
        ax.axvline(
            past[0] - 0.5,
            color="white",
            lw=1.5,
            ls="--",
            path_effects=[patheffects.withStroke(linewidth=3, foreground="black")],
        )
    if panel.title:
        ax.set_title(panel.title, fontsize=9)
    ax.set_xlabel("context length", fontsize=fontsize)
    return image


def heatmap_columns(n: int, panel_width: float) -> int:
    """Panels a row: at most four, and no more than fit the HTML report's column (at least one)."""
    return max(1, min(n, 4, int((PAGE_WIDTH_IN - 1.2) // panel_width)))


def plot_heatmaps(
    panels: Sequence[HeatmapPanel],
    path: Path,
    title: str,
    row_title: str = "needle depth",
    scale_label: str = "accuracy",
) -> Path:
    """Heatmaps on shared depth axes and one colour scale, side by side as many as fit the HTML report's column (at
    most four), in rows."""
    n = len(panels)
    first = panels[0].grid
    width = max(3.0, 0.8 * first.shape[1] + 1.2)
    height = max(2.2, 0.35 * first.shape[0] + 1.4)
    ncols = heatmap_columns(n, width)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(width * ncols + 1.2, height * nrows + 0.8),
        squeeze=False,
        sharey=True,
        layout="constrained",
    )
    image = None
    for ax, panel in zip(axes.ravel(), panels):
        image = paint_heatmap(ax, panel)
    for ax in axes[:, 0]:
        ax.set_ylabel(row_title, fontsize=8)
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    if image is not None:
        bar = fig.colorbar(image, ax=axes.ravel().tolist(), fraction=0.046, pad=0.02, label=scale_label)
        bar.ax.yaxis.set_major_formatter(ticker.PercentFormatter(xmax=1.0))  # the cells are labelled in % too
    fig.suptitle(wrap_title(title, max(60, int(13 * fig.get_figwidth()))), fontsize=9)  # 9 pt: ~13 characters an inch
    return save(fig, path, tight=False)


def depth_curves(table: Table, name: Callable[[str, str], str]) -> list[tuple[int, list[Curve]]]:
    """A RULER depth table (rows = model, method, length; columns = depths) as (length, curves): per length one
    curve per (model, method), its score (%) at each depth it has; `name(model, method)` is the legend text."""
    by_length: dict[int, list[Curve]] = {}
    for row in table.rows:
        points = [(x, float(v)) for x, v in zip(table.depths, row[3:]) if v is not None]
        curve = Curve(name(row[0], row[1]), method_family(row[1]), [p[0] for p in points], [p[1] for p in points])
        by_length.setdefault(int(row[2]), []).append(curve)
    return sorted(by_length.items())


def depth_panels(table: Table, name: Callable[[str, str], str], originals: dict[str, int]) -> list[HeatmapPanel]:
    """A RULER depth table as one heatmap per (model, method): rows = depth, columns = length, the score in [0, 1]
    (NaN where not measured, its status beside it); `originals`: model -> original length (the dashed line)."""
    cells: dict[tuple[str, str], dict[int, tuple[list, list]]] = {}
    for row, sts in zip(table.rows, table.status):
        values = [np.nan if v is None else float(v) / 100 for v in row[3:]]
        cells.setdefault((row[0], row[1]), {})[int(row[2])] = (values, [s or "ok" for s in sts[3:]])
    lengths = sorted({int(row[2]) for row in table.rows})
    labels = table.headers[3:]
    panels = []
    for (model, label), at in cells.items():
        grid = pd.DataFrame({L: at[L][0] if L in at else [np.nan] * len(labels) for L in lengths}, index=table.depths)
        status = pd.DataFrame(
            {L: at[L][1] if L in at else ["missing"] * len(labels) for L in lengths}, index=table.depths
        )
        panels.append(HeatmapPanel(name(model, label), grid, status, originals.get(model), row_labels=labels))
    return panels


def depth_axes(ax: Any, depths: Sequence[float], labels: Sequence[str]) -> None:
    """The x axis of depth 0-100% with a tick at each column's depth, and a 0-100% y axis of scores."""
    ax.set_xlim(-4, 104)
    ax.set_xticks(list(depths))
    ax.set_xticklabels(list(labels), fontsize=8)
    ax.set_ylim(-4, 104)
    ax.yaxis.set_major_locator(ticker.MultipleLocator(20))
    ax.yaxis.set_major_formatter(ticker.PercentFormatter(xmax=100, decimals=0))
    ax.grid(True, alpha=0.3)


def depth_panel(ax: Any, length: int, curves: Sequence[Curve], style: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One length's curves on `ax`; a curve identical to an earlier one is drawn once and the panel's title names
    them (`same scores: none = dynamic-ntk`). Returns legend text -> line."""
    measured = [c for c in curves if c.xs]
    lines, same = {}, []
    for i, text in merge_identical(measured):
        (lines[measured[i].label],) = ax.plot(measured[i].xs, measured[i].ys, **style[measured[i].label])
        if text != measured[i].label:
            same.append(f"{measured[i].label} = {text[len(measured[i].label) + 4 : -1]}")
    note = "\n" + wrap_title("same scores: " + "; ".join(same), 48) if same else ""
    ax.set_title(f"context length {fmt_length(length)}{note}", fontsize=8)
    ax.set_xlabel("depth of the answer (0% = at the start)", fontsize=8)
    return lines


def plot_depth_curves(
    table: Table, name: Callable[[str, str], str], path: Path, title: str, ylabel: str = "score"
) -> Path:
    """Score against the answer's depth, as Liu et al. 2023's figure 1 (accuracy by the gold document's position):
    one panel per length (three a row, within the HTML report's column), one line per method in plot_curves' styles
    (the same in every panel), a depth that failed or was not measured left out of its line, the legend once, under
    the panels."""
    panels = depth_curves(table, name)
    everyone = list({c.label: c for _, curves in panels for c in curves}.values())
    style = dict(zip([c.label for c in everyone], curve_styles(everyone)))
    ncols = min(len(panels), 3)
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(3.2 * ncols + 0.6, 2.9 * nrows + 1.2), squeeze=False, sharey=True, layout="constrained"
    )
    legend: dict[str, Any] = {}
    for ax, (length, curves) in zip(axes.ravel(), panels):
        for label, line in depth_panel(ax, length, curves, style).items():
            legend.setdefault(label, line)
        depth_axes(ax, table.depths, table.headers[3:])
    for ax in axes[:, 0]:
        ax.set_ylabel(f"{ylabel} (%)")
    for ax in axes.ravel()[len(panels) :]:
        ax.set_visible(False)
    texts = [wrap_title(label, LEGEND_WIDTH) for label in legend]
    fig.legend(list(legend.values()), texts, fontsize=7, loc="outside lower center", ncols=min(len(texts), 3))
    fig.suptitle(wrap_title(title, max(60, int(13 * fig.get_figwidth()))), fontsize=9)
    return save(fig, path, tight=False)


def plot_plan(rows: Sequence[Any], title: str, original_length: int, path: Path) -> Path:
    """Scale theta_i / theta'_i per pair against its original wavelength; L marked, groups coloured."""
    colors = {"extrapolated": "tab:green", "blended": "tab:orange", "interpolated": "tab:red"}
    fig, ax = plt.subplots(figsize=(7, 4))
    for group, color in colors.items():
        pts = [r for r in rows if r.group == group]
        if pts:
            ax.scatter([r.wavelength for r in pts], [r.scale for r in pts], s=14, color=color, label=group)
    ax.plot([r.wavelength for r in rows], [r.scale for r in rows], color="grey", lw=0.6, zorder=0)
    ax.axvline(original_length, color="black", ls="--", lw=1, label=f"L = {original_length}")
    ax.set_xscale("log")
    ax.set_xlabel("original wavelength 2π/θ_i (tokens)")
    ax.set_ylabel("scale θ_i / θ'_i")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return save(fig, path)


def plot_relative_positions(
    distance: Sequence[float], curves: dict[str, Sequence[float]], title: str, original_length: int, path: Path
) -> Path:
    """The relative position each attention method scores a pair at, against the pair's true distance; the
    trained length marked (positions above it were never seen in training)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(distance, distance, color="grey", ls=":", lw=1, label="true distance (plain RoPE)")
    for (label, ys), color in zip(curves.items(), ["tab:red", "tab:blue", "tab:green", "tab:purple"]):
        ax.plot(distance, ys, color=color, lw=1.6, label=label)
    ax.axhline(original_length, color="black", ls="--", lw=1, label=f"trained length L = {original_length:,}")
    ax.set_xlabel("true distance i - j (tokens)")
    ax.set_ylabel("relative position scored")
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: fmt_length(int(v))))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: fmt_length(int(v))))
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    return save(fig, path)
