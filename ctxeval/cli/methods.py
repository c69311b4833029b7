"""The commands that inspect methods without measuring: `ctxeval methods` (the registry), `ctxeval plan` (one method's
per-pair frequency plan) and `ctxeval bound` (the lower bound on the RoPE base from "Base of RoPE Bounds Context
Length", ctxeval/rope/bound.py)."""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from ..attention.methods import ATTENTION_METHODS, change_points, get_attention_method, logn_length, relative_position
from ..attention.temperature import describe_query_scale
from ..errors import CtxevalError
from ..models.load import load_config
from ..rope import bound as BD
from ..rope.methods import METHODS, Geometry, get_method, plan, resolve_params
from ..specs import MethodSpec, expand_specs, plain_rope_notes, takes_default_factor, with_default_factors
from .console import err, out, print_caption, print_table, user_errors
from .options import (
    Check,
    FactorOpt,
    Fmt,
    FormatOpt,
    HeadDimOpt,
    LengthsOpt,
    MethodOpt,
    ModelOpt,
    RemoteOpt,
    parse_factors,
    parse_lengths,
    reworded,
)


@user_errors
def methods_cmd(
    fmt: reworded(
        FormatOpt, "table, json (every parameter's choices and help too) or csv (one row per method)"
    ) = Fmt.table,
) -> None:
    """List the RoPE methods (frequencies) and attention methods, their parameters and defaults."""
    data = method_registry()
    if fmt == Fmt.json:
        print(json.dumps(data, indent=2))
        return
    if fmt == Fmt.csv:
        sys.stdout.write(methods_csv(data))
        return
    print_table(
        "RoPE methods (frequencies) and attention methods",
        "ctxeval plan --method NAME shows one in detail; an attention method follows a frequency method with '+' "
        "(ntk:factor=2+logn) or runs alone on plain RoPE",
        ["method", "kind", "depends on length", "what it does", "parameters (default)"],
        [
            [
                d["name"] + (f" ({', '.join(d['aliases'])})" if d["aliases"] else ""),
                d["kind"],
                "yes" if d["length_dependent"] else "no",
                d["summary"],
                param_text(d),
            ]
            for d in data
        ],
    )


def param_text(method: dict[str, Any]) -> str:
    """A method's parameters and defaults in one line: 'factor=1.0 (measuring: longest length / trained), ...',
    then its parameter aliases; '-' for none."""
    text = (
        ", ".join(
            f"{p['name']}={p['default']}"
            + (" (measuring: longest length / trained)" if "measuring_default" in p else "")
            for p in method["params"]
        )
        or "-"
    )
    if method["param_aliases"]:
        text += " (aliases: " + ", ".join(f"{a}={b}" for a, b in method["param_aliases"].items()) + ")"
    return text


