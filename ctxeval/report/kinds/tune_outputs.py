"""A tune run's own outputs, written into its run directory: tune.md (what was searched, the winner, the held-out
comparison, the export and the best trials), trials.csv (every trial) and three figures (tune-objective.png,
tune-factors.png, tune-pareto.png). The numbers come from tune_data.py, which `ctxeval report` reads too."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from ...runs.rows import fmt_length
from ...runs.store import ROWS_FILE, RUN_FILE, read_rows
from ..single import Printed, RunOutputs, save_csv, save_text
from ..tables import fmt_ppl, markdown
from .tune_data import (
    Heldout,
    TuneSummary,
    best_so_far,
    fmt_params,
    is_feasible,
    is_ok,
    pair_scales,
    param_columns,
    pareto_front,
    read_tune,
)
from .tune_plots import TrialPoint, plot_families, plot_objective, plot_pair_scales, plot_pareto

TOP_TRIALS = 10
WINNER_MARK = "★"
TRIAL_COLUMNS = ["ppl_target", "ppl_short", "short_rise", "feasible", "seconds", "forwards"]


OBJECTIVE_TEXT = {
    "ppl": "token-weighted perplexity",
    "needle": "the answer perplexity of 5 pass keys hidden at evenly spaced depths in each document (--objective "
    "needle)",
    "both": "the geometric mean of the document's own-token perplexity and the answer perplexity of 5 pass keys "
    "hidden in it (--objective both)",
}


def objective_of(spec: dict[str, Any]) -> str:
    """The objective a tune run's spec names ('log ppl' in the study: ppl)."""
    name = str(spec.get("objective") or "ppl").removeprefix("log ")
    return name if name in OBJECTIVE_TEXT else "ppl"


def objective_name(metric: Any) -> str:
    """A trial row's metric as a table names it."""
    return {"answer_ppl": "answer ppl", "ppl_answer_geomean": "√(ppl·answer ppl)"}.get(str(metric), "ppl")


def fmt_rise(value: Any) -> str:
    return f"{value:+.2%}" if isinstance(value, (int, float)) and math.isfinite(value) else "—"


def trials_frame(trials: list[dict[str, Any]]) -> pd.DataFrame:
    """trials.csv: one line per finished trial, its searched parameters as columns."""
    params = param_columns(trials)
    extra = [c for c in ("retry_of", "note") if any(c in r for r in trials)]
    records = [
        {
            "trial": r["trial"],
            "status": r.get("status"),
            "label": r.get("label"),
            **{p: (r.get("params") or {}).get(p) for p in params},
            **{c: r.get(c) if (is_ok(r) or c in ("seconds", "forwards")) else None for c in TRIAL_COLUMNS},
            **{c: r.get(c) for c in extra},
        }
        for r in trials
    ]
    return pd.DataFrame(records, columns=["trial", "status", "label", *params, *TRIAL_COLUMNS, *extra])


def heldout_cells(held: Heldout) -> tuple[list[str], list[list[str]]]:
    """Per method the held-out ppl at the trained and the target length, the winner first and marked."""
    tuned = held.value(held.winner, held.target)
    headers = [
        "method",
        f"ppl at {fmt_length(held.short)} (trained)",
        f"ppl at {fmt_length(held.target)} (target)",
        f"at {fmt_length(held.target)} vs tuned",
    ]
    rows = []
    for label in held.labels:
        cells = [
            fmt_ppl(held.ppl.get((label, L), math.nan), held.status.get((label, L), "missing"))
            for L in (held.short, held.target)
        ]
        at = held.value(label, held.target)
        versus = "—" if label == held.winner or at is None or tuned is None else fmt_rise(at / tuned - 1)
        name = f"{WINNER_MARK} {label} (tuned)" if label == held.winner else label
        rows.append([name, *cells, versus])
    return headers, rows


