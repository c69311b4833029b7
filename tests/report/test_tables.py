"""store + report: rows survive torn writes, resumed failures are replaced, missing cells stay missing."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from pandas.testing import assert_frame_equal

from ctxeval.errors import CtxevalError
from ctxeval.evals.common import point_row
from ctxeval.report import tables
from ctxeval.report import tables as report
from ctxeval.report.merged import build_report
from ctxeval.runs.rows import MISSING
from ctxeval.specs import expand_specs


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
        "own: first length past it",
        "vs base: first length past it",
    ]
    assert valid.loc["pi(factor=8)", "own: first length past it"] is pd.NA  # valid to the longest: a lower bound
    assert valid.loc["yarn-tuned", "own: first length past it"] == 512
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


def test_longppl_aggregate_is_the_pooled_key_token_perplexity():
    """Two documents whose LongPPL differ (e^1 over 3 key tokens, e^3 over 1): the original aggregates
    exp((3 ln e^1 + 1 ln e^3) / 4) = e^1.5; an arithmetic mean weighted by the counts would give (3e + e^3) / 4."""
    rows = [
        {"model": "m", "label": "x", "length": 8, "doc": d, "status": "ok", "key_nll_sum": s, "key_tokens": n}
        for d, s, n in (("a", 3.0, 3), ("b", 3.0, 1), ("c", 0.0, 0))
    ]
    lp = tables.longppl_long(rows)
    assert lp.loc[0, "longppl"] == pytest.approx(math.exp(1.5)) and lp.loc[0, "key_tokens"] == 4
    assert lp.loc[0, "n_docs"] == 3 and lp.loc[0, "status"] == "ok"


def test_latest_rows_keeps_the_last_row_of_a_key_in_the_order_the_kept_rows_were_written():
    from ctxeval.report.tables import latest_rows

    rows = [
        {"label": "a", "length": 1, "v": 1},
        {"label": "b", "length": 1, "v": 2},
        {"label": "a", "length": 1, "v": 3},
        {"label": "a", "length": 2, "v": 4},
    ]
    df = latest_rows(rows, ("label", "length"))  # no status column: every row counts as measured
    assert list(zip(df["label"], df["length"], df["v"])) == [("b", 1, 2), ("a", 1, 3), ("a", 2, 4)]
    assert list(df.columns) == ["label", "length", "v"]
    assert latest_rows([], ("label",)).empty


def test_latest_rows_keys_on_every_field_given():
    from ctxeval.report.tables import latest_rows

    rows = [
        {"model": "m", "label": "a", "length": 1, "status": "ok", "v": 1},
        {"model": "n", "label": "a", "length": 1, "status": "ok", "v": 2},
        {"model": "m", "label": "a", "length": 1, "status": "oom", "v": 3},
    ]
    df = latest_rows(rows, ("model", "label", "length"))
    assert list(zip(df["model"], df["v"])) == [("m", 1), ("n", 2)]
    # a later measurement replaces an earlier one; among failures the later one is kept
    rows += [
        {"model": "m", "label": "a", "length": 1, "status": "ok", "v": 5},
        {"model": "x", "label": "a", "length": 1, "status": "oom", "v": 6},
        {"model": "x", "label": "a", "length": 1, "status": "skipped", "v": 7},
    ]
    df = latest_rows(rows, ("model", "label", "length"))
    assert list(zip(df["model"], df["v"])) == [("n", 2), ("m", 5), ("x", 7)]


def test_valid_lengths_a_ppl_exactly_at_the_tolerance_is_valid_and_the_x_columns_divide_by_the_original_length():
    import pandas as pd

    from ctxeval.report.tables import valid_lengths

    # tolerance 25% (exact in binary): own reference 8.0 at 64, so 10.0 is exactly at the limit (valid), 10.5 is
    # not; the base (`none`) is 4.0 at 64, its limit 5.0
    wide = pd.DataFrame(
        {32: [9.0, 3.0], 64: [8.0, 4.0], 128: [10.0, 5.0], 256: [10.5, 5.0], 512: [9.0, 6.0]},
        index=["pi(factor=2)", "none"],
    )
    assert 8.0 * (1 + 0.25) == 10.0 and 4.0 * (1 + 0.25) == 5.0
    valid = valid_lengths(wide, 64, 0.25).set_index("method")
    own, base = "longest within 25% of own ppl", "longest within 25% of none"
    assert list(valid["reference length"]) == [64, 64] and list(valid["ppl at reference"]) == [8.0, 4.0]
    assert valid.loc["pi(factor=2)", own] == 128 and valid.loc["pi(factor=2)", "x original"] == 2.0
    assert pd.isna(valid.loc["pi(factor=2)", base]) and pd.isna(valid.loc["pi(factor=2)", "x original (vs base)"])
    assert valid.loc["none", own] == 256 and valid.loc["none", base] == 256  # 5.0 is exactly 1.25 x 4.0
    assert valid.loc["none", "x original"] == 4.0 and valid.loc["none", "x original (vs base)"] == 4.0


def test_valid_lengths_the_reference_is_the_longest_length_up_to_the_original_else_the_shortest():
    import pandas as pd

    from ctxeval.report.tables import valid_lengths

    wide = pd.DataFrame({100: [5.0], 200: [5.2], 400: [9.0]}, index=["yarn(factor=4)"])
    # original 150: the reference is 100 (the longest <= 150), not 200
    valid = valid_lengths(wide, 150, 0.05)
    assert valid.iloc[0]["reference length"] == 100 and valid.iloc[0]["ppl at reference"] == 5.0
    assert valid.iloc[0]["longest within 5% of own ppl"] == 200
    assert valid.iloc[0]["x original"] == pytest.approx(200 / 150)
    # original 50: nothing <= 50 was measured, the shortest length is the reference
    valid = valid_lengths(wide, 50, 0.05)
    assert valid.iloc[0]["reference length"] == 100 and valid.iloc[0]["longest within 5% of own ppl"] == 200
    assert valid.iloc[0]["x original"] == 4.0
    # original exactly a measured length: that length is the reference
    assert valid_lengths(wide, 200, 0.05).iloc[0]["reference length"] == 200
    # no base row: the base column is named 'base' and empty
    assert valid.columns[5] == "longest within 5% of base" and valid.iloc[0][valid.columns[5]] is None


def test_valid_lengths_a_missing_cell_stops_the_valid_range_and_a_missing_reference_has_none():
    import pandas as pd

    from ctxeval.report.tables import valid_lengths

    nan = float("nan")
    wide = pd.DataFrame({64: [4.0, nan], 128: [nan, 4.0], 256: [4.0, 4.0]}, index=["none", "pi(factor=4)"])
    valid = valid_lengths(wide, 64, 0.10).set_index("method")
    own, base = "longest within 10% of own ppl", "longest within 10% of none"
    assert valid.loc["none", own] == 64  # the OOM at 128 stops it, though 256 is fine
    assert valid.loc["pi(factor=4)", own] is None or pd.isna(valid.loc["pi(factor=4)", own])  # no own reference
    assert pd.isna(valid.loc["pi(factor=4)", "x original"])
    assert valid.loc["pi(factor=4)", base] is None or pd.isna(valid.loc["pi(factor=4)", base])  # NaN at 64 stops it


def test_effective_length_an_accuracy_equal_to_the_threshold_passes_and_a_missing_length_stops_it():
    import pandas as pd

    from ctxeval.report.tables import effective_length

    assert effective_length(pd.Series({4: 0.8, 1: 0.9, 2: 0.8, 8: 0.79}), 0.8) == 4  # unsorted input, ties pass
    assert effective_length(pd.Series({1: 1.0, 2: float("nan"), 4: 1.0}), 0.5) == 1
    assert effective_length(pd.Series({1: 1.0, 2: None, 4: 1.0}, dtype=object), 0.5) == 1
    assert effective_length(pd.Series({1: 1.0, 2: 1.0}), 0.5) == 2 and isinstance(
        effective_length(pd.Series({1.0: 1.0}), 0.5), int
    )
    assert effective_length(pd.Series(dtype=float), 0.5) is None


def test_yarn_passkey_figures_the_longest_passing_length_and_the_mean_up_to_it():
    import pandas as pd

    from ctxeval.report.tables import yarn_passkey_figures

    acc = pd.Series({1024: 1.0, 2048: 0.5, 4096: 0.9, 8192: 0.2, 16384: float("nan")})
    assert yarn_passkey_figures(acc, 0.9) == (4096, pytest.approx((1.0 + 0.5 + 0.9) / 3))  # 0.9 >= 0.9 passes
    assert yarn_passkey_figures(acc, 0.5) == (4096, pytest.approx(0.8))
    assert yarn_passkey_figures(acc, 0.2) == (8192, pytest.approx(2.6 / 4))  # NaN is not a length evaluated
    context, mean = yarn_passkey_figures(acc, 1.01)
    assert context is None and math.isnan(mean)
    context, mean = yarn_passkey_figures(pd.Series({512.0: 1.0, 256.0: 0.0}), 1.0)
    assert context == 512 and isinstance(context, int) and mean == 0.5
    context, mean = yarn_passkey_figures(pd.Series({1: None, 2: 1.0}, dtype=object), 1.0)
    assert (context, mean) == (2, 1.0)
    # a length without an accuracy (NaN) below the context is not evaluated: the mean is over the others
    assert yarn_passkey_figures(pd.Series({1: float("nan"), 2: 0.5, 4: 1.0}), 1.0) == (4, 0.75)


def test_ruler_effective_length_a_missing_mean_stops_it():
    from ctxeval.report.tables import ruler_effective_length

    assert ruler_effective_length({4096: 90.0, 1024: 95.0, 2048: float("nan")}, 85.6) == 1024
    assert ruler_effective_length({1024: 95.0, 2048: None, 4096: 99.0}, 85.6) == 1024
    assert ruler_effective_length({1024: 85.6}, 85.6) is None and ruler_effective_length({}, 85.6) is None
    assert ruler_effective_length({1024.0: 85.7}, 85.6) == 1024 and isinstance(
        ruler_effective_length({1024.0: 85.7}, 85.6), int
    )


# Issue 27, round 2's second pass: tests for the mutants that survived in the rest of report/tables.py,
# report/runs.py, ruler_eval.py and RULER's generators (each test names the behaviour it pins down).


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
        ["none", "64", "10.00", "≥ 2k (not reached)", "≥ 32.00", "≥ 2k (not reached)", "≥ 32.00"],
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


# Issue 27: behaviours the suite let break silently, one test each (docs/testing.md, "the mutation check").
#
# 1. RULER generation under a length-dependent method keeps one RoPE, the task's length's, for the prompt and every
#    generated token (as needle does); the CLI test before this one only checked that scores lie in [0, 1].
# 2. A RULER task with a failed sample (out of memory, error) has no score: never the mean of the samples that
#    succeeded, never in the mean over tasks or the effective length.
# 3. LongPPL over documents with a failed document is missing, as ppl is: never the key tokens of the others.
# 4. A key token at position length - 1 (the last token a sequence of that length predicts) counts at that length.


def _write_run(path, record, rows):
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps(record, indent=2))
    (path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _record(task, spec, **extra):
    """A run.json as ctxeval writes it, with the fields the report reads (model m, trained length 128)."""
    return {
        "status": "success",
        "started": "2026-01-01T00:00:00+00:00",
        "finished": "2026-01-01T00:00:00+00:00",
        "spec": {"task": task, "model": "m", "dtype": "float32", **spec},
        "model": {"name": "m", "dtype": "float32", "max_position_embeddings": 128},
        "methods": {},
        "seed": 0,
        "environment": {},
        "history": [],
        "error": None,
        **extra,
    }


def _table(rep, kind):
    return next(t for t in rep.tables if t.kind == kind)


RULER_TASKS = ["niah_single_1", "vt"]


RULER_LENGTHS = (1024, 2048, 4096)


def _ruler_rows(failed_status):
    """Two tasks, three lengths, two samples, every sample scoring 1.0 except vt's sample 1 at 2k, which failed.
    The samples that succeeded would give vt 100 at 2k, the mean 100 and the effective length 4k."""
    spec = expand_specs(["none"])[0]
    rows = []
    for task in RULER_TASKS:
        for length in RULER_LENGTHS:
            for sample in (0, 1):
                if (task, length, sample) == ("vt", 2048, 1):
                    rows.append(
                        point_row(
                            "m",
                            spec,
                            "ruler",
                            ruler_task=task,
                            length=length,
                            sample=sample,
                            status=failed_status,
                            note="out of memory" if failed_status == "oom" else "RuntimeError: boom",
                        )
                    )
                else:
                    rows.append(
                        point_row(
                            "m",
                            spec,
                            "ruler",
                            value=1.0,
                            ruler_task=task,
                            length=length,
                            sample=sample,
                            score=1.0,
                            prediction="x",
                            outputs=["x"],
                            metric_fn="string_match_all",
                            prompt_tokens=length - 200,
                            seconds=0.1,
                            status="ok",
                        )
                    )
    return spec, rows


@pytest.mark.parametrize("failed_status, shown", [("oom", "OOM"), ("error", MISSING)])
def test_a_ruler_task_with_a_failed_sample_has_no_score_mean_or_effective_length(tmp_path, failed_status, shown):
    """docs/protocols.md (RULER): "a sample that could not be measured (out of memory, an error) makes its task and
    length missing". So vt at 2k is shown as the failure, the 2k mean is missing, and the effective length stops
    at 1k, in the run's own tables (report/single.py) and in `ctxeval report` (report/merged.py)."""
    from ctxeval.report.kinds.ruler import render_ruler

    spec, rows = _ruler_rows(failed_status)

    scores = tables.ruler_task_scores(rows).set_index(["ruler_task", "length"])
    assert math.isnan(scores.loc[("vt", 2048), "score"]), "vt at 2k was scored from the sample that succeeded"
    assert scores.loc[("vt", 2048), "status"] == failed_status
    assert scores.loc[("vt", 1024), "score"] == 100.0 and scores.loc[("niah_single_1", 2048), "score"] == 100.0
    means = tables.ruler_means(tables.ruler_task_scores(rows), RULER_TASKS).set_index("length")["mean"]
    assert means[1024] == 100.0 and means[4096] == 100.0 and math.isnan(means[2048])
    assert tables.ruler_effective_length(means.to_dict(), 85.6) == 1024

    # the run's own tables: table.md, ruler.csv, summary.csv
    store = SimpleNamespace(dir=tmp_path, rows=lambda: rows, record={})
    render_ruler(store, [spec], RULER_TASKS, 128, 85.6, 2, "m: RULER")
    md = (tmp_path / "table.md").read_text()
    main = next(line for line in md.splitlines() if line.startswith("| none"))
    assert [c.strip() for c in main.strip("|").split("|")] == ["none", "100.0", MISSING, "100.0", "1k"], main
    at_2k = md.split("## 2k: score by task")[1].split("##")[0]
    row = next(line for line in at_2k.splitlines() if line.startswith("| none"))
    assert [c.strip() for c in row.strip("|").split("|")] == ["none", "100.0", shown], row
    csv = {(r["ruler_task"], int(r["length"])): r for r in _csv(tmp_path / "ruler.csv")}
    assert csv[("vt", 2048)]["score"] == "" and csv[("vt", 2048)]["status"] == failed_status
    summary = _csv(tmp_path / "summary.csv")[0]
    assert summary["2048"] == "" and summary["1024"] == "100.0" and summary["effective length"] == "1024"

    # `ctxeval report`
    run = _write_run(
        tmp_path / "run",
        _record(
            "ruler",
            {
                "tasks": RULER_TASKS,
                "lengths": list(RULER_LENGTHS),
                "samples": 2,
                "seed": 42,
                "template": "base",
                "methods": ["none"],
            },
            protocol={"threshold": 85.6},
        ),
        rows,
    )
    table = _table(build_report([run]), "ruler")
    record = table.records()[0]
    assert record["1024"] == 100.0 and record["4096"] == 100.0
    assert record["2048"] is None and record["effective length"] == 1024
    assert dict(zip(table.columns, table.cells[0]))["2048"] == MISSING


