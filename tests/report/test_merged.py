"""`ctxeval report`: runs merged into comparison tables from rows.jsonl, protocols never mixed, missing never zero."""

import csv
import io
import json
import math
import re
from pathlib import Path

import pytest
from report.run_dirs import cli, entropy_run, needle_run, ppl_run

from ctxeval.errors import CtxevalError
from ctxeval.report import merged, render
from ctxeval.runs.rows import UNIFORM_LABEL, UNIFORM_MODEL

RESULTS = Path(__file__).resolve().parents[2] / "results"


def main_table(rep, group_id):
    return next(t for t in rep.tables if t.id == group_id)


def row_of(table, model, method):
    return next(dict(zip(table.columns, r)) for r in table.rows if r[0] == model and r[1] == method)


def cells_of(table, model, method):
    return next(dict(zip(table.headers, c)) for c in table.cells if c[0] == model and c[1] == method)


# -- merging ---------------------------------------------------------------------------------------------------
def test_two_models_one_ppl_table_missing_cells_stay_missing(tmp_path):
    a = ppl_run(tmp_path, "a", model="m1")
    b = ppl_run(
        tmp_path,
        "b",
        model="m2",
        original=256,
        ppl={"none": {64: 9.0, 128: 9.5, 256: 30.0}, "yarn(factor=2)": {64: 9.2, 128: 9.4, 256: 9.9}},
    )
    rep = merged.build_report([a, b])
    assert [g.id for g in rep.groups] == ["ppl-1"]
    table = main_table(rep, "ppl-1")
    assert table.columns == ["model", "method", "64", "128", "256"]
    assert [(r[0], r[1]) for r in table.rows] == [
        ("m1", "none"),
        ("m1", "yarn(factor=2)"),
        ("m2", "none"),
        ("m2", "yarn(factor=2)"),
    ]
    assert row_of(table, "m1", "none")["128"] == pytest.approx(12.0)
    assert row_of(table, "m2", "none")["256"] == pytest.approx(30.0)
    # m1 never ran 256: missing, not zero, everywhere
    assert row_of(table, "m1", "none")["256"] is None
    assert cells_of(table, "m1", "none")["256"] == "—"
    tidy = list(csv.DictReader(io.StringIO(render.to_csv(rep))))
    cell = next(
        r
        for r in tidy
        if r["table"] == "ppl-1" and r["model"] == "m1" and r["method"] == "none" and r["column"] == "256"
    )
    assert cell["value"] == "" and cell["status"] == "missing"
    data = json.loads(json.dumps(render.to_json(rep), allow_nan=False))
    jrow = data["groups"][0]["tables"][0]["rows"][0]
    assert jrow["256"] is None and jrow["64"] == pytest.approx(10.0)
    assert data["groups"][0]["original_lengths"] == {"m1": 128, "m2": 256}
    wide = list(csv.reader(io.StringIO(render.table_csv(table))))
    assert wide[0] == table.columns and wide[1][-1] == ""
    # valid length per model, against that model's own original length
    valid = main_table(rep, "ppl-1-valid")
    assert row_of(valid, "m1", "none")["reference length"] == 128
    assert row_of(valid, "m2", "none")["reference length"] == 256
    assert row_of(valid, "m2", "yarn(factor=2)")["longest within 10% of own ppl"] == 256


def test_failed_cells_show_their_status_not_zero(tmp_path):
    a = ppl_run(
        tmp_path,
        "a",
        ppl={"none": {64: 10.0, 128: 12.0}, "yarn(factor=2)": {64: 11.0}},
        failed=[("yarn(factor=2)", 128, "oom")],
    )
    rep = merged.build_report([a])
    table = main_table(rep, "ppl-1")
    assert row_of(table, "m1", "yarn(factor=2)")["128"] is None
    assert cells_of(table, "m1", "yarn(factor=2)")["128"] == "OOM"
    tidy = list(csv.DictReader(io.StringIO(render.to_csv(rep))))
    assert [
        r["status"] for r in tidy if r["method"] == "yarn(factor=2)" and r["column"] == "128" and r["table"] == "ppl-1"
    ] == ["oom"]


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(bos=False), "bos"),
        (dict(docs=("d2",)), "documents"),
        (dict(aggregate="window"), "aggregate"),
        (dict(data="mobydick"), "data"),
    ],
)
def test_ppl_runs_that_differ_in_protocol_are_not_mixed(tmp_path, change, field):
    a = ppl_run(tmp_path, "a")
    b = ppl_run(tmp_path, "b", model="m2", **change)
    rep = merged.build_report([a, b])
    assert [g.id for g in rep.groups] == ["ppl-1", "ppl-2"]
    assert all(g.distinguishing == [field] for g in rep.groups)
    assert rep.groups[0].title.startswith("Perplexity (1 of 2): " + field)
    assert {r[0] for r in main_table(rep, "ppl-1").rows} == {"m1"}
    assert {r[0] for r in main_table(rep, "ppl-2").rows} == {"m2"}
    assert any(f"differ in {field}" in n for n in rep.notes)
    md = render.to_markdown(rep)
    assert md.count("## Perplexity (") == 2
    with pytest.raises(CtxevalError, match=f"--single: the ppl runs differ in {field}"):
        merged.build_report([a, b], single=True)


