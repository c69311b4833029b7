"""A tune run's figures, drawn with plots.py's conventions (its colours per method family, readable log ticks,
wrapped titles, atomic saves): the objective by trial, the winner's per-pair scales against PI, NTK and YaRN, and
the trials' perplexity at the trained length against the target with the Pareto front."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import matplotlib.pyplot as plt  # noqa: E402 - after plots.py chose the file-only backend
from matplotlib import ticker  # noqa: E402

from ...runs.rows import fmt_length
from ..plots import FAMILY_COLORS, LEGEND_WIDTH, log_ticks, method_family, readable_log_y, save, wrap_title

# trial kinds: the same colour and marker in every tune figure
FEASIBLE = {"color": "tab:blue", "marker": "o", "s": 22}
INFEASIBLE = {"color": "tab:orange", "marker": "x", "s": 22}
BEST_COLOR = "tab:green"
FRONT_COLOR = "tab:purple"
WINNER = {"marker": "*", "s": 260, "color": "gold", "edgecolors": "black", "linewidths": 1.0, "zorder": 5}
TUNED_COLOR = "black"  # the tuned winner among the method families' colours (none of which is black here)


@dataclass(frozen=True)
class TrialPoint:
    """One measured trial as the figures draw it."""

    trial: int
    ppl_target: float
    ppl_short: float
    feasible: bool


def tick_text(value: float, _pos: object = None) -> str:
    return f"{value:,.0f}" if value >= 1000 else f"{value:g}"


def readable_log_x(ax: plt.Axes) -> None:
    """Numbers on a log x axis at readable values (plots.readable_log_y's rule)."""
    low, high = ax.get_xlim()
    ax.xaxis.set_major_locator(ticker.FixedLocator(log_ticks(low, high)))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(tick_text))
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.set_xlim(low, high)


def log_y(ax: plt.Axes) -> None:
    ax.set_yscale("log")
    readable_log_y(ax)


def legend(ax: plt.Axes, entries: int) -> None:
    if entries > 4:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    else:
        ax.legend(fontsize=8, loc="best")


def plot_objective(
    points: Sequence[TrialPoint],
    best: Sequence[tuple[int, float]],
    winner: int | None,
    target: int,
    path: Path,
    title: str,
) -> Path:
    """Perplexity at the target by trial: trials that kept the guard and trials that did not, and the best feasible
    value so far (a step line); the winner starred."""
    fig, ax = plt.subplots(figsize=(9, 4.8))
    for feasible, style, name in ((True, FEASIBLE, "kept the guard"), (False, INFEASIBLE, "broke the guard")):
        mine = [p for p in points if p.feasible is feasible]
        if mine:
            ax.scatter([p.trial for p in mine], [p.ppl_target for p in mine], label=f"{name} ({len(mine)})", **style)
    if best:
        ax.step(
            [b[0] for b in best],
            [b[1] for b in best],
            where="post",
            color=BEST_COLOR,
            lw=1.8,
            label="best so far (kept the guard)",
        )
    chosen = [p for p in points if p.trial == winner]
    if chosen:
        ax.scatter([chosen[0].trial], [chosen[0].ppl_target], label=f"winner (trial {winner})", **WINNER)
    return save(by_trial_axes(ax, "trial", target, title, 4), path)


