"""The ppl kind: its protocol key; its tables for one group (model x method by length, the valid length of each
method against its own ppl and against the unmodified model's, the position encodings compared when the models
differ in them, LongPPL over the key tokens of runs with --key-tokens, perplexity by position bucket of runs that
kept position sums); the perplexity curves and the loss-by-position figure."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ...errors import CtxevalError
from ...runs.rows import BEYOND_POSITIONS, MISSING, fmt_length
from ..figures import curve_figure, figure_title, heading, originals_legend, position_curves
from ..kind import FigureSpace, Kind, Settings
from ..plots import plot_curves
from ..runs import Group, Run, corpus_key, row_order
from ..tables import (
    NOT_REACHED_NOTE,
    Table,
    base_label,
    base_valid_column,
    bucket_label,
    fmt_ppl,
    int_or_none,
    length_or,
    longppl_long,
    number,
    own_valid_column,
    positions_long,
    ppl_long,
    valid_cells,
    valid_lengths,
)


def protocol_key(run: Run, aggregate: str | None = None) -> dict[str, Any]:
    """The corpus, the protocol (truncate or sliding, its stride), BOS and the aggregate over documents."""
    proto = run.record.get("protocol") or {}
    return {
        **corpus_key(run),
        "protocol": proto.get("name", run.spec.get("protocol")),
        "stride": proto.get("stride", run.spec.get("stride")),
        "bos": proto.get("bos", run.spec.get("bos")),
        "aggregate": aggregate or proto.get("aggregate", "token"),
    }


def tables(group: Group, rows: list[dict[str, Any]], settings: Settings) -> list[Table]:
    return ppl_tables(group, rows, settings.tolerance)


def ppl_tables(group: Group, rows: list[dict[str, Any]], tolerance: float) -> list[Table]:
    """The ppl group's tables: perplexity by length (model x method), the valid length of each method, and, where
    the runs recorded them, LongPPL by length and perplexity by position."""
    aggregate = group.key.get("aggregate") or "token"
    if aggregate == "window" and any(r.get("status") == "ok" and "window_nll_sum" not in r for r in rows):
        raise CtxevalError(
            f"the runs of {group.id} ({', '.join(r.name for r in group.runs)}) have no per-window "
            "sums; use --aggregate token"
        )
    long = ppl_long(rows, aggregate)
    cells = {(str(r.model), str(r.label), int(r.length)): (r.ppl, r.status) for r in long.itertuples()}
    pairs = row_order(group, rows)
    for model, label in pairs:  # past a learned position table: a cell of its own, and where the valid length ends
        beyond = group.positions.get(model, {}).get("beyond") or []
        cells.update({(model, label, int(n)): (None, BEYOND_POSITIONS) for n in beyond})
    lengths = sorted({k[2] for k in cells})

    raw, status, shown = [], [], []
    for model, label in pairs:
        vals, sts = [], []
        for length in lengths:
            value, st = cells.get((model, label, length), (None, "missing"))
            vals.append(number(value))
            sts.append(None if st == "ok" else st)
        raw.append([model, label, *vals])
        status.append([None, None, *sts])
        shown.append([model, label, *(fmt_ppl(v if v is not None else float("nan"), s) for v, s in zip(vals, sts))])
    n_docs = len(group.key.get("documents") or [])
    originals = ", ".join(f"{m} {fmt_length(L)}" for m, L in group.original_lengths.items())
    main = Table(
        group.id,
        "ppl",
        group.title,
        ["model", "method", *map(str, lengths)],
        ["model", "method", *map(fmt_length, lengths)],
        raw,
        status,
        shown,
        caption=f"Perplexity ({aggregate}-weighted over {n_docs} document(s)); original length: {originals}.",
    )

    # valid length: one computation per (model, method), over the lengths that model was evaluated at; every table
    # that shows a valid length reads it from here by that key (never by row position: merged runs interleave models)
    own_col = own_valid_column(tolerance)
    valid, bases = _valid_by_pair(group, cells, pairs, tolerance)
    vraw = [valid[pair].raw for pair in valid]
    vstatus = [valid[pair].status for pair in valid]
    vshown = [valid[pair].shown for pair in valid]
    one_base = {b.split(": ", 1)[1] for b in bases}
    base_name = next(iter(one_base)) if len(one_base) == 1 and "none evaluated" not in one_base else None
    base_col = base_valid_column(tolerance, base_name)
    columns = [
        "model",
        "method",
        "reference length",
        "ppl at reference",
        own_col,
        "x original",
        base_col,
        "x original (vs base)",
    ]
    valid_table = Table(
        f"{group.id}-valid",
        "valid",
        f"Valid length (ppl within {tolerance:.0%})",
        columns,
        columns,
        vraw,
        vstatus,
        vshown,
        caption="Reference: the model's original length (or the longest evaluated length below it). "
        f"Own: the longest length, going up from it, whose ppl stays within {tolerance:.0%} "
        "of the method's own ppl there. Vs base: within the tolerance of the unmodified "
        f"model's ppl there ({'; '.join(bases)}): how far the method goes without paying. "
        f"{NOT_REACHED_NOTE}",
    )
    encodings = _encodings_table(group, main, valid, own_col, lengths, tolerance)
    return [main, *encodings, valid_table, *_longppl_tables(group, rows, pairs), *_positions_table(group, rows, pairs)]


@dataclass
class ValidLength:
    """One (model, method)'s valid-length row: the raw values, their statuses and the printed cells, in the valid
    table's columns (model, method, reference length, ppl at reference, own, x original, vs base, x original)."""

    raw: list[Any]
    status: list[str | None]
    shown: list[str]

    @property
    def own(self) -> int | None:
        """The longest length within the tolerance of the method's own ppl at the reference length."""
        return self.raw[4]


