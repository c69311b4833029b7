"""A ppl run's own outputs, written into its run directory when it finishes: table.md (perplexity by length, LongPPL
over the key tokens, the valid lengths, the loss by position), table.csv, valid.csv, positions.csv, longppl.csv,
ppl.png and positions.png, by the same table functions and figures as the ppl kind of `ctxeval report`."""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from ...runs.rows import BEYOND_POSITIONS, MISSING, fmt_length
from ...runs.store import RunStore
from ...specs import MethodSpec
from ..plots import Curve, method_family, plot_curves
from ..single import Printed, RunOutputs, frame_curves, save_csv, save_text
from ..tables import (
    NOT_REACHED_NOTE,
    bucket_center,
    bucket_label,
    fmt_ppl,
    longppl_long,
    markdown,
    positions_long,
    ppl_cells,
    ppl_long,
    ppl_wide,
    status_wide,
    valid_cells,
    valid_lengths,
)

VALID_CAPTION = (
    "Both valid lengths go up from the reference length (the original length, or the longest evaluated "
    "length below it) and stop at the first length that fails. Own: ppl within the tolerance of the "
    "method's own ppl at the reference (how gracefully it degrades). Vs base: within the tolerance of "
    "the unmodified model's ppl there (`native`, else `none`): how far it goes without paying. " + NOT_REACHED_NOTE
)
POSITIONS_CAPTION = (
    "Perplexity of the tokens predicted from p tokens of context (bucket start <= p < stop), "
    "token-weighted over the documents, from each method's forward at its longest length (a "
    "length-dependent method: its forward at that length only)."
)
LONGPPL_CAPTION = (
    "LongPPL (Fang et al. 2025): perplexity over the key tokens only, the tokens the evaluator "
    "predicts much better with the long context; every method is scored on the same tokens. "
    "Over documents as PKU-ML/LongPPL aggregates them: exp(summed key-token NLL / key tokens), the "
    "key-token-weighted geometric mean of the documents' LongPPL."
)


def position_curves(pos: pd.DataFrame, multi_model: bool = False) -> tuple[list[Curve], list[int]]:
    """Loss-by-position rows -> one curve per (model, method) at the bucket centres, and the bucket edges as ticks."""
    curves, edges = [], set()
    one_length = pos["length"].nunique() == 1  # then the title says it, not every legend entry
    for (model, label), g in pos.groupby(["model", "label"], sort=False):
        g = g.sort_values("start")
        edges |= set(int(x) for x in g["start"]) | set(int(x) for x in g["stop"])
        name = f"{model} · {label}" if multi_model else str(label)
        at = "" if one_length else f" (at {fmt_length(int(g['length'].iloc[0]))})"
        curves.append(
            Curve(
                name + at,
                method_family(str(label)),
                [bucket_center(a, b) for a, b in zip(g["start"], g["stop"])],
                [float(v) for v in g["ppl"]],
            )
        )
    return curves, sorted(edges)


