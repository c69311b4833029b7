"""store + report: rows survive torn writes, resumed failures are replaced, missing cells stay missing."""

import json
import math

import pandas as pd
import pytest

from ctxeval.errors import CtxevalError
from ctxeval.report import tables as report
from ctxeval.runs.store import RunStore, read_rows, run_status


def row(label, length, doc, nll_sum=None, n=10, status="ok"):
    r = {"model": "m", "label": label, "length": length, "doc": doc, "status": status}
    if status == "ok":
        r.update(nll_sum=nll_sum, n_tokens=n, window_nll_sum=nll_sum / n, n_windows=1)
    return r


def test_token_and_window_aggregation():
    rows = [row("a", 64, "d1", 10.0, 10), row("a", 64, "d2", 60.0, 30)]
    long = report.ppl_long(rows, "token")
    assert long.loc[0, "ppl"] == pytest.approx(math.exp(70 / 40))
    assert report.ppl_long(rows, "window").loc[0, "ppl"] == pytest.approx(math.exp((1.0 + 2.0) / 2))
    with pytest.raises(CtxevalError):
        report.ppl_long(rows, "median")


def test_missing_and_failed_cells_are_not_zero():
    rows = [
        row("a", 64, "d1", 10.0),
        row("a", 128, "d1", 12.0),
        row("b", 64, "d1", 9.0),
        row("b", 128, "d1", status="oom"),
    ]
    long = report.ppl_long(rows)
    wide = report.ppl_wide(long, ["a", "b", "c"])
    status = report.status_wide(long, wide)
    headers, cells = report.ppl_cells(wide, status)
    assert cells[1][2] == "OOM" and list(wide.index) == ["a", "b"]
    rows.append(row("c", 64, "d1", 8.0))
    wide = report.ppl_wide(report.ppl_long(rows))
    assert math.isnan(wide.loc["c", 128])
    assert report.ppl_cells(wide)[1][2][2] == report.MISSING


def test_resumed_point_replaces_its_failure():
    rows = [row("a", 64, "d1", status="oom"), row("a", 64, "d1", 10.0)]
    assert report.ppl_long(rows).loc[0, "status"] == "ok"


def test_valid_lengths():
    wide = pd.DataFrame({32: [5.0, 5.0], 64: [4.0, 4.0], 128: [4.3, 9.0], 256: [4.5, 4.1]}, index=["good", "bad"])
    valid = report.valid_lengths(wide, 64, 0.10)
    assert list(valid.iloc[:, 3]) == [128, 64]  # 'good' stops at 256 (4.5 > 4.4); 'bad' fails at 128


def test_valid_length_against_the_base_model_and_against_itself():
    # the tiny model's case: PI at factor 8 is flat (its own ppl at 128 is 152, so it is 'valid to 8x'), yet twice
    # plain RoPE's 74.9 at 128 everywhere; the tuned method stays within 10% of plain RoPE up to 256
    wide = pd.DataFrame(
        {
            64: [71.8, 143.8, 79.7],
            128: [74.9, 152.2, 81.4],
            256: [84.5, 146.2, 79.9],
            512: [114.9, 152.6, 95.4],
            1024: [130.7, 127.7, 94.1],
        },
        index=["none", "pi(factor=8)", "yarn-tuned"],
    )
    valid = report.valid_lengths(wide, 128, 0.10).set_index("method")
    own, base = "longest within 10% of own ppl", "longest within 10% of none"
    assert list(valid.columns) == [
        "reference length",
        "ppl at reference",
        own,
        "x original",
        base,
        "x original (vs base)",
    ]
    assert valid.loc["pi(factor=8)", own] == 1024 and valid.loc["pi(factor=8)", "x original"] == 8
    assert pd.isna(valid.loc["pi(factor=8)", base])  # 152 > 1.1 x 74.9 already at the reference
    assert valid.loc["yarn-tuned", base] == 256  # 79.9 <= 82.4, then 95.4 > 82.4 stops it
    assert valid.loc["yarn-tuned", own] == 256  # 95.4 > 1.1 x 81.4
    assert valid.loc["none", base] == valid.loc["none", own] == 128  # 84.5 > 82.4
    # `native` (the checkpoint's own RoPE) is the base when it was measured, whatever the order
    wide.loc["native"] = [70.0, 150.0, 160.0, 170.0, 180.0]
    again = report.valid_lengths(wide, 128, 0.10).set_index("method")
    assert "longest within 10% of native" in again.columns
    assert again.loc["pi(factor=8)", "longest within 10% of native"] == 1024  # all <= 1.1 x 150


def test_effective_length_is_contiguous():
    assert report.effective_length(pd.Series({1: 1.0, 2: 0.9, 4: 0.5, 8: 1.0}), 0.8) == 2
    assert report.effective_length(pd.Series({1: 0.2, 2: 1.0}), 0.8) is None


def test_torn_last_line_is_ignored(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"a": 1}) + "\n" + '{"a": 2, "b"')
    assert read_rows(path) == [{"a": 1}]


def test_run_status_records_errors_and_interrupts(tmp_path):
    store = RunStore(tmp_path / "r", {"x": 1})
    store.start({})
    with pytest.raises(ValueError):
        with run_status(store):
            raise ValueError("boom")
    first = json.loads((tmp_path / "r" / "run.json").read_text())
    assert first["status"] == "error"
    store.close()  # releases the directory's lock
    store = RunStore(tmp_path / "r", {"x": 1})  # same spec: resume
    store.start({})
    with pytest.raises(KeyboardInterrupt):
        with run_status(store):
            raise KeyboardInterrupt
    record = json.loads((tmp_path / "r" / "run.json").read_text())
    assert record["status"] == "interrupted" and record["history"][0]["status"] == "error"
    assert record["history"][0]["environment"] == first["environment"]  # how the earlier rows were made stays recorded
    store.close()
    with pytest.raises(CtxevalError, match="different spec"):
        RunStore(tmp_path / "r", {"x": 2})


def test_append_after_a_torn_line_keeps_the_new_row(tmp_path):
    store = RunStore(tmp_path / "r", {"x": 1})
    store.append([{"a": 1}])
    with open(store.rows_path, "a") as fh:
        fh.write('{"a": 2, "b"')  # killed mid-write
    store.append([{"a": 3}])
    assert read_rows(store.rows_path) == [{"a": 1}, {"a": 3}]


def test_latest_rows_prefers_a_measurement_over_a_later_failure():
    from ctxeval.report.tables import latest_rows

    rows = [
        {"label": "a", "length": 1, "status": "ok", "v": 1.0},
        {"label": "a", "length": 1, "status": "oom", "v": None},  # stale failure merged after the measurement
        {"label": "b", "length": 1, "status": "oom", "v": None},
        {"label": "b", "length": 1, "status": "ok", "v": 2.0},
        {"label": "c", "length": 1, "status": "oom", "v": None},
    ]
    df = latest_rows(rows, ("label", "length"))
    assert dict(zip(df["label"], df["v"].fillna(-1))) == {"a": 1.0, "b": 2.0, "c": -1}
    assert list(df["label"]) == ["a", "b", "c"]
