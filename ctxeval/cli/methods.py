"""`ctxeval methods` (the registry) and `ctxeval plan` (one method's per-pair frequency plan)."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ..attention.methods import ATTENTION_METHODS, logn_length, relative_position, window_of
from ..errors import CtxevalError
from ..models.load import load_config
from ..rope.methods import METHODS, Geometry, get_method, plan, resolve_params
from ..specs import expand_specs, plain_rope_notes, takes_default_factor, with_default_factors
from .console import err, out, user_errors
from .options import Check, FactorOpt, Fmt, MethodOpt, parse_factors


@user_errors
def methods_cmd(
    fmt: Annotated[Fmt, typer.Option("--format", help="table or json")] = Fmt.table,
) -> None:
    """List the RoPE methods (frequencies) and attention methods, their parameters and defaults."""
    data = [
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
    if fmt == Fmt.json:
        print(json.dumps(data, indent=2))
        return
    if fmt == Fmt.csv:
        raise CtxevalError("methods supports --format table or json")
    table = Table(
        title="RoPE methods (ctxeval plan --method NAME shows one in detail); attention methods follow a "
        "frequency method with '+' (ntk:factor=2+logn) or run alone on plain RoPE"
    )
    for col in ("method", "kind", "depends on length", "parameters (default)", "what it does"):
        table.add_column(col, overflow="fold")
    for d in data:
        params = (
            ", ".join(
                f"{p['name']}={p['default']}"
                + (" (measuring: longest length / trained)" if "measuring_default" in p else "")
                for p in d["params"]
            )
            or "-"
        )
        if d["param_aliases"]:
            params += "  [dim](" + ", ".join(f"{a}={b}" for a, b in d["param_aliases"].items()) + ")[/dim]"
        name = d["name"] + (f" ({', '.join(d['aliases'])})" if d["aliases"] else "")
        table.add_row(name, d["kind"], "yes" if d["length_dependent"] else "no", params, d["summary"])
    out.print(table)


@user_errors
def plan_cmd(
    method: MethodOpt = ["yarn"],
    factor: FactorOpt = None,
    head_dim: Annotated[
        Optional[int], typer.Option(help="Head dim (rotary dim = head_dim * partial_rotary_factor).")
    ] = None,
    partial_rotary_factor: Annotated[
        float,
        typer.Option(help="Fraction of the head dim that rotates."),
        Check("--partial-rotary-factor", above=0, maximum=1),
    ] = 1.0,
    base: Annotated[Optional[float], typer.Option(help="RoPE base (rope_theta).")] = None,
    original_length: Annotated[Optional[int], typer.Option(help="Original trained context length L.")] = None,
    model: Annotated[Optional[str], typer.Option(help="Read the geometry from this model's config instead.")] = None,
    length: Annotated[
        Optional[int], typer.Option(help="Sequence length (length-dependent methods)."), Check("--length", minimum=1)
    ] = None,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow the model's own config code.")] = False,
    fmt: Annotated[Fmt, typer.Option("--format", help="table, json (every pair's inv_freq) or csv")] = Fmt.table,
    plot: Annotated[Optional[Path], typer.Option(help="Write a PNG of the per-pair scale.")] = None,
) -> None:
    """Show the per-pair frequency plan of a method: wavelength, r = L/lambda, scale, group, attention factor."""
    geom, where = plan_geometry(head_dim, partial_rotary_factor, base, original_length, model, trust_remote_code)
    specs = expand_specs(method, parse_factors(factor))
    if len(specs) != 1:
        raise CtxevalError(f"plan shows one method at a time; got {len(specs)}: {', '.join(s.label for s in specs)}")
    specs, notes = with_default_factors(specs, length, geom)  # --length plays the longest length's part
    notes += plain_rope_notes(specs, [length or geom.original_length], geom)
    spec = specs[0]
    m = get_method(spec.name)
    if length is not None and not m.length_dependent and not notes:
        notes.append(f"{m.name} does not depend on the sequence length; --length is ignored")
    for note in notes:
        err.print(f"note: {note}", markup=False)
    freqs, rows = plan(m, geom, spec.params, length)
    full = resolve_params(m, spec.params)
    header = {
        "method": m.name,
        "params": full,
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
            f"attention factor {freqs.attention_factor:.6f} on q and k (logits x {freqs.attention_factor**2:.6f}); "
            + ", ".join(f"{n} {g}" for g, n in counts.items())
        )
    remapping = [a for a in spec.attention if a.name != "logn"]
    if spec.attention and fmt == Fmt.table:
        L = geom.original_length
        distances = sorted(
            {0, L // 4, L // 2, L - 1, L, 2 * L, 4 * L, 8 * L}
            | {window_of(a) + extra for a in remapping for extra in (-1, 0)}
        )
        table = Table(title=f"relative position scored for a pair at distance d (j = 0) under {spec.label}")
        table.add_column("distance d", justify="right")
        for a in remapping:
            table.add_column(a.name, justify="right")
        for d in distances:
            table.add_row(f"{d:,}", *[f"{float(relative_position(a, [d])[0]):,.2f}" for a in remapping])
        out.print(table)
        for length in filter(None, (logn_length(a, L) for a in spec.attention)):
            out.print(f"logn: queries at position i scaled by max(1, log(i+1)/log {length})")
    if plot is not None:
        from ..report.plots import plot_plan, plot_relative_positions  # matplotlib only when a plot is asked for

        if remapping:
            import numpy as np

            distance = np.linspace(0, 4 * geom.original_length, 801)
            plot_relative_positions(
                distance,
                {a.name: relative_position(a, distance) for a in remapping},
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