def plot_pair_scales(
    scales: dict[str, list[float]],
    winner: str,
    original_length: int,
    base: float,
    path: Path,
    title: str,
    factor: float | None = None,
) -> Path:
    """Per rotary pair the scale theta_i / theta'_i of the winner and the comparisons; the pair whose wavelength
    equals the trained length marked (pairs left of it turn more than once within it)."""
    fig, ax = plt.subplots(figsize=(10.5, 4.8))
    styles = ["--", "-.", ":", (0, (5, 1, 1, 1))]
    n = 0
    for label, values in scales.items():
        pairs = list(range(len(values)))
        if label == winner:  # wide and underneath: a comparison that coincides with it stays visible on top
            ax.plot(
                pairs,
                values,
                color=TUNED_COLOR,
                lw=3.2,
                marker="o",
                ms=5,
                zorder=2,
                label=wrap_title(f"tuned: {label}", LEGEND_WIDTH),
            )
            continue
        if label.startswith("tuned, "):  # the winner at another length (LongRoPE's short factors)
            ax.plot(pairs, values, color=TUNED_COLOR, lw=1.6, ls="--", marker="o", ms=3, zorder=3, label=label)
            continue
        ax.plot(
            pairs,
            values,
            color=FAMILY_COLORS.get(method_family(label), "tab:gray"),
            lw=1.5,
            zorder=3,
            ls=styles[n % len(styles)],
            marker="s",
            ms=3,
            label=wrap_title(label, LEGEND_WIDTH),
        )
        n += 1
    d = 2 * max(len(v) for v in scales.values())
    # wavelength 2 pi b^(2i/d) equals L at i = d/2 log_b(L / 2 pi)
    at = d / 2 * math.log(original_length / (2 * math.pi)) / math.log(base)
    if 0 <= at <= d / 2 - 1:
        ax.axvline(
            at, color="grey", ls=":", lw=1.2, label=f"wavelength 2π/θ_i = trained length {fmt_length(original_length)}"
        )
    log_y(ax)
    if factor is not None:  # the factor labelled too: where PI sits and where the interpolated pairs end up
        ticks = [t for t in ax.get_yticks() if abs(math.log(t / factor)) > math.log(1.15)]
        ax.yaxis.set_major_locator(ticker.FixedLocator(sorted([*ticks, factor])))
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.set_xlabel("rotary pair i (high frequency → low frequency)")
    ax.set_ylabel("scale θ_i / θ'_i (log scale)")
    ax.set_title(wrap_title(title), fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    legend(ax, len(scales) + 1)
    return save(fig, path)


def plot_pareto(
    points: Sequence[TrialPoint],
    front: Sequence[int],
    winner: int | None,
    guard: float | None,
    baseline: float | None,
    short: int,
    target: int,
    path: Path,
    title: str,
) -> Path:
    """Perplexity at the trained length against the target for every measured trial, the Pareto front (both
    minimised; a staircase through its points), the guard (a vertical line) and the winner starred."""
    fig, ax = plt.subplots(figsize=(10.5, 5))
    for feasible, style, name in ((True, FEASIBLE, "kept the guard"), (False, INFEASIBLE, "broke the guard")):
        mine = [p for p in points if p.feasible is feasible]
        if mine:
            ax.scatter(
                [p.ppl_short for p in mine], [p.ppl_target for p in mine], label=f"{name} ({len(mine)})", **style
            )
    if front:
        xs = [points[i].ppl_short for i in front]
        ys = [points[i].ppl_target for i in front]
        ax.plot(
            xs,
            ys,
            color=FRONT_COLOR,
            lw=1.5,
            drawstyle="steps-post",
            zorder=3,
            marker="o",
            ms=11,
            mfc="none",
            mec=FRONT_COLOR,
            label=f"Pareto front ({len(front)} trial{'s' if len(front) != 1 else ''})",
        )
    if baseline is not None:
        ax.axvline(baseline, color="grey", ls=":", lw=1.2, label=f"plain RoPE at {fmt_length(short)}: {baseline:.2f}")
    if guard is not None:
        ax.axvline(guard, color="black", ls="--", lw=1.2, label=f"guard: at most {guard:.2f}")
    chosen = [p for p in points if p.trial == winner]
    if chosen:
        ax.scatter([chosen[0].ppl_short], [chosen[0].ppl_target], label=f"winner (trial {winner})", **WINNER)
    ax.set_xscale("log")
    readable_log_x(ax)
    log_y(ax)
    ax.set_xlabel(f"perplexity at {fmt_length(short)} (trained length; tuning documents, log scale)")
    ax.set_ylabel(f"perplexity at {fmt_length(target)} (target; log scale)")
    ax.set_title(wrap_title(title), fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    legend(ax, 6)
    return save(fig, path)


def plot_families(curves: dict[str, Sequence[tuple[int, float]]], target: int, path: Path, title: str) -> Path:
    """Each searched method's best tuning perplexity so far (kept the guard) by its own measured trials."""
    fig, ax = plt.subplots(figsize=(9, 4.8))
    for i, (method, curve) in enumerate(curves.items()):
        if curve:
            ax.step([c[0] for c in curve], [c[1] for c in curve], where="post", lw=1.8, color=f"C{i}",
                    label=f"{method} (best {curve[-1][1]:.2f})")  # fmt: skip
        else:  # named in the legend all the same: a method missing from the figure would look unsearched
            ax.plot([], [], lw=1.8, ls=":", color=f"C{i}", label=f"{method} (no trial kept the guard)")
    return save(by_trial_axes(ax, "measured trials of the method", target, title, len(curves)), path)


def by_trial_axes(ax: plt.Axes, xlabel: str, target: int, title: str, entries: int) -> plt.Figure:
    """Perplexity at the target (log) by trial: axes, title, grid and legend; returns the figure."""
    log_y(ax)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"perplexity at {fmt_length(target)} (tuning documents, log scale)")
    ax.set_title(wrap_title(title), fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    legend(ax, entries)
    return ax.figure
