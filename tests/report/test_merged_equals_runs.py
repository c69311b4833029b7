"""Issue 53: a merged report printed valid lengths of the wrong (model, method) when runs of different models and
length grids were merged (its rows were matched by position). The property here: every number of every merged
table (ppl, valid length, position encodings, LongPPL, positions, needle, passkey, entropy, RULER and its depth
tables, lm-eval, tune) equals the same number in the report of the run that measured it, alone; over every run
committed under results/ at once, and over synthetic runs whose models, methods and lengths interleave."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest

from ctxeval.report import merged
from ctxeval.report.kinds.ppl_run import render_ppl
from ctxeval.report.runs import Group, display_models
from ctxeval.report.tables import OWN_FAILS_AT, Table, own_valid_column
from ctxeval.runs.store import RunStore

from .run_dirs import ppl_run

REPO = Path(__file__).resolve().parents[2]
ID_COLUMNS = {"model", "method"}


def row_key(table: Table, row: list[Any], i: int) -> tuple[Any, ...]:
    """(model, method), and the length for a depth table (one row per length), the row's place for a tune table
    (one row per tune run, in the order of the runs)."""
    key = (str(row[0]), str(row[1]))
    return (*key, int(row[2])) if table.kind == "ruler-depth" else (*key, i) if table.kind == "tune" else key


def cells_by_key(tables: list[Table]) -> dict[tuple[str, tuple[Any, ...]], dict[str, tuple[Any, str]]]:
    """(table kind [task], row key) -> column -> (raw value, printed cell)."""
    out: dict[tuple[str, tuple[Any, ...]], dict[str, tuple[Any, str]]] = {}
    for table in tables:
        kind = f"{table.kind}:{table.task}" if table.task else table.kind
        for i, (row, shown) in enumerate(zip(table.rows, table.cells)):
            out[(kind, row_key(table, row, i))] = dict(zip(table.columns, zip(row, shown)))
    return out


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-12)
    return a == b or (a is None and isinstance(b, float) and math.isnan(b))


def measured_by(group: Group) -> dict[tuple[str, str], dict[int, set[Path]]]:
    """(display model, method) -> length -> the runs of the group that measured it there."""
    names = display_models(group)
    out: dict[tuple[str, str], dict[int, set[Path]]] = defaultdict(lambda: defaultdict(set))
    for run in group.runs:
        for row in run.rows:
            out[(names[(run.order, str(row["model"]))], str(row["label"]))][int(row["length"])].add(run.path)
    return out


def owner(group: Group, by: dict, kind: str, key: tuple[Any, ...], column: str) -> Path | None:
    """The one run whose number a merged cell must repeat, or None where two runs measured what the cell holds (the
    merge keeps one's point; a number derived over several lengths, such as a valid or effective length, rightly
    differs from either run's when two runs fill the lengths). A cell at one length is owned by the run that
    measured the pair there; any other cell by the run that measured the pair at every length."""
    if kind == "tune":  # one row per tune run, in the runs' order
        return sorted((r for r in group.runs if r.task == "tune"), key=lambda r: r.order)[key[2]].path
    lengths = by.get(key[:2], {})
    if kind.startswith("ruler-depth"):
        runs = lengths.get(int(key[2]), set())
    elif column.isdigit() and kind not in ("positions",):
        runs = lengths.get(int(column), set())
    else:
        runs = set().union(*lengths.values()) if lengths else set()
    return next(iter(runs)) if len(runs) == 1 else None


def compare_with_each_run(report: merged.Report) -> Counter:
    """Assert every merged cell one run owns equals that run's report alone; returns the cells compared by kind."""
    compared: Counter = Counter()
    alone_of: dict[Path, dict] = {}
    for group in report.groups:
        by = measured_by(group)
        for (kind, key), columns in cells_by_key(group.tables).items():
            sources = {"encodings": ["valid", "ppl"]}.get(kind, [kind])
            for column, (raw, shown) in columns.items():
                if column in ID_COLUMNS or column in ("position encoding", "trained length"):
                    continue
                path = owner(group, by, kind, key, column)
                if path is None:
                    continue
                if path not in alone_of:
                    alone = merged.build_report([path])
                    mine = [g for g in alone.groups if any(r.path == path for r in g.runs)]
                    alone_of[path] = cells_by_key([t for g in mine for t in g.tables])
                theirs = alone_of[path]
                mine = (*key[:2], 0) if kind == "tune" else key  # the run's own tune table has its row alone
                found = [
                    theirs[(s, mine)][column] for s in sources if (s, mine) in theirs and column in theirs[(s, mine)]
                ]
                if not found:  # a length only other runs measured: nothing of this run's may fill it
                    assert raw is None or (isinstance(raw, float) and math.isnan(raw)), (group.id, kind, key, column)
                    continue
                alone_raw, alone_shown = found[0]
                where = (
                    f"{group.id} {kind} {key} {column!r}: merged {raw!r} / {shown!r}, "
                    f"{path} alone {alone_raw!r} / {alone_shown!r}"
                )
                assert same(raw, alone_raw), where
                assert shown.rstrip("†") == alone_shown.rstrip("†"), where  # †: the merged grid starts shorter
                compared[kind.split(":")[0]] += 1
    return compared


def test_every_merged_table_of_the_committed_results_equals_each_runs_own_report(monkeypatch):
    monkeypatch.chdir(REPO)
    paths = sorted(str(p.relative_to(REPO)) + "/" for p in (REPO / "results").iterdir() if p.is_dir())
    report = merged.build_report(paths)
    kinds = {t.kind for t in report.tables}
    assert {"ppl", "valid", "encodings", "needle", "passkey", "ruler", "ruler-depth", "tune"} <= kinds
    compared = compare_with_each_run(report)
    assert set(compared) == kinds, set(kinds) - set(compared)  # every kind of table has cells one run owns
    assert sum(compared.values()) > 1500  # 1,651 on 2026-12-07


def test_the_committed_family_runs_merged_with_the_quickstart_keep_every_runs_own_valid_csv(monkeypatch):
    """The issue's own case: results/ppl-tiny-family/tiny* with results/ppl-tiny-quickstart gave 9 rows of the
    encodings table another row's valid length (tiny-alibi 1k against 2k, tiny-learned 256 against 128, ...)."""
    monkeypatch.chdir(REPO)
    family = sorted(p for p in (REPO / "results/ppl-tiny-family").iterdir() if (p / "run.json").exists())
    paths = [str(p.relative_to(REPO)) for p in family] + ["results/ppl-tiny-quickstart"]
    report = merged.build_report(paths)
    encodings = next(t for t in report.tables if t.kind == "encodings")
    valid = next(t for t in report.tables if t.kind == "valid")
    own = own_valid_column(report.tolerance)
    by_pair = {(r["model"], r["method"]): r for r in valid.records()}
    checked = 0
    for path in paths:
        csv = pd.read_csv(REPO / path / "valid.csv")
        model = json.loads((REPO / path / "run.json").read_text())["model"]["name"]
        for _, line in csv.iterrows():
            expected = None if pd.isna(line[own]) else int(line[own])
            for table in (encodings, valid):
                row = next(r for r in table.records() if (r["model"], r["method"]) == (model, line["method"]))
                if (model, line["method"]) in {("tiny", "none"), ("tiny", "yarn(beta_fast=4,beta_slow=0.25,factor=8)")}:
                    continue  # measured by both runs: the merge has the longer grid
                assert row[own] == expected, (table.kind, model, line["method"], row[own], expected)
                checked += 1
    assert by_pair[("tiny-sinusoidal", "none")][own] == 128  # 65.10 at 128, 118.70 at 256
    assert by_pair[("tiny-alibi", "none")][own] == 2048
    assert by_pair[("tiny-learned", "none")][own] == 128  # no position past 128: it fails at 256
    assert checked == 2 * 9  # 9 (model, method) pairs one run measured, in both tables


def _write(root: Path, name: str, model: str, encoding: str, ppl: dict, started: str, **kw: Any) -> Path:
    path = ppl_run(root, name, model=model, ppl=ppl, docs=("d1", "d2"), started=started, data="pydoc", **kw)
    record = json.loads((path / "run.json").read_text())
    record["model"]["position_encoding"] = encoding
    (path / "run.json").write_text(json.dumps(record))
    return path


def own_outputs(path: Path) -> pd.DataFrame:
    """The run's own valid.csv, written by the code that writes it at the end of `ctxeval ppl`."""
    record = json.loads((path / "run.json").read_text())
    store = RunStore(path, record["spec"])
    try:
        specs = [SimpleNamespace(label=label, name=label.split("(")[0]) for label in record["spec"]["methods"]]
        render_ppl(store, specs, 128, "token", 0.10, "t")  # the runs here are trained at 128
    finally:
        store.close()
    return pd.read_csv(path / "valid.csv")


@pytest.mark.parametrize("order", ["family first", "methods first"])
def test_merged_runs_of_different_models_methods_and_grids_print_each_runs_own_valid_length(tmp_path, order):
    """The issue's two commands in small: a family run (several models, one grid up to 2k) and a run of one of its
    models with other methods on another grid (128-1k); every valid length of the merged valid and encodings
    tables equals the run's own valid.csv, cell by cell, whichever run comes first on the command line."""
    grid = [64, 128, 256, 512, 1024, 2048]
    family = {
        "tiny": ("RoPE", [71.8, 74.9, 84.5, 114.9, 130.7, 149.7]),
        "tiny-alibi": ("ALiBi", [66.8, 76.4, 72.9, 75.9, 68.0, 68.5]),
        "tiny-nope": ("NoPE", [62.5, 78.2, 83.3, 106.6, 113.9, 130.5]),
        "tiny-sinusoidal": ("sinusoidal", [56.8, 65.1, 118.7, 200.4, 229.7, 269.8]),
    }
    runs = {}
    for i, (model, (encoding, values)) in enumerate(family.items()):
        runs[model] = _write(
            tmp_path,
            f"fam-{model}",
            model,
            encoding,
            {"none": dict(zip(grid, values))},
            f"2026-01-0{i + 2}T00:00:00+00:00",
        )
    runs["learned"] = _write(
        tmp_path, "fam-learned", "tiny-learned", "learned", {"none": {64: 62.5, 128: 71.4}}, "2026-01-07T00:00:00+00:00"
    )
    record = json.loads((runs["learned"] / "run.json").read_text())
    record["beyond_positions"] = [256, 512, 1024, 2048]
    (runs["learned"] / "run.json").write_text(json.dumps(record))
    methods = {
        "none": {128: 74.9, 256: 84.5, 512: 114.9, 1024: 130.7},
        "dca": {128: 74.9, 256: 76.0, 512: 80.0, 1024: 90.0},  # valid to 512 (90 > 82.4), fails at 1k
        "qscale-mistral": {128: 80.0, 256: 95.0, 512: 99.0, 1024: 99.0},  # fails at 256
        "ntk(factor=8)": {128: 85.0, 256: 80.5, 512: 90.0, 1024: 93.0},  # valid to the end: >= 1k
    }
    runs["methods"] = _write(tmp_path, "methods", "tiny", "RoPE", methods, "2026-01-01T00:00:00+00:00")
    names = list(runs)
    paths = [runs[n] for n in (names if order == "family first" else names[-1:] + names[:-1])]
    report = merged.build_report(paths)
    own = own_valid_column(0.10)
    tables = {t.kind: t for t in report.tables}
    compared = 0
    for path in runs.values():
        csv = own_outputs(path)
        model = json.loads((path / "run.json").read_text())["model"]["name"]
        for _, line in csv.iterrows():
            pair = (model, line["method"])
            if pair == ("tiny", "none"):
                continue  # both runs measured it
            expected = None if pd.isna(line[own]) else int(line[own])
            open_ended = pd.isna(line[OWN_FAILS_AT])
            for kind in ("valid", "encodings"):
                i = next(k for k, r in enumerate(tables[kind].rows) if (r[0], r[1]) == pair)
                column = tables[kind].columns.index(own)
                assert tables[kind].rows[i][column] == expected, (kind, pair)
                assert tables[kind].cells[i][column].startswith("≥") == (open_ended and expected is not None), (
                    kind,
                    pair,
                    tables[kind].cells[i][column],
                )
                compared += 1
    assert compared == 2 * 7
    valid = {(r["model"], r["method"]): r[own] for r in tables["valid"].records()}
    assert valid[("tiny-sinusoidal", "none")] == 128 and valid[("tiny-alibi", "none")] == 2048
    assert valid[("tiny-learned", "none")] == 128 and valid[("tiny", "qscale-mistral")] == 128
    assert valid[("tiny", "dca")] == 512 and valid[("tiny", "ntk(factor=8)")] == 1024
    assert sum(compare_with_each_run(report).values()) > 0


def test_every_figure_of_the_report_over_all_committed_results_draws(monkeypatch, tmp_path):
    """`ctxeval report results/*/ --html` ended in StopIteration (curve_styles ran out of spare colours); every
    figure of the report over everything committed is drawn here (not written: the drawing is what failed)."""
    import matplotlib.pyplot as plt

    from ctxeval.report import plots
    from ctxeval.report.render import write_plots

    drawn = []
    monkeypatch.setattr(plots, "save", lambda fig, path, tight=True: drawn.append(path) or plt.close(fig) or path)
    monkeypatch.chdir(REPO)
    paths = sorted(str(p.relative_to(REPO)) + "/" for p in (REPO / "results").iterdir() if p.is_dir())
    images = write_plots(merged.build_report(paths), tmp_path)
    assert len(drawn) >= 20 and images


def test_every_derived_length_of_the_merged_committed_report_follows_from_the_cells_it_prints(monkeypatch):
    """A number derived over several lengths (a valid length, an effective length) cannot be checked against one
    run where several runs fill the lengths; it is recomputed here, by brute force, from the cells the same merged
    table prints beside it: the ppl table for the valid lengths, the accuracy columns for the needle's."""
    monkeypatch.chdir(REPO)
    paths = sorted(str(p.relative_to(REPO)) + "/" for p in (REPO / "results").iterdir() if p.is_dir())
    report = merged.build_report(paths)
    checked = 0
    for group in report.groups:
        by_kind = {t.kind: t for t in group.tables}
        if "valid" in by_kind:
            ppl, valid = by_kind["ppl"], by_kind["valid"]
            own = own_valid_column(report.tolerance)
            lengths = [int(c) for c in ppl.columns[2:]]
            cell = {(r[0], r[1]): dict(zip(lengths, zip(r[2:], s[2:]))) for r, s in zip(ppl.rows, ppl.status)}
            for row, shown in zip(valid.records(), valid.cells):
                mine = cell[(row["model"], row["method"])]
                evaluated = [
                    L for L in lengths if any(c[L][1] != "missing" for (m, _), c in cell.items() if m == row["model"])
                ]
                ref_len, ref = row["reference length"], mine[row["reference length"]][0]
                longest, failed = None, False
                for L in (L for L in evaluated if L >= ref_len and ref is not None):
                    value, status = mine[L]
                    if status == "missing":
                        break
                    if value is None or value > ref * (1 + report.tolerance):
                        failed = True
                        break
                    longest = L
                assert row[own] == longest, (group.id, row["model"], row["method"])
                assert shown[4].startswith("≥") == (longest is not None and not failed), (group.id, row, shown)
                checked += 1
        for kind in ("needle", "passkey"):
            if kind not in by_kind:
                continue
            table = by_kind[kind]
            lengths = [c for c in table.columns[2:] if c.isdigit()]
            threshold = report.threshold
            for row, status in zip(table.records(), table.status):
                sts = dict(zip(table.columns, status))
                longest = None
                for L in (L for L in lengths if sts[L] != "missing"):
                    if row[L] is None or row[L] < threshold:
                        break
                    longest = int(L)
                assert row["effective length"] == longest, (group.id, row)
                checked += 1
    assert checked > 120  # 139 on 2026-12-07