def _valid_by_pair(
    group: Group,
    cells: dict[tuple[str, str, int], tuple[Any, str]],
    pairs: list[tuple[str, str]],
    tolerance: float,
) -> tuple[dict[tuple[str, str], ValidLength], list[str]]:
    """(model, method) -> its valid lengths, computed and written as a run's own valid.csv and table.md are
    (tables.valid_lengths and valid_cells) over the lengths that model was evaluated at, grouped by model in the
    order models first appear; and each model's base row named for the caption."""
    own_col = own_valid_column(tolerance)
    out: dict[tuple[str, str], ValidLength] = {}
    bases = []
    for model in dict.fromkeys(m for m, _ in pairs):
        labels = [label for m, label in pairs if m == model]
        evaluated = sorted({k[2] for k in cells if k[0] == model})
        got = {(label, L): cells.get((model, label, L), (None, "missing")) for label in labels for L in evaluated}
        wide = pd.DataFrame(
            [[_ppl_or_nan(got[(label, L)][0]) for L in evaluated] for label in labels], index=labels, columns=evaluated
        )
        status = pd.DataFrame(
            [[got[(label, L)][1] for L in evaluated] for label in labels], index=labels, columns=evaluated
        )
        original = group.original_lengths.get(model) or max(evaluated)
        valid = valid_lengths(wide, original, tolerance, status)
        _, printed = valid_cells(valid)
        base = base_label(wide.index)
        bases.append(f"{model}: {base}" if base else f"{model}: none evaluated")
        base_col = base_valid_column(tolerance, base)
        for label, v, shown in zip(labels, valid.to_dict("records"), printed, strict=True):
            if v["method"] != label:
                raise AssertionError(f"valid_lengths returned {v['method']!r} where {label!r} was asked")
            ref_len, ref = int_or_none(v["reference length"]), number(v["ppl at reference"])
            longest, vs_base = int_or_none(v[own_col]), int_or_none(v[base_col])
            ref_status = got.get((label, int(ref_len)), (None, "missing"))[1]
            out[(model, label)] = ValidLength(
                [
                    model,
                    label,
                    ref_len,
                    ref,
                    longest,
                    number(v["x original"]),
                    vs_base,
                    number(v["x original (vs base)"]),
                ],
                [
                    None,
                    None,
                    None,
                    None if ref is not None else ref_status,
                    None if longest is not None else "missing",
                    None,
                    None if vs_base is not None else "missing",
                    None,
                ],
                [model, label, shown[1], fmt_ppl(ref if ref is not None else float("nan"), ref_status), *shown[3:]],
            )
    return out, bases