def top_cells(trials: list[dict[str, Any]], short: int, target: int) -> tuple[list[str], list[list[str]]]:
    feasible = [r for r in trials if is_feasible(r)]
    best = sorted(feasible, key=lambda r: (float(r["value"]), int(r["trial"])))[:TOP_TRIALS]
    headers = [
        "rank",
        "trial",
        f"ppl at {fmt_length(target)}",
        f"ppl at {fmt_length(short)}",
        f"rise at {fmt_length(short)}",
        "parameters (as searched)",
    ]
    metric = best[0].get("metric") if best else "ppl"
    if metric == "answer_ppl":  # the objective is the answers' ppl: the documents' beside it
        headers[2:3] = [f"answer ppl at {fmt_length(target)}", f"ppl at {fmt_length(target)}"]
    elif metric == "ppl_answer_geomean":
        headers[2:3] = [
            f"{objective_name(metric)} at {fmt_length(target)}",
            "answer ppl",
            f"ppl at {fmt_length(target)}",
        ]
    extra = {"answer_ppl": ["ppl_target"], "ppl_answer_geomean": ["answer_ppl", "ppl_target"]}.get(str(metric), [])
    return headers, [
        [
            str(i),
            str(r["trial"]),
            fmt_ppl(r["value"]),
            *[fmt_ppl(r.get(k, math.nan)) for k in extra],
            fmt_ppl(r["ppl_short"]),
            fmt_rise(r["short_rise"]),
            fmt_params(r.get("params")),
        ]
        for i, r in enumerate(best, 1)
    ]


def search_lines(s: TuneSummary, guard: float | None) -> list[str]:
    spec, tune, counts = s.spec, s.tune, s.counts()
    seconds = sum(float(r.get("seconds") or 0) for r in s.trials)
    forwards = sum(int(r.get("forwards") or 0) for r in s.trials)
    tuning = [
        str(d.get("doc"))
        for d in (s.record.get("data") or {}).get("documents") or []
        if isinstance(d, dict) and d.get("role") == "tuning"
    ] or list(spec.get("tuning_docs") or [])
    sampler = str(tune.get("sampler") or spec.get("sampler"))
    asked = spec.get("sampler")
    baseline, tolerance = tune.get("baseline_short"), spec.get("short_tolerance")
    lines = [
        f"searched: `{spec.get('space')}`",
        f"sampler: {sampler}"
        + (f" (--sampler {asked})" if asked and asked != sampler else "")
        + f", seed {spec.get('seed')}"
        + (f", population {spec.get('population')}" if sampler == "nsga2" else ""),
        f"trials: {counts['counted']} ({counts['ok']} measured, {counts['feasible']} of them kept the guard; "
        f"{counts['error']} failed), and {counts['invalid']} more points refused by the method's checks (no "
        "forward; --trials does not count them)",
        f"compute: {forwards:,} forwards, {seconds:.1f} s summed over the trials"
        + (
            f" (this session measured {tune['measured_now']} in {tune.get('search_seconds_now')} s)"
            if tune.get("measured_now") is not None
            else ""
        ),
        f"objective: {OBJECTIVE_TEXT[objective_of(spec)]} at {fmt_length(s.target or 0)} on {len(tuning)} tuning "
        f"document(s) ({', '.join(tuning)})",
    ]
    if baseline is not None and tolerance is not None and guard is not None:
        lines.append(
            f"guard: perplexity at {fmt_length(s.short or 0)} (the trained length) at most {tolerance:.0%} "
            f"above plain RoPE's {baseline:.2f} there, i.e. at most {guard:.2f}"
        )
    if tune.get("storage"):
        lines.append(
            f"study: `{tune['storage']}` (rerun the command with the same --out, and more --trials to continue it)"
        )
    return lines


def shown_path(value: Any, fallback: Any = None) -> str:
    """A path a record holds, as tune.md names it: a relative one as it is, an absolute one (older runs recorded
    '/tmp/export-tiny-yarn') by `fallback` when given, else by its last part; tune.md names no machine's paths."""
    if not isinstance(value, str) or not value:
        return "?"
    if not Path(value).is_absolute():
        return value
    return str(fallback) if fallback else Path(value).name