def methods_csv(data: list[dict[str, Any]]) -> str:
    """`methods --format csv`: a header and one row per method; parameters as 'name=default' joined by '; ' (the
    JSON has their choices and help too)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["name", "kind", "aliases", "length_dependent", "parameters", "param_aliases", "summary"])
    for d in data:
        writer.writerow(
            [
                d["name"],
                d["kind"],
                "; ".join(d["aliases"]),
                str(d["length_dependent"]).lower(),
                "; ".join(f"{p['name']}={p['default']}" for p in d["params"]),
                "; ".join(f"{a}={b}" for a, b in d["param_aliases"].items()),
                d["summary"],
            ]
        )
    return buf.getvalue()


def method_registry() -> list[dict[str, Any]]:
    """Every method (frequency methods, then attention methods) as `methods --format json` prints it."""
    return [
        {
            "name": m.name,
            "kind": "frequency",
            "aliases": list(m.aliases),
            "length_dependent": m.length_dependent,
            "summary": m.summary,
            "params": [
                {
                    "name": p.name,
                    "default": p.default,
                    "choices": list(p.choices) if p.choices else None,
                    "help": p.help,
                    **(
                        {"measuring_default": "longest length / trained length"}
                        if p.name == "factor" and takes_default_factor(m.name)
                        else {}
                    ),
                }
                for p in m.params
            ],
            "param_aliases": m.param_aliases,
        }
        for m in METHODS.values()
    ] + [
        {
            "name": m.name,
            "kind": "attention",
            "aliases": [],
            "length_dependent": False,
            "summary": m.summary,
            "params": [{"name": p.name, "default": p.default, "choices": None, "help": p.help} for p in m.params],
            "param_aliases": {},
        }
        for m in ATTENTION_METHODS.values()
    ]


@user_errors
def plan_cmd(
    method: reworded(
        MethodOpt, "NAME or NAME:key=value,... (e.g. yarn:factor=4,beta_fast=32); repeatable.", list[str]
    ) = ("yarn",),
    factor: FactorOpt = None,
    head_dim: reworded(HeadDimOpt, "Head dim (rotary dim = head_dim * partial_rotary_factor).") = None,
    partial_rotary_factor: Annotated[
        float,
        typer.Option(help="Fraction of the head dim that rotates."),
        Check("--partial-rotary-factor", above=0, maximum=1),
    ] = 1.0,
    base: Annotated[Optional[float], typer.Option(help="RoPE base (rope_theta).")] = None,
    original_length: Annotated[Optional[int], typer.Option(help="Original trained context length L.")] = None,
    model: reworded(ModelOpt, "Read the geometry from this model's config instead.") = None,
    length: Annotated[
        Optional[int], typer.Option(help="Sequence length (length-dependent methods)."), Check("--length", minimum=1)
    ] = None,
    trust_remote_code: reworded(RemoteOpt, "Allow the model's own config code.", negatable=True) = False,
    fmt: reworded(FormatOpt, "table, json (every pair's inv_freq) or csv") = Fmt.table,
    plot: Annotated[Optional[Path], typer.Option(help="Write a PNG of the per-pair scale.")] = None,
) -> None:
    """Show the per-pair frequency plan of a method: wavelength, r = L/lambda, scale, group, attention factor."""
    geom, where = plan_geometry(head_dim, partial_rotary_factor, base, original_length, model, trust_remote_code)
    spec = plan_spec(list(method), factor, length, geom)
    m = get_method(spec.name)
    freqs, rows = plan(m, geom, spec.params, length)
    header = {
        "method": m.name,
        "params": resolve_params(m, spec.params),
        "geometry": {
            "rotary_dim": geom.rotary_dim,
            "base": geom.base,
            "original_length": geom.original_length,
            "source": where,
        },
        "length": length if m.length_dependent else None,
        "attention_factor": freqs.attention_factor,
        "logit_scale": freqs.attention_factor**2,
    }
    if fmt == Fmt.json:
        print(json.dumps({**header, "pairs": [r.__dict__ for r in rows]}, indent=2))
    elif fmt == Fmt.csv:
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(["pair", "wavelength", "ratio", "inv_freq", "scale", "group"])
        for r in rows:
            writer.writerow([r.pair, repr(r.wavelength), repr(r.ratio), repr(r.inv_freq), repr(r.scale), r.group])
        sys.stdout.write(buf.getvalue())
    else:
        title = f"{spec.label} on d={geom.rotary_dim}, b={geom.base:g}, L={geom.original_length} ({where})" + (
            f", length {length}" if m.length_dependent and length else ""
        )
        print_plan_table(title, rows, freqs.attention_factor)
        if spec.attention:
            print_relative_positions(spec, geom.original_length)
    if plot is not None:
        write_plan_plot(spec, rows, geom, plot)


def plan_spec(method: list[str], factor: str | None, length: int | None, geom: Geometry) -> MethodSpec:
    """The one method `plan` shows, its factor defaulted as a measuring command would at `length`; notes on stderr."""
    specs = expand_specs(method, parse_factors(factor))
    if len(specs) != 1:
        raise CtxevalError(f"plan shows one method at a time; got {len(specs)}: {', '.join(s.label for s in specs)}")
    specs, notes = with_default_factors(specs, length, geom)  # --length plays the longest length's part
    notes += plain_rope_notes(specs, [length or geom.original_length], geom)
    m = get_method(specs[0].name)
    if length is not None and not m.length_dependent and not notes:
        notes.append(f"{m.name} does not depend on the sequence length; --length is ignored")
    for note in notes:
        err.print(f"note: {note}", markup=False)
    return specs[0]


def print_plan_table(title: str, rows: list[Any], attention_factor: float) -> None:
    """The per-pair table, coloured by group, and the attention factor line."""
    table = Table(title=title)
    for col in ("pair", "wavelength", "r = L/λ", "inv_freq", "scale", "group"):
        table.add_column(col, justify="right" if col != "group" else "left")
    style = {"extrapolated": "green", "blended": "yellow", "interpolated": "red"}
    for r in rows:
        table.add_row(
            str(r.pair),
            f"{r.wavelength:,.1f}",
            f"{r.ratio:.4g}",
            f"{r.inv_freq:.6e}",
            f"{r.scale:.4f}",
            f"[{style[r.group]}]{r.group}[/]",
        )
    out.print(table)
    counts = {g: sum(r.group == g for r in rows) for g in style}
    out.print(
        f"attention factor {attention_factor:.6f} on q and k (logits x {attention_factor**2:.6f}); "
        + ", ".join(f"{n} {g}" for g, n in counts.items())
    )


def print_relative_positions(spec: MethodSpec, original_length: int) -> None:
    """The attention methods of `spec`: the relative position each scores at a distance, and logn's scaling."""
    L = original_length
    remapping = [a for a in spec.attention if get_attention_method(a.name).remaps]
    distances = sorted(
        {0, L // 4, L // 2, L - 1, L, 2 * L, 4 * L, 8 * L}
        | {point + extra for a in remapping for point in change_points(a, L) for extra in (-1, 0)}
    )
    table = Table(title=f"relative position scored for a pair at distance d (j = 0) under {spec.label}")
    table.add_column("distance d", justify="right")
    for a in remapping:
        table.add_column(a.name, justify="right")
    for d in distances:
        table.add_row(f"{d:,}", *[f"{float(relative_position(a, [d], L)[0]):,.2f}" for a in remapping])
    out.print(table)
    for length in filter(None, (logn_length(a, L) for a in spec.attention)):
        out.print(f"logn: queries at position i scaled by max(1, log(i+1)/log {length})")
    for line in filter(None, (describe_query_scale(a, L) for a in spec.attention)):
        out.print(line)


def write_plan_plot(spec: MethodSpec, rows: list[Any], geom: Geometry, plot: Path) -> None:
    """--plot: the relative positions of a remapping attention method, else the per-pair scale."""
    from ..report.plots import plot_plan, plot_relative_positions  # matplotlib only when a plot is asked for

    remapping = [a for a in spec.attention if get_attention_method(a.name).remaps]
    if remapping:
        import numpy as np

        distance = np.linspace(0, 4 * geom.original_length, 801)
        plot_relative_positions(
            distance,
            {a.name: relative_position(a, distance, geom.original_length) for a in remapping},
            f"{spec.label}: relative position vs true distance",
            geom.original_length,
            plot,
        )
    else:
        plot_plan(rows, f"{spec.label}: d={geom.rotary_dim}, b={geom.base:g}", geom.original_length, plot)
    err.print(f"wrote {plot}")


def plan_geometry(
    head_dim: int | None,
    partial: float,
    base: float | None,
    original_length: int | None,
    model: str | None,
    trust_remote_code: bool,
) -> tuple[Geometry, str]:
    if model is not None:
        if head_dim or base or original_length:
            raise CtxevalError("give either --model or --head-dim/--base/--original-length, not both")
        info = load_config(model, trust_remote_code=trust_remote_code)
        if info.geometry is None:
            raise CtxevalError(f"model '{model}' has no RoPE ({info.reason}); there is nothing to plan")
        return info.geometry, model
    missing = [
        n for n, v in (("--head-dim", head_dim), ("--base", base), ("--original-length", original_length)) if v is None
    ]
    if missing:
        raise CtxevalError(f"plan needs {', '.join(missing)} (or --model to read them from a config)")
    return Geometry(int(head_dim * partial), float(base), int(original_length)), "flags"


def fmt_base(value: float | None) -> str:
    """4300.0 -> '4.3e3' (two significant digits, as the paper writes them); None -> '-'."""
    if value is None or not math.isfinite(value):
        return "-"
    mant, exp = f"{value:.1e}".split("e")
    return f"{mant}e{int(exp)}"


def _model_geometry(model: str, trust_remote_code: bool) -> Any:
    info = load_config(model, trust_remote_code=trust_remote_code)
    if info.geometry is None:
        raise CtxevalError(
            f"model '{model}' has no RoPE ({info.reason}); the bound applies to RoPE models only, "
            "use --head-dim for a bare table"
        )
    shipped = info.shipped.get("rope_type", "default") if not info.per_layer_types else None
    if shipped not in (None, "default"):
        err.print(
            f"note: this checkpoint ships rope_type={shipped}; the criterion is evaluated at its plain base "
            f"{info.geometry.base:g}, without the scaling"
        )
    if info.per_layer_types:
        err.print(
            f"note: this model has per-layer RoPE ({', '.join(info.per_layer_types)}); using the "
            "full-attention layers' base"
        )
    return info.geometry


@user_errors
def bound_cmd(
    head_dim: HeadDimOpt = None,
    lengths: reworded(
        LengthsOpt,
        "Context lengths L: 1000,2000 | 1k:16k:x2 (k = 1024 here; the paper's lengths are "
        "thousands, the default: 1000,2000,...,512000,1000000).",
    ) = None,
    model: reworded(
        ModelOpt,
        "Read d, base and trained length from this model's config; add the longest context its base supports.",
    ) = None,
    trust_remote_code: reworded(RemoteOpt, "Run the model repository's own config code.") = False,
    fmt: FormatOpt = Fmt.table,
) -> None:
    """Lower bound on the RoPE base for context length L (Men et al. 2024): sum_i cos(m b^(-2i/d)) >= 0, m <= L."""
    if model is not None and head_dim is not None:
        raise CtxevalError("give either --head-dim or --model (it reads the rotary dim from the config), not both")
    if model is None and head_dim is None:
        raise CtxevalError("bound needs --head-dim D (the rotary dim, e.g. 128) or --model M")
    if head_dim is not None:
        BD.check_head_dim(head_dim)
    wanted = parse_lengths(lengths) if lengths is not None else list(BD.PAPER_LENGTHS)
    model_rec: dict[str, Any] | None = None
    if model is not None:
        model_rec = _model_record(model, trust_remote_code)
        head_dim = model_rec["rotary_dim"]
        if model_rec["trained_length"] <= BD.MAX_LENGTH:
            wanted = sorted(set(wanted) | {model_rec["trained_length"]})
    table = BD.bound_table(head_dim, wanted)
    rows = table.rows
    if head_dim == 2 and max(wanted) >= 2:
        err.print(
            "note: with d = 2 the only pair has theta_0 = 1 for every base, so B_m = cos(m) < 0 at m = 2: "
            "no base passes any L >= 2"
        )
    if fmt == Fmt.json:
        print(json.dumps(_bound_json(head_dim, table, model_rec), indent=2))
    elif fmt == Fmt.csv:
        sys.stdout.write(_bound_csv(rows))
    else:
        shown = _render(head_dim, rows, model_rec)
        caption, shown.caption = str(shown.caption), None
        out.print(shown)
        print_caption(caption)
    if model_rec is not None and fmt != Fmt.json:
        (out if fmt == Fmt.table else err).print(_model_line(model_rec, rows), markup=False)
    err.print(f"computed in {table.seconds:.1f} s ({table.grid_bases} grid bases)")


def _model_record(model: str, trust_remote_code: bool) -> dict[str, Any]:
    """--model: its rotary dim, base, trained length, and the longest context its base supports."""
    geom = _model_geometry(model, trust_remote_code)
    BD.check_head_dim(geom.rotary_dim)
    reach = BD.max_context(geom.base, geom.rotary_dim)
    return {
        "model": model,
        "rotary_dim": geom.rotary_dim,
        "base": geom.base,
        "trained_length": geom.original_length,
        "max_context": reach,
        "max_context_is_lower_limit": reach >= BD.MAX_LENGTH,
        "ratio_to_trained": reach / geom.original_length,
    }


def _bound_json(head_dim: int, table: Any, model_rec: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "head_dim": head_dim,
        "criterion": "sum_i cos(m * base^(-2i/d)) >= 0 for m = 0..L",
        "grid": f"bases with two significant digits from 1.1 to at most {BD.MAX_BASE:g}",
        "rows": [r.to_json() for r in table.rows],
        "model": model_rec,
        "seconds": round(table.seconds, 3),
    }


def _bound_csv(rows: list[BD.BoundRow]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["length", "paper", "first_feasible", "all_feasible_above", "safe_base"])
    for r in rows:
        writer.writerow(
            [
                r.length,
                "" if r.paper is None else repr(r.paper),
                "" if r.first_feasible is None else repr(r.first_feasible),
                "" if r.all_feasible_above is None else repr(r.all_feasible_above),
                repr(r.safe_base) if math.isfinite(r.safe_base) else "",
            ]
        )
    return buf.getvalue()


BOUND_DOC = "docs/bound.md#reproducing-the-papers-table-1-d--128"  # the paper's rows that do not match, explained


def _render(head_dim: int, rows: list[BD.BoundRow], model_rec: dict[str, Any] | None) -> Any:
    with_paper = any(r.paper is not None for r in rows)
    trained = model_rec["trained_length"] if model_rec else None
    table = Table(
        title=f"Lower bound on the RoPE base, d = {head_dim}: sum_i cos(m b^(-2i/d)) >= 0 for all m <= L",
        caption="bases with two significant digits; 'all feasible above': every grid base from there up "
        "passes (checked up to a base above which every base provably passes)",
    )
    table.add_column("length L", justify="right")
    if with_paper:
        table.add_column("paper (d=128)", justify="right")
    table.add_column("lower bound (first feasible)", justify="right")
    table.add_column("all feasible above", justify="right")
    matches = 0
    for r in rows:
        label = f"{r.length:,}" + (" (trained)" if r.length == trained else "")
        first = fmt_base(r.first_feasible) if r.first_feasible is not None else f"none up to {fmt_base(BD.MAX_BASE)}"
        cells = [label]
        if with_paper:
            if r.paper is None:
                cells.append("")
            else:
                same = r.first_feasible is not None and math.isclose(r.first_feasible, r.paper)
                matches += same
                cells.append(fmt_base(r.paper))
                first = f"[green]{first}[/green]" if same else f"[red]{first}[/red]"
        cells += [
            first,
            fmt_base(r.all_feasible_above)
            if r.all_feasible_above is not None
            else f"not below {fmt_base(BD.MAX_BASE)}",
        ]
        table.add_row(*cells)
    if with_paper:
        n = sum(r.paper is not None for r in rows)
        table.caption += f"; {matches} of {n} rows match the paper's Table 1 (green)"
        if matches < n:
            table.caption += (
                f"; the other {n - matches} row(s): the paper's own base fails the criterion at some m <= L "
                f"(why, and what was tried: {BOUND_DOC})"
            )
    return table


def _model_line(rec: dict[str, Any], rows: list[BD.BoundRow]) -> str:
    reach = rec["max_context"]
    reach_text = f">= {reach:,}" if rec["max_context_is_lower_limit"] else f"{reach:,}"
    line = (
        f"{rec['model']}: d = {rec['rotary_dim']}, base {rec['base']:g}, trained length {rec['trained_length']:,}; "
        f"its base supports L = {reach_text} by the criterion ({rec['ratio_to_trained']:.2f}x the trained length)"
    )
    row = next((r for r in rows if r.length == rec["trained_length"]), None)
    if row is not None and row.first_feasible is not None:
        line += (
            f"; for L = {row.length:,} the lower bound is {fmt_base(row.first_feasible)}, every grid base from "
            f"{fmt_base(row.all_feasible_above)} up passes"
        )
    return line