def _ppl_or_nan(value: Any) -> float:
    value = number(value)
    return float("nan") if value is None else float(value)


def _encodings_table(
    group: Group,
    main: Table,
    valid: dict[tuple[str, str], ValidLength],
    own_col: str,
    lengths: list[int],
    tolerance: float,
) -> list[Table]:
    """The ALiBi paper's comparison, when the models differ in how they encode position: per position encoding,
    model and method, the trained length, the valid length (own ppl within the tolerance) and ppl at each length."""
    encodings = {
        m: (group.positions.get(m) or {}).get("encoding") or "?" for m in dict.fromkeys(r[0] for r in main.rows)
    }
    if len(set(encodings.values())) < 2:
        return []
    headers = ["model", "method", "position encoding", "trained length", own_col, *map(fmt_length, lengths)]
    raw, status, shown = [], [], []
    for row, row_status, row_shown in zip(main.rows, main.status, main.cells):
        model, trained = row[0], group.original_lengths.get(row[0])
        mine = valid[(model, row[1])]
        raw.append([model, row[1], encodings[model], trained, mine.own, *row[2:]])
        status.append([None, None, None, None, mine.status[4], *row_status[2:]])
        shown.append([model, row[1], encodings[model], length_or(trained, MISSING), mine.shown[4], *row_shown[2:]])
    return [
        Table(
            f"{group.id}-encodings",
            "encodings",
            f"Position encodings: valid length (ppl within {tolerance:.0%} of its own at the trained length) and ppl",
            ["model", "method", "position encoding", "trained length", own_col, *map(str, lengths)],
            headers,
            raw,
            status,
            shown,
            caption="As the ALiBi paper compares position encodings (train short, test long): each model's "
            "perplexity by evaluation length, and how far past its trained length it stays within the tolerance. "
            "no pos.: a learned position table has no row for that length.",
        )
    ]


def _longppl_tables(group: Group, rows: list[dict[str, Any]], pairs: list[tuple[str, str]]) -> list[Table]:
    """LongPPL by length (runs with --key-tokens), with the key-token counts; none when no run found key tokens."""
    lp = longppl_long(rows)
    if lp.empty:
        return []
    settings = {
        json.dumps({k: v for k, v in (run.record.get("key_tokens") or {}).items() if k != "documents"}, sort_keys=True)
        for run in group.runs
        if run.record.get("key_tokens")
    }
    if len(settings) > 1:
        group.notes.append(
            "LongPPL not shown: the runs found their key tokens with different evaluators or settings "
            "(LongPPL compares methods on one set of tokens); report them separately"
        )
        return []
    lengths = sorted(int(x) for x in lp["length"].unique())
    cell = {
        (str(r.model), str(r.label), int(r.length)): (number(r.longppl), r.status, number(r.key_tokens))
        for r in lp.itertuples()
    }
    raw, status, shown = [], [], []
    for model, label in pairs:
        if not any((model, label, L) in cell for L in lengths):
            continue
        got = [cell.get((model, label, L), (None, "missing", 0)) for L in lengths]
        raw.append([model, label, *(g[0] for g in got)])
        status.append([None, None, *(None if g[1] == "ok" else g[1] for g in got)])
        shown.append([model, label, *(fmt_ppl(g[0] if g[0] is not None else float("nan"), g[1]) for g in got)])
    for model in dict.fromkeys(m for m, _ in pairs):
        counts = [
            max((int(c[2]) for k, c in cell.items() if k[0] == model and k[2] == L and c[2] is not None), default=None)
            for L in lengths
        ]
        if any(c is not None for c in counts):
            raw.append([model, "key tokens (count)", *counts])
            status.append([None, None, *(None if c is not None else "missing" for c in counts)])
            shown.append([model, "key tokens (count)", *(f"{c:,}" if c is not None else MISSING for c in counts)])
    evaluators = sorted(
        {
            f"{k.get('evaluator')} under {k.get('method')}, short context {k.get('context')}"
            for run in group.runs
            for k in [run.record.get("key_tokens") or {}]
            if k
        }
    )
    return [
        Table(
            f"{group.id}-longppl",
            "longppl",
            "LongPPL (perplexity over the key tokens)",
            ["model", "method", *map(str, lengths)],
            ["model", "method", *map(fmt_length, lengths)],
            raw,
            status,
            shown,
            caption="Fang et al. 2025: perplexity over the tokens the evaluator predicts much better with the "
            "long context than with a short one (every method on the same tokens); over documents "
            "exp(summed key-token NLL / key tokens), as PKU-ML/LongPPL aggregates. Evaluator: "
            + ("; ".join(evaluators) or "not recorded")
            + ".",
        )
    ]