def export_section(export: dict[str, Any]) -> str:
    check = export.get("verification") if isinstance(export.get("verification"), dict) else {}
    parts = [
        "\n## Export\n\n",
        f"- directory: `{shown_path(check.get('directory'))}` (config.json with these rope_parameters, weights linked "
        f"from `{shown_path(export.get('weights_linked_from'), export.get('model'))}`'s files; "
        f"max_position_embeddings {export.get('max_position_embeddings')})\n",
        f"- rope_parameters: `{json.dumps(export.get('rope_parameters'), sort_keys=True)}`\n",
    ]
    if check:
        tuned, exported = check.get("ppl_tuned") or {}, check.get("ppl_exported") or {}
        passed = "passed" if check.get("passed") else "FAILED"
        parts.append(
            f"- verification ({passed}): the exported directory loaded fresh, with no patching, against "
            f"the tuned method applied in place, on `{check.get('doc')}`; largest relative difference "
            f"{check.get('max_rel_diff_rope', math.nan):.2e} in the RoPE frequencies and "
            f"{check.get('max_rel_diff_ppl', math.nan):.2e} in perplexity (tolerance "
            f"{check.get('tolerance', math.nan):g})\n\n"
        )
        lengths = sorted(set(tuned) | set(exported), key=lambda k: int(k))
        parts.append(
            markdown(
                ["length", "ppl tuned (in place)", "ppl exported (loaded fresh)"],
                [
                    [fmt_length(int(L)), f"{tuned.get(L, math.nan):.6g}", f"{exported.get(L, math.nan):.6g}"]
                    for L in lengths
                ],
            )
        )
    return "".join(parts)


def draw(s: TuneSummary, guard: float | None, run_dir: Path) -> list[str]:
    """The figures; returns the names of those drawn."""
    spec, winner = s.spec, s.winner
    short, target = s.short or 0, s.target or 0
    points = [
        TrialPoint(int(r["trial"]), float(r["value"]), float(r["ppl_short"]), bool(r.get("feasible")))
        for r in s.trials
        if is_ok(r)
    ]
    win = int(winner["trial"]) if winner else None
    what = f"{spec.get('method')} on {spec.get('model')}, target {fmt_length(target)}"
    drawn = []
    unmeasured = len(s.trials) - len(points)
    if points:
        plot_objective(
            points,
            best_so_far(s.trials),
            win,
            target,
            run_dir / "tune-objective.png",
            f"Search: {what}\n{s.tune.get('sampler') or spec.get('sampler')}, {len(s.trials)} trials"
            + (f" ({unmeasured} refused or failed, not shown)" if unmeasured else "")
            + ("" if winner else "; no trial kept the guard"),
        )
        front = pareto_front([(p.ppl_short, p.ppl_target) for p in points])
        plot_pareto(
            points,
            front,
            win,
            guard,
            s.tune.get("baseline_short"),
            short,
            target,
            run_dir / "tune-pareto.png",
            f"Trials: {what}\nperplexity at the trained length against the "
            "target on the tuning documents (both lower is better)" + ("" if winner else "; no trial kept the guard"),
        )
        drawn += ["tune-objective.png", "tune-pareto.png"]
    held = s.heldout
    if held is not None:
        wanted = [held.winner] + [label for label in (held.family_default(f) for f in ("pi", "ntk", "yarn")) if label]
        scales = pair_scales(held, wanted)
        # LongRoPE's short factors (used up to the trained length), when they are not plain RoPE
        up_to_short = pair_scales(held, [held.winner], held.short).get(held.winner)
        if up_to_short and any(abs(v - 1) > 1e-9 for v in up_to_short) and up_to_short != scales.get(held.winner):
            scales[f"tuned, up to {fmt_length(held.short)} (short factors)"] = up_to_short
        geometry = ((held.record.get("methods") or {}).get("none") or {}).get("geometry") or {}
        if held.winner in scales and geometry.get("base"):
            plot_pair_scales(
                scales,
                held.winner,
                int(geometry.get("original_length") or short),
                float(geometry["base"]),
                run_dir / "tune-factors.png",
                f"Per-pair scale θ_i / θ'_i: the tuned {spec.get('method')} against PI, NTK and YaRN "
                f"(default betas) at the same factor\n{spec.get('model')}, target {fmt_length(target)} "
                "(frequencies as read back from the patched model)",
                factor=held.factor(),
            )
            drawn.append("tune-factors.png")
    return drawn


