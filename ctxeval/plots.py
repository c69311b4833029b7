"""matplotlib figures: frequency plan, perplexity vs. length, needle heatmaps."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")  # files only; never open a window
import matplotlib.pyplot as plt  # noqa: E402


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


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
    return _save(fig, path)


def plot_ppl(wide: Any, original_length: int, title: str, path: Path) -> Path:
    """Perplexity vs. evaluation length, one line per method; log y axis, the original length marked."""
    import math

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, series in wide.iterrows():
        pts = [(c, v) for c, v in series.items() if not (isinstance(v, float) and math.isnan(v))]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=4, label=str(label))
    ax.axvline(original_length, color="black", ls="--", lw=1, label=f"original length {original_length}")
    ax.set_yscale("log")
    _finish_length_axes(ax, list(wide.columns), "evaluation length (tokens)", "perplexity (log scale)", title)
    return _save(fig, path)


def _finish_length_axes(ax: Any, lengths: list[int], xlabel: str, ylabel: str, title: str) -> None:
    """log2 x axis with one tick per length (1k, 2k, ...), labels, title, grid, legend."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths)
    ax.set_xticklabels([f"{c // 1024}k" if c % 1024 == 0 and c >= 1024 else str(c) for c in lengths])
    ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)


def plot_heatmap(grid: Any, status: Any, title: str, original_length: int | None, path: Path) -> Path:
    """Accuracy heatmap: depth on y, length on x, the original test's red-yellow-green scale, values printed."""
    import math

    import numpy as np

    values = grid.to_numpy(dtype=float)
    fig, ax = plt.subplots(figsize=(1.1 * values.shape[1] + 2.5, 0.45 * values.shape[0] + 1.8))
    masked = np.ma.masked_invalid(values)
    cmap = matplotlib.colormaps["RdYlGn"].with_extremes(bad="#dddddd")
    im = ax.imshow(masked, cmap=cmap, vmin=0, vmax=1, aspect="auto")
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            v = values[i, j]
            text = f"{v:.0%}" if not math.isnan(v) else {"oom": "OOM", "skipped": "skip"}.get(str(status.iat[i, j]), "—")
            ax.text(j, i, text, ha="center", va="center", fontsize=8)
    ax.set_xticks(range(values.shape[1]))
    ax.set_xticklabels([f"{c // 1024}k" if c % 1024 == 0 and c >= 1024 else str(c) for c in grid.columns])
    ax.set_yticks(range(values.shape[0]))
    ax.set_yticklabels([f"{d:g}%" for d in grid.index])
    past = [j for j, c in enumerate(grid.columns) if original_length is not None and c > original_length]
    if past:
        ax.axvline(past[0] - 0.5, color="black", lw=1.5, ls="--")
    ax.set_xlabel("context length" + (f" (dashed: original {original_length})" if past else ""))
    ax.set_ylabel("needle depth")
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="accuracy")
    return _save(fig, path)


def plot_entropy(wide: Any, original_length: int, title: str, path: Path) -> Path:
    """Mean attention entropy vs. length, one line per method; uniform attention dashed, the original length marked."""
    import math

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, series in wide.iterrows():
        pts = [(c, v) for c, v in series.items() if not (isinstance(v, float) and math.isnan(v))]
        if not pts:
            continue
        style = {"ls": "--", "color": "grey", "marker": None} if str(label).startswith("uniform") else {"marker": "o", "ms": 4}
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=str(label), **style)
    ax.axvline(original_length, color="black", ls=":", lw=1, label=f"original length {original_length}")
    _finish_length_axes(ax, list(wide.columns), "context length (tokens)", "mean attention entropy (nats)", title)
    return _save(fig, path)
