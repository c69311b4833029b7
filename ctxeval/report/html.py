"""`ctxeval report --html FILE`: the report as one self-contained HTML page. Every table of every group, sortable by
clicking a column header (a few lines of inline JavaScript, numeric columns sorted by their raw values, missing
cells last either way); every figure `write_plots` draws (drawn to fit the page's column), embedded as a base64
PNG, captioned with what it shows and its group's protocol, never shrunk below 3/4 of its size (it scrolls sideways
instead) and shown at full size over the page on a click; the captions, footnotes and notes; and each run's provenance from its run.json (command, spec, model, methods with their read-back checks,
environment, sessions). Nothing is loaded from anywhere: no external CSS, scripts, fonts or images, so the file can be
mailed, archived or opened offline. Every string from a run or a table is escaped."""

from __future__ import annotations

import base64
import html
import json
import os
import shlex
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, version
from importlib.resources import files
from pathlib import Path
from typing import Any, Iterable

from ..errors import CtxevalError
from ..runs.rows import UNIFORM_LABEL, UNIFORM_MODEL, fmt_length
from ..runs.store import RUN_FILE, now_utc
from ..util.textfiles import write_text
from .merged import Report
from .render import group_figures, heading, write_plots
from .runs import Group, Run
from .tables import Table, number

STATUS_TITLES = {
    "missing": "not measured",
    "oom": "out of memory",
    "skipped": "skipped",
    "beyond positions": "past the model's learned positions: it has none for this length",
    "none": "no length reaches the threshold",
    "no key tokens": "no key tokens",
    "n/a": "not applicable or not recorded",
}


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


# -- tables ------------------------------------------------------------------------------------------------------


def is_number(value: Any) -> bool:
    """A sortable number (int, float, numpy scalar; not a bool, not NaN)."""
    if value is None or isinstance(value, (str, bytes, bool)):
        return False
    try:
        return number(value) is not None
    except (TypeError, ValueError):
        return False


def css_token(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in str(text).lower())


def sortable_table(
    table_id: str,
    headers: list[str],
    raw: list[list[Any]],
    shown: list[list[str]],
    status: list[list[str | None]] | None = None,
    row_classes: list[str] | None = None,
    html_cells: list[list[str]] | None = None,
    css_class: str = "data",
    wrap_columns: Iterable[int] = (),
) -> str:
    """A table whose headers sort it: `raw` gives the sort keys (None = missing: shown as the `shown` string, with
    the class `missing` and its status, and sorted last), `shown` the text, `html_cells` (already escaped) replaces
    the text where given; `wrap_columns` may wrap their text (the others stay on one line)."""
    wrap = set(wrap_columns)
    numeric = [any(is_number(row[c]) for row in raw) for c in range(len(headers))]
    head = "".join(
        f'<th scope="col" tabindex="0" aria-sort="none" data-type="{"num" if numeric[c] else "text"}">{esc(h)}</th>'
        for c, h in enumerate(headers)
    )
    body = []
    for i, (values, texts) in enumerate(zip(raw, shown)):
        cells = []
        for c, (value, text) in enumerate(zip(values, texts)):
            st = status[i][c] if status else None
            inner = html_cells[i][c] if html_cells and html_cells[i][c] is not None else esc(text)
            extra = " wrap" if c in wrap else ""
            if value is None or (numeric[c] and not is_number(value)):
                st = st or "missing"
                cells.append(
                    f'<td class="missing st-{css_token(st)}{extra}" title="{esc(STATUS_TITLES.get(st, st))}">'
                    f"{inner}</td>"
                )
            elif numeric[c] and is_number(value):
                cells.append(f'<td class="num{extra}" data-v="{esc(repr(number(value)))}">{inner}</td>')
            else:
                cells.append(f'<td class="id{extra}" data-v="{esc(value)}">{inner}</td>')
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        body.append(f'<tr data-i="{i}"{cls}>{"".join(cells)}</tr>')
    return (
        f'<div class="scroll"><table id="{esc(table_id)}" class="sortable {css_class}">'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>\n"
    )