def passkey_section(run_dir: Path, tune: dict[str, Any]) -> tuple[str, Printed | None]:
    """tune.md's check by generation (--passkey): passkeys found per method in the nested passkey run, or ''."""
    name = tune.get("passkey_dir")
    rows_file = Path(run_dir) / str(name) / ROWS_FILE if name else None
    if rows_file is None or not rows_file.is_file():
        return ("\n- the check by generation (`" + str(name) + "`) is missing or unreadable\n" if name else ""), None
    found: dict[str, list[int]] = {}
    lengths: set[int] = set()
    for r in read_rows(rows_file):
        if r.get("status", "ok") == "ok" and r.get("correct") is not None:
            found.setdefault(str(r["label"]), []).append(int(r["correct"]))
            lengths.add(int(r["length"]))
    headers = ["method", "passkeys found", "accuracy"]
    rows = [[label, f"{sum(v)} / {len(v)}", f"{sum(v) / len(v):.0%}"] for label, v in found.items()]
    caption = (
        f"The check by generation: YaRN's passkey test (eval/passkey.py's prompts and scoring) at "
        f"{', '.join(fmt_length(n) for n in sorted(lengths))}, the same keys and positions for every method; from "
        f"{name}/ (`ctxeval report {name}` draws it)."
    )
    return "\n## Passkey at the target\n\n" + caption + "\n\n" + markdown(headers, rows), Printed(
        "passkey at the target: the check by generation", caption, headers, rows
    )


def render_tune(run_dir: Path) -> RunOutputs:
    """tune.md, trials.csv and the figures in the run directory; returns the tables the command prints."""
    run_dir = Path(run_dir)
    s = read_tune(run_dir)
    if isinstance(s.tune.get("families"), list):
        return render_families(s)
    spec, tune, winner, held = s.spec, s.tune, s.winner, s.heldout
    short, target = s.short or 0, s.target or 0
    baseline, tolerance = tune.get("baseline_short"), spec.get("short_tolerance")
    guard = baseline * (1 + tolerance) if baseline is not None and tolerance is not None else None
    md = [
        f"# Tune: {spec.get('method')} on {spec.get('model')}, target {fmt_length(target)}\n\n",
        "".join(f"- {line}\n" for line in search_lines(s, guard)),
    ]
    printed, notes = [], []
    md.append("\n## Winner\n\n")
    if winner:
        rise = winner["ppl_short"] / baseline - 1 if baseline else math.nan
        md.append(
            f"Trial {winner['trial']}: `{winner['label']}`\n\n- parameters: "
            f"{fmt_params(winner.get('params'))}\n- tuning documents: perplexity {winner['ppl_target']:.2f} at "
            f"{fmt_length(target)}, {winner['ppl_short']:.2f} at {fmt_length(short)} ({fmt_rise(rise)} over "
            "plain RoPE)\n"
        )
    else:
        closest = min((r for r in s.trials if is_ok(r)), key=lambda r: float(r["short_rise"]), default=None)
        line = (
            "No trial kept the guard: nothing was re-measured on held-out documents or exported (raise "
            "--short-tolerance or --trials)."
            + (
                f" Closest: trial {closest['trial']}, {fmt_rise(closest['short_rise'])} at {fmt_length(short)}."
                if closest
                else ""
            )
        )
        md.append(line + "\n")
        notes.append(line)
    if held is not None:
        headers, rows = heldout_cells(held)
        caption = (
            f"Token-weighted perplexity, exp(summed NLL / tokens), on {len(held.docs)} held-out document(s) "
            f"({', '.join(held.docs)}) the search never saw: the winner ({WINNER_MARK}) against plain RoPE, "
            f"PI, NTK and YaRN at the same factor, the method's defaults and --compare; from {held.path.name}/."
        )
        md += ["\n## Held-out documents\n\n", caption + "\n\n", markdown(headers, rows)]
        printed.append(Printed("held-out documents: the winner against the other methods", caption, headers, rows))
    elif winner and s.record.get("family_of"):
        md.append(
            "\n- held out beside the other methods' winners: the search across methods' tune.md, one directory up\n"
        )
    elif winner:
        note = (
            f"the winner's held-out run ({tune.get('heldout_dir') or 'not started'}) is missing or unreadable: "
            "no held-out table"
        )
        md.append(f"\n- {note}\n")
        notes.append(note)
    section, table = passkey_section(run_dir, tune)
    md.append(section)
    printed += [table] if table else []
    if isinstance(tune.get("export"), dict):
        md.append(export_section(tune["export"]))
    headers, rows = top_cells(s.trials, short, target)
    title = f"the {len(rows)} best trial(s) that kept the guard (tuning documents)"
    md += [
        f"\n## The best trials\n\nThe {len(rows)} lowest perplexities at {fmt_length(target)} among the trials "
        "that kept the guard; every trial is in trials.csv.\n\n",
        markdown(headers, rows) if rows else "none\n",
    ]
    if rows:
        printed.append(Printed(title, None, headers, rows))
    save_csv(trials_frame(s.trials), run_dir / "trials.csv", index=False, float_format="%.6g")
    drawn = draw(s, guard, run_dir)
    captions = {
        "tune-objective.png": "Perplexity at the target by trial, with the best so far",
        "tune-pareto.png": "Perplexity at the trained length against the target, the Pareto front, the guard",
        "tune-factors.png": "The winner's per-pair scale against PI, NTK and YaRN",
    }
    if drawn:
        md.append("\n## Figures\n\n" + "".join(f"![{captions[name]}]({name})\n\n" for name in drawn))
    save_text(run_dir / "tune.md", "".join(md).rstrip("\n") + "\n")
    return RunOutputs(printed, f"wrote {run_dir}/tune.md, trials.csv" + "".join(f", {n}" for n in drawn), notes)