def position_tables(pos: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Rows = method, columns = position buckets (the ppl of each)."""
    buckets = sorted({(int(a), int(b)) for a, b in zip(pos["start"], pos["stop"])})
    headers = ["method", "at"] + [bucket_label(a, b) for a, b in buckets]
    rows = []
    for label, g in pos.groupby("label", sort=False):
        cell = {(int(a), int(b)): v for a, b, v in zip(g["start"], g["stop"], g["ppl"])}
        rows.append(
            [str(label), fmt_length(int(g["length"].iloc[0]))]
            + [fmt_ppl(cell[k]) if k in cell else MISSING for k in buckets]
        )
    return headers, rows


def render_positions(store: RunStore, original_length: int, title: str) -> tuple[list[Printed], str]:
    """positions.csv / positions.png and the markdown section; nothing when the rows carry no position sums."""
    pos = positions_long(store.rows())
    if pos.empty:
        return [], ""
    save_csv(pos.rename(columns={"label": "method"}), store.dir / "positions.csv", index=False, float_format="%.6g")
    curves, edges = position_curves(pos)
    at = f" (forwards of {fmt_length(int(pos['length'].iloc[0]))} tokens)" if pos["length"].nunique() == 1 else ""
    plot_curves(
        curves,
        store.dir / "positions.png",
        title=f"Loss by position: {title}{at}",
        xlabel="tokens of context the prediction had (bucket centres; ticks at bucket edges)",
        ylabel="perplexity of the bucket's tokens",
        originals={original_length: f"original length {fmt_length(original_length)}"},
        log_y=True,
        x_ticks=edges,
    )
    headers, rows = position_tables(pos)
    section = f"\n## Loss by position\n\n{POSITIONS_CAPTION}\n\n" + markdown(headers, rows)
    return [Printed("perplexity by position (tokens of context)", None, headers, rows)], section


def render_longppl(store: RunStore, specs: Sequence[MethodSpec]) -> tuple[list[Printed], str]:
    """longppl.csv and its markdown section, when the run found key tokens (--key-tokens)."""
    lp = longppl_long(store.rows())
    if lp.empty:
        return [], ""
    save_csv(lp.rename(columns={"label": "method"}), store.dir / "longppl.csv", index=False, float_format="%.6g")
    lengths = sorted(lp["length"].unique())
    order = [s.label for s in specs if s.label in set(lp["label"])]
    cell = {(r.label, int(r.length)): (r.longppl, r.status) for r in lp.itertuples()}
    counts = lp.groupby("length")["key_tokens"].max()
    headers = ["method"] + [fmt_length(int(L)) for L in lengths]
    rows = [
        [label] + [fmt_ppl(*cell.get((label, int(L)), (float("nan"), "missing"))) for L in lengths] for label in order
    ]
    rows.append(
        ["key tokens (count)"] + [f"{int(counts[L]):,}" if counts[L] == counts[L] else MISSING for L in lengths]
    )
    key = store.record.get("key_tokens") or {}
    caption = (
        LONGPPL_CAPTION + f" Evaluator: {key.get('evaluator')} under {key.get('method')}; short context "
        f"{key.get('context')} (stride {key.get('window')}); alpha {key.get('alpha')}, beta {key.get('beta')}."
    )
    section = f"\n## LongPPL (key tokens)\n\n{caption}\n\n" + markdown(headers, rows)
    return [Printed("LongPPL (perplexity over the key tokens)", caption, headers, rows)], section


def render_ppl(
    store: RunStore, specs: Sequence[MethodSpec], original_length: int, aggregate: str, tolerance: float, title: str
) -> RunOutputs:
    """table.md / table.csv / valid.csv / ppl.png in the run directory."""
    long = ppl_long(store.rows(), aggregate)
    wide = ppl_wide(long, [s.label for s in specs])
    status = status_wide(long, wide)
    for length in store.record.get("beyond_positions") or []:  # past a learned position table: measured as failed
        if int(length) not in wide.columns:
            wide[int(length)], status[int(length)] = float("nan"), BEYOND_POSITIONS
    wide, status = wide.sort_index(axis=1), status.sort_index(axis=1)
    valid = valid_lengths(wide, original_length, tolerance, status)
    headers, rows = ppl_cells(wide, status)
    vheaders, vrows = valid_cells(valid)
    n_docs = int(long["n_docs"].max()) if len(long) else 0
    caption = f"Perplexity ({aggregate}-weighted over {n_docs} document(s)); original length {original_length}."
    position_printed, position_md = render_positions(store, original_length, title)
    longppl_printed, longppl_md = render_longppl(store, specs)
    save_text(
        store.dir / "table.md",
        f"# {title}\n\n{caption}\n\n"
        + markdown(headers, rows)
        + longppl_md
        + f"\n## Valid length (ppl within {tolerance:.0%})\n\n{VALID_CAPTION}\n\n"
        + markdown(vheaders, vrows)
        + position_md,
    )
    export = wide.copy()
    export.index.name = "method"
    save_csv(export, store.dir / "table.csv", float_format="%.6g")
    save_csv(valid, store.dir / "valid.csv", index=False, float_format="%.6g")
    plot_curves(
        frame_curves(wide),
        store.dir / "ppl.png",
        title=title,
        xlabel="evaluation length (tokens)",
        ylabel="perplexity",
        originals={original_length: f"original length {fmt_length(original_length)}"},
        log_y=True,
    )
    extra = (", positions.csv, positions.png" if position_printed else "") + (
        ", longppl.csv" if longppl_printed else ""
    )
    return RunOutputs(
        [
            Printed(title, caption, headers, rows),
            *longppl_printed,
            Printed(f"valid length (ppl within {tolerance:.0%})", None, vheaders, [[str(c) for c in r] for r in vrows]),
            *position_printed,
        ],
        f"wrote {store.dir}/table.md, table.csv, valid.csv, ppl.png{extra}",
    )