def test_aggregate_override_puts_runs_in_one_table(tmp_path):
    a = ppl_run(tmp_path, "a")
    b = ppl_run(tmp_path, "b", model="m2", aggregate="window")
    rep = merged.build_report([a, b], aggregate="token")
    assert [g.id for g in rep.groups] == ["ppl-1"] and rep.groups[0].key["aggregate"] == "token"


def test_needle_runs_split_by_depths_merged_across_lengths(tmp_path):
    short = needle_run(tmp_path, "short", acc={"none": {64: 1, 128: 1}})
    long = needle_run(
        tmp_path,
        "long",
        acc={"none": {256: 0}, "yarn(factor=2)": {256: 1, 512: 1}},
        started="2026-01-02T00:00:00+00:00",
    )
    other = needle_run(tmp_path, "other", depths=(0.0, 100.0), acc={"none": {64: 1}})
    rep = merged.build_report([short, long, other])
    assert [g.id for g in rep.groups] == ["needle-1", "needle-2"]
    assert rep.groups[0].distinguishing == ["depths"]
    table = main_table(rep, "needle-1")
    assert table.columns == ["model", "method", "64", "128", "256", "512", "effective length"]
    none, yarn = row_of(table, "m1", "none"), row_of(table, "m1", "yarn(factor=2)")
    assert none["64"] == 1.0 and none["256"] == 0.0 and none["512"] is None and none["effective length"] == 128
    assert yarn["64"] is None and yarn["effective length"] == 512
    shown = cells_of(table, "m1", "yarn(factor=2)")
    assert shown["64"] == "—" and shown["256"] == "100%" and shown["effective length (>= 80%)"] == "512†"
    assert table.footnotes and "†" in table.footnotes[0]
    grid, _ = rep.groups[0].grids[("m1", "yarn(factor=2)")]
    assert list(grid.columns) == [64, 128, 256, 512] and math.isnan(grid.loc[0.0, 64])


def test_same_model_and_method_in_two_runs_later_wins_failure_never_replaces_value(tmp_path):
    old = ppl_run(tmp_path, "old", ppl={"none": {64: 10.0, 128: 12.0}}, started="2026-01-01T00:00:00+00:00")
    new = ppl_run(
        tmp_path,
        "new",
        ppl={"none": {128: 13.0, 256: 20.0}},
        failed=[("none", 64, "oom")],
        started="2026-01-02T00:00:00+00:00",
    )
    for order in ([old, new], [new, old]):  # time decides, not the command line
        rep = merged.build_report(order)
        row = row_of(main_table(rep, "ppl-1"), "m1", "none")
        assert row["64"] == pytest.approx(10.0)  # the later oom does not erase the earlier measurement
        assert row["128"] == pytest.approx(13.0)  # measured twice: the later run's value
        assert row["256"] == pytest.approx(20.0)
        assert sorted(rep.groups[0].notes) == [
            f"m1 · none: 1 point(s) measured by both {old} and {new}; kept {new}'s (started later)",
            f"m1 · none: 1 point(s) measured by both {old} and {new}; kept {old}'s values ({new} has oom there; "
            "a failure never replaces a value)",
        ]


def test_unfinished_run_is_used_with_a_note_and_run_json_path_is_accepted(tmp_path):
    a = ppl_run(tmp_path, "a", status="interrupted", ppl={"none": {64: 10.0}})
    rep = merged.build_report([a / "run.json"])
    assert any("incomplete (status interrupted)" in n for n in rep.notes)
    assert row_of(main_table(rep, "ppl-1"), "m1", "none")["64"] == pytest.approx(10.0)