def _positions_table(group: Group, rows: list[dict[str, Any]], pairs: list[tuple[str, str]]) -> list[Table]:
    """Perplexity by position bucket (rows that carry position sums), at each method's longest length; the methods
    whose buckets differ from the most common edges are left out with a note."""
    pos = positions_long(rows)
    if pos.empty:
        return []
    edges_of = {
        (str(m), str(label)): tuple(sorted(set(g["start"]) | set(g["stop"])))
        for (m, label), g in pos.groupby(["model", "label"], sort=False)
    }
    common = Counter(edges_of.values()).most_common(1)[0][0]
    left_out = [f"{m} · {label}" for (m, label), e in edges_of.items() if e != common]
    if left_out:
        group.notes.append("loss by position: " + ", ".join(left_out) + " used other position buckets; not shown")
    buckets = list(zip(common, common[1:]))
    cell = {
        (str(r.model), str(r.label), int(r.start), int(r.stop)): (float(r.ppl), int(r.length)) for r in pos.itertuples()
    }
    raw, status, shown = [], [], []
    for model, label in pairs:
        if edges_of.get((model, label)) != common:
            continue
        got = [cell.get((model, label, a, b)) for a, b in buckets]
        at = next(g[1] for g in got if g is not None)
        raw.append([model, label, at, *(g[0] if g else None for g in got)])
        status.append([None, None, None, *(None if g else "missing" for g in got)])
        shown.append([model, label, fmt_length(at), *(fmt_ppl(g[0]) if g else MISSING for g in got)])
    return [
        Table(
            f"{group.id}-positions",
            "positions",
            "Perplexity by position (tokens of context)",
            ["model", "method", "at", *(f"{a}-{b}" for a, b in buckets)],
            ["model", "method", "at", *(bucket_label(a, b) for a, b in buckets)],
            raw,
            status,
            shown,
            caption="Perplexity of the tokens predicted from p tokens of context (start <= p < stop), "
            "token-weighted over the documents, from each method's forward at its longest length "
            "('at'; a length-dependent method: its forward at that length only).",
        )
    ]


def figures(group: Group, space: FigureSpace) -> dict[str, str]:
    """Every model x method's perplexity curve on one log-scale figure; the loss by position beside it when the runs
    kept position sums."""
    images = curve_figure(group, space, "perplexity by length", "evaluation length (tokens)", "perplexity", log_y=True)
    if not images:
        return {}
    positions = next((t for t in group.tables if t.kind == "positions"), None)
    if positions is not None:
        path = space.out_dir / f"{space.stem}-positions.png"
        plot_curves(
            position_curves(group, positions),
            path,
            title=figure_title(group, "loss by position"),
            xlabel="tokens of context the prediction had (bucket centres; ticks at bucket edges)",
            ylabel="perplexity of the bucket's tokens",
            originals=originals_legend(group),
            log_y=True,
            x_ticks=sorted({int(x) for c in positions.columns[3:] for x in c.split("-")}),
        )
        images[f"{group.id}-positions"] = path.name
    return images


def caption(group: Group, part: str) -> str | None:
    return f"{heading(group)}: loss by position" if part == "positions" else None


KIND = Kind("ppl", "Perplexity", protocol_key, tables, figures, caption)