def _csv(path):
    import csv

    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _ppl_rows(failed_status):
    """Documents d1, d2 at 256 and 512 tokens with key tokens; d2 failed at 512. d1 alone would give a LongPPL."""
    spec = expand_specs(["none"])[0]
    rows = []
    for doc, nll, key_nll, keys in (("d1", 2.0, 1.0, 4), ("d2", 3.0, 2.5, 2)):
        for length in (256, 512):
            if (doc, length) == ("d2", 512):
                rows.append(
                    point_row(
                        "m",
                        spec,
                        "ppl",
                        protocol="truncate",
                        length=length,
                        doc=doc,
                        status=failed_status,
                        note="out of memory",
                    )
                )
                continue
            n = length
            rows.append(
                point_row(
                    "m",
                    spec,
                    "ppl",
                    protocol="truncate",
                    length=length,
                    doc=doc,
                    status="ok",
                    value=nll,
                    ppl=math.exp(nll),
                    nll_sum=nll * (n - 1),
                    n_tokens=n - 1,
                    window_nll_sum=nll,
                    n_windows=1,
                    key_nll_sum=key_nll * keys,
                    key_tokens=keys,
                    seconds=0.1,
                )
            )
    return spec, rows


@pytest.mark.parametrize("failed_status, shown", [("oom", "OOM"), ("error", MISSING)])
def test_longppl_with_a_failed_document_is_missing_as_ppl_is(tmp_path, failed_status, shown):
    """ppl over documents is missing at a length where a document failed (tables.ppl_long: never the aggregate of
    the others); LongPPL follows the same rule (tables.longppl_long). At 256 both documents count: exp((4 x 1.0 +
    2 x 2.5) / 6); at 512 d1 alone would give e^1.0, which must not be shown."""
    from ctxeval.report.kinds.ppl_run import render_longppl

    spec, rows = _ppl_rows(failed_status)
    ppl = tables.ppl_long(rows).set_index("length")
    assert math.isnan(ppl.loc[512, "ppl"]) and ppl.loc[512, "status"] == failed_status  # the rule LongPPL mirrors
    lp = tables.longppl_long(rows).set_index("length")
    assert lp.loc[256, "longppl"] == pytest.approx(math.exp((4 * 1.0 + 2 * 2.5) / 6)) and lp.loc[256, "status"] == "ok"
    assert math.isnan(lp.loc[512, "longppl"]), f"LongPPL at 512 = {lp.loc[512, 'longppl']} from d1 alone"
    assert lp.loc[512, "status"] == failed_status

    # the run's own table (longppl.csv and the LongPPL section of table.md)
    store = SimpleNamespace(dir=tmp_path, rows=lambda: rows, record={"key_tokens": {"evaluator": "m"}})
    _, section = render_longppl(store, [spec])
    row = next(line for line in section.splitlines() if line.startswith("| none"))
    assert [c.strip() for c in row.strip("|").split("|")] == ["none", f"{math.exp(9 / 6):.2f}", shown], row
    counts = next(line for line in section.splitlines() if line.startswith("| key tokens"))
    assert [c.strip() for c in counts.strip("|").split("|")] == ["key tokens (count)", "6", "—"]  # not counted, not 0
    csv = {int(r["length"]): r for r in _csv(tmp_path / "longppl.csv")}
    assert csv[512]["longppl"] == "" and csv[512]["key_tokens"] == "" and csv[512]["status"] == failed_status

    # `ctxeval report`
    run = _write_run(
        tmp_path / "run",
        _record(
            "ppl",
            {
                "data": "pydoc",
                "text_field": "text",
                "protocol": "truncate",
                "stride": None,
                "bos": False,
                "docs": 2,
                "lengths": [256, 512],
                "methods": ["none"],
            },
            data={"spec": "pydoc", "documents": [{"doc": "d1", "tokens": 1000}, {"doc": "d2", "tokens": 1000}]},
            protocol={"name": "truncate", "stride": None, "bos": False, "aggregate": "token"},
            key_tokens={"evaluator": "m", "method": "none", "context": 64, "window": 16},
        ),
        rows,
    )
    rep = build_report([run])
    main = _table(rep, "ppl").records()[0]
    assert main["512"] is None
    longppl = _table(rep, "longppl")
    record = next(r for r in longppl.records() if r["method"] == "none")
    assert record["256"] == pytest.approx(math.exp(9 / 6)) and record["512"] is None
    count = next(r for r in longppl.records() if r["method"] == "key tokens (count)")
    assert count["256"] == 6 and count["512"] is None