def table_html(table: Table) -> str:
    """One report table: raw values sort it, `cells` (the markdown's strings) are what it shows."""
    reference = ["reference" if row[:2] == [UNIFORM_MODEL, UNIFORM_LABEL] else "" for row in table.rows]
    raw = [[v if c < 2 else (number(v) if is_number(v) else None) for c, v in enumerate(row)] for row in table.rows]
    return sortable_table(table.id, table.headers, raw, table.cells, table.status, reference)


# -- figures -----------------------------------------------------------------------------------------------------


def data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def figure_html(key: str, path: Path, caption: str, protocol: str | None = None) -> str:
    """One embedded figure: `caption` (short: also its alt text) and the group's `protocol` under it."""
    note = f' <span class="fig-protocol">Protocol: {esc(protocol)}.</span>' if protocol else ""
    return (
        f'<figure id="fig-{esc(key)}"><img alt="{esc(caption)}" src="{data_uri(path)}">'
        f"<figcaption>{esc(caption)}.{note}</figcaption></figure>\n"
    )


# -- provenance (run.json) ---------------------------------------------------------------------------------------


def compact(value: Any) -> str:
    """A run.json value on one line: strings as they are, numbers short, the rest as compact JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        return f"{value:.3g}" if value and abs(value) < 1e-3 else f"{value:g}"
    if isinstance(value, dict) and value and all(not isinstance(v, (dict, list)) for v in value.values()):
        return ", ".join(f"{k}={compact(v)}" for k, v in value.items() if v is not None) or "{}"
    return json.dumps(value, ensure_ascii=False, default=str, separators=(", ", ": "))


def command_of(argv: Any) -> str | None:
    """run.json's environment.argv as the command line it was ("ctxeval ..." for the console script)."""
    if not isinstance(argv, list) or not argv:
        return None
    first = Path(str(argv[0])).name
    head = ["ctxeval"] if first in ("ctxeval", "__main__.py") else [str(argv[0])]
    return shlex.join(head + [str(a) for a in argv[1:]])


def call(name: Any, params: Any) -> str:
    """An attention method as `name(key=value, ...)`, or `name` alone without parameters."""
    items = params.items() if isinstance(params, dict) else ()
    args = ", ".join(f"{k}={compact(v)}" for k, v in items if v is not None)
    return f"{name}({args})" if args else str(name)


def kv_table(pairs: Iterable[tuple[str, Any]]) -> str:
    """(key, value) pairs as a compact grid of `key value` items (several per line; a long value gets a line)."""
    items = []
    for key, value in pairs:
        text = compact(value)
        wide = ' class="wide"' if len(text) > 70 else ""
        items.append(f'<div{wide}><span class="k">{esc(key)}</span><span class="v">{esc(text)}</span></div>')
    return f'<div class="kv">{"".join(items)}</div>' if items else ""


def flat(record: dict[str, Any], skip: Iterable[str] = ()) -> list[tuple[str, Any]]:
    """A dict as (key, value) rows, nested dicts one level down as `key.sub`."""
    skip = set(skip)
    out: list[tuple[str, Any]] = []
    for key, value in record.items():
        if key in skip:
            continue
        if isinstance(value, dict) and value and any(isinstance(v, (dict, list)) for v in value.values()):
            out += [(f"{key}.{k}", v) for k, v in value.items()]
        else:
            out.append((key, value))
    return out


def sci(value: Any) -> str:
    value = number(value)
    return "—" if value is None else f"{value:.2e}"


def _listed(value: Any) -> list[Any]:
    """A run.json value that ctxeval writes as a list; anything else (a hand-edited file) as an empty list."""
    return value if isinstance(value, list) else []