def test_resumed_point_inside_one_run_replaces_its_failure(tmp_path):
    a = ppl_run(tmp_path, "a", ppl={"none": {64: 10.0}}, failed=[("none", 64, "oom")])
    rows = [json.loads(line) for line in (a / "rows.jsonl").read_text().splitlines()]
    (a / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[::-1]))  # failure first, then success
    assert row_of(main_table(merged.build_report([a]), "ppl-1"), "m1", "none")["64"] == pytest.approx(10.0)


def test_same_model_in_two_dtypes_is_two_rows(tmp_path):
    a = ppl_run(tmp_path, "a", dtype="float32")
    b = ppl_run(tmp_path, "b", dtype="bfloat16", ppl={"none": {64: 10.5}})
    table = main_table(merged.build_report([a, b]), "ppl-1")
    assert {r[0] for r in table.rows} == {"m1 (float32)", "m1 (bfloat16)"}
    assert row_of(table, "m1 (bfloat16)", "none")["64"] == pytest.approx(10.5)


def test_passkey_runs_of_two_protocols_never_share_a_table(tmp_path):
    """A --protocol yarn run, a --protocol ctxeval run and one made before --protocol existed (ctxeval's layout,
    BOS): the first gets its own table, the other two share one."""
    yarn = needle_run(tmp_path, "y", task="passkey", extra_spec={"protocol": "yarn", "bos": False})
    ctx = needle_run(tmp_path, "c", task="passkey", model="m2", extra_spec={"protocol": "ctxeval", "bos": True})
    old = needle_run(tmp_path, "o", task="passkey", model="m3")
    rep = merged.build_report([yarn, ctx, old])
    assert [g.id for g in rep.groups] == ["passkey-1", "passkey-2"]
    assert sorted(len(g.runs) for g in rep.groups) == [1, 2]


def test_ppl_needle_and_passkey_together(tmp_path):
    p = ppl_run(tmp_path, "p")
    n = needle_run(tmp_path, "n", model="m2", acc={"none": {64: 1, 128: 0}})
    k = needle_run(
        tmp_path,
        "k",
        task="passkey",
        samples=5,
        haystack="filler",
        acc={"none": {64: [1, 1, 1, 1, 1], 128: [1, 1, 1, 0, 0], 256: [1, 1, 1, 1, 0]}},
    )
    rep = merged.build_report([k, n, p])
    assert [g.id for g in rep.groups] == ["ppl-1", "needle-1", "passkey-1"]
    pk = main_table(rep, "passkey-1")
    row = row_of(pk, "m1", "none")
    # YaRN's passkey context is the longest length at >= 80% (256, past the 60% at 128), its accuracy the mean of
    # every length up to it; the effective length stops at the first failing length
    assert row["passkey context"] == 256 and row["passkey accuracy"] == pytest.approx((1 + 0.6 + 0.8) / 3)
    assert row["effective length"] == 64 and row["256"] == pytest.approx(0.8)
    assert row_of(main_table(rep, "needle-1"), "m2", "none")["effective length"] == 64
    md = render.to_markdown(rep)
    for heading in (
        "## Perplexity",
        "## Needle in a haystack",
        "## Passkey retrieval",
        "passkey context (YaRN: longest >= 80%)",
        "effective length (>= 80%)",
    ):
        assert heading in md
    written = render.write_report(rep, tmp_path / "out")
    names = {w.name for w in written}
    assert {
        "table.md",
        "report.csv",
        "report.json",
        "ppl-1.csv",
        "ppl-1-valid.csv",
        "needle-1.csv",
        "passkey-1.csv",
        "ppl-m1.png",
        "needle-m2.png",
        "passkey-m1.png",
    } <= names
    assert "![" in (tmp_path / "out" / "table.md").read_text()
    json.loads((tmp_path / "out" / "report.json").read_text())


@pytest.mark.skipif(not (RESULTS / "needle-smollm2-austen-long" / "rows.jsonl").exists(), reason="no committed results")
def test_committed_needle_runs_merge_into_one_table():
    rep = merged.build_report([RESULTS / "needle-smollm2-austen-short", RESULTS / "needle-smollm2-austen-long"])
    table = main_table(rep, "needle-1")
    none = row_of(table, "smollm2", "none")
    assert [none[c] for c in ("1024", "2048", "4096", "16384")] == [1.0, 1.0, 1.0, 0.0]
    assert none["effective length"] == 4096
    assert row_of(table, "smollm2", "yarn(factor=2)")["1024"] is None


# -- entropy ---------------------------------------------------------------------------------------------------
def _uniform(length):
    return sum(math.log(i + 1) for i in range(length)) / length