def test_valid_cells_mark_a_valid_length_at_the_longest_evaluated_as_not_reached():
    """Issue 39: in a run's table.md, a method valid at every length asked read as if it broke at the longest."""
    import pandas as pd

    from ctxeval.report.tables import valid_cells, valid_lengths

    wide = pd.DataFrame(
        [[10.0, 10.5, 40.0], [10.2, 10.4, 10.9]], index=["none", "yarn(factor=2)"], columns=[64, 128, 256]
    )
    valid = valid_lengths(wide, 128, 0.10)
    _, rows = valid_cells(valid)
    by = {row[0]: row for row in rows}
    assert by["yarn(factor=2)"][3:5] == ["≥ 256 (not reached)", "≥ 2.00"]
    assert by["none"][3:5] == ["128", "1.00"]


def test_a_valid_range_that_stops_at_a_point_never_measured_is_a_lower_bound_and_one_that_failed_is_not():
    """Issue 53: merged runs of one model on different length grids leave a method's cells empty past its own
    longest length; that is where its measurement ends, not where it fails (its own run says `≥ 1k`)."""
    from ctxeval.report.tables import valid_cells, valid_lengths

    nan = float("nan")
    wide = pd.DataFrame(
        [[10.0, 10.4, nan], [10.0, 10.4, nan], [10.0, 10.4, nan]], index=["none", "pi", "dca"], columns=[64, 128, 256]
    )
    status = pd.DataFrame(
        [["ok", "ok", "missing"], ["ok", "ok", "oom"], ["ok", "ok", "beyond positions"]],
        index=wide.index,
        columns=wide.columns,
    )
    _, rows = valid_cells(valid_lengths(wide, 64, 0.10, status))
    by = {row[0]: row[3] for row in rows}
    assert by == {"none": "≥ 128 (not reached)", "pi": "128", "dca": "128"}
    _, unknown = valid_cells(valid_lengths(wide, 64, 0.10))  # without statuses a NaN is a failure, as an OOM
    assert [row[3] for row in unknown] == ["128", "128", "128"]
