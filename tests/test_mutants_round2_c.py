"""Issue 27, round 2's second pass: tests for the mutants that survived in the rest of report/tables.py,
report/runs.py, ruler_eval.py and RULER's generators (each test names the behaviour it pins down)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pandas.testing import assert_frame_equal

from ctxeval.errors import CtxevalError

# ---------------------------------------------------------------------------------------------------------------
# runs: protocol keys, documents, report directories


def _run(task, record, order=0, rows=None):
    from ctxeval.report.runs import Run

    rows = (
        rows
        if rows is not None
        else [{"model": "m", "label": "none", "doc": "d", "preset": "p", "scoring": "generate"}]
    )
    return Run(Path(f"run{order}"), f"run{order}", task, record, rows, order)


def _groups(task, record_a, record_b, rows_a=None, rows_b=None, aggregate=None):
    from ctxeval.report.runs import group_runs

    runs = [_run(task, record_a, 0, rows_a), _run(task, record_b, 1, rows_b)]
    return [g for g in group_runs(runs, aggregate) if g.kind == task]


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


# ---------------------------------------------------------------------------------------------------------------
# tables: the long and wide tables every report is built from, and how cells are written


def _pos(label, length, doc, edges, nll, tokens, status="ok", model="m"):
    return {
        "model": model,
        "label": label,
        "length": length,
        "doc": doc,
        "status": status,
        "position_edges": edges,
        "position_nll_sum": nll,
        "position_tokens": tokens,
    }


def _doc(label, length, doc, nll, tokens, status="ok", windows=None):
    row = {
        "model": "m",
        "label": label,
        "length": length,
        "doc": doc,
        "status": status,
        "nll_sum": nll,
        "n_tokens": tokens,
    }
    if windows is not None:
        row.update({"window_nll_sum": windows[0], "n_windows": windows[1]})
    return row


def test_ppl_long_pools_tokens_or_windows_and_a_failed_document_makes_the_point_missing_in_row_order():
    from ctxeval.report.tables import ppl_long

    rows = [
        _doc("b", 64, "d1", 64.0, 32, windows=(3.0, 3)),
        _doc("b", 64, "d2", 0.0, 32, windows=(0.0, 1)),
        _doc("b", 32, "d1", None, None, status="oom"),
        _doc("b", 32, "d2", None, None, status="skipped"),
        _doc("a", 64, "d1", 10.0, 10, windows=(1.0, 1)),
        _doc("a", 64, "d2", None, None, status="oom"),
    ]
    expected = pd.DataFrame(
        [
            {
                "model": "m",
                "label": "b",
                "length": 64,
                "ppl": math.exp(1.0),
                "n_tokens": 64,
                "n_docs": 2,
                "status": "ok",
            },
            {
                "model": "m",
                "label": "b",
                "length": 32,
                "ppl": float("nan"),
                "n_tokens": 0,
                "n_docs": 0,
                "status": "oom",
            },
            {
                "model": "m",
                "label": "a",
                "length": 64,
                "ppl": float("nan"),
                "n_tokens": 10,
                "n_docs": 1,
                "status": "oom",
            },
        ]
    )
    assert_frame_equal(ppl_long(rows), expected)
    assert ppl_long(rows, "window")["ppl"].iloc[0] == pytest.approx(math.exp(3.0 / 4), rel=1e-12)
    assert list(ppl_long([]).columns) == list(expected.columns)
    with pytest.raises(CtxevalError, match="--aggregate must be token or window, got 'mean'"):
        ppl_long(rows, "mean")


def test_positions_long_sums_buckets_over_documents_at_each_methods_longest_length():
    from ctxeval.report.tables import positions_long

    rows = [
        _pos("b", 32, "d1", [0, 4, 32], [9.0, 9.0], [4, 28]),  # shorter: not used
        _pos("b", 64, "d1", [0, 1, 8, 16, 64], [2.0, 0.0, 6.0, 40.0], [1, 0, 8, 48]),
        _pos("b", 64, "d2", [0, 1, 8, 16, 64], [4.0, 0.0, 10.0, 56.0], [1, 0, 8, 48]),
        _pos("b", 64, "d3", [0, 1, 8, 16, 64], [99.0, 0.0, 99.0, 99.0], [1, 0, 8, 48], status="oom"),
        _pos("b", 64, "d4", [0, 32, 64], [1.0, 1.0], [32, 32]),  # other edges than the point's first row: left out
        {"model": "m", "label": "b", "length": 64, "doc": "d5", "status": "ok"},  # an older row without positions
        _pos("a", 128, "d1", [0, 128], [256.0], [128]),  # one bucket
        _pos("c", 128, "d1", [5], [], []),  # edges without a bucket: left out, so c's longest length is 64
        _pos("c", 64, "d1", [0, 64], [64.0], [64]),
    ]
    got = positions_long(rows)
    expected = pd.DataFrame(
        [
            {
                "model": "m",
                "label": "b",
                "length": 64,
                "start": 0,
                "stop": 1,
                "tokens": 2,
                "nll": 3.0,
                "ppl": math.exp(3.0),
                "n_docs": 2,
            },
            {
                "model": "m",
                "label": "b",
                "length": 64,
                "start": 8,
                "stop": 16,
                "tokens": 16,
                "nll": 1.0,
                "ppl": math.exp(1.0),
                "n_docs": 2,
            },
            {
                "model": "m",
                "label": "b",
                "length": 64,
                "start": 16,
                "stop": 64,
                "tokens": 96,
                "nll": 1.0,
                "ppl": math.exp(1.0),
                "n_docs": 2,
            },
            {
                "model": "m",
                "label": "a",
                "length": 128,
                "start": 0,
                "stop": 128,
                "tokens": 128,
                "nll": 2.0,
                "ppl": math.exp(2.0),
                "n_docs": 1,
            },
            {
                "model": "m",
                "label": "c",
                "length": 64,
                "start": 0,
                "stop": 64,
                "tokens": 64,
                "nll": 1.0,
                "ppl": math.exp(1.0),
                "n_docs": 1,
            },
        ]
    )
    assert_frame_equal(got.reset_index(drop=True), expected)


def test_positions_long_keeps_its_columns_when_nothing_has_positions():
    from ctxeval.report.tables import positions_long

    columns = ["model", "label", "length", "start", "stop", "tokens", "nll", "ppl", "n_docs"]
    assert list(positions_long([]).columns) == columns
    assert (
        list(positions_long([{"model": "m", "label": "a", "length": 8, "doc": "d", "status": "ok"}]).columns) == columns
    )
    failed = [_pos("a", 8, "d", [0, 8], [1.0], [8], status="oom")]
    assert list(positions_long(failed).columns) == columns


def _key(label, length, doc, key_tokens, key_nll, status="ok"):
    return {
        "model": "m",
        "label": label,
        "length": length,
        "doc": doc,
        "status": status,
        "key_tokens": key_tokens,
        "key_nll_sum": key_nll,
    }


def test_longppl_long_pools_key_tokens_and_a_failed_or_uncounted_document_makes_the_point_missing():
    from ctxeval.report.tables import longppl_long

    rows = [
        _key("b", 64, "d1", 3, 3.0),
        _key("b", 64, "d2", 1, 5.0, status="oom"),  # failed point first
        _key("b", 128, "d1", 0, 0.0),
        _key("b", 128, "d2", 0, 0.0),  # no key tokens at all
        _key("a", 64, "d1", 2, 1.0),
        _key("a", 64, "d2", 2, 3.0),
        _key("a", 128, "d1", None, None),  # measured, but its key tokens were not counted
    ]
    got = longppl_long(rows)
    nan = float("nan")
    expected = pd.DataFrame(
        [
            {"model": "m", "label": "b", "length": 64, "longppl": nan, "key_tokens": nan, "n_docs": 1, "status": "oom"},
            {
                "model": "m",
                "label": "b",
                "length": 128,
                "longppl": nan,
                "key_tokens": 0,
                "n_docs": 2,
                "status": "no key tokens",
            },
            {
                "model": "m",
                "label": "a",
                "length": 64,
                "longppl": math.exp(1.0),
                "key_tokens": 4,
                "n_docs": 2,
                "status": "ok",
            },
            {
                "model": "m",
                "label": "a",
                "length": 128,
                "longppl": nan,
                "key_tokens": nan,
                "n_docs": 0,
                "status": "missing",
            },
        ]
    )
    assert_frame_equal(got, expected, check_dtype=False)
    assert list(longppl_long([]).columns) == list(expected.columns)


def test_needle_long_makes_lengths_integers_and_keeps_the_last_row_of_a_sample():
    from ctxeval.report.tables import needle_long

    rows = [
        {"model": "m", "label": "a", "length": 64.0, "depth": 0, "sample": 0, "status": "oom", "correct": None},
        {"model": "m", "label": "a", "length": 64.0, "depth": 0, "sample": 0, "status": "ok", "correct": 1.0},
    ]
    got = needle_long(rows)
    assert got["length"].dtype == np.int64 and list(got["length"]) == [64] and list(got["status"]) == ["ok"]


def _needle(label, length, depth, sample, correct, status="ok"):
    return {
        "model": "m",
        "label": label,
        "length": length,
        "depth": depth,
        "sample": sample,
        "status": status,
        "correct": correct,
    }


NEEDLE_ROWS = [
    _needle("b", 128, 50, 0, 1.0),
    _needle("b", 128, 50, 1, 0.0),
    _needle("b", 128, 0, 0, 1.0),
    _needle("b", 64, 50, 0, 1.0),
    _needle("b", 64, 0, 0, 1.0),
    _needle("b", 256, 0, 0, None, status="oom"),
    _needle("a", 64, 0, 0, 0.0),
    _needle("a", 128, 0, 0, 1.0),
    _needle("b", 64, 100, 0, None, status="oom"),
]


def test_accuracy_grid_is_mean_accuracy_by_depth_and_length_with_each_cells_status():
    from ctxeval.report.tables import accuracy_grid

    grid, status = accuracy_grid(pd.DataFrame(NEEDLE_ROWS), "b")
    # depth 100 failed everywhere it was tried: its row stays, empty, beside its status
    expected = pd.DataFrame(
        {64: [1.0, 1.0, np.nan], 128: [1.0, 0.5, np.nan], 256: [np.nan, np.nan, np.nan]}, index=[0, 50, 100]
    )
    assert_frame_equal(grid, expected, check_names=False)
    assert list(grid.index) == [0, 50, 100] and list(grid.columns) == [64, 128, 256]
    assert status.fillna("-").to_dict() == {
        64: {0: "ok", 50: "ok", 100: "oom"},
        128: {0: "ok", 50: "ok", 100: "-"},
        256: {0: "oom", 50: "-", 100: "-"},
    }


def test_needle_summary_is_mean_accuracy_per_method_in_the_given_order_with_every_length_and_the_effective_length():
    from ctxeval.report.tables import needle_summary

    got = needle_summary(pd.DataFrame(NEEDLE_ROWS), ["b", "zzz", "a"], threshold=0.75)
    assert list(got.index) == ["b", "a"] and list(got.columns) == [64, 128, 256, "effective length"]
    assert got.loc["b", 64] == 1.0 and got.loc["b", 128] == 2 / 3 and math.isnan(got.loc["b", 256])
    assert got.loc["a", 64] == 0.0 and got.loc["a", 128] == 1.0 and math.isnan(got.loc["a", 256])
    assert got["effective length"].iloc[0] == 64 and math.isnan(got["effective length"].iloc[1])


def test_passkey_summary_has_the_yarn_figures_and_the_contiguous_effective_length_per_method():
    from ctxeval.report.tables import passkey_summary

    got = passkey_summary(pd.DataFrame(NEEDLE_ROWS), ["b", "a"], threshold=0.75)
    assert list(got.columns) == ["method", "passkey context", "passkey accuracy", "effective length"]
    assert got.to_dict("records")[0] == {
        "method": "b",
        "passkey context": 64,
        "passkey accuracy": 1.0,
        "effective length": 64,
    }
    a = got.to_dict("records")[1]
    assert (a["method"], a["passkey context"], a["passkey accuracy"]) == ("a", 128, 0.5)
    assert math.isnan(a["effective length"])  # a's 64 fails: no contiguous length


def _long(label, length, ppl, status="ok"):
    return {"model": "m", "label": label, "length": length, "ppl": ppl, "status": status}


def test_ppl_wide_orders_methods_as_given_and_keeps_a_length_every_method_failed_at():
    from ctxeval.report.tables import ppl_wide, status_wide

    long = pd.DataFrame(
        [
            _long("a", 64, 3.0),
            _long("b", 64, 2.0),
            _long("a", 128, float("nan"), "oom"),
            _long("b", 128, float("nan"), "oom"),
            _long("c", 64, 9.0),
        ]
    )
    wide = ppl_wide(long, ["c", "b", "a"])
    assert list(wide.index) == ["c", "b", "a"] and list(wide.columns) == [64, 128]
    assert wide.loc["b", 64] == 2.0 and math.isnan(wide.loc["a", 128])
    status = status_wide(long, wide.loc[["b", "a"], [128]])
    assert list(status.index) == ["b", "a"] and list(status.columns) == [128]
    assert list(status[128]) == ["oom", "oom"]


def test_ppl_cells_writes_the_method_column_lengths_values_and_failure_marks():
    from ctxeval.report.tables import ppl_cells

    wide = pd.DataFrame({64: [3.14159, np.nan], 2048: [1234.5, 2.0]}, index=["a", "b"])
    status = pd.DataFrame({64: ["ok", "oom"], 2048: ["ok", "ok"]}, index=["a", "b"])
    assert ppl_cells(wide, status) == (["method", "64", "2k"], [["a", "3.14", "1,234"], ["b", "OOM", "2.00"]])
    assert ppl_cells(wide)[1][1] == ["b", "—", "2.00"]


@pytest.mark.parametrize(
    "value, status, text",
    [
        (1000.0, None, "1,000"),
        (999.994, None, "999.99"),
        (float("nan"), "oom", "OOM"),
        (None, "skipped", "skip"),
    ],
)
def test_fmt_ppl_uses_thousands_from_1000(value, status, text):
    from ctxeval.report.tables import fmt_ppl

    assert fmt_ppl(value, status) == text


def test_fmt_acc_shows_a_failed_cells_status():
    from ctxeval.report.tables import fmt_acc

    assert fmt_acc(float("nan"), "oom") == "OOM" and fmt_acc(0.5) == "50%"


@pytest.mark.parametrize(
    "start, stop, label, center",
    [
        (5, 6, "5", 5.0),
        (0, 1, "0", 1.0),
        (0, 4, "0-4", math.sqrt(3)),
        (4, 8, "4-8", math.sqrt(28)),
        (1024, 2048, "1k-2k", math.sqrt(1024 * 2047)),
        (2, 3, "2", 2.0),
    ],
)
def test_bucket_label_and_center(start, stop, label, center):
    from ctxeval.report.tables import bucket_center, bucket_label

    assert bucket_label(start, stop) == label
    assert bucket_center(start, stop) == pytest.approx(center, rel=1e-12)


@pytest.mark.parametrize(
    "value, text",
    [
        (None, ""),
        (float("nan"), ""),
        (float("inf"), ""),
        (3, "3"),
        (np.int64(4), "4"),
        (True, "1"),
        (2.5, "2.5"),
        (1 / 3, "0.333333"),
        (1e-7, "1e-07"),
        (np.float32(0.5), "0.5"),
        (1234567, "1234567"),
        (1234567.0, "1.23457e+06"),
    ],
)
def test_csv_value(value, text):
    from ctxeval.report.tables import csv_value

    assert csv_value(value) == text


@pytest.mark.parametrize("value, text", [(4096, "4k"), (100, "100"), (None, "—"), (float("nan"), "—"), (64.0, "64")])
def test_length_or(value, text):
    from ctxeval.report.tables import length_or

    assert length_or(value, "—") == text


def test_markdown_pads_every_column_to_its_widest_cell_under_a_dash_rule_two_wider():
    from ctxeval.report.tables import markdown

    assert markdown(["method", "64"], [["a", "3.14"], ["yarn(factor=2)", "—"]]) == (
        "| method         | 64   |\n|----------------|------|\n| a              | 3.14 |\n| yarn(factor=2) | —    |\n"
    )


def _sample(label, task, length, sample, score, status="ok"):
    return {
        "model": "m",
        "label": label,
        "ruler_task": task,
        "length": length,
        "sample": sample,
        "score": score,
        "status": status,
    }


def test_ruler_task_scores_round_the_mean_to_two_decimals_and_a_failed_sample_makes_the_task_missing():
    from ctxeval.report.tables import ruler_task_scores

    rows = [
        _sample("b", "vt", 64, 0, 1.0),
        _sample("b", "vt", 64, 1, 0.0),
        _sample("b", "vt", 64, 2, 0.0),
        _sample("b", "cwe", 64, 0, 1.0),
        _sample("b", "cwe", 64, 1, None, status="oom"),
        _sample("a", "vt", 64, 0, 1.0),
    ]
    got = ruler_task_scores(rows)
    expected = pd.DataFrame(
        [
            {
                "model": "m",
                "label": "b",
                "ruler_task": "vt",
                "length": 64,
                "score": 33.33,
                "samples": 3,
                "status": "ok",
            },
            {
                "model": "m",
                "label": "b",
                "ruler_task": "cwe",
                "length": 64,
                "score": float("nan"),
                "samples": 1,
                "status": "oom",
            },
            {
                "model": "m",
                "label": "a",
                "ruler_task": "vt",
                "length": 64,
                "score": 100.0,
                "samples": 1,
                "status": "ok",
            },
        ]
    )
    assert_frame_equal(got, expected)
    assert list(ruler_task_scores([]).columns) == list(expected.columns)


def test_ruler_means_need_every_task_and_keep_the_rows_order():
    from ctxeval.report.tables import ruler_means

    scores = pd.DataFrame(
        [
            {"model": "m", "label": "b", "ruler_task": "vt", "length": 64, "score": 50.0},
            {"model": "m", "label": "b", "ruler_task": "cwe", "length": 64, "score": 100.0},
            {"model": "m", "label": "a", "ruler_task": "vt", "length": 64, "score": 10.0},
            {"model": "m", "label": "a", "ruler_task": "cwe", "length": 64, "score": float("nan")},
        ]
    )
    got = ruler_means(scores, ["vt", "cwe"])
    assert list(got.columns) == ["model", "label", "length", "mean"]
    assert list(got["label"]) == ["b", "a"] and got["mean"].iloc[0] == 75.0 and math.isnan(got["mean"].iloc[1])
    empty = ruler_means(scores.iloc[:0], ["vt"])
    assert list(empty.columns) == ["model", "label", "length", "mean"] and empty.empty


# ---------------------------------------------------------------------------------------------------------------
# runs: loading run directories, the one-line refusals and the notes a report prints


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
    from ctxeval.report.runs import group_runs

    one = [_run("ppl", {"spec": {"stride": 8}}, 0), _run("ppl", {"spec": {"stride": 8}}, 1)]
    assert len(group_runs(one, single=True)) == 1
    two = [_run("ppl", {"spec": {"stride": 8, "bos": True}}, 0), _run("ppl", {"spec": {"stride": 16, "bos": False}}, 1)]
    with pytest.raises(CtxevalError) as err:
        group_runs(two, single=True)
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


# ---------------------------------------------------------------------------------------------------------------
# ruler_eval: reading RULER's sample files and measuring in batches


def _samples_file(tmp_path, *lines):
    path = tmp_path / "validation.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_read_samples_fills_rulers_optional_fields_with_their_defaults(tmp_path):
    from ctxeval.evals.ruler.run import read_samples

    path = _samples_file(
        tmp_path,
        json.dumps({"input": "a", "outputs": [7]}),
        json.dumps(
            {
                "index": 99,
                "input": "b",
                "outputs": ["x"],
                "length": 12,
                "answer_prefix": " A:",
                "token_position_answer": 3,
            }
        ),
    )
    first, second = read_samples(path, "vt", 64)
    assert (
        first.index,
        first.input,
        first.outputs,
        first.length,
        first.answer_prefix,
        first.token_position_answer,
    ) == (0, "a", ["7"], -1, "", None)
    assert (second.index, second.length, second.answer_prefix, second.token_position_answer) == (1, 12, " A:", 3)


@pytest.mark.parametrize(
    "lines, message",
    [
        (
            ("[1, 2]",),
            "{path} line 1 is not a RULER sample (not a JSON object); it needs input, outputs and answer_prefix",
        ),
        (
            ('{"input": "a", "outputs": ["x"]}', "{nope"),
            "{path} line 2 is not a RULER sample ({why}); it needs a JSON object with input, outputs and answer_prefix, in "
            "UTF-8",
        ),
        ((), "{path} holds no samples"),
    ],
)
def test_read_samples_refuses_a_line_that_is_not_a_sample_naming_the_line(tmp_path, lines, message):
    from ctxeval.evals.ruler.run import read_samples
    from ctxeval.util.textfiles import read_jsonl

    path = _samples_file(tmp_path, *lines)
    problems = read_jsonl(path, "RULER samples file", objects=False).problems
    why = problems[0][1] if problems else ""
    with pytest.raises(CtxevalError) as err:
        read_samples(path, "vt", 64)
    assert str(err.value) == message.format(path=path, why=why)


def test_read_samples_names_the_missing_file_and_what_writes_it(tmp_path):
    from ctxeval.evals.ruler.run import read_samples

    path = tmp_path / "64" / "vt" / "validation.jsonl"
    with pytest.raises(CtxevalError) as err:
        read_samples(path, "vt", 64)
    assert str(err.value) == (
        f"no RULER samples for vt at length 64: {path} is missing (RULER's prepare.py writes "
        "DIR/<length>/<task>/validation.jsonl)"
    )


class _Progress:
    def __init__(self):
        self.lines, self.notes = [], []

    def advance(self, amount, text):
        self.lines.append((amount, text))

    def note(self, text):
        self.notes.append(text)


def _runner(batch_size, predict):
    from ctxeval.evals.ruler.run import RulerRunner

    runner = RulerRunner(None, None, "cpu", "m", batch_size=batch_size, progress=_Progress())
    runner.predict = predict
    return runner


def _ruler_samples(n, first=0):
    from ctxeval.evals.ruler.tasks import RulerSample

    return [RulerSample(first + i, f"prompt {i}", [f"v{i}"], 20, " Answer:") for i in range(n)]


def test_measure_scores_every_sample_once_in_batches_and_counts_them_in_the_progress_line():
    from ctxeval.specs import expand_specs

    seen = []

    def predict(prompts, max_new_tokens, handle, length):
        seen.append(list(prompts))
        return [f" v{p.split()[1].rstrip(' Answer:')}\n" if p.endswith(" Answer:") else "" for p in prompts], [
            11
        ] * len(prompts)

    runner = _runner(2, predict)
    emitted = []
    runner.measure(expand_specs(["none"])[0], "vt", 64, _ruler_samples(3), emitted.append, handle="h")
    assert seen == [["prompt 0 Answer:", "prompt 1 Answer:"], ["prompt 2 Answer:"]]
    assert [[r["sample"] for r in rows] for rows in emitted] == [[0, 1], [2]]
    assert all(
        r["status"] == "ok" and r["prompt_tokens"] == 11 and r["ruler_task"] == "vt" and r["length"] == 64
        for rows in emitted
        for r in rows
    )
    assert [text for _, text in runner.progress.lines] == [
        "none vt L=64 samples 1-2/3 100%",
        "none vt L=64 sample 3/3 100%",
    ]
    assert [amount for amount, _ in runner.progress.lines] == [128, 64]
    runner.progress.lines.clear()
    runner.measure(expand_specs(["none"])[0], "vt", 64, _ruler_samples(1, first=4), lambda rows: None, of=9)
    assert runner.progress.lines[0][1] == "none vt L=64 sample 5/9 100%"
    runner.progress.lines.clear()
    runner.measure(expand_specs(["none"])[0], "vt", 64, _ruler_samples(1, first=4), lambda rows: None)
    assert runner.progress.lines[0][1] == "none vt L=64 sample 5/5 100%"


def test_measure_marks_a_batch_that_runs_out_of_memory_and_stops_that_point():
    from ctxeval.specs import expand_specs

    def predict(prompts, max_new_tokens, handle, length):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB\nmore")

    runner = _runner(2, predict)
    emitted = []
    runner.measure(expand_specs(["none"])[0], "vt", 64, _ruler_samples(3), emitted.append)
    # the batch of two is halved; a batch of one still runs out of memory: every sample of the point is `oom`
    assert len(emitted) == 1 and [r["sample"] for r in emitted[0]] == [0, 1, 2]
    assert all(r["status"] == "oom" and r["note"] == "CUDA out of memory. Tried to allocate 2 GiB" for r in emitted[0])
    assert runner.progress.notes == [
        "none: out of memory at 64 tokens; batch size 1",
        "none: out of memory at 64 tokens; longer lengths skipped",
    ]
    assert {k: emitted[0][0][k] for k in ("model", "label", "task", "ruler_task", "length", "sample", "value")} == {
        "model": "m",
        "label": "none",
        "task": "ruler",
        "ruler_task": "vt",
        "length": 64,
        "sample": 0,
        "value": None,
    }


def test_measure_rows_hold_the_score_prediction_answers_metric_and_seconds_per_sample(monkeypatch):
    from types import SimpleNamespace

    import ctxeval.evals.ruler.run as E
    from ctxeval.evals.ruler.tasks import RulerSample
    from ctxeval.specs import expand_specs

    clock = iter([100.0, 101.23456])
    monkeypatch.setattr(E, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    runner = _runner(2, lambda prompts, max_new_tokens, handle, length: ([" V1 and more\n", "nothing"], [17, 18]))
    samples = [RulerSample(i, f"p{i}", ["v1", "v2"], 20, "") for i in range(2)]
    emitted = []
    runner.measure(expand_specs(["none"])[0], "vt", 64, samples, emitted.append)
    first = emitted[0][0]
    assert {
        k: first[k]
        for k in (
            "model",
            "label",
            "task",
            "ruler_task",
            "length",
            "sample",
            "value",
            "score",
            "prediction",
            "outputs",
            "metric_fn",
            "prompt_tokens",
            "seconds",
            "status",
        )
    } == {
        "model": "m",
        "label": "none",
        "task": "ruler",
        "ruler_task": "vt",
        "length": 64,
        "sample": 0,
        "value": 0.5,
        "score": 0.5,
        "prediction": "V1 and more",
        "outputs": ["v1", "v2"],
        "metric_fn": "string_match_all",
        "prompt_tokens": 17,
        "seconds": 0.617,
        "status": "ok",
    }
    assert emitted[0][1]["score"] == 0.0 and emitted[0][1]["prompt_tokens"] == 18
    runner.measure(expand_specs(["none"])[0], "vt", 64, [], emitted.append)  # nothing to measure: nothing emitted
    assert len(emitted) == 1


# ---------------------------------------------------------------------------------------------------------------
# tables that only a single run's report draws: valid lengths and attention entropy


def test_valid_cells_write_lengths_ppl_and_ratios_with_missing_marks():
    from ctxeval.report.tables import valid_cells, valid_lengths

    nan = float("nan")
    wide = pd.DataFrame(
        {64: [10.0, 12.0, nan], 128: [10.5, 30.0, 9.0], 2048: [10.9, nan, 9.0]}, index=["none", "yarn", "pi"]
    )
    valid = valid_lengths(wide, 64, 0.1)
    headers, rows = valid_cells(valid)
    assert headers == [
        "method",
        "reference length",
        "ppl at reference",
        "longest within 10% of own ppl",
        "x original",
        "longest within 10% of none",
        "x original (vs base)",
    ]
    assert rows == [
        ["none", "64", "10.00", "2k", "32.00", "2k", "32.00"],
        ["yarn", "64", "12.00", "64", "1.00", "—", "—"],
        ["pi", "64", "—", "—", "—", "—", "—"],
    ]  # failed at the reference: no valid length either way


def _entropy_row(label, length, doc, entropy, per_layer, uniform=None, status="ok"):
    row = {
        "task": "entropy",
        "label": label,
        "length": length,
        "doc": doc,
        "entropy": entropy,
        "status": status,
        "layers": [0, 1],
        "entropy_per_layer": per_layer,
    }
    if uniform is not None:
        row["uniform_entropy"] = uniform
    return row


def test_entropy_tables_average_documents_per_method_and_layer_in_the_given_order_with_the_uniform_row():
    from ctxeval.report.tables import entropy_tables
    from ctxeval.runs.rows import UNIFORM_LABEL

    rows = [
        _entropy_row("b", 8, "d1", 9.0, [9.0, 9.0], 2.0),  # replaced by the later row of the same point
        _entropy_row("b", 8, "d1", 1.0, [0.5, 1.5], 2.0),
        _entropy_row("b", 8, "d2", 2.0, [1.5, 2.5], 2.0),
        _entropy_row("b", 16, "d1", 3.0, [3.0, 3.0], 2.5),
        _entropy_row("a", 8, "d1", 4.0, [4.0, 4.0], 2.0),
        _entropy_row("a", 16, "d1", 9.0, [9.0, 9.0], 2.5, status="oom"),
        {"task": "ppl", "label": "a", "length": 8, "doc": "d1", "status": "ok"},
    ]
    wide, layers = entropy_tables(rows, ["b", "c", "a"])
    assert list(wide.index) == ["b", "a", UNIFORM_LABEL] and list(wide.columns) == [8, 16]
    assert wide.loc["b", 8] == 1.5 and wide.loc["b", 16] == 3.0 and wide.loc["a", 8] == 4.0
    assert math.isnan(wide.loc["a", 16]) and list(wide.loc[UNIFORM_LABEL]) == [2.0, 2.5]
    assert list(layers.index) == [("b", 0), ("b", 1), ("a", 0), ("a", 1)] and list(layers.columns) == [8, 16]
    assert list(layers.loc[("b", 0)]) == [1.0, 3.0] and list(layers.loc[("b", 1)]) == [2.0, 3.0]
    assert layers.loc[("a", 1), 8] == 4.0 and math.isnan(layers.loc[("a", 1), 16])


def test_entropy_tables_without_uniform_entropies_or_ok_rows():
    from ctxeval.report.tables import entropy_tables

    wide, layers = entropy_tables([_entropy_row("a", 8, "d1", 4.0, [4.0, 4.0])], ["a"])
    assert list(wide.index) == ["a"] and len(layers) == 2
    wide, layers = entropy_tables([_entropy_row("a", 8, "d1", 4.0, [4.0, 4.0], status="oom")], ["a"])
    assert wide.empty and layers.empty


def _write_rulers_files(root: Path, task: str, length: int, n: int) -> None:
    path = root / str(length) / task / "validation.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(
        "".join(
            json.dumps({"index": i, "input": f"{task} {length} {i}", "outputs": ["x"], "answer_prefix": " A:"}) + "\n"
            for i in range(n)
        )
    )


def test_prepare_takes_samples_from_rulers_files_then_from_the_run_then_generates_and_keeps_a_copy(
    tmp_path, monkeypatch
):
    import ctxeval.evals.ruler.run as E
    from ctxeval.evals.ruler.tasks import RulerSample

    calls = []

    def fake_generate(task, length, num_samples, tokenizer, sources, seed, model_template):
        calls.append((task, length, num_samples, tokenizer, sources, seed, model_template))
        return [RulerSample(i, f"gen {task} {length} {i}", ["y"], length, "") for i in range(num_samples)]

    monkeypatch.setattr(E, "generate", fake_generate)
    cfg = E.RulerConfig(("vt", "cwe"), (64, 128), samples=2, seed=7, template="meta-chat")
    given = tmp_path / "ruler"
    _write_rulers_files(given, "vt", 64, 3)
    _write_rulers_files(given, "vt", 128, 1)
    _write_rulers_files(given, "cwe", 64, 2)
    with pytest.raises(CtxevalError, match="no RULER samples for cwe at length 128"):
        E.prepare(cfg, "tok", "src", tmp_path / "run1", samples_from=given)
    _write_rulers_files(given, "cwe", 128, 2)
    out = E.prepare(cfg, "tok", "src", tmp_path / "run1", samples_from=given)
    assert [s.input for s in out[("vt", 64)]] == ["vt 64 0", "vt 64 1"]  # --samples of them
    assert [s.input for s in out[("vt", 128)]] == ["vt 128 0"] and calls == []
    copy = E.read_samples(E.samples_path(tmp_path / "run1" / E.SAMPLES_DIR, "vt", 64), "vt", 64)
    assert copy == out[("vt", 64)]

    told = []
    out = E.prepare(cfg, "tok", "src", tmp_path / "run2", progress=told.append)
    assert calls == [
        ("vt", 64, 2, "tok", "src", 7, "meta-chat"),
        ("vt", 128, 2, "tok", "src", 7, "meta-chat"),
        ("cwe", 64, 2, "tok", "src", 7, "meta-chat"),
        ("cwe", 128, 2, "tok", "src", 7, "meta-chat"),
    ]
    assert told[0] == "generating 2 vt prompts at 64 tokens" and len(told) == 4
    assert out[("cwe", 128)][1].input == "gen cwe 128 1"
    written = tmp_path / "run2" / E.SAMPLES_DIR / "128" / "cwe" / "validation.jsonl"
    assert E.read_samples(written, "cwe", 128) == out[("cwe", 128)]

    calls.clear()
    again = E.prepare(cfg, "tok", "src", tmp_path / "run2", progress=told.append)  # a resume reads its own copy
    assert calls == [] and again == out and len(told) == 4


def test_write_samples_names_the_folder_or_file_it_cannot_write(tmp_path):
    from ctxeval.evals.ruler.run import write_samples
    from ctxeval.evals.ruler.tasks import RulerSample

    sample = [RulerSample(0, "a", ["b"], -1, "")]
    (tmp_path / "afile").write_text("x")
    with pytest.raises(CtxevalError, match=r"^cannot create RULER samples folder .*afile/64 \(Not a directory\)"):
        write_samples(tmp_path / "afile" / "64" / "validation.jsonl", sample)
    (tmp_path / "adir").mkdir()
    with pytest.raises(CtxevalError, match=r"^cannot write RULER samples file .*adir: it is a directory"):
        write_samples(tmp_path / "adir", sample)


def test_a_ruler_runner_measures_one_sample_per_batch_silently_by_default():
    from ctxeval.evals.common import SilentProgress
    from ctxeval.evals.ruler.run import RulerRunner
    from ctxeval.specs import expand_specs

    runner = RulerRunner(None, None, "cpu", "m")
    assert runner.batch_size == 1 and isinstance(runner.progress, SilentProgress)
    runner.predict = lambda prompts, max_new_tokens, handle, length: (["x"] * len(prompts), [5] * len(prompts))
    emitted = []
    runner.measure(expand_specs(["none"])[0], "vt", 64, _ruler_samples(2), emitted.append)
    assert [[r["sample"] for r in rows] for rows in emitted] == [[0], [1]]


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


# ---------------------------------------------------------------------------------------------------------------
# RULER's generators: refusals and cwe's word lists (the prompts themselves: tests/test_ruler.py's digests)


def test_fwe_too_short_for_four_coded_words_names_the_template_and_the_length_it_needs():
    from transformers import AutoTokenizer

    from ctxeval.evals.ruler import generate as R
    from ctxeval.util.paths import TINY_MODEL_DIR

    tok = AutoTokenizer.from_pretrained(str(TINY_MODEL_DIR))
    with pytest.raises(CtxevalError) as err:
        R.generate("fwe", 240, 1, tok, R.Sources())
    assert str(err.value) == (
        "fwe: length 240 is shorter than the task's smallest prompt (RULER's coded vocabulary of "
        "(length - 50) // 50 words needs 4, and the template alone is 158 tokens with this "
        "tokenizer); use --lengths of at least 250"
    )
    assert len(R.generate("fwe", 250, 1, tok, R.Sources())) == 1


def test_cwe_takes_words_past_wonderwords_from_the_extra_list_while_it_is_long_enough():
    from ctxeval.evals.ruler.sources import Sources, Stream
    from ctxeval.evals.ruler.tasks import TASKS
    from ctxeval.evals.ruler.words import CommonWords

    sources = Sources()
    cwe = CommonWords(TASKS["cwe"], sources, Stream(42), 4096)
    assert len(cwe._example(len(cwe.words), 1, 1, 2)[1]) == 2  # every wonderword, no extra list needed
    n = len(cwe.words) + 1
    sources.extra_words, sources.extra_words_source = [f"w{i}" for i in range(n)], "words.txt (its words)"
    text, common = cwe._example(n, 1, 1, 2)
    assert len(common) == 2 and set(common) <= set(sources.extra_words) and text.startswith("1. ")
    assert text.split()[-2] == f"{n}."  # every word of the list, numbered from 1
    sources.extra_words = sources.extra_words[:-1]
    with pytest.raises(CtxevalError) as err:
        cwe._example(n, 1, 1, 2)
    assert str(err.value) == (
        f"cwe at this length needs {n:,} distinct words, more than words.txt (its words); give "
        "a longer list with --cwe-words (RULER's english_words.json, or Debian wamerican)"
    )
    sources.extra_words = []
    with pytest.raises(CtxevalError, match=f"more than wonderwords' {len(cwe.words):,}; give a longer list"):
        cwe._example(n, 1, 1, 2)