def test_two_models_entropy_runs_share_one_table_missing_cells_stay_missing(tmp_path):
    a = entropy_run(tmp_path, "a", model="m1")
    b = entropy_run(
        tmp_path,
        "b",
        model="m2",
        original=256,
        ent={"none": {64: 2.1, 128: 2.6, 256: 3.2}, "yarn(factor=2)": {256: 2.9}},
    )
    rep = merged.build_report([a, b])
    assert [g.id for g in rep.groups] == ["entropy-1"]
    assert rep.groups[0].title == "Attention entropy"
    table = main_table(rep, "entropy-1")
    assert table.kind == "entropy" and table.columns == ["model", "method", "64", "128", "256"]
    assert [(r[0], r[1]) for r in table.rows] == [
        ("m1", "none"),
        ("m1", "yarn(factor=2)"),
        ("m2", "none"),
        ("m2", "yarn(factor=2)"),
        (UNIFORM_MODEL, UNIFORM_LABEL),
    ]
    # mean over the two documents (value, value + 0.1)
    assert row_of(table, "m1", "none")["128"] == pytest.approx(2.55)
    assert cells_of(table, "m2", "none")["256"] == "3.250"
    # m1 never ran 256, m2's yarn only 256: missing, never zero
    assert row_of(table, "m1", "none")["256"] is None and cells_of(table, "m1", "none")["256"] == "—"
    assert row_of(table, "m2", "yarn(factor=2)")["64"] is None and cells_of(table, "m2", "yarn(factor=2)")["64"] == "—"
    # one uniform row for the whole table: ln of the visible keys, per length, whoever measured it
    uniform = row_of(table, UNIFORM_MODEL, UNIFORM_LABEL)
    assert [uniform[c] for c in ("64", "128", "256")] == pytest.approx([_uniform(64), _uniform(128), _uniform(256)])
    assert cells_of(table, UNIFORM_MODEL, UNIFORM_LABEL)["64"] == f"{_uniform(64):.3f}"
    assert "nats" in table.caption and "2 document(s)" in table.caption and "m1 128, m2 256" in table.caption
    tidy = list(csv.DictReader(io.StringIO(render.to_csv(rep))))
    cell = next(
        r
        for r in tidy
        if r["table"] == "entropy-1" and r["model"] == "m1" and r["method"] == "none" and r["column"] == "256"
    )
    assert cell["value"] == "" and cell["status"] == "missing"
    data = json.loads(json.dumps(render.to_json(rep), allow_nan=False))
    group = data["groups"][0]
    assert group["kind"] == "entropy" and group["protocol"]["layers"] == "all"
    assert group["protocol"]["documents"] == ["d1", "d2"]
    assert group["tables"][0]["rows"][0]["256"] is None
    md = render.to_markdown(rep)
    assert "## Attention entropy\n" in md and "| any model | uniform (ln of visible keys) |" in md
    written = {w.name for w in render.write_report(rep, tmp_path / "out")}
    assert {"entropy-1.csv", "entropy-m1-m2.png", "table.md", "report.csv", "report.json"} <= written
    assert "![Attention entropy](entropy-m1-m2.png)" in (tmp_path / "out" / "table.md").read_text()


def test_entropy_failures_show_their_status_and_partial_documents_are_noted(tmp_path):
    a = entropy_run(
        tmp_path,
        "a",
        ent={"none": {64: 2.0, 128: 2.5}, "yarn(factor=2)": {64: 1.9}},
        failed=[("yarn(factor=2)", 128, "oom")],
        skip_docs=[("none", 128, "d2")],
        status="interrupted",
    )
    rep = merged.build_report([a])
    table = main_table(rep, "entropy-1")
    assert row_of(table, "m1", "yarn(factor=2)")["128"] is None
    assert cells_of(table, "m1", "yarn(factor=2)")["128"] == "OOM"
    assert row_of(table, "m1", "none")["128"] == pytest.approx(2.5)  # only d1 was measured
    assert rep.groups[0].notes == [
        "m1 · none: averaged over fewer documents than the protocol's at 128 (1 of 2); "
        "the run did not measure the others"
    ]
    assert any("incomplete (status interrupted)" in n for n in rep.notes)
    tidy = list(csv.DictReader(io.StringIO(render.to_csv(rep))))
    assert [r["status"] for r in tidy if r["method"] == "yarn(factor=2)" and r["column"] == "128"] == ["oom"]


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(layers=[0, 3]), "layers"),
        (dict(heads=[0]), "heads"),
        (dict(bos=False), "bos"),
        (dict(docs=("d3",)), "documents"),
    ],
)
def test_entropy_runs_that_differ_in_protocol_are_not_mixed(tmp_path, change, field):
    a = entropy_run(tmp_path, "a")
    b = entropy_run(tmp_path, "b", model="m2", **change)
    rep = merged.build_report([a, b])
    assert [g.id for g in rep.groups] == ["entropy-1", "entropy-2"]
    assert all(g.distinguishing == [field] for g in rep.groups)
    assert rep.groups[0].title.startswith("Attention entropy (1 of 2): " + field)
    assert {r[0] for r in main_table(rep, "entropy-1").rows} == {"m1", UNIFORM_MODEL}
    assert {r[0] for r in main_table(rep, "entropy-2").rows} == {"m2", UNIFORM_MODEL}
    assert any(f"the entropy runs differ in {field}" in n for n in rep.notes)
    assert render.to_markdown(rep).count("## Attention entropy (") == 2
    with pytest.raises(CtxevalError, match=f"--single: the entropy runs differ in {field}"):
        merged.build_report([a, b], single=True)