def methods_html(methods: dict[str, Any], table_id: str) -> str:
    """run.json's methods: parameters, the RoPE read-back check (methods[label].effective: the worst max_rel_diff
    over the lengths it was checked at, the attention factor set / read back) and the attention check of attention
    methods (methods[label].attention_check). Fields every method shares (geometry, rotary modules, ...) are
    listed once under the table."""
    records = {label: m if isinstance(m, dict) else {"value": m} for label, m in methods.items()}
    records = {  # the measured q scale by its one-line summary, not its per-layer lists
        label: {**m, "query_scale": m["query_scale"].get("summary")} if isinstance(m.get("query_scale"), dict) else m
        for label, m in records.items()
    }
    own = {"method", "params", "length_dependent", "effective", "attention_methods", "attention_check"}
    others = list(dict.fromkeys(k for m in records.values() for k in m if k not in own))
    common = [
        k for k in others if len({json.dumps(m.get(k), sort_keys=True, default=str) for m in records.values()}) == 1
    ]
    varying = [k for k in others if k not in common]
    headers = [
        "label",
        "method",
        "params",
        "length-dependent",
        "RoPE read-back (max rel diff)",
        "attention factor (set / read back)",
        "attention methods",
        "attention check (max abs diff)",
        *varying,
    ]
    raw, shown, status = [], [], []
    for label, m in records.items():
        eff = [e for e in _listed(m.get("effective")) if isinstance(e, dict)]
        diffs = [d for d in (number(e.get("max_rel_diff")) for e in eff) if d is not None]
        worst = max(diffs) if diffs else None
        lengths = [int(e["length"]) for e in eff if number(e.get("length")) is not None]
        where = (
            f" over {len(lengths)} lengths ({fmt_length(min(lengths))}-{fmt_length(max(lengths))})"
            if len(lengths) > 1
            else f" at {fmt_length(lengths[0])}"
            if lengths
            else ""
        )
        factors = sorted(
            {
                (float(e["attention_factor"]), float(e["attention_factor_readback"]))
                for e in eff
                if number(e.get("attention_factor")) is not None
                and number(e.get("attention_factor_readback")) is not None
            }
        )
        factor = "; ".join(f"{a:.4g} / {b:.4g}" for a, b in factors) if factors else "—"
        attn = "; ".join(
            call(a.get("name"), a.get("params")) if isinstance(a, dict) else str(a)
            for a in _listed(m.get("attention_methods"))
        )
        check = m.get("attention_check")
        check_diff = number(check.get("max_abs_diff_vs_reference")) if isinstance(check, dict) else None
        check_text = (
            f"{sci(check_diff)} ({check.get('layers_running_it')} layers, {check.get('probe_tokens')} probe tokens)"
            if isinstance(check, dict)
            else compact(check)
            if check is not None
            else "—"
        )
        length_dep = m.get("length_dependent")
        params = compact(m.get("params")) if m.get("params") else ""
        raw.append(
            [
                label,
                str(m.get("method")),
                params,
                str(length_dep),
                worst,
                factor if factors else None,
                attn or None,
                check_diff if isinstance(check, dict) else (compact(check) if check else None),
                *(compact(m.get(k)) if k in m else None for k in varying),
            ]
        )
        shown.append(
            [
                label,
                str(m.get("method", "—")),
                params or "—",
                "yes" if length_dep else "no" if length_dep is not None else "—",
                (sci(worst) + where) if worst is not None else "not recorded",
                factor,
                attn or "—",
                check_text,
                *(compact(m.get(k)) if k in m else "—" for k in varying),
            ]
        )
        status.append([None] * 4 + ["missing"] + ["n/a"] * (3 + len(varying)))
    table = sortable_table(
        table_id, headers, raw, shown, status, css_class="methods", wrap_columns={2, 6, 7, *range(8, 8 + len(varying))}
    )
    shared = "; ".join(f"{k}: {compact(records[next(iter(records))].get(k))}" for k in common)
    return table + (
        f'<p class="common">{"every method: " if len(records) > 1 else ""}{esc(shared)}</p>' if shared else ""
    )