# ---------------------------------------------------------------------------------------------------------------
# a search across several methods (`ctxeval tune -m yarn -m ntk -m longrope`)


def doc_ppl(held: Heldout) -> dict[tuple[str, str], float]:
    """(label, document) -> perplexity at the target in the held-out run (the last row written wins)."""
    out = {}
    for row in read_rows(held.path / ROWS_FILE, "ppl"):
        if row.get("length") == held.target and row.get("status") == "ok" and row.get("n_tokens"):
            out[(str(row["label"]), str(row["doc"]))] = math.exp(float(row["nll_sum"]) / float(row["n_tokens"]))
    return out


def family_cells(subs: list[TuneSummary]) -> tuple[list[str], list[list[str]]]:
    """Per method searched: its trials and its winner on the tuning documents."""
    first = subs[0]
    short, target = fmt_length(first.short or 0), fmt_length(first.target or 0)
    headers = [
        "method",
        "sampler",
        "trials",
        "kept guard",
        f"best ppl at {target}",
        f"at {short}",
        "winner (as searched)",
    ]
    rows = []
    for sub in subs:
        counts, winner = sub.counts(), sub.winner
        rows.append(
            [
                str(sub.spec.get("method")),
                str(sub.tune.get("sampler") or sub.spec.get("sampler")),
                str(counts["counted"]),
                str(counts["feasible"]),
                fmt_ppl(winner["ppl_target"]) if winner else "none kept it",
                fmt_ppl(winner["ppl_short"]) if winner else "—",
                fmt_params(next((r.get("params") for r in sub.trials if winner and r["trial"] == winner["trial"]), {}))
                if winner
                else "—",
            ]
        )
    return headers, rows


def ranked_cells(held: Heldout, tuned: set[str]) -> tuple[list[str], list[list[str]]]:
    """Every re-measured method ranked by held-out perplexity at the target, each document's perplexity beside it and
    its difference from the overall winner per document (the spread a ranking must exceed)."""
    per_doc = doc_ppl(held)
    headers = [
        "rank",
        "method",
        f"ppl at {fmt_length(held.short)}",
        f"ppl at {fmt_length(held.target)}",
        *[f"{doc} at {fmt_length(held.target)}" for doc in held.docs],
        "vs winner, per document",
    ]
    order = sorted(held.labels, key=lambda label: (held.value(label, held.target) or math.inf, label))
    rows = []
    for i, label in enumerate(order, 1):
        name = f"{WINNER_MARK} {label} (tuned)" if label in tuned else label
        versus = [
            fmt_rise(per_doc[(label, d)] / per_doc[(held.winner, d)] - 1)
            for d in held.docs
            if (label, d) in per_doc and (held.winner, d) in per_doc
        ]
        rows.append(
            [
                str(i),
                name,
                *[fmt_ppl(held.ppl.get((label, L), math.nan), held.status.get((label, L), "missing"))
                  for L in (held.short, held.target)],
                *[fmt_ppl(per_doc.get((label, d), math.nan)) for d in held.docs],
                "—" if label == held.winner else " / ".join(versus) or "—",
            ]
        )  # fmt: skip
    return headers, rows