def test_entropy_same_model_in_two_runs_later_wins_failure_never_replaces_value(tmp_path):
    old = entropy_run(tmp_path, "old", ent={"none": {64: 2.0, 128: 2.5}})
    new = entropy_run(
        tmp_path,
        "new",
        ent={"none": {128: 2.7, 256: 3.0}},
        failed=[("none", 64, "oom")],
        started="2026-01-02T00:00:00+00:00",
    )
    for order in ([old, new], [new, old]):
        rep = merged.build_report(order)
        row = row_of(main_table(rep, "entropy-1"), "m1", "none")
        assert row["64"] == pytest.approx(2.05)  # the later oom does not erase the measurement
        assert row["128"] == pytest.approx(2.75)  # the later run's value
        assert row["256"] == pytest.approx(3.05)
        assert sorted(rep.groups[0].notes) == [
            f"m1 · none: 2 point(s) measured by both {old} and {new}; kept {new}'s (started later)",
            f"m1 · none: 2 point(s) measured by both {old} and {new}; kept {old}'s values ({new} has oom there; "
            "a failure never replaces a value)",
        ]


def test_ppl_and_entropy_together(tmp_path):
    p = ppl_run(tmp_path, "p", data="pydoc", docs=("d1", "d2"))
    e = entropy_run(tmp_path, "e", model="m2")
    rep = merged.build_report([e, p])
    assert [g.id for g in rep.groups] == ["ppl-1", "entropy-1"]  # kinds in a fixed order, never mixed
    assert not any("differ" in n for n in rep.notes)
    md = render.to_markdown(rep)
    assert md.index("## Perplexity") < md.index("## Attention entropy")
    assert any(line.startswith(f"| `{e}`") and "| entropy | m2 " in line for line in md.splitlines())
    written = {w.name for w in render.write_report(rep, tmp_path / "out")}
    assert {"ppl-m1.png", "ppl-1.csv", "ppl-1-valid.csv", "entropy-m2.png", "entropy-1.csv"} <= written
    tidy = list(csv.DictReader(io.StringIO((tmp_path / "out" / "report.csv").read_text())))
    assert {r["table"] for r in tidy} == {"ppl-1", "ppl-1-valid", "entropy-1"}
    result = cli(p, e, "--format", "json")
    assert result.exit_code == 0, result.output
    assert [g["kind"] for g in json.loads(result.stdout)["groups"]] == ["ppl", "entropy"]


@pytest.mark.skipif(not (RESULTS / "entropy-tiny-pydoc" / "rows.jsonl").exists(), reason="no committed results")
def test_committed_entropy_run_merges_with_the_ppl_run():
    rep = merged.build_report([RESULTS / "entropy-tiny-pydoc", RESULTS / "ppl-tiny-pydoc"])
    assert [g.id for g in rep.groups] == ["ppl-1", "entropy-1"]
    group = rep.groups[1]
    assert group.key == {
        "data": "pydoc",
        "documents": ["specialnames", "string-methods", "execmodel"],
        "text_field": "text",
        "bos": True,
        "layers": "all",
        "heads": "all",
    }
    table = main_table(rep, "entropy-1")
    assert table.columns == ["model", "method", "64", "128", "256", "512", "1024", "2048"]
    # the run's own table.md, to 3 decimals
    assert cells_of(table, "tiny", "none")["2k"] == "5.169"
    assert cells_of(table, "tiny", "yarn(factor=8)")["64"] == "2.003"
    assert [cells_of(table, UNIFORM_MODEL, UNIFORM_LABEL)[h] for h in ("64", "2k")] == ["3.206", "6.627"]
    assert all(v is not None for r in table.rows for v in r[2:])
    assert group.original_lengths == {"tiny": 128} and not group.notes
    assert "## Attention entropy" in render.to_markdown(rep)


