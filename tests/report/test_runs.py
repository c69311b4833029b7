"""report/runs.py: loading runs, keying their tables, merging rows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ctxeval.errors import CtxevalError


def _merge_run(name, order, rows, started=None, methods=None, dtype="float32"):
    from pathlib import Path

    from ctxeval.report.runs import Run

    record = {"spec": {"task": "ppl", "dtype": dtype, **({"methods": methods} if methods else {})}}
    if started:
        record["started"] = started
    return Run(Path(name), name, "ppl", record, rows, order)


def _group(*runs):
    from ctxeval.report.runs import Group

    return Group("ppl-1", "ppl", 1, 1, {}, list(runs))


def _ppl(label, length, doc="d", status="ok", value=1.0, model="m"):
    return {"model": model, "label": label, "length": length, "doc": doc, "status": status, "nll_sum": value}


def test_merge_rows_the_run_started_later_wins_whatever_the_command_line_order_and_says_so():
    from ctxeval.report.runs import merge_rows

    older = _merge_run("old", 1, [_ppl("none", 64, value=1.0), _ppl("none", 128, value=2.0)], "2026-01-01T10:00:00")
    newer = _merge_run(
        "new", 0, [_ppl("none", 64, value=3.0), _ppl("none", 128.0, value=4.0)], "2026-01-02T10:00:00+00:00"
    )
    rows, notes = merge_rows(_group(newer, older))
    assert sorted((r["length"], r["nll_sum"]) for r in rows) == [(64, 3.0), (128, 4.0)]
    assert all(type(r["length"]) is int for r in rows)  # 128.0 and 128 are one point
    assert notes == ["m · none: 2 point(s) measured by both old and new; kept new's (started later)"]


def test_merge_rows_without_a_start_time_a_run_counts_as_oldest_and_ties_go_to_the_later_argument():
    from ctxeval.report.runs import merge_rows

    undated = _merge_run("undated", 1, [_ppl("none", 64, value=1.0)])
    dated = _merge_run("dated", 0, [_ppl("none", 64, value=2.0)], "2000-01-01T00:00:00")
    rows, notes = merge_rows(_group(undated, dated))
    assert [r["nll_sum"] for r in rows] == [2.0] and "kept dated's" in notes[0]
    same = "2026-01-01T00:00:00"
    first, second = (
        _merge_run("first", 0, [_ppl("none", 64, value=1.0)], same),
        _merge_run("second", 1, [_ppl("none", 64, value=2.0)], same),
    )
    rows, notes = merge_rows(_group(second, first))
    assert [r["nll_sum"] for r in rows] == [2.0]
    assert notes == ["m · none: 1 point(s) measured by both first and second; kept second's (started later)"]


def test_merge_rows_a_failure_never_replaces_a_value_but_replaces_a_failure_and_a_value_replaces_a_failure():
    from ctxeval.report.runs import merge_rows

    older = _merge_run(
        "a",
        0,
        [
            _ppl("none", 64, value=1.0),
            _ppl("none", 128, status="oom", value=None),
            _ppl("none", 256, status="oom", value=None),
        ],
        "2026-01-01T00:00:00",
    )
    newer = _merge_run(
        "b",
        1,
        [
            _ppl("none", 64, status="oom", value=None),
            _ppl("none", 128, value=5.0),
            _ppl("none", 256, status="skipped", value=None),
        ],
        "2026-01-02T00:00:00",
    )
    rows, notes = merge_rows(_group(older, newer))
    assert sorted((r["length"], r["status"], r["nll_sum"]) for r in rows) == [
        (64, "ok", 1.0),
        (128, "ok", 5.0),
        (256, "skipped", None),
    ]
    assert sorted(notes) == [
        "m · none: 1 point(s) measured by both a and b; kept a's values (b has oom there; a failure never replaces "
        "a value)",
        "m · none: 2 point(s) measured by both a and b; kept b's (started later)",
    ]


def test_merge_rows_within_a_run_the_last_row_of_a_point_wins_and_points_differ_by_every_field():
    from ctxeval.report.runs import merge_rows

    run = _merge_run(
        "r",
        0,
        [
            _ppl("none", 64, status="oom", value=None),
            _ppl("none", 64, value=7.0),
            _ppl("none", 64, doc="e", value=8.0),
            _ppl("pi", 64, value=9.0),
        ],
        "2026-01-01T00:00:00",
    )
    rows, notes = merge_rows(_group(run))
    assert [(r["label"], r["doc"], r["nll_sum"]) for r in rows] == [
        ("none", "d", 7.0),
        ("none", "e", 8.0),
        ("pi", "d", 9.0),
    ]
    assert notes == []


def test_merge_rows_one_model_in_two_dtypes_stays_two_rows_named_by_dtype():
    from ctxeval.report.runs import merge_rows, row_order

    a = _merge_run("a", 0, [_ppl("none", 64, value=1.0)], "2026-01-01T00:00:00", dtype="float32")
    b = _merge_run("b", 1, [_ppl("none", 64, value=2.0)], "2026-01-02T00:00:00", dtype="bfloat16")
    group = _group(a, b)
    rows, notes = merge_rows(group)
    assert sorted((r["model"], r["nll_sum"]) for r in rows) == [("m (bfloat16)", 2.0), ("m (float32)", 1.0)]
    assert notes == [] and row_order(group, rows) == [("m (float32)", "none"), ("m (bfloat16)", "none")]


def test_row_order_models_as_they_first_appear_methods_in_each_runs_order_only_those_with_rows():
    from ctxeval.report.runs import merge_rows, row_order

    # run 0 (second on the list) names yarn before none in its spec; its rows add pi; run 1 adds model n
    first = _merge_run(
        "first",
        0,
        [_ppl("pi", 64, model="m"), _ppl("none", 64, model="m"), _ppl("yarn", 64, model="m")],
        "2026-01-02T00:00:00",
        methods=["yarn", "none", "ntk"],
    )
    second = _merge_run(
        "second",
        1,
        [_ppl("none", 64, model="n"), _ppl("pi", 64, model="m"), _ppl("none", 128, model="m")],
        "2026-01-01T00:00:00",
    )
    group = _group(second, first)
    rows, _ = merge_rows(group)
    assert row_order(group, rows) == [("m", "yarn"), ("m", "none"), ("m", "pi"), ("n", "none")]
    # only pairs that have rows: ntk (named, never measured) is left out, and so is everything without a row
    assert row_order(group, [r for r in rows if r["label"] != "yarn"]) == [("m", "none"), ("m", "pi"), ("n", "none")]


def _run(task, record, order=0, rows=None):
    from ctxeval.report.runs import Run

    rows = (
        rows
        if rows is not None
        else [{"model": "m", "label": "none", "doc": "d", "preset": "p", "scoring": "generate"}]
    )
    return Run(Path(f"run{order}"), f"run{order}", task, record, rows, order)


def _groups(task, record_a, record_b, rows_a=None, rows_b=None, aggregate=None):
    from ctxeval.report.registry import KINDS
    from ctxeval.report.runs import group_runs

    runs = [_run(task, record_a, 0, rows_a), _run(task, record_b, 1, rows_b)]
    return [g for g in group_runs(runs, KINDS, aggregate) if g.kind == task]


# (task, record of run A, record of run B, the field that must tell them apart, its value in run A as shown)
DIFFERING = [
    ("lm-eval", {"spec": {"max_length": 512}}, {"spec": {"max_length": 1024}}, "max_length", "512"),
    ("lm-eval", {"spec": {"limit": 10}}, {"spec": {"limit": 20}}, "limit", "10"),
    ("lm-eval", {"spec": {"num_fewshot": 0}}, {"spec": {"num_fewshot": 5}}, "num_fewshot", "0"),
    ("lm-eval", {"lm_eval": {"version": "0.4.8"}}, {"lm_eval": {"version": "0.4.9"}}, "lm_eval", "0.4.8"),
    ("ruler", {"spec": {"tasks": ["niah_single_1"]}}, {"spec": {"tasks": ["vt"]}}, "tasks", "niah_single_1"),
    ("ruler", {"spec": {"samples": 4}}, {"spec": {"samples": 8}}, "samples", "4"),
    ("ruler", {"spec": {"seed": 1}}, {"spec": {"seed": 2}}, "seed", "1"),
    ("ruler", {"spec": {"essays": "a.json"}}, {"spec": {"essays": "b.json"}}, "essays", "a.json"),
    ("ruler", {"spec": {"essay_sha256": "aa"}}, {"spec": {"essay_sha256": "bb"}}, "essay_sha256", "aa"),
    ("ruler", {"spec": {"samples_from": "x"}}, {"spec": {"samples_from": "y"}}, "samples_from", "x"),
    ("ruler", {"spec": {"template": "base"}}, {"spec": {"template": "chat"}}, "template", "base"),
    ("ruler", {"protocol": {"threshold": 85.6}}, {"protocol": {"threshold": 50.0}}, "threshold", "85.6"),
    ("ppl", {"spec": {"data": "pydoc"}}, {"spec": {"data": "austen"}}, "data", "pydoc"),
    ("ppl", {"data": {"spec": "pydoc"}}, {"data": {"spec": "austen"}}, "data", "pydoc"),
    ("ppl", {"data": {"documents": [{"doc": "a"}]}}, {"data": {"documents": [{"doc": "b"}]}}, "documents", "a"),
    ("ppl", {"spec": {"text_field": "body"}}, {}, "text_field", "body"),
    ("ppl", {"protocol": {"name": "sliding"}}, {"protocol": {"name": "truncate"}}, "protocol", "sliding"),
    ("ppl", {"spec": {"protocol": "sliding"}}, {"spec": {"protocol": "truncate"}}, "protocol", "sliding"),
    ("ppl", {"protocol": {"stride": 256}}, {"protocol": {"stride": 512}}, "stride", "256"),
    ("ppl", {"spec": {"stride": 256}}, {"spec": {"stride": 512}}, "stride", "256"),
    ("ppl", {"protocol": {"bos": True}}, {"protocol": {"bos": False}}, "bos", "on"),
    ("ppl", {"spec": {"bos": True}}, {"spec": {"bos": False}}, "bos", "on"),
    ("ppl", {"protocol": {"aggregate": "document"}}, {}, "aggregate", "document"),
    ("entropy", {"spec": {"bos": True}}, {"spec": {"bos": False}}, "bos", "on"),
    ("entropy", {"protocol": {"bos": True}}, {"protocol": {"bos": False}}, "bos", "on"),
    ("entropy", {"spec": {"layers": "0,1"}}, {}, "layers", "0,1"),
    ("entropy", {"spec": {"heads": "0"}}, {}, "heads", "0"),
    ("entropy", {"spec": {"data": "pydoc"}}, {"spec": {"data": "austen"}}, "data", "pydoc"),
    ("needle", {"spec": {"preset": "single"}}, {"spec": {"preset": "multikey"}}, "preset", "single"),
    (
        "needle",
        {"spec": {"preset": {"name": "custom", "keys": 1}}},
        {"spec": {"preset": {"name": "custom", "keys": 2}}},
        "preset.keys",
        "1",
    ),
    (
        "needle",
        {"spec": {"preset": {"name": "a", "keys": 1}}},
        {"spec": {"preset": {"name": "b", "keys": 1}}},
        "preset",
        "a",
    ),
    ("needle", {"spec": {"haystack": "pg"}}, {"spec": {"haystack": "pydoc"}}, "haystack", "pg"),
    ("needle", {"spec": {"text_field": "body"}}, {}, "text_field", "body"),
    ("needle", {"spec": {"depths": [0, 50]}}, {"spec": {"depths": [0, 100]}}, "depths", "0,50"),
    ("needle", {"spec": {"random_depth": True, "depths": [0]}}, {"spec": {"depths": [0]}}, "depths", "random"),
    ("needle", {"spec": {"samples": 2}}, {"spec": {"samples": 3}}, "samples", "2"),
    ("needle", {"spec": {"seed": 1}}, {"spec": {"seed": 2}}, "seed", "1"),
    ("needle", {"seed": 1}, {"seed": 2}, "seed", "1"),
    ("needle", {"spec": {"scoring": "forced"}}, {"spec": {"scoring": "generate"}}, "scoring", "forced"),
    ("needle", {"spec": {"max_new_tokens": 8}}, {"spec": {"max_new_tokens": 16}}, "max_new_tokens", "8"),
    ("needle", {"spec": {"chat_template": True}}, {"spec": {"chat_template": False}}, "chat_template", "on"),
    ("needle", {"spec": {"snap": "sentence"}}, {"spec": {"snap": "token"}}, "snap", "sentence"),
    ("passkey", {"spec": {"protocol": "yarn"}}, {}, "protocol", "yarn"),
    ("passkey", {"spec": {"bos": False}}, {}, "bos", "off"),
]


@pytest.mark.parametrize(
    "task, record_a, record_b, field, shown",
    DIFFERING,
    ids=[f"{t}-{f}-{i}" for i, (t, _, _, f, _) in enumerate(DIFFERING)],
)
def test_runs_that_differ_in_one_protocol_field_get_two_tables_named_by_that_field(
    task, record_a, record_b, field, shown
):
    from ctxeval.report.runs import field_label

    groups = _groups(task, record_a, record_b)
    assert [len(g.runs) for g in groups] == [1, 1]
    assert field_label(field) == field.replace("_", " ")
    assert groups[0].distinguishing == [field]
    assert groups[0].title.endswith(f": {field_label(field)} {shown}")


# (task, record of run A, record of run B): each pair says the same thing two ways, so the runs share a table
SAME = [
    ("ppl", {"spec": {"text_field": "text"}}, {}),
    ("ppl", {"protocol": {"aggregate": "token"}}, {}),
    ("ppl", {"spec": {"data": "pydoc"}}, {"data": {"spec": "pydoc"}}),
    (
        "ppl",
        {"protocol": {"name": "sliding", "stride": 64, "bos": True}},
        {"spec": {"protocol": "sliding", "stride": 64, "bos": True}},
    ),
    ("entropy", {"spec": {"layers": "all", "heads": "all"}}, {}),
    ("entropy", {"protocol": {"bos": True}}, {"spec": {"bos": True}}),
    ("needle", {"spec": {"text_field": "text"}}, {}),
    ("needle", {"spec": {"seed": 3}}, {"seed": 3}),
    ("needle", {"spec": {"preset": "p"}}, {}),  # the rows' preset stands in for the spec's
    ("needle", {"spec": {"scoring": "generate"}}, {}),  # and the rows' scoring
    ("passkey", {"spec": {"protocol": "ctxeval", "bos": True}}, {}),
    ("passkey", {"spec": {"depths": [0, 50]}}, {"spec": {"depths": [10]}}),  # passkey depths are random either way
]


@pytest.mark.parametrize("task, record_a, record_b", SAME, ids=[f"{t}-{i}" for i, (t, _, _) in enumerate(SAME)])
def test_a_field_written_two_ways_or_left_at_its_default_keeps_runs_in_one_table(task, record_a, record_b):
    groups = _groups(task, record_a, record_b)
    assert len(groups) == 1 and len(groups[0].runs) == 2


def test_the_report_aggregate_given_overrides_the_runs_own_for_the_ppl_key():
    groups = _groups("ppl", {"protocol": {"aggregate": "document"}}, {}, aggregate="document")
    assert len(groups) == 1 and groups[0].key["aggregate"] == "document"


def test_a_run_without_a_preset_in_its_spec_is_keyed_by_its_rows_preset():
    rows_b = [{"model": "m", "label": "none", "doc": "d", "preset": "q", "scoring": "generate"}]
    groups = _groups("needle", {}, {}, rows_b=rows_b)
    assert groups[0].distinguishing == ["preset"] and groups[0].key["preset"] == "p"


def test_documents_come_from_run_json_in_its_order_else_from_the_rows_in_first_appearance_order():
    from ctxeval.report.runs import documents

    rows = [{"doc": d, "model": "m"} for d in ("a", "b", "a", 3)]
    listed = _run("ppl", {"data": {"documents": [{"doc": "z"}, "not a dict", {"doc": 7}]}}, rows=rows)
    assert documents(listed) == ["z", "7"]
    assert documents(_run("ppl", {}, rows=rows)) == ["a", "b", "3"]
    assert documents(_run("ppl", {"data": {"documents": []}}, rows=rows)) == ["a", "b", "3"]
    assert documents(_run("ppl", {"data": None}, rows=rows)) == ["a", "b", "3"]


def _report_dir(tmp_path, content, run_json=False):
    folder = tmp_path / "rep"
    folder.mkdir()
    (folder / "report.json").write_text(content)
    if run_json:
        (folder / "run.json").write_text("{}")
    return folder


@pytest.mark.parametrize(
    "content, run_json, expected",
    [
        ('{"settings": {}, "runs": [], "groups": []}', False, True),
        ('{"settings": {"x": NaN}, "runs": [], "groups": [], "more": 1}', False, True),  # a report may hold NaN
        ('{"settings": {}, "runs": [], "groups": []}', True, False),  # run.json makes it a run
        ('{"settings": {}, "runs": []}', False, False),
        ("[1, 2]", False, False),
        ("not json", False, False),
    ],
)
def test_a_report_directory_is_one_with_reports_three_sections_and_no_run_json(tmp_path, content, run_json, expected):
    from ctxeval.report.runs import is_report_dir

    assert is_report_dir(_report_dir(tmp_path, content, run_json)) is expected


def test_a_folder_without_report_json_is_not_a_report_directory(tmp_path):
    from ctxeval.report.runs import is_report_dir

    assert is_report_dir(tmp_path) is False


def _ppl_run(folder: Path, status="success", extra_rows="") -> Path:
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"spec": {"task": "ppl"}, "status": status}))
    row = {
        "task": "ppl",
        "model": "m",
        "label": "none",
        "length": 8,
        "doc": "d",
        "status": "ok",
        "nll_sum": 1.0,
        "n_tokens": 4,
    }
    (folder / "rows.jsonl").write_text(json.dumps(row) + "\n" + extra_rows)
    return folder


@pytest.mark.parametrize(
    "name, content, message",
    [
        (
            "bad",
            "{nope",
            "bad/run.json cannot be read as a ctxeval run.json (it is not JSON (Expecting property name "
            "enclosed in double quotes at line 1 column 2)); leave this directory out",
        ),
        ("lst", "[1]", "lst/run.json is not a ctxeval run.json (not a JSON object); leave this directory out"),
        (
            "fld",
            '{"spec": [1]}',
            "fld/run.json: 'spec' is not a JSON object, as ctxeval writes it; not a ctxeval "
            "run.json: leave this directory out",
        ),
        (
            "hist",
            '{"history": {"a": 1}}',
            "hist/run.json: 'history' is not a JSON list, as ctxeval writes it; not a "
            "ctxeval run.json: leave this directory out",
        ),
        (
            "meth",
            '{"spec": {"methods": "none"}}',
            "meth/run.json: 'spec.methods' is not a JSON list, as ctxeval writes "
            "it; not a ctxeval run.json: leave this directory out",
        ),
    ],
)
def test_a_run_json_that_is_not_ctxevals_is_refused_in_one_line_naming_what_is_wrong(
    tmp_path, monkeypatch, name, content, message
):
    from ctxeval.report.runs import load_run

    monkeypatch.chdir(tmp_path)
    Path(name).mkdir()
    Path(name, "run.json").write_text(content)
    with pytest.raises(CtxevalError) as err:
        load_run(name)
    assert str(err.value) == message


def test_a_folder_of_runs_given_as_one_run_names_the_count_the_first_and_the_glob(tmp_path, monkeypatch):
    from ctxeval.report.runs import load_run

    monkeypatch.chdir(tmp_path)
    for name in ("b", "a"):
        Path("outer", name).mkdir(parents=True)
        Path("outer", name, "run.json").write_text("{}")
    with pytest.raises(CtxevalError) as err:
        load_run("outer/")
    assert str(err.value) == "outer is not a run directory but holds 2 (e.g. a); pass them one by one, e.g. outer/*/"


def test_a_run_json_may_hold_nan_and_a_run_is_loaded_with_its_rows(tmp_path):
    from ctxeval.report.runs import load_run

    folder = _ppl_run(tmp_path / "r")
    (folder / "run.json").write_text('{"spec": {"task": "ppl", "x": NaN}, "status": "running"}')
    run = load_run(folder)
    assert run.task == "ppl" and len(run.rows) == 1 and math.isnan(run.spec["x"])


def test_load_runs_notes_a_run_given_twice_keeps_going_and_notes_skipped_lines_and_incomplete_runs(tmp_path):
    from ctxeval.report.runs import load_runs

    a = _ppl_run(tmp_path / "a")
    b = _ppl_run(tmp_path / "b", status="running", extra_rows="not json\n")
    runs, notes = load_runs([a, str(a) + "/", b])
    assert [r.name for r in runs] == [str(a), str(b)]
    assert notes[0] == f"{a} was given twice (as {a}); used once"
    assert notes[1].startswith(f"{b}: ") and "line 2" in notes[1]
    assert notes[2] == f"{b} is incomplete (status running): cells it did not reach show as —"
    assert len(notes) == 3  # a finished run gets no such note
    with pytest.raises(CtxevalError) as err:
        load_runs([])
    assert str(err.value) == (
        "no run directories given; pass one or more directories written by ctxeval ppl, "
        "needle, passkey, entropy, ruler, lm-eval or tune"
    )


def test_single_accepts_one_table_per_kind_and_refuses_two_naming_each_runs_differing_fields():
    from ctxeval.report.registry import KINDS
    from ctxeval.report.runs import group_runs

    one = [_run("ppl", {"spec": {"stride": 8}}, 0), _run("ppl", {"spec": {"stride": 8}}, 1)]
    assert len(group_runs(one, KINDS, single=True)) == 1
    two = [_run("ppl", {"spec": {"stride": 8, "bos": True}}, 0), _run("ppl", {"spec": {"stride": 16, "bos": False}}, 1)]
    with pytest.raises(CtxevalError) as err:
        group_runs(two, KINDS, single=True)
    assert str(err.value) == (
        "--single: the ppl runs differ in stride, bos (run0: stride 8, bos on; run1: stride 16, "
        "bos off); drop --single to get one table per protocol, or leave runs out"
    )


def test_canon_is_key_order_free_json_with_other_values_as_text():
    from ctxeval.report.runs import canon

    assert canon({"b": 1, "a": Path("x")}) == '{"a": "x", "b": 1}'
    groups = _groups(
        "ppl", {"spec": {"data": {"name": "pydoc", "split": "x"}}}, {"spec": {"data": {"split": "x", "name": "pydoc"}}}
    )
    assert len(groups) == 1


_ROW = json.dumps(
    {
        "task": "ppl",
        "model": "m",
        "label": "none",
        "length": 8,
        "doc": "d",
        "status": "ok",
        "nll_sum": 1.0,
        "n_tokens": 4,
    }
)


_NOT_RUN_JSON = "not a ctxeval run.json: leave this directory out"


@pytest.mark.parametrize(
    "name, run_json, rows, message",
    [
        (
            "lengths",
            '{"spec": {"task": "ppl", "lengths": 5}}',
            _ROW,
            f"lengths/run.json: 'spec.lengths' is not a JSON list, as ctxeval writes it; {_NOT_RUN_JSON}",
        ),
        (
            "tasks",
            '{"spec": {"task": "ppl", "tasks": "vt"}}',
            _ROW,
            f"tasks/run.json: 'spec.tasks' is not a JSON list, as ctxeval writes it; {_NOT_RUN_JSON}",
        ),
        (
            "docs",
            '{"spec": {"task": "ppl"}, "data": {"documents": {}}}',
            _ROW,
            f"docs/run.json: 'data.documents' is not a JSON list, as ctxeval writes it; {_NOT_RUN_JSON}",
        ),
        (
            "agg",
            '{"spec": {"task": "ppl"}, "protocol": {"aggregate": "' + "m" * 50 + '"}}',
            _ROW,
            f"agg/run.json: protocol aggregate '{'m' * 40}' is not one of token, window; {_NOT_RUN_JSON}",
        ),
        (
            "thr0",
            '{"spec": {"task": "ppl"}, "protocol": {"threshold": 0}}',
            _ROW,
            f"thr0/run.json: protocol threshold 0 is not a number in (0, 100]; {_NOT_RUN_JSON}",
        ),
        (
            "thr1005",
            '{"spec": {"task": "ppl"}, "protocol": {"threshold": 100.5}}',
            _ROW,
            f"thr1005/run.json: protocol threshold 100.5 is not a number in (0, 100]; {_NOT_RUN_JSON}",
        ),
        (
            "thrabc",
            '{"spec": {"task": "ppl"}, "protocol": {"threshold": "abc"}}',
            _ROW,
            f"thrabc/run.json: protocol threshold 'abc' is not a number in (0, 100]; {_NOT_RUN_JSON}",
        ),
        (
            "task",
            '{"spec": {"task": "' + "b" * 50 + '"}}',
            _ROW,
            f"task: unknown task '{'b' * 40}' in run.json; ctxeval report merges ppl, needle, passkey, entropy, ruler, "
            "lm-eval and tune runs",
        ),
        (
            "tasknum",
            '{"spec": {"task": 5}}',
            _ROW,
            "tasknum: unknown task '5' in run.json; ctxeval report merges ppl, needle, passkey, entropy, ruler, lm-eval "
            "and tune runs",
        ),
        (
            "rulerempty",
            '{"spec": {"task": "ruler", "tasks": []}}',
            _ROW,
            f"rulerempty/run.json: a RULER run's spec.tasks is not a list of task names; {_NOT_RUN_JSON}",
        ),
        (
            "rulerint",
            '{"spec": {"task": "ruler", "tasks": [1]}}',
            _ROW,
            f"rulerint/run.json: a RULER run's spec.tasks is not a list of task names; {_NOT_RUN_JSON}",
        ),
        (
            "badrows",
            '{"spec": {"task": "ppl"}}',
            "not json\n[1]\n{bad\n",
            "badrows/rows.jsonl holds no usable rows (line 1: not JSON; line 2: not a JSON object (a list); ctxeval writes "
            "one UTF-8 JSON object per line); resume the run with its original command, or leave it out",
        ),
        (
            "norows",
            '{"spec": {"task": "ppl"}}',
            "",
            "norows has no measured rows (rows.jsonl missing or empty); resume the run with its original command, or leave "
            "it out",
        ),
        (
            "latin",
            b'{"spec": {"task": "ppl", "x": "\xe9"}}',
            _ROW,
            "latin/run.json cannot be read as a ctxeval run.json (it is not UTF-8 text: byte 0xe9 at offset 31); leave this "
            "directory out",
        ),
    ],
)
def test_load_run_refuses_each_inconsistent_run_in_one_line(tmp_path, monkeypatch, name, run_json, rows, message):
    from ctxeval.report.runs import load_run

    monkeypatch.chdir(tmp_path)
    Path(name).mkdir()
    Path(name, "run.json").write_bytes(run_json if isinstance(run_json, bytes) else run_json.encode())
    Path(name, "rows.jsonl").write_text(rows)
    with pytest.raises(CtxevalError) as err:
        load_run(name + "/")
    assert str(err.value) == message


@pytest.mark.parametrize(
    "run_json",
    [
        '{"spec": {"task": "ppl"}, "protocol": {"threshold": 1}}',
        '{"spec": {"task": "ppl"}, "protocol": {"threshold": 100}}',
        '{"spec": {}}',  # the task is read from the first row
        '{"spec": {"task": "ruler", "tasks": ["vt"]}}',
    ],
)
def test_load_run_accepts_thresholds_up_to_100_and_takes_a_missing_task_from_the_rows(tmp_path, run_json):
    from ctxeval.report.runs import load_run

    (tmp_path / "run.json").write_text(run_json)
    row = json.loads(_ROW)
    if "ruler" in run_json:
        row.update({"task": "ruler", "ruler_task": "vt", "sample": 0, "score": 1.0})
    (tmp_path / "rows.jsonl").write_text(json.dumps(row) + "\n")
    run = load_run(tmp_path)
    assert run.task == row["task"] and len(run.rows) == 1 and run.order == 0


def test_load_run_drops_rows_its_task_cannot_use_and_says_so(tmp_path):
    from ctxeval.report.runs import load_run

    (tmp_path / "run.json").write_text('{"spec": {"task": "ppl"}}')
    half = json.dumps({"task": "ppl", "model": "m", "label": "none", "length": 16, "doc": "d", "status": "ok"})
    (tmp_path / "rows.jsonl").write_text(_ROW + "\n" + half + "\n")
    run = load_run(tmp_path)
    assert len(run.rows) == 1 and "line 2: lacks nll_sum, n_tokens (not a ctxeval ppl row)" in run.skipped


def test_the_root_folder_is_named_as_given():
    from ctxeval.report.runs import load_run, not_a_run

    assert not_a_run("/") == "/ is not a ctxeval run directory (no run.json)"
    with pytest.raises(CtxevalError, match="^/ is not a ctxeval run directory"):
        load_run("/")


def test_expand_run_args_replaces_folders_of_runs_keeps_runs_and_notes_what_it_did(tmp_path):
    from ctxeval.report.runs import expand_run_args

    single = _ppl_run(tmp_path / "single")
    _ppl_run(single / "nested")  # a run directory is used as itself, whatever it holds
    folder = tmp_path / "folder"
    for name in ("r2", "r1"):
        _ppl_run(folder / name)
    (folder / "README.md").write_text("x")
    (tmp_path / "notes.txt").write_text("x")
    kept, notes = expand_run_args([single, str(folder) + "/", tmp_path / "notes.txt"])
    assert kept == [single, folder / "r1", folder / "r2"]
    assert notes == [
        f"{tmp_path / 'notes.txt'} is a file, not a run directory; skipped",
        f"{folder} is a folder of run directories: using the 2 directly inside it, in name order (1 other "
        "entry in it not run directories)",
    ]
    (folder / "more.md").write_text("x")
    assert expand_run_args([folder])[1] == [
        f"{folder} is a folder of run directories: using the 2 directly inside "
        "it, in name order (2 other entries in it not run directories)"
    ]
    (folder / "README.md").unlink()
    (folder / "more.md").unlink()
    assert expand_run_args([folder])[1] == [
        f"{folder} is a folder of run directories: using the 2 directly inside it, in name order"
    ]
    with pytest.raises(CtxevalError) as err:
        expand_run_args([tmp_path / "notes.txt"])
    assert str(err.value) == (
        f"{tmp_path / 'notes.txt'} is a file, not a run directory; pass the directory that "
        "holds run.json and rows.jsonl"
    )


@pytest.mark.parametrize(
    "value, text",
    [
        (True, "on"),
        (False, "off"),
        (None, "none"),
        (0.5, "0.5"),
        (1e-7, "1e-07"),
        ([], "none"),
        (["a", 1.5], "a,1.5"),
        ({"b": 1, "a": 2}, '{"a": 2, "b": 1}'),
        ("  two   words ", "two words"),
        ("x" * 48, "x" * 48),
        ("x" * 49, "x" * 45 + "..."),
        ("a" * 30 + " " + "b" * 15 + " " + "c" * 10, "a" * 30 + "..."),  # the last space before 46, not the one at 46
        ("a" * 24 + " " + "b" * 30, "a" * 24 + " " + "b" * 20 + "..."),  # a space at 24 is too early: cut at 45
        ("a" * 25 + " " + "b" * 30, "a" * 25 + "..."),
        ("X" * 29 + ", " + "y" * 20, "X" * 29 + "..."),  # no comma before the dots
    ],
)
def test_fmt_value_writes_protocol_fields_for_headings(value, text):
    from ctxeval.report.runs import fmt_value

    assert fmt_value(value) == text


def test_paths_are_named_as_given_less_trailing_slashes_whatever_their_last_letter(tmp_path, monkeypatch):
    from ctxeval.report.runs import expand_run_args, load_run, not_a_run

    monkeypatch.chdir(tmp_path)
    for name in ("a", "b"):
        _ppl_run(Path("outX", name))
    with pytest.raises(CtxevalError, match=r"^outX is not a run directory but holds 2 \(e\.g\. a\)"):
        load_run("outX/")
    assert expand_run_args(["outX/"])[1][0].startswith("outX is a folder of run directories")
    Path("notesX").write_text("x")
    assert not_a_run("notesX/") == "notesX is a file, not a run directory"


def test_a_run_without_a_task_in_its_spec_or_any_row_is_refused(tmp_path):
    from ctxeval.report.runs import load_run

    (tmp_path / "run.json").write_text('{"spec": {}}')
    (tmp_path / "rows.jsonl").write_text("")
    with pytest.raises(CtxevalError, match=r": unknown task 'None' in run\.json; ctxeval report merges"):
        load_run(tmp_path)