def run_details(run: Run, anchor: str, group: Group | None) -> str:
    record = run.record
    env = record.get("environment") if isinstance(record.get("environment"), dict) else {}
    command = command_of(env.get("argv"))
    started, finished = record.get("started"), record.get("finished")
    parts = [
        f'<details class="run" id="{esc(anchor)}"><summary><code>{esc(run.name)}</code> '
        f'<span class="tag">{esc(run.task)}</span> <span class="status st-{css_token(run.status)}">'
        f'{esc(run.status)}</span> <span class="meta">{esc(", ".join(run.models))} · {len(run.rows)} rows · '
        f"{esc(started or '?')} → {esc(finished or '…')}"
        + (f' · <a href="#group-{esc(group.id)}">{esc(group.id)}</a>' if group else "")
        + "</span></summary>"
    ]
    parts.append(
        f'<div class="label">command</div><pre class="cmd">{esc(command)}</pre>'
        if command
        else '<p class="meta">command: not recorded</p>'
    )
    distributed = record.get("distributed") if isinstance(record.get("distributed"), dict) else {}
    facts = [
        ("status", run.status),
        ("started", started),
        ("finished", finished),
        ("error", record.get("error")),
        ("git commit", env.get("git_commit") or "not recorded"),
        *((f"distributed.{k}", v) for k, v in distributed.items()),
    ]
    if "seed" in record:
        facts.append(("seed", record["seed"]))
    parts.append(kv_table(facts))
    versions = env.get("versions") if isinstance(env.get("versions"), dict) else {}
    env_rows = [("libraries", " · ".join(f"{k} {v}" for k, v in versions.items() if v) or "not recorded")]
    env_rows += [(k, v) for k, v in env.items() if k not in ("versions", "argv", "git_commit")]
    parts.append('<div class="label">environment</div>' + kv_table(env_rows))
    if isinstance(record.get("spec"), dict):
        parts.append('<div class="label">spec</div>' + kv_table(flat(record["spec"])))
    if isinstance(record.get("model"), dict):
        parts.append('<div class="label">model</div>' + kv_table(flat(record["model"])))
    if isinstance(record.get("methods"), dict) and record["methods"]:
        parts.append(
            '<div class="label">methods (RoPE read back from the patched model)</div>'
            + methods_html(record["methods"], f"{anchor}-methods")
        )
    handled = {
        "status",
        "started",
        "finished",
        "error",
        "environment",
        "distributed",
        "seed",
        "spec",
        "model",
        "methods",
        "history",
    }
    for key, value in record.items():
        if key in handled:
            continue
        parts.append(
            f'<div class="label">{esc(key)}</div>'
            + (kv_table(flat(value)) if isinstance(value, dict) else kv_table([(key, value)]))
        )
    history = [h for h in _listed(record.get("history")) if isinstance(h, dict)]
    if history:
        rows = []
        for i, h in enumerate(history, 1):
            h_env = h.get("environment") if isinstance(h.get("environment"), dict) else {}
            h_cmd = command_of(h_env.get("argv"))
            rows.append(
                f"<tr><td>{i}</td><td>{esc(h.get('status'))}</td><td>{esc(h.get('started'))}</td>"
                f"<td>{esc(h.get('finished'))}</td><td>{esc(h_env.get('git_commit') or '—')}</td>"
                f"<td>{esc(h.get('error') or '—')}</td>"
                f"<td>{esc('same' if h_cmd == command else h_cmd or '—')}</td></tr>"
            )
        parts.append(
            f'<div class="label">sessions ({len(history)})</div><div class="scroll"><table class="history">'
            "<thead><tr><th>#</th><th>status</th><th>started</th><th>finished</th><th>git commit</th>"
            f"<th>error</th><th>command</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
        )
    parts.append("</details>\n")
    return "".join(parts)


# -- the page ----------------------------------------------------------------------------------------------------


# The page's style sheet and script are package data (ctxeval/report/assets/), inlined into every page. The
# script sorts a table when its header is clicked: ascending, descending, then the report's own order. Numeric
# columns compare the raw values (data-v), text columns compare naturally ("factor=16" after "factor=2"); cells
# without data-v (missing, OOM, skip) go last in both directions; ties keep the report's order. It also enlarges a
# clicked figure over the page.
ASSETS = files("ctxeval.report") / "assets"


