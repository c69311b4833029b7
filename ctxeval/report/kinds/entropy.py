"""The entropy kind: its protocol key (the corpus, BOS, the layers and heads averaged); one table of the mean
attention entropy by length with the uniform-attention bound as its last row; the entropy curves."""

from __future__ import annotations

import math
from typing import Any, Sequence

from ...runs.rows import MISSING, UNIFORM_LABEL, UNIFORM_MODEL, fmt_length, uniform_entropy
from ...runs.store import RunStore
from ...specs import MethodSpec
from ..figures import curve_figure
from ..kind import FigureSpace, Kind, Settings
from ..plots import plot_curves
from ..runs import Group, Run, corpus_key, row_order
from ..single import Printed, RunOutputs, frame_curves, save_csv, save_text
from ..tables import Table, entropy_tables, fmt_entropy, markdown, number


def protocol_key(run: Run, aggregate: str | None = None) -> dict[str, Any]:
    proto = run.record.get("protocol") or {}
    return {
        **corpus_key(run),
        "bos": run.spec.get("bos", proto.get("bos")),
        "layers": run.spec.get("layers", "all"),
        "heads": run.spec.get("heads", "all"),
    }


def tables(group: Group, rows: list[dict[str, Any]], settings: Settings) -> list[Table]:
    return [entropy_table(group, rows)]


def entropy_table(group: Group, rows: list[dict[str, Any]]) -> Table:
    """Rows = model x method, columns = length, value = the mean over documents of each point's entropy (itself the
    mean over layers, heads and query positions); a cell with a failed document shows the failure, as in ppl.
    The last row is the uniform-attention bound, which depends on the length only."""
    points: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for row in rows:
        points.setdefault((str(row["model"]), str(row["label"]), int(row["length"])), []).append(row)
    lengths = sorted({k[2] for k in points})
    pairs = row_order(group, rows)
    n_docs = len(group.key.get("documents") or [])
    raw, status, shown = [], [], []
    partial: list[str] = []
    for model, label in pairs:
        vals: list[float | None] = []
        sts: list[str | None] = []
        for length in lengths:
            mine = points.get((model, label, length), [])
            failed = [r for r in mine if r.get("status") != "ok"]
            if not mine or failed:
                vals.append(None)
                sts.append(str(failed[0].get("status")) if failed else "missing")
                continue
            vals.append(number(sum(float(r["entropy"]) for r in mine) / len(mine)))
            sts.append(None)
            if len(mine) < n_docs:
                partial.append(f"{fmt_length(length)} ({len(mine)} of {n_docs})")
        if partial:
            group.notes.append(
                f"{model} · {label}: averaged over fewer documents than the protocol's at "
                f"{', '.join(partial)}; the run did not measure the others"
            )
            partial = []
        raw.append([model, label, *vals])
        status.append([None, None, *sts])
        shown.append([model, label, *(fmt_entropy(v, s) for v, s in zip(vals, sts))])
    recorded = {
        int(r["length"]): float(r["uniform_entropy"])
        for r in rows
        if r.get("status") == "ok" and number(r.get("uniform_entropy")) is not None
    }
    bound = [recorded.get(L, uniform_entropy(L)) for L in lengths]
    raw.append([UNIFORM_MODEL, UNIFORM_LABEL, *bound])
    status.append([None, None, *([None] * len(lengths))])
    shown.append([UNIFORM_MODEL, UNIFORM_LABEL, *(fmt_entropy(v) for v in bound)])
    originals = ", ".join(f"{m} {fmt_length(L)}" for m, L in group.original_lengths.items())
    caption = (
        f"Mean attention entropy in nats (over layers, heads, query positions and {n_docs} document(s)); "
        f"original length: {originals}. Last row: the entropy if every query attended evenly to the keys it "
        "sees, mean ln(i+1), the upper bound; it depends on the length only, the same for every model and "
        "method."
    )
    return Table(
        group.id,
        "entropy",
        group.title,
        ["model", "method", *map(str, lengths)],
        ["model", "method", *map(fmt_length, lengths)],
        raw,
        status,
        shown,
        caption=caption,
    )


def figures(group: Group, space: FigureSpace) -> dict[str, str]:
    """Every model x method's entropy curve on one figure, the uniform bound dashed grey."""
    return curve_figure(
        group, space, "attention entropy by length", "context length (tokens)", "mean attention entropy (nats)"
    )


def render_entropy(store: RunStore, specs: Sequence[MethodSpec], original_length: int, title: str) -> RunOutputs:
    """table.md / entropy.csv / entropy-layers.csv / entropy.png in the run directory."""
    wide, layers = entropy_tables(store.rows(), [s.label for s in specs])
    if wide.empty:
        return RunOutputs(notes=["no entropy was measured (every point failed); see rows.jsonl"])

    def cell(value: float) -> str:
        return MISSING if math.isnan(value) else f"{value:.3f}"

    headers = ["method", *[fmt_length(int(c)) for c in wide.columns]]
    rows = [[str(label), *[cell(v) for v in series]] for label, series in wide.iterrows()]
    lheaders = ["method", "layer", *[fmt_length(int(c)) for c in layers.columns]]
    lrows = [[str(i[0]), str(i[1]), *[cell(v) for v in series]] for i, series in layers.iterrows()]
    caption = (
        f"Mean attention entropy in nats (over layers, heads, query positions and documents); original length "
        f"{original_length}. 'uniform' = mean ln(i+1), the entropy if every query attended evenly."
    )
    save_text(
        store.dir / "table.md",
        f"# {title}\n\n{caption}\n\n" + markdown(headers, rows) + "\n## Per layer\n\n" + markdown(lheaders, lrows),
    )
    save_csv(wide.rename_axis("method"), store.dir / "entropy.csv", float_format="%.6g")
    save_csv(layers, store.dir / "entropy-layers.csv", float_format="%.6g")
    plot_curves(
        frame_curves(wide),
        store.dir / "entropy.png",
        title=title,
        xlabel="context length (tokens)",
        ylabel="mean attention entropy (nats)",
        originals={original_length: f"original length {fmt_length(original_length)}"},
    )
    return RunOutputs(
        [Printed(title, caption, headers, rows)],
        f"wrote {store.dir}/table.md, entropy.csv, entropy-layers.csv, entropy.png",
    )


KIND = Kind("entropy", "Attention entropy", protocol_key, tables, figures)