def render_families(s: TuneSummary) -> RunOutputs:
    """tune.md of a search across several methods: each method's search (its own tune.md in its directory), the
    winners on the tuning documents, and every winner ranked on the held-out documents against plain RoPE, the
    methods' defaults, PI, NTK and YaRN."""
    run_dir, tune, spec = s.run_dir, s.tune, s.spec
    subs = [read_tune(run_dir / f["dir"]) for f in tune["families"] if (run_dir / f["dir"] / RUN_FILE).is_file()]
    for sub in subs:
        render_tune(sub.run_dir)
    target = fmt_length(int(spec.get("target") or 0))
    shares = [sub.counts()["counted"] for sub in subs]
    methods = ", ".join(str(m) for m in spec.get("methods") or [])
    md = [
        f"# Tune: which method on {spec.get('model')}, target {target}\n\n",
        f"- methods searched: {methods}, one budget of {sum(shares)} measured trials split "
        f"{' / '.join(str(t) for t in shares)}; each method's search is in its directory "
        f"({', '.join(f'[{sub.run_dir.name}]({sub.run_dir.name}/tune.md)' for sub in subs)})\n",
        f"- objective, guard and documents as each search's tune.md gives them; sampler {spec.get('sampler')}, "
        f"seed {spec.get('seed')}\n",
        f"- compute: {sum(int(r.get('forwards') or 0) for sub in subs for r in sub.trials):,} forwards, "
        f"{sum(float(r.get('seconds') or 0) for sub in subs for r in sub.trials):.1f} s summed over the trials\n",
    ]
    printed, notes = [], []
    headers, rows = family_cells(subs) if subs else ([], [])
    if rows:
        md += ["\n## Each method's winner (tuning documents)\n\n", markdown(headers, rows)]
        printed.append(Printed("each method's winner on the tuning documents", None, headers, rows))
    winner = tune.get("winner")
    if isinstance(winner, dict):
        md.append(
            f"\nWinner of them all (the lowest tuning perplexity; the held-out documents judge it, they do not choose "
            f"it): `{winner['label']}` from {winner.get('family')}.\n"
        )
    held = s.heldout
    if held is not None:
        tuned = {sub.winner["label"] for sub in subs if sub.winner}
        headers, rows = ranked_cells(held, tuned)
        caption = (
            f"Token-weighted perplexity on {len(held.docs)} held-out document(s) ({', '.join(held.docs)}) no search "
            f"saw, ranked at {target}: each method's winner ({WINNER_MARK}) against plain RoPE, the methods' "
            f"defaults, PI, NTK and YaRN at the same factor and --compare; per document, each method's difference "
            f"from the winner of them all; from {held.path.name}/."
        )
        md += ["\n## Held-out documents\n\n", caption + "\n\n", markdown(headers, rows)]
        printed.append(Printed("held-out documents: every method's winner, ranked", caption, headers, rows))
    elif isinstance(winner, dict):
        note = f"the held-out run ({tune.get('heldout_dir') or 'not started'}) is missing or unreadable"
        md.append(f"\n- {note}\n")
        notes.append(note)
    section, table = passkey_section(run_dir, tune)
    md.append(section)
    printed += [table] if table else []
    if isinstance(tune.get("export"), dict):
        md.append(export_section(tune["export"]))
    drawn = []
    if subs:
        curves = {str(sub.spec.get("method")): best_so_far_measured(sub.trials) for sub in subs}
        plot_families(curves, int(spec.get("target") or 0), run_dir / "tune-methods.png",
                      f"Which method: {spec.get('model')}, target {target}\nbest tuning perplexity so far (kept the "
                      "guard) by each method's measured trials")  # fmt: skip
        drawn.append("tune-methods.png")
        md.append("\n## Figures\n\n![Each method's best so far by its measured trials](tune-methods.png)\n")
    save_text(run_dir / "tune.md", "".join(md).rstrip("\n") + "\n")
    return RunOutputs(printed, f"wrote {run_dir}/tune.md" + "".join(f", {n}" for n in drawn), notes)


def best_so_far_measured(trials: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(measured trials so far, the lowest target ppl among them that kept the guard), from the first such trial."""
    out, best, count = [], math.inf, 0
    for row in sorted(trials, key=lambda r: int(r["trial"])):
        if not is_ok(row):
            continue
        count += 1
        if is_feasible(row):
            best = min(best, float(row["value"]))
        if best < math.inf:
            out.append((count, best))
    return out