def test_a_report_directory_among_runs_is_skipped_alone_refused(tmp_path):
    a = entropy_run(tmp_path, "a")
    render.write_report(merged.build_report([a]), tmp_path / "rep")
    rep = merged.build_report([a, tmp_path / "rep"])
    assert [r.name for r in rep.runs] == [str(a)]
    assert any("holds a report written by ctxeval report --out" in n and "skipped" in n for n in rep.notes)
    result = cli(tmp_path / "rep")
    assert result.exit_code == 2 and "holds a report written by ctxeval report --out" in result.stderr


# -- the command -----------------------------------------------------------------------------------------------
def test_cli_markdown_csv_json_and_out(tmp_path):
    a, b = ppl_run(tmp_path, "a"), needle_run(tmp_path, "n")
    md = cli(a, b)
    assert md.exit_code == 0, md.output
    header = next(line for line in md.stdout.splitlines() if line.startswith("| model") and "| 64" in line)
    assert header.split("|")[3:5] == [" 64    ", " 128   "] and "## Needle in a haystack" in md.stdout
    as_csv = cli(a, b, "--format", "csv")
    assert as_csv.exit_code == 0
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert {r["table"] for r in rows} == {"ppl-1", "ppl-1-valid", "needle-1"}
    as_json = cli(a, b, "--format", "json")
    assert as_json.exit_code == 0
    assert [g["id"] for g in json.loads(as_json.stdout)["groups"]] == ["ppl-1", "needle-1"]
    out = cli(a, b, "--out", tmp_path / "rep")
    assert out.exit_code == 0 and "wrote" in out.stderr
    rep = tmp_path / "rep"
    assert sorted(p.name for p in rep.iterdir()) == [
        "needle-1.csv",
        "needle-m1.png",
        "ppl-1-valid.csv",
        "ppl-1.csv",
        "ppl-m1.png",
        "report.csv",
        "report.json",
        "table.md",
    ]
    assert all((rep / f"{g}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for g in ("ppl-m1", "needle-m1"))
    assert header in (rep / "table.md").read_text() and "](ppl-m1.png)" in (rep / "table.md").read_text()
    assert list(csv.DictReader((rep / "report.csv").open())) == rows  # the file holds what --format csv printed
    written = json.loads((rep / "report.json").read_text())
    assert [g["id"] for g in written["groups"]] == ["ppl-1", "needle-1"] and "environment" in written["generated"]
    assert not list(tmp_path.glob("a/table.md"))  # the runs themselves are never written to


def with_positions(run_dir):
    """Loss-by-position sums on every measured row, as ctxeval ppl writes them: the group gets a positions figure."""
    rows = [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]
    for r in rows:
        r.update(
            position_edges=[0, 8, r["length"]],
            position_tokens=[8, r["length"] - 9],
            position_nll_sum=[8 * 2.0, (r["length"] - 9) * 1.5],
        )
    (run_dir / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def test_report_figures_are_named_by_what_sets_their_group_apart(tmp_path):
    """Issue 26: figures were ppl-1.png .. ppl-5.png; each is named by its models and the fields that tell its group
    from the others (the fewest that do), consistently in table.md and report.json."""
    runs = [
        ppl_run(tmp_path, "a", model="smollm2", docs=("Emma",)),
        ppl_run(tmp_path, "b", model="smollm2", docs=("Emma",), bos=False),
        with_positions(ppl_run(tmp_path, "c", model="org/Tiny", data="pydoc", docs=("d1", "d2", "d3", "d4"))),
        ppl_run(tmp_path, "d", model="smollm2", docs=("Emma!",), data="AUSTEN"),  # the same name as a's, lowercased
        ppl_run(tmp_path, "e", model="smollm2", docs=("Emma?",), data="AUSTEN"),
        needle_run(tmp_path, "n"),
    ]
    rep = merged.build_report(runs)
    assert [g.distinguishing for g in rep.groups][0] == ["data", "documents", "bos"]
    # documents tell no group from another that data and bos do not (Emma! and Emma? are both emma): left out
    assert render.figure_stems(rep.groups) == {
        "ppl-1": "ppl-smollm2-austen-bos-on",
        "ppl-2": "ppl-smollm2-austen-bos-off",
        "ppl-3": "ppl-tiny-pydoc-bos-on",
        "ppl-4": "ppl-smollm2-austen-bos-on-2",
        "ppl-5": "ppl-smollm2-austen-bos-on-3",
        "needle-1": "needle-m1",
    }
    out = tmp_path / "out"
    written = {w.name for w in render.write_report(rep, out)}
    pngs = {p.name for p in out.glob("*.png")}
    assert pngs <= written and pngs == {
        "ppl-smollm2-austen-bos-on.png",
        "ppl-smollm2-austen-bos-off.png",
        "ppl-tiny-pydoc-bos-on.png",
        "ppl-tiny-pydoc-bos-on-positions.png",
        "ppl-smollm2-austen-bos-on-2.png",
        "ppl-smollm2-austen-bos-on-3.png",
        "needle-m1.png",
    }
    md = (out / "table.md").read_text()
    assert set(re.findall(r"!\[[^]]*\]\(([^)]+)\)", md)) == pngs  # every figure referenced, each by its file
    record = json.loads((out / "report.json").read_text())
    assert {g["plot"] for g in record["groups"]} | {g["positions_plot"] for g in record["groups"]} - {None} == pngs
    assert (
        next(g for g in record["groups"] if g["id"] == "ppl-3")["positions_plot"]
        == "ppl-tiny-pydoc-bos-on-positions.png"
    )
    assert [
        render.name_part(*p)
        for p in (
            ("documents", ["Emma", "Mansfield Park"]),
            ("documents", list("abcd")),
            ("bos", False),
            ("stride", 256),
            ("tasks", ["niah_single_2"]),
            ("essays", "austen (substitute for RULER's Paul Graham essays)"),
        )
    ] == ["emma-mansfield-park", "4-documents", "bos-off", "stride-256", "niah_single_2", "austen"]

    # the same directory again with fewer groups: the earlier report's figures it no longer draws go; others stay
    (out / "mine.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    render.write_report(merged.build_report([runs[0], runs[5]]), out)
    assert {p.name for p in out.glob("*.png")} == {"ppl-smollm2.png", "needle-m1.png", "mine.png"}


def test_a_long_protocol_value_is_shortened_at_a_word_end():
    """Issue 26: headings and figure titles read `Paul Graham es...`."""
    from ctxeval.report.runs import fmt_value

    assert (
        fmt_value("austen (substitute for RULER's Paul Graham essays)")
        == "austen (substitute for RULER's Paul Graham..."
    )
    assert fmt_value("x" * 60) == "x" * 45 + "..."  # no word end near: cut where the room ends
    assert fmt_value("short enough to stay whole") == "short enough to stay whole"


def _bad_inputs(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    norows = ppl_run(tmp_path, "norows")
    (norows / "rows.jsonl").write_text("")
    holder = tmp_path / "holder"
    ppl_run(holder, "inner")
    (holder / "README.md").write_text("# runs\n")
    good = ppl_run(tmp_path, "good")
    broken = ppl_run(tmp_path, "broken")
    (broken / "run.json").write_text("{not json")
    return {
        "missing": ([tmp_path / "nope"], "does not exist"),
        "not a run": ([empty], "no run.json"),
        "no rows": ([norows], "no measured rows"),
        "only a file": ([holder / "README.md"], "is a file, not a run directory"),
        "nothing is a run": ([holder / "README.md", empty], "is a file, not a run directory"),
        "broken run.json": ([broken], "cannot be read"),
        "bad format": ([good, "--format", "xml"], "--format must be md, csv or json"),
        "out is a run": ([good, "--out", good], "is a run directory"),
        "single": ([good, ppl_run(tmp_path, "nobos", bos=False), "--single"], "differ in bos"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing",
        "not a run",
        "no rows",
        "only a file",
        "nothing is a run",
        "broken run.json",
        "bad format",
        "out is a run",
        "single",
    ],
)
def test_cli_bad_input_is_one_line_exit_2(tmp_path, case):
    args, fragment = _bad_inputs(tmp_path)[case]
    result = cli(*args)
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_report_arguments_a_folder_of_runs_is_expanded_and_what_is_not_a_run_is_skipped(tmp_path):
    """Issue 26: `ctxeval report results/*` (README.md among the runs) and `ctxeval report results/`."""
    results = tmp_path / "results"
    b, a = ppl_run(results, "b"), ppl_run(results, "a", started="2026-01-02T00:00:00+00:00")
    (results / "README.md").write_text("# runs\n")
    render.write_report(merged.build_report([a]), results / "report-all")
    empty = tmp_path / "empty"
    empty.mkdir()

    folder = cli(f"{results}/", "--format", "json")
    assert folder.exit_code == 0, folder.output
    assert [r["path"] for r in json.loads(folder.stdout)["runs"]] == [str(a), str(b)]  # in name order
    notes = [line for line in folder.stderr.splitlines() if "is a folder of run directories" in line]
    assert notes == [
        f"note: {results} is a folder of run directories: using the 2 directly inside it, in name "
        "order (2 other entries in it not run directories)"
    ]

    mixed = cli(*sorted(results.iterdir()), empty)  # what the shell makes of results/* empty
    assert mixed.exit_code == 0, mixed.output
    skipped = [line for line in mixed.stderr.splitlines() if line.endswith("; skipped")]
    assert skipped == [
        f"note: {results / 'README.md'} is a file, not a run directory; skipped",
        f"note: {results / 'report-all'} holds a report written by ctxeval report --out, not a run; skipped",
        f"note: {empty} is not a ctxeval run directory (no run.json); skipped",
    ]
    assert "| m1" in mixed.stdout and "Traceback" not in mixed.output


def test_a_run_that_measured_nothing_is_skipped_with_a_note(tmp_path):
    """Issue 39: `report runs/* --html` exited 2 and wrote nothing when one run directory had no rows (a run refused
    after its directory was made, or stopped before its first point)."""
    good = ppl_run(tmp_path, "good")
    refused = ppl_run(tmp_path, "refused", status="error")
    (refused / "rows.jsonl").unlink()
    record = json.loads((refused / "run.json").read_text())
    record["error"] = "niah_single_1: length 128 is shorter than the task's smallest prompt\nmore"
    (refused / "run.json").write_text(json.dumps(record))
    stopped = ppl_run(tmp_path, "stopped", status="interrupted")
    (stopped / "rows.jsonl").write_text("")
    page = tmp_path / "page.html"
    result = cli(good, refused, stopped, "--html", page)
    assert result.exit_code == 0, result.output
    assert f"{refused} measured nothing (status error: niah_single_1: length 128 is shorter than the task's " in (
        result.stdout
    )
    assert f"{stopped} measured nothing (status interrupted); skipped" in result.stdout
    assert page.is_file() and "refused measured nothing" in page.read_text()
    only_empty = cli(refused, stopped)
    assert only_empty.exit_code == 2
    assert "none of the 2 run directories given measured anything" in only_empty.stderr


def test_a_valid_length_at_the_longest_length_evaluated_says_not_reached(tmp_path):
    """Issue 39: a valid length equal to the longest length asked read as if the method broke there."""
    a = ppl_run(
        tmp_path,
        "a",
        ppl={"none": {64: 10.0, 128: 10.5, 256: 40.0}, "yarn(factor=2)": {64: 10.2, 128: 10.4, 256: 10.9}},
    )
    valid = main_table(merged.build_report([a]), "ppl-1-valid")
    assert row_of(valid, "m1", "yarn(factor=2)")["longest within 10% of own ppl"] == 256  # the raw value: a number
    cells = cells_of(valid, "m1", "yarn(factor=2)")
    assert cells["longest within 10% of own ppl"] == "≥ 256 (not reached)" and cells["x original"] == "≥ 2.00"
    assert cells_of(valid, "m1", "none")["longest within 10% of own ppl"] == "128"  # broke at 256: a plain length
    assert "not reached" in valid.caption


def test_a_run_recorded_before_position_encodings_were_named_gets_one_from_its_rope_record():
    from ctxeval.report.merged import encoding_of_record

    assert encoding_of_record({"rope": {"base": 10000.0}}) == "RoPE"
    reasons = {
        "model_type 'bloom' uses ALiBi, not RoPE": "ALiBi",
        "model_type 'gpt2' uses learned absolute positions, not RoPE": "learned",
        "model_type 'xglm' uses sinusoidal positions, not RoPE": "sinusoidal",
        "model_type 'smollm3' has RoPE off in every layer (no_rope_layers all 0)": "NoPE",
    }
    for reason, encoding in reasons.items():
        assert encoding_of_record({"rope": {"base": None, "no_rope_reason": reason}}) == encoding
    assert encoding_of_record({}) is None