def asset(name: str) -> str:
    """The text of one file of ctxeval/report/assets/ (report.css, report.js)."""
    return (ASSETS / name).read_text(encoding="utf-8")


def group_of(rep: Report, run: Run) -> Group | None:
    return next((g for g in rep.groups if any(r is run for r in g.runs)), None)


def to_html(rep: Report, images: dict[str, Path] | None = None, generated: dict[str, Any] | None = None) -> str:
    """The whole report as one HTML page; `images` (write_plots' keys -> PNG files) are embedded as data URIs.
    `generated` (command, time, version) goes into the footer."""
    images = dict(images or {})
    anchors = {id(run): f"run-{i + 1}" for i, run in enumerate(rep.runs)}
    out = [
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>ctxeval report: {esc(', '.join(g.short_title for g in rep.groups) or 'no tables')}</title>\n"
        f"<style>\n{asset('report.css')}</style>\n</head>\n<body>\n<main>\n<h1>ctxeval report</h1>\n"
    ]
    out.append(
        f'<p class="meta">{len(rep.runs)} run(s), {len(rep.groups)} group(s), {len(rep.tables)} table(s). '
        f"Needle / passkey threshold {rep.threshold:g}; valid-length tolerance {rep.tolerance:.0%}; "
        f"ppl aggregate: {esc(rep.aggregate or 'each run its own')}. Built from each run's rows.jsonl; "
        "nothing was measured.</p>\n"
    )
    legend = "".join(
        f'<span><span class="cell missing st-{st}">{esc(text)}</span> {esc(STATUS_TITLES[st])}</span>'
        for st, text in (("missing", "—"), ("oom", "OOM"), ("skipped", "skip"))
    )
    out.append(
        '<p class="legend meta">Click a column header to sort (again: descending; a third time: the '
        f"report's order); cells without a value sort last. Click a figure to see it at full size. {legend}"
        "</p>\n"
    )
    toc = [
        f'<a href="#group-{esc(g.id)}"><b>{esc(g.short_title)}</b>{esc(heading(g)[len(g.short_title) :])}</a>'
        if heading(g).startswith(g.short_title)
        else f'<a href="#group-{esc(g.id)}">{esc(heading(g))}</a>'
        for g in rep.groups
    ]
    toc.append('<a href="#runs">Runs and their provenance</a>')
    out.append(f'<nav class="toc">{"".join(toc)}</nav>\n')

    run_raw, run_shown, run_cells = [], [], []
    for run in rep.runs:
        group = group_of(rep, run)
        gid = group.id if group else "—"
        run_raw.append([run.name, run.task, ", ".join(run.models), run.status, len(run.rows), gid])
        run_shown.append([run.name, run.task, ", ".join(run.models), run.status, str(len(run.rows)), gid])
        run_cells.append(
            [
                f'<a href="#{anchors[id(run)]}"><code>{esc(run.name)}</code></a>',
                None,
                None,
                None,
                None,
                f'<a href="#group-{esc(gid)}">{esc(gid)}</a>' if group else None,
            ]
        )
    out.append(
        sortable_table(
            "runs-overview",
            ["run", "task", "model", "status", "rows", "table"],
            run_raw,
            run_shown,
            html_cells=run_cells,
            css_class="data overview",
        )
    )
    if rep.notes:
        out.append('<ul class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in rep.notes) + "</ul>\n")

    shown_images: set[str] = set()
    for group in rep.groups:
        out.append(f'<section class="group" id="group-{esc(group.id)}">\n<h2>{esc(heading(group))}</h2>\n')
        runs = ", ".join(f'<a href="#{anchors[id(r)]}"><code>{esc(r.name)}</code></a>' for r in group.runs)
        out.append(f'<p class="protocol">Protocol: {esc(group.description)}. Runs: {runs}.</p>\n')
        for i, table in enumerate(group.tables):
            if i:
                out.append(f'<h3 id="title-{esc(table.id)}">{esc(table.title)}</h3>\n')
            if table.caption:
                out.append(f'<p class="caption">{esc(table.caption)}</p>\n')
            out.append(table_html(table))
            out += [f'<p class="footnote">{esc(f)}</p>\n' for f in table.footnotes]
        if group.notes:
            out.append('<ul class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in group.notes) + "</ul>\n")
        for key, path, caption in group_figures(group, images):
            out.append(figure_html(key, path, caption, group.description))
            shown_images.add(key)
        out.append("</section>\n")
    rest = [k for k in images if k not in shown_images]
    if rest:
        out.append(
            '<section id="other-figures"><h2>Other figures</h2>\n'
            + "".join(figure_html(k, images[k], k) for k in rest)
            + "</section>\n"
        )

    out.append(
        '<section id="runs">\n<h2>Runs and their provenance</h2>\n<p class="meta">From each run\'s run.json: '
        "the command, spec, model, the methods with the RoPE frequencies read back from the patched model "
        "(and the attention check of attention methods), library versions and git commit, and every session "
        "that wrote to the run.</p>\n"
    )
    out += [run_details(run, anchors[id(run)], group_of(rep, run)) for run in rep.runs]
    out.append("</section>\n")
    if generated:
        out.append(
            "<footer>Generated by ctxeval "
            + esc(generated.get("version") or "")
            + (f" at {esc(generated['time'])}" if generated.get("time") else "")
            + (f": <code>{esc(generated['command'])}</code>" if generated.get("command") else "")
            + "</footer>\n"
        )
    out.append(f"</main>\n<script>\n{asset('report.js')}</script>\n</body>\n</html>\n")
    return "".join(out)


def check_html_path(path: Path | str, out: Path | str | None = None) -> Path:
    """--html's file: not a directory, not inside a run directory, in a directory that exists (or is the --out
    directory, which the report creates first). A CtxevalError (one line) otherwise."""
    path = Path(path)
    if path.is_dir():
        raise CtxevalError(f"--html {path} is a directory; give the file to write, e.g. {path / 'report.html'}")
    if out is not None and path.resolve() == Path(out).resolve():
        raise CtxevalError(f"--html {path} is the --out directory; give a file, e.g. {path / 'report.html'}")
    parent = path.parent
    creates = out is not None and parent.resolve() == Path(out).resolve()
    blocker = next((p for p in [parent, *parent.parents] if p.exists() and not p.is_dir()), None)
    if blocker is not None:  # parent, or a folder above it, is a file: the real reason the folder cannot exist
        raise CtxevalError(f"--html {path}: {blocker} is a file, not a directory; choose another path")
    if not parent.exists() and not creates:
        raise CtxevalError(f"--html {path}: directory {parent} does not exist; create it or choose another path")
    if (parent / RUN_FILE).exists():
        raise CtxevalError(
            f"--html {path} is inside a run directory ({parent} holds run.json); write the report elsewhere"
        )
    if parent.exists():  # a file written and removed: what the system says (permission, read-only, full disk)
        try:
            fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=parent)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise CtxevalError(
                f"--html {path}: cannot write in {parent} ({exc.strerror or type(exc).__name__}); choose another path"
            ) from None
    return path


def write_html(rep: Report, path: Path | str) -> Path:
    """Draw the report's figures into a temporary directory and write the page with them embedded."""
    path = check_html_path(path)
    try:
        ctxeval_version = version("ctxeval")
    except PackageNotFoundError:
        ctxeval_version = ""
    generated = {"command": "ctxeval " + shlex.join(sys.argv[1:]), "time": now_utc(), "version": ctxeval_version}
    with tempfile.TemporaryDirectory(prefix="ctxeval-html-") as tmp:
        names = write_plots(rep, Path(tmp))
        page = to_html(rep, {key: Path(tmp) / name for key, name in names.items()}, generated)
    return write_text(path, page, "--html")
